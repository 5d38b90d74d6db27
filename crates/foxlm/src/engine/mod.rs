//! Where a training step runs: the CPU (f32, the reference) or one GPU (bf16 or f32). The trainer
//! (`train::train`) drives either through [`Engine`]: the same loop, schedule, clipping,
//! checkpoints and metrics; the model, its parameters and AdamW's state live on the host between
//! steps on the CPU, and on the device on the GPU (copied back for checkpoints).

use crate::backend::cpu::{timer, Cpu, CpuBatch, CpuProfile, GradLedger};
use crate::backend::cuda::{Cuda, GpuBatch};
use crate::backend::{Backend, BatchInfo, Dtype, Family};
use crate::data::{Batch, Dataset, Loader};
use crate::model::{activation_plan, Acts, CpuActs, MemoryPlan, Model, ModelActs, Scratch};
use crate::optim::{clip_coef, global_norm_with, AdamW, SparseRows};
use crate::validate::gib;
use anyhow::Result;
use fox_kernels::cuda::{Elem, Gpu};
use fox_kernels::par::on_pool;
use rayon::prelude::*;
use std::sync::Arc;

mod validation;
use validation::val_sums;
pub use validation::{sum_loss, validation_loss};

/// One optimizer step's results before the update.
pub struct StepStats {
    pub loss: f64,
    pub grad_norm: f64,
}

/// A training step's device. The step itself (which windows each rank reads, micro-batches
/// accumulated, the norm and clipping) is written once, in [`Engine::grads`] and
/// [`Engine::step_on`]; an engine supplies its parts.
pub trait Engine {
    /// Starts a step: gradients zeroed (or marked to be overwritten), the micro-batch checked
    /// against the engine's plan.
    fn begin_grads(&mut self, micro: usize) -> Result<()>;
    /// Forward and backward of one micro-batch, gradients added, weighted so that the step's
    /// `accum` micro-batches (over all ranks) add up to the mean over their targets; returns its
    /// mean loss. `last`: this rank's last micro-batch of the step (the backward also takes the
    /// norm's sums of squares, or reduces the gradients across ranks as it goes).
    fn micro_grads(&mut self, model: &Model, batch: &Batch, accum: usize, last: bool) -> Result<f64>;
    /// After this rank's micro-batches: the loss over all ranks, the global gradient norm and
    /// the clipping factor AdamW will apply.
    fn finish_grads(&mut self, model: &Model, loss_sum: f64, accum: usize, max_norm: f64) -> Result<StepStats>;
    /// AdamW with learning rate `lr` on the gradients of [`Engine::grads`].
    fn update(&mut self, model: &mut Model, opt: &mut AdamW, lr: f64) -> Result<()>;
    /// Brings the weights and optimizer state to the host (before a checkpoint).
    fn sync(&mut self, model: &mut Model, opt: &mut AdamW) -> Result<()>;
    /// Mean validation loss over up to `max_tokens` tokens of windows of `context`.
    fn validation_loss(
        &mut self,
        model: &mut Model,
        ds: &Dataset,
        context: usize,
        max_tokens: u64,
    ) -> Result<Option<f64>>;
    fn describe(&self) -> String;
    /// This process's (rank, world size).
    fn world(&self) -> (usize, usize) {
        (0, 1)
    }
    /// Whether any rank has `flag` set (so that every rank of a data-parallel run stops at the
    /// same step); `flag` itself on one process.
    fn any_rank(&mut self, flag: bool) -> Result<bool> {
        Ok(flag)
    }

    /// Gradients of `accum` micro-batches (mean loss), clipped to `max_norm`; no update yet, so
    /// a NaN can stop the run before it reaches the weights. Each rank reads its share of the
    /// step's windows (all of them on one process), in a single process's order.
    fn grads(
        &mut self,
        model: &mut Model,
        loader: &mut Loader,
        micro: usize,
        accum: usize,
        max_norm: f64,
    ) -> Result<StepStats> {
        self.begin_grads(micro)?;
        let (rank, world) = self.world();
        let slice = crate::distributed::StepSlice::new(micro, accum, rank, world)?;
        let mut loss_sum = 0.0;
        slice.read_each(loader, micro, |b, last| {
            loss_sum += self.micro_grads(model, &b, accum, last)?;
            Ok(())
        })?;
        self.finish_grads(model, loss_sum, accum, max_norm)
    }

    /// One optimizer step as `foxlm train` runs it (gradients, clipping, AdamW) on given
    /// micro-batches of `micro` sequences, for benchmarks (no loader). As one rank of a
    /// data-parallel run, `batches` are this rank's and the step's batch is the world's.
    fn step_on(
        &mut self,
        model: &mut Model,
        opt: &mut AdamW,
        batches: &[Batch],
        micro: usize,
        max_norm: f64,
        lr: f64,
    ) -> Result<StepStats> {
        self.begin_grads(micro)?;
        let accum = batches.len().max(1) * self.world().1;
        let mut loss_sum = 0.0;
        for (k, b) in batches.iter().enumerate() {
            loss_sum += self.micro_grads(model, b, accum, k + 1 == batches.len())?;
        }
        let stats = self.finish_grads(model, loss_sum, accum, max_norm)?;
        self.update(model, opt, lr)?;
        Ok(stats)
    }
}

// ---------------------------------------------------------------------------------------------

pub struct CpuEngine {
    grads: Vec<Vec<f32>>,
    /// The clipping factor of the last `grads`, applied inside AdamW.
    grad_scale: f32,
    /// The gradients are all zero (AdamW zeroed them after the last update, or left them stale
    /// in the ledger).
    zeroed: bool,
    /// Which gradients are stale (zero, to be overwritten) and the sums of squares taken during
    /// the last micro-batch's backward.
    ledger: GradLedger,
    /// The parameters whose gradients AdamW leaves stale instead of zeroing: the Linear weights
    /// (the blocks' projections and the output head), which a product overwrites.
    leave_stale: Vec<bool>,
    micro: usize,
    /// Activations and backward buffers for [batch, seq], kept between steps: allocating them
    /// afresh costs a page fault per 4 KiB every step.
    bufs: Option<CpuBuffers>,
    /// The embedding rows of this step's tokens: the only ones with a gradient, so the norm and
    /// AdamW skip the others (with GPT-2's vocabulary, most of the embedding).
    touched: Vec<bool>,
    /// Wall time by kind of operation, while a benchmark asks for it.
    profile: Option<CpuProfile>,
}

/// The embedding's rows that carry a gradient, as the optimizer takes them.
fn sparse_rows<'a>(model: &Model, touched: &'a [bool]) -> SparseRows<'a> {
    let e = &model.params.tensors[model.embeddings.0];
    SparseRows { param: model.embeddings.0, cols: e.numel() / e.shape[0].max(1), touched }
}

struct CpuBuffers {
    batch: usize,
    seq: usize,
    acts: CpuActs,
    scratch: Scratch<Vec<f32>, Vec<f32>>,
}

impl CpuEngine {
    pub fn new(model: &Model, micro: usize) -> Self {
        let rows = model.params.tensors[model.embeddings.0].shape[0];
        let p = &model.params;
        Self {
            grads: p.written_zeros_like(),
            grad_scale: 1.0,
            zeroed: true,
            ledger: GradLedger::new(p.len()),
            leave_stale: (0..p.len()).map(|i| model.is_linear(i)).collect(),
            micro,
            bufs: None,
            touched: vec![false; rows],
            profile: None,
        }
    }

    /// Times every operation of the following steps by [`Family`] (the optimizer's too).
    pub fn start_profile(&mut self) {
        self.profile = Some(CpuProfile::default());
    }

    /// Milliseconds and operations per family since [`CpuEngine::start_profile`].
    pub fn take_profile(&mut self) -> Vec<(Family, f64, usize)> {
        self.profile.take().map_or_else(Vec::new, |p| p.families())
    }

    /// Zero gradients to accumulate into (AdamW leaves them zeroed; a step that did not reach
    /// the update did not).
    fn begin_step(&mut self) {
        let _t = timer(self.profile.as_ref(), Family::Optimizer);
        if !self.zeroed {
            self.grads.iter_mut().for_each(|g| g.par_iter_mut().for_each(|x| *x = 0.0));
            self.ledger.stale.fill(false);
        }
        // Sums of squares from a step that failed before its norm are not this step's.
        self.ledger.sum_squares = None;
        self.zeroed = false;
    }

    /// The global gradient norm and the clipping factor AdamW will apply.
    fn clip(&mut self, model: &Model, max_norm: f64) -> f64 {
        let _t = timer(self.profile.as_ref(), Family::Optimizer);
        // A gradient still stale was not written by this step: it is zero.
        for (g, stale) in self.grads.iter_mut().zip(&mut self.ledger.stale) {
            if std::mem::take(stale) {
                g.fill(0.0);
            }
        }
        let known = self.ledger.sum_squares.take();
        let (grads, touched) = (&self.grads, &self.touched);
        let sparse = sparse_rows(model, touched);
        let grad_norm = on_pool(|| global_norm_with(grads, &model.params, Some(&sparse), known.as_deref()));
        self.grad_scale = clip_coef(grad_norm, max_norm);
        grad_norm
    }

    /// Forward and backward of one micro-batch of `accum`, gradients added (weighted so that
    /// `accum` micro-batches add up to the mean over all their targets); returns its mean loss.
    /// What `Model::loss_and_grads` does, on buffers kept between steps, on rayon's pool
    /// ([`on_pool`]). On the `last` micro-batch the backward also takes the sums of squares of
    /// the gradients it finishes, for the norm.
    fn micro_step(
        &mut self,
        model: &Model,
        ids: &[u32],
        targets: &[Option<u32>],
        batch: usize,
        accum: usize,
        last: bool,
    ) -> Result<f64> {
        on_pool(|| {
            let n_targets = targets.iter().filter(|t| t.is_some()).count();
            if n_targets == 0 {
                return Ok(0.0);
            }
            let seq = ids.len() / batch.max(1);
            self.ledger.sum_squares = last.then(|| vec![None; model.params.len()]);
            let mut be = Cpu::with_grads(&model.params, &mut self.grads)
                .with_ledger(&mut self.ledger)
                .profiled(self.profile.as_ref());
            let bufs = match self.bufs.take() {
                Some(b) if b.batch == batch && b.seq == seq => b,
                _ => CpuBuffers {
                    batch,
                    seq,
                    acts: ModelActs::new(&be, model, batch, seq, true)?,
                    scratch: Scratch::new(&be, model, batch, seq)?,
                },
            };
            let bufs = self.bufs.insert(bufs);
            let mut b = CpuBatch::default();
            be.prepare(&mut b, &BatchInfo { batch, seq, start: None, past: 0 }, ids, Some(targets))?;
            ids.iter().for_each(|&id| self.touched[id as usize] = true);
            let weight = (1.0 / accum as f32) / n_targets as f32;
            model.loss_and_grads_on(&mut be, &b, &mut bufs.acts, &mut bufs.scratch, weight)?;
            let (sum, _) = be.take_loss()?;
            Ok(sum / n_targets as f64)
        })
    }
}

impl Engine for CpuEngine {
    fn begin_grads(&mut self, _micro: usize) -> Result<()> {
        self.begin_step();
        Ok(())
    }
    fn micro_grads(&mut self, model: &Model, b: &Batch, accum: usize, last: bool) -> Result<f64> {
        self.micro_step(model, &b.ids, &b.targets, b.batch, accum, last)
    }
    fn finish_grads(&mut self, model: &Model, loss_sum: f64, accum: usize, max_norm: f64) -> Result<StepStats> {
        let grad_norm = self.clip(model, max_norm);
        Ok(StepStats { loss: loss_sum / accum as f64, grad_norm })
    }
    fn update(&mut self, model: &mut Model, opt: &mut AdamW, lr: f64) -> Result<()> {
        let _t = timer(self.profile.as_ref(), Family::Optimizer);
        if opt.step == 0 {
            // A fresh optimizer's moments are zeros that no one has written yet: written now,
            // so that AdamW's first read-then-write takes no copy-on-write faults (see
            // `Params::written_zeros_like`).
            (opt.m, opt.v) = (model.params.written_zeros_like(), model.params.written_zeros_like());
        }
        let sparse = sparse_rows(model, &self.touched);
        let (grads, scale, leave) = (&mut self.grads, self.grad_scale, &self.leave_stale);
        on_pool(|| opt.update_scaled_and_zero(&mut model.params, grads, lr, scale, Some(&sparse), Some(leave)));
        self.ledger.stale.copy_from_slice(&self.leave_stale);
        self.touched.fill(false);
        self.zeroed = true;
        Ok(())
    }
    fn sync(&mut self, _model: &mut Model, _opt: &mut AdamW) -> Result<()> {
        Ok(())
    }
    fn validation_loss(
        &mut self,
        model: &mut Model,
        ds: &Dataset,
        context: usize,
        max_tokens: u64,
    ) -> Result<Option<f64>> {
        let micro = self.micro.max(1);
        on_pool(|| validation_loss(model, ds, context, max_tokens, micro))
    }
    fn describe(&self) -> String {
        format!("cpu ({} threads, f32)", rayon::current_num_threads())
    }
}

// ---------------------------------------------------------------------------------------------

/// A training step on one GPU, every buffer allocated here, once.
pub struct GpuEngine<T: Elem> {
    be: Cuda<T>,
    batch: GpuBatch,
    acts: Acts<Cuda<T>>,
    scratch: Scratch<<Cuda<T> as crate::backend::Alloc>::Act, <Cuda<T> as crate::backend::Alloc>::F32>,
    micro: usize,
    context: usize,
    grad_scale: f32,
}

/// A training step's shape on the GPU: `micro` sequences of `context` tokens, every activation kept
/// or, with `recompute`, only each block's input (the backward runs each block's forward again:
/// about a third more compute, a fraction of the memory).
#[derive(Clone, Copy, Debug)]
pub struct StepShape {
    pub micro: usize,
    pub context: usize,
    pub recompute: bool,
}

/// The memory plan of a step on one GPU (of `world` ranks with ZeRO-1): parameters, gradients,
/// optimizer state, activations.
pub fn memory_plan(model: &Model, step: StepShape, dtype: Dtype, world: usize) -> Result<MemoryPlan> {
    let StepShape { micro, context, recompute } = step;
    let mut plan = MemoryPlan::default();
    match dtype {
        Dtype::Bf16 => Cuda::<half::bf16>::memory_plan(model, micro, context, true, world, &mut plan),
        Dtype::F32 => Cuda::<f32>::memory_plan(model, micro, context, true, world, &mut plan),
    }
    let act_bytes = match dtype {
        Dtype::Bf16 => 2,
        Dtype::F32 => 4,
    };
    activation_plan(model, micro, context, act_bytes, recompute, &mut plan)?;
    Ok(plan)
}

/// The plan as printed before training; `ranks` > 1: what each rank's GPU holds.
pub fn format_plan(plan: &MemoryPlan, ranks: usize) -> String {
    let mut s = if ranks > 1 {
        format!("memory plan (each of the {ranks} GPUs; ZeRO-1 shards the optimizer state):\n")
    } else {
        String::from("memory plan (GPU):\n")
    };
    for (what, b) in &plan.items {
        s += &format!("  {:>9.3} GiB  {what}\n", gib(*b));
    }
    s += &format!("  {:>9.3} GiB  total\n", gib(plan.total()));
    s
}

/// What to say when the plan does not fit: the largest items and what lowers them.
fn too_big(plan: &MemoryPlan, free: usize, total: usize) -> anyhow::Error {
    let mut items = plan.items.clone();
    items.sort_by_key(|i| std::cmp::Reverse(i.1));
    let largest: Vec<String> = items.iter().take(3).map(|(w, b)| format!("{w}: {:.2} GiB", gib(*b))).collect();
    anyhow::anyhow!(
        "out of GPU memory: a training step needs {:.2} GiB but {:.2} of {:.2} GiB are free. Largest: {}. \
         Lower --micro-batch (gradients accumulate to the same batch) or --context",
        gib(plan.total()),
        gib(free),
        gib(total),
        largest.join("; ")
    )
}

impl<T: Elem> GpuEngine<T> {
    /// Buffers for steps of shape `step` (`plan`: its [`memory_plan`], printed when they do not
    /// fit). With `nccl`, one rank of a data-parallel run: gradients reduce-scattered in buckets
    /// during the backward, optimizer state sharded (ZeRO-1); None: one GPU alone.
    pub fn new(
        gpu: Arc<Gpu>,
        model: &Model,
        opt: &AdamW,
        step: StepShape,
        plan: &MemoryPlan,
        nccl: Option<fox_kernels::cuda::nccl::Nccl>,
    ) -> Result<Self> {
        let StepShape { micro, context, recompute } = step;
        // Freed buffers go back to the driver at a synchronisation: count them as free.
        gpu.sync()?;
        let (free, total) = gpu.context().mem_get_info().unwrap_or((usize::MAX, 0));
        // cuBLASLt, NVRTC modules and the allocator's rounding take some room beside the plan.
        if plan.total() + (512 << 20) > free {
            return Err(too_big(plan, free, total));
        }
        let build = move || -> Result<Self> {
            let mut be = Cuda::<T>::new(gpu.clone(), model, micro, context, true)?;
            if let Some(nccl) = nccl {
                be.enable_zero1(nccl)?;
            }
            be.init_optimizer(opt)?;
            let batch = be.new_batch(micro * context, micro)?;
            let acts = if recompute {
                ModelActs::recompute(&be, model, micro, context)?
            } else {
                ModelActs::new(&be, model, micro, context, true)?
            };
            let scratch = Scratch::new(&be, model, micro, context)?;
            Ok(Self { be, batch, acts, scratch, micro, context, grad_scale: 1.0 })
        };
        build().map_err(|e| {
            if format!("{e:#}").contains("out of GPU memory") {
                too_big(plan, free, total).context(e)
            } else {
                e
            }
        })
    }

    fn forward_batch(
        &mut self,
        model: &Model,
        ids: &[u32],
        targets: &[Option<u32>],
        train: bool,
        weight: f32,
    ) -> Result<(f64, usize)> {
        let info = BatchInfo { batch: self.micro, seq: self.context, start: None, past: 0 };
        self.be.prepare(&mut self.batch, &info, ids, Some(targets))?;
        if train {
            model.loss_and_grads_on(&mut self.be, &self.batch, &mut self.acts, &mut self.scratch, weight)?;
        } else {
            model.forward_on(&mut self.be, &self.batch, &mut self.acts, None)?;
            self.be.head_loss(None, &self.acts.final_out, &model.lm_head, &self.batch, 1.0)?;
        }
        self.be.take_loss()
    }
}

impl<T: Elem> GpuEngine<T> {
    /// Mean loss of one micro-batch of `accum` and its gradients (weighted so that `accum`
    /// micro-batches add up to the mean over all their targets).
    fn micro_step(&mut self, model: &Model, ids: &[u32], targets: &[Option<u32>], accum: usize) -> Result<f64> {
        let n_targets = targets.iter().filter(|t| t.is_some()).count().max(1);
        let (s, n) = self.forward_batch(model, ids, targets, true, 1.0 / (accum * n_targets) as f32)?;
        Ok(s / n.max(1) as f64)
    }

    /// The global gradient norm, and the clipping factor AdamW will apply.
    fn clip(&mut self, max_norm: f64) -> Result<f64> {
        let grad_norm = self.be.grad_norm()?;
        self.grad_scale = clip_coef(grad_norm, max_norm);
        Ok(grad_norm)
    }

    pub fn backend_mut(&mut self) -> &mut Cuda<T> {
        &mut self.be
    }
}

impl<T: Elem> Engine for GpuEngine<T> {
    fn begin_grads(&mut self, micro: usize) -> Result<()> {
        anyhow::ensure!(micro == self.micro, "micro-batch {micro} differs from the planned {}", self.micro);
        self.be.zero_grads()
    }
    fn micro_grads(&mut self, model: &Model, b: &Batch, accum: usize, last: bool) -> Result<f64> {
        self.be.set_reduce(last);
        self.micro_step(model, &b.ids, &b.targets, accum)
    }
    fn finish_grads(&mut self, _model: &Model, loss_sum: f64, accum: usize, max_norm: f64) -> Result<StepStats> {
        self.be.set_reduce(false);
        let mut loss_sum = [loss_sum];
        self.be.dist_sum(&mut loss_sum)?;
        let grad_norm = self.clip(max_norm)?;
        crate::distributed::heartbeat();
        Ok(StepStats { loss: loss_sum[0] / accum as f64, grad_norm })
    }
    fn world(&self) -> (usize, usize) {
        self.be.world()
    }
    fn update(&mut self, _model: &mut Model, _opt: &mut AdamW, lr: f64) -> Result<()> {
        self.be.adamw_step(lr, self.grad_scale)
    }
    fn sync(&mut self, model: &mut Model, opt: &mut AdamW) -> Result<()> {
        self.be.download_params(&mut model.params)?;
        self.be.download_optimizer(opt)
    }
    fn validation_loss(
        &mut self,
        model: &mut Model,
        ds: &Dataset,
        context: usize,
        max_tokens: u64,
    ) -> Result<Option<f64>> {
        anyhow::ensure!(
            context == self.context,
            "validation context {context} differs from the planned {}",
            self.context
        );
        let sums = val_sums(ds, context, max_tokens, self.micro, |mut bt, _| {
            // A last, shorter batch is padded with copies that carry no targets.
            while bt.ids.len() < self.micro * context {
                let r = bt.ids[..context].to_vec();
                bt.ids.extend_from_slice(&r);
                bt.targets.extend(std::iter::repeat_n(None, context));
            }
            let sum = self.forward_batch(model, &bt.ids, &bt.targets, false, 1.0)?;
            crate::distributed::heartbeat();
            Ok(sum)
        })?;
        Ok(sums.and_then(|(sum, count)| (count > 0).then(|| sum / count as f64)))
    }
    fn describe(&self) -> String {
        match self.be.world() {
            (_, 1) if self.be.zero.is_none() => format!("{} ({})", self.be.gpu.describe(), T::NAME),
            (rank, world) => format!("{} ({}), rank {rank} of {world} (NCCL, ZeRO-1)", self.be.gpu.describe(), T::NAME),
        }
    }
    fn any_rank(&mut self, flag: bool) -> Result<bool> {
        let mut v = [if flag { 1.0 } else { 0.0 }];
        self.be.dist_sum(&mut v)?;
        Ok(v[0] > 0.0)
    }
}
