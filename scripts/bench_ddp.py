"""Data-parallel training throughput: one GPU against several (one process per GPU, gloo
all-reduce of the gradients between backward and update), for the addition transformer and
transformer_large; writes JSON.

    python scripts/bench_ddp.py --out scripts/results/bench_ddp_h200x2.json [--world 2] [--steps 50]
        [--models addition_transformer,transformer_large] [--adapters 0,1]

Needs torch (any build: gloo runs on the CPU), wgpu, numpy and this repository's aot; builds the
packages into a temporary folder. For each model, one process per configuration, random inputs
of the declared shapes, `--warmup` steps first, then `--steps` timed steps ending with a read
that waits for the GPU:
  single:     one process, step()                                     (the baseline)
  identity:   one process, step(allreduce=lambda g: g)                (cost of crossing the host:
              the gradient readback, the upload and the second submit)
  ddp:        --world processes, adapter = rank's GPU, step(allreduce=allreduce_mean()): steps/s
              per rank, sequences/s over all ranks, the mean all-reduce time per step (the
              function's own time: gloo over 127.0.0.1 and the division), scaling efficiency
  concurrent: --world processes training independently (no all-reduce): what the GPUs and the
              host give without communication (e.g. shared CPU for submits)
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


def worker(job: dict) -> dict:
    sys.path.insert(0, job["project"])
    import importlib

    pkg = importlib.import_module(job["name"])
    dist = importlib.import_module(job["name"] + ".distributed")
    rank, world = 0, 1
    if job["mode"] in ("ddp", "concurrent"):
        rank, world = dist.init(timeout_s=600)
    adapter = job["adapters"][rank] if job["adapters"] else dist.local_adapter(rank)  # single: rank 0's GPU
    model = pkg.Model(adapter=adapter)
    prog = model.PROGRAM
    key = next(iter(prog["variants"]["train"].values()))
    bounds = prog["entries"][key]["index_bounds"]
    rng = np.random.default_rng(rank)
    inputs = {}
    for name, (dtype, dims) in prog["signatures"]["train"].items():
        if dtype == "i32":
            inputs[name] = rng.integers(0, bounds.get(name, 2), dims).astype(np.int32)
        else:
            inputs[name] = np.ones(dims, np.float32) if name == "mask" else rng.normal(size=dims).astype(np.float32)
    spent = []
    fn = None
    if job["mode"] == "identity":
        fn = lambda g: g  # noqa: E731
    elif job["mode"] == "ddp":
        reduce = dist.allreduce_mean()
        dist.check_replicas(model)

        def fn(g):
            t = time.perf_counter()
            out = reduce(g)
            spent.append(time.perf_counter() - t)
            return out

    def sync():
        model._engine.read("params", 0, 1)  # waits for everything submitted

    for _ in range(job["warmup"]):
        model.step(**inputs, allreduce=fn)
    sync()
    if world > 1:
        dist.mean(0.0)  # start together
    spent.clear()
    t0 = time.perf_counter()
    for _ in range(job["steps"]):
        model.step(**inputs, allreduce=fn)
    sync()
    dt = time.perf_counter() - t0
    batch = next(iter(inputs.values())).shape[0]
    out = {
        "rank": rank,
        "adapter": model.adapter,
        "steps_per_s": job["steps"] / dt,
        "sequences_per_s": job["steps"] * batch / dt,
        "batch_per_rank": batch,
        "params": model._total,
    }
    if spent:
        out["allreduce_ms_per_step"] = 1e3 * float(np.mean(spent))
        out["allreduce_ms_p90"] = 1e3 * float(np.percentile(spent, 90))
    model.close()
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(job: dict, world: int) -> list[dict]:
    port = _free_port()
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "--worker", json.dumps(job)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    for p in procs:
        stdout, stderr = p.communicate()
        lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            for q in procs:
                q.kill()
            raise RuntimeError(f"worker failed ({job['mode']}, {job['name']}):\n{stderr[-4000:]}")
        results.append(json.loads(lines[-1][len("RESULT ") :]))
    return results


def build(name: str, outdir: Path) -> Path:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "examples"))
    import aot

    program = runpy.run_path(str(ROOT / "examples" / f"{name}.py"))["program"]
    return aot.build(program, outdir)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="the JSON file to write (required)")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--models", default="addition_transformer,transformer_large")
    ap.add_argument("--adapters", default="", help="adapter index per rank (default: each rank's GPU, by local rank)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
        return
    if not args.out:
        ap.error("--out is required")
    adapters = [int(a) for a in args.adapters.split(",")] if args.adapters else []
    import wgpu

    report = {
        "host": platform.node(),
        "adapters": [dict(a.info) for a in wgpu.gpu.enumerate_adapters_sync()],
        "world": args.world,
        "steps": args.steps,
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as tmp:
        for name in args.models.split(","):
            project = build(name, Path(tmp))
            job = dict(name=name, project=str(project), steps=args.steps, warmup=args.warmup, adapters=adapters)
            r = {}
            r["single"] = launch(dict(job, mode="single"), 1)[0]
            r["identity"] = launch(dict(job, mode="identity"), 1)[0]
            r["ddp"] = launch(dict(job, mode="ddp"), args.world)
            r["concurrent"] = launch(dict(job, mode="concurrent"), args.world)
            one = r["single"]["sequences_per_s"]
            total = sum(x["sequences_per_s"] for x in r["ddp"])
            r["summary"] = {
                "steps_per_s_one_gpu": r["single"]["steps_per_s"],
                "steps_per_s_per_rank_ddp": min(x["steps_per_s"] for x in r["ddp"]),
                "sequences_per_s_one_gpu": one,
                "sequences_per_s_ddp": total,
                "scaling_efficiency": total / (one * args.world),
                "host_crossing_ms_per_step": 1e3 * (1 / r["identity"]["steps_per_s"] - 1 / r["single"]["steps_per_s"]),
                "allreduce_ms_per_step": max(x.get("allreduce_ms_per_step", 0.0) for x in r["ddp"]),
                "ddp_ms_per_step_over_one_gpu": 1e3
                * (1 / min(x["steps_per_s"] for x in r["ddp"]) - 1 / r["single"]["steps_per_s"]),
                "distinct_adapters": len({json.dumps(x["adapter"]) for x in r["ddp"]}) == args.world,
            }
            report["models"][name] = r
            print(name, json.dumps(r["summary"], indent=1), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
