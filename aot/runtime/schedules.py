"""Learning-rate schedules as plain data, evaluated the same way by the compiler and the package.

A schedule spec is a float or a tuple: ("linear", peak, final, steps), ("cosine", peak,
final, steps), ("warmup", peak, steps, after), ("step", peak, every, gamma),
("multistep", peak, (milestones...), gamma), ("sequential", first, steps, after) (`first` for
updates 1..steps, then `after` from its own update 1: torch's SequentialLR). `t` is the update being applied, 1, 2, ...
(PyTorch's scheduler conventions, API.md §1).
"""

from __future__ import annotations

import math
import numbers

KINDS = {"linear": 3, "cosine": 3, "warmup": 3, "step": 3, "multistep": 3, "sequential": 3}


def _rate(value, what: str) -> float:
    """A learning rate or a factor: a finite non-negative real number (NumPy scalars too)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a finite non-negative float, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} must be a finite non-negative float, got {value!r}")
    return value


def _count(value, what: str, least: int) -> int:
    """A step count: an int (or an integral float such as 2e3) >= least."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be an int, got {type(value).__name__} {value!r}")
    if not isinstance(value, numbers.Integral):
        if not (math.isfinite(value) and float(value).is_integer()):
            raise ValueError(f"{what} must be a whole number of steps, got {value!r}")
    value = int(value)
    if not least <= value < 2**62:
        raise ValueError(f"{what} must be an int >= {least}, got {value}")
    return value


def normalize(spec):
    """Accept a float, a spec tuple/list, a dict {"kind": ..., ...} or an object with `.spec`; return a
    tuple or float. Rates and factors must be finite and >= 0, step counts whole numbers (TypeError
    for a non-number, ValueError for a bad value), so a schedule is as safe as set_lr(float)."""
    if hasattr(spec, "spec"):
        spec = spec.spec
    if isinstance(spec, bool):
        raise TypeError(f"learning rate must be a float or a schedule spec, got {spec!r}")
    if isinstance(spec, numbers.Real):  # also NumPy scalars (np.float32(1e-3), np.int64(0))
        return _rate(spec, "learning rate")
    if isinstance(spec, dict):
        spec = dict(spec)
        kind = spec.pop("kind", None)
        order = {
            "linear": ("peak", "final", "steps"),
            "cosine": ("peak", "final", "steps"),
            "warmup": ("peak", "steps", "after"),
            "step": ("peak", "every", "gamma"),
            "multistep": ("peak", "milestones", "gamma"),
            "sequential": ("first", "steps", "after"),
        }
        if kind not in order:
            raise ValueError(f"unknown schedule kind {kind!r}; expected one of {', '.join(order)}")
        if set(spec) != set(order[kind]):
            raise ValueError(f"{kind} schedule takes {', '.join(order[kind])}; got {', '.join(map(str, spec))}")
        spec = (kind,) + tuple(spec[k] for k in order[kind])
    if not isinstance(spec, (tuple, list)) or not spec or not isinstance(spec[0], str) or spec[0] not in KINDS \
            or len(spec) != 1 + KINDS[spec[0]]:
        raise ValueError(
            f"bad learning-rate schedule {spec!r}; expected a float or e.g. ('linear', peak, final, steps)"
        )
    kind = spec[0]
    if kind == "warmup":
        return (kind, _rate(spec[1], "warmup peak"), _count(spec[2], "warmup steps", 1), normalize(spec[3]))
    if kind == "sequential":
        return (kind, normalize(spec[1]), _count(spec[2], "sequential steps", 1), normalize(spec[3]))
    if kind == "multistep":
        if not isinstance(spec[2], (tuple, list)):
            raise TypeError(f"multistep milestones must be a tuple of step counts, got {spec[2]!r}")
        if len(spec[2]) > 1000:
            raise ValueError(f"multistep takes at most 1000 milestones, got {len(spec[2])}")
        milestones = tuple(_count(m, "multistep milestone", 0) for m in spec[2])
        return (kind, _rate(spec[1], "multistep peak"), milestones, _rate(spec[3], "multistep gamma"))
    if kind == "step":
        return (kind, _rate(spec[1], "step peak"), _count(spec[2], "step every", 1), _rate(spec[3], "step gamma"))
    return (kind, _rate(spec[1], f"{kind} peak"), _rate(spec[2], f"{kind} final"), _count(spec[3], f"{kind} steps", 1))


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
    if kind == "sequential":
        _, first, steps, after = spec
        return lr_at(first, t) if t <= steps else lr_at(after, t - steps)
    raise ValueError(f"unknown schedule {spec!r}")


def optimizer_scalars(opt: tuple, lr: float, t: int) -> dict[str, float]:
    """Per-step scalar inputs of the update, computed in float64 as torch.optim does on the host.

    opt is ("adam" | "adamw", b1, b2, eps, weight_decay, clip[, "amsgrad"]), ("sgd", momentum,
    nesterov, weight_decay, clip), ("adadelta", rho, eps, weight_decay, clip), ("rmsprop",
    alpha, eps, weight_decay, momentum, centered, clip) or ("adagrad", lr_decay, weight_decay,
    initial_accumulator_value, eps, clip).
    """
    if opt[0] in ("adam", "adamw"):
        b1, b2 = opt[1], opt[2]
        return {
            "_lr": lr,
            "_step_size": lr / (1.0 - b1**t),
            "_bc2_sqrt": math.sqrt(1.0 - b2**t),
            "_decay": 1.0 - lr * opt[4],
        }
    if opt[0] == "adagrad":  # torch.optim.Adagrad's clr
        return {"_lr": lr / (1.0 + (t - 1) * opt[1])}
    return {"_lr": lr}


def scalar_name(name: str, group: int, n_groups: int) -> str:
    """The input that carries per-step scalar `name` of parameter group `group` (optim_groups.py);
    the default group (index n_groups) keeps the plain name."""
    return name if group == n_groups else f"{name}_g{group}"


def step_scalars(opt: tuple, lr, t: int, groups=None, group_lrs=None) -> dict[str, float]:
    """All per-step scalars of update t: the default group's at lr `lr` (a schedule already
    evaluated at its own step), group i's from groups[i] = (spec, ...) at lr group_lrs[i]."""
    out = optimizer_scalars(opt, lr, t)
    for i, ((spec, _), glr) in enumerate(zip(groups or (), group_lrs or ())):
        for k, v in optimizer_scalars(tuple(spec), glr, t).items():
            out[scalar_name(k, i, len(groups))] = v
    return out
