//! The HGRN2 family's operations: what a backend supplies so that a [`super::Hgrn2Mixer`] runs on
//! it. Buffers are the layer's: q, k, g, f [B·T, d] (H heads of K channels: H·K = d), v and o
//! [B·T, d]; the model-level lower bounds [L, d]. Gradients of parameters are accumulated (`+=`);
//! gradients of activations are overwritten.

use super::state::Hgrn2State;
use crate::backend::{Backend, ShortConv};
use crate::config::Hgrn2Sizes;
use crate::tensor::ParamId;
use anyhow::{anyhow, Result};

/// Which of the layer's three short convolutions (its index in the state's `conv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvOf {
    Q = 0,
    F = 1,
    I = 2,
}

/// An HGRN2 layer's parameters other than its projections, and where it sits in the model.
#[derive(Clone, Copy, Debug)]
pub struct Hgrn2Params {
    /// With short convolutions: q's, f's and i's weights [d, 1, W] (no bias, as fla's).
    pub convs: Option<[ParamId; 3]>,
    /// The output norm's weight [d] (RMSNorm over the whole width, ε [`crate::config::HGRN2_G_NORM_EPS`]).
    pub g_norm: ParamId,
    /// The layer's index: its row of the lower bounds (layer 0 has none).
    pub layer: usize,
    pub sizes: Hgrn2Sizes,
}

impl Hgrn2Params {
    /// Short convolution `which` over the layer's [B·T, d] buffer: fla's ShortConvolution in
    /// HGRN2 (no bias, no activation).
    pub fn short_conv(&self, which: ConvOf) -> Result<ShortConv> {
        let w = self
            .conv(which)
            .ok_or_else(|| anyhow!("an HGRN2 layer without short convolutions has no {which:?} conv"))?;
        let d = self.sizes.heads * self.sizes.head_dim;
        Ok(ShortConv {
            weight: w,
            bias: None,
            channels: d,
            width: self.sizes.conv.unwrap_or(1),
            offset: 0,
            stride: d,
            silu: false,
            slot: which as usize,
        })
    }

    /// Whether the layer's forget gate is bounded below (the model has lower bounds, layer > 0).
    pub fn bounded(&self) -> bool {
        self.sizes.lower_bound && self.layer > 0
    }

    /// The convolution's weight, when the layer has short convolutions.
    pub fn conv(&self, which: ConvOf) -> Option<ParamId> {
        self.convs.map(|[q, f, i]| match which {
            ConvOf::Q => q,
            ConvOf::F => f,
            ConvOf::I => i,
        })
    }
}

pub trait Hgrn2Ops: Backend {
    /// lb [L, d] = the softmax of `lower_bounds` [L, d] over layers, its cumulative sum over
    /// layers less the first row (row 0 is 0; row l = Σ_{1 ≤ j ≤ l} softmax_j).
    fn hgrn2_lower_bounds_fwd(&mut self, lb: &mut Self::F32, lower_bounds: ParamId, layers: usize) -> Result<()>;
    /// From dlb [L, d] (rows 1..L, each written by its layer's gate backward; row 0 is not read),
    /// adds `lower_bounds`' gradient.
    fn hgrn2_lower_bounds_bwd(&mut self, dlb: &Self::F32, lower_bounds: ParamId, layers: usize) -> Result<()>;
    /// q = swish(q_in); g = logsigmoid(f), in a bounded layer logaddexp(ln lb, ln(1 − lb) + that)
    /// = ln(lb + (1 − lb)·sigmoid(f)) with lb the layer's row of `lb`; k = 1 − exp(g).
    #[allow(clippy::too_many_arguments)]
    fn hgrn2_gates_fwd(
        &mut self,
        q: &mut Self::Act,
        k: &mut Self::Act,
        g: &mut Self::Act,
        q_in: &Self::Act,
        f: &Self::Act,
        lb: &Self::F32,
        p: &Hgrn2Params,
        rows: usize,
    ) -> Result<()>;
    /// From dq, dk and dg, writes dq_in and df, and in a bounded layer overwrites its row of dlb
    /// (the gradient of its lower bound, summed over tokens).
    fn hgrn2_gates_bwd(
        &mut self,
        grads: Hgrn2GateGradsOf<'_, Self::Act, Self::F32>,
        x: Hgrn2GatesOf<'_, Self::Act, Self::F32>,
        p: &Hgrn2Params,
    ) -> Result<()>;
    /// o [B·T, d] = GLA over (q, k, v, g) with scale K^−½; with `state`, continuing its state
    /// (which it then advances: the decode step when T = 1).
    fn hgrn2_gla_fwd(
        &mut self,
        o: &mut Self::Act,
        x: GlaIn<'_, Self::Act>,
        p: &Hgrn2Params,
        batch: &Self::Batch,
        state: Option<&mut Hgrn2State<Self::F32>>,
    ) -> Result<()>;
    /// GLA's backward from do (a full-sequence forward, no state): writes dq, dk, dv, dg.
    fn hgrn2_gla_bwd(
        &mut self,
        grads: GlaGradsOf<'_, Self::Act>,
        dout: &Self::Act,
        x: GlaIn<'_, Self::Act>,
        p: &Hgrn2Params,
        batch: &Self::Batch,
    ) -> Result<()>;
}

/// GLA's inputs: q, k (the forget gate's complement), v and the log forget gate g, [B·T, d].
pub struct GlaIn<'a, A> {
    pub q: &'a A,
    pub k: &'a A,
    pub v: &'a A,
    pub g: &'a A,
}

/// Where GLA's backward writes its gradients.
pub struct GlaGradsOf<'a, A> {
    pub dq: &'a mut A,
    pub dk: &'a mut A,
    pub dv: &'a mut A,
    pub dg: &'a mut A,
}

/// Where the gates' backward writes: dq_in, df and the lower bounds' gradient rows; what it
/// reads: dq, dk, dg.
pub struct Hgrn2GateGradsOf<'a, A, F> {
    pub dq_in: &'a mut A,
    pub df: &'a mut A,
    pub dlb: &'a mut F,
    pub dq: &'a A,
    pub dk: &'a A,
    pub dg: &'a A,
}

/// The gates' forward inputs and output the backward reads.
pub struct Hgrn2GatesOf<'a, A, F> {
    pub q_in: &'a A,
    pub f: &'a A,
    pub g: &'a A,
    pub lb: &'a F,
}
