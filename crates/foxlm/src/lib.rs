//! foxlm: the Forgetting Transformer (FoX) in Rust — configuration, checkpoints in the authors'
//! layout, the model with its KV-cache decoding, the GPT-2 tokenizer, and sampling.

pub mod backend;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod data;
pub mod distributed;
pub mod engine;
pub mod eval;
pub mod fsutil;
pub mod generate;
pub mod hex;
pub mod infer;
pub mod init_from;
pub mod model;
pub mod optim;
pub mod plot;
pub mod presets;
pub mod sampling;
pub mod serve;
pub mod tensor;
pub mod tensorboard;
pub mod tokenizer;
pub mod tokenizer_export;
pub mod train;
pub mod validate;
