//! `foxlm train`: train a model from a preset or a configuration file on a prepared dataset.

use crate::config::Config;
use crate::presets;
use crate::train::{self, Outcome, RunConfig, TrainConfig, TrainOptions};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug, Clone, Default)]
pub struct Overrides {
    /// Tokens per training window.
    #[arg(long)]
    pub context: Option<usize>,
    /// Sequences per optimizer step.
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// Sequences per forward/backward pass (gradients of batch-size / micro-batch passes are accumulated).
    #[arg(long)]
    pub micro_batch: Option<usize>,
    /// Training budget in tokens (the cosine schedule ends there).
    #[arg(long, conflicts_with = "steps")]
    pub tokens: Option<u64>,
    /// Training budget in optimizer steps (sets --tokens to steps x batch-size x context).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Peak learning rate.
    #[arg(long)]
    pub lr: Option<f64>,
    /// Learning rate at the end of the cosine decay.
    #[arg(long)]
    pub min_lr: Option<f64>,
    /// Linear warm-up length in tokens.
    #[arg(long)]
    pub warmup_tokens: Option<u64>,
    #[arg(long)]
    pub weight_decay: Option<f64>,
    /// Global gradient-norm clipping threshold.
    #[arg(long)]
    pub max_grad_norm: Option<f64>,
    /// Seed of the initialisation and the data order.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Validate every N steps (0: at the start and the end only).
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Validation tokens per evaluation.
    #[arg(long)]
    pub eval_tokens: Option<u64>,
    /// Checkpoint every N steps (0: only at the end and on Ctrl-C).
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    /// Numbered checkpoints to keep.
    #[arg(long)]
    pub keep_last: Option<usize>,
    /// Write a metrics line every N steps.
    #[arg(long)]
    pub log_every: Option<u64>,
}

impl Overrides {
    pub fn apply(&self, t: &mut TrainConfig) {
        macro_rules! set {
            ($($f:ident => $g:ident),*) => {$(if let Some(v) = self.$f { t.$g = v; })*};
        }
        set!(context => context, batch_size => batch_size, micro_batch => micro_batch, tokens => total_tokens,
             lr => peak_lr, min_lr => min_lr, warmup_tokens => warmup_tokens, weight_decay => weight_decay,
             max_grad_norm => max_grad_norm, seed => seed, eval_every => eval_every, eval_tokens => eval_tokens,
             checkpoint_every => checkpoint_every, keep_last => keep_last, log_every => log_every);
        if self.batch_size.is_some() && self.micro_batch.is_none() && !t.batch_size.is_multiple_of(t.micro_batch) {
            t.micro_batch = t.batch_size.min(t.micro_batch).max(1);
            while !t.batch_size.is_multiple_of(t.micro_batch) {
                t.micro_batch -= 1;
            }
        }
        if let Some(s) = self.steps {
            t.total_tokens = s * t.tokens_per_step();
        }
        if self.lr.is_some() && self.min_lr.is_none() && t.min_lr > t.peak_lr {
            t.min_lr = 0.0;
        }
        if t.warmup_tokens > t.total_tokens && self.warmup_tokens.is_none() {
            t.warmup_tokens = t.total_tokens / 10;
        }
    }
}

#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("model_source").args(["preset", "config"])))]
pub struct Args {
    /// A named set-up: tiny (a small FoX (Pro) for CPU), {fox,transformer}-{llama,pro}-{125m,360m,760m}
    /// with the paper's hyper-parameters (760m: the 16B-token ablation runs), *-760m-48b (the
    /// paper's main 48B-token runs), the small-scale experiment's *-small models, or Mamba-2:
    /// mamba2-{125m,360m,760m,small,tiny}. --list-presets shows them. With --init-from, only its recipe is used.
    #[arg(long)]
    pub preset: Option<String>,
    /// A run configuration: JSON {"model": <config.json fields>, "train": {...}} as written to
    /// OUT/run.json (or by --print-config), or a plain model config.json (trained with the tiny
    /// preset's recipe unless overridden).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Dataset folder made by `foxlm data prepare`.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Output folder for checkpoints, metrics and plots.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Continue the run in --out from its latest checkpoint (the configuration must match; with
    /// no --preset/--config, the checkpoint's is used).
    #[arg(long, conflicts_with = "init_from")]
    pub resume: bool,
    /// Fine-tune: start a new run (fresh optimizer, step 0, its own recipe, context and data) from
    /// the weights of a model folder: config.json + model.safetensors in the authors' layout (e.g.
    /// the released fox-pro-760m-longcrawl64-48b), a foxlm checkpoint, or a foxlm run folder. The
    /// architecture is the folder's; --preset/--config give the recipe (a foxlm checkpoint has its
    /// own). Fields that keep every tensor's shape may change (--acp, --sliding-window,
    /// --rope-base, or a --config model) and are printed; others are refused.
    #[arg(long, value_name = "MODEL_DIR")]
    pub init_from: Option<PathBuf>,
    /// Also write the metrics (loss, learning rate, gradient norm, tokens/s, validation loss) as
    /// TensorBoard event files into DIR (`tensorboard --logdir DIR`).
    #[arg(long, value_name = "DIR")]
    pub tensorboard: Option<PathBuf>,
    #[command(flatten)]
    pub overrides: Overrides,
    /// Stop after this many steps in total, saving a checkpoint (as Ctrl-C does).
    #[arg(long)]
    pub stop_after: Option<u64>,
    /// No progress bar and no messages.
    #[arg(long)]
    pub quiet: bool,
    /// Print the run configuration as JSON and exit.
    #[arg(long)]
    pub print_config: bool,
    /// List the presets and exit.
    #[arg(long)]
    pub list_presets: bool,
    /// Where to train: cpu, cuda, cuda:N, or auto (the GPU when there is one).
    #[arg(long, default_value = "auto")]
    pub device: crate::backend::DeviceArg,
    /// Activation precision on the GPU: bf16 (fp32 master weights and optimizer state) or f32
    /// (to check against the CPU). Default: bf16 on a GPU, f32 on the CPU.
    #[arg(long)]
    pub dtype: Option<crate::backend::Dtype>,
    /// Keep only each block's input through the forward and recompute each block in the backward
    /// (GPU): activation memory of one block plus the inputs, for about a third more compute.
    #[arg(long)]
    pub recompute: bool,
    /// Train with adaptive computation pruning (ACP, SPEC §1): attention tiles whose gate bias
    /// keeps them below ε = e^-10 of their row's mass are skipped, forward and backward
    /// (config.json's log_pruning_tolerance = -10; part of the run's configuration).
    #[arg(long)]
    pub acp: bool,
    /// Grouped-query attention: N k/v heads (a divisor of the heads) shared by groups of query
    /// heads (config.json's num_kv_heads; part of the run's configuration).
    #[arg(long, value_name = "N")]
    pub num_kv_heads: Option<usize>,
    /// Sliding-window attention (the paper's SWA baseline): each query sees its last W keys
    /// (config.json's window_size).
    #[arg(long, value_name = "W")]
    pub sliding_window: Option<usize>,
    /// RoPE's base θ (config.json's rope_base; RoPE models only), e.g. raised for long-context
    /// fine-tuning with --init-from.
    #[arg(long, value_name = "THETA")]
    pub rope_base: Option<f64>,
    #[command(flatten)]
    pub dist: DistArgs,
}

/// Data-parallel training over several GPUs (docs/distributed.md).
#[derive(clap::Args, Debug, Clone)]
pub struct DistArgs {
    /// Train on N GPUs of this machine: starts N ranks of this command (one process per GPU) that
    /// split each step's batch, reduce the gradients through NCCL and shard the optimizer state
    /// (ZeRO-1). --batch-size must be a multiple of --micro-batch × N. On several machines start
    /// one process per GPU yourself (srun, torchrun-style variables) instead.
    #[arg(long, value_name = "N")]
    pub gpus: Option<usize>,
    /// This process's rank among all ranks of a multi-process run (torchrun's RANK).
    #[arg(long, env = "RANK")]
    pub rank: Option<usize>,
    /// The GPU of this machine this rank uses (torchrun's LOCAL_RANK; default: RANK).
    #[arg(long, env = "LOCAL_RANK")]
    pub local_rank: Option<usize>,
    /// Ranks in all (torchrun's WORLD_SIZE); set, it makes this process one rank of a run.
    #[arg(long, env = "WORLD_SIZE")]
    pub world_size: Option<usize>,
    /// The machine of rank 0, where the rendezvous listens (torchrun's MASTER_ADDR).
    #[arg(long, env = "MASTER_ADDR", default_value = "127.0.0.1")]
    pub master_addr: String,
    /// The rendezvous port on MASTER_ADDR (torchrun's MASTER_PORT).
    #[arg(long, env = "MASTER_PORT", default_value_t = crate::distributed::DEFAULT_MASTER_PORT)]
    pub master_port: u16,
    /// Seconds to wait for every rank at the rendezvous before giving up.
    #[arg(long, env = "FOXLM_RENDEZVOUS_TIMEOUT", default_value_t = 60, value_name = "SECONDS")]
    pub rendezvous_timeout: u64,
    /// Seconds a rank may go without finishing a step (or a validation batch) before every rank
    /// stops: a stuck collective (a rank hung) ends the run instead of hanging it. Must exceed
    /// the time rank 0 takes to write a checkpoint.
    #[arg(long, env = "FOXLM_COLLECTIVE_TIMEOUT", default_value_t = 600, value_name = "SECONDS")]
    pub collective_timeout: u64,
}

/// Reads --config: a run file or a plain model config.json.
pub fn read_config_file(path: &Path) -> Result<RunConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not valid JSON", path.display()))?;
    if v.get("model").is_some() {
        let run: RunConfig =
            serde_json::from_value(v).with_context(|| format!("{}: not a valid run configuration", path.display()))?;
        run.model.validate().with_context(|| format!("{}: invalid model configuration", path.display()))?;
        return Ok(run);
    }
    let model = Config::load(path)?;
    let mut train = presets::tiny().train;
    if let Some(c) = model.train_context() {
        train.context = c;
    }
    Ok(RunConfig { model, train })
}

/// The run configuration that the arguments describe (None: take the checkpoint's on --resume).
pub fn run_config(a: &Args) -> Result<Option<RunConfig>> {
    if let Some(dir) = &a.init_from {
        return init_run_config(a, dir).map(Some);
    }
    let base = match (&a.preset, &a.config) {
        (Some(p), _) => {
            let p = presets::preset(p)?;
            Some(RunConfig { model: p.model, train: p.train })
        }
        (None, Some(c)) => Some(read_config_file(c)?),
        (None, None) => None,
    };
    Ok(base.map(|mut r| {
        a.overrides.apply(&mut r.train);
        r
    }))
}

/// The run configuration of `--init-from DIR`: DIR's architecture (or --config's model, checked
/// against DIR's weights when training starts), and the recipe of --preset, --config or DIR's
/// own run, with the overrides.
fn init_run_config(a: &Args, dir: &Path) -> Result<RunConfig> {
    let src = crate::init_from::read_source(dir)?;
    let (model, mut train) = match (&a.preset, &a.config) {
        (Some(p), _) => {
            let p = presets::preset(p)?;
            let differ = crate::init_from::field_changes(&src.config, &p.model);
            if !differ.is_empty() && !a.quiet {
                eprintln!(
                    "note: --preset {} describes another architecture than {} ({}): the weights' is kept, \
                     the preset gives the recipe",
                    p.name,
                    src.dir.display(),
                    differ
                        .iter()
                        .map(|c| format!("{}: {} (model) vs {} (preset)", c.field, c.old, c.new))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            (src.config.clone(), p.train)
        }
        (None, Some(c)) => {
            let r = read_config_file(c)?;
            (r.model, r.train)
        }
        (None, None) => match src.recipe.clone() {
            Some(t) => (src.config.clone(), t),
            None => bail!(
                "--init-from {}: the folder holds no training recipe (it is not a foxlm checkpoint): give --preset \
                 NAME for one (e.g. tiny, fox-pro-760m-48b) or --config FILE, and override it with --lr, --tokens, ...",
                dir.display()
            ),
        },
    };
    a.overrides.apply(&mut train);
    Ok(RunConfig { model, train })
}

/// What `foxlm train` is in a multi-GPU run: the launcher of `--gpus N`, one rank, or neither.
enum Role {
    Single,
    Launcher(usize),
    Rank(crate::distributed::World),
}

fn role(a: &Args) -> Result<Role> {
    let d = &a.dist;
    let launched = std::env::var_os(crate::distributed::launch::LAUNCHED_ENV).is_some();
    let distributed = d.world_size.is_some() || d.rank.is_some();
    match (d.gpus, distributed) {
        (Some(0), _) => bail!("--gpus 0: give at least 1 (or drop --gpus to train on one device)"),
        (Some(_), true) if !launched => bail!(
            "--gpus starts its own ranks, but RANK / WORLD_SIZE (or --rank / --world-size) are set too: drop \
             --gpus when a cluster launcher starts the ranks, or unset those variables"
        ),
        (Some(n), false) => Ok(Role::Launcher(n)),
        (_, true) => {
            let (Some(rank), Some(size)) = (d.rank, d.world_size) else {
                bail!("a multi-process run needs both RANK and WORLD_SIZE (or --rank and --world-size)");
            };
            Ok(Role::Rank(crate::distributed::World::new(
                rank,
                d.local_rank,
                size,
                d.master_addr.clone(),
                d.master_port,
            )?))
        }
        (None, false) => Ok(Role::Single),
    }
}

/// Checks what a multi-GPU run needs before starting any rank: GPUs, NCCL, a GPU device.
pub fn check_gpus(device: crate::backend::DeviceArg, n: usize) -> Result<()> {
    if device == crate::backend::DeviceArg::Cpu {
        bail!("--device cpu: training on several ranks runs on GPUs (NCCL); drop --device or --gpus");
    }
    let have = fox_kernels::cuda::probe().map_err(|e| anyhow::anyhow!("--gpus {n}: no GPU can be used here: {e:#}"))?;
    if have < n {
        bail!("--gpus {n}: this machine has {have} GPU{}", if have == 1 { "" } else { "s" });
    }
    fox_kernels::cuda::nccl::probe().with_context(|| format!("--gpus {n}"))
}

pub fn run(a: Args) -> Result<()> {
    match role(&a)? {
        Role::Single => run_one(a, None).map(exit_if_interrupted),
        Role::Launcher(n) if !a.print_config && !a.list_presets => {
            check_gpus(a.device, n)?;
            let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
            if !a.quiet {
                eprintln!("starting {n} rank{} (one per GPU)", if n == 1 { "" } else { "s" });
            }
            match crate::distributed::launch::launch_local(n, &args)? {
                crate::distributed::launch::Ended::Ok => Ok(()),
                crate::distributed::launch::Ended::Interrupted => std::process::exit(130),
            }
        }
        Role::Launcher(_) => run_one(a, None).map(exit_if_interrupted),
        Role::Rank(w) => run_rank(a, w),
    }
}

/// One rank of a multi-process run: the rendezvous, the watchdog, then training; a failure is
/// reported to the other ranks (and to the launcher) before this process exits.
fn run_rank(mut a: Args, w: crate::distributed::World) -> Result<()> {
    if a.device == crate::backend::DeviceArg::Cpu {
        bail!("--device cpu: a multi-process run (WORLD_SIZE {}) trains on GPUs through NCCL", w.size);
    }
    // Before any thread starts: NCCL reads its environment at the first communicator.
    fox_kernels::cuda::nccl::nvls_off()?;
    if a.print_config || a.list_presets {
        return run_one(a, None).map(exit_if_interrupted);
    }
    // Only rank 0 talks.
    if w.rank != 0 {
        a.quiet = true;
    }
    let rendezvous = std::time::Duration::from_secs(a.dist.rendezvous_timeout);
    let collective = std::time::Duration::from_secs(a.dist.collective_timeout);
    let res = crate::distributed::as_rank(&w, rendezvous, collective, |d| run_one(a, Some(d)));
    res.map(exit_if_interrupted).map_err(|e| e.context(format!("rank {} of {}", w.rank, w.size)))
}

/// Exits with status 130 after a Ctrl-C (the checkpoint is saved by then).
fn exit_if_interrupted(interrupted: bool) {
    if interrupted {
        std::process::exit(130);
    }
}

/// Trains as the arguments say; Ok(true) when Ctrl-C stopped the run (after its checkpoint).
fn run_one(a: Args, dist: Option<crate::distributed::DistRun>) -> Result<bool> {
    if a.list_presets {
        use std::io::Write;
        let names = presets::names();
        let w = names.iter().map(|n| n.len()).max().unwrap_or(0);
        let mut out = std::io::stdout().lock();
        for n in names {
            let p = presets::preset(&n)?;
            // A closed pipe (`| head`) ends the listing quietly (see main).
            writeln!(out, "{n:<w$}  {}", p.description)?;
        }
        return Ok(false);
    }
    let mut run = run_config(&a)?;
    if let Some(r) = run.as_mut() {
        if a.acp {
            r.model.log_pruning_tolerance = Some(-10.0);
        }
        if a.num_kv_heads.is_some() {
            r.model.num_kv_heads = a.num_kv_heads;
        }
        if a.sliding_window.is_some() {
            r.model.window_size = a.sliding_window;
        }
        if let Some(b) = a.rope_base {
            r.model.rope_base = b;
        }
        r.model.validate().context("--num-kv-heads / --sliding-window / --rope-base")?;
    }
    if run.is_none() && a.resume {
        // Overrides apply on top of the checkpoint's configuration.
        if let Some(out) = &a.out {
            if let Some(dir) = train::latest_checkpoint(out)? {
                let ck = std::fs::read_to_string(dir.join(train::TRAINER_FILE)).ok();
                if let Some(state) = ck
                    .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                    .and_then(|v| serde_json::from_value::<train::TrainerState>(v["trainer"].clone()).ok())
                {
                    let mut r = state.run;
                    a.overrides.apply(&mut r.train);
                    run = Some(r);
                }
            }
        }
    }
    if a.print_config {
        let Some(r) = run else { bail!("--print-config needs --preset or --config") };
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(false);
    }
    if run.is_none() && !a.resume {
        bail!("give --preset NAME or --config FILE (or --resume to continue a run); --list-presets shows the presets");
    }
    let Some(out) = a.out.clone() else { bail!("--out DIR is required") };
    let data = match &a.data {
        Some(d) => d.clone(),
        None if a.resume => {
            let dir = train::latest_checkpoint(&out)?
                .ok_or_else(|| anyhow::anyhow!("--resume: {} holds no checkpoint to resume from", out.display()))?;
            let st = train::load_checkpoint(&dir)?.state;
            PathBuf::from(st.data_dir)
        }
        None => bail!("--data DIR is required (a folder made by `foxlm data prepare`)"),
    };
    train::install_ctrlc_handler();
    let opts = TrainOptions {
        data,
        out,
        resume: a.resume,
        progress: !a.quiet,
        stop_after: a.stop_after,
        verbose: !a.quiet,
        device: a.device,
        dtype: a.dtype,
        recompute: a.recompute,
        dist,
        init_from: a.init_from.clone(),
        tensorboard: a.tensorboard.clone(),
    };
    let r = train::train(run, &opts)?;
    match r.outcome {
        Outcome::Finished => {
            if !a.quiet {
                eprintln!(
                    "done: {} steps, {} tokens, {:.0} tokens/s; final training loss {}, validation loss {}",
                    r.step,
                    r.tokens_seen,
                    r.tokens_per_s,
                    r.last_train_loss.map_or("-".into(), |l| format!("{l:.4}")),
                    r.last_val_loss.map_or("-".into(), |l| format!("{l:.4}")),
                );
                eprintln!("model: {}", r.checkpoint.display());
            }
            Ok(false)
        }
        Outcome::AlreadyFinished => Ok(false),
        Outcome::Interrupted => {
            eprintln!(
                "stopped at step {}; checkpoint {} (continue with --resume --out {})",
                r.step,
                r.checkpoint.display(),
                opts.out.display()
            );
            Ok(train::STOP.load(std::sync::atomic::Ordering::SeqCst))
        }
    }
}
