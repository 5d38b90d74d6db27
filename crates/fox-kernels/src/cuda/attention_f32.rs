//! Forgetting Attention in f32 on the GPU (kernels/attention_f32.cu): the fast kernels take
//! bf16/fp16 only, and `--dtype f32` checks the model on the GPU against the CPU within 1e-3.
//!
//! Semantics are those of [`crate::attention::forward`] / [`crate::attention::backward`] for the
//! subset the model uses: tq = tk = T, q_pos0 = 0, q/k/v/o [B, T, H, D] contiguous, one gate
//! prefix sum c = cq = ck [B, H, T], every key or left padding (`start[b]`, i32 on the device),
//! and optional ACP thresholds skipping exactly the entries the CPU skips. Head dims 1..=256.
//! Simple rather than fast (O(T²·D) per head, one warp per row); deterministic (no atomics).
//! Grouped-query attention and the sliding window come through the [`AttnOptions`] every entry
//! point takes: k, v, dk, dv are then [B, T, H_kv, D] (the decode cache's k, v [B, H_kv, cap, D]).

use super::attention::AttnOptions;
use super::compile::ATTENTION_F32;
use super::kargs::{self, by_value, ptr};
use super::Gpu;
use anyhow::{ensure, Result};
use cudarc::driver::{CudaSlice, DeviceRepr};

/// Must match `F32Params` in kernels/attention_f32.cu.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct F32Params {
    q: u64,
    k: u64,
    v: u64,
    c: u64,
    start: u64,
    prune: u64,
    o: u64,
    lse: u64,
    o_in: u64,
    dout: u64,
    delta: u64,
    dq: u64,
    dk: u64,
    dv: u64,
    dc: u64,
    b: i32,
    h: i32,
    t: i32,
    d: i32,
    scale: f32,
    hkv: i32,
    window: i32,
    pad: i32,
    ck: u64,
    q_pos0: i32,
    cap: i32,
    pad2: i32,
    pad3: i32,
}
// SAFETY: plain old data with the C layout the kernels expect.
unsafe impl DeviceRepr for F32Params {}

/// An f32 attention problem, what every entry point shares: B, H, T (query rows), D and the
/// [`AttnOptions`]; q [B, T, H, D], k and v (of the chunk, or the decode cache's), c (the queries'
/// gate sums), the optional left-padding starts [B] and ACP thresholds [B, H], and the scale.
#[derive(Clone, Copy)]
pub struct F32Problem<'a> {
    pub b: usize,
    pub h: usize,
    pub t: usize,
    pub d: usize,
    pub opts: AttnOptions,
    pub q: &'a CudaSlice<f32>,
    pub k: &'a CudaSlice<f32>,
    pub v: &'a CudaSlice<f32>,
    pub c: &'a CudaSlice<f32>,
    pub start: Option<&'a CudaSlice<i32>>,
    pub scale: f32,
    pub prune: Option<&'a CudaSlice<f32>>,
}

/// The gradients [`backward_f32`] writes: dq [B, T, H, D], dk, dv [B, T, H_kv, D], dc [B, H, T].
pub struct F32Grads<'a> {
    pub dq: &'a mut CudaSlice<f32>,
    pub dk: &'a mut CudaSlice<f32>,
    pub dv: &'a mut CudaSlice<f32>,
    pub dc: &'a mut CudaSlice<f32>,
}

impl F32Params {
    /// The fields every kernel reads, from the problem; the rest zero for the caller to set.
    fn common(gpu: &Gpu, p: &F32Problem) -> Self {
        F32Params {
            q: ptr(gpu, p.q),
            k: ptr(gpu, p.k),
            v: ptr(gpu, p.v),
            c: ptr(gpu, p.c),
            start: p.start.map_or(0, |s| ptr(gpu, s)),
            prune: p.prune.map_or(0, |p| ptr(gpu, p)),
            b: p.b as i32,
            h: p.h as i32,
            t: p.t as i32,
            d: p.d as i32,
            scale: p.scale,
            hkv: p.opts.kv_heads(p.h) as i32,
            window: p.opts.window.map_or(0, |w| w as i32),
            ..Default::default()
        }
    }
}

/// Warps (rows) per block; WARPS in the kernel source.
const WARPS: usize = 4;

/// Checks the problem's sizes and options, and each of `tensors` (name, length, length needed).
fn validate(p: &F32Problem, tensors: &[(&str, usize, usize)]) -> Result<()> {
    let F32Problem { b, h, t, d, opts, start, prune, .. } = *p;
    ensure!(b > 0 && h > 0 && t > 0, "f32 attention: empty problem (B={b}, H={h}, T={t})");
    let hkv = opts.kv_heads(h);
    ensure!(hkv > 0 && h.is_multiple_of(hkv), "f32 attention: kv_heads {hkv} must divide the {h} query heads");
    if let Some(w) = opts.window {
        ensure!(w >= 1 && w < i32::MAX as usize, "f32 attention: sliding window {w} must be at least 1 key");
    }
    ensure!((1..=256).contains(&d), "f32 attention: head_dim {d} is not supported (1..=256)");
    ensure!(b * h * t < i32::MAX as usize, "f32 attention: B·H·T = {} is too large", b * h * t);
    for &(name, len, need) in tensors {
        ensure!(len >= need, "f32 attention: `{name}` holds {len} elements, needs {need}");
    }
    if let Some(s) = start {
        ensure!(s.len() >= b, "f32 attention: left-padding starts hold {} entries, need B = {b}", s.len());
    }
    if let Some(p) = prune {
        ensure!(p.len() >= b * h, "f32 attention: ACP thresholds hold {} entries, need B·H = {}", p.len(), b * h);
    }
    Ok(())
}

/// Launches `name` over `rows` rows, a warp per row; `validate` checked every buffer of `prm`
/// against the sizes the kernel indexes (B·T·H·D for rows, B·H·T for statistics).
fn launch(gpu: &Gpu, name: &str, rows: usize, prm: &F32Params) -> Result<()> {
    let cfg = kargs::plain_config((rows.div_ceil(WARPS) as u32, 1, 1), (WARPS * 32) as u32, 0);
    kargs::launch(gpu, &ATTENTION_F32, name, cfg, &[by_value(prm)])
}

/// Forward of a chunk of `tq` query rows [B, tq, H, D] (gate sums `cq` [B, H, tq]) at positions
/// `q_pos0..q_pos0 + tq` against a decode cache whose first `q_pos0 + tq` positions are filled:
/// keys and values [B, H_kv, cap, D] (H_kv of `opts`), gate sums `ck` [B, H, cap]. Rows before
/// `start[b]` are padding; the window of `opts` counts from each row's position.
#[allow(clippy::too_many_arguments)]
pub fn forward_f32_cached(
    gpu: &Gpu,
    b: usize,
    h: usize,
    tq: usize,
    d: usize,
    opts: AttnOptions,
    q: &CudaSlice<f32>,
    cq: &CudaSlice<f32>,
    cache: (&CudaSlice<f32>, &CudaSlice<f32>, &CudaSlice<f32>),
    cap: usize,
    q_pos0: usize,
    start: Option<&CudaSlice<i32>>,
    scale: f32,
    prune: Option<&CudaSlice<f32>>,
    o: &mut CudaSlice<f32>,
    lse: &mut CudaSlice<f32>,
) -> Result<()> {
    let (kc, vc, ck) = cache;
    let (n, s) = (b * tq * h * d, b * h * tq);
    let hkv = opts.kv_heads(h);
    ensure!(q_pos0 + tq <= cap, "f32 attention: the chunk ends at {} beyond the cache's {cap}", q_pos0 + tq);
    ensure!(cap < i32::MAX as usize, "f32 attention: cache of {cap} positions is too large");
    let p = F32Problem { b, h, t: tq, d, opts, q, k: kc, v: vc, c: cq, start, scale, prune };
    validate(
        &p,
        &[
            ("q", q.len(), n),
            ("cq", cq.len(), s),
            ("k cache", kc.len(), b * hkv * cap * d),
            ("v cache", vc.len(), b * hkv * cap * d),
            ("c cache", ck.len(), b * h * cap),
            ("o", o.len(), n),
            ("lse", lse.len(), s),
        ],
    )?;
    let prm = F32Params {
        ck: ptr(gpu, ck),
        o: ptr(gpu, o),
        lse: ptr(gpu, lse),
        q_pos0: q_pos0 as i32,
        cap: cap as i32,
        ..F32Params::common(gpu, &p)
    };
    launch(gpu, "fox32_fwd_cached", s, &prm)
}

/// Elements of a chunk's rows of queries and of keys or values, and of its statistics:
/// B·T·H·D, B·T·H_kv·D, B·H·T.
fn chunk_sizes(p: &F32Problem) -> (usize, usize, usize) {
    let F32Problem { b, h, t, d, opts, .. } = *p;
    (b * t * h * d, b * t * opts.kv_heads(h) * d, b * h * t)
}

/// [`validate`] of a chunk's q, k, v and c (keys at the T query positions), then of `more`.
fn validate_chunk(p: &F32Problem, more: &[(&str, usize, usize)]) -> Result<()> {
    let (n, nkv, s) = chunk_sizes(p);
    let inputs = [("q", p.q.len(), n), ("k", p.k.len(), nkv), ("v", p.v.len(), nkv), ("c", p.c.len(), s)];
    validate(p, &[&inputs[..], more].concat())
}

/// Forward: `o` [B, T, H, D], `lse` [B, H, T] (−∞ on padded rows, whose outputs are 0); k, v
/// [B, T, H_kv, D] with grouped-query attention, and the window of `opts`.
pub fn forward_f32(gpu: &Gpu, p: F32Problem, o: &mut CudaSlice<f32>, lse: &mut CudaSlice<f32>) -> Result<()> {
    let (n, _, s) = chunk_sizes(&p);
    validate_chunk(&p, &[("o", o.len(), n), ("lse", lse.len(), s)])?;
    let prm = F32Params { o: ptr(gpu, o), lse: ptr(gpu, lse), ..F32Params::common(gpu, &p) };
    launch(gpu, "fox32_fwd", s, &prm)
}

/// Backward: dq [B, T, H, D], dk, dv [B, T, H_kv, D] (summed over each group of query heads) and
/// dc [B, H, T] = dcq + dck (the CPU's `Grads` summed, as c feeds both the query and the key
/// side). `o` and `lse` from [`forward_f32`] with the same inputs. `delta` is a scratch of at
/// least B·H·T f32 (rowsum(dO∘O), overwritten): a step loop that allocates nothing passes its own;
/// None allocates one for the call.
pub fn backward_f32(
    gpu: &Gpu,
    p: F32Problem,
    o: &CudaSlice<f32>,
    dout: &CudaSlice<f32>,
    lse: &CudaSlice<f32>,
    grads: F32Grads,
    delta: Option<&mut CudaSlice<f32>>,
) -> Result<()> {
    let (n, nkv, s) = chunk_sizes(&p);
    // freed when this returns, stream-ordered: after the kernels that use it
    let mut own = None;
    let delta = match delta {
        Some(d) => d,
        None => own.insert(gpu.zeros::<f32>(s)?),
    };
    let F32Grads { dq, dk, dv, dc } = grads;
    validate_chunk(
        &p,
        &[
            ("o", o.len(), n),
            ("dout", dout.len(), n),
            ("lse", lse.len(), s),
            ("dq", dq.len(), n),
            ("dk", dk.len(), nkv),
            ("dv", dv.len(), nkv),
            ("dc", dc.len(), s),
            ("delta (scratch)", delta.len(), s),
        ],
    )?;
    let prm = F32Params {
        lse: ptr(gpu, lse),
        o_in: ptr(gpu, o),
        dout: ptr(gpu, dout),
        delta: ptr(gpu, delta),
        dq: ptr(gpu, dq),
        dk: ptr(gpu, dk),
        dv: ptr(gpu, dv),
        dc: ptr(gpu, dc),
        ..F32Params::common(gpu, &p)
    };
    // dq pass writes delta and dc = dcq; the dk/dv pass reads delta and adds dck (same stream).
    launch(gpu, "fox32_bwd_dq", s, &prm)?;
    // one warp per key row of each k/v head, walking the group's query heads
    launch(gpu, "fox32_bwd_dkdv", p.b * p.opts.kv_heads(p.h) * p.t, &prm)
}
