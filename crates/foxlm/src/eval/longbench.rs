//! LongBench (Bai et al., 2023): its released task files (one jsonl per dataset, each line with
//! `input`, `context`, `answers` and, for classification, `all_classes`), a prompt per dataset,
//! truncation in the middle to the model's length, greedy answers, and the benchmark's metric per
//! dataset: token F1 for question answering, ROUGE-L for summaries, accuracy for classification,
//! counting and retrieval, edit similarity for code. Scores are the mean over samples of the best
//! score over a sample's answers, in percent.
//!
//! The prompt texts are this project's own wording of each dataset's instruction; the answer
//! lengths per dataset follow the benchmark's settings.

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// The metric a dataset is scored with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    QaF1,
    RougeL,
    Classification,
    Count,
    Retrieval,
    EditSimilarity,
}

/// A dataset's prompt (with `{context}` and `{input}`), its answer length, and its metric.
pub struct Dataset {
    pub name: &'static str,
    pub prompt: &'static str,
    pub max_new_tokens: usize,
    pub metric: Metric,
}

const QA: &str =
    "Read the text below and answer the question as briefly as you can.\n\n{context}\n\nQuestion: {input}\nAnswer:";

/// The multi-document QA sets' prompt.
const PASSAGES_QA: &str =
    "Answer the question from the passages below; give only the answer.\n\n{context}\n\nQuestion: {input}\nAnswer:";

pub const DATASETS: &[Dataset] = &[
    Dataset { name: "narrativeqa", prompt: "Here is a story. Answer the question about it in as few words as possible.\n\nStory: {context}\n\nQuestion: {input}\nAnswer:", max_new_tokens: 128, metric: Metric::QaF1 },
    Dataset { name: "qasper", prompt: "Here is a scientific article. Answer the question in a phrase or sentence; write \"unanswerable\" if the article does not say, or \"yes\"/\"no\" for a yes-no question.\n\nArticle: {context}\n\nQuestion: {input}\nAnswer:", max_new_tokens: 128, metric: Metric::QaF1 },
    Dataset { name: "multifieldqa_en", prompt: QA, max_new_tokens: 64, metric: Metric::QaF1 },
    Dataset { name: "hotpotqa", prompt: PASSAGES_QA, max_new_tokens: 32, metric: Metric::QaF1 },
    Dataset { name: "2wikimqa", prompt: PASSAGES_QA, max_new_tokens: 32, metric: Metric::QaF1 },
    Dataset { name: "musique", prompt: PASSAGES_QA, max_new_tokens: 32, metric: Metric::QaF1 },
    Dataset { name: "triviaqa", prompt: "Answer the last question in the same way as the examples.\n\n{context}\n\n{input}", max_new_tokens: 32, metric: Metric::QaF1 },
    Dataset { name: "gov_report", prompt: "Here is a government report. Summarise it.\n\nReport: {context}\n\nSummary:", max_new_tokens: 512, metric: Metric::RougeL },
    Dataset { name: "qmsum", prompt: "Here is a meeting transcript. Answer the query about it with a short summary.\n\nTranscript: {context}\n\nQuery: {input}\nAnswer:", max_new_tokens: 512, metric: Metric::RougeL },
    Dataset { name: "multi_news", prompt: "Here are several news articles. Summarise them together.\n\nNews: {context}\n\nSummary:", max_new_tokens: 512, metric: Metric::RougeL },
    Dataset { name: "samsum", prompt: "Summarise the last dialogue in the same way as the examples.\n\n{context}\n\n{input}", max_new_tokens: 128, metric: Metric::RougeL },
    Dataset { name: "trec", prompt: "Give the type of the last question, as in the examples.\n\n{context}\n{input}", max_new_tokens: 64, metric: Metric::Classification },
    Dataset { name: "passage_count", prompt: "Below are paragraphs, some of them repeated. How many distinct paragraphs are there? Answer with a number only.\n\n{context}\n\nThe number of distinct paragraphs is:", max_new_tokens: 32, metric: Metric::Count },
    Dataset { name: "passage_retrieval_en", prompt: "Below are paragraphs and then a summary of one of them. Which paragraph does the summary describe? Answer like \"Paragraph 1\".\n\n{context}\n\nSummary: {input}\n\nThe summary describes:", max_new_tokens: 32, metric: Metric::Retrieval },
    Dataset { name: "lcc", prompt: "Complete the next line of the code below.\n{context}Next line of code:\n", max_new_tokens: 64, metric: Metric::EditSimilarity },
    Dataset { name: "repobench-p", prompt: "Complete the next line of the code below.\n{context}{input}Next line of code:\n", max_new_tokens: 64, metric: Metric::EditSimilarity },
];

pub fn dataset(name: &str) -> Result<&'static Dataset> {
    DATASETS.iter().find(|d| d.name == name).ok_or_else(|| {
        let names: Vec<&str> = DATASETS.iter().map(|d| d.name).collect();
        anyhow::anyhow!("unknown LongBench dataset '{name}' (known: {})", names.join(", "))
    })
}

/// One line of a task file.
#[derive(Clone, Debug)]
pub struct Sample {
    pub input: String,
    pub context: String,
    pub answers: Vec<String>,
    pub all_classes: Vec<String>,
}

/// Reads a task file; every error names the file, the line and the field.
pub fn read_jsonl(path: &std::path::Path) -> Result<Vec<Sample>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = || format!("{}:{}", path.display(), i + 1);
        let v: Value = serde_json::from_str(line).with_context(|| format!("{}: not JSON", at()))?;
        let s = |k: &str| -> Result<String> {
            match v.get(k) {
                Some(Value::String(s)) => Ok(s.clone()),
                None | Some(Value::Null) => Ok(String::new()),
                Some(_) => bail!("{}: '{k}' must be a string", at()),
            }
        };
        let list = |k: &str| -> Result<Vec<String>> {
            match v.get(k) {
                None | Some(Value::Null) => Ok(vec![]),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|x| {
                        x.as_str()
                            .map(str::to_string)
                            .ok_or_else(|| anyhow::anyhow!("{}: '{k}' must hold strings", at()))
                    })
                    .collect(),
                Some(_) => bail!("{}: '{k}' must be a list of strings", at()),
            }
        };
        let answers = list("answers")?;
        if answers.is_empty() {
            bail!("{}: 'answers' is missing or empty", at());
        }
        out.push(Sample { input: s("input")?, context: s("context")?, answers, all_classes: list("all_classes")? });
    }
    Ok(out)
}

/// The dataset's prompt for a sample.
pub fn prompt(d: &Dataset, s: &Sample) -> String {
    d.prompt.replace("{context}", &s.context).replace("{input}", &s.input)
}

/// The first and last `max / 2` tokens (LongBench's truncation in the middle, which keeps the
/// instruction at the start and the question at the end) when `ids` is longer than `max`.
pub fn truncate_middle(ids: &[u32], max: usize) -> Vec<u32> {
    if ids.len() <= max {
        return ids.to_vec();
    }
    let half = max / 2;
    let mut out = ids[..half].to_vec();
    out.extend_from_slice(&ids[ids.len() - (max - half)..]);
    out
}

/// Lower case, punctuation and the articles a/an/the removed, whitespace collapsed (SQuAD's
/// normalisation, which LongBench's QA F1 uses).
pub fn normalize(s: &str) -> Vec<String> {
    s.to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_punctuation() { ' ' } else { c })
        .collect::<String>()
        .split_whitespace()
        .filter(|w| !matches!(*w, "a" | "an" | "the"))
        .map(str::to_string)
        .collect()
}

fn f1_of(pred: &[String], truth: &[String]) -> f64 {
    let mut counts = std::collections::HashMap::new();
    for t in truth {
        *counts.entry(t.as_str()).or_insert(0i64) += 1;
    }
    let mut same = 0;
    for p in pred {
        if let Some(c) = counts.get_mut(p.as_str()) {
            if *c > 0 {
                *c -= 1;
                same += 1;
            }
        }
    }
    if same == 0 {
        return 0.0;
    }
    let (p, r) = (same as f64 / pred.len() as f64, same as f64 / truth.len() as f64);
    2.0 * p * r / (p + r)
}

/// Token F1 of the normalised prediction and answer.
pub fn qa_f1(pred: &str, answer: &str) -> f64 {
    f1_of(&normalize(pred), &normalize(answer))
}

/// ROUGE-L F-measure over lower-cased words (longest common subsequence).
pub fn rouge_l(pred: &str, answer: &str) -> f64 {
    let words = |s: &str| -> Vec<String> {
        s.to_lowercase().split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(str::to_string).collect()
    };
    let (p, a) = (words(pred), words(answer));
    if p.is_empty() || a.is_empty() {
        return 0.0;
    }
    let lcs = super::niah::lcs_len(&a, &p) as f64;
    if lcs == 0.0 {
        return 0.0;
    }
    let (prec, rec) = (lcs / p.len() as f64, lcs / a.len() as f64);
    2.0 * prec * rec / (prec + rec)
}

/// 1 − Levenshtein distance / the longer length, over characters.
pub fn edit_similarity(a: &str, b: &str) -> f64 {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    if a.is_empty() && b.is_empty() {
        return 1.0;
    }
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    1.0 - prev[b.len()] as f64 / a.len().max(b.len()) as f64
}

/// The score of one prediction against one answer under `metric`.
pub fn score(metric: Metric, pred: &str, answer: &str, all_classes: &[String]) -> f64 {
    let numbers = |s: &str| -> Vec<String> {
        s.split(|c: char| !c.is_ascii_digit()).filter(|n| !n.is_empty()).map(str::to_string).collect()
    };
    match metric {
        // Only the answer's first line (the model may go on).
        Metric::QaF1 => qa_f1(pred.trim_start().lines().next().unwrap_or(""), answer),
        Metric::RougeL => rouge_l(pred, answer),
        Metric::Classification => {
            // The classes the prediction names, less those inside the true class's name; credit
            // split among them.
            let named: Vec<&String> = all_classes
                .iter()
                .filter(|c| pred.contains(c.as_str()))
                .filter(|c| c.as_str() == answer || !answer.contains(c.as_str()))
                .collect();
            if named.iter().any(|c| c.as_str() == answer) {
                1.0 / named.len() as f64
            } else {
                0.0
            }
        }
        Metric::Count => {
            let n = numbers(pred);
            if n.is_empty() {
                0.0
            } else {
                n.iter().filter(|x| x.as_str() == answer.trim()).count() as f64 / n.len() as f64
            }
        }
        Metric::Retrieval => {
            let Some(want) = numbers(answer).into_iter().next() else { return 0.0 };
            let n = numbers(pred);
            if n.is_empty() {
                0.0
            } else {
                n.iter().filter(|x| **x == want).count() as f64 / n.len() as f64
            }
        }
        Metric::EditSimilarity => {
            // The first line that is code (not a comment).
            let line = pred
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty() && !l.starts_with("//") && !l.starts_with('#') && !l.starts_with('`'))
                .unwrap_or("");
            edit_similarity(line, answer.trim())
        }
    }
}

/// The best score of `pred` over a sample's answers.
pub fn best_score(metric: Metric, pred: &str, s: &Sample) -> f64 {
    s.answers.iter().map(|a| score(metric, pred, a, &s.all_classes)).fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_give_known_values() {
        assert_eq!(qa_f1("The Eiffel Tower!", "eiffel tower"), 1.0);
        // pred {paris, france, city}, truth {paris}: p 1/3, r 1 → 0.5
        assert!((qa_f1("Paris, France city", "Paris") - 0.5).abs() < 1e-12);
        assert_eq!(qa_f1("London", "Paris"), 0.0);
        // LCS "the cat sat" of 4 and 3 words: p 3/4, r 1 → 6/7
        assert!((rouge_l("the cat sat down", "the cat sat") - 6.0 / 7.0).abs() < 1e-12);
        assert!((edit_similarity("kitten", "sitting") - (1.0 - 3.0 / 7.0)).abs() < 1e-12);
        assert_eq!(edit_similarity("abc", "abc"), 1.0);
        let classes: Vec<String> = ["Location", "Number", "Date"].iter().map(|s| s.to_string()).collect();
        assert_eq!(score(Metric::Classification, "Number", "Number", &classes), 1.0);
        assert_eq!(score(Metric::Classification, "Number or Date", "Number", &classes), 0.5);
        assert_eq!(score(Metric::Classification, "Location", "Number", &classes), 0.0);
        assert_eq!(score(Metric::Count, "There are 7 or 8", "7", &[]), 0.5);
        assert_eq!(score(Metric::Retrieval, "Paragraph 12", "Paragraph 12", &[]), 1.0);
        assert_eq!(score(Metric::EditSimilarity, "// next\n  x = 1;\n", "x = 1;", &[]), 1.0);
        assert_eq!(score(Metric::QaF1, " blue\nand more text", "blue", &[]), 1.0);
    }

    #[test]
    fn truncation_keeps_both_ends() {
        let ids: Vec<u32> = (0..10).collect();
        assert_eq!(truncate_middle(&ids, 4), vec![0, 1, 8, 9]);
        assert_eq!(truncate_middle(&ids, 5), vec![0, 1, 7, 8, 9]);
        assert_eq!(truncate_middle(&ids, 10), ids);
    }

    #[test]
    fn every_dataset_prompt_takes_its_fields() {
        for d in DATASETS {
            assert!(d.prompt.contains("{context}"), "{}", d.name);
            let s =
                Sample { input: "QQQ".into(), context: "CCC".into(), answers: vec!["a".into()], all_classes: vec![] };
            let p = prompt(d, &s);
            assert!(p.contains("CCC") && !p.contains("{context}") && !p.contains("{input}"), "{}", d.name);
        }
        assert!(dataset("nope").is_err());
    }
}
