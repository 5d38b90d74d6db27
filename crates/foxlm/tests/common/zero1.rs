//! ZeRO-1 on host buffers, with ranks as threads of one process: what each rank of the GPU engine
//! does after its backward (`foxlm::backend::cuda` runs the same steps through NCCL), written over
//! [`Collective`] so that tests/distributed.rs can check the algorithm against the
//! single-process trainer without GPUs.

use anyhow::Result;
use foxlm::backend::Shards;
use foxlm::optim::{bias_corrections, clip_coef, step_constants, sum_squares, AdamW, AdamWConfig};
use foxlm::tensor::{ParamKind, Params};
use std::sync::{Arc, Barrier, Mutex};

/// The collectives of ZeRO-1 over host buffers. Every rank calls them in the same order.
pub trait Collective: Send + Sync {
    fn rank(&self) -> usize;
    /// vals = Σ over ranks of vals.
    fn all_reduce_sum(&self, vals: &mut [f64]) -> Result<()>;
    /// Over buf[..world·shard]: this rank's shard becomes the sum over ranks of that shard.
    fn reduce_scatter_sum(&self, buf: &mut [f32], shard: usize) -> Result<()>;
    /// Over buf[..world·shard]: every rank's shard is copied to all ranks.
    fn all_gather(&self, buf: &mut [f32], shard: usize) -> Result<()>;
}

/// Ranks as threads of one process: each collective deposits every rank's buffer,
/// then each rank reads what it needs. Sums run in rank order (deterministic).
pub struct ThreadGroup {
    rank: usize,
    world: usize,
    shared: Arc<Shared>,
}

struct Shared {
    barrier: Barrier,
    f32s: Mutex<Vec<Vec<f32>>>,
    f64s: Mutex<Vec<Vec<f64>>>,
}

impl ThreadGroup {
    /// One handle per rank; hand handle r to the thread of rank r.
    pub fn new(world: usize) -> Vec<ThreadGroup> {
        let shared = Arc::new(Shared {
            barrier: Barrier::new(world),
            f32s: Mutex::new(vec![Vec::new(); world]),
            f64s: Mutex::new(vec![Vec::new(); world]),
        });
        (0..world).map(|rank| ThreadGroup { rank, world, shared: shared.clone() }).collect()
    }

    /// Deposits `mine`, waits for every rank, runs `read` over all deposits, waits again.
    fn exchange<T: Clone, R>(
        &self,
        slot: &Mutex<Vec<Vec<T>>>,
        mine: &[T],
        read: impl FnOnce(&[Vec<T>]) -> R,
    ) -> Result<R> {
        let lock = || slot.lock().map_err(|_| anyhow::anyhow!("a rank thread panicked"));
        lock()?[self.rank] = mine.to_vec();
        self.shared.barrier.wait();
        let r = read(&lock()?);
        self.shared.barrier.wait();
        Ok(r)
    }
}

impl Collective for ThreadGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn all_reduce_sum(&self, vals: &mut [f64]) -> Result<()> {
        let sum = self.exchange(&self.shared.f64s, vals, |all| {
            (0..vals.len()).map(|j| all.iter().map(|v| v[j]).fold(0.0, |a, b| a + b)).collect::<Vec<f64>>()
        })?;
        vals.copy_from_slice(&sum);
        Ok(())
    }
    fn reduce_scatter_sum(&self, buf: &mut [f32], shard: usize) -> Result<()> {
        let own = self.rank * shard..(self.rank + 1) * shard;
        let sum = self.exchange(&self.shared.f32s, &buf[..shard * self.world], |all| {
            own.clone().map(|j| all.iter().map(|v| v[j]).fold(0.0f32, |a, b| a + b)).collect::<Vec<f32>>()
        })?;
        buf[own].copy_from_slice(&sum);
        Ok(())
    }
    fn all_gather(&self, buf: &mut [f32], shard: usize) -> Result<()> {
        let n = shard * self.world;
        let full = self.exchange(&self.shared.f32s, &buf[..n], |all| {
            (0..self.world).flat_map(|r| all[r][r * shard..(r + 1) * shard].to_vec()).collect::<Vec<f32>>()
        })?;
        buf[..n].copy_from_slice(&full);
        Ok(())
    }
}

/// ZeRO-1 on host buffers. Per step: reduce-scatter the gradients (each rank gets the sum of its shard), the global norm
/// from every rank's shard sums, the clipping factor, AdamW on the rank's shard of the master
/// weights and moments, then an all-gather of the weights.
pub struct HostZero1 {
    pub shards: Shards,
    pub config: AdamWConfig,
    pub step: u64,
    /// This rank's shard of each tensor's master weights and moments.
    pub master: Vec<Vec<f32>>,
    pub m: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
    /// A padded gradient or weight tensor, reused.
    buf: Vec<f32>,
}

impl HostZero1 {
    /// This rank's shards of `params` and of the optimizer state `opt` (a fresh or resumed one).
    pub fn new(params: &Params, opt: &AdamW, rank: usize, world: usize) -> Self {
        let shards = Shards::new(params.tensors.iter().map(|t| t.numel()), rank, world);
        let cut = |data: &[f32], i: usize| {
            let mut s = vec![0.0; shards.shard[i]];
            let r = shards.own_within(i, data.len());
            s[..r.len()].copy_from_slice(&data[r]);
            s
        };
        let n = params.len();
        Self {
            master: (0..n).map(|i| cut(&params.tensors[i].data, i)).collect(),
            m: (0..n).map(|i| cut(&opt.m[i], i)).collect(),
            v: (0..n).map(|i| cut(&opt.v[i], i)).collect(),
            shards,
            config: opt.config,
            step: opt.step,
            buf: Vec::new(),
        }
    }

    /// One optimizer step from this rank's gradients `grads` (of its micro-batches, weighted
    /// for the global batch): afterwards every rank's `params` hold the new weights. Returns the
    /// global gradient norm (before clipping).
    #[allow(clippy::needless_range_loop)] // i indexes params, grads, shards and moments together
    pub fn step(
        &mut self,
        coll: &dyn Collective,
        params: &mut Params,
        grads: &[Vec<f32>],
        lr: f64,
        max_norm: f64,
    ) -> Result<f64> {
        let n = params.len();
        let trained = |i: usize| params.kinds[i] != ParamKind::Frozen;
        // Each rank's shard of the summed gradients, and its part of the squared norm.
        let mut grad_shards = vec![Vec::new(); n];
        let mut sumsq = vec![0.0f64; n];
        for i in (0..n).filter(|&i| trained(i)) {
            self.buf.clear();
            self.buf.extend_from_slice(&grads[i]);
            self.buf.resize(self.shards.padded(i), 0.0);
            coll.reduce_scatter_sum(&mut self.buf, self.shards.shard[i])?;
            grad_shards[i] = self.buf[self.shards.own(i)].to_vec();
            sumsq[i] = sum_squares(&grad_shards[i]);
        }
        coll.all_reduce_sum(&mut sumsq)?;
        let norm = (0..n).filter(|&i| trained(i)).map(|i| sumsq[i]).sum::<f64>().sqrt();
        let scale = clip_coef(norm, max_norm);
        self.step += 1;
        let bc = bias_corrections(&self.config, self.step);
        for i in 0..n {
            let Some(h) = step_constants(&self.config, params.kinds[i], lr, bc, scale) else { continue };
            fox_kernels::simd::adamw(&mut self.master[i], &grad_shards[i], &mut self.m[i], &mut self.v[i], &h);
            // The new weights to every rank.
            self.buf.clear();
            self.buf.resize(self.shards.padded(i), 0.0);
            self.buf[self.shards.own(i)].copy_from_slice(&self.master[i]);
            coll.all_gather(&mut self.buf, self.shards.shard[i])?;
            let len = params.tensors[i].data.len();
            params.tensors[i].data.copy_from_slice(&self.buf[..len]);
        }
        Ok(norm)
    }

    /// The whole optimizer state (every rank gets it; rank 0 writes it into checkpoints).
    pub fn gather(&mut self, coll: &dyn Collective, params: &Params) -> Result<AdamW> {
        let mut opt = AdamW::new(self.config, params);
        opt.step = self.step;
        for i in 0..params.len() {
            for (shard, out) in [(&self.m[i], &mut opt.m[i]), (&self.v[i], &mut opt.v[i])] {
                self.buf.clear();
                self.buf.resize(self.shards.padded(i), 0.0);
                self.buf[self.shards.own(i)].copy_from_slice(shard);
                coll.all_gather(&mut self.buf, self.shards.shard[i])?;
                let len = out.len();
                out.copy_from_slice(&self.buf[..len]);
            }
        }
        Ok(opt)
    }
}

#[test]
fn thread_group_collectives_give_known_values() {
    let world = 3;
    let handles = ThreadGroup::new(world);
    let out: Vec<(Vec<f32>, Vec<f32>, Vec<f64>)> = std::thread::scope(|s| {
        let ts: Vec<_> = handles
            .iter()
            .map(|g| {
                s.spawn(move || {
                    let r = g.rank() as f32;
                    // Rank r holds r+1 everywhere: each shard sums to 1+2+3 = 6.
                    let mut rs = vec![r + 1.0; 6];
                    g.reduce_scatter_sum(&mut rs, 2).unwrap();
                    // Rank r's shard holds 10·r + j: every rank ends with all of them.
                    let mut ag = vec![0.0; 6];
                    ag[2 * g.rank()] = 10.0 * r;
                    ag[2 * g.rank() + 1] = 10.0 * r + 1.0;
                    g.all_gather(&mut ag, 2).unwrap();
                    let mut ar = vec![r as f64, 1.0];
                    g.all_reduce_sum(&mut ar).unwrap();
                    (rs, ag, ar)
                })
            })
            .collect();
        ts.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for (r, (rs, ag, ar)) in out.iter().enumerate() {
        assert_eq!(&rs[2 * r..2 * r + 2], &[6.0, 6.0]);
        assert_eq!(ag, &[0.0, 1.0, 10.0, 11.0, 20.0, 21.0]);
        assert_eq!(ar, &[3.0, 3.0]);
    }
}
