//! Vectorised loops for the parts of a CPU training step that are not matrix products: the
//! softmax over the vocabulary (row maxima, Σ exp, exp in place) and AdamW.
//!
//! The crate is built for baseline x86-64 (SSE2), where these loops ran 4 lanes wide at best and
//! partly scalar (the float-to-int conversion in `exp` did not vectorise). Here each loop has an
//! AVX2 + FMA version, chosen at run time when the CPU has both (checked once), and a portable
//! version with the same arithmetic for other CPUs. Results agree to rounding (FMA contracts a
//! product and a sum into one rounding); every caller keeps the f32 reference's tolerances. The
//! softmax loops also have an AVX-512 version, which gives the AVX2 version's bits.

use crate::scalar::fast_exp;
use std::sync::OnceLock;

/// `fn name(args) body`, compiled twice: for AVX2 + FMA, run where the CPU has both (its plain
/// loops then vectorise 8 lanes wide), and for the baseline elsewhere. The same source, and Rust
/// does not contract a product and a sum into an FMA by itself, so both give the same bits.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn imp($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            fn avx2($($arg: $ty),*) $(-> $ret)? {
                imp($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            if $crate::simd::has_avx2_fma() {
                // SAFETY: the CPU has AVX2 and FMA.
                return unsafe { avx2($($arg),*) };
            }
            imp($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// Returns from the calling softmax loop with its AVX-512 or AVX2 version (modules `avx512`,
/// `avx2`) where the CPU has it; the portable loop follows the call.
macro_rules! fastest_version {
    ($f:ident($($a:expr),*)) => {
        #[cfg(target_arch = "x86_64")]
        if has_avx512() {
            // SAFETY: the CPU has AVX-512F, AVX2 and FMA.
            return unsafe { avx512::$f($($a),*) };
        }
        #[cfg(target_arch = "x86_64")]
        if has_avx2_fma() {
            // SAFETY: the CPU has AVX2 and FMA.
            return unsafe { avx2::$f($($a),*) };
        }
    };
}

/// Whether the AVX2 + FMA paths run on this CPU (false off x86-64).
pub fn has_avx2_fma() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Whether the AVX-512 paths of the softmax loops run on this CPU (false off x86-64).
pub fn has_avx512() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            has_avx2_fma() && is_x86_feature_detected!("avx512f")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// The largest value of `x` (−∞ for an empty slice; NaNs are skipped here and caught by
/// [`sum_exp`], whose result they turn into NaN).
pub fn max(x: &[f32]) -> f32 {
    fastest_version!(max(x));
    x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v))
}

/// Σ exp(x_i − m), the terms summed in f32 lanes.
pub fn sum_exp(x: &[f32], m: f32) -> f32 {
    fastest_version!(sum_exp(x, m));
    let mut acc = [0.0f32; 8];
    let mut it = x.chunks_exact(8);
    for c in &mut it {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += fast_exp(v - m);
        }
    }
    let tail: f32 = it.remainder().iter().map(|&v| fast_exp(v - m)).sum();
    acc.iter().sum::<f32>() + tail
}

/// x_i = exp(x_i − m) in place; returns Σ of the new x_i (summed in f32 lanes).
pub fn exp_in_place(x: &mut [f32], m: f32) -> f32 {
    fastest_version!(exp_in_place(x, m));
    let mut acc = [0.0f32; 8];
    let mut it = x.chunks_exact_mut(8);
    for c in &mut it {
        for (a, v) in acc.iter_mut().zip(c) {
            *v = fast_exp(*v - m);
            *a += *v;
        }
    }
    let mut tail = 0.0f32;
    for v in it.into_remainder() {
        *v = fast_exp(*v - m);
        tail += *v;
    }
    acc.iter().sum::<f32>() + tail
}

/// dst_i = src_i · c.
pub fn scaled(dst: &mut [f32], src: &[f32], c: f32) {
    assert_eq!(dst.len(), src.len());
    // A plain loop: the compiler vectorises it in any build.
    dst.iter_mut().zip(src).for_each(|(d, &s)| *d = s * c);
}

/// One AdamW step over a slice, in place (see `foxlm::optim::AdamW::update`):
///   g' = g · gscale;  m = β1 m + (1−β1) g';  v = β2 v + (1−β2) g'²
///   p = p · decay − step · m / (sqrt(v) / bc2_sqrt + ε)
pub fn adamw(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], h: &AdamWStep) {
    let n = p.len();
    assert!(g.len() == n && m.len() == n && v.len() == n, "adamw: slices of different lengths");
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA; the lengths are equal.
        return unsafe { avx2::adamw(p, g, m, v, h) };
    }
    adamw_scalar(p, g, m, v, h)
}

/// AdamW's per-step constants.
#[derive(Clone, Copy, Debug)]
pub struct AdamWStep {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// lr / (1 − β1^t)
    pub step_size: f32,
    /// sqrt(1 − β2^t)
    pub bc2_sqrt: f32,
    /// 1 − lr·λ for decayed parameters, else 1.
    pub decay: f32,
    /// Gradient scale (clipping), 1 when not clipped.
    pub gscale: f32,
}

#[inline(always)]
fn adamw_scalar(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], h: &AdamWStep) {
    for (((p, g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
        let gj = *g * h.gscale;
        *m = h.beta1 * *m + (1.0 - h.beta1) * gj;
        *v = h.beta2 * *v + (1.0 - h.beta2) * gj * gj;
        let denom = v.sqrt() / h.bc2_sqrt + h.eps;
        *p = *p * h.decay - h.step_size * *m / denom;
    }
}

/// Σ x_i² in f64, in 8 independent lanes (the order is fixed, so the result is reproducible).
pub fn sum_squares_f64(x: &[f32]) -> f64 {
    let mut acc = [0.0f64; 8];
    let mut it = x.chunks_exact(8);
    for c in &mut it {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += v as f64 * v as f64;
        }
    }
    let tail: f64 = it.remainder().iter().map(|&v| v as f64 * v as f64).sum();
    acc.iter().sum::<f64>() + tail
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::AdamWStep;
    use std::arch::x86_64::*;

    /// exp of 8 lanes: the arithmetic of `scalar::fast_exp` (x = n·ln2 + r, a degree-6
    /// polynomial for e^r, 2^n from the exponent bits) with FMAs; 0 below -87.3, as there. NaN
    /// lanes stay NaN (the clamp's operand order and the ordered compare keep them).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn exp8(x: __m256) -> __m256 {
        // Lanes below -87.3 become 0 at the end (ordered compare: NaN lanes are kept).
        let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.3));
        let x = _mm256_min_ps(_mm256_set1_ps(88.0), _mm256_max_ps(_mm256_set1_ps(-87.3), x));
        let magic = _mm256_set1_ps(12_582_912.0);
        let t = _mm256_fmadd_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E), magic);
        let n = _mm256_sub_ps(t, magic);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm256_set1_ps(0.001_388_888_9);
        for c in [0.008_333_334f32, 0.041_666_668, 0.166_666_67, 0.5, 1.0, 1.0] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        // t's low mantissa bits hold n: 2^n = (n + 127) << 23.
        let e = _mm256_add_epi32(
            _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(magic)),
            _mm256_set1_epi32(127),
        );
        _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e))))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn max(x: &[f32]) -> f32 {
        let n = x.len();
        let p = x.as_ptr();
        let mut m0 = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut m1 = m0;
        let mut i = 0;
        while i + 16 <= n {
            m0 = _mm256_max_ps(m0, _mm256_loadu_ps(p.add(i)));
            m1 = _mm256_max_ps(m1, _mm256_loadu_ps(p.add(i + 8)));
            i += 16;
        }
        let m = _mm256_max_ps(m0, m1);
        let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_max_ss(h, _mm_shuffle_ps::<1>(h, h));
        let mut r = _mm_cvtss_f32(h);
        for &v in &x[i..] {
            r = r.max(v);
        }
        r
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn sum_exp(x: &[f32], m: f32) -> f32 {
        let n = x.len();
        let p = x.as_ptr();
        let mv = _mm256_set1_ps(m);
        let mut a0 = _mm256_setzero_ps();
        let mut a1 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            a0 = _mm256_add_ps(a0, exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mv)));
            a1 = _mm256_add_ps(a1, exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i + 8)), mv)));
            i += 16;
        }
        if i + 8 <= n {
            a0 = _mm256_add_ps(a0, exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mv)));
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(a0, a1));
        for &v in &x[i..] {
            s += super::fast_exp(v - m);
        }
        s
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn exp_in_place(x: &mut [f32], m: f32) -> f32 {
        let n = x.len();
        let p = x.as_mut_ptr();
        let mv = _mm256_set1_ps(m);
        let mut a0 = _mm256_setzero_ps();
        let mut a1 = _mm256_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            let e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mv));
            let e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i + 8)), mv));
            _mm256_storeu_ps(p.add(i), e0);
            _mm256_storeu_ps(p.add(i + 8), e1);
            a0 = _mm256_add_ps(a0, e0);
            a1 = _mm256_add_ps(a1, e1);
            i += 16;
        }
        if i + 8 <= n {
            let e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mv));
            _mm256_storeu_ps(p.add(i), e0);
            a0 = _mm256_add_ps(a0, e0);
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(a0, a1));
        for v in &mut x[i..] {
            *v = super::fast_exp(*v - m);
            s += *v;
        }
        s
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn adamw(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], h: &AdamWStep) {
        let n = p.len();
        let (pp, gp, mp, vp) = (p.as_mut_ptr(), g.as_ptr(), m.as_mut_ptr(), v.as_mut_ptr());
        let b1 = _mm256_set1_ps(h.beta1);
        let b1c = _mm256_set1_ps(1.0 - h.beta1);
        let b2 = _mm256_set1_ps(h.beta2);
        let b2c = _mm256_set1_ps(1.0 - h.beta2);
        let eps = _mm256_set1_ps(h.eps);
        let step = _mm256_set1_ps(h.step_size);
        let bc2 = _mm256_set1_ps(h.bc2_sqrt);
        let decay = _mm256_set1_ps(h.decay);
        let gs = _mm256_set1_ps(h.gscale);
        let mut i = 0;
        while i + 8 <= n {
            let gj = _mm256_mul_ps(_mm256_loadu_ps(gp.add(i)), gs);
            let mj = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(mp.add(i))), _mm256_mul_ps(b1c, gj));
            let vj =
                _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(vp.add(i))), _mm256_mul_ps(_mm256_mul_ps(b2c, gj), gj));
            let denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vj), bc2), eps);
            let pj = _mm256_sub_ps(
                _mm256_mul_ps(_mm256_loadu_ps(pp.add(i)), decay),
                _mm256_div_ps(_mm256_mul_ps(step, mj), denom),
            );
            _mm256_storeu_ps(mp.add(i), mj);
            _mm256_storeu_ps(vp.add(i), vj);
            _mm256_storeu_ps(pp.add(i), pj);
            i += 8;
        }
        super::adamw_scalar(&mut p[i..], &g[i..], &mut m[i..], &mut v[i..], h);
    }
}

/// The softmax loops 16 lanes wide. The same arithmetic as `avx2` lane for lane (2^n is applied
/// by `vscalefps`, which rounds p·2^n once, as the multiply by an exact 2^n does) and the same
/// summation order (lanes 0–7 and 8–15 are avx2's two accumulators), so the same bits: on Zen 4
/// a 512-bit operation costs two 256-bit ones, and the gain is half the instructions.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::avx2::{exp8, hsum};
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn exp16(x: __m512) -> __m512 {
        let kept = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(x, _mm512_set1_ps(-87.3));
        let x = _mm512_min_ps(_mm512_set1_ps(88.0), _mm512_max_ps(_mm512_set1_ps(-87.3), x));
        let magic = _mm512_set1_ps(12_582_912.0);
        let t = _mm512_fmadd_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E), magic);
        let n = _mm512_sub_ps(t, magic);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm512_set1_ps(0.001_388_888_9);
        for c in [0.008_333_334f32, 0.041_666_668, 0.166_666_67, 0.5, 1.0, 1.0] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        _mm512_maskz_mov_ps(kept, _mm512_scalef_ps(p, n))
    }

    /// Σ of the 16 lanes as avx2 sums its two accumulators: (lanes 0–7) + (lanes 8–15), then
    /// 8 lanes horizontally.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    fn hsum16(v: __m512, tail8: __m256) -> f32 {
        let lo = _mm256_add_ps(_mm512_castps512_ps256(v), tail8);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        hsum(_mm256_add_ps(lo, hi))
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn max(x: &[f32]) -> f32 {
        let n = x.len();
        let p = x.as_ptr();
        let mut m0 = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut i = 0;
        while i + 16 <= n {
            m0 = _mm512_max_ps(m0, _mm512_loadu_ps(p.add(i)));
            i += 16;
        }
        let mut r = _mm512_reduce_max_ps(m0);
        for &v in &x[i..] {
            r = r.max(v);
        }
        r
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn sum_exp(x: &[f32], m: f32) -> f32 {
        let n = x.len();
        let p = x.as_ptr();
        let mv = _mm512_set1_ps(m);
        let mut a = _mm512_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            a = _mm512_add_ps(a, exp16(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), mv)));
            i += 16;
        }
        let mut t8 = _mm256_setzero_ps();
        if i + 8 <= n {
            t8 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), _mm256_set1_ps(m)));
            i += 8;
        }
        let mut s = hsum16(a, t8);
        for &v in &x[i..] {
            s += super::fast_exp(v - m);
        }
        s
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn exp_in_place(x: &mut [f32], m: f32) -> f32 {
        let n = x.len();
        let p = x.as_mut_ptr();
        let mv = _mm512_set1_ps(m);
        let mut a = _mm512_setzero_ps();
        let mut i = 0;
        while i + 16 <= n {
            let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), mv));
            _mm512_storeu_ps(p.add(i), e);
            a = _mm512_add_ps(a, e);
            i += 16;
        }
        let mut t8 = _mm256_setzero_ps();
        if i + 8 <= n {
            t8 = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), _mm256_set1_ps(m)));
            _mm256_storeu_ps(p.add(i), t8);
            i += 8;
        }
        let mut s = hsum16(a, t8);
        for v in &mut x[i..] {
            *v = super::fast_exp(*v - m);
            s += *v;
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|i| scale * (((i * 7919) % 1013) as f32 / 1013.0 - 0.5)).collect()
    }

    /// The dispatched loops (AVX2 on this CPU when it has it) against plain f64 arithmetic, on
    /// lengths that exercise the vector body and every tail length.
    #[test]
    fn loops_match_f64() {
        for n in [0usize, 1, 7, 8, 15, 16, 17, 31, 100, 1003] {
            let x = data(n, 40.0);
            let m = max(&x);
            assert_eq!(m, x.iter().cloned().fold(f32::NEG_INFINITY, f32::max), "max, n={n}");
            let want: f64 = x.iter().map(|&v| ((v - m) as f64).exp()).sum();
            let got = sum_exp(&x, m) as f64;
            assert!((got - want).abs() <= 1e-6 * want.max(1.0), "sum_exp n={n}: {got} vs {want}");
            let mut e = x.clone();
            let s2 = exp_in_place(&mut e, m) as f64;
            assert!((s2 - want).abs() <= 1e-6 * want.max(1.0), "exp_in_place sum n={n}: {s2} vs {want}");
            for (a, &v) in e.iter().zip(&x) {
                let w = ((v - m) as f64).exp();
                assert!((*a as f64 - w).abs() <= 1e-6 * w + 1e-30, "exp_in_place n={n}: {a} vs {w}");
            }
        }
        // A NaN anywhere makes the sum NaN (a NaN logit must not give a finite loss).
        let mut x = data(40, 3.0);
        x[21] = f32::NAN;
        assert!(sum_exp(&x, max(&x)).is_nan());
        x[21] = 0.0;
        x[39] = f32::NAN;
        assert!(sum_exp(&x, max(&x)).is_nan());
    }

    /// Below f32's normal range the exps are exactly 0 (never a denormal, which Intel cores
    /// multiply in microcode), in the vector body and the tails alike; NaN stays NaN.
    #[test]
    fn exps_below_the_normal_range_are_zero() {
        let edge = [-87.29f32, -87.3, -87.31, -90.0, -103.9, -1e4, f32::NEG_INFINITY, f32::NAN, 0.0];
        for n in [9usize, 16, 17, 40] {
            let x: Vec<f32> = (0..n).map(|i| edge[i % edge.len()]).collect();
            let mut e = x.clone();
            exp_in_place(&mut e, 0.0);
            for (&v, &r) in x.iter().zip(&e) {
                match v {
                    v if v.is_nan() => assert!(r.is_nan()),
                    v if v < -87.3 => assert_eq!(r.to_bits(), 0, "exp({v}), n={n}"),
                    v => assert!(
                        r >= f32::MIN_POSITIVE && (r as f64 - (v as f64).exp()).abs() <= 1e-6 * (v as f64).exp()
                    ),
                }
            }
        }
    }

    /// The AVX-512 loops give the AVX2 loops' bits (same lanes, same order), on every tail
    /// length and on arguments that reach the clamps and subnormal results.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_gives_the_avx2_bits() {
        if !has_avx512() {
            eprintln!("no AVX-512 on this CPU: nothing to compare");
            return;
        }
        for n in [0usize, 1, 7, 8, 9, 15, 16, 17, 24, 31, 33, 100, 1003] {
            let mut x = data(n, 240.0);
            if n > 3 {
                x[3] = -200.0;
            }
            let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max).max(0.0);
            // SAFETY: has_avx512 implies AVX2 and FMA.
            unsafe {
                assert_eq!(avx512::max(&x).to_bits(), avx2::max(&x).to_bits(), "max n={n}");
                assert_eq!(avx512::sum_exp(&x, m).to_bits(), avx2::sum_exp(&x, m).to_bits(), "sum_exp n={n}");
                let (mut a, mut b) = (x.clone(), x.clone());
                let (sa, sb) = (avx512::exp_in_place(&mut a, m), avx2::exp_in_place(&mut b, m));
                assert_eq!(sa.to_bits(), sb.to_bits(), "exp_in_place sum n={n}");
                assert_eq!(
                    a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "exp_in_place n={n}"
                );
            }
        }
    }

    #[test]
    fn adamw_matches_the_scalar_loop() {
        let n = 203;
        let h =
            AdamWStep { beta1: 0.9, beta2: 0.95, eps: 1e-8, step_size: 0.01, bc2_sqrt: 0.3, decay: 0.999, gscale: 0.5 };
        let (p0, g0, m0) = (data(n, 2.0), data(n, 1.0), data(n, 0.1));
        let v0: Vec<f32> = data(n, 0.1).iter().map(|v| v * v).collect();
        let (mut p, mut m, mut v) = (p0.clone(), m0.clone(), v0.clone());
        adamw(&mut p, &g0, &mut m, &mut v, &h);
        let (mut p2, mut m2, mut v2) = (p0, m0, v0);
        adamw_scalar(&mut p2, &g0, &mut m2, &mut v2, &h);
        // The same operations in the same order (no FMA in either): the same bits.
        assert_eq!((p, m, v), (p2, m2, v2));
    }

    #[test]
    fn sum_squares() {
        let x = data(1001, 3.0);
        let want: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
        assert!((sum_squares_f64(&x) - want).abs() < 1e-9 * want);
    }
}
