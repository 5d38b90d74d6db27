"""Forgetting Attention from foxlm's kernels, for PyTorch (CUDA and CPU) and NumPy (CPU).

    o_i = sum_j softmax_j(scale * q_i . k_j + c_i - c_j) v_j  over visible keys j <= i,
    c_t = sum_{s <= t} log_fgate_s  (prefix sums of the log forget gates, per head)

`forgetting_attention` is a drop-in for the FoX authors' `forgetting_attention` (keywords
`head_first`, `seq_start`, `sm_scale`) and for fla's `parallel_forgetting_attn` (positional
`scale`, `window_size`, `cu_seqlens`): swapping either for this one is a one-line change.

Layout (as theirs): q [B, T, H, D], k and v [B, T, H_kv, D] (H_kv divides H: grouped-query
attention), log_fgate [B, T, H] in float32; with head_first=True the T and H axes trade places in
every input and in the output. The output is [B, T, H, D] (or [B, H, T, D]) in q's dtype.

On CUDA q, k, v are bfloat16 or float16 with head dim 64 or 128 and the kernels run on PyTorch's
current stream of the tensors' device, reading the tensors in place (any strides that are multiples
of 8 elements with the last dimension contiguous; others are copied once). What the backward needs
(the output, the log-sum-exp per row, the gate prefix sums) is kept as torch tensors. On the CPU
any float dtype and head dim is accepted and computed in float32.

Not supported (a clear error says so): seqlen_q != seqlen_k (the authors allow queries at the end
of a longer key sequence); the authors' `adaptive_threshold` (use `acp=<log tolerance>`, the
authors' `log_pruning_tolerance`, e.g. -10.0); `cu_seqlens` with a batch other than 1; on CUDA,
head dims other than 64 and 128 and dtypes other than bfloat16 and float16.
"""

import math

import numpy as np

from . import _foxlm

__all__ = ["forgetting_attention", "forgetting_attention_numpy"]


# --------------------------------------------------------------------------------------------
# argument checks shared by the torch and NumPy entry points


def _scale(scale, sm_scale, d):
    if scale is not None and sm_scale is not None and float(scale) != float(sm_scale):
        raise ValueError(f"scale ({scale}) and sm_scale ({sm_scale}) disagree: give one")
    s = scale if scale is not None else sm_scale
    if s is None:
        return 1.0 / math.sqrt(d)
    s = float(s)
    if not math.isfinite(s) or s <= 0:
        raise ValueError(f"scale must be a positive finite number, got {s}")
    return s


def _window(window, window_size):
    if window is not None and window_size is not None and int(window) != int(window_size):
        raise ValueError(f"window ({window}) and window_size ({window_size}) disagree: give one")
    w = window if window is not None else window_size
    if w is None:
        return None
    w = int(w)
    if w < 1:
        raise ValueError(f"window must be at least 1 key, got {w}")
    return w


def _acp(acp, adaptive_threshold):
    if adaptive_threshold is not None:
        raise ValueError(
            "adaptive_threshold (the authors' ACP threshold) is not supported: pass acp=<log pruning "
            "tolerance> (e.g. acp=-10.0, the authors' log_pruning_tolerance); foxlm derives the "
            "per-head thresholds from the query and key norms as their 'auto' does"
        )
    if acp is None:
        return None
    a = float(acp)
    if not math.isfinite(a) or a >= 0:
        raise ValueError(f"acp is a log tolerance (negative, e.g. -10.0), got {acp}")
    return a


def _shapes(qs, ks, vs, gs, head_first):
    """(B, H, H_kv, T, D) from the four shapes, or a ValueError naming the tensor at fault."""
    names = "[B, H, T, D]" if head_first else "[B, T, H, D]"
    for name, s in (("q", qs), ("k", ks), ("v", vs)):
        if len(s) != 4:
            raise ValueError(f"{name} must be 4-D {names}, got shape {tuple(s)}")
    if head_first:
        b, h, t, d = qs
        bk, hkv, tk, dk = ks
        bv, hv, tv, dv = vs
    else:
        b, t, h, d = qs
        bk, tk, hkv, dk = ks
        bv, tv, hv, dv = vs
    if len(gs) != 3:
        raise ValueError(f"log_fgate must be 3-D {'[B, H, T]' if head_first else '[B, T, H]'}, got shape {tuple(gs)}")
    gb, g1, g2 = gs
    gt, gh = (g2, g1) if head_first else (g1, g2)
    if bk != b or bv != b or gb != b:
        raise ValueError(f"batch sizes differ: q {b}, k {bk}, v {bv}, log_fgate {gb}")
    if tk != t or tv != t:
        raise ValueError(
            f"k and v must have q's length {t} (got {tk} and {tv}): foxlm supports seqlen_q == seqlen_k only"
        )
    if gt != t or gh != h:
        raise ValueError(f"log_fgate must be [B, T, H] = [{b}, {t}, {h}] (per query head), got {tuple(gs)}")
    if hv != hkv:
        raise ValueError(f"k has {hkv} heads but v has {hv}")
    if hkv < 1 or h % hkv != 0:
        raise ValueError(f"k/v heads ({hkv}) must divide q's heads ({h}) for grouped-query attention")
    if dk != d or dv != d:
        raise ValueError(f"head dims differ: q {d}, k {dk}, v {dv} (foxlm needs one head dim)")
    if min(b, t, h, d) < 1:
        raise ValueError(f"empty input: B={b}, T={t}, H={h}, D={d}")
    return b, h, hkv, t, d


def _check_layout_args(seq_start, cu_seqlens, b):
    if seq_start is not None and cu_seqlens is not None:
        raise ValueError("give seq_start (left padding) or cu_seqlens (packed sequences), not both")
    if cu_seqlens is not None and b != 1:
        raise ValueError(f"cu_seqlens needs batch size 1 (sequences packed along T), got batch {b}")


def _host_starts(seq_start, cu_seqlens, b, t):
    """(mode, int64 array) for the CPU kernels, range-checked, or None."""
    if seq_start is not None:
        s = np.ascontiguousarray(np.asarray(seq_start).reshape(-1), dtype=np.int64)
        if s.shape != (b,):
            raise ValueError(f"seq_start must have one entry per batch row ({b}), got shape {s.shape}")
        if s.size and (s.min() < 0 or s.max() > t):
            raise ValueError(f"seq_start entries must lie in 0..{t}, got {s.min()}..{s.max()}")
        return 1, s
    if cu_seqlens is not None:
        cu = np.asarray(cu_seqlens).reshape(-1).astype(np.int64)
        if cu.size < 2 or cu[0] != 0 or cu[-1] != t or np.any(np.diff(cu) < 0):
            raise ValueError(f"cu_seqlens must rise from 0 to T={t}, got {cu.tolist()}")
        starts = np.repeat(cu[:-1], np.diff(cu))
        return 2, np.ascontiguousarray(starts, dtype=np.int64)
    return None


# --------------------------------------------------------------------------------------------
# NumPy (CPU)


def forgetting_attention_numpy(
    q,
    k,
    v,
    log_fgate,
    scale=None,
    window_size=None,
    cu_seqlens=None,
    *,
    head_first=False,
    seq_start=None,
    sm_scale=None,
    window=None,
    acp=None,
    dout=None,
):
    """Forgetting Attention on NumPy arrays with foxlm's CPU kernels (float32).

    Arguments and layout as `forgetting_attention`. Returns the output; with `dout` (the gradient
    of a loss with respect to the output, shaped like it) returns (out, (dq, dk, dv, dlog_fgate)).
    """
    qs, ks, vs, gs = (np.shape(x) for x in (q, k, v, log_fgate))
    b, h, hkv, t, d = _shapes(qs, ks, vs, gs, head_first)
    _check_layout_args(seq_start, cu_seqlens, b)
    sc = _scale(scale, sm_scale, d)
    w = _window(window, window_size)
    a = _acp(acp, None)
    starts = _host_starts(seq_start, cu_seqlens, b, t)

    def bthd(x):
        x = np.asarray(x, dtype=np.float32)
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3) if head_first else x)

    qf, kf, vf = bthd(q), bthd(k), bthd(v)
    g = np.asarray(log_fgate, dtype=np.float32)
    g = np.ascontiguousarray(g.transpose(0, 2, 1) if head_first else g)
    c = np.empty((b, h, t), np.float32)
    out = np.empty((b, t, h, d), np.float32)
    lse = np.empty((b, h, t), np.float32)
    prune = np.empty((b, h), np.float32) if a is not None else None
    st = (starts[0], starts[1].ctypes.data) if starts is not None else None
    shape = (b, h, hkv, t, d)
    _foxlm.cpu_forward(
        shape,
        qf.ctypes.data,
        kf.ctypes.data,
        vf.ctypes.data,
        g.ctypes.data,
        st,
        sc,
        w,
        (a, prune.ctypes.data) if a is not None else None,
        c.ctypes.data,
        out.ctypes.data,
        lse.ctypes.data,
    )
    ret = out.transpose(0, 2, 1, 3) if head_first else out
    if dout is None:
        return ret
    do = np.asarray(dout, dtype=np.float32)
    if do.shape != ret.shape:
        raise ValueError(f"dout must have the output's shape {ret.shape}, got {do.shape}")
    do = np.ascontiguousarray(do.transpose(0, 2, 1, 3) if head_first else do)
    dq = np.empty_like(qf)
    dk = np.empty_like(kf)
    dv = np.empty_like(vf)
    dg = np.empty((b, t, h), np.float32)
    _foxlm.cpu_backward(
        shape,
        qf.ctypes.data,
        kf.ctypes.data,
        vf.ctypes.data,
        c.ctypes.data,
        st,
        sc,
        w,
        prune.ctypes.data if prune is not None else None,
        out.ctypes.data,
        do.ctypes.data,
        lse.ctypes.data,
        dq.ctypes.data,
        dk.ctypes.data,
        dv.ctypes.data,
        dg.ctypes.data,
    )
    if head_first:
        dq, dk, dv, dg = dq.transpose(0, 2, 1, 3), dk.transpose(0, 2, 1, 3), dv.transpose(0, 2, 1, 3), dg.transpose(0, 2, 1)
    return ret, (dq, dk, dv, dg)


# --------------------------------------------------------------------------------------------
# PyTorch

_Function = None


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError(
            "foxlm.ops.forgetting_attention needs PyTorch (pip install torch); "
            "foxlm.ops.forgetting_attention_numpy runs on NumPy arrays without it"
        ) from e
    return torch


def _cuda_view(x, head_first):
    """(tensor, (ptr, stride_b, stride_h, stride_t)) with the strides the kernels can read; copies
    only when the layout cannot be read in place."""
    sb, s1, s2, s3 = x.stride()
    sh, st = (s1, s2) if head_first else (s2, s1)
    if s3 != 1 or sb % 8 or sh % 8 or st % 8 or x.data_ptr() % 16:
        x = x.contiguous()
        sb, s1, s2, _ = x.stride()
        sh, st = (s1, s2) if head_first else (s2, s1)
    return x, (x.data_ptr(), sb, sh, st)


def _device_starts(torch, seq_start, cu_seqlens, b, t, device):
    """(mode, int32 tensor on the device) or (None, None); values checked (one small sync)."""
    if seq_start is not None:
        s = torch.as_tensor(seq_start, device=device).reshape(-1)
        if s.numel() != b:
            raise ValueError(f"seq_start must have one entry per batch row ({b}), got {s.numel()}")
        s = s.to(torch.int32).contiguous()
        if bool(((s < 0) | (s > t)).any()):
            raise ValueError(f"seq_start entries must lie in 0..{t}")
        return 1, s
    if cu_seqlens is not None:
        cu = torch.as_tensor(cu_seqlens, device=device).reshape(-1).to(torch.int64)
        lens = cu[1:] - cu[:-1]
        if cu.numel() < 2 or bool(cu[0] != 0) or bool(cu[-1] != t) or bool((lens < 0).any()):
            raise ValueError(f"cu_seqlens must rise from 0 to T={t}")
        s = torch.repeat_interleave(cu[:-1], lens).to(torch.int32).contiguous()
        return 2, s
    return None, None


def _function():
    global _Function
    if _Function is not None:
        return _Function
    torch = _torch()

    class ForgettingAttentionFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, g, head_first, scale, window, acp, seq_start, cu_seqlens):
            # g: [B, T, H] float32 contiguous (the wrapper arranged it)
            b, h, hkv, t, d = _ctx_shape(q, k, head_first)
            ctx.head_first = head_first
            ctx.scale, ctx.window = scale, window
            ctx.shape = (b, h, hkv, t, d)
            if q.is_cuda:
                return _cuda_fwd(torch, ctx, q, k, v, g, acp, seq_start, cu_seqlens)
            return _cpu_fwd(torch, ctx, q, k, v, g, acp, seq_start, cu_seqlens)

        @staticmethod
        def backward(ctx, dout):
            if ctx.is_cuda:
                dq, dk, dv, dg = _cuda_bwd(torch, ctx, dout)
            else:
                dq, dk, dv, dg = _cpu_bwd(torch, ctx, dout)
            return dq, dk, dv, dg, None, None, None, None, None, None

    _Function = ForgettingAttentionFn
    return _Function


def _ctx_shape(q, k, head_first):
    if head_first:
        b, h, t, d = q.shape
        hkv = k.shape[1]
    else:
        b, t, h, d = q.shape
        hkv = k.shape[2]
    return b, h, hkv, t, d


def _cuda_fwd(torch, ctx, q, k, v, g, acp, seq_start, cu_seqlens):
    b, h, hkv, t, d = ctx.shape
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"on CUDA q, k, v must all be bfloat16 or float16, got {q.dtype}, {k.dtype}, {v.dtype}")
    if d not in (64, 128):
        raise ValueError(f"q: the CUDA kernels take head dim 64 or 128, got {d}")
    dev = q.device
    for name, x in (("k", k), ("v", v), ("log_fgate", g)):
        if x.device != dev:
            raise ValueError(f"{name} is on {x.device} but q is on {dev}")
    q, qa = _cuda_view(q, ctx.head_first)
    k, ka = _cuda_view(k, ctx.head_first)
    v, va = _cuda_view(v, ctx.head_first)
    mode, starts = _device_starts(torch, seq_start, cu_seqlens, b, t, dev)
    f32 = dict(device=dev, dtype=torch.float32)
    c = torch.empty((b, h, t), **f32)
    out = torch.empty((b, t, h, d), device=dev, dtype=q.dtype)
    lse = torch.empty((b, h, t), **f32)
    prune = torch.empty((b, h), **f32) if acp is not None else None
    stream = torch.cuda.current_stream(dev).cuda_stream
    dtype = "bf16" if q.dtype == torch.bfloat16 else "f16"
    st = (mode, starts.data_ptr()) if starts is not None else None
    _foxlm.cuda_forward(
        dev.index if dev.index is not None else torch.cuda.current_device(),
        stream,
        dtype,
        ctx.shape,
        qa,
        ka,
        va,
        g.data_ptr(),
        c.data_ptr(),
        out.data_ptr(),
        lse.data_ptr(),
        st,
        ctx.scale,
        ctx.window,
        (acp, prune.data_ptr()) if prune is not None else None,
    )
    ctx.is_cuda = True
    ctx.dtype = dtype
    ctx.mode = mode
    ctx.views = (qa, ka, va)
    ctx.save_for_backward(q, k, v, c, out, lse, starts, prune)
    return out.transpose(1, 2) if ctx.head_first else out


def _cuda_bwd(torch, ctx, dout):
    q, k, v, c, out, lse, starts, prune = ctx.saved_tensors
    b, h, hkv, t, d = ctx.shape
    dev = q.device
    # the kernels read dO as contiguous [B, T, H, D] in q's dtype
    do = dout.transpose(1, 2) if ctx.head_first else dout
    do = do.to(q.dtype).contiguous()
    # the views' addresses as saved (the same tensors: save_for_backward keeps them alive)
    qa, ka, va = ctx.views
    # the kernels write every element (the model's backward reuses these buffers unzeroed too)
    dq = torch.empty((b, t, h, d), device=dev, dtype=q.dtype)
    dk = torch.empty((b, t, hkv, d), device=dev, dtype=q.dtype)
    dv = torch.empty((b, t, hkv, d), device=dev, dtype=q.dtype)
    f32 = dict(device=dev, dtype=torch.float32)
    dcq = torch.empty((b, h, t), **f32)
    dck = torch.empty((b, h, t), **f32)
    delta = torch.empty((b, h, t), **f32)
    dg = torch.empty((b, t, h), **f32)
    stream = torch.cuda.current_stream(dev).cuda_stream
    st = (ctx.mode, starts.data_ptr()) if starts is not None else None
    _foxlm.cuda_backward(
        dev.index if dev.index is not None else torch.cuda.current_device(),
        stream,
        ctx.dtype,
        ctx.shape,
        qa,
        ka,
        va,
        c.data_ptr(),
        st,
        ctx.scale,
        ctx.window,
        prune.data_ptr() if prune is not None else None,
        out.data_ptr(),
        do.data_ptr(),
        lse.data_ptr(),
        dq.data_ptr(),
        dk.data_ptr(),
        dv.data_ptr(),
        dcq.data_ptr(),
        dck.data_ptr(),
        delta.data_ptr(),
        dg.data_ptr(),
    )
    if ctx.head_first:
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2), dg
    return dq, dk, dv, dg


def _cpu_fwd(torch, ctx, q, k, v, g, acp, seq_start, cu_seqlens):
    b, h, hkv, t, d = ctx.shape
    for name, x in (("k", k), ("v", v), ("log_fgate", g)):
        if x.device.type != "cpu":
            raise ValueError(f"{name} is on {x.device} but q is on the CPU")

    def bthd(x):
        x = x.detach().to(torch.float32)
        return (x.transpose(1, 2) if ctx.head_first else x).contiguous()

    qf, kf, vf = bthd(q), bthd(k), bthd(v)
    sa = _host_starts(
        seq_start.cpu().numpy() if torch.is_tensor(seq_start) else seq_start,
        cu_seqlens.cpu().numpy() if torch.is_tensor(cu_seqlens) else cu_seqlens,
        b,
        t,
    )
    c = torch.empty((b, h, t), dtype=torch.float32)
    out = torch.empty((b, t, h, d), dtype=torch.float32)
    lse = torch.empty((b, h, t), dtype=torch.float32)
    prune = torch.empty((b, h), dtype=torch.float32) if acp is not None else None
    st = (sa[0], sa[1].ctypes.data) if sa is not None else None
    _foxlm.cpu_forward(
        ctx.shape,
        qf.data_ptr(),
        kf.data_ptr(),
        vf.data_ptr(),
        g.data_ptr(),
        st,
        ctx.scale,
        ctx.window,
        (acp, prune.data_ptr()) if prune is not None else None,
        c.data_ptr(),
        out.data_ptr(),
        lse.data_ptr(),
    )
    ctx.is_cuda = False
    ctx.starts = sa
    ctx.dtypes = (q.dtype, k.dtype, v.dtype)
    ctx.save_for_backward(qf, kf, vf, c, out, lse, prune)
    o = out.to(q.dtype)
    return o.transpose(1, 2) if ctx.head_first else o


def _cpu_bwd(torch, ctx, dout):
    qf, kf, vf, c, out, lse, prune = ctx.saved_tensors
    b, h, hkv, t, d = ctx.shape
    do = dout.transpose(1, 2) if ctx.head_first else dout
    do = do.to(torch.float32).contiguous()
    dq, dk, dv = torch.empty_like(qf), torch.empty_like(kf), torch.empty_like(vf)
    dg = torch.empty((b, t, h), dtype=torch.float32)
    sa = ctx.starts
    _foxlm.cpu_backward(
        ctx.shape,
        qf.data_ptr(),
        kf.data_ptr(),
        vf.data_ptr(),
        c.data_ptr(),
        (sa[0], sa[1].ctypes.data) if sa is not None else None,
        ctx.scale,
        ctx.window,
        prune.data_ptr() if prune is not None else None,
        out.data_ptr(),
        do.data_ptr(),
        lse.data_ptr(),
        dq.data_ptr(),
        dk.data_ptr(),
        dv.data_ptr(),
        dg.data_ptr(),
    )
    tq, tk, tv = ctx.dtypes
    dq, dk, dv = dq.to(tq), dk.to(tk), dv.to(tv)
    if ctx.head_first:
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2), dg
    return dq, dk, dv, dg


def forgetting_attention(
    q,
    k,
    v,
    log_fgate,
    scale=None,
    window_size=None,
    cu_seqlens=None,
    *,
    head_first=False,
    seq_start=None,
    sm_scale=None,
    window=None,
    acp=None,
    adaptive_threshold=None,
):
    """Forgetting Attention of torch tensors, differentiable in q, k, v and log_fgate.

    Args:
        q: [B, T, H, D] ([B, H, T, D] with head_first=True); bf16/fp16 on CUDA, any float on CPU.
        k, v: [B, T, H_kv, D] with H_kv dividing H (grouped-query attention).
        log_fgate: [B, T, H] ([B, H, T] with head_first) log forget gates, e.g. logsigmoid of the
            gate logits; computed in float32 (cast here if it is not).
        scale / sm_scale: the logit scale, default 1/sqrt(D) (fla's / the authors' name).
        window_size / window: sliding window w: position i sees keys i - w < j <= i.
        cu_seqlens: packed sequences (fla's varlen): int offsets [N + 1] from 0 to T, batch 1.
        seq_start: left padding (the authors'): [B] ints, row b's keys before seq_start[b] are
            invisible (its padded query rows output 0; the authors' kernel leaves them undefined).
        head_first: the authors' and fla's flag; True swaps the T and H axes of every tensor.
        acp: Adaptive Computation Pruning with log tolerance acp (e.g. -10.0), thresholds from the
            query and key norms per (batch, head).
        adaptive_threshold: the authors' ACP argument; only None is accepted (use acp).
    Returns:
        [B, T, H, D] ([B, H, T, D] with head_first) in q's dtype.
    """
    torch = _torch()
    for name, x in (("q", q), ("k", k), ("v", v), ("log_fgate", log_fgate)):
        if not torch.is_tensor(x):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    b, h, hkv, t, d = _shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape), tuple(log_fgate.shape), head_first)
    _check_layout_args(seq_start, cu_seqlens, b)
    sc = _scale(scale, sm_scale, d)
    w = _window(window, window_size)
    a = _acp(acp, adaptive_threshold)
    if q.device != k.device or q.device != v.device or q.device != log_fgate.device:
        raise ValueError(
            f"q, k, v and log_fgate must be on one device, got {q.device}, {k.device}, {v.device}, {log_fgate.device}"
        )
    # the gate as [B, T, H] float32 contiguous: a small tensor, arranged by torch so autograd
    # carries its gradient back through the transpose and the cast
    g = log_fgate.transpose(1, 2) if head_first else log_fgate
    g = g.to(torch.float32).contiguous()
    return _function().apply(q, k, v, g, bool(head_first), sc, w, a, seq_start, cu_seqlens)
