"""Data-parallel training of this package's Model over torch.distributed: one process per GPU,
each training on its share of every batch, the gradients averaged between backward and update.
Optional: nothing else in the package imports this module, and only it needs torch (the CPU
build is enough for gloo; NCCL needs a CUDA build and CUDA GPUs).

    import mypkg
    from mypkg import distributed as dist

    rank, world = dist.init()                          # torchrun's environment, NCCL or gloo, timeouts
    model = mypkg.Model(adapter=dist.local_adapter())  # this process's GPU (LOCAL_RANK)
    dist.check_replicas(model)                         # same build, params and state on every rank
    reduce = dist.allreduce_mean()                     # backend="auto", dtype="f32", bucketed=True
    for batch in my_share_of_the_batches:
        loss = model.step(**batch, allreduce=reduce)   # gradients: mean over ranks
    dist.save(model, "ckpt.npz")                       # rank 0 writes (atomically); all wait for it
    dist.restore(model, "ckpt.npz")                    # every rank reads it, then checks replicas

The gradients leave the GPU in buckets (the package's table, built with aot.build(...,
bucket_mib=25)) while the backward pass still runs: each is read back as soon as its last
gradient is written, its mean started at once (NCCL: from the mapped bucket itself, which CUDA
pins once, to this rank's CUDA device and back into that pinned bucket, from which the model's
GPU copies it into the gradients (where wgpu-native lets a mappable buffer be a copy source;
elsewhere into pinned host memory, then a host copy up), on streams of its own;
gloo: an asynchronous all-reduce of a host copy; NCCL's work replayed as a CUDA graph from a
bucket's fourth step on, reducer.graphs),
and uploaded as it arrives; the update runs after the last. init(backend="auto") uses NCCL
where torch has CUDA and NCCL (the group is "cpu:gloo,cuda:nccl": the small collectives of
this module stay on gloo), gloo otherwise; init(backend="gloo"|"nccl") and
allreduce_mean(backend=...) choose. allreduce_mean(dtype="bf16"|"f16") sends each rank's
gradients rounded to 16 bits and sums them in float32 (see there: not exact).

Launch with `torchrun --nproc-per-node N script.py` (one machine) or `torchrun --nnodes M
--nproc-per-node N --rdzv-backend c10d --rdzv-endpoint HOST:PORT script.py` on each machine.
A rank that dies or stops answering makes the others raise (gloo's error, or its timeout,
`init(timeout_s=...)`) instead of waiting forever.

Buffers (Module.buffer: running statistics, say) are each rank's own: a training step updates them
from that rank's share of the batch. broadcast_buffers(model) gives every rank rank 0's (PyTorch
DDP's broadcast_buffers=True does so before every forward); call it before evaluating or saving,
or after every step for DDP's behaviour.

Random ops (dropout, ops.rand) draw from model.seed, as PyTorch DDP ranks seeded alike do: every
rank gets the same masks for its rows. For a stream per rank, set `model.seed = base + rank` after
check_replicas and after every restore (a checkpoint holds rank 0's seed).
"""

from __future__ import annotations

import atexit
import ctypes
import datetime
import hashlib
import os
import time

import numpy as np

try:
    import torch
    import torch.distributed as td
except ImportError as e:  # pragma: no cover - only without torch
    raise ImportError(
        "the distributed module needs PyTorch for torch.distributed (pip install torch; the CPU build is "
        "enough). The rest of the package does not"
    ) from e

from .engine import adapters

DEFAULT_TIMEOUT_S = 300.0  # a collective waiting longer than this for a rank raises
_TIMEOUT_S = DEFAULT_TIMEOUT_S  # init's timeout_s


class ReplicaMismatch(RuntimeError):
    """The ranks do not run the same build, or do not hold the same parameters and state."""


BACKENDS = ("auto", "gloo", "nccl")
DTYPES = {"f32": None, "float32": None, "bf16": "bfloat16", "bfloat16": "bfloat16", "f16": "float16", "float16": "float16"}


def _nccl_usable() -> bool:
    return torch.cuda.is_available() and td.is_nccl_available()


def init(
    timeout_s: float = DEFAULT_TIMEOUT_S,
    init_method: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    backend: str = "auto",
) -> tuple[int, int]:
    """Join the process group unless this process already has; returns (rank, world size).
    Without init_method, torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) says
    where; with it (e.g. "tcp://10.0.0.1:29500"), give rank and world_size too. Every collective
    of the group (the all-reduce of each step included) raises after timeout_s seconds without
    an answer from some rank. backend: "auto" (NCCL for the gradients where torch has CUDA and
    NCCL, gloo otherwise), "gloo" or "nccl". With NCCL the group is "cpu:gloo,cuda:nccl": the
    gradients go through the LOCAL_RANK-th CUDA device, everything else (mean, checkpoints,
    check_replicas) through gloo."""
    if not td.is_available():
        raise RuntimeError("this PyTorch build has no torch.distributed")
    if backend not in BACKENDS:
        raise ValueError(f"init(backend=...) must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if backend == "nccl" and not _nccl_usable():
        raise RuntimeError(
            "init(backend='nccl') needs a CUDA device and a PyTorch built with CUDA and NCCL "
            f"(torch.cuda.is_available() is {torch.cuda.is_available()}); use backend='gloo' or 'auto'"
        )
    if not td.is_initialized():
        kw = {}
        if init_method is not None:
            if rank is None or world_size is None:
                raise ValueError("init(init_method=...) needs rank= and world_size= as well")
            kw = dict(init_method=init_method, rank=rank, world_size=world_size)
        elif "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise RuntimeError(
                "init(): no RANK/WORLD_SIZE in the environment: launch with torchrun (torchrun "
                "--nproc-per-node N script.py), or pass init_method=, rank= and world_size="
            )
        use = "gloo"
        if backend == "nccl" or (backend == "auto" and _nccl_usable()):
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
            use = "cpu:gloo,cuda:nccl"
        td.init_process_group(use, timeout=datetime.timedelta(seconds=timeout_s), **kw)
        global _TIMEOUT_S
        _TIMEOUT_S = float(timeout_s)  # what a CUDA graph's collective waits at most (_finish)
        # leave the group before the interpreter tears down: a gloo group still alive at exit can
        # end the process with "terminate called without an active exception" (SIGABRT)
        atexit.register(_leave)
    elif "gloo" not in _group_backend(None):
        raise RuntimeError(
            f"the process group uses the {_group_backend(None)} backend; the gradients and checkpoints are NumPy (CPU) "
            "memory, which needs gloo: init_process_group('gloo', ...) or ('cpu:gloo,cuda:nccl', ...)"
        )
    elif backend == "nccl" and "nccl" not in _group_backend(None):
        raise RuntimeError(
            f"init(backend='nccl'): the process group was made with {_group_backend(None)!r}, without NCCL: "
            "make it with init_process_group('cpu:gloo,cuda:nccl', ...), or call init(backend='nccl') first"
        )
    return td.get_rank(), td.get_world_size()


def _group_backend(group) -> str:
    """The group's backend as named at init ("gloo", "cpu:gloo,cuda:nccl", ...), lower case."""
    try:
        return str(td.get_backend(group)).lower()
    except Exception:  # pragma: no cover - very old torch
        return "gloo"


def _leave() -> None:
    if td.is_initialized():
        td.destroy_process_group()


def local_adapter(local_rank: int | None = None) -> int | None:
    """The adapter index (for Model(adapter=...)) of this process's GPU: the LOCAL_RANK-th GPU
    (discrete or integrated) of the first backend that lists one, round robin when a machine
    runs more ranks than it has GPUs; None (wgpu's own choice, such as a CPU adapter in CI)
    when there is no GPU."""
    local = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else int(local_rank)
    gpus = [r for r in adapters() if r["type"] in ("DiscreteGPU", "IntegratedGPU")]
    if not gpus:
        return None
    same = [r for r in gpus if r["backend"] == gpus[0]["backend"]]  # one GPU is listed once per backend
    return same[local % len(same)]["index"]


def allreduce_mean(group=None, backend: str = "auto", dtype: str = "f32", bucketed: bool = True):
    """The function for model.step(..., allreduce=fn): the mean over the ranks of `group` (all
    by default) of the flat gradient vector. Called with the whole vector it sums it in place
    and divides by the number of ranks, returning the same array (as it always did). It is also
    a bucketed reducer (start/finish, unless bucketed=False): step() then hands it the package's
    gradient buckets one by one while the backward pass still runs, and uploads each mean as it
    arrives. backend: "auto" (NCCL where the group has it and torch sees a CUDA device: each
    bucket goes to the GPU straight from the model's mapped readback buffer (start_mapped; where
    CUDA cannot pin that memory, through a host copy into pinned memory), through NCCL and back
    into that bucket (in_place; or pinned host memory), copies overlapped on streams of its own; gloo otherwise), "gloo" or
    "nccl". dtype: "f32" (exact: two ranks give
    the one-process gradients to rounding), or "bf16"/"f16": each rank's gradients are rounded to
    that type for the trip (half the bytes), gathered, and summed in float32 on every rank in
    rank order (every rank gets the same bits); the mean then carries each gradient's rounding
    error (bf16: 2**-9 relative; f16: 2**-12, and values beyond 65504 overflow)."""
    if backend not in BACKENDS:
        raise ValueError(f"allreduce_mean(backend=...) must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if dtype not in DTYPES:
        raise ValueError(f"allreduce_mean(dtype=...) must be one of {', '.join(map(repr, DTYPES))}, got {dtype!r}")
    has_nccl = "nccl" in _group_backend(group)
    if backend == "nccl" and not (has_nccl and torch.cuda.is_available()):
        raise RuntimeError(
            f"allreduce_mean(backend='nccl'): the process group ({_group_backend(group)!r}) has no NCCL or torch sees no "
            "CUDA device: call init(backend='nccl') on a machine with CUDA GPUs, or use backend='gloo'"
        )
    use = "nccl" if backend == "nccl" or (backend == "auto" and has_nccl and torch.cuda.is_available()) else "gloo"
    cls = BucketedAllReduce if bucketed else AllReduce
    return cls(group, use, DTYPES[dtype])


class AllReduce:
    """step(allreduce=...)'s mean over the ranks, of the whole gradient vector at once (allreduce_mean).
    stats: what it has done so far: calls, bytes (each rank's share as sent), wait_s (time spent
    waiting for collectives to finish), start_s (time spent starting them, copies included) and
    copy_wait_s (start_mapped's waits for the copy out of the mapped bucket); collective_s: of
    start_s, the NCCL calls themselves (all_reduce and the division, or all_gather and the sum)."""

    def __init__(self, group, backend: str, dtype: str | None):
        self.group, self.backend, self.dtype = group, backend, dtype
        self.world = td.get_world_size(group)
        self.stats = {"calls": 0, "bytes": 0, "wait_s": 0.0, "start_s": 0.0, "copy_wait_s": 0.0, "collective_s": 0.0}
        self._checked: set = set()
        self._pinned = self._device = self._stream = None
        self._registered: dict = {}  # (address, bytes) of mapped memory -> pinned by CUDA (start_mapped)
        # the events after in_place copies back into mapped buckets: a step that failed may leave
        # some unfinished, and the next step's readback must not be overwritten by them (begin)
        self._in_place_done: list = []
        self._held: list = []  # _Member per bucket kept for its group's one collective (start(..., hold=True))
        self._group_bufs: dict = {}  # the members' spans -> a CUDA vector holding them side by side

    def __call__(self, grads: np.ndarray) -> np.ndarray:
        # gloo aborts the process (SIGABRT) when ranks reduce vectors of different lengths (other
        # builds): a 2-element collective compares the lengths first, so every rank raises instead
        self._same_everywhere([int(grads.size)], f"gradient vectors differ in length (this rank's has {grads.size} values)")
        if self.backend == "nccl":  # through the pinned staging (stage) and back into grads
            staged = self._stage(grads.size)
            np.copyto(staged, grads)
            np.copyto(grads, self._finish(self._start(staged, 0, grads.size)))
        else:
            self._finish(self._start(grads, 0, grads.size))
        return grads

    def _same_everywhere(self, values: list[int], what: str) -> None:
        """ReplicaMismatch on every rank unless every rank has the same `values` (one collective)."""
        t = torch.tensor(values + [-v for v in values], dtype=torch.int64)
        td.all_reduce(t, op=td.ReduceOp.MAX, group=self.group)
        n = len(values)
        if t[:n].tolist() != [-v for v in t[n:].tolist()]:
            raise ReplicaMismatch(
                f"rank {td.get_rank(self.group)} of {self.world}: the ranks' {what}; they run different builds. "
                "Install or copy the same built package on every machine (check_replicas says so at start)"
            )

    # ---- the work of both: BucketedAllReduce gives them to model.step as its bucketed protocol ------
    def _stage(self, n: int) -> np.ndarray:
        if self.backend != "nccl":
            return np.empty(n, dtype=np.float32)
        if self._pinned is None or self._pinned.numel() != n:
            self._pinned = torch.empty(n, dtype=torch.float32).pin_memory()
            self._device = torch.empty(n, dtype=torch.float32, device="cuda")
            self._stream = torch.cuda.Stream()
            self._h2d = torch.cuda.Stream()  # start_mapped's copies: not behind an earlier bucket's collective
            self._events, self._plans, self._graphs = {}, {}, {}
        return self._pinned.numpy()

    def _start_mapped(self, values: np.ndarray, lo: int, hi: int, hold: bool = False):
        """NCCL: start the mean of gradients [lo, hi) straight from `values`, memory the model
        has mapped (a bucket's readback buffer, valid only during the call): CUDA pins it once
        (cudaHostRegister: wgpu maps a buffer at the same address every time) and copies from
        it to the GPU, and this returns once that copy is done (on an H100, transformer_large's
        5 buckets wait 0.15 ms a step for it, where the host copy into stage()'s array took
        5.6 ms); the mean then comes back into stage()'s array as start()'s does, or, where
        `values` is writable (the model uploads from the mapped bucket itself) and in_place is
        set, into that pinned memory: finish then returns `values`, and no host copy is left to
        do. None where the memory cannot be pinned (the caller copies into stage() and calls start).
        hold: the bucket is copied to the GPU and kept for one collective with the next buckets
        started (_launch: the first started without hold)."""
        if self.backend != "nccl" or self._pinned is None or not self._register(values):
            return None
        t = time.perf_counter()
        n = hi - lo
        self.stats["bytes"] += n * (2 if self.dtype else 4)
        plan = self._plans.get((values.ctypes.data, lo, hi))
        if plan is None:  # the mapped address is the same every step: the tensors and events once per bucket
            src = torch.frombuffer((ctypes.c_char * values.nbytes).from_address(values.ctypes.data), dtype=torch.float32)
            plan = self._plans[(values.ctypes.data, lo, hi)] = _Plan(src, self._device[lo:hi], torch.cuda.Event(), lo, hi)
        with torch.cuda.stream(self._h2d):
            plan.dev.copy_(plan.src, non_blocking=True)
            plan.copied.record(self._h2d)
        into = (plan.src, values) if self.in_place and values.flags.writeable else None  # the mean back where it came from
        if hold or self._held:
            handle = self._group(_Member(plan.dev, lo, hi, after=plan.copied, into=into), hold)
        else:
            self.stats["calls"] += 1
            handle = self._reduce_staged(plan.dev, lo, hi, after=plan.copied, into=into)
        t1 = time.perf_counter()
        plan.copied.synchronize()  # the caller unmaps `values` when this returns
        self.stats["copy_wait_s"] += time.perf_counter() - t1
        self.stats["start_s"] += t1 - t
        return handle

    # each bucket's (or group's) all-reduce, division and copies back enqueued as one CUDA graph,
    # captured at its GRAPH_AFTER + 1-th call (_enqueue): one host call instead of c10d's
    # all_reduce, a division and a copy per member (start_mapped 0.29-0.33 -> 0.13-0.15 ms of
    # host a bucket on 2 H200s; the addition transformer 1.74-1.76 -> 1.45-1.51 ms a step with
    # NCCL's AVG, scripts/results/bench_ddp_h200x2_r8.json); where a capture fails, eager calls
    # for good (graph_error says why). Until round 8 the in-place path bypassed it
    graphs = True
    # start_mapped leaves the mean in the mapped bucket where the model allows it (writable values):
    # the model's GPU copies it into the gradients from there, no host copy into an upload buffer
    in_place = True
    GRAPH_AFTER = 3  # eager calls of a bucket before its graph is captured (NCCL's setup done)
    # finish() of a replayed graph polls its event: yielding (time.sleep(0)) for the first
    # SPIN_S seconds, then sleeping 20 us between polls (a sleep lasts ~70 us on Linux). 0: no
    # gain measured on 2 H200s (bench_ddp spin_us=1000: within the ranks' noise)
    SPIN_S = 0.0

    def _enqueue(self, key, work) -> bool:
        """Run work() (CUDA work on the current stream, the NCCL stream, over tensors that stay
        where they are) eagerly, or, with graphs, from its GRAPH_AFTER + 1-th call with this key
        on, as a CUDA graph captured then (every rank at the same step: the ranks run the same
        buckets, begin() checks) and replayed. True where it was replayed: c10d's watchdog does
        not see a replayed collective, so finish() waits for it at most init's timeout_s."""
        graph = self._graphs.get(key)
        if isinstance(graph, int) or graph is None:
            calls = (graph or 0) + 1
            self._graphs[key] = calls
            if not (self.graphs and self.dtype is None and calls > self.GRAPH_AFTER):
                work()
                return False
            try:
                graph = torch.cuda.CUDAGraph()
                # thread_local: the model's upload thread keeps waiting on events meanwhile
                with torch.cuda.graph(graph, stream=self._stream, capture_error_mode="thread_local"):
                    work()
                self._graphs[key] = graph
            except Exception as e:  # noqa: BLE001 - eager from here on; said once
                self.graphs = False
                self.graph_error = f"{type(e).__name__}: {e}"
                work()
                return False
        graph.replay()
        return True

    def _register(self, values: np.ndarray) -> bool:
        """Whether CUDA has pinned `values`'s memory (registering it at the first sight)."""
        key = (values.ctypes.data, values.nbytes)
        ok = self._registered.get(key)
        if ok is None:
            ok = self._registered[key] = _cuda_call("cudaHostRegister", key[0], key[1], 0) == 0
        return ok

    def release(self) -> None:
        """Unpin the mapped memory start_mapped pinned (Model.close calls it before the buffers go)."""
        self._settle_in_place()
        for (address, _), ok in self._registered.items():
            if ok:
                _cuda_call("cudaHostUnregister", address)
        self._registered.clear()
        if getattr(self, "_plans", None):  # views of the unpinned memory, and graphs copying into it
            self._plans.clear()
            self._graphs.clear()

    def _settle_in_place(self) -> None:
        """Wait for every in_place copy back into a mapped bucket (each finish() has, except
        after a step that failed)."""
        for done in self._in_place_done:
            done.synchronize()
        self._in_place_done.clear()

    def _event(self, key):
        """One CUDA event per key, recorded again every step."""
        done = self._events.get(key)
        if done is None:
            done = self._events[key] = torch.cuda.Event()
        return done

    def _start(self, values: np.ndarray, lo: int, hi: int, hold: bool = False):
        """Start the mean of one bucket (values: elements [lo, hi) of stage()'s array, or the whole
        vector); _finish(handle) waits for it and returns the result. hold: keep it for one
        collective with the next buckets started, up to the first without hold (_group)."""
        t = time.perf_counter()
        n = hi - lo
        self.stats["bytes"] += n * (2 if self.dtype else 4)
        if self.backend == "nccl":
            dev = self._device[lo:hi]
            with torch.cuda.stream(self._stream):
                dev.copy_(self._pinned[lo:hi], non_blocking=True)
            if hold or self._held:
                handle = self._group(_Member(dev, lo, hi), hold)
            else:
                self.stats["calls"] += 1
                handle = self._reduce_staged(dev, lo, hi)
        elif hold or self._held:
            handle = self._group(_Member(None, lo, hi, values=values), hold)
        else:
            self.stats["calls"] += 1
            handle = self._start_gloo(values)
        self.stats["start_s"] += time.perf_counter() - t
        return handle

    def _start_gloo(self, values: np.ndarray):
        """gloo's asynchronous mean of a host array (summed in place; divided in _finish)."""
        n = values.size
        if self.dtype is None:
            handle = ("gloo", td.all_reduce(torch.from_numpy(values), op=td.ReduceOp.SUM, group=self.group, async_op=True), values)
        else:
            # gathered as bytes: gloo moves any dtype's bytes, but not every dtype (no bf16, no int16)
            parts = [torch.empty(2 * n, dtype=torch.uint8) for _ in range(self.world)]
            mine = torch.from_numpy(values).to(getattr(torch, self.dtype)).view(torch.uint8)
            handle = ("gloo16", td.all_gather(parts, mine, group=self.group, async_op=True), values, parts)
        return handle

    def _group(self, member, hold: bool):
        """Keep `member` (hold), or start one collective for the buckets held so far and it: NCCL
        over their GPU copies side by side (a view of the device vector where their spans are
        adjacent, else gathered into a vector of the group's), gloo over a host copy of them
        side by side; each member's mean goes where its own collective would have put it. The
        handle of a held bucket finishes once the group's is started (model.step starts it
        before waiting for any of them)."""
        if hold:
            self._held.append(member)
            return ("held", member, member.values)
        members, self._held = self._held + [member], []
        self.stats["calls"] += 1
        if self.backend == "nccl":
            self._launch(members)
        else:
            group = _Gloo(self._start_gloo(np.concatenate([m.values for m in members])), members)
            for m in members:
                m.handle = ("gloo_group", group, m.values)
        return member.handle

    def _launch(self, members: list) -> None:
        """_group's NCCL collective, on the NCCL stream after each member's copy to the GPU."""
        spans = tuple((m.lo, m.hi) for m in members)
        lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
        adjacent = sum(b - a for a, b in spans) == hi - lo  # the spans tile [lo, hi): the device vector's view
        with torch.cuda.stream(self._stream):
            for m in members:
                if m.after is not None:
                    self._stream.wait_event(m.after)
            if adjacent:
                vec, at = self._device[lo:hi], [a - lo for a, _ in spans]
            else:
                vec = self._group_bufs.get(spans)
                if vec is None:
                    n = sum(b - a for a, b in spans)
                    vec = self._group_bufs[spans] = torch.empty(n, dtype=torch.float32, device=self._device.device)
                at = [sum(m.hi - m.lo for m in members[:k]) for k in range(len(members))]
            dsts = [self._pinned[m.lo : m.hi] if m.into is None else m.into[0] for m in members]

            def work():
                if not adjacent:
                    for m, o in zip(members, at):
                        vec[o : o + m.hi - m.lo].copy_(m.dev)
                mean = self._reduce(vec)
                if mean is not vec:
                    vec.copy_(mean)
                for m, o, dst in zip(members, at, dsts):
                    dst.copy_(vec[o : o + m.hi - m.lo], non_blocking=True)

            t = time.perf_counter()
            replayed = self._enqueue(("group", spans, tuple(d.data_ptr() for d in dsts)), work)
            self.stats["collective_s"] += time.perf_counter() - t
            done = self._event(spans)
            done.record(self._stream)
            if any(m.into is not None for m in members):
                self._in_place_done.append(done)
        kind = "nccl_graph" if replayed else "nccl"
        for m in members:
            m.handle = (kind, done, self._pinned[m.lo : m.hi].numpy() if m.into is None else m.into[1])

    def _reduce_staged(self, dev, lo: int, hi: int, after=None, into=None):
        """On the NCCL stream (after event `after`): the mean of dev (bucket [lo, hi) on the GPU)
        into the pinned stage, or into `into` = (pinned tensor, the NumPy array over the same
        memory); the handle _finish waits on."""
        dst = self._pinned[lo:hi] if into is None else into[0]

        def work():
            mean = self._reduce(dev)
            if mean is not dev:
                dev.copy_(mean)
            dst.copy_(dev, non_blocking=True)

        with torch.cuda.stream(self._stream):
            if after is not None:
                self._stream.wait_event(after)
            t = time.perf_counter()
            replayed = self._enqueue(("one", dev.data_ptr(), hi - lo, dst.data_ptr()), work)
            self.stats["collective_s"] += time.perf_counter() - t
            done = self._event((lo, hi))
            done.record(self._stream)
            if into is not None:
                self._in_place_done.append(done)
        return ("nccl_graph" if replayed else "nccl", done, self._pinned[lo:hi].numpy() if into is None else into[1])

    # NCCL's own average (ReduceOp.AVG: each rank's values scaled by 1/world, then summed), one
    # kernel fewer after each collective. Where world is a power of two the scaling is exact, so
    # the mean has the bits of the sum divided by world (barring subnormal scaled values); None:
    # AVG for such worlds, the sum and a division for others; True/False to choose
    nccl_avg = None

    def _use_avg(self) -> bool:
        if self.nccl_avg is None:
            return self.world & (self.world - 1) == 0
        return bool(self.nccl_avg)

    def _reduce(self, dev):
        """The mean of a CUDA tensor over the ranks, enqueued on the current stream."""
        if self.dtype is None:
            if self._use_avg():
                td.all_reduce(dev, op=td.ReduceOp.AVG, group=self.group)
                return dev
            td.all_reduce(dev, op=td.ReduceOp.SUM, group=self.group)
            return dev.div_(self.world)
        half = dev.to(getattr(torch, self.dtype))
        parts = torch.empty((self.world, half.numel()), dtype=half.dtype, device=half.device)
        td.all_gather_into_tensor(parts, half, group=self.group)
        return _sum_rows(parts).div_(self.world)

    def _finish(self, handle) -> np.ndarray:
        kind, work, values = handle[:3]
        if kind == "held":  # a bucket of a group: its collective's handle, once started
            if work.handle is None:
                raise RuntimeError(
                    f"finish() of gradients [{work.lo}, {work.hi}), held for one collective with later buckets that "
                    "were never started: start the group's last bucket (without hold) first"
                )
            return self._finish(work.handle)
        if kind == "gloo_group":
            return work.wait(self._finish, values)
        t = time.perf_counter()
        if kind == "nccl":
            work.synchronize()
        elif kind == "nccl_graph":  # c10d's watchdog does not see a replayed collective: a timeout of ours
            deadline, spin = t + _TIMEOUT_S, t + self.SPIN_S
            while not work.query():
                now = time.perf_counter()
                if now < spin:
                    time.sleep(0)  # yields the GIL; a sleep(20e-6) lasts ~70 us
                    continue
                if now > deadline:
                    raise RuntimeError(
                        f"rank {td.get_rank(self.group)} of {self.world}: a bucket's all-reduce (a CUDA graph) did not "
                        f"finish within {_TIMEOUT_S:g} s: another rank died or stopped answering"
                    )
                time.sleep(20e-6)
        else:
            work.wait()
            if kind == "gloo":
                values /= np.float32(self.world)
            else:
                parts = torch.stack(handle[3]).view(getattr(torch, self.dtype))
                values[...] = _sum_rows(parts).div_(self.world).numpy()
        self.stats["wait_s"] += time.perf_counter() - t
        return values


class BucketedAllReduce(AllReduce):
    """AllReduce that model.step() also drives bucket by bucket (it has start and finish)."""

    def stage(self, n: int) -> np.ndarray:
        """The host array step() reads the gradients into (pinned memory for NCCL)."""
        return self._stage(n)

    # model.step may start a bucket with hold=True: kept for one collective with the next ones of
    # its group (the model's engine.bucket_groups); False: one collective per bucket
    merge = True

    def start(self, values: np.ndarray, lo: int, hi: int, hold: bool = False):
        """Start the mean of gradients [lo, hi) (values: that part of stage()'s array); hold: kept
        for one collective with the buckets started next, up to the first without hold."""
        return self._start(values, lo, hi, hold)

    def finish(self, handle) -> np.ndarray:
        """Wait for a start()'s mean; the float32 result (stage()'s array, where it was)."""
        return self._finish(handle)

    direct = True  # False: start_mapped declines, every bucket goes through a host copy into stage()

    def start_mapped(self, values: np.ndarray, lo: int, hi: int, hold: bool = False):
        """start() from the model's mapped bucket itself (valid only during the call): NCCL
        copies it to the GPU without a host copy where CUDA can pin that memory; None otherwise
        (and with gloo), when step() copies the bucket into stage() and calls start()."""
        return self._start_mapped(values, lo, hi, hold) if self.direct else None

    def begin(self, buckets: list, groups: list | None = None) -> None:
        """Before a step's first bucket: the ranks must cut the gradients alike (the same build)
        and reduce the same buckets together (groups: per bucket, the first bucket of its
        collective); checked once per layout (one small collective), as __call__ checks every
        vector's length."""
        self._settle_in_place()  # a failed step's copies back must land before this step's readbacks
        self._held = []  # a failed step's buckets held for a collective never started
        layout = tuple(map(tuple, buckets))
        key = (layout, tuple(groups) if groups is not None else tuple(range(len(layout))))
        if key not in self._checked:
            digest = int(hashlib.sha256(repr(key).encode()).hexdigest()[:15], 16) >> 2
            n = max((hi for _, hi in layout), default=0)
            self._same_everywhere(
                [n, len(layout), digest],
                f"gradient vectors differ in length or in their buckets (this rank's: {n} values in {len(layout)} buckets, "
                f"{len(set(key[1]))} collectives)",
            )
            self._checked.add(key)


class _Member:
    """A bucket of a group (_group): its GPU copy (NCCL; `after`: the event after that copy),
    where its mean goes (`into`: the pinned mapped bucket, else the pinned stage) or its host
    values (gloo), and its handle once the group's collective is started."""

    def __init__(self, dev, lo: int, hi: int, after=None, into=None, values=None):
        self.dev, self.lo, self.hi, self.after, self.into = dev, lo, hi, after, into
        self.values = values if values is not None else (into[1] if into is not None else None)
        self.handle = None


class _Gloo:
    """gloo's collective of a group: one host vector of the members side by side; the first
    finish of a member waits for it and puts each member's mean back into its own values."""

    def __init__(self, handle, members: list):
        self.handle, self.members, self.done = handle, members, False

    def wait(self, finish, values: np.ndarray) -> np.ndarray:
        if not self.done:
            mean, o = finish(self.handle), 0
            for m in self.members:
                m.values[...] = mean[o : o + m.hi - m.lo]
                o += m.hi - m.lo
            self.done = True
        return values


class _Plan:
    """start_mapped's tensors for one bucket: the pinned mapped memory, the bucket's part of the
    GPU vector, and the event after the copy between them."""

    def __init__(self, src, dev, copied, lo: int, hi: int):
        self.src, self.dev, self.copied, self.lo, self.hi = src, dev, copied, lo, hi


def _cuda_call(name: str, *args) -> int:
    """A CUDA runtime call through torch's bindings: its error code (0: success). A failure is
    also cleared from CUDA's last error, which torch's next kernel launch would otherwise raise."""
    try:
        code = getattr(torch.cuda.cudart(), name)(*args)
    except Exception:  # noqa: BLE001 - a torch without the binding: as if CUDA refused
        return -1
    code = int(code[0] if isinstance(code, tuple) else code)
    if code:
        _clear_cuda_error()
    return code


def _clear_cuda_error() -> None:
    """cudaGetLastError: resets the error a refused cudaHostRegister leaves behind."""
    clear = getattr(torch.cuda.cudart(), "cudaGetLastError", None)
    if clear is not None:
        clear()
        return
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):  # the one torch loaded
        try:
            ctypes.CDLL(name).cudaGetLastError()
            return
        except (OSError, AttributeError):
            continue


def _sum_rows(parts):
    """parts[0] + parts[1] + ... in float32, in rank order (every rank the same bits)."""
    acc = parts[0].float()
    for r in range(1, parts.shape[0]):
        acc += parts[r].float()
    return acc


def mean(value: float, group=None) -> float:
    """The mean of a number (a step's loss, say) over the ranks, in float64: one small collective."""
    t = torch.tensor([float(value)], dtype=torch.float64)
    td.all_reduce(t, op=td.ReduceOp.SUM, group=group)
    return float(t[0]) / td.get_world_size(group)


def build_checksum(model) -> str:
    """SHA-256 of the compiled program: its tables (parameters, optimizer, buffers, dispatches)
    and every kernel's WGSL. Equal on two machines iff they run the same build."""
    h = hashlib.sha256(repr(model.PROGRAM).encode())
    for name in sorted(model.WGSL):
        h.update(name.encode() + b"\0" + model.WGSL[name].encode() + b"\0")
    return h.hexdigest()


def state_checksum(model) -> str:
    """SHA-256 of what training continues from: the parameters, the buffers, the optimizer state,
    the step count and the learning-rate spec."""
    h = hashlib.sha256(repr((model.step_count, model.lr)).encode())
    for name, value in model.params().items():
        h.update(name.encode() + b"\0" + np.ascontiguousarray(value, dtype=np.float32).tobytes())
    for name, value in model.buffers().items():  # none in a program without buffers: the same checksum
        h.update(name.encode() + b"\0" + value.tobytes())
    for arena, n in model._state_buffers():
        h.update(model._engine.read(arena, 0, n).tobytes())
    return h.hexdigest()


def check_replicas(model, group=None) -> None:
    """Raise ReplicaMismatch on every rank unless all ranks run the same build with the same
    parameters, buffers and optimizer state: two checksums, compared in one all-reduce (of each
    checksum's leading 58 bits and their negations, by max: equal everywhere iff max == -min)."""
    build, state = build_checksum(model), state_checksum(model)
    mine = [int(build[:15], 16) >> 2, int(state[:15], 16) >> 2]  # 58 bits each: exact in int64
    t = torch.tensor(mine + [-x for x in mine], dtype=torch.int64)
    td.all_reduce(t, op=td.ReduceOp.MAX, group=group)
    hi, lo = t[:2].tolist(), [-x for x in t[2:].tolist()]
    rank, world = td.get_rank(group), td.get_world_size(group)
    name = model.PROGRAM["name"]
    if hi[0] != lo[0]:
        raise ReplicaMismatch(
            f"rank {rank} of {world}: the ranks run different builds of {name} (build checksums differ; this "
            f"rank's is {build[:16]}). Install or copy the same built package on every machine"
        )
    if hi[1] != lo[1]:
        raise ReplicaMismatch(
            f"rank {rank} of {world}: the ranks hold different parameters or optimizer state for {name} "
            f"(this rank's checksum is {state[:16]}, step {model.step_count}). Create every Model with the "
            "same seed, or restore the same checkpoint on every rank"
        )


def broadcast_buffers(model, src: int = 0, group=None) -> None:
    """Every rank's buffers (model.buffers()) become rank `src`'s: one broadcast per dtype."""
    values = model.buffers()
    out = {}
    for dtype in (np.float32, np.int32):
        names = [n for n, v in values.items() if v.dtype == dtype]
        if not names:
            continue
        flat = np.concatenate([values[n].ravel() for n in names])
        td.broadcast(torch.from_numpy(flat), src=src, group=group)
        pos = 0
        for n in names:
            out[n] = flat[pos : pos + values[n].size].reshape(values[n].shape)
            pos += values[n].size
    model.load_buffers(out, partial=True)


def _agree(ok: bool, group) -> bool:
    """Whether every rank says ok (one all-reduce; it also waits for every rank)."""
    t = torch.tensor([0 if ok else 1], dtype=torch.int64)
    td.all_reduce(t, op=td.ReduceOp.MAX, group=group)
    return int(t[0]) == 0


def save(model, path, group=None) -> None:
    """Rank 0 writes the checkpoint (model.save: a temporary file renamed over `path`, so a crash
    never leaves a torn one); every rank returns once it is written, or raises if rank 0 failed."""
    failure = None
    if td.get_rank(group) == 0:
        try:
            model.save(path)
        except Exception as e:  # the others must hear of it before it propagates here
            failure = e
    if not _agree(failure is None, group):
        if failure is not None:
            raise failure
        raise RuntimeError(f"rank 0 could not save the checkpoint {os.fspath(path)!r} (its error says why)")


def _file_digest(path) -> int:
    """58 bits of the file's SHA-256 (exact in an int64 collective, as check_replicas's)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return int(h.hexdigest()[:15], 16) >> 2


def restore(model, path, group=None) -> None:
    """Every rank restores `path` (a file every rank can read: a shared folder, or a copy on each
    machine), then check_replicas. Every rank first reads and checks its copy, and the ranks
    compare their copies' SHA-256; only when every copy is valid and they are all the same does
    any rank change its model. Otherwise every rank raises with its model as it was."""
    failure, commit, digest = None, None, 0
    try:
        commit = model._checked_restore(path)
        digest = _file_digest(path)
    except Exception as e:
        failure = e
    if not _agree(failure is None, group):
        if failure is not None:
            raise failure
        raise RuntimeError(
            f"another rank could not restore {os.fspath(path)!r} (its error says why); no rank restored it"
        )
    t = torch.tensor([digest, -digest], dtype=torch.int64)
    td.all_reduce(t, op=td.ReduceOp.MAX, group=group)
    if int(t[0]) != -int(t[1]):
        raise ReplicaMismatch(
            f"rank {td.get_rank(group)} of {td.get_world_size(group)}: the ranks' copies of {os.fspath(path)!r} differ "
            "(their SHA-256 do); no rank restored it. Give every rank the same checkpoint"
        )
    commit()
    check_replicas(model, group)
