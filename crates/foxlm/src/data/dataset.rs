//! [`Dataset`]: a prepared dataset, memory-mapped and checked.

use super::format::*;
use super::tree::ValBy;
use crate::tokenizer::GPT2_VOCAB;
use anyhow::{anyhow, bail, Context, Result};
use rayon::prelude::*;
use std::path::{Path, PathBuf};

struct Shard {
    tokens: memmap2::Mmap,
    /// Document start offsets, documents + 1 of them.
    offsets: Vec<u64>,
}

/// The file at `path` (`bytes`) has the manifest's sha256 (`want`); `what`: a shard or an index.
fn check_sha256(path: &Path, bytes: &[u8], want: &str, what: &str) -> Result<()> {
    let got = sha256_hex(bytes);
    if got != want {
        bail!("{}: checksum mismatch (sha256 {got}, manifest {want}): corrupt {what}", path.display());
    }
    Ok(())
}

/// A prepared dataset, memory-mapped.
pub struct Dataset {
    dir: PathBuf,
    manifest: Manifest,
    /// Per split: shards and the cumulative document count before each.
    splits: [(Vec<Shard>, Vec<usize>); 2],
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

pub(super) fn map_file(path: &Path) -> Result<memmap2::Mmap> {
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
            check_sha256(&tpath, &tokens, &sh.tokens_sha256, "shard")?;
            check_sha256(&ipath, &index, &sh.index_sha256, "index")?;
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
