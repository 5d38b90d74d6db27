//! The HGRN2 family through the whole model on the CPU: its config.json (fla's field names) and
//! tensor layout with the model-level lower bounds, finite differences of every kind of parameter
//! (the lower bounds among them), decoding through the fixed-size state against the full
//! forward, chunked prefill, left padding, greedy generation, the initialisation, parity with
//! fla's own HGRN2, checkpoints in fla's layout.

mod common;

use common::random_recurrent_model as random_model;
use foxlm::config::{Arch, Config};
use foxlm::model::Model;
use foxlm::presets::hgrn2_config;

/// A small HGRN2: d = 32, 3 layers (two with lower bounds), 4 heads of 8, vocabulary 97.
fn hgrn2_tiny() -> Config {
    let mut c = hgrn2_config(32, 3, 8);
    c.vocab_size = 97;
    (c.bos_token_id, c.eos_token_id) = (None, None);
    c.intermediate_size = Some(48);
    c.validate().unwrap();
    c
}

/// The same without lower bounds (fla's use_lower_bound false): every layer's gate is logsigmoid.
fn unbounded_tiny() -> Config {
    let mut c = hgrn2_tiny();
    c.use_lower_bound = Some(false);
    c.validate().unwrap();
    c
}

/// The same with fla's short convolutions (use_short_conv, width 4) on q, f and i.
fn conv_tiny() -> Config {
    let mut c = hgrn2_tiny();
    (c.use_short_conv, c.conv_size) = (Some(true), Some(4));
    c.validate().unwrap();
    c
}

#[test]
fn config_layout_and_json_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    for c in [hgrn2_tiny(), unbounded_tiny(), conv_tiny()] {
        assert_eq!(c.arch(), Arch::Hgrn2);
        let m = common::model_with_its_layout(&c);
        let s = c.hgrn2();
        assert_eq!((s.heads, s.head_dim), (4, 8));
        // fla's module order: the embedding, the lower bounds, the layers.
        if s.lower_bound {
            assert_eq!(
                &m.params.names[..3],
                ["model.embeddings.weight", "model.lower_bounds", "model.layers.0.attn_norm.weight"]
            );
            assert_eq!(m.params.tensors[1].shape, vec![3, 32]);
        } else {
            assert!(m.params.id("model.lower_bounds").is_none() && m.lower_bounds.is_none());
        }
        // fla's order within the layer: the projections, the convolutions, g_norm, o_proj.
        let layer: Vec<&str> = m.params.names.iter().filter_map(|n| n.strip_prefix("model.layers.1.attn.")).collect();
        match s.conv {
            None => {
                assert_eq!(layer, ["q_proj.weight", "f_proj.weight", "i_proj.weight", "g_norm.weight", "o_proj.weight"])
            }
            Some(w) => {
                assert_eq!(w, 4);
                let want = ["q_proj", "f_proj", "i_proj", "q_conv1d", "f_conv1d", "i_conv1d", "g_norm", "o_proj"];
                assert_eq!(layer, want.map(|n| format!("{n}.weight")));
                assert_eq!(common::shape(&m, "model.layers.2.attn.f_conv1d.weight"), [32, 1, 4]);
            }
        }
        let j: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(j["model_type"], "hgrn2");
        assert_eq!((j["expand_ratio"].as_u64(), j["num_heads"].as_u64()), (Some(8), Some(4)));
        assert_eq!(j["use_lower_bound"], serde_json::json!(s.lower_bound));
        for k in ["fgate_type", "use_rope", "qk_norm", "use_output_norm"] {
            assert!(j.get(k).is_none(), "FoX's {k} in {j}");
        }
        std::fs::write(&path, c.to_json()).unwrap();
        let back = Config::load(&path).unwrap();
        assert_eq!(back, c);
    }
    // fla's config.json: expand_ratio alone (heads = hidden_size / expand_ratio), or num_heads alone.
    let mut j: serde_json::Value = serde_json::from_str(&hgrn2_tiny().to_json()).unwrap();
    j.as_object_mut().unwrap().remove("num_heads");
    assert_eq!(common::load_config_json(&path, &j).unwrap().hgrn2().heads, 4);
    j.as_object_mut().unwrap().remove("expand_ratio");
    j["num_heads"] = serde_json::json!(2);
    assert_eq!(common::load_config_json(&path, &j).unwrap().hgrn2().head_dim, 16);
    // What the layer does not implement is refused by name.
    let j: serde_json::Value = serde_json::from_str(&hgrn2_tiny().to_json()).unwrap();
    for (field, value, want) in [
        ("conv_bias", serde_json::json!(true), "conv_bias true"),
        ("elementwise_affine", serde_json::json!(false), "elementwise_affine is false"),
        ("expand_ratio", serde_json::json!(5), "expand_ratio 5 must divide hidden_size 32"),
        ("num_heads", serde_json::json!(2), "num_heads 2 with expand_ratio 8"),
        ("attn", serde_json::json!({"num_heads": 2}), "hybrid HGRN2"),
        ("attnres_block_size", serde_json::json!(2), "attnres_block_size"),
        ("tie_word_embeddings", serde_json::json!(true), "tie_word_embeddings"),
    ] {
        let mut j = j.clone();
        j[field] = value;
        common::assert_config_json_refused(&path, &j, want);
    }
}

/// The lower bounds as fla computes them: row 0 is 0, row l the softmax over layers summed over
/// rows 1..=l, so the last row is 1 − softmax_0; a bounded layer's gate stays above its bound.
#[test]
fn lower_bounds_are_the_cumulative_softmax_and_bound_the_gates() {
    let mut model = random_model(&hgrn2_tiny(), 4);
    let id = model.lower_bounds.unwrap();
    // Column 0 strongly favours layer 2, column 1 layer 0.
    let raw = &mut model.params.tensors[id.0].data;
    (raw[0], raw[32], raw[64]) = (-3.0, 0.0, 3.0);
    (raw[1], raw[33], raw[65]) = (3.0, 0.0, -3.0);
    let raw = common::param(&model, "model.lower_bounds");
    let p = |l: usize, c: usize| {
        let z: f64 = (0..3).map(|j| (raw[j * 32 + c] as f64).exp()).sum();
        (raw[l * 32 + c] as f64).exp() / z
    };
    let ctx = foxlm::model::Ctx { batch: 1, seq: 8, start: None };
    let ids = common::random_ids(97, 8, 1);
    let be_acts = model.forward_hidden(&ids, &ctx, None, true).1.unwrap();
    let lb = &be_acts.lower_bounds;
    for c in 0..32 {
        assert_eq!(lb[c], 0.0);
        assert!((lb[32 + c] as f64 - p(1, c)).abs() < 1e-6, "row 1 column {c}");
        assert!((lb[64 + c] as f64 - (1.0 - p(0, c))).abs() < 1e-6, "row 2 column {c}");
    }
    assert!(lb[64] > 0.99 && lb[65] < 0.06, "{} {}", lb[64], lb[65]);
    for (li, blk) in be_acts.blocks.iter().enumerate() {
        let foxlm::model::MixerActs::Hgrn2(a) = &blk.mixer else { panic!("layer {li}") };
        for (i, (&g, &f)) in a.g.iter().zip(&a.f).enumerate() {
            let (c, s) = (i % 32, 1.0 / (1.0 + (-f as f64).exp()));
            let b = if li == 0 { 0.0 } else { lb[li * 32 + c] as f64 };
            let want = (b + (1.0 - b) * s).ln();
            assert!((g as f64 - want).abs() < 1e-5 * (1.0 + want.abs()), "layer {li} [{i}]: g {g} vs {want}");
            assert!((a.k[i] as f64 - (1.0 - want.exp())).abs() < 1e-6, "layer {li} [{i}]: k");
        }
    }
}

/// Finite differences of the loss through the whole model: every kind of parameter, the lower
/// bounds (all three rows move the softmax) among them, with and without lower bounds.
#[test]
fn finite_differences_through_the_model() {
    let layer = |i: usize, n: &str| format!("model.layers.{i}.{n}");
    let mut names = vec!["model.embeddings.weight".to_string(), "model.norm.weight".into(), "lm_head.weight".into()];
    for (i, n) in [
        (0, "attn_norm.weight"),
        (1, "attn.q_proj.weight"),
        (2, "attn.f_proj.weight"),
        (0, "attn.f_proj.weight"),
        (1, "attn.i_proj.weight"),
        (2, "attn.g_norm.weight"),
        (0, "attn.o_proj.weight"),
        (1, "mlp_norm.weight"),
        (2, "mlp.gate_proj.weight"),
        (1, "mlp.down_proj.weight"),
    ] {
        names.push(layer(i, n));
    }
    let plain: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    let model = random_model(&unbounded_tiny(), 1);
    assert_eq!(common::finite_differences_with_a_padded_row(&model, &plain), 2 * plain.len());

    names.push("model.lower_bounds".into());
    let bounded: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    let mut model = random_model(&hgrn2_tiny(), 2);
    // Lower bounds spread over (0, 1) (N(0, 0.15) leaves them near 1/3 and 2/3).
    let id = model.lower_bounds.unwrap().0;
    model.params.tensors[id].data.iter_mut().for_each(|x| *x *= 10.0);
    assert_eq!(common::finite_differences_with_a_padded_row(&model, &bounded), 2 * bounded.len());

    for (i, n) in [(0, "attn.q_conv1d.weight"), (1, "attn.f_conv1d.weight"), (2, "attn.i_conv1d.weight")] {
        names.push(layer(i, n));
    }
    let convs: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    let conv_model = random_model(&conv_tiny(), 3);
    // The convolutions curve the loss more: at ε = 1e-2 an embedding entry's O(ε²) error was 2%
    // (−0.3673 against the backward's −0.3598); at 3e-3 and 1e-3 every entry is within tolerance.
    assert_eq!(common::finite_differences_with_a_padded_row_eps(&conv_model, &convs, 3e-3), 2 * convs.len());
    // Every row of the lower bounds gets a gradient (row 0 through the softmax only).
    let ctx = foxlm::model::Ctx { batch: 1, seq: 24, start: None };
    let ids = common::random_ids(97, 24, 3);
    let targets: Vec<Option<u32>> = (0..24).map(|i| (i + 1 < 24).then(|| ids[i + 1])).collect();
    let mut g = model.params.zeros_like();
    model.loss_and_grads(&ids, &targets, &ctx, &mut g, 1.0);
    for row in g[id].chunks(32) {
        assert!(row.iter().any(|&x| x.abs() > 1e-6), "{row:?}");
    }
}

/// Decoding token by token through the state, and prefilling in chunks, give the logits of the
/// full forward; so does a left-padded row.
#[test]
fn state_decoding_chunked_prefill_and_padding_match_the_full_forward() {
    for (cfg, seed) in [(hgrn2_tiny(), 5), (unbounded_tiny(), 6), (conv_tiny(), 8)] {
        let model = random_model(&cfg, seed);
        // Chunks of 2 (shorter than the convolutions' width), of 11, and 70 positions in chunks of 65 (GLA's chunk of 64 crossed within
        // one forward).
        common::inference_state_matches_the_full_forward(&model, &[(2, 30, 6), (11, 30, 6), (65, 70, 7)]);
    }
    // The state's size does not grow with the tokens: S [H, K, K] per layer.
    let s = hgrn2_tiny().hgrn2();
    assert_eq!(foxlm::model::hgrn2::state::Hgrn2State::bytes_for(1, &s), 4 * 4 * 8 * 8);
    assert_eq!(foxlm::validate::kv_cache_bytes(&hgrn2_tiny(), 2, 1000), 2 * 3 * 4 * 4 * 8 * 8);
    // With the convolutions, their last 3 inputs of q, f and i too.
    let s = conv_tiny().hgrn2();
    assert_eq!(foxlm::model::hgrn2::state::Hgrn2State::bytes_for(1, &s), 4 * (4 * 8 * 8 + 3 * 3 * 32));
    assert_eq!(foxlm::validate::kv_cache_bytes(&conv_tiny(), 2, 1000), 2 * 3 * 4 * (4 * 8 * 8 + 3 * 3 * 32));
}

/// Greedy generation through the state equals the argmax of a full forward at every step, alone
/// and as the shorter row of a left-padded batch.
#[test]
fn greedy_generation_matches_full_forwards() {
    common::greedy_generation_matches_full_forwards(&random_model(&hgrn2_tiny(), 7));
    common::greedy_generation_matches_full_forwards(&random_model(&conv_tiny(), 9));
}

/// The authors' HGRN2 initialisation (N(0, 0.02) matrices, o_proj and down_proj divided by
/// √(2·layers), norm weights 1, the lower bounds 0); a fresh model's loss near ln(vocab).
#[test]
fn initialisation() {
    let cfg = hgrn2_tiny();
    let model = foxlm::train::init_model(&cfg, 3);
    let get = |n: &str| common::param(&model, n);
    let std = common::rms;
    let q = std(&get("model.layers.0.attn.f_proj.weight"));
    assert!((q - 0.02).abs() < 0.003, "f_proj std {q}");
    let rescaled = 0.02 / 6f32.sqrt();
    for n in ["model.layers.1.attn.o_proj.weight", "model.layers.2.mlp.down_proj.weight"] {
        let o = std(&get(n));
        assert!((o - rescaled).abs() < 0.15 * rescaled, "{n} std {o} (0.02 / √6)");
    }
    for n in ["model.norm.weight", "model.layers.0.attn_norm.weight", "model.layers.1.attn.g_norm.weight"] {
        assert!(get(n).iter().all(|&v| v == 1.0), "{n}");
    }
    assert!(get("model.lower_bounds").iter().all(|&v| v == 0.0));
    let kinds = &model.params.kinds[model.lower_bounds.unwrap().0];
    assert_eq!(*kinds, foxlm::tensor::ParamKind::NoDecay, "the authors exclude the lower bounds from weight decay");
    common::fresh_loss_is_uniform(&model);
}

/// fla's own HGRN2 (HGRN2ForCausalLM with its kernels in plain PyTorch, computed in float64; see
/// tests/fixtures/README.md): 3 layers with lower bounds, through foxlm's chunked GLA (72
/// positions: a chunk of 64 and one of 8): logits, loss, per-position loss, every parameter's
/// gradient (the lower bounds' among them), greedy tokens through the inference state.
#[test]
fn matches_fla() {
    let root = common::fixtures("fla-hgrn2-tiny");
    let model = common::matches_reference_fixture(&root.join("hgrn2"));
    assert_eq!(model.config.arch(), Arch::Hgrn2);
    assert!(model.lower_bounds.is_some());
}

/// The GPU backend runs HGRN2 (the presets' heads of 128, the small models' of 8 and 32, short
/// convolutions of up to 8 taps) and refuses, by family, only sizes its kernels do not take
/// (heads wider than the decode step's 256 channels): `--device auto` then runs on the CPU with
/// the note and `--device cuda` refuses with it (backend::select_device_for).
#[test]
fn the_gpu_backend_takes_hgrn2_and_names_what_it_cannot_run() {
    for name in foxlm::presets::HGRN2 {
        let cfg = foxlm::presets::preset(name).unwrap().model;
        assert_eq!(foxlm::model::hgrn2::cuda::unsupported(&cfg.hgrn2()), None, "{name}");
    }
    let mut conv = hgrn2_tiny();
    (conv.use_short_conv, conv.conv_size) = (Some(true), Some(8));
    for cfg in [hgrn2_tiny(), unbounded_tiny(), conv] {
        let model = Model::new(&cfg);
        for training in [false, true] {
            assert_eq!(foxlm::model::cuda_plan::unsupported(&model, training), None);
        }
    }
    let mut wide = hgrn2_config(512, 2, 512);
    wide.vocab_size = 97;
    (wide.bos_token_id, wide.eos_token_id) = (None, None);
    wide.validate().unwrap();
    let why = foxlm::model::cuda_plan::unsupported(&Model::new(&wide), true).expect("refused");
    assert!(why.starts_with("HGRN2: ") && why.contains("512") && why.contains("--device cpu"), "{why}");
}

/// An HGRN2 folder is written with fla's tensor names (each MLP's gate_proj and up_proj apart, as
/// fla's GatedMLP holds them; model.lower_bounds) and reads back bit for bit; the fixture's folder
/// (the projection fused) reads too.
#[test]
fn checkpoints_hold_fla_s_names_and_either_form_loads() {
    let dir = tempfile::tempdir().unwrap();
    let model = random_model(&hgrn2_tiny(), 9);
    let out = dir.path().join("hgrn2");
    foxlm::checkpoint::save_model(&model, &model.config, &out).unwrap();
    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for l in 0..3 {
        for half in ["gate_proj", "up_proj"] {
            assert_eq!(st.tensor(&format!("model.layers.{l}.mlp.{half}.weight")).unwrap().shape(), &[48, 32]);
        }
    }
    assert_eq!(st.tensor("model.lower_bounds").unwrap().shape(), &[3, 32]);
    let back = foxlm::checkpoint::load_model(&out).unwrap();
    assert_eq!(back.config.arch(), Arch::Hgrn2);
    for (a, b) in back.params.tensors.iter().zip(&model.params.tensors) {
        assert_eq!(a.data, b.data);
    }
}

/// The short convolutions, which fla's fixture does not have, against an independent NumPy
/// float64 reference written from the definitions (bench/make_hgrn2_numpy_fixture.py; the same
/// reference matches fla's fixture's logits to 1.7e-6): 2 layers with lower bounds and
/// convolutions of 4 taps, 70 positions (GLA's chunk of 64 crossed), row 1 left-padded by 5.
/// Logits at every real position within 1e-4, the loss within 1e-5.
#[test]
fn short_convolutions_match_a_numpy_reference() {
    let dir = common::fixtures("numpy-hgrn2-conv-tiny");
    let model = foxlm::checkpoint::load_model(&dir).unwrap();
    assert_eq!(model.config.hgrn2().conv, Some(4));
    let (b, n, ids) = common::fixture_input_ids(&dir);
    let want = common::f32_tensor(&dir.join("expected.safetensors"), "logits");
    let j = common::expected_json(&dir);
    let start: Vec<usize> = j["start"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    let ctx = foxlm::model::Ctx { batch: b, seq: n, start: Some(start.clone()) };
    let logits = model.forward(&ids, &ctx);
    let v = model.config.vocab_size;
    let mut worst = 0.0f32;
    for (r, &first) in start.iter().enumerate() {
        for i in first..n {
            let at = (r * n + i) * v;
            worst = worst.max(common::max_abs_diff(&logits[at..at + v], &want[at..at + v]));
        }
    }
    assert!(worst < 1e-4, "logits: max |Δ| {worst:.2e}");
    let targets: Vec<Option<u32>> =
        (0..b * n).map(|q| (q % n >= start[q / n] && q % n + 1 < n).then(|| ids[q + 1])).collect();
    let mut g = model.params.zeros_like();
    let loss = model.loss_and_grads(&ids, &targets, &ctx, &mut g, 1.0) as f64;
    let want_loss = j["loss"].as_f64().unwrap();
    assert!((loss - want_loss).abs() < 1e-5, "loss {loss} vs {want_loss}");
}
