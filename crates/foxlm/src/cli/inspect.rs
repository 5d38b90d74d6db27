//! `foxlm inspect`: a model's configuration, parameter counts per component, and memory needs.

use crate::checkpoint::load_model;
use crate::config::{Arch, Config, FgateType};
use crate::model::Model;
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model folder (config.json + model.safetensors).
    #[arg(long)]
    pub model: PathBuf,
    /// Report the memory to decode this many tokens (prompt + generated) per sequence.
    #[arg(long, default_value_t = 16384)]
    pub decode_tokens: usize,
    /// Batch size for the decoding memory estimate.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
}

/// The variant's name in the paper's terms.
pub fn variant_name(c: &Config) -> &'static str {
    match c.arch() {
        Arch::Mamba2 => return "Mamba-2",
        Arch::Samba => return "Samba",
        Arch::DeltaNet => return "DeltaNet",
        Arch::GatedDeltaNet => return "Gated DeltaNet",
        Arch::Hgrn2 => return "HGRN2",
        Arch::Fox => {}
    }
    let pro = c.qk_norm || c.use_output_gate || c.use_output_norm || c.use_k_shift || c.use_v_shift;
    match (c.fgate_type, pro) {
        (FgateType::None, false) => "Transformer (LLaMA)",
        (FgateType::None, true) => "Transformer (Pro)",
        (FgateType::Full, false) => "FoX (LLaMA)",
        (FgateType::Full, true) => "FoX (Pro)",
        (FgateType::BiasOnly, _) => "FoX, data-independent (bias-only) gate",
        (FgateType::Fixed, _) => "FoX, fixed gate (ALiBi-like)",
    }
}

/// Which component a parameter belongs to, for the counts table.
fn component(name: &str) -> &'static str {
    let mixer_attn = [".mixer.q_proj", ".mixer.k_proj", ".mixer.v_proj", ".mixer.o_proj"];
    if name.contains("embeddings") {
        "embeddings"
    } else if name.contains("lower_bounds") || name.contains(".attn.f_proj.") || name.contains(".attn.g_norm.") {
        "hgrn2: f_proj, bounds, g_norm"
    } else if name.starts_with("lm_head") {
        "lm_head"
    } else if name.contains("shift_proj") {
        "attention: kv_shift"
    } else if name.contains("fgate") {
        "attention: fgate"
    } else if name.contains("ogate") {
        "attention: output_gate"
    } else if name.contains("q_norm") || name.contains("k_norm") {
        "attention: qk_norm"
    } else if name.contains("output_norm") {
        "attention: output_norm"
    } else if name.contains(".attn.") && name.contains("_conv1d.") {
        "short conv (DeltaNet, HGRN2)"
    } else if [".attn.b_proj.", ".attn.a_proj.", ".attn.A_log", ".attn.dt_bias"].iter().any(|m| name.contains(m)) {
        "deltanet: beta, decay"
    } else if name.contains(".attn.g_proj.") || name.contains(".attn.o_norm.") {
        "deltanet: gate, o_norm"
    } else if name.contains(".attn.") || mixer_attn.iter().any(|m| name.contains(m)) {
        "attention: q/k/v/o"
    } else if name.contains(".mixer.x_proj") || name.contains(".mixer.dt_proj") {
        "mamba: x_proj/dt_proj"
    } else if name.contains(".mixer.in_proj") || name.contains(".mixer.out_proj") {
        "mamba(2): in_proj/out_proj"
    } else if name.contains(".mixer.conv1d") {
        "mamba(2): conv1d"
    } else if name.contains(".mixer.") {
        "mamba(2): dt, A, D, norm"
    } else if name.contains(".mlp.") {
        "mlp"
    } else {
        "norms (block + final)"
    }
}

fn human(bytes: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"];
    let mut v = bytes;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", units[i])
}

fn count(n: usize) -> String {
    if n >= 1_000_000 {
        format!("{:.2}M", n as f64 / 1e6)
    } else if n >= 1000 {
        format!("{:.1}K", n as f64 / 1e3)
    } else {
        n.to_string()
    }
}

pub fn report(model: &Model, decode_tokens: usize, batch: usize) -> String {
    let c = &model.config;
    let mut s = String::new();
    let on = |b: bool| if b { "on" } else { "off" };
    s += &format!("variant            {}\n", variant_name(c));
    s += &format!("vocab / d_model    {} / {}\n", c.vocab_size, c.hidden_size);
    if c.arch() == Arch::Mamba2 {
        let m = c.mamba2();
        s += &format!("layers             {} (a Mamba-2 mixer each, no MLP)\n", c.num_hidden_layers);
        s += &format!(
            "SSM heads          {} of {} channels (inner width {}, expand {})\n",
            m.heads, m.head_dim, m.inner, m.expand
        );
        s += &format!("state / groups     {} / {}\n", m.state, m.groups);
        s += &format!("conv width         {}{}\n", m.conv, if m.conv_bias { " (with bias)" } else { "" });
        return s + &counts_and_memory(model, decode_tokens, batch);
    }
    if c.is_deltanet() {
        let m = c.deltanet();
        s += &format!("layers             {} (a DeltaNet layer and an MLP each)\n", c.num_hidden_layers);
        s += &format!("heads              {} (key width {}, value width {})\n", m.heads, m.head_k, m.head_v);
        s += &format!("conv width         {} (q, k, v)\n", m.conv);
        s += &format!("output gate        {}\n", on(m.use_gate));
        s += &format!("MLP width          {}\n", c.intermediate());
        return s + &counts_and_memory(model, decode_tokens, batch);
    }
    if c.arch() == Arch::Hgrn2 {
        let m = c.hgrn2();
        s += &format!("layers             {} (an HGRN2 layer and an MLP each)\n", c.num_hidden_layers);
        s += &format!(
            "heads              {} of {} (state {}×{} per head)\n",
            m.heads, m.head_dim, m.head_dim, m.head_dim
        );
        s += &format!("lower bounds       {}\n", on(m.lower_bound));
        if let Some(w) = m.conv {
            s += &format!("conv width         {w} (q, f, i)\n");
        }
        s += &format!("MLP width          {}\n", c.intermediate());
        return s + &counts_and_memory(model, decode_tokens, batch);
    }
    if c.arch() == Arch::Samba {
        let (m, (h, hkv, window)) = (c.mamba(), c.samba_attn());
        let attn = (0..c.num_hidden_layers).filter(|&i| c.samba_is_attention(i)).count();
        s += &format!(
            "layers             {} ({} Mamba, {attn} sliding-window attention: the odd ones), each with an MLP\n",
            c.num_hidden_layers,
            c.num_hidden_layers - attn
        );
        s +=
            &format!("attention heads    {h} of {} (k/v heads {hkv}), RoPE theta {}\n", c.hidden_size / h, c.rope_base);
        s += &format!(
            "sliding window     {}\n",
            window.map_or("none (full causal)".to_string(), |w| format!("{w} keys"))
        );
        s += &format!(
            "mamba              inner width {}, state {}, dt rank {}, conv width {}{}\n",
            m.inner,
            m.state,
            m.dt_rank,
            m.conv,
            if m.conv_bias { " (with bias)" } else { "" }
        );
        s += &format!(
            "mlp intermediate   {} (attention blocks) / {} (Mamba blocks)\n",
            c.samba_mlp_width(true),
            c.samba_mlp_width(false)
        );
        return s + &counts_and_memory(model, decode_tokens, batch);
    }
    s += &format!("layers / heads     {} / {} (head_dim {})\n", c.num_hidden_layers, c.num_heads, c.head_dim());
    if c.kv_heads() != c.num_heads {
        s += &format!("k/v heads (GQA)    {}\n", c.kv_heads());
    }
    if let Some(w) = c.window_size {
        s += &format!("sliding window     {w} keys\n");
    }
    s += &format!("mlp intermediate   {}\n", c.intermediate());
    s += &format!("forget gate        {:?}\n", c.fgate_type);
    s += &format!(
        "rope               {}{}\n",
        on(c.use_rope),
        if c.use_rope { format!(" (theta {})", c.rope_base) } else { String::new() }
    );
    s += &format!(
        "qk_norm            {}{}\n",
        on(c.qk_norm),
        if c.qk_norm && c.qk_norm_share_param_across_head { " (shared across heads)" } else { "" }
    );
    s += &format!("output gate / norm {} / {}\n", on(c.use_output_gate), on(c.use_output_norm));
    s += &format!("kv_shift (k / v)   {} / {}\n", on(c.use_k_shift), on(c.use_v_shift));
    s += &format!(
        "ACP                {}\n",
        c.log_pruning_tolerance.map_or("off".to_string(), |t| format!("on (ln eps = {t})"))
    );
    if let Some(t) = c.train_context() {
        s += &format!("training context   {t}\n");
    }
    s + &counts_and_memory(model, decode_tokens, batch)
}

/// The parameter counts per component and the memory to load and decode.
fn counts_and_memory(model: &Model, decode_tokens: usize, batch: usize) -> String {
    let c = &model.config;
    let mut s = String::new();
    let mut comps: BTreeMap<&str, usize> = BTreeMap::new();
    for (n, t) in model.params.names.iter().zip(&model.params.tensors) {
        *comps.entry(component(n)).or_default() += t.numel();
    }
    let total = model.params.numel();
    s += "\nparameters\n";
    for (k, v) in &comps {
        s += &format!("  {k:<24} {:>10}  {:5.1}%\n", count(*v), 100.0 * *v as f64 / total as f64);
    }
    s += &format!("  {:<24} {:>10}\n", "total", count(total));
    let emb = comps.get("embeddings").copied().unwrap_or(0) + comps.get("lm_head").copied().unwrap_or(0);
    s += &format!("  {:<24} {:>10}\n", "non-embedding", count(total - emb));
    // In u128: --decode-tokens and --batch come from the user and may be absurd.
    let cache = crate::validate::kv_cache_bytes(c, batch, decode_tokens);
    s += "\nmemory (f32)\n";
    s += &format!("  to load                  {}\n", human(total as f64 * 4.0));
    if c.arch() == Arch::Mamba2 {
        s += &format!(
            "  state, any tokens × {batch}    {}  (SSM and convolution states per layer: no KV cache)\n",
            human(cache as f64)
        );
    } else if c.is_deltanet() {
        s += &format!(
            "  state, any tokens × {batch}    {}  (delta-rule and convolution states per layer: no KV cache)\n",
            human(cache as f64)
        );
    } else if c.arch() == Arch::Hgrn2 {
        s += &format!(
            "  state, any tokens × {batch}    {}  (the GLA state per layer: no KV cache)\n",
            human(cache as f64)
        );
    } else if c.arch() == Arch::Samba {
        s += &format!(
            "  KV cache + states, {decode_tokens} tokens × {batch}  {}  (attention layers: k, v, gate sums; Mamba layers: fixed states)\n",
            human(cache as f64)
        );
    } else {
        s += &format!(
            "  KV cache, {decode_tokens} tokens × {batch}  {}  (k, v, gate prefix sum per layer and head)\n",
            human(cache as f64)
        );
    }
    s += &format!("  to decode, total         {}\n", human(total as f64 * 4.0 + cache as f64));
    s
}

pub fn run(a: Args) -> Result<()> {
    let model = load_model(&a.model)?;
    println!("{}", a.model.display());
    print!("{}", report(&model, a.decode_tokens, a.batch));
    Ok(())
}
