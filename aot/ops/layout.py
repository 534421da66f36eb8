"""Layout primitives: reshape, transpose, broadcast_to, concat, narrow, pad, flip.

None of these needs a kernel of its own after fusion: they become index arithmetic in
the kernel that reads them (or a plain alias of the same storage, for reshape).
Linear pairs: broadcast_to <-> sum, reshape <-> reshape, transpose <-> inverse perm,
concat <-> narrow, narrow <-> pad, flip <-> flip.
"""

from __future__ import annotations

import numpy as np

from ..views import View, regroup
from .registry import COSTLY, Bad, OpDef, follow, register
from . import api as F


def _prod(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _reshape_shape(x, shape):
    if _prod(shape) != _prod(x[0]):
        raise Bad(f"cannot reshape {list(x[0])} ({_prod(x[0])} elements) to {list(shape)} ({_prod(shape)} elements)")
    return tuple(shape), x[1]


register(
    OpDef(
        "reshape",
        _reshape_shape,
        lambda x, shape: np.reshape(x, shape),
        lambda ct, n: (F.reshape(ct, n.inputs[0].shape),),
        "view",
        view=lambda n, views: _unary_view(_reshape_view, n, views),
        same_order=True,
        index_bound=follow,
        render=lambda body, n, idx: body.value(n.inputs[0], body.reshape_index(idx, n.inputs[0].shape)),
    )
)


def _transpose_shape(x, perm):
    if sorted(perm) != list(range(len(x[0]))):
        raise Bad(f"axes {list(perm)} are not a permutation of 0..{len(x[0]) - 1}")
    return tuple(x[0][p] for p in perm), x[1]


register(
    OpDef(
        "transpose",
        _transpose_shape,
        lambda x, perm: np.transpose(x, perm),
        lambda ct, n: (F.transpose(ct, tuple(int(i) for i in np.argsort(n.attrs["perm"]))),),
        "view",
        view=lambda n, views: _unary_view(_transpose_view, n, views),
        index_bound=follow,
        render=lambda body, n, idx: _transpose_wgsl(body, n, idx),
    )
)


def _broadcast_shape(x, shape):
    src = x[0]
    if len(shape) < len(src):
        raise Bad(f"cannot broadcast {list(src)} to the lower-rank shape {list(shape)}")
    for s, d in zip(src[::-1], shape[::-1]):
        if s != d and s != 1:
            raise Bad(f"cannot broadcast {list(src)} to {list(shape)}")
    return tuple(shape), x[1]


def _broadcast_vjp(ct, n):
    src = n.inputs[0].shape
    lead = len(ct.shape) - len(src)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(src) if d == 1 and ct.shape[lead + i] != 1)
    if not axes:
        return (F.reshape(ct, src),)
    return (F.reshape(F.sum(ct, axis=axes), src),)


def _broadcast_wgsl(body, n, idx):
    src, t = n.inputs[0], n.out
    if src.size == t.size:  # only size-1 dims added: the same elements in the same order
        return body.value(src, body.index(src.shape, flat=idx.get_flat(body)))
    c = idx.get_coords(body)
    lead = t.ndim - src.ndim
    return body.value(src, body.index(src.shape, ["0u" if d == 1 else c[lead + i] for i, d in enumerate(src.shape)]))


register(
    OpDef(
        "broadcast_to", _broadcast_shape, lambda x, shape: np.broadcast_to(x, shape).copy(), _broadcast_vjp, "view",
        view=lambda n, views: _unary_view(_broadcast_view, n, views), index_bound=follow, render=_broadcast_wgsl,
    )
)


def _concat_shape(*xs, axis):
    if not xs:
        raise Bad("needs at least one tensor")
    rank = len(xs[0][0])
    if not 0 <= axis < rank:
        raise Bad(f"axis {axis} is out of range for rank {rank}")
    for s, d in xs:
        if d != xs[0][1]:
            raise Bad("dtypes differ")
        if len(s) != rank or any(s[i] != xs[0][0][i] for i in range(rank) if i != axis):
            raise Bad(f"shapes must agree except on axis {axis}")
    out = list(xs[0][0])
    out[axis] = sum(s[axis] for s, _ in xs)
    return tuple(out), xs[0][1]


def _concat_vjp(ct, n):
    axis, start, outs = n.attrs["axis"], 0, []
    for x in n.inputs:
        outs.append(F.narrow(ct, axis, start, x.shape[axis]))
        start += x.shape[axis]
    return tuple(outs)


def _concat_view(n, views):
    """A leading-axis concat of adjacent contiguous slices of one buffer is a view of it."""
    t, axis = n.out, n.attrs["axis"]
    if any(d != 1 for d in t.shape[:axis]):
        return None
    vs = [views.get(id(x)) for x in n.inputs]
    if not all(v is not None and v.is_contiguous(x.shape) for v, x in zip(vs, n.inputs)):
        return None
    off = vs[0].offset
    for v, x in zip(vs, n.inputs):
        if v.base is not vs[0].base or v.offset != off:
            return None
        off += x.size
    return View.contiguous(vs[0].base, vs[0].offset, t.shape)


def _concat_wgsl(body, n, idx):
    c = list(idx.get_coords(body))
    ax = n.attrs["axis"]
    ty = n.out.dtype
    start, parts = 0, []
    for x in n.inputs:
        parts.append((start, x))
        start += x.shape[ax]
    s0, x0 = parts[-1]
    cc = list(c)
    cc[ax] = f"min({c[ax]} - {s0}u, {x0.shape[ax] - 1}u)" if s0 else c[ax]
    v = body.value(x0, body.index(x0.shape, cc))
    for s0, x in reversed(parts[:-1]):
        cc = list(c)
        cc[ax] = f"min({c[ax]} - {s0}u, {x.shape[ax] - 1}u)" if s0 else f"min({c[ax]}, {x.shape[ax] - 1}u)"
        vx = body.value(x, body.index(x.shape, cc))
        v = body.let(f"select({v}, {vx}, {c[ax]} < {s0 + x.shape[ax]}u)", ty)
    return v


register(
    OpDef(
        "concat", _concat_shape, lambda *xs, axis: np.concatenate(xs, axis=axis), _concat_vjp, "concat", cost=COSTLY,
        view=_concat_view, index_bound=follow, render=_concat_wgsl,
    )
)


def _narrow_shape(x, axis, start, length):
    if not 0 <= axis < len(x[0]):
        raise Bad(f"axis {axis} is out of range for rank {len(x[0])}")
    if start < 0 or length < 0 or start + length > x[0][axis]:
        raise Bad(f"range [{start}, {start + length}) is outside axis {axis} of size {x[0][axis]}")
    out = list(x[0])
    out[axis] = length
    return tuple(out), x[1]


def _narrow_ref(x, axis, start, length):
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(start, start + length)
    return x[tuple(idx)].copy()


def _narrow_vjp(ct, n):
    a = n.attrs
    size = n.inputs[0].shape[a["axis"]]
    return (F.pad(ct, a["axis"], a["start"], size - a["start"] - a["length"]),)


def _narrow_wgsl(body, n, idx):
    src, a = n.inputs[0], n.attrs
    c = list(idx.get_coords(body))
    if a["start"]:
        c[a["axis"]] = f"({c[a['axis']]} + {a['start']}u)"
    return body.value(src, body.index(src.shape, c))


register(
    OpDef(
        "narrow", _narrow_shape, _narrow_ref, _narrow_vjp, "view",
        view=lambda n, views: _unary_view(_narrow_view, n, views), index_bound=follow, render=_narrow_wgsl,
    )
)


def _pad_shape(x, axis, before, after):
    if not 0 <= axis < len(x[0]):
        raise Bad(f"axis {axis} is out of range for rank {len(x[0])}")
    if before < 0 or after < 0:
        raise Bad("padding must be non-negative")
    out = list(x[0])
    out[axis] += before + after
    return tuple(out), x[1]


def _pad_ref(x, axis, before, after):
    widths = [(0, 0)] * x.ndim
    widths[axis] = (before, after)
    return np.pad(x, widths)


register(
    OpDef(
        "pad",
        _pad_shape,
        _pad_ref,
        lambda ct, n: (F.narrow(ct, n.attrs["axis"], n.attrs["before"], n.inputs[0].shape[n.attrs["axis"]]),),
        "gather",
        cost=COSTLY,
        prologue=True,
        render=lambda body, n, idx: _pad_wgsl(body, n, idx),
    )
)


def _flip_shape(x, axes):
    if any(not 0 <= a < len(x[0]) for a in axes):
        raise Bad(f"axes {list(axes)} are out of range for rank {len(x[0])}")
    return x


# reverses the given axes (a convolution's input gradient correlates with the flipped kernel)
register(
    OpDef(
        "flip",
        _flip_shape,
        lambda x, axes: np.flip(x, axes).copy(),
        lambda ct, n: (F.flip(ct, n.attrs["axes"]),),
        "index",
        render=lambda body, n, idx: _flip_wgsl(body, n, idx),
    )
)


# ---- view rules (the schedule: a view reads its input's storage in place) --------------


def _unary_view(rule, n, views):
    v = views.get(id(n.inputs[0]))
    return None if v is None else rule(n, v)


def _reshape_view(n, v):
    dims = regroup([sd for axis in v.dims for sd in axis], n.out.shape)
    return View(v.base, v.offset, dims) if dims is not None else None


def _transpose_view(n, v):
    return View(v.base, v.offset, tuple(v.dims[p] for p in n.attrs["perm"]))


def _narrow_view(n, v):
    a = n.attrs
    axis = [sd for sd in v.dims[a["axis"]] if sd[0] != 1] or [(1, 0)]
    inner = 1
    for size, _ in axis[1:]:
        inner *= size
    if a["start"] % inner or a["length"] % inner:
        return None  # cuts through an inner sub-dim
    (size, st), rest = axis[0], axis[1:]
    dims = list(v.dims)
    dims[a["axis"]] = ((a["length"] // inner, st),) + tuple(rest)
    return View(v.base, v.offset + (a["start"] // inner) * st, tuple(dims))


def _broadcast_view(n, v):
    t, src = n.out, n.inputs[0]
    lead = t.ndim - src.ndim
    dims = [((d, 0),) for d in t.shape[:lead]]
    for i, d in enumerate(src.shape):
        dims.append(((t.shape[lead + i], 0),) if d == 1 and t.shape[lead + i] != 1 else v.dims[i])
    return View(v.base, v.offset, tuple(dims))


# ---- WGSL (wgsl_expr.Body calls these for one element at `idx`) --------------------------


def _transpose_wgsl(body, n, idx):
    src = n.inputs[0]
    kept = [p for p in n.attrs["perm"] if src.shape[p] != 1]
    if kept == sorted(kept):  # only size-1 axes move: the same elements in the same order
        return body.value(src, body.index(src.shape, flat=idx.get_flat(body)))
    c = idx.get_coords(body)
    sc = [None] * src.ndim
    for i, p in enumerate(n.attrs["perm"]):
        sc[p] = c[i]
    return body.value(src, body.index(src.shape, sc))


def _flip_wgsl(body, n, idx):
    src = n.inputs[0]
    c = list(idx.get_coords(body))
    for ax in n.attrs["axes"]:
        c[ax] = f"({src.shape[ax] - 1}u - {c[ax]})"
    return body.value(src, body.index(src.shape, c))


def _pad_wgsl(body, n, idx):
    src, a, t = n.inputs[0], n.attrs, n.out
    c = list(idx.get_coords(body))
    ax, before, size = a["axis"], a["before"], src.shape[a["axis"]]
    inside = f"({c[ax]} >= {before}u && {c[ax]} < {before + size}u)"
    c[ax] = f"min({c[ax]} - {before}u, {size - 1}u)" if before else f"min({c[ax]}, {size - 1}u)"
    v = body.value(src, body.index(src.shape, c))
    zero = "0.0" if t.dtype == "f32" else "0i"
    return body.let(f"select({zero}, {v}, {inside})", t.dtype)
