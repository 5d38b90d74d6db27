//! `foxlm eval loss`: per-token loss L(i) and perplexity over context length, for one or several
//! models on the same validation sequences; CSV, JSON and PNG plots.

use super::{create_out, model_name, progress_bar, write_file};
use crate::checkpoint::load_model;
use crate::config::Config;
use crate::data::{Dataset, Split};
use crate::eval::loss::{self, LossCurve, Windows};
use crate::eval::plots::{LineChart, Series};
use crate::infer::{self, Plan};
use crate::tokenizer::{BOS_ID, EOS_ID};
use anyhow::{bail, Result};
use fox_kernels::cuda::Device;
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};

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
    pub device: crate::cli::DeviceArgs,
}

pub(super) fn run(a: LossArgs) -> Result<()> {
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
