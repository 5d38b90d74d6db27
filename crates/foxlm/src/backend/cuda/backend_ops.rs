//! The [`Backend`] operations on the GPU: each op of the model's forward and backward as kernel
//! launches.

use super::recurrent::two_mut;
use super::*;
use crate::backend::{Norm, ShortConv};
use fox_kernels::cuda::ssd;

impl<T: Elem> Backend for Cuda<T> {
    type Batch = GpuBatch;

    fn new_batch(&self, max_rows: usize, batch: usize) -> Result<GpuBatch> {
        Ok(GpuBatch {
            batch: 0,
            seq: 0,
            ids: self.gpu.zeros(max_rows)?,
            targets: self.gpu.zeros(max_rows)?,
            start: self.gpu.zeros(batch.max(1))?,
            start_host: None,
            chunk_start: self.gpu.zeros(batch.max(1))?,
            chunk_padded: false,
            positions: self.gpu.zeros(max_rows)?,
            emb: EmbeddingIndex::new(&self.gpu, max_rows)?,
            host_i32: Vec::with_capacity(max_rows),
            n_targets: 0,
            past: 0,
        })
    }

    fn prepare(
        &mut self,
        b: &mut GpuBatch,
        info: &BatchInfo,
        ids: &[u32],
        targets: Option<&[Option<u32>]>,
    ) -> Result<()> {
        let n = info.rows();
        ensure!(n <= self.max_rows && n <= b.ids.len(), "a batch of {n} tokens exceeds the {} planned", self.max_rows);
        ensure!(ids.len() == n && targets.is_none_or(|t| t.len() == n), "ids and targets must be [B, T]");
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.vocab) {
            bail!("token id {bad} outside the vocabulary ({})", self.vocab);
        }
        if let Some(bad) = targets.and_then(|t| t.iter().flatten().find(|&&v| v as usize >= self.vocab)) {
            bail!("target id {bad} outside the vocabulary ({})", self.vocab);
        }
        b.n_targets = targets.map_or(0, |t| t.iter().filter(|t| t.is_some()).count());
        b.past = info.past;
        b.batch = info.batch;
        b.seq = info.seq;
        b.host_i32.clear();
        b.host_i32.extend(ids.iter().map(|&v| v as i32));
        self.gpu.write(&mut b.ids, &b.host_i32)?;
        b.host_i32.clear();
        match targets {
            Some(t) => b.host_i32.extend(t.iter().map(|t| t.map_or(-1, |v| v as i32))),
            None => b.host_i32.resize(n, -1),
        }
        self.gpu.write(&mut b.targets, &b.host_i32)?;
        b.host_i32.clear();
        match info.start {
            Some(s) => {
                ensure!(s.len() == info.batch && s.len() <= b.start.len(), "left padding: one start per row");
                b.host_i32.extend(s.iter().map(|&v| v as i32));
                self.gpu.write(&mut b.start, &b.host_i32)?;
                b.start_host = Some(s.to_vec());
                b.host_i32.clear();
                b.host_i32.extend(s.iter().map(|&v| v.saturating_sub(info.past).min(info.seq) as i32));
                b.chunk_padded = b.host_i32.iter().any(|&v| v > 0);
                if b.chunk_padded {
                    self.gpu.write(&mut b.chunk_start, &b.host_i32)?;
                }
            }
            None => {
                b.start_host = None;
                b.chunk_padded = false;
            }
        }
        // RoPE positions relative to each row's first real token (continuing after the cache).
        b.host_i32.clear();
        let t = info.seq;
        let past = info.past as i32;
        b.host_i32.extend((0..n).map(|r| past + (r % t) as i32 - info.start.map_or(0, |s| s[r / t] as i32)));
        self.gpu.write(&mut b.positions, &b.host_i32)?;
        // The embedding's backward index is needed for training only.
        if targets.is_some() {
            b.emb.update(&self.gpu, ids)?;
        }
        Ok(())
    }

    fn batch_info<'b>(&self, b: &'b GpuBatch) -> BatchInfo<'b> {
        BatchInfo { batch: b.batch, seq: b.seq, start: b.start_host.as_deref(), past: b.past }
    }

    fn embedding_fwd(&mut self, x: &mut CudaSlice<T>, table: ParamId, b: &GpuBatch) -> Result<()> {
        self.mark(Family::Other)?;
        let n = b.batch * b.seq;
        ops::embedding_fwd(&self.gpu, x, self.copy_of(table)?, &b.ids, n, self.d_model)
    }
    fn embedding_bwd(&mut self, table: ParamId, dx: &CudaSlice<T>, b: &GpuBatch) -> Result<()> {
        self.mark(Family::Other)?;
        if self.kinds[table.0] == ParamKind::Frozen {
            return Ok(());
        }
        ops::embedding_bwd(&self.gpu, &mut self.params[table.0].grad, dx, &b.emb, self.d_model)
    }
    fn linear_fwd(&mut self, y: &mut CudaSlice<T>, x: &CudaSlice<T>, w: &Linear, rows: usize) -> Result<()> {
        self.linear_into(y, x, w, rows)
    }
    fn linear_fwd_f32(&mut self, y: &mut CudaSlice<f32>, x: &CudaSlice<T>, w: &Linear, rows: usize) -> Result<()> {
        self.linear_into(y, x, w, rows)
    }
    fn linear_bwd(
        &mut self,
        w: &Linear,
        x: &CudaSlice<T>,
        dy: &CudaSlice<T>,
        dx: Option<&mut CudaSlice<T>>,
        accumulate: bool,
        rows: usize,
    ) -> Result<()> {
        self.mark(Family::Gemm)?;
        let (k, n) = (w.in_features, w.out_features);
        if let Some(dx) = dx {
            self.gemm.linear_bwd_dx(dx, accumulate, dy, self.copy_of(w.weight)?, rows, k, n)?;
        }
        if self.kinds[w.weight.0] != ParamKind::Frozen {
            let g = &mut self.params[w.weight.0].grad;
            self.gemm.linear_bwd_dw(g, dy, x, rows, k, n)?;
        }
        Ok(())
    }
    fn rms_norm_fwd(
        &mut self,
        y: &mut CudaSlice<T>,
        rstd: &mut CudaSlice<f32>,
        x: &CudaSlice<T>,
        n: Norm,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        ops::rms_norm_fwd(&self.gpu, y, rstd, x, self.rms_norm(n))
    }
    fn rms_norm_bwd(
        &mut self,
        dx: &mut CudaSlice<T>,
        accumulate: bool,
        w: ParamId,
        dy: &CudaSlice<T>,
        x: &CudaSlice<T>,
        rstd: &CudaSlice<f32>,
        dim: usize,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let rows = x.len() / dim;
        let p = &mut self.params[w.0];
        let saved = ops::RmsNormSaved { x, rstd, w: &p.master, rows, dim };
        ops::rms_norm_bwd(&self.gpu, dx, accumulate, &mut p.grad, dy, saved, None)
    }

    fn add_rms_norm_fwd(
        &mut self,
        h: &mut CudaSlice<T>,
        y: &mut CudaSlice<T>,
        rstd: &mut CudaSlice<f32>,
        a: &CudaSlice<T>,
        b: &CudaSlice<T>,
        n: Norm,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        ops::add_rms_norm_fwd(&self.gpu, h, y, rstd, a, b, self.rms_norm(n))
    }
    fn add_inplace_rms_norm_fwd(
        &mut self,
        h: &mut CudaSlice<T>,
        y: &mut CudaSlice<T>,
        rstd: &mut CudaSlice<f32>,
        b: &CudaSlice<T>,
        n: Norm,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        ops::add_rms_norm_inplace(&self.gpu, h, y, rstd, b, self.rms_norm(n))
    }
    fn add(&mut self, y: &mut CudaSlice<T>, a: &CudaSlice<T>, b: &CudaSlice<T>, n: usize) -> Result<()> {
        self.mark(Family::Other)?;
        ops::add(&self.gpu, y, a, b, n)
    }
    fn add_inplace(&mut self, y: &mut CudaSlice<T>, x: &CudaSlice<T>, n: usize) -> Result<()> {
        self.mark(Family::Other)?;
        ops::add_inplace(&self.gpu, y, x, n)
    }
    fn copy(&mut self, dst: &mut CudaSlice<T>, src: &CudaSlice<T>, n: usize) -> Result<()> {
        self.mark(Family::Other)?;
        dtod(&self.gpu, src, 0, dst, 0, n)
    }
    fn sigmoid_inplace(&mut self, x: &mut CudaSlice<T>, n: usize) -> Result<()> {
        self.mark(Family::Other)?;
        ensure!(n <= x.len(), "sigmoid: {n} elements of a buffer of {}", x.len());
        let p = self.dptr(x);
        self.launch_elementwise(&format!("fox_sigmoid_inplace_{}", T::NAME), p, None, n)
    }
    fn sigmoid_bwd_inplace(&mut self, dy: &mut CudaSlice<T>, y: &CudaSlice<T>) -> Result<()> {
        self.mark(Family::Other)?;
        ensure!(y.len() >= dy.len(), "sigmoid backward: y shorter than dy");
        let (n, pd, py) = (dy.len(), self.dptr(dy), self.dptr(y));
        self.launch_elementwise(&format!("fox_sigmoid_bwd_inplace_{}", T::NAME), pd, Some(py), n)
    }
    fn zero_f32(&mut self, x: &mut CudaSlice<f32>, n: usize) -> Result<()> {
        self.mark(Family::Other)?;
        ensure!(n <= x.len(), "zeroing {n} elements of a buffer of {}", x.len());
        self.gpu.stream().memset_zeros(&mut x.slice_mut(0..n)).map_err(|e| anyhow!("zeroing: {e:?}"))
    }
    fn swiglu_fwd(&mut self, h: &mut CudaSlice<T>, gu: &CudaSlice<T>, rows: usize, inter: usize) -> Result<()> {
        self.mark(Family::Other)?;
        ops::swiglu_fwd(&self.gpu, h, gu, rows, inter)
    }
    fn gate_up_swiglu_fwd(
        &mut self,
        gu: &mut CudaSlice<T>,
        h: &mut CudaSlice<T>,
        x: &CudaSlice<T>,
        gate_proj: &Linear,
        rows: usize,
        inter: usize,
    ) -> Result<()> {
        if self.gemv && ops::gemv_fits::<T>(rows, gate_proj.in_features) && gate_proj.out_features == 2 * inter {
            self.mark(Family::Gemm)?;
            let w = self.copy_of(gate_proj.weight)?;
            return ops::gemv_glu(&self.gpu, gu, h, x, w, rows, gate_proj.in_features, inter);
        }
        self.linear_fwd(gu, x, gate_proj, rows)?;
        self.swiglu_fwd(h, gu, rows, inter)
    }
    fn swiglu_bwd(
        &mut self,
        dgu: &mut CudaSlice<T>,
        dh: &CudaSlice<T>,
        gu: &CudaSlice<T>,
        rows: usize,
        inter: usize,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        ops::swiglu_bwd(&self.gpu, dgu, dh, gu, rows, inter)
    }
    fn gate_mul_fwd(&mut self, z: &mut CudaSlice<T>, pre: &CudaSlice<T>, g: &CudaSlice<T>, n: usize) -> Result<()> {
        self.mark(Family::Other)?;
        ops::gate_mul_fwd(&self.gpu, z, pre, g, n)
    }
    fn gate_mul_bwd(
        &mut self,
        dpre: &mut CudaSlice<T>,
        dg: &mut CudaSlice<T>,
        dz: &CudaSlice<T>,
        pre: &CudaSlice<T>,
        g: &CudaSlice<T>,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        ops::gate_mul_bwd(&self.gpu, dpre, dg, dz, pre, g, pre.len())
    }
    fn cast_to_act(&mut self, dst: &mut CudaSlice<T>, src: &CudaSlice<f32>) -> Result<()> {
        self.mark(Family::Other)?;
        ops::cast_from_f32(&self.gpu, dst, src, src.len().min(dst.len()))
    }

    /// The weight is read from its T working copy, as the GEMMs read theirs.
    fn conv1d_fwd(
        &mut self,
        out: &mut CudaSlice<T>,
        x: &CudaSlice<T>,
        c: &ShortConv,
        b: &GpuBatch,
        state: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let x = &x.slice(c.offset..);
        let dims = (b.batch, b.seq, c.channels, c.width);
        let w = self.copy_of(c.weight)?;
        let bias = c.bias.map(|id| &self.params[id.0].master);
        let start = b.chunk_start();
        let mut conv = ssd::DevConv1d { dims, x, x_stride: c.stride, weight: w, bias, start, prev: None, silu: c.silu };
        match state {
            None => ssd::conv1d_fwd(&self.gpu, out, &conv),
            Some(st) => {
                conv.prev = Some(&*st);
                ssd::conv1d_fwd(&self.gpu, out, &conv)?;
                ssd::conv1d_state(&self.gpu, st, x, c.stride, start, dims)
            }
        }
    }

    fn short_conv_bwd(
        &mut self,
        dx: &mut CudaSlice<T>,
        dout: &CudaSlice<T>,
        x: &CudaSlice<T>,
        c: &ShortConv,
        b: &GpuBatch,
    ) -> Result<()> {
        self.mark(Family::Other)?;
        let (dx, x) = (&mut dx.slice_mut(c.offset..), &x.slice(c.offset..));
        let dims = (b.batch, b.seq, c.channels, c.width);
        let scratch =
            grown(&self.gpu, &mut self.ssm.small, ssd::conv1d_bwd_scratch_len(dims.0, dims.1, dims.2, dims.3))?;
        let (w, bias) = match c.bias {
            Some(id) => {
                let (w, bias) = two_mut(&mut self.params, c.weight.0, id.0)?;
                (w, Some(bias))
            }
            None => (&mut self.params[c.weight.0], None),
        };
        let copy = w.copy.as_ref().ok_or_else(|| anyhow!("a conv1d weight without a working copy"))?;
        let (bias, dbias) = match bias {
            Some(d) => (Some(&d.master), Some(&mut d.grad)),
            None => (None, None),
        };
        let start = b.chunk_start();
        let conv = ssd::DevConv1d { dims, x, x_stride: c.stride, weight: copy, bias, start, prev: None, silu: c.silu };
        ssd::conv1d_bwd(&self.gpu, dx, &mut w.grad, dbias, scratch, dout, &conv)
    }

    fn head_loss(
        &mut self,
        mut dhidden: Option<&mut CudaSlice<T>>,
        hidden: &CudaSlice<T>,
        lm_head: &Linear,
        b: &GpuBatch,
        weight: f32,
    ) -> Result<()> {
        self.mark(Family::Head)?;
        let (d, vocab, vpad) = (lm_head.in_features, lm_head.out_features, self.vocab_pad);
        let rows = b.batch * b.seq;
        ensure!(hidden.len() >= rows * d, "head_loss: hidden holds {} values, {rows}×{d} expected", hidden.len());
        let train = dhidden.is_some() && self.kinds[lm_head.weight.0] != ParamKind::Frozen;
        let gpu = self.gpu.clone();
        let lm = lm_head.weight.0;
        let no_copy = || anyhow!("lm_head has no working copy");
        for r0 in (0..rows).step_by(self.head_rows) {
            let m = self.head_rows.min(rows - r0);
            // This chunk's rows into the chunk buffers (a copy costs far less than the GEMMs).
            self.mark(Family::CrossEntropy)?;
            dtod(&gpu, hidden, r0 * d, &mut self.head_x, 0, m * d)?;
            dtod(&gpu, &b.targets, r0, &mut self.head_targets, 0, m)?;
            self.mark(Family::Head)?;
            let w = self.params[lm].copy.as_ref().ok_or_else(no_copy)?;
            self.gemm.linear_fwd::<T, f32>(&mut self.head_logits, false, &self.head_x, w, m, d, vpad)?;
            self.mark(Family::CrossEntropy)?;
            self.cross_entropy_ld(weight, m, vocab, vpad)?;
            dtod(&gpu, &self.head_losses, 0, &mut self.losses, r0, m)?;
            if let Some(dh) = dhidden.as_deref_mut() {
                self.mark(Family::Head)?;
                let w = self.params[lm].copy.as_ref().ok_or_else(no_copy)?;
                self.gemm.linear_bwd_dx(&mut self.head_dx, false, &self.head_dlogits, w, m, d, vpad)?;
                dtod(&gpu, &self.head_dx, 0, dh, r0 * d, m * d)?;
                if train {
                    let g = &mut self.params[lm].grad;
                    self.gemm.linear_bwd_dw(g, &self.head_dlogits, &self.head_x, m, d, vpad)?;
                }
            }
        }
        self.loss_rows = rows;
        self.loss_targets = b.n_targets;
        Ok(())
    }

    fn take_loss(&mut self) -> Result<(f64, usize)> {
        let rows = std::mem::take(&mut self.loss_rows);
        if rows == 0 {
            return Ok((0.0, 0));
        }
        self.loss_host.resize(rows, 0.0);
        self.gpu
            .stream()
            .memcpy_dtoh(&self.losses.slice(0..rows), self.loss_host.as_mut_slice())
            .map_err(|e| anyhow!("{e:?}"))?;
        self.gpu.sync()?;
        // Rows without a target have loss 0.
        Ok((self.loss_host.iter().map(|&v| v as f64).sum(), std::mem::take(&mut self.loss_targets)))
    }

    fn grads_ready(&mut self, ids: std::ops::Range<usize>) -> Result<()> {
        if self.zero.as_ref().is_some_and(|z| z.reduce) {
            self.mark(Family::Optimizer)?;
            self.reduce_grads(ids)?;
        }
        Ok(())
    }
}
