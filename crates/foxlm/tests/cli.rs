//! The `foxlm` command line: forward and generate reproduce the reference fixtures, inspect
//! reports, and every way a model folder can be broken is an error naming the file and the tensor
//! or field at fault (exit code 1), never a panic; usage errors exit with 2.

mod common;

use common::{fixture, VARIANTS};
use foxlm::checkpoint::read_tensors;
use safetensors::{Dtype, SafeTensors};
use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_foxlm");
fn foxlm(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run foxlm")
}

/// `foxlm generate` on fixture `v` of one prompt of token ids, with `extra` flags.
fn generate_ids(v: &str, prompt: &[String], max_new_tokens: usize, extra: &[&str]) -> Output {
    let (model, prompt, max) = (fixture(v), prompt.join(","), max_new_tokens.to_string());
    let mut args =
        vec!["generate", "--model", model.to_str().unwrap(), "--prompt-ids", &prompt, "--max-new-tokens", &max];
    args.extend_from_slice(extra);
    foxlm(&args)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn tensor_bytes(path: &Path, name: &str) -> (Vec<usize>, Dtype, Vec<u8>) {
    let bytes = std::fs::read(path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap();
    (t.shape().to_vec(), t.dtype(), t.data().to_vec())
}

fn write_tensors(path: &Path, ts: Vec<(&str, Vec<usize>, Dtype, Vec<u8>)>) {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = ts
        .iter()
        .map(|(n, s, d, b)| (n.to_string(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn forward_reproduces_fixture_logits_plain_and_left_padded() {
    let tmp = tempfile::tempdir().unwrap();
    for v in VARIANTS {
        let exp = fixture(v).join("expected.safetensors");
        let ids = tensor_bytes(&exp, "input_ids");
        let mask = tensor_bytes(&exp, "attention_mask_left_padded");
        let (b, t) = (ids.0[0], ids.0[1]);
        // plain
        let input = tmp.path().join(format!("{v}-in.safetensors"));
        let output = tmp.path().join(format!("{v}-out.safetensors"));
        write_tensors(&input, vec![("input_ids", ids.0.clone(), ids.1, ids.2.clone())]);
        let forward = || foxlm(&common::forward_args(&fixture(v), &input, &output));
        let o = forward();
        assert!(o.status.success(), "{v}: {}", stderr(&o));
        let (shape, dt, got) = tensor_bytes(&output, "logits");
        assert_eq!((shape.clone(), dt), (vec![b, t, 512], Dtype::F32));
        let want = f32s(&tensor_bytes(&exp, "logits").2);
        let d = f32s(&got).iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(d < 1e-4, "{v}: {d}");
        // left padded
        write_tensors(
            &input,
            vec![
                ("input_ids", ids.0.clone(), ids.1, ids.2.clone()),
                ("attention_mask", mask.0.clone(), mask.1, mask.2.clone()),
            ],
        );
        let o = forward();
        assert!(o.status.success(), "{v}: {}", stderr(&o));
        let got = f32s(&tensor_bytes(&output, "logits").2);
        let want = f32s(&tensor_bytes(&exp, "logits_left_padded").2);
        let m: Vec<i64> = mask.2.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
        let mut worst = 0.0f32;
        for (pos, &mk) in m.iter().enumerate() {
            if mk == 1 {
                for k in 0..512 {
                    worst = worst.max((got[pos * 512 + k] - want[pos * 512 + k]).abs());
                }
            }
        }
        assert!(worst < 1e-4, "{v} padded: {worst}");
    }
}

#[test]
fn generate_prompt_ids_reproduces_fixture_greedy_tokens() {
    for v in VARIANTS {
        let exp = fixture(v).join("expected.safetensors");
        let (_, ids) = common::i64_tensor(&exp, "input_ids");
        let (plen, want) = common::expected_greedy(&common::expected_json(&fixture(v)));
        let want: Vec<String> = want.iter().map(|x| x.to_string()).collect();
        let prompt: Vec<String> = ids[..plen].iter().map(|x| x.to_string()).collect();
        // The reference generated all 24 tokens without stopping at the config's eos id (1),
        // which one variant's continuation contains: hence --ignore-eos.
        let o = generate_ids(v, &prompt, want.len(), &["--ignore-eos"]);
        assert!(o.status.success(), "{v}: {}", stderr(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), want.join(","), "{v}");
    }
    // Without --ignore-eos, generation stops before the eos token.
    let v = "fox_pro_shared_qknorm";
    let j = common::expected_json(&fixture(v));
    let want: Vec<u64> = j["greedy_new_tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    let cut = want.iter().position(|&t| t == 1).unwrap();
    let ids = tensor_bytes(&fixture(v).join("expected.safetensors"), "input_ids").2;
    let prompt: Vec<String> =
        ids.chunks_exact(8).take(40).map(|c| i64::from_le_bytes(c.try_into().unwrap()).to_string()).collect();
    let o = generate_ids(v, &prompt, 24, &[]);
    let got: Vec<u64> = String::from_utf8_lossy(&o.stdout)
        .trim()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(got, want[..cut].to_vec());
}

#[test]
fn seeded_sampling_is_reproducible_and_batches_work() {
    let m = fixture("fox_pro");
    let args = [
        "generate",
        "--model",
        m.to_str().unwrap(),
        "--prompt-ids",
        "3,4,5",
        "--prompt-ids",
        "7,8,9,10,11",
        "--temperature",
        "0.9",
        "--top-k",
        "50",
        "--top-p",
        "0.9",
        "--seed",
        "11",
        "--max-new-tokens",
        "8",
        "--ignore-eos",
    ];
    let a = foxlm(&args);
    let b = foxlm(&args);
    assert!(a.status.success(), "{}", stderr(&a));
    assert_eq!(a.stdout, b.stdout);
    let lines: Vec<&str> = std::str::from_utf8(&a.stdout).unwrap().lines().collect();
    assert_eq!(lines.len(), 2);
    assert!(lines.iter().all(|l| l.split(',').count() == 8));
}

#[test]
fn inspect_reports_counts_and_memory() {
    let o = foxlm(&["inspect", "--model", fixture("fox_pro").to_str().unwrap(), "--decode-tokens", "1024"]);
    assert!(o.status.success());
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("FoX (Pro)"), "{s}");
    // 692,608 parameters in the fixture (sum of param_names shapes)
    assert!(s.contains("total                        692.6K"), "{s}");
    assert!(s.contains("KV cache, 1024 tokens"), "{s}");
}

/// Copies a fixture model folder to a temp dir for breaking.
fn broken_copy(v: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture(v).join(f), d.path().join(f)).unwrap();
    }
    d
}

/// A [`broken_copy`] of `v` with `from` replaced by `to` in its config.json.
fn copy_with_config_edit(v: &str, from: &str, to: &str) -> tempfile::TempDir {
    let d = broken_copy(v);
    let path = d.path().join("config.json");
    let cfg = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, cfg.replace(from, to)).unwrap();
    d
}

fn rewrite_weights(dir: &Path, edit: impl FnOnce(&mut Vec<(String, Vec<usize>, Vec<f32>)>)) {
    let file = dir.join("model.safetensors");
    let mut ts: Vec<(String, Vec<usize>, Vec<f32>)> =
        read_tensors(std::slice::from_ref(&file)).unwrap().into_iter().map(|(n, (_, s, d))| (n, s, d)).collect();
    edit(&mut ts);
    let bytes: Vec<Vec<u8>> = ts.iter().map(|(_, _, d)| d.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    write_tensors(
        &file,
        ts.iter().zip(&bytes).map(|((n, s, _), b)| (n.as_str(), s.clone(), Dtype::F32, b.clone())).collect(),
    );
}

fn inspect_err(dir: &Path) -> String {
    let o = foxlm(&["inspect", "--model", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "expected a runtime error; stderr: {}", stderr(&o));
    let e = stderr(&o);
    assert!(!e.contains("panicked"), "{e}");
    e
}

#[test]
fn broken_model_folders_are_clear_errors() {
    // missing tensor
    let d = broken_copy("fox_pro");
    rewrite_weights(d.path(), |ts| ts.retain(|t| t.0 != "model.layers.1.attn.q_norm.weight"));
    let e = inspect_err(d.path());
    assert!(
        e.contains("model.layers.1.attn.q_norm.weight") && e.contains("missing") && e.contains("model.safetensors"),
        "{e}"
    );
    // extra tensor
    let d = broken_copy("fox_llama");
    rewrite_weights(d.path(), |ts| ts.push(("model.layers.0.attn.bogus.weight".into(), vec![2], vec![0.0, 1.0])));
    let e = inspect_err(d.path());
    assert!(e.contains("model.layers.0.attn.bogus.weight") && e.contains("unexpected"), "{e}");
    // misshapen tensor
    let d = broken_copy("fox_llama");
    rewrite_weights(d.path(), |ts| {
        let t = ts.iter_mut().find(|t| t.0 == "model.layers.0.attn.fgate_proj.weight").unwrap();
        t.1 = vec![8, 64];
    });
    let e = inspect_err(d.path());
    assert!(
        e.contains("model.layers.0.attn.fgate_proj.weight") && e.contains("[8, 64]") && e.contains("[4, 128]"),
        "{e}"
    );
    // unknown config value
    let d = copy_with_config_edit("fox_llama", "\"fgate_type\": \"full\"", "\"fgate_type\": \"sometimes\"");
    let e = inspect_err(d.path());
    assert!(e.contains("config.json") && e.contains("fgate_type") && e.contains("sometimes"), "{e}");
    // a value the model does not support (k/v heads must divide the 4 query heads)
    let d = copy_with_config_edit("fox_llama", "\"num_kv_heads\": null", "\"num_kv_heads\": 3");
    let e = inspect_err(d.path());
    assert!(e.contains("config.json") && e.contains("num_kv_heads"), "{e}");
    // malformed config.json
    let d = broken_copy("fox_llama");
    std::fs::write(d.path().join("config.json"), "{ \"vocab_size\": 512, ").unwrap();
    let e = inspect_err(d.path());
    assert!(e.contains("config.json"), "{e}");
    // truncated safetensors
    let d = broken_copy("fox_llama");
    let w = std::fs::read(d.path().join("model.safetensors")).unwrap();
    std::fs::write(d.path().join("model.safetensors"), &w[..w.len() / 2]).unwrap();
    let e = inspect_err(d.path());
    assert!(e.contains("model.safetensors") && e.contains("not a valid safetensors"), "{e}");
    // unsupported dtype
    let d = broken_copy("fox_llama");
    let file = d.path().join("model.safetensors");
    let mut ts: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = read_tensors(std::slice::from_ref(&file))
        .unwrap()
        .into_iter()
        .map(|(n, (_, s, dd))| (n, s, Dtype::F32, dd.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let t = ts.iter_mut().find(|t| t.0 == "model.norm.weight").unwrap();
    t.2 = Dtype::I32;
    write_tensors(&file, ts.iter().map(|(n, s, dt, b)| (n.as_str(), s.clone(), *dt, b.clone())).collect());
    let e = inspect_err(d.path());
    assert!(e.contains("model.norm.weight") && e.contains("I32"), "{e}");
    // no weights at all
    let d = broken_copy("fox_llama");
    std::fs::remove_file(d.path().join("model.safetensors")).unwrap();
    let e = inspect_err(d.path());
    assert!(e.contains("model.safetensors"), "{e}");
    // not a folder
    let e = inspect_err(Path::new("/nonexistent/model"));
    assert!(e.contains("/nonexistent/model"), "{e}");
}

#[test]
fn sharded_and_half_precision_checkpoints_load() {
    // Split fox_pro into two shards (bf16 and f16) with an index; logits stay close to f32's.
    let v = "fox_pro";
    let d = tempfile::tempdir().unwrap();
    std::fs::copy(fixture(v).join("config.json"), d.path().join("config.json")).unwrap();
    let ts = read_tensors(&[fixture(v).join("model.safetensors")]).unwrap();
    let mut map = serde_json::Map::new();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for (i, (n, (_, s, data))) in ts.iter().enumerate() {
        if i % 2 == 0 {
            let by: Vec<u8> = data.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect();
            a.push((n.as_str(), s.clone(), Dtype::BF16, by));
            map.insert(n.clone(), "model-00001-of-00002.safetensors".into());
        } else {
            let by: Vec<u8> = data.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect();
            b.push((n.as_str(), s.clone(), Dtype::F16, by));
            map.insert(n.clone(), "model-00002-of-00002.safetensors".into());
        }
    }
    write_tensors(&d.path().join("model-00001-of-00002.safetensors"), a);
    write_tensors(&d.path().join("model-00002-of-00002.safetensors"), b);
    std::fs::write(
        d.path().join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    let sharded = foxlm::checkpoint::load_model(d.path()).unwrap();
    let full = foxlm::checkpoint::load_model(&fixture(v)).unwrap();
    for (x, y) in sharded.params.tensors.iter().zip(&full.params.tensors) {
        let rel = x.data.iter().zip(&y.data).map(|(p, q)| (p - q).abs() / q.abs().max(1e-3)).fold(0.0f32, f32::max);
        assert!(rel < 8e-3, "bf16/f16 rounding stays within 2^-7 relative: {rel}");
    }
    // An index naming a missing shard is an error naming it.
    std::fs::remove_file(d.path().join("model-00002-of-00002.safetensors")).unwrap();
    let e = inspect_err(d.path());
    assert!(e.contains("model-00002-of-00002.safetensors"), "{e}");
}

#[test]
fn usage_and_input_errors() {
    let m = fixture("fox_llama");
    // usage errors exit with 2
    assert_eq!(foxlm(&["generate", "--model", m.to_str().unwrap()]).status.code(), Some(2));
    assert_eq!(foxlm(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(foxlm(&["inspect"]).status.code(), Some(2));
    // --help everywhere
    for sub in ["generate", "forward", "inspect"] {
        let o = foxlm(&[sub, "--help"]);
        assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("--model"));
    }
    // runtime input errors exit with 1 and say what is wrong
    let o = foxlm(&["generate", "--model", m.to_str().unwrap(), "--prompt-ids", "1,2,9999"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("9999"), "{}", stderr(&o));
    let o = foxlm(&["generate", "--model", m.to_str().unwrap(), "--prompt", "hello"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--prompt-ids"), "{}", stderr(&o));
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.safetensors");
    write_tensors(
        &input,
        vec![
            ("input_ids", vec![1, 3], Dtype::I64, [1i64, 2, 3].iter().flat_map(|x| x.to_le_bytes()).collect()),
            ("attention_mask", vec![1, 3], Dtype::I64, [1i64, 0, 1].iter().flat_map(|x| x.to_le_bytes()).collect()),
        ],
    );
    let o = foxlm(&common::forward_args(&m, &input, &tmp.path().join("o")));
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("left padding"), "{}", stderr(&o));
}
