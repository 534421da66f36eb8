"""Differential fuzzer: random graphs over the public op set, built with aot.compile, run on the
WebGPU adapter and checked against the reference interpreter and float64 PyTorch autograd
(tests/fuzz_graphs.py). Each new failure is shrunk and written as a pytest reproducer.

    python scripts/fuzz.py --minutes 30 [--seed S] [--out tests/fuzz_repros] [--shrink-seconds 240]

Prints a progress line every --every seconds and, at the end, the number of programs and graphs
checked and the failures. Seeds are consecutive from --seed (default: from the clock, printed),
so `--seed S --minutes ...` replays a run, and `fuzz_graphs.generate(S)` gives one seed's batch.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import fuzz_graphs as fg  # noqa: E402

# the order in which one program's failures are shrunk: an exception before a wrong value
PRIORITY = {"compile": 0, "run": 1, "interp-error": 2, "interp": 3, "gpu": 4}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0, help="how long to fuzz (default 5)")
    ap.add_argument("--seed", type=int, default=None, help="first seed (default: from the clock)")
    ap.add_argument("--out", default=str(ROOT / "tests" / "fuzz_repros"), help="where reproducers go (default tests/fuzz_repros)")
    ap.add_argument("--shrink-seconds", type=float, default=240.0, help="time limit for shrinking one failure")
    ap.add_argument("--max-ops", type=int, default=8, help="most ops per random graph (default 8)")
    ap.add_argument("--per-program", type=int, default=2, help="distinct failures shrunk per failing program")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between progress lines")
    args = ap.parse_args(argv)

    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000 * 1000
    first = seed
    print(f"fuzz: seeds from {seed}, {args.minutes:g} minutes, reproducers to {args.out}", flush=True)
    t0 = time.monotonic()
    deadline = t0 + args.minutes * 60
    programs = graphs = ops = failing = harness_errors = 0
    seen: dict[str, Path] = {}
    dupes: dict[str, int] = {}
    last = t0
    while time.monotonic() < deadline:
        try:
            batch = fg.generate(seed, max_ops=args.max_ops)
            fails = fg.check(batch)
        except Exception:  # noqa: BLE001 - a bug of the fuzzer itself: report it and go on
            harness_errors += 1
            print(f"fuzz: seed {seed}: harness error\n{traceback.format_exc()}", flush=True)
            seed += 1
            continue
        programs += 1
        graphs += len(batch.cases)
        ops += sum(len(c.ops) for c in batch.cases)
        if fails:
            failing += 1
            print(f"fuzz: seed {seed}: {len(fails)} disagreement(s); first: {fails[0]}", flush=True)
            groups = {}
            for f in sorted(fails, key=lambda f: PRIORITY.get(f.kind, 9)):
                groups.setdefault((f.family(), f.case), f)
            for f in list(groups.values())[: args.per_program]:
                try:
                    small, sf = fg.shrink(batch, f, args.shrink_seconds)
                    sig = fg.signature(small, sf)
                    if sig in seen:
                        dupes[sig] = dupes.get(sig, 0) + 1
                        print(f"fuzz:   same as {seen[sig].name} ({sig})", flush=True)
                        continue
                    note = f"Found by scripts/fuzz.py at seed {seed} (fuzz_graphs.generate({seed})), then shrunk."
                    path = fg.write_repro(small, sf, args.out, note)
                    seen[sig] = path
                    n_ops = sum(len(c.ops) for c in small.cases)
                    print(f"fuzz:   NEW {sf} -> {n_ops} op(s), {small.steps} step(s): {path}", flush=True)
                except Exception:  # noqa: BLE001
                    harness_errors += 1
                    print(f"fuzz: seed {seed}: shrinking failed\n{traceback.format_exc()}", flush=True)
        seed += 1
        now = time.monotonic()
        if now - last >= args.every:
            last = now
            print(f"fuzz: [{(now - t0) / 60:5.1f} min] {programs} programs, {graphs} graphs ({ops} ops), "
                  f"{failing} failing programs, {len(seen)} distinct failures", flush=True)
    minutes = (time.monotonic() - t0) / 60
    print(f"fuzz: done in {minutes:.1f} min: seeds {first}..{seed - 1}, {programs} programs, {graphs} graphs ({ops} ops), "
          f"{failing} failing programs, {len(seen)} distinct failures, {harness_errors} harness errors", flush=True)
    for sig, path in seen.items():
        print(f"fuzz:   {path}  [{sig}]  (+{dupes.get(sig, 0)} more)", flush=True)
    return 1 if seen else 0


if __name__ == "__main__":
    sys.exit(main())
