//! The seeded initialisation of a new model (SPEC §3), per family.

use crate::checkpoint::fixed_fgate_bias;
use crate::config::{Config, FgateType};
use crate::model::Model;
use crate::tensor::ParamKind;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Normal};

/// Samba's initialisation, as the authors' SambaPreTrainedModel._init_weights leaves it (the
/// embedding keeps its N(0, initializer_range)): every Linear at PyTorch's default U(±1/√in)
/// (the output head too), the residual outputs (o_proj, down_proj, out_proj) rescaled by
/// 1/√(2·layers), and the Mamba layers' own parameters ([`crate::model::mamba::MambaMixer::init`]).
fn init_samba(model: &mut Model, rng: &mut ChaCha8Rng) {
    use crate::model::mamba2::uniform;
    use crate::model::{Linear, Mixer};
    let layers = model.layers.len();
    let rescale = 1.0 / ((2 * layers.max(1)) as f32).sqrt();
    let default = |p: &mut crate::tensor::Params, l: &Linear, scale: f32, rng: &mut ChaCha8Rng| {
        uniform(&mut p[l.weight], scale / (l.in_features as f32).sqrt(), rng)
    };
    for i in 0..layers {
        let blk = model.layers[i].clone();
        let p = &mut model.params;
        match &blk.mixer {
            Mixer::Attention(a) => {
                for l in [&a.q_proj, &a.k_proj.linear, &a.v_proj.linear] {
                    default(p, l, 1.0, rng);
                }
                default(p, &a.o_proj, rescale, rng);
            }
            Mixer::Mamba(m) => m.init(p, layers, rng),
            Mixer::Mamba2(_) | Mixer::DeltaNet(_) | Mixer::Hgrn2(_) => {}
        }
        if let Some(m) = &blk.mlp {
            default(p, &m.mlp.gate_proj, 1.0, rng);
            default(p, &m.mlp.down_proj, rescale, rng);
        }
    }
    let head = model.lm_head;
    default(&mut model.params, &head, 1.0, rng);
}

/// DeltaNet's, Gated DeltaNet's and HGRN2's initialisation beyond the generic draw: the authors'
/// DeltaNet and HGRN2 divide o_proj and down_proj by √(2·layers) (GPT-2's residual rescaling),
/// and each DeltaNet layer draws its own decay parameters
/// ([`crate::model::deltanet::DeltaNetMixer::init`], [`crate::model::hgrn2::Hgrn2Mixer::init`]).
fn init_deltanet(model: &mut Model, rng: &mut ChaCha8Rng) {
    let layers = model.layers.len();
    let rescale = 1.0 / ((2 * layers.max(1)) as f32).sqrt();
    for i in 0..layers {
        let blk = model.layers[i].clone();
        let p = &mut model.params;
        match &blk.mixer {
            crate::model::Mixer::DeltaNet(l) => l.init(p, layers, rng),
            crate::model::Mixer::Hgrn2(l) => l.init(p, layers),
            _ => {}
        }
        if let Some(m) = &blk.mlp {
            p[m.mlp.down_proj.weight].iter_mut().for_each(|w| *w *= rescale);
        }
    }
}

/// Initialises `cfg`'s parameters (SPEC §2): every Linear and the embedding ~ N(0, std), norm
/// weights 1, biases 0; the fixed forget gate's bias from its decay times. Seeded.
pub fn init_model(cfg: &Config, seed: u64) -> Model {
    let mut model = Model::new(cfg);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let normal = Normal::new(0.0f32, cfg.initializer_range as f32).expect("valid std");
    let p = &mut model.params;
    for i in 0..p.len() {
        let name = p.names[i].clone();
        let data = &mut p.tensors[i].data;
        match p.kinds[i] {
            ParamKind::Matrix => data.iter_mut().for_each(|x| *x = normal.sample(&mut rng)),
            // Every RMSNorm weight starts at 1, the recurrent models' final norm_f too.
            _ if name.ends_with("norm.weight") || name.ends_with("norm_f.weight") => data.fill(1.0),
            _ if name.ends_with(".fgate_bias") && cfg.fgate_type == FgateType::Fixed => {
                data.copy_from_slice(&fixed_fgate_bias(cfg))
            }
            _ if cfg.fgate_bias_init
                && cfg.decay_time_min.is_some()
                && cfg.decay_time_max.is_some()
                && (name.ends_with(".fgate_bias") || name.ends_with(".fgate_proj.bias")) =>
            {
                data.copy_from_slice(&fixed_fgate_bias(cfg))
            }
            _ => data.fill(0.0),
        }
    }
    // Families with their own initialisation (after the generic pass, so FoX's draws are as they were).
    let n_layers = cfg.num_hidden_layers;
    for i in 0..model.layers.len() {
        if let crate::model::Mixer::Mamba2(l) = &model.layers[i].mixer {
            let l = l.clone();
            l.init(&mut model.params, n_layers, &mut rng);
        }
    }
    if cfg.arch() == crate::config::Arch::Samba {
        init_samba(&mut model, &mut rng);
    }
    if cfg.is_deltanet() || cfg.arch() == crate::config::Arch::Hgrn2 {
        init_deltanet(&mut model, &mut rng);
    }
    if cfg.arch() == crate::config::Arch::Mamba2 {
        // The authors' Mamba-2 leaves the output head at PyTorch's Linear default.
        let d = cfg.hidden_size;
        crate::model::mamba2::uniform(&mut model.params[model.lm_head.weight], 1.0 / (d as f32).sqrt(), &mut rng);
    }
    model
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_is_seeded_and_follows_the_spec() {
        let cfg = crate::presets::tiny().model;
        let a = init_model(&cfg, 1);
        let b = init_model(&cfg, 1);
        let c = init_model(&cfg, 2);
        assert_eq!(a.params.tensors, b.params.tensors);
        assert_ne!(a.params.tensors[0], c.params.tensors[0]);
        for i in 0..a.params.len() {
            let (name, data) = (&a.params.names[i], &a.params.tensors[i].data);
            match a.params.kinds[i] {
                ParamKind::Matrix => {
                    let n = data.len() as f64;
                    let mean = data.iter().map(|&x| x as f64).sum::<f64>() / n;
                    let std = (data.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
                    // five standard errors of the sample mean and std of n draws of N(0, 0.02²)
                    let (tm, ts) = ((5.0 * 0.02 / n.sqrt()).max(0.005), (5.0 * 0.02 / (2.0 * n).sqrt()).max(0.002));
                    assert!(mean.abs() < tm && (std - 0.02).abs() < ts, "{name}: mean {mean} std {std}");
                }
                _ if name.ends_with("norm.weight") => assert!(data.iter().all(|&x| x == 1.0), "{name}"),
                _ => assert!(data.iter().all(|&x| x == 0.0), "{name}"),
            }
        }
        let mut fixed = cfg.clone();
        fixed.fgate_type = FgateType::Fixed;
        fixed.decay_time_min = Some(2.0);
        fixed.decay_time_max = Some(100.0);
        let m = init_model(&fixed, 0);
        let id = m.params.id("model.layers.0.attn.fgate_bias").unwrap();
        assert_eq!(&m.params[id], &fixed_fgate_bias(&fixed)[..]);
    }
}
