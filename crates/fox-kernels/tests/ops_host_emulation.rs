//! Kernels without a GPU: the small-op kernels (kernels/ops.cu), the f32 attention kernels
//! (kernels/attention_f32.cu), Mamba's selective scan (kernels/selective_scan.cu), the delta rule
//! (kernels/delta_rule.cu), HGRN2's gated linear attention with its gates (kernels/gla.cu) and
//! serving's scoring kernel (kernels/decode.cu's fox_token_logprobs)
//! compiled as C++ against an emulation of the CUDA built-ins they use (tests/host_emu/mock.h: a
//! thread per CUDA thread, barriers for __syncthreads, warp shuffles and mma.sync) and compared
//! with plain loops
//! (tests/host_emu/*_emu.cpp). This checks index
//! arithmetic, bounds, vector tails, the reductions, and for attention the grouped-query and
//! sliding-window paths, on every machine; it does not replace the GPU check (`fox-attn
//! check-ops`, `check-gemm`): no FMA contraction, no GPU memory model, no NVRTC. Needs a C++20
//! compiler; prints a notice and passes without one.

use std::path::Path;
use std::process::Command;

fn run_emulation(source: &str, exe: &str) {
    run_emulation_with(source, exe, &[]);
}

/// As run_emulation, with extra compiler arguments (`-D` switches of mock.h).
fn run_emulation_with(source: &str, exe: &str, defines: &[&str]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/host_emu");
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(exe);
    let Some(cxx) = ["c++", "g++", "clang++"]
        .into_iter()
        .find(|c| Command::new(c).arg("--version").output().is_ok_and(|o| o.status.success()))
    else {
        use std::io::Write;
        let _ =
            writeln!(std::io::stderr(), "NOTICE: {source} host emulation skipped, no C++ compiler (c++, g++, clang++)");
        return;
    };
    let out = Command::new(cxx)
        .args(["-std=c++20", "-O1", "-pthread", "-w"])
        .args(defines)
        .arg("-o")
        .arg(&exe)
        .arg(dir.join(source))
        .output()
        .expect("running the C++ compiler");
    assert!(
        out.status.success(),
        "{cxx} could not compile {source} under the host emulation (C++20 with <barrier> is needed):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().expect("running the emulated kernels");
    let text = String::from_utf8_lossy(&run.stdout);
    println!("{text}");
    assert!(run.status.success() && text.contains("0 failures"), "emulated kernels differ from the loops:\n{text}");
}

#[test]
fn ops_kernels_under_host_emulation() {
    run_emulation("ops_emu.cpp", "ops_emu");
}

/// GQA, sliding windows, padding and ACP in the f32 attention kernels against an f64 reference.
#[test]
fn f32_attention_kernels_under_host_emulation() {
    run_emulation("attention_f32_emu.cpp", "attention_f32_emu");
}

/// The selective scan's forward, backward (every gradient), decode step and bf16 forward against an
/// f64 reference, with left padding, an initial state, the gate, a partial channel block, N < 16.
#[test]
fn selective_scan_kernels_under_host_emulation() {
    run_emulation("selective_scan_emu.cpp", "selective_scan_emu");
}

/// The delta rule's chunked forward and backward (every gradient, with left padding, an initial
/// state and a final-state gradient), its decode step, and the L2 norm, decay and swish gate of
/// DeltaNet's layer, in f32 (CUDA-core products) and bf16 (mma.sync emulated lane by lane; the
/// forward walk also by wgmma, emulated warp by warp), K of 20, 60, 64 and 128, against an f64
/// recurrence.
#[test]
fn delta_rule_kernels_under_host_emulation() {
    run_emulation("delta_rule_emu.cpp", "delta_rule_emu");
}

/// The same with every `cp.async` landing as late as the GPU may let it (at its thread's
/// cp.async.wait_group; mock.h's MOCK_LATE_CP_ASYNC): a tile read before its wait comes out wrong,
/// where the default emulation (copies landing at once) shows a tile overwritten while still read.
#[test]
fn delta_rule_kernels_under_host_emulation_with_late_copies() {
    run_emulation_with("delta_rule_emu.cpp", "delta_rule_emu_late", &["-DMOCK_LATE_CP_ASYNC"]);
}

/// The chunked GLA's forward, backward (every gradient, with and without a final state's
/// gradient), bf16 forward and decode steps against an f64 reference, with left padding, an
/// initial state, strong and weak decays, partial tiles and head widths 8 to 128, through versions
/// 1, 2 and 3 (the walk at 16, 32 and 64 channels a block, its state continued in place); HGRN2's
/// gates and lower bounds against plain loops.
#[test]
fn decode_scoring_kernel_under_host_emulation() {
    run_emulation("decode_emu.cpp", "decode_emu");
}

#[test]
fn gla_kernels_under_host_emulation() {
    run_emulation("gla_emu.cpp", "gla_emu");
}

/// The same with every `cp.async` landing as late as the GPU may let it (MOCK_LATE_CP_ASYNC): the
/// GLA walk's ring of tile sets and version 3's output kernel read no tile before its wait.
#[test]
fn gla_kernels_under_host_emulation_with_late_copies() {
    run_emulation_with("gla_emu.cpp", "gla_emu_late", &["-DMOCK_LATE_CP_ASYNC"]);
}
