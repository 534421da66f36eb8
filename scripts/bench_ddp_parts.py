"""The fixed costs of a data-parallel step's host round trip, one part at a time (issue 35):
what one NCCL mean of a bucket costs the host to start and how long it takes (each torch call
of distributed.AllReduce's NCCL path timed on its own; the same through a CUDA graph), and what
wgpu-native costs: a submit, a map of a buffer whose submission is done, and whether CUDA can
pin a mapped WebGPU buffer (cudaHostRegister), which lets NCCL's copies read the mapped
buckets without a host copy, and what each way of uploading a bucket costs. Writes JSON.
    python scripts/bench_ddp_parts.py --out parts.json [--world 2] [--iters 50]
Needs a CUDA build of torch with NCCL (the collective part) and wgpu (the map part).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np

SIZES = {"addition_transformer": 150656, "bucket_25mib": 6553600}


def _median_us(xs: list) -> float:
    return float(np.median(xs)) * 1e6


def collectives(iters: int) -> dict:
    """Per bucket size, the median microseconds of each call of the NCCL mean (pinned host ->
    GPU, all_reduce, div, GPU -> pinned host, event), the wait after it, and the same as one
    CUDA graph replay."""
    import torch
    import torch.distributed as td

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank % torch.cuda.device_count())
    td.init_process_group("cpu:gloo,cuda:nccl")
    world = td.get_world_size()
    out = {"rank": rank, "trace_buffer": os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")}
    for label, n in SIZES.items():
        pinned = torch.ones(n, dtype=torch.float32).pin_memory()
        dev = torch.empty(n, dtype=torch.float32, device="cuda")
        stream = torch.cuda.Stream()
        done = torch.cuda.Event()
        parts = {k: [] for k in ("enter", "h2d", "all_reduce", "div", "d2h", "record", "start", "wait", "total")}
        for it in range(iters + 5):
            td.barrier()
            t0 = time.perf_counter()
            with torch.cuda.stream(stream):
                t1 = time.perf_counter()
                dev.copy_(pinned, non_blocking=True)
                t2 = time.perf_counter()
                td.all_reduce(dev, op=td.ReduceOp.SUM)
                t3 = time.perf_counter()
                dev.div_(world)
                t4 = time.perf_counter()
                pinned.copy_(dev, non_blocking=True)
                t5 = time.perf_counter()
                done.record(stream)
                t6 = time.perf_counter()
            done.synchronize()
            t7 = time.perf_counter()
            if it >= 5:
                for k, a, b in [("enter", t0, t1), ("h2d", t1, t2), ("all_reduce", t2, t3), ("div", t3, t4),
                                ("d2h", t4, t5), ("record", t5, t6), ("start", t0, t6), ("wait", t6, t7), ("total", t0, t7)]:
                    parts[k].append(b - a)
        row = {k: _median_us(v) for k, v in parts.items()}
        print("PARTIAL " + json.dumps({label: row}), flush=True)  # kept if the graph part below hangs
        try:  # the same four operations captured once and replayed: one launch
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream):
                for _ in range(3):
                    dev.copy_(pinned, non_blocking=True)
                    td.all_reduce(dev, op=td.ReduceOp.SUM)
                    dev.div_(world)
                    pinned.copy_(dev, non_blocking=True)
            stream.synchronize()
            with torch.cuda.graph(graph, stream=stream):
                dev.copy_(pinned, non_blocking=True)
                td.all_reduce(dev, op=td.ReduceOp.SUM)
                dev.div_(world)
                pinned.copy_(dev, non_blocking=True)
            starts, totals = [], []
            for it in range(iters + 5):
                td.barrier()
                t0 = time.perf_counter()
                graph.replay()
                done.record(stream)
                t1 = time.perf_counter()
                done.synchronize()
                t2 = time.perf_counter()
                if it >= 5:
                    starts.append(t1 - t0)
                    totals.append(t2 - t0)
            row["graph_start"], row["graph_total"] = _median_us(starts), _median_us(totals)
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            row["graph_error"] = f"{type(e).__name__}: {e}"[:400]
        out[label] = row
    td.destroy_process_group()
    return out


def maps(iters: int) -> dict:
    """wgpu-native's costs on this process's first GPU: a submit of an empty command buffer,
    the round trip of a map whose submission is done, a copy's submit + map, and whether CUDA
    pins a mapped buffer (cudaHostRegister) and how fast it copies from it."""
    import wgpu

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from aot.runtime import engine

    engine._ready_native()
    m = engine._MAPS
    adapter, _ = engine.choose_adapter(None)
    device = adapter.request_device_sync()
    n = SIZES["bucket_25mib"] * 4
    src = device.create_buffer(size=n, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST)
    rb = device.create_buffer(size=n, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)
    up = device.create_buffer(size=n, usage=wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC)
    out = {"adapter": adapter.info["device"]}
    sub, mapped, small, big = [], [], [], []
    for it in range(iters + 5):
        t0 = time.perf_counter()
        idx = m.submit(device.queue, device.create_command_encoder().finish())
        t1 = time.perf_counter()
        m.wait(device, m.request(rb, 4), idx)
        m.unmap(rb)
        t2 = time.perf_counter()
        enc = device.create_command_encoder()
        enc.copy_buffer_to_buffer(src, 0, rb, 0, 4 * SIZES["addition_transformer"])
        idx = m.submit(device.queue, enc.finish())
        m.wait(device, m.request(rb, 4 * SIZES["addition_transformer"]), idx)
        m.unmap(rb)
        t3 = time.perf_counter()
        enc = device.create_command_encoder()
        enc.copy_buffer_to_buffer(src, 0, rb, 0, n)
        idx = m.submit(device.queue, enc.finish())
        m.wait(device, m.request(rb, n), idx)
        m.unmap(rb)
        t4 = time.perf_counter()
        if it >= 5:
            sub.append(t1 - t0)
            mapped.append(t2 - t1)
            small.append(t3 - t2)
            big.append(t4 - t3)
    out.update(
        submit_empty_us=_median_us(sub), map_done_us=_median_us(mapped),
        copy_600kb_submit_map_us=_median_us(small), copy_26mb_submit_map_us=_median_us(big),
        d2h_26mb_gb_s=n / np.median(big) / 1e9,
    )
    out.update(uploads(device, m, src, up, np.ones(n // 4, dtype=np.float32), n))
    try:
        import torch

        cudart = torch.cuda.cudart()
        ptrs = []
        for _ in range(3):  # is the mapping at the same address every time?
            m.wait(device, m.request(rb, n), None)
            ptrs.append(int(m.ffi.cast("uintptr_t", m.lib.wgpuBufferGetConstMappedRange(rb._internal, 0, n))))
            m.unmap(rb)
        out["read_map_addresses_stable"] = len(set(ptrs)) == 1
        m.wait(device, m.request(rb, n), None)
        ptr = int(m.ffi.cast("uintptr_t", m.lib.wgpuBufferGetConstMappedRange(rb._internal, 0, n)))
        code = cudart.cudaHostRegister(ptr, n, 0)
        out["cuda_host_register_read_map"] = int(code) if not isinstance(code, tuple) else int(code[0])
        if out["cuda_host_register_read_map"] == 0:
            host = torch.frombuffer(m.ffi.buffer(m.ffi.cast("void *", ptr), n), dtype=torch.float32)
            gpu = torch.empty_like(host, device="cuda")
            times = []
            for _ in range(10):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                gpu.copy_(host, non_blocking=True)
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            out["h2d_from_registered_map_gb_s"] = n / np.median(times) / 1e9
            out["registered_is_pinned"] = bool(host.is_pinned())
            cudart.cudaHostUnregister(ptr)
        m.unmap(rb)
        pinned = torch.empty(n // 4, dtype=torch.float32).pin_memory()
        gpu = torch.empty_like(pinned, device="cuda")
        times = []
        for _ in range(10):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            gpu.copy_(pinned, non_blocking=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        out["h2d_from_pinned_gb_s"] = n / np.median(times) / 1e9
        m.wait(device, m.request(up, n, write=True), None)
        ptr = int(m.ffi.cast("uintptr_t", m.lib.wgpuBufferGetMappedRange(up._internal, 0, n)))
        code = cudart.cudaHostRegister(ptr, n, 0)
        out["cuda_host_register_write_map"] = int(code) if not isinstance(code, tuple) else int(code[0])
        if out["cuda_host_register_write_map"] == 0:
            cudart.cudaHostUnregister(ptr)
        else:  # device memory behind a PCIe BAR? CUDA takes that as I/O memory (cudaHostRegisterIoMemory)
            from aot.runtime.distributed import _clear_cuda_error

            _clear_cuda_error()
            code = cudart.cudaHostRegister(ptr, n, 4)
            out["cuda_host_register_write_map_io"] = int(code) if not isinstance(code, tuple) else int(code[0])
            if out["cuda_host_register_write_map_io"] == 0:
                host = torch.frombuffer(m.ffi.buffer(m.ffi.cast("void *", ptr), n), dtype=torch.float32)
                times = []
                for _ in range(10):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    host.copy_(gpu, non_blocking=True)
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - t0)
                out["d2h_into_io_registered_write_map_gb_s"] = n / np.median(times) / 1e9
                cudart.cudaHostUnregister(ptr)
            else:
                _clear_cuda_error()
        m.unmap(up)
    except Exception as e:  # noqa: BLE001 - reported, not fatal
        out["cuda_error"] = f"{type(e).__name__}: {e}"[:400]
    return out


def uploads(device, m, dst, up, values: np.ndarray, n: int) -> dict:
    """A 26 MB bucket from host memory into a storage buffer, each way upload_bucket can:
    the engine's threaded copy into the write-mapped buffer then a GPU copy ("map"), or
    queue.write_buffer (wgpu's staging); the median ms from the start to the submit's end."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(8)
    out = {}
    for threads in (1, 8):
        times, copies = [], []
        for _ in range(10):
            t0 = time.perf_counter()
            m.wait(device, m.request(up, n, write=True), None)
            view = np.frombuffer(m.mapped_range(up, n, write=True), dtype=np.float32)
            t1 = time.perf_counter()
            cuts = [values.size * k // threads for k in range(threads + 1)]
            list(pool.map(lambda k: np.copyto(view[cuts[k] : cuts[k + 1]], values[cuts[k] : cuts[k + 1]]), range(threads)))
            t2 = time.perf_counter()
            m.unmap(up)
            enc = device.create_command_encoder()
            enc.copy_buffer_to_buffer(up, 0, dst, 0, n)
            index = m.submit(device.queue, enc.finish())  # before the map: the submit reads `up`
            m.wait(device, m.request(up, 4, write=True), index)
            m.unmap(up)
            times.append(time.perf_counter() - t0)
            copies.append(t2 - t1)
        out[f"upload_map_{threads}t_ms"] = float(np.median(times)) * 1e3
        out[f"upload_map_{threads}t_copy_gb_s"] = n / float(np.median(copies)) / 1e9
    times, calls = [], []
    for _ in range(10):
        t0 = time.perf_counter()
        device.queue.write_buffer(dst, 0, values)
        t1 = time.perf_counter()
        index = m.submit(device.queue, device.create_command_encoder().finish())
        m.wait(device, m.request(up, 4, write=True), index)
        m.unmap(up)
        times.append(time.perf_counter() - t0)
        calls.append(t1 - t0)
    out["upload_write_buffer_ms"] = float(np.median(times)) * 1e3
    out["upload_write_buffer_call_gb_s"] = n / float(np.median(calls)) / 1e9
    pool.shutdown()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=False)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="the collectives with torch's defaults only")
    ap.add_argument("--part", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.part:
        result = collectives(args.iters) if args.part == "collectives" else maps(args.iters)
        print("RESULT " + json.dumps(result), flush=True)
        return
    report = {"maps": None, "collectives": {}}

    def launch(part: str, world: int, extra: dict) -> list:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = []
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **extra)
            procs.append(subprocess.Popen([sys.executable, __file__, "--part", part, "--iters", str(args.iters)],
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        rows = []
        for p in procs:
            try:
                so, se = p.communicate(timeout=90)
            except subprocess.TimeoutExpired:  # the other rank failed: this one waits in a collective
                p.kill()
                so, se = p.communicate()
            lines = [x for x in so.splitlines() if x.startswith("RESULT ")]
            partial = {k: v for x in so.splitlines() if x.startswith("PARTIAL ") for k, v in json.loads(x[8:]).items()}
            rows.append(json.loads(lines[-1][7:]) if lines else {"error": se[-2000:], **partial})
        return rows

    report["maps"] = launch("maps", 1, {})[0]
    print("maps", json.dumps(report["maps"], indent=1), flush=True)
    envs = [("default", {}), ("trace_buffer_0", {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"})]
    for label, extra in envs[: 1 if args.quick else None]:
        report["collectives"][label] = launch("collectives", args.world, extra)
        print(label, json.dumps(report["collectives"][label][0], indent=1), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
