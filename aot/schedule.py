"""Graph -> Schedule: the fusion stage. Decides which tensors get storage, which are plain
views of storage, and which kernels run.

Rules (why in brackets):
- leaves and the outputs of matmul / reductions own storage [their kernels write it];
- an elementwise or layout node is inlined into every consumer's kernel when it has one
  consumer, or is pure index arithmetic (broadcast_to, reshape, transpose, narrow, const,
  arange) [recomputing costs nothing, materializing costs a kernel and a round trip];
- reshape / transpose / narrow / broadcast_to of storage are views: strided reads of the
  same storage, no copy [tensorgrad copies for every reshape];
- matmul operands must be strided views; anything else is materialized first;
- a concat along its leading axis is assembled in place: each input's producer writes
  straight into its slice, and a concat of adjacent slices of one buffer is a view
  [the flat gradient vector costs nothing];
- a matmul whose result feeds a chain of single-use pointwise ops computes the chain in
  its epilogue [bias + activation never touch memory].
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ir import Graph, Node, Tensor

LEAVES = ("input", "param", "state")
INDEX_OPS = ("broadcast_to", "reshape", "transpose", "narrow", "const", "arange")
VIEW_OPS = ("broadcast_to", "reshape", "transpose", "narrow")
KERNEL_OPS = {"matmul": "matmul", "sum": "reduce", "max": "reduce", "argmax": "reduce"}
# ops whose output element i depends only on element i of each input (same shape)
POINTWISE = (
    "neg abs sign sqrt rsqrt exp log sin cos tanh sigmoid relu erf square power stop_gradient "
    "add sub mul div maximum minimum less greater equal where cast"
).split()


def contiguous_strides(shape) -> tuple[int, ...]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return tuple(reversed(out))


@dataclass(frozen=True)
class View:
    """Reading tensor element (c0, c1, ...) means reading base storage at offset + sum(ci * strides[i])."""

    base: Tensor
    offset: int
    strides: tuple[int, ...]

    def is_contiguous(self, shape) -> bool:
        return all(st == cs for st, cs, d in zip(self.strides, contiguous_strides(shape), shape) if d != 1)


@dataclass(eq=False)
class Kernel:
    kind: str  # "elementwise" | "reduce" | "matmul"
    out: Tensor  # the tensor the kernel writes
    node: Node  # matmul/reduce node, or out.node
    mm: Tensor | None = None  # the matmul result, read as `acc` by a fused epilogue
    reads: list[Tensor] = field(default_factory=list)  # storage-owning tensors it reads


@dataclass
class Schedule:
    graph: Graph
    owners: list[Tensor]  # tensors that own storage, in graph order
    views: dict[int, View]  # every tensor readable from storage
    placed: dict[int, tuple[Tensor, int]]  # owner -> (concat owner it lives in, element offset)
    kernels: list[Kernel]

    def is_stored(self, t: Tensor) -> bool:
        return id(t) in self.views


def _derive_view(n: Node, v: View) -> View | None:
    t, src = n.out, n.inputs[0]
    a = n.attrs
    if n.op == "reshape":
        return View(v.base, v.offset, contiguous_strides(t.shape)) if v.is_contiguous(src.shape) else None
    if n.op == "transpose":
        return View(v.base, v.offset, tuple(v.strides[p] for p in a["perm"]))
    if n.op == "narrow":
        return View(v.base, v.offset + a["start"] * v.strides[a["axis"]], v.strides)
    if n.op == "broadcast_to":
        lead = t.ndim - src.ndim
        st = [0] * lead + [0 if (d == 1 and t.shape[lead + i] != 1) else v.strides[i] for i, d in enumerate(src.shape)]
        return View(v.base, v.offset, tuple(st))
    return None


def matmul_operand_ok(t: Tensor, v: View | None, shared_rhs: bool) -> bool:
    """Batch dims must collapse to one stride (or be absent) so the kernel can index them."""
    if v is None:
        return False
    if shared_rhs or t.ndim == 2:
        return True
    dims, strides = t.shape[:-2], v.strides[:-2]
    for i in range(len(dims) - 1):
        if dims[i + 1] != 1 and dims[i] != 1 and strides[i] != strides[i + 1] * dims[i + 1]:
            return False
    return True


def _compute_views(g: Graph, stored: set[int], params: "ParamArena | None"):
    views: dict[int, View] = {}
    owners: list[Tensor] = [params.tensor] if params is not None else []
    for n in g.nodes:
        t = n.out
        if n.op == "param" and params is not None:
            views[id(t)] = View(params.tensor, params.offsets[n.attrs["name"]], contiguous_strides(t.shape))
            continue
        if n.op in LEAVES or n.op in KERNEL_OPS:
            views[id(t)] = View(t, 0, contiguous_strides(t.shape))
            owners.append(t)
            continue
        v = None
        if n.op in VIEW_OPS and id(n.inputs[0]) in views:
            v = _derive_view(n, views[id(n.inputs[0])])
        elif n.op == "concat":
            v = _concat_view(n, views)
        if v is not None and (id(t) not in stored or v.is_contiguous(t.shape)):
            views[id(t)] = v
        elif id(t) in stored:
            views[id(t)] = View(t, 0, contiguous_strides(t.shape))
            owners.append(t)
    return views, owners


def _strip_reshapes(t: Tensor) -> Tensor:
    while t.node.op == "reshape":
        t = t.node.inputs[0]
    return t


class ParamArena:
    """All parameters as slices of one flat f32 buffer (layout order from the front end)."""

    def __init__(self, offsets: dict[str, int], total: int):
        self.offsets = offsets
        self.tensor = Tensor((total,), "f32")
        self.tensor.node = Node("param", (), {"name": "*"}, self.tensor)


def schedule(g: Graph, params: ParamArena | None = None) -> Schedule:
    users = g.users()
    roots = {id(t) for t in g.roots()}
    stored: set[int] = set()
    for n in g.nodes:
        t = n.out
        if n.op in LEAVES or n.op in KERNEL_OPS or id(t) in roots:
            stored.add(id(t))
        elif len(users[id(t)]) > 1 and n.op not in INDEX_OPS:
            stored.add(id(t))

    placed: dict[int, tuple[Tensor, int]] = {}
    while True:
        views, owners = _compute_views(g, stored, params)
        changed = False
        for n in g.nodes:
            if n.op == "matmul":
                for i, t in enumerate(n.inputs):
                    if not matmul_operand_ok(t, views.get(id(t)), i == 1 and t.ndim == 2) and id(t) not in stored:
                        stored.add(id(t))
                        changed = True
        for n in g.nodes:
            if n.op == "concat" and id(n.out) in stored:
                changed |= _place_concat(n, views, stored, placed, roots)
        if not changed:
            break

    owner_ids = {id(t) for t in owners}
    mm_epilogue = _matmul_epilogues(g, users, owner_ids, roots)
    for mm in mm_epilogue.values():
        owner_ids.discard(id(mm))
    owners = [t for t in owners if id(t) in owner_ids]
    views = {k: v for k, v in views.items() if id(v.base) in owner_ids}

    kernels: list[Kernel] = []
    for n in g.nodes:
        if n.op == "concat" and id(t) in views and views[id(t)].base is not t:
            continue
        t = n.out
        if id(t) not in owner_ids or n.op in LEAVES:
            continue
        if n.op == "concat" and all(id(_strip_reshapes(x)) in placed for x in n.inputs):
            continue  # assembled in place by its inputs' kernels
        if id(t) in mm_epilogue:
            mm = mm_epilogue[id(t)]
            kernels.append(Kernel("matmul", t, mm.node, mm=mm))
        elif n.op in KERNEL_OPS:
            kernels.append(Kernel(KERNEL_OPS[n.op], t, n))
        else:
            kernels.append(Kernel("elementwise", t, n))
    s = Schedule(g, owners, views, placed, kernels)
    for k in kernels:
        k.reads = kernel_reads(s, k)
    return s


def _concat_view(n: Node, views) -> View | None:
    """A leading-axis concat of adjacent contiguous slices of one buffer is a view of it."""
    t, axis = n.out, n.attrs["axis"]
    if any(d != 1 for d in t.shape[:axis]):
        return None
    vs = [views.get(id(x)) for x in n.inputs]
    if not all(v is not None and v.is_contiguous(x.shape) for v, x in zip(vs, n.inputs)):
        return None
    off = vs[0].offset
    for v, x in zip(vs, n.inputs):
        if v.base is not vs[0].base or v.offset != off:
            return None
        off += x.size
    return View(vs[0].base, vs[0].offset, contiguous_strides(t.shape))


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
    changed = False
    for x in n.inputs:
        y = _strip_reshapes(x)
        if y.node.op in LEAVES or id(y) in placed or y.node.op == "concat":
            return changed
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
        if n.op != "matmul" or id(n.out) in roots:
            continue
        t = n.out
        while True:
            us = users[id(t)]
            if len(us) != 1:
                break
            u = us[0]
            if u.op not in POINTWISE or u.out.shape != n.out.shape or u.out.dtype != "f32":
                break
            if sum(1 for x in u.inputs if x is t) != 1:
                break
            t = u.out
            if id(t) in owner_ids:
                if u.op != "concat":
                    out[id(t)] = n.out
                break
    return out


def kernel_reads(s: Schedule, k: Kernel) -> list[Tensor]:
    """Storage owners a kernel reads (through its inlined expression tree)."""
    seen: dict[int, Tensor] = {}
    stack = list(k.mm.node.inputs) + _epilogue_inputs(k) if k.mm is not None else list(k.node.inputs)
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


def _epilogue_inputs(k: Kernel) -> list[Tensor]:
    return list(k.out.node.inputs)
