//! `foxlm bench`: attention, training-step and decoding throughput (the flags are
//! [`foxlm::cli::bench::Args`]).
//!
//! One file a benchmark: [`attention`] (on the CPU: [`cpu_attention`]), [`gla`], [`train`] (over
//! several GPUs: [`scaling`]) and [`decode`]; `bench serve` is `foxlm::cli::serve::bench`.

mod attention;
mod cpu_attention;
mod decode;
mod gla;
mod scaling;
mod train;

use anyhow::Result;
use foxlm::cli::bench::{Args, What};

pub fn run(a: Args) -> Result<()> {
    match a.what {
        What::Attention(a) => attention::attention(a),
        What::Gla(a) => gla::gla(a),
        What::Train(a) => train::train_bench(a),
        What::Decode(a) => decode::decode_bench(a),
        What::Serve(a) => foxlm::cli::serve::bench(a),
    }
}
