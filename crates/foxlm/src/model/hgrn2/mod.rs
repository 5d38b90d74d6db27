//! HGRN2 (SPEC §7; Qin et al. 2024), as fla's `HGRN2Attention` layer and `HGRN2Model` define
//! it: a block is h = h + HGRN2(RMSNorm(h)) then FoX's SwiGLU MLP, h = h + MLP(RMSNorm(h)).
//!
//! q = swish(q_proj(x)); the forget gate's log g = logsigmoid(f_proj(x)), in layers > 0 bounded
//! below by the model's lower bound lb of the layer, g = ln(lb + (1 − lb)·sigmoid(f)) (fla's
//! logaddexp form); the key tied to the gate, k = 1 − exp(g); v = i_proj(x); o = gated linear
//! attention with per-channel decay exp(g) ([`fox_kernels::gla`], heads of K = expand_ratio, scale
//! K^−½); RMSNorm(o)·w over the whole width (ε 1e-5, fla's `rms_norm_linear` default); o_proj.
//! With use_short_conv, q_proj(x), f_proj(x) and i_proj(x) each go through a causal depthwise
//! convolution (no bias, no activation, as fla's ShortConvolution there) first.
//!
//! The lower bounds are one model-level parameter, `model.lower_bounds` [L, d]: lb = softmax over
//! layers, cumulative sum less the first row, computed once per forward before the blocks
//! ([`crate::model::Model::forward_on`]); each bounded layer reads its row and writes its row's
//! gradient, which the model turns into the parameter's after the last block's backward. Its
//! backend operations are [`ops::Hgrn2Ops`] (CPU: `cpu.rs`; CUDA: `cuda.rs`, on
//! `fox_kernels::cuda::gla`); its inference state is the GLA state, fixed in size (`state.rs`).

pub mod cpu;
pub mod cuda;
pub mod ops;
pub mod state;

use super::{Linear, MixerGrad};
use crate::backend::Alloc;
use crate::backend::Norm;
use crate::config::{Config, Hgrn2Sizes, HGRN2_G_NORM_EPS};
use crate::tensor::{ParamKind, Params};
use anyhow::Result;
use ops::{ConvOf, GlaGradsOf, GlaIn, Hgrn2GateGradsOf, Hgrn2GatesOf, Hgrn2Ops, Hgrn2Params};

#[derive(Clone, Debug)]
pub struct Hgrn2Mixer {
    pub q_proj: Linear,
    pub f_proj: Linear,
    pub i_proj: Linear,
    pub o_proj: Linear,
    pub p: Hgrn2Params,
}

/// What the layer's backward reads (A: activation buffers, F: f32).
#[derive(Clone, Debug, Default)]
pub struct Hgrn2Acts<A, F> {
    /// With short convolutions: q_proj(x), f_proj(x), i_proj(x), the convolutions' inputs
    /// [B·T, d] (empty without).
    pub q_pre: A,
    pub f_pre: A,
    pub v_pre: A,
    /// q_proj(x) (convolved, with the convolutions) and swish of it, f_proj(x) (likewise), the log
    /// forget gate g and k = 1 − exp(g), [B·T, d].
    pub q_in: A,
    pub q: A,
    pub f: A,
    pub g: A,
    pub k: A,
    /// i_proj(x) (likewise), GLA's v [B·T, d].
    pub v: A,
    /// GLA's output [B·T, d], its RMSNorm (o_proj's input) and 1/rms [B·T].
    pub o: A,
    pub o_norm: A,
    pub o_rstd: F,
}

/// The layer's backward buffers, shared by the layers of a slot.
pub struct Hgrn2Scratch<A> {
    pub do_norm: A,
    pub d_o: A,
    pub dq: A,
    pub dk: A,
    pub dv: A,
    pub dg: A,
    pub dq_in: A,
    pub df: A,
    /// With short convolutions: d (a projection's output), one convolution at a time.
    pub dpre: A,
}

impl<A, F> Hgrn2Acts<A, F> {
    pub fn new<B: Alloc<Act = A, F32 = F>>(be: &B, l: &Hgrn2Mixer, b: usize, t: usize) -> Result<Self> {
        let (n, d) = (b * t, l.width());
        let pre = if l.p.convs.is_some() { n * d } else { 0 };
        Ok(Self {
            q_pre: be.alloc(pre)?,
            f_pre: be.alloc(pre)?,
            v_pre: be.alloc(pre)?,
            q_in: be.alloc(n * d)?,
            q: be.alloc(n * d)?,
            f: be.alloc(n * d)?,
            g: be.alloc(n * d)?,
            k: be.alloc(n * d)?,
            v: be.alloc(n * d)?,
            o: be.alloc(n * d)?,
            o_norm: be.alloc(n * d)?,
            o_rstd: be.alloc_f32(n)?,
        })
    }
}

impl<A> Hgrn2Scratch<A> {
    pub fn new<B: Alloc<Act = A>>(be: &B, l: &Hgrn2Mixer, b: usize, t: usize) -> Result<Self> {
        let (n, d) = (b * t, l.width());
        Ok(Self {
            do_norm: be.alloc(n * d)?,
            d_o: be.alloc(n * d)?,
            dq: be.alloc(n * d)?,
            dk: be.alloc(n * d)?,
            dv: be.alloc(n * d)?,
            dg: be.alloc(n * d)?,
            dq_in: be.alloc(n * d)?,
            df: be.alloc(n * d)?,
            dpre: be.alloc(if l.p.convs.is_some() { n * d } else { 0 })?,
        })
    }
}

impl Hgrn2Mixer {
    /// Layer `layer`'s parameters under `prefix`, in the order of [`Hgrn2Sizes::mixer_layout`].
    pub fn new(p: &mut Params, cfg: &Config, prefix: &str, layer: usize) -> Self {
        let (d, s) = (cfg.hidden_size, cfg.hgrn2());
        let q_proj = Linear::new(p, &format!("{prefix}.q_proj.weight"), d, d);
        let f_proj = Linear::new(p, &format!("{prefix}.f_proj.weight"), d, d);
        let i_proj = Linear::new(p, &format!("{prefix}.i_proj.weight"), d, d);
        // Matrices as fla's optimiser sees them (decayed, drawn like the Linears), not Linears
        // (see Model::is_linear).
        let convs = s.conv.map(|w| {
            ["q", "f", "i"].map(|c| p.add(&format!("{prefix}.{c}_conv1d.weight"), &[d, 1, w], ParamKind::Matrix))
        });
        let g_norm = p.add(&format!("{prefix}.g_norm.weight"), &[d], ParamKind::NoDecay);
        let o_proj = Linear::new(p, &format!("{prefix}.o_proj.weight"), d, d);
        Self { q_proj, f_proj, i_proj, o_proj, p: Hgrn2Params { convs, g_norm, layer, sizes: s } }
    }

    /// The initialisation of the authors' HGRN2 (after the generic N(0, initializer_range) draw
    /// of every matrix, norm weights 1 and the lower bounds 0): o_proj divided by √(2·layers).
    pub fn init(&self, p: &mut Params, layers: usize) {
        let scale = 1.0 / ((2 * layers.max(1)) as f32).sqrt();
        p[self.o_proj.weight].iter_mut().for_each(|w| *w *= scale);
    }

    pub fn sizes(&self) -> &Hgrn2Sizes {
        &self.p.sizes
    }

    /// The layer's width d = H·K.
    pub fn width(&self) -> usize {
        self.p.sizes.heads * self.p.sizes.head_dim
    }

    /// Forward over x: [B, T, d] (the block norm's output), saving into `a`, the output into
    /// `out`; `lb` is the model's lower bounds [L, d] (read in a bounded layer only). With a
    /// state, the T tokens continue the state's sequence and advance it.
    #[allow(clippy::too_many_arguments)]
    pub fn forward<B: Hgrn2Ops>(
        &self,
        be: &mut B,
        x: &B::Act,
        batch: &B::Batch,
        a: &mut Hgrn2Acts<B::Act, B::F32>,
        out: &mut B::Act,
        mut state: Option<&mut state::Hgrn2State<B::F32>>,
        lb: &B::F32,
    ) -> Result<()> {
        let n = be.batch_info(batch).rows();
        let p = &self.p;
        if p.convs.is_some() {
            be.linear_fwd(&mut a.q_pre, x, &self.q_proj, n)?;
            be.linear_fwd(&mut a.f_pre, x, &self.f_proj, n)?;
            be.linear_fwd(&mut a.v_pre, x, &self.i_proj, n)?;
            be.short_conv_fwd(&mut a.q_in, &a.q_pre, &p.short_conv(ConvOf::Q)?, batch, state.as_deref_mut())?;
            be.short_conv_fwd(&mut a.f, &a.f_pre, &p.short_conv(ConvOf::F)?, batch, state.as_deref_mut())?;
            be.short_conv_fwd(&mut a.v, &a.v_pre, &p.short_conv(ConvOf::I)?, batch, state.as_deref_mut())?;
        } else {
            be.linear_fwd(&mut a.q_in, x, &self.q_proj, n)?;
            be.linear_fwd(&mut a.f, x, &self.f_proj, n)?;
            be.linear_fwd(&mut a.v, x, &self.i_proj, n)?;
        }
        be.hgrn2_gates_fwd(&mut a.q, &mut a.k, &mut a.g, &a.q_in, &a.f, lb, p, n)?;
        be.hgrn2_gla_fwd(&mut a.o, GlaIn { q: &a.q, k: &a.k, v: &a.v, g: &a.g }, p, batch, state)?;
        be.rms_norm_fwd(
            &mut a.o_norm,
            &mut a.o_rstd,
            &a.o,
            Norm { w: p.g_norm, rows: n, dim: self.width(), eps: HGRN2_G_NORM_EPS },
        )?;
        be.linear_fwd(out, &a.o_norm, &self.o_proj, n)
    }

    /// Backward of a full-sequence `forward` (no state) over x with its saved `a`: from dy
    /// [B, T, d] writes dx [B, T, d], in a bounded layer its row of `dlb`, and adds every
    /// parameter's gradient in the backend.
    pub fn backward<B: Hgrn2Ops>(
        &self,
        be: &mut B,
        g: MixerGrad<'_, B::Act, B::Batch>,
        a: &Hgrn2Acts<B::Act, B::F32>,
        sc: &mut Hgrn2Scratch<B::Act>,
        lb: &B::F32,
        dlb: &mut B::F32,
    ) -> Result<()> {
        let MixerGrad { x, batch, dy, dx } = g;
        let n = be.batch_info(batch).rows();
        let p = &self.p;
        // out = o_proj(RMSNorm(o)·w).
        be.linear_bwd(&self.o_proj, &a.o_norm, dy, Some(&mut sc.do_norm), false, n)?;
        be.rms_norm_bwd(&mut sc.d_o, false, p.g_norm, &sc.do_norm, &a.o, &a.o_rstd, self.width())?;
        // o = GLA(q, k, v, g).
        let grads = GlaGradsOf { dq: &mut sc.dq, dk: &mut sc.dk, dv: &mut sc.dv, dg: &mut sc.dg };
        be.hgrn2_gla_bwd(grads, &sc.d_o, GlaIn { q: &a.q, k: &a.k, v: &a.v, g: &a.g }, p, batch)?;
        // q = swish(q_in), g and k from f (and the lower bound).
        let grads = Hgrn2GateGradsOf { dq_in: &mut sc.dq_in, df: &mut sc.df, dlb, dq: &sc.dq, dk: &sc.dk, dg: &sc.dg };
        let saved = Hgrn2GatesOf { q_in: &a.q_in, f: &a.f, g: &a.g, lb };
        be.hgrn2_gates_bwd(grads, saved, p)?;
        if p.convs.is_none() {
            be.linear_bwd(&self.q_proj, x, &sc.dq_in, Some(dx), false, n)?;
            be.linear_bwd(&self.f_proj, x, &sc.df, Some(dx), true, n)?;
            return be.linear_bwd(&self.i_proj, x, &sc.dv, Some(dx), true, n);
        }
        // q_in, f, v = the convolutions of the projections.
        let parts = [
            (ConvOf::Q, &self.q_proj, &sc.dq_in, &a.q_pre),
            (ConvOf::F, &self.f_proj, &sc.df, &a.f_pre),
            (ConvOf::I, &self.i_proj, &sc.dv, &a.v_pre),
        ];
        for (i, (which, proj, dout, pre)) in parts.into_iter().enumerate() {
            be.short_conv_bwd(&mut sc.dpre, dout, pre, &p.short_conv(which)?, batch)?;
            be.linear_bwd(proj, x, &sc.dpre, Some(dx), i > 0, n)?;
        }
        Ok(())
    }
}
