//! The CUDA backend: activations in `T` (bf16 for training, f32 to check against the CPU), fp32
//! master weights with `T` working copies of the matrices, fp32 gradients and AdamW state, all on
//! one GPU. GEMMs through cuBLASLt (`fox_kernels::cuda::gemm`), the small ops from
//! `fox_kernels::cuda::ops`, Forgetting Attention from the FlashAttention-style kernels (bf16,
//! head dim 64/128) or the simple f32 kernel (f32, and other head dims).
//!
//! Everything a step touches is allocated in [`Cuda::new`], [`Cuda::new_batch`] and the model's
//! `ModelActs::new` / `Scratch::new`: the step itself allocates nothing on the device.

use super::MemoryPlan;
use super::{Alloc, Backend, BatchInfo};
use crate::optim::{AdamW, AdamWConfig};
use crate::tensor::{Linear, ParamId, ParamKind, Params};
use anyhow::{anyhow, bail, ensure, Context, Result};
use fox_kernels::cuda::attention::{self as ga, DevVisibility};
use fox_kernels::cuda::compile::{DECODE, MODEL};
use fox_kernels::cuda::cudarc::driver as cudarc_event;
use fox_kernels::cuda::cudarc::driver::{CudaSlice, CudaView, DevicePtr, DeviceRepr, LaunchConfig};
use fox_kernels::cuda::gemm::Gemm;
use fox_kernels::cuda::kargs::{self, args};
use fox_kernels::cuda::nccl::{self, Nccl};
use fox_kernels::cuda::ops::{self, EmbeddingIndex};
use fox_kernels::cuda::{Elem, Gpu};
use std::sync::Arc;

mod adamw;
mod backend_ops;
pub mod decode;
pub(crate) mod fused;
mod params;
mod profile;
pub(crate) mod recurrent;
mod zero1;
pub use adamw::DeviceAdamW;
pub use decode::DeviceSampling;
pub use params::DeviceParam;
pub(crate) use recurrent::{grown, SsmScratch};
pub use zero1::Zero1;

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
    /// The cross-entropy holds a row of logits in shared memory where it fits; off with
    /// FOXLM_XENT_SMEM=0 (the three-pass kernel, to compare).
    pub(crate) xent_staged: bool,
    /// Page-locked host memory that logits come down through (grown as needed): copies into
    /// pageable memory are several times slower (docs/kernel-notes.md).
    pub(crate) host_logits: Option<cudarc_event::PinnedHostSlice<f32>>,
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
    /// Stacked projections for fused decode steps (`Cuda::prepare_fused_decode`).
    pub(crate) fused: fused::FusedDecode<T>,
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

/// What the CUDA backend sizes its buffers by: a step of `batch` × `seq` tokens (for training
/// when `train`) of a model with these shapes (`Model::cuda_sizes` gives a model's).
#[derive(Clone, Copy, Debug)]
pub struct CudaSizes {
    pub batch: usize,
    pub seq: usize,
    pub train: bool,
    /// Attention heads (for the attention backward's per-head buffers) and their head dim.
    pub heads: usize,
    pub head_dim: usize,
    pub has_attention: bool,
    pub vocab: usize,
    pub hidden: usize,
    /// The output head's weight (its device rows are padded, see [`padded_vocab`]).
    pub head: ParamId,
    /// Floats of the recurrent layers' scratch: `big` and `small` ([`SsmScratch`]).
    pub scratch: (usize, usize),
}

pub(crate) fn fast_attention_dims(head_dim: usize) -> bool {
    head_dim == 64 || head_dim == 128
}

pub(crate) fn bf16<T: Elem>() -> bool {
    T::NAME == "bf16"
}

impl<T: Elem> Cuda<T> {
    /// Uploads the parameters and plans every buffer of a step of `s` (the activations are
    /// planned by the model: `ModelActs::new`, `Scratch::new`; [`Cuda::new`] sizes a model's).
    pub fn with_sizes(gpu: Arc<Gpu>, p: &Params, s: &CudaSizes) -> Result<Self> {
        let gemm = Gemm::new(&gpu).context("cuBLASLt")?;
        let (h, train) = (s.heads, s.train);
        let (rows, vocab, d) = (s.batch * s.seq, s.vocab, s.hidden);
        let vocab_pad = padded_vocab(vocab);
        let head = s.head.0;
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
        let f32_attn = if bf16::<T>() && s.has_attention && !fast_attention_dims(s.head_dim) {
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
        let (big, small) = s.scratch;
        if big > 0 {
            grown(&gpu, &mut ssm.big, big)?;
        }
        if small > 0 {
            grown(&gpu, &mut ssm.small, small)?;
        }
        let xent_staged = std::env::var("FOXLM_XENT_SMEM").as_deref() != Ok("0");
        Ok(Self {
            ssm,
            head_rows,
            xent_staged,
            head_logits: gpu.zeros(head_rows * vocab_pad)?,
            host_logits: None,
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
    pub fn memory_plan_of(p: &Params, s: &CudaSizes, world: usize, plan: &mut MemoryPlan) {
        let train = s.train;
        let numel = p.numel();
        let matrix = matrix_numel(p);
        let tb = std::mem::size_of::<T>();
        let (master, moments) = optimizer_state_bytes(p, world);
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
        let vocab = padded_vocab(s.vocab);
        let head_rows = head_chunk_rows(vocab, s.batch * s.seq);
        plan.add(format!("output head chunk ({head_rows} rows × {vocab} logits)"), head_rows * vocab * (4 + tb));
        plan.add("cuBLASLt workspace", 32 << 20);
        let (big, small) = s.scratch;
        if big + small > 0 {
            plan.add("recurrent layers' scratch (chunk products and states, partial sums)", 4 * (big + small));
        }
    }

    /// The kernels' RMSNorm of `n`, its weight on the device.
    pub(crate) fn rms_norm(&self, n: super::Norm) -> ops::RmsNorm<'_> {
        ops::RmsNorm { w: &self.params[n.w.0].master, rows: n.rows, dim: n.dim, eps: n.eps }
    }

    /// An elementwise kernel of kernels/model.cu: (ptr, [ptr,] n).
    pub(crate) fn launch_elementwise(&self, name: &str, p1: u64, p2: Option<u64>, n: usize) -> Result<()> {
        // The callers' buffers hold at least n elements.
        let (gpu, cfg, n) = (&self.gpu, grid(n), n as i64);
        match p2 {
            Some(p2) => kargs::launch(gpu, &MODEL, name, cfg, &args![gpu; p1, p2, n]),
            None => kargs::launch(gpu, &MODEL, name, cfg, &args![gpu; p1, n]),
        }
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
        // The row in shared memory where it fits: one read of the logits instead of three.
        let staged = self.xent_staged && ops::cross_entropy_staged_fits(&self.gpu, ld);
        let ce = ops::CrossEntropy { logits: &self.head_logits, targets: &self.head_targets, weight, rows: m };
        ops::cross_entropy_padded(&self.gpu, &mut self.head_dlogits, &mut self.head_losses, ce, vocab, ld, staged)
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
pub fn optimizer_state_bytes(p: &Params, world: usize) -> (usize, usize) {
    let (numel, matrix) = (p.numel(), matrix_numel(p));
    if world <= 1 {
        return (4 * numel, 8 * numel);
    }
    let shard = |n: usize| n.div_ceil(world);
    (4 * (shard(matrix) + numel - matrix), 8 * shard(numel))
}

/// Elements of the matrices (the parameters that get bf16 copies and sharded master weights).
fn matrix_numel(p: &Params) -> usize {
    p.tensors.iter().zip(&p.kinds).filter(|(_, k)| **k == ParamKind::Matrix).map(|(t, _)| t.numel()).sum()
}

/// The output head's rows on the GPU: the vocabulary rounded up to a multiple of 64. With 50257
/// rows (an odd leading dimension) cuBLASLt falls back to kernels about 5x slower than with 50304
/// (docs/kernel-notes.md).
pub fn padded_vocab(vocab: usize) -> usize {
    vocab.next_multiple_of(64)
}

/// Rows of the output head per chunk: about 64 M logits at a time.
fn head_chunk_rows(vocab_pad: usize, rows: usize) -> usize {
    ((1usize << 26) / vocab_pad.max(1)).clamp(1, rows.max(1))
}

/// A grid-stride launch of 256-thread blocks over n elements (the small kernels of model.cu and
/// decode.cu).
pub(crate) fn grid(n: usize) -> LaunchConfig {
    kargs::plain_config((n.div_ceil(256).clamp(1, 65535) as u32, 1, 1), 256, 0)
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

impl<T: Elem> Cuda<T> {
    /// The first `rows` rows of `vocab` of the head's logits (rows `vpad` apart), through the
    /// page-locked staging buffer.
    pub(crate) fn download_logits(&mut self, rows: usize, vocab: usize) -> Result<Vec<f32>> {
        let vpad = self.vocab_pad;
        let n = rows * vpad;
        ensure!(n <= self.head_logits.len() && vocab <= vpad, "download_logits: {rows} rows do not fit");
        if self.host_logits.as_ref().is_none_or(|h| h.len() < n) {
            // SAFETY: the staging buffer is written by the copy below before any read.
            let h = unsafe { self.gpu.context().alloc_pinned::<f32>(n.next_power_of_two()) }
                .map_err(|e| anyhow!("allocating page-locked memory for logits: {e:?}"))?;
            self.host_logits = Some(h);
        }
        let h = self.host_logits.as_mut().ok_or_else(|| anyhow!("logits staging"))?;
        let dst = h.as_mut_slice().map_err(|e| anyhow!("{e:?}"))?;
        self.gpu
            .stream()
            .memcpy_dtoh(&self.head_logits.slice(0..n), &mut dst[..n])
            .map_err(|e| anyhow!("downloading logits: {e:?}"))?;
        self.gpu.sync()?;
        let host = h.as_slice().map_err(|e| anyhow!("{e:?}"))?;
        Ok((0..rows).flat_map(|r| host[r * vpad..r * vpad + vocab].iter().copied()).collect())
    }
}

/// Device-to-device copies gathered on the host and made in one launch (`fox_copy_runs` in
/// kernels/decode.cu): serving moves a newcomer's cache rows as hundreds of small runs (a run per
/// head, layer and tensor), and a driver call for each cost as much as the prefill itself.
#[derive(Default)]
pub(crate) struct CopyRuns {
    /// (src, dst, bytes) per run, device addresses.
    runs: Vec<u64>,
    /// The runs on the device (grown as needed, kept between launches).
    dev: Option<CudaSlice<u64>>,
}

impl CopyRuns {
    /// `height` runs of `width` elements, run r from `s0 + r·spitch` of `src` to `d0 + r·dpitch`
    /// of `dst` (height 1: one plain copy).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn push<U: DeviceRepr>(
        &mut self,
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
        use fox_kernels::cuda::cudarc::driver::DevicePtrMut;
        if width == 0 || height == 0 {
            return Ok(());
        }
        ensure!(height == 1 || (width <= spitch && width <= dpitch), "copy runs of {width} wider than their pitch");
        ensure!(
            s0 + (height - 1) * spitch + width <= src.len() && d0 + (height - 1) * dpitch + width <= dst.len(),
            "device copy out of bounds"
        );
        let e = std::mem::size_of::<U>() as u64;
        let (ps, _gs) = src.device_ptr(gpu.stream());
        let (pd, _gd) = dst.device_ptr_mut(gpu.stream());
        for r in 0..height {
            let (s, d) = ((s0 + r * spitch) as u64, (d0 + r * dpitch) as u64);
            self.runs.extend([ps + s * e, pd + d * e, width as u64 * e]);
        }
        Ok(())
    }

    /// Row `sr` of `src` to row `dr` of `dst`, rows of `n` elements (a recurrent state's).
    pub(crate) fn push_row<U: DeviceRepr>(
        &mut self,
        gpu: &Gpu,
        src: &CudaSlice<U>,
        sr: usize,
        dst: &mut CudaSlice<U>,
        dr: usize,
        n: usize,
    ) -> Result<()> {
        self.push(gpu, src, sr * n, n, dst, dr * n, n, n, 1)
    }

    /// Makes every pushed copy (in one launch, on the stream) and forgets them.
    pub(crate) fn launch(&mut self, gpu: &Gpu) -> Result<()> {
        let n = self.runs.len() / 3;
        if n == 0 {
            return Ok(());
        }
        if self.dev.as_ref().is_none_or(|d| d.len() < self.runs.len()) {
            self.dev = Some(gpu.zeros::<u64>(self.runs.len().next_power_of_two())?);
        }
        let dev = self.dev.as_mut().ok_or_else(|| anyhow!("copy runs buffer"))?;
        gpu.stream()
            .memcpy_htod(&self.runs, &mut dev.slice_mut(0..self.runs.len()))
            .map_err(|e| anyhow!("uploading copy runs: {e:?}"))?;
        let ni = i32::try_from(n).map_err(|_| anyhow!("{n} copy runs"))?;
        // Every run lies inside its allocation (checked in push), both on this stream.
        let cfg = kargs::plain_config((n.min(8192) as u32, 1, 1), 256, 0);
        kargs::launch(gpu, &DECODE, "fox_copy_runs", cfg, &args![gpu; dev, ni])?;
        self.runs.clear();
        Ok(())
    }
}

/// The same buffer as f32, when T is f32.
pub(crate) fn as_f32<T: Elem>(s: &CudaSlice<T>) -> Option<&CudaSlice<f32>> {
    (s as &dyn std::any::Any).downcast_ref::<CudaSlice<f32>>()
}
pub(crate) fn as_f32_mut<T: Elem>(s: &mut CudaSlice<T>) -> Option<&mut CudaSlice<f32>> {
    (s as &mut dyn std::any::Any).downcast_mut::<CudaSlice<f32>>()
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
