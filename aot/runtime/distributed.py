"""Data-parallel training of this package's Model over torch.distributed (gloo): one process per
GPU, each training on its share of every batch, the gradients averaged between backward and
update. Optional: nothing else in the package imports this module, and only it needs torch
(the CPU build is enough).

    import mypkg
    from mypkg import distributed as dist

    rank, world = dist.init()                          # torchrun's environment, gloo, timeouts
    model = mypkg.Model(adapter=dist.local_adapter())  # this process's GPU (LOCAL_RANK)
    dist.check_replicas(model)                         # same build, params and state on every rank
    reduce = dist.allreduce_mean()
    for batch in my_share_of_the_batches:
        loss = model.step(**batch, allreduce=reduce)   # gradients: mean over ranks
    dist.save(model, "ckpt.npz")                       # rank 0 writes (atomically); all wait for it
    dist.restore(model, "ckpt.npz")                    # every rank reads it, then checks replicas

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
import datetime
import hashlib
import os

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


class ReplicaMismatch(RuntimeError):
    """The ranks do not run the same build, or do not hold the same parameters and state."""


def init(
    timeout_s: float = DEFAULT_TIMEOUT_S,
    init_method: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> tuple[int, int]:
    """Join the process group (gloo) unless this process already has; returns (rank, world size).
    Without init_method, torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) says
    where; with it (e.g. "tcp://10.0.0.1:29500"), give rank and world_size too. Every collective
    of the group (the all-reduce of each step included) raises after timeout_s seconds without
    an answer from some rank."""
    if not td.is_available():
        raise RuntimeError("this PyTorch build has no torch.distributed")
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
        td.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s), **kw)
        # leave the group before the interpreter tears down: a gloo group still alive at exit can
        # end the process with "terminate called without an active exception" (SIGABRT)
        atexit.register(_leave)
    elif td.get_backend() != "gloo":
        raise RuntimeError(
            f"the process group uses the {td.get_backend()} backend; the gradients are NumPy (CPU) memory, "
            "which needs gloo: init_process_group('gloo', ...)"
        )
    return td.get_rank(), td.get_world_size()


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


def allreduce_mean(group=None):
    """The function for model.step(..., allreduce=fn): sums the flat gradient vector over the
    ranks of `group` (all by default) in place, with torch.from_numpy sharing the array's
    memory (no copy), then divides by the number of ranks, and returns the same array."""
    world = td.get_world_size(group)

    def allreduce(grads: np.ndarray) -> np.ndarray:
        # gloo aborts the process (SIGABRT) when ranks reduce vectors of different lengths (other
        # builds): a 2-element collective compares the lengths first, so every rank raises instead
        n = int(grads.size)
        sizes = torch.tensor([n, -n], dtype=torch.int64)
        td.all_reduce(sizes, op=td.ReduceOp.MAX, group=group)
        if int(sizes[0]) != -int(sizes[1]):
            raise ReplicaMismatch(
                f"rank {td.get_rank(group)} of {world}: the ranks' gradient vectors differ in length (this rank's "
                f"has {n} values; the longest {int(sizes[0])}, the shortest {-int(sizes[1])}): they run different "
                "builds. Install or copy the same built package on every machine (check_replicas says so at start)"
            )
        td.all_reduce(torch.from_numpy(grads), op=td.ReduceOp.SUM, group=group)
        grads /= np.float32(world)
        return grads

    return allreduce


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
