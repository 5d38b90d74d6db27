//! The training loop: [`train`] and the engine it drives.

use super::*;
use crate::backend::Dtype;
use crate::data::{Dataset, Loader, Split};
use crate::engine::{format_plan, memory_plan, CpuEngine, Engine, GpuEngine, StepShape};
use crate::fsutil::{write_atomic, write_synced};
use crate::model::{MemoryPlan, Model};
use crate::optim::AdamW;
use crate::tokenizer::TEXT_FORMAT_KEY;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Set by Ctrl-C (see [`install_ctrlc_handler`]): the trainer saves a checkpoint and stops.
pub static STOP: AtomicBool = AtomicBool::new(false);

/// Makes Ctrl-C (SIGINT/SIGTERM) request a clean stop; a second Ctrl-C exits at once.
pub fn install_ctrlc_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = ctrlc::set_handler(|| {
            if STOP.swap(true, Ordering::SeqCst) {
                eprintln!("\nsecond interrupt: exiting without saving");
                std::process::exit(130);
            }
            eprintln!("\ninterrupt: saving a checkpoint after this step (Ctrl-C again to exit at once)");
        });
    });
}

/// How the run is set up beyond its configuration.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    pub data: PathBuf,
    pub out: PathBuf,
    /// Continue the run in `out` from its latest checkpoint.
    pub resume: bool,
    pub progress: bool,
    /// Stop (with a checkpoint, as on Ctrl-C) once this many steps are done in total.
    pub stop_after: Option<u64>,
    /// Print validation results and other messages to stderr.
    pub verbose: bool,
    /// Where the steps run (`--device`): cpu, cuda[:N], or auto (the GPU when there is one).
    pub device: crate::backend::DeviceArg,
    /// Activation precision on the GPU (`--dtype`; None: bf16 on a GPU, f32 on the CPU).
    pub dtype: Option<Dtype>,
    /// Keep only each block's input and recompute the block in the backward (`--recompute`, GPU).
    pub recompute: bool,
    /// This process is one rank of a data-parallel run (GPU `world.local_rank`, NCCL): it reads
    /// its part of each step's windows; only rank 0 writes metrics and checkpoints.
    pub dist: Option<crate::distributed::DistRun>,
    /// Start from this model folder's weights instead of a random initialisation (`--init-from`,
    /// see [`crate::init_from`]); the run's architecture must keep every tensor's shape.
    pub init_from: Option<PathBuf>,
    /// Also write the metrics as TensorBoard event files into this folder (`--tensorboard`).
    pub tensorboard: Option<PathBuf>,
}

impl TrainOptions {
    /// A fresh, quiet run of `data` into `out` on `device`, every other option off.
    pub fn new(data: impl Into<PathBuf>, out: impl Into<PathBuf>, device: crate::backend::DeviceArg) -> Self {
        Self {
            data: data.into(),
            out: out.into(),
            resume: false,
            progress: false,
            stop_after: None,
            verbose: false,
            device,
            dtype: None,
            recompute: false,
            dist: None,
            init_from: None,
            tensorboard: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// The budget was reached; the final model is in OUT/final.
    Finished,
    /// Stopped early (Ctrl-C or `stop_after`) after saving a checkpoint.
    Interrupted,
    /// A run that had already finished was resumed: nothing to do.
    AlreadyFinished,
}

#[derive(Clone, Debug)]
pub struct TrainReport {
    pub outcome: Outcome,
    pub step: u64,
    pub tokens_seen: u64,
    /// The checkpoint written last (OUT/final when finished).
    pub checkpoint: PathBuf,
    pub first_val_loss: Option<f64>,
    pub last_val_loss: Option<f64>,
    pub last_train_loss: Option<f64>,
    /// Tokens per second over this invocation's steps.
    pub tokens_per_s: f64,
    pub elapsed_s: f64,
    /// With `--init-from`: the architecture fields the run changed, "field: old -> new".
    pub init_changes: Vec<String>,
}

/// Checks that `out` can hold a run: creatable, writable.
fn check_output_dir(out: &Path) -> Result<()> {
    if out.exists() && !out.is_dir() {
        bail!("--out {}: exists and is not a folder", out.display());
    }
    std::fs::create_dir_all(out)
        .with_context(|| format!("--out {}: cannot create the output folder", out.display()))?;
    let probe = out.join(".foxlm-write-test");
    write_synced(&probe, b"ok")
        .with_context(|| format!("--out {}: the output folder is not writable", out.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// The engine for `opts.device` / `opts.dtype`; on a GPU it prints the memory plan first.
fn make_engine(
    model: &Model,
    opt: &AdamW,
    opts: &TrainOptions,
    micro: usize,
    context: usize,
) -> Result<Box<dyn Engine>> {
    use fox_kernels::cuda::Device;
    if let Some(d) = &opts.dist {
        return make_rank_engine(model, opt, opts, micro, context, d);
    }
    let mut device = crate::backend::select_device(opts.device)?;
    if let (true, Some(why)) = (device.is_cuda(), crate::model::cuda_plan::unsupported(model, true)) {
        if opts.device != crate::backend::DeviceArg::Auto {
            bail!("--device {}: {why}", opts.device);
        }
        eprintln!("note: training on the CPU: {why}");
        device = Device::Cpu;
    }
    match device {
        Device::Cpu => {
            Dtype::refuse_bf16_on_cpu(opts.dtype, "trains")?;
            if opts.recompute {
                bail!("--recompute saves GPU memory; on the CPU the activations are kept (drop --recompute)");
            }
            Ok(Box::new(CpuEngine::new(model, micro)))
        }
        Device::Cuda(gpu) => {
            let dtype = opts.dtype.unwrap_or_default();
            let step = StepShape { micro, context, recompute: opts.recompute };
            let plan = memory_plan(model, step, dtype, 1)?;
            if opts.verbose {
                eprint!("{}", format_plan(&plan, 1));
            }
            gpu_engine(dtype, gpu, model, opt, step, &plan, None)
        }
    }
}

/// The engine of one rank of a data-parallel run: GPU LOCAL_RANK, joined to the others through
/// NCCL with the id of the rendezvous.
fn make_rank_engine(
    model: &Model,
    opt: &AdamW,
    opts: &TrainOptions,
    micro: usize,
    context: usize,
    d: &crate::distributed::DistRun,
) -> Result<Box<dyn Engine>> {
    let w = &d.world;
    let ordinal = w.gpu(fox_kernels::cuda::probe().context("training on several GPUs")?)?;
    if let crate::backend::DeviceArg::Cuda(c) = opts.device {
        if c != ordinal {
            bail!(
                "--device cuda:{c} with LOCAL_RANK {}: each rank uses its LOCAL_RANK's GPU; drop --device",
                w.local_rank
            );
        }
    }
    let gpu = fox_kernels::cuda::Gpu::new(ordinal)?;
    let dtype = opts.dtype.unwrap_or_default();
    let step = StepShape { micro, context, recompute: opts.recompute };
    let plan = memory_plan(model, step, dtype, w.size)?;
    if opts.verbose {
        eprint!("{}", format_plan(&plan, w.size));
    }
    let nccl = fox_kernels::cuda::nccl::Nccl::new(gpu.clone(), w.rank, w.size, &d.nccl_id)?;
    crate::distributed::heartbeat();
    gpu_engine(dtype, gpu, model, opt, step, &plan, Some(nccl))
}

/// The GPU engine for `dtype`: one GPU alone (`nccl` None) or one rank of a data-parallel run.
fn gpu_engine(
    dtype: Dtype,
    gpu: std::sync::Arc<fox_kernels::cuda::Gpu>,
    model: &Model,
    opt: &AdamW,
    step: StepShape,
    plan: &MemoryPlan,
    nccl: Option<fox_kernels::cuda::nccl::Nccl>,
) -> Result<Box<dyn Engine>> {
    Ok(match dtype {
        Dtype::Bf16 => Box::new(GpuEngine::<half::bf16>::new(gpu, model, opt, step, plan, nccl)?),
        Dtype::F32 => Box::new(GpuEngine::<f32>::new(gpu, model, opt, step, plan, nccl)?),
    })
}

/// The run's configuration (given, or the checkpoint's on a resume without one), checked, and the
/// checkpoint it resumes from, if any.
fn resolve_run(run: Option<RunConfig>, opts: &TrainOptions) -> Result<(RunConfig, Option<Checkpoint>)> {
    let out = &opts.out;
    if opts.resume && opts.init_from.is_some() {
        bail!(
            "--resume and --init-from together: a resumed run continues from its checkpoint's weights; drop \
             --init-from to continue it, or choose a new --out to start again from the model"
        );
    }
    // Resume: find the checkpoint first (it may supply the configuration).
    let resumed = if opts.resume {
        let Some(dir) = latest_checkpoint(out)? else {
            bail!("--resume: {} holds no checkpoint to resume from", out.display());
        };
        Some(load_checkpoint(&dir).with_context(|| format!("--resume: cannot load checkpoint {}", dir.display()))?)
    } else {
        if let Some(dir) = latest_checkpoint(out)? {
            bail!(
                "{} already holds a run (latest checkpoint {}): pass --resume to continue it, or choose another --out",
                out.display(),
                dir.display()
            );
        }
        None
    };
    let run = match (run, &resumed) {
        (Some(r), _) => r,
        (None, Some(ck)) => ck.state.run.clone(),
        (None, None) => bail!("no configuration: give --preset or --config"),
    };
    run.model.validate().context("model configuration")?;
    run.train.validate().context("training configuration")?;
    Ok((run, resumed))
}

/// With `--init-from`: the source model and the architecture fields the run changes, checked
/// before anything heavy.
fn init_source(opts: &TrainOptions, run: &RunConfig) -> Result<Option<(crate::init_from::InitSource, Vec<String>)>> {
    Ok(match &opts.init_from {
        None => None,
        Some(dir) => {
            let src = crate::init_from::read_source(dir)?;
            let changes = crate::init_from::architecture_changes(&src.config, &run.model)
                .with_context(|| format!("--init-from {}", dir.display()))?;
            Some((src, changes.iter().map(|c| c.to_string()).collect::<Vec<_>>()))
        }
    })
}

/// Checks, before anything is allocated, that the batch splits over the data-parallel ranks and
/// that the parameters, gradients and AdamW's two moments fit in memory.
fn check_fits(run: &RunConfig, opts: &TrainOptions) -> Result<()> {
    if let Some(d) = &opts.dist {
        crate::distributed::StepSlice::new(
            run.train.micro_batch,
            run.train.batch_size / run.train.micro_batch,
            0,
            d.world.size,
        )
        .context("training configuration")?;
    }
    crate::validate::check_memory(
        4 * run.model.param_bytes(),
        "the model's parameters, gradients and optimizer state",
    )?;
    Ok(())
}

/// Opens the training data and checks it against the model; records its text format in the
/// model's config.json keys.
fn open_dataset(opts: &TrainOptions, run: &mut RunConfig) -> Result<Dataset> {
    let ds = Dataset::open(&opts.data)?;
    if ds.manifest().vocab_size > run.model.vocab_size {
        bail!(
            "{}: the dataset's vocabulary ({}) is larger than the model's ({})",
            opts.data.display(),
            ds.manifest().vocab_size,
            run.model.vocab_size
        );
    }
    if ds.num_tokens(Split::Train) == 0 {
        bail!("{}: the training split is empty", opts.data.display());
    }
    // Evaluation reads the text format back from config.json (not part of the run's identity).
    run.model.extra.insert(TEXT_FORMAT_KEY.into(), serde_json::json!(ds.manifest().text_format.as_str()));
    Ok(ds)
}

/// The model, optimizer and trainer state to start from: the checkpoint's on a resume (its
/// configuration hash must match), else a new model (initialised, or `--init-from`'s weights).
fn starting_point(
    resumed: Option<Checkpoint>,
    init: Option<&(crate::init_from::InitSource, Vec<String>)>,
    run: &RunConfig,
    hash: &str,
    loader: &mut Loader,
    opts: &TrainOptions,
) -> Result<(Model, AdamW, TrainerState)> {
    let tc = &run.train;
    Ok(match resumed {
        Some(ck) => {
            if ck.state.config_hash != hash {
                let diff = run_diff(&ck.state.run, run);
                let detail = if diff.is_empty() {
                    format!(
                        "the training data differ (checkpoint trained on {}, now {})",
                        ck.state.data_dir,
                        opts.data.display()
                    )
                } else {
                    diff.join("; ")
                };
                bail!("--resume: the configuration does not match checkpoint {}: {detail}", ck.dir.display());
            }
            loader.set_state(ck.state.data);
            if opts.verbose {
                eprintln!(
                    "resuming from {} (step {}, {} tokens)",
                    ck.dir.display(),
                    ck.state.step,
                    ck.state.tokens_seen
                );
            }
            (ck.model, ck.opt, ck.state)
        }
        None => {
            let model = match init {
                Some((src, changes)) => {
                    let m = crate::init_from::load_initial_model(src, &run.model)
                        .with_context(|| format!("--init-from {}", src.dir.display()))?;
                    if opts.verbose {
                        eprintln!("initial weights: {} ({} parameters)", src.dir.display(), m.params.numel());
                        for c in changes {
                            eprintln!("changed: {c}");
                        }
                    }
                    m
                }
                None => init_model(&run.model, tc.seed),
            };
            let opt = AdamW::new(tc.adamw(), &model.params);
            let state = TrainerState {
                step: 0,
                tokens_seen: 0,
                data: loader.state(),
                config_hash: hash.to_string(),
                run: run.clone(),
                data_dir: opts.data.display().to_string(),
                elapsed_s: 0.0,
                last_val_loss: None,
                finished: false,
                init_from: init.map(|(src, _)| src.dir.display().to_string()),
            };
            (model, opt, state)
        }
    })
}

/// The loss plot's title: the variant, its size and the data's first source.
fn plot_title(run: &RunConfig, ds: &Dataset, opts: &TrainOptions) -> String {
    format!(
        "{} (d={}, {} layers) on {}",
        variant_title(&run.model),
        run.model.hidden_size,
        run.model.num_hidden_layers,
        ds.manifest()
            .sources
            .first()
            .and_then(|s| Path::new(s).file_name().map(|n| n.to_string_lossy().to_string()))
            .unwrap_or_else(|| opts.data.display().to_string())
    )
}

/// The progress bar of `--progress` (hidden without it), at `step` of `total_steps`.
fn progress_bar(opts: &TrainOptions, total_steps: u64, step: u64) -> indicatif::ProgressBar {
    if opts.progress {
        let pb = indicatif::ProgressBar::new(total_steps);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:28} {pos}/{len} steps | {msg} | ETA {eta}",
            )
            .expect("template")
            .progress_chars("=> "),
        );
        pb.set_position(step);
        pb.reset_eta();
        pb
    } else {
        indicatif::ProgressBar::hidden()
    }
}

/// The report of a run that had already finished when `train` was called.
fn already_finished(state: &TrainerState, opts: &TrainOptions) -> Result<TrainReport> {
    let out = &opts.out;
    if opts.verbose {
        eprintln!("the run in {} is already complete ({} steps)", out.display(), state.step);
    }
    let ck = latest_checkpoint(out)?.unwrap_or_else(|| out.join(FINAL_DIR));
    Ok(TrainReport {
        outcome: Outcome::AlreadyFinished,
        step: state.step,
        tokens_seen: state.tokens_seen,
        checkpoint: ck,
        first_val_loss: None,
        last_val_loss: state.last_val_loss,
        last_train_loss: None,
        tokens_per_s: 0.0,
        elapsed_s: 0.0,
        init_changes: vec![],
    })
}

/// Seconds trained: those of the processes before this one (a resumed run's), and this one's
/// since `start`.
struct Clock {
    before: f64,
    start: Instant,
}

impl Clock {
    /// The run's training time so far, over every process.
    fn elapsed_s(&self) -> f64 {
        self.before + self.start.elapsed().as_secs_f64()
    }

    /// This process's training time so far.
    fn this_run_s(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

/// One step's numbers, as the metrics, the progress bar and the text log report them.
struct StepLog {
    loss: f64,
    norm: f64,
    lr: f64,
    /// The step's seconds.
    dt: f64,
    /// Tokens per second over this process's steps.
    tps: f64,
}

/// Where the loop reports: the progress bar (or with --verbose and no bar, lines on stderr), and
/// on rank 0 the metrics (metrics.jsonl, TensorBoard) and the loss plot.
struct Reporter<'a> {
    opts: &'a TrainOptions,
    ds: &'a Dataset,
    tc: &'a TrainConfig,
    pb: indicatif::ProgressBar,
    /// Rank 0's; None on the other ranks.
    metrics: Option<MetricsLog>,
    rank0: bool,
    plot_title: String,
    total_steps: u64,
    /// Without a progress bar, a text line every this many steps.
    text_every: u64,
}

impl Reporter<'_> {
    /// A message above the progress bar (on stderr without one), with --verbose.
    fn say(&self, s: String) {
        if self.opts.verbose {
            if self.pb.is_hidden() {
                eprintln!("{s}");
            } else {
                self.pb.println(s);
            }
        }
    }

    /// The validation loss (None when the split is shorter than a window), recorded in `state`
    /// and the metrics.
    fn validate(
        &mut self,
        engine: &mut dyn Engine,
        model: &mut Model,
        state: &mut TrainerState,
        clock: &Clock,
    ) -> Result<Option<f64>> {
        let v = engine.validation_loss(model, self.ds, self.tc.context, self.tc.eval_tokens)?;
        if let Some(v) = v {
            state.last_val_loss = Some(v);
            if let Some(metrics) = self.metrics.as_mut() {
                metrics.write(&Metric {
                    kind: "val".into(),
                    step: state.step,
                    tokens: state.tokens_seen,
                    loss: None,
                    val_loss: Some(v),
                    lr: None,
                    grad_norm: None,
                    tokens_per_s: None,
                    elapsed_s: clock.elapsed_s(),
                })?;
            }
        }
        Ok(v)
    }

    /// The validation loss before the first step, or a note that the split has no window.
    fn first_validation(
        &mut self,
        engine: &mut dyn Engine,
        model: &mut Model,
        state: &mut TrainerState,
        clock: &Clock,
    ) -> Result<Option<f64>> {
        let v = self.validate(engine, model, state, clock)?;
        match v {
            Some(v) => self.say(format!("step 0: validation loss {v:.4}")),
            None => self.say(format!(
                "note: the validation split ({} tokens) is shorter than one window of {}: no validation loss",
                self.ds.num_tokens(Split::Val),
                self.tc.context
            )),
        }
        Ok(v)
    }

    /// A step done: its metrics (every `log_every` steps and the last), the bar's message and
    /// position, and without a bar a text line every `text_every` steps.
    fn step(&mut self, state: &TrainerState, s: &StepLog) -> Result<()> {
        let (tc, total_steps) = (self.tc, self.total_steps);
        let StepLog { loss, norm, lr, dt, tps } = *s;
        if let Some(metrics) =
            self.metrics.as_mut().filter(|_| state.step.is_multiple_of(tc.log_every) || state.step == total_steps)
        {
            metrics.write(&Metric {
                kind: "train".into(),
                step: state.step,
                tokens: state.tokens_seen,
                loss: Some(loss),
                val_loss: None,
                lr: Some(lr),
                grad_norm: Some(norm),
                tokens_per_s: Some(tc.tokens_per_step() as f64 / dt),
                elapsed_s: state.elapsed_s,
            })?;
        }
        self.pb.set_message(format!("loss {loss:.3} | lr {lr:.2e} | {} tok/s", fmt_tokens(tps)));
        self.pb.set_position(state.step);
        if self.pb.is_hidden() && self.opts.verbose && state.step.is_multiple_of(self.text_every) {
            eprintln!(
                "step {}/{total_steps}: loss {loss:.4}, lr {lr:.2e}, {} tok/s, {} tokens",
                state.step,
                fmt_tokens(tps),
                fmt_tokens(state.tokens_seen as f64)
            );
        }
        Ok(())
    }

    /// The evaluation of a step on the cadence (or the last): the validation loss, then the loss
    /// plot redrawn.
    fn evaluate(
        &mut self,
        engine: &mut dyn Engine,
        model: &mut Model,
        state: &mut TrainerState,
        clock: &Clock,
    ) -> Result<()> {
        if let Some(v) = self.validate(engine, model, state, clock)? {
            self.say(format!("step {}: validation loss {v:.4}", state.step));
        }
        self.plot();
        Ok(())
    }

    /// The loss plot (rank 0; a plot that cannot be drawn is no reason to stop).
    fn plot(&self) {
        if self.rank0 {
            let _ = plot_losses(&self.opts.out, &self.plot_title);
        }
    }
}

/// The error of a step whose loss or gradient norm is not finite (`step` was not applied).
fn diverged(step: u64, loss: f64, norm: f64, last_saved: &Option<PathBuf>) -> anyhow::Error {
    anyhow::anyhow!(
        "training diverged at step {step}: loss {loss}, gradient norm {norm}; stopped without updating. \
         The last good checkpoint is {} (resume from it with a lower --lr)",
        last_saved.as_ref().map_or("(none: no checkpoint was written yet)".to_string(), |p| p.display().to_string())
    )
}

/// Saves checkpoint `name` into `out`; a failure names the last good checkpoint, `last`.
fn save(
    out: &Path,
    name: &str,
    model: &Model,
    opt: &AdamW,
    state: &TrainerState,
    last: &Option<PathBuf>,
) -> Result<PathBuf> {
    save_checkpoint(out, name, model, opt, state).with_context(|| {
        format!(
            "saving checkpoint {name} failed; the last good checkpoint is {}",
            last.as_ref().map_or("(none yet)".to_string(), |p| p.display().to_string())
        )
    })
}

/// The numbered checkpoint of this step, then the numbered ones beyond `keep_last` removed.
fn save_numbered(
    out: &Path,
    tc: &TrainConfig,
    model: &Model,
    opt: &AdamW,
    state: &TrainerState,
    last: &Option<PathBuf>,
) -> Result<PathBuf> {
    let p = save(out, &format!("checkpoint-{:06}", state.step), model, opt, state, last)?;
    prune_checkpoints(out, tc.keep_last);
    Ok(p)
}

/// Trains `run` on the dataset in `opts.data`, writing into `opts.out`. With `opts.resume`, the
/// run continues from the latest checkpoint in `opts.out` (and `run` must match its
/// configuration); `run` may then be None to take the checkpoint's.
pub fn train(run: Option<RunConfig>, opts: &TrainOptions) -> Result<TrainReport> {
    let out = &opts.out;
    let t_start = Instant::now();
    let (mut run, resumed) = resolve_run(run, opts)?;
    let init = init_source(opts, &run)?;
    // In a data-parallel run only rank 0 writes (metrics, plots, checkpoints).
    let rank0 = opts.dist.as_ref().is_none_or(|d| d.world.rank == 0);
    check_fits(&run, opts)?;
    let tc = run.train.clone();

    let ds = open_dataset(opts, &mut run)?;
    let mut loader = Loader::new(&ds, Split::Train, tc.context, tc.seed, true)?;
    let hash = config_hash(&run, &data_fingerprint(&ds));
    if rank0 {
        check_output_dir(out)?;
    }

    let (mut model, mut opt, mut state) = starting_point(resumed, init.as_ref(), &run, &hash, &mut loader, opts)?;
    // Cadence settings may change on resume; the state records the run as now configured.
    state.run = run.clone();
    state.data_dir = opts.data.display().to_string();
    if rank0 {
        let run_json = serde_json::to_string_pretty(&run).unwrap();
        write_atomic(&out.join(RUN_FILE), run_json.as_bytes())?;
    }

    let total_steps = tc.total_steps();
    let plot_title = plot_title(&run, &ds, opts);
    if state.finished || state.step >= total_steps {
        return already_finished(&state, opts);
    }
    let metrics = match rank0 {
        true => Some(MetricsLog::open(
            out,
            if state.step > 0 || opts.resume { Some(state.step) } else { None },
            opts.tensorboard.as_deref(),
        )?),
        false => None,
    };
    let schedule = tc.schedule();
    let accum = tc.batch_size / tc.micro_batch;
    let mut engine = make_engine(&model, &opt, opts, tc.micro_batch, tc.context)?;

    let mut report = Reporter {
        opts,
        ds: &ds,
        tc: &tc,
        pb: progress_bar(opts, total_steps, state.step),
        metrics,
        rank0,
        plot_title,
        total_steps,
        text_every: (total_steps / 20).max(1),
    };
    report.say(format!("device: {}", engine.describe()));
    let clock = Clock { before: state.elapsed_s, start: Instant::now() };
    let first_val =
        if state.step == 0 { report.first_validation(engine.as_mut(), &mut model, &mut state, &clock)? } else { None };
    let mut last_saved: Option<PathBuf> = latest_checkpoint(out)?;
    let mut last_loss = None;
    let mut steps_this_run = 0u64;
    let mut outcome = Outcome::Finished;

    while state.step < total_steps {
        let t0 = Instant::now();
        let st = engine.grads(&mut model, &mut loader, tc.micro_batch, accum, tc.max_grad_norm)?;
        let (loss, norm) = (st.loss, st.grad_norm);
        if !loss.is_finite() || !norm.is_finite() {
            report.pb.abandon();
            return Err(diverged(state.step + 1, loss, norm, &last_saved));
        }
        let lr = schedule.lr(state.tokens_seen);
        engine.update(&mut model, &mut opt, lr)?;
        state.step += 1;
        steps_this_run += 1;
        state.tokens_seen += tc.tokens_per_step();
        state.data = loader.state();
        state.elapsed_s = clock.elapsed_s();
        last_loss = Some(loss);
        let dt = t0.elapsed().as_secs_f64();
        let tps = steps_this_run as f64 * tc.tokens_per_step() as f64 / clock.this_run_s();
        report.step(&state, &StepLog { loss, norm, lr, dt, tps })?;
        let done = state.step >= total_steps;
        if (tc.eval_every > 0 && state.step % tc.eval_every == 0) || done {
            report.evaluate(engine.as_mut(), &mut model, &mut state, &clock)?;
        }
        // Every rank stops at the same step (Ctrl-C may reach them at different ones).
        let stop = STOP.load(Ordering::SeqCst) || opts.stop_after.is_some_and(|s| state.step >= s);
        let stop = engine.any_rank(stop)?;
        let checkpoint_now = (tc.checkpoint_every > 0 && state.step % tc.checkpoint_every == 0) || stop;
        if done || checkpoint_now {
            engine.sync(&mut model, &mut opt)?;
        }
        if done {
            state.finished = true;
            if rank0 {
                last_saved = Some(save(out, FINAL_DIR, &model, &opt, &state, &last_saved)?);
            }
            break;
        }
        if checkpoint_now && rank0 {
            last_saved = Some(save_numbered(out, &tc, &model, &opt, &state, &last_saved)?);
        }
        crate::distributed::heartbeat();
        if stop {
            outcome = Outcome::Interrupted;
            break;
        }
    }
    report.pb.finish_and_clear();
    report.plot();
    let elapsed = t_start.elapsed().as_secs_f64();
    Ok(TrainReport {
        outcome,
        step: state.step,
        tokens_seen: state.tokens_seen,
        checkpoint: last_saved.unwrap_or_else(|| out.join(FINAL_DIR)),
        first_val_loss: first_val,
        last_val_loss: state.last_val_loss,
        last_train_loss: last_loss,
        tokens_per_s: steps_this_run as f64 * tc.tokens_per_step() as f64 / clock.this_run_s().max(1e-9),
        elapsed_s: elapsed,
        init_changes: init.map(|(_, c)| c).unwrap_or_default(),
    })
}
