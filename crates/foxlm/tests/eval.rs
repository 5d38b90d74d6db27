//! Evaluation (SPEC §5): the per-token loss is the cross-entropy of `foxlm forward`'s logits and
//! of the reference's per-position loss; P(l) follows from L(i); the needle lands where asked and
//! the scorer is right on hand-made answers; the gate maps agree with the attention the model
//! computed; and `eval loss`, `eval niah` and `viz gates` run end to end on fixture models and
//! write well-formed CSV, JSON and PNG files.

mod common;

use common::{f32_tensor, fixture, fixture_input_ids};
use foxlm::checkpoint::load_model;
use foxlm::eval::gates;
use foxlm::eval::loss::{self, Chunking};
use foxlm::eval::niah::{self, Haystack, Mode};
use foxlm::model::Ctx;
use safetensors::Dtype;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_foxlm");

fn sample_text() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/sample/moby-dick")
}

/// `foxlm` with the words of `line`, then each (flag, path) pair; it may fail.
fn foxlm_run(line: &str, paths: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(BIN);
    c.args(line.split_whitespace());
    for (flag, path) in paths {
        c.arg(flag).arg(path);
    }
    c.output().expect("run foxlm")
}

/// The same, which must succeed.
fn foxlm(line: &str, paths: &[(&str, &Path)]) -> Output {
    let o = foxlm_run(line, paths);
    assert!(o.status.success(), "foxlm {line} {paths:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    o
}

/// Logits [B, T, V] from the `foxlm forward` command.
fn forward_cli_logits(model: &Path, ids: &[u32], b: usize, t: usize, dir: &Path) -> Vec<f32> {
    let input = dir.join("ids.safetensors");
    let bytes: Vec<u8> = ids.iter().flat_map(|&i| (i as i64).to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(Dtype::I64, vec![b, t], &bytes).unwrap();
    std::fs::write(&input, safetensors::serialize(vec![("input_ids".to_string(), view)], None).unwrap()).unwrap();
    let output = dir.join("logits.safetensors");
    foxlm("forward", &[("--model", model), ("--input", &input), ("--output", &output)]);
    f32_tensor(&output, "logits")
}

/// Next-token cross-entropy of each row of logits, in f64.
fn cross_entropy(logits: &[f32], ids: &[u32], b: usize, t: usize, v: usize) -> Vec<Vec<f64>> {
    (0..b)
        .map(|r| {
            (0..t - 1)
                .map(|i| {
                    let row = &logits[(r * t + i) * v..(r * t + i + 1) * v];
                    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
                    let z: f64 = row.iter().map(|&x| (x as f64 - m).exp()).sum();
                    m + z.ln() - row[ids[r * t + i + 1] as usize] as f64
                })
                .collect()
        })
        .collect()
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

/// A decodable PNG of at least the given size with more than a handful of colours (not blank).
fn check_png(path: &Path, min_w: u32, min_h: u32) {
    let img = image::open(path).unwrap_or_else(|e| panic!("{}: not a readable PNG: {e}", path.display())).to_rgb8();
    assert!(img.width() >= min_w && img.height() >= min_h, "{}: {}x{}", path.display(), img.width(), img.height());
    let mut colours = std::collections::HashSet::new();
    for p in img.pixels() {
        colours.insert(p.0);
        if colours.len() > 20 {
            return;
        }
    }
    panic!("{}: only {} colours: the image is blank", path.display(), colours.len());
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn f64s(v: &serde_json::Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

#[test]
fn per_token_loss_with_chunked_prefill_equals_cross_entropy_of_forward_logits() {
    let tmp = tempfile::tempdir().unwrap();
    for v in ["fox_pro", "fox_llama", "transformer_llama"] {
        let model = load_model(&fixture(v)).unwrap();
        let (b, t, ids) = fixture_input_ids(&fixture(v));
        let vocab = model.config.vocab_size;
        let logits = forward_cli_logits(&fixture(v), &ids, b, t, tmp.path());
        let want = cross_entropy(&logits, &ids, b, t, vocab);
        let seqs: Vec<Vec<u32>> = ids.chunks(t).map(|s| s.to_vec()).collect();
        // Chunk sizes that do and do not divide T − 1, one token at a time, and one chunk; small
        // logit blocks exercise the blocked cross-entropy.
        for chunk in [1, 7, 64, 1000] {
            let ch = Chunking { chunk, logit_rows: 5 };
            let mut done = 0;
            let got = loss::batch_token_losses(&model, &seqs, ch, |n| done += n);
            assert_eq!(done, t - 1);
            for r in 0..b {
                let d = max_diff(&got[r], &want[r]);
                assert!(d < 2e-4, "{v} chunk {chunk} row {r}: max |L(i) - CE(forward logits)| = {d}");
            }
            // One sequence at a time gives the same as the batch.
            let single = loss::batch_token_losses(&model, &seqs[1..], ch, |_| {});
            assert!(max_diff(&single[0], &got[1]) < 1e-4);
        }
        // The mean over the batch is the reference implementation's per-position loss.
        let mut curve = loss::LossCurve::new(t - 1);
        for l in loss::batch_token_losses(&model, &seqs, Chunking::new(50, vocab), |_| {}) {
            curve.add(&l);
        }
        let reference = f32_tensor(&fixture(v).join("expected.safetensors"), "per_position_loss");
        let reference: Vec<f64> = reference.iter().map(|&x| x as f64).collect();
        let d = max_diff(&curve.mean(), &reference);
        assert!(d < 1e-4, "{v}: L(i) vs the reference per-position loss: {d}");
    }
}

#[test]
fn perplexity_is_the_exponential_of_the_running_mean_loss() {
    let l: Vec<f64> = (0..100).map(|i| 1.0 + (i as f64 * 0.37).sin().abs()).collect();
    let lengths = loss::power_of_two_lengths(l.len());
    assert_eq!(lengths, vec![1, 2, 4, 8, 16, 32, 64, 100]);
    for (len, p) in loss::perplexity_at(&l, &lengths) {
        let mean = l[..len].iter().sum::<f64>() / len as f64;
        assert!((p - mean.exp()).abs() < 1e-12 * p, "P({len})");
    }
    assert_eq!(loss::perplexity_at(&l, &[1])[0].1, l[0].exp());
    // The moving average of a linear function is the function, away from the ends.
    let x: Vec<f64> = (0..500).map(|i| 3.0 - 0.01 * i as f64).collect();
    let m = loss::moving_average(&x, 101);
    for i in 50..450 {
        assert!((m[i] - x[i]).abs() < 1e-9);
    }
}

/// A toy haystack: sentence s is "wS_0 … wS_{n−1}." with n varying, encoded one id per word.
fn toy_haystack() -> (String, usize) {
    let mut text = String::new();
    let mut longest = 0;
    for s in 0..400 {
        let n = 3 + (s * 7) % 11;
        longest = longest.max(n);
        let words: Vec<String> = (0..n).map(|w| format!("w{}", (s * 13 + w) % 97)).collect();
        text += &format!("{}{}.", if s == 0 { "" } else { " " }, words.join(" "));
    }
    (text, longest)
}

fn toy_encode(s: &str) -> Vec<u32> {
    s.split_whitespace().map(|w| 10 + w.trim_end_matches('.').trim_start_matches('w').parse::<u32>().unwrap()).collect()
}

#[test]
fn the_needle_lands_at_the_requested_depth_and_the_prompt_has_the_requested_length() {
    let (text, longest) = toy_haystack();
    let hay = Haystack::from_text(&text, 3000, toy_encode).unwrap();
    let needle = vec![1u32, 2, 3, 4, 5];
    let question = vec![6u32, 7, 8];
    for length in [40usize, 101, 500, 2000] {
        for depth in [0.0, 0.1, 0.25, 0.5, 0.77, 0.9, 1.0] {
            let p = niah::build_prompt(&hay, &needle, &question, 0, length, depth).unwrap();
            assert_eq!(p.ids.len(), length, "length {length}");
            let h = length - 1 - needle.len() - question.len();
            assert_eq!(p.haystack_tokens, h);
            assert_eq!(p.ids[0], 0, "BOS first");
            assert_eq!(&p.ids[p.needle_start..p.needle_start + needle.len()], &needle[..]);
            assert_eq!(&p.ids[length - question.len()..], &question[..]);
            // Everything else is the haystack's first h tokens, in order.
            let rest: Vec<u32> = p.ids[1..p.needle_start]
                .iter()
                .chain(&p.ids[p.needle_start + needle.len()..length - question.len()])
                .copied()
                .collect();
            assert_eq!(rest, hay.tokens[..h]);
            // At a sentence boundary, the one nearest to depth · h.
            let k = p.needle_start - 1;
            assert!(
                k == h || hay.boundaries.contains(&k),
                "length {length} depth {depth}: offset {k} is not a sentence start"
            );
            let target = depth * h as f64;
            assert!(
                (k as f64 - target).abs() <= longest as f64 / 2.0 + 0.5,
                "length {length} depth {depth}: needle at {k}, target {target}"
            );
            assert!((p.actual_depth - k as f64 / h as f64).abs() < 1e-12);
            if depth == 0.0 {
                assert_eq!(k, 0);
            }
            if depth == 1.0 {
                assert!(h - k <= longest / 2 + 1);
            }
        }
    }
    assert!(niah::build_prompt(&hay, &needle, &question, 0, 9, 0.5).is_err(), "no room for a haystack");
    assert!(niah::build_prompt(&hay, &needle, &question, 0, 100, 1.5).is_err(), "depth outside [0, 1]");
}

#[test]
fn the_needle_prompt_decodes_to_the_texts_with_the_gpt2_tokenizer() {
    use foxlm::tokenizer::{TextFormat, Tokenizer};
    for format in [TextFormat::Plain, TextFormat::JsonEscaped] {
        let tok = Tokenizer::gpt2(format).unwrap();
        let text = std::fs::read_to_string(sample_text().join("chapter_1.txt")).unwrap();
        let hay = Haystack::from_text(&text, 1000, |s| tok.encode(s, false)).unwrap();
        for mode in [Mode::Standard, Mode::Easy] {
            let needle = tok.encode(&mode.needle(), false);
            let question = tok.encode(&niah::question_suffix(), false);
            let p = niah::build_prompt(&hay, &needle, &question, 50256, 1000, 0.5).unwrap();
            assert_eq!(p.ids.len(), 1000);
            let decoded = tok.decode(&p.ids);
            assert!(decoded.contains(&mode.needle()), "{format:?} {mode:?}: the needle is in the prompt");
            assert!(decoded.ends_with("Answer: The best thing to do in San Francisco is"));
            // The needle follows the end of a sentence.
            let before = tok.decode(&p.ids[..p.needle_start]);
            assert!(
                before.trim_end().ends_with(['.', '!', '?', '"']),
                "{format:?}: {:?}",
                &before[before.len() - 40..]
            );
            assert!((p.actual_depth - 0.5).abs() < 0.1, "depth {}", p.actual_depth);
        }
    }
}

#[test]
fn the_scorer_counts_the_answer_words_reproduced_in_order() {
    let a = niah::ANSWER; // 12 words
    assert_eq!(niah::score_answer(" eat a sandwich and sit in Dolores Park on a sunny day.", a), 10.0);
    assert_eq!(niah::score_answer("EAT A SANDWICH, and sit in dolores park on a sunny day!\nThe end", a), 10.0);
    assert_eq!(niah::score_answer("", a), 0.0);
    assert_eq!(niah::score_answer("to go to the beach", a), 0.0);
    assert!((niah::score_answer(" eat a sandwich.", a) - 2.5).abs() < 1e-12);
    assert!((niah::score_answer(" sit in Dolores Park", a) - 10.0 * 4.0 / 12.0).abs() < 1e-12);
    // Only the words in the answer's order count: "day sunny" reversed is one word.
    assert!((niah::score_answer("day sunny", a) - 10.0 / 12.0).abs() < 1e-12);
    // A repeated word counts as often as the answer has it ("a" twice), not more.
    assert!((niah::score_answer("a a a a", a) - 10.0 * 2.0 / 12.0).abs() < 1e-12);
    // Words past twice the answer's length earn nothing.
    let rambling = format!("{} {a}", "no ".repeat(24));
    assert_eq!(niah::score_answer(&rambling, a), 0.0);
}

#[test]
fn gate_maps_reproduce_the_attention_the_model_computed() {
    let (_, t, ids) = fixture_input_ids(&fixture("fox_pro"));
    let t = t.min(64);
    let ids = &ids[..t];
    for v in ["fox_pro", "fox_llama", "fox_fixed", "transformer_llama"] {
        let model = load_model(&fixture(v)).unwrap();
        let cfg = &model.config;
        let (h, hd) = (cfg.num_heads, cfg.head_dim());
        let (_, acts) = model.forward_hidden(ids, &Ctx { batch: 1, seq: t, start: None }, None, true);
        let acts = acts.unwrap();
        let stats = gates::gate_stats(&acts, h, t);
        assert_eq!(stats.len(), cfg.num_hidden_layers * h);
        for (l, blk) in acts.blocks.iter().enumerate() {
            let a = blk.attn().expect("an attention layer");
            for head in 0..h {
                let c: Vec<f32> = if a.c.is_empty() { vec![0.0; h * t] } else { a.c.clone() };
                let p = gates::attention_map(&a.q, &a.k, &c, h, h, hd, None, head, t);
                let f = gates::forget_matrix(&c, head, t);
                let fg = gates::head_gates(&a.fgate_logit, h, head, t);
                for i in 0..t {
                    let row = &p[i * t..(i + 1) * t];
                    let s: f64 = row[..=i].iter().map(|&x| x as f64).sum();
                    assert!((s - 1.0).abs() < 1e-5, "{v} L{l} H{head}: row {i} sums to {s}");
                    assert!(
                        row[i + 1..].iter().all(|x| x.is_nan())
                            && f[i * t + i + 1..(i + 1) * t].iter().all(|x| x.is_nan())
                    );
                    // P·V is the layer's attention output o.
                    for dch in 0..hd {
                        let o: f64 = (0..=i).map(|j| row[j] as f64 * a.v[j * h * hd + head * hd + dch] as f64).sum();
                        let want = a.o[i * h * hd + head * hd + dch] as f64;
                        assert!((o - want).abs() < 1e-4, "{v} L{l} H{head} row {i}: P·V {o} vs o {want}");
                    }
                    // F_ij is the product of the gates f over (j, i].
                    if i > 0 {
                        let j = i / 2;
                        let prod: f64 = fg[j + 1..=i].iter().product();
                        assert!((f[i * t + j] as f64 - prod).abs() < 1e-4 * prod.max(1e-3), "{v}: F[{i}][{j}]");
                    }
                }
                let s = &stats[l * h + head];
                assert_eq!((s.layer, s.head), (l, head));
                let mean = fg[1..].iter().sum::<f64>() / (t - 1) as f64;
                assert!((s.mean_f - mean).abs() < 1e-12);
                if a.fgate_logit.is_empty() {
                    assert!(s.memory_length.is_infinite(), "{v}: no gate, infinite memory");
                    assert!(f.iter().filter(|x| !x.is_nan()).all(|&x| x == 1.0));
                } else {
                    assert!((s.memory_length - 1.0 / (1.0 - mean)).abs() < 1e-9 * s.memory_length);
                }
            }
        }
    }
}

/// A small prepared dataset (GPT-2 ids, json-escaped) of six Moby-Dick chapters, three held out.
fn prepared_data(dir: &Path) -> PathBuf {
    let out = dir.join("data");
    let inputs: Vec<PathBuf> =
        [1, 2, 3, 4, 5, 6].iter().map(|c| sample_text().join(format!("chapter_{c}.txt"))).collect();
    let opts = foxlm::data::PrepareOptions { val_fraction: 0.5, ..Default::default() };
    foxlm::data::prepare(&inputs, &out, &opts).unwrap();
    out
}

#[test]
fn eval_loss_runs_end_to_end_and_its_numbers_are_the_forward_cross_entropy() {
    let tmp = tempfile::tempdir().unwrap();
    let data = prepared_data(tmp.path());
    let out = tmp.path().join("out");
    let n = 300;
    let o = foxlm(
        &format!("eval loss --context {n} --sequences 2 --window 11 --chunk 64 --train-context 128 --train-context 192 --fold-vocab"),
        &[
            ("--model", &fixture("fox_pro")),
            ("--model", &fixture("transformer_llama")),
            ("--data", &data),
            ("--out", &out),
        ],
    );
    assert!(String::from_utf8_lossy(&o.stderr).contains("folding"), "folding is announced");
    let j = read_json(&out.join("loss.json"));
    assert_eq!(j["context"], n);
    assert_eq!(j["sequences"], 2);
    let models = j["models"].as_array().unwrap();
    assert_eq!(models.len(), 2);
    assert_eq!(models[0]["name"], "fox_pro");
    assert_eq!(models[1]["train_context"], 192);

    // The same sequences by hand: BOS, then the first n tokens of each validation document,
    // folded into the vocabulary; CE of `foxlm forward` logits.
    let ds = foxlm::data::Dataset::open(&data).unwrap();
    let docs: Vec<Vec<u32>> = (0..ds.num_documents(foxlm::data::Split::Val))
        .map(|i| ds.document(foxlm::data::Split::Val, i))
        .filter(|d| d.len() >= n)
        .take(2)
        .collect();
    assert_eq!(docs.len(), 2);
    for (mi, v) in ["fox_pro", "transformer_llama"].iter().enumerate() {
        let cfg = load_model(&fixture(v)).unwrap().config;
        let vocab = cfg.vocab_size;
        let bos = cfg.bos_token_id.unwrap();
        let ids: Vec<u32> =
            docs.iter().flat_map(|d| std::iter::once(bos).chain(d[..n].iter().map(|&x| x % vocab as u32))).collect();
        let logits = forward_cli_logits(&fixture(v), &ids, 2, n + 1, tmp.path());
        let ce = cross_entropy(&logits, &ids, 2, n + 1, vocab);
        let want: Vec<f64> = (0..n).map(|i| (ce[0][i] + ce[1][i]) / 2.0).collect();
        let got = f64s(&models[mi]["loss"]);
        assert_eq!(got.len(), n);
        let d = max_diff(&got, &want);
        assert!(d < 2e-4, "{v}: L(i) vs CE of forward logits: {d}");
        // P(l) agrees with L(i).
        let ppl = models[mi]["perplexity"].as_array().unwrap();
        let lengths: Vec<u64> = ppl.iter().map(|p| p["length"].as_u64().unwrap()).collect();
        assert_eq!(lengths, vec![1, 2, 4, 8, 16, 32, 64, 128, 256, 300]);
        for p in ppl {
            let l = p["length"].as_u64().unwrap() as usize;
            let want = (got[..l].iter().sum::<f64>() / l as f64).exp();
            assert!((p["perplexity"].as_f64().unwrap() - want).abs() < 1e-9 * want);
        }
        let sm = f64s(&models[mi]["smoothed_loss"]);
        assert!((sm[100] - got[95..106].iter().sum::<f64>() / 11.0).abs() < 1e-9);
    }

    // CSVs: a header and one row per position / length, every field a number.
    let csv = std::fs::read_to_string(out.join("loss.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "position,fox_pro,fox_pro (smoothed),transformer_llama,transformer_llama (smoothed)");
    assert_eq!(lines.len(), n + 1);
    for (i, line) in lines[1..].iter().enumerate() {
        let f: Vec<f64> = line.split(',').map(|x| x.parse().unwrap()).collect();
        assert_eq!(f.len(), 5);
        assert_eq!(f[0], i as f64);
    }
    let pcsv = std::fs::read_to_string(out.join("perplexity.csv")).unwrap();
    assert_eq!(pcsv.lines().count(), 11);
    check_png(&out.join("loss.png"), 600, 400);
    check_png(&out.join("perplexity.png"), 600, 400);

    // --pack cuts windows from the joined documents: more sequences than long documents.
    let out2 = tmp.path().join("out2");
    foxlm(
        "eval loss --context 1000 --sequences 4 --pack --batch-size 2 --fold-vocab",
        &[("--model", &fixture("fox_llama")), ("--data", &data), ("--out", &out2)],
    );
    let j2 = read_json(&out2.join("loss.json"));
    assert_eq!(j2["sequences"], 4);
    assert_eq!(j2["windows"], "packed");
    assert!(f64s(&j2["models"][0]["loss"]).iter().all(|x| x.is_finite() && *x > 0.0));
}

#[test]
fn eval_loss_refuses_data_the_model_cannot_read() {
    let tmp = tempfile::tempdir().unwrap();
    let data = prepared_data(tmp.path());
    let (model, o_dir) = (fixture("fox_pro"), tmp.path().join("o"));
    let paths = [("--model", model.as_path()), ("--data", &data), ("--out", &o_dir)];
    let o = foxlm_run("eval loss --context 64", &paths);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("vocabulary has 512 tokens"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = foxlm_run("eval loss --context 100000 --fold-vocab", &paths);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--pack"), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn eval_niah_runs_end_to_end_and_writes_the_grid_and_heatmap() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let lengths = [200usize, 300, 450];
    let depths = [0.0, 50.0, 100.0];
    let o = foxlm(
        "eval niah --mode easy --lengths 200,300,450 --depths 0,50,100 --max-new-tokens 6 --train-context 256 --fold-vocab",
        &[("--model", &fixture("fox_llama")), ("--haystack", &sample_text()), ("--out", &out)],
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("mean score"));
    let j = read_json(&out.join("niah.json"));
    assert_eq!(j["mode"], "easy");
    assert_eq!(j["train_context"], 256);
    assert!(j["needle"].as_str().unwrap().contains("What is the best thing to do in San Francisco? Answer:"));
    let cells = j["cells"].as_array().unwrap();
    assert_eq!(cells.len(), lengths.len() * depths.len());
    let mut k = 0;
    for &len in &lengths {
        for &d in &depths {
            let c = &cells[k];
            k += 1;
            assert_eq!(c["length"], len);
            assert_eq!(c["depth_percent"], d);
            let s = c["score"].as_f64().unwrap();
            assert!((0.0..=10.0).contains(&s));
            assert_eq!(s, niah::score_answer(c["response"].as_str().unwrap(), niah::ANSWER));
            let (start, ntok, h) = (
                c["needle_start"].as_u64().unwrap(),
                c["needle_tokens"].as_u64().unwrap(),
                c["haystack_tokens"].as_u64().unwrap(),
            );
            assert!(start >= 1 && start <= 1 + h && h + ntok < len as u64);
            let actual = c["actual_depth_percent"].as_f64().unwrap();
            assert!((0.0..=100.0).contains(&actual));
            if d == 0.0 {
                assert_eq!(start, 1);
            }
        }
    }
    check_png(&out.join("niah.png"), 600, 300);
}

#[test]
fn ruler_runs_end_to_end_and_scores_what_it_wrote() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let (model, haystack) = (fixture("fox_pro"), sample_text());
    let o = foxlm(
        "eval ruler --lengths 300,700 --tasks multikey,vt,cwe --samples 2 --max-new-tokens 4 --fold-vocab --device cpu",
        &[("--model", &model), ("--haystack", &haystack), ("--out", &out)],
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("multikey") && stdout.contains("cwe"), "{stdout}");
    let j = read_json(&out.join("ruler.json"));
    let cells = j["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 3 * 2 * 2);
    for c in cells {
        let (task, len, n) =
            (c["task"].as_str().unwrap(), c["length"].as_u64().unwrap(), c["prompt_tokens"].as_u64().unwrap());
        if task == "cwe" {
            assert!(n <= len && n > len / 2, "cwe prompt of {n} tokens for {len}");
        } else {
            assert_eq!(n, len, "{task}");
        }
        let answers: Vec<String> =
            c["answers"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
        assert_eq!(
            answers.len(),
            match task {
                "multikey" => 1,
                "vt" => 5,
                _ => 10,
            }
        );
        let score = foxlm::eval::ruler::score(c["response"].as_str().unwrap(), &answers);
        assert_eq!(c["score"].as_f64().unwrap(), score);
    }
    // The table is each task and length's mean, in percent.
    for (task, row) in j["scores_percent"].as_object().unwrap() {
        for (li, len) in [300u64, 700].iter().enumerate() {
            let mean: f64 = cells
                .iter()
                .filter(|c| c["task"] == task.as_str() && c["length"] == *len)
                .map(|c| c["score"].as_f64().unwrap())
                .sum::<f64>()
                / 2.0;
            assert!((row[li].as_f64().unwrap() - 100.0 * mean).abs() < 1e-9);
        }
    }
    // A length with no room is an error naming the task.
    let bad = foxlm_run(
        "eval ruler --lengths 40 --tasks multikey --fold-vocab --device cpu",
        &[("--model", &model), ("--haystack", &haystack), ("--out", &tmp.path().join("bad"))],
    );
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("multikey at length 40"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

#[test]
fn longbench_runs_official_format_files_truncates_and_scores() {
    use foxlm::eval::longbench as lb;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let ctx = "Passage 1: Moby-Dick is a novel by Herman Melville, published in 1851. ".repeat(6);
    let lines = |rows: &[serde_json::Value]| rows.iter().map(|r| r.to_string() + "\n").collect::<String>();
    std::fs::write(
        data.join("hotpotqa.jsonl"),
        lines(&[
            serde_json::json!({"input": "Who wrote Moby-Dick?", "context": ctx, "answers": ["Herman Melville"], "length": 80, "dataset": "hotpotqa", "all_classes": null, "_id": "a"}),
            serde_json::json!({"input": "When?", "context": ctx, "answers": ["1851", "in 1851"], "all_classes": null}),
        ]),
    )
    .unwrap();
    std::fs::write(
        data.join("trec.jsonl"),
        lines(&[serde_json::json!({"input": "Question: How far is the moon?\nType:", "context": "Question: Where is Paris?\nType: Location", "answers": ["Number"], "all_classes": ["Location", "Number", "Date"]})]),
    )
    .unwrap();
    std::fs::write(
        data.join("lcc.jsonl"),
        lines(&[serde_json::json!({"input": "", "context": "fn main() {\n    let x = 1;\n", "answers": ["    println!(\"{x}\");"]})]),
    )
    .unwrap();
    let out = tmp.path().join("out");
    let model = fixture("fox_pro");
    let o = foxlm(
        "eval longbench --max-length 40 --fold-vocab --device cpu",
        &[("--model", &model), ("--data", &data), ("--out", &out)],
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("| hotpotqa | qa_f1 | 2 |"));
    let j = read_json(&out.join("longbench.json"));
    let ds = j["datasets"].as_object().unwrap();
    assert_eq!(ds.len(), 3);
    for (name, d) in ds {
        let task = lb::dataset(name).unwrap();
        let samples = lb::read_jsonl(&data.join(format!("{name}.jsonl"))).unwrap();
        let cells = d["cells"].as_array().unwrap();
        assert_eq!(cells.len(), samples.len());
        let mut sum = 0.0;
        for (c, s) in cells.iter().zip(&samples) {
            let (full, kept) = (c["prompt_tokens"].as_u64().unwrap(), c["kept_tokens"].as_u64().unwrap());
            assert_eq!(kept, full.min(40), "{name}: truncated in the middle to --max-length");
            let sc = lb::best_score(task.metric, c["prediction"].as_str().unwrap(), s);
            assert_eq!(c["score"].as_f64().unwrap(), sc);
            sum += sc;
        }
        assert!((d["score"].as_f64().unwrap() - 100.0 * sum / samples.len() as f64).abs() < 1e-9);
    }
    assert!(ds["hotpotqa"]["cells"][0]["prompt_tokens"].as_u64().unwrap() > 40, "the long prompt was cut");
    // Errors name the file, the line and the field.
    let bad = tmp.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    std::fs::write(
        bad.join("qasper.jsonl"),
        "{\"input\": \"q\", \"context\": \"c\", \"answers\": [\"x\"]}\n{\"input\": \"q\"}\n",
    )
    .unwrap();
    let e = foxlm_run("eval longbench --fold-vocab", &[("--model", &model), ("--data", &bad)]);
    let msg = String::from_utf8_lossy(&e.stderr);
    assert!(!e.status.success() && msg.contains("qasper.jsonl:2") && msg.contains("'answers'"), "{msg}");
    std::fs::write(bad.join("qasper.jsonl"), "").unwrap();
    std::fs::rename(bad.join("qasper.jsonl"), bad.join("mystery.jsonl")).unwrap();
    let e = foxlm_run("eval longbench --fold-vocab", &[("--model", &model), ("--data", &bad)]);
    assert!(String::from_utf8_lossy(&e.stderr).contains("unknown LongBench dataset 'mystery'"));
}

#[test]
fn viz_gates_runs_end_to_end_and_writes_maps_and_the_table() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let text = sample_text().join("chapter_1.txt");
    let o = foxlm(
        "viz gates --layers 1 --heads 0,3 --max-tokens 48 --fold-vocab",
        &[("--model", &fixture("fox_pro")), ("--text", &text), ("--out", &out)],
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("memory length"), "{stdout}");
    let csv = std::fs::read_to_string(out.join("gates.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "layer,head,mean_f,memory_length,min_f,max_f");
    assert_eq!(lines.len(), 1 + 2 * 4, "every layer and head");
    for line in &lines[1..] {
        let f: Vec<f64> = line.split(',').map(|x| x.parse().unwrap()).collect();
        assert!(f[2] > 0.0 && f[2] < 1.0 && (f[3] - 1.0 / (1.0 - f[2])).abs() < 1e-6 * f[3]);
        assert!(f[4] <= f[2] && f[2] <= f[5]);
    }
    let j = read_json(&out.join("gates.json"));
    assert_eq!(j["tokens"], 48);
    assert_eq!(j["heads"].as_array().unwrap().len(), 8);
    assert!(!out.join("gates-layer0.png").exists(), "only the chosen layer is drawn");
    check_png(&out.join("gates-layer1.png"), 500, 500);
    check_png(&out.join("gates-memory.png"), 500, 300);

    // A Transformer has no forget gate: infinite memory everywhere ("inf"; null in JSON).
    let out2 = tmp.path().join("out2");
    foxlm(
        "viz gates --max-tokens 16 --fold-vocab",
        &[("--model", &fixture("transformer_pro")), ("--text", &text), ("--out", &out2)],
    );
    let csv = std::fs::read_to_string(out2.join("gates.csv")).unwrap();
    assert!(csv.lines().skip(1).all(|l| l.split(',').nth(3) == Some("inf")), "{csv}");
    assert!(read_json(&out2.join("gates.json"))["heads"][0]["memory_length"].is_null());
    check_png(&out2.join("gates-layer0.png"), 500, 500);
}
