"""Kernels -> dispatches: independent kernels share one dispatch (horizontal fusion).

A dispatch costs a few microseconds whatever it computes (the barrier wgpu puts between two
dispatches that touch the same buffer drains the GPU), so a small model is bound by how many it
has, and many of its kernels do not depend on each other: a layer's dX and dW products, the q/k/v
projections of one input, LayerNorm's row and column reductions. Kernels whose memory footprints
(from the plan: what each reads and writes) do not conflict run as one dispatch: each keeps its own
range of workgroups and its own code, called as a function from one entry point.

Rules (each checked here, not assumed):
- a kernel joins the earliest dispatch after the last one it conflicts with (it reads what that
  one writes, writes what it reads, or writes where it writes), so every read still sees the
  value the sequential order gives it: the same operations in the same order, so the same
  results (bit for bit on lavapipe; a GPU driver may contract a*b + c into an FMA differently
  inside a larger shader);
- never across a training graph's cut (the data-parallel split at `update_from`);
- the parts share a workgroup size; a part with a smaller one joins only if it has no barrier
  (it runs on the first invocations of each workgroup);
- workgroup memory is shared between parts (a workgroup runs one part), pooled by element type,
  within WebGPU's default 16 KiB; at most 8 storage buffers in all.
Only the GPU kernel set is merged. On a CPU adapter a dispatch costs little, and merged kernels
ran slower there (lavapipe: the addition transformer's step 1.4x slower, the same with parts of
equal barrier use), so the CPU set dispatches every kernel on its own (`dispatches_cpu` in the
package's entry table, which the runtime swaps in).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .codegen import MAX_STORAGE_BINDINGS, KernelCode, _grid
from .plan import Plan, arena_binding, arena_dtype, buffer_of, same_access
from .schedule import LARGE_MATMUL, Kernel, KernelSchedule

MAX_PARTS = 8  # kernels in one dispatch: beyond this the branch chain outgrows what it saves
# Kernels larger than this (multiply-adds or elements, `work`) keep a dispatch of their own: they
# take far longer than the dispatch they would save, and one shader holding two parts is compiled
# for the needs of both (registers, workgroup memory), which slowed transformer_large's 7% on an H100.
MAX_WORK = LARGE_MATMUL  # a kernel this large dispatches alone
MAX_WORKGROUP_BYTES = 16384  # WebGPU's default maxComputeWorkgroupStorageSize

_BINDING = re.compile(r"^@group\(0\) @binding\(\d+\) var<storage, (read|read_write)> (\w+): array<[\w<>]+>;\n", re.M)
_WG_VAR = re.compile(r"^var<workgroup> (\w+): array<(.+), (\d+)>;\n", re.M)
_WG_DECL = re.compile(r"^(?://.*\n)*var<workgroup> .*\n", re.M)  # with the comment above it
_FN = re.compile(r"^fn (\w+)\(", re.M)
_ENTRY = re.compile(r"^@compute @workgroup_size\((\d+)\)\nfn main\((.*)\) \{$", re.M)
_BUILTIN = re.compile(r"@builtin\((\w+)\) (\w+): ([\w<>]+)")
_BYTES = {"f32": 4, "u32": 4, "i32": 4, "vec2<f32>": 8, "vec4<f32>": 16}


@dataclass
class Source:
    """One kernel's WGSL taken apart: what a dispatch of several kernels needs to recombine it."""

    header: list[str]  # its leading comment lines
    bindings: dict[str, str]  # arena -> access
    wg: int  # workgroup size
    params: list[tuple[str, str, str]]  # main's (builtin, name, type)
    wg_vars: list[tuple[str, str, int]]  # (name, element type, length)
    body: str  # everything else: helpers, functions, then main's body as `fn main(...)`
    barrier: bool  # it synchronizes its workgroup


def parse(wgsl: str) -> Source:
    lines = wgsl.split("\n")
    n_head = next(i for i, line in enumerate(lines) if not line.startswith("//"))
    header, rest = lines[:n_head], "\n".join(lines[n_head:])
    bindings = {arena: acc for acc, arena in _BINDING.findall(rest)}
    wg_vars = [(n, ty, int(k)) for n, ty, k in _WG_VAR.findall(rest)]
    entry = _ENTRY.search(rest)
    if entry is None or len(_ENTRY.findall(rest)) != 1:
        raise ValueError("a kernel's source has no single `@compute @workgroup_size(n) fn main(...)`")
    params = _BUILTIN.findall(entry.group(2))
    rest = rest[: entry.start()] + "fn main(" + ", ".join(f"{n}: {ty}" for _, n, ty in params) + ") {" + rest[entry.end() :]
    body = _WG_DECL.sub("", _BINDING.sub("", rest))
    return Source(header, bindings, int(entry.group(1)), params, wg_vars, body, "Barrier(" in body or "workgroupUniformLoad" in body)


def _pools(parts: list[Source]) -> tuple[dict[tuple[str, int], int], list[dict[str, str]]]:
    """Workgroup arrays shared by the parts: slot (type, i) -> length, and each part's renaming."""
    slots: dict[tuple[str, int], int] = {}
    renames = []
    for p in parts:
        mine, count = {}, {}
        for name, ty, n in sorted(p.wg_vars, key=lambda v: -v[2]):
            i = count.get(ty, 0)
            count[ty] = i + 1
            slots[(ty, i)] = max(slots.get((ty, i), 0), n)
            mine[name] = _pool_name(ty, i)
        renames.append(mine)
    return slots, renames


def _pool_name(ty: str, i: int) -> str:
    return "wg_" + re.sub(r"\W", "", ty.replace("<f32>", "f")) + f"_{i}"


def _pool_bytes(slots) -> int:
    return sum(_BYTES.get(ty, 16) * n for (ty, _), n in slots.items())


def _fits(parts: list[Source], limit: int) -> bool:
    """One workgroup size for all; smaller parts only without barriers; memory; bindings."""
    wg = max(p.wg for p in parts)
    if any(p.wg != wg and p.barrier for p in parts):
        return False
    arenas = {a for p in parts for a in p.bindings}
    return (
        len(arenas) <= MAX_STORAGE_BINDINGS
        and not writes_a_vec4_view(parts)
        and _pool_bytes(_pools(parts)[0]) <= limit
    )


def writes_a_vec4_view(parts: list[Source]) -> bool:
    """Whether one part reads a buffer through its vec4 alias (a matmul, only ever read-only) while
    another writes the buffer: together they would bind it read_write twice, which WebGPU (Dawn)
    rejects, and a matmul's vec4 reads are slow through read_write bindings anyway."""
    written = {buffer_of(a) for p in parts for a, acc in p.bindings.items() if acc == "read_write"}
    return any(a != buffer_of(a) and buffer_of(a) in written for p in parts for a in p.bindings)


def combine(name: str, parts: list[Source], grids: list[tuple[int, int, int]]) -> tuple[str, tuple[int, int, int]]:
    """The WGSL of one dispatch running `parts`, each over its own grid, and the dispatch's grid."""
    wg = max(p.wg for p in parts)
    slots, renames = _pools(parts)
    counts = [gx * gy * gz for gx, gy, gz in grids]
    grid = _grid(sum(counts))
    out = [f"// {name}: {len(parts)} independent kernels in one dispatch, each over its own workgroups"]
    for p in parts:
        out += ["//"] + p.header
    out += binding_lines(parts)
    if slots:
        out += ["", "// workgroup memory, shared by the kernels (a workgroup runs one of them)"]
        out += [f"var<workgroup> {_pool_name(ty, i)}: array<{ty}, {n}>;" for (ty, i), n in slots.items()]
    out += part_bodies(parts, renames)
    out += [
        "",
        f"@compute @workgroup_size({wg})",
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {",
        "    // workgroups numbered x fastest; each kernel runs on its own range of them",
        f"    let w = wid.x + wid.y * {grid[0]}u;" if grid[1] > 1 else "    let w = wid.x;",
    ]
    start = 0
    for j, (p, g, n) in enumerate(zip(parts, grids, counts)):
        cond = f"w < {start + n}u"
        out.append(f"    if ({cond}) {{" if j == 0 else f"    }} else if ({cond}) {{")
        v = "w" if start == 0 else "v"
        if start:
            out.append(f"        let v = w - {start}u;")
        gx, gy, gz = g
        if gy == gz == 1:
            wid = f"vec3<u32>({v}, 0u, 0u)"
        elif gz == 1:
            wid = f"vec3<u32>({v} % {gx}u, {v} / {gx}u, 0u)"
        else:
            wid = f"vec3<u32>({v} % {gx}u, {v} / {gx}u % {gy}u, {v} / {gx * gy}u)"
        args = []
        for builtin, _, _ in p.params:
            if builtin == "workgroup_id":
                args.append(wid)
            elif builtin == "local_invocation_index":
                args.append("lid")
            elif builtin == "local_invocation_id":
                args.append("vec3<u32>(lid, 0u, 0u)")
            elif builtin == "global_invocation_id":
                args.append(_global(wid, p.wg, gy, gz, v))
            else:
                raise ValueError(f"a kernel's main takes @builtin({builtin}), which a merged dispatch cannot pass")
        call = f"k{j}_main({', '.join(args)});"
        out.append(f"        if (lid < {p.wg}u) {{\n            {call}\n        }}" if p.wg != wg else f"        {call}")
        start += n
    out += ["    }", "}", ""]
    return "\n".join(out), grid


def union_bindings(lists) -> list[tuple[str, str]]:
    """(arena, access) pairs of several kernels as one kernel's bindings, in binding order:
    read_write where any of them writes."""
    access: dict[str, str] = {}
    for pairs in lists:
        for a, acc in pairs:
            access[a] = "read_write" if "read_write" in (acc, access.get(a)) else acc
    return sorted(same_access(access).items(), key=lambda kv: arena_binding(kv[0]))


def binding_lines(parts: list[Source]) -> list[str]:
    """The union of the parts' storage bindings as WGSL declarations."""
    return [
        f"@group(0) @binding({arena_binding(a)}) var<storage, {acc}> {a}: array<{arena_dtype(a)}>;"
        for a, acc in union_bindings(p.bindings.items() for p in parts)
    ]


def part_bodies(parts: list[Source], renames: list[dict[str, str]]) -> list[str]:
    """Each part's functions, renamed k{j}_<name> (its main becomes k{j}_main), and its workgroup
    arrays renamed as `renames` says."""
    out = []
    for j, (p, mine) in enumerate(zip(parts, renames)):
        mine = dict(mine, **{f: f"k{j}_{f}" for f in _FN.findall(p.body)})
        body = re.sub(r"\b(" + "|".join(map(re.escape, mine)) + r")\b", lambda m: mine[m.group(1)], p.body)
        out.append(re.sub(r"\n{3,}", "\n\n", "\n" + body.strip("\n")))
    return out


def _global(wid: str, wg: int, gy: int, gz: int, v: str) -> str:
    if gy == gz == 1:
        return f"vec3<u32>({v} * {wg}u + lid, 0u, 0u)" if wg > 1 else f"vec3<u32>({v}, 0u, 0u)"
    return f"vec3<u32>({wid}.x * {wg}u + lid, {wid}.y, {wid}.z)"


# --- which kernels may share a dispatch ---------------------------------------------------------


@dataclass
class Footprint:
    reads: list[tuple[str, int, int]]  # (arena, first element, end)
    writes: list[tuple[str, int, int]]
    known: bool = True  # False: a binding the plan does not account for; it merges with nothing


def footprint(k: Kernel, p: Plan, code: KernelCode) -> Footprint:
    def span(t):
        loc = p.loc.get(id(t))
        return None if loc is None else (loc.arena, loc.offset, loc.offset + max(t.size, 1))

    reads, writes = [span(t) for t in k.reads], [span(t) for t in k.stored_outs]
    known = None not in reads and None not in writes
    touched = {s[0] for s in reads + writes if s is not None}
    known = known and all(buffer_of(a) in touched for a, _ in code.bindings)
    return Footprint([s for s in reads if s], [s for s in writes if s], known)


def overlap(a, b) -> bool:
    """Two lists of (arena, start, end) element spans share an element."""
    return any(x[0] == y[0] and x[1] < y[2] and y[1] < x[2] for x in a for y in b)


def conflicts(a: Footprint, b: Footprint) -> bool:
    return not (a.known and b.known) or overlap(a.writes, b.reads + b.writes) or overlap(b.writes, a.reads)


def group(s: KernelSchedule, p: Plan, units: list[tuple[list[int], KernelCode]], limit: int = MAX_WORKGROUP_BYTES) -> list[list[int]]:
    """Unit indices per dispatch, in dispatch order (greedy: the earliest legal dispatch). A unit
    is a kernel, or a row chain of kernels (chain.py) that dispatches as one."""
    kprints = [footprint(k, p, c) for k, c in zip(s.kernels, _kernel_codes(units, len(s.kernels)))]
    prints = [
        Footprint([r for m in ms for r in kprints[m].reads], [w for m in ms for w in kprints[m].writes], all(kprints[m].known for m in ms))
        for ms, _ in units
    ]
    gpu = [parse(code.wgsl) for _, code in units]
    cut = s.update_from if s.update_from is not None else len(s.kernels)
    side = [ms[0] < cut for ms, _ in units]
    small = [sum(work(s.kernels[m]) for m in ms) <= MAX_WORK for ms, _ in units]
    groups: list[list[int]] = []
    for i in range(len(units)):
        last = -1  # the last dispatch this unit must follow
        for gi, members in enumerate(groups):
            if any(conflicts(prints[i], prints[j]) or side[i] != side[j] for j in members):
                last = gi
        for gi in range(last + 1, len(groups) if small[i] else 0):
            if not small[groups[gi][0]]:
                continue
            members = groups[gi] + [i]
            if len(members) <= MAX_PARTS and _fits([gpu[j] for j in members], limit):
                groups[gi].append(i)
                break
        else:
            groups.append([i])
    return groups


def _kernel_codes(units, n: int) -> list[KernelCode]:
    """Each kernel's own code, by kernel index, from units that may hold several."""
    out: list = [None] * n
    for ms, code in units:
        for m, part in zip(ms, code.parts if code.kind == "chain" else [code]):
            out[m] = part
    return out


def merged_name(names: list[str], prefix: str, joiner: str = "_and_") -> str:
    """train_055_matmul + train_056_fused_mul_sum -> train_055_056_matmul_and_fused_mul_sum."""
    idx, labels = [], []
    for n in names:
        i, label = n[len(prefix) + 1 :].split("_", 1)
        idx.append(i)
        labels.append(label)
    labels = list(dict.fromkeys(labels))
    return f"{prefix}_{'_'.join(idx)}_{joiner.join(labels[:3])}" + ("_etc" if len(labels) > 3 else "")


def merge(
    s: KernelSchedule, p: Plan, units: list[tuple[list[int], KernelCode]], prefix: str
) -> tuple[list[KernelCode], int | None, list[list[int]]]:
    """(the dispatches, the index of the first one at or after the schedule's cut, or None, and
    the scheduled kernels each dispatch runs: what buckets.py reads their gradient writes from)."""
    groups = group(s, p, units)
    kcodes = _kernel_codes(units, len(s.kernels))
    out = []
    for members in groups:
        if len(members) == 1:
            out.append(units[members[0]][1])
            continue
        ks = [units[j][1] for j in members]
        name = merged_name([kcodes[m].name for j in members for m in units[j][0]], prefix)
        grids = [k.grid for k in ks]
        wgsl, grid = combine(name, [parse(k.wgsl) for k in ks], grids)
        code = KernelCode(
            name, wgsl, union_bindings(k.bindings for k in ks), grid,
            " | ".join(k.ops for k in ks), ks[0].site, None, parts=ks, kind="merged",
        )
        # the same dispatch with the parts' subgroup variants (whose workgroups may be larger),
        # where they still fit together
        sub = [parse(k.wgsl_subgroup or k.wgsl) for k in ks]
        if any(k.wgsl_subgroup for k in ks) and _fits(sub, MAX_WORKGROUP_BYTES):
            code.wgsl_subgroup = combine(name, sub, grids)[0]
        out.append(code)
    cut = None
    if s.update_from is not None:
        cut = next((gi for gi, m in enumerate(groups) if units[m[0]][0][0] >= s.update_from), len(groups))
    return out, cut, [sorted(k for j in members for k in units[j][0]) for members in groups]


def work(k: Kernel) -> int:
    """A rough size of a kernel's work (multiply-adds, or elements read): merging saves a few
    microseconds a dispatch, which matters only for kernels that take about that long."""
    if k.kind == "matmul":
        mm = k.mm if k.mm is not None else k.out
        return mm.size * mm.node.inputs[0].shape[-1]
    if k.kind == "attention":
        q, key = k.node.inputs[0], k.node.inputs[1]
        return q.size * key.shape[-2] * 2
    if k.kind == "recurrent":  # every step's gate sums: T * B * 4H * H
        t, b, lanes = k.out.shape  # Y [T, B, 6H] or G [T, B, 5H]
        h = lanes // (6 if k.node.op == "lstm_seq" else 5)
        return t * b * 4 * h * h
    if k.kind == "reduce":
        return max(t.node.inputs[0].size for t in [k.out] + [g.out for g in k.group])
    return sum(t.size for t in k.outs)
