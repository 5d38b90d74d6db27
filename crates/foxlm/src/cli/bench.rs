//! `foxlm bench attention`: Forgetting Attention throughput on the GPU (the CUDA kernels, with
//! PyTorch's SDPA timed in the same run as the reference) or on the CPU (the tiled reference).

use anyhow::{bail, Result};
use fox_kernels::attention::{self as fa, View, Visibility};
use fox_kernels::cuda::{self, bench::BenchOpts, DeviceArg};
use rand::{Rng, SeedableRng};

use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(clap::Subcommand, Debug)]
pub enum What {
    /// Forgetting Attention forward and forward+backward TFLOP/s (causal work: fwd 2·B·H·T²·D,
    /// fwd+bwd 3.5× that), gates "mixed", ACP off and on.
    Attention(AttentionArgs),
    /// A training step of a model on the GPU: tokens/s, step time, achieved TFLOP/s, peak memory
    /// and where the time goes (GEMMs, attention, output head, optimizer, the rest), ACP off and on.
    Train(TrainArgs),
    /// Generation on the GPU: prefill tokens/s, then decode tokens/s (batch 1 and batched) after a
    /// long prompt, with random weights, next to the GPU's memory-bandwidth roofline; and where a
    /// decode step's time goes (kernels per token, GPU time per kernel family, launch gaps).
    Decode(DecodeArgs),
    /// `foxlm serve` under load: N concurrent streaming clients for a fixed time; requests/s,
    /// generated tokens/s, time to first token and inter-token latency (p50/p99), errors, peak memory.
    Serve(crate::cli::serve::BenchArgs),
}

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// The model (a preset's; the training recipe is not used): e.g. fox-pro-125m, transformer-pro-760m.
    #[arg(long, default_value = "fox-pro-125m")]
    pub preset: String,
    #[arg(long, default_value_t = 16384)]
    pub context: usize,
    /// Sequences per step (one micro-batch).
    #[arg(long, default_value_t = 2)]
    pub batch: usize,
    /// cuda, cuda:N or auto.
    #[arg(long, default_value = "auto")]
    pub device: DeviceArg,
    #[arg(long, default_value = "bf16")]
    pub dtype: crate::engine::Dtype,
    /// Adaptive computation pruning: off, on, or both (two rows).
    #[arg(long, default_value = "both", value_parser = ["off", "on", "both"])]
    pub acp: String,
    /// Recompute each block in the backward (keep only block inputs).
    #[arg(long)]
    pub recompute: bool,
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    #[arg(long, default_value_t = 10)]
    pub steps: usize,
    /// Also write the rows as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct DecodeArgs {
    /// Models (presets' shapes, random weights), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "fox-pro-125m")]
    pub preset: Vec<String>,
    /// Prompt tokens per row.
    #[arg(long, default_value_t = 2048)]
    pub prompt: usize,
    /// New tokens per row (greedy; end-of-text does not stop it).
    #[arg(long, default_value_t = 128)]
    pub new_tokens: usize,
    /// Batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    pub batch: Vec<usize>,
    /// cuda, cuda:N or auto.
    #[arg(long, default_value = "auto")]
    pub device: DeviceArg,
    /// Decode without CUDA graphs (every operation launched from the host).
    #[arg(long)]
    pub no_graphs: bool,
    /// Decode op by op (cuBLASLt GEMMs, no fused kernels): what the fused step is compared with.
    #[arg(long)]
    pub unfused: bool,
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Timed generations; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Also write the rows as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct AttentionArgs {
    /// cpu, cuda, cuda:N or auto (a GPU if one is usable, else the CPU).
    #[arg(long, default_value = "auto")]
    pub device: DeviceArg,
    /// Head dimensions.
    #[arg(long, value_delimiter = ',', default_value = "64,128")]
    pub d: Vec<usize>,
    /// Sequence lengths.
    #[arg(long, value_delimiter = ',', default_value = "1024,4096,16384")]
    pub t: Vec<usize>,
    /// Tokens per batch, B·T (the CPU default is smaller: 4096).
    #[arg(long)]
    pub tokens: Option<usize>,
    /// Model width, H·D.
    #[arg(long, default_value_t = 2048)]
    pub hidden: usize,
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    #[arg(long, default_value_t = 10)]
    pub iters: usize,
    /// Time the forward pass only.
    #[arg(long)]
    pub fwd_only: bool,
    /// Skip the PyTorch SDPA reference (GPU only).
    #[arg(long)]
    pub no_sdpa: bool,
    /// Skip the FoX authors' Triton kernel and the fla library's kernel (GPU only).
    #[arg(long)]
    pub no_fox_refs: bool,
    /// Where those kernels' code is: authors/src (their repository's src folder) and wheels
    /// (fla-core and einops wheels); see docs/gpu.md.
    #[arg(long, default_value = ".device-bundle")]
    pub bundle: PathBuf,
    /// The python3 that has PyTorch, for the SDPA reference.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Also write the rows as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

pub fn run(a: Args) -> Result<()> {
    match a.what {
        What::Attention(a) => attention(a),
        What::Train(a) => train_bench(a),
        What::Decode(a) => decode_bench(a),
        What::Serve(a) => crate::cli::serve::bench(a),
    }
}

fn attention(a: AttentionArgs) -> Result<()> {
    let dev = cuda::select(a.device)?;
    eprintln!("device: {}", dev.describe());
    if let cuda::Device::Cuda(_) = dev {
        let ordinal = match a.device {
            DeviceArg::Cuda(n) => n,
            _ => 0,
        };
        let opts = BenchOpts {
            head_dims: a.d,
            seq_lens: a.t,
            tokens: a.tokens.unwrap_or(32768),
            hidden: a.hidden,
            warmup: a.warmup,
            iters: a.iters,
            backward: !a.fwd_only,
            sdpa: !a.no_sdpa,
            fox_refs: !a.no_fox_refs,
            bundle: a.bundle,
            python: a.python,
            json: a.json,
            seed: a.seed,
            device: ordinal,
            ..BenchOpts::default()
        };
        let report = cuda::bench::run_attention_bench(&opts)?;
        println!("{}", report.table());
        return Ok(());
    }
    if a.device == DeviceArg::Auto {
        if let Err(e) = cuda::probe() {
            eprintln!("no GPU ({e:#}); timing the CPU reference instead");
        }
    }
    cpu_bench(&a)
}

/// Times the CPU kernel on mixed gates: one warm-up, then the median of `iters` (at most 3).
fn cpu_bench(a: &AttentionArgs) -> Result<()> {
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
                let mut out = vec![0.0; n];
                let flops = 2.0 * (b * h * t * t * d) as f64;
                let iters = a.iters.clamp(1, 3);
                let mut tf = Vec::new();
                let mut tb = Vec::new();
                let mut pruned = 0.0;
                for it in 0..=iters {
                    let s = Instant::now();
                    let st = fa::forward(&p, &mut out);
                    let f = s.elapsed().as_secs_f64();
                    pruned = st.tiles_pruned as f64 / (st.tiles_pruned + st.tiles_visited).max(1) as f64;
                    let s = Instant::now();
                    if !a.fwd_only {
                        fa::backward(&p, &out, &q, &st.lse);
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

/// FLOPs of one training step (forward + backward): 6 per token and matmul weight (the embedding
/// is a lookup), plus causal attention counted as half of the full T² work: fwd 2·B·H·T²·D per
/// layer (two products), backward 2.5× that.
pub fn train_step_flops(model: &crate::model::Model, batch: usize, context: usize) -> f64 {
    let p = &model.params;
    let matmul: usize = p
        .tensors
        .iter()
        .zip(&p.names)
        .zip(&p.kinds)
        .filter(|((_, n), k)| **k == crate::tensor::ParamKind::Matrix && n.as_str() != "model.embeddings.weight")
        .map(|((t, _), _)| t.numel())
        .sum();
    let c = &model.config;
    let tokens = (batch * context) as f64;
    let attn = c.num_hidden_layers as f64
        * 3.5
        * 2.0
        * batch as f64
        * c.num_heads as f64
        * (context as f64).powi(2)
        * c.head_dim() as f64;
    6.0 * tokens * matmul as f64 + attn
}

fn train_bench(a: TrainArgs) -> Result<()> {
    use crate::engine::{memory_plan, Dtype};
    let gpu = match cuda::select(a.device)? {
        cuda::Device::Cuda(g) => g,
        cuda::Device::Cpu => bail!("bench train measures a GPU step: no GPU is usable here (see `fox-attn info`)"),
    };
    eprintln!("device: {}", gpu.describe());
    let preset = crate::presets::preset(&a.preset)?;
    let acps: Vec<bool> = match a.acp.as_str() {
        "off" => vec![false],
        "on" => vec![true],
        _ => vec![false, true],
    };
    let mut rows = Vec::new();
    let mut first_peak = None;
    for acp in acps {
        let mut cfg = preset.model.clone();
        cfg.log_pruning_tolerance = acp.then_some(-10.0);
        let model = crate::train::init_model(&cfg, 0);
        let plan = memory_plan(&model, a.batch, a.context, a.dtype, a.recompute, 1)?;
        eprint!("{}", crate::engine::format_plan(&plan, 1));
        let r = match a.dtype {
            Dtype::Bf16 => bench_one::<half::bf16>(&gpu, &model, &a, &plan)?,
            Dtype::F32 => bench_one::<f32>(&gpu, &model, &a, &plan)?,
        };
        // Freed buffers stay in the driver's pool, so only the first row's peak is a measurement;
        // later rows allocate the same plan.
        let peak = *first_peak.get_or_insert(r.peak_gib);
        let flops = train_step_flops(&model, a.batch, a.context);
        let tps = (a.batch * a.context) as f64 / r.step_s;
        let tflops = flops / r.step_s / 1e12;
        println!(
            "{}{} B={} T={} {} ACP {}: {:.0} tokens/s, step {:.1} ms, {:.0} TFLOP/s (model), peak {:.2} GiB",
            a.preset,
            if a.recompute { " (recompute)" } else { "" },
            a.batch,
            a.context,
            a.dtype,
            if acp { "on" } else { "off" },
            tps,
            r.step_s * 1e3,
            tflops,
            peak
        );
        let total: f64 = r.profile.iter().map(|p| p.1).sum();
        for (fam, ms, n) in &r.profile {
            println!(
                "    {:<10} {:>8.1} ms {:>5.1}%  {:>5} ops",
                format!("{fam:?}"),
                ms,
                100.0 * ms / total.max(1e-9),
                n
            );
        }
        rows.push(serde_json::json!({
            "preset": a.preset, "recompute": a.recompute, "batch": a.batch, "context": a.context, "dtype": a.dtype.to_string(), "acp": acp,
            "tokens_per_s": tps, "step_ms_median": r.step_s * 1e3, "tflops_model": tflops, "peak_gib": peak,
            "plan_gib": plan.total() as f64 / (1u64 << 30) as f64, "losses": r.losses,
            "profile": r.profile.iter().map(|(f, ms, n)| serde_json::json!({"family": format!("{f:?}"), "ms": ms, "ops": n})).collect::<Vec<_>>(),
            "gpu": gpu.name(),
        }));
    }
    if let Some(j) = &a.json {
        std::fs::write(j, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}

struct BenchResult {
    step_s: f64,
    peak_gib: f64,
    profile: Vec<(crate::backend::cuda::Family, f64, usize)>,
    losses: Vec<f64>,
}

fn bench_one<T: cuda::Elem>(
    gpu: &std::sync::Arc<cuda::Gpu>,
    model: &crate::model::Model,
    a: &TrainArgs,
    plan: &crate::model::MemoryPlan,
) -> Result<BenchResult> {
    let mem_used = || gpu.context().mem_get_info().map(|(f, t)| t - f).unwrap_or(0);
    let before = mem_used();
    let opt = crate::optim::AdamW::new(crate::presets::tiny().train.adamw(), &model.params);
    let mut eng = crate::engine::GpuEngine::<T>::new(gpu.clone(), model, &opt, a.batch, a.context, a.recompute, plan)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let v = model.config.vocab_size as u32;
    let n = a.batch * a.context;
    let mut batch = || {
        let ids: Vec<u32> = (0..n).map(|_| rng.gen_range(0..v)).collect();
        let targets: Vec<Option<u32>> =
            (0..n).map(|i| if (i + 1) % a.context != 0 { Some(ids[i + 1]) } else { None }).collect();
        vec![(ids, targets)]
    };
    let mut losses = Vec::new();
    for _ in 0..a.warmup {
        losses.push(eng.step_on(model, &batch(), 1.0, 1e-4)?.loss);
    }
    let mut times = Vec::new();
    for _ in 0..a.steps.max(1) {
        let b = batch();
        gpu.sync()?;
        let t0 = Instant::now();
        losses.push(eng.step_on(model, &b, 1.0, 1e-4)?.loss);
        gpu.sync()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    times.sort_by(|x, y| x.total_cmp(y));
    let step_s = times[times.len() / 2];
    let peak_gib = (mem_used().saturating_sub(before)) as f64 / (1u64 << 30) as f64;
    let b = batch();
    eng.backend_mut().start_profile();
    eng.step_on(model, &b, 1.0, 1e-4)?;
    let profile = eng.backend_mut().take_profile()?;
    Ok(BenchResult { step_s, peak_gib, profile, losses })
}

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

fn decode_bench(a: DecodeArgs) -> Result<()> {
    use crate::generate::GenerateOptions;
    use crate::infer::{GpuInfer, Plan};
    let gpu = match cuda::select(a.device)? {
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
        sampling: crate::sampling::Sampling::default(),
        seed: 0,
        eos: None,
    };
    let mut rows = Vec::new();
    for name in &a.preset {
        let preset = crate::presets::preset(name)?;
        let model = crate::train::init_model(&preset.model, 0);
        let c = &model.config;
        // Bytes a decode step must read at batch 1: every bf16 matrix but the embedding (one row
        // of it), the f32 norm weights, and the cache's keys and values at the mean length.
        let emb = model.params.tensors[model.embeddings.0].numel();
        let matrices: usize = model
            .params
            .tensors
            .iter()
            .zip(&model.params.kinds)
            .filter(|(_, k)| **k == crate::tensor::ParamKind::Matrix)
            .map(|(t, _)| t.numel())
            .sum();
        let others = model.params.numel() - matrices;
        let weight_bytes = 2 * (matrices - emb) + 4 * others;
        let mean_len = a.prompt + a.new_tokens / 2;
        // keys and values per k/v head (grouped-query attention keeps fewer); every position is
        // kept, a window only masks
        let cache_bytes = c.num_hidden_layers * 2 * c.kv_heads() * mean_len * c.head_dim() * 2;
        // The roofline: the bytes a step reads over the measured copy bandwidth.
        let roofline = bw / (weight_bytes + cache_bytes) as f64;
        println!(
            "{name}: {:.0} MB of weights + {:.0} MB of cache per step at batch 1: roofline {:.0} tokens/s",
            weight_bytes as f64 / 1e6,
            cache_bytes as f64 / 1e6,
            roofline
        );
        for &b in &a.batch {
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
            let median = |f: &dyn Fn(&crate::infer::Timed) -> f64| {
                let mut v: Vec<f64> = runs.iter().map(f).collect();
                v.sort_by(|x, y| x.total_cmp(y));
                v[v.len() / 2]
            };
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
                if a.unfused { ", op by op" } else { ", fused" },
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
            rows.push(serde_json::json!({
                "preset": name, "batch": b, "prompt": a.prompt, "new_tokens": a.new_tokens, "graphs": !a.no_graphs, "fused": !a.unfused,
                "prefill_tok_s": prefill, "decode_tok_s": decode, "ms_per_step": ms_token,
                "roofline_tok_s_batch1": roofline, "copy_bandwidth_gb_s": bw / 1e9,
                "weight_bytes": weight_bytes, "cache_bytes_mean": cache_bytes,
                "profiled_ms_per_step": host_ms, "profiled_event_ms_per_step": gpu_ms, "ops_per_step": ops as f64 / steps,
                "families": prof.families.iter().map(|(f, ms, n)| serde_json::json!({"family": format!("{f:?}"), "ms_per_step": ms / steps, "ops_per_step": *n as f64 / steps})).collect::<Vec<_>>(),
                "gpu": gpu.name(),
            }));
        }
    }
    if let Some(j) = &a.json {
        std::fs::write(j, serde_json::to_string_pretty(&rows)?)?;
    }
    Ok(())
}
