"""Exact IEEE corners: a float-class test, a matmul by a 0/1 mask that selects, and the
scatter-sum that gives gathers their gradients.

A matmul by a 0/1 mask multiplies each entry by the mask's zeros too: one inf makes
inf * 0 = NaN in every output no 1 selects. `mask_matmul` sums the finite part with the
matmul and finds out per output element, with two more columns of counts through the same
matmul, whether a selected term was +inf, -inf or NaN: the result is then what IEEE
addition of the selected terms gives (+inf, -inf, or NaN for both or a NaN).

Gradients of gathers (embedding, take_along_axis) are `select_sum`: a sum over the tokens
of `where(index == row, cotangent, 0)`. A select, not a product, so an inf or NaN
cotangent reaches only the rows its index selects (PyTorch's index_add); repeated indices
add; no scatter or atomics, so the result is deterministic. The broadcast operands, the
compare and the select are inlined into the sum's kernel (one output element per table
element, looping over the tokens): no [tokens, rows] one-hot is ever stored, the memory is
the cotangent's plus the result's.
"""

from __future__ import annotations

import numpy as np

from .registry import Bad, OpDef, register
from .trace import emit
from . import api as F

_KINDS = ("finite", "up", "down")  # finite; +inf or NaN; -inf or NaN


def _fp_flag_shape(x, kind):
    if x[1] != "f32":
        raise Bad(f"expects f32, got {x[1]}")
    if kind not in _KINDS:
        raise Bad(f"kind must be one of {_KINDS}, got {kind!r}")
    return x[0], "f32"


def _fp_flag_ref(x, kind):
    with np.errstate(invalid="ignore"):
        flag = {"finite": np.isfinite(x), "up": np.isnan(x) | (x == np.inf), "down": np.isnan(x) | (x == -np.inf)}[kind]
    return flag.astype(x.dtype)


# fp_flag_f32 (_helpers.wgsl.j2) tests the bits: a compiler may assume floats are finite and
# fold isinf/isnan tests written on values
register(
    OpDef(
        "fp_flag", _fp_flag_shape, _fp_flag_ref, None, "pointwise", nondiff=True,
        expr=lambda a: "fp_flag_f32({0}, %du)" % _KINDS.index(a["kind"]),
    )
)


def fp_flag(x, kind: str):
    """f32 1/0 per element: `finite`, `up` (+inf or NaN) or `down` (-inf or NaN)."""
    return emit("fp_flag", (x,), kind=kind)


def mask_matmul(a, b, mask: str):
    """a @ b where `mask` ("a" or "b") is a 0/1 matrix: each product selects the other
    operand's entry or 0 (also for inf/NaN entries), as a sum of the selected entries would."""
    vals = b if mask == "a" else a
    axis = -1 if mask == "a" else -2  # stack along the axis the matmul keeps
    parts = [F.where(fp_flag(vals, "finite"), vals, 0.0), fp_flag(vals, "up"), fp_flag(vals, "down")]
    out = F.matmul(a, F.concat(parts, axis)) if mask == "a" else F.matmul(F.concat(parts, axis), b)
    total, up, down = F.split(out, out.shape[axis] // 3, axis)
    up, down = F.greater(up, 0.0), F.greater(down, 0.0)
    inf = float("inf")
    return F.where(up, F.where(down, float("nan"), inf), F.where(down, -inf, total))


def select_sum(ct, idx, size: int, axis: int):
    """out[..., i, ...] = sum over j of ct[..., j, ...] where idx[..., j, ...] == i, for i in
    [0, size): ct's shape with `axis` (length J) replaced by `size`; idx (i32) has ct's rank and
    broadcasts to it. An index outside [0, size) selects no row."""
    s = tuple(ct.shape)
    lead, tail = s[:axis], s[axis:]
    wide = lead + (size,) + tail  # [..., size, J, ...]: the sum is over axis + 1
    ct_w = F.broadcast_to(F.reshape(ct, lead + (1,) + tail), wide)
    ix_w = F.broadcast_to(F.reshape(idx, tuple(idx.shape[:axis]) + (1,) + tuple(idx.shape[axis:])), wide)
    rows = F.broadcast_to(F.reshape(F.arange(size, "i32"), (1,) * axis + (size,) + (1,) * len(tail)), wide)
    return F.sum(F.where(F.equal(ix_w, rows), ct_w, 0.0), axis=axis + 1)
