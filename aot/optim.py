"""Optimizers appended into the training graph (update rules of torch.optim's namesakes).

The update works on flat vectors: all parameters concatenated in layout order (decayed
parameters first, so weight decay applies to one leading range), the gradients in the
same order, and optimizer state (m, v or momentum) as flat `state` leaves. The memory
planner places each gradient directly in its slot of the flat vector, so the concat
costs nothing, and the whole update fuses into one kernel. Per-step scalars (lr, bias
corrections) are inputs computed on the host (runtime/schedules.py), so a new lr or
schedule never needs a recompile.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ops
from .ir import Graph, Tensor
from .runtime.schedules import normalize
from .ops.trace import at_site, emit, tracing


@dataclass(frozen=True)
class Adam:
    lr: object = 1e-3
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    clip_grad_norm: float | None = None

    kind = "adam"
    weight_decay = 0.0

    def spec(self) -> tuple:
        return (self.kind, float(self.betas[0]), float(self.betas[1]), float(self.eps), float(self.weight_decay), _clip(self))

    def state_names(self) -> tuple[str, ...]:
        return ("adam.m", "adam.v")


@dataclass(frozen=True)
class AdamW(Adam):
    weight_decay: float = 0.01

    kind = "adamw"


@dataclass(frozen=True)
class SGD:
    lr: object = 1e-2
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    clip_grad_norm: float | None = None

    kind = "sgd"

    def spec(self) -> tuple:
        return ("sgd", float(self.momentum), bool(self.nesterov), float(self.weight_decay), _clip(self))

    def state_names(self) -> tuple[str, ...]:
        return ("sgd.momentum",) if self.momentum else ()


def _clip(o):
    return None if o.clip_grad_norm is None else float(o.clip_grad_norm)


def check(opt) -> None:
    if not isinstance(opt, (Adam, SGD)):
        raise TypeError(f"optimizer must be aot.optim.Adam, AdamW or SGD, got {opt!r}")
    normalize(opt.lr)
    if isinstance(opt, SGD) and opt.nesterov and opt.momentum <= 0:
        raise ValueError("SGD(nesterov=True) needs momentum > 0 (as in torch.optim.SGD)")


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


def append_update(g: Graph, opt, params: list[Tensor], flat_grads: Tensor, n_decay: int, reached: list[bool] | None = None) -> None:
    """Append the update; `params` are in layout order with the first `n_decay` decayed, and
    `flat_grads` is their gradients concatenated in the same order. Params the loss does not
    reach (`reached[i]` False) keep their values and optimizer state: torch.optim skips a
    parameter whose grad is None (no weight decay, no momentum)."""
    with tracing(g), at_site(None):
        p = p0 = flat(params)
        gr = flat_grads
        total = p.shape[0]
        n_dec = sum(t.size for t in params[:n_decay])
        frozen = frozen_ranges(params, reached if reached is not None else [True] * len(params))

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

        def on_decayed(x, other):
            """x on the decayed leading range [0, n_dec), `other` elsewhere."""
            if n_dec == total:
                return x
            return ops.where(ops.less(ops.arange(total), n_dec), x, other)

        if isinstance(opt, Adam):
            b1, b2 = opt.betas
            m = emit("state", (), name="adam.m", shape=(total,), dtype="f32")
            v = emit("state", (), name="adam.v", shape=(total,), dtype="f32")
            m2 = m * b1 + gr * (1.0 - b1)
            v2 = v * b2 + gr * gr * (1.0 - b2)
            step_size, bc2_sqrt = _scalar("_step_size"), _scalar("_bc2_sqrt")
            if opt.kind == "adamw" and opt.weight_decay:
                if n_dec:  # decoupled decay: p *= 1 - lr * wd
                    p = on_decayed(p * _scalar("_decay"), p)
            denom = ops.sqrt(v2) / bc2_sqrt + opt.eps
            p2 = p - step_size * (m2 / denom)
            g.updates.update({"adam.m": keep_frozen(m2, m), "adam.v": keep_frozen(v2, v)})
        else:
            if opt.weight_decay and n_dec:  # L2 term added to the gradient
                gr = gr + on_decayed(p * float(opt.weight_decay), 0.0)
            if opt.momentum:
                buf = emit("state", (), name="sgd.momentum", shape=(total,), dtype="f32")
                buf2 = buf * float(opt.momentum) + gr
                g.updates["sgd.momentum"] = keep_frozen(buf2, buf)
                gr = gr + buf2 * float(opt.momentum) if opt.nesterov else buf2
            p2 = p - _scalar("_lr") * gr
        g.updates["params"] = keep_frozen(p2, p0)
