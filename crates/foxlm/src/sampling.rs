//! Choosing the next token from logits: greedy, or seeded sampling with temperature, top-k, top-p.

use rand::Rng;

#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// 0 means greedy.
    pub temperature: f32,
    /// Keep only the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1 = all).
    pub top_p: f32,
}

impl Default for Sampling {
    fn default() -> Self {
        Self { temperature: 0.0, top_k: 0, top_p: 1.0 }
    }
}

/// The index of the largest logit (the first one on ties, like torch.argmax).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

pub fn sample<R: Rng>(logits: &[f32], s: &Sampling, rng: &mut R) -> u32 {
    if s.temperature <= 0.0 {
        return argmax(logits);
    }
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if s.top_k > 0 && s.top_k < idx.len() {
        idx.truncate(s.top_k);
    }
    let m = logits[idx[0]];
    let mut probs: Vec<f64> = idx.iter().map(|&i| (((logits[i] - m) / s.temperature) as f64).exp()).collect();
    let z: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= z);
    if s.top_p < 1.0 {
        let mut acc = 0.0;
        let mut keep = probs.len();
        for (i, p) in probs.iter().enumerate() {
            acc += p;
            if acc >= s.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        probs.truncate(keep);
        idx.truncate(keep);
        let z: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= z);
    }
    let u: f64 = rng.gen();
    let mut acc = 0.0;
    for (i, p) in probs.iter().enumerate() {
        acc += p;
        if u < acc {
            return idx[i] as u32;
        }
    }
    idx[probs.len() - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn greedy_top_k_top_p_and_seeding() {
        let logits = [0.0f32, 3.0, 1.0, 2.9, -5.0];
        assert_eq!(argmax(&logits), 1);
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        assert_eq!(sample(&logits, &Sampling::default(), &mut rng), 1);
        // top-k 2: only tokens 1 and 3 ever appear
        let s = Sampling { temperature: 1.0, top_k: 2, top_p: 1.0 };
        let draws: Vec<u32> = (0..200).map(|_| sample(&logits, &s, &mut rng)).collect();
        assert!(draws.iter().all(|&t| t == 1 || t == 3));
        assert!(draws.contains(&1) && draws.contains(&3));
        // top-p 0.3: the single most likely token already reaches it
        let s = Sampling { temperature: 1.0, top_k: 0, top_p: 0.3 };
        assert!((0..50).all(|_| sample(&logits, &s, &mut rng) == 1));
        // same seed, same draws
        let s = Sampling { temperature: 0.8, top_k: 0, top_p: 0.95 };
        let a: Vec<u32> = {
            let mut r = ChaCha8Rng::seed_from_u64(7);
            (0..30).map(|_| sample(&logits, &s, &mut r)).collect()
        };
        let b: Vec<u32> = {
            let mut r = ChaCha8Rng::seed_from_u64(7);
            (0..30).map(|_| sample(&logits, &s, &mut r)).collect()
        };
        assert_eq!(a, b);
    }
}
