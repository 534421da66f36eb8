"""Compile time and speed of the CPU kernel set's matmuls on a CPU adapter (lavapipe, SwiftShader).

    python scripts/bench_matmul_cpu.py --out scripts/results/bench_matmul_cpu_lavapipe.json
    python scripts/bench_matmul_cpu.py --blocks 8x8,4x4 --tiles 64x64_8x8 --layouts plain

A CPU adapter compiles a shader at its first dispatch, so each kernel's compile time is its
first dispatch less the median of the next ones (Mesa's shader cache is turned off for the
process unless --warm-cache). Cases: the matmul shapes of the addition transformer and the sine
MLP, each plain and with A or B read transposed (the backward products). Every block of
matmul_codegen.CPU_BLOCKS (render_matmul_cpu) is timed, and with --tiles GPU tiles with their K
loop (render_matmul(unroll_k=False)) for comparison. (The committed
results/bench_matmul_cpu_lavapipe.json was taken while those still stored through a loop too,
as the CPU kernel set's matmuls then did.) Every
result is checked against NumPy before it is timed. Timings are one submit per repetition,
waited for (host clock).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHAPES = [  # (M, K, N): the addition transformer's products, then the sine MLP's
    (1024, 64, 64),
    (64, 1024, 64),
    (1024, 64, 256),
    (1024, 256, 64),
    (64, 1024, 256),
    (256, 1024, 64),
    (1024, 64, 12),
    (256, 64, 64),
    (256, 64, 1),
    (1, 256, 64),
]
LAYOUTS = {"plain": (False, False), "a_t": (True, False), "b_t": (False, True)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", help="comma-separated CPU_BLOCKS names (default: all)")
    ap.add_argument("--tiles", default="", help="comma-separated GPU tile names to time in their loop form too")
    ap.add_argument("--layouts", default="plain,a_t,b_t")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warm-cache", action="store_true", help="keep Mesa's shader cache (compile times then mean little)")
    ap.add_argument("--out")
    args = ap.parse_args()
    if not args.warm_cache:
        os.environ["MESA_SHADER_CACHE_DISABLE"] = "true"  # read when the driver loads: before wgpu

    import wgpu

    from aot.matmul_codegen import CPU_BLOCKS, CPU_BLOCKS_BY_NAME, TILES_BY_NAME, MatmulSpec, Operand, render_matmul, render_matmul_cpu

    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    device = adapter.request_device_sync()
    info = dict(adapter.info)
    print(f"adapter: {info.get('device')} ({info.get('adapter_type')}), {os.cpu_count()} CPU cores")
    blocks = [CPU_BLOCKS_BY_NAME[n] for n in args.blocks.split(",")] if args.blocks else list(CPU_BLOCKS)
    tiles = [TILES_BY_NAME[n] for n in args.tiles.split(",") if n]
    bindings = "\n".join(
        f"@group(0) @binding({i}) var<storage, {acc}> {n}: array<f32>;" for i, (n, acc) in enumerate((("A", "read"), ("B", "read"), ("C", "read_write")))
    )
    U = wgpu.BufferUsage
    rng = np.random.default_rng(0)
    rows = []
    for M, K, N in SHAPES:
        a = rng.standard_normal((M, K)).astype(np.float32)
        b = rng.standard_normal((K, N)).astype(np.float32)
        want = a.astype(np.float64) @ b
        for layout in args.layouts.split(","):
            ta, tb = LAYOUTS[layout]
            op_a = Operand("A", 0, 0, 1, M) if ta else Operand("A", 0, 0, K, 1)
            op_b = Operand("B", 0, 0, 1, K) if tb else Operand("B", 0, 0, N, 1)
            spec = MatmulSpec(1, M, N, K, op_a, op_b, "C", 0)
            bufs = [
                device.create_buffer_with_data(data=np.ascontiguousarray(a.T if ta else a), usage=U.STORAGE),
                device.create_buffer_with_data(data=np.ascontiguousarray(b.T if tb else b), usage=U.STORAGE),
                device.create_buffer(size=4 * M * N, usage=U.STORAGE | U.COPY_SRC),
            ]
            kernels = [("block", blk.name, *render_matmul_cpu(spec, "bench", "// bench", bindings, block=blk)) for blk in blocks]
            kernels += [
                ("tile", t.name, *render_matmul(spec, "bench", "// bench", bindings, tile=t, unroll_k=False))
                for t in tiles
            ]
            for kind, name, src, grid in kernels:
                t0 = time.perf_counter()
                module = device.create_shader_module(code=src)
                pipe = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
                create_s = time.perf_counter() - t0
                group = device.create_bind_group(
                    layout=pipe.get_bind_group_layout(0),
                    entries=[{"binding": i, "resource": {"buffer": buf}} for i, buf in enumerate(bufs)],
                )
                times = []
                for _ in range(args.reps + 1):
                    enc = device.create_command_encoder()
                    cp = enc.begin_compute_pass()
                    cp.set_pipeline(pipe)
                    cp.set_bind_group(0, group)
                    cp.dispatch_workgroups(*grid)
                    cp.end()
                    t0 = time.perf_counter()
                    device.queue.submit([enc.finish()])
                    out = device.queue.read_buffer(bufs[2])
                    times.append(time.perf_counter() - t0)
                got = np.frombuffer(out, np.float32).reshape(M, N)
                err = float(np.abs(got - want).max() / (np.abs(a) @ np.abs(b) + 1).max())
                if err > 1e-5 * max(K, 8):
                    raise SystemExit(f"{kind} {name} at {M}x{K}x{N} {layout}: wrong result (scaled error {err:.3g})")
                run_s = statistics.median(times[1:])
                row = {
                    "M": M, "K": K, "N": N, "layout": layout, kind: name, "grid": list(grid),
                    "compile_ms": round(1e3 * (create_s + times[0] - run_s), 1),
                    "run_ms": round(1e3 * run_s, 3),
                    "gflops": round(2 * M * K * N / run_s / 1e9, 3),
                }
                rows.append(row)
                print(f"{M}x{K}x{N} {layout:5s} {kind} {name:12s} grid {str(tuple(grid)):14s} compile {row['compile_ms']:7.1f} ms"
                      f"  run {row['run_ms']:8.3f} ms  {row['gflops']:6.2f} GFLOP/s", flush=True)
    summary = {}
    for kind, names in (("block", [b.name for b in blocks]), ("tile", [t.name for t in tiles])):
        for name in names:
            mine = [r for r in rows if r.get(kind) == name]
            big = [r for r in mine if r["M"] * r["N"] * r["K"] >= 2**20]
            summary[name] = {
                "median_compile_ms": statistics.median(r["compile_ms"] for r in mine),
                "median_gflops_large": statistics.median(r["gflops"] for r in big) if big else None,
            }
            print(f"{name:14s} compile {summary[name]['median_compile_ms']:6.1f} ms (median), "
                  f"{summary[name]['median_gflops_large'] or 0:.2f} GFLOP/s (median over products of >= 2^20 multiply-adds)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"adapter": info, "cpu_cores": os.cpu_count(), "machine": platform.node(),
                       "cold": not args.warm_cache, "summary": summary, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
