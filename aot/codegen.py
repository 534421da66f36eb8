"""(KernelSchedule, Plan) -> one WGSL compute kernel per scheduled kernel, from the templates of its
family (elementwise, reduce, matmul); the values themselves are rendered by wgsl_expr.py.

CPU variants: every kernel also has a variant for CPU adapters (lavapipe, SwiftShader), with
the same storage bindings; the package picks the set at Model() from the adapter's type.
- A CPU adapter compiles each kernel at its first dispatch, and a transformer's blocks repeat
  the same kernels at other offsets: the CPU variant reads where each tensor starts from an
  offset table (wgsl_expr.KernelContext.start: a uniform struct `at`, one slot per kernel set
  per dispatch), so kernels that differ only there have one text, compiled once.
- It runs a workgroup's invocations as fibers or SIMD lanes, so a workgroup barrier costs far
  more than on a GPU: reductions over short rows sum each row in one invocation; matmuls have
  no workgroup memory or barriers (matmul_codegen.render_matmul_cpu: each invocation sums its
  block of outputs over all of K), 1.3-1.5x faster there than the GPU tiles and quicker to
  compile, on a grid of their own (the CPU dispatch list carries it); attention kernels read
  the other side a row at a time (attention_codegen).
(An earlier barrier-free matmul, one output per invocation, ran 1.2x slower than the tiles and
gave wrong results at [4096x1024] @ [1024x1024] on lavapipe; the register-blocked one is checked
at that size's first quarter in tests/test_matmul_kernel.py.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from .attention_codegen import render_attention
from .recurrent_codegen import render_recurrent
from .errors import CodegenError, printable
from .ir import Tensor, tensor_names
from .matmul_codegen import LOOP_MAX, MatmulSpec, Operand, choose_tile, render_matmul, render_matmul_cpu, vec_reads
from .plan import Plan, vec_alias
from .schedule import Kernel, KernelSchedule, op_of
from .templates import render
from .views import View, merge_subdims, regroup
from .wgsl_expr import Body, Index, KernelContext, _size

WG = 256
ROW_WG = 64  # a row reduction's workgroup for many short rows (row_workgroup_size)
ROW_WG_MIN_ROWS = 4096
ROW_WG_MAX_LEN = 1024
# A reduction's CPU variant sums a row of up to CPU_SEQUENTIAL_MAX elements in one invocation, in
# order (no workgroup memory, no barriers: a CPU adapter runs a workgroup's invocations as fibers
# or SIMD lanes, and each tree step's barrier splits them; on Mesa 25 a tree's kernel also
# compiled 3x longer). A row over CPU_SUM_CHUNK is summed CPU_SUM_CHUNK elements at a time in an
# inner loop, so that rounding grows with CPU_SUM_CHUNK + n / CPU_SUM_CHUNK rather than n (a
# tree's grows with log n). Longer rows keep the tree, whose invocations loop n / 256 times: Mesa
# 22's lavapipe ends an invocation's loops after LOOP_MAX steps in all.
CPU_SEQUENTIAL_MAX = 8192
# Such rows go CPU_ROW_WG to a workgroup, one invocation each: a CPU adapter runs a workgroup's
# invocations as SIMD lanes (SwiftShader 4, lavapipe 8 on AVX2), so one row a workgroup left all
# lanes but one idle. 16 keeps 4 or more workgroups for the cores where a kernel has 64 rows.
# The addition transformer's step on SwiftShader (headless Chromium, bench_web.py's aot page on a
# busy 2-core machine, interleaved rounds, same losses): 0.93-1.38 s with one row a workgroup,
# 0.82-1.05 s with 16 (an earlier 3 rounds with 64 lay between them); the reductions' share of
# the step 27% -> 9% (bench_web.py --profile).
CPU_ROW_WG = 16
CPU_SUM_CHUNK = 256
assert CPU_SEQUENTIAL_MAX + CPU_SEQUENTIAL_MAX // CPU_SUM_CHUNK < LOOP_MAX
# The CPU matmul walks all of K in each invocation (then a store loop over its block's rows): a
# longer K runs the GPU kernel in the CPU set too.
CPU_MATMUL_MAX_K = LOOP_MAX - 64
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
    # the same kernel for CPU adapters (lavapipe, SwiftShader), same storage bindings (the module
    # doc); None for a merged dispatch, which only the GPU set runs
    wgsl_cpu: str | None = None
    grid_cpu: tuple[int, int, int] | None = None  # the CPU variant's grid where it differs
    # the CPU variant's offset table (plan.OFFSETS_BINDING), or () when it writes its offsets in
    offsets_cpu: tuple[int, ...] = ()
    # the GPU kernel with subgroup operations, for adapters that offer them (the "subgroup" set:
    # attention, attention_codegen.LANES), same bindings and grid; None where it has none
    wgsl_subgroup: str | None = None
    # the CPU variant's matmul (a matmul kernel's MatmulSpec with its offset-table starts): the
    # wasm kernel set writes its own SIMD matmul from it (wasm_matmul.py); None for other kernels
    mm_spec: MatmulSpec | None = None
    # the wasm set's own (WGSL, grid) where the CPU variant keeps workgroup barriers: a reduction
    # of rows over CPU_SEQUENTIAL_MAX summed by one invocation all the same (wasm has no loop
    # limit); None elsewhere. Not in the package's tables: only the web module's wasm set reads it
    wasm_variant: tuple[str, tuple[int, int, int]] | None = None
    parts: list["KernelCode"] = field(default_factory=list)  # the kernels it runs (merge.py, chain.py)
    kind: str = "kernel"  # "kernel"; "merged": parts side by side (merge.py); "chain": parts as stages (chain.py)


def _grid(n_groups: int) -> tuple[int, int, int]:
    if n_groups <= MAX_GROUPS:
        return (max(n_groups, 1), 1, 1)
    y = -(-n_groups // MAX_GROUPS)
    return (-(-n_groups // y), y, 1)


def _walk(k: Kernel, s: KernelSchedule) -> tuple[list, list[Tensor]]:
    """(nodes the kernel computes: its own plus everything inlined into it, in graph order;
    tensors it reads from storage, in the order met)."""
    seen, order, reads = set(), [], []
    stack = list(k.outs)
    outs = {id(t) for t in k.outs}
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if id(t) not in outs and id(t) in s.views and not (k.mm is not None and t is k.mm):
            reads.append(t)
            continue
        if op_of(t).fusion == "constant":
            continue
        order.append(t.node)
        stack.extend(t.node.inputs)
    pos = {id(n): i for i, n in enumerate(s.graph.nodes)}
    return sorted(order, key=lambda n: pos[id(n)]), reads


def _fused_ops(k: Kernel, s: KernelSchedule) -> list[str]:
    """Names of the ops a kernel computes, in graph order (views left out)."""
    return [n.op for n in _walk(k, s)[0] if n.op not in ("reshape", "broadcast_to")]


def entry_prefix(key: str) -> str:
    """The kernel-name prefix of an entry point's variant: train, predict, predict_B1 (for
    predict[B=1]), predict_B1_T8 (for predict[B=1,T=8])."""
    if "[" not in key:
        return key
    entry, sizes = key.rstrip("]").split("[", 1)
    return "_".join([entry] + [part.replace("=", "") for part in sizes.split(",")])


def kernel_name(prefix: str, i: int, k: Kernel, s: KernelSchedule, digits: int = 2) -> str:
    """{entry}_{index}_{label}: the kernel's main op (matmul, the reduction, the last elementwise
    op) after up to two other ops fused into it, e.g. train_12_fused_mul_sub_sum. Numbered per
    entry point, so a kernel added to one entry renames none of another's."""
    ops = list(dict.fromkeys(_fused_ops(k, s)))
    main = "matmul" if k.kind == "matmul" else k.node.op
    others = [o for o in ops if o != main]
    if k.kind == "matmul":
        label = "_".join(["matmul"] + others[:3])
    elif k.kind == "attention":  # its sibling ops are the same kernel: named for the outputs it
        # writes but the logsumexp beside O (attention, attention_dk_dv)
        label = "_".join([k.node.op] + [g.node.op.removeprefix("attention_") for g in k.group if g.node.op != "attention_lse"])
    else:
        label = "_".join(["fused"] + others[:2] + [main]) if others else main
    return f"{prefix}_{i:0{digits}d}_{label}"


def generate(s: KernelSchedule, plan: Plan, prefix: str = "k") -> list[KernelCode]:
    out = []
    names = tensor_names(s.graph)
    writers: dict[int, str] = {}  # storage owner -> the kernel that wrote it (header comments)
    for i, k in enumerate(s.kernels):
        name = kernel_name(prefix, i, k, s, digits=max(2, len(str(len(s.kernels) - 1))))
        try:
            out.append(_kernel(name, k, s, plan, names, writers))
        except CodegenError as e:
            site = k.node.site.short if k.node.site else "?"
            raise CodegenError(f"{e}\n  while generating kernel {name} for {names[id(k.out)]} ({site})") from None
        for t in k.outs:
            writers[id(t)] = name
    return out


def _read_label(t: Tensor, s: KernelSchedule, writers: dict[int, str]) -> str:
    """What a kernel reads, as the package's reader knows it: a parameter, input or optimizer
    state by its name, an intermediate by the kernel that wrote it."""
    if t.node.op in ("param", "input", "state", "buffer"):
        return printable(t.node.attrs["name"])
    v = s.views.get(id(t))
    base = v.base if v is not None else t
    if base.node.op in ("input", "state", "buffer"):
        return printable(base.node.attrs["name"])
    if base.node.op == "param":  # a view of the flat parameter buffer: the parameter it starts in
        starts = [(off, name) for name, off in s.param_offsets.items() if off <= v.offset]
        return printable(max(starts)[1]) if starts else "params"
    if base is s.graph.persist.get("grads"):
        return "grads"
    owner = s.placed.get(id(base), (base, 0))[0]
    return writers.get(id(base)) or writers.get(id(owner)) or f"{base.node.op} (written piecewise)"


def _header(name: str, k: Kernel, s: KernelSchedule, writers) -> tuple[list[str], str, str]:
    nodes, reads = _walk(k, s)
    ops = [n.op for n in nodes if n.op not in ("reshape", "broadcast_to")]
    site = k.node.site.short if k.node.site else "optimizer" if s.graph.meta.get("kind") == "train" else "-"
    ins = list(dict.fromkeys(_read_label(r, s, writers) for r in reads))
    outs = ", ".join(t.type_str() for t in k.stored_outs)
    lines = [
        f"// {name}: {' -> '.join(ops) if ops else k.node.op}   ({site})",
        f"// writes {outs}; reads {', '.join(ins) if ins else 'nothing'}",
    ]
    return lines, " ".join(ops), site


def _kernel(name, k: Kernel, s: KernelSchedule, plan: Plan, names, writers) -> KernelCode:
    try:
        code = _kernel_sets(name, k, s, plan, names, writers)
    except CodegenError as e:
        if str(e).startswith(f"kernel {name}"):
            raise
        raise CodegenError(f"kernel {name} ({k.node.op} at {k.node.site.short if k.node.site else '?'}): {e}") from None
    for text in (code.wgsl, code.wgsl_cpu, code.wgsl_subgroup):
        big = [m for m in _U32_LITERAL.findall(text or "") if int(m) >= 2**32]
        if big:  # a count or stride past u32: the kernel cannot index what it was asked to
            raise CodegenError(
                f"kernel {name} ({k.node.op}, writing {k.out.type_str()}) would need the integer {big[0]}, more than a "
                "u32 holds: make the tensors it indexes smaller than 2**32 elements"
            )
    return code


_U32_LITERAL = re.compile(r"\b(\d+)u\b")


def _kernel_sets(name, k: Kernel, s: KernelSchedule, plan: Plan, names, writers) -> KernelCode:
    code = _render(name, k, s, plan, names, writers, cpu=False)
    long_k = k.kind == "matmul" and (k.mm if k.mm is not None else k.out).node.inputs[0].shape[-1] > CPU_MATMUL_MAX_K
    # a K too long for the CPU matmul: the CPU set runs the GPU kernel, whose invocations loop K / slab times
    cpu = code if long_k else _render(name, k, s, plan, names, writers, cpu=True)
    if cpu.bindings != code.bindings or (cpu.grid != code.grid and k.kind not in ("matmul", "reduce", "recurrent", "elementwise")):
        raise CodegenError(f"kernel {name}: its CPU variant dispatches differently ({cpu.grid} vs {code.grid})")
    code.wgsl_cpu, code.offsets_cpu = cpu.wgsl, cpu.offsets_cpu
    # a K too long for the CPU matmul: the wasm set's SIMD matmul reads the GPU kernel's spec
    code.mm_spec = code.mm_spec if long_k else cpu.mm_spec
    if k.kind == "reduce" and "workgroupBarrier" in cpu.wgsl:
        seq, kc = _reduce(name, _header(name, k, s, writers)[0] + [CPU_HEADER[k.kind]], k, s, plan, "", "", cpu=True,
                          sequential_max=None)
        if tuple(kc.table or ()) == tuple(cpu.offsets_cpu) and seq.bindings == cpu.bindings:
            code.wasm_variant = (seq.wgsl, tuple(seq.grid))
    if cpu.grid != code.grid:
        code.grid_cpu = cpu.grid
    if k.kind == "attention":
        header, _, _ = _header(name, k, s, writers)
        wgsl, grid, kc = render_attention(header + [SUBGROUP_HEADER], k, s, plan, subgroup=True)
        if kc.bindings() != code.bindings or grid != code.grid:
            raise CodegenError(f"kernel {name}: its subgroup variant dispatches differently ({grid} vs {code.grid})")
        if "subgroupShuffle" in wgsl:  # LANES rows fit this kernel (else it stays the GPU kernel)
            code.wgsl_subgroup = wgsl
    return code


# The line a CPU variant's header adds, by kernel kind (reductions over short rows also change
# how they sum: _reduce)
CPU_HEADER = {
    "elementwise": "// CPU variant: tensor offsets from the offset table `at`",
    "reduce": "// CPU variant: tensor offsets from the offset table `at`",
    "attention": "// CPU variant: each invocation reads the other side's rows itself, no barriers",
    "recurrent": "// CPU variant: tensor offsets from the offset table `at`",
    "matmul": "// CPU variant: no workgroup memory, no barriers",
}
SUBGROUP_HEADER = "// subgroup variant: rows shared by lanes of a subgroup, partial sums through shuffles"
CPU_SEQUENTIAL_HEADER = "// CPU variant: each row summed by one invocation, no barriers; tensor offsets from `at`"


def _render(name, k: Kernel, s: KernelSchedule, plan: Plan, names, writers, cpu: bool) -> KernelCode:
    """The kernel for the GPU set, or (cpu) the CPU set's variant: barrier-free where the GPU's
    uses workgroup barriers, and reading where its tensors start from an offset table."""
    header, ops, site = _header(name, k, s, writers)
    if cpu:
        header = header + [CPU_HEADER[k.kind]]
    if k.kind == "elementwise":
        kc = KernelContext(s, plan, None, table=cpu)
        body = Body(kc, "    ")
        n = k.out.size
        stores = []
        for t in k.outs:
            kc.computing = t
            val = body.value(t, Index(t.shape, flat="i"))
            kc.computed[id(t)] = val
            stores.append(_store(kc, plan, t, val, "i"))
        tile = None if cpu else transposed_tile(k, s)
        if tile is not None:
            outer, a_len, m_len = tile
            n_c, n_m = -(-a_len // TILE_C), -(-m_len // (WG // TILE_C))
            groups = outer * n_c * n_m
            grid = _grid(groups)
            tile = {"a": a_len, "m": m_len, "n_c": n_c, "n_m": n_m, "groups": groups, "tc": TILE_C}
        else:
            grid = _grid(-(-n // WG))
        wgsl = render(
            "wgsl/elementwise.wgsl.j2",
            header=header, bindings=kc.binding_text(), helpers=sorted(kc.helpers), wg=WG,
            n=n, row=grid[0] * WG, gx=grid[0], lines=body.lines, stores=stores, tile=tile,
        )
        code = KernelCode(name, wgsl, kc.bindings(), grid, ops, site)
    elif k.kind == "reduce":
        code, kc = _reduce(name, header, k, s, plan, ops, site, cpu)
    elif k.kind == "attention":
        wgsl, grid, kc = render_attention(header, k, s, plan, cpu)
        code = KernelCode(name, wgsl, kc.bindings(), grid, ops, site)
    elif k.kind == "recurrent":
        wgsl, grid, kc = render_recurrent(header, k, s, plan, cpu)
        code = KernelCode(name, wgsl, kc.bindings(), grid, ops, site)
    else:
        code, kc = _matmul(name, header, k, s, plan, ops, site, cpu)
    code.offsets_cpu = tuple(kc.table or ())
    check_hazards(name, k, plan, kc.reads, names)
    if len(code.bindings) > MAX_STORAGE_BINDINGS:
        raise CodegenError(
            f"kernel {name} binds {len(code.bindings)} storage buffers ({', '.join(a for a, _ in code.bindings)}); "
            f"WebGPU guarantees {MAX_STORAGE_BINDINGS} per shader stage. Its operands were spread over too many "
            "scratch buffers: build with a larger --max-binding-mib"
        )
    return code


# An elementwise kernel one of whose operands is stored with the stride-1 axis not the output's
# last (a convolution's channels-last [N*H*W, C] product read as [N, C, H, W] by BatchNorm's
# normalization and its backward, which store [N, C, H, W]): consecutive invocations of the
# flat order read C elements apart, a 32-byte sector per invocation. Its invocations walk
# tiles of TILE_C x WG / TILE_C (channels x positions) instead: a 32-wide subgroup reads 4
# positions of 8 contiguous channels (4 full sectors where it read 32) and writes 8 runs of 4
# positions. TILE_C = 0 keeps the flat order (scripts/bench_rules.py compares them).
TILE_C = 8


def transposed_tile(k: Kernel, s: KernelSchedule) -> tuple[int, int, int] | None:
    """(outer, A, M) where k's output [.., A, ...] (A at axis a, M the elements after it, outer
    those before) has an operand of its shape whose stride-1 axis is a, not the last; else None."""
    if not TILE_C or WG % TILE_C:
        return None
    out = k.out
    if out.ndim < 2 or any(t.shape != out.shape for t in k.outs):
        return None
    for t in _walk(k, s)[1]:
        v = s.views.get(id(t))
        st = v.strides() if v is not None and t.shape == out.shape else None
        # not a broadcast (a stride 0: the same few values for every invocation, cached)
        if st is None or st[-1] == 1 and out.shape[-1] > 1 or any(d > 1 and not x for d, x in zip(out.shape, st)):
            continue
        axes = [a for a in range(out.ndim - 1) if st[a] == 1 and out.shape[a] >= TILE_C]
        if axes:
            a = axes[0]
            m_len = _size(out.shape[a + 1 :])
            if m_len >= WG // TILE_C // 2:
                return _size(out.shape[:a]), out.shape[a], m_len
    return None


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


FACTOR_UNROLL = 64  # an invocation adding up at most this many products puts them through barrier_f32 (_reduce)


def _reduce(name, header, k: Kernel, s: KernelSchedule, plan: Plan, ops, site, cpu: bool = False,
            sequential_max: int | None = CPU_SEQUENTIAL_MAX) -> KernelCode:
    members = k.group + [k]
    n_out, n_red = k.reduce_space()
    kc = KernelContext(s, plan, None, table=cpu)
    outer = Body(kc, "    ")
    inner = Body(kc, "        ")
    lanes = None if cpu else reduce_lanes(k, s)
    per_wg = lanes is not None or kernel_rows_per_workgroup(k) == 1
    sequential = cpu and per_wg and (sequential_max is None or n_red <= sequential_max)
    wg = WG if lanes else row_workgroup_size(n_out, n_red) if per_wg else WG
    # the terms one invocation adds up in its loop
    terms = n_red if sequential or not per_wg else -(-n_red // wg)
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
        val = inner.value(x, Index(x.shape, coords))
        if n.op == "sum" and 2 <= terms <= FACTOR_UNROLL and getattr(x.node, "op", None) in ("mul", "div"):
            # a short loop is unrolled, and Mesa then factors a*c + b*c into (a + b)*c for the
            # common factor of a product over the reduced axis: sum(inf * x) over (-1e30, 88.5)
            # was inf * (-1e30 + 88.5) = -inf, not NaN (hour run 20's special seed 5821320)
            val = inner.barrier_f32(val)
        accs.append({"op": n.op, "val": val})
    # max and argmax compare with NaN-propagating helpers (torch: a NaN is the maximum); a sum's
    # result goes through plus_zero_f32 (torch's sums start from +0, so a sum of -0s is +0)
    for m in members:
        kc.helpers.update({"max": ("max_nan", "is_nan_f32", "f32_bits"), "argmax": ("gt_nan", "is_nan_f32", "f32_bits"),
                           "sum": ("plus_zero_f32",)}.get(m.node.op, ()))
    # the results, then elementwise outputs of them at the same element o (the epilogue)
    epi = Body(kc, "    ")
    kc.self_flat = "o"
    stores = []
    for j, m in enumerate(members):
        kc.computed[id(m.out)] = f"res{j}"
        if id(m.out) not in k.unstored:
            stores.append(_store(kc, plan, m.out, f"res{j}", "o"))
    for m in members:
        for t in m.after:
            kc.computing = t
            val = epi.value(t, Index(t.shape, flat="o"))
            kc.computed[id(t)] = val
            stores.append(_store(kc, plan, t, val, "o"))
    grid = _grid((n_out // lanes[0] if lanes else n_out) if per_wg else -(-n_out // WG))
    if lanes:
        p_, a_, b_ = lanes
        lanes = {"p": p_, "a": a_, "b": b_, "ncb": a_ // p_, "groups": n_out // p_}
    if sequential:
        # one invocation per workgroup sums the row in order, over the GPU kernel's grid (one
        # workgroup per row)
        per_wg, wg = False, CPU_ROW_WG
        grid = _grid(-(-n_out // wg))
        header = header[:-1] + [CPU_SEQUENTIAL_HEADER]
    wgsl = render(
        "wgsl/reduce.wgsl.j2",
        header=header, bindings=kc.binding_text(), helpers=sorted(kc.helpers), wg=wg,
        accs=accs, per_wg=per_wg, n_out=n_out, n_red=n_red, row=grid[0] * (1 if per_wg else wg), lanes=lanes,
        one_buf=kc.bindings()[0][0] if cpu else "", chunk=CPU_SUM_CHUNK if cpu else 0,
        outer=outer.lines, inner=inner.lines, epilogue=epi.lines, stores=stores,
    )
    return KernelCode(name, wgsl, kc.bindings(), grid, ops, site), kc


def row_workgroup_size(n_out: int, n_red: int) -> int:
    """Invocations of a workgroup that reduces one row. Many short rows (a LayerNorm over 8192
    rows of 512) get ROW_WG: 4x the rows in flight per SM and a tree of 6 barrier steps instead
    of 8, where the GPU has rows enough to fill it; otherwise WG (a small model's row kernels then
    still merge with its 256-wide kernels: merge.py)."""
    return ROW_WG if n_out >= ROW_WG_MIN_ROWS and n_red <= ROW_WG_MAX_LEN else WG


# outputs from which a reduction over outer axes (its input's last axis kept) gets one invocation
# per output however long its rows: consecutive invocations read consecutive elements, and there
# are threads enough [a gather's gradient, exact.select_sum: 2M outputs of word_language_model's
# table, each over 1120 tokens; one workgroup and a barrier tree per output was 3x slower than
# the one-hot matmul it replaced on lavapipe]
OUTER_SEQUENTIAL_MIN = 1 << 16


# At most this many outputs of at least FEW_ROWS_MIN_LEN each also get a workgroup per output: one
# invocation per output would walk its row alone, a load and an add per element in turn, on as
# many threads as outputs (BatchNorm's second stage, 16 channels of 32 chunk sums; see
# scripts/bench_rules.py)
FEW_ROWS = 64
FEW_ROWS_MIN_LEN = 16


def rows_per_workgroup(n_out: int, n_red: int, outer: bool = False) -> int:
    """A reduction's GPU kernel: one workgroup per output (a strided loop and a tree) when its rows
    are long, or when there are too few of them to fill the GPU; else one invocation per output.
    [2048 outputs of 128 (transformer_large's second bias-gradient stage): 35 us on 8 workgroups,
    15 us on 2048 (H100, scripts/results/profile_large_h100_sum_rows.json)]"""
    if outer and n_out >= OUTER_SEQUENTIAL_MIN:
        return WG
    few = n_out <= FEW_ROWS and n_red >= FEW_ROWS_MIN_LEN
    return 1 if n_red >= 256 or (n_red >= 64 and n_out < 4096) or few else WG


# A reduction whose input is stored with a kept axis contiguous (BatchNorm's backward sums over
# cells of a channels-last convolution product, split_rules.SPLIT_CELLS) gives each workgroup P
# outputs along that axis, P lanes (a power of two up to LANES_MAX dividing it) x WG / P row
# walkers: neighbouring invocations read neighbouring addresses, where a workgroup per output read
# one float of every 32-byte sector (or, with an invocation per output, each walked its row alone
# with neighbours a row apart). Only where that leaves LANES_MIN_GROUPS workgroups or more.
# LANES_MAX = 0: a workgroup per output, as before (scripts/bench_rules.py compares them).
LANES_MAX = 64
LANES_MIN = 4
LANES_MIN_GROUPS = 128


def reduce_lanes(k: Kernel, s: KernelSchedule) -> tuple[int, int, int] | None:
    """(P, A, B) for a reduction kernel that runs P outputs a workgroup: A the length of the kept
    axis an operand of the input's shape reads at stride 1, B the outputs after it (the
    workgroup's outputs are P consecutive along that axis); None for a workgroup per output."""
    if not LANES_MAX or k.kind != "reduce":
        return None
    x = k.node.inputs[0]
    axes = op_of(k.node).reduced_axes(k.node.attrs)
    n_out, n_red = k.reduce_space()
    if any(m.node.inputs[0].shape != x.shape or op_of(m.node).reduced_axes(m.node.attrs) != axes for m in k.group):
        return None
    for t in _walk(k, s)[1]:
        st = _strides_as(s.views.get(id(t)), t, x.shape)
        if st is None or any(st[a] == 1 and x.shape[a] > 1 for a in axes) or any(d > 1 and not z for d, z in zip(x.shape, st)):
            continue
        for a in range(x.ndim):
            if a in axes or st[a] != 1 or x.shape[a] < LANES_MIN:
                continue
            p = 1
            while p * 2 <= min(LANES_MAX, WG // 4) and x.shape[a] % (p * 2) == 0:
                p *= 2
            b = _size([x.shape[i] for i in range(a + 1, x.ndim) if i not in axes])
            if p < LANES_MIN or n_out // p < LANES_MIN_GROUPS or n_red < WG // p:
                return None
            # an invocation per output already reads neighbouring addresses where the axis is the
            # outputs' last (a split-K matmul's second stage)
            if b == 1 and kernel_rows_per_workgroup(k) != 1:
                return None
            return p, x.shape[a], b
    return None


def _strides_as(v: View | None, t: Tensor, shape) -> tuple[int, ...] | None:
    """The strides of stored t's elements read as a reshape of it to `shape` (where its axes
    regroup into those; a reduction reads BatchNorm's [N, C, H, W] as [N, C, H/k, k, W])."""
    if v is None or t.size != _size(shape):
        return None
    axes = regroup([sd for axis in v.dims for sd in axis], shape)
    if axes is None:
        return None
    out = []
    for axis in axes:
        real = [(n, st) for n, st in axis if n != 1]
        if len(real) > 1:
            return None
        out.append(real[0][1] if real else 0)
    return tuple(out)


def lanes_workgroup(o, lanes: tuple[int, int, int]):
    """The workgroup that computes output o (ints or a NumPy array) of a kernel with reduce_lanes."""
    p, a, b = lanes
    return o // (a * b) * (a // p * b) + (o // b) % a // p * b + o % b


def kernel_rows_per_workgroup(k: Kernel) -> int:
    """rows_per_workgroup of a reduction kernel; `outer` where its input's last axis is kept."""
    n = k.node
    x = n.inputs[0]
    axes = op_of(n).reduced_axes(n.attrs)
    return rows_per_workgroup(*k.reduce_space(), outer=x.ndim - 1 not in axes and x.shape[-1] > 1)


def _store(kc: KernelContext, plan: Plan, t: Tensor, value: str, index: str) -> str:
    loc = plan.loc[id(t)]
    kc.use(loc.arena, write=True)
    start = kc.start(loc.arena, loc.offset)
    return f"{loc.arena}[{start} + {index}] = {value};" if start else f"{loc.arena}[{index}] = {value};"


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
    op = _strided_operand(loc.arena, loc.offset, dims, fold_batch)
    return replace(op, start=kc.start(loc.arena, loc.offset)) if kc.table is not None else op


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


def _with_vec_reads(spec: MatmulSpec, kc: KernelContext) -> MatmulSpec:
    """spec with its stored, read-only operands read as vec4s through their arena's vec4 alias
    where either kernel variant's tile can (matmul_codegen.vec_reads) and the kernel has binding
    numbers to spare: 2-7% faster slab loads on an H100 where the contiguous index is M or N
    (4096^3: 38.3 -> 39.1-40.2 TFLOP/s, weight gradients 32.1 -> 34.4;
    scripts/results/bench_matmul_vec_all_h100.json)."""
    ops = {"a": spec.a, "b": spec.b}
    # Only where no operand is read through a read_write binding (the output's buffer, or one the
    # kernel also writes): there vec4 loads ran 1.1-1.6x slower than scalar ones on an H100, also
    # those of a read-only operand beside a read_write one (weight gradients [2048, 4096] @
    # [4096, 512] x 2 in transformer_large: 500 -> 579 us; bench_matmul_vec_rw_h100.json).
    if any(not op.fn and kc.access.get(op.buf) != "read" for op in ops.values()):
        return spec
    offer = {k: replace(op, vec_buf=vec_alias(op.buf)) if not op.fn else op for k, op in ops.items()}
    trial = replace(spec, a=offer["a"], b=offer["b"])
    used = set()
    for name in sorted(vec_reads(trial, choose_tile(trial))):
        if name in kc.access or len(kc.access) < MAX_STORAGE_BINDINGS:
            kc.use(name, write=False)
            used.add(name)
    keep = {k: offer[k] if offer[k].vec_buf in used else op for k, op in ops.items()}
    return replace(spec, a=keep["a"], b=keep["b"])


# the longest WGSL expression a matmul's merged output is written as (longer: as lets)
EPILOGUE_INLINE_MAX = 4000


def _matmul(name, header, k: Kernel, s: KernelSchedule, plan: Plan, ops, site, cpu: bool) -> KernelCode:
    mm = k.mm if k.mm is not None else k.out
    a, b = mm.node.inputs
    kc = KernelContext(s, plan, k.out if k.mm is not None else None, table=cpu)
    # A large matmul reads the scratch it does not write through read-only bindings (and vec4s
    # where it can): faster on a GPU. A small one keeps scratch read_write, as its neighbours bind
    # it: a small model's step then sets 2 bind groups instead of 25, and its merges stay.
    kc.share_scratch = not k.large
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
    # C's flat index, without the terms of size-1 dims (their index is always 0)
    terms = [f"bi * {M * N}u"] if batch > 1 else []
    terms += ([f"row * {N}u" if N > 1 else "row"] if M > 1 else []) + (["col"] if N > 1 else [])
    flat = f"({' + '.join(terms)})" if len(terms) > 1 else terms[0] if terms else "0u"

    def at_c(shape) -> Index:
        """C's element (bi, row, col) as an index of a tensor of C's size: coordinates as well as
        the flat index when its dims split as C's do (batch dims, M, N; or rows folded into M, N),
        so a broadcast bias reads [col], not [(row * N + col) % N]; otherwise the flat index."""
        lead = tuple(shape[:-2] if batch > 1 else shape[:-1])
        if not shape or shape[-1] != N or _size(lead) != (batch if batch > 1 else M) or (batch > 1 and shape[-2] != M):
            return Index(shape, flat=flat)
        lead_coords = Index(lead, flat="bi" if batch > 1 else "row").get_coords(body) if lead else []
        return Index(shape, coords=lead_coords + (["row", "col"] if batch > 1 else ["col"]), flat=flat)

    if k.mm is not None:
        epi = body.value(k.out, at_c(k.out.shape))
    # outputs merged into the epilogue: computed from C's value v at the same element
    kc.self_flat = flat
    kc.computed[id(k.out)] = "v"
    extra = []
    for j, t in enumerate(k.after):
        kc.computing = t
        expr, lets = body.value(t, at_c(t.shape)), ()
        if len(expr) > EPILOGUE_INLINE_MAX:
            # one expression repeats its shared parts (a max-pool window's index math per use):
            # 17 kB of them were 50,000 WebAssembly locals, more than engines compile (graphs
            # seed 5660036). Large ones are written as lets, each shared part once.
            lb = Body(kc, "")
            expr = lb.value(t, at_c(t.shape))
            lets = tuple(line.strip() for line in lb.lines)
        loc = plan.loc[id(t)]
        kc.use(loc.arena, write=True)
        extra.append((f"x{j}", expr, loc.arena, kc.start(loc.arena, loc.offset) if cpu else loc.offset, lets))
        kc.computed[id(t)] = f"x{j}"
    out_start = kc.start(out_loc.arena, out_loc.offset) if cpu else ""
    spec = MatmulSpec(
        batch, M, N, K, opa, opb, out_loc.arena, out_loc.offset, epilogue=epi, extra_stores=tuple(extra), out_start=out_start
    )
    if k.large:
        spec = _with_vec_reads(spec, kc)
    helpers = "\n".join(render("wgsl/_helpers.wgsl.j2", names=sorted(kc.helpers)).rstrip("\n").split("\n")) if kc.helpers else ""
    bindings = kc.binding_text() + ("\n" + helpers if helpers else "") + "".join("\n\n" + f for f in prologues)
    if cpu:
        # CPU adapters get a kernel without workgroup memory or barriers (matmul_codegen.CpuBlock)
        wgsl, grid = render_matmul_cpu(spec, name, "\n".join(header), bindings)
    else:
        wgsl, grid = render_matmul(spec, name, "\n".join(header), bindings)
    code = KernelCode(name, wgsl, kc.bindings(), tuple(grid), ops, site, mm_spec=spec)
    return code, kc
