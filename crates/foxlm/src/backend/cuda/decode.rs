//! Inference on the CUDA backend: the output head's logits without a loss, choosing tokens on
//! the device, and the decode cache's length on the device while a step is a CUDA graph (the
//! cache itself and the attention to it: `model/attention/kv_cache_cuda.rs`).

use super::{dtod, grid, Cuda, Family, GpuBatch};
use crate::tensor::Linear;
use anyhow::{anyhow, ensure, Result};
use fox_kernels::cuda::compile::DECODE;
use fox_kernels::cuda::cudarc::driver::CudaSlice;
use fox_kernels::cuda::kargs::{self, args, kname};
use fox_kernels::cuda::{ops, Elem, Gpu};

/// How the next token is chosen on the device (see `fox_sample` in kernels/decode.cu).
#[derive(Clone, Copy, Debug)]
pub struct DeviceSampling {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub seed: u64,
}

impl DeviceSampling {
    /// The most likely token (the first on ties).
    pub const GREEDY: Self = Self { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 };
}

/// dst [b, w] = src [b, t, w] at position t − 1.
pub(crate) fn last_rows_on<T: Elem>(
    gpu: &Gpu,
    dst: &mut CudaSlice<T>,
    src: &CudaSlice<T>,
    b: usize,
    t: usize,
    w: usize,
) -> Result<()> {
    ensure!(dst.len() >= b * w && src.len() >= b * t * w, "last_rows: buffers too short");
    let (bi, ti, wi) = (i32_of(b, "batch")?, i32_of(t, "positions")?, i32_of(w, "width")?);
    kargs::launch(gpu, &DECODE, &kname::<T>("fox_last_rows"), grid(b * w), &args![gpu; dst, src, bi, ti, wi])
}

pub(crate) fn i32_of(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| anyhow!("{what} = {v} does not fit the kernels' 32-bit indices"))
}

impl<T: Elem> Cuda<T> {
    /// Logits [rows, vocab] (f32, on the host) of final hidden states [rows, d], a chunk of the
    /// head's rows at a time.
    pub fn logits(&mut self, hidden: &CudaSlice<T>, lm_head: &Linear, rows: usize) -> Result<Vec<f32>> {
        self.logits_from(hidden, lm_head, 0, rows)
    }

    /// [`Cuda::logits`] of rows `row0..row0 + rows` of `hidden`.
    pub fn logits_from(
        &mut self,
        hidden: &CudaSlice<T>,
        lm_head: &Linear,
        row0: usize,
        rows: usize,
    ) -> Result<Vec<f32>> {
        self.mark(Family::Head)?;
        let (d, vocab) = (lm_head.in_features, lm_head.out_features);
        ensure!(
            hidden.len() >= (row0 + rows) * d,
            "logits: hidden holds {} values, {}×{d} expected",
            hidden.len(),
            row0 + rows
        );
        let mut out = Vec::with_capacity(rows * vocab);
        for r0 in (0..rows).step_by(self.head_rows) {
            let m = self.head_rows.min(rows - r0);
            self.head_on_rows(hidden, lm_head, row0 + r0, m)?;
            out.extend(self.download_logits(m, vocab)?);
        }
        Ok(out)
    }

    /// The head's f32 logits of rows `row0..row0 + m` of `hidden` (m ≤ head_rows) into the head
    /// chunk buffer, `vocab_pad` apart.
    fn head_on_rows(&mut self, hidden: &CudaSlice<T>, lm_head: &Linear, row0: usize, m: usize) -> Result<()> {
        let (d, vpad) = (lm_head.in_features, self.vocab_pad);
        ensure!(m <= self.head_rows, "{m} rows exceed the head's chunk of {}", self.head_rows);
        dtod(&self.gpu, hidden, row0 * d, &mut self.head_x, 0, m * d)?;
        let w = self.params[lm_head.weight.0].copy.as_ref().ok_or_else(|| anyhow!("lm_head has no copy"))?;
        self.gemm.linear_fwd::<T, f32>(&mut self.head_logits, false, &self.head_x, w, m, d, vpad)
    }

    /// Scoring on the device: for rows `row0..row0 + rows` of `hidden`, the log-probability of
    /// each row's target (NaN for a target outside the vocabulary) and its `k` most likely tokens
    /// with theirs (`fox_token_logprobs` in kernels/decode.cu): (logprob [rows], ids [rows, k],
    /// logprobs [rows, k]). What `logits_from` + a host log-softmax give, without moving the
    /// vocabulary's logits to the host.
    #[allow(clippy::type_complexity)]
    pub fn token_logprobs(
        &mut self,
        hidden: &CudaSlice<T>,
        lm_head: &Linear,
        row0: usize,
        targets: &[u32],
        k: usize,
    ) -> Result<(Vec<f32>, Vec<u32>, Vec<f32>)> {
        self.mark(Family::Head)?;
        let rows = targets.len();
        let (d, vocab, vpad) = (lm_head.in_features, lm_head.out_features, self.vocab_pad);
        ensure!(
            hidden.len() >= (row0 + rows) * d,
            "logprobs: hidden holds {} values, {}×{d} expected",
            hidden.len(),
            row0 + rows
        );
        let k = k.min(vocab);
        if rows == 0 {
            return Ok((Vec::new(), Vec::new(), Vec::new()));
        }
        let gpu = self.gpu.clone();
        let tg: Vec<i32> = targets.iter().map(|&t| i32::try_from(t).unwrap_or(-1)).collect();
        let dt = gpu.upload(&tg)?;
        let lp = gpu.zeros::<f32>(rows)?;
        let (ti, tl) = (gpu.zeros::<i32>((rows * k).max(1))?, gpu.zeros::<f32>((rows * k).max(1))?);
        for r0 in (0..rows).step_by(self.head_rows) {
            let m = self.head_rows.min(rows - r0);
            self.head_on_rows(hidden, lm_head, row0 + r0, m)?;
            let (ldi, vi, ki) = (vpad as i32, vocab as i32, k as i32);
            // m rows of vpad logits in head_logits; targets, lp, ti, tl hold rows (× k) values and
            // the offsets stay below them (r0 + m <= rows).
            let (pt, plp) = (self.dptr(&dt) + 4 * r0 as u64, self.dptr(&lp) + 4 * r0 as u64);
            let (pti, ptl) = (self.dptr(&ti) + 4 * (r0 * k) as u64, self.dptr(&tl) + 4 * (r0 * k) as u64);
            let args = args![&gpu; self.head_logits, ldi, vi, pt, ki, plp, pti, ptl];
            kargs::launch(&gpu, &DECODE, "fox_token_logprobs", kargs::plain_config((m as u32, 1, 1), 256, 0), &args)?;
        }
        let (lp, ti, tl) = (gpu.download(&lp)?, gpu.download(&ti)?, gpu.download(&tl)?);
        gpu.sync()?;
        let n = rows * k;
        Ok((lp, ti[..n].iter().map(|&i| i.max(0) as u32).collect(), tl[..n].to_vec()))
    }

    /// The logits of each row's last position, left on the device in the head's chunk buffer
    /// ([`Cuda::sample`] reads them), or copied to the host with `download`.
    pub fn last_logits(
        &mut self,
        hidden: &CudaSlice<T>,
        lm_head: &Linear,
        b: &GpuBatch,
        download: bool,
    ) -> Result<Option<Vec<f32>>> {
        self.mark(Family::Head)?;
        let (d, vocab, vpad) = (lm_head.in_features, lm_head.out_features, self.vocab_pad);
        ensure!(b.batch <= self.head_rows, "{} rows exceed the head's chunk of {}", b.batch, self.head_rows);
        // A decode step's hidden states are the last positions already.
        let x = if b.seq == 1 {
            hidden
        } else {
            last_rows_on(&self.gpu, &mut self.head_x, hidden, b.batch, b.seq, d)?;
            &self.head_x
        };
        let w = self.params[lm_head.weight.0].copy.as_ref().ok_or_else(|| anyhow!("lm_head has no copy"))?;
        if self.gemv && ops::gemv_fits::<T>(b.batch, d) {
            ops::gemv::<T, f32>(&self.gpu, &mut self.head_logits, x, w, b.batch, d, vpad)?;
        } else {
            self.gemm.linear_fwd::<T, f32>(&mut self.head_logits, false, x, w, b.batch, d, vpad)?;
        }
        if !download {
            return Ok(None);
        }
        Ok(Some(self.download_logits(b.batch, vocab)?))
    }

    /// Chooses each row's next token from the logits of [`Cuda::last_logits`] into `out` [B]; with
    /// `next`, also into that batch's token ids (the next decode step's input).
    pub fn sample(
        &mut self,
        out: &mut CudaSlice<i32>,
        next: Option<&mut GpuBatch>,
        rows: usize,
        s: &DeviceSampling,
        step: usize,
    ) -> Result<()> {
        self.mark(Family::CrossEntropy)?;
        ensure!(out.len() >= rows && rows <= self.head_rows, "sample: {rows} rows do not fit");
        let pn = match next {
            Some(b) => {
                ensure!(b.ids.len() >= rows, "sample: the next batch holds fewer than {rows} ids");
                b.batch = rows;
                b.seq = 1;
                self.dptr(&b.ids)
            }
            None => 0,
        };
        let (vocab, ld) = (self.vocab as i32, self.vocab_pad as i32);
        let (temp, k, top_p, seed) = (s.temperature, s.top_k.min(i32::MAX as usize) as i32, s.top_p, s.seed);
        // The random stream is keyed by (seed, cached length, row): the same in both decode modes.
        let (lenp, step) = (self.lenp(), step as i32);
        // The head's logits hold head_rows ≥ rows rows.
        let gpu = &self.gpu;
        let args = args![gpu; out, pn, self.head_logits, vocab, ld, temp, k, top_p, seed, lenp, step];
        kargs::launch(gpu, &DECODE, "fox_sample", kargs::plain_config((rows as u32, 1, 1), 1024, 0), &args)
    }

    pub(crate) fn lenp(&self) -> u64 {
        self.decode_pos.as_ref().map_or(0, |c| self.dptr(c))
    }

    /// From here on the cache kernels, the decode kernel and the sampler read the cached length
    /// from the device, starting at `len` (for capturing a decode step as a CUDA graph).
    pub fn begin_device_positions(&mut self, len: usize) -> Result<()> {
        self.decode_pos = Some(self.gpu.upload(&[i32_of(len, "cache length")?])?);
        Ok(())
    }

    /// Back to host-side lengths; returns the device's final length.
    pub fn end_device_positions(&mut self) -> Result<Option<usize>> {
        match self.decode_pos.take() {
            Some(p) => Ok(Some(self.gpu.download(&p)?[0].max(0) as usize)),
            None => Ok(None),
        }
    }

    /// The end of a decode step on the device: cached length and each row's RoPE position + 1.
    pub fn advance_positions(&mut self, b: &mut GpuBatch) -> Result<()> {
        let lp = self.decode_pos.as_ref().ok_or_else(|| anyhow!("no device-side positions"))?;
        let bi = i32_of(b.batch, "batch")?;
        ensure!(b.positions.len() >= b.batch, "positions too short");
        kargs::launch(&self.gpu, &DECODE, "fox_decode_advance", grid(b.batch), &args![&self.gpu; lp, b.positions, bi])
    }

    /// The per-row losses of the last [`Backend::head_loss`](crate::backend::Backend::head_loss)
    /// (0 where a row had no target), on the host.
    pub fn row_losses(&mut self, rows: usize) -> Result<Vec<f32>> {
        ensure!(rows <= self.losses.len(), "row_losses: {rows} rows exceed the {} planned", self.losses.len());
        let v = self.gpu.stream().clone_dtoh(&self.losses.slice(0..rows)).map_err(|e| anyhow!("{e:?}"))?;
        self.gpu.sync()?;
        self.loss_rows = 0;
        Ok(v)
    }
}
