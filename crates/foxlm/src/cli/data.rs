//! `foxlm data prepare|inspect`: tokenize text into memory-mapped shards, and summarise them.

use crate::data::{prepare, Dataset, PrepareOptions, Split};
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
    /// Output folder (created; must not already hold a dataset unless --overwrite).
    #[arg(long)]
    pub output: PathBuf,
    /// json-escaped (how the released FoX models were trained) or plain GPT-2 BPE.
    #[arg(long, default_value = "json-escaped")]
    pub text_format: TextFormat,
    /// Fraction of documents held out for validation (evenly spaced in input order).
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
            };
            let m = prepare(&p.input, &p.output, &opts)?;
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
