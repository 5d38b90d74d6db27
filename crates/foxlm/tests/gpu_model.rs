//! The whole model on the GPU against the CPU reference on the seven fixtures (f32 and bf16), and
//! GPU training against CPU training. Runs where a CUDA GPU is usable; prints a notice and passes
//! elsewhere (CI has no GPU). The same rows, as a table: `foxlm gpu-check` (bench/gpu_check.sh).

use fox_kernels::cuda::{check::format_table, Gpu};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn gpu() -> Option<std::sync::Arc<Gpu>> {
    match Gpu::new(0) {
        Ok(g) => Some(g),
        Err(e) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "NOTICE: GPU model test skipped, no usable GPU: {e:#}");
            None
        }
    }
}

#[test]
fn fixtures_on_the_gpu_match_the_cpu() {
    let Some(g) = gpu() else { return };
    let rows = foxlm::gpu_check::run_fixture_checks(&g, &root().join("tests/fixtures/official-fox-tiny")).unwrap();
    println!("{}", format_table(&rows));
    // seven rows per model (the fixtures and the four GQA / window / ACP models), three more per
    // model with ACP
    assert_eq!(rows.len(), (7 + 4) * 7 + 2 * 3, "rows of the fixture checks");
    let failed: Vec<_> = rows.iter().filter(|r| !r.pass).collect();
    assert!(failed.is_empty(), "{failed:?}");
}

#[test]
fn inference_on_the_gpu_matches_the_cpu() {
    let Some(g) = gpu() else { return };
    let rows =
        foxlm::gpu_check::infer::run_inference_checks(&g, &root().join("tests/fixtures/official-fox-tiny")).unwrap();
    println!("{}", format_table(&rows));
    assert!(rows.len() >= 7 * 7, "seven rows per fixture and the sampler's");
    let failed: Vec<_> = rows.iter().filter(|r| !r.pass).collect();
    assert!(failed.is_empty(), "{failed:?}");
}

#[test]
fn training_on_the_gpu_matches_the_cpu_and_resumes() {
    if gpu().is_none() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let rows = foxlm::gpu_check::run_training_checks(&root().join("data/sample/moby-dick"), work.path(), 300).unwrap();
    println!("{}", format_table(&rows));
    let failed: Vec<_> = rows.iter().filter(|r| !r.pass).collect();
    assert!(failed.is_empty(), "{failed:?}");
}
