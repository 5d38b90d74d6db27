//! Kernel arguments and launches of the kernel modules: a buffer's device address, the checks
//! of buffer lengths and 32-bit sizes every launcher makes, one argument enum and the [`args!`]
//! list that builds it from buffers and scalars, launched in plain stream order or with
//! programmatic dependent launch.

use super::compile::Source;
use super::{Elem, Gpu};
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, CudaViewMut, DevicePtr, DeviceSlice, LaunchConfig, PushKernelArg,
};
use std::ffi::c_void;

/// A buffer's device address on the GPU's stream.
pub(crate) fn ptr<T, S: DevicePtr<T> + ?Sized>(gpu: &Gpu, s: &S) -> u64 {
    let (p, _g) = s.device_ptr(gpu.stream());
    p
}

/// [`ptr`] of an optional buffer, null when absent.
pub(crate) fn opt_ptr<T>(gpu: &Gpu, s: Option<&CudaSlice<T>>) -> u64 {
    s.map_or(0, |s| ptr(gpu, s))
}

/// `s` holds at least `n` elements (buffers may be longer than a launch needs).
pub(crate) fn need<T>(op: &str, what: &str, s: &impl DeviceSlice<T>, n: usize) -> Result<()> {
    ensure!(s.len() >= n, "{op}: `{what}` holds {} elements but the shapes need {n}", s.len());
    Ok(())
}

/// A size as the kernels' 32-bit `int`.
pub(crate) fn int(op: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| anyhow!("{op}: {v} does not fit the kernels' 32-bit sizes"))
}

/// The name of kernel `base` compiled for activation type `T` (`base_f32`, `base_bf16`).
pub(crate) fn kname<T: Elem>(base: &str) -> String {
    format!("{base}_{}", T::NAME)
}

/// A kernel argument, in the order of the kernel's C signature.
pub(crate) enum Arg {
    P(u64),
    I(i32),
    L(i64),
    F(f32),
    D(f64),
}

/// A device buffer as a kernel argument: its address on the GPU's stream.
pub(crate) trait Buffer {
    fn addr(&self, gpu: &Gpu) -> u64;
}

impl<T> Buffer for CudaSlice<T> {
    fn addr(&self, gpu: &Gpu) -> u64 {
        ptr(gpu, self)
    }
}

impl<T> Buffer for CudaView<'_, T> {
    fn addr(&self, gpu: &Gpu) -> u64 {
        ptr(gpu, self)
    }
}

impl<T> Buffer for CudaViewMut<'_, T> {
    fn addr(&self, gpu: &Gpu) -> u64 {
        ptr(gpu, self)
    }
}

impl<B: Buffer + ?Sized> Buffer for &B {
    fn addr(&self, gpu: &Gpu) -> u64 {
        (**self).addr(gpu)
    }
}

impl<B: Buffer + ?Sized> Buffer for &mut B {
    fn addr(&self, gpu: &Gpu) -> u64 {
        (**self).addr(gpu)
    }
}

/// What [`args!`] takes for one kernel parameter: a buffer (its address), an optional buffer
/// (null when absent), a raw address (`u64`), or a scalar of the C parameter's type (`i32`,
/// `i64`, `f32`, `f64`).
pub(crate) trait IntoArg {
    fn arg(&self, gpu: &Gpu) -> Arg;
}

impl<B: Buffer> IntoArg for B {
    fn arg(&self, gpu: &Gpu) -> Arg {
        Arg::P(self.addr(gpu))
    }
}

impl<B: Buffer> IntoArg for Option<B> {
    fn arg(&self, gpu: &Gpu) -> Arg {
        Arg::P(self.as_ref().map_or(0, |b| b.addr(gpu)))
    }
}

macro_rules! scalar_arg {
    ($($t:ty => $v:ident),*) => {$(
        impl IntoArg for $t {
            fn arg(&self, _: &Gpu) -> Arg {
                Arg::$v(*self)
            }
        }
    )*};
}
scalar_arg!(u64 => P, i32 => I, i64 => L, f32 => F, f64 => D);

/// A kernel's argument list, `[Arg; N]`, in the order of its C signature:
/// `args![gpu; out, x, start, rows, eps]` passes each buffer's address on `gpu`'s stream (null
/// for an absent `Option`), each scalar as its type's [`Arg`].
macro_rules! args {
    ($gpu:expr; $($a:expr),* $(,)?) => {
        [$($crate::cuda::kargs::IntoArg::arg(&$a, $gpu)),*]
    };
}
pub(crate) use args;

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

/// The launch of kernel `name` over a grid of (x, y, z) blocks of `threads` threads with `smem`
/// bytes of dynamic shared memory, the grid checked against the driver's ranges.
pub(crate) fn config(name: &str, (x, y, z): (usize, usize, usize), threads: u32, smem: usize) -> Result<LaunchConfig> {
    ensure!(x > 0 && x <= i32::MAX as usize, "{name}: launch of {x} blocks is out of range");
    ensure!(y > 0 && y <= 65535, "{name}: launch of {y} blocks in y is out of range");
    ensure!(z > 0 && z <= 65535, "{name}: launch of {z} blocks in z is out of range");
    Ok(LaunchConfig {
        grid_dim: (x as u32, y as u32, z as u32),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: smem as u32,
    })
}

/// Kernel `name` of `src`, allowed `smem` bytes of dynamic shared memory: above the 48 KB every
/// kernel may take, a kernel must opt in to what it uses.
pub(crate) fn function_smem(gpu: &Gpu, src: &Source, name: &str, smem: usize) -> Result<CudaFunction> {
    let f = gpu.function(src, name)?;
    if smem > 48 * 1024 {
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(|e| anyhow!("{name}: cannot raise shared memory to {smem} bytes: {e:?}"))?;
    }
    Ok(f)
}

/// Launches kernel `name` of `src` on the GPU's stream (with the shared memory of `cfg` allowed,
/// [`function_smem`]).
///
/// Callers pass the arguments of `name`'s C signature, in order, with pointers into buffers whose
/// lengths they checked against the launch's shapes.
pub(crate) fn launch(gpu: &Gpu, src: &Source, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
    launch_on(gpu, gpu.stream(), src, name, cfg, args)
}

/// [`launch`] on `stream` (one of [`Gpu::side_streams`], forked from and joined back to the GPU's
/// stream by the caller).
pub(crate) fn launch_on(
    gpu: &Gpu,
    stream: &cudarc::driver::CudaStream,
    src: &Source,
    name: &str,
    cfg: LaunchConfig,
    args: &[Arg],
) -> Result<()> {
    let f = function_smem(gpu, src, name, cfg.shared_mem_bytes as usize)?;
    let mut b = stream.launch_builder(&f);
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
    let f = function_smem(gpu, src, name, cfg.shared_mem_bytes as usize)?;
    let mut ptrs: Vec<*mut c_void> = args.iter().map(Arg::raw).collect();
    // SAFETY: as in `launch`; the pointers point into `args`, alive for the call.
    unsafe { gpu.launch_dependent(&f, cfg, &mut ptrs) }.map_err(|e| anyhow!("`{name}`: {e:#}"))
}
