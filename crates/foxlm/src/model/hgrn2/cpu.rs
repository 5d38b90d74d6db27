//! The HGRN2 family's operations on the CPU backend (f32, the reference): the gates and the
//! lower bounds elementwise here, `fox_kernels`' chunked GLA (with its decode step) on the
//! layer's buffers.

use super::ops::{GlaGradsOf, GlaIn, Hgrn2GateGradsOf, Hgrn2GatesOf, Hgrn2Ops, Hgrn2Params};
use super::state::Hgrn2State;
use crate::backend::cpu::{Cpu, CpuBatch};
use crate::backend::scan_state::{chunks_from, forward_carrying, Carry};
use crate::backend::Family;
use crate::tensor::ParamId;
use anyhow::{ensure, Result};
use fox_kernels::gla::{self, Gla, GlaGrads};
use fox_kernels::scalar::{log_sigmoid, sigmoid, silu};

/// The GLA problem over the layer's buffers.
fn problem<'a>(p: &Hgrn2Params, b: &'a CpuBatch, x: GlaIn<'a, Vec<f32>>) -> Gla<'a> {
    let s = &p.sizes;
    Gla {
        batch: b.batch,
        seq: b.seq,
        heads: s.heads,
        k_dim: s.head_dim,
        v_dim: s.head_dim,
        q: x.q,
        k: x.k,
        v: x.v,
        g: x.g,
        scale: 1.0 / (s.head_dim as f32).sqrt(),
        start: b.pads(),
    }
}

/// The softmax over layers of `raw` [L, d] (f64), per column.
fn softmax_over_layers(raw: &[f32], layers: usize) -> Result<Vec<f64>> {
    ensure!(layers > 0 && raw.len().is_multiple_of(layers), "lower_bounds: {} values for {layers} layers", raw.len());
    let d = raw.len() / layers;
    let mut p = vec![0.0f64; raw.len()];
    for c in 0..d {
        let m = (0..layers).map(|l| raw[l * d + c] as f64).fold(f64::NEG_INFINITY, f64::max);
        let mut z = 0.0;
        for l in 0..layers {
            let e = (raw[l * d + c] as f64 - m).exp();
            p[l * d + c] = e;
            z += e;
        }
        (0..layers).for_each(|l| p[l * d + c] /= z);
    }
    Ok(p)
}

impl Cpu<'_> {
    /// The layer's row of the lower bounds, when the layer is bounded.
    fn hgrn2_lb_row<'b>(lb: &'b [f32], p: &Hgrn2Params, d: usize) -> Result<Option<&'b [f32]>> {
        if !p.bounded() {
            return Ok(None);
        }
        let row = lb.get(p.layer * d..(p.layer + 1) * d);
        ensure!(
            row.is_some(),
            "HGRN2 layer {}: the lower bounds hold {} values, not a row {d} wide",
            p.layer,
            lb.len()
        );
        Ok(row)
    }
}

impl Hgrn2Ops for Cpu<'_> {
    fn hgrn2_lower_bounds_fwd(&mut self, lb: &mut Vec<f32>, lower_bounds: ParamId, layers: usize) -> Result<()> {
        let _t = self.time(Family::Other);
        let raw = &self.params[lower_bounds];
        ensure!(lb.len() == raw.len(), "lower bounds: a buffer of {} values for {} parameters", lb.len(), raw.len());
        let p = softmax_over_layers(raw, layers)?;
        let d = raw.len() / layers;
        for c in 0..d {
            let mut sum = 0.0f64;
            lb[c] = 0.0;
            for l in 1..layers {
                sum += p[l * d + c];
                lb[l * d + c] = sum as f32;
            }
        }
        Ok(())
    }

    fn hgrn2_lower_bounds_bwd(&mut self, dlb: &Vec<f32>, lower_bounds: ParamId, layers: usize) -> Result<()> {
        let _t = self.time(Family::Other);
        let raw = &self.params[lower_bounds];
        ensure!(
            dlb.len() == raw.len(),
            "lower bounds: a gradient of {} values for {} parameters",
            dlb.len(),
            raw.len()
        );
        let p = softmax_over_layers(raw, layers)?;
        let d = raw.len() / layers;
        let mut grad = vec![0.0f32; raw.len()];
        for c in 0..d {
            // lb_l = Σ_{1 ≤ j ≤ l} p_j: dp_j = Σ_{l ≥ j} dlb_l for j ≥ 1, dp_0 = 0; then the
            // softmax's backward, draw_j = p_j (dp_j − Σ_i p_i dp_i).
            let mut dp = vec![0.0f64; layers];
            let mut suffix = 0.0f64;
            for j in (1..layers).rev() {
                suffix += dlb[j * d + c] as f64;
                dp[j] = suffix;
            }
            let dot: f64 = (0..layers).map(|j| p[j * d + c] * dp[j]).sum();
            for j in 0..layers {
                grad[j * d + c] = (p[j * d + c] * (dp[j] - dot)) as f32;
            }
        }
        self.add_grad(lower_bounds, &grad)
    }

    fn hgrn2_gates_fwd(
        &mut self,
        q: &mut Vec<f32>,
        k: &mut Vec<f32>,
        g: &mut Vec<f32>,
        q_in: &Vec<f32>,
        f: &Vec<f32>,
        lb: &Vec<f32>,
        p: &Hgrn2Params,
        rows: usize,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let d = p.sizes.heads * p.sizes.head_dim;
        let n = crate::backend::cpu::first(
            "HGRN2 gates",
            rows.checked_mul(d),
            &[q.len(), k.len(), g.len(), q_in.len(), f.len()],
        )?;
        let (q, k, g, q_in, f) = (&mut q[..n], &mut k[..n], &mut g[..n], &q_in[..n], &f[..n]);
        q.iter_mut().zip(q_in).for_each(|(q, x)| *q = silu(*x));
        let row = Self::hgrn2_lb_row(lb, p, d)?;
        for ((gr, kr), fr) in g.chunks_mut(d).zip(k.chunks_mut(d)).zip(f.chunks(d)) {
            for c in 0..d {
                let ls = log_sigmoid(fr[c]);
                let gv = match row {
                    None => ls,
                    Some(lb) => {
                        // logaddexp(ln lb, ln(1 − lb) + ls), as fla computes it
                        let (a, b) = (lb[c].ln(), (-lb[c]).ln_1p() + ls);
                        a.max(b) + (-(a - b).abs()).exp().ln_1p()
                    }
                };
                gr[c] = gv;
                kr[c] = -gv.exp_m1();
            }
        }
        Ok(())
    }

    fn hgrn2_gates_bwd(
        &mut self,
        grads: Hgrn2GateGradsOf<'_, Vec<f32>, Vec<f32>>,
        x: Hgrn2GatesOf<'_, Vec<f32>, Vec<f32>>,
        p: &Hgrn2Params,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let Hgrn2GateGradsOf { dq_in, df, dlb, dq, dk, dg } = grads;
        let d = p.sizes.heads * p.sizes.head_dim;
        let n = x.f.len();
        for (what, len) in
            [("dq_in", dq_in.len()), ("df", df.len()), ("dq", dq.len()), ("dk", dk.len()), ("dg", dg.len())]
        {
            ensure!(len == n, "HGRN2 gates backward: {what} has {len} values, not {n}");
        }
        for i in 0..n {
            let (xq, s) = (x.q_in[i], sigmoid(x.q_in[i]));
            // d silu(x)/dx = σ(x)(1 + x(1 − σ(x))).
            dq_in[i] = dq[i] * s * (1.0 + xq * (1.0 - s));
        }
        let row = Self::hgrn2_lb_row(x.lb, p, d)?;
        let mut dlb_row = vec![0.0f64; if row.is_some() { d } else { 0 }];
        for i in 0..n {
            let c = i % d;
            let (f, g) = (x.f[i], x.g[i]);
            // k = 1 − exp(g): the gate's total gradient.
            let dgt = dg[i] - dk[i] * g.exp();
            let s = sigmoid(f);
            df[i] = match row {
                // g = logsigmoid(f): dg/df = 1 − σ(f).
                None => dgt * (1.0 - s),
                // g = ln(lb + (1 − lb)σ(f)): dg/df = (1 − lb)σ(1 − σ)/e^g, dg/dlb = (1 − σ)/e^g.
                Some(lb) => {
                    let inv = (-g).exp();
                    dlb_row[c] += (dgt * (1.0 - s) * inv) as f64;
                    dgt * (1.0 - lb[c]) * s * (1.0 - s) * inv
                }
            };
        }
        if row.is_some() {
            let dst = dlb.get_mut(p.layer * d..(p.layer + 1) * d);
            let Some(dst) = dst else {
                anyhow::bail!("HGRN2 layer {}: the lower bounds' gradient has no row {d} wide for it", p.layer)
            };
            dst.iter_mut().zip(&dlb_row).for_each(|(a, b)| *a = *b as f32);
        }
        Ok(())
    }

    fn hgrn2_gla_fwd(
        &mut self,
        o: &mut Vec<f32>,
        x: GlaIn<'_, Vec<f32>>,
        p: &Hgrn2Params,
        b: &CpuBatch,
        state: Option<&mut Hgrn2State>,
    ) -> Result<()> {
        let _t = self.time(Family::Attention);
        let prob = problem(p, b, x);
        forward_carrying(state, b.batch, b.seq, |carry| match carry {
            Carry::Zeros => gla::gla_fwd(&prob, o, None, None),
            Carry::Step(st) => gla::gla_decode_step(&prob, &mut st.ssm, o),
            Carry::Chunks(st) => chunks_from(&mut st.ssm, |from, to| gla::gla_fwd(&prob, o, Some(from), Some(to))),
        })
    }

    fn hgrn2_gla_bwd(
        &mut self,
        grads: GlaGradsOf<'_, Vec<f32>>,
        dout: &Vec<f32>,
        x: GlaIn<'_, Vec<f32>>,
        p: &Hgrn2Params,
        b: &CpuBatch,
    ) -> Result<()> {
        let _t = self.time(Family::Attention);
        let prob = problem(p, b, x);
        let GlaGradsOf { dq, dk, dv, dg } = grads;
        gla::gla_bwd(&prob, dout, None, None, GlaGrads { dq, dk, dv, dg, dinit: None })
    }
}
