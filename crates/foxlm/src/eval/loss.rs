//! Per-token loss L(i) and perplexity P(l) (SPEC §5).
//!
//! A validation sequence is `N + 1` tokens: BOS followed by the first N tokens of a document. The
//! model reads the first N (context length N) and position i predicts token i + 1, so
//! L(i) for i = 0..N is the cross-entropy of the prediction made after seeing i + 1 tokens.
//! P(l) = exp(mean of L(i) over i < l).
//!
//! Memory stays O(N·d): the sequence is prefilled in chunks through the KV cache (the cache holds
//! keys, values and gate prefix sums, O(N·d) per layer), and logits are formed a few rows at a
//! time, so neither the N×N attention matrix nor the N×V logits ever exist.

use crate::data::{Dataset, Split};
use crate::model::{Ctx, Model};
use crate::tokenizer::EOS_ID;
use anyhow::{bail, Result};
use rayon::prelude::*;

/// How a long sequence is pushed through the model.
#[derive(Clone, Copy, Debug)]
pub struct Chunking {
    /// Tokens per forward call (prefill chunk).
    pub chunk: usize,
    /// Rows of logits formed at once (bounds the [rows, V] buffer).
    pub logit_rows: usize,
}

impl Chunking {
    /// Chunks of `chunk` tokens and a logits buffer of about 64 MiB for vocabulary `vocab`.
    pub fn new(chunk: usize, vocab: usize) -> Self {
        Self { chunk: chunk.max(1), logit_rows: ((16 << 20) / vocab.max(1)).max(1) }
    }
}

/// log Σ exp(row) − row[target], in f64.
pub fn cross_entropy_row(row: &[f32], target: u32) -> f64 {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = row.iter().map(|&v| (v as f64 - m).exp()).sum();
    m + s.ln() - row[target as usize] as f64
}

/// Next-token losses of a batch of equally long sequences, `seqs[b].len() == N + 1`:
/// returns `[B][N]` with `out[b][i]` the loss of predicting `seqs[b][i + 1]` from `seqs[b][..=i]`.
/// `progress(tokens)` is called after each chunk with the number of positions just done (per row).
pub fn batch_token_losses(
    model: &Model,
    seqs: &[Vec<u32>],
    chunking: Chunking,
    mut progress: impl FnMut(usize),
) -> Vec<Vec<f64>> {
    let b = seqs.len();
    if b == 0 {
        return vec![];
    }
    let len = seqs[0].len();
    assert!(len >= 2, "a sequence needs at least two tokens (one prediction)");
    assert!(seqs.iter().all(|s| s.len() == len), "sequences of a batch must have equal lengths");
    let n = len - 1;
    let (d, v) = (model.config.hidden_size, model.config.vocab_size);
    let mut cache = model.new_cache(b, n, None);
    let mut out = vec![Vec::with_capacity(n); b];
    let mut pos = 0;
    while pos < n {
        let t = chunking.chunk.min(n - pos);
        let ids: Vec<u32> = seqs.iter().flat_map(|s| s[pos..pos + t].iter().copied()).collect();
        let (hidden, _) = model.forward_hidden(&ids, &Ctx { batch: b, seq: t, start: None }, Some(&mut cache), false);
        for (r, row_out) in out.iter_mut().enumerate() {
            let mut i = 0;
            while i < t {
                let rows = chunking.logit_rows.min(t - i);
                let h = &hidden[(r * t + i) * d..(r * t + i + rows) * d];
                let logits = model.logits(h);
                let targets = &seqs[r][pos + i + 1..pos + i + 1 + rows];
                let losses: Vec<f64> = logits
                    .par_chunks(v)
                    .zip(targets.par_iter())
                    .map(|(row, &tgt)| cross_entropy_row(row, tgt))
                    .collect();
                row_out.extend(losses);
                i += rows;
            }
        }
        pos += t;
        progress(t);
    }
    out
}

/// How validation sequences are cut from the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Windows {
    /// The first N tokens of each validation document that has at least N (the paper's setting:
    /// position i really is i tokens into a document).
    Documents,
    /// Consecutive windows of N tokens of the validation stream `doc EOS doc EOS …` (as training
    /// windows are cut), for corpora without documents that long.
    Packed,
}

/// K validation sequences of `n` data tokens each (no BOS; the caller prepends it), in the data's
/// token ids. With [`Windows::Documents`] fewer than K may come back when fewer documents are
/// long enough; none is an error.
pub fn validation_sequences(data: &Dataset, n: usize, k: usize, windows: Windows) -> Result<Vec<Vec<u32>>> {
    let split = Split::Val;
    let docs = data.num_documents(split);
    let mut out = vec![];
    match windows {
        Windows::Documents => {
            for i in 0..docs {
                if out.len() == k {
                    break;
                }
                if data.document_len(split, i) >= n {
                    let mut v = Vec::with_capacity(n);
                    data.document_range_into(split, i, 0, n, &mut v);
                    out.push(v);
                }
            }
            if out.is_empty() {
                let longest = (0..docs).map(|i| data.document_len(split, i)).max().unwrap_or(0);
                bail!(
                    "{}: no validation document has {n} tokens (the longest has {longest}); use a shorter --context, \
                     or --pack to cut windows from the documents joined with EOS",
                    data.dir().display()
                );
            }
        }
        Windows::Packed => {
            let mut cur = Vec::with_capacity(n);
            'docs: for i in 0..docs {
                let doc = data.document(split, i);
                for &t in doc.iter().chain(std::iter::once(&EOS_ID)) {
                    cur.push(t);
                    if cur.len() == n {
                        out.push(std::mem::replace(&mut cur, Vec::with_capacity(n)));
                        if out.len() == k {
                            break 'docs;
                        }
                    }
                }
            }
            if out.is_empty() {
                bail!(
                    "{}: the validation split has {} tokens, fewer than one window of {n}",
                    data.dir().display(),
                    data.num_tokens(split) + docs
                );
            }
        }
    }
    Ok(out)
}

/// Running mean over sequences: accumulates per-position sums.
#[derive(Clone, Debug, Default)]
pub struct LossCurve {
    pub sum: Vec<f64>,
    pub count: usize,
}

impl LossCurve {
    pub fn new(n: usize) -> Self {
        Self { sum: vec![0.0; n], count: 0 }
    }
    pub fn add(&mut self, losses: &[f64]) {
        assert_eq!(losses.len(), self.sum.len());
        self.sum.iter_mut().zip(losses).for_each(|(s, l)| *s += l);
        self.count += 1;
    }
    /// L(i), the mean over the sequences added.
    pub fn mean(&self) -> Vec<f64> {
        let k = self.count.max(1) as f64;
        self.sum.iter().map(|s| s / k).collect()
    }
}

/// 1, 2, 4, … up to n, and n itself when it is not a power of two.
pub fn power_of_two_lengths(n: usize) -> Vec<usize> {
    let mut out = vec![];
    let mut l = 1;
    while l <= n {
        out.push(l);
        l *= 2;
    }
    if n > 0 && out.last() != Some(&n) {
        out.push(n);
    }
    out
}

/// P(l) = exp(mean of L(i) over i < l) for each l (l ≤ L.len()).
pub fn perplexity_at(loss: &[f64], lengths: &[usize]) -> Vec<(usize, f64)> {
    let mut prefix = Vec::with_capacity(loss.len() + 1);
    prefix.push(0.0f64);
    for &l in loss {
        prefix.push(prefix.last().unwrap() + l);
    }
    lengths.iter().filter(|&&l| l >= 1 && l <= loss.len()).map(|&l| (l, (prefix[l] / l as f64).exp())).collect()
}

/// Centred moving average over `window` positions (an even window is widened by one); near the
/// ends the window is cut to what exists, so the output has x's length.
pub fn moving_average(x: &[f64], window: usize) -> Vec<f64> {
    let half = window.max(1) / 2;
    let mut prefix = Vec::with_capacity(x.len() + 1);
    prefix.push(0.0f64);
    for &v in x {
        prefix.push(prefix.last().unwrap() + v);
    }
    (0..x.len())
        .map(|i| {
            let lo = i.saturating_sub(half);
            let hi = (i + half + 1).min(x.len());
            (prefix[hi] - prefix[lo]) / (hi - lo) as f64
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perplexity_of_constant_loss_is_its_exponential() {
        let l = vec![2.0; 10];
        for (len, p) in perplexity_at(&l, &power_of_two_lengths(10)) {
            assert!((p - 2f64.exp()).abs() < 1e-12, "P({len}) = {p}");
        }
        assert_eq!(power_of_two_lengths(10), vec![1, 2, 4, 8, 10]);
        assert_eq!(power_of_two_lengths(8), vec![1, 2, 4, 8]);
    }

    #[test]
    fn moving_average_is_centred_and_cut_at_the_ends() {
        let x: Vec<f64> = (0..10).map(|i| i as f64).collect();
        let m = moving_average(&x, 3);
        assert_eq!(m[0], 0.5);
        assert_eq!(m[5], 5.0);
        assert_eq!(m[9], 8.5);
        assert_eq!(moving_average(&x, 1), x);
    }

    #[test]
    fn cross_entropy_row_matches_the_definition() {
        let row = [1.0f32, 2.0, 3.0];
        let z: f64 = row.iter().map(|&v| (v as f64).exp()).sum();
        assert!((cross_entropy_row(&row, 1) - (z.ln() - 2.0)).abs() < 1e-12);
    }
}
