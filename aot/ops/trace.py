"""Tracing: ops called inside a tracing context append nodes to the current graph.

Each node records the user's call site so errors and generated kernels can point at it.
Outside a tracing context no op can be called (there is no eager mode).
"""

from __future__ import annotations

import contextlib
import threading

from ..errors import ShapeError, TraceError, capture_site
from ..ir import Graph, Node, Tensor
from .registry import Bad, lookup

class _PerThread(threading.local):
    """Tracing state is per thread: two threads building at once each trace into their own graph
    (one shared stack sent one thread's ops into the other's graph: KeyError, or a wrong package)."""

    def __init__(self):
        self.stack: list[Graph] = []
        self.sites: list = []  # while appending gradients: the forward node's call site, inherited by backward nodes


_LOCAL = _PerThread()


@contextlib.contextmanager
def tracing(g: Graph):
    _LOCAL.stack.append(g)
    try:
        yield g
    finally:
        _LOCAL.stack.pop()


@contextlib.contextmanager
def at_site(site):
    _LOCAL.sites.append(site)
    try:
        yield
    finally:
        _LOCAL.sites.pop()


def current() -> Graph:
    if not _LOCAL.stack:
        raise TraceError(
            "aot ops can only be called while a Program is being built",
            capture_site(),
            hint="call ops inside the loss/forward functions given to aot.Train / aot.Infer",
        )
    return _LOCAL.stack[-1]


def is_training() -> bool:
    """True while a training entry is traced, False while an infer entry is (modules branch on it
    as PyTorch's do on `self.training`). Outside tracing there is no mode: TraceError."""
    if not _LOCAL.stack:
        raise TraceError(
            "aot.is_training() has no answer outside tracing",
            capture_site(),
            hint="call it inside the model's forward or the loss/forward functions given to aot.Train / aot.Infer",
        )
    return _LOCAL.stack[-1].meta.get("kind") == "train"


def emit(op_name: str, inputs: tuple[Tensor, ...] | list[Tensor], **attrs) -> Tensor:
    """Append one node to the current graph after checking its shape rule."""
    g = current()
    op = lookup(op_name)
    inputs = tuple(inputs)
    site = _LOCAL.sites[-1] if _LOCAL.sites else capture_site()
    try:
        shape, dtype = op.shape(*[(t.shape, t.dtype) for t in inputs], **attrs)
    except Bad as e:
        operands = ", ".join(t.type_str() for t in inputs)
        raise ShapeError(f"{op_name}: {e} (operands: {operands})", site, e.hint) from None
    out = Tensor(shape, dtype)
    node = Node(op_name, inputs, dict(attrs), out, site)
    out.node = node
    g.nodes.append(node)
    return out


def fail(op_name: str, message: str, hint: str | None = None):
    """Raise a ShapeError from a public op function (not a shape rule) at the user's line."""
    raise ShapeError(f"{op_name}: {message}", capture_site(), hint)
