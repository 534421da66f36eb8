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
# formula would with an y that much off. x ** p (exp2(p log2 x)) is ~50 ulps off at x = 1e20.
REL = 1e-4


def pattern_ok(got, refs, ulps: float = 8.0, extra: float = 0.0, rel: float = REL) -> np.ndarray:
    """Elementwise: got agrees with at least one reference (want64, want32): the class of
    float32(want64) and of want32 where they agree (either where they do not), and for finite
    values |got - want| <= max(ulps ulp, rel |want|) + 4 |want32 - want64| + 4 * 2^-126 + extra."""
    got = np.asarray(got, dtype=np.float64)
    cg = classes(got)
    ok = np.zeros(got.shape, bool)
    for w64, w32 in refs:
        w64 = np.asarray(w64, dtype=np.float64)
        w32 = np.asarray(w32, dtype=np.float64)
        r64 = w64.astype(np.float32).astype(np.float64)  # the correctly rounded float32 result
        c64, c32 = classes(r64), classes(w32)
        agree = c64 == c32
        cls_ok = np.where(agree, cg == c64, (cg == c64) | (cg == c32))
        with np.errstate(invalid="ignore", over="ignore"):
            spread = np.where((c32 == 0) & (c64 == 0) & np.isfinite(w64), np.abs(w32 - w64), 0.0)
            tol = np.maximum(ulps * ulp32(r64), rel * np.abs(r64)) + 4 * spread + 4 * TINY + extra
            near64 = (cg == 0) & (c64 == 0) & (np.abs(got - w64) <= tol)
            near32 = (cg == 0) & (c32 == 0) & ~agree & (np.abs(got - w32) <= np.maximum(ulps * ulp32(w32), rel * np.abs(w32)) + 4 * TINY + extra)
        val_ok = np.where(cg == 0, near64 | near32, True)
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
        kind = "param" if dtype == "f32" else "input"
        nm = self.name("p" if kind == "param" else "i")
        if values is None:
            if dtype == "f32":
                values = [_special_values(self.rng, shape)]
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
            return self.emit("power", (x, p), {"infix": True} if self.rng.random() < 0.5 else {}, shape)
        b = BASES[int(self.rng.integers(len(BASES)))]
        return self.emit("power", (b, x), {}, shape)

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
            args = (x, y) if self.rng.random() < 0.5 else (y, x)
        return self.emit(op, args, {"infix": True} if op in fg.INFIX and self.rng.random() < 0.4 else {}, shape)

    def where(self, x):
        shape = self.shapes[x]
        y = self.operand(shape)
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
        for _ in range(int(self.rng.choice([1, 1, 1, 2, 2, 3]))):
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
    return fg.Batch(cases, capture=True, infer=False, steps=steps, seed=seed)


def _flush(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind != "f":
        return a
    sub = (a != 0) & (np.abs(a) < TINY)
    return np.where(sub, np.copysign(np.float32(0), a), a).astype(a.dtype)


def torch_case(case: fg.Case, step: int, fdt, flush: bool = False):
    """Outputs, gradients and loss of a case at one step in PyTorch (no domain checks)."""
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
        env.update(zip(op.outs, fg.eval_op(op, env, fdt)[1]))
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


def special_failures(batch: fg.Batch, side, kind: str) -> list[tuple[int, str, str]]:
    """(case, what, detail) per disagreement of a side (fuzz_graphs.Sides) with PyTorch."""
    out = []
    for s in range(batch.steps):
        for k, c in enumerate(batch.cases):
            p = batch.prefix(k)
            refs = _special_refs(c, s)
            leaves = {n: l.value(s) for n, l in c.leaves.items()}
            for o in c.outputs:
                got = side.captures[s].get(p + o)
                if got is None:
                    out.append((k, f"step {s + 1}: output {p + o}", "missing"))
                    continue
                rs = [(r64[0][o], r32[0][o]) for r64, r32 in refs]
                ok = pattern_ok(got, rs)
                if not ok.all():
                    out.append((k, f"step {s + 1}: output {p + o}", describe(got, rs, ~ok, leaves)))
            for n in refs[0][0][1]:
                got = side.grads[s].get(p + n)
                if got is None:
                    out.append((k, f"step {s + 1}: gradient of {p + n}", "missing"))
                    continue
                rs = [(r64[1][n], r32[1][n]) for r64, r32 in refs]
                ok = pattern_ok(got, rs, extra=_ct_bound(c, s))
                if not ok.all():
                    cts = {f"{o}_ct": v[s] for o, v in c.cts.items()}
                    out.append((k, f"step {s + 1}: gradient of {p + n}", describe(got, rs, ~ok, dict(leaves, **cts))))
        # the loss: sum over cases; its class is what the cases' classes make it
        want64 = sum(_special_refs(c, s)[0][0][2] for c in batch.cases)
        want32 = sum(_special_refs(c, s)[0][1][2] for c in batch.cases)
        if kind == "gpu" and s == 0 and side.replay is not None:
            pass
        got = np.float64(side.loss[s])
        fin = [abs(x) for c in batch.cases for x in [_special_refs(c, s)[0][0][2]] if math.isfinite(x)]
        ok = pattern_ok(np.array(got), [(np.array(want64), np.array(want32))], ulps=64, extra=1e-5 * (sum(fin) + 1))
        if not ok.all() and not (math.isnan(want64) or math.isnan(want32)):
            out.append((None, f"step {s + 1}: loss", f"got {got!r}, expected {want64!r} (torch float32 {want32!r})"))
    if kind == "gpu" and side.replay is not None:
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


def check_special(seed: int, batch: fg.Batch | None = None) -> tuple[AreaResult, fg.Batch]:
    batch = batch or generate_special(seed)
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
    with np.errstate(all="ignore"):
        gpu = fg.run_gpu(batch)
    if isinstance(gpu, fg.Failure):
        found.append((gpu.kind, None, gpu.what, gpu.detail))
    else:
        explained = {(k, w) for kind, k, w, _ in found}
        found += [("gpu",) + f for f in special_failures(batch, gpu, "gpu") if (f[0], f[1]) not in explained]
    for kind, k, what, detail in found:
        src = fg.batch_source(replace(batch, cases=[batch.cases[k]]), inline=True) if k is not None else ""
        chain = "" if k is None else " [" + "; ".join(chain_text(batch.cases[k])) + "]"
        res.failures.append(Finding("special", seed, f"[{kind}] {'' if k is None else f'case {k}: '}{what}", detail + chain, src))
    return res, batch
