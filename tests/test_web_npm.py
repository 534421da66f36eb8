"""The web target as an npm package (aot/web_npm.py): the folder of examples/sine_mlp.py installed
with npm into a scratch project, bundled by esbuild and by vite into a page that trains the model in
a module Web Worker (headless Chromium, as tests/test_web.py drives it), its `.d.ts` checked by
`tsc` (a right consumer passes, a wrong input name fails), and the module without WebGPU (Node)
rejecting with a message that says so. One scratch project (node_modules) for the whole module."""

from __future__ import annotations

import functools
import http.server
import json
import os
import runpy
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from aot import web
from aot.pipeline import compile_program

pytestmark = pytest.mark.web

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--enable-unsafe-webgpu", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
# the tools, from the registry (majors pinned: a new major may change flags or output)
TOOLS = ["esbuild@^0.28", "vite@^8", "typescript@^7"]

WORKER = """\
import { Model } from "sine_mlp";
self.onmessage = async () => {
  try {
    const model = await Model.create({ seed: 0 });
    const x = new Float32Array(256), y = new Float32Array(256);
    for (let i = 0; i < 256; i++) { x[i] = -Math.PI + (2 * Math.PI * i) / 255; y[i] = Math.sin(x[i]); }
    const losses = [];
    for (let s = 0; s < 6; s++) losses.push(await model.step({ x: { data: x, shape: [256, 1] }, y: { data: y, shape: [256, 1] } }));
    const many = await model.stepMany([{ x: { data: x, shape: [256, 1] }, y: { data: y, shape: [256, 1] } }]);
    const out = await model.predict({ x: [[0.5]] });  // B = 1: one of the sizes B takes
    postMessage({ losses, many: Array.from(many), out: Array.from(out.data), shape: out.shape, dtype: out.dtype,
                  kernelSet: model.kernelSet, inWorker: typeof document === "undefined" && typeof WorkerGlobalScope !== "undefined" });
  } catch (e) {
    postMessage({ error: String((e && e.stack) || e) });
  }
};
"""
MAIN = """\
const worker = new Worker(new URL("./worker.js", import.meta.url), { type: "module" });
window.result = new Promise((resolve) => {
  worker.onmessage = (e) => resolve(e.data);
  worker.onerror = (e) => resolve({ error: "worker error: " + e.message });
});
worker.postMessage("train");
"""
PAGE = '<!doctype html><meta charset="utf-8"><script type="module" src="./main.js"></script>\n'
VITE_CONFIG = 'export default { base: "./", logLevel: "warn", worker: { format: "es" }, build: { outDir: "dist-vite", emptyOutDir: true } };\n'

GOOD_TS = """\
import { Model, type Inputs_train, type Output } from "sine_mlp";
const model: Model = await Model.create({ seed: 0n, kernels: "auto" });
const batch: Inputs_train = { x: { data: new Float32Array(256), shape: [256, 1] }, y: [[0.5]] };
const loss: number = await model.step(batch);
const losses: Float32Array = await model.stepMany([batch, batch]);
const out: Output<Float32Array> = await model.predict({ x: [[1], [2]] });
const p = await model.params();
const w: Float32Array = p["l1.W"].data;
const bytes: Uint8Array = await model.save();
await model.restore(bytes);
model.setLr(["cosine", 5e-3, 1e-4, 100]);
const cpu: Model = await Model.create({ kernels: "wasm" });  // the WebAssembly set
const isWasm: boolean = cpu.kernelSet === "wasm";
console.log(loss, losses, out.shape, w, model.kernelSet, isWasm);
"""
# an input name the entry does not take: must not type-check
BAD_TS = """\
import { Model } from "sine_mlp";
const model = await Model.create();
await model.predict({ x: [[1]], z: [[2]] });
await model.step({ x: [[1]] });
"""


def _run(cmd, cwd, timeout=180):
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A scratch npm project with the sine_mlp web package installed (as a copy, like a published
    one: npm's --install-links packs the folder, so `files` in package.json is honoured) and the
    tools; the consumer sources written in."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.skip("npm/node are not installed (scripts/setup_env.sh installs Debian's nodejs and npm)")
    tmp = tmp_path_factory.mktemp("npm")
    prog = runpy.run_path(str(ROOT / "examples" / "sine_mlp.py"), run_name="__aot_test__")["program"]
    pkg = web.write_web(compile_program(prog), tmp / "build", "sine_mlp.py")
    proj = tmp / "app"
    proj.mkdir()
    (proj / "package.json").write_text(json.dumps({"name": "consumer", "private": True, "type": "module"}))
    rc, log = _run([npm, "install", "--no-audit", "--no-fund", "--install-links", str(pkg), *TOOLS], proj, timeout=300)
    if rc != 0:
        pytest.skip(f"npm install failed (is the npm registry reachable?):\n{log[-2000:]}")
    for name, text in {"worker.js": WORKER, "main.js": MAIN, "index.html": PAGE, "vite.config.js": VITE_CONFIG,
                       "good.ts": GOOD_TS, "bad.ts": BAD_TS}.items():
        (proj / name).write_text(text)
    return pkg, proj


def test_package_files(project):
    """package.json points at the module and its types; the installed copy is the package's files."""
    pkg, proj = project
    meta = json.loads((pkg / "package.json").read_text())
    assert meta["name"] == "sine_mlp" and meta["type"] == "module" and meta["version"]
    assert meta["exports"]["."] == {"types": "./sine_mlp.d.ts", "import": "./sine_mlp.js", "default": "./sine_mlp.js"}
    installed = proj / "node_modules" / "sine_mlp"
    assert not installed.is_symlink()
    assert sorted(p.name for p in installed.iterdir()) == ["README.md", "package.json", "sine_mlp.d.ts", "sine_mlp.js"]
    js = (installed / "sine_mlp.js").read_text()
    # kernels inlined: nothing is fetched or imported at run time
    assert "fetch(" not in js and "import(" not in js and not any(l.startswith("import ") for l in js.splitlines())
    dts = (installed / "sine_mlp.d.ts").read_text()
    assert "readonly x: Tensor<F32Data> | readonly (readonly number[])[];" in dts
    assert "/** f32[B,1] with B in (1, 256) */" in dts and "Resolves to its output: f32[B,1]." in dts
    readme = (installed / "README.md").read_text()  # for JavaScript users: install, worker, no WebGPU
    assert "npm install" in readme and '{ type: "module" }' in readme and "this browser has no WebGPU" in readme


def test_npm_name():
    """npm refuses uppercase and a leading . or _; the module file keeps the Program's name."""
    from aot.web_npm import npm_name

    assert npm_name("sine_mlp") == "sine_mlp"
    assert npm_name("MyNet") == "mynet"
    assert npm_name("_private") == "aot-private"


def test_tsc_types(project):
    _, proj = project
    tsc = str(proj / "node_modules" / ".bin" / "tsc")
    rc, log = _run([tsc, *TSC_FLAGS, "good.ts"], proj)
    assert rc == 0, log
    rc, log = _run([tsc, *TSC_FLAGS, "bad.ts"], proj)
    assert rc != 0, "a consumer passing an unknown input name type-checked"
    assert "'z' does not exist in type 'Inputs_predict'" in log, log
    assert "Property 'y' is missing" in log, log


# programs of tests/test_web.py: two training entries (stepD, stepManyG), i32 inputs, buffers
OTHERS_TS = """\
import { Model as Gan } from "./others/gan_web/gan_web.js";
import { Model as Embed } from "./others/embed_web/embed_web.js";
import { Model as Buf, type BufferName } from "./others/buf_web/buf_web.js";
const gan = await Gan.create();
const ld: number = await gan.stepD({ z: [[0, 1]], x: { data: new Float32Array(12), shape: [4, 3] } });
const lg: Float32Array = await gan.stepManyG([{ z: [[0, 1]] }]);
const s = await gan.sample({ z: [[0, 1]] });
const embed = await Embed.create();
await embed.step({ tokens: new Int32Array(3), y: [[1], [2], [3]] });
const nll: Int32Array | Float32Array = (await embed.nll({ tokens: [1, 2, 3], targets: Int32Array.of(0, 1, -100) })).data;
const buf = await Buf.create();
const n: BufferName = "n";
const b = (await buf.buffers())[n];
console.log(ld, lg, s.data, nll, b.dtype);
"""
OTHERS_BAD_TS = """\
import { Model as Gan } from "./others/gan_web/gan_web.js";
import { Model as Embed } from "./others/embed_web/embed_web.js";
const gan = await Gan.create();
await gan.stepG({ z: [[0, 1]], x: [[1, 2, 3]] });
await gan.step({ z: [[0, 1]] });
const embed = await Embed.create();
await embed.predict({ tokens: new Float32Array(3) });
"""
TSC_FLAGS = ["--noEmit", "--strict", "--target", "es2022", "--module", "esnext", "--moduleResolution", "bundler",
             "--lib", "es2022,dom", "--skipLibCheck", "false"]


def test_tsc_types_of_other_programs(project):
    """The .d.ts of programs with two training entries (stepD/stepManyG, no step), i32 inputs and
    buffers: a right consumer type-checks; an input of the other entry, a step() the model does
    not have and a float array for an i32 input each fail."""
    import test_web

    _, proj = project
    for prog in (test_web.GAN_WEB, test_web.EMBED, test_web.BUF):
        web.write_web(compile_program(prog), proj / "others", f"{prog.name}.py")
    (proj / "others.ts").write_text(OTHERS_TS)
    (proj / "others_bad.ts").write_text(OTHERS_BAD_TS)
    tsc = str(proj / "node_modules" / ".bin" / "tsc")
    rc, log = _run([tsc, *TSC_FLAGS, "others.ts"], proj)
    assert rc == 0, log
    rc, log = _run([tsc, *TSC_FLAGS, "others_bad.ts"], proj)
    assert rc != 0
    assert "'x' does not exist in type 'Inputs_train_g'" in log, log
    assert "Property 'step' does not exist on type 'Model'" in log, log
    assert "others_bad.ts(7," in log, log  # Float32Array for the i32 input tokens


def test_without_webgpu_says_so(project):
    """Node has no navigator.gpu: "auto" takes the wasm kernel set and says why; a WebGPU set
    asked for rejects with a message that names the cause."""
    _, proj = project
    script = ('import { Model } from "sine_mlp"; const m = await Model.create(); console.log("created " + m.kernelSet + ": " + '
              'm.kernelSetReason); await Model.create({kernels: "cpu"}).then(() => console.log("created"), (e) => console.log("ERR " + e.message));')
    rc, log = _run(["node", "--input-type=module", "-e", script], proj)
    assert rc == 0, log
    assert "created wasm: this JavaScript engine has no WebGPU (navigator.gpu is missing)" in log, log
    assert "ERR sine_mlp: this browser has no WebGPU (navigator.gpu is missing" in log, log


@pytest.fixture(scope="module")
def bundles(project):
    """The consumer bundled by esbuild (dist-esbuild/) and by vite (dist-vite/), served from 127.0.0.1."""
    _, proj = project
    bin_ = proj / "node_modules" / ".bin"
    out = proj / "dist-esbuild"
    out.mkdir()
    rc, log = _run([str(bin_ / "esbuild"), "worker.js", "--bundle", "--format=esm", f"--outfile={out / 'worker.js'}"], proj)
    assert rc == 0, log
    shutil.copy(proj / "main.js", out / "main.js")
    shutil.copy(proj / "index.html", out / "index.html")
    rc, log = _run([str(bin_ / "vite"), "build"], proj)
    assert rc == 0, log
    handler = functools.partial(_QuietHandler, directory=str(proj))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", proj
    server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_bundles_train_in_a_module_worker(bundles):
    """Both bundles, each in its own page at once: the model trains in a module Web Worker."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip("chromium is not installed (apt-get install chromium)")
    url, proj = bundles
    bundle = (proj / "dist-esbuild" / "worker.js").read_text()
    assert "// node_modules/sine_mlp/sine_mlp.js" in bundle and "from \"sine_mlp\"" not in bundle  # the package is inside
    assert any((proj / "dist-vite" / "assets").glob("worker*.js")), "vite emitted no worker chunk"
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            pages = {}
            for dist in ("dist-esbuild", "dist-vite"):
                pages[dist] = pg = browser.new_page()
                pg.goto(f"{url}/{dist}/index.html")
            results = {d: pg.evaluate("window.result") for d, pg in pages.items()}
        finally:
            browser.close()
    for dist, r in results.items():
        assert "error" not in r, f"{dist}: {r['error']}"
        assert r["inWorker"], dist
        assert len(r["losses"]) == 6 and r["losses"][-1] < r["losses"][0], (dist, r["losses"])
        assert len(r["many"]) == 1 and r["many"][0] < r["losses"][0]
        assert r["shape"] == [1, 1] and r["dtype"] == "f32" and len(r["out"]) == 1
    # same module, same seed and data: both bundles train the same model
    assert results["dist-esbuild"]["losses"] == results["dist-vite"]["losses"]
