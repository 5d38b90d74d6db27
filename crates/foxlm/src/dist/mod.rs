//! Data-parallel training over several ranks (one process per GPU), with the optimizer state
//! sharded across them (ZeRO-1). See docs/distributed.md.
//!
//! - [`World`]: which rank this process is, from the torchrun variables (RANK, LOCAL_RANK,
//!   WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or the flags of the same names.
//! - [`StepSlice`]: which windows of an optimizer step a rank reads, so that the ranks together
//!   read the windows a single process would, in its order.
//! - [`Shards`]: each tensor cut into `world` equal shards (padded); rank r updates shard r.
//! - [`Collective`] and [`HostZero1`]: the ZeRO-1 step on host buffers, with an in-process
//!   implementation ([`ThreadGroup`]) that tests the algorithm on the CPU. The GPU engine runs the
//!   same steps through NCCL (`backend::cuda`, `fox_kernels::cuda::nccl`).
//! - [`rendezvous`], [`control`]: the TCP rendezvous that hands out the NCCL id, and the watchdog
//!   that stops every rank when one fails. [`launch`]: `foxlm train --gpus N`.

pub mod control;
pub mod launch;
pub mod rendezvous;

use crate::data::{Batch, Loader};
use crate::optim::{bias_corrections, clip_coef, step_constants, sum_squares, AdamW, AdamWConfig};
use crate::tensor::{ParamKind, Params};
use anyhow::{bail, ensure, Result};
use std::ops::Range;
use std::sync::{Arc, Barrier, Mutex};

/// This process's place among the ranks of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct World {
    pub rank: usize,
    /// The GPU of this machine the rank uses.
    pub local_rank: usize,
    pub size: usize,
    pub master_addr: String,
    pub master_port: u16,
}

impl World {
    pub fn check(&self) -> Result<()> {
        if self.size == 0 {
            bail!("WORLD_SIZE / --world-size must be at least 1");
        }
        if self.rank >= self.size {
            bail!("RANK / --rank {} is outside a world of {} ranks (ranks are 0..{})", self.rank, self.size, self.size);
        }
        Ok(())
    }
}

/// What a rank of a data-parallel run brings to `train::train`: its place and the NCCL id of
/// the rendezvous.
#[derive(Clone, Debug)]
pub struct DistRun {
    pub world: World,
    pub nccl_id: Vec<u8>,
}

/// Runs `f` as rank `w.rank` of a multi-process run: the TCP rendezvous (which hands out the
/// NCCL id), the watchdog over its connections, then `f`; `f`'s failure is told to the other
/// ranks and left for the launcher (FOXLM_ERROR_FILE) before it is returned.
pub fn as_rank<R>(
    w: &World,
    rendezvous_timeout: std::time::Duration,
    collective_timeout: std::time::Duration,
    f: impl FnOnce(DistRun) -> Result<R>,
) -> Result<R> {
    let fail = |e: anyhow::Error| {
        control::write_error_file(&format!("{e:#}"));
        e
    };
    let (id, links) =
        rendezvous::rendezvous(w, rendezvous_timeout, fox_kernels::cuda::nccl::unique_id).map_err(fail)?;
    let ctl = control::Control::start(w.rank, links, collective_timeout, control::exit_on_stop(w.rank))
        .map_err(|e| fail(anyhow::Error::from(e).context("starting the watchdog")))?;
    let res = f(DistRun { world: w.clone(), nccl_id: id });
    match &res {
        Ok(_) => ctl.done(),
        Err(e) => {
            ctl.fail(&format!("{e:#}"));
            control::write_error_file(&format!("{e:#}"));
        }
    }
    res
}

/// Which windows of one optimizer step a rank reads. The step's `accum` micro-batches of `micro`
/// windows are those a single process reads in order; rank r takes the r-th of `world` equal runs
/// of micro-batches. So the global batch, and the order in which the windows are drawn, are the
/// single-process run's, and every rank's loader ends the step where a single loader would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepSlice {
    /// Windows before this rank's (read by lower ranks).
    pub before: u64,
    /// This rank's micro-batches.
    pub micro_batches: usize,
    /// Windows after this rank's.
    pub after: u64,
}

impl StepSlice {
    pub fn new(micro: usize, accum: usize, rank: usize, world: usize) -> Result<Self> {
        ensure!(world >= 1 && rank < world, "rank {rank} outside a world of {world}");
        if !accum.is_multiple_of(world) {
            bail!(
                "the batch of {} sequences ({accum} micro-batches of {micro}) cannot be split evenly over {world} \
                 ranks: make --batch-size a multiple of --micro-batch × {world}",
                accum * micro
            );
        }
        let local = accum / world;
        let w = (local * micro) as u64;
        Ok(Self { before: rank as u64 * w, micro_batches: local, after: (world - 1 - rank) as u64 * w })
    }

    /// This rank's micro-batches of the next step, `loader` left where a single loader would be.
    pub fn read(&self, loader: &mut Loader, micro: usize) -> Vec<Batch> {
        loader.skip(self.before);
        let out = (0..self.micro_batches).map(|_| loader.next_batch(micro)).collect();
        loader.skip(self.after);
        out
    }
}

/// Each tensor of `len` elements cut into `world` shards of `ceil(len / world)` (the last padded
/// with zeros): rank r owns `[r·shard, (r+1)·shard)` of the padded tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shards {
    pub rank: usize,
    pub world: usize,
    pub shard: Vec<usize>,
}

impl Shards {
    pub fn new(lens: impl IntoIterator<Item = usize>, rank: usize, world: usize) -> Self {
        Self { rank, world, shard: lens.into_iter().map(|n| n.div_ceil(world.max(1))).collect() }
    }

    /// Elements of tensor `i` with its padding.
    pub fn padded(&self, i: usize) -> usize {
        self.shard[i] * self.world
    }

    /// This rank's shard of tensor `i` in the padded tensor.
    pub fn own(&self, i: usize) -> Range<usize> {
        self.rank * self.shard[i]..(self.rank + 1) * self.shard[i]
    }

    /// The part of this rank's shard that lies within the first `n` elements (the tensor's
    /// unpadded data), as a range of the tensor.
    pub fn own_within(&self, i: usize, n: usize) -> Range<usize> {
        let r = self.own(i);
        r.start.min(n)..r.end.min(n)
    }
}

/// The collectives of ZeRO-1 over host buffers. Every rank calls them in the same order.
pub trait Collective: Send + Sync {
    fn rank(&self) -> usize;
    fn world(&self) -> usize;
    /// vals = Σ over ranks of vals.
    fn all_reduce_sum(&self, vals: &mut [f64]) -> Result<()>;
    /// Over buf[..world·shard]: this rank's shard becomes the sum over ranks of that shard.
    fn reduce_scatter_sum(&self, buf: &mut [f32], shard: usize) -> Result<()>;
    /// Over buf[..world·shard]: every rank's shard is copied to all ranks.
    fn all_gather(&self, buf: &mut [f32], shard: usize) -> Result<()>;
}

/// Ranks as threads of one process, for tests: each collective deposits every rank's buffer,
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
    fn world(&self) -> usize {
        self.world
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

/// ZeRO-1 on host buffers: what each rank of the GPU engine does after its backward, written
/// over [`Collective`] so that the CPU tests can run it with ranks as threads.
///
/// Per step: reduce-scatter the gradients (each rank gets the sum of its shard), the global norm
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

// ---------------------------------------------------------------------------------------------
// Progress, for the watchdog (see `control`).

static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
static LAST_PROGRESS_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn now_ms() -> u64 {
    START.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64
}

/// Records that this rank made progress (a step, a validation batch, a checkpoint).
pub fn heartbeat() {
    LAST_PROGRESS_MS.store(now_ms(), std::sync::atomic::Ordering::Relaxed);
}

/// Seconds since the last [`heartbeat`].
pub fn since_progress_s() -> f64 {
    now_ms().saturating_sub(LAST_PROGRESS_MS.load(std::sync::atomic::Ordering::Relaxed)) as f64 / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_slices_cover_the_step_in_order() {
        // 8 micro-batches of 2 windows over 4 ranks: 2 micro-batches (4 windows) each.
        let s: Vec<StepSlice> = (0..4).map(|r| StepSlice::new(2, 8, r, 4).unwrap()).collect();
        assert_eq!(s[0], StepSlice { before: 0, micro_batches: 2, after: 12 });
        assert_eq!(s[2], StepSlice { before: 8, micro_batches: 2, after: 4 });
        assert_eq!(s[3], StepSlice { before: 12, micro_batches: 2, after: 0 });
        let err = StepSlice::new(2, 3, 0, 2).unwrap_err().to_string();
        assert!(err.contains("multiple of --micro-batch × 2"), "{err}");
    }

    /// The backward's buckets (head, blocks, embedding) name every parameter once, and each
    /// block's bucket holds exactly that block's parameters: a parameter left out would never be
    /// reduced during the backward.
    #[test]
    fn gradient_buckets_cover_every_parameter_once() {
        let m = crate::model::Model::new(&crate::presets::Variant::FoxPro.config(64, 3, 2));
        let mut seen = vec![0; m.params.len()];
        let buckets = std::iter::once(m.head_params())
            .chain((0..m.layers.len()).rev().map(|l| m.layer_params(l)))
            .chain(std::iter::once(m.embeddings.0..m.embeddings.0 + 1));
        for r in buckets {
            r.for_each(|i| seen[i] += 1);
        }
        assert!(seen.iter().all(|&c| c == 1), "{seen:?}");
        for l in 0..m.layers.len() {
            let prefix = format!("model.layers.{l}.");
            assert!(m.layer_params(l).all(|i| m.params.names[i].starts_with(&prefix)));
            assert_eq!(m.layer_params(l).len(), m.params.names.iter().filter(|n| n.starts_with(&prefix)).count());
        }
    }

    #[test]
    fn shards_pad_and_partition() {
        let s = Shards::new([10, 3, 8], 2, 3);
        assert_eq!(s.shard, [4, 1, 3]);
        assert_eq!((s.padded(0), s.own(0), s.own_within(0, 10)), (12, 8..12, 8..10));
        assert_eq!((s.own(1), s.own_within(1, 3)), (2..3, 2..3));
        assert_eq!(s.own_within(2, 5), 5..5);
        // One rank owns everything, unpadded.
        let one = Shards::new([10, 3], 0, 1);
        assert_eq!((one.own(0), one.padded(1)), (0..10, 3));
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
}
