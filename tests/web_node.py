"""Running a built web package in node (20+: WebAssembly SIMD, no WebGPU), for the wasm kernel
set's tests: `run_node(module, steps)` trains it and returns what the steps gave."""

from __future__ import annotations

import json
import shutil
import subprocess
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
