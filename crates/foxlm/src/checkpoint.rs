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

/// Largest safetensors header foxlm reads: a 760M FoX checkpoint's header is about 30 KB, so a
/// header of more than this is damage, and refusing it bounds what parsing it may allocate.
pub const MAX_HEADER_BYTES: u64 = 16 << 20;

/// Decodes one tensor's bytes to f32.
pub fn to_f32(dtype: Dtype, bytes: &[u8], what: &str) -> Result<Vec<f32>> {
    let width = dtype_width(dtype).ok_or_else(|| unsupported_dtype(dtype, what))?;
    let mut out = vec![0.0; bytes.len() / width];
    decode_into(dtype, bytes, &mut out, what)?;
    Ok(out)
}

/// Bytes per value of the dtypes foxlm reads, None for the others.
fn dtype_width(dtype: Dtype) -> Option<usize> {
    match dtype {
        Dtype::F32 => Some(4),
        Dtype::BF16 | Dtype::F16 => Some(2),
        Dtype::F64 => Some(8),
        _ => None,
    }
}

fn unsupported_dtype(dtype: Dtype, what: &str) -> anyhow::Error {
    anyhow!("{what}: unsupported dtype {dtype:?} (expected F32, BF16, F16 or F64)")
}

/// Decodes `bytes` of `dtype` into `out`, which must hold exactly as many values.
pub fn decode_into(dtype: Dtype, bytes: &[u8], out: &mut [f32], what: &str) -> Result<()> {
    let width = dtype_width(dtype).ok_or_else(|| unsupported_dtype(dtype, what))?;
    if !bytes.len().is_multiple_of(width) || bytes.len() / width != out.len() {
        bail!("{what}: {} bytes are not {} {dtype:?} values", bytes.len(), out.len());
    }
    let chunks = bytes.chunks_exact(width).zip(out.iter_mut());
    match dtype {
        Dtype::F32 => chunks.for_each(|(c, o)| *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        Dtype::BF16 => chunks.for_each(|(c, o)| *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32()),
        Dtype::F16 => chunks.for_each(|(c, o)| *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32()),
        _ => chunks.for_each(|(c, o)| *o = f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32),
    }
    Ok(())
}

/// One tensor as its file's header describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorEntry {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Byte range of its data in the file.
    pub start: usize,
    pub end: usize,
}

/// A safetensors file, mapped, with its header parsed and checked (header size, offsets within
/// the file, sizes agreeing with shapes and dtypes) and no tensor data read yet.
pub struct TensorFile {
    pub path: PathBuf,
    mmap: memmap2::Mmap,
    pub entries: BTreeMap<String, TensorEntry>,
}

impl TensorFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let len = file.metadata().with_context(|| format!("cannot stat {}", path.display()))?.len();
        if len < 8 {
            bail!("{}: {len} bytes, too short for a safetensors file (truncated?)", path.display());
        }
        // SAFETY: the file is only read; a concurrent writer could change what we read but not
        // cause undefined behaviour beyond wrong values.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("cannot map {}", path.display()))?;
        let n = u64::from_le_bytes([mmap[0], mmap[1], mmap[2], mmap[3], mmap[4], mmap[5], mmap[6], mmap[7]]);
        if n > MAX_HEADER_BYTES {
            bail!(
                "{}: header length field says {n} bytes, more than any checkpoint's ({MAX_HEADER_BYTES}): not a safetensors file, or damaged",
                path.display()
            );
        }
        if n > len - 8 {
            bail!(
                "{}: header length field says {n} bytes, but only {} bytes follow it: truncated or damaged",
                path.display(),
                len - 8
            );
        }
        let (n, meta) = SafeTensors::read_metadata(&mmap).map_err(|e| {
            let hint = match e {
                safetensors::SafeTensorError::MetadataIncompleteBuffer => " (truncated or half-written?)",
                _ => "",
            };
            anyhow!("{}: not a valid safetensors file: {e}{hint}", path.display())
        })?;
        let base = 8 + n;
        let entries = meta
            .tensors()
            .into_iter()
            .map(|(name, info)| {
                let (s, e) = info.data_offsets;
                (name, TensorEntry { dtype: info.dtype, shape: info.shape.clone(), start: base + s, end: base + e })
            })
            .collect();
        Ok(Self { path: path.to_path_buf(), mmap, entries })
    }

    /// The raw bytes of tensor `name` (offsets were checked against the file at open).
    pub fn bytes(&self, name: &str) -> Option<&[u8]> {
        self.entries.get(name).and_then(|e| self.mmap.get(e.start..e.end))
    }

    /// Decodes tensor `name` into `out` (exactly its number of values). A NaN or infinity is an
    /// error: no weight or optimizer moment of a usable checkpoint holds one, and loading it would
    /// give silently wrong results.
    pub fn decode_into(&self, name: &str, out: &mut [f32]) -> Result<()> {
        let what = format!("{}: tensor {name}", self.path.display());
        let e = self.entries.get(name).ok_or_else(|| anyhow!("{what} is missing"))?;
        let bytes = self.bytes(name).ok_or_else(|| anyhow!("{what}: data lies outside the file"))?;
        decode_into(e.dtype, bytes, out, &what)?;
        if let Some(i) = out.iter().position(|v| !v.is_finite()) {
            bail!("{what} holds {} at index {i}: damaged weights", out[i]);
        }
        Ok(())
    }
}

/// Compares the tensors of `files` with `expected` (name, shape), before anything is allocated
/// for them: every expected tensor present once with its shape and a readable dtype, nothing
/// else. `optional(name)` marks tensors that may be absent. Returns, per expected tensor, the
/// index of the file holding it (None where an optional one is absent).
pub fn match_layout(
    files: &[TensorFile],
    expected: &[(String, Vec<usize>)],
    optional: impl Fn(&str) -> bool,
    source: &str,
) -> Result<Vec<Option<usize>>> {
    let mut found: HashMap<&str, usize> = HashMap::new();
    for (fi, f) in files.iter().enumerate() {
        for name in f.entries.keys() {
            if let Some(prev) = found.insert(name, fi) {
                bail!("tensor {name} appears in both {} and {}", files[prev].path.display(), f.path.display());
            }
        }
    }
    let mut out = Vec::with_capacity(expected.len());
    for (name, want) in expected {
        match found.remove(name.as_str()) {
            Some(fi) => {
                let (f, e) = (&files[fi], &files[fi].entries[name]);
                if &e.shape != want {
                    bail!("{}: tensor {name} has shape {:?}, {source} implies {want:?}", f.path.display(), e.shape);
                }
                if dtype_width(e.dtype).is_none() {
                    bail!(
                        "{}: tensor {name} has dtype {:?}; expected F32, BF16, F16 or F64",
                        f.path.display(),
                        e.dtype
                    );
                }
                out.push(Some(fi));
            }
            None if optional(name) => out.push(None),
            None => {
                let all = files.iter().map(|f| f.path.display().to_string()).collect::<Vec<_>>().join(", ");
                bail!("{all}: tensor {name} (shape {want:?}) is missing");
            }
        }
    }
    if let Some((name, fi)) = found.into_iter().min() {
        let (f, e) = (&files[fi], &files[fi].entries[name]);
        bail!("{}: unexpected tensor {name} (shape {:?}) that {source} does not use", f.path.display(), e.shape);
    }
    Ok(out)
}

/// The safetensors files of a model folder: the index's shards, or model.safetensors. With an
/// index, also the file each tensor is listed in (checked against the shards' headers later).
/// A model folder's weight files and, with an index, the file each tensor is listed in.
type WeightFiles = (Vec<PathBuf>, Option<BTreeMap<String, PathBuf>>);

fn weight_files(dir: &Path) -> Result<WeightFiles> {
    let index = dir.join(INDEX_FILE);
    if index.exists() {
        let text = crate::validate::read_text(&index)?;
        let v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{}: malformed JSON", index.display()))?;
        let map = v
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| anyhow!("{}: no \"weight_map\" object", index.display()))?;
        let mut files: Vec<PathBuf> = Vec::new();
        let mut listed = BTreeMap::new();
        for (name, f) in map {
            let f = f
                .as_str()
                .ok_or_else(|| anyhow!("{}: weight_map entry {name:?} is not a file name", index.display()))?;
            let p = crate::validate::file_in_dir(dir, f, &index)?;
            if !files.contains(&p) {
                files.push(p.clone());
            }
            listed.insert(name.clone(), p);
        }
        files.sort();
        if files.is_empty() {
            bail!("{}: weight_map is empty", index.display());
        }
        return Ok((files, Some(listed)));
    }
    let single = dir.join(WEIGHTS_FILE);
    if !single.exists() {
        bail!("{}: neither {WEIGHTS_FILE} nor {INDEX_FILE} found", dir.display());
    }
    Ok((vec![single], None))
}

/// A tensor read by [`read_tensors`]: its file, shape and values.
pub type NamedTensor = (PathBuf, Vec<usize>, Vec<f32>);

/// Reads every tensor of a set of safetensors files: name → (file, shape, f32 data). Checks each
/// file's header first, and the memory the decoded tensors need.
pub fn read_tensors(files: &[PathBuf]) -> Result<BTreeMap<String, NamedTensor>> {
    let opened = files.iter().map(|f| TensorFile::open(f)).collect::<Result<Vec<_>>>()?;
    let mut need = 0u128;
    for f in &opened {
        for (name, e) in &f.entries {
            let w = dtype_width(e.dtype)
                .ok_or_else(|| unsupported_dtype(e.dtype, &format!("{}: tensor {name}", f.path.display())))?;
            need += ((e.end - e.start) / w) as u128 * 4;
        }
    }
    crate::validate::check_memory(need, &format!("{}: the tensors as f32", files_list(files)))?;
    let mut out = BTreeMap::new();
    for f in &opened {
        for (name, e) in &f.entries {
            let mut data = vec![0.0; crate::validate::checked_numel(&e.shape, name)?];
            f.decode_into(name, &mut data)?;
            if out.insert(name.clone(), (f.path.clone(), e.shape.clone(), data)).is_some() {
                bail!("{}: tensor {name} appears in more than one file", f.path.display());
            }
        }
    }
    Ok(out)
}

fn files_list(files: &[PathBuf]) -> String {
    files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ")
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

/// Whether parameter `name` is an MLP's fused [gate | up] projection that fla's DeltaNet and HGRN2
/// checkpoints keep as two tensors (`mlp.gate_proj.weight` and `mlp.up_proj.weight`, [I, d] each).
fn is_split_mlp(cfg: &Config, name: &str) -> bool {
    cfg.fla_split_mlp() && name.ends_with(".mlp.gate_proj.weight")
}

/// fla's name of the up half of a fused MLP projection.
fn up_proj_name(gate: &str) -> String {
    format!("{}.mlp.up_proj.weight", gate.trim_end_matches(".mlp.gate_proj.weight"))
}

/// The tensors of `layout` as a checkpoint holds them: with `split`, each fused MLP projection
/// [2I, d] of a DeltaNet model as fla's gate_proj and up_proj, [I, d] each (rows 0..I and I..2I).
fn file_layout(cfg: &Config, layout: &[(String, Vec<usize>)], split: bool) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::with_capacity(layout.len());
    for (name, shape) in layout {
        if split && is_split_mlp(cfg, name) {
            let half = vec![shape[0] / 2, shape[1]];
            out.push((name.clone(), half.clone()));
            out.push((up_proj_name(name), half));
        } else {
            out.push((name.clone(), shape.clone()));
        }
    }
    out
}

/// The parameters as model.safetensors holds them, by name: each parameter, except that a
/// DeltaNet model's fused MLP projection is written as fla's gate_proj and up_proj (fla's
/// from_pretrained reads the folder; [`load_model`] reads either form).
pub fn export_tensors(model: &Model) -> Vec<(String, Vec<usize>, &[f32])> {
    let p = &model.params;
    let mut out = Vec::with_capacity(p.len());
    for i in 0..p.len() {
        let (name, t) = (&p.names[i], &p.tensors[i]);
        if is_split_mlp(&model.config, name) {
            let (gate, up) = t.data.split_at(t.data.len() / 2);
            let half = vec![t.shape[0] / 2, t.shape[1]];
            out.push((name.clone(), half.clone(), gate));
            out.push((up_proj_name(name), half, up));
        } else {
            out.push((name.clone(), t.shape.clone(), &t.data[..]));
        }
    }
    out
}

/// Checks a model folder without allocating its weights: config.json's fields, the parameter
/// layout it implies against the safetensors headers (and the shard index), and the memory the
/// parameters need against what the machine has. Returns the config, the opened files, the
/// tensors the files hold for the layout (see [`file_layout`]: a DeltaNet checkpoint's MLP
/// projections fused as foxlm writes them or split as fla does) and, per tensor, the file that
/// holds it.
#[allow(clippy::type_complexity)]
pub fn check_model_folder(
    dir: &Path,
) -> Result<(Config, Vec<TensorFile>, Vec<(String, Vec<usize>)>, Vec<Option<usize>>)> {
    if !dir.is_dir() {
        bail!("{}: not a model folder (expected config.json and model.safetensors)", dir.display());
    }
    let cfg_path = dir.join(CONFIG_FILE);
    let cfg = Config::load(&cfg_path)?;
    let (paths, listed) = weight_files(dir)?;
    let files = paths.iter().map(|p| TensorFile::open(p)).collect::<Result<Vec<_>>>()?;
    if let Some(listed) = &listed {
        let index = dir.join(INDEX_FILE);
        for f in &files {
            for name in f.entries.keys() {
                match listed.get(name) {
                    Some(p) if p == &f.path => {}
                    Some(p) => bail!(
                        "{}: lists tensor {name} in {}, but it is in {}",
                        index.display(),
                        p.display(),
                        f.path.display()
                    ),
                    None => {
                        bail!("{}: tensor {name} of {} is not in its weight_map", index.display(), f.path.display())
                    }
                }
            }
        }
        for (name, p) in listed {
            if !files.iter().any(|f| &f.path == p && f.entries.contains_key(name)) {
                bail!("{}: lists tensor {name} in {}, which does not hold it", index.display(), p.display());
            }
        }
    }
    let split =
        cfg.fla_split_mlp() && files.iter().any(|f| f.entries.keys().any(|k| k.ends_with(".mlp.up_proj.weight")));
    let layout = file_layout(&cfg, &cfg.param_layout(), split);
    let fixed = cfg.fgate_type == FgateType::Fixed;
    // The fixed gate's bias is a buffer some exports omit: it is a pure function of the config.
    let source = cfg_path.display().to_string();
    let placed = match_layout(&files, &layout, |n| fixed && n.ends_with(".attn.fgate_bias"), &source)?;
    crate::validate::check_memory(cfg.param_bytes(), &format!("{}: the model's parameters (f32)", dir.display()))?;
    Ok((cfg, files, layout, placed))
}

/// Loads config.json and the weights of a model folder, checking everything first (see
/// [`check_model_folder`]).
pub fn load_model(dir: &Path) -> Result<Model> {
    let (cfg, files, in_files, placed) = check_model_folder(dir)?;
    let layout = cfg.param_layout();
    let mut model = Model::new(&cfg);
    if model.params.len() != layout.len()
        || (0..layout.len())
            .any(|i| model.params.names[i] != layout[i].0 || model.params.tensors[i].shape != layout[i].1)
    {
        bail!("internal error: Config::param_layout disagrees with Model::new for {}", dir.display());
    }
    // Each parameter from its tensor, or from its two halves where the files split it.
    let mut j = 0;
    for (i, (name, _)) in layout.iter().enumerate() {
        let data = &mut model.params.tensors[i].data;
        let parts = if in_files.get(j).is_some_and(|(n, _)| n == name) && in_files[j].1 == layout[i].1 { 1 } else { 2 };
        let n = data.len() / parts;
        for (k, chunk) in data.chunks_mut(n.max(1)).enumerate().take(parts) {
            match placed[j + k] {
                Some(fi) => files[fi].decode_into(&in_files[j + k].0, chunk)?,
                None => chunk.copy_from_slice(&fixed_fgate_bias(&cfg)),
            }
        }
        j += parts;
    }
    Ok(model)
}

/// Writes `config` and the parameters as config.json + model.safetensors (f32) into `dir`,
/// each file through a temporary name and a rename so a failure never leaves a torn file.
pub fn save_model(model: &Model, config: &Config, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut named: HashMap<String, (Vec<usize>, Vec<u8>)> = HashMap::new();
    for (name, shape, data) in export_tensors(model) {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        named.insert(name, (shape, bytes));
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
    crate::fsutil::write_atomic(&dir.join(WEIGHTS_FILE), &bytes)?;
    crate::fsutil::write_atomic(&dir.join(CONFIG_FILE), config.to_json().as_bytes())?;
    crate::tokenizer_export::write_tokenizer_files(dir, config, None)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(v: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/official-fox-tiny").join(v)
    }

    /// A copy of a fixture's config.json and model.safetensors in a temporary folder.
    fn copy(v: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for f in [CONFIG_FILE, WEIGHTS_FILE] {
            std::fs::copy(fixture(v).join(f), d.path().join(f)).unwrap();
        }
        d
    }

    fn edit_config(dir: &Path, from: &str, to: &str) {
        let p = dir.join(CONFIG_FILE);
        let s = std::fs::read_to_string(&p).unwrap();
        assert!(s.contains(from), "{from}");
        std::fs::write(&p, s.replace(from, to)).unwrap();
    }

    fn err<T>(r: Result<T>) -> String {
        match r {
            Ok(_) => panic!("expected an error"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn issue_examples_fail_before_allocating() {
        let d = copy("fox_llama");
        edit_config(d.path(), "\"vocab_size\": 512", "\"vocab_size\": 2147483648");
        let e = err(load_model(d.path()));
        assert!(
            e.ends_with("config.json: invalid configuration: vocab_size is 2147483648; expected 1 to 16777216"),
            "{e}"
        );
        let d = copy("fox_pro");
        edit_config(d.path(), "\"num_hidden_layers\": 2", "\"num_hidden_layers\": 9223372036854775807");
        let e = err(load_model(d.path()));
        assert!(e.contains("num_hidden_layers is 9223372036854775807; expected 1 to 4096"), "{e}");
    }

    #[test]
    fn layout_is_compared_with_the_header() {
        let d = copy("fox_llama");
        edit_config(d.path(), "\"hidden_ratio\": 4", "\"hidden_ratio\": 2");
        let e = err(load_model(d.path()));
        let st = d.path().join(WEIGHTS_FILE);
        let cfg = d.path().join(CONFIG_FILE);
        assert_eq!(
            e,
            format!(
                "{}: tensor model.layers.0.mlp.gate_proj.weight has shape [1024, 128], {} implies [512, 128]",
                st.display(),
                cfg.display()
            )
        );
        let d = copy("fox_llama");
        edit_config(d.path(), "\"use_output_gate\": false", "\"use_output_gate\": true");
        let e = err(load_model(d.path()));
        assert!(e.ends_with("tensor model.layers.0.attn.ogate_proj.weight (shape [128, 128]) is missing"), "{e}");
        let d = copy("fox_pro");
        edit_config(d.path(), "\"use_k_shift\": true", "\"use_k_shift\": false");
        let e = err(load_model(d.path()));
        assert!(e.contains("tensor model.layers.0.attn.k_proj.weight (shape [128, 128]) is missing"), "{e}");
    }

    /// Writes a safetensors file whose header describes `tensors` (F32 unless given), with the
    /// data region as a sparse hole of the right length.
    fn write_header_only(path: &Path, tensors: &[(String, Vec<usize>, &str)]) {
        let mut header = serde_json::Map::new();
        let mut off = 0u64;
        for (name, shape, dtype) in tensors {
            let n: u64 = shape.iter().map(|&x| x as u64).product::<u64>() * if *dtype == "F32" { 4 } else { 8 };
            header.insert(
                name.clone(),
                serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}),
            );
            off += n;
        }
        let h = serde_json::Value::Object(header).to_string().into_bytes();
        let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(&h);
        std::fs::write(path, &bytes).unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.set_len(bytes.len() as u64 + off).unwrap();
    }

    #[test]
    fn a_model_larger_than_memory_is_an_error_saying_how_much() {
        let d = copy("fox_llama");
        for (from, to) in [
            ("\"vocab_size\": 512", "\"vocab_size\": 16777216"),
            ("\"hidden_size\": 128", "\"hidden_size\": 16384"),
            ("\"num_heads\": 4", "\"num_heads\": 128"),
            ("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 1"),
        ] {
            edit_config(d.path(), from, to);
        }
        let cfg = Config::load(&d.path().join(CONFIG_FILE)).unwrap();
        let layout: Vec<_> = cfg.param_layout().into_iter().map(|(n, s)| (n, s, "F32")).collect();
        write_header_only(&d.path().join(WEIGHTS_FILE), &layout);
        let e = err(load_model(d.path()));
        let want = format!("{}: the model's parameters (f32) need 2.0 TiB, but only ", d.path().display());
        assert!(e.starts_with(&want) && e.ends_with("of memory is available"), "{e}");
    }

    #[test]
    fn dtypes_truncation_and_header_length_are_checked() {
        let d = copy("fox_llama");
        let st = d.path().join(WEIGHTS_FILE);
        let cfg = Config::load(&d.path().join(CONFIG_FILE)).unwrap();
        let mut layout: Vec<_> = cfg.param_layout().into_iter().map(|(n, s)| (n, s, "F32")).collect();
        layout[0].2 = "I64";
        write_header_only(&st, &layout);
        let e = err(load_model(d.path()));
        assert_eq!(
            e,
            format!("{}: tensor model.embeddings.weight has dtype I64; expected F32, BF16, F16 or F64", st.display())
        );

        let d = copy("fox_llama");
        let st = d.path().join(WEIGHTS_FILE);
        let len = std::fs::metadata(&st).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&st).unwrap().set_len(len - 1).unwrap();
        let e = err(load_model(d.path()));
        assert!(e.starts_with(&format!("{}: not a valid safetensors file", st.display())), "{e}");
        assert!(e.ends_with("(truncated or half-written?)"), "{e}");

        let mut bytes = std::fs::read(fixture("fox_llama").join(WEIGHTS_FILE)).unwrap();
        bytes[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        std::fs::write(&st, &bytes).unwrap();
        let e = err(load_model(d.path()));
        assert!(e.contains("header length field says 1099511627776 bytes, more than any checkpoint's"), "{e}");
        std::fs::write(&st, &bytes[..5]).unwrap();
        let e = err(load_model(d.path()));
        assert_eq!(e, format!("{}: 5 bytes, too short for a safetensors file (truncated?)", st.display()));
    }

    #[test]
    fn the_shard_index_is_checked_against_the_shards() {
        let d = copy("fox_llama");
        let st = d.path().join(WEIGHTS_FILE);
        let names: Vec<String> =
            Config::load(&d.path().join(CONFIG_FILE)).unwrap().param_layout().into_iter().map(|(n, _)| n).collect();
        let index = d.path().join(INDEX_FILE);
        let write_index = |map: serde_json::Value| {
            std::fs::write(&index, serde_json::json!({"weight_map": map}).to_string()).unwrap()
        };
        let all = |file: &str| {
            serde_json::Value::Object(names.iter().map(|n| (n.clone(), serde_json::json!(file))).collect())
        };
        write_index(all(WEIGHTS_FILE));
        assert!(load_model(d.path()).is_ok());
        write_index(all("../model.safetensors"));
        let e = err(load_model(d.path()));
        assert!(e.contains("file name \"../model.safetensors\" points outside"), "{e}");
        let mut m = all(WEIGHTS_FILE);
        m.as_object_mut().unwrap().remove("lm_head.weight");
        write_index(m);
        let e = err(load_model(d.path()));
        assert_eq!(
            e,
            format!("{}: tensor lm_head.weight of {} is not in its weight_map", index.display(), st.display())
        );
        let mut m = all(WEIGHTS_FILE);
        m.as_object_mut().unwrap().insert("extra.weight".into(), serde_json::json!(WEIGHTS_FILE));
        write_index(m);
        let e = err(load_model(d.path()));
        assert_eq!(
            e,
            format!("{}: lists tensor extra.weight in {}, which does not hold it", index.display(), st.display())
        );
    }
}
