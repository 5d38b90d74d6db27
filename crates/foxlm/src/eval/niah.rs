//! Needle in a haystack (SPEC §5).
//!
//! A prompt of exactly `length` tokens is
//!
//! ```text
//! BOS, haystack[..k], needle, haystack[k..H], question
//! ```
//!
//! where the haystack is cut to H = length − 1 − |needle| − |question| tokens and k is the sentence
//! boundary of the cut haystack nearest to depth · H. The needle and question texts follow the
//! authors' evaluation (`eval/niah/config-prompt-{standard,easy}.yaml` in their repository): in
//! easy mode the needle carries the question too. The model answers greedily; the answer is scored
//! by [`score_answer`]: 10 × the fraction of the needle's answer words it reproduces, in order.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// The answer the needle holds (what completes "The best thing to do in San Francisco is").
pub const ANSWER: &str = "eat a sandwich and sit in Dolores Park on a sunny day.";
pub const QUESTION: &str = "What is the best thing to do in San Francisco?";
pub const ANSWER_PREFIX: &str = "Answer: The best thing to do in San Francisco is";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The needle also carries the question and the answer prefix.
    Easy,
    /// The needle is the bare statement.
    Standard,
}

impl Mode {
    /// The needle text, as inserted (on its own line).
    pub fn needle(self) -> String {
        let statement = format!("The best thing to do in San Francisco is {ANSWER}");
        match self {
            Mode::Standard => format!("\n{statement}\n"),
            Mode::Easy => format!("\n{QUESTION} Answer: {statement}\n"),
        }
    }
}

/// What follows the haystack; the model's continuation of it is the answer.
pub fn question_suffix() -> String {
    format!(
        "\n\nThere is an important piece of information hidden inside the above document. Now that you've read the \
         document, I will quiz you about it. Answer the following question: {QUESTION} {ANSWER_PREFIX}"
    )
}

/// Filler text in tokens, with the token offsets at which sentences start.
#[derive(Clone, Debug)]
pub struct Haystack {
    pub tokens: Vec<u32>,
    /// Ascending offsets into `tokens` where a sentence begins (0 included).
    pub boundaries: Vec<usize>,
}

/// Splits text into sentences: a piece ends after `.`, `!` or `?` (and any closing quotes or
/// brackets) that is followed by whitespace; the whitespace starts the next piece, so a BPE that
/// glues a leading space to the next word tokenizes each piece as it would the whole text.
pub fn split_sentences(text: &str) -> Vec<&str> {
    let b = text.as_bytes();
    let mut out = vec![];
    let mut start = 0;
    let mut i = 0;
    while i < b.len() {
        if matches!(b[i], b'.' | b'!' | b'?') {
            let mut j = i + 1;
            while j < b.len() && matches!(b[j], b'"' | b'\'' | b')' | b']') {
                j += 1;
            }
            if j < b.len() && b[j].is_ascii_whitespace() {
                out.push(&text[start..j]);
                start = j;
                i = j;
                continue;
            }
            i = j;
            continue;
        }
        i += 1;
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

impl Haystack {
    /// Tokenizes `text` sentence by sentence, repeating the text until it has at least
    /// `min_tokens` tokens (a short filler is reused, as the authors' code does).
    pub fn from_text(text: &str, min_tokens: usize, encode: impl Fn(&str) -> Vec<u32>) -> Result<Self> {
        let sentences: Vec<Vec<u32>> =
            split_sentences(text).into_iter().map(&encode).filter(|t| !t.is_empty()).collect();
        if sentences.is_empty() {
            bail!("the haystack text is empty");
        }
        let mut tokens = vec![];
        let mut boundaries = vec![];
        while tokens.len() < min_tokens.max(1) {
            for s in &sentences {
                boundaries.push(tokens.len());
                tokens.extend_from_slice(s);
            }
        }
        Ok(Self { tokens, boundaries })
    }
}

/// A built prompt and where its parts lie.
#[derive(Clone, Debug, Serialize)]
pub struct NeedlePrompt {
    #[serde(skip)]
    pub ids: Vec<u32>,
    /// Tokens of haystack kept (H).
    pub haystack_tokens: usize,
    /// Offset of the needle's first token in the prompt (BOS counted).
    pub needle_start: usize,
    pub needle_tokens: usize,
    /// Where the needle went in the haystack, as a fraction of H (k / H).
    pub actual_depth: f64,
}

/// Builds the prompt of exactly `length` tokens with the needle at the sentence boundary nearest
/// to `depth` (0 = start, 1 = end) of the cut haystack.
pub fn build_prompt(
    hay: &Haystack,
    needle: &[u32],
    question: &[u32],
    bos: u32,
    length: usize,
    depth: f64,
) -> Result<NeedlePrompt> {
    if !(0.0..=1.0).contains(&depth) {
        bail!("depth {depth} must lie in [0, 1]");
    }
    let fixed = 1 + needle.len() + question.len();
    if length <= fixed {
        bail!("length {length} leaves no room for a haystack (needle and question take {fixed} tokens)");
    }
    let h = length - fixed;
    if hay.tokens.len() < h {
        bail!("the haystack has {} tokens, {h} are needed", hay.tokens.len());
    }
    let target = depth * h as f64;
    // Sentence starts inside the cut haystack, plus its end.
    let k = hay
        .boundaries
        .iter()
        .copied()
        .take_while(|&b| b <= h)
        .chain(std::iter::once(h))
        .min_by(|&a, &b| (a as f64 - target).abs().total_cmp(&(b as f64 - target).abs()))
        .unwrap_or(0);
    let mut ids = Vec::with_capacity(length);
    ids.push(bos);
    ids.extend_from_slice(&hay.tokens[..k]);
    ids.extend_from_slice(needle);
    ids.extend_from_slice(&hay.tokens[k..h]);
    ids.extend_from_slice(question);
    debug_assert_eq!(ids.len(), length);
    Ok(NeedlePrompt {
        ids,
        haystack_tokens: h,
        needle_start: 1 + k,
        needle_tokens: needle.len(),
        actual_depth: k as f64 / h as f64,
    })
}

/// Lower-cased words of `s`, with everything but letters and digits removed.
pub fn words(s: &str) -> Vec<String> {
    s.split_whitespace()
        .map(|w| w.chars().filter(|c| c.is_alphanumeric()).flat_map(|c| c.to_lowercase()).collect::<String>())
        .filter(|w| !w.is_empty())
        .collect()
}

/// Score 0–10 of a response: 10 × (longest common subsequence of the answer's words and the
/// response's first 2·|answer| words) / |answer words|. Case and punctuation are ignored; words
/// count only in the answer's order, and rambling past twice the answer's length earns nothing.
pub fn score_answer(response: &str, answer: &str) -> f64 {
    let a = words(answer);
    if a.is_empty() {
        return 0.0;
    }
    let mut r = words(response);
    r.truncate(2 * a.len());
    10.0 * lcs_len(&a, &r) as f64 / a.len() as f64
}

/// The length of the longest common subsequence of two word lists (dynamic programming over one
/// row of `b`).
pub fn lcs_len(a: &[String], b: &[String]) -> usize {
    let mut row = vec![0usize; b.len() + 1];
    for aw in a {
        let mut diag = 0;
        for (j, bw) in b.iter().enumerate() {
            let up = row[j + 1];
            row[j + 1] = if aw == bw { diag + 1 } else { up.max(row[j]) };
            diag = up;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_split_after_terminators_followed_by_space() {
        let s = split_sentences("One. Two? \"Three!\" Four 3.5 five.\n\nSix");
        assert_eq!(s, vec!["One.", " Two?", " \"Three!\"", " Four 3.5 five.", "\n\nSix"]);
        assert_eq!(s.concat(), "One. Two? \"Three!\" Four 3.5 five.\n\nSix");
    }
}
