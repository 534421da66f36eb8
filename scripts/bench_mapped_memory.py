"""Where do mappable buffers live, and what does each leg of a gradient bucket's trip cost (issue 35)?

bench_host_grads.py found transformer_large's step on an H200 4.5 ms slower with its gradient
arena MAP_READ | STORAGE, but only 0.4 ms slower with MAP_READ | MAP_WRITE | STORAGE: the driver
seems to put the second in device memory the host can map (a PCIe BAR). If so, a bucket's
readback buffer made that way turns the GPU's copies into device-speed copies, and the PCIe
transfer moves to CUDA's copy engines, off wgpu's one queue. This times, per usage of a
--mib buffer `buf` (each with COPY_SRC | COPY_DST):

  gpu_down_ms:  the GPU copying a storage buffer into buf (submit to done)
  gpu_up_ms:    the GPU copying buf back into the storage buffer
  cpu_read_gb_s, cpu_write_gb_s:  numpy copying out of / into buf mapped
  cuda_register:  whether cudaHostRegister takes buf's mapping (0: yes; where torch has CUDA);
                  cuda_register_io: the same with cudaHostRegisterIoMemory, where the first fails
  cuda_h2d_gb_s, cuda_d2h_gb_s:  CUDA copying buf's mapping to device memory and back

    python scripts/bench_mapped_memory.py --out scripts/results/bench_mapped_memory_h200.json [--mib 73]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time

import numpy as np


IO_MEMORY = 4  # cudaHostRegisterIoMemory


def _median_ms(fn, iters: int) -> float:
    fn()
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(ts))


def run(mib: float, iters: int) -> dict:
    import wgpu

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from aot.runtime import engine

    from wgpu.backends.wgpu_native import _api

    lib, ffi = _api.lib, _api.ffi
    adapter, _ = engine.choose_adapter(None)
    feature = engine.MAPPABLE_FEATURE in adapter.features
    device = adapter.request_device_sync(required_features=[engine.MAPPABLE_FEATURE] if feature else [])
    u = wgpu.BufferUsage
    n = int(mib * 2**20) // 4 * 4
    src = device.create_buffer(size=n, usage=u.STORAGE | u.COPY_SRC | u.COPY_DST)
    device.queue.write_buffer(src, 0, np.arange(n // 4, dtype=np.float32).tobytes())
    tiny = device.create_buffer(size=4, usage=u.MAP_READ | u.COPY_DST)
    copy = u.COPY_SRC | u.COPY_DST
    usages = {"read": u.MAP_READ | copy, "write": u.MAP_WRITE | copy}
    if feature:
        usages.update({"read_write": u.MAP_READ | u.MAP_WRITE | copy, "read_storage": u.MAP_READ | u.STORAGE | copy,
                       "read_write_storage": u.MAP_READ | u.MAP_WRITE | u.STORAGE | copy})
    try:
        import torch

        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    out = {"adapter": adapter.info["device"], "bytes": n, "feature": feature, "usages": {}}
    for name, usage in usages.items():
        buf = device.create_buffer(size=n, usage=usage)
        row = {}

        def gpu(a, b):
            def go():
                enc = device.create_command_encoder()
                enc.copy_buffer_to_buffer(a, 0, b, 0, n)
                enc.copy_buffer_to_buffer(src, 0, tiny, 0, 4)
                device.queue.submit([enc.finish()])
                tiny.map_sync(wgpu.MapMode.READ, 0, 4)
                tiny.unmap()
            return go

        row["gpu_down_ms"] = _median_ms(gpu(src, buf), iters)
        row["gpu_up_ms"] = _median_ms(gpu(buf, src), iters)
        mode = wgpu.MapMode.READ if usage & u.MAP_READ else wgpu.MapMode.WRITE
        buf.map_sync(mode, 0, n)
        ptr = int(ffi.cast("uintptr_t", lib.wgpuBufferGetMappedRange(buf._internal, 0, n)))  # noqa: SLF001
        arr = np.ctypeslib.as_array((ctypes.c_float * (n // 4)).from_address(ptr))
        sink = np.empty_like(arr)
        row["cpu_read_gb_s"] = n / 1e6 / _median_ms(lambda: np.copyto(sink, arr), iters)
        row["cpu_write_gb_s"] = n / 1e6 / _median_ms(lambda: np.copyto(arr, sink), iters)
        if cuda:
            for flags in (0, IO_MEMORY):  # device memory behind a BAR is I/O memory to CUDA
                code = torch.cuda.cudart().cudaHostRegister(ptr, n, flags)
                code = int(code[0] if isinstance(code, tuple) else code)
                row["cuda_register" if not flags else "cuda_register_io"] = code
                if code == 0:
                    break
                from aot.runtime.distributed import _clear_cuda_error

                _clear_cuda_error()  # the refused registration's error, which torch would raise next
            if code == 0:
                host = torch.frombuffer((ctypes.c_char * n).from_address(ptr), dtype=torch.float32)
                dev = torch.empty(n // 4, dtype=torch.float32, device="cuda")

                def h2d():
                    dev.copy_(host, non_blocking=True)
                    torch.cuda.synchronize()

                def d2h():
                    host.copy_(dev, non_blocking=True)
                    torch.cuda.synchronize()

                row["cuda_h2d_gb_s"] = n / 1e6 / _median_ms(h2d, iters)
                row["cuda_h2d_right"] = bool((dev[:4096].cpu().numpy() == np.arange(4096, dtype=np.float32)).all())
                row["cuda_d2h_gb_s"] = n / 1e6 / _median_ms(d2h, iters)
                torch.cuda.cudart().cudaHostUnregister(ptr)
        buf.unmap()
        out["usages"][name] = row
        print(name, json.dumps(row), flush=True)
        buf.destroy()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--mib", type=float, default=73.0)
    ap.add_argument("--iters", type=int, default=7)
    args = ap.parse_args()
    res = run(args.mib, args.iters)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
