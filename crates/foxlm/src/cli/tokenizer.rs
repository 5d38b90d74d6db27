//! `foxlm tokenizer export DIR`: adds tokenizer.json and tokenizer_config.json to a model folder
//! (e.g. the authors' released checkpoints), so Hugging Face tools tokenize as foxlm does, offline.

use crate::checkpoint::CONFIG_FILE;
use crate::config::Config;
use crate::tokenizer::{TextFormat, GPT2_VOCAB};
use crate::tokenizer_export::{write_tokenizer_files, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE};
use anyhow::{bail, Result};
use std::path::PathBuf;

pub type Args = super::Subcommands<What>;

#[derive(clap::Subcommand, Debug)]
pub enum What {
    /// Write tokenizer.json and tokenizer_config.json into a model folder.
    Export(ExportArgs),
}

#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// Model folder (with config.json).
    pub dir: PathBuf,
    /// Text format (default: the one config.json records, else json-escaped).
    #[arg(long)]
    pub text_format: Option<TextFormat>,
}

pub fn run(a: Args) -> Result<()> {
    match a.command {
        What::Export(e) => {
            let cfg = Config::load(&e.dir.join(CONFIG_FILE))?;
            if !write_tokenizer_files(&e.dir, &cfg, e.text_format)? {
                bail!(
                    "{}: the vocabulary has {} tokens, not GPT-2's {GPT2_VOCAB}: there is no text tokenizer to export",
                    e.dir.display(),
                    cfg.vocab_size
                );
            }
            eprintln!("wrote {} and {} in {}", TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, e.dir.display());
            Ok(())
        }
    }
}
