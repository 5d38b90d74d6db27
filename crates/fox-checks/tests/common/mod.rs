//! What every GPU test of this crate does: take GPU 0 or skip with a notice, run check rows with
//! a fresh seed, and fail on any failed row after printing the table.

use fox_checks::check::{self, CheckRow};
use fox_kernels::cuda::Gpu;
use std::sync::Arc;

/// GPU 0, or none where no GPU is usable (CI): then a notice goes straight to stderr, past the
/// test harness's capture, so that the skip is always visible.
pub fn gpu(what: &str) -> Option<Arc<Gpu>> {
    match Gpu::new(0) {
        Ok(g) => Some(g),
        Err(e) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "NOTICE: GPU {what} test skipped, no usable GPU: {e:#}");
            None
        }
    }
}

/// The rows `run_all` gives on GPU 0 with a fresh seed, after printing their table and failing
/// if any row failed; none where no GPU is usable.
pub fn all_pass(what: &str, run_all: impl FnOnce(&Gpu, u64) -> Vec<CheckRow>) -> Option<Vec<CheckRow>> {
    let g = gpu(what)?;
    let seed = check::fresh_seed();
    let rows = run_all(&g, seed);
    println!("seed {seed}\n{}", check::format_table(&rows));
    let failed: Vec<_> = rows.iter().filter(|r| !r.pass).collect();
    assert!(failed.is_empty(), "{} check(s) failed: {failed:?}", failed.len());
    Some(rows)
}
