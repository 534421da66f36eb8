"""Running a built web package in node (20+: WebAssembly SIMD, no WebGPU), for the wasm kernel
set's tests: `run_node(module, steps)` trains it and returns what the steps gave."""

from __future__ import annotations

import atexit
import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

RUNNER = r"""
import { readFileSync } from "node:fs";
const req = JSON.parse(readFileSync(process.argv[2], "utf8"));
const M = await import(req.module);
const typed = ([dt, shape, data]) => ({ data: dt === "i32" ? Int32Array.from(data) : Float32Array.from(data), shape });
const out = {};
try {
  const m = await M.Model.create({ seed: req.seed ?? undefined, kernels: req.kernels });
  out.kernelSet = m.kernelSet;
  out.reason = m.kernelSetReason;
  if (req.lr !== undefined && req.lr !== null) m.setLr(req.lr);
  out.losses = [];
  for (const step of req.steps) {
    const inp = Object.fromEntries(Object.entries(step).map(([k, v]) => [k, typed(v)]));
    const r = await m.step(inp, { captures: req.captures });
    out.losses.push(req.captures ? r.loss : r);
    if (req.captures) out.captures = Object.fromEntries(Object.entries(r.captures).map(([k, v]) => [k, Array.from(v.data)]));
    if (req.grads && out.losses.length === 1)
      out.grads = Object.fromEntries(Object.entries(await m.grads()).map(([k, v]) => [k, Array.from(v.data)]));
  }
  out.params = Object.fromEntries(Object.entries(await m.params()).map(([k, v]) => [k, Array.from(v.data)]));
} catch (e) {
  out.error = String(e && e.stack || e);
}
console.log(JSON.stringify(out));
"""


def node_or_skip() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (scripts/setup_env.sh installs Debian's nodejs)")
    return node


def wire(v) -> list:
    a = np.asarray(v)
    return ["i32" if a.dtype.kind in "iu" else "f32", list(a.shape), a.ravel().tolist()]


def run_node(module: Path, steps: list[dict], tmp: Path, kernels: str = "wasm", captures: bool = False,
             grads: bool = False, lr: float | None = None, seed: int | None = None) -> dict:
    """Train the web module `module` in node: one step per dict of inputs. Returns {kernelSet,
    reason, losses, params, captures (the last step's), grads (after the first step)} as arrays."""
    node = node_or_skip()
    (tmp / "runner.mjs").write_text(RUNNER)
    req = {"module": str(module), "kernels": kernels, "captures": captures, "grads": grads, "lr": lr, "seed": seed,
           "steps": [{k: wire(v) for k, v in s.items()} for s in steps]}
    (tmp / "request.json").write_text(json.dumps(req))
    r = subprocess.run([node, str(tmp / "runner.mjs"), str(tmp / "request.json")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    for key in ("params", "captures", "grads"):
        if key in out:
            out[key] = {k: np.asarray(v, dtype=np.float32) for k, v in out[key].items()}
    return out


# ---- the differential fuzzer's wasm side: one node process answers many requests ------------------

# Reads one JSON request a line on stdin and answers each with one line, "@@fuzz " + JSON (the
# prefix keeps a stray console.log of a module from being read as an answer). Arrays travel as
# [dtype, shape, base64 of the little-endian bytes]: exact, NaN and inf included (JSON has neither).
# A request: {module, kernels, load (params, loaded with partial: true after create and after
# reset), steps: [{feeds, predict (infer inputs or null)}], predictFirst (predict before the
# step: SGD batches, where predict must see the parameters the step used), params, buffers,
# replay (step 1 again after reset(), compared bit for bit)}. The answer: {kernelSet, steps:
# [{loss, captures, grads, params?, buffers?, predict?}], replay?: {loss, captures, grads}}, or
# {error, at} with what had run (at: "create", "step N", "replay").
FUZZ_WORKER = r"""
import { createInterface } from "node:readline";
import { pathToFileURL } from "node:url";
const dec = ([dt, shape, b64]) => {
  const buf = Buffer.from(b64, "base64");
  const bytes = new Uint8Array(buf.length);
  bytes.set(buf);
  return { data: dt === "i32" ? new Int32Array(bytes.buffer) : new Float32Array(bytes.buffer), shape };
};
const enc = (a) => {
  const d = a.data;
  return [d instanceof Int32Array ? "i32" : "f32", a.shape || [d.length], Buffer.from(d.buffer, d.byteOffset, d.byteLength).toString("base64")];
};
const encAll = (o) => Object.fromEntries(Object.entries(o).map(([k, v]) => [k, enc(v)]));
const decAll = (o) => Object.fromEntries(Object.entries(o).map(([k, v]) => [k, dec(v)]));
const num = (x) => enc({ data: Float32Array.of(x), shape: [] });
let n = 0;
async function serve(req, out) {
  out.at = "create";
  const M = await import(pathToFileURL(req.module).href + "?n=" + (++n));
  const m = await M.Model.create({ kernels: req.kernels });
  out.kernelSet = m.kernelSet;
  out.steps = [];
  try {
    if (Object.keys(req.load).length) await m.loadParams(decAll(req.load), { partial: true });
    for (const [i, s] of req.steps.entries()) {
      out.at = `step ${i + 1}`;
      const st = {};
      if (s.predict && req.predictFirst) st.predict = enc(await m.predict(decAll(s.predict)));
      const r = await m.step(decAll(s.feeds), { captures: true });
      st.loss = num(r.loss);
      st.captures = encAll(r.captures);
      st.grads = encAll(await m.grads());
      if (req.params) st.params = encAll(await m.params());
      if (req.buffers) st.buffers = encAll(await m.buffers());
      if (s.predict && !req.predictFirst) st.predict = enc(await m.predict(decAll(s.predict)));
      out.steps.push(st);
    }
    if (req.replay) {
      out.at = "replay";
      await m.reset({ params: true, optimizer: true });
      if (Object.keys(req.load).length) await m.loadParams(decAll(req.load), { partial: true });
      const r = await m.step(decAll(req.steps[0].feeds), { captures: true });
      out.replay = { loss: num(r.loss), captures: encAll(r.captures), grads: encAll(await m.grads()) };
    }
    delete out.at;
  } finally {
    m.close();
  }
}
for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
  const out = {};
  try {
    await serve(JSON.parse(line), out);
  } catch (e) {
    out.error = String((e && e.stack) || e);
  }
  process.stdout.write("@@fuzz " + JSON.stringify(out) + "\n");
}
"""


def wire64(v) -> list:
    """An array as FUZZ_WORKER reads it: [dtype, shape, base64 bytes]."""
    a = np.asarray(v)
    a = a.astype("<i4" if a.dtype.kind in "iu" else "<f4")  # (ascontiguousarray would make a 0-d array 1-d)
    return ["i32" if a.dtype.kind == "i" else "f32", list(a.shape), base64.b64encode(a.tobytes()).decode("ascii")]


def unwire64(w) -> np.ndarray:
    dt, shape, b64 = w
    return np.frombuffer(base64.b64decode(b64), dtype="<i4" if dt == "i32" else "<f4").reshape(shape).copy()


class NodeWorker:
    """One `node FUZZ_WORKER` process; `call(request)` sends a request and waits for its answer.
    A request that runs past `timeout` s, or a process that dies, gives {error} and a fresh
    process for the next call; every `restart_every` calls it is replaced anyway (node keeps
    every imported module, a few hundred KB each)."""

    def __init__(self, relaxed: bool = False, restart_every: int = 60):
        self.relaxed, self.restart_every = relaxed, restart_every
        self.proc = None
        self.calls = 0
        self._dir = Path(tempfile.mkdtemp(prefix="aot-node-worker-"))
        (self._dir / "worker.mjs").write_text(FUZZ_WORKER)

    def _start(self):
        node = shutil.which("node")
        if node is None:
            raise RuntimeError("node is not installed (scripts/setup_env.sh installs Debian's nodejs)")
        # relaxed: the matmuls' fused multiply-adds, as Chromium runs them (node 20 needs the flag)
        flags = ["--experimental-wasm-relaxed-simd"] if self.relaxed else []
        self._err = open(self._dir / "stderr.txt", "w+b")
        self.proc = subprocess.Popen([node, *flags, str(self._dir / "worker.mjs")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._err)
        self.calls = 0
        self._buf = b""

    def close(self):
        if self.proc is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self._err.close()
            self.proc = None

    def _stderr_tail(self) -> str:
        self._err.flush()
        self._err.seek(0)
        return self._err.read().decode("utf-8", "replace")[-2000:]

    def call(self, req: dict, timeout: float = 300.0) -> dict:
        if self.proc is not None and self.calls >= self.restart_every:
            self.close()
        if self.proc is None:
            self._start()
        self.calls += 1
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # the answer loop below reports the dead process
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                if line.startswith(b"@@fuzz "):
                    return json.loads(line[7:])
            left = deadline - time.monotonic()
            ready = select.select([fd], [], [], max(left, 0))[0] if left > 0 else []
            chunk = os.read(fd, 1 << 20) if ready else None
            if not chunk:
                why = f"no answer in {timeout:g} s" if chunk is None else f"node exited ({self.proc.poll()})"
                self.proc.kill()
                self.proc.wait()
                tail = self._stderr_tail()
                self._err.close()
                self.proc = None
                return {"error": f"{why}: {tail}", "at": "node"}
            self._buf += chunk


_WORKERS: dict[bool, NodeWorker] = {}


def _close_workers():
    for w in _WORKERS.values():
        w.close()
        shutil.rmtree(w._dir, ignore_errors=True)


def worker(relaxed: bool = False) -> NodeWorker:
    """The process's shared worker (one plain, one with relaxed SIMD), closed at exit."""
    if relaxed not in _WORKERS:
        if not _WORKERS:
            atexit.register(_close_workers)
        _WORKERS[relaxed] = NodeWorker(relaxed)
    return _WORKERS[relaxed]


def run_steps(module: Path, steps: list[dict], predict: list | None = None, load: dict | None = None,
              predict_first: bool = False, params: bool = False, buffers: bool = False, replay: bool = False,
              kernels: str = "wasm", relaxed: bool = False, timeout: float = 300.0) -> dict:
    """Train the web module `module` in the shared node worker: one step per dict of inputs (with
    `predict[i]`'s inputs run through `predict` after step i, or before it with predict_first).
    Returns FUZZ_WORKER's answer with every array as numpy (`loss` a float)."""
    req = {"module": str(module), "kernels": kernels, "load": {k: wire64(v) for k, v in (load or {}).items()},
           "predictFirst": predict_first, "params": params, "buffers": buffers, "replay": replay,
           "steps": [{"feeds": {k: wire64(v) for k, v in s.items()},
                      "predict": None if not predict or predict[i] is None else {k: wire64(v) for k, v in predict[i].items()}}
                     for i, s in enumerate(steps)]}
    out = worker(relaxed).call(req, timeout)

    def arrays(d):
        for key in ("captures", "grads", "params", "buffers"):
            if key in d:
                d[key] = {k: unwire64(v) for k, v in d[key].items()}
        if "loss" in d:
            d["loss"] = float(unwire64(d["loss"]))
        if "predict" in d:
            d["predict"] = unwire64(d["predict"])
        return d

    out["steps"] = [arrays(s) for s in out.get("steps", [])]
    if out.get("replay"):
        out["replay"] = arrays(out["replay"])
    return out
