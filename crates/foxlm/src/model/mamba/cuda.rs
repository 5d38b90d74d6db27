//! The Mamba family's operations on the CUDA backend (Samba's Mamba layers): dt_low's columns and
//! δ = softplus(·) from `fox_kernels::cuda::ssd`, and `fox_kernels::cuda::selective_scan`
//! (N ≤ 16) reading x_proj's B and C and in_proj's gate z in place. Its short convolution is the
//! backend's (`short_conv_*`), its state on the device a [`GpuMambaState`].

use super::ops::{MambaOps, MambaParams, ScanGradsOf, ScanIn};
pub use super::state::GpuMambaState;
use crate::backend::cuda::{grown, Cuda, GpuBatch};
use crate::backend::scan_state::{forward_carrying, gpu_chunks_from, Carry};
use crate::backend::Family;
use crate::config::MambaSizes;
use anyhow::{anyhow, ensure, Result};
use fox_kernels::cuda::cudarc::driver::CudaSlice;
use fox_kernels::cuda::selective_scan::{self as scan, DevGrads, DevScan};
use fox_kernels::cuda::ssd::CONV_WIDTHS;
use fox_kernels::cuda::{ssd, Elem};
use fox_kernels::selective_scan::BcLayout;

/// Why the GPU kernels cannot run a Mamba layer of these sizes, if they cannot.
pub fn unsupported(s: &MambaSizes) -> Option<String> {
    let ok = s.state <= scan::MAX_STATE && CONV_WIDTHS.contains(&s.conv);
    (!ok).then(|| {
        format!(
            "the GPU's Mamba kernels take state_size ≤ {} and conv_kernel ≤ 8 (this model: {}, {}); run it with \
             --device cpu",
            scan::MAX_STATE,
            s.state,
            s.conv
        )
    })
}

/// The scan over the layer's buffers: u, δ [B·T, Di], B and C in x_proj's output, the gate z in
/// xz's last Di columns.
fn problem<'a, T: Elem>(
    s: &MambaSizes,
    b: &'a GpuBatch,
    x: ScanIn<'a, CudaSlice<T>>,
    a: &'a CudaSlice<f32>,
    d: &'a CudaSlice<f32>,
) -> DevScan<'a, T> {
    let ScanIn { u, delta, xp, xz } = x;
    DevScan {
        batch: b.batch,
        len: b.seq,
        channels: s.inner,
        state: s.state,
        u,
        delta,
        a,
        bc: xp,
        bc_layout: BcLayout::x_proj(b.seq, s.dt_rank, s.state),
        d,
        z: Some(xz),
        z_offset: s.inner,
        z_stride: 2 * s.inner,
        start: b.chunk_start(),
    }
}

impl<T: Elem> MambaOps for Cuda<T> {
    fn mamba_dt_split(
        &mut self,
        dt_low: &mut CudaSlice<T>,
        xp: &CudaSlice<T>,
        p: &MambaParams,
        rows: usize,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let (r, w) = (p.sizes.dt_rank, p.sizes.x_proj_dim());
        ensure!(r > 0, "Mamba dt split: dt_rank 0");
        ssd::copy_cols(&self.gpu, dt_low, r, xp, w, (rows, r))
    }

    fn mamba_dt_merge(&mut self, dxp: &mut CudaSlice<T>, d_dt_low: &CudaSlice<T>, p: &MambaParams) -> Result<()> {
        self.mark(Family::Other)?;
        let (r, w) = (p.sizes.dt_rank, p.sizes.x_proj_dim());
        ensure!(r > 0, "Mamba dt merge: dt_rank 0");
        ssd::copy_cols(&self.gpu, dxp, w, d_dt_low, r, (d_dt_low.len() / r, r))
    }

    fn mamba_delta_fwd(
        &mut self,
        delta: &mut CudaSlice<T>,
        dt_pre: &CudaSlice<T>,
        p: &MambaParams,
        rows: usize,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let di = p.sizes.inner;
        ssd::dt_fwd(&self.gpu, delta, dt_pre, di, &self.params[p.dt_bias.0].master, rows)
    }

    fn mamba_delta_bwd(
        &mut self,
        d_dt_pre: &mut CudaSlice<T>,
        ddelta: &CudaSlice<T>,
        dt_pre: &CudaSlice<T>,
        p: &MambaParams,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let di = p.sizes.inner;
        let rows = dt_pre.len() / di;
        let scratch = grown(&self.gpu, &mut self.ssm.small, ssd::dt_bwd_scratch_len(rows, di))?;
        let bias = &mut self.params[p.dt_bias.0];
        ssd::dt_bwd(&self.gpu, d_dt_pre, &mut bias.grad, scratch, ddelta, dt_pre, di, &bias.master, rows)
    }

    fn selective_scan_fwd(
        &mut self,
        y: &mut CudaSlice<T>,
        saved: &mut CudaSlice<f32>,
        x: ScanIn<'_, CudaSlice<T>>,
        p: &MambaParams,
        b: &GpuBatch,
        state: Option<&mut GpuMambaState>,
    ) -> Result<()> {
        self.mark(Family::Attention)?;
        let s = &p.sizes;
        self.neg_exp_a(p.a_log, s.inner * s.state)?;
        let a = self.ssm.a.as_ref().ok_or_else(|| anyhow!("A"))?;
        let prob = problem(s, b, x, a, &self.params[p.d_skip.0].master);
        let gpu = &self.gpu;
        forward_carrying(state, b.batch, b.seq, |carry| match carry {
            Carry::Zeros => scan::forward(gpu, &prob, None, y, saved, None),
            Carry::Step(st) => scan::decode_step(gpu, &prob, &mut st.ssm, y),
            Carry::Chunks(st) => gpu_chunks_from(gpu, &mut self.ssm.next, &mut st.ssm, |from, to| {
                scan::forward(gpu, &prob, Some(from), y, saved, Some(to))
            }),
        })
    }

    fn selective_scan_bwd(
        &mut self,
        grads: ScanGradsOf<'_, CudaSlice<T>>,
        dy: &CudaSlice<T>,
        saved: &CudaSlice<f32>,
        x: ScanIn<'_, CudaSlice<T>>,
        p: &MambaParams,
        b: &GpuBatch,
    ) -> Result<()> {
        self.mark(Family::Attention)?;
        let s = &p.sizes;
        let an = s.inner * s.state;
        self.neg_exp_a(p.a_log, an)?;
        self.zeroed_da(an)?;
        let a = self.ssm.a.as_ref().ok_or_else(|| anyhow!("A"))?;
        let da = self.ssm.da.as_mut().ok_or_else(|| anyhow!("dA"))?;
        let scratch = grown(&self.gpu, &mut self.ssm.big, scan::scratch_floats(b.batch, b.seq, s.inner, s.state))?;
        let dp = &mut self.params[p.d_skip.0];
        let prob = problem(s, b, x, a, &dp.master);
        let ScanGradsOf { du, ddelta, dxp, dxz } = grads;
        let g = DevGrads { du, ddelta, da, dbc: dxp, dd: &mut dp.grad, dz: Some(dxz), dh0: None };
        scan::backward(&self.gpu, &prob, saved, dy, g, scratch)?;
        self.add_a_log_grad(p.a_log, an)
    }
}
