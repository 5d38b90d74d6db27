//! `foxlm serve` (an OpenAI-compatible server) and `foxlm bench serve` (its load generator).

use crate::backend::DeviceArg;
use crate::serve::bench::{model_info, peak_rss_mib, run_load, LoadOptions, LoadReport};
use crate::serve::scheduler::DEFAULT_PREFILL_CHUNK;
use crate::serve::{self, ServeOptions};
use crate::tokenizer::TextFormat;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::time::Duration;

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

/// A folder this process made, removed when it goes.
struct RemovedOnDrop(PathBuf);

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `host:port` of an http:// URL.
fn url_addr(url: &str) -> Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let rest = url.strip_prefix("http://").context("--url: only http:// URLs are supported")?;
    let hostport = rest.split('/').next().unwrap_or(rest);
    hostport
        .to_socket_addrs()
        .with_context(|| format!("--url: cannot resolve {hostport:?}"))?
        .next()
        .with_context(|| format!("--url: no address for {hostport:?}"))
}

pub fn bench(a: BenchArgs) -> Result<()> {
    if a.clients.is_empty() || a.clients.contains(&0) {
        bail!("--clients: give one or more counts of at least 1");
    }
    if !(a.duration > 0.0 && a.duration.is_finite()) {
        bail!("--duration must be a positive number of seconds");
    }
    let mut server = None;
    let mut _preset_dir = None;
    let model_dir = match (&a.model, &a.preset) {
        (Some(m), _) => Some(m.clone()),
        (None, Some(p)) => {
            let preset = crate::presets::preset(p)?;
            let model = crate::train::init_model(&preset.model, 0);
            let dir = RemovedOnDrop(std::env::temp_dir().join(format!("foxlm-bench-serve-{}", std::process::id())));
            let path = dir.0.join(p);
            crate::checkpoint::save_model(&model, &preset.model, &path)?;
            _preset_dir = Some(dir);
            Some(path)
        }
        (None, None) => None,
    };
    let addr = match (&model_dir, &a.url) {
        (Some(m), _) => {
            let mut o = ServeOptions::new(m.clone());
            o.port = 0;
            o.device = a.device;
            o.max_batch = a.max_batch;
            o.admit_delay_ms = a.admit_delay_ms;
            o.prefill_chunk = a.prefill_chunk;
            o.max_queue = 4 * a.clients.iter().max().copied().unwrap_or(1) + 16;
            o.max_model_len = Some(a.prompt_tokens + a.max_tokens + 1);
            o.api_key = a.api_key.clone();
            let s = serve::start(&o)?;
            let addr = s.addr;
            server = Some(s);
            addr
        }
        (None, Some(u)) => url_addr(u)?,
        (None, None) => bail!("give --model, --preset or --url"),
    };
    let (model, vocab) = model_info(addr, a.api_key.as_deref())?;
    eprintln!(
        "bench serve: '{model}', {} prompt tokens, {} generated per request{}, {} s per run",
        a.prompt_tokens,
        if a.score { 0 } else { a.max_tokens },
        if a.score { " (scoring: echo + logprobs; tokens/s counts prompt tokens)" } else { "" },
        a.duration
    );
    let mut rows: Vec<LoadReport> = Vec::new();
    for &c in &a.clients {
        let o = LoadOptions {
            clients: c,
            duration: Duration::from_secs_f64(a.duration),
            prompt_tokens: a.prompt_tokens.max(1),
            max_tokens: a.max_tokens,
            vocab,
            model: model.clone(),
            api_key: a.api_key.clone(),
            score: a.score,
        };
        let r = run_load(addr, &o);
        if let Some(e) = &r.first_error {
            eprintln!("clients {c}: {} errors; the first: {e}", r.errors);
        }
        rows.push(r);
    }
    let peak = server.is_some().then(peak_rss_mib).flatten();
    if let Some(s) = server.take() {
        s.shutdown()?;
    }
    let base = rows.first().map(|r| r.tokens_per_s).unwrap_or(f64::NAN);
    println!(
        "| clients | requests | errors | req/s | gen tok/s | vs first row | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | steps/s | rows/step | ms/step | prefills/s | rows/prefill | ms/prefill |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.2} | {:.1} | {:.1}x | {:.0} | {:.0} | {:.1} | {:.1} | {:.0} | {:.1} | {:.3} | {:.0} | {:.1} | {:.3} |",
            r.clients,
            r.requests,
            r.errors,
            r.requests_per_s,
            r.tokens_per_s,
            r.tokens_per_s / base,
            r.ttft_p50_ms,
            r.ttft_p99_ms,
            r.itl_p50_ms,
            r.itl_p99_ms,
            r.steps_per_s,
            r.mean_batch,
            r.step_ms,
            r.prefills_per_s,
            r.mean_prefill_group,
            r.prefill_ms
        );
    }
    match peak {
        Some(p) => println!("peak memory of the process (server and clients): {p:.0} MiB"),
        None => println!("peak memory: not measured (server in another process)"),
    }
    if let Some(path) = &a.json {
        let v = serde_json::json!({"rows": rows, "peak_rss_mib": peak, "prompt_tokens": a.prompt_tokens, "max_tokens": a.max_tokens});
        std::fs::write(path, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let errors: usize = rows.iter().map(|r| r.errors).sum();
    if errors > 0 {
        bail!("{errors} requests failed");
    }
    Ok(())
}
