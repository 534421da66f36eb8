"""Reverse-mode autodiff appended into the same graph.

Walks the nodes that lie between the parameters and the loss in reverse order, calls each
op's VJP rule (or a composite's own rule, from ops.custom_vjp, which skips its insides) and
sums cotangents of tensors with several uses. Backward nodes carry the
call site of the forward node they differentiate. A parameter that cannot reach the loss
gets an explicit zero gradient.

Three kinds of contributions are summed in one op instead of a chain of adds (sum_parts):
- a weight shared by several matmuls (an RNN's W_hh, used at every step) gets X_i^T @ Y_i from
  each; their sum is one matmul concat(X)^T @ concat(Y) over the stacked rows, one kernel
  instead of one per use plus a buffer each for the pieces;
- the reductions that are the cotangents of several broadcasts of one tensor (a bias added at
  every step) are one reduction over the stacked cotangents;
- pads along one axis over disjoint ranges (the cotangents of narrows: an RNN's time steps
  of the input projection, the pieces of a split) tile their tensor: a concat of the pieces,
  which the schedule assembles in place.
"""

from __future__ import annotations

from .ir import Graph, Tensor
from .ops import add, broadcast_to, concat, matmul, reshape, transpose
from .ops import sum as ops_sum
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
    ct: dict[int, list[Tensor]] = {}  # the contributions, summed when the tensor's producer is reached
    site_of: dict[int, object] = {}
    kind_of: dict[int, tuple] = {}
    with tracing(g), at_site(None):
        ct[id(loss)] = [emit("const", (), value=1.0, dtype="f32")]
        forward = list(g.nodes)
        for n in reversed(forward):
            if id(n.out) not in ct or id(n.out) not in needs:
                continue
            c = sum_parts(ct[id(n.out)], kind_of, site_of)
            ct[id(n.out)] = [c]
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
                    parts = ct.setdefault(id(t), [])
                    kind = _kind(n, t, c_in)
                    if parts and kind is None and id(parts[-1]) not in kind_of:
                        parts[-1] = add(parts[-1], c_in)  # added at once, as they come
                    else:
                        parts.append(c_in)  # summed with its kind by sum_parts
                        site_of[id(c_in)] = n.site  # the sum's ops keep their contributions' sites
                        if kind is not None:
                            kind_of[id(c_in)] = kind
        out = []
        for w in wrt:
            if reached is not None:
                reached.append(id(w) in ct)
            if id(w) in ct:
                ct[id(w)] = [sum_parts(ct[id(w)], kind_of, site_of)]  # summed once, however often w is listed
                out.append(ct[id(w)][0])
            else:
                out.append(broadcast_to(emit("const", (), value=0.0, dtype="f32"), w.shape))
    return out


def _kind(n, t: Tensor, c: Tensor):
    """How sum_parts may sum contribution c to t from the VJP of node n: ("mm",) for the weight
    gradient X^T @ Y of a matmul reading t as its [K, N] weight, ("pad", axis) for the cotangent
    of a narrow of t, None for anything else (added as it comes)."""
    if n.op == "matmul" and n.inputs[1] is t and t.ndim == 2 and c.node.op == "matmul":
        xt, y = c.node.inputs
        if xt.ndim == 2 and y.ndim == 2 and xt.node.op == "transpose" and xt.node.attrs["perm"] == (1, 0):
            return ("mm",)
    if n.op == "narrow" and c.node.op == "pad":
        return ("pad", c.node.attrs["axis"])
    if n.op == "broadcast_to":
        s = c.node.inputs[0] if c.node.op == "reshape" else c
        if s.node.op == "sum" and 0 in s.node.attrs["axes"]:
            return ("bsum", s.node.attrs["axes"], s.node.attrs["keepdims"], s.node.inputs[0].shape)
    return None


def sum_parts(parts: list[Tensor], kind_of: dict, site_of: dict) -> Tensor:
    """The sum of a tensor's cotangent contributions (see the module docstring), added in the
    order they came; a group summed in one op takes its first member's place."""
    if len(parts) == 1:
        return parts[0]
    groups: dict[tuple, list[Tensor]] = {}
    for c in parts:
        groups.setdefault(kind_of.get(id(c)) or ("one", id(c)), []).append(c)
    terms = []
    for key, group in groups.items():  # first-seen order
        with at_site(site_of.get(id(group[-1]))):
            if key[0] == "mm" and len(group) > 1:
                # the uses in forward order (they arrive in reverse): an RNN's steps then read
                # its stacked states and gradients in place (schedule.py: _placed_concat_view)
                xs = [c.node.inputs[0].node.inputs[0] for c in reversed(group)]
                ys = [c.node.inputs[1] for c in reversed(group)]
                terms.append(matmul(transpose(concat(xs, 0), (1, 0)), concat(ys, 0)))
            elif key[0] == "bsum" and len(group) > 1:
                # a tensor broadcast in several places (a GRU's b_hh at every step): one reduction
                # over the stacked cotangents, in forward order like the matmul group
                cs = [(c.node.inputs[0] if c.node.op == "reshape" else c).node.inputs[0] for c in reversed(group)]
                total = ops_sum(concat(cs, 0), axis=key[1], keepdims=key[2])
                terms.append(reshape(total, group[0].shape))
            elif key[0] == "pad":
                terms += _tile(key[1], group)
            else:
                terms += group
        site_of[id(terms[-1])] = site_of.get(id(group[-1]))
    total = terms[0]
    for c in terms[1:]:
        with at_site(site_of.get(id(c))):
            total = add(total, c)
    return total


def _tile(axis: int, pads: list[Tensor]) -> list[Tensor]:
    """Pads of one axis: those over disjoint ranges as one concat (zeros in the gaps), the
    overlapping ones as they are."""
    spans = sorted(pads, key=lambda p: p.node.attrs["before"])
    tiled, left, at = [], [], 0
    for p in spans:
        if p.node.attrs["before"] < at:
            left.append(p)
        else:
            tiled.append(p)
            at = p.node.attrs["before"] + p.node.inputs[0].shape[axis]
    if len(tiled) < 2:
        return pads
    shape, pieces, at = tiled[0].shape, [], 0

    def zeros(n):
        return broadcast_to(emit("const", (), value=0.0, dtype="f32"), shape[:axis] + (n,) + shape[axis + 1 :])

    for p in tiled:
        if p.node.attrs["before"] > at:
            pieces.append(zeros(p.node.attrs["before"] - at))
        pieces.append(p.node.inputs[0])
        at = p.node.attrs["before"] + p.node.inputs[0].shape[axis]
    if at < shape[axis]:
        pieces.append(zeros(shape[axis] - at))
    return [concat(pieces, axis)] + left
