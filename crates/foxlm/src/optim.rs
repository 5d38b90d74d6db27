//! Optimisation (SPEC §3): AdamW with decoupled weight decay on matrices and embeddings only,
//! a learning rate indexed by tokens seen (linear warm-up from 0, then cosine decay to a floor),
//! and clipping by the global gradient norm.

use crate::tensor::{ParamKind, Params};
use fox_kernels::simd::{self, AdamWStep};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// AdamW's hyper-parameters (PyTorch's `torch.optim.AdamW` semantics).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Applied (times the learning rate) to `ParamKind::Matrix` parameters only.
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 }
    }
}

/// AdamW state: first and second moments per parameter, and the step count.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamW {
    pub config: AdamWConfig,
    /// Updates applied so far (bias correction uses step + 1 for the next).
    pub step: u64,
    pub m: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
}

impl AdamW {
    pub fn new(config: AdamWConfig, params: &Params) -> Self {
        Self { config, step: 0, m: params.zeros_like(), v: params.zeros_like() }
    }

    /// One update with learning rate `lr`: for each trainable parameter p with gradient g,
    ///   m = β1 m + (1-β1) g;  v = β2 v + (1-β2) g²
    ///   p ← p − lr·λ·p   (Matrix parameters only: decoupled weight decay)
    ///   p ← p − lr · (m / (1-β1^t)) / (sqrt(v / (1-β2^t)) + ε)
    /// Frozen parameters are left alone.
    #[allow(clippy::needless_range_loop)] // i indexes params, grads, m and v together
    pub fn update(&mut self, params: &mut Params, grads: &[Vec<f32>], lr: f64) {
        let (bc1, bc2) = self.begin(params, grads.len());
        for i in 0..params.len() {
            let Some(h) = self.hyper(params.kinds[i], lr, bc1, bc2, 1.0) else { continue };
            let (p, g) = (&mut params.tensors[i].data, &grads[i]);
            assert_eq!(p.len(), g.len(), "gradient of {} has the wrong size", params.names[i]);
            p.par_chunks_mut(CHUNK)
                .zip(g.par_chunks(CHUNK))
                .zip(self.m[i].par_chunks_mut(CHUNK).zip(self.v[i].par_chunks_mut(CHUNK)))
                .for_each(|((p, g), (m, v))| simd::adamw(p, g, m, v, &h));
        }
    }

    /// `update` with every gradient multiplied by `grad_scale` first (the clipping factor of
    /// [`clip_coef`], so clipping needs no pass of its own; the same arithmetic as scaling the
    /// gradients in place and calling `update`), after which the gradients are set to zero for
    /// the next step's accumulation while they are still in cache. With `sparse`, the rows of
    /// that parameter outside its touched set have a zero gradient: AdamW runs on them with a
    /// zero gradient it does not read (the same bits), and they are not zeroed again. The
    /// gradients of the parameters that `leave` marks are left as they are (their next step
    /// overwrites them, see `backend::cpu::GradLedger`).
    #[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
    pub fn update_scaled_and_zero(
        &mut self,
        params: &mut Params,
        grads: &mut [Vec<f32>],
        lr: f64,
        grad_scale: f32,
        sparse: Option<&SparseRows>,
        leave: Option<&[bool]>,
    ) {
        let (bc1, bc2) = self.begin(params, grads.len());
        for i in 0..params.len() {
            let Some(h) = self.hyper(params.kinds[i], lr, bc1, bc2, grad_scale) else { continue };
            let (p, g) = (&mut params.tensors[i].data, &mut grads[i]);
            assert_eq!(p.len(), g.len(), "gradient of {} has the wrong size", params.names[i]);
            let (m, v) = (&mut self.m[i], &mut self.v[i]);
            match sparse.filter(|s| s.param == i) {
                Some(sp) => {
                    let cols = sp.cols.max(1);
                    assert_eq!(p.len(), sp.touched.len() * cols, "touched rows of {}", params.names[i]);
                    // Tasks of whole rows; within a task, runs of rows touched or not.
                    let rows = (CHUNK / cols).max(1);
                    let n = rows * cols;
                    p.par_chunks_mut(n)
                        .zip(g.par_chunks_mut(n))
                        .zip(m.par_chunks_mut(n).zip(v.par_chunks_mut(n)))
                        .zip(sp.touched.par_chunks(rows))
                        .for_each(|(((p, g), (m, v)), touched)| {
                            let mut r0 = 0;
                            while r0 < touched.len() {
                                let t = touched[r0];
                                let r1 = (r0..touched.len()).find(|&r| touched[r] != t).unwrap_or(touched.len());
                                for c0 in (r0 * cols..r1 * cols).step_by(CHUNK) {
                                    let c1 = (c0 + CHUNK).min(r1 * cols);
                                    let (p, m, v) = (&mut p[c0..c1], &mut m[c0..c1], &mut v[c0..c1]);
                                    if t {
                                        simd::adamw(p, &g[c0..c1], m, v, &h);
                                        g[c0..c1].fill(0.0);
                                    } else {
                                        simd::adamw(p, &ZEROS[..c1 - c0], m, v, &h);
                                    }
                                }
                                r0 = r1;
                            }
                        });
                }
                None => {
                    let zero = !leave.is_some_and(|l| l[i]);
                    p.par_chunks_mut(CHUNK)
                        .zip(g.par_chunks_mut(CHUNK))
                        .zip(m.par_chunks_mut(CHUNK).zip(v.par_chunks_mut(CHUNK)))
                        .for_each(|((p, g), (m, v))| {
                            simd::adamw(p, g, m, v, &h);
                            if zero {
                                g.fill(0.0);
                            }
                        })
                }
            }
        }
    }

    /// Counts the step; returns the bias corrections 1 − β1^t and 1 − β2^t.
    fn begin(&mut self, params: &Params, n_grads: usize) -> (f64, f64) {
        assert_eq!(n_grads, params.len(), "one gradient per parameter");
        self.step += 1;
        bias_corrections(&self.config, self.step)
    }

    /// The step's constants for a parameter of `kind` (None: frozen, not updated).
    fn hyper(&self, kind: ParamKind, lr: f64, bc1: f64, bc2: f64, grad_scale: f32) -> Option<AdamWStep> {
        step_constants(&self.config, kind, lr, (bc1, bc2), grad_scale)
    }
}

/// 1 − β1^t and 1 − β2^t for update number `step` (1-based).
pub fn bias_corrections(c: &AdamWConfig, step: u64) -> (f64, f64) {
    let t = step as i32;
    (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t))
}

/// The per-element constants of one update for a parameter of `kind` (None: frozen), given the
/// bias corrections of [`bias_corrections`]; shared with the sharded (ZeRO-1) optimizer.
pub fn step_constants(
    c: &AdamWConfig,
    kind: ParamKind,
    lr: f64,
    (bc1, bc2): (f64, f64),
    grad_scale: f32,
) -> Option<AdamWStep> {
    (kind != ParamKind::Frozen).then(|| AdamWStep {
        beta1: c.beta1 as f32,
        beta2: c.beta2 as f32,
        eps: c.eps as f32,
        step_size: (lr / bc1) as f32,
        bc2_sqrt: bc2.sqrt() as f32,
        decay: if kind == ParamKind::Matrix { (1.0 - lr * c.weight_decay) as f32 } else { 1.0 },
        gscale: grad_scale,
    })
}

/// Elements per parallel task of the optimizer and the norm (64 KiB of f32).
const CHUNK: usize = 1 << 14;

/// A zero gradient for the rows [`SparseRows`] leaves out.
static ZEROS: [f32; CHUNK] = [0.0; CHUNK];

/// The rows of one parameter (the token embedding, [rows, cols]) whose gradient may be nonzero:
/// the rows of the step's token ids. The others are zero and stay zero, so neither the norm nor
/// AdamW needs to read them (with GPT-2's vocabulary and a short batch, almost all of them).
pub struct SparseRows<'a> {
    pub param: usize,
    pub cols: usize,
    pub touched: &'a [bool],
}

/// The global L2 norm of all gradients (of trainable parameters), accumulated in f64 in a fixed
/// order (the same result whatever the thread count).
pub fn global_norm(grads: &[Vec<f32>], params: &Params) -> f64 {
    global_norm_sparse(grads, params, None)
}

/// [`global_norm`], reading only the touched rows of `sparse`'s parameter (the others are zero).
pub fn global_norm_sparse(grads: &[Vec<f32>], params: &Params, sparse: Option<&SparseRows>) -> f64 {
    global_norm_with(grads, params, sparse, None)
}

/// [`global_norm_sparse`] with the parameters' sums of squares that are known already (the
/// same bits: [`sum_squares`] of their gradients) taken from `known`.
pub fn global_norm_with(
    grads: &[Vec<f32>],
    params: &Params,
    sparse: Option<&SparseRows>,
    known: Option<&[Option<f64>]>,
) -> f64 {
    grads
        .iter()
        .zip(&params.kinds)
        .enumerate()
        .filter(|(_, (_, k))| **k != ParamKind::Frozen)
        .map(|(i, (g, _))| match (known.and_then(|k| k[i]), sparse.filter(|s| s.param == i)) {
            (Some(sum), _) => sum,
            (None, Some(sp)) => {
                // Tasks of CHUNK values' worth of rows; each row's sum, added in row order.
                let cols = sp.cols.max(1);
                let rows = (CHUNK / cols).max(1);
                sp.touched
                    .par_chunks(rows)
                    .enumerate()
                    .map(|(c, touched)| {
                        let r0 = c * rows;
                        let sums = touched.iter().enumerate().filter(|(_, &t)| t);
                        sums.map(|(i, _)| simd::sum_squares_f64(&g[(r0 + i) * cols..(r0 + i + 1) * cols])).collect()
                    })
                    .collect::<Vec<Vec<f64>>>()
                    .iter()
                    .flatten()
                    .sum::<f64>()
            }
            (None, None) => sum_squares(g),
        })
        .sum::<f64>()
        .sqrt()
}

/// Σ x² in f64, in fixed-size chunks summed in order (independent of the thread count).
pub fn sum_squares(x: &[f32]) -> f64 {
    x.par_chunks(CHUNK).map(simd::sum_squares_f64).collect::<Vec<f64>>().iter().sum::<f64>()
}

/// PyTorch's `clip_grad_norm_` factor for a global norm: max_norm / (norm + 1e-6) when that is
/// below 1 (and the norm finite), else 1.
pub fn clip_coef(norm: f64, max_norm: f64) -> f32 {
    let coef = max_norm / (norm + 1e-6);
    if coef < 1.0 && norm.is_finite() {
        coef as f32
    } else {
        1.0
    }
}

/// Scales the gradients so that their global norm is at most `max_norm` (PyTorch's
/// `clip_grad_norm_`: factor max_norm / (norm + 1e-6), applied only when it is < 1).
/// Returns the norm before clipping.
pub fn clip_grad_norm(grads: &mut [Vec<f32>], params: &Params, max_norm: f64) -> f64 {
    let norm = global_norm(grads, params);
    let c = clip_coef(norm, max_norm);
    if c < 1.0 {
        grads.iter_mut().for_each(|g| g.par_iter_mut().for_each(|x| *x *= c));
    }
    norm
}

/// The learning-rate schedule, indexed by tokens seen: linear warm-up from 0 to `peak` over
/// `warmup_tokens`, then cosine decay to `min_lr` at `total_tokens`, constant after.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    pub peak: f64,
    pub min_lr: f64,
    pub warmup_tokens: u64,
    pub total_tokens: u64,
}

impl Schedule {
    pub fn lr(&self, tokens: u64) -> f64 {
        if tokens < self.warmup_tokens {
            return self.peak * tokens as f64 / self.warmup_tokens as f64;
        }
        if tokens >= self.total_tokens {
            return self.min_lr;
        }
        let span = (self.total_tokens - self.warmup_tokens).max(1) as f64;
        let progress = (tokens - self.warmup_tokens) as f64 / span;
        self.min_lr + (self.peak - self.min_lr) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Params {
        let mut p = Params::default();
        p.add("w", &[2, 2], ParamKind::Matrix);
        p.add("b", &[2], ParamKind::NoDecay);
        p.add("f", &[1], ParamKind::Frozen);
        p.tensors[0].data = vec![1.0, -2.0, 0.5, 0.0];
        p.tensors[1].data = vec![0.3, -0.3];
        p.tensors[2].data = vec![7.0];
        p
    }

    /// Two AdamW steps computed by hand (in f64) against the implementation.
    #[test]
    #[allow(clippy::needless_range_loop)]
    fn adamw_matches_hand_computed_steps() {
        let mut p = params();
        let c = AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 };
        let mut opt = AdamW::new(c, &p);
        let g1 = vec![vec![0.5, -1.0, 0.0, 2.0], vec![0.1, 0.2], vec![9.0]];
        let g2 = vec![vec![-0.5, 1.0, 0.25, 2.0], vec![0.3, -0.2], vec![9.0]];
        let lr = 0.01;
        // Reference.
        let mut want: Vec<Vec<f64>> = p.tensors.iter().map(|t| t.data.iter().map(|&x| x as f64).collect()).collect();
        let mut m = vec![vec![0.0f64; 4], vec![0.0; 2]];
        let mut v = m.clone();
        for (t, g) in [&g1, &g2].iter().enumerate() {
            let t = (t + 1) as i32;
            for i in 0..2 {
                for j in 0..want[i].len() {
                    let gj = g[i][j] as f64;
                    m[i][j] = 0.9 * m[i][j] + 0.1 * gj;
                    v[i][j] = 0.95 * v[i][j] + 0.05 * gj * gj;
                    let mh = m[i][j] / (1.0 - 0.9f64.powi(t));
                    let vh = v[i][j] / (1.0 - 0.95f64.powi(t));
                    if i == 0 {
                        want[i][j] *= 1.0 - lr * 0.1;
                    }
                    want[i][j] -= lr * mh / (vh.sqrt() + 1e-8);
                }
            }
        }
        opt.update(&mut p, &g1, lr);
        // First step of Adam moves every coordinate with a nonzero gradient by lr·sign(g).
        assert!((p.tensors[1].data[0] as f64 - (0.3 - lr)).abs() < 1e-6);
        opt.update(&mut p, &g2, lr);
        for i in 0..2 {
            for j in 0..want[i].len() {
                let got = p.tensors[i].data[j] as f64;
                assert!((got - want[i][j]).abs() < 1e-6, "param {i}[{j}]: {got} vs {}", want[i][j]);
            }
        }
        assert_eq!(p.tensors[2].data, vec![7.0], "frozen parameters never change");
        assert_eq!(opt.step, 2);
        // A zero gradient on a decayed matrix entry still shrinks it: w[3] started at 0 so stays
        // near the Adam update only; w[0] = 1 shrinks by the decay factor (1 - lr·0.1) twice.
    }

    #[test]
    fn weight_decay_only_on_matrices() {
        let mut p = params();
        let mut opt = AdamW::new(AdamWConfig { weight_decay: 0.5, ..Default::default() }, &p);
        let zeros = p.zeros_like();
        opt.update(&mut p, &zeros, 0.1);
        assert!((p.tensors[0].data[0] - 0.95).abs() < 1e-7);
        assert!((p.tensors[0].data[1] + 1.9).abs() < 1e-6);
        assert_eq!(p.tensors[1].data, vec![0.3, -0.3]);
    }

    #[test]
    fn clipping_scales_to_max_norm() {
        let p = params();
        let mut g = vec![vec![3.0, 0.0, 0.0, 0.0], vec![4.0, 0.0], vec![100.0]];
        assert!((global_norm(&g, &p) - 5.0).abs() < 1e-12, "frozen gradients are not counted");
        let n = clip_grad_norm(&mut g, &p, 1.0);
        assert!((n - 5.0).abs() < 1e-12);
        assert!((global_norm(&g, &p) - 1.0).abs() < 1e-6);
        assert!((g[0][0] - 0.6).abs() < 1e-6 && (g[1][0] - 0.8).abs() < 1e-6);
        // Below the threshold: untouched.
        let mut h = vec![vec![0.3, 0.0, 0.0, 0.0], vec![0.4, 0.0], vec![0.0]];
        clip_grad_norm(&mut h, &p, 1.0);
        assert_eq!(h[0][0], 0.3);
    }

    /// The trainer's fused path (scale inside AdamW, then zero) gives the same bits as clipping
    /// in place and calling `update`.
    #[test]
    fn fused_clip_update_matches_clip_then_update() {
        let (mut p1, mut p2) = (params(), params());
        let mut o1 = AdamW::new(AdamWConfig::default(), &p1);
        let mut o2 = AdamW::new(AdamWConfig::default(), &p2);
        for step in 0..3 {
            let g: Vec<Vec<f32>> = vec![vec![3.0 + step as f32, -1.0, 0.25, 2.0], vec![4.0, -0.5], vec![100.0]];
            let mut a = g.clone();
            clip_grad_norm(&mut a, &p1, 1.0);
            o1.update(&mut p1, &a, 0.01);
            let mut b = g.clone();
            let n = global_norm(&b, &p2);
            // A sum of squares known beforehand is used as is: the same bits when it is the
            // gradient's, and the given value in place of the gradient's (0: as if it were zero).
            let known = [None, Some(sum_squares(&b[1])), None];
            assert_eq!(global_norm_with(&b, &p2, None, Some(&known)), n);
            let mut without = b.clone();
            without[1].fill(0.0);
            let zero = [None, Some(0.0), None];
            assert_eq!(global_norm_with(&b, &p2, None, Some(&zero)), global_norm(&without, &p2));
            assert!(global_norm(&without, &p2) < n);
            let coef = clip_coef(n, 1.0);
            assert!(coef < 1.0);
            // The second gradient is left as it is (stale), not zeroed.
            o2.update_scaled_and_zero(&mut p2, &mut b, 0.01, coef, None, Some(&[false, true, false]));
            assert!(b[0].iter().all(|&x| x == 0.0), "gradients zeroed");
            assert_eq!(b[1], g[1], "a gradient left stale");
            for (x, y) in p1.tensors.iter().zip(&p2.tensors) {
                assert_eq!(x.data, y.data, "step {step}");
            }
        }
        assert_eq!((o1.m, o1.v), (o2.m, o2.v));
    }

    /// With the zero rows of a matrix left out (`SparseRows`), the norm and the fused update give
    /// the same results as the dense ones, and the touched rows are zeroed.
    #[test]
    fn sparse_rows_match_the_dense_update() {
        let (rows, cols) = (3000, 7);
        let mut p = Params::default();
        p.add("emb", &[rows, cols], ParamKind::Matrix);
        p.add("b", &[2], ParamKind::NoDecay);
        p.tensors[0].data = (0..rows * cols).map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0).collect();
        p.tensors[1].data = vec![0.3, -0.3];
        let touched: Vec<bool> = (0..rows).map(|r| r % 13 == 4 || (1000..2100).contains(&r)).collect();
        let (mut p1, mut p2) = (p.clone(), p.clone());
        let mut o1 = AdamW::new(AdamWConfig::default(), &p1);
        let mut o2 = AdamW::new(AdamWConfig::default(), &p2);
        let sp = SparseRows { param: 0, cols, touched: &touched };
        for step in 0..3 {
            let mut g = p.zeros_like();
            for (r, &t) in touched.iter().enumerate() {
                if t && (r + step) % 3 != 0 {
                    for c in 0..cols {
                        g[0][r * cols + c] = ((r * 31 + c * 17 + step) % 23) as f32 / 11.0 - 1.0;
                    }
                }
            }
            g[1] = vec![0.5, -2.0];
            let n = global_norm(&g, &p1);
            assert!((global_norm_sparse(&g, &p2, Some(&sp)) - n).abs() <= 1e-12 * n);
            let coef = clip_coef(n, 1.0);
            let (mut g1, mut g2) = (g.clone(), g);
            o1.update_scaled_and_zero(&mut p1, &mut g1, 0.01, coef, None, None);
            o2.update_scaled_and_zero(&mut p2, &mut g2, 0.01, coef, Some(&sp), None);
            assert!(g2.iter().all(|t| t.iter().all(|&x| x == 0.0)), "gradients zeroed");
            assert_eq!(p1.tensors[0].data, p2.tensors[0].data, "step {step}");
            assert_eq!(p1.tensors[1].data, p2.tensors[1].data);
        }
        assert_eq!((o1.m, o1.v), (o2.m, o2.v));
    }

    #[test]
    fn schedule_warmup_then_cosine() {
        let s = Schedule { peak: 2e-3, min_lr: 0.0, warmup_tokens: 1000, total_tokens: 11000 };
        assert_eq!(s.lr(0), 0.0);
        assert!((s.lr(500) - 1e-3).abs() < 1e-15);
        assert!((s.lr(1000) - 2e-3).abs() < 1e-15);
        assert!((s.lr(6000) - 1e-3).abs() < 1e-12, "half-way through the decay: half the peak");
        assert!((s.lr(3500) - 2e-3 * 0.5 * (1.0 + (std::f64::consts::PI * 0.25).cos())).abs() < 1e-15);
        assert!(s.lr(11000).abs() < 1e-15);
        assert_eq!(s.lr(20000), 0.0);
        let f = Schedule { min_lr: 1e-4, ..s };
        assert!((f.lr(11000) - 1e-4).abs() < 1e-15);
        // Monotone decreasing after warm-up.
        let lrs: Vec<f64> = (1000..=11000).step_by(100).map(|t| s.lr(t)).collect();
        assert!(lrs.windows(2).all(|w| w[1] <= w[0]));
    }
}
