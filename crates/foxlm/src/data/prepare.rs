//! `data prepare`: text files or `.jsonl` documents tokenized into shards.

use super::format::*;
use super::glob;
use super::tree::*;
use crate::tokenizer::{TextFormat, Tokenizer, GPT2_VOCAB};
use anyhow::{anyhow, bail, Context, Result};
use rayon::prelude::*;
use sha2::{Digest, Sha256};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

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
pub(super) fn natural_key(s: &str) -> Vec<(u8, u64, String)> {
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
pub(super) struct ShardWriter {
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
    pub(super) tokens: usize,
}

struct OpenShard {
    path: PathBuf,
    file: std::io::BufWriter<std::fs::File>,
    hash: Sha256,
}

impl ShardWriter {
    pub(super) fn new(dir: &Path, split: Split, dtype: TokenDtype, max_tokens: usize) -> Self {
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
    pub(super) fn begin_document(&mut self, len: usize) -> Result<()> {
        let docs = self.cur_offsets.len() - 1;
        if (self.cur_count > 0 && self.cur_count.saturating_add(len) > self.max_tokens) || docs >= self.max_tokens {
            self.flush()?;
        }
        Ok(())
    }

    /// Appends tokens to the current document (ids already checked against the vocabulary).
    pub(super) fn write_tokens(&mut self, toks: &[u32]) -> Result<()> {
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

    pub(super) fn end_document(&mut self) {
        self.cur_offsets.push(self.cur_count as u64);
        self.documents += 1;
    }

    pub(super) fn push(&mut self, doc: &[u32]) -> Result<()> {
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
                crate::hex::hex(&hash.finalize())
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

    pub(super) fn finish(mut self) -> Result<SplitInfo> {
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
pub(super) fn create_output(out: &Path, overwrite: bool) -> Result<()> {
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
        let patterns = opts.globs.iter().map(|g| glob::Glob::new(g)).collect::<Result<Vec<_>>>()?;
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
    crate::fsutil::write_atomic(&out.join(MANIFEST_FILE), json.as_bytes())?;
    Ok(manifest)
}

enum Source {
    Files(Vec<PathBuf>),
    Tree(Vec<TreeFile>),
}

pub(super) struct Writers {
    pub(super) train: ShardWriter,
    pub(super) val: ShardWriter,
}

pub(super) fn progress_bar(show: bool, total_bytes: u64, what: &str) -> indicatif::ProgressBar {
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
