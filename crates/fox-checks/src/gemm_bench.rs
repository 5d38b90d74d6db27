//! The cuBLASLt GEMMs' benchmark (`fox-attn bench-gemm`): the Linear layers' products of a FoX (Pro)
//! model through [`fox_kernels::cuda::gemm::Gemm`], bf16 with fp32 accumulation, in TFLOP/s.

use anyhow::{anyhow, bail, Result};
use cudarc::driver::CudaSlice;
use fox_kernels::cuda::gemm::{Gemm, GemmOp};
use fox_kernels::cuda::Gpu;
use std::sync::Arc;

/// One GEMM to time: a Linear's product with m tokens, k inputs, n outputs.
#[derive(Clone, Debug)]
pub struct BenchShape {
    pub name: String,
    pub op: GemmOp,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    /// f32 output (the output head's and forget gate's logits) instead of bf16; Dw is always f32
    pub out_f32: bool,
}

impl BenchShape {
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.k as f64 * self.n as f64
    }
}

/// The Linear layers of a FoX (Pro) model with hidden size `d`, `heads` heads, MLP width
/// `intermediate`, vocabulary `vocab`, over `tokens` tokens: forward, dx and dw of each.
pub fn model_shapes(d: usize, heads: usize, intermediate: usize, vocab: usize, tokens: usize) -> Vec<BenchShape> {
    let mut v = Vec::new();
    for (name, k, n, f32_out) in [
        ("q/k/v/o/ogate d->d", d, d, false),
        ("fgate d->H", d, heads, true),
        ("mlp gate_up d->2I", d, 2 * intermediate, false),
        ("mlp down I->d", intermediate, d, false),
        ("head d->V", d, vocab, true),
    ] {
        for op in [GemmOp::Fwd, GemmOp::Dx, GemmOp::Dw] {
            v.push(BenchShape {
                name: format!("{name} ({d}x{n})"),
                op,
                m: tokens,
                k,
                n,
                out_f32: f32_out && op == GemmOp::Fwd,
            });
        }
    }
    v
}

/// Pseudo-random bf16 values in [−1, 1) (an LCG per 1 Mi chunk, filled in parallel: timing
/// needs realistic bits, not quality, and the head's operands have 1.6 G elements).
fn fill_bf16(n: usize, seed: u64) -> Vec<half::bf16> {
    use rayon::prelude::*;
    let mut v = vec![half::bf16::ZERO; n];
    v.par_chunks_mut(1 << 20).enumerate().for_each(|(c, chunk)| {
        let mut s = (seed ^ (c as u64).wrapping_mul(0x9e3779b97f4a7c15)).wrapping_add(1442695040888963407);
        for x in chunk {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            *x = half::bf16::from_f32(((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0);
        }
    });
    v
}

/// Time each shape in bf16 (fp32 accumulate): 3 untimed runs, then the median of 20 runs, each
/// between two CUDA events. Returns (shape, TFLOP/s) in order.
pub fn bench(gpu: &Arc<Gpu>, shapes: &[BenchShape]) -> Result<Vec<(BenchShape, f64)>> {
    bench_with(gpu, shapes, 3, 20)
}

/// [`bench`] with the number of warm-up and timed runs.
pub fn bench_with(
    gpu: &Arc<Gpu>,
    shapes: &[BenchShape],
    warmup: usize,
    iters: usize,
) -> Result<Vec<(BenchShape, f64)>> {
    let g = Gemm::new(gpu)?;
    let mut out = Vec::new();
    for (i, s) in shapes.iter().enumerate() {
        let (m, k, n) = (s.m, s.k, s.n);
        let seed = 3 * i as u64;
        // Only the operands the op reads: Fwd x[m,k], w[n,k]; Dx dy[m,n], w; Dw dy, x.
        let w = if s.op != GemmOp::Dw { Some(gpu.upload(&fill_bf16(n * k, seed))?) } else { None };
        let x = if s.op != GemmOp::Dx { Some(gpu.upload(&fill_bf16(m * k, seed + 1))?) } else { None };
        let dy = if s.op != GemmOp::Fwd { Some(gpu.upload(&fill_bf16(m * n, seed + 2))?) } else { None };
        let mut y16: Option<CudaSlice<half::bf16>> = None;
        let mut y32: Option<CudaSlice<f32>> = None;
        match (s.op, s.out_f32) {
            (GemmOp::Fwd, false) => y16 = Some(gpu.zeros(m * n)?),
            (GemmOp::Fwd, true) => y32 = Some(gpu.zeros(m * n)?),
            (GemmOp::Dx, _) => y16 = Some(gpu.zeros(m * k)?),
            (GemmOp::Dw, _) => y32 = Some(gpu.zeros(n * k)?),
        }
        let mut run = || -> Result<()> {
            match (s.op, y16.as_mut(), y32.as_mut(), x.as_ref(), w.as_ref(), dy.as_ref()) {
                (GemmOp::Fwd, Some(y), _, Some(x), Some(w), _) => g.linear_fwd(y, false, x, w, m, k, n),
                (GemmOp::Fwd, _, Some(y), Some(x), Some(w), _) => g.linear_fwd(y, false, x, w, m, k, n),
                (GemmOp::Dx, Some(y), _, _, Some(w), Some(dy)) => g.linear_bwd_dx(y, false, dy, w, m, k, n),
                (GemmOp::Dw, _, Some(y), Some(x), _, Some(dy)) => g.linear_bwd_dw(y, dy, x, m, k, n),
                _ => bail!("bench: missing buffers for {:?}", s.op),
            }
        };
        for _ in 0..warmup {
            run()?;
        }
        gpu.sync()?;
        let ctx = gpu.context();
        let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let ev = |e: cudarc::driver::DriverError| anyhow!("CUDA event: {e:?}");
        let mut ms = Vec::with_capacity(iters.max(1));
        for _ in 0..iters.max(1) {
            let e0 = ctx.new_event(flags).map_err(ev)?;
            let e1 = ctx.new_event(flags).map_err(ev)?;
            e0.record(gpu.stream()).map_err(ev)?;
            run()?;
            e1.record(gpu.stream()).map_err(ev)?;
            ms.push(e0.elapsed_ms(&e1).map_err(ev)? as f64);
        }
        gpu.sync()?;
        ms.sort_by(|a, b| a.total_cmp(b));
        let med = ms[ms.len() / 2];
        out.push((s.clone(), s.flops() / (med * 1e-3) / 1e12));
    }
    Ok(out)
}

/// The bench's results as a table.
pub fn format_bench(rows: &[(BenchShape, f64)]) -> String {
    let mut s =
        format!("| {:<34} | {:<3} | {:>6} | {:>6} | {:>6} | {:>8} |\n", "linear", "op", "m", "k", "n", "TFLOP/s");
    s += &format!(
        "|{}|{}|{}|{}|{}|{}|\n",
        "-".repeat(36),
        "-".repeat(5),
        "-".repeat(8),
        "-".repeat(8),
        "-".repeat(8),
        "-".repeat(10)
    );
    for (b, t) in rows {
        let op = match b.op {
            GemmOp::Fwd => "fwd",
            GemmOp::Dx => "dx",
            GemmOp::Dw => "dw",
        };
        s += &format!("| {:<34} | {:<3} | {:>6} | {:>6} | {:>6} | {:>8.1} |\n", b.name, op, b.m, b.k, b.n, t);
    }
    s
}
