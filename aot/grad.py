"""Reverse-mode autodiff appended into the same graph.

Walks the nodes that lie between the parameters and the loss in reverse order, calls each
op's VJP rule (or a composite's own rule, from ops.custom_vjp, which skips its insides) and
sums cotangents of tensors with several uses. Backward nodes carry the
call site of the forward node they differentiate. A parameter that cannot reach the loss
gets an explicit zero gradient.
"""

from __future__ import annotations

from .ir import Graph, Tensor
from .ops import add, broadcast_to
from .ops.registry import lookup
from .ops.trace import at_site, emit, tracing


def append_grads(g: Graph, loss: Tensor, wrt: list[Tensor], reached: list[bool] | None = None) -> list[Tensor]:
    """Append d(loss)/d(w) for each w in `wrt` to `g`; returns the gradient tensors in order.
    `reached`, if given, is filled with whether the loss depends on each w (torch's grad is None
    where it does not)."""
    custom = g.meta.get("custom_vjp", {})
    needs: set[int] = {id(t) for t in wrt}
    for n in g.nodes:
        if not lookup(n.op).nondiff and any(id(t) in needs for t in n.inputs):
            needs.add(id(n.out))
    ct: dict[int, Tensor] = {}
    with tracing(g), at_site(None):
        ct[id(loss)] = emit("const", (), value=1.0, dtype="f32")
        forward = list(g.nodes)
        for n in reversed(forward):
            c = ct.get(id(n.out))
            if c is None or id(n.out) not in needs:
                continue
            op = lookup(n.op)
            if id(n.out) in custom:
                inputs, rule = custom[id(n.out)]
            elif op.nondiff:
                continue
            else:
                inputs, rule = n.inputs, lambda ct, out, ins, n=n, op=op: op.vjp(ct, n)
            with at_site(n.site):
                cts = rule(c, n.out, inputs)
                for t, c_in in zip(inputs, cts):
                    if c_in is None or id(t) not in needs or t.dtype != "f32":
                        continue
                    if c_in.shape != t.shape:
                        raise AssertionError(f"vjp of {n.op} gave {c_in.type_str()} for {t.type_str()}")
                    ct[id(t)] = add(ct[id(t)], c_in) if id(t) in ct else c_in
        out = []
        for w in wrt:
            if reached is not None:
                reached.append(id(w) in ct)
            if id(w) in ct:
                out.append(ct[id(w)])
            else:
                out.append(broadcast_to(emit("const", (), value=0.0, dtype="f32"), w.shape))
    return out
