"""The "wasm" kernel set: the program's tables and CPU kernels -> one WebAssembly module for the
web target (its last stage; wasm_wgsl.py parses, wasm_lower.py lowers, wasm_encode.py encodes).

Every arena of the program lives at a fixed address of one linear memory (`layout`), so the
page writes inputs and reads outputs through typed-array views, and one exported function per
entry point (`run:<entry key>`) runs that entry's whole CPU dispatch list (codegen's
"dispatches_cpu": every kernel on its own) and its copies: a training step is one JS -> wasm call.
Kernels come from the CPU variants' WGSL (wasm_wgsl's module doc says why); matmuls are
register-blocked f32x4 code of their own (wasm_matmul.py) that store through the kernel's own
`store_c`, so epilogues and extra outputs stay the WGSL's. A kernel the subset cannot compile
(workgroup memory and barriers, an unknown builtin) leaves the program without a wasm set:
`build_wasm` returns the reason, the build prints it, and the page's "auto" picks "cpu".
"""

from __future__ import annotations

import base64

from . import wasm_matmul
from .wasm_encode import Code, Module
from .wasm_lanes import lanes_kernel
from .wasm_phases import phased_kernel
from .wasm_lower import Library, ShaderContext, kernel_function, math_calls
from .wasm_values import Binding
from .wasm_wgsl import WasmUnsupported, parse

PAGE = 65536
ALIGN = 64  # arena addresses: cache-line aligned (v128 loads want 16)
VEC_BINDING_BASE = 500  # runtime.js: a buffer's vec4 alias is bound at 500 + its binding


def arena_sizes(prog: dict) -> dict[str, int]:
    """Elements of each arena: the largest any entry point needs (entries run one at a time)."""
    sizes = dict(prog["arenas"])
    for e in prog["entries"].values():
        for a, n in (e.get("arenas") or {}).items():
            sizes[a] = max(sizes.get(a, 0), n)
    return sizes


def layout(prog: dict) -> tuple[dict[str, list[int]], int]:
    """{arena: [byte address, elements]} and the first free byte after them."""
    out, at = {}, ALIGN
    for a, n in arena_sizes(prog).items():
        out[a] = [at, n]
        at += -(-max(4 * n, 4) // ALIGN) * ALIGN
    return out, at


# the most locals a function may declare in V8 and SpiderMonkey (kMaxFunctionLocals): a module
# with one function over it fails WebAssembly.validate as a whole
MAX_LOCALS = 50000


def dispatches(en: dict) -> list:
    return en.get("dispatches_cpu") or en["dispatches"]


def build_wasm(prog: dict, wgsl: dict[str, str], wgsl_cpu: dict[str, str], specs: dict | None = None,
               variants: dict | None = None) -> dict:
    """The wasm set of a program: {"wasm": base64 bytes, "wasm_relaxed": the same with the matmuls'
    multiply-adds as relaxed-simd's f32x4.relaxed_madd (fused where the CPU has FMA; absent
    without matmuls), "layout", "pages", "math"}, or {"error": why} where a kernel cannot run in
    it. `specs`: kernel name -> the MatmulSpec of its CPU matmul (codegen.KernelCode.mm_spec);
    `variants`: kernel name -> (WGSL, grid) run instead of the CPU variant (KernelCode.wasm_variant)."""
    out = _build(prog, wgsl, wgsl_cpu, specs or {}, variants or {}, relaxed=False)
    if "error" not in out and specs:
        out["wasm_relaxed"] = _build(prog, wgsl, wgsl_cpu, specs, variants or {}, relaxed=True)["wasm"]
    return out


def _build(prog: dict, wgsl: dict[str, str], wgsl_cpu: dict[str, str], specs: dict, variants: dict, relaxed: bool) -> dict:
    addresses, top = layout(prog)
    order = list(prog["arenas"])
    used = list(dict.fromkeys(k for en in prog["entries"].values() for k, _ in dispatches(en)))
    shaders = {}
    for k in used:
        try:
            shaders[k] = parse(variants[k][0] if k in variants else wgsl_cpu.get(k) or wgsl[k])
        except WasmUnsupported as e:
            return {"error": f"kernel {k}: {e}"}
    math = sorted(set().union(*(math_calls(s) for s in shaders.values())) if shaders else set())
    module = Module()
    free = [top]

    def scratch(nbytes: int) -> int:
        at = free[0]
        free[0] += -(-nbytes // ALIGN) * ALIGN
        return at

    lib = Library(module, math, scratch, relaxed=relaxed)
    mm = [specs[k] for k in used if k in specs]
    mm_base = scratch(4 * max(map(wasm_matmul.scratch_floats, mm))) // 4 if mm else 0  # one region, reused
    funcs, lanes, why_not = {}, [], {}
    for k in used:
        first = len(module.funcs)
        sh = shaders[k]
        bindings = {}
        for name, (number, _access, ty) in sh.bindings.items():
            arena = order[number % VEC_BINDING_BASE]
            et = ty[1] if isinstance(ty, tuple) else ty
            address, n = addresses[arena]
            bindings[name] = Binding(address, et, n // 4 if str(et).startswith("vec") else n)
        ctx = ShaderContext(sh, bindings, list(prog["kernels"][k][2]), lib)
        try:
            if k in specs:
                funcs[k] = wasm_matmul.matmul_function(ctx, specs[k], mm_base)
            elif sh.workgroup:
                funcs[k] = phased_kernel(ctx)
            else:
                funcs[k] = kernel_function(ctx)
                try:  # four invocations a step where the kernel's shape allows (wasm_lanes)
                    four = lanes_kernel(ctx, funcs[k])
                except WasmUnsupported as e:
                    four, why_not[k] = None, str(e)
                if four is not None:
                    funcs[k] = four
                    lanes.append(k)
        except WasmUnsupported as e:
            return {"error": f"kernel {k} (from {prog['kernels'][k][1]}): {e}"}
        # every function the kernel added (its own, its matmul's parts, both lane forms): engines
        # refuse the whole module for one over the limit, so say which kernel, at build time
        n = max((len(code.locals) for _, code in module.funcs[first:]), default=0)
        if n > MAX_LOCALS:
            return {"error": f"kernel {k} (from {prog['kernels'][k][1]}) needs {n} WebAssembly locals, more than "
                             f"engines compile ({MAX_LOCALS})"}
    for k, index in funcs.items():  # each kernel on its own too: bench_web.py --profile times them
        module.exports.append(("kernel:" + k, index))
    for key, en in prog["entries"].items():
        c = Code([])
        for k, grid in dispatches(en):
            for g in variants[k][1] if k in variants else grid:
                c.op("i32.const", g)
            c.op("call", funcs[k])
        for src, so, dst, d, n in en.get("copies", []):
            c.op("i32.const", addresses[dst][0] + 4 * d).op("i32.const", addresses[src][0] + 4 * so)
            c.op("i32.const", 4 * n).op("memory.copy")
        module.add_func([], [], c, export="run:" + key)
    pages = -(-free[0] // PAGE)
    return {
        "wasm": base64.b64encode(module.encode(pages)).decode("ascii"),
        "layout": addresses,
        "pages": pages,
        "math": math,
        "lanes": lanes,  # kernels that run four invocations a step (wasm_lanes)
        "one_at_a_time": why_not,  # kernels of the guarded shape that do not, and why
    }


__all__ = ["build_wasm", "layout", "arena_sizes"]
