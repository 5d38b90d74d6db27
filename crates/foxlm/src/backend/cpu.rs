//! The CPU backend: f32 everywhere, the `fox_kernels` CPU ops, parameters borrowed from the model.
//! It is the exact reference that the CUDA backend is checked against.

use super::{Alloc, Backend, BatchInfo, Family, Norm, ShortConv};
use crate::tensor::{Linear, ParamId, ParamKind, Params};
use anyhow::{anyhow, bail, ensure, Result};
use fox_kernels::attention::Visibility;
use fox_kernels::conv1d::{conv1d_bwd, conv1d_decode_step, conv1d_fwd, Conv1d};
use fox_kernels::{gate, head, matmul, rmsnorm, swiglu};
use std::sync::Mutex;
use std::time::Instant;

/// Parameters (borrowed) and, when training, their gradient buffers (shaped like the
/// parameters, see [`Params::zeros_like`]).
pub struct Cpu<'a> {
    pub params: &'a Params,
    pub grads: Option<&'a mut [Vec<f32>]>,
    loss_sum: f64,
    loss_rows: usize,
    prof: Option<&'a CpuProfile>,
    ledger: Option<&'a mut GradLedger>,
}

/// What a training step knows of its gradient buffers besides their values (the CPU engine's,
/// kept between steps), so that the products that make most of the gradients do less work.
#[derive(Debug, Default)]
pub struct GradLedger {
    /// Per parameter: the buffer holds last step's values, and its gradient is zero. The
    /// optimizer leaves the Linear weights' gradients so instead of zeroing them: their first
    /// product of the next step writes instead of adding (a pass over them saved, and the
    /// product reads nothing back). Any other use zeroes the buffer first ([`Cpu::grad_of`]).
    pub stale: Vec<bool>,
    /// Per parameter, Σ g² of its finished gradient ([`crate::optim::sum_squares`], the norm's
    /// own sum), taken right after the product that finished it while it is still in cache.
    /// Some only on the last micro-batch of a step, when the gradients are final.
    pub sum_squares: Option<Vec<Option<f64>>>,
}

impl GradLedger {
    pub fn new(params: usize) -> Self {
        Self { stale: vec![false; params], sum_squares: None }
    }
}

thread_local! {
    /// The attention backward's key term of dc, per thread (kept between calls).
    pub(crate) static DCK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Wall time of CPU operations by [`Family`] (`foxlm bench train --device cpu`). Each operation
/// runs alone, split over rayon's threads inside it, so its wall time is what it costs the step.
#[derive(Debug, Default)]
pub struct CpuProfile(Mutex<[(f64, usize); Family::ALL.len()]>);

/// Times one operation until dropped.
pub struct OpTimer<'a>(&'a CpuProfile, Family, Instant);

impl CpuProfile {
    pub fn time(&self, family: Family) -> OpTimer<'_> {
        OpTimer(self, family, Instant::now())
    }

    /// Per family with any operation: milliseconds and operations.
    pub fn families(&self) -> Vec<(Family, f64, usize)> {
        let t = *self.0.lock().unwrap_or_else(|e| e.into_inner());
        Family::ALL.iter().zip(t).filter(|(_, (_, n))| *n > 0).map(|(f, (ms, n))| (*f, ms, n)).collect()
    }
}

/// A timer for one operation of `family` into `prof`, if there is one.
pub fn timer(prof: Option<&CpuProfile>, family: Family) -> Option<OpTimer<'_>> {
    prof.map(|p| p.time(family))
}

impl Drop for OpTimer<'_> {
    fn drop(&mut self) {
        let mut t = self.0 .0.lock().unwrap_or_else(|e| e.into_inner());
        let e = &mut t[self.1 as usize];
        e.0 += self.2.elapsed().as_secs_f64() * 1e3;
        e.1 += 1;
    }
}

impl<'a> Cpu<'a> {
    /// Inference: no gradients.
    pub fn new(params: &'a Params) -> Self {
        Self { params, grads: None, loss_sum: 0.0, loss_rows: 0, prof: None, ledger: None }
    }
    pub fn with_grads(params: &'a Params, grads: &'a mut [Vec<f32>]) -> Self {
        assert_eq!(grads.len(), params.len(), "grads must be shaped like the parameters");
        Self { params, grads: Some(grads), loss_sum: 0.0, loss_rows: 0, prof: None, ledger: None }
    }
    /// The gradients' [`GradLedger`]: stale buffers are overwritten (or zeroed before use), and
    /// sums of squares are taken where it asks.
    pub fn with_ledger(self, ledger: &'a mut GradLedger) -> Self {
        assert_eq!(ledger.stale.len(), self.params.len(), "the ledger must cover the parameters");
        Self { ledger: Some(ledger), ..self }
    }
    /// Every operation's wall time added to `prof` (None: not timed).
    pub fn profiled(self, prof: Option<&'a CpuProfile>) -> Self {
        Self { prof, ..self }
    }
    /// A timer for one operation of `family`, when profiling.
    pub(crate) fn time(&self, family: Family) -> Option<OpTimer<'a>> {
        timer(self.prof, family)
    }
    fn grads(&mut self) -> Result<&mut [Vec<f32>]> {
        match self.grads.as_deref_mut() {
            Some(g) => Ok(g),
            None => bail!("a backward pass needs gradient buffers (Cpu::with_grads)"),
        }
    }
    /// The gradient buffer of `id` to add to (zeroed first if the ledger has it stale), or None
    /// for a frozen parameter.
    pub(crate) fn grad_of(&mut self, id: ParamId) -> Result<Option<&mut [f32]>> {
        Ok(self.grad_to_write(id)?.map(|(g, add)| {
            if !add {
                g.fill(0.0);
            }
            g
        }))
    }
    /// The gradient buffer of `id` and whether to add to it (false: it is stale, overwrite it),
    /// or None for a frozen parameter. The buffer counts as written from then on.
    pub(crate) fn grad_to_write(&mut self, id: ParamId) -> Result<Option<(&mut [f32], bool)>> {
        if self.params.kinds[id.0] == ParamKind::Frozen {
            return Ok(None);
        }
        let stale = match self.ledger.as_deref_mut() {
            Some(l) => {
                // A sum of squares taken before this write is out of date.
                if let Some(sums) = l.sum_squares.as_mut() {
                    sums[id.0] = None;
                }
                std::mem::take(&mut l.stale[id.0])
            }
            None => false,
        };
        Ok(Some((self.grads()?[id.0].as_mut_slice(), !stale)))
    }
    /// Σ g² of `id`'s gradient into the ledger, where it asks for sums (the gradient is final).
    pub(crate) fn take_sum_squares(&mut self, id: ParamId) {
        let Some(grads) = self.grads.as_deref() else { return };
        if let Some(sums) = self.ledger.as_deref_mut().and_then(|l| l.sum_squares.as_mut()) {
            sums[id.0] = Some(crate::optim::sum_squares(&grads[id.0]));
        }
    }
}

/// The batch on the CPU: ids, targets and left padding as given.
#[derive(Clone, Debug, Default)]
pub struct CpuBatch {
    pub batch: usize,
    pub seq: usize,
    pub past: usize,
    pub ids: Vec<u32>,
    pub targets: Vec<Option<u32>>,
    /// Each row's first position (left padding); set with [`CpuBatch::set_start`], which keeps
    /// `pads` in step.
    pub start: Option<Vec<usize>>,
    /// Each row's left padding within this forward's positions.
    pads: Option<Vec<usize>>,
}

impl CpuBatch {
    /// `batch` rows of `seq` positions, no cache before them, padding set by `start`.
    pub(crate) fn with_start(batch: usize, seq: usize, start: Option<&[usize]>) -> Self {
        let mut b = CpuBatch { batch, seq, ..Default::default() };
        b.set_start(start);
        b
    }

    /// Sets the rows' starts (after `past` and `seq`) and the padding within this forward.
    pub(crate) fn set_start(&mut self, start: Option<&[usize]>) {
        self.start = start.map(|s| s.to_vec());
        self.pads = start.map(|s| s.iter().map(|&v| v.saturating_sub(self.past).min(self.seq)).collect());
    }

    /// Each row's left padding within this forward's positions, for the recurrent families' ops
    /// (a row's padding lies in the chunk that starts its sequence; later chunks have none).
    pub(crate) fn pads(&self) -> Option<&[usize]> {
        self.pads.as_deref()
    }

    /// Start of row b for operations on this chunk: left padding matters only on the chunk that
    /// starts the sequence (KV-shift, prefix sums).
    pub(crate) fn chunk_start(&self) -> Option<&[usize]> {
        if self.past == 0 {
            self.start.as_deref()
        } else {
            None
        }
    }
    pub(crate) fn vis(&self) -> Visibility<'_> {
        match &self.start {
            Some(s) => Visibility::LeftPadded(s),
            None => Visibility::All,
        }
    }
}

impl Alloc for Cpu<'_> {
    type Act = Vec<f32>;
    type F32 = Vec<f32>;
    fn alloc(&self, n: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; n])
    }
    fn alloc_f32(&self, n: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; n])
    }
}

impl Backend for Cpu<'_> {
    type Batch = CpuBatch;

    fn new_batch(&self, _max_rows: usize, _batch: usize) -> Result<CpuBatch> {
        Ok(CpuBatch::default())
    }
    fn prepare(
        &mut self,
        batch: &mut CpuBatch,
        info: &BatchInfo,
        ids: &[u32],
        targets: Option<&[Option<u32>]>,
    ) -> Result<()> {
        let n = info.rows();
        if ids.len() != n || targets.is_some_and(|t| t.len() != n) {
            bail!("ids and targets must be [B, T] = [{}, {}]", info.batch, info.seq);
        }
        let vocab = self.params.tensors.first().map_or(0, |t| t.shape[0]);
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            bail!("token id {bad} outside the vocabulary ({vocab})");
        }
        batch.batch = info.batch;
        batch.seq = info.seq;
        batch.past = info.past;
        batch.ids.clear();
        batch.ids.extend_from_slice(ids);
        batch.targets.clear();
        if let Some(t) = targets {
            batch.targets.extend_from_slice(t);
        }
        batch.set_start(info.start);
        Ok(())
    }
    fn batch_info<'b>(&self, b: &'b CpuBatch) -> BatchInfo<'b> {
        BatchInfo { batch: b.batch, seq: b.seq, start: b.start.as_deref(), past: b.past }
    }

    fn embedding_fwd(&mut self, x: &mut Vec<f32>, table: ParamId, b: &CpuBatch) -> Result<()> {
        let _t = self.time(Family::Other);
        let e = &self.params[table];
        let d = e.len() / self.params.tensors[table.0].shape[0];
        for (r, &id) in b.ids.iter().enumerate() {
            let id = id as usize;
            x[r * d..(r + 1) * d].copy_from_slice(&e[id * d..(id + 1) * d]);
        }
        Ok(())
    }
    fn embedding_bwd(&mut self, table: ParamId, dx: &Vec<f32>, b: &CpuBatch) -> Result<()> {
        let _t = self.time(Family::Other);
        let d = self.params[table].len() / self.params.tensors[table.0].shape[0];
        if let Some(ge) = self.grad_of(table)? {
            for (r, &id) in b.ids.iter().enumerate() {
                let id = id as usize;
                ge[id * d..(id + 1) * d].iter_mut().zip(&dx[r * d..(r + 1) * d]).for_each(|(g, v)| *g += v);
            }
        }
        Ok(())
    }
    fn linear_fwd(&mut self, y: &mut Vec<f32>, x: &Vec<f32>, w: &Linear, rows: usize) -> Result<()> {
        let _t = self.time(Family::Gemm);
        matmul::linear_fwd(y, x, &self.params[w.weight], rows, w.in_features, w.out_features);
        Ok(())
    }
    fn linear_fwd_f32(&mut self, y: &mut Vec<f32>, x: &Vec<f32>, w: &Linear, rows: usize) -> Result<()> {
        self.linear_fwd(y, x, w, rows)
    }
    fn linear_bwd(
        &mut self,
        w: &Linear,
        x: &Vec<f32>,
        dy: &Vec<f32>,
        dx: Option<&mut Vec<f32>>,
        accumulate: bool,
        rows: usize,
    ) -> Result<()> {
        let _t = self.time(Family::Gemm);
        let (k, n) = (w.in_features, w.out_features);
        let params = self.params;
        let wt = &params[w.weight];
        match self.grad_to_write(w.weight)? {
            Some((gw, add)) => {
                matmul::linear_bwd(dx.map(|v| v.as_mut_slice()), accumulate, gw, add, dy, x, wt, rows, k, n);
                self.take_sum_squares(w.weight);
            }
            None => {
                if let Some(dx) = dx {
                    matmul::gemm_strided(rows, k, n, dx, k, accumulate, dy, n, 1, wt, k, 1);
                }
            }
        }
        Ok(())
    }
    fn rms_norm_fwd(&mut self, y: &mut Vec<f32>, rstd: &mut Vec<f32>, x: &Vec<f32>, norm: Norm) -> Result<()> {
        let _t = self.time(Family::Other);
        let Norm { w, rows, dim, eps } = norm;
        let n = first("RMSNorm", rows.checked_mul(dim), &[x.len(), y.len()])?;
        ensure!(rstd.len() >= rows, "RMSNorm: {rows} rows, rstd holds {}", rstd.len());
        rmsnorm::rms_norm_fwd(&mut y[..n], &mut rstd[..rows], &x[..n], &self.params[w], dim, eps);
        Ok(())
    }
    fn rms_norm_bwd(
        &mut self,
        dx: &mut Vec<f32>,
        accumulate: bool,
        w: ParamId,
        dy: &Vec<f32>,
        x: &Vec<f32>,
        rstd: &Vec<f32>,
        dim: usize,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let params = self.params;
        // A frozen norm weight's gradient is computed all the same (the kernel adds to it), unread.
        let g = if params.kinds[w.0] == ParamKind::Frozen {
            &mut self.grads()?[w.0]
        } else {
            self.grad_of(w)?.expect("a trainable parameter has a gradient")
        };
        rmsnorm::rms_norm_bwd(dx, accumulate, g, dy, x, rstd, &params[w], dim);
        Ok(())
    }

    fn add(&mut self, y: &mut Vec<f32>, a: &Vec<f32>, b: &Vec<f32>, n: usize) -> Result<()> {
        let _t = self.time(Family::Other);
        let n = first("add", Some(n), &[y.len(), a.len(), b.len()])?;
        y[..n].iter_mut().zip(a.iter().zip(b)).for_each(|(y, (a, b))| *y = a + b);
        Ok(())
    }
    fn add_inplace(&mut self, y: &mut Vec<f32>, x: &Vec<f32>, n: usize) -> Result<()> {
        let _t = self.time(Family::Other);
        let n = first("add", Some(n), &[y.len(), x.len()])?;
        y[..n].iter_mut().zip(x).for_each(|(y, x)| *y += x);
        Ok(())
    }
    fn copy(&mut self, dst: &mut Vec<f32>, src: &Vec<f32>, n: usize) -> Result<()> {
        let _t = self.time(Family::Other);
        let n = first("copy", Some(n), &[dst.len(), src.len()])?;
        dst[..n].copy_from_slice(&src[..n]);
        Ok(())
    }
    fn sigmoid_inplace(&mut self, x: &mut Vec<f32>, n: usize) -> Result<()> {
        let _t = self.time(Family::Other);
        let n = first("sigmoid", Some(n), &[x.len()])?;
        gate::sigmoid_inplace(&mut x[..n]);
        Ok(())
    }
    fn sigmoid_bwd_inplace(&mut self, dy: &mut Vec<f32>, y: &Vec<f32>) -> Result<()> {
        let _t = self.time(Family::Other);
        dy.iter_mut().zip(y).for_each(|(d, &y)| *d *= y * (1.0 - y));
        Ok(())
    }
    fn zero_f32(&mut self, x: &mut Vec<f32>, n: usize) -> Result<()> {
        let n = first("zeroing", Some(n), &[x.len()])?;
        x[..n].fill(0.0);
        Ok(())
    }
    fn swiglu_fwd(&mut self, h: &mut Vec<f32>, gu: &Vec<f32>, _rows: usize, inter: usize) -> Result<()> {
        let _t = self.time(Family::Other);
        swiglu::swiglu_fwd(h, gu, inter);
        Ok(())
    }
    fn swiglu_bwd(
        &mut self,
        dgu: &mut Vec<f32>,
        dh: &Vec<f32>,
        gu: &Vec<f32>,
        _rows: usize,
        inter: usize,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        swiglu::swiglu_bwd(dgu, dh, gu, inter);
        Ok(())
    }
    fn gate_mul_fwd(&mut self, z: &mut Vec<f32>, pre: &Vec<f32>, g: &Vec<f32>, n: usize) -> Result<()> {
        let _t = self.time(Family::Other);
        let n = first("output gate", Some(n), &[z.len(), pre.len(), g.len()])?;
        gate::gate_mul_fwd(&mut z[..n], &pre[..n], &g[..n]);
        Ok(())
    }
    fn gate_mul_bwd(
        &mut self,
        dpre: &mut Vec<f32>,
        dg: &mut Vec<f32>,
        dz: &Vec<f32>,
        pre: &Vec<f32>,
        g: &Vec<f32>,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        gate::gate_mul_bwd(dpre, dg, dz, pre, g);
        Ok(())
    }
    fn cast_to_act(&mut self, dst: &mut Vec<f32>, src: &Vec<f32>) -> Result<()> {
        let _t = self.time(Family::Other);
        dst.copy_from_slice(src);
        Ok(())
    }

    fn head_loss(
        &mut self,
        dhidden: Option<&mut Vec<f32>>,
        hidden: &Vec<f32>,
        lm_head: &Linear,
        b: &CpuBatch,
        weight: f32,
    ) -> Result<()> {
        let _t = self.time(Family::Head);
        let (d, vocab) = (lm_head.in_features, lm_head.out_features);
        let targets = &b.targets;
        let params = self.params;
        let wt = &params[lm_head.weight];
        let grads = match dhidden {
            Some(dh) => {
                let (dw, dw_add) = self.grad_to_write(lm_head.weight)?.map_or((None, true), |(g, add)| (Some(g), add));
                Some(head::HeadGrads { dx: dh.as_mut_slice(), dw, dw_add })
            }
            None => None,
        };
        // GEMM, softmax cross-entropy and both gradient GEMMs in one op, blocked over the vocabulary.
        self.loss_sum += head::linear_cross_entropy(hidden, wt, targets, d, vocab, weight, grads)?;
        self.loss_rows += targets.iter().filter(|t| t.is_some()).count();
        Ok(())
    }
    fn take_loss(&mut self) -> Result<(f64, usize)> {
        let r = (self.loss_sum, self.loss_rows);
        (self.loss_sum, self.loss_rows) = (0.0, 0);
        Ok(r)
    }

    fn conv1d_fwd(
        &mut self,
        out: &mut Vec<f32>,
        x: &Vec<f32>,
        c: &ShortConv,
        b: &CpuBatch,
        state: Option<&mut Vec<f32>>,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let bias = c.bias.map(|id| &self.params[id]);
        conv1d_continuing(&conv1d(c, b, &x[c.offset..], &self.params[c.weight], bias), out, state)
    }

    fn short_conv_bwd(
        &mut self,
        dx: &mut Vec<f32>,
        dout: &Vec<f32>,
        x: &Vec<f32>,
        c: &ShortConv,
        b: &CpuBatch,
    ) -> Result<()> {
        let _t = self.time(Family::Other);
        let (w, bias) = (self.params[c.weight].to_vec(), c.bias.map(|id| self.params[id].to_vec()));
        let conv = conv1d(c, b, &x[c.offset..], &w, bias.as_deref());
        self.conv1d_grads(&conv, dout, &mut dx[c.offset..], c.weight, c.bias)
    }
}

/// Short convolution `c` (depthwise) over `x` for the batch `b`, with these weights.
fn conv1d<'a>(c: &ShortConv, b: &'a CpuBatch, x: &'a [f32], weight: &'a [f32], bias: Option<&'a [f32]>) -> Conv1d<'a> {
    let (channels, width, x_stride, silu, start) = (c.channels, c.width, c.stride, c.silu, b.pads());
    Conv1d { batch: b.batch, seq: b.seq, channels, width, x, x_stride, weight, bias, start, silu }
}

/// A short causal convolution (Mamba's and Mamba-2's): without an inference state a fresh
/// sequence; with one, continuing its last inputs and advancing them (the decode step for one
/// position).
fn conv1d_continuing(c: &Conv1d, out: &mut [f32], state: Option<&mut Vec<f32>>) -> Result<()> {
    match state {
        None => conv1d_fwd(c, out, None, None),
        Some(st) if c.seq == 1 => conv1d_decode_step(c, st, out),
        Some(st) => {
            let mut next = vec![0.0; st.len()];
            conv1d_fwd(c, out, Some(st), Some(&mut next))?;
            *st = next;
            Ok(())
        }
    }
}

impl Cpu<'_> {
    /// grad(id) += g (nothing for a frozen parameter).
    pub(crate) fn add_grad(&mut self, id: ParamId, g: &[f32]) -> Result<()> {
        if let Some(dst) = self.grad_of(id)? {
            anyhow::ensure!(dst.len() == g.len(), "a gradient of {} values for a parameter of {}", g.len(), dst.len());
            dst.iter_mut().zip(g).for_each(|(a, b)| *a += b);
        }
        Ok(())
    }

    /// A = −exp(A_log): the recurrent layers' decay rates.
    pub(crate) fn neg_exp(&self, a_log: ParamId) -> Vec<f32> {
        self.params[a_log].iter().map(|v| -v.exp()).collect()
    }

    /// A = −exp(A_log): grad(A_log) += dA · A.
    pub(crate) fn add_a_log_grad(&mut self, a_log: ParamId, da: &[f32], a: &[f32]) -> Result<()> {
        let da_log: Vec<f32> = da.iter().zip(a).map(|(g, a)| g * a).collect();
        self.add_grad(a_log, &da_log)
    }

    /// A short convolution's backward (`c` over copies of its weights): d input into `dx`'s
    /// columns, and the weight's and bias's gradients added to `w` and `b`.
    fn conv1d_grads(&mut self, c: &Conv1d, dout: &[f32], dx: &mut [f32], w: ParamId, b: Option<ParamId>) -> Result<()> {
        let mut dw = vec![0.0; c.weight.len()];
        let mut db = c.bias.map(|v| vec![0.0; v.len()]);
        conv1d_bwd(c, dout, None, dx, &mut dw, db.as_deref_mut())?;
        self.add_grad(w, &dw)?;
        if let (Some(id), Some(db)) = (b, db) {
            self.add_grad(id, &db)?;
        }
        Ok(())
    }
}

/// `n` (the elements a forward's op covers), checked against the buffers it reads and writes.
pub(crate) fn first(op: &str, n: Option<usize>, lens: &[usize]) -> Result<usize> {
    let n = n.ok_or_else(|| anyhow!("{op}: the element count overflows"))?;
    ensure!(lens.iter().all(|&l| l >= n), "{op}: {n} elements asked of buffers of {lens:?}");
    Ok(n)
}
