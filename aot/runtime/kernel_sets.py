"""Which kernel set suits an adapter: the CPU set on a software adapter (workgroup barriers and
workgroup memory are slow there: a CPU runs a workgroup's invocations as the lanes of one loop,
and a barrier splits that loop), else the GPU set (or its subgroup variant; engine.py decides
that part). The web runtime (codegen_templates/web/runtime.js `recognise`, `timeKernelSets`)
applies the same rules to what the browser tells.

An adapter is known by what it says of itself: its type (wgpu's `adapter_type`, "CPU" for
lavapipe and llvmpipe), its vendor id or its names (SwiftShader, llvmpipe/lavapipe behind any
backend, Microsoft's WARP). Where it says nothing to go by (an "Unknown" type and empty names,
as Chrome's masked adapter info on some backends), two small probe kernels that compute the same
matmul the way each set does are timed on its device, and the CPU set is taken only where its
probe is clearly faster.
"""

from __future__ import annotations

import re
import time

# SwiftShader (Chrome's fallback adapter), Mesa's llvmpipe / lavapipe / softpipe, Microsoft's WARP
# ("Microsoft Basic Render Driver")
SOFTWARE_NAMES = re.compile(r"swiftshader|llvmpipe|lavapipe|softpipe|basic render|\bwarp\b", re.IGNORECASE)
# Mesa's and Microsoft's PCI vendor ids: only their software drivers report them (Mesa's hardware
# drivers report the GPU maker's)
SOFTWARE_VENDOR_IDS = {0x10005: "Mesa", 0x1414: "Microsoft"}
GPU_TYPES = ("DiscreteGPU", "IntegratedGPU", "VirtualGPU")
NAME_FIELDS = ("vendor", "architecture", "device", "description")


def recognise(info: dict) -> tuple[str | None, str]:
    """(kernel set, why) from an adapter's info (wgpu-py's `adapter.info`): "cpu" for a software
    adapter, "gpu" for a GPU, None where the info says nothing to go by (time_kernel_sets decides)."""
    text = ", ".join(str(info.get(k) or "").strip() for k in NAME_FIELDS if str(info.get(k) or "").strip())
    kind = info.get("adapter_type") or ""
    said = f": {text}" if text else ""
    if kind == "CPU":
        return "cpu", f"a software adapter (its type is CPU{said})"
    name = SOFTWARE_NAMES.search(text)
    if name:
        return "cpu", f"a software adapter ({name.group(0)}{said})"
    vendor = SOFTWARE_VENDOR_IDS.get(info.get("vendor_id"))
    if vendor:
        return "cpu", f"a software adapter (vendor id {info['vendor_id']:#x}, {vendor}{said})"
    if kind in GPU_TYPES or text:
        return "gpu", f"a GPU ({', '.join(x for x in (kind, text) if x)})"
    return None, "the adapter does not say what it is"


# Two kernels computing the same PROBE_N x PROBE_N matmul (C = A @ B) the way each set does: the
# GPU set's (16 x 16 tiles of C, A and B staged through workgroup memory between barriers) and
# the CPU set's (each invocation sums a 4 x 4 block over all of K by itself). On a CPU adapter the
# first is several times slower; on a GPU both take microseconds. runtime.js has the same text.
PROBE_N = 64
PROBE_REPS = 4  # dispatches per timing
PROBE_MARGIN = 2.0  # the CPU set only where its probe is this many times faster
_BINDINGS = f"""@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
const N = {PROBE_N}u;
"""
PROBES = {
    "gpu": (
        (PROBE_N // 16, PROBE_N // 16),
        _BINDINGS
        + """var<workgroup> ta: array<f32, 256>;
var<workgroup> tb: array<f32, 256>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>) {
    let row = wg.y * 16u + l.y;
    let col = wg.x * 16u + l.x;
    var acc = 0.0;
    for (var k0 = 0u; k0 < N; k0 += 16u) {
        ta[l.y * 16u + l.x] = a[row * N + k0 + l.x];
        tb[l.y * 16u + l.x] = b[(k0 + l.y) * N + col];
        workgroupBarrier();
        for (var k = 0u; k < 16u; k++) {
            acc += ta[l.y * 16u + k] * tb[k * 16u + l.x];
        }
        workgroupBarrier();
    }
    c[row * N + col] = acc;
}
""",
    ),
    "cpu": (
        (PROBE_N * PROBE_N // 16 // 64, 1),
        _BINDINGS
        + """
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let row0 = g.x / (N / 4u) * 4u;
    let col0 = g.x % (N / 4u) * 4u;
    var c0 = vec4<f32>();
    var c1 = vec4<f32>();
    var c2 = vec4<f32>();
    var c3 = vec4<f32>();
    for (var k = 0u; k < N; k++) {
        let bk = vec4<f32>(b[k * N + col0], b[k * N + col0 + 1u], b[k * N + col0 + 2u], b[k * N + col0 + 3u]);
        c0 += a[row0 * N + k] * bk;
        c1 += a[(row0 + 1u) * N + k] * bk;
        c2 += a[(row0 + 2u) * N + k] * bk;
        c3 += a[(row0 + 3u) * N + k] * bk;
    }
    for (var j = 0u; j < 4u; j++) {
        c[row0 * N + col0 + j] = c0[j];
        c[(row0 + 1u) * N + col0 + j] = c1[j];
        c[(row0 + 2u) * N + col0 + j] = c2[j];
        c[(row0 + 3u) * N + col0 + j] = c3[j];
    }
}
""",
    ),
}


def time_kernel_sets(device, wgpu) -> dict[str, float]:
    """{"cpu": ms, "gpu": ms}: PROBE_REPS dispatches of each set's probe kernel on `device`, the
    better of two timings after one untimed dispatch (some drivers compile at the first)."""
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC
    buffers = [device.create_buffer(size=4 * PROBE_N * PROBE_N, usage=usage) for _ in range(3)]
    out = {}
    for kset, (grid, code) in PROBES.items():
        module = device.create_shader_module(label=f"{kset} set probe", code=code)
        pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
        group = device.create_bind_group(
            layout=pipeline.get_bind_group_layout(0),
            entries=[{"binding": i, "resource": {"buffer": b}} for i, b in enumerate(buffers)],
        )

        def run(reps: int) -> float:
            t0 = time.perf_counter()
            encoder = device.create_command_encoder()
            cpass = encoder.begin_compute_pass()
            cpass.set_pipeline(pipeline)
            cpass.set_bind_group(0, group)
            for _ in range(reps):
                cpass.dispatch_workgroups(*grid)
            cpass.end()
            device.queue.submit([encoder.finish()])
            device.queue.read_buffer(buffers[2], 0, 4)  # waits for the dispatches
            return 1000 * (time.perf_counter() - t0)

        run(1)
        out[kset] = min(run(PROBE_REPS), run(PROBE_REPS))
    for b in buffers:
        b.destroy()
    return out


def timed_choice(times: dict[str, float], said: str) -> tuple[str, str]:
    """(kernel set, why) from time_kernel_sets' times."""
    cpu, gpu = f"{times['cpu']:.2f}", f"{times['gpu']:.2f}"
    if times["cpu"] * PROBE_MARGIN < times["gpu"]:
        return "cpu", f"{said}; timed: the CPU set's probe kernel took {cpu} ms, the GPU set's {gpu} ms"
    return "gpu", f"{said}; timed: the GPU set's probe kernel took {gpu} ms, the CPU set's {cpu} ms"
