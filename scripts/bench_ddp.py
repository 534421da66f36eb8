"""Data-parallel training throughput (issues 14 and 35): one GPU against several, one process per
GPU, for the addition transformer and transformer_large; writes JSON.

    python scripts/bench_ddp.py --out scripts/results/bench_ddp_h100x2.json [--world 2] [--steps 50]
        [--models addition_transformer,transformer_large] [--bucket-mib 25,4] [--backends gloo,nccl]
        [--packages DIR]

Needs torch (gloo runs on any build; NCCL needs CUDA), wgpu, numpy and this repository's aot.
Builds one package per model and bucket size (into --packages, or a temporary folder; a folder
holding them already is reused). Random inputs of the declared shapes, `--warmup` steps, then
`--steps` timed steps ending with a read that waits for the GPU. Configurations:
  single:     one process, step() (the baseline; the other GPUs idle)
  identity:   one process, step(allreduce=lambda g: g): the cost of crossing the host once
  concurrent: --world processes training independently (no all-reduce): what the GPUs and the
              host give without communication
  ddp:        --world processes (adapter and CUDA device = local rank), init(backend="nccl" where
              CUDA is there, else "gloo"), one row per reducer: allreduce_mean(backend, dtype,
              bucketed) for each backend, bucketed and not (and bf16 over the fastest), and each
              bucket size's package (bucketed only); --host-paths adds NCCL rows with the
              bucket copied on the host first (reducer.direct = False) and with the uploads by
              queue.write_buffer (engine.upload_via)
--variants adds NCCL rows (upload=write_buffer|map, copy_threads=N, graphs=1, no_collective=1,
in_place=0, first_submit=N, merge_share=N: engine.BUCKET_MERGE_SHARE, 0 a collective per bucket,
avg=0|1: reducer.nccl_avg (NCCL's ReduceOp.AVG; auto by default), graphs=0|1: reducer.graphs (on by default),
spin_us=N: reducer.SPIN_S, mapspin_us=N: engine.MAP_SPIN_S, prerecord=0: model._prerecord off,
prerecord_max=N: engine.PRERECORD_MAX, prepare=0: the update recorded after the last upload), --tail-share S,...
rows of builds with aot.buckets.TAIL_SHARE = S, --local one-process rows through LocalBuckets (the same buckets mapped
and uploaded, no communication; with and without the uploads; and each variant), --shm a row through
ShmBuckets (an experiment: the mean computed by the CPUs in shared memory, no CUDA), --timeline N per
row the median time from a bucketed step's start to each of its events (engine.trace: each bucket
mapped, handed over, finished, uploaded; every upload done, "joined"; the update submitted; the next
step), free-running and with each step waited for. --skip ddp leaves out every multi-process row
(one GPU's --local rows alone); --tail-window W builds with aot.buckets.TAIL_WINDOW = W.
Each ddp row: steps/s per rank (the slowest rank), sequences/s over all ranks, scaling efficiency
(against --world times single), bytes each rank sent per step, and per step the milliseconds
the host spent waiting for the GPU (map waits: the backward pass and the readback), copying out
of the mapped buckets, starting the collectives, waiting for them, and uploading the results.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import runpy
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _inputs(prog: dict, rank: int) -> dict:
    key = next(iter(prog["variants"]["train"].values()))
    bounds = prog["entries"][key]["index_bounds"]
    rng = np.random.default_rng(rank)
    out = {}
    for name, (dtype, dims) in prog["signatures"]["train"].items():
        if dtype == "i32":
            b = bounds.get(name, 2)
            # a bound for the whole input, or [bound, offset, dims, ...] per part (pipeline.index_bounds)
            hi = b if isinstance(b, int) else min(part[0] for part in b)
            out[name] = rng.integers(0, hi, dims).astype(np.int32)
        else:
            out[name] = np.ones(dims, np.float32) if name == "mask" else rng.normal(size=dims).astype(np.float32)
    return out


class LocalBuckets:
    """A bucketed reducer that moves nothing between processes (bench only): a step through it
    makes the same readbacks, maps and uploads as a data-parallel one, and uploads zeros (or,
    where the model lets a result stay in the mapped bucket, the bucket itself: the GPU copies
    it back from there, as after NCCL's in-place mean)."""

    def __init__(self):
        self.out = None
        self.stats = {}
        self.in_place = False  # set where the engine uploads from the readback buffers

    def stage(self, n: int) -> np.ndarray:
        self.out = np.zeros(n, np.float32)
        return self.out

    def start(self, values, lo, hi):
        return (lo, hi)

    def start_mapped(self, values, lo, hi):
        return ("in_place", values) if self.in_place and values.flags.writeable else (lo, hi)

    def finish(self, handle):
        return handle[1] if handle[0] == "in_place" else self.out[handle[0] : handle[1]]


class ShmBuckets:
    """An experiment (bench only): the mean of each bucket between processes of one host through
    shared memory and the CPUs, no CUDA. Each rank copies its mapped bucket into its slot; once
    every rank's is there, each sums its 1/world share of the bucket over the slots (rank order)
    and divides, into a shared result; once every share is there, finish returns the bucket's
    part of it (the model uploads from there). Counters in shared memory say which step each
    rank's slot and share hold (x86 keeps stores in order)."""

    def __init__(self, rank: int, world: int, threads: int = 8):
        from concurrent.futures import ThreadPoolExecutor

        self.rank, self.world, self.step, self.stats = rank, world, 0, {}
        self.pool = ThreadPoolExecutor(threads)
        self.threads = threads
        self.index, self.shms = {}, []

    def stage(self, n: int) -> np.ndarray:
        import torch.distributed as td
        from multiprocessing import shared_memory

        prefix = f"aotshm{os.environ.get('MASTER_PORT', '0')}_{n}"
        sizes = {"slot": 4 * n, "res": 4 * n, "ctrl": 8 * 2 * self.world * 64}

        def made(name, size, create):
            m = shared_memory.SharedMemory(name=name, create=create, size=size if create else 0)
            self.shms.append(m)
            return m

        mine = made(f"{prefix}_slot{self.rank}", sizes["slot"], True)
        if self.rank == 0:
            res, ctrl = made(f"{prefix}_res", sizes["res"], True), made(f"{prefix}_ctrl", sizes["ctrl"], True)
            np.frombuffer(ctrl.buf, np.int64)[:] = 0
        td.barrier()
        if self.rank:
            res, ctrl = made(f"{prefix}_res", 0, False), made(f"{prefix}_ctrl", 0, False)
        slots = [mine if r == self.rank else made(f"{prefix}_slot{r}", 0, False) for r in range(self.world)]
        td.barrier()
        if self.rank == 0:  # the names go once every rank has them open; the memory stays until closed
            for m in self.shms:
                m.unlink()
        self.slots = [np.frombuffer(m.buf, np.float32, n) for m in slots]
        self.res = np.frombuffer(res.buf, np.float32, n)
        self.ctrl = np.frombuffer(ctrl.buf, np.int64).reshape(2, self.world, 64)
        return np.empty(n, np.float32)

    def begin(self, buckets) -> None:
        self.index = {tuple(b): i for i, b in enumerate(buckets)}
        self.step += 1

    def _split(self, fn, lo: int, hi: int) -> None:
        parts = max(1, min(self.threads, (hi - lo) // (1 << 18)))
        cuts = [lo + (hi - lo) * k // parts for k in range(parts + 1)]
        list(self.pool.map(lambda k: fn(cuts[k], cuts[k + 1]), range(parts)))

    def _wait(self, row: int, b: int) -> None:
        t0 = time.perf_counter()
        while (self.ctrl[row, :, b] != self.step).any():
            time.sleep(20e-6)
            if time.perf_counter() - t0 > 120:
                raise RuntimeError("ShmBuckets: a rank did not arrive within 120 s")

    def start_mapped(self, values, lo, hi):
        mine = self.slots[self.rank]
        self._split(lambda a, z: np.copyto(mine[a:z], values[a - lo : z - lo]), lo, hi)
        b = self.index[(lo, hi)]
        self.ctrl[0, self.rank, b] = self.step
        return (b, lo, hi)

    start = start_mapped

    def finish(self, handle):
        b, lo, hi = handle
        self._wait(0, b)
        a = lo + (hi - lo) * self.rank // self.world
        z = lo + (hi - lo) * (self.rank + 1) // self.world

        def add(x, y):
            out = self.res[x:y]
            np.add(self.slots[0][x:y], self.slots[1][x:y], out=out)
            for r in range(2, self.world):
                out += self.slots[r][x:y]
            out /= np.float32(self.world)

        if z > a:
            self._split(add, a, z)
        self.ctrl[1, self.rank, b] = self.step
        self._wait(1, b)
        return self.res[lo:hi]


def _timeline(model, step, steps: int, sync: bool) -> dict:
    """Median milliseconds from a bucketed step's start to each of its events (engine.trace),
    the next step's start ("next"), and with sync, when a read after the step returns ("gpu_done")."""
    eng = model._engine
    eng.trace = []
    ends = []
    for _ in range(steps):
        step()
        if sync:
            eng.read("params", 0, 1)
            ends.append(time.perf_counter())
    trace, eng.trace = eng.trace, None
    starts = [t for e, _, t in trace if e == "step"]
    rows: dict = {}
    k = -1
    for e, i, t in trace:
        if e == "step":
            k += 1
            if k:
                rows.setdefault("next", []).append(t - starts[k - 1])
            continue
        rows.setdefault(e if i < 0 else f"{e}_{i}", []).append(t - starts[k])
    for k, end in enumerate(ends[: len(starts)]):
        rows.setdefault("gpu_done", []).append(end - starts[k])
    return {e: round(1e3 * float(np.median(ts)), 3) for e, ts in sorted(rows.items(), key=lambda kv: np.median(kv[1]))}


def _cpu_list(text: str) -> list[int]:
    """The CPUs of a sysfs cpulist ("0-15,32-47")."""
    out = []
    for part in text.strip().split(","):
        if part:
            a, _, b = part.partition("-")
            out += range(int(a), int(b or a) + 1)
    return out


def pin_cpus(local_rank: int) -> list[int] | None:
    """Pin this process to CPUs next to its GPU (--pin-cpus): the CPUs sysfs lists as local to the
    LOCAL_RANK-th CUDA device's PCI address, shared in equal slices among the local GPUs that
    list the same ones. Round 8's rows varied 15-35% from launch to launch (one GPU 1.15-1.34 ms
    a step of the addition transformer): the processes' CPUs. None (nothing pinned) where torch,
    CUDA or sysfs does not say."""
    try:
        import torch

        lists = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            address = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
            lists.append(_cpu_list(Path(f"/sys/bus/pci/devices/{address}/local_cpulist").read_text()))
        gpu = local_rank % len(lists)
        alike = [i for i, cpus in enumerate(lists) if cpus == lists[gpu]]
        k, n, cpus = alike.index(gpu), len(alike), lists[gpu]
        mine = cpus[k * len(cpus) // n : (k + 1) * len(cpus) // n] or cpus
        os.sched_setaffinity(0, mine)
        return mine
    except Exception:  # noqa: BLE001 - a measurement aid: unpinned where it cannot be done
        return None


def worker(job: dict) -> dict:
    import importlib

    sys.path.insert(0, job["project"])
    pinned = pin_cpus(int(os.environ.get("LOCAL_RANK", "0"))) if job.get("pin_cpus") else None
    results = []
    dist = None
    rank, world = 0, 1
    for pkg_dir, pkg_name, label, variants in job["runs"]:
        sys.path.insert(0, pkg_dir)
        for k in [m for m in sys.modules if m == pkg_name or m.startswith(pkg_name + ".")]:
            del sys.modules[k]  # another bucket size's build of the same package
        pkg = importlib.import_module(pkg_name)
        dist = importlib.import_module(pkg_name + ".distributed")
        if world == 1 and job["world"] > 1:
            rank, world = dist.init(timeout_s=600, backend=job["init_backend"])
        adapter = job["adapters"][rank] if job["adapters"] else dist.local_adapter(rank)
        model = pkg.Model(adapter=adapter)
        inputs = _inputs(model.PROGRAM, rank)
        batch = next(iter(inputs.values())).shape[0]
        eng = model._engine
        if world > 1:
            dist.check_replicas(model)
        for v in variants:
            fn, reducer = None, None
            if v["mode"] == "identity":
                fn = lambda g: g  # noqa: E731
            elif v["mode"] == "local":
                fn = LocalBuckets()
            elif v["mode"] == "shm":
                fn = ShmBuckets(rank, world)
            elif v["mode"] == "ddp":
                fn = reducer = dist.allreduce_mean(backend=v["backend"], dtype=v["dtype"], bucketed=v["bucketed"])
                if v.get("direct") is False:
                    reducer.direct = False
                if "graphs" in v:  # reducer.graphs (on by default since round 8)
                    reducer.graphs = bool(int(v["graphs"]))
                if v.get("in_place") is not None:  # "0": the mean into pinned memory, then a host copy up
                    reducer.in_place = bool(int(v["in_place"]))
                if "avg" in v:  # NCCL's ReduceOp.AVG instead of a sum and a division (auto by default since round 8)
                    reducer.nccl_avg = bool(int(v["avg"]))
                if "spin_us" in v:  # finish() of a replayed graph: yielding polls for this long (reducer.SPIN_S)
                    reducer.SPIN_S = float(v["spin_us"]) * 1e-6
                if v.get("no_collective"):  # the copies to and from CUDA alone (each rank keeps its own gradients)
                    reducer._reduce = lambda dev: dev
            default_upload = job.setdefault("default_upload", eng.upload_via)
            eng.upload_via = v.get("upload", default_upload)
            if isinstance(fn, LocalBuckets):
                fn.in_place = eng.upload_via == "readback"
            engine_module = sys.modules[type(eng).__module__]
            default_threads = job.setdefault("default_copy_threads", engine_module.COPY_THREADS)
            engine_module.COPY_THREADS = int(v.get("copy_threads", default_threads))
            default_first = job.setdefault("default_first_submit", getattr(engine_module, "BUCKET_FIRST_SUBMIT", 0))
            engine_module.BUCKET_FIRST_SUBMIT = int(v.get("first_submit", default_first))
            if hasattr(engine_module, "BUCKET_MERGE_SHARE"):  # 0: a collective per bucket (engine.bucket_groups)
                default_share = job.setdefault("default_merge_share", engine_module.BUCKET_MERGE_SHARE)
                engine_module.BUCKET_MERGE_SHARE = int(v.get("merge_share", default_share))
            if hasattr(engine_module, "MAP_SPIN_S"):  # mapspin_us=N: a map's polls yield for N us (engine.MAP_SPIN_S)
                default_spin = job.setdefault("default_map_spin", engine_module.MAP_SPIN_S)
                engine_module.MAP_SPIN_S = float(v["mapspin_us"]) * 1e-6 if "mapspin_us" in v else default_spin
            if hasattr(type(model), "_prepare_update"):  # prepare=0: the update recorded after the last upload
                model._prepare_update = bool(int(v.get("prepare", 1)))
            if hasattr(type(model), "_prerecord"):  # prerecord=0: each step records its backward when it starts
                model._prerecord = bool(int(v.get("prerecord", 1)))
                default_most = job.setdefault("default_prerecord_max", engine_module.PRERECORD_MAX)
                # prerecord_max=N: engine.PRERECORD_MAX (the longest entry that prerecords)
                engine_module.PRERECORD_MAX = int(v.get("prerecord_max", default_most))
            if v.get("skip_uploads"):  # the readbacks alone: the update uses this rank's own gradients
                eng.upload_via = "write_buffer"  # no upload buffer is asked to be mapped
                eng.upload_bucket = lambda i, values, last=False: None
            else:
                eng.__dict__.pop("upload_bucket", None)
            timing = {"map_wait_s": 0.0, "copy_s": 0.0, "start_s": 0.0, "finish_s": 0.0, "upload_s": 0.0}

            def step():
                model.step(**inputs, allreduce=fn)
                if fn is not None:
                    timing["map_wait_s"] += eng.last_timing[1]
                for k, x in (getattr(model, "bucket_timing", None) or {}).items():
                    timing[k] += x

            for _ in range(job["warmup"]):
                step()
            eng.read("params", 0, 1)  # waits for everything submitted
            if world > 1:
                dist.mean(0.0)  # start together
            timing.update(dict.fromkeys(timing, 0.0))
            model.bucket_timing = None
            if reducer is not None:
                reducer.stats.update(calls=0, bytes=0, wait_s=0.0, start_s=0.0, copy_wait_s=0.0, collective_s=0.0)
            t0 = time.perf_counter()
            for _ in range(job["steps"]):
                step()
            eng.read("params", 0, 1)
            dt = time.perf_counter() - t0
            n = job["steps"]
            row = dict(
                v, model=label, rank=rank, adapter=model.adapter, steps_per_s=n / dt, sequences_per_s=n * batch / dt,
                batch_per_rank=batch, params=model._total, ms_per_step=1e3 * dt / n, pinned_cpus=pinned,
            )
            if fn is not None:
                row["host_ms_per_step"] = {k[:-2] + "_ms": 1e3 * x / n for k, x in timing.items()}
            if job.get("timeline") and (reducer is not None or v["mode"] in ("local", "shm")):
                if world > 1:
                    dist.mean(0.0)
                row["timeline_ms"] = _timeline(model, step, job["timeline"], sync=False)
                if world > 1:
                    dist.mean(0.0)
                row["timeline_synced_ms"] = _timeline(model, step, job["timeline"], sync=True)
            if reducer is not None:
                st = reducer.stats
                row["bytes_sent_per_step"] = st["bytes"] / n
                row["collectives_per_step"] = st["calls"] / n
                row["comm_wait_ms_per_step"] = 1e3 * st["wait_s"] / n
                row["comm_start_ms_per_step"] = 1e3 * st["start_s"] / n
                row["mapped_copy_wait_ms_per_step"] = 1e3 * st.get("copy_wait_s", 0.0) / n
                row["collective_call_ms_per_step"] = 1e3 * st.get("collective_s", 0.0) / n
                row["backend_used"] = reducer.backend
                row["graph_error"] = getattr(reducer, "graph_error", None)
                row["buckets"] = len(eng.entries[next(iter(model.PROGRAM["variants"]["train"].values()))].get("buckets", []))
            results.append(row)
        model.close()
    return {"rank": rank, "rows": results}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(job: dict, world: int) -> list[dict]:
    port = _free_port()
    procs = []
    job = dict(job, world=world)
    for rank in range(world):
        env = dict(
            os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "--worker", json.dumps(job)], env=env, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True,
            )
        )
    results = []
    for p in procs:
        stdout, stderr = p.communicate()
        lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            for q in procs:
                q.kill()
            raise RuntimeError(f"worker failed:\n{stderr[-4000:]}")
        results.append(json.loads(lines[-1][len("RESULT ") :]))
    return results


def build(name: str, outdir: Path, bucket_mib: float, tail_window: float | None = None, tail_share: int | None = None) -> Path:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "examples"))
    import aot
    import aot.buckets

    folder = outdir / f"{name}_b{bucket_mib:g}" if tail_window is None else outdir / f"{name}_b{bucket_mib:g}_w{tail_window:g}"
    if tail_window is not None:  # the bucket rule's window (aot.buckets.TAIL_WINDOW; 0: only the last bucket small)
        aot.buckets.TAIL_WINDOW = tail_window
    if tail_share is not None:  # the cap on the bucket final last (aot.buckets.TAIL_SHARE), for this build only
        folder = folder.with_name(folder.name + f"_s{tail_share}")
    if (folder / name / name / "__init__.py").exists():
        return folder / name
    program = runpy.run_path(str(ROOT / "examples" / f"{name}.py"))["program"]
    old = aot.buckets.TAIL_SHARE
    aot.buckets.TAIL_SHARE = old if tail_share is None else tail_share
    try:
        return aot.build(program, folder, bucket_mib=bucket_mib)
    finally:
        aot.buckets.TAIL_SHARE = old


def _by_rank(results: list[dict]) -> list[list[dict]]:
    """Rows per configuration, one per rank."""
    return [list(rows) for rows in zip(*[r["rows"] for r in results])]


def summarize(single: dict, rows: list[dict], world: int) -> dict:
    slowest = min(rows, key=lambda r: r["steps_per_s"])
    total = sum(r["sequences_per_s"] for r in rows)
    out = {
        "steps_per_s_per_rank": slowest["steps_per_s"],
        "sequences_per_s": total,
        "speedup_over_one_gpu": total / single["sequences_per_s"],
        "scaling_efficiency": total / (world * single["sequences_per_s"]),
        "ms_per_step_over_one_gpu": 1e3 / slowest["steps_per_s"] - 1e3 / single["steps_per_s"],
    }
    for k in ("bytes_sent_per_step", "collectives_per_step", "comm_wait_ms_per_step", "comm_start_ms_per_step",
              "mapped_copy_wait_ms_per_step", "collective_call_ms_per_step", "buckets"):
        if k in slowest:
            out[k] = max(r[k] for r in rows)
    if "host_ms_per_step" in slowest:
        out["host_ms_per_step"] = slowest["host_ms_per_step"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="the JSON file to write (required)")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--models", default="addition_transformer,transformer_large")
    ap.add_argument("--bucket-mib", default="25", help="bucket sizes to build and compare (the first is the main one)")
    ap.add_argument("--backends", default="", help="ddp backends (default: gloo, and nccl where torch has CUDA)")
    ap.add_argument("--packages", help="build the packages here (reused when there already)")
    ap.add_argument("--adapters", default="", help="adapter index per rank (default: each rank's GPU, by local rank)")
    ap.add_argument("--skip", default="", help="configurations to leave out: identity,concurrent,unbucketed,bf16, "
                    "ddp (all the multi-process rows: one GPU's --local rows alone)")
    ap.add_argument("--host-paths", action="store_true", help="also NCCL rows with the host copy into stage() "
                    "(direct=False) and with uploads by queue.write_buffer")
    ap.add_argument("--variants", default="", help="more NCCL bucketed rows, ';'-separated, each of key=value "
                    "pairs joined by ',': upload=write_buffer (engine.upload_via), copy_threads=N (engine.COPY_THREADS), "
                    "graphs=1 (reducer.graphs), no_collective=1 (the CUDA copies without the all-reduce), first_submit=N "
                    "(engine.BUCKET_FIRST_SUBMIT; 0: the first bucket's dispatches in one submit), upload=map (no uploads from "
                    "the readback buffers), in_place=0 (NCCL's mean into pinned memory, then a host copy), merge_share=N "
                    "(engine.BUCKET_MERGE_SHARE; 0: a collective per bucket), avg=1 (reducer.nccl_avg), prepare=0 (model._prepare_update)")
    ap.add_argument("--local", action="store_true", help="also one-process rows through a reducer that moves "
                    "nothing (bench's LocalBuckets): the readbacks and uploads alone, with and without the uploads, "
                    "and each --variants")
    ap.add_argument("--timeline", type=int, default=0, help="after the timed steps, this many more with each "
                    "bucketed step's events timed (engine.trace), free-running and then each waited for")
    ap.add_argument("--shm", action="store_true", help="also a row through ShmBuckets (an experiment: the mean "
                    "in shared memory by the CPUs, no CUDA; one host)")
    ap.add_argument("--tail-window", type=float, help="build with aot.buckets.TAIL_WINDOW set to this (0: the "
                    "default, only the last bucket small)")
    ap.add_argument("--tail-share", default="", help="also NCCL rows of builds with aot.buckets.TAIL_SHARE set to "
                    "each of these (','-separated; the cap on the bucket final last: 1/TAIL_SHARE of --bucket-mib)")
    ap.add_argument("--pin-cpus", action="store_true", help="pin each process (the one-GPU rows' too) to the CPUs "
                    "local to its GPU (sysfs), split among GPUs that share them: less noise between launches")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    if not args.out:
        ap.error("--out is required")
    import torch
    import wgpu

    cuda = torch.cuda.is_available() and torch.distributed.is_nccl_available()
    backends = args.backends.split(",") if args.backends else (["gloo", "nccl"] if cuda else ["gloo"])
    sizes = [float(x) for x in args.bucket_mib.split(",")]
    skip = set(args.skip.split(",")) - {""}
    adapters = [int(a) for a in args.adapters.split(",")] if args.adapters else []
    report = {
        "host": platform.node(),
        "adapters": [dict(a.info) for a in wgpu.gpu.enumerate_adapters_sync()],
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "torch": torch.__version__,
        "world": args.world,
        "steps": args.steps,
        "bucket_mib": sizes,
        "tail_window": args.tail_window,
        "models": {},
    }
    tmp = tempfile.TemporaryDirectory(prefix="bench-ddp-")
    where = Path(args.packages) if args.packages else Path(tmp.name)
    common = dict(steps=args.steps, warmup=args.warmup, adapters=adapters, init_backend="nccl" if "nccl" in backends else "gloo",
                  timeline=args.timeline, pin_cpus=args.pin_cpus)
    variants = [dict(kv.split("=", 1) for kv in v.split(",")) for v in args.variants.split(";") if v]
    for name in args.models.split(","):
        t0 = time.perf_counter()
        projects = {mib: build(name, where, mib, args.tail_window) for mib in sizes}
        first = projects[sizes[0]]
        r = {}
        one = [{"mode": "single"}] + ([] if "identity" in skip else [{"mode": "identity"}])
        local = [{"mode": "local"}, {"mode": "local", "skip_uploads": True}] + [dict(v, mode="local") for v in variants]
        one += local if args.local else []
        (solo,) = launch(dict(common, project=str(first), runs=[[str(first), name, name, one]]), 1)
        r["single"] = solo["rows"][0]
        if "identity" not in skip:
            r["identity"] = solo["rows"][1]
        if args.local:
            r["local"] = solo["rows"][-len(local) :]
        if "concurrent" not in skip:
            conc = launch(dict(common, init_backend="gloo", project=str(first), runs=[[str(first), name, name, [{"mode": "single"}]]]), args.world)
            r["concurrent"] = [x["rows"][0] for x in conc]
        runs = []
        main_variants = []
        for b in backends:
            for bucketed in ([True] if "unbucketed" in skip else [False, True]):
                main_variants.append({"mode": "ddp", "backend": b, "bucketed": bucketed, "dtype": "f32", "bucket_mib": sizes[0]})
        if args.host_paths and "nccl" in backends:  # round 2's host copy in; the uploads by write_buffer
            base = {"mode": "ddp", "backend": "nccl", "bucketed": True, "dtype": "f32", "bucket_mib": sizes[0]}
            main_variants += [dict(base, direct=False), dict(base, upload="write_buffer")]
        if variants:
            base = {"mode": "ddp", "backend": backends[-1], "bucketed": True, "dtype": "f32", "bucket_mib": sizes[0]}
            main_variants += [dict(base, **v) for v in variants]
        if args.shm:
            main_variants.append({"mode": "shm", "backend": "shm", "bucketed": True, "dtype": "f32", "bucket_mib": sizes[0]})
        if "bf16" not in skip:
            main_variants.append({"mode": "ddp", "backend": backends[-1], "bucketed": True, "dtype": "bf16", "bucket_mib": sizes[0]})
        runs.append([str(first), name, name, main_variants])
        for mib in sizes[1:]:
            runs.append([str(projects[mib]), name, name, [
                {"mode": "ddp", "backend": backends[-1], "bucketed": True, "dtype": "f32", "bucket_mib": mib}
            ]])
        for share in [int(x) for x in args.tail_share.split(",") if x]:
            folder = build(name, where, sizes[0], args.tail_window, share)
            runs.append([str(folder), name, name, [
                {"mode": "ddp", "backend": backends[-1], "bucketed": True, "dtype": "f32", "bucket_mib": sizes[0], "tail_share": share}
            ]])
        results = launch(dict(common, project=str(first), runs=runs), args.world) if "ddp" not in skip else []
        r["ddp"] = _by_rank(results)
        single = r["single"]
        r["summary"] = {
            "steps_per_s_one_gpu": single["steps_per_s"],
            "sequences_per_s_one_gpu": single["sequences_per_s"],
            "host_crossing_ms_per_step": (1e3 / r["identity"]["steps_per_s"] - 1e3 / single["steps_per_s"]) if "identity" in r else None,
            "concurrent_scaling_efficiency": (
                sum(x["sequences_per_s"] for x in r["concurrent"]) / (args.world * single["sequences_per_s"]) if "concurrent" in r else None
            ),
            "distinct_adapters": bool(r["ddp"]) and len({json.dumps(x["adapter"]) for x in r["ddp"][0]}) == args.world,
            "ddp": {
                f"{rows[0]['backend']} {'bucketed ' + format(rows[0]['bucket_mib'], 'g') + ' MiB' if rows[0]['bucketed'] else 'unbucketed'}"
                f"{' ' + rows[0]['dtype'] if rows[0]['dtype'] != 'f32' else ''}"
                f"{' host copy' if rows[0].get('direct') is False else ''}"
                f"{' upload ' + rows[0]['upload'] if 'upload' in rows[0] else ''}"
                f"{' copy_threads ' + rows[0]['copy_threads'] if 'copy_threads' in rows[0] else ''}"
                f"{' no_collective' if rows[0].get('no_collective') else ''}"
                f"{' in_place ' + rows[0]['in_place'] if 'in_place' in rows[0] else ''}"
                f"{' first_submit ' + rows[0]['first_submit'] if 'first_submit' in rows[0] else ''}"
                f"{' merge_share ' + rows[0]['merge_share'] if 'merge_share' in rows[0] else ''}"
                f"{' prepare ' + rows[0]['prepare'] if 'prepare' in rows[0] else ''}"
                f"{''.join(f' {k} {rows[0][k]}' for k in ('graphs', 'avg', 'spin_us', 'mapspin_us', 'prerecord', 'prerecord_max', 'tail_share') if k in rows[0])}": summarize(single, rows, args.world)
                for rows in r["ddp"]
            },
        }
        if args.local:
            r["summary"]["local"] = {
                " ".join(f"{k} {x}" for k, x in row.items() if k in ("upload", "skip_uploads", "copy_threads", "first_submit", "in_place", "prepare")) or "map": {
                    "steps_per_s": row["steps_per_s"],
                    "ms_per_step_over_one_gpu": 1e3 / row["steps_per_s"] - 1e3 / single["steps_per_s"],
                    "host_ms_per_step": row.get("host_ms_per_step"),
                }
                for row in r["local"]
            }
        r["seconds"] = time.perf_counter() - t0
        report["models"][name] = r
        print(name, json.dumps(r["summary"], indent=1), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
