"""Learning-rate schedules as plain data, evaluated the same way by the compiler and the package.

A schedule spec is a float or a tuple: ("linear", peak, final, steps), ("cosine", peak,
final, steps), ("warmup", peak, steps, after), ("step", peak, every, gamma),
("multistep", peak, (milestones...), gamma). `t` is the update being applied, 1, 2, ...
(PyTorch's scheduler conventions, API.md §1).
"""

from __future__ import annotations

import math
import numbers

KINDS = {"linear": 3, "cosine": 3, "warmup": 3, "step": 3, "multistep": 3}


def normalize(spec):
    """Accept a float, a spec tuple/list, a dict {"kind": ..., ...} or an object with `.spec`; return a tuple or float."""
    if hasattr(spec, "spec"):
        spec = spec.spec
    if isinstance(spec, bool):
        raise TypeError(f"learning rate must be a float or a schedule spec, got {spec!r}")
    if isinstance(spec, numbers.Real):  # also NumPy scalars (np.float32(1e-3), np.int64(0))
        spec = float(spec)
        if not math.isfinite(spec) or spec < 0:
            raise ValueError(f"learning rate must be a finite non-negative float, got {spec!r}")
        return float(spec)
    if isinstance(spec, dict):
        spec = dict(spec)
        kind = spec.pop("kind", None)
        order = {
            "linear": ("peak", "final", "steps"),
            "cosine": ("peak", "final", "steps"),
            "warmup": ("peak", "steps", "after"),
            "step": ("peak", "every", "gamma"),
            "multistep": ("peak", "milestones", "gamma"),
        }
        if kind not in order:
            raise ValueError(f"unknown schedule kind {kind!r}; expected one of {', '.join(order)}")
        spec = (kind,) + tuple(spec[k] for k in order[kind])
    if not isinstance(spec, (tuple, list)) or not spec or spec[0] not in KINDS or len(spec) != 1 + KINDS[spec[0]]:
        raise ValueError(
            f"bad learning-rate schedule {spec!r}; expected a float or e.g. ('linear', peak, final, steps)"
        )
    kind = spec[0]
    if kind in ("warmup", "step") and int(spec[2]) <= 0:  # they divide by it
        raise ValueError(f"{kind} schedule needs {'steps' if kind == 'warmup' else 'every'} > 0, got {spec[2]}")
    if kind == "warmup":
        return (kind, float(spec[1]), int(spec[2]), normalize(spec[3]))
    if kind == "multistep":
        return (kind, float(spec[1]), tuple(int(m) for m in spec[2]), float(spec[3]))
    if kind == "step":
        return (kind, float(spec[1]), int(spec[2]), float(spec[3]))
    if int(spec[3]) <= 0:
        raise ValueError(f"{kind} schedule needs steps > 0, got {spec[3]}")
    return (kind, float(spec[1]), float(spec[2]), int(spec[3]))


def lr_at(spec, t: int) -> float:
    """Learning rate of update t (1-based)."""
    if isinstance(spec, float):
        return spec
    kind = spec[0]
    if kind == "linear":
        _, peak, final, steps = spec
        return peak + (final - peak) * min(t - 1, steps) / steps
    if kind == "cosine":
        _, peak, final, steps = spec
        return final + (peak - final) * (1 + math.cos(math.pi * min(t - 1, steps) / steps)) / 2
    if kind == "step":
        _, peak, every, gamma = spec
        return peak * gamma ** ((t - 1) // every)
    if kind == "multistep":
        _, peak, milestones, gamma = spec
        return peak * gamma ** sum(1 for m in milestones if m <= t - 1)
    if kind == "warmup":
        _, peak, steps, after = spec
        if t <= steps:
            return peak * t / steps
        return lr_at(after, t - steps)
    raise ValueError(f"unknown schedule {spec!r}")


def optimizer_scalars(opt: tuple, lr: float, t: int) -> dict[str, float]:
    """Per-step scalar inputs of the update, computed in float64 as torch.optim does on the host.

    opt is ("adam" | "adamw", b1, b2, eps, weight_decay, clip) or ("sgd", momentum, nesterov, weight_decay, clip).
    """
    if opt[0] in ("adam", "adamw"):
        b1, b2 = opt[1], opt[2]
        return {
            "_lr": lr,
            "_step_size": lr / (1.0 - b1**t),
            "_bc2_sqrt": math.sqrt(1.0 - b2**t),
            "_decay": 1.0 - lr * opt[4],
        }
    return {"_lr": lr}
