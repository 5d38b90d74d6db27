//! Mamba-2's ops on the GPU (kernels/ssd.cu), f32 in and out with f32 state and accumulation: the
//! twins of [`crate::ssd`], [`crate::conv1d`] and [`crate::rms_norm_gated`], with the same
//! layouts (see those modules). Each function launches on `gpu.stream()` without waiting and
//! returns an error (never panics) when a buffer is shorter than the shapes say. Deterministic:
//! no atomics, fixed-order sums.
//!
//! The SSD forward runs in four kernels over a scratch buffer ([`ssd_fwd_scratch_len`] floats):
//! C Bᵀ per (batch row, group, chunk of 64), each chunk's own state, the state passing over
//! chunks (the one sequential step, one thread per state element), the chunk outputs. Limits of
//! this first version: P ≤ 64, N ≤ 128; no backward on the GPU yet.

use super::compile::SSD;
use super::Gpu;
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig, PushKernelArg};

/// Chunk length of the GPU forward (as [`crate::ssd::CHUNK`]).
const L: usize = 64;
/// Largest head dim P of the forward's shared tiles.
const PMAX: usize = 64;
const NMAX: usize = 128;
const SROW: usize = 129;

enum Arg {
    P(u64),
    I(i32),
    L(i64),
    F(f32),
}

fn ptr<T>(gpu: &Gpu, s: &CudaSlice<T>) -> u64 {
    let (p, _g) = s.device_ptr(gpu.stream());
    p
}

fn opt_ptr<T>(gpu: &Gpu, s: Option<&CudaSlice<T>>) -> u64 {
    s.map_or(0, |s| ptr(gpu, s))
}

fn launch(gpu: &Gpu, name: &str, grid: usize, smem: usize, args: &[Arg]) -> Result<()> {
    ensure!(grid > 0 && grid <= i32::MAX as usize, "{name}: launch of {grid} blocks is out of range");
    let f = gpu.function(&SSD, name)?;
    if smem > 48 * 1024 {
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(|e| anyhow!("{name}: cannot raise shared memory to {smem} bytes: {e:?}"))?;
    }
    let mut b = gpu.stream().launch_builder(&f);
    for a in args {
        match a {
            Arg::P(v) => b.arg(v),
            Arg::I(v) => b.arg(v),
            Arg::L(v) => b.arg(v),
            Arg::F(v) => b.arg(v),
        };
    }
    let cfg = LaunchConfig { grid_dim: (grid as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: smem as u32 };
    // SAFETY: each caller passes the arguments of `name`'s signature in kernels/ssd.cu, in order,
    // with pointers into buffers whose lengths were checked against the launch's shapes.
    unsafe { b.launch(cfg) }.map_err(|e| anyhow!("launching `{name}`: {e:?}"))?;
    Ok(())
}

fn need<T>(op: &str, what: &str, s: &CudaSlice<T>, n: usize) -> Result<()> {
    ensure!(s.len() >= n, "{op}: `{what}` holds {} elements but the shapes need {n}", s.len());
    Ok(())
}

fn int(op: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| anyhow!("{op}: {v} does not fit the kernels' 32-bit sizes"))
}

/// One SSD problem on the device: as [`crate::ssd::Ssd`], with `start` as i32.
#[derive(Clone, Copy)]
pub struct DevSsd<'a> {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub state: usize,
    pub groups: usize,
    /// [B, T, xbc_stride]: x (H·P) | B (G·N) | C (G·N) per row.
    pub xbc: &'a CudaSlice<f32>,
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

impl DevSsd<'_> {
    fn check(&self, op: &str) -> Result<()> {
        let (b, t, h, p, n, g) = (self.batch, self.seq, self.heads, self.head_dim, self.state, self.groups);
        ensure!(g > 0 && h.is_multiple_of(g), "{op}: groups {g} must divide heads {h}");
        ensure!(p > 0 && n > 0, "{op}: head_dim and state must be positive");
        let width = h * p + 2 * g * n;
        ensure!(self.xbc_stride >= width, "{op}: xbc_stride {} < H·P + 2·G·N = {width}", self.xbc_stride);
        need(op, "xbc", self.xbc, if b * t == 0 { 0 } else { (b * t - 1) * self.xbc_stride + width })?;
        need(op, "dt", self.dt, b * t * h)?;
        need(op, "a", self.a, h)?;
        need(op, "d", self.d, h)?;
        if let Some(s) = self.start {
            need(op, "start", s, b)?;
        }
        int(op, b * t * self.xbc_stride)?;
        Ok(())
    }
    fn states(&self) -> usize {
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
pub fn ssd_fwd(
    gpu: &Gpu,
    p: &DevSsd,
    y: &mut CudaSlice<f32>,
    init: Option<&CudaSlice<f32>>,
    final_state: Option<&mut CudaSlice<f32>>,
    scratch: &mut CudaSlice<f32>,
) -> Result<()> {
    let op = "ssd_fwd";
    p.check(op)?;
    ensure!(p.head_dim <= PMAX, "{op}: head_dim {} is above {PMAX}", p.head_dim);
    ensure!(p.state <= NMAX, "{op}: state {} is above {NMAX}", p.state);
    need(op, "y", y, p.batch * p.seq * p.heads * p.head_dim)?;
    if let Some(i) = init {
        need(op, "init", i, p.states())?;
    }
    if let Some(f) = &final_state {
        need(op, "final_state", f, p.states())?;
    }
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
    let mut args = vec![Arg::P(cb), Arg::P(xbc), Arg::L(stride)];
    dims(&mut args)?;
    launch(gpu, "ssd_cb_f32", b * g * nch, 0, &args)?;
    let (dt, a, start) = (ptr(gpu, p.dt), ptr(gpu, p.a), opt_ptr(gpu, p.start));
    let mut args =
        vec![Arg::P(states), Arg::P(decay), Arg::P(xbc), Arg::L(stride), Arg::P(dt), Arg::P(a), Arg::P(start)];
    dims(&mut args)?;
    launch(gpu, "ssd_chunk_state_f32", b * h * nch, 4 * (L * PMAX + L * NMAX + 2 * L), &args)?;
    let args = [
        Arg::P(states),
        Arg::P(final_state.map_or(0, |f| ptr(gpu, f))),
        Arg::P(opt_ptr(gpu, init)),
        Arg::P(decay),
        Arg::I(int(op, b * h)?),
        Arg::I(int(op, pd * n)?),
        Arg::I(int(op, nch)?),
    ];
    launch(gpu, "ssd_state_pass_f32", (b * h * pd * n).div_ceil(256), 0, &args)?;
    let mut args = vec![
        Arg::P(ptr(gpu, y)),
        Arg::P(xbc),
        Arg::L(stride),
        Arg::P(dt),
        Arg::P(a),
        Arg::P(ptr(gpu, p.d)),
        Arg::P(start),
        Arg::P(cb),
        Arg::P(states),
    ];
    dims(&mut args)?;
    launch(gpu, "ssd_chunk_scan_f32", b * h * nch, 4 * (L * (L + 1) + L * PMAX + L * NMAX + PMAX * SROW + 2 * L), &args)
}

/// One decoding step, as [`crate::ssd::ssd_decode_step`]: `p.seq` = 1, state [B, H, P, N] in
/// place, y [B, H·P].
pub fn ssd_decode_step(gpu: &Gpu, p: &DevSsd, state: &mut CudaSlice<f32>, y: &mut CudaSlice<f32>) -> Result<()> {
    let op = "ssd_decode_step";
    p.check(op)?;
    ensure!(p.seq == 1, "{op}: one position per row, not {}", p.seq);
    need(op, "state", state, p.states())?;
    need(op, "y", y, p.batch * p.heads * p.head_dim)?;
    let args = [
        Arg::P(ptr(gpu, state)),
        Arg::P(ptr(gpu, y)),
        Arg::P(ptr(gpu, p.xbc)),
        Arg::L(p.xbc_stride as i64),
        Arg::P(ptr(gpu, p.dt)),
        Arg::P(ptr(gpu, p.a)),
        Arg::P(ptr(gpu, p.d)),
        Arg::P(opt_ptr(gpu, p.start)),
        Arg::I(int(op, p.heads)?),
        Arg::I(int(op, p.head_dim)?),
        Arg::I(int(op, p.state)?),
        Arg::I(int(op, p.groups)?),
    ];
    launch(gpu, "ssd_decode_f32", p.batch * p.heads, 0, &args)
}

/// Causal depthwise conv1d (+SiLU) forward, as [`crate::conv1d::conv1d_fwd`] without the new
/// state: out [B, T, C]; x rows of stride `x_stride`; weight [C, W]; bias [C], start [B], prev
/// [B, W − 1, C] optional.
#[allow(clippy::too_many_arguments)]
pub fn conv1d_fwd(
    gpu: &Gpu,
    out: &mut CudaSlice<f32>,
    x: &CudaSlice<f32>,
    x_stride: usize,
    weight: &CudaSlice<f32>,
    bias: Option<&CudaSlice<f32>>,
    start: Option<&CudaSlice<i32>>,
    prev: Option<&CudaSlice<f32>>,
    (batch, seq, channels, width): (usize, usize, usize, usize),
    silu: bool,
) -> Result<()> {
    let op = "conv1d_fwd";
    ensure!(width >= 1 && x_stride >= channels, "{op}: width ≥ 1 and x_stride ≥ channels");
    let rows = batch * seq;
    need(op, "x", x, if rows == 0 { 0 } else { (rows - 1) * x_stride + channels })?;
    need(op, "out", out, rows * channels)?;
    need(op, "weight", weight, channels * width)?;
    if let Some(b) = bias {
        need(op, "bias", b, channels)?;
    }
    if let Some(s) = start {
        need(op, "start", s, batch)?;
    }
    if let Some(pv) = prev {
        need(op, "prev", pv, batch * (width - 1) * channels)?;
    }
    if rows * channels == 0 {
        return Ok(());
    }
    let args = [
        Arg::P(ptr(gpu, out)),
        Arg::P(ptr(gpu, x)),
        Arg::L(x_stride as i64),
        Arg::P(ptr(gpu, weight)),
        Arg::P(opt_ptr(gpu, bias)),
        Arg::P(opt_ptr(gpu, start)),
        Arg::P(opt_ptr(gpu, prev)),
        Arg::I(int(op, batch)?),
        Arg::I(int(op, seq)?),
        Arg::I(int(op, channels)?),
        Arg::I(int(op, width)?),
        Arg::I(silu as i32),
    ];
    launch(gpu, "ssd_conv1d_fwd_f32", (rows * channels).div_ceil(256), 0, &args)
}

/// Gated RMSNorm forward, as [`crate::rms_norm_gated::rms_norm_gated_fwd`]: y, x [rows, dim],
/// z rows of stride `z_stride`, w [dim], rstd [rows].
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_gated_fwd(
    gpu: &Gpu,
    y: &mut CudaSlice<f32>,
    rstd: &mut CudaSlice<f32>,
    x: &CudaSlice<f32>,
    z: &CudaSlice<f32>,
    z_stride: usize,
    w: &CudaSlice<f32>,
    rows: usize,
    dim: usize,
    eps: f32,
) -> Result<()> {
    let op = "rms_norm_gated_fwd";
    ensure!(dim > 0 && z_stride >= dim, "{op}: dim > 0 and z_stride ≥ dim");
    need(op, "x", x, rows * dim)?;
    need(op, "y", y, rows * dim)?;
    need(op, "z", z, if rows == 0 { 0 } else { (rows - 1) * z_stride + dim })?;
    need(op, "w", w, dim)?;
    need(op, "rstd", rstd, rows)?;
    if rows == 0 {
        return Ok(());
    }
    let args = [
        Arg::P(ptr(gpu, y)),
        Arg::P(ptr(gpu, rstd)),
        Arg::P(ptr(gpu, x)),
        Arg::P(ptr(gpu, z)),
        Arg::L(z_stride as i64),
        Arg::P(ptr(gpu, w)),
        Arg::I(int(op, dim)?),
        Arg::F(eps),
    ];
    launch(gpu, "ssd_rms_norm_gated_fwd_f32", rows, 0, &args)
}
