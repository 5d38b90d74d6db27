//! Data-parallel training over several ranks (one process per GPU), with the optimizer state
//! sharded across them (ZeRO-1). See docs/distributed.md.
//!
//! - [`World`]: which rank this process is, from the torchrun variables (RANK, LOCAL_RANK,
//!   WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or the flags of the same names.
//! - [`StepSlice`]: which windows of an optimizer step a rank reads, so that the ranks together
//!   read the windows a single process would, in its order.
//! - [`crate::backend::Shards`] (beside the ZeRO-1 step that uses it): each tensor cut into
//!   `world` equal shards (padded); rank r updates shard r.
//! - The ZeRO-1 step itself runs in the GPU engine through NCCL (`backend::cuda`,
//!   `fox_kernels::cuda::nccl`); tests/distributed.rs checks the same algorithm on host buffers,
//!   with ranks as threads.
//! - [`rendezvous`], [`control`]: the TCP rendezvous that hands out the NCCL id, and the watchdog
//!   that stops every rank when one fails. [`launch`]: `foxlm train --gpus N`.

pub mod control;
pub mod launch;
pub mod rendezvous;

use crate::data::{Batch, Loader};
use anyhow::{bail, ensure, Context, Result};

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

/// torchrun's default rendezvous port, also `foxlm train`'s (--master-port).
pub const DEFAULT_MASTER_PORT: u16 = 29500;

impl World {
    /// A rank's place from its parts (LOCAL_RANK defaults to RANK), checked.
    pub fn new(
        rank: usize,
        local_rank: Option<usize>,
        size: usize,
        master_addr: String,
        master_port: u16,
    ) -> Result<Self> {
        let w = Self { rank, local_rank: local_rank.unwrap_or(rank), size, master_addr, master_port };
        w.check()?;
        Ok(w)
    }

    /// From the torchrun variables of this process's environment: RANK and WORLD_SIZE must be
    /// set; LOCAL_RANK, MASTER_ADDR and MASTER_PORT default as `foxlm train`'s flags do.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`World::from_env`] over any source of variables.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let num = |name: &str| -> Result<Option<usize>> {
            var(name).map(|v| v.trim().parse().with_context(|| format!("{name}={v}: not a number"))).transpose()
        };
        let need =
            |name: &str| num(name)?.with_context(|| format!("{name} is not set (a rank of a multi-process run)"));
        let port = match var("MASTER_PORT") {
            Some(v) => v.trim().parse().with_context(|| format!("MASTER_PORT={v}: not a port number"))?,
            None => DEFAULT_MASTER_PORT,
        };
        Self::new(
            need("RANK")?,
            num("LOCAL_RANK")?,
            need("WORLD_SIZE")?,
            var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into()),
            port,
        )
    }

    /// The GPU this rank uses among the `visible` GPUs of its machine: LOCAL_RANK's, or the only
    /// one where a cluster launcher shows each rank its own GPU (CUDA_VISIBLE_DEVICES).
    pub fn gpu(&self, visible: usize) -> Result<usize> {
        if self.local_rank < visible {
            Ok(self.local_rank)
        } else if visible == 1 {
            Ok(0)
        } else {
            bail!("LOCAL_RANK {} but this machine shows {visible} GPUs (0..{visible})", self.local_rank)
        }
    }

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

    /// This rank's micro-batches of the next step, one at a time to `f` with whether it is the
    /// last; `loader` is left where a single loader would be.
    pub fn read_each(
        &self,
        loader: &mut Loader,
        micro: usize,
        mut f: impl FnMut(Batch, bool) -> Result<()>,
    ) -> Result<()> {
        loader.skip(self.before);
        for k in 0..self.micro_batches {
            f(loader.next_batch(micro), k + 1 == self.micro_batches)?;
        }
        loader.skip(self.after);
        Ok(())
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
    fn world_from_the_torchrun_variables() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        let w = World::from_vars(vars(&[("RANK", "1"), ("WORLD_SIZE", "2")])).unwrap();
        assert_eq!(w, World::new(1, None, 2, "127.0.0.1".into(), DEFAULT_MASTER_PORT).unwrap());
        assert_eq!(w.local_rank, 1);
        let w = World::from_vars(vars(&[
            ("RANK", "3"),
            ("LOCAL_RANK", "0"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "node7"),
            ("MASTER_PORT", "1234"),
        ]))
        .unwrap();
        assert_eq!((w.rank, w.local_rank, w.size, w.master_addr.as_str(), w.master_port), (3, 0, 4, "node7", 1234));
        let err = |pairs| format!("{:#}", World::from_vars(vars(pairs)).unwrap_err());
        assert!(err(&[("WORLD_SIZE", "2")]).contains("RANK is not set"));
        assert!(err(&[("RANK", "x"), ("WORLD_SIZE", "2")]).contains("RANK=x: not a number"));
        assert!(err(&[("RANK", "2"), ("WORLD_SIZE", "2")]).contains("outside a world of 2"));
        assert!(err(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "70000")]).contains("not a port number"));
    }

    #[test]
    fn a_rank_uses_its_local_gpu_or_the_only_one_it_sees() {
        let w = |local| World::new(5, Some(local), 8, String::new(), 1).unwrap();
        assert_eq!(w(1).gpu(2).unwrap(), 1);
        assert_eq!(w(3).gpu(1).unwrap(), 0);
        let e = w(3).gpu(2).unwrap_err().to_string();
        assert!(e.contains("LOCAL_RANK 3 but this machine shows 2 GPUs"), "{e}");
    }
}
