//! RMSNorm: y = x · rsqrt(mean(x²) + eps) · w, in f32.
//!
//! One routine covers the three uses in FoX: the block norms (weight of size `dim`), the per-head
//! QK-norm and output norm (x viewed as [rows·H, head_dim], weight [H·head_dim]: one gamma per head
//! and channel), and the shared QK-norm (weight [head_dim] for every head). The weight row used by
//! row r is `r % (w.len() / dim)`.

use crate::simd::multiversion;
use rayon::prelude::*;

const ROWS_PER_TASK: usize = 64;

fn weight_row(w: &[f32], dim: usize, r: usize) -> &[f32] {
    let groups = w.len() / dim;
    let g = r % groups;
    &w[g * dim..(g + 1) * dim]
}

/// Forward. `rstd[r]` (1 / rms of row r) is kept for the backward.
pub fn rms_norm_fwd(y: &mut [f32], rstd: &mut [f32], x: &[f32], w: &[f32], dim: usize, eps: f32) {
    let rows = x.len() / dim;
    assert_eq!(x.len(), rows * dim);
    assert_eq!(y.len(), x.len());
    assert_eq!(rstd.len(), rows);
    assert!(w.len().is_multiple_of(dim) && !w.is_empty(), "rms_norm: weight length {} vs dim {dim}", w.len());
    y.par_chunks_mut(dim * ROWS_PER_TASK)
        .zip(rstd.par_chunks_mut(ROWS_PER_TASK))
        .enumerate()
        .for_each(|(chunk, (ys, rs))| fwd_rows(ys, rs, x, w, dim, eps, chunk * ROWS_PER_TASK));
}

multiversion! {
    /// Rows row0.. of the forward.
    fn fwd_rows(ys: &mut [f32], rs: &mut [f32], x: &[f32], w: &[f32], dim: usize, eps: f32, row0: usize) {
        for (i, (yr, r)) in ys.chunks_mut(dim).zip(rs.iter_mut()).enumerate() {
            let row = row0 + i;
            let xr = &x[row * dim..(row + 1) * dim];
            let ms = sum8(xr, xr, xr, |a, _, _| a * a) / dim as f32;
            let s = 1.0 / (ms + eps).sqrt();
            *r = s;
            let wr = weight_row(w, dim, row);
            for ((y, &xv), &wv) in yr.iter_mut().zip(xr).zip(wr) {
                *y = xv * s * wv;
            }
        }
    }
}

/// Σ f(a_i, b_i, c_i) over three slices of one length, in eight interleaved partial sums added
/// in a fixed order: the loop vectorises, and the result does not depend on the CPU.
#[inline(always)]
fn sum8(a: &[f32], b: &[f32], c: &[f32], f: impl Fn(f32, f32, f32) -> f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ac, bc, cc) = (a.chunks_exact(8), b.chunks_exact(8), c.chunks_exact(8));
    let (ar, br, cr) = (ac.remainder(), bc.remainder(), cc.remainder());
    for ((x, y), z) in ac.zip(bc).zip(cc) {
        for l in 0..8 {
            acc[l] += f(x[l], y[l], z[l]);
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for ((&x, &y), &z) in ar.iter().zip(br).zip(cr) {
        s += f(x, y, z);
    }
    s
}

/// Backward: dx = rstd · (w·dy − x̂ · mean(w·dy·x̂)), dw += Σ dy·x̂ (x̂ = x·rstd).
/// `dx` is overwritten, or added to when `accumulate` (for residual streams).
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_bwd(
    dx: &mut [f32],
    accumulate: bool,
    dw: &mut [f32],
    dy: &[f32],
    x: &[f32],
    rstd: &[f32],
    w: &[f32],
    dim: usize,
) {
    assert!(x.len().is_multiple_of(dim));
    assert_eq!(dy.len(), x.len());
    assert_eq!(dx.len(), x.len());
    assert_eq!(dw.len(), w.len());
    let inputs = BwdInputs { accumulate, dy, x, rstd, w, dim };
    // dw needs a reduction over rows: per task partial sums, then a fixed-order sum (deterministic).
    let partial: Vec<Vec<f32>> = dx
        .par_chunks_mut(dim * ROWS_PER_TASK)
        .enumerate()
        .map(|(t, dxs)| {
            let mut dwp = vec![0.0f32; w.len()];
            bwd_rows(dxs, &mut dwp, &inputs, t * ROWS_PER_TASK);
            dwp
        })
        .collect();
    for p in partial {
        for (a, b) in dw.iter_mut().zip(p) {
            *a += b;
        }
    }
}

/// What every task of the backward reads: [`rms_norm_bwd`]'s arguments but its outputs.
#[derive(Clone, Copy)]
struct BwdInputs<'a> {
    accumulate: bool,
    dy: &'a [f32],
    x: &'a [f32],
    rstd: &'a [f32],
    w: &'a [f32],
    dim: usize,
}

multiversion! {
    /// Rows row0.. of the backward (dx in `dxs`), dw's share added to dwp.
    fn bwd_rows(dxs: &mut [f32], dwp: &mut [f32], inputs: &BwdInputs, row0: usize) {
        let BwdInputs { accumulate, dy, x, rstd, w, dim } = *inputs;
        let groups = w.len() / dim;
        for (i, dxr) in dxs.chunks_mut(dim).enumerate() {
            let row = row0 + i;
            let xr = &x[row * dim..(row + 1) * dim];
            let dyr = &dy[row * dim..(row + 1) * dim];
            let g = row % groups;
            let wr = &w[g * dim..(g + 1) * dim];
            let s = rstd[row];
            let mean = sum8(wr, dyr, xr, |wv, d, xv| wv * d * (xv * s)) / dim as f32;
            for ((dwv, &d), &xv) in dwp[g * dim..(g + 1) * dim].iter_mut().zip(dyr).zip(xr) {
                *dwv += d * (xv * s);
            }
            for (((o, &wv), &d), &xv) in dxr.iter_mut().zip(wr).zip(dyr).zip(xr) {
                let v = s * (wv * d - xv * s * mean);
                *o = if accumulate { *o + v } else { v };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_gradient, randn};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// L = Σ g ⊙ rms_norm(x, w), accumulated in f64.
    fn loss(x: &[f32], w: &[f32], g: &[f32], dim: usize, eps: f32) -> f64 {
        let mut y = vec![0.0; x.len()];
        let mut rstd = vec![0.0; x.len() / dim];
        rms_norm_fwd(&mut y, &mut rstd, x, w, dim, eps);
        y.iter().zip(g).map(|(a, b)| *a as f64 * *b as f64).sum()
    }

    /// dx and dw by central differences, for the three weight layouts FoX uses: one weight row
    /// for every row (block norms, shared QK-norm), and one per head (rows cycle through groups).
    #[test]
    fn backward_matches_finite_differences() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let (dim, rows) = (16, 24);
        for (groups, eps) in [(1, 1e-6), (4, 1e-5), (3, 1e-6)] {
            let x = randn(&mut rng, rows * dim);
            let w: Vec<f32> = randn(&mut rng, groups * dim).iter().map(|v| 1.0 + 0.5 * v).collect();
            let g = randn(&mut rng, rows * dim);
            let mut y = vec![0.0; rows * dim];
            let mut rstd = vec![0.0; rows];
            rms_norm_fwd(&mut y, &mut rstd, &x, &w, dim, eps);
            // accumulate = true adds to what is there: start dx at 1 and subtract it after.
            let mut dx = vec![1.0; rows * dim];
            let mut dw = vec![0.5; w.len()];
            rms_norm_bwd(&mut dx, true, &mut dw, &g, &x, &rstd, &w, dim);
            dx.iter_mut().for_each(|v| *v -= 1.0);
            dw.iter_mut().for_each(|v| *v -= 0.5);
            // f32 forward, central differences with h = 1e-2: O(h²) truncation, ~1e-5 round-off.
            let step_tol = (1e-2, 2e-3);
            let dx_what = format!("groups {groups}: dx");
            assert_gradient(&dx_what, &dx, &x, (0..x.len()).step_by(7), step_tol, |p| loss(p, &w, &g, dim, eps));
            let dw_what = format!("groups {groups}: dw");
            assert_gradient(&dw_what, &dw, &w, 0..w.len(), step_tol, |p| loss(&x, p, &g, dim, eps));
            // accumulate = false overwrites.
            let mut dx2 = vec![f32::NAN; rows * dim];
            let mut dw2 = vec![0.0; w.len()];
            rms_norm_bwd(&mut dx2, false, &mut dw2, &g, &x, &rstd, &w, dim);
            assert!(dx2.iter().zip(&dx).all(|(a, b)| (a - b).abs() < 1e-5));
        }
    }
}
