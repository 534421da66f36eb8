"""Kernels -> row chains: dependent kernels over the same rows run as one kernel, in stages.

A reduction kernel gives each workgroup a fixed set of rows (one row, or 256 rows: codegen's
rows_per_workgroup). A later kernel that reads what it wrote only at those rows can run in the
same workgroup after a barrier instead of in a dispatch of its own: LayerNorm's mean, variance
and normalization; softmax's max, exp-sum and division; the row sums of their backward passes.
A dispatch costs a few microseconds whatever it does and these kernels are a chain (each needs
the last), so this shortens what no merging of independent kernels (merge.py) can.

A stage joins a chain when (each checked here):
- it is a reduction over the chain's rows with the same rows per workgroup, or an elementwise
  kernel whose elements are whole rows of them (element i in row i // (n / rows)), at most
  MAX_PER_INVOCATION per invocation of the workgroup that owns them;
- every element it reads of a chain kernel's output was written by the same workgroup: the index
  maps are evaluated, point by point, through the pointwise and view ops between its outputs and
  the reads (any other op on that path, or a read of storage the chain writes that is not one of
  its outputs, and it does not join);
- it writes nothing a chain kernel reads or writes (other workgroups may still be reading), and
  it conflicts with no kernel between the chain and its own place (it moves up to the chain);
- it is on the chain's side of a training graph's cut.
Stages are the kernels' own code, called in order, with `storageBarrier()` between them (the
stores of one stage are visible to the whole workgroup in the next); an elementwise stage walks
the elements of the workgroup's rows. The operations and their order are the kernels' own (bit
for bit the same results on lavapipe; a GPU driver may contract a*b + c into an FMA differently
in the larger shader: 1-ulp differences measured on an H100).
Like merge.py, this is for the GPU kernel set; the CPU set keeps every kernel on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import merge
from .codegen import ROW_WG, WG, KernelCode, kernel_rows_per_workgroup, lanes_workgroup, reduce_lanes
from .ir import Tensor
from .plan import Plan
from .schedule import Kernel, KernelSchedule, op_of
from .views import View

MAX_STAGES = 6
# An elementwise stage walks its workgroup's rows with the workgroup's 256 invocations: at most
# this many elements each, so a chain never trades a wide kernel for a long loop (the optimizer
# update after the one-row gradient-norm sum: 150k elements in one workgroup took 10 ms on an H100).
MAX_PER_INVOCATION = 16
MAX_POINTS = 1 << 24  # index maps are evaluated with NumPy: larger kernels stay on their own


@dataclass
class Chain:
    members: list[int]  # kernel indices, in stage order
    rows: int  # the rows (outputs of the first reduction)
    per_wg: int  # rows per workgroup
    wg: int  # invocations per workgroup: the first reduction's (WG, or ROW_WG for many short rows)
    row_of: dict  # id(output tensor) -> (kernel index, elements per row)
    lanes: tuple | None = None  # codegen.reduce_lanes of its reductions: P outputs a workgroup along an axis

    def workgroup(self, rows):
        """The workgroup that owns each row (ints or a NumPy array)."""
        return lanes_workgroup(rows, self.lanes) if self.lanes else rows // self.per_wg


def view_offsets(v: View, shape) -> np.ndarray:
    """Flat element offsets in v's base of every element of a tensor of `shape` (row-major)."""
    total = np.array([v.offset], dtype=np.int64)
    for d, subdims in zip(shape, v.dims):
        c = np.arange(d, dtype=np.int64)
        off = np.zeros(d, dtype=np.int64)
        sizes = [n for n, _ in subdims]
        for k, (n, st) in enumerate(subdims):
            inner = int(np.prod(sizes[k + 1 :], dtype=np.int64)) if k + 1 < len(sizes) else 1
            off += (c // inner) % n * st
        # axis by axis, each a row-major outer sum with the ones before: one pass over the
        # result at the last axis instead of one per axis
        total = np.add.outer(total, off).ravel()
    return total


class _Unknown(Exception):
    """An index map through an op the walk does not model."""


def _reaches(s: KernelSchedule, own: set[int], t: Tensor, want: set[int], memo: dict) -> bool:
    """Whether computing t reads the storage of a base in `want` (ids), through the pointwise and
    view ops the walk models; _Unknown past any other op, whatever it reads."""
    if id(t) in memo:
        return memo[id(t)]
    if id(t) in s.views and id(t) not in own:
        found = id(s.views[id(t)].base) in want
    else:
        fusion, n = op_of(t).fusion, t.node
        if fusion == "constant" or (fusion == "reduce" and id(t) in own):
            found = False
        elif fusion == "pointwise":
            if any(x.size != t.size for x in n.inputs):
                raise _Unknown(n.op)
            found = any([_reaches(s, own, x, want, memo) for x in n.inputs])  # every input checked
        elif fusion == "view" and op_of(t).view is not None:
            if op_of(t).view(n, {id(n.inputs[0]): View.contiguous(n.inputs[0])}) is None:
                raise _Unknown(n.op)
            found = _reaches(s, own, n.inputs[0], want, memo)
        else:
            raise _Unknown(n.op)
    memo[id(t)] = found
    return found


def _reads(s: KernelSchedule, own: set[int], t: Tensor, idx: np.ndarray | None, out: list, memo: dict) -> None:
    """Storage reads of computing t at flat elements idx (None: all of them, in order): (base,
    the element read for each point), of the subtrees `memo` (_reaches) marks only."""
    if not memo[id(t)]:
        return
    if id(t) in s.views and id(t) not in own:
        v = s.views[id(t)]
        at = view_offsets(v, t.shape)
        out.append((v.base, at if idx is None else at[idx]))
        return
    n = t.node
    if op_of(t).fusion == "pointwise":
        for x in n.inputs:
            _reads(s, own, x, idx, out, memo)
    else:  # a view (_reaches let no other op through)
        x = n.inputs[0]
        at = view_offsets(op_of(t).view(n, {id(x): View.contiguous(x)}), t.shape)
        _reads(s, own, x, at if idx is None else at[idx], out, memo)


def _row_index(shape, axes) -> np.ndarray:
    """The output row of every element of a tensor of `shape` reduced over `axes`, in order: a
    row-major index over the kept axes (stride 0 along the reduced ones)."""
    strides, stride = [0] * len(shape), 1
    for i in reversed(range(len(shape))):
        if i not in axes:
            strides[i], stride = stride, stride * shape[i]
    total = np.zeros(1, dtype=np.int64)
    for d, st in zip(shape, strides):
        total = np.add.outer(total, np.arange(d, dtype=np.int64) * st).ravel()
    return total


def _points(k: Kernel, rows: int) -> list[tuple[Tensor, int, Callable[[], np.ndarray]]] | None:
    """(tensor, its element count, the row of each of its elements in order) for what a stage
    computes, from which its reads are walked; None if its index space is not whole rows. The
    rows are a function: they are made only for tensors that read the chain."""
    if k.kind == "elementwise":
        n = k.out.size
        if n % rows or any(t.size != n for t in k.outs):
            return None
        return [(t, n, lambda: np.arange(n, dtype=np.int64) // (n // rows)) for t in k.outs]
    if k.kind != "reduce" or k.reduce_space()[0] != rows:
        return None
    out = []
    for m in k.group + [k]:
        x = m.node.inputs[0]
        axes = op_of(m.node).reduced_axes(m.node.attrs)
        out.append((x, x.size, lambda x=x, axes=axes: _row_index(x.shape, axes)))
        for t in m.after:  # the epilogue, at output element o
            if t.size != rows:
                return None
            out.append((t, rows, lambda: np.arange(rows, dtype=np.int64)))
    return out


def _local(s: KernelSchedule, k: Kernel, chain: Chain) -> bool:
    """Every element k reads of a chain output was written by the workgroup that computes it."""
    pts = _points(k, chain.rows)
    if pts is None or sum(n for _, n, _ in pts) > MAX_POINTS:
        return False
    if k.kind == "reduce":
        lanes = reduce_lanes(k, s)
        if lanes != chain.lanes or (1 if lanes else kernel_rows_per_workgroup(k)) != chain.per_wg:
            return False
    own = {id(t) for t in k.outs}
    memo: dict = {}  # id(tensor) -> whether it reads a chain output (only those are walked)
    try:
        for t, _, _ in pts:
            _reaches(s, own, t, set(chain.row_of), memo)
    except _Unknown:
        return False
    for t, _, row_of_point in pts:
        if not memo[id(t)]:
            continue
        reads: list = []
        _reads(s, own, t, None, reads, memo)
        block = chain.workgroup(row_of_point())  # the workgroup that computes each point
        for base, elems in reads:
            _, per_row = chain.row_of[id(base)]
            if not np.array_equal(chain.workgroup(elems // per_row), block):
                return False
    return True


def fuse(s: KernelSchedule, p: Plan, codes: list[KernelCode], prefix: str) -> list[tuple[list[int], KernelCode]]:
    """The kernels as units in dispatch order: (kernel indices, code), a row chain's code being
    one kernel that runs its members as stages."""
    prints = [merge.footprint(k, p, c) for k, c in zip(s.kernels, codes)]
    sources = [merge.parse(c.wgsl) for c in codes]
    cut = s.update_from if s.update_from is not None else len(codes)
    units: list[Chain | None] = []  # a Chain, or None for a kernel that heads none
    members: list[list[int]] = []

    def head(i: int) -> Chain | None:
        k = s.kernels[i]
        if k.kind != "reduce" or sources[i].wg not in (WG, ROW_WG) or not prints[i].known:
            return None
        n_out, n_red = k.reduce_space()
        if any(t.size != n_out for t in k.outs):
            return None
        lanes = reduce_lanes(k, s)
        per_wg = 1 if lanes else kernel_rows_per_workgroup(k)
        return Chain([i], n_out, per_wg, sources[i].wg, {id(t): (i, 1) for t in k.outs}, lanes)

    def joins(j: int, c: Chain) -> bool:
        k = s.kernels[j]
        if len(c.members) >= MAX_STAGES or k.kind not in ("reduce", "elementwise"):
            return False
        # a reduction stage has the chain's workgroup; an elementwise one is walked by it
        if sources[j].wg != (c.wg if k.kind == "reduce" else WG):
            return False
        # an elementwise stage is called with flat element indices (not one that walks tiles), and
        # walks a run of rows per workgroup (not the lanes of a reduce_lanes chain)
        if k.kind == "elementwise" and ([b for b, _, _ in sources[j].params] != ["global_invocation_id"] or c.lanes):
            return False
        if (j < cut) != (c.members[0] < cut) or not prints[j].known:
            return False
        if k.kind == "elementwise" and c.per_wg * (k.out.size // c.rows) > MAX_PER_INVOCATION * c.wg:
            return False
        reads = [r for m in c.members for r in prints[m].reads]
        writes = [w for m in c.members for w in prints[m].writes]
        if merge.overlap(prints[j].writes, reads + writes):
            return False
        for b in k.reads:  # what it reads of the chain's memory must be the chain's own outputs
            loc = p.loc.get(id(b))
            if loc is None or (
                merge.overlap([(loc.arena, loc.offset, loc.offset + max(b.size, 1))], writes) and id(b) not in c.row_of
            ):
                return False
        parts = [sources[m] for m in c.members] + [sources[j]]
        arenas = {a for q in parts for a in q.bindings}
        wg_bytes = sum(merge._BYTES.get(ty, 16) * n for q in parts for _, ty, n in q.wg_vars)
        if len(arenas) > merge.MAX_STORAGE_BINDINGS or wg_bytes > merge.MAX_WORKGROUP_BYTES:
            return False
        if merge.writes_a_vec4_view(parts):
            return False
        return _local(s, k, c)

    for j in range(len(codes)):
        last = max((u for u, ms in enumerate(members) if any(merge.conflicts(prints[j], prints[m]) for m in ms)), default=-1)
        c = units[last] if last >= 0 else None
        if c is not None and joins(j, c):
            k = s.kernels[j]
            per_row = k.out.size // c.rows if k.kind == "elementwise" else 1
            c.members.append(j)
            c.row_of.update({id(t): (j, per_row) for t in k.outs})
            continue
        units.append(head(j))
        members.append(units[-1].members if units[-1] is not None else [j])
    out = []
    for c, ms in zip(units, members):
        out.append((ms, codes[ms[0]] if len(ms) == 1 else render(s, c, [codes[m] for m in ms], prefix)))
    return out


def render(s: KernelSchedule, c: Chain, codes: list[KernelCode], prefix: str) -> KernelCode:
    parts = [merge.parse(k.wgsl) for k in codes]
    name = merge.merged_name([k.name for k in codes], prefix, "_then_")
    renames = [{v: f"k{j}_{v}" for v, _, _ in q.wg_vars} for j, q in enumerate(parts)]
    what = "one row" if c.per_wg == 1 else f"{c.per_wg} rows"
    out = [
        f"// {name}: {len(parts)} kernels over the same {c.rows} rows as stages of one: each workgroup",
        f"// takes {what} through every stage, a barrier making a stage's stores visible to the next",
    ]
    for q in parts:
        out += ["//"] + q.header
    out += merge.binding_lines(parts)
    decls = [f"var<workgroup> {renames[j][v]}: array<{ty}, {n}>;" for j, q in enumerate(parts) for v, ty, n in q.wg_vars]
    if decls:
        out += [""] + decls
    out += merge.part_bodies(parts, renames)
    grid = codes[0].grid
    out += [
        "",
        f"@compute @workgroup_size({c.wg})",
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {",
    ]
    builtin = {
        "workgroup_id": "wid", "local_invocation_index": "lid", "local_invocation_id": "vec3<u32>(lid, 0u, 0u)",
        "global_invocation_id": f"vec3<u32>(wid.x * {c.wg}u + lid, wid.y, wid.z)",
    }
    for j, (m, q, k) in enumerate(zip(c.members, parts, codes)):
        if j:
            out.append("    storageBarrier();")
        if s.kernels[m].kind == "reduce":  # the same rows, so the same grid as the first stage
            assert k.grid == grid, (k.name, k.grid, grid)
            out.append(f"    k{j}_main({', '.join(builtin[b] for b, _, _ in q.params)});")
        else:  # elementwise: the elements of this workgroup's rows, in order
            span = c.per_wg * (s.kernels[m].out.size // c.rows)
            w = f"(wid.x + wid.y * {grid[0]}u)" if grid[1] > 1 else "wid.x"
            out += [
                f"    for (var e = lid; e < {span}u; e = e + {c.wg}u) {{",
                f"        k{j}_main(vec3<u32>({w} * {span}u + e, 0u, 0u));",
                "    }",
            ]
    out += ["}", ""]
    return KernelCode(
        name, "\n".join(out), merge.union_bindings(k.bindings for k in codes), grid,
        " ; ".join(k.ops for k in codes), codes[0].site, None, parts=codes, kind="chain",
    )
