"""`aot.Program`, `aot.Train`, `aot.Infer`, input declarations and `aot.capture`."""

from __future__ import annotations

import functools
import keyword
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

from .errors import InvalidNameError, Site, TraceError, capture_site
from .ir import Tensor
from .runtime.rng import check_seed

# Modules a program may not be named after: `import <name>` must find the generated package, and
# the package (or aot building it) must still find these: its dependencies and their own, aot's,
# and the tools that build and install it.
DEPENDENCY_NAMES = frozenset({
    "numpy", "wgpu", "cffi", "pycparser", "_cffi_backend", "rendercanvas", "rubicon",
    "aot", "jinja2", "markupsafe", "black", "blib2to3", "click", "mypy_extensions", "packaging",
    "pathspec", "platformdirs", "pytokens", "tomli", "typing_extensions",
    "build", "pyproject_hooks", "setuptools", "pkg_resources", "_distutils_hack", "pip", "wheel",
})

# Attributes the generated Model class defines in its template (the rest come from
# runtime/model.py's ModelBase) and those API.md §6 announces; a user name taking one of them
# would replace it.
GENERATED_NAMES = frozenset({
    "step", "step_many", "train", "PROGRAM", "WGSL", "step_count", "seed", "adapter", "allreduce",
    "load_safetensors", "save_safetensors", "load_state_dict", "state_dict",
})


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
        if not (isinstance(d, str) or (isinstance(d, int) and not isinstance(d, bool) and d > 0)):
            raise TraceError(f"{dtype}(): a dim must be a positive int or a symbol name, got {d!r}", capture_site())
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
    site: Site | None = field(default=None, repr=False, compare=False)  # where it was declared
    # the parameters this entry trains: None for every trainable one, else an fnmatch pattern or a
    # list of them over dotted names ("generator.*"); the rest get no gradient and no update here
    params: Any = None

    def __post_init__(self):
        self.site = self.site or capture_site()
        pats = [self.params] if isinstance(self.params, str) else self.params
        if pats is not None:
            if not isinstance(pats, (list, tuple)) or not pats or not all(isinstance(p, str) and p for p in pats):
                raise TraceError(
                    f"Train(params=...) must be None, a pattern or a non-empty list of patterns (str), got {self.params!r}",
                    self.site,
                )
            self.params = tuple(pats)


@dataclass
class Infer:
    fn: Callable
    inputs: dict[str, InputSpec]
    site: Site | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        self.site = self.site or capture_site()


@dataclass
class Program:
    name: str
    model: Callable
    train: Train | dict[str, Train] | None = None  # a dict: several training entries, step_<name>
    infer: dict[str, Infer] = field(default_factory=dict)
    dims: dict[str, tuple] = field(default_factory=dict)
    seed: int = 0
    site: Site | None = field(default=None, repr=False, compare=False)
    # the web target's extras: {"demo": "file.js"}, the demo page's data and display (web.py),
    # a path relative to the file that declares the Program
    web: dict | None = None

    def __post_init__(self):
        site = self.site = self.site or capture_site()
        check_program_name(self.name, site)
        self.seed = check_seed(self.seed, "Program(seed=...)")
        self.web = check_web(self.web, site)
        if self.train is None and not self.infer:
            raise TraceError(f"Program {self.name!r} has neither train= nor infer=", site)
        for k, v in self.dims.items():
            if not (isinstance(k, str) and k.isascii() and k.isidentifier()):
                raise InvalidNameError(f"dims: a symbolic dim's name must be an ASCII identifier, got {k!r}", site)
            sizes = (v,) if isinstance(v, int) else tuple(v)
            if not sizes or not all(isinstance(s, int) and s > 0 for s in sizes):
                raise TraceError(f"dims[{k!r}] must be a tuple of positive sizes, got {v!r}", site)
            self.dims[k] = tuple(sorted(set(sizes)))
        if isinstance(self.train, dict):
            if not self.train:
                raise TraceError(f"Program {self.name!r}: train= is an empty dict", site)
            for k, v in self.train.items():
                if not isinstance(v, Train):
                    raise TraceError(f"train[{k!r}] must be an aot.Train, got {type(v).__name__}", site)
        elif self.train is not None and not isinstance(self.train, Train):
            raise TraceError(f"train= must be an aot.Train or a dict of them, got {type(self.train).__name__}", site)
        entries = list(train_entries(self).items()) + list(self.infer.items())
        for entry, spec in entries:
            for iname, ispec in spec.inputs.items():
                if not isinstance(ispec, InputSpec):
                    raise TraceError(f"{entry}: input {iname!r} must be declared with aot.f32(...) or aot.i32(...)", site)
                for d in ispec.dims:
                    if isinstance(d, str) and d not in self.dims:
                        raise TraceError(
                            f"{entry}: input {iname!r} uses the symbolic dim {d!r}, which is not in dims=",
                            site,
                            hint=f"add dims={{{d!r}: (sizes...)}} to the Program",
                        )


WEB_KEYS = ("demo",)


def check_web(web, site=None) -> dict | None:
    """Program(web=...): None, or {"demo": path of a JavaScript module}, the path relative to the
    folder of the file that declares the Program; returned with the path made absolute."""
    if web is None:
        return None
    if not isinstance(web, dict) or not set(web) <= set(WEB_KEYS):
        raise TraceError(f"Program(web=...) must be a dict with the key 'demo', got {web!r}", site,
                         hint='web={"demo": "my_model.demo.js"}, a file next to the model')
    out = dict(web)
    if "demo" in web:
        demo = web["demo"]
        if not isinstance(demo, (str, os.PathLike)) or not str(demo).endswith((".js", ".mjs")):
            raise TraceError(f"Program(web={{'demo': ...}}) must name a .js file, got {demo!r}", site)
        base = os.path.dirname(site.file) if site and os.path.isfile(site.file) else os.getcwd()
        path = os.path.join(base, os.fspath(demo))
        if not os.path.isfile(path):
            raise TraceError(f"Program(web={{'demo': {os.fspath(demo)!r}}}): no such file {path}", site,
                             hint="the path is relative to the file that declares the Program")
        out["demo"] = os.path.abspath(path)
    return out


def train_entries(program: "Program") -> dict[str, Train]:
    """The training entries by table name: {"train": t} for train=t (the step/step_many methods),
    {"train_<name>": t} for each item of a dict (step_<name>/step_many_<name>)."""
    if program.train is None:
        return {}
    if isinstance(program.train, Train):
        return {"train": program.train}
    return {"train_" + k: v for k, v in program.train.items()}


def train_methods(entry: str) -> tuple[str, str]:
    """(step method, step_many method) of a training entry's table name."""
    if entry == "train":
        return "step", "step_many"
    name = entry[len("train_"):]
    return "step_" + name, "step_many_" + name


MAX_NAME = 100  # characters in a Program name (check_program_name)


def check_program_name(name, site=None) -> None:
    """A program's name becomes a package name: `import <name>` must find it and nothing else."""
    why = None
    if not isinstance(name, str):
        why = f"it must be a str, got {type(name).__name__}"
    elif not (name.isascii() and name.isidentifier()):
        why = "it must be an ASCII Python identifier (letters, digits, '_'; not starting with a digit)"
    elif keyword.iskeyword(name):
        why = "it is a Python keyword"
    elif len(name) > MAX_NAME:
        # files are named after it (<name>-web/, <name>-0.1.0-py3-none-any.whl, kernel files), and a
        # file name has at most 255 bytes: a long name built for seconds, then failed writing one
        why = f"it has {len(name)} characters; at most {MAX_NAME} (folders and files are named after it)"
    elif name in sys.stdlib_module_names:
        why = "it is the name of a standard library module, which `import` would no longer find"
    elif name.lower() in DEPENDENCY_NAMES:
        why = "it is the name of a module that aot or the generated package depends on"
    if why:
        raise InvalidNameError(f"aot.Program: the name {name!r} cannot be a package name: {why}", site,
                               hint="choose another name, e.g. 'my_model'")


@functools.lru_cache(maxsize=None)
def reserved_names() -> frozenset:
    """Names an input, entry point or capture cannot take: the generated Model's methods and
    attributes, Python keywords, and the names the generated methods use themselves."""
    from .runtime.model import ModelBase

    model = {n for n in dir(ModelBase) if not n.startswith("_")}
    return frozenset(model | GENERATED_NAMES | set(keyword.kwlist) | {"self", "captures", "out", "loss"})


def check_name(kind: str, name, site=None, reserved: frozenset | None = None) -> None:
    """Raise InvalidNameError (a ValueError) at `site` unless `name` can be used for `kind`
    ("input", "entry point", "capture"): an ASCII identifier not starting with '_', not reserved."""
    reserved = reserved_names() if reserved is None else reserved
    why = None
    if not isinstance(name, str):
        why = f"it must be a str, got {type(name).__name__}"
    elif not (name.isascii() and name.isidentifier()):
        why = "it must be an ASCII Python identifier"
    elif name.startswith("_"):
        why = "names starting with '_' are the generated code's"
    elif keyword.iskeyword(name):
        why = "it is a Python keyword"
    elif name in reserved:
        why = "the generated Model uses that name itself"
    if why:
        raise InvalidNameError(f"{kind} name {name!r} cannot be used: {why}", site,
                               hint=f"rename the {kind}")


def check_names(program: "Program") -> None:
    """Every user-given name of `program` (inputs, entry points); captures are checked when traced."""
    reserved = reserved_names()
    trains = train_entries(program)
    taken: dict[str, str] = {}  # generated method or table name -> what it belongs to
    specs = []
    for entry, spec in trains.items():
        step, many = train_methods(entry)
        if entry != "train":
            check_name("training entry", entry[len("train_"):], spec.site or program.site, reserved)
            for m in (step, many, entry):
                if m in reserved:
                    raise InvalidNameError(f"training entry name {entry[6:]!r} cannot be used: the generated Model "
                                           f"uses {m!r} itself", spec.site or program.site, hint="rename the entry")
                if m in taken:
                    raise InvalidNameError(f"training entry {entry[6:]!r}: the name {m!r} it needs is also {taken[m]}'s",
                                           spec.site or program.site, hint="rename one of the entries")
                taken[m] = f"training entry {entry[6:]!r}"
        specs.append((step, spec))
    for entry, spec in program.infer.items():
        check_name("entry point", entry, program.site, reserved)
        if entry in taken:
            raise InvalidNameError(f"entry point name {entry!r} cannot be used: {taken[entry]} needs it "
                                   "(its methods step_<name>, step_many_<name> and its table name train_<name>)",
                                   program.site, hint="rename the entry point")
        specs.append((entry, spec))
    for entry, spec in specs:
        for iname in spec.inputs:
            check_name(f"{entry}() input", iname, spec.site or program.site, reserved)


def capture(name: str, t: Tensor) -> Tensor:
    """Mark an activation to be read back after a call (step(captures=True) / the Infer output)."""
    from .ops.trace import current

    g = current()
    check_name("capture", name, capture_site())
    if not isinstance(t, Tensor):
        raise TraceError(f"capture({name!r}, ...) expects a Tensor", capture_site())
    if name in g.captures:
        raise TraceError(f"capture name {name!r} is used twice", capture_site())
    g.captures[name] = t
    return t
