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
