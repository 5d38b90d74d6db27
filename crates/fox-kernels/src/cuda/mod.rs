//! CUDA backend: device selection, run-time kernel compilation, device buffers, and the
//! Forgetting Attention kernels.
//!
//! Everything CUDA is loaded at run time (`cudarc` with `dynamic-loading`): the binary builds and
//! runs on machines without CUDA, and [`probe`] and [`Gpu::new`] say clearly why a GPU cannot be
//! used when one is asked for. Kernels are CUDA C++ sources in `kernels/`, compiled by NVRTC for the device's
//! architecture (sm_90a on H100/H200) on first use and cached on disk ([`compile`]).

/// The CUDA bindings the backend types are made of (re-exported so users need not match versions).
pub use cudarc;

pub mod attention;
pub mod attention_f32;
pub mod compile;
pub mod delta_rule;
pub mod gemm;
pub mod gla;
pub mod kargs;
mod linear_attention;
pub mod nccl;
pub mod ops;
pub mod selective_scan;
pub mod ssd;
pub mod ssd_tc;

use anyhow::{anyhow, bail, Result};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The device a run uses.
#[derive(Clone)]
pub enum Device {
    Cpu,
    Cuda(Arc<Gpu>),
}

impl Device {
    pub fn is_cuda(&self) -> bool {
        matches!(self, Device::Cuda(_))
    }
    pub fn describe(&self) -> String {
        match self {
            Device::Cpu => format!("cpu ({} threads)", rayon::current_num_threads()),
            Device::Cuda(g) => g.describe(),
        }
    }
}

/// Why no GPU can be used, or Ok with the number of devices.
pub fn probe() -> Result<usize> {
    // SAFETY: only dlopen()s the driver library to see whether it exists.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        bail!("no CUDA driver found (libcuda.so could not be loaded): this machine has no NVIDIA GPU driver");
    }
    cudarc::driver::result::init().map_err(|e| anyhow!("the CUDA driver failed to initialise: {e:?}"))?;
    let n = CudaContext::device_count().map_err(|e| anyhow!("could not count CUDA devices: {e:?}"))?;
    if n <= 0 {
        bail!("the CUDA driver is present but reports no GPU");
    }
    Ok(n as usize)
}

/// Folders where a CUDA library may be found when it is not on the loader's path, in order: the
/// folder (or the file's folder) in `env_var`, $CUDA_HOME / $CUDA_PATH / $CUDA_ROOT, the usual
/// toolkit locations, and pip's NVIDIA wheels (`nvidia/<sub>/lib` for each of `wheel_subdirs`) in
/// the site-packages of system, user, /opt/* and pyenv Pythons and their .venv folders.
pub fn library_dirs(env_var: &str, wheel_subdirs: &[&str]) -> Vec<std::path::PathBuf> {
    use std::path::{Path, PathBuf};
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Ok(p) = std::env::var(env_var) {
        let p = PathBuf::from(p);
        dirs.push(if p.is_file() { p.parent().map(|d| d.to_path_buf()).unwrap_or_default() } else { p });
    }
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Ok(p) = std::env::var(var) {
            dirs.push(Path::new(&p).join("lib64"));
            dirs.push(Path::new(&p).join("lib"));
        }
    }
    for p in ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/lib/x86_64-linux-gnu"] {
        dirs.push(p.into());
    }
    let home = std::env::var("HOME").unwrap_or_default();
    let mut prefixes: Vec<PathBuf> = vec!["/usr/local".into(), "/usr".into(), Path::new(&home).join(".local")];
    for root in [PathBuf::from("/opt"), Path::new(&home).join(".pyenv/versions")] {
        if let Ok(rd) = std::fs::read_dir(&root) {
            for e in rd.flatten() {
                prefixes.push(e.path());
                prefixes.push(e.path().join(".venv"));
            }
        }
    }
    for pre in prefixes {
        if let Ok(rd) = std::fs::read_dir(pre.join("lib")) {
            for e in rd.flatten() {
                let py = e.path();
                if py.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("python3")) {
                    for pk in ["site-packages", "dist-packages"] {
                        for sub in wheel_subdirs {
                            dirs.push(py.join(pk).join("nvidia").join(sub).join("lib"));
                        }
                    }
                }
            }
        }
    }
    dirs
}

/// Make NVRTC loadable. cudarc dlopen()s it by name (libnvrtc.so.13, ...); where it is not on
/// the loader's path, load it here from the usual install locations by full path: once loaded,
/// a later dlopen by soname finds it.
pub fn ensure_nvrtc() -> Result<()> {
    // SAFETY: dlopen probing only.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Ok(());
    }
    let dirs = library_dirs("FOXLM_NVRTC", &["cu13", "cuda_nvrtc"]);
    for d in &dirs {
        for name in ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"] {
            let f = d.join(name);
            if !f.is_file() {
                continue;
            }
            // NVRTC dlopen()s its builtins library by name: load it first from the same folder.
            if let Ok(rd) = std::fs::read_dir(d) {
                for e in rd.flatten() {
                    let fname = e.file_name();
                    let fname = fname.to_string_lossy();
                    if fname.starts_with("libnvrtc-builtins.so.") && !fname.contains("alt") {
                        // SAFETY: loading a plain C library (NVRTC's builtins) by path.
                        if let Ok(lib) = unsafe { libloading::Library::new(e.path()) } {
                            std::mem::forget(lib);
                        }
                    }
                }
            }
            // SAFETY: as above; the handle is leaked so the library stays loaded.
            if let Ok(lib) = unsafe { libloading::Library::new(&f) } {
                std::mem::forget(lib);
                return Ok(());
            }
        }
    }
    bail!(
        "NVRTC (libnvrtc.so) was not found: it compiles the CUDA kernels at run time. Install the CUDA \
         toolkit or `pip install nvidia-cuda-nvrtc`, add its lib folder to LD_LIBRARY_PATH, or point \
         FOXLM_NVRTC at libnvrtc.so"
    )
}

/// One CUDA device with its stream and loaded kernels.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: usize,
    name: String,
    cc: (i32, i32),
    arch: String,
    sms: usize,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// Loaded kernels, each with the dynamic shared memory it is allowed so far (see
    /// [`Gpu::function_smem`]).
    funcs: Mutex<HashMap<String, (CudaFunction, usize)>>,
    /// Streams beside `stream`, made at first use (see [`Gpu::side_streams`]).
    side: std::sync::OnceLock<[Arc<CudaStream>; 3]>,
}

impl Gpu {
    /// Open GPU `ordinal`. Errors say why (no driver, no such device, too old, no NVRTC).
    pub fn new(ordinal: usize) -> Result<Arc<Gpu>> {
        Self::open(ordinal, None)
    }

    /// Open GPU `ordinal` on its primary context (the one PyTorch and the CUDA runtime use) with
    /// work issued on a stream that belongs to another library, such as PyTorch's current stream
    /// (0 is the legacy default stream). Nothing here creates or destroys that stream.
    ///
    /// # Safety
    /// `stream` must be a valid stream of device `ordinal`'s primary context, and its owner must
    /// keep it alive as long as the returned `Gpu` (or anything made from it) is used.
    pub unsafe fn on_stream(ordinal: usize, stream: cudarc::driver::sys::CUstream) -> Result<Arc<Gpu>> {
        Self::open(ordinal, Some(stream))
    }

    fn open(ordinal: usize, borrowed: Option<cudarc::driver::sys::CUstream>) -> Result<Arc<Gpu>> {
        let n = probe()?;
        if ordinal >= n {
            bail!("GPU {ordinal} does not exist: this machine has {n} CUDA device(s)");
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| anyhow!("could not open GPU {ordinal}: {e:?}"))?;
        // One stream, in order: the per-buffer event tracking of cudarc is not needed.
        // SAFETY: all work of this crate goes through `stream`, a single in-order stream.
        unsafe { ctx.disable_event_tracking() };
        let cc = ctx.compute_capability().map_err(|e| anyhow!("{e:?}"))?;
        if cc.0 < 8 {
            bail!(
                "GPU {ordinal} has compute capability {}.{}; the kernels need 8.0 or newer (Ampere, Hopper)",
                cc.0,
                cc.1
            );
        }
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let sms = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .unwrap_or(1) as usize;
        ensure_nvrtc()?;
        let arch = compile::arch_for(cc);
        // A stream of our own rather than the legacy default stream, which cannot be captured
        // into a CUDA graph (decode steps are replayed as graphs).
        let stream = match borrowed {
            // SAFETY: the caller of `on_stream` vouches for the handle and its lifetime.
            Some(s) => unsafe { ctx.wrap_borrowed_stream(s) },
            None => ctx.new_stream().map_err(|e| anyhow!("could not create a stream on GPU {ordinal}: {e:?}"))?,
        };
        Ok(Arc::new(Gpu {
            ctx,
            stream,
            ordinal,
            name,
            cc,
            arch,
            sms,
            modules: Mutex::new(HashMap::new()),
            funcs: Mutex::new(HashMap::new()),
            side: std::sync::OnceLock::new(),
        }))
    }

    pub fn describe(&self) -> String {
        let mem = self.ctx.total_mem().map(|b| b as f64 / (1u64 << 30) as f64).unwrap_or(0.0);
        format!(
            "cuda:{} {} (sm_{}{}, {} SMs, {:.0} GiB, kernels for {})",
            self.ordinal, self.name, self.cc.0, self.cc.1, self.sms, mem, self.arch
        )
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn arch(&self) -> &str {
        &self.arch
    }
    pub fn sm_count(&self) -> usize {
        self.sms
    }
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Three streams for kernels that run beside one another inside one operation, which forks
    /// them from [`Gpu::stream`] and joins them back before it returns (so callers still see one
    /// in-order stream): the first at the device's highest priority (its blocks are placed before
    /// waiting blocks of the others), the other two at the lowest. Made at first use and kept.
    pub fn side_streams(&self) -> Result<&[Arc<CudaStream>; 3]> {
        if let Some(s) = self.side.get() {
            return Ok(s);
        }
        let (least, greatest) = cudarc::driver::result::stream::get_priority_range()
            .map_err(|e| anyhow!("reading the stream priorities: {e:?}"))?;
        let make = |p: i32| {
            self.ctx
                .new_stream_with_priority(p)
                .map_err(|e| anyhow!("could not create a stream on GPU {}: {e:?}", self.ordinal))
        };
        let made = [make(greatest)?, make(least)?, make(least)?];
        Ok(self.side.get_or_init(|| made))
    }

    /// Launches `f` on the stream allowing programmatic dependent launch: its blocks may start
    /// while the kernel before it finishes, up to the kernel's `griddepcontrol.wait` (which every
    /// kernel launched this way must execute before it touches what earlier kernels write).
    ///
    /// # Safety
    /// `args` points at the kernel's arguments, in order and of its C types, valid for the call;
    /// the kernel waits as above.
    pub unsafe fn launch_dependent(
        &self,
        f: &CudaFunction,
        cfg: cudarc::driver::LaunchConfig,
        args: &mut [*mut std::ffi::c_void],
    ) -> Result<()> {
        use cudarc::driver::sys;
        self.ctx.bind_to_thread().map_err(|e| anyhow::anyhow!("{e:?}"))?;
        // Programmatic dependent launch needs sm_90; older GPUs launch in plain stream order.
        let pdl = self.cc.0 >= 9;
        // SAFETY: a zeroed attribute is valid plain data; id and value are set next.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let lc = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(pdl),
        };
        // SAFETY: the caller's contract (arguments valid for `f`); the config lives for the call.
        let r = unsafe { sys::cuLaunchKernelEx(&lc, f.cu_function(), args.as_mut_ptr(), std::ptr::null_mut()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            anyhow::bail!("launching a kernel with programmatic dependent launch: {r:?}");
        }
        Ok(())
    }

    /// A kernel of one of the sources in [`compile::SOURCES`], compiling and loading on first use.
    pub fn function(&self, source: &compile::Source, name: &str) -> Result<CudaFunction> {
        self.function_smem(source, name, 0)
    }

    /// [`Gpu::function`] allowed `smem` bytes of dynamic shared memory: above the 48 KB every
    /// kernel may take, a kernel must opt in to what it uses. The allowance is raised once per
    /// kernel and size, not at every launch (a driver call each time otherwise).
    pub fn function_smem(&self, source: &compile::Source, name: &str, smem: usize) -> Result<CudaFunction> {
        const DEFAULT_SMEM: usize = 48 * 1024;
        let key = format!("{}::{name}", source.name);
        if let Some((f, allowed)) = self.funcs.lock().unwrap().get_mut(&key) {
            if smem > *allowed {
                raise_smem(f, name, smem)?;
                *allowed = smem;
            }
            return Ok(f.clone());
        }
        let module = {
            let mut mods = self.modules.lock().unwrap();
            if let Some(m) = mods.get(source.name) {
                m.clone()
            } else {
                let cubin = compile::compiled(source, &self.arch)?;
                let m = self
                    .ctx
                    .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
                    .map_err(|e| anyhow!("loading kernels `{}` for {}: {e:?}", source.name, self.arch))?;
                mods.insert(source.name, m.clone());
                m
            }
        };
        let f = module.load_function(name).map_err(|e| anyhow!("kernel `{name}` not found: {e:?}"))?;
        if smem > DEFAULT_SMEM {
            raise_smem(&f, name, smem)?;
        }
        self.funcs.lock().unwrap().insert(key, (f.clone(), smem.max(DEFAULT_SMEM)));
        Ok(f)
    }

    fn oom(&self, what: &str, bytes: usize, e: cudarc::driver::DriverError) -> anyhow::Error {
        if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            let (free, total) = self.ctx.mem_get_info().unwrap_or((0, 0));
            anyhow!(
                "out of GPU memory allocating {what} ({:.1} MiB) on {}: {:.1} of {:.1} GiB free",
                bytes as f64 / (1u64 << 20) as f64,
                self.name,
                free as f64 / (1u64 << 30) as f64,
                total as f64 / (1u64 << 30) as f64
            )
        } else {
            anyhow!("allocating {what} on the GPU: {e:?}")
        }
    }

    /// Zero-initialised device buffer of `n` elements.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>> {
        self.stream.alloc_zeros::<T>(n.max(1)).map_err(|e| self.oom("a buffer", n * std::mem::size_of::<T>(), e))
    }

    /// Copy a host slice to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        if data.is_empty() {
            bail!("cannot upload an empty buffer");
        }
        self.stream.clone_htod(data).map_err(|e| self.oom("a buffer", std::mem::size_of_val(data), e))
    }

    /// Copy into an existing device buffer.
    pub fn write<T: DeviceRepr>(&self, dst: &mut CudaSlice<T>, data: &[T]) -> Result<()> {
        self.stream.memcpy_htod(data, dst).map_err(|e| anyhow!("host-to-device copy: {e:?}"))
    }

    /// Copy a device buffer back (waits for the stream).
    pub fn download<T: DeviceRepr + Default + Clone>(&self, src: &CudaSlice<T>) -> Result<Vec<T>> {
        self.stream.clone_dtoh(src).map_err(|e| anyhow!("device-to-host copy: {e:?}"))
    }

    /// Wait for all queued work; surfaces asynchronous kernel faults.
    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| anyhow!("GPU error (a kernel faulted or the device failed): {e:?}"))
    }
}

/// A device buffer owned by another library (a PyTorch tensor's storage, say), seen as a
/// [`CudaSlice`] of `len` elements on `gpu`'s stream so that the launch API can take it. Dropping
/// it frees nothing: the owner keeps the memory.
pub struct Borrowed<T>(Option<CudaSlice<T>>);

impl<T> Borrowed<T> {
    /// # Safety
    /// `ptr` must be a device allocation of `gpu`'s context holding at least `len` elements of
    /// `T`, alive (and not written by others without ordering on `gpu`'s stream) while this
    /// view is used.
    pub unsafe fn new(gpu: &Gpu, ptr: u64, len: usize) -> Self {
        // SAFETY: the caller's contract; the slice is leaked rather than freed on drop.
        Self(Some(unsafe { gpu.stream.upgrade_device_ptr(ptr, len) }))
    }
}

impl<T> std::ops::Deref for Borrowed<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        self.0.as_ref().expect("a Borrowed buffer is only emptied by its drop")
    }
}

impl<T> std::ops::DerefMut for Borrowed<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        self.0.as_mut().expect("a Borrowed buffer is only emptied by its drop")
    }
}

impl<T> Drop for Borrowed<T> {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            // The memory is the owner's: give the pointer back without freeing it.
            let _ = s.leak();
        }
    }
}

/// The element type of a device tensor that the model's activations and weight copies use: f32
/// (to check against the CPU reference) or bf16 (training and inference). Kernels written for
/// both are instantiated as `name_f32` / `name_bf16` (see [`Elem::NAME`]); statistics, gate
/// prefix sums, master weights, gradients and optimizer state are always f32.
pub trait Elem: DeviceRepr + ValidAsZeroBits + Copy + Default + Send + Sync + Unpin + 'static {
    /// Suffix of the kernel instantiation and the C++ type name in kernels/ (`float`, `bf16`).
    const NAME: &'static str;
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl Elem for f32 {
    const NAME: &'static str = "f32";
    fn from_f32(x: f32) -> Self {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl Elem for half::bf16 {
    const NAME: &'static str = "bf16";
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
}

/// Round f32 to bf16 / fp16 bits.
pub fn to_half_bits(x: &[f32], dtype: attention::DType) -> Vec<u16> {
    match dtype {
        attention::DType::Bf16 => x.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect(),
        attention::DType::F16 => x.iter().map(|v| half::f16::from_f32(*v).to_bits()).collect(),
    }
}

/// bf16 / fp16 bits to f32.
pub fn from_half_bits(x: &[u16], dtype: attention::DType) -> Vec<f32> {
    match dtype {
        attention::DType::Bf16 => x.iter().map(|v| half::bf16::from_bits(*v).to_f32()).collect(),
        attention::DType::F16 => x.iter().map(|v| half::f16::from_bits(*v).to_f32()).collect(),
    }
}

/// Median time in ms of `f` over `iters` runs after `warmup`, with CUDA events on the GPU's
/// stream (the kernels' timing hooks and every benchmark use it).
pub fn time_ms(gpu: &Gpu, warmup: usize, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..warmup {
        f()?;
    }
    gpu.sync()?;
    let ctx = gpu.context();
    let mut ts = Vec::with_capacity(iters);
    for _ in 0..iters.max(1) {
        let s =
            ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| anyhow!("{e:?}"))?;
        let e =
            ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| anyhow!("{e:?}"))?;
        s.record(gpu.stream()).map_err(|e| anyhow!("{e:?}"))?;
        f()?;
        e.record(gpu.stream()).map_err(|e| anyhow!("{e:?}"))?;
        ts.push(s.elapsed_ms(&e).map_err(|e| anyhow!("kernel failed while timing: {e:?}"))? as f64);
    }
    ts.sort_by(f64::total_cmp);
    Ok(ts[ts.len() / 2])
}

/// An event marking the work queued so far on `s`, for other streams to wait on (`op` names the
/// caller in the error).
pub(crate) fn stream_event(op: &str, s: &CudaStream) -> Result<cudarc::driver::CudaEvent> {
    s.record_event(None).map_err(|e| anyhow!("{op}: recording an event: {e:?}"))
}

/// `s` runs its next work only after `e`.
pub(crate) fn stream_wait(op: &str, s: &CudaStream, e: &cudarc::driver::CudaEvent) -> Result<()> {
    s.wait(e).map_err(|e| anyhow!("{op}: ordering the streams: {e:?}"))
}

/// `after` runs its next work only after what is queued on `before` so far: a fork from the GPU's
/// stream to a side stream, or the join back.
pub(crate) fn stream_order(op: &str, before: &CudaStream, after: &CudaStream) -> Result<()> {
    stream_wait(op, after, &stream_event(op, before)?)
}

/// Lets kernel `f` (`name`, for the error) take `smem` bytes of dynamic shared memory.
fn raise_smem(f: &CudaFunction, name: &str, smem: usize) -> Result<()> {
    let attr = cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    let bytes = i32::try_from(smem).map_err(|_| anyhow!("{name}: {smem} bytes of shared memory"))?;
    f.set_attribute(attr, bytes).map_err(|e| anyhow!("{name}: cannot raise shared memory to {smem} bytes: {e:?}"))
}
