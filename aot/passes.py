"""Graph -> Graph passes. PIPELINE runs in order; each pass returns a new graph and leaves its
input graph as it was (a node whose inputs change is copied, with a new output tensor)."""

from __future__ import annotations

from . import ops
from .buffers import UPDATE_PREFIX
from .errors import IRError
from .ir import DTYPES, Graph, Node, Tensor, format_node, tensor_names
from .matmul_codegen import split_count
from .ops.linalg import outer_product
from .ops.registry import lookup
from .ops.trace import at_site, tracing
from .split_rules import split_plan


def dce(g: Graph) -> Graph:
    """Drop nodes no root depends on. Leaves that declare the interface (inputs, params,
    state) stay, so the runtime's tables do not depend on what the model happens to use."""
    live = {id(t) for t in g.roots()}
    keep = []
    for n in reversed(g.nodes):
        if id(n.out) in live or lookup(n.op).fusion == "leaf":
            keep.append(n)
            live.update(id(t) for t in n.inputs)
    return _rebuild(g, list(reversed(keep)), lambda t: t)


def cse_consts(g: Graph) -> Graph:
    """Merge identical `const` and `arange` leaves (the tracer emits one per Python number)."""
    canon: dict[tuple, object] = {}
    remap: dict[int, object] = {}
    nodes = []
    for n in g.nodes:
        n = _with_inputs(n, remap)
        if lookup(n.op).fusion == "constant":
            # floats by repr: 0.0 == -0.0 in Python, and merging them lost -0.0's sign (x / -0.0)
            key = (n.op, tuple(sorted((k, repr(v) if isinstance(v, float) else v) for k, v in n.attrs.items())))
            if key in canon:
                remap[id(n.out)] = canon[key]
                continue
            canon[key] = n.out
        nodes.append(n)

    return _rebuild(g, nodes, lambda t: remap.get(id(t), t))


def _with_inputs(n: Node, remap: dict[int, Tensor]) -> Node:
    """n itself, or a copy of n reading the remapped inputs (its new output is remapped too)."""
    ins = tuple(remap.get(id(t), t) for t in n.inputs)
    if all(a is b for a, b in zip(ins, n.inputs)):
        return n
    out = Tensor(n.out.shape, n.out.dtype)
    out.node = Node(n.op, ins, dict(n.attrs), out, n.site)
    remap[id(n.out)] = out
    return out.node


def _rebuild(g: Graph, nodes, f) -> Graph:
    def m(d):
        return {k: f(t) for k, t in d.items()}

    return Graph(g.name, nodes, m(g.outputs), m(g.captures), m(g.updates), m(g.grads), m(g.persist), dict(g.meta))


def split_reductions(g: Graph) -> Graph:
    """sum/max over a long run of adjacent axes -> the same reduction in two stages:
    x[..., R, ...] -> [..., R/k, k, ...] reduced over k, then over R/k (sums pad R up to a
    multiple of k with zeros). Over separate runs of axes (BatchNorm's (0, 2, 3)), one reduced
    axis A is cut the same way: x[..., A/k, k, ...] reduced over k and the reduced axes after A,
    then over A/k and those before it (split_rules: the outermost axis, or with SPLIT_CELLS the
    first of the second run). Same result up to float rounding, fixed order, no atomics."""
    nodes: list = []
    remap: dict[int, object] = {}
    for orig in g.nodes:
        n = _with_inputs(orig, remap)
        plan = _split_plan(n)
        if plan is None:
            nodes.append(n)
            continue
        lo, hi, k, pad = plan
        x = n.inputs[0]
        # the reduced axes after the run lo:hi, once that run is one axis cut in two
        rest = tuple(a - (hi - lo) + 2 for a in n.attrs["axes"] if a >= hi)
        tmp = Graph(g.name)
        with tracing(tmp), at_site(n.site):
            red = 1
            for d in x.shape[lo:hi]:
                red *= d
            y = ops.reshape(x, x.shape[:lo] + (red,) + x.shape[hi:])
            if pad:
                y = ops.pad(y, lo, 0, pad)
            y = ops.reshape(y, x.shape[:lo] + ((red + pad) // k, k) + x.shape[hi:])
            reduce = getattr(ops, n.op)  # sum or max: the public function of the same name
            before = tuple(a for a in n.attrs["axes"] if a < lo)  # kept by the first stage (split_rules.SPLIT_CELLS)
            y = reduce(reduce(y, (lo + 1,) + rest), before + (lo,))
            y = ops.reshape(y, n.out.shape)
        nodes.extend(tmp.nodes)
        remap[id(orig.out)] = y
    return _rebuild(g, nodes, lambda t: remap.get(id(t), t))


def _split_plan(n):
    """(first axis, end axis, chunk k, zero padding) for a reduction worth splitting, else None:
    the run of axes lo:hi is cut into chunks of k (after padding)."""
    split = lookup(n.op).split
    if split is None:
        return None
    return split_plan(n.inputs[0].shape, n.attrs["axes"], split)


# A matmul with few outputs and a long K (a convolution's weight gradient: [O, N*H*W] @
# [N*H*W, C*k*k]) gives too few workgroups to fill a GPU, each walking all of K: split K.
SPLIT_K_MIN = 8192  # K below this is walked fast enough by the in-workgroup split-K tiles
SPLIT_K_MAX_OUTPUTS = 16384  # up to this many outputs: as many chunks as K allows
SPLIT_K_CHUNK = 512  # shortest K each partial product walks
SPLIT_K_MAX_CHUNKS = 64  # most partial products of one such matmul
# Larger outputs (a transformer's [512, 8192] @ [8192, 512] weight gradients: 32 tiles of 64x128)
# are split where the matmul cost model estimates it faster (matmul_codegen.split_count), from a
# K of SPLIT_K_MIN_WIDE [a ResNet's last-stage conv weight gradients, [64, 3136] @ [3136, 576]:
# 144 workgroups of 16x16 walking K = 3136, 70 us each on an H100; the model splits them in 4].
SPLIT_K_MIN_WIDE = 2048


def split_long_matmuls(g: Graph) -> Graph:
    """[M, K] @ [K, N] with small M*N and long K -> sum over s of [S, M, K/S] @ [S, K/S, N]: a
    batched matmul of S partial products (views of the same operands), then a short reduction.
    Same result up to float rounding, fixed order, no atomics."""

    def split(n):
        s = _split_k(n)
        if s is None:
            return None
        a, b = n.inputs
        (m, k), nn = a.shape, b.shape[1]

        def trace():
            a3 = ops.transpose(ops.reshape(a, (m, s, k // s)), (1, 0, 2))  # [S, M, K/S]
            b3 = ops.reshape(b, (s, k // s, nn))  # [S, K/S, N]
            return ops.sum(ops.matmul(a3, b3), 0)

        return trace

    return _replace(g, split)


def _replace(g: Graph, rule) -> Graph:
    """g with each node n for which rule(n) gives a function replaced by what that function
    traces (at n's call site); rule(n) None keeps n."""
    nodes: list = []
    remap: dict[int, object] = {}
    for orig in g.nodes:
        n = _with_inputs(orig, remap)
        trace = rule(n)
        if trace is None:
            nodes.append(n)
            continue
        tmp = Graph(g.name)
        with tracing(tmp), at_site(n.site):
            y = trace()
        nodes.extend(tmp.nodes)
        remap[id(orig.out)] = y
    return _rebuild(g, nodes, lambda t: remap.get(id(t), t))


def outer_products(g: Graph) -> Graph:
    """[..., M, 1] @ [1, N] is a broadcast product: computed as one, each element is its product
    exactly, -0.0 included, as torch's mm gives it, where a sum over one term from a +0.0
    accumulator turned -0.0 into +0.0 (1 / matmul(-0.0, 5.0): torch -inf, aot had +inf; hour
    run 18's special seed 5731847). Batched weights stay a sum: torch's bmm sums from +0.0 (and
    its mm does too where M or N is 1, a matrix-vector product; tests/fuzz_areas.py takes the
    sign of a zero a matmul sums as torch's coin)."""

    def product(n):
        if lookup(n.op).fusion != "matmul" or not outer_product(n.inputs[0].shape, n.inputs[1].shape):
            return None
        return lambda: ops.mul(*n.inputs)

    return _replace(g, product)


def _split_k(n) -> int | None:
    """The number of K chunks for a matmul worth splitting (a divisor of K), else None."""
    if lookup(n.op).fusion != "matmul" or any(x.ndim != 2 for x in n.inputs):
        return None
    (m, k), nn = n.inputs[0].shape, n.inputs[1].shape[1]
    if m * nn > SPLIT_K_MAX_OUTPUTS:
        return split_count(m, nn, k, SPLIT_K_CHUNK) if k >= SPLIT_K_MIN_WIDE else None
    if k < SPLIT_K_MIN:
        return None
    s = next((d for d in range(min(SPLIT_K_MAX_CHUNKS, k // SPLIT_K_CHUNK), 1, -1) if k % d == 0), None)
    return s


def snapshot_captured_leaves(g: Graph) -> Graph:
    """A capture that is a parameter, buffer or optimizer state (or a view or concat of them) in a
    graph that updates them is read back after the update has overwritten it: copy it first, right
    where it is captured, so the capture shows the value the forward pass used. The same for a
    buffer's new value (aot.assign) that is such a leaf: the writeback copies it after the pass."""
    if not g.updates:
        return g

    def leaf_view(t):
        """t may read parameter/state memory directly: a view of it, or a concat of such views
        (adjacent parameters concatenate into a view of the parameter buffer)."""
        fusion = lookup(t.node.op).fusion
        if fusion == "view":
            return leaf_view(t.node.inputs[0])
        if fusion == "concat":
            return all(leaf_view(x) for x in t.node.inputs)
        return t.node.op in ("param", "state", "buffer")

    targets = {id(t) for t in g.captures.values() if leaf_view(t)}
    targets |= {id(t) for k, t in g.updates.items() if k.startswith(UPDATE_PREFIX) and leaf_view(t)}
    if not targets:
        return g
    nodes, copies = [], {}
    for n in g.nodes:
        nodes.append(n)
        if id(n.out) in targets and id(n.out) not in copies:
            out = Tensor(n.out.shape, n.out.dtype)
            out.node = Node("stop_gradient", (n.out,), {}, out, n.site)
            nodes.append(out.node)
            copies[id(n.out)] = out
    out = _rebuild(g, nodes, lambda t: t)
    out.captures = {k: copies.get(id(t), t) for k, t in g.captures.items()}
    out.updates = {k: copies.get(id(t), t) if k.startswith(UPDATE_PREFIX) else t for k, t in g.updates.items()}
    return out


PIPELINE = [dce, cse_consts, outer_products, split_long_matmuls, split_reductions, snapshot_captured_leaves]


def run_pipeline(g: Graph, verify: bool = False) -> Graph:
    check = globals()["verify"]  # the function, shadowed by the flag
    for p in PIPELINE:
        g = p(g)
        if verify:
            check(g, after=p.__name__)
    return g


def verify(g: Graph, after: str = "") -> None:
    """Check the invariants; raise IRError quoting the IR around the bad node."""
    defined: set[int] = set()
    names = tensor_names(g)
    for i, n in enumerate(g.nodes):
        problem = None
        if n.out.node is not n:
            problem = "output tensor is not owned by its node"
        elif id(n.out) in defined:
            problem = "tensor defined twice"
        elif any(id(t) not in defined for t in n.inputs):
            problem = "uses a tensor before it is defined"
        elif n.out.dtype not in DTYPES:
            problem = f"bad dtype {n.out.dtype}"
        else:
            try:
                op = lookup(n.op)
                shape, dtype = op.shape(*[(t.shape, t.dtype) for t in n.inputs], **n.attrs)
                if tuple(shape) != n.out.shape or dtype != n.out.dtype:
                    problem = f"type mismatch: rule gives {dtype}{list(shape)}, node has {n.out.type_str()}"
            except Exception as e:  # a rule failing on the compiler's own graph is our bug
                problem = f"shape rule failed: {e}"
        if problem:
            lines = [format_node(m, names) for m in g.nodes[max(0, i - 5) : i + 6]]
            mark = min(i, 5)
            ctx = "\n".join(("  >> " if j == mark else "     ") + s for j, s in enumerate(lines))
            raise IRError(f"{problem}\nwhile verifying {g.name}" + (f" after pass '{after}'" if after else "") + f":\n{ctx}")
        defined.add(id(n.out))
    for t in g.roots():
        if id(t) not in defined:
            raise IRError(f"a root tensor of {g.name} is not computed by the graph")
