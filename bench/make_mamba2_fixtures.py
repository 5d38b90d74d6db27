#!/usr/bin/env python3
"""Reference fixtures for the paper's Mamba-2 baseline, made with the FoX authors' own PyTorch model.

Builds a tiny `Mamba2ForCausalLM` from an unmodified copy of the authors' package
(github zhixuan-lin/forgetting-transformer, src/forgetting_transformer/model/mamba2/, MIT licence) in
.device-bundle/authors/src (git-ignored; `git -C <mirror> archive HEAD src LICENSE | tar -x -C
.device-bundle/authors`; carry it to the GPU machine), sets every parameter far from its usual initial
value, and writes what that model computes, in the format of tests/fixtures/official-fox-tiny/:

  <out>/mamba2/config.json                the authors' Mamba2Config (model_type "mamba2-project_fox"),
                                          as save_pretrained writes it (transformers 5.17 writes time_step_limit's
                                          inf as {"__float__": "Infinity"})
  <out>/mamba2/model.safetensors          f32 weights under the authors' tensor names
  <out>/mamba2/expected.safetensors       input_ids [2, T] int64, logits [2, T, V] f32 (computed in
                                          float64), per_position_loss [T-1] f32
  <out>/mamba2/expected_grads.safetensors grad.<name>: gradient of the mean next-token cross-entropy,
                                          computed in float64, stored f32
  <out>/mamba2/expected.json              loss, greedy tokens (no cache, and through the authors' cache),
                                          param_names, dt range, versions, cross-checks, how it was made

The model path used is the authors' pure-PyTorch `Mamba2Mixer.torch_forward` (the SSD "naive" form),
which is what their model runs when mamba_ssm's / causal_conv1d's CUDA kernels are absent (they are
absent on the GPU machine). chunk_size is the paper's 256, larger than every length used (T = 96, the
prompt 40..63), so that torch_forward runs one chunk: its inter-chunk state passing is wrong (see
CHUNK_BUG below; huggingface/transformers #34817, fixed there in #35154 after the authors copied the
file). The script shows that bug on the same weights with chunk_size 32, and checks the fixture against
an independent step-by-step recurrence written here (sequential_oracle: logits and gradients agree to
~1e-15 in float64). A correct chunked implementation gives the same numbers for any chunk size.

Shims and patches (all here, none in their files):
  1. `RMSNormGated` (mamba_ssm.ops.triton.layernorm_gated.RMSNorm): the authors import it inside a
     try block together with mamba_ssm's CUDA kernels; without mamba_ssm it is None and the model cannot
     be built. We set `modeling_mamba2.RMSNormGated` to `GatedRMSNormRef` below: a plain-PyTorch
     module of our own with the same parameter (`weight`, ones; no bias) and the same call
     (`norm(x, z)`). The authors build it with
     norm_before_gate=False and group_size = intermediate_size // n_groups, i.e.
     y = rmsnorm(x * silu(z)) * weight, normalised over each group of the inner width.
  2. `fla.modules` (RMSNorm, FusedCrossEntropyLoss): the authors import it at module level. On the GPU
     the real package is used (wheel fla-core, carried in .device-bundle/wheels, installed into
     PYTHONPATH); if it cannot be imported (or on a CPU-only check) a stand-in module is put in
     sys.modules with `TorchRMSNorm` (y = x * rsqrt(mean(x^2) + eps) * weight, the same formula) and a
     FusedCrossEntropyLoss that raises (config fuse_cross_entropy=false, so it is never used). Which
     one ran is recorded in expected.json ("fla").
  3. The float64 reference pass. The authors' code forces float32 in places (`.float()` on x, B, C and
     A_log in torch_forward; `residual.to(torch.float32)` in Mamba2Block when residual_in_fp32) and fla's
     RMSNorm is a Triton kernel that computes in float32. For the reference we build a second copy of
     the model whose plain RMSNorms are `TorchRMSNorm` (same formula, any dtype), convert it to float64,
     and run it under `KeepFloat64`, a TorchFunctionMode that makes `.float()` and `.to(torch.float32)`
     return a float64 tensor unchanged, so that the whole pass stays in float64. It also records any op
     that still returns a float32 tensor (expected.json "float64_pass_float32_ops", expected empty).
     Nothing else changes: in float32 these casts are no-ops. The unpatched float32 model (real fla
     RMSNorm on the GPU, shim 1 only) is run too and compared with the reference (expected.json
     "float32_vs_reference").
  4. dt clamp. torch_forward computes dt = clamp(softplus(dt_raw + dt_bias), min=time_step_min), while
     the CUDA path they trained with (mamba_chunk_scan_combined with dt_limit (0, inf)) does not clamp.
     We do NOT patch this: the weights are chosen so that no dt comes near time_step_min (0.001), and
     forward pre-hooks on every mixer recompute softplus(dt_raw + dt_bias) in every pass (reference,
     float32, both greedy decodings) and assert that its minimum stays above time_step_min, so the clamp
     is a no-op and the fixture holds for unclamped dt too. The minimum is recorded ("dt_min").

Weights (seeded): embeddings and matrices ~ N(0, 1/fan_in) (the dt rows of in_proj ~ N(0, 0.25/fan_in));
norm weights (block norms, mixer gated norm, norm_f) ~ 1 + 0.3 N(0, 1); conv1d weight ~ N(0, 0.25) and
bias ~ N(0, 0.25); dt_bias per head spread over [-3, -0.5] plus N(0, 0.1^2) noise (softplus 0.05..0.47);
A = exp(A_log) per head spread over [0.3, 3] (times exp(N(0, 0.1^2))); D ~ N(0, 1). With these, dt over
every pass lies in [0.0062, 1.04] (so the clamp at 0.001 never acts); with A per head from about 0.3 to
3, the per-token log-decay dt*A spans long- and short-memory heads.

Greedy decoding: 24 tokens after input_ids[0, :40] by argmax of full forwards without a cache (float64
reference, and float32); and through the authors' cache (Mamba2Cache, their torch_forward decode branch,
float32), by calling their forward step by step (batch 1: their torch decode branch multiplies a
[B, 1, inner] output by a [B, inner] gate, which broadcasts wrongly for B > 1). HF `generate` is tried
as well and its result or error recorded.

Example (GPU machine; run with carry [".device-bundle/authors", ".device-bundle/wheels"]):
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
      .device-bundle/wheels/fla_core-0.6.0-py3-none-any.whl
  PYTHONPATH=/tmp/site python3 bench/make_mamba2_fixtures.py --out $OUT
CPU-only check (fla stand-in, float32 pass on CPU): python3 bench/make_mamba2_fixtures.py --device cpu --out /tmp/m2
"""
import argparse
import json
import math
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import authors_common as ac  # noqa: E402
ROOT = os.path.dirname(HERE)
DEFAULT_AUTHORS = os.path.join(ROOT, ".device-bundle", "authors")

# Sizes. hidden 64, expand 2 -> inner 128 = num_heads 4 x head_dim 32; state 16; one group of B/C.
CONFIG = dict(
    num_heads=4,
    head_dim=32,
    vocab_size=256,
    hidden_size=64,
    state_size=16,
    num_hidden_layers=2,
    layer_norm_epsilon=1e-5,
    pad_token_id=None,
    bos_token_id=None,
    eos_token_id=None,
    expand=2,
    conv_kernel=4,
    n_groups=1,
    use_bias=False,
    use_conv_bias=True,
    hidden_act="silu",
    initializer_range=0.02,
    residual_in_fp32=True,
    time_step_rank="auto",
    time_step_min=0.001,
    time_step_max=0.1,
    time_step_floor=1e-4,
    time_step_limit=(0.0, float("inf")),
    rescale_prenorm_residual=True,
    use_cache=True,
    rms_norm=True,
    chunk_size=256,  # the paper's; > SEQ, see CHUNK_BUG below
    fuse_cross_entropy=False,
    tie_word_embeddings=False,
)
BATCH, SEQ = 2, 96
PROMPT_LEN, NEW_TOKENS = 40, 24
# torch_forward's inter-chunk state passing sums over the wrong axis (`.sum(dim=2)`, the target chunk,
# instead of dim=3, the source chunk): huggingface/transformers issue #34817, fixed there in PR #35154,
# after the authors copied the file. With 2+ chunks its outputs are wrong and not even causal (the factor
# that replaces the state passing depends on the whole chunk, padding included). With one chunk
# (seq_len <= chunk_size) the code is exact. So the fixture uses chunk_size 256 > every length used, and
# the script shows the bug by re-running the float64 model with this chunk size (expected.json
# "authors_torch_forward_multichunk_bug").
CHUNK_BUG = 32


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder; files go to <out>/mamba2/")
    ap.add_argument("--authors-dir", default=DEFAULT_AUTHORS, help="folder holding their src/ (and COMMIT)")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--seed", type=int, default=20260)
    return ap.parse_args()


# ----------------------------------------------------------------------------------------------------
# Shims
# ----------------------------------------------------------------------------------------------------
def make_shims(torch):
    import torch.nn.functional as F

    class GatedRMSNormRef(torch.nn.Module):
        """The interface of mamba_ssm's gated RMSNorm (weight of ones, no bias, `norm(x, z)`), written
        here in plain PyTorch for what the authors build (norm_before_gate=False):
        y = rmsnorm(x * silu(z)) * weight, the norm taken over each group of `group_size` channels, in
        at least float32."""

        def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=True, device=None, dtype=None):
            super().__init__()
            assert not norm_before_gate, "only the authors' norm_before_gate=False is modelled"
            self.eps = eps
            self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
            self.register_parameter("bias", None)
            self.group_size = group_size or hidden_size

        def forward(self, x, z=None):
            work = torch.promote_types(x.dtype, torch.float32)
            h = x.to(work)
            if z is not None:
                h = h * F.silu(z.to(work))
            groups = h.unflatten(-1, (-1, self.group_size))
            inv = torch.rsqrt(groups.pow(2).mean(-1, keepdim=True) + self.eps)
            return ((groups * inv).flatten(-2) * self.weight.to(work)).to(x.dtype)

    class TorchRMSNorm(torch.nn.Module):
        """fla.modules.RMSNorm's interface (weight, eps) in plain PyTorch: x * rsqrt(mean(x^2) + eps) * w."""

        def __init__(self, hidden_size, elementwise_affine=True, bias=False, eps=1e-5, device=None, dtype=None):
            super().__init__()
            assert elementwise_affine and not bias
            self.hidden_size = hidden_size
            self.eps = eps
            self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))

        def forward(self, x, residual=None, prenorm=False, residual_in_fp32=False):
            assert residual is None and not prenorm
            return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight

    return GatedRMSNormRef, TorchRMSNorm


def import_fla(use_real, TorchRMSNorm):
    """The real fla.modules if wanted and importable, else a stand-in; returns a description."""
    if use_real:
        try:
            import torch

            import fla
            import fla.modules

            # smoke test of its Triton RMSNorm (forward and backward) against the formula
            norm = fla.modules.RMSNorm(64, eps=1e-5).cuda()
            with torch.no_grad():
                norm.weight.copy_(1 + 0.3 * torch.randn(64))
            x = torch.randn(5, 7, 64, device="cuda", requires_grad=True)
            y = norm(x)
            (gx,) = torch.autograd.grad(y.square().sum(), [x])
            xr = x.detach().double().requires_grad_()
            yr = xr * torch.rsqrt(xr.square().mean(-1, keepdim=True) + 1e-5) * norm.weight.double()
            (gr,) = torch.autograd.grad(yr.square().sum(), [xr])
            diff = max(float((y.double() - yr).abs().max()), float((gx.double() - gr).abs().max() / gr.abs().max()))
            assert diff < 1e-4, f"fla RMSNorm differs from x*rsqrt(mean(x^2)+eps)*w by {diff}"
            return {"real": True, "version": getattr(fla, "__version__", "?"), "file": fla.__file__,
                    "rmsnorm_smoke_test_max_err": diff}
        except Exception as exc:  # noqa: BLE001
            err = f"{type(exc).__name__}: {exc}"
            for k in [k for k in sys.modules if k == "fla" or k.startswith("fla.")]:
                del sys.modules[k]
    else:
        err = "not tried (no GPU)"

    class FusedCrossEntropyLoss:  # never used: fuse_cross_entropy=False
        def __init__(self, *a, **k):
            raise RuntimeError("stand-in fla: FusedCrossEntropyLoss is not available")

    fla_mod = types.ModuleType("fla")
    mods = types.ModuleType("fla.modules")
    mods.RMSNorm = TorchRMSNorm
    mods.FusedCrossEntropyLoss = FusedCrossEntropyLoss
    fla_mod.modules = mods
    sys.modules["fla"] = fla_mod
    sys.modules["fla.modules"] = mods
    return {"real": False, "stand_in": "TorchRMSNorm", "import_error": err}


def import_authors(authors_dir):
    ac.put_authors_on_path(authors_dir, "model", "mamba2", "modeling_mamba2.py")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import forgetting_transformer.model.mamba2.modeling_mamba2 as mm
        from forgetting_transformer.model.mamba2.configuration_mamba2 import Mamba2Config
    return mm, Mamba2Config


# ----------------------------------------------------------------------------------------------------
def set_weights(torch, model, cfg, seed):
    """Every parameter far from its usual initial value; returns {name: f32 CPU tensor}."""
    H, inner = cfg.num_heads, cfg.expand * cfg.hidden_size

    def rule(name, shape, randn):
        if name.endswith("norm.weight") or name.endswith("norm_f.weight"):
            v = 1 + 0.3 * randn(*shape)
        elif name.endswith("embeddings.weight"):
            v = randn(*shape) / math.sqrt(shape[1])
        elif name.endswith("in_proj.weight"):
            v = randn(*shape) / math.sqrt(shape[1])
            v[-H:] *= 0.5  # the dt rows: dt_raw ~ N(0, ~0.5^2)
        elif name.endswith("conv1d.weight"):
            v = 0.5 * randn(*shape)
        elif name.endswith("conv1d.bias"):
            v = 0.5 * randn(*shape)
        elif name.endswith("dt_bias"):
            v = torch.linspace(-3.0, -0.5, H, dtype=torch.float64) + 0.1 * randn(H)
        elif name.endswith("A_log"):
            v = torch.log(torch.linspace(0.3, 3.0, H, dtype=torch.float64)) + 0.1 * randn(H)
        elif name.endswith(".D"):
            v = randn(*shape)
        elif name.endswith("out_proj.weight") or name == "lm_head.weight":
            v = randn(*shape) / math.sqrt(shape[1])
        else:
            return None
        return v

    out = ac.draw_weights(torch, model, seed, rule)
    assert inner == H * cfg.head_dim
    return out


def sequential_oracle(torch, params, cfg, ids):
    """Independent float64 step-by-step Mamba-2 (SPEC section 7), unclamped dt, from the weights alone."""
    import torch.nn.functional as F

    P = params  # float64 tensors on ids' device
    H, hd, N, G = cfg.num_heads, cfg.head_dim, cfg.state_size, cfg.n_groups
    inner, K, eps = cfg.expand * cfg.hidden_size, cfg.conv_kernel, cfg.layer_norm_epsilon

    def rms(x, w):
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * w

    h = P["backbone.embeddings.weight"][ids]  # [B, T, D]
    Bsz, T, _ = h.shape
    for i in range(cfg.num_hidden_layers):
        p = lambda n: P[f"backbone.layers.{i}.{n}"]  # noqa: E731
        proj = rms(h, p("norm.weight")) @ p("mixer.in_proj.weight").T
        z, xbc, dt_raw = proj.split([inner, inner + 2 * G * N, H], -1)
        w = p("mixer.conv1d.weight")[:, 0, :]  # [C, K]; w[:, K-1] multiplies the current step
        xpad = F.pad(xbc, (0, 0, K - 1, 0))
        xbc = F.silu(sum(xpad[:, k:k + T] * w[:, k] for k in range(K)) + p("mixer.conv1d.bias"))
        x, Bm, Cm = xbc.split([inner, G * N, G * N], -1)
        x = x.view(Bsz, T, H, hd)
        Bm = Bm.view(Bsz, T, G, N).repeat_interleave(H // G, 2)
        Cm = Cm.view(Bsz, T, G, N).repeat_interleave(H // G, 2)
        dt = F.softplus(dt_raw + p("mixer.dt_bias"))  # [B, T, H], no clamp
        A = -torch.exp(p("mixer.A_log"))
        S = torch.zeros(Bsz, H, hd, N, dtype=torch.float64, device=ids.device)
        ys = []
        for t in range(T):
            S = torch.exp(dt[:, t] * A)[..., None, None] * S + (dt[:, t, :, None] * x[:, t])[..., None] * Bm[:, t, :, None, :]
            ys.append((S * Cm[:, t, :, None, :]).sum(-1) + p("mixer.D")[:, None] * x[:, t])
        y = torch.stack(ys, 1).reshape(Bsz, T, inner) * F.silu(z)
        gs = inner // G
        yg = y.view(Bsz, T, G, gs)
        y = (yg * torch.rsqrt(yg.square().mean(-1, keepdim=True) + eps)).view(Bsz, T, inner) * p("mixer.norm.weight")
        h = h + y @ p("mixer.out_proj.weight").T
    return rms(h, P["backbone.norm_f.weight"]) @ P["lm_head.weight"].T


def main():
    a = parse_args()
    import torch
    import torch.nn.functional as F

    dev = ac.exact_float32_device(torch, a.device)

    GatedRMSNormRef, TorchRMSNorm = make_shims(torch)
    fla_info = import_fla(dev.type == "cuda", TorchRMSNorm)
    mm, Mamba2Config = import_authors(a.authors_dir)
    original_gated = mm.RMSNormGated
    assert not mm.is_fast_path_available, "mamba_ssm/causal_conv1d present: this script wants torch_forward"
    mm.RMSNormGated = GatedRMSNormRef  # shim 1
    print(f"fla: {fla_info}; modeling_mamba2.RMSNormGated was {original_gated!r}, now GatedRMSNormRef", flush=True)

    cfg = Mamba2Config(**CONFIG)
    torch.manual_seed(a.seed)
    model32 = mm.Mamba2ForCausalLM(cfg)
    params = set_weights(torch, model32, cfg, a.seed)
    model32.load_state_dict(params, strict=True)
    model32 = model32.to(dev, torch.float32).eval()

    # The float64 reference model: plain RMSNorms in PyTorch (shim 3), then float64.
    real_rmsnorm = mm.RMSNorm
    mm.RMSNorm = TorchRMSNorm
    try:
        model64 = mm.Mamba2ForCausalLM(cfg)
    finally:
        mm.RMSNorm = real_rmsnorm
    model64.load_state_dict(params, strict=True)
    model64 = model64.to(dev, torch.float64).eval()
    names = [n for n, _ in model32.named_parameters()]
    assert names == [n for n, _ in model64.named_parameters()] == list(params)

    # dt watch (shim 4's assertion): softplus(dt_raw + dt_bias) for every mixer call, per pass.
    dt_stats = {}
    current = {"pass": None}

    def dt_hook(mixer, inputs):
        x = inputs[0]
        with torch.no_grad():
            proj = F.linear(x, mixer.in_proj.weight, mixer.in_proj.bias)
            dt = F.softplus(proj[..., -mixer.num_heads:] + mixer.dt_bias)
        s = dt_stats.setdefault(current["pass"], {"min": math.inf, "max": -math.inf})
        s["min"] = min(s["min"], float(dt.min()))
        s["max"] = max(s["max"], float(dt.max()))

    for m in (model32, model64):
        for layer in m.backbone.layers:
            layer.mixer.register_forward_pre_hook(dt_hook)

    g = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=g, dtype=torch.int64).to(dev)
    KeepFloat64 = ac.keep_float64_mode(torch)

    # ---- float64 reference: logits, loss, gradients
    current["pass"] = "reference_float64"
    mode, logits64, loss64, ppl64, grads64 = ac.reference_pass(torch, F, model64, ids, KeepFloat64)

    # ---- independent check: sequential recurrence (no chunks, no clamp) in float64
    oracle_diff, oracle_grad_rel = ac.oracle_agreement(
        torch, F, sequential_oracle, params, cfg, ids, dev, names, logits64, grads64
    )
    print(f"sequential oracle vs reference: logits max abs diff {oracle_diff:.3e}, "
          f"grad max rel err {oracle_grad_rel:.3e}", flush=True)

    # ---- the authors' torch_forward with several chunks (the HF #34817 bug), same float64 model
    current["pass"] = "multichunk_demo"
    for layer in model64.backbone.layers:
        layer.mixer.chunk_size = CHUNK_BUG
    with torch.no_grad(), KeepFloat64():
        logits_mc = model64(input_ids=ids, use_cache=False).logits
        logits_mc_prefix = model64(input_ids=ids[:, :48], use_cache=False).logits
    for layer in model64.backbone.layers:
        layer.mixer.chunk_size = cfg.chunk_size
    first_bad = (logits_mc - logits64.detach()).abs().amax((0, 2)) > 1e-9
    chunk_bug = {
        "chunk_size": CHUNK_BUG,
        "logits_max_abs_diff_vs_reference": float((logits_mc - logits64.detach()).abs().max()),
        "first_position_that_differs": int(first_bad.nonzero()[0]) if bool(first_bad.any()) else None,
        "first_chunk_max_abs_diff": float((logits_mc[:, :CHUNK_BUG] - logits64.detach()[:, :CHUNK_BUG]).abs().max()),
        "noncausal_positions_32_47_T48_vs_T96_max_abs_diff":
            float((logits_mc_prefix[:, 32:48] - logits_mc[:, 32:48]).abs().max()),
    }
    print(f"authors' torch_forward with chunk_size {CHUNK_BUG}: {chunk_bug}", flush=True)

    # ---- float32: the authors' model as is (real fla RMSNorm on the GPU)
    current["pass"] = "float32"
    logits32, loss32, _, grads32 = ac.loss_and_grads(torch, F, model32, ids)
    # their own loss path: labels are used as given (their shift is commented out), so pre-shift
    labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], 1)
    with torch.no_grad():
        their = model32(input_ids=ids, labels=labels, use_cache=False).loss  # [B, T], 0 where ignored
        their_loss = float(their[:, :-1].mean())
    grad_rel, cross = ac.float32_vs_reference(
        names, logits32, loss32, grads32, logits64, loss64, grads64,
        their_labels_loss_abs_diff=abs(their_loss - float(loss64)),
    )

    # ---- greedy decoding
    prompt = ids[:1, :PROMPT_LEN]
    current["pass"] = "greedy_nocache_float64"
    greedy64, gap64 = ac.greedy_nocache(torch, model64, prompt, NEW_TOKENS, KeepFloat64)
    current["pass"] = "greedy_nocache_float32"
    greedy32, _ = ac.greedy_nocache(torch, model32, prompt, NEW_TOKENS)

    @torch.no_grad()
    def greedy_cached(model):
        """Their cache API by hand: prefill with use_cache=True, then one token at a time."""
        current["pass"] = "greedy_cached_float32"
        out = model(input_ids=prompt, use_cache=True)
        cache, toks = out.cache_params, []
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        for i in range(NEW_TOKENS):
            toks.append(int(nxt))
            if i == NEW_TOKENS - 1:
                break
            pos = torch.tensor([PROMPT_LEN + i], device=dev)
            out = model(input_ids=nxt, cache_params=cache, use_cache=True, cache_position=pos)
            cache = out.cache_params
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        return toks

    try:
        cached = greedy_cached(model32)
    except Exception as exc:  # noqa: BLE001
        cached = f"failed: {type(exc).__name__}: {exc}"
    try:
        current["pass"] = "hf_generate_float32"
        gen = model32.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                               do_sample=False, use_cache=True)
        hf_generate = gen[0, PROMPT_LEN:].tolist()
    except Exception as exc:  # noqa: BLE001
        hf_generate = f"failed: {type(exc).__name__}: {str(exc)[:300]}"
    print(f"greedy float64 {greedy64}\ngreedy float32 {greedy32}\ncached {cached}\nhf generate {hf_generate}",
          flush=True)

    # ---- dt assertion (the clamp at time_step_min never acts)
    dt_min = min(s["min"] for s in dt_stats.values())
    dt_max = max(s["max"] for s in dt_stats.values())
    print(f"dt per pass: {dt_stats}", flush=True)
    assert dt_min > cfg.time_step_min, f"dt {dt_min} reaches time_step_min {cfg.time_step_min}: the clamp acts"
    assert oracle_diff < 1e-9 and oracle_grad_rel < 1e-9, f"authors' model and the recurrence disagree: {oracle_diff}, {oracle_grad_rel}"

    # ---- write
    outdir = ac.write_fixture_tensors(os.path.join(a.out, "mamba2"), cfg, params, names, ids, logits64, ppl64, grads64)
    import transformers

    commit = ac.authors_commit(a.authors_dir)
    expected = {
        "loss": float(loss64),
        "greedy_prompt_len": PROMPT_LEN,
        "greedy_new_tokens": greedy64,
        "greedy_min_top1_top2_gap": gap64,
        "greedy_new_tokens_float32": greedy32,
        "cached_greedy_new_tokens": cached,
        "hf_generate_cached": hf_generate,
        "max_abs_logit": float(logits64.abs().max()),
        "logits_rms": float(logits64.pow(2).mean().sqrt()),
        "dt_min": dt_min,
        "dt_max": dt_max,
        "dt_by_pass": dt_stats,
        "time_step_min": cfg.time_step_min,
        "dt_clamp": "not patched; every dt stays above time_step_min (asserted), so torch_forward's "
                    "clamp(dt, time_step_min) never acts and the fixture equals unclamped softplus(dt_raw + dt_bias)",
        "sequential_oracle_logits_max_abs_diff": oracle_diff,
        "sequential_oracle_grad_max_rel_err": oracle_grad_rel,
        "authors_torch_forward_multichunk_bug": chunk_bug,
        "float32_vs_reference": cross,
        "float32_grad_rel_err": grad_rel,
        "float64_pass_kept_casts": mode.kept,
        "float64_pass_float32_ops": mode.f32_ops,
        "fla": fla_info,
        "mamba_ssm_RMSNormGated_original": repr(original_gated),
        "shims": [
            "modeling_mamba2.RMSNormGated := a plain-PyTorch gated RMSNorm of this script's own (GatedRMSNormRef) "
            "(weight only); norm_before_gate=False, group_size=intermediate_size//n_groups as the authors build it",
            "fla.modules.RMSNorm: real fla-core in the float32 pass when importable (see 'fla'); the float64 "
            "reference uses a plain-PyTorch RMSNorm with the same formula",
            "float64 reference under a TorchFunctionMode that keeps .float()/.to(float32) of float64 tensors "
            "in float64 (the authors' torch_forward upcasts with .float(); Mamba2Block casts the residual "
            "to float32)",
        ],
        "made_by": "bench/make_mamba2_fixtures.py (pip install --target /tmp/site fla_core-0.6.0 wheel; "
                   "PYTHONPATH=/tmp/site python3 bench/make_mamba2_fixtures.py --out $OUT) on "
                   + (torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu")
                   + "; authors' model path Mamba2Mixer.torch_forward (mamba_ssm and causal_conv1d absent)",
        "authors_commit": commit,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "seed": a.seed,
        "param_names": {n: list(params[n].shape) for n in names},
    }
    with open(os.path.join(outdir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print(f"wrote {sorted(os.listdir(outdir))} to {outdir}", flush=True)
    if mode.f32_ops:
        print(f"WARNING: float32 ops in the float64 pass: {mode.f32_ops}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
