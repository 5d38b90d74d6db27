//! Checkpoints in the authors' Hugging Face layout: `config.json` plus `model.safetensors`, or
//! sharded `model-0000x-of-0000y.safetensors` files listed by `model.safetensors.index.json`.
//! Tensors may be f32, bf16 or f16; they are held as f32.

use crate::config::{Config, FgateType};
use crate::model::Model;
use anyhow::{anyhow, bail, Context, Result};
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

pub const CONFIG_FILE: &str = "config.json";
pub const WEIGHTS_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// Decodes one tensor's bytes to f32.
pub fn to_f32(dtype: Dtype, bytes: &[u8], what: &str) -> Result<Vec<f32>> {
    let chunk = |n: usize| {
        if bytes.len() % n != 0 {
            Err(anyhow!("{what}: {} bytes is not a whole number of {dtype:?} values", bytes.len()))
        } else {
            Ok(bytes.chunks_exact(n))
        }
    };
    Ok(match dtype {
        Dtype::F32 => chunk(4)?.map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Dtype::BF16 => chunk(2)?.map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::F16 => chunk(2)?.map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect(),
        Dtype::F64 => chunk(8)?.map(|c| f64::from_le_bytes(c.try_into().unwrap()) as f32).collect(),
        other => bail!("{what}: unsupported dtype {other:?} (expected F32, BF16 or F16)"),
    })
}

/// The safetensors files of a model folder: the index's shards, or model.safetensors.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join(INDEX_FILE);
    if index.exists() {
        let text = std::fs::read_to_string(&index).with_context(|| format!("cannot read {}", index.display()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{}: malformed JSON", index.display()))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| anyhow!("{}: no \"weight_map\" object", index.display()))?;
        let mut files: Vec<PathBuf> = Vec::new();
        for (name, f) in map {
            let f = f
                .as_str()
                .ok_or_else(|| anyhow!("{}: weight_map entry {name:?} is not a file name", index.display()))?;
            let p = dir.join(f);
            if !files.contains(&p) {
                files.push(p);
            }
        }
        files.sort();
        if files.is_empty() {
            bail!("{}: weight_map is empty", index.display());
        }
        return Ok(files);
    }
    let single = dir.join(WEIGHTS_FILE);
    if !single.exists() {
        bail!("{}: neither {WEIGHTS_FILE} nor {INDEX_FILE} found", dir.display());
    }
    Ok(vec![single])
}

/// Reads every tensor of a set of safetensors files: name → (file, shape, f32 data).
pub fn read_tensors(files: &[PathBuf]) -> Result<BTreeMap<String, (PathBuf, Vec<usize>, Vec<f32>)>> {
    let mut out = BTreeMap::new();
    for f in files {
        let file = std::fs::File::open(f).with_context(|| format!("cannot open {}", f.display()))?;
        // SAFETY: the file is only read; a concurrent writer could change what we read but not
        // cause undefined behaviour beyond wrong values, which the shape checks below catch.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("cannot map {}", f.display()))?;
        let st = SafeTensors::deserialize(&mmap)
            .map_err(|e| anyhow!("{}: not a valid safetensors file: {e}", f.display()))?;
        for (name, view) in st.tensors() {
            let what = format!("{}: tensor {name}", f.display());
            let data = to_f32(view.dtype(), view.data(), &what)?;
            if out.insert(name.clone(), (f.clone(), view.shape().to_vec(), data)).is_some() {
                bail!("{what} appears in more than one file");
            }
        }
    }
    Ok(out)
}

/// b_h = −log(expm1(1/T_h)), T_h log-spaced over [decay_time_min, decay_time_max].
pub fn fixed_fgate_bias(cfg: &Config) -> Vec<f32> {
    let (lo, hi) = (cfg.decay_time_min.unwrap_or(1.0).ln(), cfg.decay_time_max.unwrap_or(1.0).ln());
    let h = cfg.num_heads;
    (0..h)
        .map(|i| {
            let f = if h == 1 { 0.0 } else { i as f64 / (h - 1) as f64 };
            let t = (lo + (hi - lo) * f).exp();
            (-(1.0 / t).exp_m1().ln()) as f32
        })
        .collect()
}

/// Loads config.json and the weights of a model folder.
pub fn load_model(dir: &Path) -> Result<Model> {
    if !dir.is_dir() {
        bail!("{}: not a model folder (expected config.json and model.safetensors)", dir.display());
    }
    let cfg = Config::load(&dir.join(CONFIG_FILE))?;
    let files = weight_files(dir)?;
    let mut tensors = read_tensors(&files)?;
    let mut model = Model::new(&cfg);
    let where_ = || files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ");
    for i in 0..model.params.len() {
        let name = model.params.names[i].clone();
        let want = model.params.tensors[i].shape.clone();
        match tensors.remove(&name) {
            Some((file, shape, data)) => {
                if shape != want {
                    bail!("{}: tensor {name} has shape {shape:?}, the config implies {want:?}", file.display());
                }
                model.params.tensors[i].data = data;
            }
            None if cfg.fgate_type == FgateType::Fixed && name.ends_with(".attn.fgate_bias") => {
                // A buffer some exports omit: it is a pure function of the config.
                model.params.tensors[i].data = fixed_fgate_bias(&cfg);
            }
            None => bail!("{}: tensor {name} (shape {want:?}) is missing", where_()),
        }
    }
    if let Some((name, (file, shape, _))) = tensors.into_iter().next() {
        bail!("{}: unexpected tensor {name} (shape {shape:?}) that this configuration does not use", file.display());
    }
    Ok(model)
}

/// Writes `config` and the parameters as config.json + model.safetensors (f32) into `dir`,
/// each file through a temporary name and a rename so a failure never leaves a torn file.
pub fn save_model(model: &Model, config: &Config, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut named: HashMap<String, (Vec<usize>, Vec<u8>)> = HashMap::new();
    for (i, name) in model.params.names.iter().enumerate() {
        let t = &model.params.tensors[i];
        let bytes: Vec<u8> = t.data.iter().flat_map(|v| v.to_le_bytes()).collect();
        named.insert(name.clone(), (t.shape.clone(), bytes));
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = named
        .iter()
        .map(|(n, (s, b))| {
            (n.clone(), safetensors::tensor::TensorView::new(Dtype::F32, s.clone(), b).expect("consistent"))
        })
        .collect();
    let mut meta = HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    let bytes = safetensors::serialize(views, Some(meta)).map_err(|e| anyhow!("serialising weights: {e}"))?;
    write_atomic(&dir.join(WEIGHTS_FILE), &bytes)?;
    write_atomic(&dir.join(CONFIG_FILE), config.to_json().as_bytes())?;
    crate::tokenizer_export::write_tokenizer_files(dir, config, None)?;
    Ok(())
}

/// Writes a file through `<name>.tmp` + fsync + rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension(format!("{}.tmp", path.extension().and_then(|e| e.to_str()).unwrap_or("")));
    let res = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = res {
        let _ = std::fs::remove_file(&tmp);
        return Err(anyhow!("cannot write {}: {e}", path.display()));
    }
    Ok(())
}
