"""(Schedule, Plan) -> one WGSL compute kernel per scheduled kernel.

Each kernel computes one owned tensor. Its value is rendered as an expression tree: nodes
the schedule inlined are computed in place, stored tensors are read from their buffer at
offset + sum(coord * stride). Every read index is derived from an in-range output index or
clamped, so no kernel reads or writes out of bounds whatever the data (indices included).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import CodegenError
from .ir import Tensor, tensor_names
from .matmul_codegen import MatmulSpec, Operand, render_matmul, split_index
from .ops.registry import lookup
from .plan import Plan
from .schedule import Kernel, Schedule, contiguous_strides, merge_subdims
from .templates import render, wgsl_f32, wgsl_i32

WG = 256
MAX_GROUPS = 65535
ARENA_TYPES = {
    "params": "f32",
    "grads": "f32",
    "state": "f32",
    "inputs": "f32",
    "inputs_i32": "i32",
    "work": "f32",
    "work_i32": "i32",
}
WGSL_TYPE = {"f32": "f32", "i32": "i32"}


@dataclass
class KernelCode:
    name: str
    wgsl: str
    bindings: list[tuple[str, str]]  # (arena, "read" | "read_write"), binding i = position i
    grid: tuple[int, int, int]
    ops: str  # the ops it computes, for comments
    site: str  # user call site of the kernel's main node


class Index:
    """A position in a tensor: per-dim u32 coordinates, a flat row-major index, or both."""

    def __init__(self, shape, coords=None, flat=None):
        self.shape = tuple(shape)
        self.coords = coords
        self.flat = flat

    def get_flat(self, body) -> str:
        if self.flat is None:
            terms = [f"{c} * {st}u" if st != 1 else c for c, st, d in zip(self.coords, contiguous_strides(self.shape), self.shape) if d != 1]
            self.flat = body.let(" + ".join(terms) if terms else "0u", "u32")
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
        if id(t) in kc.computed and idx.flat == kc.self_flat:
            return kc.computed[id(t)]  # an earlier output of this kernel, at the same element
        if t is not kc.computing and id(t) in kc.s.views:
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
        for h in ("tanh_f32", "sigmoid_f32", "erf_f32"):
            if h in expr:
                kc.helpers.add(h)
        return self.let(expr.format(*args), ty)

    def read(self, t: Tensor, idx: Index) -> str:
        kc = self.kc
        loc, dims = kc.plan.read_loc(kc.s, t)
        kc.use(loc.arena, write=False)
        v = kc.s.views[id(t)]
        if v.is_contiguous():
            lin = idx.get_flat(self) if t.size > 1 else "0u"
        else:
            c = idx.get_coords(self)
            terms = [term for ci, axis in zip(c, dims) for term in split_index(ci, axis)]
            lin = " + ".join(terms) if terms else "0u"
        addr = f"{loc.offset}u + {lin}" if loc.offset else lin
        key = ("read", loc.arena, addr)
        if key not in self.cache:
            self.cache[key] = self.let(f"{loc.arena}[{addr}]", WGSL_TYPE[t.dtype])
        return self.cache[key]

    def _unfold(self, n, idx):
        x = n.inputs[0]
        a = n.attrs
        nn_, c, i, j, oh, ow = idx.get_coords(self)
        (kh, kw), (sh, sw), (ph, pw) = a["k"], a["stride"], a["padding"]
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

    def use(self, arena: str, write: bool):
        if write:
            self.access[arena] = "read_write"
        else:
            self.access.setdefault(arena, "read")

    def bindings(self) -> list[tuple[str, str]]:
        return [(a, self.access[a]) for a in ARENA_TYPES if a in self.access]

    def binding_text(self) -> str:
        lines = []
        for i, (a, acc) in enumerate(self.bindings()):
            lines.append(f"@group(0) @binding({i}) var<storage, {acc}> {a}: array<{ARENA_TYPES[a]}>;")
        return "\n".join(lines)


def _grid(n_groups: int) -> tuple[int, int, int]:
    if n_groups <= MAX_GROUPS:
        return (max(n_groups, 1), 1, 1)
    y = -(-n_groups // MAX_GROUPS)
    return (-(-n_groups // y), y, 1)


def _fused_ops(k: Kernel, s: Schedule) -> list[str]:
    """Names of the ops a kernel computes (its own node plus everything inlined into it), in graph order."""
    seen, order = set(), []
    stack = list(k.outs)
    outs = {id(t) for t in k.outs}
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if id(t) not in outs and id(t) in s.views and not (k.mm is not None and t is k.mm):
            continue
        if t.node.op in ("const", "arange"):
            continue
        order.append(t.node)
        stack.extend(t.node.inputs)
    pos = {id(n): i for i, n in enumerate(s.graph.nodes)}
    return [n.op for n in sorted(order, key=lambda n: pos[id(n)]) if n.op not in ("reshape", "broadcast_to")]


def kernel_name(i: int, k: Kernel, s: Schedule) -> str:
    ops = _fused_ops(k, s)
    if k.kind == "matmul":
        tail = [o for o in ops if o != "matmul"]
        label = "matmul" + ("_" + "_".join(dict.fromkeys(tail)) if tail else "")
    elif len(ops) == 1:
        label = ops[0]
    else:
        label = "fused_" + "_".join(list(dict.fromkeys(ops))[:3])
    return f"k{i:03d}_{label}"


def generate(s: Schedule, plan: Plan, prefix_index: int = 0) -> list[KernelCode]:
    out = []
    names = tensor_names(s.graph)
    for i, k in enumerate(s.kernels):
        name = kernel_name(prefix_index + i, k, s)
        try:
            out.append(_kernel(name, k, s, plan, names))
        except CodegenError as e:
            site = k.node.site.short if k.node.site else "?"
            raise CodegenError(f"{e}\n  while generating kernel {name} for {names[id(k.out)]} ({site})") from None
    return out


def _header(name: str, k: Kernel, s: Schedule, names) -> tuple[list[str], str, str]:
    ops = _fused_ops(k, s)
    site = k.node.site.short if k.node.site else "optimizer" if s.graph.meta.get("kind") == "train" else "-"
    ins = sorted({names.get(id(r), "params") for r in k.reads})
    lines = [
        f"// {name}: {' -> '.join(ops) if ops else k.node.op}",
        f"// writes {', '.join(names[id(t)] for t in k.outs)}: {k.out.type_str()}   reads: {', '.join(ins) if ins else '-'}",
        f"// from {site}",
    ]
    return lines, " ".join(ops), site


def _kernel(name, k: Kernel, s: Schedule, plan: Plan, names) -> KernelCode:
    header, ops, site = _header(name, k, s, names)
    out_loc = plan.loc[id(k.out)]
    if k.kind == "elementwise":
        kc = KernelContext(s, plan, None)
        body = Body(kc, "    ")
        n = k.out.size
        stores = []
        for t in k.outs:
            kc.computing = t
            val = body.value(t, Index(t.shape, flat="i"))
            kc.computed[id(t)] = val
            stores.append(_store(kc, plan, t, val, "i"))
        groups = -(-n // WG)
        grid = _grid(groups)
        wgsl = render(
            "wgsl/elementwise.wgsl.j2",
            header=header, bindings=kc.binding_text(), helpers=sorted(kc.helpers), wg=WG,
            n=n, row=grid[0] * WG, lines=body.lines, stores=stores,
        )
        return KernelCode(name, wgsl, kc.bindings(), grid, ops, site)
    if k.kind == "reduce":
        return _reduce(name, header, k, s, plan, ops, site)
    return _matmul(name, header, k, s, plan, ops, site)


def _reduce(name, header, k: Kernel, s: Schedule, plan: Plan, ops, site) -> KernelCode:
    members = k.group + [k]
    n_out, n_red = k.reduce_space()
    kc = KernelContext(s, plan, None)
    outer = Body(kc, "    ")
    inner = Body(kc, "        ")
    accs = []
    for m in members:
        n = m.node
        x = n.inputs[0]
        axes = (n.attrs["axis"],) if n.op == "argmax" else tuple(n.attrs["axes"])
        kept = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        oc = Index(kept, flat="o").get_coords(outer) if kept else []
        rc = Index(tuple(x.shape[i] for i in axes), flat="r").get_coords(inner)
        it_o, it_r = iter(oc), iter(rc)
        coords = [next(it_r) if i in axes else next(it_o) for i in range(x.ndim)]
        accs.append({"op": n.op, "val": inner.value(x, Index(x.shape, coords))})
    per_wg = n_red >= 256 or (n_red >= 64 and n_out < 2048)
    # the results, then elementwise outputs of them at the same element o (the epilogue)
    epi = Body(kc, "    ")
    kc.self_flat = "o"
    stores = []
    for j, m in enumerate(members):
        kc.computed[id(m.out)] = f"res{j}"
        stores.append(_store(kc, plan, m.out, f"res{j}", "o"))
    for m in members:
        for t in m.after:
            kc.computing = t
            val = epi.value(t, Index(t.shape, flat="o"))
            kc.computed[id(t)] = val
            stores.append(_store(kc, plan, t, val, "o"))
    grid = _grid(n_out if per_wg else -(-n_out // WG))
    wgsl = render(
        "wgsl/reduce.wgsl.j2",
        header=header, bindings=kc.binding_text(), helpers=sorted(kc.helpers), wg=WG,
        accs=accs, per_wg=per_wg, n_out=n_out, n_red=n_red, row=grid[0] * (1 if per_wg else WG),
        outer=outer.lines, inner=inner.lines, epilogue=epi.lines, stores=stores,
    )
    return KernelCode(name, wgsl, kc.bindings(), grid, ops, site)


def _store(kc: KernelContext, plan: Plan, t: Tensor, value: str, index: str) -> str:
    loc = plan.loc[id(t)]
    kc.use(loc.arena, write=True)
    return f"{loc.arena}[{loc.offset}u + {index}] = {value};" if loc.offset else f"{loc.arena}[{index}] = {value};"


def _merge(subdims) -> tuple:
    return tuple(merge_subdims(subdims)) or ((1, 0),)


def _operand(plan: Plan, s: Schedule, t: Tensor, kc: KernelContext, fold_batch: bool) -> Operand:
    """t [..., rows, cols] as a matmul operand; with fold_batch the batch dims join the rows."""
    loc, dims = plan.read_loc(s, t)
    kc.use(loc.arena, write=False)
    batch = _merge([sd for axis in dims[:-2] for sd in axis])
    rows = _merge(([sd for axis in dims[:-2] for sd in axis] if fold_batch else []) + list(dims[-2]))
    cols = _merge(dims[-1])
    single = len(rows) == 1 and len(cols) == 1 and (fold_batch or len(batch) == 1)
    if single:
        return Operand(loc.arena, loc.offset, 0 if fold_batch else batch[0][1], rows[0][1], cols[0][1])
    return Operand(loc.arena, loc.offset, 0, 0, 0, batch_dims=() if fold_batch else batch, row_dims=rows, col_dims=cols)


def _matmul(name, header, k: Kernel, s: Schedule, plan: Plan, ops, site) -> KernelCode:
    mm = k.mm if k.mm is not None else k.out
    a, b = mm.node.inputs
    kc = KernelContext(s, plan, k.out if k.mm is not None else None)
    kc.acc_tensor = mm
    batch, M, N, K = _size(mm.shape[:-2]), mm.shape[-2], mm.shape[-1], a.shape[-1]
    # weights shared over the batch ([..., M, K] @ [K, N]): one [batch*M, K] @ [K, N]
    fold = b.ndim == 2
    opa, opb = _operand(plan, s, a, kc, fold), _operand(plan, s, b, kc, False)
    if fold:
        batch, M = 1, batch * M
    out_loc = plan.loc[id(k.out)]
    kc.use(out_loc.arena, write=True)
    epi = "acc"
    body = Body(kc, "", inline=True)
    flat = f"(bi * {M * N}u + row * {N}u + col)" if batch > 1 else f"(row * {N}u + col)"
    if k.mm is not None:
        epi = body.value(k.out, Index(k.out.shape, flat=flat))
    # outputs merged into the epilogue: computed from C's value v at the same element
    kc.self_flat = flat
    kc.computed[id(k.out)] = "v"
    extra = []
    for j, t in enumerate(k.after):
        kc.computing = t
        expr = body.value(t, Index(t.shape, flat=flat))
        loc = plan.loc[id(t)]
        kc.use(loc.arena, write=True)
        extra.append((f"x{j}", expr, loc.arena, loc.offset))
        kc.computed[id(t)] = f"x{j}"
    spec = MatmulSpec(batch, M, N, K, opa, opb, out_loc.arena, out_loc.offset, epilogue=epi, extra_stores=tuple(extra))
    helpers = "\n".join(render("wgsl/_helpers.wgsl.j2", names=sorted(kc.helpers)).rstrip("\n").split("\n")) if kc.helpers else ""
    bindings = kc.binding_text() + ("\n" + helpers if helpers else "")
    wgsl, grid = render_matmul(spec, name, "\n".join(header), bindings)
    return KernelCode(name, wgsl, kc.bindings(), tuple(grid), ops, site)
