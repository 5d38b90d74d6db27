//! Turning text into a model's token ids for the evaluations (needle test, gate maps).
//!
//! Models with the GPT-2 vocabulary (50257) read GPT-2 BPE ids directly, in the text format they
//! were trained with (json-escaped for the released FoX checkpoints). A model with a smaller
//! vocabulary cannot read GPT-2 text at all; for such models (the tiny test fixtures) the ids can
//! be *folded* into the vocabulary (id mod V) when the user asks for it, with a warning: the
//! pipeline then runs end to end, but the text the model sees is meaningless.

use crate::config::Config;
use crate::tokenizer::{TextFormat, Tokenizer, BOS_ID, EOS_ID, GPT2_VOCAB};
use anyhow::{bail, Result};

pub use crate::tokenizer::{text_format_for, TEXT_FORMAT_KEY};

/// A GPT-2 tokenizer bound to one model's vocabulary.
#[derive(Clone, Debug)]
pub struct TextEncoder {
    pub tokenizer: Tokenizer,
    pub vocab: usize,
    /// ids are taken modulo `vocab` (test models only).
    pub fold: bool,
    /// Beginning-of-sequence id in the model's vocabulary.
    pub bos: u32,
    /// End-of-sequence id in the model's vocabulary, if it has one.
    pub eos: Option<u32>,
}

impl TextEncoder {
    /// `fold`: allow a model whose vocabulary is smaller than GPT-2's by folding ids into it.
    pub fn for_model(cfg: &Config, format: TextFormat, fold: bool) -> Result<Self> {
        let vocab = cfg.vocab_size;
        let small = vocab < GPT2_VOCAB;
        if small && !fold {
            bail!(
                "the model's vocabulary has {vocab} tokens, fewer than GPT-2's {GPT2_VOCAB}: it cannot read GPT-2 text. \
                 (For testing the pipeline only, --fold-vocab maps token ids modulo {vocab}.)"
            );
        }
        if small {
            eprintln!(
                "warning: folding GPT-2 token ids modulo the model's vocabulary ({vocab}); the model sees meaningless \
                 text and the scores mean nothing"
            );
        }
        let fold_id = |id: u32| if small { id % vocab as u32 } else { id };
        let bos = cfg.bos_token_id.unwrap_or(BOS_ID);
        let bos = if (bos as usize) < vocab { bos } else { fold_id(bos) };
        let eos = cfg.eos_token_id.or(Some(EOS_ID)).map(fold_id).filter(|&e| (e as usize) < vocab);
        Ok(Self { tokenizer: Tokenizer::gpt2(format)?, vocab, fold: small, bos, eos })
    }

    pub fn format(&self) -> TextFormat {
        self.tokenizer.format()
    }

    /// Token ids of `text` (no BOS), folded into the vocabulary when folding is on.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut ids = self.tokenizer.encode(text, false);
        if self.fold {
            ids.iter_mut().for_each(|id| *id %= self.vocab as u32);
        }
        ids
    }

    /// Text of model ids (BOS/EOS dropped). With folding the text is whatever GPT-2 token has that id.
    pub fn decode(&self, ids: &[u32]) -> String {
        let kept: Vec<u32> = ids.iter().copied().filter(|&i| i != self.bos && Some(i) != self.eos).collect();
        self.tokenizer.decode(&kept)
    }
}
