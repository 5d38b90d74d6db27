//! `foxlm serve`: an OpenAI-compatible HTTP server (legacy completions API, as vLLM serves it) with
//! continuous batching, so the `openai` client and lm-evaluation-harness (`local-completions`) can
//! reach a FoX model. See docs/serving.md.

pub mod api;
pub mod client;
pub mod gpu;
pub mod http;
pub mod metrics;
pub mod scheduler;

use crate::backend::DeviceArg;
use crate::checkpoint::load_model;
use crate::tokenizer::text_format_for;
use crate::tokenizer::{TextFormat, Tokenizer, BOS_ID, EOS_ID, GPT2_VOCAB};
use anyhow::{bail, Context, Result};
use fox_kernels::cuda::Device;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Context length when the model records none (FoX has no positional embedding to bound it).
pub const DEFAULT_MAX_MODEL_LEN: usize = 2048;
/// `--admit-delay-ms`: a few decode steps' worth at 125M, far under a first token's target.
pub const DEFAULT_ADMIT_DELAY_MS: f64 = 2.0;

#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub model: PathBuf,
    pub host: String,
    pub port: u16,
    pub device: DeviceArg,
    /// Require `Authorization: Bearer <key>` on every request.
    pub api_key: Option<String>,
    /// The name clients use; defaults to the model folder's name.
    pub served_model_name: Option<String>,
    /// Longest prompt plus completion; defaults to the training context recorded in config.json.
    pub max_model_len: Option<usize>,
    pub text_format: Option<TextFormat>,
    pub max_batch: usize,
    pub max_queue: usize,
    pub max_body_bytes: usize,
    /// See `SchedulerOptions::admit_delay`.
    pub admit_delay_ms: f64,
    /// See `SchedulerOptions::prefill_chunk`.
    pub prefill_chunk: usize,
}

impl ServeOptions {
    pub fn new(model: PathBuf) -> Self {
        Self {
            model,
            host: "127.0.0.1".into(),
            port: 8000,
            device: DeviceArg::Auto,
            api_key: None,
            served_model_name: None,
            max_model_len: None,
            text_format: None,
            max_batch: 64,
            max_queue: 256,
            max_body_bytes: 4 << 20,
            admit_delay_ms: DEFAULT_ADMIT_DELAY_MS,
            prefill_chunk: scheduler::DEFAULT_PREFILL_CHUNK,
        }
    }
}

/// Loads the model, starts the scheduler and builds the shared state.
fn build(o: &ServeOptions) -> Result<(Arc<http::App>, std::thread::JoinHandle<()>)> {
    if o.max_batch == 0 || o.max_queue == 0 || o.prefill_chunk == 0 {
        bail!("--max-batch, --max-queue and --prefill-chunk must be at least 1");
    }
    let model = load_model(&o.model)?;
    let cfg = &model.config;
    let vocab = cfg.vocab_size;
    let tokenizer = if vocab == GPT2_VOCAB {
        Some(Tokenizer::gpt2(text_format_for(cfg, o.text_format))?)
    } else {
        eprintln!(
            "note: {}: the vocabulary has {vocab} tokens, not GPT-2's {GPT2_VOCAB}: prompts must be token ids",
            o.model.display()
        );
        None
    };
    let max_model_len = o.max_model_len.or(cfg.train_context()).unwrap_or(DEFAULT_MAX_MODEL_LEN);
    if max_model_len < 2 {
        bail!("--max-model-len must be at least 2, got {max_model_len}");
    }
    let in_vocab = |id: u32| (id as usize) < vocab;
    let bos = cfg.bos_token_id.or(tokenizer.as_ref().map(|_| BOS_ID)).filter(|&b| in_vocab(b));
    let eos = cfg.eos_token_id.or(tokenizer.as_ref().map(|_| EOS_ID)).filter(|&e| in_vocab(e));
    let name = o.served_model_name.clone().unwrap_or_else(|| {
        let canon = o.model.canonicalize().unwrap_or_else(|_| o.model.clone());
        canon.file_name().map_or_else(|| "foxlm".to_string(), |n| n.to_string_lossy().into_owned())
    });
    let device = crate::model::cuda_plan::select_device_for(&model, o.device, None)?;
    let eopts = scheduler::SchedulerOptions {
        max_batch: o.max_batch,
        max_queue: o.max_queue,
        admit_delay: std::time::Duration::from_secs_f64(o.admit_delay_ms.clamp(0.0, 1e6) / 1e3),
        prefill_chunk: o.prefill_chunk,
    };
    let model = Arc::new(model);
    let on = device.describe();
    let (scheduler, thread) = match device {
        Device::Cpu => scheduler::start(move |l| l.run(&mut scheduler::CpuBatcher::new(&model)), eopts),
        Device::Cuda(gpu) => {
            let (slots, len) = (o.max_batch, max_model_len);
            scheduler::start(
                move |l| {
                    let mut inf = match gpu::serving_infer(gpu, &model, slots, len) {
                        Ok(inf) => inf,
                        Err(e) => return l.fail(e),
                    };
                    let stats = l.stats().clone();
                    match gpu::GpuBatcher::new(&mut inf, len, &stats) {
                        Ok(mut b) => l.run(&mut b),
                        Err(e) => l.fail(e),
                    };
                },
                eopts,
            )
        }
    }
    .with_context(|| format!("cannot start the engine on {on}"))?;
    let app = http::App {
        scheduler,
        model_name: name,
        aliases: vec![o.model.display().to_string()],
        tokenizer,
        vocab,
        max_model_len,
        bos,
        eos,
        api_key: o.api_key.clone().filter(|k| !k.is_empty()),
        created: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        next_id: AtomicU64::new(0),
        metrics: metrics::Metrics::default(),
        max_batch: o.max_batch,
    };
    Ok((Arc::new(app), thread))
}

/// The HTTP side's threads: requests' JSON (a scored prompt's answer holds a few hundred bytes a
/// token) is built and parsed there while the scheduler thread drives the model; a quarter of the
/// cores, 2 to 8, leaves the CPU batcher's thread pool the rest.
fn runtime() -> Result<tokio::runtime::Runtime> {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads((cores / 4).clamp(2, 8))
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Answers go out as they are written: without TCP_NODELAY a response's last small segment can
/// wait for the client's delayed acknowledgement (tens of milliseconds on Linux).
fn no_delay(l: tokio::net::TcpListener) -> impl axum::serve::Listener<Addr = std::net::SocketAddr> {
    use axum::serve::ListenerExt;
    l.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    })
}

/// Resolves when Ctrl-C or SIGTERM arrives.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Serves until Ctrl-C or SIGTERM, then finishes the requests in flight and returns.
pub fn serve(o: &ServeOptions) -> Result<()> {
    let (app, scheduler_thread) = build(o)?;
    let rt = runtime()?;
    rt.block_on(async {
        let addr = format!("{}:{}", o.host, o.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr} (--host, --port)"))?;
        let local = listener.local_addr()?;
        if app.api_key.is_none() && !local.ip().is_loopback() {
            eprintln!("warning: listening on {local} without --api-key: anyone who can reach it can use the model");
        }
        eprintln!(
            "serving '{}' on http://{local}/v1 (context {} tokens, text format {}); Ctrl-C to stop",
            app.model_name,
            app.max_model_len,
            app.tokenizer.as_ref().map_or("token ids only", |t| t.format().as_str())
        );
        let router = http::router(app.clone(), o.max_body_bytes);
        axum::serve(no_delay(listener), router)
            .with_graceful_shutdown(shutdown_signal())
            .await
            .context("HTTP server failed")?;
        eprintln!("stopped: every request in flight was answered");
        anyhow::Ok(())
    })?;
    drop(app);
    let _ = scheduler_thread.join();
    Ok(())
}

/// A server running in this process (for tests and `foxlm bench serve`).
pub struct RunningServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl RunningServer {
    /// Stops accepting connections, finishes the requests in flight and waits for the server.
    pub fn shutdown(mut self) -> Result<()> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| anyhow::anyhow!("the server thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

/// Starts a server on its own threads (port 0 picks a free port) and returns once it listens.
pub fn start(o: &ServeOptions) -> Result<RunningServer> {
    let (app, scheduler_thread) = build(o)?;
    let rt = runtime()?;
    let addr = format!("{}:{}", o.host, o.port);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(&addr))
        .with_context(|| format!("cannot listen on {addr} (--host, --port)"))?;
    let local = listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let router = http::router(app.clone(), o.max_body_bytes);
    let thread = std::thread::Builder::new().name("foxlm-http".into()).spawn(move || {
        let res = rt.block_on(async move {
            axum::serve(no_delay(listener), router)
                .with_graceful_shutdown(async move {
                    let _ = stop_rx.await;
                })
                .await
        });
        // Tasks still holding the scheduler's handle go with the runtime; then it can end.
        drop(rt);
        drop(app);
        let _ = scheduler_thread.join();
        res.context("HTTP server failed")
    })?;
    Ok(RunningServer { addr: local, stop: Some(stop_tx), thread: Some(thread) })
}
