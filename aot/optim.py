"""Optimizers appended into the training graph (update rules of torch.optim's namesakes).

The update works on flat vectors: all parameters concatenated in layout order, the gradients
in the same order, and optimizer state (m, v, momentum, ...) as flat `state` leaves. The
memory planner places each gradient directly in its slot of the flat vector, so the concat
costs nothing, and the whole update fuses into one kernel. Per-step scalars (lr, bias
corrections) are inputs computed on the host (runtime/schedules.py), so a new lr or schedule
never needs a recompile.

Parameter groups (`groups=[{"params": "enc.*", "lr": ..., ...}]`, optim_groups.py) give each
param its group's hyper-parameters. The layout keeps a group's params together (decayed ones
first within it), so every per-group value is selected by range: see `_Segments`.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ops
from .ir import Graph, Tensor
from .optim_groups import check_groups, group_optimizers, normalize_groups, resolve
from .runtime.schedules import normalize, scalar_name
from .ops.api import _const
from .ops.trace import at_site, emit, tracing


class _Optimizer:
    """What every optimizer shares: groups are normalized on construction (hashable, checked)."""

    GROUP_KEYS: tuple[str, ...] = ()  # hyper-parameters a group may override (torch's param_groups)

    def __post_init__(self):
        object.__setattr__(self, "groups", normalize_groups(self, self.groups))


@dataclass(frozen=True)
class Adam(_Optimizer):
    lr: object = 1e-3
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    clip_grad_norm: float | None = None
    weight_decay: float = 0.0  # L2, added to the gradient (torch.optim.Adam)
    amsgrad: bool = False
    groups: tuple = ()

    kind = "adam"
    GROUP_KEYS = ("lr", "betas", "eps", "weight_decay")

    def spec(self) -> tuple:
        base = (self.kind, float(self.betas[0]), float(self.betas[1]), float(self.eps), float(self.weight_decay), _clip(self))
        return base + ("amsgrad",) if self.amsgrad else base

    def state_names(self) -> tuple[str, ...]:
        return ("adam.m", "adam.v") + (("adam.vmax",) if self.amsgrad else ())


@dataclass(frozen=True)
class AdamW(Adam):
    weight_decay: float = 0.01  # decoupled: p *= 1 - lr * weight_decay

    kind = "adamw"


@dataclass(frozen=True)
class SGD(_Optimizer):
    lr: object = 1e-2
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    clip_grad_norm: float | None = None
    groups: tuple = ()

    kind = "sgd"
    GROUP_KEYS = ("lr", "momentum", "nesterov", "weight_decay")

    def spec(self) -> tuple:
        return ("sgd", float(self.momentum), bool(self.nesterov), float(self.weight_decay), _clip(self))

    def state_names(self) -> tuple[str, ...]:
        return ("sgd.momentum",) if _any(self, lambda o: o.momentum) else ()


@dataclass(frozen=True)
class Adadelta(_Optimizer):
    lr: object = 1.0
    rho: float = 0.9
    eps: float = 1e-6
    weight_decay: float = 0.0
    clip_grad_norm: float | None = None
    groups: tuple = ()

    kind = "adadelta"
    GROUP_KEYS = ("lr", "rho", "eps", "weight_decay")

    def spec(self) -> tuple:
        return ("adadelta", float(self.rho), float(self.eps), float(self.weight_decay), _clip(self))

    def state_names(self) -> tuple[str, ...]:
        return ("adadelta.square_avg", "adadelta.acc_delta")


@dataclass(frozen=True)
class RMSprop(_Optimizer):
    lr: object = 1e-2
    alpha: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.0
    centered: bool = False
    clip_grad_norm: float | None = None
    groups: tuple = ()

    kind = "rmsprop"
    GROUP_KEYS = ("lr", "alpha", "eps", "weight_decay", "momentum", "centered")

    def spec(self) -> tuple:
        return ("rmsprop", float(self.alpha), float(self.eps), float(self.weight_decay), float(self.momentum),
                bool(self.centered), _clip(self))

    def state_names(self) -> tuple[str, ...]:
        return (
            ("rmsprop.square_avg",)
            + (("rmsprop.momentum",) if _any(self, lambda o: o.momentum) else ())
            + (("rmsprop.grad_avg",) if _any(self, lambda o: o.centered) else ())
        )


@dataclass(frozen=True)
class Adagrad(_Optimizer):
    lr: object = 1e-2
    lr_decay: float = 0.0
    weight_decay: float = 0.0
    initial_accumulator_value: float = 0.0
    eps: float = 1e-10
    clip_grad_norm: float | None = None
    groups: tuple = ()

    kind = "adagrad"
    # not initial_accumulator_value: torch.optim.Adagrad fills every param's sum from its own argument
    GROUP_KEYS = ("lr", "lr_decay", "weight_decay", "eps")

    def spec(self) -> tuple:
        return ("adagrad", float(self.lr_decay), float(self.weight_decay), float(self.initial_accumulator_value),
                float(self.eps), _clip(self))

    def state_names(self) -> tuple[str, ...]:
        # the sum of squared gradients less initial_accumulator_value: zeroed state is the start
        return ("adagrad.sum",)


OPTIMIZERS = (Adam, SGD, Adadelta, RMSprop, Adagrad)  # AdamW is an Adam


def _clip(o):
    return None if o.clip_grad_norm is None else float(o.clip_grad_norm)


def _any(opt, f) -> bool:
    """f holds for the optimizer's own settings or for one of its groups'."""
    return any(f(o) for o in group_optimizers(opt))


def _hyper(opt) -> None:
    """Hyper-parameters in the ranges torch.optim accepts (ValueError naming the bad one)."""
    def need(ok, what):
        if not ok:
            raise ValueError(f"{type(opt).__name__}: invalid {what} (torch.optim refuses it too)")

    need(opt.weight_decay >= 0, f"weight_decay {opt.weight_decay!r}")
    need(getattr(opt, "eps", 0) >= 0, f"eps {getattr(opt, 'eps', 0)!r}")
    if isinstance(opt, Adam):
        need(len(opt.betas) == 2 and all(0 <= b < 1 for b in opt.betas), f"betas {opt.betas!r}")
    if isinstance(opt, (SGD, RMSprop)):
        need(opt.momentum >= 0, f"momentum {opt.momentum!r}")
    if isinstance(opt, SGD) and opt.nesterov and opt.momentum <= 0:
        raise ValueError("SGD(nesterov=True) needs momentum > 0 (as in torch.optim.SGD)")
    if isinstance(opt, Adadelta):
        need(0 <= opt.rho <= 1, f"rho {opt.rho!r}")
    if isinstance(opt, RMSprop):
        need(opt.alpha >= 0, f"alpha {opt.alpha!r}")
    if isinstance(opt, Adagrad):
        need(opt.lr_decay >= 0, f"lr_decay {opt.lr_decay!r}")
        need(opt.initial_accumulator_value >= 0, f"initial_accumulator_value {opt.initial_accumulator_value!r}")


def check(opt) -> None:
    if not isinstance(opt, OPTIMIZERS):
        raise TypeError(f"optimizer must be aot.optim.Adam, AdamW, SGD, Adadelta, RMSprop or Adagrad, got {opt!r}")
    for o in group_optimizers(opt):
        normalize(o.lr)
        _hyper(o)
    check_groups(opt)


def _scalar(name: str) -> Tensor:
    return emit("input", (), name=name, shape=(), dtype="f32")


def flat(ts: list[Tensor]) -> Tensor:
    return ops.concat([ops.reshape(t, (-1,)) for t in ts], 0)


def frozen_ranges(params: list[Tensor], reached: list[bool]) -> list[tuple[int, int]]:
    """[start, end) ranges of the flat vector held by params the loss does not reach, merged."""
    out: list[tuple[int, int]] = []
    o = 0
    for t, r in zip(params, reached):
        if not r:
            if out and out[-1][1] == o:
                out[-1] = (out[-1][0], o + t.size)
            else:
                out.append((o, o + t.size))
        o += t.size
    return out


class _Segments:
    """Per-element values of the flat vector chosen by range: segment k is [start, end) with key
    (group index, decayed). `pick(f)` is f(key) on every element: one value where all agree,
    else a chain of where(i < end, ...) over the segment ends.

    Why ranges and not a per-element group-index vector gathered into a table of per-group
    scalars: both keep the update one fused kernel, but the lookup needs a persistent i32 index
    buffer as long as the params (a new arena, 4 more bytes read per element: the update reads
    params, grads and 1-3 state vectors and writes them back, 12-28 bytes per element, so
    +14-33% memory traffic in a memory-bound kernel), while a compare-and-select per segment
    end is a few ALU instructions on an index already in a register. Measured on a 3-group
    AdamW MLP (0.5M params, lavapipe): one update kernel with or without groups, and the step
    time of the grouped program within noise of the ungrouped one (90 vs 94 ms); the lookup
    was not built, for the buffer it needs."""

    def __init__(self, sizes: list[int], keys: list[tuple]):
        self.total = sum(sizes)
        self.segs: list[list] = []
        o = 0
        for n, k in zip(sizes, keys):
            if self.segs and self.segs[-1][2] == k:
                self.segs[-1][1] = o + n
            elif n:
                self.segs.append([o, o + n, k])
            o += n
        self._idx = None

    def pick(self, f):
        runs: list[list] = []  # [end, value], adjacent equal values merged
        for _, end, k in self.segs:
            v = f(k)
            if runs and _same(runs[-1][1], v):
                runs[-1][0] = end
            else:
                runs.append([end, v])
        if not runs:
            return 0.0
        out = runs[-1][1]
        if len(runs) > 1 and self._idx is None:
            self._idx = ops.arange(self.total)
        for end, v in reversed(runs[:-1]):
            mask = ops.less(self._idx, end)
            if isinstance(v, Tensor) or isinstance(out, Tensor):
                out = ops.where(mask, v, out)
            else:  # two constants: where() needs a tensor branch (arithmetic would round them)
                out = ops.where(mask, _const(float(v), "f32"), float(out))
        return out


def _same(a, b) -> bool:
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return a is b
    return float(a) == float(b)


def append_update(
    g: Graph, opt, params: list[Tensor], flat_grads: Tensor, decay: list[bool],
    reached: list[bool] | None = None, names: list[str] | None = None,
) -> None:
    """Append the update; `params` are in layout order with `decay[i]` their decay flags and
    `flat_grads` their gradients concatenated in the same order; `names` their dotted names
    (which groups match). Params the loss does not reach (`reached[i]` False) keep their values
    and optimizer state: torch.optim skips a parameter whose grad is None (no weight decay, no
    momentum)."""
    with tracing(g), at_site(None):
        p = p0 = flat(params)
        gr = flat_grads
        total = p.shape[0]
        gis = resolve(opt, names) if names is not None else [len(opt.groups)] * len(params)
        gos = group_optimizers(opt)
        explicit = [i < len(opt.groups) and "weight_decay" in dict(opt.groups[i][1]) for i in range(len(gos))]
        # a group that sets weight_decay decays all of its params, else the decay flag decides
        seg = _Segments([t.size for t in params], [(gi, bool(d or explicit[gi])) for gi, d in zip(gis, decay)])
        frozen = frozen_ranges(params, reached if reached is not None else [True] * len(params))
        scalars: dict = {}

        def S(name: str):
            """The per-step host scalar `name` of each element's group."""
            def f(k):
                key = scalar_name(name, k[0], len(opt.groups))
                if key not in scalars:
                    scalars[key] = _scalar(key)
                return scalars[key]
            return seg.pick(f)

        def H(f):
            """A compile-time hyper-parameter of each element's group."""
            return seg.pick(lambda k: float(f(gos[k[0]])))

        def keep_frozen(new, old):
            """`new` where the param is trained, `old` on the frozen ranges."""
            if not frozen:
                return new
            idx = ops.arange(total)
            inside = None
            for a, b in frozen:
                r = ops.less(idx, b) - ops.less(idx, a)  # 1 on [a, b)
                inside = r if inside is None else inside + r
            return ops.where(inside, old, new)

        if opt.clip_grad_norm is not None:
            # torch.nn.utils.clip_grad_norm_: scale = min(1, max_norm / (||g|| + 1e-6))
            norm = ops.sqrt(ops.sum(ops.square(gr)))
            gr = gr * ops.minimum(float(opt.clip_grad_norm) / (norm + 1e-6), 1.0)

        def wd(k):
            return gos[k[0]].weight_decay if k[1] else 0.0

        decoupled = opt.kind == "adamw"
        if not decoupled and any(wd(k) for *_, k in seg.segs):  # L2 term added to the gradient
            gr = gr + seg.pick(lambda k: p * float(wd(k)) if wd(k) else 0.0)
        state = {n: emit("state", (), name=n, shape=(total,), dtype="f32") for n in opt.state_names()}
        new: dict[str, Tensor] = {}
        if isinstance(opt, Adam):
            m, v = state["adam.m"], state["adam.v"]
            # 1 - beta is a constant of its own: 1 - (beta rounded to f32) loses digits
            b1, b2 = H(lambda o: o.betas[0]), H(lambda o: o.betas[1])
            new["adam.m"] = m2 = m * b1 + gr * H(lambda o: 1.0 - o.betas[0])
            new["adam.v"] = v2 = v * b2 + gr * gr * H(lambda o: 1.0 - o.betas[1])
            if opt.amsgrad:
                new["adam.vmax"] = v2 = ops.maximum(state["adam.vmax"], v2)
            step_size, bc2_sqrt = S("_step_size"), S("_bc2_sqrt")
            if decoupled and any(wd(k) for *_, k in seg.segs):
                p = seg.pick(lambda k: p * S("_decay") if wd(k) else p)  # p *= 1 - lr * wd
            denom = ops.sqrt(v2) / bc2_sqrt + H(lambda o: o.eps)
            p2 = p - step_size * (m2 / denom)
        elif isinstance(opt, SGD):
            if "sgd.momentum" in state:
                buf2 = state["sgd.momentum"] * H(lambda o: o.momentum) + gr
                new["sgd.momentum"] = buf2
                gr = seg.pick(lambda k: gr + buf2 * gos[k[0]].momentum if gos[k[0]].nesterov else buf2)
            p2 = p - S("_lr") * gr
        elif isinstance(opt, Adadelta):
            sq, acc = state["adadelta.square_avg"], state["adadelta.acc_delta"]
            rho, eps = H(lambda o: o.rho), H(lambda o: o.eps)
            new["adadelta.square_avg"] = sq2 = sq * rho + gr * gr * H(lambda o: 1.0 - o.rho)
            delta = ops.sqrt(acc + eps) / ops.sqrt(sq2 + eps) * gr
            new["adadelta.acc_delta"] = acc * rho + delta * delta * H(lambda o: 1.0 - o.rho)
            p2 = p - S("_lr") * delta
        elif isinstance(opt, RMSprop):
            alpha, alpha1 = H(lambda o: o.alpha), H(lambda o: 1.0 - o.alpha)
            new["rmsprop.square_avg"] = sq2 = state["rmsprop.square_avg"] * alpha + gr * gr * alpha1
            avg = ops.sqrt(sq2)
            if "rmsprop.grad_avg" in state:
                ga = state["rmsprop.grad_avg"]
                new["rmsprop.grad_avg"] = ga2 = ga + (gr - ga) * alpha1  # torch's lerp_
                centered = ops.sqrt(sq2 - ga2 * ga2)
                avg = seg.pick(lambda k: centered if gos[k[0]].centered else avg)
            step = gr / (avg + H(lambda o: o.eps))
            if "rmsprop.momentum" in state:  # momentum 0 gives buf = step exactly
                new["rmsprop.momentum"] = step = state["rmsprop.momentum"] * H(lambda o: o.momentum) + step
            p2 = p - S("_lr") * step
        else:  # Adagrad; the state holds sum(g^2) less initial_accumulator_value
            new["adagrad.sum"] = s2 = state["adagrad.sum"] + gr * gr
            init = H(lambda o: o.initial_accumulator_value)
            std = ops.sqrt(s2 + init if isinstance(init, Tensor) or init else s2) + H(lambda o: o.eps)
            p2 = p - S("_lr") * (gr / std)
        for n, t in new.items():
            g.updates[n] = keep_frozen(t, state[n])
        g.updates["params"] = keep_frozen(p2, p0)
