//! `foxlm bench train`: a training step's tokens/s, TFLOP/s, memory and where its time goes, on
//! one GPU (or, with `--device cpu`, the CPU engine's step); over several GPUs see [`super::scaling`].

use super::scaling::{bench_rank, scaling};
use crate::checks::cpu_bench;
use anyhow::{bail, Context, Result};
use fox_kernels::cuda;
use foxlm::backend::{select_device, DeviceArg};
use foxlm::cli::bench::TrainArgs;
use rand::{Rng, SeedableRng};
use std::time::Instant;

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
                let keys = cpu_bench::mean_keys(context, l.window);
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
pub(super) struct TrainRow {
    pub(super) preset: String,
    pub(super) recompute: bool,
    /// Sequences per step on each GPU.
    pub(super) batch: usize,
    pub(super) context: usize,
    pub(super) dtype: String,
    pub(super) acp: bool,
    /// GPUs (ranks) of the step; `nccl`: through the data-parallel engine.
    pub(super) gpus: usize,
    pub(super) nccl: bool,
    /// Sequences per optimizer step over all GPUs.
    pub(super) global_batch: usize,
    /// Over all GPUs.
    pub(super) tokens_per_s: f64,
    pub(super) step_ms_median: f64,
    /// Per GPU.
    pub(super) tflops_model: f64,
    pub(super) peak_gib: f64,
    pub(super) plan_gib: f64,
    /// fp32 master weights and AdamW moments that each GPU holds (the memory plan's).
    pub(super) optimizer_gib: f64,
    /// GPU time on the NCCL stream during the profiled step (partly overlapping the backward).
    pub(super) comm_ms: Option<f64>,
    /// tokens/s on `gpus` GPUs / (gpus × tokens/s on one), in the rows of `--gpus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) scaling_efficiency: Option<f64>,
    pub(super) losses: Vec<f64>,
    pub(super) profile: Vec<ProfileRow>,
    pub(super) gpu: String,
}

#[derive(serde::Serialize, serde::Deserialize, Clone, Debug)]
pub(super) struct ProfileRow {
    family: String,
    ms: f64,
    ops: usize,
}

pub(super) fn train_bench(a: TrainArgs) -> Result<()> {
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
    let row = cpu_bench::measure(&a.preset, &preset.model, a.batch, a.context, a.warmup, a.steps, &mut refs, true)?;
    print!("{}", cpu_bench::table(std::slice::from_ref(&row)));
    print!("{}", cpu_bench::breakdown(&row));
    if let Some(j) = &a.json {
        std::fs::write(j, serde_json::to_string_pretty(&[row])?).with_context(|| format!("--json {}", j.display()))?;
    }
    Ok(())
}

/// The rows of `a` on `gpu`: one GPU, or one rank of a data-parallel run through `nccl`; `talk`:
/// print them (rank 0).
pub(super) fn bench_rows(
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
        let plan = memory_plan(&model, a.step(), a.dtype, world)?;
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
        let (master, moments) = foxlm::backend::cuda::optimizer_state_bytes(&model.params, world);
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
    let mut eng = foxlm::engine::GpuEngine::<T>::new(gpu.clone(), model, &opt, a.step(), plan, nccl)?;
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

#[cfg(test)]
mod tests {
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
        assert_eq!(optimizer_state_bytes(&m.params, 1), (4 * n, 8 * n));
        assert_eq!(optimizer_state_bytes(&m.params, 2), (4 * (matrix.div_ceil(2) + n - matrix), 8 * n.div_ceil(2)));
        let (a, b) = optimizer_state_bytes(&m.params, 4);
        assert_eq!(b, 8 * n.div_ceil(4));
        assert!(a > 4 * n / 4 && a < 4 * n / 2, "{a}");
    }
}
