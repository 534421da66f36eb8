"""A generated Model's buffers (Module.buffer): non-trainable state on the GPU beside the
parameters, in two buffers of their own (`buffers` for f32, `buffers_i32` for i32), which
the training step updates (aot.assign) and every entry point reads.

Copied into every generated package next to model.py; the Model gets buffers(),
buffer_names and load_buffers() from BuffersMixin, and save/restore/reset/state_dict use
the helpers below.
"""

from __future__ import annotations

import numpy as np

from . import rng

_NP = {"f32": np.float32, "i32": np.int32}
ARENA = {"f32": "buffers", "i32": "buffers_i32"}


def _size(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _describe(a) -> str:
    return f"{a.dtype} array of shape {tuple(a.shape)}"


class BuffersMixin:
    """Uses the Model's _program["buffers"] ((name, shape, dtype, init, offset, PyTorch name)),
    _params (their count numbers the buffers' random streams), _engine, _lock, _check_open()."""

    @property
    def _buffer_table(self) -> list:
        return self._program.get("buffers") or []

    @property
    def buffer_names(self) -> list[str]:
        return [b[0] for b in self._buffer_table]

    def buffers(self) -> dict:
        """A copy of every buffer, by dotted name, in its declared shape and dtype (float32 or int32)."""
        with self._lock:
            self._check_open()
            flat = self._read_buffers()
            return {n: flat[dt][o : o + _size(s)].reshape(s).copy() for n, s, dt, _, o, _ in self._buffer_table}

    def load_buffers(self, values: dict, partial: bool = False) -> None:
        """Overwrite buffers by name, as load_params overwrites parameters: unknown names (and,
        unless partial, missing ones) raise KeyError, a wrong shape ValueError, a value that an
        i32 buffer cannot hold (a fraction, out of range) ValueError; nothing changes unless
        every value is valid."""
        with self._lock:
            self._check_open()
            self._write_named_buffers(self._check_buffers("load_buffers", values, partial))

    # ---- helpers for model.py and interop.py ----------------------------------------------------
    def _read_buffers(self) -> dict:
        """{dtype: the flat contents of its buffer}."""
        out = {}
        for dt, arena in ARENA.items():
            n = self._program["arenas"].get(arena, 0)
            out[dt] = self._engine.read(arena, 0, n, dt) if n else np.zeros(0, _NP[dt])
        return out

    def _check_buffers(self, what: str, values: dict, partial: bool) -> dict:
        """{name: array of the buffer's dtype} for `values`, or the error load_buffers raises."""
        known = {n: (tuple(s), dt) for n, s, dt, *_ in self._buffer_table}
        unknown = sorted(set(values) - set(known))
        if unknown:
            hint = " (parameters load with load_params)" if set(unknown) <= set(self.param_names) else ""
            raise KeyError(f"{what}: unknown buffer(s) {unknown}{hint}; this model has {sorted(known)}")
        missing = sorted(set(known) - set(values))
        if missing and not partial:
            raise KeyError(f"{what}: missing buffer(s) {missing} (pass partial=True to load a subset)")
        out = {}
        for n, v in values.items():
            shape, dt = known[n]
            a = np.asarray(v)
            if a.dtype.kind not in "fiub" or a.dtype == object:
                raise TypeError(f"{what}: {n!r} must be numeric, got {_describe(a)}")
            if tuple(a.shape) != shape:
                raise ValueError(f"{what}: {n!r} expects shape {shape}, got {tuple(a.shape)}")
            if dt == "i32" and a.size:
                if a.dtype.kind == "f" and not np.all(np.isfinite(a) & (a == np.round(a))):
                    raise ValueError(f"{what}: {n!r} is an i32 buffer; got values that are not whole numbers")
                if a.min() < -(2**31) or a.max() > 2**31 - 1:
                    raise ValueError(f"{what}: {n!r} is an i32 buffer; got values outside the i32 range")
            out[n] = a.astype(_NP[dt])
        return out

    def _write_named_buffers(self, arrays: dict) -> None:
        where = {n: (dt, o) for n, _, dt, _, o, _ in self._buffer_table}
        for n, a in arrays.items():
            dt, o = where[n]
            if a.size:
                self._engine.write(ARENA[dt], o, a.ravel())

    def _init_buffers(self) -> dict:
        """{dtype: flat initial contents}: each buffer from its init spec with the model seed, on
        the random stream after the parameters' (buffer j: stream len(params) + j)."""
        flat = {dt: np.zeros(self._program["arenas"].get(arena, 0), _NP[dt]) for dt, arena in ARENA.items()}
        for j, (_, s, dt, spec, o, _) in enumerate(self._buffer_table):
            v = rng.init_param(tuple(spec), tuple(s), self.seed, len(self._params) + j)
            flat[dt][o : o + _size(s)] = np.rint(v).astype(np.int32).ravel() if dt == "i32" else v.ravel()
        return flat

    def _write_buffers(self, flat: dict) -> None:
        for dt, a in flat.items():
            if a.size:
                self._engine.write(ARENA[dt], 0, a)
