//! AdamW on the device: its moments, the gradient norm and the update.

use super::*;

/// AdamW's moments on the device, one pair per trainable parameter.
pub struct DeviceAdamW {
    pub config: AdamWConfig,
    pub step: u64,
    pub m: Vec<CudaSlice<f32>>,
    pub v: Vec<CudaSlice<f32>>,
}

impl<T: Elem> Cuda<T> {
    /// Creates AdamW's moments (zeros), or uploads those of a resumed run (with ZeRO-1, this
    /// rank's shard of them).
    pub fn init_optimizer(&mut self, opt: &AdamW) -> Result<()> {
        let mut m = Vec::with_capacity(self.params.len());
        let mut v = Vec::with_capacity(self.params.len());
        for i in 0..self.params.len() {
            let n = self.numel[i];
            ensure!(
                opt.m[i].len() == n && opt.v[i].len() == n,
                "optimizer state of {} has the wrong size",
                self.names[i]
            );
            let (cap, own) = match &self.zero {
                Some(z) => (z.shards.shard[i], z.shards.own_within(i, n)),
                None => (self.params[i].master.len(), 0..n),
            };
            let (mut mi, mut vi) = (self.gpu.zeros::<f32>(cap)?, self.gpu.zeros::<f32>(cap)?);
            upload_into(&self.gpu, &opt.m[i][own.clone()], &mut mi)?;
            upload_into(&self.gpu, &opt.v[i][own], &mut vi)?;
            m.push(mi);
            v.push(vi);
        }
        self.opt = Some(DeviceAdamW { config: opt.config, step: opt.step, m, v });
        Ok(())
    }

    /// Zeroes every gradient (before a step's first micro-batch).
    pub fn zero_grads(&mut self) -> Result<()> {
        self.mark(Family::Optimizer)?;
        let stream = self.gpu.stream().clone();
        for p in &mut self.params {
            stream.memset_zeros(&mut p.grad).map_err(|e| anyhow!("zeroing gradients: {e:?}"))?;
        }
        if let Some(z) = self.zero.as_mut() {
            for (i, k) in self.kinds.iter().enumerate() {
                z.pending[i] = *k != ParamKind::Frozen;
            }
        }
        Ok(())
    }

    /// The global L2 norm of the trainable parameters' gradients (deterministic: fixed-order
    /// sums on the device, then f64 on the host). Waits for the GPU.
    pub fn grad_norm(&mut self) -> Result<f64> {
        self.mark(Family::Optimizer)?;
        // With ZeRO-1: the gradients not reduced during the backward, then each rank's shard
        // sums, added over the ranks.
        self.reduce_grads(0..self.params.len())?;
        if let Some(z) = &self.zero {
            z.nccl.before()?;
        }
        for i in 0..self.params.len() {
            if self.kinds[i] == ParamKind::Frozen {
                continue;
            }
            let (at, n) = match &self.zero {
                Some(z) => (z.shards.own(i).start, z.shards.shard[i]),
                None => (0, self.params[i].grad.len()),
            };
            ops::sum_squares_at(&self.gpu, &mut self.sumsq, i, &self.params[i].grad, at, n)?;
        }
        if let Some(z) = self.zero.as_mut() {
            z.nccl.after()?;
            z.comm_mark()?;
            z.nccl.all_reduce_sum(&mut self.sumsq, self.params.len())?;
            z.comm_mark()?;
            z.nccl.before()?;
        }
        let s = self.gpu.download(&self.sumsq)?;
        Ok(s.iter()
            .zip(&self.kinds)
            .filter(|(_, k)| **k != ParamKind::Frozen)
            .map(|(v, _)| *v as f64)
            .sum::<f64>()
            .sqrt())
    }

    /// One AdamW update with learning rate `lr`, gradients scaled by `grad_scale` (clipping).
    pub fn adamw_step(&mut self, lr: f64, grad_scale: f32) -> Result<()> {
        self.mark(Family::Optimizer)?;
        let opt = self.opt.as_mut().ok_or_else(|| anyhow!("AdamW state not initialised"))?;
        opt.step += 1;
        let c = opt.config;
        for (i, p) in self.params.iter_mut().enumerate() {
            let kind = self.kinds[i];
            if kind == ParamKind::Frozen {
                continue;
            }
            let wd = if kind == ParamKind::Matrix { c.weight_decay as f32 } else { 0.0 };
            // With ZeRO-1 this rank's shard: the matrices' master holds only the shard, the
            // vectors' the whole tensor.
            let (n, at, master_at) = match &self.zero {
                Some(z) => {
                    let at = z.shards.own(i).start;
                    (z.shards.shard[i], at, if p.copy.is_some() { 0 } else { at })
                }
                None => (p.master.len(), 0, 0),
            };
            ops::adamw_shard::<T>(
                &self.gpu,
                (&mut p.master, master_at),
                p.copy.as_mut().map(|c| (c, at)),
                (&p.grad, at),
                &mut opt.m[i],
                &mut opt.v[i],
                n,
                &ops::AdamWUpdate {
                    lr: lr as f32,
                    beta1: c.beta1 as f32,
                    beta2: c.beta2 as f32,
                    eps: c.eps as f32,
                    weight_decay: wd,
                    step: opt.step,
                    grad_scale,
                },
            )?;
        }
        // Every rank's new weights to every rank: the working copies of the matrices, the fp32
        // vectors.
        if let Some(z) = self.zero.as_mut() {
            z.nccl.after()?;
            z.comm_mark()?;
            z.nccl.group_start()?;
            let gathered = (|| -> Result<()> {
                for (i, p) in self.params.iter_mut().enumerate() {
                    if self.kinds[i] == ParamKind::Frozen {
                        continue;
                    }
                    let shard = z.shards.shard[i];
                    match p.copy.as_mut() {
                        Some(c) => z.nccl.all_gather_as(c, shard, nccl::elem_type::<T>())?,
                        None => z.nccl.all_gather(&mut p.master, shard)?,
                    }
                }
                Ok(())
            })();
            z.nccl.group_end()?;
            gathered?;
            z.comm_mark()?;
            z.nccl.before()?;
        }
        Ok(())
    }
}
