//! `foxlm data prepare|inspect`: tokenize text into memory-mapped shards, and summarise them.

use crate::data::{prepare, Dataset, PrepareOptions, Split, ValBy};
use crate::tokenizer::{TextFormat, Tokenizer};
use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Tokenize text files and folders (a file is a document; each line of a .jsonl file is one,
    /// its "text" field) into token shards with a manifest, split into train/validation by
    /// whole documents.
    Prepare(PrepareArgs),
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
                shard_tokens: p.shard_tokens,
                overwrite: p.overwrite,
                progress: !p.quiet,
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
            eprintln!(
                "wrote {}: train {} documents / {} tokens, val {} documents / {} tokens ({}, {:.1} s)",
                p.output.display(),
                m.train.documents,
                m.train.tokens,
                m.val.documents,
                m.val.tokens,
                m.text_format,
                t0.elapsed().as_secs_f64()
            );
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

fn parse_size(s: &str) -> std::result::Result<u64, String> {
    crate::validate::parse_bytes(s)
        .and_then(|b| u64::try_from(b).ok())
        .ok_or_else(|| format!("{s:?} is not a size in bytes (e.g. 1000000, 512K, 4M)"))
}
