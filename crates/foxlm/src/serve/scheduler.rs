//! The batching scheduler: one thread owns the model and runs continuous batching. Every decode step
//! is one forward pass over all running sequences; a new sequence is prefilled and joins the
//! running batch before the next step, and a finished or abandoned one leaves it at once.
//!
//! Requests arrive through a bounded queue (a full queue is the HTTP layer's 503). Each sequence
//! streams its events through its own channel; a dropped receiver (client gone, stop string seen)
//! cancels the sequence at the next step.

use crate::generate::Padded;
use crate::model::cache::Cache;
use crate::model::{Ctx, Model};
use crate::sampling::{sample, Sampling};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;

/// The log-probability of one token and, when asked, the most likely alternatives at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// (id, logprob), most likely first.
    pub top: Vec<(u32, f32)>,
}

/// Why a sequence stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// max_tokens reached.
    Length,
    /// The end-of-sequence token.
    Stop,
}

#[derive(Debug)]
pub enum Event {
    /// Log-probabilities of the prompt's tokens 1.. (token 0 has none), sent first when asked.
    Prompt(Vec<TokenLogprob>),
    /// A new token, with its log-probability when asked.
    Token(u32, Option<TokenLogprob>),
    Done(Finish),
}

/// One sequence to generate.
#[derive(Debug)]
pub struct SeqRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub seed: u64,
    /// Stop at this token (not emitted).
    pub eos: Option<u32>,
    /// Send the prompt's log-probabilities with this many alternatives per position.
    pub prompt_logprobs: Option<usize>,
    /// Send each new token's log-probability with this many alternatives.
    pub logprobs: Option<usize>,
    pub events: UnboundedSender<Event>,
    /// When the request reached the server (the GPU batcher's admission waits from here).
    pub arrived: std::time::Instant,
}

/// A group of sequences submitted together (one HTTP request).
pub type Job = Vec<SeqRequest>;

#[derive(Clone, Debug)]
pub struct SchedulerOptions {
    /// Most sequences decoded together.
    pub max_batch: usize,
    /// Most jobs waiting to start.
    pub max_queue: usize,
    /// How long the GPU batcher may hold newcomers back while streams run, to prefill them
    /// together (zero: every step admits what has arrived).
    pub admit_delay: Duration,
    /// Positions per row of one prefill chunk: a prompt longer than this is prefilled a chunk
    /// per scheduler step, with a decode step of the running batch after each chunk, so that
    /// running streams never wait for a whole long prefill.
    pub prefill_chunk: usize,
}

/// `--prefill-chunk`'s default: long enough that a chunk's forward is efficient (on the GPU a
/// 125M chunk of 512 positions costs a few decode steps), short enough that the streams running
/// beside it keep flowing.
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

impl SchedulerOptions {
    /// In-process use (`foxlm generate`, the evaluations): every sequence in one batch of `batch`,
    /// admitted at once.
    pub fn in_process(batch: usize, prefill_chunk: usize) -> Self {
        Self { max_batch: batch.max(1), max_queue: 1, admit_delay: Duration::ZERO, prefill_chunk: prefill_chunk.max(1) }
    }
}

/// Counters the scheduler keeps (served at `GET /stats`): what runs now and what it has done.
#[derive(Debug, Default)]
pub struct SchedulerStats {
    /// Requests in the bounded queue, not yet taken by the scheduler.
    pub queued: AtomicUsize,
    /// Sequences in the running batch.
    pub running: AtomicUsize,
    /// Sequences taken from the queue and waiting for a place in the batch.
    pub waiting: AtomicUsize,
    /// Decode steps (forward passes over the running batch) and the rows they decoded.
    pub steps: AtomicUsize,
    pub rows_decoded: AtomicUsize,
    /// Prefill groups and the sequences they started; the chunks they ran (a forward each) and
    /// the prompt positions (per row, padding included) those chunks covered.
    pub prefills: AtomicUsize,
    pub prefilled: AtomicUsize,
    pub prefill_chunks: AtomicUsize,
    pub prefill_positions: AtomicUsize,
    /// Sequences that ended (finished or cut short by their client).
    pub finished: AtomicUsize,
    pub cancelled: AtomicUsize,
    /// GPU: the slots' decode cache in bytes (0 on the CPU), and how often the running rows were
    /// moved to a fresh cache (see serve/gpu.rs).
    pub gpu_cache_bytes: AtomicUsize,
    pub relocations: AtomicUsize,
    /// GPU: decode steps that replayed the CUDA graph.
    pub graph_steps: AtomicUsize,
    /// GPU: memory in use and in all (bytes), as last read by the scheduler.
    pub gpu_mem_used: AtomicUsize,
    pub gpu_mem_total: AtomicUsize,
    /// Microseconds spent in prefills and in decode steps (the GPU's: with its rows placed into
    /// slots; the CPU's: without the batch cache's regathering).
    pub prefill_us: AtomicUsize,
    pub step_us: AtomicUsize,
}

impl SchedulerStats {
    pub fn to_json(&self) -> serde_json::Value {
        let g = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        serde_json::json!({
            "queued": g(&self.queued), "running": g(&self.running), "waiting": g(&self.waiting), "steps": g(&self.steps),
            "rows_decoded": g(&self.rows_decoded), "prefills": g(&self.prefills), "prefilled": g(&self.prefilled),
            "prefill_chunks": g(&self.prefill_chunks), "prefill_positions": g(&self.prefill_positions),
            "finished": g(&self.finished), "cancelled": g(&self.cancelled),
            "gpu_cache_bytes": g(&self.gpu_cache_bytes), "relocations": g(&self.relocations),
            "graph_steps": g(&self.graph_steps), "prefill_us": g(&self.prefill_us), "step_us": g(&self.step_us),
        })
    }
}

/// The submitting side of the scheduler. Cloned by every handler.
#[derive(Clone)]
pub struct SchedulerHandle {
    tx: SyncSender<Job>,
    pub stats: Arc<SchedulerStats>,
}

pub enum SubmitError {
    QueueFull,
    Stopped,
}

impl SchedulerHandle {
    pub fn submit(&self, job: Job) -> Result<(), SubmitError> {
        // Counted before sending so the scheduler's decrement can never come first.
        self.stats.queued.fetch_add(1, Ordering::Relaxed);
        self.tx.try_send(job).map_err(|e| {
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
            match e {
                TrySendError::Full(_) => SubmitError::QueueFull,
                TrySendError::Disconnected(_) => SubmitError::Stopped,
            }
        })
    }
}

/// What runs the model for the scheduler: it admits waiting sequences into its batch (prefilling
/// them) and runs one decode step over the batch, sending each sequence's events. The CPU's
/// ([`CpuBatcher`]) keeps a host cache that it rebuilds row by row; the GPU's
/// ([`super::gpu::GpuBatcher`]) keeps device caches in slots.
pub trait Batcher {
    /// Admits what fits from `waiting` (sequences with `max_tokens: 0` are scored and answered at
    /// once) and runs one decode step over `running`, removing the sequences that end.
    fn advance(
        &mut self,
        opts: &SchedulerOptions,
        stats: &SchedulerStats,
        running: &mut Vec<Running>,
        waiting: &mut std::collections::VecDeque<SeqRequest>,
    ) -> anyhow::Result<()>;
    /// Sequences taken from `waiting` whose prefill is still under way (a chunk per `advance`).
    fn pending(&self) -> usize;
    /// Forgets the batch and any prefill under way after a failed step (its sequences are gone).
    fn reset(&mut self);
}

/// Takes the next prefill group off the front of `waiting`: sequences in order while `free` batch
/// places last (scoring-only sequences, `max_tokens: 0`, take none), at most `most`, and, when a
/// prompt is longer than one `chunk`, lengths within a chunk of each other (left padding must end
/// inside the first chunk, since later chunks continue real positions).
pub fn take_group(
    waiting: &mut std::collections::VecDeque<SeqRequest>,
    mut free: usize,
    most: usize,
    chunk: usize,
) -> Vec<SeqRequest> {
    let mut group = Vec::new();
    let (mut lo, mut hi) = (usize::MAX, 0);
    while let Some(front) = waiting.front() {
        let p = front.prompt.len().max(1);
        let takes = front.max_tokens > 0;
        let (nlo, nhi) = (lo.min(p), hi.max(p));
        if (takes && free == 0) || group.len() == most || (nhi > chunk && nhi - nlo >= chunk) {
            break;
        }
        (lo, hi) = (nlo, nhi);
        free -= takes as usize;
        group.extend(waiting.pop_front());
    }
    group
}

impl SeqRequest {
    /// A sequence submitted in-process, with the receiver of its events (no log-probabilities).
    pub fn new(
        prompt: Vec<u32>,
        max_tokens: usize,
        sampling: Sampling,
        seed: u64,
        eos: Option<u32>,
    ) -> (Self, tokio::sync::mpsc::UnboundedReceiver<Event>) {
        let (events, rx) = tokio::sync::mpsc::unbounded_channel();
        let req = Self {
            prompt,
            max_tokens,
            sampling,
            seed,
            eos,
            prompt_logprobs: None,
            logprobs: None,
            events,
            arrived: std::time::Instant::now(),
        };
        (req, rx)
    }
}

/// Runs `seqs` to their end on `batcher` in the calling thread: the scheduler `serve` runs, without
/// its queue or HTTP (what `foxlm generate` and the evaluations use). After each scheduler step,
/// `on_event(i, event)` sees the events of sequence i that the step made, in order, and
/// `progress(n)` the n prompt positions prefilled in it.
pub fn drive(
    batcher: &mut dyn Batcher,
    opts: &SchedulerOptions,
    stats: &SchedulerStats,
    seqs: Vec<(SeqRequest, tokio::sync::mpsc::UnboundedReceiver<Event>)>,
    on_event: &mut dyn FnMut(usize, Event),
    progress: &mut dyn FnMut(usize),
) -> anyhow::Result<()> {
    let (reqs, mut rxs): (std::collections::VecDeque<SeqRequest>, Vec<_>) = seqs.into_iter().unzip();
    let mut waiting = reqs;
    let mut running: Vec<Running> = Vec::new();
    let mut prefilled = stats.prefill_positions.load(Ordering::Relaxed);
    let res = (|| {
        while !(running.is_empty() && waiting.is_empty() && batcher.pending() == 0) {
            batcher.advance(opts, stats, &mut running, &mut waiting)?;
            let now = stats.prefill_positions.load(Ordering::Relaxed);
            if now > prefilled {
                progress(now - prefilled);
                prefilled = now;
            }
            for (i, rx) in rxs.iter_mut().enumerate() {
                while let Ok(ev) = rx.try_recv() {
                    on_event(i, ev);
                }
            }
        }
        anyhow::Ok(())
    })();
    if res.is_err() {
        batcher.reset();
    }
    res
}

/// The scheduler thread's start: [`Launch::run`] with the batcher built on that thread (a GPU's
/// state belongs to it), or [`Launch::fail`] with why it could not be built.
pub struct Launch {
    ready: std::sync::mpsc::Sender<anyhow::Result<()>>,
    opts: SchedulerOptions,
    rx: Receiver<Job>,
    stats: Arc<SchedulerStats>,
}

impl Launch {
    /// Serves with `b` until every handle is dropped and the work is done.
    pub fn run(self, b: &mut dyn Batcher) {
        let _ = self.ready.send(Ok(()));
        run(b, &self.opts, self.rx, &self.stats)
    }
    pub fn fail(self, e: anyhow::Error) {
        let _ = self.ready.send(Err(e));
    }
    pub fn stats(&self) -> &Arc<SchedulerStats> {
        &self.stats
    }
}

/// Starts the scheduler thread, which calls `body` (that builds the batcher and runs it through
/// [`Launch`]); returns once the batcher is built, or its error, before anything is served.
pub fn start(
    body: impl FnOnce(Launch) + Send + 'static,
    opts: SchedulerOptions,
) -> anyhow::Result<(SchedulerHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::sync_channel(opts.max_queue.max(1));
    let stats = Arc::new(SchedulerStats::default());
    let (ready, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<()>>();
    let launch = Launch { ready, opts, rx, stats: stats.clone() };
    let th = std::thread::Builder::new().name("foxlm-engine".into()).spawn(move || body(launch))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok((SchedulerHandle { tx, stats }, th)),
        Ok(Err(e)) => {
            let _ = th.join();
            Err(e)
        }
        Err(_) => {
            let _ = th.join();
            anyhow::bail!("the engine thread failed while starting")
        }
    }
}

/// The CPU's batcher: the f32 model with a host cache rebuilt (`Cache::gather_rows`) when
/// sequences join or leave, and at most one prefill group under way, a chunk per step.
pub struct CpuBatcher<'m> {
    pub model: &'m Model,
    cache: Option<Cache>,
    prefilling: Option<CpuPrefill>,
}

impl<'m> CpuBatcher<'m> {
    pub fn new(model: &'m Model) -> Self {
        Self { model, cache: None, prefilling: None }
    }
}

impl Batcher for CpuBatcher<'_> {
    fn advance(
        &mut self,
        opts: &SchedulerOptions,
        stats: &SchedulerStats,
        running: &mut Vec<Running>,
        waiting: &mut std::collections::VecDeque<SeqRequest>,
    ) -> anyhow::Result<()> {
        advance(self.model, opts, stats, running, &mut self.cache, &mut self.prefilling, waiting);
        Ok(())
    }
    fn pending(&self) -> usize {
        self.prefilling.as_ref().map_or(0, |p| p.batch.len())
    }
    fn reset(&mut self) {
        self.cache = None;
        self.prefilling = None;
    }
}

/// A running sequence: its row in the batch cache and the token it feeds next.
pub struct Running {
    /// Its row in the batch cache. Rows of finished sequences stay in the cache until the next
    /// rebuild, so that a step that both loses and gains sequences rebuilds the cache once.
    pub row: usize,
    pub req: SeqRequest,
    pub rng: ChaCha8Rng,
    pub generated: usize,
    pub next: u32,
}

impl Running {
    pub fn new(req: SeqRequest) -> Self {
        Self { row: 0, rng: ChaCha8Rng::seed_from_u64(req.seed), req, generated: 0, next: 0 }
    }
}

/// log-softmax of one row of logits: the log-probability of `id` and the `k` most likely tokens.
pub fn token_logprob(logits: &[f32], id: u32, k: usize) -> TokenLogprob {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let lse = m + logits.iter().map(|&x| ((x - m) as f64).exp()).sum::<f64>().ln() as f32;
    let lp = |i: usize| logits[i] - lse;
    let mut top = Vec::new();
    if k > 0 {
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        let k = k.min(idx.len());
        // Highest logits first, lower id first on ties (the same order as argmax).
        let cmp = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
        idx.select_nth_unstable_by(k - 1, cmp);
        idx.truncate(k);
        idx.sort_by(cmp);
        top = idx.into_iter().map(|i| (i as u32, lp(i))).collect();
    }
    TokenLogprob { id, logprob: lp(id as usize), top }
}

fn run(batcher: &mut dyn Batcher, opts: &SchedulerOptions, rx: Receiver<Job>, stats: &SchedulerStats) {
    let mut running: Vec<Running> = Vec::new();
    let mut waiting: std::collections::VecDeque<SeqRequest> = Default::default();
    let mut closed = false;
    loop {
        // Admit: block only when there is nothing to do.
        if running.is_empty() && waiting.is_empty() && batcher.pending() == 0 {
            if closed {
                return;
            }
            match rx.recv() {
                Ok(job) => {
                    stats.queued.fetch_sub(1, Ordering::Relaxed);
                    waiting.extend(job)
                }
                Err(_) => return,
            }
        }
        // Take jobs off the queue only while there is room in the batch, so that the bounded
        // queue is what holds the others (and a full queue answers 503).
        while running.len() + waiting.len() + batcher.pending() < opts.max_batch {
            match rx.recv_timeout(Duration::ZERO) {
                Ok(job) => {
                    stats.queued.fetch_sub(1, Ordering::Relaxed);
                    waiting.extend(job)
                }
                Err(RecvTimeoutError::Timeout) => break,
                Err(RecvTimeoutError::Disconnected) => {
                    closed = true;
                    break;
                }
            }
        }
        let queued = waiting.len();
        waiting.retain(|s| !s.events.is_closed());
        stats.cancelled.fetch_add(queued - waiting.len(), Ordering::Relaxed);
        // Drop sequences whose client is gone.
        let keep: Vec<bool> = running.iter().map(|r| !r.req.events.is_closed()).collect();
        if keep.iter().any(|k| !k) {
            stats.cancelled.fetch_add(keep.iter().filter(|k| !**k).count(), Ordering::Relaxed);
            let mut k = keep.iter();
            running.retain(|_| k.next().copied().unwrap_or(false));
        }

        // A panic in a step (a bug: every input is checked before it gets here) or an error (the
        // GPU out of memory, say) costs the sequences of that step, not the server.
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            batcher.advance(opts, stats, &mut running, &mut waiting)
        }));
        let failed = match res {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(format!("{e:#}")),
            Err(_) => Some("a panic".to_string()),
        };
        if let Some(why) = failed {
            let lost = running.len() + batcher.pending();
            eprintln!("error: the engine failed in a step ({why}); its {lost} sequences were dropped");
            stats.cancelled.fetch_add(lost, Ordering::Relaxed);
            running.clear();
            batcher.reset();
            stats.running.store(0, Ordering::Relaxed);
        }
    }
}

/// Runs one chunk of the prefill under way (starting one from `waiting` if there is none and
/// the batch has room), lets the sequences of a finished prefill join, and runs one decode step.
fn advance(
    model: &Model,
    opts: &SchedulerOptions,
    stats: &SchedulerStats,
    running: &mut Vec<Running>,
    cache: &mut Option<Cache>,
    prefilling: &mut Option<CpuPrefill>,
    waiting: &mut std::collections::VecDeque<SeqRequest>,
) {
    let chunk = opts.prefill_chunk.max(1);
    if prefilling.is_none() {
        let room = opts.max_batch.saturating_sub(running.len());
        let group = take_group(waiting, room, opts.max_batch, chunk);
        if !group.is_empty() {
            stats.prefills.fetch_add(1, Ordering::Relaxed);
            stats.prefilled.fetch_add(group.len(), Ordering::Relaxed);
            *prefilling = Some(CpuPrefill::new(model, group));
        }
    }
    let mut new_cache = None;
    let mut joined = Vec::new();
    if let Some(p) = prefilling.as_mut() {
        let t0 = std::time::Instant::now();
        let tc = p.chunk(model, chunk);
        stats.prefill_chunks.fetch_add(1, Ordering::Relaxed);
        stats.prefill_positions.fetch_add(tc, Ordering::Relaxed);
        if p.done == p.t {
            let n_new = p.batch.len();
            if let Some(p) = prefilling.take() {
                (new_cache, joined) = p.finish(model);
            }
            stats.finished.fetch_add(n_new - joined.len(), Ordering::Relaxed);
        }
        stats.prefill_us.fetch_add(t0.elapsed().as_micros() as usize, Ordering::Relaxed);
    }
    // Rebuild the batch cache when sequences joined or left since the last step.
    let rows_in_cache = cache.as_ref().and_then(|c| c.layers.first()).map_or(0, |l| l.batch());
    let in_place = rows_in_cache == running.len() && running.iter().enumerate().all(|(i, r)| r.row == i);
    if !joined.is_empty() || !in_place {
        let merged = {
            let mut rows: Vec<(&Cache, usize)> = Vec::new();
            if let Some(c) = cache.as_ref() {
                rows.extend(running.iter().map(|r| (c, r.row)));
            }
            if let Some(nc) = new_cache.as_ref() {
                rows.extend(joined.iter().map(|(row, _)| (nc, *row)));
            }
            (!rows.is_empty()).then(|| Cache::gather_rows(&rows, 64))
        };
        *cache = merged;
        running.extend(joined.into_iter().map(|(_, r)| r));
        for (i, r) in running.iter_mut().enumerate() {
            r.row = i;
        }
    }
    stats.running.store(running.len(), Ordering::Relaxed);
    stats.waiting.store(waiting.len() + prefilling.as_ref().map_or(0, |p| p.batch.len()), Ordering::Relaxed);
    if running.is_empty() {
        *cache = None;
        return;
    }

    // One decode step for every running sequence.
    let Some(c) = cache.as_mut() else { return };
    let t0 = std::time::Instant::now();
    let b = running.len();
    let ids: Vec<u32> = running.iter().map(|r| r.next).collect();
    let ctx = Ctx { batch: b, seq: 1, start: c.start.clone() };
    let (hidden, _) = model.forward_hidden(&ids, &ctx, Some(c), false);
    let logits = model.logits(&hidden);
    // Counted before the tokens go out: a client that has its last token finds the step in /stats.
    stats.steps.fetch_add(1, Ordering::Relaxed);
    stats.rows_decoded.fetch_add(b, Ordering::Relaxed);
    // Sampling (a pass over the vocabulary per row) in parallel: each row has its own generator.
    let steps: Vec<Step> =
        running.par_iter_mut().zip(logits.par_chunks(model.config.vocab_size)).map(|(r, l)| emit_next(r, l)).collect();
    let keep: Vec<bool> = steps.iter().map(|&s| s == Step::GoesOn).collect();
    stats.step_us.fetch_add(t0.elapsed().as_micros() as usize, Ordering::Relaxed);
    let count = |k: Step| steps.iter().filter(|&&s| s == k).count();
    stats.finished.fetch_add(count(Step::Finished), Ordering::Relaxed);
    stats.cancelled.fetch_add(count(Step::Gone), Ordering::Relaxed);
    let mut k = keep.iter();
    running.retain(|_| k.next().copied().unwrap_or(false));
    stats.running.store(running.len(), Ordering::Relaxed);
}

/// What became of a sequence after a step.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Step {
    GoesOn,
    Finished,
    /// Its client is gone.
    Gone,
}

/// The index of the largest logit, the first on ties: `sampling::argmax`, in two passes that the
/// compiler vectorises (a greedy step over 50257 logits per row otherwise shows in profiles).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut m = [f32::NEG_INFINITY; 8];
    let chunks = logits.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..8 {
            m[l] = if c[l] > m[l] { c[l] } else { m[l] };
        }
    }
    let best = tail.iter().chain(&m).fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a });
    logits.iter().position(|&x| x == best).map_or_else(|| crate::sampling::argmax(logits), |i| i as u32)
}

/// Samples the next token of `r` from `logits` and sends it.
pub fn emit_next(r: &mut Running, logits: &[f32]) -> Step {
    emit_token(r, logits, None)
}

/// [`emit_next`] with the token chosen already (on the GPU) when `chosen`; `logits` are then only
/// read for log-probabilities when the sequence asks for them.
pub fn emit_token(r: &mut Running, logits: &[f32], chosen: Option<u32>) -> Step {
    let tok = match chosen {
        Some(t) => t,
        None if r.req.sampling.temperature <= 0.0 => argmax(logits),
        None => sample(logits, &r.req.sampling, &mut r.rng),
    };
    if Some(tok) == r.req.eos {
        let _ = r.req.events.send(Event::Done(Finish::Stop));
        return Step::Finished;
    }
    let lp = r.req.logprobs.map(|k| token_logprob(logits, tok, k));
    if r.req.events.send(Event::Token(tok, lp)).is_err() {
        return Step::Gone;
    }
    r.generated += 1;
    r.next = tok;
    if r.generated >= r.req.max_tokens {
        let _ = r.req.events.send(Event::Done(Finish::Length));
        return Step::Finished;
    }
    Step::GoesOn
}

/// A prefill group under way on the CPU: its prompts left-padded into one batch [b, t], prefilled
/// through its own cache a chunk at a time.
struct CpuPrefill {
    batch: Vec<SeqRequest>,
    cache: Cache,
    ids: Vec<u32>,
    t: usize,
    start: Option<Vec<usize>>,
    /// Positions prefilled so far.
    done: usize,
    /// Prompt log-probabilities gathered chunk by chunk, per row.
    lps: Vec<Vec<TokenLogprob>>,
    /// Each row's hidden state at its last position, once the last chunk has run.
    last: Vec<f32>,
}

impl CpuPrefill {
    fn new(model: &Model, batch: Vec<SeqRequest>) -> Self {
        let prompts: Vec<Vec<u32>> = batch.iter().map(|s| s.prompt.clone()).collect();
        let (ids, t, start) = crate::generate::left_pad(&prompts);
        let cache = model.new_cache(batch.len(), t, start.clone());
        let lps = vec![Vec::new(); batch.len()];
        Self { batch, cache, ids, t, start, done: 0, lps, last: Vec::new() }
    }

    /// Runs the next chunk (at most `chunk` positions per row); returns its length.
    fn chunk(&mut self, model: &Model, chunk: usize) -> usize {
        let (b, t, p0) = (self.batch.len(), self.t, self.done);
        let tc = chunk.min(t - p0);
        let v = model.config.vocab_size;
        let d = model.config.hidden_size;
        let ids = Padded { ids: &self.ids, b, t, start: self.start.as_deref() }.chunk_ids(p0, tc);
        let ctx = Ctx { batch: b, seq: tc, start: self.start.clone() };
        let (hidden, _) = model.forward_hidden(&ids, &ctx, Some(&mut self.cache), false);
        for (row, req) in self.batch.iter().enumerate() {
            let Some(k) = req.prompt_logprobs else { continue };
            // Position i of the padded row is prompt token i − off; its logits predict the next
            // one. In pieces of 64 positions to bound the logits' memory.
            let off = t - req.prompt.len();
            let (lo, hi) = (p0.max(off), (p0 + tc).min(t - 1));
            for c0 in (lo..hi).step_by(64) {
                let c1 = (c0 + 64).min(hi);
                let h = &hidden[(row * tc + c0 - p0) * d..(row * tc + c1 - p0) * d];
                let lg = model.logits(h);
                for i in c0..c1 {
                    let l = &lg[(i - c0) * v..(i - c0 + 1) * v];
                    self.lps[row].push(token_logprob(l, req.prompt[i - off + 1], k));
                }
            }
        }
        self.done += tc;
        if self.done == t {
            self.last = (0..b).flat_map(|r| hidden[(r * tc + tc - 1) * d..(r * tc + tc) * d].iter().copied()).collect();
        }
        tc
    }

    /// After the last chunk: sends prompt log-probabilities and each first token; returns the
    /// prefill cache and, for the sequences that go on decoding, their row in it.
    fn finish(mut self, model: &Model) -> (Option<Cache>, Vec<(usize, Running)>) {
        let v = model.config.vocab_size;
        let d = model.config.hidden_size;
        let mut joined = Vec::new();
        for (row, req) in self.batch.into_iter().enumerate() {
            if req.prompt_logprobs.is_some()
                && req.events.send(Event::Prompt(std::mem::take(&mut self.lps[row]))).is_err()
            {
                continue;
            }
            if req.max_tokens == 0 {
                let _ = req.events.send(Event::Done(Finish::Length));
                continue;
            }
            let logits = model.logits(&self.last[row * d..(row + 1) * d]);
            let mut r = Running::new(req);
            if emit_next(&mut r, &logits[..v]) == Step::GoesOn {
                joined.push((row, r));
            }
        }
        (Some(self.cache), joined)
    }
}
