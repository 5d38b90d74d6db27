//! The forget gate: a_t = log f_t = logsigmoid(logit_t) and its inclusive prefix sum c_t, in f32.

use crate::scalar::{log_sigmoid, sigmoid};
use rayon::prelude::*;

/// c: [B, H, T] = cumsum over t of a: [B, T, H]; positions before `start[b]` (left padding)
/// count as a = 0, so c stays 0 there.
pub fn prefix_sum_fwd(c: &mut [f32], a: &[f32], start: Option<&[usize]>, t: usize, h: usize) {
    c.par_chunks_mut(t).enumerate().for_each(|(bh, cr)| {
        let (bi, hi) = (bh / h, bh % h);
        let s = start.map_or(0, |s| s[bi]);
        let mut acc = 0.0f32;
        for ti in 0..t {
            if ti >= s {
                acc += a[(bi * t + ti) * h + hi];
            }
            cr[ti] = acc;
        }
    });
}

/// da: [B, T, H] = reverse cumsum of dc: [B, H, T] (d a_t = Σ_{i ≥ t} dc_i).
pub fn prefix_sum_bwd(da: &mut [f32], dc: &[f32], start: Option<&[usize]>, t: usize, h: usize) {
    da.par_chunks_mut(t * h).enumerate().for_each(|(bi, dab)| {
        let s = start.map_or(0, |s| s[bi]);
        for hi in 0..h {
            let dcr = &dc[(bi * h + hi) * t..][..t];
            let mut acc = 0.0f32;
            for ti in (0..t).rev() {
                acc += dcr[ti];
                dab[ti * h + hi] = if ti >= s { acc } else { 0.0 };
            }
        }
    });
}

/// a = logsigmoid(logit), elementwise.
pub fn log_fgate_fwd(a: &mut [f32], logit: &[f32]) {
    a.par_iter_mut().zip(logit.par_iter()).for_each(|(a, &x)| *a = log_sigmoid(x));
}

/// dlogit = da · sigmoid(−logit).
pub fn log_fgate_bwd(dlogit: &mut [f32], da: &[f32], logit: &[f32]) {
    dlogit.par_iter_mut().zip(da.par_iter().zip(logit.par_iter())).for_each(|(g, (&d, &x))| *g = d * sigmoid(-x));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_gradient, randn};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// L = Σ w ⊙ prefix_sum(logsigmoid(logit)), through both ops' backward, with and without left
    /// padding; logits span both saturated regions of logsigmoid.
    #[test]
    fn backward_matches_finite_differences() {
        let mut rng = ChaCha8Rng::seed_from_u64(15);
        let (b, t, h) = (2, 9, 3);
        let logit: Vec<f32> = randn(&mut rng, b * t * h).iter().map(|v| 4.0 * v).collect();
        let w = randn(&mut rng, b * h * t);
        let start = [0usize, 4];
        for st in [None, Some(&start[..])] {
            let loss = |logit: &[f32]| -> f64 {
                let mut a = vec![0.0; logit.len()];
                log_fgate_fwd(&mut a, logit);
                let mut c = vec![0.0; w.len()];
                prefix_sum_fwd(&mut c, &a, st, t, h);
                c.iter().zip(&w).map(|(a, b)| *a as f64 * *b as f64).sum()
            };
            let mut da = vec![f32::NAN; logit.len()];
            prefix_sum_bwd(&mut da, &w, st, t, h);
            let mut dlogit = vec![f32::NAN; logit.len()];
            log_fgate_bwd(&mut dlogit, &da, &logit);
            // logsigmoid'' ≤ 1/4: O(h²) truncation ~1e-5 per use, summed over ≤ 9 uses.
            assert_gradient(&format!("{st:?}: dlogit"), &dlogit, &logit, 0..logit.len(), (1e-2, 1e-3), loss);
            if st.is_some() {
                // Padded positions count as a = 0: no gradient.
                assert!(dlogit[t * h..(t + 4) * h].iter().all(|&v| v == 0.0));
            }
        }
    }
}
