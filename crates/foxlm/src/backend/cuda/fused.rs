//! The fused decode step's device side (kernels/decode.cu, "a fused decode step"): the stacked
//! input projections per attention layer, the projections' f32 output, and the kernels' argument
//! block. Batch-1 decoding is bound by launches, not bytes: op by op, a FoX (Pro) layer runs 7
//! projections of the same input and 17 small kernels. Fused, the projections are one GEMM (their
//! weights stacked at load) and everything from the projections to the cache append is one
//! kernel; what lies between the attention and o_proj (the output norm and gate) is one kernel
//! too, or, for one bf16 query row per sequence, the attention's own last split
//! (`fox_kernels::cuda::attention::DecodeOut`). What a FoX layer puts into them is the attention
//! family's (`model/attention/fused_cuda.rs`).
//!
//! The op-by-op path stays the definition: the fused one is checked against it (and the CPU) by
//! `foxlm gpu-check`, and a layer the kernels do not cover (grouped-query attention, a sliding
//! window, ACP) runs op by op.

use crate::tensor::ParamId;
use fox_kernels::cuda::attention as ga;
use fox_kernels::cuda::cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig};
use fox_kernels::cuda::kargs;

/// One layer's stacked input projections: rows [q | k | k-shift gate | v | v-shift gate | forget
/// gate | output gate] of `w` [width, d], and where each starts in the GEMM's output row.
pub(crate) struct FusedLayer<T> {
    pub(crate) w: CudaSlice<T>,
    pub(crate) width: usize,
    pub(crate) q: usize,
    pub(crate) k: usize,
    pub(crate) ks: Option<usize>,
    pub(crate) v: usize,
    pub(crate) vs: Option<usize>,
    pub(crate) f: Option<usize>,
    pub(crate) og: Option<usize>,
}

/// The fused kernels' state: stacked weights per layer (keyed by the layer's q_proj weight) and
/// the projections' f32 output, [batch, widest].
#[derive(Default)]
pub(crate) struct FusedDecode<T> {
    pub(crate) layers: Vec<(ParamId, FusedLayer<T>)>,
    pub(crate) p: Option<CudaSlice<f32>>,
    /// Rows `p` was sized for.
    pub(crate) batch: usize,
    /// The output norm and gate of the layer whose inputs were just staged, for the one-row
    /// decode attention to apply in its last split ([`FusedDecode::take_output`]); `applied`
    /// once it did, so that [`Cuda::fused_output`] has nothing left to launch.
    pub(crate) output: Option<ga::DecodeOut>,
    pub(crate) applied: bool,
}

impl<T> FusedDecode<T> {
    /// The stacked projections of the layer whose q_proj weight is `q_weight`.
    pub(crate) fn layer(&self, q_weight: ParamId) -> Option<&FusedLayer<T>> {
        self.layers.iter().find(|(id, _)| *id == q_weight).map(|(_, f)| f)
    }
    /// The staged layer's output norm and gate, for the attention of the staged position.
    pub(crate) fn take_output(&mut self) -> Option<ga::DecodeOut> {
        self.output.take()
    }
    /// Whether the attention applied the output norm and gate it took.
    pub(crate) fn set_output_applied(&mut self, applied: bool) {
        self.applied = applied;
    }
}

/// `DecodeIn` of kernels/decode.cu.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct DecodeIn {
    pub(crate) p: u64,
    pub(crate) q: u64,
    pub(crate) c: u64,
    pub(crate) kc: u64,
    pub(crate) vc: u64,
    pub(crate) cc: u64,
    pub(crate) k_shift: u64,
    pub(crate) v_shift: u64,
    pub(crate) q_norm: u64,
    pub(crate) k_norm: u64,
    pub(crate) fgate_bias: u64,
    pub(crate) positions: u64,
    pub(crate) lenp: u64,
    pub(crate) rope_base: f64,
    pub(crate) ldp: i32,
    pub(crate) q_off: i32,
    pub(crate) k_off: i32,
    pub(crate) ks_off: i32,
    pub(crate) v_off: i32,
    pub(crate) vs_off: i32,
    pub(crate) f_off: i32,
    pub(crate) b: i32,
    pub(crate) h: i32,
    pub(crate) d: i32,
    pub(crate) cap: i32,
    pub(crate) len: i32,
    pub(crate) qn_groups: i32,
    pub(crate) kn_groups: i32,
    pub(crate) qk_eps: f32,
}
// SAFETY: plain old data in the C layout of `DecodeIn` (pointers, a double, ints, a float).
unsafe impl DeviceRepr for DecodeIn {}

/// An optional row's offset in the stacked projections as the kernels take it: −1 for none.
pub(crate) fn off(o: Option<usize>) -> i32 {
    o.map_or(-1, |v| v as i32)
}

/// One block per (row, head) of `head_dim` threads rounded up to whole warps.
pub(crate) fn head_blocks(rows_heads: usize, head_dim: usize) -> LaunchConfig {
    kargs::plain_config((rows_heads as u32, 1, 1), head_dim.next_multiple_of(32) as u32, 0)
}
