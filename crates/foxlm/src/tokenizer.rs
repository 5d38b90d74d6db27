//! GPT-2 byte-level BPE tokenizer (tiktoken's `r50k_base`, vocabulary 50257), fully offline.
//!
//! Two text formats are supported:
//!
//! * [`TextFormat::Plain`]: ordinary GPT-2 BPE of the text.
//! * [`TextFormat::JsonEscaped`]: the text is first replaced by its JSON string escaping without
//!   the surrounding quotes (exactly Python's `json.dumps(s)[1:-1]`, `ensure_ascii=True`), then
//!   BPE-encoded. The released FoX checkpoints were trained on text in this form. Decoding
//!   reverses the escaping, leniently: malformed escapes produced by a model are kept literally.
//!
//! `<|endoftext|>` (id 50256) serves as both BOS and EOS. Ordinary text is always encoded with
//! special tokens *not* interpreted, so a literal `<|endoftext|>` in user text is plain text.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use anyhow::{anyhow, Context};
use tiktoken_rs::CoreBPE;

/// The config.json key in which a model may record its text format ("plain" / "json-escaped").
pub const TEXT_FORMAT_KEY: &str = "foxlm_text_format";

/// The text format to use for a model: the one asked for, else the one its config.json records,
/// else json-escaped (the released FoX checkpoints' format).
pub fn text_format_for(cfg: &crate::config::Config, asked: Option<TextFormat>) -> TextFormat {
    if let Some(f) = asked {
        return f;
    }
    cfg.extra
        .get(TEXT_FORMAT_KEY)
        .and_then(|v| v.as_str())
        .and_then(|s| s.parse().ok())
        .unwrap_or(TextFormat::JsonEscaped)
}

/// The id of `<|endoftext|>`, used as beginning-of-sequence.
pub const BOS_ID: u32 = 50256;
/// The id of `<|endoftext|>`, used as end-of-sequence.
pub const EOS_ID: u32 = 50256;
/// Size of the GPT-2 vocabulary (50256 byte-level BPE tokens plus `<|endoftext|>`).
pub const GPT2_VOCAB: usize = 50257;

/// How text is turned into the string that is BPE-encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TextFormat {
    /// JSON string escaping (without quotes, `ensure_ascii=True`) before BPE.
    JsonEscaped,
    /// Plain GPT-2 BPE.
    Plain,
}

impl TextFormat {
    /// The kebab-case name, as accepted by [`FromStr`] and used by serde.
    pub fn as_str(self) -> &'static str {
        match self {
            TextFormat::JsonEscaped => "json-escaped",
            TextFormat::Plain => "plain",
        }
    }
}

impl fmt::Display for TextFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TextFormat {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Self> {
        match s {
            "json-escaped" => Ok(TextFormat::JsonEscaped),
            "plain" => Ok(TextFormat::Plain),
            other => Err(anyhow!("unknown text format {other:?}; valid values are \"json-escaped\" and \"plain\"")),
        }
    }
}

/// The shared, immutable part of the tokenizer: the BPE encoder and a flat decode table.
struct Gpt2Bpe {
    bpe: CoreBPE,
    /// Concatenated bytes of tokens `0..BOS_ID`.
    bytes: Vec<u8>,
    /// `offsets[id]..offsets[id + 1]` is the byte range of token `id` in `bytes`.
    offsets: Vec<u32>,
}

impl Gpt2Bpe {
    fn build() -> anyhow::Result<Self> {
        let bpe = tiktoken_rs::r50k_base().context("building the r50k_base (GPT-2) BPE")?;
        let n = BOS_ID as usize;
        // `_decode_native_and_split` panics on an unknown id; r50k_base's ranks are exactly
        // 0..50256, but guard against a changed vocabulary instead of aborting.
        let tokens = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            bpe._decode_native_and_split((0..BOS_ID).collect()).collect::<Vec<Vec<u8>>>()
        }))
        .map_err(|_| anyhow!("r50k_base does not define every token id below {BOS_ID}"))?;
        anyhow::ensure!(tokens.len() == n, "r50k_base decode table has {} entries", tokens.len());
        let mut bytes = Vec::with_capacity(tokens.iter().map(Vec::len).sum());
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0u32);
        for t in &tokens {
            bytes.extend_from_slice(t);
            offsets.push(bytes.len() as u32);
        }
        Ok(Gpt2Bpe { bpe, bytes, offsets })
    }

    /// Bytes of a non-special token id, `None` for BOS/EOS and ids outside the vocabulary.
    #[inline]
    fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        if i + 1 < self.offsets.len() {
            Some(&self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize])
        } else {
            None
        }
    }

    /// Appends the bytes of `id` to `out`: nothing for BOS/EOS, U+FFFD for an unknown id.
    #[inline]
    fn push_bytes(&self, id: u32, out: &mut Vec<u8>) {
        if id == BOS_ID || id == EOS_ID {
            return;
        }
        match self.token_bytes(id) {
            Some(b) => out.extend_from_slice(b),
            None => out.extend_from_slice("\u{FFFD}".as_bytes()),
        }
    }
}

static GPT2: OnceLock<Arc<Gpt2Bpe>> = OnceLock::new();

fn shared_gpt2() -> anyhow::Result<Arc<Gpt2Bpe>> {
    if let Some(b) = GPT2.get() {
        return Ok(b.clone());
    }
    let built = Arc::new(Gpt2Bpe::build()?);
    // Another thread may have won the race; either value is identical.
    let _ = GPT2.set(built);
    Ok(GPT2.get().expect("set above").clone())
}

/// GPT-2 BPE tokenizer. Cheap to clone (the BPE tables are shared), `Send + Sync`.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Gpt2Bpe>,
    format: TextFormat,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer").field("vocab", &GPT2_VOCAB).field("format", &self.format).finish()
    }
}

impl Tokenizer {
    /// The GPT-2 (r50k_base) tokenizer with the given text format. The BPE tables are built once
    /// per process and shared by every tokenizer.
    pub fn gpt2(format: TextFormat) -> anyhow::Result<Self> {
        Ok(Tokenizer { inner: shared_gpt2()?, format })
    }

    pub fn format(&self) -> TextFormat {
        self.format
    }

    /// BPE ids of `text` (escaped first in JsonEscaped mode), with BOS prepended when add_bos.
    pub fn encode(&self, text: &str, add_bos: bool) -> Vec<u32> {
        let ids = match self.format {
            TextFormat::Plain => self.inner.bpe.encode_ordinary(text),
            TextFormat::JsonEscaped => self.inner.bpe.encode_ordinary(&json_escape(text)),
        };
        if add_bos {
            let mut out = Vec::with_capacity(ids.len() + 1);
            out.push(BOS_ID);
            out.extend_from_slice(&ids);
            out
        } else {
            ids
        }
    }

    /// Text of `ids` (BOS/EOS tokens are skipped), escaping reversed in JsonEscaped mode.
    /// Never panics: invalid UTF-8 becomes U+FFFD, ids outside the vocabulary become U+FFFD,
    /// malformed escapes are kept literally.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            self.inner.push_bytes(id, &mut bytes);
        }
        let text = String::from_utf8_lossy(&bytes);
        match self.format {
            TextFormat::Plain => text.into_owned(),
            TextFormat::JsonEscaped => json_unescape(&text),
        }
    }

    /// The raw bytes of token `id` (in the escaped form for JsonEscaped text), `None` for
    /// `<|endoftext|>` and ids outside the vocabulary. For exporting the vocabulary and for
    /// reporting tokens one by one (a token may hold part of a UTF-8 character).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.inner.token_bytes(id)
    }

    /// A streaming decoder for generation: feed ids one at a time, get back the text that is now final.
    pub fn stream(&self) -> StreamDecoder<'_> {
        StreamDecoder { tok: self, bytes: Vec::new(), escaped: String::new() }
    }
}

/// Incremental decoder. The concatenation of everything returned by [`push`](Self::push) and
/// [`finish`](Self::finish) equals [`Tokenizer::decode`] of all pushed ids.
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    /// Bytes of an incomplete UTF-8 sequence at the end of the output so far.
    bytes: Vec<u8>,
    /// JsonEscaped mode: escaped text whose unescaping is not decided yet (a pending escape).
    escaped: String,
}

impl StreamDecoder<'_> {
    /// Newly completed text (may be empty while a UTF-8 char or an escape like `\u00` is incomplete).
    pub fn push(&mut self, id: u32) -> String {
        self.tok.inner.push_bytes(id, &mut self.bytes);
        let text = take_complete_utf8(&mut self.bytes);
        match self.tok.format {
            TextFormat::Plain => text,
            TextFormat::JsonEscaped => {
                self.escaped.push_str(&text);
                let (out, consumed) = unescape_prefix(&self.escaped, false);
                self.escaped.drain(..consumed);
                out
            }
        }
    }

    /// Whatever is still pending, decoded leniently. The decoder is empty afterwards.
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.bytes).into_owned();
        self.bytes.clear();
        match self.tok.format {
            TextFormat::Plain => text,
            TextFormat::JsonEscaped => {
                self.escaped.push_str(&text);
                let (out, _) = unescape_prefix(&self.escaped, true);
                self.escaped.clear();
                out
            }
        }
    }
}

/// Removes and returns the longest prefix of `buf` that is final as text: valid UTF-8 plus
/// invalid sequences (rendered as U+FFFD, exactly as `String::from_utf8_lossy` does). An
/// incomplete multi-byte sequence at the very end stays in `buf`.
fn take_complete_utf8(buf: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut pos = 0;
    loop {
        match std::str::from_utf8(&buf[pos..]) {
            Ok(s) => {
                out.push_str(s);
                pos = buf.len();
                break;
            }
            Err(e) => {
                let valid = e.valid_up_to();
                // `valid` bytes from `pos` were just validated by `from_utf8`.
                out.push_str(std::str::from_utf8(&buf[pos..pos + valid]).expect("validated"));
                pos += valid;
                match e.error_len() {
                    Some(n) => {
                        out.push('\u{FFFD}');
                        pos += n;
                    }
                    None => break, // incomplete sequence at the end: wait for more bytes
                }
            }
        }
    }
    buf.drain(..pos);
    out
}

/// JSON string escaping without the surrounding quotes, exactly as Python's
/// `json.dumps(s)[1:-1]` (`ensure_ascii=True`): `"` `\` and control characters are escaped
/// (`\n \r \t \b \f`, others as `\u00xx`), every non-ASCII char becomes `\uxxxx` (lowercase
/// hex; a UTF-16 surrogate pair above U+FFFF). DEL (0x7f) is escaped as `\u007f`, as Python does
/// (its ASCII encoder keeps only `' '..='~'` literal); `/` stays literal.
pub fn json_escape(s: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    fn push_u(out: &mut String, u: u16) {
        out.push_str("\\u");
        for shift in [12, 8, 4, 0] {
            out.push(HEX[((u >> shift) & 0xf) as usize] as char);
        }
    }
    let bytes = s.as_bytes();
    let mut out = String::with_capacity(s.len() + s.len() / 8 + 16);
    let mut run_start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' {
            i += 1;
            continue;
        }
        out.push_str(&s[run_start..i]);
        if b < 0x80 {
            match b {
                b'"' => out.push_str("\\\""),
                b'\\' => out.push_str("\\\\"),
                b'\n' => out.push_str("\\n"),
                b'\r' => out.push_str("\\r"),
                b'\t' => out.push_str("\\t"),
                0x08 => out.push_str("\\b"),
                0x0c => out.push_str("\\f"),
                _ => push_u(&mut out, b as u16),
            }
            i += 1;
        } else {
            let c = s[i..].chars().next().expect("char boundary");
            let mut units = [0u16; 2];
            for &u in c.encode_utf16(&mut units).iter() {
                push_u(&mut out, u);
            }
            i += c.len_utf8();
        }
        run_start = i;
    }
    out.push_str(&s[run_start..]);
    out
}

/// Reverses [`json_escape`], leniently (it never fails or panics). Malformed pieces are kept
/// literally: a trailing lone backslash, an unknown escape such as `\q`, a `\u` not followed by
/// four hex digits (`\u12` stays `\u12`). A lone UTF-16 surrogate (`\ud83d` not followed by a
/// low surrogate escape, or a lone low surrogate) becomes U+FFFD. Raw characters that JSON would
/// have escaped (e.g. a real newline) are kept as they are. `\/` unescapes to `/`.
pub fn json_unescape(s: &str) -> String {
    unescape_prefix(s, true).0
}

/// Reads exactly four hex digits at the start of `b`.
#[inline]
fn hex4(b: &[u8]) -> Option<u16> {
    if b.len() < 4 {
        return None;
    }
    let mut v = 0u16;
    for &c in &b[..4] {
        let d = (c as char).to_digit(16)?;
        v = (v << 4) | d as u16;
    }
    Some(v)
}

/// Whether `b` (shorter than 4 bytes) could still grow into four hex digits.
#[inline]
fn hex_prefix(b: &[u8]) -> bool {
    b.len() < 4 && b.iter().all(u8::is_ascii_hexdigit)
}

/// Whether `b` could still grow into `\uXXXX` (it is a proper prefix of such an escape).
#[inline]
fn u_escape_prefix(b: &[u8]) -> bool {
    match b {
        [] | [b'\\'] => true,
        [b'\\', b'u', rest @ ..] => hex_prefix(rest),
        _ => false,
    }
}

/// Unescapes the longest decidable prefix of `s`. Returns the text and how many bytes of `s`
/// were consumed. With `is_final`, everything is consumed (incomplete escapes are malformed and
/// kept literally); otherwise it stops at the first escape whose meaning depends on text not yet
/// seen, so that unescaping in pieces gives exactly the same result as unescaping all at once.
fn unescape_prefix(s: &str, is_final: bool) -> (String, usize) {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut run_start = 0;
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            i += 1;
            continue;
        }
        out.push_str(&s[run_start..i]);
        // b[i] is a backslash; every branch sets `i` to the next unparsed byte.
        let Some(&e) = b.get(i + 1) else {
            if !is_final {
                return (out, i);
            }
            out.push('\\');
            i += 1;
            run_start = i;
            break;
        };
        let simple = match e {
            b'"' => Some('"'),
            b'\\' => Some('\\'),
            b'/' => Some('/'),
            b'n' => Some('\n'),
            b'r' => Some('\r'),
            b't' => Some('\t'),
            b'b' => Some('\u{8}'),
            b'f' => Some('\u{c}'),
            _ => None,
        };
        if let Some(c) = simple {
            out.push(c);
            i += 2;
        } else if e == b'u' {
            let rest = &b[i + 2..];
            match hex4(rest) {
                Some(u) if (0xd800..0xdc00).contains(&u) => {
                    // High surrogate: needs a following `\uDC00`..`\uDFFF`.
                    let after = &b[i + 6..];
                    if !is_final && u_escape_prefix(after) {
                        return (out, i);
                    }
                    let low = match after {
                        [b'\\', b'u', tail @ ..] => hex4(tail).filter(|l| (0xdc00..0xe000).contains(l)),
                        _ => None,
                    };
                    match low {
                        Some(l) => {
                            let cp = 0x10000 + (((u as u32) - 0xd800) << 10) + ((l as u32) - 0xdc00);
                            out.push(char::from_u32(cp).unwrap_or('\u{FFFD}'));
                            i += 12;
                        }
                        None => {
                            out.push('\u{FFFD}');
                            i += 6;
                        }
                    }
                }
                Some(u) => {
                    // Lone low surrogates map to U+FFFD.
                    out.push(char::from_u32(u as u32).unwrap_or('\u{FFFD}'));
                    i += 6;
                }
                None => {
                    if !is_final && hex_prefix(rest) {
                        return (out, i);
                    }
                    // Malformed `\u`: keep `\u` literally, the following chars are ordinary.
                    out.push_str("\\u");
                    i += 2;
                }
            }
        } else {
            // Unknown escape: keep the backslash; the next char is parsed as ordinary text.
            out.push('\\');
            i += 1;
        }
        run_start = i;
    }
    out.push_str(&s[run_start..]);
    (out, b.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain() -> Tokenizer {
        Tokenizer::gpt2(TextFormat::Plain).unwrap()
    }

    fn escaped() -> Tokenizer {
        Tokenizer::gpt2(TextFormat::JsonEscaped).unwrap()
    }

    const ROUND_TRIP: &[&str] = &[
        "",
        "Hello world",
        "Hello, world! The quick brown fox jumps over the lazy dog.",
        "中文字符测试，你好世界。",
        "Café crème brûlée, naïve façade, Ångström, Straße",
        "She said \"hi\" and left.",
        "C:\\path\\to\\file and a trailing backslash \\",
        "line1\nline2\r\nline3\ttab\u{8}bs\u{c}ff\u{1}\u{1f}\u{0}\u{7f}",
        "emoji 😀🎉 and 👩‍👩‍👧 family, math 𝔸",
        "a <|endoftext|> b",
        "<|endoftext|>",
        "slash / and json-like \\u0041 \\n literal",
        "  leading and trailing spaces   \n\n\n",
        "mixed: €100, ¥200, “quotes” — dash… ok",
    ];

    #[test]
    fn json_escape_matches_python() {
        assert_eq!(json_escape(""), "");
        assert_eq!(json_escape("plain text"), "plain text");
        assert_eq!(json_escape("say \"hi\""), "say \\\"hi\\\"");
        assert_eq!(json_escape("a\\b"), "a\\\\b");
        assert_eq!(json_escape("a\nb\rc\td"), "a\\nb\\rc\\td");
        assert_eq!(json_escape("\u{8}\u{c}"), "\\b\\f");
        assert_eq!(json_escape("\u{1}"), "\\u0001");
        assert_eq!(json_escape("\u{1f}"), "\\u001f");
        assert_eq!(json_escape("\u{0}"), "\\u0000");
        assert_eq!(json_escape("\u{7f}"), "\\u007f"); // Python: json.dumps("\x7f") == "\"\\u007f\""
        assert_eq!(json_escape("é"), "\\u00e9");
        assert_eq!(json_escape("€"), "\\u20ac");
        assert_eq!(json_escape("😀"), "\\ud83d\\ude00");
        assert_eq!(json_escape("/"), "/");
        assert_eq!(json_escape("a/b"), "a/b");
        assert_eq!(json_escape("中文"), "\\u4e2d\\u6587");
        assert_eq!(json_escape("x\u{ffff}y"), "x\\uffffy");
        assert_eq!(json_escape("Café \"é\"\n"), "Caf\\u00e9 \\\"\\u00e9\\\"\\n");
    }

    #[test]
    fn json_unescape_inverts_escape() {
        for s in ROUND_TRIP {
            assert_eq!(json_unescape(&json_escape(s)), *s, "{s:?}");
        }
        assert_eq!(json_unescape("\\/"), "/");
        assert_eq!(json_unescape("\\u00E9\\u20AC"), "é€");
        assert_eq!(json_unescape("\\uD83D\\uDE00"), "😀");
    }

    #[test]
    fn json_unescape_is_lenient() {
        assert_eq!(json_unescape("abc\\"), "abc\\");
        assert_eq!(json_unescape("\\"), "\\");
        assert_eq!(json_unescape("\\u12"), "\\u12");
        assert_eq!(json_unescape("\\u"), "\\u");
        assert_eq!(json_unescape("\\u12xy\\n"), "\\u12xy\n");
        assert_eq!(json_unescape("\\uzzzz"), "\\uzzzz");
        assert_eq!(json_unescape("\\ud83d"), "\u{FFFD}");
        assert_eq!(json_unescape("\\ud83dx"), "\u{FFFD}x");
        assert_eq!(json_unescape("\\ud83d\\u0041"), "\u{FFFD}A");
        assert_eq!(json_unescape("\\ud83d\\ud83d\\ude00"), "\u{FFFD}😀");
        assert_eq!(json_unescape("\\ud83d\\u12"), "\u{FFFD}\\u12");
        assert_eq!(json_unescape("\\ude00"), "\u{FFFD}");
        assert_eq!(json_unescape("\\q"), "\\q");
        assert_eq!(json_unescape("\\qa\\\\"), "\\qa\\");
        assert_eq!(json_unescape("\\é"), "\\é");
        assert_eq!(json_unescape("raw\nnewline"), "raw\nnewline");
    }

    #[test]
    fn unescape_in_pieces_equals_unescape_at_once() {
        let cases = [
            "abc\\",
            "\\u12",
            "\\ud83d",
            "\\q",
            "x\\ud83d\\ude00y",
            "\\ud83d\\u004",
            "\\ud83d\\",
            "\\\\\\n\\u00e9\\u20ACz",
            "\\ude00\\ud83d\\ud83d\\ude00",
            "\\u12\\u1234\\",
            "é\\é\\ué",
        ];
        for s in cases {
            let whole = json_unescape(s);
            // Split at every pair of char boundaries, feeding three pieces.
            let cuts: Vec<usize> = s.char_indices().map(|(i, _)| i).chain([s.len()]).collect();
            for &a in &cuts {
                for &b in cuts.iter().filter(|&&b| b >= a) {
                    let mut pending = String::new();
                    let mut out = String::new();
                    for piece in [&s[..a], &s[a..b], &s[b..]] {
                        pending.push_str(piece);
                        let (o, n) = unescape_prefix(&pending, false);
                        out.push_str(&o);
                        pending.drain(..n);
                    }
                    out.push_str(&unescape_prefix(&pending, true).0);
                    assert_eq!(out, whole, "{s:?} cut at {a},{b}");
                }
            }
        }
    }

    #[test]
    fn text_format_parse_display_serde() {
        assert_eq!("json-escaped".parse::<TextFormat>().unwrap(), TextFormat::JsonEscaped);
        assert_eq!("plain".parse::<TextFormat>().unwrap(), TextFormat::Plain);
        let err = "json".parse::<TextFormat>().unwrap_err().to_string();
        assert!(err.contains("json-escaped") && err.contains("plain"), "{err}");
        assert_eq!(TextFormat::JsonEscaped.to_string(), "json-escaped");
        assert_eq!(TextFormat::Plain.to_string(), "plain");
        assert_eq!(serde_json::to_string(&TextFormat::JsonEscaped).unwrap(), "\"json-escaped\"");
        assert_eq!(serde_json::from_str::<TextFormat>("\"plain\"").unwrap(), TextFormat::Plain);
    }

    #[test]
    fn known_gpt2_ids() {
        let t = plain();
        assert_eq!(t.format(), TextFormat::Plain);
        assert_eq!(t.encode("Hello world", false), vec![15496, 995]);
        assert_eq!(t.encode("Hello world", true), vec![50256, 15496, 995]);
        assert_eq!(t.encode(" the\n", false), vec![262, 198]);
        // The special token's text, encoded as ordinary text: `<`, `|`, `end`, `of`, `text`, `|`, `>`.
        assert_eq!(t.encode("<|endoftext|>", false), vec![27, 91, 437, 1659, 5239, 91, 29]);
        assert_eq!(t.encode("", true), vec![BOS_ID]);
        assert!(t.encode("", false).is_empty());
        assert_eq!(t.decode(&[15496, 995]), "Hello world");
        assert_eq!(t.decode(&[BOS_ID, 15496, EOS_ID, 995, EOS_ID]), "Hello world");
        let e = escaped();
        assert_eq!(e.encode("Hello world", true)[0], 50256);
        assert_eq!(e.encode("Hello world", false), vec![15496, 995]);
    }

    #[test]
    fn special_token_text_is_ordinary() {
        for t in [plain(), escaped()] {
            let ids = t.encode("<|endoftext|>", false);
            assert!(!ids.contains(&50256), "{ids:?}");
            assert!(ids.len() > 1);
            assert_eq!(t.decode(&ids), "<|endoftext|>");
        }
    }

    #[test]
    fn json_escaped_encoding_is_plain_encoding_of_escaped_text() {
        assert_eq!(escaped().encode("a\nb", false), plain().encode("a\\nb", false));
        assert_eq!(escaped().encode("é\"", true), plain().encode("\\u00e9\\\"", true));
        assert_ne!(escaped().encode("a\nb", false), plain().encode("a\nb", false));
    }

    #[test]
    fn round_trips_both_modes() {
        for t in [plain(), escaped()] {
            for s in ROUND_TRIP {
                for bos in [false, true] {
                    let ids = t.encode(s, bos);
                    assert!(ids.iter().all(|&id| (id as usize) < GPT2_VOCAB));
                    assert_eq!(t.decode(&ids), *s, "{:?} {s:?}", t.format());
                }
            }
        }
    }

    fn stream_all(t: &Tokenizer, ids: &[u32]) -> String {
        let mut d = t.stream();
        let mut out = String::new();
        for &id in ids {
            out.push_str(&d.push(id));
        }
        out.push_str(&d.finish());
        out
    }

    #[test]
    fn stream_matches_decode() {
        for t in [plain(), escaped()] {
            for s in ROUND_TRIP {
                let ids = t.encode(s, true);
                assert_eq!(stream_all(&t, &ids), t.decode(&ids), "{:?} {s:?}", t.format());
                assert_eq!(stream_all(&t, &ids), *s);
            }
        }
    }

    #[test]
    fn stream_holds_back_incomplete_pieces() {
        // Plain: "😀" is split into byte tokens; nothing is emitted until the char is complete.
        let t = plain();
        let ids = t.encode("😀", false);
        assert!(ids.len() > 1, "{ids:?}");
        let mut d = t.stream();
        let pieces: Vec<String> = ids.iter().map(|&id| d.push(id)).collect();
        assert!(pieces[..pieces.len() - 1].iter().all(String::is_empty), "{pieces:?}");
        assert_eq!(pieces.last().unwrap(), "😀");
        assert_eq!(d.finish(), "");

        // JsonEscaped: feed the escaped text one byte-token at a time.
        let e = escaped();
        let esc = "ok \\ud83d\\ude00 \\u00e9\\";
        let ids: Vec<u32> = esc.bytes().map(|b| plain().encode(&(b as char).to_string(), false)[0]).collect();
        let mut d = e.stream();
        let mut out = String::new();
        for (k, &id) in ids.iter().enumerate() {
            let piece = d.push(id);
            if (3..=8).contains(&k) {
                // `\ud83d` is pending until we know whether a low surrogate follows
                assert_eq!(piece, "", "{k}");
            }
            out.push_str(&piece);
        }
        assert_eq!(out, "ok 😀 é");
        assert_eq!(d.finish(), "\\");
    }

    #[test]
    fn decode_never_panics_on_garbage() {
        // All byte tokens (ids 0..256 are the single bytes in GPT-2's byte order), bad ids, and
        // many malformed-escape fragments in every combination of pairs.
        let p = plain();
        let frags = ["\\", "u", "d83d", "\\u", "de00", "12", "q", "\\ud83d", "\\ude00", "zz", "é", "\"", "n"];
        let mut frag_ids: Vec<Vec<u32>> = frags.iter().map(|f| p.encode(f, false)).collect();
        let lead = (0..256u32).find(|&id| p.inner.token_bytes(id) == Some(&[0xE2u8][..])).unwrap();
        frag_ids.push(vec![lead]); // a lone UTF-8 lead byte
        frag_ids.push(vec![u32::MAX]);
        frag_ids.push(vec![GPT2_VOCAB as u32]);
        frag_ids.push(vec![BOS_ID]);
        for t in [plain(), escaped()] {
            let all: Vec<u32> = (0..GPT2_VOCAB as u32 + 5).collect();
            let _ = t.decode(&all);
            assert_eq!(stream_all(&t, &all), t.decode(&all));
            for a in &frag_ids {
                for b in &frag_ids {
                    for c in &frag_ids {
                        let ids: Vec<u32> = a.iter().chain(b).chain(c).copied().collect();
                        assert_eq!(stream_all(&t, &ids), t.decode(&ids), "{ids:?}");
                    }
                }
            }
            assert_eq!(t.decode(&[u32::MAX]), "\u{FFFD}");
        }
    }

    #[test]
    fn split_utf8_is_replaced_only_at_the_end() {
        let t = plain();
        let ids = t.encode("€", false); // 3 bytes, possibly several tokens
        let full = t.decode(&ids);
        assert_eq!(full, "€");
        if ids.len() > 1 {
            let cut = t.decode(&ids[..ids.len() - 1]);
            assert_eq!(cut, "\u{FFFD}");
        }
        let ids = t.encode("中文", false);
        assert_eq!(t.decode(&ids), "中文");
    }

    #[test]
    fn decode_table_is_complete() {
        let t = plain();
        assert_eq!(t.inner.offsets.len(), BOS_ID as usize + 1);
        for id in 0..BOS_ID {
            assert!(!t.inner.token_bytes(id).unwrap().is_empty());
        }
        assert!(t.inner.token_bytes(BOS_ID).is_none());
    }

    #[test]
    fn tokenizer_is_send_sync_and_parallel_safe() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
        let t = escaped();
        let texts: Vec<String> = (0..64).map(|i| format!("doc {i}: Ünïcödé \"q\" 😀\n")).collect();
        let serial: Vec<Vec<u32>> = texts.iter().map(|s| t.encode(s, true)).collect();
        let parallel: Vec<Vec<u32>> = std::thread::scope(|sc| {
            let hs: Vec<_> = texts.iter().map(|s| sc.spawn(|| t.encode(s, true))).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(serial, parallel);
    }
}
