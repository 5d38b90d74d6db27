//! Running a trained model on the CPU or a GPU: logits, per-position losses, generation and the
//! activations behind gate maps, behind one interface ([`Infer`]) so that `forward`, `generate`,
//! `eval loss`, `eval niah` and `viz gates` take `--device` and `--dtype` and give the same
//! outputs on either.
//!
//! The CPU backend is the f32 reference (the functions these commands always used). The GPU backend
//! runs the same model code on the CUDA backend: prompts are prefilled in chunks through a decode
//! cache on the device (keys, values, running gate sums and KV-shift states), and each new token
//! costs one forward of one position per row plus the output head of the last positions; the next
//! token is chosen on the device, and only the chosen ids come back to the host.

use crate::backend::Dtype;
use crate::eval::loss::{batch_token_losses, Chunking};
use crate::generate::{run_prompts, GenerateOptions, PromptJob};
use crate::model::{CpuActs, Ctx, Model};
use crate::serve::scheduler::CpuBatcher;
use anyhow::{anyhow, ensure, Result};
use fox_kernels::cuda;

mod gpu;
pub use gpu::GpuInfer;

/// The largest batch × chunk the GPU inference backend plans by default (rows of one forward).
pub const DEFAULT_GPU_ROWS: usize = 16384;

/// What a command will ask of an inference backend, so the GPU one can plan its buffers once.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Most sequences at once.
    pub batch: usize,
    /// Most positions per forward (longer inputs go through the cache in chunks of this many).
    pub chunk: usize,
}

impl Plan {
    /// Whether a forward of `b` rows × `t` positions fits buffers planned for `self`. They are
    /// sized by rows (batch × chunk) except Mamba's saved chunk states (b × ⌈t / 64⌉), so fewer
    /// rows than planned may take longer chunks.
    pub fn fits(&self, b: usize, t: usize) -> bool {
        let chunks = fox_kernels::selective_scan::chunks;
        b <= self.batch
            && b.checked_mul(t).is_some_and(|n| n <= self.batch.saturating_mul(self.chunk))
            && b.saturating_mul(chunks(t)) <= self.batch.saturating_mul(chunks(self.chunk))
    }

    /// The longest prefill chunk for `b` rows: the planned positions (batch × chunk) over the
    /// rows, in whole 64-position blocks, where that is longer than the planned chunk.
    pub fn widest_chunk(&self, b: usize) -> usize {
        let block = fox_kernels::selective_scan::CHUNK;
        let wide = self.batch.saturating_mul(self.chunk) / b.max(1) / block * block;
        if wide > self.chunk && self.fits(b.max(1), wide) {
            wide
        } else {
            self.chunk
        }
    }
}

/// Timings of one generation ([`GpuInfer::timed_generate`]).
pub struct Timed {
    pub prefill_s: f64,
    pub decode_s: f64,
    /// Tokens generated per row.
    pub steps: usize,
    /// With profiling: per kernel family, GPU milliseconds and operations over the decode.
    pub families: Vec<(crate::backend::Family, f64, usize)>,
}

/// Timings of one scoring pass ([`GpuInfer::timed_score`]).
pub struct TimedScore {
    pub forward_s: f64,
    /// The head and the log-probabilities, the download of them included.
    pub head_s: f64,
    /// With profiling: per kernel family, GPU milliseconds and operations over the forward.
    pub families: Vec<(crate::backend::Family, f64, usize)>,
}

/// What a serving decode step gives back ([`GpuInfer::step`]).
pub(crate) enum StepOut {
    /// Logits [b, V].
    Logits(Vec<f32>),
    /// Each row's greedy token.
    Chosen(Vec<u32>),
}

/// A model ready to run on one device.
pub trait Infer {
    /// The device, in words (printed by the commands).
    fn describe(&self) -> String;
    /// Logits [B, T, V] of a batch (left padding in `ctx.start`).
    fn logits(&mut self, ids: &[u32], ctx: &Ctx) -> Result<Vec<f32>>;
    /// Next-token losses of equally long sequences (`seqs[b].len() == N + 1`): `[B][N]`, as
    /// [`batch_token_losses`]; `progress(t)` after each chunk of t positions.
    fn token_losses(
        &mut self,
        seqs: &[Vec<u32>],
        chunk: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<Vec<f64>>>;
    /// Continuations of the job's prompts, all in one batch of the serving scheduler
    /// ([`crate::generate::run_prompts`] over the device's batcher), prefilled in chunks of
    /// `job.chunk` positions (at most what the device planned).
    fn run_prompts(&mut self, job: PromptJob) -> Result<Vec<Vec<u32>>>;
    /// Continuations of `prompts`, all in one batch of the serving scheduler (as
    /// [`crate::generate::generate`]), every prompt prefilled at once (the GPU: in its planned
    /// chunks); `on_token(row, id)` sees each token as it is chosen.
    fn generate(
        &mut self,
        prompts: &[Vec<u32>],
        opts: &GenerateOptions,
        on_token: &mut dyn FnMut(usize, u32),
    ) -> Result<Vec<Vec<u32>>> {
        self.run_prompts(PromptJob { prompts, opts, chunk: crate::generate::WHOLE, on_token, progress: &mut |_| {} })
    }
    /// Greedy continuation of one prompt through the serving scheduler, prefilled in
    /// chunks of `chunk` positions (`progress(n)` after each).
    fn greedy(
        &mut self,
        prompt: &[u32],
        max_new: usize,
        chunk: usize,
        eos: Option<u32>,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<u32>> {
        ensure!(!prompt.is_empty(), "an empty prompt");
        let opts = GenerateOptions { max_new_tokens: max_new, sampling: Default::default(), seed: 0, eos };
        let prompts = [prompt.to_vec()];
        let mut out =
            self.run_prompts(PromptJob { prompts: &prompts, opts: &opts, chunk, on_token: &mut |_, _| {}, progress })?;
        Ok(out.pop().unwrap_or_default())
    }
    /// One sequence's attention activations for gate maps: per block the forget-gate logits, the
    /// prefix sums c, and the attention inputs q and k (f32 on the host; other fields empty).
    fn gate_acts(&mut self, ids: &[u32]) -> Result<CpuActs>;
}

/// Opens `model` on `device` with `dtype` (None: bf16 on a GPU; the CPU runs f32 only).
pub fn open<'m>(
    model: &'m Model,
    device: &cuda::Device,
    dtype: Option<Dtype>,
    plan: Plan,
) -> Result<Box<dyn Infer + 'm>> {
    match device {
        cuda::Device::Cpu => {
            Dtype::refuse_bf16_on_cpu(dtype, "runs")?;
            Ok(Box::new(CpuInfer { model }))
        }
        cuda::Device::Cuda(gpu) => Ok(match dtype.unwrap_or_default() {
            Dtype::Bf16 => Box::new(GpuInfer::<half::bf16>::new(gpu.clone(), model, plan)?),
            Dtype::F32 => Box::new(GpuInfer::<f32>::new(gpu.clone(), model, plan)?),
        }),
    }
}

/// The CPU inference backend (the f32 reference).
pub struct CpuInfer<'m> {
    pub model: &'m Model,
}

impl Infer for CpuInfer<'_> {
    fn describe(&self) -> String {
        cuda::Device::Cpu.describe()
    }
    fn logits(&mut self, ids: &[u32], ctx: &Ctx) -> Result<Vec<f32>> {
        Ok(self.model.forward(ids, ctx))
    }
    fn token_losses(
        &mut self,
        seqs: &[Vec<u32>],
        chunk: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Vec<Vec<f64>>> {
        let chunking = Chunking::new(chunk, self.model.config.vocab_size);
        Ok(batch_token_losses(self.model, seqs, chunking, progress))
    }
    fn run_prompts(&mut self, job: PromptJob) -> Result<Vec<Vec<u32>>> {
        run_prompts(&mut CpuBatcher::new(self.model), job)
    }
    fn gate_acts(&mut self, ids: &[u32]) -> Result<CpuActs> {
        let ctx = Ctx { batch: 1, seq: ids.len(), start: None };
        let (_, acts) = self.model.forward_hidden(ids, &ctx, None, true);
        acts.ok_or_else(|| anyhow!("the forward kept no activations"))
    }
}

#[cfg(test)]
mod tests {
    use super::Plan;

    #[test]
    fn a_group_of_fewer_rows_takes_longer_chunks() {
        // Serving's default plan: 32 slots of 512 positions (16,384 rows of a forward).
        let p = Plan { batch: 32, chunk: 512 };
        assert_eq!(p.widest_chunk(32), 512);
        assert_eq!(p.widest_chunk(4), 4096);
        assert_eq!(p.widest_chunk(1), 16384);
        // Whole 64-position blocks: 16384 / 3 = 5461 → 5440.
        assert_eq!(p.widest_chunk(3), 5440);
        assert!(p.fits(3, 5440) && p.fits(4, 4096) && p.fits(32, 512));
        assert!(!p.fits(4, 4097) && !p.fits(33, 1) && !p.fits(32, 513));
        // Mamba's chunk states: 3 rows of 5461 would be 3 × 86 = 258 blocks of 64 > 256 planned.
        assert!(!p.fits(3, 5461));
        // A plan whose chunk is not a whole block: 5 × 100 rows; 250 each for 2 rows, in blocks.
        let q = Plan { batch: 5, chunk: 100 };
        assert_eq!(q.widest_chunk(5), 100);
        assert_eq!(q.widest_chunk(2), 192);
        assert!(!q.fits(1, usize::MAX));
    }
}
