//! HGRN2 on the GPU against the CPU reference: the models of the fixture and inference rows
//! (`run_fixture_checks`, `infer::run_inference_checks`), and `foxlm gpu-check --only hgrn2`, which
//! runs only their rows, after HGRN2's kernel rows (`fox_checks::gla_check`, as `fox-attn
//! check-ops --filter gla` and `--filter hgrn2` run them). The models: fla's own HGRN2 (tests/fixtures/fla-hgrn2-tiny: 3 layers, 4
//! heads of 8, lower bounds; 2 × 72 ids), the short-convolution fixture
//! (numpy-hgrn2-conv-tiny: 2 heads of 8, convolutions of 4 taps; 2 × 70 ids) and an initialised
//! HGRN2 at the presets' head width (d = 256, 2 heads of 128, 2 layers, so one with a lower
//! bound, near 1 in every other channel: slow and fast decays; 2 × 200 ids: chunks of 64 and a
//! partial one). Row 1 of each is left-padded by 30.
//! Their rows: f32 and bf16 logits, left-padded logits, loss and every gradient (the lower
//! bounds' and convolutions' among them); logits through the decode state one position per step
//! and in chunks of 64, greedy continuations alone and as a padded row, a bf16 decode step as a
//! CUDA graph (heads of 128), per-position losses; the tolerances of the other models.

use super::{model_rows, CheckModel};
use anyhow::Result;
use fox_checks::check::CheckRow;
use fox_kernels::cuda::Gpu;
use std::path::Path;
use std::sync::Arc;

/// The raw lower bound of layer 1's slow channels in the initialised check model.
const SLOW_LOWER_BOUND: f32 = 6.0;

/// The HGRN2 check models; the fixtures are found beside `fixtures` (tests/fixtures/official-fox-tiny).
pub fn models(fixtures: &Path) -> Result<Vec<CheckModel>> {
    let root = fixtures.parent().unwrap_or(fixtures);
    let mut out = CheckModel::from_fixtures(
        root,
        &[("hgrn2 fla fixture", "fla-hgrn2-tiny/hgrn2"), ("hgrn2 short-conv fixture", "numpy-hgrn2-conv-tiny")],
    )?;
    let mut m = CheckModel::initialised("hgrn2 d=256 heads of 128", foxlm::presets::hgrn2_config(256, 2, 128))?;
    let model = &mut m.model;
    // Initialised, every gate forgets within some 50 positions, and nothing of the first 30 reaches
    // the last: every other channel of layer 1 gets a lower bound near 1 (raw 6 against layer 0's
    // 0: lb = 0.9975, g ≥ −0.0025), so that its state carries the whole sequence.
    let id = model.lower_bounds.ok_or_else(|| anyhow::anyhow!("an HGRN2 without lower bounds"))?;
    for (c, x) in model.params.tensors[id.0].data[256..].iter_mut().enumerate() {
        *x = if c % 2 == 0 { SLOW_LOWER_BOUND } else { 0.0 };
    }
    out.push(m);
    Ok(out)
}

/// HGRN2's kernel rows (`fox-attn check-ops`' "gla" and "hgrn2" cases), then the fixture rows and
/// the inference rows of the HGRN2 models.
pub fn rows(gpu: &Arc<Gpu>, fixtures: &Path) -> Result<Vec<CheckRow>> {
    eprintln!("HGRN2 checks: the kernels");
    let mut rows = fox_checks::gla_check::run_all(gpu, fox_checks::check::fresh_seed());
    for m in models(fixtures)? {
        eprintln!("HGRN2 checks: {}", m.name);
        rows.extend(model_rows(gpu, &m.name, &m.model, m.b, m.t, &m.ids, &m.start)?);
        rows.extend(super::infer::gqa_window_rows(gpu, &m)?);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::models;
    use crate::checks::gpu_check::tests::{assert_sensitive, fox_fixtures};

    /// The HGRN2 check models load, have the shapes their names say, and are sensitive: logits not
    /// near 0, and left padding changes the padded row's logits.
    #[test]
    fn the_hgrn2_check_models_are_sensitive() {
        let models = models(&fox_fixtures()).unwrap();
        assert_eq!(models.len(), 3);
        assert_eq!(models[1].model.config.hgrn2().conv, Some(4));
        let big = models[2].model.config.hgrn2();
        assert_eq!((big.heads, big.head_dim), (2, 128));
        for m in &models {
            assert_sensitive(m, m.t - 1);
        }
    }
}
