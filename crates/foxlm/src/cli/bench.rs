//! The flags of `foxlm bench` (attention, gla, train, decode, serve); the benchmarks themselves are beside the
//! library, in crates/foxlm/checks/bench/.

use crate::backend::DeviceArg;

use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub what: What,
}

#[derive(clap::Subcommand, Debug)]
pub enum What {
    /// Forgetting Attention forward and forward+backward TFLOP/s (causal work: fwd 2·B·H·T²·D,
    /// fwd+bwd 3.5× that), gates "mixed", ACP off and on.
    Attention(AttentionArgs),
    /// A training step of a model on the GPU: tokens/s, step time, achieved TFLOP/s, peak memory
    /// and where the time goes (GEMMs, attention, output head, optimizer, the rest), ACP off and on.
    /// With --device cpu: the CPU engine's f32 step against the gemm crate's peak, and where its
    /// time goes.
    Train(TrainArgs),
    /// Generation on the GPU: prefill tokens/s, then decode tokens/s (batch 1 and batched) after a
    /// long prompt, with random weights, next to the GPU's memory-bandwidth roofline; and where a
    /// decode step's time goes (kernels per token, GPU time per kernel family, launch gaps).
    Decode(DecodeArgs),
    /// HGRN2's gated linear attention (kernels/gla.cu), forward and forward + backward, through
    /// tensor cores (version 2, bf16) and the CUDA cores (version 1, bf16 and f32): milliseconds.
    Gla(GlaArgs),
    /// `foxlm serve` under load: N concurrent streaming clients for a fixed time; requests/s,
    /// generated tokens/s, time to first token and inter-token latency (p50/p99), errors, peak memory.
    Serve(crate::cli::serve::BenchArgs),
}

#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// The model (a preset's; the training recipe is not used): e.g. fox-pro-125m, transformer-pro-760m.
    #[arg(long, default_value = "fox-pro-125m")]
    pub preset: String,
    #[arg(long, default_value_t = 16384)]
    pub context: usize,
    /// Sequences per step (one micro-batch).
    #[arg(long, default_value_t = 2)]
    pub batch: usize,
    /// cuda, cuda:N, auto (a GPU) or cpu (the CPU engine's f32 step against the gemm crate's
    /// peak; choose a small --context and --batch there).
    #[arg(long, default_value = "auto")]
    pub device: DeviceArg,
    #[arg(long, default_value = "bf16")]
    pub dtype: crate::backend::Dtype,
    /// Adaptive computation pruning: off, on, or both (two rows).
    #[arg(long, default_value = "both", value_parser = ["off", "on", "both"])]
    pub acp: String,
    /// Recompute each block in the backward (keep only block inputs).
    #[arg(long)]
    pub recompute: bool,
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    #[arg(long, default_value_t = 10)]
    pub steps: usize,
    /// Also write the rows as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Scaling over N GPUs of this machine: the benchmark on one GPU (the single-GPU engine),
    /// then as N ranks through NCCL (gradient buckets reduced during the backward, ZeRO-1), each
    /// rank with --batch sequences, so the N-GPU step's global batch is N × --batch. Prints
    /// tokens/s, scaling efficiency, memory and optimizer state per GPU. `--gpus 1` runs a
    /// world of one rank through NCCL. Several counts (`--gpus 2,4`) share the one 1-GPU run
    /// and go in the order given.
    #[arg(long, value_name = "N", value_delimiter = ',')]
    pub gpus: Vec<usize>,
    /// Where a process started by --gpus leaves its rows for the launcher (internal).
    #[arg(long, hide = true)]
    pub report: Option<PathBuf>,
}

impl TrainArgs {
    /// The benchmarked step's shape.
    pub fn step(&self) -> crate::engine::StepShape {
        crate::engine::StepShape { micro: self.batch, context: self.context, recompute: self.recompute }
    }
}

#[derive(clap::Args, Debug)]
pub struct DecodeArgs {
    /// Models (presets' shapes, random weights), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "fox-pro-125m")]
    pub preset: Vec<String>,
    /// Prompt tokens per row.
    #[arg(long, default_value_t = 2048)]
    pub prompt: usize,
    /// New tokens per row (greedy; end-of-text does not stop it).
    #[arg(long, default_value_t = 128)]
    pub new_tokens: usize,
    /// Batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    pub batch: Vec<usize>,
    /// cuda, cuda:N or auto.
    #[arg(long, default_value = "auto")]
    pub device: DeviceArg,
    /// Decode without CUDA graphs (every operation launched from the host).
    #[arg(long)]
    pub no_graphs: bool,
    /// Decode op by op (cuBLASLt GEMMs, no fused kernels): what the fused step is compared with.
    #[arg(long)]
    pub unfused: bool,
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Timed generations; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Also time scoring (what `serve` runs for `max_tokens: 0` with echo and logprobs): one
    /// forward of the prompts without a cache and every position's log-probability, on this
    /// benchmark's plan and on the server's default plan (64 slots), with per-family profiles.
    #[arg(long)]
    pub score: bool,
    /// Also write the rows as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct GlaArgs {
    /// cuda or cuda:N.
    #[arg(long, default_value = "cuda")]
    pub device: DeviceArg,
    /// B,T,H,D: batch, positions, heads, head width (K = V); hgrn2-125m's layer by default.
    #[arg(long, value_delimiter = ',', default_value = "2,16384,6,128")]
    pub shape: Vec<usize>,
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    #[arg(long, default_value_t = 20)]
    pub iters: usize,
}

#[derive(clap::Args, Debug)]
pub struct AttentionArgs {
    /// cpu, cuda, cuda:N or auto (a GPU if one is usable, else the CPU).
    #[arg(long, default_value = "auto")]
    pub device: DeviceArg,
    /// Head dimensions.
    #[arg(long, value_delimiter = ',', default_value = "64,128")]
    pub d: Vec<usize>,
    /// Sequence lengths.
    #[arg(long, value_delimiter = ',', default_value = "1024,4096,16384")]
    pub t: Vec<usize>,
    /// Tokens per batch, B·T (the CPU default is smaller: 4096).
    #[arg(long)]
    pub tokens: Option<usize>,
    /// Model width, H·D.
    #[arg(long, default_value_t = 2048)]
    pub hidden: usize,
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    #[arg(long, default_value_t = 10)]
    pub iters: usize,
    /// Time the forward pass only.
    #[arg(long)]
    pub fwd_only: bool,
    /// Skip the PyTorch SDPA reference (GPU only).
    #[arg(long)]
    pub no_sdpa: bool,
    /// Skip the FoX authors' Triton kernel and the fla library's kernel (GPU only).
    #[arg(long)]
    pub no_fox_refs: bool,
    /// Where those kernels' code is: authors/src (their repository's src folder) and wheels
    /// (fla-core and einops wheels); see docs/gpu.md.
    #[arg(long, default_value = ".device-bundle")]
    pub bundle: PathBuf,
    /// The python3 that has PyTorch, for the SDPA reference.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Also write the rows as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}
