//! The trainer (SPEC §3): seeded N(0, 0.02) initialisation, AdamW on token windows with gradient
//! accumulation and global-norm clipping, a token-indexed warm-up + cosine schedule, periodic
//! validation, JSONL metrics, a loss-curve PNG, and resumable checkpoints.
//!
//! Output folder layout:
//!
//! ```text
//! OUT/run.json                 the model and training configuration ({"model": .., "train": ..})
//! OUT/metrics.jsonl            one JSON object per logged step ("train") and per validation ("val")
//! OUT/loss.png                 training and validation loss against tokens seen
//! OUT/checkpoint-<step>/       config.json + model.safetensors (the authors' layout, loadable by
//!                              their PyTorch code), optimizer.safetensors (AdamW moments),
//!                              trainer.json (step, tokens, data position, config hash, ...)
//! OUT/final/                   the same, written when training completes
//! OUT/latest                   the name of the newest complete checkpoint folder
//! ```
//!
//! Every checkpoint is written into `<name>.tmp/`, each file synced, then renamed into place, and
//! only then does `latest` (itself replaced atomically) point at it: a crash or a full disk never
//! damages the last good checkpoint. The last `keep_last` numbered checkpoints are kept.

pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const TRAINER_FILE: &str = "trainer.json";
pub const RUN_FILE: &str = "run.json";
pub const METRICS_FILE: &str = "metrics.jsonl";
pub const LOSS_PLOT_FILE: &str = "loss.png";
pub const LATEST_FILE: &str = "latest";
pub const FINAL_DIR: &str = "final";
/// The key of config.json that records the training context length (see Config::train_context).
pub const TRAIN_CONTEXT_KEY: &str = "foxlm_train_context";

mod checkpoints;
mod config;
mod init;
mod metrics;
mod run;

/// The validation loss is the engines' (the CPU engine computes it; the GPU engine its own way).
pub use crate::engine::{sum_loss, validation_loss};
pub use checkpoints::*;
pub use config::*;
pub use init::*;
pub use metrics::*;
pub use run::*;
