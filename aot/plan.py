"""KernelSchedule -> BufferPlan: every storage owner gets (buffer, element offset).

Buffers ("arenas") are fixed per package, so every kernel binds at most seven of them
(under WebGPU's default limit of 8 storage buffers per stage) whatever the graph:
  params      all parameters, flat in layout order (shared by every entry point)
  grads       the flat gradient vector of the last step
  state       optimizer state, flat, as long as params: adam.m | sgd.momentum (state_1: adam.v,
              a buffer of its own so that no state buffer is larger than the parameters;
              state_2: a third vector, adam.vmax or RMSprop's, only in programs that have one)
  inputs      f32 inputs and per-step scalars, packed; inputs_i32 the i32 inputs (inputs that
              together exceed one binding spill, each whole, into inputs_1, inputs_2, ... and
              inputs_i32_1, ...: first fit in declaration order, so a single tensor is the limit)
  work        intermediates, reused by liveness; work_i32 the i32 ones
  buffers     the model's buffers (Module.buffer), flat in declaration order; buffers_i32 the
              i32 ones (only in programs that have them: bindings after the fixed ones)
No buffer may exceed the storage-binding limit (WebGPU's default: 128 MiB), so intermediates
spill into more buffers of that size when they must (work_1, work_2, ...; work_i32_1, ...): a
tensor lives whole in one of them, placed first-fit over its lifetime. A kernel binds only the
buffers it touches, which stays within the 8 storage bindings of a shader stage (checked).
Updated params and state are written in place when the writing kernel is the last reader of
the old value and reads it only at the element it writes; otherwise a copy follows the pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .buffers import UPDATE_PREFIX
from .errors import CodegenError
from .intervals import Bin
from .ir import Tensor
from .schedule import KernelSchedule, _identity_reads, op_of

ALIGN = 64  # elements: 256-byte aligned tensors keep reads coalesced and offsets tidy
# A slot freed by a tensor's last read at kernel i is reused only by a tensor first written at
# kernel i + REUSE_GAP + 1 or later: reuse between near neighbours makes them conflict (one writes
# what the other reads), which keeps them from sharing a dispatch or a row chain (merge.py,
# chain.py). 2 costs +2% memory on the addition transformer and +1% on transformer_large, and
# takes their dispatches from 81 to 64 and 234 to 214 (sine_mlp: 8 to 7 for 66 KB). Where it
# costs more than GAP_MAX_COST times the memory and more than GAP_FREE elements (mnist_cnn +1.6 MB,
# flow_matching_tiny +6.4 MB: 15%) slots are reused at once instead.
REUSE_GAP = 2
GAP_MAX_COST = 1.03
GAP_FREE = 2**18  # elements (1 MiB)
ARENAS = ("params", "grads", "state", "inputs", "inputs_i32", "work", "work_i32", "state_1")
# Module.buffer storage, f32 and i32: bound after ARENAS (so a program without buffers keeps its
# binding numbers), and allocated only by programs that have them.
BUFFER_ARENAS = ("buffers", "buffers_i32")
# a third optimizer state vector (Adam(amsgrad=True), RMSprop(centered=True, momentum>0)): bound
# after the buffer arenas and listed only by programs that have one, like them
OPTIONAL_ARENAS = ("state_2",)
DEFAULT_MAX_BINDING_MIB = 128  # WebGPU's default maxStorageBufferBindingSize (browsers, lavapipe)


# Arenas that spill into more buffers (work_1, work_i32_1, inputs_1, inputs_i32_1, work_2, ...):
# the k-th spill buffer of each family is bound after the fixed arenas, the families interleaved
# (a program binds only those it has; the numbers between stay empty 4-byte buffers).
SPILLS = ("work", "work_i32", "inputs", "inputs_i32")
SPILL_FAMILIES = len(SPILLS)


def chunk_name(arena: str, k: int) -> str:
    """The k-th buffer of a scratch arena: work, work_1, work_2, ..."""
    return arena if k == 0 else f"{arena}_{k}"


# A buffer bound a second time as array<vec4<f32>> (matmul slab loads read 4 floats at once
# through it: matmul_codegen.Operand.vec_buf) is named for it, arena + VEC_SUFFIX, and bound at
# VEC_BINDING_BASE + the arena's binding (WebGPU allows 1000 binding numbers a group).
VEC_SUFFIX = "_v4"
VEC_BINDING_BASE = 500


# The CPU kernel set's offset tables (codegen: a kernel of the CPU set reads where its tensors
# start from a uniform struct instead of constants, so kernels that differ only there share one
# compiled pipeline): the runtimes give each such kernel of an entry point a 256-byte slot (WebGPU's
# minUniformBufferOffsetAlignment) of a uniform buffer bound at OFFSETS_BINDING with a dynamic offset.
OFFSETS_BINDING = 400
OFFSETS_SLOT_WORDS = 64  # 256 bytes: a kernel's table holds at most 64 offsets (the rest are written in)


def vec_alias(arena: str) -> str:
    return arena + VEC_SUFFIX


def buffer_of(binding_name: str) -> str:
    """The arena a binding name refers to: itself, or the arena a vec4 alias views."""
    return binding_name[: -len(VEC_SUFFIX)] if binding_name.endswith(VEC_SUFFIX) else binding_name


def arena_binding(arena: str) -> int:
    """Every kernel binds a buffer at the same number (so neighbours share bind groups): the
    fixed arenas first, then extra scratch buffers interleaved f32/i32 (work_1, work_i32_1, ...);
    vec4 aliases VEC_BINDING_BASE above their arena."""
    if arena.endswith(VEC_SUFFIX):
        return VEC_BINDING_BASE + arena_binding(buffer_of(arena))
    if arena in ARENAS:
        return ARENAS.index(arena)
    if arena in BUFFER_ARENAS:
        return len(ARENAS) + BUFFER_ARENAS.index(arena)
    if arena in OPTIONAL_ARENAS:
        return len(ARENAS) + len(BUFFER_ARENAS) + OPTIONAL_ARENAS.index(arena)
    base, k = arena.rsplit("_", 1)
    n = len(ARENAS) + len(BUFFER_ARENAS) + len(OPTIONAL_ARENAS) + SPILL_FAMILIES * (int(k) - 1) + SPILLS.index(base)
    if n >= OFFSETS_BINDING:
        raise CodegenError(f"{arena}: more scratch buffers than binding numbers; build with a larger --max-binding-mib")
    return n


def arena_dtype(arena: str) -> str:
    if arena.endswith(VEC_SUFFIX):
        return "vec4<f32>"
    return "i32" if arena == "buffers_i32" or arena.startswith(("work_i32", "inputs_i32")) else "f32"


def is_input_arena(arena: str) -> bool:
    """inputs, inputs_i32 and their spill buffers (inputs_1, inputs_i32_1, ...)."""
    return arena.startswith("inputs")


def same_access(access: dict[str, str]) -> dict[str, str]:
    """A kernel's (binding -> access) with every vec4 alias given its arena's access where the
    kernel binds both: WebGPU rejects a dispatch that sees one buffer as both read-only and
    writable storage."""
    return {a: access.get(buffer_of(a), acc) for a, acc in access.items()}


@dataclass(frozen=True)
class Loc:
    arena: str
    offset: int


@dataclass
class Plan:
    loc: dict[int, Loc]
    sizes: dict[str, int]  # elements each arena needs for this graph
    inputs: list[tuple[str, str, tuple, Loc]]  # (name, dtype, shape, location)
    copies: list[tuple[Loc, Loc, int]] = field(default_factory=list)  # after the pass: src, dst, elements
    work_unpooled: int = 0  # elements the work arena would need with one slot per tensor
    work_peak_live: int = 0  # largest sum of intermediates alive at once: the bound for any packing

    def read_loc(self, s: KernelSchedule, t: Tensor) -> tuple[Loc, tuple]:
        """Where element (0, ...) of t lives, and t's per-axis sub-dims."""
        v = s.views[id(t)]
        base = self.loc[id(v.base)]
        return Loc(base.arena, base.offset + v.offset), v.dims


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def state_arena(i: int) -> str:
    """The buffer of the optimizer's i-th state vector."""
    return "state" if i == 0 else f"state_{i}"


@dataclass
class BufferTable:
    """Where each Module.buffer lives (name -> Loc in buffers / buffers_i32) and the arenas' sizes."""

    locs: dict[str, Loc] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # only the arenas the program uses

    @classmethod
    def of(cls, entries) -> "BufferTable":
        """From the front end's BufferEntry list."""
        t = cls()
        for b in entries:
            arena = BUFFER_ARENAS[b.dtype == "i32"]
            t.locs[b.name] = Loc(arena, b.offset)
            t.sizes[arena] = max(t.sizes.get(arena, 0), b.offset + b.size)
        return t


def plan(
    s: KernelSchedule,
    state_arenas: dict[str, str],
    param_total: int,
    max_binding_mib: float = DEFAULT_MAX_BINDING_MIB,
    matmuls_apart: bool = True,
    buffers: BufferTable | None = None,
) -> Plan:
    """Where every tensor lives: the persistent arenas, then scratch packed by liveness into
    buffers of at most `max_binding_mib`. `matmuls_apart=False` packs without keeping matmul
    outputs out of their operands' buffers (for comparison: it should cost no memory)."""
    g = s.graph
    cap = int(max_binding_mib * 2**20) // 4 // ALIGN * ALIGN  # elements per buffer
    loc: dict[int, Loc] = {}
    buffers = buffers or BufferTable()
    sizes = dict.fromkeys(ARENAS, 0)
    sizes["params"] = param_total
    sizes.update(buffers.sizes)
    for t in s.owners:
        if t.node.op == "param":  # the params arena sentinel
            loc[id(t)] = Loc("params", 0)

    # inputs: packed in declaration order, f32 and i32 separately
    # a training entry's slices (frontend: its range of the params, its offset in grads and state)
    p_start, p_end, slot = g.meta.get("train_range", (0, param_total, 0))
    inputs = []
    for n in g.nodes:
        if n.op == "input":
            width = max(n.out.size, 1)
            arena = _input_buffer(sizes, n.out.dtype, width, cap)
            loc[id(n.out)] = Loc(arena, sizes.get(arena, 0))
            inputs.append((n.attrs["name"], n.out.dtype, n.out.shape, loc[id(n.out)]))
            sizes[arena] = sizes.get(arena, 0) + width
        elif n.op == "state":
            arena = state_arenas[n.attrs["name"]]
            loc[id(n.out)] = Loc(arena, slot)
            sizes[arena] = max(sizes.get(arena, 0), slot + n.out.size)
        elif n.op == "buffer":
            loc[id(n.out)] = buffers.locs[n.attrs["name"]]

    index = {id(t): i for i, k in enumerate(s.kernels) for t in k.outs}
    readers: dict[int, list[int]] = {}
    for i, k in enumerate(s.kernels):
        for r in k.reads:
            readers.setdefault(id(r), []).append(i)

    # the flat gradient vector lives in the persistent grads arena
    if "grads" in g.persist:
        v = s.views.get(id(g.persist["grads"]))
        if v is None or v.offset != 0 or not v.is_contiguous(g.persist["grads"].shape) or v.base.size != p_end - p_start:
            raise CodegenError(f"{g.name}: the flat gradient vector is not a contiguous buffer")
        if id(v.base) not in loc:
            loc[id(v.base)] = Loc("grads", slot)
            sizes["grads"] = slot + p_end - p_start

    # writebacks: in place when safe, else a copy after the pass
    copies = []
    for name, t in g.updates.items():
        if name.startswith(UPDATE_PREFIX):  # aot.assign: the buffer's storage
            dst = buffers.locs[name[len(UPDATE_PREFIX) :]]
        else:
            dst = Loc("params", p_start) if name == "params" else loc[id(_state_leaf(g, name))]
        target_base = _target_base(s, g, name)
        v = s.views.get(id(t))
        src_owner = v.base if v is not None else None
        if (
            src_owner is not None
            and v.offset == 0
            and v.is_contiguous(t.shape)
            and id(src_owner) not in loc
            and id(src_owner) not in s.placed
            and op_of(src_owner).fusion != "leaf"
            and _in_place_ok(s, index, readers, src_owner, target_base, dst.offset if name == "params" else 0)
        ):
            loc[id(src_owner)] = dst
        else:
            copies.append((t, dst))

    # placed owners follow their concat; everything else goes to work by liveness
    def root(t: Tensor) -> Tensor:
        while id(t) in s.placed:
            t = s.placed[id(t)][0]
        return t

    intervals: dict[int, list] = {}
    end_of_step = len(s.kernels)
    for t in s.owners:
        if id(t) in loc or op_of(t).fusion == "leaf":
            continue
        r = root(t)
        if id(r) in loc:
            continue
        start = index.get(id(t), 0)
        end = max(readers.get(id(t), [start]))
        iv = intervals.setdefault(id(r), [r, start, end])
        iv[1], iv[2] = min(iv[1], start), max(iv[2], end)
    # outputs, captures and copied writebacks are read after the pass
    late = [s.views[id(x)].base for grp in (g.outputs, g.captures) for x in grp.values()] + [
        s.views[id(t)].base for t, _ in copies if id(t) in s.views
    ]
    for b in late:
        r = root(b)
        if id(r) in intervals:
            intervals[id(r)][2] = end_of_step
    # A large matmul reads its operands faster through read-only bindings (codegen._matmul), which
    # it may use only for buffers it does not write: where the work arena spans several buffers,
    # keep each one's output apart from what it reads.
    apart: dict[int, set[int]] = {}
    for k in s.kernels:
        if not k.large or not matmuls_apart:
            continue
        outs = {id(root(t)) for t in k.stored_outs}
        for r in k.reads:
            for o in outs:
                if id(root(r)) != o:
                    apart.setdefault(o, set()).add(id(root(r)))
                    apart.setdefault(id(root(r)), set()).add(o)
    for arena, dtype in (("work", "f32"), ("work_i32", "i32")):
        items = [iv for iv in intervals.values() if iv[0].dtype == dtype]
        for t, _, _ in items:
            if _align(max(t.size, 1)) > cap:
                _too_large(g, f"the intermediate {t.node.op} result {t.type_str()}", t, t.size, max_binding_mib)
        for k, n in enumerate(_pack_with_gap(items, loc, arena, cap, apart)):
            sizes[chunk_name(arena, k)] = n
    optional = tuple(a for a in OPTIONAL_ARENAS if a in sizes)
    for name, dtype, shape, at in inputs:  # after the intermediates, whose errors name a call site
        if sizes[at.arena] > cap:
            t = next(n.out for n in g.nodes if n.op == "input" and n.attrs["name"] == name)
            _too_large(g, f"the input {name!r} {t.type_str()}", t, sizes[at.arena], max_binding_mib)
    spilled = tuple(a for a in sizes if is_input_arena(a) and a not in ARENAS)
    for arena in ("params", "grads", "state", "state_1", "inputs", "inputs_i32") + spilled + tuple(buffers.sizes) + optional:
        if sizes[arena] > cap:
            _too_large(g, f"the {arena} buffer", None, sizes[arena], max_binding_mib)
    for t in s.owners:
        if id(t) not in loc and id(t) in s.placed:
            r, off = t, 0
            while id(r) in s.placed:
                r, o = s.placed[id(r)]
                off += o
            base = loc[id(r)]
            loc[id(t)] = Loc(base.arena, base.offset + off)
    missing = [t for t in s.owners if id(t) not in loc]
    if missing:
        raise CodegenError(f"{g.name}: no storage planned for {len(missing)} tensors")

    copy_list = []
    for t, dst in copies:
        v = s.views.get(id(t))
        if v is None or not v.is_contiguous(t.shape):
            raise CodegenError(f"{g.name}: writeback source is not contiguous")
        src = loc[id(v.base)]
        copy_list.append((Loc(src.arena, src.offset + v.offset), dst, t.size))
    unpooled = sum(_align(iv[0].size) for iv in intervals.values())
    live = [0] * (end_of_step + 1)
    for t, start, end in intervals.values():
        for i in range(start, end + 1):
            live[i] += t.size
    return Plan(loc, sizes, inputs, copy_list, unpooled, max(live, default=0))


def _input_buffer(sizes: dict[str, int], dtype: str, width: int, cap: int) -> str:
    """The first input buffer of `dtype` with room for `width` more elements (inputs, inputs_1,
    ...): inputs that fit one binding together keep sharing it (one upload per call), and those
    that do not get buffers of their own instead of refusing the program."""
    base, k = ("inputs" if dtype == "f32" else "inputs_i32"), 0
    while sizes.get(chunk_name(base, k), 0) and sizes[chunk_name(base, k)] + width > cap:
        k += 1
    return chunk_name(base, k)


def _state_leaf(g, name):
    for n in g.nodes:
        if n.op == "state" and n.attrs["name"] == name:
            return n.out
    raise CodegenError(f"{g.name}: update of unknown state {name!r}")


def _target_base(s: KernelSchedule, g, name) -> Tensor | None:
    """The storage owner an update overwrites; None for a buffer the graph never reads."""
    if name == "params":
        return next(t for t in s.owners if t.node.op == "param")
    if name.startswith(UPDATE_PREFIX):
        bname = name[len(UPDATE_PREFIX) :]
        return next((n.out for n in g.nodes if n.op == "buffer" and n.attrs["name"] == bname), None)
    return _state_leaf(g, name)


def _in_place_ok(s: KernelSchedule, index, readers, owner: Tensor, target: Tensor | None, offset: int = 0) -> bool:
    """The writer must be the last kernel to read the target, and read it only elementwise
    (at its own index, from `offset` on: a training entry's slice of the params)."""
    w = index.get(id(owner))
    if w is None:
        return False
    k = s.kernels[w]
    if k.kind != "elementwise" or owner.ndim != 1:
        return False
    if target is None:  # nothing reads the old value
        return True
    if any(i > w for i in readers.get(id(target), [])):
        return False
    return all(_identity_reads(s, out, target, offset) for out in k.outs)


def _too_large(g, what: str, t: Tensor | None, elements: int, mib: float):
    site = f" (from {t.node.site.short})" if t is not None and t.node.site else ""
    raise CodegenError(
        f"{g.name}: {what}{site} needs {4 * elements} bytes ({4 * elements / 2**20:.1f} MiB), more than "
        f"one storage binding may hold ({mib:g} MiB). Make it smaller (a smaller batch, say), or build with "
        f"`python -m aot build --max-binding-mib N` for adapters that allow more (WebGPU's default and "
        f"lavapipe's limit is 128; GPUs allow up to 2048 when asked)"
    )


def _pack_with_gap(items, loc, arena, cap: int, apart: dict | None = None) -> list[int]:
    """_pack with REUSE_GAP where that costs little memory (GAP_MAX_COST, GAP_FREE), else without."""
    spaced, tight = {}, {}
    a, b = _pack(items, spaced, arena, cap, REUSE_GAP, apart), _pack(items, tight, arena, cap, 0, apart)
    use_gap = len(a) == len(b) and sum(a) <= max(GAP_MAX_COST * sum(b), sum(b) + GAP_FREE)
    loc.update(spaced if use_gap else tight)
    return a if use_gap else b


def _pack(items, loc, arena, cap: int, gap: int = 0, apart: dict | None = None) -> list[int]:
    """Greedy by size: largest first, at the lowest offset free over its whole lifetime (widened
    by `gap` kernels), in the first buffer of the arena where it fits under `cap` elements.
    `apart` (tensor id -> ids of tensors it had better not share a buffer with: a matmul's output
    and what it reads) moves a tensor to a later buffer where it fits with no more growth than in
    the first, away from those already placed. Returns each buffer's size."""
    apart = apart or {}
    bins: list[Bin] = []  # per buffer: what is placed there (offset, size, start, end)
    tops: list[int] = []
    where: dict[int, int] = {}  # tensor id -> its buffer

    def first_free(k: int, size: int, start: int, end: int) -> int:
        return bins[k].first_free(size, start, end, gap)

    for t, start, end in sorted(items, key=lambda iv: (-iv[0].size, iv[1], iv[2])):
        size = _align(max(t.size, 1))
        fits = {}  # buffer -> offset, for the existing buffers where t fits
        for k in range(len(bins)):
            off = first_free(k, size, start, end)
            if off + size <= cap:
                fits[k] = off
        if fits:
            k = min(fits)
            growth = max(0, fits[k] + size - tops[k])
            avoid = {where[o] for o in apart.get(id(t), ()) if o in where}
            if k in avoid:
                k = next((j for j in sorted(fits) if j not in avoid and fits[j] + size - tops[j] <= growth), k)
            off = fits[k]
        else:
            bins.append(Bin())
            tops.append(0)
            k, off = len(bins) - 1, 0
        bins[k].add(off, size, start, end)
        where[id(t)] = k
        loc[id(t)] = Loc(chunk_name(arena, k), off)
        tops[k] = max(tops[k], off + size)
    return tops or [0]
