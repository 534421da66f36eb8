"""`Tensor.__getitem__` (API.md §7): ints, slices with steps, None, Ellipsis and integer arrays.

Basic indexing is made of views: an int is a narrow of length 1 whose axis a reshape drops, a
slice with step 1 a narrow, a slice with a step the `slice` primitive below (a strided view of
its input's storage, no copy), None a reshape, and a negative step a flip followed by a positive
one. An integer index (an i32 Tensor, or a Python list of ints) picks along one axis: a Tensor
index is a gather (`embedding` of the axis moved to the front: clamped in the kernel and checked
by the runtime like every index input, gradient a one-hot matmul, so repeated indices add up);
a list is a concat of length-1 narrows (static, so its gradient needs no index data at all).
"""

from __future__ import annotations

import builtins as _b
import numbers

import numpy as np

from ..ir import Tensor
from ..views import View
from .registry import Bad, OpDef, follow, register
from .trace import emit, fail
from . import api as F


def _slice_shape(x, axis, start, step, length):
    if not 0 <= axis < len(x[0]):
        raise Bad(f"axis {axis} is out of range for rank {len(x[0])}")
    n = x[0][axis]
    if step < 1 or start < 0 or length < 0 or (length and start + step * (length - 1) >= n):
        raise Bad(f"{length} elements from {start} in steps of {step} do not fit axis {axis} of size {n}")
    out = list(x[0])
    out[axis] = length
    return tuple(out), x[1]


def _slice_ref(x, axis, start, step, length):
    idx = [_b.slice(None)] * x.ndim
    idx[axis] = _b.slice(start, start + step * (length - 1) + 1, step)
    return x[tuple(idx)].copy()


def _slice_view(n, views):
    v = views.get(id(n.inputs[0]))
    if v is None:
        return None
    a = n.attrs
    real = [sd for sd in v.dims[a["axis"]] if sd[0] != 1]
    if len(real) > 1:
        return None  # a merged axis (several sub-dims): read through the render instead
    st = real[0][1] if real else 0
    dims = list(v.dims)
    dims[a["axis"]] = ((a["length"], st * a["step"]),)
    return View(v.base, v.offset + a["start"] * st, tuple(dims))


def _slice_wgsl(body, n, idx):
    src, a = n.inputs[0], n.attrs
    c = list(idx.get_coords(body))
    c[a["axis"]] = f"({c[a['axis']]} * {a['step']}u + {a['start']}u)"
    return body.value(src, body.index(src.shape, c))


def _unslice_shape(x, axis, start, step, size):
    if not 0 <= axis < len(x[0]):
        raise Bad(f"axis {axis} is out of range for rank {len(x[0])}")
    length = x[0][axis]
    if step < 1 or start < 0 or (length and start + step * (length - 1) >= size):
        raise Bad(f"{length} elements from {start} in steps of {step} do not fit an axis of size {size}")
    out = list(x[0])
    out[axis] = size
    return tuple(out), x[1]


def _unslice_ref(x, axis, start, step, size):
    shape = list(x.shape)
    shape[axis] = size
    out = np.zeros(shape, dtype=x.dtype)
    idx = [_b.slice(None)] * x.ndim
    idx[axis] = _b.slice(start, start + step * (x.shape[axis] - 1) + 1, step)
    out[tuple(idx)] = x
    return out


def _unslice_wgsl(body, n, idx):
    src, a, t = n.inputs[0], n.attrs, n.out
    c = list(idx.get_coords(body))
    ax, length = a["axis"], src.shape[a["axis"]]
    # u32 arithmetic, no signed / or % (SwiftShader takes minutes over those inside a CPU
    # reduction's loop, see conv._fold_tap): a coordinate before `start` wraps to a quotient past
    # `length`, so the bound check covers both sides.
    step = a["step"]
    rel = c[ax] if a["start"] == 0 else body.let(f"{c[ax]} - {a['start']}u", "u32")
    q = rel if step == 1 else f"{rel} / {step}u"
    inside = f"({q} < {length}u)" if step == 1 else f"({rel} % {step}u == 0u && {q} < {length}u)"
    c[ax] = body.let(f"min({q}, {_b.max(length - 1, 0)}u)", "u32")
    v = body.value(src, body.index(src.shape, c))
    zero = "0.0" if t.dtype == "f32" else "0i"
    return body.let(f"select({zero}, {v}, {inside})", t.dtype)


# every step-th element of one axis: a strided view (its transpose, unslice, puts them back
# between zeros, as pad is narrow's)
register(
    OpDef(
        "slice", _slice_shape, _slice_ref,
        lambda ct, n: (unslice(ct, n.attrs["axis"], n.attrs["start"], n.attrs["step"], n.inputs[0].shape[n.attrs["axis"]]),),
        "view", view=_slice_view, index_bound=follow, render=_slice_wgsl,
    )
)
register(
    OpDef(
        "unslice", _unslice_shape, _unslice_ref,
        lambda ct, n: (strided(ct, n.attrs["axis"], n.attrs["start"], n.attrs["step"], n.inputs[0].shape[n.attrs["axis"]]),),
        "gather", prologue=True, render=_unslice_wgsl,
    )
)


def strided(x, axis: int, start: int, step: int, length: int):
    """Elements start, start + step, ... (length of them) of one axis: a view."""
    if step == 1:
        return F.narrow(x, axis, start, length)
    return emit("slice", (x,), axis=axis, start=int(start), step=int(step), length=int(length))


def unslice(ct, axis: int, start: int, step: int, size: int):
    """strided's transpose: ct's elements at start, start + step, ... of an axis of `size`, zeros between."""
    if step == 1:
        return F.pad(ct, axis, start, size - start - ct.shape[axis])
    return emit("unslice", (ct,), axis=axis, start=int(start), step=int(step), size=int(size))


# ---- __getitem__ ----------------------------------------------------------------------------------


def _is_int(k) -> bool:
    return isinstance(k, numbers.Integral) and not isinstance(k, bool)


def _static_list(k) -> bool:
    return isinstance(k, (list, np.ndarray)) and all(_is_int(i) for i in np.asarray(k, dtype=object).ravel())


def _consumes(k) -> bool:
    return k is not None and k is not Ellipsis


def getitem(x: Tensor, key):
    """x[key] as NumPy and PyTorch index: ints (negative count from the end), slices (any step;
    a negative step reads backwards), None (a new axis of size 1), Ellipsis, and one integer
    index per call: an i32 Tensor (any shape; its dims replace the axis; values must lie in
    [0, size): out-of-range values are rejected by the runtime, and clamped in the kernels) or a
    list of ints. Basic indexing gives views of the input's storage (no copy)."""
    key = key if isinstance(key, tuple) else (key,)
    if _b.sum(1 for k in key if k is Ellipsis) > 1:
        fail("getitem", "an index can only have a single ellipsis ('...')")
    used = _b.sum(1 for k in key if _consumes(k))
    if used > x.ndim:
        fail("getitem", f"too many indices for {x.type_str()}: {used} axes indexed, {x.ndim} present")
    if Ellipsis in [k if k is Ellipsis else None for k in key]:
        at = [i for i, k in enumerate(key) if k is Ellipsis][0]
        key = key[:at] + (_b.slice(None),) * (x.ndim - used) + key[at + 1 :]
    else:
        key = key + (_b.slice(None),) * (x.ndim - used)
    out, pos, picked = x, 0, None
    for k in key:
        if k is None:
            out = F.reshape(out, out.shape[:pos] + (1,) + out.shape[pos:])
            pos += 1
        elif _is_int(k):
            n = out.shape[pos]
            if not -n <= k < n:
                fail("getitem", f"index {k} is out of range for an axis of size {n} in {x.type_str()}")
            out = F.narrow(out, pos, int(k) % n, 1)
            out = F.reshape(out, out.shape[:pos] + out.shape[pos + 1 :])
        elif isinstance(k, _b.slice):
            out = _take_slice(out, pos, k, x)
            pos += 1
        elif isinstance(k, Tensor) or _static_list(k):
            if picked is not None:
                fail("getitem", "only one integer-array index per indexing call is supported",
                     "index in two steps: x[i][:, j] (NumPy would broadcast several arrays together)")
            if isinstance(k, Tensor) and k.dtype != "i32":
                fail("getitem", f"a Tensor index must be i32, got {k.type_str()}",
                     "cast with ops.cast(idx, 'i32'); boolean masks have a data-dependent shape (use ops.where)")
            picked = (pos, k)
            pos += 1
        else:
            fail("getitem", f"unsupported index {k!r} of type {type(k).__name__}",
                 "use ints, slices, None, ..., an i32 Tensor or a list of ints")
    if picked is not None:
        out = _take(out, *picked)
    return out


def _take_slice(x, axis, k, orig):
    n = x.shape[axis]
    for v in (k.start, k.stop, k.step):
        if v is not None and not _is_int(v):
            fail("getitem", f"slice bounds must be ints or None, got {k!r}")
    if k.step == 0:
        fail("getitem", "slice step cannot be zero")
    start, stop, step = k.indices(n)
    length = len(range(start, stop, step))
    if step > 0:
        return strided(x, axis, start, step, length)
    # backwards: element start - j*|step| is element (n-1-start) + j*|step| of the flipped axis
    if length == 0:
        return F.narrow(x, axis, 0, 0)
    return strided(F.flip(x, axis), axis, n - 1 - start, -step, length)


def _take(x, axis, k):
    n = x.shape[axis]
    if not isinstance(k, Tensor):
        idx = [int(i) for i in np.asarray(k).ravel()]
        bad = [i for i in idx if not -n <= i < n]
        if bad:
            fail("getitem", f"index {bad[0]} is out of range for an axis of size {n}")
        shape = np.asarray(k).shape
        parts = [F.narrow(x, axis, i % n, 1) for i in idx]
        if not parts:
            fail("getitem", "an empty index list selects nothing")
        out = F.concat(parts, axis) if len(parts) > 1 else parts[0]
        return F.reshape(out, x.shape[:axis] + tuple(shape) + x.shape[axis + 1 :])
    # the indexed axis first: its rows are what embedding gathers (and clamps)
    perm = (axis,) + tuple(i for i in range(x.ndim) if i != axis)
    g = F.embedding(F.transpose(x, perm), k)  # [*k.shape, rest...]
    r = k.ndim
    back = tuple(range(r, r + axis)) + tuple(range(r)) + tuple(range(r + axis, g.ndim))
    return F.transpose(g, back)
