//! The DeltaNet family's operations on the CUDA backend: `fox_kernels::cuda::delta_rule`'s
//! kernels (activations in T; g, the states and the parameters' gradients in f32). Its short
//! convolutions are the backend's (`short_conv_*`), its state on the device a
//! [`GpuDeltaNetState`].

use super::ops::{DeltaNetOps, DeltaNetParams, DeltaRuleGradsOf, DeltaRuleIn};
pub use super::state::GpuDeltaNetState;
use crate::backend::cuda::recurrent::two_mut;
use crate::backend::cuda::{grown, Cuda, GpuBatch};
use crate::backend::scan_state::{forward_carrying, Carry};
use crate::backend::Family;
use crate::config::DeltaNetSizes;
use crate::model::{Mixer, Model};
use anyhow::Result;
use fox_kernels::cuda::cudarc::driver::CudaSlice;
use fox_kernels::cuda::delta_rule::{self as dr, DevDeltaRule, DevDeltaRuleGrads};
use fox_kernels::cuda::ssd::CONV_WIDTHS;
use fox_kernels::cuda::Elem;

/// Why the GPU kernels cannot run a DeltaNet layer of these sizes, if they cannot.
pub fn unsupported(s: &DeltaNetSizes) -> Option<String> {
    let ok = dr::supported(s.head_k, s.head_v) && CONV_WIDTHS.contains(&s.conv);
    (!ok).then(|| {
        format!(
            "{}: the GPU's DeltaNet kernels take a key head dim ≤ {} and conv_size ≤ 8 (this model: {}, {}); run it \
             with --device cpu",
            if s.gated { "Gated DeltaNet" } else { "DeltaNet" },
            dr::MAX_K,
            s.head_k,
            s.conv
        )
    })
}

/// The backend's recurrent scratch (`big`, `small` in f32 elements) raised to what the model's
/// DeltaNet layers need for a step of [batch, seq] with activations of `elem_bytes` (training
/// when `train`): the delta rule's chunk buffers, the convolutions' and the decay's partial sums.
pub(crate) fn scratch_floats(
    model: &Model,
    batch: usize,
    seq: usize,
    train: bool,
    elem_bytes: usize,
    (big, small): (usize, usize),
) -> (usize, usize) {
    let mut out = (big, small);
    for blk in &model.layers {
        if let Mixer::DeltaNet(l) = &blk.mixer {
            let s = l.sizes();
            let (h, k, v) = (s.heads, s.head_k, s.head_v);
            let chunk = if elem_bytes == 2 {
                if train {
                    dr::bwd_scratch_len::<half::bf16>(batch, seq, h, k, v)
                } else {
                    dr::fwd_scratch_len::<half::bf16>(batch, seq, h, k, v)
                }
            } else if train {
                dr::bwd_scratch_len::<f32>(batch, seq, h, k, v)
            } else {
                dr::fwd_scratch_len::<f32>(batch, seq, h, k, v)
            };
            let partial = if train {
                let conv =
                    fox_kernels::cuda::ssd::conv1d_bwd_scratch_len(batch, seq, s.key_dim().max(s.value_dim()), s.conv);
                conv.max(dr::decay_bwd_scratch_len(batch * seq, h))
            } else {
                0
            };
            out = (out.0.max(chunk), out.1.max(partial));
        }
    }
    out
}

/// The delta-rule problem over the layer's buffers.
fn problem<'a, T: Elem>(
    p: &DeltaNetParams,
    b: &'a GpuBatch,
    x: DeltaRuleIn<'a, CudaSlice<T>, CudaSlice<f32>>,
) -> DevDeltaRule<'a, T> {
    let s = &p.sizes;
    let DeltaRuleIn { q, k, v, beta, g } = x;
    DevDeltaRule {
        batch: b.batch,
        seq: b.seq,
        heads: s.heads,
        k_dim: s.head_k,
        v_dim: s.head_v,
        q,
        k,
        v,
        beta,
        g,
        scale: 1.0 / (s.head_k as f32).sqrt(),
        start: b.chunk_start(),
    }
}

impl<T: Elem> DeltaNetOps for Cuda<T> {
    fn l2norm_fwd(
        &mut self,
        y: &mut CudaSlice<T>,
        rstd: &mut CudaSlice<f32>,
        x: &CudaSlice<T>,
        rows: usize,
        dim: usize,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        dr::l2norm_fwd(&self.gpu, y, rstd, x, rows, dim)
    }

    fn l2norm_bwd(
        &mut self,
        dx: &mut CudaSlice<T>,
        dy: &CudaSlice<T>,
        y: &CudaSlice<T>,
        rstd: &CudaSlice<f32>,
        dim: usize,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        dr::l2norm_bwd(&self.gpu, dx, dy, y, rstd, y.len() / dim.max(1), dim)
    }

    fn deltanet_decay_fwd(
        &mut self,
        g: &mut CudaSlice<f32>,
        a: &CudaSlice<T>,
        p: &DeltaNetParams,
        rows: usize,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let (a_log, bias) = p.decay()?;
        dr::decay_fwd(&self.gpu, g, a, &self.params[a_log.0].master, &self.params[bias.0].master, rows)
    }

    fn deltanet_decay_bwd(
        &mut self,
        da: &mut CudaSlice<T>,
        dg: &CudaSlice<f32>,
        a: &CudaSlice<T>,
        p: &DeltaNetParams,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let (a_log, bias) = p.decay()?;
        let h = p.sizes.heads;
        let rows = a.len() / h;
        let scratch = grown(&self.gpu, &mut self.ssm.small, dr::decay_bwd_scratch_len(rows, h))?;
        let (pa, pb) = two_mut(&mut self.params, a_log.0, bias.0)?;
        dr::decay_bwd(&self.gpu, da, &mut pa.grad, &mut pb.grad, scratch, dg, a, &pa.master, &pb.master, rows)
    }

    fn delta_rule_fwd(
        &mut self,
        o: &mut CudaSlice<T>,
        x: DeltaRuleIn<'_, CudaSlice<T>, CudaSlice<f32>>,
        p: &DeltaNetParams,
        b: &GpuBatch,
        state: Option<&mut GpuDeltaNetState>,
    ) -> Result<()> {
        self.mark(Family::Attention)?;
        let s = &p.sizes;
        let prob = problem(p, b, x);
        let len = dr::fwd_scratch_len::<T>(b.batch, b.seq, s.heads, s.head_k, s.head_v);
        let gpu = &self.gpu;
        forward_carrying(state, b.batch, b.seq, |carry| match carry {
            Carry::Step(st) => dr::delta_rule_decode_step(gpu, &prob, &mut st.ssm, o),
            Carry::Zeros => dr::delta_rule_fwd(gpu, &prob, o, None, grown(gpu, &mut self.ssm.big, len)?),
            Carry::Chunks(st) => {
                dr::delta_rule_fwd(gpu, &prob, o, Some(&mut st.ssm), grown(gpu, &mut self.ssm.big, len)?)
            }
        })
    }

    fn delta_rule_bwd(
        &mut self,
        grads: DeltaRuleGradsOf<'_, CudaSlice<T>, CudaSlice<f32>>,
        dout: &CudaSlice<T>,
        x: DeltaRuleIn<'_, CudaSlice<T>, CudaSlice<f32>>,
        p: &DeltaNetParams,
        b: &GpuBatch,
    ) -> Result<()> {
        self.mark(Family::Attention)?;
        let s = &p.sizes;
        let prob = problem(p, b, x);
        let len = dr::bwd_scratch_len::<T>(b.batch, b.seq, s.heads, s.head_k, s.head_v);
        let scratch = grown(&self.gpu, &mut self.ssm.big, len)?;
        let DeltaRuleGradsOf { dq, dk, dv, dbeta, dg } = grads;
        let out = DevDeltaRuleGrads { dq, dk, dv, dbeta, dg, dinit: None };
        dr::delta_rule_bwd(&self.gpu, &prob, dout, None, None, out, scratch)
    }

    fn swish_gate_fwd(&mut self, y: &mut CudaSlice<T>, x: &CudaSlice<T>, gate: &CudaSlice<T>, n: usize) -> Result<()> {
        self.mark(Family::Other)?;
        dr::swish_gate_fwd(&self.gpu, y, x, gate, n)
    }

    fn swish_gate_bwd(
        &mut self,
        dx: &mut CudaSlice<T>,
        dgate: &mut CudaSlice<T>,
        dy: &CudaSlice<T>,
        x: &CudaSlice<T>,
        gate: &CudaSlice<T>,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        dr::swish_gate_bwd(&self.gpu, dx, dgate, dy, x, gate, x.len())
    }
}
