"""aot's web package against the browser peers, training steps in headless Chromium.

    python scripts/bench_web.py --tensorgrad ~/src/tensorgrad --rounds 3 --out scripts/results/bench_web_swiftshader.json

Systems (each run a fresh Chromium, Debian's /usr/bin/chromium through Playwright, WebGPU on
whatever adapter the browser has: SwiftShader on a machine without a GPU):
  aot         the web package of aot.web.write_web ("auto" kernel set: "wasm" on a software adapter)
  aot-cpu     the same package with its "cpu" kernel set (the WGSL variants for software adapters)
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

    --profile REPS   aot only: after its steps, each kernel of the step alone (REPS dispatches a
                     submit, waited for; SwiftShader has no timestamp queries), by kernel and family
    --matmul         the CPU kernel set's matmul blocks and the GPU tile at the transformer's
                     shapes, checked against the host and timed round-robin in one page a round
    --summarise REPORT   recompute a report's summaries and ratios
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import platform
import re
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
    "aot-cpu": ("aot", "cpu"),
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


def speedups(summ: dict, runs: dict, rounds: int) -> dict:
    """aot's speed over the best peer and over TensorFlow.js's best backend: the ratio of the
    medians, and the same ratio in each round (that round's aot against that round's best)."""
    out = {}
    for key, among in (("best_peer", lambda s: not s.startswith("aot")), ("best_tfjs", lambda s: s.startswith("tfjs-"))):
        peers = {s: v["step_ms"] for s, v in summ.items() if among(s) and "step_ms" in v}
        if not peers or "step_ms" not in summ.get("aot", {}):
            continue
        best = min(peers, key=peers.get)
        per_round = []
        for r in range(1, rounds + 1):
            a = [x["stepMs"] for x in runs["aot"] if x["round"] == r and "error" not in x]
            p = [x["stepMs"] for s in peers for x in runs[s] if x["round"] == r and "error" not in x]
            if a and p:
                per_round.append(min(p) / a[0])
        out[key] = best
        out[f"speedup_vs_{key}"] = peers[best] / summ["aot"]["step_ms"]
        out[f"speedup_vs_{key}_per_round"] = per_round
    return out


def print_speedups(entry: dict) -> None:
    for key, what in (("best_peer", "the best peer"), ("best_tfjs", "TensorFlow.js's best backend")):
        if key in entry:
            print(f"  aot is {entry[f'speedup_vs_{key}']:.2f}x {what} ({entry[key]}); per round "
                  + ", ".join(f"{x:.2f}" for x in entry[f"speedup_vs_{key}_per_round"]))


def resummarise(path: Path) -> None:
    """--summarise FILE: recompute the summaries and ratios of a report (older reports too)."""
    report = json.loads(path.read_text())
    for m, entry in report["models"].items():
        for k in [k for k in entry if k.startswith(("best_", "speedup_"))]:
            del entry[k]
        entry["systems"] = {s: summarise(v) for s, v in entry["runs"].items()}
        entry.update(speedups(entry["systems"], entry["runs"], report["rounds"]))
        print(f"\n{m}:")
        for s, v in entry["systems"].items():
            if "step_ms" in v:
                print(f"  {s:>12}  {v['step_ms']:9.1f} ms/step [{v['step_ms_min']:.1f}..{v['step_ms_max']:.1f}]  "
                      f"create+first step {v['create_plus_first_step_ms'] / 1e3:6.1f} s")
        print_speedups(entry)
    path.write_text(json.dumps(report, indent=1) + "\n")


def family(kernel: str) -> str:
    """train_012_matmul_add_relu -> matmul_add_relu"""
    return re.sub(r"^[a-z]+_\d+_", "", kernel)


def profile_table(profiles: list) -> dict:
    """Per-kernel ms (median over runs) and per-family totals of --profile runs."""
    kernels = {}
    for p in profiles:
        for name, grid, ms in p["kernels"]:
            kernels.setdefault(name, [grid, []])[1].append(ms)
    rows = [[name, grid, statistics.median(v)] for name, (grid, v) in kernels.items()]
    fams = {}
    for name, _grid, ms in rows:
        f = fams.setdefault(family(name), [0, 0.0])
        f[0] += 1
        f[1] += ms
    return {"empty_submit_ms": statistics.median(p["emptySubmitMs"] for p in profiles),
            "whole_pass_ms": statistics.median(p["wholePassMs"] for p in profiles),
            "sum_of_kernels_ms": sum(r[2] for r in rows), "kernels": rows,
            "families": {k: {"count": n, "ms": ms} for k, (n, ms) in sorted(fams.items(), key=lambda kv: -kv[1][1])}}


def print_profile(model: str, prof: dict) -> None:
    print(f"\n{model}: whole pass {prof['whole_pass_ms']:.1f} ms, kernels alone {prof['sum_of_kernels_ms']:.1f} ms "
          f"(empty submit {prof['empty_submit_ms']:.2f} ms)")
    for f, v in list(prof["families"].items())[:15]:
        print(f"  {v['ms']:8.2f} ms  {v['count']:3d}x  {f}")
    for name, grid, ms in sorted(prof["kernels"], key=lambda r: -r[2])[:15]:
        print(f"  {ms:8.2f} ms  {name}  grid {grid}")


MATMUL_SHAPES = [  # (M, K, N): the addition transformer's products (scripts/bench_matmul_cpu.py's)
    (1024, 64, 64), (64, 1024, 64), (1024, 64, 256), (1024, 256, 64), (64, 1024, 256), (256, 1024, 64), (1024, 64, 12),
]
MATMUL_LAYOUTS = {"plain": (False, False), "a_t": (True, False), "b_t": (False, True)}


def matmul_cases() -> list:
    """--matmul: each shape and layout with every CPU block and the GPU set's tile (WGSL, grid)."""
    from aot.matmul_codegen import CPU_BLOCKS, MatmulSpec, Operand, render_matmul, render_matmul_cpu

    bindings = "\n".join(f"@group(0) @binding({i}) var<storage, {acc}> {n}: array<f32>;"
                         for i, (n, acc) in enumerate((("A", "read"), ("B", "read"), ("C", "read_write"))))
    out = []
    for M, K, N in MATMUL_SHAPES:
        for layout, (ta, tb) in MATMUL_LAYOUTS.items():
            op_a = Operand("A", 0, 0, 1, M) if ta else Operand("A", 0, 0, K, 1)
            op_b = Operand("B", 0, 0, 1, K) if tb else Operand("B", 0, 0, N, 1)
            spec = MatmulSpec(1, M, N, K, op_a, op_b, "C", 0)
            kernels = [["block", b.name, *render_matmul_cpu(spec, "bench", "// bench", bindings, block=b)] for b in CPU_BLOCKS]
            kernels.append(["tile", "gpu", *render_matmul(spec, "bench", "// bench", bindings)])
            out.append({"M": M, "K": K, "N": N, "layout": layout, "ta": ta, "tb": tb, "kernels": kernels})
    return out


def bench_matmul(pw, base: str, rounds: int, timeout_s: float) -> dict:
    """--matmul: rounds of the matmul page, each a fresh browser; per kernel the median over rounds."""
    runs = []
    for r in range(rounds):
        res = run_one(pw, f"{base}/matmul.html?reps=5", timeout_s)
        if "error" in res:
            raise SystemExit(f"bench_web --matmul: {res['error']}")
        runs.append(res)
        print(f"round {r + 1}: {len(res['rows'])} kernels timed on {res['adapter']}", flush=True)
    table = {}
    for res in runs:
        for row in res["rows"]:
            key = (row["M"], row["K"], row["N"], row["layout"], row["name"])
            table.setdefault(key, {**row, "run_ms_rounds": []})["run_ms_rounds"].append(row["run_ms"])
    rows = []
    for row in table.values():
        row["run_ms"] = statistics.median(row["run_ms_rounds"])
        row["gflops"] = 2 * row["M"] * row["K"] * row["N"] / row["run_ms"] / 1e6
        rows.append(row)
        print(f"{row['M']}x{row['K']}x{row['N']} {row['layout']:5s} {row['name']:4s} grid {str(tuple(row['grid'])):14s} "
              f"{row['run_ms']:8.2f} ms {row['gflops']:6.2f} GFLOP/s  first {row['first_ms']:7.1f} ms", flush=True)
    summary = {}
    for name in dict.fromkeys(r["name"] for r in rows):
        mine = [r for r in rows if r["name"] == name]
        summary[name] = {"median_gflops": statistics.median(r["gflops"] for r in mine),
                         "total_ms": sum(r["run_ms"] for r in mine),
                         "best_at": sum(1 for r in mine if r["run_ms"] == min(x["run_ms"] for x in rows if
                                        (x["M"], x["K"], x["N"], x["layout"]) == (r["M"], r["K"], r["N"], r["layout"])))}
        print(f"{name:5s} median {summary[name]['median_gflops']:.2f} GFLOP/s, all cases {summary[name]['total_ms']:.1f} ms, "
              f"fastest in {summary[name]['best_at']} of {len(mine)}")
    return {"adapter": runs[0]["adapter"], "rows": rows, "summary": summary}


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
    ap.add_argument("--profile", type=int, default=0, metavar="REPS",
                    help="aot only: after its steps, time each kernel of the step alone, REPS dispatches per submit")
    ap.add_argument("--matmul", action="store_true",
                    help="instead: the CPU set's matmul blocks and the GPU tile at the transformer's shapes, --rounds pages")
    ap.add_argument("--summarise", type=Path, metavar="REPORT", help="instead: recompute a report's summaries and ratios")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.summarise:
        return resummarise(args.summarise)
    if args.matmul:
        return main_matmul(args)
    models = [m for m in args.models.split(",") if m]
    systems = [s for s in args.systems.split(",") if s] if not args.profile else ["aot"]
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
                        if args.profile:
                            url += f"&profile={args.profile}"
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
        entry = {"systems": summ, "runs": rows[m], **speedups(summ, rows[m], args.rounds)}
        report["models"][m] = entry
        profiles = [x["profile"] for x in rows[m].get("aot", []) if x.get("profile")]
        if profiles:
            entry["profile"] = profile_table(profiles)
            print_profile(m, entry["profile"])
        print(f"\n{m}:")
        for s, v in summ.items():
            if "error" in v:
                print(f"  {s:>12}  error: {v['error'][:200]}")
            else:
                print(f"  {s:>12}  {v['step_ms']:9.1f} ms/step [{v['step_ms_min']:.1f}..{v['step_ms_max']:.1f}]  "
                      f"create+first step {v['create_plus_first_step_ms'] / 1e3:6.1f} s  ({v['backend']})")
        print_speedups(entry)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")


def main_matmul(args) -> None:
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT))
    site = args.workdir / "site_matmul"
    if site.exists():
        shutil.rmtree(site)
    (site / "data").mkdir(parents=True)
    shutil.copy(PAGES / "matmul.mjs", site / "matmul.js")
    (site / "matmul.html").write_text('<!doctype html><meta charset="utf-8"><script type="module" src="matmul.js"></script>\n')
    (site / "data" / "matmul.json").write_text(json.dumps(matmul_cases()))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as pw:
            report = bench_matmul(pw, f"http://127.0.0.1:{server.server_address[1]}", args.rounds, args.timeout_s)
    finally:
        server.shutdown()
    report["chromium"] = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True).stdout.strip()
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
