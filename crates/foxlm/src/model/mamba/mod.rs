//! The Mamba family (SPEC §7; Gu & Dao 2023, as fla's `MambaMixer` that the authors' Samba
//! uses): the selective SSM, Samba's recurrent layer.
//!
//! in_proj: x → [x | z] (2·Di); u = SiLU(conv1d(x)) (causal, depthwise, width W, with bias);
//! x_proj: u → [dt_low (R) | B (N) | C (N)]; δ = softplus(dt_proj(dt_low) + dt_proj.bias);
//! A = −exp(A_log) [Di, N]; per channel d and state n, h_t = exp(δ_t·A)·h_{t−1} + δ_t·B_t·u_t,
//! y_t = (Σ_n h_t·C_t + D·u_t) · SiLU(z_t) (`fox_kernels::selective_scan`); then out_proj.
//! Its backend operations are [`ops::MambaOps`] (CPU: `cpu.rs`, CUDA: `cuda.rs`); its
//! inference state is the scan state and the convolution's last inputs, fixed in size
//! (`state.rs`).

pub mod cpu;
pub mod cuda;
pub mod ops;
pub mod state;

use super::mamba2::uniform;
use super::{Linear, MixerGrad};
use crate::backend::Alloc;
use crate::config::MambaSizes;
use crate::tensor::{ParamKind, Params};
use anyhow::Result;
use ops::{MambaOps, MambaParams, ScanGradsOf, ScanIn};

#[derive(Clone, Debug)]
pub struct MambaMixer {
    pub in_proj: Linear,
    pub x_proj: Linear,
    /// dt_proj's weight [Di, R]; its bias is `p.dt_bias`.
    pub dt_proj: Linear,
    pub out_proj: Linear,
    pub p: MambaParams,
}

/// What the mixer's backward reads (A: activation buffers, F: f32).
#[derive(Clone, Debug, Default)]
pub struct MambaActs<A, F> {
    /// in_proj(x): [x | z], [B·T, 2·Di].
    pub xz: A,
    /// SiLU(conv1d(x)), [B·T, Di].
    pub u: A,
    /// x_proj(u): [dt_low | B | C], [B·T, R + 2N].
    pub xp: A,
    /// dt_low copied out of xp (dt_proj's input), [B·T, R].
    pub dt_low: A,
    /// dt_proj's output without its bias, [B·T, Di].
    pub dt_pre: A,
    /// δ = softplus(dt_pre + bias), [B·T, Di].
    pub delta: A,
    /// The scan's states at chunk starts, for its backward (`selective_scan::saved_len`).
    pub saved: F,
    /// The gated scan output, out_proj's input, [B·T, Di].
    pub y: A,
}

/// The mixer's backward buffers, shared by the layers of a slot.
pub struct MambaScratch<A> {
    pub dxz: A,
    pub du: A,
    pub dxp: A,
    pub d_dt_low: A,
    pub d_dt_pre: A,
    pub ddelta: A,
    pub dy: A,
}

/// Elements of the scan's saved states for a [b, t] batch.
pub fn saved_len(s: &MambaSizes, b: usize, t: usize) -> usize {
    b * fox_kernels::selective_scan::chunks(t) * s.inner * s.state
}

impl<A, F> MambaActs<A, F> {
    pub fn new<B: Alloc<Act = A, F32 = F>>(be: &B, l: &MambaMixer, b: usize, t: usize) -> Result<Self> {
        let (n, s) = (b * t, &l.p.sizes);
        Ok(Self {
            xz: be.alloc(n * 2 * s.inner)?,
            u: be.alloc(n * s.inner)?,
            xp: be.alloc(n * s.x_proj_dim())?,
            dt_low: be.alloc(n * s.dt_rank)?,
            dt_pre: be.alloc(n * s.inner)?,
            delta: be.alloc(n * s.inner)?,
            saved: be.alloc_f32(saved_len(s, b, t))?,
            y: be.alloc(n * s.inner)?,
        })
    }
}

impl<A> MambaScratch<A> {
    pub fn new<B: Alloc<Act = A>>(be: &B, l: &MambaMixer, b: usize, t: usize) -> Result<Self> {
        let (n, s) = (b * t, &l.p.sizes);
        Ok(Self {
            dxz: be.alloc(n * 2 * s.inner)?,
            du: be.alloc(n * s.inner)?,
            dxp: be.alloc(n * s.x_proj_dim())?,
            d_dt_low: be.alloc(n * s.dt_rank)?,
            d_dt_pre: be.alloc(n * s.inner)?,
            ddelta: be.alloc(n * s.inner)?,
            dy: be.alloc(n * s.inner)?,
        })
    }
}

impl MambaMixer {
    /// The mixer's parameters under `prefix`, in the order of [`MambaSizes::mixer_layout`].
    pub fn new(p: &mut Params, s: MambaSizes, d: usize, prefix: &str) -> Self {
        // Decayed like the other matrices, but not a Linear (see Model::is_linear: 3-D).
        let conv_w = p.add(&format!("{prefix}.conv1d.weight"), &[s.inner, 1, s.conv], ParamKind::Matrix);
        let conv_b = s.conv_bias.then(|| p.add(&format!("{prefix}.conv1d.bias"), &[s.inner], ParamKind::NoDecay));
        let in_proj = Linear::new(p, &format!("{prefix}.in_proj.weight"), 2 * s.inner, d);
        let x_proj = Linear::new(p, &format!("{prefix}.x_proj.weight"), s.x_proj_dim(), s.inner);
        let dt_proj = Linear::new(p, &format!("{prefix}.dt_proj.weight"), s.inner, s.dt_rank);
        let dt_bias = p.add(&format!("{prefix}.dt_proj.bias"), &[s.inner], ParamKind::NoDecay);
        let a_log = p.add(&format!("{prefix}.A_log"), &[s.inner, s.state], ParamKind::NoDecay);
        let d_skip = p.add(&format!("{prefix}.D"), &[s.inner], ParamKind::NoDecay);
        let out_proj = Linear::new(p, &format!("{prefix}.out_proj.weight"), d, s.inner);
        Self { in_proj, x_proj, dt_proj, out_proj, p: MambaParams { conv_w, conv_b, dt_bias, a_log, d_skip, sizes: s } }
    }

    /// The authors' initialisation (SambaPreTrainedModel._init_weights over fla's MambaMixer and
    /// PyTorch's defaults): in_proj U(±1/√d), x_proj U(±1/√Di), the convolution U(±1/√W),
    /// dt_proj's weight U(±scale/√R) (or the constant scale/√R), its bias softplus⁻¹(dt) for dt
    /// log-uniform in [time_step_min, time_step_max] (floored), A = 1..N in every channel,
    /// D = 1, out_proj U(±1/√Di)/√(2·layers) (rescale_prenorm_residual).
    pub fn init(&self, p: &mut Params, layers: usize, rng: &mut impl rand::Rng) {
        let s = self.p.sizes;
        uniform(&mut p[self.in_proj.weight], 1.0 / (self.in_proj.in_features as f32).sqrt(), rng);
        uniform(&mut p[self.x_proj.weight], 1.0 / (s.inner as f32).sqrt(), rng);
        let conv = 1.0 / (s.conv as f32).sqrt();
        uniform(&mut p[self.p.conv_w], conv, rng);
        if let Some(b) = self.p.conv_b {
            uniform(&mut p[b], conv, rng);
        }
        let dt_std = (s.dt_scale / (s.dt_rank as f64).sqrt()) as f32;
        if s.dt_init_random {
            uniform(&mut p[self.dt_proj.weight], dt_std, rng);
        } else {
            p[self.dt_proj.weight].fill(dt_std);
        }
        let (lo, hi) = (s.dt_min.ln(), s.dt_max.ln());
        for b in p[self.p.dt_bias].iter_mut() {
            let dt = (lo + rng.gen::<f64>() * (hi - lo)).exp().max(s.dt_floor);
            // softplus⁻¹(dt) = dt + log(−expm1(−dt))
            *b = (dt + (-(-dt).exp_m1()).ln()) as f32;
        }
        for (i, a) in p[self.p.a_log].iter_mut().enumerate() {
            *a = ((i % s.state + 1) as f32).ln();
        }
        p[self.p.d_skip].fill(1.0);
        let out = 1.0 / (s.inner as f32).sqrt() / ((2 * layers.max(1)) as f32).sqrt();
        uniform(&mut p[self.out_proj.weight], out, rng);
    }

    pub fn sizes(&self) -> &MambaSizes {
        &self.p.sizes
    }

    /// Forward over x: [B, T, d] (the block norm's output), saving into `a`, the output into
    /// `out`. With a state, the T tokens continue the state's sequence and advance it.
    pub fn forward<B: MambaOps>(
        &self,
        be: &mut B,
        x: &B::Act,
        batch: &B::Batch,
        a: &mut MambaActs<B::Act, B::F32>,
        out: &mut B::Act,
        mut state: Option<&mut state::MambaState<B::F32>>,
    ) -> Result<()> {
        let n = be.batch_info(batch).rows();
        let p = &self.p;
        be.linear_fwd(&mut a.xz, x, &self.in_proj, n)?;
        be.short_conv_fwd(&mut a.u, &a.xz, &p.short_conv(), batch, state.as_deref_mut())?;
        be.linear_fwd(&mut a.xp, &a.u, &self.x_proj, n)?;
        be.mamba_dt_split(&mut a.dt_low, &a.xp, p, n)?;
        be.linear_fwd(&mut a.dt_pre, &a.dt_low, &self.dt_proj, n)?;
        be.mamba_delta_fwd(&mut a.delta, &a.dt_pre, p, n)?;
        let x_in = ScanIn { u: &a.u, delta: &a.delta, xp: &a.xp, xz: &a.xz };
        be.selective_scan_fwd(&mut a.y, &mut a.saved, x_in, p, batch, state)?;
        be.linear_fwd(out, &a.y, &self.out_proj, n)
    }

    /// Backward of a full-sequence `forward` (no state) over x with its saved `a`: from dy
    /// [B, T, d] writes dx [B, T, d] and adds every parameter's gradient in the backend.
    pub fn backward<B: MambaOps>(
        &self,
        be: &mut B,
        g: MixerGrad<'_, B::Act, B::Batch>,
        a: &MambaActs<B::Act, B::F32>,
        s: &mut MambaScratch<B::Act>,
    ) -> Result<()> {
        let MixerGrad { x, batch, dy, dx } = g;
        let n = be.batch_info(batch).rows();
        let p = &self.p;
        be.linear_bwd(&self.out_proj, &a.y, dy, Some(&mut s.dy), false, n)?;
        // The scan: du, dδ, dB and dC (xp's columns), dz (xz's columns), dA_log, dD.
        let grads = ScanGradsOf { du: &mut s.du, ddelta: &mut s.ddelta, dxp: &mut s.dxp, dxz: &mut s.dxz };
        let x_in = ScanIn { u: &a.u, delta: &a.delta, xp: &a.xp, xz: &a.xz };
        be.selective_scan_bwd(grads, &s.dy, &a.saved, x_in, p, batch)?;
        // δ = softplus(dt_proj(dt_low) + bias): dt_low's gradient into xp's first columns.
        be.mamba_delta_bwd(&mut s.d_dt_pre, &s.ddelta, &a.dt_pre, p)?;
        be.linear_bwd(&self.dt_proj, &a.dt_low, &s.d_dt_pre, Some(&mut s.d_dt_low), false, n)?;
        be.mamba_dt_merge(&mut s.dxp, &s.d_dt_low, p)?;
        // u feeds x_proj and the scan: du += dxp · W_x.
        be.linear_bwd(&self.x_proj, &a.u, &s.dxp, Some(&mut s.du), true, n)?;
        be.short_conv_bwd(&mut s.dxz, &s.du, &a.xz, &p.short_conv(), batch)?;
        be.linear_bwd(&self.in_proj, x, &s.dxz, Some(dx), false, n)
    }
}
