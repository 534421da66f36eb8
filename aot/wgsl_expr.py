"""Rendering tensor values as WGSL expressions inside one kernel.

A kernel computes a stored tensor from its inlined expression tree: nodes the schedule
inlined are computed in place, stored tensors (and views of them) are read from their buffer
at offset + the address of the element. Every read index is derived from an in-range output
index or clamped, so no kernel reads out of bounds whatever the data (indices included).
"""

from __future__ import annotations

from .errors import CodegenError
from .ir import Tensor
from .matmul_codegen import split_index
from .ops.registry import lookup
from .plan import Plan, arena_binding, arena_dtype
from .schedule import Schedule
from .templates import wgsl_f32, wgsl_i32
from .views import contiguous_strides

WGSL_TYPE = {"f32": "f32", "i32": "i32"}
NAN_HELPERS = ("tanh_f32", "max_nan", "min_nan", "gt_nan")  # helpers that call is_nan_f32


class Index:
    """A position in a tensor: per-dim u32 coordinates, a flat row-major index, or both."""

    def __init__(self, shape, coords=None, flat=None):
        self.shape = tuple(shape)
        self.coords = coords
        self.flat = flat

    def get_flat(self, body) -> str:
        if self.flat is None:
            terms = [f"{c} * {st}u" if st != 1 else c for c, st, d in zip(self.coords, contiguous_strides(self.shape), self.shape) if d != 1]
            expr = " + ".join(terms) if terms else "0u"
            # one plain coordinate (size-1 dims added or dropped) is the flat index itself: keeping
            # its name lets a kernel see that it reads its own output at its own element
            self.flat = expr if expr.isidentifier() else body.let(expr, "u32")
        return self.flat

    def get_coords(self, body) -> list[str]:
        if self.coords is None:
            f = self.flat
            out = []
            for d, st in zip(self.shape, contiguous_strides(self.shape)):
                if d == 1:
                    out.append("0u")
                elif st == 1:
                    out.append(body.let(f"{f} % {d}u", "u32") if d != _size(self.shape) else f)
                else:
                    q = f"{f} / {st}u"
                    out.append(body.let(q if st * d == _size(self.shape) else f"({q}) % {d}u", "u32"))
            self.coords = out
        return self.coords


def _size(shape):
    n = 1
    for d in shape:
        n *= d
    return n


class Body:
    """Emits `let` lines for one kernel (or one loop scope) and renders tensor values."""

    def __init__(self, kc: "KernelContext", indent: str, inline: bool = False):
        self.kc = kc
        self.lines: list[str] = []
        self.indent = indent
        self.inline = inline
        self.cache: dict[tuple, str] = {}

    def let(self, expr: str, ty: str) -> str:
        if self.inline:
            return f"({expr})"
        key = ("let", expr)
        if key in self.cache:
            return self.cache[key]
        name = f"v{self.kc.counter}"
        self.kc.counter += 1
        self.lines.append(f"{self.indent}let {name}: {ty} = {expr};")
        self.cache[key] = name
        return name

    def value(self, t: Tensor, idx: Index) -> str:
        kc = self.kc
        if kc.acc_tensor is not None and t is kc.acc_tensor:
            return "acc"
        if id(t) in kc.computed and idx.get_flat(self) == kc.self_flat:
            return kc.computed[id(t)]  # an earlier output of this kernel, at the same element
        if t is not kc.computing and id(t) in kc.s.views:
            base = kc.s.views[id(t)].base
            # a view of a value this kernel has just computed is followed to that value (a
            # reshape of a fused sum, say): its storage is written only at the end of the kernel
            if not (base is not t and id(base) in kc.computed):
                return self.read(t, idx)
        n = t.node
        op = n.op
        a = n.attrs
        ty = WGSL_TYPE[t.dtype]
        if op == "const":
            return wgsl_f32(a["value"]) if t.dtype == "f32" else wgsl_i32(a["value"])
        if op == "arange":
            c = idx.get_coords(self)[0]
            return f"f32({c})" if t.dtype == "f32" else f"i32({c})"
        if op in ("reshape", "stop_gradient") or (op == "cast" and n.inputs[0].dtype == t.dtype):
            src = n.inputs[0]
            sub = Index(src.shape, flat=idx.get_flat(self)) if op == "reshape" else idx
            return self.value(src, sub)
        if op == "broadcast_to":
            src = n.inputs[0]
            if src.size == t.size:  # only size-1 dims added: the same elements in the same order
                return self.value(src, Index(src.shape, flat=idx.get_flat(self)))
            c = idx.get_coords(self)
            lead = t.ndim - src.ndim
            sc = ["0u" if d == 1 else c[lead + i] for i, d in enumerate(src.shape)]
            return self.value(src, Index(src.shape, sc))
        if op == "transpose":
            src = n.inputs[0]
            c = idx.get_coords(self)
            sc = [None] * src.ndim
            for i, p in enumerate(a["perm"]):
                sc[p] = c[i]
            return self.value(src, Index(src.shape, sc))
        if op == "flip":
            src = n.inputs[0]
            c = list(idx.get_coords(self))
            for ax in a["axes"]:
                c[ax] = f"({src.shape[ax] - 1}u - {c[ax]})"
            return self.value(src, Index(src.shape, c))
        if op == "narrow":
            src = n.inputs[0]
            c = list(idx.get_coords(self))
            if a["start"]:
                c[a["axis"]] = f"({c[a['axis']]} + {a['start']}u)"
            return self.value(src, Index(src.shape, c))
        if op == "pad":
            src = n.inputs[0]
            c = list(idx.get_coords(self))
            ax, before, size = a["axis"], a["before"], src.shape[a["axis"]]
            inside = f"({c[ax]} >= {before}u && {c[ax]} < {before + size}u)"
            c[ax] = f"min({c[ax]} - {before}u, {size - 1}u)" if before else f"min({c[ax]}, {size - 1}u)"
            v = self.value(src, Index(src.shape, c))
            zero = "0.0" if t.dtype == "f32" else "0i"
            return self.let(f"select({zero}, {v}, {inside})", ty)
        if op == "concat":
            c = list(idx.get_coords(self))
            ax = a["axis"]
            start, parts = 0, []
            for x in n.inputs:
                parts.append((start, x))
                start += x.shape[ax]
            s0, x0 = parts[-1]
            cc = list(c)
            cc[ax] = f"min({c[ax]} - {s0}u, {x0.shape[ax] - 1}u)" if s0 else c[ax]
            v = self.value(x0, Index(x0.shape, cc))
            for s0, x in reversed(parts[:-1]):
                cc = list(c)
                cc[ax] = f"min({c[ax]} - {s0}u, {x.shape[ax] - 1}u)" if s0 else f"min({c[ax]}, {x.shape[ax] - 1}u)"
                vx = self.value(x, Index(x.shape, cc))
                v = self.let(f"select({v}, {vx}, {c[ax]} < {s0 + x.shape[ax]}u)", ty)
            return v
        if op == "one_hot":
            src = n.inputs[0]
            c = idx.get_coords(self)
            k = self.value(src, Index(src.shape, c[:-1]))
            return self.let(f"select(0.0, 1.0, {k} == i32({c[-1]}))", "f32")
        if op == "gather":
            table, ix = n.inputs
            c = idx.get_coords(self)
            k = self.value(ix, Index(ix.shape, c[: ix.ndim]))
            row = self.let(f"u32(clamp({k}, 0i, {table.shape[0] - 1}i))", "u32")
            return self.value(table, Index(table.shape, [row] + c[ix.ndim :]))
        if op == "take_along_axis":
            x, ix = n.inputs
            c = idx.get_coords(self)
            k = self.value(ix, Index(ix.shape, c))
            cc = list(c)
            cc[a["axis"]] = self.let(f"u32(clamp({k}, 0i, {x.shape[a['axis']] - 1}i))", "u32")
            return self.value(x, Index(x.shape, cc))
        if op == "rand":
            kc.helpers.add("hash_u32")
            seed = self.value(n.inputs[0], Index(()))
            key = self.let(f"hash_u32(bitcast<u32>({seed}) ^ hash_u32({a['salt']}u))", "u32")
            return self.let(f"f32(hash_u32({idx.get_flat(self)} + {key}) >> 8u) * {wgsl_f32(1.0 / 16777216.0)}", "f32")
        if op == "unfold":
            return self._unfold(n, idx)
        if op == "fold":
            return self._fold(n, idx)
        od = lookup(op)
        if od.kernel != "elementwise" or od.expr is None:
            raise CodegenError(f"no elementwise rendering for op {op!r}")
        args = [self.value(x, idx) for x in n.inputs]
        expr = od.expr(a) if callable(od.expr) else od.expr
        for h in ("tanh_f32", "sigmoid_f32", "erf_f32", "max_nan", "min_nan"):
            if h in expr:
                kc.helpers.add(h)
                if h in NAN_HELPERS:
                    kc.helpers.add("is_nan_f32")
        return self.let(expr.format(*args), ty)

    def read(self, t: Tensor, idx: Index) -> str:
        kc = self.kc
        loc, dims = kc.plan.read_loc(kc.s, t)
        kc.use(loc.arena, write=False)
        v = kc.s.views[id(t)]
        kc.reads.append(v.base)
        if v.is_contiguous():
            lin = idx.get_flat(self) if t.size > 1 else "0u"
        else:
            c = idx.get_coords(self)
            terms = [term for ci, axis in zip(c, dims) for term in split_index(ci, axis)]
            lin = " + ".join(terms) if terms else "0u"
        addr = lin if not loc.offset else f"{loc.offset}u" if lin == "0u" else f"{loc.offset}u + {lin}"
        key = ("read", loc.arena, addr)
        if key not in self.cache:
            self.cache[key] = self.let(f"{loc.arena}[{addr}]", WGSL_TYPE[t.dtype])
        return self.cache[key]

    def _unfold(self, n, idx):
        x = n.inputs[0]
        a = n.attrs
        nn_, c, i, j, oh, ow = idx.get_coords(self)
        (sh, sw), (ph, pw) = a["stride"], a["padding"]
        h = self.let(f"i32({oh} * {sh}u + {i}) - {ph}i", "i32")
        w = self.let(f"i32({ow} * {sw}u + {j}) - {pw}i", "i32")
        H, W = x.shape[2], x.shape[3]
        inside = f"({h} >= 0i && {h} < {H}i && {w} >= 0i && {w} < {W}i)"
        hc = self.let(f"u32(clamp({h}, 0i, {H - 1}i))", "u32")
        wc = self.let(f"u32(clamp({w}, 0i, {W - 1}i))", "u32")
        v = self.value(x, Index(x.shape, [nn_, c, hc, wc]))
        return self.let(f"select({wgsl_f32(a['value'])}, {v}, {inside})", "f32")

    def _fold(self, n, idx):
        cols = n.inputs[0]
        a = n.attrs
        nn_, c, h, w = idx.get_coords(self)
        _, _, kh, kw, OH, OW = cols.shape
        (sh, sw), (ph, pw) = a["stride"], a["padding"]
        terms = []
        for i in range(kh):
            for j in range(kw):
                hn = self.let(f"i32({h}) + {ph - i}i", "i32")
                wn = self.let(f"i32({w}) + {pw - j}i", "i32")
                ok = f"({hn} >= 0i && {wn} >= 0i && {hn} % {sh}i == 0i && {wn} % {sw}i == 0i && {hn} / {sh}i < {OH}i && {wn} / {sw}i < {OW}i)"
                ohc = self.let(f"u32(clamp({hn} / {sh}i, 0i, {OH - 1}i))", "u32")
                owc = self.let(f"u32(clamp({wn} / {sw}i, 0i, {OW - 1}i))", "u32")
                v = self.value(cols, Index(cols.shape, [nn_, c, f"{i}u", f"{j}u", ohc, owc]))
                terms.append(self.let(f"select(0.0, {v}, {ok})", "f32"))
        return self.let(" + ".join(terms), "f32")


class KernelContext:
    def __init__(self, s: Schedule, plan: Plan, computing: Tensor | None):
        self.s = s
        self.plan = plan
        self.computing = computing
        self.acc_tensor: Tensor | None = None
        self.computed: dict[int, str] = {}  # outputs already computed in this kernel, by value
        self.self_flat = "i"  # the kernel's own flat index: reads there may use `computed`
        self.counter = 0
        self.helpers: set[str] = set()
        self.access: dict[str, str] = {}
        self.reads: list[Tensor] = []  # storage owners read from memory, for the hazard check

    def use(self, arena: str, write: bool):
        # scratch buffers are read_write in every kernel that touches them, so that kernels which
        # only read intermediates can share a bind group with their neighbours that write them
        if write or arena.startswith("work"):
            self.access[arena] = "read_write"
        else:
            self.access.setdefault(arena, "read")

    def bindings(self) -> list[tuple[str, str]]:
        return [(a, self.access[a]) for a in sorted(self.access, key=arena_binding)]

    def binding_text(self) -> str:
        # each buffer has one binding number in every kernel, so neighbouring kernels can share a bind group
        return "\n".join(
            f"@group(0) @binding({arena_binding(a)}) var<storage, {acc}> {a}: array<{arena_dtype(a)}>;"
            for a, acc in self.bindings()
        )
