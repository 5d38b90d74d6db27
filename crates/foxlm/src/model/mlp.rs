//! The SwiGLU MLP: down_proj(silu(gate) · up), [gate | up] = gate_proj(x).

use super::Linear;
use crate::config::Config;
use crate::tensor::Params;
use fox_kernels::swiglu;

#[derive(Clone, Debug)]
pub struct Mlp {
    pub gate_proj: Linear,
    pub down_proj: Linear,
    pub intermediate: usize,
}

#[derive(Clone, Debug, Default)]
pub struct MlpActs {
    /// gate_proj(x), [rows, 2I].
    pub gu: Vec<f32>,
    /// silu(gate) · up, [rows, I].
    pub h: Vec<f32>,
}

impl Mlp {
    pub fn new(p: &mut Params, cfg: &Config, prefix: &str) -> Self {
        let (d, i) = (cfg.hidden_size, cfg.intermediate());
        Self {
            gate_proj: Linear::new(p, &format!("{prefix}.gate_proj.weight"), 2 * i, d),
            down_proj: Linear::new(p, &format!("{prefix}.down_proj.weight"), d, i),
            intermediate: i,
        }
    }

    pub fn forward(&self, p: &Params, x: &[f32], rows: usize) -> (Vec<f32>, MlpActs) {
        let gu = self.gate_proj.forward(p, x, rows);
        let mut h = vec![0.0; rows * self.intermediate];
        swiglu::swiglu_fwd(&mut h, &gu, self.intermediate);
        let y = self.down_proj.forward(p, &h, rows);
        (y, MlpActs { gu, h })
    }

    /// Backward of `forward`: from dy [rows, d] returns dx [rows, d] and adds the gradients of
    /// gate_proj and down_proj to `grads`.
    pub fn backward(
        &self,
        p: &Params,
        x: &[f32],
        a: &MlpActs,
        dy: &[f32],
        rows: usize,
        grads: &mut [Vec<f32>],
    ) -> Vec<f32> {
        let mut dh = vec![0.0; rows * self.intermediate];
        self.down_proj.backward(p, &a.h, dy, rows, grads, Some(&mut dh), false);
        let mut dgu = vec![0.0; rows * 2 * self.intermediate];
        swiglu::swiglu_bwd(&mut dgu, &dh, &a.gu, self.intermediate);
        let mut dx = vec![0.0; rows * self.gate_proj.in_features];
        self.gate_proj.backward(p, x, &dgu, rows, grads, Some(&mut dx), false);
        dx
    }
}
