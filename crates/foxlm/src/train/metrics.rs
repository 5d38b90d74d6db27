//! The run's metrics: OUT/metrics.jsonl, its loss plot and TensorBoard events.

use super::*;
use crate::config::{Config, FgateType};
use crate::data::{Dataset, Split};
use crate::fsutil::write_atomic;
use crate::plot::{LinePlot, Series};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

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

pub(super) struct MetricsLog {
    file: std::fs::File,
    path: PathBuf,
    /// The same metrics as TensorBoard events (`--tensorboard`).
    events: Option<crate::tensorboard::EventWriter>,
}

impl MetricsLog {
    /// Opens OUT/metrics.jsonl for appending, first dropping lines past `step` (left by a run
    /// that went on after its last checkpoint), and a new event file in `tensorboard`.
    pub(super) fn open(out: &Path, keep_until_step: Option<u64>, tensorboard: Option<&Path>) -> Result<Self> {
        let path = out.join(METRICS_FILE);
        match keep_until_step {
            Some(s) => {
                let kept: String = std::fs::read_to_string(&path)
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| serde_json::from_str::<Metric>(l).is_ok_and(|m| m.step <= s))
                    .map(|l| format!("{l}\n"))
                    .collect();
                write_atomic(&path, kept.as_bytes())?;
            }
            None => write_atomic(&path, b"")?,
        }
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        let events = tensorboard.map(crate::tensorboard::EventWriter::create).transpose()?;
        Ok(Self { file, path, events })
    }

    pub(super) fn write(&mut self, m: &Metric) -> Result<()> {
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

pub(super) fn fmt_tokens(t: f64) -> String {
    if t.abs() < 1e4 {
        format!("{t:.0}")
    } else {
        crate::plot::tick(t)
    }
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
