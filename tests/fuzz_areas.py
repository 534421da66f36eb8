"""The differential fuzzer's areas beyond random graphs (issue 32): each area draws one Program
per seed, builds it with aot.compile, runs it on the adapter and checks it against PyTorch.

- "special": NaN, +-inf, +-0, subnormals, 1e-30, 1e30, values near exp's overflow and the
  float32 limits as arguments of every unary op (and binary ops, reductions, losses, gathers,
  short chains of them), with NaN/inf/0/huge cotangents. Where PyTorch float64 (rounded to
  float32) and float32 agree that an element is NaN, +inf, -inf or finite, aot must say the
  same, and a finite value must be within a few ulps (plus float32 PyTorch's own error).
  Where the two PyTorch precisions disagree (float32 overflows inside gelu, say), aot may take
  either's class. A driver may flush subnormals (WGSL allows it): the check also accepts the
  result PyTorch gives for the inputs with their subnormals flushed to signed zeros, and a
  flushed intermediate (at most 2^-126 times the largest cotangent) in a gradient.
- "optim": several steps of Adam, AdamW (amsgrad), SGD (momentum, nesterov, weight decay),
  RMSprop (momentum, centered), Adagrad and Adadelta with clip_grad_norm, aot.lr schedules and
  parameter groups, compared with torch.optim step for step; then step_many of the same
  batches and a save after step j restored into a fresh Model must continue bit for bit like
  the step() calls (API.md §6 promises bit-identity for both). See `optim_tolerance` for how
  a per-update tolerance is derived from the trajectory's own sensitivity to rounding noise.
- "dims": infer entries over inputs with symbolic dims (`dims={"B": (..), "T": (..)}`), each
  size run and compared with PyTorch.
- "noinput": training entries without inputs (a loss drawn only from parameters, or from
  ops.randn noise that a capture reads back for the oracle, step_many([{}] * K) included) and
  Programs without parameters (train and infer entries over inputs only).

`check(area, seed)` -> AreaResult (counts and failures); `scripts/fuzz.py --areas ...` runs
them for a time budget and tests/test_fuzz.py for a few seeds each.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

import fuzz_graphs as fg

AREAS = ("special", "optim", "dims", "noinput")
TINY = 2.0**-126  # the smallest normal float32: a flushed subnormal is off by less


@dataclass
class Finding:
    area: str
    seed: int
    what: str
    detail: str
    source: str = ""  # a standalone program (or reproducer) for the failure

    def __str__(self):
        return f"[{self.area}] seed {self.seed}: {self.what}: {self.detail}"


@dataclass
class AreaResult:
    programs: int = 0
    graphs: int = 0  # cases (one op chain each in "special"; one model otherwise)
    ops: int = 0
    steps: int = 0  # training steps checked (optimizer updates in "optim")
    elements: int = 0  # values and gradients compared elementwise ("special")
    failures: list = field(default_factory=list)


# ---- comparing floats with NaN/inf patterns -------------------------------------------------------


def classes(a: np.ndarray) -> np.ndarray:
    """0 finite, 1 NaN, 2 +inf, 3 -inf (as int8)."""
    a = np.asarray(a, dtype=np.float64)
    c = np.zeros(a.shape, np.int8)
    c[np.isnan(a)] = 1
    c[a == np.inf] = 2
    c[a == -np.inf] = 3
    return c


CLASS_NAMES = ("finite", "nan", "+inf", "-inf")


def ulp32(a: np.ndarray) -> np.ndarray:
    a = np.abs(np.asarray(a, dtype=np.float64))
    a = np.where(np.isfinite(a), np.minimum(a, 3.4028234e38), 0.0)
    return np.spacing(a.astype(np.float32)).astype(np.float64)


# Finite values in "special" cases: 1e-4 relative (about 800 ulps). The NaN/inf pattern is the
# point here; ulp accuracy per op is tests/test_ulp.py's (scripts/ulp_sweep.py), and a gradient
# such as tanh's 1 - y^2 turns the forward's 2 ulps into 30 where y is near 1, as PyTorch's own
# formula would with an y that much off.
REL = 1e-4
SPREAD_SPECIAL = 50.0


def pattern_ok(got, refs, ulps: float = 8.0, extra: float = 0.0, rel: float = REL) -> np.ndarray:
    """Elementwise: got agrees with at least one reference (want64, want32): the class of
    float32(want64) and of want32 where they agree (either where they do not), and for finite
    values |got - want| <= max(ulps ulp, rel |want|) + 50 |want32 - want64| + 4 * 2^-126 + extra."""
    got = np.asarray(got, dtype=np.float64)
    cg = classes(got)
    ok = np.zeros(got.shape, bool)
    for w64, w32 in refs:
        w64 = np.asarray(w64, dtype=np.float64)
        w32 = np.asarray(w32, dtype=np.float64)
        r64 = w64.astype(np.float32).astype(np.float64)  # the correctly rounded float32 result
        c64, c32 = classes(r64), classes(w32)
        agree = c64 == c32
        # where torch's two precisions disagree on the class (float32 overflows inside torch's
        # formula, or an inf * 0 there), the element is not well defined in float32: anything goes
        cls_ok = np.where(agree, cg == c64, True)
        with np.errstate(invalid="ignore", over="ignore"):
            spread = np.where((c32 == 0) & (c64 == 0) & np.isfinite(w64), np.abs(w32 - w64), 0.0)
            # SPREAD_SPECIAL x float32 torch's own error, as the graph fuzzer's tolerance: an
            # ill-conditioned chain (sin of x ** -3 at x = -0.01) is as far off in float32 anywhere
            tol = np.maximum(ulps * ulp32(r64), rel * np.abs(r64)) + SPREAD_SPECIAL * spread + 4 * TINY + extra
            near64 = (cg == 0) & (c64 == 0) & (np.abs(got - w64) <= tol)
        val_ok = np.where((cg == 0) & agree, near64, True)
        ok |= cls_ok & val_ok
    return ok


def describe(got, refs, bad: np.ndarray, inputs: dict | None = None) -> str:
    got = np.asarray(got)
    idx = tuple(int(i) for i in np.argwhere(bad)[0])
    w64, w32 = refs[0]
    where = ""
    if inputs:
        where = "; inputs " + ", ".join(f"{n}={np.asarray(v)[idx] if np.shape(v) == got.shape else '...'}" for n, v in inputs.items())
    return (f"{int(bad.sum())}/{bad.size} elements off; at {idx}: got {float(got[idx])!r}, "
            f"expected {float(np.float32(w64[idx]))!r} (torch float32 {float(w32[idx])!r}){where}")


# ---- area "special": NaN/inf/tiny/huge arguments and cotangents ------------------------------------

SPECIALS = (0.0, -0.0, math.nan, math.inf, -math.inf, 1e-45, -1e-45, 1e-40, -3e-39, 1.1754944e-38, -1.1754944e-38,
            1e-30, -1e-30, 1e-20, 1e-10, -1e-7, 1e-7, 1e-5, 0.5, -0.5, 1.0, -1.0, 2.0, -3.0, 10.0, -20.0, 50.0,
            88.5, 89.0, -87.5, -104.0, -110.0, 1e4, -1e4, 1e10, 1e20, 1e30, -1e30, 1e38, 3.4028235e38, -3.4028235e38)
CT_SPECIALS = (math.nan, math.inf, -math.inf, 0.0, -0.0, 1e30, -1e30, 1e-30, 1e-40)

# (fuzz_graphs op, kwargs, number of tensor operands, domain hint); ops from fuzz_graphs.OPS so the
# source text and torch semantics are the graph fuzzer's
UNARY = [("neg", {}), ("neg", {"infix": True}), ("abs", {}), ("sqrt", {}), ("rsqrt", {}), ("exp", {}), ("log", {}),
         ("square", {}), ("sin", {}), ("cos", {}), ("tanh", {}), ("sigmoid", {}), ("relu", {}), ("gelu", {}),
         ("gelu", {"approximate": "tanh"}), ("silu", {}), ("erf", {}), ("leaky_relu", {"negative_slope": 0.1}),
         ("elu", {"alpha": 1.0}), ("elu", {"alpha": 0.5}), ("softplus", {}), ("softplus", {"beta": 2.0, "threshold": 10.0}),
         ("mish", {}), ("hardswish", {}), ("hardsigmoid", {}), ("logsigmoid", {}), ("log1p", {}), ("expm1", {}),
         ("clamp", {"min": -1.0, "max": 2.0}), ("clamp", {"min": 0.0}), ("clamp", {"max": 0.5}), ("stop_gradient", {})]
POWERS = (0, 0.0, 1, 2, 3, 2.0, 4, 0.5, 1.5, 2.5, -0.5, -1, -2, -1.0, -3)
BASES = (2.0, 0.5, 3)
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")
REDUCE = ("sum", "mean", "max", "min", "logsumexp", "softmax", "log_softmax", "prod", "norm", "var", "std", "cumsum",
          "softmax_causal")
LOSSES = ("cross_entropy", "cross_entropy2", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
          "binary_cross_entropy_with_logits", "kl_div")


class Num(float):
    """A Python number operand whose source text reads back (float('inf'), float('nan'), -0.0)."""

    def __repr__(self):
        if math.isnan(self):
            return "float('nan')"
        if math.isinf(self):
            return "float('inf')" if self > 0 else "float('-inf')"
        return float.__repr__(self)


def _special_values(rng, shape, p_special: float = 0.6) -> np.ndarray:
    n = int(np.prod(shape)) if shape else 1
    spec = np.array(SPECIALS, dtype=np.float64)[rng.integers(0, len(SPECIALS), n)]
    scale = 10.0 ** rng.uniform(-3, 3, n)
    normal = rng.normal(size=n) * scale
    v = np.where(rng.random(n) < p_special, spec, normal)
    return np.asarray(v, dtype=np.float32).reshape(shape)


def _special_cts(rng, shape) -> np.ndarray:
    v = np.asarray(rng.normal(size=shape), dtype=np.float32)
    if rng.random() < 0.5:
        n = v.size
        mask = rng.random(n) < 0.3
        spec = np.array(CT_SPECIALS, dtype=np.float32)[rng.integers(0, len(CT_SPECIALS), n)]
        v = np.where(mask, spec, v.reshape(-1)).astype(np.float32).reshape(shape)
    return v


class _SpecialGen:
    """Draws one special-value case: a chain of 1..3 ops over parameters of special values."""

    def __init__(self, rng, steps):
        self.rng, self.steps = rng, steps
        self.leaves: dict = {}
        self.ops: list = []
        self.shapes: dict = {}
        self.n = 0

    def name(self, stem):
        self.n += 1
        return f"{stem}{self.n - 1}"

    def leaf(self, shape, dtype="f32", high=4, values=None):
        # f32 leaves: parameters (their gradients are checked), sometimes inputs (a value per
        # step, through the runtime's input path: NaN and inf data must pass unchanged)
        kind = "input" if dtype == "i32" or (values is None and self.rng.random() < 0.2) else "param"
        nm = self.name({"param": "p", "input": "x" if dtype == "f32" else "i"}[kind])
        if values is None:
            if dtype == "f32":
                values = [_special_values(self.rng, shape) for _ in range(self.steps if kind == "input" else 1)]
            else:
                values = [self.rng.integers(0, high, size=shape).astype(np.int32) for _ in range(self.steps)]
        self.leaves[nm] = fg.Leaf(nm, kind, dtype, tuple(shape), values)
        self.shapes[nm] = tuple(shape)
        return nm

    def emit(self, op, args, kw, shape):
        out = self.name("v")
        self.ops.append(fg.Op((out,), op, tuple(args), dict(kw)))
        self.shapes[out] = tuple(shape)
        return out

    def operand(self, shape):
        """A float operand: the newest value of this shape, or a new parameter."""
        cur = [v for v in self.shapes if self.shapes[v] == tuple(shape) and not v.startswith("i")]
        if cur and self.rng.random() < 0.3:
            return cur[-1]
        return self.leaf(shape)

    def unary(self, x):
        shape = self.shapes[x]
        r = self.rng.random()
        if r < 0.7:
            op, kw = UNARY[int(self.rng.integers(len(UNARY)))]
            return self.emit(op, (x,), kw, shape)
        if r < 0.9:
            p = POWERS[int(self.rng.integers(len(POWERS)))]
            if p == 0 and x not in self.leaves:  # a static zero gradient upstream: KNOWN_DIFFERENCES
                p = 2
            return self.emit("power", (x, p), {"infix": True} if self.rng.random() < 0.5 else {}, shape)
        b = BASES[int(self.rng.integers(len(BASES)))]
        return self.emit("power", (b, x), {}, shape)  # b ** x: pow's accuracy (rpower), chains go on

    def binary(self, x):
        shape = self.shapes[x]
        op = BINARY[int(self.rng.integers(len(BINARY)))]
        r = self.rng.random()
        if r < 0.15:  # x - x, x * 0.0, 0.0 / x: what a shader compiler may fold
            y = {"add": x, "sub": x, "mul": 0.0, "div": 0.0, "maximum": x, "minimum": x}[op]
            args = (y, x) if op == "div" else (x, y)
        elif r < 0.35:
            y = Num(self.rng.choice([0.0, -0.0, 1.0, -2.0, 0.5, 1e30, 1e-30, math.inf, -math.inf, math.nan]))
            args = (x, y) if self.rng.random() < 0.5 else (y, x)
        else:
            yshape = shape if self.rng.random() < 0.7 or not shape else (1,) * (len(shape) - 1) + (shape[-1],)
            y = self.operand(yshape)
            if op == "div" and y == x:  # x / x: a static zero gradient (KNOWN_DIFFERENCES)
                y = self.leaf(yshape)
            args = (x, y) if self.rng.random() < 0.5 else (y, x)
        return self.emit(op, args, {"infix": True} if op in fg.INFIX and self.rng.random() < 0.4 else {}, shape)

    def where(self, x):
        shape = self.shapes[x]
        y = self.operand(shape)
        if y == x:  # x < x folds to 0 and its branch gets no gradient at all: KNOWN_DIFFERENCES
            y = self.leaf(shape)
        c = self.emit(str(self.rng.choice(["greater", "less"])), (x, y), {}, shape)
        a, b = (x, y) if self.rng.random() < 0.5 else (y, x)
        if self.rng.random() < 0.3:
            b = Num(self.rng.choice([0.0, math.inf, -math.inf, 1.0]))
        return self.emit("where", (c, a, b), {}, shape)

    def reduce(self, x):
        shape = self.shapes[x]
        if len(shape) < 1:
            return self.unary(x)
        op = REDUCE[int(self.rng.integers(len(REDUCE)))]
        axis = int(self.rng.integers(-len(shape), len(shape)))
        kw = {"axis": axis}
        if op in ("softmax", "log_softmax"):
            kw = {"axis": axis} if self.rng.random() < 0.5 else {}
            return self.emit(op, (x,), kw, shape)
        if op == "softmax_causal":
            if len(shape) < 2 or shape[-1] != shape[-2]:
                return self.emit("softmax", (x,), {}, shape)
            return self.emit(op, (x,), {}, shape)
        if op == "cumsum":
            return self.emit(op, (x,), kw, shape)
        if op == "norm":
            kw["p"] = float(self.rng.choice([1.0, 2.0, 3.0]))
        if op in ("var", "std"):  # aot refuses a reduction of n <= correction elements (torch: NaN or inf)
            kw["correction"] = int(self.rng.integers(0, 2)) if shape[axis] > 1 else 0
        keep = self.rng.random() < 0.3
        if keep:
            kw["keepdims"] = True
        out = tuple(1 if i == axis % len(shape) else d for i, d in enumerate(shape)) if keep else \
            tuple(d for i, d in enumerate(shape) if i != axis % len(shape))
        return self.emit(op, (x,), kw, out)

    def matmul(self, x):
        shape = self.shapes[x]
        if len(shape) != 2:
            return self.unary(x)
        w = self.leaf((shape[1], int(self.rng.integers(1, 4))))
        return self.emit("matmul", (x, w), {"infix": True} if self.rng.random() < 0.5 else {}, (shape[0], self.shapes[w][1]))

    def loss(self, x):
        shape = self.shapes[x]
        if len(shape) != 2:
            return self.unary(x)
        n, c = shape
        op = LOSSES[int(self.rng.integers(len(LOSSES)))]
        red = str(self.rng.choice(["mean", "sum", "none"]))
        if op in ("cross_entropy", "cross_entropy2", "nll_loss"):
            t = self.leaf((n,), "i32", high=c)
            kw = {"reduction": red}
            if op == "cross_entropy2" and self.rng.random() < 0.5:
                kw["label_smoothing"] = 0.1
            return self.emit(op, (x, t), kw, (n,) if red == "none" else ())
        y = self.operand(shape) if self.rng.random() < 0.7 else self.leaf(shape, values=[np.asarray(
            self.rng.uniform(0, 1, shape), np.float32)])
        kw = {"reduction": red}
        if op == "kl_div":
            kw["log_target"] = bool(self.rng.random() < 0.5)
        return self.emit(op, (x, y), kw, shape if red == "none" else ())

    def gather(self):
        v, d = int(self.rng.integers(2, 6)), int(self.rng.integers(1, 4))
        if self.rng.random() < 0.5:
            table = self.leaf((v, d))
            idx = self.leaf((int(self.rng.integers(1, 5)),), "i32", high=v)
            return self.emit("embedding", (table, idx), {}, (self.shapes[idx][0], d))
        x = self.leaf((d, v))
        k = int(self.rng.integers(1, 4))
        idx = self.leaf((d, k), "i32", high=v)
        return self.emit("take_along_axis", (x, idx), {"axis": 1}, (d, k))

    def build(self) -> fg.Case:
        r = self.rng.random()
        if r < 0.1:
            x = self.gather()
        else:
            rank = int(self.rng.choice([1, 1, 2, 2, 3]))
            shape = tuple(int(self.rng.integers(1, 7)) for _ in range(rank))
            if rank == 1:
                shape = (int(self.rng.integers(4, 17)),)
            if rank >= 2 and self.rng.random() < 0.2:
                shape = shape[:-2] + (shape[-1], shape[-1])  # square rows (softmax_causal)
            x = self.leaf(shape)
        self.last = False
        for _ in range(int(self.rng.choice([1, 1, 1, 2, 2, 3]))):
            if self.last:
                break
            r = self.rng.random()
            act = (self.unary if r < 0.45 else self.binary if r < 0.62 else self.where if r < 0.67 else
                   self.reduce if r < 0.85 else self.matmul if r < 0.9 else self.loss)
            x = act(x)
        outs = [x]
        cts = {x: [_special_cts(self.rng, self.shapes[x]) for _ in range(self.steps)]}
        return fg.dce(fg.Case(dict(self.leaves), {}, list(self.ops), outs, cts, self.steps))


def generate_special(seed: int) -> fg.Batch:
    rng = np.random.default_rng([32, seed])
    steps = 2
    n = int(rng.integers(4, 9))
    cases = [_SpecialGen(rng, steps).build() for _ in range(n)]
    if not any(l.kind == "param" for c in cases for l in c.leaves.values()):
        # a Program needs a parameter (batch_source would add an anchor the references lack):
        # case 0's first f32 input becomes one
        c = cases[0]
        n0 = next((k for k, l in c.leaves.items() if l.dtype == "f32"), None)
        if n0 is not None:
            c.leaves[n0] = replace(c.leaves[n0], kind="param", values=c.leaves[n0].values[:1])
    return fg.Batch(cases, capture=True, infer=False, steps=steps, seed=seed)


def _flush(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind != "f":
        return a
    sub = (a != 0) & (np.abs(a) < TINY)
    return np.where(sub, np.copysign(np.float32(0), a), a).astype(a.dtype)


def _flush_t(x):
    """A torch tensor with its float32 subnormals flushed to signed zeros."""
    T = fg._torch()
    return T.where((x != 0) & (x.abs() < TINY), x * 0, x)


_FTZ = None


def _ftz():
    """An autograd identity that flushes float32 subnormals to signed zeros both ways."""
    global _FTZ
    if _FTZ is None:
        T = fg._torch()

        class FTZ(T.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return _flush_t(x)

            @staticmethod
            def backward(ctx, g):
                return _flush_t(g)

        _FTZ = FTZ
    return _FTZ


# ops whose gradient aot takes from their output (elementwise.py's VJPs): on a device that flushes,
# the output it keeps is the flushed one (exp(-87.5) = 0), where torch's backward keeps its own
# unflushed result (ct * exp(-87.5) / 1e-3 is a normal -9e-36 there, 0 on the H200: seed 5450113)
_FROM_OUTPUT = {
    "exp": lambda g, y: g * y,
    "expm1": lambda g, y: g * (y + 1.0),
    "sqrt": lambda g, y: g * 0.5 / y,
    "rsqrt": lambda g, y: g * -0.5 * y * y * y,
    "tanh": lambda g, y: g * (1.0 - y * y),
    # sigmoid(-87.5) = 1e-38 flushed, where torch's ct y / 1e-38 is normal (H200, seed 6110025)
    "sigmoid": lambda g, y: g * y * (1.0 - y),
}
_FLUSHED_OUT = None


def _flushed_out():
    """An autograd op: a unary op of _FROM_OUTPUT, its value y flushed, its gradient taken from that."""
    global _FLUSHED_OUT
    if _FLUSHED_OUT is None:
        T = fg._torch()

        class FlushedOut(T.autograd.Function):
            @staticmethod
            def forward(ctx, x, y, name):  # y: the op's value at x, computed without autograd
                y = _flush_t(y)
                ctx.save_for_backward(y)
                ctx.name = name
                return y

            @staticmethod
            def backward(ctx, g):
                (y,) = ctx.saved_tensors
                return _flush_t(_FROM_OUTPUT[ctx.name](_flush_t(g), y)), None, None

        _FLUSHED_OUT = FlushedOut
    return _FLUSHED_OUT


_FLUSHED_DIV = None


def _flushed_div():
    """a / b as an autograd op of a flushing device: b's gradient is aot's -(ct * (y / b)) with
    y / b flushed (torch's (a / b) / b keeps a subnormal there: -2.8e33 * 3.5e-43 is a normal
    -1e-9 in torch, 0 on the H200, seed 5460110)."""
    global _FLUSHED_DIV
    if _FLUSHED_DIV is None:
        T = fg._torch()

        class FlushedDiv(T.autograd.Function):
            @staticmethod
            def forward(ctx, a, b):
                y = _flush_t(a / b)
                ctx.save_for_backward(a, b, y)
                return y

            @staticmethod
            def backward(ctx, g):
                a, b, y = ctx.saved_tensors
                g = _flush_t(g)
                ga, gb = _flush_t(g / b), _flush_t(-(g * _flush_t(y / b)))
                return ga.sum_to_size(a.shape), gb.sum_to_size(b.shape)

        _FLUSHED_DIV = FlushedDiv
    return _FLUSHED_DIV


def torch_case(case: fg.Case, step: int, fdt, flush: bool = False):
    """Outputs, gradients and loss of a case at one step in PyTorch (no domain checks); with
    flush, the leaves' subnormals flushed and every op's result and gradient flushed too."""
    T = fg._torch()
    env = {}
    params = []
    for n, l in case.leaves.items():
        v = np.array(l.value(step))
        if flush:
            v = _flush(v)
        t = T.from_numpy(v)
        if l.dtype == "i32":
            env[n] = t.to(T.int64)
        else:
            env[n] = t.to(fdt).requires_grad_(l.kind != "input")
            if l.kind != "input":
                params.append(n)
    for op in case.ops:
        if flush and op.op in _FROM_OUTPUT and not op.kw and isinstance(op.args[0], str):
            with T.no_grad():  # the value; the gradient is FlushedOut's, from the flushed value
                y = fg.eval_op(op, env, fdt)[1][0]
            outs = (_flushed_out().apply(env[op.args[0]], y, op.op),)
        elif flush and op.op == "div" and set(op.kw) <= {"infix"}:
            a, b = (env[v] if isinstance(v, str) else T.tensor(float(v), dtype=fdt) for v in op.args)
            outs = (_flushed_div().apply(a, b),)
        else:
            outs = fg.eval_op(op, env, fdt)[1]
        if flush:  # each op's result and gradient with its subnormals flushed, as a driver may
            outs = tuple(_ftz().apply(o) if isinstance(o, T.Tensor) and o.dtype.is_floating_point else o for o in outs)
        env.update(zip(op.outs, outs))
    loss = T.zeros((), dtype=fdt)
    for o in case.outputs:
        if o in case.cts:
            ct = np.asarray(case.cts[o][step])
            ct = _flush(ct) if flush else ct
            loss = loss + (env[o] * T.from_numpy(ct).to(fdt)).sum()
    ps = [env[p] for p in params]
    gs = T.autograd.grad(loss, ps, allow_unused=True) if loss.requires_grad and ps else [None] * len(ps)
    grads = {p: (g if g is not None else T.zeros_like(env[p])).detach().numpy() for p, g in zip(params, gs)}
    outs = {o: env[o].detach().numpy() for o in case.outputs}
    return outs, grads, float(loss.detach())


def _special_refs(case: fg.Case, step: int):
    """[(outs, grads, loss) float64, float32] for the inputs as they are and with subnormals flushed."""
    T = fg._torch()
    with np.errstate(all="ignore"):
        return [tuple(torch_case(case, step, fdt, flush) for fdt in (T.float64, T.float32)) for flush in (False, True)]


def _ct_bound(case: fg.Case, step: int) -> float:
    """2^-126 times the largest finite cotangent: what a flushed intermediate may move a gradient."""
    m = 1.0
    for v in case.cts.values():
        a = np.abs(np.asarray(v[step], np.float64))
        a = a[np.isfinite(a)]
        if a.size:
            m = max(m, float(a.max()))
    return 4 * TINY * m


def _path_magnitudes(case: fg.Case, step: int) -> dict:
    """{parameter read by more than one op: TIE_ULPS float32 ulps of the sum, over its uses, of
    |its gradient through that use|} (elementwise, float64): its gradient adds up the paths, and
    where they cancel the residue is the order's (p / minimum(x, p) at p = -1: the paths give
    ct0 + ct1 and -(ct0 + ct1), aot's order left 1.2e-7 where torch's gives 0; hour run 22's
    special seed 5903221)."""
    uses: dict = {}
    for op in case.ops:
        for a in op.args:
            if isinstance(a, str) and a in case.leaves:
                uses[a] = uses.get(a, 0) + 1
    shared = [n for n, k in uses.items() if k > 1 and case.leaves[n].kind != "input" and case.leaves[n].dtype == "f32"]
    if not shared:
        return {}
    T = fg._torch()
    env = {n: fg._leaf_tensor(l, step, T.float64) for n, l in case.leaves.items()}
    clones: dict = {n: [] for n in shared}
    with np.errstate(all="ignore"):
        for op in case.ops:
            local = dict(env)
            for a in op.args:
                if a in clones:
                    local[a] = env[a].detach().clone().requires_grad_(True)
                    clones[a].append(local[a])
            env.update(zip(op.outs, fg.eval_op(op, local, T.float64)[1]))
        terms = [(env[o] * T.from_numpy(np.asarray(case.cts[o][step], np.float64))).sum()
                 for o in case.outputs if o in case.cts and env[o].requires_grad]
        if not terms:
            return {}
        sum(terms).backward()
    out = {}
    for n, cs in clones.items():
        g = [c.grad.abs() for c in cs if c.grad is not None]
        if g:
            m = sum(T.where(T.isfinite(x), x, T.zeros_like(x)) for x in g).numpy()
            out[n] = TIE_ULPS * 2.0**-24 * m
    return out


# Where aot differs from PyTorch by design (documented in tests/fuzz_repros/README.md); the special
# area accepts aot's result there, and keeps the generator off the two graph-level ones:
KNOWN_DIFFERENCES = {
    "accumulation": "sum, mean, prod, var, std, norm, cumsum and matmul accumulate in float32; torch's CPU "
                    "kernels accumulate float32 in double, so where a partial sum or product leaves float32's "
                    "range and the result comes back into it (var of 1e20s: squares of 1e40), torch is finite "
                    "and aot inf or NaN; so where norm's |x|^p terms leave that range, and where a signed sum's "
                    "terms cancel beyond float32's n ulps of their magnitudes",
    "nan_kernels": "elu's and hardswish's gradients at a NaN input: torch's vectorized kernels give NaN, its "
                   "scalar ones (tensors of a few elements) the cotangent; aot gives one or the other",
    "gelu_cancel": "gelu below x = -3: torch's 0.5 x (1 + tanh(u)) (and 1 + erf) cancels to 0 in float32 and "
                   "float64 alike where aot's x sigmoid(2u) keeps the tiny value (API.md: an absolute bound there); "
                   "so does its derivative, which times an inf cotangent is +-inf where torch's 0 * inf is NaN; "
                   "and a tiny negative value's ** -0.5 is NaN where torch's (-0) ** -0.5 is -inf",
    "bounded_derivative": "the gradient of tanh, sigmoid and their kin is 1 - y^2 or y (1 - y) of the forward "
                          "value y, whose few ulps are ~1e-7 absolute in that factor: where it is small (tanh at "
                          "x = -7: 1.2e-6) the gradient is that much off relatively (the 1e-4 bound widened to "
                          "1e-6 times the largest cotangent there); so are gradients that cancel (softmax's at a "
                          "one-hot row, var's, norm's); a leaf's bound is scaled by the derivative of the op's "
                          "argument with respect to it (log's 1 / x before a var)",
    "flush": "a subnormal intermediate (sigmoid(-89) in the kernels, say) may be 0 in aot (API.md: "
             "subnormal results may be flushed): times an infinite cotangent that is NaN where torch's is inf; "
             "and a subnormal leaf's own gradient an infinity where some of its ops read its bits and others a "
             "flushed 0 (log(1e-45) finite, ct / 1e-45 inf)",
    "factorization": "Mesa rewrites a*b + a*c as a*(b + c): where one leaf feeds two arguments of an op and its "
                     "cotangent is inf, the two gradient terms inf*b + inf*c (NaN for b, c of opposite signs, "
                     "as torch) become inf*(b + c), an inf",
    "kl_div_zero": "kl_div's gradient with respect to a target of 0 (log_target=False): torch's is NaN "
                   "(log(0) inside), aot's 0, the limit of its xlogy form; at a target of inf torch's is NaN "
                   "(its t / t), aot's inf, the limit of log(t) + 1 - x; accepted as nan_kernels are",
    "prod_grad": "prod's gradient is the product of the other elements (pairwise, exact where the slice holds "
                 "zeros); where it holds none, torch divides the product by the element, so one NaN or inf "
                 "element makes the whole slice's gradient NaN there, and partial products that over- or "
                 "underflow differ",
    "static_zero": "a gradient that is zero by construction (x ** 0, the branch where(x < x, ...) never takes) "
                   "is not propagated; torch multiplies the zeros through the ops before it (0 * inf = NaN); "
                   "x / x's, ct / x - ct * ((x / x) / x) in torch's order, is a rounding-sized remainder in "
                   "float32 (1 ulp of ct / x; torch's float32 happens to round both terms alike more often)",
}
# ops whose gradient factor is computed from a bounded output (tanh: 1 - y^2, sigmoid: y (1 - y)):
# y's few ulps are an absolute error of ~1e-7 in the factor, relative ones where the factor is small
# (tanh at -7: 1 - y^2 = 1.2e-6, 10% off for y 2 ulps off; torch's own y is closer there)
# The same for gradients that cancel: softmax's y (ct - sum(ct y)) is 0 in exact arithmetic where a
# row is one-hot, ~1e-8 of the cotangent in float32 (the interpreter's, hour-run seed 4160069)
BOUNDED_DERIVATIVE = ("tanh", "sigmoid", "silu", "gelu", "mish", "logsigmoid", "softplus", "erf", "elu",
                      "softmax", "log_softmax", "logsumexp", "softmax_causal", "cross_entropy", "cross_entropy2",
                      "var", "std", "norm")
ACCUMULATING = ("sum", "mean", "prod", "var", "std", "norm", "cumsum", "matmul") + LOSSES


POWER_SUMS = ("norm", "var", "std")  # accumulate |x|^p (p = 2 for var and std)
SIGNED_SUMS = ("sum", "mean", "cumsum", "nll_loss")  # accumulate their argument's values, signed


def _broadcast_gradient_cancels(case: fg.Case, step: int, env64: dict) -> bool:
    """Whether the gradient of an argument that an add, sub or mul broadcasts over a case output
    is a sum whose terms cancel beyond n ulps of their magnitudes: that sum's order decides it
    (ct 1e30, -1e30, -0.74, 1.82 over the broadcast axis: torch's order gave -0.74 in float64 and
    float32, the interpreter's 1.14, the exact value; hour run 15's special seed 5670039). maximum
    and minimum send each term to one operand (or both, for a NaN): all of them are taken as
    terms (hour run 21's special seed 5870880: ct +-1e30 over minimum(x, p) with p = NaN, torch's
    order -2.55, the interpreter's 0)."""
    for op in case.ops:
        if op.op not in ("add", "sub", "mul", "maximum", "minimum") or op.outs[0] not in case.cts:
            continue
        ct = np.asarray(case.cts[op.outs[0]][step], np.float64)
        for k, a in enumerate(op.args):
            v = env64.get(a) if isinstance(a, str) else None
            if v is None or v.numel() == ct.size:
                continue
            with np.errstate(all="ignore"):
                terms = ct
                if op.op == "mul":
                    other = op.args[1 - k]
                    terms = ct * (env64[other].numpy() if isinstance(other, str) else float(other))
                axes = tuple(range(terms.ndim - v.dim())) + tuple(
                    terms.ndim - v.dim() + d for d, n in enumerate(v.shape) if n == 1 and terms.shape[terms.ndim - v.dim() + d] != 1)
                fin = np.where(np.isfinite(terms), terms, 0.0)
                noise = terms.size / max(v.numel(), 1) * 2.0**-24 * np.abs(fin).sum(axis=axes)
                if np.any(noise > REL * np.abs(fin.sum(axis=axes))):
                    return True
    return False


def _autograd_run(case: fg.Case, step: int) -> tuple[dict, list]:
    """The case in float64 torch with autograd on its leaves: (env by name, [(op, its outputs)])."""
    T = fg._torch()
    env = {n: fg._leaf_tensor(l, step, T.float64) for n, l in case.leaves.items()}
    traced = []
    with np.errstate(all="ignore"):
        for op in case.ops:
            outs = fg.eval_op(op, env, T.float64)[1]
            env.update(zip(op.outs, outs))
            traced.append((op, outs))
    return env, traced


def _grads_at(case: fg.Case, step: int, names: tuple) -> list:
    """[(op, float64 gradient of the case's loss at op's first output)] for its ops named in
    `names` (torch autograd over the case as given)."""
    if not any(op.op in names for op in case.ops):
        return []
    T = fg._torch()
    env, traced = _autograd_run(case, step)
    kept = []
    with np.errstate(all="ignore"):
        for op, outs in traced:
            if op.op in names and outs[0].requires_grad:
                outs[0].retain_grad()
                kept.append((op, outs[0]))
        terms = [(env[o] * T.from_numpy(np.asarray(case.cts[o][step], np.float64))).sum()
                 for o in case.outputs if o in case.cts and env[o].requires_grad]
        if not kept or not terms:
            return []
        sum(terms).backward()
    return [(op, out.grad) for op, out in kept if out.grad is not None]


def _cumsum_gradient_cancels(case: fg.Case, step: int) -> bool:
    """Whether the gradient reaching a cumsum's output, summed backwards along its axis (cumsum's
    VJP), cancels beyond n ulps of its terms' magnitudes: that sum's order decides it (ct 1e30,
    -0.45, -0.63, -1e30, 1.09 through hardswish: torch's order gave 0.4677 in float64 and float32,
    the interpreter's 0.4808, the exact value; hour run 20's special seed 5820870)."""
    T = fg._torch()
    for op, g in _grads_at(case, step, ("cumsum",)):
        axis = int(op.kw.get("axis", -1)) % max(g.dim(), 1)
        g = T.where(T.isfinite(g), g, T.zeros_like(g))
        back = lambda t: T.flip(T.cumsum(T.flip(t, (axis,)), axis), (axis,))  # noqa: E731
        noise = g.shape[axis] * 2.0**-24 * back(g.abs())
        if bool((noise > REL * back(g).abs()).any()):
            return True
    return False


def _gelu_ct_scale(case: fg.Case, step: int) -> float:
    """The largest finite cotangent reaching a gelu: gelu_cancel's tiny slopes are judged against
    it (2 ** (88.5 - gelu_tanh(-9.2)) sends 1.2e25 there, so aot's slope 5e-29, torch's 0, gives
    a gradient of 6e-4; hour run 23's special seed 5921151)."""
    m = 0.0
    for _op, g in _grads_at(case, step, ("gelu",)):
        a = g.abs()
        a = a[a.isfinite()]
        if a.numel():
            m = max(m, float(a.max()))
    return m


def _chain_gains(case: fg.Case, step: int, names: tuple) -> dict:
    """{leaf: elementwise max(1, |d a / d leaf|)} over the first arguments a of the case's ops named
    in `names` (float64 torch autograd of sum(a)): an absolute rounding error in the gradient at
    such an op reaches a leaf scaled by the ops between them (var's cancelling x - mean at
    log(1e-5) in log(p) -> var, torch float32 0, float64 -3e-4, times log's 1 / p = 1e5: the H200
    gave 0.047, special seed 6010007)."""
    T = fg._torch()
    env, traced = _autograd_run(case, step)
    args = [env[op.args[0]] for op, _ in traced
            if op.op in names and op.args and isinstance(op.args[0], str) and env[op.args[0]].requires_grad]
    with np.errstate(all="ignore"):
        leaves = [n for n, l in case.leaves.items() if env[n].requires_grad]
        if not args or not leaves:
            return {}
        gains = {n: np.ones(tuple(env[n].shape)) for n in leaves}
        for a in args:
            for n, g in zip(leaves, T.autograd.grad(a.sum(), [env[n] for n in leaves], retain_graph=True, allow_unused=True)):
                if g is not None:
                    g = np.abs(g.detach().numpy())
                    gains[n] = np.maximum(gains[n], np.where(np.isfinite(g), g, 1.0))
    return gains


def _known(case: fg.Case, step: int, env64: dict) -> tuple:
    """(False, "acc" (a reduction leaves float32's range) or "prod" (prod_grad), {leaf: elementwise
    mask of gradient elements accepted whatever they are})."""
    T = fg._torch()
    overflow = False
    for op in case.ops:
        if op.op in ACCUMULATING:
            for a in op.args:
                v = env64.get(a) if isinstance(a, str) else None
                if v is None or not v.dtype.is_floating_point:
                    continue
                fin = v[T.isfinite(v)].abs()
                if fin.numel() and (float(fin.max()) >= 1e18 or float(T.log10(fin[fin > 1]).sum()) > 38
                                    or float(T.log10(fin[(fin < 1) & (fin > 0)]).sum()) < -38):
                    overflow = "prod" if op.op == "prod" else overflow or "acc"
                nz = fin[fin > 0]
                if op.op in POWER_SUMS and nz.numel():
                    # the terms are |x|^p: (1.9e-22)^3 is 0 in float32, so a norm of such values is 0
                    # (and its gradient) where torch's double accumulator keeps it (seed 920011)
                    pw = float(op.kw.get("p", 2.0)) if op.op == "norm" else 2.0
                    lg = T.log10(nz) * pw
                    if math.isfinite(pw) and pw > 0 and (float(lg.min()) < -37.9 or float(lg.max()) > 38.5):
                        overflow = overflow or "acc"
                out = env64.get(op.outs[0])
                if op.op in SIGNED_SUMS and op.kw.get("reduction") != "none" and out is not None and out.dtype.is_floating_point and nz.numel():
                    # terms that cancel: a float32 sum's error, up to n ulps of the sum of |terms|
                    # (10000.03 - 10000 is 2e-4 off), beyond REL of the result (seed 920043: 0.7%,
                    # then erf and ** 2.5); torch's double accumulator cancels exactly
                    r = out[T.isfinite(out)].abs()
                    count = v.numel() / max(out.numel(), 1) if op.op == "mean" or op.kw.get("reduction") == "mean" else 1.0
                    noise = v.numel() * 2.0**-24 * float(nz.sum())
                    if r.numel() and float(r.min()) * count * REL < noise:
                        overflow = overflow or "acc"
                if op.op == "prod" and (not bool(T.isfinite(v).all()) or (nz.numel() and (float(nz.max()) > 1e6 or float(nz.min()) < 1e-6))):
                    overflow = "prod"  # prod_grad: the cotangent times partial products can overflow too
    if _broadcast_gradient_cancels(case, step, env64) or _cumsum_gradient_cancels(case, step):
        overflow = overflow or "acc"
    flags = set()
    for op in case.ops:
        v = env64.get(op.args[0]) if op.args and isinstance(op.args[0], str) else None
        if op.op in ("elu", "hardswish") and v is not None and bool(T.isnan(v).any()):
            flags.add("nan_kernels")
        t = env64.get(op.args[1]) if op.op == "kl_div" and isinstance(op.args[1], str) else None
        if t is not None and not op.kw.get("log_target") and bool(((t == 0) | T.isinf(t)).any()):
            flags.add("nan_kernels")  # kl_div_zero: torch's target gradient is NaN at target 0 and inf
        if op.op == "gelu":
            flags.add("gelu_cancel")
        if op.op in BOUNDED_DERIVATIVE:
            flags.add("bounded_derivative")
        names = [a for a in op.args if isinstance(a, str)]
        if len(names) != len(set(names)):
            flags.add("factorization")
    for v in env64.values():
        if v.dtype.is_floating_point and bool(((v != 0) & (v.abs() < TINY)).any()):
            flags.add("flush")
    return overflow, flags


def _accept_flags(got, refs, flags, scale) -> np.ndarray:
    """Elements KNOWN_DIFFERENCES accept: NaN in torch (nan_kernels), tiny values where torch's are
    0 (gelu_cancel), NaN where torch's are inf (flush). scale: the largest cotangent, for a
    gradient an array of its shape times the chain's gains (_chain_gains)."""
    got = np.asarray(got, np.float64)
    ok = np.zeros(got.shape, bool)
    for w64, w32 in refs:
        c64, c32 = classes(np.asarray(w64, np.float64).astype(np.float32)), classes(np.asarray(w32, np.float64))
        if "nan_kernels" in flags:
            ok |= (c64 == 1) | (c32 == 1)
        if "gelu_cancel" in flags:
            with np.errstate(invalid="ignore"):
                ok |= ((np.asarray(w64) == 0) | (np.asarray(w32) == 0)) & (np.abs(got) <= 1e-12 * scale)
            # the kept tiny derivative times an inf cotangent: inf where torch's cancelled 0 gives
            # NaN (gelu_tanh's gradient at x = -9.8 is -5e-34, a normal float32: hour-run seed
            # 4160451); and the kept tiny value and derivative through log or a division: a finite
            # slope where torch's 0 / 0 is NaN (log(gelu_tanh(x)) at x = -8.3: the true slope
            # times ct, 1.84; hour run 12's special seed 5610050)
            ok |= (c64 == 1) & (c32 == 1)
            # and downstream, the tiny negative value where torch's is -0: its ** -0.5 is NaN
            # where torch's is -inf (special seed 5361132), as under "flush"; its sqrt NaN where
            # torch's is -0 (special seed 5450310); and the tiny value's ** -2 finite where
            # torch's 0 ** -2 is inf (hour run 8's special seed 5420962)
            ok |= np.isnan(got) & (c64 >= 2) & (c32 >= 2)
            with np.errstate(invalid="ignore"):
                ok |= np.isnan(got) & (np.asarray(w64) == 0) & (np.asarray(w32) == 0)
            ok |= (classes(got) == 0) & (c64 >= 2) & (c32 >= 2)
        if "flush" in flags:
            ok |= np.isnan(got) & (c64 >= 2) & (c32 >= 2)
            # and the other infinity where a flushed zero's sign decides it: logsigmoid(89) is
            # -2.2e-39 in torch (its flushed reference -0, rsqrt of it -inf), 0 - log1p(0) = +0 on
            # a GPU that flushes exp(-89) (+inf; H200, special seed 5480275)
            ok |= (classes(got) >= 2) & (c64 >= 2) & (c32 >= 2)
            # and an infinity where torch's is beyond 2^100: a cotangent divided by a subnormal
            # that the device flushed (log's ct / x at x = 1e-40: -1e33 in torch, -inf on the
            # H200, special seed 5490301)
            with np.errstate(invalid="ignore"):
                w = np.asarray(w64, np.float64)
                ok |= (classes(got) >= 2) & (c64 == 0) & (np.abs(w) > 2.0**100) & (np.sign(got) == np.sign(w))
        if "factorization" in flags:
            ok |= (classes(got) >= 2) & (c64 == 1) & (c32 == 1)
        if "bounded_derivative" in flags:  # 1 - y^2 with y a few ulps off: absolute 1e-6 * |ct|
            with np.errstate(invalid="ignore"):
                ok |= (c64 == 0) & (classes(got) == 0) & (np.abs(got - np.asarray(w64, np.float64)) <= 1e-6 * scale)
    return ok


def _env64(case: fg.Case, step: int) -> dict:
    T = fg._torch()
    env = {n: fg._leaf_tensor(l, step, T.float64).detach() for n, l in case.leaves.items()}
    with T.no_grad(), np.errstate(all="ignore"):
        for op in case.ops:
            env.update(zip(op.outs, fg.eval_op(op, env, T.float64)[1]))
    return env


def _accept_overflow(got, refs, how="acc") -> np.ndarray:
    """Where a case's reductions over- or underflow in float32 (KNOWN_DIFFERENCES "accumulation",
    "prod_grad"), or prod meets inf or NaN: anything (the values and gradients downstream of an
    overflowed sum are off; an inf there times a 0 derivative is NaN)."""
    return np.ones(np.shape(got), bool)


# ---- near-ties of selecting ops --------------------------------------------------------------------
# max, min, maximum and minimum send the gradient to the element they select; greater and less make
# where select a branch. Where the runner-up is within rounding of the selected element, which one
# wins is decided by each side's float32 rounding (special seed 5350470: aot's correctly rounded
# sigmoid gives sigmoid(1e-7) = sigmoid(-2^-126) = 0.5, a tie min breaks to the first, where torch's
# float32 has sigmoid(1e-7) one ulp above 0.5 and float64 keeps them apart). The graph area refuses
# such cases (fuzz_graphs' guards); the special area keeps the case and does not compare what the
# choice decides: the gradients of the leaves upstream of a selecting op (its values are within
# rounding either way, and still compared), everything for a comparison (where's branches differ).
SELECTING = ("max", "min", "maximum", "minimum")
COMPARING = ("greater", "less")
TIE_ULPS = 8.0  # pattern_ok's ulps: how far a side's value may be from the correctly rounded one


def _env(case: fg.Case, step: int, fdt, flush: bool = False) -> dict:
    """The case's values (no gradients) in torch at dtype fdt; with flush, subnormals flushed as in
    torch_case."""
    T = fg._torch()
    env = {}
    for n, l in case.leaves.items():
        v = np.array(l.value(step))
        v = T.from_numpy(_flush(v) if flush else v)
        env[n] = v.to(T.int64) if l.dtype == "i32" else v.to(fdt)
    with T.no_grad(), np.errstate(all="ignore"):
        for op in case.ops:
            outs = fg.eval_op(op, env, fdt)[1]
            if flush:
                outs = tuple(T.where((o != 0) & (o.abs() < TINY), o * 0, o)
                             if isinstance(o, T.Tensor) and o.dtype.is_floating_point else o for o in outs)
            env.update(zip(op.outs, outs))
    return env


def _candidates(op: fg.Op, env: dict):
    """(x, m): each candidate of a selecting or comparing op and what it competes with (the
    slice's selected value for max and min, the other operand for the binary ones), broadcast;
    None for integer operands."""
    T = fg._torch()
    if op.op in ("max", "min"):
        x = env[op.args[0]]
        dims = fg._axes(op.kw.get("axis"), x.ndim)
        if not dims or not x.dtype.is_floating_point:
            return None
        m = x.amax(dim=dims, keepdim=True) if op.op == "max" else x.amin(dim=dims, keepdim=True)
        return T.broadcast_tensors(x, m)
    like = next(env[a] for a in op.args if isinstance(a, str))
    if not like.dtype.is_floating_point:
        return None
    a, b = (env[a] if isinstance(a, str) else T.tensor(float(a), dtype=like.dtype) for a in op.args[:2])
    return T.broadcast_tensors(a, b)


def _tied(c64, c32) -> bool:
    """Whether some candidate is near its rival but not exactly on it in both precisions: within
    TIE_ULPS float32 ulps of it (plus SPREAD_SPECIAL times torch float32's own error on the two, as
    pattern_ok), or equal in one precision only."""
    x64, m64 = (np.asarray(t, np.float64) for t in c64)
    x32, m32 = (np.asarray(t, np.float64) for t in c32)
    with np.errstate(invalid="ignore", over="ignore"):
        on64, on32 = x64 == m64, x32 == m32
        err = np.nan_to_num(np.abs(x32 - x64) + np.abs(m32 - m64), nan=0.0, posinf=0.0)
        # (ulp32 of float32's largest value is inf: its spacing below, 2^104, is the one meant)
        near = np.abs(x64 - m64) <= TIE_ULPS * np.minimum(ulp32(m64), 2.0**104) + SPREAD_SPECIAL * err
    return bool(((near | on64 | on32) & ~(on64 & on32)).any())


# sin and cos of a computed argument: where the argument's rounding (float32's correctly rounded
# value, torch float32's) moves it by a good part of the distance to a root of the derivative, the
# derivative's sign is decided by rounding (special seed 5390459: cos(3 ** 50), 3 ** 50 = 7.2e23 in
# float32 and in double 7e16 apart, so an inf cotangent's gradient is +inf or -inf by that bit).
PERIODIC = ("sin", "cos")


def _periodic_by_rounding(op: str, x64, x32) -> tuple[bool, bool]:
    """(the derivative's sign, the value's sign) decided by the argument's rounding somewhere."""
    x64, x32 = (np.asarray(t, np.float64) for t in (x64, x32))
    with np.errstate(invalid="ignore", over="ignore"):
        dev = np.maximum(np.abs(x64.astype(np.float32).astype(np.float64) - x64), np.abs(x32 - x64))
        reach = np.where(dev > 0, TIE_ULPS * np.minimum(ulp32(x64), 2.0**104) + SPREAD_SPECIAL * dev, -1.0)
        slope = np.abs(np.cos(x64) if op == "sin" else np.sin(x64))
        value = np.abs(np.sin(x64) if op == "sin" else np.cos(x64))
    fin = np.isfinite(x64)
    return bool(((reach >= slope) & fin).any()), bool(((reach >= value) & fin).any())


def _signed_zero_tie(c) -> bool:
    """Whether a candidate and its rival are zeros of opposite signs: which one maximum(+0, -0)
    returns is torch's own coin (its vectorized kernel gives the second operand, its scalar tail
    the first: torch.maximum(torch.zeros(20), -torch.zeros(20)) is 16 times -0, then 4 times +0,
    special seeds 5370011, 5370392), and a 1 / x or rsqrt downstream turns the sign into +-inf."""
    x, m = (np.asarray(t, np.float64) for t in c)
    return bool(((x == 0) & (m == 0) & (np.signbit(x) != np.signbit(m))).any())


def _matmul_zero_sign(op: fg.Op, env: dict) -> bool:
    """Whether some element of a matmul is a sum of -0.0 products only: its sign is the sum's
    start, torch's coin by shape (its mm gives the product, -0.0, for [M, 1] @ [1, N] with M and N
    above 1, its matrix-vector path and bmm +0.0; hour run 18's special seed 5731847), and a
    1 / x downstream turns it into +-inf."""
    a, b = env[op.args[0]], env[op.args[1]]
    if not a.dtype.is_floating_point:
        return False
    with np.errstate(invalid="ignore"):
        prod = a.unsqueeze(-1) * b.unsqueeze(-3)  # [..., M, K, N]
    return bool(((prod == 0) & prod.signbit()).all(dim=-2).any())


def _flush_tie(c) -> bool:
    """Whether a candidate and its rival differ but are both zero or subnormal: a device that
    flushes compares them equal, a tie that maximum splits (the H200's maximum(-0, 1e-40) gave each
    half the gradient where torch gives 1e-40 all of it: special seed 5890468)."""
    x, m = (np.asarray(t, np.float64) for t in c)
    with np.errstate(invalid="ignore"):
        return bool(((x != m) & (np.abs(x) < TINY) & (np.abs(m) < TINY)).any())


def _upstream(case: fg.Case, names) -> set:
    """The leaves that the values `names` are computed from."""
    made = {o: op for op in case.ops for o in op.outs}
    seen, todo = set(), [n for n in names if isinstance(n, str)]
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += [a for a in made[n].args if isinstance(a, str)] if n in made else []
    return seen & set(case.leaves)


# ops whose derivative jumps at these arguments: an argument computed within rounding of one takes
# the slope of the side its rounding puts it on (hardswish(3 ** exp(-1e-7)): 3 ** 0.9999999 is
# 2.9999998 in torch float32, slope 1.5, and 3.0 in the interpreter, slope 1; hour run 16's special
# seed 5691007), so the gradients upstream are not compared there
KINKS = {"hardswish": (-3.0, 3.0), "hardsigmoid": (-3.0, 3.0)}


def _near_kink(kinks, x64, x32) -> bool:
    """Whether an argument is within TIE_ULPS ulps (of float32) of a kink, in float64 or float32."""
    for x in (x64, x32):
        x = np.asarray(x.detach().numpy() if hasattr(x, "detach") else x, np.float64)
        for k in kinks:
            if np.any(np.abs(x - k) <= TIE_ULPS * float(np.spacing(np.float32(k)))):
                return True
    return False


def near_ties(case: fg.Case, step: int) -> tuple[set, bool]:
    """({leaf: gradient not compared}, whether outputs are not compared either) for the near-ties
    of the case's selecting and comparing ops at a step, in the inputs as given or flushed."""
    ops = [op for op in case.ops if op.op in SELECTING + COMPARING + PERIODIC + tuple(KINKS) + ("clamp", "matmul")]
    if not ops:
        return set(), False
    T = fg._torch()
    envs = [(_env(case, step, T.float64, fl), _env(case, step, T.float32, fl)) for fl in (False, True)]
    leaves, values = set(), False
    for op in ops:
        for e64, e32 in envs:
            if op.op == "matmul":
                if _matmul_zero_sign(op, e64) or _matmul_zero_sign(op, e32):
                    leaves, values = set(case.leaves), True  # the zero's sign flows into values downstream
                    break
                continue
            if op.op in KINKS or op.op == "clamp":
                # clamp's bounds are kinks too: its gradient passes at a bound (torch's <=), so an
                # argument rounded onto it or just past it decides (sigmoid(1e-7) is 0.5 correctly
                # rounded, just above in torch; hour run 18's special seed 5730808)
                kinks = KINKS.get(op.op) or tuple(float(op.kw[b]) for b in ("min", "max") if isinstance(op.kw.get(b), (int, float)))
                if _near_kink(kinks, e64[op.args[0]], e32[op.args[0]]):
                    leaves |= _upstream(case, op.args)
                    break
                continue
            if op.op in PERIODIC:
                slope, value = _periodic_by_rounding(op.op, e64[op.args[0]], e32[op.args[0]])
                if value:  # the value's own sign is rounding's (special seed 5450318: rsqrt of it)
                    leaves, values = set(case.leaves), True
                if slope:
                    leaves |= _upstream(case, op.args)
                    break
                continue
            c64, c32 = _candidates(op, e64), _candidates(op, e32)
            if c64 is not None and (_signed_zero_tie(c64) or _signed_zero_tie(c32)):
                leaves, values = set(case.leaves), True  # the zero's sign flows into values downstream
                break
            if c64 is not None and (_tied(c64, c32) or _flush_tie(c64) or _flush_tie(c32)):
                leaves |= _upstream(case, op.args)
                if op.op in COMPARING:  # where's other branch: values, and every gradient
                    leaves, values = set(case.leaves), True
                break
    return leaves, values


def _subnormal_leaf_gradient(got, refs, leaf) -> np.ndarray:
    """Elements of a leaf's gradient where the leaf is a subnormal and aot's is an infinity that a
    device flushing some reads of it gives: its ops mix its bits (log_f32 reads them: log(1e-45) is
    -103.3) with a flushed 0 (ct / x is then inf; a negative subnormal compared as 0 makes log -inf),
    so the gradient is an infinity of torch's sign where torch's is finite (log -> 2 ** . at 1e-45:
    -3.6e13 in torch, -inf on the H200, special seed 5980159), or any infinity where torch's is not
    finite (log -> var with -3e-39 beside 1e-45: NaN, -inf on the H200; seed 5980098)."""
    got = np.asarray(got, np.float64)
    x = np.broadcast_to(np.asarray(leaf, np.float64), got.shape)
    ok = (x != 0) & (np.abs(x) < TINY) & np.isinf(got)
    if not ok.any():
        return ok
    w, w32 = (np.asarray(r, np.float64) for r in refs[0])  # torch's for the leaves as given
    nonfinite = ~np.isfinite(w) | ~np.isfinite(w32)
    with np.errstate(invalid="ignore"):
        return ok & (nonfinite | (np.sign(got) == np.sign(w)))


def special_failures(batch: fg.Batch, side, kind: str) -> list[tuple[int, str, str]]:
    """(case, what, detail) per disagreement of a side (fuzz_graphs.Sides) with PyTorch."""
    out = []
    for s in range(batch.steps):
        for k, c in enumerate(batch.cases):
            p = batch.prefix(k)
            refs = _special_refs(c, s)
            leaves = {n: l.value(s) for n, l in c.leaves.items()}
            overflow, flags = _known(c, s, _env64(c, s))
            untied, values_off = near_ties(c, s)  # decided by rounding: not compared
            paths = _path_magnitudes(c, s)  # a gradient's paths cancelling: their rounding allowed
            ct_scale = 1.0 + max([float(np.max(np.abs(a[np.isfinite(a)]), initial=0.0)) for a in (v[s] for v in c.cts.values())])
            if "gelu_cancel" in flags:
                ct_scale = max(ct_scale, _gelu_ct_scale(c, s))
            gains = _chain_gains(c, s, BOUNDED_DERIVATIVE + ("gelu",)) if flags & {"bounded_derivative", "gelu_cancel"} else {}
            for o in c.outputs:
                got = side.captures[s].get(p + o)
                if got is None:
                    out.append((k, f"step {s + 1}: output {p + o}", "missing"))
                    continue
                if values_off:
                    continue
                rs = [(r64[0][o], r32[0][o]) for r64, r32 in refs]
                ok = pattern_ok(got, rs) | (_accept_overflow(got, rs, overflow) if overflow else False)
                ok |= _accept_flags(got, rs, flags - {"flush"}, 1.0)
                if "flush" in flags:  # an infinity whose sign a flushed zero decided (_accept_flags)
                    f64, f32 = (classes(np.asarray(w, np.float64).astype(np.float32)) for w in rs[1])
                    ok |= (classes(got) >= 2) & (f64 >= 2) & (f32 >= 2)
                if not ok.all():
                    out.append((k, f"step {s + 1}: output {p + o}", describe(got, rs, ~ok, leaves)))
            for n in refs[0][0][1]:
                got = side.grads[s].get(p + n)
                if got is None:
                    out.append((k, f"step {s + 1}: gradient of {p + n}", "missing"))
                    continue
                if n in untied:
                    continue
                rs = [(r64[1][n], r32[1][n]) for r64, r32 in refs]
                extra = _ct_bound(c, s) + paths.get(n, 0.0)
                ok = pattern_ok(got, rs, extra=extra) | (_accept_overflow(got, rs, overflow) if overflow else False)
                ok |= _accept_flags(got, rs, flags, ct_scale * gains.get(n, 1.0))
                if "flush" in flags and n in leaves:
                    ok |= _subnormal_leaf_gradient(got, rs, leaves[n])
                if not ok.all():
                    cts = {f"{o}_ct": v[s] for o, v in c.cts.items()}
                    out.append((k, f"step {s + 1}: gradient of {p + n}", describe(got, rs, ~ok, dict(leaves, **cts))))
        # the loss: sum over cases of sum(output * cotangent), itself a float32 sum (accumulation):
        # checked where no case has a known difference and no partial sum can leave float32's range
        want64 = sum(_special_refs(c, s)[0][0][2] for c in batch.cases)
        want32 = sum(_special_refs(c, s)[0][1][2] for c in batch.cases)
        got = np.float64(side.loss[s])
        terms = [np.abs(np.asarray(r[0][0][o], np.float64) * np.asarray(c.cts[o][s], np.float64))
                 for c in batch.cases for r in [_special_refs(c, s)[0]] for o in c.outputs if o in c.cts]
        fin = sum(float(np.sum(t[np.isfinite(t)])) for t in terms)
        plain = fin < 1e37 and not any(any(_known(c, s, _env64(c, s))[:1]) or _known(c, s, _env64(c, s))[1]
                                       or near_ties(c, s)[1] for c in batch.cases)
        ok = pattern_ok(np.array(got), [(np.array(want64), np.array(want32))], ulps=64, extra=1e-5 * (fin + 1))
        if plain and not ok.all() and not (math.isnan(want64) or math.isnan(want32)):
            out.append((None, f"step {s + 1}: loss", f"got {got!r}, expected {want64!r} (torch float32 {want32!r})"))
    if kind in fg.SIDE_OF and side.replay is not None:  # a package side
        loss, caps, grads = side.replay
        diff = [] if loss == side.loss[0] or (math.isnan(loss) and math.isnan(side.loss[0])) else ["loss"]
        diff += [n for n, v in side.captures[0].items() if not np.array_equal(v, caps.get(n), equal_nan=True)]
        diff += [n for n, v in side.grads[0].items() if not np.array_equal(v, grads.get(n), equal_nan=True)]
        if diff:
            out.append((None, "step 1 again after reset()", "not bit-identical: " + ", ".join(diff[:6])))
    return out


def chain_text(case: fg.Case) -> list[str]:
    """The case's ops as source lines (v1 = ops.exp(p0))."""
    return [f"{', '.join(op.outs)} = {fg.OPS[op.op].src([repr(a) if not isinstance(a, str) else a for a in op.args], op.kw, None)}"
            for op in case.ops]


def _runs_for_interp(batch: fg.Batch) -> list:
    """The minimal CaseRun fields run_interp reads: the (fixed) parameters and no buffers."""
    runs = []
    for c in batch.cases:
        params = {n: l.values[0] for n, l in c.leaves.items() if l.kind != "input"}
        runs.append(fg.CaseRun([], [], [], {}, [], params=[params] * (batch.steps + 1), buffers=[{}] * (batch.steps + 1)))
    return runs


def check_special(seed: int, batch: fg.Batch | None = None, sides: tuple | None = None) -> tuple[AreaResult, fg.Batch]:
    """`sides`: the package sides to run (fuzz_graphs.check's), default_sides() when None."""
    batch = batch or generate_special(seed)
    sides = fg.default_sides() if sides is None else sides
    res = AreaResult(programs=1, graphs=len(batch.cases), ops=sum(len(c.ops) for c in batch.cases), steps=batch.steps)
    res.elements = batch.steps * sum(
        sum(int(np.prod(c.cts[o][0].shape)) for o in c.outputs)
        + sum(int(np.prod(l.shape)) for l in c.leaves.values() if l.kind != "input") for c in batch.cases)
    interp = fg.run_interp(batch, _runs_for_interp(batch))
    found = []
    if isinstance(interp, fg.Failure):
        found.append(("interp-error", None, interp.what, interp.detail))
    else:
        found += [("interp",) + f for f in special_failures(batch, interp, "interp")]
    for name in sides:  # the interpreter's finding explains a package side's there, the GPU set's a wasm one
        with np.errstate(all="ignore"):
            got = fg.PACKAGE_SIDES[name](batch)
        if isinstance(got, fg.Failure):
            found.append((got.kind, None, got.what, got.detail))
        else:
            explained = {(k, w) for kind, k, w, _ in found}
            found += [(name,) + f for f in special_failures(batch, got, name) if (f[0], f[1]) not in explained]
    for kind, k, what, detail in found:
        src = fg.batch_source(replace(batch, cases=[batch.cases[k]]), inline=True) if k is not None else ""
        chain = "" if k is None else " [" + "; ".join(chain_text(batch.cases[k])) + "]"
        res.failures.append(Finding("special", seed, f"[{kind}] {'' if k is None else f'case {k}: '}{what}", detail + chain, src))
    return res, batch


# ---- area "optim": optimizer trajectories, step_many, save/restore ---------------------------------

ACTS = {"tanh": ("ops.tanh({})", lambda T, h: h.tanh()), "sigmoid": ("ops.sigmoid({})", lambda T, h: h.sigmoid()),
        "gelu": ("ops.gelu({})", lambda T, h: T.nn.functional.gelu(h)), "silu": ("ops.silu({})", lambda T, h: T.nn.functional.silu(h)),
        "softplus": ("ops.softplus({})", lambda T, h: T.nn.functional.softplus(h))}
OPTIMS = ("Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "Adadelta")
# the hyper-parameters a group may set besides lr and weight_decay (API.md §9)
GROUP_EXTRA = {"Adam": ("betas", "eps"), "AdamW": ("betas", "eps"), "SGD": ("momentum", "nesterov"), "Adadelta": ("rho", "eps"),
               "RMSprop": ("alpha", "eps", "momentum", "centered"), "Adagrad": ("lr_decay", "eps")}


def lr_at(spec, t: int) -> float:
    """A schedule's lr of update t = 1, 2, ..., from API.md §1's formulas (not aot's code)."""
    if not isinstance(spec, tuple):
        return float(spec)
    kind = spec[0]
    if kind == "linear":
        _, peak, final, n = spec
        return peak + (final - peak) * min(t - 1, n) / n
    if kind == "cosine":
        _, peak, final, n = spec
        return final + (peak - final) * (1 + math.cos(math.pi * min(t - 1, n) / n)) / 2
    if kind == "step":
        _, peak, every, gamma = spec
        return peak * gamma ** ((t - 1) // every)
    if kind == "multistep":
        _, peak, ms, gamma = spec
        return peak * gamma ** sum(1 for m in ms if m <= t - 1)
    if kind == "warmup":
        _, peak, n, after = spec
        return peak * t / n if t <= n else lr_at(after, t - n)
    _, first, n, after = spec  # sequential
    return lr_at(first, t) if t <= n else lr_at(after, t - n)


def lr_src(spec) -> str:
    if not isinstance(spec, tuple):
        return repr(float(spec))
    kind, *args = spec
    return f"aot.lr.{kind}({', '.join(lr_src(a) if isinstance(a, tuple) and a and isinstance(a[0], str) else repr(a) for a in args)})"


@dataclass
class OptimCase:
    """One small model, its optimizer and K batches. params: name -> (value, decay flag)."""

    seed: int
    dims: tuple  # (N, D, H, O)
    act: str
    head: str  # "mse" | "ce"
    params: dict
    unused: bool
    opt: str
    okw: dict  # optimizer keywords (lr: float or schedule spec tuple), groups as a list of dicts
    batches: list  # [{"x": ..., "y": ...}]
    save_at: int  # restore from a checkpoint after this many steps
    set_lr: tuple | None = None  # (j, lr or schedule spec): model.set_lr(spec) after step j (every group's)

    @property
    def steps(self) -> int:
        return len(self.batches)


def _rand_schedule(rng, peak: float, steps: int):
    kind = str(rng.choice(["linear", "cosine", "step", "multistep", "warmup", "sequential"]))
    n = int(rng.integers(1, steps + 1))
    if kind in ("linear", "cosine"):
        return (kind, peak, float(peak * rng.choice([0.0, 0.1, 0.5, 2.0])), n)
    if kind == "step":
        return ("step", peak, n, float(rng.choice([0.5, 0.1, 0.9])))
    if kind == "multistep":
        return ("multistep", peak, tuple(sorted({int(v) for v in rng.integers(1, steps + 1, 2)})), float(rng.choice([0.5, 0.3])))
    if kind == "warmup":
        after = peak if rng.random() < 0.5 else ("cosine", peak, peak * 0.1, steps)
        return ("warmup", peak, n, after)
    return ("sequential", float(peak * 0.5), n, ("linear", peak, peak * 0.2, steps))


def _opt_kwargs(rng, opt: str, steps: int) -> dict:
    c = lambda *xs: xs[int(rng.integers(len(xs)))]  # noqa: E731
    base = {"Adam": 1e-2, "AdamW": 1e-2, "SGD": 0.05, "RMSprop": 3e-3, "Adagrad": 0.05, "Adadelta": 1.0}[opt] * float(c(0.3, 1.0, 2.0))
    kw = {}
    if opt in ("Adam", "AdamW"):
        kw.update(betas=c((0.9, 0.999), (0.8, 0.99), (0.5, 0.9)), eps=c(1e-8, 1e-6, 1e-3), amsgrad=bool(rng.random() < 0.3))
        kw["weight_decay"] = c(0.0, 0.01, 0.1) if opt == "Adam" else c(0.0, 0.01, 0.1, 0.5)
    elif opt == "SGD":
        kw.update(momentum=c(0.0, 0.5, 0.9), weight_decay=c(0.0, 0.01, 0.1))
        kw["nesterov"] = bool(kw["momentum"] > 0 and rng.random() < 0.5)
    elif opt == "RMSprop":
        kw.update(alpha=c(0.99, 0.9, 0.5), eps=c(1e-8, 1e-6, 1e-3), weight_decay=c(0.0, 0.01), momentum=c(0.0, 0.0, 0.5, 0.9),
                  centered=bool(rng.random() < 0.4))
    elif opt == "Adagrad":
        kw.update(lr_decay=c(0.0, 0.0, 0.1), weight_decay=c(0.0, 0.01), initial_accumulator_value=c(0.0, 0.0, 0.1),
                  eps=c(1e-10, 1e-6, 1e-3))
    else:
        kw.update(rho=c(0.9, 0.5, 0.99), eps=c(1e-6, 1e-4), weight_decay=c(0.0, 0.01))
    kw["lr"] = base if rng.random() < 0.5 else _rand_schedule(rng, base, steps)
    if rng.random() < 0.4:
        kw["clip_grad_norm"] = c(0.05, 0.5, 5.0)
    groups = []
    pats = [["l1.*"], ["l2.W", "scale"], ["l2.*"], ["scale"], ["l1.b", "l2.b"]]
    for pat in [pats[i] for i in rng.permutation(len(pats))[: int(rng.choice([0, 0, 1, 1, 2]))]]:
        if any(set(pat) & set(g["_names"]) for g in groups):
            continue
        g = {"params": pat[0] if len(pat) == 1 and "*" in pat[0] else pat, "_names": pat}
        if rng.random() < 0.6:
            g["lr"] = base * float(c(0.1, 0.5, 3.0)) if rng.random() < 0.6 else _rand_schedule(rng, base * 0.5, steps)
        if rng.random() < 0.5:
            g["weight_decay"] = float(c(0.0, 0.05, 0.2))
        for key in GROUP_EXTRA[opt]:
            if rng.random() < 0.3:
                g[key] = _opt_kwargs(rng, opt, steps).get(key, kw.get(key))
        if opt == "SGD" and g.get("nesterov", kw["nesterov"]) and not g.get("momentum", kw["momentum"]):
            g["momentum"] = 0.9  # torch.optim.SGD refuses nesterov without momentum (a group inherits either)
        groups.append(g)
    if groups:
        kw["groups"] = groups
    return kw


def _overlaps(groups) -> bool:
    import fnmatch

    names = ["l1.W", "l1.b", "l2.W", "l2.b", "scale", "unused", "shift"]
    for n in names:
        hits = sum(1 for g in groups if any(fnmatch.fnmatchcase(n, p) for p in g["_names"]))
        if hits > 1:
            return True
    return False


def generate_optim(seed: int) -> OptimCase:
    rng = np.random.default_rng([33, seed])
    N, D, H, O = (int(rng.integers(a, b)) for a, b in ((2, 9), (1, 6), (2, 9), (1, 5)))
    head = "ce" if rng.random() < 0.3 and O > 1 else "mse"
    params = {
        "l1.W": (rng.uniform(-1, 1, (D, H)) / math.sqrt(D), True),
        "l1.b": (rng.uniform(-0.2, 0.2, (H,)), bool(rng.random() < 0.3)),
        "l2.W": (rng.uniform(-1, 1, (H, O)) / math.sqrt(H), True),
        "l2.b": (rng.uniform(-0.2, 0.2, (O,)), bool(rng.random() < 0.3)),
        "scale": (rng.uniform(0.5, 1.5, (O,)), bool(rng.random() < 0.5)),
    }
    unused = bool(rng.random() < 0.3)
    if unused:
        params["unused"] = (rng.uniform(-1, 1, (2,)), True)
    # a shift removed by centering: its gradient is 0 in exact arithmetic and float32 noise in
    # aot's, which Adam, RMSprop and Adagrad normalize into updates of size lr (optim_tolerance)
    if rng.random() < 0.3:
        params["shift"] = (rng.uniform(-0.5, 0.5, (1,)), True)
    params = {n: (np.asarray(v, np.float32), d) for n, (v, d) in params.items()}
    opt = str(rng.choice(OPTIMS))
    steps = int(rng.integers(3, 7))
    while True:
        okw = _opt_kwargs(rng, opt, steps)
        if not _overlaps(okw.get("groups", [])):
            break
    batches = []
    for _ in range(steps):
        x = np.asarray(rng.uniform(-1.5, 1.5, (N, D)), np.float32)
        y = rng.integers(0, O, (N,)).astype(np.int32) if head == "ce" else np.asarray(rng.uniform(-1, 1, (N, O)), np.float32)
        batches.append({"x": x, "y": y})
    act = str(rng.choice(list(ACTS)))
    set_lr = None
    if rng.random() < 0.3:  # set_lr between steps: a schedule starts at its own step 1 on the next step
        peak = lr_at(okw["lr"], 1)
        set_lr = (int(rng.integers(1, steps)), float(peak * 0.5) if rng.random() < 0.5 else _rand_schedule(rng, peak, steps))
    return OptimCase(seed, (N, D, H, O), act, head, params, unused, opt, okw, batches, int(rng.integers(1, steps)), set_lr)


def _opt_src(case: OptimCase) -> str:
    parts = []
    for k, v in case.okw.items():
        if k == "lr":
            parts.append(f"lr={lr_src(v)}")
        elif k == "groups":
            gs = []
            for g in v:
                items = [f"'params': {g['params']!r}"] + [
                    f"{kk!r}: {lr_src(vv) if kk == 'lr' else repr(vv)}" for kk, vv in g.items() if kk not in ("params", "_names")]
                gs.append("{" + ", ".join(items) + "}")
            parts.append(f"groups=[{', '.join(gs)}]")
        else:
            parts.append(f"{k}={v!r}")
    return f"aot.optim.{case.opt}({', '.join(parts)})"


def optim_source(case: OptimCase, name: str = "fuzz_optim") -> str:
    N, D, H, O = case.dims
    L = ["import numpy as np", "", "import aot", "from aot import ops", "", "P = {"]
    L += [f"    {n!r}: {fg.array_source(v, '    ')}," for n, (v, _d) in case.params.items()]
    L += ["}", "DECAY = " + repr({n: d for n, (_v, d) in case.params.items()}), "", "",
          "class Lin(aot.Module):", "    def __init__(self, name):", "        super().__init__()",
          "        self.W = self.param(P[name + '.W'].shape, init=aot.init.literal(P[name + '.W']), decay=DECAY[name + '.W'])",
          "        self.b = self.param(P[name + '.b'].shape, init=aot.init.literal(P[name + '.b']), decay=DECAY[name + '.b'])",
          "", "", "class Net(aot.Module):", "    def __init__(self):", "        super().__init__()",
          "        self.l1 = Lin('l1')", "        self.l2 = Lin('l2')",
          "        self.scale = self.param(P['scale'].shape, init=aot.init.literal(P['scale']), decay=DECAY['scale'])"]
    if case.unused:
        L.append("        self.unused = self.param((2,), init=aot.init.literal(P['unused']), decay=True)  # reaches no loss")
    if "shift" in case.params:
        L.append("        self.shift = self.param((1,), init=aot.init.literal(P['shift']), decay=True)")
    L += ["", "", "def loss(m, x, y):", f"    h = {ACTS[case.act][0].format('x @ m.l1.W + m.l1.b')}"]
    if "shift" in case.params:
        L += ["    z = h @ m.l2.W + m.l2.b + m.shift", "    out = (z - ops.mean(z, axis=-1, keepdims=True)) * m.scale"]
    else:
        L.append("    out = (h @ m.l2.W + m.l2.b) * m.scale")
    L.append("    aot.capture('logits', out)")
    if case.head == "ce":
        L.append("    return ops.cross_entropy(out, y)")
    else:
        L.append("    return ops.mean(ops.square(out - y)) + 0.01 * ops.sum(ops.square(m.scale))")
    y = f"aot.i32({N})" if case.head == "ce" else f"aot.f32({N}, {O})"
    L += ["", "", "program = aot.Program(", f"    {name!r},", "    model=Net,",
          f"    train=aot.Train(loss, inputs={{'x': aot.f32({N}, {D}), 'y': {y}}}, optimizer={_opt_src(case)}),", "    seed=0,", ")", ""]
    return "\n".join(L)


def _torch_groups(case: OptimCase, tparams: dict):
    """torch.optim param groups equal to the aot optimizer's: one per (aot group, decayed or not),
    the decay flag deciding unless the aot group sets weight_decay (API.md §9)."""
    import fnmatch

    groups = case.okw.get("groups", [])
    out = {}
    for n, (v, decay) in case.params.items():
        gi = next((i for i, g in enumerate(groups) if any(fnmatch.fnmatchcase(n, p) for p in g["_names"])), None)
        g = groups[gi] if gi is not None else {}
        wd = g.get("weight_decay", case.okw.get("weight_decay", 0.0)) if (decay or "weight_decay" in g) else 0.0
        key = (gi, wd)
        if key not in out:
            hyper = {k: v2 for k, v2 in case.okw.items() if k not in ("lr", "groups", "clip_grad_norm")}
            hyper.update({k: v2 for k, v2 in g.items() if k not in ("params", "_names", "lr")})
            hyper["weight_decay"] = wd
            out[key] = {"params": [], "_lr": g.get("lr", case.okw["lr"]), **hyper}
        out[key]["params"].append(tparams[n])
    return list(out.values())


def torch_trajectory(case: OptimCase, fdt, noise: float = 0.0, noise_seed: int = 0):
    """[(loss, grads, params after the update)] per step with torch.optim; with noise, every
    gradient gets N(0, 1) * noise * (its tensor's largest |g| + |g|) added before clipping."""
    T = fg._torch()
    F = T.nn.functional
    tp = {n: T.tensor(v.astype(np.float64), dtype=fdt, requires_grad=True) for n, (v, _d) in case.params.items()}
    pgs = _torch_groups(case, tp)
    lrs = [g.pop("_lr") for g in pgs]
    for g, lr in zip(pgs, lrs):
        g["lr"] = lr_at(lr, 1)
    cls = getattr(T.optim, case.opt)
    ctor = {}
    if "initial_accumulator_value" in case.okw:  # torch.optim.Adagrad fills the sums from its own argument
        ctor["initial_accumulator_value"] = case.okw["initial_accumulator_value"]
    opt = cls(pgs, lr=lr_at(case.okw["lr"], 1), foreach=False, **ctor)
    nrng = np.random.default_rng(noise_seed)
    out = []
    for t, b in enumerate(case.batches, start=1):
        for g, lr in zip(opt.param_groups, lrs):
            g["lr"] = lr_at(lr, t) if not case.set_lr or t <= case.set_lr[0] else lr_at(case.set_lr[1], t - case.set_lr[0])
        x = T.tensor(b["x"].astype(np.float64), dtype=fdt)
        h = ACTS[case.act][1](T, x @ tp["l1.W"] + tp["l1.b"])
        if "shift" in tp:
            z = h @ tp["l2.W"] + tp["l2.b"] + tp["shift"]
            o = (z - z.mean(-1, keepdim=True)) * tp["scale"]
        else:
            o = (h @ tp["l2.W"] + tp["l2.b"]) * tp["scale"]
        if case.head == "ce":
            loss = F.cross_entropy(o, T.tensor(b["y"].astype(np.int64)))
        else:
            loss = ((o - T.tensor(b["y"].astype(np.float64), dtype=fdt)) ** 2).mean() + 0.01 * (tp["scale"] ** 2).sum()
        names = list(tp)
        gs = T.autograd.grad(loss, [tp[n] for n in names], allow_unused=True)
        grads = {}
        top = max(float(g.abs().max()) for g in gs if g is not None)
        for n, gr in zip(names, gs):
            if gr is not None and noise:
                # a float32 gradient's error: a few ulps of itself and of its tensor's largest
                # element, and (sums that cancel, such as the centered shift's) of the largest one
                big = float(gr.abs().max()) + 1e-2 * top
                scale = big + gr.abs()
                # an element float32 cannot tell from 0 at the largest gradient's scale is a sum that
                # cancels (the centered shift's: z - mean(z) takes it out exactly; float64 gives
                # 1e-17): in aot and float32 torch alike it is the rounding of the terms it adds,
                # which are as large as the largest gradient: about 2 ulps of `top` (NOISE is 8), of
                # either sign. With RMSprop's eps above it the parameter moves in proportion to it
                # (seed 820030: aot's and torch float32's 1e-8..3e-8, 0.5-2 ulps of top; aot's of
                # one sign four steps running, 6e-4 off after five; 1% of top had modelled 2e-9).
                # The other elements keep their noise.
                scale = T.where(gr.abs() < noise * top, T.full_like(gr, 0.25 * top), scale)
                gr = gr + T.tensor(nrng.normal(size=tuple(gr.shape)), dtype=fdt) * noise * scale
            tp[n].grad = gr
            grads[n] = (gr if gr is not None else T.zeros_like(tp[n])).detach().numpy().astype(np.float64)
        if "clip_grad_norm" in case.okw:
            T.nn.utils.clip_grad_norm_([p for p in tp.values() if p.grad is not None], case.okw["clip_grad_norm"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append((float(loss.detach()), grads, {n: p.detach().numpy().astype(np.float64).copy() for n, p in tp.items()}))
    return out


# Noise of float32 rounding size in every gradient (8 ulps of the tensor's largest element, and of
# the element itself), and how far beyond the spread of such trajectories aot may land.
NOISE, SPREAD = 1e-6, 10.0


def optim_tolerance(case: OptimCase):
    """Per step and element, how far aot's values may be from float64 torch.optim's. aot's gradients
    carry float32 rounding; what the optimizer and the next steps make of it is measured, not
    guessed: float64 trajectories whose gradients get noise of that size (two draws) and the
    float32 torch trajectory spread around the float64 one. Where a gradient is ~0, Adam's m/sqrt(v),
    RMSprop's g/sqrt(avg) and Adagrad's g/sqrt(sum) turn that noise into an update of size lr,
    and the spread says so; elsewhere it stays at rounding level. The tolerance is SPREAD times
    the largest deviation plus a floor of 1e-6 relative (parameters are float32)."""
    T = fg._torch()
    ref = torch_trajectory(case, T.float64)
    others = [torch_trajectory(case, T.float32)] + [torch_trajectory(case, T.float64, NOISE, s) for s in (1, 2)]
    tol = []
    for s, (loss, grads, params) in enumerate(ref):
        dl = max(abs(o[s][0] - loss) for o in others)
        tg = {n: SPREAD * np.max([np.abs(o[s][1][n] - g) for o in others], axis=0) + 1e-5 * (np.abs(g).max() + np.abs(g)) + 1e-7
              for n, g in grads.items()}
        tp = {n: SPREAD * np.max([np.abs(o[s][2][n] - p) for o in others], axis=0) + 1e-6 * (np.abs(p) + np.abs(p).max() * 0.1) + 1e-7
              for n, p in params.items()}
        tol.append((SPREAD * dl + 1e-5 * abs(loss) + 1e-6, tg, tp))
    return ref, tol


def _compile_source(src: str, area: str, seed: int):
    """The Program a generated source file declares, compiled on the seed's kernel set."""
    import aot

    ns: dict = {}
    exec(compile(src, f"<fuzz {area}>", "exec"), ns)
    return aot.compile(ns["program"], kernels=fg.kernel_set(seed))


def check_optim(seed: int, case: OptimCase | None = None) -> tuple[AreaResult, OptimCase]:
    import tempfile

    import aot

    case = case or generate_optim(seed)
    res = AreaResult(programs=1, graphs=1, ops=8, steps=case.steps)
    src = optim_source(case)
    fails = []

    def fail(what, detail):
        extra = f" (set_lr({case.set_lr[1]!r}) after step {case.set_lr[0]})" if case.set_lr else ""
        fails.append(Finding("optim", seed, f"{case.opt}{extra}: {what}", detail, src))

    try:
        model = _compile_source(src, "optim", seed)
    except Exception as e:  # noqa: BLE001
        fail("aot.compile", fg._exc(e))
        res.failures = fails
        return res, case
    ref, tol = optim_tolerance(case)
    others = []
    try:
        losses, params = [], []
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = Path(tmp) / "ckpt.npz"
            for s, b in enumerate(case.batches):
                losses.append(np.float32(model.step(**b)))
                got_g, got_p = model.grads(), model.params()
                params.append(got_p)
                want_loss, want_g, want_p = ref[s]
                tl, tg, tp = tol[s]
                if not abs(float(losses[-1]) - want_loss) <= tl:
                    fail(f"step {s + 1}: loss", f"got {float(losses[-1])!r}, expected {want_loss!r} (tolerance {tl:.3g})")
                for n in want_g:
                    for kind, got, want, t in (("gradient of", got_g[n], want_g[n], tg[n]), ("parameter", got_p[n], want_p[n], tp[n])):
                        bad = ~(np.abs(got.astype(np.float64) - want) <= t)
                        if bad.any():
                            i = tuple(int(v) for v in np.argwhere(bad)[0])
                            fail(f"step {s + 1}: {kind} {n}{' after the update' if kind == 'parameter' else ''}",
                                 f"{int(bad.sum())}/{bad.size} off; at {i}: got {float(got[i])!r}, expected {float(want[i])!r} "
                                 f"(tolerance {float(t[i]):.3g})")
                if case.set_lr and s + 1 == case.set_lr[0]:
                    model.set_lr(case.set_lr[1])
                if s + 1 == case.save_at:
                    model.save(ckpt)
            # step_many of the same batches: bit for bit the losses and parameters of the step() calls
            b = type(model)(kernels=fg.kernel_set(seed))
            others.append(b)
            j = case.set_lr[0] if case.set_lr else case.steps
            many = list(b.step_many([dict(x) for x in case.batches[:j]]))
            if case.set_lr:
                b.set_lr(case.set_lr[1])
                many += list(b.step_many([dict(x) for x in case.batches[j:]]))
            if not np.array_equal(np.asarray(many, np.float32), np.array(losses, np.float32)):
                fail("step_many", f"losses {list(map(float, many))} != step()'s {list(map(float, losses))}")
            _bit_params(b.params(), params[-1], "step_many after all steps", fail)
            if b.step_count != case.steps:
                fail("step_many", f"step_count {b.step_count}, expected {case.steps}")
            # a fresh Model restored from the checkpoint continues as the saved one did (step_many)
            c = type(model)(kernels=fg.kernel_set(seed))
            others.append(c)
            c.restore(ckpt)
            _bit_params(c.params(), params[case.save_at - 1], f"restore after step {case.save_at}", fail)
            if case.set_lr and case.set_lr[0] > case.save_at:  # the checkpoint has the old lr
                j = case.set_lr[0]
                rest = list(c.step_many([dict(x) for x in case.batches[case.save_at:j]]))
                c.set_lr(case.set_lr[1])
                rest += list(c.step_many([dict(x) for x in case.batches[j:]]))
            else:
                rest = c.step_many([dict(x) for x in case.batches[case.save_at:]])
            if not np.array_equal(np.asarray(rest, np.float32), np.array(losses[case.save_at:], np.float32)):
                fail(f"restore after step {case.save_at}, then step_many", f"losses {list(map(float, rest))} != {list(map(float, losses[case.save_at:]))}")
            _bit_params(c.params(), params[-1], f"restore after step {case.save_at}, then step_many", fail)
            res.steps += case.steps + (case.steps - case.save_at)
    except Exception as e:  # noqa: BLE001
        fail("run", fg._exc(e))
    finally:
        for m in [model] + others:
            m.close()
        fg._cleanup(model)
    res.failures = fails
    return res, case


def _bit_params(got: dict, want: dict, what: str, fail) -> None:
    for n, v in want.items():
        if not np.array_equal(got[n], v, equal_nan=True):  # a NaN parameter (after an overflow) equals itself
            fail(what, f"parameter {n} not bit-identical: max difference {float(np.max(np.abs(got[n] - v))):.3g}")


# ---- area "dims": symbolic dims in infer (and training) entries ------------------------------------


@dataclass
class DimsCase:
    """A chain of row-wise ops over x [B, D] or [B, T, D] with B (and T) symbolic; lines are
    (aot source, torch function of (env, T)) that assign the next value."""

    seed: int
    rank: int
    D: int
    sizes: dict  # symbol -> sizes
    params: dict  # name -> array
    lines: list  # [(target, aot expression, torch lambda)]
    out: str
    extra: bool  # a second input x2 of the same symbolic dims
    train: bool  # also a training entry over the same symbolic inputs (loss: sum(out * ct))


def generate_dims(seed: int) -> DimsCase:
    rng = np.random.default_rng([34, seed])
    rank = int(rng.choice([2, 3]))
    D = int(rng.choice([2, 4, 6, 8]))
    sizes = {"B": tuple(sorted({int(v) for v in rng.integers(1, 9, int(rng.integers(2, 4)))} | {1}))}
    if rank == 3:
        sizes["T"] = tuple(sorted({int(v) for v in rng.integers(1, 7, 2)}))
    params: dict = {}
    lines: list = []
    cur, width, n = "x", D, 0

    def new(expr, fn, w=None):
        nonlocal cur, n, width
        n += 1
        lines.append((f"h{n}", expr, fn))
        cur = f"h{n}"
        if w is not None:
            width = w

    extra = bool(rng.random() < 0.3)
    if extra:
        new(f"ops.concat([{cur}, x2], axis=-1)", (lambda c: lambda e, T: T.cat([e[c], e["x2"]], -1))(cur), width + 2)
    for _ in range(int(rng.integers(2, 7))):
        c = cur
        k = str(rng.choice(["linear", "act", "act", "norm", "softmax", "center_rows", "center_batch", "attention", "cumsum",
                            "causal", "rope", "reshape", "max"]))
        if k == "linear":
            w2 = int(rng.choice([2, 4, 6]))
            pw, pb = f"W{n}", f"b{n}"
            params[pw] = np.asarray(rng.uniform(-1, 1, (width, w2)) / math.sqrt(width), np.float32)
            params[pb] = np.asarray(rng.uniform(-0.3, 0.3, (w2,)), np.float32)
            new(f"{c} @ m.{pw} + m.{pb}", lambda e, T, c=c, pw=pw, pb=pb: e[c] @ e[pw] + e[pb], w2)
        elif k == "act":
            a = str(rng.choice(list(ACTS)))
            new(ACTS[a][0].format(c), lambda e, T, c=c, a=a: ACTS[a][1](T, e[c]))
        elif k == "norm":  # layer norm written out, with a gain
            pg = f"g{n}"
            params[pg] = np.asarray(rng.uniform(0.5, 1.5, (width,)), np.float32)
            new(f"({c} - ops.mean({c}, axis=-1, keepdims=True)) * ops.rsqrt(ops.var({c}, axis=-1, keepdims=True, correction=0) + 1e-3) * m.{pg}",
                lambda e, T, c=c, pg=pg: (e[c] - e[c].mean(-1, keepdim=True)) * T.rsqrt(e[c].var(-1, keepdim=True, correction=0) + 1e-3) * e[pg])
        elif k == "softmax":
            new(f"ops.softmax({c}, axis=-1)", lambda e, T, c=c: e[c].softmax(-1))
        elif k == "center_rows":
            new(f"{c} - ops.max({c}, axis=-1, keepdims=True)", lambda e, T, c=c: e[c] - e[c].amax(-1, keepdim=True))
        elif k == "center_batch":  # a reduction over the symbolic axis
            new(f"{c} - ops.mean({c}, axis=0, keepdims=True) + ops.sum({c}, axis=0) * 0.25",
                lambda e, T, c=c: e[c] - e[c].mean(0, keepdim=True) + e[c].sum(0) * 0.25)
        elif k == "attention" and rank == 3:
            causal = bool(rng.random() < 0.5)
            new(f"ops.attention({c}, {c}, {c}, causal={causal})",
                lambda e, T, c=c, causal=causal: T.nn.functional.scaled_dot_product_attention(e[c], e[c], e[c], is_causal=causal))
        elif k == "cumsum":
            ax = int(rng.integers(0, rank))
            new(f"ops.cumsum({c}, axis={ax})", lambda e, T, c=c, ax=ax: e[c].cumsum(ax))
        elif k == "causal" and rank == 3:
            new(f"ops.softmax_causal({c} @ ops.swapaxes({c}, -1, -2) * 0.5) @ {c}",
                lambda e, T, c=c: _causal_t(T, e[c] @ e[c].transpose(-1, -2) * 0.5) @ e[c])
        elif k == "rope" and rank == 3 and width % 2 == 0:
            new(f"ops.rope({c})", lambda e, T, c=c: fg._rope([e[c]], {}, e[c].dtype))
        elif k == "reshape" and rank == 3:
            new(f"ops.reshape(ops.reshape({c}, (-1, {width})) * 1.5, {c}.shape)", lambda e, T, c=c: e[c] * 1.5)
        elif k == "max":
            new(f"ops.max({c}, axis=-1, keepdims=True) + {c} * 0.5", lambda e, T, c=c: e[c].amax(-1, keepdim=True) + e[c] * 0.5)
    if n == 0 or (extra and n == 1):
        new(f"ops.tanh({cur})", lambda e, T, c=cur: e[c].tanh())
    return DimsCase(seed, rank, D, sizes, params, lines, cur, extra, bool(rng.random() < 0.5))


def _causal_t(T, s):
    t = s.shape[-1]
    return s.masked_fill(T.ones(t, t, dtype=T.bool).triu(1), float("-inf")).softmax(-1)


def _dims_shapes(case: DimsCase, B: int, T_: int | None):
    lead = (B,) if case.rank == 2 else (B, T_)
    return lead + (case.D,), lead + (2,)


def dims_source(case: DimsCase, name: str = "fuzz_dims") -> str:
    lead = '"B"' if case.rank == 2 else '"B", "T"'
    L = ["import numpy as np", "", "import aot", "from aot import ops", "", "P = {"]
    L += [f"    {n!r}: {fg.array_source(v, '    ')}," for n, v in case.params.items()]
    L += ["}", "", "", "class Net(aot.Module):", "    def __init__(self):", "        super().__init__()"]
    L += [f"        self.{n} = self.param(P[{n!r}].shape, init=aot.init.literal(P[{n!r}]))" for n in case.params] or ["        pass"]
    sig = "m, x, x2" if case.extra else "m, x"
    L += ["", "", f"def forward({sig}):"] + [f"    {t} = {e}" for t, e, _ in case.lines] + [f"    return {case.out}"]
    ins = f"{{'x': aot.f32({lead}, {case.D})" + (f", 'x2': aot.f32({lead}, 2)" if case.extra else "") + "}"
    entry = f"    infer={{'predict': aot.Infer(forward, inputs={ins})}},"
    train = ""
    if case.train:
        L += ["", "", f"def loss({sig}, ct):", f"    return ops.sum(forward({sig.replace('m, ', 'm, ')}) * ct)"]
        tins = ins[:-1] + f", 'ct': aot.f32({lead}, OUT_W)}}"
        train = f"    train=aot.Train(loss, inputs={tins}, optimizer=None),"
    L += ["", "", "program = aot.Program(", f"    {name!r},", "    model=Net,"] + ([train] if train else []) + [entry,
          f"    dims={case.sizes!r},", "    seed=0,", ")", ""]
    return "\n".join(L)


def _dims_torch(case: DimsCase, feeds: dict, fdt, ct=None):
    T = fg._torch()
    env = {n: T.tensor(v.astype(np.float64), dtype=fdt, requires_grad=True) for n, v in case.params.items()}
    env.update({n: T.tensor(v.astype(np.float64), dtype=fdt) for n, v in feeds.items()})
    for t, _e, fn in case.lines:
        env[t] = fn(env, T)
    out = env[case.out]
    grads = {}
    if ct is not None and case.params:
        gs = T.autograd.grad((out * T.tensor(ct.astype(np.float64), dtype=fdt)).sum(), [env[n] for n in case.params], allow_unused=True)
        grads = {n: (g if g is not None else T.zeros_like(env[n])).detach().numpy().astype(np.float64) for n, g in zip(case.params, gs)}
    return out.detach().numpy().astype(np.float64), grads


def check_dims(seed: int, case: DimsCase | None = None) -> tuple[AreaResult, DimsCase]:
    import aot

    T = fg._torch()
    case = case or generate_dims(seed)
    rng = np.random.default_rng([35, seed])
    # the output's last dim (a linear layer may change it): from one torch run
    B0, T0 = case.sizes["B"][0], case.sizes.get("T", (None,))[0]
    xs, x2s = _dims_shapes(case, B0, T0)
    probe = {"x": np.zeros(xs, np.float32)} | ({"x2": np.zeros(x2s, np.float32)} if case.extra else {})
    out_w = _dims_torch(case, probe, T.float64)[0].shape[-1]
    src = dims_source(case).replace("OUT_W", str(out_w))
    res = AreaResult(programs=1, graphs=1, ops=len(case.lines))
    fails = []

    def fail(what, detail):
        fails.append(Finding("dims", seed, what, detail, src))

    try:
        model = _compile_source(src, "dims", seed)
    except Exception as e:  # noqa: BLE001
        fail("aot.compile", fg._exc(e))
        res.failures = fails
        return res, case
    try:
        combos = [(b, t) for b in case.sizes["B"] for t in case.sizes.get("T", (None,))]
        for b, t in [combos[i] for i in rng.permutation(len(combos))]:
            xs, x2s = _dims_shapes(case, b, t)
            feeds = {"x": np.asarray(rng.uniform(-2, 2, xs), np.float32)}
            if case.extra:
                feeds["x2"] = np.asarray(rng.uniform(-2, 2, x2s), np.float32)
            what = f"B={b}" + (f", T={t}" if t is not None else "")
            ct = np.asarray(rng.normal(size=xs[:-1] + (out_w,)), np.float32)
            w64, g64 = _dims_torch(case, feeds, T.float64, ct)
            w32, g32 = _dims_torch(case, feeds, T.float32, ct)
            got = np.asarray(model.predict(**feeds))
            msg = fg.compare(got, w64, float(np.max(np.abs(w32 - w64))) if w64.size else 0.0)
            if msg:
                fail(f"predict at {what}", msg)
            res.steps += 1
            if case.train:
                loss = model.step(**feeds, ct=ct)
                want = float(np.sum(w64 * ct))
                if not abs(loss - want) <= 1e-4 * float(np.sum(np.abs(w64 * ct))) + 1e-4:
                    fail(f"step at {what}: loss", f"got {loss!r}, expected {want!r}")
                grads = model.grads()
                for n in g64:
                    msg = fg.compare(grads[n], g64[n], float(np.max(np.abs(g32[n] - g64[n]))))
                    if msg:
                        fail(f"step at {what}: gradient of {n}", msg)
                res.steps += 1
    except Exception as e:  # noqa: BLE001
        fail("run", fg._exc(e))
    finally:
        model.close()
        fg._cleanup(model)
    res.failures = fails
    return res, case


# ---- area "noinput": no inputs (parameters or ops.randn only), no parameters ------------------------

CHAIN = {  # (aot template, torch function): elementwise steps of a random function
    "tanh": ("ops.tanh({})", lambda T, h: h.tanh()), "sigmoid": ("ops.sigmoid({})", lambda T, h: h.sigmoid()),
    "square": ("ops.square({})", lambda T, h: h * h), "sin": ("ops.sin({})", lambda T, h: h.sin()),
    "softmax": ("ops.softmax({})", lambda T, h: h.softmax(-1)), "gelu": ("ops.gelu({})", lambda T, h: T.nn.functional.gelu(h)),
    "scale": ("{} * 1.5 - 0.25", lambda T, h: h * 1.5 - 0.25), "cumsum": ("ops.cumsum({}, axis=-1)", lambda T, h: h.cumsum(-1)),
}


@dataclass
class NoInputCase:
    seed: int
    kind: str  # "params" (loss of parameters only), "randn" (of parameters and ops.randn noise), "noparams"
    shape: tuple
    chain: list  # CHAIN keys
    params: dict
    lr: float
    momentum: float
    steps: int

    def f_src(self, v: str) -> str:
        for k in self.chain:
            v = CHAIN[k][0].format(v if v.isidentifier() or v.startswith("ops.") and v.endswith(")") else f"({v})")
        return v

    def f_torch(self, T, h):
        for k in self.chain:
            h = CHAIN[k][1](T, h)
        return h


def generate_noinput(seed: int) -> NoInputCase:
    rng = np.random.default_rng([36, seed])
    kind = str(rng.choice(["params", "randn", "noparams"]))
    shape = tuple(int(v) for v in rng.integers(1, 6, int(rng.integers(1, 3))))
    chain = [str(k) for k in rng.choice(list(CHAIN), int(rng.integers(1, 4)))]
    params = {} if kind == "noparams" else {
        "w": np.asarray(rng.uniform(-1, 1, shape), np.float32), "c": np.asarray(rng.uniform(0.5, 1.5, shape[-1:]), np.float32)}
    return NoInputCase(seed, kind, shape, chain, params, float(rng.choice([0.01, 0.1])), float(rng.choice([0.0, 0.9])),
                       int(rng.integers(2, 5)))


def noinput_source(case: NoInputCase, name: str = "fuzz_noinput") -> str:
    L = ["import numpy as np", "", "import aot", "from aot import ops", "", "P = {"]
    L += [f"    {n!r}: {fg.array_source(v, '    ')}," for n, v in case.params.items()]
    L += ["}", "", "", "class Net(aot.Module):", "    def __init__(self):", "        super().__init__()"]
    L += [f"        self.{n} = self.param(P[{n!r}].shape, init=aot.init.literal(P[{n!r}]))" for n in case.params] or ["        pass"]
    opt = f"aot.optim.SGD(lr={case.lr!r}" + (f", momentum={case.momentum!r})" if case.momentum else ")")
    if case.kind == "params":
        L += ["", "", "def loss(m):", f"    return ops.sum(({case.f_src('m.w')} - 0.5) * m.c)"]
        train, infer = f"aot.Train(loss, inputs={{}}, optimizer={opt})", "{'value': aot.Infer(lambda m: " + case.f_src("m.w") + ", inputs={})}"
    elif case.kind == "randn":
        L += ["", "", "def loss(m):", f"    z = aot.capture('z', ops.randn({case.shape!r}))",
              f"    return ops.sum(({case.f_src('m.w + z')} - 0.5) * m.c)"]
        train, infer = f"aot.Train(loss, inputs={{}}, optimizer={opt})", "{}"
    else:
        spec = f"aot.f32({', '.join(map(str, case.shape))})"
        L += ["", "", "def loss(m, x, ct):", f"    return ops.sum(({case.f_src('x')}) * ct)",
              "", "", "def value(m, x):", f"    return {case.f_src('x')}"]
        train = f"aot.Train(loss, inputs={{'x': {spec}, 'ct': {spec}}}, optimizer={opt})"
        infer = f"{{'value': aot.Infer(value, inputs={{'x': {spec}}})}}"
    L += ["", "", "program = aot.Program(", f"    {name!r},", "    model=Net,", f"    train={train},", f"    infer={infer},",
          "    seed=5,", ")", ""]
    return "\n".join(L)


def _noinput_torch(case: NoInputCase, params: dict, feeds: dict, fdt):
    """Loss, gradients and the infer value at these parameters (float64 or float32)."""
    T = fg._torch()
    tp = {n: T.tensor(v.astype(np.float64), dtype=fdt, requires_grad=True) for n, v in params.items()}
    tf = {n: T.tensor(np.asarray(v, np.float64), dtype=fdt) for n, v in feeds.items()}
    if case.kind == "noparams":
        val = case.f_torch(T, tf["x"])
        loss = (val * tf["ct"]).sum()
        return float(loss), {}, val.detach().numpy().astype(np.float64)
    base = tp["w"] + tf["z"] if case.kind == "randn" else tp["w"]
    val = case.f_torch(T, base)
    loss = ((val - 0.5) * tp["c"]).sum()
    gs = T.autograd.grad(loss, list(tp.values()))
    return float(loss), {n: g.numpy().astype(np.float64) for n, g in zip(tp, gs)}, val.detach().numpy().astype(np.float64)


F32_MAX = float(np.finfo(np.float32).max)


def spread32(w32, w64) -> float:
    """Float32 PyTorch's largest error against float64 over the elements float32 can hold (a
    value beyond its range is judged by compare_range, not by a tolerance)."""
    w32, w64 = np.asarray(w32, np.float64), np.asarray(w64, np.float64)
    keep = (np.abs(w64) <= F32_MAX) & np.isfinite(w32)
    return float(np.max(np.abs(w32[keep] - w64[keep]))) if keep.any() else 0.0


def compare_range(got, w64, w32, err32: float) -> str | None:
    """fuzz_graphs.compare of `got` with the float64 value `w64`, except where w64 is beyond
    float32's range: there float32 overflows, and `got` must be +-inf of w64's sign, or NaN where
    float32 PyTorch (`w32`) is NaN too (an overflowed intermediate times a zero derivative, or
    inf - inf: gelu's gradient at inf). A noinput trajectory grows without bound where the loss
    has no minimum (a randn loss, squared twice: seed 5310492 reaches -4e64 at step 4)."""
    got, w64, w32 = np.asarray(got), np.asarray(w64, np.float64), np.asarray(w32, np.float64)
    if got.shape != w64.shape or got.dtype.kind != "f":
        return fg.compare(got, w64, err32)
    over = np.abs(w64) > F32_MAX
    g = got.astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = over & ~((np.isinf(g) & (np.sign(g) == np.sign(w64))) | (np.isnan(g) & np.isnan(w32)))
    if bad.any():
        i = tuple(int(x) for x in np.argwhere(bad)[0])
        return (f"{int(bad.sum())}/{w64.size} elements beyond float32's range are neither +-inf of their sign nor NaN "
                f"where float32 PyTorch is NaN; at {i}: got {g[i]:.7g}, expected {w64[i]:.7g} (float32 PyTorch: {w32[i]:.7g})")
    if not over.any():
        return fg.compare(got, w64, err32)
    return fg.compare(np.where(over, 0, got).astype(got.dtype), np.where(over, 0.0, w64), err32)


def check_noinput(seed: int, case: NoInputCase | None = None) -> tuple[AreaResult, NoInputCase]:
    import aot

    T = fg._torch()
    case = case or generate_noinput(seed)
    rng = np.random.default_rng([37, seed])
    src = noinput_source(case)
    res = AreaResult(programs=1, graphs=1, ops=len(case.chain) + 2)
    fails = []

    def fail(what, detail):
        fails.append(Finding("noinput", seed, f"{case.kind}: {what}", detail, src))

    try:
        model = _compile_source(src, "noinput", seed)
    except Exception as e:  # noqa: BLE001
        fail("aot.compile", fg._exc(e))
        res.failures = fails
        return res, case
    others = []
    try:
        batches = [{"x": np.asarray(rng.uniform(-1.5, 1.5, case.shape), np.float32),
                    "ct": np.asarray(rng.normal(size=case.shape), np.float32)} if case.kind == "noparams" else {}
                   for _ in range(case.steps)]
        losses, mom, mom32, overflowed = [], {}, {}, False
        for s, b in enumerate(batches):
            before = model.params()
            r = model.step(**b, captures=True)
            losses.append(np.float32(r.loss))
            if overflowed:  # the parameters are +-inf or NaN now: nothing left to compare but step_many
                res.steps += 1
                continue
            feeds = dict(b)
            if case.kind == "randn":
                feeds["z"] = r.captures["z"]
            l64, g64, v64 = _noinput_torch(case, before, feeds, T.float64)
            l32, g32, v32 = _noinput_torch(case, before, feeds, T.float32)
            overflowed = abs(l64) > F32_MAX or any(np.any(np.abs(v) > F32_MAX) for v in g64.values())
            if abs(l64) > F32_MAX:
                msg = compare_range(np.float32(r.loss), l64, l32, 0.0)
                if msg:
                    fail(f"step {s + 1}: loss", f"got {float(r.loss)!r}, expected {l64!r} ({msg})")
            elif not abs(float(r.loss) - l64) <= 1e-4 * (float(np.sum(np.abs(v64))) + 1.0) + 4 * abs(l32 - l64):
                fail(f"step {s + 1}: loss", f"got {float(r.loss)!r}, expected {l64!r}")
            grads, after = model.grads(), model.params()
            if set(grads) != set(g64):
                fail(f"step {s + 1}: grads()", f"names {sorted(grads)}, expected {sorted(g64)}")
            for n in g64:
                err = spread32(g32[n], g64[n])
                msg = compare_range(grads.get(n, np.zeros(0)), g64[n], g32[n], err)
                if msg:
                    fail(f"step {s + 1}: gradient of {n}", msg)
                d = g64[n] if not case.momentum else (g64[n] if s == 0 else case.momentum * mom[n] + g64[n])
                d32 = g32[n] if not case.momentum else (g32[n] if s == 0 else case.momentum * mom32[n] + g32[n])
                mom[n], mom32[n] = d, d32
                want = before[n].astype(np.float64) - case.lr * d
                with np.errstate(invalid="ignore", over="ignore"):
                    want32 = before[n].astype(np.float64) - case.lr * d32
                    # a momentum buffer beyond float32's range is +-inf in float32 (torch's too),
                    # and the parameter then -+inf, though lr times it would fit (hour run 22's
                    # noinput seed 5910856: 1.6e38 in float64, inf in aot)
                    want = np.where(np.abs(d32) > F32_MAX, -np.sign(d32) * np.inf, want)
                scale = float(np.max(np.abs(np.where(np.abs(want) <= F32_MAX, want, 0.0))))
                msg = compare_range(after[n], want, want32, 4 * case.lr * err + 1e-6 * scale)
                if msg:
                    fail(f"step {s + 1}: parameter {n} after the update", msg)
            if case.kind != "randn" and all(np.all(np.isfinite(v)) for v in after.values()):
                got = np.asarray(model.value(**({"x": b["x"]} if case.kind == "noparams" else {})))
                w64 = v64 if case.kind == "noparams" else _noinput_torch(case, after, feeds, T.float64)[2]
                w32 = v32 if case.kind == "noparams" else _noinput_torch(case, after, feeds, T.float32)[2]
                msg = compare_range(got, w64, w32, spread32(w32, w64))
                if msg:
                    fail(f"step {s + 1}: infer entry", msg)
            res.steps += 1
        if model.step_count != case.steps:
            fail("step_count", f"{model.step_count} after {case.steps} step() calls")
        # step_many: K steps, bit-identical to the K step() calls (issue 32 item 3: none were taken)
        b2 = type(model)(kernels=fg.kernel_set(seed))
        others.append(b2)
        many = b2.step_many([dict(x) for x in batches])
        if b2.step_count != case.steps or not np.array_equal(np.asarray(many, np.float32), np.array(losses, np.float32)):
            fail("step_many", f"{b2.step_count} steps, losses {list(map(float, many))}, expected {list(map(float, losses))}")
        _bit_params(b2.params(), model.params(), "step_many", fail)
        res.steps += case.steps
    except Exception as e:  # noqa: BLE001
        fail("run", fg._exc(e))
    finally:
        for m in [model] + others:
            m.close()
        fg._cleanup(model)
    res.failures = fails
    return res, case


def check(area: str, seed: int, sides: tuple | None = None):
    """(AreaResult, the case) of one seed of one area; `sides`: the package sides of "special"
    (fuzz_graphs.check's; the other areas run aot.compile on this adapter)."""
    if area == "special":
        return check_special(seed, sides=sides)
    return {"optim": check_optim, "dims": check_dims, "noinput": check_noinput}[area](seed)


# ---- reproducers of "special" failures ---------------------------------------------------------------

SPECIAL_REPRO = '''

def _side(kind):
    """Per step: (captures, gradients) of the package (kind "gpu"; "wasm": the web target's wasm
    kernel set in node, tests/web_node.py) or of the interpreter."""
    if kind == "wasm":
        import sys
        import tempfile
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from web_node import node_or_skip, run_steps

        node_or_skip()
        with tempfile.TemporaryDirectory() as tmp:
            module = aot.build(program, tmp, target="web", force=True) / f"{{program.name}}.js"
            got = run_steps(module, [dict(INPUTS[s], **COTANGENTS[s]) for s in range(len(EXPECTED))], kernels=KERNELS, relaxed=RELAXED)
        assert "error" not in got, f"{{got.get('at')}}: {{got['error']}}"
        return [(s["captures"], s["grads"]) for s in got["steps"]]
    if kind == "interp":
        from aot import interp
        from aot.frontend import trace_program

        g = trace_program(program).graphs["train"]
        out = []
        for step in range(len(EXPECTED)):
            leaves = dict(INPUTS[step], **COTANGENTS[step], **P, _rng=np.int32(0))
            env = interp.run(g, leaves, np.float32)
            out.append(({{n: env[id(t)] for n, t in g.captures.items()}}, {{n: env[id(t)] for n, t in g.grads.items()}}))
        return out
    model = aot.compile(program, kernels=KERNELS)
    try:
        out = []
        for step in range(len(EXPECTED)):
            res = model.step(**INPUTS[step], **COTANGENTS[step], captures=True)
            out.append((dict(res.captures), model.grads()))
        return out
    finally:
        model.close()


@pytest.mark.gpu
@pytest.mark.xfail(strict={strict}, reason={reason!r})
def test_{name}():
    for step, ((caps, grads), want) in enumerate(zip(_side({kind!r}), EXPECTED)):
        for what, got, refs, extra in [(f"output {{n}}", caps[n], r, 0.0) for n, r in want["outputs"].items()] + [
                (f"gradient of {{n}}", grads[n], r, want["extra"]) for n, r in want["grads"].items()]:
            ok = pattern_ok(got, refs, extra=extra)
            assert ok.all(), f"step {{step + 1}}: {{what}}: at {{np.argwhere(~ok)[0]}}: got {{np.asarray(got)[~ok][0]!r}}, " \\
                f"expected {{np.float32(refs[0][0][~ok][0])!r}} (torch float32 {{refs[0][1][~ok][0]!r}})"
'''


def special_repro_source(batch: fg.Batch, kind: str, what: str, detail: str, name: str, note: str = "") -> str:
    import inspect

    expected = []
    for s in range(batch.steps):
        c = batch.cases[0]
        refs = _special_refs(c, s)
        want = {"outputs": {o: [(r64[0][o], r32[0][o]) for r64, r32 in refs] for o in c.outputs},
                "grads": {n: [(r64[1][n], r32[1][n]) for r64, r32 in refs] for n in refs[0][0][1]},
                "extra": _ct_bound(c, s)}
        expected.append(want)
    doc = [f'"""Fuzz reproducer (special values, {kind}): {what}.', ""]
    doc += [f"    {line}" if i else line for i, line in enumerate(fg._wrap(detail, 96))]
    doc += ["", "Expected: PyTorch float64 (rounded to float32) and float32 of the same graph, each for the",
            "inputs as given and with subnormals flushed; the NaN/inf pattern must match where the two",
            "precisions agree (tests/fuzz_areas.py, pattern_ok)."]
    if note:
        doc += [""] + fg._wrap(note, 96)
    doc += ['"""', ""]
    src = fg.batch_source(batch, name, inline=True).replace(
        "import numpy as np\n", "from math import inf, nan  # noqa: F401  (literals below)\n\nimport numpy as np\nimport pytest\n", 1)

    def refs_src(rs, indent):
        return "[" + ", ".join(f"({fg.array_source(np.asarray(a, np.float64), indent)}, {fg.array_source(np.asarray(b, np.float32), indent)})"
                               for a, b in rs) + "]"

    L = ["\n".join(doc), src, ""]
    L.append("INPUTS = [" + ", ".join(fg._dict_source(fg.feeds(batch, s, with_cts=False), "    ") for s in range(batch.steps)) + "]")
    cts = [{k: v for k, v in fg.feeds(batch, s).items() if k.endswith("_ct")} for s in range(batch.steps)]
    L.append("COTANGENTS = [" + ", ".join(fg._dict_source(c, "    ") for c in cts) + "]")
    L.append("EXPECTED = [")
    for want in expected:
        L.append("    {")
        for part in ("outputs", "grads"):
            L.append(f"        {part!r}: {{")
            for n, rs in want[part].items():
                L.append(f"            {n!r}: {refs_src(rs, '            ')},")
            L.append("        },")
        L.append(f"        'extra': {want['extra']!r},")
        L.append("    },")
    L.append("]")
    L.append(f"KERNELS = {'wasm' if kind == 'wasm' else fg.kernel_set(batch.seed)!r}")
    L.append(f"RELAXED = {fg.wasm_relaxed(batch.seed)!r}  # the wasm side's relaxed-SIMD module (run_wasm)")
    L.append(f"TINY = {TINY!r}")
    L.append(f"REL = {REL!r}")
    L.append(f"SPREAD_SPECIAL = {SPREAD_SPECIAL!r}")
    for f in (classes, ulp32, pattern_ok):
        L += ["", "", inspect.getsource(f).rstrip()]
    reason = f"fuzz special: {what}: {detail}"[:160]
    return "\n".join(L) + "\n" + SPECIAL_REPRO.format(name=name, kind="interp" if kind.startswith("interp") else "wasm" if kind.startswith("wasm") else "gpu",
                                                     reason=reason, strict=True)


def shrink_special(batch: fg.Batch, kind: str, case: int, what: str) -> fg.Batch:
    """The failing case alone, at one step when the failure shows at step 1."""
    one = replace(batch, cases=[batch.cases[case]])
    if what.startswith("step 1:"):
        one = replace(one, cases=[fg.with_steps(one.cases[0], 1)], steps=1)
    return one


def write_special_repro(batch: fg.Batch, finding: Finding, kind: str, case: int, out_dir, note: str = "") -> Path | None:
    import zlib

    small = shrink_special(batch, kind, case, finding.what.split(": ", 1)[-1].split("case %d: " % case, 1)[-1])
    # does the failure survive alone?
    sides = (fg.SIDE_OF[kind],) if kind in fg.SIDE_OF else ()
    res, _ = check_special(batch.seed, small, sides)
    if not res.failures:
        small = replace(batch, cases=[batch.cases[case]])
        res, _ = check_special(batch.seed, small, sides)
        if not res.failures:
            return None
    f = res.failures[0]
    k = "interp" if "[interp" in f.what else "wasm" if "[wasm" in f.what else "gpu"
    tag = f"{zlib.crc32(fg.batch_source(small, 'x', inline=True).encode()):08x}"
    name = f"fuzz_special_{k}_{tag}"
    path = Path(out_dir) / f"test_{name}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    what = f.what.split("] ", 1)[-1]
    path.write_text(special_repro_source(small, k, what, f.detail, name, note))
    return path


SEED_TEST = '''"""Fuzz regression test ({area}): seed {seed} of tests/fuzz_areas.py's "{area}" area.

{summary}

The program (fuzz_areas.{area}_source of generate_{area}({seed})) and the oracle are the fuzzer's;
`python scripts/fuzz.py --areas {area} --seed {seed} --minutes 0` runs it again.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fuzz_areas  # noqa: E402


@pytest.mark.gpu
@pytest.mark.xfail(strict=True, reason={reason!r})
def test_fuzz_{area}_{seed}():
    res, _case = fuzz_areas.check({area!r}, {seed})
    assert not res.failures, "\\n".join(map(str, res.failures))
'''


def seed_test_source(area: str, seed: int, failures: list) -> str:
    summary = "\n".join(fg._wrap("; ".join(str(f) for f in failures[:3]), 96))
    return SEED_TEST.format(area=area, seed=seed, summary=summary, reason=str(failures[0])[:160])
