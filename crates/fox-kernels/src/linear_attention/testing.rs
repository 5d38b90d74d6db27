//! What the delta rule's and GLA's tests share: random inputs, error measures, the oracle's walks,
//! its loss and its check against finite differences, and the checks of a forward and a backward
//! against it, of prefill then decode steps against the forward, and of a padded row.

use crate::linear_attention::Shape;
pub use crate::testing::randn;
use rand_chacha::ChaCha8Rng;

pub fn to64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// max |a − b| / (1 + max |b|).
pub fn err(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = 1.0 + b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0.0f64, |m, (x, y)| m.max((*x as f64 - y).abs())) / scale
}

/// max |a − b|.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()))
}

/// The last state of every (b, h) from the oracle's states[bh][i], as [B, H, K, V].
pub fn final_states(states: &[Vec<Vec<f64>>]) -> Vec<f64> {
    states.iter().flat_map(|s| s.last().unwrap().clone()).collect()
}

/// Positions [t0, t1) of every row of x [B, T, H, w].
pub fn positions(x: &[f32], (b, t, h, w): (usize, usize, usize, usize), t0: usize, t1: usize) -> Vec<f32> {
    (0..b).flat_map(|b| x[(b * t + t0) * h * w..(b * t + t1) * h * w].to_vec()).collect()
}

/// x [T, H, w] after `pad` positions of `value`.
pub fn left_pad(x: &[f32], pad: usize, h: usize, w: usize, value: f32) -> Vec<f32> {
    let mut out = vec![value; pad * h * w];
    out.extend_from_slice(x);
    out
}

/// A backward's probes: do [B, T, H, V] (`out` elements) and the final state's gradient (`state`
/// elements), standard normal, drawn in this order.
pub fn probes(rng: &mut ChaCha8Rng, out: usize, state: usize) -> (Vec<f32>, Vec<f32>) {
    let dout = randn(rng, out);
    (dout, randn(rng, state))
}

/// Σ o·dout + Σ S_T·dfinal: the loss the oracle's backward differentiates.
fn probe_loss(o: &[f64], states: &[Vec<Vec<f64>>], dout: &[f64], dfinal: &[f64]) -> f64 {
    let fin = final_states(states);
    o.iter().zip(dout).map(|(a, b)| a * b).sum::<f64>() + fin.iter().zip(dfinal).map(|(a, b)| a * b).sum::<f64>()
}

/// One input of the oracle: its name, where it lives in the inputs, and its gradient.
pub type Field<'a, X> = (&'a str, fn(&mut X) -> &mut Vec<f64>, &'a Vec<f64>);

/// Each field's gradient against central differences (f64, step 1e-6) of the loss [`probe_loss`]
/// of the oracle's forward `fwd`.
pub fn check_finite_differences<X: Clone>(
    x: &X,
    fields: &[Field<X>],
    (dout, dfinal): (&[f64], &[f64]),
    fwd: impl Fn(&X) -> (Vec<f64>, States),
) {
    let eps = 1e-6;
    let loss = |x: &X| {
        let (o, states) = fwd(x);
        probe_loss(&o, &states, dout, dfinal)
    };
    for &(what, field, grad) in fields {
        for (i, &g) in grad.iter().enumerate() {
            let (mut a, mut b) = (x.clone(), x.clone());
            field(&mut a)[i] += eps;
            field(&mut b)[i] -= eps;
            let fd = (loss(&a) - loss(&b)) / (2.0 * eps);
            assert!((fd - g).abs() < 1e-6 * (1.0 + fd.abs()), "{what}[{i}]: fd {fd} vs {g}");
        }
    }
}

/// Every (b, h)'s states, states[bh][i] after i real positions.
pub type States = Vec<Vec<Vec<f64>>>;

/// A chunked forward `run(o, final state)` (o [B, T, H, V] starting as NaN) against the oracle's
/// output and states (relative error under 2e-5, f32 against f64), and o = 0 at every padded
/// position; `case` names it in failures.
pub fn check_forward(
    case: &dyn std::fmt::Debug,
    sh: &Shape,
    o_ref: &[f64],
    states: &States,
    run: impl FnOnce(&mut [f32], &mut [f32]),
) {
    let fin_ref = final_states(states);
    let (mut o, mut fin) = (vec![f32::NAN; o_ref.len()], vec![0.0; fin_ref.len()]);
    run(&mut o, &mut fin);
    let (eo, es) = (err(&o, o_ref), err(&fin, &fin_ref));
    assert!(eo < 2e-5 && es < 2e-5, "{case:?}: o {eo:e}, final state {es:e}");
    let row = sh.heads * sh.v_dim;
    for b in 0..sh.batch {
        for t in 0..sh.start(b) {
            assert!(o[(b * sh.seq + t) * row..][..row].iter().all(|&v| v == 0.0), "{case:?}: pad output");
        }
    }
}

/// A chunked backward's gradients (name, f32 gradient, the oracle's) against the oracle's:
/// relative error under 1e-4; `case` names it in failures.
pub fn check_gradients(case: &dyn std::fmt::Debug, grads: &[(&str, &[f32], &[f64])]) {
    for &(what, g, r) in grads {
        let e = err(g, r);
        // f32 sums over up to 150 positions of O(1) terms against the f64 oracle.
        assert!(e < 1e-4, "{case:?}: {what} {e:e}");
    }
}

/// A prefill of positions [0, split) continuing the initial state (`prefill()`: its o and final
/// state), then one decode step per later position (`step(t, state)` updates the state and returns
/// o at t), give the full forward's o [B, T, H, V] and final state `fin` within 1e-5.
pub fn check_prefill_then_decode(
    (b, t, h, vd): (usize, usize, usize, usize),
    (o, fin): (&[f32], &[f32]),
    split: usize,
    prefill: impl FnOnce() -> (Vec<f32>, Vec<f32>),
    mut step: impl FnMut(usize, &mut [f32]) -> Vec<f32>,
) {
    let rows = |t0: usize, t1: usize| positions(o, (b, t, h, vd), t0, t1);
    let (o1, mut state) = prefill();
    let e = max_diff(&o1, &rows(0, split));
    assert!(e < 1e-5, "prefill output {e:e}");
    for ti in split..t {
        let ot = step(ti, &mut state);
        let e = max_diff(&ot, &rows(ti, ti + 1));
        assert!(e < 1e-5, "step {ti}: {e:e}");
    }
    let e = max_diff(&state, fin);
    assert!(e < 1e-5, "final state {e:e}");
}

/// The forward of a row left-padded by `pad` elements of o (`padded`) is 0 in its padding and the
/// unpadded row's output `o` after it.
pub fn check_padded_output(o: &[f32], padded: &[f32], pad: usize) {
    assert!(padded[..pad].iter().all(|&x| x == 0.0));
    assert_eq!(&padded[pad..], o, "padded row differs");
}

/// A left-padded row's gradients ([`left_pad`]: the first `m` rows of each, rows of width w) are 0
/// in its padding and not all 0 after it.
pub fn check_padding_gradients(m: usize, grads: &[(&str, &[f32], usize)]) {
    for &(what, x, w) in grads {
        assert!(x[..m * w].iter().all(|&v| v == 0.0), "{what} at padding");
        assert!(x[m * w..].iter().any(|&v| v != 0.0), "{what} after padding");
    }
}

/// The oracle's forward walk in f64: per (b, h) from its initial state, `step(r, S)` updates
/// S [K, V] at each real position r = (b·T + t)·H + h, then o_t = scale · S_tᵀ q_t. Returns o
/// [B, T, H, V] and every state.
pub fn ref_walk(
    sh: &Shape,
    scale: f32,
    q: &[f64],
    init: &[f64],
    mut step: impl FnMut(usize, &mut [f64]),
) -> (Vec<f64>, States) {
    let (t, h, kd, vd) = (sh.seq, sh.heads, sh.k_dim, sh.v_dim);
    let mut o = vec![0.0; sh.batch * t * h * vd];
    let mut all = Vec::new();
    for b in 0..sh.batch {
        for hi in 0..h {
            let bh = b * h + hi;
            let mut s = init[bh * kd * vd..][..kd * vd].to_vec();
            let mut states = vec![s.clone()];
            for ti in sh.start(b)..t {
                let r = (b * t + ti) * h + hi;
                step(r, &mut s);
                for e in 0..vd {
                    o[r * vd + e] = scale as f64 * (0..kd).map(|c| s[c * vd + e] * q[r * kd + c]).sum::<f64>();
                }
                states.push(s.clone());
            }
            all.push(states);
        }
    }
    (o, all)
}

/// The reverse of [`ref_walk`] from do and the final states' gradient: per (b, h) and real
/// position r, backwards, adds o's part to dS and dq, then `step(r, S_{t−1}, dS)` adds its inputs'
/// gradients and turns dS into dS_{t−1}; what is left is the initial state's gradient. Returns
/// (dq, dinit).
pub fn ref_walk_back(
    sh: &Shape,
    scale: f32,
    q: &[f64],
    states: &States,
    dout: &[f64],
    dfinal: &[f64],
    mut step: impl FnMut(usize, &[f64], &mut [f64]),
) -> (Vec<f64>, Vec<f64>) {
    let (t, h, kd, vd) = (sh.seq, sh.heads, sh.k_dim, sh.v_dim);
    let (mut dq, mut dinit) = (vec![0.0; q.len()], vec![0.0; dfinal.len()]);
    let sc = scale as f64;
    for b in 0..sh.batch {
        let st = sh.start(b);
        for hi in 0..h {
            let bh = b * h + hi;
            let mut ds = dfinal[bh * kd * vd..][..kd * vd].to_vec();
            for ti in (st..t).rev() {
                let i = ti - st;
                let r = (b * t + ti) * h + hi;
                let (s_new, s_old) = (&states[bh][i + 1], &states[bh][i]);
                for c in 0..kd {
                    for e in 0..vd {
                        ds[c * vd + e] += sc * q[r * kd + c] * dout[r * vd + e];
                        dq[r * kd + c] += sc * s_new[c * vd + e] * dout[r * vd + e];
                    }
                }
                step(r, s_old, &mut ds);
            }
            dinit[bh * kd * vd..][..kd * vd].copy_from_slice(&ds);
        }
    }
    (dq, dinit)
}
