//! `foxlm serve` on the GPU against `foxlm generate --device cuda` and the forward pass (issue 32):
//! the server is started in-process on the GPU and driven over HTTP.
//!
//! Per model (the FoX (Pro) fixture, the Mamba-2 fixture, a FoX (Pro) with heads of 64, whose
//! attention runs the fast bf16 kernels as fox-pro-125m's does, and a Gated DeltaNet with heads of
//! 64):
//! - greedy tokens of concurrent requests (two waves: short prompts, then longer ones that join
//!   the running batch, which moves the running rows once, and different lengths that leave at
//!   different steps; the longer ones prefilled in chunks of 16 between decode steps) against
//!   `GpuInfer::reference_generate` of each prompt alone (the fixed-batch loop of `bench decode`). Identical, or parted at a near-tie: where they part, the f32 CPU
//!   logits' two best tokens are within 0.05 nats (the inference check's rule);
//! - echoed prompt log-probabilities (`max_tokens: 0`, `echo`, `logprobs`) against the f32 CPU
//!   forward's log-softmax, within 0.1 nats (the inference check's bf16 per-position tolerance);
//! - streaming text equal to the plain answer, `n: 2` with a seed twice the same, and the usage;
//! - greedy steps replay the CUDA graph where the batcher uses one (heads of 64: the FoX and the
//!   Gated DeltaNet models);
//! - `GET /metrics` reports the GPU's memory and the latency histograms;
//! - a cache plan too large for the GPU is an error at start, not a crash.

use super::row;
use anyhow::{anyhow, Context, Result};
use fox_checks::check::CheckRow;
use fox_kernels::cuda::Gpu;
use foxlm::backend::DeviceArg;
use foxlm::checkpoint::{load_model, save_model};
use foxlm::generate::GenerateOptions;
use foxlm::infer::{GpuInfer, Plan};
use foxlm::model::{Ctx, Model};
use foxlm::sampling::Sampling;
use foxlm::serve::client::{json_request, sse_request};
use foxlm::serve::{start, ServeOptions};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const NEAR_TIE: f64 = 0.05;
const LOGPROB_TOL: f64 = 0.1;

fn log_softmax(l: &[f32]) -> Vec<f64> {
    let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = m + l.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
    l.iter().map(|&x| x as f64 - lse).collect()
}

/// The gap between the f32 CPU logits' two best tokens after `prefix`.
fn top2_gap(model: &Model, prefix: &[u32]) -> f64 {
    let v = model.config.vocab_size;
    let l = model.forward(prefix, &Ctx { batch: 1, seq: prefix.len(), start: None });
    let last = &l[(prefix.len() - 1) * v..];
    let mut s: Vec<f32> = last.to_vec();
    s.sort_by(|a, b| b.total_cmp(a));
    (s[0] - s.get(1).copied().unwrap_or(f32::NEG_INFINITY)) as f64
}

fn post(addr: SocketAddr, body: &Value) -> Result<Value> {
    let (st, v) = json_request(addr, "/v1/completions", Some(body), None)?;
    anyhow::ensure!(st == 200, "HTTP {st}: {v}");
    Ok(v)
}

fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array().map_or_else(Vec::new, |a| a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect())
}

/// The check models: name, folder.
fn models(fixtures: &Path, work: &Path) -> Result<Vec<(String, PathBuf)>> {
    let root = fixtures.parent().unwrap_or(fixtures);
    let mut out = vec![
        ("fox_pro fixture".to_string(), fixtures.join("fox_pro")),
        ("mamba2 fixture".to_string(), root.join("official-mamba2-tiny/mamba2")),
    ];
    // FoX (Pro), d 256, 4 heads of 64 (the fast bf16 attention kernels), 4 layers.
    let mut cfg = foxlm::presets::tiny().model;
    (cfg.hidden_size, cfg.num_heads, cfg.num_hidden_layers, cfg.vocab_size) = (256, 4, 4, 512);
    (cfg.bos_token_id, cfg.eos_token_id) = (None, None);
    cfg.validate()?;
    let model = foxlm::train::init_model(&cfg, 7);
    let dir = work.join("serve-fox-pro-heads-64");
    save_model(&model, &cfg, &dir).with_context(|| format!("saving {}", dir.display()))?;
    out.push(("fox_pro d=256 heads of 64".to_string(), dir));
    // Gated DeltaNet with heads of 64: its GPU state through prefills, decode steps and the rows'
    // moves between caches.
    let name = "gated deltanet d=256 heads of 64";
    let m = super::deltanet_models()?.into_iter().find(|m| m.name == name).context("the Gated DeltaNet check model")?;
    let dir = work.join("serve-gated-deltanet-heads-64");
    save_model(&m.model, &m.model.config, &dir).with_context(|| format!("saving {}", dir.display()))?;
    out.push((name.to_string(), dir));
    Ok(out)
}

pub fn run_serve_checks(gpu: &Arc<Gpu>, fixtures: &Path, work: &Path, only: Option<&str>) -> Result<Vec<CheckRow>> {
    let mut rows = Vec::new();
    for (name, dir) in models(fixtures, work)?.into_iter().filter(|(n, _)| super::wanted(only, n)) {
        eprintln!("serve checks: {name}");
        rows.extend(model_rows(gpu, &name, &dir).with_context(|| format!("serve checks of {name}"))?);
    }
    if only.is_some() {
        return Ok(rows);
    }
    // A plan that cannot fit: refused at start with the options named.
    let mut o = ServeOptions::new(fixtures.join("fox_pro"));
    (o.port, o.device, o.max_batch, o.max_model_len) = (0, DeviceArg::Cuda(0), 4096, Some(1 << 22));
    let (err, note) = match start(&o) {
        Ok(s) => {
            let _ = s.shutdown();
            (1.0, "a 4096 × 4M-position cache was accepted".to_string())
        }
        Err(e) => {
            let e = format!("{e:#}");
            (if e.contains("lower --max-batch or --max-model-len") { 0.0 } else { 1.0 }, e.chars().take(150).collect())
        }
    };
    rows.push(row("serve: a cache plan beyond the GPU's memory".into(), "refused at start", err, 0.0, note));
    Ok(rows)
}

fn model_rows(gpu: &Arc<Gpu>, name: &str, dir: &Path) -> Result<Vec<CheckRow>> {
    let model = load_model(dir)?;
    // The batcher's condition (serve/gpu.rs): bf16, heads of 64 or 128, no ACP (any family).
    let hd = model.config.head_dim();
    let graphs_expected = (hd == 64 || hd == 128) && model.config.log_pruning_tolerance.is_none();
    let vocab = model.config.vocab_size as u32;
    let mut rows = Vec::new();
    let mut o = ServeOptions::new(dir.to_path_buf());
    (o.port, o.device, o.max_batch, o.max_model_len) = (0, DeviceArg::Cuda(0), 8, Some(160));
    // Chunks of 16 positions: the second wave's prompts (50-65 tokens) are prefilled in 4-5 chunks
    // with decode steps of the first wave between them.
    o.prefill_chunk = 16;
    let server = start(&o)?;
    let addr = server.addr;

    // Two waves of concurrent greedy requests: short prompts first, then longer ones joining.
    let prompt = |i: u32, n: u32| -> Vec<u32> { (0..n).map(|j| (i * 131 + j * 17 + 3) % vocab).collect() };
    let wave1: Vec<(Vec<u32>, usize)> = (0..4).map(|i| (prompt(i, 3 + i), 20 + 6 * i as usize)).collect();
    let wave2: Vec<(Vec<u32>, usize)> = (4..8).map(|i| (prompt(i, 30 + 5 * i), 24)).collect();
    let served: Vec<Result<Vec<u32>>> = std::thread::scope(|sc| {
        let go = |p: &Vec<u32>, n: usize| {
            let body =
                json!({"prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": true, "return_token_ids": true});
            post(addr, &body).map(|v| ids_of(&v["choices"][0]["token_ids"]))
        };
        let h1: Vec<_> = wave1.iter().map(|(p, n)| sc.spawn(move || go(p, *n))).collect();
        // The second wave once the first is decoding.
        let t0 = std::time::Instant::now();
        while t0.elapsed().as_secs() < 120 {
            let steps = json_request(addr, "/stats", None, None).map_or(0, |(_, v)| v["steps"].as_u64().unwrap_or(0));
            if steps >= 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let h2: Vec<_> = wave2.iter().map(|(p, n)| sc.spawn(move || go(p, *n))).collect();
        h1.into_iter().chain(h2).map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("client panicked")))).collect()
    });
    let (mut worst, mut parted) = (0usize, Vec::new());
    let mut total = 0;
    for ((p, n), got) in wave1.iter().chain(&wave2).zip(served) {
        let got = got?;
        let opts = GenerateOptions { max_new_tokens: *n, sampling: Sampling::default(), seed: 0, eos: None };
        let mut e = GpuInfer::<half::bf16>::new(gpu.clone(), &model, Plan { batch: 1, chunk: p.len() })?;
        // The kernel-level reference loop (not the serving scheduler): a batch of one, prefilled whole.
        let want = e.reference_generate(std::slice::from_ref(p), &opts, &mut |_, _| {})?.remove(0);
        total += want.len();
        if got.len() != want.len() {
            worst = worst.max(want.len());
            parted.push(format!("{} of {} tokens", got.len(), want.len()));
            continue;
        }
        if let Some(k) = got.iter().zip(&want).position(|(a, b)| a != b) {
            let prefix: Vec<u32> = p.iter().chain(&want[..k]).copied().collect();
            let gap = top2_gap(&model, &prefix);
            parted.push(format!("parted at token {k} (f32 top-2 gap {gap:.3})"));
            if gap >= NEAR_TIE {
                worst = worst.max(want.len() - k);
            }
        }
    }
    let st = json_request(addr, "/stats", None, None)?.1;
    let relocations = st["relocations"].as_u64().unwrap_or(0);
    let graph_steps = st["graph_steps"].as_u64().unwrap_or(0);
    rows.push(row(
        format!("serve {name}: greedy of 8 concurrent requests (2 waves)"),
        "tokens unlike generate --device cuda",
        worst as f64,
        0.0,
        format!(
            "{total} tokens; {} steps ({graph_steps} CUDA graph replays), {} rows decoded, {relocations} relocations{}",
            st["steps"],
            st["rows_decoded"],
            if parted.is_empty() { String::new() } else { format!("; {}", parted.join(", ")) }
        ),
    ));
    rows.push(row(
        format!("serve {name}: a longer prompt joining moved the running rows"),
        "relocations missing",
        if relocations >= 1 { 0.0 } else { 1.0 },
        0.0,
        format!("{relocations} relocations"),
    ));
    let (prefills, chunks) = (st["prefills"].as_u64().unwrap_or(0), st["prefill_chunks"].as_u64().unwrap_or(0));
    rows.push(row(
        format!("serve {name}: long prompts prefilled in chunks of 16 between decode steps"),
        "no prefill ran in several chunks",
        if chunks > prefills { 0.0 } else { 1.0 },
        0.0,
        format!("{prefills} prefills in {chunks} chunks"),
    ));

    if graphs_expected {
        rows.push(row(
            format!("serve {name}: greedy steps replay the CUDA graph"),
            "steps not replayed",
            if graph_steps * 2 >= st["steps"].as_u64().unwrap_or(0) { 0.0 } else { 1.0 },
            0.0,
            format!("{graph_steps} of {} steps", st["steps"]),
        ));
    }

    // Echoed log-probabilities of scoring requests (several in one request: one batched prefill).
    let scored: Vec<Vec<u32>> = (0..3).map(|i| prompt(20 + i, 40 + 30 * i)).collect();
    let counts = |st: &Value| (st["prefills"].as_u64().unwrap_or(0), st["prefill_chunks"].as_u64().unwrap_or(0));
    let before = counts(&json_request(addr, "/stats", None, None)?.1);
    let v = post(addr, &json!({"prompt": scored, "max_tokens": 0, "echo": true, "logprobs": 3}))?;
    // The engine counts a chunk after answering it.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let after = counts(&json_request(addr, "/stats", None, None)?.1);
    let (prefills, chunks) = (after.0 - before.0, after.1 - before.1);
    // No stream decodes meanwhile, so each prefill takes the planned forward's whole width
    // (8 slots × 160 positions over its rows), not --prefill-chunk's 16.
    rows.push(row(
        format!("serve {name}: scoring with no stream running prefilled whole"),
        "prefill chunks beyond one per prefill",
        chunks.saturating_sub(prefills) as f64,
        0.0,
        format!("{prefills} prefills in {chunks} chunks for prompts of 40-100 tokens"),
    ));
    let (mut err, mut top_err) = (0f64, 0f64);
    let mut n = 0;
    for (i, p) in scored.iter().enumerate() {
        let lp = &v["choices"][i]["logprobs"]["token_logprobs"];
        let tops = &v["choices"][i]["logprobs"]["top_logprobs"];
        let vsz = model.config.vocab_size;
        let l = model.forward(p, &Ctx { batch: 1, seq: p.len(), start: None });
        for j in 1..p.len() {
            let ls = log_softmax(&l[(j - 1) * vsz..j * vsz]);
            let want = ls[p[j] as usize];
            let got = lp[j].as_f64().unwrap_or(f64::INFINITY);
            err = err.max((got - want).abs());
            // The top 3 (chosen on the device): three values, the largest log-probabilities in order.
            let mut best = ls.clone();
            best.sort_by(|a, b| b.total_cmp(a));
            let mut got_top: Vec<f64> =
                tops[j].as_object().map_or(Vec::new(), |o| o.values().filter_map(|x| x.as_f64()).collect());
            got_top.sort_by(|a, b| b.total_cmp(a));
            // (Two tokens of one spelling share a key: then fewer than 3 entries.)
            top_err = if (1..=3).contains(&got_top.len()) {
                let near = |g: &f64| best[..3].iter().map(|w| (g - w).abs()).fold(f64::INFINITY, f64::min);
                got_top.iter().map(near).fold(top_err.max((got_top[0] - best[0]).abs()), f64::max)
            } else {
                f64::INFINITY
            };
            n += 1;
        }
        if !lp[0].is_null() {
            err = f64::INFINITY;
        }
    }
    rows.push(row(
        format!("serve {name}: echoed prompt log-probabilities (max_tokens 0)"),
        "max |Δ logprob| vs f32 CPU forward",
        err,
        LOGPROB_TOL,
        format!("{n} positions of 3 prompts of 40-100 tokens"),
    ));
    rows.push(row(
        format!("serve {name}: echoed top-3 log-probabilities"),
        "max |Δ logprob| vs f32 CPU forward's 3 largest",
        top_err,
        LOGPROB_TOL,
        format!("{n} positions, the most likely first"),
    ));

    // Streaming equals the plain answer; n = 2 with a seed is reproducible; usage adds up.
    let body = json!({"prompt": prompt(30, 12), "max_tokens": 16, "temperature": 0, "ignore_eos": true});
    let plain = post(addr, &body)?;
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    sb["stream_options"] = json!({"include_usage": true});
    let mut text = String::new();
    let mut usage = Value::Null;
    let (st, _) = sse_request(addr, "/v1/completions", &sb, None, |d| {
        if let Ok(e) = serde_json::from_str::<Value>(d) {
            for c in e["choices"].as_array().into_iter().flatten() {
                text.push_str(c["text"].as_str().unwrap_or(""));
            }
            if !e["usage"].is_null() {
                usage = e["usage"].clone();
            }
        }
        true
    })?;
    let same = st == 200 && Some(text.as_str()) == plain["choices"][0]["text"].as_str() && usage == plain["usage"];
    rows.push(row(
        format!("serve {name}: streaming equals the plain answer"),
        "differs",
        if same { 0.0 } else { 1.0 },
        0.0,
        format!("{} completion tokens", plain["usage"]["completion_tokens"]),
    ));
    let sampled = json!({"prompt": [prompt(31, 5), prompt(32, 9)], "max_tokens": 12, "temperature": 0.8, "top_p": 0.9, "n": 2, "seed": 1234, "ignore_eos": true, "return_token_ids": true});
    let a = post(addr, &sampled)?;
    let b = post(addr, &sampled)?;
    let ta: Vec<Vec<u32>> = (0..4).map(|i| ids_of(&a["choices"][i]["token_ids"])).collect();
    let tb: Vec<Vec<u32>> = (0..4).map(|i| ids_of(&b["choices"][i]["token_ids"])).collect();
    let ok = ta == tb && ta.iter().all(|t| t.len() == 12) && ta[0] != ta[1];
    rows.push(row(
        format!("serve {name}: n = 2 with a seed, twice"),
        "not reproducible",
        if ok { 0.0 } else { 1.0 },
        0.0,
        "4 choices of 12 sampled tokens, the same both times; choices of a prompt differ".into(),
    ));
    // GET /metrics on the GPU: its memory and the latency histograms.
    let (_, text) = foxlm::serve::client::text_request(addr, "/metrics", None)?;
    let metric = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    let (used, ttft) = (metric("foxlm_gpu_memory_used_bytes"), metric("foxlm_time_to_first_token_seconds_count"));
    let ok = used > 0.0 && used <= metric("foxlm_gpu_memory_total_bytes") && ttft >= 8.0;
    rows.push(row(
        format!("serve {name}: GET /metrics"),
        "GPU memory or latencies missing",
        if ok { 0.0 } else { 1.0 },
        0.0,
        format!("{:.2} GiB in use, {ttft} first tokens timed", used / (1u64 << 30) as f64),
    ));
    server.shutdown()?;
    Ok(rows)
}
