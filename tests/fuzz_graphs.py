"""Differential fuzzer (issue 8): random small graphs over the public op set, compiled by `aot`
and checked on the real adapter against the reference interpreter and float64 PyTorch autograd.

A `Case` is plain data: leaves (parameters with fixed values, inputs with one value per step),
`nn` modules, a list of `Op` records (`v3 = ops.where(v2, v0, 1.5)` is
`Op(("v3",), "where", ("v2", "v0", 1.5), {})`) and the outputs. `batch_source` prints it as
standalone Python; the checker builds exactly that source, so a failure's reproducer is the
program that failed. Several independent cases are batched into one `Batch` (one Program,
losses summed, names prefixed `g<k>_`) to check more graphs per compile; a batch that does not
compile is split until the failing graph is alone.

Values stay meaningful in float32: while generating, every op is evaluated in float64 and
float32 (PyTorch on the CPU, every step's inputs) and refused when its operands leave the op's
domain (log/sqrt of values below 0.05, divisors near 0), when an output grows past 1e4, or when
a kink or tie (relu/abs at 0, max/argmax/maximum/comparisons, casts to i32 near an integer) is
closer than a margin without being an exact tie in both precisions (exact ties are well defined:
ties split gradients evenly, as in PyTorch). A finished case is refused when its gradients blow up
or when float32 PyTorch is far from float64 (ill-conditioned).

Comparing: every forward output (through `aot.capture` or the Infer entry), every parameter
gradient and the loss, at each of `steps` steps with fresh inputs and cotangents (a stale read of
the previous step's memory shows from step 2), against float64 PyTorch. The tolerance of a tensor
is 2e-3 relative + 1e-4 of its largest magnitude + 50x the float32 PyTorch error of that tensor,
so an ill-conditioned sum cannot fail, and a wrong gradient (zero, stale, misindexed) cannot pass.
The interpreter is held to the same tolerance: when it disagrees too, the bug is in the graph
(VJP or op semantics), otherwise in scheduling, planning or codegen. In SGD batches the updated
parameters are checked after every step as well. Finally step 1 runs again after
`model.reset()` and must give bit-identical results (API.md §5's determinism, and no kernel may
depend on what an earlier step left in scratch memory).

The package runs on two sides (`check(batch, sides=...)`): "gpu", aot.compile on this adapter
with the seed's kernel set, and "wasm", the web target's wasm kernel set (aot/wasm_build.py) run
in node by one shared node process (tests/web_node.py's NodeWorker; the relaxed-SIMD module for
odd seeds), held to the same oracle and tolerances; its failures are of kind "wasm",
"wasm-compile" or "wasm-run".

`generate(seed)` -> Batch, `check(batch)` -> [Failure], `shrink(batch, failure)` -> smaller Batch,
`write_repro(batch, failure, dir)` -> a pytest file that needs only numpy and aot (a wasm
failure's also node and tests/web_node.py).
"""

from __future__ import annotations

import math
import re
import shutil
import sys
import tempfile
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

import fuzz_nn

# ---- case data ----------------------------------------------------------------------------------


@dataclass
class Leaf:
    """A parameter (`kind="param"`, f32, one value), an input (one value per step) or a parameter
    of an `nn` module (`kind="modparam"`, named `<module>.<param>`, loaded with load_params)."""

    name: str
    kind: str
    dtype: str
    shape: tuple
    values: list  # np.float32 / np.int32 arrays; a param's single value serves every step

    def value(self, step: int) -> np.ndarray:
        return self.values[0] if self.kind != "input" else self.values[step]


@dataclass
class Op:
    outs: tuple  # variable names
    op: str  # key of OPS
    args: tuple  # variable names (str) or Python numbers
    kw: dict = field(default_factory=dict)


@dataclass
class Case:
    leaves: dict  # name -> Leaf, in creation order
    modules: dict  # name -> (nn class name, constructor args)
    ops: list
    outputs: list  # variable names
    cts: dict  # f32 output -> [cotangent per step]
    steps: int

    def copy(self) -> Case:
        return Case(dict(self.leaves), dict(self.modules), list(self.ops), list(self.outputs), dict(self.cts), self.steps)


@dataclass
class Batch:
    """Independent cases compiled as one Program. `capture`: outputs are aot.capture'd (which
    stores them); `infer`: a `predict` entry returns them (flattened and concatenated).
    `sgd`: None (gradients only, parameters fixed) or (lr, momentum) for aot.optim.SGD, whose
    updated parameters are checked after every step (predict then runs before each step)."""

    cases: list
    capture: bool = True
    infer: bool = False
    steps: int = 2
    seed: int = 0
    sgd: tuple | None = None

    def prefix(self, k: int) -> str:
        return "" if len(self.cases) == 1 else f"g{k}_"


# ---- the op table: PyTorch semantics and source text ---------------------------------------------

torch = None  # imported on first use: tests that never run the fuzzer should not pay for it


def _torch():
    global torch
    if torch is None:
        import torch as _t

        _t.set_num_threads(1)
        torch = _t
    return torch


def _t(x, like, fdt):
    """A Python number as a tensor of `like`'s dtype (or fdt)."""
    T = _torch()
    if isinstance(x, T.Tensor):
        return x
    dt = like.dtype if like is not None else fdt
    return T.tensor(x, dtype=dt)


def _first_tensor(args):
    T = _torch()
    return next(a for a in args if isinstance(a, T.Tensor))


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(sorted(a % ndim for a in axes))


@dataclass(frozen=True)
class OpSpec:
    src: Callable  # (arg sources, kw, module source) -> Python expression
    torch: Callable  # (args, kw, float dtype) -> tensor or tuple of tensors
    guard: Callable | None = None  # (ins64, ins32, outs64, outs32, kw) -> bool


def _kwsrc(kw, keys):
    return "".join(f", {k}={kw[k]!r}" for k in keys if k in kw)


def _unary_src(name):
    def src(a, kw, mod):
        if name == "neg" and kw.get("infix"):
            return f"-{a[0]}"
        return f"ops.{name}({a[0]}{_kwsrc(kw, ['approximate'])})"

    return src


INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "less": "<", "greater": ">", "matmul": "@", "power": "**"}


def _binary_src(name):
    def src(a, kw, mod):
        if kw.get("infix"):
            return f"{a[0]} {INFIX[name]} {a[1]}"
        return f"ops.{name}({a[0]}, {a[1]})"

    return src


def _bin(f):
    def run(args, kw, fdt):
        like = _first_tensor(args)
        x, y = (_t(a, like, fdt) for a in args)
        return f(x, y, fdt)

    return run


# guards: a value within `margin` of a kink or tie must sit exactly on it in both precisions
def _margin(scale):
    return 1e-3 * (1.0 + scale)


def _clean_kink(d64, d32, scale64):
    """d: distance to the kink/tie (elementwise); True when no element is near but not on it."""
    near = d64.abs() < _margin(scale64)
    if not bool(near.any()):
        return True
    return bool(((d64[near] == 0) & (d32.to(d64.dtype)[near] == 0)).all())


def _g_kink(ins64, ins32, o64, o32, kw):
    x64, x32 = ins64[0], ins32[0]
    return _clean_kink(x64, x32, x64.abs())


def _g_pair(ins64, ins32, o64, o32, kw):
    like = _first_tensor(ins64)
    a64, b64 = (_t(a, like, None) for a in ins64)
    like32 = _first_tensor(ins32)
    a32, b32 = (_t(a, like32, None) for a in ins32)
    if not a64.dtype.is_floating_point:  # i32 comparisons are exact
        return True
    return _clean_kink(a64 - b64, a32 - b32, a64.abs() + b64.abs())


def _g_min(lo):
    def g(ins64, ins32, o64, o32, kw):
        return bool(ins64[0].min() >= lo)

    return g


def _g_nonzero(i):
    def g(ins64, ins32, o64, o32, kw):
        x = ins64[i]
        return bool(x.abs().min() >= 0.05) if hasattr(x, "abs") else abs(x) >= 0.05

    return g


def _g_absmax(hi, i=0):
    def g(ins64, ins32, o64, o32, kw):
        return bool(ins64[i].abs().max() <= hi)

    return g


def _power_guard(ins64, ins32, o64, o32, kw):
    x, p = ins64
    T = _torch()
    if isinstance(x, T.Tensor) and not isinstance(p, T.Tensor):  # x ** number
        if float(p).is_integer() and p > 0:
            return True
        if float(p).is_integer():
            return bool(x.abs().min() >= 0.05)
        return bool(x.min() >= 0.05)
    if isinstance(x, T.Tensor):  # tensor exponent: exp(p * log(x))
        return bool(x.min() >= 0.05) and bool(p.abs().max() <= 3)
    return bool(p.abs().max() <= 6)  # number ** tensor


def _g_reduce_max(axis_of):
    def g(ins64, ins32, o64, o32, kw):
        x64, x32 = ins64[0], ins32[0]
        axes = axis_of(kw, x64.ndim)
        if not axes:
            return True
        m64, m32 = x64.amax(dim=axes, keepdim=True), x32.amax(dim=axes, keepdim=True)
        return _clean_kink(m64 - x64, m32 - x32, x64.abs())

    return g


def _g_argmax(ins64, ins32, o64, o32, kw):
    """argmax: the largest element must stand clear of every other one. An exact tie in PyTorch
    (both precisions) is no tie in a kernel that sums in another order (a mean of softmax rows,
    all 1/n), so any near tie, exact ones included, makes the index float32 noise."""
    x64 = ins64[0]
    axes = _argmax_axes(kw, x64.ndim)
    if not axes:
        return True
    near = (x64.amax(dim=axes, keepdim=True) - x64).abs() < _margin(x64.abs())
    return bool((near.sum(dim=axes) == 1).all())


def _g_cast(ins64, ins32, o64, o32, kw):
    x64, x32 = ins64[0], ins32[0]
    if not x64.dtype.is_floating_point:
        return True
    if bool(x64.abs().max() > 1e6):
        return False
    return _clean_kink(x64 - x64.round(), x32 - x32.round(), x64.abs())


def _g_index(limit_of, i=1):
    def g(ins64, ins32, o64, o32, kw):
        idx = ins64[i]
        return idx.numel() == 0 or (bool(idx.min() >= 0) and bool(idx.max() < limit_of(ins64, kw)))

    return g


def _g_norm(rms):
    def g(ins64, ins32, o64, o32, kw):
        x = ins64[0]
        v = (x * x).mean(-1) if rms else x.var(-1, unbiased=False)
        return bool(v.min() >= 1e-2)

    return g


def _g_pool(ins64, ins32, o64, o32, kw):
    # max_pool2d's gradient goes to one element per window in PyTorch and is split in aot:
    # windows need a single maximum, clear of the others by the margin
    F = _torch().nn.functional
    k, s, p = kw["k"], kw.get("stride") or kw["k"], kw.get("padding", 0)
    k, s, p = ((v, v) if isinstance(v, int) else tuple(v) for v in (k, s, p))

    def windows(x):
        xp = F.pad(x, (p[1], p[1], p[0], p[0]), value=-1e30)
        return xp.unfold(2, k[0], s[0]).unfold(3, k[1], s[1]).flatten(-2)

    w = windows(ins64[0])
    d = w.amax(-1, keepdim=True) - w
    ones = (d == 0).sum(-1)
    return bool((ones == 1).all()) and bool(((d == 0) | (d >= _margin(w.abs().clamp(max=1e4)))).all())


def _reduce_torch(name):
    def run(args, kw, fdt):
        x = args[0]
        axes = _axes(kw.get("axis"), x.ndim)
        keep = kw.get("keepdims", False)
        if not axes:
            return x
        if name == "sum":
            return x.sum(dim=axes, keepdim=keep)
        if name == "mean":
            return x.mean(dim=axes, keepdim=keep)
        return x.amax(dim=axes, keepdim=keep)

    return run


def _reduce_src(name):
    def src(a, kw, mod):
        return f"ops.{name}({a[0]}{_kwsrc(kw, ['axis', 'keepdims'])})"

    return src


def _argmax_torch(args, kw, fdt):
    x = args[0]
    axis, keep = kw.get("axis"), kw.get("keepdims", False)
    if axis is None:
        r = x.reshape(-1).argmax()
        return r.reshape((1,) * x.ndim) if keep else r
    return x.argmax(dim=axis % x.ndim, keepdim=keep)


def _argmax_axes(kw, ndim):
    return _axes(kw.get("axis"), ndim)


def _causal(x):
    T = _torch()
    t = x.shape[-1]
    mask = T.ones(t, t, dtype=T.bool).triu(1)
    return x.masked_fill(mask, float("-inf")).softmax(-1)


def _cross_entropy(args, kw, fdt):
    logits, tgt = args
    nll = -logits.log_softmax(-1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
    red = kw.get("reduction", "mean")
    return nll if red == "none" else (nll.mean() if red == "mean" else nll.sum())


def _split_heads(x, n):
    *lead, t, d = x.shape
    r = len(lead)
    return x.reshape(*lead, t, n, d // n).permute(*range(r), r + 1, r, r + 2)


def _merge_heads(x):
    *lead, n, t, dh = x.shape
    r = len(lead)
    return x.permute(*range(r), r + 1, r, r + 2).reshape(*lead, t, n * dh)


def _rope(args, kw, fdt):
    T = _torch()
    x = args[0]
    t, d = x.shape[-2], x.shape[-1]
    half = d // 2
    inv = float(kw.get("base", 10000.0)) ** (-2.0 * T.arange(half, dtype=fdt) / d)
    ang = T.arange(t, dtype=fdt)[:, None] * inv[None, :]
    c, s = T.cat([ang.cos(), ang.cos()], -1), T.cat([ang.sin(), ang.sin()], -1)
    return x * c + T.cat([-x[..., half:], x[..., :half]], -1) * s


def _attention_probs(q, k, scale, causal):
    T = _torch()
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(T.ones(s.shape[-2:], dtype=T.bool).triu(1), float("-inf"))
    return s.softmax(-1)


_FLASH_BACKWARD = None


def _flash_backward():
    """attention whose backward is computed as fused kernels do (flash attention, aot's): dS =
    P (dO v^T - delta) with delta = rowsum(dO * O) summed apart from dO v^T. Where the softmax
    saturates, the exact dS cancels to ~0 but these two sums round differently in float32, and
    dq, dk carry that rounding times |k|, |q|: far above float32's error of the composed formula
    (the fuzzer's float64 reference), and no bug. The float32 run uses this, so a case's
    float32 error (its tolerance) includes it."""
    global _FLASH_BACKWARD
    if _FLASH_BACKWARD is None:
        T = _torch()

        class FlashBackward(T.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v, scale, causal):
                p = _attention_probs(q, k, scale, causal)
                o = p @ v
                ctx.save_for_backward(q, k, v, p, o)
                ctx.scale = scale
                return o

            @staticmethod
            def backward(ctx, do):
                q, k, v, p, o = ctx.saved_tensors
                # delta summed in sequence, last column first: an order of its own, as in any
                # fused kernel (PyTorch may sum it as it sums dO v^T, exactly cancelling where the
                # kernels do not: seed 64290, attention over one key)
                delta = (do * o).flip(-1).cumsum(-1)[..., -1:]
                ds = p * (do @ v.transpose(-1, -2) - delta)
                dq = (ds @ k) * ctx.scale
                dk = (ds.transpose(-1, -2) @ q) * ctx.scale
                dv = p.transpose(-1, -2) @ do
                return dq.sum_to_size(q.shape), dk.sum_to_size(k.shape), dv.sum_to_size(v.shape), None, None

        _FLASH_BACKWARD = FlashBackward
    return _FLASH_BACKWARD


def _attention(args, kw, fdt):
    T = _torch()
    q, k, v = args
    scale = kw.get("scale") or 1.0 / math.sqrt(q.shape[-1])
    if fdt == T.float32:
        return _flash_backward().apply(q, k, v, scale, bool(kw.get("causal")))
    return _attention_probs(q, k, scale, kw.get("causal")) @ v


def _lstm_seq(args, kw, fdt):
    """ops.lstm_seq: per position t, [h | c | i | f | g | o] of the LSTM step that consumed it."""
    T = _torch()
    xw, w, *state = args
    n = w.shape[1]
    h, c = state if state else (T.zeros(xw.shape[1], n, dtype=xw.dtype),) * 2
    out = [None] * xw.shape[0]
    for s in reversed(range(xw.shape[0])) if kw.get("reverse") else range(xw.shape[0]):
        i, f, g, o = (xw[s] + h @ w.T).split(n, dim=1)
        i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
        c = f * c + i * g
        h = o * c.tanh()
        out[s] = T.cat([h, c, i, f, g, o], dim=1)
    return T.stack(out, 0)


def _module_torch(args, kw, fdt):
    T = _torch()
    cls, x, ps = kw["cls"], args[0], args[1:]
    if cls == "Linear":
        y = x @ ps[0]
        return y + ps[1] if len(ps) > 1 else y
    if cls == "LayerNorm":
        return T.nn.functional.layer_norm(x, (x.shape[-1],), ps[0], ps[1], 1e-5)
    if cls == "RMSNorm":
        return x * T.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * ps[0]
    if cls == "Embedding":
        return ps[0][x]
    raise ValueError(cls)


def _pool_torch(args, kw, fdt):
    T = _torch()
    return T.nn.functional.max_pool2d(args[0], kw["k"], kw.get("stride"), kw.get("padding", 0))


def _conv_torch(args, kw, fdt):
    T = _torch()
    return T.nn.functional.conv2d(args[0], args[1], None, kw.get("stride", 1), kw.get("padding", 0), kw.get("dilation", 1), kw.get("groups", 1))


# Tensor.__getitem__ keys as data: ints, None, "...", ("s", start, stop, step) for a slice, "i"
# for the index tensor (the op's second argument)
def _key_src(key, idx):
    def one(k):
        if isinstance(k, tuple):
            a, b, c = (("" if v is None else str(v)) for v in k[1:])
            return f"{a}:{b}" + (f":{c}" if c else "")
        return {"...": "...", "i": idx, None: "None"}.get(k, repr(k)) if not isinstance(k, int) else repr(k)

    return ", ".join(one(k) for k in key) + ("," if len(key) == 1 else "")


def _getitem_torch(args, kw, fdt):
    def one(k):
        if isinstance(k, tuple):
            return slice(*k[1:])
        return {"...": Ellipsis, "i": args[1].long() if len(args) > 1 else None}[k] if isinstance(k, str) else k

    return args[0][tuple(one(k) for k in kw["key"])]


def _spatial_torch(name):
    def f(args, kw, fdt):
        return getattr(_torch().nn.functional, name)(*args, **kw)

    return f


def _cmp(f):
    return _bin(lambda x, y, fdt: f(x, y).to(fdt))


def _where(args, kw, fdt):
    T = _torch()
    c = args[0]
    like = _first_tensor(args[1:]) if any(isinstance(a, T.Tensor) for a in args[1:]) else c
    a, b = (_t(v, like, fdt) for v in args[1:])
    return T.where(c != 0, a, b)


def _power_torch(args, kw, fdt):
    T = _torch()
    x, p = args
    if not isinstance(x, T.Tensor):
        return T.pow(T.tensor(float(x), dtype=p.dtype), p)
    return x**p


def _power_src(a, kw, mod):
    if kw.get("infix"):
        return f"{a[0]} ** {a[1]}"
    return f"ops.power({a[0]}, {a[1]})"


def _cast_torch(args, kw, fdt):
    T = _torch()
    x = args[0]
    return x.trunc().to(T.int64) if kw["dtype"] == "i32" else x.to(fdt)


def _arange_torch(args, kw, fdt):
    T = _torch()
    return T.arange(kw["n"], dtype=T.int64 if kw.get("dtype", "i32") == "i32" else fdt)


def _split_torch(args, kw, fdt):
    T = _torch()
    return tuple(T.split(args[0], kw["sizes"], dim=kw.get("axis", 0)))


def _split_src(a, kw, mod):
    return f"ops.split({a[0]}, {kw['sizes']!r}, axis={kw.get('axis', 0)!r})"


def _transpose_torch(args, kw, fdt):
    x = args[0]
    axes = kw.get("axes")
    perm = tuple(reversed(range(x.ndim))) if axes is None else tuple(a % x.ndim for a in axes)
    return x.permute(*perm)


def _unary_torch(f):
    return lambda args, kw, fdt: f(args[0])


def _gelu(args, kw, fdt):
    T = _torch()
    return T.nn.functional.gelu(args[0], approximate=kw.get("approximate", "none"))


def _lazy(name):
    """torch.<name> resolved at call time."""
    return lambda x: getattr(_torch(), name)(x)


def _call_src(name, keys=()):
    """ops.<name>(args..., key=value...) for the kwargs in `keys` that the op record has."""
    return lambda a, kw, mod: f"ops.{name}({', '.join(a)}{_kwsrc(kw, keys)})"


def _fn_torch(name, keys=(), rename=None, lib=None):
    """torch.nn.functional.<name> (or torch.<name> with lib="torch") with the record's kwargs
    (aot's names mapped to torch's by `rename`)."""
    def run(args, kw, fdt):
        T = _torch()
        f = getattr(T if lib == "torch" else T.nn.functional, name)
        return f(*args, **{(rename or {}).get(k, k): kw[k] for k in keys if k in kw})

    return run


def _reduce2_torch(name):
    def run(args, kw, fdt):
        T = _torch()
        x = args[0]
        dims = _axes(kw.get("axis"), x.ndim)
        keep = kw.get("keepdims", False)
        if name == "cumsum":
            return x.cumsum(kw["axis"] % x.ndim)
        if name == "norm":
            return T.linalg.vector_norm(x, kw.get("p", 2), dim=dims, keepdim=keep)
        if name == "prod":  # torch.prod takes one dim: multiply them off one by one
            for d in sorted(dims, reverse=True):
                x = x.prod(d, keepdim=True)
            return x if keep else x.reshape([n for i, n in enumerate(args[0].shape) if i not in dims])
        if name == "min":
            return x.amin(dim=dims, keepdim=keep)
        if name == "logsumexp":
            return T.logsumexp(x, dims, keepdim=keep)
        return getattr(T, name)(x, dims, keepdim=keep, correction=kw.get("correction", 1))

    return run


def _nll_torch(logits):
    def run(args, kw, fdt):
        F = _torch().nn.functional
        x, tgt = args[0], args[1]
        c = x.shape[-1]
        w = args[2] if len(args) > 2 else None
        if logits:
            out = F.cross_entropy(x.reshape(-1, c), tgt.reshape(-1), w, ignore_index=kw.get("ignore_index", -100),
                                  reduction=kw.get("reduction", "mean"), label_smoothing=kw.get("label_smoothing", 0.0))
        else:
            out = F.nll_loss(x.reshape(-1, c), tgt.reshape(-1), w, ignore_index=kw.get("ignore_index", -100),
                             reduction=kw.get("reduction", "mean"))
        return out.reshape(tgt.shape) if kw.get("reduction") == "none" else out

    return run


def _g_near(points, i=0, scale=1.0):
    """A kink at each of `points` (of input i, times scale): clear of it or exactly on it."""
    def g(ins64, ins32, o64, o32, kw):
        x64, x32 = ins64[i] * scale, ins32[i] * scale
        return all(_clean_kink(x64 - p, x32 - p, x64.abs()) for p in points(kw))

    return g


def _g_diff(points):
    """Losses of d = input - target with kinks at |d| in `points`."""
    def g(ins64, ins32, o64, o32, kw):
        d64, d32 = ins64[0] - ins64[1], ins32[0] - ins32[1]
        return all(_clean_kink(d64.abs() - p, d32.abs() - p, d64.abs()) for p in points(kw))

    return g


def _g_reduce2(ins64, ins32, o64, o32, kw):
    x64, x32 = ins64[0], ins32[0]
    dims = _axes(kw.get("axis"), x64.ndim)
    if not dims:
        return True
    op = kw["_op"]
    if op == "min":
        return _clean_kink(x64 - x64.amin(dim=dims, keepdim=True), x32 - x32.amin(dim=dims, keepdim=True), x64.abs())
    if op == "std":  # sqrt near 0
        return bool(x64.var(dims, keepdim=False, correction=kw.get("correction", 1)).min() >= 1e-2)
    if op == "norm":
        p = kw.get("p", 2)
        if p == 1:
            return _clean_kink(x64, x32, x64.abs())
        return bool(_torch().linalg.vector_norm(x64, p, dim=dims).min() >= 0.05) and (p >= 1 or bool(x64.abs().min() >= 0.05))
    return True


def _g_cosine(ins64, ins32, o64, o32, kw):
    T = _torch()
    a, b = T.broadcast_tensors(ins64[0], ins64[1])
    d = kw.get("dim", 1)
    return bool(T.linalg.vector_norm(a, dim=d).min() >= 0.1) and bool(T.linalg.vector_norm(b, dim=d).min() >= 0.1)


def _clamp_points(kw):
    return [v for v in (kw.get("min"), kw.get("max")) if v is not None]


OPS: dict[str, OpSpec] = {
    # elementwise unary
    "neg": OpSpec(_unary_src("neg"), _unary_torch(lambda x: -x)),
    "abs": OpSpec(_unary_src("abs"), _unary_torch(lambda x: x.abs()), _g_kink),
    "sqrt": OpSpec(_unary_src("sqrt"), _unary_torch(lambda x: x.sqrt()), _g_min(0.05)),
    "rsqrt": OpSpec(_unary_src("rsqrt"), _unary_torch(lambda x: x.rsqrt()), _g_min(0.05)),
    "exp": OpSpec(_unary_src("exp"), _unary_torch(lambda x: x.exp()), _g_absmax(8.0)),
    "log": OpSpec(_unary_src("log"), _unary_torch(lambda x: x.log()), _g_min(0.05)),
    "square": OpSpec(_unary_src("square"), _unary_torch(lambda x: x.square())),
    "sin": OpSpec(_unary_src("sin"), _unary_torch(lambda x: x.sin()), _g_absmax(30.0)),
    "cos": OpSpec(_unary_src("cos"), _unary_torch(lambda x: x.cos()), _g_absmax(30.0)),
    "tanh": OpSpec(_unary_src("tanh"), _unary_torch(lambda x: x.tanh())),
    "sigmoid": OpSpec(_unary_src("sigmoid"), _unary_torch(lambda x: x.sigmoid())),
    "relu": OpSpec(_unary_src("relu"), _unary_torch(lambda x: x.relu()), _g_kink),
    "gelu": OpSpec(_unary_src("gelu"), _gelu),
    "silu": OpSpec(_unary_src("silu"), _unary_torch(lambda x: x * x.sigmoid())),
    "erf": OpSpec(_unary_src("erf"), _unary_torch(_lazy("erf"))),
    "stop_gradient": OpSpec(_unary_src("stop_gradient"), _unary_torch(lambda x: x.detach())),
    "power": OpSpec(_power_src, _power_torch, _power_guard),
    # elementwise binary (NumPy broadcasting, numbers on either side)
    "add": OpSpec(_binary_src("add"), _bin(lambda x, y, f: x + y)),
    "sub": OpSpec(_binary_src("sub"), _bin(lambda x, y, f: x - y)),
    "mul": OpSpec(_binary_src("mul"), _bin(lambda x, y, f: x * y)),
    "div": OpSpec(_binary_src("div"), _bin(lambda x, y, f: x / y), _g_nonzero(1)),
    "maximum": OpSpec(_binary_src("maximum"), _bin(lambda x, y, f: _torch().maximum(x, y)), _g_pair),
    "minimum": OpSpec(_binary_src("minimum"), _bin(lambda x, y, f: _torch().minimum(x, y)), _g_pair),
    "less": OpSpec(_binary_src("less"), _cmp(lambda x, y: x < y), _g_pair),
    "greater": OpSpec(_binary_src("greater"), _cmp(lambda x, y: x > y), _g_pair),
    "where": OpSpec(lambda a, kw, mod: f"ops.where({a[0]}, {a[1]}, {a[2]})", _where),
    # reductions
    "sum": OpSpec(_reduce_src("sum"), _reduce_torch("sum")),
    "mean": OpSpec(_reduce_src("mean"), _reduce_torch("mean")),
    "max": OpSpec(_reduce_src("max"), _reduce_torch("max"), _g_reduce_max(_argmax_axes)),
    "argmax": OpSpec(_reduce_src("argmax"), _argmax_torch, _g_argmax),
    # layout
    "reshape": OpSpec(lambda a, kw, mod: f"ops.reshape({a[0]}, {kw['shape']!r})", lambda a, kw, f: a[0].reshape(kw["shape"])),
    "transpose": OpSpec(
        lambda a, kw, mod: f"ops.transpose({a[0]}{_kwsrc(kw, ['axes'])})" if kw.get("axes") is not None else f"ops.transpose({a[0]})",
        _transpose_torch,
    ),
    "swapaxes": OpSpec(lambda a, kw, mod: f"ops.swapaxes({a[0]}, {kw['a']}, {kw['b']})", lambda a, kw, f: a[0].transpose(kw["a"], kw["b"])),
    "broadcast_to": OpSpec(
        lambda a, kw, mod: f"ops.broadcast_to({a[0]}, {kw['shape']!r})", lambda a, kw, f: a[0].expand(*kw["shape"]) if kw["shape"] else a[0]
    ),
    "concat": OpSpec(lambda a, kw, mod: f"ops.concat([{', '.join(a)}], axis={kw['axis']})", lambda a, kw, f: _torch().cat(a, kw["axis"])),
    "stack": OpSpec(lambda a, kw, mod: f"ops.stack([{', '.join(a)}], axis={kw['axis']})", lambda a, kw, f: _torch().stack(a, kw["axis"])),
    "split": OpSpec(_split_src, _split_torch),
    "narrow": OpSpec(
        lambda a, kw, mod: f"ops.narrow({a[0]}, {kw['axis']}, {kw['start']}, {kw['length']})",
        lambda a, kw, f: a[0].narrow(kw["axis"], kw["start"], kw["length"]),
    ),
    # linear algebra
    "matmul": OpSpec(_binary_src("matmul"), lambda a, kw, f: a[0] @ a[1]),
    # indexing and casting
    "cast": OpSpec(lambda a, kw, mod: f"ops.cast({a[0]}, {kw['dtype']!r})", _cast_torch, _g_cast),
    "one_hot": OpSpec(
        lambda a, kw, mod: f"ops.one_hot({a[0]}, {kw['depth']})",
        lambda a, kw, f: _torch().nn.functional.one_hot(a[0], kw["depth"]).to(f),
        _g_index(lambda ins, kw: kw["depth"], 0),
    ),
    "arange": OpSpec(lambda a, kw, mod: f"ops.arange({kw['n']}{_kwsrc(kw, ['dtype'])})", _arange_torch),
    "embedding": OpSpec(
        lambda a, kw, mod: f"ops.embedding({a[0]}, {a[1]})", lambda a, kw, f: a[0][a[1]], _g_index(lambda ins, kw: ins[0].shape[0])
    ),
    "take_along_axis": OpSpec(
        lambda a, kw, mod: f"ops.take_along_axis({a[0]}, {a[1]}, {kw['axis']})",
        lambda a, kw, f: _torch().gather(a[0], kw["axis"] % a[0].ndim, a[1]),
        _g_index(lambda ins, kw: ins[0].shape[kw["axis"]]),
    ),
    # ML composites and modules
    "softmax": OpSpec(lambda a, kw, mod: f"ops.softmax({a[0]}{_kwsrc(kw, ['axis'])})", lambda a, kw, f: a[0].softmax(kw.get("axis", -1))),
    "log_softmax": OpSpec(
        lambda a, kw, mod: f"ops.log_softmax({a[0]}{_kwsrc(kw, ['axis'])})", lambda a, kw, f: a[0].log_softmax(kw.get("axis", -1))
    ),
    "softmax_causal": OpSpec(lambda a, kw, mod: f"ops.softmax_causal({a[0]})", lambda a, kw, f: _causal(a[0])),
    "cross_entropy": OpSpec(
        lambda a, kw, mod: f"ops.cross_entropy({a[0]}, {a[1]}{_kwsrc(kw, ['reduction'])})",
        _cross_entropy,
        _g_index(lambda ins, kw: ins[0].shape[-1]),
    ),
    "conv2d": OpSpec(lambda a, kw, mod: f"ops.conv2d({a[0]}, {a[1]}{_kwsrc(kw, ['stride', 'padding', 'groups', 'dilation'])})", _conv_torch),
    # spatial ops and indexing (aot/ops/spatial.py, convs.py, indexing.py)
    "getitem": OpSpec(lambda a, kw, mod: f"{a[0]}[{_key_src(kw['key'], a[1] if len(a) > 1 else None)}]", _getitem_torch,
                      lambda ins64, ins32, o64, o32, kw: len(ins64) < 2 or _g_index(lambda ins, kw: kw["high"])(ins64, ins32, o64, o32, kw)),
    "pad": OpSpec(lambda a, kw, mod: f"ops.pad({a[0]}{_kwsrc(kw, ['pad', 'mode', 'value'])})", _spatial_torch("pad")),
    "avg_pool2d": OpSpec(lambda a, kw, mod: f"ops.avg_pool2d({a[0]}{_kwsrc(kw, ['kernel_size', 'stride', 'padding', 'ceil_mode', 'count_include_pad'])})",
                         _spatial_torch("avg_pool2d")),
    "adaptive_avg_pool2d": OpSpec(lambda a, kw, mod: f"ops.adaptive_avg_pool2d({a[0]}{_kwsrc(kw, ['output_size'])})",
                                  _spatial_torch("adaptive_avg_pool2d")),
    "interpolate": OpSpec(lambda a, kw, mod: f"ops.interpolate({a[0]}{_kwsrc(kw, ['size', 'scale_factor', 'mode', 'align_corners'])})",
                          _spatial_torch("interpolate")),
    "conv1d": OpSpec(lambda a, kw, mod: f"ops.conv1d({', '.join(a)}{_kwsrc(kw, ['stride', 'padding', 'dilation', 'groups'])})",
                     _spatial_torch("conv1d")),
    "conv_transpose2d": OpSpec(
        lambda a, kw, mod: f"ops.conv_transpose2d({', '.join(a)}{_kwsrc(kw, ['stride', 'padding', 'output_padding', 'groups', 'dilation'])})",
        _spatial_torch("conv_transpose2d")),
    "max_pool2d": OpSpec(lambda a, kw, mod: f"ops.max_pool2d({a[0]}{_kwsrc(kw, ['k', 'stride', 'padding'])})", _pool_torch, _g_pool),
    "split_heads": OpSpec(lambda a, kw, mod: f"nn.split_heads({a[0]}, {kw['n']})", lambda a, kw, f: _split_heads(a[0], kw["n"])),
    "merge_heads": OpSpec(lambda a, kw, mod: f"nn.merge_heads({a[0]})", lambda a, kw, f: _merge_heads(a[0])),
    "rope": OpSpec(lambda a, kw, mod: f"ops.rope({a[0]}{_kwsrc(kw, ['base'])})", _rope),
    "attention": OpSpec(lambda a, kw, mod: f"ops.attention({a[0]}, {a[1]}, {a[2]}{_kwsrc(kw, ['causal', 'scale'])})", _attention),
    "lstm_seq": OpSpec(lambda a, kw, mod: f"ops.lstm_seq({', '.join(a)}{_kwsrc(kw, ['reverse'])})", _lstm_seq),
    # activations, reductions and losses beyond API.md §2 (aot/ops/activations.py, reductions.py, losses.py)
    "leaky_relu": OpSpec(_call_src("leaky_relu", ["negative_slope"]), _fn_torch("leaky_relu", ["negative_slope"]), _g_kink),
    "elu": OpSpec(_call_src("elu", ["alpha"]), _fn_torch("elu", ["alpha"]), _g_kink),
    "softplus": OpSpec(_call_src("softplus", ["beta", "threshold"]), _fn_torch("softplus", ["beta", "threshold"]),
                       _g_near(lambda kw: [kw.get("threshold", 20.0) / kw.get("beta", 1.0)])),
    "mish": OpSpec(_call_src("mish"), _fn_torch("mish")),
    "hardswish": OpSpec(_call_src("hardswish"), _fn_torch("hardswish"), _g_near(lambda kw: [-3.0, 3.0])),
    "hardsigmoid": OpSpec(_call_src("hardsigmoid"), _fn_torch("hardsigmoid"), _g_near(lambda kw: [-3.0, 3.0])),
    "logsigmoid": OpSpec(_call_src("logsigmoid"), _fn_torch("logsigmoid")),
    "clamp": OpSpec(_call_src("clamp", ["min", "max"]), _fn_torch("clamp", ["min", "max"], lib="torch"), _g_near(_clamp_points)),
    "log1p": OpSpec(_call_src("log1p"), _fn_torch("log1p", lib="torch"), _g_min(-0.95)),
    "expm1": OpSpec(_call_src("expm1"), _fn_torch("expm1", lib="torch"), _g_absmax(8.0)),
    **{n: OpSpec(_call_src(n, ["axis", "keepdims", "correction", "p"]), _reduce2_torch(n), _g_reduce2)
       for n in ("logsumexp", "var", "std", "min", "prod", "norm")},
    "cumsum": OpSpec(_call_src("cumsum", ["axis"]), _reduce2_torch("cumsum")),
    "nll_loss": OpSpec(_call_src("nll_loss", ["ignore_index", "reduction"]), _nll_torch(False),
                       _g_index(lambda ins, kw: ins[0].shape[-1])),
    "cross_entropy2": OpSpec(lambda a, kw, mod: f"ops.cross_entropy({', '.join(a[:2])}{_kwsrc(kw, ['reduction'])}"
                             f"{', weight=' + a[2] if len(a) > 2 else ''}{_kwsrc(kw, ['ignore_index', 'label_smoothing'])})",
                             _nll_torch(True), _g_index(lambda ins, kw: ins[0].shape[-1])),
    "binary_cross_entropy": OpSpec(_call_src("binary_cross_entropy", ["reduction"]), _fn_torch("binary_cross_entropy", ["reduction"]),
                                   lambda ins64, ins32, o64, o32, kw: bool(ins64[0].min() >= 0.05) and bool(ins64[0].max() <= 0.95)),
    "binary_cross_entropy_with_logits": OpSpec(_call_src("binary_cross_entropy_with_logits", ["reduction"]),
                                               _fn_torch("binary_cross_entropy_with_logits", ["reduction"])),
    "mse_loss": OpSpec(_call_src("mse_loss", ["reduction"]), _fn_torch("mse_loss", ["reduction"])),
    "l1_loss": OpSpec(_call_src("l1_loss", ["reduction"]), _fn_torch("l1_loss", ["reduction"]), _g_diff(lambda kw: [0.0])),
    "smooth_l1_loss": OpSpec(_call_src("smooth_l1_loss", ["reduction", "beta"]), _fn_torch("smooth_l1_loss", ["reduction", "beta"]),
                             _g_diff(lambda kw: [0.0, kw.get("beta", 1.0)])),
    "huber_loss": OpSpec(_call_src("huber_loss", ["reduction", "delta"]), _fn_torch("huber_loss", ["reduction", "delta"]),
                         _g_diff(lambda kw: [kw.get("delta", 1.0)])),
    "kl_div": OpSpec(_call_src("kl_div", ["reduction", "log_target"]), _fn_torch("kl_div", ["reduction", "log_target"])),
    "cosine_similarity": OpSpec(_call_src("cosine_similarity", ["dim"]), _fn_torch("cosine_similarity", ["dim"]), _g_cosine),
    "module": OpSpec(lambda a, kw, mod: f"{mod}({a[0]})", _module_torch),
    # torch.nn modules with torch.nn as the oracle (tests/fuzz_nn.py)
    "nnmod": OpSpec(fuzz_nn.nnmod_src, fuzz_nn.nnmod_torch, fuzz_nn.guard),
}

MODULE_GUARDS = {"LayerNorm": _g_norm(False), "RMSNorm": _g_norm(True)}
LIMIT = 1e4  # largest magnitude of any value or gradient a case may have


# ---- evaluation in PyTorch (float64 and float32) ------------------------------------------------


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _op_ok(op: Op, ins64, ins32, outs64, outs32) -> bool:
    for o64, o32 in zip(outs64, outs32):
        if o64.dtype.is_floating_point:
            if not bool(o64.isfinite().all()) or (o64.numel() and bool(o64.abs().max() > LIMIT)):
                return False
        elif not _torch().equal(o64, o32.to(o64.dtype)):
            return False  # an index or cast that float32 rounding would flip
    guard = MODULE_GUARDS.get(op.kw.get("cls")) if op.op == "module" else OPS[op.op].guard
    return guard is None or guard(ins64, ins32, outs64, outs32, op.kw)


@dataclass
class CaseRun:
    """PyTorch's view of a case, per step: float64 outputs, gradients and loss, float32's error
    against them (largest over steps), and every variable's float64 value (for shrinking)."""

    outs: list  # [{output: array}]
    grads: list  # [{param: array}]
    loss: list  # [float]
    err: dict  # output or param name -> max |f32 - f64| over steps
    vals: list  # [{variable: array}]
    params: list = field(default_factory=list)  # [{param: value at step s}] (+ after the last step)
    zero_tol: dict = field(default_factory=dict)  # param -> tolerance where its gradient is exactly 0
    # cases with buffers (BatchNorm): their float64 values, initial then after each step, by
    # "<module>.<buffer>"; float32's error is err["buf:<name>"]
    buffers: list = field(default_factory=list)
    # modal cases (BatchNorm): the infer entry's outputs at each step (eval mode, the running
    # statistics and parameters `predict` sees then); float32's error is err["eval:<output>"]
    eval_outs: list = field(default_factory=list)
    # SGD batches: per step, how far 1-ulp noise in the leaves moves each value (trajectory_spread)
    spread: list | None = None


def _leaf_tensor(leaf: Leaf, step: int, fdt):
    T = _torch()
    v = T.from_numpy(np.array(leaf.value(step)))
    if leaf.dtype == "i32":
        return v.to(T.int64)
    v = v.to(fdt)
    return v.requires_grad_(True) if leaf.kind != "input" else v


def eval_op(op: Op, env: dict, fdt, state: dict | None = None, eval_mode: bool = False):
    """The op's arguments and outputs in PyTorch. `state`: module name -> its buffers (torch
    tensors that a training-mode BatchNorm updates in place); eval_mode: torch's module.eval()."""
    args = [env[a] if isinstance(a, str) else a for a in op.args]
    kw = op.kw
    if op.op == "nnmod" and (state is not None or eval_mode):
        kw = dict(kw, _state=None if state is None else state.get(kw["mod"]), _eval=eval_mode)
    return args, _as_tuple(OPS[op.op].torch(args, kw, fdt))


def stateful(case: Case) -> list:
    """The case's nnmod ops that own buffers (BatchNorm with track_running_stats)."""
    return [op for op in case.ops if op.op == "nnmod" and op.kw.get("bufs")]


def modal(case: Case) -> bool:
    """Whether an infer entry computes something else than the training forward (BatchNorm)."""
    return any(op.op == "nnmod" and op.kw["cls"].startswith("BatchNorm") for op in case.ops)


def run_case(case: Case, check: bool = True, sgd: tuple | None = None) -> CaseRun | None:
    """Evaluate a case; with check, None when an op leaves its domain or the case is ill-conditioned.
    With sgd = (lr, momentum), parameters follow torch.optim.SGD's updates from step to step
    (`CaseRun.params[s]`: the values at step s; one more entry: after the last step)."""
    T = _torch()
    params = [n for n, l in case.leaves.items() if l.kind != "input"]
    run = CaseRun([], [], [], {}, [])
    run.params = [{n: case.leaves[n].values[0] for n in params}]
    momentum_buf: dict = {}
    states = {fdt: {op.kw["mod"]: fuzz_nn.init_state(op.kw, fdt) for op in stateful(case)} for fdt in (T.float64, T.float32)}
    has_modes = modal(case)

    def leaves_at(s, fdt):
        env = {n: _leaf_tensor(l, s, fdt) for n, l in case.leaves.items()}
        if s and sgd is not None:
            for n in params:
                env[n] = T.from_numpy(np.array(run.params[s][n])).to(fdt).requires_grad_(True)
        return env

    def snapshot():
        out = {}
        for mod, bufs in states[T.float64].items():
            for b, v in bufs.items():
                out[f"{mod}.{b}"] = v.numpy().astype(np.int32 if not v.dtype.is_floating_point else np.float64)
                if v.dtype.is_floating_point:
                    e = float(np.max(np.abs(states[T.float32][mod][b].numpy().astype(np.float64) - out[f"{mod}.{b}"])))
                    run.err["buf:" + f"{mod}.{b}"] = max(run.err.get("buf:" + f"{mod}.{b}", 0.0), e)
        return out

    def eval_pass(s) -> bool:
        """The infer entry's view at step s (eval mode, the buffers as they are now)."""
        res = {}
        with T.no_grad():
            for fdt in (T.float64, T.float32):
                env = leaves_at(s, fdt)
                for op in case.ops:
                    env.update(zip(op.outs, eval_op(op, env, fdt, states[fdt], eval_mode=True)[1]))
                res[fdt] = {o: env[o].detach().numpy() for o in case.outputs}
        run.eval_outs.append(res[T.float64])
        for o, v64 in res[T.float64].items():
            v32 = res[T.float32][o]
            err = float(np.max(np.abs(v32.astype(np.float64) - v64))) if v64.size and v64.dtype.kind == "f" else 0.0
            run.err["eval:" + o] = max(run.err.get("eval:" + o, 0.0), err)
            big = float(np.max(np.abs(v64))) if v64.size and v64.dtype.kind == "f" else 0.0
            if check and (not np.all(np.isfinite(v64)) or big > LIMIT or err > 1e-4 * big + 1e-5):
                return False
        return True

    run.buffers.append(snapshot())
    for s in range(case.steps):
        if has_modes and sgd is not None and not eval_pass(s):  # predict runs before the step
            return None
        envs = {fdt: leaves_at(s, fdt) for fdt in (T.float64, T.float32)}
        for op in case.ops:
            try:
                a64, o64 = eval_op(op, envs[T.float64], T.float64, states[T.float64])
                a32, o32 = eval_op(op, envs[T.float32], T.float32, states[T.float32])
            except (RuntimeError, IndexError):
                # an index that was in range when the graph was drawn left it at a later step, the
                # parameters having moved under SGD (seed 61497: one_hot of an argmax): no case
                if check:
                    return None
                raise
            if check:
                with T.no_grad():
                    d = lambda xs: [x.detach() if isinstance(x, T.Tensor) else x for x in xs]  # noqa: E731
                    if not _op_ok(op, d(a64), d(a32), d(o64), d(o32)):
                        return None
            envs[T.float64].update(zip(op.outs, o64))
            envs[T.float32].update(zip(op.outs, o32))
        res = {}
        for fdt, env in envs.items():
            loss = T.zeros((), dtype=fdt)
            for o in case.outputs:
                if o in case.cts:
                    if check and tuple(env[o].shape) != np.shape(case.cts[o][s]):
                        return None  # a shrinking step changed an output's shape
                    loss = loss + (env[o] * T.from_numpy(np.asarray(case.cts[o][s])).to(fdt)).sum()
            ps = [env[p] for p in params]
            if loss.requires_grad and ps:
                gs = T.autograd.grad(loss, ps, allow_unused=True)
            else:
                gs = [None] * len(ps)
            grads = {p: (g if g is not None else T.zeros_like(env[p])).detach().numpy() for p, g in zip(params, gs)}
            outs = {o: env[o].detach().numpy() for o in case.outputs}
            res[fdt] = (outs, grads, float(loss.detach()))
        (o64, g64, l64), (o32, g32, l32) = res[T.float64], res[T.float32]
        if sgd is not None:
            lr, mu = sgd
            new = {}
            for n in params:
                d = g64[n]
                if mu:
                    d = momentum_buf[n] = d if s == 0 else mu * momentum_buf[n] + d
                # the package keeps float32 parameters: the next step starts from the rounded values
                new[n] = np.asarray(run.params[s][n].astype(np.float64) - lr * d, dtype=np.float32)
            run.params.append(new)
        else:
            run.params.append(run.params[s])
        run.buffers.append(snapshot())
        if has_modes and sgd is None and not eval_pass(s):  # predict runs after the step
            return None
        run.outs.append(o64)
        run.grads.append(g64)
        run.loss.append(l64)
        run.vals.append({n: v.detach().numpy() for n, v in envs[T.float64].items()})
        # A gradient whose exact value cancels to 0 still carries the float32 rounding of the
        # cotangents it is summed from: attention over a single key has p (dp - sum(p dp)) = 0,
        # exact in float64 and in PyTorch's float32, while the fused kernels sum dp and the row's
        # dO . O apart. Where a gradient is exactly 0 it may so be off by 1e-5 of the largest one.
        g_scale = max([float(np.max(np.abs(v))) for v in g64.values() if v.size and v.dtype.kind == "f"] + [0.0])
        for n in g64:
            if np.isfinite(g_scale):
                run.zero_tol[n] = max(run.zero_tol.get(n, 0.0), 1e-5 * g_scale)
        for name, v64, v32 in [(n, o64[n], o32[n]) for n in o64] + [(n, g64[n], g32[n]) for n in g64]:
            if v64.dtype.kind in "iu":
                run.err[name] = 0.0
                continue
            err = float(np.max(np.abs(v32.astype(np.float64) - v64))) if v64.size else 0.0
            run.err[name] = max(run.err.get(name, 0.0), err)
            if check:
                big = float(np.max(np.abs(v64))) if v64.size else 0.0
                if not np.all(np.isfinite(v64)) or big > LIMIT or err > 1e-4 * big + 1e-5:
                    return None
    return run


# A training trajectory's sensitivity to float32 rounding, measured as the optim area measures it
# (fuzz_areas.optim_tolerance): float64 runs of the case from leaves moved by 1 ulp (each element
# up, down or kept, at random), NOISE_DRAWS of them; where SGD's steps turn that noise into more
# (an ill-conditioned reversed lstm_seq: 1-ulp input noise moves the first gradient by 3e-4..1.3e-3,
# ten times that a step, graph seed 5310426), aot's trajectory, whose kernels round differently,
# may land NOISE_SPREAD times as far off. float32 torch's spread, the tolerance otherwise, starts
# each step from the same parameters as float64 and happened to agree with it there.
NOISE_DRAWS, NOISE_SPREAD = 2, 10.0


def ulp_noise(case: Case, seed: int) -> Case:
    """The case with every finite float32 leaf element moved by -1, 0 or +1 ulp at random."""
    rng = np.random.default_rng([97, seed])
    out = case.copy()
    for n, l in case.leaves.items():
        if l.dtype != "f32":
            continue
        vals = []
        for v in l.values:
            v = np.asarray(v, np.float32)
            with np.errstate(invalid="ignore"):
                moved = (v.astype(np.float64) + rng.integers(-1, 2, v.shape) * np.spacing(v).astype(np.float64)).astype(np.float32)
            vals.append(np.where(np.isfinite(v), moved, v).astype(np.float32))
        out.leaves[n] = replace(l, values=vals)
    return out


def trajectory_spread(case: Case, sgd: tuple, run: CaseRun) -> list[dict]:
    """Per step, {name: largest |noisy - float64|} over NOISE_DRAWS runs from ulp_noise leaves, for
    outputs, gradients, "param:<name>" (after the update), "eval:<output>", "buf:<name>" and "loss"
    (inf where a noisy run is not finite: nothing can be judged there). Cached on the run."""
    if run.spread is not None:
        return run.spread
    out = [{} for _ in range(case.steps)]

    def note(s, name, a, b):
        a, b = np.asarray(a), np.asarray(b)
        if b.dtype.kind != "f" or not b.size or a.shape != b.shape:
            return
        with np.errstate(invalid="ignore", over="ignore"):
            e = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
        out[s][name] = max(out[s].get(name, 0.0), e if math.isfinite(e) else math.inf)

    for d in range(NOISE_DRAWS):
        try:
            with np.errstate(all="ignore"):
                other = run_case(ulp_noise(case, d), check=False, sgd=sgd)
        except (RuntimeError, IndexError):  # an index left its range on the moved trajectory
            continue
        for s in range(case.steps):
            for o, v in run.outs[s].items():
                note(s, o, other.outs[s][o], v)
            for n, v in run.grads[s].items():
                note(s, n, other.grads[s][n], v)
                note(s, "param:" + n, other.params[s + 1][n], run.params[s + 1][n])
            for o, v in (run.eval_outs[s].items() if s < len(run.eval_outs) else ()):
                note(s, "eval:" + o, other.eval_outs[s][o], v)
            for b, v in (run.buffers[s + 1].items() if s + 1 < len(run.buffers) else ()):
                note(s, "buf:" + b, other.buffers[s + 1][b], v)
            note(s, "loss", other.loss[s], run.loss[s])
    run.spread = out
    return out


def noise_extra(batch: Batch, run: CaseRun, case: Case, s: int, name: str) -> float:
    """What a GPU trajectory's value at step s may add to the tolerance: NOISE_SPREAD times its
    spread under 1-ulp noise (SGD batches; 0 otherwise)."""
    if batch.sgd is None:
        return 0.0
    return NOISE_SPREAD * trajectory_spread(case, batch.sgd, run)[s].get(name, 0.0)


# ---- the generator ------------------------------------------------------------------------------


class Skip(Exception):
    """An action that does not fit the current graph."""


SCALARS = (0.5, 2.0, -1.5, 3.5, 0.25, 1.0, -0.75, 2, -1, 3)
RANK_P = (0.06, 0.24, 0.34, 0.24, 0.12)  # ranks 0..4


def _factor(n: int) -> list[int]:
    out, d = [], 2
    while d * d <= n:
        while n % d == 0:
            out.append(d)
            n //= d
        d += 1
    return out + ([n] if n > 1 else [])


def _bshape(*shapes) -> tuple:
    return tuple(np.broadcast_shapes(*shapes))


class Gen:
    """Grows one case op by op, evaluating every op on every step as it goes."""

    # sizes that reach multi-workgroup reductions, several matmul tiles and split-K tiles
    BIG_DIMS = (17, 33, 64, 100, 130, 300)

    def __init__(self, rng: np.random.Generator, steps: int, big: bool = False):
        self.rng, self.steps, self.big = rng, steps, big
        self.max_size = 4096 if big else 256  # elements of a new leaf
        self.max_out = 8192 if big else 1024  # elements of an op's output
        self.leaves: dict[str, Leaf] = {}
        self.modules: dict[str, tuple] = {}
        self.ops: list[Op] = []
        self.v64: dict[str, list] = {}
        self.v32: dict[str, list] = {}
        self.order: list[str] = []  # variables (leaves and op outputs), oldest first
        self.count = 0

    # -- helpers --------------------------------------------------------------------------------
    def _name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}{self.count - 1}"

    def shape(self, v) -> tuple:
        return tuple(self.v64[v][0].shape)

    def dtype(self, v) -> str:
        return "f32" if self.v64[v][0].dtype.is_floating_point else "i32"

    def all(self, v, pred) -> bool:
        # an empty tensor (a zero-size dim) holds no element against the predicate
        return all(x.numel() == 0 or bool(pred(x)) for x in self.v64[v])

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def choice(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def dim(self, lo: int = 1, hi: int = 6) -> int:
        if self.big and hi >= 6 and self.chance(0.2):
            return self.choice(self.BIG_DIMS)
        return 1 if lo <= 1 and self.chance(0.2) else int(self.rng.integers(max(lo, 2), hi + 1))

    def rand_shape(self, rank: int | None = None, max_size: int | None = None) -> tuple:
        if rank is None:
            rank = int(self.rng.choice(5, p=RANK_P))
        while True:
            s = tuple(self.dim() for _ in range(rank))
            if math.prod(s) <= (max_size or self.max_size):
                return s

    def leaf(self, shape, dtype="f32", domain="real", kind=None, high=4) -> str:
        shape = tuple(int(d) for d in shape)
        if kind is None:
            kind = "input" if dtype == "i32" or self.chance(0.15) else "param"
        if kind == "input" and 0 in shape:
            # a Program's input specs have positive dims (aot.f32/i32 refuse 0: seeds 5300278, 5300289)
            raise Skip("an empty input")
        name = self._name({"param": "p", "input": "i" if dtype == "i32" else "x"}.get(kind, "w"))
        n = self.steps if kind == "input" else 1
        values = [self.sample(shape, dtype, domain, high) for _ in range(n)]
        self.add_leaf(Leaf(name, kind, dtype, shape, values))
        return name

    def add_leaf(self, leaf: Leaf):
        T = _torch()
        self.leaves[leaf.name] = leaf
        for store, fdt in ((self.v64, T.float64), (self.v32, T.float32)):
            store[leaf.name] = [_leaf_tensor(leaf, s, fdt).detach() for s in range(self.steps)]
        if leaf.kind != "modparam":
            self.order.append(leaf.name)

    def sample(self, shape, dtype, domain, high) -> np.ndarray:
        r = self.rng
        if dtype == "i32":
            return r.integers(0, high, size=shape).astype(np.int32)
        if domain == "positive":
            v = r.uniform(0.5, 2.0, shape)
        elif domain == "nonzero":
            v = r.uniform(0.25, 2.0, shape) * r.choice([-1.0, 1.0], shape)
        elif domain == "small":
            v = r.uniform(-1.0, 1.0, shape)
        elif domain == "gain":
            v = r.uniform(0.5, 1.5, shape)
        elif domain == "prob":
            v = r.uniform(0.1, 0.9, shape)
        else:
            v = r.uniform(-2.0, 2.0, shape)
        return np.asarray(v, dtype=np.float32)

    def emit(self, op: str, args: tuple, kw: dict | None = None, n_out: int = 1):
        """Add an op when PyTorch accepts it and every step keeps it in its domain; Skip otherwise."""
        T = _torch()
        kw = dict(kw or {})
        outs = tuple(self._name("v") for _ in range(n_out))
        rec = Op(outs, op, tuple(args), kw)
        r64, r32 = [], []
        try:
            with T.no_grad():
                for s in range(self.steps):
                    e64 = {a: self.v64[a][s] for a in args if isinstance(a, str)}
                    e32 = {a: self.v32[a][s] for a in args if isinstance(a, str)}
                    a64, o64 = eval_op(rec, e64, T.float64)
                    a32, o32 = eval_op(rec, e32, T.float32)
                    if len(o64) != n_out or not _op_ok(rec, a64, a32, o64, o32):
                        raise Skip(op)
                    if any(o.numel() > self.max_out for o in o64):
                        raise Skip(op)
                    r64.append(o64)
                    r32.append(o32)
        except (RuntimeError, IndexError, ValueError, TypeError) as e:
            raise Skip(f"{op}: {e}") from None
        self.ops.append(rec)
        for i, o in enumerate(outs):
            self.v64[o] = [r[i] for r in r64]
            self.v32[o] = [r[i] for r in r32]
            self.order.append(o)
        return outs if n_out > 1 else outs[0]

    def pick(self, pred=lambda v: True, new=None, p_new=0.2):
        """A variable satisfying pred (recent ones more often), or `new()` (sometimes, or when none does)."""
        cands = [v for v in self.order if pred(v)]
        if cands and (new is None or not self.chance(p_new)):
            # chains: mostly the newest result; fan-out: any older variable
            recent = [v for v in cands if v not in self.leaves]
            if recent and self.chance(0.5):
                return recent[-1]
            w = np.arange(1, len(cands) + 1, dtype=np.float64)
            return cands[int(self.rng.choice(len(cands), p=w / w.sum()))]
        if new is None:
            raise Skip("no operand")
        return new()

    def f32(self, v) -> bool:
        return self.dtype(v) == "f32"

    def partner(self, shape: tuple) -> tuple:
        """A shape that broadcasts with `shape`: fewer leading dims, 1s, expanded 1s, extra leading dims."""
        s = list(shape)
        if s and self.chance(0.3):
            s = s[int(self.rng.integers(1, len(s) + 1)) :]
        for i, d in enumerate(s):
            if d == 1 and self.chance(0.4):
                s[i] = self.dim(2, 4)
            elif d > 1 and self.chance(0.3):
                s[i] = 1
        if len(s) < 4 and self.chance(0.2):
            s = [self.dim(1, 3)] + s
        return tuple(s)

    def compatible(self, shape):
        def ok(v):
            try:
                return math.prod(_bshape(shape, self.shape(v))) <= self.max_out // 2
            except ValueError:
                return False

        return ok

    def axis_spec(self, ndim: int, allow_tuple=True):
        if ndim == 0 or self.chance(0.2):
            return None
        if allow_tuple and self.chance(0.35):
            k = int(self.rng.integers(1, ndim + 1))
            axes = [int(a) for a in self.rng.permutation(ndim)[:k]]
            return tuple(a - ndim if self.chance(0.3) else a for a in axes)
        a = int(self.rng.integers(ndim))
        return a - ndim if self.chance(0.3) else a

    def new_f32(self, domain="real", shape=None, rank=None):
        return lambda: self.leaf(shape if shape is not None else self.rand_shape(rank), domain=domain)

    # -- actions --------------------------------------------------------------------------------
    UNARY = ("neg", "abs", "sqrt", "rsqrt", "exp", "log", "square", "sin", "cos", "tanh", "sigmoid", "relu",
             "gelu", "gelu_tanh", "silu", "erf", "stop_gradient", "pow_int", "pow_frac", "pow_neg", "pow_base")
    DOMAIN = {"sqrt": "positive", "rsqrt": "positive", "log": "positive", "pow_frac": "positive", "pow_neg": "nonzero",
              "exp": "small", "pow_base": "small"}
    PRED = {
        "positive": lambda x: x.min() >= 0.05,
        "nonzero": lambda x: x.abs().min() >= 0.05,
        "small": lambda x: x.abs().max() <= 4,
        "real": lambda x: True,
        "prob": lambda x: (x.min() >= 0.05) & (x.max() <= 0.95),
        "log1p": lambda x: x.min() >= -0.9,
    }

    def a_unary(self):
        op = self.choice(self.UNARY)
        dom = self.DOMAIN.get(op, "real")
        x = self.pick(lambda v: self.f32(v) and self.all(v, self.PRED[dom]), self.new_f32(dom))
        if op == "gelu_tanh":
            return self.emit("gelu", (x,), {"approximate": "tanh"})
        if op.startswith("pow_"):
            infix = {"infix": True} if self.chance(0.5) else {}
            if op == "pow_int":
                return self.emit("power", (x, self.choice((2, 3, 2.0, 4))), infix)
            if op == "pow_frac":
                return self.emit("power", (x, self.choice((0.5, 1.5, 2.5, -0.5))), infix)
            if op == "pow_neg":
                return self.emit("power", (x, self.choice((-1, -2, -1.0))), infix)
            return self.emit("power", (self.choice((2.0, 0.5, 3)), x))
        kw = {"infix": True} if op == "neg" and self.chance(0.5) else {}
        return self.emit(op, (x,), kw)

    def scalar(self, nonzero=False):
        s = self.choice(SCALARS)
        return s if s != 0 or not nonzero else 1.5

    def operand_for(self, shape, pred=lambda v: True, domain="real"):
        """Second operand of a binary op: a number, another variable, or a new leaf of a partner shape."""
        r = self.rng.random()
        if r < 0.2:
            return self.scalar()
        if r < 0.45:
            cands = [v for v in self.order if self.f32(v) and self.compatible(shape)(v) and self.all(v, pred)]
            if cands:
                return self.pick(lambda v: v in cands)
        return self.leaf(self.partner(shape), domain=domain)

    def a_binary(self):
        op = self.choice(("add", "sub", "mul", "div", "maximum", "minimum", "less", "greater", "add", "mul", "sub", "powt"))
        if op == "powt":  # tensor exponent: exp(y * log(x))
            x = self.pick(lambda v: self.f32(v) and self.all(v, self.PRED["positive"]), self.new_f32("positive"))
            y = self.operand_for(self.shape(x), lambda t: t.abs().max() <= 3, "small")
            if isinstance(y, (int, float)):
                raise Skip("powt")
            return self.emit("power", (x, y), {"infix": True} if self.chance(0.5) else {})
        a = self.pick(self.f32, self.new_f32())
        if op == "div":
            b = self.operand_for(self.shape(a), lambda t: t.abs().min() >= 0.05, "nonzero")
            if isinstance(b, (int, float)) and self.chance(0.5):
                a, b = b, a  # number / tensor
                if not self.all(b, self.PRED["nonzero"]):
                    raise Skip("div")
        else:
            b = self.operand_for(self.shape(a))
            if self.chance(0.5):
                a, b = b, a
        if not isinstance(a, str) and not isinstance(b, str):
            raise Skip("two numbers")
        infix = op in INFIX and self.chance(0.4)
        return self.emit(op, (a, b), {"infix": True} if infix else {})

    def mask(self):
        """An f32 0/1 mask: an existing one, or a new comparison."""
        masks = [v for v in self.order if self.f32(v) and self.all(v, lambda x: ((x == 0) | (x == 1)).all())]
        if masks and self.chance(0.5):
            return self.pick(lambda v: v in masks)
        a = self.pick(self.f32, self.new_f32())
        b = self.operand_for(self.shape(a))
        if self.chance(0.5):
            a, b = b, a
        if not isinstance(a, str) and not isinstance(b, str):
            raise Skip("two numbers")
        return self.emit(self.choice(("less", "greater")), (a, b), {"infix": True} if self.chance(0.3) else {})

    def a_where(self):
        c = self.mask()
        shape = self.shape(c)
        branches = [self.operand_for(shape) for _ in range(2)]
        return self.emit("where", (c, *branches))

    def a_reduce(self):
        op = self.choice(("sum", "mean", "max", "sum"))
        x = self.pick(self.f32, self.new_f32())
        kw = {"axis": self.axis_spec(len(self.shape(x)))}
        if self.chance(0.4):
            kw["keepdims"] = True
        return self.emit(op, (x,), kw)

    def a_argmax(self):
        x = self.pick(lambda v: self.f32(v) and len(self.shape(v)) >= 1, self.new_f32(rank=int(self.rng.integers(1, 4))))
        nd = len(self.shape(x))
        axis = None if self.chance(0.2) else int(self.rng.integers(nd)) - (nd if self.chance(0.3) else 0)
        keep = self.chance(0.5)
        r = self.rng.random()
        if r < 0.3 and axis is not None:  # the max itself, picked by index
            idx = self.emit("argmax", (x,), {"axis": axis, "keepdims": True})
            return self.emit("take_along_axis", (x, idx), {"axis": axis})
        idx = self.emit("argmax", (x,), {"axis": axis, "keepdims": keep})
        depth = self.shape(x)[axis] if axis is not None else math.prod(self.shape(x))
        if r < 0.55:
            return self.emit("one_hot", (idx,), {"depth": depth + int(self.rng.integers(0, 2))})
        if r < 0.75:
            return self.emit("cast", (idx,), {"dtype": "f32"})
        if r < 0.9:
            return self.emit("embedding", (self.leaf((depth, self.dim(1, 4)), kind="param"), idx))
        return idx

    def a_reshape(self):
        x = self.pick()
        size = math.prod(self.shape(x))
        rank = int(self.rng.integers(0 if size == 1 else 1, 5))
        dims = [1] * max(rank, 1)
        for f in _factor(size):
            dims[int(self.rng.integers(len(dims)))] *= f
        dims = dims[:rank] if rank else []
        if dims and self.chance(0.3):
            dims[int(self.rng.integers(len(dims)))] = -1
        return self.emit("reshape", (x,), {"shape": tuple(dims)})

    def a_transpose(self):
        x = self.pick(lambda v: len(self.shape(v)) >= 2, self.new_f32(rank=int(self.rng.integers(2, 5))))
        nd = len(self.shape(x))
        if self.chance(0.4):
            a, b = (int(i) for i in self.rng.permutation(nd)[:2])
            return self.emit("swapaxes", (x,), {"a": a - nd if self.chance(0.3) else a, "b": b - nd if self.chance(0.3) else b})
        if self.chance(0.25):
            return self.emit("transpose", (x,), {"axes": None})
        ones = [i for i, d in enumerate(self.shape(x)) if d == 1]
        if ones and self.chance(0.4):  # a size-1 axis moved: the flat order stays, the rank's meaning changes
            rest = [i for i in range(nd) if i != ones[0]]
            at = int(self.rng.integers(nd))
            perm = rest[:at] + [ones[0]] + rest[at:]
            if perm != list(range(nd)):
                return self.emit("transpose", (x,), {"axes": tuple(perm)})
        perm = [int(i) for i in self.rng.permutation(nd)]
        if perm == list(range(nd)):
            perm = perm[::-1]
        return self.emit("transpose", (x,), {"axes": tuple(p - nd if self.chance(0.2) else p for p in perm)})

    def a_narrow(self):
        x = self.pick(lambda v: any(d >= 2 for d in self.shape(v)))
        s = self.shape(x)
        axis = self.choice([i for i, d in enumerate(s) if d >= 2])
        length = int(self.rng.integers(1, s[axis]))
        start = int(self.rng.integers(0, s[axis] - length + 1))
        return self.emit("narrow", (x,), {"axis": axis - len(s) if self.chance(0.3) else axis, "start": start, "length": length})

    def a_broadcast(self):
        x = self.pick()
        s = [d if d != 1 or self.chance(0.4) else self.dim(2, 4) for d in self.shape(x)]
        lead = [self.dim(1, 3) for _ in range(int(self.rng.integers(0, 3)))] if len(s) < 4 else []
        target = tuple(lead + s)
        if target == self.shape(x) or math.prod(target) > self.max_out // 2:
            raise Skip("broadcast")
        return self.emit("broadcast_to", (x,), {"shape": target})

    def like(self, x, shape):
        """A new leaf of x's dtype (indices keep x's range, so they stay valid indices)."""
        if self.dtype(x) == "i32":
            high = max(int(max(t.max() for t in self.v64[x])) + 1, 1) if math.prod(self.shape(x)) else 2
            return self.leaf(shape, "i32", high=high)
        return self.leaf(shape)

    def a_concat(self):
        x = self.pick(lambda v: len(self.shape(v)) >= 1)
        s = self.shape(x)
        axis = int(self.rng.integers(len(s)))
        pieces = [x]
        for _ in range(int(self.rng.integers(1, 3))):
            r = self.rng.random()
            if r < 0.25:
                pieces.append(x)
                continue
            same = [v for v in self.order if self.dtype(v) == self.dtype(x) and len(self.shape(v)) == len(s) and v != x
                    and all(a == b for i, (a, b) in enumerate(zip(self.shape(v), s)) if i != axis)]
            if r < 0.55 and same:
                pieces.append(self.choice(same))
            else:
                pieces.append(self.like(x, s[:axis] + (self.dim(1, 4),) + s[axis + 1 :]))
        self.rng.shuffle(pieces)
        return self.emit("concat", tuple(pieces), {"axis": axis - len(s) if self.chance(0.3) else axis})

    def a_stack(self):
        x = self.pick()
        s = self.shape(x)
        pieces = [x] + [x if self.chance(0.3) else self.like(x, s) for _ in range(int(self.rng.integers(1, 3)))]
        rank = len(s) + 1
        axis = int(self.rng.integers(rank))
        return self.emit("stack", tuple(pieces), {"axis": axis - rank if self.chance(0.3) else axis})

    def a_split(self):
        x = self.pick(lambda v: any(d >= 2 for d in self.shape(v)))
        s = self.shape(x)
        axis = self.choice([i for i, d in enumerate(s) if d >= 2])
        n = s[axis]
        if self.chance(0.3):
            size = int(self.rng.integers(1, n))
            sizes, count = size, -(-n // size)
        else:
            cuts = sorted(int(c) for c in self.rng.choice(np.arange(1, n), size=int(self.rng.integers(1, min(n, 3))), replace=False))
            sizes = [b - a for a, b in zip([0] + cuts, cuts + [n])]
            count = len(sizes)
        return self.emit("split", (x,), {"sizes": sizes, "axis": axis - len(s) if self.chance(0.3) else axis}, n_out=count)

    def a_matmul(self):
        infix = {"infix": True} if self.chance(0.3) else {}
        r = self.rng.random()
        if r < 0.2:  # a computed right-hand side, a new left-hand side
            b = self.pick(lambda v: self.f32(v) and len(self.shape(v)) >= 2)
            sb = self.shape(b)
            a = self.leaf(sb[:-2] + (self.dim(), sb[-2]))
            return self.emit("matmul", (a, b), infix)
        a = self.pick(lambda v: self.f32(v) and len(self.shape(v)) >= 2, self.new_f32(rank=int(self.rng.integers(2, 5))))
        sa = self.shape(a)
        k = sa[-1]
        batched = len(sa) > 2 and self.chance(0.4)
        want = (sa[:-2] if batched else ()) + (k,)
        cands = [v for v in self.order if self.f32(v) and self.shape(v)[:-1] == want]
        if cands and self.chance(0.4):
            b = self.choice(cands)
        else:
            b = self.leaf(want + (self.dim(),))
        return self.emit("matmul", (a, b), infix)

    def index(self, high: int, shape=None):
        """i32 indices in [0, high): an existing variable in range, or a new input."""
        def ok(v):
            return (self.dtype(v) == "i32" and (shape is None or self.shape(v) == shape)
                    and self.all(v, lambda t: t.numel() == 0 or (t.min() >= 0 and t.max() < high)))
        return self.pick(ok, lambda: self.leaf(shape if shape is not None else self.rand_shape(int(self.rng.integers(0, 3))), "i32", high=high), p_new=0.4)

    def a_index(self):
        r = self.rng.random()
        if r < 0.25:
            if self.chance(0.6):
                table = self.leaf((self.dim(2, 6),) + self.rand_shape(int(self.rng.choice(3, p=(0.2, 0.6, 0.2))), 24), kind="param")
            else:
                table = self.pick(lambda v: self.f32(v) and len(self.shape(v)) >= 1)
            return self.emit("embedding", (table, self.index(self.shape(table)[0])))
        if r < 0.4:
            depth = self.dim(2, 6)
            return self.emit("one_hot", (self.index(depth),), {"depth": depth})
        if r < 0.6:
            x = self.pick(lambda v: self.f32(v) and len(self.shape(v)) >= 1, self.new_f32(rank=int(self.rng.integers(1, 4))))
            s = self.shape(x)
            axis = int(self.rng.integers(len(s)))
            ishape = s[:axis] + (self.dim(1, 4),) + s[axis + 1 :]
            return self.emit("take_along_axis", (x, self.index(s[axis], ishape)), {"axis": axis - len(s) if self.chance(0.3) else axis})
        if r < 0.75:
            x = self.pick()
            if self.dtype(x) == "i32":
                return self.emit("cast", (x,), {"dtype": "f32"})
            y = self.emit("cast", (x,), {"dtype": "i32"})
            return self.emit("cast", (y,), {"dtype": "f32"}) if self.chance(0.6) else y
        if r < 0.85:
            n = self.dim(1, 6)
            if self.chance(0.5):
                return self.emit("arange", (), {"n": n, "dtype": "f32"})
            return self.emit("arange", (), {"n": n})
        # integer comparisons give f32 masks
        a = self.pick(lambda v: self.dtype(v) == "i32", lambda: self.leaf(self.rand_shape(), "i32", high=5))
        b = self.choice((1, 2, 3)) if self.chance(0.4) else self.like(a, self.partner(self.shape(a)))
        return self.emit(self.choice(("less", "greater")), (a, b) if self.chance(0.5) or isinstance(b, int) else (b, a))

    def a_softmax(self):
        x = self.pick(lambda v: self.f32(v) and len(self.shape(v)) >= 1, self.new_f32(rank=int(self.rng.integers(1, 4))))
        nd = len(self.shape(x))
        kw = {} if self.chance(0.3) else {"axis": int(self.rng.integers(nd)) - (nd if self.chance(0.3) else 0)}
        return self.emit(self.choice(("softmax", "log_softmax")), (x,), kw)

    def a_cross_entropy(self):
        x = self.pick(lambda v: self.f32(v) and len(self.shape(v)) >= 1, self.new_f32(rank=int(self.rng.integers(1, 4))))
        s = self.shape(x)
        kw = {} if self.chance(0.3) else {"reduction": self.choice(("mean", "sum", "none"))}
        return self.emit("cross_entropy", (x, self.index(s[-1], s[:-1])), kw)

    def a_causal(self):
        x = self.pick(lambda v: self.f32(v) and len(self.shape(v)) >= 2 and self.shape(v)[-1] == self.shape(v)[-2], lambda: None, p_new=0.5)
        if x is None:
            t = self.dim(2, 5)
            x = self.leaf(self.rand_shape(int(self.rng.integers(0, 2)), 8) + (t, t))
        return self.emit("softmax_causal", (x,))

    def a_module(self):
        cls = self.choice(("Linear", "LayerNorm", "RMSNorm", "Embedding", "Linear"))
        mod = self._name("m")
        if cls == "Embedding":
            vocab, dim = self.dim(2, 6), self.dim(1, 4)
            x = self.index(vocab)
            ctor, params = (vocab, dim), [("W", (vocab, dim), "real")]
        else:
            rank = 2 if cls == "Linear" else 1
            x = self.pick(lambda v: self.f32(v) and len(self.shape(v)) >= rank and self.shape(v)[-1] >= 2, self.new_f32(rank=rank + 1))
            d = self.shape(x)[-1]
            if cls == "Linear":
                out, bias = self.dim(), self.chance(0.7)
                ctor = (d, out) if bias else (d, out, False)
                params = [("W", (d, out), "real")] + ([("b", (out,), "real")] if bias else [])
            elif cls == "LayerNorm":
                ctor, params = (d,), [("g", (d,), "gain"), ("b", (d,), "real")]
            else:
                ctor, params = (d,), [("g", (d,), "gain")]
        names = []
        for pname, shape, dom in params:
            leaf = Leaf(f"{mod}.{pname}", "modparam", "f32", shape, [self.sample(shape, "f32", dom, 0)])
            self.add_leaf(leaf)
            names.append(leaf.name)
        try:
            out = self.emit("module", (x, *names), {"cls": cls, "mod": mod})
        except Skip:
            for n in names:
                del self.leaves[n]
            raise
        self.modules[mod] = (cls, ctor)
        return out

    def a_heads(self):
        if self.chance(0.5):
            x = self.pick(lambda v: len(self.shape(v)) >= 3)
            return self.emit("merge_heads", (x,))
        x = self.pick(lambda v: len(self.shape(v)) >= 2 and self.shape(v)[-1] >= 2)
        d = self.shape(x)[-1]
        n = self.choice([k for k in range(2, d + 1) if d % k == 0])
        return self.emit("split_heads", (x,), {"n": n})

    def a_conv(self):
        x = self.pick(lambda v: self.f32(v) and len(self.shape(v)) == 4 and min(self.shape(v)[2:]) >= 2, lambda: self.leaf(
            (self.dim(1, 2), self.dim(1, 4), self.dim(2, 6), self.dim(2, 6)), domain="real"), p_new=0.5)
        n, c, h, w = self.shape(x)
        if self.chance(0.4):
            k = self.choice((2, 3))
            kh = kw_ = k
            stride = self.choice((None, 1, 2)) if self.chance(0.6) else None
            pad = int(self.rng.integers(0, k // 2 + 1))
            if h + 2 * pad < kh or w + 2 * pad < kw_:
                raise Skip("pool")
            kwargs = {"k": k}
            if stride is not None:
                kwargs["stride"] = stride
            if pad:
                kwargs["padding"] = pad
            return self.emit("max_pool2d", (x,), kwargs)
        groups = self.choice([g for g in (1, 2, 3) if c % g == 0])
        out = groups * self.dim(1, 3)
        kh, kw_ = self.choice((1, 2, 3)), self.choice((1, 2, 3))
        stride = self.choice((1, 1, 2, (1, 2)))
        pad = self.choice((0, 0, 1, (1, 0)))
        wt = self.leaf((out, c // groups, kh, kw_), kind="param")
        kwargs = {}
        if self.chance(0.2):
            kwargs["dilation"] = self.choice((2, (1, 2)))
        if stride != 1:
            kwargs["stride"] = stride
        if pad != 0:
            kwargs["padding"] = pad
        if groups != 1:
            kwargs["groups"] = groups
        return self.emit("conv2d", (x, wt), kwargs)

    def a_getitem(self):
        x = self.pick(lambda v: len(self.shape(v)) >= 1, self.new_f32(rank=int(self.rng.integers(1, 4))))
        s = self.shape(x)
        key, args, high = [], [x], 0
        if self.chance(0.3):
            key.append(None)
        for d in s:
            r = self.rng.random()
            if r < 0.25:
                key.append(int(self.rng.integers(-d, d)))
                continue
            if r < 0.4 and not high and self.dtype(x) == "f32":
                args.append(self.index(d, (self.dim(1, 4),)))
                key.append("i")
                high = d
            elif r < 0.8:
                step = self.choice((None, 2, 3)) if d > 1 else None
                start = self.choice((None, 1, -2)) if d > 2 else None
                stop = self.choice((None, -1)) if d > 2 and self.chance(0.3) else None
                key.append(("s", start, stop, step))
            else:
                key.append(("s", None, None, None))
            if self.chance(0.15):
                key.append(None)
        if len(key) > 1 and self.chance(0.3) and key[-1] == ("s", None, None, None):
            key[-1] = "..."
        return self.emit("getitem", tuple(args), {"key": tuple(key), "high": high} if high else {"key": tuple(key)})

    def a_spatial(self):
        r = self.rng.random()
        if r < 0.25:
            x = self.pick(lambda v: self.f32(v) and len(self.shape(v)) >= 2 and min(self.shape(v)[-2:]) >= 2,
                          self.new_f32(shape=(self.dim(1, 2), self.dim(1, 3), self.dim(2, 5), self.dim(2, 5))))
            s = self.shape(x)
            mode = self.choice(("constant", "constant", "reflect", "replicate", "circular")) if len(s) in (3, 4) else "constant"
            lim = min(s[-2:]) - 1 if mode == "reflect" else 2
            pads = tuple(int(self.rng.integers(-1 if mode == "constant" else 0, lim + 1)) for _ in range(4 if len(s) >= 3 else 2))
            kw = {"pad": pads, "mode": mode} if mode != "constant" else {"pad": pads}
            if mode == "constant" and self.chance(0.3):
                kw["value"] = 0.5
            return self.emit("pad", (x,), kw)
        if r < 0.55:
            x = self.pick(lambda v: self.f32(v) and len(self.shape(v)) == 4 and min(self.shape(v)[2:]) >= 2,
                          lambda: self.leaf((self.dim(1, 2), self.dim(1, 3), self.dim(2, 6), self.dim(2, 6))), p_new=0.5)
            h, w = self.shape(x)[2:]
            q = self.rng.random()
            if q < 0.4:
                k = self.choice((2, 3)) if min(h, w) >= 3 else 2
                kw = {"kernel_size": k}
                if self.chance(0.5):
                    kw["stride"] = self.choice((1, 2))
                if self.chance(0.4):
                    kw["padding"] = 1
                if self.chance(0.3):
                    kw["ceil_mode"] = True
                if self.chance(0.3):
                    kw["count_include_pad"] = False
                return self.emit("avg_pool2d", (x,), kw)
            if q < 0.6:
                return self.emit("adaptive_avg_pool2d", (x,), {"output_size": (self.dim(1, 4), self.dim(1, 4))})
            if self.chance(0.5):
                kw = {"size": (self.dim(1, 7), self.dim(1, 7))}
            else:
                kw = {"scale_factor": self.choice((2, 0.5, 1.5, (2, 3)))}
            if self.chance(0.5):
                kw["mode"] = "bilinear"
                kw["align_corners"] = self.chance(0.5)
            return self.emit("interpolate", (x,), kw)
        if r < 0.75:
            x = self.pick(lambda v: self.f32(v) and len(self.shape(v)) == 3 and self.shape(v)[2] >= 3,
                          lambda: self.leaf((self.dim(1, 2), self.dim(1, 4), self.dim(3, 8))), p_new=0.5)
            c = self.shape(x)[1]
            groups = self.choice([g for g in (1, 2) if c % g == 0])
            wt = self.leaf((groups * self.dim(1, 3), c // groups, self.choice((1, 2, 3))), kind="param")
            args = (x, wt, self.leaf((self.shape(wt)[0],), kind="param")) if self.chance(0.5) else (x, wt)
            kw = {k: v for k, v in (("stride", self.choice((1, 2))), ("padding", self.choice((0, 1))),
                                   ("dilation", self.choice((1, 2))), ("groups", groups)) if v != (0 if k == "padding" else 1)}
            return self.emit("conv1d", args, kw)
        x = self.pick(lambda v: self.f32(v) and len(self.shape(v)) == 4,
                      lambda: self.leaf((self.dim(1, 2), self.dim(1, 4), self.dim(1, 4), self.dim(1, 4))), p_new=0.5)
        c = self.shape(x)[1]
        groups = self.choice([g for g in (1, 2) if c % g == 0])
        wt = self.leaf((c, self.dim(1, 3), self.choice((1, 2, 3)), self.choice((1, 2, 3))), kind="param")
        kw = {}
        stride = self.choice((1, 2, (2, 1)))
        if stride != 1:
            kw["stride"] = stride
            if self.chance(0.4):
                kw["output_padding"] = 1
        if self.chance(0.3):
            kw["padding"] = 1
        if self.chance(0.2):
            kw["dilation"] = 2
        if groups != 1:
            kw["groups"] = groups
        args = (x, wt, self.leaf((self.shape(wt)[1] * groups,), kind="param")) if self.chance(0.5) else (x, wt)
        return self.emit("conv_transpose2d", args, kw)

    def a_rope(self):
        x = self.pick(lambda v: self.f32(v) and len(self.shape(v)) >= 2 and self.shape(v)[-1] % 2 == 0,
                      lambda: self.leaf(self.rand_shape(int(self.rng.integers(0, 2)), 8) + (self.dim(), 2 * self.dim(1, 3))))
        return self.emit("rope", (x,), {"base": self.choice((10000.0, 100.0, 10))} if self.chance(0.3) else {})

    def a_attention(self):
        import aot.ops

        if not hasattr(aot.ops, "attention"):  # API.md §6, not in every version
            raise Skip("attention")
        from aot.ops.attention import MAX_HEAD  # a documented limit (a ShapeError), not a finding

        fits = lambda v: self.f32(v) and len(self.shape(v)) >= 2 and self.shape(v)[-1] <= MAX_HEAD  # noqa: E731
        q = self.pick(fits, self.new_f32(rank=int(self.rng.integers(2, 4))))
        if self.shape(q)[-1] > MAX_HEAD:
            raise Skip("attention: head size over MAX_HEAD")
        *lead, t, d = self.shape(q)
        causal = self.chance(0.5)
        tk = t if causal else self.dim()
        k = self.pick(lambda v: self.f32(v) and self.shape(v) == (*lead, tk, d), lambda: self.leaf((*lead, tk, d)), p_new=0.5)
        v = self.pick(lambda v: self.f32(v) and self.shape(v)[:-1] == (*lead, tk) and self.shape(v)[-1] <= MAX_HEAD,
                      lambda: self.leaf((*lead, tk, min(self.dim(), MAX_HEAD))), p_new=0.5)
        kw = {"causal": True} if causal else {}
        if self.chance(0.3):
            kw["scale"] = self.choice((0.5, 1.0, 0.25))
        return self.emit("attention", (q, k, v), kw)

    def a_lstm_seq(self):
        import aot.ops

        if not hasattr(aot.ops, "lstm_seq"):  # not in every version
            raise Skip("lstm_seq")
        from aot.ops.recurrent import fits  # a documented limit (a ShapeError), not a finding

        ok = lambda v: self.f32(v) and len(self.shape(v)) == 3 and self.shape(v)[-1] % 4 == 0 and fits(self.shape(v)[0], self.shape(v)[2] // 4)  # noqa: E731
        xw = self.pick(ok, lambda: self.leaf((self.dim(), self.dim(), 4 * self.dim())))
        t, b, g4 = self.shape(xw)
        if not fits(t, g4 // 4):
            raise Skip("lstm_seq: over the fused kernel's size")
        args = (xw, self.leaf((g4, g4 // 4), kind="param"))
        if self.chance(0.4):
            args += (self.leaf((b, g4 // 4)), self.leaf((b, g4 // 4)))
        return self.emit("lstm_seq", args, {"reverse": True} if self.chance(0.4) else {})

    def a_nn(self):
        """A torch.nn module (tests/fuzz_nn.py): norms, BatchNorm, MultiheadAttention, RNNs, ..."""
        return fuzz_nn.action(self)

    def a_long_k(self):
        """A matmul with K >= 8192 (aot splits K over a batched matmul and a sum), or one whose
        weight gradient has that K: x[K, a] @ w[a, b], reduced right away to stay small."""
        k = self.choice((8192, 9216, 12288))
        big, self.max_out = self.max_out, 65536
        try:
            if self.chance(0.5):  # forward: [m, K] @ [K, n]
                a = self.leaf((self.dim(1, 3), k), kind="param", domain="small")
                y = self.emit("matmul", (a, self.leaf((k, self.dim(1, 3)), kind="param", domain="small")))
                return y
            x = self.leaf((k, self.dim(1, 3)), domain="small")
            y = self.emit("matmul", (x, self.leaf((self.shape(x)[1], self.dim(1, 3)), kind="param")))
            return self.emit(self.choice(("sum", "mean")), (y,), {"axis": 0})
        finally:
            self.max_out = big

    def a_bcast_reduce(self):
        """Issue 8's shape: a pointwise result, a size-1 axis added (reshape or broadcast), an
        elementwise op with a tensor that is wider on that axis, then a reduction over it."""
        x = self.pick(lambda v: self.f32(v) and 1 <= len(self.shape(v)) <= 3, self.new_f32(rank=int(self.rng.integers(1, 4))))
        if self.chance(0.5):
            x = self.emit(self.choice(("exp", "tanh", "square", "sigmoid", "neg")), (x,))
        s = self.shape(x)
        at = int(self.rng.integers(len(s) + 1))
        kept = s[:at] + (1,) + s[at:]
        y = self.emit("reshape", (x,), {"shape": kept})
        wide = s[:at] + (self.dim(2, 5),) + s[at:]
        other = self.pick(lambda v: self.f32(v) and self.shape(v) == wide, lambda: self.leaf(wide), p_new=0.6)
        z = self.emit(self.choice(("mul", "add", "sub", "mul")), (y, other) if self.chance(0.5) else (other, y))
        kw = {"axis": at - len(wide) if self.chance(0.3) else at}
        if self.chance(0.3):
            kw["keepdims"] = True
        return self.emit(self.choice(("sum", "sum", "mean", "max")), (z,), kw)

    ACTIVATIONS = ("leaky_relu", "elu", "softplus", "mish", "hardswish", "hardsigmoid", "logsigmoid", "clamp", "log1p", "expm1")

    def a_activation(self):
        op = self.choice(self.ACTIVATIONS)
        dom = {"log1p": "log1p", "expm1": "small"}.get(op, "real")
        x = self.pick(lambda v: self.f32(v) and self.all(v, self.PRED[dom]), self.new_f32("small" if dom == "log1p" else dom))
        kw = {}
        if op == "leaky_relu" and self.chance(0.5):
            kw["negative_slope"] = self.choice((0.2, 0.5))
        elif op == "elu" and self.chance(0.5):
            kw["alpha"] = self.choice((0.5, 2.0))
        elif op == "softplus" and self.chance(0.5):
            kw = {"beta": self.choice((2.0, 0.5)), "threshold": self.choice((1.0, 3.0, 20.0))}
        elif op in ("hardswish", "hardsigmoid") and self.chance(0.6):
            x = self.emit("mul", (x, 3.0))  # reach both kinks and the flat parts
        elif op == "clamp":
            lo, hi = self.choice((-0.5, None, -1.0, 0.0)), self.choice((1.0, None, 0.5))
            kw = {k: v for k, v in (("min", lo), ("max", hi)) if v is not None} or {"min": -0.5}
        return self.emit(op, (x,), kw)

    def a_reduce2(self):
        op = self.choice(("logsumexp", "var", "std", "min", "prod", "cumsum", "norm", "logsumexp", "norm"))
        x = self.pick(lambda v: self.f32(v) and len(self.shape(v)) >= 1 and self.all(v, self.PRED["small"]),
                      self.new_f32("small" if op == "prod" else "real", rank=int(self.rng.integers(1, 4))))
        nd = len(self.shape(x))
        if op == "cumsum":
            return self.emit("cumsum", (x,), {"axis": int(self.rng.integers(nd)) - (nd if self.chance(0.3) else 0)})
        kw = {"axis": self.axis_spec(nd), "_op": op}
        if self.chance(0.4):
            kw["keepdims"] = True
        if op in ("var", "std"):
            n = math.prod(self.shape(x)[a] for a in _axes(kw["axis"], nd))
            if self.chance(0.3) or n < 2:
                kw["correction"] = 0
        if op == "norm" and self.chance(0.6):
            kw["p"] = self.choice((1, 3, 0.5, 2.0))
        if op == "prod" and math.prod(self.shape(x)[a] for a in _axes(kw["axis"], nd)) > 12:
            raise Skip("prod of many values")
        return self.emit(op, (x,), kw)

    def a_loss(self):
        r = self.rng.random()
        red = {} if self.chance(0.3) else {"reduction": self.choice(("mean", "sum", "none"))}
        if r < 0.3:  # class-index losses
            x = self.pick(lambda v: self.f32(v) and len(self.shape(v)) >= 1 and self.shape(v)[-1] >= 2,
                          self.new_f32(rank=int(self.rng.integers(1, 4))))
            s = self.shape(x)
            kw = dict(red)
            if self.chance(0.4):
                kw["ignore_index"] = int(self.rng.integers(s[-1]))
            args = (x, self.index(s[-1], s[:-1]))
            if self.chance(0.3):
                args += (self.leaf((s[-1],), domain="positive", kind="input"),)
            if self.chance(0.5):
                return self.emit("nll_loss", args, kw)
            if self.chance(0.5):
                kw["label_smoothing"] = self.choice((0.1, 0.3))
            return self.emit("cross_entropy2", args, kw)
        x = self.pick(lambda v: self.f32(v) and len(self.shape(v)) >= 1, self.new_f32(rank=int(self.rng.integers(1, 4))))
        shape = self.shape(x)
        if r < 0.45:
            p = self.pick(lambda v: self.f32(v) and self.shape(v) == shape and self.all(v, self.PRED["prob"]),
                          lambda: self.leaf(shape, domain="prob"), p_new=0.6)
            t = self.leaf(shape, domain="prob", kind="input")
            if self.chance(0.5):
                return self.emit("binary_cross_entropy", (p, t), red)
            return self.emit("binary_cross_entropy_with_logits", (x, t), red)
        if r < 0.6:
            t = self.leaf(shape, domain="positive", kind="input")
            kw = dict(red) if self.chance(0.5) else {"reduction": "batchmean"}
            if self.chance(0.3):
                kw["log_target"] = True
                t = self.leaf(shape, domain="small", kind="input")
            return self.emit("kl_div", (x, t), kw)
        if r < 0.75:
            other = self.pick(lambda v: self.f32(v) and self.shape(v) == shape, lambda: self.leaf(shape), p_new=0.6)
            return self.emit("cosine_similarity", (x, other), {"dim": int(self.rng.integers(len(shape))) - (len(shape) if self.chance(0.3) else 0)})
        op = self.choice(("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"))
        t = self.pick(lambda v: self.f32(v) and self.shape(v) == shape and v != x, lambda: self.leaf(shape), p_new=0.5)
        kw = dict(red)
        if op == "smooth_l1_loss" and self.chance(0.4):
            kw["beta"] = self.choice((0.5, 2.0))
        if op == "huber_loss" and self.chance(0.4):
            kw["delta"] = self.choice((0.5, 2.0))
        return self.emit(op, (x, t), kw)

    ACTIONS = (("unary", 14), ("binary", 16), ("where", 5), ("reduce", 9), ("argmax", 3), ("reshape", 4), ("transpose", 4),
               ("narrow", 3), ("broadcast", 3), ("concat", 5), ("stack", 3), ("split", 3), ("matmul", 6), ("index", 7),
               ("softmax", 4), ("cross_entropy", 2), ("causal", 1), ("module", 3), ("heads", 1), ("conv", 2),
               ("rope", 1), ("attention", 2), ("lstm_seq", 1), ("bcast_reduce", 3), ("long_k", 0.6), ("getitem", 3), ("spatial", 3),
               ("activation", 4), ("reduce2", 4), ("loss", 3), ("nn", 3))

    def build(self, n_ops: int):
        names = [a for a, _ in self.ACTIONS]
        w = np.array([x for _, x in self.ACTIONS], dtype=np.float64)
        tries = 0
        while len(self.ops) < n_ops and tries < 20 * n_ops:
            tries += 1
            action = names[int(self.rng.choice(len(names), p=w / w.sum()))]
            mark = (dict(self.leaves), len(self.order), len(self.ops))
            try:
                getattr(self, "a_" + action)()
            except Skip:
                # a refused action leaves behind only what its accepted ops use
                used = {a for op in self.ops for a in op.args if isinstance(a, str)}
                self.leaves = {n: l for n, l in self.leaves.items() if n in mark[0] or n in used}
                self.order = self.order[: mark[1]] + [v for v in self.order[mark[1] :] if v in self.leaves or any(v in op.outs for op in self.ops)]

    def case(self) -> Case | None:
        used = {a for op in self.ops for a in op.args if isinstance(a, str)}
        # an empty output would need an empty cotangent input, which no input spec can declare
        produced = [o for op in self.ops for o in op.outs if 0 not in self.shape(o)]
        sinks = [v for v in produced if v not in used]
        outputs = sinks[-3:]
        if produced and self.chance(0.3):
            extra = self.choice(produced)
            if extra not in outputs:
                outputs.append(extra)
        if not any(self.dtype(o) == "f32" for o in outputs):
            f = [v for v in produced if self.dtype(v) == "f32"]
            if not f:
                return None
            outputs.append(f[-1])
        cts = {o: [np.asarray(self.rng.normal(size=self.shape(o)), dtype=np.float32) for _ in range(self.steps)] for o in outputs if self.dtype(o) == "f32"}
        return dce(Case(dict(self.leaves), dict(self.modules), list(self.ops), outputs, cts, self.steps))


def dce(case: Case) -> Case:
    """Drop ops no output needs, then leaves and modules nothing uses."""
    live = set(case.outputs)
    ops = []
    for op in reversed(case.ops):
        if any(o in live for o in op.outs):
            ops.append(op)
            live.update(a for a in op.args if isinstance(a, str))
    ops.reverse()
    leaves = {n: l for n, l in case.leaves.items() if n in live}
    mods = {op.kw["mod"] for op in ops if op.op in ("module", "nnmod")}
    modules = {m: v for m, v in case.modules.items() if m in mods}
    cts = {o: v for o, v in case.cts.items() if o in case.outputs}
    return Case(leaves, modules, ops, list(case.outputs), cts, case.steps)


def generate_case(rng: np.random.Generator, steps: int, max_ops: int = 8, big: bool = False) -> Case:
    while True:
        g = Gen(rng, steps, big)
        g.build(int(rng.integers(1, max_ops + 1)))
        case = g.case()
        if case is not None and case.ops and run_case(case) is not None:
            return case


def generate(seed: int, n_cases: int | None = None, max_ops: int | None = None) -> Batch:
    """The batch of seed `seed`: 3..6 cases of up to max_ops ops (6, 8 or 12 when None), 2 or 3
    steps, captures and an Infer entry sometimes. Dims are 1..6, except in about one case in
    seven, where some dims are 17..300 (tensors up to 8192 elements)."""
    rng = np.random.default_rng(seed)
    if max_ops is None:
        max_ops = int(rng.choice((6, 8, 12)))
    steps = 2 if rng.random() < 0.8 else 3
    n = int(rng.integers(3, 7)) if n_cases is None else n_cases
    capture = bool(rng.random() < 0.7)
    infer = bool(rng.random() < (0.3 if capture else 0.8))
    cases = [generate_case(rng, steps, max_ops, big=bool(rng.random() < 0.15)) for _ in range(n)]
    batch = Batch(cases, capture=capture, infer=infer, steps=steps, seed=seed)
    if rng.random() < 0.3:
        sgd = Batch(cases, capture=capture, infer=infer, steps=steps, seed=seed,
                    sgd=(float(rng.choice((0.01, 0.05, 0.1))), float(rng.choice((0.0, 0.0, 0.9)))))
        # the updated parameters must keep every op of every step in its domain, too
        if reference_runs(sgd, check=True) is not None:
            batch = sgd
    return batch


# ---- Python source ------------------------------------------------------------------------------


def _num(v: float) -> str:
    """Shortest text that reads back as the same float32."""
    s = np.format_float_positional(np.float32(v), unique=True, trim="0")
    return s if len(s) <= 12 else np.format_float_scientific(np.float32(v), unique=True, trim="0")


def array_source(a: np.ndarray, indent: str = "    ") -> str:
    a = np.asarray(a)
    if a.dtype.kind in "iu":
        flat, dt = [str(int(v)) for v in a.reshape(-1)], "np.int32"
    elif a.dtype == np.float64:
        flat, dt = [repr(float(f"{v:.9g}")) for v in a.reshape(-1)], "np.float64"
    else:
        flat, dt = [_num(v) for v in a.reshape(-1)], "np.float32"
    if a.ndim == 0:
        return f"np.array({flat[0]}, dtype={dt})"
    lines, line = [], ""
    for item in flat:
        if len(line) + len(item) > 96:
            lines.append(line.rstrip())
            line = ""
        line += item + ", "
    lines.append(line.rstrip(", "))
    body = lines[0] if len(lines) == 1 else "\n" + "".join(f"{indent}    {x}\n" for x in lines) + indent
    reshape = f".reshape{a.shape!r}" if a.ndim > 1 else ""
    return f"np.array([{body}], dtype={dt}){reshape}"


def _spec_src(dtype: str, shape: tuple) -> str:
    return f"aot.{dtype}({', '.join(str(d) for d in shape)})"


def out_name(batch: Batch, k: int, v: str) -> str:
    return batch.prefix(k) + v


def input_names(batch: Batch, with_cts: bool = True) -> list[tuple[str, str, tuple]]:
    """(name, dtype, shape) of the Program's inputs, in signature order."""
    out = []
    for k, c in enumerate(batch.cases):
        p = batch.prefix(k)
        out += [(p + n, l.dtype, l.shape) for n, l in c.leaves.items() if l.kind == "input"]
    if with_cts:
        for k, c in enumerate(batch.cases):
            p = batch.prefix(k)
            out += [(p + o + "_ct", "f32", c.cts[o][0].shape) for o in c.outputs if o in c.cts]
    return out


def feeds(batch: Batch, step: int, with_cts: bool = True) -> dict[str, np.ndarray]:
    out = {}
    for k, c in enumerate(batch.cases):
        p = batch.prefix(k)
        out.update({p + n: l.value(step) for n, l in c.leaves.items() if l.kind == "input"})
        if with_cts:
            out.update({p + o + "_ct": c.cts[o][step] for o in c.outputs if o in c.cts})
    return out


def needs_anchor(batch: Batch) -> bool:
    """A Program needs a parameter: batch_source gives a batch without any an `anchor` of zeros."""
    return not any(l.kind == "param" for c in batch.cases for l in c.leaves.values()) and not any(c.modules for c in batch.cases)


def param_values(batch: Batch, kinds=("param",)) -> dict[str, np.ndarray]:
    out = {batch.prefix(k) + n: l.values[0] for k, c in enumerate(batch.cases) for n, l in c.leaves.items() if l.kind in kinds}
    if kinds == ("param",) and needs_anchor(batch):
        out["anchor"] = np.zeros((1,), np.float32)  # the interpreter takes every parameter by name
    return out


def predict_parts(batch: Batch) -> list[tuple[int, str]]:
    """The outputs the `predict` entry returns: all f32 ones (else all i32 ones), flattened and concatenated."""
    outs = [(k, o) for k, c in enumerate(batch.cases) for o in c.outputs]
    f32 = [(k, o) for k, o in outs if o in batch.cases[k].cts]
    return f32 or outs


def batch_source(batch: Batch, name: str = "fuzz_prog", inline: bool = False) -> str:
    """The Program as Python source. With inline, parameter values are literals (a standalone
    file); otherwise they come from the names P and MODULE_PARAMS in the namespace."""
    L = ["import numpy as np", "", "import aot", "from aot import nn, ops", ""]
    if inline:
        L.append("P = {")
        for n, v in param_values(batch).items():
            L.append(f"    {n!r}: {array_source(v, '    ')},")
        L.append("}")
        L.append("MODULE_PARAMS = {")
        for n, v in param_values(batch, ("modparam",)).items():
            L.append(f"    {n!r}: {array_source(v, '    ')},")
        L += ["}", ""]
    L += ["", "class FuzzModel(aot.Module):", "    def __init__(self):", "        super().__init__()"]
    body = 0
    for k, c in enumerate(batch.cases):
        p = batch.prefix(k)
        for n, l in c.leaves.items():
            if l.kind == "param":
                L.append(f"        self.{p}{n} = self.param({l.shape!r}, init=aot.init.literal(P[{p + n!r}]))")
                body += 1
        for m, (cls, ctor) in c.modules.items():
            L.append(f"        self.{p}{m} = {fuzz_nn.ctor_src(cls, ctor)}")
            body += 1
    if needs_anchor(batch):
        L.append("        self.anchor = self.param((1,), init=aot.init.zeros())")
    ins = [n for n, _, _ in input_names(batch, with_cts=False)]
    cts = [n for n, _, _ in input_names(batch)][len(ins):]
    sig = ", ".join(["m"] + ins)
    L += ["", "", f"def forward({sig}):"]
    results = []
    for k, c in enumerate(batch.cases):
        p = batch.prefix(k)

        def ref(a, c=c, p=p):
            if not isinstance(a, str):
                return repr(a)
            leaf = c.leaves.get(a)
            return f"m.{p}{a}" if leaf is not None and leaf.kind == "param" else p + a

        for op in c.ops:
            args = [ref(a) for a in op.args]
            mod = f"m.{p}{op.kw['mod']}" if op.op in ("module", "nnmod") else None
            lhs = ", ".join(p + o for o in op.outs)
            L.append(f"    {lhs} = {OPS[op.op].src(args, op.kw, mod)}")
        results += [p + o for o in c.outputs]
    L.append(f"    return [{', '.join(results)}]")
    pos = {(k, o): i for i, (k, o) in enumerate((k, o) for k, c in enumerate(batch.cases) for o in c.outputs)}
    L += ["", "", f"def loss({', '.join(['m'] + ins + cts)}):", f"    outs = forward({sig})"]
    terms = []
    for k, c in enumerate(batch.cases):
        for o in c.outputs:
            i = pos[(k, o)]
            if batch.capture:
                L.append(f"    aot.capture({out_name(batch, k, o)!r}, outs[{i}])")
            if o in c.cts:
                terms.append(f"ops.sum(outs[{i}] * {out_name(batch, k, o)}_ct)")
    L.append("    total = " + terms[0])
    L += [f"    total = total + {t}" for t in terms[1:]]
    L.append("    return total")
    if batch.infer:
        parts = predict_parts(batch)
        L += ["", "", f"def predict({sig}):", f"    outs = forward({sig})"]
        if len(parts) == 1:
            L.append(f"    return outs[{pos[parts[0]]}]")
        else:
            flat = ", ".join(f"ops.reshape(outs[{pos[x]}], (-1,))" for x in parts)
            L.append(f"    return ops.concat([{flat}], axis=0)")
    specs = lambda xs: "{" + ", ".join(f"{n!r}: {_spec_src(dt, s)}" for n, dt, s in xs) + "}"  # noqa: E731
    L += ["", "", "program = aot.Program(", f"    {name!r},", "    model=FuzzModel,",
          f"    train=aot.Train(loss, inputs={specs(input_names(batch))}, optimizer={_optimizer_source(batch)}),"]
    if batch.infer:
        L.append(f"    infer={{'predict': aot.Infer(predict, inputs={specs(input_names(batch, with_cts=False))})}},")
    L += ["    seed=0,", ")", ""]
    return "\n".join(L)


def _optimizer_source(batch: Batch) -> str:
    if batch.sgd is None:
        return "None"
    lr, mu = batch.sgd
    return f"aot.optim.SGD(lr={lr!r}" + (f", momentum={mu!r})" if mu else ")")


def build_program(batch: Batch, name: str = "fuzz_prog"):
    ns = {"P": param_values(batch), "MODULE_PARAMS": param_values(batch, ("modparam",))}
    src = batch_source(batch, name)
    exec(compile(src, f"<fuzz {name}>", "exec"), ns)
    return ns["program"]


# ---- the checker --------------------------------------------------------------------------------


@dataclass
class Failure:
    """kind: "compile" / "run" (an exception), "gpu" (the compiled package disagrees with float64
    PyTorch while the interpreter agrees), "interp" (the interpreter disagrees too: the graph is
    wrong), "interp-error" (the interpreter raised); "wasm-compile" / "wasm-run" / "wasm": the
    same three for the web target's wasm kernel set run in node (run_wasm)."""

    kind: str
    case: int | None  # index in the batch; None when the whole program failed
    what: str  # "step 2: gradient of g0_p1", ...
    detail: str
    key: tuple | None = None  # (step, "output" | "gradient of" | "predict" | "loss", unprefixed name)

    def moved(self, batch: Batch, lo: int) -> Failure:
        """This failure of a batch of cases lo, lo+1, ... of `batch`, named as in `batch`."""
        case = None if self.case is None else self.case + lo
        what = self.what
        if self.key is not None and self.key[1] in ("output", "gradient of", "parameter") and case is not None:
            what = f"step {self.key[0]}: {self.key[1]} {batch.prefix(case)}{self.key[2]}"
            if self.key[1] == "parameter":
                what += " after the update"
        return replace(self, case=case, what=what)

    def family(self) -> str:
        """Failures of one family are taken to be the same bug while shrinking: the kind, and for
        exceptions the type and the message without kernel, tensor and other numbers."""
        if self.kind in ("compile", "run", "interp-error", "wasm-compile", "wasm-run"):
            msg = re.sub(r"\bk\d+_\w+", "K", self.detail)
            msg = re.sub(r"\d+", "N", msg)
            return self.kind + ":" + msg[:80]
        return self.kind

    def __str__(self):
        where = "" if self.case is None else f"case {self.case}: "
        return f"[{self.kind}] {where}{self.what}: {self.detail}"


def tolerance(want: np.ndarray, err32: float) -> np.ndarray:
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    return 2e-3 * np.abs(want) + 1e-4 * scale + 50.0 * err32 + 1e-5


def compare(got, want, err32: float, zero_tol: float = 0.0, extra: float = 0.0) -> str | None:
    """None when got matches the float64 value want; otherwise what is wrong (`zero_tol`: more
    tolerance where want is 0 or below zero_tol, CaseRun.zero_tol; `extra`: absolute tolerance
    added everywhere, noise_extra)."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if want.dtype.kind in "iu":
        if got.dtype.kind not in "iu":
            return f"dtype {got.dtype}, expected an integer array"
        if not np.array_equal(got, want):
            i = np.argwhere(got != want)[0]
            return f"integers differ at {tuple(int(x) for x in i)}: got {got[tuple(i)]}, expected {want[tuple(i)]}"
        return None
    if got.dtype.kind not in "f":
        return f"dtype {got.dtype}, expected float32"
    got64 = got.astype(np.float64)
    # values below the cancellation noise count as its zeros (a saturated softmax's gradient is
    # 5e-73 in float64, rounding-sized in float32: seed 4160350)
    tol = tolerance(want, err32) + np.where(np.abs(want) <= zero_tol, zero_tol, 0.0) + extra
    bad = ~(np.abs(got64 - want) <= tol)  # NaN counts as bad
    if not bad.any():
        return None
    i = tuple(int(x) for x in np.argwhere(bad)[0])
    n, err = int(bad.sum()), float(np.nanmax(np.where(np.isfinite(got64), np.abs(got64 - want), np.inf)))
    return f"{n}/{want.size} elements off (max error {err:.3g}); at {i}: got {got64[i]:.7g}, expected {want[i]:.7g}"


def expected_predict(batch: Batch, runs: list, step: int):
    parts = predict_parts(batch)
    vals = [(runs[k].eval_outs or runs[k].outs)[step][o] for k, o in parts]
    err = max(runs[k].err.get("eval:" + o, runs[k].err[o]) for k, o in parts)
    if len(parts) == 1:
        return vals[0], err
    return np.concatenate([v.reshape(-1) for v in vals]), err


def _cleanup(model):
    """aot.compile builds into a fresh temporary folder; remove it once the model is closed."""
    mod = sys.modules.get(type(model).__module__)
    f = getattr(mod, "__file__", None)
    if not f:
        return
    root = Path(f).resolve().parents[2]
    if root.name.startswith("aot-") and root.parent == Path(tempfile.gettempdir()).resolve():
        shutil.rmtree(root, ignore_errors=True)


def _exc(e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:300]}"


@dataclass
class Sides:
    """What one side (GPU or interpreter) produced at each step."""

    loss: list = field(default_factory=list)
    captures: list = field(default_factory=list)
    grads: list = field(default_factory=list)
    predict: list = field(default_factory=list)
    params: list = field(default_factory=list)  # after each step (SGD batches)
    buffers: list = field(default_factory=list)  # after each step (batches with buffers)
    replay: tuple | None = None  # (loss, captures, grads) of step 1 again after model.reset()


# Every third pair of seeds builds with buffers of at most this many MiB, so that the scratch
# spreads over several buffers (plan._pack: matmul outputs kept apart from their operands, which
# they then bind read-only, vec4 views). A graph with a tensor or a kernel that such small buffers
# cannot hold builds with the default limit instead.
SPLIT_SCRATCH_MIB = 8 / 1024


def max_binding_mib(seed: int) -> float:
    return SPLIT_SCRATCH_MIB if seed // 2 % 3 == 1 else 128


def kernel_set(seed: int) -> str:
    """The CPU set (what lavapipe picks by itself) for odd seeds; of the even ones, the GPU set
    (merged dispatches, workgroup-tree reductions) and the subgroup set (the GPU set with its
    attention rows shared by subgroup lanes) in turn."""
    return "cpu" if seed % 2 else "subgroup" if seed % 4 == 2 else "gpu"


def run_gpu(batch: Batch, name: str = "fuzz_prog") -> Sides | Failure:
    """The batch on this adapter, with the kernel set of its seed (kernel_set); scratch split
    over small buffers for a third of them (max_binding_mib)."""
    import aot
    from aot.errors import CodegenError

    kernels = kernel_set(batch.seed)
    try:
        program = build_program(batch, name)
        try:
            model = aot.compile(program, max_binding_mib=max_binding_mib(batch.seed), kernels=kernels)
        except CodegenError as e:
            if "max-binding-mib" not in str(e) or max_binding_mib(batch.seed) == 128:
                raise
            model = aot.compile(program, kernels=kernels)
    except Exception as e:  # noqa: BLE001 - any exception is a finding
        return Failure("compile", None, "aot.compile", _exc(e))
    side = Sides()
    has_buffers = any(stateful(c) for c in batch.cases)
    try:
        mods = param_values(batch, ("modparam",))
        if mods:
            model.load_params(mods, partial=True)
        for s in range(batch.steps):
            if batch.infer and batch.sgd is not None:  # the parameters of step s, before its update
                side.predict.append(np.asarray(model.predict(**feeds(batch, s, with_cts=False))))
            res = model.step(**feeds(batch, s), captures=True)
            side.loss.append(float(res.loss))
            side.captures.append(dict(res.captures))
            side.grads.append(model.grads())
            if batch.sgd is not None:
                side.params.append(model.params())
            if has_buffers:
                side.buffers.append(model.buffers())
            if batch.sgd is None and batch.infer:
                side.predict.append(np.asarray(model.predict(**feeds(batch, s, with_cts=False))))
        # step 1 again after a reset, with every buffer holding later steps' values: bit for bit
        model.reset(params=True, optimizer=True)
        if mods:
            model.load_params(mods, partial=True)
        res = model.step(**feeds(batch, 0), captures=True)
        side.replay = (float(res.loss), dict(res.captures), model.grads())
    except Exception as e:  # noqa: BLE001
        return Failure("run", None, f"step {len(side.loss) + 1}", _exc(e))
    finally:
        model.close()
        _cleanup(model)
    return side


def wasm_relaxed(seed: int) -> bool:
    """The wasm side runs the relaxed-SIMD module (the matmuls' multiply-adds fused, as Chromium
    runs them) for odd seeds, the plain SIMD module (node's and Firefox's) for even ones."""
    return seed % 2 == 1


def run_wasm(batch: Batch, name: str = "fuzz_prog") -> Sides | Failure:
    """The batch through the web target's "wasm" kernel set (aot/wasm_build.py) in node, in the
    shared node process of tests/web_node.py: the same steps, captures, gradients, updated
    parameters, buffers, predict calls and replay after reset() as run_gpu."""
    import contextlib
    import io

    import aot
    import web_node

    tmp = Path(tempfile.mkdtemp(prefix="aot-wasm-"))
    try:
        try:
            program = build_program(batch, name)
            # a kernel the wasm subset cannot compile is printed by the build, then refused by
            # Model.create({kernels: "wasm"}) with the same reason: reported from there
            with contextlib.redirect_stderr(io.StringIO()):
                module = aot.build(program, tmp, target="web", force=True) / f"{name}.js"
        except Exception as e:  # noqa: BLE001 - any exception is a finding
            return Failure("wasm-compile", None, "aot.build(target='web')", _exc(e))
        has_buffers = any(stateful(c) for c in batch.cases)
        got = web_node.run_steps(
            module, [feeds(batch, s) for s in range(batch.steps)],
            [feeds(batch, s, with_cts=False) for s in range(batch.steps)] if batch.infer else None,
            load=param_values(batch, ("modparam",)), predict_first=batch.sgd is not None, params=batch.sgd is not None,
            buffers=has_buffers, replay=True, relaxed=wasm_relaxed(batch.seed))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if "error" in got:
        first = got["error"].strip().splitlines()[0][:300] if got["error"].strip() else "(no message)"
        if "the build left the wasm kernel set out" in first:
            return Failure("wasm-compile", None, "the wasm kernel set", first)
        return Failure("wasm-run", None, got.get("at") or "node", first)
    side = Sides()
    for st in got["steps"]:
        side.loss.append(st["loss"])
        side.captures.append(st["captures"])
        side.grads.append(st["grads"])
        if batch.sgd is not None:
            side.params.append(st["params"])
        if has_buffers:
            side.buffers.append(st["buffers"])
        if batch.infer:
            side.predict.append(st["predict"])
    r = got["replay"]
    side.replay = (r["loss"], r["captures"], r["grads"])
    return side


def node_available() -> bool:
    return shutil.which("node") is not None


# the package's sides: how each runs a batch, and the failure kinds it reports (an exception
# while building, one while running, wrong values)
PACKAGE_SIDES = {"gpu": run_gpu, "wasm": run_wasm}
SIDE_KINDS = {"gpu": ("compile", "run", "gpu"), "wasm": ("wasm-compile", "wasm-run", "wasm")}
SIDE_OF = {kind: side for side, kinds in SIDE_KINDS.items() for kind in kinds}


def default_sides() -> tuple:
    """Every package side this machine can run: the wasm set needs node (20+)."""
    return ("gpu", "wasm") if node_available() else ("gpu",)


def step_params(batch: Batch, runs: list, s: int) -> dict[str, np.ndarray]:
    """Every parameter's value at step s (they change only in SGD batches)."""
    out = {batch.prefix(k) + n: v for k, r in enumerate(runs) for n, v in r.params[s].items()}
    if needs_anchor(batch):
        out["anchor"] = np.zeros((1,), np.float32)  # batch_source's parameter of a batch without any
    return out


def reference_runs(batch: Batch, check: bool = False) -> list | None:
    runs = [run_case(c, check, batch.sgd) for c in batch.cases]
    return None if any(r is None for r in runs) else runs


def run_interp(batch: Batch, runs: list) -> Sides | Failure:
    """The interpreter's gradients at the parameters PyTorch has at each step."""
    from aot import interp
    from aot.frontend import trace_program

    ref = replace(batch, capture=True, infer=True, sgd=None)
    def bufs(s):  # the buffers (as float32 / int32) at step s's start
        return {batch.prefix(k) + n: np.asarray(v, dtype=np.int32 if v.dtype.kind in "iu" else np.float32)
                for k, r in enumerate(runs) for n, v in r.buffers[s].items()}

    # predict sees the buffers before step s in SGD batches (it runs first), after it otherwise
    at = (lambda s: s) if batch.sgd is not None else (lambda s: s + 1)
    train_leaves = [dict(feeds(batch, s), **step_params(batch, runs, s), **bufs(s), _rng=np.int32(0)) for s in range(batch.steps)]
    infer_leaves = [dict(feeds(batch, s, with_cts=False), **step_params(batch, runs, s), **bufs(at(s)), _rng=np.int32(0))
                    for s in range(batch.steps)]
    side = Sides()
    try:
        traced = trace_program(build_program(ref, "fuzz_ref"))
        g, gi = traced.graphs["train"], traced.graphs["predict"]
        for s in range(batch.steps):
            env = interp.run(g, train_leaves[s], np.float32)
            side.loss.append(float(env[id(g.outputs["loss"])]))
            side.captures.append({n: env[id(t)] for n, t in g.captures.items()})
            side.grads.append({n: env[id(t)] for n, t in g.grads.items()})
            envi = interp.run(gi, infer_leaves[s], np.float32)
            side.predict.append(envi[id(gi.outputs["out"])])
    except Exception as e:  # noqa: BLE001
        return Failure("interp-error", None, "interpreter", _exc(e))
    return side


def _side_failures(kind: str, batch: Batch, runs: list, side: Sides, captures: bool, predict: bool) -> list[Failure]:
    out = []
    package = kind in SIDE_OF  # a package side (its own trajectory, replay), not the interpreter
    # the package follows its own SGD trajectory (the interpreter is run at float64's parameters):
    # its values may be as far off as 1-ulp noise moves that trajectory (trajectory_spread)
    extra = (lambda k, s, name: noise_extra(batch, runs[k], batch.cases[k], s, name)) if package else (lambda k, s, name: 0.0)
    for s in range(batch.steps):
        for k, (c, run) in enumerate(zip(batch.cases, runs)):
            p = batch.prefix(k)
            for o in c.outputs if captures else ():
                got = side.captures[s].get(p + o)
                msg = "missing" if got is None else compare(got, run.outs[s][o], run.err[o], extra=extra(k, s, o))
                if msg:
                    out.append(Failure(kind, k, f"step {s + 1}: output {p + o}", msg, (s + 1, "output", o)))
            for n in run.grads[s]:
                got = side.grads[s].get(p + n)
                msg = "missing" if got is None else compare(got, run.grads[s][n], run.err[n], run.zero_tol.get(n, 0.0), extra(k, s, n))
                if msg:
                    out.append(Failure(kind, k, f"step {s + 1}: gradient of {p + n}", msg, (s + 1, "gradient of", n)))
        if package and s == 0 and side.replay is not None:
            loss, caps, grads = side.replay
            diff = [] if loss == side.loss[0] or (math.isnan(loss) and math.isnan(side.loss[0])) else ["loss"]
            diff += [n for n, v in side.captures[0].items() if not np.array_equal(v, caps.get(n), equal_nan=True)]
            diff += [n for n, v in side.grads[0].items() if not np.array_equal(v, grads.get(n), equal_nan=True)]
            if diff:
                out.append(Failure(kind, None if len(batch.cases) > 1 else 0, "step 1 again after reset()",
                                   "not bit-identical to the first step 1: " + ", ".join(diff[:6]), (1, "replay", "")))
        if package and batch.sgd is not None:
            lr = batch.sgd[0]
            for k, (c, run) in enumerate(zip(batch.cases, runs)):
                p = batch.prefix(k)
                for n, want in run.params[s + 1].items():
                    got = side.params[s].get(p + n)
                    # the update carries the gradient's float32 error, times lr (momentum: a few steps of it)
                    err = 4 * lr * run.err[n] + 1e-6 * float(np.max(np.abs(want)) if want.size else 0)
                    msg = "missing" if got is None else compare(got, want.astype(np.float64), err, extra=extra(k, s, "param:" + n))
                    if msg:
                        out.append(Failure(kind, k, f"step {s + 1}: parameter {p + n} after the update", msg, (s + 1, "parameter", n)))
        if package and side.buffers:
            for k, (c, run) in enumerate(zip(batch.cases, runs)):
                p = batch.prefix(k)
                for n, want in run.buffers[s + 1].items():
                    got = side.buffers[s].get(p + n)
                    msg = "missing" if got is None else compare(got, want, run.err.get("buf:" + n, 0.0), extra=extra(k, s, "buf:" + n))
                    if msg:
                        out.append(Failure(kind, k, f"step {s + 1}: buffer {p + n} after the step", msg, (s + 1, "buffer", n)))
        if predict:
            want, err = expected_predict(batch, runs, s)
            more = max([max(extra(k, s, o), extra(k, s, "eval:" + o)) for k, o in predict_parts(batch)] + [0.0])
            msg = compare(side.predict[s], want, err, extra=more)
            if msg:
                ks = {k for k, _ in predict_parts(batch)}
                out.append(Failure(kind, ks.pop() if len(ks) == 1 else None, f"step {s + 1}: predict", msg, (s + 1, "predict", "")))
        want = sum(r.loss[s] for r in runs)
        scale = sum(float(np.sum(np.abs(r.outs[s][o] * c.cts[o][s]))) for c, r in zip(batch.cases, runs) for o in c.cts)
        if not abs(side.loss[s] - want) <= 1e-3 * scale + 1e-4 + sum(extra(k, s, "loss") for k in range(len(runs))):
            out.append(Failure(kind, None if len(batch.cases) > 1 else 0, f"step {s + 1}: loss", f"got {side.loss[s]:.7g}, expected {want:.7g}",
                               (s + 1, "loss", "")))
    return out


def check(batch: Batch, name: str = "fuzz_prog", sides: tuple | None = None) -> list[Failure]:
    """Every disagreement of the compiled package and of the interpreter with float64 PyTorch.
    `sides`: the package sides to run ("gpu": aot.compile on this adapter with the seed's kernel
    set; "wasm": the web target's wasm set in node), default_sides() when None. When the batch
    does not compile or run, its halves are checked (down to single cases), so one failing graph
    does not hide the others."""
    sides = default_sides() if sides is None else sides
    runs = reference_runs(batch)
    fails: list[Failure] = []
    interp_side = run_interp(batch, runs)
    if isinstance(interp_side, Failure):
        fails.append(interp_side)
    else:
        fails += _side_failures("interp", batch, runs, interp_side, True, True)
    explained = {(f.case, f.key) for f in fails if f.key is not None}
    for side in sides:
        found = [f for f in _package_failures(side, batch, runs, name) if (f.case, f.key) not in explained]
        fails += found  # the interpreter's failure explains a package side's at the same place
        # and the GPU set's a wasm one (the two share the graph, schedule and codegen up to the
        # WGSL): one reproducer says it, and a bug of the wasm set's own shows once that is fixed
        explained |= {(f.case, f.key) for f in found if f.key is not None}
    return fails


def _package_failures(side: str, batch: Batch, runs: list, name: str) -> list[Failure]:
    got = PACKAGE_SIDES[side](batch, name)
    if not isinstance(got, Failure):
        return _side_failures(side, batch, runs, got, batch.capture, batch.infer)
    if len(batch.cases) == 1:
        return [replace(got, case=0)]
    out = []
    half = len(batch.cases) // 2
    for lo, hi in ((0, half), (half, len(batch.cases))):
        sub = replace(batch, cases=batch.cases[lo:hi])
        out += [f.moved(batch, lo) for f in _package_failures(side, sub, runs[lo:hi], name)]
    # a failure only the whole batch shows (an interaction of its graphs)
    return out or [got]


# ---- shrinking ----------------------------------------------------------------------------------


def with_steps(case: Case, steps: int) -> Case:
    leaves = {n: replace(l, values=l.values[:steps]) if l.kind == "input" else l for n, l in case.leaves.items()}
    cts = {o: v[:steps] for o, v in case.cts.items()}
    return Case(leaves, dict(case.modules), list(case.ops), list(case.outputs), cts, steps)


def _rename(case: Case, old: str, new: str) -> Case:
    """References to variable old become new (old's producer is dropped by dce later)."""
    ops = [replace(op, args=tuple(new if a == old else a for a in op.args)) for op in case.ops]
    outputs, cts = [], {}
    for o in case.outputs:
        o2 = new if o == old else o
        if o2 not in outputs:
            outputs.append(o2)
            if o in case.cts:
                cts[o2] = case.cts[o]
    return Case(dict(case.leaves), dict(case.modules), ops, outputs, cts, case.steps)


def cut(case: Case, i: int, run: CaseRun) -> Case:
    """Op i's outputs become leaves holding the values they had (parameters when f32 and the same
    at every step, inputs otherwise)."""
    op = case.ops[i]
    leaves = dict(case.leaves)
    for o in op.outs:
        vals = [run.vals[s][o] for s in range(case.steps)]
        f32 = vals[0].dtype.kind == "f"
        vals = [np.asarray(v, dtype=np.float32 if f32 else np.int32) for v in vals]
        same = all(np.array_equal(v, vals[0]) for v in vals)
        kind = "param" if f32 and same else "input"
        leaves[o] = Leaf(o, kind, "f32" if f32 else "i32", tuple(vals[0].shape), vals[:1] if kind == "param" else vals)
    return dce(Case(leaves, dict(case.modules), case.ops[:i] + case.ops[i + 1 :], list(case.outputs), dict(case.cts), case.steps))


NUMBER_SLOTS = {op: (0, 1) for op in ("add", "sub", "mul", "div", "maximum", "minimum", "less", "greater")}
NUMBER_SLOTS["where"] = (1, 2)


def _candidates(case: Case, run: CaseRun):
    """Smaller variants of a case, roughly biggest cut first."""
    f32_outs = [o for o in case.outputs if o in case.cts]
    for o in case.outputs:
        if len(case.outputs) > 1 and (o not in case.cts or len(f32_outs) > 1):
            c = case.copy()
            c.outputs = [x for x in c.outputs if x != o]
            c.cts.pop(o, None)
            yield "drop output " + o, dce(c)
    for i in reversed(range(len(case.ops))):
        yield f"cut {case.ops[i].op}", cut(case, i, run)
    produced = {o: op for op in case.ops for o in op.outs}
    for o in case.outputs:  # an output's operand as the output instead (its producer goes)
        if o in produced:
            for a in dict.fromkeys(a for a in produced[o].args if isinstance(a, str) and a in produced and a not in case.outputs):
                if run.vals[0][a].dtype.kind == "f":
                    c = case.copy()
                    c.outputs = [a if x == o else x for x in c.outputs]
                    c.cts.pop(o, None)
                    ct = np.round(np.random.default_rng(0).normal(size=run.vals[0][a].shape), 1)
                    c.cts[a] = [np.asarray(ct, dtype=np.float32)] * case.steps
                    yield f"output {a} instead of {o}", dce(c)
    shape = lambda v: tuple(run.vals[0][v].shape)  # noqa: E731
    kind = lambda v: run.vals[0][v].dtype.kind  # noqa: E731
    for op in reversed(case.ops):
        if len(op.outs) != 1:
            continue
        for a in dict.fromkeys(a for a in op.args if isinstance(a, str)):
            if shape(a) == shape(op.outs[0]) and kind(a) == kind(op.outs[0]):
                yield f"bypass {op.op}", dce(_rename(case, op.outs[0], a))
    for i, op in enumerate(case.ops):  # a number instead of a variable operand
        if op.op in NUMBER_SLOTS:
            for j in NUMBER_SLOTS[op.op]:
                a = op.args[j] if j < len(op.args) else None
                others = [x for jj, x in enumerate(op.args) if jj != j and isinstance(x, str)]
                if isinstance(a, str) and others and kind(a) == "f" and all(kind(x) == "f" for x in others):
                    args = op.args[:j] + (0.5,) + op.args[j + 1 :]
                    c = case.copy()
                    c.ops[i] = replace(op, args=args)
                    yield f"number for {a} in {op.op}", dce(c)
    for n, l in case.leaves.items():
        if l.kind == "input" and l.dtype == "f32":
            c = case.copy()
            c.leaves[n] = replace(l, kind="param", values=l.values[:1])
            yield f"input {n} -> param", c


def _rounded(case: Case):
    """The same case with shorter numbers (leaf values and cotangents rounded to 1 decimal)."""
    for n, l in case.leaves.items():
        if l.dtype == "f32":
            vals = [np.round(v, 1).astype(np.float32) for v in l.values]
            if any(not np.array_equal(a, b) for a, b in zip(vals, l.values)):
                c = case.copy()
                c.leaves[n] = replace(l, values=vals)
                yield f"round {n}", c
    for o, vs in case.cts.items():
        vals = [np.asarray(np.round(v, 1), dtype=np.float32) for v in vs]
        if any(not np.array_equal(a, b) for a, b in zip(vals, vs)):
            c = case.copy()
            c.cts[o] = vals
            yield f"round {o}_ct", c


def shrink(batch: Batch, failure: Failure, budget_s: float = 240.0, log=None) -> tuple[Batch, Failure]:
    """A smaller batch (ideally one case of a few ops) that still fails the same way."""
    log = log or (lambda msg: None)
    deadline = time.monotonic() + budget_s
    family = failure.family()
    sides = (SIDE_OF[failure.kind],) if failure.kind in SIDE_OF else ()  # interpreter failures need no package

    def fails(b: Batch) -> Failure | None:
        if time.monotonic() > deadline:
            return None
        if any(not c.ops or not c.cts for c in b.cases) or reference_runs(b, check=True) is None:
            return None
        return next((f for f in check(b, sides=sides) if f.family() == family), None)

    # one case if possible
    order = [failure.case] if failure.case is not None else []
    order += [k for k in range(len(batch.cases)) if k not in order]
    if len(batch.cases) > 1:
        for k in order:
            b = replace(batch, cases=[batch.cases[k]])
            f = fails(b)
            if f:
                batch, failure = b, f
                log(f"shrink: case {k} alone fails")
                break
        else:
            k = 0
            while k < len(batch.cases) and len(batch.cases) > 1:
                b = replace(batch, cases=batch.cases[:k] + batch.cases[k + 1 :])
                f = fails(b)
                if f:
                    batch, failure = b, f
                else:
                    k += 1
    for steps in range(1, batch.steps):
        b = replace(batch, steps=steps, cases=[with_steps(c, steps) for c in batch.cases])
        f = fails(b)
        if f:
            batch, failure = b, f
            log(f"shrink: {steps} step(s)")
            break
    if batch.infer and "predict" not in failure.what:
        b = replace(batch, infer=False)
        f = fails(b)
        if f:
            batch, failure = b, f
    for gen in (_candidates, _rounded):
        progress = True
        while progress and time.monotonic() < deadline:
            progress = False
            for k, case in enumerate(batch.cases):
                run = run_case(case, False, batch.sgd)
                for what, c in gen(case, run) if gen is _candidates else gen(case):
                    b = replace(batch, cases=batch.cases[:k] + [c] + batch.cases[k + 1 :])
                    f = fails(b)
                    if f:
                        batch, failure, progress = b, f, True
                        log(f"shrink: {what} -> {sum(len(c.ops) for c in batch.cases)} ops")
                        break
                if progress:
                    break
    return batch, failure


def signature(batch: Batch, failure: Failure) -> str:
    """Failures with the same signature are taken to be one bug."""
    ops = sorted({(op.kw.get("cls") if op.op in ("module", "nnmod") else op.op) for c in batch.cases for op in c.ops})
    return failure.family() + "|" + ",".join(ops)


# ---- reproducers --------------------------------------------------------------------------------

REPRO_TEST = '''

def _check(got, want, atol, what):
    got = np.asarray(got)
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=atol, err_msg=what)


@pytest.mark.gpu
@pytest.mark.xfail(strict=True, reason={reason!r})
def test_{name}():
    model = aot.compile(program, kernels=KERNELS)
    try:
        if MODULE_PARAMS:
            model.load_params(MODULE_PARAMS, partial=True)
        for step, want in enumerate(EXPECTED):
            if "predict" in want and PREDICT_FIRST:  # the parameters of this step, before its update
                _check(model.predict(**INPUTS[step]), want["predict"], ATOL["predict"], f"step {{step + 1}}: predict")
            res = model.step(**INPUTS[step], **COTANGENTS[step], captures=True)
            assert abs(res.loss - want["loss"]) <= LOSS_TOL[step], f"step {{step + 1}}: loss {{res.loss}}, expected {{want['loss']}}"
            for name, value in want["outputs"].items():
                _check(res.captures[name], value, ATOL[name], f"step {{step + 1}}: output {{name}}")
            grads = model.grads()
            for name, value in want["grads"].items():
                _check(grads[name], value, ATOL[name], f"step {{step + 1}}: gradient of {{name}}")
            params = model.params()
            for name, value in want.get("params", {{}}).items():
                _check(params[name], value, ATOL[name + " after the update"], f"step {{step + 1}}: {{name}} after the update")
            if "predict" in want and not PREDICT_FIRST:
                _check(model.predict(**INPUTS[step]), want["predict"], ATOL["predict"], f"step {{step + 1}}: predict")
    finally:
        model.close()
'''

# a wasm-set failure: the same steps through the web target's wasm set in node (tests/web_node.py)
REPRO_WASM_TEST = '''

def _check(got, want, atol, what):
    got = np.asarray(got)
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=atol, err_msg=what)


@pytest.mark.xfail(strict=True, reason={reason!r})
def test_{name}(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from web_node import node_or_skip, run_steps  # tests/web_node.py: the web module in node 20+

    node_or_skip()
    module = aot.build(program, tmp_path, target="web", force=True) / f"{{program.name}}.js"
    n = len(EXPECTED)
    got = run_steps(module, [dict(INPUTS[s], **COTANGENTS[s]) for s in range(n)],
                    INPUTS if "predict" in EXPECTED[0] else None, load=MODULE_PARAMS, predict_first=PREDICT_FIRST,
                    params="params" in EXPECTED[0], replay=True, kernels=KERNELS, relaxed=RELAXED)
    assert "error" not in got, f"{{got.get('at')}}: {{got['error']}}"
    for step, (want, res) in enumerate(zip(EXPECTED, got["steps"])):
        if "predict" in want:
            _check(res["predict"], want["predict"], ATOL["predict"], f"step {{step + 1}}: predict")
        assert abs(res["loss"] - want["loss"]) <= LOSS_TOL[step], f"step {{step + 1}}: loss {{res['loss']}}, expected {{want['loss']}}"
        for name, value in want["outputs"].items():
            _check(res["captures"][name], value, ATOL[name], f"step {{step + 1}}: output {{name}}")
        for name, value in want["grads"].items():
            _check(res["grads"][name], value, ATOL[name], f"step {{step + 1}}: gradient of {{name}}")
        for name, value in want.get("params", {{}}).items():
            _check(res["params"][name], value, ATOL[name + " after the update"], f"step {{step + 1}}: {{name}} after the update")
    first, again = got["steps"][0], got["replay"]  # step 1 after reset(): bit for bit
    assert np.array_equal(first["loss"], again["loss"], equal_nan=True), "step 1 again after reset(): loss"
    for part in ("captures", "grads"):
        for name, value in first[part].items():
            assert np.array_equal(value, again[part][name], equal_nan=True), f"step 1 again after reset(): {{name}}"
'''

REPRO_INTERP_TEST = '''

@pytest.mark.xfail(strict=True, reason={reason!r})
def test_{name}_interpreter():
    from aot import interp
    from aot.frontend import trace_program

    ref = interp.Reference(trace_program(program))
    ref.params.update({{k: np.asarray(v) for k, v in MODULE_PARAMS.items()}})
    for step, want in enumerate(EXPECTED):
        loss = ref.step(**INPUTS[step], **COTANGENTS[step])
        assert abs(loss - want["loss"]) <= LOSS_TOL[step], f"step {{step + 1}}: loss {{loss}}, expected {{want['loss']}}"
        for name, value in want["grads"].items():
            _check(ref.last_grads[name], value, ATOL[name], f"step {{step + 1}}: gradient of {{name}}")
'''


def _dict_source(d: dict, indent: str) -> str:
    if not d:
        return "{}"
    inner = "".join(f"{indent}    {k!r}: {array_source(v, indent + '    ')},\n" for k, v in d.items())
    return "{\n" + inner + indent + "}"


def repro_source(batch: Batch, failure: Failure, name: str, note: str = "") -> str:
    runs = reference_runs(batch)
    expected, atol, loss_tol = [], {}, []
    for s in range(batch.steps):
        want = {"loss": sum(r.loss[s] for r in runs), "outputs": {}, "grads": {}}
        for k, (c, r) in enumerate(zip(batch.cases, runs)):
            p = batch.prefix(k)
            for o in c.outputs if batch.capture else ():
                want["outputs"][p + o] = r.outs[s][o]
            for n, v in r.grads[s].items():
                want["grads"][p + n] = v
            for n, v in list(r.outs[s].items()) + list(r.grads[s].items()):
                t = float(tolerance(np.zeros(()), 0.0) + 1e-4 * (np.max(np.abs(v)) if v.size else 0) + 50 * r.err[n])
                t += noise_extra(batch, r, c, s, n)  # SGD batches: the trajectory's spread under 1-ulp noise
                if n in r.grads[s] and v.dtype.kind == "f" and (np.abs(v) <= r.zero_tol.get(n, 0.0)).any():
                    t = max(t, r.zero_tol.get(n, 0.0))  # a scalar atol: the exact zeros' allowance everywhere
                atol[p + n] = max(atol.get(p + n, 0.0), t)
        if batch.sgd is not None:
            want["params"] = {}
            for k, (c, r) in enumerate(zip(batch.cases, runs)):
                for n, v in r.params[s + 1].items():
                    pname = batch.prefix(k) + n
                    want["params"][pname] = v
                    t = float(1e-5 + 1e-4 * (np.max(np.abs(v)) if v.size else 0) + 50 * (4 * batch.sgd[0] * r.err[n]))
                    t += noise_extra(batch, r, c, s, "param:" + n)
                    atol[pname + " after the update"] = max(atol.get(pname + " after the update", 0.0), t)
        if batch.infer:
            want["predict"], err = expected_predict(batch, runs, s)
            t = float(1e-5 + 1e-4 * (np.max(np.abs(want["predict"])) if want["predict"].size else 0) + 50 * err)
            t += max([max(noise_extra(batch, runs[k], batch.cases[k], s, o), noise_extra(batch, runs[k], batch.cases[k], s, "eval:" + o))
                      for k, o in predict_parts(batch)] + [0.0])
            atol["predict"] = max(atol.get("predict", 0.0), t)
        scale = sum(float(np.sum(np.abs(r.outs[s][o] * c.cts[o][s]))) for c, r in zip(batch.cases, runs) for o in c.cts)
        loss_tol.append(1e-3 * scale + 1e-4 + sum(noise_extra(batch, r, c, s, "loss") for c, r in zip(batch.cases, runs)))
        expected.append(want)
    reason = f"fuzz: {failure.what}: {failure.detail}"[:160]
    doc = [f'"""Fuzz reproducer ({failure.kind}): {failure.what}.', ""]
    doc += [f"    {line}" if i else line for i, line in enumerate(_wrap(failure.detail, 96))]
    doc += ["", "Expected values are float64 PyTorch autograd of the same graph (tests/fuzz_graphs.py)."]
    if note:
        doc += [""] + _wrap(note, 96)
    doc += ['"""', ""]
    src = batch_source(batch, name, inline=True).replace("import numpy as np\n", "import numpy as np\nimport pytest\n", 1)
    L = ["\n".join(doc), src, ""]
    L.append("INPUTS = [")
    for s in range(batch.steps):
        L.append(f"    {_dict_source(feeds(batch, s, with_cts=False), '    ')},")
    L.append("]")
    L.append("COTANGENTS = [")
    for s in range(batch.steps):
        cts = {k: v for k, v in feeds(batch, s).items() if k not in feeds(batch, s, with_cts=False)}
        L.append(f"    {_dict_source(cts, '    ')},")
    L.append("]")
    L.append("EXPECTED = [")
    for want in expected:
        L.append("    {")
        L.append(f"        'loss': {want['loss']!r},")
        L.append(f"        'outputs': {_dict_source(want['outputs'], '        ')},")
        L.append(f"        'grads': {_dict_source(want['grads'], '        ')},")
        if "params" in want:
            L.append(f"        'params': {_dict_source(want['params'], '        ')},")
        if "predict" in want:
            L.append(f"        'predict': {array_source(want['predict'], '        ')},")
        L.append("    },")
    L.append("]")
    L.append(f"ATOL = {{{', '.join(f'{k!r}: {v:.3g}' for k, v in atol.items())}}}")
    L.append(f"LOSS_TOL = [{', '.join(f'{v:.3g}' for v in loss_tol)}]")
    L.append(f"PREDICT_FIRST = {batch.sgd is not None}")
    if SIDE_OF.get(failure.kind) == "wasm":
        L.append("KERNELS = 'wasm'  # the web target's wasm kernel set, run in node (run_wasm)")
        L.append(f"RELAXED = {wasm_relaxed(batch.seed)!r}  # the relaxed-SIMD module (fused matmul multiply-adds), as Chromium runs it")
        text = "\n".join(L) + "\n" + REPRO_WASM_TEST.format(reason=reason, name=name)
    else:
        L.append(f"KERNELS = {kernel_set(batch.seed)!r}  # the kernel set it failed with (run_gpu)")
        text = "\n".join(L) + "\n" + REPRO_TEST.format(reason=reason, name=name)
    if failure.kind == "interp-error":  # the package may well be right: a plain regression test
        text = text.replace(f"@pytest.mark.xfail(strict=True, reason={reason!r})\n", "")
    elif failure.kind == "interp":  # the package usually inherits the graph's error, but may not
        text = text.replace("xfail(strict=True, ", "xfail(strict=False, ")
    if failure.kind in ("interp", "interp-error"):
        text += REPRO_INTERP_TEST.format(reason=reason, name=name)
    return text


def _wrap(text: str, width: int) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) or [""]


def write_repro(batch: Batch, failure: Failure, out_dir, note: str = "") -> Path:
    tag = f"{zlib.crc32(batch_source(batch, 'x', inline=True).encode()):08x}"
    name = f"fuzz_{re.sub(r'[^a-z0-9]+', '_', failure.kind.lower())}_{tag}"
    out = Path(out_dir) / f"test_{name}.py"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(repro_source(batch, failure, name, note))
    return out


@contextmanager
def unformatted_builds():
    """Generated Python is valid before black formats it (black parses it first) and black takes
    half or more of a small program's build time: while active, builds skip formatting."""
    import aot.emit

    # _py_cached too: it keeps _py's output on disk by the source's hash, and an unformatted
    # runtime file kept there was what later builds (regen_goldens included) copied
    original = aot.emit._py, aot.emit._py_cached
    aot.emit._py = aot.emit._py_cached = lambda src: src
    try:
        yield
    finally:
        aot.emit._py, aot.emit._py_cached = original
