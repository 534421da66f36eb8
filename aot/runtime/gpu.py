"""The Model class behind a generated package's API: input validation, parameters,
checkpoints, schedules and locking, over the device side in engine.py."""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from dataclasses import dataclass

import numpy as np

from . import rng, schedules
from .engine import _NP, Engine, ShaderError, _size  # noqa: F401  (ShaderError: the package re-exports it)


@dataclass
class StepResult:
    loss: float
    captures: dict


@dataclass
class InferResult:
    output: np.ndarray
    captures: dict


def _describe(a) -> str:
    a = np.asarray(a) if not isinstance(a, np.ndarray) else a
    return f"{a.dtype} array of shape {tuple(a.shape)}"


def _spec_str(dtype, dims) -> str:
    return f"{dtype}[{','.join(str(d) for d in dims)}]"


class ModelBase:
    """Everything a generated Model shares; the subclass supplies the program's tables."""

    PROGRAM: dict = {}
    WGSL: dict = {}

    def __init__(self, seed: int | None = None):
        p = self.PROGRAM
        self._lock = threading.RLock()
        self._closed = False
        self._program = p
        self.seed = int(p["seed"] if seed is None else seed)
        self._params = p["params"]  # (name, shape, init spec, decay, offset)
        self._total = sum(_size(s) for _, s, _, _, _ in self._params)
        self._engine = Engine(p["name"], self.WGSL, p["kernels"], p["arenas"], p["entries"])
        self._opt = p.get("optimizer")
        self._lr = schedules.normalize(p["lr"]) if p.get("lr") is not None else None
        self._lr_origin = 0
        self._staging: dict[str, dict] = {}
        self.step_count = 0
        self._infer_calls = 0  # numbers the random streams of infer calls (ops.rand/randn/categorical)
        # an Infer-only program has no gradient arena (it is 0 long)
        self._has_grads = p["arenas"].get("grads", 0) >= self._total
        self.reset(params=True, optimizer=True)

    # ---- introspection ------------------------------------------------------------------
    @property
    def param_names(self) -> list[str]:
        return [n for n, *_ in self._params]

    @property
    def lr(self):
        """The learning-rate spec in use (a float or a schedule tuple)."""
        return self._lr

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- parameters ---------------------------------------------------------------------
    def params(self) -> dict:
        """A copy of every parameter, by dotted name, in its declared shape."""
        with self._lock:
            self._check_open()
            flat = self._engine.read("params", 0, self._total)
            return {n: flat[o : o + _size(s)].reshape(s).copy() for n, s, _, _, o in self._params}

    def grads(self) -> dict:
        """Gradients of the last step (before clipping), zeros before the first step."""
        with self._lock:
            self._check_open()
            if not self._has_grads:
                raise RuntimeError(f"{self._program['name']} was built without train=: it has no gradients")
            flat = self._engine.read("grads", 0, self._total)
            return {n: flat[o : o + _size(s)].reshape(s).copy() for n, s, _, _, o in self._params}

    def load_params(self, values: dict, partial: bool = False) -> None:
        """Overwrite parameters by name. Unknown names (and, unless partial, missing ones) raise
        KeyError, a wrong shape ValueError; nothing changes unless every value is valid."""
        with self._lock:
            self._check_open()
            known = {n: (s, o) for n, s, _, _, o in self._params}
            unknown = sorted(set(values) - set(known))
            if unknown:
                raise KeyError(f"load_params: unknown parameter(s) {unknown}; this model has {sorted(known)}")
            missing = sorted(set(known) - set(values))
            if missing and not partial:
                raise KeyError(f"load_params: missing parameter(s) {missing} (pass partial=True to load a subset)")
            arrays = {}
            for n, v in values.items():
                shape, _ = known[n]
                a = np.asarray(v)
                if a.dtype.kind not in "fiub":
                    raise TypeError(f"load_params: {n!r} must be numeric, got {_describe(a)}")
                if tuple(a.shape) != tuple(shape):
                    raise ValueError(f"load_params: {n!r} expects shape {tuple(shape)}, got {tuple(a.shape)}")
                arrays[n] = a.astype(np.float32)
            for n, a in arrays.items():
                self._engine.write("params", known[n][1], a.ravel())

    def _init_params(self) -> np.ndarray:
        flat = np.zeros(max(self._total, 1), dtype=np.float32)
        for i, (n, s, spec, _, o) in enumerate(self._params):
            flat[o : o + _size(s)] = rng.init_param(tuple(spec), tuple(s), self.seed, i).ravel()
        return flat

    def reset(self, params: bool = True, optimizer: bool = True) -> None:
        """params: back to the seed's initial values; optimizer: zero state and step_count
        (the learning rate set with set_lr is kept)."""
        with self._lock:
            self._check_open()
            if params:
                self._engine.write("params", 0, self._init_params())
            if optimizer:
                if self._program["arenas"].get("state", 0):
                    self._engine.write("state", 0, np.zeros(self._program["arenas"]["state"], dtype=np.float32))
                if self._has_grads and self._total:  # no last step: grads() reads zeros, as on a new model
                    self._engine.write("grads", 0, np.zeros(self._total, dtype=np.float32))
                self.step_count = 0
                self._lr_origin = 0

    def set_lr(self, lr) -> None:
        """A float, or a schedule spec such as ("linear", 5e-3, 5e-4, 1500) or an aot.lr schedule.
        A schedule starts at its own step 1 on the next step; step_count keeps counting."""
        with self._lock:
            self._check_open()
            if self._opt is None:
                raise RuntimeError("this program was built without an optimizer (optimizer=None)")
            self._lr = schedules.normalize(lr)
            self._lr_origin = self.step_count

    def current_lr(self) -> float:
        """The learning rate the next step will use."""
        return schedules.lr_at(self._lr, self.step_count + 1 - self._lr_origin)

    # ---- calls --------------------------------------------------------------------------
    def _check_open(self):
        if self._closed:
            raise RuntimeError(f"{self._program['name']}: the model is closed")

    def _pick(self, entry: str, inputs: dict):
        """Validate inputs against the entry's declaration; returns (variant key, packed arena arrays)."""
        decl = self._program["signatures"][entry]  # name -> (dtype, dims)
        unknown = sorted(set(inputs) - set(decl))
        if unknown:
            raise TypeError(f"{entry}(): unknown input(s) {unknown}; expected {sorted(decl)}")
        missing = sorted(set(decl) - set(inputs))
        if missing:
            raise TypeError(f"{entry}(): missing input(s) {missing}")
        arrays, sizes = {}, {}
        dims = self._program["dims"]
        for name, (dtype, shape) in decl.items():
            a = inputs[name]
            try:
                a = np.asarray(a)
            except Exception as e:
                raise TypeError(f"{entry}(): input {name!r} is not array-like: {e}") from None
            want = _spec_str(dtype, shape)
            if a.dtype.kind not in "fiub" or a.dtype == object:
                raise TypeError(f"{entry}(): input {name!r} expects {want}; got non-numeric {_describe(a)}")
            if dtype == "i32" and a.dtype.kind == "f":
                raise TypeError(f"{entry}(): input {name!r} expects integer data ({want}); got {_describe(a)}")
            if a.ndim != len(shape):
                raise ValueError(f"{entry}(): input {name!r} expects {want}{_dims_note(shape, dims)}; got {_describe(a)}")
            for d, got in zip(shape, a.shape):
                if isinstance(d, str):
                    if got not in dims[d] or sizes.setdefault(d, got) != got:
                        clash = f" ({d} = {sizes[d]} from an earlier input)" if got in dims[d] else ""
                        raise ValueError(
                            f"{entry}(): input {name!r} expects {want}{_dims_note(shape, dims)}{clash}; got {_describe(a)}"
                        )
                elif got != d:
                    raise ValueError(f"{entry}(): input {name!r} expects {want}{_dims_note(shape, dims)}; got {_describe(a)}")
            if dtype == "i32":
                if a.dtype.kind == "u" and a.size and a.max() > 2**31 - 1 or a.size and (a.min() < -(2**31) or a.max() > 2**31 - 1):
                    raise ValueError(f"{entry}(): input {name!r} has values outside the i32 range")
            arrays[name] = a.astype(_NP[dtype])
        key = self._program["variants"][entry][tuple(sorted(sizes.items()))]
        e = self._program["entries"][key]
        for name, bound in e["index_bounds"].items():
            a = arrays[name]
            if a.size and (a.min() < 0 or a.max() >= bound):
                bad = a[(a < 0) | (a >= bound)].ravel()[0]
                raise ValueError(f"{entry}(): input {name!r} holds index {int(bad)}, outside [0, {bound}) (nothing was run)")
        return key, arrays

    def _pack(self, key: str, arrays: dict, extra: dict) -> dict:
        """All inputs of one call in two arrays (one upload each), reused from call to call."""
        e = self._program["entries"][key]
        packed = self._staging.get(key)
        if packed is None:
            packed = self._staging[key] = {
                "inputs": np.zeros(e["input_sizes"]["inputs"], dtype=np.float32),
                "inputs_i32": np.zeros(e["input_sizes"]["inputs_i32"], dtype=np.int32),
            }
        for name, dtype, shape, arena, off in e["inputs"]:
            v = arrays[name] if name in arrays else extra[name]
            packed[arena][off : off + max(_size(shape), 1)] = np.asarray(v, dtype=_NP[dtype]).ravel()
        return packed

    def _step(self, inputs: dict, captures: bool):
        with self._lock:
            self._check_open()
            if "train" not in self._program["signatures"]:
                raise RuntimeError(f"{self._program['name']} was built without train=")
            key, arrays = self._pick("train", inputs)
            t = self.step_count + 1
            extra = {"_rng": rng.step_seed(self.seed, t)}
            if self._opt is not None:
                lr = schedules.lr_at(self._lr, t - self._lr_origin)
                extra.update(schedules.optimizer_scalars(tuple(self._opt), lr, t))
            packed = self._pack(key, arrays, extra)
            out = self._engine.run(key, packed, captures)
            self.step_count = t
            loss = float(out["loss"])
            if captures:
                return StepResult(loss, {n: out[n] for n, *_ in self._program["entries"][key]["captures"]})
            return loss

    def _infer(self, entry: str, inputs: dict, captures: bool):
        with self._lock:
            self._check_open()
            key, arrays = self._pick(entry, inputs)
            self._infer_calls += 1
            # infer call n draws from the seed's stream -n (mod 2**32), apart from training steps 1, 2, ...
            extra = {"_rng": rng.step_seed(self.seed, -self._infer_calls)}
            out = self._engine.run(key, self._pack(key, arrays, extra), captures)
            if captures:
                return InferResult(out["out"], {n: out[n] for n, *_ in self._program["entries"][key]["captures"]})
            return out["out"]

    # ---- checkpoints --------------------------------------------------------------------
    def _fingerprint(self) -> str:
        text = repr((self._program["name"], [(n, tuple(s)) for n, s, *_ in self._params], self._opt))
        return hashlib.sha1(text.encode()).hexdigest()

    def save(self, path) -> None:
        """Write params, optimizer state, step count, lr schedule position and seed to `path` (.npz).
        The file is written to a temporary name and renamed, so a crash never leaves a torn checkpoint."""
        with self._lock:
            self._check_open()
            path = os.fspath(path)
            state_n = self._program["arenas"].get("state", 0)
            data = {
                "__program__": np.array(self._program["name"]),
                "__fingerprint__": np.array(self._fingerprint()),
                "__step_count__": np.array(self.step_count, dtype=np.int64),
                "__seed__": np.array(self.seed, dtype=np.int64),
                "__lr__": np.array(repr(self._lr)),
                "__lr_origin__": np.array(self._lr_origin, dtype=np.int64),
                "__state__": self._engine.read("state", 0, state_n) if state_n else np.zeros(0, np.float32),
            }
            for n, a in self.params().items():
                data["param/" + n] = a
            folder = os.path.dirname(os.path.abspath(path))
            prefix = "." + os.path.basename(path)[:100] + "."
            fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".partial", dir=folder)
            try:
                with os.fdopen(fd, "wb") as f:
                    np.savez(f, **data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise
            # a writer killed outright (SIGKILL, power loss) could not remove its temporary
            # file: the next successful save of the same checkpoint does
            for stale in os.listdir(folder):
                if stale.startswith(prefix) and stale.endswith(".partial"):
                    try:
                        os.unlink(os.path.join(folder, stale))
                    except OSError:
                        pass

    def restore(self, path) -> None:
        """Load a checkpoint written by save(); training continues exactly where it left off."""
        with self._lock:
            self._check_open()
            with np.load(os.fspath(path), allow_pickle=False) as z:
                if "__fingerprint__" not in z:
                    raise ValueError(f"{path}: not an aot checkpoint")
                if str(z["__program__"]) != self._program["name"] or str(z["__fingerprint__"]) != self._fingerprint():
                    raise ValueError(
                        f"{path}: checkpoint of program {str(z['__program__'])!r} does not match this model "
                        f"({self._program['name']!r}: different parameters, shapes or optimizer)"
                    )
                params = {k[len("param/") :]: z[k] for k in z.files if k.startswith("param/")}
                state = z["__state__"]
                if state.size != self._program["arenas"].get("state", 0):
                    raise ValueError(f"{path}: optimizer state has {state.size} values, expected {self._program['arenas'].get('state', 0)}")
                lr = _parse_lr(str(z["__lr__"]))
                self.load_params(params)
                if state.size:
                    self._engine.write("state", 0, state.astype(np.float32))
                self.step_count = int(z["__step_count__"])
                self.seed = int(z["__seed__"])
                self._lr = lr
                self._lr_origin = int(z["__lr_origin__"])

    def close(self) -> None:
        """Release the GPU resources; calling it again does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for b in list(self._engine.buffers.values()) + list(self._engine.readback.values()):
                b.destroy()
            self._engine.device.destroy()


def _dims_note(shape, dims) -> str:
    syms = [d for d in shape if isinstance(d, str)]
    if not syms:
        return ""
    return " with " + ", ".join(f"{d} in {tuple(dims[d])}" for d in dict.fromkeys(syms))


def _parse_lr(text: str):
    import ast

    value = ast.literal_eval(text)
    return None if value is None else schedules.normalize(value)
