//! The Mamba-2 family through the whole model on the CPU: parity with the authors' PyTorch
//! Mamba-2 (tests/fixtures/official-mamba2-tiny: logits, loss, per-position loss, every
//! parameter's gradient, greedy tokens), its config.json and tensor layout, finite differences of
//! every kind of parameter, decoding through the fixed-size state against the full forward,
//! chunked prefill, and left padding.

mod common;

use common::random_recurrent_model as random_model;
use foxlm::config::{Arch, Config};
use foxlm::presets::mamba2_config;

/// A small Mamba-2: d = 32, 2 layers, 4 heads of 16 channels (inner 64), state 8, 2 groups of B
/// and C (2 heads each), convolution width 4, vocabulary 97.
fn tiny_config() -> Config {
    let mut c = mamba2_config(32, 2);
    c.vocab_size = 97;
    (c.num_heads, c.ssm_head_dim, c.state_size, c.n_groups) = (4, Some(16), Some(8), Some(2));
    (c.bos_token_id, c.eos_token_id) = (None, None);
    c.validate().unwrap();
    c
}

#[test]
fn config_layout_and_json_round_trip() {
    let c = tiny_config();
    assert_eq!(c.arch(), Arch::Mamba2);
    let m = common::model_with_its_layout(&c);
    // in_proj: z (64) + xBC (64 + 2·2·8) + dt (4) outputs.
    assert_eq!(common::shape(&m, "backbone.layers.0.mixer.in_proj.weight"), vec![164, 32]);
    assert_eq!(common::shape(&m, "backbone.layers.1.mixer.conv1d.weight"), vec![96, 1, 4]);
    assert!(m.layers.iter().all(|b| b.mlp.is_none()));
    // The authors' config.json, as Python writes it (Infinity in time_step_limit), reads back.
    let mut j: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
    assert_eq!(j["layer_norm_epsilon"], serde_json::json!(1e-5));
    assert_eq!(j["head_dim"], serde_json::json!(16));
    j["time_step_limit"] = serde_json::json!([0.0, "INF"]);
    let text = serde_json::to_string_pretty(&j).unwrap().replace("\"INF\"", "Infinity");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), &text).unwrap();
    let back = Config::load(&dir.path().join("config.json")).unwrap();
    assert_eq!((back.num_heads, back.ssm_head_dim, back.state_size, back.n_groups), (4, Some(16), Some(8), Some(2)));
    assert_eq!(back.norm_eps, 1e-5);
    // What the mixer does not implement is refused by name.
    for (field, value, want) in [
        ("use_bias", serde_json::json!(true), "use_bias"),
        ("time_step_limit", serde_json::json!([0.0, 0.5]), "time_step_limit"),
        ("num_heads", serde_json::json!(6), "num_heads 6 × head_dim 16 must equal expand 2 × hidden_size 32"),
        ("n_groups", serde_json::json!(3), "n_groups is 3; expected a divisor of num_heads 4"),
    ] {
        let mut j: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        j[field] = value;
        common::assert_config_json_refused(&dir.path().join("config.json"), &j, want);
    }
}

/// Finite differences of the loss through the whole model: every kind of Mamba-2 parameter.
#[test]
fn finite_differences_through_the_model() {
    let model = random_model(&tiny_config(), 1);
    let names = [
        "backbone.embeddings.weight",
        "backbone.layers.0.norm.weight",
        "backbone.layers.0.mixer.in_proj.weight",
        "backbone.layers.1.mixer.in_proj.weight",
        "backbone.layers.0.mixer.conv1d.weight",
        "backbone.layers.1.mixer.conv1d.bias",
        "backbone.layers.0.mixer.dt_bias",
        "backbone.layers.1.mixer.A_log",
        "backbone.layers.0.mixer.D",
        "backbone.layers.1.mixer.norm.weight",
        "backbone.layers.0.mixer.out_proj.weight",
        "backbone.norm_f.weight",
        "lm_head.weight",
    ];
    assert_eq!(common::finite_differences_with_a_padded_row(&model, &names), 2 * names.len());
}

/// Decoding token by token through the state, and prefilling in chunks, give the logits of the
/// full forward; so does a left-padded row.
#[test]
fn state_decoding_chunked_prefill_and_padding_match_the_full_forward() {
    let cfg = tiny_config();
    let model = random_model(&cfg, 5);
    // Chunks of 2 (shorter than the convolution's width) and of 11.
    common::inference_state_matches_the_full_forward(&model, &[(2, 30, 6), (11, 30, 6)]);

    // The state's size does not grow with the tokens.
    let bytes = foxlm::model::mamba2::state::Mamba2State::bytes_for(1, &cfg.mamba2());
    assert_eq!(bytes, 4 * (4 * 16 * 8 + 3 * 96));
}

/// Greedy generation through the state equals the argmax of a full forward at every step, alone
/// and as the shorter row of a left-padded batch.
#[test]
fn greedy_generation_matches_full_forwards() {
    common::greedy_generation_matches_full_forwards(&random_model(&tiny_config(), 7));
}

/// The authors' Mamba-2 (their Mamba2ForCausalLM, computed in float64; see the fixture's
/// README) through foxlm's chunked SSD (chunks of 64 over 96 positions: two chunks, where the
/// fixture ran one of 256).
#[test]
fn matches_the_authors_mamba2() {
    let model = common::matches_reference_fixture(&common::fixtures("official-mamba2-tiny/mamba2"));
    assert_eq!(model.config.arch(), Arch::Mamba2);
}

/// The authors' initialisation: A = −(1..H), D = 1, every RMSNorm weight 1 (the final norm_f
/// included: at 0 every logit is 0 at step 0), dt = softplus(dt_bias)
/// within [time_step_min, time_step_max], and a fresh model's loss near ln(vocab) but not equal
/// to it (the logits are not all zero).
#[test]
fn initialisation() {
    let cfg = tiny_config();
    let model = foxlm::train::init_model(&cfg, 3);
    let get = |n: &str| common::param(&model, n);
    let a_log = get("backbone.layers.0.mixer.A_log");
    assert!(a_log.iter().enumerate().all(|(h, &v)| (v - ((h + 1) as f32).ln()).abs() < 1e-6));
    assert!(get("backbone.layers.1.mixer.D").iter().all(|&v| v == 1.0));
    for n in ["backbone.norm_f.weight", "backbone.layers.0.norm.weight", "backbone.layers.1.mixer.norm.weight"] {
        assert!(get(n).iter().all(|&v| v == 1.0), "{n}");
    }
    common::assert_dt_in_time_step_range(&get("backbone.layers.0.mixer.dt_bias"));
    let ids: Vec<u32> = (0..32).map(|i| (i * 7 % cfg.vocab_size) as u32).collect();
    let logits = model.forward(&ids, &foxlm::model::Ctx { batch: 1, seq: 32, start: None });
    let spread = logits.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
    assert!(spread > 0.05, "a fresh model's logits are all near 0 (max |logit| {spread})");
}
