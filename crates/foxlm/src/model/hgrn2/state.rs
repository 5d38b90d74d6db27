//! An HGRN2 layer's inference state on the CPU: per row the GLA state S [H, K, V] (no short
//! convolutions, so nothing else). Its size does not depend on the sequence.

use crate::config::Hgrn2Sizes;

#[derive(Clone, Debug)]
pub struct Hgrn2State {
    pub batch: usize,
    pub sizes: Hgrn2Sizes,
    /// Tokens seen.
    pub len: usize,
    /// [B, H, K, V] (K = V = the head width).
    pub ssm: Vec<f32>,
}

impl Hgrn2State {
    pub fn new(batch: usize, sizes: Hgrn2Sizes) -> Self {
        Self { batch, sizes, len: 0, ssm: vec![0.0; Self::len_for(batch, &sizes)] }
    }

    /// Elements of the state for `batch` rows.
    pub fn len_for(batch: usize, s: &Hgrn2Sizes) -> usize {
        batch * s.heads * s.head_dim * s.head_dim
    }

    /// Bytes held for `batch` rows (f32), whatever the number of tokens.
    pub fn bytes_for(batch: usize, s: &Hgrn2Sizes) -> usize {
        4 * Self::len_for(batch, s)
    }

    /// A state whose rows are the given rows (state, row index) of other states of the same
    /// layer, at length `len` (continuous batching).
    pub fn gather(rows: &[(&Hgrn2State, usize)], len: usize) -> Hgrn2State {
        let sizes = rows.first().map_or_else(|| unreachable!("gather of no rows"), |(s, _)| s.sizes);
        let mut out = Hgrn2State::new(rows.len(), sizes);
        let ns = Self::len_for(1, &sizes);
        for (bi, &(src, r)) in rows.iter().enumerate() {
            out.ssm[bi * ns..(bi + 1) * ns].copy_from_slice(&src.ssm[r * ns..(r + 1) * ns]);
        }
        out.len = len;
        out
    }
}
