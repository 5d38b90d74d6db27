//! `foxlm bench`: attention, training-step and decoding throughput (the flags are
//! [`foxlm::cli::bench::Args`]).

use super::cpu_bench::median as median_of;
use anyhow::{bail, Context, Result};
use fox_checks::bench::BenchOpts;
use fox_kernels::attention::{self as fa, View, Visibility};
use fox_kernels::cuda;
use foxlm::backend::{select_device, DeviceArg};
use foxlm::cli::bench::*;
use rand::{Rng, SeedableRng};

use std::time::Instant;
pub fn run(a: Args) -> Result<()> {
    match a.what {
        What::Attention(a) => attention(a),
        What::Gla(a) => gla(a),
        What::Train(a) => train_bench(a),
        What::Decode(a) => decode_bench(a),
        What::Serve(a) => foxlm::cli::serve::bench(a),
    }
}

/// `fox-attn bench-gla`'s timings: HGRN2's GLA at one shape, versions 3 (the walk; its width from
/// FOXLM_GLA_KB) and 2 (tensor cores) on bf16, version 1 on bf16 and f32.
fn gla(a: GlaArgs) -> Result<()> {
    use fox_checks::gla_check::bench;
    let gpu = match select_device(a.device)? {
        cuda::Device::Cuda(g) => g,
        cuda::Device::Cpu => bail!("bench gla times GPU kernels: no GPU is usable here (see `fox-attn info`)"),
    };
    let [b, t, h, d] = a.shape[..] else { bail!("--shape takes B,T,H,D") };
    for (what, bf, version) in fox_checks::gla_check::BENCH_VERSIONS {
        let (fwd, fb, st) = if bf {
            bench::<half::bf16>(&gpu, (b, t, h, d), a.warmup, a.iters, version)?
        } else {
            bench::<f32>(&gpu, (b, t, h, d), a.warmup, a.iters, version)?
        };
        println!(
            "GLA on {}, [B, T, H, K = V] = ({b}, {t}, {h}, {d}), {what}: forward {fwd:.3} ms, forward + backward \
             {fb:.3} ms (medians of {}, CUDA events); forward kernels alone: cumsum {:.3}, states {:.3}, scores \
             {:.3}, output {:.3} ms",
            gpu.describe(),
            a.iters,
            st[0],
            st[1],
            st[2],
            st[3]
        );
    }
    Ok(())
}

fn attention(a: AttentionArgs) -> Result<()> {
    let dev = select_device(a.device)?;
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
        let report = fox_checks::bench::run_attention_bench(&opts)?;
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

/// FLOPs of one training step (forward + backward): 6 per token and matmul weight (the embedding
/// is a lookup), plus causal attention counted as half of the full T² work: fwd 2·B·H·T²·D per
/// layer (two products), backward 2.5× that.
pub fn train_step_flops(model: &foxlm::model::Model, batch: usize, context: usize) -> f64 {
    let matmul = model.linear_numel();
    let tokens = (batch * context) as f64;
    let mixers: f64 = model
        .layers
        .iter()
        .map(|blk| match &blk.mixer {
            // Causal attention, 2·B·H·T²·D forward; the backward counted as 2.5 times that.
            // A sliding window (Samba's) bounds the keys: the mean over queries of min(i + 1, w),
            // against T/2 for full causal attention.
            foxlm::model::Mixer::Attention(l) => {
                let keys = super::cpu_bench::mean_keys(context, l.window);
                3.5 * 4.0 * batch as f64 * l.heads as f64 * context as f64 * keys * l.head_dim as f64
            }
            // The recurrence's arithmetic: per token and head, the state update and its read-out
            // (4·P·N) forward, twice that backward (the chunked form does more, in matrix units).
            foxlm::model::Mixer::Mamba2(l) => {
                let s = l.sizes();
                3.0 * 4.0 * tokens * (s.heads * s.head_dim * s.state) as f64
            }
            // Mamba's selective scan: per token, channel and state the update and the read-out
            // (4·Di·N) forward, twice that backward.
            foxlm::model::Mixer::Mamba(l) => {
                let s = l.sizes();
                3.0 * 4.0 * tokens * (s.inner * s.state) as f64
            }
            // The delta rule: per token and head, the state's read at k, its update and its read
            // at q (6·K·V) forward, twice that backward.
            foxlm::model::Mixer::DeltaNet(l) => {
                let s = l.sizes();
                3.0 * 6.0 * tokens * (s.heads * s.head_k * s.head_v) as f64
            }
            // GLA: per token and head, the state's decay (K·V), update and read at q (2·K·V each)
            // forward, twice that backward.
            foxlm::model::Mixer::Hgrn2(l) => {
                let s = l.sizes();
                3.0 * 5.0 * tokens * (s.heads * s.head_dim * s.head_dim) as f64
            }
        })
        .sum();
    6.0 * tokens * matmul as f64 + mixers
}

/// One row of `bench train` (also its JSON, and what a process started by `--gpus` reports).
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
struct TrainRow {
    preset: String,
    recompute: bool,
    /// Sequences per step on each GPU.
    batch: usize,
    context: usize,
    dtype: String,
    acp: bool,
    /// GPUs (ranks) of the step; `nccl`: through the data-parallel engine.
    gpus: usize,
    nccl: bool,
    /// Sequences per optimizer step over all GPUs.
    global_batch: usize,
    /// Over all GPUs.
    tokens_per_s: f64,
    step_ms_median: f64,
    /// Per GPU.
    tflops_model: f64,
    peak_gib: f64,
    plan_gib: f64,
    /// fp32 master weights and AdamW moments that each GPU holds (the memory plan's).
    optimizer_gib: f64,
    /// GPU time on the NCCL stream during the profiled step (partly overlapping the backward).
    comm_ms: Option<f64>,
    /// tokens/s on `gpus` GPUs / (gpus × tokens/s on one), in the rows of `--gpus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scaling_efficiency: Option<f64>,
    losses: Vec<f64>,
    profile: Vec<ProfileRow>,
    gpu: String,
}

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
struct ProfileRow {
    family: String,
    ms: f64,
    ops: usize,
}

fn train_bench(a: TrainArgs) -> Result<()> {
    use foxlm::distributed::launch::LAUNCHED_ENV;
    let rows = if !a.gpus.is_empty() {
        scaling(&a, &a.gpus)?
    } else if std::env::var_os(LAUNCHED_ENV).is_some() && std::env::var_os("WORLD_SIZE").is_some() {
        // A rank that `--gpus` started.
        let Some(rows) = bench_rank(&a)? else { return Ok(()) };
        rows
    } else if a.device == DeviceArg::Cpu {
        return cpu_train_bench(&a);
    } else {
        let gpu = match select_device(a.device)? {
            cuda::Device::Cuda(g) => g,
            cuda::Device::Cpu => bail!(
                "bench train: no GPU is usable here (see `fox-attn info`); `--device cpu` measures the CPU step \
                 (pick a small --context and --batch: e.g. --preset tiny --batch 8 --context 128)"
            ),
        };
        eprintln!("device: {}", gpu.describe());
        bench_rows(&a, &gpu, None, true)?
    };
    if let Some(r) = &a.report {
        std::fs::write(r, serde_json::to_string(&rows)?).with_context(|| format!("--report {}", r.display()))?;
    }
    if let Some(j) = &a.json {
        std::fs::write(j, serde_json::to_string_pretty(&rows)?).with_context(|| format!("--json {}", j.display()))?;
    }
    Ok(())
}

/// `bench train --device cpu`: the CPU engine's full step (forward, backward, clipping, AdamW) on
/// the preset at --batch × --context, against the gemm crate's peak sampled beside every step
/// (`super::cpu_bench`). The GPU options (--dtype, --acp, --recompute, --gpus) do not apply.
fn cpu_train_bench(a: &TrainArgs) -> Result<()> {
    if !a.gpus.is_empty() || a.recompute || a.acp == "on" {
        bail!("bench train --device cpu: --gpus, --recompute and --acp on are GPU options");
    }
    let preset = foxlm::presets::preset(&a.preset)?;
    let threads = rayon::current_num_threads();
    eprintln!(
        "device: cpu ({threads} threads, f32); {} at {} x {} tokens per step, {} warm-up and {} timed steps",
        a.preset, a.batch, a.context, a.warmup, a.steps
    );
    let mut refs = fox_kernels::matmul::peak_references();
    let row =
        super::cpu_bench::measure(&a.preset, &preset.model, a.batch, a.context, a.warmup, a.steps, &mut refs, true)?;
    print!("{}", super::cpu_bench::table(std::slice::from_ref(&row)));
    print!("{}", super::cpu_bench::breakdown(&row));
    if let Some(j) = &a.json {
        std::fs::write(j, serde_json::to_string_pretty(&[row])?).with_context(|| format!("--json {}", j.display()))?;
    }
    Ok(())
}

/// The rows of `a` on `gpu`: one GPU, or one rank of a data-parallel run through `nccl`; `talk`:
/// print them (rank 0).
fn bench_rows(
    a: &TrainArgs,
    gpu: &std::sync::Arc<cuda::Gpu>,
    mut nccl: Option<cuda::nccl::Nccl>,
    talk: bool,
) -> Result<Vec<TrainRow>> {
    use foxlm::backend::Dtype;
    use foxlm::engine::memory_plan;
    let preset = foxlm::presets::preset(&a.preset)?;
    let acps: Vec<bool> = match a.acp.as_str() {
        // ACP prunes Forgetting Attention: the recurrent families have none to prune.
        _ if preset.model.arch() != foxlm::config::Arch::Fox => vec![false],
        "off" => vec![false],
        "on" => vec![true],
        _ => vec![false, true],
    };
    let (rank, world) = nccl.as_ref().map_or((0, 1), |c| (c.rank, c.world));
    let mut rows = Vec::new();
    let mut first_peak = None;
    for acp in acps {
        let mut cfg = preset.model.clone();
        cfg.log_pruning_tolerance = acp.then_some(-10.0);
        let mut model = foxlm::train::init_model(&cfg, 0);
        let plan = memory_plan(&model, a.batch, a.context, a.dtype, a.recompute, world)?;
        if talk {
            eprint!("{}", foxlm::engine::format_plan(&plan, world));
        }
        let (r, back) = match a.dtype {
            Dtype::Bf16 => bench_one::<half::bf16>(gpu, &mut model, a, &plan, nccl.take(), rank)?,
            Dtype::F32 => bench_one::<f32>(gpu, &mut model, a, &plan, nccl.take(), rank)?,
        };
        nccl = back;
        // Freed buffers stay in the driver's pool, so only the first row's peak is a measurement;
        // later rows allocate the same plan.
        let peak = *first_peak.get_or_insert(r.peak_gib);
        let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
        let (master, moments) = foxlm::backend::cuda::optimizer_state_bytes(&model, world);
        let flops = train_step_flops(&model, a.batch, a.context);
        let tps = (world * a.batch * a.context) as f64 / r.step_s;
        let row = TrainRow {
            preset: a.preset.clone(),
            recompute: a.recompute,
            batch: a.batch,
            context: a.context,
            dtype: a.dtype.to_string(),
            acp,
            gpus: world,
            nccl: r.comm_ms.is_some(),
            global_batch: world * a.batch,
            tokens_per_s: tps,
            step_ms_median: r.step_s * 1e3,
            tflops_model: flops / r.step_s / 1e12,
            peak_gib: peak,
            plan_gib: gib(plan.total()),
            optimizer_gib: gib(master + moments),
            comm_ms: r.comm_ms,
            scaling_efficiency: None,
            losses: r.losses,
            profile: r
                .profile
                .iter()
                .map(|(f, ms, n)| ProfileRow { family: format!("{f:?}"), ms: *ms, ops: *n })
                .collect(),
            gpu: gpu.name().to_string(),
        };
        if talk {
            print_row(&row);
        }
        rows.push(row);
    }
    Ok(rows)
}

fn print_row(r: &TrainRow) {
    let ranks = if r.nccl {
        format!(
            ", {} rank{} (NCCL, ZeRO-1; global batch {})",
            r.gpus,
            if r.gpus == 1 { "" } else { "s" },
            r.global_batch
        )
    } else {
        String::new()
    };
    println!(
        "{}{} B={} T={} {} ACP {}{ranks}: {:.0} tokens/s, step {:.1} ms, {:.0} TFLOP/s (model, per GPU), peak {:.2} GiB",
        r.preset,
        if r.recompute { " (recompute)" } else { "" },
        r.batch,
        r.context,
        r.dtype,
        if r.acp { "on" } else { "off" },
        r.tokens_per_s,
        r.step_ms_median,
        r.tflops_model,
        r.peak_gib
    );
    let total: f64 = r.profile.iter().map(|p| p.ms).sum();
    for p in &r.profile {
        println!("    {:<10} {:>8.1} ms {:>5.1}%  {:>5} ops", p.family, p.ms, 100.0 * p.ms / total.max(1e-9), p.ops);
    }
    if let Some(c) = r.comm_ms {
        println!("    collectives {:>6.1} ms on the NCCL stream (overlapping the backward in part)", c);
    }
}

/// A rank started by `--gpus`: the rendezvous and watchdog of `foxlm train`'s ranks, then the
/// rows through NCCL on GPU LOCAL_RANK; rank 0 alone prints and returns them.
fn bench_rank(a: &TrainArgs) -> Result<Option<Vec<TrainRow>>> {
    let w = foxlm::distributed::World::from_env().context("a rank of `bench train --gpus`")?;
    cuda::nccl::nvls_off()?;
    // The first steps compile the kernels; a stuck collective still ends every rank.
    let (rendezvous, collective) = (std::time::Duration::from_secs(60), std::time::Duration::from_secs(600));
    let rows = foxlm::distributed::as_rank(&w, rendezvous, collective, |d| {
        let ordinal = w.gpu(cuda::probe()?)?;
        let gpu = cuda::Gpu::new(ordinal)?;
        if w.rank == 0 {
            eprintln!("device: {} (rank 0 of {})", gpu.describe(), w.size);
        }
        let nccl = cuda::nccl::Nccl::new(gpu.clone(), w.rank, w.size, &d.nccl_id)?;
        foxlm::distributed::heartbeat();
        bench_rows(a, &gpu, Some(nccl), w.rank == 0)
    })
    .map_err(|e| e.context(format!("rank {} of {}", w.rank, w.size)))?;
    Ok((w.rank == 0).then_some(rows))
}

/// `bench train --gpus N[,M..]`: the rows on one GPU (a process of their own), then on N (then M..)
/// ranks started as `foxlm train --gpus` starts them, each from a fresh process so that no run's
/// memory is in another's way; then the scaling table.
fn scaling(a: &TrainArgs, counts: &[usize]) -> Result<Vec<TrainRow>> {
    use foxlm::distributed::launch::{launch_local, Ended, LAUNCHED_ENV};
    if counts.contains(&0) {
        bail!("--gpus 0: give at least 1 (or drop --gpus to measure one GPU)");
    }
    let most = counts.iter().copied().max().unwrap_or(1);
    if let DeviceArg::Cuda(k) = a.device {
        if k != 0 {
            let list: Vec<String> = counts.iter().map(|n| n.to_string()).collect();
            bail!(
                "--device cuda:{k} with --gpus {}: the runs use GPUs 0..{most} (choose others with \
                 CUDA_VISIBLE_DEVICES); drop --device",
                list.join(",")
            );
        }
    }
    foxlm::cli::train::check_gpus(a.device, most)?;
    let exe = std::env::current_exe().context("finding this program to start the benchmark's processes")?;
    let dir = std::env::temp_dir().join(format!("foxlm-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let read = |p: &std::path::Path| -> Result<Vec<TrainRow>> {
        let text = std::fs::read_to_string(p).with_context(|| format!("no rows from the run ({})", p.display()))?;
        serde_json::from_str(&text).with_context(|| format!("{}: not the rows of bench train", p.display()))
    };
    let run = || -> Result<(Vec<TrainRow>, Vec<TrainRow>)> {
        let one = dir.join("one.json");
        eprintln!("== 1 GPU: the single-GPU engine, {} sequences per step", a.batch);
        let status = std::process::Command::new(&exe)
            .args(child_args(a, &one))
            .env_remove(LAUNCHED_ENV)
            .status()
            .with_context(|| format!("cannot start {}", exe.display()))?;
        if !status.success() {
            bail!("the 1-GPU run failed ({status}; its messages are above)");
        }
        let one = read(&one)?;
        let mut many = Vec::new();
        for &n in counts {
            eprintln!(
                "== {n} GPU{}: {n} rank{} through NCCL (ZeRO-1), {} sequences per GPU, global batch {}",
                if n == 1 { "" } else { "s" },
                if n == 1 { "" } else { "s" },
                a.batch,
                n * a.batch
            );
            let rows = dir.join(format!("gpus{n}.json"));
            if launch_local(n, &child_args(a, &rows))? == Ended::Interrupted {
                std::process::exit(130);
            }
            many.extend(read(&rows)?);
        }
        Ok((one, many))
    };
    let res = run();
    let _ = std::fs::remove_dir_all(&dir);
    let (one, mut many) = res?;
    add_scaling(&one, &mut many);
    print!("{}", scaling_table(&one, &many));
    Ok(one.into_iter().chain(many).collect())
}

/// Each N-GPU row's scaling efficiency against the 1-GPU row of the same ACP setting.
fn add_scaling(one: &[TrainRow], many: &mut [TrainRow]) {
    for m in many {
        if let Some(o) = one.iter().find(|o| o.acp == m.acp) {
            m.scaling_efficiency = Some(m.tokens_per_s / (m.gpus as f64 * o.tokens_per_s));
        }
    }
}

/// The arguments of the processes `--gpus` starts: this benchmark's, rows to `report`.
fn child_args(a: &TrainArgs, report: &std::path::Path) -> Vec<std::ffi::OsString> {
    let mut v: Vec<std::ffi::OsString> =
        ["bench", "train", "--preset", &a.preset, "--acp", &a.acp].into_iter().map(Into::into).collect();
    for (flag, n) in [("--context", a.context), ("--batch", a.batch), ("--warmup", a.warmup), ("--steps", a.steps)] {
        v.push(flag.into());
        v.push(n.to_string().into());
    }
    v.push("--dtype".into());
    v.push(a.dtype.to_string().into());
    if a.recompute {
        v.push("--recompute".into());
    }
    v.push("--report".into());
    v.push(report.into());
    v
}

/// The table of `--gpus`: a row per GPU count (and ACP setting).
fn scaling_table(one: &[TrainRow], many: &[TrainRow]) -> String {
    let Some(f) = one.first() else { return String::new() };
    let mut s = format!(
        "\n{}{} T={} {} B={} per GPU (N GPUs: global batch N×{}):\n",
        f.preset,
        if f.recompute { " (recompute)" } else { "" },
        f.context,
        f.dtype,
        f.batch,
        f.batch
    );
    s += &format!(
        "{:>4} {:>4} {:<14} {:>10} {:>10} {:>8} {:>9} {:>13} {:>14} {:>12}\n",
        "GPUs",
        "ACP",
        "engine",
        "tokens/s",
        "per GPU",
        "scaling",
        "step ms",
        "peak GiB/GPU",
        "optim GiB/GPU",
        "collect. ms"
    );
    for r in one.iter().chain(many) {
        s += &format!(
            "{:>4} {:>4} {:<14} {:>10.0} {:>10.0} {:>8} {:>9.1} {:>13.2} {:>14.3} {:>12}\n",
            r.gpus,
            if r.acp { "on" } else { "off" },
            if r.nccl { "NCCL, ZeRO-1" } else { "single GPU" },
            r.tokens_per_s,
            r.tokens_per_s / r.gpus as f64,
            r.scaling_efficiency.map_or("-".into(), |e| format!("{:.1}%", 100.0 * e)),
            r.step_ms_median,
            r.peak_gib,
            r.optimizer_gib,
            r.comm_ms.map_or("-".into(), |c| format!("{c:.1}")),
        );
    }
    s += "scaling = tokens/s on N GPUs / (N × tokens/s on 1); collect. ms: GPU time of one step's \
          collectives on the NCCL stream (partly overlapping the backward)\n";
    s
}

struct BenchResult {
    step_s: f64,
    peak_gib: f64,
    profile: Vec<(foxlm::backend::Family, f64, usize)>,
    comm_ms: Option<f64>,
    losses: Vec<f64>,
}

/// Times `a.steps` steps after `a.warmup` (the median), then profiles one. With `nccl` this is
/// one rank (its own random tokens) of a data-parallel step; the communicator is handed back
/// for the next row.
fn bench_one<T: cuda::Elem>(
    gpu: &std::sync::Arc<cuda::Gpu>,
    model: &mut foxlm::model::Model,
    a: &TrainArgs,
    plan: &foxlm::model::MemoryPlan,
    nccl: Option<cuda::nccl::Nccl>,
    rank: usize,
) -> Result<(BenchResult, Option<cuda::nccl::Nccl>)> {
    use foxlm::engine::Engine as _;
    let mem_used = || gpu.context().mem_get_info().map(|(f, t)| t - f).unwrap_or(0);
    let before = mem_used();
    let mut opt = foxlm::optim::AdamW::new(foxlm::presets::tiny().train.adamw(), &model.params);
    let mut eng =
        foxlm::engine::GpuEngine::<T>::new(gpu.clone(), model, &opt, a.batch, a.context, a.recompute, plan, nccl)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1 + rank as u64);
    let v = model.config.vocab_size as u32;
    let n = a.batch * a.context;
    let mut batch = || {
        let ids: Vec<u32> = (0..n).map(|_| rng.gen_range(0..v)).collect();
        let targets: Vec<Option<u32>> =
            (0..n).map(|i| if (i + 1) % a.context != 0 { Some(ids[i + 1]) } else { None }).collect();
        vec![foxlm::data::Batch { batch: a.batch, seq: a.context, ids, targets }]
    };
    let mut losses = Vec::new();
    for _ in 0..a.warmup {
        losses.push(eng.step_on(model, &mut opt, &batch(), a.batch, 1.0, 1e-4)?.loss);
    }
    let mut times = Vec::new();
    for _ in 0..a.steps.max(1) {
        let b = batch();
        gpu.sync()?;
        let t0 = Instant::now();
        losses.push(eng.step_on(model, &mut opt, &b, a.batch, 1.0, 1e-4)?.loss);
        gpu.sync()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    times.sort_by(|x, y| x.total_cmp(y));
    let step_s = times[times.len() / 2];
    let peak_gib = (mem_used().saturating_sub(before)) as f64 / (1u64 << 30) as f64;
    let b = batch();
    eng.backend_mut().start_profile();
    eng.backend_mut().start_comm_timing();
    eng.step_on(model, &mut opt, &b, a.batch, 1.0, 1e-4)?;
    let profile = eng.backend_mut().take_profile()?;
    let comm_ms = eng.backend_mut().take_comm_ms()?;
    let nccl = eng.backend_mut().zero.take().map(|z| z.nccl);
    Ok((BenchResult { step_s, peak_gib, profile, comm_ms, losses }, nccl))
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
                } else if eng.be.mega_ready() && b == 1 {
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
            if b == 1 && eng.be.mega_ready() {
                if let Some(p) = eng.be.mega_profile()? {
                    println!("{p}");
                }
            }
            rows.push(serde_json::json!({
                "preset": name, "batch": b, "prompt": a.prompt, "new_tokens": a.new_tokens, "graphs": !a.no_graphs, "fused": !a.unfused, "megakernel": b == 1 && eng.be.mega_ready(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::path::PathBuf;

    #[derive(Parser)]
    struct Top {
        #[command(subcommand)]
        cmd: TopCmd,
    }
    #[derive(clap::Subcommand)]
    enum TopCmd {
        Bench(Args),
    }

    fn parse(args: &[std::ffi::OsString]) -> TrainArgs {
        let argv = std::iter::once("foxlm".into()).chain(args.iter().cloned());
        let TopCmd::Bench(Args { what: What::Train(t) }) = Top::try_parse_from(argv).unwrap().cmd else {
            panic!("not bench train")
        };
        t
    }

    /// The processes of --gpus run the benchmark the user asked for, without --gpus and --json.
    #[test]
    fn child_args_carry_the_benchmark() {
        let argv: Vec<std::ffi::OsString> = [
            "bench",
            "train",
            "--gpus",
            "2,4",
            "--preset",
            "fox-pro-760m",
            "--batch",
            "1",
            "--context",
            "8192",
            "--acp",
            "off",
            "--steps",
            "5",
            "--warmup",
            "2",
            "--recompute",
            "--dtype",
            "f32",
            "--json",
            "x.json",
        ]
        .into_iter()
        .map(Into::into)
        .collect();
        let a = parse(&argv);
        assert_eq!(a.gpus, [2, 4]);
        let c = parse(&child_args(&a, std::path::Path::new("/tmp/r.json")));
        assert_eq!((c.gpus, c.json, c.report), (vec![], None, Some(PathBuf::from("/tmp/r.json"))));
        assert_eq!((c.preset.as_str(), c.batch, c.context, c.acp.as_str()), ("fox-pro-760m", 1, 8192, "off"));
        assert_eq!((c.steps, c.warmup, c.recompute, c.dtype), (5, 2, true, foxlm::backend::Dtype::F32));
    }

    /// The optimizer column: ZeRO-1 over 2 ranks keeps half of the moments and of the matrices'
    /// master weights, the vectors' master weights whole.
    #[test]
    fn optimizer_state_per_gpu_is_sharded() {
        use foxlm::backend::cuda::optimizer_state_bytes;
        let m = foxlm::model::Model::new(&foxlm::presets::Variant::FoxPro.config(64, 3, 2));
        let p = &m.params;
        let n = p.numel();
        let matrix: usize = p
            .tensors
            .iter()
            .zip(&p.kinds)
            .filter(|(_, k)| **k == foxlm::tensor::ParamKind::Matrix)
            .map(|(t, _)| t.numel())
            .sum();
        assert!(matrix > 0 && matrix < n);
        assert_eq!(optimizer_state_bytes(&m, 1), (4 * n, 8 * n));
        assert_eq!(optimizer_state_bytes(&m, 2), (4 * (matrix.div_ceil(2) + n - matrix), 8 * n.div_ceil(2)));
        let (a, b) = optimizer_state_bytes(&m, 4);
        assert_eq!(b, 8 * n.div_ceil(4));
        assert!(a > 4 * n / 4 && a < 4 * n / 2, "{a}");
    }

    fn row(gpus: usize, acp: bool, tps: f64) -> TrainRow {
        TrainRow {
            preset: "fox-pro-125m".into(),
            recompute: false,
            batch: 2,
            context: 16384,
            dtype: "bf16".into(),
            acp,
            gpus,
            nccl: gpus > 1,
            global_batch: 2 * gpus,
            tokens_per_s: tps,
            step_ms_median: 2.0 * 16384.0 * gpus as f64 / tps * 1e3,
            tflops_model: 0.0,
            peak_gib: 10.0,
            plan_gib: 9.0,
            optimizer_gib: 1.5 / gpus as f64,
            comm_ms: (gpus > 1).then_some(12.5),
            scaling_efficiency: None,
            losses: vec![],
            profile: vec![],
            gpu: "test".into(),
        }
    }

    #[test]
    fn scaling_efficiency_is_against_the_same_acp_row() {
        let one = [row(1, false, 100_000.0), row(1, true, 120_000.0)];
        let mut many = [row(2, false, 190_000.0), row(2, true, 180_000.0), row(4, false, 380_000.0)];
        add_scaling(&one, &mut many);
        assert_eq!(many[0].scaling_efficiency, Some(0.95));
        assert_eq!(many[1].scaling_efficiency, Some(0.75));
        assert_eq!(many[2].scaling_efficiency, Some(0.95));
        let t = scaling_table(&one, &many);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[1].starts_with("fox-pro-125m T=16384 bf16 B=2 per GPU (N GPUs: global batch N×2)"), "{t}");
        let cells: Vec<&str> = lines[5].split_whitespace().collect();
        assert_eq!(
            cells,
            ["2", "off", "NCCL,", "ZeRO-1", "190000", "95000", "95.0%", "344.9", "10.00", "0.750", "12.5"]
        );
        let cells: Vec<&str> = lines[7].split_whitespace().collect();
        assert_eq!(cells[..7], ["4", "off", "NCCL,", "ZeRO-1", "380000", "95000", "95.0%"]);
        let cells: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(cells, ["1", "off", "single", "GPU", "100000", "100000", "-", "327.7", "10.00", "1.500", "-"]);
        // A row survives the trip through a --report file.
        let back: Vec<TrainRow> = serde_json::from_str(&serde_json::to_string(&many).unwrap()).unwrap();
        assert_eq!(back[0].scaling_efficiency, Some(0.95));
        assert_eq!(back[1].comm_ms, Some(12.5));
    }
}
