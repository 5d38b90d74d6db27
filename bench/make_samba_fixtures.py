#!/usr/bin/env python3
"""Reference fixtures for the paper's Samba baseline, made with the FoX authors' own PyTorch model.

NOT RUN YET: written on a machine without a GPU, PyTorch or the authors' dependencies; it is meant to
be run on the GPU machine (see "Example" below) and its output checked in as
tests/fixtures/official-samba-tiny/samba/ (then crates/foxlm/tests/samba.rs gains a parity test
modelled on tests/mamba2.rs `matches_the_authors_mamba2`).

Builds a tiny `SambaForCausalLM` from an unmodified copy of the authors' package
(github zhixuan-lin/forgetting-transformer, src/forgetting_transformer/model/samba/, MIT licence) in
.device-bundle/authors/src (git-ignored; `git -C <mirror> archive HEAD src LICENSE | tar -x -C
.device-bundle/authors`), sets every parameter far from its usual initial value, and writes what that
model computes, in the format of tests/fixtures/official-mamba2-tiny/:

  <out>/samba/config.json                the authors' SambaConfig (model_type "samba-project_fox") as
                                         save_pretrained writes it (time_step_rank as the number it
                                         resolves "auto" to, intermediate_size = expand * hidden_size)
  <out>/samba/model.safetensors          f32 weights under the authors' tensor names
  <out>/samba/expected.safetensors       input_ids [2, T] int64, logits [2, T, V] f32 (computed in
                                         float64), per_position_loss [T-1] f32
  <out>/samba/expected_grads.safetensors grad.<name>: gradient of the mean next-token cross-entropy,
                                         computed in float64, stored f32
  <out>/samba/expected.json              loss, greedy tokens (no cache), param_names, the independent
                                         oracle's agreement, the float32 cross-check, versions, shims

What the authors' Samba imports, and what this script puts in its place (all here, none in their files):
  1. `fla.models.mamba.modeling_mamba.MambaMixer` (and MambaCache): fla's real file, from the fla
     version the authors' code was written against. fla moved MambaMixer out of that file in commit
     94a96d77 (2025-04-25, "[Mamba] Add attn layer & fix configs"), so the file is taken from its
     parent, eac7a47b (v0.2.1-7): `git -C <fla mirror> archive eac7a47b fla/models/mamba | tar -x -C
     .device-bundle/fla-eac7a47b` (carry that folder). It is loaded as a module of its own
     (configuration_mamba.py and modeling_mamba.py only), not through fla's package __init__.
     mamba_ssm and causal_conv1d are absent, so MambaMixer runs its `slow_forward` (the plain
     recurrence, asserted below).
  2. `fla.modules` pieces, as plain-PyTorch stand-ins with fla's interfaces and formulas:
     RMSNorm (x * rsqrt(mean(x^2) + eps) * w; with `residual` and `prenorm=True`, as SambaBlock calls
     its mlp_norm, it returns (norm(x + residual), x + residual)), RotaryEmbedding (rotate-half, theta
     `base`, inv_freq = base^(-2i/d), positions from seqlen_offset), swiglu_linear
     (F.linear(silu(gate) * y, W, b)); FusedCrossEntropyLoss raises (fuse_cross_entropy is false).
  3. flash_attn is not installed on the GPU machine: `modeling_samba.flash_attn_func` (None there,
     so their Attention raises) is set to `sdpa_window_attention` below: scaled_dot_product_attention
     with an explicit boolean mask that allows key j for query i iff i - window_left <= j <= i, which is
     flash_attn_func(causal=True, window_size=(window_size - 1, 0)) as their Attention calls it (query i
     sees keys i - w < j <= i). Only the unpadded call is used (their SambaModel drops attention_mask).
  4. The float64 reference runs under the KeepFloat64 TorchFunctionMode of authors_common.py (slow_forward
     upcasts A_log, B and the conv output with `.float()`): `.float()` / `.to(float32)` of a float64
     tensor return it unchanged; ops that still return float32 are recorded (expected empty). The same
     model in float32 is compared with it ("float32_vs_reference").

Independent check: `oracle` below recomputes the model from the weights alone in float64 (conv, the
selective scan step by step, windowed RoPE attention with GQA, SwiGLU MLPs), and must agree with the
authors' float64 pass to 1e-9 (logits and gradients).

Not in the fixture: left padding (their SambaModel ignores attention_mask) and cached decoding (their
SambaBlock calls MambaMixer without cache_position, which that fla file's cached branch needs; the
attempt and its error are recorded in expected.json "cached_greedy").

Weights (seeded): embeddings and matrices ~ N(0, 1/fan_in), dt_proj.weight at half that std; norm
weights ~ 1 + 0.3 N(0, 1); conv1d weight and bias ~ N(0, 0.25); dt_proj.bias = softplus^-1 of values
spread over [0.05, 0.5] across channels; A = exp(A_log) per channel spread over [0.3, 3] times
exp(N(0, 0.1^2)) per state; D ~ N(0, 1).

Example (GPU machine; run with carry [".device-bundle/authors", ".device-bundle/fla-eac7a47b"]):
  python3 bench/make_samba_fixtures.py --out $OUT
CPU-only check: python3 bench/make_samba_fixtures.py --device cpu --out /tmp/samba
"""
import argparse
import importlib.util
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
DEFAULT_FLA = os.path.join(ROOT, ".device-bundle", "fla-eac7a47b")
FLA_COMMIT = "eac7a47b0f019fd3d0854bb7a6355ea0183de45d"

# Sizes: hidden 64, 4 layers (Mamba, attention, Mamba, attention); attention 4 heads of 16 with 2 k/v
# heads and a window of 16 (< SEQ, so it binds); Mamba inner 128, state 16, dt rank ceil(64/16) = 4.
CONFIG = dict(
    vocab_size=256,
    hidden_size=64,
    state_size=16,
    num_hidden_layers=4,
    norm_eps=1e-5,
    pad_token_id=None,
    bos_token_id=None,
    eos_token_id=None,
    expand=2,
    conv_kernel=4,
    use_bias=False,
    use_conv_bias=True,
    hidden_act="silu",
    initializer_range=0.02,
    residual_in_fp32=False,
    time_step_rank="auto",
    time_step_scale=1.0,
    time_step_min=0.001,
    time_step_max=0.1,
    time_step_init_scheme="random",
    time_step_floor=1e-4,
    max_position_embeddings=2048,
    attn=dict(num_heads=4, num_kv_heads=2, window_size=16, layers=None),
    attn_hidden_ratio=4,
    mamba_hidden_ratio=3,
    rescale_prenorm_residual=True,
    use_cache=False,
    fuse_norm=False,
    fuse_cross_entropy=False,
    tie_word_embeddings=False,
    rope_base=10000.0,  # a small theta so that RoPE turns visibly within 96 positions
)
BATCH, SEQ = 2, 96
PROMPT_LEN, NEW_TOKENS = 40, 24


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder; files go to <out>/samba/")
    ap.add_argument("--authors-dir", default=DEFAULT_AUTHORS, help="folder holding their src/ (and COMMIT)")
    ap.add_argument("--fla-dir", default=DEFAULT_FLA, help=f"folder holding fla/models/mamba/ at fla {FLA_COMMIT[:8]}")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--seed", type=int, default=20261)
    return ap.parse_args()


# ----------------------------------------------------------------------------------------------------
# Stand-ins (shims 2 and 3)
# ----------------------------------------------------------------------------------------------------
def install_fla_standins(torch, fla_dir):
    import torch.nn.functional as F

    class RMSNorm(torch.nn.Module):
        """fla.modules.RMSNorm's interface in plain PyTorch, residual/prenorm included."""

        def __init__(self, hidden_size, elementwise_affine=True, bias=False, eps=1e-5, **_):
            super().__init__()
            assert elementwise_affine and not bias
            self.hidden_size, self.eps = hidden_size, eps
            self.weight = torch.nn.Parameter(torch.ones(hidden_size))

        def forward(self, x, residual=None, prenorm=False, residual_in_fp32=False):
            if residual is not None:
                x = x + residual
            y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight
            return (y, x) if prenorm else y

    class RotaryEmbedding(torch.nn.Module):
        """fla.modules.RotaryEmbedding's interface (non-interleaved: rotate-half) in plain PyTorch."""

        def __init__(self, dim, base=10000.0, interleaved=False, **_):
            super().__init__()
            assert not interleaved
            self.dim, self.base = dim, base

        def forward(self, q, k, seqlen_offset=0, max_seqlen=None, **_):
            assert isinstance(seqlen_offset, int), "only a common integer offset is modelled"
            t = q.shape[1]
            work = torch.promote_types(q.dtype, torch.float32)
            inv = self.base ** (-torch.arange(0, self.dim, 2, device=q.device, dtype=work) / self.dim)
            pos = torch.arange(seqlen_offset, seqlen_offset + t, device=q.device, dtype=work)
            ang = pos[:, None] * inv[None, :]  # [T, d/2]
            cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]

            def rot(x):
                x1, x2 = x.to(work).chunk(2, -1)
                return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)

            return rot(q), rot(k)

    def swiglu_linear(gate, y, weight, bias=None):
        return F.linear(F.silu(gate) * y, weight, bias)

    class FusedCrossEntropyLoss:  # never used: fuse_cross_entropy=False
        def __init__(self, *a, **k):
            raise RuntimeError("stand-in fla: FusedCrossEntropyLoss is not available")

    FusedLinearCrossEntropyLoss = FusedCrossEntropyLoss

    fla = types.ModuleType("fla")
    fla.__path__ = []
    mods = types.ModuleType("fla.modules")
    mods.RMSNorm, mods.RotaryEmbedding = RMSNorm, RotaryEmbedding
    mods.FusedCrossEntropyLoss, mods.FusedLinearCrossEntropyLoss = FusedCrossEntropyLoss, FusedLinearCrossEntropyLoss
    acts = types.ModuleType("fla.modules.activations")
    acts.swiglu_linear = swiglu_linear
    mods.activations = acts
    models = types.ModuleType("fla.models")
    models.__path__ = []
    mamba_pkg = types.ModuleType("fla.models.mamba")
    mamba_pkg.__path__ = []
    fla.modules, fla.models, models.mamba = mods, models, mamba_pkg
    for name, m in [("fla", fla), ("fla.modules", mods), ("fla.modules.activations", acts),
                    ("fla.models", models), ("fla.models.mamba", mamba_pkg)]:
        sys.modules[name] = m
    # fla's real MambaMixer (shim 1): its two files, loaded as modules of their own.
    base = os.path.join(fla_dir, "fla", "models", "mamba")
    for stem in ["configuration_mamba", "modeling_mamba"]:
        path = os.path.join(base, f"{stem}.py")
        if not os.path.isfile(path):
            raise SystemExit(f"error: {path} not found (git archive {FLA_COMMIT[:8]} fla/models/mamba of fla)")
        full = f"fla.models.mamba.{stem}"
        spec = importlib.util.spec_from_file_location(full, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[full] = mod
        spec.loader.exec_module(mod)
        setattr(mamba_pkg, stem, mod)
    mm = sys.modules["fla.models.mamba.modeling_mamba"]
    assert hasattr(mm, "MambaMixer") and hasattr(mm, "MambaCache"), "this fla file has no MambaMixer"
    assert not mm.is_fast_path_available, "mamba_ssm/causal_conv1d present: this script wants slow_forward"
    return mm


def sdpa_window_attention(q, k, v, causal=True, window_size=(-1, -1), **_):
    """flash_attn_func(q, k, v, causal=True, window_size=(left, 0)) for [B, T, H, D] (equal lengths)."""
    import torch
    import torch.nn.functional as F

    assert causal and window_size[1] in (0, -1)
    t = q.shape[1]
    i = torch.arange(t, device=q.device)[:, None]
    j = torch.arange(t, device=q.device)[None, :]
    allowed = j <= i
    if window_size[0] >= 0:
        allowed = allowed & (i - j <= window_size[0])
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=allowed)
    return o.transpose(1, 2)


def import_authors(authors_dir):
    ac.put_authors_on_path(authors_dir, "model", "samba", "modeling_samba.py")
    try:
        import omegaconf  # noqa: F401
    except ImportError:
        # Their SambaConfig tests `isinstance(attn, DictConfig)`; without omegaconf it is None and
        # isinstance raises. A stand-in class no dict is an instance of keeps their dict path.
        stub = types.ModuleType("omegaconf")

        class DictConfig:  # noqa: D401
            pass

        stub.DictConfig = DictConfig
        stub.OmegaConf = types.SimpleNamespace(to_container=lambda c: c)
        sys.modules["omegaconf"] = stub
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import forgetting_transformer.model.samba.modeling_samba as ms
        from forgetting_transformer.model.samba.configuration_samba import SambaConfig
    return ms, SambaConfig


# ----------------------------------------------------------------------------------------------------
def set_weights(torch, model, seed):
    """Every parameter far from its usual initial value; returns {name: f32 CPU tensor}."""

    def rule(name, shape, randn):
        if name.endswith("norm.weight") or name.endswith("norm_f.weight"):
            v = 1 + 0.3 * randn(*shape)
        elif name.endswith("conv1d.weight") or name.endswith("conv1d.bias"):
            v = 0.5 * randn(*shape)
        elif name.endswith("dt_proj.weight"):
            v = 0.5 * randn(*shape) / math.sqrt(shape[1])
        elif name.endswith("dt_proj.bias"):
            dt = torch.linspace(0.05, 0.5, shape[0], dtype=torch.float64)
            v = dt + torch.log(-torch.expm1(-dt))
        elif name.endswith("A_log"):
            a = torch.linspace(0.3, 3.0, shape[0], dtype=torch.float64)[:, None].expand(shape)
            v = torch.log(a) + 0.1 * randn(*shape)
        elif name.endswith(".D"):
            v = randn(*shape)
        elif len(shape) == 2:  # embeddings and every Linear
            v = randn(*shape) / math.sqrt(shape[1])
        else:
            return None
        return v

    return ac.draw_weights(torch, model, seed, rule)


def oracle(torch, P, cfg, ids):
    """Independent float64 Samba from the weights alone (SPEC section 7): the selective scan step by step."""
    import torch.nn.functional as F

    eps, d = cfg.norm_eps, cfg.hidden_size
    di, n, k_w, r = cfg.intermediate_size, cfg.state_size, cfg.conv_kernel, cfg.time_step_rank
    heads, kv = cfg.attn["num_heads"], cfg.attn["num_kv_heads"] or cfg.attn["num_heads"]
    hd, w = d // heads, cfg.attn["window_size"]

    def rms(x, wt):
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * wt

    def rope(x):  # [B, T, H, hd], rotate-half
        t = x.shape[1]
        inv = cfg.rope_base ** (-torch.arange(0, hd, 2, dtype=torch.float64, device=x.device) / hd)
        ang = torch.arange(t, dtype=torch.float64, device=x.device)[:, None] * inv
        c, s = ang.cos()[None, :, None], ang.sin()[None, :, None]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    h = P["backbone.embeddings.weight"][ids]
    b, t, _ = h.shape
    for li in range(cfg.num_hidden_layers):
        p = lambda s: P[f"backbone.layers.{li}.{s}"]  # noqa: E731
        x = rms(h, p("mixer_norm.weight"))
        if li % 2 == 1:
            q = rope((x @ p("mixer.q_proj.weight").T).view(b, t, heads, hd))
            k = rope((x @ p("mixer.k_proj.weight").T).view(b, t, kv, hd)).repeat_interleave(heads // kv, 2)
            v = (x @ p("mixer.v_proj.weight").T).view(b, t, kv, hd).repeat_interleave(heads // kv, 2)
            s = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(hd)
            i_, j_ = torch.arange(t, device=ids.device)[:, None], torch.arange(t, device=ids.device)[None, :]
            s = s.masked_fill(~((j_ <= i_) & (i_ - j_ < w)), float("-inf"))
            o = torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v).reshape(b, t, d)
            y = o @ p("mixer.o_proj.weight").T
            ratio = cfg.attn_hidden_ratio
        else:
            xz = x @ p("mixer.in_proj.weight").T
            xc, z = xz[..., :di], xz[..., di:]
            cw = p("mixer.conv1d.weight")[:, 0, :]
            xpad = F.pad(xc, (0, 0, k_w - 1, 0))
            u = F.silu(sum(xpad[:, j:j + t] * cw[:, j] for j in range(k_w)) + p("mixer.conv1d.bias"))
            xp = u @ p("mixer.x_proj.weight").T
            dt_low, bm, cm = xp[..., :r], xp[..., r:r + n], xp[..., r + n:]
            delta = F.softplus(dt_low @ p("mixer.dt_proj.weight").T + p("mixer.dt_proj.bias"))
            a = -torch.exp(p("mixer.A_log"))
            st = torch.zeros(b, di, n, dtype=torch.float64, device=ids.device)
            ys = []
            for i in range(t):
                st = torch.exp(delta[:, i, :, None] * a) * st + (delta[:, i] * u[:, i])[..., None] * bm[:, i, None, :]
                ys.append((st * cm[:, i, None, :]).sum(-1) + p("mixer.D") * u[:, i])
            y = (torch.stack(ys, 1) * F.silu(z)) @ p("mixer.out_proj.weight").T
            ratio = cfg.mamba_hidden_ratio
        h = h + y
        gu = rms(h, p("mlp_norm.weight")) @ p("mlp.gate_proj.weight").T
        inter = 256 * ((int(d * ratio * 2 / 3) + 255) // 256)
        assert gu.shape[-1] == 2 * inter
        h = h + (F.silu(gu[..., :inter]) * gu[..., inter:]) @ p("mlp.down_proj.weight").T
    return rms(h, P["backbone.norm_f.weight"]) @ P["lm_head.weight"].T


def main():
    a = parse_args()
    import torch
    import torch.nn.functional as F

    dev = ac.exact_float32_device(torch, a.device)

    fla_mm = install_fla_standins(torch, a.fla_dir)
    ms, SambaConfig = import_authors(a.authors_dir)
    assert ms.MambaMixer is fla_mm.MambaMixer
    flash_before = repr(ms.flash_attn_func)
    ms.flash_attn_func = sdpa_window_attention  # shim 3

    cfg = SambaConfig(**CONFIG)
    torch.manual_seed(a.seed)
    model = ms.SambaForCausalLM(cfg)
    params = set_weights(torch, model, a.seed)
    model.load_state_dict(params, strict=True)
    names = [nm for nm, _ in model.named_parameters()]
    model32 = model.to(dev, torch.float32).eval()
    model64 = ms.SambaForCausalLM(cfg)
    model64.load_state_dict(params, strict=True)
    model64 = model64.to(dev, torch.float64).eval()
    kinds = ["attention" if isinstance(layer.mixer, ms.Attention) else "mamba" for layer in model64.backbone.layers]
    assert kinds == ["mamba", "attention", "mamba", "attention"], kinds

    g = torch.Generator().manual_seed(a.seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=g, dtype=torch.int64).to(dev)
    KeepFloat64 = ac.keep_float64_mode(torch)

    # ---- float64 reference
    mode, logits64, loss64, ppl64, grads64 = ac.reference_pass(torch, F, model64, ids, KeepFloat64)

    # ---- independent oracle
    oracle_diff, oracle_grad_rel = ac.oracle_agreement(
        torch, F, oracle, params, cfg, ids, dev, names, logits64, grads64
    )
    print(f"oracle vs reference: logits {oracle_diff:.3e}, grad max rel {oracle_grad_rel:.3e}", flush=True)

    # ---- the window binds: the same model with a window of SEQ differs after position 16
    for layer in model64.backbone.layers:
        if isinstance(layer.mixer, ms.Attention):
            layer.mixer.window_size = SEQ
    with torch.no_grad(), KeepFloat64():
        wide = model64(input_ids=ids, use_cache=False).logits
    for layer in model64.backbone.layers:
        if isinstance(layer.mixer, ms.Attention):
            layer.mixer.window_size = CONFIG["attn"]["window_size"]
    w = CONFIG["attn"]["window_size"]
    window_effect = {
        "inside_window_max_abs_diff": float((wide[:, :w] - logits64.detach()[:, :w]).abs().max()),
        "past_window_max_abs_diff": float((wide[:, w:] - logits64.detach()[:, w:]).abs().max()),
    }
    print(f"window {w} vs {SEQ}: {window_effect}", flush=True)

    # ---- float32: the same model as is
    logits32, loss32, _, grads32 = ac.loss_and_grads(torch, F, model32, ids)
    grad_rel, cross = ac.float32_vs_reference(names, logits32, loss32, grads32, logits64, loss64, grads64)

    # ---- greedy decoding by full forwards (no cache), and an attempt at their cache
    prompt = ids[:1, :PROMPT_LEN]
    greedy64, gap64 = ac.greedy_nocache(torch, model64, prompt, NEW_TOKENS, KeepFloat64)
    greedy32, _ = ac.greedy_nocache(torch, model32, prompt, NEW_TOKENS)
    try:
        with torch.no_grad():
            model32(input_ids=prompt, use_cache=True)
        cached = "their cached forward ran (not used for the fixture)"
    except Exception as exc:  # noqa: BLE001
        cached = f"{type(exc).__name__}: {exc}"

    assert oracle_diff < 1e-9 and oracle_grad_rel < 1e-9, f"authors' model and the oracle disagree: {oracle_diff}, {oracle_grad_rel}"
    assert window_effect["inside_window_max_abs_diff"] < 1e-12 < window_effect["past_window_max_abs_diff"]

    # ---- write
    outdir = ac.write_fixture_tensors(os.path.join(a.out, "samba"), cfg, params, names, ids, logits64, ppl64, grads64)
    import transformers

    commit = ac.authors_commit(a.authors_dir)
    expected = {
        "loss": float(loss64),
        "greedy_prompt_len": PROMPT_LEN,
        "greedy_new_tokens": greedy64,
        "greedy_min_top1_top2_gap": gap64,
        "greedy_new_tokens_float32": greedy32,
        "cached_greedy": cached,
        "max_abs_logit": float(logits64.abs().max()),
        "logits_rms": float(logits64.pow(2).mean().sqrt()),
        "layer_kinds": kinds,
        "oracle_logits_max_abs_diff": oracle_diff,
        "oracle_grad_max_rel_err": oracle_grad_rel,
        "window_effect": window_effect,
        "float32_vs_reference": cross,
        "float32_grad_rel_err": grad_rel,
        "float64_pass_kept_casts": mode.kept,
        "float64_pass_float32_ops": mode.f32_ops,
        "flash_attn_func_original": flash_before,
        "shims": [
            f"fla MambaMixer/MambaCache: fla's own fla/models/mamba files at {FLA_COMMIT} (slow_forward)",
            "fla.modules RMSNorm, RotaryEmbedding, swiglu_linear: plain-PyTorch stand-ins with fla's formulas",
            "flash_attn_func: scaled_dot_product_attention with the window mask i - (window_size - 1) <= j <= i",
            "float64 reference under KeepFloat64 (.float() of float64 kept float64)",
        ],
        "param_names": {nm: list(params[nm].shape) for nm in names},
        "authors_commit": commit,
        "fla_commit": FLA_COMMIT,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": str(dev),
        "made_by": "bench/make_samba_fixtures.py",
        "seed": a.seed,
    }
    with open(os.path.join(outdir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print(f"wrote {outdir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
