//! GPU Forgetting Attention against the CPU reference. Runs where a CUDA GPU is usable; prints a
//! notice and passes trivially elsewhere (CI has no GPU). The tolerances and why are in
//! `fox_checks::check`. On a GPU machine: `cargo test -p fox-checks --release --test
//! gpu_attention -- --nocapture` (or `fox-attn check`, which prints the whole table).

mod common;

use common::{all_pass, gpu};
use fox_checks::check;

fn run(filter: &str) {
    let Some(rows) = all_pass("attention", |g, seed| check::run_all(g, Some(filter), seed)) else { return };
    assert!(!rows.is_empty(), "no case matched `{filter}`");
}

#[test]
fn forward_backward_across_gate_regimes_and_dtypes() {
    run("gate");
}

#[test]
fn left_padding() {
    run("left padding");
}

#[test]
fn packed_documents() {
    run("packed");
}

#[test]
fn strided_views_and_chunked_queries() {
    for f in ["strided", "chunk"] {
        run(f);
    }
}

#[test]
fn acp_on_vs_off() {
    run("ACP d");
}

#[test]
fn decode_kernel_against_full_forward() {
    run("decode");
}

#[test]
fn out_of_memory_is_a_clear_error() {
    let Some(g) = gpu("attention") else { return };
    // far more than any GPU has
    let Err(err) = g.zeros::<f32>(1usize << 42) else { panic!("a 16 TiB allocation must fail") };
    let msg = format!("{err:#}");
    assert!(msg.contains("out of GPU memory") && msg.contains("GiB free"), "{msg}");
}
