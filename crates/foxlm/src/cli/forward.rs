//! `foxlm forward`: logits for token ids read from a safetensors file.
//!
//! Contract (kept stable, so users can compare foxlm with other implementations): the input file
//! holds `input_ids` [B, T] (int64; int32 also accepted) and optionally `attention_mask` [B, T]
//! (1 = token, 0 = left padding); the output file holds `logits` [B, T, V] float32.
//! With `--with-grads` it also holds `loss` (a float32 scalar: the mean next-token cross-entropy,
//! position i predicting input_ids[:, i + 1], padded positions excluded) and `grad.<parameter>`
//! float32 for every trainable parameter: the gradient of that loss, as the reference fixtures'
//! `expected_grads.safetensors`.

use crate::backend::DeviceArg;
use crate::checkpoint::load_model;
use crate::fsutil::write_atomic;
use crate::infer::{self, Plan, DEFAULT_GPU_ROWS};
use crate::model::{Ctx, Model};
use crate::tensor::ParamKind;
use anyhow::{anyhow, bail, Context, Result};
use fox_kernels::cuda::Device;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model folder (config.json + model.safetensors).
    #[arg(long)]
    pub model: PathBuf,
    /// Safetensors file with `input_ids` [B, T] and optional `attention_mask` [B, T].
    #[arg(long)]
    pub input: PathBuf,
    /// Where to write `logits` [B, T, V] (float32).
    #[arg(long)]
    pub output: PathBuf,
    /// Also write `loss` (mean next-token cross-entropy) and `grad.<parameter name>` for every
    /// trainable parameter.
    /// (Gradients are computed on the CPU, the f32 reference: with `--device auto` the whole
    /// command then runs there.)
    #[arg(long)]
    pub with_grads: bool,
    #[command(flatten)]
    pub device: super::DeviceArgs,
}

/// A [B, T] integer tensor of an input file.
fn int_tensor(st: &SafeTensors, file: &Path, name: &str) -> Result<Option<(usize, usize, Vec<i64>)>> {
    let t = match st.tensor(name) {
        Ok(t) => t,
        Err(_) => return Ok(None),
    };
    let shape = t.shape();
    if shape.len() != 2 {
        bail!("{}: {name} has shape {shape:?}, expected [batch, seq]", file.display());
    }
    let v: Vec<i64> = match t.dtype() {
        Dtype::I64 => t.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect(),
        Dtype::I32 => t.data().chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64).collect(),
        Dtype::U32 => t.data().chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap()) as i64).collect(),
        Dtype::BOOL | Dtype::U8 => t.data().iter().map(|&b| b as i64).collect(),
        d => bail!("{}: {name} has dtype {d:?}, expected an integer type (I64)", file.display()),
    };
    Ok(Some((shape[0], shape[1], v)))
}

/// An input file's batch size B, length T, ids [B·T] and left padding per row (if any).
pub type Input = (usize, usize, Vec<u32>, Option<Vec<usize>>);

/// Reads and validates the input file: ids [B·T] and the left padding per row, if any.
pub fn read_input(path: &Path, vocab: usize) -> Result<Input> {
    let len = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?.len();
    crate::validate::check_memory(len as u128, &format!("{}: reading the input file", path.display()))?;
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow!("{}: not a valid safetensors file: {e}", path.display()))?;
    let (b, t, ids) =
        int_tensor(&st, path, "input_ids")?.ok_or_else(|| anyhow!("{}: no tensor named input_ids", path.display()))?;
    if b == 0 || t == 0 {
        bail!("{}: input_ids is empty ([{b}, {t}])", path.display());
    }
    let ids: Vec<u32> = ids
        .iter()
        .map(|&i| {
            if i < 0 || i as usize >= vocab {
                Err(anyhow!("{}: input_ids holds {i}, outside the model's vocabulary of {vocab}", path.display()))
            } else {
                Ok(i as u32)
            }
        })
        .collect::<Result<_>>()?;
    let start = match int_tensor(&st, path, "attention_mask")? {
        None => None,
        Some((mb, mt, m)) => {
            if (mb, mt) != (b, t) {
                bail!("{}: attention_mask is [{mb}, {mt}] but input_ids is [{b}, {t}]", path.display());
            }
            let mut start = Vec::with_capacity(b);
            for r in 0..b {
                let row = &m[r * t..(r + 1) * t];
                let s = row.iter().take_while(|&&x| x == 0).count();
                if row[s..].iter().any(|&x| x != 1) {
                    bail!(
                        "{}: attention_mask row {r} is not left padding (zeros, then ones); only left padding is supported",
                        path.display()
                    );
                }
                if s == t {
                    bail!("{}: attention_mask row {r} masks every position", path.display());
                }
                start.push(s);
            }
            start.iter().any(|&s| s > 0).then_some(start)
        }
    };
    Ok((b, t, ids, start))
}

/// Writes named f32 tensors to a safetensors file (atomically).
pub fn write_f32_tensors(path: &Path, tensors: &[(String, Vec<usize>, &[f32])]) -> Result<()> {
    let bufs: Vec<Vec<u8>> = tensors.iter().map(|(_, _, d)| d.iter().flat_map(|v| v.to_le_bytes()).collect()).collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .zip(&bufs)
        .map(|((n, s, _), b)| Ok((n.clone(), safetensors::tensor::TensorView::new(Dtype::F32, s.clone(), b)?)))
        .collect::<Result<_, safetensors::SafeTensorError>>()
        .map_err(|e| anyhow!("{e}"))?;
    let bytes = safetensors::serialize(views, None::<HashMap<String, String>>).map_err(|e| anyhow!("{e}"))?;
    write_atomic(path, &bytes)
}

pub fn logits_for(model: &Model, b: usize, t: usize, ids: &[u32], start: Option<Vec<usize>>) -> Vec<f32> {
    model.forward(ids, &Ctx { batch: b, seq: t, start })
}

pub fn run(a: Args) -> Result<()> {
    let model = load_model(&a.model)?;
    let v = model.config.vocab_size;
    let (b, t, ids, start) = read_input(&a.input, v)?;
    if a.with_grads && matches!(a.device.device, DeviceArg::Cuda(_)) {
        bail!("--with-grads computes gradients on the CPU (the f32 reference): use --device cpu or auto");
    }
    let device = if a.with_grads { Device::Cpu } else { a.device.select_for(&model)? };
    let logits = if device.is_cuda() {
        // Chunks of positions through the decode cache when [B, T] exceeds one forward's plan.
        let plan = Plan { batch: b, chunk: t.min((DEFAULT_GPU_ROWS / b.max(1)).max(1)) };
        let mut engine = infer::open(&model, &device, a.device.dtype, plan)?;
        eprintln!("device: {}", engine.describe());
        engine.logits(&ids, &Ctx { batch: b, seq: t, start: start.clone() })?
    } else {
        let need = crate::validate::forward_bytes(&model.config, b, t, a.with_grads);
        crate::validate::check_memory(
            need,
            &format!("{}: a forward pass over input_ids [{b}, {t}]", a.input.display()),
        )?;
        logits_for(&model, b, t, &ids, start.clone())
    };
    if !a.with_grads {
        write_f32_tensors(&a.output, &[("logits".to_string(), vec![b, t, v], &logits)])?;
        eprintln!("wrote logits [{b}, {t}, {v}] to {}", a.output.display());
        return Ok(());
    }
    // Position i of row r predicts ids[r, i + 1]; padded positions predict nothing.
    let targets: Vec<Option<u32>> = (0..b * t)
        .map(|i| {
            let (r, pos) = (i / t, i % t);
            let real = pos >= start.as_ref().map_or(0, |s| s[r]);
            (real && pos + 1 < t).then(|| ids[i + 1])
        })
        .collect();
    if targets.iter().all(|x| x.is_none()) {
        bail!(
            "{}: --with-grads needs at least two real tokens in a row (there is no next-token target)",
            a.input.display()
        );
    }
    let mut grads = model.params.zeros_like();
    let loss = model.loss_and_grads(&ids, &targets, &Ctx { batch: b, seq: t, start }, &mut grads, 1.0);
    let loss = [loss];
    let mut out: Vec<(String, Vec<usize>, &[f32])> =
        vec![("logits".to_string(), vec![b, t, v], &logits), ("loss".to_string(), vec![], &loss)];
    for (i, name) in model.params.names.iter().enumerate() {
        if model.params.kinds[i] != ParamKind::Frozen {
            out.push((format!("grad.{name}"), model.params.tensors[i].shape.clone(), &grads[i]));
        }
    }
    write_f32_tensors(&a.output, &out)?;
    eprintln!(
        "wrote logits [{b}, {t}, {v}], loss {:.6} and {} gradients to {}",
        loss[0],
        out.len() - 2,
        a.output.display()
    );
    Ok(())
}
