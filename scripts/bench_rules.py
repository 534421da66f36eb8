"""A model's step_many(K) built under variants of the compiler's sizing rules, side by side in
one process (interleaved rounds), so a rule's constant rests on a measured difference.

    python scripts/bench_rules.py examples/resnet20.py --k 20 \\
        --variant base:codegen.FEW_ROWS=0 --variant few_rows: --variant split14:split_rules.SPLIT_SEPARATE_MIN=16384

A variant is NAME:module.ATTR=INT,... (modules of aot; an empty list is the code as it stands).
Each is compiled (aot.compile) with its overrides in place, then restored; every round times
`--calls` step_many(K) calls of every variant (median, steps/s) on one batch of random inputs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time

import numpy as np


def parse(spec: str):
    name, _, sets = spec.partition(":")
    out = []
    for item in filter(None, sets.split(",")):
        target, value = item.split("=")
        mod, attr = target.rsplit(".", 1)
        out.append((importlib.import_module("aot." + mod), attr, int(value)))
    return name, out


def build(prog, overrides):
    import aot

    saved = [(m, a, getattr(m, a)) for m, a, _ in overrides]
    try:
        for m, a, v in overrides:
            setattr(m, a, v)
        return aot.compile(prog)
    finally:
        for m, a, v in saved:
            setattr(m, a, v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--entry", default="train")
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out")
    args = ap.parse_args()
    from aot.cli import load_programs

    prog = next(iter(load_programs(args.model).values()))
    models = {}
    for spec in args.variant:
        name, overrides = parse(spec)
        models[name] = build(prog, overrides)
    first = next(iter(models.values()))
    rng = np.random.default_rng(0)
    batch = {}
    for n, (dtype, shape) in first._program["signatures"][args.entry].items():
        shape = (args.k,) + tuple(d if isinstance(d, int) else 1 for d in shape)
        batch[n] = (
            rng.integers(0, 2, shape).astype(np.int32)
            if dtype == "i32"
            else rng.standard_normal(shape).astype(np.float32)
        )
    method = "step_many" if args.entry == "train" else "step_many_" + args.entry[len("train_") :]
    runs = {name: getattr(m, method) for name, m in models.items()}
    for run in runs.values():
        run(**batch)  # pipelines, warm-up
    rows = []
    for r in range(args.rounds):
        for name, m in models.items():
            runs[name](**batch)
            ts = []
            for _ in range(args.calls):
                t = time.perf_counter()
                runs[name](**batch)
                ts.append(time.perf_counter() - t)
            row = {
                "round": r,
                "variant": name,
                "dispatches": len(m._engine.entries[args.entry]["dispatches"]),
                "steps_per_s": round(args.k / statistics.median(ts), 2),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    for m in models.values():
        m.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"model": args.model, "entry": args.entry, "k": args.k, "variants": args.variant, "results": rows},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
