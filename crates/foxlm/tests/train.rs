//! Training: it learns (a tiny model beats the unigram entropy on held-out chapters), resuming
//! reproduces the uninterrupted run, checkpoints reload bit-exactly, and every error path of
//! `foxlm train` is a clear message that leaves the last good checkpoint intact.

use foxlm::checkpoint::load_model;
use foxlm::data::{prepare, Dataset, PrepareOptions, Split};
use foxlm::presets::{self, Variant};
use foxlm::tokenizer::TextFormat;
use foxlm::train::{
    self, latest_checkpoint, list_checkpoints, load_checkpoint, read_metrics, train, Outcome, RunConfig, TrainOptions,
};
use std::path::{Path, PathBuf};
use std::process::Command;

fn sample_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/sample/moby-dick")
}

fn moby_dick(dir: &Path) -> PathBuf {
    let out = dir.join("md");
    prepare(
        &[sample_dir()],
        &out,
        &PrepareOptions { text_format: TextFormat::JsonEscaped, val_fraction: 0.05, ..Default::default() },
    )
    .unwrap();
    out
}

/// A very small model (the GPT-2 vocabulary still dominates): one layer, one head of 64.
fn small_run(steps: u64) -> RunConfig {
    let mut model = Variant::FoxPro.config(64, 1, 1);
    model.initializer_range = 0.02;
    let mut train = presets::tiny().train;
    train.context = 32;
    train.batch_size = 4;
    train.micro_batch = 2; // two accumulated passes per step
    train.total_tokens = steps * 4 * 32;
    train.warmup_tokens = 2 * 4 * 32;
    train.eval_every = 2;
    train.eval_tokens = 128;
    train.checkpoint_every = 2;
    train.keep_last = 2;
    RunConfig { model, train }
}

fn opts(data: &Path, out: &Path) -> TrainOptions {
    TrainOptions::new(data, out, foxlm::backend::DeviceArg::Cpu)
}

fn err_of<T>(r: anyhow::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

/// The headline: the tiny preset as the demo trains it (a FoX (Pro), d = 64, 4 layers; 500 steps
/// of 8 x 128 tokens, under two minutes on 2 cores) beats the unigram entropy of its training
/// tokens by more than 1 nat/token on the held-out chapters.
#[test]
fn tiny_model_beats_unigram_entropy_on_held_out_chapters() {
    let tmp = tempfile::tempdir().unwrap();
    let data = moby_dick(tmp.path());
    let ds = Dataset::open(&data).unwrap();
    let h1 = train::unigram_entropy(&ds, Split::Train);
    let p = presets::tiny();
    let mut run = RunConfig { model: p.model, train: p.train };
    run.train.eval_every = 0;
    run.train.eval_tokens = u64::MAX; // all held-out chapters
    run.train.checkpoint_every = 0;
    let steps = run.train.total_steps() as usize;
    let t0 = std::time::Instant::now();
    let r = train(Some(run), &opts(&data, &tmp.path().join("run"))).unwrap();
    let before = r.first_val_loss.unwrap();
    let after = r.last_val_loss.unwrap();
    eprintln!(
        "unigram entropy {h1:.3}; validation loss {before:.3} -> {after:.3} in {:.0} s ({:.0} tokens/s)",
        t0.elapsed().as_secs_f64(),
        r.tokens_per_s
    );
    assert_eq!(r.outcome, Outcome::Finished);
    assert!((before - (50257f64).ln()).abs() < 0.1, "an N(0, 0.02) model starts near ln V: {before}");
    assert!(after < h1 - 1.0, "validation loss {after:.3} does not beat the unigram entropy {h1:.3} by 1 nat");
    // The loss curve and the metrics were written.
    let png = std::fs::read(tmp.path().join("run/loss.png")).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    let ms = read_metrics(&tmp.path().join("run"));
    assert_eq!(ms.iter().filter(|m| m.kind == "train").count(), steps);
    assert_eq!(ms.iter().filter(|m| m.kind == "val").count(), 2);
}

/// Trains `run` (6 steps) uninterrupted into `dir`/a, and into `dir`/b interrupted after 4 steps
/// then resumed: the same losses step for step, bit for bit (the CPU is deterministic), the same
/// final weights, optimizer state and data position. Returns `dir`/a.
fn assert_resume_reproduces(dir: &Path, data: &Path, run: &RunConfig) -> PathBuf {
    let a = dir.join("a");
    let ra = train(Some(run.clone()), &opts(data, &a)).unwrap();
    assert_eq!((ra.outcome, ra.step), (Outcome::Finished, 6));

    // Interrupted after 4 steps (as Ctrl-C does: a checkpoint is saved; step 4 also validates),
    // then resumed.
    let b = dir.join("b");
    let rb1 = train(Some(run.clone()), &TrainOptions { stop_after: Some(4), ..opts(data, &b) }).unwrap();
    assert_eq!((rb1.outcome, rb1.step), (Outcome::Interrupted, 4));
    assert!(rb1.checkpoint.ends_with("checkpoint-000004"));
    let rb2 = train(Some(run.clone()), &TrainOptions { resume: true, ..opts(data, &b) }).unwrap();
    assert_eq!((rb2.outcome, rb2.step), (Outcome::Finished, 6));

    // Same losses, step for step, bit for bit (CPU is deterministic).
    let losses = |d: &Path| -> Vec<(String, u64, u64)> {
        read_metrics(d).into_iter().map(|m| (m.kind, m.step, m.loss.or(m.val_loss).unwrap().to_bits())).collect()
    };
    let (la, lb) = (losses(&a), losses(&b));
    assert_eq!(la.iter().filter(|l| l.0 == "train").count(), 6);
    assert_eq!(la, lb);
    // Same final weights and optimizer state.
    let (ca, cb) = (load_checkpoint(&a.join("final")).unwrap(), load_checkpoint(&b.join("final")).unwrap());
    assert_eq!(ca.model.params.tensors, cb.model.params.tensors);
    assert_eq!((ca.opt.m.clone(), ca.opt.v.clone(), ca.opt.step), (cb.opt.m.clone(), cb.opt.v.clone(), cb.opt.step));
    assert_eq!(ca.state.data, cb.state.data);
    assert_eq!(ca.state.tokens_seen, 6 * 4 * 32);
    // Resuming a finished run does nothing.
    let rc = train(Some(run.clone()), &TrainOptions { resume: true, ..opts(data, &b) }).unwrap();
    assert_eq!(rc.outcome, Outcome::AlreadyFinished);
    a
}

#[test]
fn resumed_run_reproduces_the_uninterrupted_run_and_checkpoints_reload_bit_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let data = moby_dick(tmp.path());
    let run = small_run(6);
    let a = assert_resume_reproduces(tmp.path(), &data, &run);
    let ca = load_checkpoint(&a.join("final")).unwrap();

    // The final model folder is a model folder in the authors' layout: it reloads bit-exactly,
    // records the training context, and gives the same logits as the model that wrote it.
    let m = load_model(&a.join("final")).unwrap();
    assert_eq!(m.params.tensors, ca.model.params.tensors);
    assert_eq!(m.config.train_context(), Some(32));
    let files: Vec<String> =
        std::fs::read_dir(a.join("final")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    for f in ["config.json", "model.safetensors", "optimizer.safetensors", "trainer.json"] {
        assert!(files.contains(&f.to_string()), "{f} missing from {files:?}");
    }
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(a.join("final/config.json")).unwrap()).unwrap();
    assert_eq!(cfg["model_type"], "forgetting_transformer-project_fox");
    assert_eq!(cfg["foxlm_train_context"], 32);
    // keep-last-2 numbered checkpoints; `latest` names the final one.
    let kept: Vec<u64> = list_checkpoints(&a).into_iter().map(|(s, _)| s).collect();
    assert_eq!(kept, vec![2, 4]);
    assert_eq!(std::fs::read_to_string(a.join("latest")).unwrap(), "final");
    assert_eq!(latest_checkpoint(&a).unwrap().unwrap(), a.join("final"));
}

/// The recurrent families train, checkpoint and resume as FoX does: Mamba-2 (2 layers of d = 64),
/// Samba (a Mamba layer and a windowed attention layer), DeltaNet, Gated DeltaNet and HGRN2 (2
/// layers of 2 heads of 32; HGRN2's lower bounds a model-level parameter), each resumed bit for bit, and the final folder reloads as the same family in its
/// reference's layout.
#[test]
fn recurrent_models_resume_bit_exactly_and_reload() {
    let tmp = tempfile::tempdir().unwrap();
    let data = moby_dick(tmp.path());
    for (name, model, model_type) in [
        ("mamba2", presets::mamba2_config(64, 2), "mamba2-project_fox"),
        ("samba", presets::samba_config(64, 2, 2, 16), "samba-project_fox"),
        ("deltanet", presets::deltanet_config(64, 2, 2, false), "delta_net"),
        ("gated_deltanet", presets::deltanet_config(64, 2, 2, true), "gated_deltanet"),
        ("hgrn2", presets::hgrn2_config(64, 2, 32), "hgrn2"),
    ] {
        let run = RunConfig { model, ..small_run(6) };
        let a = assert_resume_reproduces(&tmp.path().join(name), &data, &run);
        let m = load_model(&a.join("final")).unwrap();
        assert_eq!(m.config.arch(), run.model.arch(), "{name}");
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(a.join("final/config.json")).unwrap()).unwrap();
        assert_eq!(cfg["model_type"], model_type, "{name}");
        assert!(read_metrics(&a).iter().any(|l| l.kind == "train" && l.loss.is_some_and(|v| v.is_finite())), "{name}");
    }
}

#[test]
fn error_paths_are_clear_and_keep_the_last_good_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let data = moby_dick(tmp.path());
    let run = small_run(4);

    // A corpus shorter than one window.
    let short = tmp.path().join("short");
    std::fs::create_dir_all(&short).unwrap();
    std::fs::write(short.join("a.txt"), "Call me Ishmael.").unwrap();
    let short_ds = tmp.path().join("short-ds");
    prepare(&[short], &short_ds, &PrepareOptions { val_fraction: 0.0, ..Default::default() }).unwrap();
    let e = err_of(train(Some(run.clone()), &opts(&short_ds, &tmp.path().join("o1"))));
    assert!(e.contains("fewer than one window"), "{e}");

    // A missing dataset.
    let e = err_of(train(Some(run.clone()), &opts(&tmp.path().join("nope"), &tmp.path().join("o2"))));
    assert!(e.contains("nope"), "{e}");

    // An output folder that cannot be created (its parent is a file).
    std::fs::write(tmp.path().join("file"), "x").unwrap();
    let e = err_of(train(Some(run.clone()), &opts(&data, &tmp.path().join("file/out"))));
    assert!(e.contains("--out") && e.contains("file/out"), "{e}");

    // GPU-only options on the CPU are errors that say so.
    let cpu_bf16 = TrainOptions { dtype: Some(foxlm::backend::Dtype::Bf16), ..opts(&data, &tmp.path().join("o3")) };
    let e = err_of(train(Some(run.clone()), &cpu_bf16));
    assert!(e.contains("--dtype bf16") && e.contains("GPU"), "{e}");
    let e = err_of(train(Some(run.clone()), &TrainOptions { recompute: true, ..opts(&data, &tmp.path().join("o4")) }));
    assert!(e.contains("--recompute"), "{e}");

    // A run already in the folder, without --resume; --resume with nothing to resume.
    let out = tmp.path().join("run");
    train(Some(run.clone()), &TrainOptions { stop_after: Some(2), ..opts(&data, &out) }).unwrap();
    let e = err_of(train(Some(run.clone()), &opts(&data, &out)));
    assert!(e.contains("--resume"), "{e}");
    let e = err_of(train(Some(run.clone()), &TrainOptions { resume: true, ..opts(&data, &tmp.path().join("empty")) }));
    assert!(e.contains("no checkpoint"), "{e}");

    // Resuming with a different configuration names the fields.
    let mut other = run.clone();
    other.train.peak_lr *= 2.0;
    other.model.num_hidden_layers = 2;
    let e = err_of(train(Some(other), &TrainOptions { resume: true, ..opts(&data, &out) }));
    assert!(
        e.contains("train.peak_lr") && e.contains("model.num_hidden_layers") && e.contains("checkpoint-000002"),
        "{e}"
    );
    // Cadence changes are fine; so is taking the configuration from the checkpoint.
    let mut cadence = run.clone();
    cadence.train.eval_every = 1;
    let r = train(Some(cadence), &TrainOptions { resume: true, stop_after: Some(3), ..opts(&data, &out) }).unwrap();
    assert_eq!(r.step, 3);
    let r = train(None, &TrainOptions { resume: true, ..opts(&data, &out) }).unwrap();
    assert_eq!((r.outcome, r.step), (Outcome::Finished, 4));

    // Different data under the same configuration.
    let out2 = tmp.path().join("run2");
    train(Some(run.clone()), &TrainOptions { stop_after: Some(1), ..opts(&data, &out2) }).unwrap();
    let data2 = tmp.path().join("md-plain");
    prepare(&[sample_dir()], &data2, &PrepareOptions { text_format: TextFormat::Plain, ..Default::default() }).unwrap();
    let e = err_of(train(Some(run.clone()), &TrainOptions { resume: true, ..opts(&data2, &out2) }));
    assert!(e.contains("training data differ"), "{e}");

    // A loss that becomes NaN stops training and names the last good checkpoint.
    let mut wild = run.clone();
    wild.train.peak_lr = 1e30;
    wild.train.min_lr = 1e30;
    wild.train.warmup_tokens = 0;
    wild.train.checkpoint_every = 1;
    let out3 = tmp.path().join("nan");
    let e = err_of(train(Some(wild), &opts(&data, &out3)));
    assert!(e.contains("diverged") && e.contains("checkpoint-000001"), "{e}");
    assert!(load_checkpoint(&out3.join("checkpoint-000001")).is_ok());
}

fn foxlm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_foxlm"))
}

/// `foxlm train --quiet [extra…] --config cfg --data data --out out`.
fn foxlm_train(extra: &[&str], cfg: &Path, data: &Path, out: &Path) -> Command {
    let mut c = foxlm();
    c.args(["train", "--quiet"]).args(extra).arg("--config").arg(cfg).arg("--data").arg(data).arg("--out").arg(out);
    c
}

fn dir_size(p: &Path) -> u64 {
    std::fs::read_dir(p).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum()
}

/// A full disk while writing a checkpoint: a clear error naming the last good checkpoint, which
/// stays intact (and `latest` still names it); nothing half-written is left behind.
#[test]
fn full_disk_never_corrupts_the_last_good_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let data = moby_dick(tmp.path());
    let cfg = tmp.path().join("run.json");
    std::fs::write(&cfg, serde_json::to_string(&small_run(6)).unwrap()).unwrap();
    // Measure one checkpoint, then allow a bit more than one.
    let probe = tmp.path().join("probe");
    let st = foxlm_train(&["--stop-after", "2"], &cfg, &data, &probe).status().unwrap();
    assert!(st.success());
    let one = dir_size(&probe.join("checkpoint-000002"));
    let out = tmp.path().join("out");
    let o =
        foxlm_train(&[], &cfg, &data, &out).env("FOXLM_TEST_DISK_LIMIT", (one + one / 2).to_string()).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("No space left on device") && stderr.contains("last good checkpoint is"), "{stderr}");
    assert!(stderr.contains("checkpoint-000002"), "{stderr}");
    let names: Vec<String> =
        std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
    assert!(!names.iter().any(|n| n.ends_with(".tmp")), "left behind: {names:?}");
    assert_eq!(std::fs::read_to_string(out.join("latest")).unwrap(), "checkpoint-000002");
    let ck = load_checkpoint(&out.join("checkpoint-000002")).unwrap();
    assert_eq!(ck.state.step, 2);
    // And the run resumes from it to the end.
    let st = foxlm().args(["train", "--quiet", "--resume", "--out"]).arg(&out).status().unwrap();
    assert!(st.success());
    assert!(out.join("final/model.safetensors").exists());
}

/// Ctrl-C saves a checkpoint and exits with 130; --resume continues.
#[test]
fn ctrl_c_saves_a_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let data = moby_dick(tmp.path());
    let cfg = tmp.path().join("run.json");
    let mut run = small_run(100_000);
    run.train.checkpoint_every = 0;
    run.train.eval_every = 0;
    std::fs::write(&cfg, serde_json::to_string(&run).unwrap()).unwrap();
    let out = tmp.path().join("out");
    let child = foxlm_train(&[], &cfg, &data, &out).stderr(std::process::Stdio::piped()).spawn().unwrap();
    // Wait for a few steps.
    let t0 = std::time::Instant::now();
    while read_metrics(&out).iter().filter(|m| m.kind == "train").count() < 2 {
        assert!(t0.elapsed().as_secs() < 120, "training did not start");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let st = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(st.success());
    let o = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("--resume"), "{stderr}");
    let ck = latest_checkpoint(&out).unwrap().expect("a checkpoint");
    let state = load_checkpoint(&ck).unwrap().state;
    assert!(state.step >= 2 && !state.finished);
    // Resume for one more step.
    let st = foxlm()
        .args(["train", "--quiet", "--resume", "--stop-after"])
        .arg((state.step + 1).to_string())
        .arg("--out")
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(load_checkpoint(&latest_checkpoint(&out).unwrap().unwrap()).unwrap().state.step, state.step + 1);
}

#[test]
fn cli_presets_and_config_printing() {
    let o = foxlm().args(["train", "--list-presets"]).output().unwrap();
    let s = String::from_utf8_lossy(&o.stdout);
    for n in ["tiny", "fox-pro-125m", "fox-llama-360m", "transformer-pro-760m", "transformer-llama-125m"] {
        assert!(s.contains(n), "{n} missing from {s}");
    }
    let o = foxlm().args(["train", "--preset", "fox-pro-125m", "--context", "512", "--print-config"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["train"]["context"], 512);
    assert_eq!(v["train"]["peak_lr"], 0.002);
    assert_eq!(v["model"]["hidden_size"], 768);
    let o = foxlm().args(["train", "--preset", "nope", "--print-config"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown preset"));
}
