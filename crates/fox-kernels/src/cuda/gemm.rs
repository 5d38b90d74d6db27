//! The model's matrix products on the GPU through cuBLASLt, row-major as in [`crate::matmul`].
//!
//! cuBLASLt is column-major. A row-major [r, c] matrix is, read column-major, its transpose
//! [c, r] with leading dimension c, so every product below is issued as the product of the
//! transposes: y = x·wᵀ becomes yᵀ = w·xᵀ (w's stored form transposed, x's as stored), and so on.
//! No data is ever transposed.
//!
//! Types: bf16 inputs with fp32 accumulation (CUBLAS_COMPUTE_32F) and a bf16 or f32 output; f32
//! inputs also with CUBLAS_COMPUTE_32F, never TF32 (the f32 path exists to match the CPU).
//!
//! Each distinct problem (operation, dtypes, sizes, pointer alignments) asks
//! cublasLtMatmulAlgoGetHeuristic once; its descriptors and the chosen algorithm are kept in a
//! plan cache, so a training step issues no heuristic query after its first. Determinism: cuBLAS
//! gives bitwise-identical results for a fixed algorithm on one stream with a user-owned
//! workspace; split-K is allowed only with the reduction done in the compute type in the
//! workspace (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE), which is ordered and keeps the partial
//! sums in fp32 (the in-place scheme would add bf16-rounded partials). The choice is the
//! heuristic's, never timed: a resumed run picks the same algorithms and so the same bits.

use super::{Elem, Gpu};
use anyhow::{anyhow, bail, ensure, Result};
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// cuBLASLt workspace: NVIDIA's recommendation for Hopper (32 MiB).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// The shared library cudarc loads (CUDA 13).
const LIB: &str = "libcublasLt.so.13";

/// Make cuBLASLt loadable. cudarc dlopen()s it by name; where it is not on the loader's path,
/// load it here by full path from the usual places (a CUDA toolkit, pip's nvidia-cublas wheel):
/// once loaded, cudarc's dlopen by soname finds it. Errors name the library.
pub fn ensure_cublaslt() -> Result<()> {
    // SAFETY: dlopen probing only.
    if unsafe { sys::is_culib_present() } {
        return Ok(());
    }
    let dirs = super::library_dirs("FOXLM_CUBLASLT", &["cu13", "cublas"]);
    for d in &dirs {
        let f = d.join(LIB);
        if f.is_file() {
            // SAFETY: loading a plain C library by path; the handle is leaked so it stays loaded.
            if let Ok(lib) = unsafe { libloading::Library::new(&f) } {
                std::mem::forget(lib);
                return Ok(());
            }
        }
    }
    bail!(
        "cuBLASLt ({LIB}) could not be loaded: the GPU matrix products need it. Install the CUDA 13 \
         toolkit or `pip install nvidia-cublas` (CUDA 13), add its lib folder to LD_LIBRARY_PATH, or \
         point FOXLM_CUBLASLT at {LIB}"
    )
}

/// Which product of a Linear layer (weights [n, k] row-major, inputs [m, k]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmOp {
    /// y[m, n] = x[m, k] · wᵀ
    Fwd,
    /// dx[m, k] = dy[m, n] · w
    Dx,
    /// dw[n, k] += dyᵀ · x
    Dw,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Dt {
    F32,
    Bf16,
}

impl Dt {
    fn of<E: Elem>() -> Result<Dt> {
        match E::NAME {
            "f32" => Ok(Dt::F32),
            "bf16" => Ok(Dt::Bf16),
            other => bail!("cuBLASLt GEMM: element type `{other}` is not supported (f32 or bf16)"),
        }
    }
    fn cuda(self) -> sys::cudaDataType {
        match self {
            Dt::F32 => sys::cudaDataType::CUDA_R_32F,
            Dt::Bf16 => sys::cudaDataType::CUDA_R_16BF,
        }
    }
}

/// Everything the algorithm choice depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    op: GemmOp,
    ab: Dt,
    cd: Dt,
    /// cuBLAS's (column-major) m, n, k
    m: u64,
    n: u64,
    k: u64,
    /// pointer alignments of A, B, C=D in bytes (capped at 256)
    align: [u32; 3],
}

/// Descriptors and the algorithm of one problem. The data pointers are not part of it.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    la: sys::cublasLtMatrixLayout_t,
    lb: sys::cublasLtMatrixLayout_t,
    lc: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
    splitk: u32,
    reduction: u32,
    /// the heuristic's other candidates, best first: tried in order if the chosen one fails at
    /// its first call (then the plan is pinned to the first that works)
    fallbacks: Vec<sys::cublasLtMatmulAlgo_t>,
    confirmed: bool,
}

// SAFETY: the descriptors are plain host-side objects owned by the plan; cuBLASLt allows using
// them from any thread, and the cache's mutex serialises every use.
unsafe impl Send for Plan {}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created in `Gemm::plan`, destroyed once here. Failures cannot be acted on.
        unsafe {
            for l in [self.la, self.lb, self.lc] {
                if !l.is_null() {
                    let _ = sys::cublasLtMatrixLayoutDestroy(l);
                }
            }
            if !self.desc.is_null() {
                let _ = sys::cublasLtMatmulDescDestroy(self.desc);
            }
        }
    }
}

/// Which algorithm cuBLASLt chose for a problem (for reports).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlgoInfo {
    pub split_k: u32,
    /// CUBLASLT_REDUCTION_SCHEME_* (0: none, 2: compute type in the workspace)
    pub reduction: u32,
}

/// cuBLASLt handle, workspace and plan cache; create once per GPU.
pub struct Gemm {
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    plans: Mutex<HashMap<Key, Plan>>,
    queries: AtomicUsize,
}

// SAFETY: a cuBLASLt handle may be used from several threads; every matmul on it happens under
// the plan cache's mutex, on the one stream of `gpu`.
unsafe impl Send for Gemm {}
unsafe impl Sync for Gemm {}

impl Drop for Gemm {
    fn drop(&mut self) {
        if let Ok(mut p) = self.plans.lock() {
            p.clear();
        }
        // SAFETY: created in `new`, destroyed once here.
        unsafe {
            let _ = sys::cublasLtDestroy(self.handle);
        }
    }
}

fn lt(what: &str, s: sys::cublasStatus_t) -> Result<()> {
    s.result().map_err(|e| anyhow!("cuBLASLt {what} failed: {e:?}"))
}

/// `what` of `op` holds a [rows, cols] matrix (`len` elements, or more).
fn need_matrix(op: &str, what: &str, len: usize, (rows, cols): (usize, usize)) -> Result<()> {
    ensure!(len >= rows * cols, "{op}: {what} holds {len} elements, [{rows}, {cols}] needs {}", rows * cols);
    Ok(())
}

fn align_of(ptr: u64) -> u32 {
    if ptr == 0 {
        256
    } else {
        (1u64 << ptr.trailing_zeros().min(8)) as u32
    }
}

impl Gemm {
    pub fn new(gpu: &Arc<Gpu>) -> Result<Self> {
        Self::on(gpu)
    }

    /// [`Gemm::new`] from a plain reference (the handle keeps the GPU's stream and context alive).
    pub fn on(gpu: &Gpu) -> Result<Self> {
        ensure_cublaslt()?;
        gpu.context().bind_to_thread().map_err(|e| anyhow!("binding the CUDA context: {e:?}"))?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: plain out-parameter.
        lt("cublasLtCreate", unsafe { sys::cublasLtCreate(&mut handle) })?;
        let workspace = match gpu.zeros::<u8>(WORKSPACE_BYTES) {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: created just above.
                unsafe {
                    let _ = sys::cublasLtDestroy(handle);
                }
                return Err(e.context("the cuBLASLt workspace"));
            }
        };
        Ok(Gemm {
            stream: gpu.stream().clone(),
            ctx: gpu.context().clone(),
            handle,
            workspace,
            plans: Mutex::new(HashMap::new()),
            queries: AtomicUsize::new(0),
        })
    }

    /// How many heuristic queries were made so far (one per distinct problem).
    pub fn heuristic_queries(&self) -> usize {
        self.queries.load(Ordering::Relaxed)
    }

    /// The algorithm chosen for a problem already run, if any (sizes as in the Linear's terms).
    pub fn algo_info<T: Elem, Y: Elem>(&self, op: GemmOp, m: usize, k: usize, n: usize) -> Option<AlgoInfo> {
        let (ab, cd) = (Dt::of::<T>().ok()?, Dt::of::<Y>().ok()?);
        let (cm, cn, ck) = lt_dims(op, m, k, n);
        let plans = self.plans.lock().ok()?;
        plans
            .iter()
            .find(|(key, _)| key.op == op && key.ab == ab && key.cd == cd && (key.m, key.n, key.k) == (cm, cn, ck))
            .map(|(_, p)| AlgoInfo { split_k: p.splitk, reduction: p.reduction })
    }

    /// y[m, n] (=|+=) x[m, k] · w[n, k]ᵀ: a Linear forward. Y is T, or f32 from bf16 inputs.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_fwd<T: Elem, Y: Elem>(
        &self,
        y: &mut CudaSlice<Y>,
        accumulate: bool,
        x: &CudaSlice<T>,
        w: &CudaSlice<T>,
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<()> {
        self.linear_fwd_view(y, accumulate, x, w, m, k, n)
    }

    /// dx[m, k] (=|+=) dy[m, n] · w[n, k]: the input gradient of a Linear.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_bwd_dx<T: Elem>(
        &self,
        dx: &mut CudaSlice<T>,
        accumulate: bool,
        dy: &CudaSlice<T>,
        w: &CudaSlice<T>,
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<()> {
        self.linear_bwd_dx_view(dx, accumulate, dy, w, m, k, n)
    }

    /// dw[n, k] += dy[m, n]ᵀ · x[m, k]: the weight gradient of a Linear, always accumulated into
    /// the f32 gradient.
    pub fn linear_bwd_dw<T: Elem>(
        &self,
        dw: &mut CudaSlice<f32>,
        dy: &CudaSlice<T>,
        x: &CudaSlice<T>,
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<()> {
        self.linear_bwd_dw_view(dw, dy, x, m, k, n)
    }

    /// [`Gemm::linear_fwd`] on any device buffers or views (`slice(..)`, `slice_mut(..)`), e.g.
    /// a chunk of rows of the output head. Each buffer starts at its view's first element.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_fwd_view<T: Elem, Y: Elem>(
        &self,
        y: &mut impl DevicePtrMut<Y>,
        accumulate: bool,
        x: &impl DevicePtr<T>,
        w: &impl DevicePtr<T>,
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<()> {
        let (ab, cd) = (Dt::of::<T>()?, Dt::of::<Y>()?);
        ensure!(
            !(ab == Dt::F32 && cd == Dt::Bf16),
            "linear_fwd: f32 inputs with a bf16 output are not supported (cuBLASLt has no such kernel)"
        );
        need_matrix("linear_fwd", "x", x.len(), (m, k))?;
        need_matrix("linear_fwd", "w", w.len(), (n, k))?;
        need_matrix("linear_fwd", "y", y.len(), (m, n))?;
        if m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            return self.zero_unless(accumulate, y, m * n);
        }
        self.matmul(GemmOp::Fwd, ab, cd, (m, k, n), self.ptr(w), self.ptr(x), self.ptr_mut(y), accumulate)
    }

    /// [`Gemm::linear_bwd_dx`] on any device buffers or views.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_bwd_dx_view<T: Elem>(
        &self,
        dx: &mut impl DevicePtrMut<T>,
        accumulate: bool,
        dy: &impl DevicePtr<T>,
        w: &impl DevicePtr<T>,
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<()> {
        let dt = Dt::of::<T>()?;
        need_matrix("linear_bwd_dx", "dy", dy.len(), (m, n))?;
        need_matrix("linear_bwd_dx", "w", w.len(), (n, k))?;
        need_matrix("linear_bwd_dx", "dx", dx.len(), (m, k))?;
        if m == 0 || k == 0 {
            return Ok(());
        }
        if n == 0 {
            return self.zero_unless(accumulate, dx, m * k);
        }
        self.matmul(GemmOp::Dx, dt, dt, (m, k, n), self.ptr(w), self.ptr(dy), self.ptr_mut(dx), accumulate)
    }

    /// [`Gemm::linear_bwd_dw`] on any device buffers or views.
    pub fn linear_bwd_dw_view<T: Elem>(
        &self,
        dw: &mut impl DevicePtrMut<f32>,
        dy: &impl DevicePtr<T>,
        x: &impl DevicePtr<T>,
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<()> {
        let dt = Dt::of::<T>()?;
        need_matrix("linear_bwd_dw", "dy", dy.len(), (m, n))?;
        need_matrix("linear_bwd_dw", "x", x.len(), (m, k))?;
        need_matrix("linear_bwd_dw", "dw", dw.len(), (n, k))?;
        if m == 0 || n == 0 || k == 0 {
            return Ok(());
        }
        self.matmul(GemmOp::Dw, dt, Dt::F32, (m, k, n), self.ptr(x), self.ptr(dy), self.ptr_mut(dw), true)
    }

    fn ptr<T>(&self, s: &impl DevicePtr<T>) -> u64 {
        let (p, _g) = s.device_ptr(&self.stream);
        p
    }
    fn ptr_mut<T>(&self, s: &mut impl DevicePtrMut<T>) -> u64 {
        let (p, _g) = s.device_ptr_mut(&self.stream);
        p
    }

    /// The product over an empty inner dimension: zeros, or nothing when accumulating.
    fn zero_unless<Y: Elem>(&self, accumulate: bool, y: &mut impl DevicePtrMut<Y>, len: usize) -> Result<()> {
        if !accumulate {
            let p = self.ptr_mut(y);
            // SAFETY: the caller checked that `y` holds at least `len` elements.
            unsafe {
                cudarc::driver::result::memset_d8_async(p, 0, len * std::mem::size_of::<Y>(), self.stream.cu_stream())
            }
            .map_err(|e| anyhow!("zeroing a GEMM output: {e:?}"))?;
        }
        Ok(())
    }

    /// D = A·B (+ D) in cuBLAS's terms; `a`, `b` as the op's table in [`lt_dims`] says.
    #[allow(clippy::too_many_arguments)]
    fn matmul(
        &self,
        op: GemmOp,
        ab: Dt,
        cd: Dt,
        (m, k, n): (usize, usize, usize),
        a: u64,
        b: u64,
        d: u64,
        accumulate: bool,
    ) -> Result<()> {
        let (cm, cn, ck) = lt_dims(op, m, k, n);
        let key = Key { op, ab, cd, m: cm, n: cn, k: ck, align: [align_of(a), align_of(b), align_of(d)] };
        self.ctx.bind_to_thread().map_err(|e| anyhow!("binding the CUDA context: {e:?}"))?;
        let mut plans = self.plans.lock().map_err(|_| anyhow!("the GEMM plan cache was poisoned by a panic"))?;
        let p = match plans.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(self.plan(&key).map_err(|e| {
                e.context(format!("GEMM {op:?} {ab:?}->{cd:?} (Linear m={m} k={k} n={n}): no cuBLASLt algorithm"))
            })?),
        };
        let alpha = 1.0f32;
        let beta = if accumulate { 1.0f32 } else { 0.0f32 };
        let ws = self.ptr(&self.workspace);
        loop {
            // SAFETY: the descriptors describe buffers whose lengths the callers checked; C and D
            // are the same buffer with the same layout (cuBLASLt supports in-place); the workspace
            // is ours.
            let st = unsafe {
                sys::cublasLtMatmul(
                    self.handle,
                    p.desc,
                    &alpha as *const f32 as *const c_void,
                    a as *const c_void,
                    p.la,
                    b as *const c_void,
                    p.lb,
                    &beta as *const f32 as *const c_void,
                    d as *const c_void,
                    p.lc,
                    d as *mut c_void,
                    p.lc,
                    &p.algo,
                    ws as *mut c_void,
                    WORKSPACE_BYTES,
                    self.stream.cu_stream() as sys::cudaStream_t,
                )
            };
            match lt("cublasLtMatmul", st) {
                Ok(()) => {
                    p.confirmed = true;
                    return Ok(());
                }
                Err(_) if !p.confirmed && !p.fallbacks.is_empty() => {
                    p.algo = p.fallbacks.remove(0);
                    (p.splitk, p.reduction) = algo_config(&p.algo);
                }
                Err(e) => return Err(e.context(format!("GEMM {op:?} {ab:?}->{cd:?} (Linear m={m} k={k} n={n})"))),
            }
        }
    }

    /// Descriptors for `key` and the heuristic's best algorithm.
    fn plan(&self, key: &Key) -> Result<Plan> {
        let (cm, cn) = (key.m, key.n);
        let (a_rc, ta, b_rc, tb) = stored_layouts(key.op, cm, cn, key.k);
        let mut plan = Plan {
            desc: std::ptr::null_mut(),
            la: std::ptr::null_mut(),
            lb: std::ptr::null_mut(),
            lc: std::ptr::null_mut(),
            algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
            splitk: 1,
            reduction: 0,
            fallbacks: Vec::new(),
            confirmed: false,
        };
        // SAFETY: out-parameters and attribute buffers of the documented types and sizes; a
        // partially built plan is destroyed by Plan's Drop (null handles are skipped by cuBLASLt).
        unsafe {
            lt(
                "cublasLtMatmulDescCreate",
                sys::cublasLtMatmulDescCreate(
                    &mut plan.desc,
                    sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    sys::cudaDataType::CUDA_R_32F,
                ),
            )?;
            for (attr, t) in [
                (sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, ta),
                (sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, tb),
            ] {
                let v: i32 = t as i32; // cublasOperation_t: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1
                lt(
                    "cublasLtMatmulDescSetAttribute(TRANS)",
                    sys::cublasLtMatmulDescSetAttribute(
                        plan.desc,
                        attr,
                        &v as *const i32 as *const c_void,
                        std::mem::size_of::<i32>(),
                    ),
                )?;
            }
            let abt = key.ab.cuda();
            lt(
                "cublasLtMatrixLayoutCreate(A)",
                sys::cublasLtMatrixLayoutCreate(&mut plan.la, abt, a_rc.0, a_rc.1, a_rc.0 as i64),
            )?;
            lt(
                "cublasLtMatrixLayoutCreate(B)",
                sys::cublasLtMatrixLayoutCreate(&mut plan.lb, abt, b_rc.0, b_rc.1, b_rc.0 as i64),
            )?;
            lt(
                "cublasLtMatrixLayoutCreate(D)",
                sys::cublasLtMatrixLayoutCreate(&mut plan.lc, key.cd.cuda(), cm, cn, cm as i64),
            )?;

            let mut pref: sys::cublasLtMatmulPreference_t = std::ptr::null_mut();
            lt("cublasLtMatmulPreferenceCreate", sys::cublasLtMatmulPreferenceCreate(&mut pref))?;
            let res = self.heuristic(key, &mut plan, pref);
            let _ = sys::cublasLtMatmulPreferenceDestroy(pref);
            res?;
        }
        Ok(plan)
    }

    /// # Safety
    /// `plan`'s descriptors and `pref` must be valid.
    unsafe fn heuristic(&self, key: &Key, plan: &mut Plan, pref: sys::cublasLtMatmulPreference_t) -> Result<()> {
        use sys::cublasLtMatmulPreferenceAttributes_t as P;
        let ws: u64 = WORKSPACE_BYTES as u64;
        lt(
            "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)",
            sys::cublasLtMatmulPreferenceSetAttribute(
                pref,
                P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                8,
            ),
        )?;
        // Only no split-K (scheme 0 is never masked) or split-K reduced in fp32 in the workspace.
        let mask: u32 = sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE as u32;
        lt(
            "cublasLtMatmulPreferenceSetAttribute(REDUCTION_SCHEME_MASK)",
            sys::cublasLtMatmulPreferenceSetAttribute(
                pref,
                P::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                &mask as *const u32 as *const c_void,
                4,
            ),
        )?;
        for (attr, al) in [
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align[0]),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align[1]),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align[2]),
            (P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align[2]),
        ] {
            lt(
                "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT)",
                sys::cublasLtMatmulPreferenceSetAttribute(pref, attr, &al as *const u32 as *const c_void, 4),
            )?;
        }
        const WANT: usize = 8;
        let mut results: [sys::cublasLtMatmulHeuristicResult_t; WANT] = std::mem::zeroed();
        let mut count: i32 = 0;
        self.queries.fetch_add(1, Ordering::Relaxed);
        lt(
            "cublasLtMatmulAlgoGetHeuristic",
            sys::cublasLtMatmulAlgoGetHeuristic(
                self.handle,
                plan.desc,
                plan.la,
                plan.lb,
                plan.lc,
                plan.lc,
                pref,
                WANT as i32,
                results.as_mut_ptr(),
                &mut count,
            ),
        )?;
        // Results come best first.
        let mut usable = results[..(count.max(0) as usize).min(WANT)]
            .iter()
            .filter(|r| r.state == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS && r.workspaceSize <= WORKSPACE_BYTES)
            .map(|r| r.algo);
        let Some(best) = usable.next() else {
            bail!("cublasLtMatmulAlgoGetHeuristic returned no usable algorithm ({count} candidates)");
        };
        plan.algo = best;
        plan.fallbacks = usable.collect();
        (plan.splitk, plan.reduction) = algo_config(&plan.algo);
        Ok(())
    }
}

/// An algorithm's split-K count and reduction scheme (1 and 0 where cuBLASLt does not say).
fn algo_config(algo: &sys::cublasLtMatmulAlgo_t) -> (u32, u32) {
    let (mut splitk, mut reduction, mut written) = (1u32, 0u32, 0usize);
    // SAFETY: reads two u32 attributes of a valid algorithm into u32s.
    unsafe {
        let _ = sys::cublasLtMatmulAlgoConfigGetAttribute(
            algo,
            sys::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
            &mut splitk as *mut u32 as *mut c_void,
            4,
            &mut written,
        );
        let _ = sys::cublasLtMatmulAlgoConfigGetAttribute(
            algo,
            sys::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
            &mut reduction as *mut u32 as *mut c_void,
            4,
            &mut written,
        );
    }
    (splitk, reduction)
}

/// A and B as stored, column-major (rows, cols; ld = rows), and whether each is transposed, for
/// cuBLAS's (m, n, k) of `op` (D is m×n, ld m). Operands: Fwd A = w, B = x; Dx A = w, B = dy;
/// Dw A = x, B = dy.
fn stored_layouts(op: GemmOp, cm: u64, cn: u64, ck: u64) -> ((u64, u64), bool, (u64, u64), bool) {
    match op {
        // A = w stored k×n (op T gives n×k); B = x stored k×m
        GemmOp::Fwd => ((ck, cm), true, (ck, cn), false),
        // A = w stored k×n; B = dy stored n×m
        GemmOp::Dx => ((cm, ck), false, (ck, cn), false),
        // A = x stored k×m; B = dy stored n×m (op T gives m×n)
        GemmOp::Dw => ((cm, ck), false, (cn, ck), true),
    }
}

/// cuBLAS's column-major (m, n, k) for a Linear product with (tokens m, inputs k, outputs n):
///   Fwd: yᵀ[n, m] = w[n, k] (stored as wᵀ, op T) · xᵀ[k, m]
///   Dx:  dxᵀ[k, m] = wᵀ[k, n] · dyᵀ[n, m]
///   Dw:  dwᵀ[k, n] = xᵀ[k, m] · dy[m, n] (dy stored as dyᵀ, op T)
fn lt_dims(op: GemmOp, m: usize, k: usize, n: usize) -> (u64, u64, u64) {
    let (m, k, n) = (m as u64, k as u64, n as u64);
    match op {
        GemmOp::Fwd => (n, m, k),
        GemmOp::Dx => (k, m, n),
        GemmOp::Dw => (k, n, m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// cuBLAS's definition on host data: D (m×n, ld m) (+)= op(A)·op(B), A and B column-major as
    /// stored with ld = rows, where a transposed operand is stored (k×m / n×k) as cuBLAS requires.
    #[allow(clippy::too_many_arguments)]
    fn colmajor_gemm(op: GemmOp, cm: u64, cn: u64, ck: u64, a: &[f32], b: &[f32], d: &mut [f32], beta: f32) {
        let (a_rc, ta, b_rc, tb) = stored_layouts(op, cm, cn, ck);
        assert_eq!(a_rc, if ta { (ck, cm) } else { (cm, ck) }, "{op:?}: A's stored shape");
        assert_eq!(b_rc, if tb { (cn, ck) } else { (ck, cn) }, "{op:?}: B's stored shape");
        assert_eq!(a.len() as u64, a_rc.0 * a_rc.1);
        assert_eq!(b.len() as u64, b_rc.0 * b_rc.1);
        let (m, n, k, lda, ldb) = (cm as usize, cn as usize, ck as usize, a_rc.0 as usize, b_rc.0 as usize);
        for j in 0..n {
            for i in 0..m {
                let mut acc = 0.0f64;
                for p in 0..k {
                    let av = if ta { a[p + i * lda] } else { a[i + p * lda] };
                    let bv = if tb { b[j + p * ldb] } else { b[p + j * ldb] };
                    acc += av as f64 * bv as f64;
                }
                d[i + j * m] = beta * d[i + j * m] + acc as f32;
            }
        }
    }

    /// The transposition trick: the column-major products on the row-major buffers, in the
    /// operand order of the call sites, equal the row-major Linear products of crate::matmul.
    #[test]
    fn column_major_plans_compute_the_row_major_linear_products() {
        let (m, k, n) = (5, 7, 3);
        let f = |len: usize, s: usize| -> Vec<f32> { (0..len).map(|i| ((i * 7 + s * 13) % 11) as f32 - 5.0).collect() };
        let (x, w, dy) = (f(m * k, 1), f(n * k, 2), f(m * n, 3));
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(p, q)| (p - q).abs() < 1e-4);

        let (cm, cn, ck) = lt_dims(GemmOp::Fwd, m, k, n);
        let mut y = vec![0.0; m * n];
        colmajor_gemm(GemmOp::Fwd, cm, cn, ck, &w, &x, &mut y, 0.0);
        let mut r = vec![0.0; m * n];
        crate::matmul::linear_fwd(&mut r, &x, &w, m, k, n);
        assert!(close(&y, &r), "fwd {y:?} vs {r:?}");

        let (cm, cn, ck) = lt_dims(GemmOp::Dx, m, k, n);
        let mut dx = vec![1.0; m * k];
        colmajor_gemm(GemmOp::Dx, cm, cn, ck, &w, &dy, &mut dx, 1.0);
        let (mut rdx, mut rdw) = (vec![1.0; m * k], vec![2.0; n * k]);
        crate::matmul::linear_bwd(Some(&mut rdx), true, &mut rdw, true, &dy, &x, &w, m, k, n);
        assert!(close(&dx, &rdx), "dx {dx:?} vs {rdx:?}");

        let (cm, cn, ck) = lt_dims(GemmOp::Dw, m, k, n);
        let mut dw = vec![2.0; n * k];
        colmajor_gemm(GemmOp::Dw, cm, cn, ck, &x, &dy, &mut dw, 1.0);
        assert!(close(&dw, &rdw), "dw {dw:?} vs {rdw:?}");
    }

    #[test]
    fn alignment_of_device_pointers() {
        assert_eq!(align_of(0x7f00_0000_0000), 256);
        assert_eq!(align_of(0x7f00_0000_0150), 16);
        assert_eq!(align_of(0x7f00_0000_0002), 2);
    }
}
