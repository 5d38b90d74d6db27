//! Sigmoid gates, elementwise: z = pre · sigmoid(g) (the output gate) and sigmoid in place (the
//! KV-shift mixing weights), with their backwards. Vectorised (`fast_sigmoid`), in parallel tasks.

use crate::scalar::fast_sigmoid;
use crate::simd::multiversion;
use rayon::prelude::*;

/// Values per parallel task (a row of a small model is too little work for a task of its own).
const PER_TASK: usize = 1 << 14;

/// x = sigmoid(x).
pub fn sigmoid_inplace(x: &mut [f32]) {
    x.par_chunks_mut(PER_TASK).for_each(sigmoid_chunk);
}

multiversion! {
    fn sigmoid_chunk(x: &mut [f32]) {
        x.iter_mut().for_each(|v| *v = fast_sigmoid(*v));
    }
}

/// z = pre · sigmoid(g).
pub fn gate_mul_fwd(z: &mut [f32], pre: &[f32], g: &[f32]) {
    assert!(pre.len() == z.len() && g.len() == z.len(), "gate_mul: slices of different lengths");
    z.par_chunks_mut(PER_TASK)
        .zip(pre.par_chunks(PER_TASK).zip(g.par_chunks(PER_TASK)))
        .for_each(|(z, (pre, g))| fwd_chunk(z, pre, g));
}

multiversion! {
    fn fwd_chunk(z: &mut [f32], pre: &[f32], g: &[f32]) {
        for ((z, &p), &g) in z.iter_mut().zip(pre).zip(g) {
            *z = p * fast_sigmoid(g);
        }
    }
}

/// Backward of `gate_mul_fwd`: dpre = dz · sigmoid(g), dg = dz · pre · sigmoid'(g).
pub fn gate_mul_bwd(dpre: &mut [f32], dg: &mut [f32], dz: &[f32], pre: &[f32], g: &[f32]) {
    let n = dpre.len();
    assert!(dg.len() == n && dz.len() == n && pre.len() == n && g.len() == n, "gate_mul: slices of different lengths");
    let c = PER_TASK;
    dpre.par_chunks_mut(c)
        .zip(dg.par_chunks_mut(c))
        .zip(dz.par_chunks(c).zip(pre.par_chunks(c).zip(g.par_chunks(c))))
        .for_each(|((dpre, dg), (dz, (pre, g)))| bwd_chunk(dpre, dg, dz, pre, g));
}

multiversion! {
    fn bwd_chunk(dpre: &mut [f32], dg: &mut [f32], dz: &[f32], pre: &[f32], g: &[f32]) {
        for ((dp, dgv), ((&dzv, &pv), &gv)) in dpre.iter_mut().zip(dg.iter_mut()).zip(dz.iter().zip(pre).zip(g)) {
            let s = fast_sigmoid(gv);
            *dgv = dzv * pv * s * (1.0 - s);
            *dp = dzv * s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the stable scalar sigmoid, and the backward against central differences of the
    /// forward (in f64) over both saturated tails and around 0.
    #[test]
    fn gate_matches_the_scalar_sigmoid_and_its_derivative() {
        let n = 3 * PER_TASK + 5;
        let g: Vec<f32> = (0..n).map(|i| (i as f32 / n as f32 - 0.5) * 60.0).collect();
        let pre: Vec<f32> = (0..n).map(|i| ((i * 7919) % 97) as f32 / 48.0 - 1.0).collect();
        let mut z = vec![0.0; n];
        gate_mul_fwd(&mut z, &pre, &g);
        let mut s = g.clone();
        sigmoid_inplace(&mut s);
        for i in 0..n {
            let want = crate::scalar::sigmoid(g[i]);
            assert!((s[i] - want).abs() <= 1e-6 * want + 1e-37, "sigmoid({}) {} vs {want}", g[i], s[i]);
            assert!((z[i] - pre[i] * want).abs() <= 1e-6 * (pre[i] * want).abs() + 1e-37);
        }
        let dz: Vec<f32> = (0..n).map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0).collect();
        let (mut dpre, mut dg) = (vec![0.0; n], vec![0.0; n]);
        gate_mul_bwd(&mut dpre, &mut dg, &dz, &pre, &g);
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        for i in (0..n).step_by(101) {
            let (x, h) = (g[i] as f64, 1e-3);
            let fd = dz[i] as f64 * pre[i] as f64 * (sig(x + h) - sig(x - h)) / (2.0 * h);
            assert!((dg[i] as f64 - fd).abs() < 1e-5 * (1.0 + fd.abs()), "dg[{i}] {} vs {fd}", dg[i]);
            assert!((dpre[i] as f64 - dz[i] as f64 * sig(x)).abs() < 1e-6);
        }
    }
}
