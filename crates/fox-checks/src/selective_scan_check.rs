//! The GPU check of Mamba's selective scan ([`fox_kernels::cuda::selective_scan`], Samba's SSM)
//! against the CPU op, and its timing.

use crate::check::{bits_differ, upload_starts};
use crate::check::{rel_l2, CheckRow};
use crate::ssd_check::upload_as as up;
use anyhow::Result;
use cudarc::driver::CudaSlice;
use fox_kernels::cuda::selective_scan::*;
use fox_kernels::cuda::{time_ms, Elem, Gpu};
use fox_kernels::selective_scan::testing::Case;
use fox_kernels::selective_scan::{self as cpu, BcLayout, Scan};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

// The check: GPU against the CPU op on fresh random inputs.
//
// Inputs are drawn by the CPU tests' [`Case::draw`] (δ = softplus(N(0,1) − 1), A = −exp(U(−1,
// 1.5)), so decays reach 2e-6 per step; u, B, C, D, h0 ~ N(0, 1), z ~ N(0, 4)), rounded to T, and
// the CPU op gets the rounded values: errors measure the kernels' arithmetic and the rounding of their outputs.
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

/// A case's host inputs ([`Case::draw`]), rounded to T where they travel as T.
fn draw<T: Elem>(
    rng: &mut ChaCha8Rng,
    shape: (usize, usize, usize, usize),
    gate: bool,
    start: Option<Vec<usize>>,
    h0: bool,
) -> Case {
    let mut c = Case::draw(rng, DT_RANK, shape, gate, start, h0);
    for v in [&mut c.u, &mut c.delta, &mut c.bc, &mut c.dout].into_iter().chain(c.z.as_mut()) {
        v.iter_mut().for_each(|x| *x = T::from_f32(*x).to_f32());
    }
    c
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
    fn new(gpu: &Gpu, c: &Case) -> Result<Self> {
        Ok(DevInputs {
            u: up(gpu, &c.u)?,
            delta: up(gpu, &c.delta)?,
            a: gpu.upload(&c.a)?,
            bc: up(gpu, &c.bc)?,
            d: gpu.upload(&c.d)?,
            z: c.z.as_ref().map(|z| up(gpu, z)).transpose()?,
            start: upload_starts(gpu, c.start.as_deref())?,
        })
    }
    fn scan<'a>(&'a self, c: &Case) -> DevScan<'a, T> {
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
fn fwd_bwd_case<T: Elem>(gpu: &Gpu, name: &str, c: &Case, rows: &mut Vec<CheckRow>) -> Result<()> {
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
    let diff: f64 = got.iter().zip(&again).map(|(a, b)| bits_differ(a, b)).sum();
    rows.push(CheckRow::new(name, "backward twice: bits differing", diff, 0.0, "elements"));
    Ok(())
}

/// `steps` decode steps from h0 on both devices, each step's output and the final state.
fn decode_case<T: Elem>(gpu: &Gpu, name: &str, c: &Case, rows: &mut Vec<CheckRow>) -> Result<()> {
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
                let c = draw::<$t>(&mut rng, (b, t, di, n), gate, start, h0);
                run(name.clone(), &mut rows, &mut |rows| fwd_bwd_case::<$t>(gpu, &name, &c, rows));
            }
            let name = format!("selective_scan decode {tn} B=3 Di=40 N=16, 20 steps from h0");
            let c = draw::<$t>(&mut rng, (3, 20, 40, 16), true, None, true);
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
