"""Core ATen's layout, reduction, indexing and random ops -> aot ops (registered into ops_map.TABLE;
conventions in ops_map.py)."""

from __future__ import annotations

import math

from .. import ops
from .ops_map import aten, const, dim, f32, is_t, mask, num


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
