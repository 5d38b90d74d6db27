//! The tokenizer travels with the model: a Hugging Face `tokenizer.json` (and
//! `tokenizer_config.json`) that reproduces foxlm's GPT-2 tokenization offline, so that
//! `transformers.AutoTokenizer.from_pretrained(DIR)` and lm-evaluation-harness load it with no
//! network.
//!
//! The vocabulary and merges are derived from tiktoken's `r50k_base` ranks: each token of rank r is
//! the merge of the two parts that byte-pair encoding of its own bytes, restricted to ranks below r,
//! ends with. For json-escaped models a normalizer of literal replacements escapes `\`, `"`, the
//! ASCII control characters and the non-ASCII characters of [`ESCAPED_RANGES`] exactly as
//! [`crate::tokenizer::json_escape`]. Hugging Face normalizers cannot compute `\uXXXX` for any
//! character, so text with other non-ASCII characters tokenizes differently there:
//! lm-evaluation-harness should then use the server's tokenizer (`tokenizer_backend=remote`,
//! see docs/serving.md), which is exact.

use crate::config::Config;
use crate::tokenizer::text_format_for;
use crate::tokenizer::{TextFormat, Tokenizer, BOS_ID, GPT2_VOCAB};
use anyhow::{Context, Result};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;

pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
const EOT: &str = "<|endoftext|>";

/// GPT-2's map from bytes to printable characters (the alphabet of byte-level BPE).
pub fn byte_to_char() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        map[b as usize] = if printable {
            char::from_u32(b).unwrap_or('?')
        } else {
            extra += 1;
            char::from_u32(255 + extra).unwrap_or('?')
        };
    }
    map
}

/// The merges of r50k_base in rank order, as pairs of token ids.
fn merges(tok: &Tokenizer) -> Result<Vec<(u32, u32)>> {
    let n = BOS_ID;
    let bytes: Vec<&[u8]> = (0..n)
        .map(|id| tok.token_bytes(id).with_context(|| format!("r50k_base has no token {id}")))
        .collect::<Result<_>>()?;
    let rank: HashMap<&[u8], u32> = bytes.iter().enumerate().map(|(i, b)| (*b, i as u32)).collect();
    let mut out = Vec::new();
    for (r, tb) in bytes.iter().enumerate() {
        if tb.len() < 2 {
            continue;
        }
        // Byte-pair encoding of the token's bytes using only merges of lower rank.
        let mut parts: Vec<&[u8]> = (0..tb.len()).map(|i| &tb[i..i + 1]).collect();
        loop {
            let mut best: Option<(u32, usize)> = None;
            for i in 0..parts.len() - 1 {
                let joined = &tb[offset(&parts, tb, i)..offset(&parts, tb, i) + parts[i].len() + parts[i + 1].len()];
                if let Some(&k) = rank.get(joined) {
                    if (k as usize) < r && best.is_none_or(|(bk, _)| k < bk) {
                        best = Some((k, i));
                    }
                }
            }
            let Some((_, i)) = best else { break };
            let start = offset(&parts, tb, i);
            parts[i] = &tb[start..start + parts[i].len() + parts[i + 1].len()];
            parts.remove(i + 1);
        }
        anyhow::ensure!(parts.len() == 2, "r50k_base token {r} does not split into one merge ({} parts)", parts.len());
        out.push((rank[parts[0]], rank[parts[1]]));
    }
    Ok(out)
}

/// Byte offset of parts[i] within `whole` (parts are consecutive slices of it).
fn offset(parts: &[&[u8]], whole: &[u8], i: usize) -> usize {
    parts[i].as_ptr() as usize - whole.as_ptr() as usize
}

fn replace(from: &str, to: &str) -> Value {
    json!({"type": "Replace", "pattern": {"String": from}, "content": to})
}

/// Non-ASCII characters whose `\uXXXX` escapes tokenizer.json spells out: Latin-1, Latin
/// Extended-A/B, general punctuation (dashes, curly quotes, ellipsis) and currency signs, which
/// covers most English and Western European text. Other characters are not escaped there.
pub const ESCAPED_RANGES: [(u32, u32); 3] = [(0x80, 0x24f), (0x2000, 0x206f), (0x20a0, 0x20cf)];

/// JSON string escaping as literal (raw, escaped) pairs, backslash first: the ASCII escapes, then
/// the characters of [`ESCAPED_RANGES`].
fn escapes() -> Vec<(String, String)> {
    let mut v = vec![("\\".to_string(), "\\\\".to_string()), ("\"".into(), "\\\"".into())];
    for b in (0u8..0x20).chain([0x7f]) {
        let esc = match b {
            b'\n' => "\\n".to_string(),
            b'\r' => "\\r".to_string(),
            b'\t' => "\\t".to_string(),
            0x08 => "\\b".to_string(),
            0x0c => "\\f".to_string(),
            _ => format!("\\u{b:04x}"),
        };
        v.push(((b as char).to_string(), esc));
    }
    for (lo, hi) in ESCAPED_RANGES {
        v.extend((lo..=hi).filter_map(char::from_u32).map(|c| (c.to_string(), format!("\\u{:04x}", c as u32))));
    }
    v
}

/// The `tokenizer.json` of the GPT-2 tokenizer in text format `fmt`.
pub fn tokenizer_json(fmt: TextFormat) -> Result<Value> {
    let tok = Tokenizer::gpt2(fmt)?;
    let b2c = byte_to_char();
    let piece =
        |id: u32| -> String { tok.token_bytes(id).unwrap_or_default().iter().map(|&b| b2c[b as usize]).collect() };
    let mut vocab = Map::new();
    for id in 0..BOS_ID {
        vocab.insert(piece(id), json!(id));
    }
    vocab.insert(EOT.into(), json!(BOS_ID));
    let merges: Vec<Value> =
        merges(&tok)?.into_iter().map(|(a, b)| Value::String(format!("{} {}", piece(a), piece(b)))).collect();
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    let (normalizer, decoder) = match fmt {
        TextFormat::Plain => (Value::Null, byte_level.clone()),
        TextFormat::JsonEscaped => {
            let esc = escapes();
            let norm: Vec<Value> = esc.iter().map(|(raw, e)| replace(raw, e)).collect();
            // Undo the escapes after byte decoding; an escaped backslash is parked on a private-use
            // character first so that `\\n` becomes `\n` (two characters), not a newline.
            const PARK: &str = "\u{E000}";
            let mut dec = vec![byte_level.clone(), replace("\\\\", PARK), replace("\\/", "/")];
            dec.extend(esc.iter().skip(1).map(|(raw, e)| replace(e, raw)));
            dec.push(replace(PARK, "\\"));
            (json!({"type": "Sequence", "normalizers": norm}), json!({"type": "Sequence", "decoders": dec}))
        }
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{"id": BOS_ID, "content": EOT, "single_word": false, "lstrip": false, "rstrip": false,
                          "normalized": false, "special": true}],
        "normalizer": normalizer,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": decoder,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merges},
    }))
}

/// `tokenizer_config.json` for a model with context `max_len`.
pub fn tokenizer_config(fmt: TextFormat, max_len: Option<usize>) -> Value {
    json!({
        // The generic class keeps tokenizer.json's own normalizer and decoder (GPT2TokenizerFast
        // rebuilds the plain GPT-2 pipeline in transformers 5 and would drop the escaping).
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOT,
        "eos_token": EOT,
        "unk_token": EOT,
        "add_bos_token": false,
        "add_prefix_space": false,
        "clean_up_tokenization_spaces": false,
        "model_max_length": max_len.unwrap_or(1 << 30),
        "foxlm_text_format": fmt.as_str(),
    })
}

/// Writes tokenizer.json and tokenizer_config.json into a model folder whose vocabulary is GPT-2's;
/// returns false (writing nothing) for other vocabularies.
pub fn write_tokenizer_files(dir: &Path, cfg: &Config, fmt: Option<TextFormat>) -> Result<bool> {
    if cfg.vocab_size != GPT2_VOCAB {
        return Ok(false);
    }
    let fmt = text_format_for(cfg, fmt);
    // Built once per process and format: every checkpoint of a run writes the same file.
    static PLAIN: OnceLock<String> = OnceLock::new();
    static ESCAPED: OnceLock<String> = OnceLock::new();
    let cell = match fmt {
        TextFormat::Plain => &PLAIN,
        TextFormat::JsonEscaped => &ESCAPED,
    };
    let tj = match cell.get() {
        Some(s) => s,
        None => {
            let s = serde_json::to_string(&tokenizer_json(fmt)?)?;
            cell.get_or_init(|| s)
        }
    };
    let tc = serde_json::to_string_pretty(&tokenizer_config(fmt, cfg.train_context()))?;
    for (name, text) in [(TOKENIZER_FILE, tj.as_str()), (TOKENIZER_CONFIG_FILE, tc.as_str())] {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(true)
}
