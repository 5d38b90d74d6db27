//! Data-parallel training without GPUs: the ZeRO-1 step and the data order of `foxlm::distributed` run
//! with ranks as threads (`ThreadGroup`) against the single-process trainer's arithmetic, and the
//! `foxlm train` binary's multi-process errors (no GPUs, a missing peer) end quickly and clearly.
//! The same algorithm runs through NCCL on GPUs: `foxlm gpu-check --part dist`.

use foxlm::data::{prepare, Dataset, Loader, LoaderState, PrepareOptions, Split};
#[path = "common/zero1.rs"]
mod zero1;

use foxlm::distributed::StepSlice;
use foxlm::model::{Ctx, Model};
use foxlm::optim::{clip_coef, global_norm, AdamW, AdamWConfig};
use foxlm::presets::Variant;
use foxlm::train::init_model;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use zero1::{Collective, HostZero1, ThreadGroup};

const CONTEXT: usize = 16;
const MICRO: usize = 1;
const ACCUM: usize = 4;
const LR: f64 = 1e-3;
/// Low enough that clipping is active in some steps.
const MAX_NORM: f64 = 1.0;

fn small_data(dir: &Path) -> PathBuf {
    let txt = dir.join("txt");
    std::fs::create_dir_all(&txt).unwrap();
    for i in 0..8 {
        let body: String = (0..40)
            .map(|j| format!("Sentence {j} of part {i}: the whale swam {} miles east. ", (i * 7 + j * 3) % 11))
            .collect();
        std::fs::write(txt.join(format!("part{i}.txt")), body).unwrap();
    }
    let out = dir.join("data");
    prepare(&[txt], &out, &PrepareOptions { val_fraction: 0.0, ..Default::default() }).unwrap();
    out
}

fn model() -> Model {
    let mut cfg = Variant::FoxPro.config(32, 2, 2);
    cfg.initializer_range = 0.02;
    init_model(&cfg, 3)
}

fn adamw(model: &Model) -> AdamW {
    AdamW::new(AdamWConfig { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 }, &model.params)
}

/// Accumulates the gradients of `batches` (each weighted for a global batch of `ACCUM`
/// micro-batches); returns their summed mean losses.
fn grads_of(model: &Model, batches: &[foxlm::data::Batch], grads: &mut [Vec<f32>]) -> f64 {
    let ctx = Ctx { batch: MICRO, seq: CONTEXT, start: None };
    batches.iter().map(|b| model.loss_and_grads(&b.ids, &b.targets, &ctx, grads, 1.0 / ACCUM as f32) as f64).sum()
}

/// What one step records: the ids read (all ranks, in rank order), the loss, the norm, and the
/// loader's position afterwards.
#[derive(Debug, PartialEq)]
struct Step {
    ids: Vec<u32>,
    loss: f64,
    norm: f64,
    loader: LoaderState,
}

/// `steps` optimizer steps as the single-process CPU trainer takes them.
fn single(ds: &Dataset, model: &mut Model, opt: &mut AdamW, loader_at: LoaderState, steps: usize) -> Vec<Step> {
    let mut loader = Loader::new(ds, Split::Train, CONTEXT, 0, true).unwrap();
    loader.set_state(loader_at);
    let mut grads = model.params.zeros_like();
    (0..steps)
        .map(|_| {
            let batches: Vec<_> = (0..ACCUM).map(|_| loader.next_batch(MICRO)).collect();
            let loss = grads_of(model, &batches, &mut grads) / ACCUM as f64;
            let norm = global_norm(&grads, &model.params);
            opt.update_scaled_and_zero(&mut model.params, &mut grads, LR, clip_coef(norm, MAX_NORM), None, None);
            Step { ids: batches.iter().flat_map(|b| b.ids.clone()).collect(), loss, norm, loader: loader.state() }
        })
        .collect()
}

/// The same steps over `world` ranks (threads) with ZeRO-1; every rank's model and loader end
/// where they would on one process. Returns rank 0's model, the gathered optimizer state, and
/// the steps.
fn ranks(
    ds: &Dataset,
    start: &Model,
    opt: &AdamW,
    loader_at: LoaderState,
    world: usize,
    steps: usize,
) -> (Model, AdamW, Vec<Step>) {
    let group = ThreadGroup::new(world);
    let mut out: Vec<(Model, AdamW, Vec<Step>)> = std::thread::scope(|s| {
        let hs: Vec<_> = group
            .iter()
            .map(|g| {
                s.spawn(move || {
                    let (rank, mut model) = (g.rank(), start.clone());
                    let mut zero = HostZero1::new(&model.params, opt, rank, world);
                    let mut loader = Loader::new(ds, Split::Train, CONTEXT, 0, true).unwrap();
                    loader.set_state(loader_at);
                    let slice = StepSlice::new(MICRO, ACCUM, rank, world).unwrap();
                    let mut record = Vec::new();
                    for _ in 0..steps {
                        let mut batches = Vec::new();
                        slice
                            .read_each(&mut loader, MICRO, |b, last| {
                                batches.push(b);
                                assert_eq!(last, batches.len() == slice.micro_batches);
                                Ok(())
                            })
                            .unwrap();
                        let mut grads = model.params.zeros_like();
                        let mut loss = [grads_of(&model, &batches, &mut grads)];
                        g.all_reduce_sum(&mut loss).unwrap();
                        // Every rank's ids, gathered in rank order (as f32: ids < 2^24).
                        let per = MICRO * CONTEXT * slice.micro_batches;
                        let mut ids = vec![0.0f32; per * world];
                        for (k, b) in batches.iter().enumerate() {
                            for (j, &t) in b.ids.iter().enumerate() {
                                ids[rank * per + k * MICRO * CONTEXT + j] = t as f32;
                            }
                        }
                        g.all_gather(&mut ids, per).unwrap();
                        let norm = zero.step(g, &mut model.params, &grads, LR, MAX_NORM).unwrap();
                        record.push(Step {
                            ids: ids.iter().map(|&t| t as u32).collect(),
                            loss: loss[0] / ACCUM as f64,
                            norm,
                            loader: loader.state(),
                        });
                    }
                    let opt = zero.gather(g, &model.params).unwrap();
                    (model, opt, record)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // Every rank holds the same weights and optimizer state after the all-gathers.
    for r in 1..world {
        assert_eq!(weights(&out[r].0), weights(&out[0].0), "rank {r}'s weights differ from rank 0's");
        assert_eq!(out[r].1, out[0].1, "rank {r}'s optimizer state differs from rank 0's");
        assert_eq!(out[r].2, out[0].2, "rank {r} recorded other steps than rank 0");
    }
    out.swap_remove(0)
}

fn weights(m: &Model) -> Vec<&[f32]> {
    m.params.tensors.iter().map(|t| &t.data[..]).collect()
}

fn max_diff(a: &Model, b: &Model) -> f32 {
    let (a, b) = (&a.params.tensors, &b.params.tensors);
    a.iter().zip(b).flat_map(|(x, y)| x.data.iter().zip(&y.data).map(|(p, q)| (p - q).abs())).fold(0.0, f32::max)
}

/// The reference for the tests below: the small dataset (in `tmp`), where its loader starts,
/// and `steps` single-process steps from a fresh model, which must clip at least once.
struct Reference {
    ds: Dataset,
    at: LoaderState,
    want: Vec<Step>,
    model: Model,
    opt: AdamW,
}

fn reference(tmp: &Path, steps: usize) -> Reference {
    let ds = Dataset::open(&small_data(tmp)).unwrap();
    let at = Loader::new(&ds, Split::Train, CONTEXT, 0, true).unwrap().state();
    let (mut model, mut opt) = (model(), adamw(&model()));
    let want = single(&ds, &mut model, &mut opt, at, steps);
    assert!(want.iter().any(|s| s.norm > MAX_NORM), "clipping should be exercised: {want:?}");
    Reference { ds, at, want, model, opt }
}

/// The headline of the issue on the CPU: 1, 2 and 4 ranks with ZeRO-1 take the single-process
/// run's steps: the same windows in the same order (exactly), the same loader positions
/// (exactly), and the same losses, norms and weights (one rank: bitwise; more: within the
/// rounding of summing the ranks' gradients in another order). Then a run saved on 4 ranks
/// resumes on 2 and continues as the single-process run does.
#[test]
fn zero1_ranks_reproduce_the_single_process_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let steps = 3;
    let Reference { ds, at, want, model: ref_model, opt: ref_opt } = reference(tmp.path(), steps);
    for world in [1, 2, 4] {
        let (m, opt, got) = ranks(&ds, &model(), &adamw(&model()), at, world, steps);
        for (s, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.ids, w.ids, "world {world}, step {s}: other windows or order");
            assert_eq!(g.loader, w.loader, "world {world}, step {s}: the loader ends elsewhere");
            let (dl, dn) = ((g.loss - w.loss).abs(), (g.norm - w.norm).abs() / w.norm);
            if world == 1 {
                assert_eq!((g.loss, g.norm), (w.loss, w.norm), "one rank, step {s}");
            } else {
                assert!(dl < 1e-6 && dn < 1e-5, "world {world}, step {s}: loss Δ {dl:e}, norm rel Δ {dn:e}");
            }
        }
        let d = max_diff(&m, &ref_model);
        if world == 1 {
            assert_eq!(weights(&m), weights(&ref_model), "one rank must reproduce the weights bitwise");
            assert_eq!(opt, ref_opt, "one rank must reproduce the optimizer state bitwise");
        } else {
            // Adam divides by √v: a gradient that cancels to ~0 can move by up to lr per step
            // when its rounding differs; the bound is far below that for these weights.
            assert!(d < 1e-6, "world {world}: max |Δ weight| {d:e}");
        }
        eprintln!("world {world}: max |Δ weight| after {steps} steps = {d:e}");
    }
    // Saved on 4 ranks (the gathered state is the single-process format), resumed on 2.
    let (m4, opt4, got4) = ranks(&ds, &model(), &adamw(&model()), at, 4, 2);
    let (m2, _, got2) = ranks(&ds, &m4, &opt4, got4[1].loader, 2, 1);
    let (mut m1, mut opt1) = (model(), adamw(&model()));
    let want = single(&ds, &mut m1, &mut opt1, at, 3);
    assert_eq!(got2[0].ids, want[2].ids);
    assert!((got2[0].loss - want[2].loss).abs() < 1e-6, "{} vs {}", got2[0].loss, want[2].loss);
    assert!(max_diff(&m2, &m1) < 1e-6, "resumed 4 → 2: max |Δ weight| {:e}", max_diff(&m2, &m1));
}

/// The same for the recurrent families' parameters (HGRN2's per-layer lower bounds, the delta
/// rule's and Mamba-2's convolutions, decays and norms): 2 ranks with ZeRO-1 against the
/// single-process steps, within the rounding of the other summation order. On GPUs the same
/// rows run through NCCL (`foxlm gpu-check --only dist --dist-model hgrn2|deltanet|...`).
#[test]
fn zero1_ranks_reproduce_the_single_process_steps_for_every_family() {
    use foxlm::presets::{deltanet_config, hgrn2_config, mamba2_config};
    let tmp = tempfile::tempdir().unwrap();
    let ds = Dataset::open(&small_data(tmp.path())).unwrap();
    let at = Loader::new(&ds, Split::Train, CONTEXT, 0, true).unwrap().state();
    let steps = 3;
    for (name, cfg) in [
        ("hgrn2", hgrn2_config(32, 2, 16)),
        ("gated deltanet", deltanet_config(32, 2, 2, true)),
        ("deltanet", deltanet_config(32, 2, 2, false)),
        ("mamba2", mamba2_config(32, 2)),
    ] {
        cfg.validate().unwrap();
        let start = init_model(&cfg, 3);
        let (mut m1, mut o1) = (start.clone(), adamw(&start));
        let want = single(&ds, &mut m1, &mut o1, at, steps);
        let (m2, _, got) = ranks(&ds, &start, &adamw(&start), at, 2, steps);
        for (s, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.ids, w.ids, "{name}, step {s}: other windows");
            let (dl, dn) = ((g.loss - w.loss).abs(), (g.norm - w.norm).abs() / w.norm);
            assert!(dl < 1e-6 && dn < 1e-5, "{name}, step {s}: loss Δ {dl:e}, norm rel Δ {dn:e}");
        }
        let d = max_diff(&m2, &m1);
        assert!(d < 1e-6, "{name}: max |Δ weight| {d:e} after {steps} steps on 2 ranks");
        eprintln!("{name}: 2 ranks, max |Δ weight| after {steps} steps = {d:e}");
    }
}

// ---------------------------------------------------------------------------------------------
// The binary's multi-process errors.

/// The single-process reference above is what `foxlm train`'s CPU engine computes: over
/// steps of four accumulated micro-batches (the Linear weights' gradients left stale by AdamW
/// and overwritten by the next step's first product, the norm's sums of squares taken during
/// the last micro-batch's backward, the embedding's untouched rows skipped), the same windows,
/// losses, norms and weights (the losses to f32's rounding; the norms and weights to a last-bit
/// difference: the engine sums the embedding's part of the norm by touched rows, not by chunks).
#[test]
fn cpu_engine_takes_the_single_process_steps() {
    use foxlm::engine::{CpuEngine, Engine};
    let tmp = tempfile::tempdir().unwrap();
    let Reference { ds, at, want, model: ref_model, opt: ref_opt } = reference(tmp.path(), 3);
    let (mut m, mut opt) = (model(), adamw(&model()));
    let mut engine = CpuEngine::new(&m, MICRO);
    let mut loader = Loader::new(&ds, Split::Train, CONTEXT, 0, true).unwrap();
    loader.set_state(at);
    for (s, w) in want.iter().enumerate() {
        let st = engine.grads(&mut m, &mut loader, MICRO, ACCUM, MAX_NORM).unwrap();
        engine.update(&mut m, &mut opt, LR).unwrap();
        assert_eq!(loader.state(), w.loader, "step {s}: the loader ends elsewhere");
        let (dl, dn) = ((st.loss - w.loss).abs() / w.loss, (st.grad_norm - w.norm).abs() / w.norm);
        // The reference's losses are f32 (`Model::loss_and_grads`), the engine's f64.
        assert!(dl < 1e-7 && dn < 1e-12, "step {s}: loss rel Δ {dl:e}, norm rel Δ {dn:e}");
    }
    // A gradient added to a stale buffer, or a norm missing a micro-batch, moves weights by
    // about the learning rate (1e-3); the norm's last bit, by far less than 1e-8.
    let d = max_diff(&m, &ref_model);
    assert!(d < 1e-8, "max |Δ weight| {d:e}");
    assert_eq!(opt.step, ref_opt.step);
}

fn foxlm() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_foxlm"));
    for v in ["RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "FOXLM_LAUNCHED"] {
        c.env_remove(v);
    }
    c
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Runs `c`, expecting failure within a minute; returns stderr.
fn fails_quickly(mut c: Command) -> String {
    let t0 = Instant::now();
    let out = c.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "expected a failure; stderr: {err}");
    assert!(t0.elapsed() < Duration::from_secs(60), "took {:?}: {err}", t0.elapsed());
    err
}

#[test]
fn two_gpus_asked_for_without_two_gpus_is_a_clear_error() {
    if fox_kernels::cuda::probe().is_ok_and(|n| n >= 2) {
        eprintln!("skipped: this machine has two GPUs (foxlm gpu-check --part dist covers them)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut c = foxlm();
    c.args(["train", "--gpus", "2", "--preset", "tiny", "--steps", "1", "--data"]).arg(tmp.path().join("none"));
    c.arg("--out").arg(tmp.path().join("out"));
    let err = fails_quickly(c);
    assert!(
        err.contains("--gpus 2: no GPU can be used here") || err.contains("--gpus 2: this machine has 1 GPU"),
        "{err}"
    );
    // --gpus with a cluster launcher's variables is a contradiction, said as such.
    let mut c = foxlm();
    c.args(["train", "--gpus", "2", "--preset", "tiny"]).env("WORLD_SIZE", "2").env("RANK", "0");
    let err = fails_quickly(c);
    assert!(err.contains("--gpus starts its own ranks"), "{err}");
}

#[test]
fn bench_train_on_two_gpus_without_two_gpus_is_a_clear_error() {
    if fox_kernels::cuda::probe().is_ok_and(|n| n >= 2) {
        eprintln!("skipped: this machine has two GPUs (bench/train_multi.sh measures them)");
        return;
    }
    let mut c = foxlm();
    c.args(["bench", "train", "--gpus", "2", "--preset", "fox-pro-125m"]);
    let err = fails_quickly(c);
    assert!(
        err.contains("--gpus 2: no GPU can be used here") || err.contains("--gpus 2: this machine has 1 GPU"),
        "{err}"
    );
    assert!(!err.contains("== 1 GPU"), "nothing should start: {err}");
    for (args, want) in [
        (&["--gpus", "0"][..], "--gpus 0: give at least 1"),
        (&["--gpus", "2", "--device", "cuda:1"], "--device cuda:1 with --gpus 2: the runs use GPUs 0..2"),
        // Several counts: each checked, the largest sets the GPUs needed.
        (&["--gpus", "2,0"], "--gpus 0: give at least 1"),
        (&["--gpus", "2,4", "--device", "cuda:1"], "--device cuda:1 with --gpus 2,4: the runs use GPUs 0..4"),
    ] {
        let mut c = foxlm();
        c.args(["bench", "train"]).args(args);
        let err = fails_quickly(c);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn a_world_of_two_without_a_peer_ends_within_the_rendezvous_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let (data, out) = (tmp.path().join("none"), tmp.path().join("out"));
    let port = free_port().to_string();
    // Rank 0 waits for rank 1, which never comes.
    let mut c = foxlm();
    c.args(["train", "--preset", "tiny", "--steps", "1", "--rendezvous-timeout", "3", "--data"]).arg(&data);
    c.arg("--out").arg(&out).env("WORLD_SIZE", "2").env("RANK", "0").env("MASTER_PORT", &port);
    let err = fails_quickly(c);
    assert!(err.contains("waited 3s on port") && err.contains("for rank(s) 1 of WORLD_SIZE 2"), "{err}");
    // Rank 1 looks for a rank 0 that is not there.
    let mut c = foxlm();
    c.args(["train", "--preset", "tiny", "--steps", "1", "--rendezvous-timeout", "3", "--data"]).arg(&data);
    c.arg("--out").arg(&out).env("WORLD_SIZE", "2").env("RANK", "1").env("MASTER_PORT", &port);
    let err = fails_quickly(c);
    assert!(err.contains("rank 1 could not reach rank 0 at 127.0.0.1:"), "{err}");
    // A rank outside the world, and the CPU asked for.
    let mut c = foxlm();
    c.args(["train", "--preset", "tiny"]).env("WORLD_SIZE", "2").env("RANK", "2");
    assert!(fails_quickly(c).contains("outside a world of 2 ranks"));
    let mut c = foxlm();
    c.args(["train", "--preset", "tiny", "--device", "cpu"]).env("WORLD_SIZE", "2").env("RANK", "0");
    assert!(fails_quickly(c).contains("--device cpu: a multi-process run"));
}
