//! The attention family's operations: what a backend supplies so that a [`super::ForgettingAttention`]
//! layer runs on it (FoX and the Transformer: the forget gate, KV-shift, RoPE, Forgetting Attention
//! with ACP, and the KV cache). Each mirrors the CPU op of the same name in `fox_kernels`; the CPU
//! implementation is `cpu.rs`, the CUDA one `cuda.rs`.

use super::{AttnActs, ForgettingAttention};
use crate::backend::Backend;
use crate::tensor::ParamId;
use anyhow::Result;

/// Key tiles the attention visited and skipped (ACP), for reporting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tiles {
    pub visited: usize,
    pub pruned: usize,
}

/// An attention layer's heads and key window: `kv_heads` k/v heads shared by groups of query
/// heads (grouped-query attention) and an optional sliding window (the query at position i sees
/// keys i − w < j ≤ i).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub window: Option<usize>,
}

pub trait AttnOps: Backend {
    /// One layer's decode cache (k, v, running gate sum, KV-shift states).
    type KvCache;

    // Positions.
    /// KV-shift over [B, T, H·D] with mixing weights α [B, T, H]; `cache` supplies the previous
    /// chunk's last k̃ (decoding), `value` picks its ṽ instead of its k̃.
    #[allow(clippy::too_many_arguments)]
    fn kv_shift_fwd(
        &mut self,
        out: &mut Self::Act,
        x: &Self::Act,
        alpha: &Self::Act,
        batch: &Self::Batch,
        cache: Option<&Self::KvCache>,
        value: bool,
        heads: usize,
        head_dim: usize,
    ) -> Result<()>;
    #[allow(clippy::too_many_arguments)]
    fn kv_shift_bwd(
        &mut self,
        dx: &mut Self::Act,
        dalpha: &mut Self::Act,
        dout: &Self::Act,
        x: &Self::Act,
        alpha: &Self::Act,
        batch: &Self::Batch,
        heads: usize,
        head_dim: usize,
    ) -> Result<()>;
    /// RoPE at positions relative to each row's first real token (continuing after the cache).
    fn rope(
        &mut self,
        x: &mut Self::Act,
        batch: &Self::Batch,
        heads: usize,
        head_dim: usize,
        base: f64,
        inverse: bool,
    ) -> Result<()>;

    // The forget gate (f32).
    /// logit [rows, H] += bias (full gate), or = bias on every row (bias-only and fixed gates).
    fn fgate_bias(&mut self, logit: &mut Self::F32, bias: ParamId, rows: usize, heads: usize, add: bool) -> Result<()>;
    /// grad(bias) += column sums of dlogit [rows, H].
    fn fgate_bias_bwd(&mut self, bias: ParamId, dlogit: &Self::F32, rows: usize, heads: usize) -> Result<()>;
    /// a = log sigmoid(logit) over the first `n` values.
    fn log_fgate_fwd(&mut self, a: &mut Self::F32, logit: &Self::F32, n: usize) -> Result<()>;
    fn log_fgate_bwd(&mut self, dlogit: &mut Self::F32, da: &Self::F32, logit: &Self::F32) -> Result<()>;
    /// c [B, H, T] = prefix sum of a [B, T, H] per row (from its first real token), continuing
    /// the cache's running sum when decoding.
    fn prefix_sum_fwd(
        &mut self,
        c: &mut Self::F32,
        a: &Self::F32,
        batch: &Self::Batch,
        cache: Option<&Self::KvCache>,
        heads: usize,
    ) -> Result<()>;
    /// da [B, T, H] = reverse prefix sum of dc [B, H, T].
    fn prefix_sum_bwd(&mut self, da: &mut Self::F32, dc: &Self::F32, batch: &Self::Batch, heads: usize) -> Result<()>;

    // Forgetting Attention, for a layer of any [`AttnShape`]: k, v [B, T, H_kv·D] (grouped-query
    // attention when H_kv < H) and an optional sliding window.
    /// ACP thresholds δ per (b, h) into `prune` [B·H]: U from the QK-norm weights when given,
    /// else from the largest query and key norms (query head h with the k/v head it reads).
    #[allow(clippy::too_many_arguments)]
    fn acp_thresholds(
        &mut self,
        prune: &mut Self::F32,
        qk_norm: Option<(ParamId, ParamId)>,
        q: &Self::Act,
        k: &Self::Act,
        batch: &Self::Batch,
        shape: AttnShape,
        n_keys: usize,
        log_eps: f32,
    ) -> Result<()>;
    /// o [B, T, H·D], lse [B, H, T]; with `cache`, k, v and c are appended to it first and the
    /// queries attend to every cached key (the window applies to cached keys too).
    fn attention_fwd(
        &mut self,
        o: &mut Self::Act,
        lse: &mut Self::F32,
        x: AttnIn<'_, Self::Act, Self::F32>,
        batch: &Self::Batch,
        cache: Option<&mut Self::KvCache>,
        shape: AttnShape,
    ) -> Result<Tiles>;
    /// dq [B, T, H·D], dk, dv [B, T, H_kv·D] (each summed over its group of query heads) and dc
    /// [B, H, T] (query and key terms summed).
    #[allow(clippy::too_many_arguments)]
    fn attention_bwd(
        &mut self,
        grads: AttnGrads<'_, Self>,
        x: AttnIn<'_, Self::Act, Self::F32>,
        o: &Self::Act,
        dout: &Self::Act,
        lse: &Self::F32,
        batch: &Self::Batch,
        shape: AttnShape,
    ) -> Result<()>;
    /// After a forward with a cache: remember the last unmixed k̃, ṽ of each row for KV-shift.
    fn cache_shift_states(
        &mut self,
        cache: &mut Self::KvCache,
        k_lin: &Self::Act,
        v_lin: &Self::Act,
        batch: &Self::Batch,
    ) -> Result<()>;

    /// A decode step's attention inputs in as few launches as the backend can: for one position
    /// per row continuing `cache`, the layer's q (after QK-norm and RoPE) into `a.q` and its gate
    /// sums into `a.c`, with k, v and c already appended to the cache (its attention then only
    /// reads) and the KV-shift states advanced. `Ok(false)`: not done here (the default), and the
    /// layer runs its operations one by one.
    fn decode_attn_inputs(
        &mut self,
        _layer: &ForgettingAttention,
        _x: &Self::Act,
        _batch: &Self::Batch,
        _a: &mut AttnActs<Self::Act, Self::F32>,
        _cache: &mut Self::KvCache,
    ) -> Result<bool> {
        Ok(false)
    }
    /// After a fused [`AttnOps::decode_attn_inputs`] and the attention: the input of o_proj,
    /// `a.z` = output norm (per head) and output gate of `a.o`. `Ok(false)`: not done here.
    fn decode_attn_output(
        &mut self,
        _layer: &ForgettingAttention,
        _batch: &Self::Batch,
        _a: &mut AttnActs<Self::Act, Self::F32>,
    ) -> Result<bool> {
        Ok(false)
    }
}

/// Forgetting Attention's inputs (A: activations, F: f32): q [B, T, H·D], k, v [B, T, H_kv·D],
/// the gate sums c [B, H, T] and, with ACP, the thresholds per (b, h).
#[derive(Clone, Copy)]
pub struct AttnIn<'a, A, F> {
    pub q: &'a A,
    pub k: &'a A,
    pub v: &'a A,
    pub c: &'a F,
    pub prune: Option<&'a F>,
}

/// The attention backward's outputs, grouped (they are written together).
pub struct AttnGrads<'a, B: AttnOps + ?Sized> {
    pub dq: &'a mut B::Act,
    pub dk: &'a mut B::Act,
    pub dv: &'a mut B::Act,
    pub dc: &'a mut B::F32,
}
