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

mod dataset;
mod format;
pub mod glob;
pub mod import;
mod loader;
mod npy;
mod prepare;
mod tree;

pub use dataset::Dataset;
pub use format::{Manifest, ShardInfo, Split, SplitInfo, TokenDtype, FORMAT_NAME, FORMAT_VERSION, MANIFEST_FILE};
pub use loader::{windows_per_epoch, Batch, Loader, LoaderState};
pub use prepare::{is_val_document, list_inputs, prepare, PrepareOptions};
pub use tree::{TreeSummary, ValBy, FILES_LIST};
