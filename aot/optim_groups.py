"""Parameter groups of an optimizer, PyTorch-style, over dotted parameter names.

`groups=[{"params": "encoder.*", "lr": 1e-4, "weight_decay": 0.1}, ...]`: "params" is an
fnmatch pattern or a list of them; the other keys override the optimizer's own arguments
for the params the group matches (those torch.optim lets a param group set; `clip_grad_norm`
is over all params and stays the optimizer's). Params no group matches form the default
group with the optimizer's own arguments. Group i's per-step scalars are the inputs
`_lr_g{i}`, ... (schedules.scalar_name); the default group's keep the plain names.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import numbers

from .runtime.schedules import normalize


def _patterns(value, where: str) -> tuple[str, ...]:
    pats = (value,) if isinstance(value, str) else value
    if not isinstance(pats, (list, tuple)) or not pats or not all(isinstance(p, str) and p for p in pats):
        raise TypeError(f"{where}: 'params' must be a name pattern or a non-empty list of them, got {value!r}")
    return tuple(pats)


def _value(opt, key: str, v, where: str):
    """A group's override, checked and made hashable (the optimizer is a frozen dataclass)."""
    if key == "lr":
        return normalize(v)
    if key in ("nesterov", "centered"):
        if not isinstance(v, bool):
            raise TypeError(f"{where}: {key!r} must be a bool, got {v!r}")
        return v
    if key == "betas":
        if not (isinstance(v, (list, tuple)) and len(v) == 2 and all(_real(b) for b in v)):
            raise TypeError(f"{where}: 'betas' must be a pair of floats, got {v!r}")
        return (float(v[0]), float(v[1]))
    if not _real(v):
        raise TypeError(f"{where}: {key!r} must be a float, got {v!r}")
    return float(v)


def _real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def normalize_groups(opt, groups) -> tuple:
    """groups as a tuple of (patterns, ((key, value), ...)) pairs, each override checked."""
    name = type(opt).__name__
    if groups is None or groups == ():
        return ()
    if isinstance(groups, (dict, str)) or not isinstance(groups, (list, tuple)):
        raise TypeError(f"{name}(groups=...) must be a list of dicts, got {groups!r}")
    out = []
    for i, gr in enumerate(groups):
        if isinstance(gr, tuple) and len(gr) == 2 and isinstance(gr[0], tuple):  # already normalized
            out.append(gr)
            continue
        where = f"{name}(groups=...)[{i}]"
        if not isinstance(gr, dict):
            raise TypeError(f"{where} must be a dict with 'params' and overrides, got {gr!r}")
        if "params" not in gr:
            raise ValueError(f"{where} has no 'params' (a name pattern such as 'encoder.*' or a list of them)")
        unknown = sorted(set(gr) - {"params"} - set(opt.GROUP_KEYS))
        if unknown:
            raise ValueError(
                f"{where}: {', '.join(map(repr, unknown))} cannot be set per group; "
                f"{name} groups take {', '.join(map(repr, opt.GROUP_KEYS))}"
            )
        items = tuple(sorted((k, _value(opt, k, v, where)) for k, v in gr.items() if k != "params"))
        out.append((_patterns(gr["params"], where), items))
    return tuple(out)


def group_optimizers(opt) -> list:
    """One optimizer per group with its overrides applied, then the default group's (opt itself)."""
    if not opt.groups:
        return [opt]
    base = dataclasses.replace(opt, groups=())
    return [dataclasses.replace(base, **dict(items)) for _, items in opt.groups] + [base]


def check_groups(opt) -> None:
    """What can be told before the parameter names are known."""
    for i, (pats, items) in enumerate(opt.groups):
        for pat in pats:
            for j in range(i):
                if pat in opt.groups[j][0]:
                    raise ValueError(f"{_show(opt, i)} and {_show(opt, j)} both list the pattern {pat!r}")


def _show(opt, i: int) -> str:
    pats = opt.groups[i][0]
    return f"group {i} ({pats[0]!r}" + (", ..." if len(pats) > 1 else "") + ")"


def resolve(opt, names: list[str]) -> list[int]:
    """Each param's group index; the default group is len(opt.groups). A param two groups match,
    and a group that matches no param (a typo, most likely), are errors."""
    n = len(opt.groups)
    out, used = [], [False] * n
    for name in names:
        hits = [i for i, (pats, _) in enumerate(opt.groups) if any(fnmatch.fnmatchcase(name, p) for p in pats)]
        if len(hits) > 1:
            raise ValueError(f"parameter {name!r} is matched by {_show(opt, hits[0])} and {_show(opt, hits[1])}; "
                             "a parameter belongs to one group")
        for i in hits:
            used[i] = True
        out.append(hits[0] if hits else n)
    for i in range(n):
        if not used[i]:
            raise ValueError(f"{type(opt).__name__}: {_show(opt, i)} matches no parameter; "
                             f"the parameters are {', '.join(names[:8])}{', ...' if len(names) > 8 else ''}")
    return out


def layout_keys(opt, names: list[str], decay: list[bool]) -> list[tuple]:
    """Sort key of each param in the flat vector: by group (the default group first, so a program
    without groups keeps its layout), decayed params first within a group, so each group's
    weight decay covers one range."""
    if opt is None or not opt.groups:
        return [(0, not d) for d in decay]
    n = len(opt.groups)
    return [((gi + 1) % (n + 1), not d) for gi, d in zip(resolve(opt, names), decay)]


def group_table(opt) -> list | None:
    """The package's table of the groups: [(optimizer spec, lr spec), ...] (None without groups)."""
    if opt is None or not opt.groups:
        return None
    return [(o.spec(), normalize(o.lr)) for o in group_optimizers(opt)[:-1]]
