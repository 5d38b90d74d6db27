//! [`Loader`]: a split's documents cut into training windows (SPEC §3).

use super::dataset::Dataset;
use super::format::*;
use crate::tokenizer::{BOS_ID, EOS_ID};
use anyhow::{bail, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Where the loader stands; saved in checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    pub seed: u64,
    pub epoch: u64,
    /// Windows of this epoch already handed out.
    pub index: u64,
}

/// A batch of windows: ids and targets [batch, seq] row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub batch: usize,
    pub seq: usize,
    pub ids: Vec<u32>,
    pub targets: Vec<Option<u32>>,
}

/// The epoch's plan: document order, where each starts in the stream, and window order.
struct Epoch {
    epoch: u64,
    docs: Vec<u32>,
    /// Stream start of docs[k] (each document is followed by one EOS).
    starts: Vec<u64>,
    windows: Vec<u32>,
}

/// Cuts a split into windows of `seq` tokens (see the module docs).
pub struct Loader<'a> {
    data: &'a Dataset,
    split: Split,
    seq: usize,
    shuffle: bool,
    state: LoaderState,
    plan: Option<Epoch>,
    stream_len: u64,
}

/// How many windows of `seq` tokens a split yields per epoch: of the stream `doc EOS doc EOS
/// ...`, or with rows (LongCrawl64) `row_tokens / seq` per row, the rest of each row dropped.
pub fn windows_per_epoch(data: &Dataset, split: Split, seq: usize) -> u64 {
    match data.manifest().split(split).row_tokens {
        Some(r) => data.num_documents(split) as u64 * (r / seq.max(1)) as u64,
        None => (data.num_tokens(split) + data.num_documents(split)) as u64 / seq.max(1) as u64,
    }
}

impl<'a> Loader<'a> {
    /// A loader of training windows, shuffled with `seed`. Fails when the split is shorter than
    /// one window.
    pub fn new(data: &'a Dataset, split: Split, seq: usize, seed: u64, shuffle: bool) -> Result<Self> {
        if seq < 2 {
            bail!("window length {seq} is too short (at least 2 tokens)");
        }
        if let Some(r) = data.manifest().split(split).row_tokens {
            if seq > r {
                bail!(
                    "{}: windows of {seq} tokens do not fit the {split} split's rows of {r} tokens (windows never cross rows, as \
                     in the LongCrawl64 authors' loader): use --context {r} or less",
                    data.dir().display()
                );
            }
        }
        let stream_len = (data.num_tokens(split) + data.num_documents(split)) as u64;
        let windows = windows_per_epoch(data, split, seq);
        if windows == 0 {
            bail!(
                "{}: the {split} split has {} tokens in {} documents, fewer than one window of {seq} tokens \
                 (use a shorter --context or more text)",
                data.dir().display(),
                data.num_tokens(split),
                data.num_documents(split)
            );
        }
        if windows > u32::MAX as u64 {
            bail!("{}: {windows} windows of {seq} tokens per epoch, more than foxlm can index", data.dir().display());
        }
        Ok(Self { data, split, seq, shuffle, state: LoaderState { seed, epoch: 0, index: 0 }, plan: None, stream_len })
    }

    pub fn state(&self) -> LoaderState {
        self.state
    }

    /// Continues from a saved position.
    pub fn set_state(&mut self, s: LoaderState) {
        self.state = s;
    }

    pub fn windows_per_epoch(&self) -> u64 {
        match self.data.manifest().split(self.split).row_tokens {
            Some(_) => windows_per_epoch(self.data, self.split, self.seq),
            None => self.stream_len / self.seq as u64,
        }
    }

    fn plan(&mut self) -> &Epoch {
        let epoch = self.state.epoch;
        if self.plan.as_ref().is_none_or(|p| p.epoch != epoch) {
            let n = self.data.num_documents(self.split);
            let mut docs: Vec<u32> = (0..n as u32).collect();
            let mut windows: Vec<u32> = (0..self.windows_per_epoch() as u32).collect();
            if self.shuffle {
                let mut rng = ChaCha8Rng::seed_from_u64(self.state.seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                docs.shuffle(&mut rng);
                windows.shuffle(&mut rng);
            }
            let mut starts = Vec::with_capacity(n);
            let mut pos = 0u64;
            for &d in &docs {
                starts.push(pos);
                pos += self.data.document_len(self.split, d as usize) as u64 + 1;
            }
            self.plan = Some(Epoch { epoch, docs, starts, windows });
        }
        self.plan.as_ref().unwrap()
    }

    /// The tokens of stream range [from, from + len) of the current epoch.
    fn stream(&mut self, from: u64, len: usize, out: &mut Vec<u32>) {
        let data = self.data;
        let split = self.split;
        let plan = self.plan();
        // The document containing `from`.
        let mut k = plan.starts.partition_point(|&s| s <= from) - 1;
        let mut pos = from;
        let end = from + len as u64;
        while pos < end {
            let d = plan.docs[k] as usize;
            let dlen = data.document_len(split, d) as u64;
            let off = pos - plan.starts[k];
            if off < dlen {
                let to = dlen.min(off + (end - pos));
                data.document_range_into(split, d, off as usize, to as usize, out);
                pos += to - off;
            } else {
                out.push(EOS_ID);
                pos += 1;
                k += 1;
            }
        }
    }

    /// The next window: BOS + `seq` stream tokens, `seq + 1` in all.
    pub fn next_window(&mut self) -> Vec<u32> {
        if self.state.index >= self.windows_per_epoch() {
            self.state.epoch += 1;
            self.state.index = 0;
        }
        let idx = self.state.index as usize;
        let w = self.plan().windows[idx] as u64;
        self.state.index += 1;
        let mut out = Vec::with_capacity(self.seq + 1);
        out.push(BOS_ID);
        match self.data.manifest().split(self.split).row_tokens {
            // Window w is the (w mod per_row)-th stretch of `seq` tokens of row w / per_row.
            Some(r) => {
                let per_row = (r / self.seq) as u64;
                let from = (w % per_row) as usize * self.seq;
                self.data.document_range_into(self.split, (w / per_row) as usize, from, from + self.seq, &mut out);
            }
            None => self.stream(w * self.seq as u64, self.seq, &mut out),
        }
        out
    }

    /// Passes over `n` windows as [`Loader::next_window`] would hand them out (another rank reads
    /// them in data-parallel training).
    pub fn skip(&mut self, n: u64) {
        let per_epoch = self.windows_per_epoch();
        let mut left = n;
        while left > 0 {
            if self.state.index >= per_epoch {
                self.state.epoch += 1;
                self.state.index = 0;
            }
            let take = left.min(per_epoch - self.state.index);
            self.state.index += take;
            left -= take;
        }
    }

    /// The next `batch` windows as ids (first `seq` tokens) and targets (last `seq`).
    pub fn next_batch(&mut self, batch: usize) -> Batch {
        let seq = self.seq;
        let mut ids = Vec::with_capacity(batch * seq);
        let mut targets = Vec::with_capacity(batch * seq);
        for _ in 0..batch {
            let w = self.next_window();
            ids.extend_from_slice(&w[..seq]);
            targets.extend(w[1..].iter().map(|&t| Some(t)));
        }
        Batch { batch, seq, ids, targets }
    }
}
