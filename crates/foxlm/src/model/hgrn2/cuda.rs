//! The HGRN2 family's operations on the CUDA backend: `fox_kernels::cuda::gla`'s kernels (the
//! gated linear attention, on tensor cores for bf16 activations; its decode step, the gates and
//! the lower bounds). Activations in T; the GLA state, the lower bounds and every sum in f32.
//! Its short convolutions are the backend's (`short_conv_*`, without bias or SiLU, as fla's
//! ShortConvolution in HGRN2), its state on the device a [`GpuHgrn2State`].

use super::ops::{GlaGradsOf, GlaIn, Hgrn2GateGradsOf, Hgrn2GatesOf, Hgrn2Ops, Hgrn2Params};
pub use super::state::GpuHgrn2State;
use crate::backend::cuda::{grown, Cuda, GpuBatch};
use crate::backend::scan_state::{forward_carrying, Carry};
use crate::backend::Family;
use crate::config::Hgrn2Sizes;
use crate::tensor::ParamId;
use anyhow::{ensure, Result};
use fox_kernels::cuda::cudarc::driver::CudaSlice;
use fox_kernels::cuda::gla::{self, DevGla, DevGlaGrads, GateInputs};
use fox_kernels::cuda::ssd::CONV_WIDTHS;
use fox_kernels::cuda::Elem;

/// Why the CUDA kernels cannot run an HGRN2 layer of these sizes, if they cannot.
pub fn unsupported(s: &Hgrn2Sizes) -> Option<String> {
    let ok = s.head_dim <= gla::DECODE_KMAX && s.conv.is_none_or(|w| CONV_WIDTHS.contains(&w));
    (!ok).then(|| {
        format!(
            "HGRN2: the GPU's kernels take head widths (expand_ratio) ≤ {} and conv_size ≤ 8 (this model: {}, {:?}); \
             run it with --device cpu",
            gla::DECODE_KMAX,
            s.head_dim,
            s.conv
        )
    })
}

/// The GLA problem over the layer's buffers (heads of K = V = the head width, scale K^−½).
fn problem<'a, T: Elem>(p: &Hgrn2Params, b: &'a GpuBatch, x: GlaIn<'a, CudaSlice<T>>) -> DevGla<'a, T> {
    let s = &p.sizes;
    let GlaIn { q, k, v, g } = x;
    DevGla {
        batch: b.batch,
        seq: b.seq,
        heads: s.heads,
        k_dim: s.head_dim,
        v_dim: s.head_dim,
        q,
        k,
        v,
        g,
        scale: 1.0 / (s.head_dim as f32).sqrt(),
        start: b.chunk_start(),
        tensor_cores: None,
        walk: None,
        scores_tc: None,
    }
}

/// The layer's row of the lower bounds (its first element), in a bounded layer.
fn lb_row(p: &Hgrn2Params, lb: &CudaSlice<f32>) -> Result<Option<usize>> {
    if !p.bounded() {
        return Ok(None);
    }
    let d = p.sizes.heads * p.sizes.head_dim;
    ensure!(
        lb.len() >= (p.layer + 1) * d,
        "HGRN2 layer {}: the lower bounds hold {} values, not a row {d} wide for it",
        p.layer,
        lb.len()
    );
    Ok(Some(p.layer * d))
}

impl<T: Elem> Hgrn2Ops for Cuda<T> {
    fn hgrn2_lower_bounds_fwd(&mut self, lb: &mut CudaSlice<f32>, lower_bounds: ParamId, layers: usize) -> Result<()> {
        self.mark(Family::Other)?;
        gla::hgrn2_lower_bounds_fwd(&self.gpu, lb, &self.params[lower_bounds.0].master, layers)
    }

    fn hgrn2_lower_bounds_bwd(&mut self, dlb: &CudaSlice<f32>, lower_bounds: ParamId, layers: usize) -> Result<()> {
        self.mark(Family::Other)?;
        let pr = &mut self.params[lower_bounds.0];
        gla::hgrn2_lower_bounds_bwd(&self.gpu, &mut pr.grad, dlb, &pr.master, layers)
    }

    fn hgrn2_gates_fwd(
        &mut self,
        q: &mut CudaSlice<T>,
        k: &mut CudaSlice<T>,
        g: &mut CudaSlice<T>,
        q_in: &CudaSlice<T>,
        f: &CudaSlice<T>,
        lb: &CudaSlice<f32>,
        p: &Hgrn2Params,
        rows: usize,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let d = p.sizes.heads * p.sizes.head_dim;
        let n = rows * d;
        let row = lb_row(p, lb)?.map(|at| (lb, at));
        gla::hgrn2_gates_fwd(&self.gpu, q, k, g, q_in, f, row, n, d)
    }

    fn hgrn2_gates_bwd(
        &mut self,
        grads: Hgrn2GateGradsOf<'_, CudaSlice<T>, CudaSlice<f32>>,
        x: Hgrn2GatesOf<'_, CudaSlice<T>, CudaSlice<f32>>,
        p: &Hgrn2Params,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let Hgrn2GateGradsOf { dq_in, df, dlb, dq, dk, dg } = grads;
        let d = p.sizes.heads * p.sizes.head_dim;
        let rows = x.f.len() / d;
        let at = lb_row(p, x.lb)?;
        if let Some(a) = at {
            ensure!(dlb.len() >= a + d, "HGRN2 layer {}: the lower bounds' gradient has no row for it", p.layer);
        }
        let scratch = grown(&self.gpu, &mut self.ssm.small, gla::hgrn2_gates_bwd_scratch_len(rows, d))?;
        let inputs = GateInputs { dq, dk, dg, q_in: x.q_in, f: x.f, g: x.g };
        let lb = at.map(|a| (x.lb, a));
        let dlb = at.map(|a| (dlb, a));
        gla::hgrn2_gates_bwd(&self.gpu, dq_in, df, inputs, lb, dlb, scratch, rows, d)
    }

    fn hgrn2_gla_fwd(
        &mut self,
        o: &mut CudaSlice<T>,
        x: GlaIn<'_, CudaSlice<T>>,
        p: &Hgrn2Params,
        b: &GpuBatch,
        state: Option<&mut GpuHgrn2State>,
    ) -> Result<()> {
        self.mark(Family::Attention)?;
        let s = &p.sizes;
        let prob = problem(p, b, x);
        let len = gla::gla_fwd_scratch_len(b.batch, b.seq, s.heads, s.head_dim, s.head_dim);
        let gpu = &self.gpu;
        forward_carrying(state, b.batch, b.seq, |carry| match carry {
            Carry::Step(st) => gla::gla_decode_step(gpu, &prob, &mut st.ssm, o),
            Carry::Zeros => gla::gla_fwd(gpu, &prob, o, None, None, grown(gpu, &mut self.ssm.big, len)?),
            Carry::Chunks(st) => {
                gla::gla_fwd_continuing(gpu, &prob, o, &mut st.ssm, grown(gpu, &mut self.ssm.big, len)?)
            }
        })
    }

    fn hgrn2_gla_bwd(
        &mut self,
        grads: GlaGradsOf<'_, CudaSlice<T>>,
        dout: &CudaSlice<T>,
        x: GlaIn<'_, CudaSlice<T>>,
        p: &Hgrn2Params,
        b: &GpuBatch,
    ) -> Result<()> {
        self.mark(Family::Attention)?;
        let s = &p.sizes;
        let prob = problem(p, b, x);
        let len = gla::gla_bwd_scratch_len(b.batch, b.seq, s.heads, s.head_dim, s.head_dim);
        let scratch = grown(&self.gpu, &mut self.ssm.big, len)?;
        let GlaGradsOf { dq, dk, dv, dg } = grads;
        gla::gla_bwd(&self.gpu, &prob, dout, None, None, DevGlaGrads { dq, dk, dv, dg, dinit: None }, scratch)
    }
}
