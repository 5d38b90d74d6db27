//! The DeltaNet family (DeltaNet and Gated DeltaNet) through the whole model on the CPU: its
//! config.json (fla's field names) and tensor layout, finite differences of every kind of
//! parameter, decoding through the fixed-size state against the full forward, chunked prefill,
//! left padding, greedy generation, and the initialisation.

mod common;

use common::random_recurrent_model as random_model;

/// The finite differences' step: the L2 norms of q and k and the per-head RMSNorm of small
/// outputs curve the loss more than the other families' layers. At ε = 1e-2 the O(ε²) error of
/// a few entries reached 5-20% (embedding 0.494 against the backward's 0.519; a q convolution
/// weight −1.187 against −0.966), and fell to 0.1-0.4% at ε = 1e-3 (0.5188, −0.9699); 2e-3
/// keeps f32 round-off (~1e-7·loss/ε ≈ 2e-4) within the tolerance.
const FD_EPS: f32 = 2e-3;
use foxlm::config::{Arch, Config};
use foxlm::model::Model;
use foxlm::presets::deltanet_config;

/// A small DeltaNet: d = 32, 2 layers, 2 heads of 16 (keys and values), no output gate,
/// vocabulary 97.
fn deltanet_tiny() -> Config {
    let mut c = deltanet_config(32, 2, 2, false);
    c.vocab_size = 97;
    (c.bos_token_id, c.eos_token_id) = (None, None);
    c.intermediate_size = Some(48);
    c.validate().unwrap();
    c
}

/// A small Gated DeltaNet: d = 32, 2 layers, 4 heads with keys of 8 and values of 16 (expand_v
/// 2), the output gate.
fn gated_tiny() -> Config {
    let mut c = deltanet_config(32, 2, 4, true);
    c.vocab_size = 97;
    (c.bos_token_id, c.eos_token_id) = (None, None);
    (c.ssm_head_dim, c.expand_v) = (Some(8), Some(2.0));
    c.intermediate_size = Some(48);
    c.validate().unwrap();
    c
}

#[test]
fn config_layout_and_json_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    for (c, arch) in [(deltanet_tiny(), Arch::DeltaNet), (gated_tiny(), Arch::GatedDeltaNet)] {
        assert_eq!(c.arch(), arch);
        let m = common::model_with_its_layout(&c);
        let shape = |n: &str| common::shape(&m, n);
        // config.json as fla writes it: qk_norm is the string "l2".
        let j: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(j["qk_norm"], serde_json::json!("l2"));
        assert!(j.get("fgate_type").is_none() && j.get("use_rope").is_none(), "FoX's fields in {j}");
        std::fs::write(&path, c.to_json()).unwrap();
        let back = Config::load(&path).unwrap();
        assert_eq!(back.deltanet(), c.deltanet());
        assert_eq!(back.param_layout(), c.param_layout());
        match arch {
            Arch::DeltaNet => {
                assert_eq!(j["model_type"], "delta_net");
                assert_eq!(shape("model.layers.1.attn.q_conv1d.weight"), vec![32, 1, 4]);
                assert_eq!(shape("model.layers.0.attn.o_norm.weight"), vec![16]);
                assert!(m.params.id("model.layers.0.attn.g_proj.weight").is_none());
                assert!(m.params.id("model.layers.0.attn.A_log").is_none());
            }
            _ => {
                assert_eq!(j["model_type"], "gated_deltanet");
                assert_eq!(shape("model.layers.0.attn.q_proj.weight"), vec![32, 32]);
                assert_eq!(shape("model.layers.0.attn.v_proj.weight"), vec![64, 32]);
                assert_eq!(shape("model.layers.0.attn.a_proj.weight"), vec![4, 32]);
                assert_eq!(shape("model.layers.0.attn.g_proj.weight"), vec![64, 32]);
                assert_eq!(shape("model.layers.1.attn.dt_bias"), vec![4]);
                assert_eq!(shape("model.layers.1.attn.o_norm.weight"), vec![16]);
            }
        }
        assert_eq!(shape("model.layers.0.mlp.gate_proj.weight"), vec![96, 32]);
        // What the layer does not implement is refused by name.
        for (field, value, want) in [
            ("qk_norm", serde_json::json!("sum"), "\"l2\""),
            ("qk_activation", serde_json::json!("relu"), "qk_activation \"relu\""),
            ("use_short_conv", serde_json::json!(false), "use_short_conv"),
            ("allow_neg_eigval", serde_json::json!(true), "allow_neg_eigval"),
            ("conv_bias", serde_json::json!(true), "conv_bias"),
            ("num_heads", serde_json::json!(0), "num_heads is 0"),
        ] {
            let mut j = j.clone();
            j[field] = value;
            common::assert_config_json_refused(&path, &j, want);
        }
    }
    // DeltaNet sizes its heads by expand_k / expand_v, which must divide into the heads.
    let mut j: serde_json::Value = serde_json::from_str(&deltanet_tiny().to_json()).unwrap();
    j["num_heads"] = serde_json::json!(3);
    let e = common::err(common::load_config_json(&path, &j));
    assert!(e.contains("expected a positive multiple of num_heads 3"), "{e}");
}

/// Finite differences of the loss through the whole model: every kind of parameter of both.
#[test]
fn finite_differences_through_the_model() {
    let layer = |i: usize, n: &str| format!("model.layers.{i}.{n}");
    let mut names = vec!["model.embeddings.weight".to_string(), "model.norm.weight".into(), "lm_head.weight".into()];
    for (i, n) in [
        (0, "attn_norm.weight"),
        (0, "attn.q_proj.weight"),
        (1, "attn.k_proj.weight"),
        (0, "attn.v_proj.weight"),
        (1, "attn.b_proj.weight"),
        (0, "attn.q_conv1d.weight"),
        (1, "attn.k_conv1d.weight"),
        (0, "attn.v_conv1d.weight"),
        (1, "attn.o_norm.weight"),
        (0, "attn.o_proj.weight"),
        (1, "mlp_norm.weight"),
        (0, "mlp.gate_proj.weight"),
        (1, "mlp.down_proj.weight"),
    ] {
        names.push(layer(i, n));
    }
    let plain: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    let model = random_model(&deltanet_tiny(), 1);
    assert_eq!(common::finite_differences_with_a_padded_row_eps(&model, &plain, FD_EPS), 2 * plain.len());

    for (i, n) in [(0, "attn.a_proj.weight"), (1, "attn.A_log"), (0, "attn.dt_bias"), (1, "attn.g_proj.weight")] {
        names.push(layer(i, n));
    }
    let gated: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
    let model = random_model(&gated_tiny(), 2);
    assert_eq!(common::finite_differences_with_a_padded_row_eps(&model, &gated, FD_EPS), 2 * gated.len());
}

/// Decoding token by token through the state, and prefilling in chunks, give the logits of the
/// full forward; so does a left-padded row.
#[test]
fn state_decoding_chunked_prefill_and_padding_match_the_full_forward() {
    for (cfg, seed) in [(deltanet_tiny(), 5), (gated_tiny(), 6)] {
        let model = random_model(&cfg, seed);
        // Chunks of 2 (shorter than the convolutions' width), of 11, and 70 positions in chunks
        // of 65 (the delta rule's chunk of 64 crossed within one forward).
        common::inference_state_matches_the_full_forward(&model, &[(2, 30, 6), (11, 30, 6), (65, 70, 7)]);
    }
    // The state's size does not grow with the tokens: S [H, K, V] and 3 positions of q, k, v.
    let s = gated_tiny().deltanet();
    let bytes = foxlm::model::deltanet::state::DeltaNetState::bytes_for(1, &s);
    assert_eq!(bytes, 4 * (4 * 8 * 16 + 3 * (32 + 32 + 64)));
}

/// Greedy generation through the state equals the argmax of a full forward at every step, alone
/// and as the shorter row of a left-padded batch.
#[test]
fn greedy_generation_matches_full_forwards() {
    common::greedy_generation_matches_full_forwards(&random_model(&deltanet_tiny(), 7));
    common::greedy_generation_matches_full_forwards(&random_model(&gated_tiny(), 8));
}

/// The authors' DeltaNet initialisation (N(0, 0.02) matrices, o_proj and down_proj divided by
/// √(2·layers), norm weights 1) and fla's decay parameters (A = exp(A_log) in (0, 16),
/// softplus(dt_bias) in [0.001, 0.1]); a fresh model's loss near ln(vocab).
#[test]
fn initialisation() {
    for cfg in [deltanet_tiny(), gated_tiny()] {
        let model = foxlm::train::init_model(&cfg, 3);
        let get = |n: &str| common::param(&model, n);
        let std = common::rms;
        let q = std(&get("model.layers.0.attn.q_proj.weight"));
        assert!((q - 0.02).abs() < 0.003, "q_proj std {q}");
        let o = std(&get("model.layers.1.attn.o_proj.weight"));
        assert!((o - 0.01).abs() < 0.002, "o_proj std {o} (0.02 / √4)");
        let down = std(&get("model.layers.0.mlp.down_proj.weight"));
        assert!((down - 0.01).abs() < 0.002, "down_proj std {down}");
        for n in ["model.norm.weight", "model.layers.0.attn_norm.weight", "model.layers.1.attn.o_norm.weight"] {
            assert!(get(n).iter().all(|&v| v == 1.0), "{n}");
        }
        if cfg.arch() == Arch::GatedDeltaNet {
            for &a in &get("model.layers.0.attn.A_log") {
                assert!(a.exp() > 0.0 && a.exp() <= 16.0, "A {}", a.exp());
            }
            common::assert_dt_in_time_step_range(&get("model.layers.1.attn.dt_bias"));
        }
        common::fresh_loss_is_uniform(&model);
    }
}

/// fla's own DeltaNet and Gated DeltaNet (DeltaNetForCausalLM / GatedDeltaNetForCausalLM with
/// its kernels in plain PyTorch, computed in float64; see tests/fixtures/README.md) through
/// foxlm's chunked delta rule (72 positions: a chunk of 64 and one of 8): logits, loss,
/// per-position loss, every parameter's gradient, greedy tokens through the inference state.
#[test]
fn matches_fla() {
    let root = common::fixtures("fla-deltanet-tiny");
    for (name, arch) in [("deltanet", Arch::DeltaNet), ("gated_deltanet", Arch::GatedDeltaNet)] {
        let model = common::matches_reference_fixture(&root.join(name));
        assert_eq!(model.config.arch(), arch);
    }
}

/// The GPU backend runs DeltaNet and Gated DeltaNet layers whose key heads its kernels take (K ≤
/// 128, as every preset), and refuses wider ones by family: `--device auto` then runs on the CPU
/// with this note and `--device cuda` refuses with it (backend::select_device_for).
#[test]
fn the_gpu_backend_takes_the_presets_and_names_the_family_it_cannot_run() {
    for (cfg, family) in [(deltanet_tiny(), "DeltaNet"), (gated_tiny(), "Gated DeltaNet")] {
        let model = Model::new(&cfg);
        for training in [false, true] {
            assert_eq!(foxlm::model::cuda_plan::unsupported(&model, training), None, "{family}");
        }
        let mut wide = cfg.clone();
        wide.hidden_size = 512;
        wide.num_heads = 2;
        if cfg.arch() == Arch::GatedDeltaNet {
            wide.ssm_head_dim = Some(256);
        }
        wide.validate().unwrap();
        let model = Model::new(&wide);
        for training in [false, true] {
            let why = foxlm::model::cuda_plan::unsupported(&model, training).expect("refused");
            assert!(why.starts_with(&format!("{family}: ")) && why.contains("--device cpu"), "{why}");
        }
    }
    for name in foxlm::presets::DELTANET {
        let p = foxlm::presets::preset(name).unwrap();
        assert_eq!(foxlm::model::deltanet::cuda::unsupported(&p.model.deltanet()), None, "{name}");
    }
}

/// A DeltaNet folder is written with fla's tensor names (each MLP's gate_proj and up_proj apart,
/// [I, d] each, as fla's GatedMLP holds them) and reads back bit for bit; a folder with the
/// projection fused ([2I, d], the FoX authors' DeltaNet and the fla fixture's files) reads too.
#[test]
fn checkpoints_hold_fla_s_mlp_names_and_either_form_loads() {
    let dir = tempfile::tempdir().unwrap();
    for cfg in [deltanet_tiny(), gated_tiny()] {
        let model = random_model(&cfg, 9);
        let out = dir.path().join(&cfg.model_type);
        foxlm::checkpoint::save_model(&model, &cfg, &out).unwrap();
        let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for l in 0..2 {
            for half in ["gate_proj", "up_proj"] {
                let t = st.tensor(&format!("model.layers.{l}.mlp.{half}.weight")).unwrap();
                assert_eq!(t.shape(), &[48, 32]);
            }
        }
        let gate = st.tensor("model.layers.1.mlp.up_proj.weight").unwrap();
        let id = model.params.id("model.layers.1.mlp.gate_proj.weight").unwrap().0;
        let want: Vec<u8> = model.params.tensors[id].data[48 * 32..].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(gate.data(), &want[..], "up_proj holds rows I..2I of the fused projection");
        let back = foxlm::checkpoint::load_model(&out).unwrap();
        for (a, b) in back.params.tensors.iter().zip(&model.params.tensors) {
            assert_eq!(a.data, b.data);
        }
    }
    // Half of a split pair missing is named.
    let root = common::fixtures("fla-deltanet-tiny");
    let out = dir.path().join("broken");
    let model = foxlm::checkpoint::load_model(&root.join("deltanet")).unwrap();
    foxlm::checkpoint::save_model(&model, &model.config, &out).unwrap();
    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let keep: Vec<(String, safetensors::tensor::TensorView)> =
        st.tensors().into_iter().filter(|(n, _)| n != "model.layers.0.mlp.up_proj.weight").collect();
    std::fs::write(out.join("model.safetensors"), safetensors::serialize(keep, None).unwrap()).unwrap();
    let e = format!("{:#}", foxlm::checkpoint::load_model(&out).unwrap_err());
    assert!(e.contains("model.layers.0.mlp.up_proj.weight") && e.contains("missing"), "{e}");
}
