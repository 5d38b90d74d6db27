//! Every buffer of a forward and a backward, in named structs: per block its input, norms and
//! mixer's (and MLP's) saved activations ([`BlockActs`]), the model's ([`ModelActs`]), the
//! backward's scratch ([`Scratch`]), and what they cost ([`activation_plan`]).

use super::attention::{AttnActs, AttnScratch};
use super::deltanet::{DeltaNetActs, DeltaNetScratch};
use super::hgrn2::{Hgrn2Acts, Hgrn2Scratch};
use super::mamba::{MambaActs, MambaScratch};
use super::mamba2::{Mamba2Acts, Mamba2Scratch};
use super::mlp::{MlpActs, MlpScratch};
use super::{Block, Mixer, Model};
use crate::backend::{Alloc, MemoryPlan, Sizer};
use anyhow::Result;

/// What a mixer's backward reads and writes besides its own activations and scratch: its input x
/// [B, T, d] (the block norm's output) and batch, the gradient dy of its output, and dx [B, T, d],
/// which it overwrites with the gradient of its input (A: the backend's activations, Bt: its batch).
pub struct MixerGrad<'a, A, Bt> {
    pub x: &'a A,
    pub batch: &'a Bt,
    pub dy: &'a A,
    pub dx: &'a mut A,
}

/// A mixer's saved activations, by family.
#[derive(Clone, Debug)]
pub enum MixerActs<A, F> {
    Attention(AttnActs<A, F>),
    Mamba2(Mamba2Acts<A, F>),
    Mamba(MambaActs<A, F>),
    DeltaNet(DeltaNetActs<A, F>),
    Hgrn2(Hgrn2Acts<A, F>),
}

/// A mixer's backward buffers, by family (shared by the layers of that family).
pub enum MixerScratch<A, F> {
    Attention(AttnScratch<A, F>),
    Mamba2(Mamba2Scratch<A, F>),
    Mamba(MambaScratch<A>),
    DeltaNet(DeltaNetScratch<A, F>),
    Hgrn2(Hgrn2Scratch<A>),
}

/// A block's saved activations (A: activation buffers, F: f32 buffers of the backend).
#[derive(Clone, Debug)]
pub struct BlockActs<A, F> {
    /// The block input (residual stream), [B, T, d].
    pub x: A,
    pub mixer_norm_out: A,
    pub mixer_norm_rstd: F,
    pub mixer: MixerActs<A, F>,
    /// Residual stream after the mixer, [B, T, d] (empty in a block without an MLP).
    pub h: A,
    pub mlp_norm_out: A,
    pub mlp_norm_rstd: F,
    /// Empty in a block without an MLP.
    pub mlp: Option<MlpActs<A>>,
}

impl<A: Default, F: Default> BlockActs<A, F> {
    /// Empty buffers around a mixer's (for activations copied from another backend).
    pub fn with_mixer(mixer: MixerActs<A, F>) -> Self {
        Self {
            x: A::default(),
            mixer_norm_out: A::default(),
            mixer_norm_rstd: F::default(),
            mixer,
            h: A::default(),
            mlp_norm_out: A::default(),
            mlp_norm_rstd: F::default(),
            mlp: None,
        }
    }
}

impl<A, F> BlockActs<A, F> {
    /// The attention layer's activations, in an attention block.
    pub fn attn(&self) -> Option<&AttnActs<A, F>> {
        match &self.mixer {
            MixerActs::Attention(a) => Some(a),
            MixerActs::Mamba2(_) | MixerActs::Mamba(_) | MixerActs::DeltaNet(_) | MixerActs::Hgrn2(_) => None,
        }
    }
}

/// The whole model's saved activations.
#[derive(Clone, Debug, Default)]
pub struct ModelActs<A, F> {
    pub blocks: Vec<BlockActs<A, F>>,
    /// Input of the final norm, [B, T, d], its 1/rms and its output.
    pub final_x: A,
    pub final_rstd: F,
    pub final_out: A,
    /// A sublayer's output before its residual add, [B, T, d]: not needed by the backward, so one
    /// buffer serves every layer.
    pub out: A,
    /// With recomputation (`ModelActs::recompute`): each block's input, [B, T, d]; `blocks` then
    /// holds one block's buffers, refilled by a second forward of each block during the backward.
    pub inputs: Vec<A>,
    /// HGRN2's lower bounds [L, d], computed from the model's `lower_bounds` before the blocks
    /// (empty in other models).
    pub lower_bounds: F,
}

/// The activations of the CPU backend (f32 buffers).
pub type CpuActs = ModelActs<Vec<f32>, Vec<f32>>;

/// The activations of backend B.
pub type Acts<B> = ModelActs<<B as Alloc>::Act, <B as Alloc>::F32>;

/// Buffers the backward reuses in every block.
pub struct Scratch<A, F> {
    /// d loss / d (residual stream), carried down the blocks, and a second one for a norm's input.
    pub dx: A,
    pub dnorm: A,
    /// One per slot ([`Model::slots`]): the mixer's and the MLP's (None without an MLP).
    pub mixers: Vec<MixerScratch<A, F>>,
    pub mlps: Vec<Option<MlpScratch<A>>>,
    /// The gradient of HGRN2's lower bounds [L, d] (empty in other models).
    pub dlower_bounds: F,
}

impl<A, F> BlockActs<A, F> {
    pub fn new<B: Alloc<Act = A, F32 = F>>(be: &B, blk: &Block, d: usize, b: usize, t: usize) -> Result<Self> {
        let n = b * t;
        let with_mlp = if blk.mlp.is_some() { n } else { 0 };
        Ok(Self {
            x: be.alloc(n * d)?,
            mixer_norm_out: be.alloc(n * d)?,
            mixer_norm_rstd: be.alloc_f32(n)?,
            mixer: match &blk.mixer {
                Mixer::Attention(l) => MixerActs::Attention(AttnActs::new(be, l, b, t)?),
                Mixer::Mamba2(l) => MixerActs::Mamba2(Mamba2Acts::new(be, l, b, t)?),
                Mixer::Mamba(l) => MixerActs::Mamba(MambaActs::new(be, l, b, t)?),
                Mixer::DeltaNet(l) => MixerActs::DeltaNet(DeltaNetActs::new(be, l, b, t)?),
                Mixer::Hgrn2(l) => MixerActs::Hgrn2(Hgrn2Acts::new(be, l, b, t)?),
            },
            h: be.alloc(with_mlp * d)?,
            mlp_norm_out: be.alloc(with_mlp * d)?,
            mlp_norm_rstd: be.alloc_f32(with_mlp)?,
            mlp: blk.mlp.as_ref().map(|m| MlpActs::new(be, &m.mlp, n)).transpose()?,
        })
    }
}

impl<A, F> ModelActs<A, F> {
    /// Buffers for a [b, t] batch: every block's when `keep` (training, gate maps), else one
    /// block's, reused layer after layer (inference).
    pub fn new<B: Alloc<Act = A, F32 = F>>(be: &B, model: &Model, b: usize, t: usize, keep: bool) -> Result<Self> {
        let n = b * t;
        let d = model.config.hidden_size;
        // Inference keeps one block's buffers per slot, reused by the slot's layers.
        let blocks: Vec<&Block> = if keep { model.layers.iter().collect() } else { model.slot_blocks() };
        Ok(Self {
            blocks: blocks.into_iter().map(|blk| BlockActs::new(be, blk, d, b, t)).collect::<Result<_>>()?,
            final_x: be.alloc(n * d)?,
            final_rstd: be.alloc_f32(n)?,
            final_out: be.alloc(n * d)?,
            out: be.alloc(n * d)?,
            inputs: Vec::new(),
            lower_bounds: be.alloc_f32(model.lower_bounds_len())?,
        })
    }

    /// Buffers for training with per-block recomputation: every block's input and one block's
    /// activations per slot (the backward runs each block's forward again just before its
    /// backward).
    pub fn recompute<B: Alloc<Act = A, F32 = F>>(be: &B, model: &Model, b: usize, t: usize) -> Result<Self> {
        let mut acts = Self::new(be, model, b, t, false)?;
        let nd = b * t * model.config.hidden_size;
        acts.inputs = (0..model.layers.len()).map(|_| be.alloc(nd)).collect::<Result<_>>()?;
        Ok(acts)
    }
}

impl<A, F> Scratch<A, F> {
    pub fn new<B: Alloc<Act = A, F32 = F>>(be: &B, model: &Model, b: usize, t: usize) -> Result<Self> {
        let n = b * t;
        let d = model.config.hidden_size;
        anyhow::ensure!(!model.layers.is_empty(), "the model has no layers");
        let slots = model.slot_blocks();
        Ok(Self {
            dx: be.alloc(n * d)?,
            dnorm: be.alloc(n * d)?,
            mixers: slots
                .iter()
                .map(|blk| {
                    Ok(match &blk.mixer {
                        Mixer::Attention(l) => MixerScratch::Attention(AttnScratch::new(be, l, b, t)?),
                        Mixer::Mamba2(l) => MixerScratch::Mamba2(Mamba2Scratch::new(be, l, b, t)?),
                        Mixer::Mamba(l) => MixerScratch::Mamba(MambaScratch::new(be, l, b, t)?),
                        Mixer::DeltaNet(l) => MixerScratch::DeltaNet(DeltaNetScratch::new(be, l, b, t)?),
                        Mixer::Hgrn2(l) => MixerScratch::Hgrn2(Hgrn2Scratch::new(be, l, b, t)?),
                    })
                })
                .collect::<Result<_>>()?,
            mlps: slots
                .iter()
                .map(|blk| blk.mlp.as_ref().map(|m| MlpScratch::new(be, &m.mlp, n)).transpose())
                .collect::<Result<_>>()?,
            dlower_bounds: be.alloc_f32(model.lower_bounds_len())?,
        })
    }
}

/// The activations and backward scratch of a training step on a [b, t] batch, by name, with
/// `act_bytes` per activation element (f32 statistics take 4): the memory plan's share of them.
pub fn activation_plan(
    model: &Model,
    b: usize,
    t: usize,
    act_bytes: usize,
    recompute: bool,
    plan: &mut MemoryPlan,
) -> Result<()> {
    let s = Sizer::default();
    let n = b * t;
    anyhow::ensure!(!model.layers.is_empty(), "the model has no layers");
    let layers = model.layers.len();
    let d = model.config.hidden_size;
    // Bytes of each slot's block, and how many layers the slot has.
    let mut per_slot = Vec::new();
    for blk in model.slot_blocks() {
        BlockActs::new(&s, blk, d, b, t)?;
        per_slot.push(s.take_bytes(act_bytes));
    }
    let counts: Vec<usize> = (0..per_slot.len()).map(|k| model.slots.iter().filter(|&&s| s == k).count()).collect();
    if recompute {
        let one: usize = per_slot.iter().sum();
        plan.add(format!("activations of one block per kind (recomputed): {:.1} MiB", one as f64 / 1048576.0), one);
        plan.add(
            format!("block inputs: {layers} × {:.1} MiB", (n * d * act_bytes) as f64 / 1048576.0),
            layers * n * d * act_bytes,
        );
    } else {
        for (bytes, count) in per_slot.iter().zip(&counts) {
            plan.add(format!("activations: {count} blocks × {:.1} MiB", *bytes as f64 / 1048576.0), bytes * count);
        }
    }
    ModelActs::new(&s, model, b, t, false)?;
    let _ = s.take_bytes(act_bytes);
    plan.add("final norm in/out, sublayer output", 3 * n * d * act_bytes + 4 * n);
    Scratch::new(&s, model, b, t)?;
    plan.add("backward scratch", s.take_bytes(act_bytes));
    Ok(())
}
