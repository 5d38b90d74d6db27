//! Mamba-2's state-space duality (SSD) layer core, f32: per batch row b and head h, with a state
//! S of [P, N] (head dim P, state size N),
//!
//! ```text
//! S_t = exp(dt_t · A_h) · S_{t−1} + dt_t · x_t B_tᵀ,      y_t = S_t C_t + D_h · x_t
//! ```
//!
//! x_t [P] is head h's slice of the conv output, B_t and C_t [N] the slices of group
//! g = h / (H / G), dt_t = softplus(dt_raw + dt_bias) > 0 (see [`dt_fwd`]), A_h < 0.
//!
//! Layouts (all row-major):
//! - `xbc` [B, T, xbc_stride]: the conv output, each row [x (H·P) | B (G·N) | C (G·N) | unused],
//!   x of head h at columns h·P.., B of group g at H·P + g·N.., C of group g at H·P + G·N + g·N..
//!   The SSD reads x, B and C in place; their gradients go to `dxbc` of the same layout.
//! - `dt` [B, T, H] (post-softplus), `a` [H] (A = −exp(A_log)), `d` [H] (the skip D).
//! - `y` [B, T, H·P]; states (initial, final, decode) [B, H, P, N].
//! - `start` [B]: positions t < start[b] are left padding: dt there counts as 0 (the state passes
//!   through unchanged), their outputs are 0, and nothing (x, B, C, dt) there gets a gradient.
//!
//! Three implementations: [`ssd_reference`] / [`ssd_reference_bwd`], the plain recurrence step by
//! step accumulated in f64 (the test oracle; O(T·P·N) memory per (b, h) in the backward);
//! [`ssd_fwd`] / [`ssd_bwd`], the chunked SSD algorithm (chunks of [`CHUNK`] positions: within a
//! chunk the masked quadratic form (C Bᵀ ∘ decay ∘ dt) X, across chunks the state passed
//! on), its products on the `gemm` crate, one rayon task per (b, h) running its chunks in order, so
//! the results are the same bits whatever the thread count; and [`ssd_decode_step`].
//!
//! Chunked backward, per chunk (cum_i = Σ_{s ≤ i} dt_s·A from the chunk's start, M_ij =
//! (C_i·B_j)·exp(cum_i − cum_j)·dt_j for j ≤ i, w_j = exp(cum_L − cum_j)·dt_j, S_0 the state
//! entering the chunk, dS the gradient of the state leaving it):
//!
//! ```text
//! Y      = M X + diag(e^cum) C S_0ᵀ + D X          S_L = e^{cum_L} S_0 + (diag(w) X)ᵀ B
//! dX     = Mᵀ dY + diag(w) B dSᵀ + D dY             dM = dY Xᵀ (masked), dG = dM ∘ exp(cum_i − cum_j) dt_j
//! dC     = dG B + diag(e^cum) dY S_0                 dB = dGᵀ C + diag(w) X dS
//! dS_0   = e^{cum_L} dS + (diag(e^cum) dY)ᵀ C
//! ```
//!
//! and the gradients of dt and cum collected from every exp, then d(dt·A) = reverse cumsum of
//! dcum within the chunk. The states entering each chunk are recomputed by a forward pass over
//! the states alone (no outputs), O(T/L · P · N) memory per task.

use crate::chunks;
use crate::matmul::gemm_seq;
use crate::par::SharedMut;
use anyhow::{ensure, Result};
use rayon::prelude::*;

/// Positions per chunk of the chunked forward and backward (Mamba-2's and fla's choice).
pub const CHUNK: usize = 64;

/// One SSD problem: sizes and the inputs the forward and backward read.
#[derive(Clone, Copy, Debug)]
pub struct Ssd<'a> {
    pub batch: usize,
    pub seq: usize,
    /// H
    pub heads: usize,
    /// P
    pub head_dim: usize,
    /// N
    pub state: usize,
    /// G, a divisor of H: head h reads B and C of group h / (H / G).
    pub groups: usize,
    /// [B, T, xbc_stride] (see the module's doc).
    pub xbc: &'a [f32],
    /// Row stride of `xbc`, at least H·P + 2·G·N.
    pub xbc_stride: usize,
    /// [B, T, H], dt after softplus.
    pub dt: &'a [f32],
    /// [H], A = −exp(A_log).
    pub a: &'a [f32],
    /// [H], the skip connection D.
    pub d: &'a [f32],
    /// [B]: first real position of each row (left padding); none: all real.
    pub start: Option<&'a [usize]>,
}

/// Gradients of the SSD's inputs. Activation gradients are overwritten, parameter gradients (dA,
/// dD) are added to (accumulated, as rms_norm_bwd's dw).
pub struct SsdGrads<'a> {
    /// Layout of `xbc` ([B, T, xbc_stride]): the x, B and C columns of every row are overwritten
    /// (0 at padding); columns past H·P + 2·G·N are left as they are. dB and dC are summed over
    /// the group's heads.
    pub dxbc: &'a mut [f32],
    /// [B, T, H]: the gradient of the post-softplus dt ([`dt_bwd`] carries it on to dt_raw and
    /// dt_bias). 0 at padding.
    pub ddt: &'a mut [f32],
    /// [H], accumulated. The caller's dA_log = dA · A.
    pub da: &'a mut [f32],
    /// [H], accumulated.
    pub dd: &'a mut [f32],
    /// [B, H, P, N]: the gradient of the initial state (overwritten), when wanted.
    pub dinit: Option<&'a mut [f32]>,
}

impl Ssd<'_> {
    fn check(&self) -> Result<()> {
        let (b, t, h, p, n, g) = (self.batch, self.seq, self.heads, self.head_dim, self.state, self.groups);
        ensure!(g > 0 && h.is_multiple_of(g), "ssd: groups {g} must divide heads {h}");
        ensure!(p > 0 && n > 0, "ssd: head_dim and state must be positive");
        let width = h * p + 2 * g * n;
        ensure!(self.xbc_stride >= width, "ssd: xbc_stride {} < H·P + 2·G·N = {width}", self.xbc_stride);
        let need = if b * t == 0 { 0 } else { (b * t - 1) * self.xbc_stride + width };
        ensure!(self.xbc.len() >= need, "ssd: xbc holds {} values, needs {need}", self.xbc.len());
        ensure!(self.dt.len() == b * t * h, "ssd: dt has {} values, not B·T·H = {}", self.dt.len(), b * t * h);
        ensure!(self.a.len() == h && self.d.len() == h, "ssd: A and D must have H = {h} values");
        if let Some(s) = self.start {
            ensure!(s.len() == b, "ssd: start has {} rows, not B = {b}", s.len());
        }
        Ok(())
    }
    fn state_len(&self) -> usize {
        self.batch * self.heads * self.head_dim * self.state
    }
    fn check_state(&self, s: usize, what: &str) -> Result<()> {
        ensure!(s == self.state_len(), "ssd: {what} has {s} values, not B·H·P·N = {}", self.state_len());
        Ok(())
    }
    fn start(&self, b: usize) -> usize {
        self.start.map_or(0, |s| s[b])
    }
    fn group(&self, h: usize) -> usize {
        h / (self.heads / self.groups)
    }
    /// Offsets in xbc of row (b, t)'s x of head h, B and C of head h's group.
    fn x_at(&self, b: usize, t: usize, h: usize) -> usize {
        (b * self.seq + t) * self.xbc_stride + h * self.head_dim
    }
    fn b_at(&self, b: usize, t: usize, g: usize) -> usize {
        (b * self.seq + t) * self.xbc_stride + self.heads * self.head_dim + g * self.state
    }
    fn c_at(&self, b: usize, t: usize, g: usize) -> usize {
        self.b_at(b, t, g) + self.groups * self.state
    }
    /// dt at (b, t, h), 0 at padding.
    fn dt_at(&self, b: usize, t: usize, h: usize) -> f32 {
        if t < self.start(b) {
            0.0
        } else {
            self.dt[(b * self.seq + t) * self.heads + h]
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The oracle: the recurrence step by step, in f64.

/// The oracle's inputs in f64: xbc, dt [B, T, H] as the forward reads it, A, D and the initial
/// state (none: zeros).
#[derive(Clone, Copy)]
struct In64<'a> {
    xbc: &'a [f64],
    dt: &'a [f64],
    a: &'a [f64],
    d: &'a [f64],
    init: Option<&'a [f64]>,
}

/// `f` on f64 copies of a problem's inputs and initial state.
fn with_in64<R>(p: &Ssd, init: Option<&[f32]>, f: impl FnOnce(&In64) -> R) -> R {
    let (xbc, dt, a, d, init) = (to64(p.xbc), dt64(p), to64(p.a), to64(p.d), init.map(to64));
    f(&In64 { xbc: &xbc, dt: &dt, a: &a, d: &d, init: init.as_deref() })
}

/// dt per position [B, T, H] as the forward reads it (0 at padding), in f64.
fn dt64(p: &Ssd) -> Vec<f64> {
    (0..p.dt.len()).map(|i| p.dt_at(i / (p.seq * p.heads), i / p.heads % p.seq, i % p.heads) as f64).collect()
}

/// The recurrence in f64 on f64 copies of the inputs: y [B, T, H·P], final state [B, H, P, N].
fn ref_fwd64(p: &Ssd, x: &In64) -> (Vec<f64>, Vec<f64>) {
    let In64 { xbc, dt, a, d, init } = *x;
    let (bsz, t, h, pd, n) = (p.batch, p.seq, p.heads, p.head_dim, p.state);
    let mut y = vec![0.0; bsz * t * h * pd];
    let mut fin = vec![0.0; bsz * h * pd * n];
    for b in 0..bsz {
        for hi in 0..h {
            let g = p.group(hi);
            let s = &mut fin[(b * h + hi) * pd * n..][..pd * n];
            if let Some(i) = init {
                s.copy_from_slice(&i[(b * h + hi) * pd * n..][..pd * n]);
            }
            for ti in p.start(b)..t {
                let dtv = dt[(b * t + ti) * h + hi];
                let decay = (dtv * a[hi]).exp();
                let (x, bv, cv) =
                    (&xbc[p.x_at(b, ti, hi)..][..pd], &xbc[p.b_at(b, ti, g)..][..n], &xbc[p.c_at(b, ti, g)..][..n]);
                let yr = &mut y[((b * t + ti) * h + hi) * pd..][..pd];
                for pi in 0..pd {
                    let sr = &mut s[pi * n..(pi + 1) * n];
                    let mut acc = 0.0;
                    for ni in 0..n {
                        sr[ni] = decay * sr[ni] + dtv * x[pi] * bv[ni];
                        acc += sr[ni] * cv[ni];
                    }
                    yr[pi] = acc + d[hi] * x[pi];
                }
            }
        }
    }
    (y, fin)
}

/// Gradients of the f64 recurrence, dxbc over the xbc layout (other columns 0).
struct Grads64 {
    dxbc: Vec<f64>,
    ddt: Vec<f64>,
    da: Vec<f64>,
    /// Per head, √Σ of its dA terms squared (one term per position: dt · decay · ∂ℓ/∂decay).
    /// dA's terms have both signs and cancel, so a computed dA carries an error of the terms'
    /// relative rounding times this, not times |dA|: the scale the GPU check measures it on.
    da_terms_l2: Vec<f64>,
    dd: Vec<f64>,
    dinit: Vec<f64>,
}

/// Gradients of the f64 recurrence, by reverse-time recurrence over the stored states.
fn ref_bwd64(p: &Ssd, x: &In64, dy: &[f64], dfinal: Option<&[f64]>) -> Grads64 {
    let In64 { xbc, dt, a, d, init } = *x;
    let (bsz, t, h, pd, n) = (p.batch, p.seq, p.heads, p.head_dim, p.state);
    let mut dxbc = vec![0.0; xbc.len()];
    let mut ddt = vec![0.0; dt.len()];
    let (mut da, mut da_sq, mut dd) = (vec![0.0; h], vec![0.0f64; h], vec![0.0; h]);
    let mut dinit = vec![0.0; bsz * h * pd * n];
    for b in 0..bsz {
        let st = p.start(b);
        for hi in 0..h {
            let g = p.group(hi);
            // states[k] = S after position st + k − 1 (states[0]: the initial state).
            let mut states = vec![vec![0.0; pd * n]; t - st.min(t) + 1];
            if let Some(i) = init {
                states[0].copy_from_slice(&i[(b * h + hi) * pd * n..][..pd * n]);
            }
            for ti in st..t {
                let dtv = dt[(b * t + ti) * h + hi];
                let decay = (dtv * a[hi]).exp();
                let (x, bv) = (&xbc[p.x_at(b, ti, hi)..][..pd], &xbc[p.b_at(b, ti, g)..][..n]);
                let k = ti - st;
                let mut next = states[k].clone();
                for pi in 0..pd {
                    for ni in 0..n {
                        next[pi * n + ni] = decay * next[pi * n + ni] + dtv * x[pi] * bv[ni];
                    }
                }
                states[k + 1] = next;
            }
            let mut ds = match dfinal {
                Some(f) => f[(b * h + hi) * pd * n..][..pd * n].to_vec(),
                None => vec![0.0; pd * n],
            };
            for ti in (st..t).rev() {
                let k = ti - st;
                let dtv = dt[(b * t + ti) * h + hi];
                let decay = (dtv * a[hi]).exp();
                let (xo, bo, co) = (p.x_at(b, ti, hi), p.b_at(b, ti, g), p.c_at(b, ti, g));
                let dyr = &dy[((b * t + ti) * h + hi) * pd..][..pd];
                let (s_new, s_old) = (&states[k + 1], &states[k]);
                // y_t = S_t C_t + D x_t.
                for pi in 0..pd {
                    for ni in 0..n {
                        ds[pi * n + ni] += dyr[pi] * xbc[co + ni];
                        dxbc[co + ni] += s_new[pi * n + ni] * dyr[pi];
                    }
                    dxbc[xo + pi] += d[hi] * dyr[pi];
                    dd[hi] += xbc[xo + pi] * dyr[pi];
                }
                // S_t = decay · S_{t−1} + dt · x Bᵀ.
                let mut ddecay = 0.0;
                let mut ddtv = 0.0;
                for pi in 0..pd {
                    for ni in 0..n {
                        let g_ = ds[pi * n + ni];
                        ddecay += g_ * s_old[pi * n + ni];
                        ddtv += g_ * xbc[xo + pi] * xbc[bo + ni];
                        dxbc[xo + pi] += dtv * g_ * xbc[bo + ni];
                        dxbc[bo + ni] += dtv * g_ * xbc[xo + pi];
                        ds[pi * n + ni] = decay * g_;
                    }
                }
                ddt[(b * t + ti) * h + hi] = ddtv + ddecay * decay * a[hi];
                let term = ddecay * decay * dtv;
                da[hi] += term;
                da_sq[hi] += term * term;
            }
            dinit[(b * h + hi) * pd * n..][..pd * n].copy_from_slice(&ds);
        }
    }
    Grads64 { dxbc, ddt, da, da_terms_l2: da_sq.iter().map(|v| v.sqrt()).collect(), dd, dinit }
}

fn to64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// The oracle's forward: the recurrence step by step, accumulated in f64, rounded to f32 at the
/// end. y [B, T, H·P]; `init` and `final_state` [B, H, P, N] (none: a zero initial state / not
/// wanted). Padded positions (dt treated as 0) output 0.
pub fn ssd_reference(p: &Ssd, y: &mut [f32], init: Option<&[f32]>, final_state: Option<&mut [f32]>) -> Result<()> {
    p.check()?;
    check_io(p, y, init, final_state.as_deref())?;
    let (yr, fin) = with_in64(p, init, |x| ref_fwd64(p, x));
    y.iter_mut().zip(&yr).for_each(|(o, &v)| *o = v as f32);
    if let Some(f) = final_state {
        f.iter_mut().zip(&fin).for_each(|(o, &v)| *o = v as f32);
    }
    Ok(())
}

fn ref_bwd64_of(p: &Ssd, dy: &[f32], init: Option<&[f32]>, dfinal: Option<&[f32]>) -> Grads64 {
    with_in64(p, init, |x| ref_bwd64(p, x, &to64(dy), dfinal.map(to64).as_deref()))
}

/// The oracle's dA (f64) and, per head, the L2 norm of the per-position terms it sums (see
/// `Grads64::da_terms_l2`): what a low-precision dA's error is measured against.
pub fn ssd_reference_da(
    p: &Ssd,
    dy: &[f32],
    init: Option<&[f32]>,
    dfinal: Option<&[f32]>,
) -> Result<(Vec<f64>, Vec<f64>)> {
    p.check()?;
    check_io(p, dy, init, dfinal)?;
    let r = ref_bwd64_of(p, dy, init, dfinal);
    Ok((r.da, r.da_terms_l2))
}

/// The oracle's backward (reverse-time recurrence, f64, O(T·P·N) memory per (b, h): tests only).
/// Same contract as [`ssd_bwd`].
pub fn ssd_reference_bwd(p: &Ssd, dy: &[f32], init: Option<&[f32]>, dfinal: Option<&[f32]>, g: SsdGrads) -> Result<()> {
    p.check()?;
    check_grads(p, dy, init, dfinal, &g)?;
    let Grads64 { dxbc: dx, ddt, da, dd, dinit, .. } = ref_bwd64_of(p, dy, init, dfinal);
    let width = p.heads * p.head_dim + 2 * p.groups * p.state;
    for r in 0..p.batch * p.seq {
        for c in 0..width {
            g.dxbc[r * p.xbc_stride + c] = dx[r * p.xbc_stride + c] as f32;
        }
    }
    g.ddt.iter_mut().zip(&ddt).for_each(|(o, &v)| *o = v as f32);
    g.da.iter_mut().zip(&da).for_each(|(o, &v)| *o += v as f32);
    g.dd.iter_mut().zip(&dd).for_each(|(o, &v)| *o += v as f32);
    if let Some(di) = g.dinit {
        di.iter_mut().zip(&dinit).for_each(|(o, &v)| *o = v as f32);
    }
    Ok(())
}

fn check_io(p: &Ssd, y: &[f32], init: Option<&[f32]>, fin: Option<&[f32]>) -> Result<()> {
    let ny = p.batch * p.seq * p.heads * p.head_dim;
    ensure!(y.len() == ny, "ssd: y has {} values, not B·T·H·P = {ny}", y.len());
    if let Some(i) = init {
        p.check_state(i.len(), "init")?;
    }
    if let Some(f) = fin {
        p.check_state(f.len(), "final_state")?;
    }
    Ok(())
}

fn check_grads(p: &Ssd, dy: &[f32], init: Option<&[f32]>, dfinal: Option<&[f32]>, g: &SsdGrads) -> Result<()> {
    check_io(p, dy, init, dfinal)?;
    let width = p.heads * p.head_dim + 2 * p.groups * p.state;
    let need = if p.batch * p.seq == 0 { 0 } else { (p.batch * p.seq - 1) * p.xbc_stride + width };
    ensure!(g.dxbc.len() >= need, "ssd: dxbc holds {} values, needs {need}", g.dxbc.len());
    ensure!(g.ddt.len() == p.dt.len(), "ssd: ddt has {} values, not B·T·H", g.ddt.len());
    ensure!(g.da.len() == p.heads && g.dd.len() == p.heads, "ssd: dA and dD must have H values");
    if let Some(d) = &g.dinit {
        p.check_state(d.len(), "dinit")?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The chunked algorithm.

/// C Bᵀ of every (batch row, group, chunk): [B, G, chunks, L, L] (rows and columns past a short
/// last chunk unused). Shared by the group's heads.
fn chunk_cb(p: &Ssd, l: usize) -> Vec<f32> {
    let nch = p.seq.div_ceil(l);
    let mut cb = vec![0.0f32; p.batch * p.groups * nch * l * l];
    cb.par_chunks_mut(l * l).enumerate().for_each(|(idx, dst)| {
        let (b, g, c) = (idx / (p.groups * nch), idx / nch % p.groups, idx % nch);
        let t0 = c * l;
        let len = l.min(p.seq - t0);
        // SAFETY: C and B rows t0..t0 + len of (b, g) lie in xbc (checked); dst holds l × l.
        unsafe {
            gemm_seq(
                len,
                len,
                p.state,
                dst.as_mut_ptr(),
                l,
                false,
                p.xbc.as_ptr().add(p.c_at(b, t0, g)),
                p.xbc_stride,
                1,
                p.xbc.as_ptr().add(p.b_at(b, t0, g)),
                1,
                p.xbc_stride,
            )
        }
    });
    cb
}

/// dt (0 at padding) and cum = inclusive prefix sum of dt·A of positions t0..t0 + len.
fn chunk_decay(p: &Ssd, b: usize, h: usize, t0: usize, len: usize, dtm: &mut [f32], cum: &mut [f32]) {
    let mut acc = 0.0f32;
    for i in 0..len {
        dtm[i] = p.dt_at(b, t0 + i, h);
        acc += dtm[i] * p.a[h];
        cum[i] = acc;
    }
}

/// xw [len, P] = diag(e^{cum_L − cum_j}·dt_j) X of positions t0..t0 + len (len = cum.len() =
/// dtm.len()): the chunk's inputs as they reach the state at its end.
fn decayed_x(p: &Ssd, b: usize, hi: usize, t0: usize, cum: &[f32], dtm: &[f32], xw: &mut [f32]) {
    let (pd, len) = (p.head_dim, cum.len());
    for j in 0..len {
        let w = (cum[len - 1] - cum[j]).exp() * dtm[j];
        let x = &p.xbc[p.x_at(b, t0 + j, hi)..][..pd];
        for pi in 0..pd {
            xw[j * pd + pi] = w * x[pi];
        }
    }
}

/// The chunked forward: y [B, T, H·P] (0 at padding); `init` [B, H, P, N] or none (zeros);
/// `final_state` [B, H, P, N], the state after the last position, when wanted.
pub fn ssd_fwd(p: &Ssd, y: &mut [f32], init: Option<&[f32]>, final_state: Option<&mut [f32]>) -> Result<()> {
    ssd_fwd_chunked(p, y, init, final_state, CHUNK)
}

fn ssd_fwd_chunked(
    p: &Ssd,
    y: &mut [f32],
    init: Option<&[f32]>,
    final_state: Option<&mut [f32]>,
    l: usize,
) -> Result<()> {
    p.check()?;
    check_io(p, y, init, final_state.as_deref())?;
    let (h, pd, n, t) = (p.heads, p.head_dim, p.state, p.seq);
    let nch = t.div_ceil(l);
    let cb = chunk_cb(p, l);
    let yp = SharedMut::new(y);
    let fp = final_state.map(SharedMut::new);
    (0..p.batch * h).into_par_iter().for_each(|bh| {
        let (b, hi) = (bh / h, bh % h);
        let g = p.group(hi);
        let mut s = match init {
            Some(i) => i[bh * pd * n..][..pd * n].to_vec(),
            None => vec![0.0f32; pd * n],
        };
        let (mut dtm, mut cum) = (vec![0.0f32; l], vec![0.0f32; l]);
        let mut m = vec![0.0f32; l * l];
        let mut yb = vec![0.0f32; l * pd];
        let mut cs = vec![0.0f32; l * n];
        let mut xw = vec![0.0f32; l * pd];
        let st = p.start(b);
        for (c, (t0, len)) in chunks(t, l).enumerate() {
            chunk_decay(p, b, hi, t0, len, &mut dtm, &mut cum);
            let cbc = &cb[((b * p.groups + g) * nch + c) * l * l..][..l * l];
            for i in 0..len {
                for j in 0..=i {
                    m[i * l + j] = cbc[i * l + j] * (cum[i] - cum[j]).exp() * dtm[j];
                }
                m[i * l + i + 1..i * l + len].fill(0.0);
            }
            let xo = p.x_at(b, t0, hi);
            for i in 0..len {
                let e = cum[i].exp();
                let cr = &p.xbc[p.c_at(b, t0 + i, g)..][..n];
                for (o, &v) in cs[i * n..(i + 1) * n].iter_mut().zip(cr) {
                    *o = e * v;
                }
            }
            // SAFETY: every operand lies in its buffer (sizes checked); yb, s are this task's.
            unsafe {
                // Y = M X (intra-chunk) + diag(e^cum) C S_0ᵀ (the state entering the chunk).
                gemm_seq(
                    len,
                    pd,
                    len,
                    yb.as_mut_ptr(),
                    pd,
                    false,
                    m.as_ptr(),
                    l,
                    1,
                    p.xbc.as_ptr().add(xo),
                    p.xbc_stride,
                    1,
                );
                gemm_seq(len, pd, n, yb.as_mut_ptr(), pd, true, cs.as_ptr(), n, 1, s.as_ptr(), 1, n);
            }
            for i in 0..len {
                // SAFETY: this task alone writes head hi's columns of y.
                let yr = unsafe { yp.slice(((b * t + t0 + i) * h + hi) * pd, pd) };
                if t0 + i < st {
                    yr.fill(0.0);
                    continue;
                }
                let x = &p.xbc[p.x_at(b, t0 + i, hi)..][..pd];
                for pi in 0..pd {
                    yr[pi] = yb[i * pd + pi] + p.d[hi] * x[pi];
                }
            }
            // S_L = e^{cum_L} S_0 + (diag(w) X)ᵀ B.
            let decay = cum[len - 1].exp();
            s.iter_mut().for_each(|v| *v *= decay);
            decayed_x(p, b, hi, t0, &cum[..len], &dtm[..len], &mut xw);
            // SAFETY: as above.
            unsafe {
                let bo = p.b_at(b, t0, g);
                gemm_seq(
                    pd,
                    n,
                    len,
                    s.as_mut_ptr(),
                    n,
                    true,
                    xw.as_ptr(),
                    1,
                    pd,
                    p.xbc.as_ptr().add(bo),
                    p.xbc_stride,
                    1,
                );
            }
        }
        if let Some(fp) = &fp {
            // SAFETY: this task alone writes state (b, hi).
            unsafe { fp.slice(bh * pd * n, pd * n) }.copy_from_slice(&s);
        }
    });
    Ok(())
}

/// The chunked backward. dy [B, T, H·P] is the gradient of y (its padded rows are ignored),
/// `init` as given to the forward, `dfinal` [B, H, P, N] the gradient of the final state (none:
/// 0, as in training). Writes `g` as its fields' docs say. Deterministic: per (b, h) one task;
/// dB and dC go through a per-head buffer [B, H, T, N] each and are summed over the group's heads
/// in head order.
pub fn ssd_bwd(p: &Ssd, dy: &[f32], init: Option<&[f32]>, dfinal: Option<&[f32]>, g: SsdGrads) -> Result<()> {
    ssd_bwd_chunked(p, dy, init, dfinal, g, CHUNK)
}

fn ssd_bwd_chunked(
    p: &Ssd,
    dy: &[f32],
    init: Option<&[f32]>,
    dfinal: Option<&[f32]>,
    g: SsdGrads,
    l: usize,
) -> Result<()> {
    p.check()?;
    check_grads(p, dy, init, dfinal, &g)?;
    let (bsz, h, pd, n, t) = (p.batch, p.heads, p.head_dim, p.state, p.seq);
    let nch = t.div_ceil(l);
    let cb = chunk_cb(p, l);
    // Per-head dB and dC, [B, H, T, N].
    let mut dbh = vec![0.0f32; bsz * h * t * n];
    let mut dch = vec![0.0f32; bsz * h * t * n];
    let mut dap = vec![0.0f32; bsz * h];
    let mut ddp = vec![0.0f32; bsz * h];
    let dxp = SharedMut::new(g.dxbc);
    let ddtp = SharedMut::new(g.ddt);
    let dip = g.dinit.map(SharedMut::new);
    let (dbhp, dchp) = (SharedMut::new(&mut dbh), SharedMut::new(&mut dch));
    let (dapp, ddpp) = (SharedMut::new(&mut dap), SharedMut::new(&mut ddp));
    (0..bsz * h).into_par_iter().for_each(|bh| {
        let (b, hi) = (bh / h, bh % h);
        let gi = p.group(hi);
        let st = p.start(b);
        let (mut dtm, mut cum) = (vec![0.0f32; l], vec![0.0f32; l]);
        let mut xw = vec![0.0f32; l * pd];
        // The states entering each chunk.
        let mut states = vec![0.0f32; nch * pd * n];
        if let Some(i) = init {
            states[..pd * n].copy_from_slice(&i[bh * pd * n..][..pd * n]);
        }
        for (c, (t0, len)) in chunks(t, l).enumerate().take(nch.saturating_sub(1)) {
            chunk_decay(p, b, hi, t0, len, &mut dtm, &mut cum);
            let (cur, next) = states[c * pd * n..(c + 2) * pd * n].split_at_mut(pd * n);
            let decay = cum[len - 1].exp();
            for (o, &v) in next.iter_mut().zip(cur.iter()) {
                *o = decay * v;
            }
            decayed_x(p, b, hi, t0, &cum[..len], &dtm[..len], &mut xw);
            // SAFETY: operands in bounds; next is this task's.
            unsafe {
                gemm_seq(
                    pd,
                    n,
                    len,
                    next.as_mut_ptr(),
                    n,
                    true,
                    xw.as_ptr(),
                    1,
                    pd,
                    p.xbc.as_ptr().add(p.b_at(b, t0, gi)),
                    p.xbc_stride,
                    1,
                );
            }
        }
        let mut ds = match dfinal {
            Some(f) => f[bh * pd * n..][..pd * n].to_vec(),
            None => vec![0.0f32; pd * n],
        };
        let mut dsacc = vec![0.0f32; pd * n];
        let (mut ee, mut m, mut dm, mut dg) =
            (vec![0.0f32; l * l], vec![0.0f32; l * l], vec![0.0f32; l * l], vec![0.0f32; l * l]);
        let (mut dyc, mut dye, mut dxc) = (vec![0.0f32; l * pd], vec![0.0f32; l * pd], vec![0.0f32; l * pd]);
        let (mut yint, mut u) = (vec![0.0f32; l * pd], vec![0.0f32; l * pd]);
        let (mut dcl, mut dbl) = (vec![0.0f32; l * n], vec![0.0f32; l * n]);
        let (mut dcum, mut ddtc, mut w) = (vec![0.0f32; l], vec![0.0f32; l], vec![0.0f32; l]);
        let (mut da_acc, mut dd_acc) = (0.0f32, 0.0f32);
        let (a, dskip) = (p.a[hi], p.d[hi]);
        for (c, (t0, len)) in chunks(t, l).enumerate().rev() {
            chunk_decay(p, b, hi, t0, len, &mut dtm, &mut cum);
            let cbc = &cb[((b * p.groups + gi) * nch + c) * l * l..][..l * l];
            for i in 0..len {
                for j in 0..=i {
                    let e = (cum[i] - cum[j]).exp();
                    ee[i * l + j] = e;
                    m[i * l + j] = cbc[i * l + j] * e * dtm[j];
                }
                m[i * l + i + 1..i * l + len].fill(0.0);
                let dst = &mut dyc[i * pd..(i + 1) * pd];
                if t0 + i < st {
                    dst.fill(0.0);
                } else {
                    dst.copy_from_slice(&dy[((b * t + t0 + i) * h + hi) * pd..][..pd]);
                }
            }
            let (xo, bo, co) = (p.x_at(b, t0, hi), p.b_at(b, t0, gi), p.c_at(b, t0, gi));
            let (xs, xb, xc) = (unsafe { p.xbc.as_ptr().add(xo) }, unsafe { p.xbc.as_ptr().add(bo) }, unsafe {
                p.xbc.as_ptr().add(co)
            });
            let rs = p.xbc_stride;
            let sp = &states[c * pd * n..(c + 1) * pd * n];
            // SAFETY (the products below): operands lie in xbc (checked) or this task's buffers.
            unsafe {
                // dX = Mᵀ dY; dM = dY Xᵀ.
                gemm_seq(len, pd, len, dxc.as_mut_ptr(), pd, false, m.as_ptr(), 1, l, dyc.as_ptr(), pd, 1);
                gemm_seq(len, len, pd, dm.as_mut_ptr(), l, false, dyc.as_ptr(), pd, 1, xs, 1, rs);
            }
            dcum[..len].fill(0.0);
            ddtc[..len].fill(0.0);
            for i in 0..len {
                for j in 0..=i {
                    let (dmv, e) = (dm[i * l + j], ee[i * l + j]);
                    dg[i * l + j] = dmv * e * dtm[j];
                    ddtc[j] += dmv * cbc[i * l + j] * e;
                    let q = dmv * m[i * l + j];
                    dcum[i] += q;
                    dcum[j] -= q;
                }
                dg[i * l + i + 1..i * l + len].fill(0.0);
                let e = cum[i].exp();
                for pi in 0..pd {
                    dye[i * pd + pi] = e * dyc[i * pd + pi];
                }
            }
            unsafe {
                // dC = dG B + diag(e^cum) dY S_0; dB = dGᵀ C.
                gemm_seq(len, n, len, dcl.as_mut_ptr(), n, false, dg.as_ptr(), l, 1, xb, rs, 1);
                gemm_seq(len, n, pd, dcl.as_mut_ptr(), n, true, dye.as_ptr(), pd, 1, sp.as_ptr(), n, 1);
                gemm_seq(len, n, len, dbl.as_mut_ptr(), n, false, dg.as_ptr(), 1, l, xc, rs, 1);
                // The inter-chunk output C S_0ᵀ (for dcum), and (diag(e^cum) dY)ᵀ C for dS_0.
                gemm_seq(len, pd, n, yint.as_mut_ptr(), pd, false, xc, rs, 1, sp.as_ptr(), 1, n);
                gemm_seq(pd, n, len, dsacc.as_mut_ptr(), n, false, dye.as_ptr(), 1, pd, xc, rs, 1);
                // U = B dSᵀ.
                gemm_seq(len, pd, n, u.as_mut_ptr(), pd, false, xb, rs, 1, ds.as_ptr(), 1, n);
            }
            for i in 0..len {
                let mut acc = 0.0f32;
                for pi in 0..pd {
                    acc += dye[i * pd + pi] * yint[i * pd + pi];
                }
                dcum[i] += acc;
            }
            let last = cum[len - 1];
            for j in 0..len {
                let e = (last - cum[j]).exp();
                w[j] = e * dtm[j];
                let x = &p.xbc[p.x_at(b, t0 + j, hi)..][..pd];
                let mut dw = 0.0f32;
                for pi in 0..pd {
                    dw += x[pi] * u[j * pd + pi];
                    dxc[j * pd + pi] += w[j] * u[j * pd + pi];
                    xw[j * pd + pi] = w[j] * x[pi];
                }
                ddtc[j] += dw * e;
                dcum[len - 1] += dw * w[j];
                dcum[j] -= dw * w[j];
            }
            unsafe {
                // dB += diag(w) X dS.
                gemm_seq(len, n, pd, dbl.as_mut_ptr(), n, true, xw.as_ptr(), pd, 1, ds.as_ptr(), n, 1);
            }
            let decay = last.exp();
            let mut sdot = 0.0f32;
            for (dv, sv) in ds.iter().zip(sp) {
                sdot += dv * sv;
            }
            dcum[len - 1] += decay * sdot;
            for (dv, &av) in ds.iter_mut().zip(&dsacc) {
                *dv = decay * *dv + av;
            }
            // The skip D, then cum → dt·A (reverse prefix sum within the chunk).
            for i in 0..len {
                let x = &p.xbc[p.x_at(b, t0 + i, hi)..][..pd];
                for pi in 0..pd {
                    dxc[i * pd + pi] += dskip * dyc[i * pd + pi];
                    dd_acc += x[pi] * dyc[i * pd + pi];
                }
            }
            let mut acc = 0.0f32;
            for s in (0..len).rev() {
                acc += dcum[s];
                ddtc[s] += a * acc;
                da_acc += dtm[s] * acc;
            }
            for i in 0..len {
                let tt = t0 + i;
                let pad = tt < st;
                // SAFETY: this task alone writes head hi's x columns, ddt and per-head dB/dC.
                unsafe {
                    *ddtp.get((b * t + tt) * h + hi) = if pad { 0.0 } else { ddtc[i] };
                    let dx = dxp.slice((b * t + tt) * rs + hi * pd, pd);
                    dx.copy_from_slice(&dxc[i * pd..(i + 1) * pd]);
                    dbhp.slice((bh * t + tt) * n, n).copy_from_slice(&dbl[i * n..(i + 1) * n]);
                    dchp.slice((bh * t + tt) * n, n).copy_from_slice(&dcl[i * n..(i + 1) * n]);
                }
            }
        }
        // SAFETY: this task alone writes entry bh.
        unsafe {
            *dapp.get(bh) = da_acc;
            *ddpp.get(bh) = dd_acc;
            if let Some(dip) = &dip {
                dip.slice(bh * pd * n, pd * n).copy_from_slice(&ds);
            }
        }
    });
    // dB, dC of each group: the sum over its heads, in head order.
    let hpg = h / p.groups;
    (0..bsz * t).into_par_iter().for_each(|r| {
        let (b, tt) = (r / t, r % t);
        for gi in 0..p.groups {
            // SAFETY: this task alone writes row r's B and C columns.
            let (db, dc) = unsafe { (dxp.slice(p.b_at(b, tt, gi), n), dxp.slice(p.c_at(b, tt, gi), n)) };
            db.fill(0.0);
            dc.fill(0.0);
            for hi in gi * hpg..(gi + 1) * hpg {
                let o = ((b * h + hi) * t + tt) * n;
                for k in 0..n {
                    db[k] += dbh[o + k];
                    dc[k] += dch[o + k];
                }
            }
        }
    });
    for hi in 0..h {
        for b in 0..bsz {
            g.da[hi] += dap[b * h + hi];
            g.dd[hi] += ddp[b * h + hi];
        }
    }
    Ok(())
}

/// One decoding step: `p.seq` must be 1 (xbc [B, xbc_stride], dt [B, H]); `state` [B, H, P, N] is
/// updated in place, y [B, H·P] written. A row with start[b] > 0 is padding: y = 0, its state
/// unchanged.
pub fn ssd_decode_step(p: &Ssd, state: &mut [f32], y: &mut [f32]) -> Result<()> {
    p.check()?;
    ensure!(p.seq == 1, "ssd_decode_step: one position per row, not {}", p.seq);
    check_io(p, y, Some(state), None)?;
    let (h, pd, n) = (p.heads, p.head_dim, p.state);
    state.par_chunks_mut(pd * n).zip(y.par_chunks_mut(pd)).enumerate().for_each(|(bh, (s, yr))| {
        let (b, hi) = (bh / h, bh % h);
        if p.start(b) > 0 {
            yr.fill(0.0);
            return;
        }
        let g = p.group(hi);
        let dtv = p.dt[b * h + hi];
        let decay = (dtv * p.a[hi]).exp();
        let (x, bv, cv) =
            (&p.xbc[p.x_at(b, 0, hi)..][..pd], &p.xbc[p.b_at(b, 0, g)..][..n], &p.xbc[p.c_at(b, 0, g)..][..n]);
        for pi in 0..pd {
            let sr = &mut s[pi * n..(pi + 1) * n];
            let xv = dtv * x[pi];
            let mut acc = 0.0f32;
            for ni in 0..n {
                sr[ni] = decay * sr[ni] + xv * bv[ni];
                acc += sr[ni] * cv[ni];
            }
            yr[pi] = acc + p.d[hi] * x[pi];
        }
    });
    Ok(())
}

/// dt [rows, H] = softplus(dt_raw + dt_bias[h]) (PyTorch's softplus, linear above 20). dt_raw's
/// rows have stride `raw_stride` ≥ H, e.g. `&zxbcdt[2·Di + 2·G·N..]` with the in_proj width.
pub fn dt_fwd(dt: &mut [f32], dt_raw: &[f32], raw_stride: usize, dt_bias: &[f32]) -> Result<()> {
    let h = dt_bias.len();
    check_dt(dt.len(), dt_raw.len(), raw_stride, h)?;
    dt.par_chunks_mut(h).enumerate().for_each(|(r, o)| {
        for k in 0..h {
            o[k] = softplus(dt_raw[r * raw_stride + k] + dt_bias[k]);
        }
    });
    Ok(())
}

/// Backward of [`dt_fwd`]: ddt_raw (rows of stride `raw_stride`, H columns overwritten, others
/// left) = ddt · sigmoid(dt_raw + dt_bias); ddt_bias [H] accumulated (summed over rows in order).
pub fn dt_bwd(
    ddt_raw: &mut [f32],
    raw_stride: usize,
    ddt_bias: &mut [f32],
    ddt: &[f32],
    dt_raw: &[f32],
    dt_bias: &[f32],
) -> Result<()> {
    let h = dt_bias.len();
    check_dt(ddt.len(), dt_raw.len(), raw_stride, h)?;
    check_dt(ddt.len(), ddt_raw.len(), raw_stride, h)?;
    ensure!(ddt_bias.len() == h, "dt_bwd: ddt_bias has {} values, not H = {h}", ddt_bias.len());
    let rows = ddt.len() / h;
    for r in 0..rows {
        for k in 0..h {
            let v = dt_raw[r * raw_stride + k] + dt_bias[k];
            let gv = ddt[r * h + k] * if v > 20.0 { 1.0 } else { crate::scalar::sigmoid(v) };
            ddt_raw[r * raw_stride + k] = gv;
            ddt_bias[k] += gv;
        }
    }
    Ok(())
}

fn check_dt(n: usize, raw: usize, raw_stride: usize, h: usize) -> Result<()> {
    ensure!(h > 0 && n.is_multiple_of(h), "dt: {n} values are not rows of H = {h}");
    ensure!(raw_stride >= h, "dt: raw_stride {raw_stride} < H = {h}");
    let rows = n / h;
    let need = crate::strided_span(rows, raw_stride, h);
    ensure!(raw >= need, "dt: dt_raw holds {raw} values, needs {need}");
    Ok(())
}

fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.max(0.0) + (-x.abs()).exp().ln_1p()
    }
}

#[cfg(test)]
mod tests;
