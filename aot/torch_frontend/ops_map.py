"""Core ATen ops -> aot ops: one small function per ATen overload, in the table `TABLE`.

Each function gets the replay context `cx` (the fx node, errors at the user's line) and the
node's arguments with every fx node replaced by its aot value: an aot Tensor, a Python number,
a list, None, or a tuple for an op with several results. dtypes: torch's floating tensors are
f32, its integer tensors i32 and its bool tensors f32 0/1 masks (aot's comparison results);
arithmetic on integers is done in f32 and cast back (exact below 2**24), and the replay casts
every result to the dtype torch's node says it has (replay.py). Layout, reductions, indexing and
random ops are in ops_shape.py, the nn-shaped ops (conv, pool, norms, attention) in ops_nn.py.
"""

from __future__ import annotations

import math

from .. import ops
from ..ir import Tensor

TABLE: dict = {}
F32_MAX = 3.4028234663852886e38  # WGSL has no inf literal: -inf masks become -FLT_MAX (exp gives 0 all the same)


def aten(*names):
    def reg(fn):
        for n in names:
            TABLE["aten." + n] = fn
        return fn

    return reg


def is_t(x) -> bool:
    return isinstance(x, Tensor)


def f32(x):
    """x as f32 (a Python number stays one)."""
    return ops.cast(x, "f32") if is_t(x) and x.dtype != "f32" else x


class NaN:
    """torch's NaN scalar constant: WGSL has no NaN literal, so only where(isnan(y), nan, z) takes it
    (as where(isnan(y), y, z), which is the same)."""


NAN = NaN()


def num(x):
    """A Python number, with +-inf and nan replaced by +-FLT_MAX (WGSL literals are finite)."""
    x = float(x) if isinstance(x, bool) else x
    if isinstance(x, float) and math.isinf(x):
        return math.copysign(F32_MAX, x)
    if isinstance(x, float) and math.isnan(x):
        raise ValueError("nan")
    return x


def const(value, shape=(), dtype="f32"):
    from ..ops.api import _const

    v = num(value)
    c = _const(int(v) if dtype == "i32" else float(v), dtype)
    return ops.broadcast_to(c, tuple(shape)) if tuple(shape) else c


def dim(x, d: int) -> int:
    return d % max(x.ndim, 1)


def mask(cx, x):
    """A torch value as an f32 0/1 mask: bool tensors already are one; others test != 0."""
    if cx.tkind(x) == "bool":
        return f32(x)
    return 1.0 - ops.equal(f32(x), 0.0)


# ---- elementwise --------------------------------------------------------------------------


def _binary(fn):
    def f(cx, a, b, alpha=1):
        if not (is_t(a) or is_t(b)):
            return fn(a, b * alpha)
        if alpha != 1:
            b = f32(b) * num(alpha) if is_t(b) else b * alpha
        return fn(f32(a) if is_t(a) else num(a), f32(b) if is_t(b) else num(b))

    return f


aten("add.Tensor", "add.Scalar")(_binary(lambda a, b: a + b))
aten("sub.Tensor", "sub.Scalar")(_binary(lambda a, b: a - b))
aten("mul.Tensor", "mul.Scalar")(_binary(lambda a, b: a * b))
aten("div.Tensor", "div.Scalar")(_binary(lambda a, b: a / b))
aten("maximum.default")(_binary(ops.maximum))
aten("minimum.default")(_binary(ops.minimum))


@aten("rsub.Scalar", "rsub.Tensor")
def _rsub(cx, a, b, alpha=1):
    return _binary(lambda x, y: x - y)(cx, b, a * alpha if not is_t(a) else a * float(alpha))


@aten("div.Tensor_mode", "div.Scalar_mode")
def _div_mode(cx, a, b, rounding_mode=None):
    q = _binary(lambda x, y: x / y)(cx, a, b)
    if rounding_mode is None:
        return q
    t = ops.cast(ops.cast(q, "i32"), "f32")  # truncation toward zero
    return t if rounding_mode == "trunc" else t - ops.greater(t, q)  # floor: one less where trunc rounded up


def _unary(fn):
    return lambda cx, x: fn(f32(x))


for _name, _fn in {
    "neg": ops.neg, "abs": ops.abs, "exp": ops.exp, "log": ops.log, "sqrt": ops.sqrt, "rsqrt": ops.rsqrt,
    "sin": ops.sin, "cos": ops.cos, "tanh": ops.tanh, "sigmoid": ops.sigmoid, "relu": ops.relu, "erf": ops.erf,
    "sign": ops.sign, "reciprocal": lambda x: 1.0 / x,
}.items():
    aten(_name + ".default")(_unary(_fn))


def _log1p(x):
    """log(1 + x) to float32 accuracy for tiny x too: log(u) * x / (u - 1) with u = 1 + x rounded
    (the rounding error of u cancels), x itself where u rounds to 1; gradient 1 / (1 + x)."""
    u = x + 1.0
    y = ops.where(ops.equal(u, 1.0), x, ops.log(u) * x / ops.where(ops.equal(u, 1.0), 1.0, u - 1.0))
    return ops.api.custom_vjp(y, (x,), lambda ct, y, ins: (ct / (ins[0] + 1.0),))


def _expm1(x):
    """exp(x) - 1 to float32 accuracy near 0: (u - 1) * x / log(u) with u = exp(x) where |x| < 0.5
    (x where u rounds to 1), u - 1 elsewhere; gradient exp(x)."""
    u = ops.exp(x)
    small = ops.less(ops.abs(x), 0.5)
    safe = ops.where(ops.equal(u, 1.0), 1.0, ops.where(small, u, 2.0))  # log(safe) != 0 where it is used
    y = ops.where(ops.equal(u, 1.0), x, ops.where(small, (u - 1.0) * x / ops.log(safe), u - 1.0))
    return ops.api.custom_vjp(y, (x,), lambda ct, y, ins: (ct * ops.exp(ins[0]),))


aten("log1p.default")(_unary(lambda x: getattr(ops, "log1p", _log1p)(x)))
aten("expm1.default")(_unary(lambda x: getattr(ops, "expm1", _expm1)(x)))


@aten("pow.Tensor_Scalar")
def _pow(cx, x, p):
    return ops.square(f32(x)) if p == 2 else ops.power(f32(x), num(p))


@aten("pow.Tensor_Tensor", "pow.Scalar")
def _pow_t(cx, x, p):
    return ops.power(f32(x) if is_t(x) else num(x), f32(p))


@aten("gelu.default")
def _gelu(cx, x, approximate="none"):
    return ops.gelu(f32(x), approximate=approximate)


@aten("clamp.default", "clamp.Tensor")
def _clamp(cx, x, min=None, max=None):  # noqa: A002 - torch's argument names
    y = f32(x)
    if min is not None:
        y = ops.maximum(y, f32(min) if is_t(min) else num(min))
    if max is not None:
        y = ops.minimum(y, f32(max) if is_t(max) else num(max))
    return y


@aten("clamp_min.default")
def _clamp_min(cx, x, m):
    return _clamp(cx, x, min=m)


@aten("clamp_max.default")
def _clamp_max(cx, x, m):
    return _clamp(cx, x, max=m)


@aten("hardtanh.default")
def _hardtanh(cx, x, lo=-1.0, hi=1.0):
    return _clamp(cx, x, lo, hi)


@aten("elu.default")
def _elu(cx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    x = f32(x)
    neg = getattr(ops, "expm1", _expm1)(x * num(input_scale)) * num(alpha)
    return ops.where(ops.greater(x, 0.0), x, neg) * num(scale) if scale != 1 else ops.where(ops.greater(x, 0.0), x, neg)


@aten("leaky_relu.default")
def _leaky(cx, x, slope=0.01):
    x = f32(x)
    return ops.where(ops.greater(x, 0.0), x, x * num(slope))


# ---- comparisons and masks ----------------------------------------------------------------


def _cmp_operands(a, b):
    """Same dtype on both sides: an i32 tensor against a float (or an f32 tensor) is compared in f32."""
    ints = [x for x in (a, b) if is_t(x) and x.dtype == "i32"]
    floaty = any((is_t(x) and x.dtype == "f32") or (not is_t(x) and not float(x).is_integer()) for x in (a, b))
    if ints and floaty:
        a, b = f32(a), f32(b)
    return (a if is_t(a) else num(a)), (b if is_t(b) else num(b))


def _cmp(fn):
    def f(cx, a, b):
        a, b = _cmp_operands(a, b)
        if not is_t(a):
            a = ops.broadcast_to(const(a, (), b.dtype), b.shape)
        return fn(a, b)

    return f


aten("eq.Scalar", "eq.Tensor")(_cmp(ops.equal))
aten("ne.Scalar", "ne.Tensor")(_cmp(lambda a, b: 1.0 - ops.equal(a, b)))
aten("lt.Scalar", "lt.Tensor")(_cmp(ops.less))
aten("gt.Scalar", "gt.Tensor")(_cmp(ops.greater))
# equal and less are exclusive, so their sum is the <= mask (and stays 0 for NaN, as torch's)
aten("le.Scalar", "le.Tensor")(_cmp(lambda a, b: ops.less(a, b) + ops.equal(a, b)))
aten("ge.Scalar", "ge.Tensor")(_cmp(lambda a, b: ops.greater(a, b) + ops.equal(a, b)))


@aten("logical_not.default", "bitwise_not.default")
def _not(cx, x):
    if cx.tkind(x) != "bool" and cx.name.startswith("aten.bitwise"):
        cx.fail("bitwise_not of an integer tensor is not supported")
    return 1.0 - mask(cx, x)


@aten("logical_and.default", "bitwise_and.Tensor")
def _and(cx, a, b):
    return mask(cx, a) * mask(cx, b)


@aten("logical_or.default", "bitwise_or.Tensor")
def _or(cx, a, b):
    return ops.maximum(mask(cx, a), mask(cx, b))


@aten("logical_xor.default", "bitwise_xor.Tensor")
def _xor(cx, a, b):
    return ops.abs(mask(cx, a) - mask(cx, b))


@aten("where.self")
def _where(cx, c, a, b):
    if a is NAN or b is NAN:
        cond = cx.node.args[0]
        if str(getattr(cond, "target", "")) != "aten.isnan.default":
            cx.fail("a NaN constant is supported only as where(isnan(y), nan, z)")
        y = cx.value_of(cond.args[0])
        a, b = (y if a is NAN else a), (y if b is NAN else b)
    out = cx.out_dtype()
    a = f32(a) if out == "f32" and is_t(a) else (num(a) if not is_t(a) else a)
    b = f32(b) if out == "f32" and is_t(b) else (num(b) if not is_t(b) else b)
    if not is_t(a) and not is_t(b):
        a = const(a, (), out)
    return ops.where(mask(cx, c), a, b)


@aten("isnan.default")
def _isnan(cx, x):
    return 1.0 - ops.equal(f32(x), f32(x))


# ---- creation, casts, identities ------------------------------------------------------------


@aten("scalar_tensor.default")
def _scalar_tensor(cx, v, **kw):
    return NAN if isinstance(v, float) and math.isnan(v) else const(v, (), cx.out_dtype())


@aten("full.default")
def _full(cx, size, v, **kw):
    return const(v, tuple(size), cx.out_dtype())


@aten("full_like.default")
def _full_like(cx, x, v, **kw):
    return const(v, x.shape, cx.out_dtype())


@aten("zeros_like.default", "ones_like.default")
def _zeros_like(cx, x, **kw):
    return const(1.0 if cx.name.startswith("aten.ones") else 0.0, x.shape, cx.out_dtype())


@aten("zeros.default", "ones.default")
def _zeros(cx, size, **kw):
    return const(1.0 if cx.name.startswith("aten.ones") else 0.0, tuple(size), cx.out_dtype())


@aten("arange.start_step", "arange.start", "arange.default")
def _arange(cx, start, end=None, step=1, **kw):
    if end is None:
        start, end = 0, start
    n = max(0, math.ceil((end - start) / step))
    return ops.arange(n, "f32") * num(step) + num(start)


@aten("_to_copy.default", "clone.default", "alias.default", "lift_fresh_copy.default", "contiguous.default")
def _same(cx, x, **kw):
    return x  # the replay casts to the node's dtype


@aten("detach.default")
def _detach(cx, x):
    return ops.stop_gradient(x) if x.dtype == "f32" else x


@aten("_assert_async.msg", "_assert_tensor_metadata.default", "_assert_scalar.default", "sym_constrain_range_for_size.default")
def _assert(cx, *args, **kw):
    return None  # value checks torch makes at run time; aot's runtime checks index inputs itself
