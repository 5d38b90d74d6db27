//! The small operations of the FoX training step on the GPU: every op that is neither a GEMM nor
//! attention, each the CUDA twin of a CPU reference op (kernels in kernels/ops.cu).
//!
//! Conventions: every function takes the [`Gpu`] first, launches on `gpu.stream()` without
//! waiting, and returns an error (never panics) when a buffer is shorter than the shapes say.
//! Buffers may be longer than needed (buffers planned once at their largest size). `T: Elem` is
//! the activation type (f32 or bf16); statistics, gate values, losses, norm weights, parameter
//! gradients and optimizer state are f32, and every kernel computes in f32. Parameter gradients
//! are accumulated (`+=`) as the CPU ops do. Every reduction is deterministic: the same inputs give
//! bitwise the same outputs (fixed-order sums; across rows two passes over per-block partials,
//! held in a per-stream scratch buffer, see [`reserve_scratch`]).

use super::compile::OPS;
use super::kargs::{self, args, kname, need, need_lens, need_opt, ptr, Arg};
use super::{Elem, Gpu};
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::CudaSlice;
use std::mem::size_of;
use std::sync::{Arc, Mutex};

fn launch(gpu: &Gpu, name: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> Result<()> {
    kargs::launch(gpu, &OPS, name, kargs::plain_config(grid, block, 0), args)
}

/// [`launch`] allowing programmatic dependent launch: for the kernels of a decode step that wait
/// with `pdl_wait_prev` (pdl.cuh) before reading their inputs.
fn launch_dependent(gpu: &Gpu, name: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> Result<()> {
    kargs::launch_pdl(gpu, &OPS, name, kargs::plain_config(grid, block, 0), args)
}

/// A size as the kernels' 32-bit int, named in the error.
fn int(op: &str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| anyhow!("{op}: `{what}` = {v} does not fit the kernels' 32-bit indices"))
}

fn grid1(blocks: usize) -> Result<(u32, u32, u32)> {
    ensure!(blocks > 0 && blocks <= i32::MAX as usize, "launch of {blocks} blocks is out of range");
    Ok((blocks as u32, 1, 1))
}

/// Blocks of 256 threads, one element per thread.
fn flat_grid(n: usize) -> Result<(u32, u32, u32)> {
    grid1(n.div_ceil(256))
}

/// Blocks of 256 threads, four elements per thread (the `vec4` kernels).
fn vec4_grid(n: usize) -> Result<(u32, u32, u32)> {
    grid1(n.div_ceil(4).div_ceil(256))
}

/// Blocks of 8 warps, one warp per row.
fn warp_rows_grid(rows: usize) -> Result<(u32, u32, u32)> {
    grid1(rows.div_ceil(8))
}

// ------------------------------------------------------------------------------------------------
// Scratch for two-pass reductions: one growable f32 buffer per stream. Launches on one stream run
// in order, so consecutive ops can share it; a buffer that grows is freed stream-ordered (after
// the kernels queued before). Keyed by the stream's address: the buffer holds an Arc of the stream,
// so the address cannot be reused while the entry exists.

struct Scratch {
    stream: usize,
    buf: CudaSlice<f32>,
}

static SCRATCH: Mutex<Vec<Scratch>> = Mutex::new(Vec::new());

fn scratch(gpu: &Gpu, floats: usize) -> Result<u64> {
    let key = Arc::as_ptr(gpu.stream()) as usize;
    let mut all = SCRATCH.lock().unwrap_or_else(|e| e.into_inner());
    let i = match all.iter().position(|s| s.stream == key) {
        Some(i) => {
            if all[i].buf.len() < floats {
                all[i].buf = gpu.zeros::<f32>(floats)?;
            }
            i
        }
        None => {
            let buf = gpu.zeros::<f32>(floats.max(SUMSQ_MAX_BLOCKS * 2))?;
            all.push(Scratch { stream: key, buf });
            all.len() - 1
        }
    };
    Ok(ptr(gpu, &all[i].buf))
}

/// Allocate the reduction scratch of `gpu`'s stream now (a memory plan calls this once with
/// [`scratch_floats`] of its largest reduction), so that no op allocates inside the step loop.
pub fn reserve_scratch(gpu: &Gpu, floats: usize) -> Result<()> {
    scratch(gpu, floats).map(|_| ())
}

/// Scratch (f32 elements) that a column sum over `rows` rows of `width` columns needs: RMSNorm's
/// dw (rows = rows / groups rounded up, width = len(w)) and [`col_sum_acc`]. At most 2048·width.
pub fn scratch_floats(rows: usize, width: usize) -> usize {
    let (_, p) = colsum_plan(rows);
    (p * width).max(SUMSQ_MAX_BLOCKS * 2)
}

/// Chunk length and number of chunks of pass 1 of a column sum: chunks of at least 128 rows, at
/// most 2048 of them (so the scratch stays at ≤ 2048 rows).
fn colsum_plan(rows: usize) -> (usize, usize) {
    let r = 128usize.max(rows.div_ceil(2048));
    (r, rows.div_ceil(r).max(1))
}

/// Pass 2 of a column sum: dst[j] += Σ_p part[p, j].
fn colsum_final(gpu: &Gpu, dst: u64, part: u64, p: usize, w: usize) -> Result<()> {
    launch(gpu, "colsum_final", grid1(w)?, 256, &args![gpu; dst, part, p as i32, w as i32])
}

// ------------------------------------------------------------------------------------------------
// RMSNorm

fn norm_groups(op: &str, w: &CudaSlice<f32>, dim: usize) -> Result<usize> {
    ensure!(dim > 0, "{op}: dim is 0");
    ensure!(
        w.len() >= dim && w.len().is_multiple_of(dim),
        "{op}: weight length {} is not a positive multiple of dim {dim}",
        w.len()
    );
    Ok(w.len() / dim)
}

/// What every RMSNorm forward launch shares: `rows` rows of `dim`, row r scaled by weight row
/// r % (len(w)/dim) of `w`, and the `eps` under the square root.
#[derive(Clone, Copy)]
pub struct RmsNorm<'a> {
    pub w: &'a CudaSlice<f32>,
    pub rows: usize,
    pub dim: usize,
    pub eps: f32,
}

/// RMSNorm forward exactly as [`crate::rmsnorm::rms_norm_fwd`]: y = x·rstd·w over rows of `dim`,
/// rstd[r] = 1/sqrt(mean(x²) + eps).
pub fn rms_norm_fwd<T: Elem>(
    gpu: &Gpu,
    y: &mut CudaSlice<T>,
    rstd: &mut CudaSlice<f32>,
    x: &CudaSlice<T>,
    norm: RmsNorm<'_>,
) -> Result<()> {
    let op = "rms_norm_fwd";
    let RmsNorm { w, rows, dim, eps } = norm;
    let groups = norm_groups(op, w, dim)?;
    need(op, "x", x, rows * dim)?;
    need(op, "y", y, rows * dim)?;
    need(op, "rstd", rstd, rows)?;
    if rows == 0 {
        return Ok(());
    }
    if rows <= WIDE_ROWS {
        return rms_wide(gpu, y, rstd, None, ptr(gpu, x), norm);
    }
    launch(
        gpu,
        &kname::<T>(op),
        warp_rows_grid(rows)?,
        256,
        &args![gpu; y, rstd, x, w, int(op, "rows", rows)?, int(op, "dim", dim)?, groups as i32, eps],
    )
}

/// Up to this many rows, RMSNorm (alone or after an add) runs a block per row: a decode step's
/// one row per sequence would leave a warp-per-row kernel a single warp's worth of loads.
const WIDE_ROWS: usize = 64;

/// RMSNorm of rows ≤ [`WIDE_ROWS`] of `a` (after h = a + b with `h_b` = (h, b); h may be a),
/// one block per row (device pointers of checked buffers, `norm`'s weights checked).
fn rms_wide<T: Elem>(
    gpu: &Gpu,
    y: &mut CudaSlice<T>,
    rstd: &mut CudaSlice<f32>,
    h_b: Option<(u64, u64)>,
    pa: u64,
    norm: RmsNorm<'_>,
) -> Result<()> {
    let op = "rms_norm_fwd_wide";
    let RmsNorm { w, rows, dim, eps } = norm;
    let groups = w.len() / dim;
    let (ph, pb) = h_b.unwrap_or((0, 0));
    launch_dependent(
        gpu,
        &kname::<T>(op),
        grid1(rows)?,
        256,
        &args![gpu; y, rstd, ph, pa, pb, w, int(op, "dim", dim)?, groups as i32, eps],
    )
}

/// A residual add and the next RMSNorm in one pass: h = a + b (stored in T), then y, rstd =
/// RMSNorm(h) with weights `w` [dim], bitwise as [`add`] then [`rms_norm_fwd`].
pub fn add_rms_norm_fwd<T: Elem>(
    gpu: &Gpu,
    h: &mut CudaSlice<T>,
    y: &mut CudaSlice<T>,
    rstd: &mut CudaSlice<f32>,
    a: &CudaSlice<T>,
    b: &CudaSlice<T>,
    norm: RmsNorm<'_>,
) -> Result<()> {
    add_rms(gpu, h, y, rstd, Some(a), b, norm)
}

/// [`add_rms_norm_fwd`] in place: h += b, then y, rstd = RMSNorm(h), bitwise as [`add_inplace`]
/// then [`rms_norm_fwd`] (each thread reads h and b where it then writes h).
pub fn add_rms_norm_inplace<T: Elem>(
    gpu: &Gpu,
    h: &mut CudaSlice<T>,
    y: &mut CudaSlice<T>,
    rstd: &mut CudaSlice<f32>,
    b: &CudaSlice<T>,
    norm: RmsNorm<'_>,
) -> Result<()> {
    add_rms(gpu, h, y, rstd, None, b, norm)
}

/// h = a + b (a = None: h itself), then y, rstd = RMSNorm(h).
fn add_rms<T: Elem>(
    gpu: &Gpu,
    h: &mut CudaSlice<T>,
    y: &mut CudaSlice<T>,
    rstd: &mut CudaSlice<f32>,
    a: Option<&CudaSlice<T>>,
    b: &CudaSlice<T>,
    norm: RmsNorm<'_>,
) -> Result<()> {
    let op = if a.is_some() { "add_rms_norm_fwd" } else { "add_rms_norm_inplace" };
    let RmsNorm { w, rows, dim, eps } = norm;
    ensure!(norm_groups(op, w, dim)? == 1, "{op}: weight length {} is not dim {dim}", w.len());
    let a_len = a.map_or(h.len(), |a| a.len());
    need_lens(op, rows * dim, &[("h", h.len()), ("y", y.len()), ("a", a_len), ("b", b.len())])?;
    need(op, "rstd", rstd, rows)?;
    if rows == 0 {
        return Ok(());
    }
    let ph = ptr(gpu, h);
    let (pa, pb) = (a.map_or(ph, |a| ptr(gpu, a)), ptr(gpu, b));
    if rows <= WIDE_ROWS {
        return rms_wide(gpu, y, rstd, Some((ph, pb)), pa, norm);
    }
    launch(
        gpu,
        &kname::<T>("add_rms_norm_fwd"),
        warp_rows_grid(rows)?,
        256,
        &args![gpu; ph, y, rstd, pa, pb, w, int(op, "rows", rows)?, int(op, "dim", dim)?, eps],
    )
}

/// SwiGLU's gate_proj for at most [`GEMV_ROWS`] rows with the activation in the same pass:
/// gu [rows, 2·inter] = x · wᵀ and h = silu(gate) · up, bitwise as [`gemv`] then [`swiglu_fwd`].
#[allow(clippy::too_many_arguments)]
pub fn gemv_glu<T: Elem>(
    gpu: &Gpu,
    gu: &mut CudaSlice<T>,
    h: &mut CudaSlice<T>,
    x: &CudaSlice<T>,
    w: &CudaSlice<T>,
    rows: usize,
    in_features: usize,
    inter: usize,
) -> Result<()> {
    let op = "gemv_glu";
    gemv_check(op, x, w, (rows, in_features, 2 * inter))?;
    need(op, "gu", gu, rows * 2 * inter)?;
    need(op, "h", h, rows * inter)?;
    if inter == 0 {
        return Ok(());
    }
    let (pg, ph, px, pw) = (ptr(gpu, gu), ptr(gpu, h), ptr(gpu, x), ptr(gpu, w));
    gemv_launch::<T>(gpu, &kname::<T>(op), [pg, ph, px, pw], rows, in_features, 2 * inter)
}

/// The most rows [`gemv`] takes.
pub const GEMV_ROWS: usize = 4;

/// Whether [`gemv`] takes a Linear of `rows` rows and `in_features` inputs in T (a multiple of
/// 16 bytes per weight row).
pub fn gemv_fits<T: Elem>(rows: usize, in_features: usize) -> bool {
    (1..=GEMV_ROWS).contains(&rows) && (in_features * size_of::<T>()).is_multiple_of(16)
}

/// A gemv of (rows, in, out) fits the kernel ([`gemv_fits`]), and x [rows, in] and w [out, in]
/// are long enough.
fn gemv_check<T: Elem>(
    op: &str,
    x: &CudaSlice<T>,
    w: &CudaSlice<T>,
    (rows, in_features, out_features): (usize, usize, usize),
) -> Result<()> {
    ensure!(gemv_fits::<T>(rows, in_features), "{op}: {rows} rows of {in_features} inputs do not fit the kernel");
    need(op, "x", x, rows * in_features)?;
    need(op, "w", w, out_features * in_features)
}

/// y[rows, out] = x[rows, in] · w[out, in]ᵀ for at most [`GEMV_ROWS`] rows (a decode step's
/// Linear: one warp per output reads its weight row once for every row of x), f32 sums, the
/// output in Y (T, or f32 from bf16).
pub fn gemv<T: Elem, Y: Elem>(
    gpu: &Gpu,
    y: &mut CudaSlice<Y>,
    x: &CudaSlice<T>,
    w: &CudaSlice<T>,
    rows: usize,
    in_features: usize,
    out_features: usize,
) -> Result<()> {
    let op = "gemv";
    ensure!(!(T::NAME == "f32" && Y::NAME == "bf16"), "{op}: f32 inputs with a bf16 output are not supported");
    gemv_check(op, x, w, (rows, in_features, out_features))?;
    need(op, "y", y, rows * out_features)?;
    if out_features == 0 {
        return Ok(());
    }
    let name = format!("{op}_{}_{}", T::NAME, Y::NAME);
    gemv_launch::<T>(gpu, &name, [ptr(gpu, y), 0, ptr(gpu, x), ptr(gpu, w)], rows, in_features, out_features)
}

/// A Mamba-2 decode step's in_proj with its inputs in the same pass, for at most [`GEMV_ROWS`]
/// rows (one position per batch row): zxbcdt [B, out] = x · wᵀ, then xbc, dt and the conv state
/// from it as [`super::ssd::decode_inputs`] computes them (bitwise as [`gemv`] then that).
pub fn gemv_step_in<T: Elem>(
    gpu: &Gpu,
    zxbcdt: &mut CudaSlice<T>,
    x: &CudaSlice<T>,
    w: &CudaSlice<T>,
    in_features: usize,
    out: super::ssd::DecodeInputsOut<T>,
    prm: super::ssd::DecodeParams<T>,
) -> Result<()> {
    let op = "gemv_step_in";
    let d = prm.at;
    let (rows, out_features) = (d.batch, d.stride);
    gemv_check(op, x, w, (rows, in_features, out_features))?;
    super::ssd::check_decode_inputs(op, &out, zxbcdt, &prm)?;
    if out_features == 0 {
        return Ok(());
    }
    let ks = gemv_split(gpu, in_features, out_features, size_of::<T>());
    let super::ssd::DecodeInputsOut { xbc, conv_state, dt } = out;
    launch_dependent(
        gpu,
        &kname::<T>(op),
        grid1(out_features.div_ceil(8 / ks))?,
        256,
        &args![
            gpu;
            zxbcdt, x, w, rows as i32, int(op, "in_features", in_features)?, int(op, "out_features", out_features)?,
            ks as i32, xbc, conv_state, dt, prm.conv_w, prm.conv_b, prm.dt_bias, prm.start,
            int(op, "conv_off", d.conv_off)?, int(op, "channels", d.channels)?, int(op, "width", d.width)?,
            int(op, "dt_off", d.dt_off)?, int(op, "heads", d.heads)?,
        ],
    )
}

/// Warps per output of the matrix-vector kernels (1, 2 or 4): enough warps to fill the GPU twice
/// over, each with at least a whole pass of 16-byte loads along the row, and no more blocks (of
/// 8 / ks outputs; the GLU kernel's as many) than 4 per SM can hold at once: one wave of the
/// 64-register kernels, since a second wave costs a whole block's latency again
/// (docs/kernel-notes.md). `FOXLM_GEMV_WAVES=0` drops the wave bound (for comparisons).
fn gemv_split(gpu: &Gpu, in_features: usize, out_features: usize, elem_bytes: usize) -> usize {
    static WAVES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let waves = *WAVES.get_or_init(|| std::env::var("FOXLM_GEMV_WAVES").map_or(true, |v| v != "0"));
    let pass = 32 * 16 / elem_bytes;
    let resident = 4 * gpu.sm_count();
    let mut ks = 1;
    while ks < 4
        && out_features * ks * 2 <= 16384
        && pass * ks * 2 <= in_features
        && (!waves || out_features.div_ceil(8 / (ks * 2)) <= resident)
    {
        ks *= 2;
    }
    ks
}

/// The matrix-vector kernel `name` with inputs in T on the addresses of its checked buffers: y,
/// the GLU's h (0: none), x and w.
fn gemv_launch<T>(
    gpu: &Gpu,
    name: &str,
    [y, h, x, w]: [u64; 4],
    rows: usize,
    in_features: usize,
    out_features: usize,
) -> Result<()> {
    let ks = gemv_split(gpu, in_features, out_features, size_of::<T>());
    // A GLU block takes (8 / ks) / 2 gate rows and their up rows.
    let blocks = if h != 0 { (out_features / 2).div_ceil(4 / ks) } else { out_features.div_ceil(8 / ks) };
    launch_dependent(
        gpu,
        name,
        grid1(blocks)?,
        256,
        &args![
            gpu;
            y, h, x, w, rows as i32, int(name, "in_features", in_features)?, int(name, "out_features", out_features)?,
            ks as i32,
        ],
    )
}

/// Whether [`rms_norm_bwd`] runs as one kernel for rows of `dim` with `groups` weight rows: a
/// super-row of groups·dim a multiple of 128 and at most 1536 wide (a lane's column sums in
/// registers), each row whole 128-wide chunks or dim/4 lanes of one.
pub fn rms_norm_bwd_fuses(dim: usize, groups: usize) -> bool {
    let w = groups * dim;
    w > 0
        && w.is_multiple_of(128)
        && w <= 128 * RMS_BWD_CHUNKS
        && (dim.is_multiple_of(128) || (128 % dim == 0 && dim.is_multiple_of(4)))
}

/// The chunks of a super-row the fused backward keeps sums for (ops.cu's RMS_BWD_CHUNKS).
const RMS_BWD_CHUNKS: usize = 12;

/// What the backward of an RMSNorm reads of its forward: the input `x` [rows, dim], the statistic
/// `rstd` [rows] and the weights `w` (as in [`RmsNorm`]).
#[derive(Clone, Copy)]
pub struct RmsNormSaved<'a, T> {
    pub x: &'a CudaSlice<T>,
    pub rstd: &'a CudaSlice<f32>,
    pub w: &'a CudaSlice<f32>,
    pub rows: usize,
    pub dim: usize,
}

/// RMSNorm backward exactly as [`crate::rmsnorm::rms_norm_bwd`]: dx = rstd·(w·dy − x̂·mean(w·dy·x̂))
/// (overwritten, or added when `accumulate`), dw += Σ_rows dy·x̂ (deterministic two-pass sum).
/// Where the shapes allow ([`rms_norm_bwd_fuses`]) dx and dw's partial sums come from one pass
/// over dy and x (`rms_norm_bwd_fused`: dx bitwise as the two-kernel path, dw summed in smaller
/// chunks); else the dx kernel, then a column sum reading dy and x again. `fused`: `None` takes
/// the fused kernel where it fits (unless `FOXLM_RMS_BWD_FUSED=0`), `Some(f)` forces the choice
/// (the GPU check compares the two).
pub fn rms_norm_bwd<T: Elem>(
    gpu: &Gpu,
    dx: &mut CudaSlice<T>,
    accumulate: bool,
    dw: &mut CudaSlice<f32>,
    dy: &CudaSlice<T>,
    saved: RmsNormSaved<'_, T>,
    fused: Option<bool>,
) -> Result<()> {
    let RmsNormSaved { x, rstd, w, rows, dim } = saved;
    // FOXLM_RMS_BWD_FUSED=0: the two kernels everywhere (to compare).
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let fused = fused.unwrap_or_else(|| {
        let off = *OFF.get_or_init(|| std::env::var("FOXLM_RMS_BWD_FUSED").as_deref() == Ok("0"));
        !off && !w.is_empty() && rms_norm_bwd_fuses(dim, w.len() / dim.max(1))
    });

    let op = "rms_norm_bwd";
    let groups = norm_groups(op, w, dim)?;
    need(op, "x", x, rows * dim)?;
    need(op, "dy", dy, rows * dim)?;
    need(op, "dx", dx, rows * dim)?;
    need(op, "rstd", rstd, rows)?;
    need(op, "dw", dw, w.len())?;
    if rows == 0 {
        return Ok(());
    }
    let (rows_i, dim_i) = (int(op, "rows", rows)?, int(op, "dim", dim)?);
    let (px, pdy, prstd, pw) = (ptr(gpu, x), ptr(gpu, dy), ptr(gpu, rstd), ptr(gpu, w));
    if fused {
        ensure!(rms_norm_bwd_fuses(dim, groups), "{op}: dim {dim} with {groups} weight rows has no fused kernel");
        // Chunks of 32 super-rows (at most 2048 chunks, as the scratch is planned): a warp takes
        // four, so the grid fills the GPU where the column sum's chunks of 128 would not.
        let (width, super_rows) = (w.len(), rows.div_ceil(groups));
        let r = 32usize.max(super_rows.div_ceil(2048));
        let p = super_rows.div_ceil(r).max(1);
        let part = scratch(gpu, p * width)?;
        launch(
            gpu,
            &kname::<T>("rms_norm_bwd_fused"),
            grid1(p)?,
            256,
            &args![gpu; part, dx, accumulate as i32, pdy, px, prstd, pw, rows_i, dim_i, groups as i32, r as i32],
        )?;
        return colsum_final(gpu, ptr(gpu, dw), part, p, width);
    }
    launch(
        gpu,
        &kname::<T>("rms_norm_bwd_dx"),
        warp_rows_grid(rows)?,
        256,
        &args![gpu; dx, accumulate as i32, pdy, px, prstd, pw, rows_i, dim_i, groups as i32],
    )?;
    // dw: column sums over the input viewed as [ceil(rows/groups), groups·dim].
    let width = w.len();
    let super_rows = rows.div_ceil(groups);
    let (r, p) = colsum_plan(super_rows);
    let part = scratch(gpu, p * width)?;
    launch(
        gpu,
        &kname::<T>("rms_norm_dw_part"),
        (width.div_ceil(32) as u32, p as u32, 1),
        256,
        &args![gpu; part, pdy, px, prstd, rows_i, dim_i, groups as i32, r as i32],
    )?;
    colsum_final(gpu, ptr(gpu, dw), part, p, width)
}

// ------------------------------------------------------------------------------------------------
// KV-shift

/// The inputs a KV-shift's forward and backward share: x [B, T, H·D], the mixing weights alpha
/// [B, T, H] and the rows' left-padding starts [B] (None: no padding).
#[derive(Clone, Copy)]
pub struct KvShift<'a, T> {
    pub x: &'a CudaSlice<T>,
    pub alpha: &'a CudaSlice<T>,
    pub start: Option<&'a CudaSlice<i32>>,
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
}

impl<T> KvShift<'_, T> {
    /// Checks the inputs and returns B, T, H, D as the kernels' ints.
    fn check(&self, op: &str) -> Result<[i32; 4]> {
        let Self { x, alpha, start, batch: b, seq: t, heads: h, head_dim: d } = *self;
        need(op, "x", x, b * t * h * d)?;
        need(op, "alpha", alpha, b * t * h)?;
        need_opt(op, "start", start, b)?;
        int(op, "B·T·H", b * t * h)?;
        Ok([int(op, "b", b)?, int(op, "t", t)?, int(op, "h", h)?, int(op, "d", d)?])
    }
}

/// KV-shift forward exactly as [`crate::kv_shift::kv_shift_fwd`] with `prev = None`:
/// out_t = α_t·x_{t−1} + (1−α_t)·x_t per head, x_{s−1} = 0 at each row's first real token s =
/// start[b] (left padding; padded positions pass x through). out [B, T, H·D].
pub fn kv_shift_fwd<T: Elem>(gpu: &Gpu, out: &mut CudaSlice<T>, kv: KvShift<'_, T>) -> Result<()> {
    let op = "kv_shift_fwd";
    let [bi, ti, hi, di] = kv.check(op)?;
    let KvShift { x, alpha, start, batch: b, seq: t, heads: h, head_dim: d } = kv;
    need(op, "out", out, b * t * h * d)?;
    if b * t * h * d == 0 {
        return Ok(());
    }
    launch(gpu, &kname::<T>(op), warp_rows_grid(b * t * h)?, 256, &args![gpu; out, x, alpha, start, bi, ti, hi, di])
}

/// KV-shift backward exactly as [`crate::kv_shift::kv_shift_bwd`]: dx [B, T, H·D] and dalpha
/// [B, T, H] are overwritten.
pub fn kv_shift_bwd<T: Elem>(
    gpu: &Gpu,
    dx: &mut CudaSlice<T>,
    dalpha: &mut CudaSlice<T>,
    dout: &CudaSlice<T>,
    kv: KvShift<'_, T>,
) -> Result<()> {
    let op = "kv_shift_bwd";
    let [bi, ti, hi, di] = kv.check(op)?;
    let KvShift { x, alpha, start, batch: b, seq: t, heads: h, head_dim: d } = kv;
    need(op, "dout", dout, b * t * h * d)?;
    need(op, "dx", dx, b * t * h * d)?;
    need(op, "dalpha", dalpha, b * t * h)?;
    if b * t * h * d == 0 {
        return Ok(());
    }
    launch(
        gpu,
        &kname::<T>(op),
        warp_rows_grid(b * t * h)?,
        256,
        &args![gpu; dx, dalpha, dout, x, alpha, start, bi, ti, hi, di],
    )
}

// ------------------------------------------------------------------------------------------------
// RoPE

/// RoPE in place exactly as [`crate::rope::rope_apply`] (rotate-half; `inverse` rotates back, the
/// backward): x [rows, H·D], positions[row] per row.
#[allow(clippy::too_many_arguments)]
pub fn rope_apply<T: Elem>(
    gpu: &Gpu,
    x: &mut CudaSlice<T>,
    positions: &CudaSlice<i32>,
    rows: usize,
    h: usize,
    d: usize,
    base: f64,
    inverse: bool,
) -> Result<()> {
    let op = "rope_apply";
    ensure!(d.is_multiple_of(2), "{op}: head dim {d} must be even (rotate-half pairs)");
    ensure!(base > 0.0 && base.is_finite(), "{op}: base {base} must be a positive number");
    need(op, "x", x, rows * h * d)?;
    need(op, "positions", positions, rows)?;
    int(op, "rows·D/2", rows * d / 2)?;
    if rows * h * d == 0 {
        return Ok(());
    }
    launch(
        gpu,
        &kname::<T>(op),
        flat_grid(rows * d / 2)?,
        256,
        &args![gpu; x, positions, int(op, "rows", rows)?, int(op, "h", h)?, int(op, "d", d)?, base, inverse as i32],
    )
}

// ------------------------------------------------------------------------------------------------
// Elementwise

fn elementwise(gpu: &Gpu, name: &str, n: usize, ptrs: &[u64]) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    // the kernels load 4 elements at a time (16 bytes of f32); allocations are 256-byte aligned
    if let Some(p) = ptrs.iter().find(|p| *p % 16 != 0) {
        return Err(anyhow!("{name}: buffer at {p:#x} is not 16-byte aligned"));
    }
    let mut args: Vec<Arg> = ptrs.iter().map(|p| Arg::P(*p)).collect();
    args.push(Arg::L(n as i64));
    launch(gpu, name, vec4_grid(n)?, 256, &args)
}

/// The elementwise ops over `n` elements, one row each: `fn op<T>(outputs; inputs)` becomes
/// `pub fn op<T: Elem>(gpu, outputs.., inputs.., n)`, which checks that the inputs, then the
/// outputs, hold `n` elements and runs [`elementwise`] kernel `op_f32` / `op_bf16` (`op` itself
/// for the f32-only ops written without `<T>`) on the outputs' then the inputs' addresses.
macro_rules! elementwise_ops {
    (@kernel $op:ident $T:ident) => {
        kname::<$T>($op)
    };
    (@kernel $op:ident) => {
        $op.to_string()
    };
    ($($(#[$doc:meta])* fn $name:ident$(<$T:ident>)?($($out:ident: $O:ty),+; $($inp:ident: $I:ty),+);)*) => {$(
        $(#[$doc])*
        pub fn $name$(<$T: Elem>)?(
            gpu: &Gpu,
            $($out: &mut CudaSlice<$O>,)+
            $($inp: &CudaSlice<$I>,)+
            n: usize,
        ) -> Result<()> {
            let op = stringify!($name);
            $(need(op, stringify!($inp), $inp, n)?;)+
            $(need(op, stringify!($out), $out, n)?;)+
            let kernel = elementwise_ops!(@kernel op $($T)?);
            elementwise(gpu, &kernel, n, &[$(ptr(gpu, $out),)+ $(ptr(gpu, $inp),)+])
        }
    )*};
}

elementwise_ops! {
    /// y = sigmoid(x) (KV-shift's α).
    fn sigmoid_fwd<T>(y: T; x: T);
    /// dx = dy·y·(1 − y), from the forward's output y.
    fn sigmoid_bwd<T>(dx: T; dy: T, y: T);
    /// a = logsigmoid(logit), as [`crate::fgate::log_fgate_fwd`].
    fn log_fgate_fwd(a: f32; logit: f32);
    /// dlogit = da·sigmoid(−logit), as [`crate::fgate::log_fgate_bwd`].
    fn log_fgate_bwd(dlogit: f32; da: f32, logit: f32);
    /// Output gate: z = pre·sigmoid(g).
    fn gate_mul_fwd<T>(z: T; pre: T, g: T);
    /// Output gate backward: dpre = dz·s, dg = dz·pre·s·(1 − s), s = sigmoid(g).
    fn gate_mul_bwd<T>(dpre: T, dg: T; dz: T, pre: T, g: T);
    /// y = a + b.
    fn add<T>(y: T; a: T, b: T);
    /// y += x.
    fn add_inplace<T>(y: T; x: T);
    /// out = x rounded to T (round to nearest even for bf16).
    fn cast_from_f32<T>(out: T; x: f32);
    /// out = x as f32 (exact).
    fn cast_to_f32<T>(out: f32; x: T);
}

/// x[r, c] += bias[c] over x [rows, cols] (the forget gate's logits, f32).
pub fn add_bias_rows(gpu: &Gpu, x: &mut CudaSlice<f32>, bias: &CudaSlice<f32>, rows: usize, cols: usize) -> Result<()> {
    row_op(gpu, "add_bias_rows", x, ("bias", bias), rows, cols)
}

/// x[r, c] = row[c] (the bias-only and fixed forget gates).
pub fn fill_rows(gpu: &Gpu, x: &mut CudaSlice<f32>, row: &CudaSlice<f32>, rows: usize, cols: usize) -> Result<()> {
    row_op(gpu, "fill_rows", x, ("row", row), rows, cols)
}

/// Kernel `op` over x [rows, cols] with one f32 row broadcast down it.
fn row_op(
    gpu: &Gpu,
    op: &str,
    x: &mut CudaSlice<f32>,
    (what, row): (&str, &CudaSlice<f32>),
    rows: usize,
    cols: usize,
) -> Result<()> {
    need(op, "x", x, rows * cols)?;
    need(op, what, row, cols)?;
    if rows * cols == 0 {
        return Ok(());
    }
    launch(gpu, op, flat_grid(rows * cols)?, 256, &args![gpu; x, row, rows as i64, int(op, "cols", cols)?])
}

/// dst[c] += Σ_r src[r, c] over src [rows, cols] (bias gradients), deterministic.
pub fn col_sum_acc(gpu: &Gpu, dst: &mut CudaSlice<f32>, src: &CudaSlice<f32>, rows: usize, cols: usize) -> Result<()> {
    let op = "col_sum_acc";
    need(op, "src", src, rows * cols)?;
    need(op, "dst", dst, cols)?;
    if rows * cols == 0 {
        return Ok(());
    }
    let (rows_i, cols_i) = (int(op, "rows", rows)?, int(op, "cols", cols)?);
    let (r, p) = colsum_plan(rows);
    let part = scratch(gpu, p * cols)?;
    launch(
        gpu,
        "colsum_part_f32",
        (cols.div_ceil(32) as u32, p as u32, 1),
        256,
        &args![gpu; part, src, rows_i, cols_i, r as i32],
    )?;
    colsum_final(gpu, ptr(gpu, dst), part, p, cols)
}

// ------------------------------------------------------------------------------------------------
// SwiGLU

/// SwiGLU forward exactly as [`crate::swiglu::swiglu_fwd`]: gu [rows, 2I] = [gate | up] →
/// h [rows, I] = silu(gate)·up.
pub fn swiglu_fwd<T: Elem>(
    gpu: &Gpu,
    h: &mut CudaSlice<T>,
    gu: &CudaSlice<T>,
    rows: usize,
    inter: usize,
) -> Result<()> {
    let op = "swiglu_fwd";
    need(op, "gu", gu, rows * 2 * inter)?;
    need(op, "h", h, rows * inter)?;
    swiglu_launch::<T>(gpu, op, &[ptr(gpu, h), ptr(gpu, gu)], rows, inter)
}

/// SwiGLU backward exactly as [`crate::swiglu::swiglu_bwd`]: dgu [rows, 2I] (overwritten).
pub fn swiglu_bwd<T: Elem>(
    gpu: &Gpu,
    dgu: &mut CudaSlice<T>,
    dh: &CudaSlice<T>,
    gu: &CudaSlice<T>,
    rows: usize,
    inter: usize,
) -> Result<()> {
    let op = "swiglu_bwd";
    need(op, "gu", gu, rows * 2 * inter)?;
    need(op, "dh", dh, rows * inter)?;
    need(op, "dgu", dgu, rows * 2 * inter)?;
    swiglu_launch::<T>(gpu, op, &[ptr(gpu, dgu), ptr(gpu, dh), ptr(gpu, gu)], rows, inter)
}

/// SwiGLU kernel `op` on the addresses of its checked buffers, then rows and I. Threads: one per 4
/// channels when I % 4 == 0 (16- or 8-byte accesses), else one per channel.
fn swiglu_launch<T: Elem>(gpu: &Gpu, op: &str, ptrs: &[u64], rows: usize, inter: usize) -> Result<()> {
    int(op, "rows·2I", rows * 2 * inter)?;
    if rows * inter == 0 {
        return Ok(());
    }
    let threads = if inter.is_multiple_of(4) { rows * inter / 4 } else { rows * inter };
    let mut args: Vec<Arg> = ptrs.iter().map(|p| Arg::P(*p)).collect();
    args.extend([Arg::I(rows as i32), Arg::I(inter as i32)]);
    launch(gpu, &kname::<T>(op), flat_grid(threads)?, 256, &args)
}

// ------------------------------------------------------------------------------------------------
// Embedding

/// out[r] = table[ids[r]] for out [rows, d], table [vocab, d] (vocab = len(table)/d). Ids must be
/// validated on the host before upload: an id outside [0, vocab) gives a zero row.
pub fn embedding_fwd<T: Elem>(
    gpu: &Gpu,
    out: &mut CudaSlice<T>,
    table: &CudaSlice<T>,
    ids: &CudaSlice<i32>,
    rows: usize,
    d: usize,
) -> Result<()> {
    let op = "embedding_fwd";
    ensure!(d > 0, "{op}: d is 0");
    let vocab = table.len() / d;
    need(op, "ids", ids, rows)?;
    need(op, "out", out, rows * d)?;
    int(op, "rows·d", rows * d)?;
    if rows == 0 {
        return Ok(());
    }
    launch(
        gpu,
        &kname::<T>(op),
        flat_grid(rows * d)?,
        256,
        &args![gpu; out, table, ids, rows as i32, d as i32, int(op, "vocab", vocab)?],
    )
}

/// The positions of a batch grouped by token id, for a deterministic embedding backward without
/// atomics: one block per distinct token adds that token's rows in position order. Built on the
/// host from the host ids and uploaded into device buffers allocated once by [`Self::new`].
pub struct EmbeddingIndex {
    max_rows: usize,
    rows: usize,
    segments: usize,
    max_id: Option<u32>,
    /// positions sorted by (id, position)
    order: CudaSlice<i32>,
    /// token of each segment
    seg_tok: CudaSlice<i32>,
    /// first entry of `order` of each segment, and the end: [segments + 1]
    seg_start: CudaSlice<i32>,
    h_order: Vec<i32>,
    h_tok: Vec<i32>,
    h_start: Vec<i32>,
}

impl EmbeddingIndex {
    /// Device buffers for batches of up to `max_rows` positions.
    pub fn new(gpu: &Gpu, max_rows: usize) -> Result<Self> {
        int("EmbeddingIndex::new", "max_rows", max_rows)?;
        Ok(Self {
            max_rows,
            rows: 0,
            segments: 0,
            max_id: None,
            order: gpu.zeros(max_rows)?,
            seg_tok: gpu.zeros(max_rows)?,
            seg_start: gpu.zeros(max_rows + 1)?,
            h_order: Vec::with_capacity(max_rows),
            h_tok: Vec::with_capacity(max_rows),
            h_start: Vec::with_capacity(max_rows + 1),
        })
    }

    /// Group the positions of `ids` (the batch's token ids, row-major [rows]) by id and upload
    /// the index. Allocates nothing once the host vectors reached `max_rows`.
    pub fn update(&mut self, gpu: &Gpu, ids: &[u32]) -> Result<()> {
        ensure!(
            ids.len() <= self.max_rows,
            "EmbeddingIndex::update: {} ids but the index was made for at most {}",
            ids.len(),
            self.max_rows
        );
        if let Some(bad) = ids.iter().find(|&&v| v > i32::MAX as u32) {
            return Err(anyhow!("EmbeddingIndex::update: token id {bad} does not fit 32-bit indices"));
        }
        self.max_id = group_positions(ids, &mut self.h_order, &mut self.h_tok, &mut self.h_start);
        self.rows = ids.len();
        self.segments = self.h_tok.len();
        if !ids.is_empty() {
            gpu.write(&mut self.order, &self.h_order)?;
            gpu.write(&mut self.seg_tok, &self.h_tok)?;
        }
        gpu.write(&mut self.seg_start, &self.h_start)?;
        Ok(())
    }

    /// Positions in the last [`Self::update`].
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Distinct token ids in the last update.
    pub fn distinct(&self) -> usize {
        self.segments
    }
}

/// Group positions by id: `order` = positions sorted by (id, position), `tok` = the distinct ids
/// in increasing order, `start` = where each id's run begins in `order`, then `ids.len()`.
/// Returns the largest id (None for no ids). Reuses the vectors' capacity.
fn group_positions(ids: &[u32], order: &mut Vec<i32>, tok: &mut Vec<i32>, start: &mut Vec<i32>) -> Option<u32> {
    order.clear();
    order.extend(0..ids.len() as i32);
    // unstable sort on a unique key: deterministic, and no allocation
    order.sort_unstable_by_key(|&p| (ids[p as usize], p));
    tok.clear();
    start.clear();
    let mut prev: Option<u32> = None;
    for (i, &p) in order.iter().enumerate() {
        let id = ids[p as usize];
        if prev != Some(id) {
            tok.push(id as i32);
            start.push(i as i32);
            prev = Some(id);
        }
    }
    start.push(ids.len() as i32);
    prev
}

/// Embedding backward: dtable[tok] += the dout rows of tok's positions, added in position order
/// (the CPU reference's order). dout [rows, d] with rows from the index's last update.
pub fn embedding_bwd<T: Elem>(
    gpu: &Gpu,
    dtable: &mut CudaSlice<f32>,
    dout: &CudaSlice<T>,
    idx: &EmbeddingIndex,
    d: usize,
) -> Result<()> {
    let op = "embedding_bwd";
    ensure!(d > 0, "{op}: d is 0");
    need(op, "dout", dout, idx.rows * d)?;
    let Some(max_id) = idx.max_id else { return Ok(()) };
    ensure!(
        (max_id as usize) < dtable.len() / d,
        "{op}: token id {max_id} is outside the table of {} rows",
        dtable.len() / d
    );
    int(op, "d", d)?;
    launch(
        gpu,
        &kname::<T>(op),
        grid1(idx.segments)?,
        256,
        &args![gpu; dtable, dout, &idx.order, &idx.seg_tok, &idx.seg_start, d as i32],
    )
}

// ------------------------------------------------------------------------------------------------
// Cross-entropy

/// What every cross-entropy launch shares: the f32 logits of `rows` rows, the targets [rows]
/// (< 0: no loss) and the `weight` of dlogits.
#[derive(Clone, Copy)]
pub struct CrossEntropy<'a> {
    pub logits: &'a CudaSlice<f32>,
    pub targets: &'a CudaSlice<i32>,
    pub weight: f32,
    pub rows: usize,
}

impl CrossEntropy<'_> {
    /// The buffers of a cross-entropy over rows of logits stored `ld` apart.
    fn check<T>(&self, op: &str, dlogits: &CudaSlice<T>, losses: &CudaSlice<f32>, ld: usize) -> Result<()> {
        need(op, "logits", self.logits, self.rows * ld)?;
        need(op, "dlogits", dlogits, self.rows * ld)?;
        need(op, "losses", losses, self.rows)?;
        need(op, "targets", self.targets, self.rows)
    }
}

/// Fused softmax cross-entropy over f32 logits [rows, vocab], one row per block:
/// losses[r] = logsumexp(logits[r]) − logits[r, target[r]], dlogits[r] = weight·(softmax − onehot).
/// Rows with target < 0 get loss 0 and dlogits 0; a target ≥ vocab gives a NaN loss (validate
/// targets on the host).
pub fn cross_entropy_fwd_bwd<T: Elem>(
    gpu: &Gpu,
    dlogits: &mut CudaSlice<T>,
    losses: &mut CudaSlice<f32>,
    ce: CrossEntropy<'_>,
    vocab: usize,
) -> Result<()> {
    let op = "cross_entropy_fwd_bwd";
    ensure!(vocab > 0, "{op}: vocab is 0");
    ce.check(op, dlogits, losses, vocab)?;
    let CrossEntropy { logits, targets, weight, rows } = ce;
    if rows == 0 {
        return Ok(());
    }
    launch(
        gpu,
        &kname::<T>("cross_entropy"),
        grid1(rows)?,
        512,
        &args![gpu; dlogits, losses, logits, targets, weight, int(op, "rows", rows)?, int(op, "vocab", vocab)?],
    )
}

/// The output head's fused softmax cross-entropy (kernels/model.cu) over rows of `vocab` logits
/// stored `ld` apart (the head pads its rows): losses[r] = logsumexp − logits[r, target[r]],
/// dlogits[r, c] = weight·(softmax − onehot) for c < vocab and 0 in the padding; rows with target
/// < 0 get loss 0 and dlogits 0. `staged`: the row is read once into shared memory (4·ld bytes,
/// see [`cross_entropy_staged_fits`]) rather than three times from memory; both give the same bits.
pub fn cross_entropy_padded<T: Elem>(
    gpu: &Gpu,
    dlogits: &mut CudaSlice<T>,
    losses: &mut CudaSlice<f32>,
    ce: CrossEntropy<'_>,
    vocab: usize,
    ld: usize,
    staged: bool,
) -> Result<()> {
    let op = "cross_entropy_padded";
    ensure!(vocab > 0 && vocab <= ld, "{op}: vocab {vocab} must be in 1..=ld ({ld})");
    ce.check(op, dlogits, losses, ld)?;
    let CrossEntropy { logits, targets, weight, rows } = ce;
    if rows == 0 {
        return Ok(());
    }
    let smem = if staged {
        ensure!(cross_entropy_staged_fits(gpu, ld), "{op}: a row of {ld} logits does not fit shared memory");
        4 * ld
    } else {
        0
    };
    let name = if staged { kname::<T>("fox_cross_entropy_ld_smem") } else { kname::<T>("fox_cross_entropy_ld") };
    let cfg = kargs::plain_config(grid1(rows)?, 512, smem);
    kargs::launch(
        gpu,
        &super::compile::MODEL,
        &name,
        cfg,
        &args![gpu; dlogits, losses, logits, targets, weight, int(op, "vocab", vocab)?, int(op, "ld", ld)?],
    )
}

/// Whether [`cross_entropy_padded`] can stage a row of `ld` logits in shared memory on this GPU
/// (`ld` a multiple of 4; 4·ld bytes within the opt-in limit, 1 KB left for the block's sums).
pub fn cross_entropy_staged_fits(gpu: &Gpu, ld: usize) -> bool {
    let limit = gpu
        .context()
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .map_or(0, |v| v.max(0) as usize);
    ld.is_multiple_of(4) && 4 * ld + 1024 <= limit
}

// ------------------------------------------------------------------------------------------------
// Optimizer

/// One AdamW update of one tensor, exactly as `foxlm::optim::AdamW::update` does per element:
/// The hyperparameters of one AdamW update on the device.
#[derive(Clone, Copy, Debug)]
pub struct AdamWUpdate {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// 0 for parameters without decay.
    pub weight_decay: f32,
    /// The 1-based number of this update (the CPU's `self.step` after its increment).
    pub step: u64,
    /// Gradient scale (clipping), 1 when not clipped.
    pub grad_scale: f32,
}

/// g' = g·grad_scale; m = β1·m + (1−β1)·g'; v = β2·v + (1−β2)·g'²;
/// w = w·(1 − lr·weight_decay) − lr/(1−β1^step) · m / (sqrt(v)/sqrt(1−β2^step) + eps).
/// `copy` (the T working copy) gets the new weights.
#[allow(clippy::too_many_arguments)]
pub fn adamw<T: Elem>(
    gpu: &Gpu,
    w: &mut CudaSlice<f32>,
    copy: Option<&mut CudaSlice<T>>,
    g: &CudaSlice<f32>,
    m: &mut CudaSlice<f32>,
    v: &mut CudaSlice<f32>,
    n: usize,
    h: &AdamWUpdate,
) -> Result<()> {
    adamw_shard(gpu, (w, 0), copy.map(|c| (c, 0)), (g, 0), m, v, n, h)
}

/// [`adamw`] on one rank's shard of a tensor (ZeRO-1): the moments hold the shard's `n` elements;
/// the weights, the working copy and the gradient are read and written from their offsets on
/// (the shard's place in the whole tensor, or 0 for a buffer that holds only the shard).
#[allow(clippy::too_many_arguments)]
pub fn adamw_shard<T: Elem>(
    gpu: &Gpu,
    w: (&mut CudaSlice<f32>, usize),
    copy: Option<(&mut CudaSlice<T>, usize)>,
    g: (&CudaSlice<f32>, usize),
    m: &mut CudaSlice<f32>,
    v: &mut CudaSlice<f32>,
    n: usize,
    h: &AdamWUpdate,
) -> Result<()> {
    let AdamWUpdate { lr, beta1, beta2, eps, weight_decay, step, grad_scale } = *h;
    let op = "adamw";
    ensure!(step >= 1 && step <= i32::MAX as u64, "{op}: step {step} must be in 1..2^31 (1 for the first update)");
    let ((w, w0), (g, g0)) = (w, g);
    need(op, "w", w, w0 + n)?;
    need(op, "g", g, g0 + n)?;
    need(op, "m", m, n)?;
    need(op, "v", v, n)?;
    if let Some((c, c0)) = &copy {
        need(op, "copy", &**c, c0 + n)?;
    }
    if n == 0 {
        return Ok(());
    }
    // The host part in f64, as the CPU optimizer computes it.
    let t = step as i32;
    let bc1 = 1.0 - (beta1 as f64).powi(t);
    let bc2 = 1.0 - (beta2 as f64).powi(t);
    let step_size = (lr as f64 / bc1) as f32;
    let bc2_sqrt = bc2.sqrt() as f32;
    let decay = (1.0 - lr as f64 * weight_decay as f64) as f32;
    let pcopy = copy.map_or(0, |(c, c0)| ptr(gpu, c) + (c0 * std::mem::size_of::<T>()) as u64);
    launch(
        gpu,
        &kname::<T>(op),
        grid1(n.div_ceil(256).min(1 << 16))?,
        256,
        &args![
            gpu;
            ptr(gpu, w) + (w0 * 4) as u64, pcopy, ptr(gpu, g) + (g0 * 4) as u64, m, v, n as i64, beta1, beta2, eps,
            decay, step_size, bc2_sqrt, grad_scale,
        ],
    )
}

/// Blocks of pass 1 of [`sum_squares`] at most (its f64 partials live in the scratch).
const SUMSQ_MAX_BLOCKS: usize = 1024;

/// out[slot] = Σ x² over x[..n], accumulated in f64 (fixed grid from n alone, fixed-order sums)
/// and stored as f32; the host downloads `out` once per step for the global norm.
pub fn sum_squares(gpu: &Gpu, out: &mut CudaSlice<f32>, slot: usize, x: &CudaSlice<f32>, n: usize) -> Result<()> {
    sum_squares_at(gpu, out, slot, x, 0, n)
}

/// [`sum_squares`] over x[offset..offset + n] (one rank's shard of a gradient).
pub fn sum_squares_at(
    gpu: &Gpu,
    out: &mut CudaSlice<f32>,
    slot: usize,
    x: &CudaSlice<f32>,
    offset: usize,
    n: usize,
) -> Result<()> {
    let op = "sum_squares";
    ensure!(slot < out.len(), "{op}: slot {slot} is outside `out` of {} elements", out.len());
    need(op, "x", x, offset + n)?;
    let blocks = n.div_ceil(2048).clamp(1, SUMSQ_MAX_BLOCKS);
    let part = scratch(gpu, 2 * blocks)?;
    let px = ptr(gpu, x) + (offset * 4) as u64;
    launch(gpu, "sumsq_part", grid1(blocks)?, 256, &args![gpu; part, px, n as i64])?;
    launch(gpu, "sumsq_final", (1, 1, 1), 256, &args![gpu; out, int(op, "slot", slot)?, part, blocks as i32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_grouped_by_id_in_position_order() {
        let ids = [5u32, 2, 5, 0, 2, 5, 9];
        let (mut o, mut t, mut s) = (Vec::new(), Vec::new(), Vec::new());
        assert_eq!(group_positions(&ids, &mut o, &mut t, &mut s), Some(9));
        assert_eq!(o, [3, 1, 4, 0, 2, 5, 6]);
        assert_eq!(t, [0, 2, 5, 9]);
        assert_eq!(s, [0, 1, 3, 6, 7]);
        // a second, shorter batch replaces the first
        assert_eq!(group_positions(&[1, 1], &mut o, &mut t, &mut s), Some(1));
        assert_eq!((o.as_slice(), t.as_slice(), s.as_slice()), (&[0, 1][..], &[1][..], &[0, 2][..]));
        assert_eq!(group_positions(&[], &mut o, &mut t, &mut s), None);
        assert_eq!(s, [0]);
    }

    /// Pass 1 of the column sums covers every row with at most 2048 chunks of at least 128 rows.
    #[test]
    fn column_sum_chunks_cover_the_rows() {
        for rows in [1usize, 127, 128, 129, 262_144, 262_145, 300_001, 393_216, 5_000_000] {
            let (r, p) = colsum_plan(rows);
            assert!(r >= 128 && p <= 2048 && p * r >= rows && (p - 1) * r < rows, "rows {rows}: r {r} p {p}");
            assert!(scratch_floats(rows, 768) >= p * 768);
        }
    }
}
