"""Exact IEEE corners: a float-class test and a matmul by a 0/1 mask that selects.

Gradients of gathers (embedding, take_along_axis) are a matmul with a one-hot mask, so
they need no scatter or atomics. A plain matmul multiplies each cotangent by the mask's
zeros too: one inf cotangent makes inf * 0 = NaN in every row no index selects, where
PyTorch's index_add gives 0. `mask_matmul` sums the finite part with the matmul and
finds out per output element, with two more columns of counts through the same matmul,
whether a selected term was +inf, -inf or NaN: the result is then what IEEE addition of
the selected terms gives (+inf, -inf, or NaN for both or a NaN).
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
