//! The DeltaNet family's operations: what a backend supplies so that a [`super::DeltaNetMixer`]
//! runs on it (DeltaNet and Gated DeltaNet alike). Buffers are the layer's: q, k [B·T, H·K], v
//! and o [B·T, H·V], β and the raw decay input [B·T, H] (activations), the log-decay g and its
//! gradient [B·T, H] in f32 (as fla's layer computes g in float32: its prefix sums over a chunk
//! set every decay). Gradients of parameters are accumulated (`+=`); gradients of activations
//! are overwritten.

use super::state::DeltaNetState;
use crate::backend::{Backend, ShortConv};
use crate::config::DeltaNetSizes;
use crate::tensor::ParamId;
use anyhow::{anyhow, Result};

/// Which of the layer's three short convolutions (its index in the state's `conv`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvOf {
    Q = 0,
    K = 1,
    V = 2,
}

/// A DeltaNet layer's parameters other than its projections.
#[derive(Clone, Copy, Debug)]
pub struct DeltaNetParams {
    /// The short convolutions' weights [C, 1, W] (no bias, as fla's).
    pub q_conv: ParamId,
    pub k_conv: ParamId,
    pub v_conv: ParamId,
    /// Gated DeltaNet: log(−A) and dt's bias per head.
    pub a_log: Option<ParamId>,
    pub dt_bias: Option<ParamId>,
    /// The output norm's weight [V] (shared by the heads) and epsilon.
    pub o_norm: ParamId,
    pub eps: f32,
    pub sizes: DeltaNetSizes,
}

impl DeltaNetParams {
    /// Convolution `which` of the layer: its own buffer, no bias.
    pub fn short_conv(&self, which: ConvOf) -> ShortConv {
        let (weight, channels) = self.conv(which);
        let width = self.sizes.conv;
        ShortConv { weight, bias: None, channels, width, offset: 0, stride: channels, silu: true, slot: which as usize }
    }

    /// The convolution's weight and channels.
    pub fn conv(&self, which: ConvOf) -> (ParamId, usize) {
        match which {
            ConvOf::Q => (self.q_conv, self.sizes.key_dim()),
            ConvOf::K => (self.k_conv, self.sizes.key_dim()),
            ConvOf::V => (self.v_conv, self.sizes.value_dim()),
        }
    }

    /// Gated DeltaNet's decay parameters: A_log and dt_bias.
    pub fn decay(&self) -> Result<(ParamId, ParamId)> {
        match (self.a_log, self.dt_bias) {
            (Some(a), Some(b)) => Ok((a, b)),
            _ => Err(anyhow!("a DeltaNet layer without a decay has no A_log / dt_bias")),
        }
    }
}

pub trait DeltaNetOps: Backend {
    /// y = x / √(Σ x² + 1e-6) over rows of `dim`, 1/√(Σ x² + 1e-6) per row into `rstd`.
    /// L2 norm over the first `rows` rows of `dim`.
    fn l2norm_fwd(
        &mut self,
        y: &mut Self::Act,
        rstd: &mut Self::F32,
        x: &Self::Act,
        rows: usize,
        dim: usize,
    ) -> Result<()>;
    fn l2norm_bwd(
        &mut self,
        dx: &mut Self::Act,
        dy: &Self::Act,
        y: &Self::Act,
        rstd: &Self::F32,
        dim: usize,
    ) -> Result<()>;
    /// Gated DeltaNet's log-decay g [B·T, H] = −exp(A_log) · softplus(a + dt_bias).
    fn deltanet_decay_fwd(&mut self, g: &mut Self::F32, a: &Self::Act, p: &DeltaNetParams, rows: usize) -> Result<()>;
    /// From dg, writes da and adds A_log's and dt_bias's gradients.
    fn deltanet_decay_bwd(
        &mut self,
        da: &mut Self::Act,
        dg: &Self::F32,
        a: &Self::Act,
        p: &DeltaNetParams,
    ) -> Result<()>;
    /// o [B·T, H·V] = the delta rule over (q, k, v, β, g) with scale K^−½; with `state`,
    /// continuing its state (which it then advances: the decode step when T = 1).
    fn delta_rule_fwd(
        &mut self,
        o: &mut Self::Act,
        x: DeltaRuleIn<'_, Self::Act, Self::F32>,
        p: &DeltaNetParams,
        batch: &Self::Batch,
        state: Option<&mut DeltaNetState<Self::F32>>,
    ) -> Result<()>;
    /// The delta rule's backward from do (a full-sequence forward, no state).
    fn delta_rule_bwd(
        &mut self,
        grads: DeltaRuleGradsOf<'_, Self::Act, Self::F32>,
        dout: &Self::Act,
        x: DeltaRuleIn<'_, Self::Act, Self::F32>,
        p: &DeltaNetParams,
        batch: &Self::Batch,
    ) -> Result<()>;
    /// y = x ⊙ SiLU(gate) (fla's o_norm with g_proj: the norm's output times SiLU of the gate).
    fn swish_gate_fwd(&mut self, y: &mut Self::Act, x: &Self::Act, gate: &Self::Act, n: usize) -> Result<()>;
    fn swish_gate_bwd(
        &mut self,
        dx: &mut Self::Act,
        dgate: &mut Self::Act,
        dy: &Self::Act,
        x: &Self::Act,
        gate: &Self::Act,
    ) -> Result<()>;
}

/// The delta rule's inputs (A: activations, F: f32): q, k [B·T, H·K], v [B·T, H·V], β [B·T, H]
/// and, in Gated DeltaNet, the log-decay g [B·T, H].
pub struct DeltaRuleIn<'a, A, F> {
    pub q: &'a A,
    pub k: &'a A,
    pub v: &'a A,
    pub beta: &'a A,
    pub g: Option<&'a F>,
}

/// Where the delta rule's backward writes its gradients (A: activations, F: f32).
pub struct DeltaRuleGradsOf<'a, A, F> {
    pub dq: &'a mut A,
    pub dk: &'a mut A,
    pub dv: &'a mut A,
    pub dbeta: &'a mut A,
    /// Gated DeltaNet's.
    pub dg: Option<&'a mut F>,
}
