"""Layout primitives: reshape, transpose, broadcast_to, concat, narrow, pad, flip.

None of these needs a kernel of its own after fusion: they become index arithmetic in
the kernel that reads them (or a plain alias of the same storage, for reshape).
Linear pairs: broadcast_to <-> sum, reshape <-> reshape, transpose <-> inverse perm,
concat <-> narrow, narrow <-> pad, flip <-> flip.
"""

from __future__ import annotations

import numpy as np

from .registry import Bad, OpDef, register
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
        "elementwise",
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
        "elementwise",
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


register(OpDef("broadcast_to", _broadcast_shape, lambda x, shape: np.broadcast_to(x, shape).copy(), _broadcast_vjp, "elementwise"))


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


register(OpDef("concat", _concat_shape, lambda *xs, axis: np.concatenate(xs, axis=axis), _concat_vjp, "elementwise"))


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


register(OpDef("narrow", _narrow_shape, _narrow_ref, _narrow_vjp, "elementwise"))


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
        "elementwise",
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
        "elementwise",
    )
)
