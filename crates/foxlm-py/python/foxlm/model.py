"""foxlm models from Python: a model folder opened on the CPU or a GPU through foxlm's engines."""

import numpy as np

from . import _foxlm

__all__ = ["Model", "load"]


def _is_torch(x):
    t = type(x)
    return t.__module__.startswith("torch") and t.__name__ == "Tensor"


def _tokens_2d(tokens, name="tokens"):
    """[B, T] int64 NumPy array from a list, a list of lists, a NumPy array or a torch tensor."""
    if _is_torch(tokens):
        tokens = tokens.detach().cpu().numpy()
    a = np.asarray(tokens)
    if a.dtype == object:
        raise ValueError(f"{name}: rows of different lengths; pad them (and pass start=) or call once per row")
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2:
        raise ValueError(f"{name} must be [T] or [B, T] token ids, got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name} must hold integer token ids, got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.int64)


def _out(a, like_torch, device=None):
    if not like_torch:
        return a
    import torch

    t = torch.from_numpy(a)
    return t.to(device) if device is not None else t


class Model:
    """A model folder opened on a device (see `load`).

    Methods take token ids as lists, NumPy arrays or torch tensors and return NumPy arrays, or
    torch tensors when given torch tensors (or `return_torch=True`).
    """

    def __init__(self, path, device="cpu", dtype=None, max_batch=8, chunk=2048):
        self._m = _foxlm.Model(str(path), device, dtype, int(max_batch), int(chunk))
        self.path = str(path)

    @property
    def device(self):
        """The device the model runs on, in words."""
        return self._m.device

    @property
    def vocab_size(self):
        return self._m.vocab_size

    @property
    def config(self):
        """The model's configuration (config.json as foxlm reads it), a dict."""
        import json

        return json.loads(self._m.config_json())

    def logits(self, tokens, start=None, return_torch=None):
        """Logits [B, T, V] (float32) of token ids [B, T] (or [T]: then [T, V]). `start[b]` marks
        row b's first `start[b]` positions as left padding."""
        single = np.ndim(tokens) == 1 and not _is_torch(tokens) or (_is_torch(tokens) and tokens.dim() == 1)
        a = _tokens_2d(tokens)
        b, t = a.shape
        st = None
        if start is not None:
            st = [int(x) for x in np.asarray(start).reshape(-1)]
            if any(x < 0 for x in st):
                raise ValueError("start: entries must be >= 0")
        raw = self._m.logits(a.tobytes(), b, t, st)
        out = np.frombuffer(raw, dtype="<f4").reshape(b, t, self.vocab_size)
        if single:
            out = out[0]
        return _out(out.copy(), return_torch if return_torch is not None else _is_torch(tokens))

    def token_losses(self, tokens, return_torch=None):
        """Next-token cross-entropy (nats, float64) [B, T - 1] of token ids [B, T]."""
        a = _tokens_2d(tokens)
        b, t = a.shape
        raw = self._m.token_losses(a.tobytes(), b, t)
        out = np.frombuffer(raw, dtype="<f8").reshape(b, t - 1).copy()
        return _out(out, return_torch if return_torch is not None else _is_torch(tokens))

    def loss(self, tokens):
        """Mean next-token cross-entropy (nats) over every prediction of token ids [B, T]."""
        return float(self.token_losses(tokens, return_torch=False).mean())

    def generate(self, prompt, max_new_tokens=32, temperature=0.0, top_k=0, top_p=1.0, seed=0, eos=None):
        """New token ids after `prompt` (ids [T], or a list of prompts of any lengths, batched
        with left padding; or text, for GPT-2-vocabulary models). Greedy at temperature 0.
        Returns a list of ids (a list of lists for several prompts; text for a text prompt)."""
        if isinstance(prompt, str):
            ids = self.encode(prompt)
            new = self.generate(ids, max_new_tokens, temperature, top_k, top_p, seed, eos)
            return self.decode(new)
        if _is_torch(prompt):
            prompt = prompt.detach().cpu().numpy()
        if isinstance(prompt, np.ndarray):
            prompts = [list(map(int, r)) for r in (prompt[None] if prompt.ndim == 1 else prompt)]
            single = prompt.ndim == 1
        else:
            prompt = list(prompt)
            single = not prompt or not isinstance(prompt[0], (list, tuple, np.ndarray))
            prompts = [list(map(int, prompt))] if single else [list(map(int, p)) for p in prompt]
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        out = self._m.generate(prompts, int(max_new_tokens), float(temperature), int(top_k), float(top_p), int(seed), eos)
        return out[0] if single else out

    def encode(self, text, add_bos=True, plain=False):
        """GPT-2 BPE ids of `text` (JSON-escaped first unless plain, as the released models were
        trained; BOS first when add_bos). Only for GPT-2-vocabulary models."""
        return self._m.encode(text, add_bos, plain)

    def decode(self, ids, plain=False):
        """Text of token ids (GPT-2-vocabulary models)."""
        if _is_torch(ids):
            ids = ids.tolist()
        return self._m.decode([int(x) for x in np.asarray(ids).reshape(-1)], plain)

    def __repr__(self):
        return f"foxlm.Model({self.path!r}, device={self.device!r})"


def load(path, device="cpu", dtype=None, max_batch=8, chunk=2048):
    """Open a model folder (config.json + model.safetensors: one that foxlm trained, or the FoX
    authors' Hugging Face layout) on `device` ("cpu", "cuda", "cuda:N", "auto"). `dtype` "bf16"
    or "f32" on a GPU (default bf16; the CPU runs f32). `max_batch` rows of `chunk` positions
    size the GPU engine's buffers (longer inputs go through in chunks)."""
    return Model(path, device=device, dtype=dtype, max_batch=max_batch, chunk=chunk)
