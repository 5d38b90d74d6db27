//! `foxlm bench attention`: Forgetting Attention throughput on the GPU, with PyTorch's
//! scaled_dot_product_attention (causal, no gate) on the same shapes as the reference.
//!
//! Shapes: B·T = `tokens` (32768), H·D = `hidden` (2048), D in `head_dims`, T in `seq_lens`,
//! bf16, causal. TFLOP/s count the full causal work: forward 2·B·H·T²·D, forward+backward 3.5×
//! that, whatever a kernel skips (so ACP's pruning shows as a higher rate). Gates "mixed": per
//! head a logit bias spread linearly over [−1, 9], plus N(0, 1) noise per token; FoX runs with ACP
//! off and on (ε = e^-10, U from query/key norms). Times: CUDA events after warm-up, median.
//! Grouped-query attention (`kv_group` query heads per k/v head) and a sliding window are
//! options; the FLOP count stays the full causal work, so a window's saving shows as a higher
//! rate, as ACP's does.

use anyhow::{anyhow, Context, Result};
use fox_kernels::cuda::attention::{
    self as ga, AttnOptions, DType, DevGrads, DevProblem, DevView, DevVisibility, FwdKernel,
};
use fox_kernels::cuda::{time_ms, Gpu};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use rayon::prelude::*;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;

/// The SDPA reference script (also in bench/), written to a temporary file and run with `python`.
pub const SDPA_SCRIPT: &str = include_str!("../../../bench/sdpa_reference.py");
/// The other Forgetting Attention kernels (the authors' Triton kernel, the fla library's), run the
/// same way; they need the authors' sources and fla's wheels in the bundle folder (docs/gpu.md).
pub const FOX_REFS_SCRIPT: &str = include_str!("../../../bench/fox_references.py");

#[derive(Clone, Debug)]
pub struct BenchOpts {
    pub head_dims: Vec<usize>,
    pub seq_lens: Vec<usize>,
    /// B·T
    pub tokens: usize,
    /// H·D
    pub hidden: usize,
    pub warmup: usize,
    pub iters: usize,
    /// also time forward+backward
    pub backward: bool,
    /// run PyTorch SDPA as the reference
    pub sdpa: bool,
    /// also run the authors' and fla's Forgetting Attention kernels
    pub fox_refs: bool,
    /// where those kernels' code is: `authors/src` (the authors' repository) and `wheels` (fla-core)
    pub bundle: PathBuf,
    pub python: String,
    /// write the rows as JSON here
    pub json: Option<PathBuf>,
    pub seed: u64,
    /// GPU ordinal
    pub device: usize,
    /// query heads per k/v head (grouped-query attention; 1: multi-head)
    pub kv_group: usize,
    /// sliding window of the FoX rows (None: every earlier key)
    pub window: Option<usize>,
}

impl Default for BenchOpts {
    fn default() -> Self {
        BenchOpts {
            head_dims: vec![64, 128],
            seq_lens: vec![1024, 4096, 16384],
            tokens: 32768,
            hidden: 2048,
            warmup: 3,
            iters: 10,
            backward: true,
            sdpa: true,
            fox_refs: true,
            bundle: PathBuf::from(".device-bundle"),
            python: "python3".into(),
            json: None,
            seed: 0,
            device: 0,
            kv_group: 1,
            window: None,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchRow {
    /// "SDPA", "FoX", "FoX+ACP"
    pub kernel: String,
    pub d: usize,
    pub t: usize,
    pub b: usize,
    pub h: usize,
    /// "fwd" or "fwd+bwd"
    pub pass: String,
    pub ms: f64,
    pub tflops: f64,
    /// fraction of key tiles ACP skipped in the forward
    pub pruned: Option<f64>,
    /// k/v heads and window of the FoX rows (SDPA rows: multi-head, causal)
    pub kv_heads: usize,
    pub window: Option<usize>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub device: String,
    pub date: String,
    pub torch: Option<String>,
    pub sdpa_error: Option<String>,
    /// what the authors' / fla's kernels reported instead of a time (missing code, errors)
    pub ref_notes: Vec<String>,
    pub rows: Vec<BenchRow>,
}

fn flops(b: usize, h: usize, t: usize, d: usize, pass: &str) -> f64 {
    let f = 2.0 * (b * h) as f64 * (t as f64) * (t as f64) * d as f64;
    if pass == "fwd" {
        f
    } else {
        3.5 * f
    }
}

impl BenchReport {
    fn find(&self, kernel: &str, d: usize, t: usize, pass: &str) -> Option<&BenchRow> {
        self.rows.iter().find(|r| r.kernel == kernel && r.d == d && r.t == t && r.pass == pass)
    }

    /// Markdown table: one line per (D, T, pass), TFLOP/s of each kernel and the ratios to SDPA.
    pub fn table(&self) -> String {
        let mut s = format!("{} — {}\n\n", self.device, self.date);
        if let Some(t) = &self.torch {
            s += &format!("SDPA reference: PyTorch {t}\n\n");
        }
        if let Some(e) = &self.sdpa_error {
            s += &format!("SDPA reference not run: {e}\n\n");
        }
        for n in &self.ref_notes {
            s += &format!("{n}\n\n");
        }
        // the other FoX kernels' columns, when they ran
        let refs: Vec<&str> =
            ["authors FoX", "fla FoX"].into_iter().filter(|k| self.rows.iter().any(|r| r.kernel == *k)).collect();
        let ref_heads: String = refs.iter().map(|k| format!(" {k} TFLOP/s |")).collect();
        s += &format!(
            "| D | T | B×H | pass | SDPA TFLOP/s |{ref_heads} FoX TFLOP/s | FoX+ACP TFLOP/s | pruned | FoX/SDPA | FoX+ACP/SDPA |\n"
        );
        s += &format!("|---|---|---|---|---|{}---|---|---|---|---|\n", "---|".repeat(refs.len()));
        let mut keys: Vec<(usize, usize, String)> = self.rows.iter().map(|r| (r.d, r.t, r.pass.clone())).collect();
        keys.sort_by_key(|k| (k.0, k.2.clone(), k.1));
        keys.dedup();
        for (d, t, pass) in keys {
            let get = |k: &str| self.find(k, d, t, &pass);
            let any = get("FoX").or(get("SDPA")).unwrap();
            let f = |r: Option<&BenchRow>| r.map_or("—".to_string(), |r| format!("{:.0}", r.tflops));
            let ratio = |a: Option<&BenchRow>, b: Option<&BenchRow>| match (a, b) {
                (Some(a), Some(b)) => format!("{:.2}", a.tflops / b.tflops),
                _ => "—".into(),
            };
            let pr = get("FoX+ACP").and_then(|r| r.pruned).map_or("—".into(), |p| format!("{:.0}%", 100.0 * p));
            let ref_cells: String = refs.iter().map(|k| format!(" {} |", f(get(k)))).collect();
            s += &format!(
                "| {d} | {t} | {}×{} | {pass} | {} |{ref_cells} {} | {} | {pr} | {} | {} |\n",
                any.b,
                any.h,
                f(get("SDPA")),
                f(get("FoX")),
                f(get("FoX+ACP")),
                ratio(get("FoX"), get("SDPA")),
                ratio(get("FoX+ACP"), get("SDPA")),
            );
        }
        s
    }
}

fn today() -> String {
    // days since the epoch -> civil date (UTC), no extra dependency
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let z = (secs / 86400) as i64 + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let dd = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    format!("{y:04}-{m:02}-{dd:02}")
}

/// The rows of a reference script (`sdpa_reference.py` or `fox_references.py`): its header (the
/// PyTorch version and GPU) and the rows; per-kernel errors are returned as notes.
type ScriptRows = (Option<String>, Vec<BenchRow>, Vec<String>);

fn run_script(o: &BenchOpts, what: &str, script: &str, extra: &[String]) -> Result<ScriptRows> {
    let path = std::env::temp_dir().join(format!("foxlm-{what}-{}.py", std::process::id()));
    std::fs::write(&path, script)?;
    let join = |v: &[usize]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
    let mut cmd = std::process::Command::new(&o.python);
    cmd.arg(&path)
        .args(["--d", &join(&o.head_dims), "--t", &join(&o.seq_lens)])
        .args(["--tokens", &o.tokens.to_string(), "--hidden", &o.hidden.to_string()])
        .args(["--iters", &o.iters.to_string(), "--warmup", &o.warmup.to_string()])
        .args(extra);
    let out = cmd.output().with_context(|| format!("running {} for the {what} reference", o.python));
    let _ = std::fs::remove_file(&path);
    let out = out?;
    let (mut rows, mut notes, mut torch) = (Vec::new(), Vec::new(), None);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let v: serde_json::Value = match serde_json::from_str(line) {
            Ok(v) => v,
            Err(_) => continue,
        };
        let kernel = match v.get("kernel").and_then(|k| k.as_str()) {
            Some("authors") => "authors FoX",
            Some("fla") => "fla FoX",
            Some(other) => other,
            None => "SDPA",
        };
        if let Some(e) = v.get("error") {
            if v.get("kernel").is_none() {
                return Err(anyhow!("{what} script: {e}"));
            }
            let at = v.get("d").map_or(String::new(), |d| format!(" at D={d} T={}", v["t"]));
            notes.push(format!("{kernel} not timed{at}: {}", e.as_str().unwrap_or("?")));
            continue;
        }
        if let Some(t) = v.get("torch") {
            torch = Some(format!("{} on {}", t.as_str().unwrap_or("?"), v["gpu"].as_str().unwrap_or("?")));
            continue;
        }
        let g = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        let (d, t, b, h) = (g("d") as usize, g("t") as usize, g("b") as usize, g("h") as usize);
        for (pass, key) in [("fwd", "fwd_ms"), ("fwd+bwd", "fwdbwd_ms")] {
            let ms = g(key);
            if !ms.is_finite() {
                continue;
            }
            rows.push(BenchRow {
                kernel: kernel.into(),
                d,
                t,
                b,
                h,
                pass: pass.into(),
                ms,
                tflops: flops(b, h, t, d, pass) / (ms * 1e-3) / 1e12,
                pruned: None,
                kv_heads: h,
                window: None,
            });
        }
    }
    if rows.is_empty() && notes.is_empty() {
        return Err(anyhow!(
            "the {what} script printed no result (exit {:?}): {}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        ));
    }
    Ok((torch, rows, notes))
}

/// Run the benchmark; prints progress to stderr and returns the rows (also written as JSON when
/// `opts.json` is set).
pub fn run_attention_bench(opts: &BenchOpts) -> Result<BenchReport> {
    let gpu: Arc<Gpu> = Gpu::new(opts.device).context("the attention benchmark needs a CUDA GPU")?;
    let mut report = BenchReport {
        device: gpu.describe(),
        date: today(),
        torch: None,
        sdpa_error: None,
        ref_notes: Vec::new(),
        rows: Vec::new(),
    };
    eprintln!("attention bench on {}", report.device);
    if opts.sdpa {
        match run_script(opts, "SDPA", SDPA_SCRIPT, &[]) {
            Ok((torch, rows, _)) => {
                report.torch = torch;
                report.rows.extend(rows);
            }
            Err(e) => report.sdpa_error = Some(format!("{e:#}")),
        }
    }
    // the authors' and fla's kernels: multi-head, causal, no window (their rows compare with ours
    // only there)
    if opts.fox_refs && opts.kv_group == 1 && opts.window.is_none() {
        let dir = std::env::current_dir()?.join(&opts.bundle);
        let extra = [
            "--authors-src".to_string(),
            dir.join("authors/src").display().to_string(),
            "--wheels".to_string(),
            dir.join("wheels").display().to_string(),
        ];
        match run_script(opts, "FoX references", FOX_REFS_SCRIPT, &extra) {
            Ok((_, rows, notes)) => {
                report.rows.extend(rows);
                report.ref_notes.extend(notes);
            }
            Err(e) => report.ref_notes.push(format!("authors' and fla's kernels not run: {e:#}")),
        }
    }

    // Inputs: the same B·T·H·D elements for every shape, drawn once.
    let n = opts.tokens * opts.hidden;
    let mut rng = ChaCha8Rng::seed_from_u64(opts.seed ^ 0xf0c5);
    let seeds: Vec<u64> = (0..4).map(|_| rng.gen()).collect();
    let draw = |seed: u64| -> Vec<u16> {
        let chunk = 1 << 20;
        let mut v = vec![0u16; n];
        v.par_chunks_mut(chunk).enumerate().for_each(|(i, c)| {
            let mut r = ChaCha8Rng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9e3779b97f4a7c15));
            for x in c.iter_mut() {
                *x = half::bf16::from_f32(r.sample::<f32, _>(StandardNormal)).to_bits();
            }
        });
        v
    };
    let q = gpu.upload(&draw(seeds[0]))?;
    let k = gpu.upload(&draw(seeds[1]))?;
    let v = gpu.upload(&draw(seeds[2]))?;
    let dout = gpu.upload(&draw(seeds[3]))?;
    let o = gpu.zeros::<u16>(n)?;

    for &d in &opts.head_dims {
        for &t in &opts.seq_lens {
            if !opts.tokens.is_multiple_of(t) || !opts.hidden.is_multiple_of(d) {
                eprintln!("skipping D={d} T={t}: does not divide the token / hidden budget");
                continue;
            }
            let (b, h) = (opts.tokens / t, opts.hidden / d);
            if opts.kv_group == 0 || !h.is_multiple_of(opts.kv_group) {
                eprintln!("skipping D={d} T={t}: {h} heads do not split into groups of {}", opts.kv_group);
                continue;
            }
            let hkv = h / opts.kv_group;
            let aopts = AttnOptions { kv_heads: Some(hkv), window: opts.window };
            // mixed gates: c = cumsum(logsigmoid(bias_h + N(0,1)))
            let mut c = vec![0.0f32; b * h * t];
            c.par_chunks_mut(t).enumerate().for_each(|(bh, row)| {
                let hi = bh % h;
                let bias = if h > 1 { -1.0 + 10.0 * hi as f32 / (h - 1) as f32 } else { 4.0 };
                let mut r = ChaCha8Rng::seed_from_u64(opts.seed ^ (bh as u64 + 1) ^ ((t as u64) << 32));
                let mut acc = 0.0f32;
                for x in row.iter_mut() {
                    acc += fox_kernels::scalar::log_sigmoid(bias + r.sample::<f32, _>(StandardNormal));
                    *x = acc;
                }
            });
            let c_d = gpu.upload(&c)?;
            let mut lse = gpu.zeros::<f32>(b * h * t)?;
            let mut th = gpu.zeros::<f32>(b * h)?;
            let mut p = DevProblem {
                batch: b,
                heads: h,
                head_dim: d,
                tq: t,
                tk: t,
                q_pos0: 0,
                dtype: DType::Bf16,
                q: DevView::bthd(&q, t, h, d),
                k: DevView::bthd(&k, t, hkv, d),
                v: DevView::bthd(&v, t, hkv, d),
                cq: &c_d,
                ck: &c_d,
                vis: DevVisibility::All,
                scale: 1.0 / (d as f32).sqrt(),
                prune: None,
            };
            ga::acp_thresholds_from_norms(&gpu, &p, aopts, t, -10.0, &mut th)?;
            let mut grads = DevGrads::new(&gpu, &p, aopts)?;
            for acp in [false, true] {
                p.prune = if acp { Some(&th) } else { None };
                let name = if acp { "FoX+ACP" } else { "FoX" };
                let stats = ga::forward(&gpu, &p, aopts, &o, &mut lse, FwdKernel::Tiled, acp)?;
                let pruned = if acp { Some(stats.pruned_fraction()) } else { None };
                let ms = time_ms(&gpu, opts.warmup, opts.iters, || {
                    ga::forward(&gpu, &p, aopts, &o, &mut lse, FwdKernel::Tiled, false).map(|_| ())
                })?;
                let mut push = |pass: &str, ms: f64| {
                    let tf = flops(b, h, t, d, pass) / (ms * 1e-3) / 1e12;
                    eprintln!("  {name:8} D={d:3} T={t:5} {pass:8} {ms:9.3} ms {tf:7.1} TFLOP/s");
                    report.rows.push(BenchRow {
                        kernel: name.into(),
                        d,
                        t,
                        b,
                        h,
                        pass: pass.into(),
                        ms,
                        tflops: tf,
                        pruned,
                        kv_heads: hkv,
                        window: opts.window,
                    });
                };
                push("fwd", ms);
                if opts.backward {
                    let ms = time_ms(&gpu, opts.warmup, opts.iters, || {
                        ga::forward(&gpu, &p, aopts, &o, &mut lse, FwdKernel::Tiled, false)?;
                        ga::backward(&gpu, &p, aopts, &o, &dout, &lse, &mut grads)
                    })?;
                    push("fwd+bwd", ms);
                }
            }
        }
    }
    if let Some(path) = &opts.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(report)
}
