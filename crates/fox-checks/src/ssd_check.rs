//! The GPU check of Mamba-2's ops ([`fox_kernels::cuda::ssd`]) against their CPU twins on fresh random
//! inputs, rows for `fox-attn check-ops` (case names begin with "ssd"), and the SSD timing of
//! `fox-attn bench-ssd`.
//!
//! Errors are relative L2 norms ‖gpu − cpu‖ / ‖cpu‖. Tolerances, and why:
//! - SSD forward (y, final state): 2e-5. Both sides are f32 with f32 accumulation, but sum in
//!   other orders (the CPU's gemm blocks vs the kernel's loops; cum by a warp scan vs a running
//!   sum) over sums of up to L + N = 192 terms, with __expf (2 ulp) for exp, and the state carried
//!   over several chunks: ~1e-6 expected.
//! - Decode step, conv1d, gated RMSNorm: 1e-5: the same f32 formula per element, in another
//!   order of at most N terms, __expf in SiLU and the decay.
//! - Determinism: the forward runs twice; the metric is the number of elements whose bits
//!   differ, tolerance 0.

use crate::check::{bits_differ, upload_starts, CheckRow, Ctx};
use anyhow::Result;
use cudarc::driver::CudaSlice;
use fox_kernels::cuda::ssd::{self, DevSsd};
use fox_kernels::cuda::{Elem, Gpu};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

const TOL_SSD: f64 = 2e-5;
const TOL_ELEM: f64 = 1e-5;
const TOL_SSD_BWD: f64 = 1e-4;

/// ‖x − r‖ / ‖r‖ (∞ for a length mismatch); also the tensor-core check's metric.
pub(super) fn rel_l2(x: &[f32], r: &[f32]) -> f64 {
    if x.len() != r.len() {
        return f64::INFINITY;
    }
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (a, b) in x.iter().zip(r) {
        num += (*a as f64 - *b as f64).powi(2);
        den += (*b as f64).powi(2);
    }
    (num / den.max(1e-300)).sqrt()
}

/// The SSD problem of shape [B, T, H, P, N, G] over host buffers whose rows are `stride` wide.
pub(super) fn host_problem<'a>(
    (batch, seq, heads, head_dim, state, groups): (usize, usize, usize, usize, usize, usize),
    stride: usize,
    (xbc, dt, a, d): (&'a [f32], &'a [f32], &'a [f32], &'a [f32]),
    start: Option<&'a [usize]>,
) -> fox_kernels::ssd::Ssd<'a> {
    fox_kernels::ssd::Ssd { batch, seq, heads, head_dim, state, groups, xbc, xbc_stride: stride, dt, a, d, start }
}

/// A CPU SSD problem's inputs on the device (x | B | C in `T`, the rest f32, start as i32): the
/// device twin of each check's and benchmark's problem (also the tensor-core check's).
pub(super) struct DevInputs<T: Elem> {
    xbc: CudaSlice<T>,
    dt: CudaSlice<f32>,
    a: CudaSlice<f32>,
    d: CudaSlice<f32>,
    start: Option<CudaSlice<i32>>,
}

impl<T: Elem> DevInputs<T> {
    pub(super) fn upload(gpu: &Gpu, p: &fox_kernels::ssd::Ssd) -> Result<Self> {
        let start = upload_starts(gpu, p.start)?;
        Ok(Self { xbc: upload_as(gpu, p.xbc)?, dt: gpu.upload(p.dt)?, a: gpu.upload(p.a)?, d: gpu.upload(p.d)?, start })
    }

    /// The device problem of `p`'s sizes over these buffers.
    pub(super) fn problem(&self, p: &fox_kernels::ssd::Ssd) -> DevSsd<'_, T> {
        DevSsd {
            batch: p.batch,
            seq: p.seq,
            heads: p.heads,
            head_dim: p.head_dim,
            state: p.state,
            groups: p.groups,
            xbc: &self.xbc,
            xbc_stride: p.xbc_stride,
            dt: &self.dt,
            a: &self.a,
            d: &self.d,
            start: self.start.as_ref(),
        }
    }
}

/// A benchmark's SSD problem at [B, T, H, P, N, G] (also the tensor-core benchmark's): random
/// xbc, dt, A and D = 1 (no initial state) uploaded in T, a random output gradient, and buffers for
/// the gradients.
pub(super) struct BenchProblem<T: Elem> {
    shape: (usize, usize, usize, usize, usize, usize),
    host: [Vec<f32>; 4],
    inputs: DevInputs<T>,
    pub(super) dy: CudaSlice<T>,
}

/// The gradients of a [`BenchProblem`]'s backward.
pub(super) struct BenchGrads<T: Elem> {
    dxbc: CudaSlice<T>,
    ddt: CudaSlice<f32>,
    da: CudaSlice<f32>,
    dd: CudaSlice<f32>,
}

impl<T: Elem> BenchProblem<T> {
    pub(super) fn new(gpu: &Gpu, shape: (usize, usize, usize, usize, usize, usize)) -> Result<(Self, BenchGrads<T>)> {
        let (b, t, h, p, n, g) = shape;
        let stride = h * p + 2 * g * n;
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let xbc: Vec<f32> = (0..b * t * stride).map(|_| rng.sample(StandardNormal)).collect();
        let dt: Vec<f32> = (0..b * t * h).map(|_| rng.gen_range(0.01..0.6f32)).collect();
        let a: Vec<f32> = (0..h).map(|_| -rng.gen_range(0.05..3.0f32)).collect();
        let d = vec![1.0f32; h];
        let inputs = DevInputs::upload(gpu, &host_problem(shape, stride, (&xbc, &dt, &a, &d), None))?;
        let dy = (0..b * t * h * p).map(|_| rng.sample::<f32, _>(StandardNormal)).collect::<Vec<_>>();
        let grads =
            BenchGrads { dxbc: gpu.zeros(xbc.len())?, ddt: gpu.zeros(dt.len())?, da: gpu.zeros(h)?, dd: gpu.zeros(h)? };
        Ok((Self { shape, host: [xbc, dt, a, d], inputs, dy: upload_as(gpu, &dy)? }, grads))
    }

    /// The device problem over the uploaded inputs.
    pub(super) fn problem(&self) -> DevSsd<'_, T> {
        let (_, _, h, p, n, g) = self.shape;
        let [xbc, dt, a, d] = &self.host;
        self.inputs.problem(&host_problem(self.shape, h * p + 2 * g * n, (xbc, dt, a, d), None))
    }
}

impl<T: Elem> BenchGrads<T> {
    pub(super) fn view(&mut self) -> ssd::DevSsdGrads<'_, T> {
        ssd::DevSsdGrads { dxbc: &mut self.dxbc, ddt: &mut self.ddt, da: &mut self.da, dd: &mut self.dd, dinit: None }
    }
}

/// Random SSD inputs at a trained layer's scale: (xbc, dt, A, D, init).
type SsdInputs = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

fn ssd_inputs(c: &mut Ctx, b: usize, t: usize, h: usize, p: usize, n: usize, stride: usize) -> SsdInputs {
    let xbc = c.randn(b * t * stride, 1.0);
    let dt: Vec<f32> = (0..b * t * h).map(|_| c.rng.gen_range(0.01..0.6f32)).collect();
    let a: Vec<f32> = (0..h).map(|i| if i == 0 { -0.02 } else { -c.rng.gen_range(0.05..3.0f32) }).collect();
    let d = c.randn(h, 1.0);
    let init = c.randn(b * h * p * n, 1.0);
    (xbc, dt, a, d, init)
}

/// One SSD case at [B, T, H, P, N, G] (as [`host_problem`] takes them).
fn ssd_case(
    c: &mut Ctx,
    name: &str,
    (b, t, h, p, n, g): (usize, usize, usize, usize, usize, usize),
    start: Option<Vec<usize>>,
) -> Result<()> {
    let stride = h * p + 2 * g * n + 5;
    let (xbc, dt, a, d, init) = ssd_inputs(c, b, t, h, p, n, stride);
    let cpu = host_problem((b, t, h, p, n, g), stride, (&xbc, &dt, &a, &d), start.as_deref());
    let (mut y, mut fin) = (vec![0.0; b * t * h * p], vec![0.0; b * h * p * n]);
    fox_kernels::ssd::ssd_fwd(&cpu, &mut y, Some(&init), Some(&mut fin))?;
    let gpu = c.gpu;
    let (inputs, di) = (DevInputs::<f32>::upload(gpu, &cpu)?, gpu.upload(&init)?);
    let dev = inputs.problem(&cpu);
    let mut gy = gpu.zeros::<f32>(y.len())?;
    let mut gf = gpu.zeros::<f32>(fin.len())?;
    let mut cb = gpu.zeros::<f32>(ssd::ssd_fwd_scratch_len(b, t, h, p, n, g))?;
    ssd::ssd_fwd(gpu, &dev, &mut gy, Some(&di), Some(&mut gf), &mut cb)?;
    let y1 = gpu.download(&gy)?;
    let f1 = gpu.download(&gf)?;
    c.add(name, "y rel L2 vs CPU chunked", rel_l2(&y1, &y), TOL_SSD, "");
    c.add(name, "final state rel L2", rel_l2(&f1, &fin), TOL_SSD, "");
    ssd::ssd_fwd(gpu, &dev, &mut gy, Some(&di), Some(&mut gf), &mut cb)?;
    let y2 = gpu.download(&gy)?;
    c.add(name, "determinism (rerun)", bits_differ(&y1, &y2), 0.0, "elements with other bits");
    // Backward, with a gradient on the final state and the initial state's gradient out.
    let dyv = c.randn(y.len(), 1.0);
    let dfin = c.randn(fin.len(), 1.0);
    let [dxbc, ddt, dav, ddv, dinit] = host_bwd(&cpu, &dyv, Some(&init), &dfin, (0.0, 0.0))?;
    let (gdy, gdfin) = (gpu.upload(&dyv)?, gpu.upload(&dfin)?);
    let mut sc = gpu.zeros::<f32>(ssd::ssd_bwd_scratch_len(b, t, h, p, n, g))?;
    let mut run = |c: &mut Ctx| -> Result<Vec<Vec<f32>>> {
        let gpu = c.gpu;
        let (mut gdx, mut gddt, mut gda, mut gdd, mut gdi) = (
            gpu.zeros::<f32>(xbc.len())?,
            gpu.zeros::<f32>(dt.len())?,
            gpu.zeros::<f32>(h)?,
            gpu.zeros::<f32>(h)?,
            gpu.zeros::<f32>(init.len())?,
        );
        let grads =
            ssd::DevSsdGrads { dxbc: &mut gdx, ddt: &mut gddt, da: &mut gda, dd: &mut gdd, dinit: Some(&mut gdi) };
        ssd::ssd_bwd(gpu, &dev, &gdy, Some(&di), Some(&gdfin), grads, &mut sc)?;
        Ok(vec![
            gpu.download(&gdx)?,
            gpu.download(&gddt)?,
            gpu.download(&gda)?,
            gpu.download(&gdd)?,
            gpu.download(&gdi)?,
        ])
    };
    let got = run(c)?;
    let bname = name.replace("fwd", "bwd");
    for (k, (what, want)) in
        [("dxbc", &dxbc), ("ddt", &ddt), ("dA", &dav), ("dD", &ddv), ("dinit", &dinit)].into_iter().enumerate()
    {
        c.add(&bname, &format!("{what} rel L2 vs CPU chunked"), rel_l2(&got[k], want), TOL_SSD_BWD, "");
    }
    let again = run(c)?;
    let diff: f64 = got.iter().zip(&again).map(|(a, b)| bits_differ(a, b)).sum();
    c.add(&bname, "determinism (rerun)", diff, 0.0, "elements with other bits");
    Ok(())
}

fn decode_case(c: &mut Ctx, name: &str) -> Result<()> {
    let (b, h, p, n, g, steps) = (2, 4, 64, 128, 2, 5);
    let stride = h * p + 2 * g * n;
    let mut state = c.randn(b * h * p * n, 1.0);
    let gpu = c.gpu;
    let mut gstate = gpu.upload(&state)?;
    let start = [0usize, 1];
    let (mut ey, mut es) = (0.0f64, 0.0f64);
    for _ in 0..steps {
        let (xbc, dt, a, d, _) = ssd_inputs(c, b, 1, h, p, n, stride);
        let cpu = host_problem((b, 1, h, p, n, g), stride, (&xbc, &dt, &a, &d), Some(&start));
        let mut y = vec![0.0; b * h * p];
        fox_kernels::ssd::ssd_decode_step(&cpu, &mut state, &mut y)?;
        let inputs = DevInputs::<f32>::upload(gpu, &cpu)?;
        let dev = inputs.problem(&cpu);
        let mut gy = gpu.zeros::<f32>(y.len())?;
        ssd::ssd_decode_step(gpu, &dev, &mut gstate, &mut gy)?;
        ey = ey.max(rel_l2(&gpu.download(&gy)?, &y));
        es = es.max(rel_l2(&gpu.download(&gstate)?, &state));
    }
    c.add(name, "y rel L2 (worst of 5 steps)", ey, TOL_ELEM, "row 1 padding");
    c.add(name, "state rel L2 (worst of 5 steps)", es, TOL_ELEM, "");
    Ok(())
}

/// The CPU chunked backward's (dxbc, ddt, dA, dD, dinit) from `dy` and `dfinal`, dxbc starting at
/// `start.0` and dA, dD at `start.1` (the backward overwrites dxbc's x, B and C columns and adds
/// into dA and dD).
pub(super) fn host_bwd(
    cpu: &fox_kernels::ssd::Ssd,
    dy: &[f32],
    init: Option<&[f32]>,
    dfinal: &[f32],
    start: (f32, f32),
) -> Result<[Vec<f32>; 5]> {
    let (h, states) = (cpu.heads, cpu.batch * cpu.heads * cpu.head_dim * cpu.state);
    let (mut dxbc, mut ddt) = (vec![start.0; cpu.xbc.len()], vec![0.0f32; cpu.dt.len()]);
    let (mut da, mut dd, mut dinit) = (vec![start.1; h], vec![start.1; h], vec![0.0f32; states]);
    let grads = fox_kernels::ssd::SsdGrads {
        dxbc: &mut dxbc,
        ddt: &mut ddt,
        da: &mut da,
        dd: &mut dd,
        dinit: Some(&mut dinit),
    };
    fox_kernels::ssd::ssd_bwd(cpu, dy, init, Some(dfinal), grads)?;
    Ok([dxbc, ddt, da, dd, dinit])
}

/// Values rounded to T and widened again (the inputs both sides see).
pub(super) fn rounded<T: Elem>(x: Vec<f32>) -> Vec<f32> {
    x.into_iter().map(|v| T::from_f32(v).to_f32()).collect()
}

pub(super) fn upload_as<T: Elem>(gpu: &Gpu, x: &[f32]) -> Result<cudarc::driver::CudaSlice<T>> {
    gpu.upload(&x.iter().map(|&v| T::from_f32(v)).collect::<Vec<T>>())
}

pub(super) fn download_f32<T: Elem>(gpu: &Gpu, x: &cudarc::driver::CudaSlice<T>) -> Result<Vec<f32>> {
    Ok(gpu.download(x)?.into_iter().map(T::to_f32).collect())
}

/// conv1d forward and backward in T against the CPU on T-rounded inputs: B = 2 (row 1 left-padded
/// by 6), the previous state, SiLU. A row stride and C that are multiples of 8 take the kernels'
/// vector loads, others one channel per thread; W ≤ 4 and 4 < W ≤ 8 take their two tap counts.
/// Tolerance: 1e-5 in f32; in bf16 the out and dx are rounded once to bf16 (relative rms
/// 2⁻⁹/√3 ≈ 1.1e-3): 4e-3; dweight and dbias are f32 sums of exact products: 1e-5.
fn conv_case<T: Elem>(c: &mut Ctx, name: &str, (t, ch, w, stride): (usize, usize, usize, usize)) -> Result<()> {
    let b = 2;
    let tol = if T::NAME == "f32" { TOL_ELEM } else { 4e-3 };
    let x = rounded::<T>(c.randn(b * t * stride, 1.0));
    let weight = rounded::<T>(c.randn(ch * w, 0.5));
    let bias = c.randn(ch, 0.5);
    let prev = c.randn(b * (w - 1) * ch, 1.0);
    let start = [0usize, 6];
    let p = fox_kernels::conv1d::Conv1d {
        batch: b,
        seq: t,
        channels: ch,
        width: w,
        x: &x,
        x_stride: stride,
        weight: &weight,
        bias: Some(&bias),
        start: Some(&start),
        silu: true,
    };
    let mut out = vec![0.0; b * t * ch];
    fox_kernels::conv1d::conv1d_fwd(&p, &mut out, Some(&prev), None)?;
    let gpu = c.gpu;
    let mut gout = gpu.zeros::<T>(out.len())?;
    let (gx, gw) = (upload_as::<T>(gpu, &x)?, upload_as::<T>(gpu, &weight)?);
    let (gb, gp, gs) = (gpu.upload(&bias)?, gpu.upload(&prev)?, gpu.upload(&[0i32, 6])?);
    let conv = ssd::DevConv1d {
        dims: (b, t, ch, w),
        x: &gx,
        x_stride: stride,
        weight: &gw,
        bias: Some(&gb),
        start: Some(&gs),
        prev: Some(&gp),
        silu: true,
    };
    ssd::conv1d_fwd(gpu, &mut gout, &conv)?;
    c.add(name, "out rel L2", rel_l2(&download_f32(gpu, &gout)?, &out), tol, "SiLU, padding, previous state");
    // Backward: dx (the columns past C keep their value), dweight and dbias accumulated onto 0.5.
    let dout = rounded::<T>(c.randn(b * t * ch, 1.0));
    let mut dx = vec![3.0f32; x.len()];
    let (mut dw, mut db) = (vec![0.5f32; ch * w], vec![0.5f32; ch]);
    fox_kernels::conv1d::conv1d_bwd(&p, &dout, Some(&prev), &mut dx, &mut dw, Some(&mut db))?;
    let (gdout, mut gdx, mut gdw, mut gdb) = (
        upload_as::<T>(gpu, &dout)?,
        upload_as::<T>(gpu, &vec![3.0f32; x.len()])?,
        gpu.upload(&vec![0.5f32; ch * w])?,
        gpu.upload(&vec![0.5f32; ch])?,
    );
    let mut scratch = gpu.zeros::<f32>(ssd::conv1d_bwd_scratch_len(b, t, ch, w))?;
    ssd::conv1d_bwd(gpu, &mut gdx, &mut gdw, Some(&mut gdb), &mut scratch, &gdout, &conv)?;
    let bname = name.replace("fwd", "bwd");
    c.add(&bname, "dx rel L2", rel_l2(&download_f32(gpu, &gdx)?, &dx), tol, "");
    c.add(&bname, "dweight rel L2", rel_l2(&gpu.download(&gdw)?, &dw), TOL_ELEM, "");
    c.add(&bname, "dbias rel L2", rel_l2(&gpu.download(&gdb)?, &db), TOL_ELEM, "");
    Ok(())
}

/// Gated RMSNorm forward and backward in T against the CPU on T-rounded inputs (tolerances as
/// [`conv_case`]'s: y, dx and dz are rounded once to T; rstd and dw are f32). The backward's rows
/// are past one block's 32, for several partial sums of dw.
fn norm_case<T: Elem>(c: &mut Ctx, name: &str, (rows, dim, zs): (usize, usize, usize)) -> Result<()> {
    let eps = 1e-5f32;
    let tol = if T::NAME == "f32" { TOL_ELEM } else { 4e-3 };
    let x = rounded::<T>(c.randn(rows * dim, 1.0));
    let z = rounded::<T>(c.randn(rows * zs, 1.0));
    let w = c.randn(dim, 0.3).iter().map(|v| 1.0 + v).collect::<Vec<_>>();
    let (mut y, mut r) = (vec![0.0; rows * dim], vec![0.0; rows]);
    let cpu_norm = fox_kernels::rms_norm_gated::GatedNorm { x: &x, z: &z, z_stride: zs, w: &w, dim, groups: 1 };
    fox_kernels::rms_norm_gated::rms_norm_gated_fwd(&cpu_norm, eps, &mut y, &mut r)?;
    let gpu = c.gpu;
    let (gx, gz, gw) = (upload_as::<T>(gpu, &x)?, upload_as::<T>(gpu, &z)?, gpu.upload(&w)?);
    let (mut gy, mut gr) = (gpu.zeros::<T>(y.len())?, gpu.zeros::<f32>(rows)?);
    let norm = ssd::GatedNorm { x: &gx, z: &gz, z_stride: zs, w: &gw, rows, dim };
    ssd::rms_norm_gated_fwd(gpu, &mut gy, &mut gr, norm, eps)?;
    c.add(name, "y rel L2", rel_l2(&download_f32(gpu, &gy)?, &y), tol, "");
    c.add(name, "rstd rel L2", rel_l2(&gpu.download(&gr)?, &r), TOL_ELEM, "");
    let dy = rounded::<T>(c.randn(rows * dim, 1.0));
    let (mut dx, mut dz, mut dw) = (vec![0.0; x.len()], vec![2.0; z.len()], vec![0.5; dim]);
    fox_kernels::rms_norm_gated::rms_norm_gated_bwd(&cpu_norm, &dy, &r, &mut dx, &mut dz, &mut dw)?;
    let gdy = upload_as::<T>(gpu, &dy)?;
    let (mut gdx, mut gdz, mut gdw) =
        (gpu.zeros::<T>(x.len())?, upload_as::<T>(gpu, &vec![2.0f32; z.len()])?, gpu.upload(&vec![0.5f32; dim])?);
    let mut scratch = gpu.zeros::<f32>(ssd::rms_norm_gated_bwd_scratch_len(rows, dim))?;
    let grads = ssd::GatedNormGrads { dx: &mut gdx, dz: &mut gdz, dw: &mut gdw };
    ssd::rms_norm_gated_bwd(gpu, grads, &mut scratch, &gdy, &gr, norm)?;
    let bname = name.replace("fwd", "bwd");
    c.add(&bname, "dx rel L2", rel_l2(&download_f32(gpu, &gdx)?, &dx), tol, "");
    c.add(&bname, "dz rel L2", rel_l2(&download_f32(gpu, &gdz)?, &dz), tol, "columns past dim kept");
    c.add(&bname, "dw rel L2", rel_l2(&gpu.download(&gdw)?, &dw), TOL_ELEM, "");
    Ok(())
}

/// A decode step's in_proj with its inputs in one kernel ([`fox_kernels::cuda::ops::gemv_step_in`]) against
/// in_proj's GEMV then [`ssd::decode_inputs`] (Mamba-2 125M's shapes; row 1 of 3 is padding):
/// zxbcdt, xbc, dt and the advanced conv state with the same bits (tolerance 0 differing elements).
fn step_in_case<T: Elem>(c: &mut Ctx, name: &str, rows: usize) -> Result<()> {
    let (k, h, p, n, w) = (768, 24, 64, 128, 4);
    let (inner, conv) = (h * p, h * p + 2 * n);
    let out = 2 * inner + 2 * n + h;
    let d = ssd::DecodeInputs {
        batch: rows,
        stride: out,
        conv_off: inner,
        channels: conv,
        width: w,
        dt_off: inner + conv,
        heads: h,
    };
    let gpu = c.gpu;
    let x = upload_as::<T>(gpu, &c.randn(rows * k, 1.0))?;
    let wt = upload_as::<T>(gpu, &c.randn(out * k, 0.04))?;
    let cw = upload_as::<T>(gpu, &c.randn(conv * w, 0.5))?;
    let (cb, dtb) = (gpu.upload(&c.randn(conv, 0.5))?, gpu.upload(&c.randn(h, 1.0))?);
    let state0 = c.randn(rows * (w - 1) * conv, 1.0);
    let start: Vec<i32> = (0..rows as i32).map(|r| if r == 1 { 1 } else { 0 }).collect();
    let gs = gpu.upload(&start)?;
    let mut got = Vec::new();
    for fused in [true, false] {
        let (mut z, mut xbc, mut dt) =
            (gpu.zeros::<T>(rows * out)?, gpu.zeros::<T>(rows * conv)?, gpu.zeros::<f32>(rows * h)?);
        let mut st = gpu.upload(&state0)?;
        let prm = ssd::DecodeParams { conv_w: &cw, conv_b: Some(&cb), dt_bias: &dtb, start: Some(&gs), at: d };
        let outs = ssd::DecodeInputsOut { xbc: &mut xbc, conv_state: &mut st, dt: &mut dt };
        if fused {
            fox_kernels::cuda::ops::gemv_step_in(gpu, &mut z, &x, &wt, k, outs, prm)?;
        } else {
            fox_kernels::cuda::ops::gemv(gpu, &mut z, &x, &wt, rows, k, out)?;
            ssd::decode_inputs(gpu, outs, &z, prm)?;
        }
        got.push([download_f32(gpu, &z)?, download_f32(gpu, &xbc)?, gpu.download(&dt)?, gpu.download(&st)?]);
    }
    for (i, what) in ["zxbcdt", "xbc", "dt", "conv state"].into_iter().enumerate() {
        c.add(
            name,
            &format!("{what} vs gemv + decode_inputs"),
            bits_differ(&got[0][i], &got[1][i]),
            0.0,
            "elements with other bits",
        );
    }
    let moved = bits_differ(&got[0][3], &state0);
    c.add(name, "conv state advanced", if moved > 0.0 { 0.0 } else { 1.0 }, 0.0, &format!("{moved} values changed"));
    Ok(())
}

/// Every Mamba-2 check row.
pub fn run_all(gpu: &Gpu, seed: u64) -> Vec<CheckRow> {
    let mut c = Ctx::new(gpu, seed ^ 0x55d);
    c.case("ssd fwd B2 T300 H4 P64 N128 G2 pad init", |c, n| {
        ssd_case(c, n, (2, 300, 4, 64, 128, 2), Some(vec![0, 70]))
    });
    c.case("ssd fwd B1 T50 H2 P32 N48 G1 (T < L)", |c, n| ssd_case(c, n, (1, 50, 2, 32, 48, 1), None));
    c.case("ssd decode B2 H4 P64 N128 G2", decode_case);
    // (T, C, W, row stride): one channel per thread (stride 311), vectors (stride 3352, Mamba-2
    // 125M's zxbcdt rows, C 1792); T past one backward block (256 positions) and not a multiple of
    // a run; W of 2 and 6.
    for (t, ch, w, stride) in [(77, 300, 4, 311), (600, 1792, 4, 3352), (300, 296, 2, 304), (130, 300, 6, 300)] {
        let shape = format!("B2 T{t} C{ch} W{w} stride {stride}");
        c.case(&format!("ssd conv1d fwd f32 {shape}"), |c, n| conv_case::<f32>(c, n, (t, ch, w, stride)));
        c.case(&format!("ssd conv1d fwd bf16 {shape}"), |c, n| conv_case::<half::bf16>(c, n, (t, ch, w, stride)));
    }
    // (rows, dim, z's row stride): 16-byte vectors (stride 3200), one element per thread (3201).
    for (rows, dim, zs) in [(300, 1536, 3200), (77, 1536, 3201), (37, 200, 200)] {
        let shape = format!("{rows}x{dim} z stride {zs}");
        c.case(&format!("ssd rms_norm_gated fwd f32 {shape}"), |c, n| norm_case::<f32>(c, n, (rows, dim, zs)));
        c.case(&format!("ssd rms_norm_gated fwd bf16 {shape}"), |c, n| norm_case::<half::bf16>(c, n, (rows, dim, zs)));
    }
    for rows in [1, 3] {
        c.case(&format!("ssd gemv_step_in f32 rows {rows}"), |c, n| step_in_case::<f32>(c, n, rows));
        c.case(&format!("ssd gemv_step_in bf16 rows {rows}"), |c, n| step_in_case::<half::bf16>(c, n, rows));
    }
    c.rows
}

/// Median ms (CUDA events, after warm-up) of the SSD forward (all four kernels) at
/// [B, T, H, P, N, G], on random inputs, no initial state; and of each of its four kernels alone
/// (C Bᵀ, chunk states, state passing, chunk outputs); and of forward + backward.
pub fn bench_fwd(
    gpu: &Gpu,
    shape: (usize, usize, usize, usize, usize, usize),
    warmup: usize,
    iters: usize,
) -> Result<(f64, f64, [f64; 4])> {
    let (b, t, h, p, n, g) = shape;
    let (bench, mut grads) = BenchProblem::<f32>::new(gpu, shape)?;
    let dev = bench.problem();
    let mut y = gpu.zeros::<f32>(b * t * h * p)?;
    let mut cb = gpu.zeros::<f32>(ssd::ssd_fwd_scratch_len(b, t, h, p, n, g))?;
    let all = fox_kernels::cuda::time_ms(gpu, warmup, iters, || ssd::ssd_fwd(gpu, &dev, &mut y, None, None, &mut cb))?;
    let mut bsc = gpu.zeros::<f32>(ssd::ssd_bwd_scratch_len(b, t, h, p, n, g))?;
    let fwdbwd = fox_kernels::cuda::time_ms(gpu, warmup, iters, || {
        ssd::ssd_fwd(gpu, &dev, &mut y, None, None, &mut cb)?;
        ssd::ssd_bwd(gpu, &dev, &bench.dy, None, None, grads.view(), &mut bsc)
    })?;
    let mut steps = [0.0; 4];
    for (k, ms) in steps.iter_mut().enumerate() {
        *ms = fox_kernels::cuda::time_ms(gpu, warmup, iters, || ssd::ssd_fwd_step(gpu, &dev, &mut y, &mut cb, k))?;
    }
    Ok((all, fwdbwd, steps))
}
