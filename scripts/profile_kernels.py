"""Time every kernel of one entry point in isolation (its own submit, waited for).

    python scripts/profile_kernels.py examples/addition_transformer.py [--entry train] [--top 25] [--out prof.json]

Per-kernel times include one submit + wait each, so they overstate small kernels; use them to
rank kernels, and scripts/bench.py for whole steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--program")
    ap.add_argument("--entry", default="train")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out")
    args = ap.parse_args()

    import aot
    from aot.cli import load_programs

    progs = load_programs(args.model)
    prog = progs[args.program] if args.program else next(iter(progs.values()))
    model = aot.compile(prog)
    e = model._engine
    key = next(k for k in e.entries if k == args.entry or k.startswith(args.entry + "["))
    # realistic data: zeros are valid for every input kind (indices 0 are in range)
    packed = {
        "inputs": np.zeros(e.entries[key]["input_sizes"]["inputs"], np.float32),
        "inputs_i32": np.zeros(e.entries[key]["input_sizes"]["inputs_i32"], np.int32),
    }
    e.run(key, packed, False)  # compile every pipeline first
    rows = []
    for kname, grid in e.entries[key]["dispatches"]:
        ts = []
        for _ in range(args.reps):
            enc = e.device.create_command_encoder()
            cp = enc.begin_compute_pass()
            cp.set_pipeline(e.pipelines[kname])
            cp.set_bind_group(0, e.kernel_group[kname])
            cp.dispatch_workgroups(*grid)
            cp.end()
            t = time.perf_counter()
            e.device.queue.submit([enc.finish()])
            e.device.queue.read_buffer(e.buffers["params"], 0, 4)
            ts.append(time.perf_counter() - t)
        rows.append({"kernel": kname, "grid": list(grid), "ms": round(statistics.median(ts) * 1e3, 4)})
    total = sum(r["ms"] for r in rows)
    print(f"{key}: {len(rows)} kernels, {total:.1f} ms summed ({e.adapter_info.get('device', '?')})")
    for r in sorted(rows, key=lambda r: -r["ms"])[: args.top]:
        print(f"{r['ms']:10.3f} ms  {r['kernel']:<48} {tuple(r['grid'])}")
    if args.out:
        Path(args.out).write_text(json.dumps({"entry": key, "adapter": e.adapter_info.get("device"), "kernels": rows}, indent=1))
    model.close()


if __name__ == "__main__":
    main()
