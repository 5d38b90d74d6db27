//! The CUDA backend: activations in `T` (bf16 for training, f32 to check against the CPU), fp32
//! master weights with `T` working copies of the matrices, fp32 gradients and AdamW state, all on
//! one GPU. GEMMs through cuBLASLt (`fox_kernels::cuda::gemm`), the small ops from
//! `fox_kernels::cuda::ops`, Forgetting Attention from the FlashAttention-style kernels (bf16,
//! head dim 64/128) or the simple f32 kernel (f32, and other head dims).
//!
//! Everything a step touches is allocated in [`Cuda::new`], [`Cuda::new_batch`] and the model's
//! `ModelActs::new` / `Scratch::new`: the step itself allocates nothing on the device.

use super::{Alloc, Backend, BatchInfo};
use crate::model::attention::ops::AttnShape;
use crate::model::cache::LayerState;
use crate::model::mamba::cuda::GpuMambaState;
use crate::model::mamba2::cuda::GpuMamba2State;
use crate::model::{Linear, MemoryPlan, Model};
use crate::optim::{AdamW, AdamWConfig};
use crate::tensor::{ParamId, ParamKind, Params};
use anyhow::{anyhow, bail, ensure, Context, Result};
use fox_kernels::cuda::attention::{self as ga, DType, DevProblem, DevView, DevVisibility};
use fox_kernels::cuda::compile::MODEL;
use fox_kernels::cuda::cudarc::driver as cudarc_event;
use fox_kernels::cuda::cudarc::driver::{CudaSlice, CudaView, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg};
use fox_kernels::cuda::gemm::Gemm;
use fox_kernels::cuda::nccl::{self, Nccl};
use fox_kernels::cuda::ops::{self, EmbeddingIndex};
use fox_kernels::cuda::{Elem, Gpu};
use std::sync::Arc;

pub(crate) mod decode;
mod fused;
pub(crate) mod recurrent;
pub use decode::DeviceSampling;
pub use fused::fused_decode_covers;
pub(crate) use recurrent::{grown, ssm_scratch_floats, SsmScratch};

/// One layer's decode cache on the device (kernels/decode.cu): keys and values [B, H_kv, cap, D]
/// in the activation dtype, the running gate sums c [B, H, cap] in f32 (per query head, as the
/// gate; so a step adds one log f and never recomputes a prefix sum), and each row's last unmixed
/// k̃, ṽ [B, H_kv·D] for KV-shift. A sliding window keeps every position: the attention kernels
/// mask the keys outside it.
pub struct GpuCache<T> {
    pub k: CudaSlice<T>,
    pub v: CudaSlice<T>,
    pub c: CudaSlice<f32>,
    pub k_shift: CudaSlice<T>,
    pub v_shift: CudaSlice<T>,
    /// Positions filled (the same for every row: rows are left-padded to a common length).
    pub len: usize,
    pub cap: usize,
    pub batch: usize,
    /// Query heads H (of c) and k/v heads H_kv (of k, v and the KV-shift states).
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The current step's k, v and c are in the cache already (a fused decode step wrote them),
    /// so its attention only reads.
    pub staged: bool,
}

/// Element counts of one layer's cache buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLens {
    /// k and v, each.
    pub kv: usize,
    pub c: usize,
    /// k_shift and v_shift, each.
    pub shift: usize,
}

/// Why the CUDA backend cannot run `model` (for training when `training`), if it cannot: a layer
/// whose sizes the CUDA kernels do not take.
pub fn unsupported(model: &Model, _training: bool) -> Option<String> {
    model.layers.iter().find_map(|blk| match &blk.mixer {
        crate::model::Mixer::Attention(_) => None,
        crate::model::Mixer::DeltaNet(l) => Some(format!(
            "{}: {}",
            if l.sizes().gated { "Gated DeltaNet" } else { "DeltaNet" },
            crate::model::deltanet::cuda::NO_GPU_KERNELS
        )),
        crate::model::Mixer::Hgrn2(_) => Some(format!("HGRN2: {}", crate::model::hgrn2::cuda::NO_GPU_KERNELS)),
        crate::model::Mixer::Mamba2(l) => {
            let s = l.sizes();
            let ok = s.head_dim <= 64 && s.state <= 128 && (1..=8).contains(&s.conv) && s.groups == 1;
            (!ok).then(|| {
                format!(
                    "the GPU's Mamba-2 kernels take head_dim ≤ 64, state_size ≤ 128, conv_kernel ≤ 8 and n_groups = 1 \
                     (this model: {}, {}, {}, {}); run it with --device cpu",
                    s.head_dim, s.state, s.conv, s.groups
                )
            })
        }
        crate::model::Mixer::Mamba(l) => {
            let s = l.sizes();
            let ok = s.state <= fox_kernels::cuda::selective_scan::MAX_STATE && (1..=8).contains(&s.conv);
            (!ok).then(|| {
                format!(
                    "the GPU's Mamba kernels take state_size ≤ {} and conv_kernel ≤ 8 (this model: {}, {}); run it \
                     with --device cpu",
                    fox_kernels::cuda::selective_scan::MAX_STATE,
                    s.state,
                    s.conv
                )
            })
        }
    })
}

/// One layer's inference state on the GPU.
pub type GpuLayerState<T> = LayerState<
    GpuCache<T>,
    GpuMamba2State,
    GpuMambaState,
    crate::model::deltanet::cuda::GpuDeltaNetState,
    crate::model::hgrn2::cuda::GpuHgrn2State,
>;

impl<T> GpuLayerState<T> {
    /// Tokens this layer has seen (host side).
    pub fn len(&self) -> usize {
        match self {
            LayerState::Attention(c) => c.len,
            LayerState::Mamba2(s) => s.len,
            LayerState::Mamba(s) => s.len,
            LayerState::DeltaNet(s) => match *s {},
            LayerState::Hgrn2(s) => match *s {},
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The host-side length again after CUDA graph replays (which advanced only the device's),
    /// with nothing staged.
    pub fn reset_len(&mut self, len: usize) {
        match self {
            LayerState::Attention(c) => {
                c.len = len;
                c.staged = false;
            }
            LayerState::Mamba2(s) => s.len = len,
            LayerState::Mamba(s) => s.len = len,
            LayerState::DeltaNet(s) => match *s {},
            LayerState::Hgrn2(s) => match *s {},
        }
    }
}

impl<T: Elem> GpuCache<T> {
    /// What [`Cuda::new_caches`] allocates per layer for `batch` rows of `cap` positions.
    pub fn lens(batch: usize, heads: usize, kv_heads: usize, head_dim: usize, cap: usize) -> CacheLens {
        CacheLens { kv: batch * kv_heads * cap * head_dim, c: batch * heads * cap, shift: batch * kv_heads * head_dim }
    }

    /// Device bytes of one layer's cache.
    pub fn bytes(batch: usize, heads: usize, kv_heads: usize, head_dim: usize, cap: usize) -> usize {
        let l = Self::lens(batch, heads, kv_heads, head_dim, cap);
        (2 * l.kv + 2 * l.shift) * std::mem::size_of::<T>() + l.c * std::mem::size_of::<f32>()
    }
}

/// A parameter on the device: the fp32 master, the `T` working copy of a matrix (GEMMs and the
/// embedding read it), and the fp32 gradient.
pub struct DeviceParam<T> {
    pub master: CudaSlice<f32>,
    pub copy: Option<CudaSlice<T>>,
    pub grad: CudaSlice<f32>,
}

/// ZeRO-1 over the ranks of a data-parallel run (see `crate::dist`): every tensor is cut into
/// `world` shards. Each rank keeps the whole gradients and working copies (padded to `world`
/// shards), the whole fp32 weights of the vectors (norms, biases: the forward reads them), but
/// only its shard of the matrices' fp32 master weights and of every AdamW moment.
pub struct Zero1 {
    pub nccl: Nccl,
    pub shards: crate::dist::Shards,
    /// Reduce each bucket of gradients as soon as the backward is done with it (set for the
    /// last micro-batch of a step).
    pub reduce: bool,
    /// Parameters whose gradients are not reduced yet this step.
    pending: Vec<bool>,
    /// A few f64 on the device for [`Cuda::dist_sum`].
    scalars: CudaSlice<f64>,
    /// Events on the NCCL stream around each group of collectives, while they are timed
    /// ([`Cuda::start_comm_timing`]): start, end, start, end, ...
    comm_marks: Option<Vec<cudarc_event::CudaEvent>>,
}

impl Zero1 {
    /// Marks the start or the end of a group of collectives on the NCCL stream (when timed). A
    /// start recorded after [`Nccl::after`] completes when the stream is free to run the group.
    pub(crate) fn comm_mark(&mut self) -> Result<()> {
        if let Some(m) = self.comm_marks.as_mut() {
            m.push(self.nccl.stream().record_event(Some(TIMING)).map_err(|e| anyhow!("recording an event: {e:?}"))?);
        }
        Ok(())
    }
}

/// AdamW's moments on the device, one pair per trainable parameter.
pub struct DeviceAdamW {
    pub config: AdamWConfig,
    pub step: u64,
    pub m: Vec<CudaSlice<f32>>,
    pub v: Vec<CudaSlice<f32>>,
}

/// The simple f32 attention runs on f32 copies when activations are bf16 but the fast kernels
/// do not cover the head dim (the tiny fixtures' 32).
pub(crate) struct F32Attn {
    pub(crate) q: CudaSlice<f32>,
    pub(crate) k: CudaSlice<f32>,
    pub(crate) v: CudaSlice<f32>,
    pub(crate) o: CudaSlice<f32>,
    pub(crate) dout: CudaSlice<f32>,
    pub(crate) dq: CudaSlice<f32>,
    pub(crate) dk: CudaSlice<f32>,
    pub(crate) dv: CudaSlice<f32>,
}

/// Events that can be timed (cudarc's default disables timing).
const TIMING: cudarc_event::sys::CUevent_flags = cudarc_event::sys::CUevent_flags::CU_EVENT_DEFAULT;

pub use super::Family;

pub struct Cuda<T: Elem> {
    pub gpu: Arc<Gpu>,
    /// With profiling on, an event at the start of every operation, with its family.
    pub(crate) prof: Option<Vec<(Family, cudarc_event::CudaEvent)>>,
    pub(crate) gemm: Gemm,
    pub params: Vec<DeviceParam<T>>,
    pub kinds: Vec<ParamKind>,
    pub names: Vec<String>,
    pub opt: Option<DeviceAdamW>,
    /// Output head: rows per chunk, the chunk's f32 logits and T dlogits, its hidden rows, their
    /// gradient, targets and losses.
    pub(crate) head_rows: usize,
    pub(crate) head_logits: CudaSlice<f32>,
    pub(crate) head_dlogits: CudaSlice<T>,
    pub(crate) head_x: CudaSlice<T>,
    pub(crate) head_dx: CudaSlice<T>,
    pub(crate) head_targets: CudaSlice<i32>,
    pub(crate) head_losses: CudaSlice<f32>,
    /// Per-row losses of the current micro-step and the number of rows with a target.
    pub(crate) losses: CudaSlice<f32>,
    pub(crate) loss_rows: usize,
    pub(crate) loss_targets: usize,
    pub(crate) loss_host: Vec<f32>,
    /// Attention backward: dck and delta [B·H·T] (the kernel's query and key terms of dc apart).
    pub(crate) dck: CudaSlice<f32>,
    pub(crate) delta: CudaSlice<f32>,
    pub(crate) f32_attn: Option<F32Attn>,
    /// Sum of squares of each gradient (one slot per parameter), for the global norm.
    pub(crate) sumsq: CudaSlice<f32>,
    pub(crate) max_rows: usize,
    pub(crate) d_model: usize,
    pub(crate) vocab: usize,
    /// The head's rows on the device (vocab rounded up to a multiple of 64).
    pub(crate) vocab_pad: usize,
    /// Each parameter's element count on the host (the head's device buffers are longer).
    pub(crate) numel: Vec<usize>,
    /// Decoding: the split-K kernel's partials, sized on first use.
    pub(crate) decode_scratch: Option<ga::DecodeScratch>,
    /// While a decode step is captured as a CUDA graph: the cached length on the device, which
    /// the cache kernels and the decode kernel read instead of the host's.
    pub(crate) decode_pos: Option<CudaSlice<i32>>,
    /// Linears of at most `ops::GEMV_ROWS` rows (decode steps) through the matrix-vector kernel
    /// instead of cuBLASLt; on by default.
    pub gemv: bool,
    /// Stacked projections for fused decode steps ([`Cuda::prepare_fused_decode`]).
    fused: fused::FusedDecode<T>,
    /// Data-parallel training with sharded optimizer state ([`Cuda::enable_zero1`]).
    pub zero: Option<Zero1>,
    pub(crate) ssm: SsmScratch,
}

/// The batch on the device.
pub struct GpuBatch {
    pub batch: usize,
    pub seq: usize,
    pub(crate) ids: CudaSlice<i32>,
    pub(crate) targets: CudaSlice<i32>,
    pub(crate) start: CudaSlice<i32>,
    pub(crate) start_host: Option<Vec<usize>>,
    /// Each row's first real position within this batch's T positions (start − past, clipped
    /// to 0..T): what the recurrent layers' kernels read. Set only where some row has padding
    /// here.
    pub(crate) chunk_start: CudaSlice<i32>,
    pub(crate) chunk_padded: bool,
    pub(crate) positions: CudaSlice<i32>,
    pub(crate) emb: EmbeddingIndex,
    host_i32: Vec<i32>,
    pub(crate) n_targets: usize,
    /// Positions already in the decode cache before this batch's tokens.
    pub(crate) past: usize,
}

impl GpuBatch {
    /// The rows' first real positions within this batch (see `chunk_start`), or none where no
    /// row is padded here.
    pub(crate) fn chunk_start(&self) -> Option<&CudaSlice<i32>> {
        self.chunk_padded.then_some(&self.chunk_start)
    }
}

pub(crate) fn fast_attention_dims(head_dim: usize) -> bool {
    head_dim == 64 || head_dim == 128
}

pub(crate) fn bf16<T: Elem>() -> bool {
    T::NAME == "bf16"
}

impl<T: Elem> Cuda<T> {
    /// Uploads the model's parameters and plans every buffer of a step on [batch, seq] tokens
    /// (the activations are planned by the model: `ModelActs::new`, `Scratch::new`).
    pub fn new(gpu: Arc<Gpu>, model: &Model, batch: usize, seq: usize, train: bool) -> Result<Self> {
        let p = &model.params;
        let gemm = Gemm::new(&gpu).context("cuBLASLt")?;
        let cfg = &model.config;
        // Attention heads (Samba's are its attention layers', not a top-level num_heads).
        let h = if cfg.arch() == crate::config::Arch::Samba { cfg.samba_attn().0 } else { cfg.num_heads };
        let (rows, vocab, d) = (batch * seq, cfg.vocab_size, cfg.hidden_size);
        let vocab_pad = padded_vocab(vocab);
        let head = model.lm_head.weight.0;
        let mut params = Vec::with_capacity(p.len());
        for (i, t) in p.tensors.iter().enumerate() {
            // The head's rows are padded with zeros to a multiple of 64 (see `padded_vocab`);
            // padded rows get zero gradients, so AdamW keeps them zero.
            let cap = if i == head { vocab_pad * d } else { t.numel() };
            let mut master = gpu.zeros::<f32>(cap)?;
            upload_into(&gpu, &t.data, &mut master).with_context(|| format!("uploading {}", p.names[i]))?;
            let copy = if p.kinds[i] == ParamKind::Matrix {
                let mut c = gpu.zeros::<T>(cap)?;
                ops::cast_from_f32(&gpu, &mut c, &master, cap)?;
                Some(c)
            } else {
                None
            };
            let grad = gpu.zeros::<f32>(if train { cap } else { 1 })?;
            params.push(DeviceParam { master, copy, grad });
        }
        let head_rows = head_chunk_rows(vocab_pad, rows);
        let hd = cfg.head_dim();
        let has_attention = model.layers.iter().any(|b| b.attn().is_some());
        let f32_attn = if bf16::<T>() && has_attention && !fast_attention_dims(hd) {
            let n = rows * d;
            Some(F32Attn {
                q: gpu.zeros(n)?,
                k: gpu.zeros(n)?,
                v: gpu.zeros(n)?,
                o: gpu.zeros(n)?,
                dout: gpu.zeros(n)?,
                dq: gpu.zeros(n)?,
                dk: gpu.zeros(n)?,
                dv: gpu.zeros(n)?,
            })
        } else {
            None
        };
        // The small ops' reductions (RMSNorm weight gradients, bias sums) share one scratch.
        ops::reserve_scratch(&gpu, ops::scratch_floats(rows * h, d.max(vocab.min(4096))))?;
        let mut ssm = SsmScratch::default();
        let (big, small) = ssm_scratch_floats(model, batch, seq, train);
        if big > 0 {
            grown(&gpu, &mut ssm.big, big)?;
        }
        if small > 0 {
            grown(&gpu, &mut ssm.small, small)?;
        }
        Ok(Self {
            ssm,
            head_rows,
            head_logits: gpu.zeros(head_rows * vocab_pad)?,
            head_dlogits: gpu.zeros(head_rows * vocab_pad)?,
            head_x: gpu.zeros(head_rows * d)?,
            head_dx: gpu.zeros(head_rows * d)?,
            head_targets: gpu.zeros(head_rows)?,
            head_losses: gpu.zeros(head_rows)?,
            losses: gpu.zeros(rows)?,
            loss_rows: 0,
            loss_targets: 0,
            loss_host: Vec::with_capacity(rows),
            dck: gpu.zeros(rows * h)?,
            delta: gpu.zeros(rows * h)?,
            f32_attn,
            sumsq: gpu.zeros(p.len())?,
            max_rows: rows,
            d_model: d,
            vocab,
            vocab_pad,
            numel: p.tensors.iter().map(|t| t.numel()).collect(),
            decode_scratch: None,
            decode_pos: None,
            gemv: true,
            fused: Default::default(),
            zero: None,
            gemm,
            params,
            kinds: p.kinds.clone(),
            names: p.names.clone(),
            opt: None,
            prof: None,
            gpu,
        })
    }

    /// Device memory of parameters, gradients, optimizer state and the head's chunk, by name,
    /// on each of `world` ranks (ZeRO-1 shards the matrices' master weights and the moments).
    pub fn memory_plan(model: &Model, batch: usize, seq: usize, train: bool, world: usize, plan: &mut MemoryPlan) {
        let p = &model.params;
        let numel = p.numel();
        let matrix = matrix_numel(p);
        let tb = std::mem::size_of::<T>();
        let (master, moments) = optimizer_state_bytes(model, world);
        if world > 1 && train {
            let largest = p.tensors.iter().map(|t| t.numel()).max().unwrap_or(0);
            plan.add(
                format!(
                    "fp32 master weights: 1/{world} of the matrices, all vectors ({:.1} M in all)",
                    numel as f64 / 1e6
                ),
                master,
            );
            plan.add(format!("{} weight copies of the matrices (whole)", T::NAME), tb * matrix);
            plan.add("fp32 gradients (whole)", 4 * numel);
            plan.add(format!("AdamW moments (fp32 m, v): 1/{world}"), moments);
            plan.add("checkpoint gather buffer (largest tensor)", 4 * largest);
        } else {
            plan.add(format!("fp32 master weights ({:.1} M)", numel as f64 / 1e6), master);
            plan.add(format!("{} weight copies of the matrices", T::NAME), tb * matrix);
            if train {
                plan.add("fp32 gradients", 4 * numel);
                plan.add("AdamW moments (fp32 m, v)", moments);
            }
        }
        let vocab = padded_vocab(model.config.vocab_size);
        let head_rows = head_chunk_rows(vocab, batch * seq);
        plan.add(format!("output head chunk ({head_rows} rows × {vocab} logits)"), head_rows * vocab * (4 + tb));
        plan.add("cuBLASLt workspace", 32 << 20);
        let (big, small) = ssm_scratch_floats(model, batch, seq, train);
        if big + small > 0 {
            plan.add("Mamba-2 SSD scratch (chunk products and states, partial sums)", 4 * (big + small));
        }
    }

    /// Starts recording an event before every operation (a little slower; for `bench train`).
    pub fn start_profile(&mut self) {
        self.prof = Some(Vec::new());
    }

    /// Stops recording and returns, per family, the GPU time (ms) and the number of operations
    /// (each one to a few kernel launches) since [`Cuda::start_profile`]. Waits for the GPU.
    pub fn take_profile(&mut self) -> Result<Vec<(Family, f64, usize)>> {
        let Some(marks) = self.prof.take() else { return Ok(Vec::new()) };
        let end = self.gpu.stream().record_event(Some(TIMING)).map_err(|e| anyhow!("{e:?}"))?;
        self.gpu.sync()?;
        let mut out: std::collections::BTreeMap<Family, (f64, usize)> = Default::default();
        for (i, (fam, ev)) in marks.iter().enumerate() {
            let next = marks.get(i + 1).map_or(&end, |m| &m.1);
            let ms = ev.elapsed_ms(next).map_err(|e| anyhow!("{e:?}"))? as f64;
            let e = out.entry(*fam).or_default();
            e.0 += ms;
            e.1 += 1;
        }
        Ok(out.into_iter().map(|(f, (ms, n))| (f, ms, n)).collect())
    }

    pub(crate) fn mark(&mut self, family: Family) -> Result<()> {
        if let Some(p) = self.prof.as_mut() {
            let e = self.gpu.stream().record_event(Some(TIMING)).map_err(|e| anyhow!("recording an event: {e:?}"))?;
            p.push((family, e));
        }
        Ok(())
    }

    /// Creates AdamW's moments (zeros), or uploads those of a resumed run (with ZeRO-1, this
    /// rank's shard of them).
    pub fn init_optimizer(&mut self, opt: &AdamW) -> Result<()> {
        let mut m = Vec::with_capacity(self.params.len());
        let mut v = Vec::with_capacity(self.params.len());
        for i in 0..self.params.len() {
            let n = self.numel[i];
            ensure!(
                opt.m[i].len() == n && opt.v[i].len() == n,
                "optimizer state of {} has the wrong size",
                self.names[i]
            );
            let (cap, own) = match &self.zero {
                Some(z) => (z.shards.shard[i], z.shards.own_within(i, n)),
                None => (self.params[i].master.len(), 0..n),
            };
            let (mut mi, mut vi) = (self.gpu.zeros::<f32>(cap)?, self.gpu.zeros::<f32>(cap)?);
            upload_into(&self.gpu, &opt.m[i][own.clone()], &mut mi)?;
            upload_into(&self.gpu, &opt.v[i][own], &mut vi)?;
            m.push(mi);
            v.push(vi);
        }
        self.opt = Some(DeviceAdamW { config: opt.config, step: opt.step, m, v });
        Ok(())
    }

    /// Zeroes every gradient (before a step's first micro-batch).
    pub fn zero_grads(&mut self) -> Result<()> {
        self.mark(Family::Optimizer)?;
        let stream = self.gpu.stream().clone();
        for p in &mut self.params {
            stream.memset_zeros(&mut p.grad).map_err(|e| anyhow!("zeroing gradients: {e:?}"))?;
        }
        if let Some(z) = self.zero.as_mut() {
            for (i, k) in self.kinds.iter().enumerate() {
                z.pending[i] = *k != ParamKind::Frozen;
            }
        }
        Ok(())
    }

    /// The global L2 norm of the trainable parameters' gradients (deterministic: fixed-order
    /// sums on the device, then f64 on the host). Waits for the GPU.
    pub fn grad_norm(&mut self) -> Result<f64> {
        self.mark(Family::Optimizer)?;
        // With ZeRO-1: the gradients not reduced during the backward, then each rank's shard
        // sums, added over the ranks.
        self.reduce_grads(0..self.params.len())?;
        if let Some(z) = &self.zero {
            z.nccl.before()?;
        }
        for i in 0..self.params.len() {
            if self.kinds[i] == ParamKind::Frozen {
                continue;
            }
            let (at, n) = match &self.zero {
                Some(z) => (z.shards.own(i).start, z.shards.shard[i]),
                None => (0, self.params[i].grad.len()),
            };
            ops::sum_squares_at(&self.gpu, &mut self.sumsq, i, &self.params[i].grad, at, n)?;
        }
        if let Some(z) = self.zero.as_mut() {
            z.nccl.after()?;
            z.comm_mark()?;
            z.nccl.all_reduce_sum(&mut self.sumsq, self.params.len())?;
            z.comm_mark()?;
            z.nccl.before()?;
        }
        let s = self.gpu.download(&self.sumsq)?;
        Ok(s.iter()
            .zip(&self.kinds)
            .filter(|(_, k)| **k != ParamKind::Frozen)
            .map(|(v, _)| *v as f64)
            .sum::<f64>()
            .sqrt())
    }

    /// One AdamW update with learning rate `lr`, gradients scaled by `grad_scale` (clipping).
    pub fn adamw_step(&mut self, lr: f64, grad_scale: f32) -> Result<()> {
        self.mark(Family::Optimizer)?;
        let opt = self.opt.as_mut().ok_or_else(|| anyhow!("AdamW state not initialised"))?;
        opt.step += 1;
        let c = opt.config;
        for (i, p) in self.params.iter_mut().enumerate() {
            let kind = self.kinds[i];
            if kind == ParamKind::Frozen {
                continue;
            }
            let wd = if kind == ParamKind::Matrix { c.weight_decay as f32 } else { 0.0 };
            // With ZeRO-1 this rank's shard: the matrices' master holds only the shard, the
            // vectors' the whole tensor.
            let (n, at, master_at) = match &self.zero {
                Some(z) => {
                    let at = z.shards.own(i).start;
                    (z.shards.shard[i], at, if p.copy.is_some() { 0 } else { at })
                }
                None => (p.master.len(), 0, 0),
            };
            ops::adamw_shard::<T>(
                &self.gpu,
                (&mut p.master, master_at),
                p.copy.as_mut().map(|c| (c, at)),
                (&p.grad, at),
                &mut opt.m[i],
                &mut opt.v[i],
                n,
                &ops::AdamWUpdate {
                    lr: lr as f32,
                    beta1: c.beta1 as f32,
                    beta2: c.beta2 as f32,
                    eps: c.eps as f32,
                    weight_decay: wd,
                    step: opt.step,
                    grad_scale,
                },
            )?;
        }
        // Every rank's new weights to every rank: the working copies of the matrices, the fp32
        // vectors.
        if let Some(z) = self.zero.as_mut() {
            z.nccl.after()?;
            z.comm_mark()?;
            z.nccl.group_start()?;
            let gathered = (|| -> Result<()> {
                for (i, p) in self.params.iter_mut().enumerate() {
                    if self.kinds[i] == ParamKind::Frozen {
                        continue;
                    }
                    let shard = z.shards.shard[i];
                    match p.copy.as_mut() {
                        Some(c) => z.nccl.all_gather_as(c, shard, nccl::elem_type::<T>())?,
                        None => z.nccl.all_gather(&mut p.master, shard)?,
                    }
                }
                Ok(())
            })();
            z.nccl.group_end()?;
            gathered?;
            z.comm_mark()?;
            z.nccl.before()?;
        }
        Ok(())
    }

    /// Turns this backend into one rank of a data-parallel run with ZeRO-1 (before
    /// [`Cuda::init_optimizer`]): pads the gradients and working copies to `world` shards and
    /// keeps only this rank's shard of the matrices' master weights.
    pub fn enable_zero1(&mut self, nccl: Nccl) -> Result<()> {
        ensure!(self.opt.is_none(), "enable_zero1 must come before init_optimizer");
        let (rank, world) = (nccl.rank, nccl.world);
        let shards = crate::dist::Shards::new(self.params.iter().map(|p| p.master.len()), rank, world);
        let gpu = self.gpu.clone();
        for (i, p) in self.params.iter_mut().enumerate() {
            let (cap, pad, own) = (p.master.len(), shards.padded(i), shards.own(i));
            if p.grad.len() == cap {
                p.grad = gpu.zeros(pad)?;
            }
            if let Some(c) = p.copy.as_mut() {
                let mut whole = gpu.zeros::<T>(pad)?;
                dtod(&gpu, c, 0, &mut whole, 0, cap)?;
                *c = whole;
                // The matrix's fp32 weights: this rank's shard only.
                let mut mine = gpu.zeros::<f32>(shards.shard[i])?;
                let have = own.start.min(cap)..own.end.min(cap);
                dtod(&gpu, &p.master, have.start, &mut mine, 0, have.len())?;
                p.master = mine;
            } else {
                let mut whole = gpu.zeros::<f32>(pad)?;
                dtod(&gpu, &p.master, 0, &mut whole, 0, cap)?;
                p.master = whole;
            }
        }
        let n = self.params.len();
        self.zero = Some(Zero1 {
            nccl,
            shards,
            reduce: false,
            pending: vec![false; n],
            scalars: gpu.zeros::<f64>(8)?,
            comm_marks: None,
        });
        gpu.sync()
    }

    /// (rank, world) of a data-parallel run; (0, 1) otherwise.
    pub fn world(&self) -> (usize, usize) {
        self.zero.as_ref().map_or((0, 1), |z| (z.nccl.rank, z.nccl.world))
    }

    /// Sets whether the backward reduces each bucket of gradients as it finishes it.
    pub fn set_reduce(&mut self, on: bool) {
        if let Some(z) = self.zero.as_mut() {
            z.reduce = on;
        }
    }

    /// Starts timing the collectives of this rank (no-op without NCCL), for `bench train`.
    pub fn start_comm_timing(&mut self) {
        if let Some(z) = self.zero.as_mut() {
            z.comm_marks = Some(Vec::new());
        }
    }

    /// Stops timing and returns the GPU time (ms) the NCCL stream spent in collectives since
    /// [`Cuda::start_comm_timing`] (waits for the other ranks included; much of it overlaps
    /// the backward), or None without NCCL. Waits for the GPU.
    pub fn take_comm_ms(&mut self) -> Result<Option<f64>> {
        let Some(z) = self.zero.as_mut() else { return Ok(None) };
        let Some(marks) = z.comm_marks.take() else { return Ok(None) };
        z.nccl.sync()?;
        self.gpu.sync()?;
        let mut ms = 0.0;
        for pair in marks.chunks_exact(2) {
            ms += pair[0].elapsed_ms(&pair[1]).map_err(|e| anyhow!("{e:?}"))? as f64;
        }
        Ok(Some(ms))
    }

    /// Starts the reduce-scatter of the gradients of `ids` not yet reduced this step, on the
    /// NCCL stream after the work queued so far.
    pub(crate) fn reduce_grads(&mut self, ids: std::ops::Range<usize>) -> Result<()> {
        let Some(z) = self.zero.as_mut() else { return Ok(()) };
        if !ids.clone().any(|i| z.pending[i]) {
            return Ok(());
        }
        z.nccl.after()?;
        z.comm_mark()?;
        z.nccl.group_start()?;
        let res = (|| -> Result<()> {
            for i in ids {
                if z.pending[i] {
                    z.nccl.reduce_scatter_sum(&mut self.params[i].grad, z.shards.shard[i])?;
                    z.pending[i] = false;
                }
            }
            Ok(())
        })();
        z.nccl.group_end()?;
        res?;
        z.comm_mark()
    }

    /// `vals` summed over the ranks (no-op on one GPU without NCCL). Waits for the GPU.
    pub fn dist_sum(&mut self, vals: &mut [f64]) -> Result<()> {
        let Some(z) = self.zero.as_mut() else { return Ok(()) };
        ensure!(vals.len() <= z.scalars.len(), "dist_sum of {} values (at most {})", vals.len(), z.scalars.len());
        let mut dst = z.scalars.slice_mut(0..vals.len());
        self.gpu.stream().memcpy_htod(vals, &mut dst).map_err(|e| anyhow!("host-to-device copy: {e:?}"))?;
        z.nccl.after()?;
        z.comm_mark()?;
        z.nccl.all_reduce_sum(&mut z.scalars, vals.len())?;
        z.comm_mark()?;
        z.nccl.before()?;
        self.gpu
            .stream()
            .memcpy_dtoh(&z.scalars.slice(0..vals.len()), vals)
            .map_err(|e| anyhow!("device-to-host copy: {e:?}"))?;
        self.gpu.sync()
    }

    /// Tensor `i` of a sharded `buf` (this rank's shard at `at` of a buffer of the padded
    /// tensor, or the shard alone) gathered whole into the host `out`.
    pub(crate) fn gather_to_host(
        &self,
        i: usize,
        shard_buf: &CudaSlice<f32>,
        at: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let z = self.zero.as_ref().ok_or_else(|| anyhow!("gather without ZeRO-1"))?;
        let (shard, own) = (z.shards.shard[i], z.shards.own(i));
        let mut whole = self.gpu.zeros::<f32>(z.shards.padded(i))?;
        dtod(&self.gpu, shard_buf, at, &mut whole, own.start, shard)?;
        z.nccl.after()?;
        z.nccl.all_gather(&mut whole, shard)?;
        z.nccl.before()?;
        let n = out.len();
        self.gpu.stream().memcpy_dtoh(&whole.slice(0..n), out).map_err(|e| anyhow!("{e:?}"))?;
        self.gpu.sync()
    }

    /// Copies the fp32 master weights into `params` (for a checkpoint or a CPU check).
    pub fn download_params(&self, params: &mut Params) -> Result<()> {
        for (i, p) in self.params.iter().enumerate() {
            let n = self.numel[i];
            if self.zero.is_some() && p.copy.is_some() {
                // A matrix's fp32 weights are sharded: every rank takes part in the gather.
                self.gather_to_host(i, &p.master, 0, params.tensors[i].data.as_mut_slice())?;
                continue;
            }
            self.gpu
                .stream()
                .memcpy_dtoh(&p.master.slice(0..n), params.tensors[i].data.as_mut_slice())
                .map_err(|e| anyhow!("{e:?}"))?;
        }
        self.gpu.sync()
    }

    /// Copies the gradients into `grads` (shaped like the parameters).
    pub fn download_grads(&self, grads: &mut [Vec<f32>]) -> Result<()> {
        for (i, p) in self.params.iter().enumerate() {
            let g = self.gpu.download(&p.grad)?;
            let n = grads[i].len();
            grads[i].copy_from_slice(&g[..n]);
        }
        Ok(())
    }

    /// Copies AdamW's moments and step into `opt`.
    pub fn download_optimizer(&self, opt: &mut AdamW) -> Result<()> {
        let o = self.opt.as_ref().ok_or_else(|| anyhow!("AdamW state not initialised"))?;
        opt.step = o.step;
        for i in 0..self.params.len() {
            let n = self.numel[i];
            if self.zero.is_some() {
                self.gather_to_host(i, &o.m[i], 0, &mut opt.m[i])?;
                self.gather_to_host(i, &o.v[i], 0, &mut opt.v[i])?;
                continue;
            }
            opt.m[i] = self.gpu.stream().clone_dtoh(&o.m[i].slice(0..n)).map_err(|e| anyhow!("{e:?}"))?;
            opt.v[i] = self.gpu.stream().clone_dtoh(&o.v[i].slice(0..n)).map_err(|e| anyhow!("{e:?}"))?;
        }
        Ok(())
    }

    pub(crate) fn copy_of(&self, id: ParamId) -> Result<&CudaSlice<T>> {
        self.params[id.0]
            .copy
            .as_ref()
            .ok_or_else(|| anyhow!("{} has no working copy (not a matrix)", self.names[id.0]))
    }

    /// An elementwise kernel of kernels/model.cu: (ptr, [ptr,] n).
    pub(crate) fn launch_elementwise(&self, name: &str, p1: u64, p2: Option<u64>, n: usize) -> Result<()> {
        let f = self.gpu.function(&MODEL, name)?;
        let cfg = grid(n);
        let n = n as i64;
        let mut b = self.gpu.stream().launch_builder(&f);
        b.arg(&p1);
        if let Some(p2) = &p2 {
            b.arg(p2);
        }
        b.arg(&n);
        // SAFETY: the kernels take (T*, [const T*,] long long n) over buffers of at least n
        // elements (the callers' lengths).
        unsafe { b.launch(cfg) }.map_err(|e| anyhow!("launching {name}: {e:?}"))?;
        Ok(())
    }

    /// y = x · Wᵀ into Y (T or f32): the matrix-vector kernel for a decode step's few rows,
    /// cuBLASLt otherwise.
    pub(crate) fn linear_into<Y: Elem>(
        &mut self,
        y: &mut CudaSlice<Y>,
        x: &CudaSlice<T>,
        w: &Linear,
        rows: usize,
    ) -> Result<()> {
        self.mark(Family::Gemm)?;
        let (k, n) = (w.in_features, w.out_features);
        if self.gemv && ops::gemv_fits::<T>(rows, k) {
            return ops::gemv::<T, Y>(&self.gpu, y, x, self.copy_of(w.weight)?, rows, k, n);
        }
        self.gemm.linear_fwd::<T, Y>(y, false, x, self.copy_of(w.weight)?, rows, k, n)
    }

    pub(crate) fn dptr<U>(&self, s: &CudaSlice<U>) -> u64 {
        let (p, _g) = s.device_ptr(self.gpu.stream());
        p
    }

    /// The fused cross-entropy of kernels/model.cu over the head chunk's `m` rows of `vocab`
    /// logits stored `ld` apart.
    pub(crate) fn cross_entropy_ld(&mut self, weight: f32, m: usize, vocab: usize, ld: usize) -> Result<()> {
        ensure!(
            self.head_logits.len() >= m * ld && self.head_dlogits.len() >= m * ld && self.head_losses.len() >= m,
            "head chunk buffers too short"
        );
        let f = self.gpu.function(&MODEL, &format!("fox_cross_entropy_ld_{}", T::NAME))?;
        let cfg = LaunchConfig { grid_dim: (m as u32, 1, 1), block_dim: (512, 1, 1), shared_mem_bytes: 0 };
        let (pd, pl, px, pt) = (
            self.dptr(&self.head_dlogits),
            self.dptr(&self.head_losses),
            self.dptr(&self.head_logits),
            self.dptr(&self.head_targets),
        );
        let (v, l) = (vocab as i32, ld as i32);
        let mut b = self.gpu.stream().launch_builder(&f);
        b.arg(&pd).arg(&pl).arg(&px).arg(&pt).arg(&weight).arg(&v).arg(&l);
        // SAFETY: arguments as in kernels/model.cu; buffer lengths checked above.
        unsafe { b.launch(cfg) }.map_err(|e| anyhow!("launching the cross-entropy kernel: {e:?}"))?;
        Ok(())
    }

    pub(crate) fn vis<'a>(&self, b: &'a GpuBatch) -> DevVisibility<'a> {
        match b.start_host {
            Some(_) => DevVisibility::LeftPadded(&b.start),
            None => DevVisibility::All,
        }
    }

    pub(crate) fn start<'a>(&self, b: &'a GpuBatch) -> Option<&'a CudaSlice<i32>> {
        b.start_host.as_ref().map(|_| &b.start)
    }
}

/// The optimizer's state on each of `world` ranks, in bytes: (fp32 master weights, AdamW
/// moments). ZeRO-1 keeps 1/world of the matrices' master weights (the vectors whole: the forward
/// reads them) and 1/world of every moment; one rank holds all of it.
pub fn optimizer_state_bytes(model: &Model, world: usize) -> (usize, usize) {
    let p = &model.params;
    let (numel, matrix) = (p.numel(), matrix_numel(p));
    if world <= 1 {
        return (4 * numel, 8 * numel);
    }
    let shard = |n: usize| n.div_ceil(world);
    (4 * (shard(matrix) + numel - matrix), 8 * shard(numel))
}

/// Elements of the matrices (the parameters that get bf16 copies and sharded master weights).
fn matrix_numel(p: &crate::tensor::Params) -> usize {
    p.tensors.iter().zip(&p.kinds).filter(|(_, k)| **k == ParamKind::Matrix).map(|(t, _)| t.numel()).sum()
}

/// The output head's rows on the GPU: the vocabulary rounded up to a multiple of 64. With 50257
/// rows (an odd leading dimension) cuBLASLt falls back to kernels 5x slower than with 50304
/// (measured on an H100, 2026-11-24: about 100 against 520-700 TFLOP/s).
pub fn padded_vocab(vocab: usize) -> usize {
    vocab.next_multiple_of(64)
}

/// Rows of the output head per chunk: about 64 M logits at a time.
fn head_chunk_rows(vocab_pad: usize, rows: usize) -> usize {
    ((1usize << 26) / vocab_pad.max(1)).clamp(1, rows.max(1))
}

/// A grid-stride launch of 256-thread blocks over n elements (the small kernels of model.cu and
/// decode.cu).
fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 65535) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// Host data into the start of a (possibly longer) device buffer.
fn upload_into(gpu: &Gpu, src: &[f32], dst: &mut CudaSlice<f32>) -> Result<()> {
    ensure!(src.len() <= dst.len(), "upload of {} values into a buffer of {}", src.len(), dst.len());
    if src.is_empty() {
        return Ok(());
    }
    let mut v = dst.slice_mut(0..src.len());
    gpu.stream().memcpy_htod(src, &mut v).map_err(|e| anyhow!("host-to-device copy: {e:?}"))
}

/// dst[d0..d0+n] = src[s0..s0+n] on the stream.
pub(crate) fn dtod<U: DeviceRepr>(
    gpu: &Gpu,
    src: &CudaSlice<U>,
    s0: usize,
    dst: &mut CudaSlice<U>,
    d0: usize,
    n: usize,
) -> Result<()> {
    ensure!(s0 + n <= src.len() && d0 + n <= dst.len(), "device copy out of bounds");
    let sv = src.slice(s0..s0 + n);
    let mut dv = dst.slice_mut(d0..d0 + n);
    gpu.stream().memcpy_dtod(&sv, &mut dv).map_err(|e| anyhow!("device copy: {e:?}"))
}

/// A pitched device copy: `height` runs of `width` elements, run r from `s0 + r·spitch` of `src`
/// to `d0 + r·dpitch` of `dst` (one driver call for what would be `height` copies: a cache row's
/// positions across its heads).
#[allow(clippy::too_many_arguments)]
pub(crate) fn dtod_2d<U: DeviceRepr>(
    gpu: &Gpu,
    src: &CudaSlice<U>,
    s0: usize,
    spitch: usize,
    dst: &mut CudaSlice<U>,
    d0: usize,
    dpitch: usize,
    width: usize,
    height: usize,
) -> Result<()> {
    use fox_kernels::cuda::cudarc::driver::{sys, DevicePtrMut};
    if width == 0 || height == 0 {
        return Ok(());
    }
    ensure!(width <= spitch && width <= dpitch, "pitched copy: runs of {width} wider than their pitch");
    ensure!(
        s0 + (height - 1) * spitch + width <= src.len() && d0 + (height - 1) * dpitch + width <= dst.len(),
        "pitched device copy out of bounds"
    );
    let e = std::mem::size_of::<U>();
    let stream = gpu.stream();
    let (ps, _gs) = src.device_ptr(stream);
    let (pd, _gd) = dst.device_ptr_mut(stream);
    // Every field spelled out (the memory-type enum has no zero value, so no mem::zeroed).
    let c = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: ps + (s0 * e) as u64,
        srcArray: std::ptr::null_mut(),
        srcPitch: spitch * e,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
        dstHost: std::ptr::null_mut(),
        dstDevice: pd + (d0 * e) as u64,
        dstArray: std::ptr::null_mut(),
        dstPitch: dpitch * e,
        WidthInBytes: width * e,
        Height: height,
    };
    gpu.context().bind_to_thread().map_err(|e| anyhow!("{e:?}"))?;
    // SAFETY: both ranges lie inside their allocations (checked above), on the buffers' stream.
    unsafe { sys::cuMemcpy2DAsync_v2(&c, stream.cu_stream()) }
        .result()
        .map_err(|e| anyhow!("pitched device copy: {e:?}"))
}

/// The same buffer as f32, when T is f32.
pub(crate) fn as_f32<T: Elem>(s: &CudaSlice<T>) -> Option<&CudaSlice<f32>> {
    (s as &dyn std::any::Any).downcast_ref::<CudaSlice<f32>>()
}
pub(crate) fn as_f32_mut<T: Elem>(s: &mut CudaSlice<T>) -> Option<&mut CudaSlice<f32>> {
    (s as &mut dyn std::any::Any).downcast_mut::<CudaSlice<f32>>()
}

/// The fast kernels' problem for a full-sequence batch: q, k, v as [B, T, H·D] 16-bit views,
/// c [B, H, T], the batch's left padding.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dev_problem<'a>(
    b: &'a GpuBatch,
    q: &'a CudaView<'a, u16>,
    k: &'a CudaView<'a, u16>,
    v: &'a CudaView<'a, u16>,
    c: &'a CudaSlice<f32>,
    prune: Option<&'a CudaSlice<f32>>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
) -> DevProblem<'a> {
    let t = b.seq;
    DevProblem {
        batch: b.batch,
        heads,
        head_dim,
        tq: t,
        tk: t,
        q_pos0: 0,
        dtype: DType::Bf16,
        q: DevView::bthd(q, t, heads, head_dim),
        k: DevView::bthd(k, t, kv_heads, head_dim),
        v: DevView::bthd(v, t, kv_heads, head_dim),
        cq: c,
        ck: c,
        vis: match b.start_host {
            Some(_) => DevVisibility::LeftPadded(&b.start),
            None => DevVisibility::All,
        },
        scale: 1.0 / (head_dim as f32).sqrt(),
        prune,
    }
}

/// The attention kernels' options for a layer's shape.
pub(crate) fn attn_options(shape: AttnShape) -> ga::AttnOptions {
    ga::AttnOptions { kv_heads: (shape.kv_heads != shape.heads).then_some(shape.kv_heads), window: shape.window }
}

/// Views of bf16 activations as the 16-bit words the attention kernels take.
pub(crate) fn words<T: Elem>(s: &CudaSlice<T>) -> Result<CudaView<'_, u16>> {
    ensure!(std::mem::size_of::<T>() == 2, "the fast attention kernels take 16-bit activations");
    // SAFETY: T is bf16 (2 bytes, checked): the same bytes seen as u16 words.
    unsafe { s.transmute::<u16>(s.len()) }.ok_or_else(|| anyhow!("cannot view a bf16 buffer as u16"))
}

impl<T: Elem> Alloc for Cuda<T> {
    type Act = CudaSlice<T>;
    type F32 = CudaSlice<f32>;
    fn alloc(&self, n: usize) -> Result<CudaSlice<T>> {
        self.gpu.zeros(n)
    }
    fn alloc_f32(&self, n: usize) -> Result<CudaSlice<f32>> {
        self.gpu.zeros(n)
    }
}

impl<T: Elem> Backend for Cuda<T> {
    type Batch = GpuBatch;

    fn new_batch(&self, max_rows: usize, batch: usize) -> Result<GpuBatch> {
        Ok(GpuBatch {
            batch: 0,
            seq: 0,
            ids: self.gpu.zeros(max_rows)?,
            targets: self.gpu.zeros(max_rows)?,
            start: self.gpu.zeros(batch.max(1))?,
            start_host: None,
            chunk_start: self.gpu.zeros(batch.max(1))?,
            chunk_padded: false,
            positions: self.gpu.zeros(max_rows)?,
            emb: EmbeddingIndex::new(&self.gpu, max_rows)?,
            host_i32: Vec::with_capacity(max_rows),
            n_targets: 0,
            past: 0,
        })
    }

    fn prepare(
        &mut self,
        b: &mut GpuBatch,
        info: &BatchInfo,
        ids: &[u32],
        targets: Option<&[Option<u32>]>,
    ) -> Result<()> {
        let n = info.batch * info.seq;
        ensure!(n <= self.max_rows && n <= b.ids.len(), "a batch of {n} tokens exceeds the {} planned", self.max_rows);
        ensure!(ids.len() == n && targets.is_none_or(|t| t.len() == n), "ids and targets must be [B, T]");
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.vocab) {
            bail!("token id {bad} outside the vocabulary ({})", self.vocab);
        }
        if let Some(bad) = targets.and_then(|t| t.iter().flatten().find(|&&v| v as usize >= self.vocab)) {
            bail!("target id {bad} outside the vocabulary ({})", self.vocab);
        }
        b.n_targets = targets.map_or(0, |t| t.iter().filter(|t| t.is_some()).count());
        b.past = info.past;
        b.batch = info.batch;
        b.seq = info.seq;
        b.host_i32.clear();
        b.host_i32.extend(ids.iter().map(|&v| v as i32));
        self.gpu.write(&mut b.ids, &b.host_i32)?;
        b.host_i32.clear();
        match targets {
            Some(t) => b.host_i32.extend(t.iter().map(|t| t.map_or(-1, |v| v as i32))),
            None => b.host_i32.resize(n, -1),
        }
        self.gpu.write(&mut b.targets, &b.host_i32)?;
        b.host_i32.clear();
        match info.start {
            Some(s) => {
                ensure!(s.len() == info.batch && s.len() <= b.start.len(), "left padding: one start per row");
                b.host_i32.extend(s.iter().map(|&v| v as i32));
                self.gpu.write(&mut b.start, &b.host_i32)?;
                b.start_host = Some(s.to_vec());
                b.host_i32.clear();
                b.host_i32.extend(s.iter().map(|&v| v.saturating_sub(info.past).min(info.seq) as i32));
                b.chunk_padded = b.host_i32.iter().any(|&v| v > 0);
                if b.chunk_padded {
                    self.gpu.write(&mut b.chunk_start, &b.host_i32)?;
                }
            }
            None => {
                b.start_host = None;
                b.chunk_padded = false;
            }
        }
        // RoPE positions relative to each row's first real token (continuing after the cache).
        b.host_i32.clear();
        let t = info.seq;
        let past = info.past as i32;
        b.host_i32.extend((0..n).map(|r| past + (r % t) as i32 - info.start.map_or(0, |s| s[r / t] as i32)));
        self.gpu.write(&mut b.positions, &b.host_i32)?;
        // The embedding's backward index is needed for training only.
        if targets.is_some() {
            b.emb.update(&self.gpu, ids)?;
        }
        Ok(())
    }

    fn batch_info<'b>(&self, b: &'b GpuBatch) -> BatchInfo<'b> {
        BatchInfo { batch: b.batch, seq: b.seq, start: b.start_host.as_deref(), past: b.past }
    }

    fn embedding_fwd(&mut self, x: &mut CudaSlice<T>, table: ParamId, b: &GpuBatch) -> Result<()> {
        self.mark(Family::Other)?;
        let n = b.batch * b.seq;
        ops::embedding_fwd(&self.gpu, x, self.copy_of(table)?, &b.ids, n, self.d_model)
    }
    fn embedding_bwd(&mut self, table: ParamId, dx: &CudaSlice<T>, b: &GpuBatch) -> Result<()> {
        self.mark(Family::Other)?;
        if self.kinds[table.0] == ParamKind::Frozen {
            return Ok(());
        }
        ops::embedding_bwd(&self.gpu, &mut self.params[table.0].grad, dx, &b.emb, self.d_model)
    }
    fn linear_fwd(&mut self, y: &mut CudaSlice<T>, x: &CudaSlice<T>, w: &Linear, rows: usize) -> Result<()> {
        self.linear_into(y, x, w, rows)
    }
    fn linear_fwd_f32(&mut self, y: &mut CudaSlice<f32>, x: &CudaSlice<T>, w: &Linear, rows: usize) -> Result<()> {
        self.linear_into(y, x, w, rows)
    }
    fn linear_bwd(
        &mut self,
        w: &Linear,
        x: &CudaSlice<T>,
        dy: &CudaSlice<T>,
        dx: Option<&mut CudaSlice<T>>,
        accumulate: bool,
        rows: usize,
    ) -> Result<()> {
        self.mark(Family::Gemm)?;
        let (k, n) = (w.in_features, w.out_features);
        if let Some(dx) = dx {
            self.gemm.linear_bwd_dx(dx, accumulate, dy, self.copy_of(w.weight)?, rows, k, n)?;
        }
        if self.kinds[w.weight.0] != ParamKind::Frozen {
            let g = &mut self.params[w.weight.0].grad;
            self.gemm.linear_bwd_dw(g, dy, x, rows, k, n)?;
        }
        Ok(())
    }
    fn rms_norm_fwd(
        &mut self,
        y: &mut CudaSlice<T>,
        rstd: &mut CudaSlice<f32>,
        x: &CudaSlice<T>,
        w: ParamId,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let rows = x.len() / dim;
        ops::rms_norm_fwd(&self.gpu, y, rstd, x, &self.params[w.0].master, rows, dim, eps)
    }
    fn rms_norm_bwd(
        &mut self,
        dx: &mut CudaSlice<T>,
        accumulate: bool,
        w: ParamId,
        dy: &CudaSlice<T>,
        x: &CudaSlice<T>,
        rstd: &CudaSlice<f32>,
        dim: usize,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let rows = x.len() / dim;
        let p = &mut self.params[w.0];
        ops::rms_norm_bwd(&self.gpu, dx, accumulate, &mut p.grad, dy, x, rstd, &p.master, rows, dim)
    }

    fn add_rms_norm_fwd(
        &mut self,
        h: &mut CudaSlice<T>,
        y: &mut CudaSlice<T>,
        rstd: &mut CudaSlice<f32>,
        a: &CudaSlice<T>,
        b: &CudaSlice<T>,
        w: ParamId,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let rows = a.len() / dim;
        ops::add_rms_norm_fwd(&self.gpu, h, y, rstd, a, b, &self.params[w.0].master, rows, dim, eps)
    }
    fn add_inplace_rms_norm_fwd(
        &mut self,
        h: &mut CudaSlice<T>,
        y: &mut CudaSlice<T>,
        rstd: &mut CudaSlice<f32>,
        b: &CudaSlice<T>,
        w: ParamId,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let rows = h.len() / dim;
        ops::add_rms_norm_inplace(&self.gpu, h, y, rstd, b, &self.params[w.0].master, rows, dim, eps)
    }
    fn add(&mut self, y: &mut CudaSlice<T>, a: &CudaSlice<T>, b: &CudaSlice<T>) -> Result<()> {
        self.mark(Family::Other)?;
        ops::add(&self.gpu, y, a, b, a.len())
    }
    fn add_inplace(&mut self, y: &mut CudaSlice<T>, x: &CudaSlice<T>) -> Result<()> {
        self.mark(Family::Other)?;
        ops::add_inplace(&self.gpu, y, x, x.len())
    }
    fn copy(&mut self, dst: &mut CudaSlice<T>, src: &CudaSlice<T>) -> Result<()> {
        self.mark(Family::Other)?;
        let n = src.len().min(dst.len());
        dtod(&self.gpu, src, 0, dst, 0, n)
    }
    fn sigmoid_inplace(&mut self, x: &mut CudaSlice<T>) -> Result<()> {
        self.mark(Family::Other)?;
        let (n, p) = (x.len(), self.dptr(x));
        self.launch_elementwise(&format!("fox_sigmoid_inplace_{}", T::NAME), p, None, n)
    }
    fn sigmoid_bwd_inplace(&mut self, dy: &mut CudaSlice<T>, y: &CudaSlice<T>) -> Result<()> {
        self.mark(Family::Other)?;
        ensure!(y.len() >= dy.len(), "sigmoid backward: y shorter than dy");
        let (n, pd, py) = (dy.len(), self.dptr(dy), self.dptr(y));
        self.launch_elementwise(&format!("fox_sigmoid_bwd_inplace_{}", T::NAME), pd, Some(py), n)
    }
    fn zero_f32(&mut self, x: &mut CudaSlice<f32>) -> Result<()> {
        self.mark(Family::Other)?;
        self.gpu.stream().memset_zeros(x).map_err(|e| anyhow!("zeroing: {e:?}"))
    }
    fn swiglu_fwd(&mut self, h: &mut CudaSlice<T>, gu: &CudaSlice<T>, rows: usize, inter: usize) -> Result<()> {
        self.mark(Family::Other)?;
        ops::swiglu_fwd(&self.gpu, h, gu, rows, inter)
    }
    fn gate_up_swiglu_fwd(
        &mut self,
        gu: &mut CudaSlice<T>,
        h: &mut CudaSlice<T>,
        x: &CudaSlice<T>,
        gate_proj: &Linear,
        rows: usize,
        inter: usize,
    ) -> Result<()> {
        if self.gemv && ops::gemv_fits::<T>(rows, gate_proj.in_features) && gate_proj.out_features == 2 * inter {
            self.mark(Family::Gemm)?;
            let w = self.copy_of(gate_proj.weight)?;
            return ops::gemv_glu(&self.gpu, gu, h, x, w, rows, gate_proj.in_features, inter);
        }
        self.linear_fwd(gu, x, gate_proj, rows)?;
        self.swiglu_fwd(h, gu, rows, inter)
    }
    fn swiglu_bwd(
        &mut self,
        dgu: &mut CudaSlice<T>,
        dh: &CudaSlice<T>,
        gu: &CudaSlice<T>,
        rows: usize,
        inter: usize,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        ops::swiglu_bwd(&self.gpu, dgu, dh, gu, rows, inter)
    }
    fn gate_mul_fwd(&mut self, z: &mut CudaSlice<T>, pre: &CudaSlice<T>, g: &CudaSlice<T>) -> Result<()> {
        self.mark(Family::Other)?;
        ops::gate_mul_fwd(&self.gpu, z, pre, g, pre.len())
    }
    fn gate_mul_bwd(
        &mut self,
        dpre: &mut CudaSlice<T>,
        dg: &mut CudaSlice<T>,
        dz: &CudaSlice<T>,
        pre: &CudaSlice<T>,
        g: &CudaSlice<T>,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        ops::gate_mul_bwd(&self.gpu, dpre, dg, dz, pre, g, pre.len())
    }
    fn cast_to_act(&mut self, dst: &mut CudaSlice<T>, src: &CudaSlice<f32>) -> Result<()> {
        self.mark(Family::Other)?;
        ops::cast_from_f32(&self.gpu, dst, src, src.len().min(dst.len()))
    }

    fn head_loss(
        &mut self,
        mut dhidden: Option<&mut CudaSlice<T>>,
        hidden: &CudaSlice<T>,
        lm_head: &Linear,
        b: &GpuBatch,
        weight: f32,
    ) -> Result<()> {
        self.mark(Family::Head)?;
        let (d, vocab, vpad) = (lm_head.in_features, lm_head.out_features, self.vocab_pad);
        let rows = b.batch * b.seq;
        ensure!(hidden.len() >= rows * d, "head_loss: hidden holds {} values, {rows}×{d} expected", hidden.len());
        let train = dhidden.is_some() && self.kinds[lm_head.weight.0] != ParamKind::Frozen;
        let gpu = self.gpu.clone();
        let lm = lm_head.weight.0;
        let no_copy = || anyhow!("lm_head has no working copy");
        for r0 in (0..rows).step_by(self.head_rows) {
            let m = self.head_rows.min(rows - r0);
            // This chunk's rows into the chunk buffers (a copy costs far less than the GEMMs).
            self.mark(Family::CrossEntropy)?;
            dtod(&gpu, hidden, r0 * d, &mut self.head_x, 0, m * d)?;
            dtod(&gpu, &b.targets, r0, &mut self.head_targets, 0, m)?;
            self.mark(Family::Head)?;
            let w = self.params[lm].copy.as_ref().ok_or_else(no_copy)?;
            self.gemm.linear_fwd::<T, f32>(&mut self.head_logits, false, &self.head_x, w, m, d, vpad)?;
            self.mark(Family::CrossEntropy)?;
            self.cross_entropy_ld(weight, m, vocab, vpad)?;
            dtod(&gpu, &self.head_losses, 0, &mut self.losses, r0, m)?;
            if let Some(dh) = dhidden.as_deref_mut() {
                self.mark(Family::Head)?;
                let w = self.params[lm].copy.as_ref().ok_or_else(no_copy)?;
                self.gemm.linear_bwd_dx(&mut self.head_dx, false, &self.head_dlogits, w, m, d, vpad)?;
                dtod(&gpu, &self.head_dx, 0, dh, r0 * d, m * d)?;
                if train {
                    let g = &mut self.params[lm].grad;
                    self.gemm.linear_bwd_dw(g, &self.head_dlogits, &self.head_x, m, d, vpad)?;
                }
            }
        }
        self.loss_rows = rows;
        self.loss_targets = b.n_targets;
        Ok(())
    }

    fn take_loss(&mut self) -> Result<(f64, usize)> {
        let rows = std::mem::take(&mut self.loss_rows);
        if rows == 0 {
            return Ok((0.0, 0));
        }
        self.loss_host.resize(rows, 0.0);
        self.gpu
            .stream()
            .memcpy_dtoh(&self.losses.slice(0..rows), self.loss_host.as_mut_slice())
            .map_err(|e| anyhow!("{e:?}"))?;
        self.gpu.sync()?;
        // Rows without a target have loss 0.
        Ok((self.loss_host.iter().map(|&v| v as f64).sum(), std::mem::take(&mut self.loss_targets)))
    }

    fn grads_ready(&mut self, ids: std::ops::Range<usize>) -> Result<()> {
        if self.zero.as_ref().is_some_and(|z| z.reduce) {
            self.mark(Family::Optimizer)?;
            self.reduce_grads(ids)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::GpuCache;
    use crate::model::attention::kv_cache::KvCache;

    /// The GPU cache holds what the CPU's holds (k, v and the KV-shift states per k/v head, c per
    /// query head), in the activation dtype for k, v and the shift states.
    #[test]
    fn gpu_cache_sizes_follow_the_kv_heads() {
        for (b, h, hkv, d, cap) in [(1, 4, 4, 16, 9), (2, 4, 2, 64, 300), (3, 8, 1, 128, 17), (2, 6, 3, 24, 1)] {
            let l = GpuCache::<f32>::lens(b, h, hkv, d, cap);
            assert_eq!((l.kv, l.c, l.shift), (b * hkv * cap * d, b * h * cap, b * hkv * d));
            assert_eq!(GpuCache::<f32>::bytes(b, h, hkv, d, cap), KvCache::bytes_for(b, h, hkv, d, cap));
            let bf16 = GpuCache::<half::bf16>::bytes(b, h, hkv, d, cap);
            assert_eq!(bf16, 2 * (2 * l.kv + 2 * l.shift) + 4 * l.c);
        }
        // The memory checks of the commands count the same bytes (f32).
        let mut cfg = crate::presets::Variant::FoxPro.config(256, 3, 8);
        cfg.num_kv_heads = Some(2);
        let per_layer = GpuCache::<f32>::bytes(2, 8, 2, 32, 50) as u128;
        assert_eq!(3 * per_layer, crate::validate::kv_cache_bytes(&cfg, 2, 50));
        // Grouped-query attention shrinks k and v by the group, not c.
        let (mha, gqa) =
            (GpuCache::<half::bf16>::lens(2, 8, 8, 64, 100), GpuCache::<half::bf16>::lens(2, 8, 2, 64, 100));
        assert_eq!((mha.kv / gqa.kv, mha.shift / gqa.shift, mha.c), (4, 4, gqa.c));
    }
}
