//! The delta rule's GPU ops (fox_kernels::cuda::delta_rule: the chunked forward and backward, the
//! decode step, the L2 norm, the decay, the swish gate) against their CPU ops. Runs where a CUDA
//! GPU is usable; prints a notice and passes elsewhere (CI has no GPU). Tolerances and why:
//! `fox_checks::delta_rule_check`. On a GPU machine: `cargo test -p fox-checks --release
//! --test gpu_delta_rule -- --nocapture` (or `fox-attn check-ops --filter delta`, the same table).

mod common;

use common::{assert_all_pass, gpu};
use fox_checks::{check, delta_rule_check};

#[test]
fn every_delta_rule_op_matches_its_cpu_op() {
    let Some(g) = gpu("delta rule") else { return };
    let seed = check::fresh_seed();
    let rows = delta_rule_check::run_all(&g, seed);
    assert_all_pass(seed, &rows);
    // 6 shapes × 2 types × (9-10 forward and backward rows + 2 decode rows), and the small ops.
    assert!(rows.len() >= 150, "only {} check rows", rows.len());
}
