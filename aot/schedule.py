"""Graph -> KernelSchedule: the fusion stage. Decides which tensors get storage, which are plain
views of storage, and which kernels run.

Rules (why in brackets):
- leaves and the outputs of matmul / reductions own storage [their kernels write it];
- an elementwise or layout node is inlined into every consumer's kernel when it has one
  consumer, or is pure index arithmetic (broadcast_to, reshape, transpose, narrow, const,
  arange) [recomputing costs nothing, materializing costs a kernel and a round trip];
- reshape / transpose / narrow / broadcast_to of storage are views: strided reads of the
  same storage, no copy [tensorgrad copies for every reshape];
- matmul, attention and recurrent operands must be strided views; anything else is materialized first
  (and so is a strided view where the kernel reads an operand row-major: OpDef.contiguous);
- a concat along its leading axis is assembled in place: each input's producer writes
  straight into its slice, and a concat of adjacent slices of one buffer is a view
  [the flat gradient vector costs nothing];
- a matmul whose result feeds a chain of single-use pointwise ops computes the chain in
  its epilogue [bias + activation never touch memory];
- a node with several consumers is still recomputed in each when its inlined expression
  is cheap (RECOMPUTE_BUDGET) [x - mean in LayerNorm: a kernel and a round trip saved];
  except the input of a selecting reduction (max, argmax) with other readers, which is stored
  [x - max(x) must be exactly 0 at the max, and max's VJP finds the max by equality: each
  kernel's recomputation rounds differently (FMA contraction, reassociation)];
- kernels are merged when the later one consumes the earlier one's outputs element for
  element over the same index space: elementwise into its elementwise reader [Adam's m, v
  and p: one kernel], an elementwise reader into a matmul or reduction epilogue [relu after
  bias, the loss scale], and reductions over the same index space into one loop [LayerNorm's
  two weight-gradient sums];
- a training graph is cut in two: every kernel that writes the flat gradient vector runs before
  every kernel of the optimizer update (what is computed from that vector), and no kernel does
  both [the runtime can read the gradients, all-reduce them across processes, upload the result
  and run the rest: `update_from`, checked on every build by check_cut];
- attention kernels whose ops share an OpDef.sibling key, the later reading only what the earlier
  reads, are one kernel [the forward pass writes O and the logsumexp the backward pass reads;
  dk and dv walk the same queries with the same probabilities].
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import CodegenError
from .ir import Graph, Node, Tensor
from .matmul_codegen import LARGE_MATMUL
from .ops.registry import OpDef, lookup
from .views import View

# inlined ops a multi-consumer node may cost and still be recomputed by every consumer
RECOMPUTE_BUDGET = 3


def op_of(t_or_node) -> OpDef:
    """The op record of a tensor's producer (or of a node): every fusion fact comes from there."""
    n = t_or_node.node if isinstance(t_or_node, Tensor) else t_or_node
    return lookup(n.op)


# OpDef.sibling keys whose ops keep kernels of their own (scripts/bench_attention.py's `dkv=0`
# times attention's key-side gradients apart, as they were before they shared a kernel)
SEPARATE_SIBLINGS: tuple[str, ...] = ()


@dataclass(eq=False)
class Kernel:
    kind: str  # "elementwise" | "reduce" | "matmul" | "attention" | "recurrent"
    out: Tensor  # the tensor the kernel writes (last)
    node: Node  # matmul/reduce node, or out.node
    mm: Tensor | None = None  # the matmul result, read as `acc` by a fused epilogue
    reads: list[Tensor] = field(default_factory=list)  # storage-owning tensors it reads
    first: list[Tensor] = field(default_factory=list)  # merged elementwise outputs, written before `out`
    after: list[Tensor] = field(default_factory=list)  # elementwise outputs computed in the epilogue
    group: list["Kernel"] = field(default_factory=list)  # sibling reductions (attention ops) sharing this loop
    unstored: set[int] = field(default_factory=set)  # ids of results no one reads from memory (_mark_unstored)

    @property
    def outs(self) -> list[Tensor]:
        return [t for g in self.group for t in g.outs] + self.first + [self.out] + self.after

    @property
    def stored_outs(self) -> list[Tensor]:
        """What the kernel writes to memory: its outputs but the results it keeps in registers."""
        return [t for t in self.outs if id(t) not in self.unstored]

    @property
    def large(self) -> bool:
        """A matmul of more than LARGE_MATMUL multiply-adds: long enough that a dispatch of its own
        costs nothing (merge.py leaves it alone), and worth read-only operands (codegen._matmul)."""
        if self.kind != "matmul":
            return False
        mm = self.mm if self.mm is not None else self.out
        return mm.size * mm.node.inputs[0].shape[-1] > LARGE_MATMUL

    def reduce_space(self) -> tuple[int, int] | None:
        """(outputs, reduced elements per output) of a reduction kernel."""
        if self.kind != "reduce":
            return None
        n, x = self.node, self.node.inputs[0]
        axes = op_of(n).reduced_axes(n.attrs)
        red = 1
        for a in axes:
            red *= x.shape[a]
        return x.size // red, red


@dataclass
class KernelSchedule:
    graph: Graph
    owners: list[Tensor]  # tensors that own storage, in graph order
    views: dict[int, View]  # every tensor readable from storage
    placed: dict[int, tuple[Tensor, int]]  # owner -> (concat owner it lives in, element offset)
    kernels: list[Kernel]
    after_grads: set[int] = field(default_factory=set)  # tensors computed from the flat gradient vector
    update_from: int | None = None  # index of the first update kernel (a training graph's cut)
    param_offsets: dict[str, int] = field(default_factory=dict)  # parameter -> offset in the params buffer


def _compute_views(g: Graph, stored: set[int], params: "ParamArena | None", placed=None):
    views: dict[int, View] = {}
    owners: list[Tensor] = [params.tensor] if params is not None else []
    pos = {id(n.out): i for i, n in enumerate(g.nodes)} if placed else {}
    # persistent tensors (the flat gradient vector) are whole buffers to the runtime: a view that
    # is only part of its base (adjacent slices of one gradient that also holds an input's) is
    # stored by a kernel of its own instead
    whole = {id(t) for t in g.persist.values()}
    for n in g.nodes:
        t = n.out
        if params is not None and n.op == "param":
            views[id(t)] = View.contiguous(params.tensor, params.offsets[n.attrs["name"]], t.shape)
            continue
        v = _placed_concat_view(n, placed, pos) if placed and op_of(n).fusion == "concat" else None
        if v is not None and id(t) in whole and not _covers(v, t):
            v = None
        if v is not None:
            views[id(t)] = v
            continue
        if op_of(n).owns_storage:
            views[id(t)] = View.contiguous(t)
            owners.append(t)
            continue
        v = op_of(n).view(n, views) if op_of(n).view is not None else None
        if v is not None and id(t) in whole and not _covers(v, t):
            v = None
        if v is not None and (id(t) not in stored or v.is_contiguous(t.shape)):
            views[id(t)] = v
        elif id(t) in stored:
            views[id(t)] = View.contiguous(t)
            owners.append(t)
    return views, owners


def _covers(v: View, t: Tensor) -> bool:
    """`t`, read through view `v`, is the whole of its base in order."""
    return v.offset == 0 and v.is_contiguous(t.shape) and v.base.size == t.size


def _placed_concat_view(n: Node, placed, pos) -> View | None:
    """A leading-axis concat whose pieces all live, adjacent and in order, in another concat's
    storage (placed there) is a view of that storage: an RNN's hidden states, stacked into its
    output, are also the rows its weight gradient reads [one home for each piece, no copy].
    Only where every piece of that storage is computed before this concat: its readers wait
    for the whole of it (check_order)."""
    t = n.out
    if any(d != 1 for d in t.shape[: n.attrs["axis"]]):
        return None
    homes = [placed.get(id(_strip_reshapes(x))) for x in n.inputs]
    if any(h is None for h in homes) or any(h[0] is not homes[0][0] for h in homes) or homes[0][0] is t:
        return None
    if any(pos[id(_strip_reshapes(x))] > pos[id(t)] for x in homes[0][0].node.inputs):
        return None
    at = homes[0][1]
    for x, (_, off) in zip(n.inputs, homes):
        if off != at:
            return None
        at += x.size
    return View.contiguous(homes[0][0], homes[0][1], t.shape)


def _strip_reshapes(t: Tensor) -> Tensor:
    while op_of(t).fusion == "view" and op_of(t).same_order:  # reshapes
        t = t.node.inputs[0]
    return t


class ParamArena:
    """All parameters as slices of one flat f32 buffer (layout order from the front end)."""

    def __init__(self, offsets: dict[str, int], total: int):
        self.offsets = offsets
        self.tensor = Tensor((total,), "f32")
        self.tensor.node = Node("param", (), {"name": "*"}, self.tensor)


def _readers(t: Tensor, users) -> list[Node]:
    """The nodes that read `t`'s values other than through index arithmetic: directly, or
    through views of it and index ops over it (max_pool2d's unfold)."""
    out, todo = {}, [t]
    while todo:
        for r in users.get(id(todo.pop()), []):
            if op_of(r).fusion in ("view", "index"):
                todo.append(r.out)
            else:
                out[id(r)] = r
    return list(out.values())


def _selected_and_read(t: Tensor, users) -> bool:
    """`t` is the input of a reduction that selects one of its elements (OpDef.selects: max,
    argmax) and has other readers: it is stored once. Recomputed in each reader's kernel, it can
    round differently in each: naga marks no op exact, and Mesa's NIR optimizer rewrites a product
    whose value has one use (`(a * g) * 1.5` becomes `(a * 1.5) * g`; `a * g * 1.5 - m` one fma),
    but not in max's kernel, where the product also feeds max_nan's NaN branch. Then no element of
    x - max(x) was exactly 0 and max's VJP found no element equal to the max (0 / 0 = NaN: fuzz
    dims seed 820015)."""
    rs = _readers(t, users)
    return len(rs) > 1 and any(op_of(r).selects for r in rs)


def schedule(g: Graph, params: ParamArena | None = None) -> KernelSchedule:
    users = g.users()
    roots = {id(t) for t in g.roots()}
    stored: set[int] = set()
    cost: dict[int, int] = {}  # inlined ops a consumer recomputes to get this tensor
    for n in g.nodes:
        t = n.out
        if op_of(n).owns_storage or id(t) in roots:
            stored.add(id(t))
            continue
        cost[id(t)] = op_of(n).cost + sum(cost.get(id(x), 0) for x in n.inputs if id(x) not in stored)
        # a matmul's only consumer stays stored so it can become that matmul's epilogue
        after_mm = any(op_of(x).fusion == "matmul" and len(users[id(x)]) == 1 for x in n.inputs)
        if len(users[id(t)]) > 1 and op_of(n).cost > 0 and (cost[id(t)] > RECOMPUTE_BUDGET or after_mm):
            stored.add(id(t))
        elif op_of(n).cost > 0 and _selected_and_read(t, users):
            stored.add(id(t))

    placed: dict[int, tuple[Tensor, int]] = {}
    # a piece of several concats lives in the largest (the others may then be views of it)
    concats = sorted((n for n in g.nodes if op_of(n).fusion == "concat"), key=lambda n: -n.out.size)
    while True:
        views, owners = _compute_views(g, stored, params, placed)
        changed = False
        before = set(stored)
        for n in g.nodes:
            if op_of(n).fusion in ("matmul", "attention", "recurrent"):
                for pos, t in enumerate(n.inputs):
                    if id(t) in views:
                        if pos in op_of(n).contiguous and not views[id(t)].is_contiguous(t.shape) and id(t) not in stored:
                            stored.add(id(t))  # a copy of its own, row-major (OpDef.contiguous)
                            changed = True
                        continue
                    conv, below = _prologue_split(t, views) if op_of(n).fusion == "matmul" else (False, [])
                    if conv:  # computed in the matmul; what it reads must be stored
                        for x in below:
                            if id(x) not in stored:
                                stored.add(id(x))
                                changed = True
                        continue
                    # store what the view chain starts from; only if that cannot help, t itself
                    u = t
                    while op_of(u).fusion == "view" and id(u) not in before:
                        u = u.node.inputs[0]
                    u = u if id(u) not in before else t
                    if id(u) not in stored:
                        stored.add(id(u))
                        changed = True
        for n in concats:
            if id(n.out) in stored and _place_concat(n, views, stored, placed, roots):
                changed = True  # it stored pieces to place next round: no smaller concat takes them first
                break
        if not changed:
            break
    # A placement made in an early round is void if a later round turned its tensor into a view
    # of another owner (a narrow of a tensor stored later for a matmul): nothing would write the
    # slice. Such a concat is assembled by its own kernel instead.
    for n in g.nodes:
        if op_of(n).fusion == "concat":
            ys = [_strip_reshapes(x) for x in n.inputs]
            mine = [y for y in ys if id(y) in placed and placed[id(y)][0] is n.out]  # pieces placed in this concat
            if mine and not all(id(y) in views and views[id(y)].base is y for y in ys):
                for y in mine:
                    del placed[id(y)]
    views, owners = _compute_views(g, stored, params, placed)  # concats of placed pieces, as placed now

    owner_ids = {id(t) for t in owners}
    mm_epilogue = _matmul_epilogues(g, users, owner_ids, roots)
    for mm in mm_epilogue.values():
        owner_ids.discard(id(mm))
    owners = [t for t in owners if id(t) in owner_ids]
    views = {k: v for k, v in views.items() if id(v.base) in owner_ids}

    kernels: list[Kernel] = []
    for n in g.nodes:
        t = n.out
        if op_of(n).fusion == "concat" and id(t) in views and views[id(t)].base is not t:
            continue
        if id(t) not in owner_ids or op_of(n).fusion == "leaf":
            continue
        if op_of(n).fusion == "concat" and all(placed.get(id(_strip_reshapes(x)), (None,))[0] is t for x in n.inputs):
            continue  # assembled in place by its inputs' kernels (placed in this concat, not another)
        if id(t) in mm_epilogue:
            mm = mm_epilogue[id(t)]
            kernels.append(Kernel("matmul", t, mm.node, mm=mm))
        elif op_of(n).fusion in ("reduce", "matmul", "attention", "recurrent"):
            kernels.append(Kernel(op_of(n).fusion, t, n))
        else:
            kernels.append(Kernel("elementwise", t, n))
    s = KernelSchedule(g, owners, views, placed, kernels, _after_grads(g))
    s.param_offsets = dict(params.offsets) if params is not None else {}
    for k in kernels:
        k.reads = kernel_reads(s, k)
    _merge_attention(s)
    _merge_elementwise(s)
    if s.after_grads:  # backward kernels first (graph order already has them first: a no-op then)
        s.kernels.sort(key=lambda k: _is_update(s, k))
    check_order(s)
    check_cut(s)
    _mark_unstored(s)
    return s


def _mark_unstored(s: KernelSchedule) -> None:
    """A reduction's result that only its own epilogue uses (LayerNorm's sum of squares, from which
    the kernel computes rsqrt(var + eps)) stays in a register: no store, so no write that would
    keep a later kernel from sharing its dispatch or its row chain (chain.py)."""
    roots = s.graph.roots()  # read by the runtime, perhaps as a view of another tensor's storage
    keep = {id(t) for t in roots} | {id(s.views[id(t)].base) for t in roots if id(t) in s.views}
    keep |= set(s.placed) | {id(b) for k in s.kernels for b in k.reads}
    for k in s.kernels:
        if k.kind == "reduce":
            k.unstored = {id(m.out) for m in k.group + [k] if id(m.out) not in keep}


def _after_grads(g: Graph) -> set[int]:
    """Tensors computed from the flat gradient vector g.persist["grads"]: the optimizer update."""
    flat = g.persist.get("grads")
    if flat is None or not g.updates:
        return set()
    after = {id(flat)}
    for n in g.nodes:
        if any(id(x) in after for x in n.inputs):
            after.add(id(n.out))
    after.discard(id(flat))
    return after


def _is_update(s: KernelSchedule, k: Kernel) -> bool:
    return any(id(t) in s.after_grads for t in k.outs)


def check_cut(s: KernelSchedule) -> None:
    """Runs on every build of a training graph with an update: sets s.update_from so that kernels
    [0, update_from) compute the flat gradient vector and [update_from, end) the update, and checks
    that the update sees gradients only through that vector's storage (the grads buffer, which the
    runtime may replace between the two halves) and never writes it."""
    g = s.graph
    if not s.after_grads:
        return
    flat = g.persist["grads"]
    base = s.views[id(flat)].base
    anc = {id(flat)}  # everything the gradients are computed from, ...
    for n in reversed(g.nodes):
        if id(n.out) in anc:
            anc.update(id(x) for x in n.inputs)
    backward: set[int] = set()  # ... computed (not a leaf), and not index arithmetic on constants
    varying: set[int] = set()
    for n in g.nodes:
        if n.op in ("input", "param", "state", "buffer") or any(id(x) in varying for x in n.inputs):
            varying.add(id(n.out))
            if id(n.out) in anc and op_of(n).fusion != "leaf":
                backward.add(id(n.out))

    def in_grads(t: Tensor) -> bool:
        while t is not base and id(t) in s.placed:
            t = s.placed[id(t)][0]
        return t is base

    phases = [_is_update(s, k) for k in s.kernels]
    s.update_from = phases.index(True) if True in phases else len(s.kernels)
    for i, k in enumerate(s.kernels):
        what = f"{g.name}: kernel {i} ({k.node.op}, writing {k.out.type_str()})"
        if i < s.update_from:
            continue
        if any(in_grads(t) for t in k.outs):
            raise CodegenError(f"{what} runs after the first update kernel but writes the gradient vector")
        for t in _inlined(s, k):
            if id(t) in backward and not in_grads(s.views[id(t)].base if id(t) in s.views else t):
                raise CodegenError(
                    f"{what} is an update kernel that reads or recomputes a gradient ({t.node.op} {t.type_str()}) "
                    "other than through the flat gradient vector (a fusion rule crossed the cut)"
                )


def _inlined(s: KernelSchedule, k: Kernel) -> list[Tensor]:
    """Every tensor a kernel's expressions read from storage or compute inline (its outputs' trees)."""
    stack = [x for t in k.outs for x in t.node.inputs] + (list(k.mm.node.inputs) if k.mm is not None else [])
    seen: dict[int, Tensor] = {}
    written = {id(t) for t in k.outs} | ({id(k.mm)} if k.mm is not None else set())
    while stack:
        t = stack.pop()
        if id(t) in seen or id(t) in written:
            continue
        seen[id(t)] = t
        if id(t) not in s.views:
            stack.extend(t.node.inputs)
    return list(seen.values())


def _written_ids(s: KernelSchedule, k: Kernel) -> set[int]:
    """Storage a kernel writes: its outputs and the concats they are placed in, which later
    kernels read as a whole (a reader of the concat depends on every piece's writer)."""
    out = set()
    for t in k.outs:
        out.add(id(t))
        x = t
        while id(x) in s.placed:
            x = s.placed[id(x)][0]
            out.add(id(x))
    return out


def check_order(s: KernelSchedule) -> None:
    """Runs on every build: each kernel reads only storage written by an earlier kernel (or a
    leaf); a concat assembled in place counts as written once every piece is."""
    pieces: dict[int, list[int]] = {}
    for piece, (owner, _) in s.placed.items():
        pieces.setdefault(id(owner), []).append(piece)
    written: set[int] = set()

    def ready_id(p: int) -> bool:
        return p in written or (p in pieces and all(ready_id(q) for q in pieces[p]))

    for i, k in enumerate(s.kernels):
        for b in k.reads:
            if not (op_of(b).fusion == "leaf" or ready_id(id(b))):
                raise CodegenError(
                    f"{s.graph.name}: kernel {i} ({k.node.op}, writing {k.out.type_str()}) reads a tensor "
                    f"({b.node.op} {b.type_str()}) that no earlier kernel has written (a fusion rule moved its writer later)"
                )
        written |= {id(t) for t in k.outs}


class _Facts:
    """What the merge loop asks of a kernel, kept per kernel and updated by each merge (a union)
    instead of recomputed from its outputs: a long chain merges into one kernel of thousands of
    outputs, and recomputing these at every merge made building quadratic in the chain's length."""

    def __init__(self, s: KernelSchedule):
        self.s = s
        self.known: dict[int, tuple[set[int], set[int], bool]] = {}

    def get(self, k: Kernel) -> tuple[set[int], set[int], bool]:
        """(ids of k's outputs, ids of the storage it writes (_written_ids), whether it is an update kernel)."""
        f = self.known.get(id(k))
        if f is None:
            outs = k.outs
            f = self.known[id(k)] = ({id(t) for t in outs}, _written_ids(self.s, k), _is_update(self.s, k))
        return f

    def merge(self, into: Kernel, other: Kernel) -> None:
        """`into` now computes `other`'s outputs too (`other` leaves the schedule or was absorbed)."""
        a, b = self.get(into), self.get(other)
        del self.known[id(other)]
        # the smaller set into the larger: a chain's kernel grows by one output at a time
        self.known[id(into)] = (_union(a[0], b[0]), _union(a[1], b[1]), a[2])


def _union(x: set, y: set) -> set:
    """x | y, made by adding the smaller set to the larger (which is changed)."""
    if len(x) < len(y):
        x, y = y, x
    x |= y
    return x


def _merge_elementwise(s: KernelSchedule) -> None:
    """Merge kernels until nothing changes (rules in the module docstring). A merge keeps
    every output stored, so later readers are unaffected; it never moves a computation
    before a kernel that produces one of its inputs."""
    facts = _Facts(s)
    changed = True
    while changed:
        changed = False
        for i, k1 in enumerate(s.kernels):
            written = facts.get(k1)[1]
            j = next((j for j in range(i + 1, len(s.kernels)) if any(id(r) in written for r in s.kernels[j].reads)), None)
            if _merge_reader(s, i, j, facts) or _merge_sibling(s, i, j, facts):
                changed = True
                break


def _same_space(s: KernelSchedule, k1: Kernel, k2: Kernel, facts: _Facts) -> bool:
    """k2 is elementwise over k1's output elements and reads k1's outputs element for element."""
    return (
        k2.kind == "elementwise"
        and not k2.group
        and k2.out.size == k1.out.size
        and all(t.size == k2.out.size for t in k2.outs)
        and all(_identity_reads(s, out, facts.get(k1)[0]) for out in k2.outs)
    )


def _merge_reader(s: KernelSchedule, i: int, j: int | None, facts: _Facts) -> bool:
    if j is None:
        return False
    k1, k2 = s.kernels[i], s.kernels[j]
    if not _same_space(s, k1, k2, facts) or facts.get(k1)[2] != facts.get(k2)[2]:  # never across the cut
        return False
    written, k1_storage = facts.get(k1)[0], facts.get(k1)[1]
    if any(id(r) in k1_storage and id(r) not in written for r in k2.reads):
        return False  # k2 reads a concat that k1 writes pieces of: from memory, before k1 stores them
    if k1.kind == "elementwise":
        k2.first = k1.outs + k2.first
        k2.reads = [r for r in dict.fromkeys(k1.reads + k2.reads) if id(r) not in written]
        facts.merge(k2, k1)
        del s.kernels[i]
        return True
    if k1.kind == "reduce" and k1.group or k1.kind in ("attention", "recurrent"):
        return False
    # k2 moves up into k1's epilogue: nothing between may produce what k2 reads, a piece of a
    # concat it reads included (the concat is written once all its pieces are: graph seed 5310649)
    between = set().union(*(facts.get(k)[1] for k in s.kernels[i + 1 : j]))
    if any(id(r) in between for r in k2.reads) or k1.out.dtype != "f32" and k1.kind == "matmul":
        return False
    k1.after += k2.first + [k2.out] + k2.after
    k1.reads = list(dict.fromkeys(k1.reads + [r for r in k2.reads if id(r) not in written]))
    facts.merge(k1, k2)
    del s.kernels[j]
    return True


def _merge_sibling(s: KernelSchedule, i: int, j: int | None, facts: _Facts) -> bool:
    """Move reduction k1 into the next reduction k2 with the same index space, if k2 does not
    need k1's results and nothing before k2 does."""
    k1 = s.kernels[i]
    if k1.kind != "reduce" or k1.group:
        return False
    written = facts.get(k1)[1]
    for m in range(i + 1, len(s.kernels) if j is None else j + 1):
        k2 = s.kernels[m]
        if k2.kind == "reduce" and k2.reduce_space() == k1.reduce_space() and m != j:
            if any(id(r) in written for r in k2.reads) or facts.get(k1)[2] != facts.get(k2)[2]:
                return False
            k2.group = [k1] + k2.group
            k2.reads = list(dict.fromkeys(k1.reads + k2.reads))
            facts.merge(k2, k1)
            del s.kernels[i]
            return True
    return False


def _merge_attention(s: KernelSchedule) -> None:
    """A later attention kernel whose op shares the earlier one's OpDef.sibling key, with the same
    attrs and inputs that are all inputs of the earlier one, joins the earlier kernel's group:
    everything it reads exists where the earlier kernel runs, so it moves there."""
    for k1 in list(s.kernels):
        key = op_of(k1.node).sibling
        if k1.kind != "attention" or key is None or key in SEPARATE_SIBLINGS or k1 not in s.kernels:
            continue
        for k2 in s.kernels[s.kernels.index(k1) + 1 :]:
            n1, n2 = k1.node, k2.node
            within = {id(t) for t in n1.inputs} >= {id(t) for t in n2.inputs}
            if k2.kind == "attention" and not k2.group and within and op_of(n2).sibling == key and n1.attrs == n2.attrs:
                k1.group.append(k2)
                s.kernels.remove(k2)


def _prologue_split(t: Tensor, views) -> tuple[bool, list[Tensor]]:
    """Whether matmul operand t involves unfold or flip (fusion class "index": then the matmul
    computes it as it loads its tiles, through the ops with OpDef.prologue), and the tensors
    below its index arithmetic that are not stored yet: those must be, so that the prologue
    only reads memory. [im2col columns are as large as the activations times kh*kw, so a
    convolution reads its input through the unfold index math instead of storing the columns]"""
    stack, found, below = [t], False, []
    while stack:
        x = stack.pop()
        if id(x) in views:
            continue
        if not op_of(x).prologue:
            below.append(x)
            continue
        found |= op_of(x).fusion == "index"
        stack.extend(x.node.inputs)
    return found, below


def _identity_reads(s: KernelSchedule, out: Tensor, target: Tensor | set[int], offset: int = 0) -> bool:
    """Every read of target's storage (of each tensor in a set of ids) in out's expression is at
    out's own flat index (plus `offset`: out is written there). One walk for all targets, each
    (node, identity) visited once: a merged kernel has thousands of outputs in a long chain, and
    shared subexpressions would otherwise be walked once per path."""
    targets = target if isinstance(target, set) else {id(target)}
    stack = [(out, True, True)]
    seen = set()
    while stack:
        t, ident, top = stack.pop()
        if (id(t), ident, top) in seen:
            continue
        seen.add((id(t), ident, top))
        v = s.views.get(id(t))
        if v is not None and not top:
            if id(v.base) in targets and not (ident and v.offset == offset and v.is_contiguous() and t.size == out.size):
                return False
            continue
        n = t.node
        for x in n.inputs:
            same = ident and op_of(n).same_order and x.size == t.size
            stack.append((x, same, False))
    return True


def _leading(n: Node) -> bool:
    """A concat along its leading axis (nothing but size-1 dims before it): pieces lie whole, one after another."""
    return all(d == 1 for d in n.out.shape[: n.attrs["axis"]])


def _place_concat(n, views, stored, placed, roots) -> bool:
    """Try to assemble a leading-axis concat in place. Returns True if `stored` changed."""
    t, axis = n.out, n.attrs["axis"]
    lead = 1
    for d in t.shape[:axis]:
        lead *= d
    if lead != 1:
        return False
    offs, o = [], 0
    for x in n.inputs:
        offs.append(o)
        o += x.size
    if id(t) in views and views[id(t)].base is not t:
        return False  # already a view of adjacent slices
    ys = [id(_strip_reshapes(x)) for x in n.inputs]
    if len(set(ys)) != len(ys):
        return False  # one tensor in two slices (x + x, shared gradients) has one home: copy instead
    changed = False
    for x in n.inputs:
        y = _strip_reshapes(x)
        if op_of(y).fusion == "leaf" or (op_of(y).fusion == "concat" and _leading(y.node)) or id(y) in placed:
            return changed  # (a concat along an inner axis is computed by a kernel, like any piece)
        if id(y) not in stored:
            stored.add(id(y))
            changed = True
    if changed:
        return True
    for x, off in zip(n.inputs, offs):
        y = _strip_reshapes(x)
        if id(y) not in views or views[id(y)].base is not y:
            return False
    for x, off in zip(n.inputs, offs):
        placed[id(_strip_reshapes(x))] = (t, off)
    return False


def _matmul_epilogues(g: Graph, users, owner_ids, roots) -> dict[int, Tensor]:
    """Owner tensor R -> matmul result M, for chains M -> pointwise -> ... -> R of single-use nodes."""
    out = {}
    for n in g.nodes:
        if op_of(n).fusion != "matmul" or id(n.out) in roots:
            continue
        t = n.out
        while True:
            us = users[id(t)]
            if len(us) != 1:
                break
            u = us[0]
            if op_of(u).fusion != "pointwise" or u.out.shape != n.out.shape or u.out.dtype != "f32":
                break
            if sum(1 for x in u.inputs if x is t) != 1:
                break
            t = u.out
            if id(t) in owner_ids:
                out[id(t)] = n.out
                break
    return out


def kernel_reads(s: KernelSchedule, k: Kernel) -> list[Tensor]:
    """Storage owners a kernel reads (through its inlined expression tree)."""
    seen: dict[int, Tensor] = {}
    # a fused epilogue starts from the matmul's operands and the epilogue root's inputs
    stack = list(k.mm.node.inputs) + list(k.out.node.inputs) if k.mm is not None else list(k.node.inputs)
    visited = set()
    while stack:
        t = stack.pop()
        if id(t) in visited:
            continue
        visited.add(id(t))
        if k.mm is not None and t is k.mm:
            continue
        v = s.views.get(id(t))
        if v is not None:
            seen.setdefault(id(v.base), v.base)
        else:
            stack.extend(t.node.inputs)
    return list(seen.values())
