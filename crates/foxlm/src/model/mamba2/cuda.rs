//! The Mamba-2 family on the CUDA backend: its inference state on the device, and its
//! operations.

use super::ops::{Mamba2Ops, Mamba2Params};
use super::state::Mamba2State;
use crate::backend::cuda::{Cuda, GpuBatch};
use crate::config::Mamba2Sizes;
use anyhow::{bail, Result};
use fox_kernels::cuda::cudarc::driver::CudaSlice;
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

/// Why a Mamba-2 model cannot run on the GPU yet: its kernels are written against the CPU ops in
/// `fox_kernels` (conv1d, ssd) and checked there first.
const NO_KERNELS: &str = "Mamba-2 layers have no CUDA kernels yet: run this model with --device cpu";

impl<T: Elem> Mamba2Ops for Cuda<T> {
    type Mamba2State = GpuMamba2State;

    fn mamba2_conv_fwd(
        &mut self,
        _xbc: &mut CudaSlice<T>,
        _zxbcdt: &CudaSlice<T>,
        _p: &Mamba2Params,
        _batch: &GpuBatch,
        _state: Option<&mut GpuMamba2State>,
    ) -> Result<()> {
        bail!(NO_KERNELS)
    }
    fn mamba2_conv_bwd(
        &mut self,
        _dzxbcdt: &mut CudaSlice<T>,
        _dxbc: &CudaSlice<T>,
        _zxbcdt: &CudaSlice<T>,
        _p: &Mamba2Params,
        _batch: &GpuBatch,
    ) -> Result<()> {
        bail!(NO_KERNELS)
    }
    fn mamba2_dt_fwd(&mut self, _dt: &mut CudaSlice<f32>, _zxbcdt: &CudaSlice<T>, _p: &Mamba2Params) -> Result<()> {
        bail!(NO_KERNELS)
    }
    fn mamba2_dt_bwd(
        &mut self,
        _dzxbcdt: &mut CudaSlice<T>,
        _ddt: &CudaSlice<f32>,
        _zxbcdt: &CudaSlice<T>,
        _p: &Mamba2Params,
    ) -> Result<()> {
        bail!(NO_KERNELS)
    }
    fn ssd_fwd(
        &mut self,
        _y: &mut CudaSlice<T>,
        _xbc: &CudaSlice<T>,
        _dt: &CudaSlice<f32>,
        _p: &Mamba2Params,
        _batch: &GpuBatch,
        _state: Option<&mut GpuMamba2State>,
    ) -> Result<()> {
        bail!(NO_KERNELS)
    }
    fn ssd_bwd(
        &mut self,
        _dxbc: &mut CudaSlice<T>,
        _ddt: &mut CudaSlice<f32>,
        _dy: &CudaSlice<T>,
        _xbc: &CudaSlice<T>,
        _dt: &CudaSlice<f32>,
        _p: &Mamba2Params,
        _batch: &GpuBatch,
    ) -> Result<()> {
        bail!(NO_KERNELS)
    }
    fn gated_norm_fwd(
        &mut self,
        _g: &mut CudaSlice<T>,
        _rstd: &mut CudaSlice<f32>,
        _y: &CudaSlice<T>,
        _zxbcdt: &CudaSlice<T>,
        _p: &Mamba2Params,
    ) -> Result<()> {
        bail!(NO_KERNELS)
    }
    fn gated_norm_bwd(
        &mut self,
        _dy: &mut CudaSlice<T>,
        _dzxbcdt: &mut CudaSlice<T>,
        _dg: &CudaSlice<T>,
        _y: &CudaSlice<T>,
        _zxbcdt: &CudaSlice<T>,
        _rstd: &CudaSlice<f32>,
        _p: &Mamba2Params,
    ) -> Result<()> {
        bail!(NO_KERNELS)
    }
}
