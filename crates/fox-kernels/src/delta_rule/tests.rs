#![allow(clippy::needless_range_loop)] // index loops read as the formulas do
use super::*;
use crate::linear_attention::testing::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

// ---------------------------------------------------------------------------------------------
// The oracle: the recurrence step by step, in f64.

/// One problem's inputs in f64.
#[derive(Clone)]
struct Inputs {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    beta: Vec<f64>,
    g: Option<Vec<f64>>,
    init: Vec<f64>,
}

/// Gradients from the oracle: dq, dk, dv, dβ, dg, dinit.
struct RefGrads {
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    dbeta: Vec<f64>,
    dg: Vec<f64>,
    dinit: Vec<f64>,
}

/// S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ, o_t = scale S_tᵀ q_t, in f64; returns o
/// [B, T, H, V] and every state after each real position, per (b, h): states[bh][i] = S after
/// i real positions.
fn ref_fwd(p: &DeltaRule, x: &Inputs) -> (Vec<f64>, States) {
    let (kd, vd) = (p.k_dim, p.v_dim);
    ref_walk(&p.shape(), p.scale, &x.q, &x.init, |r, s| {
        let (k, v) = (&x.k[r * kd..][..kd], &x.v[r * vd..][..vd]);
        let alpha = x.g.as_ref().map_or(1.0, |g| g[r].exp());
        let beta = x.beta[r];
        // S k (the state read at k), then the rank-one update.
        let mut sk = vec![0.0; vd];
        for ki in 0..kd {
            for c in 0..vd {
                sk[c] += k[ki] * s[ki * vd + c];
            }
        }
        for ki in 0..kd {
            for c in 0..vd {
                s[ki * vd + c] = alpha * (s[ki * vd + c] - beta * k[ki] * sk[c]) + beta * k[ki] * v[c];
            }
        }
    })
}

/// The oracle's gradients by reverse-time recurrence over the stored states.
fn ref_bwd(p: &DeltaRule, x: &Inputs, dout: &[f64], dfinal: &[f64]) -> RefGrads {
    let (kd, vd) = (p.k_dim, p.v_dim);
    let (_, states) = ref_fwd(p, x);
    let (mut dk, mut dv) = (vec![0.0; x.k.len()], vec![0.0; x.v.len()]);
    let (mut dbeta, mut dg) = (vec![0.0; x.beta.len()], vec![0.0; x.beta.len()]);
    let (dq, dinit) = ref_walk_back(&p.shape(), p.scale, &x.q, &states, dout, dfinal, |r, s_old, ds| {
        // S_t = α S_{t−1} + k uᵀ, u = β (v − α S_{t−1}ᵀ k).
        let (k, v) = (&x.k[r * kd..][..kd], &x.v[r * vd..][..vd]);
        let alpha = x.g.as_ref().map_or(1.0, |g| g[r].exp());
        let beta = x.beta[r];
        let mut sk = vec![0.0; vd];
        let mut dsk = vec![0.0; vd]; // dSᵀ k
        for ki in 0..kd {
            for c in 0..vd {
                sk[c] += k[ki] * s_old[ki * vd + c];
                dsk[c] += k[ki] * ds[ki * vd + c];
            }
        }
        let u: Vec<f64> = (0..vd).map(|c| beta * (v[c] - alpha * sk[c])).collect();
        // dk = dS u − αβ S_{t−1} (dSᵀ k).
        for ki in 0..kd {
            let mut acc = 0.0;
            for c in 0..vd {
                acc += ds[ki * vd + c] * u[c] - alpha * beta * s_old[ki * vd + c] * dsk[c];
            }
            dk[r * kd + ki] += acc;
        }
        for c in 0..vd {
            dv[r * vd + c] += beta * dsk[c];
        }
        dbeta[r] += (0..vd).map(|c| dsk[c] * (v[c] - alpha * sk[c])).sum::<f64>();
        let ss: f64 = ds.iter().zip(s_old.iter()).map(|(a, b)| a * b).sum();
        let dalpha = ss - beta * (0..vd).map(|c| dsk[c] * sk[c]).sum::<f64>();
        dg[r] += alpha * dalpha;
        // dS_{t−1} = α (dS − β k (dSᵀ k)ᵀ).
        for ki in 0..kd {
            for c in 0..vd {
                ds[ki * vd + c] = alpha * (ds[ki * vd + c] - beta * k[ki] * dsk[c]);
            }
        }
    });
    RefGrads { dq, dk, dv, dbeta, dg, dinit }
}

// ---------------------------------------------------------------------------------------------
// Cases and data.

#[derive(Clone, Debug)]
struct Case {
    b: usize,
    t: usize,
    h: usize,
    k: usize,
    v: usize,
    gated: bool,
    start: Option<Vec<usize>>,
}

struct Data {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    beta: Vec<f32>,
    g: Vec<f32>,
    init: Vec<f32>,
}

fn l2rows(x: &mut [f32], dim: usize) {
    for r in x.chunks_mut(dim) {
        let n = r.iter().map(|v| v * v).sum::<f32>().sqrt();
        r.iter_mut().for_each(|v| *v /= n);
    }
}

/// Inputs as a layer makes them: q and k of unit norm, β in (0.05, 0.95), g in (−0.5, −0.001)
/// with head 0 slow (g = −0.002: a state remembered over chunks), v and the state standard normal.
fn data(rng: &mut ChaCha8Rng, c: &Case) -> Data {
    let n = c.b * c.t * c.h;
    let (mut q, mut k) = (randn(rng, n * c.k), randn(rng, n * c.k));
    l2rows(&mut q, c.k);
    l2rows(&mut k, c.k);
    let g = (0..n).map(|i| if i % c.h == 0 { -0.002 } else { -rng.gen_range(0.001..0.5f32) }).collect();
    Data {
        q,
        k,
        v: randn(rng, n * c.v),
        beta: (0..n).map(|_| rng.gen_range(0.05..0.95f32)).collect(),
        g,
        init: randn(rng, c.b * c.h * c.k * c.v),
    }
}

fn prob<'a>(c: &'a Case, d: &'a Data) -> DeltaRule<'a> {
    DeltaRule {
        batch: c.b,
        seq: c.t,
        heads: c.h,
        k_dim: c.k,
        v_dim: c.v,
        q: &d.q,
        k: &d.k,
        v: &d.v,
        beta: &d.beta,
        g: c.gated.then_some(&d.g[..]),
        scale: 1.0 / (c.k as f32).sqrt(),
        start: c.start.as_deref(),
    }
}

fn inputs(c: &Case, d: &Data) -> Inputs {
    Inputs {
        q: to64(&d.q),
        k: to64(&d.k),
        v: to64(&d.v),
        beta: to64(&d.beta),
        g: c.gated.then(|| to64(&d.g)),
        init: to64(&d.init),
    }
}

fn cases() -> Vec<Case> {
    let base = Case { b: 2, t: 150, h: 2, k: 8, v: 6, gated: false, start: None };
    vec![
        base.clone(),
        Case { gated: true, ..base.clone() },
        Case { gated: true, start: Some(vec![0, 37]), ..base.clone() },
        Case { t: 64, start: Some(vec![64, 3]), ..base.clone() },
        Case { b: 1, t: 5, h: 3, k: 4, v: 8, gated: true, start: None },
    ]
}

#[test]
fn chunked_forward_matches_the_recurrence() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for c in cases() {
        let d = data(&mut rng, &c);
        let p = prob(&c, &d);
        let x = inputs(&c, &d);
        let (o_ref, states) = ref_fwd(&p, &x);
        check_forward(&c, &p.shape(), &o_ref, &states, |o, fin| {
            delta_rule_fwd(&p, o, Some(&d.init), Some(fin)).unwrap()
        });
    }
}

#[test]
fn chunked_backward_matches_the_recurrence() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    for c in cases() {
        let d = data(&mut rng, &c);
        let p = prob(&c, &d);
        let x = inputs(&c, &d);
        let (dout, dfinal) = probes(&mut rng, c.b * c.t * c.h * c.v, d.init.len());
        let r = ref_bwd(&p, &x, &to64(&dout), &to64(&dfinal));
        let n = c.b * c.t * c.h;
        let (mut dq, mut dk, mut dv) = (vec![f32::NAN; n * c.k], vec![f32::NAN; n * c.k], vec![f32::NAN; n * c.v]);
        let (mut dbeta, mut dg, mut dinit) = (vec![f32::NAN; n], vec![f32::NAN; n], vec![f32::NAN; d.init.len()]);
        let grads = DeltaRuleGrads {
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
            dbeta: &mut dbeta,
            dg: c.gated.then_some(&mut dg[..]),
            dinit: Some(&mut dinit),
        };
        delta_rule_bwd(&p, &dout, Some(&d.init), Some(&dfinal), grads).unwrap();
        let mut checks: Vec<(&str, &[f32], &[f64])> = vec![
            ("dq", &dq, &r.dq),
            ("dk", &dk, &r.dk),
            ("dv", &dv, &r.dv),
            ("dbeta", &dbeta, &r.dbeta),
            ("dinit", &dinit, &r.dinit),
        ];
        if c.gated {
            checks.push(("dg", &dg, &r.dg));
        }
        check_gradients(&c, &checks);
    }
}

/// The oracle's backward against central differences of its own forward (f64), through the loss
/// Σ o·dout + Σ S_T·dfinal, at every input of a small problem.
#[test]
fn oracle_backward_matches_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let c = Case { b: 2, t: 7, h: 2, k: 3, v: 4, gated: true, start: Some(vec![0, 2]) };
    let d = data(&mut rng, &c);
    let p = prob(&c, &d);
    let x = inputs(&c, &d);
    let (dout, dfinal) = probes(&mut rng, c.b * c.t * c.h * c.v, d.init.len());
    let (dout, dfinal) = (to64(&dout), to64(&dfinal));
    let r = ref_bwd(&p, &x, &dout, &dfinal);
    let fields: [Field<Inputs>; 6] = [
        ("q", |x| &mut x.q, &r.dq),
        ("k", |x| &mut x.k, &r.dk),
        ("v", |x| &mut x.v, &r.dv),
        ("beta", |x| &mut x.beta, &r.dbeta),
        ("g", |x| x.g.as_mut().unwrap(), &r.dg),
        ("init", |x| &mut x.init, &r.dinit),
    ];
    check_finite_differences(&x, &fields, (&dout, &dfinal), |x| ref_fwd(&p, x));
}

#[test]
fn decode_steps_and_chunked_prefill_continue_the_state() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let c = Case { b: 2, t: 100, h: 2, k: 8, v: 6, gated: true, start: Some(vec![0, 5]) };
    let d = data(&mut rng, &c);
    let p = prob(&c, &d);
    let mut o = vec![0.0; c.b * c.t * c.h * c.v];
    let mut fin = vec![0.0; d.init.len()];
    delta_rule_fwd(&p, &mut o, Some(&d.init), Some(&mut fin)).unwrap();
    // Prefill 70 positions chunked, then 30 decode steps.
    let split = 70;
    let (kd, vd, h) = (c.k, c.v, c.h);
    let rows = |x: &[f32], w: usize, t0: usize, t1: usize| positions(x, (c.b, c.t, h, w), t0, t1);
    let sub = |t0: usize, t1: usize, start: &'_ Option<Vec<usize>>| {
        (
            rows(&d.q, kd, t0, t1),
            rows(&d.k, kd, t0, t1),
            rows(&d.v, vd, t0, t1),
            rows(&d.beta, 1, t0, t1),
            rows(&d.g, 1, t0, t1),
            start.clone(),
        )
    };
    let prefill = || {
        let (q, k, v, beta, g, st) = sub(0, split, &c.start);
        let pre = DeltaRule { seq: split, q: &q, k: &k, v: &v, beta: &beta, g: Some(&g), start: st.as_deref(), ..p };
        let mut o1 = vec![0.0; c.b * split * h * vd];
        let mut next = vec![0.0; d.init.len()];
        delta_rule_fwd(&pre, &mut o1, Some(&d.init), Some(&mut next)).unwrap();
        (o1, next)
    };
    let step = |t: usize, state: &mut [f32]| {
        let pads = c.start.as_ref().map(|s| s.iter().map(|&s| usize::from(s > t)).collect::<Vec<_>>());
        let (q, k, v, beta, g, _) = sub(t, t + 1, &None);
        let step = DeltaRule { seq: 1, q: &q, k: &k, v: &v, beta: &beta, g: Some(&g), start: pads.as_deref(), ..p };
        let mut ot = vec![0.0; c.b * h * vd];
        delta_rule_decode_step(&step, state, &mut ot).unwrap();
        ot
    };
    check_prefill_then_decode((c.b, c.t, h, vd), (&o, &fin), split, prefill, step);
}

/// A left-padded row gives what the same row without its padding gives (and 0 before it).
#[test]
fn left_padding_is_the_unpadded_row() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let c = Case { b: 1, t: 90, h: 2, k: 8, v: 6, gated: true, start: None };
    let d = data(&mut rng, &c);
    let pad = 23;
    let shift = |x: &[f32], w: usize| left_pad(x, pad, c.h, w, 7.0);
    let (q, k, v, beta, g) = (shift(&d.q, c.k), shift(&d.k, c.k), shift(&d.v, c.v), shift(&d.beta, 1), shift(&d.g, 1));
    let start = [pad];
    let p = prob(&c, &d);
    let pp = DeltaRule { seq: c.t + pad, q: &q, k: &k, v: &v, beta: &beta, g: Some(&g), start: Some(&start), ..p };
    let (mut o, mut op) = (vec![0.0; c.t * c.h * c.v], vec![1.0; (c.t + pad) * c.h * c.v]);
    delta_rule_fwd(&p, &mut o, Some(&d.init), None).unwrap();
    delta_rule_fwd(&pp, &mut op, Some(&d.init), None).unwrap();
    check_padded_output(&o, &op, pad * c.h * c.v);
    // The backward gives the padding no gradient.
    let dout = shift(&randn(&mut rng, c.t * c.h * c.v), c.v);
    let n = (c.t + pad) * c.h;
    let (mut dq, mut dk, mut dv, mut db, mut dg) =
        (vec![1.0; n * c.k], vec![1.0; n * c.k], vec![1.0; n * c.v], vec![1.0; n], vec![1.0; n]);
    let grads =
        DeltaRuleGrads { dq: &mut dq, dk: &mut dk, dv: &mut dv, dbeta: &mut db, dg: Some(&mut dg), dinit: None };
    delta_rule_bwd(&pp, &dout, Some(&d.init), None, grads).unwrap();
    check_padding_gradients(
        pad * c.h,
        &[("dq", &dq, c.k), ("dk", &dk, c.k), ("dv", &dv, c.v), ("dbeta", &db, 1), ("dg", &dg, 1)],
    );
}

#[test]
fn l2norm_backward_matches_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let (rows, dim) = (5, 7);
    let x = randn(&mut rng, rows * dim);
    let dy = randn(&mut rng, rows * dim);
    let (mut y, mut r) = (vec![0.0; x.len()], vec![0.0; rows]);
    l2norm_fwd(&mut y, &mut r, &x, dim, 1e-6).unwrap();
    for row in y.chunks(dim) {
        let n: f32 = row.iter().map(|v| v * v).sum();
        assert!((n - 1.0).abs() < 1e-5, "norm {n}");
    }
    let mut dx = vec![0.0; x.len()];
    l2norm_bwd(&mut dx, &dy, &y, &r, dim).unwrap();
    let loss = |x: &[f64]| -> f64 {
        x.chunks(dim)
            .zip(dy.chunks(dim))
            .map(|(xr, dr)| {
                let n = (xr.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
                xr.iter().zip(dr).map(|(a, b)| a / n * *b as f64).sum::<f64>()
            })
            .sum()
    };
    let x64 = to64(&x);
    for i in 0..x.len() {
        let (mut a, mut b) = (x64.clone(), x64.clone());
        a[i] += 1e-6;
        b[i] -= 1e-6;
        let fd = (loss(&a) - loss(&b)) / 2e-6;
        assert!((fd - dx[i] as f64).abs() < 1e-5, "dx[{i}]: fd {fd} vs {}", dx[i]);
    }
}
