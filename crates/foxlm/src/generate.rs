//! Decoding with the KV cache: prefill the (left-padded) prompts once, then one token per step,
//! each step costing O(context) attention and O(1) gate work.

use crate::model::{Ctx, Model};
use crate::sampling::{sample, Sampling};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: Sampling,
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

/// Generates continuations of `prompts` (any lengths, batched with left padding). `on_token(row,
/// id)` sees each new token as it is chosen. Returns each row's new tokens.
pub fn generate(
    model: &Model,
    prompts: &[Vec<u32>],
    opts: &GenerateOptions,
    mut on_token: impl FnMut(usize, u32),
) -> Vec<Vec<u32>> {
    let b = prompts.len();
    if b == 0 {
        return vec![];
    }
    let (ids, t, start) = left_pad(prompts);
    let mut cache = model.new_cache(b, t + opts.max_new_tokens, start.clone());
    let ctx = Ctx { batch: b, seq: t, start: start.clone() };
    let (hidden, _) = model.forward_hidden(&ids, &ctx, Some(&mut cache), false);
    let d = model.config.hidden_size;
    // Only the last position's logits are needed.
    let last: Vec<f32> = (0..b).flat_map(|r| hidden[((r + 1) * t - 1) * d..(r + 1) * t * d].to_vec()).collect();
    let mut logits = model.logits(&last);
    let v = model.config.vocab_size;
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed);
    let mut out = vec![Vec::new(); b];
    let mut done = vec![false; b];
    for step in 0..opts.max_new_tokens {
        let mut next = vec![0u32; b];
        for r in 0..b {
            let tok = sample(&logits[r * v..(r + 1) * v], &opts.sampling, &mut rng);
            next[r] = tok;
            if done[r] {
                continue;
            }
            if Some(tok) == opts.eos {
                done[r] = true;
                continue;
            }
            out[r].push(tok);
            on_token(r, tok);
        }
        if done.iter().all(|&x| x) || step + 1 == opts.max_new_tokens {
            break;
        }
        let ctx = Ctx { batch: b, seq: 1, start: start.clone() };
        let (hidden, _) = model.forward_hidden(&next, &ctx, Some(&mut cache), false);
        logits = model.logits(&hidden);
    }
    out
}
