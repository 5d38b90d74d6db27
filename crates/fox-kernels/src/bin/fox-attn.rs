//! fox-attn: the GPU check and the attention benchmark of fox-kernels, standalone.
//!
//!   fox-attn check [--filter TEXT] [--seed N]      pass/fail table, GPU vs CPU reference
//!   fox-attn check-ops [--filter TEXT] [--seed N]  the same for the small training ops
//!   fox-attn bench [--d 64,128] [--t 1024,4096,16384] [--tokens 32768] [--hidden 2048]
//!                  [--iters N] [--warmup N] [--no-sdpa] [--python python3] [--json FILE] [--fwd-only]
//!   fox-attn compile [--arch sm_90a] [-v]           compile the kernels into the disk cache
//!                                                   (NVRTC only, no GPU; -v: ptxas report)
//!   fox-attn info                                   what device would be used, or why none

use anyhow::{bail, Result};
use fox_kernels::cuda::{self, bench, check, compile, ops_check};

fn arg_value(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn list(s: &str) -> Result<Vec<usize>> {
    s.split(',').map(|x| Ok(x.trim().parse()?)).collect()
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cmd = args.first().map(String::as_str).unwrap_or("help");
    match cmd {
        "info" => {
            match cuda::probe() {
                Ok(n) => println!("{n} CUDA device(s)"),
                Err(e) => println!("no usable GPU: {e:#}"),
            }
            let d = cuda::select(cuda::DeviceArg::Auto)?;
            println!("--device auto -> {}", d.describe());
            Ok(())
        }
        "compile" => {
            let arch = arg_value(&args, "--arch").unwrap_or_else(|| "sm_90a".into());
            let verbose = args.iter().any(|a| a == "-v");
            for (what, log) in compile::precompile(&arch, verbose)? {
                println!("{what}");
                if verbose {
                    for line in log.lines().filter(|l| !l.trim().is_empty()) {
                        println!("  {line}");
                    }
                }
            }
            Ok(())
        }
        "check" => {
            let gpu = match cuda::Gpu::new(0) {
                Ok(g) => g,
                Err(e) => {
                    println!("GPU check skipped: {e:#}");
                    return Ok(());
                }
            };
            let seed = match arg_value(&args, "--seed") {
                Some(s) => s.parse()?,
                None => check::fresh_seed(),
            };
            println!("GPU check on {} (seed {seed})", gpu.describe());
            let t0 = std::time::Instant::now();
            let rows = check::run_all(&gpu, arg_value(&args, "--filter").as_deref(), seed);
            println!("{}", check::format_table(&rows));
            println!("({:.1} s)", t0.elapsed().as_secs_f64());
            if rows.iter().any(|r| !r.pass) {
                std::process::exit(1);
            }
            Ok(())
        }
        "check-ops" => {
            let gpu = match cuda::Gpu::new(0) {
                Ok(g) => g,
                Err(e) => {
                    println!("GPU ops check skipped: {e:#}");
                    return Ok(());
                }
            };
            let seed = match arg_value(&args, "--seed") {
                Some(s) => s.parse()?,
                None => check::fresh_seed(),
            };
            println!("GPU ops check on {} (seed {seed})", gpu.describe());
            let t0 = std::time::Instant::now();
            let mut rows = ops_check::run_all(&gpu, seed);
            if let Some(f) = arg_value(&args, "--filter") {
                rows.retain(|r| r.case.contains(&f));
            }
            println!("{}", check::format_table(&rows));
            println!("({:.1} s)", t0.elapsed().as_secs_f64());
            if rows.is_empty() {
                println!("no ops case matched the filter");
            }
            if rows.iter().any(|r| !r.pass) {
                std::process::exit(1);
            }
            Ok(())
        }
        "bench" => {
            let mut o = bench::BenchOpts::default();
            if let Some(s) = arg_value(&args, "--d") {
                o.head_dims = list(&s)?;
            }
            if let Some(s) = arg_value(&args, "--t") {
                o.seq_lens = list(&s)?;
            }
            if let Some(s) = arg_value(&args, "--tokens") {
                o.tokens = s.parse()?;
            }
            if let Some(s) = arg_value(&args, "--hidden") {
                o.hidden = s.parse()?;
            }
            if let Some(s) = arg_value(&args, "--iters") {
                o.iters = s.parse()?;
            }
            if let Some(s) = arg_value(&args, "--warmup") {
                o.warmup = s.parse()?;
            }
            if let Some(s) = arg_value(&args, "--python") {
                o.python = s;
            }
            if args.iter().any(|a| a == "--no-sdpa") {
                o.sdpa = false;
            }
            if args.iter().any(|a| a == "--fwd-only") {
                o.backward = false;
            }
            o.json = arg_value(&args, "--json").map(Into::into);
            let report = bench::run_attention_bench(&o)?;
            println!("{}", report.table());
            Ok(())
        }
        "help" | "-h" | "--help" => {
            println!(
                "{}",
                include_str!("fox-attn.rs")
                    .lines()
                    .skip(2)
                    .take(8)
                    .map(|l| l.trim_start_matches("//!"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            Ok(())
        }
        other => bail!("unknown command `{other}` (check, check-ops, bench, compile, info)"),
    }
}
