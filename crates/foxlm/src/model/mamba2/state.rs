//! A Mamba-2 layer's inference state: per row the SSM state S [H, P, N] and the convolution's last
//! W − 1 inputs [W − 1, C] ([`ScanState`], [`GpuScanState`] on the GPU).

use crate::config::Mamba2Sizes;
use crate::model::scan_state::{GpuScanState, ScanSizes, ScanState};

impl ScanSizes for Mamba2Sizes {
    fn state_lens(&self, batch: usize) -> (usize, usize) {
        (batch * self.heads * self.head_dim * self.state, batch * self.conv.saturating_sub(1) * self.conv_dim())
    }
}

/// ssm [B, H, P, N], conv [B, W − 1, C].
pub type Mamba2State = ScanState<Mamba2Sizes>;
/// [`Mamba2State`] on the GPU.
pub type GpuMamba2State = GpuScanState<Mamba2Sizes>;
