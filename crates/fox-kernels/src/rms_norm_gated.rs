//! Gated RMSNorm (Mamba-2's output norm, `norm_before_gate=False`), f32:
//!
//! ```text
//! g = x ⊙ silu(z),   y = g · rsqrt(mean(g²) + eps) · w
//! ```
//!
//! over rows of `dim` values: a token's Di channels in `groups` groups of dim = Di / groups (the
//! authors' Mamba-2 has one group; fla's normalises each group of B/C's heads apart). x and y
//! are contiguous [tokens, Di] = [rows, dim] with rows = tokens · groups; z is read in place from
//! a wider buffer (token stride `z_stride`, e.g. the in_proj output whose first Di columns are z),
//! and dz written into the same layout; w is [Di] (group g's weights at g·dim).

use crate::scalar::{sigmoid, silu};
use anyhow::{ensure, Result};
use rayon::prelude::*;

const ROWS_PER_TASK: usize = 32;

fn check(n: usize, z: usize, z_stride: usize, w: usize, dim: usize, groups: usize) -> Result<()> {
    let width = dim * groups;
    ensure!(width > 0 && n.is_multiple_of(width), "rms_norm_gated: {n} values are not tokens of {groups} × {dim}");
    ensure!(w == width, "rms_norm_gated: weight has {w} values, not groups × dim = {width}");
    ensure!(z_stride >= width, "rms_norm_gated: z_stride {z_stride} < groups × dim {width}");
    let tokens = n / width;
    let need = if tokens == 0 { 0 } else { (tokens - 1) * z_stride + width };
    ensure!(z >= need, "rms_norm_gated: z holds {z} values, needs {need}");
    Ok(())
}

/// Where row `row`'s z (and dz) start, and its weights'.
fn z_at(row: usize, z_stride: usize, dim: usize, groups: usize) -> (usize, usize) {
    ((row / groups) * z_stride + (row % groups) * dim, (row % groups) * dim)
}

/// One gated norm: the inputs both passes read (layouts as in the module's doc).
#[derive(Clone, Copy, Debug)]
pub struct GatedNorm<'a> {
    /// [rows, dim]
    pub x: &'a [f32],
    /// The gate, `dim` values of each row at its token's offset · `z_stride` plus its group's.
    pub z: &'a [f32],
    pub z_stride: usize,
    /// [groups · dim]
    pub w: &'a [f32],
    pub dim: usize,
    pub groups: usize,
}

/// Forward: y [rows, dim]; `rstd` [rows] (1 / rms of x ⊙ silu(z)) kept for the backward.
pub fn rms_norm_gated_fwd(p: &GatedNorm, eps: f32, y: &mut [f32], rstd: &mut [f32]) -> Result<()> {
    let GatedNorm { x, z, z_stride, w, dim, groups } = *p;
    check(x.len(), z.len(), z_stride, w.len(), dim, groups)?;
    ensure!(y.len() == x.len(), "rms_norm_gated: y has {} values, not {}", y.len(), x.len());
    ensure!(rstd.len() == x.len() / dim, "rms_norm_gated: rstd has {} values, not rows", rstd.len());
    y.par_chunks_mut(dim * ROWS_PER_TASK).zip(rstd.par_chunks_mut(ROWS_PER_TASK)).enumerate().for_each(
        |(task, (ys, rs))| {
            for (i, (yr, r)) in ys.chunks_mut(dim).zip(rs.iter_mut()).enumerate() {
                let row = task * ROWS_PER_TASK + i;
                let (zo, wo) = z_at(row, z_stride, dim, groups);
                let (xr, zr) = (&x[row * dim..][..dim], &z[zo..][..dim]);
                for k in 0..dim {
                    yr[k] = xr[k] * silu(zr[k]);
                }
                let ms = yr.iter().map(|v| v * v).sum::<f32>() / dim as f32;
                let s = 1.0 / (ms + eps).sqrt();
                *r = s;
                for (v, &wv) in yr.iter_mut().zip(&w[wo..wo + dim]) {
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
pub fn rms_norm_gated_bwd(
    p: &GatedNorm,
    dy: &[f32],
    rstd: &[f32],
    dx: &mut [f32],
    dz: &mut [f32],
    dw: &mut [f32],
) -> Result<()> {
    let GatedNorm { x, z, z_stride, w, dim, groups } = *p;
    check(x.len(), z.len(), z_stride, w.len(), dim, groups)?;
    check(x.len(), dz.len(), z_stride, dw.len(), dim, groups)?;
    ensure!(dx.len() == x.len() && dy.len() == x.len(), "rms_norm_gated: dx and dy must match x");
    ensure!(rstd.len() == x.len() / dim, "rms_norm_gated: rstd has {} values, not rows", rstd.len());
    let dzp = crate::par::SharedMut::new(dz);
    let partial: Vec<Vec<f32>> = dx
        .par_chunks_mut(dim * ROWS_PER_TASK)
        .enumerate()
        .map(|(task, dxs)| {
            let mut dwp = vec![0.0f32; dim * groups];
            let mut gbuf = vec![0.0f32; dim];
            for (i, dxr) in dxs.chunks_mut(dim).enumerate() {
                let row = task * ROWS_PER_TASK + i;
                let (zo, wo) = z_at(row, z_stride, dim, groups);
                let (xr, zr, dyr) = (&x[row * dim..][..dim], &z[zo..][..dim], &dy[row * dim..][..dim]);
                let (wr, dwr) = (&w[wo..wo + dim], &mut dwp[wo..wo + dim]);
                let s = rstd[row];
                let mut mean = 0.0f32;
                for k in 0..dim {
                    gbuf[k] = xr[k] * silu(zr[k]);
                    let n = gbuf[k] * s;
                    mean += wr[k] * dyr[k] * n;
                    dwr[k] += dyr[k] * n;
                }
                mean /= dim as f32;
                // SAFETY: this task alone writes these rows' dz.
                let dzr = unsafe { dzp.slice(zo, dim) };
                for k in 0..dim {
                    let dg = s * (wr[k] * dyr[k] - gbuf[k] * s * mean);
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
    use crate::testing::{assert_gradient, randn};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// The forward against its formula in f64; dx, dz, dw against central differences (h = 1e-2:
    /// the loss is smooth with derivatives of order 1, truncation O(h²) ≈ 1e-4, f32 round-off of
    /// the loss ~1e-6 over 2h), 70 rows (tasks of 32 ending inside), z read from a wider buffer.
    #[test]
    fn forward_and_backward() {
        let mut rng = ChaCha8Rng::seed_from_u64(41);
        let (rows, dim, zs, eps) = (70, 12, 17, 1e-5f32);
        let x = randn(&mut rng, rows * dim);
        let z = randn(&mut rng, rows * zs);
        let w: Vec<f32> = randn(&mut rng, dim).iter().map(|v| 1.0 + 0.3 * v).collect();
        let g = randn(&mut rng, rows * dim);
        let fwd = |x: &[f32], z: &[f32], w: &[f32]| -> (Vec<f32>, Vec<f32>) {
            let (mut y, mut r) = (vec![0.0; rows * dim], vec![0.0; rows]);
            rms_norm_gated_fwd(&GatedNorm { x, z, z_stride: zs, w, dim, groups: 1 }, eps, &mut y, &mut r).unwrap();
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
        let norm = GatedNorm { x: &x, z: &z, z_stride: zs, w: &w, dim, groups: 1 };
        rms_norm_gated_bwd(&norm, &g, &rstd, &mut dx, &mut dz, &mut dw).unwrap();
        let step_tol = (1e-2, 3e-3);
        assert_gradient("dx", &dx, &x, (0..x.len()).step_by(5), step_tol, |p| loss(p, &z, &w));
        let (channels, past): (Vec<usize>, Vec<usize>) = (0..z.len()).step_by(3).partition(|i| i % zs < dim);
        assert!(past.iter().all(|&i| dz[i] == 5.0), "columns past dim are left");
        assert_gradient("dz", &dz, &z, channels, step_tol, |p| loss(&x, p, &w));
        dw.iter_mut().for_each(|v| *v -= 0.5);
        assert_gradient("dw", &dw, &w, 0..dim, step_tol, |p| loss(&x, &z, p));
        assert!(rms_norm_gated_fwd(&GatedNorm { x: &x[..5], ..norm }, eps, &mut [0.0; 5], &mut [0.0; 1]).is_err());
    }

    /// Two groups: each token's channels normalised group by group with the group's weights, the
    /// same as the one-group op on each group alone (z taken from the token's columns of the group).
    #[test]
    fn groups_normalise_apart() {
        let mut rng = ChaCha8Rng::seed_from_u64(43);
        let (tokens, dim, g, zs, eps) = (37, 6, 2, 15, 1e-5f32);
        let x = randn(&mut rng, tokens * g * dim);
        let z = randn(&mut rng, tokens * zs);
        let w = randn(&mut rng, g * dim);
        let dy = randn(&mut rng, tokens * g * dim);
        let (mut y, mut rs) = (vec![0.0; x.len()], vec![0.0; tokens * g]);
        let p = GatedNorm { x: &x, z: &z, z_stride: zs, w: &w, dim, groups: g };
        rms_norm_gated_fwd(&p, eps, &mut y, &mut rs).unwrap();
        let (mut dx, mut dz, mut dw) = (vec![0.0; x.len()], vec![0.0; z.len()], vec![0.0; g * dim]);
        rms_norm_gated_bwd(&p, &dy, &rs, &mut dx, &mut dz, &mut dw).unwrap();
        for gi in 0..g {
            let pick = |v: &[f32], stride: usize| -> Vec<f32> {
                (0..tokens).flat_map(|t| v[t * stride + gi * dim..][..dim].to_vec()).collect()
            };
            let (xg, zg, dyg, wg) =
                (pick(&x, g * dim), pick(&z, zs), pick(&dy, g * dim), w[gi * dim..][..dim].to_vec());
            let (mut y1, mut r1) = (vec![0.0; tokens * dim], vec![0.0; tokens]);
            let p1 = GatedNorm { x: &xg, z: &zg, z_stride: dim, w: &wg, dim, groups: 1 };
            rms_norm_gated_fwd(&p1, eps, &mut y1, &mut r1).unwrap();
            assert_eq!(pick(&y, g * dim), y1, "group {gi}: y");
            let (mut dx1, mut dz1, mut dw1) = (vec![0.0; xg.len()], vec![0.0; zg.len()], vec![0.0; dim]);
            rms_norm_gated_bwd(&p1, &dyg, &r1, &mut dx1, &mut dz1, &mut dw1).unwrap();
            assert_eq!(pick(&dx, g * dim), dx1, "group {gi}: dx");
            assert_eq!(pick(&dz, zs), dz1, "group {gi}: dz");
            for k in 0..dim {
                assert!((dw[gi * dim + k] - dw1[k]).abs() <= 1e-5 * (1.0 + dw1[k].abs()), "group {gi}: dw[{k}]");
            }
        }
    }
}
