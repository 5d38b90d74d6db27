//! Helpers shared by the integration tests.

use foxlm::model::Model;
use std::path::PathBuf;

/// The official-fox-tiny fixtures: the authors' FoX and Transformer variants.
#[allow(unused_imports)]
pub use foxlm::presets::OFFICIAL_FIXTURES as VARIANTS;

/// A folder under the workspace's tests/fixtures.
#[allow(dead_code)]
pub fn fixtures(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(rel)
}

/// The folder of an official-fox-tiny fixture.
#[allow(dead_code)]
pub fn fixture(v: &str) -> PathBuf {
    fixtures("official-fox-tiny").join(v)
}

/// The message of an error that `r` must be, with its causes (`{:#}`).
#[allow(dead_code)]
pub fn err<T>(r: anyhow::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

/// The arguments of `foxlm forward --model model --input input --output output`.
#[allow(dead_code)]
pub fn forward_args<'a>(
    model: &'a std::path::Path,
    input: &'a std::path::Path,
    output: &'a std::path::Path,
) -> [&'a str; 7] {
    let s = |p: &'a std::path::Path| p.to_str().unwrap();
    ["forward", "--model", s(model), "--input", s(input), "--output", s(output)]
}

/// The values of the parameter `name` (panics naming it where the model has none).
#[allow(dead_code)]
pub fn param(model: &Model, name: &str) -> Vec<f32> {
    model.params.tensors[model.params.id(name).unwrap_or_else(|| panic!("{name}")).0].data.clone()
}

/// The shape of the parameter `name` (panics naming it where the model has none).
#[allow(dead_code)]
pub fn shape(model: &Model, name: &str) -> Vec<usize> {
    model.params.tensors[model.params.id(name).unwrap_or_else(|| panic!("{name}")).0].shape.clone()
}

/// A fresh model of `cfg`, after checking that the config's own account of the parameters
/// (names, shapes, bytes) is the model's: what checkpoints and memory estimates rely on.
#[allow(dead_code)]
pub fn model_with_its_layout(cfg: &foxlm::config::Config) -> Model {
    let m = Model::new(cfg);
    let want: Vec<(String, Vec<usize>)> =
        m.params.names.iter().cloned().zip(m.params.tensors.iter().map(|t| t.shape.clone())).collect();
    assert_eq!(cfg.param_layout(), want);
    assert_eq!(cfg.param_bytes(), 4 * m.params.numel() as u128);
    m
}

/// `j` written to `path` (a config.json) and loaded back.
#[allow(dead_code)]
pub fn load_config_json(path: &std::path::Path, j: &serde_json::Value) -> anyhow::Result<foxlm::config::Config> {
    std::fs::write(path, serde_json::to_string(j).unwrap()).unwrap();
    foxlm::config::Config::load(path)
}

/// Loading `j` as the config.json `path` fails with an error that contains `want` and names
/// the file.
#[allow(dead_code)]
pub fn assert_config_json_refused(path: &std::path::Path, j: &serde_json::Value, want: &str) {
    let e = err(load_config_json(path, j));
    assert!(e.contains(want) && e.contains("config.json"), "{want}: {e}");
}

/// The root mean square of `v`: an initialisation's standard deviation for a zero-mean one.
#[allow(dead_code)]
pub fn rms(v: &[f32]) -> f32 {
    (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt()
}

/// Every step size dt = softplus(dt bias) lies within the authors' [0.001, 0.1]
/// (time_step_min, time_step_max), up to round-off.
#[allow(dead_code)]
pub fn assert_dt_in_time_step_range(dt_bias: &[f32]) {
    for &b in dt_bias {
        let dt = (b as f64).exp().ln_1p();
        assert!((0.001 - 1e-6..=0.1 + 1e-6).contains(&dt), "softplus(dt bias) {dt}");
    }
}

/// Central finite differences (ε = 1e-2 in f32) of `loss_at` against the backward's `grads` for
/// the two entries with the largest gradient of each named tensor; panics on a mismatch beyond
/// 2% + 2e-4 (truncation O(ε²) plus f32 round-off ~1e-7·loss/ε ≈ 5e-5). Returns how many entries
/// were checked.
#[allow(dead_code)]
pub fn check_finite_differences(
    model: &Model,
    grads: &[Vec<f32>],
    names: &[&str],
    loss_at: impl Fn(&Model) -> f64,
) -> usize {
    check_finite_differences_eps(model, grads, names, loss_at, 1e-2)
}

/// [`check_finite_differences`] with a step `eps` of one's own (a smaller one for a model whose
/// loss curves more: its O(ε²) error shrinks, f32 round-off ~1e-7·loss/ε grows).
#[allow(dead_code)]
pub fn check_finite_differences_eps(
    model: &Model,
    grads: &[Vec<f32>],
    names: &[&str],
    loss_at: impl Fn(&Model) -> f64,
    eps: f32,
) -> usize {
    let mut checked = 0;
    for &name in names {
        let id = model.params.id(name).unwrap_or_else(|| panic!("{name}"));
        let g = &grads[id.0];
        let mut order: Vec<usize> = (0..g.len()).collect();
        order.sort_by(|&a, &b| g[b].abs().total_cmp(&g[a].abs()));
        for &idx in order.iter().take(2) {
            let mut m = model.clone();
            m.params.tensors[id.0].data[idx] += eps;
            let lp = loss_at(&m);
            m.params.tensors[id.0].data[idx] -= 2.0 * eps;
            let lm = loss_at(&m);
            let fd = (lp - lm) / (2.0 * eps as f64);
            let an = g[idx] as f64;
            assert!(
                (fd - an).abs() < 2e-2 * an.abs() + 2e-4,
                "{name}[{idx}]: finite difference {fd:.6e} vs backward {an:.6e}"
            );
            checked += 1;
        }
    }
    checked
}

/// The float tensor `name` of the safetensors file `path`, as f32 (any float dtype).
#[allow(dead_code)]
pub fn f32_tensor(path: &std::path::Path, name: &str) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap_or_else(|_| panic!("{name} missing from {}", path.display()));
    foxlm::checkpoint::to_f32(t.dtype(), t.data(), name).unwrap()
}

/// The int64 tensor `name` of the safetensors file `path`: (shape, values).
#[allow(dead_code)]
pub fn i64_tensor(path: &std::path::Path, name: &str) -> (Vec<usize>, Vec<i64>) {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(name).unwrap_or_else(|_| panic!("{name} missing from {}", path.display()));
    let v = t.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
    (t.shape().to_vec(), v)
}

/// A fixture folder's token ids (input_ids [B, T] of its expected.safetensors): (B, T, ids).
#[allow(dead_code)]
pub fn fixture_input_ids(dir: &std::path::Path) -> (usize, usize, Vec<u32>) {
    let (shape, ids) = i64_tensor(&dir.join("expected.safetensors"), "input_ids");
    (shape[0], shape[1], ids.iter().map(|&x| x as u32).collect())
}

/// A fixture folder's expected.json.
#[allow(dead_code)]
pub fn expected_json(dir: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap()
}

/// The greedy continuation an expected.json records: (prompt length, new tokens).
#[allow(dead_code)]
pub fn expected_greedy(j: &serde_json::Value) -> (usize, Vec<u32>) {
    let plen = j["greedy_prompt_len"].as_u64().unwrap() as usize;
    let want = j["greedy_new_tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
    (plen, want)
}

/// A reference fixture made with the authors' PyTorch model (tests/fixtures/official-*-tiny):
/// logits within 1e-4, the loss within 1e-5, per-position losses within 1e-4, every parameter's
/// gradient within 1e-4 relative, and the greedy tokens (through the model's inference state).
/// Returns the model.
#[allow(dead_code)]
pub fn matches_reference_fixture(dir: &std::path::Path) -> Model {
    use foxlm::checkpoint::load_model;
    use foxlm::generate::{generate, GenerateOptions};
    use foxlm::model::Ctx;
    use foxlm::sampling::Sampling;
    let model = load_model(dir).unwrap();
    let (b, t, ids) = fixture_input_ids(dir);
    let expected = dir.join("expected.safetensors");
    let want = f32_tensor(&expected, "logits");
    let ctx = Ctx { batch: b, seq: t, start: None };
    let logits = model.forward(&ids, &ctx);
    let e = max_abs_diff(&logits, &want);
    assert!(e < 1e-4, "{}: logits: max |Δ| {e:.2e}", dir.display());

    let targets: Vec<Option<u32>> = (0..b * t).map(|r| (r % t + 1 < t).then(|| ids[r + 1])).collect();
    let mut grads = model.params.zeros_like();
    let loss = model.loss_and_grads(&ids, &targets, &ctx, &mut grads, 1.0) as f64;
    let j = expected_json(dir);
    let want_loss = j["loss"].as_f64().unwrap();
    assert!((loss - want_loss).abs() < 1e-5, "{}: loss {loss} vs {want_loss}", dir.display());

    // Per position: the mean over the batch of the cross-entropy at position i.
    let ppl = f32_tensor(&expected, "per_position_loss");
    let v = model.config.vocab_size;
    for (i, &w) in ppl.iter().enumerate() {
        let mut sum = 0.0f64;
        for r in 0..b {
            let row = &logits[(r * t + i) * v..(r * t + i + 1) * v];
            let m = row.iter().fold(f32::MIN, |a, &x| a.max(x)) as f64;
            let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
            sum += lse - row[ids[r * t + i + 1] as usize] as f64;
        }
        assert!((sum / b as f64 - w as f64).abs() < 1e-4, "{}: per-position loss at {i}", dir.display());
    }

    for (i, name) in model.params.names.iter().enumerate() {
        let key = format!("grad.{name}");
        let r = f32_tensor(&dir.join("expected_grads.safetensors"), &key);
        let norm = r.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
        let diff = grads[i].iter().zip(&r).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum::<f64>().sqrt();
        assert!(diff / norm.max(1e-30) < 1e-4, "{name}: relative error {:.2e}", diff / norm);
    }

    let (plen, want) = expected_greedy(&j);
    let opts = GenerateOptions { max_new_tokens: want.len(), sampling: Sampling::default(), seed: 0, eos: None };
    let got = generate(&model, &[ids[..plen].to_vec()], &opts, |_, _| {});
    assert_eq!(got[0], want, "{}: greedy tokens through the inference state", dir.display());
    model
}

/// Random weights of a recurrent model far from initialisation, so that every component moves the
/// output: matrices N(0, 0.15), norm weights and D 1 ± 0.3, A = exp(A_log) around 1 (0.5 N(0, 1)
/// in the log), dt's bias (Mamba-2's dt_bias, Mamba's dt_proj.bias) around −1 (dt from about 0.05
/// to 1.5).
#[allow(dead_code)]
pub fn random_recurrent_model(cfg: &foxlm::config::Config, seed: u64) -> Model {
    use rand::{Rng, SeedableRng};
    let mut m = Model::new(cfg);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    for (i, name) in m.params.names.clone().iter().enumerate() {
        for x in m.params.tensors[i].data.iter_mut() {
            let z: f32 = rng.sample(rand_distr::StandardNormal);
            *x = if name.ends_with("norm.weight") || name.ends_with(".D") || name.ends_with("norm_f.weight") {
                1.0 + 0.3 * z
            } else if name.ends_with("A_log") {
                0.5 * z
            } else if name.ends_with("dt_bias") || name.ends_with("dt_proj.bias") {
                -1.0 + 0.7 * z
            } else {
                0.15 * z
            };
        }
    }
    m
}

/// `n` token ids drawn uniformly below `vocab`.
#[allow(dead_code)]
pub fn random_ids(vocab: usize, n: usize, seed: u64) -> Vec<u32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.gen_range(0..vocab as u32)).collect()
}

/// A freshly initialised model's loss on 32 tokens is within 0.05 of ln(vocab): its predictions
/// are near uniform.
#[allow(dead_code)]
pub fn fresh_loss_is_uniform(model: &Model) {
    let v = model.config.vocab_size;
    let ids: Vec<u32> = (0..32).map(|i| (i * 7 % v) as u32).collect();
    let ctx = foxlm::model::Ctx { batch: 1, seq: 32, start: None };
    let targets: Vec<Option<u32>> = (0..32).map(|i| (i + 1 < 32).then(|| ids[i + 1])).collect();
    let mut g = model.params.zeros_like();
    let loss = model.loss_and_grads(&ids, &targets, &ctx, &mut g, 1.0) as f64;
    let uniform = (v as f64).ln();
    assert!((loss - uniform).abs() < 0.05, "fresh loss {loss} vs ln(vocab) {uniform}");
}

/// The largest absolute difference of two equally long slices.
#[allow(dead_code)]
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Finite differences through the whole model on 2 rows of 40 random tokens, row 1 left-padded by
/// 5 (its padding takes no part), for the named tensors (see [`check_finite_differences`]).
/// Returns how many entries were checked.
#[allow(dead_code)]
pub fn finite_differences_with_a_padded_row(model: &Model, names: &[&str]) -> usize {
    finite_differences_with_a_padded_row_eps(model, names, 1e-2)
}

/// [`finite_differences_with_a_padded_row`] with a step `eps` of one's own.
#[allow(dead_code)]
pub fn finite_differences_with_a_padded_row_eps(model: &Model, names: &[&str], eps: f32) -> usize {
    use foxlm::model::Ctx;
    let (b, t, pad) = (2, 40, 5);
    let ids = random_ids(model.config.vocab_size, b * t, 2);
    let ctx = Ctx { batch: b, seq: t, start: Some(vec![0, pad]) };
    let targets: Vec<Option<u32>> =
        (0..b * t).map(|r| if (t..t + pad).contains(&r) || r % t + 1 >= t { None } else { Some(ids[r + 1]) }).collect();
    batch_finite_differences(model, (&ids, &targets, &ctx), names, eps).1
}

/// The backward's gradients of a batch's loss and their check against central differences of
/// that loss ([`check_finite_differences_eps`]) for `names`: (gradients, entries checked).
#[allow(dead_code)]
pub fn batch_finite_differences(
    model: &Model,
    (ids, targets, ctx): (&[u32], &[Option<u32>], &foxlm::model::Ctx),
    names: &[&str],
    eps: f32,
) -> (Vec<Vec<f32>>, usize) {
    let mut grads = model.params.zeros_like();
    model.loss_and_grads(ids, targets, ctx, &mut grads, 1.0);
    let loss_at = |m: &Model| -> f64 {
        let mut g = m.params.zeros_like();
        m.loss_and_grads(ids, targets, ctx, &mut g, 0.0) as f64
    };
    let checked = check_finite_differences_eps(model, &grads, names, loss_at, eps);
    (grads, checked)
}

/// A model with an inference state (any family) against its full forward: prefilling 7 tokens of
/// a 30-token row then decoding one at a time, and prefilling in chunks (chunk, length, seed of
/// the row) give the full forward's logits (max |Δ| < 2e-4); the same row beside itself
/// left-padded by 6 (junk ids in the padding) keeps its logits. Returns the decoding run's cache.
#[allow(dead_code)]
pub fn inference_state_matches_the_full_forward(
    model: &Model,
    chunks: &[(usize, usize, u64)],
) -> foxlm::model::cache::Cache {
    use foxlm::model::Ctx;
    let v = model.config.vocab_size;
    let t = 30;
    let one = |n: usize| Ctx { batch: 1, seq: n, start: None };
    let seq = random_ids(v, t, 6);
    let full = model.forward(&seq, &one(t));
    let mut cache = model.new_cache(1, t, None);
    let (h, _) = model.forward_hidden(&seq[..7], &one(7), Some(&mut cache), false);
    let mut got = model.logits(&h);
    for i in 7..t {
        let (h, _) = model.forward_hidden(&seq[i..i + 1], &one(1), Some(&mut cache), false);
        got.extend(model.logits(&h));
    }
    assert_eq!(cache.len(), t);
    let e = max_abs_diff(&got, &full);
    assert!(e < 2e-4, "decoding through the state: max |Δ logit| {e:.2e}");

    for &(chunk, len, seed) in chunks {
        let seq = random_ids(v, len, seed);
        let full = model.forward(&seq, &one(len));
        let mut c = model.new_cache(1, len, None);
        let mut got = Vec::new();
        for s in (0..len).step_by(chunk) {
            let n = chunk.min(len - s);
            let (h, _) = model.forward_hidden(&seq[s..s + n], &one(n), Some(&mut c), false);
            got.extend(model.logits(&h));
        }
        let e = max_abs_diff(&got, &full);
        assert!(e < 2e-4, "prefill in chunks of {chunk}: max |Δ logit| {e:.2e}");
    }

    let pad = 6;
    let mut two = seq.clone();
    two.extend((0..pad).map(|i| (i * 13 % v) as u32));
    two.extend_from_slice(&seq[..t - pad]);
    let both = model.forward(&two, &Ctx { batch: 2, seq: t, start: Some(vec![0, pad]) });
    assert!(max_abs_diff(&both[..t * v], &full) < 1e-5);
    let short = model.forward(&seq[..t - pad], &one(t - pad));
    let e = max_abs_diff(&both[(t + pad) * v..], &short);
    assert!(e < 1e-4, "left padding changes the row: max |Δ logit| {e:.2e}");
    cache
}

/// Greedy generation through the model's inference state equals the argmax of a full forward at
/// every step (10 tokens after 12), alone and as the shorter row of a left-padded batch.
#[allow(dead_code)]
pub fn greedy_generation_matches_full_forwards(model: &Model) {
    use foxlm::generate::{generate, GenerateOptions};
    use foxlm::model::Ctx;
    use foxlm::sampling::Sampling;
    let v = model.config.vocab_size;
    let prompt = random_ids(v, 12, 8);
    let mut seq = prompt.clone();
    let mut want = Vec::new();
    for _ in 0..10 {
        let logits = model.forward(&seq, &Ctx { batch: 1, seq: seq.len(), start: None });
        let last = &logits[(seq.len() - 1) * v..];
        let next = (0..v).max_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap() as u32;
        want.push(next);
        seq.push(next);
    }
    let opts = GenerateOptions { max_new_tokens: 10, sampling: Sampling::default(), seed: 0, eos: None };
    let got = generate(model, std::slice::from_ref(&prompt), &opts, |_, _| {});
    assert_eq!(got[0], want);
    let longer = random_ids(v, 19, 9);
    let got2 = generate(model, &[longer, prompt], &opts, |_, _| {});
    assert_eq!(got2[1], want, "the left-padded row");
}
