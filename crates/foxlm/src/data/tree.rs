//! Tree mode of `data prepare` (`--glob`): source trees tokenized where they lie.

use super::glob;
use super::prepare::*;
use crate::tokenizer::Tokenizer;
use anyhow::{anyhow, bail, Context, Result};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

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
    pub(super) fn is_document(&self) -> bool {
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
pub(super) struct TreeFile {
    input: usize,
    rel: String,
    path: PathBuf,
}

/// Files under each input folder whose relative path matches one of `patterns`; per input, in
/// natural order of the path components. Hidden entries and symbolic links to folders are
/// skipped (links can loop, and point at trees listed elsewhere).
pub(super) fn list_tree(inputs: &[PathBuf], patterns: &[glob::Glob]) -> Result<Vec<TreeFile>> {
    fn walk(dir: &Path, rel: &str, input: usize, patterns: &[glob::Glob], out: &mut Vec<TreeFile>) -> Result<()> {
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

pub(super) struct TreeStats {
    pub(super) empty: usize,
    pub(super) summary: TreeSummary,
    pub(super) listing: Vec<u8>,
}

/// Tree mode: scan every file on all cores (size, UTF-8, hash), drop duplicates and invalid
/// files, choose the split, then tokenize the kept files on all cores in batches, writing them
/// in input order. Nothing depends on thread scheduling: every decision is made in input order.
pub(super) fn tokenize_tree(
    files: &[TreeFile],
    tok: &Tokenizer,
    opts: &PrepareOptions,
    w: &mut Writers,
) -> Result<TreeStats> {
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
