//! Numerically stable scalar functions shared by several operations.

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// log(sigmoid(x)) without overflow for large |x|.
#[inline]
pub fn log_sigmoid(x: f32) -> f32 {
    x.min(0.0) - (-x.abs()).exp().ln_1p()
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}
