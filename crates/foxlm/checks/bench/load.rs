//! `foxlm bench serve`'s load generator: N concurrent streaming clients held for a fixed time
//! against `foxlm serve` (started in this process, or one already running), reporting requests/s,
//! generated tokens/s, time to first token and inter-token latency (p50/p99), errors and peak
//! memory.

use anyhow::{Context, Result};
use foxlm::serve::client::sse_request;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub clients: usize,
    pub duration: Duration,
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    pub vocab: usize,
    pub model: String,
    pub api_key: Option<String>,
    /// Scoring load instead: each request asks for no tokens, only the echoed prompt's
    /// log-probabilities (what lm-evaluation-harness's loglikelihood sends), not streamed; the
    /// report's tokens are then prompt tokens scored.
    pub score: bool,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct LoadReport {
    pub clients: usize,
    pub seconds: f64,
    pub requests: usize,
    pub errors: usize,
    pub requests_per_s: f64,
    pub tokens_per_s: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub itl_p50_ms: f64,
    pub itl_p99_ms: f64,
    /// Decode steps per second and the mean rows per step (from the server's /stats).
    pub steps_per_s: f64,
    pub mean_batch: f64,
    /// Prefill passes per second, sequences per prefill, and the engine's milliseconds per
    /// prefill and per decode step (NaN where none ran).
    pub prefills_per_s: f64,
    pub mean_prefill_group: f64,
    pub prefill_ms: f64,
    pub step_ms: f64,
    pub first_error: Option<String>,
}

#[derive(Default)]
struct Tally {
    requests: usize,
    errors: usize,
    tokens: usize,
    ttft: Vec<f64>,
    itl: Vec<f64>,
    first_error: Option<String>,
}

/// The q-quantile (0..1) of `v` by the nearest-rank method; NaN when empty.
pub fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// One streaming request: Ok(generated tokens) or an error message.
/// A scoring request: the prompt's token count from its usage.
fn one_score(addr: SocketAddr, body: &Value, key: Option<&str>, ttft: &mut Vec<f64>) -> Result<usize, String> {
    let t0 = Instant::now();
    match foxlm::serve::client::json_request(addr, "/v1/completions", Some(body), key) {
        Err(e) => Err(format!("{e:#}")),
        Ok((200, v)) => {
            let lps = v.pointer("/choices/0/logprobs/token_logprobs").and_then(|l| l.as_array()).map_or(0, |l| l.len());
            let n = v.pointer("/usage/prompt_tokens").and_then(|n| n.as_u64()).unwrap_or(0) as usize;
            if n == 0 || lps != n {
                return Err(format!("{n} prompt tokens but {lps} log-probabilities in {v}"));
            }
            ttft.push(t0.elapsed().as_secs_f64() * 1e3);
            Ok(n)
        }
        Ok((status, v)) => Err(format!("HTTP {status}: {v}")),
    }
}

fn one_request(
    addr: SocketAddr,
    body: &Value,
    key: Option<&str>,
    ttft: &mut Vec<f64>,
    itl: &mut Vec<f64>,
) -> Result<usize, String> {
    let t0 = Instant::now();
    let mut last: Option<Instant> = None;
    let mut tokens = None;
    let mut done = false;
    let mut bad = None;
    let res = sse_request(addr, "/v1/completions", body, key, |data| {
        if data == "[DONE]" {
            done = true;
            return true;
        }
        let v: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => {
                bad = Some(format!("bad event {data:?}: {e}"));
                return false;
            }
        };
        if let Some(n) = v.pointer("/usage/completion_tokens").and_then(|n| n.as_u64()) {
            tokens = Some(n as usize);
        }
        let has_text = v["choices"]
            .as_array()
            .is_some_and(|c| c.iter().any(|c| c["text"].as_str().is_some_and(|t| !t.is_empty())));
        if has_text {
            let now = Instant::now();
            match last {
                None => ttft.push(now.duration_since(t0).as_secs_f64() * 1e3),
                Some(l) => itl.push(now.duration_since(l).as_secs_f64() * 1e3),
            }
            last = Some(now);
        }
        true
    });
    match res {
        Err(e) => Err(format!("{e:#}")),
        Ok((200, _)) if bad.is_some() => Err(bad.unwrap_or_default()),
        Ok((200, _)) if done => tokens.ok_or_else(|| "no usage in the stream".to_string()),
        Ok((200, _)) => Err("the stream ended without [DONE]".into()),
        Ok((status, body)) => Err(format!("HTTP {status}: {body}")),
    }
}

/// Holds `o.clients` clients, each sending streaming requests back to back, for `o.duration`;
/// requests started before the end are waited for and counted.
pub fn run_load(addr: SocketAddr, o: &LoadOptions) -> LoadReport {
    const KEYS: [&str; 6] = ["steps", "rows_decoded", "prefills", "prefilled", "prefill_us", "step_us"];
    let counters = || -> [f64; 6] {
        let v = foxlm::serve::client::json_request(addr, "/stats", None, o.api_key.as_deref()).map(|(_, v)| v).ok();
        KEYS.map(|k| v.as_ref().and_then(|v| v[k].as_f64()).unwrap_or(0.0))
    };
    let before = counters();
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let t0 = Instant::now();
    let threads: Vec<_> = (0..o.clients)
        .map(|ci| {
            let (stop, tally, o) = (stop.clone(), tally.clone(), o.clone());
            std::thread::spawn(move || {
                let mut k = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    // Different prompts per client and request, ids spread over the vocabulary.
                    let prompt: Vec<usize> =
                        (0..o.prompt_tokens).map(|i| (i * 7919 + ci * 104729 + k * 13) % o.vocab).collect();
                    let (mut ttft, mut itl) = (Vec::new(), Vec::new());
                    let r = if o.score {
                        let body =
                            json!({"model": o.model, "prompt": prompt, "max_tokens": 0, "echo": true, "logprobs": 1});
                        one_score(addr, &body, o.api_key.as_deref(), &mut ttft)
                    } else {
                        let body = json!({
                            "model": o.model, "prompt": prompt, "max_tokens": o.max_tokens, "temperature": 0,
                            "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true,
                        });
                        one_request(addr, &body, o.api_key.as_deref(), &mut ttft, &mut itl)
                    };
                    let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
                    t.requests += 1;
                    match r {
                        Ok(n) => {
                            t.tokens += n;
                            t.ttft.extend(ttft);
                            t.itl.extend(itl);
                        }
                        Err(e) => {
                            t.errors += 1;
                            t.first_error.get_or_insert(e);
                        }
                    }
                    k += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(o.duration);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let secs = t0.elapsed().as_secs_f64();
    let after = counters();
    let [steps, rows, prefills, prefilled, prefill_us, step_us] = std::array::from_fn(|i| after[i] - before[i]);
    let per = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    let mut t = std::mem::take(&mut *tally.lock().unwrap_or_else(|e| e.into_inner()));
    LoadReport {
        clients: o.clients,
        seconds: secs,
        requests: t.requests,
        errors: t.errors,
        requests_per_s: (t.requests - t.errors) as f64 / secs,
        tokens_per_s: t.tokens as f64 / secs,
        ttft_p50_ms: quantile(&mut t.ttft, 0.5),
        ttft_p99_ms: quantile(&mut t.ttft, 0.99),
        itl_p50_ms: quantile(&mut t.itl, 0.5),
        itl_p99_ms: quantile(&mut t.itl, 0.99),
        steps_per_s: steps / secs,
        mean_batch: rows / steps.max(1.0),
        prefills_per_s: prefills / secs,
        mean_prefill_group: per(prefilled, prefills),
        prefill_ms: per(prefill_us / 1e3, prefills),
        step_ms: per(step_us / 1e3, steps),
        first_error: t.first_error,
    }
}

/// Peak resident memory of this process (VmHWM), in MiB, where the OS reports it.
pub fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Reads the served model's name and vocabulary from `/v1/models`.
pub fn model_info(addr: SocketAddr, key: Option<&str>) -> Result<(String, usize)> {
    let (status, v) = foxlm::serve::client::json_request(addr, "/v1/models", None, key)?;
    anyhow::ensure!(status == 200, "GET /v1/models: HTTP {status}: {v}");
    let m = &v["data"][0];
    let name = m["id"].as_str().context("GET /v1/models: no model id")?.to_string();
    let vocab = m["vocab_size"].as_u64().context("GET /v1/models: no vocab_size")? as usize;
    Ok((name, vocab))
}
