//! The FoX / Transformer language model (SPEC §2): pre-norm blocks
//! h = h + Attn(RMSNorm(h)); h = h + MLP(RMSNorm(h)); a final RMSNorm; an untied output head.

pub mod attention;
pub mod cache;
pub mod mlp;

use crate::config::Config;
use crate::tensor::{ParamId, ParamKind, Params};
use attention::{AttnActs, ForgettingAttention};
use cache::{Cache, LayerCache};
use fox_kernels::{matmul, rmsnorm};
use mlp::{Mlp, MlpActs};

/// A bias-free Linear layer; its weight is [out, in] as in the checkpoint.
#[derive(Clone, Copy, Debug)]
pub struct Linear {
    pub weight: ParamId,
    pub out_features: usize,
    pub in_features: usize,
}

impl Linear {
    pub fn new(p: &mut Params, name: &str, out_features: usize, in_features: usize) -> Self {
        let weight = p.add(name, &[out_features, in_features], ParamKind::Matrix);
        Self { weight, out_features, in_features }
    }
    pub fn forward(&self, p: &Params, x: &[f32], rows: usize) -> Vec<f32> {
        let mut y = vec![0.0; rows * self.out_features];
        matmul::linear_fwd(&mut y, x, &p[self.weight], rows, self.in_features, self.out_features);
        y
    }
}

/// Shape of the batch a forward runs on.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub batch: usize,
    pub seq: usize,
    /// Left padding: row b's first `start[b]` positions are padding.
    pub start: Option<Vec<usize>>,
}

#[derive(Clone, Debug)]
pub struct Block {
    pub attn_norm: ParamId,
    pub attn: ForgettingAttention,
    pub mlp_norm: ParamId,
    pub mlp: Mlp,
}

/// A block's saved activations.
#[derive(Clone, Debug, Default)]
pub struct BlockActs {
    /// The block input (residual stream), [B, T, d].
    pub x: Vec<f32>,
    pub attn_norm_out: Vec<f32>,
    pub attn_norm_rstd: Vec<f32>,
    pub attn: AttnActs,
    /// Residual stream after attention, [B, T, d].
    pub h: Vec<f32>,
    pub mlp_norm_out: Vec<f32>,
    pub mlp_norm_rstd: Vec<f32>,
    pub mlp: MlpActs,
}

/// The whole model's saved activations.
#[derive(Clone, Debug, Default)]
pub struct ModelActs {
    pub blocks: Vec<BlockActs>,
    /// Input of the final norm, [B, T, d], its 1/rms and its output.
    pub final_x: Vec<f32>,
    pub final_rstd: Vec<f32>,
    pub final_out: Vec<f32>,
}

#[derive(Clone, Debug)]
pub struct Model {
    pub config: Config,
    pub params: Params,
    pub embeddings: ParamId,
    pub layers: Vec<Block>,
    pub norm: ParamId,
    pub lm_head: Linear,
}

impl Model {
    /// The parameter layout of `cfg`, all zeros (load or initialise next).
    pub fn new(cfg: &Config) -> Self {
        let mut p = Params::default();
        let (v, d) = (cfg.vocab_size, cfg.hidden_size);
        let embeddings = p.add("model.embeddings.weight", &[v, d], ParamKind::Matrix);
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                let pre = format!("model.layers.{i}");
                Block {
                    attn_norm: p.add(&format!("{pre}.attn_norm.weight"), &[d], ParamKind::NoDecay),
                    attn: ForgettingAttention::new(&mut p, cfg, &format!("{pre}.attn")),
                    mlp_norm: p.add(&format!("{pre}.mlp_norm.weight"), &[d], ParamKind::NoDecay),
                    mlp: Mlp::new(&mut p, cfg, &format!("{pre}.mlp")),
                }
            })
            .collect();
        let norm = p.add("model.norm.weight", &[d], ParamKind::NoDecay);
        let lm_head = Linear::new(&mut p, "lm_head.weight", v, d);
        Self { config: cfg.clone(), params: p, embeddings, layers, norm, lm_head }
    }

    pub fn new_cache(&self, batch: usize, capacity: usize, start: Option<Vec<usize>>) -> Cache {
        let c = &self.config;
        Cache {
            layers: (0..c.num_hidden_layers)
                .map(|_| LayerCache::new(batch, c.num_heads, c.head_dim(), capacity))
                .collect(),
            start,
        }
    }

    fn embed(&self, ids: &[u32]) -> Vec<f32> {
        let d = self.config.hidden_size;
        let e = &self.params[self.embeddings];
        let mut x = vec![0.0; ids.len() * d];
        for (r, &id) in ids.iter().enumerate() {
            let id = id as usize;
            assert!(id < self.config.vocab_size, "token id {id} outside the vocabulary");
            x[r * d..(r + 1) * d].copy_from_slice(&e[id * d..(id + 1) * d]);
        }
        x
    }

    /// The final hidden states (after the last RMSNorm), [B, T, d]. With `cache`, the tokens
    /// continue the cached sequence. With `keep`, the activations for backward are returned.
    pub fn forward_hidden(&self, ids: &[u32], ctx: &Ctx, mut cache: Option<&mut Cache>, keep: bool) -> (Vec<f32>, Option<ModelActs>) {
        let d = self.config.hidden_size;
        let eps = self.config.norm_eps as f32;
        let n = ctx.batch * ctx.seq;
        assert_eq!(ids.len(), n);
        let p = &self.params;
        let mut x = self.embed(ids);
        let mut acts = ModelActs::default();
        for (li, blk) in self.layers.iter().enumerate() {
            let mut ba = BlockActs::default();
            let mut xn = vec![0.0; n * d];
            let mut rstd = vec![0.0; n];
            rmsnorm::rms_norm_fwd(&mut xn, &mut rstd, &x, &p[blk.attn_norm], d, eps);
            let lc = cache.as_deref_mut().map(|c| &mut c.layers[li]);
            let (ao, aa) = blk.attn.forward(p, &xn, ctx, lc);
            let mut h = x.clone();
            h.iter_mut().zip(&ao).for_each(|(a, b)| *a += b);
            let mut hn = vec![0.0; n * d];
            let mut hrstd = vec![0.0; n];
            rmsnorm::rms_norm_fwd(&mut hn, &mut hrstd, &h, &p[blk.mlp_norm], d, eps);
            let (mo, ma) = blk.mlp.forward(p, &hn, n);
            let mut out = h.clone();
            out.iter_mut().zip(&mo).for_each(|(a, b)| *a += b);
            if keep {
                ba.x = std::mem::replace(&mut x, out);
                ba.attn_norm_out = xn;
                ba.attn_norm_rstd = rstd;
                ba.attn = aa;
                ba.h = h;
                ba.mlp_norm_out = hn;
                ba.mlp_norm_rstd = hrstd;
                ba.mlp = ma;
                acts.blocks.push(ba);
            } else {
                x = out;
            }
        }
        let mut y = vec![0.0; n * d];
        let mut rstd = vec![0.0; n];
        rmsnorm::rms_norm_fwd(&mut y, &mut rstd, &x, &p[self.norm], d, eps);
        if keep {
            acts.final_x = x;
            acts.final_rstd = rstd;
            acts.final_out = y.clone();
            (y, Some(acts))
        } else {
            (y, None)
        }
    }

    /// Logits [rows, V] of final hidden states [rows, d].
    pub fn logits(&self, hidden: &[f32]) -> Vec<f32> {
        let rows = hidden.len() / self.config.hidden_size;
        self.lm_head.forward(&self.params, hidden, rows)
    }

    /// Logits [B, T, V] of a batch (no cache).
    pub fn forward(&self, ids: &[u32], ctx: &Ctx) -> Vec<f32> {
        let (h, _) = self.forward_hidden(ids, ctx, None, false);
        self.logits(&h)
    }
}
