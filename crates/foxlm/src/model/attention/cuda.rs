//! The attention family's operations on the CUDA backend: the forget gate, KV-shift and RoPE from
//! `fox_kernels::cuda::ops`, Forgetting Attention from the FlashAttention-style kernels (bf16, head
//! dim 64/128) or the simple f32 kernel, and the fused decode step (`fused_cuda.rs`).

use super::kv_cache_cuda::GpuCache;
use super::ops::{AttnGrads, AttnIn, AttnOps, AttnShape, Tiles};
use crate::backend::cuda::decode;
use crate::backend::cuda::{as_f32, as_f32_mut, bf16, fast_attention_dims, words, Cuda, GpuBatch};
use crate::backend::Family;
use crate::tensor::{ParamId, ParamKind};
use anyhow::{anyhow, ensure, Result};
use fox_kernels::cuda::attention::{self as ga, DType, DevProblem, DevView, DevVisibility, FwdKernel};
use fox_kernels::cuda::attention_f32::{self, F32Grads, F32Problem};
use fox_kernels::cuda::compile::MODEL;
use fox_kernels::cuda::cudarc::driver::{CudaSlice, CudaView, LaunchConfig};
use fox_kernels::cuda::kargs::{self, args};
use fox_kernels::cuda::ops;
use fox_kernels::cuda::Elem;

impl<T: Elem> AttnOps for Cuda<T> {
    type KvCache = GpuCache<T>;

    fn kv_shift_fwd(
        &mut self,
        out: &mut CudaSlice<T>,
        x: &CudaSlice<T>,
        alpha: &CudaSlice<T>,
        b: &GpuBatch,
        cache: Option<&GpuCache<T>>,
        value: bool,
        heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        // Left padding matters only on the chunk that starts the sequence.
        let start = if b.past == 0 { self.start(b) } else { None };
        let kv = ops::KvShift { x, alpha, start, batch: b.batch, seq: b.seq, heads, head_dim };
        ops::kv_shift_fwd(&self.gpu, out, kv)?;
        match cache {
            Some(c) if c.len > 0 => {
                let prev = if value { &c.v_shift } else { &c.k_shift };
                self.kv_shift_prev(out, x, alpha, prev, b, heads, head_dim, c.len)
            }
            _ => Ok(()),
        }
    }
    fn kv_shift_bwd(
        &mut self,
        dx: &mut CudaSlice<T>,
        dalpha: &mut CudaSlice<T>,
        dout: &CudaSlice<T>,
        x: &CudaSlice<T>,
        alpha: &CudaSlice<T>,
        b: &GpuBatch,
        heads: usize,
        head_dim: usize,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let kv = ops::KvShift { x, alpha, start: self.start(b), batch: b.batch, seq: b.seq, heads, head_dim };
        ops::kv_shift_bwd(&self.gpu, dx, dalpha, dout, kv)
    }
    fn rope(
        &mut self,
        x: &mut CudaSlice<T>,
        b: &GpuBatch,
        heads: usize,
        head_dim: usize,
        base: f64,
        inverse: bool,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        ops::rope_apply(&self.gpu, x, &b.positions, b.batch * b.seq, heads, head_dim, base, inverse)
    }

    fn fgate_bias(
        &mut self,
        logit: &mut CudaSlice<f32>,
        bias: ParamId,
        rows: usize,
        heads: usize,
        add: bool,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let bv = &self.params[bias.0].master;
        if add {
            ops::add_bias_rows(&self.gpu, logit, bv, rows, heads)
        } else {
            ops::fill_rows(&self.gpu, logit, bv, rows, heads)
        }
    }
    fn fgate_bias_bwd(&mut self, bias: ParamId, dlogit: &CudaSlice<f32>, rows: usize, heads: usize) -> Result<()> {
        self.mark(Family::Other)?;
        if self.kinds[bias.0] == ParamKind::Frozen {
            return Ok(());
        }
        ops::col_sum_acc(&self.gpu, &mut self.params[bias.0].grad, dlogit, rows, heads)
    }
    fn log_fgate_fwd(&mut self, a: &mut CudaSlice<f32>, logit: &CudaSlice<f32>, n: usize) -> Result<()> {
        self.mark(Family::Other)?;
        ops::log_fgate_fwd(&self.gpu, a, logit, n)
    }
    fn log_fgate_bwd(
        &mut self,
        dlogit: &mut CudaSlice<f32>,
        da: &CudaSlice<f32>,
        logit: &CudaSlice<f32>,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        ops::log_fgate_bwd(&self.gpu, dlogit, da, logit, logit.len())
    }
    fn prefix_sum_fwd(
        &mut self,
        c: &mut CudaSlice<f32>,
        a: &CudaSlice<f32>,
        b: &GpuBatch,
        cache: Option<&GpuCache<T>>,
        heads: usize,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let vis = if b.past == 0 { self.vis(b) } else { DevVisibility::All };
        ga::fgate_prefix_sum_fwd(&self.gpu, a, c, vis, b.batch, b.seq, heads)?;
        match cache {
            Some(cache) if cache.len > 0 => self.cache_c_offset(c, cache, b, heads),
            _ => Ok(()),
        }
    }
    fn prefix_sum_bwd(
        &mut self,
        da: &mut CudaSlice<f32>,
        dc: &CudaSlice<f32>,
        b: &GpuBatch,
        heads: usize,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        ga::fgate_prefix_sum_bwd(&self.gpu, dc, None, da, self.vis(b), b.batch, b.seq, heads)
    }

    fn acp_thresholds(
        &mut self,
        prune: &mut CudaSlice<f32>,
        qk_norm: Option<(ParamId, ParamId)>,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        b: &GpuBatch,
        shape: AttnShape,
        n_keys: usize,
        log_eps: f32,
    ) -> Result<()> {
        // A window only shortens the rows the bound is for: it holds as it is.
        let (heads, kv_heads, head_dim) = (shape.heads, shape.kv_heads, shape.head_dim);
        ensure!(
            kv_heads > 0 && heads.is_multiple_of(kv_heads),
            "ACP thresholds: num_kv_heads {kv_heads} must divide num_heads {heads}"
        );
        ensure!(prune.len() >= b.batch * heads, "ACP thresholds: buffer too short");
        self.mark(Family::Attention)?;
        let ln_n = (n_keys as f32).ln();
        match qk_norm {
            Some((qn, kn)) => {
                // q_norm is [H·d] or [d], k_norm [H_kv·d] or [d]: query head h reads k/v head
                // h / (H / H_kv), as the CPU's bound.
                let (wq_len, wk_len) = (self.numel[qn.0], self.numel[kn.0]);
                for (id, len, per_head, what) in
                    [(qn, wq_len, heads, "num_heads"), (kn, wk_len, kv_heads, "num_kv_heads")]
                {
                    ensure!(
                        len == head_dim || len == per_head * head_dim,
                        "ACP thresholds: {} holds {len} weights, neither head_dim {head_dim} (shared) nor {what} \
                         {per_head} × {head_dim}",
                        self.names[id.0]
                    );
                }
                let (wq, wk) = (&self.params[qn.0].master, &self.params[kn.0].master);
                let (pq, pk, po) = (self.dptr(wq), self.dptr(wk), self.dptr(prune));
                let cfg = LaunchConfig { grid_dim: (heads as u32, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
                let (lq, lk, h, hkv) = (wq_len as i32, wk_len as i32, heads as i32, kv_heads as i32);
                let (d, bb) = (head_dim as i32, b.batch as i32);
                // The weights hold the lengths passed (checked against H·d, H_kv·d or d above),
                // prune B·H floats (checked above).
                let args = args![&self.gpu; pq, pk, lq, lk, h, hkv, d, bb, ln_n, log_eps, po];
                kargs::launch(&self.gpu, &MODEL, "fox_acp_from_qk_norm", cfg, &args)
            }
            None if bf16::<T>() && fast_attention_dims(head_dim) => {
                let c = &self.delta; // any [B,H,T] f32 buffer: the bound reads only q and k
                let (qv, kv) = (words(q)?, words(k)?);
                let p = dev_problem(b, &qv, &kv, &kv, c, None, heads, kv_heads, head_dim);
                ga::acp_thresholds_from_norms(&self.gpu, &p, attn_options(shape), n_keys, log_eps, prune)
            }
            None => {
                // f32 checks and other head dims: the CPU's bound from the largest norms (q is
                // [B, T, H·D], k [B, T, H_kv·D]).
                let (qh, kh) = (self.gpu.download(q)?, self.gpu.download(k)?);
                let n = b.batch * b.seq;
                let (dq, dk) = (n * heads * head_dim, n * kv_heads * head_dim);
                ensure!(qh.len() >= dq && kh.len() >= dk, "ACP thresholds: q or k shorter than the batch");
                let (qh, kh): (Vec<f32>, Vec<f32>) =
                    (qh[..dq].iter().map(|v| v.to_f32()).collect(), kh[..dk].iter().map(|v| v.to_f32()).collect());
                let start = b.start_host.as_deref();
                let th = super::cpu::norm_thresholds(&qh, &kh, b.batch, b.seq, start, shape, n_keys, log_eps);
                self.gpu.write(prune, &th)
            }
        }
    }

    fn attention_fwd(
        &mut self,
        o: &mut CudaSlice<T>,
        lse: &mut CudaSlice<f32>,
        x: AttnIn<'_, CudaSlice<T>, CudaSlice<f32>>,
        b: &GpuBatch,
        cache: Option<&mut GpuCache<T>>,
        shape: AttnShape,
    ) -> Result<Tiles> {
        self.mark(Family::Attention)?;
        if let Some(cache) = cache {
            return self.attention_cached(o, lse, x, b, cache, shape);
        }
        let (heads, kv_heads, head_dim) = (shape.heads, shape.kv_heads, shape.head_dim);
        let AttnIn { q, k, v, c, prune } = x;
        let (bb, t) = (b.batch, b.seq);
        let scale = 1.0 / (head_dim as f32).sqrt();
        let (n, nkv) = (bb * t * heads * head_dim, bb * t * kv_heads * head_dim);
        let opts = attn_options(shape);
        if bf16::<T>() && fast_attention_dims(head_dim) {
            let (qv, kv, vv, ov) = (words(q)?, words(k)?, words(v)?, words(o)?);
            let p = dev_problem(b, &qv, &kv, &vv, c, prune, heads, kv_heads, head_dim);
            ga::forward(&self.gpu, &p, opts, &ov, lse, FwdKernel::Tiled, false)?;
            return Ok(Tiles::default());
        }
        let start = self.start(b);
        let (g, d) = (&self.gpu, head_dim);
        match self.f32_attn.as_mut() {
            None => {
                let err = || anyhow!("no attention path for {} at head dim {head_dim}", T::NAME);
                let (q, k, v) = (as_f32(q).ok_or_else(err)?, as_f32(k).ok_or_else(err)?, as_f32(v).ok_or_else(err)?);
                let o = as_f32_mut(o).ok_or_else(err)?;
                let p = F32Problem { b: bb, h: heads, t, d, opts, q, k, v, c, start, scale, prune };
                attention_f32::forward_f32(g, p, o, lse)?;
            }
            Some(f) => {
                ops::cast_to_f32(g, &mut f.q, q, n)?;
                ops::cast_to_f32(g, &mut f.k, k, nkv)?;
                ops::cast_to_f32(g, &mut f.v, v, nkv)?;
                let (fq, fk, fv, fo) = (&f.q, &f.k, &f.v, &mut f.o);
                let p = F32Problem { b: bb, h: heads, t, d, opts, q: fq, k: fk, v: fv, c, start, scale, prune };
                attention_f32::forward_f32(g, p, fo, lse)?;
                ops::cast_from_f32(g, o, &f.o, n)?;
            }
        }
        Ok(Tiles::default())
    }

    fn attention_bwd(
        &mut self,
        g: AttnGrads<'_, Self>,
        x: AttnIn<'_, CudaSlice<T>, CudaSlice<f32>>,
        o: &CudaSlice<T>,
        dout: &CudaSlice<T>,
        lse: &CudaSlice<f32>,
        b: &GpuBatch,
        shape: AttnShape,
    ) -> Result<()> {
        self.mark(Family::Attention)?;
        let AttnIn { q, k, v, c, prune } = x;
        let (heads, kv_heads, head_dim) = (shape.heads, shape.kv_heads, shape.head_dim);
        let (bb, t) = (b.batch, b.seq);
        let scale = 1.0 / (head_dim as f32).sqrt();
        let (n, nkv) = (bb * t * heads * head_dim, bb * t * kv_heads * head_dim);
        let opts = attn_options(shape);
        if bf16::<T>() && fast_attention_dims(head_dim) {
            let (qv, kv, vv, ov, dov) = (words(q)?, words(k)?, words(v)?, words(o)?, words(dout)?);
            let (dqv, dkv, dvv) = (words(g.dq)?, words(g.dk)?, words(g.dv)?);
            let p = dev_problem(b, &qv, &kv, &vv, c, prune, heads, kv_heads, head_dim);
            let out = ga::BwdOut { dq: &dqv, dk: &dkv, dv: &dvv, dcq: g.dc, dck: &self.dck, delta: &self.delta };
            ga::backward_into(&self.gpu, &p, opts, &ov, &dov, lse, out)?;
            // dc = dcq + dck (the reverse prefix sum wants their sum).
            let m = bb * heads * t;
            return ops::add_inplace::<f32>(&self.gpu, g.dc, &self.dck, m);
        }
        let start = self.start(b);
        // The f32 kernel's delta scratch is the one planned for the fast kernels (B·H·T).
        let (gpu, d) = (&self.gpu, head_dim);
        match self.f32_attn.as_mut() {
            None => {
                let err = || anyhow!("no attention path for {} at head dim {head_dim}", T::NAME);
                let (q, k, v) = (as_f32(q).ok_or_else(err)?, as_f32(k).ok_or_else(err)?, as_f32(v).ok_or_else(err)?);
                let (o, dout) = (as_f32(o).ok_or_else(err)?, as_f32(dout).ok_or_else(err)?);
                let dq = as_f32_mut(g.dq).ok_or_else(err)?;
                let dk = as_f32_mut(g.dk).ok_or_else(err)?;
                let dv = as_f32_mut(g.dv).ok_or_else(err)?;
                let p = F32Problem { b: bb, h: heads, t, d, opts, q, k, v, c, start, scale, prune };
                let grads = F32Grads { dq, dk, dv, dc: g.dc };
                attention_f32::backward_f32(gpu, p, o, dout, lse, grads, Some(&mut self.delta))
            }
            Some(f) => {
                for (dst, src, len) in
                    [(&mut f.q, q, n), (&mut f.k, k, nkv), (&mut f.v, v, nkv), (&mut f.o, o, n), (&mut f.dout, dout, n)]
                {
                    ops::cast_to_f32(gpu, dst, src, len)?;
                }
                let p = F32Problem { b: bb, h: heads, t, d, opts, q: &f.q, k: &f.k, v: &f.v, c, start, scale, prune };
                let grads = F32Grads { dq: &mut f.dq, dk: &mut f.dk, dv: &mut f.dv, dc: &mut *g.dc };
                attention_f32::backward_f32(gpu, p, &f.o, &f.dout, lse, grads, Some(&mut self.delta))?;
                ops::cast_from_f32(gpu, g.dq, &f.dq, n)?;
                ops::cast_from_f32(gpu, g.dk, &f.dk, nkv)?;
                ops::cast_from_f32(gpu, g.dv, &f.dv, nkv)
            }
        }
    }
    fn cache_shift_states(
        &mut self,
        cache: &mut GpuCache<T>,
        k_lin: &CudaSlice<T>,
        v_lin: &CudaSlice<T>,
        b: &GpuBatch,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        // k̃, ṽ are [B, T, H_kv·D]
        let w = cache.kv_heads * cache.head_dim;
        if k_lin.len() < b.batch * b.seq * w || v_lin.len() < b.batch * b.seq * w {
            // Without KV-shift the unmixed projections are not kept: nothing to remember.
            return Ok(());
        }
        decode::last_rows_on(&self.gpu, &mut cache.k_shift, k_lin, b.batch, b.seq, w)?;
        decode::last_rows_on(&self.gpu, &mut cache.v_shift, v_lin, b.batch, b.seq, w)
    }

    fn decode_attn_inputs(
        &mut self,
        layer: &crate::model::attention::ForgettingAttention,
        x: &CudaSlice<T>,
        b: &GpuBatch,
        a: &mut crate::model::attention::AttnActs<CudaSlice<T>, CudaSlice<f32>>,
        cache: &mut GpuCache<T>,
    ) -> Result<bool> {
        self.fused_inputs(layer, x, b, a, cache)
    }
    fn decode_attn_output(
        &mut self,
        layer: &crate::model::attention::ForgettingAttention,
        b: &GpuBatch,
        a: &mut crate::model::attention::AttnActs<CudaSlice<T>, CudaSlice<f32>>,
    ) -> Result<bool> {
        self.fused_output(layer, a, b.batch * b.seq)
    }
}

/// The fast kernels' problem for a full-sequence batch: q, k, v as [B, T, H·D] 16-bit views,
/// c [B, H, T], the batch's left padding.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dev_problem<'a>(
    b: &'a GpuBatch,
    q: &'a CudaView<'a, u16>,
    k: &'a CudaView<'a, u16>,
    v: &'a CudaView<'a, u16>,
    c: &'a CudaSlice<f32>,
    prune: Option<&'a CudaSlice<f32>>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
) -> DevProblem<'a> {
    let t = b.seq;
    DevProblem {
        batch: b.batch,
        heads,
        head_dim,
        tq: t,
        tk: t,
        q_pos0: 0,
        dtype: DType::Bf16,
        q: DevView::bthd(q, t, heads, head_dim),
        k: DevView::bthd(k, t, kv_heads, head_dim),
        v: DevView::bthd(v, t, kv_heads, head_dim),
        cq: c,
        ck: c,
        vis: match b.start_host {
            Some(_) => DevVisibility::LeftPadded(&b.start),
            None => DevVisibility::All,
        },
        scale: 1.0 / (head_dim as f32).sqrt(),
        prune,
    }
}

/// The attention kernels' options for a layer's shape.
pub(crate) fn attn_options(shape: AttnShape) -> ga::AttnOptions {
    ga::AttnOptions { kv_heads: (shape.kv_heads != shape.heads).then_some(shape.kv_heads), window: shape.window }
}
