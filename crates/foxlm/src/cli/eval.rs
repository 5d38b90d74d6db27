//! `foxlm eval`: per-token loss and perplexity over context length (`loss`), the needle in a
//! haystack test (`niah`), RULER-style synthetic tasks (`ruler`) and LongBench (`longbench`). See
//! docs/evaluation.md.

use crate::checkpoint::load_model;
use crate::config::Config;
use crate::data::{Dataset, Split};
use crate::eval::loss::{self, LossCurve, Windows};
use crate::eval::niah::{self, Haystack, Mode};
use crate::eval::plots::{self, LineChart, Series};
use crate::eval::text::{text_format_for, TextEncoder};
use crate::infer::{self, Infer, Plan};
use crate::model::Model;
use crate::tokenizer::{TextFormat, BOS_ID, EOS_ID};
use anyhow::{bail, Context, Result};
use fox_kernels::cuda::Device;
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};

pub type Args = super::Subcommands<Command>;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Per-token loss L(i) at every position and perplexity P(l) at context lengths 2^k, for one
    /// or several models on the same validation sequences; CSV, JSON and PNG plots.
    Loss(LossArgs),
    /// Needle in a haystack: a grid of context lengths × needle depths, answered greedily and
    /// scored 0-10; JSON and a heatmap PNG.
    Niah(NiahArgs),
    /// RULER-style synthetic tasks at chosen lengths over any haystack: multi-key and multi-value
    /// needles, variable tracking, common-word extraction; answered greedily, scored by string
    /// match; JSON and a table.
    Ruler(RulerArgs),
    /// LongBench from its released jsonl files: a prompt per dataset, truncation in the middle,
    /// greedy answers, the benchmark's metric per dataset; JSON and a table.
    Longbench(LongbenchArgs),
    /// Compare the L(i) curves of separate `eval loss` runs: overlay, differences to a baseline,
    /// and a Markdown table of range means (with final validation loss from training folders).
    Compare(crate::cli::eval_compare::CompareArgs),
}

#[derive(clap::Args, Debug)]
pub struct LossArgs {
    /// Model folder (config.json + model.safetensors); repeat to compare models on one plot.
    #[arg(long, required = true, num_args = 1..)]
    pub model: Vec<PathBuf>,
    /// Legend name of each model, in --model order (default: the folder's name).
    #[arg(long)]
    pub name: Vec<String>,
    /// Prepared dataset (`foxlm data prepare`); its validation split is read.
    #[arg(long)]
    pub data: PathBuf,
    /// Context length N: positions 0..N are scored. May exceed the training context.
    #[arg(long)]
    pub context: usize,
    /// Number of validation sequences K to average over.
    #[arg(long, default_value_t = 16)]
    pub sequences: usize,
    /// Cut sequences from the validation documents joined with EOS, instead of taking the first
    /// N tokens of documents at least N long.
    #[arg(long)]
    pub pack: bool,
    /// Window of the centred moving average for the L(i) plot.
    #[arg(long, default_value_t = 101)]
    pub window: usize,
    /// Tokens per prefill chunk (memory grows with it; results do not change).
    #[arg(long, default_value_t = 2048)]
    pub chunk: usize,
    /// Sequences evaluated together.
    #[arg(long, default_value_t = 1)]
    pub batch_size: usize,
    /// Training context of each model for the plots' dashed lines, in --model order, where the
    /// checkpoint does not record it (config.json's foxlm_train_context).
    #[arg(long)]
    pub train_context: Vec<usize>,
    /// Output folder.
    #[arg(long, default_value = "eval-out")]
    pub out: PathBuf,
    /// Testing only: fold token ids modulo a model's vocabulary when it is smaller than the data's.
    #[arg(long, hide = true)]
    pub fold_vocab: bool,
    #[command(flatten)]
    pub device: super::DeviceArgs,
}

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

/// The arguments of the greedy evaluations (niah, ruler, longbench): a model answering prompts
/// of its text, one at a time.
#[derive(clap::Args, Debug)]
pub struct GreedyArgs {
    /// Model folder (config.json + model.safetensors).
    #[arg(long)]
    pub model: PathBuf,
    /// json-escaped or plain GPT-2 BPE (default: the model's recorded format, else json-escaped).
    #[arg(long)]
    pub text_format: Option<TextFormat>,
    /// Tokens per prefill chunk.
    #[arg(long, default_value_t = 2048)]
    pub chunk: usize,
    /// Output folder (niah.json and niah.png, ruler.json, longbench.json).
    #[arg(long, default_value = "eval-out")]
    pub out: PathBuf,
    /// Testing only: fold GPT-2 ids modulo the vocabulary of a model smaller than GPT-2's.
    #[arg(long, hide = true)]
    pub fold_vocab: bool,
    #[command(flatten)]
    pub device: super::DeviceArgs,
}

impl GreedyArgs {
    fn encoder(&self, cfg: &Config) -> Result<TextEncoder> {
        TextEncoder::for_model(cfg, text_format_for(cfg, self.text_format), self.fold_vocab)
    }

    /// The device; on the CPU, refused (naming `what`) when a KV cache of `kv_len` positions, a
    /// prefill chunk of prompts up to `max_len` tokens and `extra` bytes would not fit in memory.
    fn device(&self, model: &Model, max_len: usize, kv_len: usize, extra: u128, what: &str) -> Result<Device> {
        let device = self.device.select_for(model)?;
        if !device.is_cuda() {
            let cfg = &model.config;
            let need = crate::validate::kv_cache_bytes(cfg, 1, kv_len)
                .saturating_add(crate::validate::forward_bytes(cfg, 1, self.chunk.clamp(1, max_len), false))
                .saturating_add(extra);
            crate::validate::check_memory(need, what)?;
        }
        Ok(device)
    }

    /// A one-prompt engine for prompts up to `max_len` tokens, and the output folder.
    fn engine<'m>(&self, model: &'m Model, device: &Device, max_len: usize) -> Result<Box<dyn Infer + 'm>> {
        let plan = Plan { batch: 1, chunk: self.chunk.clamp(1, max_len) };
        let engine = infer::open(model, device, self.device.dtype, plan)?;
        eprintln!("device: {}", engine.describe());
        create_out(&self.out)?;
        Ok(engine)
    }
}

fn run_longbench(a: LongbenchArgs) -> Result<()> {
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
    let enc = c.encoder(cfg)?;
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

fn run_ruler(a: RulerArgs) -> Result<()> {
    use crate::eval::ruler;
    ruler::check_lengths(&a.lengths, a.samples)?;
    let c = &a.common;
    let model = load_model(&c.model)?;
    let cfg = &model.config;
    let enc = c.encoder(cfg)?;
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

pub fn run(a: Args) -> Result<()> {
    match a.command {
        Command::Loss(a) => run_loss(a),
        Command::Niah(a) => run_niah(a),
        Command::Ruler(a) => run_ruler(a),
        Command::Longbench(a) => run_longbench(a),
        Command::Compare(a) => crate::cli::eval_compare::run(a),
    }
}

/// A progress bar on stderr (drawn only on a terminal).
pub fn progress_bar(total: u64, unit: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new(total);
    let template = format!("{{msg}} [{{bar:40}}] {{human_pos}}/{{human_len}} {unit} ({{per_sec}}, eta {{eta}})");
    pb.set_style(indicatif::ProgressStyle::with_template(&template).expect("valid template").progress_chars("=> "));
    pb
}

fn model_name(path: &Path) -> String {
    path.canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| path.display().to_string())
}

/// Maps data ids (GPT-2 vocabulary) into a model's: unchanged when they fit, folded when allowed.
fn id_mapper(cfg: &Config, data_vocab: usize, fold: bool, what: &Path) -> Result<impl Fn(u32) -> u32> {
    let v = cfg.vocab_size;
    if data_vocab > v && !fold {
        bail!(
            "{}: the model's vocabulary has {v} tokens but the data's has {data_vocab}; the model cannot read this data",
            what.display()
        );
    }
    if data_vocab > v {
        eprintln!(
            "warning: {}: folding data token ids modulo the model's vocabulary ({v}); the losses mean nothing",
            what.display()
        );
    }
    Ok(move |id: u32| if data_vocab > v { id % v as u32 } else { id })
}

fn create_out(out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create output folder {}", out.display()))
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}

fn run_loss(a: LossArgs) -> Result<()> {
    check_loss_args(&a)?;
    let data = Dataset::open(&a.data)?;
    let n = a.context;
    let seqs = loss_sequences(&a, &data)?;
    create_out(&a.out)?;
    let lengths = loss::power_of_two_lengths(n);
    let device = a.device.select()?;
    let pb = progress_bar((a.model.len() * seqs.len() * n) as u64, "tokens");
    let mut done: Vec<ModelCurve> = vec![];
    for (mi, path) in a.model.iter().enumerate() {
        let mut name = a.name.get(mi).cloned().unwrap_or_else(|| model_name(path));
        if done.iter().any(|d| d.name == name) {
            name = format!("{name} ({})", mi + 1);
        }
        let curve = model_curve(&a, mi, path, name, &device, &data, &seqs, &lengths, &pb)?;
        done.push(curve);
    }
    pb.finish_and_clear();
    write_loss_tables(&a, &lengths, &seqs, &done)?;
    draw_loss_plots(&a, &seqs, &done)?;
    print_perplexity_table(&a, &lengths, &done)
}

/// One model's L(i) curve and perplexities, as `eval loss` reports them.
struct ModelCurve {
    name: String,
    path: PathBuf,
    train_context: Option<usize>,
    loss: Vec<f64>,
    smoothed: Vec<f64>,
    ppl: Vec<(usize, f64)>,
}

fn check_loss_args(a: &LossArgs) -> Result<()> {
    if a.context < 1 {
        bail!("--context must be at least 1");
    }
    if a.sequences < 1 || a.batch_size < 1 || a.chunk < 1 || a.window < 1 {
        bail!("--sequences, --batch-size, --chunk and --window must be at least 1");
    }
    if !a.name.is_empty() && a.name.len() != a.model.len() {
        bail!("--name is given {} times for {} models", a.name.len(), a.model.len());
    }
    if !a.train_context.is_empty() && a.train_context.len() != a.model.len() {
        bail!("--train-context is given {} times for {} models", a.train_context.len(), a.model.len());
    }
    Ok(())
}

/// The validation sequences of `--context` + 1 tokens (documents, or packed windows with --pack).
fn loss_sequences(a: &LossArgs, data: &Dataset) -> Result<Vec<Vec<u32>>> {
    let n = a.context;
    // Packed windows are allocated before the split is read through; without --pack a context
    // longer than every document is reported below (with the hint to use --pack).
    let stream = data.num_tokens(Split::Val) + data.num_documents(Split::Val);
    if a.pack && n > stream {
        bail!(
            "--context {n} is longer than the validation split of {} ({} tokens with the EOS between documents)",
            a.data.display(),
            stream
        );
    }
    let windows = if a.pack { Windows::Packed } else { Windows::Documents };
    let seqs = loss::validation_sequences(data, n, a.sequences, windows)?;
    if seqs.len() < a.sequences {
        eprintln!(
            "warning: only {} validation documents have {n} tokens; averaging over {} sequences (--pack cuts more)",
            seqs.len(),
            seqs.len()
        );
    }
    Ok(seqs)
}

/// Loads model `mi` (at `path`) on its device and averages its per-token losses over `seqs`.
#[allow(clippy::too_many_arguments)]
fn model_curve(
    a: &LossArgs,
    mi: usize,
    path: &Path,
    name: String,
    device: &Device,
    data: &Dataset,
    seqs: &[Vec<u32>],
    lengths: &[usize],
    pb: &indicatif::ProgressBar,
) -> Result<ModelCurve> {
    let n = a.context;
    pb.set_message(format!("{name}: loading"));
    let model = load_model(path)?;
    let cfg = &model.config;
    // A model whose layers the GPU cannot run yet goes to the CPU (auto) or is refused (cuda).
    let device = if device.is_cuda() { a.device.select_for(&model)? } else { device.clone() };
    if !device.is_cuda() {
        let need = crate::validate::kv_cache_bytes(cfg, a.batch_size, n + 1)
            .saturating_add(crate::validate::forward_bytes(cfg, a.batch_size, a.chunk.min(n + 1), false));
        crate::validate::check_memory(
            need,
            &format!(
                "{}: --context {n} with --batch-size {} (KV cache and a chunk's activations)",
                path.display(),
                a.batch_size
            ),
        )?;
    }
    let plan = Plan { batch: a.batch_size.min(seqs.len()).max(1), chunk: a.chunk.min(n).max(1) };
    let mut engine = infer::open(&model, &device, a.device.dtype, plan)?;
    if mi == 0 {
        pb.println(format!("device: {}", engine.describe()));
    }
    let map = id_mapper(cfg, data.manifest().vocab_size, a.fold_vocab, path)?;
    let v = cfg.vocab_size as u32;
    let fit = |id: u32| if id < v { id } else { id % v };
    let bos = fit(cfg.bos_token_id.unwrap_or(BOS_ID));
    let eos = fit(cfg.eos_token_id.unwrap_or(EOS_ID));
    let mut curve = LossCurve::new(n);
    pb.set_message(name.clone());
    for batch in seqs.chunks(a.batch_size) {
        let ids: Vec<Vec<u32>> = batch
            .iter()
            .map(|s| {
                std::iter::once(bos)
                    .chain(s.iter().map(|&t| if t == EOS_ID && a.pack { eos } else { map(t) }))
                    .collect()
            })
            .collect();
        let losses = engine.token_losses(&ids, a.chunk, &mut |t| pb.inc((t * batch.len()) as u64))?;
        for l in &losses {
            curve.add(l);
        }
    }
    let l = curve.mean();
    Ok(ModelCurve {
        name,
        path: path.to_path_buf(),
        train_context: cfg.train_context().or(a.train_context.get(mi).copied()),
        smoothed: loss::moving_average(&l, a.window),
        ppl: loss::perplexity_at(&l, lengths),
        loss: l,
    })
}

/// loss.csv (one row per position), perplexity.csv (one row per length) and loss.json.
fn write_loss_tables(a: &LossArgs, lengths: &[usize], seqs: &[Vec<u32>], done: &[ModelCurve]) -> Result<()> {
    let n = a.context;
    let mut csv = String::from("position");
    for d in done {
        csv += &format!(",{0},{0} (smoothed)", csv_field(&d.name));
    }
    csv.push('\n');
    for i in 0..n {
        csv += &i.to_string();
        for d in done {
            csv += &format!(",{},{}", d.loss[i], d.smoothed[i]);
        }
        csv.push('\n');
    }
    write_file(&a.out.join("loss.csv"), csv.as_bytes())?;
    let mut pcsv = String::from("length");
    for d in done {
        pcsv += &format!(",{}", csv_field(&d.name));
    }
    pcsv.push('\n');
    for (k, &l) in lengths.iter().enumerate() {
        pcsv += &l.to_string();
        for d in done {
            pcsv += &format!(",{}", d.ppl[k].1);
        }
        pcsv.push('\n');
    }
    write_file(&a.out.join("perplexity.csv"), pcsv.as_bytes())?;

    let models: Vec<_> = done
        .iter()
        .map(|d| {
            json!({
                "name": d.name,
                "path": d.path.display().to_string(),
                "train_context": d.train_context,
                "mean_loss": d.loss.iter().sum::<f64>() / n as f64,
                "loss": d.loss,
                "smoothed_loss": d.smoothed,
                "perplexity": d.ppl.iter().map(|&(l, p)| json!({"length": l, "perplexity": p})).collect::<Vec<_>>(),
            })
        })
        .collect();
    let report = json!({
        "data": a.data.display().to_string(),
        "context": n,
        "sequences": seqs.len(),
        "windows": if a.pack { "packed" } else { "documents" },
        "moving_average_window": a.window,
        "models": models,
    });
    write_file(&a.out.join("loss.json"), serde_json::to_string_pretty(&report)?.as_bytes())
}

/// loss.png (the smoothed L(i)) and perplexity.png, each model's training context marked.
fn draw_loss_plots(a: &LossArgs, seqs: &[Vec<u32>], done: &[ModelCurve]) -> Result<()> {
    let n = a.context;
    let marker = |d: &ModelCurve| d.train_context.filter(|&c| c >= 1 && c <= n).map(|c| c as f64);
    let loss_series: Vec<Series> = done
        .iter()
        .map(|d| Series {
            name: d.name.clone(),
            points: d.smoothed.iter().enumerate().map(|(i, &v)| ((i + 1) as f64, v)).collect(),
            marker_x: marker(d),
        })
        .collect();
    LineChart {
        title: &format!("Per-token loss ({} sequences, moving average of {})", seqs.len(), a.window),
        x_label: "token position",
        y_label: "loss (nats)",
        log_x: n > 1,
        log_y: false,
        marker_label: "training context",
    }
    .draw(&a.out.join("loss.png"), &loss_series)?;
    let ppl_series: Vec<Series> = done
        .iter()
        .map(|d| Series {
            name: d.name.clone(),
            points: d.ppl.iter().map(|&(l, p)| (l as f64, p)).collect(),
            marker_x: marker(d),
        })
        .collect();
    LineChart {
        title: &format!("Perplexity over the first l tokens ({} sequences)", seqs.len()),
        x_label: "validation context length l",
        y_label: "perplexity",
        log_x: n > 1,
        log_y: true,
        marker_label: "training context",
    }
    .draw(&a.out.join("perplexity.png"), &ppl_series)
}

/// The perplexity at each length, a column per model, on stdout.
fn print_perplexity_table(a: &LossArgs, lengths: &[usize], done: &[ModelCurve]) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "{:>10}  {}",
        "length",
        done.iter().map(|d| format!("{:>14}", clip(&d.name, 14))).collect::<Vec<_>>().join(" ")
    )?;
    for (k, l) in lengths.iter().enumerate() {
        writeln!(
            stdout,
            "{l:>10}  {}",
            done.iter().map(|d| format!("{:>14.4}", d.ppl[k].1)).collect::<Vec<_>>().join(" ")
        )?;
    }
    writeln!(stdout, "wrote loss.csv, perplexity.csv, loss.json, loss.png, perplexity.png to {}", a.out.display())?;
    Ok(())
}

fn clip(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The haystack text: a file, or a folder's .txt files in natural order, joined.
fn read_haystack(path: &Path) -> Result<String> {
    if path.is_dir() {
        let files: Vec<PathBuf> = crate::data::list_inputs(&[path.to_path_buf()])?
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "txt"))
            .collect();
        if files.is_empty() {
            bail!("{}: no .txt files in the folder", path.display());
        }
        let mut text = String::new();
        for f in files {
            text += &crate::validate::read_text(&f)?;
            if !text.ends_with(char::is_whitespace) {
                text.push('\n');
            }
        }
        Ok(text)
    } else {
        crate::validate::read_text(path).with_context(|| format!("haystack {}", path.display()))
    }
}

fn run_niah(a: NiahArgs) -> Result<()> {
    if a.lengths.is_empty() || a.depths.is_empty() {
        bail!("--lengths and --depths need at least one value each");
    }
    if let Some(d) = a.depths.iter().find(|d| !(0.0..=100.0).contains(*d)) {
        bail!("--depths are percentages in [0, 100]; got {d}");
    }
    let c = &a.common;
    let model = load_model(&c.model)?;
    let cfg = &model.config;
    let enc = c.encoder(cfg)?;
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
