//! An attention layer's decode cache on the GPU ([`GpuCache`], kernels/decode.cu): appending a
//! chunk's keys to it and attending to what it holds.

use super::ops::{AttnIn, AttnShape, Tiles};
use crate::backend::cuda::decode::i32_of;
use crate::backend::cuda::{as_f32, as_f32_mut, bf16, fast_attention_dims, grid, words, Cuda, GpuBatch};
use anyhow::{anyhow, ensure, Result};
use fox_kernels::cuda::attention::{self as ga, DType, DevProblem, DevView, DevVisibility, FwdKernel};
use fox_kernels::cuda::compile::DECODE;
use fox_kernels::cuda::cudarc::driver::CudaSlice;
use fox_kernels::cuda::kargs::{self, args, kname};
use fox_kernels::cuda::{attention_f32, ops, Elem};

/// One layer's decode cache on the device (kernels/decode.cu): keys and values [B, H_kv, cap, D]
/// in the activation dtype, the running gate sums c [B, H, cap] in f32 (per query head, as the
/// gate; so a step adds one log f and never recomputes a prefix sum), and each row's last unmixed
/// k̃, ṽ [B, H_kv·D] for KV-shift. A sliding window keeps every position: the attention kernels
/// mask the keys outside it.
pub struct GpuCache<T> {
    pub k: CudaSlice<T>,
    pub v: CudaSlice<T>,
    pub c: CudaSlice<f32>,
    pub k_shift: CudaSlice<T>,
    pub v_shift: CudaSlice<T>,
    /// Positions filled (the same for every row: rows are left-padded to a common length).
    pub len: usize,
    pub cap: usize,
    pub batch: usize,
    /// Query heads H (of c) and k/v heads H_kv (of k, v and the KV-shift states).
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The current step's k, v and c are in the cache already (a fused decode step wrote them),
    /// so its attention only reads.
    pub staged: bool,
}

/// Element counts of one layer's cache buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLens {
    /// k and v, each.
    pub kv: usize,
    pub c: usize,
    /// k_shift and v_shift, each.
    pub shift: usize,
}

crate::model::cache::held_in_fields!([T] GpuCache<T>);

impl<T: Elem> GpuCache<T> {
    /// What [`Cuda::new_caches`] allocates per layer for `batch` rows of `cap` positions.
    pub fn lens(batch: usize, heads: usize, kv_heads: usize, head_dim: usize, cap: usize) -> CacheLens {
        CacheLens { kv: batch * kv_heads * cap * head_dim, c: batch * heads * cap, shift: batch * kv_heads * head_dim }
    }

    /// Device bytes of one layer's cache.
    pub fn bytes(batch: usize, heads: usize, kv_heads: usize, head_dim: usize, cap: usize) -> usize {
        let l = Self::lens(batch, heads, kv_heads, head_dim, cap);
        (2 * l.kv + 2 * l.shift) * std::mem::size_of::<T>() + l.c * std::mem::size_of::<f32>()
    }
}

impl<T: Elem> Cuda<T> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn kv_shift_prev(
        &mut self,
        out: &mut CudaSlice<T>,
        x: &CudaSlice<T>,
        alpha: &CudaSlice<T>,
        prev: &CudaSlice<T>,
        b: &GpuBatch,
        heads: usize,
        head_dim: usize,
        len: usize,
    ) -> Result<()> {
        let (bb, t, w) = (b.batch, b.seq, heads * head_dim);
        ensure!(
            out.len() >= bb * t * w && x.len() >= bb * t * w && alpha.len() >= bb * t * heads && prev.len() >= bb * w,
            "kv_shift_prev: buffers too short"
        );
        let (bi, ti, hi, di) = (i32_of(bb, "batch")?, i32_of(t, "positions")?, heads as i32, head_dim as i32);
        let (lenp, len) = (self.lenp(), i32_of(len, "cache length")?);
        let gpu = &self.gpu;
        let args = args![gpu; out, x, alpha, prev, bi, ti, hi, di, lenp, len];
        kargs::launch(gpu, &DECODE, &kname::<T>("fox_kv_shift_prev"), grid(bb * w), &args)
    }

    pub(crate) fn cache_c_offset(
        &mut self,
        c: &mut CudaSlice<f32>,
        cache: &GpuCache<T>,
        b: &GpuBatch,
        heads: usize,
    ) -> Result<()> {
        let (bh, t) = (b.batch * heads, b.seq);
        ensure!(c.len() >= bh * t && cache.c.len() >= bh * cache.cap, "cache_c_offset: buffers too short");
        let (bhi, ti, capi) = (i32_of(bh, "batch × heads")?, i32_of(t, "positions")?, i32_of(cache.cap, "cache")?);
        let (lenp, len) = (self.lenp(), cache.len as i32);
        let args = args![&self.gpu; c, cache.c, bhi, ti, capi, lenp, len];
        kargs::launch(&self.gpu, &DECODE, "fox_cache_c_offset", grid(bh * t), &args)
    }

    /// Appends the chunk's k, v, c to the cache, then its queries attend to every cached key (the
    /// kernels mask the keys outside a sliding window; query head h reads k/v head h / (H / H_kv)).
    pub(crate) fn attention_cached(
        &mut self,
        o: &mut CudaSlice<T>,
        lse: &mut CudaSlice<f32>,
        x: AttnIn<'_, CudaSlice<T>, CudaSlice<f32>>,
        b: &GpuBatch,
        cache: &mut GpuCache<T>,
        shape: AttnShape,
    ) -> Result<Tiles> {
        let AttnIn { q, k, v, c, prune } = x;
        let (heads, kv_heads, head_dim) = (shape.heads, shape.kv_heads, shape.head_dim);
        let (bb, t) = (b.batch, b.seq);
        let (past, cap) = (cache.len, cache.cap);
        ensure!(
            (bb, heads, kv_heads, head_dim) == (cache.batch, cache.heads, cache.kv_heads, cache.head_dim),
            "decode cache of [batch {}, heads {}, kv_heads {}, head_dim {}] used for a layer of [{bb}, {heads}, \
             {kv_heads}, {head_dim}]",
            cache.batch,
            cache.heads,
            cache.kv_heads,
            cache.head_dim
        );
        ensure!(past + t <= cap, "the decode cache holds {cap} positions; {past} + {t} were asked for");
        let (n, nkv) = (bb * t * heads * head_dim, bb * t * kv_heads * head_dim);
        ensure!(
            q.len() >= n && k.len() >= nkv && v.len() >= nkv && c.len() >= bb * heads * t,
            "attention_cached: chunk buffers too short"
        );
        let staged = cache.staged;
        if staged {
            // A fused decode step appended this position already.
            ensure!(t == 1, "a staged decode cache continues one position per row, not {t}");
            cache.staged = false;
        } else {
            let (bi, ti, di) = (bb as i32, i32_of(t, "positions")?, head_dim as i32);
            let (hi, hkvi) = (heads as i32, kv_heads as i32);
            let (capi, lenp, len) = (cap as i32, self.lenp(), past as i32);
            // The cache holds B·H_kv·cap rows of k, v and B·H·cap of c, and past + t <= cap.
            let gpu = &self.gpu;
            let args = args![gpu; cache.k, cache.v, cache.c, k, v, c, bi, ti, hi, hkvi, di, capi, lenp, len];
            kargs::launch(gpu, &DECODE, &kname::<T>("fox_cache_append"), grid(nkv.max(bb * heads * t)), &args)?;
        }
        cache.len += t;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let start = self.start(b);
        let opts = super::cuda::attn_options(shape);
        if bf16::<T>() && fast_attention_dims(head_dim) {
            let (qv, kv, vv, ov) = (words(q)?, words(&cache.k)?, words(&cache.v)?, words(o)?);
            // The cache's keys are [B, H_kv, cap, D] with gate sums [B, H, cap]: tk = cap, and
            // causality (query r at past + r) hides the positions not yet filled.
            let p = DevProblem {
                batch: bb,
                heads,
                head_dim,
                tq: t,
                tk: cap,
                q_pos0: past,
                dtype: DType::Bf16,
                q: DevView::bthd(&qv, t, heads, head_dim),
                k: DevView::bhtd(&kv, cap, head_dim, kv_heads),
                v: DevView::bhtd(&vv, cap, head_dim, kv_heads),
                cq: c,
                ck: &cache.c,
                vis: match start {
                    Some(s) => DevVisibility::LeftPadded(s),
                    None => DevVisibility::All,
                },
                scale,
                prune,
            };
            if t <= 16 {
                // A decode step: the split-K kernel with partials (per query head) allocated once.
                let shape = (bb * heads, head_dim, cap);
                if self.decode_scratch.as_ref().is_none_or(|s| s.shape != shape) {
                    self.decode_scratch = Some(ga::DecodeScratch::new(&self.gpu, bb, heads, head_dim, cap)?);
                }
                let scratch = self.decode_scratch.as_ref().ok_or_else(|| anyhow!("decode scratch"))?;
                // A fused step's output norm and gate go with the attention where its kernel can.
                let then = if staged { self.fused.take_output() } else { None };
                let applied = ga::decode_into(&self.gpu, &p, opts, &ov, lse, scratch, self.decode_pos.as_ref(), then)?;
                self.fused.set_output_applied(applied);
            } else {
                ensure!(self.decode_pos.is_none(), "a captured decode step must have at most 16 positions per row");
                ga::forward(&self.gpu, &p, opts, &ov, lse, FwdKernel::Tiled, false)?;
            }
            return Ok(Tiles::default());
        }
        ensure!(self.decode_pos.is_none(), "CUDA graphs of a decode step need the bf16 attention kernels");
        let kc = (&cache.k as &dyn std::any::Any).downcast_ref::<CudaSlice<f32>>();
        let vc = (&cache.v as &dyn std::any::Any).downcast_ref::<CudaSlice<f32>>();
        let (qf, of) = (as_f32(q), as_f32_mut(o));
        match (qf, of, kc, vc) {
            (Some(qf), Some(of), Some(kc), Some(vc)) => attention_f32::forward_f32_cached(
                &self.gpu,
                bb,
                heads,
                t,
                head_dim,
                opts,
                qf,
                c,
                (kc, vc, &cache.c),
                cap,
                past,
                start,
                scale,
                prune,
                of,
                lse,
            )?,
            _ => {
                // bf16 at a head dim the fast kernels lack (small test models): f32 copies.
                let m = bb * kv_heads * cap * head_dim;
                let (mut qf, mut kf, mut vf) = (self.gpu.zeros(n)?, self.gpu.zeros(m)?, self.gpu.zeros(m)?);
                let mut of = self.gpu.zeros::<f32>(n)?;
                ops::cast_to_f32(&self.gpu, &mut qf, q, n)?;
                ops::cast_to_f32(&self.gpu, &mut kf, &cache.k, m)?;
                ops::cast_to_f32(&self.gpu, &mut vf, &cache.v, m)?;
                attention_f32::forward_f32_cached(
                    &self.gpu,
                    bb,
                    heads,
                    t,
                    head_dim,
                    opts,
                    &qf,
                    c,
                    (&kf, &vf, &cache.c),
                    cap,
                    past,
                    start,
                    scale,
                    prune,
                    &mut of,
                    lse,
                )?;
                ops::cast_from_f32(&self.gpu, o, &of, n)?;
            }
        }
        Ok(Tiles::default())
    }
}

#[cfg(test)]
mod tests {
    use super::GpuCache;
    use crate::model::attention::kv_cache::KvCache;

    /// The GPU cache holds what the CPU's holds (k, v and the KV-shift states per k/v head, c per
    /// query head), in the activation dtype for k, v and the shift states.
    #[test]
    fn gpu_cache_sizes_follow_the_kv_heads() {
        for (b, h, hkv, d, cap) in [(1, 4, 4, 16, 9), (2, 4, 2, 64, 300), (3, 8, 1, 128, 17), (2, 6, 3, 24, 1)] {
            let l = GpuCache::<f32>::lens(b, h, hkv, d, cap);
            assert_eq!((l.kv, l.c, l.shift), (b * hkv * cap * d, b * h * cap, b * hkv * d));
            assert_eq!(GpuCache::<f32>::bytes(b, h, hkv, d, cap), KvCache::bytes_for(b, h, hkv, d, cap));
            let bf16 = GpuCache::<half::bf16>::bytes(b, h, hkv, d, cap);
            assert_eq!(bf16, 2 * (2 * l.kv + 2 * l.shift) + 4 * l.c);
        }
        // The memory checks of the commands count the same bytes (f32).
        let mut cfg = crate::presets::Variant::FoxPro.config(256, 3, 8);
        cfg.num_kv_heads = Some(2);
        let per_layer = GpuCache::<f32>::bytes(2, 8, 2, 32, 50) as u128;
        assert_eq!(3 * per_layer, crate::validate::kv_cache_bytes(&cfg, 2, 50));
        // Grouped-query attention shrinks k and v by the group, not c.
        let (mha, gqa) =
            (GpuCache::<half::bf16>::lens(2, 8, 8, 64, 100), GpuCache::<half::bf16>::lens(2, 8, 2, 64, 100));
        assert_eq!((mha.kv / gqa.kv, mha.shift / gqa.shift, mha.c), (4, 4, gqa.c));
    }
}
