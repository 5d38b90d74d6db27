#!/usr/bin/env python3
"""Reference fixtures for DeltaNet and Gated DeltaNet, made with fla's own models.

Builds a tiny `DeltaNetForCausalLM` and a tiny `GatedDeltaNetForCausalLM` from the flash-linear-attention
package (fla.models; the installed one, else fla's source carried in --fla-bundle, see below), sets every
parameter far from its usual initial value, and writes what each computes, in the format of
tests/fixtures/official-fox-tiny/ (what tests/common's matches_reference_fixture reads):

  <out>/<name>/config.json                 fla's config (model_type "delta_net" / "gated_deltanet"),
                                           config.to_dict() as save_pretrained writes it
  <out>/<name>/model.safetensors           f32 weights under fla's names, the MLP's gate_proj and up_proj
                                           concatenated into one gate_proj [2I, d] (foxlm's layout, the FoX
                                           authors' DeltaNet's; fla's GatedMLP keeps them apart)
  <out>/<name>/expected.safetensors        input_ids [2, T] int64, logits [2, T, V] f32 (computed in float64),
                                           per_position_loss [T-1] f32
  <out>/<name>/expected_grads.safetensors  grad.<name>: gradient of the mean next-token cross-entropy,
                                           computed in float64, stored f32 (gate_proj's concatenated as above)
  <out>/<name>/expected.json               loss, greedy tokens, versions, cross-checks, how it was made

The float64 pass. fla's kernels (Triton: the chunked and fused-recurrent delta rule, the short convolution,
RMSNorm, the gated RMSNorm, l2norm) do not run in float64. For the reference, the model's own modules and
layer code run unchanged (projections, reshapes, beta, the decay from a_proj / A_log / dt_bias, the order
of norm and gate, the MLP, the blocks) and only these kernels are replaced, on the reference model's
instances and in the layer modules' namespaces, by plain-PyTorch code written here from their definitions:
  - the delta rule: q, k L2-normalised (x / sqrt(sum x^2 + 1e-6), fla's l2norm) when the layer asks for it,
    S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T, o_t = K^-1/2 S_t^T q_t, step by
    step (`delta_rule_reference`); with use_gate_in_kernel / use_beta_sigmoid_in_kernel (newer fla passes
    a_proj's output, A_log and dt_bias in) it computes g = -exp(A_log) softplus(a + dt_bias) and
    beta = sigmoid(b) itself;
  - ShortConvolution: causal depthwise conv1d (no bias) and SiLU;
  - fla's RMSNorm: x * rsqrt(mean(x^2) + eps) * w; FusedRMSNormGated: that times SiLU(g);
  - fla.modules.mlp's swiglu (the MLP's SiLU(gate) * up, a Triton kernel even unfused).
The pass runs under KeepFloat64, a TorchFunctionMode that makes `.float()` / `.to(float32)` of float64
tensors no-ops (fla's layers upcast with `.float()`) and records any op that still returns float32
(expected.json "float64_pass_float32_ops", expected empty).

Cross-checks recorded in expected.json: fla's own naive recurrences (fla.ops.delta_rule.naive /
fla.ops.gated_delta_rule.naive, float32) against delta_rule_reference on the fixture's layer inputs; and,
on a GPU, the unmodified float32 model (fla's Triton kernels) against the float64 reference: logits, loss
and, where fla's backward runs, the gradients (each in try/except: the error is recorded if it fails).

Greedy: NEW_TOKENS tokens after input_ids[0, :PROMPT_LEN] by argmax of full float64 forwards (no cache).

fla: `import fla` as installed; if that fails, the source tree in --fla-bundle (fla.tar.xz: `git -C
<fla mirror> archive HEAD fla | xz`, and einops' wheel, which fla imports) is unpacked to /tmp and used.
expected.json "fla" records which ran, with its version.

Example (GPU machine): python3 bench/make_deltanet_fixtures.py --out $OUT
"""
import argparse
import json
import math
import os
import sys
import time

import authors_common as ac

HERE = os.path.dirname(os.path.abspath(__file__))
BATCH, SEQ = 2, 72  # > 64: foxlm's chunked delta rule crosses a chunk boundary
PROMPT_LEN, NEW_TOKENS = 30, 12
COMMON = dict(
    vocab_size=48,
    hidden_size=32,
    num_hidden_layers=2,
    num_heads=2,
    conv_size=4,
    use_short_conv=True,
    intermediate_size=32,
    hidden_act="swish",
    norm_eps=1e-6,
    fuse_norm=False,
    fuse_swiglu=False,
    fuse_cross_entropy=False,
    tie_word_embeddings=False,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
    use_cache=True,
)
MODELS = {
    # DeltaNet: 2 heads of 16 (expand_k = expand_v = 1), no output gate (the paper's configuration).
    "deltanet": ("DeltaNetConfig", "DeltaNetForCausalLM", dict(expand_k=1, expand_v=1, use_gate=False, use_beta=True,
                                                                 qk_norm="l2", qk_activation="silu")),
    # Gated DeltaNet: 2 heads, keys of 8, values of 16 (expand_v 2), the output gate.
    "gated_deltanet": ("GatedDeltaNetConfig", "GatedDeltaNetForCausalLM", dict(head_dim=8, expand_v=2, use_gate=True)),
}


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder; files go to <out>/<model>/")
    ap.add_argument("--fla-bundle", default=os.path.join(os.path.dirname(HERE), ".device-bundle", "deltanet"))
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--budget-s", type=float, default=150.0, help="skip the float32 GPU checks after this")
    return ap.parse_args()


def import_fla(bundle):
    try:
        import fla  # noqa: F401
        import fla.models  # noqa: F401

        return "installed fla %s at %s" % (getattr(fla, "__version__", "?"), os.path.dirname(fla.__file__))
    except Exception as e:  # noqa: BLE001
        first = repr(e)
    for m in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
        del sys.modules[m]
    import tarfile
    import zipfile

    site = "/tmp/deltanet_site"
    os.makedirs(site, exist_ok=True)
    with tarfile.open(os.path.join(bundle, "fla.tar.xz")) as t:
        t.extractall(site)
    for w in os.listdir(bundle):
        if w.endswith(".whl"):
            zipfile.ZipFile(os.path.join(bundle, w)).extractall(site)
    sys.path.insert(0, site)
    import fla
    import fla.models  # noqa: F401

    return "carried fla source %s (installed import failed: %s)" % (getattr(fla, "__version__", "?"), first)


def keep_float64(torch):
    """authors_common's KeepFloat64 with the test of `.to` these fixtures were made with: float32 as
    its first positional argument or as dtype= (not, as in the Mamba-2 script, anywhere among them)."""

    def asks_f32(args, kwargs):
        want = kwargs.get("dtype", args[0] if args else None)
        return want is torch.float32

    return ac.keep_float64_mode(torch, asks_f32)


def recurrence(torch, q, v, scale, update):
    """A linear-attention recurrence step by step: S_t = update(S_{t-1}, t) from S_0 = 0 [B, H, K, V],
    o_t = scale S_t^T q_t (scale None: K^-1/2); q [B, T, H, K], v [B, T, H, V]; (o [B, T, H, V], S_T)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    S = q.new_zeros(B, H, K, V)
    out = []
    for t in range(T):
        S = update(S, t)
        out.append(scale * torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    return torch.stack(out, 1), S


def delta_rule_reference(torch, q, k, v, beta, g=None, scale=None, l2=False):
    """The delta rule step by step: q, k [B, T, H, K], v [B, T, H, V], beta and g [B, T, H]; o [B, T, H, V]."""
    if l2:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)

    def update(S, t):
        if g is not None:
            S = S * g[:, t].exp()[..., None, None]
        kt = k[:, t]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhk,bhkv->bhv", kt, S))
        return S + kt[..., None] * u[..., None, :]

    return recurrence(torch, q, v, scale, update)


def patched_kernels(torch, record):
    """Replacements for the layer modules' delta-rule kernels, recording their inputs."""
    import torch.nn.functional as F

    def finish(q, k, v, g, beta, scale, output_final_state, l2, kw):
        if kw.get("use_gate_in_kernel"):
            g = -kw["A_log"].exp() * F.softplus(g + kw["dt_bias"])
        if kw.get("use_beta_sigmoid_in_kernel"):
            beta = beta.sigmoid()
        if kw.get("allow_neg_eigval"):
            beta = beta * 2
        assert kw.get("initial_state") is None and kw.get("cu_seqlens") is None
        record.append(dict(q=q.detach(), k=k.detach(), v=v.detach(), beta=beta.detach(),
                           g=None if g is None else g.detach(), l2=l2))
        o, S = delta_rule_reference(torch, q, k, v, beta, g, scale, l2)
        return o, (S if output_final_state else None)

    def delta_rule(q, k, v, beta=None, scale=None, initial_state=None, output_final_state=False,
                   use_qk_l2norm_in_kernel=False, **kw):
        kw["initial_state"] = initial_state
        return finish(q, k, v, None, beta, scale, output_final_state, use_qk_l2norm_in_kernel, kw)

    def gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None, output_final_state=False,
                         use_qk_l2norm_in_kernel=False, **kw):
        kw["initial_state"] = initial_state
        return finish(q, k, v, g, beta, scale, output_final_state, use_qk_l2norm_in_kernel, kw)

    return delta_rule, gated_delta_rule


def patch_modules(torch, model):
    """Plain-PyTorch forwards for fla's Triton modules on this model's instances; returns what was patched."""
    import types

    import torch.nn.functional as F

    done = {}

    def conv_forward(self, x, *args, **kwargs):
        assert kwargs.get("cache") is None and not kwargs.get("output_final_state")
        w = self.weight
        y = F.conv1d(x.transpose(1, 2), w, self.bias, padding=w.shape[-1] - 1, groups=w.shape[0])[..., : x.shape[1]]
        y = y.transpose(1, 2)
        act = getattr(self, "activation", None)
        if act in ("silu", "swish"):
            y = F.silu(y)
        else:
            assert act is None, act
        return y, None

    def rms(x, w, eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    def rms_forward(self, x, *args, **kwargs):
        assert not args and not kwargs.get("residual") and not kwargs.get("prenorm")
        return rms(x, self.weight, self.eps)

    def gated_forward(self, x, g, *args, **kwargs):
        act = getattr(self, "activation", "swish")
        assert act in ("swish", "silu"), act
        return rms(x, self.weight, self.eps) * F.silu(g)

    for name, m in model.named_modules():
        cls = type(m).__name__
        if cls == "ShortConvolution":
            m.forward = types.MethodType(conv_forward, m)
        elif cls in ("RMSNorm",) and type(m).__module__.startswith("fla"):
            m.forward = types.MethodType(rms_forward, m)
        elif cls in ("FusedRMSNormGated", "FusedRMSNormSwishGate"):
            m.forward = types.MethodType(gated_forward, m)
        else:
            continue
        done[cls] = done.get(cls, 0) + 1
    for name, m in model.named_modules():
        if hasattr(m, "_use_fused_qkv_conv"):
            m._use_fused_qkv_conv = lambda *a, **k: False
            done["no_fused_qkv_conv"] = done.get("no_fused_qkv_conv", 0) + 1
    return done


def set_weights(torch, model, seed):
    """Every parameter far from its usual initial value (seeded), float64."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    with torch.no_grad():
        for name, p in model.named_parameters():
            shape = tuple(p.shape)
            if name.endswith("norm.weight"):
                v = 1 + 0.3 * randn(*shape)
            elif name.endswith("conv1d.weight"):
                v = 0.5 * randn(*shape)
            elif name.endswith("A_log"):
                # A = exp(A_log) spread over [0.3, 3] across heads
                v = torch.linspace(math.log(0.3), math.log(3.0), shape[0], dtype=torch.float64) + 0.1 * randn(*shape)
            elif name.endswith("dt_bias"):
                # softplus(dt_bias) about 0.05..0.5
                v = torch.linspace(-3.0, -0.5, shape[0], dtype=torch.float64) + 0.1 * randn(*shape)
            elif len(shape) == 2:
                v = randn(*shape) / math.sqrt(shape[1])
            else:
                v = randn(*shape)
            p.copy_(v.to(p.dtype))


def foxlm_names(named):
    """fla's tensors with each MLP's gate_proj and up_proj concatenated into gate_proj (foxlm's layout)."""
    out = {}
    for name, t in named.items():
        if name.endswith("mlp.up_proj.weight"):
            continue
        if name.endswith("mlp.gate_proj.weight"):
            up = named.get(name.replace("gate_proj", "up_proj"))
            if up is not None:
                import torch

                t = torch.cat([t, up], 0)
        out[name] = t
    return out


def new_report(torch, name, fla_desc):
    """A fixture's expected.json to fill: its name and the versions of fla, torch and transformers."""
    report = {"name": name, "fla": fla_desc, "torch": torch.__version__}
    try:
        import transformers

        report["transformers"] = transformers.__version__
    except Exception:  # noqa: BLE001
        pass
    return report


def patch_kernel(originals, mod, name, fn):
    """`mod.name` := fn where mod has it, the original kept in `originals` to put back."""
    if hasattr(mod, name):
        originals[(mod, name)] = getattr(mod, name)
        setattr(mod, name, fn)


def float64_reference(torch, model, ids, originals, report, prompt_len, new_tokens):
    """The float64 reference pass of `model`, whose layers' kernels are already replaced (the
    originals in `originals`): fla's MLP swiglu and Triton modules replaced too, then the logits,
    loss and gradients on `ids`, and `new_tokens` greedy tokens after ids[0, :prompt_len] by argmax
    of full float64 forwards, into `report`; returns (logits, per-token loss [B, T-1], gradients)."""
    import torch.nn.functional as F

    import fla.modules.mlp as mlp_mod

    patch_kernel(originals, mlp_mod, "swiglu", lambda gate, up: F.silu(gate) * up)
    report["patched_kernels"] = sorted("%s.%s" % (m.__name__, n) for m, n in originals)
    report["patched_modules"] = patch_modules(torch, model)
    KeepFloat64 = keep_float64(torch)

    def forward64(x):
        with KeepFloat64() as mode:
            out = model(input_ids=x, use_cache=False)
        return out.logits, mode

    model.train()  # fla's GatedDeltaNet asserts chunk mode in training: both paths are patched alike
    logits, mode = forward64(ids)
    report["float64_pass_float32_ops"] = mode.f32_ops
    report["float64_pass_kept_casts"] = mode.kept
    assert logits.dtype is torch.float64, logits.dtype
    lp = F.log_softmax(logits[:, :-1], -1)
    nll = -lp.gather(-1, ids[:, 1:, None])[..., 0]  # [B, T-1]
    loss = nll.mean()
    model.zero_grad()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    report["loss"] = loss.item()

    seq = ids[:1, :prompt_len]
    new = []
    with torch.no_grad():
        for _ in range(new_tokens):
            lg, _ = forward64(seq)
            nxt = int(lg[0, -1].argmax())
            new.append(nxt)
            seq = torch.cat([seq, torch.tensor([[nxt]])], 1)
    report["greedy_prompt_len"] = prompt_len
    report["greedy_new_tokens"] = new
    return logits, nll, grads


def write_fixture(torch, outdir, cfg, state, grads, ids, logits, nll):
    """The fixture's tensors into `outdir`, in float32 under foxlm's names (foxlm_names), and fla's
    config as config.json."""
    from safetensors.torch import save_file

    os.makedirs(outdir, exist_ok=True)
    f32 = lambda d: {n: t.detach().to(torch.float32).contiguous() for n, t in d.items()}  # noqa: E731
    save_file(f32(foxlm_names(state)), os.path.join(outdir, "model.safetensors"))
    save_file(
        {"input_ids": ids.to(torch.int64).contiguous(), "logits": logits.detach().to(torch.float32).contiguous(),
         "per_position_loss": nll.mean(0).detach().to(torch.float32).contiguous()},
        os.path.join(outdir, "expected.safetensors"),
    )
    save_file({"grad." + n: t for n, t in f32(foxlm_names(grads)).items()},
              os.path.join(outdir, "expected_grads.safetensors"))
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(cfg.to_dict(), f, indent=2, sort_keys=True, default=str)


def finish_model(originals, report, outdir, made_by, **made):
    """fla's kernels put back and expected.json written; returns what float32_check needs: `made`
    (cfg, model_cls, state, grads, logits, ids), the report and the folder."""
    for (mod, n), fn in originals.items():
        setattr(mod, n, fn)
    report["made_by"] = made_by
    write_report(report, outdir)
    return dict(made, report=report, outdir=outdir)


def run_model(torch, fla_models, key, args, device, t0, fla_desc):
    cfg_cls, model_cls, extra = MODELS[key]
    cfg = getattr(fla_models, cfg_cls)(**COMMON, **extra)
    report = new_report(torch, key, fla_desc)
    model = getattr(fla_models, model_cls)(cfg).to(torch.float64)
    set_weights(torch, model, args.seed + (0 if key == "deltanet" else 1))
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    report["fla_param_names"] = {n: list(p.shape) for n, p in state.items()}

    g = torch.Generator().manual_seed(args.seed + 100)
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=g)

    # The float64 reference: fla's modules, with its kernels in plain PyTorch.
    import fla.layers.delta_net as dn_mod
    import fla.layers.gated_deltanet as gdn_mod

    record = []
    dr, gdr = patched_kernels(torch, record)
    originals = {}
    for mod, names, fn in [(dn_mod, ("chunk_delta_rule", "fused_recurrent_delta_rule"), dr),
                           (gdn_mod, ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"), gdr)]:
        for n in names:
            patch_kernel(originals, mod, n, fn)
    logits, nll, grads = float64_reference(torch, model, ids, originals, report, PROMPT_LEN, NEW_TOKENS)
    layer_inputs = record[0]  # the first forward's first layer (the greedy forwards record after it)

    outdir = os.path.join(args.out, key)
    write_fixture(torch, outdir, cfg, state, grads, ids, logits, nll)

    # Cross-check 1: fla's own naive recurrence (float32) on the first layer's kernel inputs.
    try:
        x = {k_: (None if v_ is None else v_.to(torch.float32)) for k_, v_ in layer_inputs.items() if k_ != "l2"}
        q, k = x["q"], x["k"]
        if layer_inputs["l2"]:
            q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
            k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        ref, _ = delta_rule_reference(torch, q.double(), k.double(), x["v"].double(), x["beta"].double(),
                                      None if x["g"] is None else x["g"].double())
        if x["g"] is None:
            from fla.ops.delta_rule.naive import delta_rule_recurrence

            t_ = lambda a: a.transpose(1, 2).contiguous()  # noqa: E731
            o, _ = delta_rule_recurrence(t_(q), t_(k), t_(x["v"]), t_(x["beta"]))
            o = o.transpose(1, 2)
            report["fla_naive"] = "fla.ops.delta_rule.naive.delta_rule_recurrence"
        else:
            from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule

            o, _ = naive_recurrent_gated_delta_rule(q, k, x["v"], x["beta"], x["g"])
            report["fla_naive"] = "fla.ops.gated_delta_rule.naive.naive_recurrent_gated_delta_rule"
        report["fla_naive_vs_reference_max_abs"] = (o.double() - ref).abs().max().item()
    except Exception as e:  # noqa: BLE001
        report["fla_naive_error"] = repr(e)

    made_by = "bench/make_deltanet_fixtures.py (seed %d, B=%d, T=%d)" % (args.seed, BATCH, SEQ)
    return finish_model(originals, report, outdir, made_by, cfg=cfg, model_cls=model_cls, state=state, grads=grads,
                        logits=logits.detach(), ids=ids)


SUMMARY = ("loss", "greedy_new_tokens", "fla_naive_vs_reference_max_abs", "float32_triton_logits_max_abs_vs_reference",
           "float32_triton_loss", "float32_triton_grad_rel_err_max", "float32_triton_error",
           "float32_triton_backward_error", "fla_naive_error", "float64_pass_float32_ops", "patched_kernels",
           "patched_modules")


def write_report(report, outdir):
    with open(os.path.join(outdir, "expected.json"), "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    print(report["name"], json.dumps({k_: report.get(k_) for k_ in SUMMARY}, default=str), flush=True)


def float32_check(torch, fla_models, c, device):
    """The unmodified model in float32 with fla's kernels against the float64 reference."""
    import torch.nn.functional as F

    report, state, grads, ids = c["report"], c["state"], c["grads"], c["ids"]
    try:
        m32 = getattr(fla_models, c["model_cls"])(c["cfg"]).to(device=device, dtype=torch.float32)
        m32.load_state_dict({n: t.to(torch.float32) for n, t in state.items()})
        m32.train()
        out32 = m32(input_ids=ids.to(device), use_cache=False).logits
        report["float32_triton_logits_max_abs_vs_reference"] = (out32.double().cpu() - c["logits"]).abs().max().item()
        lp32 = F.log_softmax(out32[:, :-1].float(), -1)
        loss32 = -lp32.gather(-1, ids[:, 1:, None].to(device))[..., 0].mean()
        report["float32_triton_loss"] = loss32.item()
        try:
            loss32.backward()
            rel = {}
            for n, p in m32.named_parameters():
                r = grads[n]
                rel[n] = ((p.grad.double().cpu() - r).norm() / r.norm().clamp_min(1e-30)).item()
            report["float32_triton_grad_rel_err_max"] = max(rel.values())
            report["float32_triton_grad_rel_err"] = rel
        except Exception as e:  # noqa: BLE001
            report["float32_triton_backward_error"] = repr(e)[:500]
    except Exception as e:  # noqa: BLE001
        report["float32_triton_error"] = repr(e)[:500]
    write_report(report, c["outdir"])


def main():
    args = parse_args()
    t0 = time.time()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    fla_desc = import_fla(args.fla_bundle)
    print("fla:", fla_desc, "torch", torch.__version__, "device", device, flush=True)
    import fla.models as fla_models

    made = []
    for key in MODELS:
        try:
            made.append(run_model(torch, fla_models, key, args, device, t0, fla_desc))
        except Exception:  # noqa: BLE001
            import traceback

            traceback.print_exc()
        print("%s done at %.1fs" % (key, time.time() - t0), flush=True)
    for c in made:
        if device == "cuda" and time.time() - t0 < args.budget_s:
            float32_check(torch, fla_models, c, device)
            print("%s float32 check done at %.1fs" % (c["report"]["name"], time.time() - t0), flush=True)


if __name__ == "__main__":
    main()
