//! `foxlm generate`: text or token ids from a model, streamed as they are decoded.

use crate::checkpoint::load_model;
use crate::generate::GenerateOptions;
use crate::infer::{self, Plan, DEFAULT_GPU_ROWS};
use crate::sampling::Sampling;
use crate::tokenizer::{TextFormat, Tokenizer, BOS_ID, EOS_ID, GPT2_VOCAB};
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "prompt_ids"])))]
pub struct Args {
    /// Model folder (config.json + model.safetensors).
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt text; repeat for a batch of prompts (decoded together, left-padded).
    #[arg(long)]
    pub prompt: Vec<String>,
    /// Prompt as comma-separated token ids (e.g. 5,6,7); repeat for a batch. Prints the new ids,
    /// comma-separated, one line per prompt.
    #[arg(long, value_name = "IDS")]
    pub prompt_ids: Vec<String>,
    /// How many tokens to generate at most.
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 means greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Sample only among the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling: the smallest set of tokens with this total probability (1: all).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Random seed for sampling; the i-th prompt of a batch samples with seed + i (as the server's
    /// `n` choices do): as it would alone with `--seed` seed + i, whatever the other prompts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// How text is turned into tokens: json-escaped (how the released FoX models were trained;
    /// the default for the GPT-2 vocabulary) or plain GPT-2 BPE.
    #[arg(long)]
    pub text_format: Option<TextFormat>,
    /// Do not prepend the BOS token to text prompts.
    #[arg(long)]
    pub no_bos: bool,
    /// Keep generating past the end-of-text token.
    #[arg(long)]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub device: super::DeviceArgs,
}

pub fn parse_ids(s: &str, vocab: usize) -> Result<Vec<u32>> {
    let ids: Vec<u32> = s
        .split(',')
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
        .map(|t| t.parse::<u32>().with_context(|| format!("--prompt-ids: {t:?} is not a token id")))
        .collect::<Result<_>>()?;
    if ids.is_empty() {
        bail!("--prompt-ids: no ids in {s:?}");
    }
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
        bail!("--prompt-ids: id {bad} is outside the model's vocabulary of {vocab}");
    }
    Ok(ids)
}

pub fn run(a: Args) -> Result<()> {
    if !(a.top_p > 0.0 && a.top_p <= 1.0) {
        bail!("--top-p must be in (0, 1], got {}", a.top_p);
    }
    if a.temperature < 0.0 || !a.temperature.is_finite() {
        bail!("--temperature must be a finite number >= 0, got {}", a.temperature);
    }
    let model = load_model(&a.model)?;
    let vocab = model.config.vocab_size;
    let sampling = Sampling { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p };
    let device = a.device.select_for(&model)?;
    // The engine: the CPU, or the GPU planned for this batch of prompts.
    let open = |prompts: usize, longest: usize| {
        let plan = Plan { batch: prompts, chunk: longest.min((DEFAULT_GPU_ROWS / prompts.max(1)).max(1)) };
        infer::open(&model, &device, a.device.dtype, plan)
    };
    // The KV cache holds the longest prompt plus the new tokens for every prompt (host memory
    // when it runs on the CPU; the GPU engine checks its own).
    let check_cache = |prompts: usize, longest: usize| {
        if device.is_cuda() {
            return Ok(());
        }
        let tokens = longest.saturating_add(a.max_new_tokens);
        let need = crate::validate::kv_cache_bytes(&model.config, prompts, tokens)
            .saturating_add(crate::validate::forward_bytes(&model.config, prompts, longest, false));
        crate::validate::check_memory(
            need,
            &format!(
                "--max-new-tokens {} after a prompt of {longest} tokens (x {prompts}): the KV cache",
                a.max_new_tokens
            ),
        )
    };
    let mut stdout = std::io::stdout().lock();

    if !a.prompt_ids.is_empty() {
        let prompts: Vec<Vec<u32>> = a.prompt_ids.iter().map(|s| parse_ids(s, vocab)).collect::<Result<_>>()?;
        let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(1);
        check_cache(prompts.len(), longest)?;
        let eos = if a.ignore_eos { None } else { model.config.eos_token_id.filter(|&e| (e as usize) < vocab) };
        let opts = GenerateOptions { max_new_tokens: a.max_new_tokens, sampling, seed: a.seed, eos };
        let out = open(prompts.len(), longest)?.generate(&prompts, &opts, &mut |_, _| {})?;
        for row in out {
            let s: Vec<String> = row.iter().map(|i| i.to_string()).collect();
            writeln!(stdout, "{}", s.join(","))?;
        }
        return Ok(());
    }

    if vocab != GPT2_VOCAB {
        bail!(
            "{}: the model's vocabulary has {vocab} tokens, not GPT-2's {GPT2_VOCAB}: text prompts cannot be tokenized; use --prompt-ids",
            a.model.display()
        );
    }
    let tok = Tokenizer::gpt2(a.text_format.unwrap_or(TextFormat::JsonEscaped))?;
    let prompts: Vec<Vec<u32>> = a
        .prompt
        .iter()
        .map(|p| {
            let ids = tok.encode(p, !a.no_bos);
            if ids.is_empty() {
                vec![BOS_ID]
            } else {
                ids
            }
        })
        .collect();
    let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(1);
    check_cache(prompts.len(), longest)?;
    let eos = (!a.ignore_eos).then_some(EOS_ID);
    let opts = GenerateOptions { max_new_tokens: a.max_new_tokens, sampling, seed: a.seed, eos };
    let mut engine = open(prompts.len(), longest)?;
    if prompts.len() == 1 {
        // Stream: print each piece of text as soon as it is complete.
        write!(stdout, "{}", a.prompt[0])?;
        stdout.flush()?;
        let mut dec = tok.stream();
        let mut err = None;
        engine.generate(&prompts, &opts, &mut |_, id| {
            let piece = dec.push(id);
            if let Err(e) = write!(stdout, "{piece}").and_then(|_| stdout.flush()) {
                err.get_or_insert(e);
            }
        })?;
        writeln!(stdout, "{}", dec.finish())?;
        if let Some(e) = err {
            return Err(e.into());
        }
    } else {
        let out = engine.generate(&prompts, &opts, &mut |_, _| {})?;
        for (p, row) in a.prompt.iter().zip(out) {
            writeln!(stdout, "{p}{}", tok.decode(&row))?;
            writeln!(stdout, "---")?;
        }
    }
    Ok(())
}
