#![allow(clippy::needless_range_loop)] // index loops read as the formulas do
use super::*;
use crate::linear_attention::testing::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

// ---------------------------------------------------------------------------------------------
// The oracle: the recurrence step by step, in f64.

#[derive(Clone)]
struct Inputs {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    g: Vec<f64>,
    init: Vec<f64>,
}

struct RefGrads {
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    dg: Vec<f64>,
    dinit: Vec<f64>,
}

/// S_t = Diag(e^{g_t}) S_{t−1} + k_t v_tᵀ, o_t = scale S_tᵀ q_t in f64; o [B, T, H, V] and every
/// state per (b, h) (states[bh][i]: after i real positions).
fn ref_fwd(p: &Gla, x: &Inputs) -> (Vec<f64>, States) {
    let (kd, vd) = (p.k_dim, p.v_dim);
    ref_walk(&p.shape(), p.scale, &x.q, &x.init, |r, s| {
        for c in 0..kd {
            for e in 0..vd {
                s[c * vd + e] = x.g[r * kd + c].exp() * s[c * vd + e] + x.k[r * kd + c] * x.v[r * vd + e];
            }
        }
    })
}

fn ref_bwd(p: &Gla, x: &Inputs, dout: &[f64], dfinal: &[f64]) -> RefGrads {
    let (kd, vd) = (p.k_dim, p.v_dim);
    let (_, states) = ref_fwd(p, x);
    let (mut dk, mut dv, mut dg) = (vec![0.0; x.k.len()], vec![0.0; x.v.len()], vec![0.0; x.g.len()]);
    let (dq, dinit) = ref_walk_back(&p.shape(), p.scale, &x.q, &states, dout, dfinal, |r, s_old, ds| {
        for c in 0..kd {
            let d = x.g[r * kd + c].exp();
            for e in 0..vd {
                let g_ = ds[c * vd + e];
                dk[r * kd + c] += g_ * x.v[r * vd + e];
                dv[r * vd + e] += g_ * x.k[r * kd + c];
                dg[r * kd + c] += d * g_ * s_old[c * vd + e];
                ds[c * vd + e] = d * g_;
            }
        }
    });
    RefGrads { dq, dk, dv, dg, dinit }
}

// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Case {
    b: usize,
    t: usize,
    h: usize,
    k: usize,
    v: usize,
    start: Option<Vec<usize>>,
}

struct Data {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    init: Vec<f32>,
}

/// HGRN2's inputs: the forget gate f = σ(·) in (0.5, 0.999) per channel (channel 0 slow, 0.999:
/// a state remembered across chunks), g = ln f, k = 1 − f, q and v standard normal.
fn data(rng: &mut ChaCha8Rng, c: &Case) -> Data {
    let n = c.b * c.t * c.h * c.k;
    let f: Vec<f32> = (0..n).map(|i| if i % c.k == 0 { 0.999 } else { rng.gen_range(0.5..0.999f32) }).collect();
    Data {
        q: randn(rng, n),
        k: f.iter().map(|f| 1.0 - f).collect(),
        v: randn(rng, c.b * c.t * c.h * c.v),
        g: f.iter().map(|f| f.ln()).collect(),
        init: randn(rng, c.b * c.h * c.k * c.v),
    }
}

fn prob<'a>(c: &'a Case, d: &'a Data) -> Gla<'a> {
    Gla {
        batch: c.b,
        seq: c.t,
        heads: c.h,
        k_dim: c.k,
        v_dim: c.v,
        q: &d.q,
        k: &d.k,
        v: &d.v,
        g: &d.g,
        scale: 1.0 / (c.k as f32).sqrt(),
        start: c.start.as_deref(),
    }
}

fn inputs(d: &Data) -> Inputs {
    Inputs { q: to64(&d.q), k: to64(&d.k), v: to64(&d.v), g: to64(&d.g), init: to64(&d.init) }
}

fn cases() -> Vec<Case> {
    let base = Case { b: 2, t: 150, h: 2, k: 8, v: 6, start: None };
    vec![
        base.clone(),
        Case { start: Some(vec![0, 37]), ..base.clone() },
        Case { t: 64, start: Some(vec![64, 3]), ..base.clone() },
        Case { b: 1, t: 5, h: 3, k: 4, v: 8, start: None },
    ]
}

#[test]
fn chunked_forward_matches_the_recurrence() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for c in cases() {
        let d = data(&mut rng, &c);
        let p = prob(&c, &d);
        let (o_ref, states) = ref_fwd(&p, &inputs(&d));
        check_forward(&c, &p.shape(), &o_ref, &states, |o, fin| gla_fwd(&p, o, Some(&d.init), Some(fin)).unwrap());
    }
}

#[test]
fn chunked_backward_matches_the_recurrence() {
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for c in cases() {
        let d = data(&mut rng, &c);
        let p = prob(&c, &d);
        let (dout, dfinal) = probes(&mut rng, c.b * c.t * c.h * c.v, d.init.len());
        let r = ref_bwd(&p, &inputs(&d), &to64(&dout), &to64(&dfinal));
        let (nk, nv) = (c.b * c.t * c.h * c.k, c.b * c.t * c.h * c.v);
        let (mut dq, mut dk, mut dv, mut dg) =
            (vec![f32::NAN; nk], vec![f32::NAN; nk], vec![f32::NAN; nv], vec![f32::NAN; nk]);
        let mut dinit = vec![f32::NAN; d.init.len()];
        let grads = GlaGrads { dq: &mut dq, dk: &mut dk, dv: &mut dv, dg: &mut dg, dinit: Some(&mut dinit) };
        gla_bwd(&p, &dout, Some(&d.init), Some(&dfinal), grads).unwrap();
        check_gradients(
            &c,
            &[
                ("dq", &dq, &r.dq),
                ("dk", &dk, &r.dk),
                ("dv", &dv, &r.dv),
                ("dg", &dg, &r.dg),
                ("dinit", &dinit, &r.dinit),
            ],
        );
    }
}

/// The oracle's backward against central differences of its own forward (f64).
#[test]
fn oracle_backward_matches_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let c = Case { b: 2, t: 6, h: 2, k: 3, v: 4, start: Some(vec![0, 2]) };
    let d = data(&mut rng, &c);
    let p = prob(&c, &d);
    let x = inputs(&d);
    let (dout, dfinal) = probes(&mut rng, c.b * c.t * c.h * c.v, d.init.len());
    let (dout, dfinal) = (to64(&dout), to64(&dfinal));
    let r = ref_bwd(&p, &x, &dout, &dfinal);
    let fields: [Field<Inputs>; 5] = [
        ("q", |x| &mut x.q, &r.dq),
        ("k", |x| &mut x.k, &r.dk),
        ("v", |x| &mut x.v, &r.dv),
        ("g", |x| &mut x.g, &r.dg),
        ("init", |x| &mut x.init, &r.dinit),
    ];
    check_finite_differences(&x, &fields, (&dout, &dfinal), |x| ref_fwd(&p, x));
}

/// Prefill in chunks continuing the state, then decode steps, give the full forward's outputs and
/// final state; a padded row decodes nothing.
#[test]
fn decode_steps_and_chunked_prefill_continue_the_state() {
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    let c = Case { b: 2, t: 100, h: 2, k: 8, v: 6, start: Some(vec![0, 5]) };
    let d = data(&mut rng, &c);
    let p = prob(&c, &d);
    let mut o = vec![0.0; c.b * c.t * c.h * c.v];
    let mut fin = vec![0.0; d.init.len()];
    gla_fwd(&p, &mut o, Some(&d.init), Some(&mut fin)).unwrap();
    let (kd, vd, h) = (c.k, c.v, c.h);
    let rows = |x: &[f32], w: usize, t0: usize, t1: usize| positions(x, (c.b, c.t, h, w), t0, t1);
    let split = 70;
    let prefill = || {
        let (q, k, v, g) =
            (rows(&d.q, kd, 0, split), rows(&d.k, kd, 0, split), rows(&d.v, vd, 0, split), rows(&d.g, kd, 0, split));
        let pre = Gla { seq: split, q: &q, k: &k, v: &v, g: &g, ..p };
        let mut o1 = vec![0.0; c.b * split * h * vd];
        let mut state = vec![0.0; d.init.len()];
        gla_fwd(&pre, &mut o1, Some(&d.init), Some(&mut state)).unwrap();
        (o1, state)
    };
    let step = |t: usize, state: &mut [f32]| {
        let (q, k, v, g) =
            (rows(&d.q, kd, t, t + 1), rows(&d.k, kd, t, t + 1), rows(&d.v, vd, t, t + 1), rows(&d.g, kd, t, t + 1));
        let step = Gla { seq: 1, q: &q, k: &k, v: &v, g: &g, start: None, ..p };
        let mut ot = vec![0.0; c.b * h * vd];
        gla_decode_step(&step, state, &mut ot).unwrap();
        ot
    };
    check_prefill_then_decode((c.b, c.t, h, vd), (&o, &fin), split, prefill, step);
    // A row still in its padding: o = 0, the state unchanged.
    let (q, k, v, g) = (rows(&d.q, kd, 0, 1), rows(&d.k, kd, 0, 1), rows(&d.v, vd, 0, 1), rows(&d.g, kd, 0, 1));
    let pads = [1usize, 1];
    let step = Gla { seq: 1, q: &q, k: &k, v: &v, g: &g, start: Some(&pads), ..p };
    let (mut s, mut ot) = (d.init.clone(), vec![1.0; c.b * h * vd]);
    gla_decode_step(&step, &mut s, &mut ot).unwrap();
    assert!(ot.iter().all(|&x| x == 0.0) && s == d.init);
}

/// A left-padded row gives what the same row without its padding gives, and its padding gets no
/// gradient.
#[test]
fn left_padding_is_the_unpadded_row() {
    let mut rng = ChaCha8Rng::seed_from_u64(15);
    let c = Case { b: 1, t: 90, h: 2, k: 8, v: 6, start: None };
    let d = data(&mut rng, &c);
    let pad = 23;
    let shift = |x: &[f32], w: usize| left_pad(x, pad, c.h, w, 0.3);
    let (q, k, v, g) = (shift(&d.q, c.k), shift(&d.k, c.k), shift(&d.v, c.v), shift(&d.g, c.k));
    let start = [pad];
    let p = prob(&c, &d);
    let pp = Gla { seq: c.t + pad, q: &q, k: &k, v: &v, g: &g, start: Some(&start), ..p };
    let (mut o, mut op) = (vec![0.0; c.t * c.h * c.v], vec![1.0; (c.t + pad) * c.h * c.v]);
    gla_fwd(&p, &mut o, Some(&d.init), None).unwrap();
    gla_fwd(&pp, &mut op, Some(&d.init), None).unwrap();
    check_padded_output(&o, &op, pad * c.h * c.v);
    let dout = shift(&randn(&mut rng, c.t * c.h * c.v), c.v);
    let n = (c.t + pad) * c.h;
    let (mut dq, mut dk, mut dv, mut dg) =
        (vec![1.0; n * c.k], vec![1.0; n * c.k], vec![1.0; n * c.v], vec![1.0; n * c.k]);
    let grads = GlaGrads { dq: &mut dq, dk: &mut dk, dv: &mut dv, dg: &mut dg, dinit: None };
    gla_bwd(&pp, &dout, Some(&d.init), None, grads).unwrap();
    check_padding_gradients(pad * c.h, &[("dq", &dq, c.k), ("dk", &dk, c.k), ("dv", &dv, c.v), ("dg", &dg, c.k)]);
}
