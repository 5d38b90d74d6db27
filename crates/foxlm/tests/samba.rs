//! Samba through the whole model on the CPU: its config.json and tensor layout (the authors'
//! SambaForCausalLM names), refusals by field, finite differences of every kind of parameter
//! (Mamba, sliding-window attention, both MLP widths) with a left-padded row, decoding through
//! the states (KV caches and Mamba states) and chunked prefill against the full forward, left
//! padding, greedy generation, the window's effect, and a few training steps.

mod common;

use common::{max_abs_diff, random_ids as ids, random_recurrent_model as random_model, shape};
use foxlm::config::{Arch, Config};
use foxlm::model::{Ctx, Mixer, Model};
use foxlm::presets::{preset, samba_config};

/// A small Samba: d = 32, 4 layers (Mamba, attention, Mamba, attention), attention 4 heads of 8
/// with 2 k/v heads (GQA) and a window of 8, Mamba inner width 64 (two 32-channel scan blocks),
/// state 8, dt rank 2 (ceil(32/16)), conv width 4, vocabulary 97.
fn tiny_config() -> Config {
    let mut c = samba_config(32, 4, 4, 8);
    c.vocab_size = 97;
    c.attn.as_mut().unwrap().num_kv_heads = Some(2);
    c.state_size = Some(8);
    (c.bos_token_id, c.eos_token_id) = (None, None);
    c.validate().unwrap();
    c
}

#[test]
fn config_layout_and_json_round_trip() {
    let c = tiny_config();
    assert_eq!(c.arch(), Arch::Samba);
    let m = common::model_with_its_layout(&c);
    // Even layers Mamba, odd layers attention, each block with its MLP.
    let kinds: Vec<&str> = m
        .layers
        .iter()
        .map(|b| match &b.mixer {
            Mixer::Mamba(_) => "mamba",
            Mixer::Attention(_) => "attention",
            Mixer::Mamba2(_) => "mamba2",
            Mixer::DeltaNet(_) => "deltanet",
            Mixer::Hgrn2(_) => "hgrn2",
        })
        .collect();
    assert_eq!(kinds, ["mamba", "attention", "mamba", "attention"]);
    assert!(m.layers.iter().all(|b| b.mlp.is_some()));
    // The authors' names and shapes (SambaForCausalLM: backbone.*, fla's MambaMixer, Attention).
    assert_eq!(shape(&m, "backbone.embeddings.weight"), [97, 32]);
    assert_eq!(shape(&m, "backbone.layers.0.mixer_norm.weight"), [32]);
    assert_eq!(shape(&m, "backbone.layers.0.mixer.in_proj.weight"), [128, 32]);
    assert_eq!(shape(&m, "backbone.layers.0.mixer.conv1d.weight"), [64, 1, 4]);
    assert_eq!(shape(&m, "backbone.layers.0.mixer.conv1d.bias"), [64]);
    assert_eq!(shape(&m, "backbone.layers.0.mixer.x_proj.weight"), [2 + 16, 64]);
    assert_eq!(shape(&m, "backbone.layers.2.mixer.dt_proj.weight"), [64, 2]);
    assert_eq!(shape(&m, "backbone.layers.2.mixer.dt_proj.bias"), [64]);
    assert_eq!(shape(&m, "backbone.layers.2.mixer.A_log"), [64, 8]);
    assert_eq!(shape(&m, "backbone.layers.2.mixer.D"), [64]);
    assert_eq!(shape(&m, "backbone.layers.2.mixer.out_proj.weight"), [32, 64]);
    assert_eq!(shape(&m, "backbone.layers.1.mixer.q_proj.weight"), [32, 32]);
    assert_eq!(shape(&m, "backbone.layers.1.mixer.k_proj.weight"), [16, 32]);
    assert_eq!(shape(&m, "backbone.layers.1.mixer.v_proj.weight"), [16, 32]);
    assert_eq!(shape(&m, "backbone.layers.3.mixer.o_proj.weight"), [32, 32]);
    assert_eq!(shape(&m, "backbone.layers.3.mlp_norm.weight"), [32]);
    assert_eq!(shape(&m, "backbone.layers.3.mlp.gate_proj.weight"), [512, 32]);
    assert_eq!(shape(&m, "backbone.layers.3.mlp.down_proj.weight"), [32, 256]);
    assert_eq!(shape(&m, "backbone.norm_f.weight"), [32]);
    assert_eq!(shape(&m, "lm_head.weight"), [97, 32]);
    let a = m.layers[1].attn().unwrap();
    assert_eq!((a.heads, a.kv_heads, a.head_dim, a.window, a.rope_base), (4, 2, 8, Some(8), Some(500000.0)));
    assert!(a.qk_norm.is_none() && a.ogate_proj.is_none() && a.output_norm.is_none());
    assert!(matches!(a.fgate, foxlm::model::attention::Fgate::None));

    // config.json: the authors' field names, FoX's switches absent, and it reads back equal.
    let j: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
    assert_eq!(j["model_type"], "samba-project_fox");
    assert_eq!(j["attn"], serde_json::json!({"num_heads": 4, "num_kv_heads": 2, "window_size": 8, "layers": null}));
    assert_eq!((j["attn_hidden_ratio"].as_f64(), j["mamba_hidden_ratio"].as_f64()), (Some(4.0), Some(3.0)));
    assert_eq!((j["state_size"].as_u64(), j["intermediate_size"].as_u64()), (Some(8), Some(64)));
    assert_eq!(j["time_step_rank"], "auto");
    assert_eq!(j["norm_eps"].as_f64(), Some(1e-5));
    for absent in ["num_heads", "fgate_type", "use_rope", "qk_norm", "hidden_ratio", "window_size"] {
        assert!(j.get(absent).is_none(), "{absent} written in a Samba config.json");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, c.to_json()).unwrap();
    assert_eq!(Config::load(&path).unwrap(), c);
    // An explicit dt rank.
    let mut j2 = j.clone();
    j2["time_step_rank"] = serde_json::json!(5);
    let c5 = common::load_config_json(&path, &j2).unwrap();
    assert_eq!(c5.mamba().dt_rank, 5);
    assert_eq!(shape(&Model::new(&c5), "backbone.layers.0.mixer.x_proj.weight"), [5 + 16, 64]);

    // What the model does not implement, or inconsistent sizes, are refused by name.
    for (field, value, want) in [
        ("attn.layers", serde_json::json!([1, 3]), "attn.layers is [1,3]; only null"),
        ("attn.num_heads", serde_json::json!(5), "hidden_size 32 must be a multiple of attn.num_heads 5"),
        ("attn.num_kv_heads", serde_json::json!(3), "attn.num_kv_heads is 3"),
        ("attn.window_size", serde_json::json!(0), "attn.window_size is 0"),
        ("intermediate_size", serde_json::json!(100), "intermediate_size is 100"),
        ("time_step_rank", serde_json::json!("big"), "time_step_rank is \"big\""),
        ("use_bias", serde_json::json!(true), "use_bias"),
        ("qk_norm", serde_json::json!(true), "qk_norm is true"),
        ("mamba_hidden_ratio", serde_json::json!(-1.0), "mamba_hidden_ratio is -1.0"),
        ("time_step_init_scheme", serde_json::json!("zeros"), "time_step_init_scheme"),
    ] {
        let mut j = j.clone();
        match field.split_once('.') {
            Some((outer, inner)) => j[outer][inner] = value,
            None => j[field] = value,
        }
        common::assert_config_json_refused(&path, &j, want);
    }
    let mut j3 = j.clone();
    j3.as_object_mut().unwrap().remove("attn");
    let e = common::err(common::load_config_json(&path, &j3));
    assert!(e.contains("attn is missing"), "{e}");
}

/// The presets: sizes, MLP widths by block kind, dt rank, and the small one's parameter count
/// against the small FoX (LLaMA).
#[test]
fn presets_are_sized_as_documented() {
    let p = preset("samba-760m").unwrap();
    let c = &p.model;
    assert_eq!((c.hidden_size, c.num_hidden_layers, c.samba_attn()), (1536, 24, (12, 12, Some(2048))));
    assert_eq!((c.samba_mlp_width(true), c.samba_mlp_width(false)), (4096, 3072));
    assert_eq!((c.mamba().inner, c.mamba().state, c.mamba().dt_rank), (3072, 16, 96));
    assert_eq!((p.train.peak_lr, p.train.total_tokens), (1e-3, 15 << 30));
    for n in ["samba-125m", "samba-360m", "samba-760m", "samba-small"] {
        let p = preset(n).unwrap();
        p.model.validate().unwrap();
        let m = Model::new(&p.model);
        assert_eq!(p.model.param_bytes(), 4 * m.params.numel() as u128, "{n}");
    }
    let small = Model::new(&preset("samba-small").unwrap().model).params.numel() as f64;
    let fox = Model::new(&preset("fox-llama-small").unwrap().model).params.numel() as f64;
    assert!((small - fox).abs() / fox < 0.006, "samba-small {small} against fox-llama-small {fox}");
    let s = preset("samba-small").unwrap().model;
    assert_eq!((s.samba_mlp_width(true), s.samba_mlp_width(false), s.samba_attn().2), (1024, 768, Some(512)));
}

/// Finite differences of the loss through the whole model: every kind of parameter.
#[test]
fn finite_differences_through_the_model() {
    let model = random_model(&tiny_config(), 1);
    let names = [
        "backbone.embeddings.weight",
        "backbone.layers.0.mixer_norm.weight",
        "backbone.layers.0.mixer.conv1d.weight",
        "backbone.layers.2.mixer.conv1d.bias",
        "backbone.layers.0.mixer.in_proj.weight",
        "backbone.layers.2.mixer.x_proj.weight",
        "backbone.layers.0.mixer.dt_proj.weight",
        "backbone.layers.2.mixer.dt_proj.bias",
        "backbone.layers.0.mixer.A_log",
        "backbone.layers.2.mixer.D",
        "backbone.layers.0.mixer.out_proj.weight",
        "backbone.layers.1.mixer.q_proj.weight",
        "backbone.layers.3.mixer.k_proj.weight",
        "backbone.layers.1.mixer.v_proj.weight",
        "backbone.layers.3.mixer.o_proj.weight",
        "backbone.layers.0.mlp_norm.weight",
        "backbone.layers.0.mlp.gate_proj.weight",
        "backbone.layers.1.mlp.down_proj.weight",
        "backbone.norm_f.weight",
        "lm_head.weight",
    ];
    assert_eq!(common::finite_differences_with_a_padded_row(&model, &names), 2 * names.len());
}

/// Decoding token by token through the states, and prefilling in chunks, give the logits of the
/// full forward (the sequence is longer than the window); so does a left-padded row.
#[test]
fn state_decoding_chunked_prefill_and_padding_match_the_full_forward() {
    let cfg = tiny_config();
    let model = random_model(&cfg, 5);
    // Chunks of 2 (shorter than the convolution's width), 11 (longer than the window) and 70
    // (past the scan's 64-position chunk on a longer sequence).
    let cache = common::inference_state_matches_the_full_forward(&model, &[(2, 30, 16), (11, 30, 16), (70, 100, 16)]);
    assert!(cache.layers.iter().all(|l| l.len() == 30));

    // A Mamba layer's state does not grow with the tokens: [Di, N] + [W − 1, Di] per row.
    let bytes = foxlm::model::mamba::state::MambaState::bytes_for(1, &cfg.mamba());
    assert_eq!(bytes, 4 * (64 * 8 + 3 * 64));
}

/// The attention layers honour the window: with the same weights, a longer window leaves the
/// logits of the first w positions as they are (every key is inside both windows) and changes
/// the later ones.
#[test]
fn the_window_bounds_what_attention_sees() {
    let cfg = tiny_config();
    let model = random_model(&cfg, 11);
    let mut wide_cfg = cfg.clone();
    wide_cfg.attn.as_mut().unwrap().window_size = Some(64);
    let mut wide = Model::new(&wide_cfg);
    wide.params = model.params.clone();
    let t = 24;
    let seq = ids(cfg.vocab_size, t, 12);
    let ctx = Ctx { batch: 1, seq: t, start: None };
    let (a, b) = (model.forward(&seq, &ctx), wide.forward(&seq, &ctx));
    let v = cfg.vocab_size;
    assert!(max_abs_diff(&a[..8 * v], &b[..8 * v]) < 1e-5, "positions inside the window");
    for i in 8..t {
        let e = max_abs_diff(&a[i * v..(i + 1) * v], &b[i * v..(i + 1) * v]);
        assert!(e > 1e-3, "position {i} past the window is unchanged ({e:.2e})");
    }
}

/// Greedy generation through the states equals the argmax of a full forward at every step, alone
/// and as the shorter row of a left-padded batch; it runs past the window.
#[test]
fn greedy_generation_matches_full_forwards() {
    common::greedy_generation_matches_full_forwards(&random_model(&tiny_config(), 7));
}

/// The authors' initialisation: A = 1..N per channel, D = 1, δ at init within
/// [time_step_min, time_step_max], norms 1, the residual outputs rescaled; and a few training
/// steps on CPU lower the loss on a fixed batch.
#[test]
fn initialisation_and_a_few_training_steps() {
    let cfg = tiny_config();
    let model = foxlm::train::init_model(&cfg, 3);
    let get = |n: &str| common::param(&model, n);
    let a_log = get("backbone.layers.0.mixer.A_log");
    assert!(a_log.chunks(8).all(|r| r.iter().enumerate().all(|(n, &v)| (v - ((n + 1) as f32).ln()).abs() < 1e-6)));
    assert!(get("backbone.layers.2.mixer.D").iter().all(|&v| v == 1.0));
    common::assert_dt_in_time_step_range(&get("backbone.layers.0.mixer.dt_proj.bias"));
    assert!(get("backbone.layers.1.mlp_norm.weight").iter().all(|&v| v == 1.0));
    // The final norm too (at 0 every logit is 0 at step 0).
    assert!(get("backbone.norm_f.weight").iter().all(|&v| v == 1.0));
    let bound = |n: &str| get(n).iter().fold(0.0f32, |a, &v| a.max(v.abs()));
    // o_proj U(±1/√d / √(2·4)), q_proj U(±1/√d), dt_proj U(±1/√R).
    assert!(bound("backbone.layers.1.mixer.o_proj.weight") <= 1.0 / 32f32.sqrt() / 8f32.sqrt());
    assert!(bound("backbone.layers.1.mixer.q_proj.weight") > 1.0 / 32f32.sqrt() / 8f32.sqrt());
    assert!(bound("backbone.layers.0.mixer.dt_proj.weight") <= 1.0 / 2f32.sqrt());

    // AdamW (the trainer's optimizer, lr 1e-2) on one batch: the loss must fall.
    let mut model = model;
    let mut opt = foxlm::optim::AdamW::new(
        foxlm::optim::AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 },
        &model.params,
    );
    let (b, t) = (2, 32);
    let ids = ids(cfg.vocab_size, b * t, 4);
    let ctx = Ctx { batch: b, seq: t, start: None };
    let targets: Vec<Option<u32>> = (0..b * t).map(|r| (r % t + 1 < t).then(|| ids[r + 1])).collect();
    let mut losses = Vec::new();
    for _ in 0..25 {
        let mut g = model.params.zeros_like();
        losses.push(model.loss_and_grads(&ids, &targets, &ctx, &mut g, 1.0));
        opt.update(&mut model.params, &g, 1e-2);
    }
    assert!(losses.iter().all(|l| l.is_finite()));
    assert!(losses[24] < losses[0] - 1.0, "losses {losses:?}");
}

/// A config.json as the authors' SambaConfig.save_pretrained writes it (time_step_rank resolved
/// to a number, intermediate_size the Mamba width, Hugging Face's own keys) loads, builds the
/// authors' layout, and a saved model round-trips through `foxlm inspect` and `load_model`.
#[test]
fn the_authors_config_json_loads_and_a_saved_model_inspects() {
    let text = r#"{
      "architectures": ["SambaForCausalLM"],
      "attn": {"layers": null, "num_heads": 4, "num_kv_heads": 2, "window_size": 16},
      "attn_hidden_ratio": 4, "mamba_hidden_ratio": 3,
      "bos_token_id": null, "eos_token_id": null, "pad_token_id": null,
      "conv_kernel": 4, "expand": 2, "fuse_cross_entropy": false, "fuse_norm": false,
      "hidden_act": "silu", "hidden_size": 64, "initializer_range": 0.02,
      "intermediate_size": 128, "max_position_embeddings": 2048,
      "model_type": "samba-project_fox", "norm_eps": 1e-05, "num_hidden_layers": 4,
      "rescale_prenorm_residual": true, "residual_in_fp32": false, "rope_base": 10000.0,
      "state_size": 16, "tie_word_embeddings": false, "time_step_floor": 0.0001,
      "time_step_init_scheme": "random", "time_step_max": 0.1, "time_step_min": 0.001,
      "time_step_rank": 4, "time_step_scale": 1.0, "transformers_version": "5.17.0",
      "use_bias": false, "use_cache": false, "use_conv_bias": true, "vocab_size": 256
    }"#;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), text).unwrap();
    let c = Config::load(&dir.path().join("config.json")).unwrap();
    assert_eq!(c.arch(), Arch::Samba);
    assert_eq!((c.mamba().inner, c.mamba().state, c.mamba().dt_rank), (128, 16, 4));
    assert_eq!((c.samba_attn(), c.head_dim(), c.rope_base), ((4, 2, Some(16)), 16, 10000.0));
    let m = Model::new(&c);
    assert_eq!(shape(&m, "backbone.layers.0.mixer.x_proj.weight"), [4 + 32, 128]);
    assert_eq!(shape(&m, "backbone.layers.1.mixer.k_proj.weight"), [32, 64]);
    assert_eq!(shape(&m, "backbone.layers.1.mlp.gate_proj.weight"), [512, 64]);
    assert_eq!(shape(&m, "backbone.layers.2.mlp.down_proj.weight"), [64, 256]);

    let model = foxlm::train::init_model(&c, 0);
    let out = dir.path().join("model");
    foxlm::checkpoint::save_model(&model, &c, &out).unwrap();
    let back = foxlm::checkpoint::load_model(&out).unwrap();
    assert_eq!(back.config, c);
    assert_eq!(back.params.tensors[5].data, model.params.tensors[5].data);
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_foxlm"))
        .args(["inspect", "--model", out.to_str().unwrap()])
        .output()
        .unwrap();
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for want in [
        "variant            Samba",
        "sliding window     16 keys",
        "state 16, dt rank 4",
        "256 (attention blocks) / 256 (Mamba blocks)",
    ] {
        assert!(s.contains(want), "{want:?} missing from:\n{s}");
    }
}

/// Continuous batching: rows gathered from separate caches (`Cache::gather_rows`, what the server
/// does between steps: KV caches right-aligned, Mamba states copied) decode as they would in their
/// own caches, past the window.
#[test]
fn gathered_rows_continue_as_in_their_own_caches() {
    use foxlm::model::cache::Cache;
    let cfg = tiny_config();
    let model = random_model(&cfg, 21);
    let v = cfg.vocab_size;
    let prefill = |s: &[u32]| {
        let mut c = model.new_cache(1, 64, None);
        model.forward_hidden(s, &Ctx { batch: 1, seq: s.len(), start: None }, Some(&mut c), false);
        c
    };
    let (a, b) = (ids(v, 13, 22), ids(v, 20, 23));
    let (ca, cb) = (prefill(&a), prefill(&b));
    let mut g = Cache::gather_rows(&[(&ca, 0), (&cb, 0)], 8);
    assert_eq!(g.start, Some(vec![7, 0]));
    let mut own = [ca, cb];
    let mut toks = [5u32, 9];
    for step in 0..4 {
        let (h, _) =
            model.forward_hidden(&toks, &Ctx { batch: 2, seq: 1, start: g.start.clone() }, Some(&mut g), false);
        let got = model.logits(&h);
        for (row, c) in own.iter_mut().enumerate() {
            let (h, _) =
                model.forward_hidden(&toks[row..row + 1], &Ctx { batch: 1, seq: 1, start: None }, Some(c), false);
            let want = model.logits(&h);
            let e = max_abs_diff(&got[row * v..(row + 1) * v], &want);
            assert!(e < 1e-4, "step {step}, row {row}: max |Δ logit| {e:.2e}");
        }
        toks = [(toks[0] * 7 + 1) % v as u32, (toks[1] * 5 + 3) % v as u32];
    }
}

/// The authors' Samba (their SambaForCausalLM with fla's MambaMixer at the commit they used, in
/// float64; attention through SDPA with the window as a mask, flash_attn being absent; see
/// tests/fixtures/README.md): 4 layers (Mamba, windowed attention with 2 k/v heads for 4 query
/// heads and a window of 16, Mamba, attention) over 96 positions, so the window binds.
#[test]
fn matches_the_authors_samba() {
    let model = common::matches_reference_fixture(&common::fixtures("official-samba-tiny/samba"));
    assert_eq!(model.config.arch(), Arch::Samba);
    assert!(matches!(model.layers[0].mixer, Mixer::Mamba(_)) && matches!(model.layers[1].mixer, Mixer::Attention(_)));
}
