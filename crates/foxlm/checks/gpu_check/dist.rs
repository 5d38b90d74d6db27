//! The data-parallel part of the GPU check (`foxlm gpu-check --only dist`, bench/gpu_check.sh
//! dist): NCCL collectives on known values, `foxlm train --gpus 1` (the distributed path: NCCL,
//! bucketed reduce-scatter, ZeRO-1, all-gather, the launcher and the rendezvous) against the
//! plain single-GPU run, and its checkpoints resumed on one GPU and on the CPU. With two GPUs or
//! more: 2 ranks against 1 with the same global batch, resume 2 → 1, and a killed rank stopping
//! the run. The checks that need two GPUs are skipped with a notice on one.

use super::{first_difference, row, train_losses as losses, worst_gap};
use anyhow::{anyhow, Context, Result};
use fox_checks::check::CheckRow;
use fox_kernels::cuda::nccl::{self, Nccl};
use fox_kernels::cuda::Gpu;
use foxlm::backend::DeviceArg;
use foxlm::train::{train, RunConfig, TrainOptions};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// NCCL on `world` GPUs (one thread per rank): each collective on values whose result is known.
fn collective_rows(world: usize) -> Result<Vec<CheckRow>> {
    let id = nccl::unique_id()?;
    let n = 3 * world * 1000 + 7;
    let results: Vec<Result<[f64; 3]>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..world)
            .map(|r| {
                let id = id.clone();
                s.spawn(move || -> Result<[f64; 3]> {
                    let gpu = Gpu::new(r)?;
                    let comm = Nccl::new(gpu.clone(), r, world, &id)?;
                    // All-reduce: rank r holds (r + 1)·i; the sum is i·w(w+1)/2.
                    let x: Vec<f32> = (0..n).map(|i| ((r + 1) * (i % 97)) as f32).collect();
                    let mut b = gpu.upload(&x)?;
                    comm.after()?;
                    comm.all_reduce_sum(&mut b, n)?;
                    comm.sync()?;
                    let got = gpu.download(&b)?;
                    let tri = (world * (world + 1) / 2) as f32;
                    let e1 = got.iter().enumerate().map(|(i, v)| (v - (i % 97) as f32 * tri).abs()).fold(0.0, f32::max);
                    // Reduce-scatter: the same values; this rank's shard of the sum.
                    let shard = n / world;
                    let mut b = gpu.upload(&x)?;
                    comm.after()?;
                    comm.reduce_scatter_sum(&mut b, shard)?;
                    comm.sync()?;
                    let got = gpu.download(&b)?;
                    let e2 = (r * shard..(r + 1) * shard)
                        .map(|i| (got[i] - (i % 97) as f32 * tri).abs())
                        .fold(0.0, f32::max);
                    // All-gather of bf16: rank r's shard holds 16·r + j, integers below 256 and so
                    // exact in bf16 up to 16 ranks (r·1000 + j was not: bf16 steps by 4 near 1000,
                    // which the first two-GPU run read as an error of 2).
                    let vals: Vec<half::bf16> = (0..world * 8)
                        .map(|i| half::bf16::from_f32(if i / 8 == r { (16 * r + i % 8) as f32 } else { -1.0 }))
                        .collect();
                    let mut b = gpu.upload(&vals)?;
                    comm.after()?;
                    comm.all_gather(&mut b, 8)?;
                    comm.sync()?;
                    let got = gpu.download(&b)?;
                    let e3 = got
                        .iter()
                        .enumerate()
                        .map(|(i, v)| (v.to_f32() - (16 * (i / 8) + i % 8) as f32).abs())
                        .fold(0.0, f32::max);
                    Ok([e1 as f64, e2 as f64, e3 as f64])
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a rank thread panicked")))).collect()
    });
    let mut worst = [0.0f64; 3];
    for r in results {
        let e = r?;
        for k in 0..3 {
            worst[k] = worst[k].max(e[k]);
        }
    }
    let case = format!("NCCL, {world} rank{} ({n} values)", if world == 1 { "" } else { "s" });
    Ok(vec![
        row(case.clone(), "all-reduce f32: max |Δ| vs known sum", worst[0], 0.0, String::new()),
        row(case.clone(), "reduce-scatter f32: max |Δ| vs known sum", worst[1], 0.0, String::new()),
        row(case, "all-gather bf16: max |Δ| vs known shards", worst[2], 0.0, String::new()),
    ])
}

/// `foxlm train --gpus N` (this binary) on `run`, into `out`; Err with its stderr if it fails.
fn launch(exe: &Path, gpus: usize, config: &Path, data: &Path, out: &Path, extra: &[&str]) -> Result<()> {
    let o = Command::new(exe)
        .args(["train", "--quiet", "--gpus", &gpus.to_string(), "--config"])
        .arg(config)
        .arg("--data")
        .arg(data)
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    if !o.status.success() {
        return Err(anyhow!("foxlm train --gpus {gpus} failed: {}", String::from_utf8_lossy(&o.stderr).trim()));
    }
    Ok(())
}

fn weights(dir: &Path) -> Result<Vec<u8>> {
    std::fs::read(dir.join(foxlm::checkpoint::WEIGHTS_FILE)).with_context(|| format!("reading {}", dir.display()))
}

/// The data-parallel checks; `data` is a prepared dataset, `work` a scratch folder.
pub fn run_dist_checks(data: &Path, work: &Path, steps: u64, run: &RunConfig) -> Result<Vec<CheckRow>> {
    let gpus = fox_kernels::cuda::probe()?;
    let exe = std::env::current_exe().context("finding the foxlm binary")?;
    let mut rows = vec![row("NCCL".into(), "libnccl loads", 0.0, 0.0, format!("version {}", nccl::version()?))];
    rows.extend(collective_rows(1)?);
    if gpus >= 2 {
        rows.extend(collective_rows(gpus)?);
    }
    let mut run = dist_run(run, gpus.clamp(1, 2))?;
    run.train.total_tokens = steps * run.train.tokens_per_step();
    run.train.log_every = 1;
    let config = work.join("dist-run.json");
    std::fs::write(&config, serde_json::to_string_pretty(&run)?)
        .with_context(|| format!("writing {}", config.display()))?;
    let dir = |d: &str| work.join(d);
    for d in ["dist-plain", "dist-whole", "dist-1", "dist-1-stop", "dist-1-cpu", "dist-2", "dist-2-stop", "dist-kill"] {
        let _ = std::fs::remove_dir_all(dir(d));
    }
    let opts = |out: &str, device: DeviceArg| TrainOptions::new(data, dir(out), device);
    // One rank through NCCL against the plain single-GPU trainer: the same arithmetic.
    let t0 = Instant::now();
    train(Some(run.clone()), &opts("dist-plain", DeviceArg::Cuda(0)))?;
    let t_plain = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    launch(&exe, 1, &config, data, &dir("dist-1"), &[])?;
    let t_one = t0.elapsed().as_secs_f64();
    let (plain, one) = (losses(&dir("dist-plain")), losses(&dir("dist-1")));
    let gap = worst_gap(&plain, &one, 0);
    rows.push(row(
        format!("--gpus 1 vs single GPU, {steps} steps (bf16)"),
        "max |Δ| train loss over the steps",
        gap,
        0.0,
        format!("{} steps logged; {t_one:.0} s vs {t_plain:.0} s", one.len()),
    ));
    let same = weights(&dir("dist-plain/final"))? == weights(&dir("dist-1/final"))?;
    rows.push(row(
        format!("--gpus 1 vs single GPU, {steps} steps (bf16)"),
        "final weights differ (0 = bitwise equal)",
        if same { 0.0 } else { 1.0 },
        0.0,
        String::new(),
    ));
    // A checkpoint of the distributed path resumes on one GPU (bitwise) and on the CPU.
    let half = steps / 2;
    launch(&exe, 1, &config, data, &dir("dist-1-stop"), &["--stop-after", &half.to_string()])?;
    super::copy_dir(&dir("dist-1-stop"), &dir("dist-1-cpu"))?;
    train(Some(run.clone()), &TrainOptions { resume: true, ..opts("dist-1-stop", DeviceArg::Cuda(0)) })?;
    let gap = worst_gap(&plain, &losses(&dir("dist-1-stop")), half);
    rows.push(row(
        format!("--gpus 1 checkpoint at step {half} resumed on 1 GPU"),
        "max |Δ| loss vs uninterrupted, later steps",
        gap,
        0.0,
        String::new(),
    ));
    let r = train(Some(run.clone()), &TrainOptions { resume: true, ..opts("dist-1-cpu", DeviceArg::Cpu) });
    let err = match (&r, plain.last(), losses(&dir("dist-1-cpu")).last()) {
        (Ok(_), Some((_, a)), Some((_, b))) => (a - b).abs(),
        _ => f64::INFINITY,
    };
    rows.push(row(
        format!("--gpus 1 checkpoint at step {half} resumed on the CPU"),
        "final loss |Δ| vs the GPU run",
        err,
        0.05,
        r.err().map_or(String::new(), |e| format!("{e:#}")),
    ));
    if gpus < 2 {
        eprintln!(
            "notice: this machine has {gpus} GPU: skipped the checks that need two (2 ranks vs 1, resume 2 → 1, \
             a killed rank); run bench/gpu_check.sh dist on a machine with two GPUs"
        );
        return Ok(rows);
    }
    // Two ranks against one with the same global batch: the same windows; the gradients are
    // summed in another order (two ranks' fp32 sums), which bf16 weights carry on. How far another
    // order alone takes the losses is measured on one GPU: the same steps with the global batch
    // as one micro-batch instead of two. A run that fails is a failed row with its message, so
    // the rows before it are still printed.
    let mut whole = run.clone();
    whole.train.micro_batch = whole.train.batch_size;
    train(Some(whole), &opts("dist-whole", DeviceArg::Cuda(0)))?;
    let floor = worst_gap(&plain, &losses(&dir("dist-whole")), 0);
    let case = format!("--gpus 2 vs single GPU, {steps} steps (bf16)");
    let metric = "max |Δ| train loss over the steps";
    if let Err(e) = launch(&exe, 2, &config, data, &dir("dist-2"), &[]) {
        rows.push(row(case, metric, f64::INFINITY, 2e-2, format!("{e:#}")));
        return Ok(rows);
    }
    let two = losses(&dir("dist-2"));
    let first = first_difference(&plain, &two)
        .map_or("the same losses".to_string(), |(s, d)| format!("first differs at step {s} by {d:.1e}"));
    // A reduction that dropped or double-counted a gradient moves the very first updates; a
    // summation order moves them by rounding only.
    let early = EARLY_STEPS.min(steps);
    let head: Vec<(u64, f64)> = plain.iter().copied().filter(|(s, _)| *s <= early).collect();
    rows.push(row(
        format!("--gpus 2 vs single GPU, first {early} steps (bf16)"),
        metric,
        worst_gap(&head, &two, 0),
        1e-3,
        format!("{} steps logged; {first}", two.len()),
    ));
    rows.push(row(
        case,
        metric,
        worst_gap(&plain, &two, 0),
        (2.0 * floor).max(2e-2),
        format!("tolerance: 2e-2 or twice one GPU's own gap under another summation order (one micro-batch of {} instead of two), {floor:.1e}", run.train.batch_size),
    ));
    let case = format!("--gpus 2 checkpoint at step {half} resumed on 1 GPU");
    let metric = "max |Δ| loss vs 2 ranks uninterrupted, later steps";
    let resumed =
        launch(&exe, 2, &config, data, &dir("dist-2-stop"), &["--stop-after", &half.to_string()]).and_then(|_| {
            train(Some(run.clone()), &TrainOptions { resume: true, ..opts("dist-2-stop", DeviceArg::Cuda(0)) })
        });
    match resumed {
        Ok(_) => rows.push(row(case, metric, worst_gap(&two, &losses(&dir("dist-2-stop")), half), 2e-2, String::new())),
        Err(e) => rows.push(row(case, metric, f64::INFINITY, 2e-2, format!("{e:#}"))),
    }
    rows.push(kill_row(&exe, &config, data, &dir("dist-kill"))?);
    Ok(rows)
}

/// The steps over which 2 ranks must follow one GPU to rounding (1e-3), before a summation
/// order's rounding has had time to grow through the bf16 weights.
const EARLY_STEPS: u64 = 5;

/// The check's run for a world of up to `world` ranks: the same global batch in micro-batches
/// that split evenly over the ranks (the tiny preset's one micro-batch of 8 becomes two of 4,
/// so the single-GPU runs accumulate and each of two ranks takes one).
fn dist_run(run: &RunConfig, world: usize) -> Result<RunConfig> {
    let mut run = run.clone();
    let b = run.train.batch_size;
    let accum = b / run.train.micro_batch;
    if !accum.is_multiple_of(world) {
        if !b.is_multiple_of(world) {
            return Err(anyhow!("the check's batch of {b} sequences cannot be split over {world} ranks"));
        }
        run.train.micro_batch = b / world;
    }
    Ok(run)
}

/// Starts a long 2-rank run, kills rank 1 with SIGKILL once training is under way, and checks
/// that the launcher ends within a minute naming rank 1.
fn kill_row(exe: &Path, config: &Path, data: &Path, out: &Path) -> Result<CheckRow> {
    let mut child = Command::new(exe)
        .args(["train", "--quiet", "--gpus", "2", "--steps", "100000", "--config"])
        .arg(config)
        .arg("--data")
        .arg(data)
        .arg("--out")
        .arg(out)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("starting foxlm train --gpus 2")?;
    let case = "kill rank 1 of 2 (SIGKILL) during training".to_string();
    // Wait for training to be under way (rank 0 logs steps).
    let t0 = Instant::now();
    while losses(out).len() < 3 && t0.elapsed() < Duration::from_secs(300) {
        std::thread::sleep(Duration::from_millis(200));
    }
    let rank1 = children(child.id()).into_iter().find(|&p| environ_has(p, "RANK=1"));
    let Some(pid) = rank1 else {
        let _ = child.kill();
        return Ok(row(case, "seconds until every rank stopped", f64::INFINITY, 60.0, "rank 1 not found".into()));
    };
    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    let t_kill = Instant::now();
    let mut stopped = None;
    while t_kill.elapsed() < Duration::from_secs(120) {
        if let Some(s) = child.try_wait()? {
            stopped = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let secs = t_kill.elapsed().as_secs_f64();
    if stopped.is_none() {
        let _ = child.kill();
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    let named = err.contains("rank 1 of 2 failed") && err.contains("signal 9");
    let ok = stopped.is_some_and(|s| !s.success()) && named;
    let last = err.lines().rev().find(|l| l.contains("failed")).unwrap_or("").trim().to_string();
    Ok(row(case, "seconds until every rank stopped", if ok { secs } else { f64::INFINITY }, 60.0, last))
}

/// Child process ids of `pid` (Linux /proc).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn environ_has(pid: u32, var: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|e| e.split(|&b| b == 0).any(|v| v == var.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use foxlm::distributed::StepSlice;

    #[test]
    fn dist_run_splits_the_same_global_batch_over_two_ranks() {
        let base = super::super::check_run(100);
        assert_eq!((base.train.batch_size, base.train.micro_batch), (8, 8));
        for world in [1, 2] {
            let run = dist_run(&base, world).unwrap();
            assert_eq!(run.train.batch_size, 8);
            assert_eq!(run.train.tokens_per_step(), base.train.tokens_per_step());
            let accum = run.train.batch_size / run.train.micro_batch;
            for rank in 0..world {
                assert!(StepSlice::new(run.train.micro_batch, accum, rank, world).is_ok(), "world {world}");
            }
        }
        assert_eq!(dist_run(&base, 2).unwrap().train.micro_batch, 4);
        // The unchanged configuration (one micro-batch of 8) does not split over two ranks.
        assert!(StepSlice::new(8, 1, 0, 2).is_err());
    }
}
