//! The inference state of a recurrent layer (Mamba-2, Mamba, DeltaNet, HGRN2): per row the
//! scan state and each short convolution's last W − 1 inputs, in the backend's f32 buffers
//! ([`ScanState`]; `Vec<f32>` on the CPU, [`GpuScanState`] on the GPU). Its size does not
//! depend on the sequence: decoding a token costs the same after 10 tokens as after 100,000.
//! Each family says its layouts (`<family>/state.rs`); how a forward meets its state
//! ([`forward_carrying`]) is the same for all of them.

use crate::backend::cuda::{dtod, grown};
use anyhow::{anyhow, ensure, Result};
use fox_kernels::cuda::cudarc::driver::CudaSlice;
use fox_kernels::cuda::Gpu;

/// A recurrent layer's sizes, as far as its state goes.
pub trait ScanSizes: Copy {
    /// The family, as messages name its state ("a Mamba-2").
    const FAMILY: &'static str;
    /// Elements of the scan state of `batch` rows.
    fn ssm_len(&self, batch: usize) -> usize;
    /// Elements of each short convolution's state of `batch` rows, in the order of the layer's
    /// convolutions ([`crate::backend::ShortConv::slot`]).
    fn conv_lens(&self, batch: usize) -> Vec<usize>;
}

/// A recurrent layer's inference state over buffers `V` (the backend's f32 buffer).
#[derive(Clone, Debug)]
pub struct ScanState<S, V = Vec<f32>> {
    pub batch: usize,
    pub sizes: S,
    /// Tokens seen (the positions a KV cache would hold).
    pub len: usize,
    /// The scan state, [B, ...] (the family's layout).
    pub ssm: V,
    /// Per short convolution, [B, W − 1, C]: its inputs before the next token, oldest first
    /// (zeros before a row's first token).
    pub conv: Vec<V>,
}

/// [`ScanState`] on the GPU, in f32.
pub type GpuScanState<S> = ScanState<S, CudaSlice<f32>>;

impl<S: ScanSizes> ScanState<S> {
    pub fn new(batch: usize, sizes: S) -> Self {
        let conv = sizes.conv_lens(batch).into_iter().map(|n| vec![0.0; n]).collect();
        Self { batch, sizes, len: 0, ssm: vec![0.0; sizes.ssm_len(batch)], conv }
    }

    /// Bytes held for `batch` rows (f32), whatever the number of tokens.
    pub fn bytes_for(batch: usize, s: &S) -> usize {
        4 * (s.ssm_len(batch) + s.conv_lens(batch).iter().sum::<usize>())
    }

    /// A state whose rows are the given rows (state, row index) of other states of the same
    /// layer, at length `len` (continuous batching: the state does not depend on positions).
    /// Panics if `rows` is empty.
    pub fn gather(rows: &[(&Self, usize)], len: usize) -> Self {
        let sizes = rows.first().map_or_else(|| unreachable!("gather of no rows"), |(s, _)| s.sizes);
        let mut out = Self::new(rows.len(), sizes);
        let (ns, nc) = (sizes.ssm_len(1), sizes.conv_lens(1));
        for (bi, &(src, r)) in rows.iter().enumerate() {
            out.ssm[bi * ns..(bi + 1) * ns].copy_from_slice(&src.ssm[r * ns..(r + 1) * ns]);
            for ((o, s), &n) in out.conv.iter_mut().zip(&src.conv).zip(&nc) {
                o[bi * n..(bi + 1) * n].copy_from_slice(&s[r * n..(r + 1) * n]);
            }
        }
        out.len = len;
        out
    }
}

impl<S: ScanSizes> GpuScanState<S> {
    pub fn new(gpu: &Gpu, batch: usize, sizes: S) -> Result<Self> {
        let ssm = gpu.zeros(sizes.ssm_len(batch).max(1))?;
        let conv = sizes.conv_lens(batch).into_iter().map(|n| gpu.zeros(n.max(1))).collect::<Result<_>>()?;
        Ok(Self { batch, sizes, len: 0, ssm, conv })
    }
}

impl<S: ScanSizes, V> ScanState<S, V> {
    /// Fails unless the state holds `rows` rows.
    pub fn check_rows(&self, rows: usize) -> Result<()> {
        ensure!(self.batch == rows, "{} state of {} rows for a batch of {rows}", S::FAMILY, self.batch);
        Ok(())
    }

    /// Short convolution `slot`'s state, for a forward over `rows` rows.
    pub fn conv_mut(&mut self, slot: usize, rows: usize) -> Result<&mut V> {
        self.check_rows(rows)?;
        self.conv.get_mut(slot).ok_or_else(|| anyhow!("{} state has no convolution {slot}", S::FAMILY))
    }
}

/// Where a recurrent forward starts from.
pub enum Carry<'s, St> {
    /// No state: the sequences start from zeros.
    Zeros,
    /// One token on from the state, advancing it (the decode step).
    Step(&'s mut St),
    /// The chunked forward over several tokens from the state, leaving it after the last.
    Chunks(&'s mut St),
}

/// Runs a recurrent forward over `rows` rows of `seq` tokens: from zeros without a state; with
/// one (which must hold the batch's rows), its decode step for one token, else
/// the chunked forward continuing it; then counts the tokens into the state.
pub fn forward_carrying<S: ScanSizes, V>(
    state: Option<&mut ScanState<S, V>>,
    rows: usize,
    seq: usize,
    fwd: impl FnOnce(Carry<'_, ScanState<S, V>>) -> Result<()>,
) -> Result<()> {
    let Some(st) = state else { return fwd(Carry::Zeros) };
    st.check_rows(rows)?;
    fwd(if seq == 1 { Carry::Step(&mut *st) } else { Carry::Chunks(&mut *st) })?;
    st.len += seq;
    Ok(())
}

/// A CPU chunked forward from the state `ssm`: `fwd(from, to)` writes the state after the last
/// token into `to`, which then replaces it.
pub fn chunks_from(ssm: &mut Vec<f32>, fwd: impl FnOnce(&[f32], &mut [f32]) -> Result<()>) -> Result<()> {
    let mut next = vec![0.0; ssm.len()];
    fwd(ssm, &mut next)?;
    *ssm = next;
    Ok(())
}

/// [`chunks_from`] on the GPU: `to` is the backend's `next` scratch, copied into `ssm` after.
pub fn gpu_chunks_from(
    gpu: &Gpu,
    next: &mut Option<CudaSlice<f32>>,
    ssm: &mut CudaSlice<f32>,
    fwd: impl FnOnce(&CudaSlice<f32>, &mut CudaSlice<f32>) -> Result<()>,
) -> Result<()> {
    let n = ssm.len();
    let next = grown(gpu, next, n)?;
    fwd(ssm, next)?;
    dtod(gpu, next, 0, ssm, 0, n)
}
