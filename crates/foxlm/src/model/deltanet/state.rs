//! A DeltaNet layer's inference state on the CPU: per row the delta-rule state S [H, K, V] and
//! the three short convolutions' last W − 1 inputs. Its size does not depend on the sequence.

use crate::config::DeltaNetSizes;

#[derive(Clone, Debug)]
pub struct DeltaNetState {
    pub batch: usize,
    pub sizes: DeltaNetSizes,
    /// Tokens seen.
    pub len: usize,
    /// [B, H, K, V]
    pub ssm: Vec<f32>,
    /// q's, k's and v's convolution inputs before the next token (indexed by
    /// [`ConvOf`](super::ops::ConvOf)), [B, W − 1, H·K], [B, W − 1, H·K], [B, W − 1, H·V], oldest
    /// first (zeros before a row's first token).
    pub conv: [Vec<f32>; 3],
}

crate::model::scan_state::recurrent_state!([] DeltaNetState);

impl DeltaNetState {
    pub fn new(batch: usize, sizes: DeltaNetSizes) -> Self {
        let [s, q, v] = Self::lens(batch, &sizes);
        Self { batch, sizes, len: 0, ssm: vec![0.0; s], conv: [vec![0.0; q], vec![0.0; q], vec![0.0; v]] }
    }

    /// Elements of the state, of q's (and k's) convolution state and of v's, for `batch` rows.
    pub fn lens(batch: usize, s: &DeltaNetSizes) -> [usize; 3] {
        let w = s.conv.saturating_sub(1);
        [batch * s.heads * s.head_k * s.head_v, batch * w * s.key_dim(), batch * w * s.value_dim()]
    }

    /// Bytes held for `batch` rows (f32), whatever the number of tokens.
    pub fn bytes_for(batch: usize, s: &DeltaNetSizes) -> usize {
        let [a, b, c] = Self::lens(batch, s);
        4 * (a + 2 * b + c)
    }

    /// A state whose rows are the given rows (state, row index) of other states of the same
    /// layer, at length `len` (continuous batching).
    pub fn gather(rows: &[(&DeltaNetState, usize)], len: usize) -> DeltaNetState {
        let sizes = rows.first().map_or_else(|| unreachable!("gather of no rows"), |(s, _)| s.sizes);
        let mut out = DeltaNetState::new(rows.len(), sizes);
        let [ns, nq, nv] = Self::lens(1, &sizes);
        for (bi, &(src, r)) in rows.iter().enumerate() {
            out.ssm[bi * ns..(bi + 1) * ns].copy_from_slice(&src.ssm[r * ns..(r + 1) * ns]);
            for ((o, s), n) in out.conv.iter_mut().zip(&src.conv).zip([nq, nq, nv]) {
                o[bi * n..(bi + 1) * n].copy_from_slice(&s[r * n..(r + 1) * n]);
            }
        }
        out.len = len;
        out
    }
}
