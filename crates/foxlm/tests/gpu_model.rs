//! The whole model on the GPU against the CPU reference on the seven fixtures (f32 and bf16), and
//! GPU training against CPU training. Runs where a CUDA GPU is usable; prints a notice and passes
//! elsewhere (CI has no GPU). They run `foxlm gpu-check` (whose checks live in crates/foxlm/checks), as bench/gpu_check.sh does.

use fox_kernels::cuda::Gpu;
use std::path::PathBuf;
use std::process::Command;

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

/// Runs `foxlm gpu-check --only <only>` (the checks live beside the library, in the command) in
/// a fresh work folder; returns its table's (passed, failed) counts after printing its output, or
/// None where no GPU is usable.
fn gpu_check(only: &str, extra: &[&str]) -> Option<(usize, usize)> {
    gpu()?;
    let work = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_foxlm"))
        .current_dir(root())
        .args(["gpu-check", "--only", only, "--work"])
        .arg(work.path())
        .args(extra)
        .output()
        .expect("running foxlm gpu-check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    let last = stdout.lines().rev().find(|l| l.ends_with(" failed")).expect("the table's summary line");
    let n: Vec<usize> = last.split(|c: char| !c.is_ascii_digit()).filter_map(|w| w.parse().ok()).collect();
    assert_eq!(out.status.success(), n[1] == 0, "exit status against the table: {last}");
    Some((n[0], n[1]))
}

#[test]
fn fixtures_on_the_gpu_match_the_cpu() {
    let Some((passed, failed)) = gpu_check("fixtures", &[]) else { return };
    // seven rows per model (the fixtures and the four GQA / window / ACP models), three more per
    // model with ACP
    assert_eq!(passed + failed, (7 + 4) * 7 + 2 * 3, "rows of the fixture checks");
    assert_eq!(failed, 0);
}

#[test]
fn inference_on_the_gpu_matches_the_cpu() {
    let Some((passed, failed)) = gpu_check("infer", &[]) else { return };
    assert!(passed + failed >= 7 * 7, "seven rows per fixture and the sampler's");
    assert_eq!(failed, 0);
}

#[test]
fn training_on_the_gpu_matches_the_cpu_and_resumes() {
    let Some((_, failed)) = gpu_check("train", &["--train-steps", "300"]) else { return };
    assert_eq!(failed, 0);
}
