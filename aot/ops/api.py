"""The public op functions (API.md §2), re-exported by `aot.ops`.

Each function checks its arguments, makes broadcasting explicit and emits primitives
(registry entries in this package) or composes them (softmax, cross_entropy, conv2d, ...).
Composites have no kernel or VJP of their own: fusion recovers the kernel count.
"""

from __future__ import annotations

import builtins as _b
import math
from typing import Sequence

from ..ir import Tensor
from .trace import current, emit, fail, is_training

import numbers

Scalar = (numbers.Real,)  # Python and NumPy real scalars


def _is_tensor(x) -> bool:
    return isinstance(x, Tensor)


def _const(value, dtype: str) -> Tensor:
    return emit("const", (), value=float(value) if dtype == "f32" else int(value), dtype=dtype)


def broadcast_shapes(op: str, *shapes) -> tuple[int, ...]:
    rank = _b.max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0} - {1}
        if len(dims) > 1:
            fail(op, "shapes " + " and ".join(str(list(s)) for s in shapes) + " do not broadcast",
                 "NumPy broadcasting: trailing dims must be equal or 1")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _lift(op: str, xs) -> list[Tensor]:
    """Python scalars become constants of the tensors' dtype; then everything is broadcast."""
    tensors = [x for x in xs if _is_tensor(x)]
    if not tensors:
        fail(op, "needs at least one Tensor operand")
    dtype = tensors[0].dtype
    out = []
    for x in xs:
        if _is_tensor(x):
            out.append(x)
        elif isinstance(x, Scalar) and not isinstance(x, bool):
            out.append(_const(float(x) if dtype == "f32" else int(x), dtype))
        else:
            fail(op, f"operand of type {type(x).__name__} is neither a Tensor nor a Python number")
    shape = broadcast_shapes(op, *[t.shape for t in out])
    return [t if t.shape == shape else broadcast_to(t, shape) for t in out]


def _binary(op):
    def f(a, b):
        return emit(op, _lift(op, (a, b)))

    f.__name__ = op
    f.__doc__ = f"Elementwise {op} with NumPy broadcasting; a Python number is allowed on either side."
    return f


add = _binary("add")
sub = _binary("sub")
mul = _binary("mul")
div = _binary("div")
maximum = _binary("maximum")
minimum = _binary("minimum")
less = _binary("less")
greater = _binary("greater")
equal = _binary("equal")


def _mul_exp(a, y):
    """a * exp(y) for y <= 0, rounded once (silu's and mish's tails; elementwise.py)."""
    x, z = _lift("mul_exp", (a, y))
    return emit("mul_exp", (x, z))


def where(cond, a, b):
    """`a` where `cond` is nonzero, else `b` (cond is an f32 0/1 mask, e.g. from less/greater)."""
    if not _is_tensor(cond):
        fail("where", "the condition must be a Tensor")
    # branches first: a Python number takes the dtype of the tensor branch, not the mask's
    x, y, c = _lift("where", (a, b, cond))
    return emit("where", (c, x, y))


def _unary(op):
    def f(x):
        if not _is_tensor(x):
            fail(op, f"expects a Tensor, got {type(x).__name__}")
        return emit(op, (x,))

    f.__name__ = op
    f.__doc__ = f"Elementwise {op} (f32)."
    return f


neg = _unary("neg")
abs = _unary("abs")  # noqa: A001 - the API name
sign = _unary("sign")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
exp = _unary("exp")
log = _unary("log")
square = _unary("square")
sin = _unary("sin")
cos = _unary("cos")
tanh = _unary("tanh")
sigmoid = _unary("sigmoid")
relu = _unary("relu")
erf = _unary("erf")
stop_gradient = _unary("stop_gradient")


def power(x, p):
    """x ** p for a Python-number exponent; b ** p for a positive finite number b and a Tensor p
    (pow's accuracy, "rpower"); a Tensor base with a Tensor exponent uses exp(p * log(x)) (x > 0)."""
    if _is_tensor(x) and isinstance(p, Scalar):
        if p == 1:
            return x
        return emit("power", (x,), p=float(p))
    if _is_tensor(p) and isinstance(x, Scalar) and not isinstance(x, bool) and 0 < x < math.inf:
        _check_f32("power", p)
        return emit("rpower", (p,), b=float(x))
    if _is_tensor(p) or _is_tensor(x):
        base = x if _is_tensor(x) else _const(x, "f32")
        return exp(mul(p, log(base)))
    fail("power", "needs a Tensor operand")


def gelu(x, approximate: str = "none"):
    """GELU: exact erf form by default, `approximate="tanh"` for the tanh form (PyTorch's two)."""
    _check_f32("gelu", x)
    # Gradients as torch's gelu_backward: the cotangent times one derivative factor. Through the
    # primitives it would be ct * cdf + (ct * x) * pdf, NaN for an inf cotangent where pdf is 0
    # (x = 1e30) or x * pdf underflows (x = 1e-40), where torch's is inf.
    if approximate == "tanh":
        # 0.5 x (1 + tanh(u)) as x sigmoid(2u): the same function, without 1 + tanh(u) cancelling
        # for x < -3 (where torch float32's values are off by up to 10%)
        inner = math.sqrt(8.0 / math.pi) * (x + 0.044715 * x * x * x)
        s = sigmoid(inner)

        def rule_tanh(ct, y, ins):
            # ct times one factor (an inf cotangent stays inf); below SILU_TAIL, where s goes
            # subnormal, the factor is (1 + x du) exp(inner) in one rounding
            du = math.sqrt(8.0 / math.pi) * (1.0 + (3 * 0.044715) * ins[0] * ins[0])
            near = s + ins[0] * (s * (1.0 - s)) * du
            # (1 + x du) exp(inner) as exp(inner) + x (du exp(inner)): for x = -1.4e18, x du
            # overflows where exp(inner) is 0 (NaN; torch's (x / 2 * 0) * du is 0: hour run 8,
            # special seed 5422105), and du = inf (x < -1.8e19) is NaN in both
            y = minimum(inner, SILU_TAIL)
            far = exp(y) + ins[0] * _mul_exp(du, y)
            return (ct * where(less(inner, SILU_TAIL), far, near),)

        return custom_vjp(_times_sigmoid(x, inner), (x,), rule_tanh)
    if approximate != "none":
        fail("gelu", f"approximate must be 'none' or 'tanh', got {approximate!r}")
    cdf = 0.5 * (1.0 + erf(x * (1.0 / math.sqrt(2.0))))

    def rule(ct, y, ins):
        pdf = exp(ins[0] * ins[0] * -0.5) * (1.0 / math.sqrt(2.0 * math.pi))
        return (ct * (cdf + ins[0] * pdf),)

    return custom_vjp(x * cdf, (x,), rule)


SILU_TAIL = -20.0  # below, a sigmoid(z) = a exp(z) / (1 + exp(z)) is a exp(z) to 1e-9 relative


def _times_sigmoid(a, z):
    """a * sigmoid(z), as a exp(z) in one rounding below SILU_TAIL: sigmoid(z) goes subnormal
    below -87.3 where the product may still be normal (silu down to -91.5), and a GPU that
    flushes subnormals (NVIDIA) would give 0."""
    return where(less(z, SILU_TAIL), _mul_exp(a, minimum(z, SILU_TAIL)), a * sigmoid(z))


def silu(x):
    _check_f32("silu", x)
    return _times_sigmoid(x, x)


# ---- reductions ----------------------------------------------------------------------


def normalize_axes(op: str, x: Tensor, axis) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not isinstance(a, int) or not -x.ndim <= a < _b.max(x.ndim, 1):
            fail(op, f"axis {a} is out of range for {x.type_str()}")
        out.append(a % x.ndim if x.ndim else 0)
    if len(set(out)) != len(out):
        fail(op, f"repeated axis in {axis}")
    return tuple(sorted(out))


def _check_tensor(op, x):
    if not _is_tensor(x):
        fail(op, f"expects a Tensor, got {type(x).__name__}")


def _check_f32(op, x):
    # composites check here so the error names the op the user called, not an inner primitive
    _check_tensor(op, x)
    if x.dtype != "f32":
        fail(op, f"expects an f32 operand, got {x.type_str()}", "use ops.cast(x, 'f32') first")


def sum(x, axis=None, keepdims: bool = False):  # noqa: A001 - the API name
    _check_tensor("sum", x)
    axes = normalize_axes("sum", x, axis)
    if not axes:
        return x
    return emit("sum", (x,), axes=axes, keepdims=bool(keepdims))


def mean(x, axis=None, keepdims: bool = False):
    _check_f32("mean", x)
    axes = normalize_axes("mean", x, axis)
    count = 1
    for a in axes:
        count *= x.shape[a]
    return mul(sum(x, axes, keepdims), 1.0 / count)


def max(x, axis=None, keepdims: bool = False):  # noqa: A001 - the API name
    _check_tensor("max", x)
    axes = normalize_axes("max", x, axis)
    if not axes:
        return x
    return emit("max", (x,), axes=axes, keepdims=bool(keepdims))


def argmax(x, axis=None, keepdims: bool = False):
    """Index of the first maximum along `axis` (i32); axis=None flattens first (NumPy)."""
    _check_tensor("argmax", x)
    if axis is None:
        flat = reshape(x, (-1,))
        r = emit("argmax", (flat,), axis=0, keepdims=False)
        return reshape(r, (1,) * x.ndim) if keepdims else r
    if not isinstance(axis, int):
        fail("argmax", f"axis must be an int or None, got {axis!r}")
    (a,) = normalize_axes("argmax", x, axis)
    return emit("argmax", (x,), axis=a, keepdims=bool(keepdims))


# ---- layout --------------------------------------------------------------------------


def reshape(x, shape):
    _check_tensor("reshape", x)
    shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
    if shape.count(-1) > 1:
        fail("reshape", f"only one -1 is allowed in {list(shape)}")
    if -1 in shape:
        known = 1
        for d in shape:
            known *= d if d != -1 else 1
        if known == 0 or x.size % known:
            fail("reshape", f"cannot infer -1 reshaping {x.type_str()} to {list(shape)}")
        shape = tuple(x.size // known if d == -1 else d for d in shape)
    if shape == x.shape:
        return x
    return emit("reshape", (x,), shape=shape)


def transpose(x, axes=None):
    _check_tensor("transpose", x)
    perm = tuple(reversed(range(x.ndim))) if axes is None else tuple(a % x.ndim if isinstance(a, int) and -x.ndim <= a < x.ndim else a for a in axes)
    if perm == tuple(range(x.ndim)):
        return x
    return emit("transpose", (x,), perm=perm)


def swapaxes(x, a: int, b: int):
    _check_tensor("swapaxes", x)
    a, b = normalize_axes("swapaxes", x, a)[0], normalize_axes("swapaxes", x, b)[0]
    perm = list(range(x.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, tuple(perm))


def broadcast_to(x, shape):
    _check_tensor("broadcast_to", x)
    shape = tuple(int(d) for d in shape)
    if shape == x.shape:
        return x
    return emit("broadcast_to", (x,), shape=shape)


def concat(xs: Sequence[Tensor], axis: int = 0):
    xs = list(xs)
    if not xs or not all(_is_tensor(x) for x in xs):
        fail("concat", "expects a non-empty list of Tensors")
    (a,) = normalize_axes("concat", xs[0], axis)
    if len(xs) == 1:
        return xs[0]
    return emit("concat", xs, axis=a)


def stack(xs: Sequence[Tensor], axis: int = 0):
    xs = list(xs)
    if not xs or not all(_is_tensor(x) for x in xs):
        fail("stack", "expects a non-empty list of Tensors")
    rank = xs[0].ndim + 1
    if not -rank <= axis < rank:
        fail("stack", f"axis {axis} is out of range for rank {rank}")
    a = axis % rank
    for x in xs:
        if x.shape != xs[0].shape:
            fail("stack", f"all tensors need the same shape, got {xs[0].type_str()} and {x.type_str()}")
    return concat([reshape(x, x.shape[:a] + (1,) + x.shape[a:]) for x in xs], a)


def narrow(x, axis: int, start: int, length: int):
    _check_tensor("narrow", x)
    (a,) = normalize_axes("narrow", x, axis)
    if start == 0 and length == x.shape[a]:
        return x
    return emit("narrow", (x,), axis=a, start=int(start), length=int(length))


def pad(x, axis: int, before: int, after: int):
    """Zero-pad one axis (narrow's transpose)."""
    _check_tensor("pad", x)
    (a,) = normalize_axes("pad", x, axis)
    if before == 0 and after == 0:
        return x
    return emit("pad", (x,), axis=a, before=int(before), after=int(after))


def flip(x, axes):
    """Reverse `x` along each of `axes` (np.flip)."""
    _check_tensor("flip", x)
    axes = normalize_axes("flip", x, axes)
    return emit("flip", (x,), axes=axes) if axes else x


def split(x, sizes, axis: int = 0):
    """Split into pieces along `axis`: `sizes` is a list of piece sizes, or an int piece size (torch.split)."""
    _check_tensor("split", x)
    (a,) = normalize_axes("split", x, axis)
    n = x.shape[a]
    if isinstance(sizes, int):
        if sizes <= 0:
            fail("split", f"piece size must be positive, got {sizes}")
        sizes = [sizes] * (n // sizes) + ([n % sizes] if n % sizes else [])
    sizes = list(sizes)
    if _b.sum(sizes) != n:
        fail("split", f"sizes {sizes} add up to {_b.sum(sizes)}, but axis {a} has size {n}")
    out, start = [], 0
    for s in sizes:
        out.append(narrow(x, a, start, s))
        start += s
    return out


# ---- linear algebra, indexing, casting ---------------------------------------------------


def matmul(a, b):
    """`[..., M, K] @ [K, N]` or batched `[..., M, K] @ [..., K, N]` (equal batch dims)."""
    if not (_is_tensor(a) and _is_tensor(b)):
        fail("matmul", "expects two Tensors")
    return emit("matmul", (a, b))


def cast(x, dtype: str):
    _check_tensor("cast", x)
    if dtype == x.dtype:
        return x
    return emit("cast", (x,), dtype=dtype)


def one_hot(idx, depth: int):
    """f32[..., depth] with a 1 at each index (all zeros for an out-of-range index)."""
    _check_tensor("one_hot", idx)
    return emit("one_hot", (idx,), depth=int(depth))


def arange(n: int, dtype: str = "i32"):
    return emit("arange", (), n=int(n), dtype=dtype)


def embedding(table, idx):
    """Rows of `table` [V, D] picked by i32 `idx` [...] -> [..., D]."""
    if not (_is_tensor(table) and _is_tensor(idx)):
        fail("embedding", "expects (table, idx) Tensors")
    if idx.dtype != "i32" or table.ndim < 1:
        fail("embedding", f"expects table [V, ...] and i32 indices, got {table.type_str()} and {idx.type_str()}",
             "cast float indices with ops.cast(idx, 'i32')")
    return emit("gather", (table, idx))


def take_along_axis(x, idx, axis: int):
    if not (_is_tensor(x) and _is_tensor(idx)):
        fail("take_along_axis", "expects (x, idx) Tensors")
    (a,) = normalize_axes("take_along_axis", x, axis)
    return emit("take_along_axis", (x, idx), axis=a)


# ---- ML composites ---------------------------------------------------------------------


def custom_vjp(out: Tensor, inputs: tuple, rule) -> Tensor:
    """Differentiate the composite that computed `out` from `inputs` with `rule(ct, out, inputs)`
    instead of through its primitives (which then need not be kept for the backward pass)."""
    current().meta.setdefault("custom_vjp", {})[id(out)] = (tuple(inputs), rule)
    return out


def softmax(x, axis: int = -1):
    # subtracting the (gradient-free) max keeps exp in range; softmax is shift-invariant
    _check_f32("softmax", x)
    normalize_axes("softmax", x, axis)
    m = stop_gradient(max(x, axis, keepdims=True))
    e = exp(x - m)
    y = e / sum(e, axis, keepdims=True)
    # d/dx softmax: y * (ct - sum(ct * y)); only y stays alive for the backward pass
    return custom_vjp(y, (x,), lambda ct, y, ins: (y * (ct - sum(ct * y, axis, keepdims=True)),))


def log_softmax(x, axis: int = -1):
    _check_f32("log_softmax", x)
    normalize_axes("log_softmax", x, axis)
    m = stop_gradient(max(x, axis, keepdims=True))
    z = x - m
    y = z - log(sum(exp(z), axis, keepdims=True))
    # d/dx log_softmax: ct - softmax * sum(ct), with softmax = exp(y)
    # exp(y) * sum(ct) in one rounding (mul_exp): exp(y) alone is subnormal below -87.3, 0 on a GPU
    # that flushes, and an inf sum then gave NaN where torch's is inf (H200, special seed 5480305)
    return custom_vjp(y, (x,), lambda ct, y, ins: (ct - _mul_exp(sum(ct, axis, keepdims=True), y),))


def causal_mask(t: int):
    """f32[t, t] with 1 where key index > query index (the masked, future positions)."""
    rows = reshape(arange(t), (t, 1))
    cols = reshape(arange(t), (1, t))
    return greater(broadcast_to(cols, (t, t)), broadcast_to(rows, (t, t)))


def softmax_causal(scores):
    """Softmax over the last axis of scores [..., T, T], masking keys after each query."""
    _check_f32("softmax_causal", scores)
    if scores.ndim < 2 or scores.shape[-1] != scores.shape[-2]:
        fail("softmax_causal", f"expects scores [..., T, T], got {scores.type_str()}")
    # -inf, as torch's masked_fill: a finite mask (-1e30) gave the future keys the weight where the
    # visible scores were below it or all -inf (torch: NaN there; hour-run seed 4160454)
    masked = where(broadcast_to(causal_mask(scores.shape[-1]), scores.shape), -math.inf, scores)
    return softmax(masked, -1)


def attention(q, k, v, causal: bool = False, scale=None):
    """softmax(q k^T * scale) v over the last two axes (API.md §6): q [..., Tq, d], k [..., Tk, d],
    v [..., Tk, dv] -> [..., Tq, dv]; scale defaults to 1/sqrt(d). Leading dims broadcast (NumPy
    rules; a k/v shared by all heads costs no copy). causal=True masks key j for query i when
    j > i, aligned top-left when Tq != Tk, as torch's `scaled_dot_product_attention(is_causal=True)`.
    Computed by fused kernels (aot/ops/attention.py) that never store the T x T scores."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not _is_tensor(x):
            fail("attention", f"{name} must be a Tensor, got {type(x).__name__}")
        _check_f32("attention", x)
        if x.ndim < 2:
            fail("attention", f"{name} needs at least 2 dims [..., T, d], got {x.type_str()}")
    if q.shape[-1] != k.shape[-1]:
        fail("attention", f"q and k need the same head size (last dim), got q {q.type_str()} and k {k.type_str()}")
    if k.shape[-2] != v.shape[-2]:
        fail("attention", f"k and v need the same number of keys (dim -2), got k {k.type_str()} and v {v.type_str()}")
    if not isinstance(causal, bool):
        fail("attention", f"causal must be True or False, got {causal!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if not isinstance(scale, Scalar) or isinstance(scale, bool) or not math.isfinite(scale):
        fail("attention", f"scale must be a finite number or None, got {scale!r}")
    lead = broadcast_shapes("attention", q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q, k, v = (broadcast_to(x, lead + x.shape[-2:]) for x in (q, k, v))
    return emit("attention", (q, k, v), causal=causal, scale=float(scale))


def lstm_seq(xw, w_hh, h0=None, c0=None, reverse: bool = False):
    """Every step of one LSTM direction in one kernel (aot/ops/recurrent.py): xw [T, B, 4H] (the
    input projection plus both biases, time-major, gates i, f, g, o as torch orders them), w_hh
    torch's [4H, H] weight_hh, h0 and c0 [B, H] both or neither (zeros) -> [T, B, 6H]: per
    position t the lanes [h | c | i | f | g | o] of the step that consumed it (reverse: steps
    run t = T-1 .. 0). H is at most aot.ops.recurrent.MAX_HIDDEN; nn.LSTM uses it up to there."""
    for name, x in (("xw", xw), ("w_hh", w_hh)) + ((("h0", h0), ("c0", c0)) if h0 is not None or c0 is not None else ()):
        if not _is_tensor(x):
            fail("lstm_seq", f"{name} must be a Tensor, got {type(x).__name__} (h0 and c0 go together)")
        _check_f32("lstm_seq", x)
    if not isinstance(reverse, bool):
        fail("lstm_seq", f"reverse must be True or False, got {reverse!r}")
    state = (h0, c0) if h0 is not None else ()
    return emit("lstm_seq", (xw, transpose(w_hh, (1, 0))) + state, reverse=reverse)


# cross_entropy lives with the other losses (losses.py)


def _uniform(shape, salt: int):
    """U[0, 1) noise (24-bit steps), new every step: hashed from the step's seed input, the salt and the index."""
    g = current()
    seed = g.meta.get("rng_input")
    if seed is None:
        seed = emit("input", (), name="_rng", shape=(), dtype="i32")
        g.meta["rng_input"] = seed
    return emit("rand", (seed,), shape=tuple(shape), salt=int(salt))


def _next_salt() -> int:
    # one salt per random op in graph order, so two calls in one graph draw independent streams
    g = current()
    salt = g.meta["rand_count"] = g.meta.get("rand_count", 0) + 1
    return salt


def _shape_arg(op: str, shape) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, int) else shape
    try:
        out = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        fail(op, f"shape must be an int or a sequence of ints, got {shape!r}")
    if any(d < 0 for d in out):
        fail(op, f"shape {list(out)} has a negative dim")
    return out


def rand(shape):
    """f32[shape] uniform in [0, 1), new values at every call of the entry point (a training step,
    an infer call), reproducible from the model's seed; a leaf (no gradient)."""
    return _uniform(_shape_arg("rand", shape), _next_salt())


def randn(shape):
    """f32[shape] standard normal noise (Box-Muller over two uniform draws), new at every call,
    reproducible from the model's seed; a leaf (no gradient)."""
    shape = _shape_arg("randn", shape)
    u1, u2 = _uniform(shape, _next_salt()), _uniform(shape, _next_salt())
    # 1 - u1 is in (0, 1], so the log is finite; the clamp keeps an inexact GPU log(~1) from
    # going positive and turning sqrt into NaN
    r = sqrt(maximum(log(1.0 - u1) * -2.0, 0.0))
    return r * cos(u2 * (2.0 * math.pi))


def categorical(logits, axis: int = -1):
    """i32 samples with probabilities softmax(logits) along `axis` (removed from the shape), by the
    Gumbel-max trick: argmax(logits + g), g = -log(-log(u)). New draws at every call; no gradient."""
    _check_f32("categorical", logits)
    if not isinstance(axis, int):
        fail("categorical", f"axis must be an int, got {axis!r}")
    if logits.ndim == 0:
        fail("categorical", f"expects logits with a class axis, got {logits.type_str()}")
    (a,) = normalize_axes("categorical", logits, axis)
    u = _uniform(logits.shape, _next_salt())
    # u = 0 is clamped (log(0)); -log(u) is clamped above 0 for u next to 1
    e = maximum(neg(log(maximum(u, 1e-10))), 1e-20)
    return argmax(logits - log(e), a)


def rope(x, base: float = 10000.0):
    """Rotary position embedding of x [..., T, D] (D even), rotate-half convention (Llama):
    out = x * cos + concat(-x2, x1) * sin with x1, x2 the halves of the last axis and angle
    t * base**(-2i/D) at position t = 0..T-1, frequency i = 0..D/2-1 (cos, sin repeated over both halves)."""
    _check_f32("rope", x)
    if x.ndim < 2 or x.shape[-1] % 2:
        fail("rope", f"expects x [..., T, D] with an even D, got {x.type_str()}")
    if not isinstance(base, Scalar) or isinstance(base, bool) or not base > 0:
        fail("rope", f"base must be a positive number, got {base!r}")
    t, d = x.shape[-2], x.shape[-1]
    half = d // 2
    # the tables are built in-graph: base**(-2i/D) = exp(i * (-2 ln(base) / D))
    inv_freq = exp(arange(half, "f32") * (-2.0 * math.log(float(base)) / d))
    angle = reshape(arange(t, "f32"), (t, 1)) * reshape(inv_freq, (1, half))  # [T, D/2]
    c, s = cos(angle), sin(angle)
    c, s = concat([c, c], -1), concat([s, s], -1)  # [T, D]
    x1, x2 = narrow(x, -1, 0, half), narrow(x, -1, half, half)
    return x * c + concat([neg(x2), x1], -1) * s


def dropout(x, p: float):
    """Inverted dropout: zero with probability p, scale kept values by 1/(1-p); identity in Infer graphs."""
    _check_tensor("dropout", x)
    if not 0.0 <= p < 1.0:
        fail("dropout", f"p must be in [0, 1), got {p}")
    if not is_training() or p == 0.0:
        return x
    keep = greater(_uniform(x.shape, _next_salt()), p)  # P(u > p) = 1 - p
    return x * keep * (1.0 / (1.0 - p))


def _pair(v, name, op):
    if isinstance(v, int):
        return (v, v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(i, int) for i in v):
        return (int(v[0]), int(v[1]))
    fail(op, f"{name} must be an int or a pair of ints, got {v!r}")


def _check_window(op, x, k, stride, padding):
    _check_f32(op, x)
    if _b.min(stride) < 1 or _b.min(padding) < 0:
        fail(op, f"stride must be >= 1 and padding >= 0, got stride={stride}, padding={padding}")
    if _b.any(x.shape[2 + a] + 2 * padding[a] < k[a] for a in range(2)):
        fail(op, f"kernel {list(k)} does not fit the input {x.type_str()} padded by {list(padding)}")


def _dil(dilation) -> dict:
    # dilation is an attribute only where it is not (1, 1): graphs without it read as before
    return {} if tuple(dilation) == (1, 1) else {"dilation": tuple(int(d) for d in dilation)}


def unfold(x, k, stride, padding, value: float = 0.0, dilation=(1, 1)):
    return emit("unfold", (x,), k=tuple(k), stride=tuple(stride), padding=tuple(padding), value=float(value), **_dil(dilation))


def fold(cols, size, stride, padding, dilation=(1, 1)):
    return emit("fold", (cols,), size=tuple(size), stride=tuple(stride), padding=tuple(padding), **_dil(dilation))


def conv2d(x, w, stride=1, padding=0, groups: int = 1, dilation=1):
    """NCHW convolution: x[N, C, H, W], w[O, C/groups, kh, kw] (PyTorch's layout) -> [N, O, OH, OW];
    dilation spaces the kernel taps (torch's)."""
    if not (_is_tensor(x) and _is_tensor(w)):
        fail("conv2d", "expects (x, w) Tensors")
    _check_f32("conv2d", x)
    _check_f32("conv2d", w)
    if x.ndim != 4 or w.ndim != 4:
        fail("conv2d", f"expects x[N,C,H,W] and w[O,C/groups,kh,kw], got {x.type_str()} and {w.type_str()}")
    s, p = _pair(stride, "stride", "conv2d"), _pair(padding, "padding", "conv2d")
    d = _pair(dilation, "dilation", "conv2d")
    n, c, _, _ = x.shape
    o, cg, kh, kw = w.shape
    if not isinstance(groups, int) or groups < 1 or c % groups or o % groups or cg != c // groups:
        fail("conv2d", f"w {w.type_str()} does not fit x {x.type_str()} with groups={groups}",
             "w must be [out, in/groups, kh, kw] and groups must divide in and out")
    if _b.min(d) < 1:
        fail("conv2d", f"dilation must be >= 1, got {d}")
    _check_window("conv2d", x, (d[0] * (kh - 1) + 1, d[1] * (kw - 1) + 1), s, p)
    cols = unfold(x, (kh, kw), s, p, 0.0, d)  # [N, C, kh, kw, OH, OW]
    oh, ow = cols.shape[4], cols.shape[5]
    og = o // groups
    # [N, G, cg*kh*kw, OH*OW] -> [G, N*OH*OW, cg*kh*kw] @ [G, cg*kh*kw, og] -> [G, N*OH*OW, og]
    cols = reshape(cols, (n, groups, cg * kh * kw, oh * ow))
    lhs = reshape(transpose(cols, (1, 0, 3, 2)), (groups, n * oh * ow, cg * kh * kw))
    rhs = transpose(reshape(w, (groups, og, cg * kh * kw)), (0, 2, 1))
    out = matmul(lhs, rhs) if groups > 1 else matmul(reshape(lhs, lhs.shape[1:]), reshape(rhs, rhs.shape[1:]))
    out = reshape(out, (groups, n, oh, ow, og))
    out = reshape(transpose(out, (1, 0, 4, 2, 3)), (n, o, oh, ow))
    if groups == 1 and s == (1, 1) and d == (1, 1) and p[0] < kh and p[1] < kw:
        return custom_vjp(out, (x, w), lambda ct, out, ins: _conv2d_vjp(ct, x, w, p))
    return out


def _conv2d_vjp(ct, x, w, padding):
    """Stride-1 convolution's gradients as two more convolution-shaped matmuls whose unfolded
    operand is computed inside the matmul (never stored), so no im2col columns stay alive
    from the forward pass to the backward pass, and no column gradient is materialized:
      dW[o, c, i, j] = sum_{n,y,x} ct[n, o, y, x] * x_pad[n, c, y + i, x + j]
      dx = conv2d(ct, w flipped in space with in/out swapped, padding k - 1 - p)  (full correlation)"""
    n, c = x.shape[0], x.shape[1]
    o, _, kh, kw = w.shape
    oh, ow = ct.shape[2], ct.shape[3]
    cols = unfold(x, (kh, kw), (1, 1), padding)  # [N, C, kh, kw, OH, OW]
    rows = reshape(transpose(cols, (0, 4, 5, 1, 2, 3)), (n * oh * ow, c * kh * kw))
    g = reshape(transpose(ct, (1, 0, 2, 3)), (o, n * oh * ow))
    dw = reshape(matmul(g, rows), w.shape)
    wt = transpose(flip(w, (2, 3)), (1, 0, 2, 3))  # [C, O, kh, kw]
    dx = conv2d(ct, wt, 1, (kh - 1 - padding[0], kw - 1 - padding[1]))
    return dx, dw


def max_pool2d(x, k, stride=None, padding=0):
    """Max over k x k windows of NCHW input (padding counts as -inf, as in PyTorch)."""
    _check_tensor("max_pool2d", x)
    if x.ndim != 4:
        fail("max_pool2d", f"expects x[N,C,H,W], got {x.type_str()}")
    kk = _pair(k, "k", "max_pool2d")
    s = kk if stride is None else _pair(stride, "stride", "max_pool2d")
    p = _pair(padding, "padding", "max_pool2d")
    _check_window("max_pool2d", x, kk, s, p)
    cols = unfold(x, kk, s, p, value=-3.0e38)
    return max(cols, (2, 3))

