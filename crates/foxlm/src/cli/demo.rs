//! `foxlm demo`: the whole pipeline on the shipped Moby-Dick sample, on CPU, in a few minutes:
//! tokenize, train a tiny FoX (Pro) with a progress bar, report validation loss before and
//! after (against the unigram entropy), generate a sample, and leave a model folder that
//! `foxlm generate` and `foxlm eval` accept.

use crate::checkpoint::load_model;
use crate::data::{prepare, Dataset, PrepareOptions, Split};
use crate::generate::{generate, GenerateOptions};
use crate::presets;
use crate::sampling::Sampling;
use crate::tokenizer::{TextFormat, Tokenizer, EOS_ID};
use crate::train::{self, Outcome, RunConfig, TrainOptions};
use anyhow::{bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

const MARKER: &str = "foxlm-demo.json";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Text to train on (files or folders).
    #[arg(long, default_value = "data/sample/moby-dick")]
    pub input: Vec<PathBuf>,
    /// Output folder (a previous demo's output there is replaced).
    #[arg(long, default_value = "runs/demo")]
    pub out: PathBuf,
    /// Training steps (of 8 windows of 128 tokens; the tiny preset does 500).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Prompt for the sample.
    #[arg(long, default_value = "Call me Ishmael.")]
    pub prompt: String,
    /// Tokens to generate.
    #[arg(long, default_value_t = 80)]
    pub max_new_tokens: usize,
    /// Seed of initialisation, data order and sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Where to train: cpu, cuda, cuda:N, or auto (the GPU when there is one).
    #[arg(long, default_value = "auto")]
    pub device: crate::backend::DeviceArg,
}

fn clear_previous(out: &Path) -> Result<()> {
    if !out.exists() {
        return Ok(());
    }
    if !out.is_dir() {
        bail!("--out {}: exists and is not a folder", out.display());
    }
    let empty = std::fs::read_dir(out).map(|mut d| d.next().is_none()).unwrap_or(false);
    if empty {
        return Ok(());
    }
    if !out.join(MARKER).exists() {
        bail!("--out {}: not empty and not a previous demo's output; choose another --out", out.display());
    }
    std::fs::remove_dir_all(out).with_context(|| format!("cannot remove the previous demo in {}", out.display()))
}

pub fn run(a: Args) -> Result<()> {
    let t0 = std::time::Instant::now();
    let input: Vec<PathBuf> = a.input.clone();
    for p in &input {
        if !p.exists() {
            bail!("{}: not found (run the demo from the repository root, or pass --input)", p.display());
        }
    }
    clear_previous(&a.out)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;
    std::fs::write(a.out.join(MARKER), b"{\"demo\": true}\n")
        .with_context(|| format!("cannot write in {}", a.out.display()))?;

    // 1. Tokenize.
    let data_dir = a.out.join("data");
    let fmt = TextFormat::JsonEscaped;
    let m = prepare(
        &input,
        &data_dir,
        &PrepareOptions { text_format: fmt, val_fraction: 0.05, progress: !a.quiet, ..Default::default() },
    )?;
    let ds = Dataset::open(&data_dir)?;
    let h1 = train::unigram_entropy(&ds, Split::Train);
    eprintln!(
        "data: {} training documents ({} tokens), {} held-out documents ({} tokens); unigram entropy of the training tokens {h1:.3} nats/token",
        m.train.documents, m.train.tokens, m.val.documents, m.val.tokens
    );

    // 2. Train.
    let p = presets::tiny();
    let mut run = RunConfig { model: p.model, train: p.train };
    run.train.seed = a.seed;
    run.train.eval_tokens = u64::MAX;
    // Only the final model is kept (Ctrl-C still saves a checkpoint to resume from), and the
    // held-out loss is measured before, half-way and after (each pass costs about 0.7 s).
    run.train.checkpoint_every = 0;
    if let Some(s) = a.steps {
        run.train.total_tokens = s * run.train.tokens_per_step();
        run.train.warmup_tokens = run.train.warmup_tokens.min(run.train.total_tokens / 5);
    }
    run.train.eval_every = run.train.total_steps().div_ceil(2).max(1);
    let steps = run.train.total_steps();
    eprintln!(
        "training a tiny FoX (Pro): d={}, {} layers, {} heads, {:.1}M parameters; {steps} steps of {} windows x {} tokens",
        run.model.hidden_size,
        run.model.num_hidden_layers,
        run.model.num_heads,
        crate::model::Model::new(&run.model).params.numel() as f64 / 1e6,
        run.train.batch_size,
        run.train.context
    );
    train::install_ctrlc_handler();
    let run_dir = a.out.join("run");
    let opts = TrainOptions {
        data: data_dir.clone(),
        out: run_dir.clone(),
        resume: false,
        progress: !a.quiet,
        stop_after: None,
        verbose: false,
        device: a.device,
        dtype: None,
        recompute: false,
        dist: None,
        init_from: None,
        tensorboard: None,
    };
    let r = train::train(Some(run), &opts)?;
    if r.outcome != Outcome::Finished {
        eprintln!("stopped at step {}; checkpoint in {}", r.step, r.checkpoint.display());
        std::process::exit(130);
    }
    let before = r.first_val_loss.unwrap_or(f64::NAN);
    let after = r.last_val_loss.unwrap_or(f64::NAN);
    eprintln!(
        "validation loss (held-out chapters): {before:.3} before training -> {after:.3} after ({} tokens/s, {:.0} s); unigram entropy {h1:.3}",
        r.tokens_per_s.round(),
        r.elapsed_s
    );

    // 3. Sample from the saved model, as `foxlm generate` would.
    let model_dir = run_dir.join(train::FINAL_DIR);
    let model = load_model(&model_dir)?;
    let tok = Tokenizer::gpt2(fmt)?;
    let prompt = tok.encode(&a.prompt, true);
    let gopts = GenerateOptions {
        max_new_tokens: a.max_new_tokens,
        sampling: Sampling { temperature: 0.8, top_k: 40, top_p: 1.0 },
        seed: a.seed,
        eos: Some(EOS_ID),
    };
    eprintln!("sample (temperature 0.8, top-k 40):");
    let mut stdout = std::io::stdout().lock();
    write!(stdout, "{}", a.prompt)?;
    let mut dec = tok.stream();
    generate(&model, &[prompt], &gopts, |_, id| {
        let _ = write!(stdout, "{}", dec.push(id));
        let _ = stdout.flush();
    });
    writeln!(stdout, "{}", dec.finish())?;
    drop(stdout);
    eprintln!(
        "model folder: {} (try: foxlm generate --model {} --prompt \"...\")",
        model_dir.display(),
        model_dir.display()
    );
    eprintln!(
        "metrics: {}, loss curve: {}",
        run_dir.join(train::METRICS_FILE).display(),
        run_dir.join(train::LOSS_PLOT_FILE).display()
    );
    let took = t0.elapsed().as_secs_f64();
    use crate::backend::DeviceArg;
    use fox_kernels::cuda::probe;
    if a.device == DeviceArg::Cpu || (a.device == DeviceArg::Auto && probe().is_err()) {
        // The CPU's own matmul rate beside the time, so that it can be compared across machines.
        let peak = fox_kernels::matmul::gemm_gflops(512, 10);
        let threads = rayon::current_num_threads();
        eprintln!("demo finished in {took:.0} s (this CPU: {threads} threads, f32 GEMM peak {peak:.0} GFLOP/s)");
    } else {
        eprintln!("demo finished in {took:.0} s");
    }
    Ok(())
}
