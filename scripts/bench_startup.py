"""Start-up cost of a generated package: import, Model(), the first training step, the steps after.

    python scripts/bench_startup.py examples/addition_transformer.py --out startup.json
    python scripts/bench_startup.py examples/transformer_large.py --kernels gpu --runs cold

The example is built once (`aot build`, timed apart); every run is then a fresh process that
imports the package, constructs Model() and trains a few steps on zero-filled inputs of the
declared shapes (the numbers do not matter here, only when each shader gets compiled).
"cold" runs turn the drivers' shader caches off (Mesa: MESA_SHADER_CACHE_DISABLE; NVIDIA:
__GL_SHADER_DISK_CACHE=0), so every kernel is compiled from WGSL; "warm" runs keep them and
follow one unmeasured run that fills them. A CPU adapter (lavapipe) compiles a shader when it
is first dispatched, so its compile time shows in the first step, not in Model().

Each process reports: import_s, adapter_s (choose the adapter), device_s (request the device),
model_s (all of Model()), after_device_s (Model() from the device on: buffers and the initial
parameters), first_step_s (the training entry's pipelines are made here, and on a CPU adapter
compiled), step_s (median of the steps after the first).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COLD_ENV = {"MESA_SHADER_CACHE_DISABLE": "true", "__GL_SHADER_DISK_CACHE": "0"}


def child(folder: str, name: str, kernels: str, steps: int, shader_checks: bool = False, workers: int | None = None) -> dict:
    """One measured process (runs in the subprocess)."""
    t0 = time.perf_counter()
    sys.path.insert(0, folder)
    pkg = __import__(name)
    import numpy as np

    eng = sys.modules[name + ".engine"]
    if workers:
        eng.COMPILE_WORKERS = workers
    marks = {}
    choose = eng.choose_adapter

    def timed_choose(*a, **kw):
        t = time.perf_counter()
        out = choose(*a, **kw)
        marks["adapter_s"] = time.perf_counter() - t
        marks["adapter_done"] = time.perf_counter()
        return out

    buffer = eng.Engine._buffer

    def timed_buffer(self, *a, **kw):  # the first buffer is made right after the device
        marks.setdefault("device_done", time.perf_counter())
        return buffer(self, *a, **kw)

    eng.choose_adapter, eng.Engine._buffer = timed_choose, timed_buffer
    t1 = time.perf_counter()
    model = pkg.Model(kernels=kernels, shader_checks=shader_checks)
    t2 = time.perf_counter()
    sig = model._program["signatures"]["train"]
    dims = model._program["dims"]
    batch = {}
    for n, (dtype, shape) in sig.items():
        shape = tuple(d if isinstance(d, int) else dims[d] for d in shape)
        batch[n] = np.zeros(shape, np.int32) if dtype == "i32" else np.ones(shape, np.float32)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        model.step(**batch)
        times.append(time.perf_counter() - t)
    return {
        "import_s": t1 - t0,
        "adapter_s": marks["adapter_s"],
        "device_s": marks["device_done"] - marks["adapter_done"],
        "model_s": t2 - t1,
        "after_device_s": t2 - marks["device_done"],
        "first_step_s": times[0],
        "step_s": statistics.median(times[1:]) if len(times) > 1 else None,
        "kernel_set": model.kernel_set,
        "adapter": model.adapter.get("name", str(model.adapter)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="an example file, e.g. examples/addition_transformer.py")
    ap.add_argument("--kernels", default="auto", choices=("auto", "gpu", "subgroup", "cpu"))
    ap.add_argument("--shader-checks", action="store_true", help="Model(shader_checks=True): wgpu's run-time checks in the shaders")
    ap.add_argument("--runs", default="cold,warm", help="comma-separated: cold, warm")
    ap.add_argument("--repeat", type=int, default=2, help="processes per kind of run")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--compile-workers", type=int, help="threads making pipelines (the engine's COMPILE_WORKERS, default 8)")
    ap.add_argument("--out")
    ap.add_argument("--child", nargs=2, metavar=("FOLDER", "NAME"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.kernels, args.steps, args.shader_checks, args.compile_workers)))
        return

    sys.path.insert(0, str(ROOT))
    from aot.cli import load_programs
    from aot.pipeline import build

    prog = next(iter(load_programs(args.model).values()))
    with tempfile.TemporaryDirectory(prefix="aot-startup-") as out_dir:  # the package, removed after
        t = time.perf_counter()
        path = build(prog, out_dir, force=True)
        report = {
            "model": args.model, "machine": platform.node(), "python": platform.python_version(),
            "build_s": time.perf_counter() - t, "kernels": args.kernels, "shader_checks": args.shader_checks,
            "compile_workers": args.compile_workers, "runs": {},
        }
        print(f"built {prog.name} in {report['build_s']:.1f} s")

        def run(env_extra: dict) -> dict:
            cmd = [sys.executable, __file__, args.model, "--kernels", args.kernels, "--steps", str(args.steps),
                   "--child", str(path), prog.name] + ["--shader-checks"] * args.shader_checks
            cmd += ["--compile-workers", str(args.compile_workers)] if args.compile_workers else []
            res = subprocess.run(cmd, env={**os.environ, **env_extra}, capture_output=True, text=True)
            if res.returncode:
                raise SystemExit(f"measured process failed:\n{res.stdout}\n{res.stderr}")
            return json.loads(res.stdout.strip().splitlines()[-1])

        for kind in [k for k in args.runs.split(",") if k]:
            if kind == "warm":
                run({})  # fills the shader caches
            rows = [run(COLD_ENV if kind == "cold" else {}) for _ in range(args.repeat)]
            report["runs"][kind] = rows
            for r in rows:
                print(
                    f"{kind:>4}: import {r['import_s']:.2f}  adapter {r['adapter_s']:.2f}  device {r['device_s']:.2f}  "
                    f"Model() {r['model_s']:.2f} (after device {r['after_device_s']:.2f})  "
                    f"first step {r['first_step_s']:.2f}  step {r['step_s'] or float('nan'):.3f} s  "
                    f"[{r['kernel_set']} set on {r['adapter']}]",
                    flush=True,
                )
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
            print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
