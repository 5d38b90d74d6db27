//! The Mamba-2 family's operations: what a backend supplies so that a [`super::Mamba2Mixer`] runs
//! on it. They work on the layer's buffers as the layer lays them out: in_proj's output
//! `zxbcdt` [B·T, in_proj_dim] holds z (columns 0..Di), the convolution's input xBC (Di..Di+C)
//! and the raw dt (the last H columns); the convolution's output `xbc` [B·T, C] holds x (H·P
//! columns), B and C (G·N each). Gradients of parameters are accumulated (`+=`); gradients of
//! activations are written into their columns of `dzxbcdt` / `dxbc`.

use super::state::Mamba2State;
use crate::backend::{Backend, ShortConv};
use crate::config::Mamba2Sizes;
use crate::model::Linear;
use crate::tensor::ParamId;
use anyhow::Result;

/// A Mamba-2 layer's parameters other than its projections.
#[derive(Clone, Copy, Debug)]
pub struct Mamba2Params {
    /// conv1d weight [C, 1, W] and bias [C].
    pub conv_w: ParamId,
    pub conv_b: Option<ParamId>,
    /// Per head: dt's bias, log(−A) and the skip D.
    pub dt_bias: ParamId,
    pub a_log: ParamId,
    pub d_skip: ParamId,
    /// The gated RMSNorm's weight [Di] and epsilon.
    pub norm: ParamId,
    pub eps: f32,
    pub sizes: Mamba2Sizes,
}

impl Mamba2Params {
    /// The convolution over xBC's columns of zxbcdt (from column Di).
    pub fn short_conv(&self) -> ShortConv {
        let s = &self.sizes;
        ShortConv {
            weight: self.conv_w,
            bias: self.conv_b,
            channels: s.conv_dim(),
            width: s.conv,
            offset: s.inner,
            stride: s.in_proj_dim(),
            silu: true,
            slot: 0,
        }
    }
}

pub trait Mamba2Ops: Backend {
    /// A decode step's in_proj and inputs (one position per row, continuing `state`): zxbcdt =
    /// in_proj(x), then xbc as [`Backend::short_conv_fwd`] and dt as
    /// [`Mamba2Ops::mamba2_dt_fwd`] compute them, which a backend may do in one pass.
    #[allow(clippy::too_many_arguments)]
    fn mamba2_step_in(
        &mut self,
        zxbcdt: &mut Self::Act,
        xbc: &mut Self::Act,
        dt: &mut Self::F32,
        x: &Self::Act,
        in_proj: &Linear,
        p: &Mamba2Params,
        batch: &Self::Batch,
        state: &mut Mamba2State<Self::F32>,
    ) -> Result<()> {
        let rows = self.batch_info(batch).batch;
        self.linear_fwd(zxbcdt, x, in_proj, rows)?;
        self.short_conv_fwd(xbc, zxbcdt, &p.short_conv(), batch, Some(state))?;
        self.mamba2_dt_fwd(dt, zxbcdt, p, rows)
    }
    /// dt [B·T, H] (f32) = softplus(dt_raw + dt_bias).
    fn mamba2_dt_fwd(&mut self, dt: &mut Self::F32, zxbcdt: &Self::Act, p: &Mamba2Params, rows: usize) -> Result<()>;
    /// From d dt, writes d dt_raw into its columns of `dzxbcdt` and adds dt_bias's gradient.
    fn mamba2_dt_bwd(
        &mut self,
        dzxbcdt: &mut Self::Act,
        ddt: &Self::F32,
        zxbcdt: &Self::Act,
        p: &Mamba2Params,
    ) -> Result<()>;
    /// y [B·T, H·P] = SSD(x, dt, A = −exp(A_log), B, C) + D·x; with `state`, continuing its SSM
    /// state (which it then advances: the decode step when T = 1).
    fn ssd_fwd(
        &mut self,
        y: &mut Self::Act,
        x: SsdIn<'_, Self::Act, Self::F32>,
        p: &Mamba2Params,
        batch: &Self::Batch,
        state: Option<&mut Mamba2State<Self::F32>>,
    ) -> Result<()>;
    /// The SSD's backward from dy: writes dx, dB, dC into `dxbc` and d dt, adds A_log's and D's
    /// gradients.
    fn ssd_bwd(
        &mut self,
        dxbc: &mut Self::Act,
        ddt: &mut Self::F32,
        dy: &Self::Act,
        x: SsdIn<'_, Self::Act, Self::F32>,
        p: &Mamba2Params,
        batch: &Self::Batch,
    ) -> Result<()>;
    /// g = RMSNorm(y ⊙ SiLU(z)) · w over the first `rows` rows, saving 1/rms per row into `rstd`.
    fn gated_norm_fwd(
        &mut self,
        g: &mut Self::Act,
        rstd: &mut Self::F32,
        y: &Self::Act,
        zxbcdt: &Self::Act,
        p: &Mamba2Params,
        rows: usize,
    ) -> Result<()>;
    /// From dg: dy, dz (into its columns of `dzxbcdt`), and the norm weight's gradient.
    #[allow(clippy::too_many_arguments)]
    fn gated_norm_bwd(
        &mut self,
        dy: &mut Self::Act,
        dzxbcdt: &mut Self::Act,
        dg: &Self::Act,
        y: &Self::Act,
        zxbcdt: &Self::Act,
        rstd: &Self::F32,
        p: &Mamba2Params,
    ) -> Result<()>;
}

/// The SSD's inputs: the convolution's output xbc [B·T, C] (x, then B and C) and dt [B·T, H] in
/// f32 (A: activations, F: f32).
pub struct SsdIn<'a, A, F> {
    pub xbc: &'a A,
    pub dt: &'a F,
}
