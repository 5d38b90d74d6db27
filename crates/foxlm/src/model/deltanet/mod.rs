//! DeltaNet and Gated DeltaNet (SPEC §7; Yang et al. 2024, Yang, Kautz and Hatamizadeh 2025), as
//! fla's `DeltaNet` and `GatedDeltaNet` layers define them: a block is h = h + DeltaNet(RMSNorm(h))
//! then FoX's SwiGLU MLP, h = h + MLP(RMSNorm(h)).
//!
//! q, k, v = SiLU(conv1d(q_proj(x))), SiLU(conv1d(k_proj(x))), SiLU(conv1d(v_proj(x))) (three
//! causal depthwise convolutions of width W, no bias); per head q and k L2-normalised;
//! β = sigmoid(b_proj(x)); Gated DeltaNet's log-decay g = −exp(A_log)·softplus(a_proj(x) + dt_bias);
//! o = the delta rule ([`fox_kernels::delta_rule`]; scale K^−½); per head RMSNorm(o)·w, times
//! SiLU(g_proj(x)) when the layer has the output gate; o_proj. Its backend operations are
//! [`ops::DeltaNetOps`] (CPU: `cpu.rs`; CUDA: `cuda.rs`); its inference state is the delta-rule
//! state and the convolutions' last inputs, fixed in size (`state.rs`; on the GPU `cuda.rs`).

pub mod cpu;
pub mod cuda;
pub mod ops;
pub mod state;

use super::{Linear, MixerGrad};
use crate::backend::Alloc;
use crate::backend::Norm;
use crate::config::{Config, DeltaNetSizes};
use crate::tensor::{ParamKind, Params};
use anyhow::Result;
use ops::{ConvOf, DeltaNetOps, DeltaNetParams, DeltaRuleGradsOf, DeltaRuleIn};

#[derive(Clone, Debug)]
pub struct DeltaNetMixer {
    pub q_proj: Linear,
    pub k_proj: Linear,
    pub v_proj: Linear,
    /// Gated DeltaNet's decay input.
    pub a_proj: Option<Linear>,
    pub b_proj: Linear,
    /// The output gate.
    pub g_proj: Option<Linear>,
    pub o_proj: Linear,
    pub p: DeltaNetParams,
}

/// What the layer's backward reads (A: activation buffers, F: f32).
#[derive(Clone, Debug, Default)]
pub struct DeltaNetActs<A, F> {
    /// q_proj(x), k_proj(x) [B·T, H·K], v_proj(x) [B·T, H·V]: the convolutions' inputs.
    pub q_in: A,
    pub k_in: A,
    pub v_in: A,
    /// The convolutions' outputs (after SiLU).
    pub q_conv: A,
    pub k_conv: A,
    pub v: A,
    /// q and k L2-normalised per head, and their 1/norms [B·T·H].
    pub q: A,
    pub k: A,
    pub q_rstd: F,
    pub k_rstd: F,
    /// b_proj(x), then β = sigmoid of it, [B·T, H].
    pub beta: A,
    /// Gated DeltaNet: a_proj(x) and the log-decay g (f32), [B·T, H] (empty otherwise).
    pub a: A,
    pub g: F,
    /// The delta rule's output [B·T, H·V], its per-head RMSNorm and 1/rms [B·T·H].
    pub o: A,
    pub o_norm: A,
    pub o_rstd: F,
    /// With the output gate: g_proj(x) and o_norm ⊙ SiLU(it), o_proj's input (empty otherwise).
    pub gate: A,
    pub y: A,
}

/// The layer's backward buffers, shared by the layers of a slot (A: activations, F: f32).
pub struct DeltaNetScratch<A, F> {
    pub dy: A,
    pub dgate: A,
    pub do_norm: A,
    pub d_o: A,
    pub dq: A,
    pub dk: A,
    pub dv: A,
    pub dbeta: A,
    pub dg: F,
    pub da: A,
    pub dq_conv: A,
    pub dk_conv: A,
    pub dq_in: A,
    pub dk_in: A,
    pub dv_in: A,
}

/// A [B, T] batch's buffer lengths (n = B·T positions): n·K, n·V, n·H, the decay's (n·H when
/// gated, else none) and the output gate's (n·V with the gate, else none).
struct Lens {
    nk: usize,
    nv: usize,
    nh: usize,
    gated: usize,
    gate: usize,
}

impl Lens {
    fn new(l: &DeltaNetMixer, n: usize) -> Self {
        let s = &l.p.sizes;
        let (nv, nh) = (n * s.value_dim(), n * s.heads);
        Self { nk: n * s.key_dim(), nv, nh, gated: if s.gated { nh } else { 0 }, gate: if s.use_gate { nv } else { 0 } }
    }
}

impl<A, F> DeltaNetActs<A, F> {
    pub fn new<B: Alloc<Act = A, F32 = F>>(be: &B, l: &DeltaNetMixer, b: usize, t: usize) -> Result<Self> {
        let Lens { nk, nv, nh, gated, gate } = Lens::new(l, b * t);
        Ok(Self {
            q_in: be.alloc(nk)?,
            k_in: be.alloc(nk)?,
            v_in: be.alloc(nv)?,
            q_conv: be.alloc(nk)?,
            k_conv: be.alloc(nk)?,
            v: be.alloc(nv)?,
            q: be.alloc(nk)?,
            k: be.alloc(nk)?,
            q_rstd: be.alloc_f32(nh)?,
            k_rstd: be.alloc_f32(nh)?,
            beta: be.alloc(nh)?,
            a: be.alloc(gated)?,
            g: be.alloc_f32(gated)?,
            o: be.alloc(nv)?,
            o_norm: be.alloc(nv)?,
            o_rstd: be.alloc_f32(nh)?,
            gate: be.alloc(gate)?,
            y: be.alloc(gate)?,
        })
    }
}

impl<A, F> DeltaNetScratch<A, F> {
    pub fn new<B: Alloc<Act = A, F32 = F>>(be: &B, l: &DeltaNetMixer, b: usize, t: usize) -> Result<Self> {
        let Lens { nk, nv, nh, gated, gate } = Lens::new(l, b * t);
        Ok(Self {
            dy: be.alloc(nv)?,
            dgate: be.alloc(gate)?,
            do_norm: be.alloc(gate)?,
            d_o: be.alloc(nv)?,
            dq: be.alloc(nk)?,
            dk: be.alloc(nk)?,
            dv: be.alloc(nv)?,
            dbeta: be.alloc(nh)?,
            dg: be.alloc_f32(gated)?,
            da: be.alloc(gated)?,
            dq_conv: be.alloc(nk)?,
            dk_conv: be.alloc(nk)?,
            dq_in: be.alloc(nk)?,
            dk_in: be.alloc(nk)?,
            dv_in: be.alloc(nv)?,
        })
    }
}

impl DeltaNetMixer {
    /// The layer's parameters under `prefix`, in the order of [`DeltaNetSizes::mixer_layout`].
    pub fn new(p: &mut Params, cfg: &Config, prefix: &str) -> Self {
        let (d, s) = (cfg.hidden_size, cfg.deltanet());
        let (kd, vd, h, w) = (s.key_dim(), s.value_dim(), s.heads, s.conv);
        let q_proj = Linear::new(p, &format!("{prefix}.q_proj.weight"), kd, d);
        let k_proj = Linear::new(p, &format!("{prefix}.k_proj.weight"), kd, d);
        let v_proj = Linear::new(p, &format!("{prefix}.v_proj.weight"), vd, d);
        let a_proj = s.gated.then(|| Linear::new(p, &format!("{prefix}.a_proj.weight"), h, d));
        let b_proj = Linear::new(p, &format!("{prefix}.b_proj.weight"), h, d);
        let a_log = s.gated.then(|| p.add(&format!("{prefix}.A_log"), &[h], ParamKind::NoDecay));
        let dt_bias = s.gated.then(|| p.add(&format!("{prefix}.dt_bias"), &[h], ParamKind::NoDecay));
        // Matrices as the authors' optimiser sees them (decayed, drawn like the Linears), not
        // Linears (see Model::is_linear).
        let q_conv = p.add(&format!("{prefix}.q_conv1d.weight"), &[kd, 1, w], ParamKind::Matrix);
        let k_conv = p.add(&format!("{prefix}.k_conv1d.weight"), &[kd, 1, w], ParamKind::Matrix);
        let v_conv = p.add(&format!("{prefix}.v_conv1d.weight"), &[vd, 1, w], ParamKind::Matrix);
        let g_proj = s.use_gate.then(|| Linear::new(p, &format!("{prefix}.g_proj.weight"), vd, d));
        let o_norm = p.add(&format!("{prefix}.o_norm.weight"), &[s.head_v], ParamKind::NoDecay);
        let o_proj = Linear::new(p, &format!("{prefix}.o_proj.weight"), d, vd);
        let eps = s.eps as f32;
        let p = DeltaNetParams { q_conv, k_conv, v_conv, a_log, dt_bias, o_norm, eps, sizes: s };
        Self { q_proj, k_proj, v_proj, a_proj, b_proj, g_proj, o_proj, p }
    }

    /// The initialisation of the authors' DeltaNet (after the generic N(0, initializer_range)
    /// draw of every matrix): o_proj divided by √(2·layers); Gated DeltaNet's A_log = ln U(0, 16)
    /// and dt_bias = softplus⁻¹(dt) for dt log-uniform in [0.001, 0.1] floored at 1e-4, as fla's
    /// layer draws them.
    pub fn init(&self, p: &mut Params, layers: usize, rng: &mut impl rand::Rng) {
        let scale = 1.0 / ((2 * layers.max(1)) as f32).sqrt();
        p[self.o_proj.weight].iter_mut().for_each(|w| *w *= scale);
        if let Some(id) = self.p.a_log {
            for a in p[id].iter_mut() {
                // U(0, 16) excluding 0, whose log is −∞.
                *a = (rng.gen::<f32>() * 16.0).max(f32::MIN_POSITIVE).ln();
            }
        }
        if let Some(id) = self.p.dt_bias {
            let (lo, hi) = (0.001f64.ln(), 0.1f64.ln());
            for b in p[id].iter_mut() {
                let dt = (lo + rng.gen::<f64>() * (hi - lo)).exp().max(1e-4);
                *b = (dt + (-(-dt).exp_m1()).ln()) as f32;
            }
        }
    }

    pub fn sizes(&self) -> &DeltaNetSizes {
        &self.p.sizes
    }

    /// Forward over x: [B, T, d] (the block norm's output), saving into `a`, the output into
    /// `out`. With a state, the T tokens continue the state's sequence and advance it.
    pub fn forward<B: DeltaNetOps>(
        &self,
        be: &mut B,
        x: &B::Act,
        batch: &B::Batch,
        a: &mut DeltaNetActs<B::Act, B::F32>,
        out: &mut B::Act,
        mut state: Option<&mut state::DeltaNetState<B::F32>>,
    ) -> Result<()> {
        let n = be.batch_info(batch).rows();
        let (p, s) = (&self.p, &self.p.sizes);
        be.linear_fwd(&mut a.q_in, x, &self.q_proj, n)?;
        be.linear_fwd(&mut a.k_in, x, &self.k_proj, n)?;
        be.linear_fwd(&mut a.v_in, x, &self.v_proj, n)?;
        be.short_conv_fwd(&mut a.q_conv, &a.q_in, &p.short_conv(ConvOf::Q), batch, state.as_deref_mut())?;
        be.short_conv_fwd(&mut a.k_conv, &a.k_in, &p.short_conv(ConvOf::K), batch, state.as_deref_mut())?;
        be.short_conv_fwd(&mut a.v, &a.v_in, &p.short_conv(ConvOf::V), batch, state.as_deref_mut())?;
        be.l2norm_fwd(&mut a.q, &mut a.q_rstd, &a.q_conv, n * s.heads, s.head_k)?;
        be.l2norm_fwd(&mut a.k, &mut a.k_rstd, &a.k_conv, n * s.heads, s.head_k)?;
        be.linear_fwd(&mut a.beta, x, &self.b_proj, n)?;
        be.sigmoid_inplace(&mut a.beta, n * s.heads)?;
        if let Some(a_proj) = &self.a_proj {
            be.linear_fwd(&mut a.a, x, a_proj, n)?;
            be.deltanet_decay_fwd(&mut a.g, &a.a, p, n)?;
        }
        let g = self.a_proj.is_some().then_some(&a.g);
        let x_in = DeltaRuleIn { q: &a.q, k: &a.k, v: &a.v, beta: &a.beta, g };
        be.delta_rule_fwd(&mut a.o, x_in, p, batch, state)?;
        be.rms_norm_fwd(
            &mut a.o_norm,
            &mut a.o_rstd,
            &a.o,
            Norm { w: p.o_norm, rows: n * s.heads, dim: s.head_v, eps: p.eps },
        )?;
        match &self.g_proj {
            Some(g_proj) => {
                be.linear_fwd(&mut a.gate, x, g_proj, n)?;
                be.swish_gate_fwd(&mut a.y, &a.o_norm, &a.gate, n * s.value_dim())?;
                be.linear_fwd(out, &a.y, &self.o_proj, n)
            }
            None => be.linear_fwd(out, &a.o_norm, &self.o_proj, n),
        }
    }

    /// Backward of a full-sequence `forward` (no state) over x with its saved `a`: from dy
    /// [B, T, d] writes dx [B, T, d] and adds every parameter's gradient in the backend.
    pub fn backward<B: DeltaNetOps>(
        &self,
        be: &mut B,
        g: MixerGrad<'_, B::Act, B::Batch>,
        a: &DeltaNetActs<B::Act, B::F32>,
        sc: &mut DeltaNetScratch<B::Act, B::F32>,
    ) -> Result<()> {
        let MixerGrad { x, batch, dy, dx } = g;
        let n = be.batch_info(batch).rows();
        let (p, s) = (&self.p, &self.p.sizes);
        // out = o_proj(y), y = RMSNorm(o)·w (⊙ SiLU(g_proj(x)) with the output gate).
        match &self.g_proj {
            Some(g_proj) => {
                be.linear_bwd(&self.o_proj, &a.y, dy, Some(&mut sc.dy), false, n)?;
                be.swish_gate_bwd(&mut sc.do_norm, &mut sc.dgate, &sc.dy, &a.o_norm, &a.gate)?;
                be.linear_bwd(g_proj, x, &sc.dgate, Some(dx), false, n)?;
                be.rms_norm_bwd(&mut sc.d_o, false, p.o_norm, &sc.do_norm, &a.o, &a.o_rstd, s.head_v)?;
            }
            None => {
                be.linear_bwd(&self.o_proj, &a.o_norm, dy, Some(&mut sc.dy), false, n)?;
                be.rms_norm_bwd(&mut sc.d_o, false, p.o_norm, &sc.dy, &a.o, &a.o_rstd, s.head_v)?;
            }
        }
        let with_gate = self.g_proj.is_some();
        // o = the delta rule over (q, k, v, β, g).
        let g = self.a_proj.is_some().then_some(&a.g);
        let grads = DeltaRuleGradsOf {
            dq: &mut sc.dq,
            dk: &mut sc.dk,
            dv: &mut sc.dv,
            dbeta: &mut sc.dbeta,
            dg: self.a_proj.is_some().then_some(&mut sc.dg),
        };
        let x_in = DeltaRuleIn { q: &a.q, k: &a.k, v: &a.v, beta: &a.beta, g };
        be.delta_rule_bwd(grads, &sc.d_o, x_in, p, batch)?;
        // g = −exp(A_log)·softplus(a_proj(x) + dt_bias); β = sigmoid(b_proj(x)).
        if let Some(a_proj) = &self.a_proj {
            be.deltanet_decay_bwd(&mut sc.da, &sc.dg, &a.a, p)?;
            be.linear_bwd(a_proj, x, &sc.da, Some(dx), with_gate, n)?;
        }
        let acc = with_gate || self.a_proj.is_some();
        be.sigmoid_bwd_inplace(&mut sc.dbeta, &a.beta)?;
        be.linear_bwd(&self.b_proj, x, &sc.dbeta, Some(dx), acc, n)?;
        // q, k = L2norm(SiLU(conv(q_proj(x)))), likewise k; v = SiLU(conv(v_proj(x))).
        be.l2norm_bwd(&mut sc.dq_conv, &sc.dq, &a.q, &a.q_rstd, s.head_k)?;
        be.l2norm_bwd(&mut sc.dk_conv, &sc.dk, &a.k, &a.k_rstd, s.head_k)?;
        be.short_conv_bwd(&mut sc.dq_in, &sc.dq_conv, &a.q_in, &p.short_conv(ConvOf::Q), batch)?;
        be.short_conv_bwd(&mut sc.dk_in, &sc.dk_conv, &a.k_in, &p.short_conv(ConvOf::K), batch)?;
        be.short_conv_bwd(&mut sc.dv_in, &sc.dv, &a.v_in, &p.short_conv(ConvOf::V), batch)?;
        be.linear_bwd(&self.q_proj, x, &sc.dq_in, Some(dx), true, n)?;
        be.linear_bwd(&self.k_proj, x, &sc.dk_in, Some(dx), true, n)?;
        be.linear_bwd(&self.v_proj, x, &sc.dv_in, Some(dx), true, n)
    }
}
