//! The HGRN2 family on the CUDA backend: no GPU kernels yet. `backend::cuda::unsupported` names
//! the family, so `--device auto` runs these models on the CPU (with a note) and `--device cuda`
//! refuses them before a step runs; the operations below are never reached through the CLI, and
//! each refuses if called directly.

use super::ops::{ConvOf, GlaGradsOf, Hgrn2GateGradsOf, Hgrn2GatesOf, Hgrn2Ops, Hgrn2Params};
use crate::backend::cuda::{Cuda, GpuBatch};
use crate::tensor::ParamId;
use anyhow::{bail, Result};
use fox_kernels::cuda::cudarc::driver::CudaSlice;
use fox_kernels::cuda::Elem;

/// Why the GPU backend cannot run an HGRN2 layer.
pub const NO_GPU_KERNELS: &str = "the GPU backend has no HGRN2 kernels yet; run it with --device cpu";

/// The GPU state type the trait asks for; never built (see the module's doc).
pub enum GpuHgrn2State {}

impl<T: Elem> Hgrn2Ops for Cuda<T> {
    type Hgrn2State = GpuHgrn2State;

    fn hgrn2_conv_fwd(
        &mut self,
        _: &mut CudaSlice<T>,
        _: &CudaSlice<T>,
        _: ConvOf,
        _: &Hgrn2Params,
        _: &GpuBatch,
        _: Option<&mut GpuHgrn2State>,
    ) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }
    fn hgrn2_conv_bwd(
        &mut self,
        _: &mut CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: ConvOf,
        _: &Hgrn2Params,
        _: &GpuBatch,
    ) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }

    fn hgrn2_lower_bounds_fwd(&mut self, _: &mut CudaSlice<f32>, _: ParamId, _: usize) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }
    fn hgrn2_lower_bounds_bwd(&mut self, _: &CudaSlice<f32>, _: ParamId, _: usize) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }
    fn hgrn2_gates_fwd(
        &mut self,
        _: &mut CudaSlice<T>,
        _: &mut CudaSlice<T>,
        _: &mut CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<f32>,
        _: &Hgrn2Params,
    ) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }
    fn hgrn2_gates_bwd(
        &mut self,
        _: Hgrn2GateGradsOf<'_, CudaSlice<T>, CudaSlice<f32>>,
        _: Hgrn2GatesOf<'_, CudaSlice<T>, CudaSlice<f32>>,
        _: &Hgrn2Params,
    ) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }
    fn hgrn2_gla_fwd(
        &mut self,
        _: &mut CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &Hgrn2Params,
        _: &GpuBatch,
        _: Option<&mut GpuHgrn2State>,
    ) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }
    fn hgrn2_gla_bwd(
        &mut self,
        _: GlaGradsOf<'_, CudaSlice<T>>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &Hgrn2Params,
        _: &GpuBatch,
    ) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }
}
