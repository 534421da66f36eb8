"""Rendering tensor values as WGSL expressions inside one kernel.

Body.value follows inlined nodes through their op's rendering (OpDef.render, or the `expr`
template of a pointwise op); stored tensors are read from memory.

A kernel computes a stored tensor from its inlined expression tree: nodes the schedule
inlined are computed in place, stored tensors (and views of them) are read from their buffer
at offset + the address of the element. Every read index is derived from an in-range output
index or clamped, so no kernel reads out of bounds whatever the data (indices included).
"""

from __future__ import annotations

from .errors import CodegenError
from .ir import Tensor
from .matmul_codegen import split_index
from .ops.elementwise import ROOTS, produced_by
from .ops.registry import lookup
from .plan import OFFSETS_BINDING, OFFSETS_SLOT_WORDS, VEC_SUFFIX, Plan, arena_binding, arena_dtype, same_access
from .schedule import KernelSchedule
from .views import contiguous_strides

# helpers a pointwise `expr` may call, and the helpers each of them calls in turn
EXPR_HELPERS = ("tanh_f32", "sigmoid_f32", "erf_f32", "max_nan", "min_nan", "pow_int_f32", "pow_frac_f32", "pow_abs_f32",
                "log1p_f32", "expm1_f32", "sin_f32", "cos_f32", "exp_f32", "log_f32", "mul_exp_f32", "mul_self_f32",
                "rsqrt_f32")
HELPER_DEPS = {
    "tanh_f32": ("is_nan_f32", "expm1_f32", "exp_f32"),
    "erf_f32": ("is_nan_f32", "exp_f32"),
    "exp_f32": ("is_nan_f32",),
    "mul_exp_f32": ("is_nan_f32", "times_zero_f32"),
    "sigmoid_f32": ("exp_f32",),
    "expm1_f32": ("exp_f32",),
    "log_f32": ("f32_bits",),
    "log1p_f32": ("log_f32",),
    "trig_reduce_f32": ("mul_wide_u32",),
    "sin_f32": ("trig_reduce_f32", "sincos_poly_f32", "f32_bits"),
    "cos_f32": ("trig_reduce_f32", "sincos_poly_f32", "f32_bits"),
    "max_nan": ("is_nan_f32",),
    "min_nan": ("is_nan_f32",),
    "gt_nan": ("is_nan_f32",),
    "pow_abs_f32": ("is_nan_f32", "f32_bits", "two_prod_f32", "pow_split_f32"),
    "pow_int_f32": ("pow_abs_f32",),
    "pow_frac_f32": ("pow_abs_f32", "f32_bits"),
    "times_zero_f32": ("f32_bits",),
    "times_sign_f32": ("times_zero_f32",),
    "zero_div_f32": ("f32_bits",),
    "self_sub_f32": ("f32_bits",),
    "mul_self_f32": ("is_nan_f32",),
    "div_zero_f32": ("f32_bits",),
    "zero_sub_f32": ("f32_bits",),
    "div_f32": ("f32_bits",),
    "rsqrt_f32": ("f32_bits",),
}


MAX_DEPTH = 60  # value() levels one rendering recurses before handing the rest to its outermost call


FLAT_RESHAPE_MAX = 2**31  # reshapes of larger tensors map axes group by group (reshape_index)


class _Deep(BaseException):
    """Raised through op renders (never caught by their `except Exception`) to Body.value's outermost call."""

    def __init__(self, body, t, idx, key):
        self.body, self.t, self.idx, self.key = body, t, idx, key


class Index:
    """A position in a tensor: per-dim u32 coordinates, a flat row-major index, or both."""

    def __init__(self, shape, coords=None, flat=None):
        self.shape = tuple(shape)
        self.coords = coords
        self.flat = flat

    def get_flat(self, body) -> str:
        if self.flat is None:
            _check_u32(self.shape)
            terms = [f"{c} * {st}u" if st != 1 else c for c, st, d in zip(self.coords, contiguous_strides(self.shape), self.shape) if d != 1]
            expr = " + ".join(terms) if terms else "0u"
            # one plain coordinate (size-1 dims added or dropped) is the flat index itself: keeping
            # its name lets a kernel see that it reads its own output at its own element
            self.flat = expr if expr.isidentifier() or expr == "0u" else body.let(expr, "u32")
        return self.flat

    def get_coords(self, body) -> list[str]:
        if self.coords is None:
            _check_u32(self.shape)
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


def _check_u32(shape) -> None:
    """A flat index is a u32: a tensor of more than 2**32 elements (a broadcast view, say) has
    positions it cannot name, and the arithmetic would wrap silently (row 64 of a 65 x 2**26 view
    read row 0)."""
    if _size(shape) > 2**32:
        raise CodegenError(
            f"a kernel needs a flat index into a tensor of shape {list(shape)} ({_size(shape)} elements), more "
            "than a u32 index can name (2**32): make that tensor smaller, or reduce it in steps (sum over "
            "one axis, then the next)"
        )


def reshape_index(body, idx: Index, shape) -> Index:
    """The position in a tensor of `shape` (a reshape's input) of position idx of its output.
    A position known only by its flat index keeps it (a contiguous read needs nothing else), as
    do all positions in tensors near the u32 limit. A position known by its coordinates has the
    dimensions matched in groups of equal product (a split or merge of axes), each group
    converted on its own: no flat index of the whole tensor is built and taken apart again [a
    convolution's unfold read through reshapes: 12 integer divisions per element became 6], and
    no index exceeds its group's size (the flat index again where the shapes share no grouping:
    then _check_u32 refuses a tensor too large for it)."""
    if idx.coords is None and _size(shape) < FLAT_RESHAPE_MAX:
        return Index(shape, flat=idx.flat)
    out_shape, coords = idx.shape, idx.get_coords(body)
    res: list[str] = []
    i = j = 0
    while i < len(out_shape) or j < len(shape):
        gi, gj, pi, pj = [i], [j], out_shape[i] if i < len(out_shape) else 1, shape[j] if j < len(shape) else 1
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj and i < len(out_shape):
                gi.append(i)
                pi *= out_shape[i]
                i += 1
            elif pj < pi and j < len(shape):
                gj.append(j)
                pj *= shape[j]
                j += 1
            else:
                return Index(shape, flat=idx.get_flat(body))
        gi = [a for a in gi if a < len(out_shape)]
        gj = [b for b in gj if b < len(shape)]
        flat = Index(tuple(out_shape[a] for a in gi), coords=[coords[a] for a in gi]).get_flat(body) if gi else "0u"
        res += Index(tuple(shape[b] for b in gj), flat=flat).get_coords(body) if gj else []
    # the row-major flat index is the same on both sides of a reshape: where it is known, it stays
    # (a contiguous read uses it, and a kernel sees that it reads its own output at its own element)
    return Index(shape, coords=res, flat=idx.flat)


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
        self._memo: dict | None = None  # values rendered by the outermost value() call now running
        self._depth = 0

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

    def _length_source(self) -> str | None:
        """A buffer this kernel binds as a runtime-sized array, whose length the shader compiler
        cannot know (None before the kernel has bound one)."""
        return next((a for a in self.kc.access if not a.endswith(VEC_SUFFIX)), None)

    def opaque_f32(self, lit: str) -> str:
        """The f32 literal as a value the shader compiler cannot fold or reassociate: selected by
        a buffer's length, known only at dispatch (wasm_values folds it back at build time). The
        literal itself where the kernel has bound no buffer yet."""
        buf = self._length_source()
        if buf is None:
            return lit
        self.helper("opaque_f32")
        return self.let(f"opaque_f32({lit}, arrayLength(&{buf}))", "f32")

    def barrier_f32(self, value: str) -> str:
        """The f32 value through barrier_f32: the same number, which the shader compiler cannot
        reassociate with the arithmetic that made it (the value itself where the kernel has bound
        no buffer yet)."""
        buf = self._length_source()
        if buf is None:
            return value
        self.helper("barrier_f32")
        return self.let(f"barrier_f32({value}, arrayLength(&{buf}))", "f32")

    def opaque_true(self) -> str:
        """A bool true at run time that the shader compiler cannot fold (opaque_f32)."""
        buf = self._length_source()
        return self.let(f"arrayLength(&{buf}) != 0u", "bool") if buf else "true"

    def value(self, t: Tensor, idx: Index) -> str:
        # Rendering follows the expression tree by recursion (op renders call value() on their
        # inputs), one Python frame or more per op: a chain of 600 fused ops would exceed the
        # interpreter's limit. So a value more than MAX_DEPTH levels down is not rendered there:
        # _Deep carries it up to the outermost call, which renders it first (from a fresh
        # depth), keeps it in a memo and retries; the retry finds it there. Each piece of a long
        # chain is rendered about twice; the text is the same as by recursion (lets are cached by
        # their expression, so a retry reuses the names the first try made).
        key = (id(t), idx.shape, tuple(idx.coords) if idx.coords is not None else None, idx.flat)
        if self._memo is not None:
            hit = self._memo.get(key)
            if hit is not None:
                return hit[1]
            if self._depth >= MAX_DEPTH:
                raise _Deep(self, t, idx, key)
            self._depth += 1
            try:
                out = self._value(t, idx)
            finally:
                self._depth -= 1
            self._memo[key] = (idx, out)
            return out
        self._memo, self._depth = {}, 0
        try:
            todo = [(t, idx, key)]
            while todo:
                u, ui, ukey = todo[-1]
                self._depth = 0
                try:
                    self._memo[ukey] = (ui, self._value(u, ui))
                    todo.pop()
                except _Deep as deep:
                    if deep.body is not self:
                        raise
                    todo.append((deep.t, deep.idx, deep.key))
            return self._memo[key][1]
        finally:
            self._memo = None

    def _value(self, t: Tensor, idx: Index) -> str:
        kc = self.kc
        if kc.acc_tensor is not None and t is kc.acc_tensor:
            return "acc"
        if id(t) in kc.computed and idx.get_flat(self) == kc.self_flat:
            return kc.computed[id(t)]  # an earlier output of this kernel, at the same element
        if t is not kc.computing and id(t) in kc.s.views:
            v = kc.s.views[id(t)]
            base = v.base
            # a view of a value this kernel has just computed is followed to that value (a
            # reshape of a fused sum, say): its storage is written only at the end of the kernel
            if not (base is not t and id(base) in kc.computed):
                return self.read(t, idx)
            if v.offset == 0 and v.is_contiguous() and t.size == base.size and idx.get_flat(self) == kc.self_flat:
                # the view's composition is the identity (transposes that undo each other, say): at
                # the kernel's own element it is that value; following its ops one by one would end
                # at a permuted index of the base, which is only in memory after the kernel
                return kc.computed[id(base)]
        od = lookup(t.node.op)
        if od.render is not None:
            return od.render(self, t.node, idx)
        return self.pointwise(t.node, idx)

    def pointwise(self, n, idx: Index) -> str:
        """The op's `expr` template applied to its inputs' values at the same index."""
        od = lookup(n.op)
        if od.expr is None:
            raise CodegenError(f"no WGSL rendering for op {n.op!r}")
        args = [self.value(x, idx) for x in n.inputs]
        expr = od.expr(n.attrs) if callable(od.expr) else od.expr
        if "{0} * {0}" in expr and produced_by(n.inputs[0], ROOTS):
            expr = expr.replace("{0} * {0}", "mul_self_f32({0})", 1)
        if "sqrt({0})" in expr and produced_by(n.inputs[0], ("div", "power")):
            # sqrt and x ** 0.5 of a quotient: NVIDIA rewrites sqrt(1 / x) as rsqrt(x), -inf at
            # x = -0 where sqrt(-inf) is NaN (x ** -1 then sqrt: H200, special seed 6120064)
            args[0] = self.barrier_f32(args[0])
        for h in EXPR_HELPERS:
            if h + "(" in expr:
                self.helper(h)
        return self.let(expr.format(*args), n.out.dtype)

    def index(self, shape, coords=None, flat=None) -> Index:
        """A position in a tensor of `shape` (for render functions: they import nothing from here)."""
        return Index(shape, coords, flat)

    def reshape_index(self, idx: Index, shape) -> Index:
        """Where position idx of a reshape's output is in its input of `shape` (reshape_index)."""
        return reshape_index(self, idx, shape)

    def helper(self, name: str) -> None:
        """Make a WGSL helper function (_helpers.wgsl.j2) available to this kernel."""
        self.kc.helpers.add(name)
        for dep in HELPER_DEPS.get(name, ()):
            self.helper(dep)

    def read(self, t: Tensor, idx: Index) -> str:
        kc = self.kc
        loc, dims = kc.plan.read_loc(kc.s, t)
        kc.use(loc.arena, write=False)
        v = kc.s.views[id(t)]
        kc.reads.append(v.base)
        if v.is_contiguous():
            lin = idx.get_flat(self) if t.size > 1 else "0u"
        else:
            c = idx.get_coords(self)
            terms = [term for ci, axis in zip(c, dims) for term in split_index(ci, axis)]
            lin = " + ".join(terms) if terms else "0u"
        start = kc.start(loc.arena, loc.offset)
        addr = lin if not start else start if lin == "0u" else f"{start} + {lin}"
        key = ("read", loc.arena, addr)
        if key not in self.cache:
            self.cache[key] = self.let(f"{loc.arena}[{addr}]", t.dtype)
        return self.cache[key]


class KernelContext:
    def __init__(self, s: KernelSchedule, plan: Plan, computing: Tensor | None, table: bool = False):
        self.s = s
        self.plan = plan
        self.computing = computing
        self.acc_tensor: Tensor | None = None
        self.computed: dict[int, str] = {}  # outputs already computed in this kernel, by value
        self.self_flat = "i"  # the kernel's own flat index: reads there may use `computed`
        self.counter = 0
        self.helpers: set[str] = set()
        self.access: dict[str, str] = {}
        self.reads: list[Tensor] = []  # storage owners read from memory, for the hazard check
        # Scratch buffers are read_write in every kernel that touches them, so that kernels which
        # only read intermediates can share a bind group with their neighbours that write them.
        # Large matmul kernels turn this off: on an H100 a matmul reading its operands through
        # read_write bindings runs 7-15% slower (4096^3: 38.1 -> 32.4 TFLOP/s;
        # scripts/results/bench_matmul_vec_rw_h100.json), far more than a bind group switch costs
        # there (transformer_large's matmuls: 28.3 -> 27.8 ms a step); a small model's step would
        # set 25 bind groups instead of 2. Attention kernels measured no gain.
        self.share_scratch = True
        # The CPU kernel set's offset table: where the kernel's tensors start in their buffers,
        # read from a uniform struct (`at`, values set per dispatch) instead of written in, so
        # that kernels differing only there have one text and the runtime compiles it once (a
        # CPU adapter compiles every kernel at its first dispatch). None: offsets written in.
        self.table: list[int] | None = [] if table else None
        self._fields: dict[tuple[str, int], str] = {}

    def start(self, arena: str, offset: int) -> str:
        """Where a tensor starts in `arena`, as a WGSL term of an address ("" for a constant 0)."""
        if self.table is None:
            return f"{offset}u" if offset else ""
        key = (arena, offset)
        if key not in self._fields and len(self.table) >= OFFSETS_SLOT_WORDS:
            # the slot is full (a concat of many pieces): the rest are written in, as in the GPU set
            return f"{offset}u" if offset else ""
        if key not in self._fields:
            self._fields[key] = f"at.o{len(self.table)}"
            self.table.append(offset)
        return self._fields[key]

    def use(self, arena: str, write: bool):
        if write or (self.share_scratch and arena.startswith("work")):
            self.access[arena] = "read_write"
        else:
            self.access.setdefault(arena, "read")

    def bindings(self) -> list[tuple[str, str]]:
        access = same_access(self.access)
        return [(a, access[a]) for a in sorted(access, key=arena_binding)]

    def binding_text(self) -> str:
        # each buffer has one binding number in every kernel, so neighbouring kernels can share a bind group
        lines = [
            f"@group(0) @binding({arena_binding(a)}) var<storage, {acc}> {a}: array<{arena_dtype(a)}>;"
            for a, acc in self.bindings()
        ]
        if self.table:
            lines += [
                "// Where each tensor starts in its buffer (elements), set for each dispatch: kernels that",
                "// differ only there share one compiled pipeline.",
                "struct Offsets {",
                *(f"    o{i}: u32," for i in range(len(self.table))),
                "}",
                f"@group(0) @binding({OFFSETS_BINDING}) var<uniform> at: Offsets;",
            ]
        return "\n".join(lines)
