//! The FoX / Transformer language model (SPEC §2): pre-norm blocks
//! h = h + Attn(RMSNorm(h)); h = h + MLP(RMSNorm(h)); a final RMSNorm; an untied output head.

pub mod attention;
pub mod cache;
pub mod mlp;

use crate::config::Config;
use crate::tensor::{ParamId, ParamKind, Params};
use attention::{AttnActs, ForgettingAttention};
use cache::{Cache, LayerCache};
use fox_kernels::{cross_entropy, matmul, rmsnorm};
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
    /// Backward of `forward`: grads[weight] += dyᵀ·x (unless frozen) and, when `dx` is given,
    /// dx (+)= dy·W (added to when `accumulate`).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        p: &Params,
        x: &[f32],
        dy: &[f32],
        rows: usize,
        grads: &mut [Vec<f32>],
        dx: Option<&mut [f32]>,
        accumulate: bool,
    ) {
        let (k, n) = (self.in_features, self.out_features);
        let w = &p[self.weight];
        if p.kinds[self.weight.0] == ParamKind::Frozen {
            if let Some(dx) = dx {
                matmul::gemm_strided(rows, k, n, dx, k, accumulate, dy, n, 1, w, k, 1);
            }
            return;
        }
        matmul::linear_bwd(dx, accumulate, &mut grads[self.weight.0], dy, x, w, rows, k, n);
    }
}

/// The gradient buffer of parameter `id`, or None when the parameter is frozen (no gradient).
pub(crate) fn grad_of<'g>(p: &Params, grads: &'g mut [Vec<f32>], id: ParamId) -> Option<&'g mut [f32]> {
    (p.kinds[id.0] != ParamKind::Frozen).then(|| grads[id.0].as_mut_slice())
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
    pub fn forward_hidden(
        &self,
        ids: &[u32],
        ctx: &Ctx,
        mut cache: Option<&mut Cache>,
        keep: bool,
    ) -> (Vec<f32>, Option<ModelActs>) {
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

    /// Mean cross-entropy over the rows whose target is Some, and — accumulated into `grads`
    /// (shaped like self.params, see Params::zeros_like), scaled by `grad_scale` — the gradient of
    /// that mean with respect to every parameter. Frozen parameters (ParamKind::Frozen) get no
    /// gradient. ids/targets: [B, T] row-major; ctx.start for left padding (rows before start have
    /// target None). With no target at all the loss is 0 and `grads` is left as it was.
    pub fn loss_and_grads(
        &self,
        ids: &[u32],
        targets: &[Option<u32>],
        ctx: &Ctx,
        grads: &mut [Vec<f32>],
        grad_scale: f32,
    ) -> f32 {
        let n = ctx.batch * ctx.seq;
        assert_eq!(ids.len(), n, "ids must be [B, T]");
        assert_eq!(targets.len(), n, "targets must be [B, T]");
        assert_eq!(grads.len(), self.params.len(), "grads must be shaped like the parameters");
        let n_targets = targets.iter().filter(|t| t.is_some()).count();
        if n_targets == 0 {
            return 0.0;
        }
        let (hidden, acts) = self.forward_hidden(ids, ctx, None, true);
        let acts = acts.expect("forward_hidden keeps activations when asked");
        let (loss_sum, dhidden) = self.head_loss_and_grads(&hidden, targets, grads, grad_scale / n_targets as f32);
        self.backward(ids, ctx, &acts, &dhidden, grads);
        (loss_sum / n_targets as f64) as f32
    }

    /// The output head and cross-entropy, in row chunks so that only `chunk × vocab` logits exist at
    /// once: returns Σ loss over the rows with a target, and d(weight · Σ loss)/d hidden, while
    /// adding weight · d(Σ loss)/d W_lm_head to `grads`.
    fn head_loss_and_grads(
        &self,
        hidden: &[f32],
        targets: &[Option<u32>],
        grads: &mut [Vec<f32>],
        weight: f32,
    ) -> (f64, Vec<f32>) {
        let (d, vocab) = (self.config.hidden_size, self.config.vocab_size);
        let rows = targets.len();
        // At most ~16M logits (64 MiB) at a time.
        let chunk = ((1usize << 24) / vocab).clamp(1, rows.max(1));
        let mut dhidden = vec![0.0f32; rows * d];
        let mut loss_sum = 0.0f64;
        for r0 in (0..rows).step_by(chunk) {
            let r1 = (r0 + chunk).min(rows);
            let tg = &targets[r0..r1];
            if tg.iter().all(|t| t.is_none()) {
                continue;
            }
            let x = &hidden[r0 * d..r1 * d];
            let mut logits = self.lm_head.forward(&self.params, x, r1 - r0);
            let (losses, lse) = cross_entropy::cross_entropy_fwd(&logits, tg, vocab);
            loss_sum += losses.iter().map(|&l| l as f64).sum::<f64>();
            let w: Vec<f32> = tg.iter().map(|t| if t.is_some() { weight } else { 0.0 }).collect();
            cross_entropy::cross_entropy_bwd(&mut logits, &lse, tg, &w, vocab);
            self.lm_head.backward(&self.params, x, &logits, r1 - r0, grads, Some(&mut dhidden[r0 * d..r1 * d]), false);
        }
        (loss_sum, dhidden)
    }

    /// Backward of `forward_hidden(ids, ctx, None, true)`: given d loss / d (final hidden states)
    /// [B, T, d], adds every parameter's gradient to `grads` (frozen ones excepted).
    pub fn backward(&self, ids: &[u32], ctx: &Ctx, acts: &ModelActs, dhidden: &[f32], grads: &mut [Vec<f32>]) {
        let d = self.config.hidden_size;
        let n = ctx.batch * ctx.seq;
        assert_eq!(dhidden.len(), n * d);
        assert_eq!(acts.blocks.len(), self.layers.len(), "backward needs the activations of every block");
        let p = &self.params;
        // dx: the gradient of the residual stream, carried down the blocks.
        let mut dx = vec![0.0f32; n * d];
        rmsnorm::rms_norm_bwd(
            &mut dx,
            false,
            &mut grads[self.norm.0],
            dhidden,
            &acts.final_x,
            &acts.final_rstd,
            &p[self.norm],
            d,
        );
        for (blk, ba) in self.layers.iter().zip(&acts.blocks).rev() {
            blk.backward(p, ctx, ba, &mut dx, grads);
        }
        // Embedding: scatter-add each row's gradient into its token's row.
        if let Some(ge) = grad_of(p, grads, self.embeddings) {
            for (r, &id) in ids.iter().enumerate() {
                let id = id as usize;
                ge[id * d..(id + 1) * d].iter_mut().zip(&dx[r * d..(r + 1) * d]).for_each(|(g, v)| *g += v);
            }
        }
    }
}

impl Block {
    /// Backward of one block: `dx` holds d loss / d (block output) on entry and d loss / d (block
    /// input) on return; parameter gradients are added to `grads`.
    pub fn backward(&self, p: &Params, ctx: &Ctx, a: &BlockActs, dx: &mut [f32], grads: &mut [Vec<f32>]) {
        let d = a.x.len() / (ctx.batch * ctx.seq);
        let n = ctx.batch * ctx.seq;
        // out = h + MLP(RMSNorm(h)): dh = dout + RMSNorm_bwd(MLP_bwd(dout)).
        let dhn = self.mlp.backward(p, &a.mlp_norm_out, &a.mlp, dx, n, grads);
        rmsnorm::rms_norm_bwd(
            dx,
            true,
            &mut grads[self.mlp_norm.0],
            &dhn,
            &a.h,
            &a.mlp_norm_rstd,
            &p[self.mlp_norm],
            d,
        );
        // h = x + Attn(RMSNorm(x)).
        let dxn = self.attn.backward(p, &a.attn_norm_out, ctx, &a.attn, dx, grads);
        rmsnorm::rms_norm_bwd(
            dx,
            true,
            &mut grads[self.attn_norm.0],
            &dxn,
            &a.x,
            &a.attn_norm_rstd,
            &p[self.attn_norm],
            d,
        );
    }
}
