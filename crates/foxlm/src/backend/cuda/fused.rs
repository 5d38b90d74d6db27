//! A decode step in few launches (kernels/decode.cu, "a fused decode step"). Batch-1 decoding is
//! bound by launches, not bytes: op by op, a FoX (Pro) layer runs 7 projections of the same input
//! and 17 small kernels. Fused, the projections are one GEMM (their weights stacked at load) and
//! everything from the projections to the cache append is one kernel; what lies between the
//! attention and o_proj (the output norm and gate) is one kernel too, or, for one bf16 query row
//! per sequence, the attention's own last split (`fox_kernels::cuda::attention::DecodeOut`).
//!
//! The op-by-op path stays the definition: the fused one is checked against it (and the CPU) by
//! `foxlm gpu-check`, and a layer the kernels do not cover (grouped-query attention, a sliding
//! window, ACP) runs op by op.

use super::{dtod, Cuda, Family, GpuBatch, GpuCache};
use crate::config::Config;
use crate::model::attention::{AttnActs, Fgate, ForgettingAttention};
use crate::model::{Linear, Model};
use crate::tensor::ParamId;
use anyhow::{anyhow, ensure, Result};
use fox_kernels::cuda::compile::DECODE;
use fox_kernels::cuda::cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig};
use fox_kernels::cuda::kargs::{self, args, by_value, kname};
use fox_kernels::cuda::{attention as ga, ops, Elem};

/// One layer's stacked input projections: rows [q | k | k-shift gate | v | v-shift gate | forget
/// gate | output gate] of `w` [width, d], and where each starts in the GEMM's output row.
pub(super) struct FusedLayer<T> {
    pub(super) w: CudaSlice<T>,
    pub(super) width: usize,
    pub(super) q: usize,
    pub(super) k: usize,
    pub(super) ks: Option<usize>,
    pub(super) v: usize,
    pub(super) vs: Option<usize>,
    pub(super) f: Option<usize>,
    pub(super) og: Option<usize>,
}

/// The fused kernels' state: stacked weights per layer (keyed by the layer's q_proj weight) and
/// the projections' f32 output, [batch, widest].
#[derive(Default)]
pub(super) struct FusedDecode<T> {
    layers: Vec<(ParamId, FusedLayer<T>)>,
    p: Option<CudaSlice<f32>>,
    /// Rows `p` was sized for.
    batch: usize,
    /// The output norm and gate of the layer whose inputs were just staged, for the one-row
    /// decode attention to apply in its last split ([`FusedDecode::take_output`]); `applied`
    /// once it did, so that [`Cuda::fused_output`] has nothing left to launch.
    output: Option<ga::DecodeOut>,
    applied: bool,
}

impl<T> FusedDecode<T> {
    pub(super) fn layer(&self, l: &ForgettingAttention) -> Option<&FusedLayer<T>> {
        self.layers.iter().find(|(id, _)| *id == l.q_proj.weight).map(|(_, f)| f)
    }
    /// The staged layer's output norm and gate, for the attention of the staged position.
    pub(super) fn take_output(&mut self) -> Option<ga::DecodeOut> {
        self.output.take()
    }
    /// Whether the attention applied the output norm and gate it took.
    pub(super) fn set_output_applied(&mut self, applied: bool) {
        self.applied = applied;
    }
}

/// `DecodeIn` of kernels/decode.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct DecodeIn {
    p: u64,
    q: u64,
    c: u64,
    kc: u64,
    vc: u64,
    cc: u64,
    k_shift: u64,
    v_shift: u64,
    q_norm: u64,
    k_norm: u64,
    fgate_bias: u64,
    positions: u64,
    lenp: u64,
    rope_base: f64,
    ldp: i32,
    q_off: i32,
    k_off: i32,
    ks_off: i32,
    v_off: i32,
    vs_off: i32,
    f_off: i32,
    b: i32,
    h: i32,
    d: i32,
    cap: i32,
    len: i32,
    qn_groups: i32,
    kn_groups: i32,
    qk_eps: f32,
}
// SAFETY: plain old data in the C layout of `DecodeIn` (pointers, a double, ints, a float).
unsafe impl DeviceRepr for DecodeIn {}

fn off(o: Option<usize>) -> i32 {
    o.map_or(-1, |v| v as i32)
}

/// One block per (row, head) of `head_dim` threads rounded up to whole warps.
fn head_blocks(rows_heads: usize, head_dim: usize) -> LaunchConfig {
    kargs::plain_config((rows_heads as u32, 1, 1), head_dim.next_multiple_of(32) as u32, 0)
}

/// Whether the fused kernels cover a model's layers: multi-head attention over every earlier key
/// (the kernels index k/v and the cache by query head and mask nothing), no ACP (its thresholds
/// come between the inputs and the attention), head dim up to a block of 1024 threads.
pub fn fused_decode_covers(c: &Config) -> bool {
    c.kv_heads() == c.num_heads && c.window_size.is_none() && c.log_pruning_tolerance.is_none() && c.head_dim() <= 1024
}

/// What `fox_decode_in` reads of a layer besides its projections: the QK-norm weights (0 without
/// QK-norm) with their groups of `head_dim` channels, and the forget gate's bias (0 without one).
pub(super) struct DecodeInWeights {
    pub q_norm: u64,
    pub k_norm: u64,
    pub qn_groups: i32,
    pub kn_groups: i32,
    pub fgate_bias: u64,
}

impl<T: Elem> Cuda<T> {
    /// A layer's [`DecodeInWeights`], as device pointers (heads of `hd` channels).
    pub(super) fn decode_in_weights(&self, l: &ForgettingAttention, hd: usize) -> DecodeInWeights {
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
    /// (skipping models the kernels do not cover: the layers then run op by op).
    pub fn prepare_fused_decode(&mut self, model: &Model, batch: usize) -> Result<()> {
        let c = &model.config;
        if !fused_decode_covers(c) {
            return Ok(());
        }
        if !self.fused.layers.is_empty() && self.fused.batch >= batch.max(1) {
            return Ok(());
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
                free as f64 / (1u64 << 30) as f64,
                stacked as f64 / (1u64 << 30) as f64
            );
            return Ok(());
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
        self.prepare_mega(model)
    }

    /// Drops the stacked weights: decode steps run op by op again.
    pub fn clear_fused_decode(&mut self) {
        self.fused = FusedDecode::default();
        self.mega = None;
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
        let fits =
            self.fused.layer(l).is_some_and(|f| self.fused.p.as_ref().is_some_and(|p| p.len() >= rows * f.width));
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
        let f = self.fused.layer(l).ok_or_else(|| anyhow!("fused decode weights"))?;
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
        if self.fused.layer(l).is_none() || self.fused.p.is_none() {
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
        let f = self.fused.layer(l).ok_or_else(|| anyhow!("fused decode weights"))?;
        let p = self.fused.p.as_ref().ok_or_else(|| anyhow!("fused decode buffer"))?;
        let norm = l.output_norm.map_or(0, |w| self.dptr(&self.params[w.0].master));
        let (ldp, og, hi, di, eps) = (f.width as i32, off(f.og), h as i32, hd as i32, l.norm_eps);
        // z and o hold rows × H × D (checked above), p rows × width, the norm weight H × D.
        let args = args![&self.gpu; a.z, a.o, p, norm, ldp, og, hi, di, eps];
        kargs::launch(&self.gpu, &DECODE, &kname::<T>("fox_decode_out"), head_blocks(rows * h, hd), &args)?;
        Ok(true)
    }
}
