//! Mutation fuzzing of everything foxlm reads (issue 13): a seeded mutator damages one input at a
//! time — a field of config.json, bytes or lengths of a model.safetensors header (two fixture
//! models), a data manifest or one of its shards, a checkpoint's trainer state or optimizer file —
//! and drives the library's own loaders in-process. Every case must end in Ok or in an error with
//! a message: a panic fails the test naming the seed and the mutation; an allocation above
//! `ALLOC_BOUND` is caught by the counting global allocator below; a case running longer than
//! `CASE_TIMEOUT` fails as a hang. Where a damaged input still loads, the model runs a 2-token
//! forward pass and a 2-token generation, and `inspect` reports it (as a user would).
//!
//! `fuzz_inputs` runs FOXLM_FUZZ_CASES cases (default 3000) in CI; the ignored `fuzz_inputs_long`
//! (bench/fuzz_inputs.sh) runs any count, default 1,000,000, and prints cases per second.

mod common;

use common::fixture;
use foxlm::checkpoint::{load_model, CONFIG_FILE, WEIGHTS_FILE};
use foxlm::config::Config;
use foxlm::data::{prepare, Dataset, Loader, PrepareOptions, Split, MANIFEST_FILE};
use foxlm::generate::{generate, GenerateOptions};
use foxlm::model::Ctx;
use foxlm::optim::AdamW;
use foxlm::sampling::Sampling;
use foxlm::tokenizer::TextFormat;
use foxlm::train::{
    init_model, load_checkpoint, save_checkpoint, RunConfig, TrainConfig, TrainerState, OPTIMIZER_FILE, TRAINER_FILE,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// The allocation bound.

/// No single allocation of a case may exceed this (the fixtures need a few MiB).
const ALLOC_BOUND: usize = 1 << 30;

/// Passes allocations to the system allocator; one above `ALLOC_BOUND` is refused. Refusing it
/// makes Rust abort the process (unwinding out of an allocator is undefined behaviour, and the
/// hook that would turn it into a panic is unstable), so before refusing, it writes the case
/// (seed and mutation) and the size to stderr, without allocating, and exits with a failure.
struct BoundedAlloc;

static LARGEST: AtomicUsize = AtomicUsize::new(0);
/// The case in progress, for the report of an oversized allocation: its number and seed, and its
/// description written into a fixed buffer (reading it must not allocate).
static CASE_SEED: AtomicU64 = AtomicU64::new(0);
static CASE_TEXT: Mutex<([u8; 512], usize)> = Mutex::new(([0; 512], 0));
/// The last panic's message and location (the hook records it; the case's report shows it).
static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

/// A `fmt::Write` into a stack buffer (truncating), for messages from inside the allocator.
struct StackBuf {
    buf: [u8; 1024],
    len: usize,
}

impl std::fmt::Write for StackBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

fn oversized(size: usize) -> ! {
    use std::fmt::Write as _;
    use std::io::Write as _;
    let mut m = StackBuf { buf: [0; 1024], len: 0 };
    let _ = write!(m, "\nFUZZ FAILURE: an allocation of {size} bytes exceeds the bound of {ALLOC_BOUND} bytes");
    let _ = write!(m, " in case seed {}: ", CASE_SEED.load(Ordering::SeqCst));
    if let Ok(t) = CASE_TEXT.try_lock() {
        let _ = m.write_str(std::str::from_utf8(&t.0[..t.1]).unwrap_or("?"));
    }
    let _ = m.write_str("\n");
    let _ = std::io::stderr().write_all(&m.buf[..m.len]);
    std::process::exit(3)
}

unsafe impl GlobalAlloc for BoundedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_BOUND {
            oversized(layout.size());
        }
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() > ALLOC_BOUND {
            oversized(layout.size());
        }
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > ALLOC_BOUND {
            oversized(new_size);
        }
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: BoundedAlloc = BoundedAlloc;

// ---------------------------------------------------------------------------------------------
// The pristine inputs, made once.

/// The two fixture models the mutator damages.
const MODELS: [&str; 2] = ["fox_llama", "fox_pro"];

struct Pristine {
    /// Scratch space (tmpfs where there is one: cases write a few MiB each).
    _tmp: tempfile::TempDir,
    root: PathBuf,
    models: Vec<PathBuf>,
    data: PathBuf,
    checkpoint: PathBuf,
}

fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::Builder::new().prefix("foxlm-fuzz").tempdir_in(shm) {
            return d;
        }
    }
    tempfile::Builder::new().prefix("foxlm-fuzz").tempdir().unwrap()
}

fn make_pristine() -> Pristine {
    let tmp = scratch();
    let root = tmp.path().to_path_buf();
    let mut models = vec![];
    for v in MODELS {
        let d = root.join(format!("model-{v}"));
        std::fs::create_dir_all(&d).unwrap();
        for f in [CONFIG_FILE, WEIGHTS_FILE] {
            std::fs::copy(fixture(v).join(f), d.join(f)).unwrap();
        }
        models.push(d);
    }
    // A dataset of many small documents, through the library's own `data prepare`, with small
    // shards so the manifest lists several.
    let text_dir = root.join("text");
    std::fs::create_dir_all(&text_dir).unwrap();
    let words = ["forget", "gate", "attention", "the", "sea", "whale", "Ishmael", "call", "me", "ship", "."];
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    for i in 0..24 {
        let n = rng.gen_range(5..60);
        let doc: Vec<&str> = (0..n).map(|_| words[rng.gen_range(0..words.len())]).collect();
        std::fs::write(text_dir.join(format!("doc{i}.txt")), doc.join(" ")).unwrap();
    }
    let data = root.join("data");
    let opts =
        PrepareOptions { text_format: TextFormat::Plain, val_fraction: 0.25, shard_tokens: 200, ..Default::default() };
    prepare(&[text_dir], &data, &opts).unwrap();
    // A tiny checkpoint, through the library: a fixture's architecture, initialised, 3 steps in.
    let model_cfg = Config::load(&fixture("fox_llama").join(CONFIG_FILE)).unwrap();
    let train = TrainConfig {
        context: 16,
        batch_size: 2,
        micro_batch: 1,
        total_tokens: 10 * 32,
        peak_lr: 1e-3,
        min_lr: 0.0,
        warmup_tokens: 32,
        weight_decay: 0.1,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        max_grad_norm: 1.0,
        seed: 5,
        eval_every: 0,
        eval_tokens: 64,
        checkpoint_every: 0,
        keep_last: 1,
        log_every: 1,
    };
    let run = RunConfig { model: model_cfg.clone(), train: train.clone() };
    let model = init_model(&model_cfg, 1);
    let mut opt = AdamW::new(train.adamw(), &model.params);
    opt.step = 3;
    let state = TrainerState {
        step: 3,
        tokens_seen: 3 * train.tokens_per_step(),
        data: foxlm::data::LoaderState { seed: 5, epoch: 0, index: 3 },
        config_hash: "0".repeat(64),
        run,
        data_dir: data.display().to_string(),
        elapsed_s: 1.5,
        last_val_loss: Some(6.0),
        finished: false,
        init_from: None,
    };
    let checkpoint = save_checkpoint(&root.join("run"), "checkpoint-3", &model, &opt, &state).unwrap();
    load_checkpoint(&checkpoint).expect("the pristine checkpoint loads");
    Pristine { _tmp: tmp, root, models, data, checkpoint }
}

/// A fresh copy of folder `src` in `dst`, as hard links (cases replace, never modify, files).
fn link_copy(src: &Path, dst: &Path) {
    if dst.exists() {
        std::fs::remove_dir_all(dst).unwrap();
    }
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        if e.path().is_file() {
            std::fs::hard_link(e.path(), dst.join(e.file_name())).unwrap();
        }
    }
}

/// Replaces `path` (maybe a hard link to a pristine file) with `bytes`.
fn replace(path: &Path, bytes: &[u8]) {
    let _ = std::fs::remove_file(path);
    std::fs::write(path, bytes).unwrap();
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------------------------------------
// Mutations.

/// A value to put where a config or state field was: sizes at the edges of every integer type,
/// floats out of range, wrong types.
fn wild_value(rng: &mut ChaCha8Rng, old: &Value) -> Value {
    match rng.gen_range(0..16) {
        0 => json!(0),
        1 => json!(-1),
        2 => json!(1u64 << 31),
        3 => json!(1u64 << 32),
        4 => json!(i64::MAX),
        5 => json!(u64::MAX),
        6 => json!(1e300),
        7 => json!(-1e-300),
        8 => json!(rng.gen_range(0..100_000)),
        9 => Value::Null,
        10 => json!(rng.gen_bool(0.5)),
        11 => json!(["full", "fixed", "none", "bias_only", "", "swish", "u16", "u32"][rng.gen_range(0..8)]),
        12 => json!([1, 2]),
        13 => json!({"a": 1}),
        // Near the old value: the mutations most likely to pass the checks.
        _ => match old {
            Value::Number(n) if n.is_u64() => {
                let v = n.as_u64().unwrap_or(0);
                json!(
                    [v.wrapping_mul(2), v + 1, v.saturating_sub(1), v / 2, v.wrapping_mul(1 << 20)]
                        [rng.gen_range(0..5)]
                )
            }
            Value::Number(n) => {
                let v = n.as_f64().unwrap_or(0.0);
                json!([v * 2.0, -v, v + 1.0, v / 1e6, v * 1e30][rng.gen_range(0..5)])
            }
            Value::Bool(b) => json!(!b),
            Value::String(s) => json!(format!("{s}x")),
            _ => json!(1),
        },
    }
}

/// Mutates one field of a JSON object tree (depth-first random path): replace, delete or add.
fn mutate_json_field(rng: &mut ChaCha8Rng, v: &mut Value, path: &mut String) {
    let children: Vec<String> = match v {
        Value::Object(m) => m.keys().cloned().collect(),
        Value::Array(a) => (0..a.len()).map(|i| i.to_string()).collect(),
        _ => vec![],
    };
    if children.is_empty() {
        *v = wild_value(rng, v);
        path.push_str(&format!(" = {v}"));
        return;
    }
    let k = children[rng.gen_range(0..children.len())].clone();
    path.push_str(&format!(".{k}"));
    let child = match v {
        Value::Object(m) => {
            if rng.gen_bool(0.06) {
                m.remove(&k);
                path.push_str(" deleted");
                return;
            }
            m.get_mut(&k)
        }
        Value::Array(a) => a.get_mut(k.parse::<usize>().unwrap_or(0)),
        _ => None,
    };
    if let Some(c) = child {
        // Descend into containers most of the time; sometimes replace them whole.
        if (c.is_object() || c.is_array()) && rng.gen_bool(0.9) {
            mutate_json_field(rng, c, path);
        } else {
            *c = wild_value(rng, c);
            path.push_str(&format!(" = {c}"));
        }
    }
}

/// Byte-level damage: flip, set, insert, delete bytes, or truncate.
/// A JSON file's bytes, mutated: with probability `p_fields` its parsed fields by `edit`, else its
/// bytes (half-written, or damaged).
fn mutated_json_file(
    rng: &mut ChaCha8Rng,
    path: &Path,
    p_fields: f64,
    desc: &mut String,
    edit: impl FnOnce(&mut ChaCha8Rng, &mut Value, &mut String),
) -> Vec<u8> {
    let mut bytes = std::fs::read(path).unwrap();
    if rng.gen_bool(p_fields) {
        let mut v: Value = serde_json::from_slice(&bytes).unwrap();
        edit(rng, &mut v, desc);
        serde_json::to_vec_pretty(&v).unwrap()
    } else {
        desc.push_str(" bytes: ");
        let len = bytes.len();
        mutate_bytes(rng, &mut bytes, 0..len, desc);
        bytes
    }
}

fn mutate_bytes(rng: &mut ChaCha8Rng, b: &mut Vec<u8>, range: std::ops::Range<usize>, desc: &mut String) {
    let range = range.start.min(b.len())..range.end.min(b.len());
    let pick = |rng: &mut ChaCha8Rng| if range.is_empty() { range.start } else { rng.gen_range(range.clone()) };
    match rng.gen_range(0..5) {
        0 => {
            let i = pick(rng);
            if i < b.len() {
                let bit = rng.gen_range(0..8);
                b[i] ^= 1 << bit;
                desc.push_str(&format!("flip bit {bit} of byte {i}"));
            }
        }
        1 => {
            let i = pick(rng);
            if i < b.len() {
                let v = [0u8, 0xff, b'"', b'9', b'[', b'}', b'-', 0x80][rng.gen_range(0..8)];
                b[i] = v;
                desc.push_str(&format!("byte {i} = {v:#x}"));
            }
        }
        2 => {
            let i = pick(rng);
            let v = [b'9', b'0', b',', b'"', 0xc3][rng.gen_range(0..5)];
            b.insert(i.min(b.len()), v);
            desc.push_str(&format!("insert {v:#x} at {i}"));
        }
        3 => {
            let i = pick(rng);
            if i < b.len() {
                b.remove(i);
                desc.push_str(&format!("delete byte {i}"));
            }
        }
        _ => {
            let i = pick(rng);
            b.truncate(i);
            desc.push_str(&format!("truncate to {i} bytes"));
        }
    }
}

/// Changes one tensor of a safetensors file and rewrites the file consistently (offsets and data
/// follow), so the damage gets past the format's own checks to foxlm's: a shape, a dtype, a
/// tensor removed or added.
fn rewrite_consistent(rng: &mut ChaCha8Rng, bytes: &mut Vec<u8>, desc: &mut String) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut tensors: Vec<(String, Value)> = header.into_iter().filter(|(k, _)| k != "__metadata__").collect();
    tensors.sort_by_key(|(_, t)| t["data_offsets"][0].as_u64());
    let i = rng.gen_range(0..tensors.len());
    let name = tensors[i].0.clone();
    desc.push_str(&format!("rewritten: {name}"));
    match rng.gen_range(0..4) {
        0 => {
            let shape = tensors[i].1["shape"].as_array_mut().unwrap();
            let d = rng.gen_range(0..shape.len());
            let old = shape[d].as_u64().unwrap_or(1);
            let new = [0, 1, 3, old + 1, old.saturating_sub(1), old * 2][rng.gen_range(0..6)];
            shape[d] = json!(new);
            desc.push_str(&format!(".shape[{d}] = {new}"));
        }
        1 => {
            let dt = ["F16", "BF16", "F64", "I64", "U8", "I32", "F32", "BOOL"][rng.gen_range(0..8)];
            tensors[i].1["dtype"] = json!(dt);
            desc.push_str(&format!(".dtype = {dt}"));
        }
        2 => {
            tensors.remove(i);
            desc.push_str(" removed");
        }
        _ => {
            let t = tensors[i].1.clone();
            let new = if rng.gen_bool(0.5) { format!("{name}.extra") } else { name.replace("layers.1", "layers.2") };
            desc.push_str(&format!(" copied as {new}"));
            tensors.push((new, t));
        }
    }
    let width = |d: &str| match d {
        "F64" | "I64" => 8,
        "F32" | "I32" => 4,
        "F16" | "BF16" => 2,
        _ => 1,
    };
    let (mut out_header, mut out_data) = (serde_json::Map::new(), Vec::new());
    for (name, mut t) in tensors {
        let old =
            t["data_offsets"][0].as_u64().unwrap_or(0) as usize..t["data_offsets"][1].as_u64().unwrap_or(0) as usize;
        let numel: u64 = t["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap_or(1)).product();
        let size = numel as usize * width(t["dtype"].as_str().unwrap_or(""));
        let start = out_data.len();
        let src = data.get(old).unwrap_or(&[]);
        out_data.extend_from_slice(&src[..size.min(src.len())]);
        out_data.resize(start + size, 0);
        t["data_offsets"] = json!([start, start + size]);
        // A name that already exists (a copy onto an existing tensor) replaces it.
        out_header.insert(name, t);
    }
    let h = serde_json::to_vec(&Value::Object(out_header)).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&out_data);
    *bytes = out;
}

/// Damages a safetensors file's header: a field of its JSON (shape, dtype, offsets, name), its
/// length field, or its bytes; or the file's length; or one tensor, rewritten consistently.
fn mutate_safetensors(rng: &mut ChaCha8Rng, bytes: &mut Vec<u8>, desc: &mut String) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    if rng.gen_bool(0.35) {
        return rewrite_consistent(rng, bytes, desc);
    }
    match rng.gen_range(0..10) {
        0..=4 => {
            let mut header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
            let names: Vec<String> =
                header.as_object().unwrap().keys().filter(|k| *k != "__metadata__").cloned().collect();
            let name = names[rng.gen_range(0..names.len())].clone();
            let t = &mut header[&name];
            desc.push_str(&format!("header {name}"));
            match rng.gen_range(0..7) {
                0 | 1 => {
                    let shape = t["shape"].as_array_mut().unwrap();
                    if !shape.is_empty() && rng.gen_bool(0.8) {
                        let i = rng.gen_range(0..shape.len());
                        let old = shape[i].as_u64().unwrap_or(1);
                        let new = [0, 1, old * 2, old + 1, 1 << 31, 1 << 40, u64::MAX / 4][rng.gen_range(0..7)];
                        shape[i] = json!(new);
                        desc.push_str(&format!(".shape[{i}] = {new}"));
                    } else {
                        shape.push(json!(1));
                        desc.push_str(".shape += [1]");
                    }
                }
                2 => {
                    let d = ["F16", "BF16", "F64", "I64", "U8", "BOOL", "F8_E4M3", "X"][rng.gen_range(0..8)];
                    t["dtype"] = json!(d);
                    desc.push_str(&format!(".dtype = {d}"));
                }
                3 => {
                    let i = rng.gen_range(0..2);
                    let old = t["data_offsets"][i].as_u64().unwrap_or(0);
                    let new = [0, old + 4, old.saturating_sub(4), 1 << 40, u64::MAX][rng.gen_range(0..5)];
                    t["data_offsets"][i] = json!(new);
                    desc.push_str(&format!(".data_offsets[{i}] = {new}"));
                }
                4 => {
                    let obj = header.as_object_mut().unwrap();
                    let v = obj.remove(&name).unwrap();
                    let new = if rng.gen_bool(0.5) { format!("{name}x") } else { name.replace("layers.0", "layers.9") };
                    obj.insert(new.clone(), v);
                    desc.push_str(&format!(" renamed {new}"));
                }
                5 => {
                    header.as_object_mut().unwrap().remove(&name);
                    desc.push_str(" removed");
                }
                _ => {
                    let mut p = String::new();
                    mutate_json_field(rng, t, &mut p);
                    desc.push_str(&p);
                }
            }
            let h = serde_json::to_vec(&header).unwrap();
            let mut out = (h.len() as u64).to_le_bytes().to_vec();
            out.extend_from_slice(&h);
            out.extend_from_slice(&bytes[8 + n..]);
            *bytes = out;
        }
        5 => {
            let new = [0u64, 1, n as u64 + 1, n as u64 - 1, 1 << 40, u64::MAX, bytes.len() as u64][rng.gen_range(0..7)];
            bytes[..8].copy_from_slice(&new.to_le_bytes());
            desc.push_str(&format!("header length field = {new}"));
        }
        6..=7 => {
            desc.push_str("header bytes: ");
            mutate_bytes(rng, bytes, 8..8 + n, desc);
        }
        _ => {
            desc.push_str("file: ");
            let len = bytes.len();
            mutate_bytes(rng, bytes, 0..len, desc);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Cases.

/// What a loaded model is used for in a case, as `inspect` and a 2-token `generate` would.
fn exercise_model(model: &foxlm::model::Model) {
    let _ = foxlm::cli::inspect::report(model, 64, 1);
    let v = model.config.vocab_size as u32;
    let ids = [model.config.bos_token_id.unwrap_or(0) % v, 1 % v];
    let logits = model.forward(&ids, &Ctx { batch: 1, seq: 2, start: None });
    assert_eq!(logits.len(), 2 * v as usize);
    let opts = GenerateOptions {
        max_new_tokens: 2,
        sampling: Sampling { temperature: 0.0, top_k: 0, top_p: 1.0 },
        seed: 0,
        eos: None,
    };
    let out = generate(model, &[ids.to_vec()], &opts, |_, _| {});
    assert!(out[0].len() == 2 && out[0].iter().all(|&t| t < v), "generated {:?}", out[0]);
}

/// Runs case `seed`: builds its damaged input under `work`, loads it, and returns what was done.
/// Ok(description) whether the loader succeeded or failed with a message; an empty error
/// message is returned as Err.
fn run_case(p: &Pristine, seed: u64, desc_out: &Mutex<String>) -> Result<String, String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let work = p.root.join("case");
    let mut desc = String::new();
    *desc_out.lock().unwrap() = "(while building the case)".into();
    let set_desc = |d: &str| {
        *desc_out.lock().unwrap() = d.to_string();
        let mut t = CASE_TEXT.lock().unwrap();
        let n = d.len().min(t.0.len());
        t.0[..n].copy_from_slice(&d.as_bytes()[..n]);
        t.1 = n;
    };
    let outcome: anyhow::Result<()> = match rng.gen_range(0..10) {
        // config.json: one field (or its bytes).
        0..=2 => {
            let m = rng.gen_range(0..p.models.len());
            link_copy(&p.models[m], &work);
            let path = work.join(CONFIG_FILE);
            desc.push_str(&format!("{} config.json", MODELS[m]));
            let bytes = mutated_json_file(&mut rng, &path, 0.85, &mut desc, |rng, v, desc| {
                if rng.gen_bool(0.1) {
                    // Fields the fixtures leave out or null.
                    let k = ["intermediate_size", "num_kv_heads", "decay_time_min", "decay_time_max", "window_size"]
                        [rng.gen_range(0..5)];
                    let val = wild_value(rng, &Value::Null);
                    desc.push_str(&format!(".{k} = {val}"));
                    v[k] = val;
                } else {
                    mutate_json_field(rng, v, desc);
                }
            });
            set_desc(&desc);
            replace(&path, &bytes);
            load_model(&work).map(|m| exercise_model(&m))
        }
        // model.safetensors: its header.
        3..=5 => {
            let m = rng.gen_range(0..p.models.len());
            link_copy(&p.models[m], &work);
            let path = work.join(WEIGHTS_FILE);
            let mut bytes = std::fs::read(&path).unwrap();
            desc.push_str(&format!("{} model.safetensors ", MODELS[m]));
            mutate_safetensors(&mut rng, &mut bytes, &mut desc);
            set_desc(&desc);
            replace(&path, &bytes);
            load_model(&work).map(|m| exercise_model(&m))
        }
        // The dataset: its manifest, or a shard's bytes (with the checksum fixed up half the
        // time, so the checks behind the checksum are reached too).
        6..=7 => {
            link_copy(&p.data, &work);
            if rng.gen_bool(0.5) {
                let path = work.join(MANIFEST_FILE);
                let mut v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
                desc.push_str("manifest.json");
                if rng.gen_bool(0.15) {
                    let split = ["train", "val"][rng.gen_range(0..2)];
                    let f = ["tokens_file", "index_file"][rng.gen_range(0..2)];
                    let to = ["../data/train-00000.tokens", "/etc/passwd", "", ".", "sub/../../x"][rng.gen_range(0..5)];
                    desc.push_str(&format!(".{split}.shards.0.{f} = {to:?}"));
                    v[split]["shards"][0][f] = json!(to);
                } else {
                    mutate_json_field(&mut rng, &mut v, &mut desc);
                }
                replace(&path, &serde_json::to_vec_pretty(&v).unwrap());
            } else {
                let mpath = work.join(MANIFEST_FILE);
                let mut manifest: Value = serde_json::from_slice(&std::fs::read(&mpath).unwrap()).unwrap();
                let split = ["train", "val"][rng.gen_range(0..2)];
                let shards = manifest[split]["shards"].as_array().map_or(0, |a| a.len());
                let si = rng.gen_range(0..shards.max(1));
                let (key, sha_key) =
                    if rng.gen_bool(0.5) { ("tokens_file", "tokens_sha256") } else { ("index_file", "index_sha256") };
                let name = manifest[split]["shards"][si][key].as_str().unwrap_or("train-00000.tokens").to_string();
                let path = work.join(&name);
                let mut bytes = std::fs::read(&path).unwrap_or_default();
                desc.push_str(&format!("{name}: "));
                if key == "tokens_file" && rng.gen_bool(0.3) && bytes.len() >= 2 {
                    // A token id outside the vocabulary.
                    let i = rng.gen_range(0..bytes.len() / 2) * 2;
                    let id = rng.gen_range(50257u16..=u16::MAX);
                    bytes[i..i + 2].copy_from_slice(&id.to_le_bytes());
                    desc.push_str(&format!("token {} = {id}", i / 2));
                } else if key == "index_file" && rng.gen_bool(0.3) && bytes.len() >= 8 {
                    let i = rng.gen_range(0..bytes.len() / 8) * 8;
                    let v = [0u64, 1, u64::MAX, 1 << 40, 3][rng.gen_range(0..5)];
                    bytes[i..i + 8].copy_from_slice(&v.to_le_bytes());
                    desc.push_str(&format!("offset {} = {v}", i / 8));
                } else {
                    let len = bytes.len();
                    mutate_bytes(&mut rng, &mut bytes, 0..len, &mut desc);
                }
                if rng.gen_bool(0.5) {
                    desc.push_str(" (checksum updated)");
                    manifest[split]["shards"][si][sha_key] = json!(sha256_hex(&bytes));
                    replace(&mpath, &serde_json::to_vec_pretty(&manifest).unwrap());
                }
                replace(&path, &bytes);
            }
            set_desc(&desc);
            Dataset::open(&work).and_then(|ds| {
                let mut loader = Loader::new(&ds, Split::Train, 8, 1, true)?;
                let b = loader.next_batch(2);
                assert!(b.ids.iter().all(|&t| (t as usize) < ds.manifest().vocab_size));
                if let Ok(seqs) = foxlm::eval::loss::validation_sequences(&ds, 4, 2, foxlm::eval::loss::Windows::Packed)
                {
                    assert!(seqs.iter().all(|s| s.len() == 4));
                }
                Ok(())
            })
        }
        // A checkpoint: trainer.json's fields or bytes, or optimizer.safetensors' header.
        _ => {
            link_copy(&p.checkpoint, &work);
            if rng.gen_bool(0.75) {
                let path = work.join(TRAINER_FILE);
                desc.push_str("trainer.json");
                let bytes = mutated_json_file(&mut rng, &path, 0.8, &mut desc, mutate_json_field);
                replace(&path, &bytes);
            } else {
                let path = work.join(OPTIMIZER_FILE);
                let mut bytes = std::fs::read(&path).unwrap();
                desc.push_str("optimizer.safetensors ");
                mutate_safetensors(&mut rng, &mut bytes, &mut desc);
                replace(&path, &bytes);
            }
            set_desc(&desc);
            load_checkpoint(&work).and_then(|ck| {
                // Resume as the trainer would: the data loader at the saved position.
                let ds = Dataset::open(&p.data)?;
                let mut loader = Loader::new(&ds, Split::Train, ck.state.run.train.context, ck.state.data.seed, true)?;
                loader.set_state(ck.state.data);
                let b = loader.next_batch(1);
                assert_eq!(b.ids.len(), ck.state.run.train.context);
                Ok(())
            })
        }
    };
    match outcome {
        Ok(()) => Ok(format!("{desc} -> Ok")),
        Err(e) => {
            let msg = format!("{e:#}");
            if msg.trim().is_empty() {
                Err(format!("{desc} -> an error without a message"))
            } else {
                Ok(format!("{desc} -> {msg}"))
            }
        }
    }
}

/// A failed case: its seed, mutation and what went wrong.
#[derive(Debug)]
struct Failure {
    seed: u64,
    what: String,
}

/// Runs `cases` cases with seeds `first_seed..`, in a worker thread watched for hangs. Returns
/// the failures, the number of cases that loaded successfully, and the time taken.
fn run_cases(first_seed: u64, cases: u64, verbose: bool) -> (Vec<Failure>, u64, Duration) {
    const CASE_TIMEOUT: Duration = Duration::from_secs(60);
    let pristine = make_pristine();
    // Panics are reported per case below, with where they happened.
    std::panic::set_hook(Box::new(|info| {
        if let Ok(mut p) = LAST_PANIC.lock() {
            *p = info.to_string();
        }
    }));
    let current = std::sync::Arc::new(Mutex::new(String::new()));
    let (tx, rx) = mpsc::channel::<(u64, Result<Result<String, String>, String>)>();
    let cur = current.clone();
    let t0 = Instant::now();
    let worker = std::thread::spawn(move || {
        for seed in first_seed..first_seed + cases {
            CASE_SEED.store(seed, Ordering::SeqCst);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_case(&pristine, seed, &cur)));
            let r = r.map_err(|_| LAST_PANIC.lock().map(|p| p.clone()).unwrap_or_default());
            if tx.send((seed, r)).is_err() {
                return;
            }
        }
    });
    let (mut failures, mut ok, mut done) = (vec![], 0u64, 0u64);
    while done < cases {
        match rx.recv_timeout(CASE_TIMEOUT) {
            Ok((seed, r)) => {
                done += 1;
                match r {
                    Ok(Ok(d)) => {
                        ok += d.ends_with("-> Ok") as u64;
                        if verbose {
                            eprintln!("{seed}: {d}");
                        }
                    }
                    Ok(Err(what)) => failures.push(Failure { seed, what }),
                    Err(panic) => failures.push(Failure {
                        seed,
                        what: format!("{} -> PANIC: {panic}", current.lock().map(|c| c.clone()).unwrap_or_default()),
                    }),
                }
                if let Some(f) = failures.last().filter(|f| f.seed == seed) {
                    eprintln!("FAILURE seed {}: {}", f.seed, f.what);
                }
                if done % 100_000 == 0 {
                    eprintln!(
                        "{done} cases, {:.0}/s, {} failures, largest allocation {} bytes",
                        done as f64 / t0.elapsed().as_secs_f64(),
                        failures.len(),
                        LARGEST.load(Ordering::Relaxed)
                    );
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let seed = first_seed + done;
                let what = current.lock().map(|c| c.clone()).unwrap_or_default();
                failures.push(Failure { seed, what: format!("{what} -> HANG: no result after {CASE_TIMEOUT:?}") });
                return (failures, ok, t0.elapsed());
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    let _ = worker.join();
    let _ = std::panic::take_hook();
    (failures, ok, t0.elapsed())
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.replace('_', "").parse().ok()).unwrap_or(default)
}

fn report(cases: u64, ok: u64, failures: &[Failure], took: Duration) -> String {
    let mut s = format!(
        "{cases} cases in {:.1} s ({:.0} cases/s): {ok} loaded, {} errors with a message, {} failures; largest single \
         allocation {} bytes (bound {ALLOC_BOUND})",
        took.as_secs_f64(),
        cases as f64 / took.as_secs_f64(),
        cases - ok - failures.len() as u64,
        failures.len(),
        LARGEST.load(Ordering::Relaxed),
    );
    for f in failures.iter().take(20) {
        s += &format!("\n  seed {}: {}", f.seed, f.what);
    }
    s
}

/// The CI run: a few thousand cases (FOXLM_FUZZ_CASES), seeded (FOXLM_FUZZ_SEED), no failures.
#[test]
fn fuzz_inputs() {
    let cases = env_u64("FOXLM_FUZZ_CASES", 3000);
    let seed = env_u64("FOXLM_FUZZ_SEED", 0);
    let (failures, ok, took) = run_cases(seed, cases, std::env::var_os("FOXLM_FUZZ_VERBOSE").is_some());
    let r = report(cases, ok, &failures, took);
    eprintln!("{r}");
    assert!(failures.is_empty(), "{r}");
    // The mutator must reach both outcomes, or it tests nothing.
    assert!(ok > 0 && ok < cases, "{r}");
}

/// The long run (bench/fuzz_inputs.sh): FOXLM_FUZZ_CASES cases, default 1,000,000.
#[test]
#[ignore]
fn fuzz_inputs_long() {
    let cases = env_u64("FOXLM_FUZZ_CASES", 1_000_000);
    let seed = env_u64("FOXLM_FUZZ_SEED", 1_000_000_000);
    let (failures, ok, took) = run_cases(seed, cases, false);
    let r = report(cases, ok, &failures, took);
    println!("{r}");
    assert!(failures.is_empty(), "{r}");
}
