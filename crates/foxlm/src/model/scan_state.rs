//! The inference state of a selective-scan layer (Mamba, Mamba-2), on the CPU ([`ScanState`])
//! and on the GPU ([`GpuScanState`]): per row the scan state and the short convolution's last
//! W − 1 inputs. Its size does not depend on the sequence: decoding a token costs the same after
//! 10 tokens as after 100,000. Each family says its layouts (`mamba/state.rs`,
//! `mamba2/state.rs`).

use anyhow::Result;
use fox_kernels::cuda::cudarc::driver::CudaSlice;
use fox_kernels::cuda::Gpu;

/// A layer's sizes, as far as its state goes.
pub trait ScanSizes: Copy {
    /// Elements of the scan and convolution states of `batch` rows.
    fn state_lens(&self, batch: usize) -> (usize, usize);
}

#[derive(Clone, Debug)]
pub struct ScanState<S> {
    pub batch: usize,
    pub sizes: S,
    /// Tokens seen (the positions a KV cache would hold).
    pub len: usize,
    /// The scan state, [B, ...] (the family's layout).
    pub ssm: Vec<f32>,
    /// [B, W − 1, C]: the convolution's inputs before the next token, oldest first (zeros
    /// before a row's first token).
    pub conv: Vec<f32>,
}

impl<S: ScanSizes> ScanState<S> {
    pub fn new(batch: usize, sizes: S) -> Self {
        let (ssm, conv) = Self::lens(batch, &sizes);
        Self { batch, sizes, len: 0, ssm: vec![0.0; ssm], conv: vec![0.0; conv] }
    }

    /// Elements of the scan and convolution states of `batch` rows.
    pub fn lens(batch: usize, s: &S) -> (usize, usize) {
        s.state_lens(batch)
    }

    /// Bytes held for `batch` rows (f32), whatever the number of tokens.
    pub fn bytes_for(batch: usize, s: &S) -> usize {
        let (a, b) = Self::lens(batch, s);
        4 * (a + b)
    }

    /// A state whose rows are the given rows (state, row index) of other states of the same
    /// layer, at length `len` (continuous batching: the state does not depend on positions).
    /// Panics if `rows` is empty.
    pub fn gather(rows: &[(&Self, usize)], len: usize) -> Self {
        let sizes = rows.first().map_or_else(|| unreachable!("gather of no rows"), |(s, _)| s.sizes);
        let mut out = Self::new(rows.len(), sizes);
        let (ns, nc) = Self::lens(1, &sizes);
        for (bi, &(src, r)) in rows.iter().enumerate() {
            out.ssm[bi * ns..(bi + 1) * ns].copy_from_slice(&src.ssm[r * ns..(r + 1) * ns]);
            out.conv[bi * nc..(bi + 1) * nc].copy_from_slice(&src.conv[r * nc..(r + 1) * nc]);
        }
        out.len = len;
        out
    }
}

/// [`ScanState`] on the GPU, in f32.
pub struct GpuScanState<S> {
    pub batch: usize,
    pub sizes: S,
    pub len: usize,
    pub ssm: CudaSlice<f32>,
    pub conv: CudaSlice<f32>,
}

impl<S: ScanSizes> GpuScanState<S> {
    pub fn new(gpu: &Gpu, batch: usize, sizes: S) -> Result<Self> {
        let (ssm, conv) = sizes.state_lens(batch);
        Ok(Self { batch, sizes, len: 0, ssm: gpu.zeros(ssm.max(1))?, conv: gpu.zeros(conv.max(1))? })
    }
}
