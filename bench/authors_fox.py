#!/usr/bin/env python3
"""The FoX authors' own FoX (Pro) training step, timed like bench/train_reference.py.

Uses an unmodified copy of the needed files of github zhixuan-lin/forgetting-transformer (their HF-style
model, config and Triton Forgetting Attention kernel; MIT licence) in .device-bundle/authors/ (git-ignored;
carry it to the GPU machine). Their package is imported from there; nothing of theirs is edited.

Matches their training (train.py, configs/experiment/longcrawl64/forgetting_transformer/pro_*.yaml):
FoX (Pro) = qk-norm, output gate + output norm, k/v shift, no RoPE, hidden_ratio 3.5; fp32 weights under
bf16 autocast (Lightning 'bf16-mixed'); loss = their model(input_ids, labels).loss (their fused Triton
cross-entropy, per token) averaged; their gradient checkpointing (per attention and per MLP, non-reentrant)
with --checkpoint (their 760m configs turn it on); grad clipping at 1.0; AdamW betas 0.9/0.95, wd 0.1 on
matrices and embeddings (biases and norm weights exempt, as their group_parameters does), here fused.
Their training does not torch.compile; --compile is offered but is not what they run.

--acp turns on Adaptive Computation Pruning (config log_pruning_tolerance, default -10 as they recommend).
Caveat: pruning depends on the forget-gate values, and at random init (gate logits ~0, so log f ~ -0.69 per
token) nearly everything beyond ~50 tokens is pruned: an ACP time at init is a best case, not a trained one.

qk-norm: --qk-share (default on) shares the RMSNorm scale across heads as in their paper runs and released
checkpoints; --no-qk-share uses their current default (per-head scales). Speed differs negligibly.

Example (GPU): python3 bench/authors_fox.py --size 125m --json $OUT/authors-125m.json
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# bench/ is this script's folder
from train_reference import SIZES, VOCAB, add_model_options, add_step_options, check_sizes  # noqa: E402
from train_reference import finish_train, timed_steps, torch_on_device  # noqa: E402
from authors_common import authors_adamw, authors_commit, fox_pro_config, put_authors_on_path  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_AUTHORS = os.path.join(os.path.dirname(HERE), ".device-bundle", "authors")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(
        ap, "torch.compile the model (their training does not)", "their per-block gradient checkpointing"
    )
    ap.add_argument("--acp", action="store_true", help="Adaptive Computation Pruning (log_pruning_tolerance)")
    ap.add_argument("--log-pruning-tolerance", type=float, default=-10.0)
    ap.add_argument("--qk-share", dest="qk_share", action="store_true", default=True)
    ap.add_argument("--no-qk-share", dest="qk_share", action="store_false")
    ap.add_argument(
        "--fgate-bias",
        type=float,
        default=None,
        help="set every forget-gate bias to this after init (e.g. 5: log f ~ -0.007/token, long memory); "
        "default: their init (bias 0)",
    )
    ap.add_argument("--no-check", dest="check", action="store_false", help="skip the kernel-vs-PyTorch check")
    add_step_options(ap)
    ap.add_argument("--authors-dir", default=DEFAULT_AUTHORS, help="folder holding their LICENSE and src/")
    ap.add_argument("--device", default="cuda", help="cuda (benchmark) or meta/cpu (build-only check)")
    ap.add_argument("--layers", type=int, default=None, help="override the layer count (smoke tests)")
    ap.add_argument("--build-only", action="store_true", help="build model+optimizer, print sizes, exit")
    a = ap.parse_args()
    check_sizes(ap, a)
    return a


def import_authors(authors_dir):
    put_authors_on_path(authors_dir, "__init__.py")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from forgetting_transformer.model.forgetting_transformer.configuration_forgetting_transformer import (
            ForgettingTransformerConfig,
        )
        from forgetting_transformer.model.forgetting_transformer.modeling_forgetting_transformer import (
            ForgettingTransformerForCausalLM,
        )
    return ForgettingTransformerConfig, ForgettingTransformerForCausalLM


def kernel_check(dev):
    """Their forgetting_attention (fwd+bwd, bf16) against a plain PyTorch float32 reference, small shape."""
    import torch
    from forgetting_transformer.ops.forgetting_attention import forgetting_attention

    g = torch.Generator(device="cpu").manual_seed(1)
    b, h, t, d = 1, 2, 1024, 64
    q, k, v, do = [torch.randn(b, h, t, d, generator=g).to(dev, torch.bfloat16) for _ in range(4)]
    log_f = torch.nn.functional.logsigmoid(torch.randn(b, h, t, generator=g) + 3.0).to(dev)
    ins = [x.clone().requires_grad_() for x in (q, k, v, log_f)]
    out = forgetting_attention(*ins, head_first=True, sm_scale=d**-0.5)
    grads = torch.autograd.grad(out, ins, do)
    ref_ins = [x.float().clone().requires_grad_() for x in (q, k, v, log_f)]
    rq, rk, rv, rf = ref_ins
    c = torch.cumsum(rf, -1)
    s = rq @ rk.transpose(-1, -2) * d**-0.5 + (c[..., :, None] - c[..., None, :])
    s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool, device=dev).tril(), float("-inf"))
    ref = torch.softmax(s, -1) @ rv
    ref_grads = torch.autograd.grad(ref, ref_ins, do.float())
    res = {}
    for name, a, r in zip(["o", "dq", "dk", "dv", "dlogf"], [out, *grads], [ref, *ref_grads]):
        a, r = a.detach().float(), r.detach()
        res[name] = round(float((a - r).abs().max() / r.abs().max().clamp_min(1e-6)), 5)
    res["ok"] = all(x < 0.05 for x in res.values())
    return res


def main():
    a = parse_args()
    torch, dev = torch_on_device(a, "use --device cpu --build-only for a check")
    Config, CausalLM = import_authors(a.authors_dir)

    d, n_layers, n_heads = SIZES[a.size]
    if a.layers is not None:
        n_layers = a.layers
    cfg = fox_pro_config(
        Config,
        d,
        n_layers,
        n_heads,
        vocab=VOCAB,
        qk_share=a.qk_share,
        log_pruning_tolerance=a.log_pruning_tolerance if a.acp else None,
    )
    with torch.device(dev):
        model = CausalLM(cfg)
    model = model.to(device=dev, dtype=torch.float32)  # 'bf16-mixed': fp32 master weights
    if a.fgate_bias is not None:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.attn.fgate_proj.bias.fill_(a.fgate_bias)
    if a.checkpoint:
        # What model.gradient_checkpointing_enable() does in their train.py: their Model.forward reads
        # this flag and wraps each block's attention and MLP in torch.utils.checkpoint(use_reentrant=False).
        model.model.gradient_checkpointing = True
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = authors_adamw(torch, model, fused=dev.type == "cuda")
    mlp = model.model.layers[0].mlp
    shape = dict(hidden=d, layers=n_layers, heads=n_heads, head_dim=d // n_heads, intermediate=mlp.intermediate_size)
    if a.build_only:
        print(json.dumps({"params": n_params, "shape": shape, "decay": len(decay), "no_decay": len(no_decay)}))
        print(model)
        return 0

    fwd = torch.compile(model) if a.compile else model
    g = torch.Generator(device="cpu").manual_seed(a.seed)
    toks = torch.randint(0, VOCAB, (a.batch, a.context + 1), generator=g).to(dev)
    ids, labels = toks[:, :-1].contiguous(), toks[:, 1:].contiguous()
    params = list(model.parameters())

    grad_norms = []

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
            out = fwd(
                input_ids=ids,
                labels=labels,
                use_cache=False,
                output_attentions=False,
                output_hidden_states=False,
                return_dict=True,
            )
            loss = out.loss.mean()  # their loss is per token, [B, T]
        loss.backward()
        grad_norms.append(torch.nn.utils.clip_grad_norm_(params, 1.0))
        opt.step()
        return loss

    result = {
        "name": "authors-fox-pro" + ("-acp" if a.acp else ""),
        "size": a.size,
        "context": a.context,
        "batch": a.batch,
        "compile": a.compile,
        "checkpoint": a.checkpoint,
        "acp": a.acp,
        "log_pruning_tolerance": a.log_pruning_tolerance if a.acp else None,
        "qk_norm_share_param_across_head": a.qk_share,
        "fgate_bias": a.fgate_bias,
        "params": n_params,
        "shape": shape,
        "torch_version": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else str(dev),
    }
    try:
        import triton

        result["triton_version"] = triton.__version__
    except ImportError:
        pass
    try:
        import transformers

        result["transformers_version"] = transformers.__version__
    except ImportError:
        pass
    commit = authors_commit(a.authors_dir)
    if commit is not None:
        result["authors_commit"] = commit

    if a.check and dev.type == "cuda":
        result["kernel_check_rel_err"] = kernel_check(dev)
        print("kernel check (max |err| / max |ref|):", json.dumps(result["kernel_check_rel_err"]), flush=True)

    times, final_loss = timed_steps(torch, dev, a, step, result)
    if final_loss is not None:
        result["grad_norm_first_last"] = [round(float(grad_norms[0]), 4), round(float(grad_norms[-1]), 4)]
    return finish_train(torch, dev, a, result, times, final_loss)


if __name__ == "__main__":
    sys.exit(main())
