//! The model configuration, in the authors' Hugging Face `config.json` format.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const MODEL_TYPE: &str = "forgetting_transformer-project_fox";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FgateType {
    /// a = logsigmoid(fgate_proj(x)): the data-dependent FoX gate.
    Full,
    /// a = logsigmoid(b_h), a learned per-head bias.
    BiasOnly,
    /// As bias_only, not learned; b_h from decay times (ALiBi-like).
    Fixed,
    /// a = 0: plain softmax attention.
    None,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Config {
    #[serde(default = "default_model_type")]
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_heads: usize,
    #[serde(default)]
    pub num_kv_heads: Option<usize>,
    #[serde(default)]
    pub hidden_ratio: Option<f64>,
    #[serde(default)]
    pub intermediate_size: Option<usize>,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default = "default_norm_eps")]
    pub norm_eps: f64,
    #[serde(default)]
    pub use_rope: bool,
    #[serde(default = "default_rope_base")]
    pub rope_base: f64,
    #[serde(default = "default_fgate")]
    pub fgate_type: FgateType,
    #[serde(default)]
    pub fgate_bias_init: bool,
    #[serde(default)]
    pub decay_time_min: Option<f64>,
    #[serde(default)]
    pub decay_time_max: Option<f64>,
    #[serde(default)]
    pub use_output_gate: bool,
    #[serde(default = "default_ogate_act")]
    pub ogate_act: String,
    #[serde(default)]
    pub use_output_norm: bool,
    #[serde(default)]
    pub qk_norm: bool,
    #[serde(default)]
    pub qk_norm_share_param_across_head: bool,
    #[serde(default)]
    pub use_k_shift: bool,
    #[serde(default)]
    pub use_v_shift: bool,
    #[serde(default)]
    pub log_pruning_tolerance: Option<f64>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub window_size: Option<usize>,
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    #[serde(default)]
    pub eos_token_id: Option<u32>,
    #[serde(default = "default_init_range")]
    pub initializer_range: f64,
    /// Everything else in config.json (kept so a round trip preserves it).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

fn default_model_type() -> String {
    MODEL_TYPE.into()
}
fn default_act() -> String {
    "swish".into()
}
fn default_norm_eps() -> f64 {
    1e-6
}
fn default_rope_base() -> f64 {
    500000.0
}
fn default_fgate() -> FgateType {
    FgateType::Full
}
fn default_ogate_act() -> String {
    "sigmoid".into()
}
fn default_init_range() -> f64 {
    0.02
}

/// QK-norm's epsilon in the reference implementation (its RMSNorm default), not `norm_eps`.
pub const QK_NORM_EPS: f32 = 1e-5;

impl Config {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let de = &mut serde_json::Deserializer::from_str(&text);
        let cfg: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let field = e.path().to_string();
            let inner = e.into_inner();
            if field == "." || field.is_empty() {
                anyhow::anyhow!("{}: not a valid FoX config.json: {inner}", path.display())
            } else {
                anyhow::anyhow!("{}: field {field}: {inner}", path.display())
            }
        })?;
        cfg.validate().with_context(|| format!("{}: invalid configuration", path.display()))?;
        Ok(cfg)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("config serialises")
    }

    pub fn validate(&self) -> Result<()> {
        if self.model_type != MODEL_TYPE {
            bail!("model_type is {:?}; foxlm reads {MODEL_TYPE:?}", self.model_type);
        }
        if self.hidden_size == 0 || self.num_heads == 0 || self.hidden_size % self.num_heads != 0 {
            bail!("hidden_size {} must be a positive multiple of num_heads {}", self.hidden_size, self.num_heads);
        }
        if self.head_dim() % 2 != 0 && self.use_rope {
            bail!("head_dim {} must be even for RoPE", self.head_dim());
        }
        if self.vocab_size == 0 || self.num_hidden_layers == 0 {
            bail!("vocab_size and num_hidden_layers must be positive");
        }
        if let Some(kv) = self.num_kv_heads {
            if kv != self.num_heads {
                bail!("num_kv_heads {kv}: grouped-query attention is not supported (must be null)");
            }
        }
        if self.window_size.is_some() {
            bail!("window_size: sliding-window attention is not supported (must be null)");
        }
        if self.hidden_act != "swish" && self.hidden_act != "silu" {
            bail!("hidden_act {:?}: only \"swish\" is supported", self.hidden_act);
        }
        if self.ogate_act != "sigmoid" {
            bail!("ogate_act {:?}: only \"sigmoid\" is supported", self.ogate_act);
        }
        if self.tie_word_embeddings {
            bail!("tie_word_embeddings: FoX models have an untied output head (must be false)");
        }
        if self.fgate_type == FgateType::Fixed && (self.decay_time_min.is_none() || self.decay_time_max.is_none()) {
            bail!("fgate_type \"fixed\" needs decay_time_min and decay_time_max");
        }
        if let Some(r) = self.hidden_ratio {
            if !(r > 0.0) {
                bail!("hidden_ratio {r} must be positive");
            }
        }
        if !(self.norm_eps > 0.0) {
            bail!("norm_eps {} must be positive", self.norm_eps);
        }
        Ok(())
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// intermediate_size if given, else int(d · hidden_ratio · 2/3) rounded up to a multiple of 256.
    pub fn intermediate(&self) -> usize {
        if let Some(i) = self.intermediate_size {
            return i;
        }
        let r = self.hidden_ratio.unwrap_or(4.0);
        let i = (self.hidden_size as f64 * r * 2.0 / 3.0) as usize;
        i.div_ceil(256) * 256
    }

    /// Training context length recorded by `foxlm train` (an extra key the reference ignores).
    pub fn train_context(&self) -> Option<usize> {
        self.extra.get("foxlm_train_context").and_then(|v| v.as_u64()).map(|v| v as usize)
    }
}
