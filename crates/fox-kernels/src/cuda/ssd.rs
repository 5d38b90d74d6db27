//! Mamba-2's ops on the GPU (kernels/ssd.cu), activations in `T` (f32 or bf16) with f32 dt, A, D,
//! states and accumulation: the twins of [`crate::ssd`], [`crate::conv1d`] and
//! [`crate::rms_norm_gated`], with the same layouts (see those modules). Each function launches on `gpu.stream()` without waiting and
//! returns an error (never panics) when a buffer is shorter than the shapes say. Deterministic:
//! no atomics, fixed-order sums.
//!
//! The SSD forward runs in four kernels over a scratch buffer ([`ssd_fwd_scratch_len`] floats):
//! C Bᵀ per (batch row, group, chunk of 64), each chunk's own state, the state passing over
//! chunks (the one sequential step, one thread per state element), the chunk outputs, all on the
//! CUDA cores in f32, for P ≤ 64, N ≤ 128. For bf16 activations with P = 64 and N = 64 or 128,
//! [`ssd_fwd`] and [`ssd_bwd`] run the tensor-core kernels instead ([`super::ssd_tc`], see
//! [`uses_tensor_cores`]), in the same scratch.

use super::compile::SSD;
use super::kargs::{self, args, int, kname, need, need_lens, need_opt, opt_ptr, ptr, Arg, Bound, DecodeStep};
use super::{Elem, Gpu};
use crate::strided_span;
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

/// Chunk length of the GPU forward (as [`crate::ssd::CHUNK`]).
const L: usize = 64;
/// Largest head dim P of the forward's shared tiles.
const PMAX: usize = 64;
const NMAX: usize = 128;
const SROW: usize = 129;
/// Row stride of the backward's x and dy tiles.
const XROW: usize = 65;

/// A buffer or view the kernel writes.
fn ptr_mut<T>(gpu: &Gpu, s: &mut impl DevicePtrMut<T>) -> u64 {
    let (p, _g) = s.device_ptr_mut(gpu.stream());
    p
}

fn launch(gpu: &Gpu, name: &str, grid: usize, smem: usize, args: &[Arg]) -> Result<()> {
    launch3(gpu, name, (grid, 1, 1), smem, args)
}

/// [`launch`] on a grid (x, y, z).
fn launch3(gpu: &Gpu, name: &str, grid: (usize, usize, usize), smem: usize, args: &[Arg]) -> Result<()> {
    kargs::launch(gpu, &SSD, name, kargs::config(name, grid, 256, smem)?, args)
}

/// [`launch3`] on a grid (x, y) with programmatic dependent launch (no dynamic shared memory): for kernels that
/// wait (pdl_wait_prev) before reading what earlier kernels write, so that their launch overlaps
/// the kernel before them (a decode step's chain of small kernels).
fn launch2_pdl(gpu: &Gpu, name: &str, (grid, gy): (usize, usize), args: &[Arg]) -> Result<()> {
    kargs::launch_pdl(gpu, &SSD, name, kargs::config(name, (grid, gy, 1), 256, 0)?, args)
}

/// Rows of a conv kernel's block (kernels/ssd.cu: 8 runs of 8 rows), and of the backward's (4
/// runs per thread): one partial sum of dweight per 256 rows of a sequence.
const CONV_BLOCK_ROWS: usize = 64;
const CONV_BWD_BLOCK_ROWS: usize = 256;

/// Channels per thread of the conv kernels: `v` where every pointer (addresses in bytes), the row
/// stride and C allow loads of v elements at once, else 1.
fn conv_vec<T>(v: usize, ptrs: &[u64], x_stride: usize, channels: usize) -> bool {
    let bytes = (v * std::mem::size_of::<T>()) as u64;
    ptrs.iter().all(|p| p.is_multiple_of(bytes)) && x_stride.is_multiple_of(v) && channels.is_multiple_of(v)
}

/// The conv kernel `base`_{vec|one}_{w4|w8} for the layout and the taps (kernels/ssd.cu).
fn conv_kernel<T: Elem>(base: &str, vec: bool, width: usize) -> String {
    kname::<T>(&format!("{base}_{}_w{}", if vec { "vec" } else { "one" }, if width <= 4 { 4 } else { 8 }))
}

/// The grid of a conv kernel: 32 channel vectors by `block_rows` rows of one sequence by batch.
fn conv_grid(
    op: &str,
    (batch, seq, channels): (usize, usize, usize),
    v: usize,
    block_rows: usize,
) -> Result<(usize, usize, usize)> {
    let gy = seq.div_ceil(block_rows);
    ensure!(gy <= 65535 && batch <= 65535, "{op}: {batch} sequences of {seq} positions exceed the launch grid");
    Ok((channels.div_ceil(32 * v), gy, batch))
}

/// One SSD problem on the device: as [`crate::ssd::Ssd`], with `start` as i32.
#[derive(Clone, Copy)]
pub struct DevSsd<'a, T: Elem = f32> {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub state: usize,
    pub groups: usize,
    /// [B, T, xbc_stride]: x (H·P) | B (G·N) | C (G·N) per row.
    pub xbc: &'a CudaSlice<T>,
    pub xbc_stride: usize,
    /// [B, T, H], post-softplus.
    pub dt: &'a CudaSlice<f32>,
    /// [H]
    pub a: &'a CudaSlice<f32>,
    /// [H]
    pub d: &'a CudaSlice<f32>,
    /// [B] or none.
    pub start: Option<&'a CudaSlice<i32>>,
}

impl<T: Elem> DevSsd<'_, T> {
    pub(super) fn check(&self, op: &str) -> Result<()> {
        let (b, t, h, p, n, g) = (self.batch, self.seq, self.heads, self.head_dim, self.state, self.groups);
        ensure!(g > 0 && h.is_multiple_of(g), "{op}: groups {g} must divide heads {h}");
        ensure!(p > 0 && n > 0, "{op}: head_dim and state must be positive");
        let width = h * p + 2 * g * n;
        ensure!(self.xbc_stride >= width, "{op}: xbc_stride {} < H·P + 2·G·N = {width}", self.xbc_stride);
        need(op, "xbc", self.xbc, if b * t == 0 { 0 } else { (b * t - 1) * self.xbc_stride + width })?;
        need(op, "dt", self.dt, b * t * h)?;
        need(op, "a", self.a, h)?;
        need(op, "d", self.d, h)?;
        need_opt(op, "start", self.start, b)?;
        int(op, b * t * self.xbc_stride)?;
        Ok(())
    }
    pub(super) fn states(&self) -> usize {
        self.batch * self.heads * self.head_dim * self.state
    }
}

/// Floats of the scratch of [`ssd_fwd`]: C Bᵀ per (batch row, group, chunk) (B·G·nch·64²), the
/// chunk states (B·H·nch·P·N) and their decays (B·H·nch), nch = ⌈T / 64⌉. At B = 2, T = 16384,
/// H = 24, P = 64, N = 128: 409 MB.
pub fn ssd_fwd_scratch_len(
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
    state: usize,
    groups: usize,
) -> usize {
    let nch = seq.div_ceil(L);
    batch * groups * nch * L * L + batch * heads * nch * (head_dim * state + 1)
}

/// The chunked SSD forward, as [`crate::ssd::ssd_fwd`]: y [B, T, H·P]; `init`, `final_state`
/// [B, H, P, N] or none; `scratch` of [`ssd_fwd_scratch_len`] floats. Four kernels: C Bᵀ per
/// chunk, each chunk's own state, the state passing over chunks, the chunk outputs (see
/// kernels/ssd.cu). P ≤ 64, N ≤ 128.
pub fn ssd_fwd<T: Elem>(
    gpu: &Gpu,
    p: &DevSsd<T>,
    y: &mut CudaSlice<T>,
    init: Option<&CudaSlice<f32>>,
    final_state: Option<&mut CudaSlice<f32>>,
    scratch: &mut CudaSlice<f32>,
) -> Result<()> {
    if uses_tensor_cores(p) {
        return super::ssd_tc::ssd_fwd(gpu, p, y, init, final_state, scratch);
    }
    ssd_fwd_steps(gpu, p, Some(y), init, final_state, scratch, &[0, 1, 2, 3])
}

/// Whether [`ssd_fwd`] and [`ssd_bwd`] run the tensor-core kernels of [`super::ssd_tc`] (bf16
/// products, bf16 states between chunks, f32 sums): for bf16 activations with P = 64 and N = 64
/// or 128, unless the environment sets `FOXLM_SSD=cuda-cores` (or its old name `v1`). The
/// CUDA-core kernels (these, f32 arithmetic) serve f32 activations, other shapes, and the decode
/// step. The scratch lengths of this module cover both.
pub fn uses_tensor_cores<T: Elem>(p: &DevSsd<T>) -> bool {
    static CUDA_CORES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let cuda_cores =
        *CUDA_CORES.get_or_init(|| std::env::var("FOXLM_SSD").is_ok_and(|v| v == "cuda-cores" || v == "v1"));
    T::NAME == "bf16" && super::ssd_tc::supported(p) && !cuda_cores
}

/// One of the forward's four kernels alone (0: C Bᵀ, 1: chunk states, 2: state passing, 3: chunk
/// outputs), for timing each (`fox-attn bench-ssd`); the others' results are whatever the
/// scratch holds.
pub fn ssd_fwd_step<T: Elem>(
    gpu: &Gpu,
    p: &DevSsd<T>,
    y: &mut CudaSlice<T>,
    scratch: &mut CudaSlice<f32>,
    step: usize,
) -> Result<()> {
    ssd_fwd_steps(gpu, p, Some(y), None, None, scratch, &[step])
}

fn ssd_fwd_steps<T: Elem>(
    gpu: &Gpu,
    p: &DevSsd<T>,
    y: Option<&mut CudaSlice<T>>,
    init: Option<&CudaSlice<f32>>,
    final_state: Option<&mut CudaSlice<f32>>,
    scratch: &mut CudaSlice<f32>,
    steps: &[usize],
) -> Result<()> {
    let run = |k: usize| steps.contains(&k);
    let op = "ssd_fwd";
    p.check(op)?;
    ensure!(p.head_dim <= PMAX, "{op}: head_dim {} is above {PMAX}", p.head_dim);
    ensure!(p.state <= NMAX, "{op}: state {} is above {NMAX}", p.state);
    need_opt(op, "y", y.as_deref(), p.batch * p.seq * p.heads * p.head_dim)?;
    need_opt(op, "init", init, p.states())?;
    need_opt(op, "final_state", final_state.as_deref(), p.states())?;
    let (b, t, h, pd, n, g) = (p.batch, p.seq, p.heads, p.head_dim, p.state, p.groups);
    need(op, "scratch", scratch, ssd_fwd_scratch_len(b, t, h, pd, n, g))?;
    if b * t == 0 {
        return Ok(());
    }
    let nch = t.div_ceil(L);
    int(op, b * h * nch * pd * n)?;
    let base = ptr(gpu, scratch);
    let cb = base;
    let states = cb + 4 * (b * g * nch * L * L) as u64;
    let decay = states + 4 * (b * h * nch * pd * n) as u64;
    let dims = |v: &mut Vec<Arg>| -> Result<()> {
        for x in [b, t, h, pd, n, g, nch] {
            v.push(Arg::I(int(op, x)?));
        }
        Ok(())
    };
    let (xbc, stride) = (ptr(gpu, p.xbc), p.xbc_stride as i64);
    let mut args = Vec::from(args![gpu; cb, xbc, stride]);
    dims(&mut args)?;
    if run(0) {
        launch(gpu, &kname::<T>("ssd_cb"), b * g * nch, 0, &args)?;
    }
    let (dt, a, start) = (ptr(gpu, p.dt), ptr(gpu, p.a), opt_ptr(gpu, p.start));
    let mut args = Vec::from(args![gpu; states, decay, xbc, stride, dt, a, start]);
    dims(&mut args)?;
    if run(1) {
        launch(gpu, &kname::<T>("ssd_chunk_state"), b * h * nch, 4 * (L * PMAX + L * NMAX + 2 * L), &args)?;
    }
    let args = args![gpu; states, final_state, init, decay, int(op, b * h)?, int(op, pd * n)?, int(op, nch)?];
    if run(2) {
        launch(gpu, "ssd_state_pass_f32", (b * h * pd * n).div_ceil(256), 0, &args)?;
    }
    if !run(3) {
        return Ok(());
    }
    let y = y.ok_or_else(|| anyhow!("{op}: no output buffer"))?;
    let mut args = Vec::from(args![gpu; y, xbc, stride, dt, a, p.d, start, cb, states]);
    dims(&mut args)?;
    launch(
        gpu,
        &kname::<T>("ssd_chunk_scan"),
        b * h * nch,
        4 * (L * (L + 1) + L * PMAX + L * NMAX + PMAX * SROW + 2 * L),
        &args,
    )
}

/// One decoding step, as [`crate::ssd::ssd_decode_step`]: `p.seq` = 1, state [B, H, P, N] in
/// place, y [B, H·P].
pub fn ssd_decode_step<T: Elem>(
    gpu: &Gpu,
    p: &DevSsd<T>,
    state: &mut CudaSlice<f32>,
    y: &mut CudaSlice<T>,
) -> Result<()> {
    decode_step(gpu, p, state, y, false)
}

/// [`ssd_decode_step`] with `p.a` holding A_log: the kernel takes A = −exp(A_log) itself (the
/// model's decode step, one launch fewer).
pub fn ssd_decode_step_a_log<T: Elem>(
    gpu: &Gpu,
    p: &DevSsd<T>,
    state: &mut CudaSlice<f32>,
    y: &mut CudaSlice<T>,
) -> Result<()> {
    decode_step(gpu, p, state, y, true)
}

fn decode_step<T: Elem>(
    gpu: &Gpu,
    p: &DevSsd<T>,
    state: &mut CudaSlice<f32>,
    y: &mut CudaSlice<T>,
    a_log: bool,
) -> Result<()> {
    let op = "ssd_decode_step";
    p.check(op)?;
    let bound = Bound { what: "state", value: p.state, most: NMAX, why: " (four columns per lane)" };
    let outs = p.batch * p.heads * p.head_dim;
    DecodeStep { seq: p.seq, bound, state, states: p.states(), out_name: "y", out: y, outs }.check(op)?;
    if p.batch == 0 {
        return Ok(());
    }
    let args = args![
        gpu;
        state, y, p.xbc, p.xbc_stride as i64, p.dt, p.a, p.d, p.start, int(op, p.heads)?, int(op, p.head_dim)?,
        int(op, p.state)?, int(op, p.groups)?, a_log as i32,
    ];
    launch2_pdl(gpu, &kname::<T>("ssd_decode"), (p.batch * p.heads, p.head_dim.div_ceil(8)), &args)
}

/// Where a Mamba-2 decode step's inputs are in in_proj's output [B, stride]: xBC's C columns
/// from `conv_off`, dt_raw's H columns from `dt_off`.
#[derive(Clone, Copy, Debug)]
pub struct DecodeInputs {
    pub batch: usize,
    pub stride: usize,
    pub conv_off: usize,
    pub channels: usize,
    pub width: usize,
    pub dt_off: usize,
    pub heads: usize,
}

/// What a Mamba-2 decode step's inputs are computed into: xbc [B, C], the conv state
/// [B, W − 1, C] (advanced in place) and dt [B, H].
pub struct DecodeInputsOut<'a, T> {
    pub xbc: &'a mut CudaSlice<T>,
    pub conv_state: &'a mut CudaSlice<f32>,
    pub dt: &'a mut CudaSlice<f32>,
}

/// What a Mamba-2 decode step's inputs read besides in_proj's output: the conv weight [C, W] (in
/// T: the working copy), its bias [C], dt_bias [H], the rows' starts [B], and where the inputs
/// are in in_proj's output.
#[derive(Clone, Copy)]
pub struct DecodeParams<'a, T> {
    pub conv_w: &'a CudaSlice<T>,
    pub conv_b: Option<&'a CudaSlice<f32>>,
    pub dt_bias: &'a CudaSlice<f32>,
    pub start: Option<&'a CudaSlice<i32>>,
    pub at: DecodeInputs,
}

/// The short-convolution widths the conv1d kernels (and the decode's fused conv) are compiled
/// for, one instance per width.
pub const CONV_WIDTHS: std::ops::RangeInclusive<usize> = 1..=8;

/// The checks of [`decode_inputs`] (also [`super::ops::gemv_step_in`]'s, which computes the same).
pub(super) fn check_decode_inputs<T: Elem>(
    op: &str,
    out: &DecodeInputsOut<T>,
    zxbcdt: &CudaSlice<T>,
    prm: &DecodeParams<T>,
) -> Result<()> {
    let d = &prm.at;
    let (b, c, w, h) = (d.batch, d.channels, d.width, d.heads);
    ensure!(CONV_WIDTHS.contains(&w), "{op}: 1 ≤ width ≤ 8");
    ensure!(d.conv_off + c <= d.stride && d.dt_off + h <= d.stride, "{op}: columns past the row of {}", d.stride);
    need(op, "zxbcdt", zxbcdt, b * d.stride)?;
    need(op, "xbc", out.xbc, b * c)?;
    need(op, "conv_state", out.conv_state, b * (w - 1) * c)?;
    need(op, "dt", out.dt, b * h)?;
    need(op, "weight", prm.conv_w, c * w)?;
    need(op, "dt_bias", prm.dt_bias, h)?;
    if let Some(x) = prm.conv_b {
        need(op, "bias", x, c)?;
    }
    if let Some(s) = prm.start {
        need(op, "start", s, b)?;
    }
    int(op, b * d.stride + b * (w - 1) * c)?;
    Ok(())
}

/// The inputs of a Mamba-2 decode step in one launch, as [`conv1d_fwd`] + [`conv1d_state`] +
/// [`dt_fwd`] at T = 1 (a padded row's conv state is kept, as [`crate::conv1d::conv1d_decode_step`]
/// does): xbc [B, C] = SiLU(conv(xBC) + bias) continuing the conv state (advanced),
/// dt [B, H] = softplus(dt_raw + dt_bias).
pub fn decode_inputs<T: Elem>(
    gpu: &Gpu,
    out: DecodeInputsOut<T>,
    zxbcdt: &CudaSlice<T>,
    prm: DecodeParams<T>,
) -> Result<()> {
    let op = "decode_inputs";
    check_decode_inputs(op, &out, zxbcdt, &prm)?;
    let DecodeParams { conv_w, conv_b, dt_bias, start, at: d } = prm;
    let (b, c, w, h) = (d.batch, d.channels, d.width, d.heads);
    if b == 0 {
        return Ok(());
    }
    let DecodeInputsOut { xbc, conv_state, dt } = out;
    let args = args![
        gpu;
        xbc, conv_state, dt, zxbcdt, d.stride as i64, d.conv_off as i64, d.dt_off as i64, conv_w, conv_b, dt_bias,
        start, int(op, b)?, int(op, c)?, int(op, w)?, int(op, h)?,
    ];
    launch(gpu, &kname::<T>("ssd_decode_inputs"), (b * (c + h)).div_ceil(256), 0, &args)
}

/// A causal depthwise conv1d (+SiLU) on the device, as [`crate::conv1d::Conv1d`]: x [B, T,
/// x_stride] (a buffer or view from the first convolved column), weight [C, W] in T (the working
/// copy), and optional bias [C], start [B] and the state before the chunk `prev` [B, W − 1, C]
/// f32. W ≤ 8.
pub struct DevConv1d<'a, T, X> {
    /// (B, T, C, W)
    pub dims: (usize, usize, usize, usize),
    pub x: &'a X,
    pub x_stride: usize,
    pub weight: &'a CudaSlice<T>,
    pub bias: Option<&'a CudaSlice<f32>>,
    pub start: Option<&'a CudaSlice<i32>>,
    pub prev: Option<&'a CudaSlice<f32>>,
    pub silu: bool,
}

impl<T: Elem, X: DevicePtr<T>> DevConv1d<'_, T, X> {
    /// The checks and kernel arguments the conv kernels share, after their output pointer(s):
    /// x, its row stride, the weight, bias, start and prev, B, T, C, W and SiLU.
    fn args(&self, gpu: &Gpu, op: &str) -> Result<Vec<Arg<'static>>> {
        let Self { dims: (batch, seq, channels, width), x, x_stride, weight, bias, start, prev, silu } = *self;
        ensure!(x_stride >= channels, "{op}: x_stride {x_stride} < channels {channels}");
        let rows = batch * seq;
        need(op, "x", x, strided_span(rows, x_stride, channels))?;
        need(op, "weight", weight, channels * width)?;
        need_opt(op, "bias", bias, channels)?;
        need_opt(op, "start", start, batch)?;
        need_opt(op, "prev", prev, batch * width.saturating_sub(1) * channels)?;
        int(op, rows * x_stride.max(channels))?;
        Ok(Vec::from(args![
            gpu;
            ptr(gpu, x), x_stride as i64, weight, bias, start, prev, int(op, batch)?, int(op, seq)?,
            int(op, channels)?, int(op, width)?, silu as i32,
        ]))
    }
}

/// Causal depthwise conv1d (+SiLU) forward, as [`crate::conv1d::conv1d_fwd`] without the new
/// state: out [B, T, C].
pub fn conv1d_fwd<T: Elem>(
    gpu: &Gpu,
    out: &mut CudaSlice<T>,
    conv: &DevConv1d<'_, T, impl DevicePtr<T>>,
) -> Result<()> {
    let op = "conv1d_fwd";
    let (batch, seq, channels, width) = conv.dims;
    ensure!(CONV_WIDTHS.contains(&width), "{op}: 1 ≤ width ≤ 8");
    let rows = batch * seq;
    need(op, "out", out, rows * channels)?;
    let tail = conv.args(gpu, op)?;
    if rows * channels == 0 {
        return Ok(());
    }
    let (po, px) = (ptr(gpu, out), ptr(gpu, conv.x));
    let v = 4;
    let vec = conv_vec::<T>(v, &[po, px], conv.x_stride, channels);
    let mut args = Vec::from(args![gpu; po]);
    args.extend(tail);
    let grid = conv_grid(op, (batch, seq, channels), if vec { v } else { 1 }, CONV_BLOCK_ROWS)?;
    launch3(gpu, &conv_kernel::<T>("ssd_conv1d_fwd", vec, width), grid, 0, &args)
}

/// The convolution's state after a chunk, as [`crate::conv1d::conv1d_fwd`]'s `new_state`: `state`
/// [B, W − 1, C] f32 holds the inputs before the chunk and is replaced, in place, by its last
/// W − 1 inputs (x rows of stride `x_stride`; 0 at padding). Launched after [`conv1d_fwd`] has
/// read the old state.
pub fn conv1d_state<T: Elem>(
    gpu: &Gpu,
    state: &mut CudaSlice<f32>,
    x: &impl DevicePtr<T>,
    x_stride: usize,
    start: Option<&CudaSlice<i32>>,
    (batch, seq, channels, width): (usize, usize, usize, usize),
) -> Result<()> {
    let op = "conv1d_state";
    ensure!(CONV_WIDTHS.contains(&width) && x_stride >= channels, "{op}: 1 ≤ width ≤ 8 and x_stride ≥ channels");
    let rows = batch * seq;
    need(op, "x", x, strided_span(rows, x_stride, channels))?;
    need(op, "state", state, batch * (width - 1) * channels)?;
    need_opt(op, "start", start, batch)?;
    if batch * channels == 0 || width == 1 {
        return Ok(());
    }
    int(op, rows * x_stride)?;
    let args = args![
        gpu;
        state, ptr(gpu, x), x_stride as i64, start, int(op, batch)?, int(op, seq)?, int(op, channels)?, int(op, width)?,
    ];
    launch(gpu, &kname::<T>("ssd_conv_state"), (batch * channels).div_ceil(256), 0, &args)
}

/// A gated RMSNorm's inputs, forward and backward: x [rows, dim], the gate z in rows of stride
/// `z_stride` (from its first column), the weights w [dim].
#[derive(Clone, Copy)]
pub struct GatedNorm<'a, T> {
    pub x: &'a CudaSlice<T>,
    pub z: &'a CudaSlice<T>,
    pub z_stride: usize,
    pub w: &'a CudaSlice<f32>,
    pub rows: usize,
    pub dim: usize,
}

impl<T> GatedNorm<'_, T> {
    /// Elements of z the rows reach.
    fn z_span(&self) -> usize {
        if self.rows == 0 {
            0
        } else {
            (self.rows - 1) * self.z_stride + self.dim
        }
    }
}

/// Gated RMSNorm forward, as [`crate::rms_norm_gated::rms_norm_gated_fwd`]: y [rows, dim],
/// rstd [rows].
pub fn rms_norm_gated_fwd<T: Elem>(
    gpu: &Gpu,
    y: &mut CudaSlice<T>,
    rstd: &mut CudaSlice<f32>,
    norm: GatedNorm<'_, T>,
    eps: f32,
) -> Result<()> {
    let op = "rms_norm_gated_fwd";
    let GatedNorm { x, z, z_stride, w, rows, dim } = norm;
    ensure!(dim > 0 && z_stride >= dim, "{op}: dim > 0 and z_stride ≥ dim");
    need(op, "x", x, rows * dim)?;
    need(op, "y", y, rows * dim)?;
    need(op, "z", z, norm.z_span())?;
    need(op, "w", w, dim)?;
    need(op, "rstd", rstd, rows)?;
    if rows == 0 {
        return Ok(());
    }
    let args = args![
        gpu;
        y, rstd, x, z, z_stride as i64, w, int(op, dim)?, eps,
        norm_vec::<T>(&[ptr(gpu, y), ptr(gpu, x), ptr(gpu, z)], z_stride, dim) as i32,
    ];
    launch2_pdl(gpu, &kname::<T>("ssd_rms_norm_gated_fwd"), (rows, 1), &args)
}

/// Whether the gated RMSNorm's kernels take 16-byte vectors: every pointer, z's row stride and dim
/// aligned to them.
fn norm_vec<T>(ptrs: &[u64], z_stride: usize, dim: usize) -> bool {
    conv_vec::<T>(16 / std::mem::size_of::<T>(), ptrs, z_stride, dim)
}

/// Rows per partial sum of dt_bias's gradient.
const ROWS_PER_PART: usize = 256;

/// Floats of the scratch of [`conv1d_bwd`]: its partial sums of dweight and dbias, one row of
/// C · (W + 1) per 256 positions of each sequence.
pub fn conv1d_bwd_scratch_len(batch: usize, seq: usize, channels: usize, width: usize) -> usize {
    (batch * seq.div_ceil(CONV_BWD_BLOCK_ROWS)).max(1) * channels * (width + 1)
}

/// conv1d backward, as [`crate::conv1d::conv1d_bwd`] (the pre-activation recomputed): dx in x's
/// layout (row stride `x_stride`, channels 0..C overwritten), dweight [C, W] and dbias [C]
/// accumulated through partial sums per 256 positions added in order (deterministic).
pub fn conv1d_bwd<T: Elem>(
    gpu: &Gpu,
    dx: &mut impl DevicePtrMut<T>,
    dweight: &mut CudaSlice<f32>,
    dbias: Option<&mut CudaSlice<f32>>,
    scratch: &mut CudaSlice<f32>,
    dout: &CudaSlice<T>,
    conv: &DevConv1d<'_, T, impl DevicePtr<T>>,
) -> Result<()> {
    let op = "conv1d_bwd";
    let DevConv1d { dims: (batch, seq, channels, width), x_stride, .. } = *conv;
    ensure!(CONV_WIDTHS.contains(&width), "{op}: 1 ≤ width ≤ 8");
    let rows = batch * seq;
    need(op, "dx", dx, strided_span(rows, x_stride, channels))?;
    need(op, "dout", dout, rows * channels)?;
    need(op, "dweight", dweight, channels * width)?;
    need_opt(op, "dbias", dbias.as_deref(), channels)?;
    need(op, "scratch", scratch, conv1d_bwd_scratch_len(batch, seq, channels, width))?;
    let tail = conv.args(gpu, op)?;
    if rows * channels == 0 {
        return Ok(());
    }
    let (pdx, pdy, px) = (ptr_mut(gpu, dx), ptr(gpu, dout), ptr(gpu, conv.x));
    let vec = conv_vec::<T>(2, &[pdx, pdy, px], x_stride, channels);
    let part = ptr(gpu, scratch);
    let mut args = Vec::from(args![gpu; pdx, part, pdy]);
    args.extend(tail);
    let grid = conv_grid(op, (batch, seq, channels), if vec { 2 } else { 1 }, CONV_BWD_BLOCK_ROWS)?;
    launch3(gpu, &conv_kernel::<T>("ssd_conv1d_bwd", vec, width), grid, 0, &args)?;
    let parts = batch * grid.1;
    let stride = (channels * width + channels) as i64;
    let args = args![gpu; dweight, part, int(op, parts)?, int(op, channels * width)?, stride];
    launch(gpu, "ssd_colsum_acc_f32", (channels * width).div_ceil(256), 0, &args)?;
    if let Some(db) = dbias {
        let args = args![gpu; db, part + 4 * (channels * width) as u64, int(op, parts)?, int(op, channels)?, stride];
        launch(gpu, "ssd_colsum_acc_f32", channels.div_ceil(256), 0, &args)?;
    }
    Ok(())
}

/// The widest row of [`rms_norm_gated_bwd`]: 8 rows of dw partial sums in 227 KiB of shared memory.
pub const RMS_BWD_MAX_DIM: usize = 227 * 1024 / 32;

/// Rows per block of the gated RMSNorm's backward (each of its 8 warps takes 4): enough blocks
/// to fill the GPU at B·T = 32768 (1024), few enough partial sums to add.
const NORM_ROWS_PER_PART: usize = 32;

/// Floats of the scratch of [`rms_norm_gated_bwd`]: ⌈rows / 32⌉ · dim.
pub fn rms_norm_gated_bwd_scratch_len(rows: usize, dim: usize) -> usize {
    rows.div_ceil(NORM_ROWS_PER_PART).max(1) * dim
}

/// The gated RMSNorm backward's outputs: dx [rows, dim], dz (z's layout) and the weight's
/// gradient dw [dim].
pub struct GatedNormGrads<'a, T> {
    pub dx: &'a mut CudaSlice<T>,
    pub dz: &'a mut CudaSlice<T>,
    pub dw: &'a mut CudaSlice<f32>,
}

/// Gated RMSNorm backward, as [`crate::rms_norm_gated::rms_norm_gated_bwd`], from dy [rows, dim]
/// and the forward's rstd: dx [rows, dim] overwritten, dz (z's layout, `dim` columns of each row
/// overwritten), dw [dim] accumulated through per-32-row partial sums added in order
/// (deterministic).
pub fn rms_norm_gated_bwd<T: Elem>(
    gpu: &Gpu,
    grads: GatedNormGrads<'_, T>,
    scratch: &mut CudaSlice<f32>,
    dy: &CudaSlice<T>,
    rstd: &CudaSlice<f32>,
    norm: GatedNorm<'_, T>,
) -> Result<()> {
    let op = "rms_norm_gated_bwd";
    let GatedNormGrads { dx, dz, dw } = grads;
    let GatedNorm { x, z, z_stride, w, rows, dim } = norm;
    ensure!(dim > 0 && z_stride >= dim, "{op}: dim > 0 and z_stride ≥ dim");
    // Each of a block's 8 warps keeps its share of dw in shared memory.
    ensure!(dim <= RMS_BWD_MAX_DIM, "{op}: dim {dim} is above {RMS_BWD_MAX_DIM}");
    let zspan = norm.z_span();
    need(op, "x", x, rows * dim)?;
    need(op, "dx", dx, rows * dim)?;
    need(op, "dy", dy, rows * dim)?;
    need(op, "z", z, zspan)?;
    need(op, "dz", dz, zspan)?;
    need(op, "w", w, dim)?;
    need(op, "dw", dw, dim)?;
    need(op, "rstd", rstd, rows)?;
    need(op, "scratch", scratch, rms_norm_gated_bwd_scratch_len(rows, dim))?;
    if rows == 0 {
        return Ok(());
    }
    int(op, zspan)?;
    let parts = rows.div_ceil(NORM_ROWS_PER_PART);
    let part = ptr(gpu, scratch);
    let args = args![
        gpu;
        dx, dz, part, dy, x, z, z_stride as i64, rstd, w, int(op, dim)?, int(op, rows)?,
        NORM_ROWS_PER_PART as i32,
        norm_vec::<T>(&[ptr(gpu, dx), ptr(gpu, dz), ptr(gpu, dy), ptr(gpu, x), ptr(gpu, z)], z_stride, dim) as i32,
    ];
    launch(gpu, &kname::<T>("ssd_rms_norm_gated_bwd"), parts, 8 * 4 * dim, &args)?;
    let args = args![gpu; dw, part, int(op, parts)?, int(op, dim)?, dim as i64];
    launch(gpu, "ssd_colsum_acc_f32", dim.div_ceil(256), 0, &args)
}

/// Gradients of the device SSD's inputs, as [`crate::ssd::SsdGrads`]: dxbc (layout of xbc; the x,
/// B and C columns overwritten), ddt [B, T, H] overwritten, da and dd [H] accumulated, dinit
/// [B, H, P, N] overwritten when wanted.
pub struct DevSsdGrads<'a, T: Elem = f32> {
    pub dxbc: &'a mut CudaSlice<T>,
    pub ddt: &'a mut CudaSlice<f32>,
    pub da: &'a mut CudaSlice<f32>,
    pub dd: &'a mut CudaSlice<f32>,
    pub dinit: Option<&'a mut CudaSlice<f32>>,
}

impl<T: Elem> DevSsdGrads<'_, T> {
    /// The gradients hold what problem `p` needs (both backwards' check).
    pub(super) fn check(&self, op: &str, p: &DevSsd<T>) -> Result<()> {
        let (b, t, h) = (p.batch, p.seq, p.heads);
        let width = h * p.head_dim + 2 * p.groups * p.state;
        need(op, "dxbc", self.dxbc, if b * t == 0 { 0 } else { (b * t - 1) * p.xbc_stride + width })?;
        need(op, "ddt", self.ddt, b * t * h)?;
        need(op, "da", self.da, h)?;
        need(op, "dd", self.dd, h)?;
        need_opt(op, "dinit", self.dinit.as_deref(), p.states())
    }
}

/// Floats of the scratch of [`ssd_bwd`]: the forward's ([`ssd_fwd_scratch_len`]), then the
/// state gradients (B·H·nch·P·N), per-head dB and dC (2·B·H·T·N) and per-chunk dA, dD shares
/// (2·B·H·nch). At B = 2, T = 16384, H = 24, P = 64, N = 128: 1.0 GB.
pub fn ssd_bwd_scratch_len(
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
    state: usize,
    groups: usize,
) -> usize {
    let nch = seq.div_ceil(L);
    ssd_fwd_scratch_len(batch, seq, heads, head_dim, state, groups)
        + batch * heads * (nch * head_dim * state + 2 * seq * state + 2 * nch)
}

/// The chunked SSD backward, as [`crate::ssd::ssd_bwd`]: dy [B, T, H·P] (its padded rows
/// ignored); `init` as given to the forward; `dfinal` [B, H, P, N] or none (0). Recomputes the
/// forward's chunk states, then four kernels (see kernels/ssd.cu); no atomics.
pub fn ssd_bwd<T: Elem>(
    gpu: &Gpu,
    p: &DevSsd<T>,
    dy: &CudaSlice<T>,
    init: Option<&CudaSlice<f32>>,
    dfinal: Option<&CudaSlice<f32>>,
    g: DevSsdGrads<T>,
    scratch: &mut CudaSlice<f32>,
) -> Result<()> {
    if uses_tensor_cores(p) {
        return super::ssd_tc::ssd_bwd(gpu, p, dy, init, dfinal, g, scratch);
    }
    let op = "ssd_bwd";
    p.check(op)?;
    let (b, t, h, pd, n, gr) = (p.batch, p.seq, p.heads, p.head_dim, p.state, p.groups);
    need(op, "dy", dy, b * t * h * pd)?;
    need_opt(op, "dfinal", dfinal, p.states())?;
    g.check(op, p)?;
    need(op, "scratch", scratch, ssd_bwd_scratch_len(b, t, h, pd, n, gr))?;
    if b * t == 0 {
        return Ok(());
    }
    // The forward's C Bᵀ, chunk states (S_c entering each chunk) and decays.
    ssd_fwd_steps(gpu, p, None, init, None, scratch, &[0, 1, 2])?;
    let nch = t.div_ceil(L);
    int(op, b * h * t * n)?;
    let base = ptr(gpu, scratch);
    let cb = base;
    let states = cb + 4 * (b * gr * nch * L * L) as u64;
    let decay = states + 4 * (b * h * nch * pd * n) as u64;
    let gbuf = base + 4 * ssd_fwd_scratch_len(b, t, h, pd, n, gr) as u64;
    let dbh = gbuf + 4 * (b * h * nch * pd * n) as u64;
    let dch = dbh + 4 * (b * h * t * n) as u64;
    let dapart = dch + 4 * (b * h * t * n) as u64;
    let ddpart = dapart + 4 * (b * h * nch) as u64;
    let dims = |v: &mut Vec<Arg>| -> Result<()> {
        for x in [b, t, h, pd, n, gr, nch] {
            v.push(Arg::I(int(op, x)?));
        }
        Ok(())
    };
    let (xbc, stride) = (ptr(gpu, p.xbc), p.xbc_stride as i64);
    let (dt, a, start, dyp) = (ptr(gpu, p.dt), ptr(gpu, p.a), opt_ptr(gpu, p.start), ptr(gpu, dy));
    let mut args = Vec::from(args![gpu; gbuf, dyp, xbc, stride, dt, a, start]);
    dims(&mut args)?;
    launch(gpu, &kname::<T>("ssd_chunk_dstate"), b * h * nch, 4 * (L * PMAX + L * NMAX + 2 * L), &args)?;
    let args = args![gpu; gbuf, g.dinit, dfinal, decay, int(op, b * h)?, int(op, pd * n)?, int(op, nch)?];
    launch(gpu, "ssd_state_pass_rev_f32", (b * h * pd * n).div_ceil(256), 0, &args)?;
    let dxp = ptr(gpu, g.dxbc);
    let mut args = Vec::from(args![
        gpu;
        dxp, dbh, dch, g.ddt, dapart, ddpart, dyp, xbc, stride, dt, a, p.d, start, cb, states, gbuf,
    ]);
    dims(&mut args)?;
    let smem = 4 * (2 * L * XROW + 2 * L * NMAX + 2 * PMAX * SROW + 2 * L * (L + 1) + 5 * L + 256);
    launch(gpu, &kname::<T>("ssd_chunk_bwd"), b * h * nch, smem, &args)?;
    let args = args![
        gpu;
        dxp, stride, dbh, dch, int(op, b)?, int(op, t)?, int(op, h)?, int(op, pd)?, int(op, n)?, int(op, gr)?,
    ];
    launch(gpu, &kname::<T>("ssd_bc_reduce"), (b * t * gr * n).div_ceil(256), 0, &args)?;
    let args = args![gpu; g.da, g.dd, dapart, ddpart, int(op, b)?, int(op, h)?, int(op, nch)?];
    launch(gpu, "ssd_head_reduce_f32", h.div_ceil(256), 0, &args)
}

/// The instantiation of a dt kernel whose f32 operand (`dt` of the forward, `ddt` of the
/// backward) is O: f32 (Mamba-2's dt), or T itself (Mamba's δ, in the activation type).
fn dt_kernel<T: Elem, O: Elem>(base: &str) -> Result<String> {
    match O::NAME {
        "f32" => Ok(kname::<T>(base)),
        o if o == T::NAME => Ok(kname::<T>(&format!("{base}_act"))),
        o => Err(anyhow!("{base}: dt in {o} with activations in {}", T::NAME)),
    }
}

/// dt [rows, H] = softplus(raw + bias), as [`crate::ssd::dt_fwd`]: raw rows of stride `stride`
/// (the dt columns of in_proj's output); dt in f32 or in the activation type T.
pub fn dt_fwd<T: Elem, O: Elem>(
    gpu: &Gpu,
    dt: &mut CudaSlice<O>,
    raw: &impl DevicePtr<T>,
    stride: usize,
    bias: &CudaSlice<f32>,
    rows: usize,
) -> Result<()> {
    let op = "dt_fwd";
    let h = bias.len();
    ensure!(h > 0 && stride >= h, "{op}: stride {stride} < H = {h}");
    need(op, "dt", dt, rows * h)?;
    need(op, "raw", raw, strided_span(rows, stride, h))?;
    if rows == 0 {
        return Ok(());
    }
    int(op, rows * stride)?;
    let args = args![gpu; dt, ptr(gpu, raw), stride as i64, bias, int(op, rows)?, int(op, h)?];
    launch(gpu, &dt_kernel::<T, O>("ssd_dt_fwd")?, (rows * h).div_ceil(256), 0, &args)
}

/// Floats of the scratch of [`dt_bwd`]: ⌈rows / 256⌉ · H.
pub fn dt_bwd_scratch_len(rows: usize, heads: usize) -> usize {
    rows.div_ceil(ROWS_PER_PART).max(1) * heads
}

/// Backward of [`dt_fwd`], as [`crate::ssd::dt_bwd`]: draw's H columns (rows of stride `stride`)
/// overwritten, dbias [H] accumulated through per-256-row partial sums added in order.
#[allow(clippy::too_many_arguments)]
pub fn dt_bwd<T: Elem, O: Elem>(
    gpu: &Gpu,
    draw: &mut impl DevicePtrMut<T>,
    dbias: &mut CudaSlice<f32>,
    scratch: &mut CudaSlice<f32>,
    ddt: &CudaSlice<O>,
    raw: &impl DevicePtr<T>,
    stride: usize,
    bias: &CudaSlice<f32>,
    rows: usize,
) -> Result<()> {
    let op = "dt_bwd";
    let h = bias.len();
    ensure!(h > 0 && stride >= h, "{op}: stride {stride} < H = {h}");
    let span = strided_span(rows, stride, h);
    need(op, "ddt", ddt, rows * h)?;
    need(op, "raw", raw, span)?;
    need(op, "draw", draw, span)?;
    need(op, "dbias", dbias, h)?;
    need(op, "scratch", scratch, dt_bwd_scratch_len(rows, h))?;
    if rows == 0 {
        return Ok(());
    }
    int(op, rows * stride)?;
    let parts = rows.div_ceil(ROWS_PER_PART);
    let part = ptr(gpu, scratch);
    let args = args![
        gpu;
        ptr_mut(gpu, draw), part, ddt, ptr(gpu, raw), stride as i64, bias, int(op, rows)?, int(op, h)?,
        ROWS_PER_PART as i32,
    ];
    launch3(gpu, &dt_kernel::<T, O>("ssd_dt_bwd")?, (h.div_ceil(256), parts, 1), 0, &args)?;
    let args = args![gpu; dbias, part, int(op, parts)?, int(op, h)?, h as i64];
    launch(gpu, "ssd_colsum_acc_f32", h.div_ceil(256), 0, &args)
}

/// a [H] = −exp(a_log) (Mamba-2's A from its parameter A_log).
pub fn neg_exp(gpu: &Gpu, a: &mut CudaSlice<f32>, a_log: &CudaSlice<f32>) -> Result<()> {
    let h = a_log.len();
    need("neg_exp", "a", a, h)?;
    if h == 0 {
        return Ok(());
    }
    let args = args![gpu; a, a_log, int("neg_exp", h)?];
    launch(gpu, "ssd_neg_exp_f32", h.div_ceil(256), 0, &args)
}

/// dst[i] += x[i] · y[i] for i < n (dA_log = dA · A).
pub fn mul_acc(gpu: &Gpu, dst: &mut CudaSlice<f32>, x: &CudaSlice<f32>, y: &CudaSlice<f32>, n: usize) -> Result<()> {
    need_lens("mul_acc", n, &[("x", x.len()), ("y", y.len()), ("dst", dst.len())])?;
    if n == 0 {
        return Ok(());
    }
    let args = args![gpu; dst, x, y, int("mul_acc", n)?];
    launch(gpu, "ssd_mul_acc_f32", n.div_ceil(256), 0, &args)
}

/// dst[r, 0..cols) = src[r, 0..cols) for r < rows, rows of strides `dst_stride` and
/// `src_stride`: a block of columns out of, or into, a wider matrix.
pub fn copy_cols<T: Elem>(
    gpu: &Gpu,
    dst: &mut impl DevicePtrMut<T>,
    dst_stride: usize,
    src: &impl DevicePtr<T>,
    src_stride: usize,
    (rows, cols): (usize, usize),
) -> Result<()> {
    let op = "copy_cols";
    ensure!(cols <= dst_stride && cols <= src_stride, "{op}: {cols} columns in rows of {dst_stride} and {src_stride}");
    need(op, "dst", dst, strided_span(rows, dst_stride, cols))?;
    need(op, "src", src, strided_span(rows, src_stride, cols))?;
    if rows * cols == 0 {
        return Ok(());
    }
    int(op, rows * dst_stride.max(src_stride))?;
    let args = args![
        gpu;
        ptr_mut(gpu, dst), dst_stride as i64, ptr(gpu, src), src_stride as i64, int(op, rows)?, int(op, cols)?,
    ];
    launch(gpu, &kname::<T>("ssd_copy_cols"), (rows * cols).div_ceil(256), 0, &args)
}
