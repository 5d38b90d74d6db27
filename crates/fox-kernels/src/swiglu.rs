//! SwiGLU: h = silu(gate) · up, where gate_proj's output row is [gate (I) | up (I)].

use crate::scalar::sigmoid;
use rayon::prelude::*;

/// gu: [rows, 2I] → h: [rows, I].
pub fn swiglu_fwd(h: &mut [f32], gu: &[f32], inter: usize) {
    h.par_chunks_mut(inter)
        .zip(gu.par_chunks(2 * inter))
        .for_each(|(hr, g)| {
            for c in 0..inter {
                let a = g[c];
                hr[c] = a * sigmoid(a) * g[inter + c];
            }
        });
}

/// dgu: [rows, 2I] from dh: [rows, I].
pub fn swiglu_bwd(dgu: &mut [f32], dh: &[f32], gu: &[f32], inter: usize) {
    dgu.par_chunks_mut(2 * inter)
        .zip(dh.par_chunks(inter).zip(gu.par_chunks(2 * inter)))
        .for_each(|(d, (dhr, g))| {
            for c in 0..inter {
                let a = g[c];
                let s = sigmoid(a);
                let u = g[inter + c];
                d[c] = dhr[c] * u * s * (1.0 + a * (1.0 - s));
                d[inter + c] = dhr[c] * a * s;
            }
        });
}
