//! A Mamba layer's inference state: per row the scan state h [Di, N] and the convolution's last
//! W − 1 inputs [W − 1, Di] ([`ScanState`], [`GpuScanState`] on the GPU).

use crate::config::MambaSizes;
use crate::model::scan_state::{GpuScanState, ScanSizes, ScanState};

impl ScanSizes for MambaSizes {
    fn state_lens(&self, batch: usize) -> (usize, usize) {
        (batch * self.inner * self.state, batch * self.conv.saturating_sub(1) * self.inner)
    }
}

/// ssm [B, Di, N], conv [B, W − 1, Di].
pub type MambaState = ScanState<MambaSizes>;
/// [`MambaState`] on the GPU.
pub type GpuMambaState = GpuScanState<MambaSizes>;
