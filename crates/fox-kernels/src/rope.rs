//! Rotary position embedding, rotate-half convention (the Transformer baselines only; FoX has none).
//!
//! For channel pairs (c, c + D/2) at position p: angle = p · base^(−2c/D);
//! (x₁, x₂) → (x₁ cos − x₂ sin, x₂ cos + x₁ sin). The backward is the rotation by −angle.

use rayon::prelude::*;

/// Rotates x: [rows, H, D] in place; `positions[row]` is each row's position.
pub fn rope_apply(x: &mut [f32], positions: &[i64], h: usize, d: usize, base: f64, inverse: bool) {
    let half = d / 2;
    let inv_freq: Vec<f64> = (0..half)
        .map(|c| 1.0 / base.powf(2.0 * c as f64 / d as f64))
        .collect();
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
