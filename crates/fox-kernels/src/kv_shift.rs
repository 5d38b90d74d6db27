//! KV-shift (FoX Pro): k_t = α_t · k̃_{t−1} + (1 − α_t) · k̃_t per head, α_t = sigmoid(shift_proj(x_t)).
//!
//! `prev` gives k̃ before the first position of each row (zeros for a fresh sequence, the cached
//! last k̃ when decoding). Positions before `start[b]` (left padding) count as k̃ = 0 for the first
//! real token.

use rayon::prelude::*;

/// Positions per parallel task (of all rows' positions): a batch of one sequence still splits
/// over the threads.
const ROWS_PER_TASK: usize = 16;

/// One KV-shift problem: the inputs both passes read.
#[derive(Clone, Copy, Debug)]
pub struct KvShift<'a> {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    /// [B, T, H·D], the unmixed k̃ (or ṽ).
    pub x: &'a [f32],
    /// [B, T, H]
    pub alpha: &'a [f32],
    /// Per batch row, the first real position (left padding); none: every position is real.
    pub start: Option<&'a [usize]>,
}

/// out: [B, T, H·D]; `prev` [B, H·D] the k̃ before each row's first position.
pub fn kv_shift_fwd(p: &KvShift, prev: Option<&[f32]>, out: &mut [f32]) {
    let KvShift { batch: b, seq: t, heads: h, head_dim: d, x, alpha, start } = *p;
    let hd = h * d;
    out[..b * t * hd].par_chunks_mut(ROWS_PER_TASK * hd).enumerate().for_each(|(task, ob)| {
        for (j, orow) in ob.chunks_mut(hd).enumerate() {
            let (bi, ti) = ((task * ROWS_PER_TASK + j) / t, (task * ROWS_PER_TASK + j) % t);
            let s = start.map_or(0, |s| s[bi]);
            for hi in 0..h {
                let a = alpha[(bi * t + ti) * h + hi];
                let cur = &x[(bi * t + ti) * hd + hi * d..][..d];
                let o = &mut orow[hi * d..][..d];
                if ti < s {
                    o.copy_from_slice(cur);
                    continue;
                }
                let p: Option<&[f32]> = if ti > s {
                    Some(&x[(bi * t + ti - 1) * hd + hi * d..][..d])
                } else if s == 0 {
                    prev.map(|p| &p[bi * hd + hi * d..][..d])
                } else {
                    None
                };
                match p {
                    Some(p) => {
                        for c in 0..d {
                            o[c] = a * p[c] + (1.0 - a) * cur[c];
                        }
                    }
                    None => {
                        for c in 0..d {
                            o[c] = (1.0 - a) * cur[c];
                        }
                    }
                }
            }
        }
    });
}

/// Backward (no `prev`: training runs whole sequences) from dout [B, T, H·D]: dx [B, T, H·D],
/// dalpha [B, T, H].
pub fn kv_shift_bwd(p: &KvShift, dout: &[f32], dx: &mut [f32], dalpha: &mut [f32]) {
    let KvShift { seq: t, heads: h, head_dim: d, x, alpha, start, .. } = *p;
    let hd = h * d;
    let tasks = dx.par_chunks_mut(ROWS_PER_TASK * hd).zip(dalpha.par_chunks_mut(ROWS_PER_TASK * h));
    tasks.enumerate().for_each(|(task, (dxs, das))| {
        for (j, (dxr, dar)) in dxs.chunks_mut(hd).zip(das.chunks_mut(h)).enumerate() {
            let (bi, ti) = ((task * ROWS_PER_TASK + j) / t, (task * ROWS_PER_TASK + j) % t);
            let s = start.map_or(0, |s| s[bi]);
            for hi in 0..h {
                let base = (bi * t + ti) * hd + hi * d;
                let dcur = &mut dxr[hi * d..][..d];
                let go = &dout[base..base + d];
                if ti < s {
                    dcur.copy_from_slice(go);
                    dar[hi] = 0.0;
                    continue;
                }
                let a = alpha[(bi * t + ti) * h + hi];
                let cur = &x[base..base + d];
                let mut da = 0.0f32;
                // d/dα [α p + (1−α) c] = p − c
                if ti > s {
                    let p = &x[base - hd..base - hd + d];
                    for c in 0..d {
                        da += go[c] * (p[c] - cur[c]);
                    }
                } else {
                    for c in 0..d {
                        da -= go[c] * cur[c];
                    }
                }
                dar[hi] = da;
                // k̃_t feeds k_t with (1−α_t) and k_{t+1} with α_{t+1}.
                let next_a = if ti + 1 < t { alpha[(bi * t + ti + 1) * h + hi] } else { 0.0 };
                for c in 0..d {
                    let mut g = go[c] * (1.0 - a);
                    if ti + 1 < t {
                        g += dout[base + hd + c] * next_a;
                    }
                    dcur[c] = g;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_gradient, randn};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn loss(p: &KvShift, w: &[f32]) -> f64 {
        let mut out = vec![0.0; p.x.len()];
        kv_shift_fwd(p, None, &mut out);
        out.iter().zip(w).map(|(a, b)| *a as f64 * *b as f64).sum()
    }

    /// dx and dalpha by central differences, with and without left padding (row 1 starts at 3);
    /// 21 positions a row, so tasks of 16 positions end inside both rows. The forward against
    /// its formula, bit for bit.
    #[test]
    fn backward_matches_finite_differences() {
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        let (b, t, h, d) = (2, 21, 2, 3);
        let x = randn(&mut rng, b * t * h * d);
        let alpha: Vec<f32> = (0..b * t * h).map(|_| rng.gen_range(0.05..0.95)).collect();
        let w = randn(&mut rng, x.len());
        let start = [0usize, 3];
        for st in [None, Some(&start[..])] {
            let prob = KvShift { batch: b, seq: t, heads: h, head_dim: d, x: &x, alpha: &alpha, start: st };
            let mut out = vec![f32::NAN; x.len()];
            kv_shift_fwd(&prob, None, &mut out);
            for (i, &o) in out.iter().enumerate() {
                let (bi, ti, hi) = (i / (t * h * d), i / (h * d) % t, i / d % h);
                let s = st.map_or(0, |s| s[bi]);
                let a = alpha[(bi * t + ti) * h + hi];
                let want = match ti {
                    _ if ti < s => x[i],
                    _ if ti == s => (1.0 - a) * x[i],
                    _ => a * x[i - h * d] + (1.0 - a) * x[i],
                };
                assert_eq!(o.to_bits(), want.to_bits(), "{st:?}: out[{i}]");
            }
            let mut dx = vec![f32::NAN; x.len()];
            let mut dalpha = vec![f32::NAN; alpha.len()];
            kv_shift_bwd(&prob, &w, &mut dx, &mut dalpha);
            // The output is bilinear in (x, α): central differences are exact up to f32 round-off.
            let step_tol = (1e-2, 1e-4);
            let x_loss = |p: &[f32]| loss(&KvShift { x: p, ..prob }, &w);
            assert_gradient(&format!("{st:?}: dx"), &dx, &x, 0..x.len(), step_tol, x_loss);
            let alpha_loss = |p: &[f32]| loss(&KvShift { alpha: p, ..prob }, &w);
            assert_gradient(&format!("{st:?}: dalpha"), &dalpha, &alpha, 0..alpha.len(), step_tol, alpha_loss);
        }
        // Padding: the first real token of row 1 mixes with k̃ = 0, so padded k̃ get no gradient
        // from real positions (only their own pass-through).
        let mut dx = vec![0.0; x.len()];
        let mut dalpha = vec![0.0; alpha.len()];
        let mut w0 = w.clone();
        w0[t * h * d..(t + 3) * h * d].fill(0.0);
        let prob = KvShift { batch: b, seq: t, heads: h, head_dim: d, x: &x, alpha: &alpha, start: Some(&start) };
        kv_shift_bwd(&prob, &w0, &mut dx, &mut dalpha);
        assert!(dx[t * h * d..(t + 3) * h * d].iter().all(|&v| v == 0.0));
        assert!(dalpha[t * h..(t + 3) * h].iter().all(|&v| v == 0.0));
    }
}
