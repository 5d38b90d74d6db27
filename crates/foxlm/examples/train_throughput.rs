//! CPU training throughput, for BENCHMARKS.md ("CPU training"): tokens/s of full optimizer steps
//! (forward, backward, clipping, AdamW) for the tiny preset and for fox-pro-125m at a short
//! context, the matmul GFLOP/s those steps reach, and — in the same run, as the reference — the
//! `gemm` crate's own GFLOP/s on large square products.
//!
//!     cargo run --release --example train_throughput [-- --steps N --context-125m T --json FILE]

use foxlm::engine::CpuEngine;
use foxlm::optim::AdamW;
use foxlm::presets;
use foxlm::train::init_model;
use std::time::Instant;

/// Matmul FLOPs of one training step per token (forward + backward = 3x forward): every Linear
/// (2·in·out each) including the output head, plus attention's QKᵀ and PV (2·2·T/2·d per layer
/// on average under the causal mask).
fn matmul_flops_per_token(cfg: &foxlm::config::Config, context: usize) -> f64 {
    let m = foxlm::model::Model::new(cfg);
    let linear: usize = m
        .params
        .names
        .iter()
        .zip(&m.params.tensors)
        .filter(|(n, t)| t.shape.len() == 2 && !n.contains("embeddings"))
        .map(|(_, t)| t.numel())
        .sum();
    let attn = cfg.num_hidden_layers as f64 * 2.0 * context as f64 * cfg.hidden_size as f64; // 2·(T/2)·d·2
    3.0 * (2.0 * linear as f64 + attn)
}

struct Row {
    name: String,
    batch: usize,
    context: usize,
    params_m: f64,
    tokens_per_s: f64,
    step_s: f64,
    gflops: f64,
}

fn measure(name: &str, cfg: &foxlm::config::Config, batch: usize, context: usize, steps: usize) -> Row {
    let mut model = init_model(cfg, 0);
    let mut opt = AdamW::new(Default::default(), &model.params);
    let mut engine = CpuEngine::new(&model, batch);
    let n = batch * context;
    let ids: Vec<u32> = (0..n).map(|i| ((i * 7919) % 50000) as u32).collect();
    let targets: Vec<Option<u32>> = ids.iter().map(|&i| Some((i * 31 + 7) % 50000)).collect();
    // The trainer's own step (`CpuEngine`: buffers kept between steps, clipping inside AdamW).
    let mut step = |model: &mut foxlm::model::Model| {
        engine.step_on(model, &mut opt, &ids, &targets, batch, 1.0, 1e-3).expect("a CPU training step");
    };
    step(&mut model); // warm-up
                      // The median step: robust to other processes' bursts on a shared machine.
    let mut times: Vec<f64> = (0..steps.max(1))
        .map(|_| {
            let t0 = Instant::now();
            step(&mut model);
            t0.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let dt = times[times.len() / 2];
    let fpt = matmul_flops_per_token(cfg, context);
    Row {
        name: name.into(),
        batch,
        context,
        params_m: model.params.numel() as f64 / 1e6,
        tokens_per_s: n as f64 / dt,
        step_s: dt,
        gflops: fpt * n as f64 / dt / 1e9,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |k: &str, d: usize| -> usize {
        args.iter().position(|a| a == k).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(d)
    };
    let steps = arg("--steps", 5);
    let ctx125 = arg("--context-125m", 256);
    let json = args.iter().position(|a| a == "--json").and_then(|i| args.get(i + 1)).cloned();
    let only = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)).cloned();
    let want = |name: &str| only.as_deref().is_none_or(|o| o == name);

    let threads = rayon::current_num_threads();
    eprintln!("gemm reference (square products, f32, {threads} threads)...");
    let peaks: Vec<(usize, f64)> = [512usize, 1024, 2048]
        .iter()
        .map(|&n| (n, fox_kernels::matmul::gemm_gflops(n, if n < 2048 { 20 } else { 4 })))
        .collect();
    let peak = peaks.iter().map(|p| p.1).fold(0.0, f64::max);

    let tiny = presets::tiny();
    let mut rows = vec![];
    if want("tiny") {
        eprintln!("tiny preset ({} x {} tokens per step)...", tiny.train.batch_size, tiny.train.context);
        rows.push(measure(
            "tiny (FoX Pro, d=64, 4 layers)",
            &tiny.model,
            tiny.train.batch_size,
            tiny.train.context,
            steps,
        ));
    }
    if want("125m") {
        let p125 = presets::preset("fox-pro-125m").unwrap();
        eprintln!("fox-pro-125m at context {ctx125}...");
        rows.push(measure("fox-pro-125m", &p125.model, 1, ctx125, steps.clamp(1, 3)));
    }

    println!("gemm crate, square f32 products ({threads} threads):");
    for (n, g) in &peaks {
        println!("  {n:>5}^3: {g:7.1} GFLOP/s");
    }
    println!();
    println!(
        "| model | batch x context | params | step (s) | tokens/s | matmul GFLOP/s | % of gemm peak ({peak:.1}) |"
    );
    println!("|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} x {} | {:.1}M | {:.2} | {:.0} | {:.1} | {:.0}% |",
            r.name,
            r.batch,
            r.context,
            r.params_m,
            r.step_s,
            r.tokens_per_s,
            r.gflops,
            100.0 * r.gflops / peak
        );
    }
    if let Some(path) = json {
        let v = serde_json::json!({
            "threads": threads,
            "gemm_peak_gflops": peaks.iter().map(|(n, g)| serde_json::json!({"n": n, "gflops": g})).collect::<Vec<_>>(),
            "rows": rows.iter().map(|r| serde_json::json!({
                "name": r.name, "batch": r.batch, "context": r.context, "params_m": r.params_m,
                "step_s": r.step_s, "tokens_per_s": r.tokens_per_s, "matmul_gflops": r.gflops,
            })).collect::<Vec<_>>(),
        });
        std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    }
}
