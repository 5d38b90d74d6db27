//! The GPU inference backend ([`GpuInfer`]): the model on the CUDA backend, prompts prefilled in
//! chunks through decode caches on the device, decode steps fused (or as the megakernel) and
//! replayed as CUDA graphs, the next token chosen on the device.

use super::{Infer, Plan, StepOut, Timed, TimedScore};
use crate::backend::cuda::{Cuda, DeviceSampling, GpuBatch};
use crate::backend::{Backend, BatchInfo};
use crate::generate::{run_prompts, GenerateOptions, Padded, PromptJob};
use crate::model::attention::kv_cache_cuda::GpuCache;
use crate::model::cache::GpuLayerState;
use crate::model::mamba::state::MambaState;
use crate::model::mamba2::state::Mamba2State;
use crate::model::mega_cuda::Megakernel;
use crate::model::Mixer;
use crate::model::{Acts, CpuActs, Ctx, Model, ModelActs};
use crate::validate::gib;
use anyhow::{anyhow, bail, ensure, Context, Result};
use fox_kernels::cuda::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use fox_kernels::cuda::cudarc::driver::{CudaGraph, CudaSlice};
use fox_kernels::cuda::{Elem, Gpu};
use std::sync::Arc;

/// The GPU inference backend: the model on the CUDA backend in `T` (bf16, or f32 to check
/// against the CPU).
pub struct GpuInfer<'m, T: Elem> {
    model: &'m Model,
    pub be: Cuda<T>,
    batch: GpuBatch,
    /// Buffers of one block for a [plan.batch, plan.chunk] forward, and for a decode step.
    acts: Acts<Cuda<T>>,
    step: Acts<Cuda<T>>,
    /// The ids chosen on the device, [plan.batch].
    chosen: CudaSlice<i32>,
    plan: Plan,
    /// Replay decode steps as CUDA graphs (bf16, head dim 64/128); on by default.
    pub graphs: bool,
    /// Decode steps of the last generation that ran as a CUDA graph (the GPU check asserts that
    /// its graph rows replayed some: a failed capture falls back to launches with a warning).
    pub graph_steps: usize,
    /// Batch-1 decode steps as one launch, where the model fits the megakernel and it is on.
    pub mega: Megakernel<T>,
}

impl<'m, T: Elem> GpuInfer<'m, T> {
    pub fn new(gpu: Arc<Gpu>, model: &'m Model, plan: Plan) -> Result<Self> {
        let plan = Plan { batch: plan.batch.max(1), chunk: plan.chunk.max(1) };
        let rows = plan.batch.checked_mul(plan.chunk).ok_or_else(|| anyhow!("batch × chunk overflows"))?;
        let weights = model.params.numel() * (4 + std::mem::size_of::<T>());
        let (free, total) = gpu.context().mem_get_info().unwrap_or((usize::MAX, 0));
        if weights + (512 << 20) > free {
            bail!(
                "the model's weights need {:.2} GiB on {}, which has {:.2} of {:.2} GiB free",
                gib(weights),
                gpu.name(),
                gib(free),
                gib(total)
            );
        }
        let mut be = Cuda::<T>::new(gpu.clone(), model, plan.batch, plan.chunk, false)
            .with_context(|| format!("loading the model onto {}", gpu.name()))?;
        let mut mega = Megakernel::default();
        if be.prepare_fused_decode(model, plan.batch).context("preparing fused decode steps")? {
            mega = Megakernel::prepare(&be, model).context("preparing the decode megakernel")?;
        }
        let batch = be.new_batch(rows, plan.batch)?;
        let acts = ModelActs::new(&be, model, plan.batch, plan.chunk, false)
            .with_context(|| format!("activations for {} × {} positions", plan.batch, plan.chunk))?;
        let step = ModelActs::new(&be, model, plan.batch, 1, false)?;
        let chosen = gpu.zeros(plan.batch)?;
        Ok(Self { model, be, batch, acts, step, chosen, plan, graphs: true, graph_steps: 0, mega })
    }

    /// Decode steps through the fused kernels and the matrix-vector kernel (the default), or
    /// (`false`) op by op through cuBLASLt: the reference the fused path is checked against.
    pub fn set_fused(&mut self, on: bool) -> Result<()> {
        self.be.gemv = on;
        if on {
            if self.be.prepare_fused_decode(self.model, self.plan.batch)? {
                self.mega = Megakernel::prepare(&self.be, self.model)?;
            }
        } else {
            self.be.clear_fused_decode();
            self.mega.clear();
        }
        Ok(())
    }

    /// Device bytes of a decode cache of `batch` rows × `positions` for this model.
    pub fn cache_bytes(model: &Model, batch: usize, positions: usize) -> usize {
        model
            .layers
            .iter()
            .map(|blk| match &blk.mixer {
                Mixer::Attention(l) => GpuCache::<T>::bytes(batch, l.heads, l.kv_heads, l.head_dim, positions),
                Mixer::Mamba2(l) => Mamba2State::bytes_for(batch, l.sizes()),
                Mixer::Mamba(l) => MambaState::bytes_for(batch, l.sizes()),
                Mixer::DeltaNet(l) => crate::model::deltanet::state::DeltaNetState::bytes_for(batch, l.sizes()),
                Mixer::Hgrn2(l) => crate::model::hgrn2::state::Hgrn2State::bytes_for(batch, l.sizes()),
            })
            .sum()
    }

    pub(crate) fn caches(&self, batch: usize, positions: usize) -> Result<Vec<GpuLayerState<T>>> {
        let need = Self::cache_bytes(self.model, batch, positions);
        let (free, _) = self.be.gpu.context().mem_get_info().unwrap_or((usize::MAX, 0));
        if need + (256 << 20) > free {
            bail!(
                "a decode cache of {batch} × {positions} positions needs {:.2} GiB; the GPU has {:.2} GiB free",
                gib(need),
                gib(free)
            );
        }
        self.be.new_caches(self.model, batch, positions)
    }

    /// A forward of `b` rows × `t` positions within the planned buffers ([`Plan::fits`]).
    fn check_fits(&self, b: usize, t: usize) -> Result<()> {
        let p = self.plan;
        ensure!(p.fits(b, t), "a forward of {b} × {t}; the engine was planned for {} × {}", p.batch, p.chunk);
        Ok(())
    }

    fn check_batch(&self, b: usize) -> Result<()> {
        ensure!(b >= 1 && b <= self.plan.batch, "a batch of {b} rows; the engine was planned for {}", self.plan.batch);
        Ok(())
    }

    /// One forward of the rows `x` (`step`: the one-position decode buffers), continuing the
    /// caches when given; the final hidden states are left in the acts' `final_out`.
    fn forward(
        &mut self,
        x: Padded,
        targets: Option<&[Option<u32>]>,
        caches: Option<&mut [GpuLayerState<T>]>,
        step: bool,
    ) -> Result<()> {
        let past = caches.as_ref().and_then(|c| c.first()).map_or(0, |c| c.len());
        let info = BatchInfo { batch: x.b, seq: x.t, start: x.start, past };
        self.be.prepare(&mut self.batch, &info, x.ids, targets)?;
        match caches {
            Some(c) if x.t == 1 => self.step_forward(c, step),
            caches => {
                let acts = if step { &mut self.step } else { &mut self.acts };
                self.model.forward_on(&mut self.be, &self.batch, acts, caches)
            }
        }
    }

    /// A one-position forward of the prepared batch through `caches` (into the step buffers when
    /// `step`): the megakernel where it applies (one row, see [`Megakernel::step`]), else layer
    /// by layer.
    fn step_forward(&mut self, caches: &mut [GpuLayerState<T>], step: bool) -> Result<()> {
        let acts = if step { &mut self.step } else { &mut self.acts };
        if self.mega.step(&mut self.be, &self.batch, &mut acts.final_out, caches)? {
            return Ok(());
        }
        self.model.forward_on(&mut self.be, &self.batch, acts, Some(caches))
    }

    /// Batch-1 decode steps through the megakernel where the model fits it (off by default:
    /// slower than the fused step, BENCHMARKS.md; `FOXLM_DECODE_MEGA=1` also turns it on), or
    /// (`false`) through the fused step, the reference it is checked against.
    pub fn set_mega(&mut self, on: bool) {
        self.mega.set_on(on);
    }

    /// Prefills the left-padded prompts `x` through `caches`, a chunk at a time, calling
    /// `each(self, first position, length)` after each chunk's forward; the hidden states of the
    /// last chunk stay in `acts`.
    pub(crate) fn prefill(
        &mut self,
        x: Padded,
        caches: &mut [GpuLayerState<T>],
        each: &mut dyn FnMut(&mut Self, usize, usize) -> Result<()>,
    ) -> Result<()> {
        let chunk = self.plan.chunk;
        let mut p0 = 0;
        while p0 < x.t {
            let tc = chunk.min(x.t - p0);
            self.prefill_chunk(x, caches, p0, tc)?;
            each(self, p0, tc)?;
            p0 += tc;
        }
        Ok(())
    }

    /// One chunk of a prefill: positions `p0..p0 + tc` of the left-padded prompts `x` through
    /// `caches` (which hold positions `..p0`); its hidden states stay in `acts`.
    pub(crate) fn prefill_chunk(
        &mut self,
        x: Padded,
        caches: &mut [GpuLayerState<T>],
        p0: usize,
        tc: usize,
    ) -> Result<()> {
        let Padded { b, t, start, .. } = x;
        if let (Some(s), true) = (start, p0 == 0 && t > tc) {
            let most = s.iter().copied().max().unwrap_or(0);
            // Padding must end inside the first chunk (later chunks continue real positions).
            ensure!(
                most < tc,
                "left padding of {most} positions exceeds a prefill chunk of {tc}: batch prompts of closer lengths"
            );
        }
        ensure!(tc >= 1 && p0 + tc <= t, "a prefill chunk of {tc} at {p0} of {t}");
        self.check_fits(b, tc)?;
        let cid = x.chunk_ids(p0, tc);
        self.forward(Padded { ids: &cid, t: tc, ..x }, None, Some(caches), false)
    }

    /// One forward of the left-padded prompts `x` without a cache (scoring: nothing continues
    /// from them); the hidden states stay in `acts`.
    pub(crate) fn forward_uncached(&mut self, x: Padded) -> Result<()> {
        self.check_fits(x.b, x.t)?;
        self.forward(x, None, None, false)
    }

    /// The model this inference backend runs.
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// The plan this inference backend was built for.
    pub fn plan(&self) -> Plan {
        self.plan
    }

    /// Scoring of the last forward's positions `row0..row0 + targets.len()` on the device: each
    /// position's log-probability of its target and its `k` most likely tokens (see
    /// [`Cuda::token_logprobs`]).
    #[allow(clippy::type_complexity)]
    pub(crate) fn chunk_token_logprobs(
        &mut self,
        row0: usize,
        targets: &[u32],
        k: usize,
    ) -> Result<(Vec<f32>, Vec<u32>, Vec<f32>)> {
        let lm_head = self.model.lm_head;
        self.be.token_logprobs(&self.acts.final_out, &lm_head, row0, targets, k)
    }

    /// Each row's most likely next token after a prefill, chosen on the device (the first on
    /// ties, as on the host): b ids come to the host instead of b × V logits.
    pub(crate) fn prefill_last_chosen(&mut self) -> Result<Vec<u32>> {
        self.greedy_on_device(false, 0)
    }

    /// The head on each row's last position of the last forward (`step`: a decode step's
    /// buffers, else a prefill's) and each row's most likely token chosen on the device.
    fn greedy_on_device(&mut self, step: bool, len: usize) -> Result<Vec<u32>> {
        let lm_head = self.model.lm_head;
        let b = self.batch.batch;
        let hidden = if step { &self.step.final_out } else { &self.acts.final_out };
        self.be.last_logits(hidden, &lm_head, &self.batch, false)?;
        let s = DeviceSampling::GREEDY;
        self.be.sample(&mut self.chosen, None, b, &s, len)?;
        self.chosen_to_host(b)
    }

    /// The first `b` ids the device chose (negative ids, none chosen, as 0).
    fn chosen_to_host(&mut self, b: usize) -> Result<Vec<u32>> {
        let mut host = vec![0i32; b];
        self.be
            .gpu
            .stream()
            .memcpy_dtoh(&self.chosen.slice(0..b), host.as_mut_slice())
            .map_err(|e| anyhow!("downloading the chosen tokens: {e:?}"))?;
        self.be.gpu.sync()?;
        Ok(host.iter().map(|&v| v.max(0) as u32).collect())
    }

    /// Host logits [b, V] of each row's last position after a prefill.
    pub(crate) fn prefill_last_logits(&mut self) -> Result<Vec<f32>> {
        let lm_head = self.model.lm_head;
        self.be
            .last_logits(&self.acts.final_out, &lm_head, &self.batch, true)?
            .ok_or_else(|| anyhow!("the head's logits were not downloaded"))
    }

    /// One decode step of `ids` (one token per row of `caches`, whose rows are left-padded to
    /// `start`): the logits [b, V] on the host, or (`greedy`) only each row's most likely token,
    /// chosen on the device (the first on ties, as on the host).
    pub(crate) fn step(
        &mut self,
        ids: &[u32],
        start: &[usize],
        caches: &mut [GpuLayerState<T>],
        greedy: bool,
    ) -> Result<StepOut> {
        let b = ids.len();
        self.check_batch(b)?;
        self.forward(Padded { ids, b, t: 1, start: Some(start) }, None, Some(caches), true)?;
        let lm_head = self.model.lm_head;
        if !greedy {
            let l = self.be.last_logits(&self.step.final_out, &lm_head, &self.batch, true)?;
            return Ok(StepOut::Logits(l.ok_or_else(|| anyhow!("the head's logits were not downloaded"))?));
        }
        let len = caches.first().map_or(0, |c| c.len());
        Ok(StepOut::Chosen(self.greedy_on_device(true, len)?))
    }

    /// Whether a decode step of this model can replay as a CUDA graph (a serving step, or the
    /// reference decode loop's): bf16 with the fast attention kernels (head dim 64 or 128) and no
    /// ACP (its thresholds depend on the cached length, which a graph would freeze).
    /// Every family: a recurrent layer's scratch may be reallocated larger by a prefill in
    /// between, so the batcher drops its graph when that happens (`SsmScratch::lens`).
    pub(crate) fn step_graphs_possible(&self) -> bool {
        let hd = self.model.config.head_dim();
        self.graphs && T::NAME == "bf16" && (hd == 64 || hd == 128) && self.model.config.log_pruning_tolerance.is_none()
    }

    /// [`GpuInfer::step`] (greedy) as a CUDA graph replay: the first call captures the step
    /// (forward, head, argmax) into `graph`; later calls upload the step's ids, left padding and
    /// positions into the same buffers, set the device-side length, and replay it. Between steps
    /// the device-side length is parked in `parked` so that the other work (prefills, sampled
    /// steps) runs on host-side lengths. The caller drops `graph` when the caches (or anything
    /// else it points to) are reallocated.
    pub(crate) fn step_graph(
        &mut self,
        ids: &[u32],
        start: &[usize],
        caches: &mut [GpuLayerState<T>],
        graph: &mut Option<CudaGraph>,
        parked: &mut Option<CudaSlice<i32>>,
    ) -> Result<Vec<u32>> {
        let b = ids.len();
        self.check_batch(b)?;
        let len = caches.first().map_or(0, |c| c.len());
        let lm_head = self.model.lm_head;
        let info = BatchInfo { batch: b, seq: 1, start: Some(start), past: len };
        self.be.prepare(&mut self.batch, &info, ids, None)?;
        let s = DeviceSampling::GREEDY;
        let run = (|| -> Result<()> {
            if graph.is_none() {
                *graph = Some(self.capture(len, "serving step", |e| {
                    e.step_forward(&mut *caches, true)?;
                    e.be.last_logits(&e.step.final_out, &lm_head, &e.batch, false)?;
                    e.be.sample(&mut e.chosen, None, b, &s, len + 1)
                })?);
            } else {
                let mut p = parked.take().ok_or_else(|| anyhow!("a serving graph without its device-side length"))?;
                self.be.gpu.write(&mut p, &[i32::try_from(len).map_err(|_| anyhow!("cache length {len}"))?])?;
                self.be.decode_pos = Some(p);
            }
            let g = graph.as_ref().ok_or_else(|| anyhow!("no serving graph"))?;
            g.launch().map_err(|e| anyhow!("replaying the serving step: {e:?}"))
        })();
        // Park the device-side length whatever happened (host-side lengths from here on).
        *parked = self.be.decode_pos.take();
        for c in caches.iter_mut() {
            c.reset_len(len + 1);
        }
        if let Err(e) = run {
            *graph = None;
            return Err(e);
        }
        self.chosen_to_host(b)
    }

    /// Decodes after a prefill: chooses a token per row on the device, feeds it back, `max_new`
    /// times or until every row has produced `eos`. This is the kernel-level reference loop behind
    /// `bench decode` (and the GPU checks of the device sampler and decode graphs): the batch
    /// stays fixed, nothing joins or leaves, so it measures what the serving scheduler (which
    /// `generate` and `serve` drive) is measured against; it is the only generation loop besides
    /// that scheduler. With the bf16 kernels, from the third token on
    /// a whole step (forward, head, sampling, position update) is one CUDA graph replay.
    fn decode(
        &mut self,
        b: usize,
        start: Option<&[usize]>,
        caches: &mut [GpuLayerState<T>],
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(usize, u32),
    ) -> Result<Vec<Vec<u32>>> {
        let s = DeviceSampling {
            temperature: opts.sampling.temperature,
            top_k: opts.sampling.top_k,
            top_p: opts.sampling.top_p,
            seed: opts.seed,
        };
        let lm_head = self.model.lm_head;
        let mut graphs = self.step_graphs_possible();
        let mut graph: Option<CudaGraph> = None;
        self.graph_steps = 0;
        let mut len = caches.first().map_or(0, |c| c.len());
        let mut out = vec![Vec::new(); b];
        let mut done = vec![false; b];
        let mut next: Vec<u32> = Vec::new();
        let result = (|| -> Result<()> {
            for step in 0..opts.max_new_tokens {
                if step == 0 {
                    // The prefill's last positions.
                    self.be.last_logits(&self.acts.final_out, &lm_head, &self.batch, false)?;
                    self.be.sample(&mut self.chosen, None, b, &s, len)?;
                } else if let Some(g) = &graph {
                    g.launch().map_err(|e| anyhow!("replaying the decode step: {e:?}"))?;
                    len += 1;
                    self.graph_steps += 1;
                } else {
                    let mut stepped = false;
                    if graphs && step >= 2 {
                        // Capture one step (its kernels are compiled and its buffers exist by now).
                        match self.capture_step(b, start, len, &next, caches, &s) {
                            Ok(g) => {
                                g.launch().map_err(|e| anyhow!("replaying the decode step: {e:?}"))?;
                                graph = Some(g);
                                len += 1;
                                self.graph_steps += 1;
                                stepped = true;
                            }
                            Err(e) => {
                                // Nothing ran: go on launching each operation from the host.
                                eprintln!("warning: decoding without CUDA graphs: {e:#}");
                                graphs = false;
                                self.be.end_device_positions()?;
                                for c in caches.iter_mut() {
                                    c.reset_len(len);
                                }
                            }
                        }
                    }
                    if !stepped {
                        self.forward(Padded { ids: &next, b, t: 1, start }, None, Some(&mut *caches), true)?;
                        len += 1;
                        self.be.last_logits(&self.step.final_out, &lm_head, &self.batch, false)?;
                        self.be.sample(&mut self.chosen, None, b, &s, len)?;
                    }
                }
                next = self.chosen_to_host(b)?;
                for r in 0..b {
                    if done[r] {
                        continue;
                    }
                    if Some(next[r]) == opts.eos {
                        done[r] = true;
                        continue;
                    }
                    out[r].push(next[r]);
                    on_token(r, next[r]);
                }
                if done.iter().all(|&x| x) {
                    break;
                }
            }
            Ok(())
        })();
        // Host-side lengths again (a replayed graph advanced only the device's).
        let device_len = self.be.end_device_positions();
        drop(graph);
        for c in caches.iter_mut() {
            c.reset_len(len);
        }
        result?;
        device_len?;
        Ok(out)
    }

    /// Captures one decode step of the tokens `next` at cached length `len` as a CUDA graph
    /// (forward, head, position update, sampling), leaving the cache kernels reading the length
    /// from the device. Nothing runs until the graph is launched.
    fn capture_step(
        &mut self,
        b: usize,
        start: Option<&[usize]>,
        len: usize,
        next: &[u32],
        caches: &mut [GpuLayerState<T>],
        s: &DeviceSampling,
    ) -> Result<CudaGraph> {
        let lm_head = self.model.lm_head;
        let info = BatchInfo { batch: b, seq: 1, start, past: len };
        self.be.prepare(&mut self.batch, &info, next, None)?;
        self.capture(len, "decode step", |e| {
            e.step_forward(&mut *caches, true)?;
            e.be.last_logits(&e.step.final_out, &lm_head, &e.batch, false)?;
            // Advance first: the sampler's random stream is keyed by the new length.
            e.be.advance_positions(&mut e.batch)?;
            e.be.sample(&mut e.chosen, Some(&mut e.batch), b, s, len + 1)
        })
    }

    /// `body` (a step at cached length `len`) captured as a CUDA graph, the cache kernels reading
    /// the length from the device; `what` names the step in errors.
    fn capture(&mut self, len: usize, what: &str, body: impl FnOnce(&mut Self) -> Result<()>) -> Result<CudaGraph> {
        self.be.begin_device_positions(len)?;
        let stream = self.be.gpu.stream().clone();
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| anyhow!("starting a CUDA graph capture: {e:?}"))?;
        let captured = body(self);
        let g = stream.end_capture(CUgraphInstantiate_flags(0));
        captured?;
        g.map_err(|e| anyhow!("instantiating the {what}'s CUDA graph: {e:?}"))?
            .ok_or_else(|| anyhow!("the {what}'s CUDA graph is empty"))
    }

    /// [`GpuInfer::reference_generate`] timed for `foxlm bench decode`: the prefill and the decode separately
    /// (wall clock, the GPU synchronised at both ends), with a per-family profile of the decode
    /// when `profile` (events around every operation, so no CUDA graphs then).
    pub fn timed_generate(&mut self, prompts: &[Vec<u32>], opts: &GenerateOptions, profile: bool) -> Result<Timed> {
        let b = prompts.len();
        self.check_batch(b)?;
        let t = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
        ensure!(t >= 1 && prompts.iter().all(|p| p.len() == t), "timed prompts must be non-empty and equally long");
        let ids: Vec<u32> = prompts.iter().flatten().copied().collect();
        let mut caches = self.caches(b, t + opts.max_new_tokens)?;
        self.be.gpu.sync()?;
        let t0 = std::time::Instant::now();
        self.prefill(Padded { ids: &ids, b, t, start: None }, &mut caches, &mut |_, _, _| Ok(()))?;
        self.be.gpu.sync()?;
        let prefill_s = t0.elapsed().as_secs_f64();
        let graphs = self.graphs;
        if profile {
            self.graphs = false;
            self.be.start_profile();
        }
        let t1 = std::time::Instant::now();
        let r = self.decode(b, None, &mut caches, opts, &mut |_, _| {});
        let decode_s = t1.elapsed().as_secs_f64();
        self.graphs = graphs;
        let families = if profile { self.be.take_profile()? } else { Vec::new() };
        let out = r?;
        Ok(Timed { prefill_s, decode_s, steps: out.iter().map(|o| o.len()).max().unwrap_or(0), families })
    }

    /// One scoring pass over equally long `prompts` as the server runs it for `max_tokens: 0`
    /// requests ([`GpuInfer::forward_uncached`], then every position's log-probability of the
    /// next token on the device), timed for `foxlm bench decode --score`: the forward and the
    /// head separately (wall clock, the GPU synchronised at each end), with a per-family profile
    /// of the forward when `profile`.
    pub fn timed_score(&mut self, prompts: &[Vec<u32>], profile: bool) -> Result<TimedScore> {
        let b = prompts.len();
        let t = prompts.first().map_or(0, |p| p.len());
        ensure!(b >= 1 && t >= 2 && prompts.iter().all(|p| p.len() == t), "scored prompts must be equally long");
        let ids: Vec<u32> = prompts.iter().flatten().copied().collect();
        let targets: Vec<u32> =
            prompts.iter().flat_map(|p| p[1..].iter().copied().chain(std::iter::once(u32::MAX))).collect();
        self.be.gpu.sync()?;
        if profile {
            self.be.start_profile();
        }
        let t0 = std::time::Instant::now();
        self.forward_uncached(Padded { ids: &ids, b, t, start: None })?;
        self.be.gpu.sync()?;
        let forward_s = t0.elapsed().as_secs_f64();
        let families = if profile { self.be.take_profile()? } else { Vec::new() };
        let t1 = std::time::Instant::now();
        let (lp, _, _) = self.chunk_token_logprobs(0, &targets, 1)?;
        let head_s = t1.elapsed().as_secs_f64();
        ensure!(lp.len() == b * t, "{} log-probabilities for {} positions", lp.len(), b * t);
        Ok(TimedScore { forward_s, head_s, families })
    }

    /// `job` on the serving scheduler's GPU batcher ([`crate::serve::gpu::GpuBatcher`]), with a
    /// slot per prompt holding its prompt and new tokens.
    fn through_scheduler(&mut self, job: PromptJob) -> Result<Vec<Vec<u32>>> {
        let (prompts, opts) = (job.prompts, job.opts);
        let b = prompts.len();
        if b == 0 {
            return Ok(vec![]);
        }
        self.check_batch(b)?;
        let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(1).max(1);
        let cap = longest.saturating_add(opts.max_new_tokens).saturating_add(1);
        let stats = crate::serve::scheduler::SchedulerStats::default();
        let mut batcher = crate::serve::gpu::GpuBatcher::with_cap(self, b, cap, &stats)?;
        run_prompts(&mut batcher, job)
    }

    /// Continuations of equally planned prompts through the kernel-level reference loop
    /// ([`GpuInfer::decode`]): one left-padded batch prefilled in the planned chunks, decoded
    /// with the device sampler, and (bf16) CUDA graphs from the third token on.
    pub fn reference_generate(
        &mut self,
        prompts: &[Vec<u32>],
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(usize, u32),
    ) -> Result<Vec<Vec<u32>>> {
        let b = prompts.len();
        if b == 0 {
            return Ok(vec![]);
        }
        self.check_batch(b)?;
        let (ids, t, start) = crate::generate::left_pad(prompts);
        let mut caches = self.caches(b, t + opts.max_new_tokens)?;
        let x = Padded { ids: &ids, b, t, start: start.as_deref() };
        self.prefill(x, &mut caches, &mut |_, _, _| Ok(()))?;
        self.decode(b, start.as_deref(), &mut caches, opts, on_token)
    }
}

impl<T: Elem> Infer for GpuInfer<'_, T> {
    fn describe(&self) -> String {
        format!("{} ({})", self.be.gpu.describe(), T::NAME)
    }

    fn logits(&mut self, ids: &[u32], ctx: &Ctx) -> Result<Vec<f32>> {
        let (b, t) = (ctx.batch, ctx.seq);
        self.check_batch(b)?;
        ensure!(ids.len() == b * t, "ids must be [B, T] = [{b}, {t}]");
        let v = self.model.config.vocab_size;
        let lm_head = self.model.lm_head;
        let x = Padded { ids, b, t, start: ctx.start.as_deref() };
        if t <= self.plan.chunk {
            self.forward(x, None, None, false)?;
            return self.be.logits(&self.acts.final_out, &lm_head, b * t);
        }
        // Longer than a chunk: through a cache, chunk by chunk, into [B, T, V].
        let mut caches = self.caches(b, t)?;
        let mut out = vec![0f32; b * t * v];
        self.prefill(x, &mut caches, &mut |e, p0, tc| {
            let l = e.be.logits(&e.acts.final_out, &lm_head, b * tc)?;
            for r in 0..b {
                out[(r * t + p0) * v..(r * t + p0 + tc) * v].copy_from_slice(&l[r * tc * v..(r + 1) * tc * v]);
            }
            Ok(())
        })?;
        Ok(out)
    }

    fn token_losses(
        &mut self,
        seqs: &[Vec<u32>],
        chunk: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<Vec<f64>>> {
        let b = seqs.len();
        if b == 0 {
            return Ok(vec![]);
        }
        self.check_batch(b)?;
        let len = seqs[0].len();
        ensure!(len >= 2, "a sequence needs at least two tokens (one prediction)");
        ensure!(seqs.iter().all(|s| s.len() == len), "sequences of a batch must have equal lengths");
        let n = len - 1;
        let chunk = chunk.clamp(1, self.plan.chunk);
        let mut caches = self.caches(b, n)?;
        let lm_head = self.model.lm_head;
        let mut out = vec![Vec::with_capacity(n); b];
        let mut pos = 0;
        while pos < n {
            let t = chunk.min(n - pos);
            let ids: Vec<u32> = seqs.iter().flat_map(|s| s[pos..pos + t].iter().copied()).collect();
            let targets: Vec<Option<u32>> =
                seqs.iter().flat_map(|s| s[pos + 1..pos + 1 + t].iter().map(|&v| Some(v))).collect();
            self.forward(Padded { ids: &ids, b, t, start: None }, Some(&targets), Some(&mut caches), false)?;
            self.be.head_loss(None, &self.acts.final_out, &lm_head, &self.batch, 1.0)?;
            let losses = self.be.row_losses(b * t)?;
            for (r, row) in out.iter_mut().enumerate() {
                row.extend(losses[r * t..(r + 1) * t].iter().map(|&v| v as f64));
            }
            pos += t;
            progress(t);
        }
        Ok(out)
    }

    fn run_prompts(&mut self, job: PromptJob) -> Result<Vec<Vec<u32>>> {
        // The prefill goes in chunks of `chunk`, at most the planned one (`generate`'s WHOLE: the
        // planned chunks, as the prefill of the reference loop).
        let chunk = job.chunk.clamp(1, self.plan.chunk);
        self.through_scheduler(PromptJob { chunk, ..job })
    }

    fn gate_acts(&mut self, ids: &[u32]) -> Result<CpuActs> {
        let t = ids.len();
        ensure!(t >= 1 && t <= self.plan.chunk, "{t} tokens; the engine was planned for {}", self.plan.chunk);
        let mut acts: Acts<Cuda<T>> = ModelActs::new(&self.be, self.model, 1, t, true)?;
        let info = BatchInfo { batch: 1, seq: t, start: None, past: 0 };
        self.be.prepare(&mut self.batch, &info, ids, None)?;
        self.model.forward_on(&mut self.be, &self.batch, &mut acts, None)?;
        let gpu = self.be.gpu.clone();
        let f32s = |s: &CudaSlice<f32>| -> Result<Vec<f32>> {
            if s.is_empty() {
                Ok(vec![])
            } else {
                gpu.download(s)
            }
        };
        let act =
            |s: &CudaSlice<T>| -> Result<Vec<f32>> { Ok(gpu.download(s)?.into_iter().map(|v| v.to_f32()).collect()) };
        let mut out = CpuActs::default();
        for blk in &acts.blocks {
            // The gates, prefix sums, q and k of attention layers (what gate maps draw).
            let mut a = crate::model::attention::AttnActs::default();
            if let Some(at) = blk.attn() {
                a.fgate_logit = f32s(&at.fgate_logit)?;
                a.c = f32s(&at.c)?;
                a.q = act(&at.q)?;
                a.k = act(&at.k)?;
            }
            out.blocks.push(crate::model::BlockActs::with_mixer(crate::model::MixerActs::Attention(a)));
        }
        Ok(out)
    }
}
