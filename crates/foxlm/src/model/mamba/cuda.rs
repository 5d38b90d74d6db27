//! The Mamba family on the CUDA backend: its inference state on the device, and its
//! operations. `fox_kernels::cuda::selective_scan` exists (the scan, N ≤ 16) and the layer's
//! buffers are laid out as it reads them (u, δ in the activation type, x_proj's output read in
//! place through `BcLayout::x_proj`), but the layer needs device kernels that do not exist yet:
//! the causal depthwise conv1d + SiLU (forward, backward, state, decode step), softplus(x + bias)
//! per channel and its backward (Mamba-2's dt op has no CUDA twin either), strided column copies
//! (dt_low out of x_proj's output and its gradient back, z out of in_proj's output for the scan
//! and dz back), and A = −exp(A_log) with dA_log = dA ⊙ A. Every operation refuses with an error
//! that says so, rather than running part of the layer on the device.

use super::ops::{MambaOps, MambaParams};
use super::state::MambaState;
use crate::backend::cuda::{Cuda, GpuBatch};
use crate::config::MambaSizes;
use anyhow::{bail, Result};
use fox_kernels::cuda::cudarc::driver::CudaSlice;
use fox_kernels::cuda::{Elem, Gpu};

/// A Mamba layer's inference state on the GPU, in f32: the scan state [B, Di, N] and the
/// convolution's last W − 1 inputs [B, W − 1, Di] (as [`MambaState`] on the CPU).
pub struct GpuMambaState {
    pub batch: usize,
    pub sizes: MambaSizes,
    pub len: usize,
    pub ssm: CudaSlice<f32>,
    pub conv: CudaSlice<f32>,
}

impl GpuMambaState {
    pub fn new(gpu: &Gpu, batch: usize, sizes: MambaSizes) -> Result<Self> {
        let (ssm, conv) = MambaState::lens(batch, &sizes);
        Ok(Self { batch, sizes, len: 0, ssm: gpu.zeros(ssm.max(1))?, conv: gpu.zeros(conv.max(1))? })
    }
}

/// Why a Samba model cannot run on the GPU yet.
const NO_KERNELS: &str = "Samba's Mamba layers need a CUDA causal conv1d (depthwise, with SiLU, its state and \
     decode step), which does not exist yet (fox_kernels::cuda has the selective scan only): run this model with \
     --device cpu";

impl<T: Elem> MambaOps for Cuda<T> {
    type MambaState = GpuMambaState;

    fn mamba_conv_fwd(
        &mut self,
        _u: &mut CudaSlice<T>,
        _xz: &CudaSlice<T>,
        _p: &MambaParams,
        _batch: &GpuBatch,
        _state: Option<&mut GpuMambaState>,
    ) -> Result<()> {
        bail!(NO_KERNELS)
    }
    fn mamba_conv_bwd(
        &mut self,
        _dxz: &mut CudaSlice<T>,
        _du: &CudaSlice<T>,
        _xz: &CudaSlice<T>,
        _p: &MambaParams,
        _batch: &GpuBatch,
    ) -> Result<()> {
        bail!(NO_KERNELS)
    }
    fn mamba_dt_split(&mut self, _dt_low: &mut CudaSlice<T>, _xp: &CudaSlice<T>, _p: &MambaParams) -> Result<()> {
        bail!(NO_KERNELS)
    }
    fn mamba_dt_merge(&mut self, _dxp: &mut CudaSlice<T>, _d_dt_low: &CudaSlice<T>, _p: &MambaParams) -> Result<()> {
        bail!(NO_KERNELS)
    }
    fn mamba_delta_fwd(&mut self, _delta: &mut CudaSlice<T>, _dt_pre: &CudaSlice<T>, _p: &MambaParams) -> Result<()> {
        bail!(NO_KERNELS)
    }
    fn mamba_delta_bwd(
        &mut self,
        _d_dt_pre: &mut CudaSlice<T>,
        _ddelta: &CudaSlice<T>,
        _dt_pre: &CudaSlice<T>,
        _p: &MambaParams,
    ) -> Result<()> {
        bail!(NO_KERNELS)
    }
    fn selective_scan_fwd(
        &mut self,
        _y: &mut CudaSlice<T>,
        _saved: &mut CudaSlice<f32>,
        _u: &CudaSlice<T>,
        _delta: &CudaSlice<T>,
        _xp: &CudaSlice<T>,
        _xz: &CudaSlice<T>,
        _p: &MambaParams,
        _batch: &GpuBatch,
        _state: Option<&mut GpuMambaState>,
    ) -> Result<()> {
        bail!(NO_KERNELS)
    }
    fn selective_scan_bwd(
        &mut self,
        _du: &mut CudaSlice<T>,
        _ddelta: &mut CudaSlice<T>,
        _dxp: &mut CudaSlice<T>,
        _dxz: &mut CudaSlice<T>,
        _dy: &CudaSlice<T>,
        _saved: &CudaSlice<f32>,
        _u: &CudaSlice<T>,
        _delta: &CudaSlice<T>,
        _xp: &CudaSlice<T>,
        _xz: &CudaSlice<T>,
        _p: &MambaParams,
        _batch: &GpuBatch,
    ) -> Result<()> {
        bail!(NO_KERNELS)
    }
}
