//! What every GPU test of this crate does: take GPU 0 or skip with a notice, and fail on any
//! failed check row after printing the table.

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

/// Prints the rows' table under the seed they ran with and fails if any row failed.
pub fn assert_all_pass(seed: u64, rows: &[CheckRow]) {
    println!("seed {seed}\n{}", check::format_table(rows));
    let failed: Vec<_> = rows.iter().filter(|r| !r.pass).collect();
    assert!(failed.is_empty(), "{} check(s) failed: {failed:?}", failed.len());
}
