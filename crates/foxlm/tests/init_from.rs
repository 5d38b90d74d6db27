//! Fine-tuning from weights (`foxlm train --init-from`): a model folder in the authors' layout
//! really is the run's starting point (the first step's loss is that model's loss on the first
//! batch), shape-keeping changes are printed, and shape-changing ones, mismatched tensors and
//! `--resume` with `--init-from` are errors that name what is at fault.

mod common;

use common::fixture;
use foxlm::checkpoint::load_model;
use foxlm::data::{prepare, Dataset, Loader, PrepareOptions, Split};
use foxlm::presets;
use foxlm::tokenizer::{TextFormat, GPT2_VOCAB};
use foxlm::train::{init_model, read_metrics, sum_loss, train, Outcome, RunConfig, TrainOptions};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_foxlm");

fn moby_dick(dir: &Path) -> PathBuf {
    let out = dir.join("md");
    let sample = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/sample/moby-dick");
    let o = PrepareOptions { text_format: TextFormat::JsonEscaped, val_fraction: 0.05, ..Default::default() };
    prepare(&[sample], &out, &o).unwrap();
    out
}

/// The authors' FoX (Pro) fixture (d = 128, 2 layers, 4 heads, their config.json with all its
/// keys) with its embedding and output head widened from 512 to GPT-2's 50257 rows so that it
/// reads Moby-Dick's tokens (the extra rows are small fixed values), written in bf16: a model
/// folder in the released checkpoints' layout.
fn widened_fox_pro(dir: &Path) -> PathBuf {
    let src = fixture("fox_pro");
    let out = dir.join("fox-pro-gpt2");
    std::fs::create_dir_all(&out).unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["transformers_version"].as_str(), Some("5.17.0"), "the authors' config.json");
    cfg["vocab_size"] = GPT2_VOCAB.into();
    std::fs::write(out.join("config.json"), serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = vec![];
    for (name, view) in st.tensors() {
        assert_eq!(view.dtype(), safetensors::Dtype::F32);
        let mut vals: Vec<f32> =
            view.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        let mut shape = view.shape().to_vec();
        if name == "model.embeddings.weight" || name == "lm_head.weight" {
            assert_eq!(shape[0], 512);
            let d = shape[1];
            vals.extend((512 * d..GPT2_VOCAB * d).map(|i| 0.02 * ((i as f32) * 0.7).sin()));
            shape[0] = GPT2_VOCAB;
        }
        let b: Vec<u8> = vals.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect();
        tensors.push((name, shape, b));
    }
    write_safetensors(&out.join("model.safetensors"), &tensors);
    out
}

fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(n, s, b)| {
            (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, s.clone(), b).unwrap())
        })
        .collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    std::fs::write(path, safetensors::serialize(views, Some(meta)).unwrap()).unwrap();
}

fn opts(data: &Path, out: &Path, init: Option<&Path>) -> TrainOptions {
    TrainOptions {
        init_from: init.map(Path::to_path_buf),
        ..TrainOptions::new(data, out, foxlm::backend::DeviceArg::Cpu)
    }
}

fn err_of<T>(r: anyhow::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

/// A new recipe for the model: context 32, 4 windows a step in two micro-batches, 3 steps.
fn recipe(model: foxlm::config::Config) -> RunConfig {
    let mut train = presets::tiny().train;
    (train.context, train.batch_size, train.micro_batch) = (32, 4, 2);
    train.total_tokens = 3 * 4 * 32;
    train.warmup_tokens = 4 * 32;
    (train.eval_every, train.eval_tokens, train.checkpoint_every, train.log_every) = (0, 64, 0, 1);
    RunConfig { model, train }
}

#[test]
fn the_first_step_sees_the_folders_weights_and_the_run_starts_afresh() {
    let tmp = tempfile::tempdir().unwrap();
    let data = moby_dick(tmp.path());
    let src = widened_fox_pro(tmp.path());
    let source = foxlm::init_from::read_source(&src).unwrap();
    let mut run = recipe(source.config.clone());
    run.model.log_pruning_tolerance = Some(-10.0); // ACP: keeps every shape
    let out = tmp.path().join("ft");
    let r = train(Some(run.clone()), &opts(&data, &out, Some(&src))).unwrap();
    assert_eq!((r.outcome, r.step, r.tokens_seen), (Outcome::Finished, 3, 3 * 4 * 32));
    assert_eq!(r.init_changes, ["log_pruning_tolerance: null -> -10.0"]);

    // The loss of the folder's model on the first batch the loader gives, computed directly.
    let ds = Dataset::open(&data).unwrap();
    let mut loader = Loader::new(&ds, Split::Train, 32, run.train.seed, true).unwrap();
    let b = loader.next_batch(4);
    let model = load_model(&src).unwrap();
    let (sum, n) = sum_loss(&model, &b.ids, &b.targets, 4, 32).unwrap();
    let want = sum / n as f64;
    let first = read_metrics(&out).into_iter().find(|m| m.kind == "train").unwrap();
    assert_eq!(first.step, 1);
    let got = first.loss.unwrap();
    // f32 sums in another order (two micro-batches, the training forward): 1e-5 relative.
    assert!((got - want).abs() < 1e-5 * want, "first step's loss {got} vs the model's {want}");
    // A randomly initialised model would have had another loss.
    let fresh = init_model(&run.model, run.train.seed);
    let (s0, n0) = sum_loss(&fresh, &b.ids, &b.targets, 4, 32).unwrap();
    assert!((s0 / n0 as f64 - want).abs() > 0.01, "{} vs {want}", s0 / n0 as f64);

    // A new run: its own step counter and optimizer, the source recorded, the change saved.
    let tj: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("final/trainer.json")).unwrap()).unwrap();
    assert_eq!(tj["optimizer_step"].as_u64(), Some(3));
    assert_eq!(tj["trainer"]["step"].as_u64(), Some(3));
    assert_eq!(tj["trainer"]["init_from"].as_str(), Some(src.to_str().unwrap()));
    let saved = foxlm::config::Config::load(&out.join("final/config.json")).unwrap();
    assert_eq!(saved.log_pruning_tolerance, Some(-10.0));
    assert_eq!(saved.train_context(), Some(32));

    // A foxlm run folder is a source too: its latest checkpoint, its recipe.
    let again = foxlm::init_from::read_source(&out).unwrap();
    assert_eq!(again.dir, out.join("final"));
    assert_eq!(again.recipe.as_ref(), Some(&run.train));
}

#[test]
fn mismatched_weights_shape_changes_and_resume_are_errors_naming_them() {
    let tmp = tempfile::tempdir().unwrap();
    let data = moby_dick(tmp.path());
    let src = widened_fox_pro(tmp.path());
    let cfg = foxlm::init_from::read_source(&src).unwrap().config;

    // A shape-changing architecture: refused before any weight is read, naming the field.
    let mut kv = recipe(cfg.clone());
    kv.model.num_kv_heads = Some(2);
    let e = err_of(train(Some(kv), &opts(&data, &tmp.path().join("o1"), Some(&src))));
    assert!(e.contains("--init-from") && e.contains("num_kv_heads: null -> 2 would change the parameters"), "{e}");
    assert!(e.contains("model.layers.0.attn.k_proj.linear.weight would be [64, 128]"), "{e}");

    // A config.json that disagrees with its weights names the tensor and the file.
    let bad = tmp.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::copy(src.join("model.safetensors"), bad.join("model.safetensors")).unwrap();
    let text = std::fs::read_to_string(src.join("config.json")).unwrap();
    std::fs::write(bad.join("config.json"), text.replace("\"num_heads\": 4", "\"num_heads\": 8")).unwrap();
    let mut r = recipe(cfg.clone());
    r.model.num_heads = 8;
    let e = err_of(train(Some(r), &opts(&data, &tmp.path().join("o2"), Some(&bad))));
    assert!(
        e.contains("model.safetensors: tensor model.layers.0.attn.k_proj.shift_proj.weight has shape [4, 128]")
            && e.contains("bad/config.json implies [8, 128]"),
        "{e}"
    );

    // A tensor under another name: the missing one is named.
    let renamed = tmp.path().join("renamed");
    std::fs::create_dir_all(&renamed).unwrap();
    std::fs::copy(src.join("config.json"), renamed.join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            (n.replace("model.norm.weight", "model.final_norm.weight"), v.shape().to_vec(), v.data().to_vec())
        })
        .collect();
    write_safetensors(&renamed.join("model.safetensors"), &tensors);
    let e = err_of(train(Some(recipe(cfg.clone())), &opts(&data, &tmp.path().join("o3"), Some(&renamed))));
    assert!(e.contains("tensor model.norm.weight (shape [128]) is missing"), "{e}");

    // --resume and --init-from together.
    let both = TrainOptions { resume: true, ..opts(&data, &tmp.path().join("o4"), Some(&src)) };
    let e = err_of(train(Some(recipe(cfg.clone())), &both));
    assert!(e.contains("--resume and --init-from together"), "{e}");
    // Not a model folder.
    let e = err_of(train(Some(recipe(cfg)), &opts(&data, &tmp.path().join("o5"), Some(&tmp.path().join("none")))));
    assert!(e.contains("--init-from") && e.contains("none: not a model folder"), "{e}");
}

#[test]
fn the_cli_prints_the_changed_fields_and_refuses_shape_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let data = moby_dick(tmp.path());
    let src = widened_fox_pro(tmp.path());
    let run = |out: &str, extra: &[&str]| {
        let mut args: Vec<String> = ["train", "--device", "cpu", "--preset", "tiny", "--steps", "2", "--context", "32"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(["--batch-size", "2", "--eval-tokens", "64", "--init-from"].map(String::from));
        args.push(src.display().to_string());
        args.extend(["--data".into(), data.display().to_string(), "--out".into()]);
        args.push(tmp.path().join(out).display().to_string());
        args.extend(extra.iter().map(|s| s.to_string()));
        Command::new(BIN).args(&args).output().unwrap()
    };
    let o = run("a", &["--acp", "--sliding-window", "16"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("changed: log_pruning_tolerance: null -> -10.0"), "{err}");
    assert!(err.contains("changed: window_size: null -> 16"), "{err}");
    assert!(err.contains(&format!("initial weights: {}", src.display())), "{err}");
    // The tiny preset is another architecture: said, and only its recipe used.
    assert!(err.contains("note: --preset tiny describes another architecture"), "{err}");
    assert!(err.contains("hidden_size: 128 (model) vs 64 (preset)"), "{err}");
    let saved = foxlm::config::Config::load(&tmp.path().join("a/final/config.json")).unwrap();
    assert_eq!((saved.hidden_size, saved.window_size, saved.log_pruning_tolerance), (128, Some(16), Some(-10.0)));

    let o = run("b", &["--num-kv-heads", "2"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("num_kv_heads: null -> 2 would change the parameters"), "{err}");
    assert!(!tmp.path().join("b/final").exists());

    let o = run("c", &["--resume"]);
    assert_eq!(o.status.code(), Some(2), "a usage error");
    assert!(String::from_utf8_lossy(&o.stderr).contains("--init-from"));

    // An authors' folder has no recipe of its own: asked for.
    let o = Command::new(BIN)
        .args(["train", "--device", "cpu", "--init-from"])
        .arg(&src)
        .args(["--data"])
        .arg(&data)
        .args(["--out"])
        .arg(tmp.path().join("d"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("holds no training recipe") && err.contains("--preset"), "{err}");
}
