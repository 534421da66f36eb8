"""Graph -> Graph passes. PIPELINE runs in order; each pass returns a new graph object."""

from __future__ import annotations

from .ir import Graph


def dce(g: Graph) -> Graph:
    """Drop nodes no root depends on. Leaves that declare the interface (inputs, params,
    state) stay, so the runtime's tables do not depend on what the model happens to use."""
    live = {id(t) for t in g.roots()}
    keep = []
    for n in reversed(g.nodes):
        if id(n.out) in live or n.op in ("input", "param", "state"):
            keep.append(n)
            live.update(id(t) for t in n.inputs)
    return _rebuild(g, list(reversed(keep)), lambda t: t)


def cse_consts(g: Graph) -> Graph:
    """Merge identical `const` and `arange` leaves (the tracer emits one per Python number)."""
    canon: dict[tuple, object] = {}
    remap: dict[int, object] = {}
    nodes = []
    for n in g.nodes:
        if remap:
            n.inputs = tuple(remap.get(id(t), t) for t in n.inputs)
        if n.op in ("const", "arange"):
            key = (n.op, tuple(sorted(n.attrs.items())))
            if key in canon:
                remap[id(n.out)] = canon[key]
                continue
            canon[key] = n.out
        nodes.append(n)

    return _rebuild(g, nodes, lambda t: remap.get(id(t), t))


def _rebuild(g: Graph, nodes, f) -> Graph:
    def m(d):
        return {k: f(t) for k, t in d.items()}

    return Graph(g.name, nodes, m(g.outputs), m(g.captures), m(g.updates), m(g.grads), m(g.persist), dict(g.meta))


PIPELINE = [dce, cse_consts]


def run_pipeline(g: Graph, verify: bool = False) -> Graph:
    from .ir import verify as _verify

    for p in PIPELINE:
        g = p(g)
        if verify:
            _verify(g, after=p.__name__)
    return g
