//! CPU training throughput, for BENCHMARKS.md ("CPU training"): tokens/s of full optimizer steps
//! (forward, backward, clipping, AdamW) for the tiny preset and for fox-pro-125m at a short
//! context, the matmul GFLOP/s those steps reach, and — in the same run, as the reference — the
//! `gemm` crate's own GFLOP/s on large square products. The reference is sampled again right
//! before every timed step (the best of three 512³ and two 1024³ products): on a shared VM the
//! machine's rate moves by a third within seconds, so each step is divided by the peak measured
//! beside it, and the share reported is the median of those ratios.
//!
//!     cargo run --release --example train_throughput [-- --steps N --context-125m T --json FILE]

use fox_kernels::matmul::GemmReference;
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
    /// Median of the gemm peaks sampled before each timed step.
    peak: f64,
    /// Median over the timed steps of (the step's matmul GFLOP/s / the peak sampled before it).
    share: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The gemm crate's peak now: the best of a few square products (512³ and 1024³, same threads).
fn peak_now(refs: &mut [GemmReference]) -> f64 {
    refs.iter_mut().map(|r| r.gflops(if r.n() <= 512 { 3 } else { 2 })).fold(0.0, f64::max)
}

fn measure(
    name: &str,
    cfg: &foxlm::config::Config,
    batch: usize,
    context: usize,
    steps: usize,
    refs: &mut [GemmReference],
) -> Row {
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
    let fpt = matmul_flops_per_token(cfg, context);
    // Medians: robust to other processes' bursts on a shared machine.
    let (mut times, mut peaks, mut shares) = (vec![], vec![], vec![]);
    for _ in 0..steps.max(1) {
        let peak = peak_now(refs);
        let t0 = Instant::now();
        step(&mut model);
        let dt = t0.elapsed().as_secs_f64();
        times.push(dt);
        peaks.push(peak);
        shares.push(fpt * n as f64 / dt / 1e9 / peak);
    }
    let dt = median(times);
    Row {
        name: name.into(),
        batch,
        context,
        params_m: model.params.numel() as f64 / 1e6,
        tokens_per_s: n as f64 / dt,
        step_s: dt,
        gflops: fpt * n as f64 / dt / 1e9,
        peak: median(peaks),
        share: median(shares),
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
    let mut refs = [GemmReference::new(512), GemmReference::new(1024)];

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
            &mut refs,
        ));
    }
    if want("125m") {
        let p125 = presets::preset("fox-pro-125m").unwrap();
        eprintln!("fox-pro-125m at context {ctx125}...");
        rows.push(measure("fox-pro-125m", &p125.model, 1, ctx125, steps.clamp(1, 10), &mut refs));
    }

    println!("gemm crate, square f32 products ({threads} threads), before the models:");
    for (n, g) in &peaks {
        println!("  {n:>5}^3: {g:7.1} GFLOP/s");
    }
    println!();
    println!(
        "| model | batch x context | params | step (s) | tokens/s | matmul GFLOP/s | gemm peak beside the steps | % of peak |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} x {} | {:.1}M | {:.3} | {:.0} | {:.1} | {:.1} | {:.0}% |",
            r.name,
            r.batch,
            r.context,
            r.params_m,
            r.step_s,
            r.tokens_per_s,
            r.gflops,
            r.peak,
            100.0 * r.share
        );
    }
    if let Some(path) = json {
        let v = serde_json::json!({
            "threads": threads,
            "gemm_peak_gflops": peaks.iter().map(|(n, g)| serde_json::json!({"n": n, "gflops": g})).collect::<Vec<_>>(),
            "rows": rows.iter().map(|r| serde_json::json!({
                "name": r.name, "batch": r.batch, "context": r.context, "params_m": r.params_m,
                "step_s": r.step_s, "tokens_per_s": r.tokens_per_s, "matmul_gflops": r.gflops,
                "gemm_peak_beside_gflops": r.peak, "share_of_peak": r.share,
            })).collect::<Vec<_>>(),
        });
        std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    }
}
