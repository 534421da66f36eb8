"""Elementwise primitives: unary math, binary arithmetic, comparisons, where, cast, const.

Binary primitives see operands of equal shape: the public functions in `aot.ops` insert
`broadcast_to` first, so every rule here is one line and unbroadcasting lives in
broadcast_to's VJP alone.
"""

from __future__ import annotations

import math

import numpy as np

from ..templates import wgsl_f32, wgsl_i32
from .registry import COSTLY, FOLLOW, Bad, OpDef, follow, lookup, register
from . import api as F

# Mesa folds sqrt(a) * sqrt(a) to |a| and rsqrt(a) * rsqrt(a) to 1 / a (inexact rewrites): a
# NaN for a < 0 becomes a number. A square of their results is written with mul_self_f32
# (here for the ops, wgsl_expr.py for fused kernels).
ROOTS = ("sqrt", "rsqrt")


def produced_by(t, ops) -> bool:
    """Whether tensor t is the output of one of these ops (x ** +-0.5 counts as a root: it is
    rendered with sqrt)."""
    node = getattr(t, "node", None)
    # through stop_gradient (the same value: sqrt(a) through it squares to |a| as well, special
    # seed 5360124), neg and abs (compilers fold them into the square: (-sqrt(a))^2 was |a| on
    # lavapipe, hour run 8's special seed 5421717)
    while node is not None and node.op in ("stop_gradient", "neg", "abs"):
        node = getattr(node.inputs[0], "node", None)
    if node is not None and node.op == "power" and "sqrt" in ops:
        return abs(node.attrs.get("p", 0)) == 0.5
    return node is not None and node.op in ops


_erf = np.frompyfunc(math.erf, 1, 1)


def _f32_only(name):
    def rule(*ins, **attrs):
        for shape, dtype in ins:
            if dtype != "f32":
                raise Bad(
                    f"expects f32 operands, got {dtype}",
                    "i32 tensors are indices; use ops.cast(x, 'f32') to compute with them",
                )
        shapes = {s for s, _ in ins}
        if len(shapes) > 1:
            raise Bad("operand shapes differ (the IR expects broadcasting to be explicit)")
        return ins[0][0], "f32"

    return rule


def _same_shape_any_dtype(out_dtype=None):
    def rule(*ins, **attrs):
        if len({s for s, _ in ins}) > 1:
            raise Bad("operand shapes differ (the IR expects broadcasting to be explicit)")
        if len({d for _, d in ins}) > 1:
            raise Bad("operand dtypes differ; cast one of them with ops.cast")
        return ins[0][0], out_dtype or ins[0][1]

    return rule


def _unary(name, ref, vjp, expr, cost=1):
    register(OpDef(name, _f32_only(name), ref, vjp, "pointwise", expr=expr, cost=cost))


# Unary math. VJPs are written with public ops so they trace like user code.
_unary("neg", lambda x: -x, lambda ct, n: (F.neg(ct),), "-{0}")
# sign(0) = 0, so d|x|/dx at 0 is 0 (PyTorch's choice).
_unary("abs", np.abs, lambda ct, n: (ct * F.sign(n.inputs[0]),), "abs({0})")
# sign(NaN) = 0 as torch.sign (and so abs's gradient at NaN); NumPy's is NaN
register(OpDef("sign", _f32_only("sign"), lambda x: np.where(np.isnan(x), x.dtype.type(0), np.sign(x)), None, "pointwise",
               expr="sign({0})", nondiff=True))
# sqrt(+-0) is +-0 by a select: NVIDIA computes sqrt(x) as x * rsqrt(x), NaN at -0 (torch -0;
# H200, special seed 5490228: (1 / -inf) ** 0.5). The zero is x's sign bit alone, not x: NVIDIA
# also compares a subnormal x equal to 0, and x itself was then sqrt(1e-40) = 1e-40, whose log
# (log_f32 reads the bits) was -92.1 where torch's is -46.1 (H200, special seed 6120143)
SQRT = "select(sqrt({0}), bitcast<f32>(bitcast<u32>({0}) & 0x80000000u), {0} == 0.0)"
# the gradient ct / (2 sqrt(x)) in torch's order: (ct * 0.5) / sqrt(x) halved a subnormal ct first,
# losing its last bit, which 1 / sqrt(x) then scaled up (14% off at x = 1.4e-45: hour run 20's
# special seed 5820181)
_unary("sqrt", np.sqrt, lambda ct, n: (ct / (n.out * 2.0),), SQRT, COSTLY)
# rsqrt(-0) = -inf as IEEE's and torch's; written by the bits in rsqrt_f32, as Mesa takes
# inverseSqrt's result for non-negative and folds what reads it on that assumption (expm1 of it:
# -inf, not -1)
_unary("rsqrt", lambda x: (1.0 / np.sqrt(x)).astype(x.dtype), lambda ct, n: (ct * -0.5 * n.out * n.out * n.out,), "rsqrt_f32({0})", COSTLY)
_unary("exp", np.exp, lambda ct, n: (ct * n.out,), "exp_f32({0})", COSTLY)
_unary("log", np.log, lambda ct, n: (ct / n.inputs[0],), "log_f32({0})", COSTLY)
# exp, log, sin, cos and erf are aot's own (_helpers.wgsl.j2), as tanh: WGSL bounds its builtins' error only
# absolutely and drivers take shortcuts (sin(1e-7) = 0 on NVIDIA, erf off 11% at 1e-6)
_unary("sin", np.sin, lambda ct, n: (ct * F.cos(n.inputs[0]),), "sin_f32({0})", COSTLY)
_unary("cos", np.cos, lambda ct, n: (F.neg(ct * F.sin(n.inputs[0])),), "cos_f32({0})", COSTLY)
_unary("tanh", np.tanh, lambda ct, n: (ct * (1.0 - F.square(n.out)),), "tanh_f32({0})", COSTLY)


def _sigmoid_ref(x):
    """1 / (1 + e^-x) for x >= 0 and e^x / (1 + e^x) below, both through e = exp(-|x|) <= 1: the
    first form's exp(-x) overflows for x < -88.7, which made the interpreter's sigmoid 0 where
    torch's is subnormal (logsigmoid's gradient at 89: special seeds 5310499, 5310786). The
    kernels may flush it (API.md); the reference keeps it."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype)


_unary(
    "sigmoid",
    _sigmoid_ref,
    lambda ct, n: (ct * n.out * (1.0 - n.out),),
    "sigmoid_f32({0})",
    COSTLY,
)
# relu'(0) = 0, as in PyTorch. Written with the output (y != 0 iff x > 0, or x is NaN, whose
# gradient torch passes through), so backward keeps y, which the next layer needs anyway, and
# the pre-activation can die in the matmul epilogue. WGSL's max may drop a NaN: max_nan keeps it,
# and keeps -0 as torch does (rsqrt(relu(-0.0)) = -inf).
# The cotangent is selected, not multiplied by a 0/1 mask: an inf cotangent where y = 0 (from
# sqrt(relu(x)), say) gives 0 as torch's threshold_backward does, not inf * 0 = NaN.
_unary(
    "relu",
    lambda x: np.where(x < 0, np.zeros_like(x), x),
    lambda ct, n: (F.where(F.equal(n.out, 0.0), 0.0, ct),),
    "max_nan({0}, 0.0)",
)
_unary(
    "erf",
    lambda x: np.asarray(_erf(x)).astype(x.dtype),  # frompyfunc gives a Python float for 0-d x
    # (ct 2/sqrt(pi)) exp(-x^2) in one rounding (mul_exp): exp(-x^2) is subnormal from |x| = 9.4 on,
    # 0 on a GPU that flushes, and an inf cotangent then gave NaN where torch's is inf (5480295)
    lambda ct, n: (F._mul_exp(ct * (2.0 / math.sqrt(math.pi)), F.neg(F.square(n.inputs[0]))),),
    "erf_f32({0})",
    COSTLY,
)
# d/dx x^2 in torch.square's order, ct * (2 x): (ct * 2) * x overflowed at ct = -1.9e38 where the
# gradient is -0.038 (x = 1e-40; hour run 17's special seed 5710823)
_unary("square", np.square, lambda ct, n: (ct * (n.inputs[0] * 2.0),), "{0} * {0}")


def _log1p_render(body, n, idx):
    # log1p_f32 adds 1.0 to its argument: a sum's result goes through barrier_f32 first (_unchained)
    x = body.value(n.inputs[0], idx)
    if produced_by(n.inputs[0], _CHAINS["add"]):
        x = body.barrier_f32(x)
    body.helper("log1p_f32")
    return body.let(f"log1p_f32({x})", "f32")


# log(1 + x) and exp(x) - 1 stay accurate where their value is tiny (log1p(1e-10) = 1e-10,
# not 0); the WGSL helpers switch to series near 0, where log() and exp() of f32 lose it
register(OpDef("log1p", _f32_only("log1p"), np.log1p, lambda ct, n: (ct / (n.inputs[0] + 1.0),), "pointwise",
               expr="log1p_f32({0})", cost=COSTLY, render=_log1p_render))
_unary("expm1", np.expm1, lambda ct, n: (ct * (n.out + 1.0),), "expm1_f32({0})", COSTLY)


def _power_expr(attrs):
    # WGSL's pow is undefined for bases <= 0 (and is exp2(p * log2(x)) on most drivers): products
    # and sqrt where they are exact, else helpers (_helpers.wgsl.j2) that give torch's values at
    # 0 and inf (0 ** -5 = inf, (-0) ** -5 = -inf) and NaN for fractional powers of negatives.
    p = attrs["p"]
    if p == 0:
        return "1.0"  # torch: x ** 0 = 1 for every x, NaN included
    # products as torch's own special cases (x ** -2 is 1 / (x * x) there too); x ** -3 and -4 by
    # pow_int_f32 as torch's pow: 1 / (x * x * x * x) overflowed to 0 at x = 1e10 where the power
    # is 1e-40, and an inf cotangent then gave NaN for -inf (hour run 16's special seed 5691100)
    if float(p).is_integer() and (1 <= p <= 4 or p in (-1, -2)):
        prod = " * ".join(["{0}"] * int(abs(p)))
        return prod if p > 0 else f"1.0 / ({prod})"
    if p == 0.5:  # correctly rounded, and sqrt(-0) = -0 as torch's x ** 0.5 gives
        return SQRT
    if p == -0.5:
        # Mesa rewrites 1 / sqrt(x) as inverseSqrt(x) and takes that for >= 0, folding the
        # readers' sign tests: (-0) ** -0.5 = -inf then read as +inf (0.5 ** (x ** -0.5) was NaN
        # where torch's is inf, special seed 5330238). The select (sqrt(+-0) is itself) hides it.
        # NVIDIA's compiler makes 1 / sqrt(x) its rsqrt, which is -0 at -inf: NaN below 0 by hand;
        # and +-inf at zero from x's sign bit, as rsqrt_f32 (NVIDIA took 1e-38 == 0.0, then 1 / x)
        return ("select(select(1.0 / select(sqrt({0}), {0}, {0} == 0.0), bitcast<f32>(0x7f800000u | (bitcast<u32>({0})"
                " & 0x80000000u)), {0} == 0.0), bitcast<f32>(0x7fc00000u), {0} < 0.0)")
    if float(p).is_integer():
        return "pow_int_f32({0}, %s, %s)" % (_lit(p), "true" if int(p) % 2 else "false")
    # the exponent's f32 and the rest: torch raises to the double p (1e30 ** 0.3 = 1e9)
    lo = float(p) - float(np.float32(p))
    return "pow_frac_f32({0}, %s, %s)" % (_lit(p), _lit(lo))


def _power_ref(x, p):
    """NumPy's power, except x ** +-0.5 as sqrt and 1 / sqrt, as the kernels (and torch) compute
    them: (-0) ** -0.5 = -inf and (-inf) ** +-0.5 = NaN, where C's pow gives inf and inf / 0."""
    if abs(p) == 0.5:
        r = np.sqrt(x)
        return r if p > 0 else (np.float32(1) / r).astype(x.dtype)
    return np.power(x.astype(np.float64), float(p)).astype(x.dtype)  # the double p, as torch's pow


def _zeros_like(t):
    from .creation import zeros_like  # creation builds on this module's ops

    return zeros_like(t)


def _lit(v):
    return wgsl_f32(v)


register(
    OpDef(
        "power",
        _f32_only("power"),
        _power_ref,
        # torch's pow_backward, in its order: ct * (p * x ** (p - 1)) (ct * p first overflowed where
        # the product is finite: special seed 5350272), zeros for p = 0 (not 0 * x ** -1, NaN at
        # x = 0, nor ct * 0, NaN for an inf cotangent)
        lambda ct, n: (_zeros_like(ct) if n.attrs["p"] == 0 else ct * (F.power(n.inputs[0], n.attrs["p"] - 1.0) * n.attrs["p"]),),
        "pointwise",
        expr=_power_expr,
        cost=COSTLY,
    )
)

# b ** x for a positive finite number b (ops.power's Tensor exponent): pow_abs_f32 with the tensor as
# the exponent, as accurate as x ** p (exp(x log b) was 8e-6 off at 2 ** 110). Its gradient is
# torch's pow_backward_exponent for b > 0: ct * (b ** x * log(b))
register(
    OpDef(
        "rpower",
        _f32_only("rpower"),
        lambda x, b: np.power(x.dtype.type(b), x),
        lambda ct, n: (ct * (n.out * math.log(n.attrs["b"])),),
        "pointwise",
        expr=lambda attrs: "pow_abs_f32(%s, {0}, 0.0)" % _lit(attrs["b"]),
        cost=COSTLY,
    )
)


def _identity_wgsl(body, n, idx):
    return body.value(n.inputs[0], idx)


# stop_gradient is the identity in every kernel; grad.py sees nondiff and sends nothing back.
register(
    OpDef(
        "stop_gradient", lambda x: x, lambda x: x.copy(), None, "pointwise", expr="{0}", nondiff=True,
        index_bound=follow, render=_identity_wgsl,
    )
)


def _binary(name, ref, vjp, expr, cost=1, render=None):
    register(OpDef(name, _f32_only(name), ref, vjp, "pointwise", expr=expr, cost=cost, render=render))


# Shader compilers fold x * 0.0, 0.0 / x, x - x and x + (-x) to 0 (WGSL lets them assume finite
# floats), which turns inf and NaN into 0 where IEEE and torch give NaN. Those patterns, as this
# kernel's text has them, are written with helpers that decide by the bits, which no compiler folds.
_ZERO = ("0.0", "-0.0")


def _is_neg_of(body, b: str, a: str) -> bool:
    return b == f"(-{a})" or body.cache.get(("let", f"-{a}")) == b


def _literal(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


# Mesa reassociates a chain of one kind of arithmetic with a literal in it, (x * y) * 2.0 as
# (x * 2.0) * y and (x + y) + c as (x + c) + y: inf where x * y * 2 is finite (x = 3.4e38,
# y = -0.22: the gradient of (x * y) ** 2, special seed 5370296), where torch computes in the
# order written. A literal the compiler cannot see as a constant keeps the order.
_CHAINS = {"mul": ("mul", "div", "power"), "add": ("add", "sub"), "sub": ("add", "sub")}


def _unchained(body, n, a: str, b: str) -> tuple[str, str]:
    """a, b with a literal made opaque where the other operand continues a product chain, and the
    other operand put through barrier_f32 where it continues a sum chain: Mesa also reassociates
    sums of values it cannot fold, (x - 1.0) + 1.0 with two equal opaque literals as x + (o - o),
    x where torch's is 0 at x = -3e-39 (hour run 11's special seed 5512083)."""
    for k, (lit, other) in enumerate(((a, b), (b, a))):
        if not _literal(lit) or _literal(other) or lit in _ZERO or not produced_by(n.inputs[1 - k], _CHAINS[n.op]):
            continue
        if n.op in ("add", "sub"):
            other = body.barrier_f32(other)
            return (lit, other) if k == 0 else (other, lit)
        if lit not in ("1.0", "-1.0"):
            lit = body.opaque_f32(lit)
            return (lit, b) if k == 0 else (a, lit)
    return a, b


def _opaque_arith(op):
    def render(body, n, idx):
        a, b = (body.value(x, idx) for x in n.inputs)
        if op in _CHAINS:
            a, b = _unchained(body, n, a, b)
        call = None
        if op == "mul" and (a in _ZERO) != (b in _ZERO):
            call = "times_zero_f32(%s, %s)" % ((b, a) if a in _ZERO else (a, b))
        elif op == "div" and a in _ZERO and b not in _ZERO:
            call = f"zero_div_f32({a}, {b})"
        elif op == "div" and b in _ZERO and a not in _ZERO:
            call = f"div_zero_f32({a}, {b})"  # x / 0.0: drivers return 0 for it (IEEE: +-inf, NaN)
        elif op == "sub" and a in _ZERO and b not in _ZERO:
            call = f"zero_sub_f32({a}, {b})"  # 0.0 - x: Mesa folds it to -x, -0 for x = 0 (IEEE: +0)
        elif op == "add" and (a == "0.0") != (b == "0.0"):
            # x + 0.0 is +0 for x = -0 (IEEE), but compilers fold it to x (1e-30 / (-0 + 0.0) was
            # -inf where torch's is inf: hour run 10's special seed 5490363)
            call = "plus_zero_f32(%s)" % (b if a == "0.0" else a)
        elif op == "sub" and a == b and a not in _ZERO:
            call = f"self_sub_f32({a})"
        elif op == "add" and (_is_neg_of(body, b, a) or _is_neg_of(body, a, b)):
            call = "self_sub_f32(%s)" % (a if _is_neg_of(body, b, a) else b)
        elif op == "mul" and a == b and produced_by(n.inputs[0], ROOTS):
            call = f"mul_self_f32({a})"  # sqrt(a) * sqrt(a): Mesa folds it to |a| (ROOTS)
        elif op == "mul" and (produced_by(n.inputs[0], ("sign",)) or produced_by(n.inputs[1], ("sign",))):
            # x * sign(y): NVIDIA folds it into selects of x, -x and 0, so 0 also for an inf or NaN
            # x where IEEE (and torch) give NaN (abs's gradient at a NaN y under a NaN cotangent:
            # H200, special seed 6010163)
            call = "times_sign_f32(%s, %s)" % ((a, b) if produced_by(n.inputs[1], ("sign",)) else (b, a))
        if call is None and op == "add" and a == b and a not in _ZERO:
            # x + x as x * 2.0 (equal for every x, inf, NaN and -0 included): Mesa factors
            # a*b + a*c into a*(b + c), which for a gradient (ct*y)*x + (ct*y)*x of x * x gives
            # ct*y*(x + x): inf where x + x overflows, and NaN for ct*y = 0 where torch gives 0;
            # the 2.0 opaque where x is a product, which Mesa would reassociate as (ct * 2.0) * y
            # (the gradient of min(x) * min(x) at 3.4e38 was inf: hour run 9, special seed 5470020)
            two = body.opaque_f32("2.0") if produced_by(n.inputs[0], _CHAINS["mul"]) else "2.0"
            return body.let(f"{a} * {two}", "f32")
        if call is None and op == "div" and not _literal(b):
            # GPUs divide as a * (1 / b), and 1 / b is subnormal for |b| > 2^126, flushed to 0
            # on NVIDIA (x / 3.4e38 was 0, inf / 3.4e38 NaN; torch: 2.6e-37, inf), and a fast-math
            # compiler folds (ct / y) * y to ct (log(exp(x))'s gradient at exp(x) = 0: NaN in torch)
            call = f"div_f32({a}, {b})"
        if call is None:
            return body.let(lookup(op).expr.format(a, b), "f32")
        body.helper(call.split("(")[0])
        return body.let(call, "f32")

    return render


_binary("add", lambda a, b: a + b, lambda ct, n: (ct, ct), "{0} + {1}", render=_opaque_arith("add"))
_binary("sub", lambda a, b: a - b, lambda ct, n: (ct, F.neg(ct)), "{0} - {1}", render=_opaque_arith("sub"))
_binary(
    "mul", lambda a, b: a * b, lambda ct, n: (ct * n.inputs[1], ct * n.inputs[0]), "{0} * {1}", render=_opaque_arith("mul")
)
_binary(
    "div",
    lambda a, b: a / b,
    # d/db = -ct * ((a / b) / b), torch's order: (ct * out) / b overflows where the gradient is
    # finite (ct 1e30, a 1e10, b -15: -4.2e37; special seed 5300337)
    lambda ct, n: (ct / n.inputs[1], F.neg(ct * (n.out / n.inputs[1]))),
    "{0} / {1}",
    COSTLY,
    render=_opaque_arith("div"),
)


def _minmax_vjp(loses):
    # torch.maximum's rule, selected rather than multiplied by masks (an inf cotangent must give
    # 0 to the losing operand, not NaN): ties split the gradient evenly, the losing operand gets
    # 0, and where the comparison is false both ways (a NaN operand) both get the gradient.
    def vjp(ct, n):
        a, b = n.inputs
        share = F.where(F.equal(a, b), ct * 0.5, ct)
        return F.where(loses(a, b), 0.0, share), F.where(loses(b, a), 0.0, share)

    return vjp


def _mul_exp_ref(a, y):
    """mul_exp_f32's values: a exp(y) in double, and a * 0 below y = -104, where the kernel stops
    (NaN for an inf a, as torch's inf * sigmoid(-123) = inf * 0; special seed 5520319)."""
    with np.errstate(invalid="ignore", over="ignore"):
        v = a.astype(np.float64) * np.exp(np.minimum(y, 0.0).astype(np.float64))
        return np.where(y < -104.0, a * a.dtype.type(0), v).astype(a.dtype)


# a * exp(y) for y <= 0 (silu's and mish's tails: x exp(x) for x < -20), rounded once, so that a
# normal product never goes through a subnormal exp(y) that a GPU flushes to 0 (_helpers.wgsl.j2)
_binary(
    "mul_exp",
    _mul_exp_ref,
    lambda ct, n: (F._mul_exp(ct, n.inputs[1]), ct * n.out),
    "mul_exp_f32({0}, {1})",
    COSTLY,
)


def _torch_minmax(pick_a):
    """torch.maximum/minimum: NaN in either operand gives NaN, and where the operands compare equal
    (-0 and +0) the first one (np.maximum returns the second; WGSL's max/min either)."""

    def ref(a, b):
        a, b = np.broadcast_arrays(a, b)
        return np.where(np.isnan(a) | np.isnan(b), a + b, np.where(pick_a(a, b), a, b)).astype(a.dtype, copy=False)

    return ref


_binary("maximum", _torch_minmax(np.greater_equal), _minmax_vjp(lambda a, b: F.less(a, b)), "max_nan({0}, {1})")
_binary("minimum", _torch_minmax(np.less_equal), _minmax_vjp(lambda a, b: F.greater(a, b)), "min_nan({0}, {1})")


def _cmp(name, ref, op, render=None):
    register(
        OpDef(
            name,
            _same_shape_any_dtype("f32"),
            lambda a, b: ref(a, b).astype(np.float32 if a.dtype != np.float64 else np.float64),
            None,
            "pointwise",
            expr="select(0.0, 1.0, {0} %s {1})" % op,
            nondiff=True,
            render=render,
        )
    )


def _equal_render(body, n, idx):
    # a == a is true for every a to a compiler that assumes no NaN (NVIDIA's: minimum(x, x) at a
    # NaN split its gradient as a tie, torch passes it to both), so f32 equality also asks the bits
    if n.inputs[0].dtype != "f32":
        return body.pointwise(n, idx)
    a, b = (body.value(x, idx) for x in n.inputs)
    body.helper("is_nan_f32")
    return body.let(f"select(0.0, 1.0, {a} == {b} && !is_nan_f32({a}))", "f32")


_cmp("less", np.less, "<")
_cmp("greater", np.greater, ">")
_cmp("equal", np.equal, "==", render=_equal_render)


def _where_shape(c, a, b):
    if c[1] != "f32":
        raise Bad(f"condition must be an f32 mask (as returned by less/greater), got {c[1]}")
    if not (c[0] == a[0] == b[0]):
        raise Bad("operand shapes differ (the IR expects broadcasting to be explicit)")
    if a[1] != b[1]:
        raise Bad(f"branches have different dtypes {a[1]} and {b[1]}")
    return a[0], a[1]


def _where_render(body, n, idx):
    c, t, f = (body.value(x, idx) for x in n.inputs)
    # NVIDIA's compiler turns select(b, a, a < b) into fmin/fmax, which return the other operand
    # for a NaN (clamp(NaN, min=0.0) was 0, torch: NaN), also through masks combined with
    # maximum or products; a condition with a term it cannot see through (true at run time) is
    # no longer that pattern
    return body.let(f"select({f}, {t}, {c} != 0.0 && {body.opaque_true()})", n.out.dtype)


register(
    OpDef(
        "where",
        _where_shape,
        lambda c, a, b: np.where(c != 0, a, b),
        lambda ct, n: (None, F.where(n.inputs[0], ct, 0.0), F.where(n.inputs[0], 0.0, ct)),
        "pointwise",
        expr="select({2}, {1}, {0} != 0.0)",
        render=_where_render,
    )
)


def _cast_shape(x, dtype):
    if dtype not in ("f32", "i32"):
        raise Bad(f"unknown dtype {dtype!r}; use 'f32' or 'i32'")
    return x[0], dtype


def _cast_ref(x, dtype):
    if dtype == "i32":
        return np.trunc(x).astype(np.int32) if x.dtype.kind == "f" else x.astype(np.int32)
    return x.astype(np.float64 if x.dtype == np.float64 else np.float32)


def _cast_vjp(ct, n):
    # Only f32 -> f32 passes a gradient; casting to or from integers stops it.
    if n.inputs[0].dtype == "f32" and n.out.dtype == "f32":
        return (ct,)
    return (None,)


def _cast_wgsl(body, n, idx):
    if n.inputs[0].dtype == n.out.dtype:
        return body.value(n.inputs[0], idx)
    return body.pointwise(n, idx)


register(
    OpDef(
        "cast", _cast_shape, _cast_ref, _cast_vjp, "pointwise", expr=lambda a: "%s({0})" % a["dtype"],
        index_bound=lambda n, x: FOLLOW if n.out.dtype == "i32" else None, render=_cast_wgsl,
    )
)


def _const_shape(value, dtype):
    return (), dtype


def _const_ref(value, dtype):
    return np.array(value, dtype=np.float32 if dtype == "f32" else np.int32)


def _const_wgsl(body, n, idx):
    v = n.attrs["value"]
    if n.out.dtype != "f32":
        return wgsl_i32(v)
    if math.isfinite(v):
        return wgsl_f32(v)
    # WGSL has no inf or NaN literal, and a constant expression that evaluates to one is a
    # shader-creation error in Tint (Chrome): the bits, through a function call (never constant)
    body.helper("f32_bits")
    return "f32_bits(%s)" % ("0x7fc00000u" if math.isnan(v) else "0x7f800000u" if v > 0 else "0xff800000u")


register(OpDef("const", _const_shape, _const_ref, None, "constant", nondiff=True, render=_const_wgsl))
