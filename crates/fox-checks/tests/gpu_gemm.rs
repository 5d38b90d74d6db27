//! cuBLASLt GEMMs and the f32 Forgetting Attention against the CPU reference. Runs where a CUDA
//! GPU is usable; prints a notice and passes elsewhere (CI has no GPU). Cases and tolerances are
//! in `fox_checks::gemm_check`. On a GPU machine: `cargo test -p fox-checks --release
//! --test gpu_gemm -- --nocapture` (or `fox-attn check-gemm`, which prints the same table).

mod common;

use common::{all_pass, gpu};
use fox_checks::gemm_check;
use fox_kernels::cuda::gemm;

#[test]
fn gemms_and_f32_attention_match_the_cpu() {
    let Some(rows) = all_pass("GEMM", gemm_check::run_all) else { return };
    // every GEMM shape in both types, the determinism rows, every attention case
    assert!(rows.len() >= gemm_check::gemm_shapes().len() * 2 * 5 + gemm_check::attention_cases().len() * 6);
}

#[test]
fn bad_shapes_are_clear_errors() {
    let Some(g) = gpu("GEMM") else { return };
    let gm = gemm::Gemm::new(&g).expect("cuBLASLt must load on a GPU machine");
    let x = g.zeros::<f32>(10).unwrap();
    let w = g.zeros::<f32>(10).unwrap();
    let mut y = g.zeros::<f32>(10).unwrap();
    let err = gm.linear_fwd::<f32, f32>(&mut y, false, &x, &w, 4, 4, 4).unwrap_err();
    assert!(format!("{err:#}").contains("x holds 10 elements"), "{err:#}");
    let xb = g.zeros::<half::bf16>(16).unwrap();
    let mut yb = g.zeros::<half::bf16>(16).unwrap();
    let err = gm.linear_fwd::<f32, half::bf16>(&mut yb, false, &x, &w, 2, 2, 2).unwrap_err();
    assert!(format!("{err:#}").contains("not supported"), "{err:#}");
    // k = 0 zeroes the output unless accumulating
    let mut y1 = g.upload(&[1.0f32; 4]).unwrap();
    gm.linear_fwd::<half::bf16, f32>(&mut y1, true, &xb, &xb, 2, 0, 2).unwrap();
    assert_eq!(g.download(&y1).unwrap(), vec![1.0; 4]);
    gm.linear_fwd::<half::bf16, f32>(&mut y1, false, &xb, &xb, 2, 0, 2).unwrap();
    assert_eq!(g.download(&y1).unwrap(), vec![0.0; 4]);
    drop(yb);
}
