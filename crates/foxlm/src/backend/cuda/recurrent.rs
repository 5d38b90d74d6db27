//! What the recurrent families (Mamba-2, Mamba, DeltaNet, HGRN2) share on the CUDA backend: one
//! grown scratch for their kernels and the decay rates A = −exp(A_log) and their gradient. The
//! short causal convolution is the backend's `conv1d_fwd` / `short_conv_bwd` (backend_ops.rs).

use super::Cuda;
use crate::tensor::ParamId;
use anyhow::{anyhow, ensure, Context, Result};
use fox_kernels::cuda::cudarc::driver::CudaSlice;
use fox_kernels::cuda::ssd;
use fox_kernels::cuda::{Elem, Gpu};

/// Scratch of the recurrent layers' kernels (Mamba-2's SSD and the partial sums of its
/// parameter gradients), shared by every layer: sized in [`Cuda::new`] for the planned step (so
/// a training step allocates nothing) and grown by a call that needs more (an inference shape
/// beyond the plan).
#[derive(Default)]
pub(crate) struct SsmScratch {
    /// The SSD's chunk products and states (forward, or forward and backward).
    pub(crate) big: Option<CudaSlice<f32>>,
    /// Per-256-row partial sums of the conv, norm and dt gradients.
    pub(crate) small: Option<CudaSlice<f32>>,
    /// A = −exp(A_log) and dA, [H] each.
    pub(crate) a: Option<CudaSlice<f32>>,
    pub(crate) da: Option<CudaSlice<f32>>,
    /// The SSM state a chunked prefill leaves, before it replaces the layer's.
    pub(crate) next: Option<CudaSlice<f32>>,
}

impl SsmScratch {
    /// Each buffer's length (0: none). A buffer is only ever replaced by a larger one, so equal
    /// lengths mean the same buffers: what a captured CUDA graph, which holds their addresses,
    /// needs to know after other work ran.
    pub(crate) fn lens(&self) -> [usize; 5] {
        [&self.big, &self.small, &self.a, &self.da, &self.next].map(|s| s.as_ref().map_or(0, |s| s.len()))
    }
}

/// `slot` holding at least `n` floats (allocated, or reallocated larger, when it does not).
pub(crate) fn grown<'a>(gpu: &Gpu, slot: &'a mut Option<CudaSlice<f32>>, n: usize) -> Result<&'a mut CudaSlice<f32>> {
    if slot.as_ref().is_none_or(|s| s.len() < n) {
        *slot = None;
        *slot = Some(gpu.zeros(n.max(1)).with_context(|| format!("recurrent layers' scratch of {n} floats"))?);
    }
    slot.as_mut().ok_or_else(|| anyhow!("scratch"))
}

impl<T: Elem> Cuda<T> {
    /// A = −exp(A_log) ([n], the SSMs' decay rates) into the scratch's `a`.
    pub(crate) fn neg_exp_a(&mut self, a_log: ParamId, n: usize) -> Result<()> {
        let a = grown(&self.gpu, &mut self.ssm.a, n)?;
        ssd::neg_exp(&self.gpu, a, &self.params[a_log.0].master)
    }

    /// The scratch's `da` ([n]) zeroed: the SSMs' backwards add dA into it.
    pub(crate) fn zeroed_da(&mut self, n: usize) -> Result<()> {
        let da = grown(&self.gpu, &mut self.ssm.da, n)?;
        self.gpu.stream().memset_zeros(da).map_err(|e| anyhow!("zeroing dA: {e:?}"))
    }

    /// A = −exp(A_log): grad(A_log) += dA · A, from the scratch's `da` and `a` ([n]).
    pub(crate) fn add_a_log_grad(&mut self, a_log: ParamId, n: usize) -> Result<()> {
        let a = self.ssm.a.as_ref().ok_or_else(|| anyhow!("A"))?;
        let da = self.ssm.da.as_ref().ok_or_else(|| anyhow!("dA"))?;
        ssd::mul_acc(&self.gpu, &mut self.params[a_log.0].grad, da, a, n)
    }
}

/// Two distinct elements of `v`, both mutable.
pub(crate) fn two_mut<U>(v: &mut [U], i: usize, j: usize) -> Result<(&mut U, &mut U)> {
    ensure!(i != j && i.max(j) < v.len(), "two_mut: {i} and {j} of {}", v.len());
    Ok(if i < j {
        let (l, r) = v.split_at_mut(j);
        (&mut l[i], &mut r[0])
    } else {
        let (l, r) = v.split_at_mut(i);
        (&mut r[0], &mut l[j])
    })
}
