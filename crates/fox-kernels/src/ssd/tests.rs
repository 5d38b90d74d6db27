use super::*;
use crate::testing::{assert_gradient, randn};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Debug)]
struct Case {
    b: usize,
    t: usize,
    h: usize,
    p: usize,
    n: usize,
    g: usize,
    /// Chunk length of the chunked algorithm under test.
    l: usize,
    start: Option<Vec<usize>>,
}

struct Data {
    xbc: Vec<f32>,
    stride: usize,
    dt: Vec<f32>,
    a: Vec<f32>,
    d: Vec<f32>,
    init: Vec<f32>,
}

/// Inputs at the scale of a trained layer: dt in (0.01, 0.6), A in (−3, −0.05) with head 0 slow
/// (A = −0.02: a state that remembers across many chunks), x, B, C standard normal, and a row
/// stride 3 wider than the columns the SSD reads.
fn data(rng: &mut ChaCha8Rng, c: &Case) -> Data {
    let stride = c.h * c.p + 2 * c.g * c.n + 3;
    let mut a: Vec<f32> = (0..c.h).map(|_| -rng.gen_range(0.05..3.0f32)).collect();
    a[0] = -0.02;
    Data {
        xbc: randn(rng, c.b * c.t * stride),
        stride,
        dt: (0..c.b * c.t * c.h).map(|_| rng.gen_range(0.01..0.6f32)).collect(),
        a,
        d: randn(rng, c.h),
        init: randn(rng, c.b * c.h * c.p * c.n),
    }
}

fn prob<'a>(c: &'a Case, d: &'a Data) -> Ssd<'a> {
    Ssd {
        batch: c.b,
        seq: c.t,
        heads: c.h,
        head_dim: c.p,
        state: c.n,
        groups: c.g,
        xbc: &d.xbc,
        xbc_stride: d.stride,
        dt: &d.dt,
        a: &d.a,
        d: &d.d,
        start: c.start.as_deref(),
    }
}

/// |got − want| ≤ tol · (1 + |want|) elementwise.
fn close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}[{i}]: {g} vs {w}");
    }
}

fn cases() -> Vec<Case> {
    vec![
        // T not a multiple of L, two groups of two heads, left padding inside the first chunk.
        Case { b: 2, t: 37, h: 4, p: 8, n: 6, g: 2, l: 8, start: Some(vec![0, 5]) },
        // T < L.
        Case { b: 1, t: 5, h: 2, p: 4, n: 3, g: 1, l: 8, start: None },
        // T a multiple of L, one head per group.
        Case { b: 1, t: 24, h: 2, p: 4, n: 5, g: 2, l: 8, start: None },
        // The public chunk (64), padding past a whole chunk, three heads sharing one group.
        Case { b: 2, t: 150, h: 3, p: 16, n: 12, g: 1, l: CHUNK, start: Some(vec![70, 0]) },
    ]
}

/// Random gradients of y and of the final state.
fn grads_in(rng: &mut ChaCha8Rng, c: &Case) -> (Vec<f32>, Vec<f32>) {
    (randn(rng, c.b * c.t * c.h * c.p), randn(rng, c.b * c.h * c.p * c.n))
}

struct Out {
    dxbc: Vec<f32>,
    ddt: Vec<f32>,
    da: Vec<f32>,
    dd: Vec<f32>,
    dinit: Vec<f32>,
}

fn run_bwd(
    f: impl FnOnce(&Ssd, &[f32], Option<&[f32]>, Option<&[f32]>, SsdGrads) -> Result<()>,
    p: &Ssd,
    dy: &[f32],
    init: Option<&[f32]>,
    dfin: Option<&[f32]>,
) -> Out {
    // NaN where the op must write; dA and dD start at 1 (accumulated: 1 is subtracted after).
    let mut o = Out {
        dxbc: vec![f32::NAN; p.xbc.len()],
        ddt: vec![f32::NAN; p.dt.len()],
        da: vec![1.0; p.heads],
        dd: vec![1.0; p.heads],
        dinit: vec![f32::NAN; p.batch * p.heads * p.head_dim * p.state],
    };
    let g = SsdGrads { dxbc: &mut o.dxbc, ddt: &mut o.ddt, da: &mut o.da, dd: &mut o.dd, dinit: Some(&mut o.dinit) };
    f(p, dy, init, dfin, g).unwrap();
    o.da.iter_mut().for_each(|v| *v -= 1.0);
    o.dd.iter_mut().for_each(|v| *v -= 1.0);
    // Columns past the SSD's are left as they were (NaN): keep only the SSD's for comparisons.
    let width = p.heads * p.head_dim + 2 * p.groups * p.state;
    let mut used = Vec::new();
    for (i, &v) in o.dxbc.iter().enumerate() {
        if i % p.xbc_stride < width {
            used.push(v);
        } else {
            assert!(v.is_nan(), "dxbc[{i}] past the SSD's columns was written");
        }
    }
    o.dxbc = used;
    o
}

/// The chunked forward against the f64 oracle (y and final state), with and without an initial
/// state. Tolerance 2e-5 relative: the chunked form sums the same terms in f32 in another order
/// (products of up to L + N terms of size ~1, then state sums over T/L chunks), ~1e-6 round-off
/// each, against an oracle exact to f32 rounding.
#[test]
fn chunked_forward_matches_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    for c in cases() {
        let d = data(&mut rng, &c);
        let p = prob(&c, &d);
        for init in [None, Some(&d.init[..])] {
            let ny = c.b * c.t * c.h * c.p;
            let ns = c.b * c.h * c.p * c.n;
            let (mut y, mut fin) = (vec![f32::NAN; ny], vec![f32::NAN; ns]);
            ssd_fwd_chunked(&p, &mut y, init, Some(&mut fin), c.l).unwrap();
            let (mut yr, mut finr) = (vec![f32::NAN; ny], vec![f32::NAN; ns]);
            ssd_reference(&p, &mut yr, init, Some(&mut finr)).unwrap();
            close(&y, &yr, 2e-5, &format!("{c:?} init {}: y", init.is_some()));
            close(&fin, &finr, 2e-5, &format!("{c:?} init {}: final state", init.is_some()));
            // Padded positions output exactly 0.
            if let Some(s) = &c.start {
                for (b, &s) in s.iter().enumerate() {
                    assert!(y[b * c.t * c.h * c.p..(b * c.t + s) * c.h * c.p].iter().all(|&v| v == 0.0));
                }
            }
        }
    }
}

/// The chunked backward against the oracle's reverse-time recurrence (itself checked against
/// finite differences below), with a gradient on the final state and the initial state's
/// gradient out. Tolerance 1e-4 relative: the gradients are sums of products of three of the
/// inputs over up to T positions, in f32 in a different order, against an f64 oracle.
#[test]
fn chunked_backward_matches_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(32);
    for c in cases() {
        let d = data(&mut rng, &c);
        let p = prob(&c, &d);
        let (dy, dfin) = grads_in(&mut rng, &c);
        for (init, df) in [(None, None), (Some(&d.init[..]), Some(&dfin[..]))] {
            let l = c.l;
            let got = run_bwd(|p, dy, i, f, g| ssd_bwd_chunked(p, dy, i, f, g, l), &p, &dy, init, df);
            let want = run_bwd(ssd_reference_bwd, &p, &dy, init, df);
            let what = format!("{c:?} init {}", init.is_some());
            close(&got.dxbc, &want.dxbc, 1e-4, &format!("{what}: dxbc"));
            close(&got.ddt, &want.ddt, 1e-4, &format!("{what}: ddt"));
            close(&got.da, &want.da, 1e-4, &format!("{what}: dA"));
            close(&got.dd, &want.dd, 1e-4, &format!("{what}: dD"));
            close(&got.dinit, &want.dinit, 1e-4, &format!("{what}: dinit"));
            // Padding gets exactly no gradient.
            if let Some(s) = &c.start {
                let width = c.h * c.p + 2 * c.g * c.n;
                for (b, &s) in s.iter().enumerate() {
                    assert!(got.dxbc[b * c.t * width..(b * c.t + s) * width].iter().all(|&v| v == 0.0));
                    assert!(got.ddt[b * c.t * c.h..(b * c.t + s) * c.h].iter().all(|&v| v == 0.0));
                }
            }
        }
    }
}

/// The finite-difference tests' loss: y·dy + final state·dfinal of the f64 reference forward on
/// (xbc, dt, A, D, init).
fn probe64(p: &Ssd, x: &In64, dy: &[f64], dfin: &[f64]) -> f64 {
    let (y, fin) = ref_fwd64(p, x);
    y.iter().zip(dy).map(|(a, b)| a * b).sum::<f64>() + fin.iter().zip(dfin).map(|(a, b)| a * b).sum::<f64>()
}

/// The oracle's backward against central differences of its forward, both in f64 (h = 1e-6:
/// truncation ~h² and round-off ~1e-16 / h, so 1e-6 relative is far above either), for every
/// input: x, B, C, dt, A, D and the initial state, with left padding and two heads per group.
#[test]
fn reference_backward_matches_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(33);
    let c = Case { b: 2, t: 7, h: 4, p: 3, n: 4, g: 2, l: 4, start: Some(vec![0, 2]) };
    let d = data(&mut rng, &c);
    let p = prob(&c, &d);
    let (dy, dfin) = grads_in(&mut rng, &c);
    let dt = dt64(&p);
    let (xbc, a, dd, init) = (to64(&d.xbc), to64(&d.a), to64(&d.d), to64(&d.init));
    let (dy64, dfin64) = (to64(&dy), to64(&dfin));
    let loss = |xbc: &[f64], dt: &[f64], a: &[f64], dd: &[f64], init: &[f64]| {
        probe64(&p, &In64 { xbc, dt, a, d: dd, init: Some(init) }, &dy64, &dfin64)
    };
    let Grads64 { dxbc: gx, ddt: gdt, da: ga, dd: gd, dinit: gi, .. } =
        ref_bwd64(&p, &In64 { xbc: &xbc, dt: &dt, a: &a, d: &dd, init: Some(&init) }, &dy64, Some(&dfin64));
    // ∂loss/∂x_i by central differences, x_i moved by ±1e-6.
    let fd = |x: &[f64], i: usize, loss: &dyn Fn(&[f64]) -> f64| {
        let e = 1e-6;
        let (mut pl, mut mi) = (x.to_vec(), x.to_vec());
        pl[i] += e;
        mi[i] -= e;
        (loss(&pl) - loss(&mi)) / (2.0 * e)
    };
    let check = |an: f64, fd: f64, what: &str| {
        assert!((an - fd).abs() <= 1e-6 * (1.0 + fd.abs()), "{what}: analytic {an} vs fd {fd}");
    };
    for (i, &an) in gx[..xbc.len()].iter().enumerate() {
        check(an, fd(&xbc, i, &|x| loss(x, &dt, &a, &dd, &init)), &format!("dxbc[{i}]"));
    }
    for (i, &an) in gdt[..dt.len()].iter().enumerate() {
        let (bi, ti) = (i / (c.t * c.h), i / c.h % c.t);
        if ti < c.start.as_ref().unwrap()[bi] {
            // dt at padding counts as 0 whatever it is: no gradient.
            assert_eq!(an, 0.0);
            continue;
        }
        check(an, fd(&dt, i, &|x| loss(&xbc, x, &a, &dd, &init)), &format!("ddt[{i}]"));
    }
    for i in 0..c.h {
        check(ga[i], fd(&a, i, &|x| loss(&xbc, &dt, x, &dd, &init)), &format!("dA[{i}]"));
        check(gd[i], fd(&dd, i, &|x| loss(&xbc, &dt, &a, x, &init)), &format!("dD[{i}]"));
    }
    for (i, &an) in gi[..init.len()].iter().enumerate() {
        check(an, fd(&init, i, &|x| loss(&xbc, &dt, &a, &dd, x)), &format!("dinit[{i}]"));
    }
}

/// dA's per-position terms (whose L2 norm the GPU check measures dA's error against), against
/// central differences: with D = 0, moving dt_t while scaling x_t to keep dt_t·x_t fixed moves
/// only decay_t, so dt_t/A · ∂ℓ/∂dt_t is that position's term, dt_t · decay_t · ∂ℓ/∂decay_t.
#[test]
fn reference_da_terms_match_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(34);
    let c = Case { b: 2, t: 6, h: 2, p: 3, n: 4, g: 1, l: 4, start: Some(vec![0, 2]) };
    let d = data(&mut rng, &c);
    let p = prob(&c, &d);
    let (dy, dfin) = grads_in(&mut rng, &c);
    let dt = dt64(&p);
    let (xbc, a, init) = (to64(&d.xbc), to64(&d.a), to64(&d.init));
    let dd = vec![0.0; c.h];
    let (dy64, dfin64) = (to64(&dy), to64(&dfin));
    let loss =
        |xbc: &[f64], dt: &[f64]| probe64(&p, &In64 { xbc, dt, a: &a, d: &dd, init: Some(&init) }, &dy64, &dfin64);
    let got = ref_bwd64(&p, &In64 { xbc: &xbc, dt: &dt, a: &a, d: &dd, init: Some(&init) }, &dy64, Some(&dfin64));
    let e = 1e-6;
    let mut sq = vec![0.0f64; c.h];
    for i in 0..dt.len() {
        let (bi, ti, hi) = (i / (c.t * c.h), i / c.h % c.t, i % c.h);
        if ti < c.start.as_ref().unwrap()[bi] {
            continue;
        }
        let moved = |de: f64| {
            let (mut x2, mut dt2) = (xbc.clone(), dt.clone());
            dt2[i] += de;
            for v in &mut x2[p.x_at(bi, ti, hi)..][..c.p] {
                *v *= dt[i] / dt2[i];
            }
            loss(&x2, &dt2)
        };
        let term = dt[i] / a[hi] * (moved(e) - moved(-e)) / (2.0 * e);
        sq[hi] += term * term;
    }
    for (hi, sq) in sq.iter().enumerate() {
        let want = sq.sqrt();
        assert!(want > 1e-3, "head {hi}: terms too small to test");
        let rel = (got.da_terms_l2[hi] - want).abs() / want;
        assert!(rel < 1e-5, "head {hi}: da_terms_l2 {} vs fd {want}", got.da_terms_l2[hi]);
    }
}

/// The chunked backward against central differences of the chunked forward in f32, for dt and
/// A (the inputs that enter through exponentials, where a wrong sign or factor would show), at
/// the public chunk length with T = 70 (two chunks). h = 1e-2 on dt ≈ 0.3: truncation
/// ~h²·|∂³L| ≈ 1e-4 relative; f32 round-off of the loss (~1e-6 of Σ|terms| ≈ 1e-4 absolute)
/// over 2h ≈ 5e-3 absolute. Tolerance 2e-2 · (1 + |fd|).
#[test]
fn chunked_backward_matches_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(34);
    let c = Case { b: 1, t: 70, h: 2, p: 4, n: 4, g: 1, l: CHUNK, start: None };
    let mut d = data(&mut rng, &c);
    let (dy, _) = grads_in(&mut rng, &c);
    let got = run_bwd(ssd_bwd, &prob(&c, &d), &dy, None, None);
    let loss = |d: &Data| -> f64 {
        let mut y = vec![0.0; c.b * c.t * c.h * c.p];
        ssd_fwd(&prob(&c, d), &mut y, None, None).unwrap();
        y.iter().zip(&dy).map(|(a, b)| *a as f64 * *b as f64).sum()
    };
    let e = 1e-2f32;
    for i in (0..d.dt.len()).step_by(5) {
        let v = d.dt[i];
        d.dt[i] = v + e;
        let lp = loss(&d);
        d.dt[i] = v - e;
        let lm = loss(&d);
        d.dt[i] = v;
        let fd = ((lp - lm) / (2.0 * e as f64)) as f32;
        assert!((fd - got.ddt[i]).abs() < 2e-2 * (1.0 + fd.abs()), "ddt[{i}]: fd {fd} vs {}", got.ddt[i]);
    }
    for i in 0..c.h {
        let v = d.a[i];
        d.a[i] = v + e;
        let lp = loss(&d);
        d.a[i] = v - e;
        let lm = loss(&d);
        d.a[i] = v;
        let fd = ((lp - lm) / (2.0 * e as f64)) as f32;
        assert!((fd - got.da[i]).abs() < 2e-2 * (1.0 + fd.abs()), "dA[{i}]: fd {fd} vs {}", got.da[i]);
    }
}

/// Processing a sequence in two pieces, the second starting from the first's final state
/// (padding split between them as the pieces fall), equals one piece; and decode steps token by
/// token from the same initial state reproduce the chunked forward. Tolerance 1e-5 relative:
/// the same sums in f32 in another order (chunk boundaries move).
#[test]
fn pieces_and_decode_steps_match_whole() {
    let mut rng = ChaCha8Rng::seed_from_u64(35);
    let c = Case { b: 2, t: 37, h: 4, p: 8, n: 6, g: 2, l: 8, start: Some(vec![0, 5]) };
    let d = data(&mut rng, &c);
    let p = prob(&c, &d);
    let (hp, ns) = (c.h * c.p, c.b * c.h * c.p * c.n);
    let mut whole = vec![0.0; c.b * c.t * hp];
    let mut whole_fin = vec![0.0; ns];
    ssd_fwd_chunked(&p, &mut whole, Some(&d.init), Some(&mut whole_fin), c.l).unwrap();
    // Rows lo..hi of every batch row of a [B, T, w] buffer.
    let rows = |v: &[f32], w: usize, lo: usize, hi: usize| -> Vec<f32> {
        (0..c.b).flat_map(|b| v[(b * c.t + lo) * w..(b * c.t + hi) * w].to_vec()).collect()
    };
    for split in [3, 13, 16] {
        let mut fin1 = vec![0.0; ns];
        let mut got = Vec::new();
        let mut fin2 = vec![0.0; ns];
        for (lo, hi) in [(0, split), (split, c.t)] {
            let (xbc, dt) = (rows(&d.xbc, d.stride, lo, hi), rows(&d.dt, c.h, lo, hi));
            let start: Vec<usize> = c.start.as_ref().unwrap().iter().map(|&s| s.saturating_sub(lo)).collect();
            let pp = Ssd { seq: hi - lo, xbc: &xbc, dt: &dt, start: Some(&start), ..p };
            let mut y = vec![0.0; c.b * (hi - lo) * hp];
            if lo == 0 {
                ssd_fwd_chunked(&pp, &mut y, Some(&d.init), Some(&mut fin1), c.l).unwrap();
            } else {
                ssd_fwd_chunked(&pp, &mut y, Some(&fin1), Some(&mut fin2), c.l).unwrap();
            }
            got.push(y);
        }
        for b in 0..c.b {
            for t in 0..c.t {
                let g = if t < split {
                    &got[0][(b * split + t) * hp..][..hp]
                } else {
                    &got[1][(b * (c.t - split) + t - split) * hp..][..hp]
                };
                close(g, &whole[(b * c.t + t) * hp..][..hp], 1e-5, &format!("split {split}: y ({b}, {t})"));
            }
        }
        close(&fin2, &whole_fin, 1e-5, &format!("split {split}: final state"));
    }
    let mut state = d.init.clone();
    for t in 0..c.t {
        let (xbc, dt) = (rows(&d.xbc, d.stride, t, t + 1), rows(&d.dt, c.h, t, t + 1));
        let start: Vec<usize> = c.start.as_ref().unwrap().iter().map(|&s| usize::from(t < s)).collect();
        let pp = Ssd { seq: 1, xbc: &xbc, dt: &dt, start: Some(&start), ..p };
        let mut y = vec![f32::NAN; c.b * hp];
        ssd_decode_step(&pp, &mut state, &mut y).unwrap();
        for b in 0..c.b {
            close(&y[b * hp..][..hp], &whole[(b * c.t + t) * hp..][..hp], 1e-5, &format!("decode ({b}, {t})"));
        }
    }
    close(&state, &whole_fin, 1e-5, "decode: final state");
}

/// The chunked forward and backward give the same bits on 1 and 3 threads.
#[test]
fn deterministic_across_thread_counts() {
    let mut rng = ChaCha8Rng::seed_from_u64(36);
    let c = Case { b: 2, t: 150, h: 4, p: 8, n: 16, g: 2, l: CHUNK, start: Some(vec![0, 9]) };
    let d = data(&mut rng, &c);
    let (dy, _) = grads_in(&mut rng, &c);
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        pool.install(|| {
            let p = prob(&c, &d);
            let mut y = vec![0.0; c.b * c.t * c.h * c.p];
            ssd_fwd(&p, &mut y, None, None).unwrap();
            let o = run_bwd(ssd_bwd, &p, &dy, None, None);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            (bits(&y), bits(&o.dxbc), bits(&o.ddt), bits(&o.da), bits(&o.dd))
        })
    };
    assert_eq!(run(1), run(3));
}

/// Bad sizes are errors, not panics.
#[test]
fn bad_sizes_are_errors() {
    let mut rng = ChaCha8Rng::seed_from_u64(37);
    let c = Case { b: 1, t: 5, h: 2, p: 4, n: 3, g: 1, l: 8, start: None };
    let d = data(&mut rng, &c);
    let p = prob(&c, &d);
    let mut y = vec![0.0; c.b * c.t * c.h * c.p];
    assert!(ssd_fwd(&p, &mut y[1..], None, None).is_err());
    assert!(ssd_fwd(&Ssd { dt: &d.dt[1..], ..p }, &mut y, None, None).is_err());
    assert!(ssd_fwd(&Ssd { groups: 3, ..p }, &mut y, None, None).is_err());
    assert!(ssd_fwd(&Ssd { xbc: &d.xbc[..10], ..p }, &mut y, None, None).is_err());
    assert!(ssd_fwd(&p, &mut y, Some(&d.init[1..]), None).is_err());
    assert!(ssd_decode_step(&p, &mut [0.0; 24], &mut [0.0; 8]).is_err());
}

/// dt_fwd/dt_bwd: softplus against its formula, d dt_raw and d dt_bias against central
/// differences (h = 1e-3; softplus'' ≤ 1/4 so truncation ~1e-7, f32 round-off ~1e-7/1e-3),
/// including a value above PyTorch's threshold of 20 (linear there).
#[test]
fn dt_softplus_forward_and_backward() {
    let mut rng = ChaCha8Rng::seed_from_u64(38);
    let (rows, h, stride) = (5, 3, 7);
    let mut raw: Vec<f32> = randn(&mut rng, rows * stride).iter().map(|v| 3.0 * v).collect();
    raw[stride + 1] = 25.0;
    let bias = randn(&mut rng, h);
    let g = randn(&mut rng, rows * h);
    let mut dt = vec![0.0; rows * h];
    dt_fwd(&mut dt, &raw, stride, &bias).unwrap();
    for r in 0..rows {
        for k in 0..h {
            let v = (raw[r * stride + k] + bias[k]) as f64;
            let want = if v > 20.0 { v } else { v.exp().ln_1p() };
            assert!((dt[r * h + k] as f64 - want).abs() < 1e-6 * (1.0 + want), "dt[{r},{k}]");
        }
    }
    let mut draw = vec![9.0; raw.len()];
    let mut dbias = vec![0.5; h];
    dt_bwd(&mut draw, stride, &mut dbias, &g, &raw, &bias).unwrap();
    let loss = |raw: &[f32], bias: &[f32]| -> f64 {
        let mut dt = vec![0.0; rows * h];
        dt_fwd(&mut dt, raw, stride, bias).unwrap();
        dt.iter().zip(&g).map(|(a, b)| *a as f64 * *b as f64).sum()
    };
    let step_tol = (1e-3, 2e-3);
    let (columns, past): (Vec<usize>, Vec<usize>) = (0..raw.len()).partition(|i| i % stride < h);
    assert!(past.iter().all(|&i| draw[i] == 9.0), "columns past H are left");
    assert_gradient("draw", &draw, &raw, columns, step_tol, |p| loss(p, &bias));
    dbias.iter_mut().for_each(|v| *v -= 0.5);
    assert_gradient("dbias", &dbias, &bias, 0..h, step_tol, |p| loss(&raw, p));
}
