"""matmul: [..., M, K] @ [K, N] (weights shared over the batch) and [..., M, K] @ [..., K, N]."""

from __future__ import annotations

import numpy as np

from .registry import Bad, OpDef, register
from . import api as F


def _matmul_shape(a, b):
    (sa, da), (sb, db) = a, b
    if da != "f32" or db != "f32":
        raise Bad(f"expects f32 operands, got {da} and {db}", "use ops.cast(x, 'f32') first")
    if len(sa) < 2 or len(sb) < 2:
        raise Bad("both operands need at least 2 dims ([..., M, K] @ [K, N])", "reshape a vector x to [1, K] or [K, 1]")
    if sa[-1] != sb[-2]:
        raise Bad(
            f"inner dimensions differ (K: {sa[-1]} vs {sb[-2]})",
            "nn.Linear(in, out) takes x[..., in]; check that the producer's last dim matches `in`",
        )
    if len(sb) > 2 and sa[:-2] != sb[:-2]:
        raise Bad(f"batch dims differ: {list(sa[:-2])} vs {list(sb[:-2])} (batched matmul does not broadcast)")
    return tuple(sa[:-1]) + (sb[-1],), "f32"


def _swap(x):
    perm = list(range(x.ndim))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return F.transpose(x, tuple(perm))


def _matmul_vjp(ct, n):
    a, b = n.inputs
    da = F.matmul(ct, _swap(b))
    if b.ndim == 2:
        # weights shared over the batch: dW = A^T @ ct with the batch folded into M
        a2 = F.reshape(a, (-1, a.shape[-1]))
        c2 = F.reshape(ct, (-1, ct.shape[-1]))
        db = F.matmul(_swap(a2), c2)
    else:
        db = F.matmul(_swap(a), ct)
    return da, db


def outer_product(a_shape, b_shape) -> bool:
    """[..., M, 1] @ [1, N]: computed as the broadcast product (passes.outer_products), each element
    its product exactly, -0.0 kept, where np.matmul and a kernel's sum start from +0.0."""
    return a_shape[-1] == 1 and len(b_shape) == 2


def _matmul_ref(a, b):
    return a * b if outer_product(a.shape, b.shape) else np.matmul(a, b)


register(OpDef("matmul", _matmul_shape, _matmul_ref, _matmul_vjp, "matmul"))
