//! The flags of `foxlm gpu-check`; the checks themselves (the whole model on the GPU against the
//! CPU reference, as a pass/fail table) are beside the library, in crates/foxlm/checks/gpu_check/.

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
    /// resume 2 → 1, a killed rank). dist runs only when asked for; so does hgrn2 (HGRN2's kernel
    /// rows, then the fixture and inference rows of the HGRN2 models alone).
    #[arg(long, value_parser = ["fixtures", "infer", "serve", "train", "dist", "hgrn2"])]
    pub only: Option<String>,
    /// Steps of the data-parallel comparisons (--only dist).
    #[arg(long, default_value_t = 100)]
    pub dist_steps: u64,
    /// The family of the data-parallel checks' model (--only dist): a FoX (Pro), a Mamba-2 (heads
    /// of 64, state 128), a Samba (attention heads of 64, window 64), a DeltaNet or Gated DeltaNet
    /// (heads of 64) or an HGRN2 (heads of 64), each d = 128, 2 layers.
    #[arg(long, default_value = "fox", value_parser = ["fox", "mamba2", "samba", "deltanet", "gated-deltanet", "hgrn2"])]
    pub dist_model: String,
    /// Only the models whose check name contains this text (the fixture, inference and serving
    /// checks; e.g. `deltanet`); the sampler's and head-dim-64 rows run only without it.
    #[arg(long)]
    pub models: Option<String>,
}
