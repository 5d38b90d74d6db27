//! The attention family (SPEC §2, "Attention layer, in order"): the Forgetting Attention layer of
//! FoX, which with the gate off and RoPE on is the Transformer's. Its backend operations are
//! [`ops::AttnOps`] (CPU: `cpu.rs`, CUDA: `cuda.rs`); its inference state is the KV cache
//! ([`kv_cache::KvCache`] on the CPU).

pub mod cpu;
pub mod cuda;
pub mod fused_cuda;
pub mod kv_cache;
pub mod kv_cache_cuda;
pub mod ops;

use super::{Linear, MixerGrad};
use crate::backend::Alloc;
use crate::backend::Norm;
use crate::config::{Config, FgateType, QK_NORM_EPS};
use crate::tensor::{ParamId, ParamKind, Params};
use anyhow::Result;
use ops::{AttnGrads, AttnIn, AttnOps, AttnShape};

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
    /// (q_norm, k_norm) weights: [H·head_dim] and [H_kv·head_dim] per head and channel, or
    /// [head_dim] shared across heads.
    pub qk_norm: Option<(ParamId, ParamId)>,
    pub heads: usize,
    /// k/v heads H_kv (grouped-query attention when < heads); k, v are [B, T, H_kv·head_dim].
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Sliding window: the query at position i sees keys i − w < j ≤ i.
    pub window: Option<usize>,
    pub rope_base: Option<f64>,
    pub norm_eps: f32,
    pub log_pruning_tolerance: Option<f32>,
}

/// Everything the layer's backward needs, named as in SPEC §2 (A: activation buffers, F: f32).
/// Buffers of switched-off components are empty.
#[derive(Clone, Debug, Default)]
pub struct AttnActs<A, F> {
    /// q = W_q x before QK-norm, [B, T, d].
    pub q_lin: A,
    /// k̃ = W_k x and ṽ = W_v x before KV-shift, [B, T, d_kv] with d_kv = H_kv·head_dim (empty
    /// without KV-shift: k_mix and v are the projections themselves).
    pub k_lin: A,
    pub v_lin: A,
    /// KV-shift mixing weights α = sigmoid(shift_proj x), [B, T, H_kv] (empty without KV-shift).
    pub alpha_k: A,
    pub alpha_v: A,
    /// k after KV-shift, before QK-norm, [B, T, d_kv].
    pub k_mix: A,
    /// 1/rms of each head slice for QK-norm, [B·T·H].
    pub q_rstd: F,
    pub k_rstd: F,
    /// The attention's inputs: q (after QK-norm and RoPE) [B, T, d], k (likewise) and v,
    /// [B, T, d_kv].
    pub q: A,
    pub k: A,
    pub v: A,
    /// Forget-gate logits [B, T, H] and their log-sigmoid prefix sums c, [B, H, T] (zeros
    /// without a gate).
    pub fgate_logit: F,
    pub c: F,
    /// Attention output [B, T, d] and per-row log-sum-exp [B, H, T].
    pub o: A,
    pub lse: F,
    /// Output norm: 1/rms per head slice and the normalised output, [B, T, d].
    pub o_rstd: F,
    pub o_norm: A,
    /// Output-gate logits, [B, T, d].
    pub ogate_logit: A,
    /// The input of o_proj, [B, T, d] (the layer's output o_proj(z) goes to the caller's buffer).
    pub z: A,
    /// ACP thresholds per (b, h), when pruning is on.
    pub prune: Option<F>,
    /// Key tiles the attention visited and the ones ACP skipped (for reporting the pruned fraction).
    pub tiles_visited: usize,
    pub tiles_pruned: usize,
}

/// The layer's backward buffers, shared by all layers.
pub struct AttnScratch<A, F> {
    /// d loss / d z, d output-gate logits, d (attention output), [B, T, d].
    pub dz: A,
    pub dg: A,
    pub d_o: A,
    pub dq: A,
    pub dk: A,
    pub dv: A,
    /// d loss / d q before QK-norm [B, T, d] and d k before QK-norm [B, T, d_kv].
    pub dq_lin: A,
    pub dk_mix: A,
    /// KV-shift: d (unmixed projection) [B, T, d_kv] and d α [B, T, H_kv].
    pub dlin: A,
    pub dalpha: A,
    /// Gate: dc [B, H, T], d log f [B, T, H], d logit [B, T, H] (f32, and as activations for the
    /// projection's backward).
    pub dc: F,
    pub da: F,
    pub dlogit: F,
    pub dlogit_act: A,
}

impl<A, F> AttnActs<A, F> {
    pub fn new<B: Alloc<Act = A, F32 = F>>(be: &B, l: &ForgettingAttention, b: usize, t: usize) -> Result<Self> {
        let (h, hkv, hd) = (l.heads, l.kv_heads, l.head_dim);
        let (n, d, dkv) = (b * t, h * hd, hkv * hd);
        let shift = l.k_proj.shift_proj.is_some() || l.v_proj.shift_proj.is_some();
        let qk = l.qk_norm.is_some();
        Ok(Self {
            q_lin: be.alloc(n * d)?,
            k_lin: be.alloc(if shift { n * dkv } else { 0 })?,
            v_lin: be.alloc(if shift { n * dkv } else { 0 })?,
            alpha_k: be.alloc(if l.k_proj.shift_proj.is_some() { n * hkv } else { 0 })?,
            alpha_v: be.alloc(if l.v_proj.shift_proj.is_some() { n * hkv } else { 0 })?,
            k_mix: be.alloc(n * dkv)?,
            q_rstd: be.alloc_f32(if qk { n * h } else { 0 })?,
            k_rstd: be.alloc_f32(if qk { n * hkv } else { 0 })?,
            q: be.alloc(n * d)?,
            k: be.alloc(n * dkv)?,
            v: be.alloc(n * dkv)?,
            fgate_logit: be.alloc_f32(if matches!(l.fgate, Fgate::None) { 0 } else { n * h })?,
            c: be.alloc_f32(n * h)?,
            o: be.alloc(n * d)?,
            lse: be.alloc_f32(n * h)?,
            o_rstd: be.alloc_f32(if l.output_norm.is_some() { n * h } else { 0 })?,
            o_norm: be.alloc(if l.output_norm.is_some() { n * d } else { 0 })?,
            ogate_logit: be.alloc(if l.ogate_proj.is_some() { n * d } else { 0 })?,
            z: be.alloc(n * d)?,
            prune: match l.log_pruning_tolerance {
                Some(_) => Some(be.alloc_f32(b * h)?),
                None => None,
            },
            tiles_visited: 0,
            tiles_pruned: 0,
        })
    }
}

impl<A, F> AttnScratch<A, F> {
    pub fn new<B: Alloc<Act = A, F32 = F>>(be: &B, l: &ForgettingAttention, b: usize, t: usize) -> Result<Self> {
        let (h, hd) = (l.heads, l.head_dim);
        let (n, d, dkv) = (b * t, h * hd, l.kv_heads * hd);
        Ok(Self {
            dz: be.alloc(n * d)?,
            dg: be.alloc(n * d)?,
            d_o: be.alloc(n * d)?,
            dq: be.alloc(n * d)?,
            dk: be.alloc(n * dkv)?,
            dv: be.alloc(n * dkv)?,
            dq_lin: be.alloc(n * d)?,
            dk_mix: be.alloc(n * dkv)?,
            dlin: be.alloc(n * dkv)?,
            dalpha: be.alloc(n * l.kv_heads)?,
            dc: be.alloc_f32(n * h)?,
            da: be.alloc_f32(n * h)?,
            dlogit: be.alloc_f32(n * h)?,
            dlogit_act: be.alloc(n * h)?,
        })
    }
}

/// One attention layer's switches and sizes: FoX's from its config.json
/// ([`AttnConfig::from_config`]), or a hybrid's attention layers' (Samba's).
#[derive(Clone, Debug)]
pub struct AttnConfig {
    pub hidden_size: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub k_shift: bool,
    pub v_shift: bool,
    pub fgate: FgateType,
    pub output_gate: bool,
    pub output_norm: bool,
    pub qk_norm: bool,
    pub qk_norm_shared: bool,
    pub window: Option<usize>,
    /// RoPE's theta, None without RoPE.
    pub rope_base: Option<f64>,
    pub norm_eps: f32,
    pub log_pruning_tolerance: Option<f32>,
}

impl AttnConfig {
    /// The attention layers of a FoX / Transformer config.
    pub fn from_config(cfg: &Config) -> Self {
        Self {
            hidden_size: cfg.hidden_size,
            heads: cfg.num_heads,
            kv_heads: cfg.kv_heads(),
            k_shift: cfg.use_k_shift,
            v_shift: cfg.use_v_shift,
            fgate: cfg.fgate_type,
            output_gate: cfg.use_output_gate,
            output_norm: cfg.use_output_norm,
            qk_norm: cfg.qk_norm,
            qk_norm_shared: cfg.qk_norm_share_param_across_head,
            window: cfg.window_size,
            rope_base: cfg.use_rope.then_some(cfg.rope_base),
            norm_eps: cfg.norm_eps as f32,
            log_pruning_tolerance: cfg.log_pruning_tolerance.map(|v| v as f32),
        }
    }

    /// Plain softmax attention with RoPE: the Transformer's layer without its options (Samba's
    /// sliding-window layers).
    pub fn rope(
        hidden_size: usize,
        heads: usize,
        kv_heads: usize,
        window: Option<usize>,
        rope_base: f64,
        norm_eps: f32,
    ) -> Self {
        Self {
            hidden_size,
            heads,
            kv_heads,
            k_shift: false,
            v_shift: false,
            fgate: FgateType::None,
            output_gate: false,
            output_norm: false,
            qk_norm: false,
            qk_norm_shared: false,
            window,
            rope_base: Some(rope_base),
            norm_eps,
            log_pruning_tolerance: None,
        }
    }
}

impl ForgettingAttention {
    pub fn new(p: &mut Params, cfg: &AttnConfig, prefix: &str) -> Self {
        let d = cfg.hidden_size;
        let h = cfg.heads;
        let hd = d / h.max(1);
        // k and v: H_kv heads, each with its own KV-shift gate
        let (hkv, dkv) = (cfg.kv_heads, cfg.kv_heads * hd);
        let shift = |p: &mut Params, name: &str, on: bool| {
            if on {
                ShiftLinear {
                    linear: Linear::new(p, &format!("{prefix}.{name}.linear.weight"), dkv, d),
                    shift_proj: Some(Linear::new(p, &format!("{prefix}.{name}.shift_proj.weight"), hkv, d)),
                }
            } else {
                ShiftLinear { linear: Linear::new(p, &format!("{prefix}.{name}.weight"), dkv, d), shift_proj: None }
            }
        };
        let q_proj = Linear::new(p, &format!("{prefix}.q_proj.weight"), d, d);
        let k_proj = shift(p, "k_proj", cfg.k_shift);
        let v_proj = shift(p, "v_proj", cfg.v_shift);
        let o_proj = Linear::new(p, &format!("{prefix}.o_proj.weight"), d, d);
        let fgate = match cfg.fgate {
            FgateType::Full => Fgate::Full {
                proj: Linear::new(p, &format!("{prefix}.fgate_proj.weight"), h, d),
                bias: p.add(&format!("{prefix}.fgate_proj.bias"), &[h], ParamKind::NoDecay),
            },
            FgateType::BiasOnly => Fgate::Bias(p.add(&format!("{prefix}.fgate_bias"), &[h], ParamKind::NoDecay)),
            FgateType::Fixed => Fgate::Bias(p.add(&format!("{prefix}.fgate_bias"), &[h], ParamKind::Frozen)),
            FgateType::None => Fgate::None,
        };
        let ogate_proj = cfg.output_gate.then(|| Linear::new(p, &format!("{prefix}.ogate_proj.weight"), d, d));
        let output_norm =
            cfg.output_norm.then(|| p.add(&format!("{prefix}.output_norm.weight"), &[d], ParamKind::NoDecay));
        let qk_norm = cfg.qk_norm.then(|| {
            let shared = cfg.qk_norm_shared;
            (
                p.add(&format!("{prefix}.q_norm.weight"), &[if shared { hd } else { d }], ParamKind::NoDecay),
                p.add(&format!("{prefix}.k_norm.weight"), &[if shared { hd } else { dkv }], ParamKind::NoDecay),
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
            kv_heads: hkv,
            head_dim: hd,
            window: cfg.window,
            rope_base: cfg.rope_base,
            norm_eps: cfg.norm_eps,
            log_pruning_tolerance: cfg.log_pruning_tolerance,
        }
    }

    /// The attention's head layout and window.
    pub fn shape(&self) -> AttnShape {
        AttnShape { heads: self.heads, kv_heads: self.kv_heads, head_dim: self.head_dim, window: self.window }
    }

    /// Forward over x: [B, T, d] (the attn_norm output), saving into `a`, the output into `out`. With
    /// a cache, the T tokens are appended after the cached ones and attend to them too.
    pub fn forward<B: AttnOps>(
        &self,
        be: &mut B,
        x: &B::Act,
        batch: &B::Batch,
        a: &mut AttnActs<B::Act, B::F32>,
        out: &mut B::Act,
        mut cache: Option<&mut B::KvCache>,
    ) -> Result<()> {
        let info = be.batch_info(batch);
        let n = info.rows();
        let n_keys = info.past + info.seq;
        // A decode step (one position per row after a cached prefix) may run fused on the backend.
        let fused = match cache.as_deref_mut() {
            Some(c) if info.seq == 1 && info.past > 0 => be.decode_attn_inputs(self, x, batch, a, c)?,
            _ => false,
        };
        if !fused {
            self.inputs(be, x, batch, a, cache.as_deref_mut())?;
        }

        // ACP threshold δ = −(2U + ln N) + ln ε per (b, h).
        if let (Some(log_eps), Some(prune)) = (self.log_pruning_tolerance, a.prune.as_mut()) {
            be.acp_thresholds(prune, self.qk_norm, &a.q, &a.k, batch, self.shape(), n_keys, log_eps)?;
        }
        let (o, lse) = (&mut a.o, &mut a.lse);
        let x_in = AttnIn { q: &a.q, k: &a.k, v: &a.v, c: &a.c, prune: a.prune.as_ref() };
        let tiles = be.attention_fwd(o, lse, x_in, batch, cache, self.shape())?;
        (a.tiles_visited, a.tiles_pruned) = (tiles.visited, tiles.pruned);

        if !(fused && be.decode_attn_output(self, batch, a)?) {
            self.output(be, x, a, n)?;
        }
        be.linear_fwd(out, &a.z, &self.o_proj, n)
    }

    /// The attention's inputs from x, op by op: q, k (KV-shifted), v, QK-norm, RoPE, and the
    /// forget gate's prefix sums c (continuing the cache's, whose KV-shift states advance).
    fn inputs<B: AttnOps>(
        &self,
        be: &mut B,
        x: &B::Act,
        batch: &B::Batch,
        a: &mut AttnActs<B::Act, B::F32>,
        mut cache: Option<&mut B::KvCache>,
    ) -> Result<()> {
        let info = be.batch_info(batch);
        let (h, hkv, hd) = (self.heads, self.kv_heads, self.head_dim);
        let n = info.rows();
        be.linear_fwd(&mut a.q_lin, x, &self.q_proj, n)?;

        // KV-shift mixes each token's k̃ with the previous token's (the cached one when decoding).
        for (sl, value) in [(&self.k_proj, false), (&self.v_proj, true)] {
            let (lin, alpha, out) = if value {
                (&mut a.v_lin, &mut a.alpha_v, &mut a.v)
            } else {
                (&mut a.k_lin, &mut a.alpha_k, &mut a.k_mix)
            };
            match &sl.shift_proj {
                None => be.linear_fwd(out, x, &sl.linear, n)?,
                Some(sp) => {
                    be.linear_fwd(lin, x, &sl.linear, n)?;
                    // α = sigmoid(shift_proj x), in place over the logits.
                    be.linear_fwd(alpha, x, sp, n)?;
                    be.sigmoid_inplace(alpha, n * hkv)?;
                    be.kv_shift_fwd(out, lin, alpha, batch, cache.as_deref(), value, hkv, hd)?;
                }
            }
        }
        if let Some(c) = cache.as_deref_mut() {
            be.cache_shift_states(c, &a.k_lin, &a.v_lin, batch)?;
        }

        // QK-norm over each head's slice (eps 1e-5, as the reference's norm default).
        match self.qk_norm {
            Some((qn, kn)) => {
                be.rms_norm_fwd(
                    &mut a.q,
                    &mut a.q_rstd,
                    &a.q_lin,
                    Norm { w: qn, rows: n * h, dim: hd, eps: QK_NORM_EPS },
                )?;
                be.rms_norm_fwd(
                    &mut a.k,
                    &mut a.k_rstd,
                    &a.k_mix,
                    Norm { w: kn, rows: n * hkv, dim: hd, eps: QK_NORM_EPS },
                )?;
            }
            None => {
                be.copy(&mut a.q, &a.q_lin, n * h * hd)?;
                be.copy(&mut a.k, &a.k_mix, n * hkv * hd)?;
            }
        }
        if let Some(base) = self.rope_base {
            be.rope(&mut a.q, batch, h, hd, base, false)?;
            be.rope(&mut a.k, batch, hkv, hd, base, false)?;
        }

        // Forget gate: a = logsigmoid(logit), c = running prefix sum (continued from the cache).
        match &self.fgate {
            Fgate::None => be.zero_f32(&mut a.c, n * h)?,
            gate => {
                match gate {
                    Fgate::Full { proj, bias } => {
                        be.linear_fwd_f32(&mut a.fgate_logit, x, proj, n)?;
                        be.fgate_bias(&mut a.fgate_logit, *bias, n, h, true)?;
                    }
                    Fgate::Bias(bias) => be.fgate_bias(&mut a.fgate_logit, *bias, n, h, false)?,
                    Fgate::None => unreachable!("handled above"),
                }
                // log f goes through `lse` as a scratch buffer (same size; overwritten below).
                be.log_fgate_fwd(&mut a.lse, &a.fgate_logit, n * h)?;
                be.prefix_sum_fwd(&mut a.c, &a.lse, batch, cache.as_deref(), h)?;
            }
        }
        Ok(())
    }

    /// The input of o_proj, op by op: per-head RMSNorm of the attention output (× sigmoid output
    /// gate), or the gate alone, into `a.z`.
    fn output<B: AttnOps>(&self, be: &mut B, x: &B::Act, a: &mut AttnActs<B::Act, B::F32>, n: usize) -> Result<()> {
        let (h, hd) = (self.heads, self.head_dim);
        let pre = match self.output_norm {
            Some(w) => {
                be.rms_norm_fwd(
                    &mut a.o_norm,
                    &mut a.o_rstd,
                    &a.o,
                    Norm { w, rows: n * h, dim: hd, eps: self.norm_eps },
                )?;
                &a.o_norm
            }
            None => &a.o,
        };
        match &self.ogate_proj {
            Some(g) => {
                be.linear_fwd(&mut a.ogate_logit, x, g, n)?;
                be.gate_mul_fwd(&mut a.z, pre, &a.ogate_logit, n * h * hd)?;
            }
            None => be.copy(&mut a.z, pre, n * h * hd)?,
        }
        Ok(())
    }

    /// Backward of a full-sequence `forward` (no cache) over x: [B, T, d] with its saved `a`:
    /// from dy [B, T, d] writes dx [B, T, d] and adds every parameter's gradient in the backend.
    /// ACP thresholds are constants of the forward: the backward skips the tiles it skipped.
    pub fn backward<B: AttnOps>(
        &self,
        be: &mut B,
        g: MixerGrad<'_, B::Act, B::Batch>,
        a: &AttnActs<B::Act, B::F32>,
        s: &mut AttnScratch<B::Act, B::F32>,
    ) -> Result<()> {
        let MixerGrad { x, batch, dy, dx } = g;
        let info = be.batch_info(batch);
        let (h, hkv, hd) = (self.heads, self.kv_heads, self.head_dim);
        let n = info.rows();

        // y = o_proj(z)
        be.linear_bwd(&self.o_proj, &a.z, dy, Some(&mut s.dz), false, n)?;
        // dx is written by the first projection's backward below, then accumulated.
        let mut dx_started = false;

        // z = pre · sigmoid(g), g = ogate_proj(x).
        let pre = if self.output_norm.is_some() { &a.o_norm } else { &a.o };
        if let Some(gp) = &self.ogate_proj {
            be.gate_mul_bwd(&mut s.d_o, &mut s.dg, &s.dz, pre, &a.ogate_logit)?;
            std::mem::swap(&mut s.dz, &mut s.d_o);
            be.linear_bwd(gp, x, &s.dg, Some(&mut *dx), dx_started, n)?;
            dx_started = true;
        }

        // pre = RMSNorm_per_head(o) · γ, or o itself: s.d_o = d loss / d o.
        match self.output_norm {
            Some(w) => be.rms_norm_bwd(&mut s.d_o, false, w, &s.dz, &a.o, &a.o_rstd, hd)?,
            None => std::mem::swap(&mut s.d_o, &mut s.dz),
        }

        // Forgetting Attention, on exactly the forward's problem (visibility and ACP included).
        let grads = AttnGrads { dq: &mut s.dq, dk: &mut s.dk, dv: &mut s.dv, dc: &mut s.dc };
        let x_in = AttnIn { q: &a.q, k: &a.k, v: &a.v, c: &a.c, prune: a.prune.as_ref() };
        be.attention_bwd(grads, x_in, &a.o, &s.d_o, &a.lse, batch, self.shape())?;

        // The gate: c = prefix_sum(a), a = logsigmoid(logit); d a = reverse prefix sum of dc.
        if !matches!(self.fgate, Fgate::None) {
            be.prefix_sum_bwd(&mut s.da, &s.dc, batch, h)?;
            be.log_fgate_bwd(&mut s.dlogit, &s.da, &a.fgate_logit)?;
            let bias = match &self.fgate {
                Fgate::Full { proj, bias } => {
                    be.cast_to_act(&mut s.dlogit_act, &s.dlogit)?;
                    be.linear_bwd(proj, x, &s.dlogit_act, Some(&mut *dx), dx_started, n)?;
                    dx_started = true;
                    *bias
                }
                Fgate::Bias(bias) => *bias,
                Fgate::None => unreachable!("checked above"),
            };
            be.fgate_bias_bwd(bias, &s.dlogit, n, h)?;
        }

        // RoPE: a rotation, so its backward is the inverse rotation.
        if let Some(base) = self.rope_base {
            be.rope(&mut s.dq, batch, h, hd, base, true)?;
            be.rope(&mut s.dk, batch, hkv, hd, base, true)?;
        }

        // QK-norm (per head, weights per head or shared: the backend sums shared ones over heads).
        let (dq_lin, dk_mix) = match self.qk_norm {
            Some((qn, kn)) => {
                be.rms_norm_bwd(&mut s.dq_lin, false, qn, &s.dq, &a.q_lin, &a.q_rstd, hd)?;
                be.rms_norm_bwd(&mut s.dk_mix, false, kn, &s.dk, &a.k_mix, &a.k_rstd, hd)?;
                (&s.dq_lin, &s.dk_mix)
            }
            None => (&s.dq, &s.dk),
        };
        be.linear_bwd(&self.q_proj, x, dq_lin, Some(&mut *dx), dx_started, n)?;

        // k, v = KV-shift(W x, sigmoid(shift_proj x)) or W x.
        for (sl, lin, alpha, dout) in
            [(&self.k_proj, &a.k_lin, &a.alpha_k, dk_mix), (&self.v_proj, &a.v_lin, &a.alpha_v, &s.dv)]
        {
            match &sl.shift_proj {
                None => be.linear_bwd(&sl.linear, x, dout, Some(&mut *dx), true, n)?,
                Some(sp) => {
                    be.kv_shift_bwd(&mut s.dlin, &mut s.dalpha, dout, lin, alpha, batch, hkv, hd)?;
                    // α = sigmoid(s): dα/ds = α(1 − α), in place.
                    be.sigmoid_bwd_inplace(&mut s.dalpha, alpha)?;
                    be.linear_bwd(sp, x, &s.dalpha, Some(&mut *dx), true, n)?;
                    be.linear_bwd(&sl.linear, x, &s.dlin, Some(&mut *dx), true, n)?;
                }
            }
        }
        Ok(())
    }
}
