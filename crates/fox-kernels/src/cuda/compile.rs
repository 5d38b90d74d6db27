//! Run-time compilation of the CUDA sources with NVRTC, cached on disk.
//!
//! A kernel module is compiled to a cubin for the device's architecture (sm_90a on Hopper, so
//! that Hopper-only instructions are available; sm_XY elsewhere) and stored under
//! `$FOXLM_KERNEL_CACHE`, else `$XDG_CACHE_HOME/foxlm/kernels`, else `~/.cache/foxlm/kernels`,
//! named by a hash of the source, the options, the architecture and NVRTC's version. A changed
//! source or a different GPU gets a new file; nothing is ever stale.

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};
use std::ffi::CString;
use std::path::PathBuf;

/// One module: the files are concatenated in order (common.cuh first) and compiled as one unit.
pub struct Source {
    pub name: &'static str,
    pub files: &'static [&'static str],
}

impl Source {
    pub fn text(&self) -> String {
        self.files.concat()
    }
}

const COMMON: &str = include_str!("../../kernels/common.cuh");
/// bf16/f32 loads and stores of the model's small kernels.
const ELEM: &str = include_str!("../../kernels/elem.cuh");
/// The gates' sigmoids and log-sigmoid and softplus, after common.cuh or elem.cuh.
const ACT: &str = include_str!("../../kernels/activations.cuh");
/// Programmatic dependent launch's two instructions and the acquire/release flags between blocks,
/// first in the units whose kernels use them.
const PDL: &str = include_str!("../../kernels/pdl.cuh");
/// Block-wide sums in one order, for the units whose results must match each other's.
const REDUCE: &str = include_str!("../../kernels/reduce.cuh");

/// Forgetting Attention: forward, decode, backward; the wgmma and warp-specialised kernels (sm_90a only).
pub static ATTENTION: Source = Source {
    name: "attention",
    files: &[
        PDL,
        COMMON,
        ACT,
        REDUCE,
        include_str!("../../kernels/attention.cu"),
        include_str!("../../kernels/wgmma.cu"),
        include_str!("../../kernels/attention_ws.cu"),
        include_str!("../../kernels/attention_decode.cu"),
    ],
};
/// Forget-gate prefix sums and ACP thresholds.
pub static FGATE: Source = Source { name: "fgate", files: &[COMMON, include_str!("../../kernels/fgate.cu")] };

/// Small kernels of the model's CUDA backend (in-place sigmoid, ACP from QK-norm weights).
pub static MODEL: Source = Source { name: "model", files: &[ELEM, ACT, include_str!("../../kernels/model.cu")] };
/// The small operations of the training step (norms, KV-shift, RoPE, gates, SwiGLU, residuals,
/// casts, embedding, cross-entropy, AdamW, sums of squares): see [`super::ops`].
pub static OPS: Source = Source { name: "ops", files: &[PDL, COMMON, ACT, include_str!("../../kernels/ops.cu")] };

/// Forgetting Attention in f32 (forward, backward) for `--dtype f32`; standalone, no common.cuh.
pub static ATTENTION_F32: Source =
    Source { name: "attention_f32", files: &[include_str!("../../kernels/attention_f32.cu")] };

/// Decoding with a KV cache: cache appends, KV-shift and gate sums across chunks, sampling, the
/// fused step's kernels and the batch-1 megakernel.
pub static DECODE: Source = Source {
    name: "decode",
    files: &[
        PDL,
        ELEM,
        ACT,
        REDUCE,
        include_str!("../../kernels/decode.cu"),
        include_str!("../../kernels/decode_mega.cu"),
    ],
};

/// Put before a file that is compiled twice in one source: first for f32 activations
/// (`ET` float, kernels `name_f32`), then again for bf16 (`ET` u16, `name_bf16`).
const AS_F32: &str = "#define ET float\n#define KN(name) name##_f32\n";
const AS_BF16: &str = "#undef ET\n#undef KN\n#define ET u16\n#define KN(name) name##_bf16\n";

const SSD_CU: &str = include_str!("../../kernels/ssd.cu");
/// Mamba-2's ops: conv1d, the SSD (C Bᵀ per chunk, chunked forward and backward, decode step),
/// gated RMSNorm, dt's softplus; ssd.cu twice, its activations f32 (`name_f32`), then bf16
/// (`name_bf16`).
pub static SSD: Source = Source { name: "ssd", files: &[PDL, ELEM, ACT, AS_F32, SSD_CU, AS_BF16, SSD_CU] };

/// Mamba-2's SSD on tensor cores (bf16 mma.sync, f32 sums): the state walks, the chunk outputs
/// and the chunk backward; see [`super::ssd_tc`].
pub static SSD_TC: Source = Source { name: "ssd_tc", files: &[ELEM, ACT, include_str!("../../kernels/ssd_tc.cu")] };

/// Mamba's selective scan (Samba's SSM): forward, backward, decode step.
pub static SELECTIVE_SCAN: Source =
    Source { name: "selective_scan", files: &[ELEM, ACT, include_str!("../../kernels/selective_scan.cu")] };

/// DeltaNet's and Gated DeltaNet's delta rule (chunked forward and backward, decode step) and the
/// layer's L2 norm, decay and swish gate: see [`super::delta_rule`].
pub static DELTA_RULE: Source =
    Source { name: "delta_rule", files: &[ELEM, ACT, include_str!("../../kernels/delta_rule.cu")] };

const GLA_CU: &str = include_str!("../../kernels/gla.cu");
/// HGRN2's ops: gated linear attention with per-channel decay (chunked forward and backward,
/// decode step), the gates and the lower bounds; gla.cu twice, as ssd.cu.
pub static GLA: Source = Source { name: "gla", files: &[ELEM, ACT, AS_F32, GLA_CU, AS_BF16, GLA_CU] };

pub static SOURCES: [&Source; 11] =
    [&ATTENTION, &FGATE, &MODEL, &OPS, &ATTENTION_F32, &DECODE, &SSD, &SSD_TC, &SELECTIVE_SCAN, &DELTA_RULE, &GLA];

const OPTIONS: &[&str] = &["--std=c++17", "-lineinfo", "--fmad=true"];

/// The NVRTC architecture for a compute capability: the `a` variants where they exist (Hopper
/// and Blackwell datacenter parts) so architecture-specific instructions can be used.
pub fn arch_for(cc: (i32, i32)) -> String {
    match cc {
        (9, 0) => "sm_90a".into(),
        (10, 0) => "sm_100a".into(),
        (a, b) => format!("sm_{a}{b}"),
    }
}

pub fn cache_dir() -> PathBuf {
    if let Ok(p) = std::env::var("FOXLM_KERNEL_CACHE") {
        return PathBuf::from(p);
    }
    if let Ok(p) = std::env::var("XDG_CACHE_HOME") {
        return PathBuf::from(p).join("foxlm/kernels");
    }
    if let Ok(h) = std::env::var("HOME") {
        return PathBuf::from(h).join(".cache/foxlm/kernels");
    }
    std::env::temp_dir().join("foxlm-kernels")
}

fn nvrtc_version() -> Result<(i32, i32)> {
    let (mut a, mut b) = (0, 0);
    // SAFETY: plain out-parameters.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut a, &mut b) }.result().map_err(|e| anyhow!("nvrtcVersion: {e:?}"))?;
    Ok((a, b))
}

fn cache_path(src: &Source, arch: &str) -> Result<PathBuf> {
    let (ma, mi) = nvrtc_version()?;
    let mut h = Sha256::new();
    h.update(src.text().as_bytes());
    for o in OPTIONS {
        h.update(o.as_bytes());
        h.update([0]);
    }
    h.update(arch.as_bytes());
    h.update(format!("nvrtc{ma}.{mi}").as_bytes());
    let hex: String = h.finalize().iter().take(12).map(|b| format!("{b:02x}")).collect();
    Ok(cache_dir().join(format!("{}-{arch}-{hex}.cubin", src.name)))
}

/// The compiled cubin of `src` for `arch`, from the disk cache or freshly compiled (and stored).
pub fn compiled(src: &Source, arch: &str) -> Result<Vec<u8>> {
    super::ensure_nvrtc()?;
    let path = cache_path(src, arch)?;
    if let Ok(bytes) = std::fs::read(&path) {
        if !bytes.is_empty() {
            return Ok(bytes);
        }
    }
    let (cubin, _log) = compile(src, arch, &[])?;
    if let Some(dir) = path.parent() {
        // A cache that cannot be written only costs a recompile next time.
        if std::fs::create_dir_all(dir).is_ok() {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            if std::fs::write(&tmp, &cubin).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
    }
    Ok(cubin)
}

/// Compile `src` for `arch` with NVRTC; returns the cubin and the compiler's log (with
/// `extra = ["-Xptxas=-v"]` the log holds registers, spills and shared memory per kernel).
pub fn compile(src: &Source, arch: &str, extra: &[&str]) -> Result<(Vec<u8>, String)> {
    super::ensure_nvrtc()?;
    let text = CString::new(src.text()).context("kernel source contains a NUL byte")?;
    let name = CString::new(format!("{}.cu", src.name)).unwrap();
    let prog =
        cudarc::nvrtc::result::create_program(&text, Some(&name)).map_err(|e| anyhow!("nvrtcCreateProgram: {e:?}"))?;
    let mut opts: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    opts.push(format!("--gpu-architecture={arch}"));
    opts.extend(extra.iter().map(|s| s.to_string()));
    // SAFETY: `prog` was created above and is destroyed once below.
    let res = unsafe { cudarc::nvrtc::result::compile_program(prog, &opts) };
    let log = unsafe { cudarc::nvrtc::result::get_program_log(prog) }
        .map(|v| {
            let bytes: Vec<u8> = v.iter().map(|c| *c as u8).take_while(|c| *c != 0).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        })
        .unwrap_or_default();
    if let Err(e) = res {
        unsafe {
            let _ = cudarc::nvrtc::result::destroy_program(prog);
        }
        bail!("NVRTC failed to compile `{}` for {arch}: {e:?}\n{log}", src.name);
    }
    let mut size = 0usize;
    let cubin = unsafe {
        cudarc::nvrtc::sys::nvrtcGetCUBINSize(prog, &mut size)
            .result()
            .map_err(|e| anyhow!("nvrtcGetCUBINSize: {e:?}"))?;
        let mut buf = vec![0u8; size];
        cudarc::nvrtc::sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut std::ffi::c_char)
            .result()
            .map_err(|e| anyhow!("nvrtcGetCUBIN: {e:?}"))?;
        let _ = cudarc::nvrtc::result::destroy_program(prog);
        buf
    };
    Ok((cubin, log))
}

/// Compile every module for `arch` into the cache (no GPU needed, only NVRTC): lets a build
/// machine warm the cache that a GPU machine then reads. Returns (name, log) pairs.
pub fn precompile(arch: &str, verbose: bool) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for src in SOURCES {
        let extra: &[&str] = if verbose { &["-Xptxas=-v"] } else { &[] };
        let (cubin, log) = compile(src, arch, extra)?;
        let path = cache_path(src, arch)?;
        if !verbose {
            std::fs::create_dir_all(path.parent().unwrap())?;
            std::fs::write(&path, &cubin)?;
        }
        out.push((format!("{} -> {}", src.name, path.display()), log));
    }
    Ok(out)
}
