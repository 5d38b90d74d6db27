//! The attention family's operations on the CPU backend (f32; the reference the CUDA ones are
//! checked against).

use super::kv_cache::KvCache;
use super::ops::{AttnGrads, AttnIn, AttnOps, AttnShape, Tiles};
use crate::backend::cpu::{Cpu, CpuBatch, DCK};
use crate::backend::Family;
use crate::tensor::ParamId;
use anyhow::{bail, Result};
use fox_kernels::attention::{self as fa, View};
use fox_kernels::kv_shift::{self, KvShift};
use fox_kernels::par::with_buffer;
use fox_kernels::{fgate, rope};

impl AttnOps for Cpu<'_> {
    type KvCache = KvCache;

    fn kv_shift_fwd(
        &mut self,
        out: &mut Vec<f32>,
        x: &Vec<f32>,
        alpha: &Vec<f32>,
        b: &CpuBatch,
        cache: Option<&KvCache>,
        value: bool,
        heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let prev = match cache {
            Some(c) if c.len > 0 => Some(if value { c.v_shift.as_slice() } else { c.k_shift.as_slice() }),
            _ => None,
        };
        let p = KvShift { batch: b.batch, seq: b.seq, heads, head_dim, x, alpha, start: b.chunk_start() };
        kv_shift::kv_shift_fwd(&p, prev, out);
        Ok(())
    }
    fn kv_shift_bwd(
        &mut self,
        dx: &mut Vec<f32>,
        dalpha: &mut Vec<f32>,
        dout: &Vec<f32>,
        x: &Vec<f32>,
        alpha: &Vec<f32>,
        b: &CpuBatch,
        heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let p = KvShift { batch: b.batch, seq: b.seq, heads, head_dim, x, alpha, start: b.start.as_deref() };
        kv_shift::kv_shift_bwd(&p, dout, dx, dalpha);
        Ok(())
    }
    fn rope(
        &mut self,
        x: &mut Vec<f32>,
        b: &CpuBatch,
        heads: usize,
        head_dim: usize,
        base: f64,
        inverse: bool,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let t = b.seq;
        let pos: Vec<i64> = (0..b.batch * t)
            .map(|r| (b.past + r % t) as i64 - b.start.as_ref().map_or(0, |s| s[r / t] as i64))
            .collect();
        rope::rope_apply(x, &pos, heads, head_dim, base, inverse);
        Ok(())
    }

    fn fgate_bias(&mut self, logit: &mut Vec<f32>, bias: ParamId, rows: usize, heads: usize, add: bool) -> Result<()> {
        let _t = self.time(Family::Other);
        let bv = &self.params[bias];
        for row in logit[..rows * heads].chunks_exact_mut(heads) {
            for (l, &b) in row.iter_mut().zip(bv) {
                *l = if add { *l + b } else { b };
            }
        }
        Ok(())
    }
    fn fgate_bias_bwd(&mut self, bias: ParamId, dlogit: &Vec<f32>, rows: usize, heads: usize) -> Result<()> {
        let _t = self.time(Family::Other);
        if let Some(gb) = self.grad_of(bias)? {
            for row in dlogit[..rows * heads].chunks_exact(heads) {
                gb.iter_mut().zip(row).for_each(|(g, v)| *g += v);
            }
        }
        Ok(())
    }
    fn log_fgate_fwd(&mut self, a: &mut Vec<f32>, logit: &Vec<f32>, n: usize) -> Result<()> {
        let _t = self.time(Family::Other);
        let n = crate::backend::cpu::first("log forget gate", Some(n), &[a.len(), logit.len()])?;
        fgate::log_fgate_fwd(&mut a[..n], &logit[..n]);
        Ok(())
    }
    fn log_fgate_bwd(&mut self, dlogit: &mut Vec<f32>, da: &Vec<f32>, logit: &Vec<f32>) -> Result<()> {
        let _t = self.time(Family::Other);
        fgate::log_fgate_bwd(dlogit, da, logit);
        Ok(())
    }
    fn prefix_sum_fwd(
        &mut self,
        c: &mut Vec<f32>,
        a: &Vec<f32>,
        b: &CpuBatch,
        cache: Option<&KvCache>,
        heads: usize,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let t = b.seq;
        fgate::prefix_sum_fwd(c, a, b.chunk_start(), t, heads);
        if let Some(cache) = cache {
            if cache.len > 0 {
                for bh in 0..b.batch * heads {
                    let last = cache.c_at(bh, cache.len - 1);
                    c[bh * t..(bh + 1) * t].iter_mut().for_each(|v| *v += last);
                }
            }
        }
        Ok(())
    }
    fn prefix_sum_bwd(&mut self, da: &mut Vec<f32>, dc: &Vec<f32>, b: &CpuBatch, heads: usize) -> Result<()> {
        let _t = self.time(Family::Other);
        fgate::prefix_sum_bwd(da, dc, b.start.as_deref(), b.seq, heads);
        Ok(())
    }

    fn acp_thresholds(
        &mut self,
        prune: &mut Vec<f32>,
        qk_norm: Option<(ParamId, ParamId)>,
        q: &Vec<f32>,
        k: &Vec<f32>,
        b: &CpuBatch,
        shape: AttnShape,
        n_keys: usize,
        log_eps: f32,
    ) -> Result<()> {
        let _t = self.time(Family::Attention);
        let (heads, hd) = (shape.heads, shape.head_dim);
        let group = heads / shape.kv_heads;
        let u: Vec<f32> = match qk_norm {
            Some((qn, kn)) => {
                let (wq, wk) = (&self.params[qn], &self.params[kn]);
                // a per-head weight: q_norm has H heads, k_norm H_kv (query head h reads h / group)
                let per_head = |w: &[f32], hi: usize| -> f32 {
                    let s = if w.len() == hd { w } else { &w[hi * hd..(hi + 1) * hd] };
                    s.iter().fold(0.0f32, |m, v| m.max(v.abs()))
                };
                (0..b.batch * heads)
                    .map(|bh| (hd as f32).sqrt() * per_head(wq, bh % heads) * per_head(wk, bh % heads / group))
                    .collect()
            }
            None => {
                *prune = norm_thresholds(q, k, b.batch, b.seq, b.start.as_deref(), shape, n_keys, log_eps);
                return Ok(());
            }
        };
        *prune = fa::prune_thresholds(&u, n_keys, log_eps);
        Ok(())
    }
    fn attention_fwd(
        &mut self,
        o: &mut Vec<f32>,
        lse: &mut Vec<f32>,
        x: AttnIn<'_, Vec<f32>, Vec<f32>>,
        b: &CpuBatch,
        cache: Option<&mut KvCache>,
        shape: AttnShape,
    ) -> Result<Tiles> {
        let _t = self.time(Family::Attention);
        let AttnIn { q, k, v, c, prune } = x;
        let prune = prune.map(|p| p.as_slice());
        lse.resize(b.batch * shape.heads * b.seq, 0.0);
        let (visited, pruned) = match cache {
            None => fa::forward_into(&problem(b, q, k, v, c, prune, shape), o, lse),
            Some(cache) => {
                if (cache.heads, cache.kv_heads, cache.head_dim) != (shape.heads, shape.kv_heads, shape.head_dim) {
                    bail!(
                        "decode cache of {} query / {} k/v heads of {} for a layer of {} / {} of {}",
                        cache.heads,
                        cache.kv_heads,
                        cache.head_dim,
                        shape.heads,
                        shape.kv_heads,
                        shape.head_dim
                    );
                }
                let past = cache.len;
                cache.append(k, v, c, b.seq);
                let ck = cache.c_compact();
                let pr = fa::Problem {
                    tk: cache.len,
                    q_pos0: past,
                    k: cache.k_view(),
                    v: cache.v_view(),
                    ck: &ck,
                    ..problem(b, q, k, v, c, prune, shape)
                };
                fa::forward_into(&pr, o, lse)
            }
        };
        Ok(Tiles { visited, pruned })
    }
    fn attention_bwd(
        &mut self,
        g: AttnGrads<'_, Self>,
        x: AttnIn<'_, Vec<f32>, Vec<f32>>,
        o: &Vec<f32>,
        dout: &Vec<f32>,
        lse: &Vec<f32>,
        b: &CpuBatch,
        shape: AttnShape,
    ) -> Result<()> {
        let _t = self.time(Family::Attention);
        let AttnIn { q, k, v, c, prune } = x;
        let pr = problem(b, q, k, v, c, prune.map(|p| p.as_slice()), shape);
        let n = b.batch * b.seq;
        g.dq.resize(n * shape.heads * shape.head_dim, 0.0);
        g.dk.resize(n * shape.kv_heads * shape.head_dim, 0.0);
        g.dv.resize(n * shape.kv_heads * shape.head_dim, 0.0);
        g.dc.resize(n * shape.heads, 0.0);
        // dc = dcq + dck: dcq straight into dc, dck in this thread's scratch.
        with_buffer(&DCK, n * shape.heads, |dck| {
            let out = fa::GradsMut { dq: g.dq, dk: g.dk, dv: g.dv, dcq: g.dc, dck };
            fa::backward_into(&pr, o, dout, lse, out);
            g.dc.iter_mut().zip(dck.iter()).for_each(|(d, y)| *d += y);
        });
        Ok(())
    }
    fn cache_shift_states(
        &mut self,
        cache: &mut KvCache,
        k_lin: &Vec<f32>,
        v_lin: &Vec<f32>,
        b: &CpuBatch,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let d = cache.kv_heads * cache.head_dim;
        let t = b.seq;
        if k_lin.len() < b.batch * t * d || v_lin.len() < b.batch * t * d {
            // Without KV-shift the unmixed projections are not kept: nothing to remember.
            return Ok(());
        }
        for bi in 0..b.batch {
            let r = (bi * t + t - 1) * d;
            cache.k_shift[bi * d..(bi + 1) * d].copy_from_slice(&k_lin[r..r + d]);
            cache.v_shift[bi * d..(bi + 1) * d].copy_from_slice(&v_lin[r..r + d]);
        }
        Ok(())
    }
}

pub(crate) fn problem<'p>(
    b: &'p CpuBatch,
    q: &'p [f32],
    k: &'p [f32],
    v: &'p [f32],
    c: &'p [f32],
    prune: Option<&'p [f32]>,
    shape: AttnShape,
) -> fa::Problem<'p> {
    let t = b.seq;
    let AttnShape { heads, kv_heads, head_dim, window } = shape;
    fa::Problem {
        batch: b.batch,
        heads,
        kv_heads,
        window,
        head_dim,
        tq: t,
        tk: t,
        q_pos0: 0,
        q: View::bthd(q, t, heads, head_dim),
        k: View::bthd(k, t, kv_heads, head_dim),
        v: View::bthd(v, t, kv_heads, head_dim),
        cq: c,
        ck: c,
        vis: b.vis(),
        scale: 1.0 / (head_dim as f32).sqrt(),
        prune,
    }
}

/// ACP thresholds with U from the largest query and key norms (models without QK-norm), on host
/// q [B, T, H·D] and k [B, T, H_kv·D]: U of query head h from the largest norm of the k/v head it
/// reads. The CPU backend's, and the GPU's where its kernel does not apply.
#[allow(clippy::too_many_arguments)]
pub(crate) fn norm_thresholds(
    q: &[f32],
    k: &[f32],
    batch: usize,
    seq: usize,
    start: Option<&[usize]>,
    shape: AttnShape,
    n_keys: usize,
    log_eps: f32,
) -> Vec<f32> {
    let zeros = vec![0.0f32; batch * shape.heads * seq];
    let b = CpuBatch::with_start(batch, seq, start);
    // v is not read: k stands in for it (same shape)
    let u = fa::logit_bound_from_norms(&problem(&b, q, k, k, &zeros, None, shape));
    fa::prune_thresholds(&u, n_keys, log_eps)
}
