//! Evaluation (SPEC §5): per-token loss and perplexity over context length, the needle in a
//! haystack test, and forget-gate statistics and maps. Each submodule holds the computation; the
//! `foxlm eval` / `foxlm viz` commands (in `cli/`) read inputs, call these and write files.
//!
//! Everything runs on the CPU model for now.

pub mod compare;
pub mod gates;
pub mod longbench;
pub mod loss;
pub mod niah;
pub mod plots;
pub mod ruler;
pub mod text;
