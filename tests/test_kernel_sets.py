"""Which kernel set Model() takes (aot/runtime/kernel_sets.py): software adapters by what they say
of themselves, the probe kernels timed where they say nothing, and why, in kernel_set_reason.
The web runtime's twin (runtime.js recognise/timeKernelSets) is tested in Chrome (test_web.py)."""

from __future__ import annotations

import os
import runpy
from pathlib import Path

import pytest

import aot
from aot.runtime import kernel_sets

ROOT = Path(__file__).resolve().parent.parent

# adapter infos as wgpu-py reports them (lavapipe and llvmpipe's GL: this machine's), and others
INFOS = [
    ({"vendor": "llvmpipe", "device": "llvmpipe (LLVM 15.0.6, 256 bits)", "description": "Mesa 22.3.6 (LLVM 15.0.6)",
      "vendor_id": 0x10005, "adapter_type": "CPU", "backend_type": "Vulkan"}, "cpu"),
    ({"vendor": "", "device": "llvmpipe (LLVM 15.0.6, 256 bits)", "description": "4.5 (Core Profile) Mesa 22.3.6",
      "vendor_id": 0x10005, "adapter_type": "CPU", "backend_type": "OpenGL"}, "cpu"),
    # llvmpipe behind a backend that does not say CPU: by name, or by Mesa's vendor id
    ({"vendor": "", "device": "ANGLE (Mesa, Vulkan 1.3.230 (llvmpipe (LLVM 15.0.6 256 bits)))", "adapter_type": "Unknown"}, "cpu"),
    ({"vendor": "", "device": "", "vendor_id": 0x10005, "adapter_type": "Unknown"}, "cpu"),
    ({"vendor": "Google", "device": "SwiftShader Device (Subzero)", "adapter_type": "Unknown"}, "cpu"),
    ({"vendor": "Microsoft", "device": "Microsoft Basic Render Driver", "vendor_id": 0x1414, "adapter_type": "Unknown"}, "cpu"),
    ({"vendor": "NVIDIA", "device": "NVIDIA H100 80GB HBM3", "vendor_id": 0x10DE, "adapter_type": "DiscreteGPU"}, "gpu"),
    ({"vendor": "Intel", "device": "Mesa Intel(R) UHD Graphics 620", "vendor_id": 0x8086, "adapter_type": "IntegratedGPU"}, "gpu"),
    ({"vendor": "", "architecture": "", "device": "", "description": "", "adapter_type": "Unknown"}, None),
]


@pytest.mark.parametrize("info,want", INFOS)
def test_recognise(info, want):
    got, why = kernel_sets.recognise(info)
    assert got == want, why
    assert why.startswith({"cpu": "a software adapter (", "gpu": "a GPU (", None: "the adapter does not say"}[want])


@pytest.fixture(scope="module")
def sine():
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    prog = runpy.run_path(str(ROOT / "examples" / "sine_mlp.py"), run_name="__aot_test__")["program"]
    try:
        m = aot.compile(prog)
    except RuntimeError as e:
        pytest.skip(f"no WebGPU adapter: {e}")
    yield prog, m
    m.close()


def test_reason_says_why(sine):
    prog, m = sine
    if m.adapter["type"] == "CPU":
        assert m.kernel_set == "cpu" and m.kernel_set_reason.startswith("a software adapter (its type is CPU: ")
    forced = aot.compile(prog, kernels="gpu")
    try:
        assert (forced.kernel_set, forced.kernel_set_reason) == ("gpu", "asked for (kernels='gpu')")
    finally:
        forced.close()


def test_probe_kernels_compute_the_matmul_and_time_the_sets(sine):
    """Both probe kernels compute A @ B (the timing compares like with like); on a CPU adapter
    (lavapipe here) the CPU set's is more than PROBE_MARGIN times faster, so a CPU that said
    nothing of itself would get the CPU set."""
    import numpy as np
    import wgpu

    _, m = sine
    dev = m._engine.device
    n = kernel_sets.PROBE_N
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    for kset, (grid, code) in kernel_sets.PROBES.items():
        bufs = [dev.create_buffer_with_data(data=a, usage=usage), dev.create_buffer_with_data(data=b, usage=usage),
                dev.create_buffer(size=a.nbytes, usage=usage)]
        pipe = dev.create_compute_pipeline(layout="auto", compute={"module": dev.create_shader_module(code=code), "entry_point": "main"})
        group = dev.create_bind_group(layout=pipe.get_bind_group_layout(0),
                                      entries=[{"binding": i, "resource": {"buffer": x}} for i, x in enumerate(bufs)])
        enc = dev.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, group)
        cp.dispatch_workgroups(*grid)
        cp.end()
        dev.queue.submit([enc.finish()])
        c = np.frombuffer(dev.queue.read_buffer(bufs[2]), np.float32).reshape(n, n)
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4, err_msg=kset)
    if m.adapter["type"] != "CPU":
        pytest.skip("the timing half needs a CPU adapter")
    times = kernel_sets.time_kernel_sets(dev, wgpu)
    chosen, why = kernel_sets.timed_choice(times, "the adapter does not say what it is")
    assert chosen == "cpu", why
    assert why.startswith("the adapter does not say what it is; timed: the CPU set's probe kernel took ")


def test_web_runtime_has_the_same_probes():
    """runtime.js times the same two kernels (its bindings text is built the same way)."""
    js = (ROOT / "codegen_templates" / "web" / "runtime.js").read_text()
    assert f"const PROBE_N = {kernel_sets.PROBE_N};" in js and f"const PROBE_MARGIN = {kernel_sets.PROBE_MARGIN:g};" in js
    assert f"const PROBE_REPS = {kernel_sets.PROBE_REPS};" in js
    for _grid, code in kernel_sets.PROBES.values():
        assert code[len(kernel_sets._BINDINGS):] in js
