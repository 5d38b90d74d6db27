//! Causal depthwise short convolution over time (Mamba-2's, DeltaNet's and HGRN2's conv1d), f32.
//!
//! Per batch row b, channel c, position t, with width W and weight w [C, W] (PyTorch's checkpoint
//! [C, 1, W] with the middle axis dropped):
//!
//! ```text
//! pre[b, t, c] = bias[c] + Σ_{k<W} w[c, k] · in[b, t − (W − 1) + k, c]
//! out = silu(pre) when `silu`, else pre
//! ```
//!
//! `in` at a position before 0 comes from the previous conv state (the last W − 1 inputs of the
//! same row, oldest first) when one is given, else 0. Left padding: positions t < start[b] are
//! padding; they count as input 0 (the previous state is not read for a left-padded row, as the
//! row's sequence starts at start[b]), and their outputs (and so their gradients) are 0.
//!
//! Parallel over blocks of channels: each task owns its channels' weight gradient, so the sums
//! over (b, t) run in one fixed order and the results do not depend on the thread count.

use crate::par::SharedMut;
use crate::scalar::{sigmoid, silu};
use anyhow::{ensure, Result};
use rayon::prelude::*;

/// Channels per parallel task.
const CHANNELS_PER_TASK: usize = 32;

/// One convolution problem.
#[derive(Clone, Copy, Debug)]
pub struct Conv1d<'a> {
    pub batch: usize,
    pub seq: usize,
    pub channels: usize,
    /// W ≥ 1 (4 in the paper's Mamba-2).
    pub width: usize,
    /// Input [B, T, x_stride]: channel c of (b, t) at (b·T + t)·x_stride + c (the slice starts at
    /// the first convolved column, e.g. `&zxbcdt[Di..]` of Mamba-2's in_proj output).
    pub x: &'a [f32],
    /// Row stride of `x` (≥ channels).
    pub x_stride: usize,
    /// [C, W]; tap W − 1 multiplies the current position.
    pub weight: &'a [f32],
    /// [C], or none.
    pub bias: Option<&'a [f32]>,
    /// Per batch row, the first real position (left padding); none: every position is real.
    pub start: Option<&'a [usize]>,
    /// Apply SiLU after the convolution (fused).
    pub silu: bool,
}

impl Conv1d<'_> {
    /// The sizes of every slice against the problem, as errors (nothing panics on bad sizes).
    fn check(&self) -> Result<()> {
        let (b, t, c, w) = (self.batch, self.seq, self.channels, self.width);
        ensure!(w >= 1, "conv1d: width must be at least 1");
        ensure!(self.x_stride >= c, "conv1d: x_stride {} < channels {c}", self.x_stride);
        let rows = b * t;
        ensure!(
            self.x.len() >= crate::strided_span(rows, self.x_stride, c),
            "conv1d: x holds {} values, [{b}, {t}, stride {}] needs more",
            self.x.len(),
            self.x_stride
        );
        ensure!(self.weight.len() == c * w, "conv1d: weight has {} values, not C·W = {}", self.weight.len(), c * w);
        if let Some(bias) = self.bias {
            ensure!(bias.len() == c, "conv1d: bias has {} values, not C = {c}", bias.len());
        }
        if let Some(s) = self.start {
            ensure!(s.len() == b, "conv1d: start has {} rows, not B = {b}", s.len());
        }
        Ok(())
    }

    fn start(&self, b: usize) -> usize {
        self.start.map_or(0, |s| s[b])
    }

    /// The pre-activation at (b, t) for channels c0..c1 into `pre`.
    fn pre_row(&self, prev: Option<&[f32]>, b: usize, t: usize, c0: usize, c1: usize, pre: &mut [f32]) {
        let (w, c) = (self.width, self.channels);
        let s = self.start(b);
        for (i, ch) in (c0..c1).enumerate() {
            let mut acc = self.bias.map_or(0.0, |bias| bias[ch]);
            for k in 0..w {
                // Input position t − (W − 1) + k, possibly before 0.
                let pos = t as isize - (w as isize - 1) + k as isize;
                let v = if pos >= 0 {
                    let pos = pos as usize;
                    if pos < s {
                        0.0
                    } else {
                        self.x[(b * self.seq + pos) * self.x_stride + ch]
                    }
                } else if s == 0 {
                    // The previous state holds positions −(W − 1)..−1.
                    prev.map_or(0.0, |p| p[(b * (w - 1) + (w as isize - 1 + pos) as usize) * c + ch])
                } else {
                    0.0
                };
                acc += self.weight[ch * w + k] * v;
            }
            pre[i] = acc;
        }
    }
}

fn check_state(p: &Conv1d, s: &[f32], what: &str) -> Result<()> {
    let n = p.batch * (p.width - 1) * p.channels;
    ensure!(s.len() == n, "conv1d: {what} has {} values, not B·(W−1)·C = {n}", s.len());
    Ok(())
}

/// Forward: out [B, T, C] (contiguous) = (silu of) the convolution. `prev` [B, W − 1, C]: the
/// previous conv state (chunked prefill), or none for a fresh sequence. `new_state` [B, W − 1, C]
/// receives the last W − 1 inputs of each row (oldest first; taken from `prev` where T < W − 1,
/// 0 where padding), the state for the next chunk or [`conv1d_decode_step`].
pub fn conv1d_fwd(p: &Conv1d, out: &mut [f32], prev: Option<&[f32]>, new_state: Option<&mut [f32]>) -> Result<()> {
    p.check()?;
    let (b, t, c, w) = (p.batch, p.seq, p.channels, p.width);
    ensure!(out.len() == b * t * c, "conv1d: out has {} values, not B·T·C = {}", out.len(), b * t * c);
    if let Some(s) = prev {
        check_state(p, s, "prev")?;
    }
    if let Some(s) = &new_state {
        check_state(p, s, "new_state")?;
    }
    let o = SharedMut::new(out);
    (0..c.div_ceil(CHANNELS_PER_TASK)).into_par_iter().for_each(|task| {
        let c0 = task * CHANNELS_PER_TASK;
        let c1 = (c0 + CHANNELS_PER_TASK).min(c);
        let mut pre = [0.0f32; CHANNELS_PER_TASK];
        for bi in 0..b {
            let s = p.start(bi);
            for ti in 0..t {
                // SAFETY: this task alone writes channels c0..c1 of every row.
                let row = unsafe { o.slice((bi * t + ti) * c + c0, c1 - c0) };
                if ti < s {
                    row.fill(0.0);
                    continue;
                }
                p.pre_row(prev, bi, ti, c0, c1, &mut pre);
                for (r, &v) in row.iter_mut().zip(&pre) {
                    *r = if p.silu { silu(v) } else { v };
                }
            }
        }
    });
    if let Some(ns) = new_state {
        for bi in 0..b {
            let s = p.start(bi);
            for k in 0..w - 1 {
                let pos = t as isize - (w as isize - 1) + k as isize;
                let dst = &mut ns[(bi * (w - 1) + k) * c..][..c];
                if pos >= 0 && (pos as usize) >= s {
                    dst.copy_from_slice(&p.x[(bi * t + pos as usize) * p.x_stride..][..c]);
                } else if pos < 0 && s == 0 {
                    match prev {
                        Some(pv) => {
                            dst.copy_from_slice(&pv[(bi * (w - 1) + (w as isize - 1 + pos) as usize) * c..][..c])
                        }
                        None => dst.fill(0.0),
                    }
                } else {
                    dst.fill(0.0);
                }
            }
        }
    }
    Ok(())
}

/// Backward. The pre-activation is recomputed (W multiply-adds per value: cheaper than keeping a
/// [B, T, C] buffer for it). dout [B, T, C] is the gradient of `out` (of the SiLU's output when
/// `silu`); `prev` as given to the forward (none in training). dx has x's layout (row stride
/// `x_stride`): channels 0..C of each row are overwritten (0 at padding), other columns are left
/// as they are. dweight [C, W] and dbias [C] are added to (accumulated, as rms_norm_bwd's dw).
pub fn conv1d_bwd(
    p: &Conv1d,
    dout: &[f32],
    prev: Option<&[f32]>,
    dx: &mut [f32],
    dweight: &mut [f32],
    dbias: Option<&mut [f32]>,
) -> Result<()> {
    p.check()?;
    let (b, t, c, w) = (p.batch, p.seq, p.channels, p.width);
    ensure!(dout.len() == b * t * c, "conv1d: dout has {} values, not B·T·C = {}", dout.len(), b * t * c);
    let need = if b * t == 0 { 0 } else { (b * t - 1) * p.x_stride + c };
    ensure!(dx.len() >= need, "conv1d: dx holds {} values, [{b}, {t}, stride {}] needs {need}", dx.len(), p.x_stride);
    ensure!(dweight.len() == c * w, "conv1d: dweight has {} values, not C·W", dweight.len());
    if let Some(db) = &dbias {
        ensure!(db.len() == c, "conv1d: dbias has {} values, not C", db.len());
    }
    if let Some(s) = prev {
        check_state(p, s, "prev")?;
    }
    let dxp = SharedMut::new(dx);
    let dwp = SharedMut::new(dweight);
    let dbp = dbias.map(SharedMut::new);
    (0..c.div_ceil(CHANNELS_PER_TASK)).into_par_iter().for_each(|task| {
        let c0 = task * CHANNELS_PER_TASK;
        let c1 = (c0 + CHANNELS_PER_TASK).min(c);
        let n = c1 - c0;
        let mut pre = [0.0f32; CHANNELS_PER_TASK];
        // SAFETY: this task alone touches channels c0..c1 of dweight, dbias and dx.
        let dw = unsafe { dwp.slice(c0 * w, n * w) };
        let mut db = [0.0f32; CHANNELS_PER_TASK];
        for bi in 0..b {
            let s = p.start(bi);
            // The gradient of the pre-activation, position by position; dx at position τ is
            // Σ_k w[c, k] · g[τ + W − 1 − k], so walk τ and read later g's. Keep g for the whole
            // row: [T, n] in a local buffer.
            let mut g = vec![0.0f32; t * n];
            for ti in s..t {
                let gr = &mut g[ti * n..(ti + 1) * n];
                let dr = &dout[(bi * t + ti) * c + c0..][..n];
                if p.silu {
                    p.pre_row(prev, bi, ti, c0, c1, &mut pre);
                    for i in 0..n {
                        let sg = sigmoid(pre[i]);
                        gr[i] = dr[i] * sg * (1.0 + pre[i] * (1.0 - sg));
                    }
                } else {
                    gr.copy_from_slice(dr);
                }
            }
            for ti in 0..t {
                // SAFETY: as above.
                let dxr = unsafe { dxp.slice((bi * t + ti) * p.x_stride + c0, n) };
                if ti < s {
                    dxr.fill(0.0);
                    continue;
                }
                let xr = &p.x[(bi * t + ti) * p.x_stride + c0..][..n];
                for i in 0..n {
                    let ch = c0 + i;
                    let mut acc = 0.0f32;
                    for k in 0..w {
                        let out_t = ti + w - 1 - k;
                        if out_t < t {
                            let gv = g[out_t * n + i];
                            acc += p.weight[ch * w + k] * gv;
                            dw[i * w + k] += gv * xr[i];
                        }
                    }
                    dxr[i] = acc;
                }
            }
            // Taps that read the previous state (positions before 0), and the bias.
            for ti in s..t {
                for i in 0..n {
                    let gv = g[ti * n + i];
                    db[i] += gv;
                    if s == 0 {
                        if let Some(pv) = prev {
                            for k in 0..w {
                                let pos = ti as isize - (w as isize - 1) + k as isize;
                                if pos < 0 {
                                    let v = pv[(bi * (w - 1) + (w as isize - 1 + pos) as usize) * c + c0 + i];
                                    dw[i * w + k] += gv * v;
                                }
                            }
                        }
                    }
                }
            }
        }
        if let Some(dbp) = &dbp {
            // SAFETY: as above.
            let dbs = unsafe { dbp.slice(c0, n) };
            for i in 0..n {
                dbs[i] += db[i];
            }
        }
    });
    Ok(())
}

/// One decoding step: `p.seq` must be 1; x holds one row per batch row ([B, x_stride]), out [B, C].
/// state [B, W − 1, C] (the forward's `new_state`) is read as the previous inputs and shifted by
/// one in place. A row with start[b] > 0 is padding: output 0, state unchanged.
pub fn conv1d_decode_step(p: &Conv1d, state: &mut [f32], out: &mut [f32]) -> Result<()> {
    p.check()?;
    ensure!(p.seq == 1, "conv1d_decode_step: one position per row, not {}", p.seq);
    check_state(p, state, "state")?;
    let (b, c, w) = (p.batch, p.channels, p.width);
    ensure!(out.len() == b * c, "conv1d_decode_step: out has {} values, not B·C", out.len());
    for bi in 0..b {
        let orow = &mut out[bi * c..(bi + 1) * c];
        if p.start(bi) > 0 {
            orow.fill(0.0);
            continue;
        }
        let st = &mut state[bi * (w - 1) * c..(bi + 1) * (w - 1) * c];
        let xr = &p.x[bi * p.x_stride..][..c];
        for ch in 0..c {
            let mut acc = p.bias.map_or(0.0, |bias| bias[ch]);
            for k in 0..w - 1 {
                acc += p.weight[ch * w + k] * st[k * c + ch];
            }
            acc += p.weight[ch * w + w - 1] * xr[ch];
            orow[ch] = if p.silu { silu(acc) } else { acc };
        }
        if w > 1 {
            st.copy_within(c.., 0);
            st[(w - 2) * c..].copy_from_slice(xr);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{assert_gradient, central_difference, randn};
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// The forward against its formula in f64, dx/dw/db against central differences, with SiLU
    /// or not, left padding, a previous state, and an input with a row stride wider than C. 40
    /// channels: a task of 32 and one of 8.
    #[test]
    fn forward_and_backward() {
        let mut rng = ChaCha8Rng::seed_from_u64(21);
        let (b, t, c, w, stride) = (2, 7, 40, 4, 45);
        let x = randn(&mut rng, b * t * stride);
        let weight = randn(&mut rng, c * w);
        let bias = randn(&mut rng, c);
        let prev_state = randn(&mut rng, b * (w - 1) * c);
        let g = randn(&mut rng, b * t * c);
        let start = [0usize, 3];
        for silu_on in [false, true] {
            for (st, prev) in [(None, None), (Some(&start[..]), None), (Some(&start[..]), Some(&prev_state[..]))] {
                let mk = |x: &'_ [f32], weight: &'_ [f32], bias: &'_ [f32]| -> Vec<f32> {
                    let p = Conv1d {
                        batch: b,
                        seq: t,
                        channels: c,
                        width: w,
                        x,
                        x_stride: stride,
                        weight,
                        bias: Some(bias),
                        start: st,
                        silu: silu_on,
                    };
                    let mut out = vec![f32::NAN; b * t * c];
                    conv1d_fwd(&p, &mut out, prev, None).unwrap();
                    out
                };
                let out = mk(&x, &weight, &bias);
                for bi in 0..b {
                    let s = st.map_or(0, |s| s[bi]);
                    for ti in 0..t {
                        for ch in 0..c {
                            let mut want = bias[ch] as f64;
                            for k in 0..w {
                                let pos = ti as isize + k as isize - 3;
                                let v = if pos >= s as isize {
                                    x[(bi * t + pos as usize) * stride + ch]
                                } else if pos < 0 && s == 0 {
                                    prev.map_or(0.0, |pv| pv[(bi * 3 + (3 + pos) as usize) * c + ch])
                                } else {
                                    0.0
                                };
                                want += weight[ch * w + k] as f64 * v as f64;
                            }
                            if silu_on {
                                want /= 1.0 + (-want).exp();
                            }
                            if ti < s {
                                want = 0.0;
                            }
                            let got = out[(bi * t + ti) * c + ch] as f64;
                            // f32 sums of 5 terms of size ~1: round-off ~1e-6.
                            assert!(
                                (got - want).abs() < 1e-5 * (1.0 + want.abs()),
                                "out {bi},{ti},{ch}: {got} vs {want}"
                            );
                        }
                    }
                }
                let loss = |x: &[f32], weight: &[f32], bias: &[f32]| -> f64 {
                    mk(x, weight, bias).iter().zip(&g).map(|(a, b)| *a as f64 * *b as f64).sum()
                };
                let p = Conv1d {
                    batch: b,
                    seq: t,
                    channels: c,
                    width: w,
                    x: &x,
                    x_stride: stride,
                    weight: &weight,
                    bias: Some(&bias),
                    start: st,
                    silu: silu_on,
                };
                let mut dx = vec![7.0f32; x.len()];
                let mut dw = vec![0.5f32; weight.len()];
                let mut db = vec![0.25f32; c];
                conv1d_bwd(&p, &g, prev, &mut dx, &mut dw, Some(&mut db)).unwrap();
                dw.iter_mut().for_each(|v| *v -= 0.5);
                db.iter_mut().for_each(|v| *v -= 0.25);
                let e = 1e-2f32;
                // Without SiLU the loss is linear in each argument: central differences are exact
                // up to f32 round-off of the forward (~1e-5 of the loss, here Σ of ~500 terms,
                // divided by 2e-2). SiLU adds an O(e²) truncation term (silu''' is bounded by ~0.5).
                let tol = 2e-3;
                let (channels, past): (Vec<usize>, Vec<usize>) = (0..x.len()).step_by(3).partition(|i| i % stride < c);
                // Columns past C are not channels: dx keeps what was there, and the loss does not
                // read them.
                for i in past {
                    assert_eq!(dx[i], 7.0);
                    assert!(central_difference(&x, i, e, |p| loss(p, &weight, &bias)).abs() < 1e-6);
                }
                assert_gradient("dx", &dx, &x, channels, (e, tol), |p| loss(p, &weight, &bias));
                assert_gradient("dw", &dw, &weight, 0..weight.len(), (e, tol), |p| loss(&x, p, &bias));
                assert_gradient("db", &db, &bias, 0..c, (e, tol), |p| loss(&x, &weight, p));
            }
        }
    }

    /// Chunked prefill and decoding reproduce one forward over the whole sequence bit for bit:
    /// the sequence in two pieces (the second continuing from the first's state, one of them
    /// shorter than W − 1), then token by token with the decode step.
    #[test]
    fn pieces_and_decode_steps_match_whole() {
        let mut rng = ChaCha8Rng::seed_from_u64(22);
        let (b, t, c, w) = (2, 9, 6, 4);
        let x = randn(&mut rng, b * t * c);
        let weight = randn(&mut rng, c * w);
        let bias = randn(&mut rng, c);
        let start = [0usize, 2];
        let base = Conv1d {
            batch: b,
            seq: t,
            channels: c,
            width: w,
            x: &x,
            x_stride: c,
            weight: &weight,
            bias: Some(&bias),
            start: Some(&start),
            silu: true,
        };
        let mut whole = vec![0.0; b * t * c];
        let mut whole_state = vec![0.0; b * (w - 1) * c];
        conv1d_fwd(&base, &mut whole, None, Some(&mut whole_state)).unwrap();
        let rows = |lo: usize, hi: usize| -> Vec<f32> {
            (0..b).flat_map(|bi| x[(bi * t + lo) * c..(bi * t + hi) * c].to_vec()).collect()
        };
        for split in [1, 2, 5] {
            let (x1, x2) = (rows(0, split), rows(split, t));
            let mut o1 = vec![0.0; b * split * c];
            let mut s1 = vec![0.0; b * (w - 1) * c];
            conv1d_fwd(&Conv1d { x: &x1, seq: split, ..base }, &mut o1, None, Some(&mut s1)).unwrap();
            // The second piece: row 1's padding (2 positions) lies in the first piece only when
            // split ≥ 2; with split = 1 it still has one padded position.
            let st2: Vec<usize> = start.iter().map(|&s| s.saturating_sub(split)).collect();
            let mut o2 = vec![0.0; b * (t - split) * c];
            let mut s2 = vec![0.0; b * (w - 1) * c];
            conv1d_fwd(
                &Conv1d { x: &x2, seq: t - split, start: Some(&st2), ..base },
                &mut o2,
                Some(&s1),
                Some(&mut s2),
            )
            .unwrap();
            for bi in 0..b {
                for ti in 0..t {
                    let got = if ti < split {
                        &o1[(bi * split + ti) * c..][..c]
                    } else {
                        &o2[(bi * (t - split) + ti - split) * c..][..c]
                    };
                    let want = &whole[(bi * t + ti) * c..][..c];
                    assert_eq!(got, want, "split {split}: ({bi}, {ti})");
                }
            }
            assert_eq!(s2, whole_state, "split {split}");
        }
        // Token by token: a row whose start is still ahead is padding for that step.
        let mut state = vec![0.0; b * (w - 1) * c];
        for ti in 0..t {
            let xr = rows(ti, ti + 1);
            let st: Vec<usize> = start.iter().map(|&s| usize::from(ti < s)).collect();
            let mut o = vec![0.0; b * c];
            conv1d_decode_step(&Conv1d { x: &xr, seq: 1, start: Some(&st), ..base }, &mut state, &mut o).unwrap();
            for bi in 0..b {
                assert_eq!(&o[bi * c..][..c], &whole[(bi * t + ti) * c..][..c], "decode ({bi}, {ti})");
            }
        }
        assert_eq!(state, whole_state);
        // Bad sizes are errors, not panics.
        assert!(conv1d_fwd(&Conv1d { x: &x[1..], ..base }, &mut whole, None, None).is_err());
        assert!(conv1d_fwd(&base, &mut whole[1..], None, None).is_err());
    }
}
