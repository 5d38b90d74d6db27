//! What the device linear-attention problems ([`super::gla`], [`super::delta_rule`]) share, as
//! [`crate::linear_attention`] on the CPU: the sizes B, T, H, K, V, inputs [B, T, H, ·] with left
//! padding before start[b], and states [B, H, K, V] in f32, and the length checks that follow.

use super::kargs::{int, need, need_opt, Bound, DecodeStep};
use anyhow::{ensure, Result};
use cudarc::driver::CudaSlice;

/// A device problem's sizes and padding.
#[derive(Clone, Copy)]
pub(crate) struct DevShape<'a> {
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    pub start: Option<&'a CudaSlice<i32>>,
}

impl DevShape<'_> {
    /// Positions of every head: B·T·H.
    pub fn rows(&self) -> usize {
        self.batch * self.seq * self.heads
    }

    /// Elements of the states [B, H, K, V].
    pub fn states(&self) -> usize {
        self.batch * self.heads * self.k_dim * self.v_dim
    }

    /// Positive H, K and V; q, k [B, T, H, K], v [B, T, H, V] and start [B] long enough, and the
    /// inputs' offsets in the kernels' 32 bits.
    pub fn check<T>(&self, op: &str, q: &CudaSlice<T>, k: &CudaSlice<T>, v: &CudaSlice<T>) -> Result<()> {
        let (kd, vd, n) = (self.k_dim, self.v_dim, self.rows());
        ensure!(self.heads > 0 && kd > 0 && vd > 0, "{op}: heads, k_dim and v_dim must be positive");
        need(op, "q", q, n * kd)?;
        need(op, "k", k, n * kd)?;
        need(op, "v", v, n * vd)?;
        need_opt(op, "start", self.start, self.batch)?;
        int(op, n * kd.max(vd))?;
        Ok(())
    }

    /// The backward's states, where given: the forward's `init`, the final state's gradient
    /// `dfinal` and the initial state's `dinit`.
    pub fn check_states(
        &self,
        op: &str,
        init: Option<&CudaSlice<f32>>,
        dfinal: Option<&CudaSlice<f32>>,
        dinit: Option<&CudaSlice<f32>>,
    ) -> Result<()> {
        for (what, s) in [("init", init), ("dfinal", dfinal), ("dinit", dinit)] {
            need_opt(op, what, s, self.states())?;
        }
        Ok(())
    }

    /// A decode step's checks after the problem's own: one position per row, K at most `k_most`
    /// (the kernel's shared arrays), `state` [B, H, K, V] and `o` [B, H, V]. False where there is
    /// no row to launch for.
    pub fn check_decode<T>(&self, op: &str, k_most: usize, state: &CudaSlice<f32>, o: &CudaSlice<T>) -> Result<bool> {
        let bound = Bound { what: "k_dim", value: self.k_dim, most: k_most, why: "" };
        let outs = self.batch * self.heads * self.v_dim;
        DecodeStep { seq: self.seq, bound, state, states: self.states(), out_name: "o", out: o, outs }.check(op)?;
        Ok(self.batch > 0)
    }
}
