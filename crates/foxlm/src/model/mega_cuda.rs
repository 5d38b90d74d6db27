//! The decode megakernel (kernels/decode_mega.cu): a batch-1 bf16 decode step of an attention
//! model (every layer attention + SwiGLU MLP, the layers the fused kernels cover) in one launch,
//! from the token's embedding to the final norm; the head and the sampler follow as today. The
//! fused step (`attention/fused_cuda.rs`) stays the path for everything else: batches of more
//! rows, other families, shapes the kernel does not take, and by default: the megakernel runs
//! only with `FOXLM_DECODE_MEGA=1` (or [`Megakernel::set_on`]), being slower than the fused step
//! (docs/kernel-notes.md).

use super::attention::fused_cuda::DecodeInWeights;
use super::cache::{GpuLayerState, LayerState};
use super::{Mixer, Model};
use crate::backend::cuda::fused::off;
use crate::backend::cuda::{Cuda, GpuBatch};
use crate::backend::Family;
use anyhow::{anyhow, Result};
use fox_kernels::cuda::compile::DECODE;
use fox_kernels::cuda::cudarc::driver::{CudaSlice, DeviceRepr};
use fox_kernels::cuda::kargs::{self, by_value};
use fox_kernels::cuda::Elem;

/// Layers the kernel's step arguments have room for (`MEGA_MAXL`).
const MAX_LAYERS: usize = 32;
/// Threads of a block (`MEGA_THREADS`): one block per SM.
const THREADS: u32 = 256;
/// Stamps per block (`MEGA_STAMPS`): the start, then arrival and departure at each barrier.
const STAMPS: usize = 2 + 2 * (5 * MAX_LAYERS + 1);

/// `MegaLayer` of kernels/decode_mega.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct MegaLayer {
    w_in: u64,
    w_o: u64,
    w_gu: u64,
    w_down: u64,
    norm1: u64,
    norm2: u64,
    q_norm: u64,
    k_norm: u64,
    fgate_bias: u64,
    out_norm: u64,
    width: i32,
    q_off: i32,
    k_off: i32,
    ks_off: i32,
    v_off: i32,
    vs_off: i32,
    f_off: i32,
    og_off: i32,
    qn_groups: i32,
    kn_groups: i32,
}

/// `MegaStep` of kernels/decode_mega.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct MegaStep {
    layers: u64,
    emb: u64,
    ids: u64,
    final_norm: u64,
    x: u64,
    h: u64,
    u: u64,
    p: u64,
    q: u64,
    c: u64,
    final_out: u64,
    part: u64,
    flags: u64,
    bar: u64,
    positions: u64,
    lenp: u64,
    stamps: u64,
    rope_base: f64,
    len: i32,
    layers_n: i32,
    d: i32,
    heads: i32,
    head_dim: i32,
    inter: i32,
    vocab: i32,
    cap: i32,
    splits: i32,
    eps: f32,
    out_eps: f32,
    qk_eps: f32,
    scale: f32,
    kc: [u64; MAX_LAYERS],
    vc: [u64; MAX_LAYERS],
    cc: [u64; MAX_LAYERS],
    ksh: [u64; MAX_LAYERS],
    vsh: [u64; MAX_LAYERS],
}
// SAFETY: plain old data in the C layout of the kernel's structs (pointers, ints, floats).
unsafe impl DeviceRepr for MegaStep {}

/// The kernel's state: the layer table, the step's buffers (one row), the barrier and flags.
struct MegaDecode<T> {
    table: CudaSlice<u8>,
    layers: usize,
    x: CudaSlice<T>,
    h: CudaSlice<T>,
    u: CudaSlice<T>,
    q: CudaSlice<T>,
    p: CudaSlice<f32>,
    c: CudaSlice<f32>,
    part: CudaSlice<f32>,
    flags: CudaSlice<u32>,
    bar: CudaSlice<u32>,
    grid: u32,
    splits: usize,
    smem: usize,
    d: usize,
    heads: usize,
    head_dim: usize,
    inter: usize,
    rope_base: f64,
    eps: f32,
    out_eps: f32,
    emb: u64,
    final_norm: u64,
    /// With FOXLM_DECODE_MEGA_PROFILE=1: each block's %globaltimer at every barrier of the last
    /// step ([`Megakernel::profile`]).
    stamps: Option<CudaSlice<u64>>,
}

/// Shared memory of a block (decode_mega.cu): x, h, the stage's input vector, the attention's
/// groups (at most 4096 floats: groups × D) and their max and sum (at most 1024 floats).
fn smem_bytes(d: usize, inter: usize, hd: usize) -> usize {
    (2 * d + d.max(inter).max(hd) + 4096 + 1024) * 4
}

/// A model's decode megakernel: its state where the model fits it, whether decode steps use it,
/// and how many have.
pub struct Megakernel<T> {
    state: Option<MegaDecode<T>>,
    on: bool,
    /// Decode steps run as the megakernel so far (the GPU check asserts its rows ran some).
    pub steps: usize,
}

impl<T> Default for Megakernel<T> {
    fn default() -> Self {
        Self { state: None, on: false, steps: 0 }
    }
}

impl<T: Elem> Megakernel<T> {
    /// Builds the megakernel's state when the model's layers fit it (after the fused step's
    /// stacked weights); otherwise leaves decode steps to the fused path. Never fails for a
    /// shape: a model the kernel does not take just runs fused.
    pub fn prepare(be: &Cuda<T>, model: &Model) -> Result<Self> {
        let env = std::env::var("FOXLM_DECODE_MEGA").ok();
        let mut mega = Self { state: None, on: env.as_deref() == Some("1"), steps: 0 };
        if T::NAME != "bf16" || env.as_deref() == Some("0") {
            return Ok(mega);
        }
        mega.state = Self::state(be, model)?;
        Ok(mega)
    }

    /// The kernel's state for `model`, or None where the model's layers do not fit it.
    fn state(be: &Cuda<T>, model: &Model) -> Result<Option<MegaDecode<T>>> {
        let c = &model.config;
        let (d, layers) = (c.hidden_size, model.layers.len());
        if layers == 0 || layers > MAX_LAYERS || !d.is_multiple_of(8) {
            return Ok(None);
        }
        let first = match model.layers[0].attn() {
            Some(l) => l,
            None => return Ok(None),
        };
        let (heads, hd, rope, out_eps) = (first.heads, first.head_dim, first.rope_base, first.norm_eps);
        // A group of hd / 8 lanes per key (a power of two up to a warp); decode_in a thread per channel.
        if !(hd.is_power_of_two() && (8..=256).contains(&hd)) || heads * hd > (1 << 20) {
            return Ok(None);
        }
        let mut table = Vec::with_capacity(layers);
        let mut inter = 0;
        let mut widest = 0;
        let master = |id: crate::tensor::ParamId| be.dptr(&be.params[id.0].master);
        for blk in &model.layers {
            let (Mixer::Attention(l), Some(mlp)) = (&blk.mixer, &blk.mlp) else { return Ok(None) };
            let Some(f) = be.fused.layer(l.q_proj.weight) else { return Ok(None) };
            let m = &mlp.mlp;
            let i = m.intermediate;
            let same = l.heads == heads
                && l.kv_heads == heads
                && l.head_dim == hd
                && l.rope_base == rope
                && l.norm_eps == out_eps
                && l.window.is_none()
                && l.log_pruning_tolerance.is_none();
            let shapes = l.o_proj.in_features == heads * hd
                && l.o_proj.out_features == d
                && m.gate_proj.in_features == d
                && m.gate_proj.out_features == 2 * i
                && m.down_proj.in_features == i
                && m.down_proj.out_features == d
                && i.is_multiple_of(8)
                && (inter == 0 || i == inter);
            if !same || !shapes {
                return Ok(None);
            }
            inter = i;
            widest = widest.max(f.width);
            let DecodeInWeights { q_norm, k_norm, qn_groups, kn_groups, fgate_bias } = be.decode_in_weights(l, hd);
            let e = MegaLayer {
                w_in: be.dptr(&f.w),
                w_o: be.dptr(be.copy_of(l.o_proj.weight)?),
                w_gu: be.dptr(be.copy_of(m.gate_proj.weight)?),
                w_down: be.dptr(be.copy_of(m.down_proj.weight)?),
                norm1: master(blk.mixer_norm),
                norm2: master(mlp.norm),
                q_norm,
                k_norm,
                fgate_bias,
                out_norm: l.output_norm.map_or(0, master),
                width: f.width as i32,
                q_off: f.q as i32,
                k_off: f.k as i32,
                ks_off: off(f.ks),
                v_off: f.v as i32,
                vs_off: off(f.vs),
                f_off: off(f.f),
                og_off: off(f.og),
                qn_groups,
                kn_groups,
            };
            // 16-byte loads and bulk prefetches of whole rows.
            if [e.w_in, e.w_o, e.w_gu, e.w_down].iter().any(|p| !p.is_multiple_of(16)) {
                return Ok(None);
            }
            table.push(e);
        }
        let emb = be.dptr(be.copy_of(model.embeddings)?);
        let smem = smem_bytes(d, inter, heads * hd);
        if !emb.is_multiple_of(16) || smem > 200 << 10 {
            return Ok(None);
        }
        let func = be.gpu.function(&DECODE, "fox_decode_mega_bf16")?;
        // Raised whatever the size: the kernel's static shared memory (decode_in's) counts too.
        let attr = fox_kernels::cuda::cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        if func.set_attribute(attr, smem as i32).is_err() {
            return Ok(None);
        }
        // Every block must be resident at once (they wait for one another): one per SM.
        let resident = func.occupancy_max_active_blocks_per_multiprocessor(THREADS, smem, None).unwrap_or(0);
        let grid = be.gpu.sm_count();
        if resident < 1 || grid == 0 {
            return Ok(None);
        }
        let splits = (grid / heads).max(1);
        let bytes: Vec<u8> = table
            .iter()
            .flat_map(|e| {
                // SAFETY: MegaLayer is repr(C) plain data without padding (ten u64, ten i32).
                unsafe { std::slice::from_raw_parts((e as *const MegaLayer).cast::<u8>(), size_of::<MegaLayer>()) }
                    .to_vec()
            })
            .collect();
        let g = &be.gpu;
        let stamps = if std::env::var("FOXLM_DECODE_MEGA_PROFILE").is_ok_and(|v| v == "1") {
            Some(g.zeros::<u64>(grid * STAMPS)?)
        } else {
            None
        };
        Ok(Some(MegaDecode {
            table: g.upload(&bytes)?,
            layers,
            x: g.zeros(d)?,
            h: g.zeros(d)?,
            u: g.zeros(inter)?,
            q: g.zeros(heads * hd)?,
            p: g.zeros(widest)?,
            c: g.zeros(heads)?,
            part: g.zeros(heads * splits * (hd + 2))?,
            flags: g.zeros(layers * heads)?,
            bar: g.zeros(2)?,
            grid: grid as u32,
            splits,
            smem,
            d,
            heads,
            head_dim: hd,
            inter,
            rope_base: rope.unwrap_or(0.0),
            eps: c.norm_eps as f32,
            out_eps,
            emb,
            final_norm: master(model.norm),
            stamps,
        }))
    }

    /// With FOXLM_DECODE_MEGA_PROFILE=1, where the last megakernel step's time went, per stage
    /// summed over the layers: from the first block leaving the barrier before to the last
    /// arriving at the stage's own (the stage's critical path), then to the last leaving it (the
    /// barrier). Waits for the GPU.
    pub fn profile(&self, be: &Cuda<T>) -> Result<Option<String>> {
        let Some(m) = self.state.as_ref() else { return Ok(None) };
        let Some(st) = m.stamps.as_ref() else { return Ok(None) };
        let t = be.gpu.download(st)?;
        be.gpu.sync()?;
        let nb = m.grid as usize;
        let at = |b: usize, k: usize| t[b * STAMPS + k] as f64;
        // 4 barriers in layer 0, 5 in each later one (its first waits for the last layer's down_proj),
        // and the final one: stage kinds in the order below.
        let barriers = 5 * m.layers;
        let start = (0..nb).map(|b| at(b, 0)).fold(f64::INFINITY, f64::min);
        let (mut work, mut wait) = ([0f64; 5], [0f64; 5]);
        let mut first_leave = start;
        let mut end = start;
        for i in 0..barriers {
            let arrive = (0..nb).map(|b| at(b, 1 + 2 * i)).fold(0.0, f64::max);
            let leave_first = (0..nb).map(|b| at(b, 2 + 2 * i)).fold(f64::INFINITY, f64::min);
            let leave_last = (0..nb).map(|b| at(b, 2 + 2 * i)).fold(0.0, f64::max);
            let kind = i % 5;
            work[kind] += arrive - first_leave;
            wait[kind] += leave_last - arrive;
            first_leave = leave_first;
            end = leave_last;
        }
        let names = [
            "norm + stacked projections",
            "decode_in + attention",
            "merge + output norm/gate + o_proj",
            "norm + gate_proj + SwiGLU",
            "down_proj",
        ];
        let mut s = format!(
            "    megakernel stages, last step, µs over {} layers (stage: first departure before to last arrival; then barrier: to last departure); start to final barrier {:.1} µs:",
            m.layers,
            (end - start) / 1e3
        );
        for k in 0..5 {
            s += &format!("\n      {:<32} {:>8.1} µs  barrier {:>6.1} µs", names[k], work[k] / 1e3, wait[k] / 1e3);
        }
        Ok(Some(s))
    }

    /// Whether decode steps run as the megakernel: prepared for this model and switched on
    /// (`FOXLM_DECODE_MEGA=1`, or [`Megakernel::set_on`]; `FOXLM_DECODE_MEGA=0` prepares nothing).
    pub fn ready(&self) -> bool {
        self.state.is_some() && self.on
    }

    /// Drops the kernel's state: decode steps run fused (or op by op) again.
    pub fn clear(&mut self) {
        self.state = None;
    }

    /// Turns the megakernel on or off for later decode steps (the fused step otherwise).
    pub fn set_on(&mut self, on: bool) {
        self.on = on;
    }

    /// A whole decode step of one row (embedding to the final norm into `final_out`) as the
    /// megakernel, appending to `caches`; `Ok(false)` where it does not apply (the caller then
    /// runs the step layer by layer).
    pub fn step(
        &mut self,
        be: &mut Cuda<T>,
        b: &GpuBatch,
        final_out: &mut CudaSlice<T>,
        caches: &mut [GpuLayerState<T>],
    ) -> Result<bool> {
        if !self.ready() || b.batch != 1 || b.seq != 1 {
            return Ok(false);
        }
        if b.start_host.as_ref().is_some_and(|s| s.iter().any(|&x| x != 0)) {
            return Ok(false);
        }
        let Some(m) = self.state.as_ref() else { return Ok(false) };
        if caches.len() != m.layers || final_out.len() < m.d {
            return Ok(false);
        }
        let mut ptrs = [[0u64; MAX_LAYERS]; 5];
        let (mut len, mut cap) = (None, 0);
        for (li, st) in caches.iter().enumerate() {
            let LayerState::Attention(c) = st else { return Ok(false) };
            let shape = (c.batch, c.heads, c.kv_heads, c.head_dim) == (1, m.heads, m.heads, m.head_dim);
            if !shape || c.len == 0 || c.len >= c.cap || len.is_some_and(|l| l != c.len) || (li > 0 && c.cap != cap) {
                return Ok(false);
            }
            len = Some(c.len);
            cap = c.cap;
            for (k, s) in [be.dptr(&c.k), be.dptr(&c.v), be.dptr(&c.c), be.dptr(&c.k_shift), be.dptr(&c.v_shift)]
                .into_iter()
                .enumerate()
            {
                ptrs[k][li] = s;
            }
        }
        let len = len.ok_or_else(|| anyhow!("no decode cache"))?;
        if i32::try_from(cap * m.heads).is_err() {
            return Ok(false);
        }
        be.mark(Family::Other)?;
        let m = self.state.as_ref().ok_or_else(|| anyhow!("megakernel state"))?;
        let [kc, vc, cc, ksh, vsh] = ptrs;
        let step = MegaStep {
            layers: be.dptr(&m.table),
            emb: m.emb,
            ids: be.dptr(&b.ids),
            final_norm: m.final_norm,
            x: be.dptr(&m.x),
            h: be.dptr(&m.h),
            u: be.dptr(&m.u),
            p: be.dptr(&m.p),
            q: be.dptr(&m.q),
            c: be.dptr(&m.c),
            final_out: be.dptr(final_out),
            part: be.dptr(&m.part),
            flags: be.dptr(&m.flags),
            bar: be.dptr(&m.bar),
            positions: be.dptr(&b.positions),
            lenp: be.lenp(),
            stamps: m.stamps.as_ref().map_or(0, |s| be.dptr(s)),
            rope_base: m.rope_base,
            len: len as i32,
            layers_n: m.layers as i32,
            d: m.d as i32,
            heads: m.heads as i32,
            head_dim: m.head_dim as i32,
            inter: m.inter as i32,
            vocab: be.vocab as i32,
            cap: cap as i32,
            splits: m.splits as i32,
            eps: m.eps,
            out_eps: m.out_eps,
            qk_eps: crate::config::QK_NORM_EPS,
            scale: 1.0 / (m.head_dim as f32).sqrt(),
            kc,
            vc,
            cc,
            ksh,
            vsh,
        };
        let cfg = kargs::plain_config((m.grid, 1, 1), THREADS, m.smem);
        // Every buffer of `step` sized at `prepare` for this model's shapes (one row), the caches
        // checked above ([1, H, cap, D], len < cap); one block per SM, all resident (occupancy and
        // the shared memory set at `prepare`).
        kargs::launch(&be.gpu, &DECODE, "fox_decode_mega_bf16", cfg, &[by_value(&step)])?;
        for st in caches.iter_mut() {
            if let LayerState::Attention(c) = st {
                c.len += 1;
                c.staged = false;
            }
        }
        self.steps += 1;
        Ok(true)
    }
}
