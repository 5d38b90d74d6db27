//! Generation through the serving scheduler: the prompts are submitted in-process as one
//! job to the batcher `serve` runs (the CPU's or the GPU's), which prefills them (left-padded
//! groups, in chunks) and decodes one token per step for every running sequence.

use crate::model::Model;
use crate::sampling::Sampling;
use crate::serve::scheduler::{drive, Batcher, CpuBatcher, Event, SchedulerOptions, SchedulerStats, SeqRequest};

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: Sampling,
    /// Row r samples from its own generator seeded with `seed + r` (as the server's `n` choices),
    /// so a row's tokens do not depend on the other rows of the batch.
    pub seed: u64,
    /// Stop a row when it produces this token (it is not included in the output).
    pub eos: Option<u32>,
}

/// Prompts of different lengths as one left-padded batch: ids [B, T] (T the longest, at least 1),
/// T, and each row's first real position when any row is padded. Padding positions hold any valid
/// id (the row's first); they are masked everywhere.
pub fn left_pad(prompts: &[Vec<u32>]) -> (Vec<u32>, usize, Option<Vec<usize>>) {
    let t = prompts.iter().map(|p| p.len()).max().unwrap_or(0).max(1);
    let start: Vec<usize> = prompts.iter().map(|p| t - p.len()).collect();
    let mut ids = Vec::with_capacity(prompts.len() * t);
    for (p, &s) in prompts.iter().zip(&start) {
        ids.extend(std::iter::repeat_n(p.first().copied().unwrap_or(0), s));
        ids.extend_from_slice(p);
    }
    let padded = start.iter().any(|&s| s > 0);
    (ids, t, padded.then_some(start))
}

/// Left-padded rows as a forward takes them: ids [b, t] and, when any row is padded, each row's
/// first real position (as [`left_pad`] gives them).
#[derive(Clone, Copy)]
pub(crate) struct Padded<'a> {
    pub ids: &'a [u32],
    pub b: usize,
    pub t: usize,
    pub start: Option<&'a [usize]>,
}

impl Padded<'_> {
    /// Each row's positions `p0..p0 + tc`, as ids [b, tc].
    pub fn chunk_ids(&self, p0: usize, tc: usize) -> Vec<u32> {
        let t = self.t;
        (0..self.b).flat_map(|r| self.ids[r * t + p0..r * t + p0 + tc].iter().copied()).collect()
    }
}

/// `run_prompts`'s prefill chunk when every prompt starts together, as `foxlm generate`'s do: no
/// stream runs yet that a long prefill would stall, so each group is prefilled whole (one
/// left-padded batch, as before the scheduler ran `generate`).
pub const WHOLE: usize = usize::MAX;

/// Prompts to continue as one job on a batcher, every prompt in the batch.
pub struct PromptJob<'a> {
    pub prompts: &'a [Vec<u32>],
    pub opts: &'a GenerateOptions,
    /// Prefill chunks of this many positions ([`WHOLE`]: each group at once).
    pub chunk: usize,
    /// `on_token(row, id)` sees each new token as its step ends.
    pub on_token: &'a mut dyn FnMut(usize, u32),
    /// `progress(n)`: the prompt positions each prefill chunk covered.
    pub progress: &'a mut dyn FnMut(usize),
}

/// Runs `job` on `batcher`. Returns each row's new tokens.
pub fn run_prompts(batcher: &mut dyn Batcher, job: PromptJob) -> anyhow::Result<Vec<Vec<u32>>> {
    let PromptJob { prompts, opts, chunk, on_token, progress } = job;
    let eopts = SchedulerOptions::in_process(prompts.len(), chunk);
    let stats = SchedulerStats::default();
    let seqs = prompts
        .iter()
        .enumerate()
        .map(|(r, p)| {
            // An empty prompt starts from token 0, as the left padding's filler.
            let p = if p.is_empty() { vec![0] } else { p.clone() };
            SeqRequest::new(p, opts.max_new_tokens, opts.sampling.clone(), opts.seed.wrapping_add(r as u64), opts.eos)
        })
        .collect();
    let mut out = vec![Vec::new(); prompts.len()];
    drive(
        batcher,
        &eopts,
        &stats,
        seqs,
        &mut |r, ev| {
            if let Event::Token(id, _) = ev {
                out[r].push(id);
                on_token(r, id);
            }
        },
        progress,
    )?;
    Ok(out)
}

/// Generates continuations of `prompts` on the CPU (any lengths, batched with left padding).
/// `on_token(row, id)` sees each new token as it is chosen. Returns each row's new tokens.
pub fn generate(
    model: &Model,
    prompts: &[Vec<u32>],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(usize, u32),
) -> Vec<Vec<u32>> {
    let mut b = CpuBatcher::new(model);
    let job = PromptJob { prompts, opts, chunk: WHOLE, on_token: &mut on_token, progress: &mut |_| {} };
    match run_prompts(&mut b, job) {
        Ok(out) => out,
        // The CPU batcher's steps return no errors (a panic propagates as before).
        Err(e) => unreachable!("the CPU batcher failed: {e:#}"),
    }
}
