//! The small GPU ops (fox_kernels::cuda::ops) against their CPU ops, f32 and bf16. Runs where a
//! CUDA GPU is usable; prints a notice and passes elsewhere (CI has no GPU). Tolerances and why:
//! `fox_checks::ops_check`. On a GPU machine: `cargo test -p fox-checks --release --test
//! gpu_ops -- --nocapture` (or `fox-attn check-ops`, which prints the same table).

mod common;

use common::all_pass;
use fox_checks::ops_check;

#[test]
fn every_op_matches_its_cpu_op() {
    let Some(rows) = all_pass("ops", ops_check::run_all) else { return };
    assert!(rows.len() > 100, "only {} check rows", rows.len());
}
