//! Named training set-ups: the paper's model sizes for the four variants with the authors'
//! hyper-parameters (their `configs/experiment/longcrawl64/*` files), and `tiny`, a small
//! FoX (Pro) that trains on CPU in minutes.
//!
//! Names: `{fox,transformer}-{llama,pro}-{125m,360m,760m}` (the 760M ones are the paper's 16B-token
//! ablation runs), `{fox,transformer}-{llama,pro}-760m-48b` (its main 48B-token runs, with their own
//! learning rates), `tiny`, and the small-scale
//! experiment's seven (experiments/small-scale): `{fox,transformer}-{llama,pro}-small`,
//! `transformer-llama-norope-small`, `fox-llama-biasonly-small` and `fox-llama-fixed-small`.

use crate::config::{
    Config, FgateType, SambaAttn, DELTANET_MODEL_TYPE, GATED_DELTANET_MODEL_TYPE, HGRN2_MODEL_TYPE, MAMBA2_MODEL_TYPE,
    MODEL_TYPE, SAMBA_MODEL_TYPE,
};
use crate::tokenizer::{BOS_ID, EOS_ID, GPT2_VOCAB};
use crate::train::TrainConfig;
use anyhow::{bail, Result};

/// The authors' seven tiny reference models, by their folder names under
/// tests/fixtures/official-fox-tiny: what the fixture tests and the GPU check compare against.
pub const OFFICIAL_FIXTURES: [&str; 7] = [
    "fox_llama",
    "fox_pro",
    "fox_pro_shared_qknorm",
    "fox_bias_only",
    "fox_fixed",
    "transformer_llama",
    "transformer_pro",
];

/// The four architectures of SPEC §2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    FoxLlama,
    FoxPro,
    TransformerLlama,
    TransformerPro,
}

impl Variant {
    pub const ALL: [Variant; 4] =
        [Variant::FoxLlama, Variant::FoxPro, Variant::TransformerLlama, Variant::TransformerPro];

    pub fn name(self) -> &'static str {
        match self {
            Variant::FoxLlama => "fox-llama",
            Variant::FoxPro => "fox-pro",
            Variant::TransformerLlama => "transformer-llama",
            Variant::TransformerPro => "transformer-pro",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Variant::FoxLlama => "FoX (LLaMA)",
            Variant::FoxPro => "FoX (Pro)",
            Variant::TransformerLlama => "Transformer (LLaMA)",
            Variant::TransformerPro => "Transformer (Pro)",
        }
    }

    pub fn is_fox(self) -> bool {
        matches!(self, Variant::FoxLlama | Variant::FoxPro)
    }

    pub fn is_pro(self) -> bool {
        matches!(self, Variant::FoxPro | Variant::TransformerPro)
    }

    /// A model configuration of this variant (SPEC §2's table).
    pub fn config(self, hidden_size: usize, layers: usize, heads: usize) -> Config {
        let pro = self.is_pro();
        Config {
            model_type: MODEL_TYPE.into(),
            vocab_size: GPT2_VOCAB,
            hidden_size,
            num_hidden_layers: layers,
            num_heads: heads,
            num_kv_heads: None,
            hidden_ratio: Some(if pro { 3.5 } else { 4.0 }),
            intermediate_size: None,
            hidden_act: "swish".into(),
            norm_eps: 1e-6,
            use_rope: !self.is_fox(),
            rope_base: 500000.0,
            fgate_type: if self.is_fox() { FgateType::Full } else { FgateType::None },
            fgate_bias_init: false,
            decay_time_min: None,
            decay_time_max: None,
            use_output_gate: pro,
            ogate_act: "sigmoid".into(),
            use_output_norm: pro,
            qk_norm: pro,
            qk_norm_share_param_across_head: false,
            use_k_shift: pro,
            use_v_shift: pro,
            log_pruning_tolerance: None,
            tie_word_embeddings: false,
            window_size: None,
            bos_token_id: Some(BOS_ID),
            eos_token_id: Some(EOS_ID),
            initializer_range: 0.02,
            ssm_head_dim: None,
            state_size: None,
            expand: None,
            conv_kernel: None,
            n_groups: None,
            use_conv_bias: None,
            time_step_min: None,
            time_step_max: None,
            time_step_floor: None,
            attn: None,
            attn_hidden_ratio: None,
            mamba_hidden_ratio: None,
            time_step_rank: None,
            expand_k: None,
            expand_v: None,
            use_gate: None,
            use_short_conv: None,
            conv_size: None,
            use_beta: None,
            qk_activation: None,
            allow_neg_eigval: None,
            num_v_heads: None,
            expand_ratio: None,
            use_lower_bound: None,
            extra: Default::default(),
        }
    }
}

/// A model and how to train it.
#[derive(Clone, Debug)]
pub struct Preset {
    pub name: String,
    pub description: String,
    pub model: Config,
    pub train: TrainConfig,
}

const MI: u64 = 1 << 20;

/// The paper's recipe (SPEC §3): batches of 32 sequences of 16384 tokens (0.5Mi tokens),
/// warm-up over 256Mi tokens, cosine decay to 0 at the end; its AdamW settings are every
/// preset's.
fn paper_train(peak_lr: f64, total_tokens: u64, micro_batch: usize) -> TrainConfig {
    TrainConfig {
        context: 16384,
        batch_size: 32,
        micro_batch,
        total_tokens,
        peak_lr,
        min_lr: 0.0,
        warmup_tokens: 256 * MI,
        weight_decay: 0.1,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        max_grad_norm: 1.0,
        seed: 0,
        eval_every: 1000,
        eval_tokens: 2 * MI,
        checkpoint_every: 500,
        keep_last: 2,
        log_every: 10,
    }
}

/// Every preset name.
pub fn names() -> Vec<String> {
    let mut v = vec!["tiny".to_string()];
    for size in ["125m", "360m", "760m", "760m-48b"] {
        for var in Variant::ALL {
            v.push(format!("{}-{size}", var.name()));
        }
    }
    v.extend(SMALL.iter().map(|s| s.to_string()));
    v.extend(MAMBA2.iter().map(|s| s.to_string()));
    v.extend(SAMBA.iter().map(|s| s.to_string()));
    v.extend(DELTANET.iter().map(|s| s.to_string()));
    v.extend(HGRN2.iter().map(|s| s.to_string()));
    v
}

/// The small-scale experiment's models (experiments/small-scale), in the order of its tables.
pub const SMALL: [&str; 7] = [
    "fox-pro-small",
    "transformer-pro-small",
    "fox-llama-small",
    "transformer-llama-small",
    "transformer-llama-norope-small",
    "fox-llama-biasonly-small",
    "fox-llama-fixed-small",
];

/// Training context of the small presets; also the fixed and bias-only gates' longest decay time.
pub const SMALL_CONTEXT: usize = 2048;

/// The small presets: the paper's comparison scaled down to one H100 for a few minutes per model.
///
/// Size: d = 384, 6 layers, 6 heads of 64 (head_dim 64 keeps the GPU's bf16 wgmma attention
/// kernel in use), about 49M parameters of which 38.6M are the embedding and the untied head
/// (GPT-2's 50257 tokens dominate at this width; d = 512 would put the embeddings alone past
/// 50M). The Pro variants take intermediate_size 896, i.e. hidden_ratio 3.5 unrounded, so that
/// their output gates cost what the LLaMA variants' wider MLP (1024) costs: the two families are
/// parameter-matched as in the paper (rounding 896 up to 1024 would not be).
///
/// Recipe (SPEC §3 scaled down): context 2048, batches of 32 sequences (64Ki tokens), 1536 steps
/// (about 100M tokens), linear warm-up over the first 10% of the tokens (the paper's 256Mi of
/// 2.5Gi), cosine decay to 0, peak LR 2e-3 for every model (the paper's 125M value), AdamW
/// (0.9, 0.95), weight decay 0.1, clipping at 1. The budget is sized for about 4-5 minutes per
/// model at ~400k tokens/s on one H100; override with --tokens / --steps / --lr.
///
/// Ablations: `-norope` is the Transformer (LLaMA) without RoPE (no positional information at
/// all); `-biasonly` is FoX (LLaMA) with the data-independent gate, a learned per-head bias
/// initialised from decay times log-spaced over [2, 2048]; `-fixed` freezes that same bias
/// (ALiBi-like slopes 1/T_h).
fn small(name: &str) -> Option<Preset> {
    let (variant, ablation) = match name {
        "fox-pro-small" => (Variant::FoxPro, ""),
        "transformer-pro-small" => (Variant::TransformerPro, ""),
        "fox-llama-small" => (Variant::FoxLlama, ""),
        "transformer-llama-small" => (Variant::TransformerLlama, ""),
        "transformer-llama-norope-small" => (Variant::TransformerLlama, "norope"),
        "fox-llama-biasonly-small" => (Variant::FoxLlama, "biasonly"),
        "fox-llama-fixed-small" => (Variant::FoxLlama, "fixed"),
        _ => return None,
    };
    let mut model = variant.config(384, 6, 6);
    if variant.is_pro() {
        model.intermediate_size = Some(896);
    }
    let decay_times = (Some(2.0), Some(SMALL_CONTEXT as f64));
    let title = match ablation {
        "norope" => {
            model.use_rope = false;
            format!("{} without RoPE", variant.title())
        }
        "biasonly" => {
            model.fgate_type = FgateType::BiasOnly;
            model.fgate_bias_init = true;
            (model.decay_time_min, model.decay_time_max) = decay_times;
            format!("{}, data-independent gate (learned bias, decay times 2-{SMALL_CONTEXT})", variant.title())
        }
        "fixed" => {
            model.fgate_type = FgateType::Fixed;
            (model.decay_time_min, model.decay_time_max) = decay_times;
            format!("{}, fixed gate (ALiBi-like, decay times 2-{SMALL_CONTEXT})", variant.title())
        }
        _ => variant.title().to_string(),
    };
    let (batch, steps) = (32usize, 1536u64);
    let tokens_per_step = (batch * SMALL_CONTEXT) as u64;
    Some(Preset {
        name: name.into(),
        description: format!(
            "{title}: d=384, 6 layers, 6 heads of 64, context {SMALL_CONTEXT}, {steps} steps of {batch} windows \
             ({}M tokens), peak LR 2e-3 (experiments/small-scale)",
            steps * tokens_per_step / 1_000_000
        ),
        model,
        train: TrainConfig {
            context: SMALL_CONTEXT,
            batch_size: batch,
            warmup_tokens: steps / 10 * tokens_per_step,
            eval_every: 256,
            eval_tokens: MI,
            checkpoint_every: 512,
            keep_last: 1,
            ..paper_train(2e-3, steps * tokens_per_step, 16)
        },
    })
}

/// The small FoX (LLaMA)'s recipe for `name`'s `model`, described as `what` in place of that
/// FoX's sizes.
fn small_recipe(name: &str, model: Config, what: &str) -> Option<Preset> {
    let p = small("fox-llama-small")?;
    let description = p.description.replace("FoX (LLaMA): d=384, 6 layers, 6 heads of 64", what);
    Some(p.renamed(name, model, description))
}

impl Preset {
    /// This preset's recipe as preset `name` of another model.
    fn renamed(self, name: &str, model: Config, description: String) -> Preset {
        Preset { name: name.into(), description, model, ..self }
    }
}

/// The tiny CPU preset: a FoX (Pro) with d = 64, 4 layers, 2 heads of 32, trained on windows of
/// 128 tokens, 8 per step, for 500 steps (512k tokens, about 1.7 passes over the Moby-Dick
/// sample). With GPT-2's 50257-token vocabulary the embedding and the output head hold 96% of
/// its 6.7M parameters and most of its FLOPs, so width is what costs: the blocks are nearly free
/// at d = 64, and a narrow, deeper model learns fastest per second on CPU. The price of the big
/// vocabulary buys a model that `foxlm generate` and the evaluation commands accept unchanged.
/// The cosine decay ends at 3e-3, not lower: the model is still learning at the end (held-out
/// loss after 500 steps, seed 0: 5.686 with a floor of 3e-3 against 5.708 with 2e-3, 5.712 with
/// 4e-3 and about 5.73 with 1e-3).
pub fn tiny() -> Preset {
    let model = Variant::FoxPro.config(64, 4, 2);
    Preset {
        name: "tiny".into(),
        description:
            "FoX (Pro), d=64, 4 layers, 2 heads, context 128, 500 steps of 8 windows: trains on a 2-core CPU in under two minutes".into(),
        model,
        train: TrainConfig {
            context: 128,
            batch_size: 8,
            min_lr: 3e-3,
            warmup_tokens: 10 * 8 * 128,
            eval_every: 100,
            eval_tokens: 32 * 1024,
            checkpoint_every: 100,
            log_every: 1,
            ..paper_train(1e-2, 500 * 8 * 128, 8)
        },
    }
}

/// Looks up a preset by name.
pub fn preset(name: &str) -> Result<Preset> {
    if name == "tiny" {
        return Ok(tiny());
    }
    if let Some(p) = small(name) {
        return Ok(p);
    }
    if let Some(p) = mamba2(name) {
        return Ok(p);
    }
    if let Some(p) = samba(name) {
        return Ok(p);
    }
    if let Some(p) = deltanet(name) {
        return Ok(p);
    }
    if let Some(p) = hgrn2(name) {
        return Ok(p);
    }
    // The paper's main runs: 760M models on 48B tokens (45Gi), each with its own peak LR (the
    // authors' configs/experiment/longcrawl64/*/*_760m_48b.yaml; the paper's Table 5).
    if let Some(base) = name.strip_suffix("-760m-48b") {
        let Some(variant) = Variant::ALL.into_iter().find(|v| v.name() == base) else {
            bail!("unknown preset {name:?}; presets: {}", names().join(", "));
        };
        let lr = match variant {
            Variant::FoxLlama => 1e-3,
            Variant::FoxPro => 2e-3,
            Variant::TransformerLlama => 5e-4,
            Variant::TransformerPro => 1e-3,
        };
        let tokens = 46080 * MI;
        return Ok(Preset {
            name: name.into(),
            description: format!(
                "{} 760M, the paper's main run: 48B tokens ({tokens}), peak LR {lr}; the released checkpoints' recipe",
                variant.title()
            ),
            model: variant.config(1536, 24, if variant.is_fox() { 24 } else { 12 }),
            train: paper_train(lr, tokens, 1),
        });
    }
    let Some((var, size)) = name.rsplit_once('-') else {
        bail!("unknown preset {name:?}; presets: {}", names().join(", "));
    };
    let Some(variant) = Variant::ALL.into_iter().find(|v| v.name() == var) else {
        bail!("unknown preset {name:?}; presets: {}", names().join(", "));
    };
    // (d_model, layers, heads, peak LR, tokens, micro-batch) from the authors' configs:
    // 125M 2.5Gi tokens, 360M 7Gi, 760M 15Gi (the 16B-token ablation runs; the main runs are the
    // -48b presets above); the 760M Transformers use 12 heads of 128.
    let (d, layers, heads, lr, tokens, micro) = match size {
        "125m" => (768, 12, 12, 2e-3, 2560 * MI, 2),
        "360m" => (1024, 24, 16, 2e-3, 7168 * MI, 1),
        "760m" => (1536, 24, if variant.is_fox() { 24 } else { 12 }, 1e-3, 15360 * MI, 1),
        _ => bail!("unknown preset {name:?}; presets: {}", names().join(", ")),
    };
    let model = variant.config(d, layers, heads);
    let run = match size {
        "760m" => format!(
            "the paper's 16B-token ablation run ({tokens} tokens, peak LR {lr}; the main run is {}-760m-48b)",
            variant.name()
        ),
        _ => format!("the paper's recipe ({tokens} tokens, peak LR {lr})"),
    };
    Ok(Preset {
        name: name.into(),
        description: format!("{} {}: {run}", variant.title(), size.to_uppercase()),
        model,
        train: paper_train(lr, tokens, micro),
    })
}

/// The Mamba-2 presets: the paper's sizes and the small experiment's.
pub const MAMBA2: [&str; 5] = ["mamba2-125m", "mamba2-360m", "mamba2-760m", "mamba2-small", "mamba2-tiny"];

/// A Mamba-2 model in the authors' configuration (their configs/model/mamba2.py): expand 2, heads
/// of 64 channels, state 128, one group of B and C, convolution width 4, ε 1e-5.
pub fn mamba2_config(hidden_size: usize, layers: usize) -> Config {
    let mut c = Variant::FoxLlama.config(hidden_size, layers, 2 * hidden_size / 64);
    c.model_type = MAMBA2_MODEL_TYPE.into();
    c.norm_eps = 1e-5;
    c.hidden_act = "silu".into();
    c.hidden_ratio = None;
    c.use_rope = false;
    (c.ssm_head_dim, c.state_size, c.expand, c.conv_kernel, c.n_groups) =
        (Some(64), Some(128), Some(2), Some(4), Some(1));
    c.use_conv_bias = Some(true);
    (c.time_step_min, c.time_step_max, c.time_step_floor) = (Some(0.001), Some(0.1), Some(1e-4));
    c.extra.insert("chunk_size".into(), 256.into());
    c
}

/// `mamba2-{125m,360m,760m}` (the authors' experiment configs: 24 layers of d = 768, 48 of 1024,
/// 48 of 1536 — no MLP, so twice the FoX layers at about the same size — with their peak LRs and
/// the 2.5Gi/7Gi/15Gi-token runs of the ablation table), `mamba2-small` (experiments/small-scale:
/// d = 384 with 12 layers, the small FoX's parameter count, and its recipe) and `mamba2-tiny`
/// (tiny's recipe for a CPU).
fn mamba2(name: &str) -> Option<Preset> {
    let (d, layers, lr, tokens, micro) = match name {
        "mamba2-125m" => (768, 24, 2e-3, 2560 * MI, 2),
        "mamba2-360m" => (1024, 48, 2e-3, 7168 * MI, 1),
        "mamba2-760m" => (1536, 48, 1e-3, 15360 * MI, 1),
        "mamba2-tiny" => {
            // tiny's recipe and width, for a CPU: 4 layers of d = 64, 2 SSM heads of 64, state 32.
            let mut model = mamba2_config(64, 4);
            model.state_size = Some(32);
            let what = "Mamba-2, d=64, 4 layers, 2 SSM heads of 64, state 32, context 128, 500 steps of 8 windows: \
                        trains on a 2-core CPU in minutes";
            return Some(tiny().renamed(name, model, what.into()));
        }
        "mamba2-small" => {
            return small_recipe(
                name,
                mamba2_config(384, 12),
                "Mamba-2: d=384, 12 layers, 12 SSM heads of 64, state 128",
            )
        }
        _ => return None,
    };
    Some(Preset {
        name: name.into(),
        description: format!(
            "Mamba-2 {}: {layers} layers of d={d}, SSM heads of 64, state 128; the paper's recipe ({tokens} tokens, peak LR {lr})",
            name.trim_start_matches("mamba2-").to_uppercase()
        ),
        model: mamba2_config(d, layers),
        train: paper_train(lr, tokens, micro),
    })
}

/// The DeltaNet and Gated DeltaNet presets: the paper's sizes, the small experiment's and tiny's.
pub const DELTANET: [&str; 10] = [
    "deltanet-125m",
    "deltanet-360m",
    "deltanet-760m",
    "deltanet-small",
    "deltanet-tiny",
    "gated-deltanet-125m",
    "gated-deltanet-360m",
    "gated-deltanet-760m",
    "gated-deltanet-small",
    "gated-deltanet-tiny",
];

/// A DeltaNet model in the authors' configuration (their configs/model/delta_net.py: expand_k
/// and expand_v 1, short convolutions of width 4, β, q/k SiLU and L2 norm, no output gate, SwiGLU
/// MLPs of ratio 4, ε 1e-6), or with `gated` a Gated DeltaNet of the same heads (head_dim
/// d / heads, expand_v 1) with fla's output gate and decay.
pub fn deltanet_config(hidden_size: usize, layers: usize, heads: usize, gated: bool) -> Config {
    let mut c = Variant::FoxLlama.config(hidden_size, layers, heads);
    c.model_type = if gated { GATED_DELTANET_MODEL_TYPE } else { DELTANET_MODEL_TYPE }.into();
    // FoX's fields at their defaults (config.json leaves them out; see Config::to_json).
    c.use_rope = false;
    c.qk_norm = true;
    // fla's DeltaNetConfig field (always on in the layer); GatedDeltaNetConfig has none.
    c.use_output_norm = !gated;
    if gated {
        c.ssm_head_dim = Some(hidden_size / heads);
        c.expand_v = Some(1.0);
        c.use_gate = Some(true);
    } else {
        (c.expand_k, c.expand_v) = (Some(1.0), Some(1.0));
        c.use_gate = Some(false);
        c.use_beta = Some(true);
    }
    c.use_short_conv = Some(true);
    c.conv_size = Some(4);
    c.qk_activation = Some("silu".into());
    c
}

/// `deltanet-{125m,360m,760m}` (the authors' configs/experiment/longcrawl64/delta_net: 12 layers
/// of d = 768 with 6 heads, 24 of 1024 with 8, 24 of 1536 with 12 — heads of 128 — their peak LRs
/// and the 2.5Gi/7Gi/15Gi-token runs), `deltanet-small` (experiments/small-scale: d = 384, 6
/// layers, 3 heads of 128, the small FoX's recipe) and `deltanet-tiny` (tiny's recipe, 2 heads of
/// 32); `gated-deltanet-*` the same with Gated DeltaNet layers (the paper has no Gated DeltaNet
/// run: same sizes and recipe, not a published configuration).
fn deltanet(name: &str) -> Option<Preset> {
    let (gated, size) = match name.strip_prefix("gated-deltanet-") {
        Some(size) => (true, size),
        None => (false, name.strip_prefix("deltanet-")?),
    };
    let title = if gated { "Gated DeltaNet" } else { "DeltaNet" };
    let (d, layers, heads, lr, tokens, micro) = match size {
        "125m" => (768, 12, 6, 2e-3, 2560 * MI, 2),
        "360m" => (1024, 24, 8, 2e-3, 7168 * MI, 1),
        "760m" => (1536, 24, 12, 1e-3, 15360 * MI, 1),
        "tiny" => {
            let what = format!(
                "{title}, d=64, 4 layers, 2 heads of 32, context 128, 500 steps of 8 windows: trains on a 2-core CPU"
            );
            return Some(tiny().renamed(name, deltanet_config(64, 4, 2, gated), what));
        }
        "small" => {
            let what = format!("{title}: d=384, 6 layers, 3 heads of 128");
            return small_recipe(name, deltanet_config(384, 6, 3, gated), &what);
        }
        _ => return None,
    };
    Some(Preset {
        name: name.into(),
        description: format!(
            "{title} {}: {layers} layers of d={d}, {heads} heads of 128; the paper's recipe ({tokens} tokens, peak LR {lr})",
            size.to_uppercase()
        ),
        model: deltanet_config(d, layers, heads, gated),
        train: paper_train(lr, tokens, micro),
    })
}

/// The HGRN2 presets: the paper's sizes, the small experiment's and tiny's.
pub const HGRN2: [&str; 5] = ["hgrn2-125m", "hgrn2-360m", "hgrn2-760m", "hgrn2-small", "hgrn2-tiny"];

/// An HGRN2 model in the authors' configuration (their configs/model/hgrn2.py: heads of
/// expand_ratio channels, no short convolutions, the lower bounds, SwiGLU MLPs of ratio 4, ε 1e-6).
pub fn hgrn2_config(hidden_size: usize, layers: usize, expand_ratio: usize) -> Config {
    let mut c = Variant::FoxLlama.config(hidden_size, layers, hidden_size / expand_ratio);
    c.model_type = HGRN2_MODEL_TYPE.into();
    // FoX's fields at their defaults (config.json leaves them out; see Config::to_json).
    (c.use_rope, c.qk_norm, c.use_output_norm) = (false, false, false);
    c.expand_ratio = Some(expand_ratio);
    c.use_lower_bound = Some(true);
    c.use_short_conv = Some(false);
    c.conv_size = Some(4);
    c
}

/// `hgrn2-{125m,360m,760m}` (the authors' configs/experiment/longcrawl64/hgrn2: 12 layers of
/// d = 768, 24 of 1024, 24 of 1536, expand_ratio 128, their peak LRs and the 2.5Gi/7Gi/15Gi-token
/// runs), `hgrn2-small` (d = 384, 6 layers, 3 heads of 128, the small FoX's recipe) and
/// `hgrn2-tiny` (tiny's recipe, 2 heads of 32).
fn hgrn2(name: &str) -> Option<Preset> {
    let (d, layers, lr, tokens, micro) = match name.strip_prefix("hgrn2-")? {
        "125m" => (768, 12, 2e-3, 2560 * MI, 2),
        "360m" => (1024, 24, 2e-3, 7168 * MI, 1),
        "760m" => (1536, 24, 1e-3, 15360 * MI, 1),
        "tiny" => {
            let what =
                "HGRN2, d=64, 4 layers, 2 heads of 32, context 128, 500 steps of 8 windows: trains on a 2-core CPU";
            return Some(tiny().renamed(name, hgrn2_config(64, 4, 32), what.into()));
        }
        "small" => return small_recipe(name, hgrn2_config(384, 6, 128), "HGRN2: d=384, 6 layers, 3 heads of 128"),
        _ => return None,
    };
    Some(Preset {
        name: name.into(),
        description: format!(
            "HGRN2 {}: {layers} layers of d={d}, {} heads of 128; the paper's recipe ({tokens} tokens, peak LR {lr})",
            name.trim_start_matches("hgrn2-").to_uppercase(),
            d / 128
        ),
        model: hgrn2_config(d, layers, 128),
        train: paper_train(lr, tokens, micro),
    })
}

/// The Samba presets: the authors' 760M, the FoX sizes below it, and the small experiment's.
pub const SAMBA: [&str; 4] = ["samba-125m", "samba-360m", "samba-760m", "samba-small"];

/// A Samba model in the authors' configuration (their configs/model/samba.py with
/// configs/experiment/longcrawl64/samba/760m_16b.yaml): Mamba layers of expand 2, state 16,
/// conv width 4 and dt rank ceil(d/16), alternating (from layer 0) with sliding-window RoPE
/// attention layers (`attn.layers` null: the odd ones) of `heads` heads; SwiGLU MLPs of ratio 4
/// after attention and 3 after Mamba; ε 1e-5, RoPE θ 500000, the residual outputs rescaled at
/// initialisation.
pub fn samba_config(hidden_size: usize, layers: usize, heads: usize, window: usize) -> Config {
    let mut c = Variant::FoxLlama.config(hidden_size, layers, heads);
    c.model_type = SAMBA_MODEL_TYPE.into();
    c.num_heads = 0;
    c.fgate_type = FgateType::Full; // not a Samba field: absent from its config.json (the default)
    c.hidden_ratio = None;
    c.norm_eps = 1e-5;
    c.hidden_act = "silu".into();
    c.attn = Some(SambaAttn {
        num_heads: heads,
        num_kv_heads: None,
        window_size: Some(window),
        layers: None,
        extra: Default::default(),
    });
    (c.attn_hidden_ratio, c.mamba_hidden_ratio) = (Some(4.0), Some(3.0));
    (c.state_size, c.expand, c.conv_kernel, c.use_conv_bias) = (Some(16), Some(2), Some(4), Some(true));
    c.intermediate_size = Some(2 * hidden_size); // SambaConfig writes the Mamba width under this name
    c.time_step_rank = Some("auto".into());
    (c.time_step_min, c.time_step_max, c.time_step_floor) = (Some(0.001), Some(0.1), Some(1e-4));
    c.extra.insert("time_step_scale".into(), 1.0.into());
    c.extra.insert("time_step_init_scheme".into(), "random".into());
    c.extra.insert("use_bias".into(), false.into());
    c.extra.insert("rescale_prenorm_residual".into(), true.into());
    c
}

/// `samba-760m` is the authors' only Samba (760m_16b: d = 1536, 24 layers, attention 12 heads of
/// 128, window 2048, peak LR 1e-3, 15Gi tokens). `samba-125m` and `samba-360m` are not theirs:
/// they take FoX's d and layer counts at those sizes (768 × 12, 1024 × 24) with attention heads
/// of 128 as in the 760M, window 2048, and FoX's peak LR 2e-3 and token budgets there.
/// `samba-small` (experiments/small-scale): d = 384, 6 layers (3 Mamba, 3 attention of 6 heads of
/// 64, the small FoX's heads), within 0.6% of the small FoX (LLaMA)'s parameter count, and its
/// recipe; its window is 512, a quarter of the 2048-token context, so that the window binds as
/// the paper's 2048 does at 16384 (a window of 2048 at this context would be full attention).
fn samba(name: &str) -> Option<Preset> {
    let (d, layers, heads, lr, tokens, micro) = match name {
        "samba-125m" => (768, 12, 6, 2e-3, 2560 * MI, 2),
        "samba-360m" => (1024, 24, 8, 2e-3, 7168 * MI, 1),
        "samba-760m" => (1536, 24, 12, 1e-3, 15360 * MI, 1),
        "samba-small" => {
            let what = "Samba: d=384, 6 layers (3 Mamba of state 16, 3 attention of 6 heads of 64, window 512)";
            return small_recipe(name, samba_config(384, 6, 6, 512), what);
        }
        _ => return None,
    };
    let origin =
        if name == "samba-760m" { "the authors' 760m_16b" } else { "scaled like FoX's sizes, not the authors'" };
    Some(Preset {
        name: name.into(),
        description: format!(
            "Samba {}: {layers} layers of d={d} (Mamba state 16 / attention {heads} heads of 128, window 2048), \
             {origin}; the paper's recipe ({tokens} tokens, peak LR {lr})",
            name.trim_start_matches("samba-").to_uppercase()
        ),
        model: samba_config(d, layers, heads, 2048),
        train: paper_train(lr, tokens, micro),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Model;

    /// The Mamba-2 presets are the authors' experiment configs (configs/experiment/longcrawl64/
    /// mamba2/*.yaml: d, layers, heads of 64, state 128, peak LR, tokens).
    #[test]
    fn mamba2_presets_follow_the_authors() {
        for (name, d, layers, lr, gi) in [
            ("mamba2-125m", 768, 24, 2e-3, 2.5),
            ("mamba2-360m", 1024, 48, 2e-3, 7.0),
            ("mamba2-760m", 1536, 48, 1e-3, 15.0),
        ] {
            let p = preset(name).unwrap();
            let m = p.model.mamba2();
            assert_eq!(p.model.arch(), crate::config::Arch::Mamba2, "{name}");
            assert_eq!((p.model.hidden_size, p.model.num_hidden_layers, m.heads), (d, layers, 2 * d / 64), "{name}");
            assert_eq!((m.head_dim, m.state, m.groups, m.conv, m.expand), (64, 128, 1, 4, 2), "{name}");
            assert_eq!(p.train.peak_lr, lr, "{name}");
            assert_eq!(p.train.total_tokens, (gi * 1024.0) as u64 * MI, "{name}");
        }
        // 24 × (norm 768 + in_proj 768·3352 + conv 1792·(4 + 1) + dt_bias, A_log, D 3·24 + norm
        // 1536 + out_proj 1536·768) + the embedding, the head and the final norm.
        let p = preset("mamba2-125m").unwrap();
        assert_eq!(p.model.param_bytes() / 4, 167_563_200);
        assert_eq!(Model::new(&p.model).params.numel(), 167_563_200);
        let t = preset("mamba2-tiny").unwrap();
        assert_eq!((t.model.hidden_size, t.model.num_hidden_layers, t.model.state_size), (64, 4, Some(32)));
        assert_eq!(t.train.context, tiny().train.context);
    }

    /// The DeltaNet presets are the authors' experiment configs (configs/experiment/longcrawl64/
    /// delta_net/*.yaml: d, layers, heads, peak LR, tokens; configs/model/delta_net.py: expand_k
    /// and expand_v 1, no output gate, MLP ratio 4); Gated DeltaNet's have the same heads with
    /// fla's output gate and decay; the small ones match the small FoX's parameter count.
    #[test]
    fn deltanet_presets_follow_the_authors() {
        for (size, d, layers, heads, lr, gi) in
            [("125m", 768, 12, 6, 2e-3, 2.5), ("360m", 1024, 24, 8, 2e-3, 7.0), ("760m", 1536, 24, 12, 1e-3, 15.0)]
        {
            for gated in [false, true] {
                let name = format!("{}deltanet-{size}", if gated { "gated-" } else { "" });
                let p = preset(&name).unwrap();
                let s = p.model.deltanet();
                assert!(p.model.is_deltanet() && s.gated == gated, "{name}");
                assert_eq!((p.model.hidden_size, p.model.num_hidden_layers, s.heads), (d, layers, heads), "{name}");
                assert_eq!((s.head_k, s.head_v, s.conv, s.use_gate), (128, 128, 4, gated), "{name}");
                assert_eq!(p.model.intermediate(), crate::config::mlp_width(d, 4.0), "{name}");
                assert_eq!(p.train.peak_lr, lr, "{name}");
                assert_eq!(p.train.total_tokens, (gi * 1024.0) as u64 * MI, "{name}");
            }
        }
        // 12 × (norms 2·768 + q, k, v, o 4·768² + b_proj 6·768 + convolutions 3·768·4 + o_norm
        // 128 + MLP 3·768·2048) + the embedding, the head and the final norm.
        let p = preset("deltanet-125m").unwrap();
        let per_layer = 2 * 768 + 4 * 768 * 768 + 6 * 768 + 3 * 768 * 4 + 128 + 3 * 768 * 2048;
        let want = 12 * per_layer + 2 * GPT2_VOCAB * 768 + 768;
        assert_eq!(p.model.param_bytes() / 4, want as u128);
        assert_eq!(Model::new(&p.model).params.numel(), want);
        let fox = preset("fox-llama-small").unwrap().model.param_bytes();
        for n in ["deltanet-small", "gated-deltanet-small"] {
            let p = preset(n).unwrap();
            let rel = (p.model.param_bytes() as f64 - fox as f64).abs() / fox as f64;
            assert!(rel < if n.starts_with("gated") { 0.05 } else { 0.005 }, "{n}: {rel}");
            assert_eq!(p.train.total_tokens, preset("fox-llama-small").unwrap().train.total_tokens);
        }
        let t = preset("gated-deltanet-tiny").unwrap();
        assert_eq!((t.model.hidden_size, t.model.num_hidden_layers, t.model.deltanet().head_k), (64, 4, 32));
        assert_eq!(t.train.context, tiny().train.context);
    }

    /// The HGRN2 presets are the authors' experiment configs (configs/experiment/longcrawl64/
    /// hgrn2/*.yaml: d, layers, expand_ratio 128, peak LR, tokens, micro-batches from
    /// grad_acc_tokens; configs/model/hgrn2.py: no short convolutions, lower bounds, MLP ratio 4).
    #[test]
    fn hgrn2_presets_follow_the_authors() {
        for (size, d, layers, lr, gi, micro) in
            [("125m", 768, 12, 2e-3, 2.5, 2), ("360m", 1024, 24, 2e-3, 7.0, 1), ("760m", 1536, 24, 1e-3, 15.0, 1)]
        {
            let name = format!("hgrn2-{size}");
            let p = preset(&name).unwrap();
            let s = p.model.hgrn2();
            assert_eq!(p.model.arch(), crate::config::Arch::Hgrn2, "{name}");
            assert_eq!(
                (p.model.hidden_size, p.model.num_hidden_layers, s.head_dim, s.heads),
                (d, layers, 128, d / 128)
            );
            assert!(s.lower_bound && p.model.use_short_conv == Some(false), "{name}");
            assert_eq!(p.model.intermediate(), crate::config::mlp_width(d, 4.0), "{name}");
            assert_eq!(p.train.peak_lr, lr, "{name}");
            assert_eq!(p.train.total_tokens, (gi * 1024.0) as u64 * MI, "{name}");
            assert_eq!(p.train.micro_batch, micro, "{name}"); // grad_acc_tokens / 16384
        }
        // 12 × (norms 3·768 + q, f, i, o 4·768² + MLP 3·768·2048) + lower bounds 12·768 + the
        // embedding, the head and the final norm.
        let p = preset("hgrn2-125m").unwrap();
        let want = 12 * (3 * 768 + 4 * 768 * 768 + 3 * 768 * 2048) + 12 * 768 + 2 * GPT2_VOCAB * 768 + 768;
        assert_eq!(p.model.param_bytes() / 4, want as u128);
        assert_eq!(Model::new(&p.model).params.numel(), want);
        let small = preset("hgrn2-small").unwrap();
        let fox = preset("fox-llama-small").unwrap();
        let rel =
            (small.model.param_bytes() as f64 - fox.model.param_bytes() as f64).abs() / fox.model.param_bytes() as f64;
        assert!(rel < 0.005, "hgrn2-small: {rel}");
        assert_eq!(small.train.total_tokens, fox.train.total_tokens);
        let t = preset("hgrn2-tiny").unwrap();
        assert_eq!((t.model.hidden_size, t.model.num_hidden_layers, t.model.hgrn2().head_dim), (64, 4, 32));
        assert_eq!(t.train.context, tiny().train.context);
    }

    #[test]
    fn every_preset_is_valid_and_sized_as_in_the_paper() {
        for n in names() {
            let p = preset(&n).unwrap();
            p.model.validate().unwrap();
            p.train.validate().unwrap();
            // the paper's sizes; tiny is a CPU model of its own (head_dim 32); Samba's attention
            // heads are 128 wide (64 in samba-small, as the small FoX's)
            if n.starts_with("samba") {
                assert_eq!(p.model.head_dim(), if n == "samba-small" { 64 } else { 128 }, "{n}");
            } else if n.contains("deltanet") || n.starts_with("hgrn2") {
                // the authors' DeltaNet and HGRN2 heads of 128; the tiny ones' of 32
                assert_eq!(p.model.head_dim(), if n.ends_with("-tiny") { 32 } else { 128 }, "{n}");
            } else if n != "tiny" {
                assert_eq!(
                    p.model.head_dim(),
                    if n.starts_with("transformer") && n.contains("760m") { 128 } else { 64 },
                    "{n}"
                );
            }
        }
        let p = preset("fox-pro-125m").unwrap();
        assert_eq!(p.train.batch_size * p.train.context, 512 * 1024);
        assert_eq!(p.train.warmup_tokens, 256 << 20);
        assert!(p.model.use_k_shift && p.model.qk_norm && !p.model.use_rope);
        let t = preset("transformer-llama-360m").unwrap();
        assert!(t.model.use_rope && t.model.fgate_type == FgateType::None && !t.model.qk_norm);
        assert_eq!(t.model.num_hidden_layers, 24);
        assert!(preset("fox-pro-1b").is_err() && preset("gpt-125m").is_err());
        assert!(preset("fox-pro-norope-small").is_err() && preset("small").is_err());
    }

    #[test]
    fn main_run_presets_carry_the_authors_48b_learning_rates() {
        // Peak LRs of configs/experiment/longcrawl64/{forgetting_transformer,transformer}/
        // {llama,pro}_760m_48b.yaml; max_tokens 48318382080 there.
        for (name, lr, heads, fox, pro) in [
            ("fox-llama-760m-48b", 1e-3, 24, true, false),
            ("fox-pro-760m-48b", 2e-3, 24, true, true),
            ("transformer-llama-760m-48b", 5e-4, 12, false, false),
            ("transformer-pro-760m-48b", 1e-3, 12, false, true),
        ] {
            let p = preset(name).unwrap();
            assert!(names().contains(&name.to_string()), "{name}");
            assert_eq!(p.name, name);
            assert_eq!(p.train.peak_lr, lr, "{name}");
            assert_eq!(p.train.total_tokens, 48_318_382_080, "{name}");
            assert_eq!((p.train.context, p.train.batch_size, p.train.warmup_tokens), (16384, 32, 256 << 20), "{name}");
            let m = &p.model;
            assert_eq!((m.hidden_size, m.num_hidden_layers, m.num_heads), (1536, 24, heads), "{name}");
            assert_eq!((m.fgate_type == FgateType::Full, m.use_rope), (fox, !fox), "{name}");
            assert_eq!(m.use_k_shift && m.use_v_shift && m.qk_norm && m.use_output_gate && m.use_output_norm, pro);
            assert_eq!(m.hidden_ratio, Some(if pro { 3.5 } else { 4.0 }), "{name}");
            // the same model as the 16B ablation preset, trained three times longer
            let ablation = preset(name.strip_suffix("-48b").unwrap()).unwrap();
            assert_eq!(&ablation.model, m, "{name}");
            assert_eq!(ablation.train.total_tokens, 16_106_127_360, "{name}");
            assert!(ablation.description.contains("16B-token ablation") && ablation.description.contains(name));
            assert!(p.description.contains("main run") && p.description.contains(&format!("peak LR {lr}")));
        }
        assert!(preset("fox-pro-360m-48b").is_err() && preset("fox-760m-48b").is_err());
    }

    #[test]
    fn small_presets_are_sized_for_the_experiment() {
        let mut counts = vec![];
        for n in SMALL {
            let p = preset(n).unwrap();
            assert_eq!(p.name, n);
            p.model.validate().unwrap();
            p.train.validate().unwrap();
            // Counting the embedding and the head, from the parameter layout.
            let params: usize = p.model.param_layout().iter().map(|(_, s)| s.iter().product::<usize>()).sum();
            assert!((20_000_000..=50_000_000).contains(&params), "{n}: {params} parameters");
            assert_eq!(Model::new(&p.model).params.numel(), params, "{n}");
            counts.push(params);
            assert_eq!((p.model.head_dim(), p.model.hidden_size, p.model.num_hidden_layers), (64, 384, 6), "{n}");
            assert_eq!((p.train.context, p.train.batch_size * p.train.context), (2048, 65536), "{n}");
            assert_eq!(p.train.total_tokens, 1536 * 65536, "{n}");
            assert_eq!(p.train.warmup_tokens, 153 * 65536, "{n}");
            assert_eq!((p.train.peak_lr, p.train.min_lr), (2e-3, 0.0), "{n}");
            let fox = n.starts_with("fox");
            assert_eq!(p.model.fgate_type != FgateType::None, fox, "{n}");
            assert_eq!(p.model.use_rope, !fox && !n.contains("norope"), "{n}");
            assert_eq!(p.model.use_k_shift && p.model.qk_norm && p.model.use_output_gate, n.contains("-pro-"), "{n}");
        }
        // Parameter-matched: every model within 0.5% of FoX (Pro).
        for (n, c) in SMALL.iter().zip(&counts) {
            let rel = (*c as f64 - counts[0] as f64).abs() / counts[0] as f64;
            assert!(rel < 0.005, "{n}: {c} against {}", counts[0]);
        }
        let b = preset("fox-llama-biasonly-small").unwrap().model;
        assert!(b.fgate_type == FgateType::BiasOnly && b.fgate_bias_init);
        assert_eq!((b.decay_time_min, b.decay_time_max), (Some(2.0), Some(2048.0)));
        let f = preset("fox-llama-fixed-small").unwrap().model;
        assert_eq!((f.fgate_type, f.decay_time_min, f.decay_time_max), (FgateType::Fixed, Some(2.0), Some(2048.0)));
        let t = preset("transformer-llama-norope-small").unwrap().model;
        assert!(!t.use_rope && t.fgate_type == FgateType::None);
    }

    #[test]
    fn parameter_counts() {
        // The FoX (LLaMA) 125M: 12 blocks of 4d² attention + 3·d·I MLP (I = 2048), plus embeddings.
        let m = Model::new(&preset("fox-llama-125m").unwrap().model);
        let d = 768usize;
        let blocks = 12 * (4 * d * d + 3 * d * 2048 + 12 * d + 12 + 2 * d);
        assert_eq!(m.params.numel(), blocks + 2 * 50257 * d + d);
        let tiny = Model::new(&tiny().model);
        assert!(tiny.params.numel() < 7_000_000, "{}", tiny.params.numel());
    }
}
