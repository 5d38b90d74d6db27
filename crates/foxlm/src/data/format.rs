//! The on-disk layout of a prepared dataset: the manifest and its shard entries.

use super::import;
use super::tree::{TreeSummary, ValBy};
use crate::tokenizer::TextFormat;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

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
pub(super) fn sha256_hex(bytes: &[u8]) -> String {
    crate::hex::hex(&Sha256::digest(bytes))
}
