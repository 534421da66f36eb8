"""(KernelSchedule, Plan) -> one WGSL compute kernel per scheduled kernel, from the templates of its
family (elementwise, reduce, matmul); the values themselves are rendered by wgsl_expr.py."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .attention_codegen import render_attention
from .errors import CodegenError
from .ir import Tensor, tensor_names
from .matmul_codegen import MatmulSpec, Operand, render_matmul
from .plan import Plan
from .schedule import Kernel, KernelSchedule, op_of
from .templates import render
from .views import View, merge_subdims
from .wgsl_expr import Body, Index, KernelContext, _size

WG = 256
MAX_GROUPS = 65535
MAX_STORAGE_BINDINGS = 8  # WebGPU's default maxStorageBuffersPerShaderStage


@dataclass
class KernelCode:
    name: str
    wgsl: str
    bindings: list[tuple[str, str]]  # (arena, "read" | "read_write"), binding i = position i
    grid: tuple[int, int, int]
    ops: str  # the ops it computes, for comments
    site: str  # user call site of the kernel's main node


def _grid(n_groups: int) -> tuple[int, int, int]:
    if n_groups <= MAX_GROUPS:
        return (max(n_groups, 1), 1, 1)
    y = -(-n_groups // MAX_GROUPS)
    return (-(-n_groups // y), y, 1)


def _fused_ops(k: Kernel, s: KernelSchedule) -> list[str]:
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
        if op_of(t).fusion == "constant":
            continue
        order.append(t.node)
        stack.extend(t.node.inputs)
    pos = {id(n): i for i, n in enumerate(s.graph.nodes)}
    return [n.op for n in sorted(order, key=lambda n: pos[id(n)]) if n.op not in ("reshape", "broadcast_to")]


def kernel_name(i: int, k: Kernel, s: KernelSchedule) -> str:
    """k{index}_{label}: the kernel's main op (matmul, the reduction, the last elementwise op)
    after up to two other ops fused into it, e.g. k012_fused_mul_sub_sum."""
    ops = list(dict.fromkeys(_fused_ops(k, s)))
    main = "matmul" if k.kind == "matmul" else k.node.op
    others = [o for o in ops if o != main]
    if k.kind == "matmul":
        return f"k{i:03d}_" + "_".join(["matmul"] + others[:3])
    return f"k{i:03d}_" + ("_".join(["fused"] + others[:2] + [main]) if others else main)


def generate(s: KernelSchedule, plan: Plan, prefix_index: int = 0) -> list[KernelCode]:
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


def _header(name: str, k: Kernel, s: KernelSchedule, names) -> tuple[list[str], str, str]:
    ops = _fused_ops(k, s)
    site = k.node.site.short if k.node.site else "optimizer" if s.graph.meta.get("kind") == "train" else "-"
    ins = sorted({names.get(id(r), "params") for r in k.reads})
    lines = [
        f"// {name}: {' -> '.join(ops) if ops else k.node.op}",
        f"// writes {', '.join(names[id(t)] for t in k.outs)}: {k.out.type_str()}   reads: {', '.join(ins) if ins else '-'}",
        f"// from {site}",
    ]
    return lines, " ".join(ops), site


def _kernel(name, k: Kernel, s: KernelSchedule, plan: Plan, names) -> KernelCode:
    header, ops, site = _header(name, k, s, names)
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
        code = KernelCode(name, wgsl, kc.bindings(), grid, ops, site)
    elif k.kind == "reduce":
        code, kc = _reduce(name, header, k, s, plan, ops, site)
    elif k.kind == "attention":
        wgsl, grid, kc = render_attention(header, k, s, plan)
        code = KernelCode(name, wgsl, kc.bindings(), grid, ops, site)
    else:
        code, kc = _matmul(name, header, k, s, plan, ops, site)
    check_hazards(name, k, plan, kc.reads, names)
    if len(code.bindings) > MAX_STORAGE_BINDINGS:
        raise CodegenError(
            f"kernel {name} binds {len(code.bindings)} storage buffers ({', '.join(a for a, _ in code.bindings)}); "
            f"WebGPU guarantees {MAX_STORAGE_BINDINGS} per shader stage. Its operands were spread over too many "
            "scratch buffers: build with a larger --max-binding-mib"
        )
    return code


def check_hazards(name: str, k: Kernel, plan: Plan, reads: list[Tensor], names) -> None:
    """A kernel keeps what it computes in registers and stores it at the end, so it must never
    read from memory a tensor it writes (it would see the previous contents: a stale value from
    the last step, or zeros), nor another tensor stored where it writes. Leaves are exempt: an
    in-place parameter/state update reads each element before writing it (plan._in_place_ok)."""
    outs = {id(t): t for t in k.outs}
    for b in dict.fromkeys(reads):
        if id(b) in outs:
            raise CodegenError(
                f"kernel {name} reads {names.get(id(b), '?')} from memory before it stores it "
                "(a fusion rule merged a reader that does not read element for element)"
            )
        if op_of(b).fusion == "leaf" or id(b) not in plan.loc:
            continue
        rb = plan.loc[id(b)]
        for t in outs.values():
            rt = plan.loc[id(t)]
            if rt.arena == rb.arena and rb.offset < rt.offset + t.size and rt.offset < rb.offset + b.size:
                raise CodegenError(
                    f"kernel {name} reads {names.get(id(b), '?')} from {rb.arena}[{rb.offset}:{rb.offset + b.size}], "
                    f"which overlaps {names.get(id(t), '?')} that it writes at {rt.arena}[{rt.offset}:{rt.offset + t.size}]"
                )


def _reduce(name, header, k: Kernel, s: KernelSchedule, plan: Plan, ops, site) -> KernelCode:
    members = k.group + [k]
    n_out, n_red = k.reduce_space()
    kc = KernelContext(s, plan, None)
    outer = Body(kc, "    ")
    inner = Body(kc, "        ")
    accs = []
    for m in members:
        n = m.node
        x = n.inputs[0]
        axes = op_of(n).reduced_axes(n.attrs)
        kept = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        oc = Index(kept, flat="o").get_coords(outer) if kept else []
        rc = Index(tuple(x.shape[i] for i in axes), flat="r").get_coords(inner)
        it_o, it_r = iter(oc), iter(rc)
        coords = [next(it_r) if i in axes else next(it_o) for i in range(x.ndim)]
        accs.append({"op": n.op, "val": inner.value(x, Index(x.shape, coords))})
    # max and argmax compare with NaN-propagating helpers (torch: a NaN is the maximum)
    for m in members:
        kc.helpers.update({"max": ("max_nan", "is_nan_f32", "f32_bits"), "argmax": ("gt_nan", "is_nan_f32", "f32_bits")}.get(m.node.op, ()))
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
    return KernelCode(name, wgsl, kc.bindings(), grid, ops, site), kc


def _store(kc: KernelContext, plan: Plan, t: Tensor, value: str, index: str) -> str:
    loc = plan.loc[id(t)]
    kc.use(loc.arena, write=True)
    return f"{loc.arena}[{loc.offset}u + {index}] = {value};" if loc.offset else f"{loc.arena}[{index}] = {value};"


def _merge(subdims) -> tuple:
    return tuple(merge_subdims(subdims)) or ((1, 0),)


def _operand(plan: Plan, s: KernelSchedule, t: Tensor, kc: KernelContext, fold_batch: bool, fn: str, prologues: list) -> Operand:
    """t [..., rows, cols] as a matmul operand; with fold_batch the batch dims join the rows.
    A t that is not stored is computed by a WGSL function `fn` as the tiles load it."""
    if id(t) not in s.views:
        return _prologue(s, t, kc, fold_batch, fn, prologues)
    loc, dims = plan.read_loc(s, t)
    kc.use(loc.arena, write=False)
    kc.reads.append(s.views[id(t)].base)
    return _strided_operand(loc.arena, loc.offset, dims, fold_batch)


def _prologue(s: KernelSchedule, t: Tensor, kc: KernelContext, fold_batch: bool, fn: str, prologues: list) -> Operand:
    """An operand computed in the matmul (schedule.is_prologue: unfold/flip index arithmetic over
    stored tensors): `fn name(bi, row, col) -> f32` renders t's expression at that element. Its
    strides are those t would have if the unfold/flip output were stored, so the tile loads walk
    the index that is contiguous in the memory the expression reads."""
    body = Body(kc, "    ")
    if fold_batch:
        coords = Index(t.shape[:-1], flat="row").get_coords(body) + ["col"]
    else:
        coords = Index(t.shape[:-2], flat="bi").get_coords(body) + ["row", "col"]
    value = body.value(t, Index(t.shape, coords))
    prologues.append("\n".join([f"fn {fn}(bi: u32, row: u32, col: u32) -> f32 {{", *body.lines, f"    return {value};", "}"]))
    chain, x = [], t
    while op_of(x).fusion == "view":
        chain.append(x.node)
        x = x.node.inputs[0]
    v = View.contiguous(x)
    for n in reversed(chain):
        v = op_of(n).view(n, {id(n.inputs[0]): v}) if v is not None else None
    if v is None:  # not a view of one computed tensor: call it row-major
        v = View.contiguous(t)
    op = _strided_operand("", 0, v.dims, fold_batch)
    return replace(op, fn=fn)


def _strided_operand(arena: str, offset: int, dims, fold_batch: bool) -> Operand:
    batch = _merge([sd for axis in dims[:-2] for sd in axis])
    rows = _merge(([sd for axis in dims[:-2] for sd in axis] if fold_batch else []) + list(dims[-2]))
    cols = _merge(dims[-1])
    single = len(rows) == 1 and len(cols) == 1 and (fold_batch or len(batch) == 1)
    if single:
        return Operand(arena, offset, 0 if fold_batch else batch[0][1], rows[0][1], cols[0][1])
    return Operand(arena, offset, 0, 0, 0, batch_dims=() if fold_batch else batch, row_dims=rows, col_dims=cols)


def _matmul(name, header, k: Kernel, s: KernelSchedule, plan: Plan, ops, site) -> KernelCode:
    mm = k.mm if k.mm is not None else k.out
    a, b = mm.node.inputs
    kc = KernelContext(s, plan, k.out if k.mm is not None else None)
    kc.acc_tensor = mm
    batch, M, N, K = _size(mm.shape[:-2]), mm.shape[-2], mm.shape[-1], a.shape[-1]
    # weights shared over the batch ([..., M, K] @ [K, N]): one [batch*M, K] @ [K, N]
    fold = b.ndim == 2
    prologues: list[str] = []
    opa = _operand(plan, s, a, kc, fold, "load_a", prologues)
    opb = _operand(plan, s, b, kc, False, "load_b", prologues)
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
    bindings = kc.binding_text() + ("\n" + helpers if helpers else "") + "".join("\n\n" + f for f in prologues)
    wgsl, grid = render_matmul(spec, name, "\n".join(header), bindings)
    return KernelCode(name, wgsl, kc.bindings(), tuple(grid), ops, site), kc
