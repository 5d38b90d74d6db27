//! The Mamba-2 family's operations on the CPU backend (f32, the reference).

use super::ops::{Mamba2Ops, Mamba2Params};
use super::state::Mamba2State;
use crate::backend::cpu::{Cpu, CpuBatch};
use crate::backend::Family;
use crate::config::Mamba2Sizes;
use anyhow::{ensure, Result};
use rayon::prelude::*;

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// d silu(x) / dx.
fn silu_grad(x: f32) -> f32 {
    let s = sigmoid(x);
    s * (1.0 + x * (1.0 - s))
}

/// softplus as PyTorch computes it (linear above 20).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Padding positions of each row in this chunk: positions before a row's first real token.
fn pads(b: &CpuBatch) -> Vec<usize> {
    (0..b.batch).map(|r| b.start.as_ref().map_or(0, |s| s[r].saturating_sub(b.past).min(b.seq))).collect()
}

/// Column offsets in zxbcdt: z, xBC, dt.
fn cols(s: &Mamba2Sizes) -> (usize, usize, usize) {
    (0, s.inner, s.inner + s.conv_dim())
}

impl Mamba2Ops for Cpu<'_> {
    type Mamba2State = Mamba2State;

    fn mamba2_conv_fwd(
        &mut self,
        xbc: &mut Vec<f32>,
        zxbcdt: &Vec<f32>,
        p: &Mamba2Params,
        b: &CpuBatch,
        state: Option<&mut Mamba2State>,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let s = &p.sizes;
        let (e, c, w, t) = (s.in_proj_dim(), s.conv_dim(), s.conv, b.seq);
        let (_, x0, _) = cols(s);
        let wt = &self.params[p.conv_w];
        let bias = p.conv_b.map(|id| &self.params[id]);
        let pads = pads(b);
        let prev = state.as_ref().map(|st| st.conv.as_slice());
        xbc.par_chunks_mut(t * c).enumerate().for_each(|(bi, out)| {
            // input τ of row bi (τ < 0: the state's inputs before this chunk)
            let input = |tau: isize, ch: usize| -> f32 {
                if tau < 0 {
                    prev.map_or(0.0, |pv| pv[(bi * (w - 1) + (w as isize - 1 + tau) as usize) * c + ch])
                } else if (tau as usize) < pads[bi] {
                    0.0
                } else {
                    zxbcdt[(bi * t + tau as usize) * e + x0 + ch]
                }
            };
            for ti in 0..t {
                for ch in 0..c {
                    let y = &mut out[ti * c + ch];
                    if ti < pads[bi] {
                        *y = 0.0;
                        continue;
                    }
                    let mut acc = bias.map_or(0.0, |bv| bv[ch]);
                    for k in 0..w {
                        acc += wt[ch * w + k] * input(ti as isize - (w as isize - 1) + k as isize, ch);
                    }
                    *y = silu(acc);
                }
            }
        });
        if let Some(st) = state {
            // The last W − 1 inputs, from this chunk or, for short chunks, the state before.
            let mut next = vec![0.0; st.conv.len()];
            for bi in 0..b.batch {
                for j in 0..w - 1 {
                    let tau = t as isize - (w as isize - 1) + j as isize;
                    for ch in 0..c {
                        next[(bi * (w - 1) + j) * c + ch] = if tau < 0 {
                            st.conv[(bi * (w - 1) + (w as isize - 1 + tau) as usize) * c + ch]
                        } else if (tau as usize) < pads[bi] {
                            0.0
                        } else {
                            zxbcdt[(bi * t + tau as usize) * e + x0 + ch]
                        };
                    }
                }
            }
            st.conv = next;
        }
        Ok(())
    }

    fn mamba2_conv_bwd(
        &mut self,
        dzxbcdt: &mut Vec<f32>,
        dxbc: &Vec<f32>,
        zxbcdt: &Vec<f32>,
        p: &Mamba2Params,
        b: &CpuBatch,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let s = p.sizes;
        let (e, c, w, t) = (s.in_proj_dim(), s.conv_dim(), s.conv, b.seq);
        let (_, x0, _) = cols(&s);
        let pads = pads(b);
        let wt = self.params[p.conv_w].to_vec();
        let bias = p.conv_b.map(|id| self.params[id].to_vec());
        // d(pre-activation) per position, then the three gradients.
        let mut dacc = vec![0.0f32; b.batch * t * c];
        let input = |bi: usize, tau: isize, ch: usize| -> f32 {
            if tau < 0 || (tau as usize) < pads[bi] {
                0.0
            } else {
                zxbcdt[(bi * t + tau as usize) * e + x0 + ch]
            }
        };
        dacc.par_chunks_mut(t * c).enumerate().for_each(|(bi, da)| {
            for ti in pads[bi]..t {
                for ch in 0..c {
                    let mut acc = bias.as_ref().map_or(0.0, |bv| bv[ch]);
                    for k in 0..w {
                        acc += wt[ch * w + k] * input(bi, ti as isize - (w as isize - 1) + k as isize, ch);
                    }
                    da[ti * c + ch] = dxbc[(bi * t + ti) * c + ch] * silu_grad(acc);
                }
            }
        });
        // d input: written into xBC's columns.
        dzxbcdt.par_chunks_mut(t * e).enumerate().for_each(|(bi, dz)| {
            for tau in 0..t {
                for ch in 0..c {
                    let mut g = 0.0;
                    if tau >= pads[bi] {
                        for k in 0..w {
                            let ti = tau + (w - 1) - k;
                            if ti < t {
                                g += dacc[(bi * t + ti) * c + ch] * wt[ch * w + k];
                            }
                        }
                    }
                    dz[tau * e + x0 + ch] = g;
                }
            }
        });
        if let Some(gw) = self.grad_of(p.conv_w)? {
            for ch in 0..c {
                for k in 0..w {
                    let mut g = 0.0;
                    for bi in 0..b.batch {
                        for ti in 0..t {
                            g += dacc[(bi * t + ti) * c + ch]
                                * input(bi, ti as isize - (w as isize - 1) + k as isize, ch);
                        }
                    }
                    gw[ch * w + k] += g;
                }
            }
        }
        if let Some(id) = p.conv_b {
            if let Some(gb) = self.grad_of(id)? {
                for (ch, g) in gb.iter_mut().enumerate() {
                    *g += (0..b.batch * t).map(|r| dacc[r * c + ch]).sum::<f32>();
                }
            }
        }
        Ok(())
    }

    fn mamba2_dt_fwd(&mut self, dt: &mut Vec<f32>, zxbcdt: &Vec<f32>, p: &Mamba2Params) -> Result<()> {
        let _t = self.time(Family::Other);
        let s = &p.sizes;
        let (e, h, (_, _, d0)) = (s.in_proj_dim(), s.heads, cols(s));
        let bias = &self.params[p.dt_bias];
        for (r, row) in dt.chunks_mut(h).enumerate() {
            for (hi, v) in row.iter_mut().enumerate() {
                *v = softplus(zxbcdt[r * e + d0 + hi] + bias[hi]);
            }
        }
        Ok(())
    }

    fn mamba2_dt_bwd(
        &mut self,
        dzxbcdt: &mut Vec<f32>,
        ddt: &Vec<f32>,
        zxbcdt: &Vec<f32>,
        p: &Mamba2Params,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let s = &p.sizes;
        let (e, h, (_, _, d0)) = (s.in_proj_dim(), s.heads, cols(s));
        let bias = self.params[p.dt_bias].to_vec();
        let mut gbias = vec![0.0f32; h];
        for (r, row) in ddt.chunks(h).enumerate() {
            for (hi, &g) in row.iter().enumerate() {
                let x = zxbcdt[r * e + d0 + hi] + bias[hi];
                let d = if x > 20.0 { g } else { g * sigmoid(x) };
                dzxbcdt[r * e + d0 + hi] = d;
                gbias[hi] += d;
            }
        }
        if let Some(gb) = self.grad_of(p.dt_bias)? {
            gb.iter_mut().zip(&gbias).for_each(|(a, b)| *a += b);
        }
        Ok(())
    }

    fn ssd_fwd(
        &mut self,
        y: &mut Vec<f32>,
        xbc: &Vec<f32>,
        dt: &Vec<f32>,
        p: &Mamba2Params,
        b: &CpuBatch,
        state: Option<&mut Mamba2State>,
    ) -> Result<()> {
        let _t = self.time(Family::Attention);
        let s = p.sizes;
        let (h, pp, n, g, c, t) = (s.heads, s.head_dim, s.state, s.groups, s.conv_dim(), b.seq);
        let per_group = h / g;
        let a: Vec<f32> = self.params[p.a_log].iter().map(|v| -v.exp()).collect();
        let dskip = &self.params[p.d_skip];
        let pads = pads(b);
        let mut states: Vec<f32> = match &state {
            Some(st) => {
                ensure!(st.ssm.len() == b.batch * h * pp * n, "Mamba-2 state of another batch size");
                st.ssm.clone()
            }
            None => vec![0.0; b.batch * h * pp * n],
        };
        // Per (row, head): the plain recurrence, into a [T, P] column block of y.
        let outs: Vec<Vec<f32>> = states
            .par_chunks_mut(pp * n)
            .enumerate()
            .map(|(bh, st)| {
                let (bi, hi) = (bh / h, bh % h);
                let gi = hi / per_group;
                let mut out = vec![0.0f32; t * pp];
                for ti in pads[bi]..t {
                    let r = bi * t + ti;
                    let d = dt[r * h + hi];
                    let da = (d * a[hi]).exp();
                    let x = &xbc[r * c + hi * pp..][..pp];
                    let bv = &xbc[r * c + s.inner + gi * n..][..n];
                    let cv = &xbc[r * c + s.inner + g * n + gi * n..][..n];
                    for pi in 0..pp {
                        let row = &mut st[pi * n..(pi + 1) * n];
                        let mut acc = 0.0;
                        for ni in 0..n {
                            row[ni] = da * row[ni] + d * x[pi] * bv[ni];
                            acc += row[ni] * cv[ni];
                        }
                        out[ti * pp + pi] = acc + dskip[hi] * x[pi];
                    }
                }
                out
            })
            .collect();
        let di = s.inner;
        for (bh, out) in outs.iter().enumerate() {
            let (bi, hi) = (bh / h, bh % h);
            for ti in 0..t {
                y[(bi * t + ti) * di + hi * pp..][..pp].copy_from_slice(&out[ti * pp..(ti + 1) * pp]);
            }
        }
        if let Some(st) = state {
            st.ssm = states;
            st.len += t;
        }
        Ok(())
    }

    fn ssd_bwd(
        &mut self,
        dxbc: &mut Vec<f32>,
        ddt: &mut Vec<f32>,
        dy: &Vec<f32>,
        xbc: &Vec<f32>,
        dt: &Vec<f32>,
        p: &Mamba2Params,
        b: &CpuBatch,
    ) -> Result<()> {
        let _t = self.time(Family::Attention);
        let s = p.sizes;
        let (h, pp, n, g, c, t, di) = (s.heads, s.head_dim, s.state, s.groups, s.conv_dim(), b.seq, s.inner);
        let per_group = h / g;
        let a: Vec<f32> = self.params[p.a_log].iter().map(|v| -v.exp()).collect();
        let dskip = self.params[p.d_skip].to_vec();
        let pads = pads(b);
        // Per (row, group): its heads one after the other (dB, dC sum over them in a fixed order).
        struct Out {
            dx: Vec<f32>,  // [T, heads of the group · P]
            dbc: Vec<f32>, // [T, 2N]
            ddt: Vec<f32>, // [T, heads of the group]
            da: Vec<f64>,  // per head of the group
            dd: Vec<f64>,
        }
        let outs: Vec<Out> = (0..b.batch * g)
            .into_par_iter()
            .map(|bg| {
                let (bi, gi) = (bg / g, bg % g);
                let mut o = Out {
                    dx: vec![0.0; t * per_group * pp],
                    dbc: vec![0.0; t * 2 * n],
                    ddt: vec![0.0; t * per_group],
                    da: vec![0.0; per_group],
                    dd: vec![0.0; per_group],
                };
                let mut hist = vec![0.0f32; (t + 1) * pp * n];
                for j in 0..per_group {
                    let hi = gi * per_group + j;
                    // The states S_t, from zero before the first real token.
                    hist[..pp * n].fill(0.0);
                    for ti in 0..t {
                        let (prev, cur) = hist[ti * pp * n..(ti + 2) * pp * n].split_at_mut(pp * n);
                        if ti < pads[bi] {
                            cur.copy_from_slice(prev);
                            continue;
                        }
                        let r = bi * t + ti;
                        let d = dt[r * h + hi];
                        let da = (d * a[hi]).exp();
                        let x = &xbc[r * c + hi * pp..][..pp];
                        let bv = &xbc[r * c + di + gi * n..][..n];
                        for pi in 0..pp {
                            for ni in 0..n {
                                cur[pi * n + ni] = da * prev[pi * n + ni] + d * x[pi] * bv[ni];
                            }
                        }
                    }
                    let mut ds = vec![0.0f32; pp * n];
                    for ti in (pads[bi]..t).rev() {
                        let r = bi * t + ti;
                        let d = dt[r * h + hi];
                        let da = (d * a[hi]).exp();
                        let x = &xbc[r * c + hi * pp..][..pp];
                        let bv = &xbc[r * c + di + gi * n..][..n];
                        let cv = &xbc[r * c + di + g * n + gi * n..][..n];
                        let dyv = &dy[r * di + hi * pp..][..pp];
                        let (prev, cur) =
                            (&hist[ti * pp * n..(ti + 1) * pp * n], &hist[(ti + 1) * pp * n..(ti + 2) * pp * n]);
                        let (mut d_da, mut d_dt) = (0.0f64, 0.0f64);
                        for pi in 0..pp {
                            o.dd[j] += (dyv[pi] * x[pi]) as f64;
                            let mut dxp = dskip[hi] * dyv[pi];
                            for ni in 0..n {
                                // y = S C: dC += Sᵀ dy, dS += dy Cᵀ.
                                o.dbc[ti * 2 * n + n + ni] += cur[pi * n + ni] * dyv[pi];
                                let dsv = ds[pi * n + ni] + dyv[pi] * cv[ni];
                                d_da += (dsv * prev[pi * n + ni]) as f64;
                                d_dt += (dsv * x[pi] * bv[ni]) as f64;
                                dxp += d * dsv * bv[ni];
                                o.dbc[ti * 2 * n + ni] += d * dsv * x[pi];
                                ds[pi * n + ni] = da * dsv;
                            }
                            o.dx[ti * per_group * pp + j * pp + pi] = dxp;
                        }
                        o.ddt[ti * per_group + j] = (d_da * (a[hi] * da) as f64 + d_dt) as f32;
                        o.da[j] += d_da * (d * da) as f64;
                    }
                }
                o
            })
            .collect();
        let mut ga = vec![0.0f64; h];
        let mut gd = vec![0.0f64; h];
        for (bg, o) in outs.iter().enumerate() {
            let (bi, gi) = (bg / g, bg % g);
            for ti in 0..t {
                let r = bi * t + ti;
                for j in 0..per_group {
                    let hi = gi * per_group + j;
                    dxbc[r * c + hi * pp..][..pp].copy_from_slice(&o.dx[(ti * per_group + j) * pp..][..pp]);
                    ddt[r * h + hi] = o.ddt[ti * per_group + j];
                }
                dxbc[r * c + di + gi * n..][..n].copy_from_slice(&o.dbc[ti * 2 * n..][..n]);
                dxbc[r * c + di + g * n + gi * n..][..n].copy_from_slice(&o.dbc[ti * 2 * n + n..][..n]);
            }
            for j in 0..per_group {
                ga[gi * per_group + j] += o.da[j];
                gd[gi * per_group + j] += o.dd[j];
            }
        }
        // A = −exp(A_log): dA_log = dA · A.
        if let Some(g) = self.grad_of(p.a_log)? {
            for (hi, v) in g.iter_mut().enumerate() {
                *v += (ga[hi] * a[hi] as f64) as f32;
            }
        }
        if let Some(g) = self.grad_of(p.d_skip)? {
            g.iter_mut().zip(&gd).for_each(|(v, d)| *v += *d as f32);
        }
        Ok(())
    }

    fn gated_norm_fwd(
        &mut self,
        g: &mut Vec<f32>,
        rstd: &mut Vec<f32>,
        y: &Vec<f32>,
        zxbcdt: &Vec<f32>,
        p: &Mamba2Params,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let s = &p.sizes;
        let (e, di, groups) = (s.in_proj_dim(), s.inner, s.groups);
        let m = di / groups;
        let w = &self.params[p.norm];
        let eps = p.eps;
        g.par_chunks_mut(di).zip(rstd.par_chunks_mut(groups)).enumerate().for_each(|(r, (gr, rs))| {
            for (gi, inv_out) in rs.iter_mut().enumerate() {
                let u = |i: usize| y[r * di + i] * silu(zxbcdt[r * e + i]);
                let ms = (gi * m..(gi + 1) * m).map(|i| (u(i) as f64).powi(2)).sum::<f64>() / m as f64;
                let inv = (1.0 / (ms + eps as f64).sqrt()) as f32;
                *inv_out = inv;
                for i in gi * m..(gi + 1) * m {
                    gr[i] = u(i) * inv * w[i];
                }
            }
        });
        Ok(())
    }

    fn gated_norm_bwd(
        &mut self,
        dy: &mut Vec<f32>,
        dzxbcdt: &mut Vec<f32>,
        dg: &Vec<f32>,
        y: &Vec<f32>,
        zxbcdt: &Vec<f32>,
        rstd: &Vec<f32>,
        p: &Mamba2Params,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let s = &p.sizes;
        let (e, di, groups) = (s.in_proj_dim(), s.inner, s.groups);
        let m = di / groups;
        let w = self.params[p.norm].to_vec();
        let rows = dg.len() / di;
        let mut gw = vec![0.0f64; di];
        for r in 0..rows {
            for gi in 0..groups {
                let inv = rstd[r * groups + gi];
                let range = gi * m..(gi + 1) * m;
                let u = |i: usize| y[r * di + i] * silu(zxbcdt[r * e + i]);
                // g = u · inv · w: du = inv · (dg·w − u · inv² · mean(dg·w·u)).
                let dot = range.clone().map(|i| (dg[r * di + i] * w[i] * u(i)) as f64).sum::<f64>() / m as f64;
                for i in range {
                    let ui = u(i);
                    gw[i] += (dg[r * di + i] * ui * inv) as f64;
                    let du = inv * (dg[r * di + i] * w[i] - ui * inv * inv * dot as f32);
                    let z = zxbcdt[r * e + i];
                    dy[r * di + i] = du * silu(z);
                    dzxbcdt[r * e + i] = du * y[r * di + i] * silu_grad(z);
                }
            }
        }
        if let Some(g) = self.grad_of(p.norm)? {
            g.iter_mut().zip(&gw).for_each(|(v, d)| *v += *d as f32);
        }
        Ok(())
    }
}
