"""Program -> graphs: trace the model and each entry point, then append gradients and the update.

Produces one Graph per entry point and symbolic-dim variant (`train`, `predict[B=1]`, ...)
and the parameter table they share. Every graph gets its own fresh model tree (the
factory is called once per trace); parameter names and shapes must agree across them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from . import optim as _optim
from . import optim_groups as _optim_groups
from .entries import TrainLayout, layout_order, layouts, trained_by
from .errors import InvalidNameError, ShapeError, TraceError
from .grad import append_grads
from .ir import Graph, Tensor
from .module import Module
from .program import Program, check_names, train_entries
from .ops import broadcast_to
from .ops.trace import at_site, emit, tracing


@dataclass(frozen=True)
class ParamEntry:
    name: str
    shape: tuple[int, ...]
    init: tuple  # spec tuple evaluated by runtime/rng.py
    decay: bool
    offset: int  # element offset in the flat parameter vector (layout order)
    # PyTorch's name for it, the aot.nn module kind that declared it ("" for a bare param) and
    # whether aot stores it transposed (Linear's W is weight.T): the package's state_dict tables
    torch: tuple[str, str, bool] = ("", "", False)
    trainable: bool = True  # False: frozen (param(trainable=False) or Module.freeze())

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class BufferEntry:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "f32" (in the buffers arena) or "i32" (buffers_i32)
    init: tuple  # spec tuple evaluated by runtime/rng.py
    offset: int  # element offset in its arena
    torch: tuple[str, str] = ("", "")  # PyTorch's name for it and the aot.nn module kind ("" for a bare buffer)

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class Traced:
    program: Program
    params: list[ParamEntry]  # declaration order
    graphs: dict[str, Graph]  # "train", "predict" or "predict[B=1]" ...
    variants: dict[str, dict]  # entry point -> {graph key: {dim: size}}
    buffers: list[BufferEntry] = field(default_factory=list)  # declaration order
    # training entry ("train" or "train_<name>") -> the range it updates (entries.py)
    trains: dict[str, TrainLayout] = field(default_factory=dict)


def _variants(program: Program, inputs) -> list[dict[str, int]]:
    used = sorted({d for spec in inputs.values() for d in spec.dims if isinstance(d, str)})
    return [dict(zip(used, combo)) for combo in itertools.product(*(program.dims[d] for d in used))]


def _fn_site(fn):
    from .errors import Site

    code = getattr(fn, "__code__", None)
    return Site(code.co_filename, code.co_firstlineno, code.co_name) if code else None


def _key(entry: str, sizes: dict[str, int]) -> str:
    return entry if not sizes else entry + "[" + ",".join(f"{k}={v}" for k, v in sizes.items()) + "]"


def _trace_model(program: Program, g: Graph):
    model = program.model()
    if not isinstance(model, Module):
        raise TraceError(f"Program {program.name!r}: model= must return an aot.Module, got {type(model).__name__}")
    named = model.named_params()
    buffers = model.named_buffers()
    seen, names = {}, set()
    for what, table in (("parameter", named), ("buffer", buffers)):
        for name, info in table:
            if id(info.tensor) in seen:
                raise TraceError(f"{what} {name!r} is also reachable as {seen[id(info.tensor)]!r}", info.site)
            if name in names:
                raise InvalidNameError(f"two {what}s are named {name!r}", info.site, hint="rename a module attribute or dict key")
            try:  # checkpoints store each parameter as a zip member named after it
                name.encode("utf-8")
            except UnicodeError:
                raise InvalidNameError(f"{what} name {name!r} cannot be written as UTF-8", info.site) from None
            if "\x00" in name:
                raise InvalidNameError(f"{what} name {name!r} contains a NUL character", info.site)
            seen[id(info.tensor)] = name
            names.add(name)
            info.tensor.node.attrs["name"] = name
    for n in g.nodes:
        if n.op in ("param", "buffer") and not n.attrs["name"]:
            what = "parameter" if n.op == "param" else "buffer"
            raise TraceError(f"a {what} was declared on a module that is not an attribute of the model", n.site)
    g.meta["buffers"] = buffers
    return model, named


def _layout(named, chosen: dict[str, set[str]], trains: dict) -> tuple[list[ParamEntry], dict[str, TrainLayout]]:
    """Grouped by the training entries that train each param (entries.layout_order: with one entry,
    trainable before frozen), then by the parameter groups of the first such entry's optimizer,
    decayed params first within a group (so a group's weight decay covers one range:
    optim_groups.layout_keys), declaration order within that."""
    decay = {n: info.decay for n, info in named}
    inner = {}
    for entry, names in chosen.items():
        members = [n for n, _ in named if n in names and n not in inner]
        opt = trains[entry].optimizer
        keys = _optim_groups.layout_keys(opt, [n for n, _ in named if n in names], [decay[n] for n, _ in named if n in names])
        by_name = dict(zip([n for n, _ in named if n in names], keys))
        inner.update({n: by_name[n] for n in members})
    order = layout_order(named, chosen, inner)
    offsets, off = {}, 0
    for name, info in order:
        offsets[name] = off
        off += info.tensor.size
    table = [
        ParamEntry(name, info.tensor.shape, info.init.spec(info.tensor.shape), info.decay, offsets[name],
                   _torch_entry(name, info), info.trainable)
        for name, info in named
    ]
    sizes = {name: info.tensor.size for name, info in named}
    return table, layouts([n for n, _ in order], sizes, chosen)


def _torch_entry(name: str, info) -> tuple[str, str, bool]:
    """(PyTorch name, module kind, transposed): an aot.nn module's param takes the name torch.nn's
    module of that kind gives it (`l1.W` -> `l1.weight`); a bare param keeps its own."""
    if info.torch is None:
        return (name, "", False)
    kind, leaf, transpose = info.torch
    prefix = name.rpartition(".")[0]
    return ((prefix + "." if prefix else "") + leaf, kind, transpose)


def _buffer_table(named) -> list[BufferEntry]:
    """f32 buffers packed in declaration order in one arena, i32 buffers in another."""
    offsets = {"f32": 0, "i32": 0}
    out = []
    for name, info in named:
        t = info.tensor
        torch = (name, "")
        if info.torch is not None:
            prefix = name.rpartition(".")[0]
            torch = ((prefix + "." if prefix else "") + info.torch[1], info.torch[0])
        out.append(BufferEntry(name, t.shape, t.dtype, info.init.spec(t.shape), offsets[t.dtype], torch))
        offsets[t.dtype] += t.size
    return out


def _trace_entry(program: Program, key: str, kind: str, spec, sizes):
    g = Graph(f"{program.name}.{key}", meta={"kind": kind, "sizes": sizes})
    with tracing(g):
        model, named = _trace_model(program, g)
        with at_site(None):
            inputs = {
                name: emit("input", (), name=name, shape=ispec.resolve(sizes), dtype=ispec.dtype)
                for name, ispec in spec.inputs.items()
            }
        out = spec.fn(model, **inputs)
    return g, named, out


def trace_program(program: Program) -> Traced:
    check_names(program)
    graphs: dict[str, Graph] = {}
    variants: dict[str, dict] = {}
    params: list[ParamEntry] | None = None
    trains = train_entries(program)
    ranges: dict[str, TrainLayout] = {}

    buffers: list[BufferEntry] | None = None

    def check_params(named, key, g):
        nonlocal params, ranges, buffers
        if params is None:
            params, ranges = _layout(named, trained_by(trains, named), trains)
        elif [(n, info.tensor.shape, info.trainable) for n, info in named] != [(p.name, p.shape, p.trainable) for p in params]:
            raise TraceError(
                f"{program.name}.{key}: the model factory built different parameters (names, shapes or frozen "
                "flags) than for the first entry point"
            )
        btable = _buffer_table(g.meta.pop("buffers"))
        if buffers is None:
            buffers = btable
        elif [(b.name, b.shape, b.dtype) for b in btable] != [(b.name, b.shape, b.dtype) for b in buffers]:
            raise TraceError(f"{program.name}.{key}: the model factory built different buffers than for the first entry point")
        return {n: info.tensor for n, info in named}

    for entry, tr in trains.items():
        if tr.optimizer is not None:
            _optim.check(tr.optimizer)
        variants[entry] = {}
        for sizes in _variants(program, tr.inputs):
            key = _key(entry, sizes)
            g, named, loss = _trace_entry(program, key, "train", tr, sizes)
            _check_loss(program, entry, tr, loss)
            tensors = check_params(named, key, g)
            g.outputs["loss"] = loss
            _append_training(g, tr, params, ranges[entry], tensors, loss)
            graphs[key] = g
            variants[entry][key] = sizes
    for entry, inf in program.infer.items():
        variants[entry] = {}
        for sizes in _variants(program, inf.inputs):
            key = _key(entry, sizes)
            g, named, out = _trace_entry(program, key, "infer", inf, sizes)
            if not isinstance(out, Tensor):
                raise TraceError(f"{program.name}.{entry}: the forward function must return a Tensor, got {type(out).__name__}")
            check_params(named, key, g)
            g.outputs["out"] = out
            graphs[key] = g
            variants[entry][key] = sizes
    return Traced(program, params or [], graphs, variants, buffers or [], ranges)


def _check_loss(program: Program, entry: str, tr, loss) -> None:
    if not isinstance(loss, Tensor) or loss.shape != () or loss.dtype != "f32":
        got = loss.type_str() if isinstance(loss, Tensor) else type(loss).__name__
        site = loss.node.site if isinstance(loss, Tensor) else None
        where = program.name if entry == "train" else f"{program.name}.{entry}"
        raise ShapeError(
            f"{where}: the loss function must return a 0-d f32 Tensor, got {got}",
            site or _fn_site(tr.fn),
            hint="reduce it, e.g. ops.mean(...)",
        )


def _append_training(g: Graph, tr, params: list[ParamEntry], lay: TrainLayout, tensors: dict, loss: Tensor) -> None:
    """Gradients of the entry's parameters and its update, over its range [lay.start, lay.end) of
    the flat vector. Parameters outside its set get no gradient at all (their backward chains are
    not traced); those inside the range but not trained by it (entries.py) a zero."""
    order = [p for p in sorted(params, key=lambda p: p.offset) if lay.start <= p.offset < lay.end]
    members = set(lay.members)
    trained = [p for p in order if p.name in members]
    reached_m: list[bool] = []
    grads_m = append_grads(g, loss, [tensors[p.name] for p in trained], reached_m)
    by_name = {p.name: (gt, r) for p, gt, r in zip(trained, grads_m, reached_m)}
    g.meta["train_range"] = (lay.start, lay.end, lay.offset)
    if not order:  # no parameters: a loss (and captures) alone, no gradient vector, no update
        g.grads = {}
        return
    with tracing(g), at_site(None):
        grads = [by_name[p.name][0] if p.name in by_name else _zeros(p.shape) for p in order]
        g.persist["grads"] = _optim.flat(grads)
    reached = [by_name[p.name][1] if p.name in by_name else False for p in order]
    g.grads = {p.name: by_name[p.name][0] for p in trained}
    # where the entry's slices live (plan.py): its params, its gradient vector and its state
    if tr.optimizer is not None:
        _optim.append_update(g, tr.optimizer, [tensors[p.name] for p in order], g.persist["grads"],
                             [p.decay for p in order], reached, [p.name for p in order])


def _zeros(shape) -> Tensor:
    return broadcast_to(emit("const", (), value=0.0, dtype="f32"), tuple(shape))
