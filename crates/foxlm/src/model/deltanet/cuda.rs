//! The DeltaNet family on the CUDA backend: no GPU kernels yet. `backend::cuda::unsupported`
//! names the family, so `--device auto` runs these models on the CPU (with a note) and
//! `--device cuda` refuses them before a step runs; the operations below are never reached
//! through the CLI, and each refuses if called directly.

use super::ops::{ConvOf, DeltaNetOps, DeltaNetParams, DeltaRuleGradsOf};
use crate::backend::cuda::{Cuda, GpuBatch};
use anyhow::{bail, Result};
use fox_kernels::cuda::cudarc::driver::CudaSlice;
use fox_kernels::cuda::Elem;

/// Why the GPU backend cannot run a DeltaNet layer.
pub const NO_GPU_KERNELS: &str =
    "the GPU backend has no DeltaNet / Gated DeltaNet kernels yet; run it with --device cpu";

/// The GPU state type the trait asks for; never built (see the module's doc).
pub enum GpuDeltaNetState {}

impl<T: Elem> DeltaNetOps for Cuda<T> {
    type DeltaNetState = GpuDeltaNetState;

    fn deltanet_conv_fwd(
        &mut self,
        _: &mut CudaSlice<T>,
        _: &CudaSlice<T>,
        _: ConvOf,
        _: &DeltaNetParams,
        _: &GpuBatch,
        _: Option<&mut GpuDeltaNetState>,
    ) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }
    fn deltanet_conv_bwd(
        &mut self,
        _: &mut CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: ConvOf,
        _: &DeltaNetParams,
        _: &GpuBatch,
    ) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }
    fn l2norm_fwd(&mut self, _: &mut CudaSlice<T>, _: &mut CudaSlice<f32>, _: &CudaSlice<T>, _: usize) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }
    fn l2norm_bwd(
        &mut self,
        _: &mut CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<f32>,
        _: usize,
    ) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }
    fn deltanet_decay_fwd(&mut self, _: &mut CudaSlice<T>, _: &CudaSlice<T>, _: &DeltaNetParams) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }
    fn deltanet_decay_bwd(
        &mut self,
        _: &mut CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &DeltaNetParams,
    ) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }
    fn delta_rule_fwd(
        &mut self,
        _: &mut CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: Option<&CudaSlice<T>>,
        _: &DeltaNetParams,
        _: &GpuBatch,
        _: Option<&mut GpuDeltaNetState>,
    ) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }
    fn delta_rule_bwd(
        &mut self,
        _: DeltaRuleGradsOf<'_, CudaSlice<T>>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: Option<&CudaSlice<T>>,
        _: &DeltaNetParams,
        _: &GpuBatch,
    ) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }
    fn swish_gate_fwd(&mut self, _: &mut CudaSlice<T>, _: &CudaSlice<T>, _: &CudaSlice<T>) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }
    fn swish_gate_bwd(
        &mut self,
        _: &mut CudaSlice<T>,
        _: &mut CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
        _: &CudaSlice<T>,
    ) -> Result<()> {
        bail!(NO_GPU_KERNELS)
    }
}
