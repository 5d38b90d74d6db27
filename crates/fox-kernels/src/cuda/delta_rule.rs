//! The delta rule of DeltaNet and Gated DeltaNet on the GPU (kernels/delta_rule.cu), the twin of
//! [`crate::delta_rule`]: the same layouts (q, k [B, T, H, K], v and o [B, T, H, V], β [B, T, H],
//! states [B, H, K, V] f32), activations in `T` (f32 or bf16), the log-decay g and its gradient in
//! f32. Also the layer's small ops: the L2 norm, the decay g = −exp(A_log)·softplus(a + dt_bias)
//! and the swish output gate. Each function launches on `gpu.stream()` without waiting (the
//! segmented forward and backward fork [`Gpu::side_streams`] from it and join them back before
//! returning) and returns an error (never panics) when a buffer is shorter than the shapes say.
//! Deterministic: no atomics, fixed-order sums.
//!
//! The chunked form (chunks of 64 from position 0; see the kernel file): forward in three kernels
//! over a scratch of [`fwd_scratch_len`] floats (per chunk the WY transform, the state walk over
//! chunks per (b, h, 16 columns of V) on a warp each for bf16, or per (b, h, 64 columns) on a
//! warpgroup's `wgmma` on sm_90a at K' ≥ 64 ([`FwdWalk`]), per (b, h, 32 columns) for f32, the
//! chunk outputs). The walk goes through the chunks in order, so at B·H·V small against the GPU
//! (the 125M models' B = 2, H = 6, V = 128: 24 blocks) bf16 runs it as the parallel walk
//! ([`scan_plan`], [`delta_rule_fwd_scan`]: each segment's map from its entering state found from
//! zero and from the identity, the segments chained in f32, then every segment's walk at once;
//! about 3x the walk's products in 2/nseg of its time), and otherwise from 32 chunks on in
//! segments whose walks run beside the other segments' chunk kernels ([`delta_rule_fwd_cut`]);
//! backward in five (the first two again, by the same plan, then the state-free part of dU, the
//! reverse walk for the state gradients, every input's gradient per chunk) over
//! [`bwd_scratch_len`]. With bf16 activations the block products run on
//! tensor cores (bf16 `mma.sync`, f32 sums) and the scratch holds bf16; with f32 the same products
//! run in f32 on the CUDA cores. Limits: K ≤ 128 (q and k tiles of 32, 64 or 128 columns), any V
//! (blocks of 32 columns); the decode step K ≤ 256.

use super::compile::DELTA_RULE;
use super::kargs::{self, args, by_value, int, kname, need, need_lens, need_opt, opt_ptr, ptr, Arg};
use super::linear_attention::DevShape;
use super::{Elem, Gpu};
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, LaunchConfig};

/// Positions per chunk (as [`crate::delta_rule::CHUNK`]).
pub const CHUNK: usize = 64;
/// Columns of V per block of the walks.
const BV: usize = 32;
/// The largest K of the chunked kernels, and of the decode step.
pub const MAX_K: usize = 128;
const MAX_K_DECODE: usize = 256;
/// Threads of the chunk kernels and walks.
const THREADS: u32 = 256;
/// Warps of the bf16 forward walk (DR_WW), each owning 16 columns of V.
const WALK_TC_WARPS: usize = 4;
/// Columns of V per block of the parallel walk's join (DR_JC).
const JOIN_COLS: usize = 16;
/// The most segments of the parallel walk (the scratch holds their sums).
pub const MAX_SEGS: usize = 16;
/// Blocks the parallel walk's plan lets its launches have: the walk one wave at one block per
/// multiprocessor on 128 of the 132 of an H100 or H200 (two blocks on one slow each other down,
/// docs/kernel-notes.md), the sums (which two a multiprocessor hardly slow) at two. The plan depends on
/// the shape alone, so that the results are the same bits on any GPU.
const SCAN_WALK_SLOTS: usize = 128;
const SCAN_SUM_SLOTS: usize = 256;
/// Chunks per segment at the least: shorter segments save less walk than their sums cost.
const MIN_SEG_CHUNKS: usize = 8;

/// The parallel walk's segments (see kernels/delta_rule.cu, dr_walk_tc): `nseg` of `seglen`
/// chunks, the last possibly shorter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanPlan {
    pub nseg: usize,
    pub seglen: usize,
}

impl ScanPlan {
    /// Segments of `seglen` chunks over `nch`; none unless that makes 2 to [`MAX_SEGS`] segments.
    pub fn of(nch: usize, seglen: usize) -> Option<Self> {
        let nseg = (seglen > 0).then(|| nch.div_ceil(seglen))?;
        (2..=MAX_SEGS.min(nch)).contains(&nseg).then_some(Self { nseg, seglen })
    }
}

/// The parallel walk's plan for bf16 at B·H = `bh`, V' = `vp`, K' = `kp` and `nch` chunks: as
/// many segments as [`scan_fit`] gives, at most [`MAX_SEGS`], each of [`MIN_SEG_CHUNKS`] chunks
/// at least; none below three (the two launches of 1/nseg of the chunks each take as long as the
/// walk in one at two: one walk already fills the GPU, or the sequence is short).
/// FOXLM_DR_SCAN (read once): "0" never, "N" at most N segments.
pub fn scan_plan(bh: usize, vp: usize, kp: usize, nch: usize) -> Option<ScanPlan> {
    static CAP: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cap = *CAP
        .get_or_init(|| std::env::var("FOXLM_DR_SCAN").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(MAX_SEGS));
    let nseg = scan_fit(bh, vp, kp).min(MAX_SEGS).min(nch / MIN_SEG_CHUNKS).min(cap);
    if nseg < 3 {
        return None;
    }
    ScanPlan::of(nch, nch.div_ceil(nseg))
}

/// The most segments of the parallel walk that keep its launches within their slots: the walk
/// (⌈V'/64⌉ blocks a b·h a segment) within [`SCAN_WALK_SLOTS`], the sums (⌈V'/64⌉ + ⌈K'/64⌉
/// blocks a b·h for each segment but the last) within [`SCAN_SUM_SLOTS`].
fn scan_fit(bh: usize, vp: usize, kp: usize) -> usize {
    let tc = 16 * WALK_TC_WARPS;
    let walk = (vp.div_ceil(tc) * bh).max(1);
    let sums = ((vp.div_ceil(tc) + kp.div_ceil(tc)) * bh).max(1);
    (SCAN_WALK_SLOTS / walk).min(SCAN_SUM_SLOTS / sums + 1)
}

/// The segments the scratch holds sums for: [`scan_fit`]'s, two at the least, at most
/// [`MAX_SEGS`] and one a chunk.
fn scan_room(bh: usize, vp: usize, kp: usize, nch: usize) -> usize {
    scan_fit(bh, vp, kp).clamp(2, MAX_SEGS).min(nch)
}

/// How [`fwd_kernels`] runs the walk: segment after segment, cut at these chunk indices (none: one
/// walk), or every segment at once (the parallel walk, bf16).
enum Plan {
    Cuts(Vec<usize>),
    Scan(ScanPlan),
}

/// The default plan: the parallel walk where [`scan_plan`] gives one and the bf16 walk is the
/// `mma.sync` one, else the segments of [`fwd_cuts`].
fn default_plan<T: Elem>(gpu: &Gpu, lay: &Layout, bh: usize) -> Plan {
    let es = std::mem::size_of::<T>();
    match scan_plan(bh, lay.vp, lay.kp, lay.nch) {
        Some(sp) if es == 2 && walk_kind(gpu, lay.kp, es) == "walk_fwd" => Plan::Scan(sp),
        _ => Plan::Cuts(fwd_cuts(lay.nch)),
    }
}

/// The bf16 forward walk: 16 columns of V a warp by chains of `mma.sync` (`dr_walk_tc`, the
/// default: the faster at the 125M models' shape, BENCHMARKS.md), or 64 a block by warpgroup
/// `wgmma` (`dr_walk_wg`; sm_90a, K' ≥ 64). The f32 walk and K' = 32 take the first one's path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FwdWalk {
    MmaSync,
    Wgmma,
}

/// Every bf16 forward walk.
pub const WALKS: [FwdWalk; 2] = [FwdWalk::MmaSync, FwdWalk::Wgmma];

/// 0: FOXLM_DR_WALK decides; i + 1: WALKS[i], set by [`set_fwd_walk`].
static WALK: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// Chooses the bf16 forward walk for this process (the check rows run each); none: back to
/// FOXLM_DR_WALK's choice.
pub fn set_fwd_walk(w: Option<FwdWalk>) {
    let v = w.and_then(|w| WALKS.iter().position(|&x| x == w)).map_or(0, |i| i as u8 + 1);
    WALK.store(v, std::sync::atomic::Ordering::Relaxed);
}

/// The bf16 forward walk asked for: by [`set_fwd_walk`], else FOXLM_DR_WALK (read once: `wg` for
/// [`FwdWalk::Wgmma`], else [`FwdWalk::MmaSync`]).
pub fn fwd_walk() -> FwdWalk {
    static ENV: std::sync::OnceLock<FwdWalk> = std::sync::OnceLock::new();
    match WALK.load(std::sync::atomic::Ordering::Relaxed) {
        0 => *ENV.get_or_init(|| match std::env::var("FOXLM_DR_WALK").as_deref() {
            Ok("wg") => FwdWalk::Wgmma,
            _ => FwdWalk::MmaSync,
        }),
        i => WALKS[i as usize - 1],
    }
}

/// Whether the wgmma walk runs for keys of `k_dim` on `gpu` (K' ≥ 64, kernels built for sm_90a).
pub fn wgmma_walk_runs(gpu: &Gpu, k_dim: usize) -> bool {
    kp(k_dim) >= 64 && gpu.arch() == "sm_90a"
}

/// The bf16 forward walk that runs for keys of `k_dim` on `gpu`: the one asked for where the
/// wgmma walk can run, else [`FwdWalk::MmaSync`].
pub fn fwd_walk_on(gpu: &Gpu, k_dim: usize) -> FwdWalk {
    if wgmma_walk_runs(gpu, k_dim) {
        fwd_walk()
    } else {
        FwdWalk::MmaSync
    }
}

/// The forward walk's kernel kind at K' and element size `es` on `gpu`: "walk_wg" for the wgmma
/// walk, else "walk_fwd".
fn walk_kind(gpu: &Gpu, kp: usize, es: usize) -> &'static str {
    if es == 2 && fwd_walk_on(gpu, kp) == FwdWalk::Wgmma {
        "walk_wg"
    } else {
        "walk_fwd"
    }
}

/// Whether the kernels take heads of K key and V value columns.
pub fn supported(k_dim: usize, v_dim: usize) -> bool {
    (1..=MAX_K).contains(&k_dim) && v_dim >= 1
}

/// K padded to the tiles' widths.
fn kp(k: usize) -> usize {
    match k {
        0..=32 => 32,
        33..=64 => 64,
        _ => 128,
    }
}

/// The kernels' parameter block (DrParams in kernels/delta_rule.cu, field for field).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Params {
    q: u64,
    k: u64,
    v: u64,
    beta: u64,
    g: u64,
    start: u64,
    init: u64,
    fin: u64,
    dfin: u64,
    dinit: u64,
    gc: u64,
    w: u64,
    u: u64,
    states: u64,
    tm: u64,
    dstates: u64,
    du: u64,
    o: u64,
    dout: u64,
    dq: u64,
    dk: u64,
    dv: u64,
    dbeta: u64,
    dg: u64,
    sums: u64,
    entry: u64,
    scale: f32,
    b: i32,
    t: i32,
    h: i32,
    kd: i32,
    vd: i32,
    tp: i32,
    nch: i32,
    vp: i32,
    vk: i32,
    vv: i32,
    c0: i32,
    c1: i32,
    seglen: i32,
}

// SAFETY: plain data in the kernel's C struct layout (8-byte pointers, then 4-byte fields).
unsafe impl DeviceRepr for Params {}

/// One delta-rule problem on the device: as [`crate::delta_rule::DeltaRule`], with g in f32 and
/// `start` as i32.
#[derive(Clone, Copy)]
pub struct DevDeltaRule<'a, T: Elem> {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    /// [B, T, H, K], L2-normalised.
    pub q: &'a CudaSlice<T>,
    pub k: &'a CudaSlice<T>,
    /// [B, T, H, V]
    pub v: &'a CudaSlice<T>,
    /// [B, T, H]
    pub beta: &'a CudaSlice<T>,
    /// [B, T, H], the log-decay (Gated DeltaNet); none: α = 1.
    pub g: Option<&'a CudaSlice<f32>>,
    pub scale: f32,
    /// [B] first real position per row; none: all real.
    pub start: Option<&'a CudaSlice<i32>>,
}

/// Where [`delta_rule_bwd`] writes its gradients (overwritten; 0 at padding).
pub struct DevDeltaRuleGrads<'a, T: Elem> {
    pub dq: &'a mut CudaSlice<T>,
    pub dk: &'a mut CudaSlice<T>,
    pub dv: &'a mut CudaSlice<T>,
    pub dbeta: &'a mut CudaSlice<T>,
    /// Wanted exactly when the problem has g.
    pub dg: Option<&'a mut CudaSlice<f32>>,
    /// [B, H, K, V], when wanted.
    pub dinit: Option<&'a mut CudaSlice<f32>>,
}

/// The scratch's regions (byte offsets) for a shape.
struct Layout {
    nch: usize,
    tp: usize,
    vp: usize,
    kp: usize,
    gc: usize,
    w: usize,
    u: usize,
    states: usize,
    /// The states entering segments [S, B·H, K, V] f32: the cut forward's carry in slot 0, the
    /// parallel walk's entering states in every slot.
    carry: usize,
    sums: usize,
    tm: usize,
    dstates: usize,
    du: usize,
    fwd_end: usize,
    bwd_end: usize,
}

fn align(x: usize) -> usize {
    x.div_ceil(16) * 16
}

fn layout(batch: usize, seq: usize, heads: usize, k: usize, v: usize, es: usize) -> Layout {
    let (nch, bh) = (seq.div_ceil(CHUNK), batch * heads);
    let (tp, vp, kp) = (nch * CHUNK, v.div_ceil(BV) * BV, kp(k));
    let gc = 0;
    let w = gc + align(bh * tp * 4);
    let u = w + align(bh * tp * kp * es);
    let states = u + align(bh * tp * vp * es);
    let carry = states + align(bh * nch * kp * vp * es);
    // The parallel walk's segments (bf16 only): their entering states, and the sums of all but the last.
    let segs = if es == 2 { scan_room(bh, vp, kp, nch) } else { 0 };
    let sums = carry + align(segs.max(1) * bh * k * v * 4);
    let fwd_end = sums + align(segs.saturating_sub(1) * bh * kp * (vp + kp) * 4);
    let tm = fwd_end;
    let dstates = tm + align(bh * nch * CHUNK * CHUNK * es);
    let du = dstates + align(bh * nch * kp * vp * es);
    let bwd_end = du + align(bh * tp * vp * 4);
    Layout { nch, tp, vp, kp, gc, w, u, states, carry, sums, tm, dstates, du, fwd_end, bwd_end }
}

/// f32 elements of [`delta_rule_fwd`]'s scratch: G [B·H, T'] f32, W [B·H, T', K'], U [B·H, T', V']
/// and the chunk states [B·H, T'/64, K', V'] in T (T' = T rounded up to chunks, K' = K padded to
/// 32/64/128, V' to 32), the states entering segments [S, B·H, K, V] f32 (S = 1 but for the bf16
/// parallel walk's segments: see [`delta_rule_fwd_scan`]) and for bf16 the parallel walk's sums
/// [S − 1, B·H, K', V' + K'] f32. At B = 2, T = 16384, H = 6, K = V = 128,
/// bf16: 212 MB.
pub fn fwd_scratch_len<T: Elem>(batch: usize, seq: usize, heads: usize, k_dim: usize, v_dim: usize) -> usize {
    layout(batch, seq, heads, k_dim, v_dim, std::mem::size_of::<T>()).fwd_end.div_ceil(4)
}

/// f32 elements of [`delta_rule_bwd`]'s scratch: the forward's, T per chunk [B·H, T'/64, 64, 64]
/// and the state gradients (T), dU [B·H, T', V'] (f32). At the shape above, bf16: 438 MB.
pub fn bwd_scratch_len<T: Elem>(batch: usize, seq: usize, heads: usize, k_dim: usize, v_dim: usize) -> usize {
    layout(batch, seq, heads, k_dim, v_dim, std::mem::size_of::<T>()).bwd_end.div_ceil(4)
}

/// Dynamic shared memory of each chunk kernel (DrLayout in kernels/delta_rule.cu, term for term;
/// the kernels trap when given less).
fn smem_bytes(kind: &str, kp: usize, es: usize) -> usize {
    let pad = if es == 2 { 8 } else { 4 };
    let (lk, ll, lv, lvf) = (kp + pad, CHUNK + pad, BV + pad, BV + 4);
    let tk = CHUNK * lk * es;
    let tl = CHUNK * ll * es;
    let tv = CHUNK * lv * es;
    let ts = kp * lv * es;
    let dv = CHUNK * lvf * 4;
    let f65 = CHUNK * 65 * 4;
    let rows = CHUNK * 4;
    // DrWalkTc::SET: W and K [64][K' + 8], Ũ [64][DR_WV + 8] (bf16) and G.
    let tc_set = 2 * CHUNK * (kp + 8) * 2 + CHUNK * (16 * WALK_TC_WARPS + 8) * 2 + rows;
    match kind {
        "prep" => tk + tv + 2 * tl + 2 * f65 + 2 * rows,
        // DrWalkTc: two sets of W, K, Ũ and G tiles, a staging tile of S per warp.
        "walk_fwd" if es == 2 => 2 * tc_set + WALK_TC_WARPS * kp * 24 * 2,
        "walk_fwd" => 2 * (2 * tk + tv + rows) + ts + tv,
        // DrWalkTc::sum_bytes: the tile sets only.
        "walk_sum" => 2 * tc_set,
        // DrJoin: P [K'][K' + 1] and E [K'][JOIN_COLS], f32.
        "join" => (kp * (kp + 1) + kp * JOIN_COLS) * 4,
        // DrWalkWg: two sets of W and K (64-column atoms), Ũ and G, each rounded up to 1024 bytes,
        // a staging tile per warp, 1024 bytes to align the sets.
        "walk_wg" => {
            let set = (2 * kp * CHUNK * 2 + CHUNK * (16 * WALK_TC_WARPS + 8) * 2 + rows).div_ceil(1024) * 1024;
            1024 + 2 * set + WALK_TC_WARPS * (kp + CHUNK) * 24 * 2
        }
        "walk_bwd" => {
            let set = 3 * tk + tv + dv + rows;
            let nb = if 2 * set + ts + 2 * tv <= 227 * 1024 { 2 } else { 1 };
            nb * set + ts + 2 * tv
        }
        "out" => 2 * tk + tl + 2 * (ts + tv) + rows,
        "dvl" => 2 * tk + tl + ts + tv + rows,
        _ => {
            let b = (2 * ts + 7 * tv + dv).max(3 * f65 + 2 * tl);
            2 * tk + tl + b + (5 * CHUNK + 8 * CHUNK + THREADS as usize + 4) * 4
        }
    }
}

#[derive(Clone, Copy)]
/// A chunk kernel's launch: its grid (x, y; z is 1 but for the parallel walk's segments), threads
/// per block and dynamic shared memory.
struct Cfg {
    grid: (usize, usize),
    z: usize,
    threads: u32,
    smem: usize,
}

/// The launch of kernel `kind` at a layout: the chunk kernels one block per (chunk, b·h), the walks
/// per (columns of V, b·h): 32 columns per block of 256 threads, or for the bf16 forward walk 16
/// per warp of WALK_TC_WARPS (the parallel walk's sums also over K' more columns); the join per
/// (JOIN_COLS columns of V, b·h).
fn cfg(kind: &str, lay: &Layout, bh: usize, es: usize) -> Cfg {
    let smem = smem_bytes(kind, lay.kp, es);
    let z = 1;
    let tc = 16 * WALK_TC_WARPS;
    match kind {
        "walk_wg" | "walk_fwd" if es == 2 => {
            Cfg { grid: (lay.vp.div_ceil(tc), bh), z, threads: 32 * WALK_TC_WARPS as u32, smem }
        }
        "walk_sum" => {
            Cfg { grid: (lay.vp.div_ceil(tc) + lay.kp.div_ceil(tc), bh), z, threads: 32 * WALK_TC_WARPS as u32, smem }
        }
        "join" => Cfg { grid: (lay.vp.div_ceil(JOIN_COLS), bh), z, threads: (lay.kp * JOIN_COLS / 2) as u32, smem },
        "walk_fwd" | "walk_bwd" => Cfg { grid: (lay.vp / BV, bh), z, threads: THREADS, smem },
        _ => Cfg { grid: (lay.nch, bh), z, threads: THREADS, smem },
    }
}

fn launch(gpu: &Gpu, name: &str, c: &Cfg, prm: &Params, extra: Option<i32>) -> Result<()> {
    launch_on(gpu, gpu.stream(), name, c, prm, extra)
}

/// Launches `name` on `stream` with its DrParams `prm` (every buffer checked by the callers
/// against the sizes the kernels index, and the sizes against 32-bit ints) and the int some
/// kernels take after it.
fn launch_on(gpu: &Gpu, stream: &CudaStream, name: &str, c: &Cfg, prm: &Params, extra: Option<i32>) -> Result<()> {
    let cfg = kargs::config(name, (c.grid.0, c.grid.1, c.z), c.threads, c.smem)?;
    match extra {
        Some(x) => kargs::launch_on(gpu, stream, &DELTA_RULE, name, cfg, &[by_value(prm), Arg::I(x)]),
        None => kargs::launch_on(gpu, stream, &DELTA_RULE, name, cfg, &[by_value(prm)]),
    }
}

impl<T: Elem> DevDeltaRule<'_, T> {
    fn shape(&self) -> DevShape<'_> {
        let (batch, seq, heads, k_dim, v_dim, start) =
            (self.batch, self.seq, self.heads, self.k_dim, self.v_dim, self.start);
        DevShape { batch, seq, heads, k_dim, v_dim, start }
    }
    fn check(&self, op: &str) -> Result<()> {
        let sh = self.shape();
        sh.check(op, self.q, self.k, self.v)?;
        need(op, "beta", self.beta, sh.rows())?;
        need_opt(op, "g", self.g, sh.rows())?;
        int(op, self.batch * self.heads)?;
        Ok(())
    }
    fn states(&self) -> usize {
        self.shape().states()
    }
    fn params(&self, gpu: &Gpu, lay: &Layout) -> Result<Params> {
        let op = "delta_rule";
        Ok(Params {
            q: ptr(gpu, self.q),
            k: ptr(gpu, self.k),
            v: ptr(gpu, self.v),
            beta: ptr(gpu, self.beta),
            g: opt_ptr(gpu, self.g),
            start: opt_ptr(gpu, self.start),
            scale: self.scale,
            b: int(op, self.batch)?,
            t: int(op, self.seq)?,
            h: int(op, self.heads)?,
            kd: int(op, self.k_dim)?,
            vd: int(op, self.v_dim)?,
            tp: int(op, lay.tp)?,
            nch: int(op, lay.nch)?,
            vp: int(op, lay.vp)?,
            // Rows of 16-byte multiples at 16-byte aligned buffers load by asynchronous copies.
            vk: (rows16::<T>(self.k_dim) && [self.q, self.k].iter().all(|s| ptr(gpu, *s).is_multiple_of(16))) as i32,
            vv: (rows16::<T>(self.v_dim) && ptr(gpu, self.v).is_multiple_of(16)) as i32,
            c0: 0,
            c1: int(op, lay.nch)?,
            ..Default::default()
        })
    }
    fn layout(&self) -> Layout {
        layout(self.batch, self.seq, self.heads, self.k_dim, self.v_dim, std::mem::size_of::<T>())
    }
}

/// Whether rows of `dim` elements of T are whole 16-byte copies.
fn rows16<T>(dim: usize) -> bool {
    (dim * std::mem::size_of::<T>()).is_multiple_of(16)
}

/// The scratch's regions as device addresses.
/// The backward's incoming gradient and the gradients it writes (dinit apart: only the backward
/// proper takes it); dO's 16-byte alignment decides the vector loads with the others.
fn with_grads<T: Elem>(gpu: &Gpu, prm: &mut Params, dout: &CudaSlice<T>, g: &DevDeltaRuleGrads<T>) {
    prm.dout = ptr(gpu, dout);
    prm.vv &= prm.dout.is_multiple_of(16) as i32;
    prm.dq = ptr(gpu, g.dq);
    prm.dk = ptr(gpu, g.dk);
    prm.dv = ptr(gpu, g.dv);
    prm.dbeta = ptr(gpu, g.dbeta);
    prm.dg = g.dg.as_ref().map_or(0, |d| ptr(gpu, *d));
}

fn with_scratch(prm: &mut Params, base: u64, lay: &Layout, bwd: bool) {
    prm.gc = base + lay.gc as u64;
    prm.w = base + lay.w as u64;
    prm.u = base + lay.u as u64;
    prm.states = base + lay.states as u64;
    if bwd {
        prm.tm = base + lay.tm as u64;
        prm.dstates = base + lay.dstates as u64;
        prm.du = base + lay.du as u64;
    }
}

/// The chunked forward, as [`crate::delta_rule::delta_rule_fwd`]: o [B, T, H, V] (0 at padding).
/// `state` [B, H, K, V]: read as the initial state and overwritten with the final one (none: a
/// zero initial state, the final one not kept). `scratch` of [`fwd_scratch_len`] floats. Long
/// sequences run in segments ([`fwd_cuts`], [`delta_rule_fwd_cut`]).
pub fn delta_rule_fwd<T: Elem>(
    gpu: &Gpu,
    p: &DevDeltaRule<T>,
    o: &mut CudaSlice<T>,
    state: Option<&mut CudaSlice<f32>>,
    scratch: &mut CudaSlice<f32>,
) -> Result<()> {
    let plan = default_plan::<T>(gpu, &p.layout(), p.batch * p.heads);
    fwd_with(gpu, p, o, state, scratch, plan)
}

/// [`delta_rule_fwd`] by the parallel walk in segments of `seglen` chunks, whichever the default
/// (bf16 only; from 2 segments to as many as fill 128 blocks of the walk, at most [`MAX_SEGS`]).
pub fn delta_rule_fwd_scan<T: Elem>(
    gpu: &Gpu,
    p: &DevDeltaRule<T>,
    o: &mut CudaSlice<T>,
    state: Option<&mut CudaSlice<f32>>,
    scratch: &mut CudaSlice<f32>,
    seglen: usize,
) -> Result<()> {
    let op = "delta_rule_fwd_scan";
    ensure!(std::mem::size_of::<T>() == 2, "{op}: the parallel walk is bf16 only");
    let sp = scan_plan_of(p, seglen).ok_or_else(|| {
        let (nch, room) = chunks_and_room(p);
        anyhow!("{op}: segments of {seglen} chunks over {nch} must make 2 to {room}")
    })?;
    fwd_with(gpu, p, o, state, scratch, Plan::Scan(sp))
}

/// The parallel walk's plan of `seglen`-chunk segments for `p`, where the scratch has room for it
/// (see [`delta_rule_fwd_scan`]).
pub fn scan_plan_of<T: Elem>(p: &DevDeltaRule<T>, seglen: usize) -> Option<ScanPlan> {
    let (nch, room) = chunks_and_room(p);
    ScanPlan::of(nch, seglen).filter(|sp| sp.nseg <= room)
}

/// `p`'s chunks and the segments its scratch holds sums for ([`scan_room`]).
fn chunks_and_room<T: Elem>(p: &DevDeltaRule<T>) -> (usize, usize) {
    let nch = p.seq.div_ceil(CHUNK);
    (nch, scan_room(p.batch * p.heads, p.v_dim.div_ceil(BV) * BV, kp(p.k_dim), nch))
}

/// The parallel walk's plan that [`delta_rule_fwd`] and [`delta_rule_bwd`] run for `p` on `gpu`,
/// if they run it.
pub fn default_scan<T: Elem>(gpu: &Gpu, p: &DevDeltaRule<T>) -> Option<ScanPlan> {
    match default_plan::<T>(gpu, &p.layout(), p.batch * p.heads) {
        Plan::Scan(sp) => Some(sp),
        Plan::Cuts(_) => None,
    }
}

/// Chunks per segment of the forward at 256 chunks (T = 16384), the last segment taking the
/// rest: small at both ends, where the WY transform of the first segment and the outputs of the
/// last run alone, each segment's WY transform shorter than the walk of the one before it.
const SEGMENTS_256: [usize; 7] = [8, 16, 32, 64, 64, 40, 20];
/// Fewer chunks run as one segment.
const MIN_SEGMENTED: usize = 32;

/// Where [`delta_rule_fwd`] cuts `nch` chunks into segments (chunk indices, increasing, inside
/// 1..nch): [`SEGMENTS_256`] scaled to `nch`, none below [`MIN_SEGMENTED`] chunks. FOXLM_DR_SEGS
/// (chunks per segment before the last, as "8,16,32"; "0": one segment) overrides it.
pub fn fwd_cuts(nch: usize) -> Vec<usize> {
    static SEGS: std::sync::OnceLock<Option<Vec<usize>>> = std::sync::OnceLock::new();
    let env = SEGS.get_or_init(|| {
        let v = std::env::var("FOXLM_DR_SEGS").ok()?;
        Some(v.split(',').filter_map(|x| x.trim().parse::<usize>().ok()).filter(|&x| x > 0).collect())
    });
    let mut cuts = Vec::new();
    let mut at = 0;
    match env {
        Some(sizes) => {
            for n in sizes {
                at += n;
                cuts.push(at);
            }
        }
        None if nch >= MIN_SEGMENTED => {
            for n in SEGMENTS_256 {
                at += n;
                cuts.push((at * nch + 128) / 256);
            }
        }
        None => {}
    }
    cuts.retain(|&c| c > 0 && c < nch);
    cuts.dedup();
    cuts
}

/// FOXLM_DR_TRACE=1: each segmented forward waits for its end and prints where its time went
/// (before the first walk, each walk, the gaps between walks, after the last), for
/// `fox-attn bench-delta` (read once).
fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var("FOXLM_DR_TRACE").is_ok_and(|v| v == "1"))
}

/// [`delta_rule_fwd`] with the chunks cut into segments at `cuts` (increasing chunk indices inside
/// 1..nch; none: one segment on [`Gpu::stream`], three kernels in a row). With cuts the WY
/// transform, the walk and the outputs of each segment are launches of their own on
/// [`Gpu::side_streams`]: the walk (on the high-priority stream) goes from segment to segment,
/// its state carried in f32 through the scratch, while the WY transform of the next segment and
/// the outputs of the one before run beside it on the multiprocessors the walk leaves idle. Events
/// order them: segment s's walk after its WY transform, its outputs after its walk. The same bits
/// as one segment.
pub fn delta_rule_fwd_cut<T: Elem>(
    gpu: &Gpu,
    p: &DevDeltaRule<T>,
    o: &mut CudaSlice<T>,
    state: Option<&mut CudaSlice<f32>>,
    scratch: &mut CudaSlice<f32>,
    cuts: &[usize],
) -> Result<()> {
    fwd_with(gpu, p, o, state, scratch, Plan::Cuts(cuts.to_vec()))
}

fn fwd_with<T: Elem>(
    gpu: &Gpu,
    p: &DevDeltaRule<T>,
    o: &mut CudaSlice<T>,
    state: Option<&mut CudaSlice<f32>>,
    scratch: &mut CudaSlice<f32>,
    plan: Plan,
) -> Result<()> {
    let op = "delta_rule_fwd";
    p.check(op)?;
    ensure!(supported(p.k_dim, p.v_dim), "{op}: the GPU kernels take K ≤ {MAX_K}, not {}", p.k_dim);
    need(op, "o", o, p.batch * p.seq * p.heads * p.v_dim)?;
    let lay = p.layout();
    need(op, "scratch", scratch, lay.fwd_end.div_ceil(4))?;
    if let Plan::Cuts(cuts) = &plan {
        ensure!(
            cuts.windows(2).all(|w| w[0] < w[1]) && cuts.iter().all(|&c| c > 0 && c < lay.nch),
            "{op}: segment cuts {cuts:?} must increase inside 1..{}",
            lay.nch
        );
    }
    let mut prm = p.params(gpu, &lay)?;
    if let Some(s) = &state {
        need(op, "state", &**s, p.states())?;
        prm.init = ptr(gpu, *s);
        prm.fin = prm.init;
    }
    if p.batch * p.seq == 0 {
        return Ok(());
    }
    int(op, p.batch * p.heads * lay.tp * lay.kp.max(lay.vp))?;
    int(op, p.batch * p.heads * lay.nch * lay.kp * lay.vp)?;
    with_scratch(&mut prm, ptr(gpu, scratch), &lay, false);
    prm.o = ptr(gpu, o);
    fwd_kernels(gpu, p, &prm, &lay, &plan, Tail::Out)
}

/// What follows the walk in [`fwd_kernels`]: the outputs (the forward), or the backward's
/// state-free dU, which needs only the WY transform's G (and T kept for the backward).
#[derive(Clone, Copy, PartialEq)]
enum Tail {
    Out,
    Dvl,
}

/// The WY transform, the walk and `tail` by `plan`: over segments cut at chunk indices (see
/// [`delta_rule_fwd_cut`]; no cuts: in a row on [`Gpu::stream`]), or by the parallel walk (in a
/// row on [`Gpu::stream`]: the WY transform, the segments' sums, their join, every segment's
/// walk at once, `tail`). With [`Tail::Dvl`] the WY transform keeps T and dU's state-free part
/// runs over all chunks once every WY transform is done, beside the walk where it is cut.
fn fwd_kernels<T: Elem>(
    gpu: &Gpu,
    p: &DevDeltaRule<T>,
    prm: &Params,
    lay: &Layout,
    plan: &Plan,
    tail: Tail,
) -> Result<()> {
    let op = "delta_rule";
    let (bh, es) = (p.batch * p.heads, std::mem::size_of::<T>());
    let sfx = format!("k{}_{}", lay.kp, T::NAME);
    let keep_t = Some((tail == Tail::Dvl) as i32);
    let tk = if tail == Tail::Out { "out" } else { "dvl" };
    let wk = walk_kind(gpu, lay.kp, es);
    let (prep, walk, out) = (format!("dr_prep_{sfx}"), format!("dr_{wk}_{sfx}"), format!("dr_{tk}_{sfx}"));
    let (cprep, cwalk, cout) = (cfg("prep", lay, bh, es), cfg(wk, lay, bh, es), cfg(tk, lay, bh, es));
    // The scratch begins with G.
    let carry = prm.gc + (lay.carry - lay.gc) as u64;
    let cuts = match plan {
        Plan::Cuts(c) => &c[..],
        Plan::Scan(_) => &[],
    };
    if cuts.is_empty() {
        // In a row on the GPU's stream: the WY transform, the walk (one, or the parallel walk's
        // sums, join and segments), the tail.
        launch(gpu, &prep, &cprep, prm, keep_t)?;
        match plan {
            Plan::Scan(sp) => {
                ensure!(es == 2, "{op}: the parallel walk is bf16 only");
                let mut q = *prm;
                q.seglen = int(op, sp.seglen)?;
                q.sums = prm.gc + (lay.sums - lay.gc) as u64;
                q.entry = carry;
                let csum = Cfg { z: sp.nseg - 1, ..cfg("walk_sum", lay, bh, es) };
                launch(gpu, &format!("dr_walk_sum_{sfx}"), &csum, &q, None)?;
                let nseg = Some(int(op, sp.nseg)?);
                launch(gpu, &format!("dr_walk_join_k{}", lay.kp), &cfg("join", lay, bh, es), &q, nseg)?;
                let cw = Cfg { z: sp.nseg, ..cfg("walk_fwd", lay, bh, es) };
                launch(gpu, &format!("dr_walk_fwd_{sfx}"), &cw, &q, None)?;
            }
            Plan::Cuts(_) => launch(gpu, &walk, &cwalk, prm, None)?,
        }
        return launch(gpu, &out, &cout, prm, None);
    }
    let [ws, ps, os] = gpu.side_streams()?;
    let main = gpu.stream();
    let ev = |s: &CudaStream| super::stream_event(op, s);
    let wait = |s: &CudaStream, e: &cudarc::driver::CudaEvent| super::stream_wait(op, s, e);
    let fork = ev(main)?;
    for s in [ws, ps, os] {
        wait(s, &fork)?;
    }
    // FOXLM_DR_TRACE: timing events at the fork, around each walk and at the join.
    let timed = |s: &CudaStream| -> Result<Option<cudarc::driver::CudaEvent>> {
        if !trace() {
            return Ok(None);
        }
        let e = s.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT));
        Ok(Some(e.map_err(|e| anyhow!("{op}: recording a timing event: {e:?}"))?))
    };
    let t_fork = timed(main)?;
    let mut t_walks = Vec::new();
    let bounds: Vec<usize> = std::iter::once(0).chain(cuts.iter().copied()).chain(std::iter::once(lay.nch)).collect();
    let nseg = bounds.len() - 1;
    let seg = |s: usize| -> Result<Params> {
        let mut q = *prm;
        q.c0 = int(op, bounds[s])?;
        q.c1 = int(op, bounds[s + 1])?;
        q.init = if s == 0 { prm.init } else { carry };
        q.fin = if s + 1 == nseg { prm.fin } else { carry };
        Ok(q)
    };
    let grid = |c: &Cfg, s: usize| Cfg { grid: (bounds[s + 1] - bounds[s], c.grid.1), ..*c };
    // Segment 0's WY transform leads the walk's stream; segment 1's follows it, segment s's the
    // end of walk s − 2: each runs beside the walk of the segment before its own and (at the
    // plan's sizes) is done before that walk ends, so that no block of it is waiting for room
    // when the next walk starts. (All released after segment 0's, the forward took 5% longer.)
    launch_on(gpu, ws, &prep, &grid(&cprep, 0), &seg(0)?, keep_t)?;
    let mut prepped = vec![None];
    if nseg > 1 {
        wait(ps, &ev(ws)?)?;
        launch_on(gpu, ps, &prep, &grid(&cprep, 1), &seg(1)?, keep_t)?;
        prepped.push(Some(ev(ps)?));
    }
    for s in 0..nseg {
        if let Some(e) = &prepped[s] {
            wait(ws, e)?;
        }
        let t0 = timed(ws)?;
        launch_on(gpu, ws, &walk, &cwalk, &seg(s)?, None)?;
        t_walks.push((t0, timed(ws)?));
        let done = ev(ws)?;
        if tail == Tail::Out {
            wait(os, &done)?;
            launch_on(gpu, os, &out, &grid(&cout, s), &seg(s)?, None)?;
        }
        // The WY transform of segment s + 2 once this walk is done.
        let next = s + 2;
        if next < nseg {
            wait(ps, &done)?;
            launch_on(gpu, ps, &prep, &grid(&cprep, next), &seg(next)?, keep_t)?;
            prepped.push(Some(ev(ps)?));
        }
    }
    if tail == Tail::Dvl {
        wait(os, &ev(ps)?)?;
        launch_on(gpu, os, &out, &cout, prm, None)?;
    }
    for s in [ws, ps, os] {
        wait(main, &ev(s)?)?;
    }
    if let (Some(f), Some(end)) = (&t_fork, timed(main)?) {
        let ms = |a: &cudarc::driver::CudaEvent, b: &cudarc::driver::CudaEvent| a.elapsed_ms(b).unwrap_or(f32::NAN);
        end.synchronize().map_err(|e| anyhow!("{op}: {e:?}"))?;
        let w: Vec<_> = t_walks.iter().filter_map(|(a, b)| Some((a.as_ref()?, b.as_ref()?))).collect();
        let (Some(first), Some(last)) = (w.first(), w.last()) else { return Ok(()) };
        let walks: Vec<String> = w.iter().map(|(a, b)| format!("{:.3}", ms(a, b))).collect();
        let gaps: Vec<String> = w.windows(2).map(|p| format!("{:.3}", ms(p[0].1, p[1].0))).collect();
        eprintln!(
            "delta rule trace ({tk}): total {:.3} ms = before the first walk {:.3} + walks {:.3} + after {:.3}; \
             walks [{}], gaps [{}]",
            ms(f, &end),
            ms(f, first.0),
            ms(first.0, last.1),
            ms(last.1, &end),
            walks.join(" "),
            gaps.join(" ")
        );
    }
    Ok(())
}

/// The chunked backward, as [`crate::delta_rule::delta_rule_bwd`], from do [B, T, H, V] and the
/// final state's gradient `dfinal` (none: 0), with the forward's initial state `init` (none: 0):
/// every gradient of `g`. `scratch` of [`bwd_scratch_len`] floats. Recomputes the forward's
/// chunk states.
pub fn delta_rule_bwd<T: Elem>(
    gpu: &Gpu,
    p: &DevDeltaRule<T>,
    dout: &CudaSlice<T>,
    init: Option<&CudaSlice<f32>>,
    dfinal: Option<&CudaSlice<f32>>,
    g: DevDeltaRuleGrads<T>,
    scratch: &mut CudaSlice<f32>,
) -> Result<()> {
    let op = "delta_rule_bwd";
    p.check(op)?;
    ensure!(supported(p.k_dim, p.v_dim), "{op}: the GPU kernels take K ≤ {MAX_K}, not {}", p.k_dim);
    let (n, kd, vd) = (p.batch * p.seq * p.heads, p.k_dim, p.v_dim);
    need(op, "dout", dout, n * vd)?;
    need(op, "dq", g.dq, n * kd)?;
    need(op, "dk", g.dk, n * kd)?;
    need(op, "dv", g.dv, n * vd)?;
    need(op, "dbeta", g.dbeta, n)?;
    ensure!(g.dg.is_some() == p.g.is_some(), "{op}: dg is wanted exactly when the problem has g");
    need_opt(op, "dg", g.dg.as_deref(), n)?;
    p.shape().check_states(op, init, dfinal, g.dinit.as_deref())?;
    let lay = p.layout();
    need(op, "scratch", scratch, lay.bwd_end.div_ceil(4))?;
    let mut prm = p.params(gpu, &lay)?;
    if p.batch * p.seq == 0 {
        return Ok(());
    }
    int(op, p.batch * p.heads * lay.tp * lay.kp.max(lay.vp))?;
    int(op, p.batch * p.heads * lay.nch * lay.kp * lay.vp)?;
    prm.init = opt_ptr(gpu, init);
    prm.dfin = opt_ptr(gpu, dfinal);
    prm.dinit = g.dinit.as_ref().map_or(0, |d| ptr(gpu, *d));
    with_grads(gpu, &mut prm, dout, &g);
    with_scratch(&mut prm, ptr(gpu, scratch), &lay, true);
    // The forward's WY transform (keeping T) and walk again, and dU's state-free part.
    let (bh, es) = (p.batch * p.heads, std::mem::size_of::<T>());
    fwd_kernels(gpu, p, &prm, &lay, &default_plan::<T>(gpu, &lay, bh), Tail::Dvl)?;
    let sfx = format!("k{}_{}", lay.kp, T::NAME);
    launch(gpu, &format!("dr_walk_bwd_{sfx}"), &cfg("walk_bwd", &lay, bh, es), &prm, None)?;
    launch(gpu, &format!("dr_grads_{sfx}"), &cfg("grads", &lay, bh, es), &prm, None)
}

/// Each kernel of the forward and backward alone (ms, medians of `iters` after `warmup`, CUDA
/// events), for `fox-attn bench-delta`: the WY transform, the state walk, the chunk outputs, the
/// state-free dU, the reverse walk, the chunk gradients. The gradients land in `g`; `scratch` of
/// [`bwd_scratch_len`] floats.
#[allow(clippy::too_many_arguments)]
pub fn kernel_ms<T: Elem>(
    gpu: &Gpu,
    p: &DevDeltaRule<T>,
    o: &mut CudaSlice<T>,
    dout: &CudaSlice<T>,
    g: DevDeltaRuleGrads<T>,
    scratch: &mut CudaSlice<f32>,
    warmup: usize,
    iters: usize,
) -> Result<[f64; 6]> {
    let op = "delta_rule kernel_ms";
    p.check(op)?;
    let lay = p.layout();
    need(op, "scratch", scratch, lay.bwd_end.div_ceil(4))?;
    need(op, "o", o, p.batch * p.seq * p.heads * p.v_dim)?;
    let mut prm = p.params(gpu, &lay)?;
    with_scratch(&mut prm, ptr(gpu, scratch), &lay, true);
    prm.o = ptr(gpu, o);
    with_grads(gpu, &mut prm, dout, &g);
    let (bh, es) = (p.batch * p.heads, std::mem::size_of::<T>());
    let sfx = format!("k{}_{}", lay.kp, T::NAME);
    let mut out = [0.0; 6];
    let wk = walk_kind(gpu, lay.kp, es);
    for (i, kind) in ["prep", wk, "out", "dvl", "walk_bwd", "grads"].iter().enumerate() {
        let extra = (*kind == "prep").then_some(1);
        let name = format!("dr_{kind}_{sfx}");
        let c = cfg(kind, &lay, bh, es);
        out[i] = super::time_ms(gpu, warmup, iters, || launch(gpu, &name, &c, &prm, extra))?;
    }
    Ok(out)
}

/// One decoding step, as [`crate::delta_rule::delta_rule_decode_step`]: `p.seq` = 1; `state`
/// [B, H, K, V] updated in place, o [B, H, V] written; a row with start[b] > 0 is padding (o = 0,
/// its state unchanged). K ≤ 256.
pub fn delta_rule_decode_step<T: Elem>(
    gpu: &Gpu,
    p: &DevDeltaRule<T>,
    state: &mut CudaSlice<f32>,
    o: &mut CudaSlice<T>,
) -> Result<()> {
    let op = "delta_rule_decode_step";
    p.check(op)?;
    if !p.shape().check_decode(op, MAX_K_DECODE, state, o)? {
        return Ok(());
    }
    int(op, p.states())?;
    let lay = p.layout();
    let mut prm = p.params(gpu, &lay)?;
    prm.fin = ptr(gpu, state);
    prm.o = ptr(gpu, o);
    let bh = p.batch * p.heads;
    ensure!(bh <= 65535, "{op}: {bh} rows × heads exceed the launch grid");
    let cfg = kargs::plain_config((p.v_dim.div_ceil(128) as u32, bh as u32, 1), 128, 0);
    kargs::launch(gpu, &DELTA_RULE, &kname::<T>("dr_decode"), cfg, &[by_value(&prm)])
}

fn grid1(n: usize, per: usize) -> LaunchConfig {
    kargs::plain_config((n.div_ceil(per) as u32, 1, 1), 256, 0)
}

/// The L2 norm's checks: dim > 0, the [rows, dim] buffers `lens` and `rstd` [rows] long enough,
/// the offsets in the kernels' 32 bits; false where there are no rows to launch for.
fn l2norm_check(op: &str, rows: usize, dim: usize, lens: &[(&str, usize)], rstd: &CudaSlice<f32>) -> Result<bool> {
    ensure!(dim > 0, "{op}: dim must be positive");
    need_lens(op, rows * dim, lens)?;
    need(op, "rstd", rstd, rows)?;
    if rows == 0 {
        return Ok(false);
    }
    int(op, rows * dim)?;
    Ok(true)
}

/// y = x / √(Σ x² + 1e-6) over rows of `dim` (as [`crate::delta_rule::l2norm_fwd`], eps 1e-6), the
/// rows' 1/√(…) into `rstd`.
pub fn l2norm_fwd<T: Elem>(
    gpu: &Gpu,
    y: &mut CudaSlice<T>,
    rstd: &mut CudaSlice<f32>,
    x: &CudaSlice<T>,
    rows: usize,
    dim: usize,
) -> Result<()> {
    let op = "l2norm_fwd";
    if !l2norm_check(op, rows, dim, &[("x", x.len()), ("y", y.len())], rstd)? {
        return Ok(());
    }
    let args = args![gpu; y, rstd, x, int(op, rows)?, int(op, dim)?];
    kargs::launch(gpu, &DELTA_RULE, &kname::<T>("dr_l2norm_fwd"), grid1(rows, 8), &args)
}

/// Backward of [`l2norm_fwd`] from its output: dx = rstd · (dy − y (y·dy)), overwritten.
pub fn l2norm_bwd<T: Elem>(
    gpu: &Gpu,
    dx: &mut CudaSlice<T>,
    dy: &CudaSlice<T>,
    y: &CudaSlice<T>,
    rstd: &CudaSlice<f32>,
    rows: usize,
    dim: usize,
) -> Result<()> {
    let op = "l2norm_bwd";
    if !l2norm_check(op, rows, dim, &[("dy", dy.len()), ("y", y.len()), ("dx", dx.len())], rstd)? {
        return Ok(());
    }
    let args = args![gpu; dx, dy, y, rstd, int(op, rows)?, int(op, dim)?];
    kargs::launch(gpu, &DELTA_RULE, &kname::<T>("dr_l2norm_bwd"), grid1(rows, 8), &args)
}

/// Gated DeltaNet's log-decay g [rows, H] = −exp(A_log) · softplus(a + dt_bias), f32 (the CPU
/// layer's formula: ssd's softplus times −exp(A_log)).
pub fn decay_fwd<T: Elem>(
    gpu: &Gpu,
    g: &mut CudaSlice<f32>,
    a: &CudaSlice<T>,
    a_log: &CudaSlice<f32>,
    dt_bias: &CudaSlice<f32>,
    rows: usize,
) -> Result<()> {
    let op = "decay_fwd";
    let h = a_log.len();
    ensure!(h > 0 && dt_bias.len() == h, "{op}: A_log and dt_bias must both have H > 0 values");
    need_lens(op, rows * h, &[("a", a.len()), ("g", g.len())])?;
    if rows == 0 {
        return Ok(());
    }
    let args = args![gpu; g, a, a_log, dt_bias, int(op, rows)?, int(op, h)?];
    int(op, rows * h)?;
    kargs::launch(gpu, &DELTA_RULE, &kname::<T>("dr_decay_fwd"), grid1(rows * h, 256), &args)
}

/// f32 elements of [`decay_bwd`]'s scratch.
pub fn decay_bwd_scratch_len(rows: usize, heads: usize) -> usize {
    2 * rows * heads
}

/// Backward of [`decay_fwd`] from dg [rows, H]: da (T) overwritten; dt_bias's and A_log's
/// gradients accumulated through per-thread runs of rows and a fixed tree per head.
#[allow(clippy::too_many_arguments)]
pub fn decay_bwd<T: Elem>(
    gpu: &Gpu,
    da: &mut CudaSlice<T>,
    da_log: &mut CudaSlice<f32>,
    ddt_bias: &mut CudaSlice<f32>,
    scratch: &mut CudaSlice<f32>,
    dg: &CudaSlice<f32>,
    a: &CudaSlice<T>,
    a_log: &CudaSlice<f32>,
    dt_bias: &CudaSlice<f32>,
    rows: usize,
) -> Result<()> {
    let op = "decay_bwd";
    let h = a_log.len();
    ensure!(h > 0 && dt_bias.len() == h, "{op}: A_log and dt_bias must both have H > 0 values");
    need_lens(op, h, &[("da_log", da_log.len()), ("ddt_bias", ddt_bias.len())])?;
    need_lens(op, rows * h, &[("a", a.len()), ("da", da.len()), ("dg", dg.len())])?;
    need(op, "scratch", scratch, decay_bwd_scratch_len(rows, h))?;
    if rows == 0 {
        return Ok(());
    }
    int(op, 2 * rows * h)?;
    let base = ptr(gpu, scratch);
    let (tb, tl) = (base, base + (rows * h * 4) as u64);
    let args = args![gpu; da, tb, tl, dg, a, a_log, dt_bias, int(op, rows)?, int(op, h)?];
    kargs::launch(gpu, &DELTA_RULE, &kname::<T>("dr_decay_bwd"), grid1(rows * h, 256), &args)?;
    let args = args![gpu; ddt_bias, da_log, tb, tl, a_log, int(op, rows)?, int(op, h)?];
    kargs::launch(gpu, &DELTA_RULE, "dr_decay_reduce", kargs::plain_config((h as u32, 1, 1), 256, 0), &args)
}

/// y = x ⊙ SiLU(gate) (fla's o_norm with g_proj), n elements.
pub fn swish_gate_fwd<T: Elem>(
    gpu: &Gpu,
    y: &mut CudaSlice<T>,
    x: &CudaSlice<T>,
    gate: &CudaSlice<T>,
    n: usize,
) -> Result<()> {
    let op = "swish_gate_fwd";
    need_lens(op, n, &[("x", x.len()), ("gate", gate.len()), ("y", y.len())])?;
    if n == 0 {
        return Ok(());
    }
    let args = args![gpu; y, x, gate, n as i64];
    kargs::launch(gpu, &DELTA_RULE, &kname::<T>("dr_swish_fwd"), grid1(n, 256), &args)
}

/// Backward of [`swish_gate_fwd`]: dx and dgate overwritten.
pub fn swish_gate_bwd<T: Elem>(
    gpu: &Gpu,
    dx: &mut CudaSlice<T>,
    dgate: &mut CudaSlice<T>,
    dy: &CudaSlice<T>,
    x: &CudaSlice<T>,
    gate: &CudaSlice<T>,
    n: usize,
) -> Result<()> {
    let op = "swish_gate_bwd";
    let lens = [("dy", dy.len()), ("x", x.len()), ("gate", gate.len()), ("dx", dx.len()), ("dgate", dgate.len())];
    need_lens(op, n, &lens)?;
    if n == 0 {
        return Ok(());
    }
    let args = args![gpu; dx, dgate, dy, x, gate, n as i64];
    kargs::launch(gpu, &DELTA_RULE, &kname::<T>("dr_swish_bwd"), grid1(n, 256), &args)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scratch's regions follow one another without overlap, 16-byte aligned, and the
    /// documented sizes hold at the 125M shape.
    #[test]
    fn scratch_regions_are_disjoint_and_sized() {
        let l = layout(2, 16384, 6, 128, 128, 2);
        let r = [l.gc, l.w, l.u, l.states, l.carry, l.sums, l.tm, l.dstates, l.du, l.bwd_end];
        assert!(r.windows(2).all(|w| w[0] < w[1] && w[1] % 16 == 0), "{r:?}");
        assert_eq!((fwd_scratch_len::<half::bf16>(2, 16384, 6, 128, 128) * 4) / 1_000_000, 212);
        assert_eq!((bwd_scratch_len::<half::bf16>(2, 16384, 6, 128, 128) * 4) / 1_000_000, 438);
        // A partial chunk and padded K and V.
        let l = layout(1, 70, 2, 20, 24, 4);
        assert_eq!((l.nch, l.tp, l.kp, l.vp), (2, 128, 32, 32));
        assert_eq!(l.w - l.gc, 2 * 128 * 4);
        // f32 has no parallel walk: one state between segments, no sums; bf16 room for two
        // segments here: two entering states, the sums of one.
        assert_eq!(l.sums - l.carry, 2 * 20 * 24 * 4);
        assert_eq!(l.fwd_end, l.sums);
        let l = layout(1, 70, 2, 20, 24, 2);
        assert_eq!(l.sums - l.carry, 2 * 2 * 20 * 24 * 4);
        assert_eq!(l.fwd_end - l.sums, 2 * 32 * (32 + 32) * 4);
    }

    /// The parallel walk's plans: at the 125M models' shape five segments of 52 chunks (the walk's
    /// 120 blocks within 128, the sums' 192 within 256); wide batches and short sequences leave
    /// one walk.
    #[test]
    fn scan_plans() {
        assert_eq!(scan_plan(12, 128, 128, 256), Some(ScanPlan { nseg: 5, seglen: 52 }));
        assert_eq!(scan_plan(2, 128, 128, 32), Some(ScanPlan { nseg: 4, seglen: 8 }));
        assert_eq!(scan_plan(64, 128, 128, 256), None);
        assert_eq!(scan_plan(12, 128, 128, 15), None);
        assert_eq!(ScanPlan::of(5, 2), Some(ScanPlan { nseg: 3, seglen: 2 }));
        assert_eq!(ScanPlan::of(5, 5), None);
        assert_eq!(ScanPlan::of(40, 2), None);
        assert_eq!(ScanPlan::of(5, 0), None);
    }

    /// The shared memory of the largest kernels fits an H100's 227 KB per block.
    #[test]
    fn shared_memory_fits() {
        for kind in ["prep", "walk_fwd", "walk_sum", "join", "walk_wg", "out", "dvl", "walk_bwd", "grads"] {
            for kp in [32, 64, 128] {
                for es in [2, 4] {
                    let b = smem_bytes(kind, kp, es);
                    assert!(b <= 227 * 1024, "{kind} K'={kp} {es}-byte: {b} bytes");
                }
            }
        }
    }
}
