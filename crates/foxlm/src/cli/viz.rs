//! `foxlm viz`: pictures of what a model does. `gates`: forget matrices, attention maps and
//! per-head forget-gate statistics on a short text. See docs/evaluation.md.

use crate::checkpoint::load_model;
use crate::eval::gates::{self, HeadGate};
use crate::eval::plots;
use crate::infer::{self, Plan};
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;

pub type Args = super::Subcommands<Command>;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Forget matrices F_ij = exp(c_i - c_j) and attention maps of chosen heads on a text (PNG),
    /// and every head's mean forget gate and effective memory length 1/(1 - mean f) (table, CSV,
    /// JSON, PNG).
    Gates(GatesArgs),
}

#[derive(clap::Args, Debug)]
pub struct GatesArgs {
    /// Model folder (config.json + model.safetensors).
    #[arg(long)]
    pub model: PathBuf,
    /// Text file to run the model on (BOS is prepended).
    #[arg(long)]
    pub text: PathBuf,
    /// Layers to draw (0-based, comma-separated; default all).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub layers: Vec<usize>,
    /// Heads to draw (0-based, comma-separated; default all).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub heads: Vec<usize>,
    /// Keep the first this many tokens (BOS included): the maps are this many pixels square.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    #[command(flatten)]
    pub encoding: super::TextArgs,
    /// Output folder.
    #[arg(long, default_value = "eval-out")]
    pub out: PathBuf,
    #[command(flatten)]
    pub device: super::DeviceArgs,
}

/// Most tokens of a map: its picture is that many pixels square, per layer and head drawn.
pub const MAX_MAP_TOKENS: usize = 8192;

pub fn run(a: Args) -> Result<()> {
    match a.command {
        Command::Gates(a) => run_gates(a),
    }
}

fn pick(asked: &[usize], n: usize, what: &str) -> Result<Vec<usize>> {
    if asked.is_empty() {
        return Ok((0..n).collect());
    }
    if let Some(bad) = asked.iter().find(|&&x| x >= n) {
        bail!("--{what} {bad}: the model has {n} {what} (0..{})", n - 1);
    }
    Ok(asked.to_vec())
}

fn run_gates(a: GatesArgs) -> Result<()> {
    if !(2..=MAX_MAP_TOKENS).contains(&a.max_tokens) {
        bail!(
            "--max-tokens is {}; expected 2 to {MAX_MAP_TOKENS} (the maps are that many pixels square)",
            a.max_tokens
        );
    }
    let model = load_model(&a.model)?;
    let cfg = model.config.clone();
    let layers = pick(&a.layers, cfg.num_hidden_layers, "layers")?;
    let heads = pick(&a.heads, cfg.num_heads, "heads")?;
    let enc = a.encoding.encoder(&cfg)?;
    let text = crate::validate::read_text(&a.text)?;
    let mut ids = vec![enc.bos];
    ids.extend(enc.encode(&text));
    ids.truncate(a.max_tokens);
    let t = ids.len();
    if t < 2 {
        bail!("{}: the text is empty", a.text.display());
    }
    let device = a.device.select_for(&model)?;
    let acts = infer::open(&model, &device, a.device.dtype, Plan { batch: 1, chunk: t })?.gate_acts(&ids)?;
    let h = cfg.num_heads;
    let hd = cfg.head_dim();
    let stats = gates::gate_stats(&acts, h, t);
    std::fs::create_dir_all(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;

    // Table, CSV, JSON.
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{t} tokens; fgate_type {:?}", cfg.fgate_type)?;
    writeln!(
        stdout,
        "{:>5} {:>4} {:>9} {:>14} {:>9} {:>9}",
        "layer", "head", "mean f", "memory length", "min f", "max f"
    )?;
    let mut csv = String::from("layer,head,mean_f,memory_length,min_f,max_f\n");
    for s in &stats {
        let mem = if s.memory_length.is_finite() { format!("{:.1}", s.memory_length) } else { "inf".into() };
        writeln!(
            stdout,
            "{:>5} {:>4} {:>9.5} {:>14} {:>9.5} {:>9.5}",
            s.layer, s.head, s.mean_f, mem, s.min_f, s.max_f
        )?;
        let mem_full = if s.memory_length.is_finite() { s.memory_length.to_string() } else { "inf".into() };
        csv += &format!("{},{},{},{},{},{}\n", s.layer, s.head, s.mean_f, mem_full, s.min_f, s.max_f);
    }
    std::fs::write(a.out.join("gates.csv"), csv)?;
    let report = json!({
        "model": a.model.display().to_string(),
        "text": a.text.display().to_string(),
        "tokens": t,
        "fgate_type": cfg.fgate_type,
        "heads": stats,
    });
    std::fs::write(a.out.join("gates.json"), serde_json::to_string_pretty(&report)?)?;
    plots::memory_heatmap(&a.out.join("gates-memory.png"), &memory_title(&a.model), &stats, cfg.num_hidden_layers, h)?;

    // Maps of the chosen heads, one figure per layer.
    let mut written = vec!["gates.csv".to_string(), "gates.json".into(), "gates-memory.png".into()];
    for &l in &layers {
        let at = acts.blocks[l]
            .attn()
            .with_context(|| format!("layer {l} is not an attention layer: it has no gates to draw"))?;
        let c: Vec<f32> = if at.c.is_empty() { vec![0.0; h * t] } else { at.c.clone() };
        let panels: Vec<(usize, Vec<f32>, Vec<f32>)> = heads
            .iter()
            .map(|&hh| {
                (
                    hh,
                    gates::forget_matrix(&c, hh, t),
                    gates::attention_map(&at.q, &at.k, &c, h, cfg.kv_heads(), hd, cfg.window_size, hh, t),
                )
            })
            .collect();
        let stats_l: Vec<&HeadGate> = heads.iter().map(|&hh| &stats[l * h + hh]).collect();
        let file = format!("gates-layer{l}.png");
        plots::gate_maps(&a.out.join(&file), l, &panels, &stats_l, t)?;
        written.push(file);
    }
    writeln!(stdout, "wrote {} to {}", written.join(", "), a.out.display())?;
    Ok(())
}

fn memory_title(p: &std::path::Path) -> String {
    let name = p
        .canonicalize()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| p.display().to_string());
    format!("Effective memory length 1/(1 - mean f) per head: {name}")
}
