"""`aot.Program`, `aot.Train`, `aot.Infer`, input declarations and `aot.capture`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import TraceError, capture_site
from .ir import Tensor


@dataclass(frozen=True)
class InputSpec:
    """An input declaration: dtype plus dims, each an int or a symbolic name from Program.dims."""

    dtype: str
    dims: tuple

    def resolve(self, sizes: dict[str, int]) -> tuple[int, ...]:
        return tuple(sizes[d] if isinstance(d, str) else int(d) for d in self.dims)

    def __str__(self):
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


def _spec(dtype, dims):
    for d in dims:
        if not (isinstance(d, str) or (isinstance(d, int) and not isinstance(d, bool) and d >= 0)):
            raise TraceError(f"{dtype}(): a dim must be a non-negative int or a symbol name, got {d!r}", capture_site())
    return InputSpec(dtype, tuple(dims))


def f32(*dims) -> InputSpec:
    return _spec("f32", dims)


def i32(*dims) -> InputSpec:
    return _spec("i32", dims)


@dataclass
class Train:
    fn: Callable
    inputs: dict[str, InputSpec]
    optimizer: Any = None


@dataclass
class Infer:
    fn: Callable
    inputs: dict[str, InputSpec]


@dataclass
class Program:
    name: str
    model: Callable
    train: Train | None = None
    infer: dict[str, Infer] = field(default_factory=dict)
    dims: dict[str, tuple] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self):
        site = capture_site()
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise TraceError(f"Program name must be a valid Python package name, got {self.name!r}", site)
        if self.train is None and not self.infer:
            raise TraceError(f"Program {self.name!r} has neither train= nor infer=", site)
        for k, v in self.dims.items():
            sizes = (v,) if isinstance(v, int) else tuple(v)
            if not sizes or not all(isinstance(s, int) and s > 0 for s in sizes):
                raise TraceError(f"dims[{k!r}] must be a tuple of positive sizes, got {v!r}", site)
            self.dims[k] = tuple(sorted(set(sizes)))
        entries = ([("train", self.train)] if self.train else []) + list(self.infer.items())
        for entry, spec in entries:
            for iname, ispec in spec.inputs.items():
                if not iname.isidentifier() or iname.startswith("_"):
                    raise TraceError(f"{entry}: input name {iname!r} must be an identifier not starting with '_'", site)
                if not isinstance(ispec, InputSpec):
                    raise TraceError(f"{entry}: input {iname!r} must be declared with aot.f32(...) or aot.i32(...)", site)
                for d in ispec.dims:
                    if isinstance(d, str) and d not in self.dims:
                        raise TraceError(
                            f"{entry}: input {iname!r} uses the symbolic dim {d!r}, which is not in dims=",
                            site,
                            hint=f"add dims={{{d!r}: (sizes...)}} to the Program",
                        )


def capture(name: str, t: Tensor) -> Tensor:
    """Mark an activation to be read back after a call (step(captures=True) / the Infer output)."""
    from .trace import current

    g = current()
    if not isinstance(t, Tensor):
        raise TraceError(f"capture({name!r}, ...) expects a Tensor", capture_site())
    if name in g.captures:
        raise TraceError(f"capture name {name!r} is used twice", capture_site())
    g.captures[name] = t
    return t
