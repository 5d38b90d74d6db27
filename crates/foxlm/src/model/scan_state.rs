//! The inference state of a selective-scan layer (Mamba, Mamba-2), on the CPU ([`ScanState`])
//! and on the GPU ([`GpuScanState`]): per row the scan state and the short convolution's last
//! W − 1 inputs. Its size does not depend on the sequence: decoding a token costs the same after
//! 10 tokens as after 100,000. Each family says its layouts (`mamba/state.rs`,
//! `mamba2/state.rs`). [`RecurrentState`] and [`forward_carrying`] serve every recurrent family
//! (DeltaNet and HGRN2 too): how a forward meets its state is the same for all of them.

use crate::backend::cuda::{dtod, grown};
use anyhow::{ensure, Result};
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

/// A recurrent layer's inference state, as its forwards see it: the rows it holds and the tokens
/// it has seen.
pub trait RecurrentState {
    fn rows(&self) -> usize;
    /// Counts `tokens` more seen.
    fn advance(&mut self, tokens: usize);

    /// Fails unless the state holds `rows` rows (`what` names the state in the message).
    fn check_rows(&self, what: &str, rows: usize) -> Result<()> {
        ensure!(self.rows() == rows, "{what} state of {} rows for a batch of {rows}", self.rows());
        Ok(())
    }
}

/// [`RecurrentState`] for state types with `batch` (rows) and `len` (tokens seen); `[S]` for a
/// generic one. Each family's state file invokes it for its own types.
macro_rules! recurrent_state {
    ($([$($g:ident),*] $t:ty),* $(,)?) => {$(
        impl<$($g),*> $crate::model::scan_state::RecurrentState for $t {
            fn rows(&self) -> usize {
                self.batch
            }
            fn advance(&mut self, tokens: usize) {
                self.len += tokens;
            }
        }
    )*};
}

pub(crate) use recurrent_state;

recurrent_state!([S] ScanState<S>, [S] GpuScanState<S>);

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
/// one (`what` names it, which must hold the batch's rows), its decode step for one token, else
/// the chunked forward continuing it; then counts the tokens into the state.
pub fn forward_carrying<St: RecurrentState>(
    what: &str,
    state: Option<&mut St>,
    rows: usize,
    seq: usize,
    fwd: impl FnOnce(Carry<'_, St>) -> Result<()>,
) -> Result<()> {
    let Some(st) = state else { return fwd(Carry::Zeros) };
    st.check_rows(what, rows)?;
    fwd(if seq == 1 { Carry::Step(&mut *st) } else { Carry::Chunks(&mut *st) })?;
    st.advance(seq);
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
