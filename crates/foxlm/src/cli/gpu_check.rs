//! `foxlm gpu-check`: the whole model on the GPU against the CPU reference, as a pass/fail table
//! (the model-level part of bench/gpu_check.sh; the kernels' own checks are `fox-attn check`,
//! `check-ops` and `check-gemm`).

use anyhow::{bail, Result};
use fox_kernels::cuda::{check::format_table, Gpu};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The seven reference models (tests/fixtures/official-fox-tiny in the repository).
    #[arg(long, default_value = "tests/fixtures/official-fox-tiny")]
    pub fixtures: PathBuf,
    /// Text for the training checks (the Moby-Dick sample).
    #[arg(long, default_value = "data/sample/moby-dick")]
    pub sample: PathBuf,
    /// Scratch folder for the training checks' data and runs.
    #[arg(long, default_value = "runs/gpu-check")]
    pub work: PathBuf,
    /// Steps of the training comparison (0: skip the training checks).
    #[arg(long, default_value_t = 300)]
    pub train_steps: u64,
    /// Only the fixture checks, the inference checks, the serving checks (`foxlm serve` on the GPU),
    /// the training checks, or the data-parallel
    /// checks (dist: NCCL, `train --gpus 1` against one GPU; with two GPUs, 2 ranks against 1,
    /// resume 2 → 1, a killed rank). dist runs only when asked for.
    #[arg(long, value_parser = ["fixtures", "infer", "serve", "train", "dist"])]
    pub only: Option<String>,
    /// Steps of the data-parallel comparisons (--only dist).
    #[arg(long, default_value_t = 100)]
    pub dist_steps: u64,
    /// The family of the data-parallel checks' model (--only dist): a FoX (Pro), a Mamba-2 (heads
    /// of 64, state 128) or a Samba (attention heads of 64, window 64), each d = 128, 2 layers.
    #[arg(long, default_value = "fox", value_parser = ["fox", "mamba2", "samba"])]
    pub dist_model: String,
}

pub fn run(a: Args) -> Result<()> {
    let gpu = Gpu::new(0)?;
    eprintln!("device: {}", gpu.describe());
    let mut rows = Vec::new();
    let only = |what: &str| a.only.as_deref().is_none_or(|o| o == what);
    if only("fixtures") {
        rows.extend(crate::gpu_check::run_fixture_checks(&gpu, &a.fixtures)?);
    }
    if only("infer") {
        rows.extend(crate::gpu_check::infer::run_inference_checks(&gpu, &a.fixtures)?);
    }
    if only("serve") {
        rows.extend(crate::gpu_check::serve::run_serve_checks(&gpu, &a.fixtures, &a.work)?);
    }
    if only("train") && a.train_steps > 0 {
        rows.extend(crate::gpu_check::run_training_checks(&a.sample, &a.work, a.train_steps)?);
    }
    if a.only.as_deref() == Some("dist") {
        let data = crate::gpu_check::check_data(&a.sample, &a.work)?;
        let mut run = crate::gpu_check::check_run(a.dist_steps);
        run.model = match a.dist_model.as_str() {
            "mamba2" => crate::presets::mamba2_config(128, 2),
            "samba" => crate::presets::samba_config(128, 2, 2, 64),
            _ => run.model,
        };
        rows.extend(crate::gpu_check::dist::run_dist_checks(&data, &a.work, a.dist_steps, &run)?);
    }
    print!("{}", format_table(&rows));
    if rows.iter().any(|r| !r.pass) {
        bail!("{} GPU model check(s) failed", rows.iter().filter(|r| !r.pass).count());
    }
    Ok(())
}
