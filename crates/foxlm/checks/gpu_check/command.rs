//! `foxlm gpu-check`: the whole model on the GPU against the CPU reference, as a pass/fail table
//! (the flags are [`foxlm::cli::gpu_check::Args`]).

use anyhow::{bail, Result};
use fox_checks::check::format_table;
use fox_kernels::cuda::Gpu;
use foxlm::cli::gpu_check::Args;

pub fn run(a: Args) -> Result<()> {
    let gpu = Gpu::new(0)?;
    eprintln!("device: {}", gpu.describe());
    let mut rows = Vec::new();
    let only = |what: &str| a.only.as_deref().is_none_or(|o| o == what);
    if only("fixtures") {
        rows.extend(super::run_fixture_checks(&gpu, &a.fixtures, a.models.as_deref())?);
    }
    if only("infer") {
        rows.extend(super::infer::run_inference_checks(&gpu, &a.fixtures, a.models.as_deref())?);
    }
    if only("serve") {
        rows.extend(super::serve::run_serve_checks(&gpu, &a.fixtures, &a.work, a.models.as_deref())?);
    }
    if only("train") && a.train_steps > 0 {
        rows.extend(super::run_training_checks(&a.sample, &a.work, a.train_steps)?);
    }
    if a.only.as_deref() == Some("hgrn2") {
        rows.extend(super::hgrn2::rows(&gpu, &a.fixtures)?);
    }
    if a.only.as_deref() == Some("dist") {
        let data = super::check_data(&a.sample, &a.work)?;
        let mut run = super::check_run(a.dist_steps);
        run.model = match a.dist_model.as_str() {
            "mamba2" => foxlm::presets::mamba2_config(128, 2),
            "samba" => foxlm::presets::samba_config(128, 2, 2, 64),
            "deltanet" => foxlm::presets::deltanet_config(128, 2, 2, false),
            "gated-deltanet" => foxlm::presets::deltanet_config(128, 2, 2, true),
            "hgrn2" => foxlm::presets::hgrn2_config(128, 2, 64),
            _ => run.model,
        };
        rows.extend(super::dist::run_dist_checks(&data, &a.work, a.dist_steps, &run)?);
    }
    print!("{}", format_table(&rows));
    if rows.iter().any(|r| !r.pass) {
        bail!("{} GPU model check(s) failed", rows.iter().filter(|r| !r.pass).count());
    }
    Ok(())
}
