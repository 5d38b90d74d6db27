//! `foxlm bench attention`: Forgetting Attention's TFLOP/s on the GPU (the kernel benchmark of
//! fox-checks), or the CPU kernel's when there is no GPU.

use anyhow::Result;
use fox_checks::bench::BenchOpts;
use fox_kernels::cuda;
use foxlm::backend::{select_device, DeviceArg};
use foxlm::cli::bench::AttentionArgs;

pub(super) fn attention(a: AttentionArgs) -> Result<()> {
    let dev = select_device(a.device)?;
    eprintln!("device: {}", dev.describe());
    if let cuda::Device::Cuda(_) = dev {
        let ordinal = match a.device {
            DeviceArg::Cuda(n) => n,
            _ => 0,
        };
        let opts = BenchOpts {
            head_dims: a.d,
            seq_lens: a.t,
            tokens: a.tokens.unwrap_or(32768),
            hidden: a.hidden,
            warmup: a.warmup,
            iters: a.iters,
            backward: !a.fwd_only,
            sdpa: !a.no_sdpa,
            fox_refs: !a.no_fox_refs,
            bundle: a.bundle,
            python: a.python,
            json: a.json,
            seed: a.seed,
            device: ordinal,
            ..BenchOpts::default()
        };
        let report = fox_checks::bench::run_attention_bench(&opts)?;
        println!("{}", report.table());
        return Ok(());
    }
    if a.device == DeviceArg::Auto {
        if let Err(e) = cuda::probe() {
            eprintln!("no GPU ({e:#}); timing the CPU reference instead");
        }
    }
    super::cpu_attention::cpu_bench(&a)
}
