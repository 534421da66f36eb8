"""torch.optim optimizers and lr schedulers -> aot.optim and aot.lr (exact translations only).

What cannot be expressed exactly (AMSGrad, dampening, maximize, Adam's coupled weight decay,
per-group learning rates, schedulers aot has no equivalent of) is refused with a message
naming the setting and what to use instead.
"""

from __future__ import annotations

from .. import lr as _lr
from .. import optim as _optim
from ..errors import TraceError


def _refuse(what: str, hint: str, site):
    raise TraceError(f"from_torch: {what}", site, hint)


def translate(optimizer, scheduler, names: dict[int, str], clip_grad_norm, site):
    """(aot optimizer or None, {param name: decayed}, names of the params it updates)."""
    if optimizer is None:
        if scheduler is not None:
            _refuse("scheduler= needs an optimizer", "pass the optimizer the scheduler was made for", site)
        return None, {}, set(names.values())
    if isinstance(optimizer, (_optim.Adam, _optim.SGD)):  # an aot optimizer: decay flags as aot's defaults
        if scheduler is not None:
            _refuse("scheduler= is for torch.optim optimizers", "give the aot optimizer an aot.lr schedule as lr=", site)
        if clip_grad_norm is not None:
            _refuse("clip_grad_norm= is for torch.optim optimizers", "pass clip_grad_norm to the aot optimizer", site)
        return optimizer, {}, set(names.values())
    import torch

    kinds = {torch.optim.SGD: "SGD", torch.optim.Adam: "Adam", torch.optim.AdamW: "AdamW"}
    kind = kinds.get(type(optimizer))
    if kind is None:
        _refuse(f"optimizer {type(optimizer).__name__} is not supported",
                "use torch.optim.Adam, AdamW or SGD (or an aot.optim optimizer)", site)
    groups = optimizer.param_groups
    decay, updated = {}, set()
    for gi, group in enumerate(groups):
        for p in group["params"]:
            if id(p) not in names:
                _refuse(f"optimizer group {gi} holds a tensor that is not a parameter of the module",
                        "build the optimizer from module.parameters()", site)
            updated.add(names[id(p)])
            decay[names[id(p)]] = bool(group.get("weight_decay", 0.0))
    first = groups[0]

    def same(key, why):
        values = {repr(g.get(key)) for g in groups}
        if len(values) > 1:
            _refuse(f"optimizer param groups differ in {key} ({', '.join(sorted(values))}); {why}",
                    "use one value for all groups", site)

    for g in groups:
        if g.get("maximize"):
            _refuse(f"{kind}(maximize=True) is not supported", "negate the loss instead", site)
        if g.get("differentiable"):
            _refuse(f"{kind}(differentiable=True) is not supported", "leave differentiable False", site)
    lr_key = "initial_lr" if scheduler is not None else "lr"
    same(lr_key, "aot takes one learning rate")
    wds = {float(g.get("weight_decay", 0.0)) for g in groups} - {0.0}
    if len(wds) > 1:
        _refuse(f"optimizer param groups use several weight decays {sorted(wds)}",
                "aot decays a set of params by one weight_decay: use one value (and 0 for the rest)", site)
    wd = wds.pop() if wds else 0.0
    lr = schedule(scheduler, optimizer, float(first[lr_key]), site) if scheduler is not None else float(first["lr"])
    clip = None if clip_grad_norm is None else float(clip_grad_norm)
    if kind == "SGD":
        for key in ("momentum", "nesterov"):
            same(key, "aot's SGD takes one value")
        if any(g.get("dampening", 0) for g in groups):
            _refuse("SGD(dampening=...) is not supported", "use dampening=0", site)
        opt = _optim.SGD(lr=lr, momentum=float(first["momentum"]), nesterov=bool(first["nesterov"]),
                         weight_decay=wd, clip_grad_norm=clip)
    else:
        for key in ("betas", "eps", "amsgrad"):
            same(key, f"aot's {kind} takes one value")
        if first.get("amsgrad"):
            _refuse(f"{kind}(amsgrad=True) is not supported", "use amsgrad=False", site)
        decoupled = kind == "AdamW" or bool(first.get("decoupled_weight_decay"))
        if wd and not decoupled:
            _refuse("Adam(weight_decay=...) adds an L2 term to the gradient, which aot's Adam has not",
                    "use torch.optim.AdamW (decoupled decay) or weight_decay=0", site)
        betas = tuple(float(b) for b in first["betas"])
        if decoupled:
            opt = _optim.AdamW(lr=lr, betas=betas, eps=float(first["eps"]), weight_decay=wd, clip_grad_norm=clip)
        else:
            opt = _optim.Adam(lr=lr, betas=betas, eps=float(first["eps"]), clip_grad_norm=clip)
    return opt, decay, updated


def schedule(sched, optimizer, base: float, site):
    """An aot.lr schedule equal to torch's `sched` when it is stepped once after every optimizer step."""
    import torch

    S = torch.optim.lr_scheduler
    if getattr(sched, "optimizer", None) is not optimizer:
        _refuse("scheduler= was made for another optimizer", "pass the optimizer the scheduler steps", site)
    if getattr(sched, "last_epoch", 0) != 0:
        _refuse(f"{type(sched).__name__} has already been stepped ({sched.last_epoch} times)",
                "pass a freshly made scheduler", site)
    t = type(sched)
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
            "use StepLR, MultiStepLR, ExponentialLR, LinearLR or CosineAnnealingLR, or an aot.lr schedule "
            "with an aot optimizer", site)
