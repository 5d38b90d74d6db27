//! `foxlm bench gla`: HGRN2's gated linear attention kernels (kernels/gla.cu), forward and
//! forward + backward, through each set of kernels.

use anyhow::{bail, Result};
use fox_kernels::cuda;
use foxlm::backend::select_device;
use foxlm::cli::bench::GlaArgs;

/// `fox-attn bench-gla`'s timings: HGRN2's GLA at one shape, the walk (its width from
/// FOXLM_GLA_KB) and the tensor-core kernels on bf16, the CUDA-core ones on bf16 and f32.
pub(super) fn gla(a: GlaArgs) -> Result<()> {
    use fox_checks::gla_check::bench;
    let gpu = match select_device(a.device)? {
        cuda::Device::Cuda(g) => g,
        cuda::Device::Cpu => bail!("bench gla times GPU kernels: no GPU is usable here (see `fox-attn info`)"),
    };
    let [b, t, h, d] = a.shape[..] else { bail!("--shape takes B,T,H,D") };
    for (what, bf, run) in fox_checks::gla_check::BENCH_RUNS {
        let (fwd, fb, st) = if bf {
            bench::<half::bf16>(&gpu, (b, t, h, d), a.warmup, a.iters, run)?
        } else {
            bench::<f32>(&gpu, (b, t, h, d), a.warmup, a.iters, run)?
        };
        println!(
            "GLA on {}, [B, T, H, K = V] = ({b}, {t}, {h}, {d}), {what}: forward {fwd:.3} ms, forward + backward \
             {fb:.3} ms (medians of {}, CUDA events); forward kernels alone: cumsum {:.3}, states {:.3}, scores \
             {:.3}, output {:.3} ms",
            gpu.describe(),
            a.iters,
            st[0],
            st[1],
            st[2],
            st[3]
        );
    }
    Ok(())
}
