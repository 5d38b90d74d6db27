//! RMSNorm: y = x · rsqrt(mean(x²) + eps) · w, in f32.
//!
//! One routine covers the three uses in FoX: the block norms (weight of size `dim`), the per-head
//! QK-norm and output norm (x viewed as [rows·H, head_dim], weight [H·head_dim]: one gamma per head
//! and channel), and the shared QK-norm (weight [head_dim] for every head). The weight row used by
//! row r is `r % (w.len() / dim)`.

use crate::par::SharedMut;
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
    assert!(w.len() % dim == 0 && !w.is_empty(), "rms_norm: weight length {} vs dim {dim}", w.len());
    y.par_chunks_mut(dim * ROWS_PER_TASK)
        .zip(rstd.par_chunks_mut(ROWS_PER_TASK))
        .enumerate()
        .for_each(|(chunk, (ys, rs))| {
            for (i, (yr, r)) in ys.chunks_mut(dim).zip(rs.iter_mut()).enumerate() {
                let row = chunk * ROWS_PER_TASK + i;
                let xr = &x[row * dim..(row + 1) * dim];
                let ms = xr.iter().map(|v| v * v).sum::<f32>() / dim as f32;
                let s = 1.0 / (ms + eps).sqrt();
                *r = s;
                let wr = weight_row(w, dim, row);
                for c in 0..dim {
                    yr[c] = xr[c] * s * wr[c];
                }
            }
        });
}

/// Backward: dx = rstd · (w·dy − x̂ · mean(w·dy·x̂)), dw += Σ dy·x̂ (x̂ = x·rstd).
/// `dx` is overwritten, or added to when `accumulate` (for residual streams).
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
    let rows = x.len() / dim;
    assert_eq!(dy.len(), x.len());
    assert_eq!(dx.len(), x.len());
    assert_eq!(dw.len(), w.len());
    let groups = w.len() / dim;
    // dw needs a reduction over rows: per task partial sums, then a fixed-order sum (deterministic).
    let n_tasks = rows.div_ceil(ROWS_PER_TASK);
    let dxp = SharedMut::new(dx);
    let partial: Vec<Vec<f32>> = (0..n_tasks)
        .into_par_iter()
        .map(|t| {
            let mut dwp = vec![0.0f32; w.len()];
            let r0 = t * ROWS_PER_TASK;
            let r1 = (r0 + ROWS_PER_TASK).min(rows);
            for row in r0..r1 {
                let xr = &x[row * dim..(row + 1) * dim];
                let dyr = &dy[row * dim..(row + 1) * dim];
                let g = row % groups;
                let wr = &w[g * dim..(g + 1) * dim];
                let s = rstd[row];
                let mut dot = 0.0f32;
                for c in 0..dim {
                    let xh = xr[c] * s;
                    dot += wr[c] * dyr[c] * xh;
                    dwp[g * dim + c] += dyr[c] * xh;
                }
                let mean = dot / dim as f32;
                // SAFETY: rows are disjoint between tasks.
                let dxr = unsafe { dxp.slice(row * dim, dim) };
                for c in 0..dim {
                    let v = s * (wr[c] * dyr[c] - xr[c] * s * mean);
                    if accumulate {
                        dxr[c] += v;
                    } else {
                        dxr[c] = v;
                    }
                }
            }
            dwp
        })
        .collect();
    for p in partial {
        for (a, b) in dw.iter_mut().zip(p) {
            *a += b;
        }
    }
}
