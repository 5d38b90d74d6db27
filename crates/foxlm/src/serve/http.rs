//! The HTTP endpoints: OpenAI's legacy completions API, the model list, health, and vLLM's
//! tokenizer endpoints (`/tokenize`, `/detokenize`, `/tokenizer_info`).

use super::api::{prompts, token_ids, ApiError, Fields, Prompt};
use super::scheduler::{Event, Finish, SchedulerHandle, SeqRequest, SubmitError, TokenLogprob};
use crate::sampling::Sampling;
use crate::tokenizer::{TextFormat, Tokenizer, EOS_ID};
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// The literal text of the end-of-text token, recognised in prompts as the token itself (as Hugging
/// Face tokenizers and vLLM do), so that `/tokenize` and `tokenizer.json` agree.
pub const EOT_TEXT: &str = "<|endoftext|>";
/// Most choices (`n`) per prompt, and most alternatives per position (`logprobs`).
pub const MAX_N: i64 = 16;
pub const MAX_LOGPROBS: i64 = 20;

/// Everything the handlers share.
pub struct App {
    pub scheduler: SchedulerHandle,
    pub model_name: String,
    /// Other names the model answers to (e.g. the folder path it was loaded from).
    pub aliases: Vec<String>,
    /// The GPT-2 tokenizer in the model's text format; None when the vocabulary is not GPT-2's.
    pub tokenizer: Option<Tokenizer>,
    pub vocab: usize,
    pub max_model_len: usize,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub api_key: Option<String>,
    pub created: u64,
    /// What `GET /metrics` reports beside the scheduler's counters.
    pub metrics: super::metrics::Metrics,
    pub max_batch: usize,
    pub next_id: AtomicU64,
}

impl App {
    fn format(&self) -> Option<TextFormat> {
        self.tokenizer.as_ref().map(|t| t.format())
    }

    fn tokenizer(&self, field: &str) -> Result<&Tokenizer, ApiError> {
        self.tokenizer.as_ref().ok_or_else(|| {
            ApiError::invalid(
                field,
                format!(
                    "this model's vocabulary has {} tokens, not GPT-2's: it has no text tokenizer; send token ids",
                    self.vocab
                ),
            )
        })
    }

    /// Token ids of `text`; `<|endoftext|>` in the text is the token itself.
    pub fn encode(&self, text: &str, add_bos: bool, field: &str) -> Result<Vec<u32>, ApiError> {
        let tok = self.tokenizer(field)?;
        let mut ids = Vec::new();
        if add_bos {
            ids.extend(self.bos);
        }
        for (i, part) in text.split(EOT_TEXT).enumerate() {
            if i > 0 {
                ids.push(EOS_ID);
            }
            ids.extend(tok.encode(part, false));
        }
        Ok(ids)
    }

    /// Text of ids (special tokens dropped); models without a text tokenizer give "".
    pub fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.as_ref().map_or_else(String::new, |t| t.decode(ids))
    }

    /// A token as a string, as OpenAI's `tokens` and `top_logprobs` show it: its own bytes (in the
    /// escaped form for json-escaped models; lossy where it holds part of a UTF-8 character).
    pub fn token_str(&self, id: u32) -> String {
        match &self.tokenizer {
            Some(t) => match t.token_bytes(id) {
                Some(b) => String::from_utf8_lossy(b).into_owned(),
                None => EOT_TEXT.to_string(),
            },
            None => format!("<{id}>"),
        }
    }

    fn check_model(&self, f: &Fields) -> Result<(), ApiError> {
        if let Some(m) = f.str("model")? {
            if m != self.model_name && !self.aliases.iter().any(|a| a == m) {
                return Err(ApiError {
                    status: StatusCode::NOT_FOUND,
                    message: format!("the model '{m}' does not exist; this server serves '{}'", self.model_name),
                    kind: "invalid_request_error",
                    param: Some("model".into()),
                    code: Some("model_not_found"),
                });
            }
        }
        Ok(())
    }
}

pub fn router(app: Arc<App>, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/stats", get(stats))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/tokenizer_info", get(tokenizer_info))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(app.clone(), auth))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(app)
}

async fn auth(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    if let Some(key) = &app.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        // Compare every byte, so the time taken does not tell how much of the key matched.
        let ok = given.is_some_and(|g| {
            g.len() == key.len() && g.bytes().zip(key.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
        });
        if !ok {
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing or wrong API key: send 'Authorization: Bearer <key>'",
            )
            .with_code("invalid_api_key")
            .into_response();
        }
    }
    next.run(req).await
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("no such endpoint: {} {}", req.method(), req.uri().path()),
    )
}

/// A request's body as axum hands it over (its rejection carries 413 past the size limit).
type RawBody = Result<Bytes, axum::extract::rejection::BytesRejection>;

/// The body as JSON: 413 past the size limit, 400 when malformed.
fn json_body(body: RawBody) -> Result<Value, ApiError> {
    let bytes = body.map_err(|e| {
        let status = e.status();
        let msg = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "the request body is larger than the server's limit (--max-body-bytes)".to_string()
        } else {
            format!("cannot read the request body: {e}")
        };
        ApiError::new(status, "invalid_request_error", msg)
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid("body", format!("the request body is not valid JSON: {e}")))
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn stats(State(app): State<Arc<App>>) -> Json<Value> {
    Json(app.scheduler.stats.to_json())
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let text = super::metrics::render(&app.metrics, &app.scheduler.stats, app.max_batch);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

async fn models(State(app): State<Arc<App>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": app.model_name,
            "object": "model",
            "created": app.created,
            "owned_by": "foxlm",
            "max_model_len": app.max_model_len,
            "vocab_size": app.vocab,
            "text_format": app.format().map(|f| f.as_str()),
        }]
    }))
}

async fn tokenizer_info(State(app): State<Arc<App>>) -> Result<Json<Value>, ApiError> {
    app.tokenizer("model")?;
    Ok(Json(json!({
        "tokenizer_class": "GPT2TokenizerFast",
        "bos_token": EOT_TEXT,
        "eos_token": EOT_TEXT,
        "pad_token": Value::Null,
        "model_max_length": app.max_model_len,
        "text_format": app.format().map(|f| f.as_str()),
    })))
}

async fn tokenize(State(app): State<Arc<App>>, body: RawBody) -> Result<Json<Value>, ApiError> {
    let body = json_body(body)?;
    let f = Fields::parse(&body)?;
    app.check_model(&f)?;
    let text = f.str("prompt")?.ok_or_else(|| ApiError::invalid("prompt", "'prompt' (a string) is required"))?;
    let ids = app.encode(text, f.bool("add_special_tokens", true)?, "prompt")?;
    Ok(Json(json!({"count": ids.len(), "max_model_len": app.max_model_len, "tokens": ids})))
}

async fn detokenize(State(app): State<Arc<App>>, body: RawBody) -> Result<Json<Value>, ApiError> {
    let body = json_body(body)?;
    let f = Fields::parse(&body)?;
    app.check_model(&f)?;
    let v = f.get("tokens").ok_or_else(|| ApiError::invalid("tokens", "'tokens' (a list of token ids) is required"))?;
    let ids = token_ids(v, "tokens", app.vocab)?;
    app.tokenizer("tokens")?;
    Ok(Json(json!({"prompt": app.decode(&ids)})))
}

/// A completion request, checked.
struct Completion {
    prompts: Vec<(Prompt, Vec<u32>)>,
    max_tokens: Vec<usize>,
    sampling: Sampling,
    seed: Option<u64>,
    stop: Vec<String>,
    n: usize,
    echo: bool,
    logprobs: Option<usize>,
    stream: bool,
    /// `stream_options.include_usage`: end the stream with a usage-only chunk (empty `choices`),
    /// and give every other chunk `"usage": null`, as OpenAI and vLLM do.
    include_usage: bool,
    ignore_eos: bool,
    return_token_ids: bool,
}

fn parse_completion(app: &App, body: &Value) -> Result<Completion, ApiError> {
    let f = Fields::parse(body)?;
    app.check_model(&f)?;
    // Features this server does not have are refused rather than silently ignored.
    for (name, neutral) in [("presence_penalty", 0.0), ("frequency_penalty", 0.0)] {
        if f.f64(name)?.is_some_and(|v| v != neutral) {
            return Err(ApiError::invalid(name, format!("'{name}' is not supported by foxlm serve")));
        }
    }
    if f.int("best_of", 0, i64::MAX)?.is_some_and(|b| b > 1) {
        return Err(ApiError::invalid("best_of", "'best_of' above 1 is not supported by foxlm serve"));
    }
    if f.get("suffix").is_some() {
        return Err(ApiError::invalid("suffix", "'suffix' is not supported by foxlm serve"));
    }
    if f.get("logit_bias").is_some_and(|v| v.as_object().is_none_or(|m| !m.is_empty())) {
        return Err(ApiError::invalid("logit_bias", "'logit_bias' is not supported by foxlm serve"));
    }
    let add_bos = f.bool("add_special_tokens", true)?;
    let mut ps = Vec::new();
    for p in prompts(&f, app.vocab)? {
        let ids = match &p {
            Prompt::Text(s) => app.encode(s, add_bos, "prompt")?,
            Prompt::Ids(ids) => ids.clone(),
        };
        if ids.is_empty() {
            return Err(ApiError::invalid(
                "prompt",
                "'prompt' is empty (and add_special_tokens is false): nothing to continue",
            ));
        }
        if ids.len() > app.max_model_len {
            return Err(ApiError::invalid(
                "prompt",
                format!(
                    "the prompt has {} tokens, more than the model's context of {} (--max-model-len)",
                    ids.len(),
                    app.max_model_len
                ),
            )
            .with_code("context_length_exceeded"));
        }
        ps.push((p, ids));
    }
    let asked = f.int("max_tokens", 0, i64::MAX)?;
    let mut max_tokens = Vec::new();
    for (_, ids) in &ps {
        let room = app.max_model_len - ids.len();
        max_tokens.push(match asked {
            Some(m) if m as u64 > room as u64 => {
                return Err(ApiError::invalid(
                    "max_tokens",
                    format!(
                        "max_tokens {m} plus the prompt's {} tokens exceeds the model's context of {} tokens",
                        ids.len(),
                        app.max_model_len
                    ),
                )
                .with_code("context_length_exceeded"))
            }
            Some(m) => m as usize,
            // OpenAI's default, shortened to fit the context.
            None => room.min(16),
        });
    }
    let temperature = f.f64("temperature")?.unwrap_or(1.0);
    if temperature < 0.0 {
        return Err(ApiError::invalid("temperature", format!("'temperature' must be >= 0, got {temperature}")));
    }
    let top_p = f.f64("top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid("top_p", format!("'top_p' must be in (0, 1], got {top_p}")));
    }
    let top_k = f.int("top_k", -1, i64::MAX)?.unwrap_or(-1).max(0) as usize;
    let stop = f.strings("stop")?;
    if stop.iter().any(|s| s.is_empty()) {
        return Err(ApiError::invalid("stop", "'stop' strings must not be empty"));
    }
    if stop.len() > 16 {
        return Err(ApiError::invalid("stop", "at most 16 stop strings"));
    }
    let logprobs = f.int("logprobs", 0, MAX_LOGPROBS)?.map(|k| k as usize);
    let stream = f.bool("stream", false)?;
    let include_usage = stream_options(&f, stream)?;
    Ok(Completion {
        max_tokens,
        sampling: Sampling { temperature: temperature as f32, top_k, top_p: top_p as f32 },
        seed: f.seed("seed")?,
        stop,
        n: f.int("n", 1, MAX_N)?.unwrap_or(1) as usize,
        echo: f.bool("echo", false)?,
        logprobs,
        stream,
        include_usage,
        ignore_eos: f.bool("ignore_eos", false)?,
        return_token_ids: f.bool("return_token_ids", false)?,
        prompts: ps,
    })
}

/// `stream_options` (an object, only with `stream: true`): whether the stream ends with a usage
/// chunk. Unknown keys are refused, as every option foxlm does not have.
fn stream_options(f: &Fields, stream: bool) -> Result<bool, ApiError> {
    let Some(v) = f.get("stream_options") else { return Ok(false) };
    if !stream {
        return Err(ApiError::invalid("stream_options", "'stream_options' is only allowed with 'stream': true"));
    }
    let o = Fields::parse(v).map_err(|_| ApiError::invalid("stream_options", "'stream_options' must be an object"))?;
    if let Some(k) = o.keys().find(|k| *k != "include_usage") {
        return Err(ApiError::invalid(
            &format!("stream_options.{k}"),
            format!("'stream_options.{k}' is not supported by foxlm serve (only 'include_usage')"),
        ));
    }
    o.bool("include_usage", false).map_err(|e| ApiError { param: Some("stream_options.include_usage".into()), ..e })
}

/// OpenAI's legacy `logprobs` object, built up token by token.
#[derive(Default)]
struct Logprobs {
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<Value>,
}

impl Logprobs {
    fn push(&mut self, app: &App, id: u32, lp: Option<&TokenLogprob>, offset: usize) {
        self.tokens.push(Value::String(app.token_str(id)));
        match lp {
            Some(lp) => {
                self.token_logprobs.push(json!(lp.logprob));
                let mut top = Map::new();
                for &(t, l) in &lp.top {
                    top.entry(app.token_str(t)).or_insert(json!(l));
                }
                self.top_logprobs.push(Value::Object(top));
            }
            None => {
                self.token_logprobs.push(Value::Null);
                self.top_logprobs.push(Value::Null);
            }
        }
        self.text_offset.push(json!(offset));
    }
    fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
    fn take(&mut self) -> Value {
        let t = std::mem::take(self);
        json!({"tokens": t.tokens, "token_logprobs": t.token_logprobs, "top_logprobs": t.top_logprobs, "text_offset": t.text_offset})
    }
}

/// The longest suffix of `text` that is a proper prefix of some stop string: held back while
/// streaming, since the next token may complete the stop string.
fn held_back(text: &str, stop: &[String]) -> usize {
    let mut best = 0;
    for s in stop {
        for (i, _) in s.char_indices().skip(1) {
            if i > best && text.ends_with(&s[..i]) {
                best = i;
            }
        }
    }
    best
}

/// What one choice produced.
struct ChoiceOut {
    text: String,
    logprobs: Option<Value>,
    finish: &'static str,
    tokens: usize,
    token_ids: Vec<u32>,
}

/// Everything one choice needs besides its event channel.
struct ChoiceSpec {
    index: usize,
    /// When the request arrived (time to first token counts from here).
    arrived: std::time::Instant,
    prompt_text: String,
    prompt_ids: Vec<u32>,
}

/// Follows one sequence's events: decodes text, applies stop strings, gathers log-probabilities,
/// and (streaming) sends a chunk per event. Returns None when the client has gone.
async fn run_choice(
    app: &App,
    c: &Completion,
    spec: ChoiceSpec,
    mut rx: mpsc::UnboundedReceiver<Event>,
    sink: Option<(&mpsc::Sender<Bytes>, &Value)>,
) -> Option<ChoiceOut> {
    let tok = app.tokenizer.clone();
    let mut dec = tok.as_ref().map(|t| t.stream());
    let mut lps = Logprobs::default();
    let mut text = String::new(); // everything after the prompt decoded so far
    let mut sent = 0; // bytes of `text` already sent (streaming)
    let mut token_ids = Vec::new();
    let mut chars = 0usize; // chars of the (echoed) text before the next token
    let mut echo_text = String::new();
    let mut finish = "length";
    let mut stopped = false;
    let mut last_token: Option<std::time::Instant> = None;

    let send = |piece: &str, logprobs: Option<Value>, finish: Option<&str>| -> Option<Bytes> {
        let (_, head) = sink?;
        let mut chunk = head.clone();
        chunk["choices"] = json!([{"index": spec.index, "text": piece, "logprobs": logprobs, "finish_reason": finish}]);
        if c.include_usage {
            chunk["usage"] = Value::Null;
        }
        Some(Bytes::from(format!("data: {chunk}\n\n")))
    };
    macro_rules! emit {
        ($piece:expr, $lp:expr, $fin:expr) => {
            if let Some(bytes) = send($piece, $lp, $fin) {
                if sink?.0.send(bytes).await.is_err() {
                    return None;
                }
            }
        };
    }

    if c.echo {
        echo_text = spec.prompt_text.clone();
        if c.logprobs.is_none() {
            emit!(&echo_text, None, None);
        }
    }
    if !c.echo || c.logprobs.is_none() {
        chars = echo_text.chars().count();
    }
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Prompt(p) => {
                // Offsets of the prompt's tokens in the echoed text.
                let ptok = tok.clone();
                let mut pdec = ptok.as_ref().map(|t| t.stream());
                let mut pos = 0usize;
                for (i, &id) in spec.prompt_ids.iter().enumerate() {
                    lps.push(app, id, if i == 0 { None } else { p.get(i - 1) }, pos);
                    if let Some(d) = pdec.as_mut() {
                        pos += d.push(id).chars().count();
                    }
                }
                chars = echo_text.chars().count();
                let lp = sink.is_some().then(|| lps.take());
                emit!(&echo_text, lp, None);
            }
            Event::Token(id, lp) => {
                let now = std::time::Instant::now();
                match last_token {
                    None => app.metrics.ttft.observe(now.duration_since(spec.arrived)),
                    Some(t) => app.metrics.itl.observe(now.duration_since(t)),
                }
                last_token = Some(now);
                app.metrics.generation_tokens.fetch_add(1, Ordering::Relaxed);
                token_ids.push(id);
                if c.logprobs.is_some() {
                    lps.push(app, id, lp.as_ref(), chars);
                }
                let piece = dec.as_mut().map_or_else(String::new, |d| d.push(id));
                chars += piece.chars().count();
                text.push_str(&piece);
                if let Some(cut) = c.stop.iter().filter_map(|s| text.find(s.as_str())).min() {
                    text.truncate(cut);
                    finish = "stop";
                    stopped = true;
                    break;
                }
                let end = text.len() - held_back(&text, &c.stop);
                if sink.is_some() && (end > sent || c.logprobs.is_some()) {
                    let lp = c.logprobs.is_some().then(|| lps.take());
                    let piece = text[sent..end.max(sent)].to_string();
                    sent = end.max(sent);
                    emit!(&piece, lp, None);
                }
            }
            Event::Done(f) => {
                if let Some(d) = dec.as_mut() {
                    text.push_str(&d.finish());
                }
                if let Some(cut) = c.stop.iter().filter_map(|s| text.find(s.as_str())).min() {
                    text.truncate(cut);
                    finish = "stop";
                } else {
                    finish = match f {
                        Finish::Stop => "stop",
                        Finish::Length => "length",
                    };
                }
                stopped = true;
                break;
            }
        }
    }
    if !stopped {
        // The scheduler dropped the sequence without finishing it: it is shutting down.
        return None;
    }
    drop(rx); // cancels the sequence if a stop string ended it early
    let rest = text.get(sent..).unwrap_or("").to_string();
    let lp = (sink.is_some() && c.logprobs.is_some() && !lps.is_empty()).then(|| lps.take());
    emit!(&rest, lp, Some(finish));
    let full = if c.echo { format!("{echo_text}{text}") } else { text };
    Some(ChoiceOut { text: full, logprobs: c.logprobs.map(|_| lps.take()), finish, tokens: token_ids.len(), token_ids })
}

fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

async fn completions(State(app): State<Arc<App>>, body: RawBody) -> Result<Response, ApiError> {
    let arrived = std::time::Instant::now();
    let body = json_body(body)?;
    let c = parse_completion(&app, &body)?;
    let seed = c.seed.unwrap_or_else(rand::random);
    let eos = if c.ignore_eos { None } else { app.eos };
    let mut job = Vec::new();
    let mut specs = Vec::new();
    for (pi, (p, ids)) in c.prompts.iter().enumerate() {
        for j in 0..c.n {
            let (tx, rx) = mpsc::unbounded_channel();
            job.push(SeqRequest {
                prompt: ids.clone(),
                max_tokens: c.max_tokens[pi],
                sampling: c.sampling.clone(),
                // Each choice of a prompt draws its own stream of random numbers.
                seed: seed.wrapping_add(j as u64),
                eos,
                prompt_logprobs: if c.echo { c.logprobs } else { None },
                logprobs: c.logprobs,
                events: tx,
                arrived,
            });
            let prompt_text = match p {
                Prompt::Text(s) => s.clone(),
                Prompt::Ids(ids) => app.decode(ids),
            };
            specs.push((ChoiceSpec { index: pi * c.n + j, arrived, prompt_text, prompt_ids: ids.clone() }, rx));
        }
    }
    app.scheduler.submit(job).map_err(|e| match e {
        SubmitError::QueueFull => {
            app.metrics.rejected.fetch_add(1, Ordering::Relaxed);
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_overloaded",
                "the server's request queue is full (--max-queue); retry later",
            )
        }
        SubmitError::Stopped => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "the server is shutting down")
        }
    })?;
    let id = format!("cmpl-{}", app.next_id.fetch_add(1, Ordering::Relaxed));
    let created = now_s();
    let prompt_tokens: usize = c.prompts.iter().map(|(_, ids)| ids.len()).sum();
    app.metrics.requests.fetch_add(1, Ordering::Relaxed);
    app.metrics.prompt_tokens.fetch_add(prompt_tokens, Ordering::Relaxed);
    let head = json!({"id": id, "object": "text_completion", "created": created, "model": app.model_name});

    if !c.stream {
        let outs =
            futures_util::future::join_all(specs.into_iter().map(|(spec, rx)| run_choice(&app, &c, spec, rx, None)))
                .await;
        let mut choices = Vec::new();
        let mut completion_tokens = 0;
        for (i, o) in outs.into_iter().enumerate() {
            let o = o.ok_or_else(|| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    "the engine stopped this request: the server is shutting down, or a step failed (see its log)",
                )
            })?;
            completion_tokens += o.tokens;
            let mut ch = json!({"index": i, "text": o.text, "logprobs": o.logprobs, "finish_reason": o.finish});
            if c.return_token_ids {
                ch["token_ids"] = json!(o.token_ids);
                ch["prompt_token_ids"] = json!(c.prompts[i / c.n].1);
            }
            choices.push(ch);
        }
        let mut out = head;
        out["choices"] = Value::Array(choices);
        out["usage"] = json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens});
        return Ok(Json(out).into_response());
    }

    // Streaming: a task follows the choices and writes server-sent events into the body's channel;
    // when the client goes, the channel closes, the task ends and the sequences are cancelled.
    let (btx, brx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let c = c;
        let outs = futures_util::future::join_all(
            specs.into_iter().map(|(spec, rx)| run_choice(&app, &c, spec, rx, Some((&btx, &head)))),
        )
        .await;
        if outs.iter().any(|o| o.is_none()) {
            return;
        }
        if c.include_usage {
            let completion_tokens: usize = outs.iter().flatten().map(|o| o.tokens).sum();
            let mut last = head.clone();
            last["choices"] = json!([]);
            last["usage"] = json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens});
            let _ = btx.send(Bytes::from(format!("data: {last}\n\n"))).await;
        }
        let _ = btx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
    });
    let stream = futures_util::stream::unfold(brx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e.to_string()))
}
