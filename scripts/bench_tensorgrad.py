"""aot against tensorgrad (the TypeScript library it re-creates), training steps on one adapter in one run.

    VK_ICD_FILENAMES=... python scripts/bench_tensorgrad.py --tensorgrad ~/src/tensorgrad --rounds 5 --out tg.json

--tensorgrad is a checkout of github.com/typebulb/tensorgrad (0.4.6 is what docs/reference
describes); it is copied into --workdir and built there with its own build script, next to the
npm packages the run needs (esbuild, and `webgpu`: Dawn for Node). Needs node and npm. Dawn
refuses Debian 12's stock lavapipe (Mesa 22); Mesa 25's works (README: how to unpack it and
select it with VK_ICD_FILENAMES), and both libraries then get the same adapter from the
environment.

Models: tensorgrad's mlp-sin and addition-transformer samples (their own spec files) against
examples/sine_mlp.py and examples/addition_transformer.py, and tensorgrad-bench's 784-256-10 MLP
(scripts/tensorgrad_bench.mjs) against examples/mnist_mlp.py. Each round runs every model once
in each library, each run a fresh process: WARMUP steps, then the median of STEPS. The ratio
reported per model is the median over rounds of tensorgrad's step time over aot's in the same
round (interleaved, so a busier machine slows both sides of a ratio alike).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("sine_mlp", "addition_transformer", "mnist_mlp")
NPM_PACKAGES = ("esbuild@0.28", "webgpu@0.6.2")


def child(folder: str, name: str, steps: int, warmup: int) -> dict:
    """One aot process: Model(), WARMUP steps, then STEPS timed (runs in the subprocess)."""
    sys.path.insert(0, folder)
    import numpy as np

    pkg = __import__(name)
    t = time.perf_counter()
    model = pkg.Model()
    model_s = time.perf_counter() - t
    rng = np.random.default_rng(0)
    sig, dims = model._program["signatures"]["train"], model._program["dims"]
    batch = {}
    for n, (dtype, shape) in sig.items():
        shape = tuple(d if isinstance(d, int) else dims[d] for d in shape)
        # values in every op's domain (indices in any vocabulary of 10 or more)
        batch[n] = rng.integers(0, 10, shape, dtype=np.int32) if dtype == "i32" else rng.random(shape, dtype=np.float32)
    times, losses = [], []
    for i in range(warmup + steps):
        t = time.perf_counter()
        losses.append(float(model.step(**batch)))
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return {"model_s": model_s, "step_ms": 1e3 * statistics.median(times), "steps": steps, "kernel_set": model.kernel_set,
            "adapter": model.adapter.get("name", ""), "first_loss": losses[0], "last_loss": losses[-1]}


def run_json(cmd: list, env: dict | None = None, cwd: Path | None = None) -> dict:
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode or not lines:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return json.loads(lines[-1])


def prepare_tensorgrad(checkout: Path, work: Path) -> tuple[Path, dict]:
    """Copy and build tensorgrad in `work`, bundle the Node harness against it: (bundle, about)."""
    for tool in ("node", "npm"):
        if not shutil.which(tool):
            raise SystemExit(f"bench_tensorgrad: `{tool}` is not on PATH; install Node.js 20 or newer")
    meta = json.loads((checkout / "package.json").read_text())
    if meta.get("name") != "tensorgrad":
        raise SystemExit(f"bench_tensorgrad: {checkout} is not a tensorgrad checkout (package.json names {meta.get('name')!r})")
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    src = work / "tensorgrad"
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(checkout, src, ignore=shutil.ignore_patterns("node_modules", "dist", ".git"))
    npm = ["npm", "install", "--no-save", "--no-audit", "--no-fund", "--loglevel=error"]
    subprocess.run(npm + list(NPM_PACKAGES), cwd=work, check=True)
    subprocess.run(npm + [NPM_PACKAGES[0]], cwd=src, check=True)  # its build script imports esbuild
    subprocess.run(["node", "scripts/build.mjs"], cwd=src, check=True)
    bundle = work / "bundle.mjs"
    subprocess.run(
        [str(work / "node_modules" / ".bin" / "esbuild"), str(ROOT / "scripts" / "tensorgrad_bench.mjs"), "--bundle",
         "--format=esm", "--platform=node", "--target=node20", "--log-level=warning", f"--outfile={bundle}",
         f"--alias:tensorgrad={src / 'dist' / 'index.js'}", f"--alias:tensorgrad-samples={src / 'samples'}"],
        check=True,
    )
    node = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()
    return bundle, {"version": meta.get("version"), "commit": commit, "node": node, "npm": list(NPM_PACKAGES)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensorgrad", type=Path, help="a checkout of github.com/typebulb/tensorgrad")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "aot-bench-tensorgrad")
    ap.add_argument("--out")
    ap.add_argument("--child", nargs=2, metavar=("FOLDER", "NAME"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.steps, args.warmup)))
        return
    if args.tensorgrad is None:
        raise SystemExit("bench_tensorgrad: --tensorgrad PATH (a checkout of github.com/typebulb/tensorgrad) is required")
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        raise SystemExit(f"bench_tensorgrad: unknown models {unknown}; choose from {', '.join(MODELS)}")
    args.workdir.mkdir(parents=True, exist_ok=True)
    bundle, about = prepare_tensorgrad(args.tensorgrad.expanduser().resolve(), args.workdir)
    webgpu = args.workdir / "node_modules" / "webgpu" / "index.js"

    sys.path.insert(0, str(ROOT))
    from aot.cli import load_programs
    from aot.pipeline import build

    report = {"machine": platform.node(), "python": platform.python_version(), "tensorgrad": about,
              "vk_icd_filenames": os.environ.get("VK_ICD_FILENAMES", ""), "steps": args.steps, "warmup": args.warmup,
              "models": {}}
    with tempfile.TemporaryDirectory(prefix="aot-bench-tg-") as out_dir:
        packages = {}
        for m in models:
            prog = next(iter(load_programs(str(ROOT / "examples" / f"{m}.py")).values()))
            packages[m] = (build(prog, out_dir, force=True), prog.name)
        rounds = {m: [] for m in models}
        for r in range(args.rounds):
            for m in models if r % 2 == 0 else reversed(models):
                path, name = packages[m]
                tg = run_json(["node", str(bundle), m, str(args.steps), str(args.warmup)],
                              env={**os.environ, "AOT_WEBGPU_MODULE": str(webgpu)})
                ours = run_json([sys.executable, __file__, "--steps", str(args.steps), "--warmup", str(args.warmup),
                                 "--child", str(path), name])
                rounds[m].append({"aot": ours, "tensorgrad": tg, "ratio": tg["step_ms"] / ours["step_ms"]})
                print(f"round {r + 1}: {m:>21}  aot {ours['step_ms']:8.2f} ms  tensorgrad {tg['step_ms']:8.2f} ms  "
                      f"{tg['step_ms'] / ours['step_ms']:5.1f}x  [{ours['kernel_set']} set on {ours['adapter']}]", flush=True)
        for m, rows in rounds.items():
            report["models"][m] = {
                "rounds": rows,
                "aot_step_ms_median": statistics.median(x["aot"]["step_ms"] for x in rows),
                "tensorgrad_step_ms_median": statistics.median(x["tensorgrad"]["step_ms"] for x in rows),
                "ratio_median": statistics.median(x["ratio"] for x in rows),
            }
            s = report["models"][m]
            print(f"{m:>21}: aot {s['aot_step_ms_median']:.2f} ms, tensorgrad {s['tensorgrad_step_ms_median']:.2f} ms: "
                  f"aot {s['ratio_median']:.1f}x faster (median of per-round ratios)")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
