//! `foxlm bench attention` without a GPU: the CPU Forgetting Attention kernel's GFLOP/s.

use anyhow::{bail, Result};
use fox_kernels::attention::{self as fa, View, Visibility};
use foxlm::cli::bench::AttentionArgs;
use rand::{Rng, SeedableRng};
use std::time::Instant;

/// Times the CPU kernel on mixed gates: one warm-up, then the median of `iters` (at most 3).
pub(super) fn cpu_bench(a: &AttentionArgs) -> Result<()> {
    let tokens = a.tokens.unwrap_or(4096);
    println!(
        "{:>4} {:>6} {:>3} {:>3} {:>8} {:>10} {:>10} {:>8}",
        "D", "T", "B", "H", "ACP", "fwd GF/s", "f+b GF/s", "pruned"
    );
    let mut rows = Vec::new();
    for &d in &a.d {
        for &t in &a.t {
            if t > tokens || !tokens.is_multiple_of(t) || !a.hidden.is_multiple_of(d) {
                bail!("shape D={d}, T={t}: B·T={tokens} must be a multiple of T and H·D={} of D", a.hidden);
            }
            let (b, h) = (tokens / t, a.hidden / d);
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(a.seed);
            let n = b * t * h * d;
            let mut normal = || -> f32 {
                let (u1, u2): (f32, f32) = (rng.gen::<f32>().max(1e-12), rng.gen());
                (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
            };
            let q: Vec<f32> = (0..n).map(|_| normal()).collect();
            let k: Vec<f32> = (0..n).map(|_| normal()).collect();
            let v: Vec<f32> = (0..n).map(|_| normal()).collect();
            // mixed gates: per-head logit bias spread over [-1, 9] plus N(0,1) noise per token
            let logit: Vec<f32> =
                (0..b * t * h).map(|i| -1.0 + 10.0 * (i % h) as f32 / (h.max(2) - 1) as f32 + normal()).collect();
            let mut la = vec![0.0; logit.len()];
            fox_kernels::fgate::log_fgate_fwd(&mut la, &logit);
            let mut c = vec![0.0; b * h * t];
            fox_kernels::fgate::prefix_sum_fwd(&mut c, &la, None, t, h);
            for acp in [false, true] {
                let mut p = fa::Problem {
                    batch: b,
                    heads: h,
                    kv_heads: h,
                    window: None,
                    head_dim: d,
                    tq: t,
                    tk: t,
                    q_pos0: 0,
                    q: View::bthd(&q, t, h, d),
                    k: View::bthd(&k, t, h, d),
                    v: View::bthd(&v, t, h, d),
                    cq: &c,
                    ck: &c,
                    vis: Visibility::All,
                    scale: 1.0 / (d as f32).sqrt(),
                    prune: None,
                };
                let th = acp.then(|| fa::prune_thresholds(&fa::logit_bound_from_norms(&p), t, -10.0));
                p.prune = th.as_deref();
                // Outputs and gradients kept between iterations, as the trainer keeps them.
                let mut out = vec![0.0; n];
                let mut lse = vec![0.0; b * h * t];
                let mut gr = fa::Grads::zeros(&p);
                let flops = 2.0 * (b * h * t * t * d) as f64;
                let iters = a.iters.clamp(1, 3);
                let mut tf = Vec::new();
                let mut tb = Vec::new();
                let mut pruned = 0.0;
                for it in 0..=iters {
                    let s = Instant::now();
                    let (visited, pr) = fa::forward_into(&p, &mut out, &mut lse);
                    let f = s.elapsed().as_secs_f64();
                    pruned = pr as f64 / (pr + visited).max(1) as f64;
                    let s = Instant::now();
                    if !a.fwd_only {
                        fa::backward_into(&p, &out, &q, &lse, gr.as_mut());
                    }
                    let bw = s.elapsed().as_secs_f64();
                    if it > 0 {
                        tf.push(f);
                        tb.push(f + bw);
                    }
                }
                let med = |v: &mut Vec<f64>| {
                    v.sort_by(f64::total_cmp);
                    v[v.len() / 2]
                };
                let gf = flops / med(&mut tf) / 1e9;
                let gfb = if a.fwd_only { f64::NAN } else { 3.5 * flops / med(&mut tb) / 1e9 };
                println!(
                    "{d:>4} {t:>6} {b:>3} {h:>3} {:>8} {gf:>10.1} {gfb:>10.1} {:>7.0}%",
                    if acp { "on" } else { "off" },
                    100.0 * pruned
                );
                rows.push(serde_json::json!({"device": "cpu", "d": d, "t": t, "b": b, "h": h, "acp": acp, "fwd_gflops": gf, "fwd_bwd_gflops": gfb, "pruned": pruned}));
            }
        }
    }
    if let Some(j) = &a.json {
        std::fs::write(j, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}
