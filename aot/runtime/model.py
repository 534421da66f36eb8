"""The Model class behind a generated package's API: input validation, parameters,
checkpoints, schedules and locking, over the device side in engine.py."""

from __future__ import annotations

import ast
import hashlib
import os
import re
import struct
import threading
import time
import weakref
import zipfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

try:
    import fcntl
except ImportError:  # Windows: an open file cannot be deleted there, which is all the lock is for
    fcntl = None

from . import rng, schedules
from .engine import _NP, Engine, ShaderError, _sigint_deferred, _size, cores  # noqa: F401  (ShaderError: the package re-exports it)
from .interop import InteropMixin
from .state import BuffersMixin
from .trains import TrainsMixin, train_entries

_PARALLEL_INIT = 1 << 20  # parameters from which Model() draws them in threads


@dataclass
class StepResult:
    loss: float
    captures: dict


@dataclass
class InferResult:
    output: np.ndarray
    captures: dict


def _input_dtype(arena: str):
    """inputs, inputs_1, ... hold f32; inputs_i32, inputs_i32_1, ... i32 (plan.arena_dtype)."""
    return np.int32 if arena.startswith("inputs_i32") else np.float32


def _indexed(a: np.ndarray, checks, stacked: bool):
    """(bound, the elements of `a` that index ops read with that bound) for an entry's
    index_bounds of one input: a bound for all of it, or [bound, offset, [[size, stride], ...]]
    per part (pipeline.index_bounds), with a fourth item where the part may also hold that one
    value (an ignore_index); each batch of a stacked input alike."""
    if isinstance(checks, int):
        yield checks, a
        return
    rows = np.ascontiguousarray(a).reshape(a.shape[0] if stacked else 1, -1)
    for bound, offset, dims, *allowed in checks:
        if rows.size == 0:
            continue
        used = np.lib.stride_tricks.as_strided(
            rows[:, offset:],
            shape=(rows.shape[0], *(n for n, _ in dims)),
            strides=(rows.strides[0], *(st * rows.itemsize for _, st in dims)),
            writeable=False,
        )
        yield bound, (used[used != allowed[0]] if allowed else used)


def _describe(a) -> str:
    a = np.asarray(a) if not isinstance(a, np.ndarray) else a
    return f"{a.dtype} array of shape {tuple(a.shape)}"


def _spec_str(dtype, dims) -> str:
    return f"{dtype}[{','.join(str(d) for d in dims)}]"


class ModelBase(InteropMixin, BuffersMixin, TrainsMixin):
    """Everything a generated Model shares; the subclass supplies the program's tables.
    PyTorch state_dicts and safetensors (load_state_dict, state_dict, load_safetensors,
    save_safetensors) come from InteropMixin (interop.py), buffers (buffers, load_buffers)
    from BuffersMixin (state.py)."""

    PROGRAM: dict = {}
    WGSL: dict = {}
    WGSL_CPU: dict = {}  # the kernels' variants for CPU adapters (kernels/cpu/)
    WGSL_SUBGROUP: dict = {}  # their variants with subgroup operations (kernels/subgroup/)

    def __init__(
        self, seed: int | None = None, adapter: int | str | None = None, kernels: str = "auto", shader_checks: bool = False
    ):
        p = self.PROGRAM
        self._lock = threading.RLock()
        self._closed = False
        self._program = p
        self._seed = rng.check_seed(p["seed"] if seed is None else seed, "Model(seed=...)")
        self._params = p["params"]  # (name, shape, init spec, decay, offset)
        self._total = sum(_size(s) for _, s, _, _, _ in self._params)
        self._engine = Engine(
            p["name"], self.WGSL, p["kernels"], p["arenas"], p["entries"], adapter, self.WGSL_CPU, kernels,
            self.WGSL_SUBGROUP, shader_checks,
        )
        self._opt = p.get("optimizer")  # the single training entry's (None with several: trains.py)
        self._trains = train_entries(p, self._total)
        self._staging: dict[str, dict] = {}
        self._seed_block = None  # (seed, first step, rng.step_seed of the next 256 steps)
        self.step_count = 0  # training steps of every entry (numbers their random streams)
        self._infer_calls = 0  # numbers the random streams of infer calls (ops.rand/randn/categorical)
        # an Infer-only program has no gradient arena (it is 0 long)
        self._has_grads = bool(self._trains)
        self.reset(params=True, optimizer=True)

    # ---- introspection ------------------------------------------------------------------
    @property
    def param_names(self) -> list[str]:
        return [n for n, *_ in self._params]

    @property
    def seed(self) -> int:
        """The seed of the initial parameters and of every step's random numbers: an int in [0, 2**64)."""
        return self._seed

    @seed.setter
    def seed(self, value) -> None:
        self._seed = rng.check_seed(value, "seed")

    @property
    def kernel_set(self) -> str:
        """The kernel set in use: "gpu"; "subgroup" (the GPU set with variants that use subgroup
        operations, chosen at Model() when the adapter offers them and the package has some); or
        "cpu" (variants for CPU adapters, chosen when the adapter is one, e.g. lavapipe or
        SwiftShader). Force a set with Model(kernels=...). kernel_set_reason says why."""
        return self._engine.kernel_set

    @property
    def kernel_set_reason(self) -> str:
        """Why Model() chose kernel_set: what the adapter says of itself ("a software adapter (its
        type is CPU: ...)", "a GPU (DiscreteGPU, ...)"), the probe kernels' times where it says
        nothing to go by, or that the set was asked for (Model(kernels=...))."""
        return self._engine.kernel_set_reason

    @property
    def adapter(self) -> dict:
        """The adapter this model runs on: index (in adapters(); None when wgpu chose it), name,
        type, backend, description and vendor."""
        return dict(self._engine.adapter_row)

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

    def grads(self, entry: str | None = None) -> dict:
        """Gradients of the training entry's last step (before clipping), zeros before its first
        step, for the parameters it trains (frozen ones have none). entry: which training entry
        (None: the only one)."""
        with self._lock:
            self._check_open()
            if not self._has_grads:
                raise RuntimeError(f"{self._program['name']} was built without train=: it has no gradients")
            return self._entry_grads(entry)

    def load_params(self, values: dict, partial: bool = False) -> None:
        """Overwrite parameters by name. Unknown names (and, unless partial, missing ones) raise
        KeyError, a wrong shape ValueError; nothing changes unless every value is valid."""
        with self._lock:
            self._check_open()
            self._write_params(self._check_params(values, partial))

    def _check_params(self, values: dict, partial: bool) -> dict:
        """{name: float32 array} for load_params' `values`, or the error it raises."""
        known = {n: (s, o) for n, s, _, _, o in self._params}
        unknown = sorted(set(values) - set(known))
        if unknown:
            hint = " (buffers load with load_buffers)" if set(unknown) <= set(self.buffer_names) else ""
            raise KeyError(f"load_params: unknown parameter(s) {unknown}{hint}; this model has {sorted(known)}")
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
        return arrays

    def _write_params(self, arrays: dict) -> None:
        where = {n: o for n, _, _, _, o in self._params}
        for n, a in arrays.items():
            self._engine.write("params", where[n], a.ravel())

    def _init_params(self) -> np.ndarray:
        flat = np.zeros(max(self._total, 1), dtype=np.float32)

        def init(i: int) -> None:
            _, s, spec, _, o = self._params[i]
            flat[o : o + _size(s)] = rng.init_param(tuple(spec), tuple(s), self.seed, i).ravel()

        # Every parameter has its own random stream and its own slice of `flat`, so they can be
        # drawn in any order: NumPy releases the GIL in its loops, and threads cut a large model's
        # Model() (transformer_large, 19M parameters: about 1 s in one thread) by the core count.
        order = sorted(range(len(self._params)), key=lambda i: -_size(self._params[i][1]))
        workers = min(8, cores(), len(order))
        if workers > 1 and self._total >= _PARALLEL_INIT:
            with ThreadPoolExecutor(workers) as pool:
                list(pool.map(init, order))
        else:
            for i in order:
                init(i)
        return flat

    def _state_buffers(self) -> list[tuple[str, int]]:
        """Optimizer state buffers in order (adam.m in `state`, adam.v in `state_1`): a checkpoint
        holds them concatenated as `__state__`."""
        return [(a, n) for a, n in self._program["arenas"].items() if n and (a == "state" or a.startswith("state_"))]

    def reset(self, params: bool = True, optimizer: bool = True, entry: str | None = None) -> None:
        """params: parameters and buffers back to the seed's initial values; optimizer: zero
        state and step_count (the learning rate set with set_lr is kept). entry: reset only that
        training entry's optimizer (its state, gradients and step count, as a new torch optimizer;
        step_count, which numbers every entry's steps, keeps counting); params= still means every
        parameter."""
        with self._lock:
            self._check_open()
            one = self._train_entry(entry, "reset") if entry is not None else None
            if params:
                self._engine.write("params", 0, self._init_params())
                self._write_buffers(self._init_buffers())
            if optimizer and one is not None:
                self._reset_entry(one)
            elif optimizer:
                for arena, n in self._state_buffers():
                    self._engine.write(arena, 0, np.zeros(n, dtype=np.float32))
                n_grads = self._program["arenas"].get("grads", 0)
                if self._has_grads and n_grads:  # no last step: grads() reads zeros, as on a new model
                    self._engine.write("grads", 0, np.zeros(n_grads, dtype=np.float32))
                self.step_count = 0
                for e in self._trains.values():
                    e.count = e.lr_origin = 0
                    for g in e.group_lrs:
                        g[1] = 0

    # ---- calls --------------------------------------------------------------------------
    def _check_open(self):
        if self._closed:
            raise RuntimeError(f"{self._program['name']}: the model is closed")

    def _pick(self, entry: str, inputs: dict, stacked: bool = False):
        """Validate inputs against the entry's declaration; returns (variant key, arrays of the
        declared dtypes). stacked: each input holds K batches on a new leading axis (step_many)."""
        decl = self._program["signatures"][entry]  # name -> (dtype, dims)
        # the method the user called, for messages
        method = _method(entry, stacked)
        unknown = sorted(set(inputs) - set(decl))
        if unknown:
            raise TypeError(f"{method}(): unknown input(s) {unknown}; expected {sorted(decl)}")
        missing = sorted(set(decl) - set(inputs))
        if missing:
            raise TypeError(f"{method}(): missing input(s) {missing}")
        arrays, sizes = {}, {}
        dims = self._program["dims"]
        lead = 1 if stacked else 0
        k = None
        for name, (dtype, shape) in decl.items():
            a = inputs[name]
            try:
                a = np.asarray(a)
            except Exception as e:
                raise TypeError(f"{method}(): input {name!r} is not array-like: {e}") from None
            want = _spec_str(dtype, shape)
            if stacked:
                want = f"K stacked {want}, shape (K, {', '.join(str(d) for d in shape)})"
            if a.dtype.kind not in "fiub" or a.dtype == object:
                raise TypeError(f"{method}(): input {name!r} expects {want}; got non-numeric {_describe(a)}")
            if dtype == "i32" and a.dtype.kind == "f":
                raise TypeError(f"{method}(): input {name!r} expects integer data ({want}); got {_describe(a)}")
            if a.ndim != len(shape) + lead:
                raise ValueError(
                    f"{method}(): input {name!r} expects {want}{_dims_note(shape, dims)}; got {_describe(a)}"
                )
            if stacked:
                if k is not None and a.shape[0] != k:
                    raise ValueError(
                        f"{method}(): input {name!r} expects {want} with K = {k} (from an earlier input); got {_describe(a)}"
                    )
                k = a.shape[0]
            for d, got in zip(shape, a.shape[lead:]):
                if isinstance(d, str):
                    if got not in dims[d] or sizes.setdefault(d, got) != got:
                        clash = f" ({d} = {sizes[d]} from an earlier input)" if got in dims[d] else ""
                        raise ValueError(
                            f"{method}(): input {name!r} expects {want}{_dims_note(shape, dims)}{clash}; got {_describe(a)}"
                        )
                elif got != d:
                    raise ValueError(
                        f"{method}(): input {name!r} expects {want}{_dims_note(shape, dims)}; got {_describe(a)}"
                    )
            if dtype == "i32" and a.size and not np.can_cast(a.dtype, np.int32):  # only wider ints can leave i32
                if a.min() < -(2**31) or a.max() > 2**31 - 1:
                    raise ValueError(f"{method}(): input {name!r} has values outside the i32 range")
            arrays[name] = a.astype(_NP[dtype], copy=False)
        if stacked and k == 0:
            raise ValueError(f"{method}(): no batches (the stacked inputs have K = 0)")
        key = self._program["variants"][entry][tuple(sorted(sizes.items()))]
        e = self._program["entries"][key]
        for name, checks in e["index_bounds"].items():
            for bound, used in _indexed(arrays[name], checks, stacked):
                if used.size and (used.min() < 0 or used.max() >= bound):
                    bad = used[(used < 0) | (used >= bound)].ravel()[0]
                    raise ValueError(
                        f"{method}(): input {name!r} holds index {int(bad)}, outside [0, {bound}) (nothing was run)"
                    )
        return key, arrays

    def _pack(self, key: str, arrays: dict, extra: dict) -> dict:
        """All inputs of one call in one array per input buffer (one upload each; two unless large
        inputs have buffers of their own), reused from call to call."""
        e = self._program["entries"][key]
        packed = self._staging.get(key)
        if packed is None:
            packed = self._staging[key] = {a: np.zeros(n, dtype=_input_dtype(a)) for a, n in e["input_sizes"].items()}
        for name, dtype, shape, arena, off in e["inputs"]:
            v = arrays[name] if name in arrays else extra[name]
            packed[arena][off : off + max(_size(shape), 1)] = np.asarray(v, dtype=_NP[dtype]).ravel()
        return packed

    def _train_seed(self, t: int) -> int:
        """rng.step_seed(self.seed, t), from a block of 256 computed at once (step() pays ~0.1 us)."""
        block = self._seed_block
        if block is None or block[0] != self._seed or not 0 <= t - block[1] < len(block[2]):
            block = self._seed_block = (self._seed, t, _step_seeds(self._seed, t, 256))
        return int(block[2][t - block[1]])

    def _step_scalars(self, t: int, e, count: int) -> dict:
        """The per-step inputs of training step t (1, 2, ... over every entry), entry e's step
        `count` (1, 2, ... of its own): its random seed, and the lr and bias corrections of the
        entry's optimizer (see schedules.optimizer_scalars) at that step."""
        return {"_rng": self._train_seed(t), **self._opt_scalars(e, count)}

    def _check_train(self, entry: str = "train"):
        self._check_open()
        if entry not in self._program["signatures"]:
            raise RuntimeError(f"{self._program['name']} was built without train=")

    def _step(self, inputs: dict, captures: bool, allreduce=None, entry: str = "train"):
        with self._lock:
            self._check_train(entry)
            if allreduce is not None:
                self._check_allreduce(allreduce)
            key, arrays = self._pick(entry, inputs)
            e = self._trains[entry]
            t, c = self.step_count + 1, e.count + 1
            packed = self._pack(key, arrays, self._step_scalars(t, e, c))

            def submitted():
                # with the submit, where a Ctrl-C cannot come between them: from there the GPU
                # runs the whole step, and save/restore must resume after it
                self.step_count, e.count = t, c

            if allreduce is None:
                out = self._engine.run(key, packed, captures, on_submit=submitted)
            else:
                out = self._step_reduced(key, packed, captures, allreduce, e, submitted)
            loss = float(out["loss"])
            if captures:
                return StepResult(loss, {n: out[n] for n, *_ in self._program["entries"][key]["captures"]})
            return loss

    def _check_allreduce(self, allreduce) -> None:
        if not callable(allreduce) and not _bucketed(allreduce):
            raise TypeError(
                f"step(allreduce=...) takes a function of the flat gradient vector, or a bucketed reducer (with "
                f"start(values, lo, hi) and finish(handle) methods), got {type(allreduce).__name__}"
            )

    def _step_reduced(self, key: str, packed: dict, captures: bool, allreduce, e, on_submit) -> dict:
        """One step whose gradients pass through allreduce between backward and update: the
        dispatches before the entry's update_from, one readback of the flat gradient vector
        (and the loss), allreduce, one upload of its result over the gradients, the rest of the
        dispatches. Clipping, weight decay, the lr schedule and the optimizer state then see
        the reduced gradients, as one process would. If allreduce raises or returns something
        unusable, the gradients of the last step are put back and nothing else has changed.
        A bucketed allreduce (one with start and finish: _step_bucketed) gets the gradients
        bucket by bucket while the backward pass still runs."""
        total = e.size  # the entry's gradient vector: grads[e.offset : e.offset + e.size]
        if _bucketed(allreduce) and self._engine.entries[key].get("buckets") and total:
            return self._step_bucketed(key, packed, captures, allreduce, e, on_submit)
        grads, out = self._engine.run_backward(key, packed, captures, total, e.offset)
        try:
            reduced = _checked_reduced(allreduce(grads), (total,), "the reduced gradients")
        except BaseException:
            self._engine.restore_grads(key, total, e.offset)
            raise
        self._engine.run_update(key, np.ascontiguousarray(reduced), e.offset, on_submit)
        return out

    def _step_bucketed(self, key: str, packed: dict, captures: bool, reducer, e, on_submit) -> dict:
        """_step_reduced through a bucketed allreduce: the package's gradient buckets (its
        "buckets" table, built by aot/buckets.py) are read back as soon as each is final
        (engine.run_buckets) into reducer.stage(n) (or an array of the model's), and handed to
        reducer.start(values, lo, hi) at once (or, where the reducer has start_mapped and it
        returns a handle, handed over straight from the mapped bucket: no host copy). Each result but the last (reducer.finish(handle))
        is waited for and uploaded by a thread of the model's, in bucket order, as soon as it
        arrives, while this thread reads and starts later buckets; the last is finished and
        uploaded here, and the update submitted after it. The same values reach the update as
        with one readback: bucketing changes only when. A reducer with `merge` set takes
        start(..., hold=True) (and start_mapped's): it keeps that bucket for one collective with
        the next ones of its group (engine.bucket_groups: buckets final together or at the end of
        the backward pass), started by the group's last bucket, whose handles then all finish;
        the last group's results are uploaded by the update's command buffer. bucket_timing: the
        host's seconds in this step's copies out of the mapped buckets, in start(), in finish()
        and in the uploads (the engine's last_timing has the map waits)."""
        total, eng = e.size, self._engine
        buckets = eng.entries[key]["buckets"]
        held = getattr(self, "_bucket_stage", None)  # (reducer, n, array): one reducer's at a time
        stage = held[2] if held is not None and held[0] is reducer and held[1] == total else None
        if stage is None:
            self._bind_reducer(reducer)
            stage = reducer.stage(total) if hasattr(reducer, "stage") else np.empty(total, dtype=np.float32)
            stage = _checked_reduced(stage, (total,), "stage(n)'s array", writable=True)
            self._bucket_stage = (reducer, total, stage)
        merge = bool(getattr(reducer, "merge", False))
        groups = eng.bucket_groups(key) if merge else list(range(len(buckets)))
        if hasattr(reducer, "begin"):
            reducer.begin([(lo, hi) for lo, hi, _ in buckets], **({"groups": groups} if merge else {}))
        started, uploads = [], []  # (i, lo, hi, handle) per bucket started; the uploader's futures
        spent = self.bucket_timing = dict.fromkeys(("copy_s", "start_s", "finish_s", "upload_s"), 0.0)
        clock = time.perf_counter
        failed = threading.Event()  # an upload raised: the uploader skips the rest

        def upload(i, lo, hi, handle, last=False):
            if failed.is_set():
                return
            try:
                t = clock()
                reduced = reducer.finish(handle)
                t1 = clock()
                eng._mark("finished", i)
                reduced = _checked_reduced(reduced, (hi - lo,), f"finish()'s result for gradients [{lo}, {hi})")
                eng.upload_bucket(i, np.ascontiguousarray(reduced), last=last)
                eng._mark("uploaded", i)
                spent["finish_s"] += t1 - t
                spent["upload_s"] += clock() - t1
            except BaseException:
                failed.set()
                raise

        direct = getattr(reducer, "start_mapped", None)
        tail = groups[-1]  # the last group's buckets are uploaded here, without a thread's hand-over
        handed = [0]  # buckets whose uploads went to the thread (started[:handed[0]])

        def each(i, lo, hi, values):
            hold = i + 1 < len(buckets) and groups[i + 1] == groups[i]  # its collective starts with a later bucket's
            kw = {"hold": True} if hold else {}
            t = t1 = clock()
            handle = direct(values, lo, hi, **kw) if direct is not None else None  # from the mapped bucket itself
            if handle is None:
                eng.copy(stage[lo:hi], values)
                t1 = clock()
                handle = reducer.start(stage[lo:hi], lo, hi, **kw)
            started.append((i, lo, hi, handle))
            spent["copy_s"] += t1 - t
            spent["start_s"] += clock() - t1
            if not hold and i < tail:  # this group's collective is under way: its uploads to the thread
                for s in started[handed[0] :]:
                    uploads.append(self._uploader().submit(upload, *s))
                handed[0] = len(started)

        try:
            out = eng.run_buckets(key, packed, captures, total, e.offset, each)
            if len(started) == len(buckets):
                if self._prepare_update:  # recorded while the last group's collective runs
                    eng.prepare_update(key)
                if self._prerecord:  # the next step's backward too: it then starts on the GPU at once
                    eng.prerecord(key, captures, total, e.offset)
                for s in started[tail:]:
                    upload(*s, last=True)
            for f in uploads:
                f.result()
            eng._mark("joined")  # every bucket uploaded: the update is recorded and submitted next
        except BaseException:
            failed.set()
            for f in uploads:  # the uploader must be done with the engine before the grads are put back
                f.exception()
            eng.restore_grads(key, total, e.offset)
            raise
        eng.run_update(key, None, e.offset, on_submit)
        return out

    _prepare_update = True  # False: the update recorded once the last bucket is uploaded (bench_ddp prepare=0)
    _prerecord = True  # False: each bucketed step records its backward when it starts (bench_ddp prerecord=0)

    def _bind_reducer(self, reducer) -> None:
        """The reducer's release() (its hold on the mapped buckets: CUDA's pinning) runs before
        the buckets go: when another reducer takes over, at close(), or when this model is
        collected without close() (a pinning outliving its memory would let CUDA read the old
        pages where a later buffer is mapped at the same address)."""
        old = getattr(self, "_reducer_release", None)
        if old is not None:
            old()  # a finalizer runs once: a later close or collection does nothing more
        release = getattr(reducer, "release", None)
        self._reducer_release = weakref.finalize(self, release) if callable(release) else None

    def _uploader(self) -> ThreadPoolExecutor:
        """The thread that finishes and uploads a bucketed step's buckets (one: in bucket order)."""
        pool = getattr(self, "_upload_pool", None)
        if pool is None:
            pool = self._upload_pool = ThreadPoolExecutor(1, thread_name_prefix="aot-upload")
        return pool

    def _step_many(self, batches, inputs: dict, captures: bool, allreduce=None, entry: str = "train"):
        """K training steps in a few submits; see the generated Model.step_many."""
        with self._lock:
            self._check_train(entry)
            if allreduce is not None:
                raise TypeError(
                    "step_many(allreduce=...) is not supported: step_many records K steps without waiting, "
                    "and an all-reduce needs each step's gradients on the host between backward and update. "
                    "Call step(**batch, allreduce=fn) once per batch instead"
                )
            method = _method(entry, True)
            given = {n: v for n, v in inputs.items() if v is not None}
            if batches is None:
                if not inputs:
                    raise TypeError(
                        f"{method}(): the training entry takes no inputs, so K cannot come from them: "
                        f"pass one empty dict per step, {method}([{{}}] * K)"
                    )
                key, arrays = self._pick(entry, given, stacked=True)
                k = len(next(iter(arrays.values())))
            else:
                if given:
                    raise TypeError(f"{method}(): pass batches or stacked inputs {sorted(given)}, not both")
                key, arrays, k = self._pick_batches(batches, entry)
            tr = self._trains[entry]
            t0, c0 = self.step_count, tr.count
            e = self._program["entries"][key]
            sizes = e["input_sizes"]

            def fill(start: int, n: int) -> dict:
                rows = {a: np.zeros((n, m), dtype=_input_dtype(a)) for a, m in sizes.items()}
                extras = [self._step_scalars(t0 + j, tr, c0 + j) for j in range(start + 1, start + n + 1)]
                for name, dtype, shape, arena, off in e["inputs"]:
                    width = max(_size(shape), 1)
                    if name in arrays:
                        v = arrays[name][start : start + n].reshape(n, width)
                    else:  # per-step scalars, converted as _pack converts step()'s
                        v = np.array([x[name] for x in extras], dtype=_NP[dtype]).reshape(n, width)
                    rows[arena][:, off : off + width] = v
                return rows

            def submitted(done: int):
                # with each submit, where a Ctrl-C cannot come between them: interrupted after some
                # chunks were submitted, the GPU runs those, so the model is at that step boundary,
                # and step_count says so (save/restore resume exactly)
                self.step_count, tr.count = t0 + done, c0 + done

            losses, out = self._engine.run_many(key, k, fill, captures, on_submit=submitted)
            if captures:
                return StepResult(losses, {n: out[n] for n, *_ in e["captures"]})
            return losses

    def _pick_batches(self, batches, entry: str = "train"):
        """step_many(batches): an iterable of dicts of one step's inputs, each validated as
        step() validates its inputs (the message names the batch), then stacked."""
        step, many = _method(entry, False), _method(entry, True)
        if isinstance(batches, dict):
            raise TypeError(
                f"{many}(): batches is an iterable of dicts (one per step); for stacked arrays "
                "pass them by name: step_many(x=..., ...)"
            )
        try:
            items = iter(batches)
        except TypeError:
            raise TypeError(
                f"{many}(): batches must be an iterable of dicts, got {type(batches).__name__}"
            ) from None
        # each batch is validated and copied as it is taken: a data loader that refills one set of
        # arrays for every batch would otherwise give K references to its last batch
        picked, key0 = [], None
        for i, b in enumerate(items):
            if not isinstance(b, dict):
                raise TypeError(f"{many}(): batch {i} is a {type(b).__name__}, expected a dict of inputs by name")
            try:
                key, arrays = self._pick(entry, b)
            except (TypeError, ValueError) as err:
                raise type(err)(f"{many}(): batch {i}: {str(err).replace(step + '(): ', '', 1)}") from None
            if key0 is not None and key != key0:
                raise ValueError(
                    f"{many}(): batch {i} has other sizes ({key}) than batch 0 ({key0}); one call takes one size"
                )
            key0 = key
            picked.append({n: np.array(a, copy=True) for n, a in arrays.items()})
        if not picked:
            raise ValueError(f"{many}(): no batches (the iterable was empty)")
        # K is the number of batches: a training entry without inputs (its data drawn with
        # ops.randn, say) has empty batches and still takes K steps
        return key0, {n: np.stack([a[n] for a in picked]) for n in picked[0]}, len(picked)

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
    def _single_entry(self):
        """The training entry of a program with one (its count is step_count), else None."""
        return next(iter(self._trains.values())) if len(self._trains) == 1 else None

    def _fingerprint(self) -> str:
        parts = (self._program["name"], [(n, tuple(s)) for n, s, *_ in self._params], self._opt)
        if self._buffer_table:  # a program without buffers keeps the fingerprint of older checkpoints
            parts += ([(n, tuple(s), dt) for n, s, dt, *_ in self._buffer_table],)
        if self._program.get("groups"):  # programs without groups keep their fingerprints
            parts += ([tuple(spec) for spec, _ in self._program["groups"]],)
        text = repr(parts)
        trains = self._program.get("trains")
        if trains is not None:  # several training entries, or frozen parameters: which trains what
            text += repr([(t["name"], t["optimizer"], t["params"], t.get("groups")) for t in trains.values()])
        return hashlib.sha1(text.encode()).hexdigest()

    def save(self, path) -> None:
        """Write params, buffers, optimizer state, step count, lr schedule position and seed to `path` (.npz).
        The file is written under a temporary name of its own and renamed over `path`, so a crash
        never leaves a torn checkpoint and, of several saves to one path, the last to finish wins whole."""
        with self._lock:
            self._check_open()
            path = os.fspath(path)
            one = self._single_entry()
            data = {
                "__program__": np.array(self._program["name"]),
                "__fingerprint__": np.array(self._fingerprint()),
                "__step_count__": np.array(self.step_count, dtype=np.int64),
                "__seed__": np.array(self.seed, dtype=np.uint64),
                "__lr__": np.array(repr(one.lr if one else None)),
                "__lr_origin__": np.array(one.lr_origin if one else 0, dtype=np.int64),
                **self._trains_save(),
                "__state__": np.concatenate(
                    [np.zeros(0, np.float32)] + [self._engine.read(a, 0, n) for a, n in self._state_buffers()]
                ),
            }
            for i, (lr, origin) in enumerate(one.group_lrs if one else ()):
                data[f"__lr_g{i}__"] = np.array(repr(lr))
                data[f"__lr_origin_g{i}__"] = np.array(origin, dtype=np.int64)
            for n, a in self.params().items():
                data["param/" + n] = a
            for n, a in self.buffers().items():
                data["buffer/" + n] = a
            _replace_atomically(path, lambda f: np.savez(f, **data))

    def _write_atomically(self, path: str, write) -> None:
        """InteropMixin's hook: files written like save()'s (a temporary file, then renamed)."""
        _replace_atomically(path, write)

    def _checkpoint_layout(self) -> dict:
        """Checkpoint member -> (kind, shape); kind "f4" is a float32 array, "i4" an int32 array, "i8" an int64 scalar,
        "seed" a uint64 scalar (int64 in older checkpoints), ("str", n) a string of at most n characters."""
        layout = {
            # another program's name or fingerprint still reads, for a message naming it
            "__program__": (("str", 1024), ()),
            "__fingerprint__": (("str", 1024), ()),
            "__step_count__": ("i8", ()),
            "__seed__": ("seed", ()),
            "__lr__": (("str", _MAX_LR_TEXT), ()),
            "__lr_origin__": ("i8", ()),
            "__state__": ("f4", (sum(n for _, n in self._state_buffers()),)),
        }
        one = self._single_entry()
        for i in range(len(one.group_lrs) if one else 0):
            layout[f"__lr_g{i}__"] = (("str", _MAX_LR_TEXT), ())
            layout[f"__lr_origin_g{i}__"] = ("i8", ())
        for n, s, *_ in self._params:
            layout["param/" + n] = ("f4", tuple(s))
        for n, s, dt, *_ in self._buffer_table:
            layout["buffer/" + n] = ("f4" if dt == "f32" else "i4", tuple(s))
        layout.update(self._trains_layout(_MAX_LR_TEXT))
        return layout

    def restore(self, path) -> None:
        """Load a checkpoint written by save(); training continues exactly where it left off.

        The whole file is read and checked first (every member's presence, dtype, shape and
        range, with sizes taken from the archive's headers before anything is read), and only
        then is the model changed: a refused checkpoint (ValueError; KeyError for a missing or
        unknown parameter) leaves the model as it was. Nothing in a checkpoint is executed."""
        with self._lock:
            self._checked_restore(path)()

    def _checked_restore(self, path):
        """Read and check the checkpoint at `path`, changing nothing; returns the function that
        then puts it in the model (distributed.restore checks every rank's copy first)."""
        with self._lock:
            self._check_open()
            layout = self._checkpoint_layout()
            z = _read_checkpoint(path, layout, self._program["name"], self._fingerprint())
            one = self._single_entry()
            step_count, seed, lr, origin = _checkpoint_values(path, z, one is not None and one.opt is not None)
            group_lrs = [_group_lr_values(path, z, i, step_count) for i in range(len(one.group_lrs) if one else 0)]
            entries = self._trains_read(path, z, _parse_lr)
            flat = np.zeros(max(self._total, 1), dtype=np.float32)
            for n, s, _, _, o in self._params:
                flat[o : o + _size(s)] = z["param/" + n].ravel()
            buffers = {n: z["buffer/" + n] for n in self.buffer_names}

        def commit():
            # everything is valid: only now does the model change, all of it (a Ctrl-C waits)
            with self._lock, _sigint_deferred():
                self._check_open()
                if self._total:
                    self._engine.write("params", 0, flat[: self._total])
                self._write_named_buffers(buffers)
                state, pos = z["__state__"], 0
                for arena, n in self._state_buffers():
                    self._engine.write(arena, 0, state[pos : pos + n])
                    pos += n
                self.step_count = step_count
                self._seed = seed
                if one is not None:
                    one.count, one.lr, one.lr_origin, one.group_lrs = step_count, lr, origin, group_lrs
                for e, count, e_lr, e_origin, e_groups in entries:
                    e.count, e.lr, e.lr_origin, e.group_lrs = count, e_lr, e_origin, e_groups

        return commit

    def close(self) -> None:
        """Release the GPU resources; calling it again does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if getattr(self, "_upload_pool", None) is not None:
                self._upload_pool.shutdown()
            if getattr(self, "_reducer_release", None) is not None:
                self._reducer_release()  # a reducer's hold on the mapped buckets ends before they do
            for b in list(self._engine.buffers.values()) + list(self._engine.readback.values()):
                b.destroy()
            self._engine.device.destroy()


def _bucketed(allreduce) -> bool:
    """Whether step(allreduce=...) got a bucketed reducer: start(values, lo, hi) -> handle and
    finish(handle) -> the reduced values (optional: stage(n), begin(buckets), start_mapped, and
    merge: start(..., hold=True) keeps a bucket for its group's one collective)."""
    return callable(getattr(allreduce, "start", None)) and callable(getattr(allreduce, "finish", None))


def _checked_reduced(reduced, shape: tuple, what: str, writable: bool = False) -> np.ndarray:
    """`reduced` if it is a float32 NumPy array of `shape`; else a TypeError/ValueError naming
    what step(allreduce=...) got and what it needs (nothing is updated then)."""
    if not isinstance(reduced, np.ndarray):
        hint = (
            " (reduced in place? return the array as well)"
            if reduced is None
            else (
                " (a torch tensor? return the NumPy array it shares memory with, or tensor.numpy())"
                if hasattr(reduced, "numpy")
                else ""
            )
        )
        raise TypeError(
            f"step(allreduce=...): {what} must be a float32 NumPy array of shape {shape}, got "
            f"{type(reduced).__name__}{hint}; nothing was updated"
        )
    if reduced.dtype != np.float32 or reduced.shape != shape or (writable and not reduced.flags.writeable):
        error = TypeError if reduced.dtype != np.float32 else ValueError
        raise error(
            f"step(allreduce=...): {what} must be a {'writable ' if writable else ''}float32 NumPy array of shape "
            f"{shape} (the shape and dtype it was given), got {_describe(reduced)}; nothing was updated"
        )
    return reduced


def _step_seeds(seed: int, t: int, n: int) -> np.ndarray:
    """[rng.step_seed(seed, t + i) for i in range(n)], vectorized (step_many's seeds; tested equal)."""
    ts = (np.arange(t, t + n, dtype=np.int64) & 0xFFFFFFFF).astype(np.uint64)
    word = np.uint64((seed & 0xFFFFFFFF) << 32) | ts
    high = (seed >> 32) & 0xFFFFFFFF
    if high:
        word ^= rng._splitmix64(np.array([high], dtype=np.uint64))[0]
    return (rng._splitmix64(word) & np.uint64(0x7FFFFFFF)).astype(np.int64)


def _method(entry: str, stacked: bool) -> str:
    """The generated method that runs `entry` (for messages): step/step_many, step_<name>/
    step_many_<name> for a training entry "train_<name>", the entry's own name otherwise."""
    if entry == "train":
        return "step_many" if stacked else "step"
    if entry.startswith("train_"):
        return ("step_many_" if stacked else "step_") + entry[len("train_"):]
    return entry


def _dims_note(shape, dims) -> str:
    syms = [d for d in shape if isinstance(d, str)]
    if not syms:
        return ""
    return " with " + ", ".join(f"{d} in {tuple(dims[d])}" for d in dict.fromkeys(syms))


def _checkpoint_values(path, z: dict, has_optimizer: bool):
    """(step count, seed, lr spec, lr origin) of a read checkpoint, each checked for range."""

    def bad(member, why):
        return ValueError(f"{path}: checkpoint member {member!r} {why}")

    step_count = z["__step_count__"]
    if not 0 <= step_count < 2**62:
        raise bad("__step_count__", f"must be a step count >= 0, got {step_count}")
    try:
        seed = rng.check_seed(z["__seed__"], "__seed__")
    except (TypeError, ValueError) as e:
        raise bad("__seed__", f"is not a seed: {e}") from None
    origin = z["__lr_origin__"]
    if not 0 <= origin <= step_count:
        raise bad("__lr_origin__", f"must be in [0, step count {step_count}], got {origin}")
    try:
        lr = _parse_lr(z["__lr__"])
    except (TypeError, ValueError) as e:
        raise bad("__lr__", f"is not a learning rate or schedule: {e}") from None
    if (lr is None) == has_optimizer:
        raise bad("__lr__", f"is {lr!r}, which does not fit this model's optimizer")
    return step_count, seed, lr, origin


def _group_lr_values(path, z: dict, i: int, step_count: int) -> list:
    """[lr spec, origin] of parameter group i in a read checkpoint, checked like __lr__'s."""
    origin = z[f"__lr_origin_g{i}__"]
    if not 0 <= origin <= step_count:
        raise ValueError(f"{path}: checkpoint member '__lr_origin_g{i}__' must be in [0, step count {step_count}], got {origin}")
    try:
        lr = _parse_lr(z[f"__lr_g{i}__"])
        if lr is None:
            raise ValueError("None is not a learning rate")
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: checkpoint member '__lr_g{i}__' is not a learning rate or schedule: {e}") from None
    return [lr, origin]


def _parse_lr(text: str):
    try:
        value = ast.literal_eval(text)
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as e:
        raise ValueError(f"{text[:80]!r} is not a literal ({type(e).__name__})") from None
    try:
        return None if value is None else schedules.normalize(value)
    except RecursionError:
        raise ValueError("the schedule is nested too deeply") from None


# ---- checkpoint files ---------------------------------------------------------------------------

_MAX_LR_TEXT = 32768  # characters of a saved lr spec (multistep keeps at most 1000 milestones)
_MAX_NPY_HEADER = 1024  # bytes of one member's .npy header (numpy writes 128)
_ZIP_SLACK = 1024  # bytes of zip bookkeeping per member besides its name (headers, zip64 extras)
_TEMP_SUFFIX = ".partial"
_STALE_AFTER_S = 60.0  # a temporary file untouched for this long, and unlocked, belongs to a dead writer


def _temp_prefix(path: str) -> str:
    """Hidden temporary names next to the target: '.<target name>.XXXXXXXX.partial' (the name cut
    to 100 bytes, so the whole stays under the usual 255-byte limit)."""
    base = os.path.basename(path).encode("utf-8", "surrogateescape")[:100].decode("utf-8", "ignore")
    return "." + base + "."


def _replace_atomically(path: str, write) -> None:
    """write(f) into a temporary file of its own in path's folder, then rename it over path."""
    # abspath("") is the current folder: the temporary file would land in its parent
    if not path:
        raise ValueError("cannot write a checkpoint to an empty path; give a file name")
    folder = os.path.dirname(os.path.abspath(path))
    prefix = _temp_prefix(path)
    tmp = f = None
    try:
        # a Ctrl-C between creating the file and holding it (or while cleaning up) would leave a
        # stray temporary file or an fd closed twice: it takes effect at the end of these blocks
        with _sigint_deferred():
            fd, tmp = _create_temp(folder, prefix)
            try:
                f = os.fdopen(fd, "wb")
            except BaseException:
                os.close(fd)
                raise
        if fcntl is not None:
            try:  # held until the file is closed: another save's cleanup leaves a locked file alone
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            except OSError:
                pass
        with f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with _sigint_deferred():
            if f is not None:
                f.close()  # (again, when it is closed already)
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:  # renamed already: the checkpoint is whole
                    pass
        raise
    _remove_stale_temps(folder, prefix)


def _create_temp(folder: str, prefix: str) -> tuple[int, str]:
    """A new file '<prefix>XXXXXXXX.partial' in folder, opened for writing. Unlike mkstemp (mode
    0600) it is created 0666 less the process's umask, so the checkpoint renamed from it gets the
    mode any other file the user writes gets."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(1000):
        tmp = os.path.join(folder, prefix + os.urandom(4).hex() + _TEMP_SUFFIX)
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name for {prefix!r} in {folder}")


def _remove_stale_temps(folder: str, prefix: str) -> None:
    """Remove what writers killed outright (SIGKILL, power loss) left: temporary files of this
    name that nobody holds locked and that have not been written to for a minute."""
    now = time.time()
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if not (name.startswith(prefix) and name.endswith(_TEMP_SUFFIX)):
            continue
        full = os.path.join(folder, name)
        try:
            if now - os.stat(full).st_mtime < _STALE_AFTER_S:
                continue
            if fcntl is not None:
                with open(full, "rb") as f:
                    try:
                        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        continue  # a live writer
            os.unlink(full)
        except OSError:
            pass


def _read_checkpoint(path, layout: dict, program: str, fingerprint: str) -> dict:
    """Read and check a checkpoint file against `layout` (member -> (kind, shape)); returns
    {member: value} (arrays as float32, ints as int, strings as str) or raises ValueError/KeyError.

    Memory stays bounded by the model's own checkpoint size: the file size is checked first,
    then every member's size from the zip central directory and its .npy header against the
    shape the model expects, before the member's data is read."""
    fpath = os.fspath(path)
    with open(fpath, "rb") as f:
        head = f.read(8)
        size = os.fstat(f.fileno()).st_size
        if head.startswith(b"\x93NUMPY"):
            raise ValueError(
                f"{path}: this is a .npy file (one array), not an aot checkpoint (a .npz written by Model.save)"
            )
        if not (head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06")):
            raise ValueError(f"{path}: not an aot checkpoint (Model.save writes .npz archives; this is not one)")
        limit = 65536 + sum(
            _ZIP_SLACK + 2 * len(m.encode("utf-8", "surrogateescape")) + _MAX_NPY_HEADER + _nbytes(kind, shape)
            for m, (kind, shape) in layout.items()
        )
        if size > limit:
            raise ValueError(
                f"{path}: not a checkpoint of {program}: it has {size} bytes, more than this model's "
                f"checkpoints can hold ({limit})"
            )
        f.seek(0)
        try:
            with zipfile.ZipFile(f) as zf:
                return _read_members(path, zf, layout, program, fingerprint)
        except zipfile.BadZipFile as e:
            raise ValueError(f"{path}: not an aot checkpoint, or a damaged one (bad .npz archive: {e})") from None
        except (EOFError, OSError, RuntimeError, NotImplementedError, UnicodeError) as e:
            raise ValueError(f"{path}: a damaged checkpoint ({type(e).__name__}: {e})") from None


def _nbytes(kind, shape) -> int:
    n = _size(shape)
    if kind in ("f4", "i4"):
        return 4 * n
    if kind in ("i8", "seed"):
        return 8
    return 4 * kind[1]


def _read_members(path, zf: zipfile.ZipFile, layout: dict, program: str, fingerprint: str) -> dict:
    infos = {}
    for info in zf.infolist():
        if info.filename in infos:
            raise ValueError(f"{path}: damaged checkpoint: member {info.filename!r} appears twice")
        infos[info.filename] = info
    names = {m[: -len(".npy")] if m.endswith(".npy") else m: m for m in infos}
    if len(names) != len(infos):
        raise ValueError(f"{path}: damaged checkpoint: a member appears twice (with and without '.npy')")
    if "__fingerprint__" not in names or "__program__" not in names:
        raise ValueError(f"{path}: not an aot checkpoint (it has no __program__/__fingerprint__ members)")
    out = {}

    def read(member):
        if member not in out:
            kind, shape = layout[member]
            out[member] = _read_npy(path, zf, infos[names[member]], member, kind, shape)
        return out[member]

    if read("__program__") != program or read("__fingerprint__") != fingerprint:
        raise ValueError(
            f"{path}: checkpoint of program {out['__program__']!r} does not match this model "
            f"({program!r}: different parameters, shapes or optimizer)"
        )
    unknown = sorted(set(names) - set(layout))
    missing = sorted(set(layout) - set(names))
    for what, found in (("unknown", unknown), ("missing", missing)):
        for prefix, kind in (("param/", "parameter"), ("buffer/", "buffer")):
            named = [m[len(prefix) :] for m in found if m.startswith(prefix)]
            if named:
                raise KeyError(f"{path}: {what} {kind}(s) {named} in the checkpoint")
        if found:
            raise ValueError(f"{path}: damaged checkpoint: {what} member(s) {found}")
    for member in layout:
        if names[member] != member + ".npy":
            raise ValueError(f"{path}: damaged checkpoint: member {names[member]!r} should be {member + '.npy'!r}")
        read(member)
    return out


_NPY_DESCR = {
    "f4": ("<f4", ">f4"),
    "i4": ("<i4", ">i4"),
    "i8": ("<i8", ">i8"),
    "seed": ("<u8", ">u8", "<i8", ">i8"),
}


def _read_npy(path, zf, info, member: str, kind, shape):
    """One .npy member, checked against (kind, shape) before its data is read."""

    def bad(why):
        return ValueError(f"{path}: checkpoint member {member!r} {why}")

    if info.flag_bits & 0x1:
        raise bad("is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise bad(f"uses an unsupported compression ({info.compress_type})")
    if info.file_size > 16 + _MAX_NPY_HEADER + _nbytes(kind, shape):
        raise bad(f"is {info.file_size} bytes long, more than a value of shape {shape} needs")
    try:
        with zf.open(info) as m:
            magic = m.read(8)
            if len(magic) != 8 or magic[:6] != b"\x93NUMPY" or magic[6] not in (1, 2, 3):
                raise bad("is not a .npy array")
            width = 2 if magic[6] == 1 else 4
            raw_len = m.read(width)
            if len(raw_len) != width:
                raise bad("is truncated")
            hlen = struct.unpack("<H" if width == 2 else "<I", raw_len)[0]
            if hlen > _MAX_NPY_HEADER:
                raise bad(f"has a {hlen}-byte .npy header (at most {_MAX_NPY_HEADER})")
            text = m.read(hlen)
            if len(text) != hlen:
                raise bad("is truncated")
            try:
                header = ast.literal_eval(text.decode("utf-8" if magic[6] == 3 else "latin1"))
            except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError, UnicodeError):
                raise bad("has an unreadable .npy header") from None
            if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
                raise bad("has an unreadable .npy header")
            descr, fortran, got = header["descr"], header["fortran_order"], header["shape"]
            if not isinstance(got, tuple) or tuple(got) != tuple(shape) or not all(type(d) is int for d in got):
                raise bad(f"has shape {got!r}, expected {tuple(shape)}")
            if not isinstance(fortran, bool):
                raise bad("has an unreadable .npy header")
            if kind in _NPY_DESCR:
                if descr not in _NPY_DESCR[kind]:
                    want = {"f4": "float32", "i4": "int32", "i8": "an int64 scalar", "seed": "a uint64 scalar"}[kind]
                    raise bad(f"has dtype {descr!r}, expected {want}")
            else:
                found = re.fullmatch(r"[<>|=]?U(\d{1,9})", descr) if isinstance(descr, str) else None
                if found is None or not 1 <= int(found.group(1)) <= kind[1]:
                    raise bad(f"has dtype {descr!r}, expected a string of at most {kind[1]} characters")
            dtype = np.dtype(descr)
            nbytes = _size(shape) * dtype.itemsize
            if info.file_size != 8 + width + hlen + nbytes:
                raise bad(f"is {info.file_size} bytes long in the archive; its header says {8 + width + hlen + nbytes}")
            data = m.read(nbytes)
            if len(data) != nbytes or m.read(1):
                raise bad("is truncated")
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
        raise bad(f"is damaged ({e})") from None
    values = np.frombuffer(data, dtype=dtype)
    if kind in ("f4", "i4"):
        a = values.astype(np.float32 if kind == "f4" else np.int32)
        return a.reshape(shape[::-1]).T.copy() if fortran else a.reshape(shape)
    if kind in ("i8", "seed"):
        return int(values[0])
    try:
        return str(values[0])
    except (ValueError, UnicodeError):
        raise bad("holds characters that are not text") from None
