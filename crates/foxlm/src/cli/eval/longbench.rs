//! `foxlm eval longbench`: LongBench from its released jsonl files, a prompt per dataset,
//! truncation in the middle, greedy answers, the benchmark's metric per dataset.

use super::{progress_bar, write_file, GreedyArgs};
use crate::checkpoint::load_model;
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct LongbenchArgs {
    #[command(flatten)]
    pub common: GreedyArgs,
    /// A task file (DATASET.jsonl, as LongBench releases them) or a folder of them.
    #[arg(long)]
    pub data: PathBuf,
    /// Only these datasets (file stems), comma-separated.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub datasets: Vec<String>,
    /// Longest prompt in tokens: longer ones keep their first and last halves (default: the
    /// model's training context, else 2048).
    #[arg(long)]
    pub max_length: Option<usize>,
    /// At most this many samples per dataset (default: all).
    #[arg(long)]
    pub limit: Option<usize>,
}

pub(super) fn run(a: LongbenchArgs) -> Result<()> {
    use crate::eval::longbench as lb;
    let mut files: Vec<PathBuf> = if a.data.is_dir() {
        crate::data::list_inputs(std::slice::from_ref(&a.data))?
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
            .collect()
    } else {
        vec![a.data.clone()]
    };
    let stem = |p: &Path| p.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    if !a.datasets.is_empty() {
        for d in &a.datasets {
            if !files.iter().any(|f| &stem(f) == d) {
                bail!("--datasets {d}: no {d}.jsonl in {}", a.data.display());
            }
        }
        files.retain(|f| a.datasets.contains(&stem(f)));
    }
    if files.is_empty() {
        bail!("--data {}: no .jsonl task files", a.data.display());
    }
    let mut tasks = Vec::new();
    for f in &files {
        let d =
            lb::dataset(&stem(f)).with_context(|| format!("{} (the file's name names its dataset)", f.display()))?;
        let mut samples = lb::read_jsonl(f)?;
        if let Some(n) = a.limit {
            samples.truncate(n);
        }
        tasks.push((d, samples));
    }
    let c = &a.common;
    let model = load_model(&c.model)?;
    let cfg = &model.config;
    let enc = c.text.encoder(cfg)?;
    let max_len = a.max_length.or(cfg.train_context()).unwrap_or(2048);
    if max_len < 2 {
        bail!("--max-length must be at least 2");
    }
    let what = format!("--max-length {max_len}: the KV cache");
    let device = c.device(&model, max_len, max_len.saturating_add(512), 0, &what)?;
    let mut engine = c.engine(&model, &device, max_len)?;
    let total: u64 = tasks.iter().map(|(_, s)| s.len() as u64).sum();
    let pb = progress_bar(total, "samples");
    let mut results = serde_json::Map::new();
    let mut rows = Vec::new();
    for (d, samples) in &tasks {
        let mut cells = Vec::new();
        let mut sum = 0.0;
        for (i, s) in samples.iter().enumerate() {
            pb.set_message(d.name.to_string());
            let mut ids = vec![enc.bos];
            ids.extend(enc.encode(&lb::prompt(d, s)));
            let full = ids.len();
            let ids = lb::truncate_middle(&ids, max_len);
            let out = engine.greedy(&ids, d.max_new_tokens, c.chunk, enc.eos, &mut |_| {})?;
            let pred = enc.decode(&out);
            let sc = lb::best_score(d.metric, &pred, s);
            sum += sc;
            cells.push(json!({"index": i, "prompt_tokens": full, "kept_tokens": ids.len(), "prediction": pred, "answers": s.answers, "score": sc}));
            pb.inc(1);
        }
        let mean = if samples.is_empty() { f64::NAN } else { 100.0 * sum / samples.len() as f64 };
        rows.push((d.name, d.metric, samples.len(), mean));
        results.insert(
            d.name.to_string(),
            json!({"metric": d.metric, "max_new_tokens": d.max_new_tokens, "samples": samples.len(), "score": mean, "cells": cells}),
        );
    }
    pb.finish_and_clear();
    let report = json!({
        "model": c.model.display().to_string(),
        "text_format": enc.format(),
        "vocab_folded": enc.fold,
        "max_length": max_len,
        "datasets": results,
    });
    write_file(&c.out.join("longbench.json"), serde_json::to_string_pretty(&report)?.as_bytes())?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "| dataset | metric | samples | score |\n|---|---|---:|---:|")?;
    for (name, metric, n, mean) in rows {
        writeln!(stdout, "| {name} | {} | {n} | {mean:.2} |", serde_json::to_value(metric)?.as_str().unwrap_or(""))?;
    }
    writeln!(stdout, "wrote longbench.json to {}", c.out.display())?;
    Ok(())
}
