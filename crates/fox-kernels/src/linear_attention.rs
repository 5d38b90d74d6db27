//! What the linear-attention problems ([`crate::delta_rule`], [`crate::gla`]) share: per batch row
//! and head a state [K, V], inputs [B, T, H, ·] with left padding before `start[b]`, and one rayon
//! task per (b, h) that sees only that head's real positions, gathered contiguously.

use crate::chunks;
use anyhow::{ensure, Result};
use rayon::prelude::*;

/// The states [K, V] entering each chunk of n positions (for a backward, which walks the chunks in
/// reverse), from `init`, `advance(c0, len, S)` carrying S over one chunk.
pub(crate) fn chunk_states(
    n: usize,
    chunk: usize,
    init: &[f32],
    mut advance: impl FnMut(usize, usize, &mut [f32]),
) -> Vec<f32> {
    let mut states = Vec::with_capacity(n.div_ceil(chunk) * init.len());
    let mut s = init.to_vec();
    for (c0, len) in chunks(n, chunk) {
        states.extend_from_slice(&s);
        advance(c0, len, &mut s);
    }
    states
}

/// How many values one position of one head holds.
#[derive(Clone, Copy)]
pub(crate) enum Width {
    K,
    V,
    One,
}

/// A problem's sizes and padding; `op` names it in errors.
pub(crate) struct Shape<'a> {
    pub op: &'static str,
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub start: Option<&'a [usize]>,
}

impl Shape<'_> {
    fn width(&self, w: Width) -> usize {
        match w {
            Width::K => self.k_dim,
            Width::V => self.v_dim,
            Width::One => 1,
        }
    }

    /// The sizes, `start` and each named input's length ([B, T, H, width]).
    pub fn check(&self, inputs: &[(&str, usize, Width)]) -> Result<()> {
        let (op, b) = (self.op, self.batch);
        ensure!(self.heads > 0 && self.k_dim > 0 && self.v_dim > 0, "{op}: heads, k_dim and v_dim must be positive");
        self.check_lens(inputs)?;
        if let Some(s) = self.start {
            ensure!(s.len() == b, "{op}: start has {} rows, not B = {b}", s.len());
        }
        Ok(())
    }

    /// Each named buffer's length ([B, T, H, width]): the inputs, or their gradients.
    pub fn check_lens(&self, inputs: &[(&str, usize, Width)]) -> Result<()> {
        let op = self.op;
        let n = self.batch * self.seq * self.heads;
        for &(what, len, w) in inputs {
            let dims = match w {
                Width::K => "B·T·H·K",
                Width::V => "B·T·H·V",
                Width::One => "B·T·H",
            };
            let want = n * self.width(w);
            ensure!(len == want, "{op}: {what} has {len} values, not {dims} = {want}");
        }
        Ok(())
    }

    pub fn state_len(&self) -> usize {
        self.batch * self.heads * self.k_dim * self.v_dim
    }

    pub fn check_state(&self, n: usize, what: &str) -> Result<()> {
        ensure!(n == self.state_len(), "{}: {what} has {n} values, not B·H·K·V = {}", self.op, self.state_len());
        Ok(())
    }

    /// o (or do) [B, T, H, V] and the states [B, H, K, V], where given.
    pub fn check_out(&self, o: usize, init: Option<usize>, fin: Option<usize>) -> Result<()> {
        let n = self.batch * self.seq * self.heads * self.v_dim;
        ensure!(o == n, "{}: o has {o} values, not B·T·H·V = {n}", self.op);
        if let Some(s) = init {
            self.check_state(s, "the initial state")?;
        }
        if let Some(s) = fin {
            self.check_state(s, "the final state")?;
        }
        Ok(())
    }

    /// Row b's first real position.
    pub fn start(&self, b: usize) -> usize {
        self.start.map_or(0, |s| s[b].min(self.seq))
    }

    /// Row b's real positions of head h in x [B, T, H, w], contiguous [n, w].
    pub fn gather(&self, x: &[f32], w: usize, b: usize, h: usize) -> Vec<f32> {
        let (t, hs) = (self.seq, self.heads);
        let mut out = Vec::with_capacity((t - self.start(b)) * w);
        for ti in self.start(b)..t {
            out.extend_from_slice(&x[((b * t + ti) * hs + h) * w..][..w]);
        }
        out
    }

    /// The inverse of [`Shape::gather`] for every head in order bh = b·H + h: x [B, T, H, w], 0 at
    /// padding.
    pub fn scatter<'x>(&self, x: &mut [f32], heads: impl Iterator<Item = &'x [f32]>, w: usize) {
        let (t, hs) = (self.seq, self.heads);
        x.fill(0.0);
        for (bh, src) in heads.enumerate() {
            let (b, h) = (bh / hs, bh % hs);
            for (i, ti) in (self.start(b)..t).enumerate() {
                x[((b * t + ti) * hs + h) * w..][..w].copy_from_slice(&src[i * w..][..w]);
            }
        }
    }

    /// Every head's state [K, V] in order bh into states [B, H, K, V].
    pub fn put_states<'x>(&self, states: &mut [f32], heads: impl Iterator<Item = &'x [f32]>) {
        let sn = self.k_dim * self.v_dim;
        for (bh, s) in heads.enumerate() {
            states[bh * sn..][..sn].copy_from_slice(s);
        }
    }

    /// A decoding step's sizes: one position per row, o [B, H, V] and the state.
    pub fn check_decode(&self, o: usize, state: usize) -> Result<()> {
        ensure!(self.seq == 1, "{}_decode_step: one position per row, not {}", self.op, self.seq);
        self.check_out(o, Some(state), None)
    }

    /// A decoding step over [`Shape::check_decode`]ed buffers: `head(bh, state, out)` on every
    /// (b, h) in parallel, its state [K, V] and out [V] zeroed; a row still in its padding gets
    /// o = 0 and keeps its state.
    pub fn decode<F>(&self, state: &mut [f32], o: &mut [f32], head: F)
    where
        F: Fn(usize, &mut [f32], &mut [f32]) + Sync + Send,
    {
        let h = self.heads;
        state.par_chunks_mut(self.k_dim * self.v_dim).zip(o.par_chunks_mut(self.v_dim)).enumerate().for_each(
            |(bh, (s, or))| {
                or.fill(0.0);
                if self.start(bh / h) == 0 {
                    head(bh, s, or);
                }
            },
        );
    }

    /// Runs `head(b, h, state, out)` on every (b, h) in parallel from its initial state (zero
    /// without `init`) with out [n, V] zeroed, then writes o [B, T, H, V] (0 at padding) and the
    /// final states.
    pub fn forward<F>(
        &self,
        o: &mut [f32],
        init: Option<&[f32]>,
        final_state: Option<&mut [f32]>,
        head: F,
    ) -> Result<()>
    where
        F: Fn(usize, usize, &mut [f32], &mut [f32]) + Sync,
    {
        self.check_out(o.len(), init.map(|s| s.len()), final_state.as_ref().map(|s| s.len()))?;
        let (h, vd, sn) = (self.heads, self.v_dim, self.k_dim * self.v_dim);
        let per: Vec<(Vec<f32>, Vec<f32>)> = (0..self.batch * h)
            .into_par_iter()
            .map(|bh| {
                let (b, hi) = (bh / h, bh % h);
                let mut s = init.map_or_else(|| vec![0.0; sn], |i| i[bh * sn..][..sn].to_vec());
                let mut out = vec![0.0; (self.seq - self.start(b)) * vd];
                head(b, hi, &mut s, &mut out);
                (out, s)
            })
            .collect();
        self.scatter(o, per.iter().map(|(out, _)| &out[..]), vd);
        if let Some(f) = final_state {
            self.put_states(f, per.iter().map(|(_, s)| &s[..]));
        }
        Ok(())
    }

    /// Runs `head(b, h, do, S_0, dS_final)` on every (b, h) in parallel, do [n, V] gathered and the
    /// states zero where not given; the caller has checked the lengths ([`Shape::check_out`]) and
    /// scatters the results.
    pub fn backward<G, F>(&self, dout: &[f32], init: Option<&[f32]>, dfinal: Option<&[f32]>, head: F) -> Vec<G>
    where
        G: Send,
        F: Fn(usize, usize, &[f32], &[f32], &[f32]) -> G + Sync,
    {
        let (h, sn) = (self.heads, self.k_dim * self.v_dim);
        (0..self.batch * h)
            .into_par_iter()
            .map(|bh| {
                let (b, hi) = (bh / h, bh % h);
                let d = self.gather(dout, self.v_dim, b, hi);
                let zero = vec![0.0; sn];
                let s0 = init.map_or(&zero[..], |i| &i[bh * sn..][..sn]);
                let df = dfinal.map_or(&zero[..], |f| &f[bh * sn..][..sn]);
                head(b, hi, &d, s0, df)
            })
            .collect()
    }
}

#[cfg(test)]
pub(crate) mod testing;
