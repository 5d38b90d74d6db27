//! The fused output head alone (`head::linear_cross_entropy` with gradients) at the tiny preset's
//! and fox-pro-125m's shapes, against the gemm crate's peak sampled beside each call.
//!
//!     cargo run --release -p fox-kernels --example head_throughput [-- --reps N]

use fox_kernels::head::{linear_cross_entropy, HeadGrads};
use fox_kernels::matmul::{peak_now, peak_references};
use std::time::Instant;

fn main() {
    // As the foxlm binary runs: workers that flush denormals.
    fox_kernels::par::init_pool().expect("rayon's pool, before anything else used it");
    let args: Vec<String> = std::env::args().collect();
    let reps = args.iter().position(|a| a == "--reps").and_then(|i| args.get(i + 1)?.parse().ok()).unwrap_or(10);
    let mut refs = peak_references();
    let vocab = 50257;
    for (name, rows, d) in [("tiny", 1024usize, 64usize), ("fox-pro-125m", 256, 768)] {
        let x: Vec<f32> = (0..rows * d).map(|i| ((i * 7919 % 1000) as f32 / 1000.0 - 0.5) * 0.2).collect();
        let w: Vec<f32> = (0..vocab * d).map(|i| ((i * 104729 % 1000) as f32 / 1000.0 - 0.5) * 0.2).collect();
        let tg: Vec<Option<u32>> = (0..rows).map(|r| Some(((r * 31 + 7) % vocab) as u32)).collect();
        let (mut dx, mut dw) = (vec![0.0f32; rows * d], vec![0.0f32; vocab * d]);
        let mut run = || {
            let t0 = Instant::now();
            linear_cross_entropy(
                &x,
                &w,
                &tg,
                d,
                vocab,
                1.0,
                Some(HeadGrads { dx: &mut dx, dw: Some(&mut dw), dw_add: true }),
            )
            .expect("head");
            t0.elapsed().as_secs_f64()
        };
        run();
        let flops = 3.0 * 2.0 * (rows * d * vocab) as f64;
        let (mut ts, mut shares) = (vec![], vec![]);
        for _ in 0..reps {
            let peak = peak_now(&mut refs);
            let t = run();
            ts.push(t);
            shares.push(flops / t / 1e9 / peak);
        }
        ts.sort_by(f64::total_cmp);
        shares.sort_by(f64::total_cmp);
        let t = ts[ts.len() / 2];
        println!(
            "{name:14} {rows} x {d} x {vocab}: {:.1} ms, {:.1} GFLOP/s, {:.0}% of the peak beside it",
            t * 1e3,
            flops / t / 1e9,
            100.0 * shares[shares.len() / 2]
        );
    }
}
