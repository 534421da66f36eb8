"""The device side of a generated package: a wgpu device, one buffer per arena, one pipeline
per kernel (all created once), `run`, which records one call of an entry point into a
single compute pass and submit, and `run_many`, which records K training steps into a few
command buffers (one compute pass per step, each step's inputs copied from a slot of an
upload area, each loss copied to a slot of a readback ring) with no wait between steps.
Nothing is allocated per call; run_many's areas are allocated once, at a size that does not
depend on K. A training step whose gradients cross the host (run_backward, then run_update or
restore_grads) records the entry's dispatches in two passes cut at its `update_from`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .kernel_sets import recognise, time_kernel_sets, timed_choice


class _LazyWgpu:
    """wgpu, imported at its first use: importing it loads the native library and primes cffi's
    type names, which a build (that imports this module for the Model's names) never needs."""

    def __getattr__(self, name):
        try:
            import wgpu as module
        except ImportError as e:  # pragma: no cover - the package declares wgpu as a dependency
            raise ImportError("this model needs wgpu-py: pip install wgpu") from e
        globals()["wgpu"] = module
        return getattr(module, name)


wgpu = _LazyWgpu()

_NP = {"f32": np.float32, "i32": np.int32}

MANY_CHUNK = 32  # steps recorded per command buffer by run_many (one submit each)
# run_many of an entry with this many dispatches submits the first chunk of a call as 1 step, the
# next as 2, 4, ... up to its chunk size: the GPU starts after one step's recording, and each later
# chunk is recorded while the GPU runs the ones before. In one chunk the host recorded every step
# before the GPU began: ResNet-20's step_many(20) (179 dispatches) on an H200 ran 332 steps/s;
# a shorter entry records faster than the extra submits cost (scripts/bench_submit.py --many)
MANY_RAMP_MIN = 16
MANY_UPLOAD_BYTES = 8 << 20  # at most this much input per chunk: fewer steps per chunk for big batches
MANY_RING = 4096  # losses read back per map; run_many waits for the GPU only when this ring is full
# run() of an entry with this many dispatches submits its first FIRST_SUBMIT on their own, so the
# GPU works while the host records, finishes and submits the rest: transformer_large's step()
# (229 dispatches) 35.1-35.4 -> 33.9 ms on an H100 (scripts/bench_submit.py); a shorter entry
# costs less to record than a second submit
SPLIT_SUBMIT_MIN = 128
FIRST_SUBMIT = 16
# run_buckets submits its first BUCKET_FIRST_SUBMIT dispatches on their own where the first bucket
# is final later (0: not): the host records the rest while the GPU starts; without it the GPU
# waited for the whole first bucket's recording after each update (a bucketed step does not
# wait for its update, so the host's next step starts early enough to keep the GPU busy):
# transformer_large through buckets without communication 0.34 ms a step faster on an H200
BUCKET_FIRST_SUBMIT = FIRST_SUBMIT
# buckets final in the last 1/BUCKET_MERGE_SHARE of the backward's dispatches are reduced by one
# collective with the last bucket (bucket_groups; 0: every bucket its own, as before): on 2 H200s
# each NCCL mean that starts after the backward pass cost ~0.8-1 ms however small its bucket
# (transformer_large's last three, 0.1-26 MB: scripts/results/bench_ddp_h200x2_r5.json), and a
# layout that puts the norms and biases after every weight makes one of them a bucket of their own.
# transformer_large on 2 H200s, one launch (bench_ddp_h200x2_r6.json): 32 (its norms' bucket and
# the last, 3 MB, one collective; the 26 MB bucket final 12 dispatches before the end its own)
# 1.754x one GPU; 16 (all three, 29 MB, one collective: it ends 0.5 ms later) 1.735x; 0 1.708x
BUCKET_MERGE_SHARE = 32
# wgpu-native's feature that lets a mappable buffer be a copy source too: a bucket's readback
# buffer then takes its reduced values back (a reducer writing them into the mapped bucket) and
# the GPU copies them into the gradients from there (upload_via "readback": no host copy; on 2
# H200s transformer_large's NCCL step 0.9 ms shorter, 1.68x -> 1.72x one GPU: the host copies
# into the write maps had slowed the main thread's starts and the backward)
MAPPABLE_FEATURE = "mappable-primary-buffers"
# threads making an entry point's pipelines, at most one per core: transformer_large's cold first
# step on an H100 host of 16 cores takes 31-40 s on one, 5.1-5.4 s on 8, 2.5-2.7 s on 16
# (scripts/bench_startup.py --compile-workers, scripts/results/startup_large_h100_w*.json)
COMPILE_WORKERS = 64
# gradient buckets: host copies in and out of mapped buckets of at least COPY_SPLIT bytes are split
# over COPY_THREADS threads (NumPy copies without the GIL); one thread copies mapped memory at
# 6-10 GB/s on an H100 host, which made the copies of transformer_large's 76 MB the bulk of a
# data-parallel step's host time (scripts/bench_ddp.py)
COPY_THREADS = 8
# a data-parallel step of an entry of at most PRERECORD_MAX dispatches records the next step's
# backward while its last collective runs (prerecord): the addition transformer (64) on 2 H200s
# 1.45-1.51 -> 1.42-1.44 ms a step; transformer_large (216) records for ~1.5 ms, as long as its
# last collective takes, and lost 0.2-1.4 ms a step (37.6 -> 37.8-39.2 ms,
# scripts/results/bench_ddp_h200x2_r8.json)
PRERECORD_MAX = 128
MAP_POLL_S = 50e-6  # between the polls of a bucket's map (_RawMaps.wait)
# for the first MAP_SPIN_S of a map's wait the polls only yield (time.sleep(0)): a sleep of 50 us
# lasts ~100 us on Linux, time the GPU idles where the host's next move waits for that map.
# 0: 1 ms measured 1.34-1.92 ms a step of the addition transformer on 2 H200s against 1.42-1.44
# (bench_ddp mapspin_us, scripts/results/bench_ddp_h200x2_r8.json: the ranks' noise, no gain)
MAP_SPIN_S = 0.0
COPY_SPLIT = 1 << 20


class _Raw:
    """wgpu-native's C entry points for recording, called directly: wgpu-py's wrappers cost
    2-10 us of Python per call (error capture around each, a descriptor struct built per pass),
    and a step records 2-3 calls per kernel plus a pass and its copies, which made step_many
    host-bound (77 us of host per sine_mlp step on an H100 against ~60 us of GPU). Recording
    errors still surface: wgpu-native reports them at finish(), which goes through wgpu-py."""

    def __init__(self, api):
        lib, ffi = api.lib, api.ffi
        self.null = ffi.NULL
        self.set_pipeline = lib.wgpuComputePassEncoderSetPipeline
        self.set_bind_group = lib.wgpuComputePassEncoderSetBindGroup
        self.dispatch = lib.wgpuComputePassEncoderDispatchWorkgroups
        self.copy = lib.wgpuCommandEncoderCopyBufferToBuffer
        self._begin = lib.wgpuCommandEncoderBeginComputePass
        self._end = lib.wgpuComputePassEncoderEnd
        self._release = lib.wgpuComputePassEncoderRelease
        # one descriptor for every pass: no label, no timestamp writes (all fields zero)
        self._pass_desc = ffi.new("WGPUComputePassDescriptor *")
        self._ffi = ffi

    def offsets(self, dyn):
        """A dispatch's dynamic offset as the C array set_bind_group takes (None: none)."""
        return None if dyn is None else self._ffi.new("uint32_t[1]", [dyn])

    def begin(self, enc_internal):
        return self._begin(enc_internal, self._pass_desc)

    def end(self, pass_internal) -> None:
        self._end(pass_internal)
        self._release(pass_internal)


def _raw_encoder_calls():
    """_Raw, or None (use wgpu-py's public methods) when this wgpu-py does not expose them."""
    try:
        from wgpu.backends.wgpu_native import _api

        raw = _Raw(_api)
    except Exception:  # another backend or a wgpu-py without these internals
        return None
    return raw


# C types as wgpu-py and this module spell them when they allocate (ffi.new, ffi.cast)
_PRIMITIVES = ("char", "int32_t", "uint8_t", "uint32_t", "uint64_t", "intptr_t", "uintptr_t", "size_t", "float")
_SPELLINGS = ("{}", "{} *", "{} * ", "{}*", "{}[]", "{} []", "{}[1]")


def _ffi_type_names(model, declared: dict) -> dict:
    """name as code spells it -> cffi model type, for every typedef of the header and a few C
    primitives: the type itself, a pointer to it, an array of it. Callback (function) types are
    left out: code spells them out in full."""
    types = {name[8:]: tp for name, (tp, _quals) in declared.items() if name.startswith("typedef ")}
    types.update((p, model.PrimitiveType(p)) for p in _PRIMITIVES)
    out = {"void *": model.voidp_type}
    for name, tp in types.items():
        if isinstance(tp, (model.RawFunctionType, model.FunctionPtrType)):
            continue
        for spelling in _SPELLINGS:
            if "*" in spelling:
                built = model.PointerType(tp)
            elif "[" in spelling:
                built = model.ArrayType(tp, 1 if spelling.endswith("[1]") else None)
            else:
                built = tp
            out[spelling.format(name)] = built
    return out


def _prime_ffi_types() -> int:
    """Fill cffi's cache of parsed type names for wgpu's types, without parsing them.

    cffi turns a type name such as "WGPUBindGroupEntry[]" into a C type by running its C parser
    over a preamble that declares every typedef of the header (about 430 for wgpu.h): 10 ms a
    name, once per process. wgpu-py allocates its descriptors by name, so a cold start parsed
    about 45 names: 0.45 s of Python, most of Model() (0.31 -> 0.10 s on lavapipe) and 0.15 s of
    the first step. Every name's type is known from the header wgpu-py declared, so its entry is
    built from that declaration instead: the very C type object a parse gives (test_runtime
    compares them), 1,600 names in about 15 ms at import. Returns how many names it added; 0
    where this cffi or wgpu-py does not look as expected (cffi then parses as before)."""
    try:
        from cffi import model
        from wgpu.backends.wgpu_native import _api

        ffi = _api.ffi
        parsed = ffi._parsed_types
        names = _ffi_type_names(model, ffi._parser._declarations)
    except Exception:  # another backend, or cffi internals that changed
        return 0
    added = 0
    with ffi._lock:  # the lock cffi's own parse holds while it fills the cache
        for key, tp in names.items():
            if key in parsed:
                continue
            try:
                parsed[key] = (ffi._get_cached_btype(tp), False)  # False: not a function type
            except Exception:  # a type cffi cannot build (an array of an opaque struct): a parse fails alike
                continue
            added += 1
    return added


# Both need wgpu's native module: filled when the first Engine opens a device, so that importing
# this module (a build does, for the Model's names) loads no native library and primes nothing.
_PRIMED: int | None = None
_RAW = None
_TRUSTED = None
_MAPS = None  # _RawMaps (run_buckets)


def _ready_native() -> None:
    global _PRIMED, _RAW, _TRUSTED, _MAPS
    if _PRIMED is None:
        _PRIMED = _prime_ffi_types()
        _RAW = _raw_encoder_calls()
        _TRUSTED = _trusted_api()
        _MAPS = _raw_maps()


def cores() -> int:
    """The cores this process may run on (its affinity: a container's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _shader_module(device, label: str, code: str, checked: bool):
    """A shader module of generated WGSL. wgpu by default adds its own run-time checks to every
    shader: each array index clamped into bounds and each loop given an iteration limit. The
    kernels aot generates already read only in bounds whatever the data (every read index comes
    from an in-range output index or is clamped, loops have fixed bounds), so unless `checked`
    they are compiled without (wgpu-native's CreateShaderModuleTrusted): on an H100
    transformer_large's training call took 35.5 -> 33.7 ms of GPU time. `checked` (or a wgpu
    without that entry point): wgpu's checks, for chasing a suspected kernel bug."""
    _api = _TRUSTED
    if checked or _api is None:
        return device.create_shader_module(label=label, code=code)
    src = _api.new_struct_p("WGPUShaderSourceWGSL *", code=_api.to_c_string_view(code))
    src[0].chain.next = _api.ffi.NULL
    src[0].chain.sType = _api.lib.WGPUSType_ShaderSourceWGSL
    desc = _api.new_struct_p(
        "WGPUShaderModuleDescriptor *",
        nextInChain=_api.ffi.cast("WGPUChainedStruct *", src),
        label=_api.to_c_string_view(label),
    )
    no_checks = 0  # WGPUShaderRuntimeChecks_None
    mid = _api.libf.wgpuDeviceCreateShaderModuleTrusted(device._internal, desc, no_checks)
    return _api.GPUShaderModule(label, mid, device)


def _trusted_api():
    """wgpu-py's wgpu-native module where that has CreateShaderModuleTrusted, else None."""
    try:
        from wgpu.backends.wgpu_native import _api
    except Exception:  # another backend
        return None
    return _api if hasattr(_api.lib, "wgpuDeviceCreateShaderModuleTrusted") else None



class _RawMaps:
    """wgpu-native's submit, map and poll entry points, for moving gradient buckets while later
    dispatches still run (run_buckets, upload_bucket). wgpu-py's map_sync resolves in a thread
    that polls until the queue is idle (wgpuDevicePoll without a submission index), so the first
    bucket would arrive only with the last; here each submit's index is kept and a map waits
    for that submission alone. Only the engine's bucket buffers are mapped this way."""

    def __init__(self, api):
        lib, ffi = api.lib, api.ffi
        self.lib, self.ffi, self.done, self.tags = lib, ffi, {}, itertools.count(1)

        @ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
        def mapped(status, _message, user1, _user2):  # runs inside some thread's wgpuDevicePoll
            self.done[int(ffi.cast("intptr_t", user1))] = int(status)

        self._mapped = mapped  # kept alive as long as wgpu-native may call it
        self.success, self.read, self.write = lib.WGPUMapAsyncStatus_Success, lib.WGPUMapMode_Read, lib.WGPUMapMode_Write
        self.mode = lib.WGPUCallbackMode_AllowProcessEvents
        self.submit_for_index, self.poll = lib.wgpuQueueSubmitForIndex, lib.wgpuDevicePoll

    def submit(self, queue, *command_buffers) -> int:
        n = len(command_buffers)
        return self.submit_for_index(queue._internal, n, self.ffi.new(f"WGPUCommandBuffer[{n}]", [b._internal for b in command_buffers]))

    def request(self, buf, nbytes: int, write: bool = False) -> int:
        """Ask for buf to be mapped (it is once the GPU is done with it); returns a tag for wait."""
        tag = next(self.tags)
        info = self.ffi.new("WGPUBufferMapCallbackInfo *", {"mode": self.mode, "callback": self._mapped})
        info.userdata1 = self.ffi.cast("void *", tag)
        self.lib.wgpuBufferMapAsync(buf._internal, self.write if write else self.read, 0, nbytes, info[0])
        return tag

    def wait(self, device, tag: int, index: int | None) -> None:
        """Until the map `tag` is done (`index`: the submission it follows; unused): polls that
        do not block, MAP_POLL_S apart. A blocking poll (one that waits for a submission) holds
        the device as long: on 2 H200s the upload thread's maps and submits then waited for the
        next bucket's backward to end (bench_ddp --timeline: each upload ended just after the
        next bucket's map)."""
        null = self.ffi.NULL
        spin = time.perf_counter() + MAP_SPIN_S
        while tag not in self.done:
            self.poll(device._internal, False, null)
            if tag not in self.done:  # not yet, or another thread's poll took the callback
                time.sleep(0 if time.perf_counter() < spin else MAP_POLL_S)
        if self.done.pop(tag) != self.success:
            raise RuntimeError("could not map a gradient bucket's buffer (the device was lost?)")

    def mapped_range(self, buf, nbytes: int, write: bool = False):
        get = self.lib.wgpuBufferGetMappedRange if write else self.lib.wgpuBufferGetConstMappedRange
        return self.ffi.buffer(get(buf._internal, 0, nbytes), nbytes)

    def unmap(self, buf) -> None:
        self.lib.wgpuBufferUnmap(buf._internal)


def _raw_maps():
    """_RawMaps, or None (buckets are read back one submit at a time) without wgpu-native's internals."""
    try:
        from wgpu.backends.wgpu_native import _api

        return _RawMaps(_api) if hasattr(_api.lib, "wgpuQueueSubmitForIndex") else None
    except Exception:
        return None


class ShaderError(RuntimeError):
    """A generated kernel failed to compile on this adapter (please report it)."""


def bucket_groups(buckets: list, cut: int, share: int) -> list[int]:
    """Per bucket of a table (lo, hi, ready), in readback order: the index of the first bucket of
    the collective it is reduced by. Buckets final at one boundary are read back together and
    share one; so do the buckets final in the last cut // share dispatches (at least one) with
    the last bucket: what remains of the backward pass after them is too short to hide a
    collective of their own. share 0: one collective per bucket. Every rank computes the same
    groups from the same table (begin() checks the ranks' buckets agree)."""
    out: list[int] = []
    tail = cut - max(1, cut // share) if share > 0 else None
    for i, (_, _, ready) in enumerate(buckets):
        same = i and share > 0 and (ready == buckets[i - 1][2] or buckets[i - 1][2] >= tail)  # sorted by ready
        out.append(out[-1] if same else i)
    return out


def cpu_entry(entry: dict) -> dict:
    """An entry point as the CPU kernel set runs it: every kernel a dispatch of its own (the GPU
    set runs independent kernels together, which is slower on a CPU adapter)."""
    if "dispatches_cpu" not in entry:
        return entry
    out = dict(entry, dispatches=entry["dispatches_cpu"])
    if "update_from_cpu" in entry:
        out["update_from"] = entry["update_from_cpu"]
    if "buckets_cpu" in entry:
        out["buckets"] = entry["buckets_cpu"]
    return out


KERNEL_SETS = ("auto", "gpu", "subgroup", "cpu")
SUBGROUP_FEATURE = "subgroup"  # what the "subgroup" set's kernels need of the device


class Engine:
    """Device, buffers, pipelines and bind groups for one compiled program."""

    def __init__(
        self, name: str, wgsl: dict, kernels: dict, arenas: dict, entries: dict, adapter=None,
        wgsl_cpu: dict | None = None, kernel_set: str = "auto", wgsl_subgroup: dict | None = None,
        shader_checks: bool = False,
    ):
        _ready_native()
        if kernel_set not in KERNEL_SETS:
            raise ValueError(f"Model(kernels=...) must be one of {', '.join(map(repr, KERNEL_SETS))}, got {kernel_set!r}")
        self.name = name
        self.kernels = kernels
        self.shader_checks = bool(shader_checks)  # wgpu's run-time checks in the shaders (_shader_module)
        adapter, index = choose_adapter(adapter)
        self.adapter_info = dict(adapter.info)
        forced = kernel_set
        has_subgroups = SUBGROUP_FEATURE in adapter.features
        # the kernel set (kernel_sets.py): by what the adapter says of itself, else timed below
        known, why = recognise(self.adapter_info) if forced == "auto" else (forced, f"asked for (kernels={forced!r})")
        kernel_set = known or "gpu"
        if kernel_set == "subgroup" and not has_subgroups:
            raise RuntimeError(
                f"{name}: Model(kernels='subgroup') needs an adapter with WebGPU's '{SUBGROUP_FEATURE}' feature, "
                f"which {self.adapter_info.get('device') or 'this adapter'} does not offer; use kernels='gpu' or 'auto'"
            )
        said = why
        if forced == "auto" and kernel_set == "gpu" and wgsl_subgroup and has_subgroups:
            kernel_set, why = "subgroup", why + "; it offers subgroups"
        self.adapter_row = _adapter_row(index, adapter)
        # uploads from the readback buffers: only for bucketed training, with wgpu-native's maps
        self.readback_uploads = (
            _MAPS is not None and MAPPABLE_FEATURE in adapter.features and any(e.get("buckets") for e in entries.values())
        )
        features = [SUBGROUP_FEATURE] if kernel_set == "subgroup" else []
        self.device = adapter.request_device_sync(
            label=name,
            required_limits=_required_limits(name, adapter, arenas, entries),
            required_features=features + ([MAPPABLE_FEATURE] if self.readback_uploads else []),
        )
        self.probe_times = None  # {"cpu": ms, "gpu": ms} where the kernel set was timed
        if known is None:
            self.probe_times = time_kernel_sets(self.device, wgpu)
            chosen, timed = timed_choice(self.probe_times, said)
            if chosen == "cpu":
                kernel_set, why = chosen, timed
            else:
                why = timed + why[len(said):]
        if kernel_set == "cpu":
            wgsl = {**wgsl, **(wgsl_cpu or {})}
            entries = {key: cpu_entry(en) for key, en in entries.items()}
        self.entries = entries
        if kernel_set == "subgroup" and wgsl_subgroup:
            wrong = _lanes_out_of_order(self.device, wgsl_subgroup.values())
            if wrong and forced == "subgroup":
                raise RuntimeError(f"{name}: Model(kernels='subgroup') cannot run on this adapter: {wrong}; use kernels='gpu'")
            if wrong:
                kernel_set, why = "gpu", f"{why}; but {wrong}"
            else:
                wgsl = {**wgsl, **wgsl_subgroup}
        self.kernel_set_reason = why
        self.kernel_set = kernel_set
        self.buffers = {a: self._buffer(a, n) for a, n in arenas.items()}
        # Every kernel uses the same binding number for a buffer (its position in `arenas`), so a
        # run of neighbouring kernels that agree on each buffer's access mode shares one explicit
        # layout and one bind group: a pass re-binds only where the access modes change.
        self.order = list(arenas)
        self.wgsl = wgsl
        self.pipelines, self.recipes, self.kernel_group, self.entry_buffers = {}, {}, {}, {}
        self.kernel_offset = {}  # kernel -> the dynamic offset of its table's slot, or None
        self._groups = {}
        self._compiled: dict = {}  # (source without comments, id(layout)) -> pipeline
        self._layouts: dict = {}  # access signature -> (bind group layout, pipeline layout)
        self.raw_recipes, self._many = {}, {}
        self._spans: dict = {}  # (key, (lo, hi)) -> dispatches lo..hi-1 as _record replays them
        self._reduce_area: dict = {}  # key -> readback buffer of run_backward; "backup" -> saved grads
        self._waited = 0.0  # seconds spent in maps (waiting for the GPU) during the current call
        self._uploads = None  # run_buckets's step: the buckets uploaded so far and the maps pending
        self._prerecorded = None  # prerecord's (what it was recorded for, the command buffers)
        self._last_update = None  # the submission index of the last update after run_buckets
        # upload_bucket's way: "readback" (a result the reducer left in the bucket's mapped readback
        # buffer is copied from there by the GPU; any other by "map"), "map" (the bucket's
        # write-mapped buffer and a copy) or "write_buffer"
        self.upload_via = "readback" if self.readback_uploads else "map"
        self.trace = None  # a list: (event, bucket, perf_counter()) of each bucketed step (bench_ddp --timeline)
        # Pipelines are made at an entry point's first call, not here: a deployed model that only
        # predicts never compiles its training kernels (and Model() returns in a fraction of the
        # time: 245 pipelines of the addition transformer take 2.4 s on lavapipe).
        self.readback = {}
        for key, e in entries.items():
            n = sum(_size(shape) for _, _, shape, _, _ in e["outputs"] + e["captures"])
            self.readback[key] = self.device.create_buffer(
                size=max(4, 4 * n), usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
            )

    def _buffer(self, arena: str, n: int):
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        return self.device.create_buffer(label=arena, size=max(4, 4 * n), usage=usage)

    def _own_scratch(self, key: str) -> dict:
        """Scratch buffers an entry point needs beyond the shared ones (a large predict variant
        of a model whose shared scratch is sized for training)."""
        need = self.entries[key].get("arenas", {})
        return {a: n for a, n in need.items() if a.startswith("work") and 4 * n > self.buffers[a].size}

    def _prepare(self, key: str) -> None:
        """Pipelines, bind groups and the dispatch list of one entry point."""
        own = {a: self._buffer(a, n) for a, n in self._own_scratch(key).items()}
        tables = self._offset_tables(key)
        if tables:
            own[OFFSETS] = self._offsets_buffer(tables)
        self.entry_buffers[key] = dict(self.buffers, **own)
        runs: list[tuple[dict, list]] = []
        for kname, grid in self.entries[key]["dispatches"]:
            access = dict(self.kernels[kname][0])
            if kname in tables:
                # a run of its own, binding its offset table: kernels of one text then share
                # one layout and one pipeline
                access[OFFSETS] = "uniform"
                runs.append((access, [(kname, grid)]))
                continue
            # a run agrees on each buffer's access, also where one kernel binds it as vec4s
            modes = {_buffer_of(a): acc for a, acc in runs[-1][0].items()} if runs else {}
            if runs and OFFSETS not in modes and all(modes.get(_buffer_of(a), acc) == acc for a, acc in access.items()):
                runs[-1][0].update(access)
                runs[-1][1].append((kname, grid))
            else:
                runs.append((access, [(kname, grid)]))
        # (kernel, grid, its pipeline's key, layout, bind group or None where the previous one
        # holds, dynamic offset)
        todo = []
        for access, members in runs:
            sig = tuple(sorted(access.items(), key=lambda item: self._binding(item[0])))
            bound = {_buffer_of(a) for a in access}
            gkey = (sig, tuple(sorted((a, id(b)) for a, b in own.items() if a in bound)))
            if gkey not in self._groups:
                self._groups[gkey] = self._layout_and_group(sig, self.entry_buffers[key])
            layout, group = self._groups[gkey]
            for n, (kname, grid) in enumerate(members):
                self.kernel_group[kname] = group
                dyn = tables[kname][0] if kname in tables else None
                code = (_code_only(self.wgsl[kname]), id(layout))
                todo.append((kname, grid, code, layout, group if n == 0 else None, dyn))

        # One pipeline per source (comments aside) and layout, for the whole model: the CPU set's
        # kernels that differ only in their offset tables are compiled once, and an entry point
        # reuses what an earlier one compiled (predict, the forward kernels of train).
        first = {}
        for kname, _, code, layout, _, _ in todo:
            if code not in self._compiled:
                first.setdefault(code, (kname, layout))

        def make(item):
            kname, layout = item
            return self._pipeline(kname, self.wgsl[kname], self.kernels[kname][1], layout)

        # A driver that compiles at pipeline creation (a GPU's) compiles them on every core, the
        # longest sources first so that no long compile starts last.
        workers = min(COMPILE_WORKERS, cores(), len(first))
        if workers > 1:
            order = sorted(first, key=lambda code: -len(code[0]))
            with ThreadPoolExecutor(workers) as pool:
                self._compiled.update(zip(order, pool.map(make, [first[code] for code in order])))
        else:
            self._compiled.update((code, make(item)) for code, item in first.items())
        steps = []
        for kname, grid, code, _, group, dyn in todo:
            pipeline = self._compiled[code]
            self.pipelines[kname] = pipeline
            self.kernel_offset[kname] = dyn
            steps.append((pipeline, group, tuple(grid), dyn))
        self.recipes[key] = steps

    def _offset_tables(self, key: str) -> dict:
        """kernel -> (its slot's byte offset, its offset table) for the CPU set's kernels of `key`
        that read where their operands start from a table (plan.py: OFFSETS_BINDING)."""
        if self.kernel_set != "cpu":
            return {}
        tables = {}
        for kname, _grid in self.entries[key]["dispatches"]:
            about = self.kernels[kname]
            table = about[2] if len(about) > 2 else ()  # a record of two: no table
            if table and kname not in tables:
                tables[kname] = (OFFSETS_SLOT_BYTES * len(tables), tuple(table))
        return tables

    def _offsets_buffer(self, tables: dict):
        """A uniform buffer holding every table of `tables` in its slot."""
        words = OFFSETS_SLOT_BYTES // 4
        data = np.zeros(words * len(tables), dtype=np.uint32)
        for at, table in tables.values():
            data[at // 4 : at // 4 + len(table)] = table
        buf = self.device.create_buffer(
            label=OFFSETS, size=data.nbytes, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST
        )
        self.device.queue.write_buffer(buf, 0, data)
        return buf

    def _binding(self, name: str) -> int:
        """A buffer's binding number in every kernel (its vec4 alias's VEC_BINDING_BASE above)."""
        if name == OFFSETS:
            return OFFSETS_BINDING
        base = _buffer_of(name)
        return self.order.index(base) + (VEC_BINDING_BASE if base != name else 0)

    def _layout(self, sig):
        """(bind group layout, pipeline layout) of one access signature, made once: kernels of
        equal signatures in any entry point then share pipelines (_prepare)."""
        if sig not in self._layouts:
            kinds = {"read_write": {"type": "storage"}, "read": {"type": "read-only-storage"}}
            # an offset table: one slot of the entry's uniform buffer, chosen per dispatch
            kinds["uniform"] = {"type": "uniform", "has_dynamic_offset": True}
            bgl = self.device.create_bind_group_layout(
                entries=[
                    {"binding": self._binding(arena), "visibility": wgpu.ShaderStage.COMPUTE, "buffer": kinds[access]}
                    for arena, access in sig
                ]
            )
            self._layouts[sig] = (bgl, self.device.create_pipeline_layout(bind_group_layouts=[bgl]))
        return self._layouts[sig]

    def _layout_and_group(self, sig, buffers):
        bgl, layout = self._layout(sig)
        size = {a: OFFSETS_SLOT_BYTES if a == OFFSETS else buffers[_buffer_of(a)].size for a, _ in sig}
        group = self.device.create_bind_group(
            layout=bgl,
            entries=[
                {
                    "binding": self._binding(arena),
                    "resource": {"buffer": buffers[_buffer_of(arena)], "offset": 0, "size": size[arena]},
                }
                for arena, _access in sig
            ],
        )
        return layout, group

    def _pipeline(self, kname, source, site, layout):
        try:
            module = _shader_module(self.device, kname, source, self.shader_checks)
            return self.device.create_compute_pipeline(
                label=kname, layout=layout, compute={"module": module, "entry_point": "main"}
            )
        except Exception as e:
            raise ShaderError(
                f"kernel {kname} (from {site}) failed to compile:\n{e}\n{_wgsl_context(source, str(e))}"
            ) from None

    def write(self, arena: str, offset: int, data: np.ndarray):
        self.device.queue.write_buffer(self.buffers[arena], 4 * offset, np.ascontiguousarray(data))

    def read(self, arena: str, offset: int, count: int, dtype="f32") -> np.ndarray:
        if count == 0:
            return np.zeros(0, dtype=_NP[dtype])
        raw = self.device.queue.read_buffer(self.buffers[arena], 4 * offset, 4 * count)
        return np.frombuffer(raw, dtype=_NP[dtype]).copy()

    def _half(self, key: str, half: int) -> tuple[int, int]:
        """The dispatches of `key` before (half 0) or from (half 1) its update_from."""
        cut = self.entries[key]["update_from"]
        return (0, cut) if half == 0 else (cut, len(self.recipes[key]))

    def _span(self, key: str, span: tuple[int, int]) -> list:
        """Dispatches [lo, hi) of `key`, the first setting its bind group even where the whole
        list shares the one before (a pass starts with none bound)."""
        steps = self._spans.get((key, span))
        if steps is None:
            lo, hi = span
            steps = list(self.recipes[key][lo:hi])
            if lo and steps and steps[0][1] is None:
                group = next(g for _, g, _, _ in reversed(self.recipes[key][: lo + 1]) if g is not None)
                steps[0] = (steps[0][0], group) + steps[0][2:]
            self._spans[(key, span)] = steps
        return steps

    def _record(self, enc, key: str, span: tuple[int, int] | None = None) -> None:
        """One compute pass with every dispatch of `key` (or dispatches [lo, hi): _span)."""
        steps = self.recipes[key] if span is None else self._span(key, span)
        if not steps:
            return
        raw = self._raw_recipe(key if span is None else (key, span), steps)
        if raw is not None:
            self._record_raw(enc._internal, raw)
            return
        cpass = enc.begin_compute_pass()
        set_pipeline, set_bind_group, dispatch = cpass.set_pipeline, cpass.set_bind_group, cpass.dispatch_workgroups
        for pipeline, group, grid, dyn in steps:
            set_pipeline(pipeline)
            if group is not None:
                set_bind_group(0, group, () if dyn is None else (dyn,))
            dispatch(*grid)
        cpass.end()

    def _raw_recipe(self, rkey, steps):
        """The dispatches of `steps` as wgpu-native handles (cached), or None without _RAW."""
        raw = self.raw_recipes.get(rkey) if _RAW is not None else None
        if raw is None and _RAW is not None:
            try:
                raw = self.raw_recipes[rkey] = [
                    (p._internal, None if g is None else g._internal, grid, _RAW.offsets(dyn))
                    for p, g, grid, dyn in steps
                ]
            except AttributeError:
                raw = None
        return raw

    @staticmethod
    def _record_raw(enc_internal, raw) -> None:
        c = _RAW.begin(enc_internal)
        set_pipeline, set_bind_group, dispatch, null = _RAW.set_pipeline, _RAW.set_bind_group, _RAW.dispatch, _RAW.null
        for pipeline, group, (x, y, z), dyn in raw:
            set_pipeline(c, pipeline)
            if group is not None:
                if dyn is None:
                    set_bind_group(c, 0, group, 0, null)
                else:
                    set_bind_group(c, 0, group, 1, dyn)
            dispatch(c, x, y, z)
        _RAW.end(c)

    def _map_read(self, buf, nbytes: int) -> bytes:
        """Map a readback buffer written by the submit just made, copy `nbytes` out, unmap. A
        Ctrl-C while waiting takes effect once the buffer is unmapped again: raised halfway, it
        left the buffer mapped (or its map pending), and every later call failed on it."""
        global _NOSYNC
        with _sigint_deferred():
            t = time.perf_counter()
            if _NOSYNC:
                # wgpu-py's READ submits an empty command buffer first (a workaround for data written
                # through a mapping, which ours never is: the GPU writes it in the submit just made)
                try:
                    buf.map_sync("READ_NOSYNC", 0, nbytes)
                except Exception:
                    _NOSYNC = False
            if not _NOSYNC:
                buf.map_sync(wgpu.MapMode.READ, 0, nbytes)
            self._waited += time.perf_counter() - t
            try:
                return buf.read_mapped(0, nbytes, copy=True)
            finally:
                buf.unmap()

    def _reads(self, enc, key: str, want_captures: bool, rb=None, pos: int = 0) -> list:
        """Copy outputs (and captures) into the readback buffer `rb` (the entry's own by default)
        from element `pos` on."""
        e = self.entries[key]
        buffers = self.entry_buffers[key]
        reads = e["outputs"] + (e["captures"] if want_captures else [])
        rb = self.readback[key] if rb is None else rb
        for _, _, shape, arena, off in reads:
            n = _size(shape)
            enc.copy_buffer_to_buffer(buffers[arena], 4 * off, rb, 4 * pos, 4 * n)
            pos += n
        return reads

    def _unpack(self, key: str, reads: list, raw=None, pos: int = 0) -> dict:
        """The outputs copied by _reads, mapped from the entry's readback buffer (or taken from
        `raw`, mapped already, from element `pos` on)."""
        n = sum(_size(shape) for _, _, shape, _, _ in reads)
        out = {}
        if n:
            if raw is None:
                raw = self._map_read(self.readback[key], 4 * n)
            for name, dtype, shape, _, _ in reads:
                n = _size(shape)
                out[name] = np.frombuffer(raw, dtype=_NP[dtype], count=n, offset=4 * pos).reshape(shape).copy()
                pos += n
        return out

    def run(self, key: str, packed: dict, want_captures: bool, on_submit=None):
        """One call of an entry point: upload, one pass, writebacks, readback of outputs (+captures).
        on_submit(): called right after the submit, where a Ctrl-C cannot separate the two (the
        model counts its step there: from the submit on, the GPU runs the whole call)."""
        t0 = time.perf_counter()
        self._waited = 0.0
        e = self.entries[key]
        if key not in self.recipes:
            self._prepare(key)
        buffers = self.entry_buffers[key]
        for arena, data in packed.items():
            if data.size:
                self.write(arena, 0, data)
        count = len(self.recipes[key])
        if count >= SPLIT_SUBMIT_MIN:
            # the GPU starts on the first dispatches while the host records the rest
            enc = self.device.create_command_encoder()
            self._record(enc, key, (0, FIRST_SUBMIT))
            self.device.queue.submit([enc.finish()])
            enc = self.device.create_command_encoder()
            self._record(enc, key, (FIRST_SUBMIT, count))
        else:
            enc = self.device.create_command_encoder()
            self._record(enc, key)
        for src, so, dst, do, n in e["copies"]:
            enc.copy_buffer_to_buffer(buffers[src], 4 * so, buffers[dst], 4 * do, 4 * n)
        reads = self._reads(enc, key, want_captures)
        with _sigint_deferred():  # a Ctrl-C here must not separate the submit from its record
            self.device.queue.submit([enc.finish()])
            if on_submit is not None:
                on_submit()
        out = self._unpack(key, reads)
        # host time (upload, encoding, submit, unpacking) and time spent waiting for the GPU (the map)
        self.last_timing = (time.perf_counter() - t0 - self._waited, self._waited)
        return out

    def run_backward(self, key: str, packed: dict, want_captures: bool, total: int, offset: int = 0):
        """The first half of a training step whose gradients cross the host: upload, the
        dispatches before update_from (forward and backward), then one readback holding the flat
        gradient vector (elements [offset, offset + total) of the grads buffer) followed by the outputs (the
        loss) and captures, all final at this point. The grads buffer is saved on the GPU first,
        so restore_grads can undo the step. Returns (gradients: a new writable float32 [total]
        array, outputs/captures)."""
        t0 = time.perf_counter()
        self._waited = 0.0
        e = self.entries[key]
        if key not in self.recipes:
            self._prepare(key)
        buffers = self.entry_buffers[key]
        reads = e["outputs"] + (e["captures"] if want_captures else [])
        nbytes = 4 * (total + sum(_size(shape) for _, _, shape, _, _ in reads))
        rb = self._reduce_area.get(key)
        if rb is None or rb.size < nbytes:
            size = 4 * (total + sum(_size(shape) for _, _, shape, _, _ in e["outputs"] + e["captures"]))
            usage = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
            rb = self._reduce_area[key] = self.device.create_buffer(
                label="grads_readback", size=max(4, size), usage=usage
            )
        for arena, data in packed.items():
            if data.size:
                self.write(arena, 0, data)
        enc = self.device.create_command_encoder()
        self._backup_grads(enc, key, total, offset)
        self._record(enc, key, self._half(key, 0))
        if total:
            enc.copy_buffer_to_buffer(buffers["grads"], 4 * offset, rb, 0, 4 * total)
        self._reads(enc, key, want_captures, rb, total)
        self.device.queue.submit([enc.finish()])
        raw = self._map_read(rb, nbytes)
        grads = np.frombuffer(raw, dtype=np.float32, count=total)
        if not grads.flags.writeable:
            grads = grads.copy()
        out = self._unpack(key, reads, raw, total)
        self.last_timing = (time.perf_counter() - t0 - self._waited, self._waited)
        return grads, out

    def _bucket_buffers(self, key: str) -> tuple[list, list]:
        """Per gradient bucket of `key`, a mappable readback buffer and a mappable upload buffer
        (made at the first use). The readback buffer of the bucket read last also holds the
        entry's outputs and captures after the gradients when that bucket is final at the cut
        (run_buckets: one map fewer a step)."""
        bufs = self._reduce_area.get(("buckets", key))
        if bufs is None:
            read = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
            if self.readback_uploads:  # also the source of upload_via "readback"'s copies
                read |= wgpu.BufferUsage.COPY_SRC
            write = wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC
            e = self.entries[key]
            sizes = [max(4, 4 * (hi - lo)) for lo, hi, _ in e["buckets"]]
            extra = [0] * len(sizes)
            if self._outputs_ride(key):
                extra[-1] = 4 * sum(_size(shape) for _, _, shape, _, _ in e["outputs"] + e["captures"])
            bufs = self._reduce_area[("buckets", key)] = (
                [
                    self.device.create_buffer(label=f"grads_bucket_{i}", size=n + x, usage=read)
                    for i, (n, x) in enumerate(zip(sizes, extra))
                ],
                [self.device.create_buffer(label=f"grads_upload_{i}", size=n, usage=write) for i, n in enumerate(sizes)],
            )
        return bufs

    def _outputs_ride(self, key: str) -> bool:
        """Whether the outputs (the loss) of a bucketed step travel in the last bucket's readback:
        with wgpu-native's maps, when no dispatch runs between that bucket's boundary and the cut."""
        e = self.entries[key]
        return _MAPS is not None and bool(e["buckets"]) and e["buckets"][-1][2] == e["update_from"]

    def _backup_grads(self, enc, key: str, total: int, offset: int) -> None:
        """Save the gradients and the model's buffers on the GPU (restore_grads undoes a step)."""
        buffers = self.entry_buffers[key]
        backup = self._reduce_area.get("backup")
        if backup is None or backup.size < 4 * total:  # training entries' gradient vectors differ in size
            usage = wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
            backup = self._reduce_area["backup"] = self.device.create_buffer(
                label="grads_backup", size=max(4, 4 * total), usage=usage
            )
            self._prerecorded = None  # it copies into the old one
        if total:
            enc.copy_buffer_to_buffer(buffers["grads"], 4 * offset, backup, 0, 4 * total)
        for arena, saved in self._buffer_backups().items():  # the first half may update them in place
            enc.copy_buffer_to_buffer(buffers[arena], 0, saved, 0, saved.size)

    def copy(self, dst: np.ndarray, src: np.ndarray) -> None:
        """dst[...] = src, over COPY_THREADS threads when large (mapped memory, pinned memory)."""
        n = dst.size
        parts = min(COPY_THREADS, cores(), max(1, dst.nbytes // COPY_SPLIT))
        if parts < 2:
            np.copyto(dst, src)
            return
        if getattr(self, "_copiers", None) is None:
            self._copiers = ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="aot-copy")
        cuts = [n * k // parts for k in range(parts + 1)]
        list(self._copiers.map(lambda k: np.copyto(dst[cuts[k] : cuts[k + 1]], src[cuts[k] : cuts[k + 1]]), range(parts)))

    def run_buckets(self, key: str, packed: dict, want_captures: bool, total: int, offset: int, each) -> dict:
        """The first half of a training step whose gradients leave the GPU in buckets (the
        entry's "buckets" table, buckets.py): the dispatches before update_from split at the
        buckets' boundaries, one command buffer per boundary ending with copies of the buckets
        final there into their mappable buffers, each submitted as soon as it is recorded (the
        GPU starts while the host records the rest). Then, in that order, each bucket is mapped
        as soon as its own submission is done (later ones still running) and each(i, lo, hi,
        values) called with a read-only float32 view of gradient elements [lo, hi) of the
        entry's vector, valid during the call; each may upload_bucket results. The outputs (the
        loss) and captures come back in the last bucket's map where nothing runs after it
        (_outputs_ride), else in a readback of their own; returned. The gradients and buffers
        are saved first, as run_backward's; run_update then submits the update."""
        t0 = time.perf_counter()
        self._waited = 0.0
        e = self.entries[key]
        if key not in self.recipes:
            self._prepare(key)
        self._drop_uploads()
        buckets = e["buckets"]
        rbs, ups = self._bucket_buffers(key)
        for arena, data in packed.items():
            if data.size:
                self.write(arena, 0, data)
        maps = _MAPS if _MAPS is not None and not getattr(self, "serial_buckets", False) else None
        ride = maps is not None and self._outputs_ride(key)
        reads = e["outputs"] + (e["captures"] if want_captures else [])
        # in_place: per bucket, the mapped readback memory (address, bytes) a result may lie in,
        # and an event set once the bucket is unmapped (upload_bucket's copy from it waits for it)
        in_place = maps is not None and self.upload_via == "readback"
        self._uploads = {"key": key, "offset": offset, "maps": maps, "pending": {}, "copies": [], "in_place": in_place}
        self._uploads.update(mapped={}, unmapped={i: threading.Event() for i in range(len(buckets))})
        boundaries = []  # (submission index or None, the buckets final there)
        self._mark("step")
        pre, self._prerecorded = self._prerecorded, None
        parts = pre[1] if pre is not None and pre[0] == (key, want_captures, total, offset, ride) else None
        with _sigint_deferred():  # a Ctrl-C must not leave part of the step unsubmitted
            for command_buffer, final in parts or self._bucket_parts(key, want_captures, total, offset, ride):
                index = self._submit(command_buffer, maps)  # each as soon as it is recorded: the GPU starts
                if final is not None:
                    boundaries.append((index, final))
        self._mark("submitted")
        if maps is not None and self.upload_via == "map":  # the upload buffers, free once the last update that read them is done
            for i, (lo, hi, _) in enumerate(buckets):
                self._uploads["pending"][i] = maps.request(ups[i], 4 * (hi - lo), write=True)
        out = None
        for index, final in boundaries:
            for i in final:
                lo, hi, _ = buckets[i]
                n = 4 * (hi - lo)
                with_outputs = ride and i == len(buckets) - 1
                if with_outputs:
                    n += 4 * sum(_size(shape) for _, _, shape, _, _ in reads)
                t = time.perf_counter()
                if maps is None:  # wgpu-py's map waits for the queue to be idle: no overlap, the same values
                    view = self._map_read(rbs[i], n)
                else:
                    maps.wait(self.device, maps.request(rbs[i], n), index)
                    view = maps.mapped_range(rbs[i], n)
                self._waited += time.perf_counter() - t
                self._mark("mapped", i)
                try:
                    if with_outputs:
                        out = self._unpack(key, reads, view, hi - lo)
                    values = np.frombuffer(view, dtype=np.float32, count=hi - lo)
                    if in_place:  # writable: the reducer may leave its result here (upload_bucket)
                        self._uploads["mapped"][i] = (values.ctypes.data, values.nbytes)
                    else:
                        values.flags.writeable = False
                    each(i, lo, hi, values)
                finally:
                    if maps is not None:
                        maps.unmap(rbs[i])
                    self._uploads["unmapped"][i].set()
                self._mark("handed", i)
        if out is None:
            out = self._unpack(key, reads)
        self.last_timing = (time.perf_counter() - t0 - self._waited, self._waited)
        return out

    def _bucket_parts(self, key: str, want_captures: bool, total: int, offset: int, ride: bool):
        """run_buckets's command buffers, each yielded as soon as it is recorded, with the
        buckets final at its end (None for a part that ends at no boundary): the gradients'
        backup and the first BUCKET_FIRST_SUBMIT dispatches, then the dispatches up to each
        boundary with the copies of the buckets final there into their readback buffers (the
        outputs with the last where they ride), then what is left up to the cut with the outputs."""
        e, buffers = self.entries[key], self.entry_buffers[key]
        buckets, cut = e["buckets"], e["update_from"]
        rbs = self._bucket_buffers(key)[0]
        enc = self.device.create_command_encoder()
        self._backup_grads(enc, key, total, offset)
        done = 0
        first = BUCKET_FIRST_SUBMIT
        if 0 < first < min(r for _, _, r in buckets):
            self._record(enc, key, (0, first))
            yield enc.finish(), None
            enc, done = self.device.create_command_encoder(), first
        for ready in sorted({r for _, _, r in buckets}):
            self._record(enc, key, (done, ready))
            done = ready
            final = [i for i, (_, _, r) in enumerate(buckets) if r == ready]
            for i in final:
                lo, hi, _ = buckets[i]
                enc.copy_buffer_to_buffer(buffers["grads"], 4 * (offset + lo), rbs[i], 0, 4 * (hi - lo))
            if ride and ready == cut:
                lo, hi, _ = buckets[-1]
                self._reads(enc, key, want_captures, rbs[-1], hi - lo)
            yield enc.finish(), final
            enc = self.device.create_command_encoder()
        if not ride:
            self._record(enc, key, (done, cut))
            self._reads(enc, key, want_captures)
            yield enc.finish(), None

    def prerecord(self, key: str, want_captures: bool, total: int, offset: int) -> None:
        """Record the command buffers of the next run_buckets of `key` now (a data-parallel step
        calls it while its last collective runs and the host would only wait): that step then
        only writes its inputs and submits them, and the GPU starts its forward pass at once
        instead of after the host's recording: on 2 H200s the addition transformer's backward
        submitted 0.05 ms into a step instead of 0.28-0.36, its bucket mapped 0.1 ms sooner
        (1.45-1.51 -> 1.42-1.44 ms a step, scripts/results/bench_ddp_h200x2_r8.json). A
        recording never submitted is dropped; it changes nothing. Only for entries of at most
        PRERECORD_MAX dispatches: a longer recording delays the last collective's finish."""
        e = self.entries[key]
        if _MAPS is None or getattr(self, "serial_buckets", False) or not e.get("buckets") or len(e["dispatches"]) > PRERECORD_MAX:
            return
        if key not in self.recipes:
            self._prepare(key)
        ride = self._outputs_ride(key)
        parts = list(self._bucket_parts(key, want_captures, total, offset, ride))
        self._prerecorded = ((key, want_captures, total, offset, ride), parts)

    def bucket_groups(self, key: str) -> list[int]:
        """bucket_groups of the entry's table as this engine runs it (BUCKET_MERGE_SHARE)."""
        e = self.entries[key]
        return bucket_groups(e["buckets"], e["update_from"], BUCKET_MERGE_SHARE)

    def _mark(self, event: str, bucket: int = -1) -> None:
        """One event of a bucketed step's timeline, where self.trace is a list (bench_ddp --timeline)."""
        trace = self.trace
        if trace is not None:
            trace.append((event, bucket, time.perf_counter()))

    def _submit(self, command_buffer, maps) -> int | None:
        """Submit; the submission index where wgpu-native's maps are used (None otherwise)."""
        if maps is None:
            self.device.queue.submit([command_buffer])
            return None
        return maps.submit(self.device.queue, command_buffer)

    def upload_bucket(self, i: int, values: np.ndarray, last: bool = False) -> None:
        """Bucket i's reduced gradients (float32, contiguous) for the grads buffer, during or after
        run_buckets, from any one thread at a time: into its mapped upload buffer, copied into
        grads by a submit of its own (queued after the backward pass, it runs while the host
        still reduces later buckets), or with last=True (the step's last upload) by the update's
        command buffer (run_update: one submit fewer). With upload_via = "readback", `values`
        lying in bucket i's mapped readback memory (the reducer left its result there) is copied
        into grads from that buffer by the GPU (_upload_from_readback), no host copy. Without
        wgpu-native's internals, or with upload_via = "write_buffer", queue.write_buffer (wgpu's
        own staging, applied before the next submit; every backward submit is already in)."""
        up = self._uploads
        lo, hi, _ = self.entries[up["key"]]["buckets"][i]
        maps = up["maps"]
        if up["in_place"] and up["mapped"].get(i) == (values.ctypes.data, values.nbytes):
            self._upload_from_readback(i, lo, hi, last)
            return
        if maps is None or self.upload_via == "write_buffer":
            self.device.queue.write_buffer(self.entry_buffers[up["key"]]["grads"], 4 * (up["offset"] + lo), values)
            if maps is not None and not last:  # an empty submit: the copy runs now, not with the update
                maps.submit(self.device.queue, self.device.create_command_encoder().finish())
            return
        buf = self._bucket_buffers(up["key"])[1][i]
        tag = up["pending"].pop(i, None)  # asked for at the step's start, except with upload_via "readback"
        maps.wait(self.device, maps.request(buf, 4 * (hi - lo), write=True) if tag is None else tag, self._last_update)
        try:
            self.copy(np.frombuffer(maps.mapped_range(buf, 4 * (hi - lo), write=True), dtype=np.float32), values)
        finally:
            maps.unmap(buf)
        if last:
            up["copies"].append((buf, lo, hi))
            return
        enc = self.device.create_command_encoder()
        enc.copy_buffer_to_buffer(buf, 0, self.entry_buffers[up["key"]]["grads"], 4 * (up["offset"] + lo), 4 * (hi - lo))
        maps.submit(self.device.queue, enc.finish())

    def _upload_from_readback(self, i: int, lo: int, hi: int, last: bool) -> None:
        """upload_bucket of a result the reducer left in bucket i's readback buffer (upload_via
        "readback"): a GPU copy from that buffer into the gradients, once run_buckets has
        unmapped it; with last=True by the update's command buffer."""
        up = self._uploads
        up["unmapped"][i].wait()
        buf = self._bucket_buffers(up["key"])[0][i]
        if last:
            up["copies"].append((buf, lo, hi))
            return
        enc = self.device.create_command_encoder()
        enc.copy_buffer_to_buffer(buf, 0, self.entry_buffers[up["key"]]["grads"], 4 * (up["offset"] + lo), 4 * (hi - lo))
        up["maps"].submit(self.device.queue, enc.finish())

    def _drop_uploads(self) -> None:
        """Unmap the upload buffers a failed step left mapped (or waiting to be), and forget its uploads."""
        up = getattr(self, "_uploads", None)
        self._uploads = None
        if up is None or up["maps"] is None:
            return
        ups = self._bucket_buffers(up["key"])[1]
        for i, tag in up["pending"].items():
            up["maps"].wait(self.device, tag, self._last_update)
            up["maps"].unmap(ups[i])

    def prepare_update(self, key: str) -> None:
        """During a bucketed step, once every bucket is read back: record run_update's dispatches
        and writeback copies now, while the last reductions are under way, so that run_update
        has only the last buckets' copies left to record before its submit (the host's
        recording and finishing of the update's command buffer was on the path from the last
        result to the update's submit: 0.2 ms a step on an H200, bench_ddp --timeline "joined"
        to "update"). Where wgpu-native's maps are not used, run_update records it all."""
        up = getattr(self, "_uploads", None)
        if up is None or up["maps"] is None or up["key"] != key:
            return
        up["prepared"] = self._update_commands(key)

    def _update_commands(self, key: str):
        """The update's command buffer: the dispatches from update_from on and the writeback copies."""
        e, buffers = self.entries[key], self.entry_buffers[key]
        enc = self.device.create_command_encoder()
        self._record(enc, key, self._half(key, 1))
        for src, so, dst, do, n in e["copies"]:
            enc.copy_buffer_to_buffer(buffers[src], 4 * so, buffers[dst], 4 * do, 4 * n)
        return enc.finish()

    def run_update(self, key: str, grads: np.ndarray | None, offset: int = 0, on_submit=None) -> None:
        """The second half: upload `grads` (float32 [total], contiguous) over the grads buffer (from
        element `offset` on: a training entry's gradient vector) and
        record the dispatches from update_from on, and the writeback copies (or take them as
        prepare_update recorded them, after a command buffer of the last buckets' copies, in
        one submit). Submitted without waiting: whatever reads the device next is ordered after it.
        on_submit(): right after the submit, where a Ctrl-C cannot separate the two (run's)."""
        buffers = self.entry_buffers[key]
        if grads is not None and grads.size:  # None: uploaded in buckets (run_buckets, upload_bucket)
            self.device.queue.write_buffer(buffers["grads"], 4 * offset, grads)
        up, self._uploads = self._uploads, None
        prepared = up.get("prepared") if up is not None else None
        copies = up["copies"] if up is not None else ()  # upload_bucket(last=True)'s
        if prepared is not None:
            parts = [prepared]
            if copies:
                enc = self.device.create_command_encoder()
                for buf, lo, hi in copies:
                    enc.copy_buffer_to_buffer(buf, 0, buffers["grads"], 4 * (offset + lo), 4 * (hi - lo))
                parts.insert(0, enc.finish())
            with _sigint_deferred():
                self._last_update = up["maps"].submit(self.device.queue, *parts)
                if on_submit is not None:
                    on_submit()
            self._mark("update")
            return
        e = self.entries[key]
        enc = self.device.create_command_encoder()
        for buf, lo, hi in copies:
            enc.copy_buffer_to_buffer(buf, 0, buffers["grads"], 4 * (offset + lo), 4 * (hi - lo))
        self._record(enc, key, self._half(key, 1))
        for src, so, dst, do, n in e["copies"]:
            enc.copy_buffer_to_buffer(buffers[src], 4 * so, buffers[dst], 4 * do, 4 * n)
        with _sigint_deferred():
            if up is not None and up["maps"] is not None:
                self._last_update = up["maps"].submit(self.device.queue, enc.finish())
            else:
                self.device.queue.submit([enc.finish()])
            if on_submit is not None:
                on_submit()
        self._mark("update")

    def restore_grads(self, key: str, total: int, offset: int = 0) -> None:
        """Undo run_backward: the grads buffer, and the model's buffers (Module.buffer), as they
        were before it (the update never ran)."""
        self._drop_uploads()
        enc = self.device.create_command_encoder()
        if total:
            enc.copy_buffer_to_buffer(self._reduce_area["backup"], 0, self.entry_buffers[key]["grads"], 4 * offset, 4 * total)
        for arena, saved in self._buffer_backups().items():
            enc.copy_buffer_to_buffer(saved, 0, self.buffers[arena], 0, saved.size)
        self.device.queue.submit([enc.finish()])

    def _buffer_backups(self) -> dict:
        """Copies of the buffers and buffers_i32 arenas (those the program has) for run_backward."""
        out = {}
        for arena in ("buffers", "buffers_i32"):
            if arena in self.buffers:
                key = "backup_" + arena
                if key not in self._reduce_area:
                    usage = wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
                    self._reduce_area[key] = self.device.create_buffer(
                        label=key, size=self.buffers[arena].size, usage=usage
                    )
                out[arena] = self._reduce_area[key]
        return out

    def many_slots(self, key: str) -> int:
        """Steps per chunk of run_many for this entry: MANY_CHUNK, fewer for large inputs."""
        sizes = self.entries[key]["input_sizes"]
        per_step = 4 * sum(sizes.values())
        return max(1, min(MANY_CHUNK, MANY_UPLOAD_BYTES // max(per_step, 1)))

    def _many_area(self, key: str):
        """The upload slots (one per step of a chunk, per input arena) and the loss ring of
        run_many, created at the first call; their sizes depend on the entry, not on K."""
        area = self._many.get(key)
        if area is None:
            sizes = self.entries[key]["input_sizes"]
            slots = self.many_slots(key)
            usage = wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
            stage = {
                a: self.device.create_buffer(label=f"{a}_slots", size=4 * slots * n, usage=usage)
                for a, n in sizes.items()
                if n
            }
            ring = self.device.create_buffer(
                label="loss_ring", size=4 * MANY_RING, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
            )
            area = self._many[key] = (slots, stage, ring, MANY_RING)
        return area

    def run_many(self, key: str, k: int, fill, want_captures: bool, on_submit=None):
        """k training steps of `key`. fill(start, n) -> {arena: array [n, input size]} gives the
        packed inputs of steps start .. start + n - 1 (one row per step, laid out as run's).
        Chunks of many_slots(key) steps: one upload, one command buffer and one submit each,
        and no wait; every step's loss goes to a slot of a ring read back when it is full and
        at the end. Returns (losses [k] float32, outputs/captures of the last step or None).
        on_submit(steps submitted so far): after each submit, where a Ctrl-C cannot separate the
        two (the model keeps its step count there)."""
        t0 = time.perf_counter()
        self._waited = 0.0
        e = self.entries[key]
        if key not in self.recipes:
            self._prepare(key)
        buffers = self.entry_buffers[key]
        slots, stage, ring, ring_slots = self._many_area(key)
        sizes = e["input_sizes"]
        ((_, _, _, loss_arena, loss_off),) = [o for o in e["outputs"] if o[0] == "loss"]
        loss_buf = buffers[loss_arena]
        copy_after = [(buffers[src], 4 * so, buffers[dst], 4 * do, 4 * n) for src, so, dst, do, n in e["copies"]]
        losses = np.empty(k, dtype=np.float32)
        recipe = self._raw_recipe(key, self.recipes[key])
        if recipe is not None:
            raw_stage = [(arena, buf._internal) for arena, buf in stage.items()]
            raw_buffers = {arena: buf._internal for arena, buf in buffers.items()}
            raw_loss, raw_ring = loss_buf._internal, ring._internal
        in_ring = 0  # losses in the ring not yet read back
        reads = None
        start = chunk = 0
        ramp = len(self.recipes[key]) >= MANY_RAMP_MIN
        while start < k:
            n = min(many_chunk(chunk, slots, ramp), k - start, ring_slots - in_ring)
            chunk += 1
            packed = fill(start, n)
            for arena, rows in packed.items():
                if arena in stage:
                    self.device.queue.write_buffer(stage[arena], 0, np.ascontiguousarray(rows))
            enc = self.device.create_command_encoder()
            if recipe is not None:  # the same commands through wgpu-native's C entry points
                c, copy = enc._internal, _RAW.copy
                for i in range(n):
                    for arena, buf in raw_stage:
                        m = sizes[arena]
                        copy(c, buf, 4 * i * m, raw_buffers[arena], 0, 4 * m)
                    self._record_raw(c, recipe)
                    for src, so, dst, do, nb in copy_after:
                        copy(c, src._internal, so, dst._internal, do, nb)
                    copy(c, raw_loss, 4 * loss_off, raw_ring, 4 * (in_ring + i), 4)
            else:
                copy = enc.copy_buffer_to_buffer
                for i in range(n):
                    for arena, buf in stage.items():
                        m = sizes[arena]
                        copy(buf, 4 * i * m, buffers[arena], 0, 4 * m)
                    self._record(enc, key)
                    for args in copy_after:
                        copy(*args)
                    copy(loss_buf, 4 * loss_off, ring, 4 * (in_ring + i), 4)
            last = start + n == k
            if last and want_captures:
                reads = self._reads(enc, key, True)
            with _sigint_deferred():  # a Ctrl-C here must not separate the submit from its count
                self.device.queue.submit([enc.finish()])
                if on_submit is not None:
                    on_submit(start + n)
            start += n
            in_ring += n
            if in_ring == ring_slots or last:
                raw = self._map_read(ring, 4 * in_ring)
                losses[start - in_ring : start] = np.frombuffer(raw, dtype=np.float32, count=in_ring)
                in_ring = 0
        out = None if reads is None else self._unpack(key, reads)
        self.last_timing = (time.perf_counter() - t0 - self._waited, self._waited)
        return losses, out


def many_chunk(i: int, slots: int, ramp: bool) -> int:
    """Most steps in the i-th chunk (from 0) of a run_many call: `slots`, or with the ramp
    (MANY_RAMP_MIN) 1, 2, 4, ... up to `slots`."""
    return min(slots, 1 << min(i, 30)) if ramp else slots


@contextlib.contextmanager
def _sigint_deferred():
    """Hold a Ctrl-C (SIGINT) that arrives inside the block until it ends, then raise it: in the
    main thread, where Python runs signal handlers; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    caught = []
    previous = signal.signal(signal.SIGINT, lambda *a: caught.append(a))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def adapters() -> list[dict]:
    """The WebGPU adapters wgpu finds, in the order Model(adapter=i) counts them: one dict per
    adapter with its index, name, type (DiscreteGPU, IntegratedGPU, CPU, ...), backend (Vulkan,
    Metal, D3D12, OpenGL), description and vendor. A GPU reachable through several backends is
    listed once per backend."""
    return [_adapter_row(i, a) for i, a in enumerate(wgpu.gpu.enumerate_adapters_sync())]


def _adapter_row(index, adapter) -> dict:
    info = adapter.info
    return {
        "index": index,
        "name": info.get("device", ""),
        "type": info.get("adapter_type", ""),
        "backend": info.get("backend_type", ""),
        "description": info.get("description", ""),
        "vendor": info.get("vendor", ""),
    }


def _adapter_list(found) -> str:
    rows = [_adapter_row(i, a) for i, a in enumerate(found)]
    if not rows:
        return "  (none)"
    return "\n".join(f"  {r['index']}: {r['name']} [{r['type']}, {r['backend']}] {r['description']}" for r in rows)


def choose_adapter(adapter=None):
    """(wgpu adapter, its index in adapters() or None) for Model(adapter=...): None asks wgpu for
    its high-performance choice; an int is an index into adapters(); a str picks the first
    adapter whose name or description contains it, ignoring case."""
    if adapter is None:
        found = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if found is None:
            raise RuntimeError(
                "no WebGPU adapter found: install a GPU driver with Vulkan/Metal/D3D12 support, "
                "or Mesa's software Vulkan (Debian: apt-get install mesa-vulkan-drivers)"
            )
        return found, None
    if isinstance(adapter, bool) or not isinstance(adapter, str) and not hasattr(adapter, "__index__"):
        raise TypeError(f"Model(adapter=...) takes None, an index or a name, got {type(adapter).__name__}")
    found = wgpu.gpu.enumerate_adapters_sync()
    if isinstance(adapter, str):
        want = adapter.strip().lower()
        for i, a in enumerate(found):
            row = _adapter_row(i, a)
            if want and (want in row["name"].lower() or want in row["description"].lower()):
                return a, i
        raise ValueError(
            f"Model(adapter={adapter!r}): no adapter's name or description contains it; the adapters are:\n"
            + _adapter_list(found)
        )
    index = adapter.__index__()
    if not 0 <= index < len(found):
        raise ValueError(
            f"Model(adapter={index}): no adapter has that index; the adapters are:\n" + _adapter_list(found)
        )
    return found[index], index


_NOSYNC = True  # map readbacks with wgpu-py's "READ_NOSYNC" (see Engine._map_read) while it is accepted


WEBGPU_DEFAULT_BINDING = 134217728  # bytes: maxStorageBufferBindingSize without asking


# A kernel may bind a buffer a second time as array<vec4<f32>> (its matmuls read 4 floats at
# once through it), under the buffer's name + VEC_SUFFIX at VEC_BINDING_BASE + its binding.
VEC_SUFFIX = "_v4"
VEC_BINDING_BASE = 500


# The CPU set's offset tables (a uniform buffer per entry point, a slot per kernel with one).
OFFSETS = "offsets"
OFFSETS_BINDING = 400
OFFSETS_SLOT_BYTES = 256


def _code_only(wgsl: str) -> str:
    """A kernel's source without its comment lines: kernels that differ only there are one."""
    return "\n".join(line for line in wgsl.splitlines() if not line.lstrip().startswith("//"))


def _buffer_of(name: str) -> str:
    return name[: -len(VEC_SUFFIX)] if name.endswith(VEC_SUFFIX) else name


_WORKGROUP_SIZE = re.compile(r"@workgroup_size\((\d+)\)")
_SHUFFLE_XOR = re.compile(r"subgroupShuffleXor\([^,]+, (\d+)u\)")


def _lanes_out_of_order(device, sources) -> str | None:
    """The subgroup variants pair invocation i with i ^ m through subgroupShuffleXor, which holds
    where a subgroup is a run of consecutive invocations at least as long as the groups (every
    driver we know lays them out so, but WebGPU does not promise it). Checked once on the device
    for each workgroup size and mask they use, so that a driver that does otherwise gets the GPU
    set instead of wrong results: None when the lanes pair up, else what went wrong."""
    sources = list(sources)
    sizes = sorted({int(n) for src in sources for n in _WORKGROUP_SIZE.findall(src)})
    masks = sorted({int(m) for src in sources for m in _SHUFFLE_XOR.findall(src)})
    stride = max(sizes)
    code = "@group(0) @binding(0) var<storage, read_write> out: array<u32>;\n" + "".join(
        f"@compute @workgroup_size({n})\nfn probe{n}_{m}(@builtin(local_invocation_index) i: u32) {{\n"
        f"    out[{(k * len(masks) + j) * stride}u + i] = subgroupShuffleXor(i, {m}u);\n}}\n"
        for k, n in enumerate(sizes)
        for j, m in enumerate(masks)
    )
    out = device.create_buffer(
        size=4 * stride * len(sizes) * len(masks), usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
    )
    module = device.create_shader_module(label="subgroup lanes probe", code=code)
    encoder = device.create_command_encoder()
    for n in sizes:
        for m in masks:
            pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": f"probe{n}_{m}"})
            group = device.create_bind_group(
                layout=pipeline.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": out}}]
            )
            cpass = encoder.begin_compute_pass()
            cpass.set_pipeline(pipeline)
            cpass.set_bind_group(0, group)
            cpass.dispatch_workgroups(1)
            cpass.end()
    device.queue.submit([encoder.finish()])
    got = np.frombuffer(device.queue.read_buffer(out), np.uint32).reshape(len(sizes), len(masks), stride)
    out.destroy()
    for k, n in enumerate(sizes):
        for j, m in enumerate(masks):
            if not np.array_equal(got[k, j, :n], np.arange(n, dtype=np.uint32) ^ m):
                return f"invocation i of a {n}-invocation workgroup does not find i ^ {m} in its subgroup"
    return None


def _required_limits(name: str, adapter, arenas: dict, entries: dict) -> dict | None:
    """Device limits the buffers need, checked against the adapter before anything is allocated:
    a buffer larger than WebGPU's default binding size needs the adapter to allow it."""
    sizes = [4 * n for n in arenas.values()] + [4 * n for e in entries.values() for n in e.get("arenas", {}).values()]
    need = max([4] + sizes)
    limits = {}
    for key in ("max-storage-buffer-binding-size", "max-buffer-size"):
        have = adapter.limits[key]
        if need > have:
            raise RuntimeError(
                f"{name} needs a {need}-byte buffer ({need / 2**20:.1f} MiB), but this adapter allows {have} bytes "
                f"({have / 2**20:.0f} MiB, its {key}). Rebuild the package with `python -m aot build "
                f"--max-binding-mib {have // 2**20}` (or less) so that its buffers are split to fit"
            )
        if need > WEBGPU_DEFAULT_BINDING:
            limits[key] = have
    return limits or None


def _size(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _wgsl_context(source: str, message: str) -> str:
    m = re.search(r":(\d+):\d+", message)
    if not m:
        return ""
    line = int(m.group(1))
    lines = source.split("\n")
    lo, hi = max(0, line - 3), min(len(lines), line + 2)
    return "\n".join(f"{'>>' if i + 1 == line else '  '} {i + 1:4d} | {lines[i]}" for i in range(lo, hi))
