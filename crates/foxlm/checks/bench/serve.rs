//! `foxlm bench serve`: `foxlm serve` under load (started in this process, from a model folder or
//! a preset's random weights, or one already running at --url), a run per client count through
//! the load generator ([`super::load`]), and the table of its rows.

use super::load::{model_info, peak_rss_mib, run_load, LoadOptions, LoadReport};
use anyhow::{bail, Context, Result};
use foxlm::cli::serve::BenchArgs;
use foxlm::serve::{self, ServeOptions};
use std::path::PathBuf;
use std::time::Duration;

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

pub(super) fn bench(a: BenchArgs) -> Result<()> {
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
            let preset = foxlm::presets::preset(p)?;
            let model = foxlm::train::init_model(&preset.model, 0);
            let dir = RemovedOnDrop(std::env::temp_dir().join(format!("foxlm-bench-serve-{}", std::process::id())));
            let path = dir.0.join(p);
            foxlm::checkpoint::save_model(&model, &preset.model, &path)?;
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
