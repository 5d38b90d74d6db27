//! The trainer (SPEC §3): seeded N(0, 0.02) initialisation, AdamW on token windows with gradient
//! accumulation and global-norm clipping, a token-indexed warm-up + cosine schedule, periodic
//! validation, JSONL metrics, a loss-curve PNG, and resumable checkpoints.
//!
//! Output folder layout:
//!
//! ```text
//! OUT/run.json                 the model and training configuration ({"model": .., "train": ..})
//! OUT/metrics.jsonl            one JSON object per logged step ("train") and per validation ("val")
//! OUT/loss.png                 training and validation loss against tokens seen
//! OUT/checkpoint-<step>/       config.json + model.safetensors (the authors' layout, loadable by
//!                              their PyTorch code), optimizer.safetensors (AdamW moments),
//!                              trainer.json (step, tokens, data position, config hash, ...)
//! OUT/final/                   the same, written when training completes
//! OUT/latest                   the name of the newest complete checkpoint folder
//! ```
//!
//! Every checkpoint is written into `<name>.tmp/`, each file synced, then renamed into place, and
//! only then does `latest` (itself replaced atomically) point at it: a crash or a full disk never
//! damages the last good checkpoint. The last `keep_last` numbered checkpoints are kept.

use crate::checkpoint::{self, fixed_fgate_bias, load_model, CONFIG_FILE, WEIGHTS_FILE};
use crate::config::{Config, FgateType};
use crate::data::{Dataset, Loader, LoaderState, Split};
use crate::engine::{format_plan, memory_plan, CpuEngine, Dtype, Engine, GpuEngine};
use crate::eval::text::TEXT_FORMAT_KEY;
use crate::model::{Ctx, MemoryPlan, Model};
use crate::optim::{AdamW, AdamWConfig, Schedule};
use crate::plot::{LinePlot, Series};
use crate::tensor::ParamKind;
use anyhow::{anyhow, bail, Context, Result};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const TRAINER_FILE: &str = "trainer.json";
pub const RUN_FILE: &str = "run.json";
pub const METRICS_FILE: &str = "metrics.jsonl";
pub const LOSS_PLOT_FILE: &str = "loss.png";
pub const LATEST_FILE: &str = "latest";
pub const FINAL_DIR: &str = "final";
/// The key of config.json that records the training context length (see Config::train_context).
pub const TRAIN_CONTEXT_KEY: &str = "foxlm_train_context";

/// How to train (everything but the model's architecture).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Tokens per training window (the model reads BOS + context - 1 tokens and predicts context).
    pub context: usize,
    /// Sequences per optimizer step.
    pub batch_size: usize,
    /// Sequences per forward/backward pass; batch_size / micro_batch passes are accumulated.
    pub micro_batch: usize,
    /// Training budget in tokens; the cosine schedule ends here.
    pub total_tokens: u64,
    pub peak_lr: f64,
    pub min_lr: f64,
    pub warmup_tokens: u64,
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub max_grad_norm: f64,
    /// Seeds the initialisation and the data order.
    pub seed: u64,
    /// Validate every this many steps (0: only at the start and the end).
    pub eval_every: u64,
    /// Validation tokens per evaluation (rounded to whole windows; at least one window).
    pub eval_tokens: u64,
    /// Checkpoint every this many steps (0: only at the end and on Ctrl-C).
    pub checkpoint_every: u64,
    /// Numbered checkpoints to keep (the newest ones; at least 1).
    pub keep_last: usize,
    /// Write a metrics line every this many steps.
    pub log_every: u64,
}

impl TrainConfig {
    // The negated comparisons are deliberate: they reject NaN too.
    #[allow(clippy::neg_cmp_op_on_partial_ord, clippy::nonminimal_bool)]
    pub fn validate(&self) -> Result<()> {
        if self.context < 2 {
            bail!("context {} must be at least 2", self.context);
        }
        if self.batch_size == 0 || self.micro_batch == 0 || !self.batch_size.is_multiple_of(self.micro_batch) {
            bail!("batch_size {} must be a positive multiple of micro_batch {}", self.batch_size, self.micro_batch);
        }
        if self.total_tokens < self.tokens_per_step() {
            bail!(
                "total_tokens {} is less than one step of {} tokens (batch_size x context)",
                self.total_tokens,
                self.tokens_per_step()
            );
        }
        if !(self.peak_lr > 0.0 && self.peak_lr.is_finite()) || !(self.min_lr >= 0.0) || self.min_lr > self.peak_lr {
            bail!("learning rates: need 0 <= min_lr ({}) <= peak_lr ({}), peak_lr > 0", self.min_lr, self.peak_lr);
        }
        if self.warmup_tokens > self.total_tokens {
            bail!("warmup_tokens {} exceeds total_tokens {}", self.warmup_tokens, self.total_tokens);
        }
        if !(0.0..1.0).contains(&self.beta1) || !(0.0..1.0).contains(&self.beta2) || !(self.eps > 0.0) {
            bail!("AdamW: betas must be in [0, 1) and eps > 0");
        }
        if !(self.weight_decay >= 0.0) || !(self.max_grad_norm > 0.0) {
            bail!("weight_decay must be >= 0 and max_grad_norm > 0");
        }
        if self.keep_last == 0 || self.log_every == 0 {
            bail!("keep_last and log_every must be at least 1");
        }
        Ok(())
    }

    pub fn tokens_per_step(&self) -> u64 {
        // Saturating: a config from outside must not overflow before validate() reports it.
        (self.batch_size as u64).saturating_mul(self.context as u64)
    }

    /// Optimizer steps in the budget (the last one may overshoot total_tokens).
    pub fn total_steps(&self) -> u64 {
        self.total_tokens.div_ceil(self.tokens_per_step())
    }

    pub fn schedule(&self) -> Schedule {
        Schedule {
            peak: self.peak_lr,
            min_lr: self.min_lr,
            warmup_tokens: self.warmup_tokens,
            total_tokens: self.total_tokens,
        }
    }

    pub fn adamw(&self) -> AdamWConfig {
        AdamWConfig { beta1: self.beta1, beta2: self.beta2, eps: self.eps, weight_decay: self.weight_decay }
    }

    /// The fields that change what training computes (everything except cadence of logging,
    /// validation and checkpoints): a resumed run must agree on these.
    fn identity(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).expect("serialises");
        let m = v.as_object_mut().expect("object");
        for k in ["eval_every", "eval_tokens", "checkpoint_every", "keep_last", "log_every"] {
            m.remove(k);
        }
        v
    }
}

/// A run's full configuration, as stored in OUT/run.json and accepted by `--config`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    pub model: Config,
    pub train: TrainConfig,
}

impl RunConfig {
    /// The model config as saved with checkpoints: with the training context recorded.
    pub fn saved_model_config(&self) -> Config {
        let mut c = self.model.clone();
        c.extra.insert(TRAIN_CONTEXT_KEY.into(), serde_json::json!(self.train.context));
        c
    }
}

fn model_identity(c: &Config) -> serde_json::Value {
    let mut c = c.clone();
    c.extra.clear();
    serde_json::to_value(&c).expect("serialises")
}

/// A hash of everything a resumed run must agree on: the model, the training recipe and the
/// training data.
pub fn config_hash(run: &RunConfig, data_fingerprint: &str) -> String {
    let v = serde_json::json!({"model": model_identity(&run.model), "train": run.train.identity(), "data": data_fingerprint});
    hex(&Sha256::digest(v.to_string().as_bytes()))
}

/// Lower-case hex of bytes (checksums here, the NCCL id in `dist::rendezvous`).
pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Identifies the training split of a dataset by its shards' checksums.
pub fn data_fingerprint(ds: &Dataset) -> String {
    let m = ds.manifest();
    let mut h = Sha256::new();
    h.update(m.text_format.as_str().as_bytes());
    for s in &m.train.shards {
        h.update(s.tokens_sha256.as_bytes());
        h.update(s.index_sha256.as_bytes());
    }
    hex(&h.finalize())
}

/// The fields on which two runs differ, as "field: a -> b" lines.
fn config_diff(old: &RunConfig, new: &RunConfig) -> Vec<String> {
    let mut out = Vec::new();
    for (section, a, b) in [
        ("model", model_identity(&old.model), model_identity(&new.model)),
        ("train", old.train.identity(), new.train.identity()),
    ] {
        let (a, b) = (a.as_object().unwrap().clone(), b.as_object().unwrap().clone());
        let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
        keys.sort();
        keys.dedup();
        for k in keys {
            if a.get(k) != b.get(k) {
                let show = |v: Option<&serde_json::Value>| v.map_or("(absent)".to_string(), |v| v.to_string());
                out.push(format!("{section}.{k}: {} (checkpoint) vs {} (now)", show(a.get(k)), show(b.get(k))));
            }
        }
    }
    out
}

/// Samba's initialisation, as the authors' SambaPreTrainedModel._init_weights leaves it (the
/// embedding keeps its N(0, initializer_range)): every Linear at PyTorch's default U(±1/√in)
/// (the output head too), the residual outputs (o_proj, down_proj, out_proj) rescaled by
/// 1/√(2·layers), and the Mamba layers' own parameters ([`crate::model::mamba::MambaMixer::init`]).
fn init_samba(model: &mut Model, rng: &mut ChaCha8Rng) {
    use crate::model::mamba2::uniform;
    use crate::model::{Linear, Mixer};
    let layers = model.layers.len();
    let rescale = 1.0 / ((2 * layers.max(1)) as f32).sqrt();
    let default = |p: &mut crate::tensor::Params, l: &Linear, scale: f32, rng: &mut ChaCha8Rng| {
        uniform(&mut p[l.weight], scale / (l.in_features as f32).sqrt(), rng)
    };
    for i in 0..layers {
        let blk = model.layers[i].clone();
        let p = &mut model.params;
        match &blk.mixer {
            Mixer::Attention(a) => {
                for l in [&a.q_proj, &a.k_proj.linear, &a.v_proj.linear] {
                    default(p, l, 1.0, rng);
                }
                default(p, &a.o_proj, rescale, rng);
            }
            Mixer::Mamba(m) => m.init(p, layers, rng),
            Mixer::Mamba2(_) | Mixer::DeltaNet(_) | Mixer::Hgrn2(_) => {}
        }
        if let Some(m) = &blk.mlp {
            default(p, &m.mlp.gate_proj, 1.0, rng);
            default(p, &m.mlp.down_proj, rescale, rng);
        }
    }
    let head = model.lm_head;
    default(&mut model.params, &head, 1.0, rng);
}

/// DeltaNet's, Gated DeltaNet's and HGRN2's initialisation beyond the generic draw: the authors'
/// DeltaNet and HGRN2 divide o_proj and down_proj by √(2·layers) (GPT-2's residual rescaling),
/// and each DeltaNet layer draws its own decay parameters
/// ([`crate::model::deltanet::DeltaNetMixer::init`], [`crate::model::hgrn2::Hgrn2Mixer::init`]).
fn init_deltanet(model: &mut Model, rng: &mut ChaCha8Rng) {
    let layers = model.layers.len();
    let rescale = 1.0 / ((2 * layers.max(1)) as f32).sqrt();
    for i in 0..layers {
        let blk = model.layers[i].clone();
        let p = &mut model.params;
        match &blk.mixer {
            crate::model::Mixer::DeltaNet(l) => l.init(p, layers, rng),
            crate::model::Mixer::Hgrn2(l) => l.init(p, layers),
            _ => {}
        }
        if let Some(m) = &blk.mlp {
            p[m.mlp.down_proj.weight].iter_mut().for_each(|w| *w *= rescale);
        }
    }
}

/// Initialises `cfg`'s parameters (SPEC §2): every Linear and the embedding ~ N(0, std), norm
/// weights 1, biases 0; the fixed forget gate's bias from its decay times. Seeded.
pub fn init_model(cfg: &Config, seed: u64) -> Model {
    let mut model = Model::new(cfg);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let normal = Normal::new(0.0f32, cfg.initializer_range as f32).expect("valid std");
    let p = &mut model.params;
    for i in 0..p.len() {
        let name = p.names[i].clone();
        let data = &mut p.tensors[i].data;
        match p.kinds[i] {
            ParamKind::Matrix => data.iter_mut().for_each(|x| *x = normal.sample(&mut rng)),
            // Every RMSNorm weight starts at 1, the recurrent models' final norm_f too.
            _ if name.ends_with("norm.weight") || name.ends_with("norm_f.weight") => data.fill(1.0),
            _ if name.ends_with(".fgate_bias") && cfg.fgate_type == FgateType::Fixed => {
                data.copy_from_slice(&fixed_fgate_bias(cfg))
            }
            _ if cfg.fgate_bias_init
                && cfg.decay_time_min.is_some()
                && cfg.decay_time_max.is_some()
                && (name.ends_with(".fgate_bias") || name.ends_with(".fgate_proj.bias")) =>
            {
                data.copy_from_slice(&fixed_fgate_bias(cfg))
            }
            _ => data.fill(0.0),
        }
    }
    // Families with their own initialisation (after the generic pass, so FoX's draws are as they were).
    let n_layers = cfg.num_hidden_layers;
    for i in 0..model.layers.len() {
        if let crate::model::Mixer::Mamba2(l) = &model.layers[i].mixer {
            let l = l.clone();
            l.init(&mut model.params, n_layers, &mut rng);
        }
    }
    if cfg.arch() == crate::config::Arch::Samba {
        init_samba(&mut model, &mut rng);
    }
    if cfg.is_deltanet() || cfg.arch() == crate::config::Arch::Hgrn2 {
        init_deltanet(&mut model, &mut rng);
    }
    if cfg.arch() == crate::config::Arch::Mamba2 {
        // The authors' Mamba-2 leaves the output head at PyTorch's Linear default.
        let d = cfg.hidden_size;
        crate::model::mamba2::uniform(&mut model.params[model.lm_head.weight], 1.0 / (d as f32).sqrt(), &mut rng);
    }
    model
}

/// Where a run stands; saved as trainer.json.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    pub step: u64,
    pub tokens_seen: u64,
    /// The data loader's position (its seed, epoch and window index: the only randomness
    /// training uses after initialisation).
    pub data: LoaderState,
    pub config_hash: String,
    pub run: RunConfig,
    /// The dataset folder the run trained on (informative; the hash pins its content).
    pub data_dir: String,
    /// Training time so far, in seconds.
    pub elapsed_s: f64,
    /// The last validation loss, if any.
    pub last_val_loss: Option<f64>,
    pub finished: bool,
    /// The model folder whose weights the run started from (`--init-from`; informative).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_from: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Files.

/// Bytes written through `write_synced` so far, for FOXLM_TEST_DISK_LIMIT (a testing hook that
/// makes writes fail with "no space left on device" once that many bytes have been written by
/// this process; it exists so tests can check that a full disk never corrupts a checkpoint).
static BYTES_WRITTEN: AtomicU64 = AtomicU64::new(0);

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let res = (|| -> std::io::Result<()> {
        if let Some(limit) = std::env::var("FOXLM_TEST_DISK_LIMIT").ok().and_then(|v| v.parse::<u64>().ok()) {
            let before = BYTES_WRITTEN.fetch_add(bytes.len() as u64, Ordering::SeqCst);
            if before + bytes.len() as u64 > limit {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::StorageFull,
                    "No space left on device (simulated)",
                ));
            }
        }
        let mut f = std::fs::File::create(path)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    res.map_err(|e| anyhow!("cannot write {}: {e}", path.display()))
}

/// Replaces `path` with `bytes` through a temporary file and a rename.
fn replace_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_file_name(format!("{}.tmp", path.file_name().unwrap().to_string_lossy()));
    if let Err(e) = write_synced(&tmp, bytes) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path).with_context(|| format!("cannot rename {} to {}", tmp.display(), path.display()))
}

fn sync_dir(dir: &Path) {
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.sync_all();
    }
}

fn tensors_bytes(named: Vec<(String, Vec<usize>, &[f32])>) -> Result<Vec<u8>> {
    let bufs: Vec<(String, Vec<usize>, Vec<u8>)> =
        named.into_iter().map(|(n, s, d)| (n, s, d.iter().flat_map(|v| v.to_le_bytes()).collect())).collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = bufs
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b).expect("consistent"),
            )
        })
        .collect();
    let mut meta = std::collections::HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    safetensors::serialize(views, Some(meta)).map_err(|e| anyhow!("serialising tensors: {e}"))
}

/// Writes a complete checkpoint as `out/name` (atomically: into `name.tmp`, then renamed), then
/// points `out/latest` at it.
pub fn save_checkpoint(out: &Path, name: &str, model: &Model, opt: &AdamW, state: &TrainerState) -> Result<PathBuf> {
    let dir = out.join(name);
    let tmp = out.join(format!("{name}.tmp"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("cannot remove stale {}", tmp.display()))?;
    }
    let res = (|| -> Result<()> {
        std::fs::create_dir_all(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        let p = &model.params;
        let weights = tensors_bytes(checkpoint::export_tensors(model))?;
        write_synced(&tmp.join(WEIGHTS_FILE), &weights)?;
        drop(weights);
        write_synced(&tmp.join(CONFIG_FILE), state.run.saved_model_config().to_json().as_bytes())?;
        crate::tokenizer_export::write_tokenizer_files(&tmp, &state.run.saved_model_config(), None)?;
        let mut named = Vec::new();
        for i in 0..p.len() {
            if p.kinds[i] != ParamKind::Frozen {
                named.push((format!("exp_avg.{}", p.names[i]), p.tensors[i].shape.clone(), &opt.m[i][..]));
                named.push((format!("exp_avg_sq.{}", p.names[i]), p.tensors[i].shape.clone(), &opt.v[i][..]));
            }
        }
        let optimizer = tensors_bytes(named)?;
        write_synced(&tmp.join(OPTIMIZER_FILE), &optimizer)?;
        drop(optimizer);
        let mut st = state.clone();
        st.data_dir = state.data_dir.clone();
        let json = serde_json::json!({"trainer": st, "optimizer_step": opt.step, "adamw": opt.config});
        write_synced(&tmp.join(TRAINER_FILE), serde_json::to_string_pretty(&json).unwrap().as_bytes())?;
        sync_dir(&tmp);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("cannot replace {}", dir.display()))?;
        }
        std::fs::rename(&tmp, &dir).with_context(|| format!("cannot rename {} to {}", tmp.display(), dir.display()))?;
        sync_dir(out);
        replace_file(&out.join(LATEST_FILE), name.as_bytes())?;
        Ok(())
    })();
    if let Err(e) = res {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    Ok(dir)
}

/// A checkpoint read back: the model, the optimizer and the trainer state.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub model: Model,
    pub opt: AdamW,
    pub state: TrainerState,
}

/// Loads a checkpoint folder written by [`save_checkpoint`], checking the trainer state
/// against the checkpoint's config (see [`crate::validate::check_trainer_state`]) and the
/// optimizer file's header against the model's parameters before reading any state.
pub fn load_checkpoint(dir: &Path) -> Result<Checkpoint> {
    let tpath = dir.join(TRAINER_FILE);
    let text = crate::validate::read_text(&tpath)?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("{}: corrupt trainer state (half-written or damaged)", tpath.display()))?;
    let state: TrainerState = serde_json::from_value(v["trainer"].clone())
        .with_context(|| format!("{}: corrupt trainer state", tpath.display()))?;
    let adamw: AdamWConfig = serde_json::from_value(v["adamw"].clone())
        .with_context(|| format!("{}: corrupt optimizer settings", tpath.display()))?;
    let opt_step = v["optimizer_step"].as_u64().ok_or_else(|| anyhow!("{}: no optimizer_step", tpath.display()))?;
    let cfg = Config::load(&dir.join(CONFIG_FILE))?;
    crate::validate::check_trainer_state(&state, &adamw, opt_step, &cfg, &tpath)?;
    let model = load_model(dir)?;
    let opath = dir.join(OPTIMIZER_FILE);
    let ofile = [checkpoint::TensorFile::open(&opath)?];
    let p = &model.params;
    let trainable: Vec<usize> = (0..p.len()).filter(|&i| p.kinds[i] != ParamKind::Frozen).collect();
    let expected: Vec<(String, Vec<usize>)> = trainable
        .iter()
        .flat_map(|&i| ["exp_avg", "exp_avg_sq"].map(|k| (format!("{k}.{}", p.names[i]), p.tensors[i].shape.clone())))
        .collect();
    checkpoint::match_layout(&ofile, &expected, |_| false, "the model's trainable parameters")?;
    crate::validate::check_memory(2 * cfg.param_bytes(), &format!("{}: the optimizer state (f32)", opath.display()))?;
    let mut opt = AdamW::new(adamw, &model.params);
    opt.step = opt_step;
    for &i in &trainable {
        let name = &model.params.names[i];
        ofile[0].decode_into(&format!("exp_avg.{name}"), &mut opt.m[i])?;
        ofile[0].decode_into(&format!("exp_avg_sq.{name}"), &mut opt.v[i])?;
    }
    Ok(Checkpoint { dir: dir.to_path_buf(), model, opt, state })
}

fn checkpoint_step(name: &str) -> Option<u64> {
    name.strip_prefix("checkpoint-").and_then(|s| s.parse().ok())
}

/// The numbered checkpoints in `out`, oldest first.
pub fn list_checkpoints(out: &Path) -> Vec<(u64, PathBuf)> {
    let mut v: Vec<(u64, PathBuf)> = std::fs::read_dir(out)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            checkpoint_step(&name).filter(|_| e.path().is_dir()).map(|s| (s, e.path()))
        })
        .collect();
    v.sort();
    v
}

/// The newest complete checkpoint of a run: the one `latest` names (or, if that is missing or
/// unreadable, the highest-numbered one that loads).
pub fn latest_checkpoint(out: &Path) -> Result<Option<PathBuf>> {
    if let Ok(name) = std::fs::read_to_string(out.join(LATEST_FILE)) {
        let p = out.join(name.trim());
        if p.join(TRAINER_FILE).is_file() {
            return Ok(Some(p));
        }
    }
    let fin = out.join(FINAL_DIR);
    let mut cands: Vec<PathBuf> = list_checkpoints(out).into_iter().rev().map(|(_, p)| p).collect();
    if fin.join(TRAINER_FILE).is_file() {
        cands.insert(0, fin);
    }
    Ok(cands.into_iter().find(|p| p.join(TRAINER_FILE).is_file() && p.join(WEIGHTS_FILE).is_file()))
}

fn prune_checkpoints(out: &Path, keep: usize) {
    let cks = list_checkpoints(out);
    if cks.len() > keep {
        for (_, p) in &cks[..cks.len() - keep] {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Validation.

/// Mean cross-entropy (nats/token) of `model` over the first windows of the validation split,
/// at most `max_tokens` tokens of them (at least one window), in batches of `batch`. None when
/// the split is shorter than one window.
pub fn validation_loss(
    model: &Model,
    ds: &Dataset,
    context: usize,
    max_tokens: u64,
    batch: usize,
) -> Result<Option<f64>> {
    let Ok(mut loader) = Loader::new(ds, Split::Val, context, 0, false) else { return Ok(None) };
    let windows = loader.windows_per_epoch().min((max_tokens / context as u64).max(1)) as usize;
    let mut sum = 0.0f64;
    let mut count = 0usize;
    let mut done = 0;
    while done < windows {
        let b = batch.min(windows - done);
        let bt = loader.next_batch(b);
        let (s, n) = sum_loss(model, &bt.ids, &bt.targets, b, context)?;
        sum += s;
        count += n;
        done += b;
    }
    Ok(Some(sum / count.max(1) as f64))
}

/// Σ cross-entropy over the targets, and how many, without gradients (the fused head op: the
/// logits are formed a block of the vocabulary at a time and never kept).
pub fn sum_loss(model: &Model, ids: &[u32], targets: &[Option<u32>], batch: usize, seq: usize) -> Result<(f64, usize)> {
    let ctx = Ctx { batch, seq, start: None };
    let (hidden, _) = model.forward_hidden(ids, &ctx, None, false);
    let head = &model.lm_head;
    let w = &model.params[head.weight];
    let sum =
        fox_kernels::head::linear_cross_entropy(&hidden, w, targets, head.in_features, head.out_features, 1.0, None)
            .context("validation loss (are the data's token ids those of the model's vocabulary?)")?;
    Ok((sum, targets.iter().filter(|t| t.is_some()).count()))
}

// ---------------------------------------------------------------------------------------------
// The training loop.

/// Set by Ctrl-C (see [`install_ctrlc_handler`]): the trainer saves a checkpoint and stops.
pub static STOP: AtomicBool = AtomicBool::new(false);

/// Makes Ctrl-C (SIGINT/SIGTERM) request a clean stop; a second Ctrl-C exits at once.
pub fn install_ctrlc_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = ctrlc::set_handler(|| {
            if STOP.swap(true, Ordering::SeqCst) {
                eprintln!("\nsecond interrupt: exiting without saving");
                std::process::exit(130);
            }
            eprintln!("\ninterrupt: saving a checkpoint after this step (Ctrl-C again to exit at once)");
        });
    });
}

/// How the run is set up beyond its configuration.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    pub data: PathBuf,
    pub out: PathBuf,
    /// Continue the run in `out` from its latest checkpoint.
    pub resume: bool,
    pub progress: bool,
    /// Stop (with a checkpoint, as on Ctrl-C) once this many steps are done in total.
    pub stop_after: Option<u64>,
    /// Print validation results and other messages to stderr.
    pub verbose: bool,
    /// Where the steps run (`--device`): cpu, cuda[:N], or auto (the GPU when there is one).
    pub device: fox_kernels::cuda::DeviceArg,
    /// Activation precision on the GPU (`--dtype`; None: bf16 on a GPU, f32 on the CPU).
    pub dtype: Option<Dtype>,
    /// Keep only each block's input and recompute the block in the backward (`--recompute`, GPU).
    pub recompute: bool,
    /// This process is one rank of a data-parallel run (GPU `world.local_rank`, NCCL): it reads
    /// its part of each step's windows; only rank 0 writes metrics and checkpoints.
    pub dist: Option<crate::dist::DistRun>,
    /// Start from this model folder's weights instead of a random initialisation (`--init-from`,
    /// see [`crate::init_from`]); the run's architecture must keep every tensor's shape.
    pub init_from: Option<PathBuf>,
    /// Also write the metrics as TensorBoard event files into this folder (`--tensorboard`).
    pub tensorboard: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The budget was reached; the final model is in OUT/final.
    Finished,
    /// Stopped early (Ctrl-C or `stop_after`) after saving a checkpoint.
    Interrupted,
    /// A run that had already finished was resumed: nothing to do.
    AlreadyFinished,
}

#[derive(Clone, Debug)]
pub struct TrainReport {
    pub outcome: Outcome,
    pub step: u64,
    pub tokens_seen: u64,
    /// The checkpoint written last (OUT/final when finished).
    pub checkpoint: PathBuf,
    pub first_val_loss: Option<f64>,
    pub last_val_loss: Option<f64>,
    pub last_train_loss: Option<f64>,
    /// Tokens per second over this invocation's steps.
    pub tokens_per_s: f64,
    pub elapsed_s: f64,
    /// With `--init-from`: the architecture fields the run changed, "field: old -> new".
    pub init_changes: Vec<String>,
}

/// One metrics line.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Metric {
    pub kind: String,
    pub step: u64,
    pub tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub loss: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub val_loss: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub lr: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub grad_norm: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tokens_per_s: Option<f64>,
    pub elapsed_s: f64,
}

/// Reads OUT/metrics.jsonl (lines that do not parse are skipped).
pub fn read_metrics(out: &Path) -> Vec<Metric> {
    std::fs::read_to_string(out.join(METRICS_FILE))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Draws OUT/loss.png from the metrics.
pub fn plot_losses(out: &Path, title: &str) -> Result<()> {
    let ms = read_metrics(out);
    let train: Vec<(f64, f64)> =
        ms.iter().filter(|m| m.kind == "train").filter_map(|m| Some((m.tokens as f64, m.loss?))).collect();
    let val: Vec<(f64, f64)> =
        ms.iter().filter(|m| m.kind == "val").filter_map(|m| Some((m.tokens as f64, m.val_loss?))).collect();
    // A running mean makes the noisy per-step training loss readable.
    let k = (train.len() / 50).max(1);
    let smooth: Vec<(f64, f64)> = (0..train.len())
        .map(|i| {
            let lo = i.saturating_sub(k - 1);
            let w = &train[lo..=i];
            (train[i].0, w.iter().map(|p| p.1).sum::<f64>() / w.len() as f64)
        })
        .collect();
    let mut plot = LinePlot::new(title, "tokens seen", "loss (nats/token)");
    plot = plot.series(Series::new(if k > 1 { format!("train (mean of {k} steps)") } else { "train".into() }, smooth));
    plot = plot.series(Series::new("validation", val).with_markers());
    plot.save(&out.join(LOSS_PLOT_FILE))
}

struct MetricsLog {
    file: std::fs::File,
    path: PathBuf,
    /// The same metrics as TensorBoard events (`--tensorboard`).
    events: Option<crate::tensorboard::EventWriter>,
}

impl MetricsLog {
    /// Opens OUT/metrics.jsonl for appending, first dropping lines past `step` (left by a run
    /// that went on after its last checkpoint), and a new event file in `tensorboard`.
    fn open(out: &Path, keep_until_step: Option<u64>, tensorboard: Option<&Path>) -> Result<Self> {
        let path = out.join(METRICS_FILE);
        match keep_until_step {
            Some(s) => {
                let kept: String = std::fs::read_to_string(&path)
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| serde_json::from_str::<Metric>(l).is_ok_and(|m| m.step <= s))
                    .map(|l| format!("{l}\n"))
                    .collect();
                replace_file(&path, kept.as_bytes())?;
            }
            None => replace_file(&path, b"")?,
        }
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        let events = tensorboard.map(crate::tensorboard::EventWriter::create).transpose()?;
        Ok(Self { file, path, events })
    }

    fn write(&mut self, m: &Metric) -> Result<()> {
        let line = serde_json::to_string(m).unwrap() + "\n";
        self.file.write_all(line.as_bytes()).with_context(|| format!("cannot write {}", self.path.display()))?;
        if let Some(ev) = self.events.as_mut() {
            let scalars: Vec<(&str, f32)> = [
                ("train/loss", m.loss),
                ("train/lr", m.lr),
                ("train/grad_norm", m.grad_norm),
                ("train/tokens_per_s", m.tokens_per_s),
                ("train/tokens_seen", (m.kind == "train").then_some(m.tokens as f64)),
                ("val/loss", m.val_loss),
            ]
            .into_iter()
            .filter_map(|(tag, v)| Some((tag, v? as f32)))
            .collect();
            ev.scalars(crate::tensorboard::now(), m.step, &scalars)?;
        }
        Ok(())
    }
}

fn fmt_tokens(t: f64) -> String {
    if t.abs() < 1e4 {
        format!("{t:.0}")
    } else {
        crate::plot::tick(t)
    }
}

/// Checks that `out` can hold a run: creatable, writable.
fn check_output_dir(out: &Path) -> Result<()> {
    if out.exists() && !out.is_dir() {
        bail!("--out {}: exists and is not a folder", out.display());
    }
    std::fs::create_dir_all(out)
        .with_context(|| format!("--out {}: cannot create the output folder", out.display()))?;
    let probe = out.join(".foxlm-write-test");
    write_synced(&probe, b"ok")
        .with_context(|| format!("--out {}: the output folder is not writable", out.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// The engine for `opts.device` / `opts.dtype`; on a GPU it prints the memory plan first.
fn make_engine(
    model: &Model,
    opt: &AdamW,
    opts: &TrainOptions,
    micro: usize,
    context: usize,
) -> Result<Box<dyn Engine>> {
    use fox_kernels::cuda::Device;
    if let Some(d) = &opts.dist {
        return make_rank_engine(model, opt, opts, micro, context, d);
    }
    let mut device = fox_kernels::cuda::select(opts.device)?;
    if let (true, Some(why)) = (device.is_cuda(), crate::backend::cuda::unsupported(model, true)) {
        if opts.device != fox_kernels::cuda::DeviceArg::Auto {
            bail!("--device {}: {why}", opts.device);
        }
        eprintln!("note: training on the CPU: {why}");
        device = Device::Cpu;
    }
    match device {
        Device::Cpu => {
            if opts.dtype == Some(Dtype::Bf16) {
                bail!("--dtype bf16 needs a GPU (--device cuda): the CPU trains in f32");
            }
            if opts.recompute {
                bail!("--recompute saves GPU memory; on the CPU the activations are kept (drop --recompute)");
            }
            Ok(Box::new(CpuEngine::new(model, micro)))
        }
        Device::Cuda(gpu) => {
            let dtype = opts.dtype.unwrap_or_default();
            let plan = memory_plan(model, micro, context, dtype, opts.recompute, 1)?;
            if opts.verbose {
                eprint!("{}", format_plan(&plan, 1));
            }
            gpu_engine(dtype, gpu, model, opt, micro, context, opts.recompute, &plan, None)
        }
    }
}

/// The engine of one rank of a data-parallel run: GPU LOCAL_RANK, joined to the others through
/// NCCL with the id of the rendezvous.
fn make_rank_engine(
    model: &Model,
    opt: &AdamW,
    opts: &TrainOptions,
    micro: usize,
    context: usize,
    d: &crate::dist::DistRun,
) -> Result<Box<dyn Engine>> {
    let w = &d.world;
    let ordinal = w.gpu(fox_kernels::cuda::probe().context("training on several GPUs")?)?;
    if let fox_kernels::cuda::DeviceArg::Cuda(c) = opts.device {
        if c != ordinal {
            bail!(
                "--device cuda:{c} with LOCAL_RANK {}: each rank uses its LOCAL_RANK's GPU; drop --device",
                w.local_rank
            );
        }
    }
    let gpu = fox_kernels::cuda::Gpu::new(ordinal)?;
    let dtype = opts.dtype.unwrap_or_default();
    let plan = memory_plan(model, micro, context, dtype, opts.recompute, w.size)?;
    if opts.verbose {
        eprint!("{}", format_plan(&plan, w.size));
    }
    let nccl = fox_kernels::cuda::nccl::Nccl::new(gpu.clone(), w.rank, w.size, &d.nccl_id)?;
    crate::dist::heartbeat();
    gpu_engine(dtype, gpu, model, opt, micro, context, opts.recompute, &plan, Some(nccl))
}

/// The GPU engine for `dtype`: one GPU alone (`nccl` None) or one rank of a data-parallel run.
#[allow(clippy::too_many_arguments)]
fn gpu_engine(
    dtype: Dtype,
    gpu: std::sync::Arc<fox_kernels::cuda::Gpu>,
    model: &Model,
    opt: &AdamW,
    micro: usize,
    context: usize,
    recompute: bool,
    plan: &MemoryPlan,
    nccl: Option<fox_kernels::cuda::nccl::Nccl>,
) -> Result<Box<dyn Engine>> {
    Ok(match dtype {
        Dtype::Bf16 => Box::new(GpuEngine::<half::bf16>::new(gpu, model, opt, micro, context, recompute, plan, nccl)?),
        Dtype::F32 => Box::new(GpuEngine::<f32>::new(gpu, model, opt, micro, context, recompute, plan, nccl)?),
    })
}

/// Trains `run` on the dataset in `opts.data`, writing into `opts.out`. With `opts.resume`, the
/// run continues from the latest checkpoint in `opts.out` (and `run` must match its
/// configuration); `run` may then be None to take the checkpoint's.
pub fn train(run: Option<RunConfig>, opts: &TrainOptions) -> Result<TrainReport> {
    let out = &opts.out;
    let t_start = Instant::now();
    if opts.resume && opts.init_from.is_some() {
        bail!(
            "--resume and --init-from together: a resumed run continues from its checkpoint's weights; drop \
             --init-from to continue it, or choose a new --out to start again from the model"
        );
    }
    // Resume: find the checkpoint first (it may supply the configuration).
    let resumed = if opts.resume {
        let Some(dir) = latest_checkpoint(out)? else {
            bail!("--resume: {} holds no checkpoint to resume from", out.display());
        };
        Some(load_checkpoint(&dir).with_context(|| format!("--resume: cannot load checkpoint {}", dir.display()))?)
    } else {
        if let Some(dir) = latest_checkpoint(out)? {
            bail!(
                "{} already holds a run (latest checkpoint {}): pass --resume to continue it, or choose another --out",
                out.display(),
                dir.display()
            );
        }
        None
    };
    let mut run = match (run, &resumed) {
        (Some(r), _) => r,
        (None, Some(ck)) => ck.state.run.clone(),
        (None, None) => bail!("no configuration: give --preset or --config"),
    };
    run.model.validate().context("model configuration")?;
    run.train.validate().context("training configuration")?;
    // Fine-tuning: the source's config against the run's, before anything heavy.
    let init = match &opts.init_from {
        None => None,
        Some(dir) => {
            let src = crate::init_from::read_source(dir)?;
            let changes = crate::init_from::architecture_changes(&src.config, &run.model)
                .with_context(|| format!("--init-from {}", dir.display()))?;
            Some((src, changes.iter().map(|c| c.to_string()).collect::<Vec<_>>()))
        }
    };
    // In a data-parallel run only rank 0 writes (metrics, plots, checkpoints).
    let rank0 = opts.dist.as_ref().is_none_or(|d| d.world.rank == 0);
    if let Some(d) = &opts.dist {
        crate::dist::StepSlice::new(
            run.train.micro_batch,
            run.train.batch_size / run.train.micro_batch,
            0,
            d.world.size,
        )
        .context("training configuration")?;
    }
    // Parameters, gradients and AdamW's two moments, before anything is allocated.
    crate::validate::check_memory(
        4 * run.model.param_bytes(),
        "the model's parameters, gradients and optimizer state",
    )?;
    let tc = run.train.clone();

    let ds = Dataset::open(&opts.data)?;
    if ds.manifest().vocab_size > run.model.vocab_size {
        bail!(
            "{}: the dataset's vocabulary ({}) is larger than the model's ({})",
            opts.data.display(),
            ds.manifest().vocab_size,
            run.model.vocab_size
        );
    }
    if ds.num_tokens(Split::Train) == 0 {
        bail!("{}: the training split is empty", opts.data.display());
    }
    // Evaluation reads the text format back from config.json (not part of the run's identity).
    run.model.extra.insert(TEXT_FORMAT_KEY.into(), serde_json::json!(ds.manifest().text_format.as_str()));
    let mut loader = Loader::new(&ds, Split::Train, tc.context, tc.seed, true)?;
    let hash = config_hash(&run, &data_fingerprint(&ds));
    if rank0 {
        check_output_dir(out)?;
    }

    let (mut model, mut opt, mut state) = match resumed {
        Some(ck) => {
            if ck.state.config_hash != hash {
                let diff = config_diff(&ck.state.run, &run);
                let detail = if diff.is_empty() {
                    format!(
                        "the training data differ (checkpoint trained on {}, now {})",
                        ck.state.data_dir,
                        opts.data.display()
                    )
                } else {
                    diff.join("; ")
                };
                bail!("--resume: the configuration does not match checkpoint {}: {detail}", ck.dir.display());
            }
            loader.set_state(ck.state.data);
            if opts.verbose {
                eprintln!(
                    "resuming from {} (step {}, {} tokens)",
                    ck.dir.display(),
                    ck.state.step,
                    ck.state.tokens_seen
                );
            }
            (ck.model, ck.opt, ck.state)
        }
        None => {
            let model = match &init {
                Some((src, changes)) => {
                    let m = crate::init_from::load_initial_model(src, &run.model)
                        .with_context(|| format!("--init-from {}", src.dir.display()))?;
                    if opts.verbose {
                        eprintln!("initial weights: {} ({} parameters)", src.dir.display(), m.params.numel());
                        for c in changes {
                            eprintln!("changed: {c}");
                        }
                    }
                    m
                }
                None => init_model(&run.model, tc.seed),
            };
            let opt = AdamW::new(tc.adamw(), &model.params);
            let state = TrainerState {
                step: 0,
                tokens_seen: 0,
                data: loader.state(),
                config_hash: hash.clone(),
                run: run.clone(),
                data_dir: opts.data.display().to_string(),
                elapsed_s: 0.0,
                last_val_loss: None,
                finished: false,
                init_from: init.as_ref().map(|(src, _)| src.dir.display().to_string()),
            };
            (model, opt, state)
        }
    };
    // Cadence settings may change on resume; the state records the run as now configured.
    state.run = run.clone();
    state.data_dir = opts.data.display().to_string();
    if rank0 {
        let run_json = serde_json::to_string_pretty(&run).unwrap();
        replace_file(&out.join(RUN_FILE), run_json.as_bytes())?;
    }

    let total_steps = tc.total_steps();
    let title = format!("{} {}", run.model.num_hidden_layers, "layers");
    let plot_title = format!(
        "{} (d={}, {} layers) on {}",
        variant_title(&run.model),
        run.model.hidden_size,
        run.model.num_hidden_layers,
        ds.manifest()
            .sources
            .first()
            .and_then(|s| Path::new(s).file_name().map(|n| n.to_string_lossy().to_string()))
            .unwrap_or_else(|| opts.data.display().to_string())
    );
    let _ = title;
    if state.finished || state.step >= total_steps {
        if opts.verbose {
            eprintln!("the run in {} is already complete ({} steps)", out.display(), state.step);
        }
        let ck = latest_checkpoint(out)?.unwrap_or_else(|| out.join(FINAL_DIR));
        return Ok(TrainReport {
            outcome: Outcome::AlreadyFinished,
            step: state.step,
            tokens_seen: state.tokens_seen,
            checkpoint: ck,
            first_val_loss: None,
            last_val_loss: state.last_val_loss,
            last_train_loss: None,
            tokens_per_s: 0.0,
            elapsed_s: 0.0,
            init_changes: vec![],
        });
    }
    let mut metrics = match rank0 {
        true => Some(MetricsLog::open(
            out,
            if state.step > 0 || opts.resume { Some(state.step) } else { None },
            opts.tensorboard.as_deref(),
        )?),
        false => None,
    };
    let schedule = tc.schedule();
    let accum = tc.batch_size / tc.micro_batch;
    let mut engine = make_engine(&model, &opt, opts, tc.micro_batch, tc.context)?;

    let pb = if opts.progress {
        let pb = indicatif::ProgressBar::new(total_steps);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:28} {pos}/{len} steps | {msg} | ETA {eta}",
            )
            .expect("template")
            .progress_chars("=> "),
        );
        pb.set_position(state.step);
        pb.reset_eta();
        pb
    } else {
        indicatif::ProgressBar::hidden()
    };
    let say = |s: String| {
        if opts.verbose {
            if pb.is_hidden() {
                eprintln!("{s}");
            } else {
                pb.println(s);
            }
        }
    };

    say(format!("device: {}", engine.describe()));
    let mut first_val = None;
    let elapsed0 = state.elapsed_s;
    let run_start = Instant::now();
    let validate = |engine: &mut Box<dyn Engine>,
                    model: &mut Model,
                    state: &mut TrainerState,
                    metrics: &mut Option<MetricsLog>|
     -> Result<Option<f64>> {
        let v = engine.validation_loss(model, &ds, tc.context, tc.eval_tokens)?;
        if let Some(v) = v {
            state.last_val_loss = Some(v);
            if let Some(metrics) = metrics.as_mut() {
                metrics.write(&Metric {
                    kind: "val".into(),
                    step: state.step,
                    tokens: state.tokens_seen,
                    loss: None,
                    val_loss: Some(v),
                    lr: None,
                    grad_norm: None,
                    tokens_per_s: None,
                    elapsed_s: elapsed0 + run_start.elapsed().as_secs_f64(),
                })?;
            }
        }
        Ok(v)
    };
    if state.step == 0 {
        match validate(&mut engine, &mut model, &mut state, &mut metrics)? {
            Some(v) => {
                first_val = Some(v);
                say(format!("step 0: validation loss {v:.4}"));
            }
            None => say(format!(
                "note: the validation split ({} tokens) is shorter than one window of {}: no validation loss",
                ds.num_tokens(Split::Val),
                tc.context
            )),
        }
    }
    let mut last_saved: Option<PathBuf> = latest_checkpoint(out)?;
    let mut last_loss = None;
    let mut steps_this_run = 0u64;
    let mut outcome = Outcome::Finished;
    let log_text_every = (total_steps / 20).max(1);
    let save =
        |name: &str, model: &Model, opt: &AdamW, state: &TrainerState, last: &Option<PathBuf>| -> Result<PathBuf> {
            save_checkpoint(out, name, model, opt, state).with_context(|| {
                format!(
                    "saving checkpoint {name} failed; the last good checkpoint is {}",
                    last.as_ref().map_or("(none yet)".to_string(), |p| p.display().to_string())
                )
            })
        };

    while state.step < total_steps {
        let t0 = Instant::now();
        let st = engine.grads(&mut model, &mut loader, tc.micro_batch, accum, tc.max_grad_norm)?;
        let (loss, norm) = (st.loss, st.grad_norm);
        if !loss.is_finite() || !norm.is_finite() {
            pb.abandon();
            bail!(
                "training diverged at step {}: loss {loss}, gradient norm {norm}; stopped without updating. \
                 The last good checkpoint is {} (resume from it with a lower --lr)",
                state.step + 1,
                last_saved
                    .as_ref()
                    .map_or("(none: no checkpoint was written yet)".to_string(), |p| p.display().to_string())
            );
        }
        let lr = schedule.lr(state.tokens_seen);
        engine.update(&mut model, &mut opt, lr)?;
        state.step += 1;
        steps_this_run += 1;
        state.tokens_seen += tc.tokens_per_step();
        state.data = loader.state();
        state.elapsed_s = elapsed0 + run_start.elapsed().as_secs_f64();
        last_loss = Some(loss);
        let dt = t0.elapsed().as_secs_f64();
        let tps = steps_this_run as f64 * tc.tokens_per_step() as f64 / run_start.elapsed().as_secs_f64();
        if let Some(metrics) = metrics.as_mut().filter(|_| state.step % tc.log_every == 0 || state.step == total_steps)
        {
            metrics.write(&Metric {
                kind: "train".into(),
                step: state.step,
                tokens: state.tokens_seen,
                loss: Some(loss),
                val_loss: None,
                lr: Some(lr),
                grad_norm: Some(norm),
                tokens_per_s: Some(tc.tokens_per_step() as f64 / dt),
                elapsed_s: state.elapsed_s,
            })?;
        }
        pb.set_message(format!("loss {loss:.3} | lr {lr:.2e} | {} tok/s", fmt_tokens(tps)));
        pb.set_position(state.step);
        if pb.is_hidden() && opts.verbose && state.step % log_text_every == 0 {
            eprintln!(
                "step {}/{total_steps}: loss {loss:.4}, lr {lr:.2e}, {} tok/s, {} tokens",
                state.step,
                fmt_tokens(tps),
                fmt_tokens(state.tokens_seen as f64)
            );
        }
        let done = state.step >= total_steps;
        if (tc.eval_every > 0 && state.step % tc.eval_every == 0) || done {
            if let Some(v) = validate(&mut engine, &mut model, &mut state, &mut metrics)? {
                say(format!("step {}: validation loss {v:.4}", state.step));
            }
            if rank0 {
                let _ = plot_losses(out, &plot_title);
            }
        }
        // Every rank stops at the same step (Ctrl-C may reach them at different ones).
        let stop = STOP.load(Ordering::SeqCst) || opts.stop_after.is_some_and(|s| state.step >= s);
        let stop = engine.any_rank(stop)?;
        let checkpoint_now = (tc.checkpoint_every > 0 && state.step % tc.checkpoint_every == 0) || stop;
        if done || checkpoint_now {
            engine.sync(&mut model, &mut opt)?;
        }
        if done {
            state.finished = true;
            if rank0 {
                last_saved = Some(save(FINAL_DIR, &model, &opt, &state, &last_saved)?);
            }
            break;
        }
        if checkpoint_now && rank0 {
            let p = save(&format!("checkpoint-{:06}", state.step), &model, &opt, &state, &last_saved)?;
            prune_checkpoints(out, tc.keep_last);
            last_saved = Some(p);
        }
        crate::dist::heartbeat();
        if stop {
            outcome = Outcome::Interrupted;
            break;
        }
    }
    pb.finish_and_clear();
    if rank0 {
        let _ = plot_losses(out, &plot_title);
    }
    let elapsed = t_start.elapsed().as_secs_f64();
    Ok(TrainReport {
        outcome,
        step: state.step,
        tokens_seen: state.tokens_seen,
        checkpoint: last_saved.unwrap_or_else(|| out.join(FINAL_DIR)),
        first_val_loss: first_val,
        last_val_loss: state.last_val_loss,
        last_train_loss: last_loss,
        tokens_per_s: steps_this_run as f64 * tc.tokens_per_step() as f64 / run_start.elapsed().as_secs_f64().max(1e-9),
        elapsed_s: elapsed,
        init_changes: init.map(|(_, c)| c).unwrap_or_default(),
    })
}

/// "FoX (Pro)", "Transformer (LLaMA)", ... or "custom" for other switch combinations.
pub fn variant_title(c: &Config) -> &'static str {
    let pro = c.qk_norm && c.use_output_gate && c.use_output_norm && c.use_k_shift && c.use_v_shift;
    let llama = !c.qk_norm && !c.use_output_gate && !c.use_output_norm && !c.use_k_shift && !c.use_v_shift;
    match (c.fgate_type, c.use_rope, pro, llama) {
        (FgateType::Full, false, true, _) => "FoX (Pro)",
        (FgateType::Full, false, _, true) => "FoX (LLaMA)",
        (FgateType::None, true, true, _) => "Transformer (Pro)",
        (FgateType::None, true, _, true) => "Transformer (LLaMA)",
        _ => "custom model",
    }
}

/// Unigram entropy (nats/token) of a split's tokens (each document followed by EOS, as the
/// loader streams them): the loss of the best model that ignores context.
pub fn unigram_entropy(ds: &Dataset, split: Split) -> f64 {
    let mut counts = vec![0u64; ds.manifest().vocab_size.max(crate::tokenizer::EOS_ID as usize + 1)];
    for i in 0..ds.num_documents(split) {
        for t in ds.document(split, i) {
            counts[t as usize] += 1;
        }
        counts[crate::tokenizer::EOS_ID as usize] += 1;
    }
    let n: u64 = counts.iter().sum();
    counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n as f64;
            -p * p.ln()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_is_seeded_and_follows_the_spec() {
        let cfg = crate::presets::tiny().model;
        let a = init_model(&cfg, 1);
        let b = init_model(&cfg, 1);
        let c = init_model(&cfg, 2);
        assert_eq!(a.params.tensors, b.params.tensors);
        assert_ne!(a.params.tensors[0], c.params.tensors[0]);
        for i in 0..a.params.len() {
            let (name, data) = (&a.params.names[i], &a.params.tensors[i].data);
            match a.params.kinds[i] {
                ParamKind::Matrix => {
                    let n = data.len() as f64;
                    let mean = data.iter().map(|&x| x as f64).sum::<f64>() / n;
                    let std = (data.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
                    // five standard errors of the sample mean and std of n draws of N(0, 0.02²)
                    let (tm, ts) = ((5.0 * 0.02 / n.sqrt()).max(0.005), (5.0 * 0.02 / (2.0 * n).sqrt()).max(0.002));
                    assert!(mean.abs() < tm && (std - 0.02).abs() < ts, "{name}: mean {mean} std {std}");
                }
                _ if name.ends_with("norm.weight") => assert!(data.iter().all(|&x| x == 1.0), "{name}"),
                _ => assert!(data.iter().all(|&x| x == 0.0), "{name}"),
            }
        }
        let mut fixed = cfg.clone();
        fixed.fgate_type = FgateType::Fixed;
        fixed.decay_time_min = Some(2.0);
        fixed.decay_time_max = Some(100.0);
        let m = init_model(&fixed, 0);
        let id = m.params.id("model.layers.0.attn.fgate_bias").unwrap();
        assert_eq!(&m.params[id], &fixed_fgate_bias(&fixed)[..]);
    }

    #[test]
    fn config_validation_and_diff() {
        let p = crate::presets::tiny();
        let run = RunConfig { model: p.model.clone(), train: p.train.clone() };
        let mut other = run.clone();
        other.train.eval_every = 7;
        assert_eq!(config_hash(&run, "d"), config_hash(&other, "d"), "cadence does not change the hash");
        other.train.peak_lr = 1.0;
        other.model.hidden_size = p.model.hidden_size + 32;
        assert_ne!(config_hash(&run, "d"), config_hash(&other, "d"));
        assert_ne!(config_hash(&run, "d"), config_hash(&run, "e"));
        let d = config_diff(&run, &other);
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[0].starts_with("model.hidden_size") && d[1].starts_with("train.peak_lr"), "{d:?}");
        let mut bad = p.train.clone();
        bad.micro_batch = 3;
        assert!(bad.validate().is_err());
    }
}
