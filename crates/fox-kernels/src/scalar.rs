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

/// sigmoid through [`fast_exp`], in a form the compiler vectorises: 1 / (1 + e^−x), where the
/// clamped exp keeps both tails finite (relative error ~2e-7, as `fast_exp`).
#[inline(always)]
pub fn fast_sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + fast_exp(-x))
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

/// exp(x) for f32 in a form the compiler vectorises: x = n·ln2 + r, |r| <= ln2/2, a degree-6
/// polynomial for e^r (relative error ~2e-7, like libm's expf to within a few ulp), 2^n from the
/// exponent bits. Inputs above 88 are clamped to 88; below -87.3 (where exp is below f32's
/// smallest normal number, 1.18e-38) the result is 0, as denormals are flushed: a softmax's far
/// keys then weigh exactly 0, where a tiny normal weight made every product with them a denormal,
/// which Intel cores compute in microcode (the CPU attention ran 20× slower on a Xeon than on a
/// Zen 4). NaN stays NaN. `simd` has the same arithmetic 8 and 16 lanes wide.
#[inline(always)]
pub fn fast_exp(x: f32) -> f32 {
    // A select at the end rather than an early return, so that loops over it still vectorise.
    let under = x < -87.3;
    let x = x.clamp(-87.3, 88.0);
    // Round to nearest with the 1.5·2^23 trick: plain adds, and n as an integer is in t's low
    // mantissa bits, so no float-to-int conversion (which does not vectorise) is needed.
    const MAGIC: f32 = 12_582_912.0;
    let t = x * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0 + r * (0.5 + r * (0.166_666_67 + r * (0.041_666_668 + r * (0.008_333_334 + r * 0.001_388_888_9)))));
    let e = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32).wrapping_add(127);
    if under {
        0.0
    } else {
        p * f32::from_bits((e << 23) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_accurate() {
        for i in -8700..=8800 {
            let x = i as f32 / 100.0;
            let (a, b) = (fast_exp(x), x.exp());
            assert!((a - b).abs() <= 1e-6 * b + 1e-37, "exp({x}): {a} vs {b}");
        }
        // Below the smallest normal number: 0, never a denormal.
        assert!(fast_exp(-87.3) > f32::MIN_POSITIVE && fast_exp(-87.3) < 1e-37);
        for x in [-87.31f32, -90.0, -103.9, -1000.0, f32::NEG_INFINITY] {
            assert_eq!(fast_exp(x).to_bits(), 0, "exp({x})");
        }
        assert_eq!(fast_exp(1000.0), fast_exp(88.0));
        assert!(fast_exp(f32::NAN).is_nan());
    }
}
