//! Helpers shared by the integration tests.

use foxlm::model::Model;

/// Central finite differences (ε = 1e-2 in f32) of `loss_at` against the backward's `grads` for
/// the two entries with the largest gradient of each named tensor; panics on a mismatch beyond
/// 2% + 2e-4 (truncation O(ε²) plus f32 round-off ~1e-7·loss/ε ≈ 5e-5). Returns how many entries
/// were checked.
pub fn check_finite_differences(
    model: &Model,
    grads: &[Vec<f32>],
    names: &[&str],
    loss_at: impl Fn(&Model) -> f64,
) -> usize {
    let eps = 1e-2f32;
    let mut checked = 0;
    for &name in names {
        let id = model.params.id(name).unwrap_or_else(|| panic!("{name}"));
        let g = &grads[id.0];
        let mut order: Vec<usize> = (0..g.len()).collect();
        order.sort_by(|&a, &b| g[b].abs().total_cmp(&g[a].abs()));
        for &idx in order.iter().take(2) {
            let mut m = model.clone();
            m.params.tensors[id.0].data[idx] += eps;
            let lp = loss_at(&m);
            m.params.tensors[id.0].data[idx] -= 2.0 * eps;
            let lm = loss_at(&m);
            let fd = (lp - lm) / (2.0 * eps as f64);
            let an = g[idx] as f64;
            assert!(
                (fd - an).abs() < 2e-2 * an.abs() + 2e-4,
                "{name}[{idx}]: finite difference {fd:.6e} vs backward {an:.6e}"
            );
            checked += 1;
        }
    }
    checked
}
