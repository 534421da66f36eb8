"""Does a copy into a mappable buffer overlap compute dispatches in wgpu's one queue (issue 35)?
A bucketed training step copies each gradient bucket from the GPU into a MAP_READ buffer while
the backward pass still runs; if the queue runs that copy (76 MB over PCIe for
transformer_large: ~1.7 ms) before the next dispatch instead of beside it, the whole readback is
exposed. Times, on this process's first GPU, a chain of dispatches (each writing a buffer the
copies never touch, a barrier between each, as the backward's) with copies placed in it:

  compute:           K x N in one command buffer (the baseline)
  copy_first:        a copy of a 25 MiB storage buffer into a MAP_READ buffer, then K x N
  copy_middle:       K x N/2, the copy, K x N/2
  copy_own_submit:   K x N/2 | the copy | K x N/2, three submits
  staged_middle:     K x N/2, a device-local copy (storage -> storage), then the same storage ->
                     MAP_READ copy after one more dispatch, K x (N/2 - 1)
  copy_dependent:    K x N/2 writing the copied buffer, the copy, K x N/2 writing it again
                     (the backward's case: the next dispatch writes the buffer being read)
  copy_alone:        the copy by itself
  shader_down_alone: where wgpu-native's mappable-primary-buffers is there, a compute kernel
                     copying the storage buffer into a MAP_READ | STORAGE buffer (vec4 loads
                     and stores over PCIe) instead of copy_buffer_to_buffer; copy_down_alone
                     the copy command into that same buffer
  shader_up_alone:   the kernel copying back (host memory -> the storage buffer: what an
                     upload from a readback buffer does); copy_up_alone the copy command

Each: the median over --iters of the time from submit to the queue being idle (a map of a
small buffer written last). Writes JSON (ms). An "overhead" of a placement near copy_alone
means the copy runs in line; near 0 means it overlaps the dispatches.
    python scripts/bench_copy_overlap.py --out overlap.json [--iters 10] [--n 8] [--loops 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

KERNEL = """
@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    var x = a[g.x];
    for (var i = 0u; i < LOOPSu; i = i + 1u) {
        x = x * 0.999999 + 0.5;
    }
    a[g.x] = x;
}
"""


COPY_KERNEL = """
@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) w: vec3<u32>) {
    let n = arrayLength(&src);
    for (var i = g.x; i < n; i = i + w.x * 256u) {
        dst[i] = src[i];
    }
}
"""


def run(iters: int, n: int, loops: int, elems: int, mib: float) -> dict:
    import wgpu

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from aot.runtime import engine

    adapter, _ = engine.choose_adapter(None)
    mappable = engine.MAPPABLE_FEATURE in adapter.features  # MAP_READ buffers usable as storage too
    device = adapter.request_device_sync(required_features=[engine.MAPPABLE_FEATURE] if mappable else [])
    u = wgpu.BufferUsage
    nbytes = int(mib * 2**20) // 4 * 4
    work = device.create_buffer(size=4 * elems, usage=u.STORAGE | u.COPY_SRC | u.COPY_DST)
    grads = device.create_buffer(size=max(nbytes, 4 * elems), usage=u.STORAGE | u.COPY_SRC | u.COPY_DST)
    stage = device.create_buffer(size=nbytes, usage=u.COPY_SRC | u.COPY_DST)
    rb = device.create_buffer(size=nbytes, usage=u.MAP_READ | u.COPY_DST)
    tiny = device.create_buffer(size=4, usage=u.MAP_READ | u.COPY_DST)
    module = device.create_shader_module(code=KERNEL.replace("LOOPS", str(loops)))
    pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    layout = pipeline.get_bind_group_layout(0)
    groups = {
        name: device.create_bind_group(layout=layout, entries=[{"binding": 0, "resource": {"buffer": buf, "offset": 0, "size": 4 * elems}}])
        for name, buf in (("work", work), ("grads", grads))
    }

    def dispatches(enc, k, on="work"):
        if k <= 0:
            return
        p = enc.begin_compute_pass()
        p.set_pipeline(pipeline)
        p.set_bind_group(0, groups[on])
        for _ in range(k):
            p.dispatch_workgroups(elems // 256)
        p.end()

    def copy(enc, src=grads, dst=rb):
        enc.copy_buffer_to_buffer(src, 0, dst, 0, nbytes)

    if mappable:
        host = device.create_buffer(size=nbytes, usage=u.MAP_READ | u.COPY_DST | u.COPY_SRC | u.STORAGE)
        cmod = device.create_shader_module(code=COPY_KERNEL)
        cpipe = device.create_compute_pipeline(layout="auto", compute={"module": cmod, "entry_point": "main"})
        clayout = cpipe.get_bind_group_layout(0)

        def copy_group(src, dst):
            return device.create_bind_group(layout=clayout, entries=[
                {"binding": 0, "resource": {"buffer": src, "offset": 0, "size": nbytes}},
                {"binding": 1, "resource": {"buffer": dst, "offset": 0, "size": nbytes}},
            ])

        cgroups = {"down": copy_group(grads, host), "up": copy_group(host, grads)}

    def shader_copy(enc, way):
        p = enc.begin_compute_pass()
        p.set_pipeline(cpipe)
        p.set_bind_group(0, cgroups[way])
        p.dispatch_workgroups(min(65535, -(-nbytes // 16 // 256)))
        p.end()

    half = n // 2
    plans = {
        "compute": [[("k", n)]],
        "copy_first": [[("copy",), ("k", n)]],
        "copy_middle": [[("k", half), ("copy",), ("k", n - half)]],
        "copy_own_submit": [[("k", half)], [("copy",)], [("k", n - half)]],
        "staged_middle": [[("k", half), ("stage",), ("k", 1), ("trip",), ("k", n - half - 1)]],
        "copy_dependent": [[("kg", half), ("copy",), ("kg", n - half)]],
        "copy_alone": [[("copy",)]],
    }
    if mappable:
        plans.update(
            shader_down_alone=[[("sdown",)]], copy_down_alone=[[("cdown",)]],
            shader_up_alone=[[("sup",)]], copy_up_alone=[[("cup",)]],
            shader_down_middle=[[("k", half), ("sdown",), ("k", n - half)]],
        )
    out = {"adapter": adapter.info["device"], "n": n, "loops": loops, "elems": elems, "copy_mib": mib}
    times = {name: [] for name in plans}
    for it in range(iters + 2):
        for name, subs in plans.items():
            bufs = []
            for i, ops in enumerate(subs):
                enc = device.create_command_encoder()
                for op in ops:
                    if op[0] == "k":
                        dispatches(enc, op[1])
                    elif op[0] == "kg":
                        dispatches(enc, op[1], "grads")
                    elif op[0] == "copy":
                        copy(enc)
                    elif op[0] == "stage":
                        copy(enc, grads, stage)
                    elif op[0] == "trip":
                        copy(enc, stage, rb)
                    elif op[0] in ("sdown", "sup"):
                        shader_copy(enc, op[0][1:])
                    elif op[0] == "cdown":
                        copy(enc, grads, host)
                    elif op[0] == "cup":
                        copy(enc, host, grads)
                if i == len(subs) - 1:
                    enc.copy_buffer_to_buffer(work, 0, tiny, 0, 4)
                bufs.append(enc.finish())
            t0 = time.perf_counter()
            for b in bufs:
                device.queue.submit([b])
            tiny.map_sync(wgpu.MapMode.READ, 0, 4)
            dt = time.perf_counter() - t0
            tiny.unmap()
            if it >= 2:
                times[name].append(dt)
    med = {name: 1e3 * float(np.median(ts)) for name, ts in times.items()}
    out["ms"] = med
    alone = [name for name in plans if name.endswith("_alone")]
    out["overhead_ms"] = {name: med[name] - med["compute"] for name in plans if name != "compute" and name not in alone}
    out["copy_alone_gb_s"] = nbytes / 1e6 / med["copy_alone"]
    out["gb_s"] = {name: nbytes / 1e6 / med[name] for name in alone}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--n", type=int, default=8, help="dispatches in the chain")
    ap.add_argument("--loops", type=int, default=20000, help="loop trips per thread of each dispatch")
    ap.add_argument("--elems", type=int, default=1 << 20, help="threads (floats) per dispatch")
    ap.add_argument("--mib", type=float, default=25.0, help="the copy's size")
    args = ap.parse_args()
    res = run(args.iters, args.n, args.loops, args.elems, args.mib)
    print(json.dumps(res, indent=1))
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
