//! One generation loop: `generate` (what `foxlm generate` and the evaluations run) drives the
//! serving engine's scheduler in-process. Checked against the loop it replaced (kept here as the
//! reference: one left-padded batch, prefilled whole, decoded to the end with one generator) for
//! every model family: batched prompts of different lengths, end of sequence, token limits and
//! seeded sampling; then chunked prefill against whole prefill, and a running stream decoding
//! between the chunks of a long newcomer.

mod common;

use common::{random_ids, random_recurrent_model};
use foxlm::checkpoint::load_model;
use foxlm::config::Config;
use foxlm::generate::{generate, run_prompts, GenerateOptions, PromptJob};
use foxlm::model::{Ctx, Model};
use foxlm::presets::{deltanet_config, hgrn2_config, mamba2_config, samba_config, Variant};
use foxlm::sampling::{sample, Sampling};
use foxlm::serve::scheduler::{Batcher, CpuBatcher, Event, Running, SchedulerOptions, SchedulerStats, SeqRequest};
use rand::SeedableRng;
use std::collections::VecDeque;
use std::path::Path;
use std::sync::atomic::Ordering;

/// The loop `generate` was before it drove the engine.
fn old_generate(model: &Model, prompts: &[Vec<u32>], opts: &GenerateOptions) -> Vec<Vec<u32>> {
    let b = prompts.len();
    let (ids, t, start) = foxlm::generate::left_pad(prompts);
    let mut cache = model.new_cache(b, t + opts.max_new_tokens, start.clone());
    let ctx = Ctx { batch: b, seq: t, start: start.clone() };
    let (hidden, _) = model.forward_hidden(&ids, &ctx, Some(&mut cache), false);
    let d = model.config.hidden_size;
    let last: Vec<f32> = (0..b).flat_map(|r| hidden[((r + 1) * t - 1) * d..(r + 1) * t * d].to_vec()).collect();
    let mut logits = model.logits(&last);
    let v = model.config.vocab_size;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(opts.seed);
    let mut out = vec![Vec::new(); b];
    let mut done = vec![false; b];
    for step in 0..opts.max_new_tokens {
        let mut next = vec![0u32; b];
        for r in 0..b {
            let tok = sample(&logits[r * v..(r + 1) * v], &opts.sampling, &mut rng);
            next[r] = tok;
            if done[r] {
                continue;
            }
            if Some(tok) == opts.eos {
                done[r] = true;
                continue;
            }
            out[r].push(tok);
        }
        if done.iter().all(|&x| x) || step + 1 == opts.max_new_tokens {
            break;
        }
        let ctx = Ctx { batch: b, seq: 1, start: start.clone() };
        let (hidden, _) = model.forward_hidden(&next, &ctx, Some(&mut cache), false);
        logits = model.logits(&hidden);
    }
    out
}

/// The evaluations' greedy loop before it drove the engine (eval/niah.rs's `greedy_answer`):
/// the prompt through the cache in chunks, then a token at a time.
fn old_greedy_answer(model: &Model, prompt: &[u32], max_new: usize, chunk: usize, eos: Option<u32>) -> Vec<u32> {
    let d = model.config.hidden_size;
    let mut cache = model.new_cache(1, prompt.len() + max_new, None);
    let mut last = vec![];
    for c in prompt.chunks(chunk) {
        let (hidden, _) =
            model.forward_hidden(c, &Ctx { batch: 1, seq: c.len(), start: None }, Some(&mut cache), false);
        last = hidden[(c.len() - 1) * d..].to_vec();
    }
    let mut out = vec![];
    for step in 0..max_new {
        let tok = foxlm::sampling::argmax(&model.logits(&last));
        if Some(tok) == eos {
            break;
        }
        out.push(tok);
        if step + 1 == max_new {
            break;
        }
        let (hidden, _) = model.forward_hidden(&[tok], &Ctx { batch: 1, seq: 1, start: None }, Some(&mut cache), false);
        last = hidden;
    }
    out
}

fn small(mut c: Config) -> Config {
    c.vocab_size = 97;
    (c.bos_token_id, c.eos_token_id) = (None, None);
    c.validate().unwrap();
    c
}

/// One small model per family (random weights; FoX from the authors' fixture).
fn families() -> Vec<(&'static str, Model)> {
    let fox = load_model(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/official-fox-tiny/fox_pro"))
        .expect("fixture");
    let mut mamba2 = mamba2_config(32, 2);
    (mamba2.num_heads, mamba2.ssm_head_dim, mamba2.state_size, mamba2.n_groups) = (4, Some(16), Some(8), Some(2));
    let mut samba = samba_config(32, 4, 4, 8);
    samba.attn.as_mut().unwrap().num_kv_heads = Some(2);
    samba.state_size = Some(8);
    let mut gated = deltanet_config(32, 2, 4, true);
    (gated.ssm_head_dim, gated.expand_v) = (Some(8), Some(2.0));
    let cfgs = [
        ("transformer", Variant::TransformerLlama.config(32, 2, 2)),
        ("mamba2", mamba2),
        ("samba", samba),
        ("deltanet", deltanet_config(32, 2, 2, false)),
        ("gated-deltanet", gated),
        ("hgrn2", hgrn2_config(32, 2, 8)),
    ];
    let mut out = vec![("fox", fox)];
    out.extend(cfgs.into_iter().enumerate().map(|(i, (n, c))| (n, random_recurrent_model(&small(c), 11 + i as u64))));
    out
}

fn greedy(n: usize, eos: Option<u32>) -> GenerateOptions {
    GenerateOptions { max_new_tokens: n, sampling: Sampling::default(), seed: 0, eos }
}

fn prompts(vocab: usize) -> Vec<Vec<u32>> {
    vec![random_ids(vocab, 7, 1), random_ids(vocab, 19, 2), random_ids(vocab, 1, 3), random_ids(vocab, 12, 4)]
}

#[test]
fn greedy_equals_the_old_loop_for_every_family() {
    for (name, model) in families() {
        let v = model.config.vocab_size;
        let ps = prompts(v);
        // A batch of prompts of different lengths, and each alone.
        let want = old_generate(&model, &ps, &greedy(10, None));
        let mut streamed = vec![Vec::new(); ps.len()];
        let got = generate(&model, &ps, &greedy(10, None), |r, id| streamed[r].push(id));
        assert_eq!(got, want, "{name}: a batch of 4");
        assert_eq!(streamed, got, "{name}: on_token sees every token");
        assert!(got.iter().all(|r| r.len() == 10), "{name}: {got:?}");
        for (p, w) in ps.iter().zip(&want) {
            assert_eq!(&generate(&model, std::slice::from_ref(p), &greedy(10, None), |_, _| {})[0], w, "{name}: alone");
        }
        // End of sequence: the token the second row chooses third ends it there; the other rows
        // stop wherever they choose it (or run to the limit).
        let eos = want[1][2];
        let want_eos = old_generate(&model, &ps, &greedy(10, Some(eos)));
        assert!(want_eos[1].len() <= 2, "{name}");
        assert_eq!(generate(&model, &ps, &greedy(10, Some(eos)), |_, _| {}), want_eos, "{name}: eos");
        // Token limits.
        for n in [0, 1, 2] {
            assert_eq!(generate(&model, &ps, &greedy(n, None), |_, _| {}), old_generate(&model, &ps, &greedy(n, None)));
        }
    }
}

/// What `eval niah`, `eval ruler` and `eval longbench` run (`Infer::greedy`): the old chunked loop's
/// tokens, with the progress of every prefilled position.
#[test]
fn evaluation_greedy_equals_the_old_chunked_loop() {
    use foxlm::infer::Infer;
    for (name, model) in families() {
        let v = model.config.vocab_size;
        let prompt = random_ids(v, 45, 41);
        let want = old_greedy_answer(&model, &prompt, 12, 10, None);
        let mut e = foxlm::infer::CpuInfer { model: &model };
        let mut seen = Vec::new();
        let got = e.greedy(&prompt, 12, 10, None, &mut |n| seen.push(n)).unwrap();
        assert_eq!(got, want, "{name}");
        assert_eq!(seen, vec![10, 10, 10, 10, 5], "{name}: progress per chunk");
        let eos = Some(want[4]);
        assert_eq!(
            e.greedy(&prompt, 12, 10, eos, &mut |_| {}).unwrap(),
            old_greedy_answer(&model, &prompt, 12, 10, eos)
        );
    }
}

#[test]
fn sampling_is_seeded_per_row() {
    for (name, model) in families().into_iter().take(3) {
        let v = model.config.vocab_size;
        let ps = prompts(v);
        let s = Sampling { temperature: 0.9, top_k: 20, top_p: 0.95 };
        let opts = |seed| GenerateOptions { max_new_tokens: 12, sampling: s.clone(), seed, eos: None };
        // One prompt: the old loop's draws exactly (one generator seeded with the seed).
        let one = generate(&model, &ps[..1], &opts(5), |_, _| {});
        assert_eq!(one, old_generate(&model, &ps[..1], &opts(5)), "{name}");
        // A batch: row r draws from its own generator seeded with seed + r, whatever the other rows.
        let batch = generate(&model, &ps, &opts(5), |_, _| {});
        for (r, p) in ps.iter().enumerate() {
            let alone = generate(&model, std::slice::from_ref(p), &opts(5 + r as u64), |_, _| {});
            assert_eq!(batch[r], alone[0], "{name}: row {r}");
        }
        assert_eq!(batch, generate(&model, &ps, &opts(5), |_, _| {}), "{name}: a seed repeats");
        assert_ne!(batch, generate(&model, &ps, &opts(6), |_, _| {}), "{name}: another seed differs");
        assert_ne!(batch, generate(&model, &ps, &greedy(12, None), |_, _| {}), "{name}: sampled is not greedy");
    }
}

#[test]
fn chunked_prefill_equals_whole_prefill() {
    for (name, model) in families() {
        let v = model.config.vocab_size;
        // Two long prompts within a chunk of each other (one group, padded) and a short one (its
        // own group: its padding would pass the first chunk).
        let ps = vec![random_ids(v, 41, 7), random_ids(v, 37, 8), random_ids(v, 3, 9)];
        let whole = old_generate(&model, &ps, &greedy(8, None));
        for chunk in [1, 5, 16, 64] {
            let mut b = CpuBatcher::new(&model);
            let mut seen = 0;
            let opts = greedy(8, None);
            let job =
                PromptJob { prompts: &ps, opts: &opts, chunk, on_token: &mut |_, _| {}, progress: &mut |n| seen += n };
            let got = run_prompts(&mut b, job).unwrap();
            assert_eq!(got, whole, "{name}: chunks of {chunk}");
            // progress covers every group's padded positions once: {41, 37, 3} in one group when
            // no prompt passes a chunk, else the short one alone, and the long ones together only
            // when their padding (4) ends inside the first chunk.
            let want_seen = match chunk {
                64 => 41,
                5 | 16 => 41 + 3,
                _ => 41 + 37 + 3,
            };
            assert_eq!(seen, want_seen, "{name}: chunks of {chunk}");
        }
    }
}

/// A stream running while a long prompt arrives decodes a token between every two chunks of the
/// newcomer's prefill; both get what each would alone.
#[test]
fn running_stream_decodes_between_prefill_chunks() {
    for (name, model) in families().into_iter().filter(|(n, _)| ["fox", "mamba2", "hgrn2"].contains(n)) {
        let v = model.config.vocab_size;
        let (short, long) = (random_ids(v, 4, 21), random_ids(v, 60, 22));
        let opts = SchedulerOptions::in_process(4, 8);
        let stats = SchedulerStats::default();
        let mut b = CpuBatcher::new(&model);
        let mut running: Vec<Running> = Vec::new();
        let mut waiting: VecDeque<SeqRequest> = VecDeque::new();
        let (a, mut a_rx) = SeqRequest::new(short.clone(), 40, Sampling::default(), 0, None);
        waiting.push_back(a);
        b.advance(&opts, &stats, &mut running, &mut waiting).unwrap();
        assert_eq!(running.len(), 1, "{name}: the short prompt runs after one step");
        let (n, mut n_rx) = SeqRequest::new(long.clone(), 5, Sampling::default(), 0, None);
        waiting.push_back(n);
        let (mut a_out, mut n_out) = (Vec::new(), Vec::new());
        let drain = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<Event>, out: &mut Vec<u32>| {
            while let Ok(e) = rx.try_recv() {
                if let Event::Token(id, _) = e {
                    out.push(id);
                }
            }
        };
        drain(&mut a_rx, &mut a_out);
        let mut trace = Vec::new();
        while !(running.is_empty() && waiting.is_empty() && b.pending() == 0) {
            let (c0, a0) = (stats.prefill_chunks.load(Ordering::Relaxed), a_out.len());
            b.advance(&opts, &stats, &mut running, &mut waiting).unwrap();
            drain(&mut a_rx, &mut a_out);
            drain(&mut n_rx, &mut n_out);
            trace.push((stats.prefill_chunks.load(Ordering::Relaxed) - c0, a_out.len() - a0));
        }
        // The newcomer's 60 positions: 8 chunks, in 8 engine steps, each followed by a token of
        // the running stream (it has 40 to give).
        let chunked: Vec<_> = trace.iter().filter(|(c, _)| *c == 1).collect();
        assert_eq!(chunked.len(), 8, "{name}: {trace:?}");
        assert!(chunked.iter().all(|(_, a)| *a == 1), "{name}: a stream waited for a chunk: {trace:?}");
        assert_eq!(stats.prefill_positions.load(Ordering::Relaxed), 4 + 60, "{name}");
        assert_eq!(a_out, generate(&model, std::slice::from_ref(&short), &greedy(40, None), |_, _| {})[0], "{name}");
        assert_eq!(n_out, generate(&model, std::slice::from_ref(&long), &greedy(5, None), |_, _| {})[0], "{name}");
    }
}

/// The server with small prefill chunks answers as `generate` does (its queue loop waits for a
/// prefill under way, which holds no running or waiting sequence).
#[test]
fn server_with_small_prefill_chunks_answers_as_generate() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/official-fox-tiny/fox_pro");
    let model = load_model(&dir).unwrap();
    let mut o = foxlm::serve::ServeOptions::new(dir);
    (o.port, o.device, o.prefill_chunk) = (0, foxlm::backend::DeviceArg::Cpu, 3);
    let server = foxlm::serve::start(&o).unwrap();
    let ps = vec![random_ids(512, 25, 31), random_ids(512, 2, 32), random_ids(512, 11, 33)];
    let body = serde_json::json!({"prompt": ps, "max_tokens": 6, "temperature": 0, "ignore_eos": true, "return_token_ids": true});
    let (status, v) = foxlm::serve::client::json_request(server.addr, "/v1/completions", Some(&body), None).unwrap();
    assert_eq!(status, 200, "{v}");
    let want = old_generate(&model, &ps, &greedy(6, None));
    for (i, w) in want.iter().enumerate() {
        let got: Vec<u32> =
            v["choices"][i]["token_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        assert_eq!(&got, w, "prompt {i}");
    }
    let (_, st) = foxlm::serve::client::json_request(server.addr, "/stats", None, None).unwrap();
    assert!(st["prefill_chunks"].as_u64().unwrap() >= 9 + 4, "{st}");
    server.shutdown().unwrap();
}
