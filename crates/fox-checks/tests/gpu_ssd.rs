//! Mamba-2's GPU ops (fox_kernels::cuda::ssd, and the tensor-core SSD fox_kernels::cuda::ssd_tc)
//! against their CPU ops. Runs where a CUDA GPU is
//! usable; prints a notice and passes elsewhere (CI has no GPU). Tolerances and why:
//! `fox_checks::ssd_check` and `ssd_tc_check`. On a GPU machine: `cargo test -p fox-checks --release --test
//! gpu_ssd -- --nocapture` (or `fox-attn check-ops --filter ssd`, which prints the same table).

mod common;

use common::{assert_all_pass, gpu};
use fox_checks::{check, ssd_check, ssd_tc_check};

#[test]
fn every_mamba2_op_matches_its_cpu_op() {
    let Some(g) = gpu("SSD") else { return };
    let seed = check::fresh_seed();
    let mut rows = ssd_check::run_all(&g, seed);
    rows.extend(ssd_tc_check::run_all(&g, seed));
    assert_all_pass(seed, &rows);
    assert!(rows.len() >= 11, "only {} check rows", rows.len());
}
