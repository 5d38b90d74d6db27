//! The language model (SPEC §2, §7): pre-norm blocks h = h + Mixer(RMSNorm(h)) and, where the
//! block has one, h = h + MLP(RMSNorm(h)); a final RMSNorm; an untied output head. The token mixer
//! is a family of its own ([`Mixer`]): Forgetting Attention (FoX and the Transformer) or a
//! recurrent layer, chosen per layer from config.json, so a hybrid is a list of layer kinds.
//!
//! Written once against the backend traits: [`Backend`] (the family-neutral ops) and each
//! family's own ([`attention::ops::AttnOps`]); the CPU backend (f32, the reference) and the CUDA
//! backend run this same code. Each block's forward writes into its activation struct and its
//! backward reads it; every buffer is allocated up front ([`ModelActs::new`], [`Scratch::new`]).

mod acts;
pub mod attention;
pub mod cache;
mod cpu_api;
pub mod cuda_plan;
pub mod deltanet;
pub mod hgrn2;
pub mod mamba;
pub mod mamba2;
pub mod mega_cuda;
pub mod mlp;
pub use acts::{activation_plan, Acts, BlockActs, CpuActs, MixerActs, MixerGrad, MixerScratch, ModelActs, Scratch};

pub use crate::backend::MemoryPlan;
use crate::backend::{Alloc, Backend, Norm};
use crate::config::{Arch, Config};
pub use crate::tensor::Linear;
use crate::tensor::{ParamId, ParamKind, Params};
use anyhow::Result;
use attention::ops::AttnOps;
use attention::{AttnConfig, ForgettingAttention};
use cache::{Cache, LayerState};
use deltanet::ops::DeltaNetOps;
use deltanet::DeltaNetMixer;
use hgrn2::ops::Hgrn2Ops;
use hgrn2::Hgrn2Mixer;
use mamba::ops::MambaOps;
use mamba::MambaMixer;
use mamba2::ops::Mamba2Ops;
use mamba2::Mamba2Mixer;
use mlp::{Mlp, MlpScratch};

/// A layer's state in `cache` (an `Option<&mut LayerState>`) as the variant `$family`'s: none
/// without a cache, an error when it holds another family's (`$name` names the layer's).
macro_rules! state_of {
    ($cache:expr, $family:ident, $name:literal) => {
        match $cache {
            None => None,
            Some(LayerState::$family(s)) => Some(s),
            Some(_) => anyhow::bail!(concat!($name, " layer was given another family's state")),
        }
    };
}

/// A backend that runs every mixer family: what the model's forward and backward need.
pub trait ModelOps: Backend + AttnOps + Mamba2Ops + MambaOps + DeltaNetOps + Hgrn2Ops {}
impl<B: Backend + AttnOps + Mamba2Ops + MambaOps + DeltaNetOps + Hgrn2Ops> ModelOps for B {}

/// One layer's inference state on backend B.
pub type LayerStateOf<B> = LayerState<<B as AttnOps>::KvCache, <B as Alloc>::F32>;

/// Shape of the batch a forward runs on.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub batch: usize,
    pub seq: usize,
    /// Left padding: row b's first `start[b]` positions are padding.
    pub start: Option<Vec<usize>>,
}

/// A block's token mixer, by family.
#[derive(Clone, Debug)]
pub enum Mixer {
    /// Forgetting Attention (FoX), or softmax attention with RoPE (the Transformer).
    Attention(ForgettingAttention),
    /// Mamba-2's SSD layer.
    Mamba2(Mamba2Mixer),
    /// Mamba's selective SSM (Samba's recurrent layers).
    Mamba(MambaMixer),
    /// DeltaNet's or Gated DeltaNet's delta rule.
    DeltaNet(DeltaNetMixer),
    /// HGRN2's gated linear attention.
    Hgrn2(Hgrn2Mixer),
}

/// The MLP sublayer of a block: its RMSNorm and the SwiGLU MLP.
#[derive(Clone, Debug)]
pub struct MlpSublayer {
    pub norm: ParamId,
    pub mlp: Mlp,
}

#[derive(Clone, Debug)]
pub struct Block {
    /// The RMSNorm before the mixer (FoX's `attn_norm`).
    pub mixer_norm: ParamId,
    pub mixer: Mixer,
    /// None in blocks that are a mixer alone (Mamba-2's).
    pub mlp: Option<MlpSublayer>,
}

#[derive(Clone, Debug)]
pub struct Model {
    pub config: Config,
    pub params: Params,
    pub embeddings: ParamId,
    pub layers: Vec<Block>,
    /// Layer li's slot: layers of one slot have the same kind and sizes, and share inference
    /// buffers and backward scratch (FoX: every layer is slot 0).
    pub slots: Vec<usize>,
    pub norm: ParamId,
    pub lm_head: Linear,
    /// HGRN2's `model.lower_bounds` [L, d]: a parameter of the model, not of a layer (every
    /// bounded layer reads its row), added after the embedding.
    pub lower_bounds: Option<ParamId>,
}

impl Model {
    /// The parameter layout of `cfg`, all zeros (load or initialise next).
    pub fn new(cfg: &Config) -> Self {
        match cfg.arch() {
            Arch::Mamba2 => return Self::new_mamba2(cfg),
            Arch::Samba => return Self::new_samba(cfg),
            Arch::DeltaNet | Arch::GatedDeltaNet => return Self::new_deltanet(cfg),
            Arch::Hgrn2 => return Self::new_hgrn2(cfg),
            Arch::Fox => {}
        }
        let attn_cfg = AttnConfig::from_config(cfg);
        Self::new_model_layout(cfg, |_| None, |p, pre, _| Mixer::Attention(ForgettingAttention::new(p, &attn_cfg, pre)))
    }

    /// The `model.*` layout of FoX's and fla's models: the embedding, `extra` (parameters
    /// registered right after it), then per layer `attn_norm`, the mixer under `attn` (`mixer`
    /// gets its prefix and the layer's index), `mlp_norm` and the SwiGLU MLP; the final norm and
    /// the head. The order of registration is the checkpoint's and the initialisation's.
    fn new_model_layout(
        cfg: &Config,
        extra: impl FnOnce(&mut Params) -> Option<ParamId>,
        mut mixer: impl FnMut(&mut Params, &str, usize) -> Mixer,
    ) -> Self {
        let mut p = Params::default();
        let (v, d) = (cfg.vocab_size, cfg.hidden_size);
        let embeddings = p.add("model.embeddings.weight", &[v, d], ParamKind::Matrix);
        let lower_bounds = extra(&mut p);
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                let pre = format!("model.layers.{i}");
                Block {
                    mixer_norm: p.add(&format!("{pre}.attn_norm.weight"), &[d], ParamKind::NoDecay),
                    mixer: mixer(&mut p, &format!("{pre}.attn"), i),
                    mlp: Some(MlpSublayer {
                        norm: p.add(&format!("{pre}.mlp_norm.weight"), &[d], ParamKind::NoDecay),
                        mlp: Mlp::new(&mut p, cfg, &format!("{pre}.mlp")),
                    }),
                }
            })
            .collect::<Vec<_>>();
        let norm = p.add("model.norm.weight", &[d], ParamKind::NoDecay);
        let lm_head = Linear::new(&mut p, "lm_head.weight", v, d);
        let slots = slots(&layers);
        Self { config: cfg.clone(), params: p, embeddings, layers, slots, norm, lm_head, lower_bounds }
    }

    /// Mamba-2 (the authors' `backbone.*` names): blocks of a norm and a mixer, no MLP.
    fn new_mamba2(cfg: &Config) -> Self {
        let mut p = Params::default();
        let (v, d) = (cfg.vocab_size, cfg.hidden_size);
        let embeddings = p.add("backbone.embeddings.weight", &[v, d], ParamKind::Matrix);
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                let pre = format!("backbone.layers.{i}");
                Block {
                    mixer_norm: p.add(&format!("{pre}.norm.weight"), &[d], ParamKind::NoDecay),
                    mixer: Mixer::Mamba2(Mamba2Mixer::new(&mut p, cfg, &format!("{pre}.mixer"))),
                    mlp: None,
                }
            })
            .collect::<Vec<_>>();
        let norm = p.add("backbone.norm_f.weight", &[d], ParamKind::NoDecay);
        let lm_head = Linear::new(&mut p, "lm_head.weight", v, d);
        let slots = slots(&layers);
        Self { config: cfg.clone(), params: p, embeddings, layers, slots, norm, lm_head, lower_bounds: None }
    }

    /// DeltaNet and Gated DeltaNet (fla's `model.*` names, FoX's block layout): a DeltaNet
    /// layer under `attn`, then the SwiGLU MLP.
    fn new_deltanet(cfg: &Config) -> Self {
        Self::new_model_layout(cfg, |_| None, |p, pre, _| Mixer::DeltaNet(DeltaNetMixer::new(p, cfg, pre)))
    }

    /// HGRN2 (fla's `model.*` names, FoX's block layout): the lower bounds after the embedding,
    /// an HGRN2 layer under `attn`, then the SwiGLU MLP.
    fn new_hgrn2(cfg: &Config) -> Self {
        let (l, d) = (cfg.num_hidden_layers, cfg.hidden_size);
        Self::new_model_layout(
            cfg,
            |p| cfg.hgrn2().lower_bound.then(|| p.add("model.lower_bounds", &[l, d], ParamKind::NoDecay)),
            |p, pre, i| Mixer::Hgrn2(Hgrn2Mixer::new(p, cfg, pre, i)),
        )
    }

    /// Elements of the lower bounds (HGRN2's [L, d]; 0 without them).
    pub fn lower_bounds_len(&self) -> usize {
        self.lower_bounds.map_or(0, |id| self.params.tensors[id.0].numel())
    }

    /// Samba (the authors' `backbone.*` names): Mamba blocks and sliding-window attention blocks
    /// (the odd layers), each with its MLP (widths by attn_hidden_ratio / mamba_hidden_ratio).
    fn new_samba(cfg: &Config) -> Self {
        let mut p = Params::default();
        let (v, d) = (cfg.vocab_size, cfg.hidden_size);
        let (h, hkv, window) = cfg.samba_attn();
        let attn_cfg = AttnConfig::rope(d, h, hkv, window, cfg.rope_base, cfg.norm_eps as f32);
        let sizes = cfg.mamba();
        let embeddings = p.add("backbone.embeddings.weight", &[v, d], ParamKind::Matrix);
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                let pre = format!("backbone.layers.{i}");
                let attention = cfg.samba_is_attention(i);
                let mixer_norm = p.add(&format!("{pre}.mixer_norm.weight"), &[d], ParamKind::NoDecay);
                let mixer = if attention {
                    Mixer::Attention(ForgettingAttention::new(&mut p, &attn_cfg, &format!("{pre}.mixer")))
                } else {
                    Mixer::Mamba(MambaMixer::new(&mut p, sizes, d, &format!("{pre}.mixer")))
                };
                let norm = p.add(&format!("{pre}.mlp_norm.weight"), &[d], ParamKind::NoDecay);
                let mlp = Mlp::with_width(&mut p, d, cfg.samba_mlp_width(attention), &format!("{pre}.mlp"));
                Block { mixer_norm, mixer, mlp: Some(MlpSublayer { norm, mlp }) }
            })
            .collect::<Vec<_>>();
        let norm = p.add("backbone.norm_f.weight", &[d], ParamKind::NoDecay);
        let lm_head = Linear::new(&mut p, "lm_head.weight", v, d);
        let slots = slots(&layers);
        Self { config: cfg.clone(), params: p, embeddings, layers, slots, norm, lm_head, lower_bounds: None }
    }

    /// The first block of each slot, in slot order.
    pub fn slot_blocks(&self) -> Vec<&Block> {
        let mut out = Vec::new();
        for (blk, &s) in self.layers.iter().zip(&self.slots) {
            if s == out.len() {
                out.push(blk);
            }
        }
        out
    }

    /// The CPU inference state of every layer, for `batch` rows of up to `capacity` positions
    /// (the KV caches grow past it).
    pub fn new_cache(&self, batch: usize, capacity: usize, start: Option<Vec<usize>>) -> Cache {
        Cache {
            layers: self
                .layers
                .iter()
                .map(|blk| match &blk.mixer {
                    Mixer::Attention(l) => LayerState::Attention(attention::kv_cache::KvCache::new(
                        batch, l.heads, l.kv_heads, l.head_dim, capacity,
                    )),
                    Mixer::Mamba2(l) => LayerState::Mamba2(<mamba2::state::Mamba2State>::new(batch, *l.sizes())),
                    Mixer::Mamba(l) => LayerState::Mamba(<mamba::state::MambaState>::new(batch, *l.sizes())),
                    Mixer::DeltaNet(l) => {
                        LayerState::DeltaNet(<deltanet::state::DeltaNetState>::new(batch, *l.sizes()))
                    }
                    Mixer::Hgrn2(l) => LayerState::Hgrn2(<hgrn2::state::Hgrn2State>::new(batch, *l.sizes())),
                })
                .collect(),
            start,
        }
    }

    /// The forward on any backend: embedding, blocks, final norm; the final hidden states are
    /// `acts.final_out`. With `caches` (one per layer) the tokens continue the cached sequence.
    /// When `acts` holds one block per slot only (inference), the slot's buffers serve each of
    /// its layers.
    pub fn forward_on<B: ModelOps>(
        &self,
        be: &mut B,
        batch: &B::Batch,
        acts: &mut Acts<B>,
        mut caches: Option<&mut [LayerStateOf<B>]>,
    ) -> Result<()> {
        let d = self.config.hidden_size;
        let eps = self.config.norm_eps as f32;
        let n = be.batch_info(batch).rows();
        let norm = |w| Norm { w, rows: n, dim: d, eps };
        let keep = acts.blocks.len() == self.layers.len();
        let slot = |li: usize| if keep { li } else { self.slots[li] };
        {
            let x0 = match acts.blocks.first_mut() {
                Some(b0) => &mut b0.x,
                None => &mut acts.final_x,
            };
            be.embedding_fwd(x0, self.embeddings, batch)?;
        }
        if let Some(id) = self.lower_bounds {
            be.hgrn2_lower_bounds_fwd(&mut acts.lower_bounds, id, self.layers.len())?;
        }
        if let (Some(first), Some(b0)) = (self.layers.first(), acts.blocks.first_mut()) {
            be.rms_norm_fwd(&mut b0.mixer_norm_out, &mut b0.mixer_norm_rstd, &b0.x, norm(first.mixer_norm))?;
        }
        for (li, blk) in self.layers.iter().enumerate() {
            let ai = slot(li);
            let cache = caches.as_deref_mut().map(|c| &mut c[li]);
            if let Some(input) = acts.inputs.get_mut(li) {
                be.copy(input, &acts.blocks[ai].x, n * d)?;
            }
            blk.forward(be, batch, &mut acts.blocks[ai], &mut acts.out, cache, &acts.lower_bounds, n, d, eps)?;
            // The block's output (h + MLP(...), or x + Mixer(...) without an MLP) is the next
            // block's input, normalised in the same pass (or the final norm's input).
            let out = &acts.out;
            match self.layers.get(li + 1) {
                None => {
                    let cur = &acts.blocks[ai];
                    be.add_rms_norm_fwd(
                        &mut acts.final_x,
                        &mut acts.final_out,
                        &mut acts.final_rstd,
                        blk.residual(cur),
                        out,
                        norm(self.norm),
                    )?
                }
                Some(nb) => {
                    let ni = slot(li + 1);
                    if ni == ai {
                        // Inference within one slot: the block's own x takes the output (in
                        // place when x is the residual: the add, then the norm).
                        let cur = &mut acts.blocks[ai];
                        let BlockActs { x, mixer_norm_out, mixer_norm_rstd, h, .. } = cur;
                        if blk.mlp.is_some() {
                            be.add_rms_norm_fwd(x, mixer_norm_out, mixer_norm_rstd, h, out, norm(nb.mixer_norm))?
                        } else {
                            be.add_inplace_rms_norm_fwd(x, mixer_norm_out, mixer_norm_rstd, out, norm(nb.mixer_norm))?
                        }
                    } else {
                        let (cur, nx) = two_mut(&mut acts.blocks, ai, ni);
                        be.add_rms_norm_fwd(
                            &mut nx.x,
                            &mut nx.mixer_norm_out,
                            &mut nx.mixer_norm_rstd,
                            blk.residual(cur),
                            out,
                            norm(nb.mixer_norm),
                        )?
                    }
                }
            }
        }
        if self.layers.is_empty() {
            be.rms_norm_fwd(&mut acts.final_out, &mut acts.final_rstd, &acts.final_x, norm(self.norm))?;
        }
        Ok(())
    }

    /// The backward on any backend, after `forward_on` with every block's activations (or every
    /// block's input, with recomputation): from `scratch.dx` = d loss / d (final hidden states),
    /// adds every parameter's gradient to the backend's gradient buffers (frozen ones excepted).
    pub fn backward_on<B: ModelOps>(
        &self,
        be: &mut B,
        batch: &B::Batch,
        acts: &mut Acts<B>,
        scratch: &mut Scratch<B::Act, B::F32>,
    ) -> Result<()> {
        let d = self.config.hidden_size;
        let recompute = acts.inputs.len() == self.layers.len();
        anyhow::ensure!(
            recompute || acts.blocks.len() == self.layers.len(),
            "backward needs the activations (or, with recomputation, the inputs) of every block"
        );
        let Scratch { dx, dnorm, mixers, mlps, dlower_bounds } = scratch;
        be.rms_norm_bwd(dnorm, false, self.norm, dx, &acts.final_x, &acts.final_rstd, d)?;
        be.grads_ready(self.head_params())?;
        std::mem::swap(dx, dnorm);
        let n = be.batch_info(batch).rows();
        let eps = self.config.norm_eps as f32;
        let norm = |w| Norm { w, rows: n, dim: d, eps };
        for (li, blk) in self.layers.iter().enumerate().rev() {
            let s = self.slots[li];
            let (mixer, mlp) = (&mut mixers[s], mlps[s].as_mut());
            if recompute {
                // The block's forward again, from its saved input, into its slot's buffers.
                let ws = &mut acts.blocks[s];
                be.copy(&mut ws.x, &acts.inputs[li], n * d)?;
                be.rms_norm_fwd(&mut ws.mixer_norm_out, &mut ws.mixer_norm_rstd, &ws.x, norm(blk.mixer_norm))?;
                blk.forward(be, batch, ws, &mut acts.out, None, &acts.lower_bounds, n, d, eps)?;
                blk.backward(be, batch, ws, dx, dnorm, mixer, mlp, (&acts.lower_bounds, dlower_bounds), d)?;
            } else {
                let lb = (&acts.lower_bounds, &mut *dlower_bounds);
                blk.backward(be, batch, &acts.blocks[li], dx, dnorm, mixer, mlp, lb, d)?;
            }
            be.grads_ready(self.layer_params(li))?;
        }
        // HGRN2's lower bounds: every bounded layer has written its row of their gradient.
        if let Some(id) = self.lower_bounds {
            be.hgrn2_lower_bounds_bwd(dlower_bounds, id, self.layers.len())?;
            be.grads_ready(id.0..id.0 + 1)?;
        }
        be.embedding_bwd(self.embeddings, dx, batch)?;
        be.grads_ready(self.embeddings.0..self.embeddings.0 + 1)
    }

    /// Elements of the Linear weights (the blocks' projections and the output head: the
    /// matrices but the embedding, a lookup), what a step's matrix products are counted on.
    pub fn linear_numel(&self) -> usize {
        let p = &self.params;
        (0..p.len()).filter(|&i| self.is_linear(i)).map(|i| p.tensors[i].numel()).sum()
    }

    /// Whether parameter `i` is a Linear weight (a matrix but the embedding).
    pub fn is_linear(&self, i: usize) -> bool {
        // 2-D: Mamba-2's decayed convolution weights are 3-D.
        self.params.kinds[i] == ParamKind::Matrix && i != self.embeddings.0 && self.params.tensors[i].shape.len() == 2
    }

    /// The ids of block `li`'s parameters (they are added block by block, see [`Model::new`]).
    pub fn layer_params(&self, li: usize) -> std::ops::Range<usize> {
        let end = self.layers.get(li + 1).map_or(self.norm.0, |b| b.mixer_norm.0);
        self.layers[li].mixer_norm.0..end
    }

    /// The ids of the final norm and the output head (the last parameters added).
    pub fn head_params(&self) -> std::ops::Range<usize> {
        self.norm.0..self.params.len()
    }

    /// One training micro-step on any backend: forward, the output head's loss (weighted by
    /// `weight` per target) and the backward. The loss is left in the backend ([`Backend::take_loss`]).
    pub fn loss_and_grads_on<B: ModelOps>(
        &self,
        be: &mut B,
        batch: &B::Batch,
        acts: &mut Acts<B>,
        scratch: &mut Scratch<B::Act, B::F32>,
        weight: f32,
    ) -> Result<()> {
        self.forward_on(be, batch, acts, None)?;
        be.head_loss(Some(&mut scratch.dx), &acts.final_out, &self.lm_head, batch, weight)?;
        self.backward_on(be, batch, acts, scratch)
    }
}

/// Layers of the same kind and sizes share a slot (their inference buffers and backward scratch
/// are interchangeable); slots are numbered in order of first appearance.
fn slots(layers: &[Block]) -> Vec<usize> {
    let mut keys: Vec<String> = Vec::new();
    layers
        .iter()
        .map(|blk| {
            let key = blk.kind_key();
            keys.iter().position(|k| *k == key).unwrap_or_else(|| {
                keys.push(key);
                keys.len() - 1
            })
        })
        .collect()
}

/// Mutable references to two different elements.
fn two_mut<T>(v: &mut [T], a: usize, b: usize) -> (&mut T, &mut T) {
    assert_ne!(a, b, "two_mut of one element");
    if a < b {
        let (lo, hi) = v.split_at_mut(b);
        (&mut lo[a], &mut hi[0])
    } else {
        let (lo, hi) = v.split_at_mut(a);
        (&mut hi[0], &mut lo[b])
    }
}

impl Block {
    /// What makes two blocks' buffers interchangeable: the mixer's family and everything that
    /// sizes its activations, and the MLP's width.
    fn kind_key(&self) -> String {
        let mixer = match &self.mixer {
            Mixer::Attention(l) => format!(
                "attention h{} kv{} d{} ks{} vs{} qk{} gate{} on{} og{} acp{}",
                l.heads,
                l.kv_heads,
                l.head_dim,
                l.k_proj.shift_proj.is_some(),
                l.v_proj.shift_proj.is_some(),
                l.qk_norm.is_some(),
                !matches!(l.fgate, attention::Fgate::None),
                l.output_norm.is_some(),
                l.ogate_proj.is_some(),
                l.log_pruning_tolerance.is_some()
            ),
            Mixer::Mamba2(l) => format!("mamba2 {:?}", l.sizes()),
            Mixer::Mamba(l) => format!("mamba {:?}", l.sizes()),
            Mixer::DeltaNet(l) => format!("deltanet {:?}", l.sizes()),
            // Each HGRN2 layer has its own row of the lower bounds, but the same buffers.
            Mixer::Hgrn2(l) => format!("hgrn2 {:?}", l.sizes()),
        };
        format!("{mixer} mlp{:?}", self.mlp.as_ref().map(|m| m.mlp.intermediate))
    }

    /// The attention layer of an attention block.
    pub fn attn(&self) -> Option<&ForgettingAttention> {
        match &self.mixer {
            Mixer::Attention(l) => Some(l),
            Mixer::Mamba2(_) | Mixer::Mamba(_) | Mixer::DeltaNet(_) | Mixer::Hgrn2(_) => None,
        }
    }

    /// The residual stream that the block's last sublayer output is added to: h (after the
    /// mixer) with an MLP, else the block input x.
    fn residual<'a, A, F>(&self, a: &'a BlockActs<A, F>) -> &'a A {
        if self.mlp.is_some() {
            &a.h
        } else {
            &a.x
        }
    }

    /// Forward of one block into `a`: the mixer's output, and with an MLP a.h = x + Mixer(RMSNorm(x))
    /// and out = MLP(RMSNorm(h)); the caller adds the residual ([`Block::residual`] + out).
    /// `a.mixer_norm_out` = RMSNorm(x) is the caller's too (the previous block's residual add does
    /// it in the same pass).
    #[allow(clippy::too_many_arguments)]
    fn forward<B: ModelOps>(
        &self,
        be: &mut B,
        batch: &B::Batch,
        a: &mut BlockActs<B::Act, B::F32>,
        out: &mut B::Act,
        cache: Option<&mut LayerStateOf<B>>,
        lower_bounds: &B::F32,
        n: usize,
        d: usize,
        eps: f32,
    ) -> Result<()> {
        match (&self.mixer, &mut a.mixer) {
            (Mixer::Attention(l), MixerActs::Attention(acts)) => {
                let cache = state_of!(cache, Attention, "an attention");
                l.forward(be, &a.mixer_norm_out, batch, acts, out, cache)?
            }
            (Mixer::Mamba2(l), MixerActs::Mamba2(acts)) => {
                let state = state_of!(cache, Mamba2, "a Mamba-2");
                l.forward(be, &a.mixer_norm_out, batch, acts, out, state)?
            }
            (Mixer::Mamba(l), MixerActs::Mamba(acts)) => {
                let state = state_of!(cache, Mamba, "a Mamba");
                l.forward(be, &a.mixer_norm_out, batch, acts, out, state)?
            }
            (Mixer::DeltaNet(l), MixerActs::DeltaNet(acts)) => {
                let state = state_of!(cache, DeltaNet, "a DeltaNet");
                l.forward(be, &a.mixer_norm_out, batch, acts, out, state)?
            }
            (Mixer::Hgrn2(l), MixerActs::Hgrn2(acts)) => {
                let state = state_of!(cache, Hgrn2, "an HGRN2");
                l.forward(be, &a.mixer_norm_out, batch, acts, out, state, lower_bounds)?
            }
            _ => anyhow::bail!("a block's activations are of another family than its mixer"),
        }
        if let (Some(m), Some(acts)) = (&self.mlp, a.mlp.as_mut()) {
            let norm = Norm { w: m.norm, rows: n, dim: d, eps };
            be.add_rms_norm_fwd(&mut a.h, &mut a.mlp_norm_out, &mut a.mlp_norm_rstd, &a.x, out, norm)?;
            m.mlp.forward(be, &a.mlp_norm_out, acts, out, n)?;
        }
        Ok(())
    }

    /// Backward of one block: `dx` holds d loss / d (block output) on entry and d loss / d (block
    /// input) on return; parameter gradients are added in the backend. `lower_bounds`: HGRN2's
    /// lower bounds and their gradient, of which a bounded layer writes its row.
    #[allow(clippy::too_many_arguments)]
    fn backward<B: ModelOps>(
        &self,
        be: &mut B,
        batch: &B::Batch,
        a: &BlockActs<B::Act, B::F32>,
        dx: &mut B::Act,
        dnorm: &mut B::Act,
        mixer: &mut MixerScratch<B::Act, B::F32>,
        mlp: Option<&mut MlpScratch<B::Act>>,
        lower_bounds: (&B::F32, &mut B::F32),
        d: usize,
    ) -> Result<()> {
        let n = be.batch_info(batch).rows();
        // out = h + MLP(RMSNorm(h)): dh = dout + RMSNorm_bwd(MLP_bwd(dout)).
        if let (Some(m), Some(acts), Some(s)) = (&self.mlp, a.mlp.as_ref(), mlp) {
            m.mlp.backward(be, &a.mlp_norm_out, acts, dx, dnorm, s, n)?;
            be.rms_norm_bwd(dx, true, m.norm, dnorm, &a.h, &a.mlp_norm_rstd, d)?;
        }
        // h = x + Mixer(RMSNorm(x)): the mixer's dy is dh (in dx), its dx goes to dnorm.
        let g = MixerGrad { x: &a.mixer_norm_out, batch, dy: &*dx, dx: &mut *dnorm };
        match (&self.mixer, &a.mixer, mixer) {
            (Mixer::Attention(l), MixerActs::Attention(acts), MixerScratch::Attention(s)) => {
                l.backward(be, g, acts, s)?
            }
            (Mixer::Mamba2(l), MixerActs::Mamba2(acts), MixerScratch::Mamba2(s)) => l.backward(be, g, acts, s)?,
            (Mixer::Mamba(l), MixerActs::Mamba(acts), MixerScratch::Mamba(s)) => l.backward(be, g, acts, s)?,
            (Mixer::DeltaNet(l), MixerActs::DeltaNet(acts), MixerScratch::DeltaNet(s)) => l.backward(be, g, acts, s)?,
            (Mixer::Hgrn2(l), MixerActs::Hgrn2(acts), MixerScratch::Hgrn2(s)) => {
                let (lb, dlb) = lower_bounds;
                l.backward(be, g, acts, s, lb, dlb)?
            }
            _ => anyhow::bail!("a block's activations or scratch are of another family than its mixer"),
        }
        be.rms_norm_bwd(dx, true, self.mixer_norm, dnorm, &a.x, &a.mixer_norm_rstd, d)
    }
}
