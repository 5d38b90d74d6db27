//! `foxlm eval`: per-token loss and perplexity over context length (`loss`), the needle in a
//! haystack test (`niah`), RULER-style synthetic tasks (`ruler`) and LongBench (`longbench`). See
//! docs/evaluation.md.
//!
//! One file a subcommand (`compare`: the comparison of `eval loss` runs); here, what they share:
//! the greedy evaluations' arguments ([`GreedyArgs`]), the progress bar, the output files and the
//! haystack.

mod compare;
mod longbench;
mod loss;
mod niah;
mod ruler;

pub use compare::CompareArgs;
pub use longbench::LongbenchArgs;
pub use loss::LossArgs;
pub use niah::NiahArgs;
pub use ruler::RulerArgs;

use crate::infer::{self, Infer, Plan};
use crate::model::Model;
use anyhow::{bail, Context, Result};
use fox_kernels::cuda::Device;
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
    Compare(CompareArgs),
}

pub fn run(a: Args) -> Result<()> {
    match a.command {
        Command::Loss(a) => loss::run(a),
        Command::Niah(a) => niah::run(a),
        Command::Ruler(a) => ruler::run(a),
        Command::Longbench(a) => longbench::run(a),
        Command::Compare(a) => compare::run(a),
    }
}

/// The arguments of the greedy evaluations (niah, ruler, longbench): a model answering prompts
/// of its text, one at a time.
#[derive(clap::Args, Debug)]
pub struct GreedyArgs {
    /// Model folder (config.json + model.safetensors).
    #[arg(long)]
    pub model: PathBuf,
    #[command(flatten)]
    pub text: super::TextArgs,
    /// Tokens per prefill chunk.
    #[arg(long, default_value_t = 2048)]
    pub chunk: usize,
    /// Output folder (niah.json and niah.png, ruler.json, longbench.json).
    #[arg(long, default_value = "eval-out")]
    pub out: PathBuf,
    #[command(flatten)]
    pub device: super::DeviceArgs,
}

impl GreedyArgs {
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

fn create_out(out: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create output folder {}", out.display()))
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
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
