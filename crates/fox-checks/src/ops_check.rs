//! The GPU check of the small ops ([`fox_kernels::cuda::ops`]): each against its CPU op on fresh random
//! inputs of awkward sizes, for T = f32 and T = bf16, printed with [`crate::check::format_table`].
//!
//! Inputs are drawn on the host, rounded to T, and the CPU op gets the rounded values, so an error
//! measures only the kernel's arithmetic and the rounding of its output. Errors are relative L2
//! norms ‖gpu − cpu‖ / ‖cpu‖ unless the metric says otherwise. Tolerances, and why:
//! - T outputs, f32: 1e-5. The same f32 arithmetic in another order (warp-shuffle sums), FMA
//!   contraction and ulp-level differences of expf / log1pf / sincos: ~1e-7 per element.
//! - T outputs, bf16: 1e-2. The output is rounded to bf16 (8 significant bits: ≤ 2^-9 relative per
//!   element, ~1e-3 in L2); everything before the rounding is f32 from the same inputs.
//! - f32 outputs (rstd, gate values, losses, parameter gradients, optimizer state) in either mode:
//!   1e-5, as f32 above; sums over more than 10^5 rows 1e-4 (fixed-order partial sums of 10^5
//!   terms against the CPU's order: error grows with the number of additions).
//! - Determinism: the reductions run twice on the same inputs; the metric is the number of
//!   elements whose bits differ, tolerance 0.
//!
//! Ops without a CPU twin in this crate get a host loop of their definition: embedding (gather,
//! and scatter-add in position order), casts, residual adds, output gate, sigmoid, bias rows,
//! column sums, sums of squares, and AdamW (foxlm::optim::AdamW::update's per-element formula:
//! foxlm depends on this crate, not the other way round).

use crate::check::{bits_differ, rel_l2, upload_starts, CheckRow, Ctx};
use anyhow::Result;
use cudarc::driver::CudaSlice;
use fox_kernels::cuda::ops::{self, CrossEntropy, EmbeddingIndex, KvShift, RmsNorm, RmsNormSaved};
use fox_kernels::cuda::{Elem, Gpu};
use fox_kernels::scalar::sigmoid;
use rand::Rng;

/// Relative L2 tolerance of an output stored in T (see the module comment).
fn tol_t<T: Elem>() -> f64 {
    if T::NAME == "f32" {
        1e-5
    } else {
        1e-2
    }
}
/// f32 outputs computed from identical inputs.
const TOL_F32: f64 = 1e-5;
/// f32 sums over more than 10^5 rows.
const TOL_F32_LONG: f64 = 1e-4;

/// The ops check's own rows and inputs.
impl Ctx<'_> {
    /// `err` of a T output.
    fn add_t<T: Elem>(&mut self, case: &str, metric: &str, got: &[f32], want: &[f32]) {
        let note = if T::NAME == "f32" { "" } else { "output rounded to bf16" };
        self.add(case, metric, rel_l2(got, want), tol_t::<T>(), note);
    }

    fn add_f32(&mut self, case: &str, metric: &str, got: &[f32], want: &[f32]) {
        self.add(case, metric, rel_l2(got, want), TOL_F32, "");
    }

    fn add_same(&mut self, case: &str, metric: &str, a: &[f32], b: &[f32]) {
        self.add(case, metric, bits_differ(a, b), 0.0, "elements with other bits");
    }

    /// Random values rounded to T: the device copy's values and their f32 images.
    fn randn_t<T: Elem>(&mut self, n: usize, scale: f32) -> (Vec<T>, Vec<f32>) {
        let x = self.randn(n, scale);
        round::<T>(&x)
    }

    fn up<V: cudarc::driver::DeviceRepr>(&self, x: &[V]) -> Result<CudaSlice<V>> {
        self.gpu.upload(x)
    }
}

fn round<T: Elem>(x: &[f32]) -> (Vec<T>, Vec<f32>) {
    let t: Vec<T> = x.iter().map(|v| T::from_f32(*v)).collect();
    let f = t.iter().map(|v| v.to_f32()).collect();
    (t, f)
}

fn dl<T: Elem>(gpu: &Gpu, s: &CudaSlice<T>, n: usize) -> Result<Vec<f32>> {
    let mut v: Vec<f32> = gpu.download(s)?.iter().map(|x| x.to_f32()).collect();
    v.truncate(n);
    Ok(v)
}

fn tag<T: Elem>() -> &'static str {
    T::NAME
}

/// Run every case with fresh inputs drawn from `seed`; a case that errors is a failed row.
pub fn run_all(gpu: &Gpu, seed: u64) -> Vec<CheckRow> {
    let mut c = Ctx::new(gpu, seed);
    typed::<f32>(&mut c);
    typed::<half::bf16>(&mut c);
    f32_only(&mut c);
    let seed = c.rng.gen();
    c.rows.extend(crate::selective_scan_check::check(gpu, seed));
    c.rows
}

fn typed<T: Elem>(c: &mut Ctx) {
    let t = tag::<T>();
    for (rows, dim, groups, eps, what) in [
        (333, 768, 1, 1e-6, "block norm"),
        (2 * 37 * 12, 64, 12, 1e-5, "per-head QK-norm"),
        (1001, 128, 1, 1e-5, "shared QK-norm"),
        (300_001, 64, 1, 1e-5, "300k rows"),
        (7 * 3 + 2, 128, 3, 1e-6, "3 groups, partial last group"),
        (101, 37, 1, 1e-6, "odd dim (one element per lane)"),
        (1, 768, 1, 1e-6, "one row (a block per row)"),
        (12, 64, 12, 1e-5, "a decode step's QK-norm (a block per row)"),
        (3, 37, 1, 1e-6, "few rows, odd dim"),
        (333, 1536, 1, 1e-6, "block norm, 12 chunks"),
        (2 * 37 * 24, 64, 24, 1e-5, "per-head QK-norm, 24 heads"),
        (45, 32, 4, 1e-5, "dim 32, 4 groups"),
        (40, 2048, 1, 1e-6, "wider than the one-pass backward"),
    ] {
        c.case(&format!("rms_norm {t} {what} rows={rows} dim={dim}"), |c, n| {
            rms_case::<T>(c, n, rows, dim, groups, eps)
        });
    }
    for (b, tt, h, d, start) in [
        (3, 37, 4, 64, Some(vec![0usize, 5, 36])),
        (2, 129, 12, 64, None),
        (2, 50, 3, 128, Some(vec![7, 0])),
        (1, 9, 2, 768, Some(vec![3])),
        (2, 11, 3, 10, Some(vec![2, 0])),
    ] {
        let what = if start.is_some() { "left padding" } else { "no padding" };
        c.case(&format!("kv_shift {t} B={b} T={tt} H={h} D={d} {what}"), |c, n| {
            kv_case::<T>(c, n, b, tt, h, d, start.as_deref())
        });
    }
    for (rows, h, d) in [(333, 12, 64), (101, 3, 128)] {
        c.case(&format!("rope {t} rows={rows} H={h} D={d}"), |c, n| rope_case::<T>(c, n, rows, h, d));
    }
    c.case(&format!("sigmoid {t} n=100003"), |c, n| sigmoid_case::<T>(c, n, 100_003));
    c.case(&format!("gate_mul {t} n=50508"), |c, n| gate_case::<T>(c, n, 50_508 + 3));
    for (rows, inter) in [(301, 2048), (7, 333)] {
        c.case(&format!("swiglu {t} rows={rows} I={inter}"), |c, n| swiglu_case::<T>(c, n, rows, inter));
    }
    c.case(&format!("add / add_inplace / casts {t} n=100001"), |c, n| residual_case::<T>(c, n, 100_001));
    for (rows, dim) in [(333, 768), (1, 1536), (5, 37)] {
        c.case(&format!("add_rms_norm {t} rows={rows} dim={dim}"), |c, n| add_rms_case::<T>(c, n, rows, dim));
    }
    for (rows, inp, out) in [(1, 768, 3108), (4, 1536, 4096), (3, 64, 50304), (2, 4096, 7)] {
        c.case(&format!("gemv {t} rows={rows} in={inp} out={out}"), |c, n| gemv_case::<T>(c, n, rows, inp, out));
    }
    for (rows, inp, inter) in [(1, 768, 1792), (4, 1536, 4096), (3, 64, 33), (2, 4096, 5)] {
        c.case(&format!("gemv_glu {t} rows={rows} in={inp} I={inter}"), |c, n| {
            gemv_glu_case::<T>(c, n, rows, inp, inter)
        });
    }
    for (rows, vocab, d, distinct) in [(600, 1000, 768, 50), (1001, 50257, 64, 50257), (37, 11, 128, 11)] {
        c.case(&format!("embedding {t} rows={rows} vocab={vocab} d={d}"), |c, n| {
            embedding_case::<T>(c, n, rows, vocab, d, distinct)
        });
    }
    for (rows, vocab) in [(37, 50257), (301, 1000), (5, 7)] {
        c.case(&format!("cross_entropy {t} rows={rows} vocab={vocab}"), |c, n| xent_case::<T>(c, n, rows, vocab));
    }
    // The output head's kernels: rows padded to ld (GPT-2's vocabulary to a multiple of 64), the
    // row staged in shared memory and read three times from memory; ld not a multiple of 4 stages
    // nothing.
    for (rows, vocab, ld) in [(37, 50257, 50304), (301, 1000, 1024), (5, 7, 8), (9, 1001, 1001)] {
        c.case(&format!("cross_entropy_padded {t} rows={rows} vocab={vocab} ld={ld}"), |c, n| {
            xent_padded_case::<T>(c, n, rows, vocab, ld)
        });
    }
    c.case(&format!("adamw {t} n=100003, 3 steps"), |c, n| adamw_case::<T>(c, n, 100_003));
}

fn f32_only(c: &mut Ctx) {
    for (rows, cols) in [(1001, 12), (300_001, 12), (517, 768)] {
        c.case(&format!("forget gate ops f32 rows={rows} H={cols}"), |c, n| fgate_case(c, n, rows, cols));
    }
    for (n, slot) in [(10_000_019, 2), (1000, 0), (0, 1)] {
        c.case(&format!("sum_squares n={n}"), |c, name| sumsq_case(c, name, n, slot));
    }
}

fn rms_case<T: Elem>(c: &mut Ctx, name: &str, rows: usize, dim: usize, groups: usize, eps: f32) -> Result<()> {
    let g = c.gpu;
    let (xt, x) = c.randn_t::<T>(rows * dim, 1.5);
    let w: Vec<f32> = c.randn(groups * dim, 0.3).iter().map(|v| 1.0 + v).collect();
    let (dyt, dy) = c.randn_t::<T>(rows * dim, 1.0);
    let (dx0t, dx0) = c.randn_t::<T>(rows * dim, 1.0);
    let dw0 = c.randn(groups * dim, 1.0);
    let long = rows / groups > 100_000;
    // forward
    let mut y_ref = vec![0.0; rows * dim];
    let mut rstd_ref = vec![0.0; rows];
    fox_kernels::rmsnorm::rms_norm_fwd(&mut y_ref, &mut rstd_ref, &x, &w, dim, eps);
    let (xd, wd) = (c.up(&xt)?, c.up(&w)?);
    let mut yd = g.zeros::<T>(rows * dim)?;
    let mut rd = g.zeros::<f32>(rows)?;
    let norm = RmsNorm { w: &wd, rows, dim, eps };
    ops::rms_norm_fwd(g, &mut yd, &mut rd, &xd, norm)?;
    let y = dl(g, &yd, rows * dim)?;
    let rstd = dl(g, &rd, rows)?;
    c.add_t::<T>(name, "fwd y", &y, &y_ref);
    c.add_f32(name, "fwd rstd", &rstd, &rstd_ref);
    // backward from the CPU's rstd, so both sides see the same statistics
    let rstd_d = c.up(&rstd_ref)?;
    let dyd = c.up(&dyt)?;
    let saved = RmsNormSaved { x: &xd, rstd: &rstd_d, w: &wd, rows, dim };
    let mut dx_ref = vec![0.0; rows * dim];
    let mut dw_ref = dw0.clone();
    fox_kernels::rmsnorm::rms_norm_bwd(&mut dx_ref, false, &mut dw_ref, &dy, &x, &rstd_ref, &w, dim);
    let mut dxd = g.zeros::<T>(rows * dim)?;
    let mut dwd = c.up(&dw0)?;
    ops::rms_norm_bwd(g, &mut dxd, false, &mut dwd, &dyd, saved, None)?;
    let dxv = dl(g, &dxd, rows * dim)?;
    let dwv = dl(g, &dwd, w.len())?;
    c.add_t::<T>(name, "bwd dx", &dxv, &dx_ref);
    let tol = if long { TOL_F32_LONG } else { TOL_F32 };
    c.add(name, "bwd dw (+= onto random)", rel_l2(&dwv, &dw_ref), tol, if long { "sum of >1e5 rows" } else { "" });
    // determinism: the same backward again from the same dw
    let mut dxd2 = g.zeros::<T>(rows * dim)?;
    let mut dwd2 = c.up(&dw0)?;
    ops::rms_norm_bwd(g, &mut dxd2, false, &mut dwd2, &dyd, saved, None)?;
    c.add_same(name, "bwd dw bitwise repeat", &dl(g, &dwd2, w.len())?, &dwv);
    c.add_same(name, "bwd dx bitwise repeat", &dl(g, &dxd2, rows * dim)?, &dxv);
    // accumulate = true adds onto dx
    let mut dx_acc_ref = dx0.clone();
    let mut dw_scratch = dw0.clone();
    fox_kernels::rmsnorm::rms_norm_bwd(&mut dx_acc_ref, true, &mut dw_scratch, &dy, &x, &rstd_ref, &w, dim);
    let mut dxa = c.up(&dx0t)?;
    let mut dwa = c.up(&dw0)?;
    ops::rms_norm_bwd(g, &mut dxa, true, &mut dwa, &dyd, saved, None)?;
    c.add_t::<T>(name, "bwd dx accumulate", &dl(g, &dxa, rows * dim)?, &dx_acc_ref);
    // The one-pass backward (taken above where it applies) against the dx kernel and column sum.
    if ops::rms_norm_bwd_fuses(dim, groups) {
        let mut dxt = g.zeros::<T>(rows * dim)?;
        let mut dwt = c.up(&dw0)?;
        ops::rms_norm_bwd(g, &mut dxt, false, &mut dwt, &dyd, saved, Some(false))?;
        c.add_same(name, "bwd one pass: dx bitwise = two kernels", &dxv, &dl(g, &dxt, rows * dim)?);
        c.add(name, "bwd one pass: dw vs two kernels", rel_l2(&dwv, &dl(g, &dwt, w.len())?), tol, "other chunks");
        let mut dxt = c.up(&dx0t)?;
        let mut dwt = c.up(&dw0)?;
        ops::rms_norm_bwd(g, &mut dxt, true, &mut dwt, &dyd, saved, Some(false))?;
        c.add_same(
            name,
            "bwd one pass: dx accumulate bitwise = two kernels",
            &dl(g, &dxa, rows * dim)?,
            &dl(g, &dxt, rows * dim)?,
        );
    }
    Ok(())
}

fn kv_case<T: Elem>(
    c: &mut Ctx,
    name: &str,
    b: usize,
    t: usize,
    h: usize,
    d: usize,
    start: Option<&[usize]>,
) -> Result<()> {
    let g = c.gpu;
    let n = b * t * h * d;
    let (xt, x) = c.randn_t::<T>(n, 1.0);
    let a_raw: Vec<f32> = c.randn(b * t * h, 1.5).iter().map(|v| sigmoid(*v)).collect();
    let (at, a) = round::<T>(&a_raw);
    let (dot, dout) = c.randn_t::<T>(n, 1.0);
    let sd = upload_starts(g, start)?;
    let (xd, ad, dod) = (c.up(&xt)?, c.up(&at)?, c.up(&dot)?);
    let prob = fox_kernels::kv_shift::KvShift { batch: b, seq: t, heads: h, head_dim: d, x: &x, alpha: &a, start };
    let mut out_ref = vec![0.0; n];
    fox_kernels::kv_shift::kv_shift_fwd(&prob, None, &mut out_ref);
    let mut od = g.zeros::<T>(n)?;
    let kv = KvShift { x: &xd, alpha: &ad, start: sd.as_ref(), batch: b, seq: t, heads: h, head_dim: d };
    ops::kv_shift_fwd(g, &mut od, kv)?;
    c.add_t::<T>(name, "fwd out", &dl(g, &od, n)?, &out_ref);
    let mut dx_ref = vec![0.0; n];
    let mut da_ref = vec![0.0; b * t * h];
    fox_kernels::kv_shift::kv_shift_bwd(&prob, &dout, &mut dx_ref, &mut da_ref);
    let mut dxd = g.zeros::<T>(n)?;
    let mut dad = g.zeros::<T>(b * t * h)?;
    ops::kv_shift_bwd(g, &mut dxd, &mut dad, &dod, kv)?;
    c.add_t::<T>(name, "bwd dx", &dl(g, &dxd, n)?, &dx_ref);
    c.add_t::<T>(name, "bwd dalpha", &dl(g, &dad, b * t * h)?, &da_ref);
    Ok(())
}

fn rope_case<T: Elem>(c: &mut Ctx, name: &str, rows: usize, h: usize, d: usize) -> Result<()> {
    let g = c.gpu;
    let n = rows * h * d;
    let (xt, x) = c.randn_t::<T>(n, 1.0);
    // negative positions occur in left-padded rows; large ones at long context
    let pos: Vec<i32> = (0..rows).map(|r| if r % 7 == 3 { -(r as i32) } else { (r * 197) as i32 }).collect();
    let pos64: Vec<i64> = pos.iter().map(|&p| p as i64).collect();
    let pd = c.up(&pos)?;
    for inverse in [false, true] {
        let mut want = x.clone();
        fox_kernels::rope::rope_apply(&mut want, &pos64, h, d, 500000.0, inverse);
        let mut xd = c.up(&xt)?;
        ops::rope_apply(g, &mut xd, &pd, rows, h, d, 500000.0, inverse)?;
        let metric = if inverse { "inverse (backward)" } else { "forward" };
        c.add_t::<T>(name, metric, &dl(g, &xd, n)?, &want);
    }
    Ok(())
}

fn sigmoid_case<T: Elem>(c: &mut Ctx, name: &str, n: usize) -> Result<()> {
    let g = c.gpu;
    let (xt, x) = c.randn_t::<T>(n, 4.0);
    let (yt, yv) = round::<T>(&x.iter().map(|v| sigmoid(*v)).collect::<Vec<_>>());
    let (dyt, dy) = c.randn_t::<T>(n, 1.0);
    let xd = c.up(&xt)?;
    let mut yd = g.zeros::<T>(n)?;
    ops::sigmoid_fwd(g, &mut yd, &xd, n)?;
    let want: Vec<f32> = x.iter().map(|v| sigmoid(*v)).collect();
    c.add_t::<T>(name, "fwd", &dl(g, &yd, n)?, &want);
    // backward from the rounded output, as the model keeps it
    let (ydt, dyd) = (c.up(&yt)?, c.up(&dyt)?);
    let mut dxd = g.zeros::<T>(n)?;
    ops::sigmoid_bwd(g, &mut dxd, &dyd, &ydt, n)?;
    let want: Vec<f32> = dy.iter().zip(&yv).map(|(g, y)| g * y * (1.0 - y)).collect();
    c.add_t::<T>(name, "bwd", &dl(g, &dxd, n)?, &want);
    Ok(())
}

fn gate_case<T: Elem>(c: &mut Ctx, name: &str, n: usize) -> Result<()> {
    let g = c.gpu;
    let (pt, pre) = c.randn_t::<T>(n, 1.0);
    let (gt, gv) = c.randn_t::<T>(n, 3.0);
    let (dzt, dz) = c.randn_t::<T>(n, 1.0);
    let (pd, gd, dzd) = (c.up(&pt)?, c.up(&gt)?, c.up(&dzt)?);
    let mut zd = g.zeros::<T>(n)?;
    ops::gate_mul_fwd(g, &mut zd, &pd, &gd, n)?;
    let want: Vec<f32> = pre.iter().zip(&gv).map(|(p, q)| p * sigmoid(*q)).collect();
    c.add_t::<T>(name, "fwd z", &dl(g, &zd, n)?, &want);
    let mut dpd = g.zeros::<T>(n)?;
    let mut dgd = g.zeros::<T>(n)?;
    ops::gate_mul_bwd(g, &mut dpd, &mut dgd, &dzd, &pd, &gd, n)?;
    let s: Vec<f32> = gv.iter().map(|q| sigmoid(*q)).collect();
    let want_p: Vec<f32> = dz.iter().zip(&s).map(|(d, s)| d * s).collect();
    let want_g: Vec<f32> = (0..n).map(|i| dz[i] * pre[i] * s[i] * (1.0 - s[i])).collect();
    c.add_t::<T>(name, "bwd dpre", &dl(g, &dpd, n)?, &want_p);
    c.add_t::<T>(name, "bwd dg", &dl(g, &dgd, n)?, &want_g);
    Ok(())
}

fn swiglu_case<T: Elem>(c: &mut Ctx, name: &str, rows: usize, inter: usize) -> Result<()> {
    let g = c.gpu;
    let (gut, gu) = c.randn_t::<T>(rows * 2 * inter, 2.0);
    let (dht, dh) = c.randn_t::<T>(rows * inter, 1.0);
    let (gud, dhd) = (c.up(&gut)?, c.up(&dht)?);
    let mut want = vec![0.0; rows * inter];
    fox_kernels::swiglu::swiglu_fwd(&mut want, &gu, inter);
    let mut hd = g.zeros::<T>(rows * inter)?;
    ops::swiglu_fwd(g, &mut hd, &gud, rows, inter)?;
    c.add_t::<T>(name, "fwd h", &dl(g, &hd, rows * inter)?, &want);
    let mut want = vec![0.0; rows * 2 * inter];
    fox_kernels::swiglu::swiglu_bwd(&mut want, &dh, &gu, inter);
    let mut dgd = g.zeros::<T>(rows * 2 * inter)?;
    ops::swiglu_bwd(g, &mut dgd, &dhd, &gud, rows, inter)?;
    c.add_t::<T>(name, "bwd dgu", &dl(g, &dgd, rows * 2 * inter)?, &want);
    Ok(())
}

fn residual_case<T: Elem>(c: &mut Ctx, name: &str, n: usize) -> Result<()> {
    let g = c.gpu;
    let (at, a) = c.randn_t::<T>(n, 1.0);
    let (bt, b) = c.randn_t::<T>(n, 1.0);
    let (ad, bd) = (c.up(&at)?, c.up(&bt)?);
    let sum: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let mut yd = g.zeros::<T>(n)?;
    ops::add(g, &mut yd, &ad, &bd, n)?;
    c.add_t::<T>(name, "add", &dl(g, &yd, n)?, &sum);
    let mut yd = c.up(&at)?;
    ops::add_inplace(g, &mut yd, &bd, n)?;
    c.add_t::<T>(name, "add_inplace", &dl(g, &yd, n)?, &sum);
    // casts: f32 -> T must round exactly as the host does (round to nearest even), T -> f32 exact
    let x = c.randn(n, 10.0);
    let (_, x_rounded) = round::<T>(&x);
    let xd = c.up(&x)?;
    let mut td = g.zeros::<T>(n)?;
    ops::cast_from_f32(g, &mut td, &xd, n)?;
    let back = dl(g, &td, n)?;
    c.add(name, "cast_from_f32 (elements != host rounding)", bits_differ(&back, &x_rounded), 0.0, "");
    let mut fd = g.zeros::<f32>(n)?;
    ops::cast_to_f32(g, &mut fd, &ad, n)?;
    c.add(name, "cast_to_f32 (elements != exact)", bits_differ(&g.download(&fd)?, &a), 0.0, "");
    Ok(())
}

/// The fused residual add and norm must be bitwise the add and the norm apart (the training step's
/// recomputation relies on it), and both against the CPU.
fn add_rms_case<T: Elem>(c: &mut Ctx, name: &str, rows: usize, dim: usize) -> Result<()> {
    let g = c.gpu;
    let n = rows * dim;
    let (at, _) = c.randn_t::<T>(n, 1.0);
    let (bt, _) = c.randn_t::<T>(n, 1.0);
    let w: Vec<f32> = c.randn(dim, 0.3).iter().map(|v| 1.0 + v).collect();
    let (ad, bd, wd) = (c.up(&at)?, c.up(&bt)?, c.up(&w)?);
    let (mut h1, mut y1, mut r1) = (g.zeros::<T>(n)?, g.zeros::<T>(n)?, g.zeros::<f32>(rows)?);
    ops::add(g, &mut h1, &ad, &bd, n)?;
    let norm = RmsNorm { w: &wd, rows, dim, eps: 1e-6 };
    ops::rms_norm_fwd(g, &mut y1, &mut r1, &h1, norm)?;
    let (mut h2, mut y2, mut r2) = (g.zeros::<T>(n)?, g.zeros::<T>(n)?, g.zeros::<f32>(rows)?);
    ops::add_rms_norm_fwd(g, &mut h2, &mut y2, &mut r2, &ad, &bd, norm)?;
    let h = dl(g, &h2, n)?;
    c.add_same(name, "h bitwise = add", &h, &dl(g, &h1, n)?);
    c.add_same(name, "y bitwise = add then rms_norm", &dl(g, &y2, n)?, &dl(g, &y1, n)?);
    c.add_same(name, "rstd bitwise = add then rms_norm", &g.download(&r2)?, &g.download(&r1)?);
    let mut y_ref = vec![0.0; n];
    let mut rstd_ref = vec![0.0; rows];
    fox_kernels::rmsnorm::rms_norm_fwd(&mut y_ref, &mut rstd_ref, &h, &w, dim, 1e-6);
    c.add_t::<T>(name, "y against the CPU norm of h", &dl(g, &y2, n)?, &y_ref);
    Ok(())
}

/// The decode step's matrix-vector product against a host f64 product of the same (T-rounded)
/// inputs, into T and (bf16 inputs) into f32.
fn gemv_case<T: Elem>(c: &mut Ctx, name: &str, rows: usize, inp: usize, out: usize) -> Result<()> {
    let g = c.gpu;
    let (xt, x) = c.randn_t::<T>(rows * inp, 1.0);
    let (wt, w) = c.randn_t::<T>(out * inp, 0.05);
    let want: Vec<f32> = (0..rows * out)
        .map(|i| {
            let (r, o) = (i / out, i % out);
            (0..inp).map(|k| x[r * inp + k] as f64 * w[o * inp + k] as f64).sum::<f64>() as f32
        })
        .collect();
    let (xd, wd) = (c.up(&xt)?, c.up(&wt)?);
    let mut yd = g.zeros::<T>(rows * out)?;
    ops::gemv(g, &mut yd, &xd, &wd, rows, inp, out)?;
    c.add_t::<T>(name, "y in T", &dl(g, &yd, rows * out)?, &want);
    if T::NAME == "bf16" {
        let mut yf = g.zeros::<f32>(rows * out)?;
        ops::gemv(g, &mut yf, &xd, &wd, rows, inp, out)?;
        c.add(name, "y in f32", rel_l2(&g.download(&yf)?, &want), TOL_F32, "f32 sums of bf16 products");
    }
    Ok(())
}

/// SwiGLU's gate_proj with the activation in the same pass: gu and h bitwise those of gemv then
/// swiglu_fwd.
fn gemv_glu_case<T: Elem>(c: &mut Ctx, name: &str, rows: usize, inp: usize, inter: usize) -> Result<()> {
    let g = c.gpu;
    let (xt, _) = c.randn_t::<T>(rows * inp, 1.0);
    let (wt, _) = c.randn_t::<T>(2 * inter * inp, 0.05);
    let (xd, wd) = (c.up(&xt)?, c.up(&wt)?);
    let (mut gu1, mut h1) = (g.zeros::<T>(rows * 2 * inter)?, g.zeros::<T>(rows * inter)?);
    ops::gemv(g, &mut gu1, &xd, &wd, rows, inp, 2 * inter)?;
    ops::swiglu_fwd(g, &mut h1, &gu1, rows, inter)?;
    let (mut gu2, mut h2) = (g.zeros::<T>(rows * 2 * inter)?, g.zeros::<T>(rows * inter)?);
    ops::gemv_glu(g, &mut gu2, &mut h2, &xd, &wd, rows, inp, inter)?;
    c.add_same(name, "gu bitwise = gemv", &dl(g, &gu2, rows * 2 * inter)?, &dl(g, &gu1, rows * 2 * inter)?);
    c.add_same(name, "h bitwise = gemv then swiglu_fwd", &dl(g, &h2, rows * inter)?, &dl(g, &h1, rows * inter)?);
    Ok(())
}

fn embedding_case<T: Elem>(
    c: &mut Ctx,
    name: &str,
    rows: usize,
    vocab: usize,
    d: usize,
    distinct: usize,
) -> Result<()> {
    let g = c.gpu;
    let (tt, table) = c.randn_t::<T>(vocab * d, 1.0);
    let ids: Vec<u32> = (0..rows).map(|_| c.rng.gen_range(0..distinct.min(vocab)) as u32).collect();
    let ids_i: Vec<i32> = ids.iter().map(|&v| v as i32).collect();
    let (td, idd) = (c.up(&tt)?, c.up(&ids_i)?);
    let mut od = g.zeros::<T>(rows * d)?;
    ops::embedding_fwd(g, &mut od, &td, &idd, rows, d)?;
    let want: Vec<f32> =
        ids.iter().flat_map(|&i| table[i as usize * d..(i as usize + 1) * d].iter().copied()).collect();
    let got = dl(g, &od, rows * d)?;
    c.add(name, "fwd gather (elements != table)", bits_differ(&got, &want), 0.0, "");
    // backward onto a random dtable, position order
    let (dot, dout) = c.randn_t::<T>(rows * d, 1.0);
    let dt0 = c.randn(vocab * d, 1.0);
    let mut want = dt0.clone();
    for (r, &i) in ids.iter().enumerate() {
        for k in 0..d {
            want[i as usize * d + k] += dout[r * d + k];
        }
    }
    let dod = c.up(&dot)?;
    // an index made larger than needed, updated twice (the second update must replace the first)
    let mut idx = EmbeddingIndex::new(g, rows + 17)?;
    let other: Vec<u32> = (0..rows / 2).map(|r| (r % vocab) as u32).collect();
    idx.update(g, &other)?;
    idx.update(g, &ids)?;
    let mut dtd = c.up(&dt0)?;
    ops::embedding_bwd(g, &mut dtd, &dod, &idx, d)?;
    let got = g.download(&dtd)?;
    c.add_f32(name, "bwd dtable (+= onto random)", &got, &want);
    let mut dtd2 = c.up(&dt0)?;
    ops::embedding_bwd(g, &mut dtd2, &dod, &idx, d)?;
    c.add_same(name, "bwd bitwise repeat", &g.download(&dtd2)?, &got);
    Ok(())
}

/// A cross-entropy case's inputs and the CPU's answer: logits, targets (every 5th row has none;
/// they include the first and last class), the weight 1/valid rows, losses and dlogits.
#[allow(clippy::type_complexity)]
fn xent_reference(c: &mut Ctx, rows: usize, vocab: usize) -> (Vec<f32>, Vec<Option<u32>>, f32, Vec<f32>, Vec<f32>) {
    let logits = c.randn(rows * vocab, 3.0);
    let targets: Vec<Option<u32>> = (0..rows)
        .map(|r| match r % 5 {
            1 => None,
            2 => Some(0),
            3 => Some(vocab as u32 - 1),
            _ => Some(c.rng.gen_range(0..vocab as u32)),
        })
        .collect();
    let weight = 1.0 / targets.iter().filter(|t| t.is_some()).count().max(1) as f32;
    let (loss_ref, lse) = fox_kernels::cross_entropy::cross_entropy_fwd(&logits, &targets, vocab);
    let mut d_ref = logits.clone();
    fox_kernels::cross_entropy::cross_entropy_bwd(&mut d_ref, &lse, &targets, &vec![weight; rows], vocab);
    (logits, targets, weight, loss_ref, d_ref)
}

fn xent_case<T: Elem>(c: &mut Ctx, name: &str, rows: usize, vocab: usize) -> Result<()> {
    let g = c.gpu;
    let (logits, targets, weight, loss_ref, d_ref) = xent_reference(c, rows, vocab);
    let ti: Vec<i32> = targets.iter().map(|t| t.map_or(-1, |v| v as i32)).collect();
    let (ld, tgd) = (c.up(&logits)?, c.up(&ti)?);
    let mut dd = g.zeros::<T>(rows * vocab)?;
    let mut lossd = g.zeros::<f32>(rows)?;
    let ce = CrossEntropy { logits: &ld, targets: &tgd, weight, rows };
    ops::cross_entropy_fwd_bwd(g, &mut dd, &mut lossd, ce, vocab)?;
    let losses = g.download(&lossd)?;
    c.add_f32(name, "losses", &losses[..rows], &loss_ref);
    let dv = dl(g, &dd, rows * vocab)?;
    c.add_t::<T>(name, "dlogits", &dv, &d_ref);
    let masked = (0..rows)
        .filter(|r| targets[*r].is_none())
        .all(|r| losses[r] == 0.0 && dv[r * vocab..(r + 1) * vocab].iter().all(|&v| v == 0.0));
    c.add(name, "rows without target: 0 loss, 0 grad", if masked { 0.0 } else { 1.0 }, 0.0, "");
    let mut dd2 = g.zeros::<T>(rows * vocab)?;
    let mut lossd2 = g.zeros::<f32>(rows)?;
    ops::cross_entropy_fwd_bwd(g, &mut dd2, &mut lossd2, ce, vocab)?;
    c.add_same(name, "losses bitwise repeat", &g.download(&lossd2)?, &losses);
    Ok(())
}

fn xent_padded_case<T: Elem>(c: &mut Ctx, name: &str, rows: usize, vocab: usize, ld: usize) -> Result<()> {
    let g = c.gpu;
    let (logits, targets, weight, loss_ref, d_ref) = xent_reference(c, rows, vocab);
    // Padding columns hold large values: a kernel that reads them into its max or sum fails.
    let mut padded = vec![1e4f32; rows * ld];
    for r in 0..rows {
        padded[r * ld..r * ld + vocab].copy_from_slice(&logits[r * vocab..(r + 1) * vocab]);
    }
    let ti: Vec<i32> = targets.iter().map(|t| t.map_or(-1, |v| v as i32)).collect();
    let (ld_dev, tgd) = (c.up(&padded)?, c.up(&ti)?);
    let run = |staged: bool| -> Result<(Vec<f32>, Vec<f32>)> {
        let mut dd = g.upload(&vec![T::from_f32(7.0); rows * ld])?;
        let mut lossd = g.zeros::<f32>(rows)?;
        let ce = CrossEntropy { logits: &ld_dev, targets: &tgd, weight, rows };
        ops::cross_entropy_padded(g, &mut dd, &mut lossd, ce, vocab, ld, staged)?;
        Ok((g.download(&lossd)?, dl(g, &dd, rows * ld)?))
    };
    let (losses, dv) = run(false)?;
    let unpad = |d: &[f32]| -> Vec<f32> { (0..rows).flat_map(|r| d[r * ld..r * ld + vocab].to_vec()).collect() };
    c.add_f32(name, "losses (three passes)", &losses, &loss_ref);
    c.add_t::<T>(name, "dlogits (three passes)", &unpad(&dv), &d_ref);
    let pad_zero = (0..rows).all(|r| dv[r * ld + vocab..(r + 1) * ld].iter().all(|&v| v == 0.0));
    c.add(name, "padding dlogits 0", if pad_zero { 0.0 } else { 1.0 }, 0.0, "");
    if ops::cross_entropy_staged_fits(g, ld) {
        let (ls, ds) = run(true)?;
        c.add_f32(name, "losses (row in shared memory)", &ls, &loss_ref);
        c.add_same(name, "staged = three passes: losses", &ls, &losses);
        c.add_same(name, "staged = three passes: dlogits", &ds, &dv);
    }
    Ok(())
}

/// foxlm::optim::AdamW::update for one tensor, per element, with the gradient scaled first.
#[allow(clippy::too_many_arguments)]
fn host_adamw(
    w: &mut [f32],
    g: &[f32],
    m: &mut [f32],
    v: &mut [f32],
    lr: f64,
    (b1, b2, eps, wd): (f64, f64, f64, f64),
    step: i32,
    scale: f32,
) {
    let bc1 = 1.0 - b1.powi(step);
    let bc2 = 1.0 - b2.powi(step);
    let step_size = (lr / bc1) as f32;
    let bc2_sqrt = bc2.sqrt() as f32;
    let decay = (1.0 - lr * wd) as f32;
    let (b1, b2, eps) = (b1 as f32, b2 as f32, eps as f32);
    for j in 0..w.len() {
        let gj = g[j] * scale;
        m[j] = b1 * m[j] + (1.0 - b1) * gj;
        v[j] = b2 * v[j] + (1.0 - b2) * gj * gj;
        let denom = v[j].sqrt() / bc2_sqrt + eps;
        w[j] = w[j] * decay - step_size * m[j] / denom;
    }
}

fn adamw_case<T: Elem>(c: &mut Ctx, name: &str, n: usize) -> Result<()> {
    let gpu = c.gpu;
    let (b1, b2, eps) = (0.9f32, 0.95f32, 1e-8f32);
    let mut w = c.randn(n, 1.0);
    let (mut m, mut v) = (vec![0.0f32; n], vec![0.0f32; n]);
    let mut wd_ = c.up(&w)?;
    let mut md = gpu.zeros::<f32>(n)?;
    let mut vd = gpu.zeros::<f32>(n)?;
    let mut copy = gpu.zeros::<T>(n)?;
    for (step, (lr, decay, scale)) in
        [(2e-3f32, 0.1f32, 1.0f32), (1.5e-3, 0.1, 0.7), (1e-3, 0.0, 0.25)].iter().enumerate()
    {
        let grad = c.randn(n, 0.1);
        let gd = c.up(&grad)?;
        let hp = (b1 as f64, b2 as f64, eps as f64, *decay as f64);
        host_adamw(&mut w, &grad, &mut m, &mut v, *lr as f64, hp, step as i32 + 1, *scale);
        let h = ops::AdamWUpdate {
            lr: *lr,
            beta1: b1,
            beta2: b2,
            eps,
            weight_decay: *decay,
            step: step as u64 + 1,
            grad_scale: *scale,
        };
        ops::adamw(gpu, &mut wd_, Some(&mut copy), &gd, &mut md, &mut vd, n, &h)?;
    }
    c.add_f32(name, "w after 3 steps", &gpu.download(&wd_)?, &w);
    c.add_f32(name, "m", &gpu.download(&md)?, &m);
    c.add_f32(name, "v", &gpu.download(&vd)?, &v);
    c.add_t::<T>(name, "working copy", &dl(gpu, &copy, n)?, &w);
    Ok(())
}

fn fgate_case(c: &mut Ctx, name: &str, rows: usize, cols: usize) -> Result<()> {
    let g = c.gpu;
    let n = rows * cols;
    let x = c.randn(n, 2.0);
    let bias = c.randn(cols, 3.0);
    let (xd, bd) = (c.up(&x)?, c.up(&bias)?);
    let long = rows > 100_000;
    // logits + bias
    let mut ld = c.up(&x)?;
    ops::add_bias_rows(g, &mut ld, &bd, rows, cols)?;
    let logit: Vec<f32> = (0..n).map(|i| x[i] + bias[i % cols]).collect();
    c.add_f32(name, "add_bias_rows", &g.download(&ld)?, &logit);
    let mut fd = g.zeros::<f32>(n)?;
    ops::fill_rows(g, &mut fd, &bd, rows, cols)?;
    let want: Vec<f32> = (0..n).map(|i| bias[i % cols]).collect();
    c.add_f32(name, "fill_rows", &g.download(&fd)?, &want);
    // logsigmoid and its backward
    let mut ad = g.zeros::<f32>(n)?;
    ops::log_fgate_fwd(g, &mut ad, &ld, n)?;
    let mut a_ref = vec![0.0; n];
    fox_kernels::fgate::log_fgate_fwd(&mut a_ref, &logit);
    c.add_f32(name, "log_fgate_fwd", &g.download(&ad)?, &a_ref);
    let da = c.randn(n, 1.0);
    let dad = c.up(&da)?;
    let mut dld = g.zeros::<f32>(n)?;
    ops::log_fgate_bwd(g, &mut dld, &dad, &ld, n)?;
    let mut dl_ref = vec![0.0; n];
    fox_kernels::fgate::log_fgate_bwd(&mut dl_ref, &da, &logit);
    c.add_f32(name, "log_fgate_bwd", &g.download(&dld)?, &dl_ref);
    // bias gradient: column sums onto a random start
    let d0 = c.randn(cols, 1.0);
    let mut want = d0.clone();
    for r in 0..rows {
        for k in 0..cols {
            want[k] += x[r * cols + k];
        }
    }
    let mut dd = c.up(&d0)?;
    ops::col_sum_acc(g, &mut dd, &xd, rows, cols)?;
    let got = g.download(&dd)?;
    let tol = if long { TOL_F32_LONG } else { TOL_F32 };
    c.add(name, "col_sum_acc (+= onto random)", rel_l2(&got, &want), tol, if long { "sum of >1e5 rows" } else { "" });
    let mut dd2 = c.up(&d0)?;
    ops::col_sum_acc(g, &mut dd2, &xd, rows, cols)?;
    c.add_same(name, "col_sum_acc bitwise repeat", &g.download(&dd2)?, &got);
    Ok(())
}

fn sumsq_case(c: &mut Ctx, name: &str, n: usize, slot: usize) -> Result<()> {
    let g = c.gpu;
    let x = c.randn(n.max(1), 0.01);
    let want: f64 = x[..n].iter().map(|&v| v as f64 * v as f64).sum();
    let xd = c.up(&x)?;
    let mut out = c.up(&[7.0f32; 4])?;
    ops::sum_squares(g, &mut out, slot, &xd, n)?;
    let got = g.download(&out)?;
    let err = if want == 0.0 { got[slot].abs() as f64 } else { (got[slot] as f64 - want).abs() / want };
    // f64 sums on both sides; the result is stored as f32 (2^-24 relative)
    c.add(name, "relative error vs f64 host sum", err, 1e-6, "");
    let others_kept = got.iter().enumerate().all(|(i, v)| i == slot || *v == 7.0);
    c.add(name, "other slots untouched", if others_kept { 0.0 } else { 1.0 }, 0.0, "");
    let mut out2 = c.up(&[7.0f32; 4])?;
    ops::sum_squares(g, &mut out2, slot, &xd, n)?;
    c.add_same(name, "bitwise repeat", &g.download(&out2)?, &got);
    Ok(())
}
