"""The op table (STYLE.md §4.9): one `OpCase` per use of a public op, and the harness that traces it.

A case is a function of traced tensors built from the public `aot.ops` / `aot.nn` API, the
shapes and dtypes of its inputs, keyword arguments, and the input domain that keeps
finite differences away from kinks and ties. `ref` is a direct NumPy formula and `torch`
the PyTorch equivalent (`torch(t, *values, **kwargs)` with `t` the torch module), both
over the inputs followed by the case's module parameters in declaration order.

`build(case)` traces a case into a graph: inputs `x0, x1, ...`, parameters `p0, p1, ...`,
cotangent inputs `ct0, ...`, the scalar `loss = sum_k <out_k, ct_k>` and, when the case is
differentiable, the gradients appended by `aot.grad.append_grads`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from aot import nn, ops
from aot.grad import append_grads
from aot.ir import Graph, Tensor
from aot.trace import emit, tracing

DOMAINS = ("real", "positive", "nonzero", "distinct", "mask")


@dataclass(frozen=True)
class Arg:
    """One input: shape, dtype, and the domain its values come from.

    f32 domains: real U(-2, 2); positive U(0.5, 2); nonzero |x| in [0.25, 2] (relu, abs,
    divisors, comparisons against 0); distinct (no two values of the case's distinct inputs
    closer than ~0.05: max, maximum, argmax, comparisons); mask (0/1 conditions, not
    differentiated). i32 inputs are uniform integers in [0, high).
    """

    shape: tuple[int, ...]
    dtype: str = "f32"
    domain: str | None = None  # None: the case's domain
    high: int = 0

    @property
    def diff(self) -> bool:
        return self.dtype == "f32" and self.domain != "mask"


def f32(*shape: int, domain: str | None = None) -> Arg:
    return Arg(tuple(shape), "f32", domain)


def i32(*shape: int, high: int) -> Arg:
    return Arg(tuple(shape), "i32", None, high)


def mask(*shape: int) -> Arg:
    return Arg(tuple(shape), "f32", "mask")


@dataclass(frozen=True)
class OpCase:
    name: str  # "<api op>.<variant>": the prefix is the public op under test
    fn: Callable
    inputs: tuple[Arg, ...]
    kwargs: dict = field(default_factory=dict)
    domain: str = "real"
    grad: bool = True
    ref: Callable | None = None
    torch: Callable | None = None

    @property
    def op(self) -> str:
        return self.name.split(".", 1)[0]

    def __repr__(self) -> str:
        return f"OpCase({self.name})"


# ---- NumPy reference formulas ---------------------------------------------------------------

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def np_conv2d(x, w, stride=1, padding=0, groups=1):
    (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh, ow = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    og = o // groups
    out = np.zeros((n, o, oh, ow))
    for oc in range(o):
        g = oc // og
        xs = xp[:, g * cg : (g + 1) * cg]
        for i in range(oh):
            for j in range(ow):
                win = xs[:, :, i * sh : i * sh + kh, j * sw : j * sw + kw]
                out[:, oc, i, j] = np.sum(win * w[oc], axis=(1, 2, 3))
    return out


def np_unfold(x, k, stride, padding):
    (kh, kw), (sh, sw), (ph, pw) = k, stride, padding
    n, c, h, w = x.shape
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    out = np.zeros((n, c, kh, kw, oh, ow))
    for i, j, r, q in np.ndindex(kh, kw, oh, ow):
        y, z = r * sh + i - ph, q * sw + j - pw
        if 0 <= y < h and 0 <= z < w:
            out[:, :, i, j, r, q] = x[:, :, y, z]
    return out


def np_fold(cols, size, stride, padding):
    (h, w), (sh, sw), (ph, pw) = size, stride, padding
    n, c, kh, kw, oh, ow = cols.shape
    out = np.zeros((n, c, h, w))
    for i, j, r, q in np.ndindex(kh, kw, oh, ow):
        y, z = r * sh + i - ph, q * sw + j - pw
        if 0 <= y < h and 0 <= z < w:
            out[:, :, y, z] += cols[:, :, i, j, r, q]
    return out


def np_max_pool2d(x, k, stride=None, padding=0):
    (kh, kw) = _pair(k)
    (sh, sw) = _pair(k if stride is None else stride)
    (ph, pw) = _pair(padding)
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-np.inf)
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    out = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            out[:, :, i, j] = xp[:, :, i * sh : i * sh + kh, j * sw : j * sw + kw].max(axis=(2, 3))
    return out


def np_softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_log_softmax(x, axis=-1):
    z = x - x.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def np_softmax_causal(s):
    t = s.shape[-1]
    future = np.arange(t)[None, :] > np.arange(t)[:, None]
    return np_softmax(np.where(future, -np.inf, s))


def np_cross_entropy(logits, targets, reduction="mean"):
    nll = -np.take_along_axis(np_log_softmax(logits), targets[..., None].astype(np.int64), -1)[..., 0]
    return {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction](nll)


def np_gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def np_gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_layer_norm(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def np_rms_norm(x, g, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def np_argmax(x, axis=None, keepdims=False):
    return np.argmax(x, axis=axis, keepdims=keepdims).astype(np.int32)


def np_split_heads(x, n):
    *lead, t, d = x.shape
    y = x.reshape(*lead, t, n, d // n)
    return np.swapaxes(y, -2, -3)


def np_merge_heads(x):
    *lead, n, t, dh = x.shape
    return np.swapaxes(x, -2, -3).reshape(*lead, t, n * dh)


# ---- torch equivalents (called only when torch is installed) -----------------------------------


def _dims(x, axis):
    return tuple(range(x.ndim)) if axis is None else axis


def t_sum(t, x, axis=None, keepdims=False):
    return t.sum(x, dim=_dims(x, axis), keepdim=keepdims)


def t_mean(t, x, axis=None, keepdims=False):
    return t.mean(x, dim=_dims(x, axis), keepdim=keepdims)


def t_max(t, x, axis=None, keepdims=False):
    return t.amax(x, dim=_dims(x, axis), keepdim=keepdims)


def t_softmax_causal(t, s):
    n = s.shape[-1]
    future = t.ones(n, n, dtype=t.bool).triu(1)
    return t.softmax(s.masked_fill(future, -math.inf), -1)


def t_cross_entropy(t, logits, targets, reduction="mean"):
    c = logits.shape[-1]
    out = t.nn.functional.cross_entropy(logits.reshape(-1, c), targets.reshape(-1).long(), reduction=reduction)
    return out.reshape(targets.shape) if reduction == "none" else out


def t_max_pool2d(t, x, k, stride=None, padding=0):
    return t.nn.functional.max_pool2d(x, k, stride, padding)


def t_conv2d(t, x, w, stride=1, padding=0, groups=1):
    return t.nn.functional.conv2d(x, w, stride=stride, padding=padding, groups=groups)


# ---- the table ------------------------------------------------------------------------------

C = OpCase
_R3 = (f32(2, 3, 4),)

CASES: list[OpCase] = [
    # binary elementwise: broadcasting on either or both sides, Python numbers on either side
    C("add.same", ops.add, (f32(2, 3), f32(2, 3)), ref=np.add, torch=lambda t, a, b: a + b),
    C("add.bcast_right", ops.add, (f32(2, 3), f32(3)), ref=np.add, torch=lambda t, a, b: a + b),
    C("add.bcast_left", ops.add, (f32(3), f32(2, 3)), ref=np.add, torch=lambda t, a, b: a + b),
    C("add.bcast_both", ops.add, (f32(2, 1, 4), f32(3, 1)), ref=np.add, torch=lambda t, a, b: a + b),
    C("add.zero_d", ops.add, (f32(2, 3), f32()), ref=np.add, torch=lambda t, a, b: a + b),
    C("add.scalar_right", lambda x: ops.add(x, 1.5), (f32(2, 3),), ref=lambda x: x + 1.5),
    C("add.scalar_left", lambda x: ops.add(1.5, x), (f32(2, 3),), ref=lambda x: 1.5 + x),
    C("add.same_tensor", lambda x: ops.add(x, x), (f32(3),), ref=lambda x: 2 * x),
    C("sub.bcast_both", ops.sub, (f32(4, 1), f32(1, 3)), ref=np.subtract, torch=lambda t, a, b: a - b),
    C("sub.scalar_left", lambda x: ops.sub(2.0, x), (f32(2, 3),), ref=lambda x: 2.0 - x),
    C("sub.scalar_right_int", lambda x: ops.sub(x, 2), (f32(2, 3),), ref=lambda x: x - 2),
    C("mul.bcast_right", ops.mul, (f32(2, 3, 4), f32(4)), ref=np.multiply, torch=lambda t, a, b: a * b),
    C("mul.bcast_both", ops.mul, (f32(1, 3), f32(2, 1)), ref=np.multiply, torch=lambda t, a, b: a * b),
    C("mul.scalar_left", lambda x: ops.mul(3, x), (f32(2, 3),), ref=lambda x: 3 * x),
    C("mul.same_tensor", lambda x: ops.mul(x, x), (f32(2, 3),), ref=lambda x: x * x),
    C("div.bcast_right", ops.div, (f32(2, 3), f32(2, 1, domain="nonzero")), ref=np.divide, torch=lambda t, a, b: a / b),
    C("div.bcast_left", ops.div, (f32(3), f32(2, 3, domain="nonzero")), ref=np.divide, torch=lambda t, a, b: a / b),
    C("div.scalar_right", lambda x: ops.div(x, 4.0), (f32(2, 3),), ref=lambda x: x / 4.0),
    C("div.scalar_left", lambda x: ops.div(2.0, x), (f32(2, 3),), domain="nonzero", ref=lambda x: 2.0 / x),
    C("minimum.bcast", ops.minimum, (f32(2, 3), f32(3)), domain="distinct", ref=np.minimum, torch=lambda t, a, b: t.minimum(a, b)),
    C("minimum.scalar_left", lambda x: ops.minimum(0.0, x), (f32(2, 3),), domain="nonzero", ref=lambda x: np.minimum(0.0, x)),
    C("maximum.bcast_both", ops.maximum, (f32(2, 1), f32(1, 3)), domain="distinct", ref=np.maximum, torch=lambda t, a, b: t.maximum(a, b)),
    C("maximum.scalar_right", lambda x: ops.maximum(x, 0.0), (f32(2, 3),), domain="nonzero", ref=lambda x: np.maximum(x, 0.0)),
    # comparisons are piecewise constant: away from ties the gradient is exactly zero
    C("less.bcast", ops.less, (f32(2, 3), f32(3)), domain="distinct", ref=lambda a, b: np.less(a, b).astype(np.float64)),
    C("less.scalar", lambda x: ops.less(x, 0.0), (f32(2, 3),), domain="nonzero", ref=lambda x: (x < 0).astype(np.float64)),
    C("less.i32", ops.less, (i32(5, high=3), i32(5, high=3)), grad=False, ref=lambda a, b: (a < b).astype(np.float64)),
    C("greater.bcast_left", ops.greater, (f32(3), f32(2, 3)), domain="distinct", ref=lambda a, b: (a > b).astype(np.float64)),
    C("greater.scalar_left", lambda x: ops.greater(0.0, x), (f32(2, 3),), domain="nonzero", ref=lambda x: (0.0 > x).astype(np.float64)),
    C("where.same", ops.where, (mask(2, 3), f32(2, 3), f32(2, 3)), ref=lambda c, a, b: np.where(c != 0, a, b),
      torch=lambda t, c, a, b: t.where(c != 0, a, b)),
    C("where.bcast", ops.where, (mask(1, 3), f32(2, 3), f32(2, 1)), ref=lambda c, a, b: np.where(c != 0, a, b),
      torch=lambda t, c, a, b: t.where(c != 0, a, b)),
    C("where.scalar_else", lambda c, x: ops.where(c, x, 0.0), (mask(2, 3), f32(3)), ref=lambda c, x: np.where(c != 0, x, 0.0)),
    C("where.scalar_then", lambda c, x: ops.where(c, -1.0, x), (mask(2, 3), f32(2, 3)), ref=lambda c, x: np.where(c != 0, -1.0, x)),
    C("where.i32_branch", lambda c, i: ops.where(c, i, 0), (mask(2, 3), i32(3, high=9)), grad=False,
      ref=lambda c, i: np.where(c != 0, i, 0).astype(np.int32)),
    C("where.from_less", lambda a, b: ops.where(ops.less(a, b), a, b), (f32(2, 3), f32(2, 3)), domain="distinct", ref=np.minimum),
    # unary
    C("neg.vec", ops.neg, (f32(5),), ref=np.negative, torch=lambda t, x: -x),
    C("abs.mat", ops.abs, (f32(2, 3),), domain="nonzero", ref=np.abs, torch=lambda t, x: t.abs(x)),
    C("sqrt.mat", ops.sqrt, (f32(2, 3),), domain="positive", ref=np.sqrt, torch=lambda t, x: t.sqrt(x)),
    C("rsqrt.mat", ops.rsqrt, (f32(2, 3),), domain="positive", ref=lambda x: 1 / np.sqrt(x), torch=lambda t, x: t.rsqrt(x)),
    C("exp.zero_d", ops.exp, (f32(),), ref=np.exp, torch=lambda t, x: t.exp(x)),
    C("exp.mat", ops.exp, (f32(2, 3),), ref=np.exp, torch=lambda t, x: t.exp(x)),
    C("log.mat", ops.log, (f32(2, 3),), domain="positive", ref=np.log, torch=lambda t, x: t.log(x)),
    C("square.mat", ops.square, (f32(2, 3),), ref=np.square, torch=lambda t, x: t.square(x)),
    C("sin.mat", ops.sin, (f32(2, 3),), ref=np.sin, torch=lambda t, x: t.sin(x)),
    C("cos.mat", ops.cos, (f32(2, 3),), ref=np.cos, torch=lambda t, x: t.cos(x)),
    C("tanh.mat", ops.tanh, (f32(2, 3),), ref=np.tanh, torch=lambda t, x: t.tanh(x)),
    C("sigmoid.mat", ops.sigmoid, (f32(2, 3),), ref=np_sigmoid, torch=lambda t, x: t.sigmoid(x)),
    C("relu.mat", ops.relu, (f32(2, 3),), domain="nonzero", ref=lambda x: np.maximum(x, 0), torch=lambda t, x: t.relu(x)),
    C("gelu.exact", ops.gelu, (f32(2, 3),), ref=np_gelu, torch=lambda t, x: t.nn.functional.gelu(x)),
    C("gelu.tanh", ops.gelu, (f32(2, 3),), {"approximate": "tanh"}, ref=lambda x, approximate: np_gelu_tanh(x),
      torch=lambda t, x, approximate: t.nn.functional.gelu(x, approximate=approximate)),
    C("silu.mat", ops.silu, (f32(2, 3),), ref=lambda x: x * np_sigmoid(x), torch=lambda t, x: t.nn.functional.silu(x)),
    C("erf.mat", ops.erf, (f32(2, 3),), ref=_erf, torch=lambda t, x: t.erf(x)),
    # reductions: axis None / int / negative / tuple, keepdims
    C("sum.all", ops.sum, _R3, ref=np.sum, torch=t_sum),
    C("sum.axis0", ops.sum, _R3, {"axis": 0}, ref=np.sum, torch=t_sum),
    C("sum.neg_keepdims", ops.sum, _R3, {"axis": -1, "keepdims": True}, ref=np.sum, torch=t_sum),
    C("sum.tuple", ops.sum, _R3, {"axis": (0, 2)}, ref=np.sum, torch=t_sum),
    C("sum.tuple_neg_keepdims", ops.sum, _R3, {"axis": (-1, 0), "keepdims": True}, ref=np.sum, torch=t_sum),
    C("sum.all_keepdims", ops.sum, (f32(2, 3),), {"keepdims": True}, ref=np.sum, torch=t_sum),
    C("sum.zero_d", ops.sum, (f32(),), ref=np.sum),
    C("mean.all", ops.mean, _R3, ref=np.mean, torch=t_mean),
    C("mean.axis1", ops.mean, _R3, {"axis": 1}, ref=np.mean, torch=t_mean),
    C("mean.tuple_neg_keepdims", ops.mean, _R3, {"axis": (0, -1), "keepdims": True}, ref=np.mean, torch=t_mean),
    C("max.all", ops.max, _R3, domain="distinct", ref=np.max, torch=t_max),
    C("max.axis1", ops.max, _R3, {"axis": 1}, domain="distinct", ref=np.max, torch=t_max),
    C("max.neg_keepdims", ops.max, _R3, {"axis": -1, "keepdims": True}, domain="distinct", ref=np.max, torch=t_max),
    C("max.tuple", ops.max, _R3, {"axis": (0, 2)}, domain="distinct", ref=np.max, torch=t_max),
    C("argmax.all", ops.argmax, _R3, domain="distinct", grad=False, ref=np_argmax),
    C("argmax.all_keepdims", ops.argmax, _R3, {"keepdims": True}, domain="distinct", grad=False, ref=np_argmax),
    C("argmax.axis0", ops.argmax, _R3, {"axis": 0}, domain="distinct", grad=False, ref=np_argmax),
    C("argmax.neg_keepdims", ops.argmax, _R3, {"axis": -1, "keepdims": True}, domain="distinct", grad=False, ref=np_argmax),
    # layout
    C("reshape.infer", lambda x: ops.reshape(x, (4, -1)), _R3, ref=lambda x: x.reshape(4, -1)),
    C("reshape.flat", lambda x: ops.reshape(x, -1), _R3, ref=lambda x: x.reshape(-1)),
    C("reshape.to_zero_d", lambda x: ops.reshape(x, ()), (f32(1, 1),), ref=lambda x: x.reshape(())),
    C("reshape.i32", lambda i: ops.reshape(i, (3, 2)), (i32(2, 3, high=9),), grad=False, ref=lambda i: i.reshape(3, 2)),
    C("transpose.perm", lambda x: ops.transpose(x, (2, 0, 1)), _R3, ref=lambda x: x.transpose(2, 0, 1)),
    C("transpose.default", ops.transpose, _R3, ref=np.transpose, torch=lambda t, x: x.permute(2, 1, 0)),
    C("transpose.neg_axes", lambda x: ops.transpose(x, (-1, 0, 1)), _R3, ref=lambda x: x.transpose(2, 0, 1)),
    C("swapaxes.neg", lambda x: ops.swapaxes(x, 0, -1), _R3, ref=lambda x: np.swapaxes(x, 0, -1)),
    C("swapaxes.mid", lambda x: ops.swapaxes(x, 1, 2), (f32(2, 3, 4, 2),), ref=lambda x: np.swapaxes(x, 1, 2)),
    C("broadcast_to.lead", lambda x: ops.broadcast_to(x, (2, 3, 4)), (f32(4),), ref=lambda x: np.broadcast_to(x, (2, 3, 4))),
    C("broadcast_to.inner", lambda x: ops.broadcast_to(x, (2, 3, 4)), (f32(3, 1),), ref=lambda x: np.broadcast_to(x, (2, 3, 4))),
    C("broadcast_to.zero_d", lambda x: ops.broadcast_to(x, (2, 2)), (f32(),), ref=lambda x: np.broadcast_to(x, (2, 2))),
    C("concat.neg_axis", lambda a, b: ops.concat([a, b], -1), (f32(2, 3), f32(2, 1)), ref=lambda a, b: np.concatenate([a, b], -1)),
    C("concat.three", lambda a, b, c: ops.concat([a, b, c], 0), (f32(1, 3), f32(2, 3), f32(1, 3)),
      ref=lambda a, b, c: np.concatenate([a, b, c], 0), torch=lambda t, a, b, c: t.cat([a, b, c], 0)),
    C("concat.i32", lambda a, b: ops.concat([a, b], 0), (i32(2, high=4), i32(3, high=4)), grad=False,
      ref=lambda a, b: np.concatenate([a, b])),
    C("stack.first", lambda a, b: ops.stack([a, b], 0), (f32(2, 3), f32(2, 3)), ref=lambda a, b: np.stack([a, b], 0)),
    C("stack.neg_axis", lambda a, b, c: ops.stack([a, b, c], -1), (f32(2, 3), f32(2, 3), f32(2, 3)),
      ref=lambda a, b, c: np.stack([a, b, c], -1), torch=lambda t, a, b, c: t.stack([a, b, c], -1)),
    C("split.sizes", lambda x: ops.split(x, [1, 2], axis=-1), (f32(2, 3),), ref=lambda x: np.split(x, [1], -1)),
    C("split.int", lambda x: ops.split(x, 2, axis=0), (f32(5, 2),), ref=lambda x: np.split(x, [2, 4], 0),
      torch=lambda t, x: t.split(x, 2, 0)),
    C("narrow.mid", lambda x: ops.narrow(x, 1, 1, 2), (f32(2, 4, 3),), ref=lambda x: x[:, 1:3],
      torch=lambda t, x: x.narrow(1, 1, 2)),
    C("narrow.neg_axis", lambda x: ops.narrow(x, -1, 0, 2), (f32(2, 4, 3),), ref=lambda x: x[..., 0:2]),
    # linear algebra
    C("matmul.2d", ops.matmul, (f32(3, 4), f32(4, 5)), ref=np.matmul, torch=lambda t, a, b: a @ b),
    C("matmul.shared_weight", ops.matmul, (f32(2, 3, 4), f32(4, 5)), ref=np.matmul, torch=lambda t, a, b: a @ b),
    C("matmul.batched", ops.matmul, (f32(2, 3, 4), f32(2, 4, 5)), ref=np.matmul, torch=lambda t, a, b: a @ b),
    C("matmul.batched_4d", ops.matmul, (f32(2, 2, 3, 4), f32(2, 2, 4, 2)), ref=np.matmul, torch=lambda t, a, b: a @ b),
    C("matmul.same_tensor", lambda a: ops.matmul(a, a), (f32(3, 3),), ref=lambda a: a @ a),
    # indexing and casting
    C("cast.f32_to_i32", lambda x: ops.cast(x, "i32"), (f32(2, 4),), grad=False, ref=lambda x: np.trunc(x).astype(np.int32)),
    C("cast.i32_to_f32", lambda i, x: ops.cast(i, "f32") * x, (i32(2, 3, high=5), f32(2, 3)), ref=lambda i, x: i * x),
    C("cast.identity", lambda x: ops.cast(x, "f32"), (f32(2, 3),), ref=lambda x: x),
    C("one_hot.plain", lambda i: ops.one_hot(i, 5), (i32(2, 3, high=5),), grad=False,
      ref=lambda i: np.eye(5)[i], torch=lambda t, i: t.nn.functional.one_hot(i.long(), 5).double()),
    C("one_hot.times", lambda i, x: ops.one_hot(i, 4) * x, (i32(3, high=4), f32(3, 4)), ref=lambda i, x: np.eye(4)[i] * x),
    C("arange.i32", lambda: ops.arange(5), (), grad=False, ref=lambda: np.arange(5, dtype=np.int32)),
    C("arange.f32", lambda x: x * ops.arange(4, "f32"), (f32(2, 4),), ref=lambda x: x * np.arange(4)),
    C("embedding.2d_idx", ops.embedding, (f32(7, 3), i32(2, 4, high=7)), ref=lambda w, i: w[i],
      torch=lambda t, w, i: t.nn.functional.embedding(i.long(), w)),
    C("embedding.3d_table", ops.embedding, (f32(5, 2, 3), i32(4, high=5)), ref=lambda w, i: w[i]),
    C("embedding.zero_d_idx", ops.embedding, (f32(5, 2), i32(high=5)), ref=lambda w, i: w[i]),
    C("take_along_axis.last", ops.take_along_axis, (f32(3, 5), i32(3, 4, high=5)), {"axis": -1},
      ref=np.take_along_axis, torch=lambda t, x, i, axis: t.gather(x, axis, i.long())),
    C("take_along_axis.first", ops.take_along_axis, (f32(4, 3), i32(2, 3, high=4)), {"axis": 0},
      ref=np.take_along_axis, torch=lambda t, x, i, axis: t.gather(x, axis, i.long())),
    C("take_along_axis.1d", ops.take_along_axis, (f32(5), i32(3, high=5)), {"axis": 0}, ref=np.take_along_axis),
    C("take_along_axis.mid", ops.take_along_axis, (f32(2, 4, 3), i32(2, 2, 3, high=4)), {"axis": 1}, ref=np.take_along_axis),
    # ML composites
    C("softmax.last", ops.softmax, (f32(2, 5),), ref=np_softmax, torch=lambda t, x: t.softmax(x, -1)),
    C("softmax.axis0", ops.softmax, (f32(3, 4),), {"axis": 0}, ref=np_softmax, torch=lambda t, x, axis: t.softmax(x, axis)),
    C("log_softmax.last", ops.log_softmax, (f32(2, 5),), ref=np_log_softmax, torch=lambda t, x: t.log_softmax(x, -1)),
    C("log_softmax.mid", ops.log_softmax, _R3, {"axis": 1}, ref=np_log_softmax, torch=lambda t, x, axis: t.log_softmax(x, axis)),
    C("softmax_causal.batched", ops.softmax_causal, (f32(2, 4, 4),), ref=np_softmax_causal, torch=t_softmax_causal),
    C("softmax_causal.2d", ops.softmax_causal, (f32(3, 3),), ref=np_softmax_causal, torch=t_softmax_causal),
    C("cross_entropy.mean", ops.cross_entropy, (f32(4, 5), i32(4, high=5)), ref=np_cross_entropy, torch=t_cross_entropy),
    C("cross_entropy.sum", ops.cross_entropy, (f32(4, 5), i32(4, high=5)), {"reduction": "sum"},
      ref=np_cross_entropy, torch=t_cross_entropy),
    C("cross_entropy.none", ops.cross_entropy, (f32(4, 5), i32(4, high=5)), {"reduction": "none"},
      ref=np_cross_entropy, torch=t_cross_entropy),
    C("cross_entropy.3d", ops.cross_entropy, (f32(2, 3, 5), i32(2, 3, high=5)), ref=np_cross_entropy, torch=t_cross_entropy),
    # its gradient is zero by design, which finite differences cannot see: test_grad checks it directly
    C("stop_gradient.forward", ops.stop_gradient, (f32(2, 3),), grad=False, ref=lambda x: x),
    # conv2d (through the internal unfold/fold primitives) and max_pool2d
    C("conv2d.plain", ops.conv2d, (f32(1, 2, 4, 4), f32(3, 2, 2, 2)), ref=np_conv2d, torch=t_conv2d),
    C("conv2d.stride_pad_groups", ops.conv2d, (f32(2, 4, 5, 5), f32(6, 2, 3, 3)), {"stride": 2, "padding": 1, "groups": 2},
      ref=np_conv2d, torch=t_conv2d),
    C("conv2d.pairs", ops.conv2d, (f32(1, 2, 4, 5), f32(2, 2, 3, 2)), {"stride": (1, 2), "padding": (1, 0)},
      ref=np_conv2d, torch=t_conv2d),
    C("conv2d.depthwise", ops.conv2d, (f32(1, 3, 4, 4), f32(3, 1, 3, 3)), {"padding": 1, "groups": 3},
      ref=np_conv2d, torch=t_conv2d),
    # stride 1, groups 1: the custom VJP (unfolded operands computed inside the matmuls)
    C("conv2d.same_pad", ops.conv2d, (f32(2, 3, 5, 5), f32(4, 3, 3, 3)), {"padding": 1}, ref=np_conv2d, torch=t_conv2d),
    C("conv2d.rect_pad", ops.conv2d, (f32(2, 2, 4, 6), f32(3, 2, 2, 3)), {"padding": (1, 2)}, ref=np_conv2d, torch=t_conv2d),
    C("conv2d.one_by_one", ops.conv2d, (f32(3, 4, 3, 2), f32(5, 4, 1, 1)), ref=np_conv2d, torch=t_conv2d),
    C("max_pool2d.k2", ops.max_pool2d, (f32(1, 2, 4, 4),), {"k": 2}, domain="distinct", ref=np_max_pool2d, torch=t_max_pool2d),
    C("max_pool2d.stride_pad", ops.max_pool2d, (f32(2, 2, 5, 5),), {"k": 3, "stride": 2, "padding": 1}, domain="distinct",
      ref=np_max_pool2d, torch=t_max_pool2d),
    C("max_pool2d.overlap", ops.max_pool2d, (f32(1, 1, 4, 3),), {"k": 2, "stride": 1}, domain="distinct",
      ref=np_max_pool2d, torch=t_max_pool2d),
    # internal primitives that the public ops above reach only through their VJPs
    C("flip.internal", lambda x: ops.flip(x, (0, 2)), (f32(2, 3, 4),), ref=lambda x: np.flip(x, (0, 2))),
    C("pad.internal", lambda x: ops.pad(x, -1, 1, 2), (f32(2, 3),), ref=lambda x: np.pad(x, ((0, 0), (1, 2)))),
    C("unfold.internal", lambda x: ops.unfold(x, (2, 2), (1, 2), (1, 0)), (f32(1, 2, 3, 4),),
      ref=lambda x: np_unfold(x, (2, 2), (1, 2), (1, 0))),
    C("fold.internal", lambda c: ops.fold(c, (3, 4), (1, 2), (1, 0)), (f32(1, 2, 2, 2, 4, 2),),
      ref=lambda c: np_fold(c, (3, 4), (1, 2), (1, 0))),
    # Tensor operators
    C("add.operator", lambda a, b: a + b, (f32(2, 3), f32(3)), ref=np.add),
    C("add.operator_radd", lambda x: 1 + x, (f32(2, 3),), ref=lambda x: 1 + x),
    C("sub.operator", lambda a, b: a - b, (f32(3), f32(2, 3)), ref=np.subtract),
    C("sub.operator_rsub", lambda x: 2.0 - x, (f32(2, 3),), ref=lambda x: 2.0 - x),
    C("mul.operator", lambda a, b: a * b, (f32(2, 1), f32(3)), ref=np.multiply),
    C("mul.operator_rmul", lambda x: 0.5 * x, (f32(2, 3),), ref=lambda x: 0.5 * x),
    C("div.operator", lambda a, b: a / b, (f32(2, 3), f32(3, domain="nonzero")), ref=np.divide),
    C("div.operator_rdiv", lambda x: 1.0 / x, (f32(2, 3),), domain="nonzero", ref=lambda x: 1.0 / x),
    C("matmul.operator", lambda a, b: a @ b, (f32(2, 3, 4), f32(4, 2)), ref=np.matmul),
    C("power.square", lambda x: x**2, (f32(2, 3),), ref=lambda x: x**2, torch=lambda t, x: x**2),
    C("power.cube", lambda x: x**3, (f32(2, 3),), ref=lambda x: x**3),
    C("power.half", lambda x: x**0.5, (f32(2, 3),), domain="positive", ref=np.sqrt),
    C("power.frac", lambda x: x**2.5, (f32(2, 3),), domain="positive", ref=lambda x: x**2.5, torch=lambda t, x: x**2.5),
    C("power.minus_one", lambda x: x**-1, (f32(2, 3),), domain="nonzero", ref=lambda x: 1.0 / x),
    C("power.number_base", lambda x: 2.0**x, (f32(2, 3),), ref=lambda x: np.power(np.float32(2.0), x),
      torch=lambda t, x: t.pow(t.tensor(2.0), x)),
    C("power.tensor_exponent", lambda x, y: x**y, (f32(2, 3, domain="positive"), f32(3)), ref=np.power,
      torch=lambda t, x, y: x**y),
    C("power.scalar_base", lambda x: ops.power(2.0, x), (f32(2, 3),), ref=lambda x: 2.0**x),
    C("neg.operator", lambda x: -x, (f32(2, 3),), ref=np.negative),
    C("less.operator", lambda a, b: a < b, (f32(2, 3), f32(3)), domain="distinct", ref=lambda a, b: (a < b).astype(np.float64)),
    C("greater.operator", lambda x: x > 0.0, (f32(2, 3),), domain="nonzero", ref=lambda x: (x > 0).astype(np.float64)),
    C("greater.operator_reflected", lambda x: 0.0 < x, (f32(2, 3),), domain="nonzero", ref=lambda x: (x > 0).astype(np.float64)),
    C("add.operator_chain", lambda x, y: (x * y - y / 2.0) * x + 1.0, (f32(2, 3), f32(2, 3)), ref=lambda x, y: (x * y - y / 2.0) * x + 1.0),
    # aot.nn (module parameters follow the inputs, in declaration order)
    C("Linear.3d", lambda x: nn.Linear(4, 5)(x), (f32(2, 3, 4),), ref=lambda x, w, b: x @ w + b,
      torch=lambda t, x, w, b: t.nn.functional.linear(x, w.T, b)),
    C("Linear.no_bias", lambda x: nn.Linear(3, 2, bias=False)(x), (f32(4, 3),), ref=lambda x, w: x @ w),
    C("LayerNorm.3d", lambda x: nn.LayerNorm(4)(x), (f32(2, 3, 4),), ref=np_layer_norm,
      torch=lambda t, x, g, b: t.nn.functional.layer_norm(x, (4,), g, b, 1e-5)),
    C("LayerNorm.shape_no_bias", lambda x: nn.LayerNorm((2, 4), bias=False)(x), (f32(3, 2, 4),),
      ref=lambda x, g: np_layer_norm(x.reshape(3, 8), g.reshape(8), 0.0).reshape(3, 2, 4),
      torch=lambda t, x, g: t.nn.functional.layer_norm(x, (2, 4), g, None, 1e-5)),
    C("GroupNorm.4d", lambda x: nn.GroupNorm(2, 4)(x), (f32(2, 4, 2, 2),),
      ref=lambda x, g, b: np_layer_norm(x.reshape(2, 2, 8), 1.0, 0.0).reshape(x.shape) * g[:, None, None] + b[:, None, None],
      torch=lambda t, x, g, b: t.nn.functional.group_norm(x, 2, g, b, 1e-5)),
    C("InstanceNorm2d.affine", lambda x: nn.InstanceNorm2d(3, affine=True)(x), (f32(2, 3, 2, 2),),
      ref=lambda x, g, b: np_layer_norm(x.reshape(2, 3, 4), 1.0, 0.0).reshape(x.shape) * g[:, None, None] + b[:, None, None],
      torch=lambda t, x, g, b: t.nn.functional.instance_norm(x, weight=g, bias=b, eps=1e-5)),
    C("InstanceNorm1d.plain", lambda x: nn.InstanceNorm1d(3)(x), (f32(2, 3, 4),),
      ref=lambda x: np_layer_norm(x, 1.0, 0.0), torch=lambda t, x: t.nn.functional.instance_norm(x, eps=1e-5)),
    C("RMSNorm.2d", lambda x: nn.RMSNorm(5)(x), (f32(3, 5),), ref=np_rms_norm,
      torch=lambda t, x, g: t.nn.functional.rms_norm(x, (5,), g, 1e-6)),
    C("Embedding.2d", lambda i: nn.Embedding(6, 3)(i), (i32(2, 3, high=6),), ref=lambda i, w: w[i],
      torch=lambda t, i, w: t.nn.functional.embedding(i.long(), w)),
    C("Conv2d.groups", lambda x: nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)(x), (f32(1, 4, 5, 5),),
      ref=lambda x, w, b: np_conv2d(x, w, 2, 1, 2) + b[:, None, None],
      torch=lambda t, x, w, b: t.nn.functional.conv2d(x, w, b, stride=2, padding=1, groups=2)),
    C("Conv2d.no_bias", lambda x: nn.Conv2d(2, 3, (2, 3), bias=False)(x), (f32(2, 2, 3, 4),), ref=lambda x, w: np_conv2d(x, w)),
    C("split_heads.batched", lambda x: nn.split_heads(x, 2), (f32(2, 3, 4),), ref=lambda x: np_split_heads(x, 2)),
    C("split_heads.unbatched", lambda x: nn.split_heads(x, 3), (f32(2, 6),), ref=lambda x: np_split_heads(x, 3)),
    C("merge_heads.batched", nn.merge_heads, (f32(2, 2, 3, 2),), ref=np_merge_heads),
    C("merge_heads.round_trip", lambda x: nn.merge_heads(nn.split_heads(x, 2)), (f32(2, 3, 4),), ref=lambda x: x),
]


# ---- tracing and sampling ------------------------------------------------------------------------


@dataclass
class Built:
    """A traced case. `leaves` are the case's inputs then its parameters; `specs` their Args."""

    case: OpCase
    graph: Graph
    leaves: list[Tensor]
    specs: list[Arg]
    outs: list[Tensor]
    cts: list[Tensor]  # one cotangent input per f32 output
    loss: Tensor | None
    n_forward: int  # nodes up to and including the loss: the graph finite differences evaluate
    grads: list[Tensor | None]  # per leaf; None for leaves that are not differentiated

    @property
    def forward_graph(self) -> Graph:
        return Graph(self.graph.name + ".forward", nodes=self.graph.nodes[: self.n_forward])

    def names(self) -> list[str]:
        return [t.node.attrs["name"] for t in self.leaves]

    def sample(self, seed: int = 0) -> dict[str, np.ndarray]:
        """float64 values for every leaf and random cotangents, drawn from the case's domains."""
        rng = np.random.default_rng(seed)
        vals: dict[str, np.ndarray] = {}
        distinct = [(n, a) for n, a in zip(self.names(), self.specs) if a.dtype == "f32" and self._domain(a) == "distinct"]
        total = sum(int(np.prod(a.shape)) for _, a in distinct)
        # a shuffled grid with jitter: every pair of values is at least ~half a grid step apart
        pool = rng.permutation(np.linspace(-2.0, 2.0, max(total, 1))) + rng.uniform(-0.1, 0.1, max(total, 1)) * 4.0 / max(total, 1)
        off = 0
        for name, a in zip(self.names(), self.specs):
            n = int(np.prod(a.shape))
            dom = self._domain(a)
            if a.dtype == "i32":
                v = rng.integers(0, a.high, size=a.shape).astype(np.int32)
            elif dom == "distinct":
                v = pool[off : off + n].reshape(a.shape)
                off += n
            elif dom == "real":
                v = rng.uniform(-2.0, 2.0, a.shape)
            elif dom == "positive":
                v = rng.uniform(0.5, 2.0, a.shape)
            elif dom == "nonzero":
                v = rng.uniform(0.25, 2.0, a.shape) * rng.choice([-1.0, 1.0], a.shape)
            elif dom == "mask":
                v = rng.integers(0, 2, a.shape).astype(np.float64)
            else:
                raise ValueError(f"{self.case.name}: unknown domain {dom!r}")
            vals[name] = np.asarray(v)
        for t in self.cts:
            vals[t.node.attrs["name"]] = rng.normal(size=t.shape)
        return vals

    def _domain(self, a: Arg) -> str:
        return a.domain or self.case.domain


def build(case: OpCase) -> Built:
    g = Graph(case.name)
    with tracing(g):
        xs = [emit("input", (), name=f"x{i}", shape=a.shape, dtype=a.dtype) for i, a in enumerate(case.inputs)]
        out = case.fn(*xs, **case.kwargs)
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        params = [n.out for n in g.nodes if n.op == "param"]
        for i, p in enumerate(params):
            p.node.attrs["name"] = f"p{i}"
        leaves = xs + params
        specs = list(case.inputs) + [f32(*p.shape, domain="real") for p in params]
        cts, loss, grads = [], None, [None] * len(leaves)
        terms = []
        for k, o in enumerate(outs):
            if o.dtype == "f32":
                ct = emit("input", (), name=f"ct{k}", shape=o.shape, dtype="f32")
                cts.append(ct)
                terms.append(ops.sum(o * ct))
        if terms:
            loss = terms[0]
            for t in terms[1:]:
                loss = loss + t
        n_forward = len(g.nodes)
        if case.grad:
            diff = [i for i, a in enumerate(specs) if a.diff]
            gs = append_grads(g, loss, [leaves[i] for i in diff])
            for i, gt in zip(diff, gs):
                grads[i] = gt
    return Built(case, g, leaves, specs, outs, cts, loss, n_forward, grads)


def call_ref(fn: Callable, case: OpCase, values: list[np.ndarray]):
    """Run a reference formula; always returns a list of outputs."""
    out = fn(*values, **case.kwargs)
    return list(out) if isinstance(out, (list, tuple)) else [out]


# ---- API.md §6 ops (rope; the random ops need a step seed and are checked in test_new_ops.py) ----


def np_rope(x, base=10000.0):
    """Rotate-half RoPE over the last two axes [..., T, D] (Llama): angle t * base**(-2i/D)."""
    t, d = x.shape[-2:]
    inv_freq = base ** (-2.0 * np.arange(d // 2) / d)
    ang = np.arange(t)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + np.concatenate([-x2, x1], -1) * sin


def t_rope(t, x, base=10000.0):
    """The same as Hugging Face's Llama computes it: inv_freq = 1 / base**(arange(0, D, 2) / D)."""
    n, d = x.shape[-2:]
    inv_freq = 1.0 / (base ** (t.arange(0, d, 2, dtype=x.dtype) / d))
    freqs = t.outer(t.arange(n, dtype=x.dtype), inv_freq)
    emb = t.cat([freqs, freqs], -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * emb.cos() + t.cat([-x2, x1], -1) * emb.sin()


# short sequences: the in-graph frequency table is exp(i * c) with c an f32 constant, so its
# angles differ from the float64 formula by ~1e-7 relative, which grows with the position
CASES += [
    C("rope.heads", ops.rope, (f32(2, 2, 3, 4),), ref=np_rope, torch=t_rope),
    C("rope.2d_base", ops.rope, (f32(5, 6),), {"base": 100.0}, ref=np_rope, torch=t_rope),
    C("rope.times_weight", lambda x, w: ops.rope(x * w), (f32(1, 4, 8), f32(8)), ref=lambda x, w: np_rope(x * w)),
]


def np_attention(q, k, v, causal=False, scale=None):
    """softmax(q k^T * scale) v; causal masks key j > query i (top-left aligned, torch's is_causal)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    if causal:
        s = np.where(np.arange(s.shape[-1])[None, :] > np.arange(s.shape[-2])[:, None], -np.inf, s)
    return np.matmul(np_softmax(s), v)


def t_attention(t, q, k, v, causal=False, scale=None):
    lead = t.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q, k, v = (x.expand(lead + x.shape[-2:]) for x in (q, k, v))
    return t.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


# attention's fused kernels: odd sizes, Tq != Tk, leading dims broadcast (k shared by all heads)
CASES += [
    C("attention.causal", ops.attention, (f32(2, 3, 4), f32(2, 3, 4), f32(2, 3, 2)), {"causal": True},
      ref=np_attention, torch=t_attention),
    C("attention.cross_scale", ops.attention, (f32(2, 2, 3), f32(2, 4, 3), f32(2, 4, 5)), {"scale": 0.5},
      ref=np_attention, torch=t_attention),
    C("attention.heads_bcast", ops.attention, (f32(2, 2, 3, 2), f32(3, 2), f32(2, 1, 3, 3)), {"causal": True},
      ref=np_attention, torch=t_attention),
    C("attention.tq_gt_tk", ops.attention, (f32(1, 5, 3), f32(1, 2, 3), f32(1, 2, 1)), {"causal": True},
      ref=np_attention, torch=t_attention),
]


def _np_sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def np_lstm_seq(xw, w, h0=None, c0=None, reverse=False):
    """Per position t, [h | c | i | f | g | o] of the LSTM step that consumed it (gates i, f, g, o)."""
    n = w.shape[1]
    h = np.zeros(xw.shape[1:2] + (n,), xw.dtype) if h0 is None else h0
    c = np.zeros_like(h) if c0 is None else c0
    out = np.zeros(xw.shape[:2] + (6 * n,), xw.dtype)
    for t in reversed(range(xw.shape[0])) if reverse else range(xw.shape[0]):
        a = xw[t] + h @ w.T
        i, f, g, o = _np_sig(a[:, :n]), _np_sig(a[:, n : 2 * n]), np.tanh(a[:, 2 * n : 3 * n]), _np_sig(a[:, 3 * n :])
        c = f * c + i * g
        h = o * np.tanh(c)
        out[t] = np.concatenate([h, c, i, f, g, o], axis=1)
    return out


def t_lstm_seq(t, xw, w, h0=None, c0=None, reverse=False):
    n = w.shape[1]
    h = t.zeros(xw.shape[1], n, dtype=xw.dtype) if h0 is None else h0
    c = t.zeros_like(h) if c0 is None else c0
    out = [None] * xw.shape[0]
    for s in reversed(range(xw.shape[0])) if reverse else range(xw.shape[0]):
        i, f, g, o = (xw[s] + h @ w.T).split(n, dim=1)
        i, f, g, o = t.sigmoid(i), t.sigmoid(f), t.tanh(g), t.sigmoid(o)
        c = f * c + i * g
        h = o * t.tanh(c)
        out[s] = t.cat([h, c, i, f, g, o], dim=1)
    return t.stack(out, 0)


# the fused LSTM kernels (aot/ops/recurrent.py): every lane of the result is differentiated (the
# gate activations too); hidden sizes that leave invocations idle, one step, the reverse walk
CASES += [
    C("lstm_seq.zero_state", ops.lstm_seq, (f32(3, 2, 12), f32(12, 3)), ref=np_lstm_seq, torch=t_lstm_seq),
    C("lstm_seq.state_reverse", ops.lstm_seq, (f32(4, 3, 8), f32(8, 2), f32(3, 2), f32(3, 2)), {"reverse": True},
      ref=np_lstm_seq, torch=t_lstm_seq),
    C("lstm_seq.one_step", ops.lstm_seq, (f32(1, 2, 20), f32(20, 5), f32(2, 5), f32(2, 5)), ref=np_lstm_seq, torch=t_lstm_seq),
]


# spatial ops, indexing and convolutions (tests/op_cases_spatial.py)
from op_cases_spatial import cases as _spatial_cases  # noqa: E402

CASES += _spatial_cases()

# activations, reductions and losses beyond API.md §2 (tests/op_cases_math.py)
from op_cases_math import cases as _math_cases  # noqa: E402

CASES += _math_cases()
