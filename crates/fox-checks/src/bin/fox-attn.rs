//! fox-attn: the GPU check and the attention benchmark of fox-kernels, standalone.
//!
//!   fox-attn check [--filter TEXT] [--seed N]      pass/fail table, GPU vs CPU reference
//!   fox-attn check-ops [--filter TEXT] [--seed N] [--small]  the same for the small training ops
//!                                                  (--small: without the recurrent families' rows)
//!   fox-attn bench [--d 64,128] [--t 1024,4096,16384] [--tokens 32768] [--hidden 2048]
//!                  [--iters N] [--warmup N] [--no-sdpa] [--python python3] [--json FILE] [--fwd-only]
//!                  [--no-fox-refs] [--bundle DIR]   the authors' and fla's kernels (code in DIR)
//!                  [--kv-group G] [--window W]     GQA (G query heads per k/v head), sliding window
//!   fox-attn compile [--arch sm_90a] [-v]           compile the kernels into the disk cache
//!                                                   (NVRTC only, no GPU; -v: ptxas report)
//!   fox-attn info                                   what device would be used, or why none
//!   fox-attn check-gemm [--seed N]                  cuBLASLt GEMMs and f32 attention vs the CPU
//!   fox-attn bench-gemm [--d 768,1536] [--tokens 32768] [--vocab 50257] [--iters 20] [--warmup 3]
//!                                                   bf16 TFLOP/s of the FoX (Pro) Linear shapes
//!   fox-attn bench-ssd [--shape B,T,H,P,N,G]        Mamba-2's SSD forward (default 2,16384,24,64,128,1)
//!   fox-attn bench-scan [--b 2] [--t 16384] [--di 1536] [--n 16] [--iters 20] [--warmup 3]
//!                                                   Mamba's selective scan (Samba), fwd and fwd+bwd
//!   fox-attn bench-delta [--shape B,T,H,K,V]        the delta rule (DeltaNet, Gated DeltaNet), bf16,
//!                                                   fwd and fwd+bwd (default 2,16384,6,128,128)
//!   fox-attn bench-gla [--shape B,T,H,D]            HGRN2's GLA, fwd and fwd+bwd (default 2,16384,6,128)

use anyhow::{bail, Result};
use fox_checks::{
    bench, check, delta_rule_check, gemm_bench, gemm_check, gla_check, ops_check, selective_scan_check, ssd_check,
    ssd_tc_check,
};
use fox_kernels::cuda::{self, compile};

/// A pass/fail check on GPU 0 (none: "`what` skipped", and success) with `--seed` (else a fresh
/// one): prints the table of `rows` and the time taken, exits 1 when a row fails.
fn run_check(
    args: &[String],
    what: &str,
    title: &str,
    rows: impl FnOnce(&cuda::Gpu, u64) -> Vec<check::CheckRow>,
) -> Result<()> {
    let gpu = match cuda::Gpu::new(0) {
        Ok(g) => g,
        Err(e) => {
            println!("{what} skipped: {e:#}");
            return Ok(());
        }
    };
    let seed = match arg_value(args, "--seed") {
        Some(s) => s.parse()?,
        None => check::fresh_seed(),
    };
    println!("{title} on {} (seed {seed})", gpu.describe());
    let t0 = std::time::Instant::now();
    let rows = rows(&gpu, seed);
    println!("{}", check::format_table(&rows));
    println!("({:.1} s)", t0.elapsed().as_secs_f64());
    if rows.is_empty() {
        println!("no case matched the filter");
    }
    if rows.iter().any(|r| !r.pass) {
        std::process::exit(1);
    }
    Ok(())
}

/// `--shape` as the N sizes `names` lists, comma-separated; `default` without it.
fn shape_arg<const N: usize>(args: &[String], names: &str, default: [usize; N]) -> Result<[usize; N]> {
    match arg_value(args, "--shape") {
        Some(s) => <[usize; N]>::try_from(list(&s)?).map_err(|_| anyhow::anyhow!("--shape takes {names}")),
        None => Ok(default),
    }
}

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
            // `--device auto`: the first GPU if it is usable, else the CPU.
            let d = match cuda::Gpu::new(0) {
                Ok(g) => cuda::Device::Cuda(g),
                Err(_) => cuda::Device::Cpu,
            };
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
        "check" => run_check(&args, "GPU check", "GPU check", |gpu, seed| {
            check::run_all(gpu, arg_value(&args, "--filter").as_deref(), seed)
        }),
        "check-ops" => run_check(&args, "GPU ops check", "GPU ops check", |gpu, seed| {
            // Mamba-2's rows (cases named "ssd ..."), the delta rule's ("delta ..."), HGRN2's
            // ("gla ...", "hgrn2 ..."): a filter beginning with one of those names runs only that
            // family's rows.
            let filter = arg_value(&args, "--filter");
            let family = |name: &str| filter.as_deref().is_some_and(|f| f.starts_with(name));
            let (ssd, delta, hgrn2) = (family("ssd"), family("delta"), family("gla") || family("hgrn2"));
            // --small: the small ops' rows alone (ops_check), not the recurrent families' kernels.
            let small = args.iter().any(|a| a == "--small");
            let all = !(ssd || delta || hgrn2);
            let (ssd, delta, hgrn2) = if small { (false, false, false) } else { (all || ssd, all || delta, all || hgrn2) };
            let mut rows = if all { ops_check::run_all(gpu, seed) } else { Vec::new() };
            if ssd {
                rows.extend(ssd_check::run_all(gpu, seed));
                rows.extend(ssd_tc_check::run_all(gpu, seed));
            }
            if delta {
                rows.extend(delta_rule_check::run_all(gpu, seed));
            }
            if hgrn2 {
                rows.extend(gla_check::run_all(gpu, seed));
            }
            if let Some(f) = filter {
                rows.retain(|r| r.case.contains(&f));
            }
            rows
        }),
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
            if let Some(s) = arg_value(&args, "--kv-group") {
                o.kv_group = s.parse()?;
            }
            if let Some(s) = arg_value(&args, "--window") {
                o.window = Some(s.parse()?);
            }
            if args.iter().any(|a| a == "--no-sdpa") {
                o.sdpa = false;
            }
            if args.iter().any(|a| a == "--no-fox-refs") {
                o.fox_refs = false;
            }
            if let Some(s) = arg_value(&args, "--bundle") {
                o.bundle = s.into();
            }
            if args.iter().any(|a| a == "--fwd-only") {
                o.backward = false;
            }
            o.json = arg_value(&args, "--json").map(Into::into);
            let report = bench::run_attention_bench(&o)?;
            println!("{}", report.table());
            Ok(())
        }
        "check-gemm" => {
            run_check(&args, "GEMM check", "GEMM and f32 attention check", gemm_check::run_all)
        }
        "bench-ssd" => {
            // Mamba-2's SSD forward at the shape (fla's chunk_simple_gla forward: 0.99 ms
            // on an H100 there). Override with --shape B,T,H,P,N,G.
            let gpu = cuda::Gpu::new(0)?;
            let [b, t, h, p, n, g] = shape_arg(&args, "B,T,H,P,N,G", [2, 16384, 24, 64, 128, 1])?;
            let shape = (b, t, h, p, n, g);
            let (ms, fb, steps) = ssd_check::bench_fwd(&gpu, shape, 3, 20)?;
            println!(
                "SSD on {}, [B, T, H, P, N, G] = {shape:?}: forward {ms:.3} ms, forward + backward {fb:.3} ms \
                 (medians of 20, CUDA events); forward kernels alone: C Bᵀ {:.3}, chunk states {:.3}, \
                 state passing {:.3}, chunk outputs {:.3} ms",
                gpu.describe(),
                steps[0],
                steps[1],
                steps[2],
                steps[3]
            );
            // The tensor-core kernels, bf16 and f32 inputs.
            for bf in [true, false] {
                let (fwd, fb, st) = if bf {
                    ssd_tc_check::bench::<half::bf16>(&gpu, shape, 3, 20)?
                } else {
                    ssd_tc_check::bench::<f32>(&gpu, shape, 3, 20)?
                };
                let dt = if bf { "bf16" } else { "f32" };
                println!(
                    "SSD tensor cores ({dt} inputs): forward {fwd:.3} ms, forward + backward {fb:.3} ms; \
                     alone: state walk {:.3}, chunk outputs {:.3}; backward: walks {:.3}, chunk backward \
                     {:.3}, reductions {:.3} ms",
                    st[0], st[1], st[2], st[3], st[4]
                );
            }
            Ok(())
        }
        "bench-delta" => {
            // The delta rule at the 125M models' widths (6 heads of 128; fla's chunk_delta_rule /
            // chunk_gated_delta_rule forwards in the same call for comparison).
            let gpu = cuda::Gpu::new(0)?;
            let [b, t, h, k, v] = shape_arg(&args, "B,T,H,K,V", [2, 16384, 6, 128, 128])?;
            let shape = (b, t, h, k, v);
            let walk = cuda::delta_rule::fwd_walk_on(&gpu, shape.3);
            let (bh, vp, nch) = (shape.0 * shape.2, shape.4.div_ceil(32) * 32, shape.1.div_ceil(cuda::delta_rule::CHUNK));
            let kp = [32, 64, 128].into_iter().find(|&k| k >= shape.3).unwrap_or(128);
            let plan = match cuda::delta_rule::scan_plan(bh, vp, kp, nch) {
                Some(sp) if walk == cuda::delta_rule::FwdWalk::MmaSync => {
                    format!("parallel walk, {} segments of {} chunks", sp.nseg, sp.seglen)
                }
                _ => "walk in sequence".to_string(),
            };
            for gated in [false, true] {
                let (fwd, fb, st) = delta_rule_check::bench(&gpu, shape, gated, 3, 20)?;
                println!(
                    "{} (bf16, {walk:?} walk, {plan}) on {}, [B, T, H, K, V] = {shape:?}: forward {fwd:.3} ms, \
                     forward + backward {fb:.3} ms (medians of 20, CUDA events); alone: WY {:.3}, walk {:.3}, \
                     outputs {:.3}; dU {:.3}, reverse walk {:.3}, gradients {:.3} ms",
                    if gated { "gated delta rule" } else { "delta rule" },
                    gpu.describe(),
                    st[0],
                    st[1],
                    st[2],
                    st[3],
                    st[4],
                    st[5]
                );
            }
            Ok(())
        }
        "bench-gla" => {
            // HGRN2's gated linear attention at 125M's widths (H = 6 heads of K = V = 128).
            let gpu = cuda::Gpu::new(0)?;
            let [b, t, h, d] = shape_arg(&args, "B,T,H,D", [2, 16384, 6, 128])?;
            let shape = (b, t, h, d);
            // The walk (FOXLM_GLA_KB's width) with and without its tensor-core scores, the
            // tensor-core kernels, the CUDA-core ones on bf16 and f32.
            for (what, bf, run) in gla_check::BENCH_RUNS {
                let (fwd, fb, st) = if bf {
                    gla_check::bench::<half::bf16>(&gpu, shape, 3, 20, run)?
                } else {
                    gla_check::bench::<f32>(&gpu, shape, 3, 20, run)?
                };
                println!(
                    "GLA on {}, [B, T, H, K = V] = {shape:?}, {what}: forward {fwd:.3} ms, forward + backward \
                     {fb:.3} ms (medians of 20, CUDA events); forward kernels alone: cumsum {:.3}, states {:.3}, \
                     scores {:.3}, output {:.3} ms",
                    gpu.describe(),
                    st[0],
                    st[1],
                    st[2],
                    st[3]
                );
            }
            Ok(())
        }
        "bench-gemm" => {
            let gpu = cuda::Gpu::new(0)?;
            let dims = match arg_value(&args, "--d") {
                Some(s) => list(&s)?,
                None => vec![768, 1536],
            };
            let tokens = arg_value(&args, "--tokens").map(|s| s.parse()).transpose()?.unwrap_or(32768);
            let vocab = arg_value(&args, "--vocab").map(|s| s.parse()).transpose()?.unwrap_or(50257);
            let iters = arg_value(&args, "--iters").map(|s| s.parse()).transpose()?.unwrap_or(20);
            let warmup = arg_value(&args, "--warmup").map(|s| s.parse()).transpose()?.unwrap_or(3);
            println!("cuBLASLt bf16 GEMMs (fp32 accumulate) on {}, median of {iters}", gpu.describe());
            for d in dims {
                // FoX (Pro) presets: head dim 64, MLP width int(d * 3.5 * 2/3) rounded up to 256
                let inter = ((d as f64 * 3.5 * 2.0 / 3.0) as usize).div_ceil(256) * 256;
                let shapes = gemm_bench::model_shapes(d, d.div_ceil(64), inter, vocab, tokens);
                let rows = gemm_bench::bench_with(&gpu, &shapes, warmup, iters)?;
                println!("\nd = {d}, I = {inter}, {tokens} tokens\n{}", gemm_bench::format_bench(&rows));
            }
            Ok(())
        }
        "bench-scan" => {
            let gpu = cuda::Gpu::new(0)?;
            let get = |name: &str, default: usize| -> Result<usize> {
                Ok(arg_value(&args, name).map(|s| s.parse()).transpose()?.unwrap_or(default))
            };
            let (b, t, di, n) = (get("--b", 2)?, get("--t", 16384)?, get("--di", 1536)?, get("--n", 16)?);
            let (iters, warmup) = (get("--iters", 20)?, get("--warmup", 3)?);
            println!("{}", selective_scan_check::bench(&gpu, b, t, di, n, warmup, iters)?);
            Ok(())
        }
        "help" | "-h" | "--help" => {
            println!(
                "{}",
                include_str!("fox-attn.rs")
                    .lines()
                    .skip(2)
                    .take(15)
                    .map(|l| l.trim_start_matches("//!"))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            Ok(())
        }
        other => bail!(
            "unknown command `{other}` (check, check-ops, check-gemm, bench, bench-gemm, bench-scan, bench-ssd, bench-delta, bench-gla, compile, info)"
        ),
    }
}
