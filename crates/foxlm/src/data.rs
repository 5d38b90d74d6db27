//! Token shards: `foxlm data prepare` writes them, [`Dataset`] reads them, [`Loader`] cuts them
//! into training windows.
//!
//! A prepared dataset is a folder:
//!
//! ```text
//! manifest.json              tokenizer, text format, vocabulary, token dtype, per split:
//!                            documents, tokens and the shards with their SHA-256 checksums
//! train-00000.tokens         the split's documents' tokens back to back, little-endian u16
//! train-00000.index            (u32 when the vocabulary exceeds 65536), no BOS/EOS;
//! val-00000.tokens           .index: little-endian u64 offsets (in tokens) of each document's
//! val-00000.index              start, plus one final offset = the shard's token count
//! ```
//!
//! Both files are memory-mapped. A document is one input text file, or one line of a `.jsonl`
//! file (its `"text"` field). Documents go to train or validation whole: with fraction f, the
//! i-th document (in input order, folders walked in natural-sorted order) is held out when
//! floor((i + 1) f) > floor(i f), i.e. evenly spaced, exactly round-down(n f) of them.
//!
//! Tree mode (`--glob PATTERN`, for source trees tokenized where they lie): every file under an
//! input folder whose relative path matches a pattern is a document (no .jsonl handling). Files
//! that are not UTF-8 or cannot be read are skipped and counted; files with the same bytes as an
//! earlier one are dropped (headers sit in several places); `--val-by dir|top` holds out whole
//! folders or whole top-level entries (packages), chosen by a hash of their relative path, about
//! f of the kept bytes. Every file's fate is listed in `files.jsonl`. The walk is sorted and
//! every decision is taken in that order, so the same tree gives byte-identical shards.
//!
//! `data import` (the [`import`] module) writes the same layout from token arrays that are
//! already tokenized (nanoGPT .bin, .npy, LongCrawl64 rows), without re-tokenizing.
//!
//! Training windows (SPEC §3): the split's documents, in a seeded order that changes each epoch,
//! form one stream `doc EOS doc EOS ...`; window k is BOS followed by the stream's tokens
//! [kT, kT + T): the model reads its first T tokens and predicts its last T. Documents longer
//! than a window span several windows; shorter ones are packed with EOS between them. The window
//! order within an epoch is a seeded permutation too, so a batch mixes distant parts of the
//! corpus. The position ([`LoaderState`]) is saved in checkpoints. A split of rows (its
//! `row_tokens` in the manifest: imported LongCrawl64) is never joined: window w is BOS and
//! the (w mod k)-th stretch of T tokens of row w / k, k = row_tokens / T, as the LongCrawl64
//! authors cut them.

use crate::tokenizer::{TextFormat, Tokenizer, BOS_ID, EOS_ID, GPT2_VOCAB};
use anyhow::{anyhow, bail, Context, Result};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

pub mod import;

pub const MANIFEST_FILE: &str = "manifest.json";
pub const FORMAT_NAME: &str = "foxlm-token-shards";
pub const FORMAT_VERSION: u32 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Val,
}

impl Split {
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Val => "val",
        }
    }
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How tokens are stored in a shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenDtype {
    U16,
    U32,
}

impl TokenDtype {
    pub fn for_vocab(vocab: usize) -> Self {
        if vocab <= 1 << 16 {
            TokenDtype::U16
        } else {
            TokenDtype::U32
        }
    }
    pub fn bytes(self) -> usize {
        match self {
            TokenDtype::U16 => 2,
            TokenDtype::U32 => 4,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// File of the tokens, relative to the dataset folder.
    pub tokens_file: String,
    /// File of the document offsets (u64, documents + 1 of them).
    pub index_file: String,
    pub documents: usize,
    pub tokens: usize,
    pub tokens_sha256: String,
    pub index_sha256: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SplitInfo {
    pub documents: usize,
    pub tokens: usize,
    /// Every document is a row of exactly this many tokens (imported LongCrawl64): windows are
    /// cut inside rows, at multiples of the window length, never across two rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_tokens: Option<usize>,
    pub shards: Vec<ShardInfo>,
}

/// The contents of `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// Always "gpt2" (tiktoken's r50k_base) for now.
    pub tokenizer: String,
    pub text_format: TextFormat,
    pub vocab_size: usize,
    pub dtype: TokenDtype,
    pub val_fraction: f64,
    /// The inputs given to `data prepare`, as given.
    pub sources: Vec<String>,
    /// Documents that produced no tokens and were skipped.
    #[serde(default)]
    pub skipped_empty: usize,
    /// The `--glob` patterns of a tree-mode dataset (empty: the classic mode).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub globs: Vec<String>,
    /// How the validation split was chosen.
    #[serde(default, skip_serializing_if = "ValBy::is_document")]
    pub val_by: ValBy,
    /// Tree mode: files found, skipped and deduplicated, held-out groups; the per-file listing
    /// is in `files.jsonl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<TreeSummary>,
    /// What `data import` read (absent for `data prepare`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import: Option<import::ImportSummary>,
    pub train: SplitInfo,
    pub val: SplitInfo,
}

impl Manifest {
    pub fn split(&self, s: Split) -> &SplitInfo {
        match s {
            Split::Train => &self.train,
            Split::Val => &self.val,
        }
    }
}

struct Shard {
    tokens: memmap2::Mmap,
    /// Document start offsets, documents + 1 of them.
    offsets: Vec<u64>,
}

/// A prepared dataset, memory-mapped.
pub struct Dataset {
    dir: PathBuf,
    manifest: Manifest,
    /// Per split: shards and the cumulative document count before each.
    splits: [(Vec<Shard>, Vec<usize>); 2],
}

fn sha256_hex(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first token (position, id) of a shard's bytes whose id is not below `vocab`.
fn first_token_outside(bytes: &[u8], dtype: TokenDtype, vocab: usize) -> Option<(usize, u64)> {
    let w = dtype.bytes();
    // In parallel blocks: a shard may hold billions of tokens.
    bytes.par_chunks(w << 20).enumerate().find_map_first(|(block, chunk)| {
        chunk.chunks_exact(w).enumerate().find_map(|(i, c)| {
            let id = match dtype {
                TokenDtype::U16 => u16::from_le_bytes([c[0], c[1]]) as u64,
                TokenDtype::U32 => u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u64,
            };
            (id >= vocab as u64).then_some(((block << 20) + i, id))
        })
    })
}

fn map_file(path: &Path) -> Result<memmap2::Mmap> {
    let f = std::fs::File::open(path).with_context(|| format!("cannot open shard {}", path.display()))?;
    let len = f.metadata().with_context(|| format!("cannot stat {}", path.display()))?.len();
    if len == 0 {
        // Mapping an empty file fails on some systems; an empty map of an anonymous region works.
        return memmap2::MmapOptions::new()
            .len(0)
            .map_anon()
            .map(|m| m.make_read_only().expect("read-only"))
            .with_context(|| format!("cannot map {}", path.display()));
    }
    // SAFETY: read-only map; the files are written once by `data prepare` and never modified.
    unsafe { memmap2::Mmap::map(&f) }.with_context(|| format!("cannot map {}", path.display()))
}

impl Dataset {
    /// Opens a prepared dataset, checking the manifest, every shard's size and SHA-256.
    pub fn open(dir: &Path) -> Result<Dataset> {
        Self::open_inner(dir, true)
    }

    /// As [`open`](Self::open) but without hashing the shards (sizes and offsets are still checked).
    pub fn open_unverified(dir: &Path) -> Result<Dataset> {
        Self::open_inner(dir, false)
    }

    fn open_inner(dir: &Path, verify: bool) -> Result<Dataset> {
        let mpath = dir.join(MANIFEST_FILE);
        if !dir.is_dir() {
            bail!("{}: no such dataset folder (make one with `foxlm data prepare`)", dir.display());
        }
        if !mpath.is_file() {
            bail!("cannot read {} (is this a folder made by `foxlm data prepare`?)", mpath.display());
        }
        let text = crate::validate::read_text(&mpath)?;
        let manifest: Manifest = serde_json::from_str(&text)
            .with_context(|| format!("{}: corrupt or not a foxlm manifest", mpath.display()))?;
        if manifest.format != FORMAT_NAME || manifest.version != FORMAT_VERSION {
            bail!(
                "{}: format {:?} version {}, expected {FORMAT_NAME:?} version {FORMAT_VERSION}",
                mpath.display(),
                manifest.format,
                manifest.version
            );
        }
        if manifest.tokenizer != "gpt2" {
            bail!("{}: tokenizer {:?} is not supported (only \"gpt2\")", mpath.display(), manifest.tokenizer);
        }
        if manifest.vocab_size != GPT2_VOCAB {
            bail!(
                "{}: vocab_size is {}, but the gpt2 tokenizer has {GPT2_VOCAB} tokens",
                mpath.display(),
                manifest.vocab_size
            );
        }
        if manifest.dtype != TokenDtype::for_vocab(manifest.vocab_size) && manifest.dtype == TokenDtype::U16 {
            bail!("{}: vocabulary {} does not fit dtype u16", mpath.display(), manifest.vocab_size);
        }
        let mut splits: [(Vec<Shard>, Vec<usize>); 2] = Default::default();
        for (si, split) in [Split::Train, Split::Val].into_iter().enumerate() {
            let info = manifest.split(split);
            let (mut shards, mut cum) = (Vec::new(), vec![0usize]);
            let (mut docs, mut toks) = (0usize, 0usize);
            if info.row_tokens == Some(0) {
                bail!("{}: {split} split: row_tokens is 0", mpath.display());
            }
            for sh in &info.shards {
                let shard = Self::open_shard(dir, &mpath, &manifest, sh, verify)?;
                if let Some(r) = info.row_tokens {
                    if let Some(w) = shard.offsets.windows(2).find(|w| w[1] - w[0] != r as u64) {
                        bail!(
                            "{}: a document of {} tokens in {}, but the manifest says every row of the {split} split has {r}",
                            mpath.display(),
                            w[1] - w[0],
                            sh.tokens_file
                        );
                    }
                }
                shards.push(shard);
                let overflow = || anyhow!("{}: {split} split: document or token counts overflow", mpath.display());
                docs = docs.checked_add(sh.documents).ok_or_else(overflow)?;
                toks = toks.checked_add(sh.tokens).ok_or_else(overflow)?;
                cum.push(docs);
            }
            if docs != info.documents || toks != info.tokens {
                bail!(
                    "{}: {split} split lists {} documents / {} tokens but its shards hold {docs} / {toks}",
                    mpath.display(),
                    info.documents,
                    info.tokens
                );
            }
            // The loader numbers documents with u32.
            if docs > u32::MAX as usize {
                bail!("{}: {split} split has {docs} documents, more than foxlm can index", mpath.display());
            }
            splits[si] = (shards, cum);
        }
        Ok(Dataset { dir: dir.to_path_buf(), manifest, splits })
    }

    /// Opens one shard: its files inside the dataset folder, their sizes as the manifest says
    /// (checked before reading), checksums when `verify`, offsets increasing, and every token id
    /// inside the vocabulary.
    fn open_shard(dir: &Path, mpath: &Path, manifest: &Manifest, sh: &ShardInfo, verify: bool) -> Result<Shard> {
        let tpath = crate::validate::file_in_dir(dir, &sh.tokens_file, mpath)?;
        let ipath = crate::validate::file_in_dir(dir, &sh.index_file, mpath)?;
        let want_tokens = (sh.tokens as u128) * manifest.dtype.bytes() as u128;
        let want_index = (sh.documents as u128 + 1) * 8;
        let index_len = std::fs::metadata(&ipath)
            .with_context(|| format!("cannot read shard index {}", ipath.display()))?
            .len() as u128;
        if index_len != want_index {
            bail!(
                "{}: {index_len} bytes, the manifest says {} documents ({want_index} bytes): truncated or corrupt",
                ipath.display(),
                sh.documents,
            );
        }
        let tokens = map_file(&tpath)?;
        if tokens.len() as u128 != want_tokens {
            bail!(
                "{}: {} bytes, the manifest says {} tokens ({want_tokens} bytes): truncated or corrupt",
                tpath.display(),
                tokens.len(),
                sh.tokens
            );
        }
        crate::validate::check_memory(want_index, &format!("{}: the document offsets", ipath.display()))?;
        let index = std::fs::read(&ipath).with_context(|| format!("cannot read shard index {}", ipath.display()))?;
        if index.len() as u128 != want_index {
            bail!("{}: changed size while being read", ipath.display());
        }
        if verify {
            let got = sha256_hex(&tokens);
            if got != sh.tokens_sha256 {
                bail!(
                    "{}: checksum mismatch (sha256 {got}, manifest {}): corrupt shard",
                    tpath.display(),
                    sh.tokens_sha256
                );
            }
            let got = sha256_hex(&index);
            if got != sh.index_sha256 {
                bail!(
                    "{}: checksum mismatch (sha256 {got}, manifest {}): corrupt index",
                    ipath.display(),
                    sh.index_sha256
                );
            }
        }
        let offsets: Vec<u64> = index
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect();
        if offsets.first() != Some(&0)
            || offsets.last().map(|&l| l as u128) != Some(sh.tokens as u128)
            || offsets.windows(2).any(|w| w[0] > w[1])
        {
            bail!("{}: document offsets are not increasing from 0 to {}: corrupt index", ipath.display(), sh.tokens);
        }
        if let Some((pos, id)) = first_token_outside(&tokens, manifest.dtype, manifest.vocab_size) {
            bail!(
                "{}: token {pos} has id {id}, outside the vocabulary of {} (manifest vocab_size): corrupt shard",
                tpath.display(),
                manifest.vocab_size
            );
        }
        Ok(Shard { tokens, offsets })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn num_documents(&self, split: Split) -> usize {
        self.manifest.split(split).documents
    }

    pub fn num_tokens(&self, split: Split) -> usize {
        self.manifest.split(split).tokens
    }

    fn split_data(&self, split: Split) -> &(Vec<Shard>, Vec<usize>) {
        &self.splits[split as usize]
    }

    /// Length in tokens of document `i` (without BOS/EOS).
    pub fn document_len(&self, split: Split, i: usize) -> usize {
        let (sh, off) = self.locate(split, i);
        (sh.offsets[off + 1] - sh.offsets[off]) as usize
    }

    fn locate(&self, split: Split, i: usize) -> (&Shard, usize) {
        let n = self.num_documents(split);
        assert!(i < n, "document {i} of the {split} split, which has {n}");
        let (shards, cum) = self.split_data(split);
        // The last shard whose first document is <= i.
        let s = cum.partition_point(|&c| c <= i) - 1;
        (&shards[s], i - cum[s])
    }

    /// Appends tokens [from, to) of document `i` to `out`.
    pub fn document_range_into(&self, split: Split, i: usize, from: usize, to: usize, out: &mut Vec<u32>) {
        let (sh, off) = self.locate(split, i);
        let start = sh.offsets[off] as usize;
        let len = (sh.offsets[off + 1] as usize) - start;
        assert!(from <= to && to <= len, "range {from}..{to} of a document of {len} tokens");
        let (a, b) = (start + from, start + to);
        match self.manifest.dtype {
            TokenDtype::U16 => {
                out.extend(sh.tokens[a * 2..b * 2].chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as u32))
            }
            TokenDtype::U32 => {
                out.extend(sh.tokens[a * 4..b * 4].chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap())))
            }
        }
    }

    /// Document `i`'s tokens, without BOS/EOS.
    pub fn document(&self, split: Split, i: usize) -> Vec<u32> {
        let len = self.document_len(split, i);
        let mut v = Vec::with_capacity(len);
        self.document_range_into(split, i, 0, len, &mut v);
        v
    }

    /// The text of a split's documents, for `data inspect`.
    pub fn summary(&self) -> String {
        let m = &self.manifest;
        let mut s = String::new();
        s += &format!("dataset     {}\n", self.dir.display());
        let dtype = match m.dtype {
            TokenDtype::U16 => "u16",
            TokenDtype::U32 => "u32",
        };
        s += &format!(
            "tokenizer   {} ({}), vocabulary {}, stored as {dtype}\n",
            m.tokenizer, m.text_format, m.vocab_size
        );
        s += &format!("sources     {}\n", m.sources.join(", "));
        for split in [Split::Train, Split::Val] {
            let n = self.num_documents(split);
            let t = self.num_tokens(split);
            let lens: Vec<usize> = (0..n).map(|i| self.document_len(split, i)).collect();
            let (min, max) = (lens.iter().copied().min().unwrap_or(0), lens.iter().copied().max().unwrap_or(0));
            let mut sorted = lens.clone();
            sorted.sort_unstable();
            let median = sorted.get(n / 2).copied().unwrap_or(0);
            s += &format!(
                "{:<5}       {n} documents, {t} tokens in {} shard(s); tokens per document: min {min}, median {median}, mean {:.0}, max {max}\n",
                split.as_str(),
                m.split(split).shards.len(),
                if n > 0 { t as f64 / n as f64 } else { 0.0 },
            );
        }
        for split in [Split::Train, Split::Val] {
            if let Some(r) = m.split(split).row_tokens {
                s += &format!("rows        {split}: every document is a row of {r} tokens; windows stay inside rows\n");
            }
        }
        if let Some(i) = &m.import {
            s += &format!("imported    {}\n", i.describe());
        }
        if m.skipped_empty > 0 {
            s += &format!("skipped     {} empty document(s)\n", m.skipped_empty);
        }
        if let Some(t) = &m.tree {
            s += &format!(
                "files       {} matched --glob {} ({}); {} duplicates, {} not UTF-8, {} unreadable, {} too large skipped\n",
                t.files,
                m.globs.join(" --glob "),
                crate::validate::human_bytes(t.bytes as u128),
                t.duplicates,
                t.skipped_not_utf8,
                t.skipped_unreadable,
                t.skipped_too_large
            );
            if m.val_by != ValBy::Document {
                s += &format!(
                    "held out    {} of {} groups (--val-by {}): {} of {} kept bytes\n",
                    t.val_groups,
                    t.groups,
                    m.val_by.as_str(),
                    crate::validate::human_bytes(t.val_bytes as u128),
                    crate::validate::human_bytes(t.train_bytes as u128 + t.val_bytes as u128)
                );
            }
        }
        s
    }
}

// ---------------------------------------------------------------------------------------------
// Preparing a dataset.

/// Options of `data prepare`.
#[derive(Clone, Debug)]
pub struct PrepareOptions {
    pub text_format: TextFormat,
    pub val_fraction: f64,
    /// Most tokens in one shard.
    pub shard_tokens: usize,
    /// Replace an existing dataset in the output folder.
    pub overwrite: bool,
    pub progress: bool,
    /// Tree mode: patterns of the files to take under each input folder (see [`pattern`]);
    /// empty: the classic mode (every file, .jsonl lines as documents).
    pub globs: Vec<String>,
    /// How documents are held out (tree mode may hold out whole folders).
    pub val_by: ValBy,
    /// Tree mode: skip files larger than this.
    pub max_file_bytes: Option<u64>,
}

impl Default for PrepareOptions {
    fn default() -> Self {
        Self {
            text_format: TextFormat::JsonEscaped,
            val_fraction: 0.05,
            shard_tokens: 1 << 28,
            overwrite: false,
            progress: false,
            globs: vec![],
            val_by: ValBy::Document,
            max_file_bytes: None,
        }
    }
}

/// Orders names so that "chapter_2" comes before "chapter_10".
fn natural_key(s: &str) -> Vec<(u8, u64, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_ascii_digit() {
            let mut n = String::new();
            while let Some(&d) = chars.peek() {
                if d.is_ascii_digit() {
                    n.push(d);
                    chars.next();
                } else {
                    break;
                }
            }
            out.push((0, n.parse::<u64>().unwrap_or(u64::MAX), n));
        } else {
            let mut t = String::new();
            while let Some(&d) = chars.peek() {
                if !d.is_ascii_digit() {
                    t.push(d);
                    chars.next();
                } else {
                    break;
                }
            }
            out.push((1, 0, t));
        }
    }
    out
}

/// The input files: files as given, folders walked recursively (hidden entries skipped), each
/// folder's entries in natural order.
pub fn list_inputs(inputs: &[PathBuf]) -> Result<Vec<PathBuf>> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read folder {}", dir.display()))?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()
            .with_context(|| format!("cannot read folder {}", dir.display()))?;
        entries.retain(|p| !p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.')));
        entries.sort_by_cached_key(|p| natural_key(&p.file_name().unwrap_or_default().to_string_lossy()));
        for p in entries {
            if p.is_dir() {
                walk(&p, out)?;
            } else if p.is_file() {
                out.push(p);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    for p in inputs {
        if p.is_dir() {
            walk(p, &mut out)?;
        } else if p.is_file() {
            out.push(p.clone());
        } else {
            bail!("{}: no such file or folder", p.display());
        }
    }
    Ok(out)
}

/// Whether document number `i` (0-based, in input order) is held out for validation.
pub fn is_val_document(i: usize, val_fraction: f64) -> bool {
    ((i + 1) as f64 * val_fraction).floor() > (i as f64 * val_fraction).floor()
}

/// Writes a split's shards. Tokens stream to the open shard's file (hashed on the way), so a
/// shard never has to fit in memory; a document never spans two shards.
struct ShardWriter {
    dir: PathBuf,
    split: Split,
    dtype: TokenDtype,
    max_tokens: usize,
    shards: Vec<ShardInfo>,
    open: Option<OpenShard>,
    /// Encoding buffer, reused.
    buf: Vec<u8>,
    cur_offsets: Vec<u64>,
    cur_count: usize,
    documents: usize,
    tokens: usize,
}

struct OpenShard {
    path: PathBuf,
    file: std::io::BufWriter<std::fs::File>,
    hash: Sha256,
}

impl ShardWriter {
    fn new(dir: &Path, split: Split, dtype: TokenDtype, max_tokens: usize) -> Self {
        Self {
            dir: dir.to_path_buf(),
            split,
            dtype,
            max_tokens: max_tokens.max(1),
            shards: Vec::new(),
            open: None,
            buf: Vec::new(),
            cur_offsets: vec![0],
            cur_count: 0,
            documents: 0,
            tokens: 0,
        }
    }

    fn file_names(&self) -> (String, String) {
        let n = self.shards.len();
        (format!("{}-{n:05}.tokens", self.split.as_str()), format!("{}-{n:05}.index", self.split.as_str()))
    }

    /// Starts a document of `len` tokens, in a new shard when it would overfill this one. A
    /// shard holds at most `max_tokens` documents too, so that empty documents (a run of
    /// separators in an imported stream) cannot grow its index without bound.
    fn begin_document(&mut self, len: usize) -> Result<()> {
        let docs = self.cur_offsets.len() - 1;
        if (self.cur_count > 0 && self.cur_count.saturating_add(len) > self.max_tokens) || docs >= self.max_tokens {
            self.flush()?;
        }
        Ok(())
    }

    /// Appends tokens to the current document (ids already checked against the vocabulary).
    fn write_tokens(&mut self, toks: &[u32]) -> Result<()> {
        if self.open.is_none() {
            let path = self.dir.join(self.file_names().0);
            let f = std::fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
            self.open =
                Some(OpenShard { path, file: std::io::BufWriter::with_capacity(1 << 20, f), hash: Sha256::new() });
        }
        self.buf.clear();
        match self.dtype {
            TokenDtype::U16 => toks.iter().for_each(|&t| self.buf.extend_from_slice(&(t as u16).to_le_bytes())),
            TokenDtype::U32 => toks.iter().for_each(|&t| self.buf.extend_from_slice(&t.to_le_bytes())),
        }
        let open = self.open.as_mut().expect("opened above");
        open.file.write_all(&self.buf).with_context(|| format!("cannot write {} (disk full?)", open.path.display()))?;
        open.hash.update(&self.buf);
        self.cur_count += toks.len();
        self.tokens += toks.len();
        Ok(())
    }

    fn end_document(&mut self) {
        self.cur_offsets.push(self.cur_count as u64);
        self.documents += 1;
    }

    fn push(&mut self, doc: &[u32]) -> Result<()> {
        self.begin_document(doc.len())?;
        self.write_tokens(doc)?;
        self.end_document();
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        let docs = self.cur_offsets.len() - 1;
        if docs == 0 {
            return Ok(());
        }
        let (tokens_file, index_file) = self.file_names();
        let tokens_sha256 = match self.open.take() {
            Some(OpenShard { path, file, hash }) => {
                let f = file
                    .into_inner()
                    .map_err(|e| anyhow!("cannot write {} (disk full?): {}", path.display(), e.error()))?;
                f.sync_all().with_context(|| format!("cannot write {}", path.display()))?;
                hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
            }
            // Only empty documents: an empty tokens file.
            None => {
                write_file(&self.dir.join(&tokens_file), &[])?;
                sha256_hex(&[])
            }
        };
        let index: Vec<u8> = self.cur_offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
        write_file(&self.dir.join(&index_file), &index)?;
        self.shards.push(ShardInfo {
            tokens_file,
            index_file,
            documents: docs,
            tokens: self.cur_count,
            tokens_sha256,
            index_sha256: sha256_hex(&index),
        });
        self.cur_offsets = vec![0];
        self.cur_count = 0;
        Ok(())
    }

    fn finish(mut self) -> Result<SplitInfo> {
        self.flush()?;
        Ok(SplitInfo { documents: self.documents, tokens: self.tokens, row_tokens: None, shards: self.shards })
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(bytes).with_context(|| format!("cannot write {} (disk full?)", path.display()))?;
    f.sync_all().with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// One unit of input read from disk: a whole file, or one `.jsonl` line.
enum RawDoc {
    Text(String),
    Skip,
}

/// Reads inputs in order and yields batches of documents of about `batch_bytes` bytes.
struct DocReader {
    files: std::vec::IntoIter<PathBuf>,
    jsonl: Option<(PathBuf, std::io::BufReader<std::fs::File>, usize)>,
}

impl DocReader {
    /// The next document, with the number of input bytes it consumed; None at the end.
    fn next(&mut self) -> Result<Option<(RawDoc, u64)>> {
        loop {
            if let Some((path, reader, line_no)) = &mut self.jsonl {
                let mut raw = Vec::new();
                let n =
                    reader.read_until(b'\n', &mut raw).with_context(|| format!("cannot read {}", path.display()))?;
                if n == 0 {
                    self.jsonl = None;
                    continue;
                }
                *line_no += 1;
                let line = crate::validate::text_from_bytes(raw, Path::new(&format!("{}:{line_no}", path.display())))?;
                let trimmed = line.trim();
                if trimmed.is_empty() {
                    return Ok(Some((RawDoc::Skip, n as u64)));
                }
                let v: serde_json::Value = serde_json::from_str(trimmed)
                    .with_context(|| format!("{}:{}: not a JSON object", path.display(), line_no))?;
                let text = v
                    .get("text")
                    .and_then(|t| t.as_str())
                    .ok_or_else(|| anyhow!("{}:{}: no string field \"text\"", path.display(), line_no))?;
                return Ok(Some((RawDoc::Text(text.to_string()), n as u64)));
            }
            let Some(path) = self.files.next() else { return Ok(None) };
            if path.extension().is_some_and(|e| e == "jsonl") {
                let f = std::fs::File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
                self.jsonl = Some((path, std::io::BufReader::new(f), 0));
                continue;
            }
            let bytes = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
            let n = bytes.len() as u64;
            let text = crate::validate::text_from_bytes(bytes, &path)?;
            return Ok(Some((RawDoc::Text(text), n)));
        }
    }
}

/// Creates the output folder of `data prepare` / `data import`; an existing dataset there is
/// an error unless `overwrite`.
fn create_output(out: &Path, overwrite: bool) -> Result<()> {
    if out.join(MANIFEST_FILE).exists() && !overwrite {
        bail!("{} already holds a dataset (pass --overwrite to replace it)", out.display());
    }
    if out.exists() && !out.is_dir() {
        bail!("{}: exists and is not a folder", out.display());
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    if overwrite {
        // Remove the old manifest first so a failure below never leaves a stale one describing
        // new shards; old shards of the same names are overwritten.
        let _ = std::fs::remove_file(out.join(MANIFEST_FILE));
    }
    Ok(())
}

/// Tokenizes `inputs` into a dataset in `out` (see the module docs); returns its manifest.
pub fn prepare(inputs: &[PathBuf], out: &Path, opts: &PrepareOptions) -> Result<Manifest> {
    if inputs.is_empty() {
        bail!("no input given: name text files, .jsonl files or folders with --input");
    }
    if !(0.0..1.0).contains(&opts.val_fraction) {
        bail!("--val-fraction must be in [0, 1), got {}", opts.val_fraction);
    }
    if opts.globs.is_empty() && opts.val_by != ValBy::Document {
        bail!("--val-by {} needs --glob: it holds out folders of the files that --glob selects", opts.val_by.as_str());
    }
    if opts.globs.is_empty() && opts.max_file_bytes.is_some() {
        bail!("--max-file-bytes needs --glob (it skips files of the tree that --glob selects)");
    }
    // Everything that can fail on the inputs fails before the output folder is touched.
    let source = if opts.globs.is_empty() {
        let files = list_inputs(inputs)?;
        if files.is_empty() {
            bail!(
                "no files found in {}",
                inputs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
            );
        }
        Source::Files(files)
    } else {
        let patterns = opts.globs.iter().map(|g| pattern::Glob::new(g)).collect::<Result<Vec<_>>>()?;
        let files = list_tree(inputs, &patterns)?;
        if files.is_empty() {
            bail!(
                "no file in {} matches --glob {}",
                inputs.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
                opts.globs.join(" --glob ")
            );
        }
        Source::Tree(files)
    };
    create_output(out, opts.overwrite)?;
    let tok = Tokenizer::gpt2(opts.text_format)?;
    let vocab = GPT2_VOCAB;
    let dtype = TokenDtype::for_vocab(vocab);
    let mut w = Writers {
        train: ShardWriter::new(out, Split::Train, dtype, opts.shard_tokens),
        val: ShardWriter::new(out, Split::Val, dtype, opts.shard_tokens),
    };
    let mut manifest = Manifest {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        tokenizer: "gpt2".into(),
        text_format: opts.text_format,
        vocab_size: vocab,
        dtype,
        val_fraction: opts.val_fraction,
        sources: inputs.iter().map(|p| p.display().to_string()).collect(),
        skipped_empty: 0,
        globs: opts.globs.clone(),
        val_by: opts.val_by,
        tree: None,
        import: None,
        train: SplitInfo { documents: 0, tokens: 0, row_tokens: None, shards: vec![] },
        val: SplitInfo { documents: 0, tokens: 0, row_tokens: None, shards: vec![] },
    };
    match source {
        Source::Files(files) => manifest.skipped_empty = tokenize_files(files, &tok, opts, &mut w)?,
        Source::Tree(files) => {
            let stats = tokenize_tree(&files, &tok, opts, &mut w)?;
            manifest.skipped_empty = stats.empty;
            write_file(&out.join(FILES_LIST), &stats.listing)?;
            manifest.tree = Some(stats.summary);
        }
    }
    manifest.train = w.train.finish()?;
    manifest.val = w.val.finish()?;
    if manifest.train.tokens == 0 {
        bail!(
            "the inputs hold no text for training ({} non-empty documents, {} of them held out; {} empty): \
             nothing to train on",
            manifest.train.documents + manifest.val.documents,
            manifest.val.documents,
            manifest.skipped_empty
        );
    }
    let json = serde_json::to_string_pretty(&manifest).expect("manifest serialises");
    crate::checkpoint::write_atomic(&out.join(MANIFEST_FILE), json.as_bytes())?;
    Ok(manifest)
}

enum Source {
    Files(Vec<PathBuf>),
    Tree(Vec<TreeFile>),
}

struct Writers {
    train: ShardWriter,
    val: ShardWriter,
}

fn progress_bar(show: bool, total_bytes: u64, what: &str) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(total_bytes);
    pb.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{what} {{bar:30}} {{bytes}}/{{total_bytes}} {{bytes_per_sec}} ETA {{eta}} {{msg}}"
        ))
        .expect("template"),
    );
    pb
}

/// The classic mode: every file (or .jsonl line) is a document, in input order; documents are
/// held out evenly spaced. Returns the number of empty documents skipped.
fn tokenize_files(files: Vec<PathBuf>, tok: &Tokenizer, opts: &PrepareOptions, w: &mut Writers) -> Result<usize> {
    let total_bytes: u64 = files.iter().map(|f| f.metadata().map(|m| m.len()).unwrap_or(0)).sum();
    let pb = progress_bar(opts.progress, total_bytes, "tokenizing");
    let mut reader = DocReader { files: files.into_iter(), jsonl: None };
    let mut doc_index = 0usize;
    let mut skipped = 0usize;
    // Read a batch of documents (~16 MiB of text), tokenize them on all cores, write them in order.
    const BATCH_BYTES: u64 = 16 << 20;
    loop {
        let mut batch: Vec<(RawDoc, u64)> = Vec::new();
        let mut bytes = 0;
        while bytes < BATCH_BYTES {
            match reader.next()? {
                Some((d, n)) => {
                    bytes += n;
                    batch.push((d, n));
                }
                None => break,
            }
        }
        if batch.is_empty() {
            break;
        }
        let encoded: Vec<(Option<Vec<u32>>, u64)> = batch
            .into_par_iter()
            .map(|(d, n)| match d {
                RawDoc::Text(t) => (Some(tok.encode(&t, false)), n),
                RawDoc::Skip => (None, n),
            })
            .collect();
        for (ids, n) in encoded {
            pb.inc(n);
            let Some(ids) = ids else { continue };
            if ids.is_empty() {
                skipped += 1;
                continue;
            }
            if is_val_document(doc_index, opts.val_fraction) {
                w.val.push(&ids)?;
            } else {
                w.train.push(&ids)?;
            }
            doc_index += 1;
        }
        pb.set_message(format!("{} documents", doc_index));
    }
    pb.finish_and_clear();
    Ok(skipped)
}

// ---------------------------------------------------------------------------------------------
// File-tree mode (`--glob`): source trees tokenized in place.

/// The listing of a tree-mode dataset: one JSON line per file that matched, in input order.
pub const FILES_LIST: &str = "files.jsonl";

/// How the validation split is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ValBy {
    /// Single documents, evenly spaced in input order.
    #[default]
    Document,
    /// Whole folders: a file's folder (relative to its --input) goes to one split with all its files.
    Dir,
    /// Whole top-level entries of each --input folder (packages of site-packages): a file goes
    /// with everything under the same first path component (a file at the top is its own entry).
    Top,
}

impl ValBy {
    pub fn as_str(self) -> &'static str {
        match self {
            ValBy::Document => "document",
            ValBy::Dir => "dir",
            ValBy::Top => "top",
        }
    }
    fn is_document(&self) -> bool {
        *self == ValBy::Document
    }
}

/// What `--glob` found and did, in the manifest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TreeSummary {
    /// Files that matched a pattern.
    pub files: usize,
    pub bytes: u64,
    /// Files skipped because they are not valid UTF-8 (binary or another encoding).
    pub skipped_not_utf8: usize,
    /// Files that could not be read (permissions, vanished).
    pub skipped_unreadable: usize,
    /// Files larger than --max-file-bytes.
    pub skipped_too_large: usize,
    /// Files whose bytes equal an earlier file's (the first in input order is kept).
    pub duplicates: usize,
    /// Held-out groups (folders, or top-level entries) and all groups, with --val-by dir|top.
    pub val_groups: usize,
    pub groups: usize,
    /// Bytes of the kept (unique, valid) files in each split.
    pub train_bytes: u64,
    pub val_bytes: u64,
}

/// A file of a tree: which --input it is under and its path relative to it ('/'-separated).
struct TreeFile {
    input: usize,
    rel: String,
    path: PathBuf,
}

/// Files under each input folder whose relative path matches one of `patterns`; per input, in
/// natural order of the path components. Hidden entries and symbolic links to folders are
/// skipped (links can loop, and point at trees listed elsewhere).
fn list_tree(inputs: &[PathBuf], patterns: &[pattern::Glob]) -> Result<Vec<TreeFile>> {
    fn walk(dir: &Path, rel: &str, input: usize, patterns: &[pattern::Glob], out: &mut Vec<TreeFile>) -> Result<()> {
        let mut entries: Vec<(String, PathBuf, std::fs::FileType)> = Vec::new();
        for e in std::fs::read_dir(dir).with_context(|| format!("cannot read folder {}", dir.display()))? {
            let e = e.with_context(|| format!("cannot read folder {}", dir.display()))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let ft = e.file_type().with_context(|| format!("cannot stat {}", e.path().display()))?;
            entries.push((name, e.path(), ft));
        }
        entries.sort_by_cached_key(|(n, _, _)| (natural_key(n), n.clone()));
        for (name, path, ft) in entries {
            let r = if rel.is_empty() { name } else { format!("{rel}/{name}") };
            let is_file = if ft.is_symlink() {
                // A link to a file counts as that file; a link to a folder is not followed.
                std::fs::metadata(&path).map(|m| m.is_file()).unwrap_or(false)
            } else {
                ft.is_file()
            };
            if ft.is_dir() {
                walk(&path, &r, input, patterns, out)?;
            } else if is_file && patterns.iter().any(|p| p.matches(&r)) {
                out.push(TreeFile { input, rel: r, path });
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    for (i, p) in inputs.iter().enumerate() {
        if !p.is_dir() {
            bail!("{}: --glob needs folders as --input (patterns are relative to each folder)", p.display());
        }
        walk(p, "", i, patterns, &mut out)?;
    }
    Ok(out)
}

/// What became of one file of the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileStatus {
    Keep,
    Empty,
    NotUtf8,
    Unreadable,
    TooLarge,
    /// Same bytes as the file with this index.
    Duplicate(usize),
}

/// The first pass over a file: its size and status, and the SHA-256 of its bytes when kept.
fn scan_file(f: &TreeFile, max_bytes: Option<u64>) -> (u64, FileStatus, [u8; 32]) {
    let none = [0u8; 32];
    if let Some(max) = max_bytes {
        if let Ok(m) = std::fs::metadata(&f.path) {
            if m.len() > max {
                return (m.len(), FileStatus::TooLarge, none);
            }
        }
    }
    let Ok(bytes) = std::fs::read(&f.path) else { return (0, FileStatus::Unreadable, none) };
    let n = bytes.len() as u64;
    if max_bytes.is_some_and(|max| n > max) {
        return (n, FileStatus::TooLarge, none);
    }
    if bytes.is_empty() {
        return (0, FileStatus::Empty, none);
    }
    if std::str::from_utf8(&bytes).is_err() {
        return (n, FileStatus::NotUtf8, none);
    }
    (n, FileStatus::Keep, Sha256::digest(&bytes).into())
}

/// The hold-out group of a file (see [`ValBy`]).
fn group_of(rel: &str, by: ValBy) -> &str {
    match by {
        ValBy::Document => rel,
        ValBy::Dir => rel.rsplit_once('/').map_or("", |(d, _)| d),
        ValBy::Top => rel.split_once('/').map_or(rel, |(t, _)| t),
    }
}

/// Chooses held-out groups: groups in the order of the SHA-256 of their name (a fixed
/// pseudo-random order that depends on nothing but the names), each taken while the held-out
/// bytes stay within `fraction` of all bytes; when none fits, the smallest group. Returns the
/// chosen group names.
fn choose_val_groups(
    sizes: &std::collections::BTreeMap<&str, u64>,
    fraction: f64,
) -> std::collections::HashSet<String> {
    let total: u64 = sizes.values().sum();
    let target = (total as f64 * fraction).floor() as u64;
    let mut order: Vec<(&str, u64)> = sizes.iter().map(|(k, v)| (*k, *v)).collect();
    order.sort_by_cached_key(|(k, _)| (Sha256::digest(k.as_bytes()), k.to_string()));
    let mut held = 0u64;
    let mut chosen = std::collections::HashSet::new();
    for &(k, n) in &order {
        if held + n <= target {
            held += n;
            chosen.insert(k.to_string());
        }
    }
    if chosen.is_empty() && fraction > 0.0 && order.len() > 1 {
        // Every group is larger than the target: hold out the smallest (first in hash order on ties).
        let &(k, _) = order.iter().min_by_key(|(_, n)| *n).expect("at least two groups");
        chosen.insert(k.to_string());
    }
    chosen
}

struct TreeStats {
    empty: usize,
    summary: TreeSummary,
    listing: Vec<u8>,
}

/// Tree mode: scan every file on all cores (size, UTF-8, hash), drop duplicates and invalid
/// files, choose the split, then tokenize the kept files on all cores in batches, writing them
/// in input order. Nothing depends on thread scheduling: every decision is made in input order.
fn tokenize_tree(files: &[TreeFile], tok: &Tokenizer, opts: &PrepareOptions, w: &mut Writers) -> Result<TreeStats> {
    let total_bytes: u64 = files.iter().map(|f| std::fs::metadata(&f.path).map(|m| m.len()).unwrap_or(0)).sum();
    let pb = progress_bar(opts.progress, total_bytes, "reading   ");
    pb.set_message(format!("{} files", files.len()));
    let scanned: Vec<(u64, FileStatus, [u8; 32])> = files
        .par_iter()
        .map(|f| {
            let r = scan_file(f, opts.max_file_bytes);
            pb.inc(r.0);
            r
        })
        .collect();
    pb.finish_and_clear();

    let mut status: Vec<FileStatus> = scanned.iter().map(|s| s.1).collect();
    let mut first: std::collections::HashMap<[u8; 32], usize> = std::collections::HashMap::new();
    for (i, (_, st, hash)) in scanned.iter().enumerate() {
        if *st == FileStatus::Keep {
            if let Some(&j) = first.get(hash) {
                status[i] = FileStatus::Duplicate(j);
            } else {
                first.insert(*hash, i);
            }
        }
    }
    let kept: Vec<usize> = (0..files.len()).filter(|&i| status[i] == FileStatus::Keep).collect();

    // The split: per kept file, whether it is held out.
    let mut summary =
        TreeSummary { files: files.len(), bytes: scanned.iter().map(|s| s.0).sum(), ..Default::default() };
    let held: Vec<bool> = if opts.val_by.is_document() {
        (0..kept.len()).map(|k| is_val_document(k, opts.val_fraction)).collect()
    } else {
        let mut sizes = std::collections::BTreeMap::new();
        for &i in &kept {
            *sizes.entry(group_of(&files[i].rel, opts.val_by)).or_insert(0u64) += scanned[i].0;
        }
        let chosen = choose_val_groups(&sizes, opts.val_fraction);
        summary.groups = sizes.len();
        summary.val_groups = chosen.len();
        kept.iter().map(|&i| chosen.contains(group_of(&files[i].rel, opts.val_by))).collect()
    };

    // Tokenize the kept files in batches of about 64 MiB, in order.
    let kept_bytes: u64 = kept.iter().map(|&i| scanned[i].0).sum();
    let pb = progress_bar(opts.progress, kept_bytes, "tokenizing");
    let mut tokens = vec![0usize; files.len()];
    let mut start = 0;
    const BATCH_BYTES: u64 = 64 << 20;
    while start < kept.len() {
        let mut end = start;
        let mut bytes = 0;
        while end < kept.len() && (end == start || bytes < BATCH_BYTES) {
            bytes += scanned[kept[end]].0;
            end += 1;
        }
        let encoded: Vec<Result<Vec<u32>>> = kept[start..end]
            .par_iter()
            .map(|&i| {
                let f = &files[i];
                let bytes = std::fs::read(&f.path).with_context(|| format!("cannot read {}", f.path.display()))?;
                let text = String::from_utf8(bytes)
                    .map_err(|_| anyhow!("{}: changed while being read (no longer UTF-8)", f.path.display()))?;
                let ids = tok.encode(&text, false);
                pb.inc(text.len() as u64);
                Ok(ids)
            })
            .collect();
        for (k, ids) in (start..end).zip(encoded) {
            let ids = ids?;
            let i = kept[k];
            tokens[i] = ids.len();
            if held[k] {
                summary.val_bytes += scanned[i].0;
                w.val.push(&ids)?;
            } else {
                summary.train_bytes += scanned[i].0;
                w.train.push(&ids)?;
            }
        }
        pb.set_message(format!("{end}/{} files", kept.len()));
        start = end;
    }
    pb.finish_and_clear();

    let mut listing = Vec::new();
    let mut k = 0;
    let mut empty = 0;
    for (i, f) in files.iter().enumerate() {
        let mut row = serde_json::json!({"input": f.input, "path": f.rel, "bytes": scanned[i].0});
        let what = match status[i] {
            FileStatus::Keep => {
                row["tokens"] = tokens[i].into();
                k += 1;
                if held[k - 1] {
                    "val"
                } else {
                    "train"
                }
            }
            FileStatus::Empty => {
                empty += 1;
                "empty"
            }
            FileStatus::NotUtf8 => {
                summary.skipped_not_utf8 += 1;
                "not-utf8"
            }
            FileStatus::Unreadable => {
                summary.skipped_unreadable += 1;
                "unreadable"
            }
            FileStatus::TooLarge => {
                summary.skipped_too_large += 1;
                "too-large"
            }
            FileStatus::Duplicate(j) => {
                summary.duplicates += 1;
                row["duplicate_of"] = files[j].rel.clone().into();
                "duplicate"
            }
        };
        row["status"] = what.into();
        listing.extend_from_slice(row.to_string().as_bytes());
        listing.push(b'\n');
    }
    Ok(TreeStats { empty, summary, listing })
}

/// Shell-style patterns over '/'-separated relative paths: `*` (any characters but '/'), `?`
/// (one character), `[abc]`, `[a-z]`, `[!abc]`, `**` as a whole component (any number of
/// folders, none included) and `{a,b}` alternatives. A pattern without '/' matches the file name
/// at any depth (as in .gitignore): `*.py` is `**/*.py`.
pub mod pattern {
    use anyhow::{bail, Result};

    #[derive(Clone, Debug)]
    pub struct Glob {
        /// One alternative per `{…}` expansion, each a list of path components.
        alternatives: Vec<Vec<String>>,
    }

    impl Glob {
        pub fn new(pattern: &str) -> Result<Glob> {
            let p = pattern.trim_start_matches("./");
            if p.is_empty() {
                bail!("--glob {pattern:?}: empty pattern");
            }
            if p.starts_with('/') {
                bail!("--glob {pattern:?}: patterns are relative to each --input folder; drop the leading '/'");
            }
            let mut alternatives = vec![];
            for alt in expand_braces(p).map_err(|e| anyhow::anyhow!("--glob {pattern:?}: {e}"))? {
                let mut parts: Vec<String> = alt.split('/').filter(|s| !s.is_empty()).map(String::from).collect();
                if !alt.contains('/') {
                    parts.insert(0, "**".into());
                }
                for part in &parts {
                    check_classes(part).map_err(|e| anyhow::anyhow!("--glob {pattern:?}: {e}"))?;
                }
                alternatives.push(parts);
            }
            Ok(Glob { alternatives })
        }

        /// Whether a '/'-separated relative path matches.
        pub fn matches(&self, rel: &str) -> bool {
            let comps: Vec<&str> = rel.split('/').filter(|s| !s.is_empty()).collect();
            self.alternatives.iter().any(|parts| match_parts(parts, &comps))
        }
    }

    /// `a{b,c}d{e,f}` → abde, abdf, acde, acdf (nested braces allowed).
    fn expand_braces(p: &str) -> std::result::Result<Vec<String>, String> {
        let chars: Vec<char> = p.chars().collect();
        let Some(open) = chars.iter().position(|&c| c == '{') else {
            if p.contains('}') {
                return Err("'}' without '{'".into());
            }
            return Ok(vec![p.to_string()]);
        };
        // The matching close brace, and the top-level commas between.
        let (mut depth, mut close, mut commas) = (0usize, None, vec![]);
        for (i, &c) in chars.iter().enumerate().skip(open) {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(i);
                        break;
                    }
                }
                ',' if depth == 1 => commas.push(i),
                _ => {}
            }
        }
        let Some(close) = close else { return Err("'{' without '}'".into()) };
        let head: String = chars[..open].iter().collect();
        let tail: String = chars[close + 1..].iter().collect();
        let mut bounds = vec![open];
        bounds.extend(&commas);
        bounds.push(close);
        let mut out = vec![];
        for w in bounds.windows(2) {
            let mid: String = chars[w[0] + 1..w[1]].iter().collect();
            for e in expand_braces(&format!("{head}{mid}{tail}"))? {
                out.push(e);
            }
        }
        Ok(out)
    }

    fn check_classes(part: &str) -> std::result::Result<(), String> {
        let chars: Vec<char> = part.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            if chars[i] == '[' {
                match class_end(&chars, i) {
                    Some(e) => i = e,
                    None => return Err(format!("'[' without ']' in {part:?}")),
                }
            }
            i += 1;
        }
        Ok(())
    }

    /// Index of the ']' closing the class opened at `open` (a ']' right after '[' or '[!' is a member).
    fn class_end(chars: &[char], open: usize) -> Option<usize> {
        let mut i = open + 1;
        if i < chars.len() && (chars[i] == '!' || chars[i] == '^') {
            i += 1;
        }
        if i < chars.len() && chars[i] == ']' {
            i += 1;
        }
        (i..chars.len()).find(|&j| chars[j] == ']')
    }

    fn match_parts(parts: &[String], comps: &[&str]) -> bool {
        match parts.first() {
            None => comps.is_empty(),
            Some(p) if p == "**" => (0..=comps.len()).any(|k| match_parts(&parts[1..], &comps[k..])),
            Some(p) => !comps.is_empty() && match_component(p, comps[0]) && match_parts(&parts[1..], &comps[1..]),
        }
    }

    /// One path component against one pattern component (no '/' in either).
    fn match_component(pat: &str, name: &str) -> bool {
        let p: Vec<char> = pat.chars().collect();
        let s: Vec<char> = name.chars().collect();
        // Iterative matcher with one backtrack point for the last '*'.
        let (mut pi, mut si) = (0, 0);
        let mut star: Option<(usize, usize)> = None;
        while si < s.len() {
            let step = if pi < p.len() {
                match p[pi] {
                    '*' => {
                        star = Some((pi, si));
                        pi += 1;
                        continue;
                    }
                    '?' => Some(pi + 1),
                    '[' => match class_end(&p, pi) {
                        Some(end) if class_matches(&p[pi + 1..end], s[si]) => Some(end + 1),
                        Some(_) => None,
                        None => (p[pi] == s[si]).then_some(pi + 1),
                    },
                    c => (c == s[si]).then_some(pi + 1),
                }
            } else {
                None
            };
            match (step, star) {
                (Some(next), _) => {
                    pi = next;
                    si += 1;
                }
                (None, Some((sp, ss))) => {
                    pi = sp + 1;
                    si = ss + 1;
                    star = Some((sp, ss + 1));
                }
                (None, None) => return false,
            }
        }
        p[pi..].iter().all(|&c| c == '*')
    }

    fn class_matches(class: &[char], c: char) -> bool {
        let (neg, body) = match class.first() {
            Some('!') | Some('^') => (true, &class[1..]),
            _ => (false, class),
        };
        let mut hit = false;
        let mut i = 0;
        while i < body.len() {
            if i + 2 < body.len() && body[i + 1] == '-' {
                hit |= body[i] <= c && c <= body[i + 2];
                i += 3;
            } else {
                hit |= body[i] == c;
                i += 1;
            }
        }
        hit != neg
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn patterns() {
            let g = |p: &str| Glob::new(p).unwrap();
            assert!(g("*.py").matches("a.py") && g("*.py").matches("pkg/sub/a.py"));
            assert!(!g("*.py").matches("a.pyc") && !g("*.py").matches("a.py/x"));
            assert!(g("**/*.py").matches("a.py") && g("**/*.py").matches("x/y/a.py"));
            assert!(g("pkg/*.py").matches("pkg/a.py") && !g("pkg/*.py").matches("pkg/sub/a.py"));
            assert!(g("pkg/**/a.py").matches("pkg/a.py") && g("pkg/**/a.py").matches("pkg/x/y/a.py"));
            assert!(g("**/*.{c,h,cpp}").matches("src/x.cpp") && g("*.{c,h}").matches("x.h"));
            assert!(!g("*.{c,h}").matches("x.cc"));
            assert!(g("a?c.[ch]").matches("abc.c") && !g("a?c.[ch]").matches("abc.o"));
            assert!(g("[!_]*.py").matches("a.py") && !g("[!_]*.py").matches("__init__.py"));
            assert!(g("[a-c]*").matches("b1") && !g("[a-c]*").matches("d1"));
            assert!(g("*a*b*").matches("xxaybzz") && !g("*a*b*").matches("xxbya"));
            assert!(g("./*.rs").matches("src/lib.rs"));
            for bad in ["", "/abs/*.py", "*.{c,h", "x}", "[ab"] {
                assert!(Glob::new(bad).is_err(), "{bad:?}");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Training windows.

/// Where the loader stands; saved in checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoaderState {
    pub seed: u64,
    pub epoch: u64,
    /// Windows of this epoch already handed out.
    pub index: u64,
}

/// A batch of windows: ids and targets [batch, seq] row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub batch: usize,
    pub seq: usize,
    pub ids: Vec<u32>,
    pub targets: Vec<Option<u32>>,
}

/// The epoch's plan: document order, where each starts in the stream, and window order.
struct Epoch {
    epoch: u64,
    docs: Vec<u32>,
    /// Stream start of docs[k] (each document is followed by one EOS).
    starts: Vec<u64>,
    windows: Vec<u32>,
}

/// Cuts a split into windows of `seq` tokens (see the module docs).
pub struct Loader<'a> {
    data: &'a Dataset,
    split: Split,
    seq: usize,
    shuffle: bool,
    state: LoaderState,
    plan: Option<Epoch>,
    stream_len: u64,
}

/// How many windows of `seq` tokens a split yields per epoch: of the stream `doc EOS doc EOS
/// ...`, or with rows (LongCrawl64) `row_tokens / seq` per row, the rest of each row dropped.
pub fn windows_per_epoch(data: &Dataset, split: Split, seq: usize) -> u64 {
    match data.manifest().split(split).row_tokens {
        Some(r) => data.num_documents(split) as u64 * (r / seq.max(1)) as u64,
        None => (data.num_tokens(split) + data.num_documents(split)) as u64 / seq.max(1) as u64,
    }
}

impl<'a> Loader<'a> {
    /// A loader of training windows, shuffled with `seed`. Fails when the split is shorter than
    /// one window.
    pub fn new(data: &'a Dataset, split: Split, seq: usize, seed: u64, shuffle: bool) -> Result<Self> {
        if seq < 2 {
            bail!("window length {seq} is too short (at least 2 tokens)");
        }
        if let Some(r) = data.manifest().split(split).row_tokens {
            if seq > r {
                bail!(
                    "{}: windows of {seq} tokens do not fit the {split} split's rows of {r} tokens (windows never cross rows, as \
                     in the LongCrawl64 authors' loader): use --context {r} or less",
                    data.dir().display()
                );
            }
        }
        let stream_len = (data.num_tokens(split) + data.num_documents(split)) as u64;
        let windows = windows_per_epoch(data, split, seq);
        if windows == 0 {
            bail!(
                "{}: the {split} split has {} tokens in {} documents, fewer than one window of {seq} tokens \
                 (use a shorter --context or more text)",
                data.dir().display(),
                data.num_tokens(split),
                data.num_documents(split)
            );
        }
        if windows > u32::MAX as u64 {
            bail!("{}: {windows} windows of {seq} tokens per epoch, more than foxlm can index", data.dir().display());
        }
        Ok(Self { data, split, seq, shuffle, state: LoaderState { seed, epoch: 0, index: 0 }, plan: None, stream_len })
    }

    pub fn state(&self) -> LoaderState {
        self.state
    }

    /// Continues from a saved position.
    pub fn set_state(&mut self, s: LoaderState) {
        self.state = s;
    }

    pub fn windows_per_epoch(&self) -> u64 {
        match self.data.manifest().split(self.split).row_tokens {
            Some(_) => windows_per_epoch(self.data, self.split, self.seq),
            None => self.stream_len / self.seq as u64,
        }
    }

    fn plan(&mut self) -> &Epoch {
        let epoch = self.state.epoch;
        if self.plan.as_ref().is_none_or(|p| p.epoch != epoch) {
            let n = self.data.num_documents(self.split);
            let mut docs: Vec<u32> = (0..n as u32).collect();
            let mut windows: Vec<u32> = (0..self.windows_per_epoch() as u32).collect();
            if self.shuffle {
                let mut rng = ChaCha8Rng::seed_from_u64(self.state.seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                docs.shuffle(&mut rng);
                windows.shuffle(&mut rng);
            }
            let mut starts = Vec::with_capacity(n);
            let mut pos = 0u64;
            for &d in &docs {
                starts.push(pos);
                pos += self.data.document_len(self.split, d as usize) as u64 + 1;
            }
            self.plan = Some(Epoch { epoch, docs, starts, windows });
        }
        self.plan.as_ref().unwrap()
    }

    /// The tokens of stream range [from, from + len) of the current epoch.
    fn stream(&mut self, from: u64, len: usize, out: &mut Vec<u32>) {
        let data = self.data;
        let split = self.split;
        let plan = self.plan();
        // The document containing `from`.
        let mut k = plan.starts.partition_point(|&s| s <= from) - 1;
        let mut pos = from;
        let end = from + len as u64;
        while pos < end {
            let d = plan.docs[k] as usize;
            let dlen = data.document_len(split, d) as u64;
            let off = pos - plan.starts[k];
            if off < dlen {
                let to = dlen.min(off + (end - pos));
                data.document_range_into(split, d, off as usize, to as usize, out);
                pos += to - off;
            } else {
                out.push(EOS_ID);
                pos += 1;
                k += 1;
            }
        }
    }

    /// The next window: BOS + `seq` stream tokens, `seq + 1` in all.
    pub fn next_window(&mut self) -> Vec<u32> {
        if self.state.index >= self.windows_per_epoch() {
            self.state.epoch += 1;
            self.state.index = 0;
        }
        let idx = self.state.index as usize;
        let w = self.plan().windows[idx] as u64;
        self.state.index += 1;
        let mut out = Vec::with_capacity(self.seq + 1);
        out.push(BOS_ID);
        match self.data.manifest().split(self.split).row_tokens {
            // Window w is the (w mod per_row)-th stretch of `seq` tokens of row w / per_row.
            Some(r) => {
                let per_row = (r / self.seq) as u64;
                let from = (w % per_row) as usize * self.seq;
                self.data.document_range_into(self.split, (w / per_row) as usize, from, from + self.seq, &mut out);
            }
            None => self.stream(w * self.seq as u64, self.seq, &mut out),
        }
        out
    }

    /// Passes over `n` windows as [`Loader::next_window`] would hand them out (another rank reads
    /// them in data-parallel training).
    pub fn skip(&mut self, n: u64) {
        let per_epoch = self.windows_per_epoch();
        let mut left = n;
        while left > 0 {
            if self.state.index >= per_epoch {
                self.state.epoch += 1;
                self.state.index = 0;
            }
            let take = left.min(per_epoch - self.state.index);
            self.state.index += take;
            left -= take;
        }
    }

    /// The next `batch` windows as ids (first `seq` tokens) and targets (last `seq`).
    pub fn next_batch(&mut self, batch: usize) -> Batch {
        let seq = self.seq;
        let mut ids = Vec::with_capacity(batch * seq);
        let mut targets = Vec::with_capacity(batch * seq);
        for _ in 0..batch {
            let w = self.next_window();
            ids.extend_from_slice(&w[..seq]);
            targets.extend(w[1..].iter().map(|&t| Some(t)));
        }
        Batch { batch, seq, ids, targets }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn val_selection_is_evenly_spaced_and_exact() {
        let picked: Vec<usize> = (0..100).filter(|&i| is_val_document(i, 0.1)).collect();
        assert_eq!(picked, vec![9, 19, 29, 39, 49, 59, 69, 79, 89, 99]);
        assert!(!(0..1000).any(|i| is_val_document(i, 0.0)));
        assert_eq!((0..138).filter(|&i| is_val_document(i, 0.05)).count(), 6);
    }

    #[test]
    fn natural_order() {
        let mut v = vec!["chapter_10.txt", "chapter_2.txt", "chapter_1.txt", "a.txt"];
        v.sort_by_cached_key(|s| natural_key(s));
        assert_eq!(v, vec!["a.txt", "chapter_1.txt", "chapter_2.txt", "chapter_10.txt"]);
    }
}
