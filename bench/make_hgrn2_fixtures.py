#!/usr/bin/env python3
"""Reference fixtures for HGRN2, made with fla's own model.

Builds a tiny `HGRN2ForCausalLM` from the flash-linear-attention package (fla.models; the installed one,
else fla's source carried in --fla-bundle), sets every parameter far from its usual initial value, and
writes what it computes in the format of tests/fixtures/fla-deltanet-tiny/ (see make_deltanet_fixtures.py,
whose helpers this script imports: fla's import, the weights' draw, the kernel patching, the float64 pass
and greedy tokens (the float64 mode, the plain-PyTorch RMSNorm and swiglu), the recurrence's step loop, the
fused MLP naming, the files, the report and the float32 check):

  <out>/hgrn2/config.json                 fla's HGRN2Config.to_dict() (model_type "hgrn2")
  <out>/hgrn2/model.safetensors           f32 weights under fla's names (model.lower_bounds among them), each
                                          MLP's gate_proj and up_proj concatenated into one gate_proj [2I, d]
  <out>/hgrn2/expected.safetensors        input_ids [2, T] int64, logits [2, T, V] f32 (computed in float64),
                                          per_position_loss [T-1] f32
  <out>/hgrn2/expected_grads.safetensors  grad.<name>: gradient of the mean next-token cross-entropy (float64,
                                          stored f32)
  <out>/hgrn2/expected.json               loss, greedy tokens, versions, cross-checks, how it was made

The float64 pass runs fla's model and layer code unchanged (q = swish(q_proj(x)), g = logsigmoid(f_proj(x)),
the model's lower bounds (softmax over layers, cumulative sum less the first row) mixed in by logaddexp for
layers > 0, k = 1 - exp(g), the head split, the blocks, the MLP) with only fla's Triton kernels replaced, in
the layer modules' namespaces, by plain PyTorch written here from their definitions:
  - chunk_gla / fused_recurrent_gla / fused_chunk_gla: gated linear attention step by step,
    S_t = Diag(exp(g_t)) S_{t-1} + k_t v_t^T, o_t = K^-1/2 S_t^T q_t (`gla_reference`);
  - rms_norm_linear (the output norm and o_proj in one): x * rsqrt(mean(x^2) + eps) * w then the Linear,
    with the eps the layer passes (none: the function's default, 1e-5; not the config's norm_eps);
  - swish (q's activation, a Triton kernel in fla.modules.activations): x * sigmoid(x);
  - fla's RMSNorm modules and the MLP's swiglu (make_deltanet_fixtures.patch_modules and the same swiglu).
Cross-checks in expected.json: fla.ops.gla.naive.naive_recurrent_gla (float32) against gla_reference on the
first recurrent layer's inputs; on a GPU the unmodified float32 model (Triton) against the float64 reference.

Example (GPU machine): python3 bench/make_hgrn2_fixtures.py --out $OUT --fla-bundle <folder with fla.tar.xz>
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_deltanet_fixtures as dn  # noqa: E402

BATCH, SEQ = 2, 72  # > 64: foxlm's chunked GLA crosses a chunk boundary
PROMPT_LEN, NEW_TOKENS = 30, 12
CONFIG = dict(
    vocab_size=48,
    hidden_size=32,
    num_hidden_layers=3,  # layers 1 and 2 have lower bounds (one and two softmax rows summed)
    expand_ratio=8,  # 4 heads of 8 (q, k and the gate) by 8 (v)
    use_short_conv=False,
    use_lower_bound=True,
    attn_mode="chunk",
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


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder; files go to <out>/hgrn2/")
    ap.add_argument("--fla-bundle", default=os.path.join(os.path.dirname(HERE), ".device-bundle", "hgrn2"))
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--budget-s", type=float, default=60.0, help="skip the float32 GPU check after this")
    return ap.parse_args()


def gla_reference(torch, q, k, v, g, scale=None):
    """GLA step by step: q, k, g [B, T, H, K], v [B, T, H, V]; o [B, T, H, V], final state [B, H, K, V]."""

    def update(S, t):
        return S * g[:, t].exp()[..., None] + k[:, t, ..., None] * v[:, t, :, None, :]

    return dn.recurrence(torch, q, v, scale, update)


def patched_kernels(torch, record):
    """Replacements for the HGRN2 layer's GLA kernels and rms_norm_linear, recording their inputs."""
    import torch.nn.functional as F

    def gla(q, k, v, g=None, gk=None, scale=None, initial_state=None, output_final_state=False,
            state_v_first=False, cu_seqlens=None, **kw):
        g = gk if g is None else g
        assert initial_state is None and cu_seqlens is None
        record.setdefault("gla", []).append(dict(q=q.detach(), k=k.detach(), v=v.detach(), g=g.detach()))
        o, S = gla_reference(torch, q, k, v, g, scale)
        if state_v_first:
            S = S.transpose(-1, -2)
        return o, (S if output_final_state else None)

    def rms_norm_linear(x, norm_weight, norm_bias, linear_weight, linear_bias, residual=None, eps=1e-5,
                        prenorm=False, residual_in_fp32=False):
        assert residual is None and not prenorm
        record.setdefault("rms_norm_linear_eps", set()).add(eps)
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        if norm_weight is not None:
            y = y * norm_weight
        if norm_bias is not None:
            y = y + norm_bias
        return F.linear(y, linear_weight, linear_bias)

    return gla, rms_norm_linear


def run_model(torch, fla_models, args, fla_desc):
    import torch.nn.functional as F

    cfg = fla_models.HGRN2Config(**CONFIG)
    report = dn.new_report(torch, "hgrn2", fla_desc)
    model = fla_models.HGRN2ForCausalLM(cfg).to(torch.float64)
    dn.set_weights(torch, model, args.seed)
    gen = torch.Generator().manual_seed(args.seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("lower_bounds"):
                # softmax over layers far from uniform: lower bounds from about 0.05 to 0.95
                p.copy_(1.5 * torch.randn(*p.shape, generator=gen, dtype=torch.float64))
            elif name.endswith("f_proj.weight"):
                # forget gates spread over (0, 1): some channels remember for tens of steps
                p.mul_(2.5)
    state = {n: p.detach().clone() for n, p in model.named_parameters()}
    report["fla_param_names"] = {n: list(p.shape) for n, p in state.items()}

    g = torch.Generator().manual_seed(args.seed + 100)
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=g)

    import fla.layers.hgrn2 as hgrn2_mod

    record = {}
    gla, rnl = patched_kernels(torch, record)
    originals = {}
    kernels = [("chunk_gla", gla), ("fused_recurrent_gla", gla), ("fused_chunk_gla", gla), ("rms_norm_linear", rnl),
               ("swish", F.silu)]
    for n, fn in kernels:
        dn.patch_kernel(originals, hgrn2_mod, n, fn)
    logits, nll, grads = dn.float64_reference(torch, model, ids, originals, report, PROMPT_LEN, NEW_TOKENS)
    # every forward passes the same eps, so the greedy forwards after the first add none
    report["rms_norm_linear_eps"] = sorted(record.get("rms_norm_linear_eps", []))
    layer_inputs = record["gla"][1]  # layer 1 of the first forward: the first with a lower bound

    outdir = os.path.join(args.out, "hgrn2")
    dn.write_fixture(torch, outdir, cfg, state, grads, ids, logits, nll)

    # Cross-check: fla's own naive recurrence (float32) on layer 1's GLA inputs.
    try:
        from fla.ops.gla.naive import naive_recurrent_gla

        x = {k_: v_.to(torch.float32) for k_, v_ in layer_inputs.items()}
        ref, _ = gla_reference(torch, *(x[n].double() for n in ("q", "k", "v", "g")))
        o, _ = naive_recurrent_gla(x["q"], x["k"], x["v"], x["g"])
        report["fla_naive"] = "fla.ops.gla.naive.naive_recurrent_gla"
        report["fla_naive_vs_reference_max_abs"] = (o.double() - ref).abs().max().item()
    except Exception as e:  # noqa: BLE001
        report["fla_naive_error"] = repr(e)

    made_by = "bench/make_hgrn2_fixtures.py (seed %d, B=%d, T=%d)" % (args.seed, BATCH, SEQ)
    return dn.finish_model(originals, report, outdir, made_by, cfg=cfg, model_cls="HGRN2ForCausalLM", state=state,
                           grads=grads, logits=logits.detach(), ids=ids)


def main():
    args = parse_args()
    t0 = time.time()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    fla_desc = dn.import_fla(args.fla_bundle)
    print("fla:", fla_desc, "torch", torch.__version__, "device", device, flush=True)
    import fla.models as fla_models

    made = run_model(torch, fla_models, args, fla_desc)
    print("hgrn2 done at %.1fs" % (time.time() - t0), flush=True)
    if device == "cuda" and time.time() - t0 < args.budget_s:
        dn.float32_check(torch, fla_models, made, device)
        print("hgrn2 float32 check done at %.1fs" % (time.time() - t0), flush=True)


if __name__ == "__main__":
    main()
