//! Kernel arguments and launches, the one way every kernel of this crate and of foxlm's CUDA
//! backend is launched: a buffer's device address, the checks of buffer lengths and 32-bit sizes
//! every launcher makes, one argument enum and the [`args!`] list that builds it from buffers,
//! scalars and parameter structs, launched in plain stream order or with programmatic dependent
//! launch. A launch reads `kargs::launch(gpu, &SOURCE, name, cfg, &args![gpu; a, b, n])`.

use super::compile::Source;
use super::{Elem, Gpu};
use anyhow::{anyhow, ensure, Result};
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DeviceRepr, DeviceSlice, LaunchConfig,
};
use std::ffi::c_void;
use std::marker::PhantomData;

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
    need_lens(op, n, &[(what, s.len())])
}

/// [`need`] of an optional buffer: when given, it holds at least `n` elements.
pub(crate) fn need_opt<T>(op: &str, what: &str, s: Option<&impl DeviceSlice<T>>, n: usize) -> Result<()> {
    s.map_or(Ok(()), |s| need(op, what, s, n))
}

/// [`need`] of several buffers of one length `n`, by their names and lengths (so that buffers of
/// different element types go in one list).
pub(crate) fn need_lens(op: &str, n: usize, lens: &[(&str, usize)]) -> Result<()> {
    for &(what, len) in lens {
        ensure!(len >= n, "{op}: `{what}` holds {len} elements but the shapes need {n}");
    }
    Ok(())
}

/// The dimension a decode kernel bounds: its name and value, the most the kernel takes, and why
/// (appended to the error, may be empty).
pub(crate) struct Bound<'a> {
    pub what: &'a str,
    pub value: usize,
    pub most: usize,
    pub why: &'a str,
}

/// A recurrent layer's decode step as [`DecodeStep::check`] sees it: the bounded dimension, and
/// the state and output buffers with the elements the shapes need.
pub(crate) struct DecodeStep<'a, T> {
    pub seq: usize,
    pub bound: Bound<'a>,
    pub state: &'a CudaSlice<f32>,
    pub states: usize,
    pub out_name: &'a str,
    pub out: &'a CudaSlice<T>,
    pub outs: usize,
}

impl<T> DecodeStep<'_, T> {
    /// The checks after the problem's own: one position per row (`seq` = 1), the bounded
    /// dimension, and the state and output lengths.
    pub(crate) fn check(&self, op: &str) -> Result<()> {
        let (seq, Bound { what, value, most, why }) = (self.seq, &self.bound);
        ensure!(seq == 1, "{op}: one position per row, not {seq}");
        ensure!(value <= most, "{op}: {what} {value} is above {most}{why}");
        need(op, "state", self.state, self.states)?;
        need(op, self.out_name, self.out, self.outs)
    }
}

/// A size as the kernels' 32-bit `int`.
pub(crate) fn int(op: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| anyhow!("{op}: {v} does not fit the kernels' 32-bit sizes"))
}

/// The name of kernel `base` compiled for activation type `T` (`base_f32`, `base_bf16`).
pub fn kname<T: Elem>(base: &str) -> String {
    format!("{base}_{}", T::NAME)
}

/// A kernel argument, in the order of the kernel's C signature: an address, a scalar, or a
/// parameter struct passed by value ([`by_value`]), which the launch copies from where it lives.
#[derive(Clone, Copy)]
pub enum Arg<'a> {
    P(u64),
    I(i32),
    L(i64),
    F(f32),
    D(f64),
    Struct(*const c_void, PhantomData<&'a ()>),
}

/// A `#[repr(C)]` parameter struct as one kernel argument (the kernels that take their buffers
/// and sizes in one struct).
pub fn by_value<T: DeviceRepr>(prm: &T) -> Arg<'_> {
    Arg::Struct(prm as *const T as *const c_void, PhantomData)
}

/// A device buffer as a kernel argument: its address on the GPU's stream.
pub trait Buffer {
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
/// (null when absent), a raw address (`u64`), a scalar of the C parameter's type (`i32`, `i64`,
/// `f32`, `f64`), or an [`Arg`] made already ([`by_value`]).
pub trait IntoArg<'a> {
    fn arg(&self, gpu: &Gpu) -> Arg<'a>;
}

impl<B: Buffer> IntoArg<'_> for B {
    fn arg(&self, gpu: &Gpu) -> Arg<'static> {
        Arg::P(self.addr(gpu))
    }
}

impl<B: Buffer> IntoArg<'_> for Option<B> {
    fn arg(&self, gpu: &Gpu) -> Arg<'static> {
        Arg::P(self.as_ref().map_or(0, |b| b.addr(gpu)))
    }
}

impl<'a> IntoArg<'a> for Arg<'a> {
    fn arg(&self, _: &Gpu) -> Arg<'a> {
        *self
    }
}

macro_rules! scalar_arg {
    ($($t:ty => $v:ident),*) => {$(
        impl IntoArg<'_> for $t {
            fn arg(&self, _: &Gpu) -> Arg<'static> {
                Arg::$v(*self)
            }
        }
    )*};
}
scalar_arg!(u64 => P, i32 => I, i64 => L, f32 => F, f64 => D);

/// A kernel's argument list, `[Arg; N]`, in the order of its C signature:
/// `args![gpu; out, x, start, rows, eps]` passes each buffer's address on `gpu`'s stream (null
/// for an absent `Option`), each scalar as its type's [`Arg`].
#[macro_export]
#[doc(hidden)]
macro_rules! kernel_args {
    ($gpu:expr; $($a:expr),* $(,)?) => {
        [$($crate::cuda::kargs::IntoArg::arg(&$a, $gpu)),*]
    };
}
pub use crate::kernel_args as args;

impl Arg<'_> {
    /// The argument's address, as `cuLaunchKernelEx` takes it.
    fn raw(&self) -> *mut c_void {
        match self {
            Arg::P(v) => v as *const u64 as *mut c_void,
            Arg::I(v) => v as *const i32 as *mut c_void,
            Arg::L(v) => v as *const i64 as *mut c_void,
            Arg::F(v) => v as *const f32 as *mut c_void,
            Arg::D(v) => v as *const f64 as *mut c_void,
            Arg::Struct(p, _) => *p as *mut c_void,
        }
    }
}

/// The launch of kernel `name` over a grid of (x, y, z) blocks of `threads` threads with `smem`
/// bytes of dynamic shared memory, the grid checked against the driver's ranges.
pub fn config(name: &str, (x, y, z): (usize, usize, usize), threads: u32, smem: usize) -> Result<LaunchConfig> {
    ensure!(x > 0 && x <= i32::MAX as usize, "{name}: launch of {x} blocks is out of range");
    ensure!(y > 0 && y <= 65535, "{name}: launch of {y} blocks in y is out of range");
    ensure!(z > 0 && z <= 65535, "{name}: launch of {z} blocks in z is out of range");
    Ok(LaunchConfig {
        grid_dim: (x as u32, y as u32, z as u32),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: smem as u32,
    })
}

/// The launch of a grid of `grid` blocks of `threads` threads with `smem` bytes of dynamic shared
/// memory, sizes the caller has in the driver's types already (unlike [`config`], unchecked).
pub fn plain_config(grid: (u32, u32, u32), threads: u32, smem: usize) -> LaunchConfig {
    LaunchConfig { grid_dim: grid, block_dim: (threads, 1, 1), shared_mem_bytes: smem as u32 }
}

/// Launches kernel `name` of `src` on the GPU's stream (with the shared memory of `cfg` allowed,
/// [`Gpu::function_smem`]).
///
/// Callers pass the arguments of `name`'s C signature, in order, with pointers into buffers whose
/// lengths they checked against the launch's shapes.
pub fn launch(gpu: &Gpu, src: &Source, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
    launch_on(gpu, gpu.stream(), src, name, cfg, args)
}

/// [`launch`] on `stream` (one of [`Gpu::side_streams`], forked from and joined back to the GPU's
/// stream by the caller).
pub fn launch_on(
    gpu: &Gpu,
    stream: &CudaStream,
    src: &Source,
    name: &str,
    cfg: LaunchConfig,
    args: &[Arg],
) -> Result<()> {
    let f = gpu.function_smem(src, name, cfg.shared_mem_bytes as usize)?;
    launch_function(stream, &f, name, cfg, args)
}

/// [`launch_on`] of a kernel loaded already (`name` for the error), its shared memory allowed by
/// the caller.
pub fn launch_function(
    stream: &CudaStream,
    f: &CudaFunction,
    name: &str,
    cfg: LaunchConfig,
    args: &[Arg],
) -> Result<()> {
    let mut ptrs: Vec<*mut c_void> = args.iter().map(Arg::raw).collect();
    // What cudarc's launch builder does for arguments it does not track (the GPU's contexts track
    // no events): bind the context, then launch.
    stream.context().bind_to_thread().map_err(|e| anyhow!("launching `{name}`: {e:?}"))?;
    // SAFETY: the caller's contract of [`launch`]; the pointers point into `args`, alive for the call.
    unsafe {
        cudarc::driver::result::launch_kernel(
            f.cu_function(),
            cfg.grid_dim,
            cfg.block_dim,
            cfg.shared_mem_bytes,
            stream.cu_stream(),
            &mut ptrs,
        )
    }
    .map_err(|e| anyhow!("launching `{name}`: {e:?}"))
}

/// [`launch`] allowing programmatic dependent launch ([`Gpu::launch_dependent`]), for kernels that
/// wait (pdl.cuh's `pdl_wait_prev`) before reading what earlier kernels write: their launch
/// overlaps the kernel before them.
pub fn launch_pdl(gpu: &Gpu, src: &Source, name: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
    let f = gpu.function_smem(src, name, cfg.shared_mem_bytes as usize)?;
    let mut ptrs: Vec<*mut c_void> = args.iter().map(Arg::raw).collect();
    // SAFETY: as in `launch`; the pointers point into `args`, alive for the call.
    unsafe { gpu.launch_dependent(&f, cfg, &mut ptrs) }.map_err(|e| anyhow!("`{name}`: {e:#}"))
}
