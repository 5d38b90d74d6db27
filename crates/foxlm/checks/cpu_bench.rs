//! CPU training throughput (`foxlm bench train --device cpu`, `examples/train_throughput`): full
//! optimizer steps as `foxlm train` runs them (`Engine::step_on`: forward, backward, clipping,
//! AdamW) on fixed token ids, the matmul GFLOP/s they reach, and beside every timed step the
//! `gemm` crate's own rate on square products, the reference they are compared with.
//!
//! Why the peak is sampled beside each step: on a shared machine the square-product rate moves
//! far more between runs seconds apart than the steps do (docs/kernel-notes.md), so a peak taken
//! once would decide the share. The share reported is the median over the steps of (the step's
//! GFLOP/s / the peak sampled right before it).

use anyhow::{Context, Result};
use fox_kernels::matmul::{peak_now, GemmReference};
use foxlm::config::Config;
use foxlm::engine::{CpuEngine, Engine as _};
use foxlm::model::Model;
use foxlm::optim::AdamW;
use foxlm::train::init_model;
use std::time::Instant;

/// Matmul FLOPs of one training step per token (forward + backward = 3 × forward): every Linear
/// (2·in·out each) including the output head, plus attention's QKᵀ and PV (2·2·T/2·d per layer
/// on average under the causal mask, fewer keys under a sliding window) or a Mamba-2 layer's recurrence (4·P·N per head).
pub fn matmul_flops_per_token(model: &Model, context: usize) -> f64 {
    let linear = model.linear_numel();
    let mixers: f64 = model
        .layers
        .iter()
        .map(|blk| match &blk.mixer {
            foxlm::model::Mixer::Attention(l) => 4.0 * mean_keys(context, l.window) * (l.heads * l.head_dim) as f64,
            // The recurrence: the state update and its read-out, 4·P·N per head.
            foxlm::model::Mixer::Mamba2(l) => {
                let s = l.sizes();
                4.0 * (s.heads * s.head_dim * s.state) as f64
            }
            // Mamba's selective scan: 4·Di·N per token.
            foxlm::model::Mixer::Mamba(l) => {
                let s = l.sizes();
                4.0 * (s.inner * s.state) as f64
            }
            // The delta rule: the state's read at k, its update and its read at q, 6·K·V per head.
            foxlm::model::Mixer::DeltaNet(l) => {
                let s = l.sizes();
                6.0 * (s.heads * s.head_k * s.head_v) as f64
            }
            // GLA: the state's decay (K·V), its update (2·K·V) and its read at q (2·K·V) per head.
            foxlm::model::Mixer::Hgrn2(l) => {
                let s = l.sizes();
                5.0 * (s.heads * s.head_dim * s.head_dim) as f64
            }
        })
        .sum();
    3.0 * (2.0 * linear as f64 + mixers)
}

/// Keys a query attends to, averaged over the T positions of a causal window: T/2 (as the
/// FLOP counts have always taken it) without a sliding window, else the mean of min(i + 1, w).
pub fn mean_keys(context: usize, window: Option<usize>) -> f64 {
    let t = context as f64;
    match window {
        Some(w) if w < context => {
            let w = w as f64;
            (w * (w + 1.0) / 2.0 + (t - w) * w) / t
        }
        _ => t / 2.0,
    }
}

/// One model's row.
#[derive(serde::Serialize, Clone, Debug)]
pub struct CpuTrainRow {
    pub name: String,
    pub batch: usize,
    pub context: usize,
    pub params_m: f64,
    pub threads: usize,
    /// The median step.
    pub step_s: f64,
    pub tokens_per_s: f64,
    pub matmul_gflops: f64,
    /// Median of the gemm peaks sampled before each timed step.
    pub gemm_peak_beside_gflops: f64,
    /// Median over the timed steps of (the step's matmul GFLOP/s / the peak sampled before it).
    pub share_of_peak: f64,
    pub step_s_all: Vec<f64>,
    /// Where the timed steps' time went, per kind of operation (milliseconds per step).
    pub profile: Vec<CpuProfileRow>,
}

/// One kind of operation's share of a step ([`foxlm::backend::Family`]).
#[derive(serde::Serialize, Clone, Debug)]
pub struct CpuProfileRow {
    pub family: String,
    pub ms_per_step: f64,
    pub ops_per_step: f64,
}

/// The median of `v` (the upper one of an even count), NaN-safe by `total_cmp`.
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `warmup` untimed steps, then `steps` timed ones (at least one), each after a peak sample.
/// `progress`: a line per step on stderr.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    name: &str,
    cfg: &Config,
    batch: usize,
    context: usize,
    warmup: usize,
    steps: usize,
    refs: &mut [GemmReference],
    progress: bool,
) -> Result<CpuTrainRow> {
    let n = batch.checked_mul(context).filter(|&n| n > 0).context("batch × context must be positive")?;
    // The activation sizes below are products of n with the model's widths: keep them in range.
    n.checked_mul(cfg.hidden_size.max(cfg.intermediate()).max(cfg.vocab_size))
        .and_then(|x| x.checked_mul(64 * (cfg.num_hidden_layers + 1)))
        .with_context(|| format!("a {batch} x {context} step is too large to plan"))?;
    // Ids below 50,000 (as the benchmark always used), or the vocabulary.
    let vocab = cfg.vocab_size.clamp(1, 50_000);
    // Parameters, gradients and AdamW's moments, then the step's activations, the head's logits
    // and the gemm scratch, against the machine's memory before they are allocated.
    foxlm::validate::check_memory(4 * cfg.param_bytes(), "the model's parameters, gradients and optimizer state")?;
    let mut model = init_model(cfg, 0);
    let mut plan = foxlm::model::MemoryPlan::default();
    foxlm::model::activation_plan(&model, batch, context, 4, false, &mut plan)?;
    let logits = n.saturating_mul(cfg.vocab_size).min(1 << 26) * 4;
    foxlm::validate::check_memory(
        (plan.total() + logits) as u128,
        &format!("the activations of a {batch} x {context} step"),
    )?;
    let mut opt = AdamW::new(Default::default(), &model.params);
    let mut engine = CpuEngine::new(&model, batch);
    let ids: Vec<u32> = (0..n).map(|i| ((i * 7919) % vocab) as u32).collect();
    let targets: Vec<Option<u32>> = ids.iter().map(|&i| Some(((i as usize * 31 + 7) % vocab) as u32)).collect();
    let batches = [foxlm::data::Batch { batch, seq: context, ids, targets }];
    let mut step = |engine: &mut CpuEngine, model: &mut Model| {
        engine.step_on(model, &mut opt, &batches, batch, 1.0, 1e-3).map(|_| ())
    };
    for i in 0..warmup {
        let t0 = Instant::now();
        step(&mut engine, &mut model)?;
        if progress {
            eprintln!("  warm-up step {}/{warmup}: {:.3} s", i + 1, t0.elapsed().as_secs_f64());
        }
    }
    let fpt = matmul_flops_per_token(&model, context);
    engine.start_profile();
    let (mut times, mut peaks, mut shares) = (vec![], vec![], vec![]);
    for i in 0..steps.max(1) {
        let peak = peak_now(refs);
        let t0 = Instant::now();
        step(&mut engine, &mut model)?;
        let dt = t0.elapsed().as_secs_f64();
        let gflops = fpt * n as f64 / dt / 1e9;
        if progress {
            eprintln!(
                "  step {}/{}: {dt:.3} s, {gflops:.1} GFLOP/s, gemm peak beside it {peak:.1} ({:.0}%)",
                i + 1,
                steps.max(1),
                100.0 * gflops / peak
            );
        }
        times.push(dt);
        peaks.push(peak);
        shares.push(gflops / peak);
    }
    let per_step = steps.max(1) as f64;
    let profile = engine
        .take_profile()
        .into_iter()
        .map(|(f, ms, n)| CpuProfileRow {
            family: format!("{f:?}"),
            ms_per_step: ms / per_step,
            ops_per_step: n as f64 / per_step,
        })
        .collect();
    let dt = median(&times);
    Ok(CpuTrainRow {
        name: name.into(),
        batch,
        context,
        params_m: model.params.numel() as f64 / 1e6,
        threads: rayon::current_num_threads(),
        step_s: dt,
        tokens_per_s: n as f64 / dt,
        matmul_gflops: fpt * n as f64 / dt / 1e9,
        gemm_peak_beside_gflops: median(&peaks),
        share_of_peak: median(&shares),
        step_s_all: times,
        profile,
    })
}

/// Where a row's steps went: each kind of operation's wall time per step and its share of the
/// mean step; what no operation timed (the model's glue, thread wake-ups) is the rest.
pub fn breakdown(r: &CpuTrainRow) -> String {
    let mean_ms = r.step_s_all.iter().sum::<f64>() / r.step_s_all.len().max(1) as f64 * 1e3;
    let mut s = format!("{} {} x {}, per step (mean {mean_ms:.1} ms):\n", r.name, r.batch, r.context);
    for p in &r.profile {
        s += &format!(
            "    {:<10} {:>9.1} ms {:>5.1}%  {:>5.0} ops\n",
            p.family,
            p.ms_per_step,
            100.0 * p.ms_per_step / mean_ms.max(1e-9),
            p.ops_per_step
        );
    }
    let rest = mean_ms - r.profile.iter().map(|p| p.ms_per_step).sum::<f64>();
    s += &format!("    {:<10} {:>9.1} ms {:>5.1}%\n", "(rest)", rest, 100.0 * rest / mean_ms.max(1e-9));
    s
}

/// The rows as a Markdown table.
pub fn table(rows: &[CpuTrainRow]) -> String {
    let mut s = String::from(
        "| model | batch x context | params | step (s) | tokens/s | matmul GFLOP/s | gemm peak beside the steps | % of peak |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        s += &format!(
            "| {} | {} x {} | {:.1}M | {:.3} | {:.0} | {:.1} | {:.1} | {:.0}% |\n",
            r.name,
            r.batch,
            r.context,
            r.params_m,
            r.step_s,
            r.tokens_per_s,
            r.matmul_gflops,
            r.gemm_peak_beside_gflops,
            100.0 * r.share_of_peak
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The FLOP count of the tiny preset by hand: its Linear weights (blocks and head) and the
    /// causal attention term.
    #[test]
    fn flops_per_token_count_the_linears_and_attention() {
        let cfg = foxlm::presets::tiny().model;
        let m = Model::new(&cfg);
        let linear: usize = m
            .params
            .tensors
            .iter()
            .zip(&m.params.names)
            .filter(|(t, n)| t.shape.len() == 2 && n.as_str() != "model.embeddings.weight")
            .map(|(t, _)| t.numel())
            .sum();
        let want = 3.0 * (2.0 * linear as f64 + 4.0 * 2.0 * 128.0 * 64.0);
        assert_eq!(matmul_flops_per_token(&m, 128), want);
        // The head alone is 2 · 64 · 50257 per token forward.
        assert!(linear >= 64 * 50257);
    }

    /// A measured row is self-consistent: tokens/s and GFLOP/s from the median step, a positive
    /// finite share and peak, one time per timed step. (The 64³ reference here is far below the
    /// machine's peak, so the share itself may exceed 1.)
    #[test]
    fn a_small_measurement_is_consistent() {
        let mut cfg = foxlm::presets::tiny().model;
        cfg.vocab_size = 1000;
        let mut refs = vec![GemmReference::new(64)];
        let r = measure("t", &cfg, 2, 16, 1, 3, &mut refs, false).unwrap();
        assert_eq!(r.step_s_all.len(), 3);
        assert!((r.tokens_per_s - 32.0 / r.step_s).abs() < 1e-6 * r.tokens_per_s);
        let g = matmul_flops_per_token(&Model::new(&cfg), 16) * 32.0 / r.step_s / 1e9;
        assert!((r.matmul_gflops - g).abs() < 1e-9 * g);
        assert!(r.share_of_peak.is_finite() && r.share_of_peak > 0.0, "share {}", r.share_of_peak);
        assert!(r.gemm_peak_beside_gflops.is_finite() && r.gemm_peak_beside_gflops > 0.0);
        // The breakdown: the products, attention, the head, the optimizer and the small ops each
        // took time, once per timed step for the head and the optimizer's three phases; together
        // no more than the steps.
        let fam =
            |f: &str| r.profile.iter().find(|p| p.family == f).unwrap_or_else(|| panic!("no {f} in {:?}", r.profile));
        for f in ["Gemm", "Attention", "Head", "Optimizer", "Other"] {
            assert!(fam(f).ms_per_step > 0.0, "{f}: {:?}", fam(f));
        }
        assert_eq!((fam("Head").ops_per_step, fam("Optimizer").ops_per_step), (1.0, 3.0));
        // Each block's Linear weights once forward and once backward.
        let m = Model::new(&cfg);
        let names = m.params.names.iter().zip(&m.params.tensors);
        let linears = names.filter(|(n, t)| n.starts_with("model.layers.") && t.shape.len() == 2).count();
        assert_eq!(fam("Gemm").ops_per_step, 2.0 * linears as f64, "{:?}", fam("Gemm"));
        let timed: f64 = r.profile.iter().map(|p| p.ms_per_step).sum();
        assert!(timed <= r.step_s_all.iter().sum::<f64>() / 3.0 * 1e3 * 1.0001, "{timed} ms timed");
        assert!(breakdown(&r).contains("Optimizer"));
        assert!(measure("t", &cfg, 0, 16, 0, 1, &mut refs, false).is_err());
    }
}
