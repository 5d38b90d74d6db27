//! Forget-gate statistics and maps (SPEC §5 "Visualisations").
//!
//! From one forward pass with saved activations (batch 1):
//! - the forget matrix of a head, F_ij = exp(c_i − c_j) for j ≤ i (c = the gate's prefix sums);
//! - its attention map, softmax_j(scale · q_i·k_j + c_i − c_j) over j ≤ i, from the q and k the
//!   attention actually used (after QK-norm, KV-shift and RoPE);
//! - per head, the mean forget gate f̄ over the tokens and its effective memory length
//!   1/(1 − f̄): the number of tokens over which the gate's product decays by a factor e
//!   (for f̄ close to 1). Local heads have short memories, global heads long ones.

use crate::model::CpuActs;
use fox_kernels::scalar::sigmoid;
use serde::Serialize;

/// One head's gate statistics.
#[derive(Clone, Debug, Serialize)]
pub struct HeadGate {
    pub layer: usize,
    pub head: usize,
    /// Mean of f_t over positions t ≥ 1 (position 0's gate never affects attention).
    pub mean_f: f64,
    /// 1 / (1 − mean_f); infinite (null in JSON) for a model without a forget gate.
    #[serde(serialize_with = "finite_or_null")]
    pub memory_length: f64,
    /// Smallest and largest f_t over those positions.
    pub min_f: f64,
    pub max_f: f64,
}

fn finite_or_null<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.is_finite() {
        s.serialize_f64(*v)
    } else {
        s.serialize_none()
    }
}

/// The gates f_t of one layer and head over a sequence of `t` tokens (batch 1); all ones when the
/// model has no forget gate (empty `fgate_logit`).
pub fn head_gates(fgate_logit: &[f32], heads: usize, head: usize, t: usize) -> Vec<f64> {
    if fgate_logit.is_empty() {
        return vec![1.0; t];
    }
    (0..t).map(|i| sigmoid(fgate_logit[i * heads + head]) as f64).collect()
}

/// Statistics for every layer and head.
pub fn gate_stats(acts: &CpuActs, heads: usize, t: usize) -> Vec<HeadGate> {
    let mut out = vec![];
    for (layer, b) in acts.blocks.iter().enumerate() {
        // Only attention layers have a forget gate.
        let Some(at) = b.attn() else { continue };
        for head in 0..heads {
            let f = head_gates(&at.fgate_logit, heads, head, t);
            let used = if f.len() > 1 { &f[1..] } else { &f[..] };
            let mean_f = used.iter().sum::<f64>() / used.len() as f64;
            let memory_length = if mean_f >= 1.0 { f64::INFINITY } else { 1.0 / (1.0 - mean_f) };
            let min_f = used.iter().copied().fold(f64::INFINITY, f64::min);
            let max_f = used.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            out.push(HeadGate { layer, head, mean_f, memory_length, min_f, max_f });
        }
    }
    out
}

/// F [t, t] row-major for one head: exp(c_i − c_j) on and below the diagonal, NaN above.
/// `c` is the layer's [1, H, t] prefix sums.
pub fn forget_matrix(c: &[f32], head: usize, t: usize) -> Vec<f32> {
    let c = &c[head * t..(head + 1) * t];
    let mut f = vec![f32::NAN; t * t];
    for i in 0..t {
        for j in 0..=i {
            f[i * t + j] = ((c[i] - c[j]) as f64).exp() as f32;
        }
    }
    f
}

/// Attention probabilities [t, t] of one head (NaN above the diagonal, 0 left of a sliding
/// window): q [1, t, H·D] and k [1, t, H_kv·D] are the layer's attention inputs (query head h
/// reads k head h / (H / H_kv)), c its [1, H, t] prefix sums (all zeros without a gate).
#[allow(clippy::too_many_arguments)]
pub fn attention_map(
    q: &[f32],
    k: &[f32],
    c: &[f32],
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    window: Option<usize>,
    head: usize,
    t: usize,
) -> Vec<f32> {
    let (d, dkv) = (heads * head_dim, kv_heads * head_dim);
    let hk = head / (heads / kv_heads.max(1)).max(1);
    let scale = 1.0 / (head_dim as f64).sqrt();
    let ch = |i: usize| if c.is_empty() { 0.0 } else { c[head * t + i] as f64 };
    let mut p = vec![f32::NAN; t * t];
    let mut s = vec![0.0f64; t];
    for i in 0..t {
        let lo = window.map_or(0, |w| (i + 1).saturating_sub(w));
        let qi = &q[i * d + head * head_dim..][..head_dim];
        for (j, sj) in s.iter_mut().enumerate().take(i + 1).skip(lo) {
            let kj = &k[j * dkv + hk * head_dim..][..head_dim];
            let dot: f64 = qi.iter().zip(kj).map(|(&a, &b)| a as f64 * b as f64).sum();
            *sj = scale * dot + ch(i) - ch(j);
        }
        let m = s[lo..=i].iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = s[lo..=i].iter().map(|&v| (v - m).exp()).sum();
        for j in 0..=i {
            p[i * t + j] = if j < lo { 0.0 } else { ((s[j] - m).exp() / z) as f32 };
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forget_matrix_is_the_product_of_gates_between_j_and_i() {
        // a = log f with f = 0.5, 0.25, 0.8: c = cumulative sums.
        let f = [0.5f64, 0.25, 0.8];
        let mut c = vec![];
        let mut acc = 0.0;
        for v in f {
            acc += v.ln();
            c.push(acc as f32);
        }
        let m = forget_matrix(&c, 0, 3);
        assert!((m[2 * 3] as f64 - 0.25 * 0.8).abs() < 1e-6);
        assert!((m[2 * 3 + 1] as f64 - 0.8).abs() < 1e-6);
        assert_eq!(m[4], 1.0);
        assert!(m[1].is_nan());
    }
}
