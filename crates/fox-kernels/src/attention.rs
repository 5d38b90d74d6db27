//! Forgetting Attention on CPU: o_i = Σ_j softmax_j(scale·q_i·k_j + c_i − c_j) v_j, causal.
//!
//! Two options of the fla library's kernel are here too: grouped-query attention (query head h
//! reads k/v head h / (H / H_kv); the gate, and so c, stays per query head) and a sliding window
//! (query i sees keys i − w < j ≤ i; the paper's SWA baseline). The window is a per-row key start,
//! so it composes with padding, packing and ACP exactly like a document start.
//!
//! Tiled and streaming like FlashAttention: per (batch, head, block of query rows) an online
//! softmax runs over key tiles, so memory is O(T·D) per head and no T×T matrix is ever formed.
//! The backward recomputes probabilities from the saved log-sum-exp. It makes two passes, one
//! over key blocks (dk, dv, and dc through the column sums of dS) and one over query blocks
//! (dq, and dc's query term Σ_j dS_ij, which is zero in exact arithmetic but kept so the CPU
//! result is the exact gradient of the computed function). Each pass writes disjoint outputs:
//! no atomics and a deterministic result.
//!
//! `naive` holds an O(T²) f64 version used only as the test reference.

use crate::par::SharedMut;
use rayon::prelude::*;

/// Query rows per task.
pub const BLOCK_Q: usize = 32;
/// Keys per tile.
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

#[inline]
fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
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

/// Forward. `out` is [B, tq, H, D].
pub fn forward(p: &Problem, out: &mut [f32]) -> Stats {
    p.check();
    let (hh, d, tq) = (p.heads, p.head_dim, p.tq);
    assert_eq!(out.len(), p.batch * tq * hh * d);
    assert_eq!(p.cq.len(), p.batch * hh * tq);
    assert_eq!(p.ck.len(), p.batch * hh * p.tk);
    let mut lse = vec![f32::NEG_INFINITY; p.batch * hh * tq];
    let outp = SharedMut::new(out);
    let lsep = SharedMut::new(&mut lse);
    let work = blocks(p, hh, BLOCK_Q, tq);
    let counts: Vec<(usize, usize)> = work
        .par_iter()
        .map(|blk| {
            let Block { b, h, r0, r1 } = *blk;
            let hk = p.kv_head(h);
            let n = r1 - r0;
            let (first, end, pruned) = key_range(p, b, h, r0, r1);
            let mut m = vec![f32::NEG_INFINITY; n];
            let mut l = vec![0.0f32; n];
            let mut acc = vec![0.0f32; n * d];
            let mut s = vec![0.0f32; BLOCK_K];
            let ch = (b * hh + h) * tq;
            let ckh = (b * hh + h) * p.tk;
            let mut visited = 0;
            let mut j0 = first;
            while j0 < end {
                let j1 = (j0 + BLOCK_K).min(end);
                visited += 1;
                for i in 0..n {
                    let r = r0 + i;
                    let pos = p.q_pos0 + r;
                    if pos < p.vis.start(b, r, tq) {
                        continue;
                    }
                    let lo = j0.max(p.key_start(b, r));
                    let hi = j1.min(pos + 1);
                    if lo >= hi {
                        continue;
                    }
                    let qr = p.q.row(b, h, r, d);
                    let ci = p.cq[ch + r];
                    let mut mx = m[i];
                    for j in lo..hi {
                        let v = p.scale * dot(qr, p.k.row(b, hk, j, d)) + (ci - p.ck[ckh + j]);
                        s[j - lo] = v;
                        mx = mx.max(v);
                    }
                    let corr = (m[i] - mx).exp();
                    let a = &mut acc[i * d..(i + 1) * d];
                    if corr != 1.0 {
                        l[i] *= corr;
                        a.iter_mut().for_each(|x| *x *= corr);
                    }
                    for j in lo..hi {
                        let e = (s[j - lo] - mx).exp();
                        l[i] += e;
                        axpy(a, e, p.v.row(b, hk, j, d));
                    }
                    m[i] = mx;
                }
                j0 = j1;
            }
            for i in 0..n {
                let r = r0 + i;
                // SAFETY: each (b, r, h) row and lse entry belongs to exactly one block.
                let o = unsafe { outp.slice(((b * tq + r) * hh + h) * d, d) };
                if l[i] > 0.0 {
                    let inv = 1.0 / l[i];
                    for c in 0..d {
                        o[c] = acc[i * d + c] * inv;
                    }
                    unsafe { *lsep.get(ch + r) = m[i] + l[i].ln() };
                } else {
                    o.fill(0.0);
                }
            }
            (visited, pruned)
        })
        .collect();
    Stats { lse, tiles_visited: counts.iter().map(|c| c.0).sum(), tiles_pruned: counts.iter().map(|c| c.1).sum() }
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

/// Most dS entries the backward keeps between its passes (16 MiB of f32).
const DS_KEEP: usize = 1 << 22;

/// Backward. `o` and `dout` are [B, tq, H, D]; `lse` from the forward's `Stats`.
pub fn backward(p: &Problem, o: &[f32], dout: &[f32], lse: &[f32]) -> Grads {
    backward_keeping(p, o, dout, lse, p.batch * p.heads * p.tq * p.tk <= DS_KEEP)
}

/// [`backward`], keeping pass 1's dS for pass 2 or (`keep` false) forming it again there.
fn backward_keeping(p: &Problem, o: &[f32], dout: &[f32], lse: &[f32], keep: bool) -> Grads {
    p.check();
    let (bb, hh, hkv, d, tq, tk) = (p.batch, p.heads, p.kv_heads, p.head_dim, p.tq, p.tk);
    let group = hh / hkv;
    let row = |b: usize, t: usize, h: usize, tl: usize| ((b * tl + t) * hh + h) * d;
    // delta_i = dO_i · O_i
    let mut delta = vec![0.0f32; bb * hh * tq];
    delta.par_iter_mut().enumerate().for_each(|(idx, dl)| {
        let (bh, r) = (idx / tq, idx % tq);
        let (b, h) = (bh / hh, bh % hh);
        let off = row(b, r, h, tq);
        *dl = dot(&o[off..off + d], &dout[off..off + d]);
    });
    let prob = |b: usize, h: usize, r: usize, j: usize, qr: &[f32]| -> f32 {
        let ch = (b * hh + h) * tq;
        let s = p.scale * dot(qr, p.k.row(b, p.kv_head(h), j, d)) + (p.cq[ch + r] - p.ck[(b * hh + h) * tk + j]);
        (s - lse[ch + r]).exp()
    };
    // The forward's tile decisions, once per (b, h, query block): the first key it visits.
    let nqb = tq.div_ceil(BLOCK_Q);
    let firsts: Vec<usize> = (0..bb * hh * nqb)
        .map(|i| {
            let (bh, qb) = (i / nqb, i % nqb);
            let r0 = qb * BLOCK_Q;
            key_range(p, bh / hh, bh % hh, r0, (r0 + BLOCK_Q).min(tq)).0
        })
        .collect();
    let row_sees = |b: usize, r: usize, j: usize| -> bool {
        let pos = p.q_pos0 + r;
        pos >= p.vis.start(b, r, tq) && j >= p.key_start(b, r) && j <= pos
    };
    // Pass 1 keeps each dS_ij it forms for pass 2 when all of them fit in DS_KEEP floats (short
    // contexts, as in CPU training); otherwise pass 2 forms them again. Both passes visit the
    // same (row, key) pairs and form dS the same way, so the gradients are bitwise the same.
    let mut ds_kept = if keep { vec![0.0f32; bb * hh * tq * tk] } else { Vec::new() };
    let dsp = SharedMut::new(&mut ds_kept);
    let ds_at = |b: usize, h: usize, r: usize, j: usize| ((b * hh + h) * tq + r) * tk + j;

    // Pass 1: over key blocks of each k/v head: dk, dv (summed over the group's query heads in a
    // fixed order), and dck = −Σ_i dS_ij per query head. Query blocks whose visit starts after
    // this key block (causality, padding, ACP) are skipped whole, and with a window the blocks
    // whose first row's window starts after it end the scan.
    let mut dk = vec![0.0f32; bb * tk * hkv * d];
    let mut dv = vec![0.0f32; bb * tk * hkv * d];
    let mut dck = vec![0.0f32; bb * hh * tk];
    let (dkp, dvp, dckp) = (SharedMut::new(&mut dk), SharedMut::new(&mut dv), SharedMut::new(&mut dck));
    blocks(p, hkv, BLOCK_K, tk).par_iter().for_each(|blk| {
        let Block { b, h: hk, r0: j0, r1: j1 } = *blk;
        let n = j1 - j0;
        let mut dkt = vec![0.0f32; n * d];
        let mut dvt = vec![0.0f32; n * d];
        let mut dct = vec![0.0f32; n];
        let qb0 = j0.saturating_sub(p.q_pos0) / BLOCK_Q;
        for h in hk * group..(hk + 1) * group {
            dct.fill(0.0);
            for qb in qb0..nqb {
                let rq = qb * BLOCK_Q;
                if p.window.is_some_and(|w| (p.q_pos0 + rq + 1).saturating_sub(w) >= j1) {
                    break;
                }
                if j0 < firsts[(b * hh + h) * nqb + qb] {
                    continue;
                }
                for r in rq..(rq + BLOCK_Q).min(tq) {
                    let qr = p.q.row(b, h, r, d);
                    let off = row(b, r, h, tq);
                    let dor = &dout[off..off + d];
                    let dl = delta[(b * hh + h) * tq + r];
                    for j in j0..j1 {
                        if !row_sees(b, r, j) {
                            continue;
                        }
                        let pij = prob(b, h, r, j, qr);
                        let jj = j - j0;
                        axpy(&mut dvt[jj * d..(jj + 1) * d], pij, dor);
                        let ds = pij * (dot(dor, p.v.row(b, hk, j, d)) - dl);
                        axpy(&mut dkt[jj * d..(jj + 1) * d], ds * p.scale, qr);
                        dct[jj] -= ds;
                        if keep {
                            // SAFETY: each (b, h, row, key) is formed by exactly one key block.
                            unsafe { *dsp.get(ds_at(b, h, r, j)) = ds };
                        }
                    }
                }
            }
            for j in j0..j1 {
                // SAFETY: (b, h, key) entries are disjoint between blocks.
                unsafe { *dckp.get((b * hh + h) * tk + j) = dct[j - j0] };
            }
        }
        for j in j0..j1 {
            let jj = j - j0;
            // SAFETY: key rows of one k/v head are disjoint between blocks.
            unsafe {
                dkp.slice(((b * tk + j) * hkv + hk) * d, d).copy_from_slice(&dkt[jj * d..(jj + 1) * d]);
                dvp.slice(((b * tk + j) * hkv + hk) * d, d).copy_from_slice(&dvt[jj * d..(jj + 1) * d]);
            }
        }
    });

    // Pass 2: over query blocks, visiting the same key range as the forward: dq and dcq = Σ_j dS_ij.
    let mut dq = vec![0.0f32; bb * tq * hh * d];
    let mut dcq = vec![0.0f32; bb * hh * tq];
    let (dqp, dcqp) = (SharedMut::new(&mut dq), SharedMut::new(&mut dcq));
    blocks(p, hh, BLOCK_Q, tq).par_iter().for_each(|blk| {
        let Block { b, h, r0, r1 } = *blk;
        let hk = p.kv_head(h);
        let first = firsts[(b * hh + h) * nqb + r0 / BLOCK_Q];
        let mut dqr = vec![0.0f32; d];
        for r in r0..r1 {
            dqr.fill(0.0);
            let mut dci = 0.0f32;
            let pos = p.q_pos0 + r;
            let qr = p.q.row(b, h, r, d);
            let off = row(b, r, h, tq);
            let dor = &dout[off..off + d];
            let dl = delta[(b * hh + h) * tq + r];
            for j in first.max(p.key_start(b, r))..=pos.min(tk - 1) {
                if !row_sees(b, r, j) {
                    continue;
                }
                let ds = if keep {
                    ds_kept[ds_at(b, h, r, j)]
                } else {
                    prob(b, h, r, j, qr) * (dot(dor, p.v.row(b, hk, j, d)) - dl)
                };
                axpy(&mut dqr, ds * p.scale, p.k.row(b, hk, j, d));
                dci += ds;
            }
            unsafe {
                dqp.slice(((b * tq + r) * hh + h) * d, d).copy_from_slice(&dqr);
                *dcqp.get((b * hh + h) * tq + r) = dci;
            }
        }
    });
    Grads { dq, dk, dv, dcq, dck }
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
            let eps = 1e-2f32;
            for (name, which, grad) in [("q", 0, &g.dq), ("k", 1, &g.dk), ("v", 2, &g.dv), ("c", 3, &dc)] {
                for idx in (0..grad.len()).step_by(grad.len() / 23 + 1) {
                    let mut a = Case { q: cs.q.clone(), k: cs.k.clone(), v: cs.v.clone(), c: cs.c.clone(), ..cs };
                    let bump = |a: &mut Case, dlt: f32| match which {
                        0 => a.q[idx] += dlt,
                        1 => a.k[idx] += dlt,
                        2 => a.v[idx] += dlt,
                        _ => a.c[idx] += dlt,
                    };
                    bump(&mut a, eps);
                    let lp = loss(&a);
                    bump(&mut a, -2.0 * eps);
                    let lm = loss(&a);
                    let fd = ((lp - lm) / (2.0 * eps as f64)) as f32;
                    assert!(
                        (fd - grad[idx]).abs() < 2e-3 * (1.0 + fd.abs()),
                        "h {h} kv {hkv} window {window:?}: {name}[{idx}]: fd {fd} vs {}",
                        grad[idx]
                    );
                }
            }
        }
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

    #[test]
    fn kept_ds_gives_bitwise_the_recomputed_gradients() {
        // GQA, a window, left padding and ACP together: every way a (row, key) pair is skipped.
        let (b, h, hkv, d, t) = (2, 4, 2, 8, 150);
        let cs = case_gqa(21, b, h, hkv, d, t, -1.0);
        let pad = [0usize, 31];
        let th = vec![-6.0f32; b * h];
        let p = Problem { window: Some(70), prune: Some(&th), ..problem(&cs, Visibility::LeftPadded(&pad)) };
        let mut out = vec![0.0; cs.q.len()];
        let st = forward(&p, &mut out);
        assert!(st.tiles_pruned > 0);
        let mut rng = ChaCha8Rng::seed_from_u64(22);
        let dout: Vec<f32> = (0..cs.q.len()).map(|_| rng.sample(StandardNormal)).collect();
        let kept = backward_keeping(&p, &out, &dout, &st.lse, true);
        let formed = backward_keeping(&p, &out, &dout, &st.lse, false);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (a, c) in [(&kept.dq, &formed.dq), (&kept.dk, &formed.dk), (&kept.dv, &formed.dv)] {
            assert_eq!(bits(a), bits(c));
        }
        assert_eq!(bits(&kept.dcq), bits(&formed.dcq));
        assert_eq!(bits(&kept.dck), bits(&formed.dck));
        assert!(kept.dq.iter().any(|&x| x != 0.0));
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
