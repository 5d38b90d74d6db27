//! The delta rule's GPU ops (fox_kernels::cuda::delta_rule: the chunked forward and backward, the
//! decode step, the L2 norm, the decay, the swish gate) against their CPU ops. Runs where a CUDA
//! GPU is usable; prints a notice and passes elsewhere (CI has no GPU). Tolerances and why:
//! `fox_checks::delta_rule_check`. On a GPU machine: `cargo test -p fox-checks --release
//! --test gpu_delta_rule -- --nocapture` (or `fox-attn check-ops --filter delta`, the same table).

mod common;

use common::all_pass;
use fox_checks::delta_rule_check;

#[test]
fn every_delta_rule_op_matches_its_cpu_op() {
    let Some(rows) = all_pass("delta rule", delta_rule_check::run_all) else { return };
    // 6 shapes × 2 types × (9-10 forward and backward rows + 2 decode rows), and the small ops.
    assert!(rows.len() >= 150, "only {} check rows", rows.len());
}
