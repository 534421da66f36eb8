"""GPU time of every kernel of one entry point, measured inside the real call with timestamp queries.

    python scripts/profile_kernels.py examples/addition_transformer.py [--entry train] [--reps 20] [--top 25] [--out prof.json]

The entry's dispatch list is recorded exactly as a call records it (one compute pass, the same
pipelines and bind groups), with a timestamp written before the first dispatch and after each
one (WebGPU's `timestamp-query` with `timestamp-query-inside-passes`), `--reps` times in one
command buffer; a kernel's time is the median over reps of the gap between its timestamps.
Without `timestamp-query-inside-passes` each dispatch gets a pass of its own with
`timestamp_writes` (slightly more barriers than the real call); without `timestamp-query` at
all it falls back to one submit per kernel, waited for (that overstates small kernels: the
output says which method was used). Prints a table by kernel and by kernel family (the name
without its entry and index, e.g. matmul_add_relu). Timestamps are taken to be nanoseconds
(Vulkan's timestampPeriod on NVIDIA and lavapipe); --tick-ns scales them otherwise.

    MESA_SHADER_CACHE_DISABLE=true python scripts/profile_kernels.py examples/addition_transformer.py --compile

--compile times what a CPU adapter spends compiling instead: lavapipe compiles a pipeline at
its first dispatch, so each pipeline's cost is its first dispatch (one submit, waited for) less
the median of three more; kernels that share a pipeline (the CPU set's offset tables) count once.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WANT = ("timestamp-query", "timestamp-query-inside-passes")


def _request_timestamps():
    """Make the package's Engine ask for the timestamp features the adapter has (the deployed
    runtime asks for none)."""
    import wgpu

    cls = type(wgpu.gpu.request_adapter_sync(power_preference="high-performance"))
    real = cls.request_device_sync

    def request(self, **kw):
        kw["required_features"] = sorted(set(kw.get("required_features") or ()) | {f for f in WANT if f in self.features})
        return real(self, **kw)

    cls.request_device_sync = request


def family(kname: str) -> str:
    return re.sub(r"^.*?_\d{2,}_", "", kname)


MAX_QUERIES = 4096  # timestamps one query set may hold (wgpu)


def profile_timestamps(e, key, reps, inside):
    """Each kernel's median GPU time (ticks) over `reps` replays of the entry's dispatches, in
    as many query sets (and submits) as the timestamps need."""
    steps = e.recipes[key]
    n = len(steps)
    per_rep = n + 1 if inside else 2 * n
    if per_rep > MAX_QUERIES:
        raise SystemExit(f"{n} dispatches need {per_rep} timestamps a replay, over one query set's {MAX_QUERIES}")
    rounds, left = [], reps
    while left:
        k = min(left, MAX_QUERIES // per_rep)
        rounds.append(_timestamp_round(e, steps, k, per_rep, inside))
        left -= k
    ticks = np.concatenate(rounds)
    if inside:
        d = np.diff(ticks, axis=1)
    else:
        d = ticks[:, 1::2] - ticks[:, 0::2]
    return [float(np.median(d[:, i])) for i in range(n)]


def _timestamp_round(e, steps, reps, per_rep, inside):
    """Timestamps of `reps` replays in one query set: [reps, per_rep] ticks."""
    import wgpu
    from wgpu.backends.wgpu_native.extras import write_timestamp

    count = per_rep * reps
    qs = e.device.create_query_set(type=wgpu.QueryType.timestamp, count=count)
    resolve = e.device.create_buffer(size=8 * count, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)
    enc = e.device.create_command_encoder()
    for r in range(reps):
        base = r * per_rep
        if inside:
            cp = enc.begin_compute_pass()
            write_timestamp(cp, qs, base)
            for i, (pipeline, g, grid, dyn) in enumerate(steps):
                cp.set_pipeline(pipeline)
                if g is not None:
                    cp.set_bind_group(0, g, () if dyn is None else (dyn,))
                cp.dispatch_workgroups(*grid)
                write_timestamp(cp, qs, base + i + 1)
            cp.end()
        else:
            group = None
            for i, (pipeline, g, grid, dyn) in enumerate(steps):
                group = g or group
                tw = {"query_set": qs, "beginning_of_pass_write_index": base + 2 * i, "end_of_pass_write_index": base + 2 * i + 1}
                cp = enc.begin_compute_pass(timestamp_writes=tw)
                cp.set_pipeline(pipeline)
                cp.set_bind_group(0, group, () if dyn is None else (dyn,))
                cp.dispatch_workgroups(*grid)
                cp.end()
    enc.resolve_query_set(qs, 0, count, resolve, 0)
    e.device.queue.submit([enc.finish()])
    ticks = np.frombuffer(e.device.queue.read_buffer(resolve), dtype=np.uint64).astype(np.int64).reshape(reps, per_rep)
    qs.destroy()
    resolve.destroy()
    return ticks


def _submit_one(e, kname, grid) -> float:
    """Seconds of one submit of one dispatch, waited for."""
    enc = e.device.create_command_encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(e.pipelines[kname])
    dyn = e.kernel_offset[kname]
    cp.set_bind_group(0, e.kernel_group[kname], () if dyn is None else (dyn,))
    cp.dispatch_workgroups(*grid)
    cp.end()
    t = time.perf_counter()
    e.device.queue.submit([enc.finish()])
    e.device.queue.read_buffer(e.buffers["params"], 0, 4)
    return time.perf_counter() - t


def profile_submits(e, key, reps):
    return [
        statistics.median(_submit_one(e, kname, grid) for _ in range(reps)) * 1e9
        for kname, grid in e.entries[key]["dispatches"]
    ]


def profile_compile(e, key):
    """[(kernel, grid, ms)] for the first kernel of each pipeline of the entry: its first dispatch
    less its warm time (the entry's pipelines made, none dispatched yet)."""
    e._prepare(key)
    seen, rows = set(), []
    for kname, grid in e.entries[key]["dispatches"]:
        first = _submit_one(e, kname, grid)
        if id(e.pipelines[kname]) in seen:
            continue
        seen.add(id(e.pipelines[kname]))
        warm = statistics.median(_submit_one(e, kname, grid) for _ in range(3))
        rows.append((kname, grid, 1e3 * (first - warm)))
    return rows


def _kind(row: dict) -> str:
    name = row["kernel"]
    kind = next((w for w in ("attention", "matmul") if w in name), None)
    return kind or ("reduction" if re.search(r"_(sum|max|argmax)(_|$)", name) else "other")


def _totals(rows: list[dict], group, field: str) -> list[tuple[str, int, float]]:
    """(group, rows, sum of `field`) per group of rows, largest sum first."""
    out = defaultdict(lambda: [0, 0.0])
    for r in rows:
        out[group(r)][0] += 1
        out[group(r)][1] += r[field]
    return sorted(((name, n, v) for name, (n, v) in out.items()), key=lambda t: -t[2])


def print_compile(e, key, args):
    rows = [
        {"kernel": k, "family": family(k), "grid": list(g), "compile_ms": round(ms, 1)}
        for k, g, ms in profile_compile(e, key)
    ]
    total = sum(r["compile_ms"] for r in rows)
    dev = e.adapter_info.get("device", "?")
    desc = e.adapter_info.get("description", "")
    print(f"{key}: {len(rows)} pipelines, {total / 1e3:.2f} s of compiling at first dispatch on {dev} ({desc}), {e.kernel_set} set")
    print(f"\n{'ms':>8}  kernel (the first of its pipeline)")
    for r in sorted(rows, key=lambda r: -r["compile_ms"])[: args.top]:
        print(f"{r['compile_ms']:8.1f}  {r['kernel']}")
    print(f"\n{'ms':>8} {'count':>6}  kind")
    for name, cnt, ms in _totals(rows, _kind, "compile_ms"):
        print(f"{ms:8.1f} {cnt:6d}  {name}")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "entry": key, "adapter": e.adapter_info, "kernel_set": e.kernel_set,
            "mesa_shader_cache_disabled": os.environ.get("MESA_SHADER_CACHE_DISABLE") == "true",
            "total_compile_ms": round(total, 1), "pipelines": rows,
        }, indent=1) + "\n")
        print(f"wrote {args.out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--program")
    ap.add_argument("--entry", default="train")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--tick-ns", type=float, default=1.0, help="nanoseconds per timestamp tick")
    ap.add_argument("--no-timestamps", action="store_true", help="time one submit per kernel instead")
    ap.add_argument("--kernels", default="auto", choices=("auto", "gpu", "subgroup", "cpu"), help="the kernel set (Model(kernels=...))")
    ap.add_argument("--compile", action="store_true", help="time each pipeline's compile at its first dispatch (CPU adapters)")
    ap.add_argument("--out")
    args = ap.parse_args()

    import aot
    from aot.cli import load_programs

    if not args.no_timestamps and not args.compile:
        _request_timestamps()
    progs = load_programs(args.model)
    prog = progs[args.program] if args.program else next(iter(progs.values()))
    model = aot.compile(prog, kernels=args.kernels)
    e = model._engine
    key = next((k for k in e.entries if k == args.entry or k.startswith(args.entry + "[")), None)
    if key is None:
        sys.exit(f"{args.model} has no entry {args.entry!r}: pass --entry with one of {', '.join(e.entries)}")
    # realistic data: zeros are valid for every input kind (indices 0 are in range)
    packed = {
        "inputs": np.zeros(e.entries[key]["input_sizes"]["inputs"], np.float32),
        "inputs_i32": np.zeros(e.entries[key]["input_sizes"]["inputs_i32"], np.int32),
    }
    if args.compile:
        return print_compile(e, key, args)
    e.run(key, packed, False)  # compile every pipeline first
    feats = set(e.device.features)
    if args.no_timestamps or "timestamp-query" not in feats:
        method = "one submit per kernel, waited for (host clock; overstates small kernels)"
        if not args.no_timestamps:
            method += ": this adapter lacks timestamp-query"
        ns = profile_submits(e, key, max(3, args.reps // 4))
    else:
        inside = "timestamp-query-inside-passes" in feats
        method = (
            "timestamps between dispatches inside the call's one pass" if inside
            else "timestamps around each dispatch in a pass of its own (adapter lacks timestamp-query-inside-passes)"
        )
        ns = [t * args.tick_ns for t in profile_timestamps(e, key, args.reps, inside)]
    rows = [
        {"kernel": k, "family": family(k), "grid": list(g), "us": round(t / 1e3, 3)}
        for (k, g), t in zip(e.entries[key]["dispatches"], ns)
    ]
    total = sum(r["us"] for r in rows)
    dev = e.adapter_info.get("device", "?")
    print(f"{key}: {len(rows)} kernels, {total:.1f} us of GPU time per call on {dev}")
    print(f"method: {method}")
    print(f"\n{'us':>10} {'%':>6}  kernel (grid)")
    for r in sorted(rows, key=lambda r: -r["us"])[: args.top]:
        print(f"{r['us']:10.2f} {100 * r['us'] / max(total, 1e-9):5.1f}%  {r['kernel']} {tuple(r['grid'])}")
    print(f"\n{'us':>10} {'%':>6} {'count':>6}  kernel family")
    for name, cnt, us in _totals(rows, lambda r: r["family"], "us"):
        print(f"{us:10.2f} {100 * us / max(total, 1e-9):5.1f}% {cnt:6d}  {name}")
    if args.out:
        Path(args.out).write_text(
            json.dumps({"entry": key, "adapter": dev, "method": method, "total_us": round(total, 3), "kernels": rows,
                        "families": {k: {"count": c, "us": round(u, 3)} for k, c, u in _totals(rows, lambda r: r["family"], "us")}}, indent=1)
        )
    model.close()


if __name__ == "__main__":
    main()
