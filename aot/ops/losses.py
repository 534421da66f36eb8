"""Losses as torch.nn.functional defines them (arguments, defaults, clamping, edge cases), each
with `reduction="mean" | "sum" | "none"`: nll_loss, cross_entropy (API.md §2's, with
ignore_index, label_smoothing and class weights added), binary_cross_entropy,
binary_cross_entropy_with_logits, mse_loss, l1_loss, smooth_l1_loss, huber_loss, kl_div,
cosine_similarity.

Class-index losses take classes on the LAST axis (as aot's cross_entropy always has): for
[N, C] that is torch's layout; torch's [N, C, d...] is `moveaxis(x, 1, -1)` here. A target
equal to ignore_index contributes nothing and is not counted by "mean" (all ignored: NaN,
as torch). The targets are read through the `ignore_index` primitive below, which maps that
value to class 0 before any index op reads it: the runtime still rejects every other target
outside [0, C) (pipeline.index_bounds), and lets the ignored value through.
"""

from __future__ import annotations

import math

import numpy as np

from ..templates import wgsl_i32
from .api import (
    Scalar, _check_f32, _is_tensor, _lift, broadcast_to, custom_vjp, div, embedding, equal, exp, greater, log,
    log_softmax, maximum, mean, neg, one_hot, sigmoid, square, stop_gradient, sum, where,
)
from .api import abs as _abs
from .activations import log1p
from .reductions import norm
from .registry import Bad, OpDef, Replaces, register
from .trace import emit, fail

__all__ = [
    "nll_loss", "cross_entropy", "binary_cross_entropy", "binary_cross_entropy_with_logits", "mse_loss", "l1_loss",
    "smooth_l1_loss", "huber_loss", "kl_div", "cosine_similarity",
]


def _ignore_shape(t, value):
    if t[1] != "i32":
        raise Bad(f"expects i32 class indices, got {t[1]}")
    return t[0], "i32"


# targets with `value` replaced by 0: a valid index that a mask then discards
register(
    OpDef(
        "ignore_index", _ignore_shape, lambda t, value: np.where(t == value, 0, t).astype(np.int32), None,
        "pointwise", expr=lambda a: "select({0}, 0i, {0} == %s)" % wgsl_i32(a["value"]), nondiff=True,
        index_bound=lambda n, x: Replaces(n.attrs["value"]),
    )
)

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(op, reduction, allowed=_REDUCTIONS):
    if reduction not in allowed:
        fail(op, "reduction must be " + ", ".join(repr(r) for r in allowed[:-1]) + f" or {allowed[-1]!r}, got {reduction!r}")


def _reduce(loss, reduction):
    if reduction == "none":
        return loss
    return mean(loss) if reduction == "mean" else sum(loss)


def _number(op, name, v, lo=None, hi=None):
    if not isinstance(v, Scalar) or isinstance(v, bool) or not math.isfinite(v):
        fail(op, f"{name} must be a finite number, got {v!r}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        fail(op, f"{name} must be in [{lo}, {hi}], got {v!r}")
    return float(v)


# ---- class-index losses --------------------------------------------------------------------------


def _class_loss(op, logp, target, weight, ignore_index, reduction, label_smoothing):
    """nll of log-probabilities logp [..., C] at i32 targets [...], torch's nll_loss and the
    label-smoothed cross_entropy around it."""
    if not (_is_tensor(logp) and _is_tensor(target)):
        fail(op, "expects (input, target) Tensors")
    _check_f32(op, logp)
    if target.dtype != "i32":
        fail(op, f"target must be i32 class indices, got {target.type_str()}", "cast with ops.cast(target, 'i32')")
    if logp.ndim < 1 or target.shape != logp.shape[:-1]:
        fail(op, f"target must have shape input.shape[:-1] = {list(logp.shape[:-1])} (classes on the last axis), "
                 f"got {target.type_str()} for input {logp.type_str()}")
    _check_reduction(op, reduction)
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool) or not -(2**31) <= ignore_index < 2**31:
        fail(op, f"ignore_index must be an i32 int, got {ignore_index!r}")
    eps = _number(op, "label_smoothing", label_smoothing, 0.0, 1.0)
    c = logp.shape[-1]
    if weight is not None:
        _check_f32(op, weight)
        if weight.shape != (c,):
            fail(op, f"weight must have one entry per class, shape [{c}], got {weight.type_str()}")
    keep = 1.0 - equal(target, ignore_index)  # f32 mask of the counted targets
    safe = emit("ignore_index", (target,), value=int(ignore_index))
    # a select, not a product with the one-hot mask: logp may hold -inf at other classes
    picked = sum(where(one_hot(safe, c), logp, 0.0), -1)
    wt = keep if weight is None else where(keep, embedding(weight, safe), 0.0)
    loss = where(keep, neg(picked) if weight is None else neg(picked) * wt, 0.0)
    if eps > 0.0:
        # torch: -sum_c w_c logp_c per row, spread over the C classes, masked like the nll term
        spread = neg(sum(logp if weight is None else logp * broadcast_to(weight, logp.shape), -1))
        loss = loss * (1.0 - eps) + where(keep, spread, 0.0) * (eps / c)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return sum(loss)
    return div(sum(loss), sum(wt))  # weighted mean over the counted targets (0/0 = NaN: none counted)


def nll_loss(input, target, weight=None, *, ignore_index: int = -100, reduction: str = "mean",
             label_smoothing: float = 0.0):
    """Negative log-likelihood of log-probabilities input [..., C] at i32 class indices target
    [...]: -weight[t] * input[..., t]; "mean" divides by the summed weights of the counted targets
    (torch.nn.functional.nll_loss; classes on the last axis). label_smoothing (an aot addition)
    is cross_entropy's, applied to the given log-probabilities."""
    return _class_loss("nll_loss", input, target, weight, ignore_index, reduction, label_smoothing)


def cross_entropy(logits, targets, reduction: str = "mean", *, weight=None, ignore_index: int = -100,
                  label_smoothing: float = 0.0):
    """Cross-entropy of logits [..., C] against i32 class indices [...] (classes on the last axis):
    nll_loss(log_softmax(logits)) with torch's ignore_index, label_smoothing and class weight."""
    if not (_is_tensor(logits) and _is_tensor(targets)):
        fail("cross_entropy", "expects (logits, targets) Tensors")
    _check_f32("cross_entropy", logits)
    if logits.ndim < 1:
        fail("cross_entropy", f"expects logits with a class axis, got {logits.type_str()}")
    return _class_loss("cross_entropy", log_softmax(logits, -1), targets, weight, ignore_index, reduction, label_smoothing)


# ---- elementwise losses --------------------------------------------------------------------------


def _pair(op, input, target, reduction, same_shape=False):
    if not (_is_tensor(input) and _is_tensor(target)):
        fail(op, "expects (input, target) Tensors")
    _check_f32(op, input)
    _check_f32(op, target)
    if same_shape and input.shape != target.shape:
        fail(op, f"target must have the input's shape {list(input.shape)}, got {target.type_str()}")
    _check_reduction(op, reduction, _REDUCTIONS + (("batchmean",) if op == "kl_div" else ()))
    return _lift(op, (input, target))


def _weighted(op, loss, weight):
    if weight is None:
        return loss
    if not _is_tensor(weight):
        fail(op, f"weight must be a Tensor or None, got {type(weight).__name__}")
    _check_f32(op, weight)
    return loss * weight


def binary_cross_entropy(input, target, weight=None, reduction: str = "mean"):
    """-w (t log(x) + (1 - t) log(1 - x)) for probabilities x, each log clamped at -100 (torch's);
    gradient w (x - t) / max(x (1 - x), 1e-12) as torch computes it (finite at x = 0 and 1)."""
    x, t = _pair("binary_cross_entropy", input, target, reduction, same_shape=True)
    lx, l1x = maximum(log(x), -100.0), maximum(log(1.0 - x), -100.0)
    loss = neg(t * lx + (1.0 - t) * l1x)

    def rule(ct, out, ins):
        # torch's: the input's gradient divides by x (1 - x) clamped at 1e-12; the target's uses
        # the logs unclamped (inf at x = 0 or 1)
        xi, ti = ins
        gx = ct * (xi - ti) / maximum(xi * (1.0 - xi), 1e-12)
        return gx, ct * (log1p(neg(xi)) - log(xi))

    loss = custom_vjp(loss, (x, t), rule)
    return _reduce(_weighted("binary_cross_entropy", loss, weight), reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, reduction: str = "mean", pos_weight=None):
    """binary_cross_entropy(sigmoid(x), t) computed stably: (1 - t) x + l softplus(-x) with
    l = 1 + (p - 1) t, p = pos_weight (broadcast against the input: one per class on the last
    axis), times weight. Gradient l sigmoid(x) - p t, as torch computes it (no cancellation)."""
    op = "binary_cross_entropy_with_logits"
    x, t = _pair(op, input, target, reduction, same_shape=True)
    if pos_weight is not None:
        _check_f32(op, pos_weight)
        pw = _lift(op, (x, pos_weight))[1]
        lw = 1.0 + (pw - 1.0) * t
    else:
        pw, lw = None, 1.0
    # softplus(-x) = max(-x, 0) + log1p(exp(-|x|)); (1 - t) x + max(-x, 0) is summed first so
    # that for t = 0, x < 0 it cancels exactly and log1p keeps the tiny remainder
    tail = log1p(exp(neg(_abs(x))))
    loss = ((1.0 - t) * x + maximum(neg(x), 0.0) * lw) + tail * lw

    def rule(ct, out, ins):
        xi, ti = ins[0], ins[1]
        s = sigmoid(xi)
        if pw is None:
            return ct * (s - ti), ct * neg(xi)
        # d/dt: -x + (p - 1) softplus(-x)
        return ct * (lw * s - pw * ti), ct * ((pw - 1.0) * (maximum(neg(xi), 0.0) + tail) - xi)

    loss = custom_vjp(loss, (x, t), rule)
    return _reduce(_weighted(op, loss, weight), reduction)


def mse_loss(input, target, reduction: str = "mean"):
    """(input - target)**2 (NumPy broadcasting, as torch allows)."""
    x, t = _pair("mse_loss", input, target, reduction)
    return _reduce(square(x - t), reduction)


def l1_loss(input, target, reduction: str = "mean"):
    """|input - target|; gradient sign(input - target), 0 at a tie (torch's)."""
    x, t = _pair("l1_loss", input, target, reduction)
    return _reduce(_abs(x - t), reduction)


def smooth_l1_loss(input, target, reduction: str = "mean", beta: float = 1.0):
    """0.5 d**2 / beta where |d| < beta, else |d| - 0.5 beta (d = input - target); beta = 0 is l1_loss."""
    x, t = _pair("smooth_l1_loss", input, target, reduction)
    b = _number("smooth_l1_loss", "beta", beta, 0.0)
    d = x - t
    ad = _abs(d)
    if b == 0.0:
        return _reduce(ad, reduction)
    # |d| >= beta takes the linear piece; a NaN d the quadratic one, whose gradient is NaN as
    # torch's (its backward returns d / beta there; the linear piece's sign(NaN) would give 0)
    big = _at_least(ad, b)
    # the quadratic piece sees d only where it is taken: square's VJP at an infinite d would
    # give inf * 0 = NaN although the linear piece is selected there
    return _reduce(where(big, ad - 0.5 * b, square(where(big, 0.0, d)) * (0.5 / b)), reduction)


def _at_least(a, b):
    """1 where a >= b, 0 where a < b or a is NaN."""
    return greater(a, b) + equal(a, b)


def huber_loss(input, target, reduction: str = "mean", delta: float = 1.0):
    """0.5 d**2 where |d| < delta, else delta (|d| - 0.5 delta) (d = input - target)."""
    x, t = _pair("huber_loss", input, target, reduction)
    dl = _number("huber_loss", "delta", delta, 0.0)
    if dl == 0.0:
        fail("huber_loss", "delta must be positive, got 0")
    d = x - t
    ad = _abs(d)
    big = _at_least(ad, dl)  # NaN: the quadratic piece (a NaN gradient, as torch's), as in smooth_l1_loss
    return _reduce(where(big, (ad - 0.5 * dl) * dl, square(where(big, 0.0, d)) * 0.5), reduction)


def kl_div(input, target, reduction: str = "mean", log_target: bool = False):
    """Pointwise KL divergence with input given as log-probabilities: target (log target - input),
    0 where target is 0 (torch's xlogy); log_target=True takes target as log-probabilities:
    exp(target) (target - input). reduction "batchmean" divides the sum by input.shape[0] (the
    KL divergence proper); "mean" averages over every element, as torch does."""
    x, t = _pair("kl_div", input, target, reduction)
    if not isinstance(log_target, bool):
        fail("kl_div", f"log_target must be True or False, got {log_target!r}")
    if log_target:
        loss = exp(t) * (t - x)
    else:
        zero = equal(t, 0.0)
        # t log t with log's argument replaced at t = 0 (a select: log(0) * 0 would be NaN); its
        # gradient log(t) + 1 times ct as torch's xlogy(ct, t) + ct: 0 where ct is 0, also for a
        # t < 0 whose log is NaN (special seed 5490249, hour run 10)
        lt = log(where(zero, 1.0, t))

        def tlogt_rule(ct, out, ins):
            return (where(equal(ct, 0.0), 0.0, ct * lt) + where(zero, 0.0, ct),)

        loss = custom_vjp(t * lt, (t,), tlogt_rule) - t * x
    if reduction == "batchmean":
        if x.ndim == 0:
            fail("kl_div", "reduction='batchmean' needs an input with a batch axis")
        return sum(loss) * (1.0 / x.shape[0])
    return _reduce(loss, reduction)


def cosine_similarity(x1, x2, dim: int = 1, eps: float = 1e-8):
    """sum(x1 * x2, dim) / (max(|x1|, eps) max(|x2|, eps)) after broadcasting x1 and x2 (torch's:
    each norm is clamped at eps apart, and the gradient flows as if it were not clamped)."""
    if not (_is_tensor(x1) and _is_tensor(x2)):
        fail("cosine_similarity", "expects (x1, x2) Tensors")
    _check_f32("cosine_similarity", x1)
    _check_f32("cosine_similarity", x2)
    a, b = _lift("cosine_similarity", (x1, x2))
    if not isinstance(dim, int) or not -a.ndim <= dim < max(a.ndim, 1) or a.ndim == 0:
        fail("cosine_similarity", f"dim {dim!r} is out of range for the broadcast shape {list(a.shape)}")
    e = _number("cosine_similarity", "eps", eps, 0.0)

    def clamped(n):
        # the value max(n, eps), the gradient of n itself (torch clamps under no_grad)
        return n + stop_gradient(maximum(n, e) - n)

    na, nb = clamped(norm(a, 2, dim, keepdims=True)), clamped(norm(b, 2, dim, keepdims=True))
    return sum((a / na) * (b / nb), dim)

