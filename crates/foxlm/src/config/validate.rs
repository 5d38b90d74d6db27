//! The checks of a config before anything is sized from it.

use super::*;
use anyhow::{bail, Result};

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

fn bound(field: &str, v: usize, max: usize) -> Result<()> {
    if v == 0 || v > max {
        bail!("{field} is {v}; expected 1 to {max}");
    }
    Ok(())
}

impl Config {
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
}
