"""Exact gather gradients (issue 32): the scatter-sum that gives gathers their gradients.

Gradients of gathers (embedding, take_along_axis) are `select_sum`: a sum over the tokens
of `where(index == row, cotangent, 0)`. A select, not a product with a one-hot mask (inf * 0
would be NaN in every row no index selects), so an inf or NaN cotangent reaches only the rows
its index selects (PyTorch's index_add); repeated indices add; no scatter or atomics, so the
result is deterministic. The broadcast operands, the
compare and the select are inlined into the sum's kernel (one output element per table
element, looping over the tokens): no [tokens, rows] one-hot is ever stored, the memory is
the cotangent's plus the result's.
"""

from __future__ import annotations

from .registry import lookup
from . import api as F

# rows from which select_sum reads a computed cotangent from storage: the sum's kernel reads each
# cotangent element once per row, and would recompute its inlined ops (a dropout mask's hash, a
# residual's adds) as often
REPEAT_STORE = 64


def _stored(x):
    """x, computed once and stored where its producer would otherwise be inlined into its reader:
    a sum over a length-1 axis (a reduction owns its output), the same values."""
    base = x
    while lookup(base.node.op).fusion == "view":
        base = base.node.inputs[0]
    if lookup(base.node.op).owns_storage or lookup(base.node.op).fusion == "constant":
        return x  # a view of storage already, or computed from the element index alone
    return F.sum(F.reshape(x, (1,) + tuple(x.shape)), axis=0)


def select_sum(ct, idx, size: int, axis: int):
    """out[..., i, ...] = sum over j of ct[..., j, ...] where idx[..., j, ...] == i, for i in
    [0, size): ct's shape with `axis` (length J) replaced by `size`; idx (i32) has ct's rank and
    broadcasts to it. An index outside [0, size) selects no row."""
    s = tuple(ct.shape)
    lead, tail = s[:axis], s[axis:]
    if size >= REPEAT_STORE:
        ct = _stored(ct)
    wide = lead + (size,) + tail  # [..., size, J, ...]: the sum is over axis + 1
    ct_w = F.broadcast_to(F.reshape(ct, lead + (1,) + tail), wide)
    ix_w = F.broadcast_to(F.reshape(idx, tuple(idx.shape[:axis]) + (1,) + tuple(idx.shape[axis:])), wide)
    rows = F.broadcast_to(F.reshape(F.arange(size, "i32"), (1,) * axis + (size,) + (1,) * len(tail)), wide)
    return F.sum(F.where(F.equal(ix_w, rows), ct_w, 0.0), axis=axis + 1)
