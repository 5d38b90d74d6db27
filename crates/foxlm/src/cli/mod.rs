//! One module per `foxlm` subcommand: its clap arguments and its `run`.

pub mod bench;
pub mod data;
pub mod demo;
pub mod eval;
pub mod eval_compare;
pub mod forward;
pub mod generate;
pub mod gpu_check;
pub mod inspect;
pub mod serve;
pub mod tokenizer;
pub mod train;
pub mod viz;

use crate::engine::Dtype;
use anyhow::{bail, Result};
use fox_kernels::cuda::{self, Device, DeviceArg};

/// `--device` and `--dtype` of the commands that run a trained model.
#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArgs {
    /// cpu, cuda, cuda:N, or auto (the GPU when there is one, else the CPU).
    #[arg(long, default_value = "auto")]
    pub device: DeviceArg,
    /// On a GPU: bf16 (default; fast) or f32 (the CPU reference's numbers within 1e-3). The CPU
    /// runs f32.
    #[arg(long)]
    pub dtype: Option<Dtype>,
}

impl DeviceArgs {
    /// The device to run on; bf16 on the CPU is refused.
    pub fn select(&self) -> Result<Device> {
        let d = cuda::select(self.device)?;
        if !d.is_cuda() && self.dtype == Some(Dtype::Bf16) {
            bail!("--dtype bf16 needs a GPU (--device cuda): the CPU runs in f32");
        }
        Ok(d)
    }

    /// The device to run `model` on: as [`DeviceArgs::select`], and where the GPU backend cannot
    /// run one of the model's layer families yet, the CPU for `auto` (with a note) and an error
    /// naming the family for `cuda`.
    pub fn select_for(&self, model: &crate::model::Model) -> Result<Device> {
        let d = self.select()?;
        match (d.is_cuda(), crate::backend::cuda::unsupported(model, false)) {
            (true, Some(why)) if self.device == DeviceArg::Auto => {
                eprintln!("note: running on the CPU: {why}");
                if self.dtype == Some(Dtype::Bf16) {
                    bail!("--dtype bf16 needs the GPU, which cannot run this model: {why}");
                }
                Ok(Device::Cpu)
            }
            (true, Some(why)) => bail!("--device {:?}: {why}", self.device),
            _ => Ok(d),
        }
    }
}
