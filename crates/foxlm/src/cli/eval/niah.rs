//! `foxlm eval niah`: the needle in a haystack test, a grid of context lengths × needle depths
//! answered greedily and scored 0-10; JSON and a heatmap PNG.

use super::{model_name, progress_bar, read_haystack, write_file, GreedyArgs};
use crate::checkpoint::load_model;
use crate::eval::niah::{self, Haystack, Mode};
use crate::eval::plots;
use anyhow::{bail, Result};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct NiahArgs {
    #[command(flatten)]
    pub common: GreedyArgs,
    /// Filler text: a text file, or a folder whose .txt files are joined in natural order. It is
    /// repeated when shorter than the longest context.
    #[arg(long)]
    pub haystack: PathBuf,
    /// easy: the needle carries the question too; standard: the needle is the bare statement.
    #[arg(long, value_enum, default_value_t = Mode::Standard)]
    pub mode: Mode,
    /// Prompt lengths in tokens (BOS, haystack, needle and question together), comma-separated.
    #[arg(long, required = true, value_delimiter = ',', num_args = 1..)]
    pub lengths: Vec<usize>,
    /// Needle depths in percent of the haystack (0 = start, 100 = end), comma-separated.
    #[arg(long, value_delimiter = ',', num_args = 1.., default_value = "0,10,20,30,40,50,60,70,80,90,100")]
    pub depths: Vec<f64>,
    /// Most tokens of the greedy answer.
    #[arg(long, default_value_t = 32)]
    pub max_new_tokens: usize,
    /// The model's training context for the heatmap's marker, where the checkpoint does not record it.
    #[arg(long)]
    pub train_context: Option<usize>,
}

pub(super) fn run(a: NiahArgs) -> Result<()> {
    if a.lengths.is_empty() || a.depths.is_empty() {
        bail!("--lengths and --depths need at least one value each");
    }
    if let Some(d) = a.depths.iter().find(|d| !(0.0..=100.0).contains(*d)) {
        bail!("--depths are percentages in [0, 100]; got {d}");
    }
    let c = &a.common;
    let model = load_model(&c.model)?;
    let cfg = &model.config;
    let enc = c.text.encoder(cfg)?;
    let needle_text = a.mode.needle();
    let question_text = niah::question_suffix();
    let needle = enc.encode(&needle_text);
    let question = enc.encode(&question_text);
    let fixed = 1 + needle.len() + question.len();
    if let Some(&l) = a.lengths.iter().find(|&&l| l <= fixed) {
        bail!(
            "--lengths {l}: too short for the needle ({} tokens) and the question ({} tokens) after BOS: \
             every length must exceed {fixed} tokens",
            needle.len(),
            question.len()
        );
    }
    let max_len = a.lengths.iter().copied().max().unwrap_or(0);
    let what = format!("--lengths {max_len} with --max-new-tokens {}: the KV cache and haystack", a.max_new_tokens);
    let device = c.device(&model, max_len, max_len.saturating_add(a.max_new_tokens), max_len as u128 * 8, &what)?;
    let hay = Haystack::from_text(&read_haystack(&a.haystack)?, max_len, |s| enc.encode(s))?;
    let train_context = cfg.train_context().or(a.train_context);
    let mut engine = c.engine(&model, &device, max_len)?;

    let total: u64 = a.lengths.iter().map(|&l| (l * a.depths.len()) as u64).sum();
    let pb = progress_bar(total, "tokens");
    let mut cells = vec![];
    let mut scores = vec![f64::NAN; a.lengths.len() * a.depths.len()];
    for (li, &len) in a.lengths.iter().enumerate() {
        for (di, &depth) in a.depths.iter().enumerate() {
            pb.set_message(format!("length {len}, depth {depth}%"));
            let p = niah::build_prompt(&hay, &needle, &question, enc.bos, len, depth / 100.0)?;
            let answer_ids = engine.greedy(&p.ids, a.max_new_tokens, c.chunk, enc.eos, &mut |t| pb.inc(t as u64))?;
            let response = enc.decode(&answer_ids);
            let score = niah::score_answer(&response, niah::ANSWER);
            scores[di * a.lengths.len() + li] = score;
            cells.push(json!({
                "length": len,
                "depth_percent": depth,
                "actual_depth_percent": 100.0 * p.actual_depth,
                "needle_start": p.needle_start,
                "needle_tokens": p.needle_tokens,
                "haystack_tokens": p.haystack_tokens,
                "response": response,
                "score": score,
            }));
        }
    }
    pb.finish_and_clear();
    let mean = scores.iter().sum::<f64>() / scores.len() as f64;
    let name = model_name(&c.model);
    let report = json!({
        "model": c.model.display().to_string(),
        "mode": a.mode,
        "text_format": enc.format(),
        "vocab_folded": enc.fold,
        "needle": needle_text,
        "question": question_text,
        "answer": niah::ANSWER,
        "lengths": a.lengths,
        "depths_percent": a.depths,
        "train_context": train_context,
        "mean_score": mean,
        "cells": cells,
    });
    write_file(&c.out.join("niah.json"), serde_json::to_string_pretty(&report)?.as_bytes())?;
    let mode = match a.mode {
        Mode::Easy => "easy",
        Mode::Standard => "standard",
    };
    plots::niah_heatmap(
        &c.out.join("niah.png"),
        &format!("Needle in a haystack ({mode}): {name}, mean score {mean:.2}"),
        &a.lengths,
        &a.depths,
        &scores,
        train_context,
    )?;

    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "{:>8}  {}",
        "depth %",
        a.lengths.iter().map(|l| format!("{l:>7}")).collect::<Vec<_>>().join(" ")
    )?;
    for (di, d) in a.depths.iter().enumerate() {
        let row: Vec<String> =
            (0..a.lengths.len()).map(|li| format!("{:>7.1}", scores[di * a.lengths.len() + li])).collect();
        writeln!(stdout, "{d:>8}  {}", row.join(" "))?;
    }
    writeln!(stdout, "mean score {mean:.2} / 10; wrote niah.json and niah.png to {}", c.out.display())?;
    Ok(())
}
