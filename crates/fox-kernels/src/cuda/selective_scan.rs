//! Mamba's selective scan on the GPU (kernels/selective_scan.cu): forward, backward and decode
//! step, the CUDA twin of [`crate::selective_scan`], with its check rows and its timing.
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

use super::bench::time_ms;
use super::check::{rel_l2, CheckRow};
use super::compile::SELECTIVE_SCAN;
use super::kargs::ptr;
use super::{Elem, Gpu};
use crate::selective_scan::{self as cpu, BcLayout, Scan};
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

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

fn need<T>(what: &str, s: &CudaSlice<T>, n: usize) -> Result<()> {
    ensure!(s.len() >= n, "selective scan: `{what}` holds {} elements but the shapes need {n}", s.len());
    Ok(())
}

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
        need(what, s, b * t * di)?;
    }
    ensure!(p.z_stride >= di, "selective scan: z_stride {} < Di = {di}", p.z_stride);
    if let Some(z) = p.z {
        need("z", z, z_end(p))?;
    }
    need("bc", p.bc, bc_end(p))?;
    need("A", p.a, di * n)?;
    need("D", p.d, di)?;
    if let Some(s) = p.start {
        need("start", s, b)?;
    }
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

fn launch(gpu: &Gpu, name: &str, grid: (u32, u32, u32), prm: &Params, extra: Option<i32>) -> Result<()> {
    let f = gpu.function(&SELECTIVE_SCAN, name)?;
    let cfg = LaunchConfig { grid_dim: grid, block_dim: (256, 1, 1), shared_mem_bytes: 0 };
    let mut l = gpu.stream().launch_builder(&f);
    l.arg(prm);
    if let Some(x) = &extra {
        l.arg(x);
    }
    // SAFETY: the parameter block matches the kernel's ScanParams; `base` and the callers checked
    // every buffer against the sizes the kernels index.
    unsafe { l.launch(cfg) }.map_err(|e| anyhow!("launching {name}: {e:?}"))?;
    Ok(())
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
    need("out", out, b * t * di)?;
    need("saved", saved, b * cpu::chunks(t) * di * n)?;
    if let Some(h) = h0 {
        need("h0", h, b * di * n)?;
        prm.h0 = ptr(gpu, h);
    }
    if let Some(h) = &h_last {
        need("h_last", h, b * di * n)?;
        prm.h_last = ptr(gpu, *h);
    }
    if b * di == 0 {
        return Ok(());
    }
    prm.out = ptr(gpu, out);
    prm.saved = ptr(gpu, saved);
    launch(gpu, &format!("fox_scan_fwd_{}", T::NAME), scan_grid(p), &prm, None)
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
    need("saved", saved, b * cpu::chunks(t) * di * n)?;
    need("dout", dout, b * t * di)?;
    need("du", g.du, b * t * di)?;
    need("ddelta", g.ddelta, b * t * di)?;
    need("dA", g.da, di * n)?;
    need("dD", g.dd, di)?;
    need("dbc", g.dbc, bc_end(p))?;
    need("scratch", scratch, scratch_floats(b, t, di, n))?;
    ensure!(g.dz.is_some() == p.z.is_some(), "selective scan: dz is needed exactly when z is given");
    if let Some(dz) = &g.dz {
        need("dz", dz, z_end(p))?;
        prm.dz = ptr(gpu, *dz) + (p.z_offset * std::mem::size_of::<T>()) as u64;
    }
    if let Some(dh0) = &g.dh0 {
        need("dh0", dh0, b * di * n)?;
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
    launch(gpu, &format!("fox_scan_bwd_{}", T::NAME), scan_grid(p), &prm, None)?;
    if t > 0 {
        let cells = (b * t * 32).div_ceil(256) as u32;
        launch(gpu, &format!("fox_scan_bwd_bc_{}", T::NAME), (cells, 1, 1), &prm, Some(blocks as i32))?;
    }
    launch(gpu, "fox_scan_bwd_params", ((di * (n + 1)).div_ceil(256) as u32, 1, 1), &prm, None)
}

/// One token per batch row (`p.len` = 1: u, δ, z [B, Di]); the state `h` [B, Di, N] is updated
/// in place, `out` [B, Di]. A row with start[b] ≥ 1 is padding: state kept, output 0.
pub fn decode_step<T: Elem>(gpu: &Gpu, p: &DevScan<T>, h: &mut CudaSlice<f32>, out: &mut CudaSlice<T>) -> Result<()> {
    ensure!(p.len == 1, "selective scan: a decode step takes one position, not {}", p.len);
    let mut prm = base(gpu, p)?;
    need("state", h, p.batch * p.channels * p.state)?;
    need("out", out, p.batch * p.channels)?;
    if p.batch * p.channels == 0 {
        return Ok(());
    }
    prm.h_last = ptr(gpu, h);
    prm.out = ptr(gpu, out);
    launch(gpu, &format!("fox_scan_decode_{}", T::NAME), scan_grid(p), &prm, None)
}

// ------------------------------------------------------------------------------------------------
// The check: GPU against the CPU op on fresh random inputs.
//
// Inputs are drawn as in the CPU tests (δ = softplus(N(0,1) − 1), A = −exp(U(−1, 1.5)), so decays
// reach 2e-6 per step; u, B, C, D, h0 ~ N(0, 1), z ~ N(0, 4)), rounded to T, and the CPU op gets
// the rounded values: errors measure the kernels' arithmetic and the rounding of their outputs.
// Errors are relative L2 ‖gpu − cpu‖ / ‖cpu‖. Tolerances, and why:
// - f32 outputs and states: 1e-5. Both sides are f32 in the same order along time; the GPU's exp
//   is __expf (ex2.approx: 2 + 1.2·|x| ulp, ~1e-6 relative at δ·A = −13) against the CPU's
//   polynomial (2e-7), and y's sum over n runs in another order.
// - f32 gradients: 5e-5. As above, through the reverse recurrence, and dA, dB, dC, dD are sums
//   of up to B·T·Di terms added in another order (blocks of 16 channels, not 32).
// - bf16 outputs and activation gradients: 1e-2. They are rounded to bf16 (2^-9 relative per
//   element, ~2e-3 in L2); dA, dD and the states stay f32 from the same rounded inputs: 5e-5.
// - dt's columns of dbc: the number of elements changed, 0. Determinism: a second backward on
//   the same inputs, the number of elements with other bits, 0.

const TOL_F32: f64 = 1e-5;
const TOL_F32_GRAD: f64 = 5e-5;
const TOL_BF16: f64 = 1e-2;
const DT_RANK: usize = 5;
const SENTINEL: f32 = 7.25;

fn dl<T: Elem>(gpu: &Gpu, s: &CudaSlice<T>, n: usize) -> Result<Vec<f32>> {
    let mut v: Vec<f32> = gpu.download(s)?.iter().map(|x| x.to_f32()).collect();
    v.truncate(n);
    Ok(v)
}

/// Host inputs of one case, already rounded to T where they travel as T.
struct Inputs {
    b: usize,
    t: usize,
    di: usize,
    n: usize,
    u: Vec<f32>,
    delta: Vec<f32>,
    a: Vec<f32>,
    bc: Vec<f32>,
    d: Vec<f32>,
    z: Option<Vec<f32>>,
    start: Option<Vec<usize>>,
    h0: Option<Vec<f32>>,
    dout: Vec<f32>,
}

fn rounded<T: Elem>(x: Vec<f32>) -> Vec<f32> {
    x.into_iter().map(|v| T::from_f32(v).to_f32()).collect()
}

impl Inputs {
    #[allow(clippy::too_many_arguments)]
    fn draw<T: Elem>(
        rng: &mut ChaCha8Rng,
        b: usize,
        t: usize,
        di: usize,
        n: usize,
        gate: bool,
        start: Option<Vec<usize>>,
        h0: bool,
    ) -> Self {
        let mut randn =
            |k: usize, s: f32| -> Vec<f32> { (0..k).map(|_| s * rng.sample::<f32, _>(StandardNormal)).collect() };
        let m = b * t * di;
        let u = rounded::<T>(randn(m, 1.0));
        let delta = rounded::<T>(randn(m, 1.0).iter().map(|x| (x - 1.0f32).exp().ln_1p()).collect());
        let bc = rounded::<T>(randn(b * t * (DT_RANK + 2 * n), 1.0));
        let d = randn(di, 1.0);
        let z = gate.then(|| rounded::<T>(randn(m, 2.0)));
        let h0 = h0.then(|| randn(b * di * n, 1.0));
        let dout = rounded::<T>(randn(m, 1.0));
        let a = (0..di * n).map(|_| -rng.gen_range(-1.0f32..1.5).exp()).collect();
        Inputs { b, t, di, n, u, delta, a, bc, d, z, start, h0, dout }
    }
    fn scan(&self) -> Scan<'_> {
        Scan {
            batch: self.b,
            len: self.t,
            channels: self.di,
            state: self.n,
            u: &self.u,
            delta: &self.delta,
            a: &self.a,
            bc: &self.bc,
            bc_layout: BcLayout::x_proj(self.t, DT_RANK, self.n),
            d: &self.d,
            z: self.z.as_deref(),
            start: self.start.as_deref(),
        }
    }
}

fn up<T: Elem>(gpu: &Gpu, x: &[f32]) -> Result<CudaSlice<T>> {
    let v: Vec<T> = x.iter().map(|v| T::from_f32(*v)).collect();
    gpu.upload(&v)
}

/// Device copies of a case's inputs.
struct DevInputs<T> {
    u: CudaSlice<T>,
    delta: CudaSlice<T>,
    a: CudaSlice<f32>,
    bc: CudaSlice<T>,
    d: CudaSlice<f32>,
    z: Option<CudaSlice<T>>,
    start: Option<CudaSlice<i32>>,
}

impl<T: Elem> DevInputs<T> {
    fn new(gpu: &Gpu, c: &Inputs) -> Result<Self> {
        Ok(DevInputs {
            u: up(gpu, &c.u)?,
            delta: up(gpu, &c.delta)?,
            a: gpu.upload(&c.a)?,
            bc: up(gpu, &c.bc)?,
            d: gpu.upload(&c.d)?,
            z: c.z.as_ref().map(|z| up(gpu, z)).transpose()?,
            start: c
                .start
                .as_ref()
                .map(|s| gpu.upload(&s.iter().map(|&v| v as i32).collect::<Vec<_>>()))
                .transpose()?,
        })
    }
    fn scan<'a>(&'a self, c: &Inputs) -> DevScan<'a, T> {
        DevScan {
            batch: c.b,
            len: c.t,
            channels: c.di,
            state: c.n,
            u: &self.u,
            delta: &self.delta,
            a: &self.a,
            bc: &self.bc,
            bc_layout: BcLayout::x_proj(c.t, DT_RANK, c.n),
            d: &self.d,
            z: self.z.as_ref(),
            z_offset: 0,
            z_stride: c.di,
            start: self.start.as_ref(),
        }
    }
}

/// Forward and backward of one case on both devices; rows for every output.
fn fwd_bwd_case<T: Elem>(gpu: &Gpu, name: &str, c: &Inputs, rows: &mut Vec<CheckRow>) -> Result<()> {
    let bf16 = T::NAME == "bf16";
    let tol_t = if bf16 { TOL_BF16 } else { TOL_F32 };
    let tol_tg = if bf16 { TOL_BF16 } else { TOL_F32_GRAD };
    let note_t = if bf16 { "output rounded to bf16" } else { "" };
    let p = c.scan();
    let (m, hs) = (c.b * c.t * c.di, c.b * c.di * c.n);
    // CPU
    let mut out = vec![0.0f32; m];
    let mut saved = vec![0.0f32; cpu::saved_len(&p)];
    let mut h_last = vec![0.0f32; hs];
    cpu::forward(&p, c.h0.as_deref(), &mut out, &mut saved, Some(&mut h_last));
    let (mut du, mut ddelta, mut dz) = (vec![0.0f32; m], vec![0.0f32; m], vec![0.0f32; m]);
    let (mut da, mut dd, mut dh0) = (vec![0.25f32; c.di * c.n], vec![0.25f32; c.di], vec![0.0f32; hs]);
    let mut dbc = vec![SENTINEL; c.bc.len()];
    cpu::backward(
        &p,
        &saved,
        &c.dout,
        cpu::GradsMut {
            du: &mut du,
            ddelta: &mut ddelta,
            da: &mut da,
            dbc: &mut dbc,
            dd: &mut dd,
            dz: c.z.as_ref().map(|_| &mut dz[..]),
            dh0: Some(&mut dh0),
        },
    );
    // GPU
    let x = DevInputs::<T>::new(gpu, c)?;
    let dp = x.scan(c);
    let h0 = c.h0.as_ref().map(|h| gpu.upload(h)).transpose()?;
    let mut g_out = gpu.zeros::<T>(m)?;
    let mut g_saved = gpu.zeros::<f32>(saved.len())?;
    let mut g_hl = gpu.zeros::<f32>(hs)?;
    forward(gpu, &dp, h0.as_ref(), &mut g_out, &mut g_saved, Some(&mut g_hl))?;
    let g_dout = up::<T>(gpu, &c.dout)?;
    let mut scratch = gpu.zeros::<f32>(scratch_floats(c.b, c.t, c.di, c.n))?;
    let grads = |scratch: &mut CudaSlice<f32>| -> Result<Vec<Vec<f32>>> {
        let (mut gdu, mut gdd, mut gdz) = (gpu.zeros::<T>(m)?, gpu.zeros::<T>(m)?, gpu.zeros::<T>(m)?);
        let mut gda = gpu.upload(&vec![0.25f32; c.di * c.n])?;
        let mut gdskip = gpu.upload(&vec![0.25f32; c.di])?;
        let mut gdh0 = gpu.zeros::<f32>(hs)?;
        let mut gdbc = up::<T>(gpu, &vec![SENTINEL; c.bc.len()])?;
        backward(
            gpu,
            &dp,
            &g_saved,
            &g_dout,
            DevGrads {
                du: &mut gdu,
                ddelta: &mut gdd,
                da: &mut gda,
                dbc: &mut gdbc,
                dd: &mut gdskip,
                dz: if c.z.is_some() { Some(&mut gdz) } else { None },
                dh0: Some(&mut gdh0),
            },
            scratch,
        )?;
        Ok(vec![
            dl(gpu, &gdu, m)?,
            dl(gpu, &gdd, m)?,
            dl(gpu, &gdz, m)?,
            dl(gpu, &gdbc, c.bc.len())?,
            dl(gpu, &gda, c.di * c.n)?,
            dl(gpu, &gdskip, c.di)?,
            dl(gpu, &gdh0, hs)?,
        ])
    };
    let got = grads(&mut scratch)?;
    rows.push(CheckRow::new(name, "out", rel_l2(&dl(gpu, &g_out, m)?, &out), tol_t, note_t));
    rows.push(CheckRow::new(name, "final state", rel_l2(&dl(gpu, &g_hl, hs)?, &h_last), TOL_F32, ""));
    rows.push(CheckRow::new(name, "saved states", rel_l2(&dl(gpu, &g_saved, saved.len())?, &saved), TOL_F32, ""));
    rows.push(CheckRow::new(name, "du", rel_l2(&got[0], &du), tol_tg, note_t));
    rows.push(CheckRow::new(name, "ddelta", rel_l2(&got[1], &ddelta), tol_tg, note_t));
    if c.z.is_some() {
        rows.push(CheckRow::new(name, "dz", rel_l2(&got[2], &dz), tol_tg, note_t));
    }
    // dB and dC in their places; the dt columns on their own.
    let st = DT_RANK + 2 * c.n;
    let pick = |v: &[f32], dt: bool| -> Vec<f32> {
        v.iter().enumerate().filter(|(i, _)| (i % st < DT_RANK) == dt).map(|(_, x)| *x).collect()
    };
    rows.push(CheckRow::new(name, "dB, dC", rel_l2(&pick(&got[3], false), &pick(&dbc, false)), tol_tg, note_t));
    let changed = pick(&got[3], true).iter().filter(|&&v| v != SENTINEL).count();
    rows.push(CheckRow::new(name, "dt columns of dbc changed", changed as f64, 0.0, "elements"));
    let less = |v: &[f32]| -> Vec<f32> { v.iter().map(|x| x - 0.25).collect() };
    rows.push(CheckRow::new(name, "dA (added to)", rel_l2(&less(&got[4]), &less(&da)), TOL_F32_GRAD, ""));
    rows.push(CheckRow::new(name, "dD (added to)", rel_l2(&less(&got[5]), &less(&dd)), TOL_F32_GRAD, ""));
    rows.push(CheckRow::new(name, "dh0", rel_l2(&got[6], &dh0), TOL_F32_GRAD, ""));
    let again = grads(&mut scratch)?;
    let diff: usize =
        got.iter().zip(&again).map(|(a, b)| a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count()).sum();
    rows.push(CheckRow::new(name, "backward twice: bits differing", diff as f64, 0.0, "elements"));
    Ok(())
}

/// `steps` decode steps from h0 on both devices, each step's output and the final state.
fn decode_case<T: Elem>(gpu: &Gpu, name: &str, c: &Inputs, rows: &mut Vec<CheckRow>) -> Result<()> {
    let bf16 = T::NAME == "bf16";
    let (b, di, n) = (c.b, c.di, c.n);
    let mut h = c.h0.clone().unwrap_or_else(|| vec![0.0; b * di * n]);
    let mut gh = gpu.upload(&h)?;
    let a = gpu.upload(&c.a)?;
    let dsk = gpu.upload(&c.d)?;
    let st = DT_RANK + 2 * n;
    let (mut worst, mut cpu_all, mut gpu_all) = (0.0f64, Vec::new(), Vec::new());
    for t in 0..c.t {
        let at = |v: &[f32], w: usize| -> Vec<f32> {
            (0..b).flat_map(|bi| v[(bi * c.t + t) * w..(bi * c.t + t + 1) * w].to_vec()).collect()
        };
        let (u, delta, bc) = (at(&c.u, di), at(&c.delta, di), at(&c.bc, st));
        let z = c.z.as_ref().map(|z| at(z, di));
        let p = Scan {
            batch: b,
            len: 1,
            channels: di,
            state: n,
            u: &u,
            delta: &delta,
            a: &c.a,
            bc: &bc,
            bc_layout: BcLayout::x_proj(1, DT_RANK, n),
            d: &c.d,
            z: z.as_deref(),
            start: None,
        };
        let mut o = vec![0.0f32; b * di];
        cpu::decode_step(&p, &mut h, &mut o);
        let (gu, gdl, gbc) = (up::<T>(gpu, &u)?, up::<T>(gpu, &delta)?, up::<T>(gpu, &bc)?);
        let gz = z.as_ref().map(|z| up::<T>(gpu, z)).transpose()?;
        let dp = DevScan {
            batch: b,
            len: 1,
            channels: di,
            state: n,
            u: &gu,
            delta: &gdl,
            a: &a,
            bc: &gbc,
            bc_layout: BcLayout::x_proj(1, DT_RANK, n),
            d: &dsk,
            z: gz.as_ref(),
            z_offset: 0,
            z_stride: di,
            start: None,
        };
        let mut go = gpu.zeros::<T>(b * di)?;
        decode_step(gpu, &dp, &mut gh, &mut go)?;
        let got = dl(gpu, &go, b * di)?;
        worst = worst.max(rel_l2(&got, &o));
        cpu_all.extend(o);
        gpu_all.extend(got);
    }
    let (tol, note) = if bf16 { (TOL_BF16, "output rounded to bf16") } else { (TOL_F32, "") };
    rows.push(CheckRow::new(name, "outputs, all steps", rel_l2(&gpu_all, &cpu_all), tol, note));
    rows.push(CheckRow::new(name, "outputs, worst step", worst, tol, note));
    rows.push(CheckRow::new(name, "state after the steps", rel_l2(&dl(gpu, &gh, b * di * n)?, &h), TOL_F32, ""));
    Ok(())
}

/// Every check row of the selective scan, with fresh inputs from `seed`.
pub fn check(gpu: &Gpu, seed: u64) -> Vec<CheckRow> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rows = Vec::new();
    let run = |name: String, rows: &mut Vec<CheckRow>, f: &mut dyn FnMut(&mut Vec<CheckRow>) -> Result<()>| {
        if let Err(e) = f(rows) {
            rows.push(CheckRow::failed(name, &e));
        }
    };
    macro_rules! typed {
        ($t:ty) => {{
            let tn = <$t as Elem>::NAME;
            for (b, t, di, n, gate, start, h0) in [
                (2, 300, 40, 16, true, Some(vec![0usize, 70]), true),
                (1, 50, 32, 5, false, None, false),
                (3, 200, 48, 16, true, Some(vec![3, 0, 64]), false),
                (1, 4096, 256, 16, true, None, false),
            ] {
                let name = format!(
                    "selective_scan {tn} B={b} T={t} Di={di} N={n}{}{}{}",
                    if gate { " gate" } else { "" },
                    if start.is_some() { " left padding" } else { "" },
                    if h0 { " h0" } else { "" }
                );
                let c = Inputs::draw::<$t>(&mut rng, b, t, di, n, gate, start, h0);
                run(name.clone(), &mut rows, &mut |rows| fwd_bwd_case::<$t>(gpu, &name, &c, rows));
            }
            let name = format!("selective_scan decode {tn} B=3 Di=40 N=16, 20 steps from h0");
            let c = Inputs::draw::<$t>(&mut rng, 3, 20, 40, 16, true, None, true);
            run(name.clone(), &mut rows, &mut |rows| decode_case::<$t>(gpu, &name, &c, rows));
        }};
    }
    typed!(f32);
    typed!(half::bf16);
    rows
}

// ------------------------------------------------------------------------------------------------
// Timing

/// Forward and forward + backward times (CUDA events, median of `iters` after `warmup`) of a scan
/// with gate, [B, T, Di], state N, B and C read from an x_proj layout with dt_rank = Di / 32, for
/// T = f32 and bf16. Returns the printed table.
pub fn bench(gpu: &Gpu, b: usize, t: usize, di: usize, n: usize, warmup: usize, iters: usize) -> Result<String> {
    let mut s = format!(
        "selective scan on {}, B={b} T={t} Di={di} N={n}, gate, median of {iters} after {warmup} warm-up\n",
        gpu.describe()
    );
    s += "| dtype | forward ms | forward + backward ms |\n|---|---|---|\n";
    s += &bench_typed::<half::bf16>(gpu, b, t, di, n, warmup, iters)?;
    s += &bench_typed::<f32>(gpu, b, t, di, n, warmup, iters)?;
    Ok(s)
}

fn bench_typed<T: Elem>(
    gpu: &Gpu,
    b: usize,
    t: usize,
    di: usize,
    n: usize,
    warmup: usize,
    iters: usize,
) -> Result<String> {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let dt_rank = di / 32;
    let m = b * t * di;
    let mut randn = |k: usize| -> Vec<f32> { (0..k).map(|_| rng.sample::<f32, _>(StandardNormal)).collect() };
    let u = up::<T>(gpu, &randn(m))?;
    let delta = up::<T>(gpu, &randn(m).iter().map(|x| (x - 1.0f32).exp().ln_1p()).collect::<Vec<_>>())?;
    let z = up::<T>(gpu, &randn(m))?;
    let dout = up::<T>(gpu, &randn(m))?;
    let bc = up::<T>(gpu, &randn(b * t * (dt_rank + 2 * n)))?;
    let a = gpu.upload(&randn(di * n).iter().map(|x| -(0.5 * x).exp()).collect::<Vec<_>>())?;
    let d = gpu.upload(&randn(di))?;
    let p = DevScan {
        batch: b,
        len: t,
        channels: di,
        state: n,
        u: &u,
        delta: &delta,
        a: &a,
        bc: &bc,
        bc_layout: BcLayout::x_proj(t, dt_rank, n),
        d: &d,
        z: Some(&z),
        z_offset: 0,
        z_stride: di,
        start: None,
    };
    let mut out = gpu.zeros::<T>(m)?;
    let mut saved = gpu.zeros::<f32>(b * cpu::chunks(t) * di * n)?;
    let (mut du, mut ddelta, mut dz) = (gpu.zeros::<T>(m)?, gpu.zeros::<T>(m)?, gpu.zeros::<T>(m)?);
    let mut dbc = gpu.zeros::<T>(b * t * (dt_rank + 2 * n))?;
    let (mut da, mut dd) = (gpu.zeros::<f32>(di * n)?, gpu.zeros::<f32>(di)?);
    let mut scratch = gpu.zeros::<f32>(scratch_floats(b, t, di, n))?;
    let fwd = time_ms(gpu, warmup, iters, || forward(gpu, &p, None, &mut out, &mut saved, None))?;
    let mut out2 = gpu.zeros::<T>(m)?;
    let both = time_ms(gpu, warmup, iters, || {
        forward(gpu, &p, None, &mut out2, &mut saved, None)?;
        let g = DevGrads {
            du: &mut du,
            ddelta: &mut ddelta,
            da: &mut da,
            dbc: &mut dbc,
            dd: &mut dd,
            dz: Some(&mut dz),
            dh0: None,
        };
        backward(gpu, &p, &saved, &dout, g, &mut scratch)
    })?;
    Ok(format!("| {} | {fwd:.3} | {both:.3} |\n", T::NAME))
}
