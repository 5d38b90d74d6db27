//! A Mamba-2 layer's inference state on the CPU: per row the SSM state S [H, P, N] and the
//! convolution's last W − 1 inputs [W − 1, C]. Its size does not depend on the sequence: decoding
//! a token costs the same after 10 tokens as after 100,000.

use crate::config::Mamba2Sizes;

#[derive(Clone, Debug)]
pub struct Mamba2State {
    pub batch: usize,
    pub sizes: Mamba2Sizes,
    /// Tokens seen (the positions a KV cache would hold).
    pub len: usize,
    /// [B, H, P, N]
    pub ssm: Vec<f32>,
    /// [B, W − 1, C]: the convolution's inputs before the next token, oldest first (zeros
    /// before a row's first token).
    pub conv: Vec<f32>,
}

impl Mamba2State {
    pub fn new(batch: usize, sizes: Mamba2Sizes) -> Self {
        let (ssm, conv) = Self::lens(batch, &sizes);
        Self { batch, sizes, len: 0, ssm: vec![0.0; ssm], conv: vec![0.0; conv] }
    }

    /// Elements of the SSM and convolution states of `batch` rows.
    pub fn lens(batch: usize, s: &Mamba2Sizes) -> (usize, usize) {
        (batch * s.heads * s.head_dim * s.state, batch * s.conv.saturating_sub(1) * s.conv_dim())
    }

    /// Bytes held for `batch` rows (f32), whatever the number of tokens.
    pub fn bytes_for(batch: usize, s: &Mamba2Sizes) -> usize {
        let (a, b) = Self::lens(batch, s);
        4 * (a + b)
    }

    /// A state whose rows are the given rows (state, row index) of other states of the same
    /// layer, at length `len` (continuous batching: the state does not depend on positions).
    pub fn gather(rows: &[(&Mamba2State, usize)], len: usize) -> Mamba2State {
        let sizes = rows.first().map_or_else(|| unreachable!("gather of no rows"), |(s, _)| s.sizes);
        let mut out = Mamba2State::new(rows.len(), sizes);
        let (ns, nc) = Self::lens(1, &sizes);
        for (bi, &(src, r)) in rows.iter().enumerate() {
            out.ssm[bi * ns..(bi + 1) * ns].copy_from_slice(&src.ssm[r * ns..(r + 1) * ns]);
            out.conv[bi * nc..(bi + 1) * nc].copy_from_slice(&src.conv[r * nc..(r + 1) * nc]);
        }
        out.len = len;
        out
    }
}
