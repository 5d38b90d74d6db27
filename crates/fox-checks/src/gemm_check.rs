//! GPU check of the cuBLASLt GEMMs ([`fox_kernels::cuda::gemm`]) against [`fox_kernels::matmul`] and of the f32
//! Forgetting Attention ([`fox_kernels::cuda::attention_f32`]) against [`fox_kernels::attention`], on fresh random
//! inputs, as rows of the GPU check's pass/fail table.
//!
//! Errors are relative L2 norms ‖gpu − cpu‖ / ‖cpu‖ unless the metric says otherwise. Tolerances:
//! - GEMM, f32: 1e-5 (growing with √inner above 4096 terms). Same inputs; only the fp32
//!   summation order differs (≈ 2^-24·√inner relative: 5e-7 at 768, 4.5e-6 at 50257).
//! - GEMM, bf16 inputs with a bf16 output: 1e-2. The CPU gets the same bf16-rounded inputs (and
//!   accumulator start), so the products are exact in fp32 and the error is the output's rounding
//!   to bf16 (8 bits: ≤ 2^-9 per element, ≈ 1e-3 RMS).
//! - GEMM, bf16 inputs with an f32 output (dw, logits): 1e-4. Nothing is rounded but the fp32
//!   sums, so only summation order differs; 1e-4 leaves room for cuBLASLt's split-K order.
//! - Determinism: repeated runs must agree bitwise (count of differing elements, tolerance 0),
//!   and a repeated problem must not query the heuristic again.
//! - f32 attention: 2e-5 (o, dq, dk, dv, dc) and max |Δ| 2e-5 (lse): fp32 sums of the same terms
//!   in another order over at most 200 keys (≤ 1.2e-6 measured on a host emulation of the
//!   kernels). The skipped (padding, causal, ACP) entries must be exactly the CPU's: the ACP
//!   cases with a fixed aggressive threshold prune tiles whose mass moves o by about 1e-3, 50×
//!   the tolerance (the note says how much), so any other choice fails.

use crate::check::{bits_differ, host_prefix_fwd, lse_err, rel_l2, CheckRow, Table};
use crate::ssd_check::{rounded as round, upload_as as up};
use anyhow::Result;
use fox_kernels::attention::{self as ca, Problem, View, Visibility};
use fox_kernels::cuda::attention::AttnOptions;
use fox_kernels::cuda::attention_f32::{backward_f32, forward_f32, F32Grads, F32Problem};
use fox_kernels::cuda::gemm::{Gemm, GemmOp};
use fox_kernels::cuda::{Elem, Gpu};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

fn randn(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.sample::<f32, _>(StandardNormal)).collect()
}

// ---------------------------------------------------------------- GEMM

fn down<E: Elem>(gpu: &Gpu, x: &cudarc::driver::CudaSlice<E>, n: usize) -> Result<Vec<f32>> {
    Ok(gpu.download(x)?.iter().take(n).map(|v| v.to_f32()).collect())
}

fn algo_note<T: Elem, Y: Elem>(g: &Gemm, op: GemmOp, m: usize, k: usize, n: usize) -> String {
    match g.algo_info::<T, Y>(op, m, k, n) {
        Some(a) => format!("split-K {} reduction {}", a.split_k, a.reduction),
        None => String::new(),
    }
}

/// Tolerance of an f32 GEMM with inner dimension `inner`: two fp32 summation orders differ by
/// about 2^-24·√inner relative (simulated: 4.5e-6 at 50257 for one sequential order), so 1e-5
/// up to 4096 terms and growing with √inner beyond (3.5e-5 for the output head's dx).
fn f32_tol(inner: usize) -> f64 {
    1e-5 * (inner as f64 / 4096.0).sqrt().max(1.0)
}

/// All three products of one Linear shape in element type T against the CPU; `tol` for outputs
/// in T, `tol32` for f32 outputs (for T = f32 both are scaled by [`f32_tol`]'s inner-size rule).
fn gemm_case<T: Elem>(
    gpu: &Gpu,
    g: &Gemm,
    (m, k, n): (usize, usize, usize),
    tol: f64,
    tol32: f64,
    rng: &mut ChaCha8Rng,
    out: &mut Table,
) -> Result<()> {
    let x = round::<T>(randn(rng, m * k));
    let w = round::<T>(randn(rng, n * k));
    let dy = round::<T>(randn(rng, m * n));
    let (xd, wd, dyd) = (up::<T>(gpu, &x)?, up::<T>(gpu, &w)?, up::<T>(gpu, &dy)?);
    let is_f32 = T::NAME == "f32";

    // forward, output in T, then (for bf16) in f32
    for accumulate in [false, true] {
        let y0 = round::<T>(randn(rng, m * n));
        let mut yd = up::<T>(gpu, &y0)?;
        g.linear_fwd::<T, T>(&mut yd, accumulate, &xd, &wd, m, k, n)?;
        let mut r = y0.clone();
        fox_kernels::matmul::gemm_strided(m, n, k, &mut r, n, accumulate, &x, k, 1, &w, 1, k);
        let e = rel_l2(&down(gpu, &yd, m * n)?, &r);
        let metric = if accumulate { "fwd y += x·wᵀ" } else { "fwd y = x·wᵀ" };
        out.add(metric, e, if is_f32 { f32_tol(k) } else { tol }, algo_note::<T, T>(g, GemmOp::Fwd, m, k, n));
        if !is_f32 {
            let y0 = randn(rng, m * n);
            let mut yd = gpu.upload(&y0)?;
            g.linear_fwd::<T, f32>(&mut yd, accumulate, &xd, &wd, m, k, n)?;
            let mut r = y0.clone();
            fox_kernels::matmul::gemm_strided(m, n, k, &mut r, n, accumulate, &x, k, 1, &w, 1, k);
            let e = rel_l2(&down(gpu, &yd, m * n)?, &r);
            let metric = if accumulate { "fwd f32 out y += x·wᵀ" } else { "fwd f32 out y = x·wᵀ" };
            out.add(metric, e, tol32, algo_note::<T, f32>(g, GemmOp::Fwd, m, k, n));
        }
    }
    // dx, both ways; dw (always accumulated, f32)
    for accumulate in [false, true] {
        let dx0 = round::<T>(randn(rng, m * k));
        let mut dxd = up::<T>(gpu, &dx0)?;
        g.linear_bwd_dx::<T>(&mut dxd, accumulate, &dyd, &wd, m, k, n)?;
        // the product linear_bwd uses for dx (it always computes dw too; checked below)
        let mut r = dx0.clone();
        fox_kernels::matmul::gemm_strided(m, k, n, &mut r, k, accumulate, &dy, n, 1, &w, k, 1);
        let e = rel_l2(&down(gpu, &dxd, m * k)?, &r);
        let metric = if accumulate { "dx += dy·w" } else { "dx = dy·w" };
        out.add(metric, e, if is_f32 { f32_tol(n) } else { tol }, algo_note::<T, T>(g, GemmOp::Dx, m, k, n));
    }
    let dw0 = randn(rng, n * k);
    let mut dwd = gpu.upload(&dw0)?;
    g.linear_bwd_dw::<T>(&mut dwd, &dyd, &xd, m, k, n)?;
    let mut rdw = dw0.clone();
    let mut rdx = vec![0.0f32; m * k];
    fox_kernels::matmul::linear_bwd(Some(&mut rdx), false, &mut rdw, true, &dy, &x, &w, m, k, n);
    let e = rel_l2(&down(gpu, &dwd, n * k)?, &rdw);
    out.add(
        "dw += dyᵀ·x (f32)",
        e,
        if is_f32 { f32_tol(m) } else { tol32 },
        algo_note::<T, f32>(g, GemmOp::Dw, m, k, n),
    );
    Ok(())
}

/// Bitwise repeatability of one bf16 product per op, and no heuristic query on repeats.
fn determinism(gpu: &Gpu, g: &Gemm, rng: &mut ChaCha8Rng, out: &mut Table) -> Result<()> {
    use half::bf16;
    // dw over many tokens into a small weight: the shape where split-K is likeliest
    let (m, k, n) = (4096, 768, 768);
    let x = up::<bf16>(gpu, &randn(rng, m * k))?;
    let dy = up::<bf16>(gpu, &randn(rng, m * n))?;
    let mut outs = Vec::new();
    for _ in 0..2 {
        let mut dw = gpu.zeros::<f32>(n * k)?;
        g.linear_bwd_dw::<bf16>(&mut dw, &dy, &x, m, k, n)?;
        outs.push(gpu.download(&dw)?);
    }
    out.add(
        &format!("dw m={m} k={k} n={n}: repeat bitwise"),
        bits_differ(&outs[0], &outs[1]),
        0.0,
        algo_note::<bf16, f32>(g, GemmOp::Dw, m, k, n),
    );
    // the output head's forward and dx
    let (m, k, n) = (256, 768, 50257);
    let x = up::<bf16>(gpu, &randn(rng, m * k))?;
    let w = up::<bf16>(gpu, &randn(rng, n * k))?;
    let dy = up::<bf16>(gpu, &randn(rng, m * n))?;
    let q0 = g.heuristic_queries();
    let mut outs = Vec::new();
    let mut dxs = Vec::new();
    for _ in 0..2 {
        let mut y = gpu.zeros::<f32>(m * n)?;
        g.linear_fwd::<bf16, f32>(&mut y, false, &x, &w, m, k, n)?;
        outs.push(gpu.download(&y)?);
        let mut dx = gpu.zeros::<bf16>(m * k)?;
        g.linear_bwd_dx::<bf16>(&mut dx, false, &dy, &w, m, k, n)?;
        dxs.push(gpu.download(&dx)?);
    }
    out.add(&format!("head fwd m={m} n={n}: repeat bitwise"), bits_differ(&outs[0], &outs[1]), 0.0, String::new());
    // bf16: its own bits, not those of f32 images (a NaN's payload would not survive).
    let diff = dxs[0].iter().zip(&dxs[1]).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
    out.add(&format!("head dx m={m} n={n}: repeat bitwise"), diff as f64, 0.0, String::new());
    let q = g.heuristic_queries() - q0;
    out.add(
        "heuristic queries for 2 problems run twice (expect 2)",
        (q as f64 - 2.0).abs(),
        0.0,
        format!("{q} queries"),
    );
    Ok(())
}

/// The `_view` entry points on row chunks [0, 7) and [7, 300) (offsets that are not 256-byte
/// aligned): forward into f32 logits (n = 12), dx, and dw accumulated chunk by chunk, in bf16.
fn views(gpu: &Gpu, g: &Gemm, rng: &mut ChaCha8Rng, out: &mut Table) -> Result<()> {
    use half::bf16;
    let (m, k) = (300, 768);
    let cut = 7;
    for n in [12, 2304] {
        let x = round::<bf16>(randn(rng, m * k));
        let w = round::<bf16>(randn(rng, n * k));
        let dy = round::<bf16>(randn(rng, m * n));
        let (xd, wd, dyd) = (up::<bf16>(gpu, &x)?, up::<bf16>(gpu, &w)?, up::<bf16>(gpu, &dy)?);
        let mut yd = gpu.zeros::<f32>(m * n)?;
        let mut dxd = gpu.zeros::<bf16>(m * k)?;
        let mut dwd = gpu.zeros::<f32>(n * k)?;
        for (r0, r1) in [(0, cut), (cut, m)] {
            let rows = r1 - r0;
            let xv = xd.slice(r0 * k..r1 * k);
            let dyv = dyd.slice(r0 * n..r1 * n);
            g.linear_fwd_view::<bf16, f32>(&mut yd.slice_mut(r0 * n..r1 * n), false, &xv, &wd, rows, k, n)?;
            g.linear_bwd_dx_view::<bf16>(&mut dxd.slice_mut(r0 * k..r1 * k), false, &dyv, &wd, rows, k, n)?;
            g.linear_bwd_dw_view::<bf16>(&mut dwd, &dyv, &xv, rows, k, n)?;
        }
        let mut ry = vec![0.0f32; m * n];
        fox_kernels::matmul::linear_fwd(&mut ry, &x, &w, m, k, n);
        let (mut rdx, mut rdw) = (vec![0.0f32; m * k], vec![0.0f32; n * k]);
        fox_kernels::matmul::linear_bwd(Some(&mut rdx), false, &mut rdw, true, &dy, &x, &w, m, k, n);
        out.add(
            &format!("views n={n}: fwd f32 out by row chunks"),
            rel_l2(&gpu.download(&yd)?, &ry),
            1e-4,
            String::new(),
        );
        out.add(&format!("views n={n}: dx by row chunks"), rel_l2(&down(gpu, &dxd, m * k)?, &rdx), 1e-2, String::new());
        out.add(
            &format!("views n={n}: dw += over row chunks"),
            rel_l2(&gpu.download(&dwd)?, &rdw),
            1e-4,
            String::new(),
        );
    }
    Ok(())
}

/// The GEMM cases: Linear shapes (tokens m; inputs k; outputs n), both element types.
pub fn gemm_shapes() -> Vec<(usize, usize, usize)> {
    let mut v = Vec::new();
    for m in [1, 7, 300] {
        for (k, n) in [(64, 768), (768, 2304), (2304, 768)] {
            v.push((m, k, n));
        }
    }
    v.push((300, 768, 12)); // forget-gate logits: d -> H
    v.push((7, 768, 50257)); // output head
    v.push((300, 768, 50257));
    v
}

fn run_gemm(gpu: &Gpu, seed: u64, rows: &mut Vec<CheckRow>) {
    let g = match Gemm::on(gpu) {
        Ok(g) => g,
        Err(e) => {
            rows.push(CheckRow::failed("GEMM (cuBLASLt)", &e));
            return;
        }
    };
    for (i, &(m, k, n)) in gemm_shapes().iter().enumerate() {
        for dt in ["f32", "bf16"] {
            let case = format!("GEMM {dt} m={m} k={k} n={n}");
            let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_mul(1_000_003).wrapping_add(2 * i as u64));
            let mut r = Table { rows, case: case.clone() };
            let res = if dt == "f32" {
                gemm_case::<f32>(gpu, &g, (m, k, n), 1e-5, 1e-5, &mut rng, &mut r)
            } else {
                gemm_case::<half::bf16>(gpu, &g, (m, k, n), 1e-2, 1e-4, &mut rng, &mut r)
            };
            if let Err(e) = res {
                rows.push(CheckRow::failed(&case, &e));
            }
        }
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0ffe);
    let mut r = Table { rows, case: "GEMM bf16 views m=300 k=768".into() };
    if let Err(e) = views(gpu, &g, &mut rng, &mut r) {
        rows.push(CheckRow::failed("GEMM bf16 views", &e));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let mut r = Table { rows, case: "GEMM bf16 determinism".into() };
    if let Err(e) = determinism(gpu, &g, &mut rng, &mut r) {
        rows.push(CheckRow::failed("GEMM bf16 determinism", &e));
    }
}

// ---------------------------------------------------------------- f32 attention

/// One f32 attention case.
#[derive(Clone, Debug)]
pub struct AttnCase {
    pub name: &'static str,
    pub b: usize,
    pub h: usize,
    pub t: usize,
    pub d: usize,
    /// forget-gate logit bias: +6 weak forgetting, −3 strong
    pub gate_bias: f32,
    /// left-padding starts per batch row
    pub starts: Option<Vec<usize>>,
    pub acp: Acp,
    /// k/v heads (grouped-query attention when < h)
    pub hkv: usize,
    /// sliding window, None: every earlier key
    pub window: Option<usize>,
}

/// ACP thresholds of a case.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Acp {
    Off,
    /// the model's: δ = −(2U + ln T) + ln ε with ε = e^-10, U from the q and k norms
    Bound,
    /// the same δ for every (b, h): aggressive values prune tiles that carry real mass, so a
    /// kernel that skipped other entries than the CPU would show errors far above tolerance
    Fixed(f32),
}

pub fn attention_cases() -> Vec<AttnCase> {
    use Acp::*;
    let c = |name, b, h, t, d, gate_bias, starts: Option<Vec<usize>>, acp| AttnCase {
        name,
        b,
        h,
        t,
        d,
        gate_bias,
        starts,
        acp,
        hkv: h,
        window: None,
    };
    let gw = |s: AttnCase, hkv, window| AttnCase { hkv, window, ..s };
    vec![
        c("f32 attention T=1 d32 weak gates", 2, 2, 1, 32, 6.0, None, Off),
        c("f32 attention T=37 d64 strong gates", 2, 3, 37, 64, -3.0, None, Off),
        c("f32 attention T=200 d128 weak gates", 1, 2, 200, 128, 6.0, None, Off),
        c("f32 attention T=200 d32 strong gates", 2, 2, 200, 32, -3.0, None, Off),
        c("f32 attention T=100 d48 gates bias 2", 1, 3, 100, 48, 2.0, None, Off),
        c("f32 attention T=70 d256 gates bias 0", 1, 2, 70, 256, 0.0, None, Off),
        c("f32 attention T=200 d64 left padding", 3, 2, 200, 64, 1.0, Some(vec![0, 37, 199]), Off),
        c("f32 attention T=37 d128 left padding", 2, 2, 37, 128, 4.0, Some(vec![5, 0]), Off),
        c("f32 attention T=200 d32 ACP strong gates", 2, 2, 200, 32, -3.0, None, Bound),
        c("f32 attention T=37 d64 ACP weak gates", 1, 2, 37, 64, 6.0, None, Bound),
        c("f32 attention T=200 d128 ACP delta=-2", 2, 2, 200, 128, 2.0, None, Fixed(-2.0)),
        c("f32 attention T=200 d64 ACP delta=-4 left padding", 2, 2, 200, 64, 2.0, Some(vec![0, 70]), Fixed(-4.0)),
        gw(c("f32 attention GQA H=4 Hkv=2 T=200 d64", 2, 4, 200, 64, 2.0, None, Off), 2, None),
        gw(
            c("f32 attention GQA H=3 Hkv=1 T=100 d32 left padding", 2, 3, 100, 32, 1.0, Some(vec![0, 37]), Off),
            1,
            None,
        ),
        gw(c("f32 attention window w=1 T=37 d64", 1, 2, 37, 64, 0.0, None, Off), 2, Some(1)),
        gw(
            c("f32 attention window w=50 T=200 d128 left padding", 2, 2, 200, 128, 4.0, Some(vec![5, 0]), Off),
            2,
            Some(50),
        ),
        gw(c("f32 attention GQA+window H=4 Hkv=2 w=70 T=200 d64", 2, 4, 200, 64, 2.0, None, Off), 2, Some(70)),
        gw(
            c(
                "f32 attention GQA+window H=4 Hkv=1 w=100 ACP delta=-3",
                2,
                4,
                200,
                64,
                2.0,
                Some(vec![0, 20]),
                Fixed(-3.0),
            ),
            1,
            Some(100),
        ),
    ]
}

/// Inputs of one f32 attention case and the CPU reference's outputs.
pub struct AttnRef {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub dout: Vec<f32>,
    /// gate prefix sums [B, H, T]
    pub c: Vec<f32>,
    pub starts: Option<Vec<i32>>,
    pub thresholds: Option<Vec<f32>>,
    pub scale: f32,
    pub o: Vec<f32>,
    pub lse: Vec<f32>,
    pub dq: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
    /// dcq + dck
    pub dc: Vec<f32>,
    pub tiles_visited: usize,
    pub tiles_pruned: usize,
    /// relative L2 change of o that pruning makes (0 without ACP): how large an error a kernel
    /// that ignored ACP would show
    pub pruning_effect: f64,
}

/// Random inputs for `s` (q, k, v, dO ~ N(0, 1); gate logits N(0, 1) + bias) and the CPU's
/// forward and backward on them (ACP: ε = e^-10 with the bound from the q, k norms).
pub fn attention_reference(s: &AttnCase, seed: u64) -> AttnRef {
    let (b, h, t, d) = (s.b, s.h, s.t, s.d);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n = b * t * h * d;
    let nkv = b * t * s.hkv * d;
    let (q, k, v, dout) = (randn(&mut rng, n), randn(&mut rng, nkv), randn(&mut rng, nkv), randn(&mut rng, n));
    let logits: Vec<f32> = randn(&mut rng, b * t * h).iter().map(|z| z + s.gate_bias).collect();
    let mut a = vec![0.0; b * t * h];
    fox_kernels::fgate::log_fgate_fwd(&mut a, &logits);
    let per_row: Option<Vec<usize>> = s.starts.as_ref().map(|st| (0..b * t).map(|i| st[i / t]).collect());
    let c = host_prefix_fwd(&a, per_row.as_deref(), b, t, h);
    let scale = 1.0 / (d as f32).sqrt();
    let vis = match &s.starts {
        Some(st) => Visibility::LeftPadded(st),
        None => Visibility::All,
    };
    let mut p = Problem {
        batch: b,
        heads: h,
        kv_heads: s.hkv,
        window: s.window,
        head_dim: d,
        tq: t,
        tk: t,
        q_pos0: 0,
        q: View::bthd(&q, t, h, d),
        k: View::bthd(&k, t, s.hkv, d),
        v: View::bthd(&v, t, s.hkv, d),
        cq: &c,
        ck: &c,
        vis,
        scale,
        prune: None,
    };
    let thresholds = match s.acp {
        Acp::Off => None,
        Acp::Bound => Some(ca::prune_thresholds(&ca::logit_bound_from_norms(&p), t, -10.0)),
        Acp::Fixed(x) => Some(vec![x; b * h]),
    };
    let mut pruning_effect = 0.0;
    if thresholds.is_some() {
        let mut o_full = vec![0.0f32; n];
        ca::forward(&p, &mut o_full);
        p.prune = thresholds.as_deref();
        let mut o_pruned = vec![0.0f32; n];
        ca::forward(&p, &mut o_pruned);
        pruning_effect = rel_l2(&o_full, &o_pruned);
    }
    let mut o = vec![0.0f32; n];
    let stats = ca::forward(&p, &mut o);
    let g = ca::backward(&p, &o, &dout, &stats.lse);
    let dc = g.dcq.iter().zip(&g.dck).map(|(x, y)| x + y).collect();
    AttnRef {
        starts: s.starts.as_ref().map(|st| st.iter().map(|&x| x as i32).collect()),
        thresholds,
        scale,
        o,
        lse: stats.lse,
        dq: g.dq,
        dk: g.dk,
        dv: g.dv,
        dc,
        tiles_visited: stats.tiles_visited,
        tiles_pruned: stats.tiles_pruned,
        pruning_effect,
        q,
        k,
        v,
        dout,
        c,
    }
}

/// Tolerance of the f32 attention outputs (relative L2; lse: max |Δ|). A host emulation of the
/// kernels (their source compiled for the CPU) measured at most 1.2e-6 on every case.
const ATTN_TOL: f64 = 2e-5;

fn attention_case(gpu: &Gpu, s: &AttnCase, seed: u64, out: &mut Table) -> Result<()> {
    let (b, h, t, d) = (s.b, s.h, s.t, s.d);
    let n = b * t * h * d;
    let nkv = b * t * s.hkv * d;
    let opts = AttnOptions { kv_heads: Some(s.hkv), window: s.window };
    let r = attention_reference(s, seed);
    let (q, k, v, c, dout, scale) = (&r.q, &r.k, &r.v, &r.c, &r.dout, r.scale);
    let (qd, kd, vd, cd, dod) = (gpu.upload(q)?, gpu.upload(k)?, gpu.upload(v)?, gpu.upload(c)?, gpu.upload(dout)?);
    let start_d = match &r.starts {
        Some(st) => Some(gpu.upload(st)?),
        None => None,
    };
    let prune_d = match &r.thresholds {
        Some(th) => Some(gpu.upload(th)?),
        None => None,
    };
    let mut od = gpu.zeros::<f32>(n)?;
    let mut lsed = gpu.zeros::<f32>(b * h * t)?;
    let (st, pr) = (start_d.as_ref(), prune_d.as_ref());
    let p = F32Problem { b, h, t, d, opts, q: &qd, k: &kd, v: &vd, c: &cd, start: st, scale, prune: pr };
    forward_f32(gpu, p, &mut od, &mut lsed)?;
    let (mut dqd, mut dkd, mut dvd) = (gpu.zeros::<f32>(n)?, gpu.zeros::<f32>(nkv)?, gpu.zeros::<f32>(nkv)?);
    let mut dcd = gpu.zeros::<f32>(b * h * t)?;
    // the backward gets the GPU forward's o and lse, as in the model
    let grads = F32Grads { dq: &mut dqd, dk: &mut dkd, dv: &mut dvd, dc: &mut dcd };
    backward_f32(gpu, p, &od, &dod, &lsed, grads, None)?;
    gpu.sync()?;
    let note = if s.acp != Acp::Off {
        format!(
            "CPU pruned {} of {} key tiles; pruning moves o by {:.1e}",
            r.tiles_pruned,
            r.tiles_pruned + r.tiles_visited,
            r.pruning_effect
        )
    } else {
        String::new()
    };
    out.add("o", rel_l2(&gpu.download(&od)?, &r.o), ATTN_TOL, note);
    out.add("lse (max |Δ|)", lse_err(&gpu.download(&lsed)?, &r.lse), ATTN_TOL, String::new());
    out.add("dq", rel_l2(&gpu.download(&dqd)?, &r.dq), ATTN_TOL, String::new());
    out.add("dk", rel_l2(&gpu.download(&dkd)?, &r.dk), ATTN_TOL, String::new());
    out.add("dv", rel_l2(&gpu.download(&dvd)?, &r.dv), ATTN_TOL, String::new());
    out.add("dc = dcq + dck", rel_l2(&gpu.download(&dcd)?, &r.dc), ATTN_TOL, String::new());
    Ok(())
}

fn run_attention(gpu: &Gpu, seed: u64, rows: &mut Vec<CheckRow>) {
    for (i, s) in attention_cases().iter().enumerate() {
        let case_seed = seed.wrapping_mul(1_000_033).wrapping_add(i as u64);
        let mut r = Table { rows, case: s.name.into() };
        if let Err(e) = attention_case(gpu, s, case_seed, &mut r) {
            rows.push(CheckRow::failed(s.name, &e));
        }
    }
}

/// Every GEMM and f32-attention check; a case that errors is a failed row.
pub fn run_all(gpu: &Gpu, seed: u64) -> Vec<CheckRow> {
    let mut rows = Vec::new();
    run_gemm(gpu, seed, &mut rows);
    run_attention(gpu, seed, &mut rows);
    rows
}
