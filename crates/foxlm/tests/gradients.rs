//! The backward pass: gradients of every parameter against the authors' PyTorch autograd on the
//! seven fixture models, left padding, and finite differences with Adaptive Computation Pruning on.

mod common;

use common::{expected_json, fixture, fixture_input_ids, VARIANTS};
use foxlm::checkpoint::{load_model, to_f32};
use foxlm::config::Config;
use foxlm::model::{Ctx, Model};
use foxlm::tensor::ParamKind;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use safetensors::SafeTensors;

/// Next-token targets: position i predicts ids[i + 1]; the last position of each row has none.
fn next_token_targets(ids: &[u32], b: usize, t: usize) -> Vec<Option<u32>> {
    (0..b * t).map(|r| (r % t + 1 < t).then(|| ids[r + 1])).collect()
}

fn norm(a: &[f32]) -> f64 {
    a.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt()
}

fn rel_err(g: &[f32], r: &[f32]) -> f64 {
    assert_eq!(g.len(), r.len());
    let diff: f64 = g.iter().zip(r).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum::<f64>().sqrt();
    diff / norm(r).max(1e-30)
}

#[test]
fn gradients_of_every_parameter_match_reference() {
    for v in VARIANTS {
        let model = load_model(&fixture(v)).unwrap();
        let (b, t, ids) = fixture_input_ids(&fixture(v));
        let targets = next_token_targets(&ids, b, t);
        let mut grads = model.params.zeros_like();
        let loss = model.loss_and_grads(&ids, &targets, &Ctx { batch: b, seq: t, start: None }, &mut grads, 1.0);

        let j: serde_json::Value = expected_json(&fixture(v));
        let want_loss = j["loss"].as_f64().unwrap();
        assert!((loss as f64 - want_loss).abs() < 1e-5, "{v}: loss {loss} vs {want_loss}");

        let bytes = std::fs::read(fixture(v).join("expected_grads.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut worst = (0.0f64, String::new());
        let mut checked = 0;
        for (i, name) in model.params.names.iter().enumerate() {
            let key = format!("grad.{name}");
            if model.params.kinds[i] == ParamKind::Frozen {
                assert!(grads[i].iter().all(|&g| g == 0.0), "{v}: frozen {name} got a gradient");
                assert!(st.tensor(&key).is_err(), "{v}: the reference trains {name}, which foxlm freezes");
                continue;
            }
            let r = st.tensor(&key).unwrap_or_else(|_| panic!("{v}: {key} missing from the fixture"));
            let r = to_f32(r.dtype(), r.data(), &key).unwrap();
            let e = rel_err(&grads[i], &r);
            assert!(e < 1e-4, "{v}: {name}: relative error {e:.3e} (|ref| {:.3e})", norm(&r));
            if e > worst.0 {
                worst = (e, name.clone());
            }
            checked += 1;
        }
        assert_eq!(checked, st.names().len(), "{v}: the fixture has gradients foxlm does not produce");
        eprintln!(
            "{v}: loss diff {:.2e}; {checked} tensors; worst relative error {:.2e} ({})",
            (loss as f64 - want_loss).abs(),
            worst.0,
            worst.1
        );
    }
}

/// A left-padded batch gives the gradient of its unpadded rows: padding adds nothing, and the
/// mean over all targets is the target-count-weighted mean of the rows' means (via grad_scale).
#[test]
fn left_padded_batch_gradient_equals_unpadded_rows() {
    for v in ["fox_pro", "transformer_pro", "fox_llama"] {
        let model = load_model(&fixture(v)).unwrap();
        let (_, t, ids) = fixture_input_ids(&fixture(v));
        let pad = 37;
        let row0: Vec<u32> = ids[..t].to_vec();
        let row1: Vec<u32> = ids[t + pad..2 * t].to_vec();
        // Padding holds arbitrary (different) ids: they must not matter.
        let mut padded = row0.clone();
        padded.extend((0..pad).map(|i| (i * 7 % 512) as u32));
        padded.extend_from_slice(&row1);
        let mut targets = next_token_targets(&padded, 2, t);
        for tg in &mut targets[t..t + pad] {
            *tg = None;
        }
        let ctx = Ctx { batch: 2, seq: t, start: Some(vec![0, pad]) };
        let mut g_pad = model.params.zeros_like();
        let loss_pad = model.loss_and_grads(&padded, &targets, &ctx, &mut g_pad, 1.0);

        let (n0, n1) = (t - 1, t - pad - 1);
        let total = (n0 + n1) as f32;
        let mut g_sep = model.params.zeros_like();
        // Each row alone, weighted by its share of the targets.
        let mut alone = |row: &[u32], n: usize| {
            let ctx = Ctx { batch: 1, seq: row.len(), start: None };
            model.loss_and_grads(row, &next_token_targets(row, 1, row.len()), &ctx, &mut g_sep, n as f32 / total)
        };
        let (l0, l1) = (alone(&row0, n0), alone(&row1, n1));
        let loss_sep = (l0 * n0 as f32 + l1 * n1 as f32) / total;
        assert!((loss_pad - loss_sep).abs() < 1e-5, "{v}: loss {loss_pad} vs {loss_sep}");
        let mut worst = 0.0f64;
        for (i, name) in model.params.names.iter().enumerate() {
            if norm(&g_sep[i]) == 0.0 {
                assert!(g_pad[i].iter().all(|&g| g == 0.0), "{v}: {name}");
                continue;
            }
            let e = rel_err(&g_pad[i], &g_sep[i]);
            // Same arithmetic up to summation order (batched GEMMs, reductions): f32 round-off.
            assert!(e < 1e-5, "{v}: {name}: padded vs unpadded relative error {e:.3e}");
            worst = worst.max(e);
        }
        eprintln!("{v}: left-padded vs separate rows: worst relative error {worst:.2e}");
    }
}

fn tiny_config(acp: bool) -> Config {
    let mut cfg: Config =
        serde_json::from_str(&std::fs::read_to_string(fixture("fox_pro").join("config.json")).unwrap()).unwrap();
    cfg.vocab_size = 61;
    cfg.hidden_size = 32;
    cfg.num_heads = 2;
    cfg.num_hidden_layers = 2;
    cfg.intermediate_size = Some(48);
    cfg.log_pruning_tolerance = acp.then_some(-10.0);
    cfg
}

/// Random weights: matrices N(0, std), norm weights around 1, gate biases spread so that some
/// heads forget fast (which is what makes ACP prune).
fn random_model(cfg: &Config, seed: u64, std: f32) -> Model {
    let mut m = Model::new(cfg);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for (i, name) in m.params.names.clone().iter().enumerate() {
        let t = &mut m.params.tensors[i];
        for x in t.data.iter_mut() {
            let z: f32 = rng.sample(StandardNormal);
            *x = if name.ends_with("norm.weight") {
                1.0 + 0.3 * z
            } else if name.ends_with("fgate_proj.bias") {
                -1.0 + z
            } else {
                std * z
            };
        }
    }
    m
}

/// Finite differences of the loss through the whole model with ACP on (log tolerance −10): the
/// backward must skip exactly the tiles the forward skipped, so its gradient is that of the
/// computed (pruned) function.
#[test]
fn finite_differences_through_the_model_with_acp_on() {
    let cfg = tiny_config(true);
    let model = random_model(&cfg, 3, 0.3);
    let (b, t) = (2, 300);
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let ids: Vec<u32> = (0..b * t).map(|_| rng.gen_range(0..cfg.vocab_size as u32)).collect();
    let targets = next_token_targets(&ids, b, t);
    let ctx = Ctx { batch: b, seq: t, start: Some(vec![0, 21]) };
    let targets: Vec<Option<u32>> =
        targets.iter().enumerate().map(|(r, tg)| if r >= t && r < t + 21 { None } else { *tg }).collect();

    // ACP must actually prune in this setting, or the test proves nothing.
    let (_, acts) = model.forward_hidden(&ids, &ctx, None, true);
    let acts = acts.unwrap();
    let (pruned, visited): (usize, usize) = acts
        .blocks
        .iter()
        .filter_map(|ba| ba.attn())
        .fold((0, 0), |(p, v), a| (p + a.tiles_pruned, v + a.tiles_visited));
    assert!(pruned > 0, "ACP pruned no tile ({visited} visited)");

    // From each of these tensors, the entries with the largest gradients (well above f32 noise).
    let names = [
        "model.layers.0.attn.fgate_proj.bias",
        "model.layers.1.attn.fgate_proj.weight",
        "model.layers.0.attn.k_proj.shift_proj.weight",
        "model.layers.1.attn.v_proj.shift_proj.weight",
        "model.layers.0.attn.q_norm.weight",
        "model.layers.1.attn.k_norm.weight",
        "model.layers.0.attn.output_norm.weight",
        "model.layers.0.attn.ogate_proj.weight",
        "model.layers.0.attn.q_proj.weight",
        "model.layers.0.attn.k_proj.linear.weight",
        "model.layers.1.attn.v_proj.linear.weight",
        "model.layers.0.mlp.gate_proj.weight",
        "model.embeddings.weight",
    ];
    let (grads, checked) = common::batch_finite_differences(&model, (&ids, &targets, &ctx), &names, 1e-2);
    // And ACP is lossless within ε: the same model without pruning has nearly the same gradient.
    let full = random_model(&tiny_config(false), 3, 0.3);
    let (_, acts_full) = full.forward_hidden(&ids, &ctx, None, true);
    assert!(acts_full.unwrap().blocks.iter().all(|ba| ba.attn().is_some_and(|a| a.tiles_pruned == 0)));
    let mut g_full = full.params.zeros_like();
    full.loss_and_grads(&ids, &targets, &ctx, &mut g_full, 1.0);
    let mut worst = 0.0f64;
    for (i, name) in model.params.names.iter().enumerate() {
        let e = rel_err(&grads[i], &g_full[i]);
        // Pruned entries carry < e^-10 ≈ 4.5e-5 of a row's mass each row.
        assert!(e < 1e-3, "{name}: gradient with ACP vs without: relative error {e:.3e}");
        worst = worst.max(e);
    }
    eprintln!(
        "ACP: {pruned} of {} key tiles pruned; {checked} finite differences match; vs no pruning: worst relative error {worst:.2e}",
        pruned + visited
    );
}

/// `foxlm forward --with-grads` writes the loss and every trainable parameter's gradient under the
/// fixtures' names, so its output compares directly with `expected_grads.safetensors`.
#[test]
fn forward_command_with_grads_writes_reference_gradients() {
    let tmp = tempfile::tempdir().unwrap();
    for v in ["fox_pro", "fox_fixed"] {
        let bytes = std::fs::read(fixture(v).join("expected.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let ids = st.tensor("input_ids").unwrap();
        let input = tmp.path().join(format!("{v}-in.safetensors"));
        let output = tmp.path().join(format!("{v}-out.safetensors"));
        std::fs::write(&input, safetensors::serialize([("input_ids", ids)], None).unwrap()).unwrap();
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_foxlm"))
            .args(["forward", "--with-grads", "--model", fixture(v).to_str().unwrap()])
            .args(["--input", input.to_str().unwrap(), "--output", output.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{v}: {}", String::from_utf8_lossy(&o.stderr));
        let got_bytes = std::fs::read(&output).unwrap();
        let got = SafeTensors::deserialize(&got_bytes).unwrap();
        let f32s = |st: &SafeTensors, n: &str| {
            let t = st.tensor(n).unwrap_or_else(|_| panic!("{v}: {n} missing"));
            to_f32(t.dtype(), t.data(), n).unwrap()
        };
        let j: serde_json::Value = expected_json(&fixture(v));
        let loss = f32s(&got, "loss");
        assert_eq!(got.tensor("loss").unwrap().shape(), &[] as &[usize]);
        assert!((loss[0] as f64 - j["loss"].as_f64().unwrap()).abs() < 1e-5, "{v}: loss {}", loss[0]);
        let ref_bytes = std::fs::read(fixture(v).join("expected_grads.safetensors")).unwrap();
        let refs = SafeTensors::deserialize(&ref_bytes).unwrap();
        let mut got_names: Vec<String> =
            got.names().into_iter().filter(|n| n.starts_with("grad.")).map(String::from).collect();
        let mut ref_names: Vec<String> = refs.names().into_iter().map(String::from).collect();
        got_names.sort();
        ref_names.sort();
        assert_eq!(got_names, ref_names, "{v}: gradient names");
        for n in &ref_names {
            assert_eq!(got.tensor(n).unwrap().shape(), refs.tensor(n).unwrap().shape(), "{v}: {n}");
            let e = rel_err(&f32s(&got, n), &f32s(&refs, n));
            assert!(e < 1e-4, "{v}: {n}: relative error {e:.3e}");
        }
    }
}

/// Per-block recomputation (keep only each block's input, run the block's forward again in the
/// backward) gives bitwise the same loss and gradients as keeping every activation: the CPU ops
/// are deterministic, so any difference would be a buffer the recomputation forgot to refill.
#[test]
fn recomputation_gives_the_same_gradients() {
    use foxlm::backend::cpu::{Cpu, CpuBatch};
    use foxlm::backend::{Backend, BatchInfo};
    use foxlm::model::{ModelActs, Scratch};
    for v in ["fox_pro", "transformer_llama", "fox_bias_only"] {
        let model = load_model(&fixture(v)).unwrap();
        let (b, t, ids) = fixture_input_ids(&fixture(v));
        let targets = next_token_targets(&ids, b, t);
        let start = vec![0, 5];
        let run = |recompute: bool| {
            let mut grads = model.params.zeros_like();
            let mut be = Cpu::with_grads(&model.params, &mut grads);
            let mut batch = CpuBatch::default();
            let info = BatchInfo { batch: b, seq: t, start: Some(&start), past: 0 };
            be.prepare(&mut batch, &info, &ids, Some(&targets)).unwrap();
            let mut acts = if recompute {
                ModelActs::recompute(&be, &model, b, t).unwrap()
            } else {
                ModelActs::new(&be, &model, b, t, true).unwrap()
            };
            assert_eq!(acts.blocks.len(), if recompute { 1 } else { model.layers.len() });
            let mut scratch = Scratch::new(&be, &model, b, t).unwrap();
            model.loss_and_grads_on(&mut be, &batch, &mut acts, &mut scratch, 0.01).unwrap();
            let loss = be.take_loss().unwrap();
            (loss, grads)
        };
        let (l0, g0) = run(false);
        let (l1, g1) = run(true);
        assert_eq!(l0, l1, "{v}: loss");
        for (i, (a, c)) in g0.iter().zip(&g1).enumerate() {
            assert!(a.iter().any(|x| *x != 0.0) || model.params.kinds[i] == foxlm::tensor::ParamKind::Frozen);
            assert_eq!(a, c, "{v}: gradient of {}", model.params.names[i]);
        }
    }
}
