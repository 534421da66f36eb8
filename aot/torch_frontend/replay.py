"""Replay: an exported core-ATen graph evaluated with aot ops, inside the aot trace of an entry point.

Every fx node maps through ops_map.TABLE; the aot nodes it emits carry the user's line from the
node's stack trace, the result is cast to the dtype torch's node has (torch's bools are f32 0/1
masks) and its shape checked against torch's, so a mapping that went wrong stops the build
instead of compiling a wrong graph. Which aot ops each ATen op became is kept in the graph's
meta["torch_ops"] for `python -m aot inspect`.
"""

from __future__ import annotations

import operator

from .. import ops
from ..errors import ShapeError, TraceError
from ..ops.trace import at_site, current
from . import ops_nn, ops_shape, ops_more  # noqa: F401  (register their ops; ops_more wraps some of theirs, so last)
from .export import Captured, torch_site
from .ops_map import NAN, TABLE, NaN, const, is_t
from .ops_nn import Unavailable


def kind_of(val) -> str | None:
    """"float", "int" or "bool" for a torch (fake) tensor's dtype; None for anything else."""
    dtype = getattr(val, "dtype", None)
    if dtype is None or not hasattr(val, "shape"):
        return None
    import torch

    if dtype == torch.bool:
        return "bool"
    if dtype == torch.float32:
        return "float"
    if dtype.is_floating_point or dtype.is_complex:
        return str(dtype)
    return "int"


class Ctx:
    """What a mapping function may ask about the node it maps."""

    def __init__(self, node, name: str, site, training: bool, kinds: dict, env: dict):
        self.node, self.name, self.site, self.training, self._kinds, self._env = node, name, site, training, kinds, env

    def value_of(self, fx_node):
        """The aot value of another node of the graph (one this node reads)."""
        return self._env[fx_node]

    def fail(self, message: str, hint: str | None = None):
        raise TraceError(f"from_torch: {self.name}: {message}", self.site, hint)

    def tkind(self, x) -> str | None:
        return self._kinds.get(id(x))

    def out_dtype(self) -> str:
        k = kind_of(self.node.meta.get("val"))
        return "i32" if k == "int" else "f32"


def _coerce(cx: Ctx, out, val):
    """`out` with torch's dtype for `val` (f32 for floats and bools, i32 for integers), shape checked."""
    if isinstance(out, (tuple, list)):
        vals = val if isinstance(val, (tuple, list)) else [None] * len(out)
        return tuple(_coerce(cx, o, v) for o, v in zip(out, vals))
    k = kind_of(val)
    if k is None or isinstance(out, (Unavailable, NaN)) or out is None:
        return out
    if k not in ("float", "int", "bool"):
        cx.fail(f"makes a {k} tensor; aot computes in float32 and int32",
                "keep the model and its inputs in float32 (module.float())")
    if not is_t(out):
        out = const(out, (), "i32" if k == "int" else "f32")
    shape = tuple(int(d) for d in val.shape)
    if out.shape != shape:
        raise TraceError(
            f"from_torch: {cx.name}: aot's mapping made {out.type_str()} where torch has shape {list(shape)} "
            "(a bug in aot's PyTorch front end: please report it)", cx.site)
    want = "i32" if k == "int" else "f32"
    return out if out.dtype == want else ops.cast(out, want)


def replay(cap: Captured, leaves: dict, training: bool, what: str):
    """Evaluate `cap` with `leaves` (placeholder name -> aot Tensor). Returns (user outputs, buffer
    updates {state_dict name: Tensor}) and logs each ATen op's aot ops into the current graph's meta."""
    import torch

    g = current()
    log = g.meta.setdefault("torch_ops", [])
    env: dict = {}
    outputs = None
    for node in cap.graph.nodes:
        if node.op == "placeholder":
            env[node] = leaves[node.name]
            continue
        if node.op == "output":
            outputs = node.args[0]
            break
        if node.op != "call_function":
            raise TraceError(f"from_torch: {what}: unexpected graph node {node.op} {node.target}", torch_site(node))
        site = torch_site(node)
        name = str(node.target) if node.target is not operator.getitem else "getitem"
        kinds: dict = {}

        def value(a):
            v = env[a]
            if isinstance(v, Unavailable):
                raise TraceError(f"from_torch: {v.what} is not available in aot", site, v.hint)
            k = kind_of(a.meta.get("val"))
            if k is not None and is_t(v):
                kinds[id(v)] = k
            return v

        if node.target is operator.getitem:
            seq, i = node.args
            env[node] = env[seq][i]
            continue
        args = torch.fx.node.map_arg(node.args, value)
        kwargs = torch.fx.node.map_arg(node.kwargs, value)
        fn = TABLE.get(name)
        cx = Ctx(node, name, site, training, kinds, env)
        if name != "aten.where.self" and any(a is NAN for a in list(args) + list(kwargs.values())):
            cx.fail("a NaN constant is supported only as where(isnan(y), nan, z)")
        if fn is None:
            cx.fail("this ATen op has no aot mapping",
                    "docs/API.md 'From PyTorch' lists the ops aot maps; write this part with those ops")
        before = len(g.nodes)
        try:
            with at_site(site):
                out = _coerce(cx, fn(cx, *args, **kwargs), node.meta.get("val"))
        except TraceError as e:
            if str(e).startswith("from_torch:"):
                raise
            # an aot op refused the mapped call: say so at the user's torch line, keeping aot's hint
            lines = str(e).splitlines()
            hint = next((ln.strip()[len("hint: "):] for ln in lines if ln.strip().startswith("hint: ")), None)
            cls = ShapeError if isinstance(e, ShapeError) else TraceError
            raise cls(f"from_torch: {name}: {lines[0]}", site, hint) from None
        env[node] = out
        log.append((name, [n.op for n in g.nodes[before:]], site.short if site else ""))
    user, buffers = [], {}
    for (kind, target), arg in zip(cap.outputs, outputs):
        v = env[arg] if isinstance(arg, torch.fx.Node) else arg
        if kind == "user":
            user.append(v)
        else:
            buffers[target] = v
    return user, buffers
