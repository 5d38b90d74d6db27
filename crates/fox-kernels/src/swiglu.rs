//! SwiGLU: h = silu(gate) · up, where gate_proj's output row is [gate (I) | up (I)].

use crate::scalar::fast_sigmoid;
use crate::simd::multiversion;
use rayon::prelude::*;

/// Rows per parallel task: one row of a small model is too little work for a task of its own.
const ROWS_PER_TASK: usize = 16;

/// gu: [rows, 2I] → h: [rows, I].
pub fn swiglu_fwd(h: &mut [f32], gu: &[f32], inter: usize) {
    let n = ROWS_PER_TASK;
    h.par_chunks_mut(n * inter).zip(gu.par_chunks(n * 2 * inter)).for_each(|(hs, gs)| fwd_rows(hs, gs, inter));
}

multiversion! {
    fn fwd_rows(hs: &mut [f32], gs: &[f32], inter: usize) {
        for (hr, g) in hs.chunks_mut(inter).zip(gs.chunks(2 * inter)) {
            let (gate, up) = g.split_at(inter);
            for ((h, &a), &u) in hr.iter_mut().zip(gate).zip(up) {
                *h = a * fast_sigmoid(a) * u;
            }
        }
    }
}

/// dgu: [rows, 2I] from dh: [rows, I].
pub fn swiglu_bwd(dgu: &mut [f32], dh: &[f32], gu: &[f32], inter: usize) {
    let n = ROWS_PER_TASK;
    dgu.par_chunks_mut(n * 2 * inter)
        .zip(dh.par_chunks(n * inter).zip(gu.par_chunks(n * 2 * inter)))
        .for_each(|(ds, (dhs, gs))| bwd_rows(ds, dhs, gs, inter));
}

multiversion! {
    fn bwd_rows(ds: &mut [f32], dhs: &[f32], gs: &[f32], inter: usize) {
        for (d, (dhr, g)) in ds.chunks_mut(2 * inter).zip(dhs.chunks(inter).zip(gs.chunks(2 * inter))) {
            let (dgate, dup) = d.split_at_mut(inter);
            let (gate, up) = g.split_at(inter);
            for ((((dg, du), &dh), &a), &u) in dgate.iter_mut().zip(dup).zip(dhr).zip(gate).zip(up) {
                let s = fast_sigmoid(a);
                *dg = dh * u * s * (1.0 + a * (1.0 - s));
                *du = dh * a * s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_gradient, randn};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// L = Σ w ⊙ swiglu(gu), in f64.
    fn loss(gu: &[f32], w: &[f32], inter: usize) -> f64 {
        let mut h = vec![0.0; w.len()];
        swiglu_fwd(&mut h, gu, inter);
        h.iter().zip(w).map(|(a, b)| *a as f64 * *b as f64).sum()
    }

    #[test]
    fn backward_matches_finite_differences() {
        let mut rng = ChaCha8Rng::seed_from_u64(12);
        let (rows, inter) = (5, 9);
        // Spread of gate values: deep in both saturated regions and around 0.
        let gu: Vec<f32> = randn(&mut rng, rows * 2 * inter).iter().map(|v| 3.0 * v).collect();
        let w = randn(&mut rng, rows * inter);
        let mut dgu = vec![0.0; gu.len()];
        swiglu_bwd(&mut dgu, &w, &gu, inter);
        // O(h²) truncation (silu'' ≤ 0.5) and f32 round-off: well under 1e-3.
        assert_gradient("dgu", &dgu, &gu, 0..gu.len(), (1e-2, 1e-3), |g| loss(g, &w, inter));
    }
}
