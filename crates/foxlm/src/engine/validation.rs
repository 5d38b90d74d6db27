//! The validation loss of a model over a dataset's validation split.

use crate::data::{Batch, Dataset, Loader, Split};
use crate::model::{Ctx, Model};
use anyhow::{Context, Result};

/// Mean cross-entropy (nats/token) of `model` over the first windows of the validation split,
/// at most `max_tokens` tokens of them (at least one window), in batches of `batch`. None when
/// the split is shorter than one window.
pub fn validation_loss(
    model: &Model,
    ds: &Dataset,
    context: usize,
    max_tokens: u64,
    batch: usize,
) -> Result<Option<f64>> {
    let sums = val_sums(ds, context, max_tokens, batch, |bt, b| sum_loss(model, &bt.ids, &bt.targets, b, context))?;
    Ok(sums.map(|(sum, count)| sum / count.max(1) as f64))
}

/// Σ loss and the targets counted, over the first windows of the validation split (at most
/// `max_tokens` tokens of them, at least one window), in batches of at most `batch` windows:
/// `each(batch, its windows)` gives a batch's. None when the split is shorter than one window.
pub(crate) fn val_sums(
    ds: &Dataset,
    context: usize,
    max_tokens: u64,
    batch: usize,
    mut each: impl FnMut(Batch, usize) -> Result<(f64, usize)>,
) -> Result<Option<(f64, usize)>> {
    let Ok(mut loader) = Loader::new(ds, Split::Val, context, 0, false) else { return Ok(None) };
    let windows = loader.windows_per_epoch().min((max_tokens / context as u64).max(1)) as usize;
    let mut sum = 0.0f64;
    let mut count = 0usize;
    let mut done = 0;
    while done < windows {
        let b = batch.min(windows - done);
        let (s, n) = each(loader.next_batch(b), b)?;
        sum += s;
        count += n;
        done += b;
    }
    Ok(Some((sum, count)))
}

/// Σ cross-entropy over the targets, and how many, without gradients (the fused head op: the
/// logits are formed a block of the vocabulary at a time and never kept).
pub fn sum_loss(model: &Model, ids: &[u32], targets: &[Option<u32>], batch: usize, seq: usize) -> Result<(f64, usize)> {
    let ctx = Ctx { batch, seq, start: None };
    let (hidden, _) = model.forward_hidden(ids, &ctx, None, false);
    let head = &model.lm_head;
    let w = &model.params[head.weight];
    let sum =
        fox_kernels::head::linear_cross_entropy(&hidden, w, targets, head.in_features, head.out_features, 1.0, None)
            .context("validation loss (are the data's token ids those of the model's vocabulary?)")?;
    Ok((sum, targets.iter().filter(|t| t.is_some()).count()))
}
