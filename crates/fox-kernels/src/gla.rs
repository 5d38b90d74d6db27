//! Gated linear attention with a per-channel forget gate (GLA; HGRN2's token mixer, Qin et al.
//! 2024, as fla's `chunk_gla` computes it), f32: per batch row b and head h, with a state S of
//! [K, V],
//!
//! ```text
//! S_t = Diag(exp(g_t)) · S_{t−1} + k_t v_tᵀ,      o_t = scale · S_tᵀ q_t
//! ```
//!
//! with q_t, k_t and the log forget gate g_t ≤ 0 [K] (HGRN2: k = 1 − exp(g), the input as v),
//! v_t [V].
//!
//! Layouts (row-major): q, k and g [B, T, H, K]; v and o [B, T, H, V]; states (initial, final,
//! decode) [B, H, K, V]. `start` [B]: positions t < start[b] are left padding: the state passes
//! through them unchanged, their outputs are 0 and nothing there gets a gradient.
//!
//! Two implementations: the plain recurrence step by step in f64 (`reference`, the tests'
//! oracle) and [`gla_fwd`] / [`gla_bwd`], the chunked form: within a chunk of L = [`CHUNK`]
//! positions (G_i = Σ_{s ≤ i} g_s per channel from the chunk's start, S_0 the state entering it),
//!
//! ```text
//! A_ij = Σ_c q_ic k_jc e^{G_ic − G_jc}   (j ≤ i)
//! o_i  = scale · (Σ_c q_ic e^{G_ic} S_0[c, :] + Σ_{j ≤ i} A_ij v_j)
//! S_L[c, :] = e^{G_Lc} S_0[c, :] + Σ_j e^{G_Lc − G_jc} k_jc v_j
//! ```
//!
//! (every exponent ≤ 0, so nothing overflows in f32; fla splits the chunk further on the GPU for
//! the same reason), across chunks the state passed on. The backward runs the chunks in reverse,
//! differentiating these lines explicitly, the states entering each chunk recomputed by a forward
//! pass over the states alone. One rayon task per (b, h), chunks in order: the same bits whatever
//! the thread count.

use crate::chunks;
use crate::linalg::{axpy, dot};
use crate::linear_attention::{chunk_states, Shape, Width};
use anyhow::Result;

/// Positions per chunk (fla's `chunk_gla`).
pub const CHUNK: usize = 64;

/// One GLA problem: sizes and the inputs the forward and backward read.
#[derive(Clone, Copy, Debug)]
pub struct Gla<'a> {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    /// K (q, k and g per head)
    pub k_dim: usize,
    /// V (v and o per head)
    pub v_dim: usize,
    /// [B, T, H, K]
    pub q: &'a [f32],
    pub k: &'a [f32],
    /// [B, T, H, V]
    pub v: &'a [f32],
    /// [B, T, H, K], the log forget gate (≤ 0).
    pub g: &'a [f32],
    /// o's factor (fla: K^−½).
    pub scale: f32,
    /// [B]: first real position of each row (left padding); none: all real.
    pub start: Option<&'a [usize]>,
}

/// Gradients of the GLA's inputs, overwritten (0 at padding).
pub struct GlaGrads<'a> {
    pub dq: &'a mut [f32],
    pub dk: &'a mut [f32],
    pub dv: &'a mut [f32],
    pub dg: &'a mut [f32],
    /// [B, H, K, V]: the gradient of the initial state, when wanted.
    pub dinit: Option<&'a mut [f32]>,
}

impl Gla<'_> {
    fn shape(&self) -> Shape<'_> {
        let (batch, seq, heads, k_dim, v_dim, start) =
            (self.batch, self.seq, self.heads, self.k_dim, self.v_dim, self.start);
        Shape { op: "gla", batch, seq, heads, k_dim, v_dim, start }
    }
    fn check(&self) -> Result<()> {
        self.shape().check(&[
            ("q", self.q.len(), Width::K),
            ("k", self.k.len(), Width::K),
            ("g", self.g.len(), Width::K),
            ("v", self.v.len(), Width::V),
        ])
    }

    /// Row b's real positions of head h, gathered contiguously.
    fn head(&self, b: usize, h: usize) -> Head {
        let sh = self.shape();
        Head {
            n: self.seq - sh.start(b),
            q: sh.gather(self.q, self.k_dim, b, h),
            k: sh.gather(self.k, self.k_dim, b, h),
            v: sh.gather(self.v, self.v_dim, b, h),
            g: sh.gather(self.g, self.k_dim, b, h),
            kd: self.k_dim,
            vd: self.v_dim,
            scale: self.scale,
        }
    }
}

/// One (b, h)'s real positions: q, k, g [n, K], v [n, V], with the problem's K, V and scale.
struct Head {
    n: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    kd: usize,
    vd: usize,
    scale: f32,
}

/// G [L, K]: the gate's cumulative sums over chunk [c0, c0 + len).
fn cumulative(x: &Head, c0: usize, len: usize) -> Vec<f32> {
    let kd = x.kd;
    let mut cum = vec![0.0f32; len * kd];
    for i in 0..len {
        for c in 0..kd {
            let prev = if i == 0 { 0.0 } else { cum[(i - 1) * kd + c] };
            cum[i * kd + c] = prev + x.g[(c0 + i) * kd + c];
        }
    }
    cum
}

/// A_ij = Σ_c q_ic k_jc e^{G_ic − G_jc} for j ≤ i, [L, L].
fn scores(x: &Head, c0: usize, len: usize, cum: &[f32]) -> Vec<f32> {
    let kd = x.kd;
    let (q, k) = (&x.q[c0 * kd..], &x.k[c0 * kd..]);
    let mut a = vec![0.0f32; len * len];
    for i in 0..len {
        for j in 0..=i {
            let mut s = 0.0f32;
            for c in 0..kd {
                s += q[i * kd + c] * k[j * kd + c] * (cum[i * kd + c] - cum[j * kd + c]).exp();
            }
            a[i * len + j] = s;
        }
    }
    a
}

/// The chunk's outputs (with `out`) and the state leaving it (into `s`, which held S_0).
fn chunk_fwd(x: &Head, c0: usize, len: usize, s: &mut [f32], out: Option<&mut [f32]>) {
    let (kd, vd, scale) = (x.kd, x.vd, x.scale);
    let cum = cumulative(x, c0, len);
    let (q, k, v) = (&x.q[c0 * kd..], &x.k[c0 * kd..], &x.v[c0 * vd..]);
    if let Some(o) = out {
        let a = scores(x, c0, len, &cum);
        for i in 0..len {
            let oi = &mut o[i * vd..][..vd];
            oi.fill(0.0);
            for c in 0..kd {
                axpy(oi, q[i * kd + c] * cum[i * kd + c].exp(), &s[c * vd..][..vd]);
            }
            for j in 0..=i {
                axpy(oi, a[i * len + j], &v[j * vd..][..vd]);
            }
            oi.iter_mut().for_each(|x| *x *= scale);
        }
    }
    let last = &cum[(len - 1) * kd..][..kd];
    for c in 0..kd {
        let row = &mut s[c * vd..][..vd];
        let d = last[c].exp();
        row.iter_mut().for_each(|x| *x *= d);
        for j in 0..len {
            let w = (last[c] - cum[j * kd + c]).exp() * k[j * kd + c];
            axpy(row, w, &v[j * vd..][..vd]);
        }
    }
}

/// Gradients of one head: dq, dk, dg [n, K], dv [n, V], and the initial state's.
struct HeadGrads {
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
    dg: Vec<f32>,
    dinit: Vec<f32>,
}

/// Backward of one head from do [n, V] and the final state's gradient `dfinal` [K, V].
fn head_bwd(x: &Head, init: &[f32], dout: &[f32], dfinal: &[f32]) -> HeadGrads {
    let (n, kd, vd) = (x.n, x.kd, x.vd);
    let states = chunk_states(n, CHUNK, init, |c0, len, s| chunk_fwd(x, c0, len, s, None));
    let mut gr = HeadGrads {
        dq: vec![0.0; n * kd],
        dk: vec![0.0; n * kd],
        dv: vec![0.0; n * vd],
        dg: vec![0.0; n * kd],
        dinit: dfinal.to_vec(),
    };
    for (c, (c0, len)) in chunks(n, CHUNK).enumerate().rev() {
        let s0 = &states[c * kd * vd..][..kd * vd];
        let ds = std::mem::take(&mut gr.dinit);
        gr.dinit = chunk_bwd(x, c0, len, s0, &dout[c0 * vd..][..len * vd], &ds, &mut gr);
    }
    gr
}

/// One chunk's backward: adds into `gr`'s rows of the chunk, returns dS_0.
fn chunk_bwd(x: &Head, c0: usize, len: usize, s0: &[f32], dout: &[f32], ds: &[f32], gr: &mut HeadGrads) -> Vec<f32> {
    let (kd, vd, scale) = (x.kd, x.vd, x.scale);
    let cum = cumulative(x, c0, len);
    let a = scores(x, c0, len, &cum);
    let (q, k, v) = (&x.q[c0 * kd..], &x.k[c0 * kd..], &x.v[c0 * vd..]);
    let dq = &mut gr.dq[c0 * kd..][..len * kd];
    let dk = &mut gr.dk[c0 * kd..][..len * kd];
    let dv = &mut gr.dv[c0 * vd..][..len * vd];
    let mut dcum = vec![0.0f32; len * kd];
    let last = &cum[(len - 1) * kd..][..kd];
    // S_L[c, :] = e^{G_Lc} S_0[c, :] + Σ_j e^{G_Lc − G_jc} k_jc v_j.
    let mut ds0 = vec![0.0f32; kd * vd];
    for c in 0..kd {
        let (dsr, s0r) = (&ds[c * vd..][..vd], &s0[c * vd..][..vd]);
        let d = last[c].exp();
        axpy(&mut ds0[c * vd..][..vd], d, dsr);
        dcum[(len - 1) * kd + c] += d * dot(dsr, s0r);
        for j in 0..len {
            let w = (last[c] - cum[j * kd + c]).exp();
            let dsv = dot(dsr, &v[j * vd..][..vd]);
            dk[j * kd + c] += w * dsv;
            axpy(&mut dv[j * vd..][..vd], w * k[j * kd + c], dsr);
            let t = w * k[j * kd + c] * dsv;
            dcum[(len - 1) * kd + c] += t;
            dcum[j * kd + c] -= t;
        }
    }
    for i in 0..len {
        let doi = &dout[i * vd..][..vd];
        // The state's term: scale Σ_c q_ic e^{G_ic} S_0[c, :].
        for c in 0..kd {
            let e = cum[i * kd + c].exp();
            let sd = dot(&s0[c * vd..][..vd], doi);
            dq[i * kd + c] += scale * e * sd;
            dcum[i * kd + c] += scale * q[i * kd + c] * e * sd;
            axpy(&mut ds0[c * vd..][..vd], scale * q[i * kd + c] * e, doi);
        }
        // The chunk's own term: scale Σ_{j ≤ i} A_ij v_j.
        for j in 0..=i {
            let da = scale * dot(doi, &v[j * vd..][..vd]);
            axpy(&mut dv[j * vd..][..vd], scale * a[i * len + j], doi);
            for c in 0..kd {
                let e = (cum[i * kd + c] - cum[j * kd + c]).exp();
                dq[i * kd + c] += da * k[j * kd + c] * e;
                dk[j * kd + c] += da * q[i * kd + c] * e;
                let t = da * q[i * kd + c] * k[j * kd + c] * e;
                dcum[i * kd + c] += t;
                dcum[j * kd + c] -= t;
            }
        }
    }
    // G_i = Σ_{s ≤ i} g_s per channel: dg_s = Σ_{i ≥ s} dG_i.
    let dg = &mut gr.dg[c0 * kd..][..len * kd];
    for c in 0..kd {
        let mut acc = 0.0f32;
        for i in (0..len).rev() {
            acc += dcum[i * kd + c];
            dg[i * kd + c] += acc;
        }
    }
    ds0
}

/// The chunked forward: o [B, T, H, V] (0 at padding); `init` and `final_state` [B, H, K, V]
/// (none: a zero initial state / not wanted).
pub fn gla_fwd(p: &Gla, o: &mut [f32], init: Option<&[f32]>, final_state: Option<&mut [f32]>) -> Result<()> {
    p.check()?;
    let vd = p.v_dim;
    p.shape().forward(o, init, final_state, |b, h, s, out| {
        let x = p.head(b, h);
        for (c0, len) in chunks(x.n, CHUNK) {
            chunk_fwd(&x, c0, len, s, Some(&mut out[c0 * vd..][..len * vd]));
        }
    })
}

/// The chunked backward from do [B, T, H, V] (and the final state's gradient `dfinal`, if the
/// final state was used): writes every gradient of `g` (0 at padding).
pub fn gla_bwd(p: &Gla, dout: &[f32], init: Option<&[f32]>, dfinal: Option<&[f32]>, g: GlaGrads) -> Result<()> {
    p.check()?;
    let sh = p.shape();
    sh.check_out(dout.len(), init.map(|s| s.len()), dfinal.map(|s| s.len()))?;
    let (kd, vd) = (p.k_dim, p.v_dim);
    sh.check_lens(&[
        ("dq", g.dq.len(), Width::K),
        ("dk", g.dk.len(), Width::K),
        ("dg", g.dg.len(), Width::K),
        ("dv", g.dv.len(), Width::V),
    ])?;
    if let Some(d) = &g.dinit {
        sh.check_state(d.len(), "dinit")?;
    }
    let per = sh.backward(dout, init, dfinal, |b, hi, d, s0, df| head_bwd(&p.head(b, hi), s0, d, df));
    let GlaGrads { dq, dk, dv, dg, dinit } = g;
    sh.scatter(dq, per.iter().map(|hg| &hg.dq[..]), kd);
    sh.scatter(dk, per.iter().map(|hg| &hg.dk[..]), kd);
    sh.scatter(dg, per.iter().map(|hg| &hg.dg[..]), kd);
    sh.scatter(dv, per.iter().map(|hg| &hg.dv[..]), vd);
    if let Some(d) = dinit {
        sh.put_states(d, per.iter().map(|hg| &hg.dinit[..]));
    }
    Ok(())
}

/// One decoding step: `p.seq` must be 1 (q, k, g [B, H, K], v [B, H, V]); `state` [B, H, K, V] is
/// updated in place and o [B, H, V] written. A row with start[b] > 0 is padding: o = 0, its
/// state unchanged.
pub fn gla_decode_step(p: &Gla, state: &mut [f32], o: &mut [f32]) -> Result<()> {
    p.check()?;
    let sh = p.shape();
    sh.check_decode(o.len(), state.len())?;
    let (kd, vd) = (p.k_dim, p.v_dim);
    sh.decode(state, o, |bh, s, or| {
        let (q, k, v, g) = (&p.q[bh * kd..][..kd], &p.k[bh * kd..][..kd], &p.v[bh * vd..][..vd], &p.g[bh * kd..][..kd]);
        for c in 0..kd {
            let row = &mut s[c * vd..][..vd];
            let d = g[c].exp();
            row.iter_mut().for_each(|x| *x *= d);
            axpy(row, k[c], v);
            axpy(or, p.scale * q[c], row);
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests;
