//! The `foxlm` command: train, evaluate and run Forgetting Transformer models.
//!
//! Exit codes: 0 success, 1 runtime error, 2 usage error (clap's own). Messages go to stderr.

use clap::Parser;
use foxlm::cli::{self, Cli, Command};

/// `foxlm gpu-check` and `foxlm bench`: beside the library, in the binary only.
#[path = "../checks/mod.rs"]
mod checks;

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
        Command::Bench(a) => checks::bench::run(a),
        Command::GpuCheck(a) => checks::gpu_check::run(a),
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
