//! `foxlm bench`: attention, training-step and decoding throughput (the flags are
//! [`foxlm::cli::bench::Args`]).
//!
//! One file a benchmark: [`attention`] (on the CPU: [`cpu_attention`]), [`gla`], [`train`] (over
//! several GPUs: [`scaling`]), [`decode`] and [`serve`] (through the load generator, [`load`]).

mod attention;
mod cpu_attention;
mod decode;
mod gla;
mod load;
mod scaling;
mod serve;
mod train;

use anyhow::Result;
use foxlm::cli::bench::{Args, What};

pub fn run(a: Args) -> Result<()> {
    match a.what {
        What::Attention(a) => attention::attention(a),
        What::Gla(a) => gla::gla(a),
        What::Train(a) => train::train_bench(a),
        What::Decode(a) => decode::decode_bench(a),
        What::Serve(a) => serve::bench(a),
    }
}
