//! Starting a run from a model's weights (`foxlm train --init-from MODEL_DIR`): a new run, with a
//! fresh optimizer and step counter and its own recipe, context and data, whose initial
//! parameters are those of a model folder: the authors' Hugging Face layout (config.json +
//! model.safetensors, maybe sharded, f32/bf16/f16), a foxlm checkpoint, or a foxlm run folder
//! (its latest checkpoint).
//!
//! The architecture is the folder's config.json. A run may change the fields that leave every
//! parameter's name and shape as they are (ACP's log_pruning_tolerance, rope_base, use_rope, the
//! sliding window, norm_eps, the fixed gate's decay times, ...): they are applied and reported as
//! "field: old -> new". A change that would change a parameter (hidden_size, num_kv_heads,
//! qk_norm, fgate_type full -> none, ...) is refused, naming the fields and the first tensor.

use crate::checkpoint::{fixed_fgate_bias, load_model, CONFIG_FILE};
use crate::config::{Config, FgateType};
use crate::model::Model;
use crate::train::{latest_checkpoint, TrainConfig, TRAINER_FILE};
use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};

/// The model folder a run starts from, before its weights are read.
#[derive(Clone, Debug)]
pub struct InitSource {
    /// The folder holding config.json and the weights (a run folder resolves to its latest
    /// checkpoint).
    pub dir: PathBuf,
    pub config: Config,
    /// The recipe of the run that wrote the folder (a foxlm checkpoint's trainer.json), if any.
    pub recipe: Option<TrainConfig>,
}

/// Reads `dir`'s config.json (and, in a foxlm checkpoint, its recipe). A foxlm run folder
/// (`foxlm train --out`) stands for its latest checkpoint.
pub fn read_source(dir: &Path) -> Result<InitSource> {
    if !dir.is_dir() {
        bail!("--init-from {}: not a model folder (expected config.json and model.safetensors)", dir.display());
    }
    let dir = match dir.join(CONFIG_FILE).is_file() {
        true => dir.to_path_buf(),
        false => latest_checkpoint(dir)?.ok_or_else(|| {
            anyhow!("--init-from {}: no {CONFIG_FILE}, and not a foxlm run folder with a checkpoint", dir.display())
        })?,
    };
    let config = Config::load(&dir.join(CONFIG_FILE))?;
    let tpath = dir.join(TRAINER_FILE);
    let recipe = match tpath.is_file() {
        false => None,
        true => {
            let text = crate::validate::read_text(&tpath)?;
            let v: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("{}: not valid JSON", tpath.display()))?;
            let t: TrainConfig = serde_json::from_value(v["trainer"]["run"]["train"].clone())
                .with_context(|| format!("{}: trainer.run.train is not a training recipe", tpath.display()))?;
            Some(t)
        }
    };
    Ok(InitSource { dir, config, recipe })
}

/// An architecture field a run changes: the values as JSON text.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub field: String,
    pub old: String,
    pub new: String,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} -> {}", self.field, self.old, self.new)
    }
}

/// The config.json fields (extra keys aside) on which `a` and `b` differ, in name order.
pub fn field_changes(a: &Config, b: &Config) -> Vec<Change> {
    crate::config::differing_fields(a, b)
        .into_iter()
        .map(|(field, old, new)| Change { field, old: old.to_string(), new: new.to_string() })
        .collect()
}

/// Checks that `run` (validated) keeps every parameter of `source` as it is, and returns the
/// fields it changes. An error names the fields that change a parameter and the first parameter
/// that differs.
pub fn architecture_changes(source: &Config, run: &Config) -> Result<Vec<Change>> {
    let changes = field_changes(source, run);
    let (a, b) = (source.param_layout(), run.param_layout());
    if a == b {
        return Ok(changes);
    }
    // The fields that change the layout on their own (together when none does alone).
    let src = serde_json::to_value(source).expect("config serialises");
    let alone: Vec<&Change> = changes
        .iter()
        .filter(|c| {
            let mut v = src.clone();
            v[&c.field] = serde_json::from_str(&c.new).unwrap_or(serde_json::Value::Null);
            serde_json::from_value::<Config>(v)
                .ok()
                .filter(|c| c.validate().is_ok())
                .is_none_or(|c| c.param_layout() != a)
        })
        .collect();
    let named = if alone.is_empty() { changes.iter().collect() } else { alone };
    let fields = named.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ");
    let tensor = first_layout_difference(&a, &b);
    bail!(
        "the weights cannot take this architecture: {fields} would change the parameters ({tensor}); \
         only fields that keep every tensor's shape can change"
    )
}

fn first_layout_difference(a: &[(String, Vec<usize>)], b: &[(String, Vec<usize>)]) -> String {
    for (x, y) in a.iter().zip(b) {
        if x != y {
            return match x.0 == y.0 {
                true => format!("{} would be {:?}, the weights' is {:?}", x.0, y.1, x.1),
                false => format!("the weights have {} {:?} where the new architecture has {} {:?}", x.0, x.1, y.0, y.1),
            };
        }
    }
    match a.len() > b.len() {
        true => format!("the weights' {} would be left over", a[b.len()].0),
        false => format!("{} would have no weights", b[a.len()].0),
    }
}

/// The initial model of a run with configuration `run` from `source`'s weights (every tensor
/// checked against config.json: names, shapes, dtypes, finite values). With the fixed gate, the
/// frozen bias follows `run`'s decay times when they (or the gate type) changed.
pub fn load_initial_model(source: &InitSource, run: &Config) -> Result<Model> {
    architecture_changes(&source.config, run)?;
    let mut loaded = load_model(&source.dir)?;
    let mut model = Model::new(run);
    for (to, from) in model.params.tensors.iter_mut().zip(loaded.params.tensors.iter_mut()) {
        std::mem::swap(&mut to.data, &mut from.data);
    }
    let s = &source.config;
    let refixed = run.fgate_type == FgateType::Fixed
        && (s.fgate_type != FgateType::Fixed
            || (s.decay_time_min, s.decay_time_max) != (run.decay_time_min, run.decay_time_max));
    if refixed {
        let bias = fixed_fgate_bias(run);
        for l in 0..run.num_hidden_layers {
            let id = model
                .params
                .id(&format!("model.layers.{l}.attn.fgate_bias"))
                .ok_or_else(|| anyhow!("internal error: the fixed gate of layer {l} has no bias"))?;
            model.params.tensors[id.0].data.copy_from_slice(&bias);
        }
    }
    Ok(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(v: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/official-fox-tiny").join(v)
    }

    #[test]
    fn shape_keeping_changes_are_listed_and_shape_changes_refused_by_name() {
        let src = read_source(&fixture("fox_pro")).unwrap();
        assert!(src.recipe.is_none(), "the authors' folder has no recipe");
        let base = src.config.clone();
        let mut run = base.clone();
        run.log_pruning_tolerance = Some(-10.0);
        run.rope_base = 10000.0;
        run.window_size = Some(64);
        let shown: Vec<String> = architecture_changes(&base, &run).unwrap().iter().map(|c| c.to_string()).collect();
        assert_eq!(
            shown,
            ["log_pruning_tolerance: null -> -10.0", "rope_base: 500000.0 -> 10000.0", "window_size: null -> 64"]
        );
        assert!(architecture_changes(&base, &base).unwrap().is_empty());

        let err = |run: &Config| format!("{:#}", architecture_changes(&base, run).unwrap_err());
        let mut kv = base.clone();
        kv.num_kv_heads = Some(2);
        kv.rope_base = 1000.0;
        let e = err(&kv);
        assert!(e.contains("num_kv_heads: null -> 2 would change the parameters"), "{e}");
        assert!(!e.contains("rope_base"), "only the field at fault is named: {e}");
        assert!(
            e.contains("model.layers.0.attn.k_proj.linear.weight would be [64, 128], the weights' is [128, 128]"),
            "{e}"
        );
        let mut shared = base.clone();
        shared.qk_norm_share_param_across_head = true;
        assert!(err(&shared).contains("qk_norm_share_param_across_head: false -> true"));
        let mut nogate = base.clone();
        nogate.fgate_type = FgateType::None;
        let e = err(&nogate);
        assert!(e.contains("fgate_type: \"full\" -> \"none\"") && e.contains("fgate_proj.weight"), "{e}");
    }

    #[test]
    fn the_fixed_gate_follows_new_decay_times_and_other_weights_are_the_folders() {
        let src = read_source(&fixture("fox_fixed")).unwrap();
        let same = load_initial_model(&src, &src.config).unwrap();
        let reference = load_model(&src.dir).unwrap();
        assert_eq!(same.params.tensors, reference.params.tensors);
        let mut run = src.config.clone();
        run.decay_time_max = Some(run.decay_time_max.unwrap() * 2.0);
        let m = load_initial_model(&src, &run).unwrap();
        let id = m.params.id("model.layers.1.attn.fgate_bias").unwrap();
        assert_eq!(&m.params[id], &fixed_fgate_bias(&run)[..]);
        assert_ne!(&m.params[id], &reference.params[id]);
        let q = m.params.id("model.layers.1.attn.q_proj.weight").unwrap();
        assert_eq!(&m.params[q], &reference.params[q]);
    }
}
