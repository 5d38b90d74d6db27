//! Gated RMSNorm (Mamba-2's output norm, `norm_before_gate=False`), f32:
//!
//! ```text
//! g = x ⊙ silu(z),   y = g · rsqrt(mean(g²) + eps) · w
//! ```
//!
//! over rows of `dim` values (Mamba-2: all Di channels of a token, one group). x and y are
//! contiguous [rows, dim]; z is read in place from a wider buffer (row stride `z_stride`, e.g. the
//! in_proj output whose first Di columns are z), and dz written into the same layout.

use crate::scalar::{sigmoid, silu};
use anyhow::{ensure, Result};
use rayon::prelude::*;

const ROWS_PER_TASK: usize = 32;

fn check(n: usize, z: usize, z_stride: usize, w: usize, dim: usize) -> Result<()> {
    ensure!(dim > 0 && n.is_multiple_of(dim), "rms_norm_gated: {n} values are not rows of {dim}");
    ensure!(w == dim, "rms_norm_gated: weight has {w} values, not dim = {dim}");
    ensure!(z_stride >= dim, "rms_norm_gated: z_stride {z_stride} < dim {dim}");
    let rows = n / dim;
    let need = if rows == 0 { 0 } else { (rows - 1) * z_stride + dim };
    ensure!(z >= need, "rms_norm_gated: z holds {z} values, needs {need}");
    Ok(())
}

/// Forward: y [rows, dim]; `rstd` [rows] (1 / rms of x ⊙ silu(z)) kept for the backward.
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_gated_fwd(
    y: &mut [f32],
    rstd: &mut [f32],
    x: &[f32],
    z: &[f32],
    z_stride: usize,
    w: &[f32],
    dim: usize,
    eps: f32,
) -> Result<()> {
    check(x.len(), z.len(), z_stride, w.len(), dim)?;
    ensure!(y.len() == x.len(), "rms_norm_gated: y has {} values, not {}", y.len(), x.len());
    ensure!(rstd.len() == x.len() / dim, "rms_norm_gated: rstd has {} values, not rows", rstd.len());
    y.par_chunks_mut(dim * ROWS_PER_TASK).zip(rstd.par_chunks_mut(ROWS_PER_TASK)).enumerate().for_each(
        |(task, (ys, rs))| {
            for (i, (yr, r)) in ys.chunks_mut(dim).zip(rs.iter_mut()).enumerate() {
                let row = task * ROWS_PER_TASK + i;
                let (xr, zr) = (&x[row * dim..][..dim], &z[row * z_stride..][..dim]);
                for k in 0..dim {
                    yr[k] = xr[k] * silu(zr[k]);
                }
                let ms = yr.iter().map(|v| v * v).sum::<f32>() / dim as f32;
                let s = 1.0 / (ms + eps).sqrt();
                *r = s;
                for (v, &wv) in yr.iter_mut().zip(w) {
                    *v = *v * s * wv;
                }
            }
        },
    );
    Ok(())
}

/// Backward: with n = g·rstd, dg = rstd · (w·dy − n · mean(w·dy·n)); dx = dg · silu(z) ([rows,
/// dim], overwritten); dz = dg · x · silu'(z) (layout of z: `dim` columns of each row overwritten,
/// others left); dw [dim] += Σ_rows dy · n (per-task partial sums added in task order:
/// deterministic).
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_gated_bwd(
    dx: &mut [f32],
    dz: &mut [f32],
    dw: &mut [f32],
    dy: &[f32],
    x: &[f32],
    z: &[f32],
    z_stride: usize,
    rstd: &[f32],
    w: &[f32],
    dim: usize,
) -> Result<()> {
    check(x.len(), z.len(), z_stride, w.len(), dim)?;
    check(x.len(), dz.len(), z_stride, dw.len(), dim)?;
    ensure!(dx.len() == x.len() && dy.len() == x.len(), "rms_norm_gated: dx and dy must match x");
    ensure!(rstd.len() == x.len() / dim, "rms_norm_gated: rstd has {} values, not rows", rstd.len());
    let dzp = crate::par::SharedMut::new(dz);
    let partial: Vec<Vec<f32>> = dx
        .par_chunks_mut(dim * ROWS_PER_TASK)
        .enumerate()
        .map(|(task, dxs)| {
            let mut dwp = vec![0.0f32; dim];
            let mut gbuf = vec![0.0f32; dim];
            for (i, dxr) in dxs.chunks_mut(dim).enumerate() {
                let row = task * ROWS_PER_TASK + i;
                let (xr, zr, dyr) = (&x[row * dim..][..dim], &z[row * z_stride..][..dim], &dy[row * dim..][..dim]);
                let s = rstd[row];
                let mut mean = 0.0f32;
                for k in 0..dim {
                    gbuf[k] = xr[k] * silu(zr[k]);
                    let n = gbuf[k] * s;
                    mean += w[k] * dyr[k] * n;
                    dwp[k] += dyr[k] * n;
                }
                mean /= dim as f32;
                // SAFETY: this task alone writes these rows of dz.
                let dzr = unsafe { dzp.slice(row * z_stride, dim) };
                for k in 0..dim {
                    let dg = s * (w[k] * dyr[k] - gbuf[k] * s * mean);
                    let sg = sigmoid(zr[k]);
                    dxr[k] = dg * zr[k] * sg;
                    dzr[k] = dg * xr[k] * sg * (1.0 + zr[k] * (1.0 - sg));
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use rand_distr::StandardNormal;

    /// The forward against its formula in f64; dx, dz, dw against central differences (h = 1e-2:
    /// the loss is smooth with derivatives of order 1, truncation O(h²) ≈ 1e-4, f32 round-off of
    /// the loss ~1e-6 over 2h), 70 rows (tasks of 32 ending inside), z read from a wider buffer.
    #[test]
    fn forward_and_backward() {
        let mut rng = ChaCha8Rng::seed_from_u64(41);
        let (rows, dim, zs, eps) = (70, 12, 17, 1e-5f32);
        let rn = |rng: &mut ChaCha8Rng, n: usize| -> Vec<f32> { (0..n).map(|_| rng.sample(StandardNormal)).collect() };
        let x = rn(&mut rng, rows * dim);
        let z = rn(&mut rng, rows * zs);
        let w: Vec<f32> = rn(&mut rng, dim).iter().map(|v| 1.0 + 0.3 * v).collect();
        let g = rn(&mut rng, rows * dim);
        let fwd = |x: &[f32], z: &[f32], w: &[f32]| -> (Vec<f32>, Vec<f32>) {
            let (mut y, mut r) = (vec![0.0; rows * dim], vec![0.0; rows]);
            rms_norm_gated_fwd(&mut y, &mut r, x, z, zs, w, dim, eps).unwrap();
            (y, r)
        };
        let (y, rstd) = fwd(&x, &z, &w);
        for r in 0..rows {
            let gv: Vec<f64> = (0..dim)
                .map(|k| x[r * dim + k] as f64 * z[r * zs + k] as f64 / (1.0 + (-z[r * zs + k] as f64).exp()))
                .collect();
            let s = 1.0 / (gv.iter().map(|v| v * v).sum::<f64>() / dim as f64 + eps as f64).sqrt();
            for k in 0..dim {
                let want = gv[k] * s * w[k] as f64;
                assert!((y[r * dim + k] as f64 - want).abs() < 1e-5 * (1.0 + want.abs()), "y[{r},{k}]");
            }
        }
        let loss = |x: &[f32], z: &[f32], w: &[f32]| -> f64 {
            fwd(x, z, w).0.iter().zip(&g).map(|(a, b)| *a as f64 * *b as f64).sum()
        };
        let mut dx = vec![f32::NAN; x.len()];
        let mut dz = vec![5.0; z.len()];
        let mut dw = vec![0.5; dim];
        rms_norm_gated_bwd(&mut dx, &mut dz, &mut dw, &g, &x, &z, zs, &rstd, &w, dim).unwrap();
        let e = 1e-2f32;
        let tol = 3e-3;
        for i in (0..x.len()).step_by(5) {
            let (mut p, mut m) = (x.clone(), x.clone());
            p[i] += e;
            m[i] -= e;
            let fd = ((loss(&p, &z, &w) - loss(&m, &z, &w)) / (2.0 * e as f64)) as f32;
            assert!((fd - dx[i]).abs() < tol * (1.0 + fd.abs()), "dx[{i}]: fd {fd} vs {}", dx[i]);
        }
        for i in (0..z.len()).step_by(3) {
            if i % zs >= dim {
                assert_eq!(dz[i], 5.0, "columns past dim are left");
                continue;
            }
            let (mut p, mut m) = (z.clone(), z.clone());
            p[i] += e;
            m[i] -= e;
            let fd = ((loss(&x, &p, &w) - loss(&x, &m, &w)) / (2.0 * e as f64)) as f32;
            assert!((fd - dz[i]).abs() < tol * (1.0 + fd.abs()), "dz[{i}]: fd {fd} vs {}", dz[i]);
        }
        for k in 0..dim {
            let (mut p, mut m) = (w.clone(), w.clone());
            p[k] += e;
            m[k] -= e;
            let fd = ((loss(&x, &z, &p) - loss(&x, &z, &m)) / (2.0 * e as f64)) as f32;
            let got = dw[k] - 0.5;
            assert!((fd - got).abs() < tol * (1.0 + fd.abs()), "dw[{k}]: fd {fd} vs {got}");
        }
        assert!(rms_norm_gated_fwd(&mut [0.0; 5], &mut [0.0; 1], &x[..5], &z, zs, &w, dim, eps).is_err());
    }
}
