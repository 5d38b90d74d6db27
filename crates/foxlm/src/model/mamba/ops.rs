//! The Mamba family's operations (Samba's Mamba layers): what a backend supplies so that a
//! [`super::MambaMixer`] runs on it. They work on the layer's buffers as the layer lays them
//! out: in_proj's output `xz` [B·T, 2·Di] holds the convolution's input x (columns 0..Di) and
//! the gate z (Di..2·Di); x_proj's output `xp` [B·T, R + 2N] holds dt's low-rank input (R
//! columns), then B and C. Gradients of parameters are accumulated (`+=`); gradients of
//! activations are written into their columns of `dxz` / `dxp`.

use super::state::MambaState;
use crate::backend::{Backend, ShortConv};
use crate::config::MambaSizes;
use crate::tensor::ParamId;
use anyhow::Result;

/// A Mamba layer's parameters other than its projections.
#[derive(Clone, Copy, Debug)]
pub struct MambaParams {
    /// conv1d weight [Di, 1, W] and bias [Di].
    pub conv_w: ParamId,
    pub conv_b: Option<ParamId>,
    /// dt_proj's bias [Di] (dt_proj's weight is a Linear of the layer).
    pub dt_bias: ParamId,
    /// log(−A) [Di, N] and the skip D [Di].
    pub a_log: ParamId,
    pub d_skip: ParamId,
    pub sizes: MambaSizes,
}

impl MambaParams {
    /// The convolution over xz's x columns.
    pub fn short_conv(&self) -> ShortConv {
        let s = &self.sizes;
        ShortConv {
            weight: self.conv_w,
            bias: self.conv_b,
            channels: s.inner,
            width: s.conv,
            offset: 0,
            stride: 2 * s.inner,
            silu: true,
            slot: 0,
        }
    }
}

pub trait MambaOps: Backend {
    /// dt_low [B·T, R] = xp's first R columns (dt_proj's input).
    fn mamba_dt_split(&mut self, dt_low: &mut Self::Act, xp: &Self::Act, p: &MambaParams, rows: usize) -> Result<()>;
    /// xp's first R columns of `dxp` = d_dt_low.
    fn mamba_dt_merge(&mut self, dxp: &mut Self::Act, d_dt_low: &Self::Act, p: &MambaParams) -> Result<()>;
    /// δ [B·T, Di] = softplus(dt_pre + dt_proj.bias) (in the activation type, as the GPU scan
    /// reads it).
    fn mamba_delta_fwd(
        &mut self,
        delta: &mut Self::Act,
        dt_pre: &Self::Act,
        p: &MambaParams,
        rows: usize,
    ) -> Result<()>;
    /// From dδ: d dt_pre, and dt_proj.bias's gradient.
    fn mamba_delta_bwd(
        &mut self,
        d_dt_pre: &mut Self::Act,
        ddelta: &Self::Act,
        dt_pre: &Self::Act,
        p: &MambaParams,
    ) -> Result<()>;
    /// y [B·T, Di] = (scan(u, δ, A = −exp(A_log), B, C) + D·u) · SiLU(z), saving the states the
    /// backward needs into `saved`; with `state`, continuing its scan state (which it then
    /// advances: the decode step when T = 1).
    fn selective_scan_fwd(
        &mut self,
        y: &mut Self::Act,
        saved: &mut Self::F32,
        x: ScanIn<'_, Self::Act>,
        p: &MambaParams,
        batch: &Self::Batch,
        state: Option<&mut MambaState<Self::F32>>,
    ) -> Result<()>;
    /// The scan's backward from dy: writes du, dδ, dB and dC (into `dxp`), dz (into `dxz`'s z
    /// columns), adds A_log's and D's gradients.
    fn selective_scan_bwd(
        &mut self,
        grads: ScanGradsOf<'_, Self::Act>,
        dy: &Self::Act,
        saved: &Self::F32,
        x: ScanIn<'_, Self::Act>,
        p: &MambaParams,
        batch: &Self::Batch,
    ) -> Result<()>;
}

/// The scan's inputs: u and δ [B·T, Di], x_proj's output `xp` (B and C) and in_proj's `xz` (z).
pub struct ScanIn<'a, A> {
    pub u: &'a A,
    pub delta: &'a A,
    pub xp: &'a A,
    pub xz: &'a A,
}

/// Where the scan's backward writes: du, dδ, dB and dC into `dxp`'s columns, dz into `dxz`'s.
pub struct ScanGradsOf<'a, A> {
    pub du: &'a mut A,
    pub ddelta: &'a mut A,
    pub dxp: &'a mut A,
    pub dxz: &'a mut A,
}
