"""`aot.from_torch`: a PyTorch module and loss -> an `aot.Program` (torch is needed to build only).

The Program's model is an aot.Module holding the torch module's parameters (and buffers) under
their `state_dict()` names, in PyTorch's layouts, starting from the module's values at the
from_torch call. Its entry points replay graphs captured with torch.export (export.py) through
aot ops (replay.py, ops_map.py, ops_nn.py); aot derives the gradients and appends the update the
torch optimizer translates to (optim_map.py). torch is imported only when from_torch is called.
"""

from __future__ import annotations

import inspect

from ..buffers import assign
from ..errors import Site, TraceError, capture_site
from ..module import Module
from ..program import Infer, InputSpec, Program, Train
from .. import init as _init
from .. import ops


# aot.Module.param(trainable=False) where this aot has it (frozen params get no gradient at all);
# else a frozen param is read through stop_gradient, which the optimizer then leaves alone too
_TRAINABLE = "trainable" in inspect.signature(Module.param).parameters


class TorchModel(Module):
    """The torch module's parameters and buffers as aot params and buffers named by their
    state_dict names (any text is a valid aot name), in PyTorch's layouts."""

    def __init__(self, decls):
        super().__init__()
        self._frozen = set()
        for name, array, kind, decay, frozen in decls:
            if kind == "param" and frozen and _TRAINABLE:
                t = self.param(array.shape, init=_init.literal(array), decay=decay, trainable=False)
                frozen = False
            elif kind == "param":
                t = self.param(array.shape, init=_init.literal(array), decay=decay)
            else:  # "f32" or "i32" buffer
                t = self.buffer(array.shape, init=_init.literal(array), dtype=kind)
            self.__dict__[name] = t
            if frozen:
                self._frozen.add(name)

    def tensor(self, name: str):
        t = self.__dict__[name]
        # frozen (requires_grad=False, or in no optimizer group): the loss never reaches it, so it
        # gets no update, no decay and no optimizer state (what torch.optim does with grad None)
        return ops.stop_gradient(t) if name in self._frozen else t


class _Entry:
    """An entry point's function: exports the torch code once per input shapes, replays it."""

    def __init__(self, module, fn, inputs: dict, kind: str, what: str, site, aliases: dict):
        self.module, self.fn, self.names, self.kind, self.what, self.site = module, fn, list(inputs), kind, what, site
        self.aliases = aliases  # every name of a shared (tied) tensor -> the name aot keeps for it
        self.cache: dict = {}
        code = getattr(fn, "__code__", None)
        self.fn_site = Site(code.co_filename, code.co_firstlineno, code.co_name) if code else site

    def __call__(self, model: TorchModel, **inputs):
        import torch

        from .export import capture
        from .replay import replay

        key = tuple(tuple(inputs[n].shape) for n in self.names)
        cap = self.cache.get(key)
        if cap is None:
            gen = torch.Generator().manual_seed(0)
            examples = [
                torch.zeros(t.shape, dtype=torch.long) if t.dtype == "i32" else torch.randn(t.shape, generator=gen)
                for t in (inputs[n] for n in self.names)
            ]
            cap = self.cache[key] = capture(self.module, self.fn, self.names, examples, self.kind == "train", self.what, self.fn_site)
        leaves = {}
        for ph, name in cap.params.items():
            leaves[ph] = model.tensor(self.aliases.get(name, name))
        for ph, name in cap.inputs.items():
            leaves[ph] = inputs[name]
        for ph, arr in cap.constants.items():
            leaves[ph] = self._constant(arr)
        user, buffers = replay(cap, leaves, self.kind == "train", self.what)
        for name, value in buffers.items():  # BatchNorm's running statistics, step counters
            t = model.tensor(self.aliases.get(name, name))
            assign(t, ops.cast(value, t.dtype))
        if len(user) != 1:
            raise TraceError(f"from_torch: {self.what} returns {len(user)} values; an aot entry point returns one tensor",
                             self.fn_site, "return a single tensor")
        out = user[0]
        if self.kind == "train" and not (hasattr(out, "shape") and out.shape == () and out.dtype == "f32"):
            got = out.type_str() if hasattr(out, "type_str") else type(out).__name__
            raise TraceError(f"from_torch: the loss must return a 0-d float tensor, got {got}", self.fn_site,
                             "reduce it, e.g. .mean()")
        return out


    def _constant(self, arr):
        """A tensor made in the torch code (torch.tensor([...])): small ones become graph constants."""
        from .ops_map import const

        dtype = "i32" if arr.dtype.kind in "iub" else "f32"
        flat = arr.reshape(-1)
        if not flat.size or (flat == flat[0]).all():
            return const(flat[0].item() if flat.size else 0, arr.shape, dtype)
        if flat.size > 256:
            raise TraceError(f"from_torch: {self.what} makes a tensor constant of shape {list(arr.shape)} in its code",
                             self.fn_site, "register it on the module (register_buffer) so it becomes model state")
        return ops.reshape(ops.concat([ops.reshape(const(v.item(), (), dtype), (1,)) for v in flat], 0), arr.shape)


def _entries(infer, site):
    out = {}
    for name, spec in infer.items():
        if isinstance(spec, Infer):
            fn, inputs = spec.fn, spec.inputs
        elif isinstance(spec, (tuple, list)) and len(spec) == 2 and callable(spec[0]) and isinstance(spec[1], dict):
            fn, inputs = spec
        else:
            raise TraceError(f"from_torch: infer[{name!r}] must be (fn, inputs) or aot.Infer(fn, inputs)", site)
        out[name] = (fn, inputs)
    return out


def _train_specs(loss, inputs, optimizer, scheduler, site):
    """[(entry name or None, loss_fn, inputs, torch optimizer, scheduler)]: one for a plain loss,
    one per name for `loss={name: (loss_fn, optimizer)}` (inputs and scheduler may be dicts by name)."""
    if loss is None:
        return []
    if not isinstance(loss, dict):
        if isinstance(scheduler, dict):
            raise TraceError("from_torch: scheduler= is a dict, but there is one loss", site, "pass the scheduler itself")
        return [(None, loss, inputs, optimizer, scheduler)]
    if optimizer is not None:
        raise TraceError("from_torch: with a dict of losses each entry brings its optimizer: "
                         "loss={name: (loss_fn, optimizer)}; leave optimizer= out", site)
    per_entry = bool(inputs) and set(inputs) == set(loss) and all(isinstance(v, dict) for v in inputs.values())
    out = []
    for ename, spec in loss.items():
        if not (isinstance(spec, (tuple, list)) and len(spec) == 2 and callable(spec[0])):
            raise TraceError(f"from_torch: loss[{ename!r}] must be (loss_fn, optimizer)", site)
        sched = scheduler.get(ename) if isinstance(scheduler, dict) else scheduler
        if sched is not None and not isinstance(scheduler, dict) and len(loss) > 1:
            raise TraceError("from_torch: with several losses give scheduler={entry: scheduler}", site)
        out.append((ename, spec[0], inputs[ename] if per_entry else inputs, spec[1], sched))
    return out


def from_torch(module, loss, inputs, optimizer=None, infer={}, dims={}, name=None, *,  # noqa: B006 - read only
               scheduler=None, clip_grad_norm=None, seed=0) -> Program:
    """An aot.Program training `module` with `loss(module, **inputs)` (PyTorch code) and the
    torch `optimizer` (SGD, Adam, AdamW, Adadelta, RMSprop or Adagrad, param groups kept;
    `scheduler` a StepLR, MultiStepLR, ExponentialLR, LinearLR or CosineAnnealingLR made for it),
    plus infer entries `infer={name: (fn, inputs)}` run in eval mode. `loss={name: (loss_fn,
    optimizer)}` gives several training entries (`step_<name>`; `inputs` and `scheduler` may then
    be dicts by entry name), each training the params its optimizer holds. `inputs` are
    aot.f32/aot.i32 declarations (torch int64 index tensors are i32 inputs). Parameters and
    buffers keep their state_dict names and layouts and start from the module's current values."""
    site = capture_site()
    try:
        import torch
    except ImportError:
        raise ImportError("aot.from_torch needs PyTorch at build time: pip install aot[torch]") from None
    from .optim_map import translate

    if not isinstance(module, torch.nn.Module):
        raise TraceError(f"from_torch: module must be a torch.nn.Module, got {type(module).__name__}", site)
    if loss is None and not infer:
        raise TraceError("from_torch: give a loss, infer entries, or both", site)
    specs = _train_specs(loss, inputs, optimizer, scheduler, site)
    declared = [i for _, _, i, _, _ in specs] + [i for _, (_, i) in _entries(infer, site).items()]
    for n, s in [(n, s) for i in declared for n, s in i.items()]:
        if not isinstance(s, InputSpec):
            raise TraceError(f"from_torch: input {n!r} must be declared with aot.f32(...) or aot.i32(...)", site)
    params = dict(module.named_parameters())
    names = {id(p): n for n, p in params.items()}
    translated = [translate(o, sc, names, clip_grad_norm, site) for _, _, _, o, sc in specs]
    updated = set().union(*[u for _, _, u in translated]) if translated else set()
    decay = {n: d for _, dd, _ in translated for n, d in dd.items()}
    default_decay = any(o is not None for o, _, _ in translated) and not decay
    decls = []
    for n, p in params.items():
        if p.dtype != torch.float32:
            raise TraceError(f"from_torch: parameter {n!r} is {p.dtype}; aot trains float32 parameters", site,
                             "convert the module with module.float()")
        frozen = not p.requires_grad or n not in updated
        decls.append((n, p.detach().cpu().numpy().copy(), "param", decay.get(n, default_decay), frozen))
    for n, b in module.named_buffers():
        if b.dtype not in (torch.float32, torch.int64, torch.int32, torch.bool):
            raise TraceError(f"from_torch: buffer {n!r} is {b.dtype}; aot holds float32 and int32 state", site)
        kind = "i32" if b.dtype in (torch.int64, torch.int32) else "f32"  # bool masks are f32 0/1
        decls.append((n, b.detach().cpu().numpy().astype("float32"), kind, False, False))
    for n, *_ in decls:
        if n in ("_params", "_children", "_frozen"):
            raise TraceError(f"from_torch: the module's {n!r} clashes with aot.Module's own attributes", site)

    # a tensor reachable under several names (tied weights) is one aot param, under its first name
    first = {}
    for n, t in list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False)):
        first.setdefault(id(t), n)
    aliases = {n: first[id(t)] for n, t in list(module.named_parameters(remove_duplicate=False))
               + list(module.named_buffers(remove_duplicate=False)) if first[id(t)] != n}
    train = {}
    for (ename, fn, ins, _, _), (opt, _, upd) in zip(specs, translated):
        what = "the loss" if ename is None else f"the loss of training entry {ename!r}"
        entry = _Entry(module, fn, ins, "train", what, site, aliases)
        if ename is None:
            train = Train(entry, dict(ins), opt, site=site)
        elif "params" not in Train.__dataclass_fields__:
            raise TraceError("from_torch: several training entries need aot.Train(params=...), which this aot lacks", site)
        else:  # the entry trains what its optimizer holds (exact names: no pattern characters in them)
            trained = sorted(n for n in upd if n in params and params[n].requires_grad)
            train[ename] = Train(entry, dict(ins), opt, params=trained, site=site)
    entries = {
        k: Infer(_Entry(module, fn, i, "infer", f"infer entry {k!r}", site, aliases), dict(i), site=site)
        for k, (fn, i) in _entries(infer, site).items()
    }

    def model():
        return TorchModel(decls)

    model.__module__ = type(module).__module__  # the package records the model's source file
    return Program(name or type(module).__name__.lower(), model, train or None, entries, dict(dims), seed, site=site)
