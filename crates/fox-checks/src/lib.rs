//! The GPU checks and benchmarks of [`fox_kernels`]' CUDA kernels, beside the library: every
//! kernel against its CPU reference on fresh random inputs (a pass/fail table of [`check::CheckRow`]s),
//! and the kernels' timings. `fox-attn` (src/bin) runs them; `foxlm gpu-check` and `foxlm bench`
//! use the rows and the timer for the model-level checks.

pub mod bench;
pub mod check;
pub mod delta_rule_check;
pub mod gemm_bench;
pub mod gemm_check;
pub mod gla_check;
pub mod ops_check;
pub mod selective_scan_check;
pub mod ssd_check;
pub mod ssd_tc_check;
