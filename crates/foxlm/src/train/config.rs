//! A run's configuration ([`RunConfig`]: model and [`TrainConfig`]) and its identity hash.

use super::TRAIN_CONTEXT_KEY;
use crate::config::Config;
use crate::data::Dataset;
use crate::hex::hex;
use crate::optim::{AdamWConfig, Schedule};
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

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

/// The fields on which two runs (model and training configuration) differ, as
/// "section.field: a (checkpoint) vs b (now)" lines.
pub(super) fn run_diff(old: &RunConfig, new: &RunConfig) -> Vec<String> {
    let mut out = Vec::new();
    for (section, a, b) in [
        ("model", model_identity(&old.model), model_identity(&new.model)),
        ("train", old.train.identity(), new.train.identity()),
    ] {
        let show = |v: Option<serde_json::Value>| v.map_or("(absent)".to_string(), |v| v.to_string());
        for (k, a, b) in crate::config::json_field_diff(a.as_object().unwrap(), b.as_object().unwrap()) {
            out.push(format!("{section}.{k}: {} (checkpoint) vs {} (now)", show(a), show(b)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let d = run_diff(&run, &other);
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[0].starts_with("model.hidden_size") && d[1].starts_with("train.peak_lr"), "{d:?}");
        let mut bad = p.train.clone();
        bad.micro_batch = 3;
        assert!(bad.validate().is_err());
    }
}
