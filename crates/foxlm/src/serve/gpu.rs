//! The serving scheduler's GPU batcher: continuous batching over device caches kept in slots.
//!
//! The batch is `--max-batch` slots of one device cache ([S, cap] positions per attention layer,
//! one state per recurrent layer). Every slot's positions end at a common length L (the
//! attention kernels take one length and per-row left padding), so a sequence of n positions
//! occupies positions L − n .. L of its slot and the positions before are padding. A decode step
//! feeds one token per slot (free slots a dummy token, fully padded) and appends at L.
//!
//! - A finished sequence frees its slot: nothing is copied and the other rows stay where they are.
//! - Newcomers are prefilled together (left-padded, through a cache of their own) a chunk of
//!   `--prefill-chunk` positions per scheduler step, with a decode step of the running slots after
//!   each chunk; when the last chunk is done each is copied into a free slot at L − n .. L: only
//!   the newcomer's positions move. While no slot decodes, a chunk is as long as the planned
//!   forward allows for the group's rows ([`Plan::widest_chunk`]).
//! - Only when L would pass the slots' capacity, or a newcomer is longer than L, are the running
//!   rows moved (to a fresh cache, right-aligned at the longest row): a relocation, rare since the
//!   capacity is planned at 4096 positions or twice the context where memory allows.
//! - Requests with `max_tokens: 0` (scoring: echo + logprobs) take no slot: their prefill gives
//!   their log-probabilities and they are answered without entering the decode loop.
//!
//! Greedy steps without log-probabilities replay one CUDA graph (every family; captured again
//! after a relocation, or after a prefill that reallocated a recurrent layer's scratch), and choose the tokens on the device (the first index on
//! ties, as the host's argmax); otherwise the logits come to the host and the scheduler's sampler
//! (the same as the CPU's, one generator per sequence) chooses.

use super::scheduler::{emit_next, emit_token, take_group, Batcher, Event, Finish, SchedulerOptions, SchedulerStats};
use super::scheduler::{Running, SeqRequest, Step, TokenLogprob};
use crate::backend::cuda::CopyRuns;
use crate::backend::scan_state::{GpuScanState, ScanSizes};
use crate::generate::Padded;
use crate::infer::{GpuInfer, Plan, StepOut, DEFAULT_GPU_ROWS};
use crate::model::cache::GpuLayerState;
use crate::model::cache::LayerState;
use crate::model::Model;
use crate::validate::gib;
use anyhow::{bail, Context, Result};
use fox_kernels::cuda::cudarc::driver::{CudaGraph, CudaSlice};
use fox_kernels::cuda::{Elem, Gpu};
use half::bf16;
use rayon::prelude::*;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The GPU batcher: serving runs it in bf16; `foxlm generate --dtype f32` and the GPU checks in f32.
pub struct GpuBatcher<'a, 'm, T: Elem> {
    model: &'m Model,
    inf: &'a mut GpuInfer<'m, T>,
    caches: Vec<GpuLayerState<T>>,
    /// Positions per slot.
    cap: usize,
    /// The common end of every slot's positions.
    len: usize,
    /// Each slot's filled positions (None: free).
    slots: Vec<Option<usize>>,
    /// The prefill group under way (a chunk per scheduler step).
    prefilling: Option<GpuPrefill<T>>,
    /// Relocations of the running rows (a count for the tests and /stats).
    pub relocations: usize,
    /// Greedy steps replay one CUDA graph (the batch is always the S slots), captured at the
    /// first such step and again after each relocation; `parked` holds its device-side length.
    graphs: bool,
    graph: Option<CudaGraph>,
    parked: Option<CudaSlice<i32>>,
    /// A step has run eagerly since the start (or the last failure), so that every buffer a step
    /// allocates on first use (the attention's split-K scratch) exists before a capture: an
    /// allocation inside the capture would belong to the graph and go with it.
    warm: bool,
    /// Copies between caches, made in one launch per prefill or relocation.
    runs: CopyRuns,
    /// `FOXLM_SERVE_PROFILE=1`: seconds and counts per phase (the device synchronised at each
    /// phase's end), printed when the batcher goes.
    profile: Option<Vec<(&'static str, f64, usize)>>,
}

/// The GPU inference backend serving plans for `slots` sequences of up to `max_model_len`
/// positions (bf16): prefill chunks of at most 16384 rows of a forward in all.
pub fn serving_infer(gpu: Arc<Gpu>, model: &Model, slots: usize, max_model_len: usize) -> Result<GpuInfer<'_, bf16>> {
    let chunk = (DEFAULT_GPU_ROWS / slots.max(1)).clamp(1, max_model_len.max(1));
    GpuInfer::<bf16>::new(gpu, model, Plan { batch: slots, chunk })
        .with_context(|| format!("--max-batch {slots}: the model and its buffers for {slots} × {chunk} positions"))
}

impl<'a, 'm, T: Elem> GpuBatcher<'a, 'm, T> {
    /// Serving: plans the cache for `inf`'s batch of slots: rows of 4096 positions or twice
    /// `max_model_len` where memory allows (at least `max_model_len` + 1), plus room for a prefill's
    /// cache and a relocation. Prints the plan; not enough memory is an error naming the options.
    pub fn new(inf: &'a mut GpuInfer<'m, T>, max_model_len: usize, stats: &SchedulerStats) -> Result<Self> {
        let slots = inf.plan().batch;
        let gpu = inf.be.gpu.clone();
        let model = inf.model();
        let (free, total) = gpu.context().mem_get_info().unwrap_or((0, 0));
        let bytes = |b: usize, p: usize| GpuInfer::<T>::cache_bytes(model, b, p);
        // The slots' cache, a relocation's second copy of it, a full prefill's cache, and a margin.
        let need = |cap: usize| 2 * bytes(slots, cap) + bytes(slots, max_model_len) + (512 << 20);
        let min_cap = max_model_len + 1;
        if need(min_cap) > free {
            bail!(
                "--max-batch {slots} × --max-model-len {max_model_len}: the decode cache needs {:.2} GiB (slots, a \
                 relocation and a prefill), and {} has {:.2} of {:.2} GiB free; lower --max-batch or --max-model-len",
                gib(need(min_cap)),
                gpu.name(),
                gib(free),
                gib(total)
            );
        }
        // Running rows move when L reaches the capacity, so more positions mean rarer moves: at
        // least 4096 (or twice the context) where that takes at most half the free memory.
        let roomy = (2 * max_model_len).max(4096);
        let cap = if need(roomy) <= free / 2 {
            roomy
        } else if need(2 * max_model_len) <= free {
            2 * max_model_len
        } else {
            min_cap
        };
        let b = Self::with_cap(inf, slots, cap, stats)?;
        eprintln!(
            "GPU cache plan on {}: {slots} slots × {cap} positions = {:.2} GiB, + {:.2} GiB for a prefill's \
             cache and a relocation; {:.2} of {:.2} GiB were free after the weights",
            gpu.name(),
            gib(bytes(slots, cap)),
            gib(need(cap) - bytes(slots, cap)),
            gib(free),
            gib(total)
        );
        Ok(b)
    }

    /// `slots` slots of `cap` positions each (`foxlm generate`: the longest prompt plus the new
    /// tokens), without a plan printed.
    pub fn with_cap(inf: &'a mut GpuInfer<'m, T>, slots: usize, cap: usize, stats: &SchedulerStats) -> Result<Self> {
        let model = inf.model();
        let caches = inf.caches(slots, cap).context("allocating the slots' decode cache")?;
        stats.gpu_cache_bytes.store(GpuInfer::<T>::cache_bytes(model, slots, cap), Ordering::Relaxed);
        if let Ok((free, total)) = inf.be.gpu.context().mem_get_info() {
            stats.gpu_mem_used.store(total - free, Ordering::Relaxed);
            stats.gpu_mem_total.store(total, Ordering::Relaxed);
        }
        let graphs = inf.step_graphs_possible() && std::env::var("FOXLM_SERVE_GRAPHS").map_or(true, |v| v != "0");
        inf.graph_steps = 0;
        Ok(Self {
            model,
            inf,
            caches,
            cap,
            len: 0,
            slots: vec![None; slots],
            prefilling: None,
            relocations: 0,
            graphs,
            graph: None,
            parked: None,
            warm: false,
            runs: CopyRuns::default(),
            profile: std::env::var("FOXLM_SERVE_PROFILE").is_ok_and(|v| v == "1").then(Vec::new),
        })
    }

    /// Profiling: charges the time since `*t0` (after a device synchronisation) to `phase`.
    fn mark(&mut self, phase: &'static str, t0: &mut std::time::Instant) {
        let Some(p) = self.profile.as_mut() else { return };
        let _ = self.inf.be.gpu.sync();
        charge(p, phase, t0.elapsed().as_secs_f64());
        *t0 = std::time::Instant::now();
    }

    fn gpu(&self) -> Arc<Gpu> {
        self.inf.be.gpu.clone()
    }

    /// Adds to `runs` the copy of positions `from..from + n` of row `sr` of `src` to `to..to + n`
    /// of row `dr` of `dst` (keys, values and gate sums), with the row's KV-shift and recurrent
    /// states; made at the next `runs.launch`.
    #[allow(clippy::too_many_arguments)]
    fn push_row(
        runs: &mut CopyRuns,
        gpu: &Gpu,
        src: &[GpuLayerState<T>],
        sr: usize,
        from: usize,
        dst: &mut [GpuLayerState<T>],
        dr: usize,
        to: usize,
        n: usize,
    ) -> Result<()> {
        for (a, b) in src.iter().zip(dst.iter_mut()) {
            match (a, b) {
                (LayerState::Attention(x), LayerState::Attention(y)) => {
                    // k, v [B, H_kv, cap, D] and c [B, H, cap]: a run per head.
                    let (h, hkv, d) = (x.heads, x.kv_heads, x.head_dim);
                    let (s, t) = ((sr * hkv * x.cap + from) * d, (dr * hkv * y.cap + to) * d);
                    runs.push(gpu, &x.k, s, x.cap * d, &mut y.k, t, y.cap * d, n * d, hkv)?;
                    runs.push(gpu, &x.v, s, x.cap * d, &mut y.v, t, y.cap * d, n * d, hkv)?;
                    let (s, t) = (sr * h * x.cap + from, dr * h * y.cap + to);
                    runs.push(gpu, &x.c, s, x.cap, &mut y.c, t, y.cap, n, h)?;
                    let w = hkv * d;
                    runs.push_row(gpu, &x.k_shift, sr, &mut y.k_shift, dr, w)?;
                    runs.push_row(gpu, &x.v_shift, sr, &mut y.v_shift, dr, w)?;
                }
                (LayerState::Mamba2(x), LayerState::Mamba2(y)) => push_scan_row(runs, gpu, x, sr, y, dr)?,
                (LayerState::Mamba(x), LayerState::Mamba(y)) => push_scan_row(runs, gpu, x, sr, y, dr)?,
                (LayerState::DeltaNet(x), LayerState::DeltaNet(y)) => push_scan_row(runs, gpu, x, sr, y, dr)?,
                (LayerState::Hgrn2(x), LayerState::Hgrn2(y)) => push_scan_row(runs, gpu, x, sr, y, dr)?,
                _ => bail!("copying a row between caches of different layer kinds"),
            }
        }
        Ok(())
    }

    /// Moves every running row to a fresh cache, right-aligned at `new_len`.
    fn relocate(&mut self, new_len: usize, stats: &SchedulerStats) -> Result<()> {
        let gpu = self.gpu();
        let mut fresh = self.inf.caches(self.slots.len(), self.cap).context("relocating the running rows")?;
        // Copies still pending into the old cache go first.
        self.runs.launch(&gpu)?;
        for (s, n) in self.slots.iter().enumerate() {
            if let Some(n) = *n {
                Self::push_row(&mut self.runs, &gpu, &self.caches, s, self.len - n, &mut fresh, s, new_len - n, n)?;
            }
        }
        self.runs.launch(&gpu)?;
        // The graph points to the old cache.
        self.graph = None;
        self.caches = fresh;
        self.len = new_len;
        self.relocations += 1;
        stats.relocations.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether to prefill the waiting requests now. A prefill of short prompts costs about the
    /// same for one as for several (its launches bound it, not its arithmetic), and every running
    /// stream waits for it, so while streams run newcomers are held back (at most
    /// `opts.admit_delay` from their arrival) until they can fill the free slots or a quarter of
    /// all slots.
    fn admit_now(
        &self,
        opts: &SchedulerOptions,
        running: &[Running],
        waiting: &VecDeque<SeqRequest>,
        free: usize,
    ) -> bool {
        let Some(front) = waiting.front() else { return false };
        if running.is_empty() || opts.admit_delay.is_zero() {
            return true;
        }
        let takers = waiting.iter().filter(|s| s.max_tokens > 0).count();
        takers >= free.min((self.slots.len() / 4).max(1)) || front.arrived.elapsed() >= opts.admit_delay
    }

    fn longest(&self) -> usize {
        self.slots.iter().flatten().copied().max().unwrap_or(0)
    }

    /// Starts prefilling `group` together (left-padded) through a cache of its own; or, for a
    /// scoring-only group that one forward can take while no stream decodes (`whole`), with no
    /// cache at all: nothing continues from it.
    fn start_prefill(&mut self, group: Vec<SeqRequest>, whole: usize) -> Result<()> {
        let prompts: Vec<Vec<u32>> = group.iter().map(|s| s.prompt.clone()).collect();
        let (ids, t, start) = crate::generate::left_pad(&prompts);
        let cached = !(group.iter().all(|s| s.max_tokens == 0) && t <= whole);
        let mut t0 = std::time::Instant::now();
        let pcache = if cached { self.inf.caches(group.len(), t).context("a prefill's cache")? } else { Vec::new() };
        self.mark("prefill: cache", &mut t0);
        let lps = vec![Vec::new(); group.len()];
        self.prefilling = Some(GpuPrefill { group, pcache, cached, prompts, ids, t, start, done: 0, lps });
        Ok(())
    }

    /// Runs the next chunk (at most `chunk` positions per row) of the prefill under way, with the
    /// prompt log-probabilities of its positions for the rows that ask; after the last chunk,
    /// answers the scoring-only sequences, sends each other's first token and places those that go
    /// on into free slots. Returns the chunk's length.
    fn prefill_chunk(&mut self, chunk: usize, running: &mut Vec<Running>, stats: &SchedulerStats) -> Result<usize> {
        let Some(mut p) = self.prefilling.take() else { return Ok(0) };
        // The prefill's attention may size its own decode scratch: keep the slots' (the graph's).
        let scratch = self.inf.be.decode_scratch.take();
        let ssm = self.inf.be.ssm.lens();
        let r = self.prefill_chunk_of(&mut p, chunk);
        if scratch.is_some() {
            self.inf.be.decode_scratch = scratch;
        }
        // A recurrent layer's scratch that the chunk reallocated larger: the graph points to the
        // old one, so the next greedy step captures again.
        if self.inf.be.ssm.lens() != ssm {
            self.graph = None;
        }
        let tc = r?;
        if p.done < p.t {
            self.prefilling = Some(p);
            return Ok(tc);
        }
        self.place_prefilled(p, running, stats)?;
        Ok(tc)
    }

    fn prefill_chunk_of(&mut self, p: &mut GpuPrefill<T>, chunk: usize) -> Result<usize> {
        let v = self.model.config.vocab_size;
        let b = p.group.len();
        let t = p.t;
        let mut t0 = std::time::Instant::now();
        let p0 = p.done;
        if self.profile.is_some() {
            self.inf.be.start_profile();
        }
        let x = Padded { ids: &p.ids, b, t, start: p.start.as_deref() };
        let tc = if p.cached {
            let tc = chunk.min(t - p0);
            self.inf.prefill_chunk(x, &mut p.pcache, p0, tc)?;
            tc
        } else {
            self.inf.forward_uncached(x)?;
            t
        };
        // The host's time to launch the forward (no sync): near the phase's whole time when the
        // launches, not the GPU, bound it.
        if let Some(prof) = self.profile.as_mut() {
            charge(prof, "prefill: forward's launches (host)", t0.elapsed().as_secs_f64());
        }
        self.mark("prefill: forward", &mut t0);
        if self.profile.is_some() {
            // Per kernel family, event to event (the events' own cost included).
            let families = self.inf.be.take_profile()?;
            if let Some(prof) = self.profile.as_mut() {
                for (fam, ms, _) in families {
                    charge(prof, fam.forward_phase(), ms / 1e3);
                }
            }
            t0 = std::time::Instant::now();
        }
        // Prompt log-probabilities of this chunk's positions, on the device, for the rows that ask
        // (one pass over the span of them; other positions' targets are none): only each position's
        // log-probability and top k come back.
        let asking: Vec<usize> = (0..b).filter(|&r| p.group[r].prompt_logprobs.is_some()).collect();
        if let (Some(&first), Some(&last)) = (asking.first(), asking.last()) {
            let k = asking.iter().filter_map(|&r| p.group[r].prompt_logprobs).max().unwrap_or(0).min(v);
            // Position i (of a padded row) is prompt token i − off; its logits predict the next.
            let span = |row: usize| {
                let off = t - p.prompts[row].len();
                (off, p0.max(off), (p0 + tc).min(t - 1))
            };
            let mut targets = vec![u32::MAX; (last + 1 - first) * tc];
            for &row in &asking {
                let (off, lo, hi) = span(row);
                for i in lo..hi {
                    targets[(row - first) * tc + i - p0] = p.prompts[row][i - off + 1];
                }
            }
            let (lp, ids, tops) = self.inf.chunk_token_logprobs(first * tc, &targets, k)?;
            for &row in &asking {
                let (_, lo, hi) = span(row);
                let kk = p.group[row].prompt_logprobs.unwrap_or(0).min(v);
                for i in lo..hi {
                    let n = (row - first) * tc + i - p0;
                    let top = (0..kk).map(|q| (ids[n * k + q], tops[n * k + q])).collect();
                    p.lps[row].push(TokenLogprob { id: targets[n], logprob: lp[n], top });
                }
            }
            self.mark("prefill: scoring (head + log-probs)", &mut t0);
        }
        p.done += tc;
        Ok(tc)
    }

    /// After a prefill's last chunk (its hidden states still in the inference backend's buffers).
    fn place_prefilled(
        &mut self,
        mut p: GpuPrefill<T>,
        running: &mut Vec<Running>,
        stats: &SchedulerStats,
    ) -> Result<()> {
        let v = self.model.config.vocab_size;
        let t = p.t;
        let mut t0 = std::time::Instant::now();
        // Greedy newcomers without log-probabilities take their first token from the device.
        let greedy =
            p.group.iter().all(|r| r.max_tokens == 0 || (r.sampling.temperature <= 0.0 && r.logprobs.is_none()));
        let (last, chosen) = if p.group.iter().all(|r| r.max_tokens == 0) {
            // Scoring only: no first token to choose.
            (Vec::new(), None)
        } else if greedy {
            (Vec::new(), Some(self.inf.prefill_last_chosen()?))
        } else {
            (self.inf.prefill_last_logits()?, None)
        };
        self.mark("prefill: last logits", &mut t0);
        let gpu = self.gpu();
        for (row, req) in std::mem::take(&mut p.group).into_iter().enumerate() {
            let n = req.prompt.len();
            if req.prompt_logprobs.is_some() && req.events.send(Event::Prompt(std::mem::take(&mut p.lps[row]))).is_err()
            {
                stats.cancelled.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if req.max_tokens == 0 {
                let _ = req.events.send(Event::Done(Finish::Length));
                stats.finished.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let mut r = Running::new(req);
            let next = match &chosen {
                Some(c) => emit_token(&mut r, &[], Some(c[row])),
                None => emit_next(&mut r, &last[row * v..(row + 1) * v]),
            };
            match next {
                Step::GoesOn => {}
                Step::Finished => {
                    stats.finished.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Step::Gone => {
                    stats.cancelled.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            let Some(slot) = self.slots.iter().position(|s| s.is_none()) else {
                bail!("no free slot for a prefilled sequence (the admission counted wrong)")
            };
            if self.slots.iter().all(|s| s.is_none()) {
                self.len = n;
            } else if self.len < n {
                let to = n.max(self.longest());
                self.relocate(to, stats)?;
            }
            Self::push_row(&mut self.runs, &gpu, &p.pcache, row, t - n, &mut self.caches, slot, self.len - n, n)?;
            self.slots[slot] = Some(n);
            r.row = slot;
            running.push(r);
        }
        self.runs.launch(&gpu)?;
        self.mark("prefill: first tokens, rows into slots", &mut t0);
        Ok(())
    }

    /// One decode step over every slot.
    fn step(&mut self, running: &mut Vec<Running>, stats: &SchedulerStats) -> Result<()> {
        let v = self.model.config.vocab_size;
        if self.len + 1 > self.cap {
            let to = self.longest();
            self.relocate(to, stats)?;
        }
        let s = self.slots.len();
        let mut ids = vec![0u32; s];
        // Free slots: fully padded (their one position is the step's own).
        let mut start = vec![self.len; s];
        for r in running.iter() {
            ids[r.row] = r.next;
            start[r.row] = self.len - self.slots[r.row].unwrap_or(0);
        }
        for c in self.caches.iter_mut() {
            c.reset_len(self.len);
        }
        let greedy = running.iter().all(|r| r.req.sampling.temperature <= 0.0 && r.req.logprobs.is_none());
        let out = if greedy && self.graphs && self.warm {
            let c = self.inf.step_graph(&ids, &start, &mut self.caches, &mut self.graph, &mut self.parked)?;
            stats.graph_steps.fetch_add(1, Ordering::Relaxed);
            self.inf.graph_steps += 1;
            StepOut::Chosen(c)
        } else {
            let o = self.inf.step(&ids, &start, &mut self.caches, greedy)?;
            self.warm = true;
            o
        };
        self.len += 1;
        for r in running.iter() {
            if let Some(n) = self.slots[r.row].as_mut() {
                *n += 1;
            }
        }
        // Counted before the tokens go out: a client that has its last token finds the step in /stats.
        stats.steps.fetch_add(1, Ordering::Relaxed);
        stats.rows_decoded.fetch_add(running.len(), Ordering::Relaxed);
        let steps: Vec<Step> = match &out {
            StepOut::Logits(l) => {
                running.par_iter_mut().map(|r| emit_next(r, &l[r.row * v..(r.row + 1) * v])).collect()
            }
            StepOut::Chosen(c) => running.iter_mut().map(|r| emit_token(r, &[], Some(c[r.row]))).collect(),
        };
        let count = |k: Step| steps.iter().filter(|&&x| x == k).count();
        stats.finished.fetch_add(count(Step::Finished), Ordering::Relaxed);
        stats.cancelled.fetch_add(count(Step::Gone), Ordering::Relaxed);
        for (r, st) in running.iter().zip(&steps) {
            if *st != Step::GoesOn {
                self.slots[r.row] = None;
            }
        }
        let mut k = steps.iter();
        running.retain(|_| k.next().is_some_and(|&x| x == Step::GoesOn));
        Ok(())
    }
}

/// Adds `secs` and one count to `phase` of a profile.
fn charge(p: &mut Vec<(&'static str, f64, usize)>, phase: &'static str, secs: f64) {
    match p.iter_mut().find(|e| e.0 == phase) {
        Some(e) => {
            e.1 += secs;
            e.2 += 1;
        }
        None => p.push((phase, secs, 1)),
    }
}

impl<T: Elem> Drop for GpuBatcher<'_, '_, T> {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            eprintln!("serving profile (FOXLM_SERVE_PROFILE=1; the device synchronised at each phase's end):");
            for (phase, secs, n) in p {
                eprintln!("  {phase:<40} {n:>8} × {:>9.3} ms = {secs:>8.3} s", 1e3 * secs / (*n).max(1) as f64);
            }
        }
    }
}

/// A prefill group under way on the GPU: its prompts left-padded into one batch [b, t] and
/// prefilled through their own cache, a chunk per scheduler step.
struct GpuPrefill<T: Elem> {
    group: Vec<SeqRequest>,
    /// The prefill's cache (empty when not `cached`: one forward of the whole group, no cache).
    pcache: Vec<GpuLayerState<T>>,
    cached: bool,
    prompts: Vec<Vec<u32>>,
    ids: Vec<u32>,
    t: usize,
    start: Option<Vec<usize>>,
    /// Positions prefilled so far.
    done: usize,
    /// Prompt log-probabilities gathered chunk by chunk, per row.
    lps: Vec<Vec<TokenLogprob>>,
}

impl<T: Elem> Batcher for GpuBatcher<'_, '_, T> {
    fn advance(
        &mut self,
        opts: &SchedulerOptions,
        stats: &SchedulerStats,
        running: &mut Vec<Running>,
        waiting: &mut VecDeque<SeqRequest>,
    ) -> Result<()> {
        // Free the slots of sequences the scheduler dropped (clients gone).
        let held: Vec<usize> = running.iter().map(|r| r.row).collect();
        for (i, s) in self.slots.iter_mut().enumerate() {
            if s.is_some() && !held.contains(&i) {
                *s = None;
            }
        }
        // Start one prefill group when none is under way: sequences in order while slots last
        // (scoring takes none), at most the planned batch, with left padding inside one chunk.
        let plan = self.inf.plan();
        let chunk = opts.prefill_chunk.clamp(1, plan.chunk);
        if self.prefilling.is_none() {
            let free = self.slots.iter().filter(|s| s.is_none()).count();
            if self.admit_now(opts, running, waiting, free) {
                let group = take_group(waiting, free, plan.batch, chunk);
                if !group.is_empty() {
                    stats.prefills.fetch_add(1, Ordering::Relaxed);
                    stats.prefilled.fetch_add(group.len(), Ordering::Relaxed);
                    let whole = if running.is_empty() { plan.widest_chunk(group.len()) } else { 0 };
                    self.start_prefill(group, whole)?;
                }
            }
        }
        if let Some(rows) = self.prefilling.as_ref().map(|p| p.group.len()) {
            // With no stream decoding there is nothing to interleave with: the prefill takes the
            // plan's whole forward (scoring groups of a few long prompts run as one chunk).
            let chunk = if running.is_empty() { plan.widest_chunk(rows).max(chunk) } else { chunk };
            let t0 = std::time::Instant::now();
            let tc = self.prefill_chunk(chunk, running, stats)?;
            stats.prefill_chunks.fetch_add(1, Ordering::Relaxed);
            stats.prefill_positions.fetch_add(tc, Ordering::Relaxed);
            stats.prefill_us.fetch_add(t0.elapsed().as_micros() as usize, Ordering::Relaxed);
            // GPU memory for /metrics, read while the prefill's cache is still counted.
            if let Ok((free, total)) = self.inf.be.gpu.context().mem_get_info() {
                stats.gpu_mem_used.store(total - free, Ordering::Relaxed);
            }
        }
        stats.running.store(running.len(), Ordering::Relaxed);
        stats.waiting.store(waiting.len() + self.pending(), Ordering::Relaxed);
        if running.is_empty() {
            if self.prefilling.is_none() {
                self.len = 0;
            }
            return Ok(());
        }
        let mut t0 = std::time::Instant::now();
        self.step(running, stats)?;
        stats.step_us.fetch_add(t0.elapsed().as_micros() as usize, Ordering::Relaxed);
        self.mark("decode step", &mut t0);
        stats.running.store(running.len(), Ordering::Relaxed);
        Ok(())
    }

    fn pending(&self) -> usize {
        self.prefilling.as_ref().map_or(0, |p| p.group.len())
    }

    fn reset(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = None);
        self.prefilling = None;
        self.len = 0;
        self.graph = None;
        self.parked = None;
        self.warm = false;
        // Whatever the failed step left half-made goes too (made again on first use).
        self.inf.be.decode_scratch = None;
    }
}

/// Adds to `runs` the copy of row `sr` of a recurrent layer's state `x` (its scan state and every
/// convolution's) to row `dr` of `y`.
fn push_scan_row<S: ScanSizes>(
    runs: &mut CopyRuns,
    gpu: &Gpu,
    x: &GpuScanState<S>,
    sr: usize,
    y: &mut GpuScanState<S>,
    dr: usize,
) -> Result<()> {
    runs.push_row(gpu, &x.ssm, sr, &mut y.ssm, dr, x.sizes.ssm_len(1))?;
    for ((a, c), n) in x.conv.iter().zip(&mut y.conv).zip(x.sizes.conv_lens(1)) {
        runs.push_row(gpu, a, sr, c, dr, n)?;
    }
    Ok(())
}
