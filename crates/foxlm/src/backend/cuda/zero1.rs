//! ZeRO-1: the optimizer state sharded over the ranks of a data-parallel run, and the gradient
//! reduction and gathers it needs.

use super::*;

/// ZeRO-1 over the ranks of a data-parallel run (see `crate::distributed`): every tensor is cut into
/// `world` shards. Each rank keeps the whole gradients and working copies (padded to `world`
/// shards), the whole fp32 weights of the vectors (norms, biases: the forward reads them), but
/// only its shard of the matrices' fp32 master weights and of every AdamW moment.
pub struct Zero1 {
    pub nccl: Nccl,
    pub shards: crate::backend::Shards,
    /// Reduce each bucket of gradients as soon as the backward is done with it (set for the
    /// last micro-batch of a step).
    pub reduce: bool,
    /// Parameters whose gradients are not reduced yet this step.
    pub(super) pending: Vec<bool>,
    /// A few f64 on the device for [`Cuda::dist_sum`].
    scalars: CudaSlice<f64>,
    /// Events on the NCCL stream around each group of collectives, while they are timed
    /// ([`Cuda::start_comm_timing`]): start, end, start, end, ...
    comm_marks: Option<Vec<cudarc_event::CudaEvent>>,
}

impl Zero1 {
    /// Marks the start or the end of a group of collectives on the NCCL stream (when timed). A
    /// start recorded after [`Nccl::after`] completes when the stream is free to run the group.
    pub(crate) fn comm_mark(&mut self) -> Result<()> {
        if let Some(m) = self.comm_marks.as_mut() {
            m.push(self.nccl.stream().record_event(Some(TIMING)).map_err(|e| anyhow!("recording an event: {e:?}"))?);
        }
        Ok(())
    }
}

impl<T: Elem> Cuda<T> {
    /// Turns this backend into one rank of a data-parallel run with ZeRO-1 (before
    /// [`Cuda::init_optimizer`]): pads the gradients and working copies to `world` shards and
    /// keeps only this rank's shard of the matrices' master weights.
    pub fn enable_zero1(&mut self, nccl: Nccl) -> Result<()> {
        ensure!(self.opt.is_none(), "enable_zero1 must come before init_optimizer");
        let (rank, world) = (nccl.rank, nccl.world);
        let shards = crate::backend::Shards::new(self.params.iter().map(|p| p.master.len()), rank, world);
        let gpu = self.gpu.clone();
        for (i, p) in self.params.iter_mut().enumerate() {
            let (cap, pad, own) = (p.master.len(), shards.padded(i), shards.own(i));
            if p.grad.len() == cap {
                p.grad = gpu.zeros(pad)?;
            }
            if let Some(c) = p.copy.as_mut() {
                let mut whole = gpu.zeros::<T>(pad)?;
                dtod(&gpu, c, 0, &mut whole, 0, cap)?;
                *c = whole;
                // The matrix's fp32 weights: this rank's shard only.
                let mut mine = gpu.zeros::<f32>(shards.shard[i])?;
                let have = own.start.min(cap)..own.end.min(cap);
                dtod(&gpu, &p.master, have.start, &mut mine, 0, have.len())?;
                p.master = mine;
            } else {
                let mut whole = gpu.zeros::<f32>(pad)?;
                dtod(&gpu, &p.master, 0, &mut whole, 0, cap)?;
                p.master = whole;
            }
        }
        let n = self.params.len();
        self.zero = Some(Zero1 {
            nccl,
            shards,
            reduce: false,
            pending: vec![false; n],
            scalars: gpu.zeros::<f64>(8)?,
            comm_marks: None,
        });
        gpu.sync()
    }

    /// (rank, world) of a data-parallel run; (0, 1) otherwise.
    pub fn world(&self) -> (usize, usize) {
        self.zero.as_ref().map_or((0, 1), |z| (z.nccl.rank, z.nccl.world))
    }

    /// Sets whether the backward reduces each bucket of gradients as it finishes it.
    pub fn set_reduce(&mut self, on: bool) {
        if let Some(z) = self.zero.as_mut() {
            z.reduce = on;
        }
    }

    /// Starts timing the collectives of this rank (no-op without NCCL), for `bench train`.
    pub fn start_comm_timing(&mut self) {
        if let Some(z) = self.zero.as_mut() {
            z.comm_marks = Some(Vec::new());
        }
    }

    /// Stops timing and returns the GPU time (ms) the NCCL stream spent in collectives since
    /// [`Cuda::start_comm_timing`] (waits for the other ranks included; much of it overlaps
    /// the backward), or None without NCCL. Waits for the GPU.
    pub fn take_comm_ms(&mut self) -> Result<Option<f64>> {
        let Some(z) = self.zero.as_mut() else { return Ok(None) };
        let Some(marks) = z.comm_marks.take() else { return Ok(None) };
        z.nccl.sync()?;
        self.gpu.sync()?;
        let mut ms = 0.0;
        for pair in marks.chunks_exact(2) {
            ms += pair[0].elapsed_ms(&pair[1]).map_err(|e| anyhow!("{e:?}"))? as f64;
        }
        Ok(Some(ms))
    }

    /// Starts the reduce-scatter of the gradients of `ids` not yet reduced this step, on the
    /// NCCL stream after the work queued so far.
    pub(crate) fn reduce_grads(&mut self, ids: std::ops::Range<usize>) -> Result<()> {
        let Some(z) = self.zero.as_mut() else { return Ok(()) };
        if !ids.clone().any(|i| z.pending[i]) {
            return Ok(());
        }
        z.nccl.after()?;
        z.comm_mark()?;
        z.nccl.group_start()?;
        let res = (|| -> Result<()> {
            for i in ids {
                if z.pending[i] {
                    z.nccl.reduce_scatter_sum(&mut self.params[i].grad, z.shards.shard[i])?;
                    z.pending[i] = false;
                }
            }
            Ok(())
        })();
        z.nccl.group_end()?;
        res?;
        z.comm_mark()
    }

    /// `vals` summed over the ranks (no-op on one GPU without NCCL). Waits for the GPU.
    pub fn dist_sum(&mut self, vals: &mut [f64]) -> Result<()> {
        let Some(z) = self.zero.as_mut() else { return Ok(()) };
        ensure!(vals.len() <= z.scalars.len(), "dist_sum of {} values (at most {})", vals.len(), z.scalars.len());
        let mut dst = z.scalars.slice_mut(0..vals.len());
        self.gpu.stream().memcpy_htod(vals, &mut dst).map_err(|e| anyhow!("host-to-device copy: {e:?}"))?;
        z.nccl.after()?;
        z.comm_mark()?;
        z.nccl.all_reduce_sum(&mut z.scalars, vals.len())?;
        z.comm_mark()?;
        z.nccl.before()?;
        self.gpu
            .stream()
            .memcpy_dtoh(&z.scalars.slice(0..vals.len()), vals)
            .map_err(|e| anyhow!("device-to-host copy: {e:?}"))?;
        self.gpu.sync()
    }

    /// Tensor `i` of a sharded `buf` (this rank's shard at `at` of a buffer of the padded
    /// tensor, or the shard alone) gathered whole into the host `out`.
    pub(crate) fn gather_to_host(
        &self,
        i: usize,
        shard_buf: &CudaSlice<f32>,
        at: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let z = self.zero.as_ref().ok_or_else(|| anyhow!("gather without ZeRO-1"))?;
        let (shard, own) = (z.shards.shard[i], z.shards.own(i));
        let mut whole = self.gpu.zeros::<f32>(z.shards.padded(i))?;
        dtod(&self.gpu, shard_buf, at, &mut whole, own.start, shard)?;
        z.nccl.after()?;
        z.nccl.all_gather(&mut whole, shard)?;
        z.nccl.before()?;
        let n = out.len();
        self.gpu.stream().memcpy_dtoh(&whole.slice(0..n), out).map_err(|e| anyhow!("{e:?}"))?;
        self.gpu.sync()
    }
}
