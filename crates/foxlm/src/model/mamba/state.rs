//! A Mamba layer's inference state: per row the scan state h [Di, N] and the convolution's last
//! W − 1 inputs [W − 1, Di] (a [`ScanState`]).

use crate::backend::scan_state::{GpuScanState, ScanSizes, ScanState};
use crate::config::MambaSizes;

impl ScanSizes for MambaSizes {
    const FAMILY: &'static str = "a Mamba";
    fn ssm_len(&self, batch: usize) -> usize {
        batch * self.inner * self.state
    }
    fn conv_lens(&self, batch: usize) -> Vec<usize> {
        vec![batch * self.conv.saturating_sub(1) * self.inner]
    }
}

/// ssm [B, Di, N], conv [B, W − 1, Di], in the backend's buffers `V`.
pub type MambaState<V = Vec<f32>> = ScanState<MambaSizes, V>;
/// [`MambaState`] on the GPU.
pub type GpuMambaState = GpuScanState<MambaSizes>;
