//! `foxlm eval ruler`: RULER-style synthetic tasks (multi-key and multi-value needles, variable
//! tracking, common-word extraction) at chosen lengths, answered greedily, scored by string match.

use super::{progress_bar, read_haystack, write_file, GreedyArgs};
use crate::checkpoint::load_model;
use crate::eval::niah::Haystack;
use anyhow::{Context, Result};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct RulerArgs {
    #[command(flatten)]
    pub common: GreedyArgs,
    /// Filler text (and the words of cwe): a text file, or a folder of .txt files; repeated when
    /// shorter than the longest prompt.
    #[arg(long)]
    pub haystack: PathBuf,
    /// Prompt lengths in tokens, comma-separated.
    #[arg(long, required = true, value_delimiter = ',', num_args = 1..)]
    pub lengths: Vec<usize>,
    /// Tasks, comma-separated (default: all four).
    #[arg(long, value_enum, value_delimiter = ',', num_args = 1.., default_value = "multikey,multivalue,vt,cwe")]
    pub tasks: Vec<crate::eval::ruler::Task>,
    /// Samples per task and length.
    #[arg(long, default_value_t = 4)]
    pub samples: usize,
    /// Seed of the needles, keys, values and lists.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Most tokens of each greedy answer.
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
}

pub(super) fn run(a: RulerArgs) -> Result<()> {
    use crate::eval::ruler;
    ruler::check_lengths(&a.lengths, a.samples)?;
    let c = &a.common;
    let model = load_model(&c.model)?;
    let cfg = &model.config;
    let enc = c.text.encoder(cfg)?;
    let max_len = a.lengths.iter().copied().max().unwrap_or(0);
    let what = format!("--lengths {max_len}: the KV cache");
    let device = c.device(&model, max_len, max_len.saturating_add(a.max_new_tokens), 0, &what)?;
    let text = read_haystack(&a.haystack)?;
    let hay = Haystack::from_text(&text, max_len, |s| enc.encode(s))?;
    let words = ruler::word_pool(&text);
    let sizes = ruler::Sizes::default();
    let mut engine = c.engine(&model, &device, max_len)?;
    let encode = |s: &str| enc.encode(s);
    let mut cells = vec![];
    let mut table = vec![vec![f64::NAN; a.lengths.len()]; a.tasks.len()];
    let total = (a.tasks.len() * a.lengths.len() * a.samples) as u64;
    let pb = progress_bar(total, "samples");
    for (ti, &task) in a.tasks.iter().enumerate() {
        for (li, &len) in a.lengths.iter().enumerate() {
            let mut sum = 0.0;
            for i in 0..a.samples {
                pb.set_message(format!("{} at {len}", task.name()));
                let s = ruler::build(task, &hay, &words, &sizes, &encode, enc.bos, len, a.seed, i as u64)
                    .with_context(|| format!("{} at length {len}", task.name()))?;
                let ids = engine.greedy(&s.ids, a.max_new_tokens, c.chunk, enc.eos, &mut |_| {})?;
                let response = enc.decode(&ids);
                let sc = ruler::score(&response, &s.answers);
                sum += sc;
                cells.push(json!({
                    "task": task, "length": len, "sample": i, "prompt_tokens": s.ids.len(),
                    "answers": s.answers, "response": response, "score": sc,
                }));
                pb.inc(1);
            }
            table[ti][li] = 100.0 * sum / a.samples as f64;
        }
    }
    pb.finish_and_clear();
    let report = json!({
        "model": c.model.display().to_string(),
        "text_format": enc.format(),
        "vocab_folded": enc.fold,
        "lengths": a.lengths,
        "tasks": a.tasks,
        "samples": a.samples,
        "seed": a.seed,
        "sizes": sizes,
        "scores_percent": a.tasks.iter().zip(&table).map(|(t, r)| (t.name().to_string(), json!(r))).collect::<serde_json::Map<_, _>>(),
        "cells": cells,
    });
    write_file(&c.out.join("ruler.json"), serde_json::to_string_pretty(&report)?.as_bytes())?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{:>10}  {}", "task", a.lengths.iter().map(|l| format!("{l:>7}")).collect::<Vec<_>>().join(" "))?;
    for (t, row) in a.tasks.iter().zip(&table) {
        let cells: Vec<String> = row.iter().map(|v| format!("{v:>7.1}")).collect();
        writeln!(stdout, "{:>10}  {}", t.name(), cells.join(" "))?;
    }
    writeln!(
        stdout,
        "scores: % of expected strings found, {} samples each; wrote ruler.json to {}",
        a.samples,
        c.out.display()
    )?;
    Ok(())
}
