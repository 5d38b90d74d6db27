//! Mamba-2's GPU ops (fox_kernels::cuda::ssd, and the tensor-core SSD fox_kernels::cuda::ssd_tc)
//! against their CPU ops. Runs where a CUDA GPU is
//! usable; prints a notice and passes elsewhere (CI has no GPU). Tolerances and why:
//! `fox_checks::ssd_check` and `ssd_tc_check`. On a GPU machine: `cargo test -p fox-checks --release --test
//! gpu_ssd -- --nocapture` (or `fox-attn check-ops --filter ssd`, which prints the same table).

use fox_checks::{check, ssd_check, ssd_tc_check};
use fox_kernels::cuda::Gpu;

#[test]
fn every_mamba2_op_matches_its_cpu_op() {
    let g = match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "NOTICE: GPU SSD test skipped, no usable GPU: {e:#}");
            return;
        }
    };
    let seed = check::fresh_seed();
    let mut rows = ssd_check::run_all(&g, seed);
    rows.extend(ssd_tc_check::run_all(&g, seed));
    println!("seed {seed}\n{}", check::format_table(&rows));
    assert!(rows.len() >= 11, "only {} check rows", rows.len());
    let failed: Vec<_> = rows.iter().filter(|r| !r.pass).collect();
    assert!(failed.is_empty(), "{} check(s) failed: {failed:?}", failed.len());
}
