"""Reductions: sum, max, argmax over normalized (sorted, non-negative) axes."""

from __future__ import annotations

import numpy as np

from .registry import Bad, OpDef, register
from . import api as F


def _reduced_shape(shape, axes, keepdims):
    for a in axes:
        if not 0 <= a < len(shape):
            raise Bad(f"axis {a} is out of range for rank {len(shape)}")
    if len(set(axes)) != len(axes):
        raise Bad(f"repeated axis in {axes}")
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _reduce_shape(x, axes, keepdims):
    if x[1] != "f32":
        raise Bad(f"expects an f32 operand, got {x[1]}", "use ops.cast(x, 'f32') first")
    for a in axes:
        if x[0] and x[0][a] == 0:
            raise Bad("cannot reduce over an empty axis")
    return _reduced_shape(x[0], axes, keepdims), "f32"


def _expand_back(ct, n):
    """Cotangent of a reduction, reshaped with kept dims and broadcast back to the input."""
    x = n.inputs[0]
    kept = _reduced_shape(x.shape, n.attrs["axes"], True)
    return F.broadcast_to(F.reshape(ct, kept), x.shape)


def _max_vjp(ct, n):
    # Ties share the gradient evenly (torch.amax's rule); the max itself is not differentiated twice.
    x = n.inputs[0]
    kept = _reduced_shape(x.shape, n.attrs["axes"], True)
    hit = F.equal(x, F.broadcast_to(F.reshape(n.out, kept), x.shape))
    count = F.sum(hit, axis=n.attrs["axes"], keepdims=True)
    return (_expand_back(ct, n) * hit / F.broadcast_to(count, x.shape),)


def _sum_ref(x, axes, keepdims):
    # Accumulated in float64 and rounded once (as torch's CPU kernels accumulate float32 in
    # double): NumPy sums a float32 reduction over several or non-contiguous axes naively, so a
    # BatchNorm mean over 16 * 28 * 28 values came out ~2e-5 off, the float32 interpreter's
    # forward ~20 times less accurate than the GPU kernels' chunked sums, and a ReLU whose input
    # lay within that error of 0 flipped, moving a ResNet's gradients by 1-5%.
    acc = np.float64 if x.dtype.kind == "f" and x.dtype.itemsize < 8 else x.dtype
    return np.sum(x, axis=tuple(axes), keepdims=keepdims, dtype=acc).astype(x.dtype, copy=False)


register(
    OpDef(
        "sum",
        _reduce_shape,
        _sum_ref,
        lambda ct, n: (_expand_back(ct, n),),
        "reduce",
        reduced_axes=lambda a: tuple(a["axes"]),
        split="pad",  # sums pad a long axis with zeros up to a multiple of the chunk
    )
)
register(
    OpDef(
        "max",
        _reduce_shape,
        lambda x, axes, keepdims: np.max(x, axis=tuple(axes), keepdims=keepdims),
        _max_vjp,
        "reduce",
        reduced_axes=lambda a: tuple(a["axes"]),
        split="divide",  # no padding value: chunks must divide the axis
        selects=True,
    )
)


def _argmax_shape(x, axis, keepdims):
    if x[1] != "f32":
        raise Bad(f"expects an f32 operand, got {x[1]}")
    if x[0][axis] > 2**31:  # the result is an i32 index (and the kernel counts along the axis in a u32)
        raise Bad(f"the axis has {x[0][axis]} elements; an i32 index names at most 2**31", "argmax over a smaller axis (reshape, then argmax per chunk)")
    return _reduced_shape(x[0], (axis,), keepdims), "i32"


def _argmax_ref(x, axis, keepdims):
    r = np.argmax(x, axis=axis).astype(np.int32)
    return np.expand_dims(r, axis) if keepdims else r


register(
    OpDef("argmax", _argmax_shape, _argmax_ref, None, "reduce", nondiff=True, reduced_axes=lambda a: (a["axis"],), selects=True)
)
