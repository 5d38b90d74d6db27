//! Each family's layer sizes, read from a config with its family's defaults.

use super::{Arch, Config};

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

/// The families' layer sizes of a config.
impl Config {
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
}
