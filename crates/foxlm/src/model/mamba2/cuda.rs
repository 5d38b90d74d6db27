//! The Mamba-2 family on the CUDA backend: its inference state on the device, and its
//! operations on `fox_kernels::cuda::ssd`'s kernels (activations in T, dt, A, D and states in
//! f32; parameters' f32 weights, the convolution's from its T working copy as the GEMMs read
//! theirs).

use super::ops::{Mamba2Ops, Mamba2Params};
use super::state::Mamba2State;
use crate::backend::cuda::{dtod, grown, Cuda, GpuBatch};
use crate::backend::Family;
use crate::config::Mamba2Sizes;
use anyhow::{anyhow, ensure, Result};
use fox_kernels::cuda::cudarc::driver::CudaSlice;
use fox_kernels::cuda::ssd::{self, DevSsd, DevSsdGrads};
use fox_kernels::cuda::{Elem, Gpu};

/// A Mamba-2 layer's inference state on the GPU, in f32: the SSM state [B, H, P, N] and the
/// convolution's last W − 1 inputs [B, W − 1, C] (as [`Mamba2State`] on the CPU).
pub struct GpuMamba2State {
    pub batch: usize,
    pub sizes: Mamba2Sizes,
    pub len: usize,
    pub ssm: CudaSlice<f32>,
    pub conv: CudaSlice<f32>,
}

impl GpuMamba2State {
    pub fn new(gpu: &Gpu, batch: usize, sizes: Mamba2Sizes) -> Result<Self> {
        let (ssm, conv) = Mamba2State::lens(batch, &sizes);
        Ok(Self { batch, sizes, len: 0, ssm: gpu.zeros(ssm.max(1))?, conv: gpu.zeros(conv.max(1))? })
    }
}

/// The conv's (batch, seq, channels, width) over xBC's columns.
fn conv_dims(s: &Mamba2Sizes, b: &GpuBatch) -> (usize, usize, usize, usize) {
    (b.batch, b.seq, s.conv_dim(), s.conv)
}

impl<T: Elem> Cuda<T> {
    /// A = −exp(A_log) into the scratch's `a`.
    fn mamba2_a(&mut self, p: &Mamba2Params) -> Result<()> {
        let a = grown(&self.gpu, &mut self.ssm.a, p.sizes.heads)?;
        ssd::neg_exp(&self.gpu, a, &self.params[p.a_log.0].master)
    }
}

impl<T: Elem> Mamba2Ops for Cuda<T> {
    type Mamba2State = GpuMamba2State;

    fn mamba2_conv_fwd(
        &mut self,
        xbc: &mut CudaSlice<T>,
        zxbcdt: &CudaSlice<T>,
        p: &Mamba2Params,
        b: &GpuBatch,
        state: Option<&mut GpuMamba2State>,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let s = p.sizes;
        let x = zxbcdt.slice(s.inner..);
        let dims = conv_dims(&s, b);
        let w = self.copy_of(p.conv_w)?;
        let bias = p.conv_b.map(|id| &self.params[id.0].master);
        let start = b.chunk_start();
        match state {
            None => ssd::conv1d_fwd(&self.gpu, xbc, &x, s.in_proj_dim(), w, bias, start, None, dims, true),
            Some(st) => {
                ensure!(st.batch == b.batch, "a Mamba-2 state of {} rows for a batch of {}", st.batch, b.batch);
                ssd::conv1d_fwd(&self.gpu, xbc, &x, s.in_proj_dim(), w, bias, start, Some(&st.conv), dims, true)?;
                ssd::conv1d_state(&self.gpu, &mut st.conv, &x, s.in_proj_dim(), start, dims)
            }
        }
    }

    fn mamba2_conv_bwd(
        &mut self,
        dzxbcdt: &mut CudaSlice<T>,
        dxbc: &CudaSlice<T>,
        zxbcdt: &CudaSlice<T>,
        p: &Mamba2Params,
        b: &GpuBatch,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let s = p.sizes;
        let dims = conv_dims(&s, b);
        let scratch =
            grown(&self.gpu, &mut self.ssm.small, ssd::conv1d_bwd_scratch_len(dims.0, dims.1, dims.2, dims.3))?;
        let (w, bias) = match p.conv_b {
            Some(id) => {
                let (w, bias) = two_mut(&mut self.params, p.conv_w.0, id.0)?;
                (w, Some(bias))
            }
            None => (&mut self.params[p.conv_w.0], None),
        };
        let copy = w.copy.as_ref().ok_or_else(|| anyhow!("conv1d weight without a working copy"))?;
        let (bias, dbias) = match bias {
            Some(d) => (Some(&d.master), Some(&mut d.grad)),
            None => (None, None),
        };
        ssd::conv1d_bwd(
            &self.gpu,
            &mut dzxbcdt.slice_mut(s.inner..),
            &mut w.grad,
            dbias,
            scratch,
            dxbc,
            &zxbcdt.slice(s.inner..),
            s.in_proj_dim(),
            copy,
            bias,
            b.chunk_start(),
            None,
            dims,
            true,
        )
    }

    fn mamba2_dt_fwd(&mut self, dt: &mut CudaSlice<f32>, zxbcdt: &CudaSlice<T>, p: &Mamba2Params) -> Result<()> {
        self.mark(Family::Other)?;
        let s = p.sizes;
        let at = s.inner + s.conv_dim();
        let rows = dt.len() / s.heads;
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
        let at = s.inner + s.conv_dim();
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
        xbc: &CudaSlice<T>,
        dt: &CudaSlice<f32>,
        p: &Mamba2Params,
        b: &GpuBatch,
        state: Option<&mut GpuMamba2State>,
    ) -> Result<()> {
        self.mark(Family::Attention)?;
        self.mamba2_a(p)?;
        let s = p.sizes;
        let a = self.ssm.a.as_ref().ok_or_else(|| anyhow!("A"))?;
        let prob = DevSsd {
            batch: b.batch,
            seq: b.seq,
            heads: s.heads,
            head_dim: s.head_dim,
            state: s.state,
            groups: s.groups,
            xbc,
            xbc_stride: s.conv_dim(),
            dt,
            a,
            d: &self.params[p.d_skip.0].master,
            start: b.chunk_start(),
        };
        let len = ssd::ssd_fwd_scratch_len(b.batch, b.seq, s.heads, s.head_dim, s.state, s.groups);
        match state {
            None => {
                let scratch = grown(&self.gpu, &mut self.ssm.big, len)?;
                ssd::ssd_fwd(&self.gpu, &prob, y, None, None, scratch)
            }
            Some(st) => {
                ensure!(st.batch == b.batch, "a Mamba-2 state of {} rows for a batch of {}", st.batch, b.batch);
                if b.seq == 1 {
                    ssd::ssd_decode_step(&self.gpu, &prob, &mut st.ssm, y)?;
                } else {
                    let scratch = grown(&self.gpu, &mut self.ssm.big, len)?;
                    let next = grown(&self.gpu, &mut self.ssm.next, st.ssm.len())?;
                    ssd::ssd_fwd(&self.gpu, &prob, y, Some(&st.ssm), Some(&mut *next), scratch)?;
                    let n = st.ssm.len();
                    dtod(&self.gpu, next, 0, &mut st.ssm, 0, n)?;
                }
                st.len += b.seq;
                Ok(())
            }
        }
    }

    fn ssd_bwd(
        &mut self,
        dxbc: &mut CudaSlice<T>,
        ddt: &mut CudaSlice<f32>,
        dy: &CudaSlice<T>,
        xbc: &CudaSlice<T>,
        dt: &CudaSlice<f32>,
        p: &Mamba2Params,
        b: &GpuBatch,
    ) -> Result<()> {
        self.mark(Family::Attention)?;
        self.mamba2_a(p)?;
        let s = p.sizes;
        let h = s.heads;
        let a = self.ssm.a.as_ref().ok_or_else(|| anyhow!("A"))?;
        // ssd_bwd adds dA into `da`: from zero.
        let da = grown(&self.gpu, &mut self.ssm.da, h)?;
        self.gpu.stream().memset_zeros(da).map_err(|e| anyhow!("zeroing dA: {e:?}"))?;
        let len = ssd::ssd_bwd_scratch_len(b.batch, b.seq, h, s.head_dim, s.state, s.groups);
        let scratch = grown(&self.gpu, &mut self.ssm.big, len)?;
        let (dp, _) = two_mut(&mut self.params, p.d_skip.0, p.a_log.0)?;
        let prob = DevSsd {
            batch: b.batch,
            seq: b.seq,
            heads: h,
            head_dim: s.head_dim,
            state: s.state,
            groups: s.groups,
            xbc,
            xbc_stride: s.conv_dim(),
            dt,
            a,
            d: &dp.master,
            start: b.chunk_start(),
        };
        let grads = DevSsdGrads { dxbc, ddt, da, dd: &mut dp.grad, dinit: None };
        ssd::ssd_bwd(&self.gpu, &prob, dy, None, None, grads, scratch)?;
        // A = −exp(A_log): dA_log += dA · A.
        let da = self.ssm.da.as_ref().ok_or_else(|| anyhow!("dA"))?;
        ssd::mul_acc(&self.gpu, &mut self.params[p.a_log.0].grad, da, a, h)
    }

    fn gated_norm_fwd(
        &mut self,
        g: &mut CudaSlice<T>,
        rstd: &mut CudaSlice<f32>,
        y: &CudaSlice<T>,
        zxbcdt: &CudaSlice<T>,
        p: &Mamba2Params,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let s = p.sizes;
        let dim = s.inner / s.groups;
        let rows = y.len() / dim;
        let w = &self.params[p.norm.0].master;
        // Each row of zxbcdt holds G groups of z: as rows of `dim` with stride in_proj_dim, group by
        // group, the groups' rows are not evenly strided unless G = 1.
        ensure!(s.groups == 1, "the GPU gated RMSNorm takes one group (n_groups = 1), not {}", s.groups);
        ssd::rms_norm_gated_fwd(&self.gpu, g, rstd, y, zxbcdt, s.in_proj_dim(), w, rows, dim, p.eps)
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
        let dim = s.inner / s.groups;
        let rows = y.len() / dim;
        ensure!(s.groups == 1, "the GPU gated RMSNorm takes one group (n_groups = 1), not {}", s.groups);
        let scratch = grown(&self.gpu, &mut self.ssm.small, ssd::rms_norm_gated_bwd_scratch_len(rows, dim))?;
        let w = &mut self.params[p.norm.0];
        ssd::rms_norm_gated_bwd(
            &self.gpu,
            dy,
            dzxbcdt,
            &mut w.grad,
            scratch,
            dg,
            y,
            zxbcdt,
            s.in_proj_dim(),
            rstd,
            &w.master,
            rows,
            dim,
        )
    }
}

/// Two distinct elements of `v`, both mutable.
fn two_mut<U>(v: &mut [U], i: usize, j: usize) -> Result<(&mut U, &mut U)> {
    ensure!(i != j && i.max(j) < v.len(), "two_mut: {i} and {j} of {}", v.len());
    Ok(if i < j {
        let (l, r) = v.split_at_mut(j);
        (&mut l[i], &mut r[0])
    } else {
        let (l, r) = v.split_at_mut(i);
        (&mut r[0], &mut l[j])
    })
}
