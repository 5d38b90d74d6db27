//! `foxlm bench train --gpus N`: the training step on one GPU, then as N ranks through NCCL, each
//! run a process of its own, and the scaling table.

use super::train::{bench_rows, TrainRow};
use anyhow::{bail, Context, Result};
use fox_kernels::cuda;
use foxlm::backend::DeviceArg;
use foxlm::cli::bench::TrainArgs;

/// A rank started by `--gpus`: the rendezvous and watchdog of `foxlm train`'s ranks, then the
/// rows through NCCL on GPU LOCAL_RANK; rank 0 alone prints and returns them.
pub(super) fn bench_rank(a: &TrainArgs) -> Result<Option<Vec<TrainRow>>> {
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
pub(super) fn scaling(a: &TrainArgs, counts: &[usize]) -> Result<Vec<TrainRow>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use foxlm::cli::bench::{Args, What};
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
