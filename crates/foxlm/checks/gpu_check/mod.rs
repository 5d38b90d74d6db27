//! The whole model on the GPU against the CPU reference, on the seven fixture models and four
//! with grouped-query attention, sliding windows and ACP ([`gqa_window_models`]): logits,
//! left-padded logits, loss and every parameter's gradient, in f32 and in bf16, and the ACP
//! thresholds. Rows of the GPU check's pass/fail table (`foxlm gpu-check`, bench/gpu_check.sh,
//! tests/gpu_model.rs).
//!
//! Tolerances (issue 10): f32 logits within 1e-3 absolute and every gradient within 1e-3 of its
//! largest entry (the GPU sums in other orders, and cuBLASLt's f32 GEMM is not the gemm crate's);
//! bf16 loss within 2e-2 and logits RMS error at most 0.04, about 3x the 0.011-0.013 RMS that the
//! authors' bf16 attention kernel alone shows on these fixtures (fixtures README).

use anyhow::{Context, Result};
use fox_checks::check::CheckRow;
use fox_kernels::cuda::{Elem, Gpu};
use foxlm::backend::cuda::Cuda;
use foxlm::backend::{Alloc, Backend, BatchInfo};
use foxlm::checkpoint::load_model;
use foxlm::model::{Acts, Ctx, Model, ModelActs, Scratch};
use safetensors::SafeTensors;
use std::path::Path;
use std::sync::Arc;

mod command;
pub mod dist;
pub mod hgrn2;
pub mod infer;
pub mod serve;
pub use command::run;

pub use foxlm::presets::OFFICIAL_FIXTURES as VARIANTS;

/// Logits [B·T, V] of the model on the GPU with activations in T.
pub fn gpu_logits<T: Elem>(gpu: &Arc<Gpu>, model: &Model, ids: &[u32], ctx: &Ctx) -> Result<Vec<f32>> {
    let (mut be, acts) = gpu_forward::<T>(gpu, model, ids, ctx, false)?;
    let rows = ctx.batch * ctx.seq;
    let mut logits = be.alloc_f32(rows * model.config.vocab_size)?;
    be.linear_fwd_f32(&mut logits, &acts.final_out, &model.lm_head, rows)?;
    gpu.download(&logits)
}

/// A backend for ctx's [B, T] (`train`: with gradient buffers) and its batch of `ids` and `targets`.
fn gpu_batch<T: Elem>(
    gpu: &Arc<Gpu>,
    model: &Model,
    ids: &[u32],
    targets: Option<&[Option<u32>]>,
    ctx: &Ctx,
    train: bool,
) -> Result<(Cuda<T>, <Cuda<T> as Backend>::Batch)> {
    let (b, t) = (ctx.batch, ctx.seq);
    let mut be = Cuda::<T>::new(gpu.clone(), model, b, t, train)?;
    let mut batch = be.new_batch(b * t, b)?;
    be.prepare(&mut batch, &BatchInfo { batch: b, seq: t, start: ctx.start.as_deref(), past: 0 }, ids, targets)?;
    Ok((be, batch))
}

/// A forward of the inference backend, its activations every block's when `keep` (ModelActs::new).
fn gpu_forward<T: Elem>(
    gpu: &Arc<Gpu>,
    model: &Model,
    ids: &[u32],
    ctx: &Ctx,
    keep: bool,
) -> Result<(Cuda<T>, Acts<Cuda<T>>)> {
    let (mut be, batch) = gpu_batch::<T>(gpu, model, ids, None, ctx, false)?;
    let mut acts = ModelActs::new(&be, model, ctx.batch, ctx.seq, keep)?;
    model.forward_on(&mut be, &batch, &mut acts, None)?;
    Ok((be, acts))
}

/// Mean loss over the targets and every parameter's gradient of it, on the GPU.
pub fn gpu_loss_and_grads<T: Elem>(
    gpu: &Arc<Gpu>,
    model: &Model,
    ids: &[u32],
    targets: &[Option<u32>],
    ctx: &Ctx,
) -> Result<(f64, Vec<Vec<f32>>)> {
    gpu_loss_and_grads_with::<T>(gpu, model, ids, targets, ctx, false)
}

/// [`gpu_loss_and_grads`], optionally with per-block recomputation.
pub fn gpu_loss_and_grads_with<T: Elem>(
    gpu: &Arc<Gpu>,
    model: &Model,
    ids: &[u32],
    targets: &[Option<u32>],
    ctx: &Ctx,
    recompute: bool,
) -> Result<(f64, Vec<Vec<f32>>)> {
    let (b, t) = (ctx.batch, ctx.seq);
    let n_targets = targets.iter().filter(|t| t.is_some()).count().max(1);
    let (mut be, batch) = gpu_batch::<T>(gpu, model, ids, Some(targets), ctx, true)?;
    let mut acts =
        if recompute { ModelActs::recompute(&be, model, b, t)? } else { ModelActs::new(&be, model, b, t, true)? };
    let mut scratch = Scratch::new(&be, model, b, t)?;
    be.zero_grads()?;
    model.loss_and_grads_on(&mut be, &batch, &mut acts, &mut scratch, 1.0 / n_targets as f32)?;
    let (sum, n) = be.take_loss()?;
    let mut grads = model.params.zeros_like();
    be.download_grads(&mut grads)?;
    Ok((sum / n.max(1) as f64, grads))
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs() as f64).fold(0.0, f64::max)
}

fn rms_diff(a: &[f32], b: &[f32]) -> f64 {
    (a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>() / a.len().max(1) as f64).sqrt()
}

fn row(case: String, metric: &str, err: f64, tol: f64, note: String) -> CheckRow {
    CheckRow { case, metric: metric.into(), err, tol, pass: err.is_finite() && err <= tol, note }
}

fn input_ids(dir: &Path) -> Result<(usize, usize, Vec<u32>, Vec<usize>)> {
    let path = dir.join("expected.safetensors");
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes).with_context(|| format!("parsing {}", path.display()))?;
    let get = |name: &str| -> Result<(Vec<usize>, Vec<i64>)> {
        let t = st.tensor(name).with_context(|| format!("{}: no tensor {name}", path.display()))?;
        let v = t.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect();
        Ok((t.shape().to_vec(), v))
    };
    let (shape, ids) = get("input_ids")?;
    let (_, mask) = get("attention_mask_left_padded")?;
    let (b, t) = (shape[0], shape[1]);
    let start = (0..b).map(|r| mask[r * t..(r + 1) * t].iter().take_while(|&&m| m == 0).count()).collect();
    Ok((b, t, ids.iter().map(|&x| x as u32).collect(), start))
}

/// Whether the check of model `name` runs under `--models` (none: every model).
pub fn wanted(models: Option<&str>, name: &str) -> bool {
    models.is_none_or(|m| name.contains(m))
}

/// Every fixture under `fixtures` (the folders named in [`VARIANTS`]) in f32 and bf16, and the
/// other check models; only those whose names contain `models` when given.
pub fn run_fixture_checks(gpu: &Arc<Gpu>, fixtures: &Path, models: Option<&str>) -> Result<Vec<CheckRow>> {
    let mut rows = Vec::new();
    for v in VARIANTS.into_iter().filter(|v| wanted(models, v)) {
        let dir = fixtures.join(v);
        let model = load_model(&dir)?;
        let (b, t, ids, start) = input_ids(&dir)?;
        rows.extend(model_rows(gpu, v, &model, b, t, &ids, &start)?);
    }
    // Grouped-query attention, sliding windows and ACP: the fast bf16 kernels (head dim 64) and
    // the f32 kernel (head dim 16, also for bf16), each against the CPU model; with ACP also the
    // thresholds themselves, and that the CPU prunes at all (else the ACP rows prove nothing).
    for m in gqa_window_models()?.into_iter().filter(|m| wanted(models, &m.name)) {
        rows.extend(model_rows(gpu, &m.name, &m.model, m.b, m.t, &m.ids, &m.start)?);
        if m.model.config.log_pruning_tolerance.is_some() {
            rows.extend(acp_rows(gpu, &m)?);
        }
    }
    // The recurrent families: the same rows (f32 and bf16 logits, left padding, loss, gradients).
    for m in recurrent_models(fixtures)?.into_iter().filter(|m| wanted(models, &m.name)) {
        rows.extend(model_rows(gpu, &m.name, &m.model, m.b, m.t, &m.ids, &m.start)?);
    }
    for m in deltanet_models()?.into_iter().chain(hgrn2::models(fixtures)?).filter(|m| wanted(models, &m.name)) {
        rows.extend(model_rows(gpu, &m.name, &m.model, m.b, m.t, &m.ids, &m.start)?);
    }
    Ok(rows)
}

/// The input ids [b, t] of a recurrent fixture's expected.safetensors.
fn fixture_ids(dir: &Path) -> Result<(usize, usize, Vec<u32>)> {
    let path = dir.join("expected.safetensors");
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes).with_context(|| format!("parsing {}", path.display()))?;
    let x = st.tensor("input_ids").with_context(|| format!("{}: no tensor input_ids", path.display()))?;
    anyhow::ensure!(x.shape().len() == 2 && x.shape()[0] >= 2, "{}: input_ids is not [b ≥ 2, t]", path.display());
    let ids = x.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as u32).collect();
    Ok((x.shape()[0], x.shape()[1], ids))
}

/// The recurrent models of the GPU check: the authors' Mamba-2 and Samba fixtures
/// (official-mamba2-tiny, official-samba-tiny beside `fixtures`: Mamba-2 P = 32, N = 16; Samba
/// N = 16, attention window 16; their 2 × 96 ids); a Mamba-2 at the paper's head shape (P = 64,
/// N = 128: the kernels' full tiles; 4 heads, d = 128) and a Samba with attention heads of 64
/// (the fast kernels and CUDA graphs; d = 128, 4 layers, window 64), each over 2 × 200 positions
/// (four chunks of 64, the last partial), initialised as for training. Row 1 of each is
/// left-padded by 30.
pub fn recurrent_models(fixtures: &Path) -> Result<Vec<CheckModel>> {
    let root = fixtures.parent().unwrap_or(fixtures);
    let mut out = CheckModel::from_fixtures(
        root,
        &[("mamba2 fixture", "official-mamba2-tiny/mamba2"), ("samba fixture", "official-samba-tiny/samba")],
    )?;
    let mut m2 = load_model(&root.join("official-mamba2-tiny/mamba2"))?.config;
    (m2.hidden_size, m2.num_heads, m2.ssm_head_dim, m2.state_size) = (128, 4, Some(64), Some(128));
    out.push(CheckModel::initialised("mamba2 P=64 N=128", m2)?);
    let sb = foxlm::presets::samba_config(128, 4, 2, 64);
    out.push(CheckModel::initialised("samba d=128 attention heads of 64 window=64", sb)?);
    Ok(out)
}

/// The DeltaNet models of the GPU check, initialised as for training, vocabulary 512: fla's
/// fixtures' heads (fla-deltanet-tiny: DeltaNet d = 32 with 2 heads of 16, Gated DeltaNet d = 32
/// with keys of 8 and values of 16 and the output gate; the kernels' narrowest tiles, padded),
/// a DeltaNet with heads of 128 (d = 256, 2 heads: the widest tiles) and a Gated DeltaNet with
/// heads of 64 (d = 256, 4 heads), each over 2 × 200 positions (four chunks of 64, the last
/// partial); row 1 of each left-padded by 30.
///
/// fla's fixtures themselves (their weights far from initial values: matrices N(0, 1/fan_in))
/// pass every f32 row but not all of the bf16 rows, whose tolerances were set on FoX's fixtures
/// (the Gated DeltaNet's gradients, per-position evaluation loss and served log-probabilities;
/// docs/kernel-notes.md). That is bf16 activations on those models, not the delta rule's
/// tensor-core products: decoding them one position per step (the delta rule in f32 on an f32
/// state) differs from the CPU as much.
pub fn deltanet_models() -> Result<Vec<CheckModel>> {
    let mut out = Vec::new();
    for (name, d, heads, gated) in [
        ("deltanet d=32 heads of 16", 32, 2, false),
        ("gated deltanet d=32 keys of 8 values of 16", 32, 2, true),
        ("deltanet d=256 heads of 128", 256, 2, false),
        ("gated deltanet d=256 heads of 64", 256, 4, true),
    ] {
        let mut cfg = foxlm::presets::deltanet_config(d, 2, heads, gated);
        if d == 32 && gated {
            (cfg.ssm_head_dim, cfg.expand_v) = (Some(8), Some(2.0));
        }
        out.push(CheckModel::initialised(name, cfg)?);
    }
    Ok(out)
}

/// A model of the grouped-query attention, window and ACP rows (none has a fixture), with its
/// batch: ids [b, t] and the left padding of the padded rows.
pub struct CheckModel {
    pub name: String,
    pub model: Model,
    pub b: usize,
    pub t: usize,
    pub ids: Vec<u32>,
    pub start: Vec<usize>,
}

impl CheckModel {
    /// The fixtures' models under `root` (name, folder), each on its own ids with row 1
    /// left-padded by 30.
    pub fn from_fixtures(root: &Path, list: &[(&str, &str)]) -> Result<Vec<CheckModel>> {
        list.iter()
            .map(|&(name, dir)| {
                let dir = root.join(dir);
                let model = load_model(&dir)?;
                let (b, t, ids) = fixture_ids(&dir)?;
                Ok(CheckModel { name: name.into(), model, b, t, ids, start: vec![0, 30] })
            })
            .collect()
    }

    /// A model of `cfg` with vocabulary 512 and no BOS/EOS, initialised as for training (seed 11),
    /// over 2 × 200 positions (four chunks of 64, the last partial), row 1 left-padded by 30.
    pub fn initialised(name: &str, mut cfg: foxlm::config::Config) -> Result<CheckModel> {
        cfg.vocab_size = 512;
        (cfg.bos_token_id, cfg.eos_token_id) = (None, None);
        cfg.validate()?;
        let t = 200;
        let ids = (0..2 * t).map(|i| ((i * 7919 + 13) % 512) as u32).collect();
        Ok(CheckModel {
            name: name.into(),
            model: foxlm::train::init_model(&cfg, 11),
            b: 2,
            t,
            ids,
            start: vec![0, 30],
        })
    }
}

/// Forget-gate bias of the slow heads of [`gqa_window_models`]: σ(5) = 0.9933, so a key 120
/// positions back keeps e^-0.8 of its weight.
const SLOW_GATE_BIAS: f32 = 5.0;

/// The GQA / window / ACP models: FoxPro (QK-norm, KV-shift, output norm and gate) with
/// d 128, 2 heads of 64, H_kv 1, window 37 (the fast kernels); d 64, 4 heads of 16, H_kv 2,
/// window 20 (the f32 kernel); d 256, 4 heads of 64, H_kv 2, window 120 with ACP (U from the
/// QK-norm weights); and FoxLlama d 256, 4 heads of 64, H_kv 2 with ACP (U from q and k norms).
///
/// Initialised weights, except that every other head forgets slowly (forget-gate bias
/// [`SLOW_GATE_BIAS`], the others stay at 0: log f ≈ −0.69 per position): with every gate at
/// σ(0) no key past about 20 positions carries weight, so a window changes nothing (measured:
/// logits identical with and without it) and a window bug could not show; the fast heads are the
/// ones ACP prunes. QK-norm weights differ by head (1 + 0.25·head, varied per channel), so the
/// ACP bound differs by head and a wrong k_norm head shows in the thresholds.
pub fn gqa_window_models() -> Result<Vec<CheckModel>> {
    use foxlm::presets::Variant;
    let specs = [
        (Variant::FoxPro, 128, 2, 1, Some(37), None, 150),
        (Variant::FoxPro, 64, 4, 2, Some(20), None, 150),
        (Variant::FoxPro, 256, 4, 2, Some(120), Some(-10.0), 300),
        (Variant::FoxLlama, 256, 4, 2, None, Some(-10.0), 300),
    ];
    let mut out = Vec::new();
    for (variant, d, heads, kv, window, acp, t) in specs {
        let mut cfg = variant.config(d, 2, heads);
        cfg.vocab_size = 512;
        (cfg.bos_token_id, cfg.eos_token_id) = (Some(511), Some(511));
        cfg.num_kv_heads = Some(kv);
        cfg.window_size = window;
        cfg.log_pruning_tolerance = acp;
        cfg.validate()?;
        let mut model = foxlm::train::init_model(&cfg, 11);
        let hd = cfg.head_dim();
        for (i, name) in model.params.names.clone().iter().enumerate() {
            let data = &mut model.params.tensors[i].data;
            if name.ends_with("fgate_proj.bias") || name.ends_with(".fgate_bias") {
                for (h, x) in data.iter_mut().enumerate() {
                    *x = if h % 2 == 0 { SLOW_GATE_BIAS } else { 0.0 };
                }
            } else if name.ends_with("q_norm.weight") || name.ends_with("k_norm.weight") {
                for (i, x) in data.iter_mut().enumerate() {
                    *x = (1.0 + 0.25 * (i / hd) as f32) * (0.8 + 0.2 * ((i * 37 % 101) as f32 / 101.0));
                }
            }
        }
        let b = 2;
        let ids: Vec<u32> = (0..b * t).map(|i| ((i * 7919 + 13) % 512) as u32).collect();
        let mut name = format!("d={d} H={heads} H_kv={kv}");
        if let Some(w) = window {
            name += &format!(" window={w}");
        }
        if acp.is_some() {
            name += if cfg.qk_norm { " ACP (QK-norm bound)" } else { " ACP (norm bound)" };
        }
        out.push(CheckModel { name, model, b, t, ids, start: vec![0, 30] });
    }
    Ok(out)
}

/// Every layer's ACP thresholds δ [B·H] of a forward on the GPU with activations in T.
fn gpu_thresholds<T: Elem>(gpu: &Arc<Gpu>, model: &Model, ids: &[u32], ctx: &Ctx) -> Result<Vec<Vec<f32>>> {
    let (_be, acts) = gpu_forward::<T>(gpu, model, ids, ctx, true)?;
    acts.blocks
        .iter()
        .map(|blk| gpu.download(blk.attn().and_then(|a| a.prune.as_ref()).context("a layer without ACP thresholds")?))
        .collect()
}

/// ACP rows of a model with `log_pruning_tolerance`: the CPU must prune some key tiles, and the
/// GPU's thresholds must be the CPU's: exactly (up to rounding) from QK-norm weights and from f32
/// q and k; within 0.1 from bf16 q and k (|Δδ| = 2|ΔU|, and U = scale·max|q|·max|k| moves with
/// the bf16 forward's error, about 1% of a norm).
fn acp_rows(gpu: &Arc<Gpu>, m: &CheckModel) -> Result<Vec<CheckRow>> {
    let v = &m.name;
    // Unpadded: the kernels leave padded rows out of the norm bound, the CPU does not.
    let ctx = Ctx { batch: m.b, seq: m.t, start: None };
    let (_, acts) = m.model.forward_hidden(&m.ids, &ctx, None, true);
    let acts = acts.context("the CPU forward kept no activations")?;
    let (pruned, visited): (usize, usize) = acts
        .blocks
        .iter()
        .filter_map(|blk| blk.attn())
        .fold((0, 0), |(p, s), a| (p + a.tiles_pruned, s + a.tiles_visited));
    let mut rows = vec![row(
        format!("{v} CPU"),
        "ACP prunes no key tile (1: the ACP rows prove nothing)",
        if pruned > 0 { 0.0 } else { 1.0 },
        0.0,
        format!("{pruned} of {} key tiles pruned", pruned + visited),
    )];
    let cpu: Vec<Vec<f32>> =
        acts.blocks.iter().map(|blk| blk.attn().and_then(|a| a.prune.clone()).unwrap_or_default()).collect();
    let qk = m.model.config.qk_norm;
    for (dtype, gpu_th) in [
        ("f32", gpu_thresholds::<f32>(gpu, &m.model, &m.ids, &ctx)?),
        ("bf16", gpu_thresholds::<half::bf16>(gpu, &m.model, &m.ids, &ctx)?),
    ] {
        let mut err = if gpu_th.len() == cpu.len() { 0.0f64 } else { f64::INFINITY };
        for (g, c) in gpu_th.iter().zip(&cpu) {
            err = if g.len() >= c.len() && !c.is_empty() {
                err.max(max_abs_diff(&g[..c.len()], c))
            } else {
                f64::INFINITY
            };
        }
        let tol = if qk || dtype == "f32" { 1e-4 } else { 0.1 };
        let range =
            cpu.iter().flatten().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        rows.push(row(
            format!("{v} {dtype}"),
            "ACP thresholds max |Δ| vs CPU",
            err,
            tol,
            format!("CPU δ in [{:.3}, {:.3}]", range.0, range.1),
        ));
    }
    Ok(rows)
}

/// Logits (also left-padded), loss and gradients of `model` on ids [b, t] on the GPU in f32 and
/// bf16 against the CPU.
fn model_rows(
    gpu: &Arc<Gpu>,
    v: &str,
    model: &Model,
    b: usize,
    t: usize,
    ids: &[u32],
    start: &[usize],
) -> Result<Vec<CheckRow>> {
    let mut rows = Vec::new();
    let ctx = Ctx { batch: b, seq: t, start: None };
    let pctx = Ctx { batch: b, seq: t, start: Some(start.to_vec()) };
    let vocab = model.config.vocab_size;
    let targets: Vec<Option<u32>> = (0..b * t).map(|i| if i % t + 1 < t { Some(ids[i + 1]) } else { None }).collect();
    let cpu_logits = model.forward(ids, &ctx);
    let cpu_padded = model.forward(ids, &pctx);
    let mut cpu_grads = model.params.zeros_like();
    let cpu_loss = model.loss_and_grads(ids, &targets, &ctx, &mut cpu_grads, 1.0) as f64;
    let unmasked = |l: &[f32]| -> Vec<f32> {
        (0..b)
            .flat_map(|r| (start[r]..t).flat_map(move |i| (0..vocab).map(move |c| (r * t + i) * vocab + c)))
            .map(|i| l[i])
            .collect()
    };

    // f32 on the GPU: the CPU's numbers up to summation order.
    let l32 = gpu_logits::<f32>(gpu, model, ids, &ctx)?;
    rows.push(row(format!("{v} f32"), "logits max |Δ| vs CPU", max_abs_diff(&l32, &cpu_logits), 1e-3, String::new()));
    let p32 = gpu_logits::<f32>(gpu, model, ids, &pctx)?;
    rows.push(row(
        format!("{v} f32 left-padded"),
        "logits max |Δ| (unmasked)",
        max_abs_diff(&unmasked(&p32), &unmasked(&cpu_padded)),
        1e-3,
        String::new(),
    ));
    let (loss32, g32) = gpu_loss_and_grads::<f32>(gpu, model, ids, &targets, &ctx)?;
    rows.push(row(format!("{v} f32"), "loss |Δ| vs CPU", (loss32 - cpu_loss).abs(), 1e-4, format!("loss {loss32:.5}")));
    let (mut worst, mut worst_name) = (0.0f64, String::new());
    for (i, (g, c)) in g32.iter().zip(&cpu_grads).enumerate() {
        let scale = c.iter().fold(0.0f32, |m, x| m.max(x.abs())) as f64;
        if scale == 0.0 {
            continue;
        }
        let e = max_abs_diff(g, c) / scale;
        if e > worst {
            (worst, worst_name) = (e, model.params.names[i].clone());
        }
    }
    rows.push(row(format!("{v} f32"), "grads max |Δ|/max|g| (worst)", worst, 1e-3, worst_name));

    // bf16 on the GPU: the training precision.
    let l16 = gpu_logits::<half::bf16>(gpu, model, ids, &ctx)?;
    rows.push(row(
        format!("{v} bf16"),
        "logits RMS error vs CPU",
        rms_diff(&l16, &cpu_logits),
        0.04,
        format!("max {:.3}", max_abs_diff(&l16, &cpu_logits)),
    ));
    let (loss16, g16) = gpu_loss_and_grads::<half::bf16>(gpu, model, ids, &targets, &ctx)?;
    rows.push(row(
        format!("{v} bf16"),
        "loss |Δ| vs CPU",
        (loss16 - cpu_loss).abs(),
        2e-2,
        format!("loss {loss16:.5}"),
    ));
    let cos = {
        let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
        for (g, c) in g16.iter().zip(&cpu_grads) {
            for (x, y) in g.iter().zip(c) {
                dot += *x as f64 * *y as f64;
                na += (*x as f64).powi(2);
                nb += (*y as f64).powi(2);
            }
        }
        dot / (na.sqrt() * nb.sqrt()).max(1e-30)
    };
    // bf16 gradients: the direction matters to the optimizer; 2% off in cosine is loose
    // for bf16 activations on a model this small.
    rows.push(row(format!("{v} bf16"), "grads 1 - cosine vs CPU", 1.0 - cos, 2e-2, String::new()));
    Ok(rows)
}

/// Training on the GPU against the CPU: a small FoX (Pro) (d = 128, 2 heads of 64, so the fast
/// bf16 attention kernels run) for `steps` steps on the Moby-Dick sample in `sample`; bf16 on the
/// GPU must end within 0.05 nats of f32 on the CPU (final training and validation loss). Then the
/// GPU run is stopped half-way and resumed on the GPU (the loss trajectory must continue: same
/// losses, up to 1e-5) and on the CPU (a GPU checkpoint must resume there).
/// The training checks' dataset (the sample, prepared once into `work`/data).
pub fn check_data(sample: &Path, work: &Path) -> Result<std::path::PathBuf> {
    use foxlm::data::{prepare, PrepareOptions};
    let data = work.join("data");
    if !data.join(foxlm::data::MANIFEST_FILE).exists() {
        prepare(&[sample.to_path_buf()], &data, &PrepareOptions { progress: false, ..Default::default() })?;
    }
    Ok(data)
}

/// The training checks' run: a FoX (Pro) with d = 128, 2 layers, head dim 64, for `steps` steps
/// of the tiny preset's batch.
pub fn check_run(steps: u64) -> foxlm::train::RunConfig {
    let p = foxlm::presets::tiny();
    let mut run = foxlm::train::RunConfig { model: foxlm::presets::Variant::FoxPro.config(128, 2, 2), train: p.train };
    run.train.total_tokens = steps * run.train.tokens_per_step();
    // A long warm-up to a moderate peak: the tiny preset's 1e-2 reached in 15 steps gives a loss
    // spike that amplifies summation-order differences, so that f32 on the GPU and on the CPU
    // end far apart though one step's gradients agree (docs/kernel-notes.md).
    run.train.warmup_tokens = (steps / 3).max(1) * run.train.tokens_per_step();
    run.train.eval_every = 0;
    run.train.peak_lr = 2e-3;
    run.train.min_lr = 3e-4;
    run.train.checkpoint_every = 0;
    run
}

pub fn run_training_checks(sample: &Path, work: &Path, steps: u64) -> Result<Vec<CheckRow>> {
    use foxlm::backend::DeviceArg;
    use foxlm::backend::Dtype;
    use foxlm::train::{train, TrainOptions};
    let mut rows = Vec::new();
    let data = check_data(sample, work)?;
    let run = check_run(steps);
    let opts = |out: &str, device: DeviceArg, dtype: Option<Dtype>| TrainOptions {
        data: data.clone(),
        out: work.join(out),
        resume: false,
        progress: false,
        stop_after: None,
        verbose: false,
        device,
        dtype,
        recompute: false,
        dist: None,
        init_from: None,
        tensorboard: None,
    };
    for d in ["cpu", "gpu", "gpu32", "gpu-stop", "cpu-resume"] {
        let _ = std::fs::remove_dir_all(work.join(d));
    }
    // One step of the training model (fast bf16 attention kernels at head dim 64) vs the CPU.
    {
        let model = foxlm::train::init_model(&run.model, 1);
        let (b, t) = (4, 256);
        let ids: Vec<u32> = (0..b * t).map(|i| ((i * 7919 + 13) % 50000) as u32).collect();
        let targets: Vec<Option<u32>> =
            (0..b * t).map(|i| if i % t + 1 < t { Some(ids[i + 1]) } else { None }).collect();
        let ctx = Ctx { batch: b, seq: t, start: None };
        let mut cg = model.params.zeros_like();
        let cl = model.loss_and_grads(&ids, &targets, &ctx, &mut cg, 1.0) as f64;
        let gpu = Gpu::new(0)?;
        // Recomputation must change nothing: same kernels on the same inputs.
        let (l0, g0) = gpu_loss_and_grads::<half::bf16>(&gpu, &model, &ids, &targets, &ctx)?;
        let (l1, g1) = gpu_loss_and_grads_with::<half::bf16>(&gpu, &model, &ids, &targets, &ctx, true)?;
        let diff = g0.iter().zip(&g1).map(|(a, c)| max_abs_diff(a, c)).fold((l0 - l1).abs(), f64::max);
        rows.push(row(
            format!("d=128, head dim 64, {b}x{t} (bf16)"),
            "recompute vs keep: max |Δ| loss, grads",
            diff,
            0.0,
            if diff == 0.0 { "bitwise".into() } else { String::new() },
        ));
        for (name, (gl, gg)) in [
            ("f32", gpu_loss_and_grads::<f32>(&gpu, &model, &ids, &targets, &ctx)?),
            ("bf16", gpu_loss_and_grads::<half::bf16>(&gpu, &model, &ids, &targets, &ctx)?),
        ] {
            let (mut worst, mut wname) = (0.0f64, String::new());
            for (i, (g, c)) in gg.iter().zip(&cg).enumerate() {
                let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
                for (x, y) in g.iter().zip(c) {
                    dot += *x as f64 * *y as f64;
                    na += (*x as f64).powi(2);
                    nb += (*y as f64).powi(2);
                }
                if nb > 0.0 {
                    let e = 1.0 - dot / (na.sqrt() * nb.sqrt()).max(1e-30);
                    if e > worst {
                        (worst, wname) = (e, model.params.names[i].clone());
                    }
                }
            }
            let tol = if name == "f32" { 1e-6 } else { 1e-2 };
            let case = format!("d=128, head dim 64, {b}x{t} ({name})");
            rows.push(row(
                case.clone(),
                "loss |Δ| vs CPU",
                (gl - cl).abs(),
                if name == "f32" { 1e-4 } else { 2e-2 },
                format!("{gl:.5} vs {cl:.5}"),
            ));
            rows.push(row(case, "worst parameter 1 - cosine", worst, tol, wname));
        }
    }
    let t0 = std::time::Instant::now();
    let gpu32 = train(Some(run.clone()), &opts("gpu32", DeviceArg::Cuda(0), Some(Dtype::F32)))?;
    let t_gpu32 = t0.elapsed().as_secs_f64();
    let t0 = std::time::Instant::now();
    let cpu = train(Some(run.clone()), &opts("cpu", DeviceArg::Cpu, None))?;
    let t_cpu = t0.elapsed().as_secs_f64();
    let t0 = std::time::Instant::now();
    let gpu = train(Some(run.clone()), &opts("gpu", DeviceArg::Cuda(0), Some(Dtype::Bf16)))?;
    let t_gpu = t0.elapsed().as_secs_f64();
    let (lc, lg) = (cpu.last_train_loss.unwrap_or(f64::NAN), gpu.last_train_loss.unwrap_or(f64::NAN));
    let case = format!("train {steps} steps, bf16 GPU vs f32 CPU");
    rows.push(row(case.clone(), "final train loss |Δ|", (lg - lc).abs(), 0.05, format!("GPU {lg:.4}, CPU {lc:.4}")));
    let l32 = gpu32.last_train_loss.unwrap_or(f64::NAN);
    rows.push(row(
        format!("train {steps} steps, f32 GPU vs f32 CPU"),
        "final train loss |Δ|",
        (l32 - lc).abs(),
        0.02,
        format!("GPU {l32:.4} ({t_gpu32:.0} s), CPU {lc:.4}"),
    ));
    let (vc, vg) = (cpu.last_val_loss.unwrap_or(f64::NAN), gpu.last_val_loss.unwrap_or(f64::NAN));
    rows.push(row(
        case,
        "final validation loss |Δ|",
        (vg - vc).abs(),
        0.05,
        format!("GPU {vg:.4} ({t_gpu:.0} s), CPU {vc:.4} ({t_cpu:.0} s)"),
    ));

    // Stop half-way, resume on the GPU: the trajectory of the uninterrupted run.
    let half = steps / 2;
    train(
        Some(run.clone()),
        &TrainOptions { stop_after: Some(half), ..opts("gpu-stop", DeviceArg::Cuda(0), Some(Dtype::Bf16)) },
    )?;
    copy_dir(&work.join("gpu-stop"), &work.join("cpu-resume"))?;
    train(
        Some(run.clone()),
        &TrainOptions { resume: true, ..opts("gpu-stop", DeviceArg::Cuda(0), Some(Dtype::Bf16)) },
    )?;
    let (full, resumed) = (train_losses(&work.join("gpu")), train_losses(&work.join("gpu-stop")));
    let worst = worst_gap(&full, &resumed, half);
    rows.push(row(
        format!("resume on the GPU at step {half}"),
        "loss |Δ| vs uninterrupted, later steps",
        worst,
        1e-5,
        if worst == 0.0 { "bitwise".into() } else { String::new() },
    ));
    // A GPU checkpoint resumes on the CPU.
    let r = train(Some(run), &TrainOptions { resume: true, ..opts("cpu-resume", DeviceArg::Cpu, None) });
    let cpu_after = train_losses(&work.join("cpu-resume"));
    let err = match (&r, full.last(), cpu_after.last()) {
        (Ok(_), Some((_, a)), Some((_, b))) => (a - b).abs(),
        _ => f64::INFINITY,
    };
    rows.push(row(
        format!("GPU checkpoint at step {half} resumed on the CPU"),
        "final loss |Δ| vs the GPU run",
        err,
        0.05,
        r.err().map_or(String::new(), |e| format!("{e:#}")),
    ));
    Ok(rows)
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for e in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let e = e?;
        let dst = to.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &dst)?;
        } else {
            std::fs::copy(e.path(), &dst).with_context(|| format!("copying {}", e.path().display()))?;
        }
    }
    Ok(())
}

/// The largest |Δ| loss between run `b` and the reference run `a` over `a`'s steps after `from`:
/// ∞ where `b` did not log one of them, or where `a` logged none.
fn worst_gap(a: &[(u64, f64)], b: &[(u64, f64)], from: u64) -> f64 {
    let gaps: Vec<f64> = a
        .iter()
        .filter(|(s, _)| *s > from)
        .map(|(s, l)| loss_at(b, *s).map_or(f64::INFINITY, |m| (m - l).abs()))
        .collect();
    if gaps.is_empty() {
        f64::INFINITY
    } else {
        gaps.into_iter().fold(0.0, f64::max)
    }
}

/// The first step at which `b` logged another loss than `a`, and by how much.
fn first_difference(a: &[(u64, f64)], b: &[(u64, f64)]) -> Option<(u64, f64)> {
    a.iter().find_map(|&(s, l)| loss_at(b, s).filter(|&m| m != l).map(|m| (s, (m - l).abs())))
}

/// The loss `run` logged at `step`, if it logged one.
fn loss_at(run: &[(u64, f64)], step: u64) -> Option<f64> {
    run.iter().find(|(t, _)| *t == step).map(|(_, l)| *l)
}

/// The training losses a run logged in `dir`'s metrics, by step.
fn train_losses(dir: &Path) -> Vec<(u64, f64)> {
    foxlm::train::read_metrics(dir)
        .iter()
        .filter(|m| m.kind == "train")
        .filter_map(|m| Some((m.step, m.loss?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{first_difference, gqa_window_models, max_abs_diff, recurrent_models, rms_diff, worst_gap, CheckModel};
    use foxlm::config::Config;
    use foxlm::model::{Ctx, Model};

    /// The official-fox-tiny fixtures, beside which the check models are found.
    pub(super) fn fox_fixtures() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/official-fox-tiny")
    }

    /// A check model is sensitive: its logits are not near zero (a zero final norm once made every
    /// row pass trivially) and left padding changes row 1's logits from position `from` on.
    pub(super) fn assert_sensitive(m: &CheckModel, from: usize) {
        let (b, t) = (m.b, m.t);
        let plain = m.model.forward(&m.ids, &Ctx { batch: b, seq: t, start: None });
        let padded = m.model.forward(&m.ids, &Ctx { batch: b, seq: t, start: Some(m.start.clone()) });
        let spread = plain.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
        assert!(spread > 0.05, "{}: logits all near 0 (max {spread})", m.name);
        let v = m.model.config.vocab_size;
        let row1 = |l: &[f32]| l[(t + from) * v..(t + t) * v].to_vec();
        assert!(max_abs_diff(&row1(&plain), &row1(&padded)) > 1e-4, "{}: padding changes nothing", m.name);
    }

    /// A step the compared run did not log fails the row (∞), as does nothing to compare.
    #[test]
    fn loss_gaps_count_missing_steps_as_infinite() {
        let a = [(1, 2.0), (2, 1.5), (3, 1.25)];
        assert_eq!(worst_gap(&a, &[(1, 2.5), (2, 1.25), (3, 1.25)], 0), 0.5);
        assert_eq!(worst_gap(&a, &[(2, 1.25), (3, 1.0)], 1), 0.25);
        assert_eq!(worst_gap(&a, &[(1, 2.0), (3, 1.25)], 0), f64::INFINITY);
        assert_eq!(worst_gap(&a, &a, 3), f64::INFINITY);
        assert_eq!(worst_gap(&a, &a, 0), 0.0);
    }

    /// The first step whose loss differs, skipping steps the compared run did not log.
    #[test]
    fn first_difference_names_the_step() {
        let a = [(1, 2.0), (2, 1.5), (3, 1.25)];
        assert_eq!(first_difference(&a, &a), None);
        assert_eq!(first_difference(&a, &[(1, 2.0), (2, 1.75), (3, 1.0)]), Some((2, 0.25)));
        assert_eq!(first_difference(&a, &[(2, 1.5), (3, 1.0)]), Some((3, 0.25)));
    }

    fn with_config(m: &Model, c: Config) -> Model {
        let mut out = Model::new(&c);
        for (d, s) in out.params.tensors.iter_mut().zip(&m.params.tensors) {
            d.data.copy_from_slice(&s.data);
        }
        out
    }

    /// The GQA / window / ACP rows can fail: on the CPU, a window one key longer moves some logit
    /// by far more than the f32 rows' 1e-3, no window at all moves the logits' RMS by more than
    /// twice the bf16 rows' 0.04, the ACP models prune, and their QK-norm bound differs by head.
    #[test]
    fn the_gqa_window_check_models_are_sensitive() {
        for m in gqa_window_models().unwrap() {
            let c = &m.model.config;
            let ctx = Ctx { batch: m.b, seq: m.t, start: None };
            let (_, acts) = m.model.forward_hidden(&m.ids, &ctx, None, true);
            let acts = acts.unwrap();
            let logits = m.model.forward(&m.ids, &ctx);
            if let Some(w) = c.window_size {
                let longer = with_config(&m.model, Config { window_size: Some(w + 1), ..c.clone() });
                let e = max_abs_diff(&logits, &longer.forward(&m.ids, &ctx));
                assert!(e > 1e-2, "{}: a window of {} instead of {w} moves the logits by only {e:.2e}", m.name, w + 1);
                let none = with_config(&m.model, Config { window_size: None, ..c.clone() });
                let e = rms_diff(&logits, &none.forward(&m.ids, &ctx));
                assert!(e > 0.08, "{}: without the window the logits move by only RMS {e:.3}", m.name);
            }
            if c.log_pruning_tolerance.is_some() {
                let pruned: usize = acts.blocks.iter().filter_map(|b| b.attn()).map(|a| a.tiles_pruned).sum();
                assert!(pruned > 0, "{}: ACP prunes nothing", m.name);
                if c.qk_norm {
                    let th = acts.blocks[0].attn().and_then(|a| a.prune.as_ref()).unwrap();
                    let h = c.num_heads;
                    assert!((1..h).all(|i| th[i] != th[0]), "{}: the same threshold for every head {th:?}", m.name);
                }
            }
        }
    }

    /// The GPU check's DeltaNet models have the heads their names say and are sensitive (logits
    /// not near zero, left padding changes the padded row).
    #[test]
    fn the_deltanet_check_models_are_sensitive() {
        let models = super::deltanet_models().unwrap();
        let heads: Vec<(bool, usize, usize)> = models
            .iter()
            .map(|m| {
                let s = m.model.config.deltanet();
                (s.gated, s.head_k, s.head_v)
            })
            .collect();
        assert_eq!(heads, [(false, 16, 16), (true, 8, 16), (false, 128, 128), (true, 64, 64)]);
        for m in &models {
            // Row 1's real positions (a strong decay forgets the padding by the row's end).
            assert_sensitive(m, m.start[1]);
        }
    }

    /// The GPU check's recurrent models load beside the FoX fixtures, have the shapes their
    /// names say, and are sensitive: their logits are not near zero (a zero final norm once made
    /// every row pass trivially) and left padding changes the padded row's logits.
    #[test]
    fn the_recurrent_check_models_are_sensitive() {
        let models = recurrent_models(&fox_fixtures()).unwrap();
        let names: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names.len(), 4, "{names:?}");
        let big = models[2].model.config.mamba2();
        assert_eq!((big.head_dim, big.state, big.heads), (64, 128, 4));
        for m in &models {
            assert_sensitive(m, m.t - 1);
        }
    }
}
