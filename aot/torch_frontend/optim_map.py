"""torch.optim optimizers and lr schedulers -> aot.optim and aot.lr (exact translations only).

SGD, Adam, AdamW, Adadelta, RMSprop and Adagrad with their param groups (each a group of aot's
optimizer with all of its settings); what cannot be expressed exactly (dampening, maximize,
settings that differ between groups where aot keeps one, schedulers aot has no equivalent of)
is refused with a message naming the setting and what to use instead.
"""

from __future__ import annotations

from .. import lr as _lr
from .. import optim as _optim
from ..errors import TraceError


def _refuse(what: str, hint: str, site):
    raise TraceError(f"from_torch: {what}", site, hint)


# torch.optim class name -> (aot class name, torch group keys aot takes per group (torch name ->
# aot name), torch settings that must be one value for the whole optimizer in aot)
OPTIMIZERS = {
    "SGD": ("SGD", {"lr": "lr", "momentum": "momentum", "nesterov": "nesterov", "weight_decay": "weight_decay"}, ()),
    "Adam": ("Adam", {"lr": "lr", "betas": "betas", "eps": "eps", "weight_decay": "weight_decay"}, ("amsgrad",)),
    "AdamW": ("AdamW", {"lr": "lr", "betas": "betas", "eps": "eps", "weight_decay": "weight_decay"}, ("amsgrad",)),
    "Adadelta": ("Adadelta", {"lr": "lr", "rho": "rho", "eps": "eps", "weight_decay": "weight_decay"}, ()),
    "RMSprop": ("RMSprop", {"lr": "lr", "alpha": "alpha", "eps": "eps", "weight_decay": "weight_decay",
                            "momentum": "momentum", "centered": "centered"}, ()),
    "Adagrad": ("Adagrad", {"lr": "lr", "lr_decay": "lr_decay", "eps": "eps", "weight_decay": "weight_decay"},
                ("initial_accumulator_value",)),
}


def translate(optimizer, scheduler, names: dict[int, str], clip_grad_norm, site):
    """(aot optimizer or None, {param name: decayed}, names of the params it updates). Each torch
    param group becomes an aot group listing its params with all of the group's settings."""
    if optimizer is None:
        if scheduler is not None:
            _refuse("scheduler= needs an optimizer", "pass the optimizer the scheduler was made for", site)
        return None, {}, set(names.values())
    if isinstance(optimizer, _optim._Optimizer):  # an aot optimizer: decay flags as aot's defaults
        if scheduler is not None:
            _refuse("scheduler= is for torch.optim optimizers", "give the aot optimizer an aot.lr schedule as lr=", site)
        if clip_grad_norm is not None:
            _refuse("clip_grad_norm= is for torch.optim optimizers", "pass clip_grad_norm to the aot optimizer", site)
        return optimizer, {}, set(names.values())
    import torch

    kind = type(optimizer).__name__ if type(optimizer).__module__.startswith("torch.optim") else None
    if kind not in OPTIMIZERS or type(optimizer) is not getattr(torch.optim, kind, None):
        _refuse(f"optimizer {type(optimizer).__name__} is not supported",
                f"use one of torch.optim.{', '.join(OPTIMIZERS)} (or an aot.optim optimizer)", site)
    aot_kind, keys, shared = OPTIMIZERS[kind]
    groups = optimizer.param_groups
    decay, updated, aot_groups = {}, set(), []
    for gi, group in enumerate(groups):
        for flag in ("maximize", "differentiable"):
            if group.get(flag):
                _refuse(f"{kind}({flag}=True) is not supported",
                        "negate the loss instead" if flag == "maximize" else f"leave {flag} False", site)
        if group.get("dampening"):
            _refuse("SGD(dampening=...) is not supported", "use dampening=0", site)
        if kind == "AdamW" and group.get("weight_decay") and not group.get("decoupled_weight_decay", True):
            _refuse("AdamW without decoupled weight decay is not supported", "use AdamW's default", site)
        gnames = []
        for p in group["params"]:
            if id(p) not in names:
                _refuse(f"optimizer group {gi} holds a tensor that is not a parameter of the module",
                        "build the optimizer from module.parameters()", site)
            gnames.append(names[id(p)])
            decay[names[id(p)]] = bool(group.get("weight_decay", 0.0))
        updated.update(gnames)
        base = float(group["initial_lr" if scheduler is not None else "lr"])
        settings = {aot: group[t] for t, aot in keys.items() if t in group}
        settings["lr"] = schedule(scheduler, optimizer, base, site) if scheduler is not None else base
        if kind == "Adam" and group.get("decoupled_weight_decay"):
            aot_kind = "AdamW"
        if gnames:
            aot_groups.append(dict(settings, params=gnames))
    for key in shared:
        values = {repr(g.get(key)) for g in groups}
        if len(values) > 1:
            _refuse(f"optimizer param groups differ in {key} ({', '.join(sorted(values))}); aot's {aot_kind} takes "
                    "one value for all params", "use one value for all groups", site)
    first = {k: v for k, v in aot_groups[0].items() if k != "params"} if aot_groups else {"lr": 0.0}
    extra = {k: groups[0][k] for k in shared if k in groups[0]}
    cls = getattr(_optim, aot_kind)
    clip = None if clip_grad_norm is None else float(clip_grad_norm)
    try:
        opt = cls(**first, **extra, clip_grad_norm=clip, groups=aot_groups if len(aot_groups) > 1 else ())
    except (TypeError, ValueError) as e:
        _refuse(f"{kind}'s settings do not translate: {e}", "use settings aot.optim." + aot_kind + " takes", site)
    return opt, decay, updated


def schedule(sched, optimizer, base: float, site):
    """An aot.lr schedule equal to torch's `sched` when it is stepped once after every optimizer step."""
    if getattr(sched, "optimizer", None) is not optimizer:
        _refuse("scheduler= was made for another optimizer", "pass the optimizer the scheduler steps", site)
    if getattr(sched, "last_epoch", 0) != 0:
        _refuse(f"{type(sched).__name__} has already been stepped ({sched.last_epoch} times)",
                "pass a freshly made scheduler", site)
    return _one(sched, base, site)


def _one(sched, base: float, site):
    import torch

    S = torch.optim.lr_scheduler
    t = type(sched)
    if t is S.SequentialLR:
        # the first scheduler up to the first milestone, then each next one from its own epoch 0
        # (torch steps it with step(0) there): nested ("sequential", first, steps, after) specs
        scheds, ms = list(sched._schedulers), list(sched._milestones)
        out = _one(scheds[-1], base, site)
        for i in reversed(range(len(ms))):
            steps = ms[i] - (ms[i - 1] if i else 0)
            if steps < 1:
                _refuse(f"SequentialLR milestones {ms} must be increasing and positive", "fix the milestones", site)
            out = _lr.sequential(_one(scheds[i], base, site), steps, out)
        return out
    if t is S.StepLR:
        return _lr.step(base, sched.step_size, sched.gamma)
    if t is S.ExponentialLR:
        return _lr.step(base, 1, sched.gamma)
    if t is S.MultiStepLR:
        return _lr.multistep(base, sorted(sched.milestones.elements()), sched.gamma)
    if t is S.LinearLR:
        return _lr.linear(base * sched.start_factor, base * sched.end_factor, sched.total_iters)
    if t is S.CosineAnnealingLR:
        # equal for the first T_max + 1 steps; past T_max torch's lr rises again, aot's stays at eta_min
        return _lr.cosine(base, float(sched.eta_min), sched.T_max)
    _refuse(f"lr scheduler {t.__name__} is not supported",
            "use StepLR, MultiStepLR, ExponentialLR, LinearLR, CosineAnnealingLR or a SequentialLR of them, or an aot.lr schedule "
            "with an aot optimizer", site)
