"""The IR: tensors are opaque handles, nodes are typed op records, a graph is a flat node list.

Invariants: `Graph.nodes` is in topological order; every tensor has exactly one producing
node (leaves are `input`, `param`, `state`, `buffer`, `const`, `arange` nodes); shapes are static
tuples of ints; dtypes are "f32" or "i32". Names of intermediates (t0, t1, ...) are
assigned only when printing, from position, so they never depend on creation order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import Site

DTYPES = ("f32", "i32")
LEAF_OPS = ("input", "param", "state", "buffer", "const", "arange")


class Tensor:
    """A traced value: shape, dtype and the node that produces it. Operators build ops."""

    __slots__ = ("shape", "dtype", "node", "__weakref__")
    __array_priority__ = 1000  # make numpy scalars defer to our operators

    def __init__(self, shape: tuple[int, ...], dtype: str):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.node: Node | None = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def type_str(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"

    def __repr__(self) -> str:
        op = self.node.op if self.node is not None else "?"
        return f"<Tensor {self.type_str()} from {op}>"

    def __bool__(self):
        raise TypeError(
            "a traced aot Tensor has no truth value at trace time; use ops.where for data-dependent choices"
        )

    # the arithmetic operators (__add__, __matmul__, ...) are installed by aot.ops (API.md §2)

    def __getitem__(self, key):
        raise TypeError("indexing a traced Tensor is not supported; use ops.narrow, ops.take_along_axis or ops.embedding")

    __hash__ = object.__hash__


@dataclass(eq=False)
class Node:
    op: str
    inputs: tuple[Tensor, ...]
    attrs: dict[str, Any]
    out: Tensor
    site: Site | None = None


@dataclass(eq=False)
class Graph:
    """One entry point's computation. `outputs` are read back by the runtime; `updates` are
    writebacks (leaf name -> the tensor holding its new value at the end of the call)."""

    name: str
    nodes: list[Node] = field(default_factory=list)
    outputs: dict[str, Tensor] = field(default_factory=dict)
    captures: dict[str, Tensor] = field(default_factory=dict)
    updates: dict[str, Tensor] = field(default_factory=dict)
    grads: dict[str, Tensor] = field(default_factory=dict)
    # tensors that must land in a persistent buffer (e.g. "grads": the flat gradient vector)
    persist: dict[str, Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def leaves(self, op: str) -> dict[str, Tensor]:
        return {n.attrs["name"]: n.out for n in self.nodes if n.op == op}

    @property
    def inputs(self) -> dict[str, Tensor]:
        return self.leaves("input")

    @property
    def params(self) -> dict[str, Tensor]:
        return self.leaves("param")

    @property
    def state(self) -> dict[str, Tensor]:
        return self.leaves("state")

    @property
    def buffers(self) -> dict[str, Tensor]:
        return self.leaves("buffer")

    def roots(self) -> list[Tensor]:
        """Tensors the graph must compute: outputs, captures, grads and writebacks."""
        seen: dict[int, Tensor] = {}
        for group in (self.outputs, self.captures, self.grads, self.updates, self.persist):
            for t in group.values():
                seen.setdefault(id(t), t)
        return list(seen.values())

    def users(self) -> dict[int, list[Node]]:
        out: dict[int, list[Node]] = {id(n.out): [] for n in self.nodes}
        for n in self.nodes:
            for t in n.inputs:
                out.setdefault(id(t), []).append(n)
        return out


def _fmt_attr(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (tuple, list)):
        return "(" + ",".join(_fmt_attr(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    return str(v)


def tensor_names(g: Graph) -> dict[int, str]:
    """Printable names: leaves by their declared name, everything else t0, t1, ... by position."""
    names: dict[int, str] = {}
    k = 0
    for n in g.nodes:
        if n.op in ("input", "param", "state", "buffer"):
            names[id(n.out)] = n.attrs["name"]
        else:
            names[id(n.out)] = f"t{k}"
            k += 1
    return names


def format_node(n: Node, names: dict[int, str]) -> str:
    # a leaf's name, shape and dtype are already on the binder
    attrs = {k: v for k, v in n.attrs.items() if not (n.op in ("input", "param", "state", "buffer") and k in ("name", "shape", "dtype"))}
    a = "[" + ",".join(f"{k}={_fmt_attr(attrs[k])}" for k in sorted(attrs)) + "]" if attrs else ""
    args = ", ".join(names.get(id(t), "?") for t in n.inputs)
    text = f"{names[id(n.out)]}: {n.out.type_str()} = {n.op}{a}{(' ' + args) if args else ''}"
    if n.site is not None:
        text = f"{text:<60} # {n.site.short}"
    return text


def format_graph(g: Graph) -> str:
    """Readable IR text: one node per line, type on the binder, attrs sorted, call site trailing."""
    names = tensor_names(g)
    lines = [f"graph {g.name}:"]
    lines += ["  " + format_node(n, names) for n in g.nodes]
    groups = (("outputs", g.outputs), ("captures", g.captures), ("grads", g.grads), ("persist", g.persist), ("updates", g.updates))
    for title, group in groups:
        if group:
            lines.append(f"  {title}: " + ", ".join(f"{k}={names.get(id(t), '?')}" for k, t in group.items()))
    return "\n".join(lines) + "\n"
