"""Does Model.create({kernels: "auto"}) pick the faster kernel set in Chrome? Per adapter (SwiftShader,
Chrome's default without a GPU; Dawn's GL ES backend over Mesa's lavapipe) and model (the sine MLP,
the addition transformer as the example builds it): the set "auto" takes and why, and the time per
training step of each set forced, in one fresh page per (adapter, model, set), after one untimed
step (the first compiles the pipelines; its time is reported too).

    python scripts/bench_kernel_sets_web.py [--steps N] [--only sine_mlp] [--out scripts/results/kernel_sets_web.json]

Needs Debian's chromium, Playwright for Python and, for the lavapipe runs, mesa-vulkan-drivers.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import platform
import runpy
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHROMIUM = "/usr/bin/chromium"
BASE_ARGS = ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LVP_ICD = "/usr/share/vulkan/icd.d/lvp_icd.x86_64.json"
# (name, extra Chrome flags, environment, Model.create's adapter option): tests/test_web.py's LAVAPIPE_ARGS
ADAPTERS = [
    ("swiftshader", ["--disable-gpu"], {}, None),
    ("lavapipe_gles", ["--enable-gpu", "--use-angle=vulkan", "--use-webgpu-adapter=opengles"],
     {"VK_ICD_FILENAMES": LVP_ICD}, {"featureLevel": "compatibility"}),
]

PAGE = """async ([kernels, adapter, batch, steps]) => {
  const M = await import("./model.js");
  let t = performance.now();
  const m = await M.Model.create({kernels, adapter});
  const create = performance.now() - t;
  const feed = Object.fromEntries(Object.entries(batch).map(([k, [dtype, shape, data]]) =>
    [k, {data: dtype === "i32" ? Int32Array.from(data) : Float32Array.from(data), shape}]));
  t = performance.now();
  await m.step(feed);
  const first = performance.now() - t;
  t = performance.now();
  for (let i = 0; i < steps; i++) await m.step(feed);
  const ms = (performance.now() - t) / steps;
  const out = {set: m.kernelSet, reason: m.kernelSetReason, create_ms: create, first_step_ms: first, ms_per_step: ms};
  m.close();
  return out;
}"""


def models():
    import numpy as np

    sine = runpy.run_path(str(ROOT / "examples/sine_mlp.py"), run_name="__bench__")
    add = runpy.run_path(str(ROOT / "examples/addition_transformer.py"), run_name="__bench__")
    x = np.linspace(-3, 3, 256, dtype=np.float32).reshape(256, 1)
    b = add["batch"](np.random.default_rng(0))
    return {
        "sine_mlp": (sine["program"], {"x": ("f32", [256, 1], x.ravel().tolist()), "y": ("f32", [256, 1], np.sin(x).ravel().tolist())}),
        "addition_transformer": (add["program"], {k: ("i32" if v.dtype == np.int32 else "f32", list(v.shape), v.ravel().tolist()) for k, v in b.items()}),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="timed steps per page (default 3)")
    ap.add_argument("--only", choices=("sine_mlp", "addition_transformer"), help="one model")
    ap.add_argument("--out", default=str(ROOT / "scripts/results/kernel_sets_web.json"))
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    from aot import web
    from aot.pipeline import compile_program

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a):
            pass

    rows = []
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        progs = {k: v for k, v in models().items() if args.only in (None, k)}
        for name, (prog, _) in progs.items():
            web.write_web(compile_program(prog), Path(tmp), f"{name}.py", folder=name)
            os.replace(Path(tmp, name, f"{prog.name}.js"), Path(tmp, name, "model.js"))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=tmp))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        for adapter, flags, env, option in ADAPTERS:
            if env and not os.path.exists(LVP_ICD):
                continue
            for name, (_, batch) in progs.items():
                for kernels in ("auto", "cpu", "gpu"):
                    browser = p.chromium.launch(executable_path=CHROMIUM, args=BASE_ARGS + flags, headless=True,
                                                env={**os.environ, **env})
                    try:
                        page = browser.new_page()
                        page.goto(f"{url}/{name}/README.md")
                        t0 = time.perf_counter()
                        row = page.evaluate(PAGE, [kernels, option, batch, args.steps])
                    finally:
                        browser.close()
                    row.update(adapter=adapter, model=name, kernels=kernels, wall_s=time.perf_counter() - t0)
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    result = {
        "what": "ms per training step of each kernel set forced, and the set Model.create({kernels: 'auto'}) takes, in headless Chromium",
        "chromium": "Debian chromium", "host": platform.node(), "cpus": os.cpu_count(), "steps": args.steps,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
