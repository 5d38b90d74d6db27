//! The small GPU ops (fox_kernels::cuda::ops) against their CPU ops, f32 and bf16. Runs where a
//! CUDA GPU is usable; prints a notice and passes elsewhere (CI has no GPU). Tolerances and why:
//! `fox_checks::ops_check`. On a GPU machine: `cargo test -p fox-checks --release --test
//! gpu_ops -- --nocapture` (or `fox-attn check-ops`, which prints the same table).

use fox_checks::{check, ops_check};
use fox_kernels::cuda::Gpu;

#[test]
fn every_op_matches_its_cpu_op() {
    let g = match Gpu::new(0) {
        Ok(g) => g,
        Err(e) => {
            // straight to stderr, past the test harness's capture, so the skip is always visible
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "NOTICE: GPU ops test skipped, no usable GPU: {e:#}");
            return;
        }
    };
    let seed = check::fresh_seed();
    let rows = ops_check::run_all(&g, seed);
    println!("seed {seed}\n{}", check::format_table(&rows));
    assert!(rows.len() > 100, "only {} check rows", rows.len());
    let failed: Vec<_> = rows.iter().filter(|r| !r.pass).collect();
    assert!(failed.is_empty(), "{} check(s) failed: {failed:?}", failed.len());
}
