"""One frozen OpDef per primitive: shape rule, NumPy semantics, gradient and kernel family together.

Shape rules take `(shape, dtype)` pairs plus the node's attrs and return the output
`(shape, dtype)`; they raise `Bad` with a message, which tracing turns into a ShapeError
that names the op, the operands and the user's line. VJP rules take the output cotangent
and the node and return one cotangent (or None) per input; grad.py accumulates them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


class Bad(Exception):
    """A shape rule's complaint: message plus an optional hint for the user."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class OpDef:
    name: str
    shape: Callable[..., tuple[tuple[int, ...], str]]
    ref: Callable[..., np.ndarray]
    vjp: Callable | None
    kernel: str  # kernel family: elementwise, reduce, matmul, leaf
    expr: str | None = None  # WGSL expression for elementwise ops, operands {0}, {1}, ...
    nondiff: bool = False  # no gradient flows through (argmax, comparisons, one_hot)


_OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in _OPS:
        raise ValueError(f"op {op.name!r} registered twice")
    if op.vjp is None and not op.nondiff:
        raise ValueError(f"op {op.name!r} needs a vjp or nondiff=True")
    _OPS[op.name] = op
    return op


def lookup(name: str) -> OpDef:
    try:
        return _OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; registered ops: {', '.join(sorted(_OPS))}") from None


def all_ops() -> dict[str, OpDef]:
    return dict(_OPS)
