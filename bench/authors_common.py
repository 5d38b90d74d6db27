"""What the bench scripts that run the authors' code share: their forgetting-transformer source on
sys.path (authors_fox.py, make_mamba2_fixtures.py, make_samba_fixtures.py), and the tensors and
commit a reference fixture records (the two fixture makers)."""

import os
import sys
import types


def put_authors_on_path(authors_dir, *marker):
    """<authors_dir>/src first on sys.path, once src/forgetting_transformer/<marker...> is found
    there; a stand-in pytest when none is installed (their token_shift.py imports it for its own
    tests)."""
    src = os.path.join(authors_dir, "src")
    if not os.path.isfile(os.path.join(src, "forgetting_transformer", *marker)):
        raise SystemExit(f"error: {src}/forgetting_transformer not found (carry .device-bundle/authors)")
    sys.path.insert(0, src)
    try:
        import pytest  # noqa: F401
    except ImportError:
        stub = types.ModuleType("pytest")
        stub.mark = types.SimpleNamespace(parametrize=lambda *a, **k: (lambda f: f))
        sys.modules["pytest"] = stub


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
