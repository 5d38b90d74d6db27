//! Gated linear attention with per-channel decay (HGRN2's token mixer) and HGRN2's gates and
//! lower bounds on the GPU (kernels/gla.cu): the twins of [`crate::gla`] and of foxlm's CPU
//! HGRN2 ops, with the same layouts (q, k, g [B, T, H, K], v and o [B, T, H, V], states
//! [B, H, K, V], start [B]). Activations in `T` (f32 or bf16), the gate's prefix sums, states,
//! scores and every sum in f32. Each function launches on `gpu.stream()` without waiting and
//! returns an error (never panics) when a buffer is shorter than the shapes say. Deterministic:
//! no atomics, fixed-order sums.
//!
//! The chunked form of [`crate::gla`]: chunks of 64, the state passed between chunks by one
//! sequential kernel, everything else one block per chunk and 64-wide tile. Three sets of kernels,
//! chosen per problem or by `FOXLM_GLA` ([`GlaKernels`]):
//! - `cuda-cores`: every product on CUDA cores in f32 (f32 activations, and bf16 on request).
//! - `tensor-cores` (bf16 activations; see [`uses_tensor_cores`]): the dense products on tensor
//!   cores, bf16 `mma.sync` with f32 sums: each chunk's own state and its gradient's, the output's
//!   state and value terms, dv's, the scores' gradient do·vᵀ, and the state terms of dq and dk; the
//!   intra-chunk scores and the intra-chunk terms of dq and dk (each with its decays) stay on CUDA
//!   cores in f32, as does the state passing.
//! - `walk` (bf16, the default there since an H100 checked and timed it; see [`uses_walk`]): the
//!   tensor-core kernels with the state passing as one walk over the chunks on tensor cores (the
//!   state in registers) and, in the forward, bf16 chunk states read by its own output kernel.

use super::compile::GLA;
use super::kargs::{self, args, int, kname, need, need_lens, need_opt, opt_ptr, ptr, Arg};
use super::linear_attention::DevShape;
use super::{Elem, Gpu};
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::CudaSlice;

/// Chunk length (as [`crate::gla::CHUNK`]).
pub const CHUNK: usize = 64;
/// The widest key of a decode step (its shared arrays).
pub const DECODE_KMAX: usize = 256;
/// Floats of gla_bwd_dqk's dynamic shared memory (kernels/gla.cu's GLA_DQK_SMEM_FLOATS).
const DQK_SMEM_FLOATS: usize = 4 * CHUNK * 65 + 3 * 48 * 65 + 2 * 64;
/// Rows of the gates' backward per partial sum of the lower bound's gradient.
const GATE_ROWS_PER_PART: usize = 256;

fn launch(gpu: &Gpu, name: &str, grid: (usize, usize, usize), smem: usize, args: &[Arg]) -> Result<()> {
    launch_with_on(gpu, None, name, grid, 256, smem, args)
}

/// [`launch`] with `threads` per block, on `stream` (none: the GPU's stream).
fn launch_with_on(
    gpu: &Gpu,
    stream: Option<&cudarc::driver::CudaStream>,
    name: &str,
    grid: (usize, usize, usize),
    threads: u32,
    smem: usize,
    args: &[Arg],
) -> Result<()> {
    let cfg = kargs::config(name, grid, threads, smem)?;
    kargs::launch_on(gpu, stream.unwrap_or(gpu.stream()), &GLA, name, cfg, args)
}

/// One GLA problem on the device: as [`crate::gla::Gla`], with `start` as i32 (positions before
/// it are left padding).
#[derive(Clone, Copy)]
pub struct DevGla<'a, T: Elem = f32> {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    /// [B, T, H, K]
    pub q: &'a CudaSlice<T>,
    pub k: &'a CudaSlice<T>,
    /// [B, T, H, V]
    pub v: &'a CudaSlice<T>,
    /// [B, T, H, K], the log forget gate (≤ 0).
    pub g: &'a CudaSlice<T>,
    pub scale: f32,
    pub start: Option<&'a CudaSlice<i32>>,
    /// The tensor-core kernels, or the CUDA-core ones; none: [`uses_tensor_cores`]'s choice.
    pub tensor_cores: Option<bool>,
    /// The walk: the tensor-core kernels with the state passing as one walk over the chunks (see
    /// [`uses_walk`]); none: yes unless the environment asks for other kernels ([`GlaKernels`]).
    pub walk: Option<bool>,
    /// The walk's forward with its scores on tensor cores (see [`uses_scores_tc`]); none: yes
    /// unless the environment says `FOXLM_GLA_SCORES=cuda`.
    pub scores_tc: Option<bool>,
}

/// The kernels `FOXLM_GLA` asks for where a problem leaves the choice open (the old version
/// numbers v1, v2, v3 still accepted for scripts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GlaKernels {
    /// `cuda-cores` (v1): every product on the CUDA cores in f32.
    CudaCores,
    /// `tensor-cores` (v2): the dense products on tensor cores, the states passed chunk by chunk.
    TensorCores,
    /// `walk` (v3, the default): the tensor-core kernels with the state passing as one walk.
    Walk,
}

impl GlaKernels {
    /// The kernels `FOXLM_GLA` names, read once.
    pub fn from_env() -> Self {
        static KERNELS: std::sync::OnceLock<GlaKernels> = std::sync::OnceLock::new();
        *KERNELS.get_or_init(|| match std::env::var("FOXLM_GLA").ok().as_deref() {
            Some("cuda-cores" | "v1") => GlaKernels::CudaCores,
            Some("tensor-cores" | "v2") => GlaKernels::TensorCores,
            _ => GlaKernels::Walk,
        })
    }
}

/// Whether `p` runs on tensor cores: as `p.tensor_cores` says, else for bf16 activations unless
/// the environment asks for the CUDA-core kernels (`FOXLM_GLA=cuda-cores`).
pub fn uses_tensor_cores<T: Elem>(p: &DevGla<T>) -> bool {
    p.tensor_cores.unwrap_or(T::NAME == "bf16" && GlaKernels::from_env() != GlaKernels::CudaCores)
}

/// Whether `p`'s states pass as the walk (`gla_walk_tc_k*`: per (b, h, KB channels, 64 value
/// columns) a block walks the chunks in order with its part of the state in registers, instead of
/// gla_chunk_h_tc's per-chunk states and gla_scan_fwd's f32 passing over them): on tensor cores
/// with bf16 activations, K and V multiples of 8 (the rows load as 16-byte copies), as `p.walk`
/// says, else unless the environment sets `FOXLM_GLA=tensor-cores` (the state passed chunk by
/// chunk, to time against). The default because it is the faster (BENCHMARKS.md, "HGRN2 on the
/// GPU").
pub fn uses_walk<T: Elem>(p: &DevGla<T>) -> bool {
    uses_tensor_cores(p)
        && T::NAME == "bf16"
        && p.k_dim.is_multiple_of(8)
        && p.v_dim.is_multiple_of(8)
        && p.walk.unwrap_or(GlaKernels::from_env() != GlaKernels::TensorCores)
}

/// Whether `p`'s forward takes the walk's scores on tensor cores (gla_scores_w: bf16 A, the
/// products between sub-chunks by mma.sync, the diagonal blocks on the CUDA cores with their
/// channels over lanes) and the output kernel that reads them (gla_fwd_o_w16): with the walk's
/// output kernel (K ≤ 128), as `p.scores_tc` says, else unless the environment sets
/// `FOXLM_GLA_SCORES=cuda` (gla_scores in f32 on the CUDA cores, to time against). The default
/// because it is the faster (BENCHMARKS.md, "HGRN2 on the GPU").
pub fn uses_scores_tc<T: Elem>(p: &DevGla<T>) -> bool {
    static CUDA_CORES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off = *CUDA_CORES.get_or_init(|| std::env::var("FOXLM_GLA_SCORES").is_ok_and(|v| v == "cuda"));
    walk_out(p) && p.scores_tc.unwrap_or(!off)
}

/// Channels per block of the walk: `FOXLM_GLA_KB` = 16 (the default), 32 or 64 (its variants,
/// to time them in one process). KB = 16 gives the most blocks (192 at B = 2, H = 6, K = V = 128)
/// and the shortest chain per chunk, the fastest of the three though 64 reads v the fewest times
/// (BENCHMARKS.md, "HGRN2 on the GPU").
fn walk_kb() -> usize {
    static KB: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *KB.get_or_init(|| match std::env::var("FOXLM_GLA_KB").ok().as_deref() {
        Some("32") => 32,
        Some("64") => 64,
        _ => 16,
    })
}

/// Dynamic shared memory of gla_walk_tc_k`kb` (kernels/gla.cu's GlaWalk): three sets (GLA_WSETS)
/// of k [64][kb + 8] and v [64][72] (bf16) and G [64][kb + 4] (f32), then e^{G_L} [kb].
fn walk_smem(kb: usize) -> usize {
    let set = CHUNK * (kb + 8) * 2 + CHUNK * (WALK_V + 8) * 2 + CHUNK * (kb + 4) * 4;
    3 * set + kb * 4
}

/// Dynamic shared memory of gla_fwd_o_w_k`kp` (kernels/gla.cu's GlaOutW): q ⊙ e^G [64][kp + 8],
/// Sᵀ [64][kp + 8], v [64][72] and A [64][72], all bf16.
fn out_w_smem(kp: usize) -> usize {
    2 * (CHUNK * (kp + 8) * 2) + 2 * (CHUNK * 72 * 2)
}

/// Dynamic shared memory of gla_scores_w_k`kp` (kernels/gla.cu's GlaScoresW): q, k and q̃
/// [64][kp + 8] (bf16), G [64][kp + 4] (f32), the three k ⊙ e^{G_r − G} (96 rows of kp + 8, bf16).
fn scores_w_smem(kp: usize) -> usize {
    3 * CHUNK * (kp + 8) * 2 + CHUNK * (kp + 4) * 4 + 96 * (kp + 8) * 2
}

/// Value columns per block of the walk (GLA_WV), 16 per warp.
const WALK_V: usize = 64;

/// Kernel `base` of the kernels `p` runs (the tensor-core ones are `base`_tc).
fn vname<T: Elem>(p: &DevGla<T>, base: &str) -> String {
    if uses_tensor_cores(p) {
        kname::<T>(&format!("{base}_tc"))
    } else {
        kname::<T>(base)
    }
}

impl<T: Elem> DevGla<'_, T> {
    fn shape(&self) -> DevShape<'_> {
        let (batch, seq, heads, k_dim, v_dim, start) =
            (self.batch, self.seq, self.heads, self.k_dim, self.v_dim, self.start);
        DevShape { batch, seq, heads, k_dim, v_dim, start }
    }
    fn check(&self, op: &str) -> Result<()> {
        let (b, t, h) = (self.batch, self.seq, self.heads);
        self.shape().check(op, self.q, self.k, self.v)?;
        need(op, "g", self.g, b * t * h * self.k_dim)?;
        int(op, self.states() * (t.div_ceil(CHUNK) + 1))?;
        ensure!(
            b * h <= 65535 && t.div_ceil(CHUNK) <= 65535,
            "{op}: B·H = {} or T = {t} beyond the launch grid",
            b * h
        );
        Ok(())
    }
    fn states(&self) -> usize {
        self.shape().states()
    }
    fn nch(&self) -> usize {
        self.seq.div_ceil(CHUNK)
    }
    /// The sizes as the kernels' ints.
    fn ints(&self) -> Result<Ints> {
        let op = "gla";
        let (b, t, h, k, v, nch) = (self.batch, self.seq, self.heads, self.k_dim, self.v_dim, self.nch());
        Ok(Ints { b: int(op, b)?, t: int(op, t)?, h: int(op, h)?, k: int(op, k)?, v: int(op, v)?, nch: int(op, nch)? })
    }
}

/// A problem's B, T, H, K, V and chunk count as the kernels take them (32-bit ints).
#[derive(Clone, Copy)]
struct Ints {
    b: i32,
    t: i32,
    h: i32,
    k: i32,
    v: i32,
    nch: i32,
}

/// Gradients of the device GLA's inputs, overwritten (0 at padding); dinit [B, H, K, V] when
/// wanted.
pub struct DevGlaGrads<'a, T: Elem = f32> {
    pub dq: &'a mut CudaSlice<T>,
    pub dk: &'a mut CudaSlice<T>,
    pub dv: &'a mut CudaSlice<T>,
    pub dg: &'a mut CudaSlice<T>,
    pub dinit: Option<&'a mut CudaSlice<f32>>,
}

/// Floats of the scratch of [`gla_fwd`]: the gate's chunk prefix sums (B·T·H·K), the states
/// entering each chunk and the final one (B·H·(nch + 1)·K·V) and the chunk scores (B·H·nch·64²),
/// nch = ⌈T / 64⌉. At B = 2, T = 16384, H = 6, K = V = 128 (HGRN2 125M): 352 MB.
pub fn gla_fwd_scratch_len(batch: usize, seq: usize, heads: usize, k_dim: usize, v_dim: usize) -> usize {
    let nch = seq.div_ceil(CHUNK);
    batch * seq * heads * k_dim + batch * heads * (nch + 1) * k_dim * v_dim + batch * heads * nch * CHUNK * CHUNK
}

/// Floats of the scratch of [`gla_bwd`]: the forward's, then the state gradients
/// (B·H·nch·K·V) and the scores' gradients (B·H·nch·64²). At HGRN2 125M's B = 2, T = 16384:
/// 604 MB.
pub fn gla_bwd_scratch_len(batch: usize, seq: usize, heads: usize, k_dim: usize, v_dim: usize) -> usize {
    let nch = seq.div_ceil(CHUNK);
    gla_fwd_scratch_len(batch, seq, heads, k_dim, v_dim)
        + batch * heads * nch * k_dim * v_dim
        + batch * heads * nch * CHUNK * CHUNK
}

/// Device addresses of the scratch's parts.
struct Parts {
    cum: u64,
    hs: u64,
    scores: u64,
    dhs: u64,
    dscores: u64,
}

fn parts<T: Elem>(gpu: &Gpu, p: &DevGla<T>, scratch: &CudaSlice<f32>) -> Parts {
    let (b, t, h, kd, vd, nch) = (p.batch, p.seq, p.heads, p.k_dim, p.v_dim, p.nch());
    let cum = ptr(gpu, scratch);
    let hs = cum + 4 * (b * t * h * kd) as u64;
    let scores = hs + 4 * (b * h * (nch + 1) * kd * vd) as u64;
    let dhs = scores + 4 * (b * h * nch * CHUNK * CHUNK) as u64;
    let dscores = dhs + 4 * (b * h * nch * kd * vd) as u64;
    Parts { cum, hs, scores, dhs, dscores }
}

/// The gate's prefix sums, the chunk states and their passing (init → slot 0, the final state
/// into slot nch and `fin`) and the chunk scores A. With `fwd_w` (the walk's forward) the slots
/// hold bf16 Sᵀ [V, K] for gla_fwd_o_w, else f32 S [K, V]; A is f32 unless `fwd_w` and
/// [`uses_scores_tc`] (bf16).
///
/// With [`overlaps`] the walk runs on a high-priority side stream beside the scores (which
/// read only the prefix sums and write their own region of the scratch), joined back before
/// returning: the same kernels and bits.
fn states<T: Elem>(gpu: &Gpu, p: &DevGla<T>, s: &Parts, init: u64, fin: u64, fwd_w: bool) -> Result<()> {
    cumsum(gpu, p, s)?;
    if !(overlaps() && uses_walk(p)) {
        passing(gpu, p, s, init, fin, fwd_w)?;
        return fwd_scores(gpu, p, s, fwd_w);
    }
    let ws = &*gpu.side_streams()?[0];
    super::stream_order("gla", gpu.stream(), ws)?;
    walk_on(gpu, Some(ws), p, s, init, fin, fwd_w)?;
    fwd_scores(gpu, p, s, fwd_w)?;
    super::stream_order("gla", ws, gpu.stream())
}

/// 0: FOXLM_GLA_OVERLAP decides (on unless it is 0); 1 off, 2 on: [`set_overlap`].
static OVERLAP: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Runs the walk beside the scores on a second stream (`Some(true)`), or not, for this
/// process (the benchmark times both); none: back to FOXLM_GLA_OVERLAP's choice.
pub fn set_overlap(on: Option<bool>) {
    OVERLAP.store(on.map_or(0, |o| 1 + o as u8), std::sync::atomic::Ordering::Relaxed);
}

/// Whether the forward's walk runs beside its scores ([`set_overlap`], else on unless
/// FOXLM_GLA_OVERLAP=0, read once): the same bits, the scores' time hidden under the walk's.
pub fn overlaps() -> bool {
    static ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    match OVERLAP.load(std::sync::atomic::Ordering::Relaxed) {
        0 => *ENV.get_or_init(|| std::env::var("FOXLM_GLA_OVERLAP").map_or(true, |v| v != "0")),
        v => v == 2,
    }
}

/// The scores: the walk's on tensor cores for its forward where [`uses_scores_tc`] says so,
/// else gla_scores.
fn fwd_scores<T: Elem>(gpu: &Gpu, p: &DevGla<T>, s: &Parts, fwd_w: bool) -> Result<()> {
    if fwd_w && uses_scores_tc(p) {
        scores_w(gpu, p, s)
    } else {
        chunk_scores(gpu, p, s)
    }
}

/// The gate's prefix sums within each chunk (gla_cumsum).
fn cumsum<T: Elem>(gpu: &Gpu, p: &DevGla<T>, s: &Parts) -> Result<()> {
    let ((b, h, kd, nch), d) = ((p.batch, p.heads, p.k_dim, p.nch()), p.ints()?);
    let start = opt_ptr(gpu, p.start);
    let args = args![gpu; s.cum, p.g, start, d.t, d.h, d.k];
    launch(gpu, &kname::<T>("gla_cumsum"), ((h * kd).div_ceil(256), nch, b), 0, &args)
}

/// The states entering each chunk: the walk or the other kernels' [`chunk_states`].
fn passing<T: Elem>(gpu: &Gpu, p: &DevGla<T>, s: &Parts, init: u64, fin: u64, bf16_states: bool) -> Result<()> {
    if !uses_walk(p) {
        return chunk_states(gpu, p, s, init, fin);
    }
    walk_on(gpu, None, p, s, init, fin, bf16_states)
}

/// The walk (gla_walk_tc_k*) on `stream` (none: the GPU's stream).
fn walk_on<T: Elem>(
    gpu: &Gpu,
    stream: Option<&cudarc::driver::CudaStream>,
    p: &DevGla<T>,
    s: &Parts,
    init: u64,
    fin: u64,
    bf16_states: bool,
) -> Result<()> {
    let ((b, h, kd, vd), d) = ((p.batch, p.heads, p.k_dim, p.v_dim), p.ints()?);
    let kb = walk_kb();
    let args = args![gpu; s.hs, fin, init, p.k, p.v, s.cum, p.start, d.t, d.h, d.k, d.v, d.nch, i32::from(bf16_states)];
    let grid = (vd.div_ceil(WALK_V), kd.div_ceil(kb), b * h);
    launch_with_on(gpu, stream, &format!("gla_walk_tc_k{kb}"), grid, (WALK_V * 2) as u32, walk_smem(kb), &args)
}

/// The walk's chunk scores, bf16 A (gla_scores_w: between sub-chunks on tensor cores); K ≤ 128.
fn scores_w<T: Elem>(gpu: &Gpu, p: &DevGla<T>, s: &Parts) -> Result<()> {
    let ((b, h, kd, nch), d) = ((p.batch, p.heads, p.k_dim, p.nch()), p.ints()?);
    let kp = if kd <= 64 { 64 } else { 128 };
    let args = args![gpu; s.scores, p.q, p.k, s.cum, p.start, d.t, d.h, d.k, d.nch];
    launch(gpu, &format!("gla_scores_w_k{kp}"), (nch, b * h, 1), scores_w_smem(kp), &args)
}

/// The chunk scores A (gla_scores).
fn chunk_scores<T: Elem>(gpu: &Gpu, p: &DevGla<T>, s: &Parts) -> Result<()> {
    let ((b, h, nch), d) = ((p.batch, p.heads, p.nch()), p.ints()?);
    let args = args![gpu; s.scores, p.q, p.k, s.cum, p.start, d.t, d.h, d.k, d.nch];
    launch(gpu, &kname::<T>("gla_scores"), (nch, b * h, 1), 0, &args)
}

/// The other kernels' state passing: each chunk's own state (gla_chunk_h), then the sequential
/// gla_scan_fwd turning slot c into the state entering chunk c.
fn chunk_states<T: Elem>(gpu: &Gpu, p: &DevGla<T>, s: &Parts, init: u64, fin: u64) -> Result<()> {
    let ((b, h, kd, vd, nch), d) = ((p.batch, p.heads, p.k_dim, p.v_dim, p.nch()), p.ints()?);
    let start = opt_ptr(gpu, p.start);
    let tiles = kd.div_ceil(64) * vd.div_ceil(64);
    let args = args![gpu; s.hs, d.nch + 1, p.k, p.v, s.cum, start, d.t, d.h, d.k, d.v, 0i32, p.scale];
    launch(gpu, &vname(p, "gla_chunk_h"), (tiles, nch, b * h), 0, &args)?;
    let args = args![gpu; s.hs, fin, init, s.cum, d.b, d.t, d.h, d.k, d.v, d.nch];
    launch(gpu, "gla_scan_fwd", (p.states().div_ceil(256), 1, 1), 0, &args)?;
    Ok(())
}

/// The chunked forward, as [`crate::gla::gla_fwd`]: o [B, T, H, V] (0 at padding); `init` and
/// `final_state` [B, H, K, V] (none: a zero initial state / not wanted); `scratch` of
/// [`gla_fwd_scratch_len`] floats.
pub fn gla_fwd<T: Elem>(
    gpu: &Gpu,
    p: &DevGla<T>,
    o: &mut CudaSlice<T>,
    init: Option<&CudaSlice<f32>>,
    final_state: Option<&mut CudaSlice<f32>>,
    scratch: &mut CudaSlice<f32>,
) -> Result<()> {
    need_opt("gla_fwd", "init", init, p.states())?;
    let fin = match final_state {
        Some(f) => {
            need("gla_fwd", "final_state", &*f, p.states())?;
            ptr(gpu, f)
        }
        None => 0,
    };
    fwd(gpu, p, o, opt_ptr(gpu, init), fin, scratch)
}

/// [`gla_fwd`] continuing `state` [B, H, K, V]: the initial state, replaced by the final one
/// (a chunked prefill with a state).
pub fn gla_fwd_continuing<T: Elem>(
    gpu: &Gpu,
    p: &DevGla<T>,
    o: &mut CudaSlice<T>,
    state: &mut CudaSlice<f32>,
    scratch: &mut CudaSlice<f32>,
) -> Result<()> {
    need("gla_fwd", "state", state, p.states())?;
    // gla_scan_fwd reads each element of init before it writes that element of fin.
    let s = ptr(gpu, state);
    fwd(gpu, p, o, s, s, scratch)
}

fn fwd<T: Elem>(
    gpu: &Gpu,
    p: &DevGla<T>,
    o: &mut CudaSlice<T>,
    init: u64,
    fin: u64,
    scratch: &mut CudaSlice<f32>,
) -> Result<()> {
    let op = "gla_fwd";
    p.check(op)?;
    let (b, t, h, kd, vd) = (p.batch, p.seq, p.heads, p.k_dim, p.v_dim);
    need(op, "o", o, b * t * h * vd)?;
    need(op, "scratch", scratch, gla_fwd_scratch_len(b, t, h, kd, vd))?;
    if b * t == 0 {
        return Ok(());
    }
    let s = parts(gpu, p, scratch);
    // The walk's output kernel takes K ≤ 128 (its tiles); wider keys keep the tensor-core one.
    states(gpu, p, &s, init, fin, walk_out(p))?;
    output(gpu, p, o, &s)
}

/// Whether the forward's states go to the walk's output kernel (bf16 Sᵀ; K ≤ 128, its tiles).
fn walk_out<T: Elem>(p: &DevGla<T>) -> bool {
    uses_walk(p) && p.k_dim <= 128
}

/// The forward's outputs from the chunk states and scores.
fn output<T: Elem>(gpu: &Gpu, p: &DevGla<T>, o: &mut CudaSlice<T>, s: &Parts) -> Result<()> {
    let ((b, h, kd, vd, nch), d) = ((p.batch, p.heads, p.k_dim, p.v_dim, p.nch()), p.ints()?);
    let args = args![gpu; o, p.q, p.v, s.cum, s.hs, s.scores, p.start, d.t, d.h, d.k, d.v, d.nch, p.scale];
    if walk_out(p) {
        let kp = if kd <= 64 { 64 } else { 128 };
        let name = format!("gla_fwd_o_w{}_k{kp}", if uses_scores_tc(p) { "16" } else { "" });
        return launch(gpu, &name, (vd.div_ceil(64), nch, b * h), out_w_smem(kp), &args);
    }
    launch(gpu, &vname(p, "gla_fwd_o"), (vd.div_ceil(64), nch, b * h), 0, &args)
}

/// Each kernel of the forward alone (ms, medians of `iters` after `warmup`, CUDA events), for
/// `fox-attn bench-gla`: the gate's prefix sums, the state passing (the walk, or the chunk states
/// and the scan), the scores, the outputs. `scratch` of [`gla_fwd_scratch_len`] floats.
pub fn fwd_kernel_ms<T: Elem>(
    gpu: &Gpu,
    p: &DevGla<T>,
    o: &mut CudaSlice<T>,
    scratch: &mut CudaSlice<f32>,
    warmup: usize,
    iters: usize,
) -> Result<[f64; 4]> {
    let op = "gla_fwd kernel_ms";
    p.check(op)?;
    let (b, t, h, kd, vd) = (p.batch, p.seq, p.heads, p.k_dim, p.v_dim);
    need(op, "o", o, b * t * h * vd)?;
    need(op, "scratch", scratch, gla_fwd_scratch_len(b, t, h, kd, vd))?;
    let s = parts(gpu, p, scratch);
    let tm = |f: &mut dyn FnMut() -> Result<()>| super::time_ms(gpu, warmup, iters, f);
    Ok([
        tm(&mut || cumsum(gpu, p, &s))?,
        tm(&mut || passing(gpu, p, &s, 0, 0, walk_out(p)))?,
        tm(&mut || fwd_scores(gpu, p, &s, walk_out(p)))?,
        tm(&mut || output(gpu, p, o, &s))?,
    ])
}

/// The chunked backward, as [`crate::gla::gla_bwd`]: from do [B, T, H, V] (its padded rows
/// ignored), the forward's `init` and the final state's gradient `dfinal` (none: 0), writes
/// every gradient of `g` (0 at padding); `scratch` of [`gla_bwd_scratch_len`] floats.
/// Recomputes the forward's states and scores.
pub fn gla_bwd<T: Elem>(
    gpu: &Gpu,
    p: &DevGla<T>,
    dout: &CudaSlice<T>,
    init: Option<&CudaSlice<f32>>,
    dfinal: Option<&CudaSlice<f32>>,
    g: DevGlaGrads<T>,
    scratch: &mut CudaSlice<f32>,
) -> Result<()> {
    let op = "gla_bwd";
    p.check(op)?;
    let (b, t, h, kd, vd, nch) = (p.batch, p.seq, p.heads, p.k_dim, p.v_dim, p.nch());
    let (nk, nv) = (b * t * h * kd, b * t * h * vd);
    need(op, "dout", dout, nv)?;
    need(op, "dq", g.dq, nk)?;
    need(op, "dk", g.dk, nk)?;
    need(op, "dg", g.dg, nk)?;
    need(op, "dv", g.dv, nv)?;
    p.shape().check_states(op, init, dfinal, g.dinit.as_deref())?;
    need(op, "scratch", scratch, gla_bwd_scratch_len(b, t, h, kd, vd))?;
    if b * t == 0 {
        return Ok(());
    }
    let s = parts(gpu, p, scratch);
    states(gpu, p, &s, opt_ptr(gpu, init), 0, false)?;
    let start = opt_ptr(gpu, p.start);
    let d = p.ints()?;
    let pdo = ptr(gpu, dout);
    // ΔdS_c = scale (q ⊙ e^G)ᵀ do per chunk, then the reverse passing into dH_c.
    let args = args![gpu; s.dhs, d.nch, p.q, pdo, s.cum, start, d.t, d.h, d.k, d.v, 1i32, p.scale];
    launch(gpu, &vname(p, "gla_chunk_h"), (kd.div_ceil(64) * vd.div_ceil(64), nch, b * h), 0, &args)?;
    let args = args![gpu; s.dhs, g.dinit, dfinal, s.cum, d.b, d.t, d.h, d.k, d.v, d.nch];
    launch(gpu, "gla_scan_bwd", (p.states().div_ceil(256), 1, 1), 0, &args)?;
    let args = args![gpu; s.dscores, pdo, p.v, start, d.t, d.h, d.v, d.nch, p.scale];
    launch(gpu, &vname(p, "gla_dscores"), (nch, b * h, 1), 0, &args)?;
    let args = args![gpu; g.dv, p.k, pdo, s.cum, s.scores, s.dhs, start, d.t, d.h, d.k, d.v, d.nch, p.scale];
    launch(gpu, &vname(p, "gla_bwd_dv"), (vd.div_ceil(64), nch, b * h), 0, &args)?;
    let args = args![
        gpu;
        g.dq, g.dk, g.dg, p.q, p.k, p.v, pdo, s.cum, s.hs, s.dhs, s.dscores, start, d.t, d.h, d.k, d.v, d.nch, p.scale,
    ];
    launch(gpu, &vname(p, "gla_bwd_dqk"), (kd.div_ceil(64), nch, b * h), 4 * DQK_SMEM_FLOATS, &args)
}

/// One decoding step, as [`crate::gla::gla_decode_step`]: `p.seq` = 1, state [B, H, K, V] in
/// place, o [B, H, V]; a row with start > 0 is padding (o = 0, state unchanged). K ≤
/// [`DECODE_KMAX`].
pub fn gla_decode_step<T: Elem>(
    gpu: &Gpu,
    p: &DevGla<T>,
    state: &mut CudaSlice<f32>,
    o: &mut CudaSlice<T>,
) -> Result<()> {
    let op = "gla_decode_step";
    p.check(op)?;
    if !p.shape().check_decode(op, DECODE_KMAX, state, o)? {
        return Ok(());
    }
    let d = p.ints()?;
    let args = args![gpu; state, o, p.q, p.k, p.v, p.g, p.start, d.h, d.k, d.v, p.scale];
    launch(gpu, &kname::<T>("gla_decode"), (p.batch * p.heads, p.v_dim.div_ceil(32), 1), 0, &args)
}

/// A row of the lower bounds [L, d]: the buffer and the row's first element.
pub type LbRow<'a> = (&'a CudaSlice<f32>, usize);

/// HGRN2's gates over n values in rows of d, as foxlm's CPU `hgrn2_gates_fwd`: q = silu(q_in);
/// g = logsigmoid(f), with a lower-bound row ln(lb + (1 − lb)·σ(f)) (fla's logaddexp form);
/// k = 1 − e^g.
#[allow(clippy::too_many_arguments)]
pub fn hgrn2_gates_fwd<T: Elem>(
    gpu: &Gpu,
    q: &mut CudaSlice<T>,
    k: &mut CudaSlice<T>,
    g: &mut CudaSlice<T>,
    q_in: &CudaSlice<T>,
    f: &CudaSlice<T>,
    lb: Option<LbRow>,
    n: usize,
    d: usize,
) -> Result<()> {
    let op = "hgrn2_gates_fwd";
    ensure!(d > 0 && n.is_multiple_of(d), "{op}: {n} values are not rows of {d}");
    need_lens(op, n, &[("q", q.len()), ("k", k.len()), ("g", g.len()), ("q_in", q_in.len()), ("f", f.len())])?;
    let lbp = lb_ptr(gpu, op, lb, d)?;
    if n == 0 {
        return Ok(());
    }
    let args = args![gpu; q, k, g, q_in, f, lbp, n as i64, int(op, d)?];
    launch(gpu, &kname::<T>("hgrn2_gates_fwd"), (n.div_ceil(256).min(65536), 1, 1), 0, &args)
}

fn lb_ptr(gpu: &Gpu, op: &str, lb: Option<LbRow>, d: usize) -> Result<u64> {
    Ok(match lb {
        Some((s, at)) => {
            need(op, "lower bounds", s, at + d)?;
            ptr(gpu, s) + 4 * at as u64
        }
        None => 0,
    })
}

/// Floats of the scratch of [`hgrn2_gates_bwd`]: one partial sum of the lower bound's gradient
/// per 256 rows and column.
pub fn hgrn2_gates_bwd_scratch_len(rows: usize, d: usize) -> usize {
    rows.div_ceil(GATE_ROWS_PER_PART).max(1) * d
}

/// What [`hgrn2_gates_bwd`] reads: the gates' gradients and the forward's inputs and g.
pub struct GateInputs<'a, T: Elem> {
    pub dq: &'a CudaSlice<T>,
    pub dk: &'a CudaSlice<T>,
    pub dg: &'a CudaSlice<T>,
    pub q_in: &'a CudaSlice<T>,
    pub f: &'a CudaSlice<T>,
    pub g: &'a CudaSlice<T>,
}

/// The gates' backward over `rows` rows of d, as foxlm's CPU `hgrn2_gates_bwd`: writes dq_in and
/// df; with a lower-bound row `lb`, overwrites row `dlb` (the buffer and the row's first element)
/// with that bound's gradient, summed over the rows in a fixed order through `scratch` of
/// [`hgrn2_gates_bwd_scratch_len`] floats.
#[allow(clippy::too_many_arguments)]
pub fn hgrn2_gates_bwd<T: Elem>(
    gpu: &Gpu,
    dq_in: &mut CudaSlice<T>,
    df: &mut CudaSlice<T>,
    x: GateInputs<T>,
    lb: Option<LbRow>,
    dlb: Option<(&mut CudaSlice<f32>, usize)>,
    scratch: &mut CudaSlice<f32>,
    rows: usize,
    d: usize,
) -> Result<()> {
    let op = "hgrn2_gates_bwd";
    let n = rows * d;
    need_lens(
        op,
        n,
        &[
            ("dq_in", dq_in.len()),
            ("df", df.len()),
            ("dq", x.dq.len()),
            ("dk", x.dk.len()),
            ("dg", x.dg.len()),
            ("q_in", x.q_in.len()),
            ("f", x.f.len()),
            ("g", x.g.len()),
        ],
    )?;
    ensure!(lb.is_some() == dlb.is_some(), "{op}: a lower-bound row needs its gradient row, and only it");
    let lbp = lb_ptr(gpu, op, lb, d)?;
    let nparts = rows.div_ceil(GATE_ROWS_PER_PART).max(1);
    need(op, "scratch", scratch, hgrn2_gates_bwd_scratch_len(rows, d))?;
    let dst = match dlb {
        Some((s, at)) => {
            need(op, "dlb", &*s, at + d)?;
            ptr(gpu, s) + 4 * at as u64
        }
        None => 0,
    };
    let part = if lbp != 0 { ptr(gpu, scratch) } else { 0 };
    if n > 0 {
        let args = args![
            gpu;
            dq_in, df, part, x.dq, x.dk, x.dg, x.q_in, x.f, x.g, lbp, rows as i64, int(op, d)?,
            GATE_ROWS_PER_PART as i32,
        ];
        launch(gpu, &kname::<T>("hgrn2_gates_bwd"), (d.div_ceil(256), nparts, 1), 0, &args)?;
    }
    if dst != 0 {
        if n == 0 {
            gpu.stream()
                .memset_zeros(&mut scratch.slice_mut(0..d))
                .map_err(|e| anyhow!("{op}: zeroing the partial sums: {e:?}"))?;
        }
        let args = args![gpu; dst, scratch, int(op, nparts)?, int(op, d)?];
        launch(gpu, "gla_colsum_set", (d.div_ceil(256), 1, 1), 0, &args)?;
    }
    Ok(())
}

/// HGRN2's lower bounds [L, d] from the parameter `raw` [L, d], as foxlm's CPU
/// `hgrn2_lower_bounds_fwd` (in f64): the softmax over layers, its cumulative sum less the first
/// row.
pub fn hgrn2_lower_bounds_fwd(gpu: &Gpu, lb: &mut CudaSlice<f32>, raw: &CudaSlice<f32>, layers: usize) -> Result<()> {
    let (op, n) = ("hgrn2_lower_bounds_fwd", raw.len());
    ensure!(layers > 0 && n.is_multiple_of(layers), "{op}: {n} values for {layers} layers");
    need(op, "lb", lb, n)?;
    let d = n / layers;
    let args = args![gpu; lb, raw, int(op, layers)?, int(op, d)?];
    launch(gpu, "hgrn2_lower_bounds_fwd", (d.div_ceil(256), 1, 1), 0, &args)
}

/// The lower bounds' backward: from dlb [L, d] (row 0 not read) adds the parameter's gradient
/// into `grad` [L, d].
pub fn hgrn2_lower_bounds_bwd(
    gpu: &Gpu,
    grad: &mut CudaSlice<f32>,
    dlb: &CudaSlice<f32>,
    raw: &CudaSlice<f32>,
    layers: usize,
) -> Result<()> {
    let (op, n) = ("hgrn2_lower_bounds_bwd", raw.len());
    ensure!(layers > 0 && n.is_multiple_of(layers), "{op}: {n} values for {layers} layers");
    need(op, "grad", grad, n)?;
    need(op, "dlb", dlb, n)?;
    let d = n / layers;
    let args = args![gpu; grad, dlb, raw, int(op, layers)?, int(op, d)?];
    launch(gpu, "hgrn2_lower_bounds_bwd", (d.div_ceil(256), 1, 1), 0, &args)
}
