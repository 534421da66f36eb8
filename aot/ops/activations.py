"""Activations and elementwise math beyond API.md §2, as torch.nn.functional / torch define them:
leaky_relu, elu, softplus, mish, hardswish, hardsigmoid, logsigmoid, clamp, log1p, expm1.

All are composites of primitives except log1p and expm1 (primitives in elementwise.py with
WGSL that stays accurate near 0). Piecewise functions select their pieces with `where`, so
a piece that overflows where it is not selected (elu's exp for large x) sends no inf * 0 =
NaN into the gradient, and each kink gets PyTorch's one-sided derivative.
"""

from __future__ import annotations

import math

from ..ir import Tensor
from .api import (
    SILU_TAIL, Scalar, _check_f32, _lift, _mul_exp, _times_sigmoid, custom_vjp, equal, exp, greater, less, maximum, minimum, neg, sigmoid, stop_gradient,
    where,
)
from .api import abs as _abs
from .trace import emit
from .trace import fail

__all__ = ["leaky_relu", "elu", "softplus", "mish", "hardswish", "hardsigmoid", "logsigmoid", "clamp", "log1p", "expm1"]


def _number(op: str, name: str, v) -> float:
    if not isinstance(v, Scalar) or isinstance(v, bool) or not math.isfinite(v):
        fail(op, f"{name} must be a finite number, got {v!r}")
    return float(v)


def leaky_relu(x, negative_slope: float = 0.01):
    """x for x > 0, else negative_slope * x (the slope at 0, as torch)."""
    _check_f32("leaky_relu", x)
    s = _number("leaky_relu", "negative_slope", negative_slope)
    return where(greater(x, 0.0), x, x * s)


def _le(x, v):
    """x <= v as a 0/1 mask (0 for NaN)."""
    return maximum(less(x, v), equal(x, v))


def elu(x, alpha: float = 1.0):
    """x for x > 0, else alpha * (exp(x) - 1); gradient alpha * exp(x) for x <= 0, else 1 (a NaN
    input included), as torch."""
    _check_f32("elu", x)
    a = _number("elu", "alpha", alpha)
    pos = greater(x, 0.0)
    # expm1 sees only the non-positive part: exp of a large x would be inf in the piece not taken
    y = where(pos, x, emit("expm1", (where(pos, 0.0, x),)) * a)

    def rule(ct, y, ins):
        le0 = _le(ins[0], 0.0)
        # ct alpha exp(x) in one rounding: exp(x) alone is subnormal below -87.3, 0 on a GPU that
        # flushes, and an inf cotangent then gave NaN where torch's is inf (H200, seed 5460264)
        return (where(le0, _mul_exp(ct * a if a != 1.0 else ct, where(le0, ins[0], 0.0)), ct),)

    return custom_vjp(y, (x,), rule)


def softplus(x, beta: float = 1.0, threshold: float = 20.0):
    """log(1 + exp(beta * x)) / beta, and x itself where beta * x > threshold (torch's)."""
    _check_f32("softplus", x)
    b = _number("softplus", "beta", beta)
    t = _number("softplus", "threshold", threshold)
    if b == 0:
        fail("softplus", "beta must be nonzero")
    bx = x * b if b != 1.0 else x
    linear = greater(bx, t)
    # exp only sees values up to the threshold, so it never overflows into the other piece
    soft = log1p(exp(where(linear, 0.0, bx)))
    return where(linear, x, soft * (1.0 / b) if b != 1.0 else soft)


def mish(x):
    """x * tanh(softplus(x)) (softplus with torch's beta=1, threshold=20)."""
    _check_f32("mish", x)
    # tanh(s) for s = softplus(x) >= 0 as -expm1(-2s) / (2 + expm1(-2s)): accurate where s is
    # tiny (x very negative), where a GPU's tanh may be off by ~1e-7 absolute
    e = emit("expm1", (softplus(x) * -2.0,))
    t = neg(e) / (e + 2.0)
    tail = minimum(x, SILU_TAIL)

    def rule(ct, y, ins):
        # torch's mish_backward: ct times one factor, tanh(sp) + x sigmoid(x) (1 - tanh(sp)^2); through
        # the primitives an inf cotangent meets terms of opposite sign (NaN at x = -87.5, torch: -inf).
        # Below SILU_TAIL the factor is d/dx x exp(x) = (1 + x) exp(x), in one rounding
        xi = ins[0]
        return (ct * where(less(xi, SILU_TAIL), _mul_exp(xi + 1.0, tail), t + xi * sigmoid(xi) * (1.0 - t * t)),)

    # below SILU_TAIL mish(x) = x exp(x) to 1e-9 relative, taken in one rounding: softplus(x)
    # goes subnormal below -87.3 (0 on a GPU that flushes) where mish(x) is normal to -91.5
    return custom_vjp(where(less(x, SILU_TAIL), _mul_exp(x, tail), x * t), (x,), rule)


def hardswish(x):
    """x * min(max(x + 3, 0), 6) / 6 (so -inf gives NaN, as torch); gradient 0 for x <= -3,
    x/3 + 1/2 for -3 < x < 3, else 1 (a NaN input included): torch's one-sided choices."""
    _check_f32("hardswish", x)
    # x itself from 3 on (torch's x * 6 / 6, and NaN): NVIDIA's compiler divides by 6 as a product
    # with 1/6 and fuses it into what reads the value (x3 - hardswish(x3) at 89: -2.7e-6, torch 0;
    # special seed 5450126)
    y = where(less(x, 3.0), x * minimum(maximum(x + 3.0, 0.0), 6.0) / 6.0, x)

    def rule(ct, y, ins):
        xi = ins[0]
        return (where(_le(xi, -3.0), 0.0, where(less(xi, 3.0), ct * (xi / 3.0 + 0.5), ct)),)

    return custom_vjp(y, (x,), rule)


def hardsigmoid(x):
    """0 for x <= -3, 1 for x >= 3, x / 6 + 1/2 between; derivative 1/6 inside (-3, 3), 0 at the
    kinks and for NaN (torch's). NaN stays NaN."""
    _check_f32("hardsigmoid", x)
    inside = less(x, 3.0) * greater(x, -3.0)
    # outside the open interval: 1 above, 0 below, and a NaN passes through (x itself), no gradient
    edge = stop_gradient(where(greater(x, 0.0), 1.0, where(less(x, 0.0), 0.0, x)))
    return where(inside, x / 6.0 + 0.5, edge)


def logsigmoid(x):
    """log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|)): no overflow, no log(0) for large |x|."""
    _check_f32("logsigmoid", x)
    y = minimum(x, 0.0) - log1p(exp(neg(_abs(x))))
    # d/dx log sigmoid(x) = sigmoid(-x), also at 0, where min and abs have kinks; ct times it in
    # one rounding where sigmoid(-x) is tiny: it is subnormal above x = 87.3 (0 in aot's sigmoid
    # above 88.7, or on a GPU that flushes) while a cotangent of 1 / logsigmoid(x) makes the
    # product normal (log(logsigmoid(89)): 0.418, special seeds 5310499, 5310786)
    return custom_vjp(y, (x,), lambda ct, y, ins: (_times_sigmoid(ct, neg(ins[0])),))


def _bound(v, x, name):
    """A clamp bound: None, a Tensor, or a number (infinite numbers mean no bound)."""
    if v is None or isinstance(v, Tensor):
        if isinstance(v, Tensor) and v.dtype != "f32":
            fail("clamp", f"{name} must be an f32 Tensor or a number, got {v.type_str()}")
        return v
    if not isinstance(v, Scalar) or isinstance(v, bool) or math.isnan(v):
        fail("clamp", f"{name} must be a Tensor, a number or None, got {v!r}")
    return None if math.isinf(v) and (v > 0) == (name == "max") else float(v)


def clamp(x, min=None, max=None):  # noqa: A002 - torch's argument names
    """min(max(x, min), max) with tensor (broadcast) or number bounds; min > max gives max
    (torch.clamp). Gradient as torch: x gets it where min <= x <= max, min where x < min < max,
    max where x > max or max < min; NaN in x stays NaN."""
    _check_f32("clamp", x)
    if min is None and max is None:
        fail("clamp", "at least one of min and max must be given")
    lo, hi = _bound(min, x, "min"), _bound(max, x, "max")
    if isinstance(lo, float) and math.isinf(lo) or isinstance(hi, float) and math.isinf(hi):
        # a bound of -inf below or +inf above was dropped; the other way round it is every value
        fill = lo if isinstance(lo, float) and math.isinf(lo) else hi
        fail("clamp", f"a bound of {fill} leaves no finite result", "use a finite bound")
    if lo is None and hi is None:  # both infinite in the harmless direction
        return x
    parts = [x] + [b for b in (lo, hi) if b is not None]
    lifted = _lift("clamp", parts)
    xb = lifted[0]
    lob = lifted[1] if lo is not None else None
    hib = lifted[-1] if hi is not None else None
    out = xb
    if lob is not None:
        out = where(less(xb, lob), lob, out)
    inverted = less(hib, lob) if lob is not None and hib is not None else None
    if hib is not None:
        above = greater(xb, hib) if inverted is None else maximum(greater(xb, hib), inverted)
        out = where(above, hib, out)

    def rule(ct, out, ins):
        # torch's clamp_backward: masks that are 0 for a NaN x (no gradient to x, none to a bound)
        xi = ins[0]
        x_in = 1.0
        grads = []
        if lob is not None:
            x_in = maximum(greater(xi, lob), equal(xi, lob))
            below = less(xi, lob)
            grads.append(where(below if inverted is None else below * less(lob, hib), ct, 0.0))
        if hib is not None:
            x_in = x_in * _le(xi, hib)
            above = greater(xi, hib) if inverted is None else maximum(greater(xi, hib), inverted)
            grads.append(where(above, ct, 0.0))
        gx = where(x_in, ct, 0.0) if isinstance(x_in, Tensor) else ct
        return (gx, *grads)

    return custom_vjp(out, tuple(lifted), rule)


def log1p(x):
    """log(1 + x), accurate for tiny x."""
    _check_f32("log1p", x)
    return emit("log1p", (x,))


def expm1(x):
    """exp(x) - 1, accurate for tiny x."""
    _check_f32("expm1", x)
    return emit("expm1", (x,))

