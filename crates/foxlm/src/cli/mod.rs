//! One module per `foxlm` subcommand: its clap arguments and its `run`.

pub mod bench;
pub mod data;
pub mod demo;
pub mod eval;
pub mod forward;
pub mod generate;
pub mod gpu_check;
pub mod inspect;
pub mod serve;
pub mod tokenizer;
pub mod train;
pub mod viz;

use crate::backend::{select_device_with_dtype, DeviceArg, Dtype};
use crate::config::Config;
use crate::eval::text::{text_format_for, TextEncoder};
use crate::model::cuda_plan::select_device_for;
use crate::tokenizer::TextFormat;
use anyhow::Result;
use fox_kernels::cuda::Device;

/// The whole `foxlm` command line (main.rs runs it; tests parse the documentation's commands with it).
#[derive(clap::Parser)]
#[command(name = "foxlm", version, about = "The Forgetting Transformer (FoX): train, evaluate and run FoX language models", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once; boxing would only obscure the clap derive
pub enum Command {
    /// Generate text (or token ids) from a model, streaming to stdout.
    Generate(generate::Args),
    /// Run a forward pass on ids from a safetensors file and write the logits (to compare implementations).
    Forward(forward::Args),
    /// Show a model's configuration, parameter counts per component and memory needs.
    Inspect(inspect::Args),
    /// Datasets: token shards from text (prepare), from token arrays others ship (import), and their summary (inspect).
    Data(data::Args),
    /// Train a model (--preset NAME or --config FILE) on a prepared dataset, with checkpoints and --resume.
    Train(train::Args),
    /// Tokenize the Moby-Dick sample, train a tiny FoX (Pro) for about a minute and a half on two CPU cores, and sample from it.
    Demo(demo::Args),
    /// Evaluate models: per-token loss and perplexity over context length (loss), needle in a haystack (niah).
    Eval(eval::Args),
    /// Visualise a model: forget-gate matrices, attention maps and memory lengths per head (gates).
    Viz(viz::Args),
    /// Check the whole model on the GPU against the CPU reference (fixtures, training, resume): a pass/fail table.
    GpuCheck(gpu_check::Args),
    /// Benchmarks: Forgetting Attention throughput on GPU (vs PyTorch SDPA) or CPU (attention); a training step (train); the server under load (serve).
    Bench(bench::Args),
    /// Serve a model over HTTP with the OpenAI completions API (for the openai client and lm-evaluation-harness).
    Serve(serve::Args),
    /// Tokenizer files: write tokenizer.json + tokenizer_config.json into a model folder (export).
    Tokenizer(tokenizer::Args),
}

/// The arguments of a command made of subcommands (`foxlm data`, `eval`, `viz`, `tokenizer`):
/// the one chosen.
#[derive(clap::Args, Debug)]
pub struct Subcommands<C: clap::Subcommand> {
    #[command(subcommand)]
    pub command: C,
}

/// `--text-format` (and the test-only `--fold-vocab`) of the commands that run a model on text.
#[derive(clap::Args, Debug, Clone)]
pub struct TextArgs {
    /// json-escaped or plain GPT-2 BPE (default: the model's recorded format, else json-escaped).
    #[arg(long)]
    pub text_format: Option<TextFormat>,
    /// Testing only: fold GPT-2 ids modulo the vocabulary of a model smaller than GPT-2's.
    #[arg(long, hide = true)]
    pub fold_vocab: bool,
}

impl TextArgs {
    /// The encoder of text for the model of `cfg` that the flags ask for.
    pub fn encoder(&self, cfg: &Config) -> Result<TextEncoder> {
        TextEncoder::for_model(cfg, text_format_for(cfg, self.text_format), self.fold_vocab)
    }
}

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
    /// The device to run on; bf16 on the CPU is refused ([`select_device_with_dtype`]).
    pub fn select(&self) -> Result<Device> {
        select_device_with_dtype(self.device, self.dtype)
    }

    /// The device to run `model` on ([`select_device_for`]): the CPU, with a note, where the GPU
    /// backend cannot run one of its layer families and `--device` is auto.
    pub fn select_for(&self, model: &crate::model::Model) -> Result<Device> {
        select_device_for(model, self.device, self.dtype)
    }
}
