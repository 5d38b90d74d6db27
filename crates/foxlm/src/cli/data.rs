//! `foxlm data prepare|import|inspect`: tokenize text into memory-mapped shards, import token
//! arrays others ship, and summarise a dataset.

use crate::data::import::{import, parse_tokens, ImportFormat, ImportOptions};
use crate::data::{prepare, Dataset, PrepareOptions, Split, ValBy};
use crate::tokenizer::{TextFormat, Tokenizer};
use anyhow::Result;
use std::path::PathBuf;

pub type Args = super::Subcommands<Command>;

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Tokenize text files and folders (a file is a document; each line of a .jsonl file is one,
    /// its "text" field) into token shards with a manifest, split into train/validation by
    /// whole documents.
    Prepare(PrepareArgs),
    /// Import pre-tokenized GPT-2 token arrays (nanoGPT .bin, NumPy .npy, LongCrawl64 rows) into
    /// a dataset, without re-tokenizing.
    #[command(after_help = IMPORT_EXAMPLES)]
    Import(ImportArgs),
    /// Summarise a prepared dataset: documents, tokens, shards, and the start of a document.
    Inspect(InspectArgs),
}

#[derive(clap::Args, Debug)]
pub struct PrepareArgs {
    /// Text files, .jsonl files or folders (walked recursively, in natural order); repeatable.
    #[arg(long, required = true, num_args = 1..)]
    pub input: Vec<PathBuf>,
    /// Tree mode: take only files whose path relative to an --input folder matches this pattern
    /// (`*`, `?`, `[a-z]`, `**` for any folders, `{a,b}`; without '/' it matches the file name at
    /// any depth), e.g. '**/*.py'; repeatable. Each matching file is one document; files that are
    /// not UTF-8 are skipped and counted, files with the bytes of an earlier one dropped, and
    /// files.jsonl lists every file's fate.
    #[arg(long = "glob", value_name = "PATTERN")]
    pub globs: Vec<String>,
    /// What is held out for validation: document (evenly spaced documents), dir (whole folders,
    /// with --glob) or top (whole top-level entries of each --input, e.g. packages, with --glob).
    /// Folders are chosen by a hash of their relative path until about --val-fraction of the bytes.
    #[arg(long, value_enum, default_value_t = ValBy::Document)]
    pub val_by: ValBy,
    /// With --glob: skip files larger than this many bytes (K/M/G suffixes), e.g. generated tables.
    #[arg(long, value_parser = parse_size)]
    pub max_file_bytes: Option<u64>,
    /// Output folder (created; must not already hold a dataset unless --overwrite).
    #[arg(long)]
    pub output: PathBuf,
    /// json-escaped (how the released FoX models were trained) or plain GPT-2 BPE.
    #[arg(long, default_value = "json-escaped")]
    pub text_format: TextFormat,
    /// Fraction held out for validation: of the documents (evenly spaced in input order), or with
    /// --val-by dir|top about this fraction of the bytes, in whole folders.
    #[arg(long, default_value_t = 0.05)]
    pub val_fraction: f64,
    #[command(flatten)]
    pub write: WriteFlags,
}

const IMPORT_EXAMPLES: &str = "Examples:
  foxlm data import --format bin16 --input train.bin --val val.bin --output runs/owt
      nanoGPT's OpenWebText: documents end at EOT (50256), which the loader puts back
  foxlm data import --format npy --input tokens.npy --val-fraction 0.01 --output runs/npy
  foxlm data import --format longcrawl64 --input train.npy --val heldout.npy \\
      --train-tokens 45Gi --val-tokens 2Gi --row-tokens 16384 --output runs/lc64
      the paper's 48B-token run: the first 16,384 tokens of the first 2,949,120 rows (what the
      authors' loader reads at 16k context), and 32,768 whole validation rows";

#[derive(clap::Args, Debug)]
pub struct ImportArgs {
    /// bin16 (flat little-endian uint16, nanoGPT's .bin), bin32 (flat uint32), npy (1-D: a
    /// stream like bin16; 2-D: one document per row), longcrawl64 (rows of 65,536 tokens: a
    /// [rows, 65536] .npy or flat uint16 of whole rows; training windows stay inside rows).
    #[arg(long, value_enum)]
    pub format: ImportFormat,
    /// Token files for training, read in order; repeatable.
    #[arg(long, required = true, num_args = 1..)]
    pub input: Vec<PathBuf>,
    /// Token files for validation; repeatable. Without them, --val-fraction of the documents of
    /// --input are held out (evenly spaced).
    #[arg(long, num_args = 1..)]
    pub val: Vec<PathBuf>,
    /// Without --val: the fraction of documents (rows) held out for validation [default: 0.05].
    #[arg(long)]
    pub val_fraction: Option<f64>,
    /// Keep only the first N training tokens (K/M/G/T = 2^10/2^20/2^30/2^40, e.g. 45Gi); with
    /// rows a whole number of rows. Reading stops there.
    #[arg(long, value_parser = parse_tokens, value_name = "N")]
    pub train_tokens: Option<u64>,
    /// Keep only the first N validation tokens (as --train-tokens).
    #[arg(long, value_parser = parse_tokens, value_name = "N")]
    pub val_tokens: Option<u64>,
    /// Flat inputs: the token id that ends each document (dropped; the loader puts an EOS back
    /// between documents), or "none": every file is one document.
    #[arg(long, default_value = "50256", value_parser = parse_separator, value_name = "ID|none")]
    pub separator: Separator,
    /// longcrawl64: keep only the first N tokens of every training row (e.g. 16384: what the
    /// authors' loader reads of each row at 16k context; then --train-tokens is a multiple of
    /// N). Validation rows stay whole, as the authors evaluate them [default: the whole row].
    #[arg(long, value_name = "N")]
    pub row_tokens: Option<usize>,
    /// longcrawl64: rotate every row by a random amount (numpy.roll semantics; ChaCha8 seeded by
    /// this and the row's index) before taking it. The release's rows are used as stored
    /// without it, as the authors' loader does.
    #[arg(long, value_name = "SEED")]
    pub roll_seed: Option<u64>,
    /// How the tokens' text was escaped before BPE (recorded for decoding) [default: plain;
    /// json-escaped for longcrawl64].
    #[arg(long)]
    pub text_format: Option<TextFormat>,
    /// Output folder (created; must not already hold a dataset unless --overwrite).
    #[arg(long)]
    pub output: PathBuf,
    #[command(flatten)]
    pub write: WriteFlags,
}

/// How `prepare` and `import` write a dataset: the same flags for both.
#[derive(clap::Args, Debug)]
pub struct WriteFlags {
    /// Most tokens per shard file.
    #[arg(long, default_value_t = 1 << 28)]
    pub shard_tokens: usize,
    /// Replace a dataset already in the output folder.
    #[arg(long)]
    pub overwrite: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// `--separator`: a token id, or none.
#[derive(Clone, Copy, Debug)]
pub struct Separator(pub Option<u32>);

fn parse_separator(s: &str) -> std::result::Result<Separator, String> {
    if s == "none" {
        return Ok(Separator(None));
    }
    s.parse::<u32>()
        .ok()
        .filter(|&id| (id as usize) < crate::tokenizer::GPT2_VOCAB)
        .map(|id| Separator(Some(id)))
        .ok_or_else(|| format!("{s:?} is not a GPT-2 token id (0 to 50256) or \"none\""))
}

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// Dataset folder made by `foxlm data prepare`.
    pub dir: PathBuf,
    /// Also print the first tokens of this training document, decoded.
    #[arg(long)]
    pub show: Option<usize>,
    /// How many tokens of it to print.
    #[arg(long, default_value_t = 64)]
    pub show_tokens: usize,
}

pub fn run(a: Args) -> Result<()> {
    match a.command {
        Command::Prepare(p) => {
            let t0 = std::time::Instant::now();
            let opts = PrepareOptions {
                text_format: p.text_format,
                val_fraction: p.val_fraction,
                shard_tokens: p.write.shard_tokens,
                overwrite: p.write.overwrite,
                progress: !p.write.quiet,
                globs: p.globs.clone(),
                val_by: p.val_by,
                max_file_bytes: p.max_file_bytes,
            };
            let m = prepare(&p.input, &p.output, &opts)?;
            if let Some(t) = &m.tree {
                eprintln!(
                    "{} files matched ({}): {} duplicates dropped; skipped {} not UTF-8, {} unreadable, {} too large, {} empty",
                    t.files,
                    crate::validate::human_bytes(t.bytes as u128),
                    t.duplicates,
                    t.skipped_not_utf8,
                    t.skipped_unreadable,
                    t.skipped_too_large,
                    m.skipped_empty
                );
                if m.val_by != ValBy::Document {
                    eprintln!(
                        "held out {} of {} groups (--val-by {}): {} of {} kept bytes; every file's split is in {}",
                        t.val_groups,
                        t.groups,
                        m.val_by.as_str(),
                        crate::validate::human_bytes(t.val_bytes as u128),
                        crate::validate::human_bytes(t.train_bytes as u128 + t.val_bytes as u128),
                        p.output.join(crate::data::FILES_LIST).display()
                    );
                }
            }
            report_written(&p.output, &m, t0);
            Ok(())
        }
        Command::Import(a) => {
            let t0 = std::time::Instant::now();
            let mut opts = ImportOptions::new(a.format);
            opts.val_fraction = a.val_fraction.unwrap_or(if a.val.is_empty() { 0.05 } else { 0.0 });
            opts.val = a.val;
            opts.train_tokens = a.train_tokens;
            opts.val_tokens = a.val_tokens;
            opts.separator = a.separator.0;
            opts.row_tokens = a.row_tokens;
            opts.roll_seed = a.roll_seed;
            opts.text_format = a.text_format.unwrap_or(opts.text_format);
            opts.shard_tokens = a.write.shard_tokens;
            opts.overwrite = a.write.overwrite;
            opts.progress = !a.write.quiet;
            let m = import(&a.input, &a.output, &opts)?;
            report_written(&a.output, &m, t0);
            Ok(())
        }
        Command::Inspect(i) => {
            let ds = Dataset::open(&i.dir)?;
            print!("{}", ds.summary());
            if let Some(d) = i.show {
                let n = ds.num_documents(Split::Train);
                if d >= n {
                    anyhow::bail!("--show {d}: the train split has {n} documents");
                }
                let doc = ds.document(Split::Train, d);
                let k = i.show_tokens.min(doc.len());
                let tok = Tokenizer::gpt2(ds.manifest().text_format)?;
                println!("train document {d}: {} tokens; the first {k}:", doc.len());
                println!("{:?}", &doc[..k]);
                println!("{}", tok.decode(&doc[..k]));
            }
            Ok(())
        }
    }
}

/// The one-line summary `data prepare` and `data import` print of the dataset they wrote.
fn report_written(out: &std::path::Path, m: &crate::data::Manifest, t0: std::time::Instant) {
    eprintln!(
        "wrote {}: train {} documents / {} tokens, val {} documents / {} tokens ({}, {:.1} s)",
        out.display(),
        m.train.documents,
        m.train.tokens,
        m.val.documents,
        m.val.tokens,
        m.text_format,
        t0.elapsed().as_secs_f64()
    );
}

fn parse_size(s: &str) -> std::result::Result<u64, String> {
    crate::validate::parse_bytes(s)
        .and_then(|b| u64::try_from(b).ok())
        .ok_or_else(|| format!("{s:?} is not a size in bytes (e.g. 1000000, 512K, 4M)"))
}
