//! Forgetting Attention on CPU: o_i = Σ_j softmax_j(scale·q_i·k_j + c_i − c_j) v_j, causal.
//!
//! Two options of the fla library's kernel are here too: grouped-query attention (query head h
//! reads k/v head h / (H / H_kv); the gate, and so c, stays per query head) and a sliding window
//! (query i sees keys i − w < j ≤ i; the paper's SWA baseline). The window is a per-row key start,
//! so it composes with padding, packing and ACP exactly like a document start.
//!
//! Blocked, with the products on the `gemm` crate: per (batch, head, block of query rows) the
//! logits against every key the block sees are one product, each row's softmax runs over them
//! with its exact maximum, and the output is a second product. Memory is O(rows · T) per thread;
//! no T×T matrix is kept. The backward recomputes the probabilities from the saved log-sum-exp,
//! one task per (batch, k/v head), so dk and dv are summed without atomics, in a fixed order:
//! deterministic results. The query term of dc, Σ_j dS_ij, is zero in exact arithmetic but kept
//! so the CPU result is the exact gradient of the computed function.
//!
//! `naive` holds an O(T²) f64 version used only as the test reference.

use crate::matmul::gemm_seq;
use crate::par::{with_buffer, SharedMut};
use crate::simd;
use crate::small_gemm::{self as sg, Limit};
use rayon::prelude::*;
use std::cell::{Cell, RefCell};

/// Query rows per ACP decision: pruning skips key tiles of BLOCK_K keys per block of BLOCK_Q rows.
pub const BLOCK_Q: usize = 32;
/// Keys per tile (of ACP pruning).
pub const BLOCK_K: usize = 64;

/// A strided [B, H, T, D] view: element (b, h, t, d) lives at b·sb + h·sh + t·st + d.
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    pub data: &'a [f32],
    pub sb: usize,
    pub sh: usize,
    pub st: usize,
}

impl<'a> View<'a> {
    /// The natural layout of a projection's output, [B, T, H·D].
    pub fn bthd(data: &'a [f32], t: usize, h: usize, d: usize) -> Self {
        Self { data, sb: t * h * d, sh: d, st: h * d }
    }
    /// Head-first layout [B, H, T, D] (the decode cache).
    pub fn bhtd(data: &'a [f32], t: usize, d: usize, h: usize) -> Self {
        Self { data, sb: h * t * d, sh: t * d, st: d }
    }
    /// Where rows t..t + n of (b, h) start, for a product that reads them with row stride `st`.
    fn ptr(&self, b: usize, h: usize, t: usize, n: usize, d: usize) -> *const f32 {
        let o = b * self.sb + h * self.sh + t * self.st;
        assert!(n == 0 || o + (n - 1) * self.st + d <= self.data.len(), "attention: view too small");
        self.data[o..].as_ptr()
    }
    #[inline]
    fn row(&self, b: usize, h: usize, t: usize, d: usize) -> &'a [f32] {
        let o = b * self.sb + h * self.sh + t * self.st;
        &self.data[o..o + d]
    }
}

/// Which keys a query row may see besides causality.
#[derive(Clone, Copy, Debug)]
pub enum Visibility<'a> {
    /// Every earlier key.
    All,
    /// Left padding: batch row b's first `start[b]` positions are padding. Padded keys get no
    /// attention; padded query rows output 0.
    LeftPadded(&'a [usize]),
    /// Per query row (len B·tq): the first key it may see, e.g. its document's start in a packed
    /// batch. A query row whose own position is before its start outputs 0.
    PerRow(&'a [usize]),
}

impl Visibility<'_> {
    #[inline]
    fn start(&self, b: usize, r: usize, tq: usize) -> usize {
        match self {
            Visibility::All => 0,
            Visibility::LeftPadded(s) => s[b],
            Visibility::PerRow(s) => s[b * tq + r],
        }
    }
}

/// One attention problem. Query row r sits at key position `q_pos0 + r` (0 for a full forward,
/// the cache length for decoding).
#[derive(Clone, Copy, Debug)]
pub struct Problem<'a> {
    pub batch: usize,
    /// Query heads H (q, the output, dq, c and lse have H heads).
    pub heads: usize,
    /// k/v heads H_kv, a divisor of H (grouped-query attention); `heads` for multi-head attention.
    /// k, v, dk and dv have H_kv heads.
    pub kv_heads: usize,
    /// Sliding window w ≥ 1: query position i sees keys i − w < j ≤ i. None: every earlier key.
    pub window: Option<usize>,
    pub head_dim: usize,
    pub tq: usize,
    pub tk: usize,
    pub q_pos0: usize,
    pub q: View<'a>,
    pub k: View<'a>,
    pub v: View<'a>,
    /// Gate prefix sums at the query positions, [B, H, tq].
    pub cq: &'a [f32],
    /// Gate prefix sums at the key positions, [B, H, tk].
    pub ck: &'a [f32],
    pub vis: Visibility<'a>,
    pub scale: f32,
    /// Adaptive Computation Pruning: per (b, h) threshold δ; key tiles whose largest bias
    /// c_i − c_j is below it are skipped.
    pub prune: Option<&'a [f32]>,
}

impl Problem<'_> {
    /// The k/v head that query head h reads.
    #[inline]
    pub fn kv_head(&self, h: usize) -> usize {
        h / (self.heads / self.kv_heads)
    }
    /// First key query row r of batch row b sees: its visibility start, raised by the window.
    #[inline]
    fn key_start(&self, b: usize, r: usize) -> usize {
        let s = self.vis.start(b, r, self.tq);
        match self.window {
            Some(w) => s.max((self.q_pos0 + r + 1).saturating_sub(w)),
            None => s,
        }
    }
    fn check(&self) {
        assert!(
            self.kv_heads > 0 && self.heads.is_multiple_of(self.kv_heads),
            "kv_heads {} must divide heads {}",
            self.kv_heads,
            self.heads
        );
        assert!(self.window != Some(0), "a sliding window must hold at least one key");
    }
}

/// What the forward hands to the backward (besides its inputs and output).
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Log-sum-exp of each query row's logits, [B, H, tq]; −∞ for padded rows.
    pub lse: Vec<f32>,
    /// Key tiles visited and skipped by ACP (for reporting the pruned fraction).
    pub tiles_visited: usize,
    pub tiles_pruned: usize,
}

struct Block {
    b: usize,
    h: usize,
    r0: usize,
    r1: usize,
}

/// Work items over (batch, head, block of `block` rows out of `len`) for `heads` heads.
fn blocks(p: &Problem, heads: usize, block: usize, len: usize) -> Vec<Block> {
    let mut v = Vec::new();
    for b in 0..p.batch {
        for h in 0..heads {
            let mut r0 = 0;
            while r0 < len {
                v.push(Block { b, h, r0, r1: (r0 + block).min(len) });
                r0 += block;
            }
        }
    }
    v
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight partial sums: lets the compiler vectorise without reassociating a single chain.
    let mut acc = [0.0f32; 8];
    let n = a.len() / 8 * 8;
    for i in (0..n).step_by(8) {
        for l in 0..8 {
            acc[l] += a[i + l] * b[i + l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in n..a.len() {
        s += a[i] * b[i];
    }
    s
}

/// The key tiles a block of query rows [r0, r1) must visit: [first, end) in key positions,
/// after causality, visibility and ACP. Returns (first_key, end_key, tiles_pruned).
fn key_range(p: &Problem, b: usize, h: usize, r0: usize, r1: usize) -> (usize, usize, usize) {
    let end = (p.q_pos0 + r1).min(p.tk);
    let mut first = (r0..r1).map(|r| p.key_start(b, r)).min().unwrap_or(0);
    first = first / BLOCK_K * BLOCK_K;
    let mut pruned = 0;
    if let Some(th) = p.prune {
        let delta = th[b * p.heads + h];
        // The block's largest c_i is at its first non-padded row; c_j is smallest at a tile's
        // last key. Skipped tiles form a prefix because c is non-increasing.
        let ci0 = p.cq[(b * p.heads + h) * p.tq + r0];
        while first + BLOCK_K <= end {
            let j1 = first + BLOCK_K - 1;
            let cj1 = p.ck[(b * p.heads + h) * p.tk + j1];
            if ci0 - cj1 < delta && j1 < p.q_pos0 + r0 {
                first += BLOCK_K;
                pruned += 1;
            } else {
                break;
            }
        }
    }
    (first, end, pruned)
}

/// Query rows per forward task and per backward step: two ACP blocks, so that each step's
/// products are large enough for the GEMM kernels.
const ROWS: usize = 2 * BLOCK_Q;

/// The forward's tile decisions, which the backward follows: per (b, h, block of BLOCK_Q query
/// rows) the first key visited (after ACP), and the counts of key tiles visited and pruned.
struct Tiling {
    first: Vec<usize>,
    blocks_per_head: usize,
    visited: usize,
    pruned: usize,
}

impl Tiling {
    fn new(p: &Problem) -> Self {
        let nqb = p.tq.div_ceil(BLOCK_Q);
        let (mut visited, mut pruned) = (0, 0);
        let first = (0..p.batch * p.heads * nqb)
            .map(|i| {
                let (bh, r0) = (i / nqb, i % nqb * BLOCK_Q);
                let (first, end, pr) = key_range(p, bh / p.heads, bh % p.heads, r0, (r0 + BLOCK_Q).min(p.tq));
                visited += end.saturating_sub(first).div_ceil(BLOCK_K);
                pruned += pr;
                first
            })
            .collect();
        Self { first, blocks_per_head: nqb, visited, pruned }
    }

    /// The keys [lo, hi) query row r of (b, h) attends to (empty for a padded row): from its
    /// visibility and window start, raised to its block's first visited tile, up to itself.
    fn keys(&self, p: &Problem, b: usize, h: usize, r: usize) -> (usize, usize) {
        let pos = p.q_pos0 + r;
        if pos < p.vis.start(b, r, p.tq) {
            return (0, 0);
        }
        let lo = p.key_start(b, r).max(self.first[(b * p.heads + h) * self.blocks_per_head + r / BLOCK_Q]);
        (lo, (pos + 1).min(p.tk).max(lo))
    }

    /// The lowest key any query row of k/v head `hk` of batch row `b` sees (a lower bound for
    /// every block's first key): what the forward packs from.
    fn first_key(&self, p: &Problem, b: usize, hk: usize) -> usize {
        (0..p.heads)
            .filter(|&h| p.kv_head(h) == hk)
            .flat_map(|h| {
                let at = (b * p.heads + h) * self.blocks_per_head;
                self.first[at..at + self.blocks_per_head].iter().copied()
            })
            .min()
            .map_or(0, |k| k.min(p.tk))
    }

    /// Each row's keys for rows [r0, r1) into `keys`, and the span [klo, khi) that covers them
    /// (None when no row sees a key).
    fn block(
        &self,
        p: &Problem,
        b: usize,
        h: usize,
        r0: usize,
        r1: usize,
        keys: &mut Vec<(usize, usize)>,
    ) -> Option<(usize, usize)> {
        keys.clear();
        keys.extend((r0..r1).map(|r| self.keys(p, b, h, r)));
        let live = keys.iter().filter(|k| k.0 < k.1);
        let klo = live.clone().map(|k| k.0).min()?;
        Some((klo, live.map(|k| k.1).max().unwrap_or(klo)))
    }
}

thread_local! {
    /// A task's score blocks (per worker thread, kept between calls).
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Transposed keys (and values), packed for `small_gemm`: the forward's for every head, on
    /// the calling thread; a backward task's for its head.
    static PACK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The B operand of one of a block's products.
#[derive(Clone, Copy)]
enum Operand {
    /// Rows of contiguous columns with this row stride (V, K, dO, Q as B).
    Rows(*const f32, usize),
    /// The transpose of [n, k] rows with this row stride (Kᵀ, Vᵀ), and the same packed by
    /// `small_gemm::pack_transposed` from the block's first key (null without AVX-512).
    Transposed(*const f32, usize, *const f32),
}

thread_local! {
    /// Tests: the calls made from this thread run their block products through the gemm crate.
    static CRATE_PRODUCTS: Cell<bool> = const { Cell::new(false) };
}

/// `f` with the attention calls made from this thread on the gemm crate's products even where
/// the CPU has AVX-512 (tests compare the two paths).
#[doc(hidden)]
pub fn with_crate_products<R>(f: impl FnOnce() -> R) -> R {
    let before = CRATE_PRODUCTS.replace(true);
    let r = f();
    CRATE_PRODUCTS.set(before);
    r
}

/// Whether the block products run on `small_gemm`'s tiles (AVX-512) instead of the gemm crate.
/// Decided once per call, on the calling thread.
fn use_tiles(p: &Problem) -> bool {
    cfg!(target_arch = "x86_64") && simd::has_avx512() && !CRATE_PRODUCTS.get() && p.tq >= TILE_QUERIES && p.tk > 0
}

/// The fewest query rows for which the keys are packed for the tiles: fewer rows read each
/// packed key too few times to pay for packing it (the crossover measured on a 2-core Zen 4 is in
/// docs/kernel-notes.md).
const TILE_QUERIES: usize = 2 * BLOCK_Q;

/// C[m, n] (+)= A · B, one of a block's products, restricted per tile of rows by `span` as
/// `limit` says (see `small_gemm::gemm`): on small_gemm's tiles with `tiles` ([`use_tiles`]),
/// else one call of the gemm crate over the whole rectangle (the values outside the spans are
/// zeros of P or dS, or columns that the softmax overwrites).
///
/// # Safety
/// As `small_gemm::gemm` and `gemm_seq` for these shapes; with `tiles`, a `Transposed` operand's
/// packed pointer is valid.
#[allow(clippy::too_many_arguments)]
unsafe fn product(
    tiles: bool,
    (m, n, k): (usize, usize, usize),
    c: *mut f32,
    c_rs: usize,
    acc: bool,
    (a, a_rs, a_cs): (*const f32, usize, usize),
    b: Operand,
    limit: Limit,
    span: impl Fn(usize, usize) -> (usize, usize),
) {
    #[cfg(target_arch = "x86_64")]
    if tiles {
        let b = match b {
            Operand::Rows(p, rs) => sg::B::rows(p, rs),
            Operand::Transposed(_, _, packed) => sg::B::packed(packed, k),
        };
        return sg::gemm(m, n, k, c, c_rs, acc, a, a_rs, a_cs, b, limit, span);
    }
    let _ = (tiles, limit, span);
    let (b, b_rs, b_cs) = match b {
        Operand::Rows(p, rs) => (p, rs, 1),
        Operand::Transposed(p, rs, _) => (p, 1, rs),
    };
    gemm_seq(m, n, k, c, c_rs, acc, a, a_rs, a_cs, b, b_rs, b_cs)
}

/// The span of local columns [lo − klo, hi − klo) that rows [i0, i1) of a block see together
/// (empty: (0, 0)).
fn row_span(keys: &[(usize, usize)], klo: usize, i0: usize, i1: usize) -> (usize, usize) {
    let live = keys[i0..i1].iter().filter(|k| k.0 < k.1);
    let lo = live.clone().map(|k| k.0).min();
    lo.map_or((0, 0), |lo| (lo - klo, live.map(|k| k.1).max().unwrap_or(lo) - klo))
}

/// The rows of a block that see some key among local keys [j0, j1) (empty: (0, 0)).
fn key_span(keys: &[(usize, usize)], klo: usize, j0: usize, j1: usize) -> (usize, usize) {
    let (a, z) = (klo + j0, klo + j1);
    let mut rows = keys.iter().enumerate().filter(|(_, k)| k.0 < k.1 && k.0 < z && k.1 > a).map(|(i, _)| i);
    rows.next().map_or((0, 0), |first| (first, rows.next_back().unwrap_or(first) + 1))
}

/// Row i of a [rows, nk] score block whose columns are keys klo..: the logits
/// scale · q·k_j + c_i − c_j over the row's keys [lo, hi) turned into exp(logit − m), every other
/// column set to 0 (no attention). Returns the sum of the exps.
fn exp_logits(
    row: &mut [f32],
    klo: usize,
    (lo, hi): (usize, usize),
    scale: f32,
    ci: f32,
    ck: &[f32],
    m: Option<f32>,
) -> (f32, f32) {
    let (a, z) = (lo - klo, hi - klo);
    row[..a].fill(0.0);
    row[z..].fill(0.0);
    let act = &mut row[a..z];
    for (v, &cj) in act.iter_mut().zip(&ck[lo..hi]) {
        *v = scale * *v + (ci - cj);
    }
    let m = m.unwrap_or_else(|| simd::max(act));
    (m, simd::exp_in_place(act, m))
}

/// Forward. `out` is [B, tq, H, D].
///
/// Per (batch, head, block of `ROWS` query rows): the block's logits against every key it sees
/// as one product, the softmax of each row over its keys (exact maximum, no rescaling), and the
/// output as a second product.
pub fn forward(p: &Problem, out: &mut [f32]) -> Stats {
    let mut lse = vec![0.0; p.batch * p.heads * p.tq];
    let (tiles_visited, tiles_pruned) = forward_into(p, out, &mut lse);
    Stats { lse, tiles_visited, tiles_pruned }
}

/// [`forward`] with the log-sum-exp written into `lse` ([B, H, tq]); returns the key tiles
/// visited and pruned. For callers that keep their buffers between calls.
pub fn forward_into(p: &Problem, out: &mut [f32], lse: &mut [f32]) -> (usize, usize) {
    p.check();
    let (hh, d, tq) = (p.heads, p.head_dim, p.tq);
    assert_eq!(out.len(), p.batch * tq * hh * d);
    assert_eq!(p.cq.len(), p.batch * hh * tq);
    assert_eq!(p.ck.len(), p.batch * hh * p.tk);
    assert_eq!(lse.len(), p.batch * hh * tq, "attention: lse must be [B, H, tq]");
    let tiling = Tiling::new(p);
    lse.fill(f32::NEG_INFINITY);
    let outp = SharedMut::new(out);
    let lsep = SharedMut::new(lse);
    let tiles = use_tiles(p);
    // Every head's Kᵀ is packed once for all its blocks, from the panel of the first key any of
    // them sees: a decode step with a sliding window reads about a window of keys, not the cache.
    let base: Vec<usize> = if tiles {
        (0..p.batch * p.kv_heads)
            .map(|bk| tiling.first_key(p, bk / p.kv_heads, bk % p.kv_heads) / sg::PANEL * sg::PANEL)
            .collect()
    } else {
        Vec::new()
    };
    let per_head = base.iter().min().map_or(0, |&lo| sg::packed_len(p.tk - lo, d));
    with_buffer(&PACK, p.batch * p.kv_heads * per_head, |kt| {
        if per_head > 0 {
            kt.par_chunks_mut(per_head).enumerate().for_each(|(bk, dst)| {
                let (b, hk, lo) = (bk / p.kv_heads, bk % p.kv_heads, base[bk]);
                // SAFETY: the view holds keys lo..tk of (b, hk); dst holds one packed head of at
                // least tk − lo keys.
                unsafe {
                    sg::pack_transposed(dst.as_mut_ptr(), p.k.ptr(b, hk, lo, p.tk - lo, d), p.k.st, p.tk - lo, d)
                };
            });
        }
        let kt: &[f32] = kt;
        // `keys` is per rayon task, reused block after block (`tiling.block` clears it).
        blocks(p, hh, ROWS, tq).par_iter().for_each_init(
            || Vec::with_capacity(ROWS),
            |keys, blk| {
                let Block { b, h, r0, r1 } = *blk;
                let (hk, n) = (p.kv_head(h), r1 - r0);
                let (ch, ckh) = ((b * hh + h) * tq, (b * hh + h) * p.tk);
                let o_at = |r: usize| ((b * tq + r) * hh + h) * d;
                let Some((klo, khi)) = tiling.block(p, b, h, r0, r1, keys) else {
                    // SAFETY: each (b, r, h) output row belongs to exactly one block.
                    (r0..r1).for_each(|r| unsafe { outp.slice(o_at(r), d).fill(0.0) });
                    return;
                };
                // The tiles read packed keys from a panel's start: the block starts there too (the
                // keys before its own are outside every row's, zeros of P).
                let klo = if tiles { klo / sg::PANEL * sg::PANEL } else { klo };
                let nk = khi - klo;
                let kt_blk = if tiles {
                    let bk = b * p.kv_heads + hk;
                    kt[bk * per_head + (klo - base[bk]) / sg::PANEL * d * sg::PANEL..].as_ptr()
                } else {
                    std::ptr::null()
                };
                with_buffer(&SCRATCH, n * nk, |s| {
                    let span = |i0, i1| row_span(keys, klo, i0, i1);
                    // S = Q_blk · K[klo..khi]ᵀ
                    // SAFETY: s is [n, nk]; the views hold rows r0..r1 of (b, h) and keys klo..khi of (b, hk).
                    unsafe {
                        let (q, k) = (p.q.ptr(b, h, r0, n, d), p.k.ptr(b, hk, klo, nk, d));
                        product(
                            tiles,
                            (n, nk, d),
                            s.as_mut_ptr(),
                            nk,
                            false,
                            (q, p.q.st, 1),
                            Operand::Transposed(k, p.k.st, kt_blk),
                            Limit::Cols,
                            span,
                        );
                    }
                    let mut inv = [0.0f32; ROWS];
                    for (i, &kr) in keys.iter().enumerate() {
                        let row = &mut s[i * nk..(i + 1) * nk];
                        if kr.0 >= kr.1 {
                            row.fill(0.0);
                            continue;
                        }
                        let r = r0 + i;
                        let (m, l) = exp_logits(row, klo, kr, p.scale, p.cq[ch + r], &p.ck[ckh..], None);
                        inv[i] = 1.0 / l;
                        // SAFETY: each (b, h, r) entry belongs to exactly one block.
                        unsafe { *lsep.get(ch + r) = m + l.ln() };
                    }
                    // O_blk = P · V[klo..khi], each row then divided by its Σexp.
                    // SAFETY: output rows r0..r1 of (b, h) are this block's alone, stride H·D.
                    unsafe {
                        let v = p.v.ptr(b, hk, klo, nk, d);
                        let o = outp.ptr().add(o_at(r0));
                        product(
                            tiles,
                            (n, d, nk),
                            o,
                            hh * d,
                            false,
                            (s.as_ptr(), nk, 1),
                            Operand::Rows(v, p.v.st),
                            Limit::Depth,
                            span,
                        );
                    }
                    for (i, &c) in inv[..n].iter().enumerate() {
                        // SAFETY: as above.
                        let o = unsafe { outp.slice(o_at(r0 + i), d) };
                        o.iter_mut().for_each(|x| *x *= c);
                    }
                });
            },
        );
    });
    (tiling.visited, tiling.pruned)
}

/// Gradients of the attention inputs.
#[derive(Clone, Debug)]
pub struct Grads {
    /// [B, tq, H, D]
    pub dq: Vec<f32>,
    /// [B, tk, H_kv, D]: with grouped-query attention, the sum over the group's query heads.
    pub dk: Vec<f32>,
    /// [B, tk, H_kv, D]
    pub dv: Vec<f32>,
    /// d loss / d cq, [B, H, tq]
    pub dcq: Vec<f32>,
    /// d loss / d ck, [B, H, tk] (per query head: c is)
    pub dck: Vec<f32>,
}

impl Grads {
    /// Zeroed gradients of `p`'s shapes.
    pub fn zeros(p: &Problem) -> Self {
        let (bb, hh, hkv, d, tq, tk) = (p.batch, p.heads, p.kv_heads, p.head_dim, p.tq, p.tk);
        Grads {
            dq: vec![0.0; bb * tq * hh * d],
            dk: vec![0.0; bb * tk * hkv * d],
            dv: vec![0.0; bb * tk * hkv * d],
            dcq: vec![0.0; bb * hh * tq],
            dck: vec![0.0; bb * hh * tk],
        }
    }

    /// The buffers, for [`backward_into`].
    pub fn as_mut(&mut self) -> GradsMut<'_> {
        let Grads { dq, dk, dv, dcq, dck } = self;
        GradsMut { dq, dk, dv, dcq, dck }
    }
}

/// Backward. `o` and `dout` are [B, tq, H, D]; `lse` from the forward's `Stats`.
///
/// One task per (batch, k/v head), over its query heads and their blocks of `ROWS` rows in a
/// fixed order (so dk and dv, summed over the blocks and the group, need no atomics and the
/// result is deterministic). Per block, on exactly the (row, key) pairs the forward visited:
/// P from the saved log-sum-exp, dP = dO·Vᵀ, dS = P ⊙ (dP − dO·O), then dV += Pᵀ·dO,
/// dK += scale·dSᵀ·Q, dQ = scale·dS·K, and dc through the row sums (query term, zero in exact
/// arithmetic but kept so the result is the exact gradient of the computed function) and the
/// column sums (key term) of dS.
pub fn backward(p: &Problem, o: &[f32], dout: &[f32], lse: &[f32]) -> Grads {
    let mut g = Grads::zeros(p);
    backward_into(p, o, dout, lse, g.as_mut());
    g
}

/// Where [`backward_into`] writes: the buffers of [`Grads`], of the same shapes, overwritten.
pub struct GradsMut<'a> {
    pub dq: &'a mut [f32],
    pub dk: &'a mut [f32],
    pub dv: &'a mut [f32],
    pub dcq: &'a mut [f32],
    pub dck: &'a mut [f32],
}

/// [`backward`] into the caller's buffers (kept between calls: fresh ones of a long sequence
/// cost a page fault per 4 KiB every call).
pub fn backward_into(p: &Problem, o: &[f32], dout: &[f32], lse: &[f32], g: GradsMut<'_>) {
    p.check();
    let (bb, hh, hkv, d, tq, tk) = (p.batch, p.heads, p.kv_heads, p.head_dim, p.tq, p.tk);
    assert!(o.len() == bb * tq * hh * d && dout.len() == o.len() && lse.len() == bb * hh * tq);
    let GradsMut { dq, dk, dv, dcq, dck } = g;
    assert!(
        dq.len() == bb * tq * hh * d
            && dk.len() == bb * tk * hkv * d
            && dv.len() == dk.len()
            && dcq.len() == bb * hh * tq
            && dck.len() == bb * hh * tk,
        "attention: gradient buffers of the wrong shapes"
    );
    // dk, dv and dck are sums over blocks; dq and dcq rows without keys stay 0.
    for buf in [&mut *dq, &mut *dk, &mut *dv, &mut *dcq, &mut *dck] {
        buf.fill(0.0);
    }
    let group = hh / hkv;
    let tiling = Tiling::new(p);
    let (dqp, dkp, dvp) = (SharedMut::new(dq), SharedMut::new(dk), SharedMut::new(dv));
    let (dcqp, dckp) = (SharedMut::new(dcq), SharedMut::new(dck));
    let tiles = use_tiles(p);
    (0..bb * hkv).into_par_iter().for_each(|bk| {
        let (b, hk) = (bk / hkv, bk % hkv);
        let kv_at = |j: usize| ((b * tk + j) * hkv + hk) * d;
        let mut keys = Vec::with_capacity(ROWS);
        let per_head = if tiles { sg::packed_len(tk, d) } else { 0 };
        with_buffer(&PACK, 2 * per_head, |kvt| {
            if tiles {
                // This head's Kᵀ and Vᵀ, packed once for all its blocks.
                // SAFETY: the views hold tk keys of (b, hk); kvt holds two packed heads.
                unsafe {
                    sg::pack_transposed(kvt.as_mut_ptr(), p.k.ptr(b, hk, 0, tk, d), p.k.st, tk, d);
                    sg::pack_transposed(kvt[per_head..].as_mut_ptr(), p.v.ptr(b, hk, 0, tk, d), p.v.st, tk, d);
                }
            }
            let kvt: &[f32] = kvt;
            for h in hk * group..(hk + 1) * group {
                let (ch, ckh) = ((b * hh + h) * tq, (b * hh + h) * tk);
                let o_at = |r: usize| ((b * tq + r) * hh + h) * d;
                // SAFETY: the (b, h) entries of dck and dcq belong to this task alone.
                let (dck_h, dcq_h) = unsafe { (dckp.slice(ckh, tk), dcqp.slice(ch, tq)) };
                for r0 in (0..tq).step_by(ROWS) {
                    let r1 = (r0 + ROWS).min(tq);
                    let n = r1 - r0;
                    let Some((klo, khi)) = tiling.block(p, b, h, r0, r1, &mut keys) else { continue };
                    // From a panel's start for the tiles, as in the forward.
                    let klo = if tiles { klo / sg::PANEL * sg::PANEL } else { klo };
                    let nk = khi - klo;
                    let packed = |at: usize| {
                        if tiles {
                            kvt[at + klo / sg::PANEL * d * sg::PANEL..].as_ptr()
                        } else {
                            std::ptr::null()
                        }
                    };
                    with_buffer(&SCRATCH, 2 * n * nk, |buf| {
                        let (pm, ds) = buf.split_at_mut(n * nk);
                        // SAFETY (products below): pm and ds are [n, nk]; the views hold rows r0..r1
                        // of (b, h) and keys klo..khi of (b, hk); dout is [B, tq, H, D]; rows
                        // klo..khi of dk and dv for (b, hk), and rows r0..r1 of dq for (b, h),
                        // belong to this task.
                        let (q, k, v) =
                            (p.q.ptr(b, h, r0, n, d), p.k.ptr(b, hk, klo, nk, d), p.v.ptr(b, hk, klo, nk, d));
                        let dob = dout[o_at(r0)..].as_ptr();
                        let rows = |i0, i1| row_span(&keys, klo, i0, i1);
                        let cols = |j0, j1| key_span(&keys, klo, j0, j1);
                        unsafe {
                            let kt = Operand::Transposed(k, p.k.st, packed(0));
                            product(
                                tiles,
                                (n, nk, d),
                                pm.as_mut_ptr(),
                                nk,
                                false,
                                (q, p.q.st, 1),
                                kt,
                                Limit::Cols,
                                rows,
                            );
                            let vt = Operand::Transposed(v, p.v.st, packed(per_head));
                            product(
                                tiles,
                                (n, nk, d),
                                ds.as_mut_ptr(),
                                nk,
                                false,
                                (dob, hh * d, 1),
                                vt,
                                Limit::Cols,
                                rows,
                            );
                        }
                        for (i, &kr) in keys.iter().enumerate() {
                            let (prow, drow) = (&mut pm[i * nk..(i + 1) * nk], &mut ds[i * nk..(i + 1) * nk]);
                            if kr.0 >= kr.1 {
                                prow.fill(0.0);
                                drow.fill(0.0);
                                continue;
                            }
                            let r = r0 + i;
                            exp_logits(prow, klo, kr, p.scale, p.cq[ch + r], &p.ck[ckh..], Some(lse[ch + r]));
                            // delta = Σ_j P_ij dP_ij (= dO_i · O_i) from the same dP values: a row
                            // that sees one key (P = 1) gets dS = 0 exactly, as the gradient is,
                            // instead of the rounding difference of two dot products in other
                            // orders. Over the row's keys only: outside them P is 0 and so is dS
                            // (and dP there may not have been computed).
                            let (a, z) = (kr.0 - klo, kr.1 - klo);
                            let delta = dot(&prow[a..z], &drow[a..z]);
                            drow[..a].fill(0.0);
                            drow[z..].fill(0.0);
                            let dci = ds_row(&mut drow[a..z], &prow[a..z], &mut dck_h[kr.0..kr.1], delta, p.scale);
                            dcq_h[r] = dci;
                        }
                        unsafe {
                            // dV[klo..khi] += Pᵀ · dO_blk, dK[klo..khi] += (scale·dS)ᵀ · Q_blk
                            let (dv, dk) = (dvp.ptr().add(kv_at(klo)), dkp.ptr().add(kv_at(klo)));
                            let dot = Operand::Rows(dob, hh * d);
                            product(
                                tiles,
                                (nk, d, n),
                                dv,
                                hkv * d,
                                true,
                                (pm.as_ptr(), 1, nk),
                                dot,
                                Limit::Depth,
                                cols,
                            );
                            let qb = Operand::Rows(q, p.q.st);
                            product(tiles, (nk, d, n), dk, hkv * d, true, (ds.as_ptr(), 1, nk), qb, Limit::Depth, cols);
                            // dQ_blk = (scale·dS) · K[klo..khi]
                            let dq = dqp.ptr().add(o_at(r0));
                            product(
                                tiles,
                                (n, d, nk),
                                dq,
                                hh * d,
                                false,
                                (ds.as_ptr(), nk, 1),
                                Operand::Rows(k, p.k.st),
                                Limit::Depth,
                                rows,
                            );
                        }
                    });
                }
            }
        });
    });
}

/// ACP thresholds δ = −(2U + ln N) + ln ε per (b, h), with U bounding |scale·q·k|.
/// `logit_bound` is U per (b, h).
pub fn prune_thresholds(logit_bound: &[f32], n_keys: usize, log_eps: f32) -> Vec<f32> {
    logit_bound.iter().map(|u| -(2.0 * u + (n_keys as f32).ln()) + log_eps).collect()
}

/// U from the largest query and key norms of each (b, h): |scale·q·k| ≤ scale·max|q|·max|k|.
pub fn logit_bound_from_norms(p: &Problem) -> Vec<f32> {
    let d = p.head_dim;
    let mut u = Vec::with_capacity(p.batch * p.heads);
    for b in 0..p.batch {
        for h in 0..p.heads {
            let mq = (0..p.tq).map(|r| dot(p.q.row(b, h, r, d), p.q.row(b, h, r, d))).fold(0.0f32, f32::max);
            let hk = p.kv_head(h);
            let mk = (0..p.tk).map(|j| dot(p.k.row(b, hk, j, d), p.k.row(b, hk, j, d))).fold(0.0f32, f32::max);
            u.push(p.scale * mq.sqrt() * mk.sqrt());
        }
    }
    u
}

/// The O(T²) reference in f64. Test use only.
#[doc(hidden)]
pub mod naive {
    use super::*;

    /// Returns (out [B, tq, H, D], probabilities [B, H, tq, tk]).
    pub fn forward(p: &Problem) -> (Vec<f32>, Vec<f64>) {
        let (hh, d, tq, tk) = (p.heads, p.head_dim, p.tq, p.tk);
        let mut out = vec![0.0f32; p.batch * tq * hh * d];
        let mut probs = vec![0.0f64; p.batch * hh * tq * tk];
        for b in 0..p.batch {
            for h in 0..hh {
                for r in 0..tq {
                    let pos = p.q_pos0 + r;
                    if pos < p.vis.start(b, r, tq) {
                        continue;
                    }
                    // the window's first key, written out rather than through key_start
                    let st = match p.window {
                        Some(w) => p.vis.start(b, r, tq).max((pos + 1).saturating_sub(w)),
                        None => p.vis.start(b, r, tq),
                    };
                    let hk = h / (hh / p.kv_heads);
                    let qr = p.q.row(b, h, r, d);
                    let ci = p.cq[(b * hh + h) * tq + r] as f64;
                    let s: Vec<f64> = (st..=pos.min(tk - 1))
                        .map(|j| {
                            let kr = p.k.row(b, hk, j, d);
                            let qk: f64 = qr.iter().zip(kr).map(|(a, b)| *a as f64 * *b as f64).sum();
                            p.scale as f64 * qk + ci - p.ck[(b * hh + h) * tk + j] as f64
                        })
                        .collect();
                    let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = s.iter().map(|v| (v - mx).exp()).sum();
                    for (idx, j) in (st..=pos.min(tk - 1)).enumerate() {
                        let pr = (s[idx] - mx).exp() / z;
                        probs[((b * hh + h) * tq + r) * tk + j] = pr;
                        let vr = p.v.row(b, hk, j, d);
                        for c in 0..d {
                            out[((b * tq + r) * hh + h) * d + c] += (pr * vr[c] as f64) as f32;
                        }
                    }
                }
            }
        }
        (out, probs)
    }
}

/// dS = P ⊙ (dP − delta) in place of dP (times scale), the row's sum returned, and subtracted
/// from dck per column.
#[inline]
fn ds_row(drow: &mut [f32], prow: &[f32], dck: &mut [f32], delta: f32, scale: f32) -> f32 {
    let mut acc = [0.0f32; 16];
    let n = drow.len() / 16 * 16;
    for c in (0..n).step_by(16) {
        for l in 0..16 {
            let dsij = prow[c + l] * (drow[c + l] - delta);
            acc[l] += dsij;
            dck[c + l] -= dsij;
            drow[c + l] = dsij * scale;
        }
    }
    for j in n..drow.len() {
        let dsij = prow[j] * (drow[j] - delta);
        acc[j - n] += dsij;
        dck[j] -= dsij;
        drow[j] = dsij * scale;
    }
    acc.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use rand_distr::StandardNormal;

    struct Case {
        b: usize,
        h: usize,
        /// k/v heads
        hkv: usize,
        d: usize,
        t: usize,
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        c: Vec<f32>,
    }

    fn case(seed: u64, b: usize, h: usize, d: usize, t: usize, gate_bias: f32) -> Case {
        case_gqa(seed, b, h, h, d, t, gate_bias)
    }

    /// q with h heads, k and v with hkv heads.
    fn case_gqa(seed: u64, b: usize, h: usize, hkv: usize, d: usize, t: usize, gate_bias: f32) -> Case {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut g = |n: usize| (0..n).map(|_| rng.sample::<f32, _>(StandardNormal)).collect::<Vec<_>>();
        let (q, k, v) = (g(b * t * h * d), g(b * t * hkv * d), g(b * t * hkv * d));
        let logits: Vec<f32> = g(b * t * h).iter().map(|x| x + gate_bias).collect();
        let mut a = vec![0.0; b * t * h];
        crate::fgate::log_fgate_fwd(&mut a, &logits);
        let mut c = vec![0.0; b * h * t];
        crate::fgate::prefix_sum_fwd(&mut c, &a, None, t, h);
        Case { b, h, hkv, d, t, q, k, v, c }
    }

    fn problem<'a>(cs: &'a Case, vis: Visibility<'a>) -> Problem<'a> {
        Problem {
            batch: cs.b,
            heads: cs.h,
            kv_heads: cs.hkv,
            window: None,
            head_dim: cs.d,
            tq: cs.t,
            tk: cs.t,
            q_pos0: 0,
            q: View::bthd(&cs.q, cs.t, cs.h, cs.d),
            k: View::bthd(&cs.k, cs.t, cs.hkv, cs.d),
            v: View::bthd(&cs.v, cs.t, cs.hkv, cs.d),
            cq: &cs.c,
            ck: &cs.c,
            vis,
            scale: 1.0 / (cs.d as f32).sqrt(),
            prune: None,
        }
    }

    /// Each named input gradient ("q", "k", "v" or "c") against central differences of `loss`, at
    /// about `samples` of its elements (`crate::testing::assert_gradient`). `ctx` heads the
    /// failure message.
    fn assert_finite_differences(
        cs: &Case,
        grads: &[(&str, &[f32])],
        eps: f32,
        samples: usize,
        loss: impl Fn(&Case) -> f64,
        ctx: &str,
    ) {
        fn input<'a>(a: &'a mut Case, name: &str) -> &'a mut Vec<f32> {
            match name {
                "q" => &mut a.q,
                "k" => &mut a.k,
                "v" => &mut a.v,
                _ => &mut a.c,
            }
        }
        for &(name, grad) in grads {
            let mut base = Case { q: cs.q.clone(), k: cs.k.clone(), v: cs.v.clone(), c: cs.c.clone(), ..*cs };
            let x = std::mem::take(input(&mut base, name));
            let with = |xi: &[f32]| {
                let mut a = Case { q: base.q.clone(), k: base.k.clone(), v: base.v.clone(), c: base.c.clone(), ..base };
                *input(&mut a, name) = xi.to_vec();
                loss(&a)
            };
            let at = (0..grad.len()).step_by(grad.len() / samples + 1);
            crate::testing::assert_gradient(&format!("{ctx}{name}"), grad, &x, at, (eps, 2e-3), with);
        }
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    #[test]
    fn tiled_matches_naive_across_gate_regimes_and_padding() {
        for (seed, bias) in [(1, 6.0), (2, 0.0), (3, -3.0)] {
            let cs = case(seed, 2, 3, 16, 150, bias);
            let start = [0usize, 37];
            for vis in [Visibility::All, Visibility::LeftPadded(&start)] {
                let p = problem(&cs, vis);
                let mut out = vec![f32::NAN; cs.b * cs.t * cs.h * cs.d];
                let st = forward(&p, &mut out);
                let (r, _) = naive::forward(&p);
                // f32 accumulation over ≤150 keys vs f64: well under 1e-5.
                assert!(max_diff(&out, &r) < 2e-5, "seed {seed}: {}", max_diff(&out, &r));
                if let Visibility::LeftPadded(_) = vis {
                    // padded query rows are exactly zero, their lse −∞
                    let row1 = &out[cs.t * cs.h * cs.d..][..37 * cs.h * cs.d];
                    assert!(row1.iter().all(|&x| x == 0.0));
                    assert!(st.lse[cs.h * cs.t] == f32::NEG_INFINITY);
                }
            }
        }
    }

    /// The block products on small_gemm's tiles (where the CPU has AVX-512) and through the gemm
    /// crate give the same attention and gradients to rounding, with every restriction of the
    /// tiles' spans in play: padding, a window, ACP, grouped heads, and head sizes that fill
    /// part of a vector (8) or whole panels (64).
    #[test]
    fn tile_and_crate_products_agree() {
        for (d, t) in [(8, 150), (64, 200)] {
            let (b, h, hkv) = (2, 4, 2);
            let cs = case_gqa(31, b, h, hkv, d, t, 1.0);
            let pad = [0usize, 29];
            let th = vec![-5.0f32; b * h];
            for (window, prune) in [(None, None), (Some(70), Some(&th[..]))] {
                let p = Problem { window, prune, ..problem(&cs, Visibility::LeftPadded(&pad)) };
                let run = || {
                    let mut out = vec![0.0; cs.q.len()];
                    let st = forward(&p, &mut out);
                    let w: Vec<f32> = (0..out.len()).map(|i| ((i * 7919) % 113) as f32 / 56.0 - 1.0).collect();
                    let g = backward(&p, &out, &w, &st.lse);
                    (out, st.lse, g)
                };
                let (o1, l1, g1) = run();
                let (o2, l2, g2) = with_crate_products(run);
                assert!(max_diff(&o1, &o2) < 2e-5, "d {d}, window {window:?}: {}", max_diff(&o1, &o2));
                if prune.is_none() {
                    let (r, _) = naive::forward(&p);
                    assert!(max_diff(&o1, &r) < 2e-5, "d {d}: {}", max_diff(&o1, &r));
                }
                assert!(max_diff(&l1, &l2) < 1e-5, "d {d}, window {window:?}: lse");
                for (name, x, y) in [("dq", &g1.dq, &g2.dq), ("dk", &g1.dk, &g2.dk), ("dv", &g1.dv, &g2.dv)] {
                    let scale = y.iter().fold(1.0f32, |m, v| m.max(v.abs()));
                    assert!(max_diff(x, y) < 1e-5 * scale, "d {d}, window {window:?}: {name} {}", max_diff(x, y));
                }
                for (name, x, y) in [("dcq", &g1.dcq, &g2.dcq), ("dck", &g1.dck, &g2.dck)] {
                    let scale = y.iter().fold(1.0f32, |m, v| m.max(v.abs()));
                    assert!(max_diff(x, y) < 1e-5 * scale, "d {d}, window {window:?}: {name} {}", max_diff(x, y));
                }
            }
        }
    }

    #[test]
    fn decode_rows_match_full_forward() {
        let cs = case(4, 1, 2, 8, 100, 2.0);
        let p = problem(&cs, Visibility::All);
        let mut full = vec![0.0; cs.t * cs.h * cs.d];
        forward(&p, &mut full);
        // the last 3 query rows alone, against all 100 keys
        let tq = 3;
        let q_last: Vec<f32> = cs.q[(cs.t - tq) * cs.h * cs.d..].to_vec();
        let cq: Vec<f32> = (0..cs.h).flat_map(|h| cs.c[h * cs.t + cs.t - tq..(h + 1) * cs.t].to_vec()).collect();
        let p2 = Problem { tq, q_pos0: cs.t - tq, q: View::bthd(&q_last, tq, cs.h, cs.d), cq: &cq, ..p };
        let mut out = vec![0.0; tq * cs.h * cs.d];
        forward(&p2, &mut out);
        assert!(max_diff(&out, &full[(cs.t - tq) * cs.h * cs.d..]) < 1e-6);
    }

    /// The last rows alone with a sliding window far into the keys: the forward packs keys only
    /// from the panel of the first one any row sees (here key 192 of 300), and gives the full
    /// forward's rows, on the tiles and through the crate alike.
    #[test]
    fn last_rows_with_a_window_match_full_forward() {
        let (b, h, hkv, d, t, tq) = (2, 4, 2, 64, 300, TILE_QUERIES);
        let cs = case_gqa(37, b, h, hkv, d, t, 1.0);
        let p = Problem { window: Some(40), ..problem(&cs, Visibility::All) };
        let mut full = vec![0.0; cs.q.len()];
        forward(&p, &mut full);
        let q_last: Vec<f32> =
            (0..b).flat_map(|bi| cs.q[(bi * t + t - tq) * h * d..(bi + 1) * t * h * d].to_vec()).collect();
        let cq: Vec<f32> = (0..b * h).flat_map(|bh| cs.c[bh * t + t - tq..(bh + 1) * t].to_vec()).collect();
        let p2 = Problem { tq, q_pos0: t - tq, q: View::bthd(&q_last, tq, h, d), cq: &cq, ..p };
        let want: Vec<f32> =
            (0..b).flat_map(|bi| full[(bi * t + t - tq) * h * d..(bi + 1) * t * h * d].to_vec()).collect();
        let run = || {
            let mut out = vec![f32::NAN; tq * b * h * d];
            forward(&p2, &mut out);
            out
        };
        let (tiles, krate) = (run(), with_crate_products(run));
        assert!(max_diff(&tiles, &want) < 1e-6, "tiles: {}", max_diff(&tiles, &want));
        assert!(max_diff(&krate, &want) < 1e-6, "crate: {}", max_diff(&krate, &want));
    }

    #[test]
    fn packed_documents_equal_separate_sequences() {
        let cs = case(5, 1, 2, 8, 90, 1.0);
        // documents [0, 40) and [40, 90)
        let per_row: Vec<usize> = (0..90).map(|r| if r < 40 { 0 } else { 40 }).collect();
        let p = problem(&cs, Visibility::PerRow(&per_row));
        let mut out = vec![0.0; cs.t * cs.h * cs.d];
        forward(&p, &mut out);
        let (r, _) = naive::forward(&p);
        assert!(max_diff(&out, &r) < 1e-5);
        // the second document alone, as a left-padded row, gives the same rows
        let start = [40usize];
        let p2 = problem(&cs, Visibility::LeftPadded(&start));
        let mut out2 = vec![0.0; cs.t * cs.h * cs.d];
        forward(&p2, &mut out2);
        assert!(max_diff(&out[40 * cs.h * cs.d..], &out2[40 * cs.h * cs.d..]) < 1e-6);
    }

    #[test]
    fn acp_prunes_tiles_and_stays_within_tolerance() {
        // Strongly forgetting gates: most far-away tiles carry no mass.
        let cs = case(6, 1, 2, 16, 1024, -1.0);
        let p = problem(&cs, Visibility::All);
        let mut full = vec![0.0; cs.t * cs.h * cs.d];
        let s0 = forward(&p, &mut full);
        let u = logit_bound_from_norms(&p);
        let th = prune_thresholds(&u, cs.t, -10.0);
        let pp = Problem { prune: Some(&th), ..p };
        let mut pruned = vec![0.0; cs.t * cs.h * cs.d];
        let s1 = forward(&pp, &mut pruned);
        assert_eq!(s0.tiles_pruned, 0);
        assert!(s1.tiles_pruned > s1.tiles_visited / 2, "{} of {}", s1.tiles_pruned, s1.tiles_visited);
        // pruned mass < ε = e^-10 per row, so outputs move by < ε·max|v| ≈ 2e-4
        assert!(max_diff(&full, &pruned) < 3e-4, "{}", max_diff(&full, &pruned));
        let g0 = backward(&p, &full, &full, &s0.lse);
        let g1 = backward(&pp, &pruned, &full, &s1.lse);
        assert!(max_diff(&g0.dq, &g1.dq) < 1e-3);
        assert!(max_diff(&g0.dk, &g1.dk) < 1e-3);
    }

    /// Loss L = Σ w ⊙ out for fixed random w; checks every input gradient by central differences.
    #[test]
    fn backward_matches_finite_differences() {
        // (query heads, k/v heads, window, left padding): MHA, padding, GQA with a window
        // shorter than a key tile, and one k/v head for all query heads.
        for (h, hkv, window, padded) in
            [(2, 2, None, false), (2, 2, None, true), (4, 2, Some(9), true), (4, 1, Some(20), false)]
        {
            let cs = case_gqa(7, 1, h, hkv, 4, 70, 0.5);
            let start = [5usize];
            let vis = if padded { Visibility::LeftPadded(&start) } else { Visibility::All };
            let mut rng = ChaCha8Rng::seed_from_u64(9);
            let w: Vec<f32> = (0..cs.q.len()).map(|_| rng.sample(StandardNormal)).collect();
            let loss = |cs: &Case| -> f64 {
                let (o, _) = naive::forward(&Problem { window, ..problem(cs, vis) });
                o.iter().zip(&w).map(|(a, b)| *a as f64 * *b as f64).sum()
            };
            let p = Problem { window, ..problem(&cs, vis) };
            let mut out = vec![0.0; cs.q.len()];
            let st = forward(&p, &mut out);
            let g = backward(&p, &out, &w, &st.lse);
            let dc: Vec<f32> = g.dcq.iter().zip(&g.dck).map(|(a, b)| a + b).collect();
            let grads = [("q", &g.dq[..]), ("k", &g.dk), ("v", &g.dv), ("c", &dc)];
            assert_finite_differences(&cs, &grads, 1e-2, 23, loss, &format!("h {h} kv {hkv} window {window:?}: "));
        }
    }

    #[test]
    fn one_visible_key_gives_zero_score_gradients() {
        // A window of one key: P = 1 on every row, so dS = 0 and with it dq, dk and dc exactly;
        // dv_j = dO_j. (The GPU check compares against these zeros absolutely; rounding residue
        // here would make its relative error meaningless.)
        let cs = case(12, 2, 3, 16, 70, 1.0);
        let p = Problem { window: Some(1), ..problem(&cs, Visibility::All) };
        let mut out = vec![0.0; cs.q.len()];
        let st = forward(&p, &mut out);
        assert_eq!(max_diff(&out, &cs.v), 0.0, "o = v");
        let mut rng = ChaCha8Rng::seed_from_u64(13);
        let dout: Vec<f32> = (0..cs.q.len()).map(|_| rng.sample(StandardNormal)).collect();
        let g = backward(&p, &out, &dout, &st.lse);
        for (name, x) in [("dq", &g.dq), ("dk", &g.dk), ("dcq", &g.dcq), ("dck", &g.dck)] {
            assert!(x.iter().all(|&v| v == 0.0), "{name} is not exactly zero");
        }
        assert_eq!(max_diff(&g.dv, &dout), 0.0, "dv = dO");
    }

    /// k or v [B, T, hkv, D] repeated to [B, T, H, D]: query head h gets k/v head h / (H / hkv).
    fn repeat_heads(x: &[f32], b: usize, t: usize, h: usize, hkv: usize, d: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(b * t * h * d);
        for bt in 0..b * t {
            for hi in 0..h {
                let hk = hi / (h / hkv);
                out.extend_from_slice(&x[(bt * hkv + hk) * d..][..d]);
            }
        }
        out
    }

    #[test]
    fn gqa_equals_mha_with_repeated_kv_heads() {
        let (b, h, hkv, d, t) = (2, 6, 2, 8, 140);
        let cs = case_gqa(11, b, h, hkv, d, t, 1.0);
        let mha = Case {
            hkv: h,
            k: repeat_heads(&cs.k, b, t, h, hkv, d),
            v: repeat_heads(&cs.v, b, t, h, hkv, d),
            q: cs.q.clone(),
            c: cs.c.clone(),
            ..cs
        };
        let start = [0usize, 23];
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        let dout: Vec<f32> = (0..cs.q.len()).map(|_| rng.sample(StandardNormal)).collect();
        for window in [None, Some(50)] {
            for vis in [Visibility::All, Visibility::LeftPadded(&start)] {
                let pg = Problem { window, ..problem(&cs, vis) };
                let pm = Problem { window, ..problem(&mha, vis) };
                let (mut og, mut om) = (vec![0.0; cs.q.len()], vec![0.0; cs.q.len()]);
                let sg = forward(&pg, &mut og);
                let sm = forward(&pm, &mut om);
                // the same products in the same order: identical
                assert_eq!(og, om);
                assert_eq!(sg.lse, sm.lse);
                let gg = backward(&pg, &og, &dout, &sg.lse);
                let gm = backward(&pm, &om, &dout, &sm.lse);
                assert_eq!(gg.dq, gm.dq);
                assert_eq!(gg.dcq, gm.dcq);
                assert_eq!(gg.dck, gm.dck);
                // dk, dv of a k/v head: the sum of its query heads' (rounding differs)
                let sum_group = |x: &[f32]| {
                    let mut s = vec![0.0f32; b * t * hkv * d];
                    for bt in 0..b * t {
                        for hi in 0..h {
                            let hk = hi / (h / hkv);
                            for c in 0..d {
                                s[(bt * hkv + hk) * d + c] += x[(bt * h + hi) * d + c];
                            }
                        }
                    }
                    s
                };
                assert!(max_diff(&gg.dk, &sum_group(&gm.dk)) < 1e-5, "{window:?}");
                assert!(max_diff(&gg.dv, &sum_group(&gm.dv)) < 1e-5, "{window:?}");
                assert!(gg.dk.iter().any(|&x| x != 0.0));
            }
        }
    }

    /// GQA, a window, left padding and ACP together (every way a (row, key) pair is skipped):
    /// the backward is the gradient of the forward that ran, by central differences of the tiled
    /// forward itself (q, k and v only: the thresholds are fixed, and c moves the tile decisions).
    #[test]
    fn backward_follows_the_forward_with_every_skip() {
        let (b, h, hkv, d, t) = (2, 4, 2, 8, 150);
        let cs = case_gqa(21, b, h, hkv, d, t, -1.0);
        let pad = [0usize, 31];
        let th = vec![-6.0f32; b * h];
        let with = |cs: &Case, f: &mut dyn FnMut(&Problem)| {
            let p = Problem { window: Some(70), prune: Some(&th), ..problem(cs, Visibility::LeftPadded(&pad)) };
            f(&p)
        };
        let mut rng = ChaCha8Rng::seed_from_u64(22);
        let w: Vec<f32> = (0..cs.q.len()).map(|_| rng.sample(StandardNormal)).collect();
        let loss = |cs: &Case| -> f64 {
            let mut out = vec![0.0; cs.q.len()];
            with(cs, &mut |p| {
                forward(p, &mut out);
            });
            out.iter().zip(&w).map(|(a, b)| *a as f64 * *b as f64).sum()
        };
        let mut g = None;
        with(&cs, &mut |p| {
            let mut out = vec![0.0; cs.q.len()];
            let st = forward(p, &mut out);
            assert!(st.tiles_pruned > 0);
            g = Some(backward(p, &out, &w, &st.lse));
        });
        let g = g.unwrap();
        assert!(g.dq.iter().any(|&x| x != 0.0));
        // Into buffers left over from another call (NaN here): the same bits, as into fresh
        // zeros; the forward's lse too.
        with(&cs, &mut |p| {
            let mut out = vec![0.0; cs.q.len()];
            let mut lse = vec![f32::NAN; b * h * t];
            forward_into(p, &mut out, &mut lse);
            let nans = |n: usize| vec![f32::NAN; n];
            let (mut dq, mut dk, mut dv) = (nans(g.dq.len()), nans(g.dk.len()), nans(g.dv.len()));
            let (mut dcq, mut dck) = (nans(g.dcq.len()), nans(g.dck.len()));
            let out_g = GradsMut { dq: &mut dq, dk: &mut dk, dv: &mut dv, dcq: &mut dcq, dck: &mut dck };
            backward_into(p, &out, &w, &lse, out_g);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&dq), bits(&g.dq));
            assert_eq!((bits(&dk), bits(&dv)), (bits(&g.dk), bits(&g.dv)));
            assert_eq!((bits(&dcq), bits(&dck)), (bits(&g.dcq), bits(&g.dck)));
        });
        assert_finite_differences(&cs, &[("q", &g.dq[..]), ("k", &g.dk), ("v", &g.dv)], 2e-2, 29, loss, "");
    }

    #[test]
    fn window_matches_brute_force_and_per_row_starts() {
        let (b, h, hkv, d, t) = (2, 4, 2, 8, 150);
        let cs = case_gqa(13, b, h, hkv, d, t, 2.0);
        let pad = [0usize, 31];
        // two packed documents per row: [0, 60) and [60, 150)
        let docs: Vec<usize> = (0..b * t).map(|i| if i % t < 60 { 0 } else { 60 }).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(14);
        let dout: Vec<f32> = (0..cs.q.len()).map(|_| rng.sample(StandardNormal)).collect();
        for w in [1usize, 7, 64, 65, 100] {
            for vis in [Visibility::All, Visibility::LeftPadded(&pad), Visibility::PerRow(&docs)] {
                let p = Problem { window: Some(w), ..problem(&cs, vis) };
                let mut out = vec![f32::NAN; cs.q.len()];
                let st = forward(&p, &mut out);
                let (r, probs) = naive::forward(&p);
                assert!(max_diff(&out, &r) < 2e-5, "w {w}: {}", max_diff(&out, &r));
                // brute force: no probability outside the window
                for (idx, &pr) in probs.iter().enumerate() {
                    let (j, rr) = (idx % t, idx / t % t);
                    if pr != 0.0 {
                        assert!(j <= rr && j + w > rr, "w {w}: row {rr} sees key {j}");
                    }
                }
                // the window as explicit per-row starts, without the window option
                let starts: Vec<usize> = (0..b * t)
                    .map(|i| {
                        let (bi, rr) = (i / t, i % t);
                        let s = match vis {
                            Visibility::All => 0,
                            Visibility::LeftPadded(s) => s[bi],
                            Visibility::PerRow(s) => s[i],
                        };
                        s.max((rr + 1).saturating_sub(w))
                    })
                    .collect();
                let pr = problem(&cs, Visibility::PerRow(&starts));
                let mut out2 = vec![0.0; cs.q.len()];
                let st2 = forward(&pr, &mut out2);
                // padded rows: per-row starts beyond the row give 0 too
                assert!(max_diff(&out, &out2) < 1e-6, "w {w}");
                let g = backward(&p, &out, &dout, &st.lse);
                let g2 = backward(&pr, &out2, &dout, &st2.lse);
                for (a, b2) in [(&g.dq, &g2.dq), (&g.dk, &g2.dk), (&g.dv, &g2.dv), (&g.dcq, &g2.dcq), (&g.dck, &g2.dck)]
                {
                    assert!(max_diff(a, b2) < 1e-5, "w {w}: {}", max_diff(a, b2));
                }
            }
        }
        // a window of at least T keys is full attention, bit for bit
        for vis in [Visibility::All, Visibility::LeftPadded(&pad)] {
            let p0 = problem(&cs, vis);
            let p1 = Problem { window: Some(t), ..p0 };
            let (mut o0, mut o1) = (vec![0.0; cs.q.len()], vec![0.0; cs.q.len()]);
            let s0 = forward(&p0, &mut o0);
            forward(&p1, &mut o1);
            assert_eq!(o0, o1);
            let g0 = backward(&p0, &o0, &dout, &s0.lse);
            let g1 = backward(&p1, &o0, &dout, &s0.lse);
            assert_eq!((g0.dq, g0.dk, g0.dv, g0.dck), (g1.dq, g1.dk, g1.dv, g1.dck));
        }
    }

    #[test]
    fn window_decode_rows_match_full_forward_and_acp_stays_within_tolerance() {
        let (h, hkv, d, t) = (4, 2, 16, 600);
        let cs = case_gqa(15, 1, h, hkv, d, t, -1.0);
        let w = 200;
        let p = Problem { window: Some(w), ..problem(&cs, Visibility::All) };
        let mut full = vec![0.0; cs.q.len()];
        let s0 = forward(&p, &mut full);
        let tq = 3;
        let q_last: Vec<f32> = cs.q[(t - tq) * h * d..].to_vec();
        let cq: Vec<f32> = (0..h).flat_map(|hi| cs.c[hi * t + t - tq..(hi + 1) * t].to_vec()).collect();
        let p2 = Problem { tq, q_pos0: t - tq, q: View::bthd(&q_last, tq, h, d), cq: &cq, ..p };
        let mut out = vec![0.0; tq * h * d];
        forward(&p2, &mut out);
        assert!(max_diff(&out, &full[(t - tq) * h * d..]) < 1e-6);
        // ACP inside the window: prunes tiles, stays within ε, and the backward follows it
        let u = logit_bound_from_norms(&p);
        let th = prune_thresholds(&u, t, -10.0);
        let pp = Problem { prune: Some(&th), ..p };
        let mut pruned = vec![0.0; cs.q.len()];
        let s1 = forward(&pp, &mut pruned);
        assert!(s1.tiles_pruned > 0 && s1.tiles_visited < s0.tiles_visited);
        assert!(max_diff(&full, &pruned) < 3e-4, "{}", max_diff(&full, &pruned));
        let g0 = backward(&p, &full, &full, &s0.lse);
        let g1 = backward(&pp, &pruned, &full, &s1.lse);
        assert!(max_diff(&g0.dq, &g1.dq) < 1e-3);
        assert!(max_diff(&g0.dk, &g1.dk) < 1e-3);
        assert!(max_diff(&g0.dv, &g1.dv) < 1e-3);
    }
}
