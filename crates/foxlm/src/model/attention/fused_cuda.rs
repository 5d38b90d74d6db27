//! The attention layer's fused decode step on the GPU: which models the fused kernels cover,
//! stacking a layer's input projections at load, and a step's two launches (`fox_decode_in`:
//! the projections to the cache append; `fox_decode_out`: the output norm and gate). The device
//! state and the kernels' argument block are the backend's (`backend/cuda/fused.rs`).

use super::{AttnActs, Fgate, ForgettingAttention};
use crate::backend::cuda::fused::{head_blocks, off, DecodeIn, FusedDecode, FusedLayer};
use crate::backend::cuda::{dtod, Cuda, Family, GpuBatch};
use crate::config::Config;
use crate::model::attention::kv_cache_cuda::GpuCache;
use crate::model::{Linear, Model};
use crate::tensor::ParamId;
use anyhow::{anyhow, ensure, Result};
use fox_kernels::cuda::compile::DECODE;
use fox_kernels::cuda::cudarc::driver::CudaSlice;
use fox_kernels::cuda::kargs::{self, args, by_value, kname};
use fox_kernels::cuda::{attention as ga, ops, Elem};

/// Whether the fused kernels cover a model's layers: multi-head attention over every earlier key
/// (the kernels index k/v and the cache by query head and mask nothing), no ACP (its thresholds
/// come between the inputs and the attention), head dim up to a block of 1024 threads.
pub fn fused_decode_covers(c: &Config) -> bool {
    c.kv_heads() == c.num_heads && c.window_size.is_none() && c.log_pruning_tolerance.is_none() && c.head_dim() <= 1024
}

/// What `fox_decode_in` reads of a layer besides its projections: the QK-norm weights (0 without
/// QK-norm) with their groups of `head_dim` channels, and the forget gate's bias (0 without one).
pub(crate) struct DecodeInWeights {
    pub q_norm: u64,
    pub k_norm: u64,
    pub qn_groups: i32,
    pub kn_groups: i32,
    pub fgate_bias: u64,
}

impl<T: Elem> Cuda<T> {
    /// A layer's [`DecodeInWeights`], as device pointers (heads of `hd` channels).
    pub(crate) fn decode_in_weights(&self, l: &ForgettingAttention, hd: usize) -> DecodeInWeights {
        let master = |id: ParamId| self.dptr(&self.params[id.0].master);
        let groups = |id: ParamId| (self.numel[id.0] / hd).max(1) as i32;
        let (q_norm, k_norm, qn_groups, kn_groups) = match l.qk_norm {
            Some((qn, kn)) => (master(qn), master(kn), groups(qn), groups(kn)),
            None => (0, 0, 1, 1),
        };
        let fgate_bias = match &l.fgate {
            Fgate::Full { bias, .. } | Fgate::Bias(bias) => master(*bias),
            Fgate::None => 0,
        };
        DecodeInWeights { q_norm, k_norm, qn_groups, kn_groups, fgate_bias }
    }

    /// Stacks every layer's input projections for fused decode steps of up to `batch` rows
    /// (skipping models the kernels do not cover: the layers then run op by op). True where it
    /// stacked them anew.
    pub fn prepare_fused_decode(&mut self, model: &Model, batch: usize) -> Result<bool> {
        let c = &model.config;
        if !fused_decode_covers(c) {
            return Ok(false);
        }
        if !self.fused.layers.is_empty() && self.fused.batch >= batch.max(1) {
            return Ok(false);
        }
        self.fused = FusedDecode::default();
        let d = c.hidden_size;
        // The stacked copies cost about the attention's input weights again: without room for
        // them (and some slack), decode steps run op by op.
        let stacked: usize = model
            .layers
            .iter()
            .filter_map(|b| b.attn())
            .map(|l| {
                let shifts = [&l.k_proj.shift_proj, &l.v_proj.shift_proj].iter().filter_map(|s| s.as_ref()).count();
                let gates = usize::from(matches!(l.fgate, Fgate::Full { .. })) * l.heads
                    + l.ogate_proj.as_ref().map_or(0, |g| g.out_features);
                (l.q_proj.out_features + 2 * l.k_proj.linear.out_features + shifts * l.kv_heads + gates) * d
            })
            .sum::<usize>()
            * std::mem::size_of::<T>();
        let (free, _) = self.gpu.context().mem_get_info().unwrap_or((usize::MAX, 0));
        if stacked + (512 << 20) > free {
            eprintln!(
                "note: {:.2} GiB free on the GPU is too little for the fused decode step's stacked weights ({:.2} GiB): decoding op by op",
                crate::validate::gib(free),
                crate::validate::gib(stacked)
            );
            return Ok(false);
        }
        let mut layers = Vec::with_capacity(model.layers.len());
        let mut widest = 0;
        for l in model.layers.iter().filter_map(|b| b.attn()) {
            let mut parts: Vec<Linear> = Vec::new();
            let mut width = 0;
            let mut place = |lin: &Linear| {
                parts.push(*lin);
                width += lin.out_features;
                width - lin.out_features
            };
            let q = place(&l.q_proj);
            let k = place(&l.k_proj.linear);
            let ks = l.k_proj.shift_proj.as_ref().map(&mut place);
            let v = place(&l.v_proj.linear);
            let vs = l.v_proj.shift_proj.as_ref().map(&mut place);
            let f = match &l.fgate {
                Fgate::Full { proj, .. } => Some(place(proj)),
                _ => None,
            };
            let og = l.ogate_proj.as_ref().map(&mut place);
            let mut w = self.gpu.zeros::<T>(width * d).map_err(|e| anyhow!("stacking the decode weights: {e:#}"))?;
            let mut at = 0;
            for lin in &parts {
                ensure!(lin.in_features == d, "{}: {} inputs, not {d}", self.names[lin.weight.0], lin.in_features);
                let n = lin.out_features * d;
                dtod(&self.gpu, self.copy_of(lin.weight)?, 0, &mut w, at, n)?;
                at += n;
            }
            widest = widest.max(width);
            layers.push((l.q_proj.weight, FusedLayer { w, width, q, k, ks, v, vs, f, og }));
        }
        let p = Some(self.gpu.zeros(batch.max(1) * widest)?);
        self.fused = FusedDecode { layers, p, batch: batch.max(1), ..FusedDecode::default() };
        Ok(true)
    }

    /// Drops the stacked weights: decode steps run op by op again.
    pub fn clear_fused_decode(&mut self) {
        self.fused = FusedDecode::default();
    }

    /// [`crate::backend::Backend::decode_attn_inputs`] on the GPU.
    pub(crate) fn fused_inputs(
        &mut self,
        l: &ForgettingAttention,
        x: &CudaSlice<T>,
        b: &GpuBatch,
        a: &mut AttnActs<CudaSlice<T>, CudaSlice<f32>>,
        cache: &mut GpuCache<T>,
    ) -> Result<bool> {
        let rows = b.batch;
        let (h, hd) = (l.heads, l.head_dim);
        let fits = self
            .fused
            .layer(l.q_proj.weight)
            .is_some_and(|f| self.fused.p.as_ref().is_some_and(|p| p.len() >= rows * f.width));
        let plain = l.kv_heads == h && l.window.is_none() && l.log_pruning_tolerance.is_none();
        if !fits || !plain || b.seq != 1 || cache.len == 0 {
            return Ok(false);
        }
        ensure!(
            (cache.batch, cache.heads, cache.kv_heads, cache.head_dim) == (rows, h, h, hd),
            "decode cache of [batch {}, heads {}, kv_heads {}, head_dim {}] used for a fused step of [{rows}, {h}, \
             {h}, {hd}]",
            cache.batch,
            cache.heads,
            cache.kv_heads,
            cache.head_dim
        );
        ensure!(cache.len < cache.cap, "the decode cache holds {} positions, all filled", cache.cap);
        ensure!(
            a.q.len() >= rows * h * hd && a.z.len() >= rows * h * hd && a.c.len() >= rows * h,
            "fused decode: q holds {}, z {} and c {} values; {rows} rows of {h} heads × {hd} need {3}, {3} and {4}",
            a.q.len(),
            a.z.len(),
            a.c.len(),
            rows * h * hd,
            rows * h
        );
        let d = l.q_proj.in_features;
        self.mark(Family::Gemm)?;
        {
            let Cuda { fused, gemm, gpu, gemv, .. } = self;
            let FusedDecode { layers, p, .. } = fused;
            let f = layers.iter().find(|(id, _)| *id == l.q_proj.weight).map(|(_, f)| f);
            let f = f.ok_or_else(|| anyhow!("fused decode weights"))?;
            let p = p.as_mut().ok_or_else(|| anyhow!("fused decode buffer"))?;
            if *gemv && ops::gemv_fits::<T>(rows, d) {
                ops::gemv::<T, f32>(gpu, p, x, &f.w, rows, d, f.width)?;
            } else {
                gemm.linear_fwd::<T, f32>(p, false, x, &f.w, rows, d, f.width)?;
            }
        }
        self.mark(Family::Other)?;
        let f = self.fused.layer(l.q_proj.weight).ok_or_else(|| anyhow!("fused decode weights"))?;
        let p = self.fused.p.as_ref().ok_or_else(|| anyhow!("fused decode buffer"))?;
        let DecodeInWeights { q_norm, k_norm, qn_groups, kn_groups, fgate_bias } = self.decode_in_weights(l, hd);
        let params = DecodeIn {
            p: self.dptr(p),
            q: self.dptr(&a.q),
            c: self.dptr(&a.c),
            kc: self.dptr(&cache.k),
            vc: self.dptr(&cache.v),
            cc: self.dptr(&cache.c),
            k_shift: self.dptr(&cache.k_shift),
            v_shift: self.dptr(&cache.v_shift),
            q_norm,
            k_norm,
            fgate_bias,
            positions: self.dptr(&b.positions),
            lenp: self.lenp(),
            rope_base: l.rope_base.unwrap_or(0.0),
            ldp: f.width as i32,
            q_off: f.q as i32,
            k_off: f.k as i32,
            ks_off: off(f.ks),
            v_off: f.v as i32,
            vs_off: off(f.vs),
            f_off: off(f.f),
            b: rows as i32,
            h: h as i32,
            d: hd as i32,
            cap: cache.cap as i32,
            len: cache.len as i32,
            qn_groups,
            kn_groups,
            qk_eps: crate::config::QK_NORM_EPS,
        };
        // p holds rows × width, q and c rows × H (× D), the cache B·H·cap rows with len < cap
        // (checked above), the norms [groups, D].
        let cfg = head_blocks(rows * h, hd);
        kargs::launch(&self.gpu, &DECODE, &kname::<T>("fox_decode_in"), cfg, &[by_value(&params)])?;
        cache.staged = true;
        // z holds rows × H × D (checked above), p rows × width, the norm weight H × D.
        let output = ga::DecodeOut {
            z: self.dptr(&a.z),
            norm_w: l.output_norm.map_or(0, |w| self.dptr(&self.params[w.0].master)),
            gate: f.og.map_or(0, |_| self.dptr(p)),
            gate_ld: f.width as i64,
            gate_off: off(f.og),
            eps: l.norm_eps,
        };
        self.fused.output = Some(output);
        self.fused.applied = false;
        Ok(true)
    }

    /// [`crate::backend::Backend::decode_attn_output`] on the GPU.
    pub(crate) fn fused_output(
        &mut self,
        l: &ForgettingAttention,
        a: &mut AttnActs<CudaSlice<T>, CudaSlice<f32>>,
        rows: usize,
    ) -> Result<bool> {
        self.fused.output = None;
        if std::mem::take(&mut self.fused.applied) {
            return Ok(true);
        }
        if self.fused.layer(l.q_proj.weight).is_none() || self.fused.p.is_none() {
            return Ok(false);
        }
        let (h, hd) = (l.heads, l.head_dim);
        ensure!(
            a.z.len() >= rows * h * hd && a.o.len() >= rows * h * hd,
            "fused decode: z holds {} and o {} values; {rows} rows of {h} heads × {hd} need {}",
            a.z.len(),
            a.o.len(),
            rows * h * hd
        );
        self.mark(Family::Other)?;
        let f = self.fused.layer(l.q_proj.weight).ok_or_else(|| anyhow!("fused decode weights"))?;
        let p = self.fused.p.as_ref().ok_or_else(|| anyhow!("fused decode buffer"))?;
        let norm = l.output_norm.map_or(0, |w| self.dptr(&self.params[w.0].master));
        let (ldp, og, hi, di, eps) = (f.width as i32, off(f.og), h as i32, hd as i32, l.norm_eps);
        // z and o hold rows × H × D (checked above), p rows × width, the norm weight H × D.
        let args = args![&self.gpu; a.z, a.o, p, norm, ldp, og, hi, di, eps];
        kargs::launch(&self.gpu, &DECODE, &kname::<T>("fox_decode_out"), head_blocks(rows * h, hd), &args)?;
        Ok(true)
    }
}
