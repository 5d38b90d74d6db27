//! Grouped-query attention (`num_kv_heads`) and sliding-window attention (`window_size`) through
//! the whole CPU model: against the equivalent multi-head model, against full attention and a
//! truncated context, finite differences, and decoding through the KV cache.

mod common;

use foxlm::config::Config;
use foxlm::eval::gates;
use foxlm::model::{Ctx, Model};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::StandardNormal;
use std::path::PathBuf;

fn fixture_config(v: &str) -> Config {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/official-fox-tiny").join(v);
    serde_json::from_str(&std::fs::read_to_string(p.join("config.json")).unwrap()).unwrap()
}

/// A tiny model of a fixture's variant: 4 heads of 8, `kv` k/v heads, window `w`.
fn tiny(v: &str, layers: usize, kv: Option<usize>, w: Option<usize>, acp: bool) -> Config {
    let mut c = fixture_config(v);
    c.vocab_size = 61;
    c.hidden_size = 32;
    c.num_heads = 4;
    c.num_hidden_layers = layers;
    c.intermediate_size = Some(48);
    c.num_kv_heads = kv;
    c.window_size = w;
    c.log_pruning_tolerance = acp.then_some(-10.0);
    c.validate().unwrap();
    c
}

/// Random weights: matrices N(0, 0.3), norm weights around 1, gate biases spread so that some
/// heads forget fast.
fn random_model(cfg: &Config, seed: u64) -> Model {
    let mut m = Model::new(cfg);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for (i, name) in m.params.names.clone().iter().enumerate() {
        for x in m.params.tensors[i].data.iter_mut() {
            let z: f32 = rng.sample(StandardNormal);
            *x = if name.ends_with("norm.weight") {
                1.0 + 0.3 * z
            } else if name.ends_with("fgate_proj.bias") {
                -1.0 + z
            } else {
                0.3 * z
            };
        }
    }
    m
}

/// The multi-head model equal to a GQA model: every k/v-head tensor (k_proj, v_proj rows, their
/// KV-shift gates, k_norm) repeated for each query head of its group.
fn repeat_kv_heads(gqa: &Model) -> Model {
    let c = &gqa.config;
    let (h, hkv) = (c.num_heads, c.kv_heads());
    let mut mha = Model::new(&Config { num_kv_heads: None, ..c.clone() });
    for (i, name) in mha.params.names.clone().iter().enumerate() {
        let src = &gqa.params.tensors[gqa.params.id(name).unwrap().0];
        let dst = &mut mha.params.tensors[i];
        if src.shape == dst.shape {
            dst.data.copy_from_slice(&src.data);
            continue;
        }
        // rows of one head: hd rows of a projection, 1 row of a shift gate, hd entries of k_norm
        let per_head = src.data.len() / hkv;
        assert_eq!(dst.data.len(), per_head * h, "{name}");
        for hi in 0..h {
            let g = hi / (h / hkv);
            dst.data[hi * per_head..(hi + 1) * per_head].copy_from_slice(&src.data[g * per_head..(g + 1) * per_head]);
        }
    }
    mha
}

/// The GQA gradient of a repeated tensor: the sum over each group of the MHA gradient's heads.
fn sum_groups(g: &[f32], h: usize, hkv: usize) -> Vec<f32> {
    let per_head = g.len() / h;
    let mut out = vec![0.0f32; per_head * hkv];
    for hi in 0..h {
        let k = hi / (h / hkv);
        for (o, x) in out[k * per_head..(k + 1) * per_head].iter_mut().zip(&g[hi * per_head..(hi + 1) * per_head]) {
            *o += x;
        }
    }
    out
}

/// The same weights with another window (a window adds no parameter).
fn with_window(m: &Model, w: Option<usize>) -> Model {
    let mut out = Model::new(&Config { window_size: w, ..m.config.clone() });
    out.params = m.params.clone();
    out
}

fn rel_err(g: &[f32], r: &[f32]) -> f64 {
    assert_eq!(g.len(), r.len());
    let num: f64 = g.iter().zip(r).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum();
    let den: f64 = r.iter().map(|&x| (x as f64).powi(2)).sum();
    (num / den.max(1e-60)).sqrt()
}

fn next_token_targets(ids: &[u32], b: usize, t: usize, start: &[usize]) -> Vec<Option<u32>> {
    (0..b * t).map(|r| (r % t + 1 < t && r % t >= start[r / t]).then(|| ids[r + 1])).collect()
}

fn random_ids(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(0..vocab as u32)).collect()
}

#[test]
fn gqa_with_repeated_kv_heads_equals_the_multi_head_model() {
    // KV-shift, per-head QK-norm, output gate and norm (fox_pro); RoPE (transformer_pro); the
    // LLaMA layout; with and without a window and ACP
    for (v, kv, w, acp) in [
        ("fox_pro", 2, None, false),
        ("fox_pro", 1, Some(9), true),
        ("transformer_pro", 2, Some(20), false),
        ("fox_llama", 2, None, true),
    ] {
        let gqa = random_model(&tiny(v, 2, Some(kv), w, acp), 7);
        let mha = repeat_kv_heads(&gqa);
        let (b, t) = (2, 150);
        let start = vec![0, 13];
        let ids = random_ids(8, b * t, 61);
        let ctx = Ctx { batch: b, seq: t, start: Some(start.clone()) };
        let (lg, lm) = (gqa.forward(&ids, &ctx), mha.forward(&ids, &ctx));
        let e = rel_err(&lg, &lm);
        assert!(e < 1e-5, "{v} kv {kv} w {w:?}: logits differ by {e:.2e}");

        let targets = next_token_targets(&ids, b, t, &start);
        let (mut gg, mut gm) = (gqa.params.zeros_like(), mha.params.zeros_like());
        let loss_g = gqa.loss_and_grads(&ids, &targets, &ctx, &mut gg, 1.0);
        let loss_m = mha.loss_and_grads(&ids, &targets, &ctx, &mut gm, 1.0);
        assert!((loss_g - loss_m).abs() < 1e-5, "{v}: loss {loss_g} vs {loss_m}");
        for (i, name) in gqa.params.names.iter().enumerate() {
            let j = mha.params.id(name).unwrap().0;
            let want = if gg[i].len() == gm[j].len() { gm[j].clone() } else { sum_groups(&gm[j], 4, kv) };
            let e = rel_err(&gg[i], &want);
            assert!(e < 1e-4, "{v} kv {kv} w {w:?}: grad {name} differs by {e:.2e}");
        }
    }
}

#[test]
fn a_window_of_at_least_t_is_full_attention() {
    for v in ["fox_pro", "fox_llama"] {
        let (b, t) = (2, 90);
        let full = random_model(&tiny(v, 2, Some(2), None, false), 11);
        let win = with_window(&full, Some(t));
        let start = vec![0, 30];
        let ids = random_ids(12, b * t, 61);
        let ctx = Ctx { batch: b, seq: t, start: Some(start.clone()) };
        assert_eq!(full.forward(&ids, &ctx), win.forward(&ids, &ctx), "{v}");
        let targets = next_token_targets(&ids, b, t, &start);
        let (mut g0, mut g1) = (full.params.zeros_like(), win.params.zeros_like());
        full.loss_and_grads(&ids, &targets, &ctx, &mut g0, 1.0);
        win.loss_and_grads(&ids, &targets, &ctx, &mut g1, 1.0);
        assert_eq!(g0, g1, "{v}");
    }
}

/// One layer without KV-shift or RoPE: a token's attention input depends on that token alone and
/// the gate bias c_i − c_j only on the tokens in (j, i], so a window of w gives at position i
/// exactly what full attention gives on the last w tokens alone.
#[test]
fn a_window_equals_full_attention_over_the_last_w_tokens() {
    for (kv, w) in [(4, 7), (2, 1), (1, 16)] {
        let cfg = tiny("fox_llama", 1, Some(kv), Some(w), false);
        let win = random_model(&cfg, 21);
        let full = with_window(&win, None);
        let t = 40;
        let ids = random_ids(22, t, 61);
        let logits = win.forward(&ids, &Ctx { batch: 1, seq: t, start: None });
        let vocab = 61;
        for i in 0..t {
            let lo = (i + 1).saturating_sub(w);
            let sub = &ids[lo..=i];
            let r = full.forward(sub, &Ctx { batch: 1, seq: sub.len(), start: None });
            let want = &r[(sub.len() - 1) * vocab..];
            let e = rel_err(&logits[i * vocab..(i + 1) * vocab], want);
            assert!(e < 1e-5, "kv {kv} w {w}: position {i} differs from its window alone by {e:.2e}");
        }
    }
}

/// Central differences of the loss through a GQA + window model with ACP on.
#[test]
fn finite_differences_with_gqa_window_and_acp() {
    let cfg = tiny("fox_pro", 2, Some(2), Some(50), true);
    let model = random_model(&cfg, 31);
    let (b, t) = (2, 200);
    let start = vec![0, 17];
    let ids = random_ids(32, b * t, 61);
    let targets = next_token_targets(&ids, b, t, &start);
    let ctx = Ctx { batch: b, seq: t, start: Some(start) };
    let names = [
        "model.layers.0.attn.k_proj.linear.weight",
        "model.layers.1.attn.v_proj.linear.weight",
        "model.layers.0.attn.k_proj.shift_proj.weight",
        "model.layers.1.attn.v_proj.shift_proj.weight",
        "model.layers.0.attn.k_norm.weight",
        "model.layers.1.attn.q_proj.weight",
        "model.layers.0.attn.fgate_proj.bias",
        "model.layers.1.attn.fgate_proj.weight",
    ];
    // as the ACP finite-difference test of tests/gradients.rs
    common::batch_finite_differences(&model, (&ids, &targets, &ctx), &names, 1e-2);
}

/// Prefill and then single tokens through the KV cache (H_kv heads, the window reaching back
/// into the cache) give the full forward's hidden states.
#[test]
fn decoding_through_the_cache_matches_the_full_forward() {
    for (v, kv, w) in [("fox_pro", 2, Some(6)), ("transformer_pro", 1, Some(25)), ("fox_pro", 1, None)] {
        let model = random_model(&tiny(v, 2, Some(kv), w, false), 41);
        let (b, t, prefill) = (2, 40, 18);
        let start = vec![0, 5];
        let ids = random_ids(42, b * t, 61);
        let d = model.config.hidden_size;
        let (full, _) = model.forward_hidden(&ids, &Ctx { batch: b, seq: t, start: Some(start.clone()) }, None, false);
        let mut cache = model.new_cache(b, t, Some(start.clone()));
        let chunk = |from: usize, to: usize| -> Vec<u32> {
            (0..b).flat_map(|bi| ids[bi * t + from..bi * t + to].to_vec()).collect()
        };
        let ctx = Ctx { batch: b, seq: prefill, start: Some(start.clone()) };
        let (h0, _) = model.forward_hidden(&chunk(0, prefill), &ctx, Some(&mut cache), false);
        let mut got = vec![Vec::new(); b];
        for (bi, g) in got.iter_mut().enumerate() {
            g.extend_from_slice(&h0[bi * prefill * d..(bi + 1) * prefill * d]);
        }
        for pos in prefill..t {
            let ctx = Ctx { batch: b, seq: 1, start: Some(start.clone()) };
            let (h1, _) = model.forward_hidden(&chunk(pos, pos + 1), &ctx, Some(&mut cache), false);
            for (bi, g) in got.iter_mut().enumerate() {
                g.extend_from_slice(&h1[bi * d..(bi + 1) * d]);
            }
        }
        for bi in 0..b {
            // the padded positions of row 1 are not compared
            let from = start[bi] * d;
            let e = rel_err(&got[bi][from..], &full[bi * t * d + from..(bi + 1) * t * d]);
            assert!(e < 1e-5, "{v} kv {kv} w {w:?}: row {bi}: cached decoding differs by {e:.2e}");
        }
    }
}

/// The attention maps of `foxlm viz` read k/v head h / (H / H_kv) and the window: P·V is the
/// layer's output o, and nothing left of the window has mass.
#[test]
fn attention_maps_follow_gqa_and_the_window() {
    let (kv, w, t) = (2, 9, 30);
    let model = random_model(&tiny("fox_pro", 1, Some(kv), Some(w), false), 51);
    let ids = random_ids(52, t, 61);
    let (_, acts) = model.forward_hidden(&ids, &Ctx { batch: 1, seq: t, start: None }, None, true);
    let acts = acts.unwrap();
    let a = acts.blocks[0].attn().expect("an attention layer");
    let (h, hd) = (4, model.config.head_dim());
    for head in 0..h {
        let p = gates::attention_map(&a.q, &a.k, &a.c, h, kv, hd, Some(w), head, t);
        let hk = head / (h / kv);
        for i in 0..t {
            let row = &p[i * t..(i + 1) * t];
            assert!(row[..(i + 1).saturating_sub(w)].iter().all(|&x| x == 0.0), "head {head} row {i}");
            for c in 0..hd {
                let o: f64 = (0..=i).map(|j| row[j] as f64 * a.v[(j * kv + hk) * hd + c] as f64).sum();
                let want = a.o[(i * h + head) * hd + c] as f64;
                assert!((o - want).abs() < 1e-4, "head {head} row {i}: P·V {o} vs o {want}");
            }
        }
    }
}
