//! Forgetting Attention on the GPU: the launch API, mirroring the CPU [`crate::attention`].
//!
//! q, k, v are bf16 or fp16 (stored as raw `u16` bits) in strided [B, H, T, D] views with D
//! contiguous; the gate prefix sums c, softmax statistics and every accumulator are fp32. The
//! output and the gradients dq, dk, dv are in the input's dtype, [B, T, H, D]; lse, dcq, dck are
//! f32. Head dims 64 and 128.
//!
//! Visibility is one of three per-row key starts (as on the CPU): every key, left padding
//! (`start[b]`), or packed documents (`start[b*tq + r]`, the first key of row r's document).
//! Starts must be non-decreasing along each batch row (documents are contiguous), which
//! [`upload_visibility`] checks.
//!
//! Grouped-query attention and the sliding window are [`AttnOptions`] beside the problem, an
//! argument of every entry point (`AttnOptions::default()`: multi-head attention without a window).

use super::compile::{ATTENTION, FGATE};
use super::kargs::{self, args, by_value, ptr};
use super::Gpu;
use crate::attention::Visibility;
use anyhow::{bail, ensure, Result};
use cudarc::driver::{CudaSlice, DevicePtr, DeviceRepr};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    Bf16,
    F16,
}

impl DType {
    fn suffix(self) -> &'static str {
        match self {
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
        }
    }
}

/// A strided [B, H, T, D] view of a device buffer: element (b, h, t, d) at b·sb + h·sh + t·st + d.
#[derive(Clone, Copy)]
pub struct DevView<'a> {
    /// Any device buffer of 16-bit elements (a CudaSlice<u16>, or a bf16 buffer seen as u16).
    pub data: &'a dyn DevicePtr<u16>,
    /// Element offset of (0, 0, 0, 0), e.g. to select k inside a packed qkv buffer.
    pub off: usize,
    pub sb: usize,
    pub sh: usize,
    pub st: usize,
}

impl<'a> DevView<'a> {
    /// [B, T, H·D], a projection's output.
    pub fn bthd(data: &'a dyn DevicePtr<u16>, t: usize, h: usize, d: usize) -> Self {
        Self { data, off: 0, sb: t * h * d, sh: d, st: h * d }
    }
    /// [B, H, T, D], the decode cache.
    pub fn bhtd(data: &'a dyn DevicePtr<u16>, t: usize, d: usize, h: usize) -> Self {
        Self { data, off: 0, sb: h * t * d, sh: t * d, st: d }
    }
}

/// Which keys a query row may see besides causality (device copy of [`Visibility`]).
#[derive(Clone, Copy)]
pub enum DevVisibility<'a> {
    All,
    /// `start[b]`, len B.
    LeftPadded(&'a CudaSlice<i32>),
    /// `start[b*tq + r]`, len B·tq, non-decreasing in r.
    PerRow(&'a CudaSlice<i32>),
}

/// One attention problem on the device; fields as in [`crate::attention::Problem`].
#[derive(Clone, Copy)]
pub struct DevProblem<'a> {
    pub batch: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub tq: usize,
    pub tk: usize,
    pub q_pos0: usize,
    pub dtype: DType,
    pub q: DevView<'a>,
    pub k: DevView<'a>,
    pub v: DevView<'a>,
    /// [B, H, tq]
    pub cq: &'a CudaSlice<f32>,
    /// [B, H, tk]
    pub ck: &'a CudaSlice<f32>,
    pub vis: DevVisibility<'a>,
    pub scale: f32,
    /// ACP threshold δ per (b, h), natural-log units (see [`acp_thresholds_from_norms`]).
    pub prune: Option<&'a CudaSlice<f32>>,
}

/// Grouped-query attention and the sliding window (as the CPU's `kv_heads` and `window`). The
/// default is multi-head attention over every earlier key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttnOptions {
    /// k/v heads H_kv, a divisor of the query heads: query head h reads k/v head h / (H / H_kv),
    /// k and v views have H_kv heads and dk, dv are [B, tk, H_kv, D] (summed over each group).
    /// None: as many as query heads.
    pub kv_heads: Option<usize>,
    /// w ≥ 1: the query at position i sees keys i − w < j ≤ i. None: every earlier key.
    pub window: Option<usize>,
}

impl AttnOptions {
    /// H_kv for a problem of `heads` query heads.
    pub fn kv_heads(&self, heads: usize) -> usize {
        self.kv_heads.unwrap_or(heads)
    }
}

/// Key tiles visited and skipped by ACP in the forward, at the kernel's tile size (64 keys and 128
/// query rows for the mma.sync kernel, 128 keys for the wgmma kernel; the decode kernel's block
/// is its tq rows).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TileStats {
    pub tiles_visited: u64,
    pub tiles_pruned: u64,
}

impl TileStats {
    pub fn pruned_fraction(&self) -> f64 {
        let t = self.tiles_visited + self.tiles_pruned;
        if t == 0 {
            0.0
        } else {
            self.tiles_pruned as f64 / t as f64
        }
    }
}

/// Which forward kernel to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FwdKernel {
    /// Decode kernel for tq ≤ 16 against ≥ 256 keys, else the tiled kernel.
    #[default]
    Auto,
    /// The FlashAttention-2-style kernel (128 query rows per block).
    Tiled,
    /// Split-K decode kernel (tq ≤ 16).
    Decode,
}

/// Layout of the kernel parameter block; must match `AttnParams` in kernels/common.cuh.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct AttnParams {
    q: u64,
    k: u64,
    v: u64,
    q_sb: i64,
    q_sh: i64,
    q_st: i64,
    k_sb: i64,
    k_sh: i64,
    k_st: i64,
    v_sb: i64,
    v_sh: i64,
    v_st: i64,
    o: u64,
    lse: u64,
    cq: u64,
    ck: u64,
    start: u64,
    prune: u64,
    counters: u64,
    o_in: u64,
    dout: u64,
    lse_in: u64,
    delta: u64,
    dq: u64,
    dk: u64,
    dv: u64,
    dcq: u64,
    dck: u64,
    part_o: u64,
    part_ml: u64,
    b: i32,
    h: i32,
    tq: i32,
    tk: i32,
    q_pos0: i32,
    start_mode: i32,
    splits: i32,
    scale: f32,
    hkv: i32,
    window: i32,
    q_pos0_dev: u64,
    sem: u64,
}
// SAFETY: plain old data with the C layout the kernels expect.
unsafe impl DeviceRepr for AttnParams {}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ScanParams {
    in1: u64,
    in2: u64,
    out: u64,
    start: u64,
    b: i32,
    h: i32,
    t: i32,
    start_mode: i32,
}
// SAFETY: as above (ScanParams in kernels/fgate.cu).
unsafe impl DeviceRepr for ScanParams {}

/// Checks that hold for every launch.
fn validate(p: &DevProblem, o: AttnOptions) -> Result<()> {
    ensure!(p.head_dim == 64 || p.head_dim == 128, "GPU attention supports head_dim 64 and 128, got {}", p.head_dim);
    ensure!(p.batch > 0 && p.heads > 0 && p.tq > 0 && p.tk > 0, "empty attention problem");
    let hkv = o.kv_heads(p.heads);
    ensure!(hkv > 0 && p.heads.is_multiple_of(hkv), "kv_heads {hkv} must divide the {} query heads", p.heads);
    if let Some(w) = o.window {
        ensure!(w >= 1 && w < i32::MAX as usize, "sliding window {w}: must be at least 1 key (and fit 32 bits)");
    }
    ensure!(p.q_pos0 + p.tq <= p.tk, "query rows end at {} but there are only {} keys", p.q_pos0 + p.tq, p.tk);
    ensure!(p.tk < i32::MAX as usize / 2 && p.batch * p.tq < i32::MAX as usize, "sequence too long for 32-bit indices");
    let d = p.head_dim;
    for (name, v, t, heads) in [("q", &p.q, p.tq, p.heads), ("k", &p.k, p.tk, hkv), ("v", &p.v, p.tk, hkv)] {
        ensure!(
            v.off % 8 == 0 && v.sb % 8 == 0 && v.sh % 8 == 0 && v.st % 8 == 0,
            "{name}: strides must be multiples of 8 elements (16-byte loads)"
        );
        let last = v.off + (p.batch - 1) * v.sb + (heads - 1) * v.sh + (t - 1) * v.st + d;
        ensure!(last <= v.data.len(), "{name}: view reaches element {last} of a buffer of {}", v.data.len());
    }
    ensure!(p.cq.len() >= p.batch * p.heads * p.tq, "cq too short");
    ensure!(p.ck.len() >= p.batch * p.heads * p.tk, "ck too short");
    match p.vis {
        DevVisibility::All => {}
        DevVisibility::LeftPadded(s) => ensure!(s.len() >= p.batch, "left-padding starts: need {} entries", p.batch),
        DevVisibility::PerRow(s) => {
            ensure!(s.len() >= p.batch * p.tq, "per-row starts: need {} entries", p.batch * p.tq)
        }
    }
    if let Some(th) = p.prune {
        ensure!(th.len() >= p.batch * p.heads, "ACP thresholds: need {} entries", p.batch * p.heads);
    }
    Ok(())
}

fn params(gpu: &Gpu, p: &DevProblem, o: AttnOptions) -> AttnParams {
    let (start, mode) = match p.vis {
        DevVisibility::All => (0, 0),
        DevVisibility::LeftPadded(s) => (ptr(gpu, s), 1),
        DevVisibility::PerRow(s) => (ptr(gpu, s), 2),
    };
    AttnParams {
        q: ptr(gpu, p.q.data) + 2 * p.q.off as u64,
        k: ptr(gpu, p.k.data) + 2 * p.k.off as u64,
        v: ptr(gpu, p.v.data) + 2 * p.v.off as u64,
        q_sb: p.q.sb as i64,
        q_sh: p.q.sh as i64,
        q_st: p.q.st as i64,
        k_sb: p.k.sb as i64,
        k_sh: p.k.sh as i64,
        k_st: p.k.st as i64,
        v_sb: p.v.sb as i64,
        v_sh: p.v.sh as i64,
        v_st: p.v.st as i64,
        cq: ptr(gpu, p.cq),
        ck: ptr(gpu, p.ck),
        start,
        start_mode: mode,
        prune: p.prune.map_or(0, |t| ptr(gpu, t)),
        b: p.batch as i32,
        h: p.heads as i32,
        tq: p.tq as i32,
        tk: p.tk as i32,
        q_pos0: p.q_pos0 as i32,
        scale: p.scale,
        splits: 1,
        hkv: o.kv_heads(p.heads) as i32,
        window: o.window.map_or(0, |w| w as i32),
        ..Default::default()
    }
}

/// Launches pass `pass` of the attention kernels for `p` (`fox_{pass}_d{D}_{dtype}`), which takes
/// one parameter block: `prm` matches the kernel's, and every pointer in it was validated against
/// its buffer's length (`validate`, and the scratch its launcher sizes).
fn launch<P: DeviceRepr>(
    gpu: &Gpu,
    pass: &str,
    p: &DevProblem,
    grid: (u32, u32, u32),
    threads: u32,
    smem: usize,
    prm: &P,
) -> Result<()> {
    let name = format!("fox_{pass}_d{}_{}", p.head_dim, p.dtype.suffix());
    kargs::launch(gpu, &ATTENTION, &name, kargs::plain_config(grid, threads, smem), &[by_value(prm)])
}

const FWD_BQ: usize = 128;
const BK: usize = 64;
const DKDV_BK: usize = 128;

/// Warps per forward block (16 query rows each): `FOX_FWD_WARPS` = 4 or 8 (default 8).
fn fwd_warps() -> usize {
    match std::env::var("FOX_FWD_WARPS").ok().as_deref() {
        Some("4") => 4,
        _ => 8,
    }
}

/// Which family of kernels the forward and backward use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelPath {
    /// wgmma on sm_90a, mma.sync elsewhere (environment variables below may override).
    Auto,
    /// FlashAttention-2-style mma.sync kernels (any sm_80+ GPU).
    MmaSync,
    /// Hopper wgmma kernels (kernels/wgmma.cu; sm_90a; falls back to mma.sync elsewhere).
    Wgmma,
    /// The warp-specialised kernels (kernels/attention_ws.cu: TMA loads, a producer warpgroup and
    /// two consumers, ping-pong; sm_90a).
    WarpSpecialised,
}

static KERNEL_PATH: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Force a kernel family for this process (the GPU check runs both); `Auto` restores the default.
pub fn set_kernel_path(k: KernelPath) {
    let v = match k {
        KernelPath::Auto => 0,
        KernelPath::MmaSync => 1,
        KernelPath::Wgmma => 2,
        KernelPath::WarpSpecialised => 3,
    };
    KERNEL_PATH.store(v, std::sync::atomic::Ordering::Relaxed);
}

fn forced_path() -> Option<bool> {
    match KERNEL_PATH.load(std::sync::atomic::Ordering::Relaxed) {
        1 => Some(false),
        2 | 3 => Some(true),
        _ => None,
    }
}

/// Whether the tiled forward uses the warp-specialised kernel: sm_90a, by default (measured
/// faster in BENCHMARKS.md); `FOX_FWD_WS=0` selects the wgmma kernel.
fn use_ws(gpu: &Gpu) -> bool {
    ws_chosen(gpu, "FOX_FWD_WS", "FOX_FWD_WGMMA")
}

/// The warp-specialised kernels run on sm_90a under their kernel path, or by default unless the
/// environment turns them (`ws_var`) or the wgmma family (`wgmma_var`) off.
fn ws_chosen(gpu: &Gpu, ws_var: &str, wgmma_var: &str) -> bool {
    let on = |var: &str| std::env::var(var).map(|v| v != "0").unwrap_or(true);
    let chosen = match KERNEL_PATH.load(std::sync::atomic::Ordering::Relaxed) {
        3 => true,
        0 => on(ws_var) && on(wgmma_var),
        _ => false,
    };
    gpu.arch() == "sm_90a" && chosen
}

/// Whether the tiled forward uses the wgmma kernel (sm_90a only; default there, measured faster
/// in BENCHMARKS.md); `FOX_FWD_WGMMA=0` selects the mma.sync kernel, which other GPUs use.
fn use_wgmma(gpu: &Gpu, _d: usize) -> bool {
    gpu.arch() == "sm_90a"
        && forced_path().unwrap_or_else(|| std::env::var("FOX_FWD_WGMMA").map(|v| v != "0").unwrap_or(true))
}

/// Whether the backward uses the wgmma kernels (sm_90a only; default there); `FOX_BWD_WGMMA=0`
/// selects the mma.sync kernels.
fn use_wgmma_bwd(gpu: &Gpu, _d: usize) -> bool {
    gpu.arch() == "sm_90a"
        && forced_path().unwrap_or_else(|| std::env::var("FOX_BWD_WGMMA").map(|v| v != "0").unwrap_or(true))
}

/// Warpgroups per block of the wgmma kernels: `FOX_WG_NWG` = 1 (two blocks per SM that drift
/// apart, so one's softmax overlaps the other's matrix work) or 2. Default: 1 for the forward at
/// head dim 64, else 2 (measured, BENCHMARKS.md).
fn wgmma_nwg(forward_d64: bool) -> usize {
    match std::env::var("FOX_WG_NWG").ok().as_deref() {
        Some("1") => 1,
        Some("2") => 2,
        _ if forward_d64 => 1,
        _ => 2,
    }
}

/// Key tile of the wgmma forward: `FOX_WG_BK` = 64 or 128 (default 128, measured faster).
fn wgmma_bk() -> usize {
    match std::env::var("FOX_WG_BK").ok().as_deref() {
        Some("64") => 64,
        _ => 128,
    }
}
fn fwd_smem(d: usize, warps: usize) -> usize {
    (16 * warps * d + 4 * BK * d) * 2 + 2 * BK * 4
}
fn decode_smem(d: usize) -> usize {
    (16 * d + 4 * BK * d) * 2 + 2 * BK * 4
}
fn dq_smem(d: usize) -> usize {
    (2 * FWD_BQ * d + 4 * BK * d) * 2 + 2 * BK * 4
}
fn dkdv_bqb(d: usize) -> usize {
    if d <= 64 {
        64
    } else {
        32
    }
}
fn dkdv_smem(d: usize) -> usize {
    let bqb = dkdv_bqb(d);
    (2 * DKDV_BK * d + 4 * bqb * d) * 2 + 4 * 2 * bqb * 4
}

/// The split-K decode kernel's partial results, allocated once for a problem shape so that a
/// decode step allocates nothing (and can be captured in a CUDA graph).
pub struct DecodeScratch {
    part_o: CudaSlice<f32>,
    part_ml: CudaSlice<f32>,
    /// An arrival counter per (b, h), zero between launches.
    sem: CudaSlice<u32>,
    splits: usize,
    /// (B·H, D, tk) it was sized for.
    pub shape: (usize, usize, usize),
}

impl DecodeScratch {
    pub fn new(gpu: &Gpu, batch: usize, heads: usize, head_dim: usize, tk: usize) -> Result<Self> {
        let splits = decode_splits(gpu, batch * heads, tk);
        let bh = batch * heads;
        Ok(Self {
            part_o: gpu.zeros::<f32>(splits * bh * 16 * head_dim)?,
            part_ml: gpu.zeros::<f32>(splits * bh * 16 * 2)?,
            sem: gpu.zeros::<u32>(bh)?,
            splits,
            shape: (bh, head_dim, tk),
        })
    }
}

/// Splits of the keys so that the decode grid fills the GPU about twice, at least two key tiles
/// per split (with one tile per split the merge of more splits costs more than the shorter
/// splits save; docs/kernel-notes.md).
fn decode_splits(gpu: &Gpu, bh: usize, tk: usize) -> usize {
    let tiles = tk.div_ceil(BK);
    let want = (2 * gpu.sm_count()).div_ceil(bh.max(1));
    want.clamp(1, tiles.div_ceil(2).max(1)).min(64)
}

/// A FoX (Pro) layer's per-head output norm and output gate, z = RMSNorm(o)·w·sigmoid(g), which
/// the one-row decode kernel's last split applies to the row it has merged (the fused decode step
/// then has no separate launch for them); bitwise as the fused step's `fox_decode_out` after the
/// attention. The layout of kernels/attention_decode.cu's `DecodeOut`: device addresses the caller
/// has checked, z holding B·H·D bf16 values, norm_w (0: no norm) H·D, and gate (0: no gate) the
/// logits of row b, head h, channel i at b·gate_ld + gate_off + h·D + i. With it and the keys in
/// more than one split, the kernel is launched as a programmatic dependent of the kernel before
/// it (its first keys load while that one runs), which must have written nothing it reads but q,
/// the query's gate sum and the key at the query's position: the fused step's `fox_decode_in`.
/// With one split a head (a large batch) the walk is long and an early start only takes the SMs
/// from the kernel before (BENCHMARKS.md).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DecodeOut {
    pub z: u64,
    pub norm_w: u64,
    pub gate: u64,
    pub gate_ld: i64,
    pub gate_off: i32,
    pub eps: f32,
}
// SAFETY: plain old data with the C layout the kernel expects.
unsafe impl DeviceRepr for DecodeOut {}

/// The decode kernel (tq <= 16) with preallocated partials; with `q_pos0_dev` the query rows'
/// first position is read from the device (the value in `p.q_pos0` only sizes the checks). With
/// grouped-query attention and/or a sliding window (`opts`), and for one bf16 query row per (b, h)
/// the output norm and gate `then` (returns whether it was applied: otherwise the caller applies
/// them). The scratch is per query head (B·H) either way; the window is measured
/// from the query rows' positions, so with `q_pos0_dev` it follows the device's length.
#[allow(clippy::too_many_arguments)]
pub fn decode_into(
    gpu: &Gpu,
    p: &DevProblem,
    opts: AttnOptions,
    out: &dyn DevicePtr<u16>,
    lse: &mut CudaSlice<f32>,
    scratch: &DecodeScratch,
    q_pos0_dev: Option<&CudaSlice<i32>>,
    then: Option<DecodeOut>,
) -> Result<bool> {
    validate(p, opts)?;
    let (bb, hh, d) = (p.batch, p.heads, p.head_dim);
    ensure!(p.tq <= 16, "the decode kernel takes at most 16 query rows, got {}", p.tq);
    ensure!(scratch.shape == (bb * hh, d, p.tk), "decode scratch sized for another problem");
    ensure!(out.len() >= bb * p.tq * hh * d && lse.len() >= bb * hh * p.tq, "decode output too short");
    let mut prm = params(gpu, p, opts);
    prm.o = ptr(gpu, out);
    prm.lse = ptr(gpu, lse);
    prm.q_pos0_dev = q_pos0_dev.map_or(0, |c| ptr(gpu, c));
    let then = then.filter(|_| p.dtype == DType::Bf16 && decode_row_kernel(p));
    launch_decode(gpu, p, prm, scratch, then)?;
    Ok(then.is_some())
}

/// The split-K decode kernel with its partials in `scratch` (sized for `p`); `prm` holds the
/// problem and the outputs. One query row per (b, h) takes the kernel built for it
/// (kernels/attention_decode.cu), with the output epilogue `then` when given.
fn launch_decode(
    gpu: &Gpu,
    p: &DevProblem,
    mut prm: AttnParams,
    scratch: &DecodeScratch,
    then: Option<DecodeOut>,
) -> Result<()> {
    prm.part_o = ptr(gpu, &scratch.part_o);
    prm.part_ml = ptr(gpu, &scratch.part_ml);
    prm.splits = scratch.splits as i32;
    prm.sem = ptr(gpu, &scratch.sem);
    let grid = (scratch.splits as u32, (p.batch * p.heads) as u32, 1);
    if decode_row_kernel(p) {
        let name = format!("fox_decode1_d{}_{}", p.head_dim, p.dtype.suffix());
        let cfg = kargs::plain_config(grid, 128, 0);
        let epilogue = then.unwrap_or_default();
        let args = [by_value(&prm), by_value(&epilogue)];
        return match then {
            Some(_) if scratch.splits > 1 => kargs::launch_pdl(gpu, &ATTENTION, &name, cfg, &args),
            _ => kargs::launch(gpu, &ATTENTION, &name, cfg, &args),
        };
    }
    launch(gpu, "decode", p, grid, 128, decode_smem(p.head_dim), &prm)
}

/// Whether `p` takes the one-row decode kernel: one query row per (b, h), unless
/// `FOXLM_DECODE_ROW=0` asks for the 16-row mma tiles (read once: this runs every decode step).
fn decode_row_kernel(p: &DevProblem) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    p.tq == 1 && *ON.get_or_init(|| std::env::var("FOXLM_DECODE_ROW").map(|v| v != "0").unwrap_or(true))
}

/// Forward: `out` [B, tq, H, D] in the input dtype, `lse` [B, H, tq] (natural log, −∞ for rows
/// that see no key), with grouped-query attention and/or a sliding window as `opts` says. Returns
/// tile counts when `count_tiles` (one atomic per block).
pub fn forward(
    gpu: &Gpu,
    p: &DevProblem,
    opts: AttnOptions,
    out: &dyn DevicePtr<u16>,
    lse: &mut CudaSlice<f32>,
    kernel_choice: FwdKernel,
    count_tiles: bool,
) -> Result<TileStats> {
    validate(p, opts)?;
    let (bb, hh, d) = (p.batch, p.heads, p.head_dim);
    ensure!(out.len() >= bb * p.tq * hh * d, "forward output too short");
    ensure!(lse.len() >= bb * hh * p.tq, "lse too short");
    let counters: Option<CudaSlice<u64>> = if count_tiles { Some(gpu.zeros::<u64>(2)?) } else { None };
    let mut prm = params(gpu, p, opts);
    prm.o = ptr(gpu, out);
    prm.lse = ptr(gpu, lse);
    prm.counters = counters.as_ref().map_or(0, |c| ptr(gpu, c));
    let use_decode = match kernel_choice {
        FwdKernel::Decode => {
            ensure!(p.tq <= 16, "the decode kernel takes at most 16 query rows, got {}", p.tq);
            true
        }
        FwdKernel::Tiled => false,
        FwdKernel::Auto => p.tq <= 16 && p.tk >= 256,
    };
    if use_decode {
        let scratch = DecodeScratch::new(gpu, bb, hh, d, p.tk)?;
        launch_decode(gpu, p, prm, &scratch, None)?;
        // freeing is stream-ordered (cuMemFreeAsync): the scratch outlives the kernels
        drop(scratch);
    } else {
        if use_ws(gpu) {
            forward_ws(gpu, p, prm)?;
            return tile_stats(gpu, counters);
        }
        let (name, warps, smem) = if use_wgmma(gpu, d) {
            // (kernel, query rows, key tile); tiles 1024-byte aligned inside the shared memory
            let (name, bq, bk) = match (wgmma_nwg(d == 64), wgmma_bk()) {
                (1, _) => ("fwdwg1", 64, 64),
                (_, 128) => ("fwdwg128", 128, 128),
                _ => ("fwdwg", 128, 64),
            };
            (name, bq / 16, (bq * d + 4 * bk * d) * 2 + 2 * bk * 4 + 1024)
        } else {
            let w = fwd_warps();
            (if w == 4 { "fwdw4" } else { "fwd" }, w, fwd_smem(d, w))
        };
        let grid = (p.tq.div_ceil(16 * warps) as u32, (bb * hh) as u32, 1);
        launch(gpu, name, p, grid, 32 * warps as u32, smem, &prm)?;
    }
    tile_stats(gpu, counters)
}

fn tile_stats(gpu: &Gpu, counters: Option<CudaSlice<u64>>) -> Result<TileStats> {
    match counters {
        Some(c) => {
            let v = gpu.download(&c)?;
            Ok(TileStats { tiles_visited: v[0], tiles_pruned: v[1] })
        }
        None => Ok(TileStats::default()),
    }
}

/// A TMA descriptor (CUtensorMap: 128 opaque bytes, 128-byte aligned under CUDA 13).
#[repr(C, align(128))]
#[derive(Clone, Copy)]
struct TmaMap([u64; 16]);

/// The warp-specialised forward's parameter block; must match `WsParams` in kernels/attention_ws.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct WsParams {
    a: AttnParams,
    q: TmaMap,
    k: TmaMap,
    v: TmaMap,
}
// SAFETY: plain old data with the C layout the kernels expect.
unsafe impl DeviceRepr for WsParams {}

/// Encodes a tiled TMA descriptor of 16-bit elements, 128-byte swizzle: `dims` and `box_dims`
/// innermost first, `strides` in bytes for
/// every dimension but the first.
fn tma_map(what: &str, bf16: bool, base: u64, dims: &[u64], strides: &[u64], box_dims: &[u32]) -> Result<TmaMap> {
    use cudarc::driver::sys::{
        cuTensorMapEncodeTiled, CUresult, CUtensorMap, CUtensorMapDataType as T, CUtensorMapFloatOOBfill,
        CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle as Sw,
    };
    let dtype = if bf16 { T::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 } else { T::CU_TENSOR_MAP_DATA_TYPE_FLOAT16 };
    let elem_strides = [1u32; 5];
    let mut m = CUtensorMap { opaque: [0; 16] };
    // SAFETY: the arrays hold `dims.len()` (strides: one fewer) entries, as the call reads; the
    // descriptor is written into `m` only.
    let r = unsafe {
        cuTensorMapEncodeTiled(
            &mut m,
            dtype,
            dims.len() as u32,
            base as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            box_dims.as_ptr(),
            elem_strides.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            Sw::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    ensure!(
        r == CUresult::CUDA_SUCCESS,
        "encoding the TMA descriptor of {what} (dims {dims:?}, byte strides {strides:?}, box {box_dims:?}): {r:?}"
    );
    Ok(TmaMap(m.opaque))
}

/// The (batch, head, row) element strides of a view.
fn strides(v: &DevView) -> (usize, usize, usize) {
    (v.sb, v.sh, v.st)
}

/// TMA descriptor of a [B, heads, rows, D] view of `p`'s dtype with element strides (sb, sh, st)
/// at device address `base`, as (D, rows, heads, B), boxes of 64 columns by `box_rows` rows (one
/// 128-byte-swizzle atom).
fn view_map(
    what: &str,
    p: &DevProblem,
    (sb, sh, st): (usize, usize, usize),
    base: u64,
    rows: usize,
    heads: usize,
    box_rows: usize,
) -> Result<TmaMap> {
    // a stride of a dimension of extent 1 is never used; keep it a valid (non-zero) value
    let s = |x: usize| (2 * x as u64).max(16);
    tma_map(
        what,
        p.dtype == DType::Bf16,
        base,
        &[p.head_dim as u64, rows as u64, heads as u64, p.batch as u64],
        &[s(st), s(sh), s(sb)],
        &[64, box_rows as u32, 1, 1],
    )
}

/// Key tile and pipeline stages of the warp-specialised forward (must match the FOX_WS instances). D=128 takes
/// three stages, which just fit (231,992 of 232,448 bytes of shared memory): with two, the kernel
/// waits on its loads (docs/kernel-notes.md).
const WS_BQ: usize = 128;
const WS_BK: usize = 128;
fn ws_stages(d: usize) -> usize {
    if d == 64 {
        4
    } else {
        3
    }
}

/// The warp-specialised forward (kernels/attention_ws.cu): 384 threads, one producer and two consumer
/// warpgroups of 64 query rows. `FOX_FWD_WS_FOLD=1` runs the variant with the gate bias relative to
/// the block (one FFMA a score) and O rescaled only when the maximum grows by 2^8 (measured no
/// faster, BENCHMARKS.md), `FOX_FWD_WS_PP=0` the default without ping-pong.
fn forward_ws(gpu: &Gpu, p: &DevProblem, prm: AttnParams) -> Result<()> {
    let d = p.head_dim;
    let hkv = prm.hkv as usize;
    let ws = WsParams {
        a: prm,
        q: view_map("q", p, strides(&p.q), prm.q, p.tq, p.heads, WS_BQ)?,
        k: view_map("k", p, strides(&p.k), prm.k, p.tk, hkv, WS_BK)?,
        v: view_map("v", p, strides(&p.v), prm.v, p.tk, hkv, WS_BK)?,
    };
    let nst = ws_stages(d);
    let smem = 1024 + (WS_BQ * d * 2) + nst * (2 * WS_BK * d * 2 + WS_BK * 4) + (2 * nst + 1) * 8;
    let pp = std::env::var("FOX_FWD_WS_PP").map(|v| v != "0").unwrap_or(true);
    let fold = std::env::var("FOX_FWD_WS_FOLD").is_ok_and(|v| v == "1");
    let pass = match (pp, fold) {
        (false, _) => "fwdwsnp",
        (true, false) => "fwdws",
        (true, true) => "fwdwsfold",
    };
    // The descriptors cover exactly the validated views.
    launch(gpu, pass, p, (p.tq.div_ceil(WS_BQ) as u32, (p.batch * p.heads) as u32, 1), 384, smem, &ws)
}

/// Gradient buffers of one attention problem (plus the backward's scratch).
pub struct DevGrads {
    /// [B, tq, H, D]
    pub dq: CudaSlice<u16>,
    /// [B, tk, H_kv, D]
    pub dk: CudaSlice<u16>,
    /// [B, tk, H_kv, D]
    pub dv: CudaSlice<u16>,
    /// d loss / d cq, [B, H, tq] (row sums of dS: zero in exact arithmetic)
    pub dcq: CudaSlice<f32>,
    /// d loss / d ck, [B, H, tk] (minus the column sums of dS)
    pub dck: CudaSlice<f32>,
    /// delta_i = dO_i · O_i, [B, H, tq]
    pub delta: CudaSlice<f32>,
}

impl DevGrads {
    /// Buffers for a problem, with grouped-query attention dk, dv of H_kv heads.
    pub fn new(gpu: &Gpu, p: &DevProblem, opts: AttnOptions) -> Result<Self> {
        let (b, h, d) = (p.batch, p.heads, p.head_dim);
        let hkv = opts.kv_heads(h);
        Ok(Self {
            dq: gpu.zeros(b * p.tq * h * d)?,
            dk: gpu.zeros(b * p.tk * hkv * d)?,
            dv: gpu.zeros(b * p.tk * hkv * d)?,
            dcq: gpu.zeros(b * h * p.tq)?,
            dck: gpu.zeros(b * h * p.tk)?,
            delta: gpu.zeros(b * h * p.tq)?,
        })
    }
}

/// Backward: `o`, `dout` [B, tq, H, D] (input dtype), `lse` from [`forward`], `g` from
/// [`DevGrads::new`] with the same options. Three launches: delta = rowsum(dO ∘ O); dk, dv, dck
/// over key blocks; dq, dcq over query blocks.
pub fn backward(
    gpu: &Gpu,
    p: &DevProblem,
    opts: AttnOptions,
    o: &CudaSlice<u16>,
    dout: &CudaSlice<u16>,
    lse: &CudaSlice<f32>,
    g: &mut DevGrads,
) -> Result<()> {
    let out = BwdOut { dq: &g.dq, dk: &g.dk, dv: &g.dv, dcq: &g.dcq, dck: &g.dck, delta: &g.delta };
    backward_into(gpu, p, opts, o, dout, lse, out)
}

/// Where [`backward_into`] writes: dq, dk, dv in the input dtype, dcq, dck and the scratch delta
/// in f32 (shapes as in [`DevGrads`]). The buffers are written through the device pointers.
pub struct BwdOut<'a> {
    pub dq: &'a dyn DevicePtr<u16>,
    pub dk: &'a dyn DevicePtr<u16>,
    pub dv: &'a dyn DevicePtr<u16>,
    pub dcq: &'a CudaSlice<f32>,
    pub dck: &'a CudaSlice<f32>,
    pub delta: &'a CudaSlice<f32>,
}

/// [`backward`] into caller-owned buffers (the model's backward scratch). With grouped-query
/// attention dk, dv are [B, tk, H_kv, D], each the sum over its group's query heads (one block
/// walks the group in order: deterministic, no atomics).
pub fn backward_into(
    gpu: &Gpu,
    p: &DevProblem,
    opts: AttnOptions,
    o: &dyn DevicePtr<u16>,
    dout: &dyn DevicePtr<u16>,
    lse: &CudaSlice<f32>,
    g: BwdOut,
) -> Result<()> {
    validate(p, opts)?;
    let (bb, hh, d) = (p.batch, p.heads, p.head_dim);
    let hkv = opts.kv_heads(hh);
    ensure!(o.len() >= bb * p.tq * hh * d && dout.len() >= bb * p.tq * hh * d, "o / dout too short");
    ensure!(lse.len() >= bb * hh * p.tq, "lse too short");
    ensure!(g.dq.len() >= bb * p.tq * hh * d, "dq buffer too short");
    ensure!(g.dk.len() >= bb * p.tk * hkv * d && g.dv.len() >= bb * p.tk * hkv * d, "dk / dv buffers too short");
    ensure!(
        g.dcq.len() >= bb * hh * p.tq && g.dck.len() >= bb * hh * p.tk && g.delta.len() >= bb * hh * p.tq,
        "dc buffers too short"
    );
    let mut prm = params(gpu, p, opts);
    prm.o_in = ptr(gpu, o);
    prm.dout = ptr(gpu, dout);
    prm.lse_in = ptr(gpu, lse);
    prm.delta = ptr(gpu, g.delta);
    prm.dq = ptr(gpu, g.dq);
    prm.dk = ptr(gpu, g.dk);
    prm.dv = ptr(gpu, g.dv);
    prm.dcq = ptr(gpu, g.dcq);
    prm.dck = ptr(gpu, g.dck);

    let rows = bb * p.tq * hh;
    launch(gpu, "bwd_delta", p, (rows.div_ceil(8) as u32, 1, 1), 256, 0, &prm)?;
    if use_ws_bwd(gpu) {
        return backward_ws(gpu, p, prm, g.dq, g.dcq);
    }

    // wgmma kernels: 64 keys or query rows per warpgroup, 64-row query tiles in dk/dv, 64-key
    // tiles in dq, 1024-byte alignment slack; mma.sync kernels: 128 per block of 8 warps
    let (nwg, sfx) = if use_wgmma_bwd(gpu, d) {
        let n = wgmma_nwg(false);
        (n, if n == 1 { "wg1" } else { "wg" })
    } else {
        (0, "")
    };
    let (rows, threads) = if nwg > 0 { (64 * nwg, 128 * nwg as u32) } else { (DKDV_BK, 256) };
    let smem = if nwg > 0 { (2 * rows * d + 4 * 64 * d) * 2 + 4 * 2 * 64 * 4 + 1024 } else { dkdv_smem(d) };
    // one block per key block and k/v head: it walks the group's query heads
    let grid = (p.tk.div_ceil(rows) as u32, (bb * hkv) as u32, 1);
    launch(gpu, &format!("bwd_dkdv{sfx}"), p, grid, threads, smem, &prm)?;

    let rows = if nwg > 0 { 64 * nwg } else { FWD_BQ };
    let smem = if nwg > 0 { (2 * rows * d + 4 * BK * d) * 2 + 2 * BK * 4 + 1024 } else { dq_smem(d) };
    launch(gpu, &format!("bwd_dq{sfx}"), p, (p.tq.div_ceil(rows) as u32, (bb * hh) as u32, 1), threads, smem, &prm)?;
    Ok(())
}

/// Whether the backward uses the warp-specialised one-pass kernel: sm_90a, by default (measured
/// faster in BENCHMARKS.md); `FOX_BWD_WS=0` selects the two wgmma passes.
fn use_ws_bwd(gpu: &Gpu) -> bool {
    ws_chosen(gpu, "FOX_BWD_WS", "FOX_BWD_WGMMA")
}

/// Parameters of the warp-specialised backward; must match `BwdWsParams` in kernels/attention_ws.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct BwdWsParams {
    a: AttnParams,
    acc: u64,
    sem: u64,
    k: TmaMap,
    v: TmaMap,
    q: TmaMap,
    g: TmaMap,
}
// SAFETY: plain old data with the C layout the kernels expect.
unsafe impl DeviceRepr for BwdWsParams {}

/// The warp-specialised backward after the delta kernel: one pass over key blocks of 128 (dk, dv, dck; dq and
/// dcq added into fp32 scratch [B, H, tq, D + 8] in key-block order), then dq = scale · scratch
/// in the dtype and dcq from its last eight columns. The gate sums come from products with a tile
/// of ones; `FOX_BWD_WS_SHFL=1` forms them in fp32 by adds and shuffles instead.
fn backward_ws(
    gpu: &Gpu,
    p: &DevProblem,
    prm: AttnParams,
    dq: &dyn DevicePtr<u16>,
    dcq: &CudaSlice<f32>,
) -> Result<()> {
    let (bb, hh, d) = (p.batch, p.heads, p.head_dim);
    let acc = gpu.zeros::<f32>(bb * hh * p.tq * (d + 8))?;
    let sem = gpu.zeros::<u32>(bb * hh * p.tq.div_ceil(64))?;
    let hkv = prm.hkv as usize;
    let ws = BwdWsParams {
        a: prm,
        acc: ptr(gpu, &acc),
        sem: ptr(gpu, &sem),
        k: view_map("k", p, strides(&p.k), prm.k, p.tk, hkv, 128)?,
        v: view_map("v", p, strides(&p.v), prm.v, p.tk, hkv, 128)?,
        q: view_map("q", p, strides(&p.q), prm.q, p.tq, hh, 64)?,
        // dO: contiguous [B, tq, H, D]
        g: view_map("dO", p, (p.tq * hh * d, d, hh * d), prm.dout, p.tq, hh, 64)?,
    };
    // K, V; Q, dO in two stages; dS^T per consumer warpgroup (two stages at D = 64); two dQ
    // staging tiles; a tile of ones (8 × 64); (c - lse), delta, starts in two stages; 9 barriers
    let ds_stages = if d == 64 { 2 } else { 1 };
    let smem = 1024
        + (2 * 128 * d + 4 * 64 * d + ds_stages * 2 * 64 * 64 + 8 * 64) * 2
        + 2 * 64 * (d + 8) * 4
        + 3 * 2 * 64 * 4
        + 9 * 8;
    let shfl = std::env::var("FOX_BWD_WS_SHFL").is_ok_and(|v| v == "1");
    let pass = if shfl { "bwdwsshfl" } else { "bwdws" };
    // The scratch holds B·H·tq rows of D + 8 floats and a counter per (b, h, 64-row query tile),
    // as the kernel indexes them.
    launch(gpu, pass, p, (p.tk.div_ceil(128) as u32, (bb * hkv) as u32, 1), 384, smem, &ws)?;

    let name = format!("fox_bwdws_dq_d{d}_{}", p.dtype.suffix());
    let blocks = (bb * hh * p.tq * d / 4).div_ceil(256).min(8 * gpu.sm_count()).max(1);
    let cfg = kargs::plain_config((blocks as u32, 1, 1), 256, 0);
    // dq holds B·tq·H·D and dcq B·H·tq elements (checked by the caller), acc as above.
    let (b_, h_, t_) = (bb as i32, hh as i32, p.tq as i32);
    kargs::launch(gpu, &ATTENTION, &name, cfg, &args![gpu; acc, ptr(gpu, dq), dcq, b_, h_, t_, p.scale])?;
    // freeing is stream-ordered: the scratch outlives the kernels
    drop((acc, sem));
    Ok(())
}

/// ACP thresholds δ = −(2U + ln N) + ln ε per (b, h) into `out`, with U = scale·max|q|·max|k| over
/// the rows that see keys (the SPEC's bound from query and key norms; with grouped-query attention
/// and/or a window, over the keys each query head reads and each row's visible keys' floor).
/// `n_keys` is N.
pub fn acp_thresholds_from_norms(
    gpu: &Gpu,
    p: &DevProblem,
    opts: AttnOptions,
    n_keys: usize,
    log_eps: f32,
    out: &mut CudaSlice<f32>,
) -> Result<()> {
    validate(p, opts)?;
    ensure!(out.len() >= p.batch * p.heads, "threshold buffer too short");
    let prm = params(gpu, p, opts);
    let name = format!("fox_acp_norms_d{}_{}", p.head_dim, p.dtype.suffix());
    let ln_n = (n_keys as f32).ln();
    let cfg = kargs::plain_config(((p.batch * p.heads) as u32, 1, 1), 256, 0);
    kargs::launch(gpu, &FGATE, &name, cfg, &args![gpu; by_value(&prm), log_eps, ln_n, out])
}

/// U per head from QK-norm weights: |scale·q·k| ≤ sqrt(d)·max|γ_q|·max|γ_k| (RMS-normalised q and
/// k have norm sqrt(d)). `gamma_q`, `gamma_k` are [H·d] per head, or [d] when shared by all heads.
pub fn logit_bound_from_qk_norm(gamma_q: &[f32], gamma_k: &[f32], heads: usize, head_dim: usize) -> Result<Vec<f32>> {
    // A per-head weight may cover fewer heads than `heads` (k_norm under grouped-query
    // attention: [H_kv·d]); query head h then reads weight head h / (H / H_kv).
    let per_head = |g: &[f32], h: usize| -> Result<f32> {
        let n = g.len() / head_dim.max(1);
        let s = if g.len() == head_dim {
            g
        } else if n > 0 && g.len() == n * head_dim && heads.is_multiple_of(n) {
            let gh = h / (heads / n);
            &g[gh * head_dim..(gh + 1) * head_dim]
        } else {
            bail!("QK-norm weight of length {} fits neither [d] nor [H·d] (or [H_kv·d])", g.len())
        };
        Ok(s.iter().fold(0.0f32, |m, x| m.max(x.abs())))
    };
    (0..heads).map(|h| Ok((head_dim as f32).sqrt() * per_head(gamma_q, h)? * per_head(gamma_k, h)?)).collect()
}

/// Upload a CPU [`Visibility`] for a problem of `batch` rows and `tq` query rows, checking that
/// per-row starts are non-decreasing (contiguous documents), as the kernels assume.
pub fn upload_visibility(gpu: &Gpu, vis: &Visibility, batch: usize, tq: usize) -> Result<Option<CudaSlice<i32>>> {
    match vis {
        Visibility::All => Ok(None),
        Visibility::LeftPadded(s) => {
            ensure!(s.len() == batch, "left padding: {} starts for {batch} rows", s.len());
            Ok(Some(gpu.upload(&s.iter().map(|&x| x as i32).collect::<Vec<_>>())?))
        }
        Visibility::PerRow(s) => {
            ensure!(s.len() == batch * tq, "per-row starts: {} for {} rows", s.len(), batch * tq);
            for b in 0..batch {
                let row = &s[b * tq..(b + 1) * tq];
                ensure!(
                    row.windows(2).all(|w| w[0] <= w[1]),
                    "per-row starts of batch row {b} decrease: documents must be contiguous"
                );
            }
            Ok(Some(gpu.upload(&s.iter().map(|&x| x as i32).collect::<Vec<_>>())?))
        }
    }
}

/// Per-row starts of packed documents from their offsets: `offsets[b]` lists the first position
/// of each document of batch row b (starting with 0).
pub fn starts_from_doc_offsets(offsets: &[Vec<usize>], t: usize) -> Vec<usize> {
    let mut s = Vec::with_capacity(offsets.len() * t);
    for offs in offsets {
        let mut cur = 0;
        let mut next = 1;
        for r in 0..t {
            while next < offs.len() && offs[next] <= r {
                cur = next;
                next += 1;
            }
            s.push(offs.get(cur).copied().unwrap_or(0));
        }
    }
    s
}

/// The buffers of `sp` were length-checked by the callers.
fn scan_launch(gpu: &Gpu, name: &str, sp: &ScanParams) -> Result<()> {
    kargs::launch(gpu, &FGATE, name, kargs::plain_config(((sp.b * sp.h) as u32, 1, 1), 256, 0), &[by_value(sp)])
}

fn seg(gpu: &Gpu, vis: DevVisibility, batch: usize, t: usize) -> Result<(u64, i32)> {
    Ok(match vis {
        DevVisibility::All => (0, 0),
        DevVisibility::LeftPadded(s) => {
            ensure!(s.len() >= batch, "starts too short");
            (ptr(gpu, s), 1)
        }
        DevVisibility::PerRow(s) => {
            ensure!(s.len() >= batch * t, "starts too short");
            (ptr(gpu, s), 2)
        }
    })
}

/// c [B, H, T] = prefix sum over each document of a [B, T, H] (padding counts as 0), as
/// [`crate::fgate::prefix_sum_fwd`] and restarting at packed documents' starts.
pub fn fgate_prefix_sum_fwd(
    gpu: &Gpu,
    a: &CudaSlice<f32>,
    c: &mut CudaSlice<f32>,
    vis: DevVisibility,
    batch: usize,
    t: usize,
    heads: usize,
) -> Result<()> {
    ensure!(a.len() >= batch * t * heads && c.len() >= batch * t * heads, "prefix sum buffers too short");
    let (start, mode) = seg(gpu, vis, batch, t)?;
    let sp = ScanParams {
        in1: ptr(gpu, a),
        in2: 0,
        out: ptr(gpu, c),
        start,
        b: batch as i32,
        h: heads as i32,
        t: t as i32,
        start_mode: mode,
    };
    scan_launch(gpu, "fox_fgate_cumsum_fwd", &sp)
}

/// da [B, T, H] = reverse prefix sum over each document of dcq + dck [B, H, T] (zero at
/// padding), as [`crate::fgate::prefix_sum_bwd`] of dc = dcq + dck.
#[allow(clippy::too_many_arguments)]
pub fn fgate_prefix_sum_bwd(
    gpu: &Gpu,
    dcq: &CudaSlice<f32>,
    dck: Option<&CudaSlice<f32>>,
    da: &mut CudaSlice<f32>,
    vis: DevVisibility,
    batch: usize,
    t: usize,
    heads: usize,
) -> Result<()> {
    let n = batch * t * heads;
    ensure!(dcq.len() >= n && da.len() >= n && dck.is_none_or(|x| x.len() >= n), "prefix sum buffers too short");
    let (start, mode) = seg(gpu, vis, batch, t)?;
    let sp = ScanParams {
        in1: ptr(gpu, dcq),
        in2: dck.map_or(0, |x| ptr(gpu, x)),
        out: ptr(gpu, da),
        start,
        b: batch as i32,
        h: heads as i32,
        t: t as i32,
        start_mode: mode,
    };
    scan_launch(gpu, "fox_fgate_cumsum_bwd", &sp)
}
