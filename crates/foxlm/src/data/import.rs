//! `foxlm data import`: token arrays that others ship, turned into a foxlm dataset (manifest and
//! shards, as `data prepare` writes) without re-tokenizing.
//!
//! Formats:
//! - `bin16` / `bin32`: flat little-endian uint16 / uint32 tokens (nanoGPT's train.bin and
//!   val.bin are bin16), documents separated by a token (EOT 50256 by default, which nanoGPT
//!   appends to every document) that is dropped: foxlm's loader puts an EOS (the same id) back
//!   after every document, so the training stream is the file's stream.
//! - `npy`: a NumPy array, version 1, 2 or 3, C order, of little-endian integers (u1, u2, u4, u8,
//!   i2, i4, i8). One dimension: as bin16 (documents split at the separator); two: every row is
//!   a document.
//! - `longcrawl64`: rows of 65,536 GPT-2 tokens, as a `[rows, 65536]` .npy or a flat uint16 file
//!   of whole rows (the zarr arrays of the release, exported). Every row is a document and the
//!   manifest says so (each split's `row_tokens`): windows are cut inside rows at multiples of
//!   the window length, never across rows, and start with BOS, as the authors' loader cuts them.
//!   `--row-tokens N` keeps the first N tokens of each training row (validation rows stay whole,
//!   as the authors evaluate them).
//!
//! Inputs are memory-mapped and read once, in order; tokens are checked (negative ids, ids at or
//! past the GPT-2 vocabulary: errors naming the file and the token's index) and streamed into
//! the shards. Reading stops once the `--train-tokens` / `--val-tokens` subsets are complete, so
//! importing 45 GiT of LongCrawl64's 435 reads only those.

use super::dataset::map_file;
use super::format::{Manifest, Split, SplitInfo, TokenDtype, FORMAT_NAME, FORMAT_VERSION, MANIFEST_FILE};
use super::npy;
use super::prepare::{create_output, is_val_document, progress_bar, ShardWriter};
use crate::tokenizer::{TextFormat, EOS_ID, GPT2_VOCAB};
use anyhow::{bail, Context, Result};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// LongCrawl64's row length.
pub const LONGCRAWL64_ROW: usize = 65536;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ImportFormat {
    /// Flat little-endian uint16 (nanoGPT's .bin).
    Bin16,
    /// Flat little-endian uint32.
    Bin32,
    /// NumPy .npy: 1-D like bin16, 2-D one document per row.
    Npy,
    /// Rows of 65,536 tokens: a [rows, 65536] .npy, or flat uint16 of whole rows.
    Longcrawl64,
}

impl ImportFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            ImportFormat::Bin16 => "bin16",
            ImportFormat::Bin32 => "bin32",
            ImportFormat::Npy => "npy",
            ImportFormat::Longcrawl64 => "longcrawl64",
        }
    }
}

/// Options of `data import`.
#[derive(Clone, Debug)]
pub struct ImportOptions {
    pub format: ImportFormat,
    /// Validation files; none: documents of the inputs held out by `val_fraction`.
    pub val: Vec<PathBuf>,
    pub val_fraction: f64,
    /// Keep only the first this many tokens of each split (whole rows for row formats).
    pub train_tokens: Option<u64>,
    pub val_tokens: Option<u64>,
    /// Flat formats: the token that ends a document (dropped); None: every file is one document.
    pub separator: Option<u32>,
    /// Row formats: keep the first this many tokens of each training row.
    pub row_tokens: Option<usize>,
    /// Row formats: rotate each row by a seeded random amount before taking it.
    pub roll_seed: Option<u64>,
    pub text_format: TextFormat,
    pub shard_tokens: usize,
    pub overwrite: bool,
    pub progress: bool,
}

impl ImportOptions {
    pub fn new(format: ImportFormat) -> Self {
        Self {
            format,
            val: vec![],
            val_fraction: 0.0,
            train_tokens: None,
            val_tokens: None,
            separator: Some(EOS_ID),
            row_tokens: None,
            roll_seed: None,
            text_format: match format {
                // LongCrawl64 was tokenized JSON-escaped (the released models' format).
                ImportFormat::Longcrawl64 => TextFormat::JsonEscaped,
                _ => TextFormat::Plain,
            },
            shard_tokens: 1 << 28,
            overwrite: false,
            progress: false,
        }
    }
}

/// In the manifest: what was imported and how.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ImportSummary {
    pub format: ImportFormat,
    pub train_inputs: Vec<String>,
    pub val_inputs: Vec<String>,
    /// The document separator of flat inputs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub separator: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roll_seed: Option<u64>,
    /// Tokens read from the inputs (what the subsets needed, not necessarily all).
    pub tokens_read: u64,
}

impl ImportSummary {
    pub fn describe(&self) -> String {
        let mut s = format!("{} from {}", self.format.as_str(), self.train_inputs.join(", "));
        if !self.val_inputs.is_empty() {
            s += &format!(" (validation: {})", self.val_inputs.join(", "));
        }
        if let Some(sep) = self.separator {
            s += &format!(", documents split at token {sep}");
        }
        if let Some(seed) = self.roll_seed {
            s += &format!(", rows rolled with seed {seed}");
        }
        s + &format!(", {} tokens read", self.tokens_read)
    }
}

/// Integer types of token arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Elem {
    U8,
    U16,
    U32,
    U64,
    I16,
    I32,
    I64,
}

impl Elem {
    fn size(self) -> usize {
        match self {
            Elem::U8 => 1,
            Elem::U16 | Elem::I16 => 2,
            Elem::U32 | Elem::I32 => 4,
            Elem::U64 | Elem::I64 => 8,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Elem::U8 => "uint8",
            Elem::U16 => "uint16",
            Elem::U32 => "uint32",
            Elem::U64 => "uint64",
            Elem::I16 => "int16",
            Elem::I32 => "int32",
            Elem::I64 => "int64",
        }
    }
    /// The value of one little-endian element (signed types sign-extended).
    fn read(self, b: &[u8]) -> i128 {
        match self {
            Elem::U8 => b[0] as i128,
            Elem::U16 => u16::from_le_bytes([b[0], b[1]]) as i128,
            Elem::I16 => i16::from_le_bytes([b[0], b[1]]) as i128,
            Elem::U32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i128,
            Elem::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i128,
            Elem::U64 => u64::from_le_bytes(b[..8].try_into().expect("8 bytes")) as i128,
            Elem::I64 => i64::from_le_bytes(b[..8].try_into().expect("8 bytes")) as i128,
        }
    }
}

/// A memory-mapped token array: `len` elements from byte `offset`, flat or `rows` x `cols`.
struct TokenFile {
    path: PathBuf,
    map: memmap2::Mmap,
    offset: usize,
    elem: Elem,
    len: usize,
    /// Columns of a 2-D array.
    cols: Option<usize>,
}

impl TokenFile {
    /// A flat file of little-endian `elem`s: its size must be a whole number of them.
    fn flat(path: &Path, elem: Elem) -> Result<TokenFile> {
        let map = map_file(path)?;
        if map.len() % elem.size() != 0 {
            bail!(
                "{}: {} bytes, not a whole number of {}-byte {} tokens: truncated, or not this format",
                path.display(),
                map.len(),
                elem.size(),
                elem.name()
            );
        }
        let len = map.len() / elem.size();
        Ok(TokenFile { path: path.to_path_buf(), map, offset: 0, elem, len, cols: None })
    }

    fn npy(path: &Path) -> Result<TokenFile> {
        let map = map_file(path)?;
        let h = npy::parse_header(&map)
            .with_context(|| format!("{}: not a NumPy .npy array we can read", path.display()))?;
        let count = h.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let bytes = count.and_then(|c| c.checked_mul(h.elem.size()));
        let avail = map.len() - h.data_offset;
        match bytes {
            Some(b) if b == avail => {}
            _ => bail!(
                "{}: shape {:?} of {} needs {} bytes of data, the file has {avail} after its header: truncated or corrupt",
                path.display(),
                h.shape,
                h.elem.name(),
                bytes.map_or("more than 2^64".to_string(), |b| b.to_string()),
            ),
        }
        let len = count.expect("checked above");
        let cols = match h.shape.len() {
            1 => None,
            2 => Some(h.shape[1]),
            n => bail!("{}: a {n}-dimensional array; token arrays have 1 (a stream) or 2 (rows)", path.display()),
        };
        Ok(TokenFile { path: path.to_path_buf(), map, offset: h.data_offset, elem: h.elem, len, cols })
    }

    fn rows(&self) -> usize {
        self.cols.map_or(0, |c| self.len.checked_div(c).unwrap_or(0))
    }

    fn raw(&self, i: usize) -> i128 {
        let w = self.elem.size();
        self.elem.read(&self.map[self.offset + i * w..self.offset + (i + 1) * w])
    }

    /// Where element `i` is, for messages.
    fn position(&self, i: usize) -> String {
        match self.cols {
            Some(c) if c > 0 => format!("token {i} (row {}, column {})", i / c, i % c),
            _ => format!("token {i}"),
        }
    }

    /// Elements [from, to) as token ids, each checked: not negative, below the vocabulary.
    fn read_into(&self, from: usize, to: usize, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        for i in from..to {
            let v = self.raw(i);
            if v < 0 || v >= GPT2_VOCAB as i128 {
                bail!(
                    "{}: {} is {v}, {}",
                    self.path.display(),
                    self.position(i),
                    if v < 0 {
                        "negative: not a token id".to_string()
                    } else {
                        format!("outside the GPT-2 vocabulary of {GPT2_VOCAB}")
                    }
                );
            }
            out.push(v as u32);
        }
        Ok(())
    }

    /// The first element at or after `from` equal to `sep`, else `len`.
    fn find(&self, from: usize, sep: u32) -> usize {
        (from..self.len).find(|&i| self.raw(i) == sep as i128).unwrap_or(self.len)
    }
}

/// Per split: its shard writer, the cap on its tokens, and whether it is full.
struct Sink {
    w: ShardWriter,
    cap: u64,
}

impl Sink {
    fn room(&self) -> u64 {
        self.cap.saturating_sub(self.w.tokens as u64)
    }
}

/// Tokens of a document are converted and written in pieces of this many.
const PIECE: usize = 1 << 20;

struct Importer<'a> {
    opts: &'a ImportOptions,
    train: Sink,
    val: Sink,
    /// Documents seen so far (for the evenly spaced hold-out).
    doc_index: usize,
    /// Rows seen so far in the current split's files (for the roll's seed).
    row_index: u64,
    tokens_read: u64,
    buf: Vec<u32>,
    pb: indicatif::ProgressBar,
}

impl Importer<'_> {
    fn sink(&mut self, held_out: bool) -> &mut Sink {
        if held_out {
            &mut self.val
        } else {
            &mut self.train
        }
    }

    /// Whether the split(s) a file feeds can take no more tokens (then reading stops).
    fn done(&self, split: Option<Split>) -> bool {
        match split {
            Some(Split::Train) => self.train.room() == 0,
            Some(Split::Val) => self.val.room() == 0,
            None => self.train.room() == 0 && (self.val.room() == 0 || self.opts.val_fraction == 0.0),
        }
    }

    /// Writes elements [from, to) of `f` as one document of the split chosen for it, cut to
    /// what the split may still take. Returns false when that split is full.
    /// Whether the next document goes to validation.
    fn next_held_out(&mut self, split: Option<Split>) -> bool {
        let held_out = match split {
            Some(s) => s == Split::Val,
            None => is_val_document(self.doc_index, self.opts.val_fraction),
        };
        self.doc_index += 1;
        held_out
    }

    fn document(&mut self, f: &TokenFile, pieces: &[(usize, usize)], split: Option<Split>) -> Result<bool> {
        let held_out = self.next_held_out(split);
        self.write_document(f, pieces, held_out)
    }

    fn write_document(&mut self, f: &TokenFile, pieces: &[(usize, usize)], held_out: bool) -> Result<bool> {
        let total: usize = pieces.iter().map(|(a, b)| b - a).sum();
        let room = self.sink(held_out).room();
        if room == 0 {
            return Ok(false);
        }
        let mut left = (total as u64).min(room) as usize;
        self.sink(held_out).w.begin_document(left)?;
        let mut buf = std::mem::take(&mut self.buf);
        for &(a, b) in pieces {
            let mut i = a;
            while i < b && left > 0 {
                let j = (i + PIECE).min(b).min(i + left);
                f.read_into(i, j, &mut buf)?;
                self.sink(held_out).w.write_tokens(&buf)?;
                self.pb.inc(((j - i) * f.elem.size()) as u64);
                self.tokens_read += (j - i) as u64;
                left -= j - i;
                i = j;
            }
        }
        self.buf = buf;
        self.sink(held_out).w.end_document();
        Ok(true)
    }

    /// A flat stream: documents end at the separator (dropped), or the file is one document.
    fn flat(&mut self, f: &TokenFile, split: Option<Split>) -> Result<()> {
        let mut pos = 0;
        while pos < f.len && !self.done(split) {
            let end = match self.opts.separator {
                Some(sep) => f.find(pos, sep),
                None => f.len,
            };
            self.document(f, &[(pos, end)], split)?;
            pos = end + 1;
        }
        Ok(())
    }

    /// Rows: every row is one document: after the roll, its first `take` tokens in training,
    /// the whole row in validation.
    fn rows(&mut self, f: &TokenFile, split: Option<Split>, take: usize) -> Result<()> {
        let cols = f.cols.expect("a 2-D array");
        for r in 0..f.rows() {
            if self.done(split) {
                break;
            }
            let base = r * cols;
            let shift = match self.opts.roll_seed {
                Some(seed) => roll_shift(seed, self.row_index, cols),
                None => 0,
            };
            self.row_index += 1;
            let held_out = self.next_held_out(split);
            let take = if held_out { cols } else { take };
            // np.roll(row, shift): out[i] = row[(i - shift) mod cols], i.e. the row's last
            // `shift` tokens first.
            let (a, b) = ((base + cols - shift, base + cols), (base, base + cols - shift));
            let mut pieces = vec![];
            let mut left = take;
            for (x, y) in [a, b] {
                let n = (y - x).min(left);
                if n > 0 {
                    pieces.push((x, x + n));
                    left -= n;
                }
            }
            self.write_document(f, &pieces, held_out)?;
        }
        Ok(())
    }
}

/// The roll of row `row` (counted over a split's files in order): uniform in [0, cols), from a
/// ChaCha8 stream seeded by the seed and the row, so a row's roll does not depend on the subset.
pub fn roll_shift(seed: u64, row: u64, cols: usize) -> usize {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ row.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    rng.gen_range(0..cols.max(1))
}

fn open_input(path: &Path, format: ImportFormat) -> Result<TokenFile> {
    if !path.is_file() {
        bail!("{}: no such file", path.display());
    }
    let is_npy = path.extension().is_some_and(|e| e == "npy");
    let f = match format {
        ImportFormat::Bin16 => TokenFile::flat(path, Elem::U16)?,
        ImportFormat::Bin32 => TokenFile::flat(path, Elem::U32)?,
        ImportFormat::Npy => TokenFile::npy(path)?,
        ImportFormat::Longcrawl64 => {
            let mut f = if is_npy { TokenFile::npy(path)? } else { TokenFile::flat(path, Elem::U16)? };
            match f.cols {
                Some(LONGCRAWL64_ROW) => {}
                Some(c) => bail!(
                    "{}: rows of {c} tokens; LongCrawl64 rows have {LONGCRAWL64_ROW} (--format npy takes other rows)",
                    path.display()
                ),
                None if !is_npy && f.len % LONGCRAWL64_ROW == 0 => f.cols = Some(LONGCRAWL64_ROW),
                None => bail!(
                    "{}: {} tokens, not whole rows of {LONGCRAWL64_ROW} (LongCrawl64 rows: a [rows, {LONGCRAWL64_ROW}] .npy \
                     or a flat uint16 file of whole rows)",
                    path.display(),
                    f.len
                ),
            }
            f
        }
    };
    if matches!(format, ImportFormat::Bin16 | ImportFormat::Bin32) && is_npy {
        bail!("{}: a .npy file given as --format {}: use --format npy", path.display(), format.as_str());
    }
    Ok(f)
}

/// Imports token arrays into a dataset in `out` (see the module docs); returns its manifest.
pub fn import(inputs: &[PathBuf], out: &Path, opts: &ImportOptions) -> Result<Manifest> {
    if inputs.is_empty() {
        bail!("no input given: name token files with --input");
    }
    if !(0.0..1.0).contains(&opts.val_fraction) {
        bail!("--val-fraction must be in [0, 1), got {}", opts.val_fraction);
    }
    if !opts.val.is_empty() && opts.val_fraction > 0.0 {
        bail!("--val names the validation files; --val-fraction (holding out documents of --input) goes without it");
    }
    let row_format = opts.format == ImportFormat::Longcrawl64;
    if !row_format && (opts.row_tokens.is_some() || opts.roll_seed.is_some()) {
        bail!("--row-tokens and --roll-seed are for rows (--format longcrawl64)");
    }
    // Open and check every input before the output folder is touched.
    let open_all = |paths: &[PathBuf]| paths.iter().map(|p| open_input(p, opts.format)).collect::<Result<Vec<_>>>();
    let (train_files, val_files) = (open_all(inputs)?, open_all(&opts.val)?);
    let row = if row_format { Some(LONGCRAWL64_ROW) } else { None };
    let take = match (row, opts.row_tokens) {
        (Some(r), Some(t)) if t == 0 || t > r => bail!("--row-tokens {t}: must be 1 to {r}, the row length"),
        (Some(_), Some(t)) => Some(t),
        (Some(r), None) => Some(r),
        (None, _) => None,
    };
    if let (Some(t), Some(r)) = (take, row) {
        for (flag, cap, t) in [("--train-tokens", opts.train_tokens, t), ("--val-tokens", opts.val_tokens, r)] {
            if let Some(c) = cap.filter(|c| c % t as u64 != 0) {
                bail!("{flag} {c} is not a whole number of rows of {t} tokens: give a multiple of {t}");
            }
        }
    }
    create_output(out, opts.overwrite)?;
    let dtype = TokenDtype::for_vocab(GPT2_VOCAB);
    let total_bytes: u64 = train_files.iter().chain(&val_files).map(|f| (f.len * f.elem.size()) as u64).sum();
    let mut imp = Importer {
        opts,
        train: Sink {
            w: ShardWriter::new(out, Split::Train, dtype, opts.shard_tokens),
            cap: opts.train_tokens.unwrap_or(u64::MAX),
        },
        val: Sink {
            w: ShardWriter::new(out, Split::Val, dtype, opts.shard_tokens),
            cap: opts.val_tokens.unwrap_or(u64::MAX),
        },
        doc_index: 0,
        row_index: 0,
        tokens_read: 0,
        buf: Vec::new(),
        pb: progress_bar(opts.progress, total_bytes, "importing "),
    };
    for (files, split) in
        [(&train_files, if opts.val.is_empty() { None } else { Some(Split::Train) }), (&val_files, Some(Split::Val))]
    {
        imp.row_index = 0;
        for f in files.iter() {
            match take {
                Some(t) => imp.rows(f, split, t)?,
                None if f.cols.is_some() => {
                    // A 2-D .npy: every row is a document, whole.
                    let cols = f.cols.expect("2-D");
                    for r in 0..f.rows() {
                        if imp.done(split) {
                            break;
                        }
                        imp.document(f, &[(r * cols, (r + 1) * cols)], split)?;
                    }
                }
                None => imp.flat(f, split)?,
            }
        }
        if split.is_none() {
            // --val-fraction: both splits came from the inputs.
            break;
        }
    }
    imp.pb.finish_and_clear();
    let tokens_read = imp.tokens_read;
    let (mut train, mut val): (SplitInfo, SplitInfo) = (imp.train.w.finish()?, imp.val.w.finish()?);
    // Rows: the loader cuts windows inside them; validation rows are whole.
    (train.row_tokens, val.row_tokens) = (take, row);
    for (flag, cap, got, split) in [
        ("--train-tokens", opts.train_tokens, train.tokens, "training"),
        ("--val-tokens", opts.val_tokens, val.tokens, "validation"),
    ] {
        if let Some(c) = cap.filter(|&c| got as u64 != c) {
            bail!("{flag} {c}: the inputs hold only {got} {split} tokens");
        }
    }
    if train.tokens == 0 {
        bail!("the inputs hold no tokens for training: nothing to train on");
    }
    let show = |p: &PathBuf| p.display().to_string();
    let manifest = Manifest {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        tokenizer: "gpt2".into(),
        text_format: opts.text_format,
        vocab_size: GPT2_VOCAB,
        dtype,
        val_fraction: opts.val_fraction,
        sources: inputs.iter().chain(&opts.val).map(show).collect(),
        skipped_empty: 0,
        globs: vec![],
        val_by: super::ValBy::Document,
        tree: None,
        import: Some(ImportSummary {
            format: opts.format,
            train_inputs: inputs.iter().map(show).collect(),
            val_inputs: opts.val.iter().map(show).collect(),
            separator: if take.is_none() && train_files.iter().chain(&val_files).any(|f| f.cols.is_none()) {
                opts.separator
            } else {
                None
            },
            roll_seed: opts.roll_seed,
            tokens_read,
        }),
        train,
        val,
    };
    let json = serde_json::to_string_pretty(&manifest).expect("manifest serialises");
    crate::fsutil::write_atomic(&out.join(MANIFEST_FILE), json.as_bytes())?;
    Ok(manifest)
}

/// Token counts on the command line: an integer with an optional K, M, G or T (powers of 1024,
/// `Ki`-style spellings too): `45G` = `45Gi` = 45 * 2^30.
pub fn parse_tokens(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix(['i', 'I']).filter(|r| r.ends_with(|c: char| "kKmMgGtT".contains(c))).unwrap_or(t);
    let (num, shift) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| format!("{s:?} is not a token count (e.g. 1000000, 512K, 45Gi)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_counts() {
        assert_eq!(parse_tokens("45Gi"), Ok(45 << 30));
        assert_eq!(parse_tokens("45G"), Ok(45 << 30));
        assert_eq!(parse_tokens("2gi"), Ok(2 << 30));
        assert_eq!(parse_tokens("512K"), Ok(512 << 10));
        assert_eq!(parse_tokens("1000"), Ok(1000));
        for bad in ["", "1.5G", "-3", "Gi", "99999999999T", "4i"] {
            assert!(parse_tokens(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn roll_shifts_are_seeded_per_row_and_in_range() {
        let a: Vec<usize> = (0..64).map(|r| roll_shift(7, r, 65536)).collect();
        assert_eq!(a, (0..64).map(|r| roll_shift(7, r, 65536)).collect::<Vec<_>>());
        assert!(a.iter().all(|&s| s < 65536));
        // Different rows and seeds roll differently (64 equal draws of 65536 would be a broken RNG).
        assert!(a.iter().collect::<std::collections::BTreeSet<_>>().len() > 60);
        assert_ne!(a, (0..64).map(|r| roll_shift(8, r, 65536)).collect::<Vec<_>>());
    }
}
