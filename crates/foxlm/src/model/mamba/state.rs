//! A Mamba layer's inference state on the CPU: per row the scan state h [Di, N] and the
//! convolution's last W − 1 inputs [W − 1, Di]. Its size does not depend on the sequence.

use crate::config::MambaSizes;

#[derive(Clone, Debug)]
pub struct MambaState {
    pub batch: usize,
    pub sizes: MambaSizes,
    /// Tokens seen (the positions a KV cache would hold).
    pub len: usize,
    /// [B, Di, N]
    pub ssm: Vec<f32>,
    /// [B, W − 1, Di]: the convolution's inputs before the next token, oldest first (zeros
    /// before a row's first token).
    pub conv: Vec<f32>,
}

impl MambaState {
    pub fn new(batch: usize, sizes: MambaSizes) -> Self {
        let (ssm, conv) = Self::lens(batch, &sizes);
        Self { batch, sizes, len: 0, ssm: vec![0.0; ssm], conv: vec![0.0; conv] }
    }

    /// Elements of the scan and convolution states of `batch` rows.
    pub fn lens(batch: usize, s: &MambaSizes) -> (usize, usize) {
        (batch * s.inner * s.state, batch * s.conv.saturating_sub(1) * s.inner)
    }

    /// Bytes held for `batch` rows (f32), whatever the number of tokens.
    pub fn bytes_for(batch: usize, s: &MambaSizes) -> usize {
        let (a, b) = Self::lens(batch, s);
        4 * (a + b)
    }

    /// A state whose rows are the given rows (state, row index) of other states of the same
    /// layer, at length `len` (continuous batching: the state does not depend on positions).
    /// Panics if `rows` is empty.
    pub fn gather(rows: &[(&MambaState, usize)], len: usize) -> MambaState {
        let sizes = rows.first().map_or_else(|| unreachable!("gather of no rows"), |(s, _)| s.sizes);
        let mut out = MambaState::new(rows.len(), sizes);
        let (ns, nc) = Self::lens(1, &sizes);
        for (bi, &(src, r)) in rows.iter().enumerate() {
            out.ssm[bi * ns..(bi + 1) * ns].copy_from_slice(&src.ssm[r * ns..(r + 1) * ns]);
            out.conv[bi * nc..(bi + 1) * nc].copy_from_slice(&src.conv[r * nc..(r + 1) * nc]);
        }
        out.len = len;
        out
    }
}
