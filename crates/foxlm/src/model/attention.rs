//! The Forgetting Attention layer (SPEC §2, "Attention layer, in order").

use super::cache::LayerCache;
use super::{grad_of, Ctx, Linear};
use crate::config::{Config, FgateType, QK_NORM_EPS};
use crate::tensor::{ParamId, ParamKind, Params};
use fox_kernels::attention::{self as fa, View, Visibility};
use fox_kernels::scalar::sigmoid;
use fox_kernels::{fgate, kv_shift, rmsnorm, rope};

/// k_proj / v_proj: a Linear, or with KV-shift a Linear plus its per-head mixing gate.
#[derive(Clone, Debug)]
pub struct ShiftLinear {
    pub linear: Linear,
    /// None without KV-shift.
    pub shift_proj: Option<Linear>,
}

#[derive(Clone, Debug)]
pub enum Fgate {
    Full {
        proj: Linear,
        bias: ParamId,
    },
    /// bias_only (learned) and fixed (frozen) both read `attn.fgate_bias`.
    Bias(ParamId),
    None,
}

#[derive(Clone, Debug)]
pub struct ForgettingAttention {
    pub q_proj: Linear,
    pub k_proj: ShiftLinear,
    pub v_proj: ShiftLinear,
    pub o_proj: Linear,
    pub fgate: Fgate,
    pub ogate_proj: Option<Linear>,
    pub output_norm: Option<ParamId>,
    /// (q_norm, k_norm) weights: [d] per head and channel, or [head_dim] shared across heads.
    pub qk_norm: Option<(ParamId, ParamId)>,
    pub heads: usize,
    pub head_dim: usize,
    pub rope_base: Option<f64>,
    pub norm_eps: f32,
    pub log_pruning_tolerance: Option<f32>,
}

/// Everything the layer's backward needs, named as in SPEC §2.
#[derive(Clone, Debug, Default)]
pub struct AttnActs {
    /// q = W_q x before QK-norm, [B, T, d].
    pub q_lin: Vec<f32>,
    /// k̃ = W_k x and ṽ = W_v x before KV-shift, [B, T, d].
    pub k_lin: Vec<f32>,
    pub v_lin: Vec<f32>,
    /// KV-shift mixing weights α = sigmoid(shift_proj x), [B, T, H] (empty without KV-shift).
    pub alpha_k: Vec<f32>,
    pub alpha_v: Vec<f32>,
    /// k after KV-shift, before QK-norm, [B, T, d].
    pub k_mix: Vec<f32>,
    /// 1/rms of each head slice for QK-norm, [B·T·H].
    pub q_rstd: Vec<f32>,
    pub k_rstd: Vec<f32>,
    /// The attention's inputs: q, k (after QK-norm and RoPE) and v, [B, T, d].
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Forget-gate logits [B, T, H] and their log-sigmoid prefix sums c, [B, H, T].
    pub fgate_logit: Vec<f32>,
    pub c: Vec<f32>,
    /// Attention output [B, T, d] and per-row log-sum-exp [B, H, T].
    pub o: Vec<f32>,
    pub lse: Vec<f32>,
    /// Output norm: 1/rms per head slice and the normalised output, [B, T, d].
    pub o_rstd: Vec<f32>,
    pub o_norm: Vec<f32>,
    /// Output-gate logits, [B, T, d].
    pub ogate_logit: Vec<f32>,
    /// The input of o_proj, [B, T, d].
    pub z: Vec<f32>,
    /// ACP thresholds per (b, h), when pruning is on.
    pub prune: Option<Vec<f32>>,
    /// Key tiles the attention visited and the ones ACP skipped (for reporting the pruned fraction).
    pub tiles_visited: usize,
    pub tiles_pruned: usize,
}

impl ForgettingAttention {
    pub fn new(p: &mut Params, cfg: &Config, prefix: &str) -> Self {
        let d = cfg.hidden_size;
        let h = cfg.num_heads;
        let hd = cfg.head_dim();
        let shift = |p: &mut Params, name: &str, on: bool| {
            if on {
                ShiftLinear {
                    linear: Linear::new(p, &format!("{prefix}.{name}.linear.weight"), d, d),
                    shift_proj: Some(Linear::new(p, &format!("{prefix}.{name}.shift_proj.weight"), h, d)),
                }
            } else {
                ShiftLinear { linear: Linear::new(p, &format!("{prefix}.{name}.weight"), d, d), shift_proj: None }
            }
        };
        let q_proj = Linear::new(p, &format!("{prefix}.q_proj.weight"), d, d);
        let k_proj = shift(p, "k_proj", cfg.use_k_shift);
        let v_proj = shift(p, "v_proj", cfg.use_v_shift);
        let o_proj = Linear::new(p, &format!("{prefix}.o_proj.weight"), d, d);
        let fgate = match cfg.fgate_type {
            FgateType::Full => Fgate::Full {
                proj: Linear::new(p, &format!("{prefix}.fgate_proj.weight"), h, d),
                bias: p.add(&format!("{prefix}.fgate_proj.bias"), &[h], ParamKind::NoDecay),
            },
            FgateType::BiasOnly => Fgate::Bias(p.add(&format!("{prefix}.fgate_bias"), &[h], ParamKind::NoDecay)),
            FgateType::Fixed => Fgate::Bias(p.add(&format!("{prefix}.fgate_bias"), &[h], ParamKind::Frozen)),
            FgateType::None => Fgate::None,
        };
        let ogate_proj = cfg.use_output_gate.then(|| Linear::new(p, &format!("{prefix}.ogate_proj.weight"), d, d));
        let output_norm =
            cfg.use_output_norm.then(|| p.add(&format!("{prefix}.output_norm.weight"), &[d], ParamKind::NoDecay));
        let qk_norm = cfg.qk_norm.then(|| {
            let n = if cfg.qk_norm_share_param_across_head { hd } else { d };
            (
                p.add(&format!("{prefix}.q_norm.weight"), &[n], ParamKind::NoDecay),
                p.add(&format!("{prefix}.k_norm.weight"), &[n], ParamKind::NoDecay),
            )
        });
        Self {
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            fgate,
            ogate_proj,
            output_norm,
            qk_norm,
            heads: h,
            head_dim: hd,
            rope_base: cfg.use_rope.then_some(cfg.rope_base),
            norm_eps: cfg.norm_eps as f32,
            log_pruning_tolerance: cfg.log_pruning_tolerance.map(|v| v as f32),
        }
    }

    /// Forward over x: [B, T, d] (the attn_norm output). With a cache, the T tokens are appended
    /// after the cached ones and attend to them too.
    pub fn forward(&self, p: &Params, x: &[f32], ctx: &Ctx, cache: Option<&mut LayerCache>) -> (Vec<f32>, AttnActs) {
        let (b, t) = (ctx.batch, ctx.seq);
        let (h, hd) = (self.heads, self.head_dim);
        let d = h * hd;
        let n = b * t;
        let past = cache.as_ref().map_or(0, |c| c.len);
        let mut a = AttnActs { q_lin: self.q_proj.forward(p, x, n), ..Default::default() };

        // KV-shift mixes each token's k̃ with the previous token's (the cached one when decoding).
        // Left padding only matters on the chunk that starts the sequence.
        let start = if past == 0 { ctx.start.as_deref() } else { None };
        let project = |sl: &ShiftLinear, prev: Option<&[f32]>| -> (Vec<f32>, Vec<f32>, Vec<f32>) {
            let lin = sl.linear.forward(p, x, n);
            match &sl.shift_proj {
                None => (lin.clone(), lin, vec![]),
                Some(sp) => {
                    let mut alpha = sp.forward(p, x, n);
                    alpha.iter_mut().for_each(|v| *v = sigmoid(*v));
                    let mut out = vec![0.0; n * d];
                    kv_shift::kv_shift_fwd(&mut out, &lin, &alpha, prev, start, b, t, h, hd);
                    (lin, out, alpha)
                }
            }
        };
        let (k_prev, v_prev) = match &cache {
            Some(c) if past > 0 => (Some(c.k_shift.as_slice()), Some(c.v_shift.as_slice())),
            _ => (None, None),
        };
        let (k_lin, k_mix, alpha_k) = project(&self.k_proj, k_prev);
        let (v_lin, v, alpha_v) = project(&self.v_proj, v_prev);
        a.k_lin = k_lin;
        a.alpha_k = alpha_k;
        a.v_lin = v_lin;
        a.alpha_v = alpha_v;
        a.v = v;

        // QK-norm over each head's slice (eps 1e-5, as the reference's norm default).
        let (mut q, mut k) = (a.q_lin.clone(), k_mix.clone());
        if let Some((qn, kn)) = self.qk_norm {
            a.q_rstd = vec![0.0; n * h];
            a.k_rstd = vec![0.0; n * h];
            rmsnorm::rms_norm_fwd(&mut q, &mut a.q_rstd, &a.q_lin, &p[qn], hd, QK_NORM_EPS);
            rmsnorm::rms_norm_fwd(&mut k, &mut a.k_rstd, &k_mix, &p[kn], hd, QK_NORM_EPS);
        }
        a.k_mix = k_mix;
        if let Some(base) = self.rope_base {
            // Positions relative to each row's first real token (RoPE depends only on differences).
            let pos: Vec<i64> = (0..n)
                .map(|r| {
                    let (bi, ti) = (r / t, r % t);
                    (past + ti) as i64 - ctx.start.as_ref().map_or(0, |s| s[bi] as i64)
                })
                .collect();
            rope::rope_apply(&mut q, &pos, h, hd, base, false);
            rope::rope_apply(&mut k, &pos, h, hd, base, false);
        }

        // Forget gate: a = logsigmoid(logit), c = running prefix sum (continued from the cache).
        let mut c = vec![0.0f32; b * h * t];
        if !matches!(self.fgate, Fgate::None) {
            a.fgate_logit = match &self.fgate {
                Fgate::Full { proj, bias } => {
                    let mut l = proj.forward(p, x, n);
                    for (i, v) in l.iter_mut().enumerate() {
                        *v += p[*bias][i % h];
                    }
                    l
                }
                Fgate::Bias(bias) => (0..n * h).map(|i| p[*bias][i % h]).collect(),
                Fgate::None => unreachable!(),
            };
            let mut la = vec![0.0; n * h];
            fgate::log_fgate_fwd(&mut la, &a.fgate_logit);
            fgate::prefix_sum_fwd(&mut c, &la, start, t, h);
        }
        if let Some(cache) = &cache {
            if past > 0 {
                for bh in 0..b * h {
                    let last = cache.c_at(bh, past - 1);
                    c[bh * t..(bh + 1) * t].iter_mut().for_each(|v| *v += last);
                }
            }
        }

        // ACP threshold δ = −(2U + ln N) + ln ε per (b, h).
        let n_keys = past + t;
        let prune = self.log_pruning_tolerance.map(|log_eps| {
            let u: Vec<f32> = match self.qk_norm {
                Some((qn, kn)) => {
                    let (wq, wk) = (&p[qn], &p[kn]);
                    let per_head = |w: &[f32], hi: usize| -> f32 {
                        let s = if w.len() == hd { w } else { &w[hi * hd..(hi + 1) * hd] };
                        s.iter().fold(0.0f32, |m, v| m.max(v.abs()))
                    };
                    (0..b * h).map(|bh| (hd as f32).sqrt() * per_head(wq, bh % h) * per_head(wk, bh % h)).collect()
                }
                None => {
                    let pr = fa::Problem {
                        batch: b,
                        heads: h,
                        head_dim: hd,
                        tq: t,
                        tk: t,
                        q_pos0: 0,
                        q: View::bthd(&q, t, h, hd),
                        k: View::bthd(&k, t, h, hd),
                        v: View::bthd(&a.v, t, h, hd),
                        cq: &c,
                        ck: &c,
                        vis: Visibility::All,
                        scale: 1.0 / (hd as f32).sqrt(),
                        prune: None,
                    };
                    fa::logit_bound_from_norms(&pr)
                }
            };
            fa::prune_thresholds(&u, n_keys, log_eps)
        });

        let scale = 1.0 / (hd as f32).sqrt();
        let mut o = vec![0.0f32; n * d];
        let vis = match &ctx.start {
            Some(s) => Visibility::LeftPadded(s),
            None => Visibility::All,
        };
        match cache {
            None => {
                let pr = fa::Problem {
                    batch: b,
                    heads: h,
                    head_dim: hd,
                    tq: t,
                    tk: t,
                    q_pos0: 0,
                    q: View::bthd(&q, t, h, hd),
                    k: View::bthd(&k, t, h, hd),
                    v: View::bthd(&a.v, t, h, hd),
                    cq: &c,
                    ck: &c,
                    vis,
                    scale,
                    prune: prune.as_deref(),
                };
                let st = fa::forward(&pr, &mut o);
                (a.lse, a.tiles_visited, a.tiles_pruned) = (st.lse, st.tiles_visited, st.tiles_pruned);
            }
            Some(cache) => {
                cache.append(&k, &a.v, &c, t);
                for bi in 0..b {
                    let r = (bi * t + t - 1) * d;
                    cache.k_shift[bi * d..(bi + 1) * d].copy_from_slice(&a.k_lin[r..r + d]);
                    cache.v_shift[bi * d..(bi + 1) * d].copy_from_slice(&a.v_lin[r..r + d]);
                }
                let ck = cache.c_compact();
                let pr = fa::Problem {
                    batch: b,
                    heads: h,
                    head_dim: hd,
                    tq: t,
                    tk: cache.len,
                    q_pos0: past,
                    q: View::bthd(&q, t, h, hd),
                    k: cache.k_view(),
                    v: cache.v_view(),
                    cq: &c,
                    ck: &ck,
                    vis,
                    scale,
                    prune: prune.as_deref(),
                };
                let st = fa::forward(&pr, &mut o);
                (a.lse, a.tiles_visited, a.tiles_pruned) = (st.lse, st.tiles_visited, st.tiles_pruned);
            }
        }
        a.q = q;
        a.k = k;
        a.c = c;
        a.prune = prune;

        // Output: per-head RMSNorm (× sigmoid gate), or the gate alone, then o_proj.
        let mut z = o.clone();
        if let Some(w) = self.output_norm {
            a.o_rstd = vec![0.0; n * h];
            a.o_norm = vec![0.0; n * d];
            rmsnorm::rms_norm_fwd(&mut a.o_norm, &mut a.o_rstd, &o, &p[w], hd, self.norm_eps);
            z.copy_from_slice(&a.o_norm);
        }
        if let Some(g) = &self.ogate_proj {
            a.ogate_logit = g.forward(p, x, n);
            for (zv, gv) in z.iter_mut().zip(&a.ogate_logit) {
                *zv *= sigmoid(*gv);
            }
        }
        a.o = o;
        let y = self.o_proj.forward(p, &z, n);
        a.z = z;
        (y, a)
    }

    /// Backward of a full-sequence `forward` (no cache) over x: [B, T, d] with its saved `a`:
    /// from dy [B, T, d] returns dx [B, T, d] and adds every parameter's gradient to `grads`.
    /// ACP thresholds are constants of the forward: the backward skips the tiles it skipped.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        p: &Params,
        x: &[f32],
        ctx: &Ctx,
        a: &AttnActs,
        dy: &[f32],
        grads: &mut [Vec<f32>],
    ) -> Vec<f32> {
        let (b, t) = (ctx.batch, ctx.seq);
        let (h, hd) = (self.heads, self.head_dim);
        let d = h * hd;
        let n = b * t;
        assert_eq!(a.q.len(), n * d, "attention backward needs the activations of a full forward without cache");
        assert_eq!(dy.len(), n * d);
        let start = ctx.start.as_deref();
        let mut dx = vec![0.0f32; x.len()];

        // y = o_proj(z)
        let mut dz = vec![0.0f32; n * d];
        self.o_proj.backward(p, &a.z, dy, n, grads, Some(&mut dz), false);

        // z = pre · sigmoid(g), g = ogate_proj(x): d pre = dz·σ(g), d g = dz·pre·σ(g)(1 − σ(g)).
        if let Some(gp) = &self.ogate_proj {
            let pre: &[f32] = if self.output_norm.is_some() { &a.o_norm } else { &a.o };
            let mut dg = vec![0.0f32; n * d];
            for ((dzv, dgv), (&pv, &gv)) in dz.iter_mut().zip(dg.iter_mut()).zip(pre.iter().zip(&a.ogate_logit)) {
                let s = sigmoid(gv);
                *dgv = *dzv * pv * s * (1.0 - s);
                *dzv *= s;
            }
            gp.backward(p, x, &dg, n, grads, Some(&mut dx), true);
        }

        // pre = RMSNorm_per_head(o) · γ, or o itself.
        let d_o = match self.output_norm {
            Some(w) => {
                let mut d_o = vec![0.0f32; n * d];
                rmsnorm::rms_norm_bwd(&mut d_o, false, &mut grads[w.0], &dz, &a.o, &a.o_rstd, &p[w], hd);
                d_o
            }
            None => dz,
        };

        // Forgetting Attention, on exactly the forward's problem (visibility and ACP included).
        let pr = fa::Problem {
            batch: b,
            heads: h,
            head_dim: hd,
            tq: t,
            tk: t,
            q_pos0: 0,
            q: View::bthd(&a.q, t, h, hd),
            k: View::bthd(&a.k, t, h, hd),
            v: View::bthd(&a.v, t, h, hd),
            cq: &a.c,
            ck: &a.c,
            vis: match start {
                Some(s) => Visibility::LeftPadded(s),
                None => Visibility::All,
            },
            scale: 1.0 / (hd as f32).sqrt(),
            prune: a.prune.as_deref(),
        };
        let fa::Grads { mut dq, mut dk, dv, dcq, dck } = fa::backward(&pr, &a.o, &d_o, &a.lse);

        // The gate: c = prefix_sum(a), a = logsigmoid(logit); d a = reverse prefix sum of dc.
        if !matches!(self.fgate, Fgate::None) {
            let dc: Vec<f32> = dcq.iter().zip(&dck).map(|(x, y)| x + y).collect();
            let mut da = vec![0.0f32; n * h];
            fgate::prefix_sum_bwd(&mut da, &dc, start, t, h);
            let mut dlogit = vec![0.0f32; n * h];
            fgate::log_fgate_bwd(&mut dlogit, &da, &a.fgate_logit);
            let bias = match &self.fgate {
                Fgate::Full { proj, bias } => {
                    proj.backward(p, x, &dlogit, n, grads, Some(&mut dx), true);
                    *bias
                }
                Fgate::Bias(bias) => *bias,
                Fgate::None => unreachable!(),
            };
            if let Some(gb) = grad_of(p, grads, bias) {
                for row in dlogit.chunks_exact(h) {
                    gb.iter_mut().zip(row).for_each(|(g, v)| *g += v);
                }
            }
        }

        // RoPE: a rotation, so its backward is the inverse rotation.
        if let Some(base) = self.rope_base {
            let pos: Vec<i64> = (0..n).map(|r| (r % t) as i64 - start.map_or(0, |s| s[r / t] as i64)).collect();
            rope::rope_apply(&mut dq, &pos, h, hd, base, true);
            rope::rope_apply(&mut dk, &pos, h, hd, base, true);
        }

        // QK-norm (per head, weights per head or shared: rms_norm_bwd sums shared ones over heads).
        let (dq_lin, dk_mix) = match self.qk_norm {
            Some((qn, kn)) => {
                let mut dq_lin = vec![0.0f32; n * d];
                let mut dk_mix = vec![0.0f32; n * d];
                rmsnorm::rms_norm_bwd(&mut dq_lin, false, &mut grads[qn.0], &dq, &a.q_lin, &a.q_rstd, &p[qn], hd);
                rmsnorm::rms_norm_bwd(&mut dk_mix, false, &mut grads[kn.0], &dk, &a.k_mix, &a.k_rstd, &p[kn], hd);
                (dq_lin, dk_mix)
            }
            None => (dq, dk),
        };

        self.q_proj.backward(p, x, &dq_lin, n, grads, Some(&mut dx), true);
        self.k_proj.backward(p, x, &a.k_lin, &a.alpha_k, &dk_mix, ctx, h, grads, &mut dx);
        self.v_proj.backward(p, x, &a.v_lin, &a.alpha_v, &dv, ctx, h, grads, &mut dx);
        dx
    }
}

impl ShiftLinear {
    /// Backward of k = KV-shift(W x, sigmoid(shift_proj x)) (or of W x alone): adds to dx and to the
    /// weights' gradients. `lin` = W x and `alpha` are the forward's, dout = d loss / d k.
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &self,
        p: &Params,
        x: &[f32],
        lin: &[f32],
        alpha: &[f32],
        dout: &[f32],
        ctx: &Ctx,
        heads: usize,
        grads: &mut [Vec<f32>],
        dx: &mut [f32],
    ) {
        let (t, n) = (ctx.seq, ctx.batch * ctx.seq);
        match &self.shift_proj {
            None => self.linear.backward(p, x, dout, n, grads, Some(dx), true),
            Some(sp) => {
                let d = self.linear.out_features;
                let mut dlin = vec![0.0f32; n * d];
                let mut dalpha = vec![0.0f32; n * heads];
                kv_shift::kv_shift_bwd(
                    &mut dlin,
                    &mut dalpha,
                    dout,
                    lin,
                    alpha,
                    ctx.start.as_deref(),
                    t,
                    heads,
                    d / heads,
                );
                // α = sigmoid(s): dα/ds = α(1 − α).
                dalpha.iter_mut().zip(alpha).for_each(|(g, &al)| *g *= al * (1.0 - al));
                sp.backward(p, x, &dalpha, n, grads, Some(&mut *dx), true);
                self.linear.backward(p, x, &dlin, n, grads, Some(dx), true);
            }
        }
    }
}
