"""aot's web package against the browser peers, training steps in headless Chromium.

    python scripts/bench_web.py --tensorgrad ~/src/tensorgrad --rounds 3 --out scripts/results/bench_web_swiftshader.json

Systems (each run a fresh Chromium, Debian's /usr/bin/chromium through Playwright, WebGPU on
whatever adapter the browser has: SwiftShader on a machine without a GPU):
  aot         the web package of aot.web.write_web ("auto" kernel set: "cpu" on a software adapter)
  tfjs-cpu, tfjs-webgl, tfjs-webgpu    TensorFlow.js (@tensorflow/tfjs, core ops, tf.train.adam)
  jax-wasm, jax-webgpu                  jax-js (@jax-js/jax, one jit-compiled step, Adam written out)
  tensorgrad                            tensorgrad built from --tensorgrad (a checkout of
                                        github.com/typebulb/tensorgrad; skipped without one)
The peers' npm packages are installed by this script into --workdir (never committed); each
system's page is scripts/bench_web/<system>.mjs bundled there with esbuild.

Models: examples/sine_mlp.py (1-64-64-1, batch 256, Adam 5e-3), examples/mnist_mlp.py
(784-256-10, batch 128, Adam 1e-3) and examples/addition_transformer.py's transformer (3 blocks,
D 64, 4 heads, batch 128 x 8 tokens) with Adam 5e-3 in place of its AdamW schedule (what every peer
has). Every system gets the same initial parameters (aot's init specs drawn here with NumPy,
loaded by name) and the same batches (4, cycled), and awaits each step's loss on the host.

Per run: create (building the model: pipelines, programs), the first step (compiles whatever is
compiled lazily), a second untimed step, then up to --steps timed steps (fewer once --budget-s
has passed, at least 2): ms/step is their median. Rounds are interleaved (every model and system
once per round, the systems' order rotated each round) so a busier machine slows all alike; the
figure per system is the median over rounds, with the rounds' min and max as the spread.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import platform
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "scripts" / "bench_web"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [  # as tests/test_web.py launches it
    "--no-sandbox", "--enable-unsafe-webgpu", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
NPM_PACKAGES = ("@tensorflow/tfjs@4.22.0", "@tensorflow/tfjs-backend-webgpu@4.22.0", "@jax-js/jax@0.1.25", "esbuild@0.28")
SYSTEMS = {  # name -> (page, backend)
    "aot": ("aot", "auto"),
    "tfjs-cpu": ("tfjs", "cpu"),
    "tfjs-webgl": ("tfjs", "webgl"),
    "tfjs-webgpu": ("tfjs", "webgpu"),
    "jax-wasm": ("jax", "wasm"),
    "jax-webgpu": ("jax", "webgpu"),
    "tensorgrad": ("tensorgrad", "webgpu"),
}
MODELS = {  # name -> (timed steps, learning rate)
    "sine_mlp": (30, 5e-3),
    "mnist_mlp": (20, 1e-3),
    "addition_transformer": (8, 5e-3),
}
N_BATCHES = 4


def programs() -> dict:
    """The aot Program of each model (the transformer with Adam, as the peers have it)."""
    import aot

    out = {m: runpy.run_path(str(ROOT / "examples" / f"{m}.py"))["program"] for m in ("sine_mlp", "mnist_mlp")}
    ex = runpy.run_path(str(ROOT / "examples" / "addition_transformer.py"))
    out["addition_transformer"] = aot.Program(
        "addition_transformer",
        model=ex["Transformer"],
        train=aot.Train(ex["loss"], inputs={"tokens": aot.i32(ex["B"], ex["T"]), "targets": aot.i32(ex["B"], ex["T"]),
                                            "mask": aot.f32(ex["B"], ex["T"])}, optimizer=aot.optim.Adam(lr=5e-3)),
        seed=0,
    )
    return out


def initial_params(table, rng) -> list:
    """[name, shape, values] of every parameter, drawn from its init spec (the same kinds aot has)."""
    out = []
    for name, shape, init, *_ in table:
        kind = init[0]
        if kind == "randn":
            v = rng.standard_normal(shape) * init[1]
        elif kind in ("zeros", "ones"):
            v = np.full(shape, 1.0 if kind == "ones" else 0.0)
        else:
            raise SystemExit(f"bench_web: parameter {name} has init {init}; teach initial_params that kind")
        out.append([name, list(shape), np.asarray(v, np.float32).ravel().tolist()])
    return out


def batches(model: str, rng) -> list:
    """N_BATCHES batches of {input: [dtype, shape, values]}."""
    out = []
    if model == "sine_mlp":
        for _ in range(N_BATCHES):
            x = rng.uniform(-np.pi, np.pi, (256, 1)).astype(np.float32)
            out.append({"x": x, "y": np.sin(x)})
    else:
        ex = runpy.run_path(str(ROOT / "examples" / f"{model}.py"))
        out = [ex["batch"](rng) for _ in range(N_BATCHES)]
    return [{k: ["i32" if v.dtype == np.int32 else "f32", list(v.shape), v.ravel().tolist()] for k, v in b.items()}
            for b in out]


def model_config(model: str) -> dict:
    if model != "addition_transformer":
        return {}
    ex = runpy.run_path(str(ROOT / "examples" / "addition_transformer.py"))
    return {"B": ex["B"], "T": ex["T"], "D": ex["D"], "H": ex["HEADS"], "layers": ex["LAYERS"], "mlp": ex["MLP_DIM"],
            "vocab": ex["VOCAB"]}


def prepare_peers(work: Path, tensorgrad: Path | None) -> dict:
    """npm packages into work/, tensorgrad built there; returns what was installed."""
    for tool in ("node", "npm"):
        if not shutil.which(tool):
            raise SystemExit(f"bench_web: `{tool}` is not on PATH; install Node.js 20 or newer")
    npm = ["npm", "install", "--no-save", "--no-audit", "--no-fund", "--loglevel=error"]
    if not (work / "package.json").exists():
        (work / "package.json").write_text('{"name": "aot-bench-web", "private": true}\n')
    subprocess.run(npm + list(NPM_PACKAGES), cwd=work, check=True)
    about = {"npm": list(NPM_PACKAGES), "node": subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()}
    for pkg in ("@tensorflow/tfjs", "@jax-js/jax"):
        about[pkg] = json.loads((work / "node_modules" / pkg / "package.json").read_text())["version"]
    if tensorgrad is not None:
        meta = json.loads((tensorgrad / "package.json").read_text())
        if meta.get("name") != "tensorgrad":
            raise SystemExit(f"bench_web: {tensorgrad} is not a tensorgrad checkout (package.json names {meta.get('name')!r})")
        commit = subprocess.run(["git", "-C", str(tensorgrad), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        src = work / "tensorgrad"
        if src.exists():
            shutil.rmtree(src)
        shutil.copytree(tensorgrad, src, ignore=shutil.ignore_patterns("node_modules", "dist", ".git"))
        subprocess.run(npm + ["esbuild@0.28"], cwd=src, check=True)  # its build script imports esbuild
        subprocess.run(["node", "scripts/build.mjs"], cwd=src, check=True)
        about["tensorgrad"] = {"version": meta.get("version"), "commit": commit}
    return about


def build_site(work: Path, site: Path, models: list, systems: list, with_tensorgrad: bool) -> dict:
    """site/: each system's bundled page, aot's web packages, the models' data. Returns build info."""
    from aot import web
    from aot.pipeline import compile_program

    if site.exists():
        shutil.rmtree(site)
    (site / "data").mkdir(parents=True)
    esbuild = work / "node_modules" / ".bin" / "esbuild"
    pages = work / "pages"  # the page sources next to node_modules, where their imports resolve
    shutil.copytree(PAGES, pages, dirs_exist_ok=True)
    for page in sorted({SYSTEMS[s][0] for s in systems}):
        alias = [f"--alias:tensorgrad={work / 'tensorgrad' / 'dist' / 'index.js'}"] if page == "tensorgrad" else []
        subprocess.run([str(esbuild), str(pages / f"{page}.mjs"), "--bundle", "--format=esm", "--platform=browser",
                        "--target=es2022", "--log-level=warning", f"--outfile={site / (page + '.js')}", *alias],
                       cwd=work, check=True)
        (site / f"{page}.html").write_text(f'<!doctype html><meta charset="utf-8"><script type="module" src="{page}.js"></script>\n')
    progs = programs()
    info = {}
    for m in models:
        t = time.perf_counter()
        c = compile_program(progs[m])
        web.write_web(c, site / "aot", f"{m}.py")
        rng = np.random.default_rng(0)
        data = {"model": m, "lr": MODELS[m][1], "config": model_config(m),
                "params": initial_params(c.program["params"], rng), "batches": batches(m, rng)}
        (site / "data" / f"{m}.json").write_text(json.dumps(data))
        info[m] = {"aot_build_s": time.perf_counter() - t,
                   "dispatches_cpu": len(c.program["entries"]["train"].get("dispatches_cpu") or []),
                   "dispatches_gpu": len(c.program["entries"]["train"]["dispatches"])}
    return info


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Cross-origin isolated (jax-js's wasm device runs threads on SharedArrayBuffer only then)."""

    def end_headers(self):
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, *args):
        pass


def run_one(pw, url: str, timeout_s: float) -> dict:
    """One system on one model in a fresh browser: the page's result, or {"error": ...}."""
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
    try:
        page = browser.new_page()
        logs = []
        page.on("console", lambda msg: logs.append(msg.text) if msg.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: logs.append(str(e)))
        t = time.perf_counter()
        page.goto(url)
        try:
            page.wait_for_function("window.result", timeout=timeout_s * 1000, polling=500)
        except Exception as e:  # noqa: BLE001 - a timeout is a result too
            return {"error": f"no result in {timeout_s:.0f} s ({type(e).__name__})", "console": logs[-5:]}
        r = page.evaluate("window.result")
        r["wall_s"] = time.perf_counter() - t
        if "error" in r:
            r["console"] = logs[-5:]
        return r
    finally:
        browser.close()


def summarise(rows: list) -> dict:
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return {"error": rows[-1]["error"] if rows else "not run"}
    steps = [r["stepMs"] for r in ok]
    first = [r["createMs"] + r["firstStepMs"] for r in ok]
    return {"step_ms": statistics.median(steps), "step_ms_min": min(steps), "step_ms_max": max(steps),
            "create_plus_first_step_ms": statistics.median(first), "create_ms": statistics.median(r["createMs"] for r in ok),
            "first_step_ms": statistics.median(r["firstStepMs"] for r in ok), "rounds_ok": len(ok), "rounds": len(rows),
            "backend": ok[0].get("backend"), "adapter": ok[0].get("adapter")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tensorgrad", type=Path, help="a checkout of github.com/typebulb/tensorgrad (without: no tensorgrad)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--steps", type=int, help="timed steps per run (default: per model)")
    ap.add_argument("--budget-s", type=float, default=20.0, help="stop timing a run after this long (at least 2 steps)")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="give up on one run after this long")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "aot-bench-web")
    ap.add_argument("--out")
    args = ap.parse_args()
    models = [m for m in args.models.split(",") if m]
    systems = [s for s in args.systems.split(",") if s]
    for kind, got, known in (("models", models, MODELS), ("systems", systems, SYSTEMS)):
        if set(got) - set(known):
            raise SystemExit(f"bench_web: unknown {kind} {sorted(set(got) - set(known))}; choose from {', '.join(known)}")
    if args.tensorgrad is None and "tensorgrad" in systems:
        systems.remove("tensorgrad")
        print("bench_web: no --tensorgrad checkout: tensorgrad is left out")
    if not Path(CHROMIUM).exists():
        raise SystemExit("bench_web: chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT))
    args.workdir.mkdir(parents=True, exist_ok=True)
    about = prepare_peers(args.workdir, args.tensorgrad.expanduser().resolve() if args.tensorgrad else None)
    site = args.workdir / "site"
    builds = build_site(args.workdir, site, models, systems, "tensorgrad" in systems)
    chromium = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True).stdout.strip()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    rows = {m: {s: [] for s in systems} for m in models}
    try:
        with sync_playwright() as pw:
            for r in range(args.rounds):
                order = systems[r % len(systems):] + systems[: r % len(systems)]
                for m in models:
                    for s in order:
                        page, backend = SYSTEMS[s]
                        steps = args.steps or MODELS[m][0]
                        url = f"{base}/{page}.html?model={m}&backend={backend}&steps={steps}&budget_ms={args.budget_s * 1000:.0f}"
                        res = run_one(pw, url, args.timeout_s)
                        res["round"] = r + 1
                        rows[m][s].append(res)
                        if "error" in res:
                            print(f"round {r + 1}: {m:>21} {s:>12}  ERROR {res['error'][:300]}", flush=True)
                        else:
                            print(f"round {r + 1}: {m:>21} {s:>12}  {res['stepMs']:9.1f} ms/step  "
                                  f"create {res['createMs'] / 1e3:6.1f} s  first step {res['firstStepMs'] / 1e3:6.1f} s  "
                                  f"({res['steps']} steps, loss {res['losses'][0]:.4f} -> {res['losses'][-1]:.4f})", flush=True)
    finally:
        server.shutdown()
    report = {"machine": platform.node(), "chromium": chromium, "peers": about, "rounds": args.rounds,
              "budget_s": args.budget_s, "builds": builds, "models": {}}
    for m in models:
        summ = {s: summarise(rows[m][s]) for s in systems}
        peers = {s: v["step_ms"] for s, v in summ.items() if s != "aot" and "step_ms" in v}
        entry = {"systems": summ, "runs": rows[m]}
        if peers and "step_ms" in summ.get("aot", {}):
            best = min(peers, key=peers.get)
            entry["best_peer"] = best
            entry["speedup_vs_best_peer"] = peers[best] / summ["aot"]["step_ms"]
            # the same ratio per round (each round's aot against that round's best peer)
            per_round = []
            for r in range(args.rounds):
                a = [x["stepMs"] for x in rows[m]["aot"] if x["round"] == r + 1 and "error" not in x]
                p = [x["stepMs"] for s in peers for x in rows[m][s] if x["round"] == r + 1 and "error" not in x]
                if a and p:
                    per_round.append(min(p) / a[0])
            entry["speedup_per_round"] = per_round
        report["models"][m] = entry
        print(f"\n{m}:")
        for s, v in summ.items():
            if "error" in v:
                print(f"  {s:>12}  error: {v['error'][:200]}")
            else:
                print(f"  {s:>12}  {v['step_ms']:9.1f} ms/step [{v['step_ms_min']:.1f}..{v['step_ms_max']:.1f}]  "
                      f"create+first step {v['create_plus_first_step_ms'] / 1e3:6.1f} s  ({v['backend']})")
        if "best_peer" in entry:
            print(f"  aot is {entry['speedup_vs_best_peer']:.2f}x the best peer ({entry['best_peer']}); per round "
                  + ", ".join(f"{x:.2f}" for x in entry["speedup_per_round"]))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
