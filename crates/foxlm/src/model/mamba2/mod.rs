//! The Mamba-2 family (SPEC §7; Dao & Gu 2024, as the authors' baseline defines it): a block is
//! this mixer alone, h = h + Mamba2(RMSNorm(h)).
//!
//! in_proj: x → [z | xBC | dt]; xBC = SiLU(conv1d(xBC)) (causal, depthwise, width W);
//! dt = softplus(dt + dt_bias), A = −exp(A_log); per head the state S [P, N] runs
//! S_t = exp(dt_t·A)·S_{t−1} + dt_t·x_t B_tᵀ, y_t = S_t C_t + D·x_t (the SSD: chunked on the
//! backends); then g = RMSNorm(y ⊙ SiLU(z))·w and out_proj. Its backend operations are
//! [`ops::Mamba2Ops`] (CPU: `cpu.rs`, CUDA: `cuda.rs`); its inference state is the SSM state and
//! the convolution's last inputs, fixed in size (`state.rs`).

pub mod cpu;
pub mod cuda;
pub mod ops;
pub mod state;

use super::{Linear, MixerGrad};
use crate::backend::Alloc;
use crate::config::{Config, Mamba2Sizes};
use crate::tensor::{ParamKind, Params};
use anyhow::Result;
use ops::{Mamba2Ops, Mamba2Params, SsdIn};

#[derive(Clone, Debug)]
pub struct Mamba2Mixer {
    pub in_proj: Linear,
    pub out_proj: Linear,
    pub p: Mamba2Params,
}

/// What the mixer's backward reads (A: activation buffers, F: f32).
#[derive(Clone, Debug, Default)]
pub struct Mamba2Acts<A, F> {
    /// in_proj(x): [z | xBC | dt_raw], [B·T, in_proj_dim].
    pub zxbcdt: A,
    /// SiLU(conv1d(xBC)): [x | B | C], [B·T, C].
    pub xbc: A,
    /// softplus(dt_raw + dt_bias), [B·T, H] (f32).
    pub dt: F,
    /// The SSD's output with the D skip, [B·T, H·P].
    pub y: A,
    /// The input of out_proj: RMSNorm(y ⊙ SiLU(z))·w, [B·T, H·P] (normalised over each group's
    /// H·P/G channels, as the authors' RMSNormGated), and the norm's 1/rms [B·T, G].
    pub g: A,
    pub rstd: F,
}

/// The mixer's backward buffers, shared by the layers of a slot.
pub struct Mamba2Scratch<A, F> {
    pub dzxbcdt: A,
    pub dxbc: A,
    pub ddt: F,
    pub dy: A,
    pub dg: A,
}

/// Fills `w` with U(−bound, bound) draws (PyTorch's default initialisation of Linear and Conv1d).
pub fn uniform(w: &mut [f32], bound: f32, rng: &mut impl rand::Rng) {
    for v in w.iter_mut() {
        *v = (rng.gen::<f32>() * 2.0 - 1.0) * bound;
    }
}

impl<A, F> Mamba2Acts<A, F> {
    pub fn new<B: Alloc<Act = A, F32 = F>>(be: &B, l: &Mamba2Mixer, b: usize, t: usize) -> Result<Self> {
        let (n, s) = (b * t, &l.p.sizes);
        Ok(Self {
            zxbcdt: be.alloc(n * s.in_proj_dim())?,
            xbc: be.alloc(n * s.conv_dim())?,
            dt: be.alloc_f32(n * s.heads)?,
            y: be.alloc(n * s.inner)?,
            g: be.alloc(n * s.inner)?,
            rstd: be.alloc_f32(n * s.groups)?,
        })
    }
}

impl<A, F> Mamba2Scratch<A, F> {
    pub fn new<B: Alloc<Act = A, F32 = F>>(be: &B, l: &Mamba2Mixer, b: usize, t: usize) -> Result<Self> {
        let (n, s) = (b * t, &l.p.sizes);
        Ok(Self {
            dzxbcdt: be.alloc(n * s.in_proj_dim())?,
            dxbc: be.alloc(n * s.conv_dim())?,
            ddt: be.alloc_f32(n * s.heads)?,
            dy: be.alloc(n * s.inner)?,
            dg: be.alloc(n * s.inner)?,
        })
    }
}

impl Mamba2Mixer {
    /// The mixer's parameters under `prefix`, in the order of [`Mamba2Sizes::mixer_layout`].
    pub fn new(p: &mut Params, cfg: &Config, prefix: &str) -> Self {
        let (d, s) = (cfg.hidden_size, cfg.mamba2());
        let in_proj = Linear::new(p, &format!("{prefix}.in_proj.weight"), s.in_proj_dim(), d);
        // Decayed as the authors do (conv_weight_decay), but not a Linear (see Model::is_linear).
        let conv_w = p.add(&format!("{prefix}.conv1d.weight"), &[s.conv_dim(), 1, s.conv], ParamKind::Matrix);
        let conv_b = s.conv_bias.then(|| p.add(&format!("{prefix}.conv1d.bias"), &[s.conv_dim()], ParamKind::NoDecay));
        let dt_bias = p.add(&format!("{prefix}.dt_bias"), &[s.heads], ParamKind::NoDecay);
        let a_log = p.add(&format!("{prefix}.A_log"), &[s.heads], ParamKind::NoDecay);
        let d_skip = p.add(&format!("{prefix}.D"), &[s.heads], ParamKind::NoDecay);
        let norm = p.add(&format!("{prefix}.norm.weight"), &[s.inner], ParamKind::NoDecay);
        let out_proj = Linear::new(p, &format!("{prefix}.out_proj.weight"), d, s.inner);
        let eps = cfg.norm_eps as f32;
        Self { in_proj, out_proj, p: Mamba2Params { conv_w, conv_b, dt_bias, a_log, d_skip, norm, eps, sizes: s } }
    }

    /// The authors' initialisation (their `_init_weights` over PyTorch's defaults): in_proj
    /// U(±1/√d), out_proj U(±1/√Di)/√layers, the convolution U(±1/√W), A = −(1..H), D = 1, and
    /// dt_bias = softplus⁻¹(dt) for dt log-uniform in [time_step_min, time_step_max] (floored).
    pub fn init(&self, p: &mut Params, layers: usize, rng: &mut impl rand::Rng) {
        let s = self.p.sizes;
        uniform(&mut p[self.in_proj.weight], 1.0 / (self.in_proj.in_features as f32).sqrt(), rng);
        let out = 1.0 / (s.inner as f32).sqrt() / (layers.max(1) as f32).sqrt();
        uniform(&mut p[self.out_proj.weight], out, rng);
        let conv = 1.0 / (s.conv as f32).sqrt();
        uniform(&mut p[self.p.conv_w], conv, rng);
        if let Some(b) = self.p.conv_b {
            uniform(&mut p[b], conv, rng);
        }
        for (h, a) in p[self.p.a_log].iter_mut().enumerate() {
            *a = ((h + 1) as f32).ln();
        }
        p[self.p.d_skip].fill(1.0);
        p[self.p.norm].fill(1.0);
        let (lo, hi) = (s.dt_min.ln(), s.dt_max.ln());
        for b in p[self.p.dt_bias].iter_mut() {
            let dt = (lo + rng.gen::<f64>() * (hi - lo)).exp().max(s.dt_floor);
            // softplus⁻¹(dt) = dt + log(−expm1(−dt))
            *b = (dt + (-(-dt).exp_m1()).ln()) as f32;
        }
    }

    pub fn sizes(&self) -> &Mamba2Sizes {
        &self.p.sizes
    }

    /// Forward over x: [B, T, d] (the block norm's output), saving into `a`, the output into
    /// `out`. With a state, the T tokens continue the state's sequence and advance it.
    pub fn forward<B: Mamba2Ops>(
        &self,
        be: &mut B,
        x: &B::Act,
        batch: &B::Batch,
        a: &mut Mamba2Acts<B::Act, B::F32>,
        out: &mut B::Act,
        mut state: Option<&mut state::Mamba2State<B::F32>>,
    ) -> Result<()> {
        let info = be.batch_info(batch);
        let n = info.rows();
        let p = &self.p;
        match state.as_deref_mut() {
            Some(st) if info.seq == 1 => {
                be.mamba2_step_in(&mut a.zxbcdt, &mut a.xbc, &mut a.dt, x, &self.in_proj, p, batch, st)?
            }
            st => {
                be.linear_fwd(&mut a.zxbcdt, x, &self.in_proj, n)?;
                be.short_conv_fwd(&mut a.xbc, &a.zxbcdt, &p.short_conv(), batch, st)?;
                be.mamba2_dt_fwd(&mut a.dt, &a.zxbcdt, p, n)?;
            }
        }
        be.ssd_fwd(&mut a.y, SsdIn { xbc: &a.xbc, dt: &a.dt }, p, batch, state)?;
        be.gated_norm_fwd(&mut a.g, &mut a.rstd, &a.y, &a.zxbcdt, p, n)?;
        be.linear_fwd(out, &a.g, &self.out_proj, n)
    }

    /// Backward of a full-sequence `forward` (no state) over x with its saved `a`: from dy
    /// [B, T, d] writes dx [B, T, d] and adds every parameter's gradient in the backend.
    pub fn backward<B: Mamba2Ops>(
        &self,
        be: &mut B,
        g: MixerGrad<'_, B::Act, B::Batch>,
        a: &Mamba2Acts<B::Act, B::F32>,
        s: &mut Mamba2Scratch<B::Act, B::F32>,
    ) -> Result<()> {
        let MixerGrad { x, batch, dy, dx } = g;
        let n = be.batch_info(batch).rows();
        let p = &self.p;
        // out = out_proj(g); g = RMSNorm(y ⊙ SiLU(z))·w writes dz into dzxbcdt's z columns.
        be.linear_bwd(&self.out_proj, &a.g, dy, Some(&mut s.dg), false, n)?;
        be.gated_norm_bwd(&mut s.dy, &mut s.dzxbcdt, &s.dg, &a.y, &a.zxbcdt, &a.rstd, p)?;
        // y = SSD(x, dt, A, B, C) + D·x: dx, dB, dC into dxbc, d dt.
        be.ssd_bwd(&mut s.dxbc, &mut s.ddt, &s.dy, SsdIn { xbc: &a.xbc, dt: &a.dt }, p, batch)?;
        // dt = softplus(dt_raw + dt_bias): dt_raw's columns; xbc = SiLU(conv(xBC)): xBC's.
        be.mamba2_dt_bwd(&mut s.dzxbcdt, &s.ddt, &a.zxbcdt, p)?;
        be.short_conv_bwd(&mut s.dzxbcdt, &s.dxbc, &a.zxbcdt, &p.short_conv(), batch)?;
        be.linear_bwd(&self.in_proj, x, &s.dzxbcdt, Some(dx), false, n)
    }
}
