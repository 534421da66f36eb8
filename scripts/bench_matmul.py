"""Benchmark the generated WGSL matmul kernels on the local GPU (wgpu), against torch/cuBLAS.

    python scripts/bench_matmul.py --out bench_matmul.json           # the tiles the compiler picks
    python scripts/bench_matmul.py --sweep --out sweep.json          # every tile, prefetch on/off

Cases: 4096^3 and the model shapes (M, K, N), each also as its two backward products
(dA = dC @ B^T with B read transposed, dB = A^T @ dC with A read transposed). Each timing is
N dispatches inside one compute pass and one submit, synchronised by a 4-byte readback
(about 0.35 ms, amortised: N grows until a repetition takes about 30 ms); the figure is the
median of --reps repetitions. torch.matmul runs the same products on CUDA with TF32 off,
eager and from a CUDA graph, and the faster of the two is compared against (skipped when
torch or CUDA is missing). Every kernel's result is checked against torch (float64) or
NumPy before it is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import wgpu  # noqa: E402

from aot.matmul_codegen import (  # noqa: E402
    TILES,
    TILES_BY_NAME,
    MatmulSpec,
    Operand,
    Tile,
    choose_prefetch,
    choose_tile,
    flops,
    render_matmul,
)

MODEL_SHAPES = [  # (M, K, N)
    (256, 1, 64),
    (256, 64, 64),
    (256, 64, 1),
    (1024, 64, 64),
    (1024, 64, 256),
    (1024, 256, 64),
    (8192, 512, 512),
    (8192, 512, 2048),
    (8192, 2048, 512),
]
# Tiles beside the table (--double); some need more than WebGPU's default 16 KiB of workgroup memory.
EXTRA_TILES = (
    Tile("128x128_8x8_k16", 128, 128, 16, 8, 8),
    Tile("128x64_8x4_k16", 128, 64, 16, 8, 4),
    Tile("128x64_8x8_k16", 128, 64, 16, 8, 8),
    Tile("64x128_4x8_k16", 64, 128, 16, 4, 8),
    Tile("64x128_8x8_k32", 64, 128, 32, 8, 8),
)
TARGET_S = 0.03  # wall time of one timed repetition
MAX_ITERS = 20000


def cases(quick: bool):
    """(label, M, K, N, A transposed, B transposed) for every product measured."""
    out = [("4096^3", 4096, 4096, 4096, False, False)]
    # the big products first: a run cut short by --budget-s keeps the figures that matter most
    for M, K, N in reversed(MODEL_SHAPES[: 4 if quick else None]):
        out.append((f"{M}x{K}x{N} fwd", M, K, N, False, False))
        out.append((f"{M}x{K}x{N} dA", M, N, K, False, True))  # dC[M,N] @ B[K,N]^T
        out.append((f"{M}x{K}x{N} dB", K, M, N, True, False))  # A[M,K]^T @ dC[M,N]
    return out


def operand(name: str, rows: int, cols: int, transposed: bool, vec: bool = True) -> Operand:
    # transposed: the [rows, cols] operand is a view of a stored [cols, rows] matrix;
    # vec: the buffer is also bound as vec4s (binding name + "4"), as the compiler binds it
    v = name + "4" if vec else ""
    return Operand(name, 0, 0, 1, rows, vec_buf=v) if transposed else Operand(name, 0, 0, cols, 1, vec_buf=v)


class Wgpu:
    def __init__(self):
        self.adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        lim = self.adapter.limits
        self.max_shared = lim["max-compute-workgroup-storage-size"]
        self.device = self.adapter.request_device_sync(
            required_limits={
                "max-storage-buffer-binding-size": lim["max-storage-buffer-binding-size"],
                "max-buffer-size": lim["max-buffer-size"],
                "max-compute-workgroup-storage-size": self.max_shared,
            }
        )
        self.set_access("read")

    def set_access(self, access: str) -> None:
        """Bind A and B as `read` or `read_write` storage (a model's scratch buffers are read_write)."""
        self.bindings = "\n".join(
            [
                f"@group(0) @binding(0) var<storage, {access}> A: array<f32>;",
                f"@group(0) @binding(1) var<storage, {access}> B: array<f32>;",
                "@group(0) @binding(2) var<storage, read_write> C: array<f32>;",
                # A and B again as vec4s, for the slab loads that read 4 floats at once
                f"@group(0) @binding(3) var<storage, {access}> A4: array<vec4<f32>>;",
                f"@group(0) @binding(4) var<storage, {access}> B4: array<vec4<f32>>;",
            ]
        )

    def buffers(self, a: np.ndarray, b: np.ndarray, c_len: int):
        U = wgpu.BufferUsage
        self.bufs = [
            self.device.create_buffer_with_data(data=a, usage=U.STORAGE),
            self.device.create_buffer_with_data(data=b, usage=U.STORAGE),
            self.device.create_buffer(size=4 * c_len, usage=U.STORAGE | U.COPY_SRC),
        ]

    def prepare(self, spec: MatmulSpec, tile, prefetch: bool, unroll_k: bool = True, double_buffer: bool = False, vec_k_inner: bool = False):
        """(pipeline, bind group, grid, seconds to create the pipeline) of one kernel; it reads
        A and B through their vec4 bindings where spec's operands name them (vec_buf)."""
        src, grid = render_matmul(
            spec, "bench_matmul", "// bench_matmul", self.bindings, tile=tile, prefetch=prefetch, unroll_k=unroll_k,
            double_buffer=double_buffer, max_shared=self.max_shared, vec_k_inner=vec_k_inner,
        )
        t0 = time.perf_counter()
        pipe, bg = self.compute(src, self.bufs + self.bufs[:2])
        return pipe, bg, grid, time.perf_counter() - t0

    def compute(self, src: str, bufs: list):
        """(pipeline, bind group) of WGSL `src` whose bindings 0, 1, ... are `bufs`; bindings
        the kernel never indexes are left out of both (an "auto" layout has no place for them)."""
        lines, used = [], []
        code = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith("//"))
        for line in src.splitlines():
            m = re.match(r"@group\(0\) @binding\((\d+)\) var<[^>]*> (\w+):", line)
            if m and f"{m.group(2)}[" not in code:
                continue
            if m:
                used.append(int(m.group(1)))
            lines.append(line)
        pipe = self.device.create_compute_pipeline(
            layout="auto",
            compute={"module": self.device.create_shader_module(code="\n".join(lines)), "entry_point": "main"},
        )
        bg = self.device.create_bind_group(
            layout=pipe.get_bind_group_layout(0),
            entries=[{"binding": i, "resource": {"buffer": bufs[i]}} for i in used],
        )
        return pipe, bg

    def run(self, pipe, bg, grid, iters: int) -> float:
        enc = self.device.create_command_encoder()
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipe)
        cp.set_bind_group(0, bg)
        for _ in range(iters):
            cp.dispatch_workgroups(*grid)
        cp.end()
        t0 = time.perf_counter()
        self.device.queue.submit([enc.finish()])
        # wgpu 0.32's on_submitted_work_done_sync fails (callback signature), so a 4-byte
        # readback, which waits for all submitted work, is the sync point.
        self.device.queue.read_buffer(self.bufs[2], 0, 4)
        return time.perf_counter() - t0

    def prepare_split(self, spec: MatmulSpec, tile, prefetch: bool, vec_k_inner: bool = False):
        """spec.batch partial products into a [batch, M, N] buffer, then a kernel summing them
        into [M, N] (what passes.split_long_matmuls builds), as two pipelines run in turn."""
        U = wgpu.BufferUsage
        parts = spec.batch * spec.M * spec.N
        self.split_bufs = [
            self.device.create_buffer(size=4 * parts, usage=U.STORAGE),
            self.device.create_buffer(size=4 * spec.M * spec.N, usage=U.STORAGE | U.COPY_SRC),
        ]
        src, grid = render_matmul(
            spec, "bench_matmul", "// bench_matmul", self.bindings, tile=tile, prefetch=prefetch,
            max_shared=self.max_shared, vec_k_inner=vec_k_inner,
        )
        mm, mm_bg = self.compute(src, self.bufs[:2] + self.split_bufs[:1] + self.bufs[:2])
        mn = spec.M * spec.N
        sum_src = (
            "@group(0) @binding(0) var<storage, read> P: array<f32>;\n"
            "@group(0) @binding(1) var<storage, read_write> D: array<f32>;\n"
            "@compute @workgroup_size(256)\n"
            "fn main(@builtin(global_invocation_id) g: vec3<u32>) {\n"
            f"    let i = g.x + g.y * 65535u * 256u;\n    if (i >= {mn}u) {{ return; }}\n"
            f"    var s = 0.0;\n    for (var c = 0u; c < {spec.batch}u; c++) {{ s += P[c * {mn}u + i]; }}\n"
            "    D[i] = s;\n}\n"
        )
        sm, sm_bg = self.compute(sum_src, self.split_bufs)
        groups = -(-mn // 256)
        sum_grid = (min(groups, 65535), -(-groups // 65535), 1)
        return [(mm, mm_bg, grid), (sm, sm_bg, sum_grid)]

    def run_steps(self, steps, iters: int) -> float:
        enc = self.device.create_command_encoder()
        cp = enc.begin_compute_pass()
        for _ in range(iters):
            for pipe, bg, grid in steps:
                cp.set_pipeline(pipe)
                cp.set_bind_group(0, bg)
                cp.dispatch_workgroups(*grid)
        cp.end()
        t0 = time.perf_counter()
        self.device.queue.submit([enc.finish()])
        self.device.queue.read_buffer(self.split_bufs[1], 0, 4)
        return time.perf_counter() - t0

    def result(self, shape) -> np.ndarray:
        return np.frombuffer(self.device.queue.read_buffer(self.bufs[2]), dtype=np.float32).reshape(shape)

    def time(self, pipe, bg, grid, reps: int) -> float:
        return timed(lambda n: self.run(pipe, bg, grid, n), reps)


def timed(run, reps: int) -> float:
    """Seconds per call: run(n) times n back-to-back calls; n grows until a repetition lasts
    about TARGET_S, so the sync at the end of each repetition is amortised."""
    n = 1
    while True:
        t = run(n)
        if t > TARGET_S / 3 or n >= MAX_ITERS:
            break
        n = min(MAX_ITERS, n * 4)
    n = int(min(MAX_ITERS, max(2, n * TARGET_S / max(t, 1e-9))))
    run(n)  # warm-up at the timed count: clocks up, caches filled
    return float(np.median([run(n) / n for _ in range(reps)]))


def torch_setup():
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        return torch
    except Exception:
        return None


def torch_time(torch, a, b, reps: int) -> dict:
    """torch.matmul(a, b, out=) per call: eager (launch overhead included, between CUDA events)
    and replayed from a CUDA graph of 16 calls (the cuBLAS kernels alone)."""
    out = torch.empty((a.shape[0], b.shape[1]), device="cuda", dtype=torch.float32)

    def events(fn, n: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3

    def call():
        torch.matmul(a, b, out=out)

    result = {"eager_s": timed(lambda n: events(call, n), reps)}
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(16):
                call()
        result["graph_s"] = timed(lambda n: events(graph.replay, n), reps) / 16
    except Exception as e:
        result["graph_error"] = str(e)[:200]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench_matmul.json")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sweep", action="store_true", help="time every tile of the table, prefetch on and off")
    ap.add_argument("--quick", action="store_true", help="4096^3 and the first model shapes only")
    ap.add_argument("--only", default="", help="comma-separated substrings: run only the matching cases")
    ap.add_argument(
        "--unroll", choices=("loop", "unroll", "both"), default="unroll",
        help="K rows of a slab written out (the GPU kernels), as a loop (the CPU kernels), or both",
    )
    ap.add_argument(
        "--double", action="store_true",
        help="also time the picked tile double-buffered, and the K-16 tiles of EXTRA_TILES (more workgroup memory)",
    )
    ap.add_argument(
        "--vec", default="ab",
        help="comma-separated operand sets whose slab loads may read vec4s (none, a, b, ab; a trailing k: "
        "also where K is the contiguous index, render_matmul(vec_k_inner=True)); each is timed",
    )
    ap.add_argument(
        "--access", default="read",
        help="comma-separated: bind A and B as read and/or read_write storage, each timed (a model's scratch is read_write)",
    )
    ap.add_argument("--tiles", default="", help="comma-separated tile names to time (instead of the picked one)")
    ap.add_argument(
        "--split", default="",
        help="comma-separated K chunk counts: also time each product as that many partial products plus their sum",
    )
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new cases after this long")
    args = ap.parse_args()

    g = Wgpu()
    torch = torch_setup()
    info = dict(g.adapter.info)
    report = {
        "adapter": {k: str(v) for k, v in info.items()},
        "python": platform.python_version(),
        "wgpu": wgpu.__version__,
        "torch": None if torch is None else torch.__version__,
        "cuda_device": None if torch is None else torch.cuda.get_device_name(0),
        "method": "median of reps; each rep = N dispatches in one compute pass, one submit, "
        "4-byte readback as sync; torch: N torch.matmul(out=) between CUDA events, eager "
        "and CUDA-graph replay, TF32 off; ratio against the faster",
        "results": [],
    }
    print(f"adapter: {info.get('device')} ({info.get('backend_type')}); torch: {report['cuda_device']}")
    started = time.perf_counter()
    rng = np.random.default_rng(0)
    header = f"{'case':<22} {'M':>5} {'K':>5} {'N':>5}  {'tile':<14} {'pf':>2} {'us':>9} {'wgsl TF/s':>9} {'torch TF/s':>10} {'ratio':>6}"
    print(header)
    only = [s for s in args.only.split(",") if s]
    for label, M, K, N, ta, tb in cases(args.quick):
        if only and not any(s in label for s in only):
            continue
        if time.perf_counter() - started > args.budget_s:
            print(f"budget spent; skipping {label} and later")
            break
        spec = MatmulSpec(1, M, N, K, operand("A", M, K, ta), operand("B", K, N, tb), "C", 0)
        policies = [(p, acc) for p in args.vec.split(",") if p for acc in args.access.split(",") if acc]
        a = rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32)
        b = rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32)
        g.buffers(a, b, M * N)
        ref = None
        row = {"case": label, "M": M, "K": K, "N": N, "a_transposed": ta, "b_transposed": tb}
        try:
            if torch is None:
                raise RuntimeError("no torch with CUDA")
            ta_t, tb_t = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
            ta_v, tb_v = (ta_t.t() if ta else ta_t), (tb_t.t() if tb else tb_t)
            ref = (ta_v.double() @ tb_v.double()).cpu().numpy()
            row.update({"torch_" + k: v for k, v in torch_time(torch, ta_v, tb_v, args.reps).items()})
            # the faster of eager and graph-replayed cuBLAS is the figure compared against
            row["torch_s"] = min(row["torch_eager_s"], row.get("torch_graph_s", np.inf))
            row["torch_tflops"] = flops(spec) / row["torch_s"] / 1e12
        except Exception as e:
            if torch is not None:
                row["torch_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        if ref is None and M * N * K <= 2**30:
            ref = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
        chosen = choose_tile(spec)
        # prefetch off is only worth a look on the big tiles (long K loops, few threads)
        sweep = [(t, pf) for t in TILES for pf in (True, False) if pf or t.TM * t.TN >= 32]
        configs = sweep if args.sweep else [(chosen, choose_prefetch(spec, chosen))]
        if args.tiles:
            configs = [(TILES_BY_NAME[n], True) for n in args.tiles.split(",")]
        configs = [(t, pf, False) for t, pf in configs]
        if args.double:
            configs += [(chosen, True, True)] + [(t, True, db) for t in EXTRA_TILES for db in (False, True)]
        unrolls = {"loop": [False], "unroll": [True], "both": [False, True]}[args.unroll]
        runs = []
        for (tile, pf, db), unroll, (vec, access) in [(c, u, v) for c in configs for u in unrolls for v in policies]:
            # prefetch makes no difference to the kernel when K fits in one slab
            same_pf = pf == choose_prefetch(spec, chosen) or K <= chosen.BK * chosen.S
            entry = {
                "tile": tile.name, "prefetch": pf, "unroll_k": unroll, "double_buffer": db, "vec_loads": vec, "access": access,
                "chosen": tile == chosen and same_pf and unroll and not db and (vec, access) == policies[0],
            }
            g.set_access(access)
            try:
                vspec = MatmulSpec(1, M, N, K, operand("A", M, K, ta, "a" in vec), operand("B", K, N, tb, "b" in vec), "C", 0)
                pipe, bg, grid, entry["compile_s"] = g.prepare(vspec, tile, pf, unroll, db, vec.endswith("k"))
                g.run(pipe, bg, grid, 1)
                if ref is not None:
                    got = g.result((M, N))
                    bound = np.abs(ref).max() + 1.0
                    entry["max_err"] = float(np.abs(got - ref).max() / bound)
                    entry["correct"] = entry["max_err"] < 1e-4
                entry["s"] = g.time(pipe, bg, grid, args.reps)
                entry["tflops"] = flops(spec) / entry["s"] / 1e12
            except Exception as e:  # keep going: one bad config must not lose the run
                entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            runs.append(entry)
            ok = "" if entry.get("correct", True) else "  WRONG"
            torch_tf = row.get("torch_tflops")
            ratio = entry.get("tflops", 0) / torch_tf if torch_tf else None
            print(
                f"{label:<22} {M:>5} {K:>5} {N:>5}  {tile.name + ('' if unroll else '/loop') + ('/db' if db else '') + '/' + vec + ('/rw' if access == 'read_write' else ''):<14} {int(pf):>2} "
                f"{entry.get('s', float('nan')) * 1e6:>9.1f} {entry.get('tflops', float('nan')):>9.3f} "
                f"{torch_tf if torch_tf else float('nan'):>10.3f} "
                f"{ratio if ratio else float('nan'):>6.2f}{ok}{'  ' + entry['error'] if 'error' in entry else ''}",
                flush=True,
            )
        for n_split, (vec, access) in [(int(x), v) for x in args.split.split(",") if x for v in policies]:
            if K % n_split:
                continue
            g.set_access(access)
            kc = K // n_split
            av, bv = ("A4" if "a" in vec else ""), ("B4" if "b" in vec else "")
            a_op = Operand("A", 0, kc * M, 1, M, vec_buf=av) if ta else Operand("A", 0, kc, K, 1, vec_buf=av)
            b_op = Operand("B", 0, kc, 1, K, vec_buf=bv) if tb else Operand("B", 0, kc * N, N, 1, vec_buf=bv)
            sspec = MatmulSpec(n_split, M, N, kc, a_op, b_op, "C", 0)
            tile = choose_tile(sspec)
            entry = {"tile": tile.name, "split": n_split, "vec_loads": vec, "access": access, "prefetch": True, "unroll_k": True, "double_buffer": False, "chosen": False}
            try:
                steps = g.prepare_split(sspec, tile, choose_prefetch(sspec, tile), vec.endswith("k"))
                g.run_steps(steps, 1)
                if ref is not None:
                    got = np.frombuffer(g.device.queue.read_buffer(g.split_bufs[1]), dtype=np.float32).reshape(M, N)
                    entry["max_err"] = float(np.abs(got - ref).max() / (np.abs(ref).max() + 1.0))
                    entry["correct"] = entry["max_err"] < 1e-4
                entry["s"] = timed(lambda n: g.run_steps(steps, n), args.reps)
                entry["matmul_s"] = timed(lambda n: g.run_steps(steps[:1], n), args.reps)
                entry["tflops"] = flops(spec) / entry["s"] / 1e12
            except Exception as e:
                entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            runs.append(entry)
            torch_tf = row.get("torch_tflops")
            print(
                f"{label:<22} {M:>5} {K:>5} {N:>5}  {tile.name + f'/split{n_split}/{vec}' + ('/rw' if access == 'read_write' else ''):<14}    "
                f"{entry.get('s', float('nan')) * 1e6:>9.1f} {entry.get('tflops', float('nan')):>9.3f} "
                f"{torch_tf if torch_tf else float('nan'):>10.3f} "
                f"{entry.get('tflops', 0) / torch_tf if torch_tf else float('nan'):>6.2f}"
                f"{'' if entry.get('correct', True) else '  WRONG'}{'  ' + entry['error'] if 'error' in entry else ''}"
                f"  (matmul alone {entry.get('matmul_s', float('nan')) * 1e6:.1f} us)",
                flush=True,
            )
        row["runs"] = runs
        measured = [r for r in runs if "tflops" in r]
        if measured:
            best = max(measured, key=lambda r: r["tflops"])
            row["best"] = {k: best[k] for k in ("tile", "prefetch", "double_buffer", "tflops")}
            pick = next((r for r in measured if r["chosen"]), None)
            if pick is not None:
                row["chosen"] = {"tile": pick["tile"], "tflops": pick["tflops"]}
                if "torch_tflops" in row:
                    row["chosen"]["ratio_to_torch"] = pick["tflops"] / row["torch_tflops"]
        report["results"].append(row)
        with open(args.out, "w") as f:  # rewritten after every case: a killed run keeps its results
            json.dump(report, f, indent=1)
    if args.sweep:
        print("\nbest per case:")
        for row in report["results"]:
            if "best" in row:
                ch = row.get("chosen", {})
                print(
                    f"{row['case']:<22} best {row['best']['tile']:<14} pf={int(row['best']['prefetch'])} "
                    f"{row['best']['tflops']:8.3f}   chosen {ch.get('tile', '-'):<14} {ch.get('tflops', float('nan')):8.3f}"
                )
    print(f"wrote {args.out} ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
