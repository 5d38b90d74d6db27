//! Small vector loops shared by the CPU recurrences (the delta rule, GLA): a dot product that
//! the compiler vectorises, and y += a·x.

/// Σ a_i b_i over 8 interleaved partial sums (so that the compiler keeps them in vector
/// registers; a single running sum is one dependent add after another), then the tail.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a[..n].chunks_exact(8), b[..n].chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let tail: f32 = ar.iter().zip(br).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// y += a · x.
pub(crate) fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_and_axpy_give_the_plain_sums() {
        // 19 values: two blocks of 8 and a tail of 3.
        let a: Vec<f32> = (0..19).map(|i| i as f32 * 0.5 - 3.0).collect();
        let b: Vec<f32> = (0..19).map(|i| 1.0 + (i % 4) as f32).collect();
        let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert!((dot(&a, &b) as f64 - want).abs() < 1e-4, "{} vs {want}", dot(&a, &b));
        let mut y = b.clone();
        axpy(&mut y, 2.0, &a);
        for i in 0..19 {
            assert_eq!(y[i], b[i] + 2.0 * a[i]);
        }
    }
}
