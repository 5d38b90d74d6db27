//! An HGRN2 layer's inference state: per row the GLA state S [H, K, V] (K = V = the head width)
//! and, with short convolutions, their last W − 1 inputs (a [`ScanState`]).

use crate::backend::scan_state::{GpuScanState, ScanSizes, ScanState};
use crate::config::Hgrn2Sizes;

impl ScanSizes for Hgrn2Sizes {
    const FAMILY: &'static str = "an HGRN2";
    fn ssm_len(&self, batch: usize) -> usize {
        batch * self.heads * self.head_dim * self.head_dim
    }
    /// q's, f's and i's (indexed by [`ConvOf`](super::ops::ConvOf)), [B, W − 1, d] each; empty
    /// without short convolutions.
    fn conv_lens(&self, batch: usize) -> Vec<usize> {
        let w = self.conv.map_or(0, |w| w.saturating_sub(1));
        vec![batch * w * self.heads * self.head_dim; 3]
    }
}

/// ssm [B, H, K, V] and the convolutions' states, in the backend's buffers `V`.
pub type Hgrn2State<V = Vec<f32>> = ScanState<Hgrn2Sizes, V>;
/// [`Hgrn2State`] on the GPU.
pub type GpuHgrn2State = GpuScanState<Hgrn2Sizes>;
