//! [`Dtype`]: the precision of a backend's activations (`--dtype`), for training and inference.

use anyhow::{bail, Result};
use std::fmt;
use std::str::FromStr;

/// Activation precision on the GPU (`--dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Dtype {
    /// bf16 activations and weight copies, fp32 master weights and optimizer state.
    #[default]
    Bf16,
    /// f32 throughout (to check the GPU against the CPU).
    F32,
}

impl FromStr for Dtype {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" => Ok(Self::Bf16),
            "f32" | "fp32" | "float32" => Ok(Self::F32),
            _ => bail!("unknown dtype `{s}`: expected bf16 or f32"),
        }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Bf16 => "bf16",
            Self::F32 => "f32",
        })
    }
}

impl Dtype {
    /// Refuses `--dtype bf16` for work that runs on the CPU, which computes in f32 only; `does`
    /// says what the CPU does ("runs", "trains").
    pub fn refuse_bf16_on_cpu(dtype: Option<Dtype>, does: &str) -> Result<()> {
        if dtype == Some(Dtype::Bf16) {
            bail!("--dtype bf16 needs a GPU (--device cuda): the CPU {does} in f32");
        }
        Ok(())
    }
}
