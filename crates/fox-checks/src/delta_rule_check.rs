//! The GPU check of the delta rule and DeltaNet's small ops ([`fox_kernels::cuda::delta_rule`]) against the
//! CPU ([`fox_kernels::delta_rule`]: the chunked forward and backward, the decode step, the L2 norm;
//! [`fox_kernels::ssd::dt_fwd`]'s softplus for the decay) on the same inputs rounded to T, rows for
//! `fox-attn check-ops` (case names begin with "delta rule"), and its timing for
//! `fox-attn bench-delta`.
//!
//! Errors are relative L2 norms ‖gpu − cpu‖ / ‖cpu‖. Tolerances, and why:
//! - f32 forward (o, final state), backward (dq, dk, dv, dβ, dinit) and decode: 1e-4. Both sides
//!   are f32 with the same chunked algebra but other summation orders (the CPU substitutes U row by
//!   row, the GPU forms T = (I + A)⁻¹ first), __expf (2 ulp) for the decays, and T = 2048 carries
//!   the state over 32 chunks: ~1e-6 expected (host emulation: ≤ 6e-7). dg: 1e-3, a reverse
//!   prefix sum of terms of both signs that cancel.
//! - bf16 forward: 2e-2. Every block product takes bf16 operands (the inputs, T, W, U and the
//!   chunk states stored as bf16), each rounding of relative rms 2⁻⁹/√3 ≈ 1.1e-3, o rounded once
//!   more: ~4e-3 expected (host emulation at T = 70: 3.4e-3). Backward: 3e-2, the same roundings
//!   and the gradients' own operands (dO, dU, dS, dR): ~4e-3 seen in emulation; dg 6e-2 (its
//!   cancellation: 1.5e-2 seen in emulation at K = 128).
//! - L2 norm, decay, swish gate: 1e-5 in f32 (one formula per element, sums of at most K terms in
//!   another order); in bf16 their outputs are rounded once to bf16: 4e-3. The decay's parameter
//!   gradients are f32 sums over B·T rows in another order: 1e-5 (both types; the terms are the
//!   same f32 values).
//! - Determinism: forward and backward run twice; the metric is the number of elements whose bits
//!   differ, tolerance 0.

use crate::check::{bits_differ, upload_starts};
use crate::check::{CheckRow, Ctx};
use crate::ssd_check::{download_f32 as down, rel_l2, rounded, upload_as as up};
use anyhow::Result;
use cudarc::driver::CudaSlice;
use fox_kernels::cuda::delta_rule::{self as dr, DevDeltaRule, DevDeltaRuleGrads};
use fox_kernels::cuda::{Elem, Gpu};
use rand::Rng;

const TOL_F32: f64 = 1e-4;
const TOL_F32_DG: f64 = 1e-3;
const TOL_BF16_FWD: f64 = 2e-2;
const TOL_BF16_BWD: f64 = 3e-2;
const TOL_BF16_DG: f64 = 6e-2;
const TOL_ELEM: f64 = 1e-5;
const TOL_ELEM_BF16: f64 = 4e-3;

/// One case: B, T, H, K, V, the decay, left padding, an initial state (and final-state gradient).
struct Shape {
    b: usize,
    t: usize,
    h: usize,
    k: usize,
    v: usize,
    gated: bool,
    start: Option<Vec<usize>>,
    init: bool,
}

fn is_bf16<T: Elem>() -> bool {
    std::mem::size_of::<T>() == 2
}

/// Rows of `dim` scaled to unit L2 norm (as q and k after the layer's L2 norm), then rounded to T.
fn unit_rows<T: Elem>(c: &mut Ctx, n: usize, dim: usize) -> Vec<f32> {
    let mut x = c.randn(n * dim, 1.0);
    for r in x.chunks_mut(dim) {
        let s = r.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
        r.iter_mut().for_each(|v| *v /= s);
    }
    rounded::<T>(x)
}

/// The delta-rule problem [B, T, H] with keys of `kd` and values of `vd` over host buffers,
/// scale 1/√K.
fn host_problem<'a>(
    (batch, seq, heads, k_dim, v_dim): (usize, usize, usize, usize, usize),
    [q, k, v, beta]: [&'a [f32]; 4],
    g: Option<&'a [f32]>,
    start: Option<&'a [usize]>,
) -> fox_kernels::delta_rule::DeltaRule<'a> {
    let scale = 1.0 / (k_dim as f32).sqrt();
    fox_kernels::delta_rule::DeltaRule { batch, seq, heads, k_dim, v_dim, q, k, v, beta, g, scale, start }
}

/// A CPU delta-rule problem's inputs on the device (q, k, v, β in `T`, g in f32, start as i32).
struct DevInputs<T: Elem> {
    q: CudaSlice<T>,
    k: CudaSlice<T>,
    v: CudaSlice<T>,
    beta: CudaSlice<T>,
    g: Option<CudaSlice<f32>>,
    start: Option<CudaSlice<i32>>,
}

impl<T: Elem> DevInputs<T> {
    fn upload(gpu: &Gpu, p: &fox_kernels::delta_rule::DeltaRule) -> Result<Self> {
        let g = p.g.map(|g| gpu.upload(g)).transpose()?;
        let start = upload_starts(gpu, p.start)?;
        Ok(Self { q: up(gpu, p.q)?, k: up(gpu, p.k)?, v: up(gpu, p.v)?, beta: up(gpu, p.beta)?, g, start })
    }

    /// The device problem of `p`'s sizes over these buffers.
    fn problem(&self, p: &fox_kernels::delta_rule::DeltaRule) -> DevDeltaRule<'_, T> {
        DevDeltaRule {
            batch: p.batch,
            seq: p.seq,
            heads: p.heads,
            k_dim: p.k_dim,
            v_dim: p.v_dim,
            q: &self.q,
            k: &self.k,
            v: &self.v,
            beta: &self.beta,
            g: self.g.as_ref(),
            scale: p.scale,
            start: self.start.as_ref(),
        }
    }
}

fn case<T: Elem>(c: &mut Ctx, name: &str, s: &Shape) -> Result<()> {
    let (b, t, h, kd, vd) = (s.b, s.t, s.h, s.k, s.v);
    let bf = is_bf16::<T>();
    let (tol_f, tol_b, tol_g) =
        if bf { (TOL_BF16_FWD, TOL_BF16_BWD, TOL_BF16_DG) } else { (TOL_F32, TOL_F32, TOL_F32_DG) };
    let n = b * t * h;
    let q = unit_rows::<T>(c, n, kd);
    let k = unit_rows::<T>(c, n, kd);
    let v = rounded::<T>(c.randn(n * vd, 1.0));
    let beta = rounded::<T>((0..n).map(|_| c.rng.gen_range(0.05..0.95f32)).collect());
    let g: Option<Vec<f32>> = s.gated.then(|| (0..n).map(|_| -c.rng.gen_range(0.001..0.4f32)).collect());
    let ns = b * h * kd * vd;
    let init = s.init.then(|| c.randn(ns, 0.5));
    let cpu = host_problem((b, t, h, kd, vd), [&q, &k, &v, &beta], g.as_deref(), s.start.as_deref());
    let (mut o, mut fin) = (vec![0.0; n * vd], vec![0.0; ns]);
    fox_kernels::delta_rule::delta_rule_fwd(&cpu, &mut o, init.as_deref(), Some(&mut fin))?;

    let gpu = c.gpu;
    let inputs = DevInputs::<T>::upload(gpu, &cpu)?;
    let dev = inputs.problem(&cpu);
    let mut go = gpu.zeros::<T>(n * vd)?;
    let mut sc = gpu.zeros::<f32>(dr::fwd_scratch_len::<T>(b, t, h, kd, vd))?;
    let run_fwd = |go: &mut _, sc: &mut _| -> Result<Vec<f32>> {
        let mut st = gpu.upload(init.as_deref().unwrap_or(&vec![0.0; ns]))?;
        dr::delta_rule_fwd(gpu, &dev, go, Some(&mut st), sc)?;
        gpu.download(&st)
    };
    let f1 = run_fwd(&mut go, &mut sc)?;
    let o1 = down(gpu, &go)?;
    let how = match dr::default_scan(gpu, &dev) {
        Some(sp) => format!(" (parallel walk, {} segments)", sp.nseg),
        None => String::new(),
    };
    c.add(name, &format!("o rel L2 vs CPU chunked{how}"), rel_l2(&o1, &o), tol_f, "");
    c.add(name, "final state rel L2", rel_l2(&f1, &fin), tol_f, "");
    let f2 = run_fwd(&mut go, &mut sc)?;
    let o2 = down(gpu, &go)?;
    c.add(
        name,
        "determinism fwd (rerun)",
        bits_differ(&o1, &o2) + bits_differ(&f1, &f2),
        0.0,
        "elements with other bits",
    );
    // In segments one after another (delta_rule_fwd_cut): one per chunk gives the bits of one
    // walk, which are the default's unless the default is the parallel walk.
    let nch = t.div_ceil(dr::CHUNK);
    let scan = dr::default_scan(gpu, &dev);
    if nch > 1 {
        let every: Vec<usize> = (1..nch).collect();
        let mut runs = Vec::new();
        for cuts in [&[][..], &every[..]] {
            let mut st = gpu.upload(init.as_deref().unwrap_or(&vec![0.0; ns]))?;
            dr::delta_rule_fwd_cut(gpu, &dev, &mut go, Some(&mut st), &mut sc, cuts)?;
            runs.push((down(gpu, &go)?, gpu.download(&st)?));
        }
        let (one, every) = (&runs[0], &runs[1]);
        let diff = bits_differ(&one.0, &every.0) + bits_differ(&one.1, &every.1);
        c.add(name, "fwd in every-chunk segments = in one", diff, 0.0, "elements with other bits");
        if scan.is_none() {
            let diff = bits_differ(&one.0, &o1) + bits_differ(&one.1, &f1);
            c.add(name, "fwd in one segment = default", diff, 0.0, "elements with other bits");
        }
    }
    // The parallel walk (bf16): the default's plan (checked above as the default) and segments of
    // 1 and 2 chunks where the scratch has room, against the CPU; the backward reruns the default.
    if bf {
        for seglen in [1, 2] {
            if dr::scan_plan_of(&dev, seglen).is_none() {
                continue;
            }
            let mut st = gpu.upload(init.as_deref().unwrap_or(&vec![0.0; ns]))?;
            dr::delta_rule_fwd_scan(gpu, &dev, &mut go, Some(&mut st), &mut sc, seglen)?;
            let what = format!("parallel walk, {seglen}-chunk segments");
            c.add(name, &format!("o rel L2 vs CPU ({what})"), rel_l2(&down(gpu, &go)?, &o), tol_f, "");
            c.add(name, &format!("final state rel L2 ({what})"), rel_l2(&gpu.download(&st)?, &fin), tol_f, "");
        }
    }
    // Without a state argument: a zero initial state.
    if init.is_none() {
        dr::delta_rule_fwd(gpu, &dev, &mut go, None, &mut sc)?;
        c.add(name, "fwd without a state = with a zero one", bits_differ(&down(gpu, &go)?, &o1), 0.0, "");
    }

    // Backward, with the final state's gradient and the initial state's gradient out.
    let dout = rounded::<T>(c.randn(n * vd, 1.0));
    let dfin = c.randn(ns, 1.0);
    let (mut dq, mut dk, mut dv, mut db) = (vec![0.0; n * kd], vec![0.0; n * kd], vec![0.0; n * vd], vec![0.0; n]);
    let mut dg = vec![0.0; n];
    let mut dinit = vec![0.0; ns];
    fox_kernels::delta_rule::delta_rule_bwd(
        &cpu,
        &dout,
        init.as_deref(),
        Some(&dfin),
        fox_kernels::delta_rule::DeltaRuleGrads {
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
            dbeta: &mut db,
            dg: s.gated.then_some(&mut dg[..]),
            dinit: Some(&mut dinit),
        },
    )?;
    let (gdo, gdfin) = (up::<T>(gpu, &dout)?, gpu.upload(&dfin)?);
    let ginit = init.as_ref().map(|i| gpu.upload(i)).transpose()?;
    let mut bsc = gpu.zeros::<f32>(dr::bwd_scratch_len::<T>(b, t, h, kd, vd))?;
    let mut run_bwd = |c: &mut Ctx| -> Result<Vec<Vec<f32>>> {
        let gpu = c.gpu;
        // Gradients start at 7 so that every element must be written.
        let seven = |len: usize| up::<T>(gpu, &vec![7.0f32; len]);
        let (mut a, mut bb, mut cc, mut d) = (seven(n * kd)?, seven(n * kd)?, seven(n * vd)?, seven(n)?);
        let mut e = gpu.upload(&vec![7.0f32; n])?;
        let mut f = gpu.zeros::<f32>(ns)?;
        let grads = DevDeltaRuleGrads {
            dq: &mut a,
            dk: &mut bb,
            dv: &mut cc,
            dbeta: &mut d,
            dg: s.gated.then_some(&mut e),
            dinit: Some(&mut f),
        };
        dr::delta_rule_bwd(gpu, &dev, &gdo, ginit.as_ref(), Some(&gdfin), grads, &mut bsc)?;
        Ok(vec![down(gpu, &a)?, down(gpu, &bb)?, down(gpu, &cc)?, down(gpu, &d)?, gpu.download(&e)?, gpu.download(&f)?])
    };
    let got = run_bwd(c)?;
    let bname = name.replace("fwd", "bwd");
    let want: [(&str, &Vec<f32>, f64); 6] = [
        ("dq", &dq, tol_b),
        ("dk", &dk, tol_b),
        ("dv", &dv, tol_b),
        ("dbeta", &db, tol_b),
        ("dg", &dg, tol_g),
        ("dinit", &dinit, tol_b),
    ];
    for (i, (what, w, tol)) in want.iter().enumerate() {
        if *what == "dg" && !s.gated {
            continue;
        }
        c.add(&bname, &format!("{what} rel L2 vs CPU chunked"), rel_l2(&got[i], w), *tol, "");
    }
    let again = run_bwd(c)?;
    let diff: f64 = got.iter().zip(&again).map(|(a, b)| bits_differ(a, b)).sum();
    c.add(&bname, "determinism bwd (rerun)", diff, 0.0, "elements with other bits");

    // Three decode steps from the final state (row B − 1 padded at the first when the case pads).
    let mut cs = fin.clone();
    let mut gs = gpu.upload(&fin)?;
    let (mut worst, mut sworst) = (0.0f64, 0.0f64);
    for step in 0..3 {
        let m = b * h;
        let q1 = unit_rows::<T>(c, m, kd);
        let k1 = unit_rows::<T>(c, m, kd);
        let v1 = rounded::<T>(c.randn(m * vd, 1.0));
        let b1 = rounded::<T>((0..m).map(|_| c.rng.gen_range(0.05..0.95f32)).collect());
        let g1: Option<Vec<f32>> = s.gated.then(|| (0..m).map(|_| -c.rng.gen_range(0.001..0.4f32)).collect());
        let mut st1 = vec![0usize; b];
        if s.start.is_some() && step == 0 {
            st1[b - 1] = 1;
        }
        let p1 = host_problem((b, 1, h, kd, vd), [&q1, &k1, &v1, &b1], g1.as_deref(), Some(&st1));
        let mut o1c = vec![0.0; m * vd];
        fox_kernels::delta_rule::delta_rule_decode_step(&p1, &mut cs, &mut o1c)?;
        let inputs1 = DevInputs::<T>::upload(gpu, &p1)?;
        let d1 = inputs1.problem(&p1);
        let mut go1 = gpu.zeros::<T>(m * vd)?;
        dr::delta_rule_decode_step(gpu, &d1, &mut gs, &mut go1)?;
        worst = worst.max(rel_l2(&down(gpu, &go1)?, &o1c));
        sworst = sworst.max(rel_l2(&gpu.download(&gs)?, &cs));
    }
    let dname = name.replace("fwd", "decode");
    // The decode step is exact f32 per element; in bf16 its o is rounded once.
    let dtol = if bf { TOL_ELEM_BF16 } else { TOL_ELEM };
    c.add(&dname, "3 steps o rel L2 vs CPU (worst)", worst, dtol, "");
    c.add(&dname, "3 steps state rel L2 (worst)", sworst, TOL_ELEM, "");
    Ok(())
}

/// The L2 norm, the decay and the swish gate against the CPU formulas, in T.
fn small_ops<T: Elem>(c: &mut Ctx) -> Result<()> {
    let bf = is_bf16::<T>();
    let name = format!("delta rule ops {}", if bf { "bf16" } else { "f32" });
    let tol = if bf { TOL_ELEM_BF16 } else { TOL_ELEM };
    let gpu = c.gpu;
    // L2 norm over heads of 128 and of 20 (not a multiple of the warp).
    for dim in [128usize, 20] {
        let rows = 333;
        let x = rounded::<T>(c.randn(rows * dim, 1.0));
        let dy = rounded::<T>(c.randn(rows * dim, 1.0));
        let (mut y, mut rs, mut dx) = (vec![0.0; rows * dim], vec![0.0; rows], vec![0.0; rows * dim]);
        fox_kernels::delta_rule::l2norm_fwd(&mut y, &mut rs, &x, dim, 1e-6)?;
        let (gx, gdy) = (up::<T>(gpu, &x)?, up::<T>(gpu, &dy)?);
        let (mut gy, mut grs, mut gdx) =
            (gpu.zeros::<T>(rows * dim)?, gpu.zeros::<f32>(rows)?, gpu.zeros::<T>(rows * dim)?);
        dr::l2norm_fwd(gpu, &mut gy, &mut grs, &gx, rows, dim)?;
        let ygpu = down(gpu, &gy)?;
        c.add(&name, &format!("l2norm y (dim {dim}) rel L2"), rel_l2(&ygpu, &y), tol, "");
        c.add(&name, &format!("l2norm rstd (dim {dim}) rel L2"), rel_l2(&gpu.download(&grs)?, &rs), TOL_ELEM, "");
        // The backward from the GPU's own y (the layer saves it), against the CPU on the same y.
        fox_kernels::delta_rule::l2norm_bwd(&mut dx, &dy, &ygpu, &rs, dim)?;
        dr::l2norm_bwd(gpu, &mut gdx, &gdy, &gy, &grs, rows, dim)?;
        c.add(&name, &format!("l2norm dx (dim {dim}) rel L2"), rel_l2(&down(gpu, &gdx)?, &dx), tol, "");
    }
    // The decay: a in T, g and dg in f32; one value in softplus's linear range.
    let (rows, h) = (517, 6);
    let mut a = c.randn(rows * h, 2.0);
    a[7] = 30.0;
    let a = rounded::<T>(a);
    let a_log: Vec<f32> = (0..h).map(|_| c.rng.gen_range(0.0..2.7f32)).collect();
    let bias: Vec<f32> = (0..h).map(|_| c.rng.gen_range(-6.0..-2.0f32)).collect();
    let dg = c.randn(rows * h, 1.0);
    let mut dt = vec![0.0; rows * h];
    fox_kernels::ssd::dt_fwd(&mut dt, &a, h, &bias)?;
    let g: Vec<f32> = dt.iter().enumerate().map(|(i, d)| d * -a_log[i % h].exp()).collect();
    let ddt: Vec<f32> = dg.iter().enumerate().map(|(i, d)| d * -a_log[i % h].exp()).collect();
    let (mut da, mut dbias) = (vec![0.0; rows * h], vec![0.5f32; h]);
    fox_kernels::ssd::dt_bwd(&mut da, h, &mut dbias, &ddt, &a, &bias)?;
    let mut dalog = vec![0.0f64; h];
    for i in 0..rows * h {
        dalog[i % h] += (dg[i] * dt[i]) as f64;
    }
    let dalog: Vec<f32> = dalog.iter().enumerate().map(|(j, s)| 0.25 + (*s as f32) * -a_log[j].exp()).collect();
    let (ga, galog, gbias, gdg) = (up::<T>(gpu, &a)?, gpu.upload(&a_log)?, gpu.upload(&bias)?, gpu.upload(&dg)?);
    let mut gg = gpu.zeros::<f32>(rows * h)?;
    dr::decay_fwd(gpu, &mut gg, &ga, &galog, &gbias, rows)?;
    c.add(&name, "decay g rel L2", rel_l2(&gpu.download(&gg)?, &g), TOL_ELEM, "");
    let (mut gda, mut gdl, mut gdb) =
        (gpu.zeros::<T>(rows * h)?, gpu.upload(&vec![0.25f32; h])?, gpu.upload(&vec![0.5f32; h])?);
    let mut sc = gpu.zeros::<f32>(dr::decay_bwd_scratch_len(rows, h))?;
    dr::decay_bwd(gpu, &mut gda, &mut gdl, &mut gdb, &mut sc, &gdg, &ga, &galog, &gbias, rows)?;
    c.add(&name, "decay da rel L2", rel_l2(&down(gpu, &gda)?, &da), tol, "");
    c.add(&name, "decay dA_log rel L2", rel_l2(&gpu.download(&gdl)?, &dalog), TOL_ELEM, "");
    c.add(&name, "decay ddt_bias rel L2", rel_l2(&gpu.download(&gdb)?, &dbias), TOL_ELEM, "");
    // The swish gate.
    let m = 5000;
    let (x, gate, dy) = (rounded::<T>(c.randn(m, 1.0)), rounded::<T>(c.randn(m, 3.0)), rounded::<T>(c.randn(m, 1.0)));
    let sig = |z: f32| fox_kernels::scalar::sigmoid(z);
    let y: Vec<f32> = (0..m).map(|i| x[i] * fox_kernels::scalar::silu(gate[i])).collect();
    let dx: Vec<f32> = (0..m).map(|i| dy[i] * gate[i] * sig(gate[i])).collect();
    let dgt: Vec<f32> = (0..m).map(|i| dy[i] * x[i] * sig(gate[i]) * (1.0 + gate[i] * (1.0 - sig(gate[i])))).collect();
    let (gx, ggt, gdy) = (up::<T>(gpu, &x)?, up::<T>(gpu, &gate)?, up::<T>(gpu, &dy)?);
    let (mut gy, mut gdx, mut gdg) = (gpu.zeros::<T>(m)?, gpu.zeros::<T>(m)?, gpu.zeros::<T>(m)?);
    dr::swish_gate_fwd(gpu, &mut gy, &gx, &ggt, m)?;
    dr::swish_gate_bwd(gpu, &mut gdx, &mut gdg, &gdy, &gx, &ggt, m)?;
    c.add(&name, "swish gate y rel L2", rel_l2(&down(gpu, &gy)?, &y), tol, "");
    c.add(&name, "swish gate dx rel L2", rel_l2(&down(gpu, &gdx)?, &dx), tol, "");
    c.add(&name, "swish gate dgate rel L2", rel_l2(&down(gpu, &gdg)?, &dgt), tol, "");
    Ok(())
}

fn shapes() -> Vec<(&'static str, Shape)> {
    vec![
        (
            "B2 T300 H3 K64 V64 gated pad init",
            Shape { b: 2, t: 300, h: 3, k: 64, v: 64, gated: true, start: Some(vec![0, 70]), init: true },
        ),
        (
            "B2 T200 H2 K128 V128 gated pad",
            Shape { b: 2, t: 200, h: 2, k: 128, v: 128, gated: true, start: Some(vec![130, 0]), init: false },
        ),
        ("B1 T64 H2 K128 V128", Shape { b: 1, t: 64, h: 2, k: 128, v: 128, gated: false, start: None, init: false }),
        (
            "B2 T130 H4 K64 V96 pad init",
            Shape { b: 2, t: 130, h: 4, k: 64, v: 96, gated: false, start: Some(vec![5, 0]), init: true },
        ),
        (
            "B1 T50 H2 K16 V32 gated (T < L)",
            Shape { b: 1, t: 50, h: 2, k: 16, v: 32, gated: true, start: None, init: false },
        ),
        (
            "B1 T2048 H2 K128 V128 gated init",
            Shape { b: 1, t: 2048, h: 2, k: 128, v: 128, gated: true, start: None, init: true },
        ),
    ]
}

/// Every delta-rule row, f32 and bf16.
pub fn run_all(gpu: &Gpu, seed: u64) -> Vec<CheckRow> {
    let mut c = Ctx::new(gpu, seed ^ 0xde17a);
    for (name, s) in shapes() {
        for bf in [false, true] {
            // bf16 through each forward walk that runs here (the backward reruns it).
            let walks: &[Option<dr::FwdWalk>] = if !bf {
                &[None]
            } else if dr::wgmma_walk_runs(gpu, s.k) {
                &dr::WALKS.map(Some)
            } else {
                &[Some(dr::FwdWalk::MmaSync)]
            };
            for &w in walks {
                let (ty, walk) = match w {
                    None => ("f32", ""),
                    Some(dr::FwdWalk::Wgmma) => ("bf16", " [wgmma walk]"),
                    Some(dr::FwdWalk::MmaSync) => ("bf16", " [mma walk]"),
                };
                let case_name = format!("delta rule fwd {ty}{walk} {name}");
                dr::set_fwd_walk(w);
                c.case(&case_name, |c, n| if bf { case::<half::bf16>(c, n, &s) } else { case::<f32>(c, n, &s) });
            }
            dr::set_fwd_walk(None);
        }
    }
    for bf in [false, true] {
        c.case("delta rule ops", |c, _| if bf { small_ops::<half::bf16>(c) } else { small_ops::<f32>(c) });
    }
    c.rows
}

/// Forward and forward + backward times (ms, medians of `iters` after `warmup`, CUDA events) of
/// the delta rule at [B, T, H, K, V], with the decay when `gated`, bf16; and each kernel alone
/// ([`dr::kernel_ms`]).
pub fn bench(
    gpu: &Gpu,
    (b, t, h, kd, vd): (usize, usize, usize, usize, usize),
    gated: bool,
    warmup: usize,
    iters: usize,
) -> Result<(f64, f64, [f64; 6])> {
    type T = half::bf16;
    let mut c = Ctx::new(gpu, 1);
    let n = b * t * h;
    let (q, k) = (unit_rows::<T>(&mut c, n, kd), unit_rows::<T>(&mut c, n, kd));
    let v = c.randn(n * vd, 1.0);
    let beta: Vec<f32> = (0..n).map(|_| c.rng.gen_range(0.05..0.95f32)).collect();
    let g = gated.then(|| (0..n).map(|_| -c.rng.gen_range(0.001..0.4f32)).collect::<Vec<_>>());
    let cpu = host_problem((b, t, h, kd, vd), [&q, &k, &v, &beta], g.as_deref(), None);
    let inputs = DevInputs::<T>::upload(gpu, &cpu)?;
    let dev = inputs.problem(&cpu);
    let mut o = gpu.zeros::<T>(n * vd)?;
    let mut sc = gpu.zeros::<f32>(dr::fwd_scratch_len::<T>(b, t, h, kd, vd))?;
    let fwd = fox_kernels::cuda::time_ms(gpu, warmup, iters, || dr::delta_rule_fwd(gpu, &dev, &mut o, None, &mut sc))?;
    drop(sc);
    let gdo = up::<T>(gpu, &c.randn(n * vd, 1.0))?;
    let mut bsc = gpu.zeros::<f32>(dr::bwd_scratch_len::<T>(b, t, h, kd, vd))?;
    // dq, dk, dv, dβ; dg with the decay.
    let mut bufs = [gpu.zeros::<T>(n * kd)?, gpu.zeros::<T>(n * kd)?, gpu.zeros::<T>(n * vd)?, gpu.zeros::<T>(n)?];
    let mut dg = gpu.zeros::<f32>(n)?;
    let fb = fox_kernels::cuda::time_ms(gpu, warmup, iters, || {
        dr::delta_rule_fwd(gpu, &dev, &mut o, None, &mut bsc)?;
        dr::delta_rule_bwd(gpu, &dev, &gdo, None, None, bench_grads(&mut bufs, gated.then_some(&mut dg)), &mut bsc)
    })?;
    let grads = bench_grads(&mut bufs, gated.then_some(&mut dg));
    let steps = dr::kernel_ms(gpu, &dev, &mut o, &gdo, grads, &mut bsc, warmup, iters)?;
    Ok((fwd, fb, steps))
}

/// The benchmark's gradient buffers (dq, dk, dv, dβ) and dg as the backward takes them (no dinit).
fn bench_grads<'a, T: Elem>(
    [dq, dk, dv, dbeta]: &'a mut [CudaSlice<T>; 4],
    dg: Option<&'a mut CudaSlice<f32>>,
) -> DevDeltaRuleGrads<'a, T> {
    DevDeltaRuleGrads { dq, dk, dv, dbeta, dg, dinit: None }
}
