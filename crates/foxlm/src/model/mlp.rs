//! The SwiGLU MLP: down_proj(silu(gate) · up), [gate | up] = gate_proj(x).

use super::Linear;
use crate::backend::{Alloc, Backend};
use crate::config::Config;
use crate::tensor::Params;
use anyhow::Result;

#[derive(Clone, Debug)]
pub struct Mlp {
    pub gate_proj: Linear,
    pub down_proj: Linear,
    pub intermediate: usize,
}

#[derive(Clone, Debug, Default)]
pub struct MlpActs<A> {
    /// gate_proj(x), [rows, 2I].
    pub gu: A,
    /// silu(gate) · up, [rows, I].
    pub h: A,
}

/// The MLP's backward buffers: d h [rows, I] and d gu [rows, 2I].
pub struct MlpScratch<A> {
    pub dh: A,
    pub dgu: A,
}

impl<A> MlpActs<A> {
    pub fn new<B: Alloc<Act = A>>(be: &B, m: &Mlp, rows: usize) -> Result<Self> {
        let i = m.intermediate;
        Ok(Self { gu: be.alloc(rows * 2 * i)?, h: be.alloc(rows * i)? })
    }
}

impl<A> MlpScratch<A> {
    pub fn new<B: Alloc<Act = A>>(be: &B, m: &Mlp, rows: usize) -> Result<Self> {
        let i = m.intermediate;
        Ok(Self { dh: be.alloc(rows * i)?, dgu: be.alloc(rows * 2 * i)? })
    }
}

impl Mlp {
    pub fn new(p: &mut Params, cfg: &Config, prefix: &str) -> Self {
        Self::with_width(p, cfg.hidden_size, cfg.intermediate(), prefix)
    }

    /// A SwiGLU MLP d → 2I → d (a hybrid's blocks differ in I).
    pub fn with_width(p: &mut Params, d: usize, i: usize, prefix: &str) -> Self {
        Self {
            gate_proj: Linear::new(p, &format!("{prefix}.gate_proj.weight"), 2 * i, d),
            down_proj: Linear::new(p, &format!("{prefix}.down_proj.weight"), d, i),
            intermediate: i,
        }
    }

    /// down_proj(silu(gate) · up) of x into `out`, saving into `a`.
    pub fn forward<B: Backend>(
        &self,
        be: &mut B,
        x: &B::Act,
        a: &mut MlpActs<B::Act>,
        out: &mut B::Act,
        rows: usize,
    ) -> Result<()> {
        be.gate_up_swiglu_fwd(&mut a.gu, &mut a.h, x, &self.gate_proj, rows, self.intermediate)?;
        be.linear_fwd(out, &a.h, &self.down_proj, rows)
    }

    /// Backward of `forward`: from dy [rows, d] writes dx [rows, d] and adds the gradients of
    /// gate_proj and down_proj in the backend.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<B: Backend>(
        &self,
        be: &mut B,
        x: &B::Act,
        a: &MlpActs<B::Act>,
        dy: &B::Act,
        dx: &mut B::Act,
        s: &mut MlpScratch<B::Act>,
        rows: usize,
    ) -> Result<()> {
        be.linear_bwd(&self.down_proj, &a.h, dy, Some(&mut s.dh), false, rows)?;
        be.swiglu_bwd(&mut s.dgu, &s.dh, &a.gu, rows, self.intermediate)?;
        be.linear_bwd(&self.gate_proj, x, &s.dgu, Some(dx), false, rows)
    }
}
