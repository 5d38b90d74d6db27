//! CPU training throughput, for BENCHMARKS.md ("CPU training"): tokens/s of full optimizer steps
//! (forward, backward, clipping, AdamW) for the tiny preset and for fox-pro-125m at a short
//! context, the matmul GFLOP/s those steps reach, and — in the same run, as the reference — the
//! `gemm` crate's own GFLOP/s on square products, sampled again before every timed step (see
//! crates/foxlm/checks/cpu_bench.rs). `foxlm bench train --device cpu` measures one preset the same way.
//!
//!     cargo run --release --example train_throughput [-- --steps N --context-125m T --json FILE --only tiny|125m]

use foxlm::presets;

/// The measurement `foxlm bench train --device cpu` makes (beside the library, in checks/).
#[path = "../checks/cpu_bench.rs"]
#[allow(dead_code)]
mod cpu_bench;

fn main() -> anyhow::Result<()> {
    // As the foxlm binary runs: workers that flush denormals.
    fox_kernels::par::init_pool()?;
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
    let mut refs = fox_kernels::matmul::peak_references();

    let tiny = presets::tiny();
    let mut rows = vec![];
    if want("tiny") {
        let (b, t) = (tiny.train.batch_size, tiny.train.context);
        eprintln!("tiny preset ({b} x {t} tokens per step)...");
        rows.push(cpu_bench::measure("tiny (FoX Pro, d=64, 4 layers)", &tiny.model, b, t, 1, steps, &mut refs, false)?);
    }
    if want("125m") {
        let p125 = presets::preset("fox-pro-125m")?;
        eprintln!("fox-pro-125m at context {ctx125}...");
        rows.push(cpu_bench::measure("fox-pro-125m", &p125.model, 1, ctx125, 1, steps.clamp(1, 10), &mut refs, false)?);
    }

    println!("gemm crate, square f32 products ({threads} threads), before the models:");
    for (n, g) in &peaks {
        println!("  {n:>5}^3: {g:7.1} GFLOP/s");
    }
    println!();
    print!("{}", cpu_bench::table(&rows));
    rows.iter().for_each(|r| print!("{}", cpu_bench::breakdown(r)));
    if let Some(path) = json {
        let v = serde_json::json!({
            "threads": threads,
            "gemm_peak_gflops": peaks.iter().map(|(n, g)| serde_json::json!({"n": n, "gflops": g})).collect::<Vec<_>>(),
            "rows": rows,
        });
        std::fs::write(&path, serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}
