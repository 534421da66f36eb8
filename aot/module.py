"""`aot.Module`: parameters, buffers and child modules, named by their dotted attribute path.

`param()` emits a `param` leaf into the graph being traced, `buffer()` a `buffer` leaf
(non-trainable state: no gradient, never touched by the optimizer, updated only by
`aot.assign`); the names are filled in once the factory has returned the whole tree (only
then is each attribute path known).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import init as _init
from .errors import TraceError, capture_site
from .ir import Tensor
from .ops.trace import current, emit


@dataclass
class ParamInfo:
    tensor: Tensor
    init: _init.Init
    decay: bool
    site: object
    # set by aot.nn modules: (module kind, PyTorch's name for it in that module, stored transposed?)
    torch: tuple[str, str, bool] | None = None
    # False: frozen (no gradient, no optimizer state, never updated; still saved and read)
    trainable: bool = True


@dataclass
class BufferInfo:
    tensor: Tensor
    init: _init.Init
    site: object
    # set by aot.nn modules: (module kind, PyTorch's name for it in that module)
    torch: tuple[str, str] | None = None


BUFFER_INITS = ("zeros", "ones", "literal")  # an i32 buffer's: randn would not be an integer


class Module:
    def __init__(self):
        object.__setattr__(self, "_params", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_children", {})

    def __setattr__(self, name, value):
        if "_params" not in self.__dict__:
            raise TraceError(
                f"{type(self).__name__}.__init__ must call super().__init__() before setting attributes",
                capture_site(),
            )
        if isinstance(value, (Module, list, tuple, dict)):
            self._children[name] = value
        elif isinstance(value, Tensor) and any(p.tensor is value for p in self._params.values()):
            pass
        object.__setattr__(self, name, value)

    def param(self, shape, init: _init.Init | None = None, decay: bool | None = None, trainable: bool = True) -> Tensor:
        """Declare a parameter f32[shape]; `decay` defaults to the init's (False for zeros/ones).
        trainable=False freezes it: no training entry computes its gradient or updates it."""
        init = init or _init.randn()
        shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        if not isinstance(init, _init.Init):
            raise TraceError(f"init must be an aot.init spec, got {init!r}", capture_site())
        lit_shape = getattr(init, "_shape", None)
        if lit_shape is not None and tuple(lit_shape) != shape:
            raise TraceError(f"init.literal has shape {list(lit_shape)} but the param is {list(shape)}", capture_site())
        current()  # only inside tracing
        t = emit("param", (), name="", shape=shape, dtype="f32")
        if not isinstance(trainable, bool):
            raise TraceError(f"param(trainable=...) must be True or False, got {trainable!r}", capture_site())
        self._params[id(t)] = ParamInfo(
            t, init, init.default_decay if decay is None else bool(decay), capture_site(), trainable=trainable
        )
        return t

    def freeze(self) -> "Module":
        """Mark every parameter of this module and its children frozen (trainable=False), as
        torch's requires_grad_(False); call it in the model factory once the tree is built.
        Returns self, so `self.base = Base().freeze()` reads naturally."""
        return self._set_trainable(False)

    def unfreeze(self) -> "Module":
        """Undo freeze(): every parameter of this subtree trainable again (returns self)."""
        return self._set_trainable(True)

    def _set_trainable(self, flag: bool) -> "Module":
        for m in _modules(self):
            for info in m._params.values():
                info.trainable = flag
        return self

    def _torch_param(self, kind: str, torch_name: str, shape, transpose: bool = False, **kw) -> Tensor:
        """param() for the aot.nn modules, recording which PyTorch parameter of the same module
        kind this one is (the package's load_state_dict/state_dict map names and layouts by it)."""
        t = self.param(shape, **kw)
        self._params[id(t)].torch = (kind, torch_name, transpose)
        return t

    def buffer(self, shape, init: _init.Init | None = None, dtype: str = "f32") -> Tensor:
        """Declare a buffer dtype[shape] ("f32" or "i32"): state saved with the parameters and
        read by every entry point, but not trained; a training entry sets its next value with
        aot.assign. Initialized from `init` (default zeros) with the program seed, as params."""
        init = init or _init.zeros()
        shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        if not isinstance(init, _init.Init):
            raise TraceError(f"init must be an aot.init spec, got {init!r}", capture_site())
        if dtype not in ("f32", "i32"):
            raise TraceError(f"a buffer's dtype must be 'f32' or 'i32', got {dtype!r}", capture_site())
        if dtype == "i32" and init.kind not in BUFFER_INITS:
            raise TraceError(
                f"an i32 buffer cannot be initialized by aot.init.{init.kind}()", capture_site(),
                hint="use aot.init.zeros(), ones() or literal(...)",
            )
        lit_shape = getattr(init, "_shape", None)
        if lit_shape is not None and tuple(lit_shape) != shape:
            raise TraceError(f"init.literal has shape {list(lit_shape)} but the buffer is {list(shape)}", capture_site())
        current()  # only inside tracing
        t = emit("buffer", (), name="", shape=shape, dtype=dtype)
        self._buffers[id(t)] = BufferInfo(t, init, capture_site())
        return t

    def _torch_buffer(self, kind: str, torch_name: str, shape, **kw) -> Tensor:
        """buffer() for the aot.nn modules, recording which PyTorch buffer of the same module kind
        this one is (`running_mean` of BatchNorm2d, say: state_dict's name for it)."""
        t = self.buffer(shape, **kw)
        self._buffers[id(t)].torch = (kind, torch_name)
        return t

    def named_params(self, prefix: str = "") -> list[tuple[str, ParamInfo]]:
        """(dotted name, info) in declaration order; children after the module's own attributes."""
        return self._named("_params", "parameter", prefix)

    def named_buffers(self, prefix: str = "") -> list[tuple[str, BufferInfo]]:
        """(dotted name, info) of the buffers, ordered as named_params orders parameters."""
        return self._named("_buffers", "buffer", prefix)

    def _named(self, table: str, what: str, prefix: str) -> list:
        out = []
        attr_of = {id(v): k for k, v in self.__dict__.items() if isinstance(v, Tensor)}
        for key, info in getattr(self, table).items():
            name = attr_of.get(key)
            if name is None:
                call = "param" if table == "_params" else "buffer"
                raise TraceError(
                    f"a {what} of {type(self).__name__} is not stored on an attribute, so it has no name",
                    info.site,
                    hint=f"assign it: self.w = self.{call}(...)",
                )
            out.append((prefix + name, info))
        for name, child in self._children.items():
            out += _walk(child, prefix + name + ".", table, what)
        return out

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")


def _modules(value) -> list:
    """Every Module in a subtree (lists, tuples and dicts of modules included)."""
    if isinstance(value, Module):
        return [value] + [m for child in value._children.values() for m in _modules(child)]
    if isinstance(value, (list, tuple)):
        return [m for v in value for m in _modules(v)]
    if isinstance(value, dict):
        return [m for v in value.values() for m in _modules(v)]
    return []


def _walk(value, prefix: str, table: str = "_params", what: str = "parameter"):
    if isinstance(value, Module):
        return value._named(table, what, prefix)
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in _walk(v, f"{prefix}{i}.", table, what)]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _walk(v, f"{prefix}{k}.", table, what)]
    return []
