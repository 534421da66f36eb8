"""What one dispatch costs in a long list, and where: per dispatch, per barrier or per pass.

    python scripts/bench_dispatch.py [--n 180] [--reps 10] [--out FILE]

A step of ResNet-20 is ~180 dispatches in one compute pass (aot/runtime/engine.py records
every dispatch of an entry into one pass). Each case here records `n` dispatches of a trivial
kernel, `reps` times into one command buffer and one submit, and reports the median microseconds
per dispatch over 5 submits (a submit and its wait cost ~350 us on an H100, 1/(n*reps) of that
per dispatch):
  no_bindings      one pass, a kernel with no bindings: no hazard, so wgpu adds no barrier
  same_rw          one pass, every dispatch writes one read_write buffer: a barrier after each
  distinct_rw      one pass, each dispatch writes its own buffer (no data hazard between them)
  passes           one pass per dispatch, same buffer (tensorgrad's pattern)
  same_rw_big      as same_rw, 3136 workgroups of 256 lanes (ResNet-20's elementwise size)
  distinct_rw_big  as distinct_rw at that size
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import wgpu

EMPTY = "@compute @workgroup_size(64) fn main() {}"
WRITE = """
@group(0) @binding(0) var<storage, read_write> a: array<f32>;
@compute @workgroup_size(256) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x < arrayLength(&a)) { a[g.x] = a[g.x] + 1.0; }
}
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=180)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out")
    args = ap.parse_args()
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    dev = adapter.request_device_sync()
    n, reps = args.n, args.reps

    def pipeline(code):
        mod = dev.create_shader_module(code=code)
        return dev.create_compute_pipeline(layout="auto", compute={"module": mod, "entry_point": "main"})

    empty, write = pipeline(EMPTY), pipeline(WRITE)
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC

    def groups(count, floats):
        out = []
        for _ in range(count):
            buf = dev.create_buffer(size=4 * floats, usage=usage)
            out.append(
                dev.create_bind_group(
                    layout=write.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buf}}]
                )
            )
        return out

    sync = dev.create_buffer(size=16, usage=usage)  # read back to wait for each submit
    big = 3136 * 256
    one_small, many_small = groups(1, 256), groups(n, 256)
    one_big, many_big = groups(1, big), groups(n, big)

    def record(enc, pipe, bgs, grid, one_pass):
        cpass = enc.begin_compute_pass() if one_pass else None
        for i in range(n):
            if not one_pass:
                cpass = enc.begin_compute_pass()
            cpass.set_pipeline(pipe)
            if bgs:
                cpass.set_bind_group(0, bgs[i % len(bgs)])
            cpass.dispatch_workgroups(*grid)
            if not one_pass:
                cpass.end()
        if one_pass:
            cpass.end()

    def timed(pipe, bgs, grid, one_pass):
        ts = []
        for trial in range(6):
            enc = dev.create_command_encoder()
            for _ in range(reps):
                record(enc, pipe, bgs, grid, one_pass)
            cb = enc.finish()
            t = time.perf_counter()
            dev.queue.submit([cb])
            dev.queue.read_buffer(sync, 0, 4)
            if trial:  # the first warms pipelines and memory
                ts.append((time.perf_counter() - t) / (n * reps))
        return statistics.median(ts) * 1e6

    cases = {
        "no_bindings": (empty, [], (1, 1, 1), True),
        "same_rw": (write, one_small, (1, 1, 1), True),
        "distinct_rw": (write, many_small, (1, 1, 1), True),
        "passes": (write, one_small, (1, 1, 1), False),
        "same_rw_big": (write, one_big, (3136, 1, 1), True),
        "distinct_rw_big": (write, many_big, (3136, 1, 1), True),
    }
    result = {"adapter": adapter.info["device"], "n": n, "reps": reps, "us_per_dispatch": {}}
    for name, case in cases.items():
        result["us_per_dispatch"][name] = round(timed(*case), 3)
        print(name, result["us_per_dispatch"][name], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
