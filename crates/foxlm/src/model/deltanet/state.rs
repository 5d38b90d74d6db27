//! A DeltaNet layer's inference state: per row the delta-rule state S [H, K, V] and the three
//! short convolutions' last W − 1 inputs (a [`ScanState`]).

use crate::backend::scan_state::{GpuScanState, ScanSizes, ScanState};
use crate::config::DeltaNetSizes;

impl ScanSizes for DeltaNetSizes {
    const FAMILY: &'static str = "a DeltaNet";
    fn ssm_len(&self, batch: usize) -> usize {
        batch * self.heads * self.head_k * self.head_v
    }
    /// q's, k's and v's (indexed by [`ConvOf`](super::ops::ConvOf)): [B, W − 1, H·K],
    /// [B, W − 1, H·K], [B, W − 1, H·V].
    fn conv_lens(&self, batch: usize) -> Vec<usize> {
        let w = self.conv.saturating_sub(1);
        vec![batch * w * self.key_dim(), batch * w * self.key_dim(), batch * w * self.value_dim()]
    }
}

/// ssm [B, H, K, V] and the convolutions' states, in the backend's buffers `V`.
pub type DeltaNetState<V = Vec<f32>> = ScanState<DeltaNetSizes, V>;
/// [`DeltaNetState`] on the GPU.
pub type GpuDeltaNetState = GpuScanState<DeltaNetSizes>;
