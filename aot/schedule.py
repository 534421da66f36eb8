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
    """How a tensor sits in its base's storage. Each axis is a row-major list of sub-dims
    ((size, stride), ...): element (c0, c1, ...) lives at offset + sum over axes of c_i split
    over its sub-dims. One sub-dim per axis is an ordinary strided view; several come from a
    reshape of a permuted view (heads split or merged), which therefore needs no copy."""

    base: Tensor
    offset: int
    dims: tuple  # per axis: ((size, stride), ...)

    @staticmethod
    def contiguous(base: Tensor, offset: int = 0, shape=None) -> "View":
        shape = base.shape if shape is None else shape
        return View(base, offset, tuple(((d, st),) for d, st in zip(shape, contiguous_strides(shape))))

    def flat_dims(self) -> list[tuple[int, int]]:
        """All sub-dims outermost first, size-1 dropped and contiguous neighbours merged."""
        out: list[tuple[int, int]] = []
        for axis in self.dims:
            for size, st in axis:
                if size == 1:
                    continue
                if out and out[-1][1] == st * size:
                    out[-1] = (out[-1][0] * size, st)
                else:
                    out.append((size, st))
        return out

    def is_contiguous(self, shape=None) -> bool:
        fd = self.flat_dims()
        return not fd or (len(fd) == 1 and fd[0][1] == 1)

    def strides(self) -> tuple[int, ...] | None:
        """Plain per-axis strides, or None when an axis has several sub-dims."""
        out = []
        for axis in self.dims:
            real = [(n, st) for n, st in axis if n != 1]
            if len(real) > 1:
                return None
            out.append(real[0][1] if real else 0)
        return tuple(out)


def _regroup(subdims: list[tuple[int, int]], shape) -> tuple | None:
    """Split a row-major sub-dim sequence into the axes of `shape` (a reshape); None if impossible."""
    seq = [sd for sd in subdims if sd[0] != 1]
    out = []
    for d in shape:
        axis, need = [], d
        while need > 1:
            if not seq:
                return None
            size, st = seq[0]
            if need % size == 0:
                axis.append((size, st))
                seq.pop(0)
                need //= size
            elif size % need == 0:
                axis.append((need, st * (size // need)))
                seq[0] = (size // need, st)
                need = 1
            else:
                return None
        out.append(tuple(axis) if axis else ((1, 0),))
    return tuple(out) if not seq else None


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
        dims = _regroup([sd for axis in v.dims for sd in axis], t.shape)
        return View(v.base, v.offset, dims) if dims is not None else None
    if n.op == "transpose":
        return View(v.base, v.offset, tuple(v.dims[p] for p in a["perm"]))
    if n.op == "narrow":
        axis = [sd for sd in v.dims[a["axis"]] if sd[0] != 1] or [(1, 0)]
        inner = 1
        for size, _ in axis[1:]:
            inner *= size
        if a["start"] % inner or a["length"] % inner:
            return None  # cuts through an inner sub-dim
        (size, st), rest = axis[0], axis[1:]
        dims = list(v.dims)
        dims[a["axis"]] = ((a["length"] // inner, st),) + tuple(rest)
        return View(v.base, v.offset + (a["start"] // inner) * st, tuple(dims))
    if n.op == "broadcast_to":
        lead = t.ndim - src.ndim
        dims = [((d, 0),) for d in t.shape[:lead]]
        for i, d in enumerate(src.shape):
            dims.append(((t.shape[lead + i], 0),) if d == 1 and t.shape[lead + i] != 1 else v.dims[i])
        return View(v.base, v.offset, tuple(dims))
    return None


def matmul_operand_ok(t: Tensor, v: View | None, shared_rhs: bool) -> bool:
    """Any view works: the matmul kernel splits batch, row and col indices over sub-dims."""
    return v is not None


def _compute_views(g: Graph, stored: set[int], params: "ParamArena | None"):
    views: dict[int, View] = {}
    owners: list[Tensor] = [params.tensor] if params is not None else []
    for n in g.nodes:
        t = n.out
        if n.op == "param" and params is not None:
            views[id(t)] = View.contiguous(params.tensor, params.offsets[n.attrs["name"]], t.shape)
            continue
        if n.op in LEAVES or n.op in KERNEL_OPS:
            views[id(t)] = View.contiguous(t)
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
            views[id(t)] = View.contiguous(t)
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
        t = n.out
        if n.op == "concat" and id(t) in views and views[id(t)].base is not t:
            continue
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
    return View.contiguous(vs[0].base, vs[0].offset, t.shape)


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
