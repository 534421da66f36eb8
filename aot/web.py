"""The web target: Compiled -> OUT/<name>/ with an ES module for the browser.

Files: `package.json` and `<name>.d.ts` (aot/web_npm.py: an npm package with its types),
`<name>.js` (one dependency-free ES module: the runtime of codegen_templates/web/
runtime.js, the program's tables as a JSON literal and every kernel's WGSL, byte for byte the
strings the Python package gets from the same `Compiled`), `index.html` (a demo page that
trains in the page with a live loss plot, steps/s and the adapter and kernel set), `demo.js`
where the Program names one (`web={"demo": ...}`: the demo's batches and its display of the
result; without one the page trains on random data and runs the infer entries) and `README.md`. The
build follows emit.write_project's manifest rules.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from types import SimpleNamespace

from . import emit, wasm_build, web_npm
from .errors import printable
from .runtime import model as _model
from .templates import TEMPLATE_DIR, render

RUNTIME_JS = TEMPLATE_DIR / "web" / "runtime.js"

# WebGPU's defaults (what a page gets without asking); the module asks the adapter for more
# only where a limit of `needed_limits` exceeds these.
DEFAULT_LIMITS = {
    "maxStorageBufferBindingSize": 134217728,
    "maxBufferSize": 268435456,
    "maxStorageBuffersPerShaderStage": 8,
    "maxComputeInvocationsPerWorkgroup": 256,
    "maxComputeWorkgroupSizeX": 256,
    "maxComputeWorkgroupSizeY": 256,
    "maxComputeWorkgroupSizeZ": 64,
    "maxComputeWorkgroupStorageSize": 16384,
    "maxComputeWorkgroupsPerDimension": 65535,
}

_WG_SIZE = re.compile(r"@workgroup_size\(\s*([^)]*)\)")
_WG_VAR = re.compile(
    r"var<workgroup>\s+\w+\s*:\s*array<\s*(f32|i32|u32|vec2<[fiu]32>|vec3<[fiu]32>|vec4<[fiu]32>)\s*,\s*(\d+)u?\s*>"
)
_ELEM_BYTES = {"f32": 4, "i32": 4, "u32": 4, "vec2": 8, "vec3": 16, "vec4": 16}


def kernel_needs(wgsl: str) -> dict[str, int]:
    """Workgroup size and workgroup storage (bytes) one kernel declares."""
    out = {}
    m = _WG_SIZE.search(wgsl)
    if m:
        dims = [int(re.sub(r"[^0-9]", "", d) or 1) for d in m.group(1).split(",") if d.strip()]
        dims += [1] * (3 - len(dims))
        out["maxComputeWorkgroupSizeX"], out["maxComputeWorkgroupSizeY"], out["maxComputeWorkgroupSizeZ"] = dims
        out["maxComputeInvocationsPerWorkgroup"] = math.prod(dims)
    out["maxComputeWorkgroupStorageSize"] = sum(
        _ELEM_BYTES[t[:4].rstrip("<")] * int(n) for t, n in _WG_VAR.findall(wgsl)
    )
    return out


def needed_limits(prog: dict, wgsl: dict[str, str]) -> dict[str, int]:
    """The device limits the package needs (each at least 1), from the tables and the WGSL."""
    sizes = [4 * n for n in prog["arenas"].values()] + [
        4 * n for e in prog["entries"].values() for n in e["arenas"].values()
    ]
    need = dict.fromkeys(DEFAULT_LIMITS, 1)
    need["maxStorageBufferBindingSize"] = need["maxBufferSize"] = max([4] + sizes)
    for kname, (bindings, *_about) in prog["kernels"].items():
        need["maxStorageBuffersPerShaderStage"] = max(need["maxStorageBuffersPerShaderStage"], len(bindings))
        for k, v in kernel_needs(wgsl[kname]).items():
            need[k] = max(need[k], v)
    for e in prog["entries"].values():
        for _k, grid in e["dispatches"]:
            need["maxComputeWorkgroupsPerDimension"] = max(need["maxComputeWorkgroupsPerDimension"], *grid)
    return need


def web_tables(c) -> tuple[dict, dict[str, str], dict[str, str], dict[str, str]]:
    """(the program's tables as JSON-ready data, kernel name -> WGSL, the CPU variants, the
    subgroup variants): the Python package's PROGRAM with variants as [sizes, key] pairs (JSON
    keys are strings), plus the checkpoint fingerprint and the device limits the module needs."""
    prog = dict(c.program)
    wgsl, wgsl_cpu, wgsl_subgroup = prog.pop("_wgsl"), prog.pop("_wgsl_cpu"), prog.pop("_wgsl_subgroup")
    fingerprint = _model.ModelBase._fingerprint(
        SimpleNamespace(_program=prog, _params=prog["params"], _opt=prog.get("optimizer"), _buffer_table=prog.get("buffers") or [])
    )
    prog["variants"] = {
        entry: [[dict(sizes), key] for sizes, key in v.items()] for entry, v in prog["variants"].items()
    }
    prog["fingerprint"] = fingerprint
    limits = needed_limits(prog, wgsl)
    for variants in (wgsl_cpu, wgsl_subgroup):
        for k, v in needed_limits(prog, {**wgsl, **variants}).items():
            limits[k] = max(limits[k], v)
    prog["limits"] = limits
    prog["default_limits"] = DEFAULT_LIMITS
    return json.loads(json.dumps(prog)), wgsl, wgsl_cpu, wgsl_subgroup


def _js(value) -> str:
    """A JS literal of JSON data (JSON is a subset of JS since ES2019). One difference: in an object
    literal the key "__proto__" sets the prototype (JSON.parse makes it a property), so such a key
    (a parameter named __proto__) is written computed, ["__proto__"], which makes a property. In
    JSON text every quote inside a string follows a backslash, so this only matches keys."""
    text = json.dumps(value, indent=1, ensure_ascii=True)
    return re.sub(r'(?<!\\)"__proto__":', '["__proto__"]:', text)


# members of the JS Model (runtime.js) that an infer entry's method would shadow
JS_MEMBERS = frozenset(
    "create step stepMany params grads loadParams buffers loadBuffers bufferNames reset setLr currentLr save restore "
    "close paramNames seed lr "
    "requiredLimits device stepCount kernelSet kernelSetReason adapterInfo constructor trainEntries stepCounts".split()
)


def js_train_methods(name: str) -> tuple[str, str]:
    """The JS methods of training entry `name` (Python's step_<name>, step_many_<name>), in the JS
    Model's camelCase: stepD, stepManyD for "d"; stepFake_real for "fake_real"."""
    cap = name[:1].upper() + name[1:]
    return "step" + cap, "stepMany" + cap


def matmul_specs(c) -> dict:
    """Kernel name -> the MatmulSpec of its CPU variant, for the wasm set's SIMD matmuls."""
    return {k.name: k.mm_spec for ks in c.kernels.values() for k in ks if getattr(k, "mm_spec", None) is not None}


def wasm_variants(c) -> dict:
    """Kernel name -> (WGSL, grid) of the wasm set's own variant (codegen.KernelCode.wasm_variant)."""
    return {k.name: k.wasm_variant for ks in c.kernels.values() for k in ks if getattr(k, "wasm_variant", None)}


def web_files(c, source_name: str) -> dict[str, str]:
    """Relative path -> file content of the web project."""
    prog, wgsl, wgsl_cpu, wgsl_subgroup = web_tables(c)
    name = prog["name"]
    trains = {e: t["name"] for e, t in prog.get("trains", {}).items() if e != "train"}
    methods = {}  # JS method -> what it runs
    for e, tname in trains.items():
        for m in js_train_methods(tname):
            if m in JS_MEMBERS or m in methods or m in prog["signatures"]:
                raise ValueError(f"{name}: training entry {tname!r}'s JS method {m} collides with another member; "
                                 "rename it for the web target")
            methods[m] = e
    for entry in prog["signatures"]:
        if entry != "train" and entry not in trains and (entry in JS_MEMBERS or entry.startswith("_") or entry in methods):
            raise ValueError(
                f"{name}: infer entry {entry!r} would shadow the JS Model's {entry}; rename it for the web target"
            )
    source = printable(source_name)
    wasm = wasm_build.build_wasm(prog, wgsl, wgsl_cpu, matmul_specs(c), wasm_variants(c))
    if "error" in wasm:  # the page's "auto" keeps WebGPU's sets; kernels: "wasm" says this again
        print(f"aot: {name}: the web module has no wasm kernel set: {wasm['error']}", file=sys.stderr)
    entries = {}
    for entry, sig in prog["signatures"].items():
        entries[entry] = {
            "args": list(sig),
            "doc": emit._signature_doc({n: tuple(v) for n, v in sig.items()}, prog["dims"]),
            # a training entry of a dict train=: its name and JS methods (stepD, stepManyD)
            "train_name": trains.get(entry),
            "js": js_train_methods(trains[entry]) if entry in trains else None,
        }
    runtime = RUNTIME_JS.read_text(encoding="utf-8")
    demo = (c.traced.program.web or {}).get("demo")  # Program(web={"demo": ...}), copied as demo.js
    ctx = dict(
        demo=bool(demo),
        name=name,
        source=source,
        entries=entries,
        header=f"@generated by aot from {source}; do not edit",
        program_js=_js(prog),
        wgsl_js=_js(wgsl),
        wgsl_cpu_js=_js(wgsl_cpu),
        wgsl_subgroup_js=_js(wgsl_subgroup),
        wasm_js=_js(wasm),
        runtime=runtime,
        infer=[e for e in entries if e != "train" and e not in trains],
        n_params=len(prog["params"]),
        total=sum(math.prod(p[1]) for p in prog["params"]),
    )
    files = {
        f"{name}.js": render("web/module.js.j2", **ctx),
        "index.html": render("web/index.html.j2", **ctx),
        "README.md": render("web/README.md.j2", npm_name=web_npm.npm_name(name), **ctx),
        "package.json": web_npm.package_json(name, source),
        f"{name}.d.ts": web_npm.dts_file(name, source, prog, entries, ctx["infer"]),
    }
    if demo:
        files["demo.js"] = Path(demo).read_text(encoding="utf-8")
    return files


def write_web(c, outdir: Path, source_name: str, force: bool = False, folder: str | None = None) -> Path:
    """Write the web project into outdir/<folder or name>/ (emit.write_project's rules)."""
    return emit.write_project(Path(outdir) / (folder or c.program["name"]), web_files(c, source_name), force)
