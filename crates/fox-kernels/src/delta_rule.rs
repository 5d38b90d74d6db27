//! The delta rule (DeltaNet; Yang et al. 2024) and its gated form (Gated DeltaNet; Yang, Kautz
//! and Hatamizadeh 2025), f32: per batch row b and head h, with a state S of [K, V],
//!
//! ```text
//! S_t = α_t · (I − β_t k_t k_tᵀ) · S_{t−1} + β_t k_t v_tᵀ,      o_t = scale · S_tᵀ q_t
//! ```
//!
//! with q_t, k_t [K] (the caller L2-normalises them: [`l2norm_fwd`]), v_t [V], β_t ∈ (0, 1) and
//! α_t = exp(g_t) (g_t ≤ 0 the log-decay; DeltaNet has none: α = 1). Written with the "delta"
//! u_t = β_t (v_t − α_t S_{t−1}ᵀ k_t), the step is S_t = α_t S_{t−1} + k_t u_tᵀ.
//!
//! Layouts (row-major): q, k [B, T, H, K]; v and o [B, T, H, V]; β and g [B, T, H]; states
//! (initial, final, decode) [B, H, K, V]. `start` [B]: positions t < start[b] are left padding:
//! the state passes through them unchanged, their outputs are 0 and nothing there gets a gradient.
//!
//! Two implementations: the plain recurrence step by step in f64 (`reference`, the tests' oracle)
//! and [`delta_rule_fwd`] / [`delta_rule_bwd`], the chunked form: within a chunk of L = [`CHUNK`]
//! positions (G_i = Σ_{s ≤ i} g_s from the chunk's start, γ_i = e^{G_i}, Γ_ij = e^{G_i − G_j} for
//! j ≤ i, S_0 the state entering the chunk),
//!
//! ```text
//! (I + A) U = R,   A_ij = β_i Γ_ij k_i·k_j (j < i),   R = diag(β) (V − diag(γ) K S_0)
//! O   = scale · (diag(γ) Q S_0 + (Γ ∘ Q Kᵀ)_{j ≤ i} U)
//! S_L = γ_L S_0 + Kᵀ diag(e^{G_L − G}) U
//! ```
//!
//! (the unit lower-triangular solve is the WY representation's UT transform: U = T R with
//! T = (I + A)⁻¹); across chunks the state is passed on. The backward runs the chunks in reverse,
//! differentiating these three lines explicitly (the solve's transpose for dR, dA = −dR Uᵀ),
//! with the states entering each chunk recomputed by a forward pass over the states alone. One
//! rayon task per (b, h) running its chunks in order, so results are the same bits whatever the
//! thread count.

use crate::chunks;
use crate::linalg::{axpy, dot};
use crate::linear_attention::{chunk_states, Shape, Width};
use anyhow::{ensure, Result};
use rayon::prelude::*;

/// Positions per chunk (fla's choice).
pub const CHUNK: usize = 64;

/// One delta-rule problem: sizes and the inputs the forward and backward read.
#[derive(Clone, Copy, Debug)]
pub struct DeltaRule<'a> {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    /// K (q and k per head)
    pub k_dim: usize,
    /// V (v and o per head)
    pub v_dim: usize,
    /// [B, T, H, K], L2-normalised.
    pub q: &'a [f32],
    pub k: &'a [f32],
    /// [B, T, H, V]
    pub v: &'a [f32],
    /// [B, T, H], the writing strength β.
    pub beta: &'a [f32],
    /// [B, T, H], the log-decay g ≤ 0 (Gated DeltaNet); none: α = 1.
    pub g: Option<&'a [f32]>,
    /// o's factor (fla: K^−½).
    pub scale: f32,
    /// [B]: first real position of each row (left padding); none: all real.
    pub start: Option<&'a [usize]>,
}

/// Gradients of the delta rule's inputs, overwritten (0 at padding).
pub struct DeltaRuleGrads<'a> {
    pub dq: &'a mut [f32],
    pub dk: &'a mut [f32],
    pub dv: &'a mut [f32],
    pub dbeta: &'a mut [f32],
    /// Wanted when the problem has g.
    pub dg: Option<&'a mut [f32]>,
    /// [B, H, K, V]: the gradient of the initial state, when wanted.
    pub dinit: Option<&'a mut [f32]>,
}

impl DeltaRule<'_> {
    fn shape(&self) -> Shape<'_> {
        let (batch, seq, heads, k_dim, v_dim, start) =
            (self.batch, self.seq, self.heads, self.k_dim, self.v_dim, self.start);
        Shape { op: "delta_rule", batch, seq, heads, k_dim, v_dim, start }
    }
    fn check(&self) -> Result<()> {
        let mut inputs = vec![
            ("q", self.q.len(), Width::K),
            ("k", self.k.len(), Width::K),
            ("v", self.v.len(), Width::V),
            ("beta", self.beta.len(), Width::One),
        ];
        if let Some(g) = self.g {
            inputs.push(("g", g.len(), Width::One));
        }
        self.shape().check(&inputs)
    }

    /// Row b's real positions of head h, gathered contiguously.
    fn head(&self, b: usize, h: usize) -> Head {
        let sh = self.shape();
        let n = self.seq - sh.start(b);
        Head {
            n,
            q: sh.gather(self.q, self.k_dim, b, h),
            k: sh.gather(self.k, self.k_dim, b, h),
            v: sh.gather(self.v, self.v_dim, b, h),
            beta: sh.gather(self.beta, 1, b, h),
            g: self.g.map_or_else(|| vec![0.0; n], |g| sh.gather(g, 1, b, h)),
            kd: self.k_dim,
            vd: self.v_dim,
            scale: self.scale,
        }
    }
}

/// One (b, h)'s real positions: q, k [n, K], v [n, V], β and g [n], with the problem's K, V and
/// scale.
struct Head {
    n: usize,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    beta: Vec<f32>,
    g: Vec<f32>,
    kd: usize,
    vd: usize,
    scale: f32,
}

/// x [K] · S [K, V] → out [V] (Sᵀ x).
fn vec_mat(out: &mut [f32], x: &[f32], s: &[f32], vd: usize) {
    out.fill(0.0);
    for (ki, &xv) in x.iter().enumerate() {
        axpy(out, xv, &s[ki * vd..][..vd]);
    }
}

/// S [K, V] · y [V] → out [K].
fn mat_vec(out: &mut [f32], s: &[f32], y: &[f32], vd: usize) {
    for (ki, o) in out.iter_mut().enumerate() {
        *o = dot(&s[ki * vd..][..vd], y);
    }
}

/// A chunk's quantities that its forward and backward share.
struct Chunk {
    len: usize,
    /// G_i, cumulative log-decay from the chunk's start.
    cum: Vec<f32>,
    /// Γ_ij = e^{G_i − G_j} (j ≤ i), [L, L].
    gam: Vec<f32>,
    /// k_i·k_j and q_i·k_j, [L, L] (j ≤ i used).
    kk: Vec<f32>,
    qk: Vec<f32>,
    /// A_ij = β_i Γ_ij k_i·k_j (j < i), [L, L].
    a: Vec<f32>,
    /// S_0ᵀ k_i, [L, V].
    s0k: Vec<f32>,
    /// The deltas U = (I + A)⁻¹ R, [L, V].
    u: Vec<f32>,
}

/// Builds chunk [c0, c0 + len) of `x` entering with state `s0`.
fn chunk(x: &Head, c0: usize, len: usize, s0: &[f32]) -> Chunk {
    let (kd, vd) = (x.kd, x.vd);
    let (q, k, v) = (&x.q[c0 * kd..], &x.k[c0 * kd..], &x.v[c0 * vd..]);
    let (beta, g) = (&x.beta[c0..c0 + len], &x.g[c0..c0 + len]);
    let mut cum = vec![0.0f32; len];
    let mut acc = 0.0f32;
    for i in 0..len {
        acc += g[i];
        cum[i] = acc;
    }
    let mut gam = vec![0.0f32; len * len];
    let mut kk = vec![0.0f32; len * len];
    let mut qk = vec![0.0f32; len * len];
    let mut a = vec![0.0f32; len * len];
    for i in 0..len {
        let (qi, ki) = (&q[i * kd..][..kd], &k[i * kd..][..kd]);
        for j in 0..=i {
            let kj = &k[j * kd..][..kd];
            gam[i * len + j] = (cum[i] - cum[j]).exp();
            kk[i * len + j] = dot(ki, kj);
            qk[i * len + j] = dot(qi, kj);
            if j < i {
                a[i * len + j] = beta[i] * gam[i * len + j] * kk[i * len + j];
            }
        }
    }
    let mut s0k = vec![0.0f32; len * vd];
    let mut u = vec![0.0f32; len * vd];
    for i in 0..len {
        vec_mat(&mut s0k[i * vd..][..vd], &k[i * kd..][..kd], s0, vd);
        let gi = cum[i].exp();
        // r_i = β_i (v_i − γ_i S_0ᵀ k_i), then the forward substitution u_i = r_i − Σ_{j<i} A_ij u_j.
        let (done, rest) = u.split_at_mut(i * vd);
        let ui = &mut rest[..vd];
        for c in 0..vd {
            ui[c] = beta[i] * (v[i * vd + c] - gi * s0k[i * vd + c]);
        }
        for j in 0..i {
            axpy(ui, -a[i * len + j], &done[j * vd..][..vd]);
        }
    }
    Chunk { len, cum, gam, kk, qk, a, s0k, u }
}

/// The chunk's outputs o [L, V] (with `out`) and the state leaving it (into `s`, which held S_0).
fn chunk_fwd(x: &Head, c0: usize, ch: &Chunk, s: &mut [f32], out: Option<&mut [f32]>) {
    let (len, kd, vd, scale) = (ch.len, x.kd, x.vd, x.scale);
    if let Some(o) = out {
        let q = &x.q[c0 * kd..];
        for i in 0..len {
            let oi = &mut o[i * vd..][..vd];
            vec_mat(oi, &q[i * kd..][..kd], s, vd);
            let gi = ch.cum[i].exp();
            for c in oi.iter_mut() {
                *c *= gi;
            }
            for j in 0..=i {
                axpy(oi, ch.gam[i * len + j] * ch.qk[i * len + j], &ch.u[j * vd..][..vd]);
            }
            for c in oi.iter_mut() {
                *c *= scale;
            }
        }
    }
    let k = &x.k[c0 * kd..];
    let last = ch.cum[len - 1];
    let gl = last.exp();
    for v in s.iter_mut() {
        *v *= gl;
    }
    for j in 0..len {
        let e = (last - ch.cum[j]).exp();
        let uj = &ch.u[j * vd..][..vd];
        for (ki, &kv) in k[j * kd..][..kd].iter().enumerate() {
            axpy(&mut s[ki * vd..][..vd], e * kv, uj);
        }
    }
}

/// Forward of one head over its real positions: o [n, V], the state `s` [K, V] advanced.
fn head_fwd(x: &Head, s: &mut [f32], o: &mut [f32]) {
    for (c0, len) in chunks(x.n, CHUNK) {
        let ch = chunk(x, c0, len, s);
        chunk_fwd(x, c0, &ch, s, Some(&mut o[c0 * x.vd..][..len * x.vd]));
    }
}

/// Gradients of one head: dq, dk [n, K], dv [n, V], dβ, dg [n], and the initial state's.
struct HeadGrads {
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
    dbeta: Vec<f32>,
    dg: Vec<f32>,
    dinit: Vec<f32>,
}

/// Backward of one head from do [n, V] and the final state's gradient `dfinal` [K, V].
fn head_bwd(x: &Head, init: &[f32], dout: &[f32], dfinal: &[f32]) -> HeadGrads {
    let (n, kd, vd) = (x.n, x.kd, x.vd);
    let states = chunk_states(n, CHUNK, init, |c0, len, s| {
        let ch = chunk(x, c0, len, s);
        chunk_fwd(x, c0, &ch, s, None);
    });
    let mut gr = HeadGrads {
        dq: vec![0.0; n * kd],
        dk: vec![0.0; n * kd],
        dv: vec![0.0; n * vd],
        dbeta: vec![0.0; n],
        dg: vec![0.0; n],
        dinit: dfinal.to_vec(),
    };
    for (c, (c0, len)) in chunks(n, CHUNK).enumerate().rev() {
        let s0 = &states[c * kd * vd..][..kd * vd];
        let ch = chunk(x, c0, len, s0);
        let ds = std::mem::take(&mut gr.dinit);
        gr.dinit = chunk_bwd(x, c0, &ch, s0, &dout[c0 * vd..][..len * vd], &ds, &mut gr);
    }
    gr
}

/// One chunk's backward: adds into `gr`'s rows of the chunk, returns dS_0.
fn chunk_bwd(x: &Head, c0: usize, ch: &Chunk, s0: &[f32], dout: &[f32], ds: &[f32], gr: &mut HeadGrads) -> Vec<f32> {
    let (kd, vd, scale) = (x.kd, x.vd, x.scale);
    let len = ch.len;
    let (q, k, v) = (&x.q[c0 * kd..], &x.k[c0 * kd..], &x.v[c0 * vd..]);
    let beta = &x.beta[c0..c0 + len];
    let dq = &mut gr.dq[c0 * kd..][..len * kd];
    let dk = &mut gr.dk[c0 * kd..][..len * kd];
    let dv = &mut gr.dv[c0 * vd..][..len * vd];
    let dbeta = &mut gr.dbeta[c0..c0 + len];
    let mut dcum = vec![0.0f32; len];
    let mut dgam = vec![0.0f32; len * len];
    let last = ch.cum[len - 1];
    let gl = last.exp();
    // S_L = γ_L S_0 + Σ_j e_j k_j u_jᵀ.
    let mut ds0: Vec<f32> = ds.iter().map(|v| gl * v).collect();
    dcum[len - 1] += gl * dot(ds, s0);
    let mut du = vec![0.0f32; len * vd];
    let mut tmp_v = vec![0.0f32; vd];
    let mut tmp_k = vec![0.0f32; kd];
    for j in 0..len {
        let e = (last - ch.cum[j]).exp();
        let (kj, uj) = (&k[j * kd..][..kd], &ch.u[j * vd..][..vd]);
        // du_j += e_j dSᵀ k_j; dk_j += e_j dS u_j; de_j = k_j·(dS u_j).
        vec_mat(&mut tmp_v, kj, ds, vd);
        axpy(&mut du[j * vd..][..vd], e, &tmp_v);
        mat_vec(&mut tmp_k, ds, uj, vd);
        axpy(&mut dk[j * kd..][..kd], e, &tmp_k);
        let de = e * dot(kj, &tmp_k);
        dcum[j] -= de;
        dcum[len - 1] += de;
    }
    // O = scale (diag(γ) Q S_0 + P U), P_ij = Γ_ij q_i·k_j (j ≤ i).
    for i in 0..len {
        let doi = &dout[i * vd..][..vd];
        let qi = &q[i * kd..][..kd];
        let gi = ch.cum[i].exp();
        // dq_i += scale γ_i S_0 do_i; dS_0 += scale γ_i q_i do_iᵀ; dG_i += scale γ_i (S_0ᵀ q_i)·do_i.
        mat_vec(&mut tmp_k, s0, doi, vd);
        axpy(&mut dq[i * kd..][..kd], scale * gi, &tmp_k);
        dcum[i] += scale * gi * dot(qi, &tmp_k);
        for (ki, &qv) in qi.iter().enumerate() {
            axpy(&mut ds0[ki * vd..][..vd], scale * gi * qv, doi);
        }
        for j in 0..=i {
            let uj = &ch.u[j * vd..][..vd];
            let p = ch.gam[i * len + j] * ch.qk[i * len + j];
            axpy(&mut du[j * vd..][..vd], scale * p, doi);
            let dp = scale * dot(doi, uj);
            let dqk = dp * ch.gam[i * len + j];
            dgam[i * len + j] += dp * ch.qk[i * len + j];
            axpy(&mut dq[i * kd..][..kd], dqk, &k[j * kd..][..kd]);
            axpy(&mut dk[j * kd..][..kd], dqk, qi);
        }
    }
    // (I + A) U = R: dR = (I + A)⁻ᵀ dU (back substitution), dA = −dR Uᵀ (j < i).
    let mut dr = du;
    for i in (0..len).rev() {
        let (head, tail) = dr.split_at_mut((i + 1) * vd);
        let dri = &mut head[i * vd..];
        for jj in i + 1..len {
            axpy(dri, -ch.a[jj * len + i], &tail[(jj - i - 1) * vd..][..vd]);
        }
    }
    for i in 0..len {
        let dri = &dr[i * vd..][..vd];
        let ki = &k[i * kd..][..kd];
        for j in 0..i {
            let da = -dot(dri, &ch.u[j * vd..][..vd]);
            let (g, kkv) = (ch.gam[i * len + j], ch.kk[i * len + j]);
            dbeta[i] += da * g * kkv;
            dgam[i * len + j] += da * beta[i] * kkv;
            let dkk = da * beta[i] * g;
            axpy(&mut dk[i * kd..][..kd], dkk, &k[j * kd..][..kd]);
            axpy(&mut dk[j * kd..][..kd], dkk, ki);
        }
        // r_i = β_i (v_i − γ_i S_0ᵀ k_i).
        let gi = ch.cum[i].exp();
        let s0k = &ch.s0k[i * vd..][..vd];
        let mut w = 0.0f32;
        for c in 0..vd {
            w += dri[c] * (v[i * vd + c] - gi * s0k[c]);
            dv[i * vd + c] += beta[i] * dri[c];
        }
        dbeta[i] += w;
        mat_vec(&mut tmp_k, s0, dri, vd);
        axpy(&mut dk[i * kd..][..kd], -beta[i] * gi, &tmp_k);
        for (kk_, &kv) in ki.iter().enumerate() {
            axpy(&mut ds0[kk_ * vd..][..vd], -beta[i] * gi * kv, dri);
        }
        dcum[i] -= beta[i] * gi * dot(dri, s0k);
    }
    // Γ_ij = e^{G_i − G_j}.
    for i in 0..len {
        for j in 0..i {
            let d = dgam[i * len + j] * ch.gam[i * len + j];
            dcum[i] += d;
            dcum[j] -= d;
        }
    }
    // G_i = Σ_{s ≤ i} g_s: dg_s = Σ_{i ≥ s} dG_i.
    let dg = &mut gr.dg[c0..c0 + len];
    let mut acc = 0.0f32;
    for i in (0..len).rev() {
        acc += dcum[i];
        dg[i] += acc;
    }
    ds0
}

/// The chunked forward: o [B, T, H, V] (0 at padding); `init` and `final_state` [B, H, K, V] (none:
/// a zero initial state / not wanted).
pub fn delta_rule_fwd(
    p: &DeltaRule,
    o: &mut [f32],
    init: Option<&[f32]>,
    final_state: Option<&mut [f32]>,
) -> Result<()> {
    p.check()?;
    p.shape().forward(o, init, final_state, |b, h, s, out| {
        head_fwd(&p.head(b, h), s, out);
    })
}

/// The chunked backward from do [B, T, H, V] (and the final state's gradient `dfinal`, if the
/// final state was used): writes every gradient of `g` (0 at padding).
pub fn delta_rule_bwd(
    p: &DeltaRule,
    dout: &[f32],
    init: Option<&[f32]>,
    dfinal: Option<&[f32]>,
    g: DeltaRuleGrads,
) -> Result<()> {
    p.check()?;
    let sh = p.shape();
    sh.check_out(dout.len(), init.map(|s| s.len()), dfinal.map(|s| s.len()))?;
    let (kd, vd) = (p.k_dim, p.v_dim);
    ensure!(g.dg.is_some() == p.g.is_some(), "delta_rule_bwd: dg is wanted exactly when the problem has g");
    let mut grads = vec![
        ("dq", g.dq.len(), Width::K),
        ("dk", g.dk.len(), Width::K),
        ("dv", g.dv.len(), Width::V),
        ("dbeta", g.dbeta.len(), Width::One),
    ];
    grads.extend(g.dg.as_ref().map(|dg| ("dg", dg.len(), Width::One)));
    sh.check_lens(&grads)?;
    if let Some(d) = &g.dinit {
        sh.check_state(d.len(), "dinit")?;
    }
    let per = sh.backward(dout, init, dfinal, |b, hi, d, s0, df| head_bwd(&p.head(b, hi), s0, d, df));
    let DeltaRuleGrads { dq, dk, dv, dbeta, dg, dinit } = g;
    sh.scatter(dq, per.iter().map(|hg| &hg.dq[..]), kd);
    sh.scatter(dk, per.iter().map(|hg| &hg.dk[..]), kd);
    sh.scatter(dv, per.iter().map(|hg| &hg.dv[..]), vd);
    sh.scatter(dbeta, per.iter().map(|hg| &hg.dbeta[..]), 1);
    if let Some(dg) = dg {
        sh.scatter(dg, per.iter().map(|hg| &hg.dg[..]), 1);
    }
    if let Some(d) = dinit {
        sh.put_states(d, per.iter().map(|hg| &hg.dinit[..]));
    }
    Ok(())
}

/// One decoding step: `p.seq` must be 1 (q, k [B, H, K], v [B, H, V], β and g [B, H]); `state`
/// [B, H, K, V] is updated in place and o [B, H, V] written. A row with start[b] > 0 is padding:
/// o = 0, its state unchanged.
pub fn delta_rule_decode_step(p: &DeltaRule, state: &mut [f32], o: &mut [f32]) -> Result<()> {
    p.check()?;
    let sh = p.shape();
    sh.check_decode(o.len(), state.len())?;
    let (kd, vd) = (p.k_dim, p.v_dim);
    sh.decode(state, o, |bh, s, or| {
        let (q, k, v) = (&p.q[bh * kd..][..kd], &p.k[bh * kd..][..kd], &p.v[bh * vd..][..vd]);
        let alpha = p.g.map_or(1.0, |g| g[bh].exp());
        let beta = p.beta[bh];
        for x in s.iter_mut() {
            *x *= alpha;
        }
        // u = β (v − Sᵀ k); S += k uᵀ; o = scale Sᵀ q.
        let mut u = vec![0.0f32; vd];
        vec_mat(&mut u, k, s, vd);
        for c in 0..vd {
            u[c] = beta * (v[c] - u[c]);
        }
        for (ki, &kv) in k.iter().enumerate() {
            axpy(&mut s[ki * vd..][..vd], kv, &u);
        }
        vec_mat(or, q, s, vd);
        for c in or.iter_mut() {
            *c *= p.scale;
        }
    });
    Ok(())
}

/// y = x / √(Σ x² + eps) over rows of `dim` (fla's l2norm, eps 1e-6), saving 1/√(Σ x² + eps) per
/// row into `rstd`. x and y are rows of stride `dim`.
pub fn l2norm_fwd(y: &mut [f32], rstd: &mut [f32], x: &[f32], dim: usize, eps: f32) -> Result<()> {
    ensure!(dim > 0 && x.len().is_multiple_of(dim), "l2norm: {} values are not rows of {dim}", x.len());
    ensure!(y.len() == x.len(), "l2norm: y has {} values, not {}", y.len(), x.len());
    ensure!(rstd.len() == x.len() / dim, "l2norm: rstd has {} values, not {} rows", rstd.len(), x.len() / dim);
    y.par_chunks_mut(dim).zip(rstd.par_iter_mut()).zip(x.par_chunks(dim)).for_each(|((yr, r), xr)| {
        let ss: f32 = xr.iter().map(|v| v * v).sum();
        *r = 1.0 / (ss + eps).sqrt();
        for (y, x) in yr.iter_mut().zip(xr) {
            *y = x * *r;
        }
    });
    Ok(())
}

/// Backward of [`l2norm_fwd`] from its output y: dx = rstd · (dy − y (y·dy)), overwritten.
pub fn l2norm_bwd(dx: &mut [f32], dy: &[f32], y: &[f32], rstd: &[f32], dim: usize) -> Result<()> {
    ensure!(dim > 0 && y.len().is_multiple_of(dim), "l2norm_bwd: {} values are not rows of {dim}", y.len());
    ensure!(dx.len() == y.len() && dy.len() == y.len(), "l2norm_bwd: dx, dy and y must have the same length");
    ensure!(rstd.len() == y.len() / dim, "l2norm_bwd: rstd has {} values, not {} rows", rstd.len(), y.len() / dim);
    dx.par_chunks_mut(dim).zip(dy.par_chunks(dim)).zip(y.par_chunks(dim)).zip(rstd.par_iter()).for_each(
        |(((dxr, dyr), yr), &r)| {
            let yd = dot(yr, dyr);
            for ((dx, dy), y) in dxr.iter_mut().zip(dyr).zip(yr) {
                *dx = r * (dy - y * yd);
            }
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests;
