//! A Mamba-2 layer's inference state: per row the SSM state S [H, P, N] and the convolution's last
//! W − 1 inputs [W − 1, C] (a [`ScanState`]).

use crate::backend::scan_state::{GpuScanState, ScanSizes, ScanState};
use crate::config::Mamba2Sizes;

impl ScanSizes for Mamba2Sizes {
    const FAMILY: &'static str = "a Mamba-2";
    fn ssm_len(&self, batch: usize) -> usize {
        batch * self.heads * self.head_dim * self.state
    }
    fn conv_lens(&self, batch: usize) -> Vec<usize> {
        vec![batch * self.conv.saturating_sub(1) * self.conv_dim()]
    }
}

/// ssm [B, H, P, N], conv [B, W − 1, C], in the backend's buffers `V`.
pub type Mamba2State<V = Vec<f32>> = ScanState<Mamba2Sizes, V>;
/// [`Mamba2State`] on the GPU.
pub type GpuMamba2State = GpuScanState<Mamba2Sizes>;
