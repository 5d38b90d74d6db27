//! The GPU checks and benchmarks of the `foxlm` command (`foxlm gpu-check`, `foxlm bench`),
//! beside the library rather than inside it: they use the library's public API only.

pub mod bench;
pub mod cpu_bench;
pub mod gpu_check;
