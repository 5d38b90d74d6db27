//! The output head and its loss, fused: logits = x · Wᵀ over the vocabulary, softmax
//! cross-entropy per row, and for training dx = dlogits · W and dW += dlogitsᵀ · x, where
//! dlogits = weight · (softmax − onehot(target)).
//!
//! Why it is one op. With GPT-2's 50257 words the logits are the largest tensor of a small
//! model's step (206 MB for 1024 rows), and with a narrow model (d = 64) each logit costs only
//! 2·d FLOPs, so separate passes over them (GEMM, max, Σexp, gradient, two GEMMs) are bound by
//! memory, not arithmetic. Here the vocabulary is cut into fixed ranges of `RANGE` words that
//! threads take one at a time, and each range into blocks of `VB` words whose [rows, VB] logits
//! fit in L2:
//! - pass 1: the forward GEMM of a block, then at once, while the block is in cache, each row's
//!   running maximum M and Σexp (online softmax) and the target's logit; for training the block
//!   is kept as exp(logit − M), with M;
//! - the ranges' statistics are merged into each row's log-sum-exp and loss;
//! - pass 2 (training): each block's dlogits = weight · exp(logit − M) · exp(M − lse) (one
//!   multiply per logit) are formed in a per-thread scratch and both gradient GEMMs run on it
//!   there; dW's rows are the range's own, dx has one partial sum per range, added in range order
//!   at the end.
//!
//! The logits cross memory twice (written in pass 1, read in pass 2) instead of six times, with
//! one exp each, and the ranges do not depend on the thread count, so results are the same on
//! any machine with the same instruction set. Evaluation (no gradients) keeps no logits at all.
//! GEMMs run single-threaded inside a range's task. The calling thread keeps the training
//! logits' buffer (rows × vocab, at most 256 MiB) for the next step.

use crate::matmul::gemm_seq;
use crate::par::{with_buffer, SharedMut};
use crate::simd;
use anyhow::{bail, Result};
use rayon::prelude::*;
use std::cell::RefCell;

/// Words per block: a block's logits for 1024 rows are 512 KiB.
const VB: usize = 128;
/// Words per dx GEMM in pass 2 (its inner dimension: longer is more efficient).
const GRAD_COLS: usize = 512;
/// Words per task: 25 tasks for GPT-2's vocabulary.
const RANGE: usize = 2048;
/// The narrowest model whose logits blocks run on the tiles: narrower models keep the crate's
/// product, which is faster for them (docs/kernel-notes.md).
const TILE_DEPTH: usize = 256;
/// At most this many logits are kept at once (256 MiB): longer batches go in chunks of rows.
const MAX_LOGITS: usize = 1 << 26;

thread_local! {
    /// The logits of pass 1, kept by the calling thread between steps (allocating them afresh
    /// costs a page fault per 4 KiB every step).
    static LOGITS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// A task's block of logits or dlogits (per worker thread).
    static TASK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// A block's words transposed for the tiles (per worker thread).
    static PACKED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Where the head's gradients go.
pub struct HeadGrads<'a> {
    /// d loss / d x, [rows, d]: overwritten.
    pub dx: &'a mut [f32],
    /// d loss / d W, [vocab, d]: added to (overwritten where not `dw_add`); None for a frozen
    /// head.
    pub dw: Option<&'a mut [f32]>,
    pub dw_add: bool,
}

/// Σ over the rows with a target of the cross-entropy of logits = x · wᵀ (x: [rows, d],
/// w: [vocab, d], rows = targets.len()), in f64. With `grads`, dx = weight · d(Σ loss)/dx and
/// dw += weight · d(Σ loss)/dw; rows without a target get dx = 0.
pub fn linear_cross_entropy(
    x: &[f32],
    w: &[f32],
    targets: &[Option<u32>],
    d: usize,
    vocab: usize,
    weight: f32,
    mut grads: Option<HeadGrads<'_>>,
) -> Result<f64> {
    let rows = targets.len();
    if x.len() < rows * d {
        bail!("head: hidden states hold {} values, {rows} rows of {d} expected", x.len());
    }
    if w.len() != vocab * d || vocab == 0 {
        bail!("head: weight holds {} values, [{vocab}, {d}] expected", w.len());
    }
    if let Some(&bad) = targets.iter().flatten().find(|&&t| t as usize >= vocab) {
        bail!("head: target id {bad} outside the vocabulary ({vocab})");
    }
    if let Some(g) = &grads {
        if g.dx.len() < rows * d || g.dw.as_ref().is_some_and(|dw| dw.len() != vocab * d) {
            bail!("head: gradient buffers must be dx [{rows}, {d}] and dw [{vocab}, {d}]");
        }
    }
    let chunk = (MAX_LOGITS / vocab).clamp(1, rows.max(1));
    let mut total = 0.0;
    // Overwriting dW holds for the first chunk of rows that has a target; the others add to it.
    let mut dw_written = grads.as_ref().is_none_or(|g| g.dw_add);
    for r0 in (0..rows).step_by(chunk) {
        let r1 = (r0 + chunk).min(rows);
        let tg = &targets[r0..r1];
        let xs = &x[r0 * d..r1 * d];
        if tg.iter().all(|t| t.is_none()) {
            if let Some(g) = grads.as_mut() {
                g.dx[r0 * d..r1 * d].fill(0.0);
            }
            continue;
        }
        total += match grads.as_mut() {
            Some(g) => {
                let dx = &mut g.dx[r0 * d..r1 * d];
                let dw = g.dw.as_deref_mut().map(|dw| (dw, dw_written));
                dw_written = true;
                with_buffer(&LOGITS, tg.len() * vocab, |logits| {
                    chunk_with_grads(xs, w, tg, d, vocab, weight, logits, dx, dw)
                })
            }
            None => {
                let stats = pass1(xs, w, tg, d, vocab, None);
                merge(&stats, tg).1
            }
        };
    }
    // No row had a target: an overwritten dW is zero.
    if let Some(dw) = grads.and_then(|g| g.dw).filter(|_| !dw_written) {
        dw.fill(0.0);
    }
    Ok(total)
}

/// One range's softmax statistics for each row of the chunk.
struct Stats {
    max: Vec<f32>,
    /// Σ exp(logit − max)
    sum: Vec<f64>,
    /// The target's logit where the target is in this range.
    target_logit: Vec<f32>,
}

fn ranges(vocab: usize) -> Vec<(usize, usize)> {
    (0..vocab).step_by(RANGE).map(|v0| (v0, (v0 + RANGE).min(vocab))).collect()
}

/// Pass 1: the logits block by block, each followed by its rows' running statistics (max, Σexp).
/// With `keep` = (kept, ref_max) for training, each block's exp(logit − M) is kept, where M is
/// the row's running maximum after the block (also kept, in ref_max [blocks, rows]): pass 2 then
/// needs one multiply per logit instead of an exp. The block of words v0..v1 is [rows, v1 − v0]
/// at offset rows · v0 of `kept` ([rows · vocab]), so pass 2 reads each block as one stream.
fn pass1(
    x: &[f32],
    w: &[f32],
    tg: &[Option<u32>],
    d: usize,
    vocab: usize,
    keep: Option<(&mut [f32], &mut [f32])>,
) -> Vec<Stats> {
    let m = tg.len();
    let keep = keep.map(|(l, r)| (SharedMut::new(l), SharedMut::new(r)));
    ranges(vocab)
        .par_iter()
        .map(|&(a, b)| {
            let mut st = Stats { max: vec![f32::NEG_INFINITY; m], sum: vec![0.0; m], target_logit: vec![0.0; m] };
            let block = if keep.is_some() { 0 } else { m * VB };
            with_buffer(&TASK, block, |buf| {
                for v0 in (a..b).step_by(VB) {
                    let v1 = (v0 + VB).min(b);
                    let nb = v1 - v0;
                    let dst = match keep {
                        // SAFETY (below): the block's m·nb values at m·v0 are this task's alone.
                        Some((l, _)) => unsafe { l.ptr().add(m * v0) },
                        None => buf.as_mut_ptr(),
                    };
                    // SAFETY: dst holds m rows of nb (the kept block or the task's m·VB block),
                    // x is [m, d] and w's rows v0..v1 are in bounds.
                    unsafe { logits_block(dst, x, &w[v0 * d..v1 * d], m, nb, d) };
                    for (r, t) in tg.iter().enumerate() {
                        // SAFETY: row r of this task's block, written above and by no one else.
                        let row = unsafe { std::slice::from_raw_parts_mut(dst.add(r * nb), nb) };
                        if let Some(t) = *t {
                            let t = t as usize;
                            if (v0..v1).contains(&t) {
                                st.target_logit[r] = row[t - v0];
                            }
                        }
                        let bm = simd::max(row);
                        if bm > st.max[r] {
                            st.sum[r] *= ((st.max[r] - bm) as f64).exp();
                            st.max[r] = bm;
                        }
                        st.sum[r] += match keep {
                            Some((_, refs)) => {
                                // SAFETY: entry (block, r) is this task's alone.
                                unsafe { *refs.get((v0 / VB) * m + r) = st.max[r] };
                                simd::exp_in_place(row, st.max[r])
                            }
                            None => simd::sum_exp(row, st.max[r]),
                        } as f64;
                    }
                }
            });
            st
        })
        .collect()
}

/// dst[m, nb] = x[m, d] · w_blkᵀ (w_blk: [nb, d]), a block's logits: on `small_gemm`'s tiles
/// where the CPU has AVX-512, there are enough rows to pay for packing the block's words (as
/// `matmul::linear_fwd`), and the model is at least [`TILE_DEPTH`] wide; else through the crate.
///
/// # Safety
/// dst must be writable for m rows of nb.
unsafe fn logits_block(dst: *mut f32, x: &[f32], w_blk: &[f32], m: usize, nb: usize, d: usize) {
    #[cfg(target_arch = "x86_64")]
    if m >= crate::matmul::TILE_ROWS && d >= TILE_DEPTH && simd::has_avx512() {
        use crate::small_gemm::{self as sg, Limit, B};
        return with_buffer(&PACKED, sg::packed_len(nb, d), |buf| {
            sg::pack_transposed(buf.as_mut_ptr(), w_blk.as_ptr(), d, nb, d);
            sg::gemm(m, nb, d, dst, nb, false, x.as_ptr(), d, 1, B::packed(buf.as_ptr(), d), Limit::Depth, |_, _| {
                (0, d)
            });
        });
    }
    gemm_seq(m, nb, d, dst, nb, false, x.as_ptr(), d, 1, w_blk.as_ptr(), 1, d)
}

/// Each row's log-sum-exp from the ranges' statistics, and Σ loss over the rows with a target.
fn merge(stats: &[Stats], tg: &[Option<u32>]) -> (Vec<f32>, f64) {
    let mut loss = 0.0f64;
    let lse = (0..tg.len())
        .map(|r| {
            let mx = stats.iter().fold(f32::NEG_INFINITY, |a, s| a.max(s.max[r]));
            let s: f64 = stats.iter().map(|s| s.sum[r] * ((s.max[r] - mx) as f64).exp()).sum();
            let l = mx as f64 + s.ln();
            if let Some(t) = tg[r] {
                loss += l - stats[t as usize / RANGE].target_logit[r] as f64;
            }
            l as f32
        })
        .collect();
    (lse, loss)
}

/// Passes 1 and 2 over one chunk of rows; `logits` is rows · vocab of scratch.
#[allow(clippy::too_many_arguments)]
fn chunk_with_grads(
    x: &[f32],
    w: &[f32],
    tg: &[Option<u32>],
    d: usize,
    vocab: usize,
    weight: f32,
    logits: &mut [f32],
    dx: &mut [f32],
    dw: Option<(&mut [f32], bool)>,
) -> f64 {
    let m = tg.len();
    let mut ref_max = vec![0.0f32; vocab.div_ceil(VB) * m];
    let stats = pass1(x, w, tg, d, vocab, Some((&mut *logits, &mut ref_max)));
    let (lse, loss) = merge(&stats, tg);
    let (kept, ref_max): (&[f32], &[f32]) = (logits, &ref_max);
    let row_weight: Vec<f32> = tg.iter().map(|t| if t.is_some() { weight } else { 0.0 }).collect();
    let (dw, dw_add) = match dw {
        Some((dw, add)) => (Some(SharedMut::new(dw)), add),
        None => (None, true),
    };
    let partial: Vec<Vec<f32>> = ranges(vocab)
        .par_iter()
        .map(|&(a, b)| {
            let mut dxp = vec![0.0f32; m * d];
            // Per row: the reference maximum M of the last block and weight · exp(M − lse).
            // M changes a few times per row in a range, so this takes few exps.
            let mut scale_of = vec![(f32::NAN, 0.0f32); m];
            with_buffer(&TASK, m * GRAD_COLS, |g| {
                for s0 in (a..b).step_by(GRAD_COLS) {
                    let s1 = (s0 + GRAD_COLS).min(b);
                    for v0 in (s0..s1).step_by(VB) {
                        let v1 = (v0 + VB).min(s1);
                        let (nb, off) = (v1 - v0, v0 - s0);
                        for (r, (mref, scale)) in scale_of.iter_mut().enumerate() {
                            let dst = &mut g[r * GRAD_COLS + off..][..nb];
                            let mb = ref_max[(v0 / VB) * m + r];
                            if mb != *mref {
                                *mref = mb;
                                *scale = ((mb as f64 - lse[r] as f64).exp() * row_weight[r] as f64) as f32;
                            }
                            // dlogits = weight · softmax = exp(logit − M) · weight · exp(M − lse).
                            simd::scaled(dst, &kept[m * v0 + r * nb..][..nb], *scale);
                            if let Some(t) = tg[r] {
                                let t = t as usize;
                                if (v0..v1).contains(&t) {
                                    dst[t - v0] -= row_weight[r];
                                }
                            }
                        }
                    }
                    if let Some(dw) = dw {
                        // dW[s0..s1] (+)= dlogits[:, s0..s1]ᵀ · x: one product per GRAD_COLS
                        // words, so that x is packed once for all of them.
                        // SAFETY: rows s0..s1 of dW belong to this task; g holds m rows of
                        // GRAD_COLS, x is [m, d].
                        unsafe {
                            gemm_seq(
                                s1 - s0,
                                d,
                                m,
                                dw.ptr().add(s0 * d),
                                d,
                                dw_add,
                                g.as_ptr(),
                                1,
                                GRAD_COLS,
                                x.as_ptr(),
                                d,
                                1,
                            )
                        };
                    }
                    // dx (this range's part) += dlogits[:, s0..s1] · W[s0..s1].
                    // SAFETY: dxp is [m, d], g holds m rows of GRAD_COLS, W's rows s0..s1 exist.
                    unsafe {
                        gemm_seq(
                            m,
                            d,
                            s1 - s0,
                            dxp.as_mut_ptr(),
                            d,
                            true,
                            g.as_ptr(),
                            GRAD_COLS,
                            1,
                            w.as_ptr().add(s0 * d),
                            d,
                            1,
                        )
                    };
                }
            });
            dxp
        })
        .collect();
    dx.par_chunks_mut(d).enumerate().for_each(|(r, out)| {
        out.copy_from_slice(&partial[0][r * d..(r + 1) * d]);
        for p in &partial[1..] {
            out.iter_mut().zip(&p[r * d..(r + 1) * d]).for_each(|(o, v)| *o += v);
        }
    });
    loss
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use rand_distr::StandardNormal;

    /// The unfused reference in f64: logits, log-sum-exp, loss, dlogits and both products.
    fn reference(
        x: &[f32],
        w: &[f32],
        tg: &[Option<u32>],
        d: usize,
        vocab: usize,
        weight: f64,
    ) -> (f64, Vec<f64>, Vec<f64>) {
        let rows = tg.len();
        let (mut loss, mut dx, mut dw) = (0.0, vec![0.0; rows * d], vec![0.0; vocab * d]);
        for r in 0..rows {
            let Some(t) = tg[r] else { continue };
            let l: Vec<f64> =
                (0..vocab).map(|v| (0..d).map(|k| x[r * d + k] as f64 * w[v * d + k] as f64).sum()).collect();
            let mx = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = mx + l.iter().map(|v| (v - mx).exp()).sum::<f64>().ln();
            loss += lse - l[t as usize];
            for v in 0..vocab {
                let g = weight * ((l[v] - lse).exp() - if v == t as usize { 1.0 } else { 0.0 });
                for k in 0..d {
                    dx[r * d + k] += g * w[v * d + k] as f64;
                    dw[v * d + k] += g * x[r * d + k] as f64;
                }
            }
        }
        (loss, dx, dw)
    }

    /// Against the f64 reference, with a vocabulary that is not a multiple of the block, range
    /// or dx widths (several ranges, a short last block), rows without a target, and dw added to
    /// what it held or overwritten.
    #[test]
    fn matches_the_unfused_reference() {
        // A narrow model (the crate's products) and one whose logits blocks run on the tiles
        // where the CPU has AVX-512 (at least TILE_ROWS rows, TILE_DEPTH wide).
        for (rows, d, seed) in [(37, 24, 21), (60, TILE_DEPTH, 22)] {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let vocab = 2 * RANGE + 3 * VB + 5;
            let x: Vec<f32> = (0..rows * d).map(|_| rng.sample(StandardNormal)).collect();
            let w: Vec<f32> = (0..vocab * d).map(|_| 0.5 * rng.sample::<f32, _>(StandardNormal)).collect();
            let tg: Vec<Option<u32>> =
                (0..rows).map(|r| if r % 5 == 3 { None } else { Some(rng.gen_range(0..vocab as u32)) }).collect();
            let weight = 0.3f32;
            let (want_loss, want_dx, want_dw) = reference(&x, &w, &tg, d, vocab, weight as f64);
            for dw_add in [true, false] {
                let mut dx = vec![f32::NAN; rows * d];
                let mut dw = vec![if dw_add { 1.0f32 } else { f32::NAN }; vocab * d];
                let grads = HeadGrads { dx: &mut dx, dw: Some(&mut dw), dw_add };
                let loss = linear_cross_entropy(&x, &w, &tg, d, vocab, weight, Some(grads)).unwrap();
                assert!((loss - want_loss).abs() < 1e-5 * want_loss, "d {d}: loss {loss} vs {want_loss}");
                for (i, (a, b)) in dx.iter().zip(&want_dx).enumerate() {
                    assert!((*a as f64 - b).abs() < 1e-5, "d {d}: dx[{i}] {a} vs {b}");
                }
                let base = if dw_add { 1.0 } else { 0.0 };
                for (i, (a, b)) in dw.iter().zip(&want_dw).enumerate() {
                    assert!((*a as f64 - base - b).abs() < 1e-5, "d {d}: dw[{i}] {a} vs {base} + {b}");
                }
                // Loss only: the same loss; a frozen head: the same dx.
                let l2 = linear_cross_entropy(&x, &w, &tg, d, vocab, weight, None).unwrap();
                assert!((l2 - loss).abs() < 1e-9 * loss.abs());
                let mut dx2 = vec![0.0f32; rows * d];
                let frozen = HeadGrads { dx: &mut dx2, dw: None, dw_add: true };
                linear_cross_entropy(&x, &w, &tg, d, vocab, weight, Some(frozen)).unwrap();
                assert_eq!(dx, dx2);
            }
        }
    }

    #[test]
    fn bad_inputs_are_errors() {
        let (x, w) = (vec![0.0f32; 8], vec![0.0f32; 12]);
        assert!(linear_cross_entropy(&x, &w, &[Some(3), Some(0)], 4, 3, 1.0, None).is_err(), "target 3 of 3");
        assert!(linear_cross_entropy(&x, &w, &[Some(1); 3], 4, 3, 1.0, None).is_err(), "3 rows of 2");
        assert!(linear_cross_entropy(&x, &w, &[Some(1); 2], 4, 2, 1.0, None).is_err(), "w is not [2, 4]");
        // Without any target: no loss, dx = 0.
        let mut dx = vec![1.0f32; 8];
        let l = linear_cross_entropy(
            &x,
            &w,
            &[None, None],
            4,
            3,
            1.0,
            Some(HeadGrads { dx: &mut dx, dw: None, dw_add: true }),
        );
        assert_eq!(l.unwrap(), 0.0);
        assert!(dx.iter().all(|&v| v == 0.0));
    }

    /// With rows in two chunks (a vocabulary of 2^20 leaves 64 rows of logits per chunk), the
    /// first without a target, an overwritten dW is the second chunk's alone (it was added onto
    /// whatever dW held); with no target at all it is zero.
    #[test]
    fn overwritten_dw_when_the_first_chunk_has_no_target() {
        let (d, vocab, rows) = (2, 1 << 20, 128);
        assert_eq!(MAX_LOGITS / vocab, 64);
        let x: Vec<f32> = (0..rows * d).map(|i| ((i * 37) % 19) as f32 / 19.0 - 0.5).collect();
        let w: Vec<f32> = (0..vocab * d).map(|i| ((i * 7919) % 101) as f32 / 101.0 - 0.5).collect();
        let tg: Vec<Option<u32>> = (0..rows).map(|r| (r >= 64).then_some((r * 8191) as u32 % vocab as u32)).collect();
        let call = |x: &[f32], tg: &[Option<u32>]| {
            let (mut dx, mut dw) = (vec![f32::NAN; tg.len() * d], vec![f32::NAN; vocab * d]);
            let g = HeadGrads { dx: &mut dx, dw: Some(&mut dw), dw_add: false };
            let l = linear_cross_entropy(x, &w, tg, d, vocab, 1.0, Some(g)).unwrap();
            (l, dx, dw)
        };
        let (l, dx, dw) = call(&x, &tg);
        let (l2, dx2, dw2) = call(&x[64 * d..], &tg[64..]);
        assert_eq!(l, l2);
        assert!(dx[..64 * d].iter().all(|&v| v == 0.0));
        assert_eq!(&dx[64 * d..], &dx2[..]);
        assert!(dw == dw2, "dW differs from the second chunk's alone");
        let (l, dx, dw) = call(&x, &[None; 128]);
        assert_eq!(l, 0.0);
        assert!(dx.iter().chain(&dw).all(|&v| v == 0.0));
    }

    /// A NaN in the hidden states gives a NaN loss, not a finite one.
    #[test]
    fn nan_propagates() {
        let (d, vocab) = (4, 300);
        let mut x = vec![0.1f32; 2 * d];
        x[5] = f32::NAN;
        let w = vec![0.2f32; vocab * d];
        let l = linear_cross_entropy(&x, &w, &[Some(1), Some(2)], d, vocab, 1.0, None).unwrap();
        assert!(l.is_nan());
    }
}
