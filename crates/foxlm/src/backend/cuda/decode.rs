//! Inference on the CUDA backend: the decode cache (kernels/decode.cu), attention of a chunk
//! against it, the output head's logits without a loss, and choosing tokens on the device.

use super::{bf16, dtod, fast_attention_dims, grid, words, Cuda, Family, GpuBatch, GpuCache, GpuLayerState};
use crate::model::attention::ops::{AttnShape, Tiles};
use crate::model::cache::LayerState;
use crate::model::hgrn2::cuda::GpuHgrn2State;
use crate::model::mamba::cuda::GpuMambaState;
use crate::model::mamba2::cuda::GpuMamba2State;
use crate::model::Mixer;
use crate::model::{Linear, Model};
use anyhow::{anyhow, ensure, Result};
use fox_kernels::cuda::attention::{self as ga, DType, DevProblem, DevView, DevVisibility, FwdKernel};
use fox_kernels::cuda::compile::DECODE;
use fox_kernels::cuda::cudarc::driver::CudaSlice;
use fox_kernels::cuda::kargs::{self, args, kname};
use fox_kernels::cuda::{attention_f32, ops, Elem, Gpu};

/// How the next token is chosen on the device (see `fox_sample` in kernels/decode.cu).
#[derive(Clone, Copy, Debug)]
pub struct DeviceSampling {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub seed: u64,
}

/// dst [b, w] = src [b, t, w] at position t − 1.
pub(crate) fn last_rows_on<T: Elem>(
    gpu: &Gpu,
    dst: &mut CudaSlice<T>,
    src: &CudaSlice<T>,
    b: usize,
    t: usize,
    w: usize,
) -> Result<()> {
    ensure!(dst.len() >= b * w && src.len() >= b * t * w, "last_rows: buffers too short");
    let (bi, ti, wi) = (i32_of(b, "batch")?, i32_of(t, "positions")?, i32_of(w, "width")?);
    kargs::launch(gpu, &DECODE, &kname::<T>("fox_last_rows"), grid(b * w), &args![gpu; dst, src, bi, ti, wi])
}

fn i32_of(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| anyhow!("{what} = {v} does not fit the kernels' 32-bit indices"))
}

impl<T: Elem> Cuda<T> {
    /// An empty inference state for every layer: `batch` rows of up to `cap` positions (an
    /// attention layer's k, v of the H_kv k/v heads and c of the H query heads; every position
    /// even with a sliding window).
    pub fn new_caches(&self, model: &Model, batch: usize, cap: usize) -> Result<Vec<GpuLayerState<T>>> {
        let cap = cap.max(1);
        model
            .layers
            .iter()
            .map(|blk| match &blk.mixer {
                Mixer::Attention(l) => {
                    let (h, hkv, d) = (l.heads, l.kv_heads, l.head_dim);
                    // The kernels index rows of c [B·H·cap] and of k, v [B·H_kv·cap] in 32 bits (H ≥ H_kv).
                    i32_of(batch * h * cap, "batch × heads × cache positions")?;
                    let n = GpuCache::<T>::lens(batch, h, hkv, d, cap);
                    Ok(LayerState::Attention(GpuCache {
                        k: self.gpu.zeros(n.kv)?,
                        v: self.gpu.zeros(n.kv)?,
                        c: self.gpu.zeros(n.c)?,
                        k_shift: self.gpu.zeros(n.shift)?,
                        v_shift: self.gpu.zeros(n.shift)?,
                        len: 0,
                        cap,
                        batch,
                        heads: h,
                        kv_heads: hkv,
                        head_dim: d,
                        staged: false,
                    }))
                }
                Mixer::Mamba2(l) => Ok(LayerState::Mamba2(GpuMamba2State::new(&self.gpu, batch, *l.sizes())?)),
                Mixer::Mamba(l) => Ok(LayerState::Mamba(GpuMambaState::new(&self.gpu, batch, *l.sizes())?)),
                Mixer::DeltaNet(l) => Ok(LayerState::DeltaNet(crate::model::deltanet::cuda::GpuDeltaNetState::new(
                    &self.gpu,
                    batch,
                    *l.sizes(),
                )?)),
                Mixer::Hgrn2(l) => Ok(LayerState::Hgrn2(GpuHgrn2State::new(&self.gpu, batch, *l.sizes())?)),
            })
            .collect()
    }

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
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_cached(
        &mut self,
        o: &mut CudaSlice<T>,
        lse: &mut CudaSlice<f32>,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        c: &CudaSlice<f32>,
        prune: Option<&CudaSlice<f32>>,
        b: &GpuBatch,
        cache: &mut GpuCache<T>,
        shape: AttnShape,
    ) -> Result<Tiles> {
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
        let opts = super::attn_options(shape);
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
                let applied =
                    ga::decode_into_opts(&self.gpu, &p, opts, &ov, lse, scratch, self.decode_pos.as_ref(), then)?;
                self.fused.set_output_applied(applied);
            } else {
                ensure!(self.decode_pos.is_none(), "a captured decode step must have at most 16 positions per row");
                ga::forward_opts(&self.gpu, &p, opts, &ov, lse, FwdKernel::Tiled, false)?;
            }
            return Ok(Tiles::default());
        }
        ensure!(self.decode_pos.is_none(), "CUDA graphs of a decode step need the bf16 attention kernels");
        let kc = (&cache.k as &dyn std::any::Any).downcast_ref::<CudaSlice<f32>>();
        let vc = (&cache.v as &dyn std::any::Any).downcast_ref::<CudaSlice<f32>>();
        let (qf, of) = (super::as_f32(q), super::as_f32_mut(o));
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

    /// Logits [rows, vocab] (f32, on the host) of final hidden states [rows, d], a chunk of the
    /// head's rows at a time.
    pub fn logits(&mut self, hidden: &CudaSlice<T>, lm_head: &Linear, rows: usize) -> Result<Vec<f32>> {
        self.logits_from(hidden, lm_head, 0, rows)
    }

    /// [`Cuda::logits`] of rows `row0..row0 + rows` of `hidden`.
    pub fn logits_from(
        &mut self,
        hidden: &CudaSlice<T>,
        lm_head: &Linear,
        row0: usize,
        rows: usize,
    ) -> Result<Vec<f32>> {
        self.mark(Family::Head)?;
        let (d, vocab) = (lm_head.in_features, lm_head.out_features);
        ensure!(
            hidden.len() >= (row0 + rows) * d,
            "logits: hidden holds {} values, {}×{d} expected",
            hidden.len(),
            row0 + rows
        );
        let mut out = Vec::with_capacity(rows * vocab);
        for r0 in (0..rows).step_by(self.head_rows) {
            let m = self.head_rows.min(rows - r0);
            self.head_on_rows(hidden, lm_head, row0 + r0, m)?;
            out.extend(self.download_logits(m, vocab)?);
        }
        Ok(out)
    }

    /// The head's f32 logits of rows `row0..row0 + m` of `hidden` (m ≤ head_rows) into the head
    /// chunk buffer, `vocab_pad` apart.
    fn head_on_rows(&mut self, hidden: &CudaSlice<T>, lm_head: &Linear, row0: usize, m: usize) -> Result<()> {
        let (d, vpad) = (lm_head.in_features, self.vocab_pad);
        ensure!(m <= self.head_rows, "{m} rows exceed the head's chunk of {}", self.head_rows);
        dtod(&self.gpu, hidden, row0 * d, &mut self.head_x, 0, m * d)?;
        let w = self.params[lm_head.weight.0].copy.as_ref().ok_or_else(|| anyhow!("lm_head has no copy"))?;
        self.gemm.linear_fwd::<T, f32>(&mut self.head_logits, false, &self.head_x, w, m, d, vpad)
    }

    /// Scoring on the device: for rows `row0..row0 + rows` of `hidden`, the log-probability of
    /// each row's target (NaN for a target outside the vocabulary) and its `k` most likely tokens
    /// with theirs (`fox_token_logprobs` in kernels/decode.cu): (logprob [rows], ids [rows, k],
    /// logprobs [rows, k]). What `logits_from` + a host log-softmax give, without moving the
    /// vocabulary's logits to the host.
    #[allow(clippy::type_complexity)]
    pub fn token_logprobs(
        &mut self,
        hidden: &CudaSlice<T>,
        lm_head: &Linear,
        row0: usize,
        targets: &[u32],
        k: usize,
    ) -> Result<(Vec<f32>, Vec<u32>, Vec<f32>)> {
        self.mark(Family::Head)?;
        let rows = targets.len();
        let (d, vocab, vpad) = (lm_head.in_features, lm_head.out_features, self.vocab_pad);
        ensure!(
            hidden.len() >= (row0 + rows) * d,
            "logprobs: hidden holds {} values, {}×{d} expected",
            hidden.len(),
            row0 + rows
        );
        let k = k.min(vocab);
        if rows == 0 {
            return Ok((Vec::new(), Vec::new(), Vec::new()));
        }
        let gpu = self.gpu.clone();
        let tg: Vec<i32> = targets.iter().map(|&t| i32::try_from(t).unwrap_or(-1)).collect();
        let dt = gpu.upload(&tg)?;
        let lp = gpu.zeros::<f32>(rows)?;
        let (ti, tl) = (gpu.zeros::<i32>((rows * k).max(1))?, gpu.zeros::<f32>((rows * k).max(1))?);
        for r0 in (0..rows).step_by(self.head_rows) {
            let m = self.head_rows.min(rows - r0);
            self.head_on_rows(hidden, lm_head, row0 + r0, m)?;
            let (ldi, vi, ki) = (vpad as i32, vocab as i32, k as i32);
            // m rows of vpad logits in head_logits; targets, lp, ti, tl hold rows (× k) values and
            // the offsets stay below them (r0 + m <= rows).
            let (pt, plp) = (self.dptr(&dt) + 4 * r0 as u64, self.dptr(&lp) + 4 * r0 as u64);
            let (pti, ptl) = (self.dptr(&ti) + 4 * (r0 * k) as u64, self.dptr(&tl) + 4 * (r0 * k) as u64);
            let args = args![&gpu; self.head_logits, ldi, vi, pt, ki, plp, pti, ptl];
            kargs::launch(&gpu, &DECODE, "fox_token_logprobs", kargs::plain_config((m as u32, 1, 1), 256, 0), &args)?;
        }
        let (lp, ti, tl) = (gpu.download(&lp)?, gpu.download(&ti)?, gpu.download(&tl)?);
        gpu.sync()?;
        let n = rows * k;
        Ok((lp, ti[..n].iter().map(|&i| i.max(0) as u32).collect(), tl[..n].to_vec()))
    }

    /// The logits of each row's last position, left on the device in the head's chunk buffer
    /// ([`Cuda::sample`] reads them), or copied to the host with `download`.
    pub fn last_logits(
        &mut self,
        hidden: &CudaSlice<T>,
        lm_head: &Linear,
        b: &GpuBatch,
        download: bool,
    ) -> Result<Option<Vec<f32>>> {
        self.mark(Family::Head)?;
        let (d, vocab, vpad) = (lm_head.in_features, lm_head.out_features, self.vocab_pad);
        ensure!(b.batch <= self.head_rows, "{} rows exceed the head's chunk of {}", b.batch, self.head_rows);
        // A decode step's hidden states are the last positions already.
        let x = if b.seq == 1 {
            hidden
        } else {
            last_rows_on(&self.gpu, &mut self.head_x, hidden, b.batch, b.seq, d)?;
            &self.head_x
        };
        let w = self.params[lm_head.weight.0].copy.as_ref().ok_or_else(|| anyhow!("lm_head has no copy"))?;
        if self.gemv && ops::gemv_fits::<T>(b.batch, d) {
            ops::gemv::<T, f32>(&self.gpu, &mut self.head_logits, x, w, b.batch, d, vpad)?;
        } else {
            self.gemm.linear_fwd::<T, f32>(&mut self.head_logits, false, x, w, b.batch, d, vpad)?;
        }
        if !download {
            return Ok(None);
        }
        Ok(Some(self.download_logits(b.batch, vocab)?))
    }

    /// Chooses each row's next token from the logits of [`Cuda::last_logits`] into `out` [B]; with
    /// `next`, also into that batch's token ids (the next decode step's input).
    pub fn sample(
        &mut self,
        out: &mut CudaSlice<i32>,
        next: Option<&mut GpuBatch>,
        rows: usize,
        s: &DeviceSampling,
        step: usize,
    ) -> Result<()> {
        self.mark(Family::CrossEntropy)?;
        ensure!(out.len() >= rows && rows <= self.head_rows, "sample: {rows} rows do not fit");
        let pn = match next {
            Some(b) => {
                ensure!(b.ids.len() >= rows, "sample: the next batch holds fewer than {rows} ids");
                b.batch = rows;
                b.seq = 1;
                self.dptr(&b.ids)
            }
            None => 0,
        };
        let (vocab, ld) = (self.vocab as i32, self.vocab_pad as i32);
        let (temp, k, top_p, seed) = (s.temperature, s.top_k.min(i32::MAX as usize) as i32, s.top_p, s.seed);
        // The random stream is keyed by (seed, cached length, row): the same in both decode modes.
        let (lenp, step) = (self.lenp(), step as i32);
        // The head's logits hold head_rows ≥ rows rows.
        let gpu = &self.gpu;
        let args = args![gpu; out, pn, self.head_logits, vocab, ld, temp, k, top_p, seed, lenp, step];
        kargs::launch(gpu, &DECODE, "fox_sample", kargs::plain_config((rows as u32, 1, 1), 1024, 0), &args)
    }

    pub(crate) fn lenp(&self) -> u64 {
        self.decode_pos.as_ref().map_or(0, |c| self.dptr(c))
    }

    /// From here on the cache kernels, the decode kernel and the sampler read the cached length
    /// from the device, starting at `len` (for capturing a decode step as a CUDA graph).
    pub fn begin_device_positions(&mut self, len: usize) -> Result<()> {
        self.decode_pos = Some(self.gpu.upload(&[i32_of(len, "cache length")?])?);
        Ok(())
    }

    /// Back to host-side lengths; returns the device's final length.
    pub fn end_device_positions(&mut self) -> Result<Option<usize>> {
        match self.decode_pos.take() {
            Some(p) => Ok(Some(self.gpu.download(&p)?[0].max(0) as usize)),
            None => Ok(None),
        }
    }

    /// The end of a decode step on the device: cached length and each row's RoPE position + 1.
    pub fn advance_positions(&mut self, b: &mut GpuBatch) -> Result<()> {
        let lp = self.decode_pos.as_ref().ok_or_else(|| anyhow!("no device-side positions"))?;
        let bi = i32_of(b.batch, "batch")?;
        ensure!(b.positions.len() >= b.batch, "positions too short");
        kargs::launch(&self.gpu, &DECODE, "fox_decode_advance", grid(b.batch), &args![&self.gpu; lp, b.positions, bi])
    }

    /// The per-row losses of the last [`Backend::head_loss`](crate::backend::Backend::head_loss)
    /// (0 where a row had no target), on the host.
    pub fn row_losses(&mut self, rows: usize) -> Result<Vec<f32>> {
        ensure!(rows <= self.losses.len(), "row_losses: {rows} rows exceed the {} planned", self.losses.len());
        let v = self.gpu.stream().clone_dtoh(&self.losses.slice(0..rows)).map_err(|e| anyhow!("{e:?}"))?;
        self.gpu.sync()?;
        self.loss_rows = 0;
        Ok(v)
    }
}
