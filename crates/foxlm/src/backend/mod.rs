//! The operations the model is written against, so that one model runs on two backends: the CPU
//! (f32, the exact reference; [`cpu::Cpu`]) and CUDA (bf16 or f32 activations on one GPU;
//! [`cuda::Cuda`]).
//!
//! [`Backend`] holds the family-neutral operations (embedding, Linear, norms, elementwise, the
//! head and its loss); each mixer family's own operations are a trait of the family's, beside its
//! layer (`model/attention/ops.rs`: [`crate::model::attention::ops::AttnOps`]), with its CPU and
//! CUDA implementations there too.
//!
//! The model says *what* happens (model/*.rs reads like SPEC §2); a backend says where the
//! numbers live and how each operation runs. Parameters and their gradients belong to the backend
//! and are named by [`ParamId`]; activations are buffers the model allocates through
//! [`Backend::alloc`] (once per run on the GPU: see `ModelActs::new`). Every operation mirrors the
//! CPU op of the same name in `fox_kernels`, whose comments define it; parameter gradients are
//! accumulated (`+=`).

mod device;
pub use device::{select_device, select_device_with_dtype, DeviceArg};
mod dtype;
pub use dtype::Dtype;
mod shards;
pub use shards::Shards;
pub mod cpu;
pub mod cuda;
pub mod scan_state;

use crate::tensor::{Linear, ParamId};
use anyhow::Result;
use scan_state::{ScanSizes, ScanState};

/// Kinds of work in a step, for the breakdown of `foxlm bench train` (GPU: the time between CUDA
/// events; CPU: each operation's wall time, [`cpu::CpuProfile`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// GEMMs of the blocks (projections, MLP): cuBLASLt, or the `gemm` crate on the CPU.
    Gemm,
    /// Forgetting Attention forward and backward (with ACP thresholds).
    Attention,
    /// The output head's GEMMs, chunk by chunk (on the CPU: the whole fused head, its
    /// cross-entropy included).
    Head,
    /// The fused softmax cross-entropy over the vocabulary and the head's chunk copies (GPU).
    CrossEntropy,
    /// Gradient norm, clipping and AdamW.
    Optimizer,
    /// Everything else: norms, KV-shift, RoPE, gates, SwiGLU, residuals, embedding, copies.
    Other,
}

impl Family {
    pub const ALL: [Family; 6] =
        [Family::Gemm, Family::Attention, Family::Head, Family::CrossEntropy, Family::Optimizer, Family::Other];

    /// The family's line in a serving profile's forward (`FOXLM_SERVE_PROFILE=1`).
    pub fn forward_phase(self) -> &'static str {
        match self {
            Family::Gemm => "  forward: GEMMs (events)",
            Family::Attention => "  forward: attention (events)",
            Family::Head => "  forward: head (events)",
            Family::CrossEntropy => "  forward: cross-entropy (events)",
            Family::Optimizer => "  forward: optimizer (events)",
            Family::Other => "  forward: other ops (events)",
        }
    }
}

/// A batch as the backend sees it: token ids, targets and left padding in the backend's memory,
/// prepared once per forward ([`Backend::prepare`]).
pub struct BatchInfo<'a> {
    pub batch: usize,
    pub seq: usize,
    /// Row b's first `start[b]` positions are padding (left padding), if any row is padded.
    pub start: Option<&'a [usize]>,
    /// Tokens already in the cache before this forward (decoding), 0 for a fresh sequence.
    pub past: usize,
}

impl BatchInfo<'_> {
    /// Rows of the forward's [B·T, ·] activations: B·T positions.
    pub fn rows(&self) -> usize {
        self.batch * self.seq
    }
}

/// Allocation of a backend's buffers (also implemented by [`Sizer`], which only counts).
pub trait Alloc {
    /// An activation buffer: f32 on the CPU, f32 or bf16 on the GPU.
    type Act;
    /// An f32 buffer: normalisation statistics, gate values and prefix sums, losses.
    type F32;
    fn alloc(&self, n: usize) -> Result<Self::Act>;
    fn alloc_f32(&self, n: usize) -> Result<Self::F32>;
}

/// Counts what would be allocated: sizes the memory plan without allocating.
#[derive(Default)]
pub struct Sizer {
    pub act: std::cell::Cell<usize>,
    pub f32: std::cell::Cell<usize>,
}

impl Sizer {
    /// Bytes counted so far with `act_bytes` per activation element; resets the count.
    pub fn take_bytes(&self, act_bytes: usize) -> usize {
        self.act.take() * act_bytes + self.f32.take() * 4
    }
}

impl Alloc for Sizer {
    type Act = ();
    type F32 = ();
    fn alloc(&self, n: usize) -> Result<()> {
        self.act.set(self.act.get() + n);
        Ok(())
    }
    fn alloc_f32(&self, n: usize) -> Result<()> {
        self.f32.set(self.f32.get() + n);
        Ok(())
    }
}

/// An RMSNorm over the first `rows` rows of `dim` with weight `w` (row r takes weight row
/// r % (len(w) / dim): one row for a block norm, one per head for a per-head norm) and `eps`.
#[derive(Clone, Copy, Debug)]
pub struct Norm {
    pub w: ParamId,
    pub rows: usize,
    pub dim: usize,
    pub eps: f32,
}

pub trait Backend: Alloc {
    /// The batch in the backend's memory: ids, targets, left padding, RoPE positions.
    type Batch;

    /// Uploads ids [B·T] and targets (None: no loss at that position) for a forward.
    fn prepare(
        &mut self,
        batch: &mut Self::Batch,
        info: &BatchInfo,
        ids: &[u32],
        targets: Option<&[Option<u32>]>,
    ) -> Result<()>;
    fn new_batch(&self, max_rows: usize, batch: usize) -> Result<Self::Batch>;
    fn batch_info<'b>(&self, batch: &'b Self::Batch) -> BatchInfo<'b>;

    // Parameters (held by the backend; gradients accumulate into its own buffers).
    fn embedding_fwd(&mut self, x: &mut Self::Act, table: ParamId, batch: &Self::Batch) -> Result<()>;
    fn embedding_bwd(&mut self, table: ParamId, dx: &Self::Act, batch: &Self::Batch) -> Result<()>;
    /// y [rows, out] = x [rows, in] · Wᵀ
    fn linear_fwd(&mut self, y: &mut Self::Act, x: &Self::Act, w: &Linear, rows: usize) -> Result<()>;
    /// The same with an f32 result (forget-gate logits, kept in f32 for the prefix sum).
    fn linear_fwd_f32(&mut self, y: &mut Self::F32, x: &Self::Act, w: &Linear, rows: usize) -> Result<()>;
    /// grad(W) += dyᵀ·x (unless frozen); with `dx`, dx (+)= dy·W (added to when `accumulate`).
    fn linear_bwd(
        &mut self,
        w: &Linear,
        x: &Self::Act,
        dy: &Self::Act,
        dx: Option<&mut Self::Act>,
        accumulate: bool,
        rows: usize,
    ) -> Result<()>;
    /// RMSNorm `n` (block norms, per-head and shared QK-norm, the output norm). The forward's ops
    /// take their rows (or elements) from the model, not from the buffers: an inference engine's
    /// buffers are planned for its largest forward, and a smaller one must not pay for the rest.
    fn rms_norm_fwd(&mut self, y: &mut Self::Act, rstd: &mut Self::F32, x: &Self::Act, n: Norm) -> Result<()>;
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_bwd(
        &mut self,
        dx: &mut Self::Act,
        accumulate: bool,
        w: ParamId,
        dy: &Self::Act,
        x: &Self::Act,
        rstd: &Self::F32,
        dim: usize,
    ) -> Result<()>;

    /// A residual add and the norm after it: h = a + b, then y, rstd = RMSNorm `n` of h (a backend
    /// may do both in one pass; the results are those of the two ops).
    #[allow(clippy::too_many_arguments)]
    fn add_rms_norm_fwd(
        &mut self,
        h: &mut Self::Act,
        y: &mut Self::Act,
        rstd: &mut Self::F32,
        a: &Self::Act,
        b: &Self::Act,
        n: Norm,
    ) -> Result<()> {
        self.add(h, a, b, n.rows * n.dim)?;
        self.rms_norm_fwd(y, rstd, h, n)
    }

    /// [`Self::add_rms_norm_fwd`] in place: h += b, then y, rstd = RMSNorm `n` of h.
    fn add_inplace_rms_norm_fwd(
        &mut self,
        h: &mut Self::Act,
        y: &mut Self::Act,
        rstd: &mut Self::F32,
        b: &Self::Act,
        n: Norm,
    ) -> Result<()> {
        self.add_inplace(h, b, n.rows * n.dim)?;
        self.rms_norm_fwd(y, rstd, h, n)
    }

    // Elementwise, over the first `n` elements.
    fn add(&mut self, y: &mut Self::Act, a: &Self::Act, b: &Self::Act, n: usize) -> Result<()>;
    fn add_inplace(&mut self, y: &mut Self::Act, x: &Self::Act, n: usize) -> Result<()>;
    fn copy(&mut self, dst: &mut Self::Act, src: &Self::Act, n: usize) -> Result<()>;
    fn sigmoid_inplace(&mut self, x: &mut Self::Act, n: usize) -> Result<()>;
    /// dy ·= y · (1 − y), the sigmoid's backward from its output y.
    fn sigmoid_bwd_inplace(&mut self, dy: &mut Self::Act, y: &Self::Act) -> Result<()>;
    fn zero_f32(&mut self, x: &mut Self::F32, n: usize) -> Result<()>;
    fn swiglu_fwd(&mut self, h: &mut Self::Act, gu: &Self::Act, rows: usize, inter: usize) -> Result<()>;
    /// SwiGLU's gate_proj and activation: gu = x · gate_projᵀ, h = silu(gate) · up (a backend may
    /// do both in one pass).
    fn gate_up_swiglu_fwd(
        &mut self,
        gu: &mut Self::Act,
        h: &mut Self::Act,
        x: &Self::Act,
        gate_proj: &Linear,
        rows: usize,
        inter: usize,
    ) -> Result<()> {
        self.linear_fwd(gu, x, gate_proj, rows)?;
        self.swiglu_fwd(h, gu, rows, inter)
    }
    fn swiglu_bwd(
        &mut self,
        dgu: &mut Self::Act,
        dh: &Self::Act,
        gu: &Self::Act,
        rows: usize,
        inter: usize,
    ) -> Result<()>;
    /// z = pre · sigmoid(g)
    fn gate_mul_fwd(&mut self, z: &mut Self::Act, pre: &Self::Act, g: &Self::Act, n: usize) -> Result<()>;
    fn gate_mul_bwd(
        &mut self,
        dpre: &mut Self::Act,
        dg: &mut Self::Act,
        dz: &Self::Act,
        pre: &Self::Act,
        g: &Self::Act,
    ) -> Result<()>;
    fn cast_to_act(&mut self, dst: &mut Self::Act, src: &Self::F32) -> Result<()>;

    // The recurrent layers' short convolution.
    /// out [B·T, channels] = conv(x) (+ bias, then SiLU, as `c` says), causal per row from its
    /// first real token; with the layer's `state`, continuing convolution `c.slot`'s last inputs
    /// and then advancing them.
    fn short_conv_fwd<S: ScanSizes>(
        &mut self,
        out: &mut Self::Act,
        x: &Self::Act,
        c: &ShortConv,
        batch: &Self::Batch,
        state: Option<&mut ScanState<S, Self::F32>>,
    ) -> Result<()> {
        let rows = self.batch_info(batch).batch;
        let conv = state.map(|st| st.conv_mut(c.slot, rows)).transpose()?;
        self.conv1d_fwd(out, x, c, batch, conv)
    }
    /// [`Self::short_conv_fwd`] continuing one convolution's state [B, W − 1, channels].
    fn conv1d_fwd(
        &mut self,
        out: &mut Self::Act,
        x: &Self::Act,
        c: &ShortConv,
        batch: &Self::Batch,
        state: Option<&mut Self::F32>,
    ) -> Result<()>;
    /// From dout, writes dx (c's columns of x's rows) and adds the weight's and bias's gradients.
    fn short_conv_bwd(
        &mut self,
        dx: &mut Self::Act,
        dout: &Self::Act,
        x: &Self::Act,
        c: &ShortConv,
        batch: &Self::Batch,
    ) -> Result<()>;

    // The output head and the loss.
    /// Σ over rows with a target of the cross-entropy of `hidden` [B·T, d] · lm_headᵀ, added to
    /// the backend's running loss ([`Backend::take_loss`]); grad(lm_head) += weight · d(Σ loss)/dW
    /// and dhidden = weight · d(Σ loss)/d hidden. The [rows, vocab] logits exist only a chunk of
    /// rows at a time.
    /// Without `dhidden`, only the loss (evaluation).
    fn head_loss(
        &mut self,
        dhidden: Option<&mut Self::Act>,
        hidden: &Self::Act,
        lm_head: &Linear,
        batch: &Self::Batch,
        weight: f32,
    ) -> Result<()>;
    /// The summed loss and the number of rows with a target since the last call (a GPU backend
    /// waits for its queue here, once per step).
    fn take_loss(&mut self) -> Result<(f64, usize)>;
    /// The backward is done with the parameters `ids` (their gradients are complete for this
    /// micro-batch): a data-parallel backend may start reducing them while the backward goes on.
    fn grads_ready(&mut self, _ids: std::ops::Range<usize>) -> Result<()> {
        Ok(())
    }
}

/// A short causal convolution over `channels` columns, from column `offset`, of rows of stride
/// `stride` (Mamba-2's xBC, Mamba's x, DeltaNet's and HGRN2's projections), width `width`, with
/// its weight, optional bias and SiLU (all but HGRN2's).
#[derive(Clone, Copy)]
pub struct ShortConv {
    pub weight: ParamId,
    pub bias: Option<ParamId>,
    pub channels: usize,
    pub width: usize,
    pub offset: usize,
    pub stride: usize,
    pub silu: bool,
    /// Its inputs' index in the layer's state ([`ScanState::conv`]).
    pub slot: usize,
}

/// Bytes of each named buffer, for the memory plan `foxlm train` prints.
#[derive(Clone, Debug, Default)]
pub struct MemoryPlan {
    pub items: Vec<(String, usize)>,
}

impl MemoryPlan {
    pub fn add(&mut self, what: impl Into<String>, bytes: usize) {
        self.items.push((what.into(), bytes));
    }
    pub fn total(&self) -> usize {
        self.items.iter().map(|(_, b)| b).sum()
    }
}
