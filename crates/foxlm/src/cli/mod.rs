//! One module per `foxlm` subcommand: its clap arguments and its `run`.

pub mod bench;
pub mod data;
pub mod demo;
pub mod eval;
pub mod eval_compare;
pub mod forward;
pub mod generate;
pub mod gpu_check;
pub mod inspect;
pub mod serve;
pub mod tokenizer;
pub mod train;
pub mod viz;
