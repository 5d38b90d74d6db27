//! The attention's small products on AVX-512 register tiles, each row tile restricted to the
//! columns or the depth its rows need.
//!
//! The attention's blocks are products of 64 rows by at most a few hundred keys with d = 64:
//! through the `gemm` crate each call packed both operands and sized its blocking (a fifth of
//! the attention's time went to packing and set-up), and the causal mask's upper triangle was
//! computed and thrown away. Here a tile of up to 6 rows × 64 columns is 24 zmm accumulators
//! (the crate's own micro-kernel shape); A's elements are broadcast from wherever they are (any
//! strides, no packing), B's rows are read as they are (contiguous columns) or from a transposed
//! copy packed in 64-column panels, and per row tile a caller's `span` limits the columns
//! computed ([`Limit::Cols`]: the keys a block of query rows sees) or the depth summed
//! ([`Limit::Depth`]: the keys, or the query rows, whose probabilities are not zero). Each
//! element is one FMA chain over its depth in order: the result does not depend on threads.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Columns per panel: four zmm of 16.
pub const PANEL: usize = 64;
/// Rows per tile.
const MR: usize = 6;
/// Depth per pass over the row tiles.
const KC: usize = 256;

/// What a row tile's span limits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Limit {
    /// The columns computed: others are left as they are.
    Cols,
    /// The depth summed over: every column is written (or added to).
    Depth,
}

/// The B operand: rows of contiguous columns, row stride `rs`, and `panel` values between the
/// starts of consecutive 64-column panels (64 for a row-major matrix; d · 64 for the packed
/// panels of [`pack_transposed`], whose rows are 64 apart).
#[derive(Clone, Copy, Debug)]
pub struct B {
    pub ptr: *const f32,
    pub rs: usize,
    pub panel: usize,
}

/// Values per packed head of `t` rows of `d` (whole panels of 64 rows).
pub fn packed_len(t: usize, d: usize) -> usize {
    t.div_ceil(PANEL) * d * PANEL
}

/// The transpose of `t` rows of `d` values (`src`, row stride `src_rs`), packed in panels of 64
/// rows: panel v holds Bᵀ[p, 64v..64v+64] for p < d at dst[v·d·64 + p·64..]; the last panel's
/// columns past t are not written (the tiles never read them). A B operand from column 64v on is
/// [`B::packed`] at dst[v·d·64..].
///
/// # Safety
/// src must be readable at j·src_rs + p for j < t, p < d; dst must hold `packed_len(t, d)` values.
pub unsafe fn pack_transposed(dst: *mut f32, src: *const f32, src_rs: usize, t: usize, d: usize) {
    let at = |j: usize, p: usize| dst.add(j / PANEL * d * PANEL + p * PANEL + j % PANEL);
    // Whole 16 × 16 blocks through registers where the CPU has AVX-512 (a 16-row group never
    // straddles a panel: 16 divides 64), the rest one value at a time.
    let (t16, d16) =
        if cfg!(target_arch = "x86_64") && crate::simd::has_avx512() { (t / 16 * 16, d / 16 * 16) } else { (0, 0) };
    #[cfg(target_arch = "x86_64")]
    for j in (0..t16).step_by(16) {
        for p in (0..d16).step_by(16) {
            transpose16(src.add(j * src_rs + p), src_rs, at(j, p), PANEL);
        }
    }
    for j in 0..t {
        let row = src.add(j * src_rs);
        let from = if j < t16 { d16 } else { 0 };
        for p in from..d {
            *at(j, p) = *row.add(p);
        }
    }
}

/// dst[q·dst_rs + r] = src[r·src_rs + q] for r, q < 16: four rounds of shuffles.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose16(src: *const f32, src_rs: usize, dst: *mut f32, dst_rs: usize) {
    let mut r: [__m512; 16] = std::array::from_fn(|i| _mm512_loadu_ps(src.add(i * src_rs)));
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    let pd = _mm512_castps_pd;
    for i in 0..4 {
        let (a, b, c, e) = (t[4 * i], t[4 * i + 1], t[4 * i + 2], t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(a), pd(c)));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(a), pd(c)));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(pd(b), pd(e)));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(pd(b), pd(e)));
    }
    for i in 0..2 {
        for j in 0..4 {
            t[8 * i + j] = _mm512_shuffle_f32x4::<0x88>(r[8 * i + j], r[8 * i + j + 4]);
            t[8 * i + j + 4] = _mm512_shuffle_f32x4::<0xDD>(r[8 * i + j], r[8 * i + j + 4]);
        }
    }
    for j in 0..8 {
        _mm512_storeu_ps(dst.add(j * dst_rs), _mm512_shuffle_f32x4::<0x88>(t[j], t[j + 8]));
        _mm512_storeu_ps(dst.add((j + 8) * dst_rs), _mm512_shuffle_f32x4::<0xDD>(t[j], t[j + 8]));
    }
}

impl B {
    /// Rows of contiguous columns, row stride `rs`.
    pub fn rows(ptr: *const f32, rs: usize) -> Self {
        B { ptr, rs, panel: PANEL }
    }
    /// Panels of [`pack_transposed`] with depth `d`, from the panel at `ptr`.
    pub fn packed(ptr: *const f32, d: usize) -> Self {
        B { ptr, rs: PANEL, panel: d * PANEL }
    }
}

/// C[m, n] (row stride c_rs) = (acc ? C : 0) + A[m, k] · B[k, n], per tile of rows [i0, i1)
/// restricted by `span(i0, i1)` = [lo, hi) as `limit` says: with `Cols`, the columns from the
/// start of lo's 16-column vector up to hi are computed, the others not touched (an empty span
/// skips the tile); with `Depth`, the sum runs over p in [lo, hi) only (an empty one writes 0, or
/// leaves C).
///
/// # Safety
/// The CPU has AVX-512F; C is writable and A, B readable over the shapes given; no other thread
/// touches the written part of C.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub unsafe fn gemm(
    m: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    c_rs: usize,
    acc: bool,
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: B,
    limit: Limit,
    span: impl Fn(usize, usize) -> (usize, usize),
) {
    // Depth in blocks of KC: a block of a panel of B stays in L2 while every row tile reads it.
    // A tile's sum goes on through C between blocks, which keeps its bits.
    for v0 in (0..n).step_by(PANEL) {
        let bp = b.ptr.add(v0 / PANEL * b.panel);
        for kb in (0..k.max(1)).step_by(KC) {
            let ke = (kb + KC).min(k);
            let mut i0 = 0;
            while i0 < m {
                let i1 = (i0 + MR).min(m);
                let (lo, hi) = span(i0, i1);
                // Columns [c0, c1) of this panel: vectors from v0 + 16·first, the last one masked.
                let (mut c1, mut first, mut k0, mut k1) = ((v0 + PANEL).min(n), 0, 0, k);
                match limit {
                    Limit::Cols => {
                        if hi <= lo || hi <= v0 || lo >= c1 {
                            i0 = i1;
                            continue;
                        }
                        c1 = c1.min(hi);
                        first = lo.saturating_sub(v0) / 16;
                    }
                    Limit::Depth => (k0, k1) = (lo.min(k), hi.min(k).max(lo.min(k))),
                }
                // This block's part of the tile's depth; an empty depth is written (0, or C
                // left) in the first block only.
                let (d0, d1) = (k0.max(kb), k1.min(ke));
                if d0 >= d1 && !(k0 >= k1 && kb == 0) {
                    i0 = i1;
                    continue;
                }
                let c0 = v0 + 16 * first;
                let nv = (c1 - c0).div_ceil(16);
                let last = (c1 - c0) - 16 * (nv - 1);
                let mut masks = [0xffffu16; 4];
                masks[nv - 1] = if last == 16 { 0xffff } else { (1u16 << last) - 1 };
                let t = Tile {
                    k0: d0,
                    k1: d1.max(d0),
                    c: c.add(i0 * c_rs + c0),
                    c_rs,
                    acc: acc || d0 > k0,
                    a: a.add(i0 * a_rs),
                    a_rs,
                    a_cs,
                    b: bp.add(16 * first),
                    b_rs: b.rs,
                    masks,
                };
                dispatch(i1 - i0, nv, &t);
                i0 = i1;
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
struct Tile {
    k0: usize,
    k1: usize,
    c: *mut f32,
    c_rs: usize,
    acc: bool,
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    b_rs: usize,
    masks: [u16; 4],
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dispatch(rows: usize, nv: usize, t: &Tile) {
    macro_rules! go {
        ($($r:literal),*) => {
            match (rows, nv) {
                $(
                    ($r, 1) => tile::<$r, 1>(t),
                    ($r, 2) => tile::<$r, 2>(t),
                    ($r, 3) => tile::<$r, 3>(t),
                    ($r, 4) => tile::<$r, 4>(t),
                )*
                _ => unreachable!("tile of {rows} rows, {nv} vectors"),
            }
        };
    }
    go!(1, 2, 3, 4, 5, 6)
}

/// One tile of R rows × NV vectors: accumulators in registers, one FMA chain per element.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn tile<const R: usize, const NV: usize>(t: &Tile) {
    let mut s = [[_mm512_setzero_ps(); NV]; R];
    if t.acc {
        for (r, row) in s.iter_mut().enumerate() {
            for (v, x) in row.iter_mut().enumerate() {
                *x = _mm512_maskz_loadu_ps(t.masks[v], t.c.add(r * t.c_rs + 16 * v));
            }
        }
    }
    for p in t.k0..t.k1 {
        let bp = t.b.add(p * t.b_rs);
        let mut bv = [_mm512_setzero_ps(); NV];
        for (v, x) in bv.iter_mut().enumerate() {
            *x = _mm512_maskz_loadu_ps(t.masks[v], bp.add(16 * v));
        }
        let ap = t.a.add(p * t.a_cs);
        for (r, row) in s.iter_mut().enumerate() {
            let av = _mm512_set1_ps(*ap.add(r * t.a_rs));
            for (x, &bb) in row.iter_mut().zip(&bv) {
                *x = _mm512_fmadd_ps(av, bb, *x);
            }
        }
    }
    for (r, row) in s.iter().enumerate() {
        for (v, &x) in row.iter().enumerate() {
            _mm512_mask_storeu_ps(t.c.add(r * t.c_rs + 16 * v), t.masks[v], x);
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    fn val(i: usize, s: usize) -> f32 {
        ((i * s) % 1009) as f32 / 504.5 - 1.0
    }

    /// The packed panels hold the transpose, value for value, on shapes with and without whole
    /// 16 × 16 blocks.
    #[test]
    fn packing_transposes() {
        for (t, d, rs) in [(64usize, 64usize, 64usize), (150, 40, 45), (17, 16, 16), (5, 3, 7), (200, 64, 768)] {
            let src: Vec<f32> = (0..t * rs).map(|i| i as f32).collect();
            let mut dst = vec![f32::NAN; packed_len(t, d)];
            // SAFETY: src holds t rows of stride rs ≥ d; dst holds packed_len(t, d).
            unsafe { pack_transposed(dst.as_mut_ptr(), src.as_ptr(), rs, t, d) };
            for j in 0..t {
                for p in 0..d {
                    assert_eq!(
                        dst[j / PANEL * d * PANEL + p * PANEL + j % PANEL],
                        src[j * rs + p],
                        "{t}x{d}: ({j}, {p})"
                    );
                }
            }
        }
    }

    /// Every tile shape (1–6 rows, 1–4 vectors, partial vectors), both limits, accumulating or
    /// not, B as rows and as packed panels, against an f64 product over each tile's span: the
    /// computed columns match, and with `Cols` the columns outside the span's vectors (and past
    /// its end) are left untouched.
    #[test]
    fn tiles_match_the_product_over_their_spans() {
        if !crate::simd::has_avx512() {
            eprintln!("no AVX-512 on this CPU: the tiles are not used here");
            return;
        }
        for (m, n, k) in
            [(13usize, 130usize, 64usize), (6, 64, 7), (1, 15, 3), (11, 17, 0), (20, 200, 33), (13, 130, 600)]
        {
            let a: Vec<f32> = (0..m * k).map(|i| val(i, 7919)).collect();
            // B [k, n] as rows (stride n + 3) and its transpose [n, k] packed.
            let brs = n + 3;
            let b: Vec<f32> = (0..k * brs).map(|i| val(i, 104729)).collect();
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * brs + i / k]).collect();
            let mut packed = vec![f32::NAN; packed_len(n, k)];
            // SAFETY: bt is [n, k]; packed holds packed_len(n, k).
            unsafe { pack_transposed(packed.as_mut_ptr(), bt.as_ptr(), k, n, k) };
            // A tile's span: a shifting window, sometimes empty.
            let span = |i0: usize, _i1: usize, len: usize| {
                let lo = (i0 * 5) % (len + 1);
                (lo, (lo + 3 + i0 * 11).min(len))
            };
            for limit in [Limit::Cols, Limit::Depth] {
                let len = if limit == Limit::Cols { n } else { k };
                for acc in [false, true] {
                    for (which, bop) in [("rows", B::rows(b.as_ptr(), brs)), ("packed", B::packed(packed.as_ptr(), k))]
                    {
                        let init: Vec<f32> = (0..m * n).map(|i| val(i, 31)).collect();
                        let mut c = init.clone();
                        // SAFETY: c is [m, n], a is [m, k] (row stride k), B as built above.
                        unsafe {
                            gemm(m, n, k, c.as_mut_ptr(), n, acc, a.as_ptr(), k, 1, bop, limit, |i0, i1| {
                                span(i0, i1, len)
                            })
                        };
                        for i in 0..m {
                            let i0 = i / 6 * 6;
                            let (lo, hi) = span(i0, (i0 + 6).min(m), len);
                            for j in 0..n {
                                let (p0, p1, computed) = match limit {
                                    Limit::Cols => {
                                        // From the vector that holds the span's start (in this
                                        // panel) to its end, masked there.
                                        let panel_end = (j / 64 * 64 + 64).min(n);
                                        let lo_v = lo.max(j / 64 * 64) / 16 * 16;
                                        (0, k, lo < hi && j >= lo_v && j < hi.min(panel_end))
                                    }
                                    Limit::Depth => (lo.min(hi), hi, true),
                                };
                                let got = c[i * n + j];
                                if !computed {
                                    assert_eq!(
                                        got.to_bits(),
                                        init[i * n + j].to_bits(),
                                        "{which} {limit:?} ({i}, {j}) touched"
                                    );
                                    continue;
                                }
                                let mut want = if acc { init[i * n + j] as f64 } else { 0.0 };
                                for p in p0..p1 {
                                    want += a[i * k + p] as f64 * b[p * brs + j] as f64;
                                }
                                assert!(
                                    (got as f64 - want).abs() < 1e-5 * (1.0 + want.abs()),
                                    "{m}x{n}x{k} {which} {limit:?} acc={acc} ({i}, {j}): {got} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
