//! `foxlm bench decode`: generation on the GPU (prefill and decode tokens/s against the memory
//! bandwidth's roofline, where a decode step's time goes) and, with `--score`, scoring passes.

use crate::checks::cpu_bench::median as median_of;
use anyhow::{bail, Result};
use fox_kernels::cuda;
use foxlm::backend::select_device;
use foxlm::cli::bench::DecodeArgs;
use rand::{Rng, SeedableRng};

/// Device-to-device copy bandwidth (bytes read + written per second) over a 1 GiB buffer, the
/// median of 5 copies timed with CUDA events: the roofline of a memory-bound decode step.
fn copy_bandwidth(gpu: &cuda::Gpu) -> Result<f64> {
    let n = 1usize << 28; // f32s: 1 GiB
    let a = gpu.zeros::<f32>(n)?;
    let mut b = gpu.zeros::<f32>(n)?;
    let flags = Some(cuda::cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let err = |e: cuda::cudarc::driver::DriverError| anyhow::anyhow!("{e:?}");
    let mut times = Vec::new();
    for i in 0..6 {
        let e0 = gpu.stream().record_event(flags).map_err(err)?;
        gpu.stream().memcpy_dtod(&a, &mut b).map_err(err)?;
        let e1 = gpu.stream().record_event(flags).map_err(err)?;
        gpu.sync()?;
        if i > 0 {
            times.push(e0.elapsed_ms(&e1).map_err(err)? as f64 / 1e3);
        }
    }
    times.sort_by(|x, y| x.total_cmp(y));
    Ok(2.0 * 4.0 * n as f64 / times[times.len() / 2])
}

pub(super) fn decode_bench(a: DecodeArgs) -> Result<()> {
    use foxlm::generate::GenerateOptions;
    use foxlm::infer::{GpuInfer, Plan};
    let gpu = match select_device(a.device)? {
        cuda::Device::Cuda(g) => g,
        cuda::Device::Cpu => bail!("bench decode measures GPU generation: no GPU is usable here (see `fox-attn info`)"),
    };
    eprintln!("device: {}", gpu.describe());
    if a.prompt < 1 || a.new_tokens < 1 || a.repeats < 1 || a.batch.iter().any(|&b| b < 1) {
        bail!("--prompt, --new-tokens, --repeats and every --batch must be at least 1");
    }
    let bw = copy_bandwidth(&gpu)?;
    println!("device copy bandwidth: {:.0} GB/s (read + write)", bw / 1e9);
    let opts = GenerateOptions {
        max_new_tokens: a.new_tokens,
        sampling: foxlm::sampling::Sampling::default(),
        seed: 0,
        eos: None,
    };
    let mut rows = Vec::new();
    for name in &a.preset {
        let preset = foxlm::presets::preset(name)?;
        let model = foxlm::train::init_model(&preset.model, 0);
        let c = &model.config;
        // Bytes a decode step must read at batch 1: every bf16 matrix but the embedding (one row
        // of it), the f32 norm weights, and each layer's state: the cache's keys and values at the
        // mean length (within the window), a recurrent layer's fixed-size f32 state (read and
        // written).
        let emb = model.params.tensors[model.embeddings.0].numel();
        let matrices: usize = model
            .params
            .tensors
            .iter()
            .zip(&model.params.kinds)
            .filter(|(_, k)| **k == foxlm::tensor::ParamKind::Matrix)
            .map(|(t, _)| t.numel())
            .sum();
        let others = model.params.numel() - matrices;
        let weight_bytes = 2 * (matrices - emb) + 4 * others;
        let mean_len = a.prompt + a.new_tokens / 2;
        let cache_bytes: usize = model
            .layers
            .iter()
            .map(|blk| match &blk.mixer {
                // bf16 keys and values per k/v head (grouped-query attention keeps fewer)
                foxlm::model::Mixer::Attention(l) => {
                    2 * l.kv_heads * mean_len.min(l.window.unwrap_or(usize::MAX)) * l.head_dim * 2
                }
                foxlm::model::Mixer::Mamba2(l) => 2 * foxlm::model::mamba2::state::Mamba2State::bytes_for(1, l.sizes()),
                foxlm::model::Mixer::Mamba(l) => 2 * foxlm::model::mamba::state::MambaState::bytes_for(1, l.sizes()),
                foxlm::model::Mixer::DeltaNet(l) => {
                    2 * foxlm::model::deltanet::state::DeltaNetState::bytes_for(1, l.sizes())
                }
                foxlm::model::Mixer::Hgrn2(l) => 2 * foxlm::model::hgrn2::state::Hgrn2State::bytes_for(1, l.sizes()),
            })
            .sum();
        // The roofline: the bytes a step reads over the measured copy bandwidth.
        let roofline = bw / (weight_bytes + cache_bytes) as f64;
        println!(
            "{name}: {:.0} MB of weights + {:.0} MB of cache per step at batch 1: roofline {:.0} tokens/s",
            weight_bytes as f64 / 1e6,
            cache_bytes as f64 / 1e6,
            roofline
        );
        for &b in &a.batch {
            // The kernel-level reference loop (`GpuInfer::decode`: a fixed batch, nothing joining or
            // leaving), not the serving scheduler that `generate` and `serve` drive: the rate the
            // serving targets are measured against.
            let mut eng = GpuInfer::<half::bf16>::new(gpu.clone(), &model, Plan { batch: b, chunk: a.prompt })?;
            eng.graphs = !a.no_graphs;
            eng.set_fused(!a.unfused)?;
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(b as u64);
            let v = c.vocab_size as u32;
            let prompts: Vec<Vec<u32>> = (0..b).map(|_| (0..a.prompt).map(|_| rng.gen_range(0..v)).collect()).collect();
            for _ in 0..a.warmup {
                eng.timed_generate(&prompts, &opts, false)?;
            }
            let mut runs = Vec::new();
            for _ in 0..a.repeats {
                runs.push(eng.timed_generate(&prompts, &opts, false)?);
            }
            let median = |f: &dyn Fn(&foxlm::infer::Timed) -> f64| median_of(&runs.iter().map(f).collect::<Vec<_>>());
            let prefill = median(&|r| (b * a.prompt) as f64 / r.prefill_s);
            let decode = median(&|r| (b * r.steps) as f64 / r.decode_s);
            let ms_token = median(&|r| r.decode_s / r.steps.max(1) as f64 * 1e3);
            let prof = eng.timed_generate(&prompts, &opts, true)?;
            let steps = prof.steps.max(1) as f64;
            let gpu_ms: f64 = prof.families.iter().map(|f| f.1).sum::<f64>() / steps;
            let ops: usize = prof.families.iter().map(|f| f.2).sum();
            let host_ms = prof.decode_s * 1e3 / steps;
            println!(
                "{name} B={b} prompt {} + {} new, bf16{}{}: prefill {:.0} tokens/s; decode {:.0} tokens/s ({:.3} ms/step){}",
                a.prompt,
                a.new_tokens,
                if a.no_graphs { "" } else { ", CUDA graphs" },
                if a.unfused {
                    ", op by op"
                } else if eng.mega.ready() && b == 1 {
                    ", megakernel"
                } else {
                    ", fused"
                },
                prefill,
                decode,
                ms_token,
                if b == 1 { format!(", {:.0}% of the roofline", 100.0 * decode / roofline) } else { String::new() }
            );
            println!(
                "    without graphs (profiled): {:.3} ms/step, {:.0} operations/step; per family, event to event \
                 (the GPU's idle time between launches included):",
                host_ms,
                ops as f64 / steps,
            );
            for (fam, ms, n) in &prof.families {
                println!(
                    "    {:<12} {:>8.3} ms/step {:>6.1} ops/step",
                    format!("{fam:?}"),
                    ms / steps,
                    *n as f64 / steps
                );
            }
            if b == 1 && eng.mega.ready() {
                if let Some(p) = eng.mega.profile(&eng.be)? {
                    println!("{p}");
                }
            }
            rows.push(serde_json::json!({
                "preset": name, "batch": b, "prompt": a.prompt, "new_tokens": a.new_tokens, "graphs": !a.no_graphs, "fused": !a.unfused, "megakernel": b == 1 && eng.mega.ready(),
                "prefill_tok_s": prefill, "decode_tok_s": decode, "ms_per_step": ms_token,
                "roofline_tok_s_batch1": roofline, "copy_bandwidth_gb_s": bw / 1e9,
                "weight_bytes": weight_bytes, "cache_bytes_mean": cache_bytes,
                "profiled_ms_per_step": host_ms, "profiled_event_ms_per_step": gpu_ms, "ops_per_step": ops as f64 / steps,
                "families": prof.families.iter().map(|(f, ms, n)| serde_json::json!({"family": format!("{f:?}"), "ms_per_step": ms / steps, "ops_per_step": *n as f64 / steps})).collect::<Vec<_>>(),
                "gpu": gpu.name(),
            }));
            if a.score {
                drop(eng);
                score_rows(&gpu, &model, name, &prompts, &a, &mut rows)?;
            }
        }
    }
    if let Some(j) = &a.json {
        std::fs::write(j, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}

/// `bench decode --score`: a scoring pass over `prompts` on the benchmark's plan (the prompts'
/// batch × length) and on the server's default plan (64 slots over 16384 positions), timed as
/// the decode rows (median of the repeats) with a per-family profile of each forward.
fn score_rows(
    gpu: &std::sync::Arc<cuda::Gpu>,
    model: &foxlm::model::Model,
    name: &str,
    prompts: &[Vec<u32>],
    a: &DecodeArgs,
    rows: &mut Vec<serde_json::Value>,
) -> Result<()> {
    let (b, t) = (prompts.len(), prompts.first().map_or(0, |p| p.len()));
    use foxlm::infer::{GpuInfer, Plan};
    let tokens = (b * t) as f64;
    for (plan_name, slots, chunk) in [("this benchmark's plan", b, t), ("the server's plan", 64, 0)] {
        let mut eng = if chunk > 0 {
            GpuInfer::<half::bf16>::new(gpu.clone(), model, Plan { batch: slots, chunk })?
        } else {
            foxlm::serve::gpu::serving_infer(gpu.clone(), model, slots, t + a.new_tokens + 1)?
        };
        let plan = eng.plan();
        for _ in 0..a.warmup.max(1) {
            eng.timed_score(prompts, false)?;
        }
        let mut runs = Vec::new();
        for _ in 0..a.repeats.max(1) {
            runs.push(eng.timed_score(prompts, false)?);
        }
        let median = |f: &dyn Fn(&foxlm::infer::TimedScore) -> f64| median_of(&runs.iter().map(f).collect::<Vec<_>>());
        let (fwd, head) = (median(&|r| r.forward_s), median(&|r| r.head_s));
        let prof = eng.timed_score(prompts, true)?;
        println!(
            "{name} B={b} T={t} scoring on {plan_name} ({} × {}): {:.0} tokens/s; forward {:.3} ms, head + log-probs {:.3} ms",
            plan.batch,
            plan.chunk,
            tokens / (fwd + head),
            fwd * 1e3,
            head * 1e3
        );
        for (fam, ms, n) in &prof.families {
            println!("    {:<12} {:>8.3} ms {:>6} ops (profiled forward)", format!("{fam:?}"), ms, n);
        }
        rows.push(serde_json::json!({
            "preset": name, "batch": b, "prompt": t, "score_plan": [plan.batch, plan.chunk],
            "score_tok_s": tokens / (fwd + head), "score_forward_ms": fwd * 1e3, "score_head_ms": head * 1e3,
            "families": prof.families.iter().map(|(f, ms, n)| serde_json::json!({"family": format!("{f:?}"), "ms": ms, "ops": n})).collect::<Vec<_>>(),
            "gpu": gpu.name(),
        }));
    }
    Ok(())
}
