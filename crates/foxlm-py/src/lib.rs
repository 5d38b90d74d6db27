//! `foxlm._foxlm`: the Rust half of the `foxlm` Python package.
//!
//! Two parts:
//! - Forgetting Attention forward and backward on raw buffers (the Python half, `foxlm/ops.py`,
//!   hands over `tensor.data_ptr()`, shapes, strides and PyTorch's current CUDA stream): CUDA
//!   launches on that stream and on the device's primary context, so nothing is copied and the
//!   kernels are ordered with PyTorch's own work; CPU calls on f32 host buffers.
//! - [`Model`]: a foxlm or authors' model folder, run on the CPU or a GPU through foxlm's engines.
//!
//! Every argument is checked here too (sizes, dtypes, heads, starts) and errors come back as
//! Python exceptions naming the argument; nothing panics across the boundary (PyO3 would turn a
//! panic into an exception, but none is expected: sizes are checked before any kernel runs).

use anyhow::{anyhow, bail, ensure, Context, Result};
use fox_kernels::attention as fa;
use fox_kernels::cuda::attention::{
    self as ga, AttnOptions, BwdOut, DType, DevProblem, DevView, DevVisibility, FwdKernel,
};
use fox_kernels::cuda::{Borrowed, Gpu};
use foxlm::generate::GenerateOptions;
use foxlm::infer::{self, Infer, Plan};
use foxlm::model::{Ctx, Model};
use foxlm::sampling::Sampling;
use foxlm::tokenizer::{TextFormat, Tokenizer, GPT2_VOCAB};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

fn value_err(e: anyhow::Error) -> PyErr {
    PyValueError::new_err(format!("{e:#}"))
}

fn runtime_err(e: anyhow::Error) -> PyErr {
    PyRuntimeError::new_err(format!("{e:#}"))
}

/// (b, h, h_kv, t, d): batch, query heads, key/value heads, sequence length, head dim.
type Shape = (usize, usize, usize, usize, usize);
/// A strided [B, heads, T, D] view: (device or host address, stride of b, of h, of t) in elements.
type ViewArg = (u64, usize, usize, usize);
/// Key starts: (1 = left padding, [B]; 2 = per row, [B·T]), address of int32 (CUDA) / int64 (CPU).
type StartsArg = Option<(u8, u64)>;
/// Key starts read from the host, range-checked: (mode as in [`StartsArg`], the starts).
type HostStarts = Option<(u8, Vec<usize>)>;

fn checked_shape(s: Shape) -> Result<()> {
    let (b, h, hkv, t, d) = s;
    ensure!(
        b > 0 && h > 0 && hkv > 0 && t > 0 && d > 0,
        "empty problem: batch {b}, heads {h}, kv heads {hkv}, length {t}, head dim {d}"
    );
    ensure!(
        h.is_multiple_of(hkv),
        "the {hkv} key/value heads must divide the {h} query heads (grouped-query attention)"
    );
    let n = b.checked_mul(t).and_then(|x| x.checked_mul(h)).and_then(|x| x.checked_mul(d));
    ensure!(n.is_some_and(|n| n < (1usize << 46)), "q is too large ({b} × {t} × {h} × {d})");
    ensure!(t < (i32::MAX as usize) / 2, "sequence length {t} does not fit the kernels' 32-bit indices");
    Ok(())
}

/// One past the last element a view reaches.
fn extent(name: &str, v: ViewArg, b: usize, heads: usize, t: usize, d: usize) -> Result<usize> {
    let (_, sb, sh, st) = v;
    let f = || -> Option<usize> {
        (b - 1)
            .checked_mul(sb)?
            .checked_add((heads - 1).checked_mul(sh)?)?
            .checked_add((t - 1).checked_mul(st)?)?
            .checked_add(d)
    };
    f().ok_or_else(|| anyhow!("{name}: strides ({sb}, {sh}, {st}) overflow"))
}

fn window_opt(window: Option<usize>) -> Result<Option<usize>> {
    if let Some(w) = window {
        ensure!(w >= 1 && w < i32::MAX as usize, "window must be at least 1 key (and fit 32 bits), got {w}");
    }
    Ok(window)
}

fn parse_dtype(dtype: &str) -> Result<DType> {
    match dtype {
        "bf16" => Ok(DType::Bf16),
        "f16" => Ok(DType::F16),
        other => bail!("q, k, v must be bfloat16 or float16 on the GPU, got {other}"),
    }
}

// ---------------------------------------------------------------------------------------------
// CUDA

/// One `Gpu` per (device, stream): the primary context with PyTorch's stream, its kernels loaded
/// once.
type GpuTable = HashMap<(usize, u64), Arc<Gpu>>;
static GPUS: Mutex<Option<GpuTable>> = Mutex::new(None);

fn gpu_for(device: usize, stream: u64) -> Result<Arc<Gpu>> {
    let mut g = GPUS.lock().map_err(|_| anyhow!("the GPU table was poisoned by an earlier failure"))?;
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(gpu) = map.get(&(device, stream)) {
        return Ok(gpu.clone());
    }
    if map.len() >= 64 {
        // Streams come and go (one per torch.cuda.Stream): keep the table small.
        map.clear();
    }
    // SAFETY: the stream is PyTorch's current stream of `device` (ops.py passes
    // torch.cuda.current_stream(device).cuda_stream), which PyTorch keeps alive; kernels only run
    // on it while the caller is inside a call that PyTorch ordered on that stream.
    let gpu = unsafe { Gpu::on_stream(device, stream as usize as fox_kernels::cuda::cudarc::driver::sys::CUstream) }
        .with_context(|| format!("opening cuda:{device} for PyTorch's stream"))?;
    map.insert((device, stream), gpu.clone());
    Ok(gpu)
}

/// # Safety
/// `ptr` is a live device buffer of at least `len` elements (a tensor of the shape ops.py checked).
unsafe fn dev<T>(gpu: &Gpu, name: &str, ptr: u64, len: usize) -> Result<Borrowed<T>> {
    ensure!(ptr != 0, "{name}: null device pointer");
    ensure!(ptr.is_multiple_of(16), "{name}: its data must be 16-byte aligned (a fresh or contiguous tensor)");
    // SAFETY: the caller's contract.
    Ok(unsafe { Borrowed::new(gpu, ptr, len) })
}

struct DevInputs {
    q: Borrowed<u16>,
    k: Borrowed<u16>,
    v: Borrowed<u16>,
    c: Borrowed<f32>,
    starts: Option<Borrowed<i32>>,
    prune: Option<Borrowed<f32>>,
}

/// # Safety
/// Every address is a live device buffer of the shape and strides given.
unsafe fn dev_inputs(
    gpu: &Gpu,
    shape: Shape,
    (q, k, v): (ViewArg, ViewArg, ViewArg),
    c: u64,
    starts: StartsArg,
    prune: Option<u64>,
) -> Result<DevInputs> {
    checked_shape(shape)?;
    let (b, h, hkv, t, d) = shape;
    ensure!(d == 64 || d == 128, "q: the GPU kernels take head dim 64 or 128, got {d}");
    for (name, vw) in [("q", q), ("k", k), ("v", v)] {
        ensure!(
            vw.1 % 8 == 0 && vw.2 % 8 == 0 && vw.3 % 8 == 0,
            "{name}: strides ({}, {}, {}) must be multiples of 8 elements with the last dimension contiguous",
            vw.1,
            vw.2,
            vw.3
        );
    }
    let (qn, kn, vn) = (extent("q", q, b, h, t, d)?, extent("k", k, b, hkv, t, d)?, extent("v", v, b, hkv, t, d)?);
    // SAFETY (all): the caller's contract; lengths are the views' extents.
    let starts = match starts {
        None => None,
        Some((1, p)) => Some(unsafe { dev::<i32>(gpu, "seq_start", p, b) }?),
        Some((2, p)) => Some(unsafe { dev::<i32>(gpu, "cu_seqlens (row starts)", p, b * t) }?),
        Some((m, _)) => bail!("internal: unknown starts mode {m}"),
    };
    Ok(DevInputs {
        q: unsafe { dev(gpu, "q", q.0, qn) }?,
        k: unsafe { dev(gpu, "k", k.0, kn) }?,
        v: unsafe { dev(gpu, "v", v.0, vn) }?,
        c: unsafe { dev(gpu, "c (gate prefix sums)", c, b * h * t) }?,
        starts,
        prune: match prune {
            Some(p) => Some(unsafe { dev(gpu, "acp thresholds", p, b * h) }?),
            None => None,
        },
    })
}

/// What both CUDA entry points check first: the dtype and window (ValueError), then the GPU of
/// PyTorch's stream (RuntimeError).
fn cuda_call(
    device: usize,
    stream: u64,
    dtype: &str,
    window: Option<usize>,
) -> PyResult<(DType, Option<usize>, Arc<Gpu>)> {
    let dt = parse_dtype(dtype).map_err(value_err)?;
    let window = window_opt(window).map_err(value_err)?;
    let gpu = gpu_for(device, stream).map_err(runtime_err)?;
    Ok((dt, window, gpu))
}

fn dev_vis(s: &Option<Borrowed<i32>>, mode: StartsArg) -> DevVisibility<'_> {
    match (s, mode) {
        (Some(s), Some((1, _))) => DevVisibility::LeftPadded(s),
        (Some(s), Some(_)) => DevVisibility::PerRow(s),
        _ => DevVisibility::All,
    }
}

fn dev_problem<'a>(
    shape: Shape,
    dtype: DType,
    views: (ViewArg, ViewArg, ViewArg),
    ins: &'a DevInputs,
    vis: DevVisibility<'a>,
    scale: f32,
) -> DevProblem<'a> {
    let (b, h, _, t, d) = shape;
    let view = |data: &'a Borrowed<u16>, a: ViewArg| DevView { data: &**data, off: 0, sb: a.1, sh: a.2, st: a.3 };
    DevProblem {
        batch: b,
        heads: h,
        head_dim: d,
        tq: t,
        tk: t,
        q_pos0: 0,
        dtype,
        q: view(&ins.q, views.0),
        k: view(&ins.k, views.1),
        v: view(&ins.v, views.2),
        cq: &ins.c,
        ck: &ins.c,
        vis,
        scale,
        prune: ins.prune.as_deref(),
    }
}

/// Forward on PyTorch's stream: c = prefix sums of log_fgate ([B, T, H] → [B, H, T]), then the
/// attention into `out` [B, T, H, D] and `lse` [B, H, T]; with `acp` = (log ε, thresholds
/// buffer [B, H]) the ACP thresholds first.
#[pyfunction]
#[pyo3(signature = (device, stream, dtype, shape, q, k, v, log_fgate, c, out, lse, starts, scale, window, acp))]
#[allow(clippy::too_many_arguments)]
fn cuda_forward(
    device: usize,
    stream: u64,
    dtype: &str,
    shape: Shape,
    q: ViewArg,
    k: ViewArg,
    v: ViewArg,
    log_fgate: u64,
    c: u64,
    out: u64,
    lse: u64,
    starts: StartsArg,
    scale: f32,
    window: Option<usize>,
    acp: Option<(f32, u64)>,
) -> PyResult<()> {
    let (dt, window, gpu) = cuda_call(device, stream, dtype, window)?;
    let run = || -> Result<()> {
        let (b, h, hkv, t, d) = shape;
        // SAFETY: ops.py passes live tensors of these shapes on this device.
        let mut ins = unsafe { dev_inputs(&gpu, shape, (q, k, v), c, starts, acp.map(|a| a.1)) }?;
        let g = unsafe { dev::<f32>(&gpu, "log_fgate", log_fgate, b * t * h) }?;
        let o = unsafe { dev::<u16>(&gpu, "out", out, b * t * h * d) }?;
        let mut l = unsafe { dev::<f32>(&gpu, "lse", lse, b * h * t) }?;
        let opts = AttnOptions { kv_heads: Some(hkv), window };
        {
            let vis = dev_vis(&ins.starts, starts);
            ga::fgate_prefix_sum_fwd(&gpu, &g, &mut ins.c, vis, b, t, h)?;
        }
        if let Some((log_eps, _)) = acp {
            let mut th = ins.prune.take().ok_or_else(|| anyhow!("internal: no ACP buffer"))?;
            {
                let p = dev_problem(shape, dt, (q, k, v), &ins, dev_vis(&ins.starts, starts), scale);
                ga::acp_thresholds_from_norms(&gpu, &p, opts, t, log_eps, &mut th)?;
            }
            ins.prune = Some(th);
        }
        let p = dev_problem(shape, dt, (q, k, v), &ins, dev_vis(&ins.starts, starts), scale);
        ga::forward(&gpu, &p, opts, &*o, &mut l, FwdKernel::Auto, false)?;
        Ok(())
    };
    run().map_err(runtime_err)
}

/// Backward on PyTorch's stream: dq [B, T, H, D], dk, dv [B, T, H_kv, D], then d log_fgate
/// [B, T, H] from dcq + dck. `dout` must be contiguous [B, T, H, D]; `dcq`, `dck`, `delta` are
/// f32 scratch [B, H, T].
#[pyfunction]
#[pyo3(signature = (device, stream, dtype, shape, q, k, v, c, starts, scale, window, prune, out, dout, lse, dq, dk, dv, dcq, dck, delta, dlog_fgate))]
#[allow(clippy::too_many_arguments)]
fn cuda_backward(
    device: usize,
    stream: u64,
    dtype: &str,
    shape: Shape,
    q: ViewArg,
    k: ViewArg,
    v: ViewArg,
    c: u64,
    starts: StartsArg,
    scale: f32,
    window: Option<usize>,
    prune: Option<u64>,
    out: u64,
    dout: u64,
    lse: u64,
    dq: u64,
    dk: u64,
    dv: u64,
    dcq: u64,
    dck: u64,
    delta: u64,
    dlog_fgate: u64,
) -> PyResult<()> {
    let (dt, window, gpu) = cuda_call(device, stream, dtype, window)?;
    let run = || -> Result<()> {
        let (b, h, hkv, t, d) = shape;
        // SAFETY: ops.py passes live tensors of these shapes on this device.
        let ins = unsafe { dev_inputs(&gpu, shape, (q, k, v), c, starts, prune) }?;
        let (n, nkv, nbh) = (b * t * h * d, b * t * hkv * d, b * h * t);
        let o = unsafe { dev::<u16>(&gpu, "out", out, n) }?;
        let go = unsafe { dev::<u16>(&gpu, "grad of out", dout, n) }?;
        let l = unsafe { dev::<f32>(&gpu, "lse", lse, nbh) }?;
        let gq = unsafe { dev::<u16>(&gpu, "dq", dq, n) }?;
        let gk = unsafe { dev::<u16>(&gpu, "dk", dk, nkv) }?;
        let gv = unsafe { dev::<u16>(&gpu, "dv", dv, nkv) }?;
        let gcq = unsafe { dev::<f32>(&gpu, "dcq", dcq, nbh) }?;
        let gck = unsafe { dev::<f32>(&gpu, "dck", dck, nbh) }?;
        let dl = unsafe { dev::<f32>(&gpu, "delta", delta, nbh) }?;
        let mut gg = unsafe { dev::<f32>(&gpu, "dlog_fgate", dlog_fgate, b * t * h) }?;
        let opts = AttnOptions { kv_heads: Some(hkv), window };
        let p = dev_problem(shape, dt, (q, k, v), &ins, dev_vis(&ins.starts, starts), scale);
        let bo = BwdOut { dq: &*gq, dk: &*gk, dv: &*gv, dcq: &gcq, dck: &gck, delta: &dl };
        ga::backward_into(&gpu, &p, opts, &*o, &*go, &l, bo)?;
        ga::fgate_prefix_sum_bwd(&gpu, &gcq, Some(&gck), &mut gg, dev_vis(&ins.starts, starts), b, t, h)?;
        Ok(())
    };
    run().map_err(runtime_err)
}

/// Whether a usable GPU is there, or why not (the message `foxlm.cuda_status()` prints).
#[pyfunction]
fn cuda_status() -> (bool, String) {
    match fox_kernels::cuda::probe() {
        Ok(n) => (true, format!("{n} CUDA device(s)")),
        Err(e) => (false, format!("{e:#}")),
    }
}

// ---------------------------------------------------------------------------------------------
// CPU

/// # Safety
/// `ptr` is a live, 4-byte-aligned host buffer of at least `n` f32 (a contiguous float32 array).
unsafe fn host<'a>(name: &str, ptr: u64, n: usize) -> Result<&'a [f32]> {
    ensure!(ptr != 0 && ptr.is_multiple_of(4), "{name}: null or misaligned float32 buffer");
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr as usize as *const f32, n) })
}

/// # Safety
/// As [`host`], writable and not aliased by any other argument.
unsafe fn host_mut<'a>(name: &str, ptr: u64, n: usize) -> Result<&'a mut [f32]> {
    ensure!(ptr != 0 && ptr.is_multiple_of(4), "{name}: null or misaligned float32 buffer");
    // SAFETY: the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr as usize as *mut f32, n) })
}

/// Key starts from an int64 host array, range-checked: left padding `0 ≤ s ≤ T` per batch row;
/// per-row starts `0 ≤ s ≤ r` and non-decreasing along each row.
fn host_starts(starts: StartsArg, b: usize, t: usize) -> Result<HostStarts> {
    let Some((mode, ptr)) = starts else { return Ok(None) };
    let n = if mode == 1 { b } else { b * t };
    ensure!(ptr != 0 && ptr.is_multiple_of(8), "starts: null or misaligned int64 buffer");
    // SAFETY: ops.py passes a contiguous int64 array of n entries.
    let s = unsafe { std::slice::from_raw_parts(ptr as usize as *const i64, n) };
    let mut out = Vec::with_capacity(n);
    for (i, &x) in s.iter().enumerate() {
        if mode == 1 {
            ensure!(x >= 0 && (x as usize) <= t, "seq_start[{i}] = {x} is outside 0..={t}");
        } else {
            let r = i % t;
            ensure!(
                x >= 0 && (x as usize) <= r,
                "row start of position {r} (batch row {}) is {x}: outside 0..={r}",
                i / t
            );
            if r > 0 {
                ensure!(x >= s[i - 1], "row starts of batch row {} decrease at position {r}", i / t);
            }
        }
        out.push(x as usize);
    }
    Ok(Some((mode, out)))
}

/// The per-row starts of a left-padded batch: the one kind of starts the gate's prefix sums take
/// (per-position starts reach only the attention).
fn left_padded(s: &HostStarts) -> Option<&[usize]> {
    match s {
        Some((1, v)) => Some(v),
        _ => None,
    }
}

/// What both CPU entry points check first (ValueError): the shape, the window and the starts.
fn host_call(shape: Shape, window: Option<usize>, starts: StartsArg) -> PyResult<(Option<usize>, HostStarts)> {
    checked_shape(shape).map_err(value_err)?;
    let window = window_opt(window).map_err(value_err)?;
    let (b, _, _, t, _) = shape;
    Ok((window, host_starts(starts, b, t).map_err(value_err)?))
}

/// # Safety
/// q, k, v are live contiguous float32 host buffers of `shape` ([B, T, H, D], [B, T, H_kv, D]).
unsafe fn host_qkv<'a>(shape: Shape, q: u64, k: u64, v: u64) -> Result<(&'a [f32], &'a [f32], &'a [f32])> {
    let (b, h, hkv, t, d) = shape;
    let (n, nkv) = (b * t * h * d, b * t * hkv * d);
    // SAFETY: the caller's contract.
    unsafe { Ok((host("q", q, n)?, host("k", k, nkv)?, host("v", v, nkv)?)) }
}

fn host_vis(s: &HostStarts) -> fa::Visibility<'_> {
    match s {
        None => fa::Visibility::All,
        Some((1, v)) => fa::Visibility::LeftPadded(v),
        Some((_, v)) => fa::Visibility::PerRow(v),
    }
}

fn host_problem<'a>(
    shape: Shape,
    (q, k, v): (&'a [f32], &'a [f32], &'a [f32]),
    c: &'a [f32],
    vis: fa::Visibility<'a>,
    scale: f32,
    window: Option<usize>,
    prune: Option<&'a [f32]>,
) -> fa::Problem<'a> {
    let (b, h, hkv, t, d) = shape;
    fa::Problem {
        batch: b,
        heads: h,
        kv_heads: hkv,
        window,
        head_dim: d,
        tq: t,
        tk: t,
        q_pos0: 0,
        q: fa::View::bthd(q, t, h, d),
        k: fa::View::bthd(k, t, hkv, d),
        v: fa::View::bthd(v, t, hkv, d),
        cq: c,
        ck: c,
        vis,
        scale,
        prune,
    }
}

/// CPU forward on contiguous float32 host buffers: q [B, T, H, D], k, v [B, T, H_kv, D],
/// log_fgate [B, T, H]; writes c [B, H, T], out [B, T, H, D], lse [B, H, T] and, with `acp` =
/// (log ε, address), the ACP thresholds [B, H].
#[pyfunction]
#[pyo3(signature = (shape, q, k, v, log_fgate, starts, scale, window, acp, c, out, lse))]
#[allow(clippy::too_many_arguments)]
fn cpu_forward(
    py: Python<'_>,
    shape: Shape,
    q: u64,
    k: u64,
    v: u64,
    log_fgate: u64,
    starts: StartsArg,
    scale: f32,
    window: Option<usize>,
    acp: Option<(f32, u64)>,
    c: u64,
    out: u64,
    lse: u64,
) -> PyResult<()> {
    let (window, st) = host_call(shape, window, starts)?;
    let (b, h, _, t, d) = shape;
    let run = || -> Result<()> {
        let n = b * t * h * d;
        // SAFETY: ops.py passes contiguous float32 arrays of these sizes; outputs are fresh.
        let qkv = unsafe { host_qkv(shape, q, k, v) }?;
        let g = unsafe { host("log_fgate", log_fgate, b * t * h) }?;
        let cs = unsafe { host_mut("c", c, b * h * t) }?;
        fox_kernels::fgate::prefix_sum_fwd(cs, g, left_padded(&st), t, h);
        let cs: &[f32] = cs;
        let th = match acp {
            Some((log_eps, p)) => {
                let p0 = host_problem(shape, qkv, cs, host_vis(&st), scale, window, None);
                let th = fa::prune_thresholds(&fa::logit_bound_from_norms(&p0), t, log_eps);
                let dst = unsafe { host_mut("acp thresholds", p, b * h) }?;
                dst.copy_from_slice(&th);
                Some(th)
            }
            None => None,
        };
        let p = host_problem(shape, qkv, cs, host_vis(&st), scale, window, th.as_deref());
        let o = unsafe { host_mut("out", out, n) }?;
        let l = unsafe { host_mut("lse", lse, b * h * t) }?;
        fa::forward_into(&p, o, l);
        Ok(())
    };
    py.detach(run).map_err(runtime_err)
}

/// CPU backward: dq, dk, dv and d log_fgate [B, T, H] from the forward's c, out, lse and the
/// output's gradient (all contiguous float32).
#[pyfunction]
#[pyo3(signature = (shape, q, k, v, c, starts, scale, window, prune, out, dout, lse, dq, dk, dv, dlog_fgate))]
#[allow(clippy::too_many_arguments)]
fn cpu_backward(
    py: Python<'_>,
    shape: Shape,
    q: u64,
    k: u64,
    v: u64,
    c: u64,
    starts: StartsArg,
    scale: f32,
    window: Option<usize>,
    prune: Option<u64>,
    out: u64,
    dout: u64,
    lse: u64,
    dq: u64,
    dk: u64,
    dv: u64,
    dlog_fgate: u64,
) -> PyResult<()> {
    let (window, st) = host_call(shape, window, starts)?;
    let (b, h, hkv, t, d) = shape;
    let run = || -> Result<()> {
        let (n, nkv, nbh) = (b * t * h * d, b * t * hkv * d, b * h * t);
        // SAFETY: ops.py passes contiguous float32 arrays of these sizes; outputs are fresh.
        let qkv = unsafe { host_qkv(shape, q, k, v) }?;
        let cs = unsafe { host("c", c, nbh) }?;
        let th = match prune {
            Some(p) => Some(unsafe { host("acp thresholds", p, b * h) }?),
            None => None,
        };
        let p = host_problem(shape, qkv, cs, host_vis(&st), scale, window, th);
        let (o, go, l) = unsafe { (host("out", out, n)?, host("grad of out", dout, n)?, host("lse", lse, nbh)?) };
        let (gq, gk, gv) = unsafe { (host_mut("dq", dq, n)?, host_mut("dk", dk, nkv)?, host_mut("dv", dv, nkv)?) };
        let (mut dcq, mut dck) = (vec![0.0f32; nbh], vec![0.0f32; nbh]);
        fa::backward_into(&p, o, go, l, fa::GradsMut { dq: gq, dk: gk, dv: gv, dcq: &mut dcq, dck: &mut dck });
        for (a, b2) in dcq.iter_mut().zip(&dck) {
            *a += b2;
        }
        let gg = unsafe { host_mut("dlog_fgate", dlog_fgate, b * t * h) }?;
        fox_kernels::fgate::prefix_sum_bwd(gg, &dcq, left_padded(&st), t, h);
        Ok(())
    };
    py.detach(run).map_err(runtime_err)
}

// ---------------------------------------------------------------------------------------------
// Models

/// A model folder opened on a device. `foxlm/model.py` wraps it with NumPy / torch conversions.
#[pyclass(unsendable, name = "Model", module = "foxlm._foxlm")]
struct PyModel {
    // Field order matters: `engine` borrows `*model` and is dropped first.
    engine: Box<dyn Infer + 'static>,
    model: Box<Model>,
    device: String,
    chunk: usize,
}

fn u32_ids(ids: &[i64], vocab: usize, what: &str) -> Result<Vec<u32>> {
    ids.iter()
        .enumerate()
        .map(|(i, &x)| {
            ensure!(
                x >= 0 && (x as usize) < vocab,
                "{what}[{i}] = {x} is not a token id of this model (vocabulary {vocab})"
            );
            Ok(x as u32)
        })
        .collect()
}

fn le_i64(bytes: &[u8], what: &str) -> Result<Vec<i64>> {
    ensure!(bytes.len().is_multiple_of(8), "{what}: {} bytes is not a whole number of int64", bytes.len());
    Ok(bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
}

#[pymethods]
impl PyModel {
    /// Opens `path` (config.json + safetensors: a foxlm checkpoint or the authors' layout) on
    /// `device` ("cpu", "cuda", "cuda:N" or "auto") in `dtype` ("bf16" or "f32"; default: bf16
    /// on a GPU, f32 on the CPU). `max_batch` × `chunk` sizes the GPU engine's buffers.
    #[new]
    #[pyo3(signature = (path, device = "cpu", dtype = None, max_batch = 8, chunk = 2048))]
    fn new(path: &str, device: &str, dtype: Option<&str>, max_batch: usize, chunk: usize) -> PyResult<Self> {
        let arg: foxlm::backend::DeviceArg =
            device.parse().map_err(|e: anyhow::Error| value_err(e.context("device")))?;
        let dtype = match dtype {
            None => None,
            Some("bf16") => Some(foxlm::backend::Dtype::Bf16),
            Some("f32") => Some(foxlm::backend::Dtype::F32),
            Some(o) => return Err(PyValueError::new_err(format!("dtype must be \"bf16\" or \"f32\", got {o:?}"))),
        };
        if max_batch == 0 || chunk == 0 {
            return Err(PyValueError::new_err("max_batch and chunk must be at least 1"));
        }
        let model = foxlm::checkpoint::load_model(std::path::Path::new(path))
            .with_context(|| format!("loading the model folder {path}"))
            .map_err(value_err)?;
        let model = Box::new(model);
        let dev = foxlm::backend::select_device(arg).map_err(runtime_err)?;
        // SAFETY: the engine borrows the boxed model, which never moves (it stays in its box)
        // and outlives the engine (the struct drops `engine` before `model`).
        let mref: &'static Model = unsafe { &*(model.as_ref() as *const Model) };
        let engine = infer::open(mref, &dev, dtype, Plan { batch: max_batch, chunk }).map_err(runtime_err)?;
        Ok(Self { device: engine.describe(), engine, model, chunk })
    }

    /// The device the model runs on, in words.
    #[getter]
    fn device(&self) -> String {
        self.device.clone()
    }

    #[getter]
    fn vocab_size(&self) -> usize {
        self.model.config.vocab_size
    }

    /// The model's config.json as foxlm reads it (JSON text).
    fn config_json(&self) -> PyResult<String> {
        Ok(self.model.config.to_json())
    }

    /// Logits [B, T, V] as little-endian float32 bytes, for `ids` (int64 bytes, [B, T]) with
    /// optional left padding (`start[b]` padded positions at the front of row b).
    #[pyo3(signature = (ids, batch, seq, start = None))]
    fn logits<'py>(
        &mut self,
        py: Python<'py>,
        ids: &[u8],
        batch: usize,
        seq: usize,
        start: Option<Vec<usize>>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let v = self.model.config.vocab_size;
        let ids = le_i64(ids, "tokens").and_then(|x| u32_ids(&x, v, "tokens")).map_err(value_err)?;
        let check = || -> Result<()> {
            ensure!(batch >= 1 && seq >= 1, "tokens: need at least one row of one token");
            ensure!(ids.len() == batch * seq, "tokens: {} ids for a [{batch}, {seq}] batch", ids.len());
            if let Some(s) = &start {
                ensure!(s.len() == batch, "start: {} entries for {batch} rows", s.len());
                ensure!(s.iter().all(|&x| x < seq), "start: every row needs at least one real token (start < {seq})");
            }
            Ok(())
        };
        check().map_err(value_err)?;
        let ctx = Ctx { batch, seq, start: start.filter(|s| s.iter().any(|&x| x > 0)) };
        let out = self.engine.logits(&ids, &ctx).map_err(runtime_err)?;
        let bytes: Vec<u8> = out.iter().flat_map(|x| x.to_le_bytes()).collect();
        Ok(PyBytes::new(py, &bytes))
    }

    /// Next-token losses (nats, float64 bytes) [B, T - 1] of `ids` (int64 bytes, [B, T]).
    fn token_losses<'py>(
        &mut self,
        py: Python<'py>,
        ids: &[u8],
        batch: usize,
        seq: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let v = self.model.config.vocab_size;
        let ids = le_i64(ids, "tokens").and_then(|x| u32_ids(&x, v, "tokens")).map_err(value_err)?;
        if batch == 0 || seq < 2 || ids.len() != batch * seq {
            return Err(PyValueError::new_err(format!(
                "tokens: need [B, T] with B ≥ 1 and T ≥ 2 (one prediction), got {} ids for [{batch}, {seq}]",
                ids.len()
            )));
        }
        let seqs: Vec<Vec<u32>> = ids.chunks(seq).map(|r| r.to_vec()).collect();
        let l = self.engine.token_losses(&seqs, self.chunk, &mut |_| {}).map_err(runtime_err)?;
        let bytes: Vec<u8> = l.iter().flatten().flat_map(|x| x.to_le_bytes()).collect();
        Ok(PyBytes::new(py, &bytes))
    }

    /// New tokens after each prompt (prompts of any lengths are left-padded into one batch).
    #[pyo3(signature = (prompts, max_new_tokens, temperature = 0.0, top_k = 0, top_p = 1.0, seed = 0, eos = None))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &mut self,
        prompts: Vec<Vec<i64>>,
        max_new_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        seed: u64,
        eos: Option<i64>,
    ) -> PyResult<Vec<Vec<u32>>> {
        let v = self.model.config.vocab_size;
        let check = || -> Result<(Vec<Vec<u32>>, Option<u32>)> {
            ensure!(!prompts.is_empty(), "prompts: give at least one prompt");
            let ps = prompts
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    ensure!(!p.is_empty(), "prompts[{i}] is empty");
                    u32_ids(p, v, &format!("prompts[{i}]"))
                })
                .collect::<Result<Vec<_>>>()?;
            ensure!(temperature >= 0.0 && temperature.is_finite(), "temperature must be ≥ 0, got {temperature}");
            ensure!(top_p > 0.0 && top_p <= 1.0, "top_p must be in (0, 1], got {top_p}");
            let eos = match eos {
                Some(e) => Some(u32_ids(&[e], v, "eos")?[0]),
                None => None,
            };
            Ok((ps, eos))
        };
        let (ps, eos) = check().map_err(value_err)?;
        let opts = GenerateOptions { max_new_tokens, sampling: Sampling { temperature, top_k, top_p }, seed, eos };
        self.engine.generate(&ps, &opts, &mut |_, _| {}).map_err(runtime_err)
    }

    /// GPT-2 BPE token ids of `text` (JSON-escaped first unless `plain`, as the released models
    /// were trained), with the BOS token first when `add_bos`.
    #[pyo3(signature = (text, add_bos = true, plain = false))]
    fn encode(&self, text: &str, add_bos: bool, plain: bool) -> PyResult<Vec<u32>> {
        Ok(self.tokenizer(plain)?.encode(text, add_bos))
    }

    /// Text of GPT-2 token ids (JSON-unescaped unless `plain`).
    #[pyo3(signature = (ids, plain = false))]
    fn decode(&self, ids: Vec<i64>, plain: bool) -> PyResult<String> {
        let ids = u32_ids(&ids, self.model.config.vocab_size, "ids").map_err(value_err)?;
        Ok(self.tokenizer(plain)?.decode(&ids))
    }
}

impl PyModel {
    fn tokenizer(&self, plain: bool) -> PyResult<Tokenizer> {
        let v = self.model.config.vocab_size;
        if v != GPT2_VOCAB {
            return Err(PyValueError::new_err(format!(
                "this model's vocabulary has {v} tokens, not GPT-2's {GPT2_VOCAB}: it has no text tokenizer; pass token ids"
            )));
        }
        Tokenizer::gpt2(if plain { TextFormat::Plain } else { TextFormat::JsonEscaped }).map_err(runtime_err)
    }
}

#[pymodule]
#[pyo3(name = "_foxlm")]
fn foxlm_ext(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(cuda_forward, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_backward, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_status, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_forward, m)?)?;
    m.add_function(wrap_pyfunction!(cpu_backward, m)?)?;
    m.add_class::<PyModel>()?;
    Ok(())
}
