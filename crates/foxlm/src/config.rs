//! The model configuration, in the authors' Hugging Face `config.json` format.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const MODEL_TYPE: &str = "forgetting_transformer-project_fox";
/// The authors' Mamba-2 baseline (a Hugging Face Mamba2 with `backbone.*` tensor names).
pub const MAMBA2_MODEL_TYPE: &str = "mamba2-project_fox";
/// The authors' Samba baseline (Mamba layers alternating with sliding-window attention).
pub const SAMBA_MODEL_TYPE: &str = "samba-project_fox";
/// fla's DeltaNet (`DeltaNetForCausalLM`, `model.*` tensor names as FoX's).
pub const DELTANET_MODEL_TYPE: &str = "delta_net";
/// fla's Gated DeltaNet (`GatedDeltaNetForCausalLM`).
pub const GATED_DELTANET_MODEL_TYPE: &str = "gated_deltanet";
/// fla's HGRN2 (`HGRN2ForCausalLM`, `model.*` tensor names as FoX's, `model.lower_bounds`).
pub const HGRN2_MODEL_TYPE: &str = "hgrn2";
/// The epsilon of HGRN2's output norm: fla's layer calls `rms_norm_linear` without one, whose
/// default is 1e-5 (not the config's norm_eps, which only the block norms use).
pub const HGRN2_G_NORM_EPS: f32 = 1e-5;

/// Which model a config.json describes, from its `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// FoX and the Transformer: attention blocks with an MLP.
    Fox,
    /// Mamba-2 (SPEC §7): blocks of a Mamba-2 mixer alone, no MLP.
    Mamba2,
    /// Samba (SPEC §7): Mamba layers (even indices) and sliding-window attention layers (odd),
    /// each block with its SwiGLU MLP.
    Samba,
    /// DeltaNet (SPEC §7): delta-rule blocks with FoX's SwiGLU MLP and block norms.
    DeltaNet,
    /// Gated DeltaNet: DeltaNet with a scalar decay per head and token.
    GatedDeltaNet,
    /// HGRN2 (SPEC §7): gated linear attention with a per-channel forget gate bounded below by
    /// a model-level lower bound per layer, FoX's SwiGLU MLP and block norms.
    Hgrn2,
}

/// Samba's `attn` dict: its attention layers' heads and window, and which layers they are.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SambaAttn {
    pub num_heads: usize,
    #[serde(default)]
    pub num_kv_heads: Option<usize>,
    /// The query at position i sees keys i − w < j ≤ i; null: every earlier key.
    #[serde(default)]
    pub window_size: Option<usize>,
    /// null: the odd layers are attention (the only form the authors' code builds).
    #[serde(default)]
    pub layers: Option<serde_json::Value>,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

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
    /// Attention (or Mamba-2 SSM) heads; absent in Samba configs (their heads are `attn`'s).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub num_heads: usize,
    /// Grouped-query attention: k/v heads, a divisor of num_heads (query head h reads k/v head
    /// h / (num_heads / num_kv_heads)); k_proj and v_proj have num_kv_heads·head_dim outputs.
    /// null: num_heads (multi-head attention).
    #[serde(default)]
    pub num_kv_heads: Option<usize>,
    #[serde(default)]
    pub hidden_ratio: Option<f64>,
    #[serde(default)]
    pub intermediate_size: Option<usize>,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// `layer_norm_epsilon` in the authors' Mamba-2 configs.
    #[serde(default = "default_norm_eps", alias = "layer_norm_epsilon")]
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
    /// FoX: RMSNorm on q and k. In a DeltaNet config fla's string "l2" (read as true; the only
    /// normalisation foxlm's DeltaNet implements).
    #[serde(default, deserialize_with = "bool_or_l2")]
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
    /// Sliding-window attention (the paper's SWA baseline, Appendix F.4): the query at position i
    /// sees keys i − w < j ≤ i. null: every earlier key. `window_size` is the authors' name (and
    /// what foxlm writes); `sliding_window` is accepted too.
    #[serde(default, alias = "sliding_window")]
    pub window_size: Option<usize>,
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    #[serde(default)]
    pub eos_token_id: Option<u32>,
    #[serde(default = "default_init_range")]
    pub initializer_range: f64,
    // Mamba-2 (the authors' Mamba2Config names; absent in FoX configs). `num_heads` is then the
    // number of SSM heads.
    /// Channels per SSM head P (config.json `head_dim`).
    #[serde(default, rename = "head_dim", skip_serializing_if = "Option::is_none")]
    pub ssm_head_dim: Option<usize>,
    /// State size N per head.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_size: Option<usize>,
    /// The mixer's inner width is expand · hidden_size = num_heads · head_dim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expand: Option<usize>,
    /// Width of the causal depthwise convolution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conv_kernel: Option<usize>,
    /// Groups of B and C (heads per group share them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_groups: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_conv_bias: Option<bool>,
    /// The range of dt at initialisation (log-uniform) and its floor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_step_min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_step_max: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_step_floor: Option<f64>,
    // Samba (the authors' SambaConfig names; absent in other configs).
    /// The attention layers' heads, window and placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn: Option<SambaAttn>,
    /// MLP width ratios of attention blocks and of Mamba blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attn_hidden_ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mamba_hidden_ratio: Option<f64>,
    /// dt's low rank R: "auto" (ceil(hidden_size / 16)) or a number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_step_rank: Option<serde_json::Value>,
    // DeltaNet and Gated DeltaNet (fla's DeltaNetConfig / GatedDeltaNetConfig names; absent in
    // other configs). Gated DeltaNet's key head width is `head_dim` (above).
    /// DeltaNet: key_dim = expand_k · hidden_size, value_dim = expand_v · hidden_size; Gated
    /// DeltaNet: a value head is expand_v · head_dim wide.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expand_k: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expand_v: Option<f64>,
    /// The output gate: o_norm(o, g_proj(x)) = RMSNorm(o)·w·SiLU(g).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_gate: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_short_conv: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conv_size: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_beta: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qk_activation: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_neg_eigval: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_v_heads: Option<usize>,
    // HGRN2 (fla's HGRN2Config names; absent in other configs). `use_short_conv` and `conv_size`
    // are DeltaNet's fields above.
    /// A head's width (q, the gate and k per head; v's head is hidden_size / num_heads, the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expand_ratio: Option<usize>,
    /// The model-level lower bounds of the forget gates (`model.lower_bounds` [L, d]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_lower_bound: Option<bool>,
    /// Everything else in config.json (kept so a round trip preserves it).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// FoX's boolean `qk_norm`, or DeltaNet's string: "l2" reads as true; any other string is refused.
fn bool_or_l2<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum BoolOrName {
        Bool(bool),
        Name(String),
    }
    match BoolOrName::deserialize(d)? {
        BoolOrName::Bool(b) => Ok(b),
        BoolOrName::Name(n) if n == "l2" => Ok(true),
        BoolOrName::Name(n) => Err(serde::de::Error::custom(format!(
            "{n:?}: expected a boolean (FoX) or \"l2\" (DeltaNet: the only q/k normalisation supported)"
        ))),
    }
}

fn is_zero(v: &usize) -> bool {
    *v == 0
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

/// The sizes of a Mamba-2 mixer ([`Config::mamba2`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mamba2Sizes {
    /// SSM heads H, channels per head P, state size N, groups of B/C G, conv width W.
    pub heads: usize,
    pub head_dim: usize,
    pub state: usize,
    pub groups: usize,
    pub conv: usize,
    pub expand: usize,
    /// Inner width H·P (= expand · hidden_size).
    pub inner: usize,
    pub conv_bias: bool,
    pub dt_min: f64,
    pub dt_max: f64,
    pub dt_floor: f64,
}

impl Mamba2Sizes {
    /// Channels of the convolution: x, B and C.
    pub fn conv_dim(&self) -> usize {
        self.inner + 2 * self.groups * self.state
    }

    /// in_proj's outputs: z, xBC and dt.
    pub fn in_proj_dim(&self) -> usize {
        self.dt_offset() + self.heads
    }

    /// dt's first column in in_proj's output (after z and xBC).
    pub fn dt_offset(&self) -> usize {
        self.inner + self.conv_dim()
    }

    /// The mixer's tensors under `prefix` (e.g. `backbone.layers.0.mixer`), in the model's order.
    pub fn mixer_layout(&self, prefix: &str, d: usize) -> Vec<(String, Vec<usize>)> {
        let mut out = vec![
            (format!("{prefix}.in_proj.weight"), vec![self.in_proj_dim(), d]),
            (format!("{prefix}.conv1d.weight"), vec![self.conv_dim(), 1, self.conv]),
        ];
        if self.conv_bias {
            out.push((format!("{prefix}.conv1d.bias"), vec![self.conv_dim()]));
        }
        for name in ["dt_bias", "A_log", "D"] {
            out.push((format!("{prefix}.{name}"), vec![self.heads]));
        }
        out.push((format!("{prefix}.norm.weight"), vec![self.inner]));
        out.push((format!("{prefix}.out_proj.weight"), vec![d, self.inner]));
        out
    }
}

/// The sizes of a DeltaNet or Gated DeltaNet layer ([`Config::deltanet`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeltaNetSizes {
    /// Gated DeltaNet (a_proj, A_log, dt_bias: the decay).
    pub gated: bool,
    /// Heads H, a head's key width K (q and k) and value width V.
    pub heads: usize,
    pub head_k: usize,
    pub head_v: usize,
    /// The short convolutions' width.
    pub conv: usize,
    /// The output gate g_proj (o_norm(o, g) = RMSNorm(o)·w·SiLU(g)).
    pub use_gate: bool,
    /// The output norm's epsilon.
    pub eps: f64,
}

impl DeltaNetSizes {
    /// q's and k's width H·K.
    pub fn key_dim(&self) -> usize {
        self.heads * self.head_k
    }
    /// v's width H·V.
    pub fn value_dim(&self) -> usize {
        self.heads * self.head_v
    }

    /// The layer's tensors under `prefix` (e.g. `model.layers.0.attn`), in the model's order
    /// (fla's module order).
    pub fn mixer_layout(&self, prefix: &str, d: usize) -> Vec<(String, Vec<usize>)> {
        let (k, v, h, w) = (self.key_dim(), self.value_dim(), self.heads, self.conv);
        let mut out = vec![
            (format!("{prefix}.q_proj.weight"), vec![k, d]),
            (format!("{prefix}.k_proj.weight"), vec![k, d]),
            (format!("{prefix}.v_proj.weight"), vec![v, d]),
        ];
        if self.gated {
            out.push((format!("{prefix}.a_proj.weight"), vec![h, d]));
        }
        out.push((format!("{prefix}.b_proj.weight"), vec![h, d]));
        if self.gated {
            out.push((format!("{prefix}.A_log"), vec![h]));
            out.push((format!("{prefix}.dt_bias"), vec![h]));
        }
        out.push((format!("{prefix}.q_conv1d.weight"), vec![k, 1, w]));
        out.push((format!("{prefix}.k_conv1d.weight"), vec![k, 1, w]));
        out.push((format!("{prefix}.v_conv1d.weight"), vec![v, 1, w]));
        if self.use_gate {
            out.push((format!("{prefix}.g_proj.weight"), vec![v, d]));
        }
        out.push((format!("{prefix}.o_norm.weight"), vec![self.head_v]));
        out.push((format!("{prefix}.o_proj.weight"), vec![d, v]));
        out
    }
}

/// The sizes of an HGRN2 layer ([`Config::hgrn2`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hgrn2Sizes {
    /// Heads H and a head's width (fla's expand_ratio: q, k, the gate and v alike); H · width
    /// is hidden_size.
    pub heads: usize,
    pub head_dim: usize,
    /// Whether the model has `model.lower_bounds`.
    pub lower_bound: bool,
    /// The short convolutions' width W (q, f and i each through a causal depthwise convolution,
    /// no bias, no activation) when use_short_conv; none without them (fla's default).
    pub conv: Option<usize>,
}

impl Hgrn2Sizes {
    /// The layer's tensors under `prefix` (e.g. `model.layers.0.attn`), in fla's module order.
    pub fn mixer_layout(&self, prefix: &str, d: usize) -> Vec<(String, Vec<usize>)> {
        let mut out = vec![
            (format!("{prefix}.q_proj.weight"), vec![d, d]),
            (format!("{prefix}.f_proj.weight"), vec![d, d]),
            (format!("{prefix}.i_proj.weight"), vec![d, d]),
        ];
        if let Some(w) = self.conv {
            for c in ["q", "f", "i"] {
                out.push((format!("{prefix}.{c}_conv1d.weight"), vec![d, 1, w]));
            }
        }
        out.push((format!("{prefix}.g_norm.weight"), vec![d]));
        out.push((format!("{prefix}.o_proj.weight"), vec![d, d]));
        out
    }
}

/// The sizes of a Mamba (selective SSM) mixer of Samba ([`Config::mamba`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MambaSizes {
    /// Inner width Di = expand · hidden_size, state size N, conv width W, dt's rank R.
    pub inner: usize,
    pub state: usize,
    pub conv: usize,
    pub dt_rank: usize,
    pub conv_bias: bool,
    /// dt at initialisation: log-uniform in [dt_min, dt_max], floored; dt_proj's weight
    /// U(±dt_scale/√R) ("random") or the constant dt_scale/√R ("constant").
    pub dt_min: f64,
    pub dt_max: f64,
    pub dt_floor: f64,
    pub dt_scale: f64,
    pub dt_init_random: bool,
}

impl MambaSizes {
    /// x_proj's outputs: [dt_low (R) | B (N) | C (N)].
    pub fn x_proj_dim(&self) -> usize {
        self.dt_rank + 2 * self.state
    }

    /// The mixer's tensors under `prefix`, in the model's order (the authors' module order).
    pub fn mixer_layout(&self, prefix: &str, d: usize) -> Vec<(String, Vec<usize>)> {
        let mut out = vec![(format!("{prefix}.conv1d.weight"), vec![self.inner, 1, self.conv])];
        if self.conv_bias {
            out.push((format!("{prefix}.conv1d.bias"), vec![self.inner]));
        }
        out.push((format!("{prefix}.in_proj.weight"), vec![2 * self.inner, d]));
        out.push((format!("{prefix}.x_proj.weight"), vec![self.x_proj_dim(), self.inner]));
        out.push((format!("{prefix}.dt_proj.weight"), vec![self.inner, self.dt_rank]));
        out.push((format!("{prefix}.dt_proj.bias"), vec![self.inner]));
        out.push((format!("{prefix}.A_log"), vec![self.inner, self.state]));
        out.push((format!("{prefix}.D"), vec![self.inner]));
        out.push((format!("{prefix}.out_proj.weight"), vec![d, self.inner]));
        out
    }
}

/// int(d · ratio · 2/3) rounded up to a multiple of 256 (the MLP width rule); saturating.
pub fn mlp_width(d: usize, ratio: f64) -> usize {
    let i = (d as f64 * ratio * 2.0 / 3.0) as usize;
    i.div_ceil(256).saturating_mul(256)
}

/// QK-norm's epsilon in the reference implementation (its RMSNorm default), not `norm_eps`.
pub const QK_NORM_EPS: f32 = 1e-5;

fn bound(field: &str, v: usize, max: usize) -> Result<()> {
    if v == 0 || v > max {
        bail!("{field} is {v}; expected 1 to {max}");
    }
    Ok(())
}

/// `Infinity`, `-Infinity` and `NaN` outside strings replaced by `null`.
fn non_finite_to_null(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let (mut in_str, mut escaped) = (false, false);
    let mut rest = text;
    while let Some(ch) = rest.chars().next() {
        if in_str {
            out.push(ch);
            rest = &rest[ch.len_utf8()..];
            match (escaped, ch) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        if let Some(word) = ["-Infinity", "Infinity", "NaN"].iter().find(|w| rest.starts_with(*w)) {
            out.push_str("null");
            rest = &rest[word.len()..];
            continue;
        }
        in_str = ch == '"';
        out.push(ch);
        rest = &rest[ch.len_utf8()..];
    }
    out
}

/// Bounds on config.json's sizes: generous (the largest released models are far inside them)
/// but small enough that every product of them is computed without overflow.
pub const MAX_VOCAB: usize = 1 << 24;
pub const MAX_HIDDEN: usize = 1 << 16;
pub const MAX_LAYERS: usize = 1 << 12;
pub const MAX_INTERMEDIATE: usize = 1 << 20;
pub const MAX_HIDDEN_RATIO: f64 = 64.0;
/// The largest sliding window (the GPU kernels index keys with 32-bit integers).
pub const MAX_WINDOW: usize = 1 << 30;
/// The smallest decay time T of the fixed gate: below it b = -ln(expm1(1/T)) underflows f32.
pub const MIN_DECAY_TIME: f64 = 0.01;

impl Config {
    pub fn load(path: &Path) -> Result<Self> {
        let text = crate::validate::read_text(path)?;
        // Python's json writes float("inf") as Infinity (Mamba-2's time_step_limit), which JSON
        // has no word for.
        let text = non_finite_to_null(&text);
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
        let mut v = serde_json::to_value(self).expect("config serialises");
        // FoX's switches, which the other families' configs (but Mamba-2's, whose fields are its
        // own) do not have; each family's own fields stay.
        const FOX_SWITCHES: [&str; 13] = [
            "num_kv_heads",
            "use_rope",
            "fgate_type",
            "fgate_bias_init",
            "decay_time_min",
            "decay_time_max",
            "use_output_gate",
            "ogate_act",
            "qk_norm_share_param_across_head",
            "use_k_shift",
            "use_v_shift",
            "log_pruning_tolerance",
            "window_size",
        ];
        let also: &[&str] = match self.arch() {
            Arch::Samba => &["hidden_ratio", "use_output_norm", "qk_norm"],
            // fla's DeltaNet takes qk_norm as a string (set below).
            Arch::DeltaNet | Arch::GatedDeltaNet => &["rope_base"],
            Arch::Hgrn2 => &["rope_base", "use_output_norm", "qk_norm"],
            Arch::Fox | Arch::Mamba2 => &[],
        };
        if !matches!(self.arch(), Arch::Fox | Arch::Mamba2) {
            if let Some(o) = v.as_object_mut() {
                for k in FOX_SWITCHES.iter().chain(also) {
                    o.remove(*k);
                }
                if self.is_deltanet() {
                    o.insert("qk_norm".into(), "l2".into());
                }
            }
        }
        if self.arch() == Arch::Mamba2 {
            // The authors' Mamba2Config reads the norm's epsilon under this name.
            if let Some(o) = v.as_object_mut() {
                o.remove("norm_eps");
                o.insert("layer_norm_epsilon".into(), self.norm_eps.into());
            }
        }
        serde_json::to_string_pretty(&v).expect("config serialises")
    }

    /// The model family, from `model_type` (validate() refuses any other).
    pub fn arch(&self) -> Arch {
        if self.model_type == MAMBA2_MODEL_TYPE {
            Arch::Mamba2
        } else if self.model_type == SAMBA_MODEL_TYPE {
            Arch::Samba
        } else if self.model_type == DELTANET_MODEL_TYPE {
            Arch::DeltaNet
        } else if self.model_type == GATED_DELTANET_MODEL_TYPE {
            Arch::GatedDeltaNet
        } else if self.model_type == HGRN2_MODEL_TYPE {
            Arch::Hgrn2
        } else {
            Arch::Fox
        }
    }

    /// DeltaNet or Gated DeltaNet.
    pub fn is_deltanet(&self) -> bool {
        matches!(self.arch(), Arch::DeltaNet | Arch::GatedDeltaNet)
    }

    /// A model of fla's whose checkpoints keep each MLP's gate_proj and up_proj apart (fla's
    /// GatedMLP): DeltaNet, Gated DeltaNet and HGRN2.
    pub fn fla_split_mlp(&self) -> bool {
        self.is_deltanet() || self.arch() == Arch::Hgrn2
    }

    /// Checks every field before anything is sized from it: bounds, consistency between fields,
    /// and that the parameter layout's size is computable (see [`Config::param_layout`]). Errors
    /// name the field, its value and what was expected.
    // The negated comparisons are deliberate: they reject NaN too.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    pub fn validate(&self) -> Result<()> {
        let known = [
            MODEL_TYPE,
            MAMBA2_MODEL_TYPE,
            SAMBA_MODEL_TYPE,
            DELTANET_MODEL_TYPE,
            GATED_DELTANET_MODEL_TYPE,
            HGRN2_MODEL_TYPE,
        ];
        if !known.contains(&self.model_type.as_str()) {
            bail!(
                "model_type is {:?}; foxlm reads {MODEL_TYPE:?}, {MAMBA2_MODEL_TYPE:?}, {SAMBA_MODEL_TYPE:?}, \
                 {DELTANET_MODEL_TYPE:?}, {GATED_DELTANET_MODEL_TYPE:?} and {HGRN2_MODEL_TYPE:?}",
                self.model_type
            );
        }
        bound("vocab_size", self.vocab_size, MAX_VOCAB)?;
        bound("hidden_size", self.hidden_size, MAX_HIDDEN)?;
        bound("num_hidden_layers", self.num_hidden_layers, MAX_LAYERS)?;
        match self.arch() {
            Arch::Fox => self.validate_fox()?,
            Arch::Mamba2 => self.validate_mamba2()?,
            Arch::Samba => self.validate_samba()?,
            Arch::DeltaNet | Arch::GatedDeltaNet => self.validate_deltanet()?,
            Arch::Hgrn2 => self.validate_hgrn2()?,
        }
        for (field, id) in [("bos_token_id", self.bos_token_id), ("eos_token_id", self.eos_token_id)] {
            if let Some(id) = id {
                if id as usize >= self.vocab_size {
                    bail!("{field} is {id}, outside the vocabulary of vocab_size {}", self.vocab_size);
                }
            }
        }
        let bytes = self.param_bytes();
        if bytes > isize::MAX as u128 {
            bail!(
                "the parameters would take {} (f32), more than any machine can address",
                crate::validate::human_bytes(bytes)
            );
        }
        Ok(())
    }

    /// FoX's and the Transformer's fields (the common sizes are checked by `validate`).
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    fn validate_fox(&self) -> Result<()> {
        bound("num_heads", self.num_heads, self.hidden_size)?;
        if !self.hidden_size.is_multiple_of(self.num_heads) {
            bail!("hidden_size {} must be a positive multiple of num_heads {}", self.hidden_size, self.num_heads);
        }
        if !self.head_dim().is_multiple_of(2) && self.use_rope {
            bail!("head_dim {} (hidden_size / num_heads) must be even for RoPE", self.head_dim());
        }
        if let Some(kv) = self.num_kv_heads {
            if kv == 0 || !self.num_heads.is_multiple_of(kv) {
                bail!("num_kv_heads is {kv}; expected a divisor of num_heads {} (or null)", self.num_heads);
            }
        }
        if let Some(w) = self.window_size {
            bound("window_size", w, MAX_WINDOW)?;
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
        if let Some(r) = self.hidden_ratio {
            if !(r > 0.0 && r <= MAX_HIDDEN_RATIO) {
                bail!("hidden_ratio is {r:?}; expected a number in (0, {MAX_HIDDEN_RATIO}]");
            }
        }
        match self.intermediate_size {
            Some(i) => bound("intermediate_size", i, MAX_INTERMEDIATE)?,
            None => {
                let i = self.intermediate();
                if i == 0 || i > MAX_INTERMEDIATE {
                    bail!(
                        "hidden_ratio {:?} with hidden_size {} gives an MLP width of {i}; expected 1 to {MAX_INTERMEDIATE}",
                        self.hidden_ratio.unwrap_or(4.0),
                        self.hidden_size
                    );
                }
            }
        }
        if !(self.norm_eps > 0.0 && self.norm_eps < 1.0) {
            bail!("norm_eps is {:?}; expected a number in (0, 1)", self.norm_eps);
        }
        if !(self.rope_base > 1.0 && self.rope_base.is_finite()) {
            bail!("rope_base is {:?}; expected a finite number > 1", self.rope_base);
        }
        if !(self.initializer_range >= 0.0 && self.initializer_range.is_finite()) {
            bail!("initializer_range is {:?}; expected a finite number >= 0", self.initializer_range);
        }
        if let Some(t) = self.log_pruning_tolerance {
            if !(t <= 0.0 && t.is_finite()) {
                bail!(
                    "log_pruning_tolerance is {t:?}; expected ln(eps) for a tolerance eps <= 1: a finite number <= 0"
                );
            }
        }
        if self.fgate_type == FgateType::Fixed && (self.decay_time_min.is_none() || self.decay_time_max.is_none()) {
            bail!("fgate_type \"fixed\" needs decay_time_min and decay_time_max");
        }
        match (self.decay_time_min, self.decay_time_max) {
            (Some(lo), Some(hi)) if !(lo >= MIN_DECAY_TIME && lo <= hi && hi.is_finite()) => bail!(
                "decay_time_min {lo:?} and decay_time_max {hi:?}: expected finite times with {MIN_DECAY_TIME} <= min <= max"
            ),
            (Some(t), None) | (None, Some(t)) if !(t >= MIN_DECAY_TIME && t.is_finite()) => {
                bail!("decay time {t:?}: expected a finite time >= {MIN_DECAY_TIME}")
            }
            _ => {}
        }
        Ok(())
    }

    /// DeltaNet's and Gated DeltaNet's fields (the common sizes are checked by `validate`): what
    /// fla's layers build that foxlm implements (short convolutions with SiLU, β, q/k L2 norm).
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    fn validate_deltanet(&self) -> Result<()> {
        bound("num_heads", self.num_heads, MAX_HIDDEN)?;
        let gated = self.arch() == Arch::GatedDeltaNet;
        for (field, v) in [("expand_k", self.expand_k), ("expand_v", self.expand_v)] {
            if let Some(r) = v {
                if !(r > 0.0 && r <= 16.0) {
                    bail!("{field} is {r:?}; expected a number in (0, 16]");
                }
            }
        }
        if gated {
            if self.expand_k.is_some() {
                bail!("expand_k: a Gated DeltaNet config gives its key head width in head_dim");
            }
            let hd = self.ssm_head_dim.unwrap_or(256);
            bound("head_dim", hd, MAX_HIDDEN)?;
            let v = hd as f64 * self.expand_v.unwrap_or(2.0);
            if v.fract() != 0.0 || v < 1.0 {
                bail!("head_dim {hd} × expand_v {:?} = {v} is not a whole value head width", self.expand_v);
            }
            if let Some(nv) = self.num_v_heads {
                if nv != self.num_heads {
                    bail!("num_v_heads is {nv}; only num_v_heads = num_heads ({}) is supported", self.num_heads);
                }
            }
        } else {
            if self.ssm_head_dim.is_some() || self.num_v_heads.is_some() {
                bail!("head_dim / num_v_heads: a DeltaNet config sizes its heads by expand_k and expand_v");
            }
            for (field, r) in [("expand_k", self.expand_k), ("expand_v", self.expand_v)] {
                let w = (self.hidden_size as f64 * r.unwrap_or(1.0)) as usize;
                if w == 0 || !w.is_multiple_of(self.num_heads) {
                    bail!(
                        "{field} {:?} × hidden_size {} = {w}: expected a positive multiple of num_heads {}",
                        r.unwrap_or(1.0),
                        self.hidden_size,
                        self.num_heads
                    );
                }
            }
        }
        let s = self.deltanet();
        bound("conv_size", s.conv, 64)?;
        bound("value head width", s.head_v, MAX_HIDDEN)?;
        let must = [
            ("use_short_conv", self.use_short_conv, true, "the short convolutions are always on"),
            ("use_beta", self.use_beta, true, "beta = sigmoid(b_proj(x)) is always on"),
            ("allow_neg_eigval", self.allow_neg_eigval, false, "beta in (0, 2) is not supported"),
        ];
        for (field, v, want, why) in must {
            if v.is_some_and(|v| v != want) {
                bail!("{field} is {}: {why}", !want);
            }
        }
        if let Some(a) = &self.qk_activation {
            if a != "silu" {
                bail!("qk_activation {a:?}: only \"silu\" is supported");
            }
        }
        if self.extra.get("conv_bias").and_then(|v| v.as_bool()) == Some(true) {
            bail!("conv_bias true: the short convolutions have no bias in fla's models");
        }
        if self.attn.is_some() {
            bail!("attn: hybrid DeltaNet models (attention layers among the DeltaNet layers) are not supported");
        }
        self.validate_fla_common("DeltaNet")
    }

    /// What fla's DeltaNet and HGRN2 configs check alike: none of FoX's switches on, SwiGLU, an
    /// untied head, the MLP's width, the norms' epsilon, the initialiser's range.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    fn validate_fla_common(&self, family: &str) -> Result<()> {
        let fox_on = [
            ("use_rope", self.use_rope),
            ("use_output_gate", self.use_output_gate),
            ("use_k_shift", self.use_k_shift),
            ("use_v_shift", self.use_v_shift),
            ("qk_norm_share_param_across_head", self.qk_norm_share_param_across_head),
            ("fgate_bias_init", self.fgate_bias_init),
        ];
        if let Some((field, _)) = fox_on.iter().find(|(_, on)| *on) {
            bail!("{field} is true: not a {family} field");
        }
        if self.num_kv_heads.is_some() || self.window_size.is_some() || self.log_pruning_tolerance.is_some() {
            bail!("num_kv_heads / window_size / log_pruning_tolerance: not {family} fields");
        }
        if self.hidden_act != "swish" && self.hidden_act != "silu" {
            bail!("hidden_act {:?}: only \"swish\" is supported", self.hidden_act);
        }
        if self.tie_word_embeddings {
            bail!("tie_word_embeddings: the output head is untied (must be false)");
        }
        if let Some(r) = self.hidden_ratio {
            if !(r > 0.0 && r <= MAX_HIDDEN_RATIO) {
                bail!("hidden_ratio is {r:?}; expected a number in (0, {MAX_HIDDEN_RATIO}]");
            }
        }
        let i = self.intermediate();
        if i == 0 || i > MAX_INTERMEDIATE {
            bail!("the MLP width is {i} (intermediate_size or hidden_ratio); expected 1 to {MAX_INTERMEDIATE}");
        }
        if !(self.norm_eps > 0.0 && self.norm_eps < 1.0) {
            bail!("norm_eps is {:?}; expected a number in (0, 1)", self.norm_eps);
        }
        if !(self.initializer_range >= 0.0 && self.initializer_range.is_finite()) {
            bail!("initializer_range is {:?}; expected a finite number >= 0", self.initializer_range);
        }
        Ok(())
    }

    /// HGRN2's fields (the common sizes are checked by `validate`): what fla's HGRN2 layer builds
    /// that foxlm implements (the short convolutions without bias, the output norm's weight).
    fn validate_hgrn2(&self) -> Result<()> {
        let d = self.hidden_size;
        if let Some(e) = self.expand_ratio {
            bound("expand_ratio", e, d)?;
        } else if self.num_heads == 0 {
            bail!("expand_ratio and num_heads are both absent: HGRN2 needs one of them");
        }
        let s = self.hgrn2();
        if s.head_dim == 0 || !d.is_multiple_of(s.head_dim) {
            bail!("expand_ratio {} must divide hidden_size {d} (fla's lower bounds are hidden_size wide)", s.head_dim);
        }
        if self.num_heads != 0 && self.num_heads != s.heads {
            bail!(
                "num_heads {} with expand_ratio {}: fla's layer has hidden_size / expand_ratio = {} heads",
                self.num_heads,
                s.head_dim,
                s.heads
            );
        }
        if let Some(w) = s.conv {
            bound("conv_size", w, 64)?;
        }
        if self.extra.get("conv_bias").and_then(|v| v.as_bool()) == Some(true) {
            bail!("conv_bias true: the short convolutions have no bias in fla's HGRN2");
        }
        let extra = |k: &str| self.extra.get(k).filter(|v| !v.is_null());
        if extra("elementwise_affine").and_then(|v| v.as_bool()) == Some(false) {
            bail!("elementwise_affine is false: foxlm's HGRN2 output norm always has its weight");
        }
        if let Some(b) = extra("attnres_block_size") {
            bail!("attnres_block_size is {b}: attention residuals are not supported");
        }
        if extra("use_l2warp").and_then(|v| v.as_bool()) == Some(true) {
            bail!("use_l2warp is true: not supported");
        }
        if self.attn.is_some() {
            bail!("attn: hybrid HGRN2 models (attention layers among the HGRN2 layers) are not supported");
        }
        if self.use_rope || self.qk_norm || self.use_output_norm {
            bail!("use_rope / qk_norm / use_output_norm: not HGRN2 fields");
        }
        self.validate_fla_common("HGRN2")
    }

    /// An HGRN2 config's layer sizes, with fla's defaults (expand_ratio 128 when neither it nor
    /// num_heads is given; heads = hidden_size / expand_ratio).
    pub fn hgrn2(&self) -> Hgrn2Sizes {
        let d = self.hidden_size;
        let head_dim = match (self.expand_ratio, self.num_heads) {
            (Some(e), _) => e,
            (None, 0) => 128,
            (None, h) => d / h,
        };
        Hgrn2Sizes {
            heads: d.checked_div(head_dim).unwrap_or(0),
            head_dim,
            lower_bound: self.use_lower_bound.unwrap_or(true),
            conv: (self.use_short_conv == Some(true)).then(|| self.conv_size.unwrap_or(4)),
        }
    }

    /// A DeltaNet or Gated DeltaNet config's layer sizes, with fla's defaults for absent fields.
    pub fn deltanet(&self) -> DeltaNetSizes {
        let gated = self.arch() == Arch::GatedDeltaNet;
        let h = self.num_heads.max(1);
        let (head_k, head_v) = if gated {
            let hd = self.ssm_head_dim.unwrap_or(256);
            (hd, (hd as f64 * self.expand_v.unwrap_or(2.0)) as usize)
        } else {
            let w = |r: Option<f64>| (self.hidden_size as f64 * r.unwrap_or(1.0)) as usize / h;
            (w(self.expand_k), w(self.expand_v))
        };
        DeltaNetSizes {
            gated,
            heads: self.num_heads,
            head_k,
            head_v,
            conv: self.conv_size.unwrap_or(4),
            use_gate: self.use_gate.unwrap_or(gated),
            eps: self.norm_eps,
        }
    }

    /// What Mamba-2 and Samba's Mamba layers check alike: SiLU, the norm's epsilon (under the
    /// config's name for it), the initialiser's range, an untied head, dt's initial range.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    fn validate_ssm_common(&self, eps_name: &str, (lo, hi, floor): (f64, f64, f64)) -> Result<()> {
        if self.hidden_act != "silu" && self.hidden_act != "swish" {
            bail!("hidden_act {:?}: only \"silu\" is supported", self.hidden_act);
        }
        if !(self.norm_eps > 0.0 && self.norm_eps < 1.0) {
            bail!("{eps_name} is {:?}; expected a number in (0, 1)", self.norm_eps);
        }
        if !(self.initializer_range >= 0.0 && self.initializer_range.is_finite()) {
            bail!("initializer_range is {:?}; expected a finite number >= 0", self.initializer_range);
        }
        if self.tie_word_embeddings {
            bail!("tie_word_embeddings: the output head is untied (must be false)");
        }
        if !(lo > 0.0 && lo <= hi && hi.is_finite() && floor >= 0.0 && floor.is_finite()) {
            bail!("time_step_min {lo:?}, time_step_max {hi:?}, time_step_floor {floor:?}: expected 0 < min <= max, floor >= 0");
        }
        Ok(())
    }

    /// The Mamba-2 fields' checks (the common sizes are checked by `validate`).
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    fn validate_mamba2(&self) -> Result<()> {
        let m = self.mamba2();
        bound("num_heads", self.num_heads, MAX_HIDDEN)?;
        bound("head_dim", m.head_dim, MAX_HIDDEN)?;
        bound("state_size", m.state, 1 << 12)?;
        bound("expand", m.expand, 16)?;
        bound("conv_kernel", m.conv, 64)?;
        bound("n_groups", m.groups, self.num_heads)?;
        if !self.num_heads.is_multiple_of(m.groups) {
            bail!("n_groups is {}; expected a divisor of num_heads {}", m.groups, self.num_heads);
        }
        if self.num_heads * m.head_dim != m.expand * self.hidden_size {
            bail!(
                "num_heads {} × head_dim {} must equal expand {} × hidden_size {} (the mixer's inner width)",
                self.num_heads,
                m.head_dim,
                m.expand,
                self.hidden_size
            );
        }
        self.validate_ssm_common("layer_norm_epsilon", (m.dt_min, m.dt_max, m.dt_floor))?;
        // What the mixer implements: no in/out projection biases, the gated RMSNorm, dt unclamped.
        let flag = |k: &str| self.extra.get(k).and_then(|v| v.as_bool());
        if flag("use_bias") == Some(true) {
            bail!("use_bias true: Mamba-2 projections with biases are not supported");
        }
        if flag("rms_norm") == Some(false) {
            bail!("rms_norm false: only the gated RMSNorm is supported");
        }
        if let Some(lim) = self.extra.get("time_step_limit") {
            // inf as Python's json writes it (Infinity, read as null here) or as transformers 5
            // does ({"__float__": "Infinity"}).
            let inf =
                |v: &serde_json::Value| v.is_null() || v.get("__float__").and_then(|s| s.as_str()) == Some("Infinity");
            let ok = lim.as_array().is_some_and(|a| a.len() == 2 && a[0].as_f64() == Some(0.0) && inf(&a[1]));
            if !ok {
                bail!("time_step_limit {lim}: only (0, inf), dt unclamped, is supported");
            }
        }
        Ok(())
    }

    /// The Samba fields' checks (the common sizes are checked by `validate`).
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    fn validate_samba(&self) -> Result<()> {
        let Some(a) = &self.attn else {
            bail!("attn is missing: a Samba config needs its attention layers' num_heads, window_size and layers");
        };
        if let Some(l) = &a.layers {
            if !l.is_null() {
                bail!("attn.layers is {l}; only null (the odd layers are attention) is supported, as in the authors' code");
            }
        }
        bound("attn.num_heads", a.num_heads, self.hidden_size)?;
        if !self.hidden_size.is_multiple_of(a.num_heads) {
            bail!("hidden_size {} must be a multiple of attn.num_heads {}", self.hidden_size, a.num_heads);
        }
        if !(self.hidden_size / a.num_heads).is_multiple_of(2) {
            bail!("head_dim {} (hidden_size / attn.num_heads) must be even for RoPE", self.hidden_size / a.num_heads);
        }
        if let Some(kv) = a.num_kv_heads {
            if kv == 0 || !a.num_heads.is_multiple_of(kv) {
                bail!("attn.num_kv_heads is {kv}; expected a divisor of attn.num_heads {} (or null)", a.num_heads);
            }
        }
        if let Some(w) = a.window_size {
            bound("attn.window_size", w, MAX_WINDOW)?;
        }
        if self.num_heads != 0 {
            bail!("num_heads is {}; a Samba config gives its heads in attn.num_heads", self.num_heads);
        }
        if self.window_size.is_some() {
            bail!("window_size: a Samba config gives its window in attn.window_size");
        }
        for (field, r) in
            [("attn_hidden_ratio", self.attn_hidden_ratio), ("mamba_hidden_ratio", self.mamba_hidden_ratio)]
        {
            if let Some(r) = r {
                if !(r > 0.0 && r <= MAX_HIDDEN_RATIO) {
                    bail!("{field} is {r:?}; expected a number in (0, {MAX_HIDDEN_RATIO}]");
                }
                let i = mlp_width(self.hidden_size, r);
                if i == 0 || i > MAX_INTERMEDIATE {
                    bail!(
                        "{field} {r:?} with hidden_size {} gives an MLP width of {i}; expected 1 to {MAX_INTERMEDIATE}",
                        self.hidden_size
                    );
                }
            }
        }
        if self.hidden_ratio.is_some() {
            bail!("hidden_ratio: a Samba config gives attn_hidden_ratio and mamba_hidden_ratio");
        }
        if !(self.rope_base > 1.0 && self.rope_base.is_finite()) {
            bail!("rope_base is {:?}; expected a finite number > 1", self.rope_base);
        }
        match &self.time_step_rank {
            None => {}
            Some(v) if v.as_str() == Some("auto") => {}
            Some(v) => match v.as_u64() {
                Some(r) if r >= 1 && r <= MAX_HIDDEN as u64 => {}
                _ => bail!("time_step_rank is {v}; expected \"auto\" or a whole number from 1 to {MAX_HIDDEN}"),
            },
        }
        let m = self.mamba();
        bound("state_size", m.state, 1 << 12)?;
        bound("expand", self.expand.unwrap_or(2), 16)?;
        bound("conv_kernel", m.conv, 64)?;
        if let Some(i) = self.intermediate_size {
            if i != m.inner {
                bail!(
                    "intermediate_size is {i}; in a Samba config it is the Mamba layers' width, expand {} × hidden_size {} = {}",
                    self.expand.unwrap_or(2),
                    self.hidden_size,
                    m.inner
                );
            }
        }
        self.validate_ssm_common("norm_eps", (m.dt_min, m.dt_max, m.dt_floor))?;
        if !(m.dt_scale >= 0.0 && m.dt_scale.is_finite()) {
            bail!("time_step_scale is {:?}; expected a finite number >= 0", m.dt_scale);
        }
        if let Some(v) = self.extra.get("time_step_init_scheme") {
            if v.as_str() != Some("random") && v.as_str() != Some("constant") {
                bail!("time_step_init_scheme is {v}; expected \"random\" or \"constant\"");
            }
        }
        if self.extra.get("use_bias").and_then(|v| v.as_bool()) == Some(true) {
            bail!("use_bias true: Mamba projections with biases are not supported");
        }
        // FoX's switches are not Samba's (its attention is fixed: RoPE, no gate, norms or shifts):
        // absent (their defaults) or off.
        let fox_on = [
            ("qk_norm", self.qk_norm),
            ("use_output_gate", self.use_output_gate),
            ("use_output_norm", self.use_output_norm),
            ("use_k_shift", self.use_k_shift),
            ("use_v_shift", self.use_v_shift),
            ("fgate_bias_init", self.fgate_bias_init),
        ];
        if let Some((field, _)) = fox_on.iter().find(|(_, on)| *on) {
            bail!(
                "{field} is true: not a Samba field (its attention layers are RoPE attention without gates or norms)"
            );
        }
        if self.num_kv_heads.is_some() || self.log_pruning_tolerance.is_some() {
            bail!("num_kv_heads / log_pruning_tolerance: a Samba config gives attn.num_kv_heads, and has no pruning");
        }
        Ok(())
    }

    /// Whether Samba's layer `i` is attention (attn.layers null: the odd layers).
    pub fn samba_is_attention(&self, i: usize) -> bool {
        i % 2 == 1
    }

    /// Samba's attention heads, k/v heads and window (zeros and None outside Samba).
    pub fn samba_attn(&self) -> (usize, usize, Option<usize>) {
        match &self.attn {
            Some(a) => (a.num_heads, a.num_kv_heads.unwrap_or(a.num_heads), a.window_size),
            None => (0, 0, None),
        }
    }

    /// Samba's MLP width of an attention block (`attention`) or a Mamba block.
    pub fn samba_mlp_width(&self, attention: bool) -> usize {
        let r = if attention { self.attn_hidden_ratio.unwrap_or(4.0) } else { self.mamba_hidden_ratio.unwrap_or(3.0) };
        mlp_width(self.hidden_size, r)
    }

    /// A Samba config's Mamba sizes, with the authors' defaults for absent fields.
    pub fn mamba(&self) -> MambaSizes {
        let d = self.hidden_size;
        let dt_rank = match self.time_step_rank.as_ref().and_then(|v| v.as_u64()) {
            Some(r) => r as usize,
            None => d.div_ceil(16),
        };
        let f = |k: &str| self.extra.get(k).and_then(|v| v.as_f64());
        MambaSizes {
            inner: self.expand.unwrap_or(2).saturating_mul(d),
            state: self.state_size.unwrap_or(16),
            conv: self.conv_kernel.unwrap_or(4),
            dt_rank,
            conv_bias: self.use_conv_bias.unwrap_or(true),
            dt_min: self.time_step_min.unwrap_or(0.001),
            dt_max: self.time_step_max.unwrap_or(0.1),
            dt_floor: self.time_step_floor.unwrap_or(1e-4),
            dt_scale: f("time_step_scale").unwrap_or(1.0),
            dt_init_random: self.extra.get("time_step_init_scheme").and_then(|v| v.as_str()) != Some("constant"),
        }
    }

    /// A Mamba-2 config's sizes, with the authors' defaults for absent fields.
    pub fn mamba2(&self) -> Mamba2Sizes {
        let head_dim = self.ssm_head_dim.unwrap_or(64);
        let expand = self.expand.unwrap_or(2);
        Mamba2Sizes {
            heads: self.num_heads,
            head_dim,
            state: self.state_size.unwrap_or(128),
            groups: self.n_groups.unwrap_or(1),
            conv: self.conv_kernel.unwrap_or(4),
            expand,
            inner: self.num_heads.saturating_mul(head_dim),
            conv_bias: self.use_conv_bias.unwrap_or(true),
            dt_min: self.time_step_min.unwrap_or(0.001),
            dt_max: self.time_step_max.unwrap_or(0.1),
            dt_floor: self.time_step_floor.unwrap_or(1e-4),
        }
    }

    /// Every parameter tensor's name and shape, in the order [`crate::model::Model::new`] creates
    /// them, computed without allocating the tensors: checkpoints are compared with this before a
    /// byte of weights is read. Call after [`Config::validate`].
    pub fn param_layout(&self) -> Vec<(String, Vec<usize>)> {
        if self.arch() == Arch::Mamba2 {
            let (v, d, m) = (self.vocab_size, self.hidden_size, self.mamba2());
            let mut out = vec![("backbone.embeddings.weight".to_string(), vec![v, d])];
            for l in 0..self.num_hidden_layers {
                let pre = format!("backbone.layers.{l}");
                out.push((format!("{pre}.norm.weight"), vec![d]));
                out.extend(m.mixer_layout(&format!("{pre}.mixer"), d));
            }
            out.push(("backbone.norm_f.weight".into(), vec![d]));
            out.push(("lm_head.weight".into(), vec![v, d]));
            return out;
        }
        if self.is_deltanet() || self.arch() == Arch::Hgrn2 {
            // fla's layout: the same blocks around each family's token mixer.
            let (v, d, i) = (self.vocab_size, self.hidden_size, self.intermediate());
            let mixer = |pre: &str| match self.is_deltanet() {
                true => self.deltanet().mixer_layout(pre, d),
                false => self.hgrn2().mixer_layout(pre, d),
            };
            let mut out = vec![("model.embeddings.weight".to_string(), vec![v, d])];
            if !self.is_deltanet() && self.hgrn2().lower_bound {
                out.push(("model.lower_bounds".into(), vec![self.num_hidden_layers, d]));
            }
            for l in 0..self.num_hidden_layers {
                let pre = format!("model.layers.{l}");
                out.push((format!("{pre}.attn_norm.weight"), vec![d]));
                out.extend(mixer(&format!("{pre}.attn")));
                out.push((format!("{pre}.mlp_norm.weight"), vec![d]));
                out.push((format!("{pre}.mlp.gate_proj.weight"), vec![2 * i, d]));
                out.push((format!("{pre}.mlp.down_proj.weight"), vec![d, i]));
            }
            out.push(("model.norm.weight".into(), vec![d]));
            out.push(("lm_head.weight".into(), vec![v, d]));
            return out;
        }
        if self.arch() == Arch::Samba {
            let (v, d, m) = (self.vocab_size, self.hidden_size, self.mamba());
            let (h, hkv, _) = self.samba_attn();
            let dkv = hkv * (d / h.max(1));
            let mut out = vec![("backbone.embeddings.weight".to_string(), vec![v, d])];
            for l in 0..self.num_hidden_layers {
                let pre = format!("backbone.layers.{l}");
                out.push((format!("{pre}.mixer_norm.weight"), vec![d]));
                let attention = self.samba_is_attention(l);
                if attention {
                    for (name, rows) in [("q_proj", d), ("k_proj", dkv), ("v_proj", dkv), ("o_proj", d)] {
                        out.push((format!("{pre}.mixer.{name}.weight"), vec![rows, d]));
                    }
                } else {
                    out.extend(m.mixer_layout(&format!("{pre}.mixer"), d));
                }
                let i = self.samba_mlp_width(attention);
                out.push((format!("{pre}.mlp_norm.weight"), vec![d]));
                out.push((format!("{pre}.mlp.gate_proj.weight"), vec![2 * i, d]));
                out.push((format!("{pre}.mlp.down_proj.weight"), vec![d, i]));
            }
            out.push(("backbone.norm_f.weight".into(), vec![d]));
            out.push(("lm_head.weight".into(), vec![v, d]));
            return out;
        }
        let (v, d, hd, i) = (self.vocab_size, self.hidden_size, self.head_dim(), self.intermediate());
        let h = self.num_heads;
        // k and v (and their KV-shift gates and per-head k_norm) have the k/v heads
        let (hkv, dkv) = (self.kv_heads(), self.kv_heads() * hd);
        let mut out = vec![("model.embeddings.weight".to_string(), vec![v, d])];
        for l in 0..self.num_hidden_layers {
            let pre = format!("model.layers.{l}");
            let mut add = |name: &str, shape: Vec<usize>| out.push((format!("{pre}.{name}"), shape));
            add("attn_norm.weight", vec![d]);
            add("attn.q_proj.weight", vec![d, d]);
            for (proj, shift) in [("k_proj", self.use_k_shift), ("v_proj", self.use_v_shift)] {
                if shift {
                    add(&format!("attn.{proj}.linear.weight"), vec![dkv, d]);
                    add(&format!("attn.{proj}.shift_proj.weight"), vec![hkv, d]);
                } else {
                    add(&format!("attn.{proj}.weight"), vec![dkv, d]);
                }
            }
            add("attn.o_proj.weight", vec![d, d]);
            match self.fgate_type {
                FgateType::Full => {
                    add("attn.fgate_proj.weight", vec![h, d]);
                    add("attn.fgate_proj.bias", vec![h]);
                }
                FgateType::BiasOnly | FgateType::Fixed => add("attn.fgate_bias", vec![h]),
                FgateType::None => {}
            }
            if self.use_output_gate {
                add("attn.ogate_proj.weight", vec![d, d]);
            }
            if self.use_output_norm {
                add("attn.output_norm.weight", vec![d]);
            }
            if self.qk_norm {
                let shared = self.qk_norm_share_param_across_head;
                add("attn.q_norm.weight", vec![if shared { hd } else { d }]);
                add("attn.k_norm.weight", vec![if shared { hd } else { dkv }]);
            }
            add("mlp_norm.weight", vec![d]);
            add("mlp.gate_proj.weight", vec![2 * i, d]);
            add("mlp.down_proj.weight", vec![d, i]);
        }
        out.push(("model.norm.weight".into(), vec![d]));
        out.push(("lm_head.weight".into(), vec![v, d]));
        out
    }

    /// Bytes of all parameters in f32, computed without building the layout (so a config with
    /// absurd sizes costs nothing to check); saturating, so any config gives an answer.
    pub fn param_bytes(&self) -> u128 {
        if self.arch() == Arch::Mamba2 {
            let (v, d, l) = (self.vocab_size as u128, self.hidden_size as u128, self.num_hidden_layers as u128);
            let m = self.mamba2();
            let (h, p, n, g, w) =
                (m.heads as u128, m.head_dim as u128, m.state as u128, m.groups as u128, m.conv as u128);
            let s = |a: u128, b: u128| a.saturating_mul(b);
            let inner = s(h, p);
            let conv_dim = inner.saturating_add(s(2, s(g, n)));
            let in_proj = s(d, inner.saturating_add(conv_dim).saturating_add(h));
            let per_layer = [
                d,                                      // norm
                in_proj,                                // in_proj
                s(conv_dim, w),                         // conv1d weight
                if m.conv_bias { conv_dim } else { 0 }, // conv1d bias
                s(3, h),                                // dt_bias, A_log, D
                inner,                                  // gated norm
                s(inner, d),                            // out_proj
            ]
            .iter()
            .fold(0u128, |a, &t| a.saturating_add(t));
            return s(s(2, s(v, d)).saturating_add(d).saturating_add(s(per_layer, l)), 4);
        }
        if self.is_deltanet() {
            let s = |a: u128, b: u128| a.saturating_mul(b);
            let (v, d, l) = (self.vocab_size as u128, self.hidden_size as u128, self.num_hidden_layers as u128);
            let m = self.deltanet();
            let (h, hk, hv, w) = (m.heads as u128, m.head_k as u128, m.head_v as u128, m.conv as u128);
            let (kd, vd) = (s(h, hk), s(h, hv));
            let i = self.intermediate() as u128;
            let per_layer = [
                s(2, d),                                                   // attn_norm, mlp_norm
                s(s(2, kd).saturating_add(vd), d),                         // q, k, v
                s(h, d),                                                   // b_proj
                if m.gated { s(h, d).saturating_add(s(2, h)) } else { 0 }, // a_proj, A_log, dt_bias
                s(s(2, kd).saturating_add(vd), w),                         // convolutions
                if m.use_gate { s(vd, d) } else { 0 },                     // g_proj
                hv.saturating_add(s(vd, d)),                               // o_norm, o_proj
                s(3, s(d, i)),                                             // MLP
            ]
            .iter()
            .fold(0u128, |a, &t| a.saturating_add(t));
            return s(s(2, s(v, d)).saturating_add(d).saturating_add(s(per_layer, l)), 4);
        }
        if self.arch() == Arch::Hgrn2 {
            let s = |a: u128, b: u128| a.saturating_mul(b);
            let (v, d, l) = (self.vocab_size as u128, self.hidden_size as u128, self.num_hidden_layers as u128);
            let i = self.intermediate() as u128;
            // attn_norm, mlp_norm, g_norm; q, f, i, o; the short convolutions; the MLP
            let conv = s(3, s(d, self.hgrn2().conv.unwrap_or(0) as u128));
            let per_layer = s(3, d).saturating_add(s(4, s(d, d))).saturating_add(conv).saturating_add(s(3, s(d, i)));
            let lower = if self.hgrn2().lower_bound { s(l, d) } else { 0 };
            return s(s(2, s(v, d)).saturating_add(d).saturating_add(lower).saturating_add(s(per_layer, l)), 4);
        }
        if self.arch() == Arch::Samba {
            let (v, d) = (self.vocab_size as u128, self.hidden_size as u128);
            let s = |a: u128, b: u128| a.saturating_mul(b);
            let m = self.mamba();
            let (di, n, w, r) = (m.inner as u128, m.state as u128, m.conv as u128, m.dt_rank as u128);
            let (h, hkv, _) = self.samba_attn();
            let dkv = s(hkv as u128, d.checked_div(h as u128).unwrap_or(0));
            let attn = s(2, s(d, d)).saturating_add(s(2, s(dkv, d)));
            let mamba = [
                s(di, w),                         // conv1d weight
                if m.conv_bias { di } else { 0 }, // conv1d bias
                s(2, s(di, d)),                   // in_proj
                s(r.saturating_add(s(2, n)), di), // x_proj
                s(di, r).saturating_add(di),      // dt_proj
                s(di, n).saturating_add(di),      // A_log, D
                s(d, di),                         // out_proj
            ]
            .iter()
            .fold(0u128, |a, &t| a.saturating_add(t));
            // attn.layers null: the odd layers are attention, the even ones Mamba.
            let n_attn = (self.num_hidden_layers / 2) as u128;
            let n_mamba = self.num_hidden_layers as u128 - n_attn;
            let block = |mixer: u128, attention: bool| {
                s(2, d).saturating_add(mixer).saturating_add(s(3, s(d, self.samba_mlp_width(attention) as u128)))
            };
            let blocks = s(n_attn, block(attn, true)).saturating_add(s(n_mamba, block(mamba, false)));
            return s(s(2, s(v, d)).saturating_add(d).saturating_add(blocks), 4);
        }
        let (v, d, h, l) =
            (self.vocab_size as u128, self.hidden_size as u128, self.num_heads as u128, self.num_hidden_layers as u128);
        let hd = d.checked_div(h).unwrap_or(0);
        // k/v heads: any value is only an upper bound here until validate() checks it divides h
        let hkv = (self.num_kv_heads.unwrap_or(self.num_heads) as u128).min(h);
        let dkv = hkv.saturating_mul(hd);
        let i = self.intermediate_size.unwrap_or_else(|| self.intermediate()) as u128;
        let m = |a: u128, b: u128| a.saturating_mul(b);
        let terms = [
            m(2, d),                                                           // attn_norm, mlp_norm
            m(2, m(d, d)).saturating_add(m(2, m(dkv, d))),                     // q, o; k, v
            m(3, m(d, i)),                                                     // gate_proj (2I), down_proj
            m(self.use_k_shift as u128 + self.use_v_shift as u128, m(hkv, d)), // shift_proj
            match self.fgate_type {
                FgateType::Full => m(h, d).saturating_add(h),
                FgateType::BiasOnly | FgateType::Fixed => h,
                FgateType::None => 0,
            },
            m(self.use_output_gate as u128, m(d, d)),
            m(self.use_output_norm as u128, d),
            m(self.qk_norm as u128, if self.qk_norm_share_param_across_head { 2 * hd } else { d.saturating_add(dkv) }),
        ];
        let per_layer = terms.iter().fold(0u128, |a, &t| a.saturating_add(t));
        let total = m(2, m(v, d)).saturating_add(d).saturating_add(m(per_layer, l));
        m(total, 4)
    }

    /// Channels per head: an attention head's (hidden_size / num_heads), or an SSM head's P.
    pub fn head_dim(&self) -> usize {
        match self.arch() {
            Arch::Fox => self.hidden_size / self.num_heads,
            Arch::Mamba2 => self.mamba2().head_dim,
            Arch::Samba => self.hidden_size / self.samba_attn().0.max(1),
            Arch::DeltaNet | Arch::GatedDeltaNet => self.deltanet().head_k,
            Arch::Hgrn2 => self.hgrn2().head_dim,
        }
    }

    /// k/v heads: num_kv_heads, or num_heads without grouped-query attention (Samba: its
    /// attention layers').
    pub fn kv_heads(&self) -> usize {
        if self.arch() == Arch::Samba {
            return self.samba_attn().1;
        }
        self.num_kv_heads.unwrap_or(self.num_heads)
    }

    /// intermediate_size if given, else int(d · hidden_ratio · 2/3) rounded up to a multiple of 256.
    /// Samba: the wider of its two MLP widths, the attention blocks'.
    pub fn intermediate(&self) -> usize {
        if self.arch() == Arch::Samba {
            return self.samba_mlp_width(true).max(self.samba_mlp_width(false));
        }
        if let Some(i) = self.intermediate_size {
            return i;
        }
        let r = self.hidden_ratio.unwrap_or(4.0);
        // `as` saturates (NaN gives 0), and the rounding cannot overflow: validate() bounds the result.
        let i = (self.hidden_size as f64 * r * 2.0 / 3.0) as usize;
        i.div_ceil(256).saturating_mul(256)
    }

    /// Training context length recorded by `foxlm train` (an extra key the reference ignores).
    pub fn train_context(&self) -> Option<usize> {
        self.extra.get("foxlm_train_context").and_then(|v| v.as_u64()).map(|v| v as usize)
    }
}

/// "field: a vs b" for the architecture fields on which two configs differ (extra keys ignored).
pub fn config_diff(a: &Config, b: &Config) -> Vec<String> {
    differing_fields(a, b).into_iter().map(|(k, v, w)| format!("{k}: {v} vs {w}")).collect()
}

/// The config.json fields on which two configs differ (extra keys ignored): name, a's value and
/// b's, as JSON, in name order.
pub fn differing_fields(a: &Config, b: &Config) -> Vec<(String, serde_json::Value, serde_json::Value)> {
    let strip = |c: &Config| {
        let mut c = c.clone();
        c.extra.clear();
        serde_json::to_value(&c).ok().and_then(|v| v.as_object().cloned()).unwrap_or_default()
    };
    let none = |v: Option<serde_json::Value>| v.unwrap_or_default();
    json_field_diff(&strip(a), &strip(b)).into_iter().map(|(k, v, w)| (k, none(v), none(w))).collect()
}

/// The fields of two JSON objects whose values differ, in name order: name, a's value and b's
/// (None where absent).
pub fn json_field_diff(
    a: &serde_json::Map<String, serde_json::Value>,
    b: &serde_json::Map<String, serde_json::Value>,
) -> Vec<(String, Option<serde_json::Value>, Option<serde_json::Value>)> {
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| (k.clone(), a.get(k).cloned(), b.get(k).cloned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Model;

    fn fixture(v: &str) -> Config {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/official-fox-tiny").join(v);
        Config::load(&p.join("config.json")).unwrap()
    }

    use crate::presets::OFFICIAL_FIXTURES as VARIANTS;

    fn err(c: &Config) -> String {
        format!("{:#}", c.validate().unwrap_err())
    }

    #[test]
    fn layout_and_size_match_the_model_for_every_fixture() {
        for v in VARIANTS {
            // as released, and with grouped-query attention (4 query heads on 2 or 1 k/v heads)
            for kv in [None, Some(2), Some(1)] {
                let c = Config { num_kv_heads: kv, window_size: kv.map(|k| 16 * k), ..fixture(v) };
                c.validate().unwrap();
                let m = Model::new(&c);
                let want: Vec<(String, Vec<usize>)> =
                    m.params.names.iter().cloned().zip(m.params.tensors.iter().map(|t| t.shape.clone())).collect();
                assert_eq!(c.param_layout(), want, "{v} {kv:?}");
                assert_eq!(c.param_bytes(), 4 * m.params.numel() as u128, "{v} {kv:?}");
            }
        }
        let c = Config { num_kv_heads: Some(1), ..fixture("fox_pro") };
        let layout = c.param_layout();
        let shape = |n: &str| layout.iter().find(|(k, _)| k == n).map(|(_, s)| s.clone());
        let hd = c.head_dim();
        assert_eq!(shape("model.layers.0.attn.k_proj.linear.weight"), Some(vec![hd, c.hidden_size]));
        assert_eq!(shape("model.layers.0.attn.v_proj.shift_proj.weight"), Some(vec![1, c.hidden_size]));
        assert_eq!(shape("model.layers.0.attn.q_proj.weight"), Some(vec![c.hidden_size, c.hidden_size]));
    }

    #[test]
    fn window_reads_the_authors_name_and_sliding_window() {
        let base = fixture("fox_llama");
        let mut j: serde_json::Value = serde_json::from_str(&base.to_json()).unwrap();
        j["window_size"] = 64.into();
        j["num_kv_heads"] = 2.into();
        let c: Config = serde_json::from_value(j.clone()).unwrap();
        assert_eq!((c.window_size, c.kv_heads()), (Some(64), 2));
        // written back under the authors' name
        assert!(c.to_json().contains("\"window_size\": 64"));
        let o = j.as_object_mut().unwrap();
        o.remove("window_size");
        o.insert("sliding_window".into(), 32.into());
        let c: Config = serde_json::from_value(j).unwrap();
        assert_eq!(c.window_size, Some(32));
        assert!(!c.extra.contains_key("sliding_window"));
        c.validate().unwrap();
    }

    #[test]
    fn the_issue_examples_are_errors_naming_field_and_value() {
        let base = fixture("fox_llama");
        let mut c = base.clone();
        c.vocab_size = 2147483648;
        assert_eq!(err(&c), "vocab_size is 2147483648; expected 1 to 16777216");
        let mut c = base.clone();
        c.num_hidden_layers = 9223372036854775807;
        assert_eq!(err(&c), "num_hidden_layers is 9223372036854775807; expected 1 to 4096");
        let mut c = base.clone();
        c.hidden_size = 1 << 40;
        assert_eq!(err(&c), "hidden_size is 1099511627776; expected 1 to 65536");
        let mut c = base.clone();
        c.num_heads = 1 << 20;
        assert_eq!(err(&c), "num_heads is 1048576; expected 1 to 128");
        let mut c = base.clone();
        c.num_heads = 3;
        assert_eq!(err(&c), "hidden_size 128 must be a positive multiple of num_heads 3");
        let mut c = base.clone();
        c.num_kv_heads = Some(3);
        assert_eq!(err(&c), "num_kv_heads is 3; expected a divisor of num_heads 4 (or null)");
        c.num_kv_heads = Some(0);
        assert_eq!(err(&c), "num_kv_heads is 0; expected a divisor of num_heads 4 (or null)");
        let mut c = base.clone();
        c.window_size = Some(0);
        assert_eq!(err(&c), "window_size is 0; expected 1 to 1073741824");
    }

    #[test]
    fn ratios_times_and_ids_are_bounded() {
        let base = fixture("fox_llama");
        type Mutation = Box<dyn Fn(&mut Config)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|c| c.hidden_ratio = Some(f64::NAN)), "hidden_ratio is NaN; expected a number in (0, 64]"),
            (Box::new(|c| c.hidden_ratio = Some(1e300)), "hidden_ratio is 1e300; expected a number in (0, 64]"),
            (Box::new(|c| c.intermediate_size = Some(0)), "intermediate_size is 0; expected 1 to 1048576"),
            (
                Box::new(|c| c.hidden_ratio = Some(1e-9)),
                "hidden_ratio 1e-9 with hidden_size 128 gives an MLP width of 0; expected 1 to 1048576",
            ),
            (Box::new(|c| c.norm_eps = -1.0), "norm_eps is -1.0; expected a number in (0, 1)"),
            (Box::new(|c| c.rope_base = f64::INFINITY), "rope_base is inf; expected a finite number > 1"),
            (Box::new(|c| c.initializer_range = -0.5), "initializer_range is -0.5; expected a finite number >= 0"),
            (
                Box::new(|c| c.log_pruning_tolerance = Some(3.0)),
                "log_pruning_tolerance is 3.0; expected ln(eps) for a tolerance eps <= 1: a finite number <= 0",
            ),
            (Box::new(|c| c.bos_token_id = Some(512)), "bos_token_id is 512, outside the vocabulary of vocab_size 512"),
            (
                Box::new(|c| c.eos_token_id = Some(4000000000)),
                "eos_token_id is 4000000000, outside the vocabulary of vocab_size 512",
            ),
            (
                Box::new(|c| (c.decay_time_min, c.decay_time_max) = (Some(5.0), Some(2.0))),
                "decay_time_min 5.0 and decay_time_max 2.0: expected finite times with 0.01 <= min <= max",
            ),
            (Box::new(|c| c.decay_time_max = Some(0.0)), "decay time 0.0: expected a finite time >= 0.01"),
        ];
        for (mutate, want) in cases {
            let mut c = base.clone();
            mutate(&mut c);
            assert_eq!(err(&c), want);
        }
    }

    #[test]
    fn load_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let src = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/official-fox-tiny/fox_pro/config.json"),
        )
        .unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(&p, src.replace("\"vocab_size\": 512", "\"vocab_size\": 2147483648")).unwrap();
        let e = format!("{:#}", Config::load(&p).unwrap_err());
        assert_eq!(
            e,
            format!("{}: invalid configuration: vocab_size is 2147483648; expected 1 to 16777216", p.display())
        );
        std::fs::write(&p, b"{\"vocab_size\": \xff}").unwrap();
        let e = format!("{:#}", Config::load(&p).unwrap_err());
        assert!(e.contains("not UTF-8 text (invalid byte 0xff at offset 15)") && e.contains("config.json"), "{e}");
    }

    #[test]
    fn param_bytes_saturates_instead_of_overflowing() {
        let mut c = fixture("fox_pro");
        c.vocab_size = usize::MAX;
        c.hidden_size = usize::MAX;
        c.num_hidden_layers = usize::MAX;
        assert_eq!(c.param_bytes(), u128::MAX);
    }
}
