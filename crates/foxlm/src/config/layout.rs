//! The parameter tensors a config implies, named and shaped as in its checkpoint.

use super::{Arch, Config, FgateType};

/// A block's SwiGLU MLP of width `i` under `pre` (a layer's prefix), with its norm.
fn mlp_layout(pre: &str, d: usize, i: usize) -> [(String, Vec<usize>); 3] {
    [
        (format!("{pre}.mlp_norm.weight"), vec![d]),
        (format!("{pre}.mlp.gate_proj.weight"), vec![2 * i, d]),
        (format!("{pre}.mlp.down_proj.weight"), vec![d, i]),
    ]
}

impl Config {
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
                out.extend(mlp_layout(&pre, d, i));
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
                out.extend(mlp_layout(&pre, d, self.samba_mlp_width(attention)));
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
            out.extend(mlp_layout(&pre, d, i));
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
}
