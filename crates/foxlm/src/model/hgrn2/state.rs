//! An HGRN2 layer's inference state on the CPU: per row the GLA state S [H, K, V] and, with short
//! convolutions, their last W − 1 inputs. Its size does not depend on the sequence.

use crate::config::Hgrn2Sizes;

#[derive(Clone, Debug)]
pub struct Hgrn2State {
    pub batch: usize,
    pub sizes: Hgrn2Sizes,
    /// Tokens seen.
    pub len: usize,
    /// [B, H, K, V] (K = V = the head width).
    pub ssm: Vec<f32>,
    /// With short convolutions: q's, f's and i's inputs before the next token [B, W − 1, d]
    /// (indexed by [`ConvOf`](super::ops::ConvOf)), oldest first (zeros before a row's first
    /// token); empty without.
    pub conv: [Vec<f32>; 3],
}

crate::model::scan_state::recurrent_state!([] Hgrn2State);

impl Hgrn2State {
    pub fn new(batch: usize, sizes: Hgrn2Sizes) -> Self {
        let [s, c] = Self::lens(batch, &sizes);
        Self { batch, sizes, len: 0, ssm: vec![0.0; s], conv: [vec![0.0; c], vec![0.0; c], vec![0.0; c]] }
    }

    /// Elements of the GLA state and of each convolution's state, for `batch` rows.
    pub fn lens(batch: usize, s: &Hgrn2Sizes) -> [usize; 2] {
        let d = s.heads * s.head_dim;
        let w = s.conv.map_or(0, |w| w.saturating_sub(1));
        [batch * s.heads * s.head_dim * s.head_dim, batch * w * d]
    }

    /// Bytes held for `batch` rows (f32), whatever the number of tokens.
    pub fn bytes_for(batch: usize, s: &Hgrn2Sizes) -> usize {
        let [a, c] = Self::lens(batch, s);
        4 * (a + 3 * c)
    }

    /// A state whose rows are the given rows (state, row index) of other states of the same
    /// layer, at length `len` (continuous batching).
    pub fn gather(rows: &[(&Hgrn2State, usize)], len: usize) -> Hgrn2State {
        let sizes = rows.first().map_or_else(|| unreachable!("gather of no rows"), |(s, _)| s.sizes);
        let mut out = Hgrn2State::new(rows.len(), sizes);
        let [ns, nc] = Self::lens(1, &sizes);
        for (bi, &(src, r)) in rows.iter().enumerate() {
            out.ssm[bi * ns..(bi + 1) * ns].copy_from_slice(&src.ssm[r * ns..(r + 1) * ns]);
            for (o, s) in out.conv.iter_mut().zip(&src.conv) {
                o[bi * nc..(bi + 1) * nc].copy_from_slice(&s[r * nc..(r + 1) * nc]);
            }
        }
        out.len = len;
        out
    }
}
