//! `foxlm serve` (an OpenAI-compatible server) and the flags of `foxlm bench serve` (its load
//! generator: beside the library, in crates/foxlm/checks/bench/serve.rs).

use crate::backend::DeviceArg;
use crate::serve::scheduler::DEFAULT_PREFILL_CHUNK;
use crate::serve::{self, ServeOptions};
use crate::tokenizer::TextFormat;
use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model folder (config.json + model.safetensors).
    #[arg(long)]
    pub model: PathBuf,
    /// Address to listen on; the default is reachable from this machine only.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// cpu, cuda, cuda:N, or auto (the GPU when there is one and it can run the model, else the CPU).
    #[arg(long, default_value = "auto")]
    pub device: DeviceArg,
    /// Require `Authorization: Bearer KEY` on every request (or set FOXLM_API_KEY).
    #[arg(long, env = "FOXLM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// The model name clients send (default: the model folder's name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Longest prompt plus completion in tokens (default: the training context in config.json, else 2048).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Text format of the model (default: the one config.json records, else json-escaped).
    #[arg(long)]
    pub text_format: Option<TextFormat>,
    /// Most sequences decoded together in one batch.
    #[arg(long, default_value_t = 64)]
    pub max_batch: usize,
    /// Most requests waiting for a place in the batch; more are answered 503.
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Largest request body in bytes; larger ones are answered 413.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// On the GPU, how long new requests may wait while others stream, to be prefilled together
    /// (each prefill pauses every running stream once); 0 admits them at the next step.
    #[arg(long, default_value_t = serve::DEFAULT_ADMIT_DELAY_MS)]
    pub admit_delay_ms: f64,
    /// Prompt positions per prefill chunk: a longer prompt is prefilled a chunk at a time, with a
    /// decode step of the running streams between chunks, so they never wait for its whole prefill.
    /// On the GPU, while no stream runs (scoring), a prefill takes the longest chunk the planned
    /// forward allows (16,384 positions over the group's prompts).
    #[arg(long, default_value_t = DEFAULT_PREFILL_CHUNK)]
    pub prefill_chunk: usize,
}

impl Args {
    fn options(&self) -> ServeOptions {
        ServeOptions {
            model: self.model.clone(),
            host: self.host.clone(),
            port: self.port,
            device: self.device,
            api_key: self.api_key.clone(),
            served_model_name: self.served_model_name.clone(),
            max_model_len: self.max_model_len,
            text_format: self.text_format,
            max_batch: self.max_batch,
            max_queue: self.max_queue,
            max_body_bytes: self.max_body_bytes,
            admit_delay_ms: self.admit_delay_ms,
            prefill_chunk: self.prefill_chunk,
        }
    }
}

pub fn run(a: Args) -> Result<()> {
    serve::serve(&a.options())
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Model folder to serve in this process (port 0); or use --url or --preset.
    #[arg(long, required_unless_present_any = ["url", "preset"])]
    pub model: Option<PathBuf>,
    /// Serve a preset's shape with random weights (as `bench decode`), e.g. fox-pro-125m: saved to
    /// a temporary folder first.
    #[arg(long, conflicts_with_all = ["model", "url"])]
    pub preset: Option<String>,
    /// cpu, cuda, cuda:N or auto (the GPU when there is one) for the in-process server.
    #[arg(long, default_value = "auto")]
    pub device: DeviceArg,
    /// A server already running, e.g. http://127.0.0.1:8000 (peak memory is then not measured).
    #[arg(long, conflicts_with_all = ["model", "preset"])]
    pub url: Option<String>,
    /// Concurrent streaming clients; a list runs each in turn (e.g. 1,32).
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    pub clients: Vec<usize>,
    /// Seconds each run holds its clients.
    #[arg(long, default_value_t = 60.0)]
    pub duration: f64,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 32)]
    pub prompt_tokens: usize,
    /// Tokens generated per request (the end-of-text token is ignored).
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Most sequences per batch of the in-process server.
    #[arg(long, default_value_t = 64)]
    pub max_batch: usize,
    /// Scoring load instead of generation: requests with max_tokens 0, echo and logprobs (as
    /// lm-evaluation-harness's loglikelihood), not streamed; tokens/s counts prompt tokens scored
    /// and TTFT is each request's whole time.
    #[arg(long)]
    pub score: bool,
    /// The in-process server's --admit-delay-ms.
    #[arg(long, default_value_t = serve::DEFAULT_ADMIT_DELAY_MS)]
    pub admit_delay_ms: f64,
    /// The in-process server's --prefill-chunk.
    #[arg(long, default_value_t = DEFAULT_PREFILL_CHUNK)]
    pub prefill_chunk: usize,
    #[arg(long, env = "FOXLM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Also write the rows as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}
