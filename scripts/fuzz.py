"""Differential fuzzer: random graphs over the public op set, built with aot.compile, run on the
WebGPU adapter (and through the web target's wasm kernel set in node) and checked against the reference interpreter and float64 PyTorch autograd
(tests/fuzz_graphs.py). Each new failure is shrunk and written as a pytest reproducer.

    python scripts/fuzz.py --minutes 30 [--seed S] [--out tests/fuzz_repros] [--shrink-seconds 240]
    python scripts/fuzz.py --minutes 60 --areas all

--areas picks what to fuzz (comma-separated; default "graphs", the random graphs): "special"
(NaN/inf/tiny/huge arguments and cotangents of every unary op and more, PyTorch's NaN/inf pattern
matched), "optim" (optimizer trajectories against torch.optim, step_many, save/restore), "dims"
(symbolic dims in infer and training entries), "noinput" (no inputs, no parameters); "all" is
every area (tests/fuzz_areas.py). Each seed runs every selected area once, in turn.

--sides picks the package sides of the graphs and special areas: "gpu" (aot.compile on this
adapter) and "wasm" (the web target's wasm kernel set, in one node process); both by default,
gpu alone where node is missing.

Prints a progress line every --every seconds and, at the end, the number of programs and graphs
checked and the failures. Seeds are consecutive from --seed (default: from the clock, printed),
so `--seed S --minutes ...` replays a run, and `fuzz_graphs.generate(S)` gives one seed's batch.
Builds skip black (same code, half the build time; --black keeps it).

While others edit aot/ in the same tree, fuzz the last commit instead of a half-edited tree:
    git archive HEAD aot codegen_templates | tar -x -C /tmp/head
    PYTHONPATH=/tmp/head python scripts/fuzz.py --minutes 30
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import fuzz_areas as fa  # noqa: E402
import fuzz_graphs as fg  # noqa: E402

AREAS = ("graphs",) + fa.AREAS

# the order in which one program's failures are shrunk: an exception before a wrong value
PRIORITY = {"compile": 0, "run": 1, "wasm-compile": 0, "wasm-run": 1, "interp-error": 2, "interp": 3, "gpu": 4, "wasm": 4}


def _interrupt(signum, frame):
    """SIGTERM (kill PID) ends a run like Ctrl-C: the summary is still printed."""
    raise KeyboardInterrupt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0, help="how long to fuzz (default 5; 0: just the first seed)")
    ap.add_argument("--seed", type=int, default=None, help="first seed (default: from the clock)")
    ap.add_argument("--out", default=str(ROOT / "tests" / "fuzz_repros"), help="where reproducers go (default tests/fuzz_repros)")
    ap.add_argument("--shrink-seconds", type=float, default=240.0, help="time limit for shrinking one failure")
    ap.add_argument("--max-ops", type=int, default=None, help="most ops per random graph (default: 6, 8 or 12 by seed)")
    ap.add_argument("--per-program", type=int, default=2, help="distinct failures shrunk per failing program")
    ap.add_argument("--per-family", type=int, default=3, help="most reproducers per exception message (kernel and tensor numbers aside)")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between progress lines")
    ap.add_argument("--black", action="store_true", help="format generated packages with black (slower; same code)")
    ap.add_argument("--sides", default=None,
                    help="package sides of the graphs and special areas, comma-separated, of gpu (aot.compile on this adapter) and "
                         "wasm (the web target's wasm kernel set in node); default both, gpu alone without node")
    ap.add_argument("--areas", default="graphs", help=f"comma-separated areas to fuzz, of {', '.join(AREAS)}, or all (default graphs)")
    args = ap.parse_args(argv)
    args.areas = AREAS if args.areas == "all" else tuple(a.strip() for a in args.areas.split(",") if a.strip())
    bad = [a for a in args.areas if a not in AREAS]
    if bad or not args.areas:
        ap.error(f"--areas: unknown {', '.join(bad) or '(none given)'}; choose from {', '.join(AREAS)} or all")
    if args.sides is None:
        args.sides = fg.default_sides()
        if "wasm" not in args.sides:
            print("fuzz: node is not installed: no wasm side (scripts/setup_env.sh installs Debian's nodejs)", flush=True)
    else:
        args.sides = tuple(x.strip() for x in args.sides.split(",") if x.strip())
        bad = [x for x in args.sides if x not in fg.PACKAGE_SIDES]
        if bad or not args.sides:
            ap.error(f"--sides: unknown {', '.join(bad) or '(none given)'}; choose from {', '.join(fg.PACKAGE_SIDES)}")
    signal.signal(signal.SIGTERM, _interrupt)
    if args.black:
        return run(args)
    with fg.unformatted_builds():
        return run(args)


class Run:
    """Counters and the failures found so far."""

    def __init__(self, args):
        self.args = args
        self.programs = self.graphs = self.ops = self.failing = self.harness_errors = 0
        self.seen: dict[str, Path] = {}  # signature -> reproducer
        self.dupes: dict[str, int] = {}
        self.family_more: dict[str, int] = {}
        # the areas of tests/fuzz_areas.py: counts and failures per area
        self.counts = {a: fa.AreaResult() for a in fa.AREAS}
        self.area_failing = {a: 0 for a in fa.AREAS}
        self.area_found: list[str] = []  # "area seed: failure" lines

    def area_one(self, area: str, seed: int):
        """One seed of a tests/fuzz_areas.py area; its failures written as reproducers."""
        try:
            res, case = fa.check(area, seed, sides=self.args.sides)
        except Exception:  # noqa: BLE001
            self.harness_errors += 1
            print(f"fuzz: {area} seed {seed}: harness error\n{traceback.format_exc()}", flush=True)
            return
        c = self.counts[area]
        for k in ("programs", "graphs", "ops", "steps", "elements"):
            setattr(c, k, getattr(c, k) + getattr(res, k))
        if not res.failures:
            return
        self.area_failing[area] += 1
        print(f"fuzz: {area} seed {seed}: {len(res.failures)} disagreement(s); first: {res.failures[0]}", flush=True)
        self.area_found += [str(f) for f in res.failures]
        try:
            for path in self.area_repros(area, seed, case, res.failures):
                print(f"fuzz:   NEW {path}", flush=True)
        except Exception:  # noqa: BLE001
            self.harness_errors += 1
            print(f"fuzz: {area} seed {seed}: writing a reproducer failed\n{traceback.format_exc()}", flush=True)

    def area_repros(self, area: str, seed: int, case, failures) -> list[Path]:
        """special: each failing case alone as a standalone reproducer (one per op chain and
        kind); the other areas: a test of the seed (their programs are small by construction)."""
        out = []
        if area == "special":
            for f in failures:
                m = re.search(r"\[(gpu|interp|interp-error|compile|run|wasm|wasm-compile|wasm-run)\] case (\d+): ", f.what)
                if not m:
                    continue
                k = int(m.group(2))
                sig = "special|" + m.group(1) + "|" + "; ".join(op.op + repr(sorted(op.kw.items())) for op in case.cases[k].ops)
                if sig in self.seen:
                    self.dupes[sig] = self.dupes.get(sig, 0) + 1
                    continue
                note = f"Found by scripts/fuzz.py --areas special at seed {seed} (fuzz_areas.generate_special({seed}))."
                path = fa.write_special_repro(case, f, m.group(1), k, self.args.out, note)
                if path is not None:
                    self.seen[sig] = path
                    out.append(path)
            return out
        sig = f"{area}|{re.sub(r'[0-9.e+-]+', 'N', failures[0].what)}"
        if sig in self.seen:
            self.dupes[sig] = self.dupes.get(sig, 0) + 1
            return out
        path = Path(self.args.out) / f"test_fuzz_{area}_{seed}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fa.seed_test_source(area, seed, failures))
        self.seen[sig] = path
        return [path]

    def one(self, seed: int):
        """Check one seed's batch; shrink its new failures into reproducers."""
        try:
            batch = fg.generate(seed, max_ops=self.args.max_ops)
            fails = fg.check(batch, sides=self.args.sides)
        except Exception:  # noqa: BLE001 - a bug of the fuzzer itself: report it and go on
            self.harness_errors += 1
            print(f"fuzz: seed {seed}: harness error\n{traceback.format_exc()}", flush=True)
            return
        self.programs += 1
        self.graphs += len(batch.cases)
        self.ops += sum(len(c.ops) for c in batch.cases)
        if not fails:
            return
        self.failing += 1
        print(f"fuzz: seed {seed}: {len(fails)} disagreement(s); first: {fails[0]}", flush=True)
        groups = {}
        for f in sorted(fails, key=lambda f: PRIORITY.get(f.kind, 9)):
            groups.setdefault((f.family(), f.case), f)
        for f in list(groups.values())[: self.args.per_program]:
            try:
                self.shrink(batch, f, seed)
            except Exception:  # noqa: BLE001
                self.harness_errors += 1
                print(f"fuzz: seed {seed}: shrinking failed\n{traceback.format_exc()}", flush=True)

    def shrink(self, batch, f, seed: int):
        family = f.family()
        # an exception's family is its message: a few reproducers say it all; wrong values
        # ("gpu", "interp") have many causes, told apart by the shrunk graph's signature only
        capped = ":" in family
        if capped and sum(1 for s in self.seen if s.split("|")[0] == family) >= self.args.per_family:
            self.family_more[family] = self.family_more.get(family, 0) + 1
            print(f"fuzz:   {self.args.per_family} reproducers of this family already", flush=True)
            return
        small, sf = fg.shrink(batch, f, self.args.shrink_seconds)
        sig = fg.signature(small, sf)
        if sig in self.seen:
            self.dupes[sig] = self.dupes.get(sig, 0) + 1
            print(f"fuzz:   same as {self.seen[sig].name} ({sig})", flush=True)
            return
        note = f"Found by scripts/fuzz.py at seed {seed} (fuzz_graphs.generate({seed})), then shrunk."
        path = fg.write_repro(small, sf, self.args.out, note)
        self.seen[sig] = path
        n_ops = sum(len(c.ops) for c in small.cases)
        print(f"fuzz:   NEW {sf} -> {n_ops} op(s), {small.steps} step(s): {path}", flush=True)

    def line(self) -> str:
        parts = []
        if "graphs" in self.args.areas:
            parts.append(f"graphs: {self.programs} programs, {self.graphs} graphs ({self.ops} ops), {self.failing} failing programs")
        for a in fa.AREAS:
            if a in self.args.areas:
                c = self.counts[a]
                more = f", {c.elements} elements" if a == "special" else ""
                parts.append(f"{a}: {c.programs} programs, {c.graphs} cases ({c.ops} ops), {c.steps} steps{more}, "
                             f"{self.area_failing[a]} failing")
        return "; ".join(parts) + f"; {len(self.seen)} distinct failures"


def run(args) -> int:
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000 * 1000
    first = seed
    print(f"fuzz: seeds from {seed}, {args.minutes:g} minutes, sides {'+'.join(args.sides)}, reproducers to {args.out}", flush=True)
    t0 = last = time.monotonic()
    deadline = t0 + args.minutes * 60
    r = Run(args)
    try:
        while True:  # at least one seed: --minutes 0 checks (and shrinks) just --seed
            for area in args.areas:
                if area == "graphs":
                    r.one(seed)
                else:
                    r.area_one(area, seed)
            seed += 1
            if time.monotonic() >= deadline:
                break
            if time.monotonic() - last >= args.every:
                last = time.monotonic()
                print(f"fuzz: [{(last - t0) / 60:5.1f} min] {r.line()}", flush=True)
    except KeyboardInterrupt:
        print("fuzz: interrupted", flush=True)
    minutes = (time.monotonic() - t0) / 60
    print(f"fuzz: done in {minutes:.1f} min, seeds {first}..{seed - 1}: {r.line()}, {r.harness_errors} harness errors", flush=True)
    for sig, path in r.seen.items():
        print(f"fuzz:   {path}  [{sig}]  (+{r.dupes.get(sig, 0)} more)", flush=True)
    for family, n in r.family_more.items():
        print(f"fuzz:   {n} more failure(s) of family {family}", flush=True)
    for line in r.area_found[:200]:
        print(f"fuzz:   {line[:600]}", flush=True)
    return 1 if r.seen else 0


if __name__ == "__main__":
    sys.exit(main())
