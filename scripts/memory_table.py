"""Planned GPU memory of every example's training entry point next to tensorgrad 0.4.6's pooled
figure (docs/reference/tensorgrad.md §5.13) and the lower bound any packing must pay:
params + grads + optimizer state + inputs + the largest set of intermediates alive at once.

    python scripts/memory_table.py [--json scripts/results/memory.json]

Needs no GPU: it plans (compile_program) without allocating anything.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aot.pipeline import compile_program  # noqa: E402

# MB (10^6 bytes) of tensorgrad's buffer plan for each sample's training graph (§5.13)
TENSORGRAD_POOLED_MB = {
    "sine_mlp": 0.50, "kan_tiny": 0.39, "nerf_tiny": 2.65, "digit_canvas": 2.00, "mnist_cnn": 18.77,
    "vae": 20.06, "flow_matching_tiny": 44.71, "cartpole": 0.96, "tic_tac_toe": 0.38,
    "addition_transformer": 23.28, "makemore": 13.22, "pokeformer": 9.91,
}


def measure(name: str) -> dict:
    c = compile_program(runpy.run_path(str(ROOT / "examples" / f"{name}.py"))["program"])
    key = next(k for k, g in c.graphs.items() if g.meta.get("kind") == "train")
    p = c.plans[key]
    fixed = sum(n for a, n in p.sizes.items() if not a.startswith("work"))
    planned = 4 * sum(p.sizes.values())
    bound = 4 * (fixed + p.work_peak_live)
    allocated = 4 * sum(c.program["arenas"].values())
    return {
        "sample": name,
        "planned_bytes": planned,
        "lower_bound_bytes": bound,
        "allocated_at_init_bytes": allocated,
        "largest_buffer_bytes": 4 * max(p.sizes.values()),
        "tensorgrad_pooled_bytes": round(TENSORGRAD_POOLED_MB[name] * 1e6) if name in TENSORGRAD_POOLED_MB else None,
        "unpooled_intermediates_bytes": 4 * p.work_unpooled,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("names", nargs="*", help="examples (default: every sample with a tensorgrad figure that exists)")
    args = ap.parse_args()
    names = args.names or [n for n in TENSORGRAD_POOLED_MB if (ROOT / "examples" / f"{n}.py").exists()]
    rows = [measure(n) for n in names]
    print(f"{'sample':22s} {'planned MB':>10s} {'bound MB':>9s} {'ratio':>6s} {'tensorgrad MB':>13s} {'largest buffer MB':>17s}")
    for r in rows:
        tg = r["tensorgrad_pooled_bytes"]
        print(
            f"{r['sample']:22s} {r['planned_bytes'] / 1e6:10.2f} {r['lower_bound_bytes'] / 1e6:9.2f} "
            f"{r['planned_bytes'] / r['lower_bound_bytes']:6.3f} {tg / 1e6 if tg else float('nan'):13.2f} "
            f"{r['largest_buffer_bytes'] / 1e6:17.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
