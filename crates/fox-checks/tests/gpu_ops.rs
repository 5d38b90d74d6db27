//! The small GPU ops (fox_kernels::cuda::ops) against their CPU ops, f32 and bf16. Runs where a
//! CUDA GPU is usable; prints a notice and passes elsewhere (CI has no GPU). Tolerances and why:
//! `fox_checks::ops_check`. On a GPU machine: `cargo test -p fox-checks --release --test
//! gpu_ops -- --nocapture` (or `fox-attn check-ops`, which prints the same table).

mod common;

use common::{assert_all_pass, gpu};
use fox_checks::{check, ops_check};

#[test]
fn every_op_matches_its_cpu_op() {
    let Some(g) = gpu("ops") else { return };
    let seed = check::fresh_seed();
    let rows = ops_check::run_all(&g, seed);
    assert_all_pass(seed, &rows);
    assert!(rows.len() > 100, "only {} check rows", rows.len());
}
