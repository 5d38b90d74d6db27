//! Mamba's selective scan (the SSM of Samba's Mamba layers), forward and backward, in f32.
//!
//! Per batch row b, channel d < Di and state n < N, for t = 0..T:
//!
//! ```text
//!   h_t[d,n] = exp(δ_t[d]·A[d,n]) · h_{t−1}[d,n] + δ_t[d]·B_t[n]·u_t[d]
//!   y_t[d]   = Σ_n h_t[d,n]·C_t[n] + D[d]·u_t[d]
//!   out_t[d] = y_t[d] · SiLU(z_t[d])        (y_t[d] when there is no gate z)
//! ```
//!
//! δ is already softplus(dt_proj(…) + bias) and A = −exp(A_log): the caller does both, and
//! turns dA into dA_log (dA_log = dA ⊙ A). B_t and C_t are shared by every channel; they are
//! read from x_proj's output through [`BcLayout`], so no copy is made. h_{−1} is the initial
//! state (zeros unless given). Left padding: positions t < start[b] are skipped: the state passes
//! through them unchanged, their outputs are 0 and every gradient there is 0.
//!
//! The fast path runs one task per (batch row, block of [`LANES`] channels): the recurrence is
//! independent per channel and state, so the blocks need no communication. Inside a task the
//! arithmetic runs across the block's channels, one vector lane per channel (u, δ, z, out are
//! contiguous over channels; A is transposed once per task to [N][lanes]), so the forward's sum
//! over n is a plain vertical add with no horizontal reduction. The forward keeps the state at
//! the start of every [`CHUNK`] positions; the backward walks the chunks in reverse, recomputes
//! each chunk's states from its saved start, then runs the chunk's reverse-time recurrence.
//! Memory kept for the backward is O(B·Di·N·T/CHUNK), not the O(B·Di·N·T) of storing every state.
//!
//! dB and dC are sums over all channels: each task writes its block's sums per position, and a
//! second pass adds the blocks in block order; dA and dD add the batch rows in row order. The
//! blocks are fixed by the shapes, never by the thread count, so the results are the same bits
//! whatever the number of threads.
//!
//! `reference_forward` / `reference_backward` are the oracle: the plain recurrence in f64 and its
//! backward through time with every state kept, for tests.
//!
//! In a Mamba layer (fla's MambaMixer, which Samba uses), with x_proj's output `xp` [B, T, R + 2N]
//! (R = dt_rank) and `BcLayout::x_proj(T, R, N)`:
//!
//! ```text
//!   forward:  δ = softplus(dt_proj(xp[.., :R]) + dt_bias); A = −exp(A_log)
//!             forward(&Scan { u, delta: δ, a: A, bc: xp, bc_layout, d: D, z: Some(z), start }, None,
//!                     y, saved, None)                                  → out_proj(y)
//!   backward: backward(&scan, saved, dy, GradsMut { dbc: dxp, .. })   → dxp's B, C columns;
//!             dA_log += dA ⊙ A (dA starts at 0); dδ → softplus' → dt_proj's backward, which
//!             writes dxp's first R columns; du → the conv's backward; dz → in_proj's.
//!   decoding: decode_step with len = 1 and `BcLayout::x_proj(1, R, N)` on the cached state
//!             [B, Di, N] (the conv state is the conv op's).
//! ```
//!
//! The GPU twin is `crate::cuda::selective_scan` (same layouts, N ≤ 16 there).

use crate::par::SharedMut;
use crate::scalar::{fast_exp, fast_sigmoid};
use crate::simd::multiversion;
use rayon::prelude::*;

/// Positions per chunk: the forward saves the state at every chunk's start, and the backward
/// keeps one chunk's states (CHUNK · N · LANES floats, 128 KiB at N = 16) while it recomputes it.
pub const CHUNK: usize = 64;

/// Channels per task, one per vector lane: 4 AVX2 vectors, or 2 AVX-512 ones. More channels per
/// task means fewer partial sums for dB and dC (B·T·2N floats per block) but larger scratch.
pub const LANES: usize = 32;

/// Where B_t and C_t of batch row b sit in one buffer: B_t[n] at `b·sb + t·st + b_off + n`,
/// C_t[n] at `b·sb + t·st + c_off + n`, n < N. The gradient buffer has the same layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BcLayout {
    pub sb: usize,
    pub st: usize,
    pub b_off: usize,
    pub c_off: usize,
}

impl BcLayout {
    /// B and C side by side, [B, T, 2N]: row [B_t | C_t].
    pub fn packed(t: usize, n: usize) -> Self {
        Self { sb: t * 2 * n, st: 2 * n, b_off: 0, c_off: n }
    }
    /// Mamba's x_proj output [B, T, dt_rank + 2N], whose row is [dt (dt_rank) | B_t | C_t].
    pub fn x_proj(t: usize, dt_rank: usize, n: usize) -> Self {
        let st = dt_rank + 2 * n;
        Self { sb: t * st, st, b_off: dt_rank, c_off: dt_rank + n }
    }
    #[inline]
    fn at(&self, b: usize, t: usize) -> usize {
        b * self.sb + t * self.st
    }
}

/// One scan. Shapes: B = `batch`, T = `len`, Di = `channels`, N = `state`.
#[derive(Clone, Copy, Debug)]
pub struct Scan<'a> {
    pub batch: usize,
    pub len: usize,
    pub channels: usize,
    pub state: usize,
    /// [B, T, Di]: the conv + SiLU output.
    pub u: &'a [f32],
    /// [B, T, Di]: the step sizes, after softplus.
    pub delta: &'a [f32],
    /// [Di, N]: A = −exp(A_log).
    pub a: &'a [f32],
    /// B_t and C_t, laid out as `bc_layout` says.
    pub bc: &'a [f32],
    pub bc_layout: BcLayout,
    /// [Di]: the skip connection.
    pub d: &'a [f32],
    /// [B, T, Di]: the gate; None for y without a gate.
    pub z: Option<&'a [f32]>,
    /// [B]: the first real position of each row (left padding); None: every position is real.
    pub start: Option<&'a [usize]>,
}

impl Scan<'_> {
    fn check(&self) {
        let (b, t, di, n) = (self.batch, self.len, self.channels, self.state);
        assert_eq!(self.u.len(), b * t * di, "selective_scan: u");
        assert_eq!(self.delta.len(), b * t * di, "selective_scan: delta");
        assert_eq!(self.a.len(), di * n, "selective_scan: A");
        assert_eq!(self.d.len(), di, "selective_scan: D");
        if let Some(z) = self.z {
            assert_eq!(z.len(), b * t * di, "selective_scan: z");
        }
        if let Some(s) = self.start {
            assert_eq!(s.len(), b, "selective_scan: start");
        }
        let l = &self.bc_layout;
        assert!(l.b_off + n <= l.st || t <= 1, "selective_scan: B overruns a row");
        assert!(l.c_off + n <= l.st || t <= 1, "selective_scan: C overruns a row");
        assert!(l.b_off + n <= l.c_off || l.c_off + n <= l.b_off, "selective_scan: B and C overlap");
        if b * t > 0 {
            let end = l.at(b - 1, t - 1) + l.b_off.max(l.c_off) + n;
            assert!(self.bc.len() >= end, "selective_scan: bc has {} values, needs {end}", self.bc.len());
        }
    }
    #[inline]
    fn start_of(&self, b: usize) -> usize {
        self.start.map_or(0, |s| s[b]).min(self.len)
    }
    #[inline]
    fn b_row(&self, b: usize, t: usize) -> &[f32] {
        let o = self.bc_layout.at(b, t) + self.bc_layout.b_off;
        &self.bc[o..o + self.state]
    }
    #[inline]
    fn c_row(&self, b: usize, t: usize) -> &[f32] {
        let o = self.bc_layout.at(b, t) + self.bc_layout.c_off;
        &self.bc[o..o + self.state]
    }
}

/// Chunks of a sequence of `t` positions.
pub fn chunks(t: usize) -> usize {
    t.div_ceil(CHUNK)
}

/// Length of the buffer the forward saves for the backward: the state at the start of every
/// chunk, [B, chunks(T), Di, N] (chunk k holds h before position k·CHUNK; chunk 0 the initial
/// state).
pub fn saved_len(p: &Scan) -> usize {
    p.batch * chunks(p.len) * p.channels * p.state
}

/// Gradients. `dz` is required when the scan has a gate; `dh0` is optional.
pub struct GradsMut<'a> {
    /// [B, T, Di], overwritten.
    pub du: &'a mut [f32],
    /// [B, T, Di], overwritten.
    pub ddelta: &'a mut [f32],
    /// [Di, N], added to (a parameter's gradient, summed over calls).
    pub da: &'a mut [f32],
    /// The B and C places of `bc_layout` are overwritten; the rest of the buffer (dt's columns
    /// of x_proj's gradient) is not touched.
    pub dbc: &'a mut [f32],
    /// [Di], added to.
    pub dd: &'a mut [f32],
    /// [B, T, Di], overwritten.
    pub dz: Option<&'a mut [f32]>,
    /// [B, Di, N], overwritten: the gradient of the loss with respect to the initial state.
    pub dh0: Option<&'a mut [f32]>,
}

impl GradsMut<'_> {
    fn check(&self, p: &Scan) {
        let n = p.batch * p.len * p.channels;
        assert_eq!(self.du.len(), n, "selective_scan: du");
        assert_eq!(self.ddelta.len(), n, "selective_scan: ddelta");
        assert_eq!(self.da.len(), p.channels * p.state, "selective_scan: dA");
        assert_eq!(self.dd.len(), p.channels, "selective_scan: dD");
        assert!(self.dbc.len() >= bc_end(p), "selective_scan: dbc too short");
        assert_eq!(self.dz.is_some(), p.z.is_some(), "selective_scan: dz exactly when z is given");
        if let Some(dz) = &self.dz {
            assert_eq!(dz.len(), n, "selective_scan: dz");
        }
        if let Some(dh0) = &self.dh0 {
            assert_eq!(dh0.len(), p.batch * p.channels * p.state, "selective_scan: dh0");
        }
    }
}

fn bc_end(p: &Scan) -> usize {
    let l = &p.bc_layout;
    if p.batch * p.len == 0 {
        0
    } else {
        l.at(p.batch - 1, p.len - 1) + l.b_off.max(l.c_off) + p.state
    }
}

type Lanes = [f32; LANES];

/// The first `w` values of `src` into `dst`, zeros after (padding lanes then add nothing: δ = u
/// = 0 gives a decay of 1 on a zero state and a zero input).
#[inline(always)]
fn load(dst: &mut Lanes, src: &[f32], w: usize) {
    dst[..w].copy_from_slice(&src[..w]);
    dst[w..].fill(0.0);
}

/// Σ of the lanes in a fixed order (eight partial sums, then a tree).
#[inline(always)]
fn hsum(v: &Lanes) -> f32 {
    let mut acc = [0.0f32; 8];
    for c in 0..LANES / 8 {
        for l in 0..8 {
            acc[l] += v[c * 8 + l];
        }
    }
    ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))
}

/// One position of the recurrence for a block of channels: h ← exp(δ·A)·h + (δ·u)·B, decays
/// into `decay`, and returns y = Σ_n h·C + D·u. `du` is δ·u. The decode step does the same
/// operations in the same order per channel, so both give the same bits.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn step(
    h: &mut [Lanes],
    decay: &mut [Lanes],
    at: &[Lanes],
    dl: &Lanes,
    du: &Lanes,
    uu: &Lanes,
    dskip: &Lanes,
    bt: &[f32],
    ct: &[f32],
) -> Lanes {
    let mut acc = [0.0f32; LANES];
    for n in 0..h.len() {
        let (hn, en, an, bn, cn) = (&mut h[n], &mut decay[n], &at[n], bt[n], ct[n]);
        for l in 0..LANES {
            let e = fast_exp(dl[l] * an[l]);
            en[l] = e;
            hn[l] = e * hn[l] + du[l] * bn;
            acc[l] += hn[l] * cn;
        }
    }
    for l in 0..LANES {
        acc[l] += dskip[l] * uu[l];
    }
    acc
}

/// SiLU(z) = z·σ(z), as the forward applies it.
#[inline(always)]
fn silu(z: f32) -> f32 {
    z * fast_sigmoid(z)
}

/// Work items: (batch row, first channel of the block), in the fixed order the dB/dC partial
/// sums are indexed by.
fn tasks(p: &Scan) -> Vec<(usize, usize)> {
    let blocks = p.channels.div_ceil(LANES);
    (0..p.batch).flat_map(|b| (0..blocks).map(move |g| (b, g * LANES))).collect()
}

/// The forward: `out` [B, T, Di], `saved` [`saved_len`] for the backward, the final state
/// `h_last` [B, Di, N] if asked for. `h0` [B, Di, N] is the initial state (zeros if None).
pub fn forward(p: &Scan, h0: Option<&[f32]>, out: &mut [f32], saved: &mut [f32], h_last: Option<&mut [f32]>) {
    p.check();
    let (b, di, n) = (p.batch, p.channels, p.state);
    assert_eq!(out.len(), b * p.len * di, "selective_scan: out");
    assert_eq!(saved.len(), saved_len(p), "selective_scan: saved");
    if let Some(h) = h0 {
        assert_eq!(h.len(), b * di * n, "selective_scan: h0");
    }
    if let Some(h) = &h_last {
        assert_eq!(h.len(), b * di * n, "selective_scan: h_last");
    }
    let (out, saved) = (SharedMut::new(out), SharedMut::new(saved));
    let h_last = h_last.map(SharedMut::new);
    tasks(p).into_par_iter().for_each(|(bi, d0)| forward_task(p, bi, d0, h0, out, saved, h_last));
}

multiversion! {
    /// The forward of batch row b, channels d0..d0 + LANES.
    fn forward_task(
        p: &Scan<'_>,
        b: usize,
        d0: usize,
        h0: Option<&[f32]>,
        out: SharedMut<f32>,
        saved: SharedMut<f32>,
        h_last: Option<SharedMut<f32>>,
    ) {
        let (t_len, di, ns) = (p.len, p.channels, p.state);
        let w = LANES.min(di - d0);
        let s = p.start_of(b);
        let kk = chunks(t_len);
        let (mut h, mut decay, at) = block_state(p, b, d0, w, h0);
        let mut dskip = [0.0; LANES];
        load(&mut dskip, &p.d[d0..], w);
        let (mut dl, mut uu, mut du) = ([0.0; LANES], [0.0; LANES], [0.0; LANES]);
        for t in 0..t_len {
            if t % CHUNK == 0 {
                // SAFETY: chunk t / CHUNK of this task's channels belongs to this task alone.
                unsafe { store_state(&h, saved, ((b * kk + t / CHUNK) * di + d0) * ns, w, ns) };
            }
            let row = (b * t_len + t) * di + d0;
            // SAFETY: this task alone writes row `row`'s channels d0..d0 + w.
            let o = unsafe { out.slice(row, w) };
            if t < s {
                o.fill(0.0);
                continue;
            }
            load(&mut dl, &p.delta[row..], w);
            load(&mut uu, &p.u[row..], w);
            for l in 0..LANES {
                du[l] = dl[l] * uu[l];
            }
            let y = step(&mut h, &mut decay, &at, &dl, &du, &uu, &dskip, p.b_row(b, t), p.c_row(b, t));
            match p.z {
                Some(z) => {
                    for l in 0..w {
                        o[l] = y[l] * silu(z[row + l]);
                    }
                }
                None => o.copy_from_slice(&y[..w]),
            }
        }
        if let Some(hl) = h_last {
            // SAFETY: this task's channels of batch row b.
            unsafe { store_state(&h, hl, (b * di + d0) * ns, w, ns) };
        }
    }
}

/// A task's state (from h0, or zeros), a decay scratch, and A transposed to [N][lanes].
fn block_state(p: &Scan, b: usize, d0: usize, w: usize, h0: Option<&[f32]>) -> (Vec<Lanes>, Vec<Lanes>, Vec<Lanes>) {
    let (di, ns) = (p.channels, p.state);
    let mut h = vec![[0.0; LANES]; ns];
    if let Some(h0) = h0 {
        load_state(&mut h, &h0[(b * di + d0) * ns..], w);
    }
    let mut at = vec![[0.0; LANES]; ns];
    load_state(&mut at, &p.a[d0 * ns..], w);
    (h, vec![[0.0; LANES]; ns], at)
}

/// `w` channels' rows [channel][N] from `src` into a block's [N][lanes], zeros in the other lanes.
#[inline(always)]
fn load_state(dst: &mut [Lanes], src: &[f32], w: usize) {
    let ns = dst.len();
    for (n, row) in dst.iter_mut().enumerate() {
        for (l, v) in row.iter_mut().enumerate() {
            *v = if l < w { src[l * ns + n] } else { 0.0 };
        }
    }
}

/// Writes a block's state [N][lanes] as [channel][N] rows from `at` on.
///
/// # Safety
/// `dst[at .. at + w·ns]` must be in bounds and written by no other task.
#[inline(always)]
unsafe fn store_state(h: &[Lanes], dst: SharedMut<f32>, at: usize, w: usize, ns: usize) {
    let o = dst.slice(at, w * ns);
    for l in 0..w {
        for n in 0..ns {
            o[l * ns + n] = h[n][l];
        }
    }
}

/// The backward, from the forward's `saved` buffer and the output gradient `dout` [B, T, Di].
/// Besides its outputs it allocates the per-block sums of dB and dC, B·ceil(Di/32)·T·2N floats
/// (B·T·Di at N = 16, as much as u), and per task a chunk's states and decays, (2·CHUNK + 1)·N·32.
pub fn backward(p: &Scan, saved: &[f32], dout: &[f32], g: GradsMut) {
    p.check();
    g.check(p);
    let (bn, t_len, di, ns) = (p.batch, p.len, p.channels, p.state);
    assert_eq!(saved.len(), saved_len(p), "selective_scan: saved");
    assert_eq!(dout.len(), bn * t_len * di, "selective_scan: dout");
    let blocks = di.div_ceil(LANES);
    // Per task: its block's Σ over channels of dB_t and dC_t, [T][2N]; per batch row: dA and dD.
    let mut dbc_part = vec![0.0f32; bn * blocks * t_len * 2 * ns];
    let mut da_part = vec![0.0f32; bn * di * ns];
    let mut dd_part = vec![0.0f32; bn * di];
    let mut g = g;
    if let Some(dh0) = g.dh0.as_deref_mut() {
        // Every task overwrites its part; with T = 0 there are no tasks and the gradient is 0.
        dh0.fill(0.0);
    }
    {
        let outs = Outs {
            du: SharedMut::new(g.du),
            ddelta: SharedMut::new(g.ddelta),
            dz: g.dz.map(SharedMut::new),
            dh0: g.dh0.map(SharedMut::new),
            da: SharedMut::new(&mut da_part),
            dd: SharedMut::new(&mut dd_part),
        };
        let tasks = tasks(p);
        let part_len = (t_len * 2 * ns).max(1);
        dbc_part
            .par_chunks_mut(part_len)
            .zip(tasks.into_par_iter())
            .for_each(|(part, (b, d0))| backward_task(p, b, d0, saved, dout, part, &outs));
    }
    // dB, dC: the blocks in block order, per position.
    let dbc = SharedMut::new(g.dbc);
    let layout = p.bc_layout;
    (0..bn * t_len).into_par_iter().with_min_len(64).for_each(|row| {
        let (b, t) = (row / t_len, row % t_len);
        let base = layout.at(b, t);
        for n in 0..2 * ns {
            let mut s = 0.0f32;
            for k in 0..blocks {
                s += dbc_part[((b * blocks + k) * t_len + t) * 2 * ns + n];
            }
            let at = base + if n < ns { layout.b_off + n } else { layout.c_off + n - ns };
            // SAFETY: each (b, t) row's B and C places are distinct (checked) and this task's.
            unsafe { *dbc.get(at) = s };
        }
    });
    // dA, dD: the batch rows in order.
    g.da.par_chunks_mut(ns.max(1)).enumerate().for_each(|(d, dar)| {
        for (n, v) in dar.iter_mut().enumerate() {
            let mut s = 0.0f32;
            for b in 0..bn {
                s += da_part[(b * di + d) * ns + n];
            }
            *v += s;
        }
    });
    for (d, v) in g.dd.iter_mut().enumerate() {
        let mut s = 0.0f32;
        for b in 0..bn {
            s += dd_part[b * di + d];
        }
        *v += s;
    }
}

/// The backward's outputs that tasks write disjoint parts of.
#[derive(Clone, Copy)]
struct Outs {
    du: SharedMut<f32>,
    ddelta: SharedMut<f32>,
    dz: Option<SharedMut<f32>>,
    dh0: Option<SharedMut<f32>>,
    /// [B, Di, N] per batch row.
    da: SharedMut<f32>,
    /// [B, Di] per batch row.
    dd: SharedMut<f32>,
}

multiversion! {
    /// The backward of batch row b, channels d0..d0 + LANES; `part` [T][2N] gets the block's
    /// Σ over channels of dB_t (first N) and dC_t.
    fn backward_task(p: &Scan<'_>, b: usize, d0: usize, saved: &[f32], dout: &[f32], part: &mut [f32], outs: &Outs) {
        let (t_len, di, ns) = (p.len, p.channels, p.state);
        let w = LANES.min(di - d0);
        let s = p.start_of(b);
        let kk = chunks(t_len);
        let (_, _, at) = block_state(p, b, d0, w, None);
        let mut dskip = [0.0; LANES];
        load(&mut dskip, &p.d[d0..], w);
        // The chunk's states: hs[i·N + n] is h after its i-th real position (i = 0: before any),
        // decays[i·N + n] the decay of position i.
        let mut hs = vec![[0.0f32; LANES]; (CHUNK + 1) * ns];
        let mut decays = vec![[0.0f32; LANES]; CHUNK * ns];
        let mut ys = vec![[0.0f32; LANES]; CHUNK];
        let mut dh = vec![[0.0f32; LANES]; ns];
        let mut da_acc = vec![[0.0f32; LANES]; ns];
        let mut dd_acc = [0.0f32; LANES];
        let (mut dl, mut uu, mut du, mut zz, mut go) = ([0.0; LANES], [0.0; LANES], [0.0; LANES], [0.0; LANES], [0.0; LANES]);
        let mut tmp = [0.0f32; LANES];
        for k in (0..kk).rev() {
            let (t0, t1) = (k * CHUNK, ((k + 1) * CHUNK).min(t_len));
            // Padded positions: every gradient 0; the state gradient passes through.
            for t in t0..s.min(t1) {
                let row = (b * t_len + t) * di + d0;
                // SAFETY: row `row`'s channels d0..d0 + w belong to this task.
                unsafe {
                    outs.du.slice(row, w).fill(0.0);
                    outs.ddelta.slice(row, w).fill(0.0);
                    if let Some(dz) = outs.dz {
                        dz.slice(row, w).fill(0.0);
                    }
                }
                part[t * 2 * ns..(t + 1) * 2 * ns].fill(0.0);
            }
            if t1 <= s {
                continue;
            }
            let ta = t0.max(s);
            // Recompute the chunk from its saved start (padded positions leave it unchanged).
            load_state(&mut hs[..ns], &saved[((b * kk + k) * di + d0) * ns..], w);
            for t in ta..t1 {
                let i = t - ta;
                let row = (b * t_len + t) * di + d0;
                load(&mut dl, &p.delta[row..], w);
                load(&mut uu, &p.u[row..], w);
                for l in 0..LANES {
                    du[l] = dl[l] * uu[l];
                }
                let (prev, next) = hs.split_at_mut((i + 1) * ns);
                next[..ns].copy_from_slice(&prev[i * ns..]);
                let decay = &mut decays[i * ns..(i + 1) * ns];
                ys[i] = step(&mut next[..ns], decay, &at, &dl, &du, &uu, &dskip, p.b_row(b, t), p.c_row(b, t));
            }
            // Reverse time through the chunk.
            for t in (ta..t1).rev() {
                let i = t - ta;
                let row = (b * t_len + t) * di + d0;
                load(&mut dl, &p.delta[row..], w);
                load(&mut uu, &p.u[row..], w);
                load(&mut go, &dout[row..], w);
                for l in 0..LANES {
                    du[l] = dl[l] * uu[l];
                }
                // dy = dout · SiLU(z); dz = dout · y · SiLU'(z), SiLU' = σ(z)·(1 + z·(1 − σ(z))).
                if let (Some(z), Some(dz)) = (p.z, outs.dz) {
                    load(&mut zz, &z[row..], w);
                    // SAFETY: as above.
                    let dzr = unsafe { dz.slice(row, w) };
                    for l in 0..LANES {
                        let sg = fast_sigmoid(zz[l]);
                        tmp[l] = go[l] * ys[i][l] * (sg * (1.0 + zz[l] * (1.0 - sg)));
                        go[l] *= zz[l] * sg;
                    }
                    dzr.copy_from_slice(&tmp[..w]);
                }
                let (bt, ct) = (p.b_row(b, t), p.c_row(b, t));
                let mut gu = [0.0f32; LANES];
                let mut gdl = [0.0f32; LANES];
                let mut sb = [0.0f32; LANES];
                for l in 0..LANES {
                    dd_acc[l] += go[l] * uu[l];
                    gu[l] = go[l] * dskip[l];
                }
                let prt = &mut part[t * 2 * ns..(t + 1) * 2 * ns];
                for n in 0..ns {
                    let (hp, hc) = (&hs[i * ns + n], &hs[(i + 1) * ns + n]);
                    let e = &decays[i * ns + n];
                    let (dhn, dan, an) = (&mut dh[n], &mut da_acc[n], &at[n]);
                    // dC_t[n] = Σ_d dy·h_t.
                    for l in 0..LANES {
                        tmp[l] = go[l] * hc[l];
                    }
                    prt[ns + n] = hsum(&tmp);
                    // dh_t = dy·C_t + (what came back from t + 1).
                    for l in 0..LANES {
                        dhn[l] += go[l] * ct[n];
                    }
                    // dB_t[n] = Σ_d dh_t·δ·u.
                    for l in 0..LANES {
                        tmp[l] = dhn[l] * du[l];
                    }
                    prt[n] = hsum(&tmp);
                    for l in 0..LANES {
                        // Through the decay e = exp(δ·A): ∂/∂e = dh_t·h_{t−1}.
                        let ge = dhn[l] * hp[l] * e[l];
                        gdl[l] += ge * an[l];
                        dan[l] += ge * dl[l];
                        sb[l] += dhn[l] * bt[n];
                        dhn[l] *= e[l];
                    }
                }
                // Through δ·u·B: Σ_n dh_t·B_t[n] times u (for δ) or δ (for u).
                for l in 0..LANES {
                    gdl[l] += sb[l] * uu[l];
                    gu[l] += sb[l] * dl[l];
                }
                // SAFETY: as above.
                unsafe {
                    outs.du.slice(row, w).copy_from_slice(&gu[..w]);
                    outs.ddelta.slice(row, w).copy_from_slice(&gdl[..w]);
                }
            }
        }
        // SAFETY: batch row b's channels d0..d0 + w of each buffer belong to this task.
        unsafe {
            if let Some(dh0) = outs.dh0 {
                store_state(&dh, dh0, (b * di + d0) * ns, w, ns);
            }
            store_state(&da_acc, outs.da, (b * di + d0) * ns, w, ns);
            outs.dd.slice(b * di + d0, w).copy_from_slice(&dd_acc[..w]);
        }
    }
}

/// One token per batch row, the state `h` [B, Di, N] updated in place; `out` [B, Di]. `p.len`
/// must be 1 (u, δ, z are [B, Di]); a row with start[b] ≥ 1 is padding: its state is left as
/// it is and its output is 0. Gives the bits of [`forward`] at the same position.
pub fn decode_step(p: &Scan, h: &mut [f32], out: &mut [f32]) {
    p.check();
    assert_eq!(p.len, 1, "selective_scan: decode_step takes one position");
    let (di, ns) = (p.channels, p.state);
    assert_eq!(h.len(), p.batch * di * ns, "selective_scan: decode state");
    assert_eq!(out.len(), p.batch * di, "selective_scan: decode out");
    h.par_chunks_mut((di * ns).max(1)).zip(out.par_chunks_mut(di.max(1))).enumerate().for_each(|(b, (hb, ob))| {
        if p.start_of(b) > 0 {
            ob.fill(0.0);
            return;
        }
        let (bt, ct) = (p.b_row(b, 0), p.c_row(b, 0));
        for d in 0..di {
            let (dl, uu) = (p.delta[b * di + d], p.u[b * di + d]);
            let du = dl * uu;
            let hd = &mut hb[d * ns..(d + 1) * ns];
            let mut acc = 0.0f32;
            for n in 0..ns {
                let e = fast_exp(dl * p.a[d * ns + n]);
                hd[n] = e * hd[n] + du * bt[n];
                acc += hd[n] * ct[n];
            }
            acc += p.d[d] * uu;
            ob[d] = match p.z {
                Some(z) => acc * silu(z[b * di + d]),
                None => acc,
            };
        }
    });
}

/// The oracle's forward in f64: (out [B, T, Di], every state [B, T + 1, Di, N], y [B, T, Di]).
fn reference_states(p: &Scan, h0: Option<&[f32]>) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    p.check();
    let (bn, tl, di, ns) = (p.batch, p.len, p.channels, p.state);
    let mut out = vec![0.0f64; bn * tl * di];
    let mut ys = vec![0.0f64; bn * tl * di];
    let mut hs = vec![0.0f64; bn * (tl + 1) * di * ns];
    let hi = |b: usize, t: usize, d: usize, n: usize| ((b * (tl + 1) + t) * di + d) * ns + n;
    for b in 0..bn {
        let s = p.start_of(b);
        for d in 0..di {
            for n in 0..ns {
                hs[hi(b, 0, d, n)] = h0.map_or(0.0, |h| h[(b * di + d) * ns + n] as f64);
            }
        }
        for t in 0..tl {
            let (bt, ct) = (p.b_row(b, t), p.c_row(b, t));
            for d in 0..di {
                let r = (b * tl + t) * di + d;
                if t < s {
                    for n in 0..ns {
                        hs[hi(b, t + 1, d, n)] = hs[hi(b, t, d, n)];
                    }
                    continue;
                }
                let (dl, uu) = (p.delta[r] as f64, p.u[r] as f64);
                let mut y = p.d[d] as f64 * uu;
                for n in 0..ns {
                    let h = (dl * p.a[d * ns + n] as f64).exp() * hs[hi(b, t, d, n)] + dl * bt[n] as f64 * uu;
                    hs[hi(b, t + 1, d, n)] = h;
                    y += h * ct[n] as f64;
                }
                ys[r] = y;
                out[r] = match p.z {
                    Some(z) => {
                        let z = z[r] as f64;
                        y * z / (1.0 + (-z).exp())
                    }
                    None => y,
                };
            }
        }
    }
    (out, hs, ys)
}

/// The oracle: the plain recurrence, in f64, rounded to f32 at the end. `out` [B, T, Di],
/// `h_last` [B, Di, N] if asked for.
pub fn reference_forward(p: &Scan, h0: Option<&[f32]>, out: &mut [f32], h_last: Option<&mut [f32]>) {
    let (o, hs, _) = reference_states(p, h0);
    assert_eq!(out.len(), o.len(), "selective_scan: out");
    for (a, b) in out.iter_mut().zip(&o) {
        *a = *b as f32;
    }
    if let Some(hl) = h_last {
        let (tl, di, ns) = (p.len, p.channels, p.state);
        assert_eq!(hl.len(), p.batch * di * ns, "selective_scan: h_last");
        for (i, v) in hl.iter_mut().enumerate() {
            let b = i / (di * ns);
            *v = hs[(b * (tl + 1) + tl) * di * ns + i % (di * ns)] as f32;
        }
    }
}

/// The oracle's backward: backpropagation through time over every kept state, in f64. The
/// gradients follow [`GradsMut`]'s rules (overwrite or add) exactly as [`backward`] does.
pub fn reference_backward(p: &Scan, h0: Option<&[f32]>, dout: &[f32], mut g: GradsMut) {
    g.check(p);
    let (_, hs, ys) = reference_states(p, h0);
    let (bn, tl, di, ns) = (p.batch, p.len, p.channels, p.state);
    let hi = |b: usize, t: usize, d: usize, n: usize| ((b * (tl + 1) + t) * di + d) * ns + n;
    let mut da = vec![0.0f64; di * ns];
    let mut dd = vec![0.0f64; di];
    let mut dbc = vec![0.0f64; bn * tl * 2 * ns];
    let mut dh = vec![0.0f64; di * ns];
    let mut dz = g.dz;
    for b in 0..bn {
        let s = p.start_of(b);
        dh.fill(0.0);
        for t in (0..tl).rev() {
            let (bt, ct) = (p.b_row(b, t), p.c_row(b, t));
            for d in 0..di {
                let r = (b * tl + t) * di + d;
                if t < s {
                    g.du[r] = 0.0;
                    g.ddelta[r] = 0.0;
                    if let Some(dz) = dz.as_deref_mut() {
                        dz[r] = 0.0;
                    }
                    continue;
                }
                let (dl, uu, go) = (p.delta[r] as f64, p.u[r] as f64, dout[r] as f64);
                let dy = match p.z {
                    Some(z) => {
                        let z = z[r] as f64;
                        let sg = 1.0 / (1.0 + (-z).exp());
                        dz.as_deref_mut().unwrap()[r] = (go * ys[r] * sg * (1.0 + z * (1.0 - sg))) as f32;
                        go * z * sg
                    }
                    None => go,
                };
                dd[d] += dy * uu;
                let (mut gu, mut gdl) = (dy * p.d[d] as f64, 0.0);
                for n in 0..ns {
                    let j = d * ns + n;
                    let an = p.a[j] as f64;
                    let e = (dl * an).exp();
                    let (hp, hc) = (hs[hi(b, t, d, n)], hs[hi(b, t + 1, d, n)]);
                    dbc[(b * tl + t) * 2 * ns + ns + n] += dy * hc;
                    let dht = dh[j] + dy * ct[n] as f64;
                    dbc[(b * tl + t) * 2 * ns + n] += dht * dl * uu;
                    gdl += dht * hp * e * an + dht * bt[n] as f64 * uu;
                    gu += dht * dl * bt[n] as f64;
                    da[j] += dht * hp * e * dl;
                    dh[j] = dht * e;
                }
                g.du[r] = gu as f32;
                g.ddelta[r] = gdl as f32;
            }
        }
        if let Some(dh0) = g.dh0.as_deref_mut() {
            for (i, v) in dh.iter().enumerate() {
                dh0[b * di * ns + i] = *v as f32;
            }
        }
    }
    for (a, v) in g.da.iter_mut().zip(&da) {
        *a += *v as f32;
    }
    for (a, v) in g.dd.iter_mut().zip(&dd) {
        *a += *v as f32;
    }
    let l = p.bc_layout;
    for b in 0..bn {
        for t in 0..tl {
            for n in 0..ns {
                g.dbc[l.at(b, t) + l.b_off + n] = dbc[(b * tl + t) * 2 * ns + n] as f32;
                g.dbc[l.at(b, t) + l.c_off + n] = dbc[(b * tl + t) * 2 * ns + ns + n] as f32;
            }
        }
    }
}

/// Random inputs of the scan, shared by the CPU tests and the GPU check (fox-checks).
pub mod testing {
    use super::{BcLayout, Scan};
    use rand::Rng;
    use rand_chacha::ChaCha8Rng;
    use rand_distr::StandardNormal;

    /// Inputs in the ranges a Mamba layer sees: δ = softplus(N(0,1) − 1) (0.05 .. 3), A = −exp(U(−1,
    /// 1.5)) (−0.37 .. −4.5, so δ·A reaches −13 and decays span 1 .. 2e-6), B, C, u, D, h0 and the
    /// output gradient ~ N(0,1), z ~ N(0, 4). B and C are read through x_proj's layout with
    /// `dt_rank` dt columns.
    pub struct Case {
        pub b: usize,
        pub t: usize,
        pub di: usize,
        pub n: usize,
        pub dt_rank: usize,
        pub u: Vec<f32>,
        pub delta: Vec<f32>,
        pub a: Vec<f32>,
        pub bc: Vec<f32>,
        pub d: Vec<f32>,
        pub z: Option<Vec<f32>>,
        pub start: Option<Vec<usize>>,
        pub h0: Option<Vec<f32>>,
        pub dout: Vec<f32>,
    }

    /// n values ~ N(0, scale²).
    pub fn randn(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| scale * rng.sample::<f32, _>(StandardNormal)).collect()
    }

    impl Case {
        /// A case of `(b, t, di, n)` = (batch, length, channels, state) from `rng`; `gate` draws z,
        /// `h0` an initial state.
        pub fn draw(
            rng: &mut ChaCha8Rng,
            dt_rank: usize,
            (b, t, di, n): (usize, usize, usize, usize),
            gate: bool,
            start: Option<Vec<usize>>,
            h0: bool,
        ) -> Self {
            let m = b * t * di;
            let u = randn(rng, m, 1.0);
            let delta = randn(rng, m, 1.0).iter().map(|x| (x - 1.0f32).exp().ln_1p()).collect();
            let bc = randn(rng, b * t * (dt_rank + 2 * n), 1.0);
            let d = randn(rng, di, 1.0);
            let z = gate.then(|| randn(rng, m, 2.0));
            let h0 = h0.then(|| randn(rng, b * di * n, 1.0));
            let dout = randn(rng, m, 1.0);
            let a = (0..di * n).map(|_| -rng.gen_range(-1.0f32..1.5).exp()).collect();
            Case { b, t, di, n, dt_rank, u, delta, a, bc, d, z, start, h0, dout }
        }

        /// The scan over these inputs.
        pub fn scan(&self) -> Scan<'_> {
            Scan {
                batch: self.b,
                len: self.t,
                channels: self.di,
                state: self.n,
                u: &self.u,
                delta: &self.delta,
                a: &self.a,
                bc: &self.bc,
                bc_layout: BcLayout::x_proj(self.t, self.dt_rank, self.n),
                d: &self.d,
                z: self.z.as_deref(),
                start: self.start.as_deref(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{randn, Case};
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// dt_rank of the x_proj layout the tests read B and C through (its columns must stay as
    /// they are in the gradient).
    const DT_RANK: usize = 3;

    fn case(seed: u64, shape: (usize, usize, usize, usize), gate: bool, start: Option<Vec<usize>>, h0: bool) -> Case {
        Case::draw(&mut ChaCha8Rng::seed_from_u64(seed), DT_RANK, shape, gate, start, h0)
    }

    /// Gradients of one backward, with dA and dD started at `acc` (they are added to) and the dt
    /// columns of dbc at a sentinel (they must stay).
    struct Grads {
        du: Vec<f32>,
        ddelta: Vec<f32>,
        da: Vec<f32>,
        dbc: Vec<f32>,
        dd: Vec<f32>,
        dz: Option<Vec<f32>>,
        dh0: Vec<f32>,
    }

    const SENTINEL: f32 = 7.25;

    impl Grads {
        fn new(c: &Case, acc: f32) -> Self {
            let m = c.b * c.t * c.di;
            Grads {
                du: vec![f32::NAN; m],
                ddelta: vec![f32::NAN; m],
                da: vec![acc; c.di * c.n],
                dbc: vec![SENTINEL; c.bc.len()],
                dd: vec![acc; c.di],
                dz: c.z.as_ref().map(|_| vec![f32::NAN; m]),
                dh0: vec![f32::NAN; c.b * c.di * c.n],
            }
        }
        fn as_mut(&mut self) -> GradsMut<'_> {
            GradsMut {
                du: &mut self.du,
                ddelta: &mut self.ddelta,
                da: &mut self.da,
                dbc: &mut self.dbc,
                dd: &mut self.dd,
                dz: self.dz.as_deref_mut(),
                dh0: Some(&mut self.dh0),
            }
        }
        /// (name, values) of every gradient, dA and dD less what they started at.
        fn named(&self, acc: f32) -> Vec<(&'static str, Vec<f32>)> {
            let mut v = vec![
                ("du", self.du.clone()),
                ("ddelta", self.ddelta.clone()),
                ("dA", self.da.iter().map(|x| x - acc).collect()),
                ("dbc", self.dbc.clone()),
                ("dD", self.dd.iter().map(|x| x - acc).collect()),
                ("dh0", self.dh0.clone()),
            ];
            if let Some(dz) = &self.dz {
                v.push(("dz", dz.clone()));
            }
            v
        }
    }

    fn run_forward(c: &Case) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let p = c.scan();
        let mut out = vec![f32::NAN; c.b * c.t * c.di];
        let mut saved = vec![f32::NAN; saved_len(&p)];
        let mut h_last = vec![f32::NAN; c.b * c.di * c.n];
        forward(&p, c.h0.as_deref(), &mut out, &mut saved, Some(&mut h_last));
        (out, saved, h_last)
    }

    /// max |a − b| / max |b|: the error relative to the tensor's scale (∞ if a NaN is met:
    /// f32::max would skip it).
    fn rel_err(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs())).max(1e-30);
        let worst = a.iter().zip(b).fold(0.0f32, |m, (x, y)| {
            let d = (x - y).abs();
            if d.is_nan() {
                f32::INFINITY
            } else {
                m.max(d)
            }
        });
        worst / scale
    }

    fn weights(seed: u64, n: usize) -> Vec<f32> {
        randn(&mut ChaCha8Rng::seed_from_u64(seed), n, 1.0)
    }

    /// The cases the fast path is compared on: T a multiple of CHUNK and not, T < CHUNK, Di a
    /// multiple of LANES and not (a partial block), N = 16 (Samba) and odd, left padding that
    /// ends inside a chunk, on a chunk boundary, and covers a whole row, an initial state, T = 0.
    fn cases() -> Vec<Case> {
        vec![
            case(1, (2, 150, 37, 16), true, Some(vec![0, 70]), true),
            case(2, (1, 20, 40, 5), false, None, false),
            case(3, (3, 128, 32, 16), true, Some(vec![1, 64, 128]), false),
            case(4, (2, 65, 70, 3), false, Some(vec![5, 0]), true),
            // An empty sequence: out is empty, h_last = h0, dh0 = 0.
            case(5, (2, 0, 37, 16), true, None, true),
        ]
    }

    /// Forward and backward against the f64 oracle. The f32 path differs by rounding: the state is
    /// a sum of decayed terms (each decay ≤ 1, so errors do not grow along T) and exp comes from
    /// `fast_exp` (2e-7 relative). The bounds, 1e-6 of their tensor's largest value for outputs and
    /// states and 2e-6 for gradients (dA, a sum over T·B terms, errs most), leave a factor of 5
    /// over the errors measured on these cases (docs/kernel-notes.md) for other inputs.
    #[test]
    fn fast_path_matches_the_oracle() {
        for (ci, c) in cases().iter().enumerate() {
            let p = c.scan();
            let (out, saved, h_last) = run_forward(c);
            let mut want = vec![f32::NAN; out.len()];
            let mut want_h = vec![f32::NAN; h_last.len()];
            reference_forward(&p, c.h0.as_deref(), &mut want, Some(&mut want_h));
            let (e_out, e_h) = (rel_err(&out, &want), rel_err(&h_last, &want_h));
            assert!(e_out < 1e-6, "case {ci}: out error {e_out}");
            assert!(e_h < 1e-6, "case {ci}: final state error {e_h}");
            // Padded positions output exactly 0.
            for b in 0..c.b {
                let s = c.start.as_ref().map_or(0, |s| s[b]);
                assert!(out[b * c.t * c.di..(b * c.t + s) * c.di].iter().all(|&v| v == 0.0), "case {ci}");
            }
            let dout = weights(100 + ci as u64, out.len());
            let mut fast = Grads::new(c, 0.5);
            backward(&p, &saved, &dout, fast.as_mut());
            let mut oracle = Grads::new(c, 0.5);
            reference_backward(&p, c.h0.as_deref(), &dout, oracle.as_mut());
            for ((name, g), (_, w)) in fast.named(0.5).iter().zip(oracle.named(0.5)) {
                let e = rel_err(g, &w);
                assert!(e < 2e-6, "case {ci}: {name} error {e}");
            }
            // dt's columns of x_proj's gradient are not touched.
            let row = DT_RANK + 2 * c.n;
            assert!(fast.dbc.chunks(row).all(|r| r[..DT_RANK].iter().all(|&v| v == SENTINEL)), "case {ci}");
            // Padded positions get no gradient at all.
            for b in 0..c.b {
                let s = c.start.as_ref().map_or(0, |s| s[b]);
                let pad = b * c.t * c.di..(b * c.t + s) * c.di;
                assert!(fast.du[pad.clone()].iter().chain(&fast.ddelta[pad.clone()]).all(|&v| v == 0.0));
                if let Some(dz) = &fast.dz {
                    assert!(dz[pad].iter().all(|&v| v == 0.0));
                }
                let bc_pad = b * c.t * row..(b * c.t + s) * row;
                assert!(fast.dbc[bc_pad].chunks(row).all(|r| r[DT_RANK..].iter().all(|&v| v == 0.0)));
            }
        }
    }

    /// L = Σ w ⊙ out through the f64 oracle's forward.
    fn loss(c: &Case, w: &[f32]) -> f64 {
        let (out, _, _) = reference_states(&c.scan(), c.h0.as_deref());
        out.iter().zip(w).map(|(o, w)| o * *w as f64).sum()
    }

    /// Both backwards against central differences of the f64 oracle, for every input element
    /// (left padding in row 1, an initial state, the gate). The step is the f32 difference
    /// actually taken (x ± 1e-3, rounded), so the quotient carries only the O(h²) truncation and
    /// f64 round-off (ddelta, whose third derivative brings |A|³ down from the decay, errs most).
    /// Bound: 1e-5·(1 + |fd|), several times the largest error measured (docs/kernel-notes.md).
    #[test]
    fn backward_matches_finite_differences() {
        let c = case(7, (2, 9, 3, 4), true, Some(vec![0, 2]), true);
        let p = c.scan();
        let (out, saved, _) = run_forward(&c);
        let w = weights(8, out.len());
        let mut fast = Grads::new(&c, 0.0);
        backward(&p, &saved, &w, fast.as_mut());
        let mut oracle = Grads::new(&c, 0.0);
        reference_backward(&p, c.h0.as_deref(), &w, oracle.as_mut());
        type Field = fn(&mut Case) -> &mut Vec<f32>;
        let fields: [(&str, Field, &Vec<f32>, &Vec<f32>); 7] = [
            ("du", |c| &mut c.u, &fast.du, &oracle.du),
            ("ddelta", |c| &mut c.delta, &fast.ddelta, &oracle.ddelta),
            ("dA", |c| &mut c.a, &fast.da, &oracle.da),
            ("dbc", |c| &mut c.bc, &fast.dbc, &oracle.dbc),
            ("dD", |c| &mut c.d, &fast.dd, &oracle.dd),
            ("dz", |c| c.z.as_mut().unwrap(), fast.dz.as_ref().unwrap(), oracle.dz.as_ref().unwrap()),
            ("dh0", |c| c.h0.as_mut().unwrap(), &fast.dh0, &oracle.dh0),
        ];
        let mut c = c;
        let row = DT_RANK + 2 * c.n;
        for (name, field, got, want) in fields {
            for i in 0..field(&mut c).len() {
                if name == "dbc" && i % row < DT_RANK {
                    continue;
                }
                let x = field(&mut c)[i];
                let (xp, xm) = (x + 1e-3, x - 1e-3);
                field(&mut c)[i] = xp;
                let lp = loss(&c, &w);
                field(&mut c)[i] = xm;
                let lm = loss(&c, &w);
                field(&mut c)[i] = x;
                let fd = ((lp - lm) / (xp as f64 - xm as f64)) as f32;
                let tol = 1e-5 * (1.0 + fd.abs());
                assert!((want[i] - fd).abs() < tol, "{name}[{i}]: oracle {} vs fd {fd}", want[i]);
                assert!((got[i] - fd).abs() < tol, "{name}[{i}]: fast {} vs fd {fd}", got[i]);
            }
        }
    }

    /// A sequence run in two pieces, the second starting from the first's final state, gives the
    /// bits of one run (the second piece's chunks start elsewhere: chunking changes nothing).
    #[test]
    fn two_pieces_equal_one() {
        let c = case(9, (2, 150, 37, 16), true, Some(vec![0, 70]), true);
        let (out, _, h_last) = run_forward(&c);
        let t1 = 93;
        let split = |v: &[f32], width: usize, lo: usize, hi: usize| -> Vec<f32> {
            (0..c.b).flat_map(|b| v[(b * c.t + lo) * width..(b * c.t + hi) * width].to_vec()).collect()
        };
        let row = DT_RANK + 2 * c.n;
        let piece = |lo: usize, hi: usize, h0: Option<Vec<f32>>, start: Option<Vec<usize>>| Case {
            b: c.b,
            t: hi - lo,
            di: c.di,
            n: c.n,
            dt_rank: c.dt_rank,
            u: split(&c.u, c.di, lo, hi),
            delta: split(&c.delta, c.di, lo, hi),
            a: c.a.clone(),
            bc: split(&c.bc, row, lo, hi),
            d: c.d.clone(),
            z: c.z.as_ref().map(|z| split(z, c.di, lo, hi)),
            start,
            h0,
            dout: split(&c.dout, c.di, lo, hi),
        };
        let first = piece(0, t1, c.h0.clone(), c.start.clone());
        let (out1, _, h1) = run_forward(&first);
        let second = piece(t1, c.t, Some(h1), None);
        let (out2, _, h2) = run_forward(&second);
        for b in 0..c.b {
            let whole = &out[b * c.t * c.di..(b + 1) * c.t * c.di];
            let (a, rest) = whole.split_at(t1 * c.di);
            assert!(a == &out1[b * t1 * c.di..(b + 1) * t1 * c.di], "row {b}: first piece");
            assert!(rest == &out2[b * (c.t - t1) * c.di..(b + 1) * (c.t - t1) * c.di], "row {b}: second piece");
        }
        assert!(h2 == h_last);
    }

    /// Forward and backward give the same bits on 1, 2 and 5 threads.
    #[test]
    fn same_bits_on_any_thread_count() {
        let c = case(10, (2, 130, 100, 16), true, Some(vec![0, 3]), true);
        let p = c.scan();
        let dout = weights(11, c.b * c.t * c.di);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let (out, saved, h_last) = run_forward(&c);
                let mut g = Grads::new(&c, 0.0);
                backward(&p, &saved, &dout, g.as_mut());
                let mut all = vec![out, saved, h_last];
                all.extend(g.named(0.0).into_iter().map(|(_, v)| v));
                all
            })
        };
        let one = run(1);
        for threads in [2, 5] {
            let many = run(threads);
            for (i, (a, b)) in one.iter().zip(&many).enumerate() {
                assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{threads} threads: output {i}");
            }
        }
    }

    /// Decoding token by token from the initial state gives the forward's bits at every position
    /// and its final state; a padded row keeps its state and outputs 0.
    #[test]
    fn decode_steps_match_the_forward() {
        let c = case(12, (3, 70, 37, 16), true, None, true);
        let (out, _, h_last) = run_forward(&c);
        let row = DT_RANK + 2 * c.n;
        let mut h = c.h0.clone().unwrap();
        let mut o = vec![f32::NAN; c.b * c.di];
        for t in 0..c.t {
            let at = |v: &[f32], width: usize| -> Vec<f32> {
                (0..c.b).flat_map(|b| v[(b * c.t + t) * width..(b * c.t + t + 1) * width].to_vec()).collect()
            };
            let (u, delta, bc, z) =
                (at(&c.u, c.di), at(&c.delta, c.di), at(&c.bc, row), at(c.z.as_ref().unwrap(), c.di));
            let p = Scan {
                batch: c.b,
                len: 1,
                channels: c.di,
                state: c.n,
                u: &u,
                delta: &delta,
                a: &c.a,
                bc: &bc,
                bc_layout: BcLayout::x_proj(1, DT_RANK, c.n),
                d: &c.d,
                z: Some(&z),
                start: None,
            };
            decode_step(&p, &mut h, &mut o);
            for b in 0..c.b {
                let want = &out[(b * c.t + t) * c.di..(b * c.t + t + 1) * c.di];
                assert!(want == &o[b * c.di..(b + 1) * c.di], "position {t}, row {b}");
            }
            if t == c.t - 1 {
                // A padded row: nothing changes.
                let before = h.clone();
                let start = [0usize, 1, 0];
                decode_step(&Scan { start: Some(&start), ..p }, &mut h, &mut o);
                assert!(h[c.di * c.n..2 * c.di * c.n] == before[c.di * c.n..2 * c.di * c.n]);
                assert!(o[c.di..2 * c.di].iter().all(|&v| v == 0.0));
            }
        }
        // Rows 0 and 2 took one more step after the comparison; row 1 did not.
        assert!(h[c.di * c.n..2 * c.di * c.n] == h_last[c.di * c.n..2 * c.di * c.n]);
    }
}
