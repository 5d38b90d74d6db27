//! The model configuration, in the authors' Hugging Face `config.json` format: the fields and
//! how they load ([`Config`]), the checks before anything is sized from them (`validate.rs`),
//! each family's layer sizes (`sizes.rs`), the parameter layout they imply (`layout.rs`), and
//! comparing two configs (`diff.rs`).

mod diff;
mod layout;
mod sizes;
mod validate;
pub use diff::{config_diff, differing_fields, json_field_diff};
pub use sizes::{mlp_width, DeltaNetSizes, Hgrn2Sizes, Mamba2Sizes, MambaSizes};
pub use validate::{MAX_HIDDEN, MAX_HIDDEN_RATIO, MAX_INTERMEDIATE, MAX_LAYERS, MAX_VOCAB, MAX_WINDOW, MIN_DECAY_TIME};

use anyhow::{Context, Result};
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

/// QK-norm's epsilon in the reference implementation (its RMSNorm default), not `norm_eps`.
pub const QK_NORM_EPS: f32 = 1e-5;

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
        // `as` saturates (NaN gives 0), and the rounding cannot overflow: validate() bounds the result.
        mlp_width(self.hidden_size, self.hidden_ratio.unwrap_or(4.0))
    }

    /// Training context length recorded by `foxlm train` (an extra key the reference ignores).
    pub fn train_context(&self) -> Option<usize> {
        self.extra.get("foxlm_train_context").and_then(|v| v.as_u64()).map(|v| v as usize)
    }
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
