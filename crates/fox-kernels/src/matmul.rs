//! Matrix products through the `gemm` crate. Linear weights are stored [out, in] as in PyTorch.

use gemm::Parallelism;

fn parallelism(m: usize, n: usize, k: usize) -> Parallelism {
    // Threading a tiny product costs more than it saves (decoding runs many of them).
    if m * n * k < 1 << 18 {
        Parallelism::None
    } else {
        Parallelism::Rayon(0)
    }
}

/// dst[m, n] (row stride dst_rs) = (accumulate ? dst : 0) + A[m, k] · B[k, n], with arbitrary
/// element strides for A and B (row stride, column stride).
#[allow(clippy::too_many_arguments)]
pub fn gemm_strided(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    dst_rs: usize,
    accumulate: bool,
    a: &[f32],
    a_rs: usize,
    a_cs: usize,
    b: &[f32],
    b_rs: usize,
    b_cs: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(dst.len() >= (m - 1) * dst_rs + n, "gemm: dst too small");
    if k > 0 {
        assert!(a.len() > (m - 1) * a_rs + (k - 1) * a_cs, "gemm: A too small");
        assert!(b.len() > (k - 1) * b_rs + (n - 1) * b_cs, "gemm: B too small");
    }
    // SAFETY: bounds checked above.
    unsafe {
        gemm_ptr(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            dst_rs,
            accumulate,
            a.as_ptr(),
            a_rs,
            a_cs,
            b.as_ptr(),
            b_rs,
            b_cs,
            parallelism(m, n, k),
        );
    }
}

/// `gemm_strided` on raw pointers, single-threaded: for callers that already split the work
/// between threads and write disjoint parts of one buffer.
///
/// # Safety
/// dst must be valid for writes at (i·dst_rs + j) for i < m, j < n, A for reads at
/// (i·a_rs + p·a_cs), B at (p·b_rs + j·b_cs) for p < k; no other thread may touch those
/// elements of dst meanwhile.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_seq(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    accumulate: bool,
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    b_rs: usize,
    b_cs: usize,
) {
    gemm_ptr(m, n, k, dst, dst_rs, accumulate, a, a_rs, a_cs, b, b_rs, b_cs, Parallelism::None)
}

#[allow(clippy::too_many_arguments)]
unsafe fn gemm_ptr(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    accumulate: bool,
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    b_rs: usize,
    b_cs: usize,
    par: Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                std::slice::from_raw_parts_mut(dst.add(r * dst_rs), n).fill(0.0);
            }
        }
        return;
    }
    gemm::gemm(
        m,
        n,
        k,
        dst,
        1,
        dst_rs as isize,
        accumulate,
        a,
        a_cs as isize,
        a_rs as isize,
        b,
        b_cs as isize,
        b_rs as isize,
        1.0,
        1.0,
        false,
        false,
        false,
        par,
    );
}

/// y[m, n] = x[m, k] · wᵀ, w: [n, k] (a Linear layer without bias).
pub fn linear_fwd(y: &mut [f32], x: &[f32], w: &[f32], m: usize, k: usize, n: usize) {
    gemm_strided(m, n, k, y, n, false, x, k, 1, w, 1, k);
}

/// Backward of `linear_fwd`: dx[m, k] (+)= dy · w, dw[n, k] += dyᵀ · x.
#[allow(clippy::too_many_arguments)]
pub fn linear_bwd(
    dx: Option<&mut [f32]>,
    accumulate_dx: bool,
    dw: &mut [f32],
    dy: &[f32],
    x: &[f32],
    w: &[f32],
    m: usize,
    k: usize,
    n: usize,
) {
    if let Some(dx) = dx {
        gemm_strided(m, k, n, dx, k, accumulate_dx, dy, n, 1, w, k, 1);
    }
    // dw[n, k] = dyᵀ[n, m] · x[m, k]
    gemm_strided(n, k, m, dw, k, true, dy, 1, n, x, k, 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut y = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                y[i * n + j] = (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum();
            }
        }
        y
    }

    #[test]
    fn linear_matches_naive_and_backward_matches_transposes() {
        let (m, k, n) = (37, 29, 53);
        let x: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 97) as f32 / 97.0 - 0.5).collect();
        let w: Vec<f32> = (0..n * k).map(|i| ((i * 104729) % 89) as f32 / 89.0 - 0.5).collect();
        let mut y = vec![0.0; m * n];
        linear_fwd(&mut y, &x, &w, m, k, n);
        let r = naive(&x, &w, m, k, n);
        for (a, b) in y.iter().zip(&r) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        let dy: Vec<f32> = (0..m * n).map(|i| ((i * 31) % 17) as f32 / 17.0 - 0.5).collect();
        let mut dx = vec![0.0; m * k];
        let mut dw = vec![0.0; n * k];
        linear_bwd(Some(&mut dx), false, &mut dw, &dy, &x, &w, m, k, n);
        for i in 0..m {
            for p in 0..k {
                let e: f32 = (0..n).map(|j| dy[i * n + j] * w[j * k + p]).sum();
                assert!((dx[i * k + p] - e).abs() < 1e-4);
            }
        }
        for j in 0..n {
            for p in 0..k {
                let e: f32 = (0..m).map(|i| dy[i * n + j] * x[i * k + p]).sum();
                assert!((dw[j * k + p] - e).abs() < 1e-4);
            }
        }
    }
}
