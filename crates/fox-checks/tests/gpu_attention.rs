//! GPU Forgetting Attention against the CPU reference. Runs where a CUDA GPU is usable; prints a
//! notice and passes trivially elsewhere (CI has no GPU). The tolerances and why are in
//! `fox_checks::check`. On a GPU machine: `cargo test -p fox-checks --release --test
//! gpu_attention -- --nocapture` (or `fox-attn check`, which prints the whole table).

use fox_checks::check;
use fox_kernels::cuda::Gpu;

fn gpu() -> Option<std::sync::Arc<Gpu>> {
    match Gpu::new(0) {
        Ok(g) => Some(g),
        Err(e) => {
            // straight to stderr, past the test harness's capture, so the skip is always visible
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "NOTICE: GPU attention test skipped, no usable GPU: {e:#}");
            None
        }
    }
}

fn run(filter: &str) {
    let Some(g) = gpu() else { return };
    let seed = check::fresh_seed();
    let rows = check::run_all(&g, Some(filter), seed);
    println!("seed {seed}\n{}", check::format_table(&rows));
    assert!(!rows.is_empty(), "no case matched `{filter}`");
    let failed: Vec<_> = rows.iter().filter(|r| !r.pass).collect();
    assert!(failed.is_empty(), "{} check(s) failed: {failed:?}", failed.len());
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
    let Some(g) = gpu() else { return };
    // far more than any GPU has
    let Err(err) = g.zeros::<f32>(1usize << 42) else { panic!("a 16 TiB allocation must fail") };
    let msg = format!("{err:#}");
    assert!(msg.contains("out of GPU memory") && msg.contains("GiB free"), "{msg}");
}
