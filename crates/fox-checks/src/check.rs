//! The GPU check: every mode of the CUDA Forgetting Attention against the CPU reference
//! ([`fox_kernels::attention`]) on fresh random inputs, printed as a pass/fail table.
//!
//! Inputs q, k, v, dO are drawn N(0, 1) and rounded to the GPU dtype first; the CPU gets the same
//! rounded values, so the errors measure only the kernels' arithmetic. Errors are relative L2
//! norms ‖gpu − cpu‖ / ‖cpu‖ unless the metric says otherwise. Tolerances, and why:
//! - o: bf16 1e-2, fp16 3e-3. The output is rounded to the dtype (bf16 keeps 8 bits: 2^-9 ≈ 2e-3
//!   relative per element) and P is rounded to the dtype before the P·V product.
//! - dq, dk, dv: bf16 2e-2, fp16 1e-2. As above, plus dS rounded to the dtype before dS·K and
//!   dSᵀ·Q, and delta = dO·O taken from the dtype-rounded O.
//! - dck (−column sums of dS, fp32) and d log f (its reverse prefix sum with dcq): 2e-2 / 1e-2,
//!   the same error sources; they are sums of fp32 products of dtype-rounded operands (the
//!   warp-specialised backward sums dS rounded to the dtype, as dK and dQ use it).
//! - lse: max |Δ| 2e-3 (fp32 statistics of exactly representable inputs; exp2 approximations).
//! - ACP on vs off: 2e-3. Pruned entries carry < e^-10 of each row's mass (SPEC §1), which moves
//!   an output by < 5e-5·max|v|; what is left is bf16 rounding of outputs whose last bit flips.
//! - decode vs tiled forward: 5e-3 (the same math summed in another order, both rounded to bf16).
//! - prefix sums: 1e-5 (fp32 sums in another order).
//!
//! Grouped-query attention (H_kv < H) and sliding-window cases use the same tolerances: a k/v
//! head's dk, dv sum the group's query heads in fp32 before the one rounding to the dtype, and the
//! window only masks entries.

use anyhow::Result;
use fox_kernels::attention::{self as ca, Problem, View, Visibility};
use fox_kernels::cuda::attention::{
    self as ga, AttnOptions, DType, DevGrads, DevProblem, DevView, DevVisibility, FwdKernel, TileStats,
};
use fox_kernels::cuda::{from_half_bits, to_half_bits, Gpu};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;

#[derive(Clone, Debug)]
pub struct CheckRow {
    pub case: String,
    pub metric: String,
    pub err: f64,
    pub tol: f64,
    pub pass: bool,
    pub note: String,
}

impl CheckRow {
    /// A row that passes when `err` is finite and at most `tol`.
    pub fn new(case: impl Into<String>, metric: &str, err: f64, tol: f64, note: impl Into<String>) -> Self {
        Self {
            case: case.into(),
            metric: metric.into(),
            err,
            tol,
            pass: err.is_finite() && err <= tol,
            note: note.into(),
        }
    }

    /// The failed row of a case that could not run.
    pub fn failed(case: impl Into<String>, e: &anyhow::Error) -> Self {
        Self::new(case, "run", f64::INFINITY, 0.0, format!("error: {e:#}"))
    }
}

/// The rows of a kernel check run and the random source of its inputs (the ops, SSD, GLA and
/// delta-rule checks).
pub(crate) struct Ctx<'a> {
    pub(crate) gpu: &'a Gpu,
    pub(crate) rng: ChaCha8Rng,
    pub(crate) rows: Vec<CheckRow>,
}

impl<'a> Ctx<'a> {
    pub(crate) fn new(gpu: &'a Gpu, seed: u64) -> Self {
        Self { gpu, rng: ChaCha8Rng::seed_from_u64(seed), rows: Vec::new() }
    }

    pub(crate) fn add(&mut self, case: &str, metric: &str, err: f64, tol: f64, note: &str) {
        self.rows.push(CheckRow::new(case, metric, err, tol, note));
    }

    pub(crate) fn randn(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| scale * self.rng.sample::<f32, _>(StandardNormal)).collect()
    }

    /// Runs one case; an error becomes a failed row.
    pub(crate) fn case(&mut self, name: &str, f: impl FnOnce(&mut Self, &str) -> Result<()>) {
        if let Err(e) = f(self, name) {
            self.rows.push(CheckRow::failed(name, &e));
        }
    }
}

#[derive(Clone, Debug)]
pub enum Gate {
    /// logit ~ N(0, 1) + bias for every head: +6 is slow forgetting (f ≈ 0.998), −3 strong.
    Bias(f32),
    /// per-head bias spread linearly over [−1, 9], plus N(0, 1) per token (the bench's gates).
    Mixed,
}

#[derive(Clone, Debug)]
pub enum Vis {
    All,
    LeftPad(Vec<usize>),
    /// document offsets per batch row
    Packed(Vec<Vec<usize>>),
}

#[derive(Clone, Debug)]
pub struct Spec {
    pub name: String,
    pub b: usize,
    pub h: usize,
    /// k/v heads (grouped-query attention when < h)
    pub hkv: usize,
    /// sliding window (keys i − w < j ≤ i), None: every earlier key
    pub window: Option<usize>,
    pub d: usize,
    pub t: usize,
    pub dtype: DType,
    pub gate: Gate,
    pub vis: Vis,
    pub acp: bool,
    pub bwd: bool,
    /// q, k, v interleaved in one [B, T, H + 2·H_kv, D] buffer ([B, T, 3, H, D] without GQA)
    pub packed_qkv: bool,
    /// only the last `tq` rows are queries (q_pos0 = t − tq); 0 = all rows
    pub tq: usize,
    /// decode-kernel case: compare the decode kernel with the tiled forward and the CPU
    pub decode: bool,
}

impl Spec {
    #[allow(clippy::too_many_arguments)]
    fn new(name: &str, b: usize, h: usize, d: usize, t: usize, dtype: DType, gate: Gate, vis: Vis) -> Self {
        Spec {
            name: name.into(),
            b,
            h,
            hkv: h,
            window: None,
            d,
            t,
            dtype,
            gate,
            vis,
            acp: false,
            bwd: true,
            packed_qkv: false,
            tq: 0,
            decode: false,
        }
    }
    /// The same case with `hkv` k/v heads and a window.
    fn gqa_window(mut self, hkv: usize, window: Option<usize>) -> Self {
        self.hkv = hkv;
        self.window = window;
        self
    }
    fn opts(&self) -> AttnOptions {
        AttnOptions { kv_heads: Some(self.hkv), window: self.window }
    }
}

/// The cases of the check, in table order.
pub fn cases() -> Vec<Spec> {
    use DType::*;
    use Gate::*;
    let mut v = vec![
        Spec::new("d64 bf16 slow gates (bias +6)", 2, 3, 64, 1000, Bf16, Bias(6.0), Vis::All),
        Spec::new("d128 bf16 strong gates (bias -3)", 2, 3, 128, 1000, Bf16, Bias(-3.0), Vis::All),
        Spec::new("d64 bf16 mixed gates T=777", 2, 4, 64, 777, Bf16, Mixed, Vis::All),
        Spec::new("d128 bf16 mixed gates", 1, 4, 128, 1100, Bf16, Mixed, Vis::All),
        Spec::new("d64 fp16 gates bias +2", 2, 2, 64, 700, F16, Bias(2.0), Vis::All),
        Spec::new("d128 fp16 gates bias 0", 2, 2, 128, 600, F16, Bias(0.0), Vis::All),
        Spec::new("d128 bf16 left padding", 2, 3, 128, 900, Bf16, Bias(2.0), Vis::LeftPad(vec![0, 333])),
        Spec::new("d64 bf16 left padding", 3, 2, 64, 700, Bf16, Bias(1.0), Vis::LeftPad(vec![5, 0, 650])),
        Spec::new(
            "d64 bf16 packed documents",
            2,
            3,
            64,
            1000,
            Bf16,
            Bias(1.0),
            Vis::Packed(vec![vec![0, 300, 301, 800], vec![0, 450]]),
        ),
        Spec::new(
            "d128 bf16 packed documents",
            1,
            2,
            128,
            1200,
            Bf16,
            Mixed,
            Vis::Packed(vec![vec![0, 129, 640, 1000]]),
        ),
    ];
    let mut s = Spec::new("d64 bf16 strided qkv [B,T,3,H,D]", 2, 3, 64, 500, Bf16, Bias(3.0), Vis::All);
    s.packed_qkv = true;
    v.push(s);
    let mut s = Spec::new("d128 bf16 chunk (q_pos0=700, tq=300)", 2, 2, 128, 1000, Bf16, Bias(2.0), Vis::All);
    s.tq = 300;
    v.push(s);
    for (name, d, gate, vis) in [
        ("ACP d64 bf16 strong gates", 64, Bias(-1.0), Vis::All),
        ("ACP d128 bf16 mixed gates", 128, Mixed, Vis::All),
        ("ACP d64 bf16 left padding", 64, Bias(0.0), Vis::LeftPad(vec![0, 700])),
        ("ACP d128 bf16 packed documents", 128, Bias(-1.0), Vis::Packed(vec![vec![0, 1000], vec![0, 77, 1500]])),
    ] {
        let mut s = Spec::new(name, 2, 2, d, 2048, DType::Bf16, gate, vis);
        s.acp = true;
        v.push(s);
    }
    for (name, d, tq, t, acp, vis) in [
        ("decode d64 tq=1", 64, 1, 3000, false, Vis::All),
        ("decode d128 tq=1 ACP", 128, 1, 4097, true, Vis::All),
        ("decode d128 tq=1 left padding", 128, 1, 2500, false, Vis::LeftPad(vec![0, 1234])),
        ("decode d128 tq=16 ACP", 128, 16, 4097, true, Vis::All),
        ("decode d64 tq=5 left padding", 64, 5, 2500, false, Vis::LeftPad(vec![0, 1234])),
        ("decode d128 tq=3 mixed ACP", 128, 3, 5000, true, Vis::All),
    ] {
        let gate = if name.contains("mixed") { Mixed } else { Bias(1.0) };
        let mut s = Spec::new(name, 2, 3, d, t, DType::Bf16, gate, vis);
        s.tq = tq;
        s.decode = true;
        s.acp = acp;
        s.bwd = false;
        v.push(s);
    }
    // Grouped-query attention and sliding windows, alone and together, in every mode above.
    let lp = |x: Vec<usize>| Vis::LeftPad(x);
    for (name, b, h, hkv, w, d, t, dt, gate, vis) in [
        ("GQA d64 bf16 H=4 Hkv=2", 2, 4, 2, None, 64, 1000, Bf16, Bias(2.0), Vis::All),
        ("GQA d128 bf16 H=6 Hkv=1 left padding", 2, 6, 1, None, 128, 900, Bf16, Mixed, lp(vec![0, 333])),
        (
            "GQA d128 fp16 H=4 Hkv=2 packed",
            1,
            4,
            2,
            None,
            128,
            1000,
            F16,
            Bias(1.0),
            Vis::Packed(vec![vec![0, 129, 600]]),
        ),
        ("window d64 bf16 w=256", 2, 3, 3, Some(256), 64, 1000, Bf16, Bias(6.0), Vis::All),
        ("window d128 bf16 w=100 left padding", 2, 2, 2, Some(100), 128, 800, Bf16, Bias(2.0), lp(vec![0, 333])),
        ("window d64 bf16 w=2", 1, 2, 2, Some(2), 64, 300, Bf16, Bias(0.0), Vis::All),
        (
            "window d64 fp16 w=300 packed",
            2,
            2,
            2,
            Some(300),
            64,
            1000,
            F16,
            Mixed,
            Vis::Packed(vec![vec![0, 300, 301, 800], vec![0, 450]]),
        ),
        ("window d128 bf16 w=5000 >= T", 1, 2, 2, Some(5000), 128, 700, Bf16, Bias(2.0), Vis::All),
        ("GQA+window d64 bf16 H=4 Hkv=2 w=333 pad", 3, 4, 2, Some(333), 64, 900, Bf16, Bias(3.0), lp(vec![5, 0, 650])),
        ("GQA+window d128 bf16 H=4 Hkv=1 w=129", 1, 4, 1, Some(129), 128, 1000, Bf16, Mixed, Vis::All),
    ] {
        v.push(Spec::new(name, b, h, d, t, dt, gate, vis).gqa_window(hkv, w));
    }
    // w = 1: each row copies its own v (P = 1, so dS = 0 up to round-off and a relative error of
    // dq, dk would measure noise): the forward only
    let mut s = Spec::new("window d64 bf16 w=1 (forward)", 2, 2, 64, 300, Bf16, Bias(0.0), Vis::LeftPad(vec![0, 7]));
    s.bwd = false;
    v.push(s.gqa_window(1, Some(1)));
    let mut s = Spec::new("GQA+window d64 bf16 strided qkv w=200", 2, 4, 64, 500, Bf16, Bias(3.0), Vis::All);
    s.packed_qkv = true;
    v.push(s.gqa_window(2, Some(200)));
    let mut s = Spec::new("GQA+window d128 chunk q_pos0=700 w=200", 2, 4, 128, 1000, Bf16, Bias(2.0), Vis::All);
    s.tq = 300;
    v.push(s.gqa_window(2, Some(200)));
    for (name, hkv, w, d, gate, vis) in [
        ("ACP GQA+window d64 strong gates w=700", 1, Some(700), 64, Bias(-1.0), Vis::All),
        ("ACP window d128 bf16 mixed gates w=1000", 2, Some(1000), 128, Mixed, Vis::All),
        ("ACP GQA d64 bf16 left padding", 1, None, 64, Bias(0.0), Vis::LeftPad(vec![0, 700])),
        (
            "ACP GQA+window d128 bf16 packed w=500",
            1,
            Some(500),
            128,
            Bias(-1.0),
            Vis::Packed(vec![vec![0, 1000], vec![0, 77, 1500]]),
        ),
    ] {
        let mut s = Spec::new(name, 2, 2, d, 2048, DType::Bf16, gate, vis).gqa_window(hkv, w);
        s.acp = true;
        v.push(s);
    }
    for (name, d, tq, t, acp, hkv, w, vis) in [
        ("decode GQA d64 tq=1 H=3 Hkv=1 w=1000", 64, 1, 3000, false, 1, Some(1000), Vis::All),
        ("decode GQA+window d128 tq=16 ACP w=2000", 128, 16, 4097, true, 1, Some(2000), Vis::All),
        ("decode window d64 tq=5 w=64 left pad", 64, 5, 2500, false, 3, Some(64), Vis::LeftPad(vec![0, 1234])),
        ("decode GQA d128 tq=3 mixed ACP Hkv=1", 128, 3, 5000, true, 1, None, Vis::All),
    ] {
        let gate = if name.contains("mixed") { Mixed } else { Bias(1.0) };
        let mut s = Spec::new(name, 2, 3, d, t, DType::Bf16, gate, vis).gqa_window(hkv, w);
        s.tq = tq;
        s.decode = true;
        s.acp = acp;
        s.bwd = false;
        v.push(s);
    }
    v
}

struct Data {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    dout: Vec<f32>,
    a: Vec<f32>,
    c: Vec<f32>,
    starts: Option<Vec<usize>>,
}

fn randn(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.sample::<f32, _>(StandardNormal)).collect()
}

fn round(x: Vec<f32>, dt: DType) -> Vec<f32> {
    from_half_bits(&to_half_bits(&x, dt), dt)
}

/// Per-row starts (len B·T) of a visibility, or None.
fn per_row_starts(vis: &Vis, b: usize, t: usize) -> Option<Vec<usize>> {
    match vis {
        Vis::All => None,
        Vis::LeftPad(s) => Some((0..b * t).map(|i| s[i / t]).collect()),
        Vis::Packed(offs) => Some(ga::starts_from_doc_offsets(offs, t)),
    }
}

/// Host segmented prefix sums: c [B, H, T] from a [B, T, H], restarting at each document and 0
/// at padding (the reference for packed rows; equals fgate::prefix_sum_fwd for left padding).
pub fn host_prefix_fwd(a: &[f32], starts: Option<&[usize]>, b: usize, t: usize, h: usize) -> Vec<f32> {
    segmented_sums(a, starts, (b, t, h), false, |bi, hi, ti| ((bi * t + ti) * h + hi, (bi * h + hi) * t + ti))
}

/// Host segmented reverse prefix sums: da [B, T, H] from dc [B, H, T].
pub fn host_prefix_bwd(dc: &[f32], starts: Option<&[usize]>, b: usize, t: usize, h: usize) -> Vec<f32> {
    segmented_sums(dc, starts, (b, t, h), true, |bi, hi, ti| ((bi * h + hi) * t + ti, (bi * t + ti) * h + hi))
}

/// Sums of `src` along t per (b, h), from the front or (`reverse`) from the back, restarting
/// where a position's document start changes and 0 before it; `at(b, h, t)` gives the indices
/// of (b, h, t) in `src` and in the output.
fn segmented_sums(
    src: &[f32],
    starts: Option<&[usize]>,
    (b, t, h): (usize, usize, usize),
    reverse: bool,
    at: impl Fn(usize, usize, usize) -> (usize, usize),
) -> Vec<f32> {
    let mut out = vec![0.0; b * t * h];
    for bi in 0..b {
        for hi in 0..h {
            let mut acc = 0.0f32;
            let mut cur = usize::MAX;
            for k in 0..t {
                let ti = if reverse { t - 1 - k } else { k };
                let s = starts.map_or(0, |s| s[bi * t + ti]);
                if s != cur {
                    cur = s;
                    acc = 0.0;
                }
                if ti >= s {
                    let (i, o) = at(bi, hi, ti);
                    acc += src[i];
                    out[o] = acc;
                }
            }
        }
    }
    out
}

/// The device form of `vis`, pointing at `dev`, what [`ga::upload_visibility`] returned for it
/// (none exactly when every key is visible).
fn dev_visibility<'a>(vis: &Visibility, dev: &'a Option<cudarc::driver::CudaSlice<i32>>) -> DevVisibility<'a> {
    match (vis, dev) {
        (Visibility::All, _) => DevVisibility::All,
        (Visibility::LeftPadded(_), Some(x)) => DevVisibility::LeftPadded(x),
        (Visibility::PerRow(_), Some(x)) => DevVisibility::PerRow(x),
        _ => unreachable!(),
    }
}

fn make_data(s: &Spec, rng: &mut ChaCha8Rng) -> Data {
    let (b, h, d, t) = (s.b, s.h, s.d, s.t);
    let n = b * t * h * d;
    let nkv = b * t * s.hkv * d;
    let q = round(randn(rng, n), s.dtype);
    let k = round(randn(rng, nkv), s.dtype);
    let v = round(randn(rng, nkv), s.dtype);
    let dout = round(randn(rng, n), s.dtype);
    let noise = randn(rng, b * t * h);
    let logits: Vec<f32> = noise
        .iter()
        .enumerate()
        .map(|(i, z)| match s.gate {
            Gate::Bias(bias) => z + bias,
            Gate::Mixed => {
                let hi = i % h;
                let bias = if h > 1 { -1.0 + 10.0 * hi as f32 / (h - 1) as f32 } else { 4.0 };
                z + bias
            }
        })
        .collect();
    let mut a = vec![0.0; b * t * h];
    fox_kernels::fgate::log_fgate_fwd(&mut a, &logits);
    let starts = per_row_starts(&s.vis, b, t);
    let c = host_prefix_fwd(&a, starts.as_deref(), b, t, h);
    Data { q, k, v, dout, a, c, starts }
}

/// Left-padding starts as the kernels take them (i32), on the device.
pub(crate) fn upload_starts(gpu: &Gpu, starts: Option<&[usize]>) -> Result<Option<cudarc::driver::CudaSlice<i32>>> {
    starts.map(|s| gpu.upload(&s.iter().map(|&v| v as i32).collect::<Vec<_>>())).transpose()
}

/// How many elements' bits differ (the determinism rows' metric), a length difference counted too.
pub(crate) fn bits_differ(a: &[f32], b: &[f32]) -> f64 {
    (a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count() + a.len().abs_diff(b.len())) as f64
}

/// ‖x − r‖ / ‖r‖ in f64 (‖x − r‖ where r is 0; a NaN counts as an infinite error; ∞ for a
/// length mismatch): the GPU checks' metric (gemm, ops, selective scan, attention).
pub fn rel_l2(x: &[f32], r: &[f32]) -> f64 {
    if x.len() != r.len() {
        return f64::INFINITY;
    }
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (a, b) in x.iter().zip(r) {
        let d = *a as f64 - *b as f64;
        num += if d.is_nan() { f64::INFINITY } else { d * d };
        den += (*b as f64) * (*b as f64);
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// [`rel_l2`] over the entries both hold (a downloaded buffer may be longer than its reference).
fn rel_l2_common(x: &[f32], r: &[f32]) -> f64 {
    let n = x.len().min(r.len());
    rel_l2(&x[..n], &r[..n])
}

/// Max |Δ| over entries finite in both; infinite where finiteness differs (padded rows' −∞).
pub fn lse_err(x: &[f32], r: &[f32]) -> f64 {
    let mut m = 0.0f64;
    for (a, b) in x.iter().zip(r) {
        if a.is_finite() != b.is_finite() || a.is_nan() || (a.is_infinite() && a != b) {
            return f64::INFINITY;
        }
        if a.is_finite() {
            m = m.max((*a as f64 - *b as f64).abs());
        }
    }
    m
}

/// One GPU forward: o and lse on the device (as the backward takes them), their host copies (o
/// as f32) and the tile counts.
struct FwdRun {
    o_d: cudarc::driver::CudaSlice<u16>,
    lse_d: cudarc::driver::CudaSlice<f32>,
    o: Vec<f32>,
    lse: Vec<f32>,
    stats: TileStats,
}

/// Rows of one case of a check table.
pub struct Table<'a> {
    pub rows: &'a mut Vec<CheckRow>,
    pub case: String,
}

impl Table<'_> {
    pub fn add(&mut self, metric: &str, err: f64, tol: f64, note: String) {
        self.rows.push(CheckRow::new(self.case.clone(), metric, err, tol, note));
    }
}

/// Run one case; appends its rows.
pub fn run_case(gpu: &Gpu, s: &Spec, seed: u64, rows: &mut Vec<CheckRow>) -> Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let data = make_data(s, &mut rng);
    let mut tab = Table { rows, case: s.name.clone() };
    let (b, h, hkv, d, t) = (s.b, s.h, s.hkv, s.d, s.t);
    let opts = s.opts();
    let dt = s.dtype;
    let bf = dt == DType::Bf16;
    let (tol_o, tol_g) = if bf { (1e-2, 2e-2) } else { (3e-3, 1e-2) };
    let scale = 1.0 / (d as f32).sqrt();

    // CPU problem over all T rows (the reference); a chunk/decode case takes its last tq rows.
    let tq = if s.tq == 0 { t } else { s.tq };
    let q_pos0 = t - tq;
    let cpu_vis_starts: Option<Vec<usize>> = data.starts.as_ref().map(|st| {
        // per query row of the chunk
        (0..b).flat_map(|bi| (q_pos0..t).map(move |r| (bi, r))).map(|(bi, r)| st[bi * t + r]).collect()
    });
    let left: Option<Vec<usize>> = match &s.vis {
        Vis::LeftPad(v) => Some(v.clone()),
        _ => None,
    };
    let cpu_vis = match (&s.vis, &left, &cpu_vis_starts) {
        (Vis::All, _, _) => Visibility::All,
        (Vis::LeftPad(_), Some(l), _) => Visibility::LeftPadded(l),
        (_, _, Some(st)) => Visibility::PerRow(st),
        _ => unreachable!(),
    };
    // queries and their c: rows [q_pos0, t)
    let sel_rows = |x: &[f32]| -> Vec<f32> {
        let mut o = Vec::with_capacity(b * tq * h * d);
        for bi in 0..b {
            o.extend_from_slice(&x[(bi * t + q_pos0) * h * d..(bi * t + t) * h * d]);
        }
        o
    };
    let q_rows = sel_rows(&data.q);
    let dout_rows = sel_rows(&data.dout);
    let cq: Vec<f32> = (0..b * h).flat_map(|bh| data.c[bh * t + q_pos0..bh * t + t].to_vec()).collect();
    let cpu_p = Problem {
        batch: b,
        heads: h,
        kv_heads: hkv,
        window: s.window,
        head_dim: d,
        tq,
        tk: t,
        q_pos0,
        q: View::bthd(&q_rows, tq, h, d),
        k: View::bthd(&data.k, t, hkv, d),
        v: View::bthd(&data.v, t, hkv, d),
        cq: &cq,
        ck: &data.c,
        vis: cpu_vis,
        scale,
        prune: None,
    };
    let mut o_ref = vec![0.0f32; b * tq * h * d];
    let st_ref = ca::forward(&cpu_p, &mut o_ref);

    // device inputs
    let (qkv_buf, q_buf);
    let (qv, kv, vv);
    if s.packed_qkv {
        // [B, T, H + 2·H_kv, D]: a fused projection's output, q then k then v
        let row = (h + 2 * hkv) * d;
        let mut all = vec![0.0f32; b * t * row];
        for bi in 0..b {
            for ti in 0..t {
                let bt = bi * t + ti;
                all[bt * row..][..h * d].copy_from_slice(&data.q[bt * h * d..][..h * d]);
                all[bt * row + h * d..][..hkv * d].copy_from_slice(&data.k[bt * hkv * d..][..hkv * d]);
                all[bt * row + (h + hkv) * d..][..hkv * d].copy_from_slice(&data.v[bt * hkv * d..][..hkv * d]);
            }
        }
        qkv_buf = gpu.upload(&to_half_bits(&all, dt))?;
        q_buf = None;
        let mk = |off: usize| DevView { data: &qkv_buf, off, sb: t * row, sh: d, st: row };
        qv = mk(0);
        kv = mk(h * d);
        vv = mk((h + hkv) * d);
    } else {
        qkv_buf = gpu.upload(&to_half_bits(&[data.k.clone(), data.v.clone()].concat(), dt))?;
        q_buf = Some(gpu.upload(&to_half_bits(&q_rows, dt))?);
        qv = DevView::bthd(q_buf.as_ref().unwrap(), tq, h, d);
        kv = DevView::bthd(&qkv_buf, t, hkv, d);
        vv = DevView { off: b * t * hkv * d, ..DevView::bthd(&qkv_buf, t, hkv, d) };
    }
    let cq_d = gpu.upload(&cq)?;
    let ck_d = gpu.upload(&data.c)?;
    let vis_d = ga::upload_visibility(gpu, &cpu_vis, b, tq)?;
    let dvis = dev_visibility(&cpu_vis, &vis_d);
    let mut dp = DevProblem {
        batch: b,
        heads: h,
        head_dim: d,
        tq,
        tk: t,
        q_pos0,
        dtype: dt,
        q: qv,
        k: kv,
        v: vv,
        cq: &cq_d,
        ck: &ck_d,
        vis: dvis,
        scale,
        prune: None,
    };
    let poison = |n: usize| -> Result<cudarc::driver::CudaSlice<u16>> { gpu.upload(&vec![0x7fc0u16; n]) };
    let poison_f = |n: usize| -> Result<cudarc::driver::CudaSlice<f32>> { gpu.upload(&vec![f32::NAN; n]) };

    // prefix sums on the GPU, against the host
    if !s.decode && s.tq == 0 {
        let a_d = gpu.upload(&data.a)?;
        let mut c_d = poison_f(b * h * t)?;
        ga::fgate_prefix_sum_fwd(gpu, &a_d, &mut c_d, dvis, b, t, h)?;
        let c_gpu = gpu.download(&c_d)?;
        tab.add("c = cumsum(log f)", rel_l2_common(&c_gpu, &data.c), 1e-5, String::new());
    }

    // A forward of `p` into poisoned buffers (`count`: with its tile counts).
    let forward = |p: &DevProblem<'_>, kernel: FwdKernel, count: bool| -> Result<FwdRun> {
        let o_d = poison(p.batch * p.tq * p.heads * p.head_dim)?;
        let mut lse_d = poison_f(p.batch * p.heads * p.tq)?;
        let stats = ga::forward(gpu, p, opts, &o_d, &mut lse_d, kernel, count)?;
        gpu.sync()?;
        let (o, lse) = (from_half_bits(&gpu.download(&o_d)?, dt), gpu.download(&lse_d)?);
        Ok(FwdRun { o_d, lse_d, o, lse, stats })
    };
    let kernel = if s.decode { FwdKernel::Tiled } else { FwdKernel::Auto };
    let FwdRun { o_d, lse_d, o: o_gpu, lse: lse_gpu, stats: st0 } = forward(&dp, kernel, true)?;
    let label = if s.decode { "o (tiled kernel)" } else { "o" };
    tab.add(label, rel_l2_common(&o_gpu, &o_ref), tol_o, format!("{} key tiles", st0.tiles_visited));
    tab.add("lse max|Δ|", lse_err(&lse_gpu, &st_ref.lse), 2e-3, String::new());

    if s.decode {
        let FwdRun { o: o_dec, lse: l_dec, .. } = forward(&dp, FwdKernel::Decode, false)?;
        tab.add("decode o vs tiled (same rows)", rel_l2_common(&o_dec, &o_gpu), 5e-3, String::new());
        // the full forward over all T rows, last tq rows
        let qall = gpu.upload(&to_half_bits(&data.q, dt))?;
        let full_starts = data.starts.clone();
        let vis_full = match (&s.vis, &left, &full_starts) {
            (Vis::All, _, _) => Visibility::All,
            (Vis::LeftPad(_), Some(l), _) => Visibility::LeftPadded(l),
            (_, _, Some(st)) => Visibility::PerRow(st),
            _ => unreachable!(),
        };
        let vf = ga::upload_visibility(gpu, &vis_full, b, t)?;
        let dvf = dev_visibility(&vis_full, &vf);
        let pf = DevProblem { tq: t, q_pos0: 0, q: DevView::bthd(&qall, t, h, d), cq: &ck_d, vis: dvf, ..dp };
        let full = forward(&pf, FwdKernel::Tiled, false)?.o;
        let last: Vec<f32> =
            (0..b).flat_map(|bi| full[(bi * t + q_pos0) * h * d..(bi * t + t) * h * d].to_vec()).collect();
        tab.add("decode o vs full forward", rel_l2_common(&o_dec, &last), 5e-3, String::new());
        tab.add("decode o vs CPU", rel_l2_common(&o_dec, &o_ref), tol_o, String::new());
        tab.add("decode lse max|Δ|", lse_err(&l_dec, &st_ref.lse), 2e-3, String::new());
    }

    // ACP: thresholds from norms on the GPU vs the CPU's; pruned run vs unpruned
    let mut th_d = None;
    if s.acp {
        let u = ca::logit_bound_from_norms(&cpu_p);
        // left padding: the GPU leaves padded rows out of the maxima, so compare only there
        let th_cpu = ca::prune_thresholds(&u, t, -10.0);
        let mut th = poison_f(b * h)?;
        ga::acp_thresholds_from_norms(gpu, &dp, opts, t, -10.0, &mut th)?;
        let th_gpu = gpu.download(&th)?;
        // a window of a decode chunk: the GPU's maxima also leave out keys no row sees
        if matches!(s.vis, Vis::All) && (s.window.is_none() || q_pos0 == 0) {
            let e = th_gpu.iter().zip(&th_cpu).map(|(a, b)| ((a - b) / b).abs() as f64).fold(0.0, f64::max);
            tab.add("ACP threshold (rel)", e, 1e-3, format!("delta[0] = {:.2}", th_gpu[0]));
        }
        th_d = Some(th);
        dp.prune = th_d.as_ref();
        let kern = if s.decode { FwdKernel::Decode } else { FwdKernel::Tiled };
        let FwdRun { o_d: o3, lse_d: l3, o: o_acp, stats: st3, .. } = forward(&dp, kern, true)?;
        let o_base = if s.decode {
            // compare with the decode kernel without pruning
            forward(&DevProblem { prune: None, ..dp }, FwdKernel::Decode, false)?.o
        } else {
            o_gpu.clone()
        };
        tab.add(
            "ACP on vs off: o",
            rel_l2_common(&o_acp, &o_base),
            2e-3,
            format!("{:.0}% of key tiles pruned", 100.0 * st3.pruned_fraction()),
        );
        tab.add("ACP on vs CPU: o", rel_l2_common(&o_acp, &o_ref), tol_o, String::new());
        if !s.decode && matches!(s.gate, Gate::Bias(x) if x <= -1.0) {
            // strongly forgetting gates must actually prune
            tab.add(
                "ACP pruned something",
                if st3.tiles_pruned > 0 { 0.0 } else { 1.0 },
                0.5,
                format!("{} of {} tiles", st3.tiles_pruned, st3.tiles_pruned + st3.tiles_visited),
            );
        }
        if s.bwd {
            // backward with ACP on vs off (both GPU); dO random
            let dout_d = gpu.upload(&to_half_bits(&dout_rows, dt))?;
            let dp0 = DevProblem { prune: None, ..dp };
            let mut g0 = DevGrads::new(gpu, &dp0, opts)?;
            ga::backward(gpu, &dp0, opts, &o_d, &dout_d, &lse_d, &mut g0)?;
            let mut g1 = DevGrads::new(gpu, &dp, opts)?;
            ga::backward(gpu, &dp, opts, &o3, &dout_d, &l3, &mut g1)?;
            gpu.sync()?;
            for (name, x0, x1) in [("dq", &g0.dq, &g1.dq), ("dk", &g0.dk, &g1.dk), ("dv", &g0.dv, &g1.dv)] {
                let a0 = from_half_bits(&gpu.download(x0)?, dt);
                let a1 = from_half_bits(&gpu.download(x1)?, dt);
                tab.add(&format!("ACP on vs off: {name}"), rel_l2_common(&a1, &a0), 4e-3, String::new());
            }
            let c0 = gpu.download(&g0.dck)?;
            let c1 = gpu.download(&g1.dck)?;
            tab.add("ACP on vs off: dck", rel_l2_common(&c1, &c0), 4e-3, String::new());
        }
        dp.prune = None;
    }
    let _ = &th_d;

    if s.bwd {
        let grads_ref = ca::backward(&cpu_p, &o_ref, &dout_rows, &st_ref.lse);
        let dout_d = gpu.upload(&to_half_bits(&dout_rows, dt))?;
        let mut g = DevGrads::new(gpu, &dp, opts)?;
        g.dq = poison(b * tq * h * d)?;
        g.dk = poison(b * t * hkv * d)?;
        g.dv = poison(b * t * hkv * d)?;
        g.dcq = poison_f(b * h * tq)?;
        g.dck = poison_f(b * h * t)?;
        ga::backward(gpu, &dp, opts, &o_d, &dout_d, &lse_d, &mut g)?;
        gpu.sync()?;
        let dq = from_half_bits(&gpu.download(&g.dq)?, dt);
        let dk = from_half_bits(&gpu.download(&g.dk)?, dt);
        let dv = from_half_bits(&gpu.download(&g.dv)?, dt);
        let dcq = gpu.download(&g.dcq)?;
        let dck = gpu.download(&g.dck)?;
        tab.add("dq", rel_l2_common(&dq, &grads_ref.dq), tol_g, String::new());
        tab.add("dk", rel_l2_common(&dk, &grads_ref.dk), tol_g, String::new());
        tab.add("dv", rel_l2_common(&dv, &grads_ref.dv), tol_g, String::new());
        tab.add("dck (-colsum dS)", rel_l2_common(&dck, &grads_ref.dck), tol_g, String::new());
        let max_dcq = dcq.iter().fold(0.0f32, |m, x| if x.is_nan() { f32::INFINITY } else { m.max(x.abs()) });
        let max_dck = grads_ref.dck.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        tab.add("dcq (rowsum dS ~ 0) max/max|dck|", (max_dcq / max_dck.max(1e-30)) as f64, tol_g, String::new());
        // deterministic: the same inputs give the same bits (the warp-specialised backward adds dq across key
        // blocks in a fixed order)
        let mut g2 = DevGrads::new(gpu, &dp, opts)?;
        g2.dq = poison(b * tq * h * d)?;
        g2.dcq = poison_f(b * h * tq)?;
        ga::backward(gpu, &dp, opts, &o_d, &dout_d, &lse_d, &mut g2)?;
        let differ = |x: &cudarc::driver::CudaSlice<u16>, y: &cudarc::driver::CudaSlice<u16>| -> Result<usize> {
            Ok(gpu.download(x)?.iter().zip(gpu.download(y)?).filter(|(a, b)| **a != *b).count())
        };
        let differ_f = |x: &cudarc::driver::CudaSlice<f32>, y: &cudarc::driver::CudaSlice<f32>| -> Result<usize> {
            Ok(gpu.download(x)?.iter().zip(gpu.download(y)?).filter(|(a, b)| a.to_bits() != b.to_bits()).count())
        };
        let n = differ(&g.dq, &g2.dq)? + differ(&g.dk, &g2.dk)? + differ(&g.dv, &g2.dv)?;
        let n = n + differ_f(&g.dcq, &g2.dcq)? + differ_f(&g.dck, &g2.dck)?;
        tab.add("backward bitwise repeat", n as f64, 0.0, "elements with other bits".into());
        if s.tq == 0 {
            // d log f: reverse prefix sum of dcq + dck, on the GPU vs the host on the CPU's dc
            let mut da_d = poison_f(b * t * h)?;
            ga::fgate_prefix_sum_bwd(gpu, &g.dcq, Some(&g.dck), &mut da_d, dvis, b, t, h)?;
            let da = gpu.download(&da_d)?;
            let dc_ref: Vec<f32> = grads_ref.dcq.iter().zip(&grads_ref.dck).map(|(a, b)| a + b).collect();
            let da_ref = host_prefix_bwd(&dc_ref, data.starts.as_deref(), b, t, h);
            tab.add("d log f (rev. cumsum)", rel_l2_common(&da, &da_ref), tol_g, String::new());
            // and the scan kernel alone on exact inputs
            let dc_d = gpu.upload(&dc_ref)?;
            let mut da2 = poison_f(b * t * h)?;
            ga::fgate_prefix_sum_bwd(gpu, &dc_d, None, &mut da2, dvis, b, t, h)?;
            tab.add("rev. cumsum kernel", rel_l2_common(&gpu.download(&da2)?, &da_ref), 1e-5, String::new());
        }
    }
    drop(q_buf);
    Ok(())
}

/// Run all cases whose name contains `filter` (all when None). A case that errors is a failed row.
/// On Hopper (sm_90a) every case runs three times: with the warp-specialised kernels (the default
/// there), with the wgmma kernels, marked "[wgmma]", and with the mma.sync kernels (the
/// default elsewhere), marked "[mma.sync]".
pub fn run_all(gpu: &Gpu, filter: Option<&str>, seed: u64) -> Vec<CheckRow> {
    use fox_kernels::cuda::attention::{set_kernel_path, KernelPath};
    // the kernel family is process-wide: one run at a time (cargo runs tests in parallel)
    static RUNNING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    let paths: &[(KernelPath, &str)] = if gpu.arch() == "sm_90a" {
        &[(KernelPath::WarpSpecialised, ""), (KernelPath::Wgmma, " [wgmma]"), (KernelPath::MmaSync, " [mma.sync]")]
    } else {
        &[(KernelPath::Auto, "")]
    };
    let mut rows = Vec::new();
    for &(path, tag) in paths {
        set_kernel_path(path);
        for (i, s) in cases().iter().enumerate() {
            if let Some(f) = filter {
                if !s.name.contains(f) {
                    continue;
                }
            }
            let case_seed = seed.wrapping_mul(1_000_003).wrapping_add(i as u64);
            let mut spec = s.clone();
            spec.name = format!("{}{tag}", s.name);
            if let Err(e) = run_case(gpu, &spec, case_seed, &mut rows) {
                rows.push(CheckRow::failed(spec.name.clone(), &e));
            }
        }
    }
    set_kernel_path(KernelPath::Auto);
    rows
}

/// The pass/fail table as text.
pub fn format_table(rows: &[CheckRow]) -> String {
    let mut s = String::new();
    s += &format!("| {:<50} | {:<34} | {:>9} | {:>7} | {:<4} | {}\n", "case", "metric", "error", "tol", "ok", "note");
    s += &format!(
        "|{}|{}|{}|{}|{}|------\n",
        "-".repeat(40),
        "-".repeat(36),
        "-".repeat(11),
        "-".repeat(9),
        "-".repeat(6)
    );
    for r in rows {
        s += &format!(
            "| {:<50} | {:<34} | {:>9.2e} | {:>7.0e} | {:<4} | {}\n",
            r.case,
            r.metric,
            r.err,
            r.tol,
            if r.pass { "PASS" } else { "FAIL" },
            r.note
        );
    }
    let failed = rows.iter().filter(|r| !r.pass).count();
    s += &format!("\n{} passed, {} failed\n", rows.len() - failed, failed);
    s
}

/// A seed from the clock, so every run draws fresh inputs (printed for reproduction).
pub fn fresh_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
}
