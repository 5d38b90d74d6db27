//! Mamba-2's SSD on tensor cores (kernels/ssd_tc.cu), the GPU SSD's faster kernels: the same
//! contract as [`super::ssd::ssd_fwd`] / [`super::ssd::ssd_bwd`] (and the CPU [`crate::ssd`]),
//! inputs and outputs of element type T (f32 or bf16), dt, A, D, states and parameter gradients
//! f32. The products run as bf16 `mma.sync` with f32 accumulation (f32 inputs are rounded to
//! bf16 on their way into the tensor cores, so `T = f32` has bf16-level error, not f32's); the
//! states passed between chunks are stored as bf16. Deterministic: no atomics, fixed-order sums.
//! Each function launches on `gpu.stream()` without waiting and returns an error (never panics)
//! when a buffer is shorter than the shapes say or a size overflows the kernels' 32-bit indices.
//!
//! Shapes: head dim P = 64 and state N = 64 or 128 ([`supported`]). [`super::ssd::ssd_fwd`] and
//! [`super::ssd::ssd_bwd`] run these kernels for bf16 activations of those shapes (see
//! [`super::ssd::uses_tensor_cores`]) and their CUDA-core kernels otherwise.
//!
//! Forward: the state walk (one block per (b, h, 32 state columns), chunks in order, the state in
//! registers, loads four chunks deep) then the chunk outputs (one block per (b, chunk, heads of a
//! group), C Bᵀ once per block). Backward: the reverse walk for the state gradients, the chunk
//! backward (one block per (b, chunk, heads of a group), dB and dC summed over the block's heads
//! in registers), then ordered reductions of dB/dC over head blocks and of dA/dD over chunks.

use super::compile::SSD_TC;
use super::kargs::{self, args, by_value, int, kname, need, need_opt, opt_ptr, ptr};
use super::{Elem, Gpu};
use anyhow::{ensure, Result};
use cudarc::driver::{CudaSlice, DeviceRepr};

/// Chunk length.
const L: usize = 64;
/// The head dim the kernels take.
const P: usize = 64;
/// Warps per block of the chunk outputs (8 measured faster than 4: docs/kernel-notes.md).
const OUT_WARPS: usize = 8;
/// Heads per block of the chunk backward at most.
const BWD_HEADS: usize = 32;

pub use super::ssd::{DevSsd, DevSsdGrads};

/// The kernels' parameter block (TcParams in kernels/ssd_tc.cu, field for field).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Params {
    xbc: u64,
    dt: u64,
    a: u64,
    d: u64,
    start: u64,
    init: u64,
    fin: u64,
    dfinal: u64,
    dinit: u64,
    states: u64,
    dstates: u64,
    y: u64,
    dy: u64,
    dxbc: u64,
    ddt: u64,
    part_bc: u64,
    part_ad: u64,
    da: u64,
    dd: u64,
    stride: i64,
    b: i32,
    t: i32,
    h: i32,
    p: i32,
    n: i32,
    g: i32,
    nch: i32,
    hb: i32,
    vec: i32,
}

// SAFETY: plain data in the kernel's C struct layout (8-byte fields, then 4-byte ones).
unsafe impl DeviceRepr for Params {}

/// Whether the tensor-core kernels take this shape: P = 64, N = 64 or 128.
pub fn supported<T: Elem>(p: &DevSsd<T>) -> bool {
    p.head_dim == P && (p.state == 64 || p.state == 128)
}

fn chunks(seq: usize) -> usize {
    seq.div_ceil(L)
}

/// f32 words of bf16 states [B, H, nch, P, N] (rounded up to 16 bytes).
fn states_words(batch: usize, seq: usize, heads: usize, state: usize) -> usize {
    (batch * heads * chunks(seq) * P * state).div_ceil(8) * 4
}

/// Heads per block: the largest divisor of the group's H / G heads that is at most `cap`.
fn heads_per_block(heads: usize, groups: usize, cap: usize) -> usize {
    let hpg = heads / groups;
    (1..=cap.min(hpg)).rev().find(|k| hpg.is_multiple_of(*k)).unwrap_or(1)
}

/// f32 elements of the scratch of [`ssd_fwd`]: the bf16 states entering each chunk. At B = 2,
/// T = 16384, H = 24, N = 128: 201 MB.
pub fn ssd_fwd_scratch_len(batch: usize, seq: usize, heads: usize, state: usize) -> usize {
    states_words(batch, seq, heads, state)
}

/// f32 elements of the scratch of [`ssd_bwd`]: the states and their gradients (bf16), the
/// per-head-block dB, dC ([hblocks, B·T, 2·N], only when a group has more than one head block) and the per-(b, chunk, head) dA, dD shares.
pub fn ssd_bwd_scratch_len(batch: usize, seq: usize, heads: usize, state: usize, groups: usize) -> usize {
    let hblocks = heads / heads_per_block(heads, groups.max(1), BWD_HEADS);
    // A group with one head block writes dB and dC straight into dxbc.
    let parts = if hblocks == groups { 0 } else { hblocks };
    2 * states_words(batch, seq, heads, state) + parts * batch * seq * 2 * state + batch * chunks(seq) * heads * 2
}

impl<T: Elem> DevSsd<'_, T> {
    fn tc_check(&self, op: &str) -> Result<()> {
        let (b, t, h, p, n, g) = (self.batch, self.seq, self.heads, self.head_dim, self.state, self.groups);
        ensure!(g > 0 && h.is_multiple_of(g), "{op}: groups {g} must divide heads {h}");
        ensure!(supported(self), "{op}: the tensor-core SSD takes P = 64 and N = 64 or 128, not P = {p}, N = {n}");
        int(op, b * t * h * p)?;
        int(op, b * h * chunks(t) * p * n)?;
        int(op, (b * chunks(t)).max(b * h))?;
        Ok(())
    }
    /// The kernels' parameters with `hb` heads per block, from the initial state `init` (none: 0).
    fn tc_params(&self, gpu: &Gpu, op: &str, hb: usize, init: Option<&CudaSlice<f32>>) -> Result<Params> {
        need_opt(op, "init", init, self.states())?;
        let xbc = ptr(gpu, self.xbc);
        // bf16 rows go by 16-byte copies when the rows and the base are 16-byte aligned.
        let vec = (self.xbc_stride * std::mem::size_of::<T>()).is_multiple_of(16) && xbc.is_multiple_of(16);
        Ok(Params {
            xbc,
            init: opt_ptr(gpu, init),
            dt: ptr(gpu, self.dt),
            a: ptr(gpu, self.a),
            d: ptr(gpu, self.d),
            start: self.start.map_or(0, |s| ptr(gpu, s)),
            stride: self.xbc_stride as i64,
            b: self.batch as i32,
            t: self.seq as i32,
            h: self.heads as i32,
            p: self.head_dim as i32,
            n: self.state as i32,
            g: self.groups as i32,
            nch: chunks(self.seq) as i32,
            hb: hb as i32,
            vec: vec as i32,
            ..Default::default()
        })
    }
}

/// Launches `name` with its TcParams `prm`, every buffer checked by the callers against the sizes
/// the kernels index (and that those fit 32-bit ints where used as such).
fn launch(gpu: &Gpu, name: &str, grid: (usize, usize, usize), threads: u32, smem: usize, prm: &Params) -> Result<()> {
    kargs::launch(gpu, &SSD_TC, name, kargs::config(name, grid, threads, smem)?, &[by_value(prm)])
}

/// The state walk's blocks: 4 warps over 32 state columns (8 warps over 64 was slower and
/// failed a check of dA; see BENCHMARKS.md).
const WALK_WARPS: usize = 4;
const WALK_COLS: usize = 8 * WALK_WARPS;

/// Shared memory of a walk block: four stages of a value tile [64, P + 8], a key tile
/// [64, cols + 8] (bf16) and dt [64], and the warps' staging tiles [16, 40] (bf16).
fn walk_smem() -> usize {
    4 * L * ((P + 8) + (WALK_COLS + 8)) * 2 + 4 * L * 4 + WALK_WARPS * 16 * 40 * 2
}

/// Launches walk kernel `name` for B·H `rows` of `n` state columns, `z` walks per row.
fn walk(gpu: &Gpu, name: &str, (rows, n, z): (usize, usize, usize), prm: &Params) -> Result<()> {
    launch(gpu, name, (rows, n / WALK_COLS, z), 32 * WALK_WARPS as u32, walk_smem(), prm)
}

/// Shared memory of the chunk outputs with `nw` warps: C and B tiles [64, N + 8], two stages of
/// x [64, P + 8] and S [P, N + 8] (bf16) and dt, the warps' output staging [16, 4P/nw + 4] (f32).
fn out_smem(n: usize, nw: usize) -> usize {
    2 * L * (n + 8) * 2 + 2 * (L * (P + 8) * 2 + P * (n + 8) * 2 + L * 4) + nw * 16 * (4 * P / nw + 4) * 4
}

/// One of the forward's two kernels alone, for timing each (`fox-attn bench-ssd`; the other's
/// results are whatever the scratch holds): 0 the state walk, 1 the chunk outputs.
pub fn ssd_fwd_step<T: Elem>(
    gpu: &Gpu,
    p: &DevSsd<T>,
    y: &mut CudaSlice<T>,
    scratch: &mut CudaSlice<f32>,
    step: usize,
) -> Result<()> {
    fwd_steps(gpu, p, y, None, None, scratch, [step == 0, step == 1])
}

/// The forward, as [`crate::ssd::ssd_fwd`]: y [B, T, H·P] (0 at padding); `init`,
/// `final_state` [B, H, P, N] f32 or none; `scratch` of [`ssd_fwd_scratch_len`] f32 elements.
pub fn ssd_fwd<T: Elem>(
    gpu: &Gpu,
    p: &DevSsd<T>,
    y: &mut CudaSlice<T>,
    init: Option<&CudaSlice<f32>>,
    final_state: Option<&mut CudaSlice<f32>>,
    scratch: &mut CudaSlice<f32>,
) -> Result<()> {
    fwd_steps(gpu, p, y, init, final_state, scratch, [true, true])
}

fn fwd_steps<T: Elem>(
    gpu: &Gpu,
    p: &DevSsd<T>,
    y: &mut CudaSlice<T>,
    init: Option<&CudaSlice<f32>>,
    final_state: Option<&mut CudaSlice<f32>>,
    scratch: &mut CudaSlice<f32>,
    run: [bool; 2],
) -> Result<()> {
    let op = "ssd_tc_fwd";
    p.tc_check(op)?;
    let (b, t, h, n, g) = (p.batch, p.seq, p.heads, p.state, p.groups);
    need(op, "y", y, b * t * h * P)?;
    need(op, "scratch", scratch, ssd_fwd_scratch_len(b, t, h, n))?;
    let hb = heads_per_block(h, g, 4);
    let mut prm = p.tc_params(gpu, op, hb, init)?;
    if let Some(f) = &final_state {
        need(op, "final_state", &**f, p.states())?;
        prm.fin = ptr(gpu, *f);
    }
    if b * h == 0 {
        return Ok(());
    }
    prm.states = ptr(gpu, scratch);
    prm.y = ptr(gpu, y);
    let sfx = format!("n{n}_{}", T::NAME);
    // With T = 0 the walk only copies the initial state to the final one.
    if run[0] {
        walk(gpu, &format!("ssd_tc_states_{sfx}"), (b * h, n, 1), &prm)?;
    }
    if t == 0 {
        return Ok(());
    }
    if run[1] {
        launch(gpu, &format!("ssd_tc_out_{sfx}"), (b * chunks(t), h / hb, 1), 256, out_smem(n, OUT_WARPS), &prm)?;
    }
    Ok(())
}

/// Shared memory of the chunk backward: C and B tiles [64, N + 8], two stages of x, dy
/// [64, P + 8], S_0, dS [P, N + 8] (bf16), M and dG [64, P + 8] (bf16), dt [2, 64] and the
/// per-warp slots (5 · 8 · 64 + 16 f32).
fn bwd_smem(n: usize) -> usize {
    2 * L * (n + 8) * 2
        + 2 * (2 * L * (P + 8) + 2 * P * (n + 8)) * 2
        + 2 * L * (P + 8) * 2
        + 2 * L * 4
        + (5 * 8 * L + 16) * 4
}

/// The backward, as [`crate::ssd::ssd_bwd`]: dy [B, T, H·P] (its padded rows ignored); `init`
/// as given to the forward; `dfinal` [B, H, P, N] or none (0); `scratch` of
/// [`ssd_bwd_scratch_len`] f32 elements. Recomputes the forward's states (the walk), walks the
/// state gradients back, then the chunk backward and the ordered reductions.
pub fn ssd_bwd<T: Elem>(
    gpu: &Gpu,
    p: &DevSsd<T>,
    dy: &CudaSlice<T>,
    init: Option<&CudaSlice<f32>>,
    dfinal: Option<&CudaSlice<f32>>,
    g: DevSsdGrads<T>,
    scratch: &mut CudaSlice<f32>,
) -> Result<()> {
    bwd_steps(gpu, p, dy, init, dfinal, g, scratch, [true; 3])
}

/// One of the backward's steps alone, for timing (`fox-attn bench-ssd`): 0 the two state walks,
/// 1 the chunk backward, 2 the reductions.
pub fn ssd_bwd_step<T: Elem>(
    gpu: &Gpu,
    p: &DevSsd<T>,
    dy: &CudaSlice<T>,
    g: DevSsdGrads<T>,
    scratch: &mut CudaSlice<f32>,
    step: usize,
) -> Result<()> {
    bwd_steps(gpu, p, dy, None, None, g, scratch, [step == 0, step == 1, step == 2])
}

#[allow(clippy::too_many_arguments)]
fn bwd_steps<T: Elem>(
    gpu: &Gpu,
    p: &DevSsd<T>,
    dy: &CudaSlice<T>,
    init: Option<&CudaSlice<f32>>,
    dfinal: Option<&CudaSlice<f32>>,
    g: DevSsdGrads<T>,
    scratch: &mut CudaSlice<f32>,
    run: [bool; 3],
) -> Result<()> {
    let op = "ssd_tc_bwd";
    p.tc_check(op)?;
    let (b, t, h, n, gr) = (p.batch, p.seq, p.heads, p.state, p.groups);
    need(op, "dy", dy, b * t * h * P)?;
    g.check(op, p)?;
    need(op, "scratch", scratch, ssd_bwd_scratch_len(b, t, h, n, gr))?;
    let hb = heads_per_block(h, gr, BWD_HEADS);
    let hblocks = h / hb;
    int(op, hblocks * b * t * 2 * n)?;
    int(op, b * t * gr * 2 * n)?;
    let mut prm = p.tc_params(gpu, op, hb, init)?;
    need_opt(op, "dfinal", dfinal, p.states())?;
    if b * h == 0 {
        return Ok(());
    }
    let base = ptr(gpu, scratch);
    let sw = states_words(b, t, h, n) as u64;
    prm.states = base;
    prm.dstates = base + 4 * sw;
    let parts = if hblocks == gr { 0 } else { hblocks };
    prm.part_ad = base + 8 * sw + 4 * (parts * b * t * 2 * n) as u64;
    if parts > 0 {
        prm.part_bc = base + 8 * sw;
    }
    prm.dy = ptr(gpu, dy);
    if prm.dy.is_multiple_of(16) {
        prm.vec |= 2;
    }
    prm.dxbc = ptr(gpu, g.dxbc);
    prm.ddt = ptr(gpu, g.ddt);
    prm.da = ptr(gpu, g.da);
    prm.dd = ptr(gpu, g.dd);
    let sfx = format!("n{n}_{}", T::NAME);
    // The forward's states (no final state) and the state gradients (from dfinal to dinit), the
    // two walks in one launch.
    prm.dfinal = dfinal.map_or(0, |f| ptr(gpu, f));
    prm.dinit = g.dinit.map_or(0, |d| ptr(gpu, d));
    if run[0] {
        walk(gpu, &format!("ssd_tc_walks_{sfx}"), (b * h, n, 2), &prm)?;
    }
    if t == 0 {
        return Ok(());
    }
    if run[1] {
        launch(gpu, &format!("ssd_tc_chunk_bwd_{sfx}"), (b * chunks(t), hblocks, 1), 256, bwd_smem(n), &prm)?;
    }
    if !run[2] {
        return Ok(());
    }
    let hbpg = hblocks / gr;
    if parts > 0 {
        reduce_bc::<T>(gpu, &prm, b * t * gr * 2 * n, hbpg)?;
    }
    launch(gpu, "ssd_tc_ad_reduce", (h.div_ceil(8), 1, 1), 256, 0, &prm)
}

/// dB, dC: the sum over each group's `hbpg` head blocks, into dxbc.
/// part_bc holds hblocks · B·T · 2N values and dxbc the rows the caller checked.
fn reduce_bc<T: Elem>(gpu: &Gpu, prm: &Params, total: usize, hbpg: usize) -> Result<()> {
    let cfg = kargs::plain_config((total.div_ceil(256) as u32, 1, 1), 256, 0);
    kargs::launch(gpu, &SSD_TC, &kname::<T>("ssd_tc_bc_reduce"), cfg, &args![gpu; by_value(prm), hbpg as i32])
}

#[cfg(test)]
mod tests {
    /// `cuda::ssd::ssd_fwd` / `ssd_bwd` hand their callers' scratch (sized by the CUDA-core
    /// kernels' lengths) to these kernels: it must be enough.
    #[test]
    fn cuda_core_scratch_covers_tensor_cores() {
        for (b, t, h, n, g) in
            [(2, 16384, 24, 128, 1), (1, 1, 1, 64, 1), (3, 65, 34, 64, 1), (2, 300, 4, 128, 2), (1, 0, 2, 64, 1)]
        {
            let p = super::P;
            assert!(
                super::super::ssd::ssd_fwd_scratch_len(b, t, h, p, n, g) >= super::ssd_fwd_scratch_len(b, t, h, n),
                "forward {b} {t} {h} {n} {g}"
            );
            assert!(
                super::super::ssd::ssd_bwd_scratch_len(b, t, h, p, n, g) >= super::ssd_bwd_scratch_len(b, t, h, n, g),
                "backward {b} {t} {h} {n} {g}"
            );
        }
    }
}
