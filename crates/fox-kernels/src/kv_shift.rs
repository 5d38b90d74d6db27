//! KV-shift (FoX Pro): k_t = α_t · k̃_{t−1} + (1 − α_t) · k̃_t per head, α_t = sigmoid(shift_proj(x_t)).
//!
//! `prev` gives k̃ before the first position of each row (zeros for a fresh sequence, the cached
//! last k̃ when decoding). Positions before `start[b]` (left padding) count as k̃ = 0 for the first
//! real token.

use rayon::prelude::*;

/// x: [B, T, H·D] unmixed k̃, alpha: [B, T, H], out: [B, T, H·D].
#[allow(clippy::too_many_arguments)]
pub fn kv_shift_fwd(
    out: &mut [f32],
    x: &[f32],
    alpha: &[f32],
    prev: Option<&[f32]>,
    start: Option<&[usize]>,
    b: usize,
    t: usize,
    h: usize,
    d: usize,
) {
    let hd = h * d;
    out.par_chunks_mut(t * hd).enumerate().for_each(|(bi, ob)| {
        let s = start.map_or(0, |s| s[bi]);
        for ti in 0..t {
            for hi in 0..h {
                let a = alpha[(bi * t + ti) * h + hi];
                let cur = &x[(bi * t + ti) * hd + hi * d..][..d];
                let o = &mut ob[ti * hd + hi * d..][..d];
                if ti < s {
                    o.copy_from_slice(cur);
                    continue;
                }
                let p: Option<&[f32]> = if ti > s {
                    Some(&x[(bi * t + ti - 1) * hd + hi * d..][..d])
                } else if s == 0 {
                    prev.map(|p| &p[bi * hd + hi * d..][..d])
                } else {
                    None
                };
                match p {
                    Some(p) => {
                        for c in 0..d {
                            o[c] = a * p[c] + (1.0 - a) * cur[c];
                        }
                    }
                    None => {
                        for c in 0..d {
                            o[c] = (1.0 - a) * cur[c];
                        }
                    }
                }
            }
        }
        let _ = b;
    });
}

/// Backward (no `prev`: training runs whole sequences). dx: [B,T,H·D], dalpha: [B,T,H].
#[allow(clippy::too_many_arguments)]
pub fn kv_shift_bwd(
    dx: &mut [f32],
    dalpha: &mut [f32],
    dout: &[f32],
    x: &[f32],
    alpha: &[f32],
    start: Option<&[usize]>,
    t: usize,
    h: usize,
    d: usize,
) {
    let hd = h * d;
    dx.par_chunks_mut(t * hd)
        .zip(dalpha.par_chunks_mut(t * h))
        .enumerate()
        .for_each(|(bi, (dxb, dab))| {
            let s = start.map_or(0, |s| s[bi]);
            for ti in 0..t {
                for hi in 0..h {
                    let base = (bi * t + ti) * hd + hi * d;
                    let dcur = &mut dxb[ti * hd + hi * d..][..d];
                    let go = &dout[base..base + d];
                    if ti < s {
                        dcur.copy_from_slice(go);
                        dab[ti * h + hi] = 0.0;
                        continue;
                    }
                    let a = alpha[(bi * t + ti) * h + hi];
                    let cur = &x[base..base + d];
                    let mut da = 0.0f32;
                    // d/dα [α p + (1−α) c] = p − c
                    if ti > s {
                        let p = &x[base - hd..base - hd + d];
                        for c in 0..d {
                            da += go[c] * (p[c] - cur[c]);
                        }
                    } else {
                        for c in 0..d {
                            da -= go[c] * cur[c];
                        }
                    }
                    dab[ti * h + hi] = da;
                    // k̃_t feeds k_t with (1−α_t) and k_{t+1} with α_{t+1}.
                    let next_a = if ti + 1 < t {
                        alpha[(bi * t + ti + 1) * h + hi]
                    } else {
                        0.0
                    };
                    for c in 0..d {
                        let mut g = go[c] * (1.0 - a);
                        if ti + 1 < t {
                            g += dout[base + hd + c] * next_a;
                        }
                        dcur[c] = g;
                    }
                }
            }
        });
}
