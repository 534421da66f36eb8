"""step() with its dispatches submitted in one piece or in two (engine.SPLIT_SUBMIT_MIN), or
step_many(K) with its first chunks ramped up from one step or in one chunk (engine.MANY_RAMP_MIN),
side by side in one process from one build.

    python scripts/bench_submit.py examples/transformer_large.py --steps 30 --out submit.json
    python scripts/bench_submit.py examples/resnet20.py --many 20 [--entry train_d]

With --many, each round times `--steps` step_many(K) calls (median, reported as steps/s) with the
ramp forced on and then off, and the engine's host seconds per step outside waiting for the GPU.

An entry point of at least SPLIT_SUBMIT_MIN dispatches submits its first FIRST_SUBMIT on their
own so that the GPU starts while the host records the rest. Each round times `--steps` step()
calls (median) with the split and then with it switched off (the package's threshold set out of
reach), from the same initial parameters and batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--many", type=int, default=0, help="time step_many(K) with and without the ramp")
    ap.add_argument("--entry", default="train")
    ap.add_argument("--out")
    args = ap.parse_args()

    import aot
    from aot.cli import load_programs

    prog = next(iter(load_programs(args.model).values()))
    first = aot.compile(prog)
    cls = type(first)
    engine = sys.modules[cls.__module__.rsplit(".", 1)[0] + ".engine"]
    split_at = engine.SPLIT_SUBMIT_MIN
    rng = np.random.default_rng(0)
    batch = {}
    for name, (dtype, shape) in first._program["signatures"][args.entry].items():
        shape = tuple(d if isinstance(d, int) else 1 for d in shape)
        batch[name] = rng.integers(0, 2, shape).astype(np.int32) if dtype == "i32" else rng.standard_normal(shape).astype(np.float32)
    first.close()
    if args.many:
        results = many_rounds(cls, engine, batch, args)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"model": args.model, "entry": args.entry, "k": args.many, "steps": args.steps, "results": results}, f, indent=1)
        return
    results = []
    for r in range(args.rounds):
        for label, threshold in (("split", split_at), ("one submit", 10**9)):
            engine.SPLIT_SUBMIT_MIN = threshold
            m = cls()
            for _ in range(3):  # pipelines, warm-up
                m.step(**batch)
            ts = []
            for _ in range(args.steps):
                t = time.perf_counter()
                m.step(**batch)
                ts.append(time.perf_counter() - t)
            n = len(m._engine.entries["train"]["dispatches"])
            m.close()
            row = {"round": r, "submits": label, "dispatches": n, "step_ms_median": round(statistics.median(ts) * 1e3, 3)}
            print(json.dumps(row), flush=True)
            results.append(row)
    engine.SPLIT_SUBMIT_MIN = split_at
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "steps": args.steps, "results": results}, f, indent=1)


def many_rounds(cls, engine, batch, args):
    """step_many(K) calls with the ramp on (MANY_RAMP_MIN 0) and off, alternating per round."""
    ramp_at, k = engine.MANY_RAMP_MIN, args.many
    entry = args.entry
    method = "step_many" if entry == "train" else "step_many_" + entry[len("train_") :]
    stacked = {n: np.stack([v] * k) for n, v in batch.items()}
    results = []
    for r in range(args.rounds):
        for label, threshold in (("ramp", 0), ("one chunk", 10**9)):
            engine.MANY_RAMP_MIN = threshold
            m = cls()
            run = getattr(m, method)
            for _ in range(2):  # pipelines, warm-up
                run(**stacked)
            ts, host = [], []
            for _ in range(args.steps):
                t = time.perf_counter()
                run(**stacked)
                ts.append(time.perf_counter() - t)
                host.append(m._engine.last_timing[0])
            n = len(m._engine.entries[entry]["dispatches"])
            m.close()
            row = {
                "round": r,
                "chunks": label,
                "dispatches": n,
                "steps_per_s": round(k / statistics.median(ts), 2),
                "host_ms_per_step": round(statistics.median(host) * 1e3 / k, 4),
            }
            print(json.dumps(row), flush=True)
            results.append(row)
    engine.MANY_RAMP_MIN = ramp_at
    return results


if __name__ == "__main__":
    main()
