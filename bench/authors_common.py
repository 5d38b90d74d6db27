"""What the bench scripts that run the authors' code share: their forgetting-transformer source on
sys.path (authors_fox.py, make_mamba2_fixtures.py, make_samba_fixtures.py, the Python package's
gpu_check.py) and their FoX (Pro) config, the tensors and commit a
reference fixture records, and the passes both fixture makers run on their model (float64
reference, independent oracle, float32 cross-check, greedy decoding). The float64 mode also serves
make_deltanet_fixtures.py and make_hgrn2_fixtures.py."""

import os
import sys
import types


def put_authors_on_path(authors_dir, *marker):
    """<authors_dir>/src first on sys.path (put_authors_src_on_path)."""
    put_authors_src_on_path(os.path.join(authors_dir, "src"), *marker)


def put_authors_src_on_path(src, *marker):
    """`src` first on sys.path, once src/forgetting_transformer/<marker...> is found there; a
    stand-in pytest when none is installed (their token_shift.py imports it for its own tests)."""
    if not os.path.isfile(os.path.join(src, "forgetting_transformer", *marker)):
        raise SystemExit(f"error: {src}/forgetting_transformer not found (carry .device-bundle/authors)")
    sys.path.insert(0, src)
    try:
        import pytest  # noqa: F401
    except ImportError:
        stub = types.ModuleType("pytest")
        stub.mark = types.SimpleNamespace(parametrize=lambda *a, **k: (lambda f: f))
        sys.modules["pytest"] = stub


def fox_pro_config(Config, d, layers, heads, vocab=50257, qk_share=True, log_pruning_tolerance=None):
    """Their FoX (Pro) yaml plus the defaults of their hydra model config
    (configs/model/forgetting_transformer.py), as authors_fox.py and the Python package's
    gpu_check.py build it."""
    return Config(
        vocab_size=vocab,
        hidden_size=d,
        num_hidden_layers=layers,
        num_heads=heads,
        hidden_ratio=3.5,
        use_rope=False,
        rope_base=500000,
        use_v_shift=True,
        use_k_shift=True,
        qk_norm=True,
        qk_norm_share_param_across_head=qk_share,
        use_output_gate=True,
        use_output_norm=True,
        log_pruning_tolerance=log_pruning_tolerance,
        max_position_embeddings=None,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=False,
        fuse_norm=True,
        fuse_cross_entropy=True,
        use_cache=False,
    )


def authors_adamw(torch, model, fused):
    """AdamW as their FoX training sets it up (lr 1e-3, betas 0.9, 0.95): weight decay 0.1 on the
    matrices, none on vectors or on parameters they mark _no_weight_decay."""
    decay, no_decay = [], []
    for p in model.parameters():
        (no_decay if p.ndim < 2 or getattr(p, "_no_weight_decay", False) else decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-3,
        betas=(0.9, 0.95),
        fused=fused,
    )


def write_fixture_tensors(outdir, cfg, params, names, ids, logits64, ppl64, grads64):
    """A reference fixture's config and tensors into `outdir`: config.json, model.safetensors,
    expected.safetensors (input_ids, logits and per-position loss, in float32) and
    expected_grads.safetensors (grad.<name>, float32). Returns `outdir`."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(outdir, exist_ok=True)
    cfg.save_pretrained(outdir)
    save_file(params, os.path.join(outdir, "model.safetensors"))
    save_file(
        {
            "input_ids": ids.cpu().contiguous(),
            "logits": logits64.detach().to(torch.float32).cpu().contiguous(),
            "per_position_loss": ppl64.detach().to(torch.float32).cpu().contiguous(),
        },
        os.path.join(outdir, "expected.safetensors"),
    )
    save_file(
        {f"grad.{nm}": gr.detach().to(torch.float32).cpu().contiguous() for nm, gr in zip(names, grads64)},
        os.path.join(outdir, "expected_grads.safetensors"),
    )
    return outdir


def authors_commit(authors_dir):
    """The authors' commit as the bundle records it (<authors_dir>/COMMIT), or None."""
    cf = os.path.join(authors_dir, "COMMIT")
    if os.path.isfile(cf):
        return open(cf).read().strip()
    return None


def keep_float64_mode(torch, asks_f32=None):
    """A TorchFunctionMode class for a float64 pass through code that casts to float32: under it
    `.float()` of a float64 tensor, and `.to(...)` when `asks_f32(the arguments after the tensor,
    kwargs)`, return the tensor unchanged; it counts those casts (`kept`) and the ops that still
    return a float32 tensor (`f32_ops`), by name. Default asks_f32: float32 among the positional
    arguments or as dtype=."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_leaves

    if asks_f32 is None:
        def asks_f32(args, kwargs):
            return any(a is torch.float32 for a in args) or kwargs.get("dtype") is torch.float32

    class KeepFloat64(TorchFunctionMode):
        """`.float()` / `.to(torch.float32)` of a float64 tensor return it unchanged; records f32 outputs."""

        def __init__(self):
            super().__init__()
            self.kept = {}
            self.f32_ops = {}

        def __torch_function__(self, func, types_, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", str(func))
            if args and isinstance(args[0], torch.Tensor) and args[0].dtype is torch.float64:
                if func is torch.Tensor.float or (func is torch.Tensor.to and asks_f32(args[1:], kwargs)):
                    self.kept[name] = self.kept.get(name, 0) + 1
                    return args[0]
            out = func(*args, **kwargs)
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.dtype is torch.float32:
                    self.f32_ops[name] = self.f32_ops.get(name, 0) + 1
            return out

    return KeepFloat64


def exact_float32_device(torch, device):
    """torch.device(device), by default cuda when available, with TF32 off in matmuls and cuDNN
    convolutions, so that the float32 cross-check is exact float32."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return dev


def draw_weights(torch, model, seed, rule):
    """{name: f32 CPU tensor} for every parameter of `model`, in its order: `rule(name, shape,
    randn)` draws each in float64 (randn: normals from one generator seeded with `seed`), None when
    it has no rule for that parameter (an error)."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    out = {}
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        v = rule(name, shape, randn)
        if v is None:
            raise SystemExit(f"error: no rule for parameter {name} {shape}")
        out[name] = v.to(torch.float32).contiguous()
    return out


def next_token_loss(F, logits, ids):
    """The mean next-token cross-entropy of `logits` [B, T, V] on `ids` [B, T], and the per-position
    loss [T-1] (the mean over the batch)."""
    v = logits.shape[-1]
    per_tok = F.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1), reduction="none")
    per_tok = per_tok.view(ids.shape[0], ids.shape[1] - 1)
    return per_tok.mean(), per_tok.mean(0)


def loss_and_grads(torch, F, model, ids):
    """The model's logits on `ids` (no cache), next_token_loss of them, and every parameter's
    gradient of the mean loss: (logits, loss, per-position loss, grads)."""
    logits = model(input_ids=ids, use_cache=False).logits
    loss, ppl = next_token_loss(F, logits, ids)
    return logits, loss, ppl, torch.autograd.grad(loss, list(model.parameters()))


def reference_pass(torch, F, model64, ids, KeepFloat64):
    """loss_and_grads of the float64 model under KeepFloat64, with one summary line: (the mode,
    which holds the casts it kept and the ops that still ran in float32, logits, loss, per-position
    loss, grads)."""
    mode = KeepFloat64()
    with mode:
        logits64, loss64, ppl64, grads64 = loss_and_grads(torch, F, model64, ids)
    assert logits64.dtype == torch.float64
    print(f"reference: loss {float(loss64):.6f}; kept float64 at {mode.kept}; float32 ops {mode.f32_ops}", flush=True)
    return mode, logits64, loss64, ppl64, grads64


def oracle_agreement(torch, F, oracle, params, cfg, ids, dev, names, logits64, grads64):
    """`oracle(torch, float64 parameters, cfg, ids)` (a model written from the weights alone)
    against the reference's logits and gradients: (max |logit difference|, the largest relative
    gradient error)."""
    oparams = {k: v.to(dev, torch.float64).requires_grad_() for k, v in params.items()}
    logits = oracle(torch, oparams, cfg, ids)
    grads = torch.autograd.grad(next_token_loss(F, logits, ids)[0], [oparams[n] for n in names])
    diff = float((logits.detach() - logits64.detach()).abs().max())
    grad_rel = max(float((go - g64).norm() / g64.norm().clamp_min(1e-300)) for go, g64 in zip(grads, grads64))
    return diff, grad_rel


def float32_vs_reference(names, logits32, loss32, grads32, logits64, loss64, grads64, **extra):
    """The float32 pass against the float64 reference, with one summary line: (relative gradient
    error per parameter, the summary: logits and loss differences, `extra`, the largest gradient
    error and its parameter)."""

    def rel(x, y):
        return float((x.double() - y.double()).norm() / y.double().norm().clamp_min(1e-30))

    grad_rel = {f"grad.{n}": rel(g32, g64) for n, g32, g64 in zip(names, grads32, grads64)}
    cross = {
        "logits_max_abs_diff": float((logits32.double() - logits64).abs().max()),
        "loss_abs_diff": abs(float(loss32) - float(loss64)),
        **extra,
        "grad_rel_err_max": max(grad_rel.values()),
        "grad_rel_err_max_name": max(grad_rel, key=grad_rel.get),
    }
    print(f"float32 vs reference: {cross}", flush=True)
    return grad_rel, cross


def greedy_nocache(torch, model, prompt, new_tokens, KeepFloat64=None):
    """`new_tokens` greedy tokens after `prompt` [1, P] by argmax of full forwards without a cache
    (each under KeepFloat64 when given): (the tokens, the smallest gap between the top two logits)."""
    with torch.no_grad():
        seq, gaps = prompt.clone(), []
        for _ in range(new_tokens):
            if KeepFloat64 is not None:
                with KeepFloat64():
                    last = model(input_ids=seq, use_cache=False).logits[:, -1]
            else:
                last = model(input_ids=seq, use_cache=False).logits[:, -1]
            top2 = last.double().topk(2, dim=-1).values
            gaps.append(float(top2[0, 0] - top2[0, 1]))
            seq = torch.cat([seq, last.argmax(-1, keepdim=True)], 1)
        return seq[0, prompt.shape[1]:].tolist(), min(gaps)
