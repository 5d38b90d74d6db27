//! The CPU API of a model (f32, buffers allocated per call): inference, evaluation and tests
//! call these; they run [`Model::forward_on`] / [`Model::loss_and_grads_on`] on the CPU backend.

use crate::backend::cpu::{Cpu, CpuBatch};
use crate::backend::{Backend, BatchInfo};
use crate::model::cache::Cache;
use crate::model::{CpuActs, Ctx, Model, ModelActs, Scratch};
use anyhow::Result;

impl Model {
    fn cpu_batch(
        &self,
        be: &mut Cpu,
        ids: &[u32],
        targets: Option<&[Option<u32>]>,
        ctx: &Ctx,
        past: usize,
    ) -> CpuBatch {
        let mut b = CpuBatch::default();
        let info = BatchInfo { batch: ctx.batch, seq: ctx.seq, start: ctx.start.as_deref(), past };
        if let Err(e) = be.prepare(&mut b, &info, ids, targets) {
            panic!("{e:#}");
        }
        b
    }

    /// The final hidden states (after the last RMSNorm), [B, T, d]. With `cache`, the tokens
    /// continue the cached sequence. With `keep`, the activations for backward are returned.
    pub fn forward_hidden(
        &self,
        ids: &[u32],
        ctx: &Ctx,
        cache: Option<&mut Cache>,
        keep: bool,
    ) -> (Vec<f32>, Option<CpuActs>) {
        let mut be = Cpu::new(&self.params);
        let past = cache.as_ref().map_or(0, |c| c.len());
        let batch = self.cpu_batch(&mut be, ids, None, ctx, past);
        let mut acts = ModelActs::new(&be, self, ctx.batch, ctx.seq, keep).expect("CPU buffers");
        let layers = cache.map(|c| c.layers.as_mut_slice());
        if let Err(e) = self.forward_on(&mut be, &batch, &mut acts, layers) {
            panic!("{e:#}");
        }
        let y = std::mem::take(&mut acts.final_out);
        (y, keep.then_some(acts))
    }

    /// Logits [rows, V] of final hidden states [rows, d].
    pub fn logits(&self, hidden: &[f32]) -> Vec<f32> {
        let rows = hidden.len() / self.config.hidden_size;
        let mut y = vec![0.0; rows * self.lm_head.out_features];
        fox_kernels::matmul::linear_fwd(
            &mut y,
            hidden,
            &self.params[self.lm_head.weight],
            rows,
            self.lm_head.in_features,
            self.lm_head.out_features,
        );
        y
    }

    /// Logits [B, T, V] of a batch (no cache).
    pub fn forward(&self, ids: &[u32], ctx: &Ctx) -> Vec<f32> {
        let (h, _) = self.forward_hidden(ids, ctx, None, false);
        self.logits(&h)
    }

    /// Mean cross-entropy over the rows whose target is Some, and — accumulated into `grads`
    /// (shaped like self.params, see Params::zeros_like), scaled by `grad_scale` — the gradient of
    /// that mean with respect to every parameter. Frozen parameters (ParamKind::Frozen) get no
    /// gradient. ids/targets: [B, T] row-major; ctx.start for left padding (rows before start have
    /// target None). With no target at all the loss is 0 and `grads` is left as it was.
    pub fn loss_and_grads(
        &self,
        ids: &[u32],
        targets: &[Option<u32>],
        ctx: &Ctx,
        grads: &mut [Vec<f32>],
        grad_scale: f32,
    ) -> f32 {
        let n_targets = targets.iter().filter(|t| t.is_some()).count();
        if n_targets == 0 {
            return 0.0;
        }
        let mut be = Cpu::with_grads(&self.params, grads);
        let batch = self.cpu_batch(&mut be, ids, Some(targets), ctx, 0);
        let run = |be: &mut Cpu| -> Result<f64> {
            let mut acts = ModelActs::new(&*be, self, ctx.batch, ctx.seq, true)?;
            let mut scratch = Scratch::new(&*be, self, ctx.batch, ctx.seq)?;
            self.loss_and_grads_on(be, &batch, &mut acts, &mut scratch, grad_scale / n_targets as f32)?;
            Ok(be.take_loss()?.0)
        };
        match run(&mut be) {
            Ok(loss_sum) => (loss_sum / n_targets as f64) as f32,
            Err(e) => panic!("{e:#}"),
        }
    }
}
