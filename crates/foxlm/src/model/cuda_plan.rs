//! What the CUDA backend needs to know of a model, and what it cannot run: the sizes it plans its
//! buffers by ([`CudaSizes`], [`Cuda::new`], [`Cuda::memory_plan`]), the layer shapes its kernels
//! do not take ([`unsupported`]) and so the device a model runs on ([`select_device_for`]).

use super::{Mixer, Model};
use crate::backend::cuda::{Cuda, CudaSizes};
use crate::backend::{select_device_with_dtype, DeviceArg, Dtype, MemoryPlan};
use crate::config::Arch;
use anyhow::{bail, Result};
use fox_kernels::cuda::{Device, Elem, Gpu};
use std::sync::Arc;

impl Model {
    /// The CUDA backend's sizes for a step of [batch, seq] tokens (training when `train`) with
    /// activations of type `T`.
    pub fn cuda_sizes<T: Elem>(&self, batch: usize, seq: usize, train: bool) -> CudaSizes {
        let cfg = &self.config;
        // Attention heads (Samba's are its attention layers', not a top-level num_heads).
        let heads = if cfg.arch() == Arch::Samba { cfg.samba_attn().0 } else { cfg.num_heads };
        let scratch = ssm_scratch_floats(self, batch, seq, train);
        let tb = std::mem::size_of::<T>();
        let scratch = super::deltanet::cuda::scratch_floats(self, batch, seq, train, tb, scratch);
        CudaSizes {
            batch,
            seq,
            train,
            heads,
            head_dim: cfg.head_dim(),
            has_attention: self.layers.iter().any(|b| b.attn().is_some()),
            vocab: cfg.vocab_size,
            hidden: cfg.hidden_size,
            head: self.lm_head.weight,
            scratch,
        }
    }
}

impl<T: Elem> Cuda<T> {
    /// Uploads the model's parameters and plans every buffer of a step on [batch, seq] tokens.
    pub fn new(gpu: Arc<Gpu>, model: &Model, batch: usize, seq: usize, train: bool) -> Result<Self> {
        Self::with_sizes(gpu, &model.params, &model.cuda_sizes::<T>(batch, seq, train))
    }

    /// [`Cuda::memory_plan_of`] for a step of [batch, seq] tokens of `model`.
    pub fn memory_plan(model: &Model, batch: usize, seq: usize, train: bool, world: usize, plan: &mut MemoryPlan) {
        Self::memory_plan_of(&model.params, &model.cuda_sizes::<T>(batch, seq, train), world, plan)
    }
}

/// Why the CUDA backend cannot run `model` (for training when `training`), if it cannot: a layer
/// whose sizes the CUDA kernels do not take.
pub fn unsupported(model: &Model, _training: bool) -> Option<String> {
    model.layers.iter().find_map(|blk| match &blk.mixer {
        Mixer::Attention(_) => None,
        Mixer::DeltaNet(l) => super::deltanet::cuda::unsupported(l.sizes()),
        Mixer::Hgrn2(l) => super::hgrn2::cuda::unsupported(l.sizes()),
        Mixer::Mamba2(l) => super::mamba2::cuda::unsupported(l.sizes()),
        Mixer::Mamba(l) => super::mamba::cuda::unsupported(l.sizes()),
    })
}

/// The device to run `model` on: as [`select_device_with_dtype`], and where the GPU backend
/// cannot run one of the model's layer families yet, the CPU for `auto` (with a note) and an
/// error naming the family for `cuda`.
pub fn select_device_for(model: &Model, arg: DeviceArg, dtype: Option<Dtype>) -> Result<Device> {
    let d = select_device_with_dtype(arg, dtype)?;
    match (d.is_cuda(), unsupported(model, false)) {
        (true, Some(why)) if arg == DeviceArg::Auto => {
            eprintln!("note: running on the CPU: {why}");
            if dtype == Some(Dtype::Bf16) {
                bail!("--dtype bf16 needs the GPU, which cannot run this model: {why}");
            }
            Ok(Device::Cpu)
        }
        (true, Some(why)) => bail!("--device {arg}: {why}"),
        _ => Ok(d),
    }
}

/// Floats of the CUDA backend's recurrent scratch (`big`, `small`) for a step of [batch, seq] (training when
/// `train`): the largest over the model's Mamba-2, HGRN2 and Mamba layers.
fn ssm_scratch_floats(model: &Model, batch: usize, seq: usize, train: bool) -> (usize, usize) {
    use fox_kernels::cuda::ssd;
    let rows = batch * seq;
    let mut out = (0, 0);
    for blk in &model.layers {
        if let Mixer::Mamba2(l) = &blk.mixer {
            let s = l.sizes();
            let shape = (batch, seq, s.heads, s.head_dim, s.state, s.groups);
            let big = if train {
                ssd::ssd_bwd_scratch_len(shape.0, shape.1, shape.2, shape.3, shape.4, shape.5)
            } else {
                ssd::ssd_fwd_scratch_len(shape.0, shape.1, shape.2, shape.3, shape.4, shape.5)
            };
            let small = if train {
                ssd::conv1d_bwd_scratch_len(batch, seq, s.conv_dim(), s.conv)
                    .max(ssd::rms_norm_gated_bwd_scratch_len(rows * s.groups, s.inner / s.groups))
                    .max(ssd::dt_bwd_scratch_len(rows, s.heads))
            } else {
                0
            };
            out = (out.0.max(big), out.1.max(small));
        }
        if let Mixer::Hgrn2(l) = &blk.mixer {
            // HGRN2's GLA (forward, or forward and backward) and its gates' and convolutions'
            // partial sums.
            use fox_kernels::cuda::gla;
            let s = l.sizes();
            let (h, k, d) = (s.heads, s.head_dim, s.heads * s.head_dim);
            let big = if train {
                gla::gla_bwd_scratch_len(batch, seq, h, k, k)
            } else {
                gla::gla_fwd_scratch_len(batch, seq, h, k, k)
            };
            let small = if train {
                let conv = s.conv.map_or(0, |w| ssd::conv1d_bwd_scratch_len(batch, seq, d, w));
                gla::hgrn2_gates_bwd_scratch_len(rows, d).max(conv)
            } else {
                0
            };
            out = (out.0.max(big), out.1.max(small));
        }
        if let Mixer::Mamba(l) = &blk.mixer {
            let s = l.sizes();
            if train {
                let big = fox_kernels::cuda::selective_scan::scratch_floats(batch, seq, s.inner, s.state);
                let small = ssd::conv1d_bwd_scratch_len(batch, seq, s.inner, s.conv)
                    .max(ssd::dt_bwd_scratch_len(rows, s.inner));
                out = (out.0.max(big), out.1.max(small));
            }
        }
    }
    out
}
