//! `--device`: what the user asked for ([`DeviceArg`]) and the device it resolves to
//! ([`select_device`]; a [`Device`] is the CPU or one GPU of the kernel crate), for a run in a
//! given `--dtype` (for a given model: `model::cuda_plan::select_device_for`).

use super::Dtype;
use anyhow::{bail, Context, Result};
use fox_kernels::cuda::{Device, Gpu};
use std::fmt;
use std::str::FromStr;

/// What the user asked for with `--device`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceArg {
    Cpu,
    /// A CUDA GPU by ordinal (`cuda` is `cuda:0`).
    Cuda(usize),
    /// The first CUDA GPU if one is usable, else the CPU.
    #[default]
    Auto,
}

impl FromStr for DeviceArg {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(Self::Cpu),
            "auto" => Ok(Self::Auto),
            "cuda" | "gpu" => Ok(Self::Cuda(0)),
            other => {
                if let Some(n) = other.strip_prefix("cuda:") {
                    Ok(Self::Cuda(n.parse().with_context(|| format!("bad GPU ordinal in `{s}`"))?))
                } else {
                    bail!("unknown device `{s}`: expected cpu, cuda, cuda:N or auto")
                }
            }
        }
    }
}

impl fmt::Display for DeviceArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => write!(f, "cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
            Self::Auto => write!(f, "auto"),
        }
    }
}

/// Resolve `--device`: `cpu` never touches CUDA; `cuda` fails with the reason when no usable GPU
/// is there; `auto` falls back to the CPU (the reason is in [`fox_kernels::cuda::probe`]).
pub fn select_device(arg: DeviceArg) -> Result<Device> {
    match arg {
        DeviceArg::Cpu => Ok(Device::Cpu),
        DeviceArg::Cuda(n) => Ok(Device::Cuda(
            Gpu::new(n).with_context(|| format!("--device cuda:{n} was asked for but cannot be used"))?,
        )),
        DeviceArg::Auto => match Gpu::new(0) {
            Ok(g) => Ok(Device::Cuda(g)),
            Err(_) => Ok(Device::Cpu),
        },
    }
}

/// The device to run on in `dtype` (`--dtype`): as [`select_device`], with bf16 on the CPU
/// refused.
pub fn select_device_with_dtype(arg: DeviceArg, dtype: Option<Dtype>) -> Result<Device> {
    let d = select_device(arg)?;
    if !d.is_cuda() {
        Dtype::refuse_bf16_on_cpu(dtype, "runs")?;
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_selection_errors_are_clear() {
        assert_eq!("cpu".parse::<DeviceArg>().unwrap(), DeviceArg::Cpu);
        assert_eq!("cuda:1".parse::<DeviceArg>().unwrap(), DeviceArg::Cuda(1));
        assert!("tpu".parse::<DeviceArg>().is_err());
        assert!(!select_device(DeviceArg::Cpu).unwrap().is_cuda());
        // auto never fails; cuda fails with a reason when no GPU is usable
        let auto = select_device(DeviceArg::Auto).unwrap();
        if !auto.is_cuda() {
            let err = select_device(DeviceArg::Cuda(0)).err().expect("cuda must fail without a GPU");
            assert!(format!("{err:#}").contains("cannot be used"), "{err:#}");
        }
        // a GPU that does not exist
        if let Ok(n) = fox_kernels::cuda::probe() {
            assert!(select_device(DeviceArg::Cuda(n + 3)).is_err());
        }
    }
}
