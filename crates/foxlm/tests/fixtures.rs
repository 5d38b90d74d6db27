//! Parity with the authors' PyTorch implementation on the seven tiny fixture models.

mod common;

use common::{
    expected_greedy, expected_json, f32_tensor, fixture, fixture_input_ids, i64_tensor, max_abs_diff, VARIANTS,
};
use foxlm::checkpoint::load_model;
use foxlm::generate::{generate, GenerateOptions};
use foxlm::model::Ctx;
use foxlm::sampling::Sampling;

/// Mean next-token cross-entropy per position over the batch, and overall.
fn losses(logits: &[f32], ids: &[u32], b: usize, t: usize, v: usize) -> (Vec<f32>, f64) {
    let mut per_pos = vec![0.0f64; t - 1];
    for r in 0..b {
        for i in 0..t - 1 {
            let row = &logits[(r * t + i) * v..(r * t + i + 1) * v];
            let lse = fox_kernels::cross_entropy::logsumexp(row) as f64;
            per_pos[i] += (lse - row[ids[r * t + i + 1] as usize] as f64) / b as f64;
        }
    }
    let mean = per_pos.iter().sum::<f64>() / (t - 1) as f64;
    (per_pos.iter().map(|&x| x as f32).collect(), mean)
}

#[test]
fn logits_loss_and_per_position_loss_match_reference() {
    for v in VARIANTS {
        let model = load_model(&fixture(v)).unwrap();
        let exp = fixture(v).join("expected.safetensors");
        let (b, t, ids) = fixture_input_ids(&fixture(v));
        let logits = model.forward(&ids, &Ctx { batch: b, seq: t, start: None });
        let want = f32_tensor(&exp, "logits");
        let d = max_abs_diff(&logits, &want);
        assert!(d < 1e-4, "{v}: logits max abs diff {d}");
        let vocab = model.config.vocab_size;
        let (pp, loss) = losses(&logits, &ids, b, t, vocab);
        let want_loss = expected_json(&fixture(v))["loss"].as_f64().unwrap();
        assert!((loss - want_loss).abs() < 1e-5, "{v}: loss {loss} vs {want_loss}");
        let want_pp = f32_tensor(&exp, "per_position_loss");
        let dpp = max_abs_diff(&pp, &want_pp);
        assert!(dpp < 1e-4, "{v}: per-position loss max diff {dpp}");
        eprintln!("{v}: logits {d:.2e}, loss {:.2e}, per-position {dpp:.2e}", (loss - want_loss).abs());
    }
}

#[test]
fn left_padded_logits_match_reference_at_unmasked_positions() {
    for v in VARIANTS {
        let model = load_model(&fixture(v)).unwrap();
        let exp = fixture(v).join("expected.safetensors");
        let (b, t, ids) = fixture_input_ids(&fixture(v));
        let (_, mask) = i64_tensor(&exp, "attention_mask_left_padded");
        let start: Vec<usize> =
            (0..b).map(|r| mask[r * t..(r + 1) * t].iter().take_while(|&&m| m == 0).count()).collect();
        assert!(start[1] > 0, "fixture row 1 is padded");
        let logits = model.forward(&ids, &Ctx { batch: b, seq: t, start: Some(start.clone()) });
        let want = f32_tensor(&exp, "logits_left_padded");
        let vocab = model.config.vocab_size;
        let mut worst = 0.0f32;
        for (r, &s0) in start.iter().enumerate() {
            for i in s0..t {
                let o = (r * t + i) * vocab;
                worst = worst.max(max_abs_diff(&logits[o..o + vocab], &want[o..o + vocab]));
            }
        }
        assert!(worst < 1e-4, "{v}: left-padded logits max abs diff {worst}");
    }
}

#[test]
fn greedy_continuation_through_kv_cache_matches_reference() {
    for v in VARIANTS {
        let model = load_model(&fixture(v)).unwrap();
        let (_, _, ids) = fixture_input_ids(&fixture(v));
        let (plen, want) = expected_greedy(&expected_json(&fixture(v)));
        let prompt = ids[..plen].to_vec();
        let opts = GenerateOptions { max_new_tokens: want.len(), sampling: Sampling::default(), seed: 0, eos: None };
        let got = generate(&model, std::slice::from_ref(&prompt), &opts, |_, _| {});
        assert_eq!(got[0], want, "{v}: greedy tokens");
        // The same prompt in a batch beside a longer one (left padding) gives the same tokens.
        let longer = ids[..plen + 9].to_vec();
        let got2 = generate(&model, &[longer, prompt], &opts, |_, _| {});
        assert_eq!(got2[1], want, "{v}: greedy tokens of a left-padded row");
    }
}
