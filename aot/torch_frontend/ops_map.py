"""Core ATen ops -> aot ops: one small function per ATen overload, in the table `TABLE`.

Each function gets the replay context `cx` (the fx node, errors at the user's line) and the
node's arguments with every fx node replaced by its aot value: an aot Tensor, a Python number,
a list, None, or a tuple for an op with several results. dtypes: torch's floating tensors are
f32, its integer tensors i32 and its bool tensors f32 0/1 masks (aot's comparison results);
arithmetic on integers is done in f32 and cast back (exact below 2**24), and the replay casts
every result to the dtype torch's node says it has (replay.py). The nn-shaped ops (conv, pool,
norms, attention) are in ops_nn.py.
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


# ---- layout ---------------------------------------------------------------------------------


@aten("view.default", "_unsafe_view.default", "reshape.default", "view_copy.default")
def _view(cx, x, shape):
    return ops.reshape(x, tuple(shape))


@aten("permute.default", "permute_copy.default")
def _permute(cx, x, dims):
    return ops.transpose(x, tuple(d % x.ndim for d in dims))


@aten("t.default")
def _t(cx, x):
    return ops.transpose(x) if x.ndim == 2 else x


@aten("transpose.int")
def _transpose(cx, x, a, b):
    return ops.swapaxes(x, a, b)


@aten("expand.default", "expand_copy.default")
def _expand(cx, x, size, implicit=False):
    size = list(size)
    x = ops.reshape(x, (1,) * (len(size) - x.ndim) + x.shape)
    return ops.broadcast_to(x, tuple(x.shape[i] if s == -1 else s for i, s in enumerate(size)))


@aten("repeat.default")
def _repeat(cx, x, reps):
    reps = list(reps)
    x = ops.reshape(x, (1,) * (len(reps) - x.ndim) + x.shape)
    # (1, s0, 1, s1, ...) broadcast to (r0, s0, r1, s1, ...), then merged pairwise
    pairs = ops.reshape(x, tuple(v for s in x.shape for v in (1, s)))
    pairs = ops.broadcast_to(pairs, tuple(v for r, s in zip(reps, x.shape) for v in (r, s)))
    return ops.reshape(pairs, tuple(r * s for r, s in zip(reps, x.shape)))


@aten("unsqueeze.default")
def _unsqueeze(cx, x, d):
    d = d % (x.ndim + 1)
    return ops.reshape(x, x.shape[:d] + (1,) + x.shape[d:])


@aten("squeeze.dims", "squeeze.dim", "squeeze.default")
def _squeeze(cx, x, dims=None):
    dims = range(x.ndim) if dims is None else ([dims] if isinstance(dims, int) else dims)
    drop = {dim(x, d) for d in dims if x.shape[dim(x, d)] == 1}
    return ops.reshape(x, tuple(s for i, s in enumerate(x.shape) if i not in drop))


@aten("cat.default")
def _cat(cx, xs, d=0):
    xs = [x for x in xs if x.size or x.ndim > 1]  # torch skips 1-d empty tensors
    dtype = "f32" if any(x.dtype == "f32" for x in xs) else xs[0].dtype
    return ops.concat([ops.cast(x, dtype) for x in xs], d)


@aten("slice.Tensor", "slice_copy.Tensor")
def _slice(cx, x, d=0, start=None, end=None, step=1):
    d = dim(x, d)
    n = x.shape[d]
    start, end, step = slice(start, end, step).indices(n)
    length = max(0, -(-(end - start) // step))
    y = ops.narrow(x, d, start, min(n - start, (length - 1) * step + 1) if length else 0)
    if step == 1 or length <= 1:
        return y
    # every step-th element: pad to length*step, split the axis into (length, step), keep column 0
    y = ops.pad(y, d, 0, length * step - y.shape[d])
    y = ops.reshape(y, y.shape[:d] + (length, step) + y.shape[d + 1:])
    return ops.reshape(ops.narrow(y, d + 1, 0, 1), y.shape[:d] + (length,) + y.shape[d + 2:])


@aten("select.int", "select_copy.int")
def _select(cx, x, d, index):
    d = dim(x, d)
    y = ops.narrow(x, d, index % x.shape[d], 1)
    return ops.reshape(y, x.shape[:d] + x.shape[d + 1:])


@aten("split_with_sizes.default", "split_with_sizes_copy.default")
def _split_sizes(cx, x, sizes, d=0):
    return tuple(ops.split(x, list(sizes), d))


@aten("split.Tensor", "split_copy.Tensor")
def _split(cx, x, size, d=0):
    return tuple(ops.split(x, int(size), d))


@aten("unbind.int")
def _unbind(cx, x, d=0):
    d = dim(x, d)
    return tuple(_select(cx, x, d, i) for i in range(x.shape[d]))


@aten("flip.default")
def _flip(cx, x, dims):
    return ops.flip(x, tuple(dims))


@aten("constant_pad_nd.default")
def _pad(cx, x, pad, value=0.0):
    y = x
    for i in range(len(pad) // 2):  # pairs from the last dim backwards
        d = x.ndim - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        if lo < 0:
            y, lo = ops.narrow(y, d, -lo, y.shape[d] + lo), 0
        if hi < 0:
            y, hi = ops.narrow(y, d, 0, y.shape[d] + hi), 0
        if value:  # zero padding plus value where the padding is
            ones = ops.pad(ops.broadcast_to(const(1.0), y.shape), d, lo, hi)
            y = ops.pad(f32(y), d, lo, hi) + (1.0 - ones) * num(value)
        else:
            y = ops.pad(y, d, lo, hi)
    return y


# ---- reductions ---------------------------------------------------------------------------


def _dims(x, dims):
    return None if dims is None or (isinstance(dims, (list, tuple)) and not dims) else dims


@aten("sum.dim_IntList", "sum.default")
def _sum(cx, x, dims=None, keepdim=False, dtype=None):
    return ops.sum(f32(x), _dims(x, dims), keepdims=keepdim)


@aten("mean.dim", "mean.default")
def _mean(cx, x, dims=None, keepdim=False, dtype=None):
    return ops.mean(f32(x), _dims(x, dims), keepdims=keepdim)


@aten("amax.default")
def _amax(cx, x, dims=(), keepdim=False):
    return ops.max(x, _dims(x, dims), keepdims=keepdim)


@aten("max.default")
def _max_all(cx, x):
    return ops.max(x)


@aten("min.default")
def _min_all(cx, x):
    return ops.neg(ops.max(ops.neg(f32(x))))


@aten("prod.dim_int", "prod.default")
def _prod(cx, x, d=None, keepdim=False, dtype=None):
    x = f32(x)
    if d is None:
        x, d = ops.reshape(x, (-1,)), 0
    d = dim(x, d)
    if x.shape[d] > 64:
        cx.fail(f"prod over {x.shape[d]} elements is not supported (at most 64)")
    # a product of slices: exact values and gradients, zeros included
    parts = ops.split(x, 1, d)
    y = parts[0]
    for part in parts[1:]:
        y = y * part
    return y if keepdim else ops.reshape(y, x.shape[:d] + x.shape[d + 1:])


@aten("linalg_vector_norm.default")
def _vector_norm(cx, x, order=2, dims=None, keepdim=False, dtype=None):
    a = ops.abs(f32(x))
    dims = _dims(x, dims)
    if order == 2:
        return ops.sqrt(ops.sum(a * a, dims, keepdims=keepdim))
    if order == 1:
        return ops.sum(a, dims, keepdims=keepdim)
    if order == math.inf:
        return ops.max(a, dims, keepdims=keepdim)
    if isinstance(order, (int, float)) and order > 0:
        return ops.power(ops.sum(ops.power(a, float(order)), dims, keepdims=keepdim), 1.0 / order)
    cx.fail(f"vector norm of order {order} is not supported", "use ord 1, 2, inf or a positive p")


@aten("amin.default")
def _amin(cx, x, dims=(), keepdim=False):
    return ops.neg(ops.max(ops.neg(f32(x)), _dims(x, dims), keepdims=keepdim))


@aten("max.dim")
def _max_dim(cx, x, d, keepdim=False):
    return ops.max(x, d, keepdims=keepdim), ops.argmax(x, d, keepdims=keepdim)


@aten("argmax.default")
def _argmax(cx, x, d=None, keepdim=False):
    return ops.argmax(f32(x), d, keepdims=keepdim)


@aten("any.dim", "any.dims", "any.default")
def _any(cx, x, dims=None, keepdim=False):
    return ops.max(mask(cx, x), _dims(x, dims), keepdims=keepdim)


@aten("all.dim", "all.dims", "all.default")
def _all(cx, x, dims=None, keepdim=False):
    return 1.0 - ops.max(1.0 - mask(cx, x), _dims(x, dims), keepdims=keepdim)


@aten("var.correction", "var.dim")
def _var(cx, x, dims=None, unbiased=None, keepdim=False, correction=None):
    x = f32(x)
    axes = ops.api.normalize_axes("var", x, _dims(x, dims))
    n = math.prod(x.shape[a] for a in axes)
    c = correction if correction is not None else (1 if unbiased in (None, True) else 0)
    d = x - ops.mean(x, axes, keepdims=True)
    return ops.sum(d * d, axes, keepdims=keepdim) * (1.0 / max(n - c, 0) if n > c else math.nan)


# ---- linear algebra, indexing ---------------------------------------------------------------


@aten("mm.default", "bmm.default", "matmul.default")
def _mm(cx, a, b):
    return ops.matmul(f32(a), f32(b))


@aten("addmm.default")
def _addmm(cx, bias, a, b, beta=1, alpha=1):
    y = ops.matmul(f32(a), f32(b))
    y = y * num(alpha) if alpha != 1 else y
    return y + (f32(bias) * num(beta) if beta != 1 else f32(bias)) if beta != 0 else y


@aten("embedding.default")
def _embedding(cx, weight, idx, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if scale_grad_by_freq:
        cx.fail("embedding(scale_grad_by_freq=True) is not supported", "leave scale_grad_by_freq False")
    y = ops.embedding(weight, idx)
    if padding_idx is not None and padding_idx >= 0:
        # torch gives the padding row no gradient: the same values, with the gradient stopped there
        pad = ops.broadcast_to(ops.reshape(ops.equal(idx, const(padding_idx, (), "i32")), idx.shape + (1,)), y.shape)
        y = ops.where(pad, ops.stop_gradient(y), y)
    return y


@aten("gather.default")
def _gather(cx, x, d, idx, sparse_grad=False):
    d = dim(x, d)
    for a in range(x.ndim):  # torch reads only the leading part of x on the other axes
        if a != d and idx.shape[a] != x.shape[a]:
            x = ops.narrow(x, a, 0, idx.shape[a])
    return ops.take_along_axis(f32(x), idx, d)


@aten("index.Tensor", "_unsafe_index.Tensor")
def _index(cx, x, indices):
    """x[..., i, j, ...] with integer tensors (None: the whole axis). Several index tensors on
    adjacent axes are broadcast together and combined into one flat index over those axes."""
    at = [a for a, i in enumerate(indices) if i is not None]
    if any(not is_t(indices[a]) or indices[a].dtype != "i32" for a in at):
        cx.fail("only integer index tensors are supported (a boolean mask has a data-dependent shape)",
                "use torch.where(mask, x, other) instead of x[mask]")
    if at != list(range(at[0], at[-1] + 1)):
        cx.fail("index tensors on non-adjacent axes are not supported", "index one axis at a time")
    lead = (slice(None),) * at[0]
    if len(at) == 1:
        return ops.getitem(x, lead + (indices[at[0]],))
    shape = ops.api.broadcast_shapes("index", *[indices[a].shape for a in at])
    flat, stride = None, 1
    for a in reversed(at):  # row-major flat index over the indexed axes, in f32 (exact below 2**24)
        term = ops.broadcast_to(f32(indices[a]), shape) * float(stride)
        flat = term if flat is None else flat + term
        stride *= x.shape[a]
    merged = ops.reshape(x, x.shape[:at[0]] + (stride,) + x.shape[at[-1] + 1:])
    return ops.getitem(merged, lead + (ops.cast(flat, "i32"),))


@aten("slice_scatter.default")
def _slice_scatter(cx, x, src, d=0, start=None, end=None, step=1):
    d = dim(x, d)
    start, end, step = slice(start, end, step).indices(x.shape[d])
    if step != 1:
        cx.fail("slice_scatter with a step is not supported")
    src = ops.cast(src, x.dtype)
    parts = [ops.narrow(x, d, 0, start), src, ops.narrow(x, d, end, x.shape[d] - end)]
    return ops.concat([q for q in parts if q.shape[d]], d)


@aten("copy.default")
def _copy(cx, dst, src, non_blocking=False):
    return ops.broadcast_to(ops.cast(src, dst.dtype) if is_t(src) else const(src, (), dst.dtype), dst.shape)


@aten("empty.memory_format", "empty.default", "new_empty.default", "new_zeros.default")
def _empty(cx, size, *args, **kw):
    size = args[0] if is_t(size) else size  # new_empty(x, size)
    return const(0.0, tuple(size), cx.out_dtype())


@aten("cumsum.default")
def _cumsum(cx, x, d, dtype=None):
    x, d = f32(x), dim(x, d)
    if hasattr(ops, "cumsum"):
        return ops.cumsum(x, d)
    n = x.shape[d]
    if n > 2048:
        cx.fail(f"cumsum over {n} elements is not supported (at most 2048)")
    # a matmul with the upper-triangular ones: y[..., j] = sum over i <= j of x[..., i]
    i = ops.arange(n, "f32")
    tri = 1.0 - ops.greater(ops.broadcast_to(ops.reshape(i, (n, 1)), (n, n)), ops.broadcast_to(ops.reshape(i, (1, n)), (n, n)))
    y = ops.matmul(ops.swapaxes(x, d, -1), tri)
    return ops.swapaxes(y, d, -1)


@aten("index_select.default")
def _index_select(cx, x, d, idx):
    d = dim(x, d)
    y = ops.embedding(ops.swapaxes(f32(x), 0, d) if d else f32(x), idx)
    return ops.swapaxes(y, 0, d) if d else y


# ---- random: aot's own streams (new draws every call, reproducible from the model's seed) ----------


@aten("randn.default", "randn_like.default")
def _randn(cx, x, **kw):
    return ops.randn(x.shape if is_t(x) else tuple(x))


@aten("rand.default", "rand_like.default")
def _rand(cx, x, **kw):
    return ops.rand(x.shape if is_t(x) else tuple(x))


@aten("bernoulli.p")
def _bernoulli(cx, x, p=0.5, **kw):
    return ops.less(ops.rand(x.shape), num(p))
