//! The Mamba-2 family's operations on the CUDA backend: `fox_kernels::cuda::ssd`'s kernels
//! (activations in T, dt, A, D and states in f32; parameters' f32 weights, the convolution's from
//! its T working copy as the GEMMs read theirs). Its short convolution is the backend's
//! (`short_conv_*`) but in a decode step's fused inputs; its state on the device a
//! [`GpuMamba2State`].

use super::ops::{Mamba2Ops, Mamba2Params, SsdIn};
pub use super::state::GpuMamba2State;
use crate::backend::cuda::recurrent::two_mut;
use crate::backend::cuda::{grown, Cuda, GpuBatch};
use crate::backend::scan_state::{forward_carrying, gpu_chunks_from, Carry};
use crate::backend::Family;
use crate::config::Mamba2Sizes;
use crate::model::Linear;
use anyhow::{anyhow, ensure, Result};
use fox_kernels::cuda::cudarc::driver::CudaSlice;
use fox_kernels::cuda::ops;
use fox_kernels::cuda::ssd::CONV_WIDTHS;
use fox_kernels::cuda::ssd::{self, DevSsd, DevSsdGrads};
use fox_kernels::cuda::Elem;

/// Why the GPU kernels cannot run a Mamba-2 layer of these sizes, if they cannot.
pub fn unsupported(s: &Mamba2Sizes) -> Option<String> {
    let ok = s.head_dim <= 64 && s.state <= 128 && CONV_WIDTHS.contains(&s.conv) && s.groups == 1;
    (!ok).then(|| {
        format!(
            "the GPU's Mamba-2 kernels take head_dim ≤ 64, state_size ≤ 128, conv_kernel ≤ 8 and n_groups = 1 (this \
             model: {}, {}, {}, {}); run it with --device cpu",
            s.head_dim, s.state, s.conv, s.groups
        )
    })
}

/// The SSD problem over the conv output, with A (or A_log, for a decode step's kernel) and D.
fn problem<'a, T: Elem>(
    s: &Mamba2Sizes,
    b: &'a GpuBatch,
    x: SsdIn<'a, CudaSlice<T>, CudaSlice<f32>>,
    a: &'a CudaSlice<f32>,
    d: &'a CudaSlice<f32>,
) -> DevSsd<'a, T> {
    DevSsd {
        batch: b.batch,
        seq: b.seq,
        heads: s.heads,
        head_dim: s.head_dim,
        state: s.state,
        groups: s.groups,
        xbc: x.xbc,
        xbc_stride: s.conv_dim(),
        dt: x.dt,
        a,
        d,
        start: b.chunk_start(),
    }
}

/// The gated RMSNorm's row width on the GPU, which takes one group: each row of zxbcdt holds G
/// groups of z, and as rows of `dim` with stride in_proj_dim, group by group, the groups' rows are
/// not evenly strided unless G = 1.
fn gated_norm_dim(s: &Mamba2Sizes) -> Result<usize> {
    ensure!(s.groups == 1, "the GPU gated RMSNorm takes one group (n_groups = 1), not {}", s.groups);
    Ok(s.inner / s.groups)
}

impl<T: Elem> Mamba2Ops for Cuda<T> {
    fn mamba2_step_in(
        &mut self,
        zxbcdt: &mut CudaSlice<T>,
        xbc: &mut CudaSlice<T>,
        dt: &mut CudaSlice<f32>,
        x: &CudaSlice<T>,
        in_proj: &Linear,
        p: &Mamba2Params,
        b: &GpuBatch,
        st: &mut GpuMamba2State,
    ) -> Result<()> {
        ensure!(
            st.batch == b.batch && b.seq == 1,
            "a Mamba-2 decode step of {} × {} on a state of {} rows",
            b.batch,
            b.seq,
            st.batch
        );
        let (s, c) = (p.sizes, p.short_conv());
        let d = ssd::DecodeInputs {
            batch: b.batch,
            stride: c.stride,
            conv_off: c.offset,
            channels: c.channels,
            width: c.width,
            dt_off: s.dt_offset(),
            heads: s.heads,
        };
        // In one pass with the GEMV where a decode step's rows take it; else in_proj, then the
        // inputs in one launch.
        let gemv = self.gemv && ops::gemv_fits::<T>(b.batch, in_proj.in_features);
        if gemv {
            self.mark(Family::Gemm)?;
        } else {
            self.linear_into(zxbcdt, x, in_proj, b.batch)?;
            self.mark(Family::Other)?;
        }
        let conv_w = self.copy_of(c.weight)?;
        let conv_b = c.bias.map(|id| &self.params[id.0].master);
        let dt_bias = &self.params[p.dt_bias.0].master;
        let prm = ssd::DecodeParams { conv_w, conv_b, dt_bias, start: b.chunk_start(), at: d };
        let out = ssd::DecodeInputsOut { xbc, conv_state: &mut st.conv[c.slot], dt };
        if gemv {
            let w = self.copy_of(in_proj.weight)?;
            return ops::gemv_step_in(&self.gpu, zxbcdt, x, w, in_proj.in_features, out, prm);
        }
        ssd::decode_inputs(&self.gpu, out, zxbcdt, prm)
    }

    fn mamba2_dt_fwd(
        &mut self,
        dt: &mut CudaSlice<f32>,
        zxbcdt: &CudaSlice<T>,
        p: &Mamba2Params,
        rows: usize,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let s = p.sizes;
        let at = s.dt_offset();
        let raw = zxbcdt.slice(at..);
        ssd::dt_fwd(&self.gpu, dt, &raw, s.in_proj_dim(), &self.params[p.dt_bias.0].master, rows)
    }

    fn mamba2_dt_bwd(
        &mut self,
        dzxbcdt: &mut CudaSlice<T>,
        ddt: &CudaSlice<f32>,
        zxbcdt: &CudaSlice<T>,
        p: &Mamba2Params,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let s = p.sizes;
        let at = s.dt_offset();
        let rows = ddt.len() / s.heads;
        let scratch = grown(&self.gpu, &mut self.ssm.small, ssd::dt_bwd_scratch_len(rows, s.heads))?;
        let bias = &mut self.params[p.dt_bias.0];
        let raw = zxbcdt.slice(at..);
        ssd::dt_bwd(
            &self.gpu,
            &mut dzxbcdt.slice_mut(at..),
            &mut bias.grad,
            scratch,
            ddt,
            &raw,
            s.in_proj_dim(),
            &bias.master,
            rows,
        )
    }

    fn ssd_fwd(
        &mut self,
        y: &mut CudaSlice<T>,
        x: SsdIn<'_, CudaSlice<T>, CudaSlice<f32>>,
        p: &Mamba2Params,
        b: &GpuBatch,
        state: Option<&mut GpuMamba2State>,
    ) -> Result<()> {
        self.mark(Family::Attention)?;
        let s = p.sizes;
        // A decode step's kernel takes A = −exp(A_log) itself; the chunked forward reads A.
        let decode = state.is_some() && b.seq == 1;
        if !decode {
            self.neg_exp_a(p.a_log, s.heads)?;
        }
        let a =
            if decode { &self.params[p.a_log.0].master } else { self.ssm.a.as_ref().ok_or_else(|| anyhow!("A"))? };
        let prob = problem(&s, b, x, a, &self.params[p.d_skip.0].master);
        let len = ssd::ssd_fwd_scratch_len(b.batch, b.seq, s.heads, s.head_dim, s.state, s.groups);
        let gpu = &self.gpu;
        forward_carrying(state, b.batch, b.seq, |carry| match carry {
            Carry::Zeros => ssd::ssd_fwd(gpu, &prob, y, None, None, grown(gpu, &mut self.ssm.big, len)?),
            Carry::Step(st) => ssd::ssd_decode_step_a_log(gpu, &prob, &mut st.ssm, y),
            Carry::Chunks(st) => {
                let scratch = grown(gpu, &mut self.ssm.big, len)?;
                gpu_chunks_from(gpu, &mut self.ssm.next, &mut st.ssm, |from, to| {
                    ssd::ssd_fwd(gpu, &prob, y, Some(from), Some(to), scratch)
                })
            }
        })
    }

    fn ssd_bwd(
        &mut self,
        dxbc: &mut CudaSlice<T>,
        ddt: &mut CudaSlice<f32>,
        dy: &CudaSlice<T>,
        x: SsdIn<'_, CudaSlice<T>, CudaSlice<f32>>,
        p: &Mamba2Params,
        b: &GpuBatch,
    ) -> Result<()> {
        self.mark(Family::Attention)?;
        let s = p.sizes;
        let h = s.heads;
        self.neg_exp_a(p.a_log, h)?;
        self.zeroed_da(h)?;
        let a = self.ssm.a.as_ref().ok_or_else(|| anyhow!("A"))?;
        let da = self.ssm.da.as_mut().ok_or_else(|| anyhow!("dA"))?;
        let len = ssd::ssd_bwd_scratch_len(b.batch, b.seq, h, s.head_dim, s.state, s.groups);
        let scratch = grown(&self.gpu, &mut self.ssm.big, len)?;
        let (dp, _) = two_mut(&mut self.params, p.d_skip.0, p.a_log.0)?;
        let prob = problem(&s, b, x, a, &dp.master);
        let grads = DevSsdGrads { dxbc, ddt, da, dd: &mut dp.grad, dinit: None };
        ssd::ssd_bwd(&self.gpu, &prob, dy, None, None, grads, scratch)?;
        self.add_a_log_grad(p.a_log, h)
    }

    fn gated_norm_fwd(
        &mut self,
        g: &mut CudaSlice<T>,
        rstd: &mut CudaSlice<f32>,
        y: &CudaSlice<T>,
        zxbcdt: &CudaSlice<T>,
        p: &Mamba2Params,
        rows: usize,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let s = p.sizes;
        let dim = gated_norm_dim(&s)?;
        let w = &self.params[p.norm.0].master;
        let norm = ssd::GatedNorm { x: y, z: zxbcdt, z_stride: s.in_proj_dim(), w, rows, dim };
        ssd::rms_norm_gated_fwd(&self.gpu, g, rstd, norm, p.eps)
    }

    fn gated_norm_bwd(
        &mut self,
        dy: &mut CudaSlice<T>,
        dzxbcdt: &mut CudaSlice<T>,
        dg: &CudaSlice<T>,
        y: &CudaSlice<T>,
        zxbcdt: &CudaSlice<T>,
        rstd: &CudaSlice<f32>,
        p: &Mamba2Params,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let s = p.sizes;
        let dim = gated_norm_dim(&s)?;
        let rows = y.len() / dim;
        let scratch = grown(&self.gpu, &mut self.ssm.small, ssd::rms_norm_gated_bwd_scratch_len(rows, dim))?;
        let w = &mut self.params[p.norm.0];
        let norm = ssd::GatedNorm { x: y, z: zxbcdt, z_stride: s.in_proj_dim(), w: &w.master, rows, dim };
        let grads = ssd::GatedNormGrads { dx: dy, dz: dzxbcdt, dw: &mut w.grad };
        ssd::rms_norm_gated_bwd(&self.gpu, grads, scratch, dg, rstd, norm)
    }
}
