//! A run's checkpoints: written atomically into OUT/checkpoint-<step>/ and OUT/final/, listed,
//! pruned and loaded back.

use super::*;
use crate::checkpoint::{self, load_model, CONFIG_FILE, WEIGHTS_FILE};
use crate::config::Config;
use crate::data::LoaderState;
use crate::fsutil::{sync_dir, write_atomic, write_synced};
use crate::model::Model;
use crate::optim::{AdamW, AdamWConfig};
use crate::tensor::ParamKind;
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

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
        write_atomic(&out.join(LATEST_FILE), name.as_bytes())?;
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
/// against the checkpoint's config (see [`check_trainer_state`]) and the
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
    check_trainer_state(&state, &adamw, opt_step, &cfg, &tpath)?;
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

pub(super) fn prune_checkpoints(out: &Path, keep: usize) {
    let cks = list_checkpoints(out);
    if cks.len() > keep {
        for (_, p) in &cks[..cks.len() - keep] {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// Checks a checkpoint's trainer state (trainer.json at `path`) before the checkpoint is used
/// to resume: its run configuration valid, its model the one in the checkpoint's config.json
/// (`model`), and its counters consistent with each other (a state from another run, or edited,
/// would otherwise resume silently wrong).
pub fn check_trainer_state(
    state: &TrainerState,
    adamw: &crate::optim::AdamWConfig,
    optimizer_step: u64,
    model: &crate::config::Config,
    path: &Path,
) -> Result<()> {
    let p = path.display();
    state.run.model.validate().with_context(|| format!("{p}: run.model"))?;
    let t = &state.run.train;
    // Bound the sizes first so the recipe's own arithmetic (tokens per step) cannot overflow.
    for (field, v) in [("context", t.context), ("batch_size", t.batch_size), ("micro_batch", t.micro_batch)] {
        if v > 1 << 32 {
            bail!("{p}: run.train.{field} is {v}; expected at most {}", 1u64 << 32);
        }
    }
    t.validate().with_context(|| format!("{p}: run.train"))?;
    let diff = crate::config::config_diff(&state.run.model, model);
    if !diff.is_empty() {
        bail!(
            "{p}: the state belongs to another model than this checkpoint's config.json ({}): is it from another run?",
            diff.join("; ")
        );
    }
    let per_step = t.tokens_per_step();
    if state.step.checked_mul(per_step) != Some(state.tokens_seen) {
        bail!(
            "{p}: tokens_seen is {} but step {} x {per_step} tokens per step is {}",
            state.tokens_seen,
            state.step,
            state.step as u128 * per_step as u128
        );
    }
    if state.step > t.total_steps() {
        bail!("{p}: step is {}, past the run's last step {}", state.step, t.total_steps());
    }
    if optimizer_step != state.step {
        bail!("{p}: optimizer_step is {optimizer_step} but the trainer is at step {}", state.step);
    }
    if adamw != &t.adamw() {
        bail!("{p}: adamw settings {adamw:?} differ from the run's {:?}", t.adamw());
    }
    if state.data.seed != t.seed {
        bail!("{p}: data.seed is {} but the run's seed is {}", state.data.seed, t.seed);
    }
    if !(state.elapsed_s.is_finite() && state.elapsed_s >= 0.0) {
        bail!("{p}: elapsed_s is {:?}; expected a finite time >= 0", state.elapsed_s);
    }
    if let Some(l) = state.last_val_loss {
        if !l.is_finite() || l < 0.0 {
            bail!("{p}: last_val_loss is {l:?}; expected a finite loss >= 0");
        }
    }
    Ok(())
}
