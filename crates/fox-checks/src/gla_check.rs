//! The GPU check of HGRN2's ops ([`fox_kernels::cuda::gla`]) against their CPU twins on fresh random inputs,
//! rows for `fox-attn check-ops` (case names begin with "gla" or "hgrn2"), and the GLA timing of
//! `fox-attn bench-gla`.
//!
//! The GLA's CPU twin is [`fox_kernels::gla`] (chunked, f32), on the same inputs rounded to T; the
//! gates' and lower bounds' are plain loops here with [`fox_kernels::scalar`]'s functions (foxlm's CPU
//! backend computes them so; fox-kernels cannot see it). Errors are relative L2 norms
//! ‖gpu − cpu‖ / ‖cpu‖. Tolerances, and why:
//! - GLA forward (o, final state), f32: 2e-5. Both sides are f32 with f32 sums, in other orders
//!   (the CPU's per-row loops vs the kernels' tiles; the GPU factors the products between
//!   sub-chunks through a reference point, the CPU takes e^{G_i − G_j} per element), the GPU
//!   with __expf (2 ulp, and an absolute error growing with |x|, at most about 1e-6 relative
//!   for the exponents of one chunk); the state carried over up to 5 chunks: ~1e-6 expected (the
//!   kernels against an f64 reference under host emulation: ≤ 1.6e-6).
//! - GLA backward (dq, dk, dv, dg, dinit), f32: 1e-4: the same, through twice as many sums; dg is a
//!   difference of such sums (q·dq − k·dk) summed again over the chunk (≤ 4.3e-6 under
//!   emulation, strong decays).
//! - bf16, CUDA cores (`tensor_cores: Some(false)`): the outputs o, dq, dk, dv and dg are rounded
//!   once to bf16 (relative rms 2⁻⁹/√3 ≈ 1.1e-3): 4e-3; the f32 outputs (final state, dinit) keep
//!   the f32 tolerances, both sides reading the same rounded inputs.
//! - bf16, tensor cores (`walk: Some(false)`): the products' operands are rounded to
//!   bf16 too (k ⊙ e^{G_L − G}, q ⊙ e^G, the states S_c and dH_c, the scores A), each a relative
//!   rms of 1.1e-3, in sums whose terms do not cancel: 1e-2 for every output and state; the gate's
//!   gradient, a difference of such sums (q·dq − k·dk) summed again, 3e-2. Under host emulation
//!   (PTX's fragment layouts): ≤ 2.9e-3, dg ≤ 9.7e-3 with strong decays.
//! - bf16, the walk (`walk: Some(true)`, the default for bf16): the tensor-core kernels'
//!   roundings (the walk rounds k ⊙ e^{G_L − G} and v as their chunk states do, its output kernel
//!   S_c, q ⊙ e^G and A), sums in other orders: their tolerances. Under host emulation: the same
//!   errors as the tensor-core kernels. With its
//!   forward's scores on tensor cores (`scores_tc: Some(true)`, the `tc-scores` rows): between
//!   sub-chunks the scores' operands q̃ and k ⊙ e^{G_r − G} rounded to bf16 too (one more relative
//!   rms of 1.1e-3 in a sum whose terms do not cancel): the same tolerances; under host emulation
//!   o moved by at most 2% of its error (2.821e-3 against 2.820e-3 at K = V = 128).
//! - Decode steps, gates, lower bounds: 1e-5 (f32: one formula per element, transcendentals
//!   within a few ulp of libm's; the lower bounds in f64 on both sides); bf16 outputs rounded
//!   once: 4e-3; the lower bound's gradient row (f32, fixed-order partial sums of 256 rows against
//!   the CPU's f64 sum): 1e-4.
//! - Determinism: forward and backward run twice; the metric is the number of elements whose bits
//!   differ, tolerance 0.

use crate::check::{bits_differ, upload_starts};
use crate::check::{CheckRow, Ctx};
use crate::ssd_check::{download_f32 as down, rel_l2, rounded, upload_as as up};
use anyhow::Result;
use cudarc::driver::CudaSlice;
use fox_kernels::cuda::gla::{self, DevGla, DevGlaGrads, GateInputs, GlaKernels};
use fox_kernels::cuda::{Elem, Gpu};
use fox_kernels::scalar::{log_sigmoid, sigmoid, silu};
use rand::Rng;

const TOL_FWD: f64 = 2e-5;
const TOL_BWD: f64 = 1e-4;
const TOL_ELEM: f64 = 1e-5;
const TOL_BF16: f64 = 4e-3;
const TOL_DLB: f64 = 1e-4;
const TOL_TC: f64 = 1e-2;
const TOL_TC_DG: f64 = 3e-2;

/// One GLA case's shape and inputs: B, T, H, K = V, left padding, an initial state (and a final
/// state's gradient), and the forget gate's range: g = logsigmoid(σ·z + μ), z ~ N(0, 1).
struct Shape {
    b: usize,
    t: usize,
    h: usize,
    d: usize,
    start: Option<Vec<usize>>,
    init: bool,
    gate: (f32, f32),
}

/// q, k = 1 − e^g (HGRN2's key), v, g, each rounded to T.
fn inputs<T: Elem>(c: &mut Ctx, s: &Shape) -> [Vec<f32>; 4] {
    let n = s.b * s.t * s.h * s.d;
    let z = c.randn(n, 1.0);
    let g: Vec<f32> = rounded::<T>(z.iter().map(|&x| log_sigmoid(s.gate.1 * x + s.gate.0)).collect());
    let k = rounded::<T>(g.iter().map(|&x| -x.exp_m1()).collect());
    [rounded::<T>(c.randn(n, 1.0)), k, rounded::<T>(c.randn(n, 1.0)), g]
}

/// The GLA problem [B, T, H, K = V = d] over host buffers q, k, v, g, scale 1/√d.
fn host_problem<'a>(
    (batch, seq, heads, d): (usize, usize, usize, usize),
    [q, k, v, g]: [&'a [f32]; 4],
    start: Option<&'a [usize]>,
) -> fox_kernels::gla::Gla<'a> {
    fox_kernels::gla::Gla { batch, seq, heads, k_dim: d, v_dim: d, q, k, v, g, scale: 1.0 / (d as f32).sqrt(), start }
}

/// A CPU GLA problem's inputs on the device (q, k, v, g in `T`, start as i32).
struct DevInputs<T: Elem> {
    q: CudaSlice<T>,
    k: CudaSlice<T>,
    v: CudaSlice<T>,
    g: CudaSlice<T>,
    start: Option<CudaSlice<i32>>,
}

impl<T: Elem> DevInputs<T> {
    fn upload(gpu: &Gpu, p: &fox_kernels::gla::Gla) -> Result<Self> {
        let start = upload_starts(gpu, p.start)?;
        Ok(Self { q: up(gpu, p.q)?, k: up(gpu, p.k)?, v: up(gpu, p.v)?, g: up(gpu, p.g)?, start })
    }

    /// The device problem of `p`'s sizes over these buffers, the kernels' default choice.
    fn problem(&self, p: &fox_kernels::gla::Gla) -> DevGla<'_, T> {
        DevGla {
            batch: p.batch,
            seq: p.seq,
            heads: p.heads,
            k_dim: p.k_dim,
            v_dim: p.v_dim,
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            scale: p.scale,
            start: self.start.as_ref(),
            tensor_cores: None,
            walk: None,
            scores_tc: None,
        }
    }
}

/// The GLA kernels a case or a timing runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GlaRun {
    /// One of the sets [`GlaKernels`] names, the walk's forward scores by gla_scores on the CUDA
    /// cores (the walk: bf16 only).
    Kernels(GlaKernels),
    /// The walk with the forward's scores on tensor cores, the walk in line with them or beside
    /// them on a second stream (the default, [`gla::set_overlap`]).
    WalkTcScores { beside: bool },
}

impl GlaRun {
    /// The problem `p` with these kernels chosen.
    fn problem<'a, T: Elem>(self, p: DevGla<'a, T>) -> DevGla<'a, T> {
        let (kernels, scores_tc) = match self {
            GlaRun::Kernels(k) => (k, false),
            GlaRun::WalkTcScores { .. } => (GlaKernels::Walk, true),
        };
        DevGla {
            tensor_cores: Some(kernels != GlaKernels::CudaCores),
            walk: Some(kernels == GlaKernels::Walk),
            scores_tc: Some(scores_tc),
            ..p
        }
    }
}

/// One case in T through `run`'s kernels.
fn gla_case<T: Elem>(c: &mut Ctx, name: &str, s: &Shape, run: GlaRun) -> Result<()> {
    let tc = run != GlaRun::Kernels(GlaKernels::CudaCores);
    let (b, t, h, d) = (s.b, s.t, s.h, s.d);
    let [q, k, v, g] = inputs::<T>(c, s);
    let ns = b * h * d * d;
    let init = s.init.then(|| c.randn(ns, 1.0));
    let cpu = host_problem((b, t, h, d), [&q, &k, &v, &g], s.start.as_deref());
    let (mut o, mut fin) = (vec![0.0; q.len()], vec![0.0; ns]);
    fox_kernels::gla::gla_fwd(&cpu, &mut o, init.as_deref(), Some(&mut fin))?;
    let gpu = c.gpu;
    let inputs = DevInputs::<T>::upload(gpu, &cpu)?;
    let ginit = init.as_ref().map(|i| gpu.upload(i)).transpose()?;
    let dev = run.problem(inputs.problem(&cpu));
    let bf = T::NAME == "bf16";
    // Outputs in T (o, dq, dk, dv, dg) and in f32 (states, dinit).
    let tol_t = |tol: f64| {
        if tc {
            TOL_TC
        } else if bf {
            TOL_BF16
        } else {
            tol
        }
    };
    let tol_f = |tol: f64| if tc { TOL_TC } else { tol };
    let mut go = gpu.zeros::<T>(o.len())?;
    let mut gf = gpu.zeros::<f32>(ns)?;
    let mut sc = gpu.zeros::<f32>(gla::gla_bwd_scratch_len(b, t, h, d, d))?;
    gla::gla_fwd(gpu, &dev, &mut go, ginit.as_ref(), Some(&mut gf), &mut sc)?;
    let (o1, f1) = (down(gpu, &go)?, gpu.download(&gf)?);
    c.add(name, "o rel L2 vs CPU chunked", rel_l2(&o1, &o), tol_t(TOL_FWD), "");
    c.add(name, "final state rel L2", rel_l2(&f1, &fin), tol_f(TOL_FWD), "");
    gla::gla_fwd(gpu, &dev, &mut go, ginit.as_ref(), Some(&mut gf), &mut sc)?;
    c.add(name, "forward determinism (rerun)", bits_differ(&o1, &down(gpu, &go)?), 0.0, "elements with other bits");
    // The walk in line with the scores, not beside them on a second stream (the default,
    // gla::set_overlap): the same bits.
    let overlap = tc && gla::uses_walk(&dev);
    if overlap {
        gla::set_overlap(Some(false));
        let r = gla::gla_fwd(gpu, &dev, &mut go, ginit.as_ref(), Some(&mut gf), &mut sc);
        gla::set_overlap(None);
        r?;
        let diff = bits_differ(&o1, &down(gpu, &go)?) + bits_differ(&f1, &gpu.download(&gf)?);
        c.add(name, "forward, walk in line = default", diff, 0.0, "elements with other bits");
    }
    // The state continued in place (a chunked prefill) is the same forward.
    if let Some(i) = &init {
        let mut st = gpu.upload(i)?;
        gla::gla_fwd_continuing(gpu, &dev, &mut go, &mut st, &mut sc)?;
        let diff = bits_differ(&o1, &down(gpu, &go)?) + bits_differ(&f1, &gpu.download(&st)?);
        c.add(name, "state in place vs init/final", diff, 0.0, "elements with other bits");
    }

    // Backward with a final state's gradient (when there is an initial state) and dinit out.
    let dout = rounded::<T>(c.randn(o.len(), 1.0));
    let dfin = init.as_ref().map(|_| c.randn(ns, 1.0));
    let n = q.len();
    let (mut dq, mut dk, mut dv, mut dg, mut dinit) =
        (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; ns]);
    let grads =
        fox_kernels::gla::GlaGrads { dq: &mut dq, dk: &mut dk, dv: &mut dv, dg: &mut dg, dinit: Some(&mut dinit) };
    fox_kernels::gla::gla_bwd(&cpu, &dout, init.as_deref(), dfin.as_deref(), grads)?;
    let gdo = up::<T>(gpu, &dout)?;
    let gdfin = dfin.as_ref().map(|f| gpu.upload(f)).transpose()?;
    let mut bufs = [gpu.zeros::<T>(n)?, gpu.zeros::<T>(n)?, gpu.zeros::<T>(n)?, gpu.zeros::<T>(n)?];
    let mut gdinit = gpu.zeros::<f32>(ns)?;
    let mut run = |bufs: &mut [CudaSlice<T>; 4], gdinit: &mut CudaSlice<f32>| -> Result<Vec<Vec<f32>>> {
        let [a, bb, cc, dd] = bufs;
        let grads = DevGlaGrads { dq: a, dk: bb, dv: cc, dg: dd, dinit: Some(gdinit) };
        gla::gla_bwd(gpu, &dev, &gdo, ginit.as_ref(), gdfin.as_ref(), grads, &mut sc)?;
        let mut out = Vec::new();
        for x in bufs.iter() {
            out.push(down(gpu, x)?);
        }
        out.push(gpu.download(gdinit)?);
        Ok(out)
    };
    let r1 = run(&mut bufs, &mut gdinit)?;
    for (what, got, want) in [("dq", &r1[0], &dq), ("dk", &r1[1], &dk), ("dv", &r1[2], &dv), ("dg", &r1[3], &dg)] {
        let tol = if tc && what == "dg" { TOL_TC_DG } else { tol_t(TOL_BWD) };
        c.add(name, &format!("{what} rel L2 vs CPU chunked"), rel_l2(got, want), tol, "");
    }
    let note = if dfin.is_some() { "with dfinal" } else { "" };
    c.add(name, "dinit rel L2", rel_l2(&r1[4], &dinit), tol_f(TOL_BWD), note);
    let r2 = run(&mut bufs, &mut gdinit)?;
    let diff: f64 = r1.iter().zip(&r2).map(|(a, b)| bits_differ(a, b)).sum();
    c.add(name, "backward determinism (rerun)", diff, 0.0, "elements with other bits");
    if overlap {
        gla::set_overlap(Some(false));
        let r3 = run(&mut bufs, &mut gdinit);
        gla::set_overlap(None);
        let diff: f64 = r1.iter().zip(&r3?).map(|(a, b)| bits_differ(a, b)).sum();
        c.add(name, "backward, walk in line = default", diff, 0.0, "elements with other bits");
    }
    Ok(())
}

/// Steps continuing a state, against the CPU's decode step: B = 2, H = 3, row 1 padding; f32.
fn decode_case(c: &mut Ctx, name: &str, d: usize) -> Result<()> {
    let (b, h, steps) = (2, 3, 5);
    let ns = b * h * d * d;
    let mut state = c.randn(ns, 1.0);
    let gpu = c.gpu;
    let mut gstate = gpu.upload(&state)?;
    let start = [0usize, 1];
    let (mut eo, mut es) = (0.0f64, 0.0f64);
    for _ in 0..steps {
        let s = Shape { b, t: 1, h, d, start: None, init: false, gate: (1.0, 2.0) };
        let [q, k, v, g] = inputs::<f32>(c, &s);
        let cpu = host_problem((b, 1, h, d), [&q, &k, &v, &g], Some(&start));
        let mut o = vec![0.0; b * h * d];
        fox_kernels::gla::gla_decode_step(&cpu, &mut state, &mut o)?;
        let inputs = DevInputs::<f32>::upload(gpu, &cpu)?;
        let dev = inputs.problem(&cpu);
        let mut go = gpu.zeros::<f32>(o.len())?;
        gla::gla_decode_step(gpu, &dev, &mut gstate, &mut go)?;
        eo = eo.max(rel_l2(&gpu.download(&go)?, &o));
        es = es.max(rel_l2(&gpu.download(&gstate)?, &state));
    }
    c.add(name, "o rel L2 (worst of 5 steps)", eo, TOL_ELEM, "row 1 padding");
    c.add(name, "state rel L2 (worst of 5 steps)", es, TOL_ELEM, "");
    Ok(())
}

/// The gates forward and backward in T, unbounded and with a lower-bound row (one entry near 0,
/// one near 1, the rest from the lower bounds' forward), against plain loops on T-rounded inputs.
fn gates_case<T: Elem>(c: &mut Ctx, name: &str, bounded: bool) -> Result<()> {
    let (rows, d) = (600, 96);
    let n = rows * d;
    let qin = rounded::<T>(c.randn(n, 2.0));
    let f = rounded::<T>(c.randn(n, 3.0));
    let row: Vec<f32> = (0..d)
        .map(|i| {
            if i == 0 {
                1e-6
            } else if i == 1 {
                0.999
            } else {
                c.rng.gen_range(0.0..1.0)
            }
        })
        .collect();
    let lb = bounded.then_some(&row[..]);
    // The CPU's formulas (foxlm's Cpu::hgrn2_gates_fwd).
    let (mut q, mut k, mut g) = (vec![0.0f32; n], vec![0.0f32; n], vec![0.0f32; n]);
    for i in 0..n {
        q[i] = silu(qin[i]);
        let ls = log_sigmoid(f[i]);
        g[i] = match lb {
            None => ls,
            Some(l) => {
                let (a, b) = (l[i % d].ln(), (-l[i % d]).ln_1p() + ls);
                a.max(b) + (-(a - b).abs()).exp().ln_1p()
            }
        };
        k[i] = -g[i].exp_m1();
    }
    let gpu = c.gpu;
    let (gqin, gf) = (up::<T>(gpu, &qin)?, up::<T>(gpu, &f)?);
    let glb = gpu.upload(&row)?;
    let lbrow = bounded.then_some((&glb, 0));
    let (mut gq, mut gk, mut gg) = (gpu.zeros::<T>(n)?, gpu.zeros::<T>(n)?, gpu.zeros::<T>(n)?);
    gla::hgrn2_gates_fwd(gpu, &mut gq, &mut gk, &mut gg, &gqin, &gf, lbrow, n, d)?;
    let tol = if T::NAME == "bf16" { TOL_BF16 } else { TOL_ELEM };
    let g_gpu = down(gpu, &gg)?;
    c.add(name, "q = silu(q_in) rel L2", rel_l2(&down(gpu, &gq)?, &q), tol, "");
    c.add(name, "g rel L2", rel_l2(&g_gpu, &g), tol, "");
    c.add(name, "k = 1 − e^g rel L2", rel_l2(&down(gpu, &gk)?, &k), tol, "");
    // Backward, from the GPU's g (what it reads), as foxlm's Cpu::hgrn2_gates_bwd.
    let (dq, dk, dg) = (rounded::<T>(c.randn(n, 1.0)), rounded::<T>(c.randn(n, 1.0)), rounded::<T>(c.randn(n, 1.0)));
    let (mut dqin, mut df, mut dl) = (vec![0.0f32; n], vec![0.0f32; n], vec![0.0f64; d]);
    for i in 0..n {
        let s = sigmoid(qin[i]);
        dqin[i] = dq[i] * s * (1.0 + qin[i] * (1.0 - s));
        let gv = g_gpu[i];
        let dgt = dg[i] - dk[i] * gv.exp();
        let sf = sigmoid(f[i]);
        df[i] = match lb {
            None => dgt * (1.0 - sf),
            Some(l) => {
                let inv = (-gv).exp();
                dl[i % d] += (dgt * (1.0 - sf) * inv) as f64;
                dgt * (1.0 - l[i % d]) * sf * (1.0 - sf) * inv
            }
        };
    }
    let (gdq, gdk, gdg) = (up::<T>(gpu, &dq)?, up::<T>(gpu, &dk)?, up::<T>(gpu, &dg)?);
    let (mut gdqin, mut gdf) = (gpu.zeros::<T>(n)?, gpu.zeros::<T>(n)?);
    let mut gdl = gpu.upload(&vec![5.0f32; 3 * d])?;
    let mut sc = gpu.zeros::<f32>(gla::hgrn2_gates_bwd_scratch_len(rows, d))?;
    let x = GateInputs { dq: &gdq, dk: &gdk, dg: &gdg, q_in: &gqin, f: &gf, g: &gg };
    let dlb = bounded.then_some((&mut gdl, d));
    gla::hgrn2_gates_bwd(gpu, &mut gdqin, &mut gdf, x, lbrow, dlb, &mut sc, rows, d)?;
    c.add(name, "dq_in rel L2", rel_l2(&down(gpu, &gdqin)?, &dqin), tol, "");
    c.add(name, "df rel L2", rel_l2(&down(gpu, &gdf)?, &df), tol, "");
    if bounded {
        let all = gpu.download(&gdl)?;
        let want: Vec<f32> = dl.iter().map(|&x| x as f32).collect();
        c.add(name, "dlb row rel L2", rel_l2(&all[d..2 * d], &want), TOL_DLB, "summed over 600 rows");
        let untouched = all[..d].iter().chain(&all[2 * d..]).filter(|&&x| x != 5.0).count();
        c.add(name, "other dlb rows untouched", untouched as f64, 0.0, "");
    }
    Ok(())
}

/// The lower bounds' forward and backward (f64 on both sides) against plain loops: L = 12, d = 300.
fn lower_bounds_case(c: &mut Ctx, name: &str) -> Result<()> {
    let (l, d) = (12, 300);
    let raw = c.randn(l * d, 2.0);
    let mut p = vec![0.0f64; l * d];
    for col in 0..d {
        let m = (0..l).map(|r| raw[r * d + col] as f64).fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = (0..l).map(|r| (raw[r * d + col] as f64 - m).exp()).sum();
        (0..l).for_each(|r| p[r * d + col] = (raw[r * d + col] as f64 - m).exp() / z);
    }
    let mut lb = vec![0.0f32; l * d];
    for col in 0..d {
        let mut s = 0.0;
        for r in 1..l {
            s += p[r * d + col];
            lb[r * d + col] = s as f32;
        }
    }
    let gpu = c.gpu;
    let graw = gpu.upload(&raw)?;
    let mut glb = gpu.upload(&vec![3.0f32; l * d])?;
    gla::hgrn2_lower_bounds_fwd(gpu, &mut glb, &graw, l)?;
    c.add(name, "lb rel L2", rel_l2(&gpu.download(&glb)?, &lb), TOL_ELEM, "");
    let dlb = c.randn(l * d, 1.0);
    let mut grad = vec![0.25f32; l * d];
    for col in 0..d {
        let mut dp = vec![0.0f64; l];
        let mut suf = 0.0;
        for j in (1..l).rev() {
            suf += dlb[j * d + col] as f64;
            dp[j] = suf;
        }
        let dot: f64 = (0..l).map(|j| p[j * d + col] * dp[j]).sum();
        (0..l).for_each(|j| grad[j * d + col] += (p[j * d + col] * (dp[j] - dot)) as f32);
    }
    let mut ggrad = gpu.upload(&vec![0.25f32; l * d])?;
    gla::hgrn2_lower_bounds_bwd(gpu, &mut ggrad, &gpu.upload(&dlb)?, &graw, l)?;
    c.add(name, "gradient (added) rel L2", rel_l2(&gpu.download(&ggrad)?, &grad), TOL_ELEM, "");
    Ok(())
}

pub fn run_all(gpu: &Gpu, seed: u64) -> Vec<CheckRow> {
    let mut c = Ctx::new(gpu, seed ^ 0x61a);
    let shapes = [
        // Row 1 starts mid-chunk (its first chunk padding only), an initial state and a final
        // state's gradient, T not a multiple of 64, K = V = 64.
        (
            "B2 T300 H2 K=V=64 pad init",
            Shape { b: 2, t: 300, h: 2, d: 64, start: Some(vec![0, 70]), init: true, gate: (1.0, 2.0) },
        ),
        // Strong decays: g from logsigmoid(4z − 4), down to about −20 (a lower bound near 0);
        // K = V = 32.
        (
            "B1 T200 H3 K=V=32 strong decay",
            Shape { b: 1, t: 200, h: 3, d: 32, start: None, init: false, gate: (-4.0, 4.0) },
        ),
        // Weak decays (g ≈ −1e-3, HGRN2's upper layers), HGRN2 125M's head width 128.
        (
            "B2 T130 H2 K=V=128 weak decay init",
            Shape { b: 2, t: 130, h: 2, d: 128, start: Some(vec![3, 0]), init: true, gate: (7.0, 0.3) },
        ),
        // The fla fixture's head width 8; K = V = 80 (two tiles, the second partial).
        (
            "B2 T77 H4 K=V=8 pad",
            Shape { b: 2, t: 77, h: 4, d: 8, start: Some(vec![0, 20]), init: false, gate: (0.5, 1.0) },
        ),
        ("B1 T90 H1 K=V=80 init", Shape { b: 1, t: 90, h: 1, d: 80, start: None, init: true, gate: (2.0, 1.5) }),
    ];
    for (shape, s) in &shapes {
        let cuda_cores = GlaRun::Kernels(GlaKernels::CudaCores);
        c.case(&format!("gla f32 {shape}"), |c, n| gla_case::<f32>(c, n, s, cuda_cores));
        let bf16 = |run| move |c: &mut Ctx, n: &str| gla_case::<half::bf16>(c, n, s, run);
        c.case(&format!("gla bf16 cuda-cores {shape}"), bf16(cuda_cores));
        c.case(&format!("gla bf16 tc {shape}"), bf16(GlaRun::Kernels(GlaKernels::TensorCores)));
        // The walk (its block width as FOXLM_GLA_KB says: run check-ops once per width).
        c.case(&format!("gla bf16 walk {shape}"), bf16(GlaRun::Kernels(GlaKernels::Walk)));
        c.case(&format!("gla bf16 walk tc-scores {shape}"), bf16(GlaRun::WalkTcScores { beside: false }));
    }
    for d in [32, 128] {
        c.case(&format!("gla decode B2 H3 K=V={d}"), |c, n| decode_case(c, n, d));
    }
    for bounded in [false, true] {
        let what = if bounded { "bounded" } else { "unbounded" };
        c.case(&format!("hgrn2 gates f32 {what}"), |c, n| gates_case::<f32>(c, n, bounded));
        c.case(&format!("hgrn2 gates bf16 {what}"), |c, n| gates_case::<half::bf16>(c, n, bounded));
    }
    c.case("hgrn2 lower bounds L12 d300", lower_bounds_case);
    c.rows
}

/// What `fox-attn bench-gla` and `foxlm bench gla` time, in order: (label, bf16 inputs, the
/// kernels [`bench`] runs).
pub const BENCH_RUNS: [(&str, bool, GlaRun); 6] = [
    (
        "bf16, walk + tensor-core scores, walk beside the scores (the default)",
        true,
        GlaRun::WalkTcScores { beside: true },
    ),
    (
        "bf16, walk + tensor-core scores, walk in line (FOXLM_GLA_OVERLAP=0)",
        true,
        GlaRun::WalkTcScores { beside: false },
    ),
    ("bf16, walk with gla_scores", true, GlaRun::Kernels(GlaKernels::Walk)),
    ("bf16, tensor cores", true, GlaRun::Kernels(GlaKernels::TensorCores)),
    ("bf16, cuda cores", true, GlaRun::Kernels(GlaKernels::CudaCores)),
    ("f32, cuda cores", false, GlaRun::Kernels(GlaKernels::CudaCores)),
];

/// Median ms (CUDA events, after warm-up) of the GLA forward and of forward + backward at
/// [B, T, H, K = V] on random inputs (g = logsigmoid of N(0, 1) + 2), no initial state, in T,
/// through `run`'s kernels; then each forward kernel alone ([`gla::fwd_kernel_ms`]).
pub fn bench<T: Elem>(
    gpu: &Gpu,
    (b, t, h, d): (usize, usize, usize, usize),
    warmup: usize,
    iters: usize,
    run: GlaRun,
) -> Result<(f64, f64, [f64; 4])> {
    let mut c = Ctx::new(gpu, 1);
    let s = Shape { b, t, h, d, start: None, init: false, gate: (2.0, 1.0) };
    let [q, k, v, g] = inputs::<T>(&mut c, &s);
    let cpu = host_problem((b, t, h, d), [&q, &k, &v, &g], None);
    let inputs = DevInputs::<T>::upload(gpu, &cpu)?;
    let dev = run.problem(inputs.problem(&cpu));
    gla::set_overlap(Some(run == GlaRun::WalkTcScores { beside: true }));
    let r = bench_timed(gpu, &mut c, &dev, &q, warmup, iters);
    gla::set_overlap(None);
    r
}

/// The timings of [`bench`] for one problem.
fn bench_timed<T: Elem>(
    gpu: &Gpu,
    c: &mut Ctx,
    dev: &DevGla<T>,
    q: &[f32],
    warmup: usize,
    iters: usize,
) -> Result<(f64, f64, [f64; 4])> {
    let (b, t, h, d) = (dev.batch, dev.seq, dev.heads, dev.k_dim);
    let n = q.len();
    let mut o = gpu.zeros::<T>(n)?;
    let mut sc = gpu.zeros::<f32>(gla::gla_bwd_scratch_len(b, t, h, d, d))?;
    let fwd = fox_kernels::cuda::time_ms(gpu, warmup, iters, || gla::gla_fwd(gpu, dev, &mut o, None, None, &mut sc))?;
    let stages = gla::fwd_kernel_ms(gpu, dev, &mut o, &mut sc, warmup, iters)?;
    let gdo = up::<T>(gpu, &c.randn(n, 1.0))?;
    let mut bufs = [gpu.zeros::<T>(n)?, gpu.zeros::<T>(n)?, gpu.zeros::<T>(n)?, gpu.zeros::<T>(n)?];
    let fb = fox_kernels::cuda::time_ms(gpu, warmup, iters, || {
        gla::gla_fwd(gpu, dev, &mut o, None, None, &mut sc)?;
        let [a, bb, cc, dd] = &mut bufs;
        let grads = DevGlaGrads { dq: a, dk: bb, dv: cc, dg: dd, dinit: None };
        gla::gla_bwd(gpu, dev, &gdo, None, None, grads, &mut sc)
    })?;
    Ok((fwd, fb, stages))
}
