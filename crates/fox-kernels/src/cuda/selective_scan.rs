//! Mamba's selective scan on the GPU (kernels/selective_scan.cu): forward, backward and decode
//! step, the CUDA twin of [`crate::selective_scan`] (its check rows and timing: fox-checks'
//! `selective_scan_check`).
//!
//! Layouts are the CPU op's: u, δ, z, out [B, T, Di] and B_t, C_t read through a
//! [`BcLayout`] (x_proj's output in place) in the activation type T (f32 or bf16); A [Di, N], D
//! [Di], states [B, Di, N], dA, dD in f32; the saved states [B, ceil(T/64), Di, N] f32 as
//! [`crate::selective_scan::saved_len`]. Everything is computed in f32. The GPU kernels take
//! N ≤ 16 (Samba's N is 16): one thread per (batch row, channel, state).
//!
//! The backward needs a caller-owned f32 scratch of [`scratch_floats`] (per block of 16 channels
//! the per-position sums of dB and dC, then per batch row dA and dD): the sums over channels and
//! batch rows are added in fixed orders by later kernels, so results are the same bits on every
//! run. At B = 2, T = 16384, Di = 1536 that is 400 MiB: B·T·Di·2 floats at N = 16.

use super::compile::SELECTIVE_SCAN;
use super::kargs::{self, by_value, kname, need, need_opt, ptr, Arg};
use super::{Elem, Gpu};
use crate::selective_scan::{self as cpu, BcLayout};
use anyhow::{ensure, Result};
use cudarc::driver::{CudaSlice, DeviceRepr};

/// Channels per thread block (16 threads each, one per state).
const CHANNELS_PER_BLOCK: usize = 16;
// The kernels save states every 64 positions, the CPU op's layout.
const _: () = assert!(cpu::CHUNK == 64);

/// The largest state size the kernels take.
pub const MAX_STATE: usize = 16;

/// One scan on the device; see [`crate::selective_scan::Scan`] for the meaning of each field.
pub struct DevScan<'a, T> {
    pub batch: usize,
    pub len: usize,
    pub channels: usize,
    pub state: usize,
    pub u: &'a CudaSlice<T>,
    pub delta: &'a CudaSlice<T>,
    pub a: &'a CudaSlice<f32>,
    pub bc: &'a CudaSlice<T>,
    pub bc_layout: BcLayout,
    pub d: &'a CudaSlice<f32>,
    pub z: Option<&'a CudaSlice<T>>,
    /// Where z's rows are in `z`: the first at element `z_offset`, then every `z_stride` (Di for
    /// a contiguous [B, T, Di]; 2·Di and offset Di for the gate half of Mamba's in_proj output).
    /// dz is written in the same layout.
    pub z_offset: usize,
    pub z_stride: usize,
    /// [B] first real position of each row (left padding), as i32.
    pub start: Option<&'a CudaSlice<i32>>,
}

/// Gradients, with [`crate::selective_scan::GradsMut`]'s rules: du, dδ, dz, dh0 and the B/C
/// places of dbc overwritten (dt's columns untouched), dA and dD added to.
pub struct DevGrads<'a, T> {
    pub du: &'a mut CudaSlice<T>,
    pub ddelta: &'a mut CudaSlice<T>,
    pub da: &'a mut CudaSlice<f32>,
    pub dbc: &'a mut CudaSlice<T>,
    pub dd: &'a mut CudaSlice<f32>,
    pub dz: Option<&'a mut CudaSlice<T>>,
    pub dh0: Option<&'a mut CudaSlice<f32>>,
}

/// The kernels' parameter block (ScanParams in kernels/selective_scan.cu, field for field).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Params {
    u: u64,
    delta: u64,
    a: u64,
    bc: u64,
    d: u64,
    z: u64,
    start: u64,
    h0: u64,
    out: u64,
    saved: u64,
    h_last: u64,
    dout: u64,
    du: u64,
    ddelta: u64,
    dz: u64,
    dbc: u64,
    dh0: u64,
    part_bc: u64,
    part_a: u64,
    part_d: u64,
    da: u64,
    dd: u64,
    sb: i64,
    st: i64,
    zs: i64,
    b_off: i32,
    c_off: i32,
    b: i32,
    t: i32,
    di: i32,
    n: i32,
}

// SAFETY: plain data of the kernel's C struct layout (8-byte fields, then 4-byte ones).
unsafe impl DeviceRepr for Params {}

/// The name the length checks' errors give.
const OP: &str = "selective scan";

/// Scratch (f32 elements) that [`backward`] needs for B rows of T positions and Di channels.
pub fn scratch_floats(batch: usize, len: usize, channels: usize, state: usize) -> usize {
    channels.div_ceil(CHANNELS_PER_BLOCK) * batch * len * 32 + batch * channels * (state + 1)
}

/// The end of z's last row (+1): what z and dz must hold.
fn z_end<T>(p: &DevScan<T>) -> usize {
    if p.batch * p.len == 0 {
        return 0;
    }
    p.z_offset + (p.batch * p.len - 1) * p.z_stride + p.channels
}

/// The end of the B/C layout's last row (+1): what bc and dbc must hold.
fn bc_end<T>(p: &DevScan<T>) -> usize {
    let l = &p.bc_layout;
    if p.batch * p.len == 0 {
        return 0;
    }
    (p.batch - 1) * l.sb + (p.len - 1) * l.st + l.b_off.max(l.c_off) + p.state
}

fn base<T: Elem>(gpu: &Gpu, p: &DevScan<T>) -> Result<Params> {
    let (b, t, di, n) = (p.batch, p.len, p.channels, p.state);
    ensure!((1..=MAX_STATE).contains(&n), "selective scan: the GPU kernels take 1 ≤ N ≤ {MAX_STATE}, not {n}");
    ensure!(b * t * di < i32::MAX as usize && b * t * 32 < i64::MAX as usize, "selective scan: too large");
    let l = &p.bc_layout;
    ensure!(l.b_off + n <= l.c_off || l.c_off + n <= l.b_off, "selective scan: B and C overlap");
    for (what, s) in [("u", p.u), ("delta", p.delta)] {
        need(OP, what, s, b * t * di)?;
    }
    ensure!(p.z_stride >= di, "selective scan: z_stride {} < Di = {di}", p.z_stride);
    need_opt(OP, "z", p.z, z_end(p))?;
    need(OP, "bc", p.bc, bc_end(p))?;
    need(OP, "A", p.a, di * n)?;
    need(OP, "D", p.d, di)?;
    need_opt(OP, "start", p.start, b)?;
    Ok(Params {
        u: ptr(gpu, p.u),
        delta: ptr(gpu, p.delta),
        a: ptr(gpu, p.a),
        bc: ptr(gpu, p.bc),
        d: ptr(gpu, p.d),
        z: p.z.map_or(0, |z| ptr(gpu, z) + (p.z_offset * std::mem::size_of::<T>()) as u64),
        start: p.start.map_or(0, |s| ptr(gpu, s)),
        sb: l.sb as i64,
        st: l.st as i64,
        zs: p.z_stride as i64,
        b_off: l.b_off as i32,
        c_off: l.c_off as i32,
        b: b as i32,
        t: t as i32,
        di: di as i32,
        n: n as i32,
        ..Default::default()
    })
}

/// Launches `name` with its ScanParams `prm` (every buffer checked by `base` and the callers
/// against the sizes the kernels index) and the int some kernels take after it.
fn launch(gpu: &Gpu, name: &str, grid: (u32, u32, u32), prm: &Params, extra: Option<i32>) -> Result<()> {
    let cfg = kargs::plain_config(grid, 256, 0);
    match extra {
        Some(x) => kargs::launch(gpu, &SELECTIVE_SCAN, name, cfg, &[by_value(prm), Arg::I(x)]),
        None => kargs::launch(gpu, &SELECTIVE_SCAN, name, cfg, &[by_value(prm)]),
    }
}

fn scan_grid<T>(p: &DevScan<T>) -> (u32, u32, u32) {
    (p.channels.div_ceil(CHANNELS_PER_BLOCK) as u32, p.batch as u32, 1)
}

/// Forward: `out` [B, T, Di], `saved` (the states for the backward), `h_last` [B, Di, N] if
/// given; `h0` [B, Di, N] the initial state (zeros if None).
pub fn forward<T: Elem>(
    gpu: &Gpu,
    p: &DevScan<T>,
    h0: Option<&CudaSlice<f32>>,
    out: &mut CudaSlice<T>,
    saved: &mut CudaSlice<f32>,
    h_last: Option<&mut CudaSlice<f32>>,
) -> Result<()> {
    let mut prm = base(gpu, p)?;
    let (b, t, di, n) = (p.batch, p.len, p.channels, p.state);
    need(OP, "out", out, b * t * di)?;
    need(OP, "saved", saved, b * cpu::chunks(t) * di * n)?;
    if let Some(h) = h0 {
        need(OP, "h0", h, b * di * n)?;
        prm.h0 = ptr(gpu, h);
    }
    if let Some(h) = &h_last {
        need(OP, "h_last", &**h, b * di * n)?;
        prm.h_last = ptr(gpu, *h);
    }
    if b * di == 0 {
        return Ok(());
    }
    prm.out = ptr(gpu, out);
    prm.saved = ptr(gpu, saved);
    launch(gpu, &kname::<T>("fox_scan_fwd"), scan_grid(p), &prm, None)
}

/// Backward from the forward's `saved` and the output gradient `dout` [B, T, Di]; `scratch`
/// holds at least [`scratch_floats`].
pub fn backward<T: Elem>(
    gpu: &Gpu,
    p: &DevScan<T>,
    saved: &CudaSlice<f32>,
    dout: &CudaSlice<T>,
    g: DevGrads<T>,
    scratch: &mut CudaSlice<f32>,
) -> Result<()> {
    let mut prm = base(gpu, p)?;
    let (b, t, di, n) = (p.batch, p.len, p.channels, p.state);
    need(OP, "saved", saved, b * cpu::chunks(t) * di * n)?;
    need(OP, "dout", dout, b * t * di)?;
    need(OP, "du", g.du, b * t * di)?;
    need(OP, "ddelta", g.ddelta, b * t * di)?;
    need(OP, "dA", g.da, di * n)?;
    need(OP, "dD", g.dd, di)?;
    need(OP, "dbc", g.dbc, bc_end(p))?;
    need(OP, "scratch", scratch, scratch_floats(b, t, di, n))?;
    ensure!(g.dz.is_some() == p.z.is_some(), "selective scan: dz is needed exactly when z is given");
    if let Some(dz) = &g.dz {
        need(OP, "dz", &**dz, z_end(p))?;
        prm.dz = ptr(gpu, *dz) + (p.z_offset * std::mem::size_of::<T>()) as u64;
    }
    if let Some(dh0) = &g.dh0 {
        need(OP, "dh0", &**dh0, b * di * n)?;
        prm.dh0 = ptr(gpu, *dh0);
    }
    if b * di == 0 {
        return Ok(());
    }
    let blocks = di.div_ceil(CHANNELS_PER_BLOCK);
    let sp = ptr(gpu, scratch);
    prm.saved = ptr(gpu, saved);
    prm.dout = ptr(gpu, dout);
    prm.du = ptr(gpu, g.du);
    prm.ddelta = ptr(gpu, g.ddelta);
    prm.dbc = ptr(gpu, g.dbc);
    prm.da = ptr(gpu, g.da);
    prm.dd = ptr(gpu, g.dd);
    prm.part_bc = sp;
    prm.part_a = sp + 4 * (blocks * b * t * 32) as u64;
    prm.part_d = prm.part_a + 4 * (b * di * n) as u64;
    launch(gpu, &kname::<T>("fox_scan_bwd"), scan_grid(p), &prm, None)?;
    if t > 0 {
        let cells = (b * t * 32).div_ceil(256) as u32;
        launch(gpu, &kname::<T>("fox_scan_bwd_bc"), (cells, 1, 1), &prm, Some(blocks as i32))?;
    }
    launch(gpu, "fox_scan_bwd_params", ((di * (n + 1)).div_ceil(256) as u32, 1, 1), &prm, None)
}

/// One token per batch row (`p.len` = 1: u, δ, z [B, Di]); the state `h` [B, Di, N] is updated
/// in place, `out` [B, Di]. A row with start[b] ≥ 1 is padding: state kept, output 0.
pub fn decode_step<T: Elem>(gpu: &Gpu, p: &DevScan<T>, h: &mut CudaSlice<f32>, out: &mut CudaSlice<T>) -> Result<()> {
    ensure!(p.len == 1, "selective scan: a decode step takes one position, not {}", p.len);
    let mut prm = base(gpu, p)?;
    need(OP, "state", h, p.batch * p.channels * p.state)?;
    need(OP, "out", out, p.batch * p.channels)?;
    if p.batch * p.channels == 0 {
        return Ok(());
    }
    prm.h_last = ptr(gpu, h);
    prm.out = ptr(gpu, out);
    launch(gpu, &kname::<T>("fox_scan_decode"), scan_grid(p), &prm, None)
}
