//! Kernel arguments and launches of the small-kernel modules ([`super::ops`], [`super::ssd`]):
//! one argument enum, launched in plain stream order or with programmatic dependent launch.

use super::compile::Source;
use super::Gpu;
use anyhow::{anyhow, Result};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use std::ffi::c_void;

/// A kernel argument, in the order of the kernel's C signature.
pub(crate) enum Arg {
    P(u64),
    I(i32),
    L(i64),
    F(f32),
    D(f64),
}

impl Arg {
    /// The argument's address, as `cuLaunchKernelEx` takes it.
    fn raw(&self) -> *mut c_void {
        match self {
            Arg::P(v) => v as *const u64 as *mut c_void,
            Arg::I(v) => v as *const i32 as *mut c_void,
            Arg::L(v) => v as *const i64 as *mut c_void,
            Arg::F(v) => v as *const f32 as *mut c_void,
            Arg::D(v) => v as *const f64 as *mut c_void,
        }
    }
}

/// Launches kernel `name` of `src` on the GPU's stream.
///
/// Callers pass the arguments of `name`'s C signature, in order, with pointers into buffers whose
/// lengths they checked against the launch's shapes.
pub(crate) fn launch(gpu: &Gpu, src: &Source, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
    let f = gpu.function(src, name)?;
    let mut b = gpu.stream().launch_builder(&f);
    for a in args {
        match a {
            Arg::P(v) => b.arg(v),
            Arg::I(v) => b.arg(v),
            Arg::L(v) => b.arg(v),
            Arg::F(v) => b.arg(v),
            Arg::D(v) => b.arg(v),
        };
    }
    // SAFETY: the caller's contract above.
    unsafe { b.launch(cfg) }.map_err(|e| anyhow!("launching `{name}`: {e:?}"))?;
    Ok(())
}

/// [`launch`] allowing programmatic dependent launch ([`Gpu::launch_dependent`]), for kernels that
/// wait (ops.cu's `pdl_wait`, elem.cuh's `pdl_wait_prev`) before reading what earlier kernels
/// write: their launch overlaps the kernel before them.
pub(crate) fn launch_pdl(gpu: &Gpu, src: &Source, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
    let f = gpu.function(src, name)?;
    let mut ptrs: Vec<*mut c_void> = args.iter().map(Arg::raw).collect();
    // SAFETY: as in `launch`; the pointers point into `args`, alive for the call.
    unsafe { gpu.launch_dependent(&f, cfg, &mut ptrs) }.map_err(|e| anyhow!("`{name}`: {e:#}"))
}
