//! RULER-style synthetic long-context tasks (Hsieh et al., 2024, "RULER: What's the Real Context
//! Size of Your Long-Context Language Models?"), beside the single needle of [`super::niah`]:
//!
//! - `multikey`: several key → number needles in the haystack; the question names one key and the
//!   answer is its number (the others are distractors);
//! - `multivalue`: one key with several numbers in separate needles; all of them are the answer;
//! - `vt` (variable tracking): `VAR A = 12345.` then assignments `VAR B = VAR A.` along a chain,
//!   with a second chain of another value as a distractor; the answer is every variable of the
//!   first chain;
//! - `cwe` (common-word extraction): a numbered list of words in which ten words appear many
//!   times and the others a few times; the answer is the ten frequent ones.
//!
//! The needle tasks fill the rest of the prompt with any haystack text, cut at sentence boundaries
//! ([`Haystack`]), the needles spread over random depths; their prompts are exactly `length`
//! tokens (BOS included). The words of `cwe` are drawn from the haystack's own words, the frequent
//! ones repeated up to 30 times (fewer in short prompts, where they would take over half the room)
//! and each other word 3 times, the list growing while it fits: at most `length` tokens. A response scores the fraction of the expected
//! strings it contains (RULER's "all" string match, case-insensitive), 0 to 1.
//!
//! The texts of the needles and questions are this project's own wording of RULER's task ideas.

use super::niah::Haystack;
use anyhow::{bail, ensure, Result};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// Several keys with a number each; asked for one.
    Multikey,
    /// One key with several numbers; asked for all.
    Multivalue,
    /// Variable tracking along a chain of assignments.
    Vt,
    /// The ten most common words of a list.
    Cwe,
}

impl Task {
    pub const ALL: [Task; 4] = [Task::Multikey, Task::Multivalue, Task::Vt, Task::Cwe];

    pub fn name(self) -> &'static str {
        match self {
            Task::Multikey => "multikey",
            Task::Multivalue => "multivalue",
            Task::Vt => "vt",
            Task::Cwe => "cwe",
        }
    }
}

/// How many needles, values, hops and words the tasks use.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Sizes {
    /// multikey: keys in the haystack (one asked for).
    pub keys: usize,
    /// multivalue: numbers of the one key.
    pub values: usize,
    /// vt: variables per chain (the value's own assignment included).
    pub chain: usize,
    /// cwe: frequent words, how often each appears, and how often each other word appears.
    pub common: usize,
    pub common_freq: usize,
    pub rare_freq: usize,
}

impl Default for Sizes {
    fn default() -> Self {
        Self { keys: 4, values: 4, chain: 5, common: 10, common_freq: 30, rare_freq: 3 }
    }
}

/// One sample: its prompt and the strings a correct answer contains.
#[derive(Clone, Debug)]
pub struct Sample {
    pub ids: Vec<u32>,
    pub answers: Vec<String>,
}

/// A random 7-digit number.
fn number(rng: &mut ChaCha8Rng) -> String {
    rng.gen_range(1_000_000u32..10_000_000).to_string()
}

/// A random name of five capital letters.
fn var_name(rng: &mut ChaCha8Rng) -> String {
    (0..5).map(|_| rng.gen_range(b'A'..=b'Z') as char).collect()
}

/// The haystack's distinct lower-case words (letters only, 3 to 12 long), in first-seen order.
pub fn word_pool(text: &str) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for w in text.split(|c: char| !c.is_ascii_alphabetic()) {
        let w = w.to_ascii_lowercase();
        if (3..=12).contains(&w.len()) && seen.insert(w.clone()) {
            out.push(w);
        }
    }
    out
}

/// `n` distinct items of `pool`.
fn distinct<'a>(pool: &'a [String], n: usize, rng: &mut ChaCha8Rng, what: &str) -> Result<Vec<&'a String>> {
    ensure!(pool.len() >= n, "the haystack has {} distinct words; {what} needs {n}", pool.len());
    Ok(pool.choose_multiple(rng, n).collect())
}

/// BOS, the haystack cut to fill `length` tokens with the needles inserted at sentence boundaries
/// nearest to random depths (in the needles' order), then the question.
fn with_needles(
    hay: &Haystack,
    needles: &[Vec<u32>],
    question: &[u32],
    bos: u32,
    length: usize,
    rng: &mut ChaCha8Rng,
) -> Result<Vec<u32>> {
    let fixed = 1 + needles.iter().map(|n| n.len()).sum::<usize>() + question.len();
    ensure!(
        length > fixed,
        "length {length} leaves no room for a haystack: the needles and question take {fixed} tokens"
    );
    let h = length - fixed;
    ensure!(hay.tokens.len() >= h, "the haystack has {} tokens, {h} are needed", hay.tokens.len());
    let bounds: Vec<usize> = hay.boundaries.iter().copied().take_while(|&b| b <= h).chain(std::iter::once(h)).collect();
    let mut at: Vec<usize> = (0..needles.len())
        .map(|_| {
            let target = rng.gen::<f64>() * h as f64;
            bounds.iter().copied().min_by(|&a, &b| (a as f64 - target).abs().total_cmp(&(b as f64 - target).abs()))
        })
        .map(|k| k.unwrap_or(0))
        .collect();
    at.sort_unstable();
    let mut ids = Vec::with_capacity(length);
    ids.push(bos);
    let mut from = 0;
    for (k, n) in at.iter().zip(needles) {
        ids.extend_from_slice(&hay.tokens[from..*k]);
        ids.extend_from_slice(n);
        from = *k;
    }
    ids.extend_from_slice(&hay.tokens[from..h]);
    ids.extend_from_slice(question);
    debug_assert_eq!(ids.len(), length);
    Ok(ids)
}

/// Builds sample `index` of `task` at `length` tokens (deterministic in `seed` and `index`).
#[allow(clippy::too_many_arguments)]
pub fn build(
    task: Task,
    hay: &Haystack,
    words: &[String],
    sizes: &Sizes,
    encode: &dyn Fn(&str) -> Vec<u32>,
    bos: u32,
    length: usize,
    seed: u64,
    index: u64,
) -> Result<Sample> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (index.wrapping_mul(0x9E37_79B9_7F4A_7C15)) ^ task as u64);
    let needle =
        |key: &str, value: &str| encode(&format!("\nOne of the special magic numbers for {key} is: {value}.\n"));
    match task {
        Task::Multikey => {
            ensure!(sizes.keys >= 1, "multikey needs at least one key");
            let keys = distinct(words, sizes.keys, &mut rng, "multikey")?;
            let values: Vec<String> = (0..sizes.keys).map(|_| number(&mut rng)).collect();
            let needles: Vec<Vec<u32>> = keys.iter().zip(&values).map(|(k, v)| needle(k, v)).collect();
            let ask = rng.gen_range(0..sizes.keys);
            let q = encode(&format!(
                "\n\nWhat is the special magic number for {k} mentioned in the text above? The special magic number \
                 for {k} mentioned in the text above is",
                k = keys[ask]
            ));
            let ids = with_needles(hay, &needles, &q, bos, length, &mut rng)?;
            Ok(Sample { ids, answers: vec![values[ask].clone()] })
        }
        Task::Multivalue => {
            ensure!(sizes.values >= 1, "multivalue needs at least one value");
            let key = distinct(words, 1, &mut rng, "multivalue")?[0].clone();
            let values: Vec<String> = (0..sizes.values).map(|_| number(&mut rng)).collect();
            let needles: Vec<Vec<u32>> = values.iter().map(|v| needle(&key, v)).collect();
            let q = encode(&format!(
                "\n\nWhat are all the special magic numbers for {key} mentioned in the text above? The special magic \
                 numbers for {key} mentioned in the text above are"
            ));
            let ids = with_needles(hay, &needles, &q, bos, length, &mut rng)?;
            Ok(Sample { ids, answers: values })
        }
        Task::Vt => {
            ensure!(sizes.chain >= 1, "vt needs chains of at least one variable");
            let mut names = std::collections::BTreeSet::new();
            while names.len() < 2 * sizes.chain {
                names.insert(var_name(&mut rng));
            }
            let mut names: Vec<String> = names.into_iter().collect();
            names.shuffle(&mut rng);
            let (a, b) = names.split_at(sizes.chain);
            let (va, vb) = loop {
                let (x, y) = (rng.gen_range(10_000u32..100_000), rng.gen_range(10_000u32..100_000));
                if x != y {
                    break (x, y);
                }
            };
            let chain = |vars: &[String], value: u32| -> Vec<String> {
                let mut s = vec![format!("\nVAR {} = {value}.\n", vars[0])];
                s.extend(vars.windows(2).map(|w| format!("\nVAR {} = VAR {}.\n", w[1], w[0])));
                s
            };
            // The two chains interleaved, each in its own order.
            let (ca, cb) = (chain(a, va), chain(b, vb));
            let mut order: Vec<bool> =
                std::iter::repeat_n(true, ca.len()).chain(std::iter::repeat_n(false, cb.len())).collect();
            order.shuffle(&mut rng);
            let (mut ia, mut ib) = (ca.iter(), cb.iter());
            let needles: Vec<Vec<u32>> = order
                .iter()
                .filter_map(|&first| if first { ia.next() } else { ib.next() })
                .map(|s| encode(s))
                .collect();
            let q = encode(&format!(
                "\n\nFind every variable that is assigned the value {va} in the text above, directly or through other \
                 variables. Answer: the variables assigned the value {va} are:"
            ));
            let ids = with_needles(hay, &needles, &q, bos, length, &mut rng)?;
            Ok(Sample { ids, answers: a.to_vec() })
        }
        Task::Cwe => {
            ensure!(
                sizes.common >= 1 && sizes.common_freq > sizes.rare_freq && sizes.rare_freq >= 1,
                "cwe needs frequent words that appear more often than the others"
            );
            let pool = distinct(words, words.len(), &mut rng, "cwe")?;
            ensure!(
                pool.len() > sizes.common,
                "the haystack has {} distinct words; cwe needs more than {}",
                pool.len(),
                sizes.common
            );
            let (common, rare) = pool.split_at(sizes.common);
            let q = encode(&format!(
                "\nWhat are the {n} most common words in the list above? Answer: the {n} words that appear most often \
                 in the list are:",
                n = sizes.common
            ));
            let budget = length.saturating_sub(1 + q.len());
            let render = |l: &[&String]| -> Vec<u32> {
                let text: String = l.iter().enumerate().map(|(i, w)| format!("{}. {w} ", i + 1)).collect();
                encode(&format!("Below is a numbered list of words.\n{text}"))
            };
            // Short prompts repeat the frequent words less (as RULER scales them with the length):
            // they take at most half the room, and still appear more often than the rare ones.
            let once = render(common).len().saturating_sub(render(&[]).len()).max(1);
            let freq = sizes.common_freq.min(budget / 2 / once).max(sizes.rare_freq + 1);
            let mut list: Vec<&String> = common.iter().flat_map(|w| std::iter::repeat_n(*w, freq)).collect();
            list.shuffle(&mut rng);
            let mut rare_used = 0;
            let mut body = render(&list);
            ensure!(
                body.len() <= budget,
                "length {length} is too short for cwe: its {} frequent words × {freq} take {} tokens",
                sizes.common,
                body.len() + 1 + q.len()
            );
            // Add rare words, rare_freq times each, while the list fits.
            while rare_used < rare.len() {
                let mut next = list.clone();
                next.extend(std::iter::repeat_n(rare[rare_used], sizes.rare_freq));
                next.shuffle(&mut rng);
                let b = render(&next);
                if b.len() > budget {
                    break;
                }
                (list, body) = (next, b);
                rare_used += 1;
            }
            let mut ids = Vec::with_capacity(1 + body.len() + q.len());
            ids.push(bos);
            ids.extend(body);
            ids.extend(q);
            Ok(Sample { ids, answers: common.iter().map(|w| w.to_string()).collect() })
        }
    }
}

/// RULER's "all" string match: the fraction of `answers` found in `response`, ignoring case.
pub fn score(response: &str, answers: &[String]) -> f64 {
    if answers.is_empty() {
        return 0.0;
    }
    let r = response.to_lowercase();
    answers.iter().filter(|a| r.contains(&a.to_lowercase())).count() as f64 / answers.len() as f64
}

/// Checks the lengths and sizes before any work.
pub fn check_lengths(lengths: &[usize], samples: usize) -> Result<()> {
    if lengths.is_empty() || lengths.contains(&0) {
        bail!("--lengths: give one or more lengths of at least 1 token");
    }
    if samples == 0 {
        bail!("--samples must be at least 1");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy tokenizer: one id per byte.
    fn bytes(s: &str) -> Vec<u32> {
        s.bytes().map(u32::from).collect()
    }

    fn hay() -> (Haystack, Vec<String>) {
        let text = "The whale swam far. Ahab watched the grey water closely. Ishmael counted the ropes again. \
                    Queequeg sharpened his harpoon slowly. The crew sang about distant harbours tonight. ";
        (Haystack::from_text(text, 4000, bytes).unwrap(), word_pool(text))
    }

    #[test]
    fn needle_prompts_have_the_length_and_hold_their_answers() {
        let (h, words) = hay();
        let sizes = Sizes::default();
        for task in [Task::Multikey, Task::Multivalue, Task::Vt] {
            for i in 0..3 {
                let s = build(task, &h, &words, &sizes, &bytes, 0, 1500, 7, i).unwrap();
                assert_eq!(s.ids.len(), 1500, "{task:?}");
                let text: String = s.ids[1..].iter().map(|&b| b as u8 as char).collect();
                for a in &s.answers {
                    assert!(text.contains(a.as_str()), "{task:?}: answer {a} not in the prompt");
                }
                let again = build(task, &h, &words, &sizes, &bytes, 0, 1500, 7, i).unwrap();
                assert_eq!(again.ids, s.ids, "deterministic");
            }
        }
        let mk = build(Task::Multikey, &h, &words, &sizes, &bytes, 0, 1500, 7, 0).unwrap();
        let text: String = mk.ids.iter().map(|&b| b as u8 as char).collect();
        assert_eq!(text.matches("special magic numbers for").count(), 4, "four keys");
        assert!(build(Task::Multikey, &h, &words, &sizes, &bytes, 0, 50, 7, 0).is_err(), "no room");
    }

    #[test]
    fn variable_tracking_chains_lead_to_their_value() {
        let (h, words) = hay();
        let s = build(Task::Vt, &h, &words, &Sizes::default(), &bytes, 0, 1500, 3, 1).unwrap();
        let text: String = s.ids.iter().map(|&b| b as u8 as char).collect();
        let value: String =
            text.rsplit("assigned the value ").nth(1).unwrap().chars().take_while(|c| c.is_ascii_digit()).collect();
        // Follow the assignments from the value: exactly the answer's variables.
        let mut found = vec![];
        let mut frontier = text
            .lines()
            .filter_map(|l| l.strip_prefix("VAR ").and_then(|r| r.strip_suffix(&format!(" = {value}."))))
            .map(str::to_string)
            .collect::<Vec<_>>();
        while let Some(v) = frontier.pop() {
            found.push(v.clone());
            frontier.extend(
                text.lines()
                    .filter_map(|l| l.strip_prefix("VAR ").and_then(|r| r.strip_suffix(&format!(" = VAR {v}."))))
                    .map(str::to_string),
            );
        }
        found.sort();
        let mut want = s.answers.clone();
        want.sort();
        assert_eq!(found, want);
        assert_eq!(want.len(), 5);
    }

    #[test]
    fn common_words_are_the_most_frequent() {
        let (h, words) = hay();
        let sizes = Sizes { common: 3, common_freq: 6, rare_freq: 2, ..Sizes::default() };
        let s = build(Task::Cwe, &h, &words, &sizes, &bytes, 0, 900, 5, 0).unwrap();
        assert!(s.ids.len() <= 900);
        let text: String = s.ids.iter().map(|&b| b as u8 as char).collect();
        let list = text.split("list of words.\n").nth(1).unwrap().split("\nWhat are").next().unwrap();
        let mut counts = std::collections::HashMap::new();
        for tok in list.split_whitespace().filter(|t| !t.ends_with('.')) {
            *counts.entry(tok.to_string()).or_insert(0) += 1;
        }
        for a in &s.answers {
            assert_eq!(counts[a], 6);
        }
        assert!(counts.len() > 3, "rare words were added");
        assert!(counts.iter().filter(|(w, _)| !s.answers.contains(w)).all(|(_, &c)| c == 2));
    }

    #[test]
    fn scores_count_the_answers_found() {
        let a = vec!["1234567".to_string(), "ABCDE".to_string()];
        assert_eq!(score(" 1234567 and abcde", &a), 1.0);
        assert_eq!(score("1234567", &a), 0.5);
        assert_eq!(score("nothing", &a), 0.0);
    }
}
