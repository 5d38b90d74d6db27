//! Softmax cross-entropy over the vocabulary, per row.

use rayon::prelude::*;

/// losses[r] = logsumexp(logits[r]) − logits[r][target[r]]; rows whose target is None get 0.
/// Returns also each row's logsumexp for the backward.
pub fn cross_entropy_fwd(logits: &[f32], targets: &[Option<u32>], vocab: usize) -> (Vec<f32>, Vec<f32>) {
    let rows = targets.len();
    assert_eq!(logits.len(), rows * vocab);
    let lse: Vec<f32> = logits.par_chunks(vocab).map(logsumexp).collect();
    let losses = (0..rows)
        .into_par_iter()
        .map(|r| match targets[r] {
            Some(t) => lse[r] - logits[r * vocab + t as usize],
            None => 0.0,
        })
        .collect();
    (losses, lse)
}

pub fn logsumexp(row: &[f32]) -> f32 {
    let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return m;
    }
    let s: f64 = row.iter().map(|&v| ((v - m) as f64).exp()).sum();
    m + s.ln() as f32
}

/// dlogits[r] = weight[r] · (softmax(logits[r]) − onehot(target[r])), in place over `logits`.
pub fn cross_entropy_bwd(logits: &mut [f32], lse: &[f32], targets: &[Option<u32>], weight: &[f32], vocab: usize) {
    logits.par_chunks_mut(vocab).enumerate().for_each(|(r, row)| match targets[r] {
        Some(t) => {
            let w = weight[r];
            for v in row.iter_mut() {
                *v = (*v - lse[r]).exp() * w;
            }
            row[t as usize] -= w;
        }
        None => row.fill(0.0),
    });
}

/// Forward and backward fused, one pass per row for each of max, Σexp and the gradient, with a
/// vectorised exp: returns Σ loss over the rows with a target and overwrites `logits` with
/// dlogits = weight · (softmax − onehot) (0 on rows without a target). This is the op the
/// trainer uses: the vocabulary-sized part of a small model's step is most of its cost.
#[allow(clippy::needless_range_loop)]
pub fn cross_entropy_fused(logits: &mut [f32], targets: &[Option<u32>], weight: f32, vocab: usize) -> f64 {
    use crate::scalar::fast_exp;
    assert_eq!(logits.len(), targets.len() * vocab);
    logits
        .par_chunks_mut(vocab)
        .zip(targets.par_iter())
        .map(|(row, t)| {
            let Some(t) = *t else {
                row.fill(0.0);
                return 0.0f64;
            };
            let m = row.chunks(8).fold(f32::NEG_INFINITY, |m, c| c.iter().fold(m, |a, &b| a.max(b)));
            let mut acc = [0.0f32; 8];
            let mut it = row.chunks_exact(8);
            for c in &mut it {
                for k in 0..8 {
                    acc[k] += fast_exp(c[k] - m);
                }
            }
            let tail: f32 = it.remainder().iter().map(|&v| fast_exp(v - m)).sum();
            let s = acc.iter().map(|&a| a as f64).sum::<f64>() + tail as f64;
            let lse = m + s.ln() as f32;
            let loss = (lse - row[t as usize]) as f64;
            for v in row.iter_mut() {
                *v = fast_exp(*v - lse) * weight;
            }
            row[t as usize] -= weight;
            loss
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_gradient, randn};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// L = Σ_r weight_r · loss_r by central differences; rows without a target get no gradient.
    #[test]
    fn backward_matches_finite_differences() {
        let mut rng = ChaCha8Rng::seed_from_u64(16);
        let (rows, vocab) = (4, 37);
        let logits: Vec<f32> = randn(&mut rng, rows * vocab).iter().map(|v| 3.0 * v).collect();
        let targets = [Some(3u32), None, Some(36), Some(0)];
        let weight = [0.7f32, 0.3, -1.2, 0.25];
        let loss = |l: &[f32]| -> f64 {
            let (losses, _) = cross_entropy_fwd(l, &targets, vocab);
            losses.iter().zip(&weight).map(|(a, b)| *a as f64 * *b as f64).sum()
        };
        let (losses, lse) = cross_entropy_fwd(&logits, &targets, vocab);
        assert_eq!(losses[1], 0.0);
        for r in [0, 2, 3] {
            let row = &logits[r * vocab..(r + 1) * vocab];
            let z: f64 = row.iter().map(|&v| (v as f64).exp()).sum();
            let want = z.ln() - row[targets[r].unwrap() as usize] as f64;
            assert!((losses[r] as f64 - want).abs() < 1e-5, "row {r}: {} vs {want}", losses[r]);
        }
        let mut d = logits.clone();
        cross_entropy_bwd(&mut d, &lse, &targets, &weight, vocab);
        // softmax'' is bounded by 1/4 per unit weight: O(h²) truncation ≈ 1e-5.
        assert_gradient("dlogits", &d, &logits, 0..logits.len(), (1e-2, 1e-3), loss);
        assert!(d[vocab..2 * vocab].iter().all(|&v| v == 0.0));
        // Each row's gradient sums to zero (softmax minus one-hot, scaled).
        for r in 0..rows {
            let s: f32 = d[r * vocab..(r + 1) * vocab].iter().sum();
            assert!(s.abs() < 1e-5, "row {r} sums to {s}");
        }
    }

    #[test]
    fn fused_matches_the_two_pass_op() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (rows, vocab) = (5, 1003);
        let logits: Vec<f32> = randn(&mut rng, rows * vocab).iter().map(|v| 4.0 * v).collect();
        let targets = [Some(3u32), None, Some(1002), Some(0), Some(500)];
        let (losses, lse) = cross_entropy_fwd(&logits, &targets, vocab);
        let mut want = logits.clone();
        cross_entropy_bwd(&mut want, &lse, &targets, &[0.5; 5], vocab);
        let mut got = logits.clone();
        let sum = cross_entropy_fused(&mut got, &targets, 0.5, vocab);
        let want_sum: f64 = losses.iter().map(|&l| l as f64).sum();
        assert!((sum - want_sum).abs() < 1e-5 * want_sum.abs().max(1.0), "{sum} vs {want_sum}");
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-6, "{a} vs {b}");
        }
    }
}
