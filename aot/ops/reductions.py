"""Reductions beyond API.md §2, as torch defines them: logsumexp, var, std, min, prod, cumsum, norm.

Axes follow aot's convention (`axis=None` means all, an int or a tuple, negative allowed,
`keepdims=False`); PyTorch's spelling `dim=` / `keepdim=` is accepted too. All are composites:
prod multiplies halves (log2(n) pointwise steps, whose gradient is exact with zeros present,
as torch's), cumsum adds shifted copies (Hillis-Steele: log2(n) steps, no n x n matrix).
"""

from __future__ import annotations

import builtins as _b
import math

from .api import (
    Scalar, _check_f32, _mul_exp, arange, broadcast_to, custom_vjp, div, equal, exp, greater, log, max as _max, narrow,
    neg, normalize_axes, power, reshape, sign, sqrt, square, stop_gradient, sum, transpose, where,
)
from .api import abs as _abs
from ..split_rules import split_plan
from .trace import emit, fail

__all__ = ["logsumexp", "var", "std", "min", "prod", "cumsum", "norm"]

F32_MAX = 3.4028234663852886e38  # |m| above it is an infinity


def _axes(op, x, axis, keepdims, dim, keepdim):
    """aot's axis/keepdims or torch's dim/keepdim (not both spellings of one argument)."""
    _check_f32(op, x)
    if dim is not None:
        if axis is not None:
            fail(op, "give axis or dim, not both")
        axis = dim
    if keepdim is not None:
        keepdims = bool(keepdims) or bool(keepdim)
    if axis is not None and not isinstance(axis, int) and not (
        isinstance(axis, (tuple, list)) and all(isinstance(a, int) for a in axis)
    ):
        fail(op, f"axis must be an int, a tuple of ints or None, got {axis!r}")
    return normalize_axes(op, x, axis), bool(keepdims)


def _kept(x, axes):
    return tuple(1 if i in axes else d for i, d in enumerate(x.shape))


def _out_shape(x, axes, keepdims):
    return _kept(x, axes) if keepdims else tuple(d for i, d in enumerate(x.shape) if i not in axes)


def _back(ct, x, axes):
    """A reduction's cotangent broadcast back over x's shape."""
    return broadcast_to(reshape(ct, _kept(x, axes)), x.shape)


def logsumexp(x, axis=None, keepdims: bool = False, *, dim=None, keepdim=None):
    """log(sum(exp(x))) over `axis`, shifted by the (gradient-free) maximum; a row of -inf gives
    -inf and a +inf gives +inf (torch's). Gradient exp(x - out) (softmax)."""
    axes, keep = _axes("logsumexp", x, axis, keepdims, dim, keepdim)
    if not axes:
        return x
    m = stop_gradient(_max(x, axes, keepdims=True))
    m = where(greater(_abs(m), F32_MAX), 0.0, m)  # infinite maxima shift by 0, as torch
    y = log(sum(exp(x - broadcast_to(m, x.shape)), axes, keepdims=True)) + m
    y = y if keep else reshape(y, _out_shape(x, axes, False))
    # ct exp(x - out) in one rounding (mul_exp; x - out <= 0): exp alone goes subnormal, 0 on a GPU
    # that flushes, where an inf cotangent times it is inf in torch (H200, special seed 5480038)
    return custom_vjp(y, (x,), lambda ct, y, ins: (_mul_exp(_back(ct, ins[0], axes), ins[0] - _back(y, ins[0], axes)),))


def _count(x, axes):
    return math.prod(x.shape[a] for a in axes)


def _denominator(op, x, axes, correction) -> float:
    """N - correction, which must be positive. torch returns NaN or inf for N - correction <= 0;
    here that is an error at trace time (the sizes are static), since x / 0 has no portable
    value in WGSL."""
    if not isinstance(correction, Scalar) or isinstance(correction, bool) or not math.isfinite(correction):
        fail(op, f"correction must be a finite number, got {correction!r}")
    n = _count(x, axes)
    if n - correction <= 0:
        fail(op, f"{n} element(s) per reduction minus correction={correction} leaves no degrees of freedom "
                 f"(torch gives NaN or inf) for {x.type_str()}", "use correction=0, or reduce over more elements")
    return float(n - correction)


def _sq_dev(x, axes):
    """(a function giving x - mean for the VJP, the sum of squared deviations) over axes (kept)."""
    if not axes:
        d = x - x
        return (lambda: d), d * d
    mu, ss = moments(x, axes)
    return (lambda: x - broadcast_to(mu, x.shape)), ss


# 1: moments' squares about a pivot, and its chunks in cells of rows (split_rules.SPLIT_CELLS),
# whose first stage then reads a channels-last input coalesced (codegen.reduce_lanes); 0: chunks
# of the outermost axis, squares about each chunk's mean (scripts/bench_rules.py compares them).
MOMENTS_PIVOT = 1


def moments(x, axes):
    """(mean, sum of squared deviations) of x over the sorted, non-empty `axes`, both with the
    reduced axes kept (size 1): a variance is the second over N - correction.

    Two-pass (the mean first, then the squares of the deviations from it), as precise as that
    where the mean is large against the spread. Where passes.split_reductions would cut these
    sums in two stages (long reductions: BatchNorm's over (N, H, W)), each cut of the split
    plan (a chunk of equal count c) gets its own two-pass mean m_j and sum of squares s_j in
    one kernel, and the second stage combines the J chunks with Chan et al.'s formula for equal
    counts: mean = sum(m_j) / J, M2 = sum(s_j) + c * sum((m_j - mean)^2), again two-pass over
    the J partials (m_j and s_j of x less a pivot in M2: see below). That is two dispatches where the split sums of mean and variance took four,
    and each sum is over fewer elements (the rounding grows with the length). Chunks are exact
    divisors ("divide"); where the reduced length has none the sums are not cut here."""

    n = _count(x, axes)
    plan = split_plan(x.shape, axes, "divide", cells=bool(MOMENTS_PIVOT))
    if plan is not None and math.prod(x.shape[plan[0] : plan[1]]) == plan[2]:
        plan = None  # one chunk of the whole (a prime run whose only divisor near the cut is itself)
    if plan is None:
        # a division, not a product with an f32 1/N: a constant row's mean is then exact (std 0)
        mu = div(sum(x, axes, keepdims=True), float(n))
        d = x - broadcast_to(mu, x.shape)
        return mu, sum(d * d, axes, keepdims=True)
    lo, hi, k, _ = plan
    run = math.prod(x.shape[lo:hi])
    before = tuple(a for a in axes if a < lo)  # reduced axes the first stage keeps (split_rules.SPLIT_CELLS)
    J = run // k * math.prod(x.shape[a] for a in before)  # chunks
    c = n // J
    shape = x.shape[:lo] + (run // k, k) + x.shape[hi:]
    xs = reshape(x, shape)
    within = (lo + 1,) + tuple(a - (hi - lo) + 2 for a in axes if a >= hi)  # a chunk's axes
    across = before + (lo,)  # the chunks'
    if not MOMENTS_PIVOT:
        m = div(sum(xs, within, keepdims=True), float(c))  # [..., J, 1, ...]: chunk means
        d = xs - broadcast_to(m, xs.shape)
        s = sum(d * d, within, keepdims=True)
        mu = div(sum(m, across, keepdims=True), float(J))
        e = m - broadcast_to(mu, m.shape)
        m2 = sum(s, across, keepdims=True) + sum(e * e, across, keepdims=True) * float(c)
        kept = _kept(x, axes)
        return reshape(mu, kept), reshape(m2, kept)
    # The squares are of x less a pivot (each output's first element): Chan's spread of the chunk
    # means then sees means of values near 0, not means rounded to float32's spacing at x's
    # offset (0.0625 at 1e6: over chunks of a few rows that added 1e-3 of the variance). The mean
    # itself is of x, as it was (a pivot added back would round a mean near 0 to the pivot's
    # spacing). A non-finite pivot makes the variance NaN, as any non-finite x does.
    pivot = x
    for a in axes:
        pivot = narrow(pivot, a, 0, 1)
    pivot = stop_gradient(pivot)  # the variance does not depend on it
    xp = xs - broadcast_to(reshape(pivot, pivot.shape[:lo] + (1, 1) + pivot.shape[hi:]), shape)
    mp = div(sum(xp, within, keepdims=True), float(c))  # chunk means of x less the pivot
    d = xp - broadcast_to(mp, xs.shape)
    s = sum(d * d, within, keepdims=True)
    ss = div(sum(xs, within, keepdims=True), float(c))  # chunk means of x, in the pass of the squares
    mup = div(sum(mp, across, keepdims=True), float(J))
    e = mp - broadcast_to(mup, mp.shape)
    m2 = sum(s, across, keepdims=True) + sum(square(e), across, keepdims=True) * float(c)
    # the mean of the chunks' means, in x's kept shape where the cut is of one axis: its readers
    # (BatchNorm's normalization, the running mean) then read the stored quotient, where through
    # a reshape each would divide again (a costly op with one consumer is recomputed)
    kept = _kept(x, axes)
    if hi - lo == 1:
        cut = x.shape[:lo] + (run // k,) + x.shape[hi:]
        ss = reshape(ss, tuple(1 if a in axes and a > lo else d for a, d in enumerate(cut)))
    mu = div(sum(ss, across, keepdims=True), float(J))
    return (mu if mu.shape == kept else reshape(mu, kept)), reshape(m2, kept)


def var(x, axis=None, keepdims: bool = False, *, correction=1, dim=None, keepdim=None):
    """Variance over `axis`: sum((x - mean)**2) / (N - correction) (torch.var; correction=1 is the
    unbiased estimate, 0 the population variance; N - correction <= 0 raises ShapeError)."""
    axes, keep = _axes("var", x, axis, keepdims, dim, keepdim)
    denom = _denominator("var", x, axes, correction)
    d, ss = _sq_dev(x, axes)
    v = div(ss, denom)
    # torch's gradient 2 (x - mean) / denom, without the mean's own term (0 in exact arithmetic,
    # NaN next to an infinite x)
    v = custom_vjp(v, (x,), lambda ct, v, ins: (broadcast_to(ct, x.shape) * div(d() * 2.0, denom),))
    return v if keep else reshape(v, _out_shape(x, axes, False))


def std(x, axis=None, keepdims: bool = False, *, correction=1, dim=None, keepdim=None):
    """sqrt(var(x, ...)); the gradient is 0 where the deviation is 0 (a constant row), as torch's."""
    axes, keep = _axes("std", x, axis, keepdims, dim, keepdim)
    denom = _denominator("std", x, axes, correction)
    d, ss = _sq_dev(x, axes)
    s = sqrt(div(ss, denom))

    def rule(ct, s, ins):
        # d std / dx = (x - mean) / (denom * std), with 0 where std is 0 (torch masks it)
        g = where(equal(s, 0.0), 0.0, div(ct, s * denom))
        return (broadcast_to(g, x.shape) * d(),)

    s = custom_vjp(s, (x,), rule)
    return s if keep else reshape(s, _out_shape(x, axes, False))


def min(x, axis=None, keepdims: bool = False, *, dim=None, keepdim=None):  # noqa: A001 - the API name
    """The minimum over `axis` (torch.amin): ties share the gradient evenly; NaN wins."""
    axes, keep = _axes("min", x, axis, keepdims, dim, keepdim)
    return neg(_max(neg(x), axes, keep)) if axes else x


def _to_last(x, axes):
    """x with `axes` moved last and flattened into one: ([rest..., N], rest)."""
    rest = [i for i in range(x.ndim) if i not in axes]
    perm = tuple(rest + list(axes))
    y = transpose(x, perm) if perm != tuple(range(x.ndim)) else x
    lead = tuple(x.shape[i] for i in rest)
    return reshape(y, lead + (_count(x, axes),)), lead


def prod(x, axis=None, keepdims: bool = False, *, dim=None, keepdim=None):
    """The product over `axis`, as pairwise products of halves (log2(n) steps): each step is a
    multiplication, so the gradient (the product of the others) is exact where x holds zeros."""
    axes, keep = _axes("prod", x, axis, keepdims, dim, keepdim)
    if not axes:
        return x
    y, _ = _to_last(x, axes)
    n = y.shape[-1]
    while n > 1:
        h = n // 2
        pair = narrow(y, -1, 0, h) * narrow(y, -1, h, h)
        if n % 2:
            # the odd last element joins the first product: [last, 1, 1, ...] selected, not
            # computed (no rounding), from a broadcast (a view: no concat or pad, which a fusion
            # rule can schedule after their reader, tests/test_math_ops.py's xfail)
            last = broadcast_to(narrow(y, -1, n - 1, 1), pair.shape)
            first = broadcast_to(equal(arange(h, "f32"), 0.0), pair.shape)
            pair = pair * where(first, last, 1.0) if h > 1 else pair * last
        y, n = pair, h
    return reshape(y, _out_shape(x, axes, keep))


def cumsum(x, axis=None, *, dim=None):
    """Running sum along one axis (torch.cumsum): log2(n) steps of y + y shifted by 1, 2, 4, ...
    (a zero-padded copy), whose gradient is the reversed running sum."""
    _check_f32("cumsum", x)
    if dim is not None:
        if axis is not None:
            fail("cumsum", "give axis or dim, not both")
        axis = dim
    if not isinstance(axis, int) or isinstance(axis, bool):
        fail("cumsum", f"axis must be an int, got {axis!r}", "cumsum runs along one axis")
    if x.ndim == 0:
        return x
    (a,) = normalize_axes("cumsum", x, axis)
    n, y, s = x.shape[a], x, 1
    while s < n:
        shifted = emit("pad", (narrow(y, a, 0, n - s),), axis=a, before=s, after=0)
        y = y + shifted
        s *= 2
    return y


def norm(x, p=2, axis=None, keepdims: bool = False, *, dim=None, keepdim=None):
    """Vector p-norm over `axis` (torch.linalg.vector_norm; axis=None: all elements): p = 2, 1,
    inf, -inf, 0 (the count of nonzeros) or any p > 0. The gradient at a zero vector is 0,
    as torch's; for p = 2 and p < 1 an inf or NaN cotangent gives NaN there (torch's ct times a masked 0)."""
    axes, keep = _axes("norm", x, axis, keepdims, dim, keepdim)
    if not isinstance(p, Scalar) or isinstance(p, bool) or math.isnan(p) or (p < 0 and p != -math.inf):
        fail("norm", f"p must be 0, a positive number, inf or -inf, got {p!r}")
    if not axes:  # a 0-d x
        return 1.0 - equal(x, 0.0) if p == 0 else _abs(x)
    if p == math.inf:
        return _max(_abs(x), axes, keep)
    if p == -math.inf:
        return neg(_max(neg(_abs(x)), axes, keep))
    if p == 0:
        return sum(1.0 - equal(x, 0.0), axes, keep)
    if p == 1:
        return sum(_abs(x), axes, keep)
    if p == 2:
        out = sqrt(sum(x * x, axes, keep))

        def rule2(ct, out, ins):
            # ct * (x / |x|), with x / |x| 0 for a zero vector: torch's order and mask, so an inf
            # or NaN cotangent at a zero norm gives NaN as torch's (special seeds 5370009,
            # 5350680), and a huge ct over a tiny norm does not overflow where x / |x| <= 1
            norm = _back(out, ins[0], axes)
            return (_back(ct, ins[0], axes) * where(equal(norm, 0.0), 0.0, div(ins[0], norm)),)

        return custom_vjp(out, (x,), rule2)
    p = float(p)
    ax = _abs(x)
    out = power(sum(power(ax, p), axes, keep), 1.0 / p)

    def rule(ct, out, ins):
        xi = ins[0]
        zero = equal(xi, 0.0)
        # sign(x) |x|^(p-1), with |x| replaced where x is 0 (0^(p-1) is inf for p < 1)
        g = where(zero, 0.0, sign(xi) * power(where(zero, 1.0, ax), p - 1.0))
        if p < 1.0:  # torch's g * ct * norm^(1 - p): 0 at a zero norm, NaN for an inf or NaN cotangent there
            return (g * _back(ct * power(out, 1.0 - p), xi, axes),)
        z = equal(out, 0.0)
        scale = where(z, 0.0, div(ct, power(where(z, 1.0, out), p - 1.0)))
        return (_back(scale, xi, axes) * g,)

    return custom_vjp(out, (x,), rule)

