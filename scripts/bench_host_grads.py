"""Would gradients that live in host-visible memory pay (issue 35)? One GPU, no communication.

A bucketed data-parallel step moves every gradient across PCIe twice on wgpu's one queue: a copy
of each bucket into a mappable buffer while the backward pass runs, and a copy of the reduced
means back before the update; the copies do not overlap the dispatches (bench_copy_overlap.py),
which bounds transformer_large on 2 H200s near 1.75x one GPU (bench_ddp_h200x2_r8/r9.json). The
way around them without a second queue: the gradient kernels write straight into buffers the host
maps (wgpu-native's mappable-primary-buffers) and the update reads the means from there, so the
transfers ride inside compute kernels. Before building that (per-bucket gradient arenas in the
plan), this measures its price: the same package's step() with its "grads" arena created

  device:     STORAGE | COPY_SRC | COPY_DST (as the engine does)
  host_read:  the same | MAP_READ  (where a bucket's backward writes would go)
  host_rw:    the same | MAP_READ | MAP_WRITE

and, for scale, what the two copies cost: `copies` is device plus a copy of the whole gradient
vector into a MAP_READ buffer and one back from a MAP_WRITE buffer each step, in the same submit
(what a bucketed DDP step puts on the queue, without the overlap its buckets try for).
Each row: the median ms a step over --repeats runs of --steps step() calls, each ending with a
read of the loss. If host_read costs far less than `copies`, the design is worth building.

    python scripts/bench_host_grads.py --out scripts/results/bench_host_grads_h200.json
        [--model transformer_large] [--steps 20] [--warmup 3] [--repeats 3] [--packages DIR]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ddp import _inputs, build  # noqa: E402


def _time(model, inputs: dict, steps: int, warmup: int, repeats: int, extra=None) -> float:
    for _ in range(warmup):
        model.step(**inputs)
    float(model.step(**inputs))
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model.step(**inputs)
            if extra:
                extra()
        float(out)  # waits for the last step
        runs.append((time.perf_counter() - t0) / steps * 1e3)
    return float(np.median(runs))


def run(args) -> dict:
    import wgpu

    pkg_dir = build(args.model, Path(args.packages or tempfile.mkdtemp()), 25.0)
    sys.path.insert(0, str(pkg_dir))
    pkg = importlib.import_module(args.model)
    engine = importlib.import_module(args.model + ".engine")
    u = wgpu.BufferUsage
    placements = {"device": 0, "host_read": u.MAP_READ, "host_rw": u.MAP_READ | u.MAP_WRITE}
    base = engine.Engine._buffer
    out = {"model": args.model, "steps": args.steps, "repeats": args.repeats, "ms_per_step": {}}
    for name, extra_usage in list(placements.items()) + [("copies", None)]:

        def _buffer(self, arena, n, extra_usage=extra_usage):
            if arena != "grads" or not extra_usage:
                return base(self, arena, n)
            usage = u.STORAGE | u.COPY_DST | u.COPY_SRC | extra_usage
            return self.device.create_buffer(label=arena, size=max(4, 4 * n), usage=usage)

        engine.Engine._buffer = _buffer
        try:
            model = pkg.Model()
        finally:
            engine.Engine._buffer = base
        eng = model._engine
        if name != "device" and engine.MAPPABLE_FEATURE not in eng.device.features:
            out["ms_per_step"][name] = None
            out.setdefault("skipped", {})[name] = "the device lacks " + engine.MAPPABLE_FEATURE
            model.close()
            continue
        inputs = _inputs(model.PROGRAM, 0)
        extra = None
        if name == "copies":
            grads = eng.buffers["grads"]
            down = eng.device.create_buffer(size=grads.size, usage=u.MAP_READ | u.COPY_DST)
            up = eng.device.create_buffer(size=grads.size, usage=u.MAP_WRITE | u.COPY_SRC)

            def extra():
                enc = eng.device.create_command_encoder()
                enc.copy_buffer_to_buffer(grads, 0, down, 0, grads.size)
                enc.copy_buffer_to_buffer(up, 0, grads, 0, grads.size)
                eng.device.queue.submit([enc.finish()])

            out["grad_bytes"] = grads.size
        out["ms_per_step"][name] = _time(model, inputs, args.steps, args.warmup, args.repeats, extra)
        out.setdefault("adapter", eng.adapter_info.get("device"))
        print(name, out["ms_per_step"][name], flush=True)
        model.close()
    dev = out["ms_per_step"]["device"]
    out["over_device_ms"] = {k: (v - dev if v is not None else None) for k, v in out["ms_per_step"].items() if k != "device"}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="transformer_large")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--packages", help="build the package here (reused when there already)")
    args = ap.parse_args()
    res = run(args)
    print(json.dumps(res, indent=1))
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
