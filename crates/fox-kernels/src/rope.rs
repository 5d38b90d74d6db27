//! Rotary position embedding, rotate-half convention (the Transformer baselines only; FoX has none).
//!
//! For channel pairs (c, c + D/2) at position p: angle = p · base^(−2c/D);
//! (x₁, x₂) → (x₁ cos − x₂ sin, x₂ cos + x₁ sin). The backward is the rotation by −angle.

use rayon::prelude::*;

/// Rotates x: [rows, H, D] in place; `positions[row]` is each row's position.
pub fn rope_apply(x: &mut [f32], positions: &[i64], h: usize, d: usize, base: f64, inverse: bool) {
    let half = d / 2;
    let inv_freq: Vec<f64> = (0..half).map(|c| 1.0 / base.powf(2.0 * c as f64 / d as f64)).collect();
    x.par_chunks_mut(h * d).enumerate().for_each(|(row, xr)| {
        let p = positions[row] as f64;
        for c in 0..half {
            // The reference computes the angle in f32: round the same way.
            let ang = (p as f32 * inv_freq[c] as f32) as f64;
            let (s, co) = ang.sin_cos();
            let (s, co) = (if inverse { -s } else { s } as f32, co as f32);
            for hi in 0..h {
                let v = &mut xr[hi * d..(hi + 1) * d];
                let (a, b) = (v[c], v[c + half]);
                v[c] = a * co - b * s;
                v[c + half] = b * co + a * s;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_gradient, randn};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// The backward of y = R x is Rᵀ dy = rope_apply(dy, inverse = true): checked by central
    /// differences of L = Σ w ⊙ R x, and the inverse undoes the forward. Negative positions occur
    /// in left-padded rows (positions count from each row's first real token).
    #[test]
    fn inverse_rotation_is_the_backward() {
        let mut rng = ChaCha8Rng::seed_from_u64(14);
        let (rows, h, d) = (6, 2, 8);
        let positions: Vec<i64> = vec![-3, 0, 1, 7, 1000, 65_000];
        let x = randn(&mut rng, rows * h * d);
        let w = randn(&mut rng, x.len());
        let loss = |x: &[f32]| -> f64 {
            let mut y = x.to_vec();
            rope_apply(&mut y, &positions, h, d, 500000.0, false);
            y.iter().zip(&w).map(|(a, b)| *a as f64 * *b as f64).sum()
        };
        let mut dx = w.clone();
        rope_apply(&mut dx, &positions, h, d, 500000.0, true);
        // Linear in x: exact up to f32 round-off.
        assert_gradient("dx", &dx, &x, 0..x.len(), (1e-2, 1e-4), loss);
        let mut y = x.clone();
        rope_apply(&mut y, &positions, h, d, 500000.0, false);
        rope_apply(&mut y, &positions, h, d, 500000.0, true);
        assert!(y.iter().zip(&x).all(|(a, b)| (a - b).abs() < 1e-5));
    }
}
