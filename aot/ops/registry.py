"""One frozen OpDef per primitive: every fact a stage needs about it, in one record.

- shape (trace, verify), ref (the interpreter), vjp (grad.py);
- fusion class, recompute cost, view rule, prologue eligibility (schedule.py);
- index bound (pipeline.index_bounds: what an i32 input may hold);
- render / expr: the WGSL for one output element (wgsl_expr.py).
Stages ask the record; none compares op names.

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


# fusion classes (OpDef.fusion): how the schedule treats a node
FUSION = {
    "leaf": "storage the host writes (input, param, state); no kernel",
    "constant": "computed from the element index alone (const, arange); free to recompute",
    "view": "a strided read of its input's storage, no copy (reshape, transpose, ...)",
    "index": "index arithmetic over its input that is not a view (unfold, flip); free to recompute",
    "pointwise": "element i of the output reads element i of each (equal-shaped) input",
    "gather": "elementwise over its output, reading inputs at computed positions",
    "concat": "a gather that can instead be assembled in place by its inputs' kernels",
    "reduce": "a reduction kernel (owns its output)",
    "matmul": "a matmul kernel (owns its output; pointwise readers become its epilogue)",
    "attention": "a fused attention kernel (owns its output; reads its operands as strided views)",
    "recurrent": "a kernel walking every step of a recurrence (owns its output; reads its operands as strided views)",
}
KERNEL_FAMILY = {"leaf": "leaf", "constant": "leaf", "reduce": "reduce", "matmul": "matmul", "attention": "attention", "recurrent": "recurrent"}  # else elementwise
COSTLY = 4  # OpDef.cost of ops that take more than an instruction or two (exp, div, gathers)
FOLLOW = "follow"  # an index_bound result: the output carries the input's index values on


@dataclass(frozen=True)
class OpDef:
    name: str
    shape: Callable[..., tuple[tuple[int, ...], str]]
    ref: Callable[..., np.ndarray]
    vjp: Callable | None
    fusion: str  # a key of FUSION
    expr: str | Callable | None = None  # WGSL for pointwise ops, operands {0}, {1}, ...; or attrs -> that
    nondiff: bool = False  # no gradient flows through (argmax, comparisons, one_hot)
    cost: int | None = None  # recompute cost when inlined into several consumers (None: 0 for
    # constant/view/index ops, else 1); a tensor whose inlined ops cost more is stored instead
    view: Callable | None = None  # (node, views: id -> View) -> the output's View or None
    prologue: bool | None = None  # a matmul may compute it while loading tiles (None: cost == 0)
    same_order: bool = False  # output element i is input element i, flat (pointwise ops, reshape)
    index_bound: Callable | None = None  # (node, i32 input) -> bound on its values, FOLLOW, Replaces or None
    render: Callable | None = None  # (body, node, idx) -> WGSL expression; None: `expr` is used
    reduced_axes: Callable | None = None  # reductions: attrs -> the reduced axes
    split: str | None = None  # reductions split in two passes: "pad" (with zeros) or "divide" (exactly)
    # kernel ops: nodes whose ops share this key, with the same attrs, the later reading only
    # inputs of the earlier, are computed by one kernel (attention's output and the logsumexp its
    # VJP reads; dk and dv)
    sibling: str | None = None
    # reductions whose result is one of the input's elements (max, argmax): the result is compared
    # with, or subtracted from, the input it came from (max's VJP, softmax's x - max), so every
    # reader must see the input's very bits: schedule stores an input with other readers once
    # rather than recomputing it in each kernel, where the driver's rewrites (FMA contraction,
    # reassociation) round it differently
    selects: bool = False
    # kernel ops: inputs (by position) the kernel reads row-major, so that neighbouring invocations
    # read neighbouring elements: the schedule stores a strided view given there first (lstm_seq's
    # W_hh^T: a copy per call, against every step reading it transposed)
    contiguous: tuple[int, ...] = ()

    def __post_init__(self):
        if self.cost is None:
            object.__setattr__(self, "cost", 0 if self.fusion in ("constant", "view", "index") else 1)
        if self.prologue is None:
            object.__setattr__(self, "prologue", self.cost == 0)
        if self.fusion == "pointwise":
            object.__setattr__(self, "same_order", True)

    @property
    def kernel(self) -> str:
        """Kernel family: elementwise, reduce, matmul, attention, recurrent, or leaf (none)."""
        return KERNEL_FAMILY.get(self.fusion, "elementwise")

    @property
    def owns_storage(self) -> bool:
        """Its output always gets storage: the host or its own kernel writes it."""
        return self.fusion in ("leaf", "reduce", "matmul", "attention", "recurrent")


@dataclass(frozen=True)
class Replaces:
    """An index_bound result: the output carries the input's index values on, except `value`,
    which the op replaces by a valid index (ignore_index): the runtime lets `value` through."""

    value: int


def follow(node, x):
    """index_bound of ops that pass index values on unchanged (views, concat, stop_gradient)."""
    return FOLLOW


_OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in _OPS:
        raise ValueError(f"op {op.name!r} registered twice")
    if op.vjp is None and not op.nondiff:
        raise ValueError(f"op {op.name!r} needs a vjp or nondiff=True")
    if op.fusion not in FUSION:
        raise ValueError(f"op {op.name!r}: unknown fusion class {op.fusion!r}; one of {', '.join(FUSION)}")
    _OPS[op.name] = op
    return op


def lookup(name: str) -> OpDef:
    try:
        return _OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; registered ops: {', '.join(sorted(_OPS))}") from None


def all_ops() -> dict[str, OpDef]:
    return dict(_OPS)
