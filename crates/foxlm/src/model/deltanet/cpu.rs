//! The DeltaNet family's operations on the CPU backend (f32, the reference): `fox_kernels`'
//! L2 norm and chunked delta rule (with its decode step) on the layer's buffers.

use super::ops::{DeltaNetOps, DeltaNetParams, DeltaRuleGradsOf, DeltaRuleIn};
use super::state::DeltaNetState;
use crate::backend::cpu::{Cpu, CpuBatch};
use crate::backend::scan_state::{chunks_from, forward_carrying, Carry};
use crate::backend::Family;
use anyhow::{ensure, Result};
use fox_kernels::delta_rule::{self as dr, DeltaRule, DeltaRuleGrads};
use fox_kernels::scalar::{sigmoid, silu};
use fox_kernels::ssd;

/// fla's l2norm epsilon (inside the square root).
pub const L2NORM_EPS: f32 = 1e-6;

/// The delta-rule problem over the layer's buffers.
fn problem<'a>(p: &DeltaNetParams, b: &'a CpuBatch, x: DeltaRuleIn<'a, Vec<f32>, Vec<f32>>) -> DeltaRule<'a> {
    let s = &p.sizes;
    DeltaRule {
        batch: b.batch,
        seq: b.seq,
        heads: s.heads,
        k_dim: s.head_k,
        v_dim: s.head_v,
        q: x.q,
        k: x.k,
        v: x.v,
        beta: x.beta,
        g: x.g.map(|g| &g[..]),
        scale: 1.0 / (s.head_k as f32).sqrt(),
        start: b.pads(),
    }
}

impl DeltaNetOps for Cpu<'_> {
    fn l2norm_fwd(
        &mut self,
        y: &mut Vec<f32>,
        rstd: &mut Vec<f32>,
        x: &Vec<f32>,
        rows: usize,
        dim: usize,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let n = crate::backend::cpu::first("L2 norm", rows.checked_mul(dim), &[y.len(), x.len()])?;
        anyhow::ensure!(rstd.len() >= rows, "L2 norm: {rows} rows, rstd holds {}", rstd.len());
        dr::l2norm_fwd(&mut y[..n], &mut rstd[..rows], &x[..n], dim, L2NORM_EPS)
    }

    fn l2norm_bwd(
        &mut self,
        dx: &mut Vec<f32>,
        dy: &Vec<f32>,
        y: &Vec<f32>,
        rstd: &Vec<f32>,
        dim: usize,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        dr::l2norm_bwd(dx, dy, y, rstd, dim)
    }

    fn deltanet_decay_fwd(&mut self, g: &mut Vec<f32>, a: &Vec<f32>, p: &DeltaNetParams, rows: usize) -> Result<()> {
        let _t = self.time(Family::Other);
        let h = p.sizes.heads;
        let (a_log, bias) = p.decay()?;
        let neg_a = self.neg_exp(a_log);
        let n = crate::backend::cpu::first("decay", rows.checked_mul(h), &[g.len(), a.len()])?;
        let g = &mut g[..n];
        ssd::dt_fwd(g, &a[..n], h, &self.params[bias])?;
        for row in g.chunks_mut(h) {
            row.iter_mut().zip(&neg_a).for_each(|(v, a)| *v *= a);
        }
        Ok(())
    }

    fn deltanet_decay_bwd(&mut self, da: &mut Vec<f32>, dg: &Vec<f32>, a: &Vec<f32>, p: &DeltaNetParams) -> Result<()> {
        let _t = self.time(Family::Other);
        let h = p.sizes.heads;
        let (a_log, bias) = p.decay()?;
        let neg_a = self.neg_exp(a_log);
        // g = A·dt with dt = softplus(a + dt_bias), A = −exp(A_log): d dt = dg·A,
        // dA = Σ dg·dt, dA_log = dA·A.
        let mut dt = vec![0.0; dg.len()];
        ssd::dt_fwd(&mut dt, a, h, &self.params[bias])?;
        let mut grad_a = vec![0.0f32; h];
        let mut ddt = vec![0.0; dg.len()];
        for ((dgr, dtr), ddr) in dg.chunks(h).zip(dt.chunks(h)).zip(ddt.chunks_mut(h)) {
            for j in 0..h {
                grad_a[j] += dgr[j] * dtr[j];
                ddr[j] = dgr[j] * neg_a[j];
            }
        }
        let mut dbias = vec![0.0; h];
        let bias_v = self.params[bias].to_vec();
        ssd::dt_bwd(da, h, &mut dbias, &ddt, a, &bias_v)?;
        self.add_a_log_grad(a_log, &grad_a, &neg_a)?;
        self.add_grad(bias, &dbias)
    }

    fn delta_rule_fwd(
        &mut self,
        o: &mut Vec<f32>,
        x: DeltaRuleIn<'_, Vec<f32>, Vec<f32>>,
        p: &DeltaNetParams,
        b: &CpuBatch,
        state: Option<&mut DeltaNetState>,
    ) -> Result<()> {
        let _t = self.time(Family::Attention);
        let prob = problem(p, b, x);
        forward_carrying(state, b.batch, b.seq, |carry| match carry {
            Carry::Zeros => dr::delta_rule_fwd(&prob, o, None, None),
            Carry::Step(st) => dr::delta_rule_decode_step(&prob, &mut st.ssm, o),
            Carry::Chunks(st) => {
                chunks_from(&mut st.ssm, |from, to| dr::delta_rule_fwd(&prob, o, Some(from), Some(to)))
            }
        })
    }

    fn delta_rule_bwd(
        &mut self,
        grads: DeltaRuleGradsOf<'_, Vec<f32>, Vec<f32>>,
        dout: &Vec<f32>,
        x: DeltaRuleIn<'_, Vec<f32>, Vec<f32>>,
        p: &DeltaNetParams,
        b: &CpuBatch,
    ) -> Result<()> {
        let _t = self.time(Family::Attention);
        let prob = problem(p, b, x);
        let DeltaRuleGradsOf { dq, dk, dv, dbeta, dg } = grads;
        let out = DeltaRuleGrads { dq, dk, dv, dbeta, dg: dg.map(|d| &mut d[..]), dinit: None };
        dr::delta_rule_bwd(&prob, dout, None, None, out)
    }

    fn swish_gate_fwd(&mut self, y: &mut Vec<f32>, x: &Vec<f32>, gate: &Vec<f32>, n: usize) -> Result<()> {
        let _t = self.time(Family::Other);
        let n = crate::backend::cpu::first("swish gate", Some(n), &[y.len(), x.len(), gate.len()])?;
        y[..n].iter_mut().zip(x).zip(gate).for_each(|((y, x), g)| *y = x * silu(*g));
        Ok(())
    }

    fn swish_gate_bwd(
        &mut self,
        dx: &mut Vec<f32>,
        dgate: &mut Vec<f32>,
        dy: &Vec<f32>,
        x: &Vec<f32>,
        gate: &Vec<f32>,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let n = x.len();
        ensure!(dx.len() == n && dgate.len() == n && dy.len() == n && gate.len() == n, "swish gate: lengths differ");
        for i in 0..n {
            let s = sigmoid(gate[i]);
            dx[i] = dy[i] * gate[i] * s;
            // d silu(g)/dg = σ(g)(1 + g(1 − σ(g))).
            dgate[i] = dy[i] * x[i] * s * (1.0 + gate[i] * (1.0 - s));
        }
        Ok(())
    }
}
