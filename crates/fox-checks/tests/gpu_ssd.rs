//! Mamba-2's GPU ops (fox_kernels::cuda::ssd, and the tensor-core SSD fox_kernels::cuda::ssd_tc)
//! against their CPU ops. Runs where a CUDA GPU is
//! usable; prints a notice and passes elsewhere (CI has no GPU). Tolerances and why:
//! `fox_checks::ssd_check` and `ssd_tc_check`. On a GPU machine: `cargo test -p fox-checks --release --test
//! gpu_ssd -- --nocapture` (or `fox-attn check-ops --filter ssd`, which prints the same table).

mod common;

use common::all_pass;
use fox_checks::{ssd_check, ssd_tc_check};

#[test]
fn every_mamba2_op_matches_its_cpu_op() {
    let Some(rows) = all_pass("SSD", |g, seed| [ssd_check::run_all(g, seed), ssd_tc_check::run_all(g, seed)].concat())
    else {
        return;
    };
    assert!(rows.len() >= 11, "only {} check rows", rows.len());
}
