//! Issue 13's named cases beyond config.json and model headers (those are unit tests in
//! config/ and checkpoint.rs): data manifests and shards, trainer and optimizer state on
//! resume, `forward`'s input, text that is not UTF-8, and evaluation options that cannot work.
//! Each asserts the error names the file or option and the values at fault.

mod common;

use common::{err, fixture};
use foxlm::data::{prepare, Dataset, PrepareOptions, MANIFEST_FILE};
use foxlm::optim::AdamW;
use foxlm::tokenizer::TextFormat;
use foxlm::train::{init_model, load_checkpoint, save_checkpoint, RunConfig, TrainerState, TRAINER_FILE};
use safetensors::Dtype;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_foxlm");

fn foxlm(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let o: Output = Command::new(BIN).args(args).envs(env.iter().copied()).output().expect("run foxlm");
    (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// A small prepared dataset in `dir`/ds.
fn dataset(dir: &Path) -> PathBuf {
    let text = dir.join("text");
    std::fs::create_dir_all(&text).unwrap();
    for i in 0..8 {
        std::fs::write(text.join(format!("{i}.txt")), format!("Call me Ishmael, said document {i}. ").repeat(20))
            .unwrap();
    }
    let out = dir.join("ds");
    let opts = PrepareOptions { text_format: TextFormat::Plain, val_fraction: 0.25, ..Default::default() };
    prepare(&[text], &out, &opts).unwrap();
    out
}

/// Rewrites the JSON file `p` through `edit`.
fn edit_json(p: &Path, edit: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

fn edit_manifest(ds: &Path, edit: impl FnOnce(&mut Value)) {
    edit_json(&ds.join(MANIFEST_FILE), edit)
}

#[test]
fn manifests_and_shards_are_checked() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = dataset(tmp.path());
    let good = std::fs::read(ds.join(MANIFEST_FILE)).unwrap();
    let restore = || std::fs::write(ds.join(MANIFEST_FILE), &good).unwrap();
    let mpath = ds.join(MANIFEST_FILE);

    // A manifest that points outside its folder.
    for bad in ["../outside.tokens", "/etc/passwd"] {
        edit_manifest(&ds, |v| v["train"]["shards"][0]["tokens_file"] = json!(bad));
        let e = err(Dataset::open(&ds));
        assert_eq!(
            e,
            format!(
                "{}: file name {bad:?} points outside {} (only names inside the folder are allowed)",
                mpath.display(),
                ds.display()
            )
        );
        restore();
    }
    // Counts whose byte sizes overflow.
    edit_manifest(&ds, |v| v["train"]["shards"][0]["tokens"] = json!(u64::MAX));
    let e = err(Dataset::open(&ds));
    assert!(e.contains("the manifest says 18446744073709551615 tokens (36893488147419103230 bytes)"), "{e}");
    restore();
    edit_manifest(&ds, |v| v["train"]["shards"][0]["documents"] = json!(u64::MAX));
    let e = err(Dataset::open(&ds));
    assert!(e.contains("the manifest says 18446744073709551615 documents (147573952589676412928 bytes)"), "{e}");
    restore();
    // A vocabulary that is not the tokenizer's.
    edit_manifest(&ds, |v| v["vocab_size"] = json!(1u64 << 40));
    let e = err(Dataset::open(&ds));
    assert_eq!(e, format!("{}: vocab_size is 1099511627776, but the gpt2 tokenizer has 50257 tokens", mpath.display()));
    restore();

    // A token id outside the vocabulary, with the checksum updated to match (so only the id
    // check can catch it).
    let shard = ds.join("train-00000.tokens");
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[10..12].copy_from_slice(&60000u16.to_le_bytes());
    std::fs::write(&shard, &bytes).unwrap();
    edit_manifest(&ds, |v| v["train"]["shards"][0]["tokens_sha256"] = json!(sha256_hex(&bytes)));
    let e = err(Dataset::open(&ds));
    assert_eq!(
        e,
        format!(
            "{}: token 5 has id 60000, outside the vocabulary of 50257 (manifest vocab_size): corrupt shard",
            shard.display()
        )
    );
    // The same damage without the checksum fixed is a checksum mismatch.
    restore();
    let e = err(Dataset::open(&ds));
    assert!(e.starts_with(&format!("{}: checksum mismatch", shard.display())), "{e}");
    // Truncated.
    std::fs::write(&shard, &bytes[..bytes.len() - 1]).unwrap();
    let e = err(Dataset::open(&ds));
    assert!(e.contains("train-00000.tokens") && e.contains("truncated or corrupt"), "{e}");
}

#[test]
fn non_utf8_text_is_an_error_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("latin1.txt");
    std::fs::write(&input, b"caf\xe9 au lait").unwrap();
    let e = err(prepare(std::slice::from_ref(&input), &tmp.path().join("ds"), &PrepareOptions::default()));
    assert_eq!(
        e,
        format!("{}: not UTF-8 text (invalid byte 0xe9 at offset 3); convert it to UTF-8 first", input.display())
    );
    let jsonl = tmp.path().join("docs.jsonl");
    std::fs::write(&jsonl, b"{\"text\": \"fine\"}\n{\"text\": \"caf\xe9\"}\n").unwrap();
    let e = err(prepare(std::slice::from_ref(&jsonl), &tmp.path().join("ds2"), &PrepareOptions::default()));
    assert!(e.starts_with(&format!("{}:2: not UTF-8 text", jsonl.display())), "{e}");
    // viz gates' text.
    let m = fixture("fox_llama");
    let (code, e) = foxlm(
        &["viz", "gates", "--model", m.to_str().unwrap(), "--text", input.to_str().unwrap(), "--fold-vocab"],
        &[],
    );
    assert_eq!(code, 1);
    assert!(e.contains("latin1.txt: not UTF-8 text (invalid byte 0xe9 at offset 3)"), "{e}");
}

/// A tiny checkpoint of fox_llama's architecture, through the library.
fn checkpoint(dir: &Path) -> PathBuf {
    let cfg = foxlm::config::Config::load(&fixture("fox_llama").join("config.json")).unwrap();
    let mut train = foxlm::presets::tiny().train;
    train.context = 16;
    train.batch_size = 2;
    train.micro_batch = 1;
    train.total_tokens = 10 * 32;
    train.warmup_tokens = 32;
    let run = RunConfig { model: cfg.clone(), train: train.clone() };
    let model = init_model(&cfg, 1);
    let mut opt = AdamW::new(train.adamw(), &model.params);
    opt.step = 2;
    let state = TrainerState {
        step: 2,
        tokens_seen: 64,
        data: foxlm::data::LoaderState { seed: train.seed, epoch: 0, index: 2 },
        config_hash: String::new(),
        run,
        data_dir: String::new(),
        elapsed_s: 1.0,
        last_val_loss: None,
        finished: false,
        init_from: None,
    };
    save_checkpoint(dir, "checkpoint-2", &model, &opt, &state).unwrap()
}

fn edit_trainer(ck: &Path, edit: impl FnOnce(&mut Value)) {
    edit_json(&ck.join(TRAINER_FILE), edit)
}

#[test]
fn trainer_and_optimizer_state_are_checked_on_resume() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = checkpoint(tmp.path());
    let tpath = ck.join(TRAINER_FILE);
    let good = std::fs::read(&tpath).unwrap();
    assert_eq!(load_checkpoint(&ck).unwrap().state.step, 2);

    // Another model's state.
    edit_trainer(&ck, |v| v["trainer"]["run"]["model"]["hidden_ratio"] = json!(2.0));
    let e = err(load_checkpoint(&ck));
    assert_eq!(
        e,
        format!(
            "{}: the state belongs to another model than this checkpoint's config.json (hidden_ratio: 2.0 vs 4.0): \
             is it from another run?",
            tpath.display()
        )
    );
    std::fs::write(&tpath, &good).unwrap();
    // Counters that disagree.
    edit_trainer(&ck, |v| v["trainer"]["tokens_seen"] = json!(65));
    let e = err(load_checkpoint(&ck));
    assert_eq!(e, format!("{}: tokens_seen is 65 but step 2 x 32 tokens per step is 64", tpath.display()));
    std::fs::write(&tpath, &good).unwrap();
    edit_trainer(&ck, |v| v["optimizer_step"] = json!(u64::MAX));
    let e = err(load_checkpoint(&ck));
    assert_eq!(e, format!("{}: optimizer_step is 18446744073709551615 but the trainer is at step 2", tpath.display()));
    std::fs::write(&tpath, &good).unwrap();
    // Sizes whose product would overflow.
    edit_trainer(&ck, |v| v["trainer"]["run"]["train"]["context"] = json!(u64::MAX));
    let e = err(load_checkpoint(&ck));
    assert_eq!(
        e,
        format!("{}: run.train.context is 18446744073709551615; expected at most 4294967296", tpath.display())
    );
    std::fs::write(&tpath, &good).unwrap();
    // Half-written.
    std::fs::write(&tpath, &good[..good.len() / 2]).unwrap();
    let e = err(load_checkpoint(&ck));
    assert!(e.starts_with(&format!("{}: corrupt trainer state (half-written or damaged)", tpath.display())), "{e}");
    std::fs::write(&tpath, &good).unwrap();

    // Optimizer moments of the wrong shape.
    let opath = ck.join(foxlm::train::OPTIMIZER_FILE);
    let ts = foxlm::checkpoint::read_tensors(std::slice::from_ref(&opath)).unwrap();
    let bufs: Vec<(String, Vec<usize>, Vec<u8>)> = ts
        .into_iter()
        .map(|(n, (_, mut s, d))| {
            let mut bytes: Vec<u8> = d.iter().flat_map(|x| x.to_le_bytes()).collect();
            if n == "exp_avg.model.norm.weight" {
                s = vec![64];
                bytes.truncate(64 * 4);
            }
            (n, s, bytes)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = bufs
        .iter()
        .map(|(n, s, b)| (n.clone(), safetensors::tensor::TensorView::new(Dtype::F32, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(&opath, safetensors::serialize(views, None).unwrap()).unwrap();
    let e = err(load_checkpoint(&ck));
    assert_eq!(
        e,
        format!(
            "{}: tensor exp_avg.model.norm.weight has shape [64], the model's trainable parameters implies [128]",
            opath.display()
        )
    );
}

fn write_ids(path: &Path, b: usize, t: usize) {
    let bytes: Vec<u8> = (0..b * t).flat_map(|i| ((i % 500) as i64).to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(Dtype::I64, vec![b, t], &bytes).unwrap();
    std::fs::write(path, safetensors::serialize(vec![("input_ids".to_string(), view)], None).unwrap()).unwrap();
}

#[test]
fn forward_input_needing_more_memory_than_there_is_fails_before_allocating() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("ids.safetensors");
    write_ids(&input, 4, 4096);
    let m = fixture("fox_llama");
    let output = tmp.path().join("out.safetensors");
    let args = common::forward_args(&m, &input, &output);
    // 16,384 rows of 512 logits alone are 32 MiB: over a 16 MiB budget, while the model fits.
    let (code, e) = foxlm(&args, &[("FOXLM_MEMORY_LIMIT", "16M")]);
    assert_eq!(code, 1, "{e}");
    assert!(
        e.contains("ids.safetensors: a forward pass over input_ids [4, 4096] need")
            && e.contains("but only 16.0 MiB of memory is available"),
        "{e}"
    );
    assert!(!tmp.path().join("out.safetensors").exists());
}

#[test]
fn generate_inspect_and_eval_options_that_cannot_work() {
    let m = fixture("fox_llama");
    let m = m.to_str().unwrap();
    let (code, e) =
        foxlm(&["generate", "--model", m, "--prompt-ids", "1,2", "--max-new-tokens", "1000000000000000"], &[]);
    assert_eq!(code, 1);
    assert!(e.contains("--max-new-tokens 1000000000000000 after a prompt of 2 tokens (x 1): the KV cache need"), "{e}");
    // inspect with an absurd decode length reports, in u128, instead of overflowing.
    let o =
        Command::new(BIN).args(["inspect", "--model", m, "--decode-tokens", "18446744073709551615"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("32.5 ZiB"), "{}", String::from_utf8_lossy(&o.stdout));

    let tmp = tempfile::tempdir().unwrap();
    let hay = tmp.path().join("hay.txt");
    std::fs::write(&hay, "The sea was calm. The ship sailed on. ".repeat(50)).unwrap();
    let out = tmp.path().join("out");
    let (hay, out) = (hay.to_str().unwrap(), out.to_str().unwrap());
    // A needle longer than the context.
    let (code, e) = foxlm(
        &["eval", "niah", "--model", m, "--haystack", hay, "--lengths", "128,40", "--fold-vocab", "--out", out],
        &[],
    );
    assert_eq!(code, 1);
    assert!(
        e.contains("--lengths 40: too short for the needle (27 tokens) and the question (59 tokens)")
            && e.contains("every length must exceed"),
        "{e}"
    );
    // Context 0, and a context longer than the validation data.
    let ds = dataset(tmp.path());
    let ds = ds.to_str().unwrap();
    let (code, e) = foxlm(&["eval", "loss", "--model", m, "--data", ds, "--context", "0", "--out", out], &[]);
    assert_eq!(code, 1);
    assert!(e.contains("--context must be at least 1"), "{e}");
    let (code, e) =
        foxlm(&["eval", "loss", "--model", m, "--data", ds, "--context", "1000000000", "--pack", "--out", out], &[]);
    assert_eq!(code, 1);
    assert!(e.contains("--context 1000000000 is longer than the validation split of"), "{e}");
    // viz: maps of more pixels than can be drawn.
    let (code, e) = foxlm(
        &["viz", "gates", "--model", m, "--text", hay, "--max-tokens", "100000", "--fold-vocab", "--out", out],
        &[],
    );
    assert_eq!(code, 1);
    assert!(e.contains("--max-tokens is 100000; expected 2 to 8192"), "{e}");
}

/// `foxlm bench train --device cpu`: one timed row of the CPU step against the gemm crate's peak,
/// as JSON; sizes that cannot be planned or do not fit are errors before anything is allocated.
#[test]
fn bench_train_on_the_cpu_measures_steps_and_checks_sizes() {
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("rows.json");
    let j = json.to_str().unwrap();
    let args = ["bench", "train", "--device", "cpu", "--preset", "tiny", "--batch", "2", "--context", "16"];
    let (code, e) = foxlm(&[&args[..], &["--warmup", "1", "--steps", "2", "--json", j]].concat(), &[]);
    assert_eq!(code, 0, "{e}");
    let rows: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let r = &rows[0];
    assert_eq!((r["name"].as_str(), r["batch"].as_u64(), r["context"].as_u64()), (Some("tiny"), Some(2), Some(16)));
    assert_eq!(r["step_s_all"].as_array().map(|a| a.len()), Some(2));
    let (step, tps) = (r["step_s"].as_f64().unwrap(), r["tokens_per_s"].as_f64().unwrap());
    assert!((tps * step - 32.0).abs() < 1e-6, "tokens/s × step = 32 tokens: {tps} × {step}");
    let share = r["share_of_peak"].as_f64().unwrap();
    assert!(share.is_finite() && share > 0.0 && r["gemm_peak_beside_gflops"].as_f64().unwrap() > 0.0, "{r}");
    assert!(e.contains("step 2/2:"), "a line per step: {e}");

    let (code, e) = foxlm(&["bench", "train", "--device", "cpu", "--preset", "tiny", "--context", "0"], &[]);
    assert_eq!(code, 1);
    assert!(e.contains("batch × context must be positive"), "{e}");
    let limit = [("FOXLM_MEMORY_LIMIT", "2000000000")];
    let (code, e) = foxlm(&["bench", "train", "--device", "cpu", "--preset", "fox-pro-760m"], &limit);
    assert_eq!(code, 1);
    assert!(e.contains("the model's parameters, gradients and optimizer state need"), "{e}");
    assert!(e.contains("of memory is available"), "{e}");
    let long = ["bench", "train", "--device", "cpu", "--preset", "tiny", "--batch", "8", "--context", "16384"];
    let (code, e) = foxlm(&long, &limit);
    assert_eq!(code, 1);
    assert!(e.contains("the activations of a 8 x 16384 step need"), "{e}");
    let (code, e) =
        foxlm(&["bench", "train", "--device", "cpu", "--preset", "tiny", "--context", "1099511627776"], &[]);
    assert_eq!(code, 1);
    assert!(e.contains("too large to plan"), "{e}");
}
