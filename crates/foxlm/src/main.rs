//! The `foxlm` command: train, evaluate and run Forgetting Transformer models.
//!
//! Exit codes: 0 success, 1 runtime error, 2 usage error (clap's own). Messages go to stderr.

use clap::{Parser, Subcommand};
use foxlm::cli;

#[derive(Parser)]
#[command(name = "foxlm", version, about = "The Forgetting Transformer (FoX): train, evaluate and run FoX language models", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once; boxing would only obscure the clap derive
enum Command {
    /// Generate text (or token ids) from a model, streaming to stdout.
    Generate(cli::generate::Args),
    /// Run a forward pass on ids from a safetensors file and write the logits (to compare implementations).
    Forward(cli::forward::Args),
    /// Show a model's configuration, parameter counts per component and memory needs.
    Inspect(cli::inspect::Args),
    /// Prepare token shards from text (prepare) and summarise them (inspect).
    Data(cli::data::Args),
    /// Train a model (--preset NAME or --config FILE) on a prepared dataset, with checkpoints and --resume.
    Train(cli::train::Args),
    /// Tokenize the Moby-Dick sample, train a tiny FoX (Pro) for about a minute and a half on two CPU cores, and sample from it.
    Demo(cli::demo::Args),
    /// Evaluate models: per-token loss and perplexity over context length (loss), needle in a haystack (niah).
    Eval(cli::eval::Args),
    /// Visualise a model: forget-gate matrices, attention maps and memory lengths per head (gates).
    Viz(cli::viz::Args),
    /// Check the whole model on the GPU against the CPU reference (fixtures, training, resume): a pass/fail table.
    GpuCheck(cli::gpu_check::Args),
    /// Benchmarks: Forgetting Attention throughput on GPU (vs PyTorch SDPA) or CPU (attention); a training step (train); the server under load (serve).
    Bench(cli::bench::Args),
    /// Serve a model over HTTP with the OpenAI completions API (for the openai client and lm-evaluation-harness).
    Serve(cli::serve::Args),
    /// Tokenizer files: write tokenizer.json + tokenizer_config.json into a model folder (export).
    Tokenizer(cli::tokenizer::Args),
}

fn main() {
    // Before anything uses rayon: its workers flush denormals (see fox_kernels::par::init_pool).
    if let Err(e) = fox_kernels::par::init_pool() {
        eprintln!("warning: rayon's thread pool: {e}");
    }
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Generate(a) => cli::generate::run(a),
        Command::Forward(a) => cli::forward::run(a),
        Command::Inspect(a) => cli::inspect::run(a),
        Command::Data(a) => cli::data::run(a),
        Command::Train(a) => cli::train::run(a),
        Command::Demo(a) => cli::demo::run(a),
        Command::Eval(a) => cli::eval::run(a),
        Command::Viz(a) => cli::viz::run(a),
        Command::Bench(a) => cli::bench::run(a),
        Command::GpuCheck(a) => cli::gpu_check::run(a),
        Command::Serve(a) => cli::serve::run(a),
        Command::Tokenizer(a) => cli::tokenizer::run(a),
    };
    if let Err(e) = res {
        // The reader of our output went away (`foxlm ... | head`): stop quietly, as Unix tools do.
        let broken_pipe = e
            .chain()
            .any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe));
        if broken_pipe {
            std::process::exit(0);
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
