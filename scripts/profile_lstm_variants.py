"""GPU time of the fused LSTM kernels (lstm_seq, lstm_seq_grad) of examples/lstm_lm.py under each
forced GPU-set variant (aot/recurrent_codegen.py GPU_SPLIT_FWD / GPU_SPLIT_BWD: row groups,
columns per load, unroll; None: the one-phase kernel), all in one process on one adapter, then
optionally scripts/bench_models.py of the fastest pair.

    python scripts/profile_lstm_variants.py --outdir DIR [--bench] [--steps 30 --k 20]

Writes DIR/profile_lstm_lm_<tag>_<variant>.json (scripts/profile_kernels.py's records),
DIR/profile_lstm_lm_<tag>_variants.json (the table and the pair chosen) and, with --bench,
DIR/bench_models_<tag>_lstm2.json.
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

# (name, forward split, backward split)
VARIANTS = [
    ("one_phase", None, None),
    ("ks1", (1, 1, 16), (1, 1, 16)),
    ("ks2", (2, 1, 16), (2, 1, 16)),
    ("ks4_v4ks8", (4, 1, 16), (8, 4, 16)),
    ("ks2u32_v4ks4", (2, 1, 32), (4, 4, 16)),
    ("ks4u8_v4ks8u8", (4, 1, 8), (8, 4, 8)),
    ("ks2u8_v4ks16u8", (2, 1, 8), (16, 4, 8)),
    ("ks1u32_ks8", (1, 1, 32), (8, 1, 16)),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--outdir", required=True)
    ap.add_argument("--tag", default="h100")
    ap.add_argument("--only", help="comma-separated variant names")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--k", type=int, default=20)
    args = ap.parse_args()
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    import profile_kernels

    from aot import recurrent_codegen as rc

    rows = []
    for name, fwd, bwd in VARIANTS:
        if args.only and name not in args.only.split(","):
            continue
        rc.GPU_SPLIT_FWD, rc.GPU_SPLIT_BWD = fwd, bwd
        path = out / f"profile_lstm_lm_{args.tag}_{name}.json"
        sys.argv = ["profile_kernels", str(ROOT / "examples/lstm_lm.py"), "--reps", str(args.reps), "--top", "4", "--kernels", "gpu", "--out", str(path)]
        print(f"== {name}: forward {fwd}, backward {bwd}", flush=True)
        try:
            profile_kernels.main()
        except Exception as e:  # a variant that fails to build or run is recorded, the rest still run
            rows.append({"variant": name, "fwd": fwd, "bwd": bwd, "failed": f"{type(e).__name__}: {str(e)[:300]}"})
            print(rows[-1], flush=True)
            continue
        rec = json.loads(path.read_text())
        fam = rec["families"]
        rows.append({"variant": name, "fwd": fwd, "bwd": bwd, "lstm_seq_us": fam.get("lstm_seq", {}).get("us"),
                     "lstm_seq_grad_us": fam.get("lstm_seq_grad", {}).get("us"), "total_us": rec["total_us"], "adapter": rec["adapter"]})
        print(json.dumps(rows[-1]), flush=True)
    ok = [r for r in rows if r.get("lstm_seq_us") and r.get("lstm_seq_grad_us")]
    best_f = min(ok, key=lambda r: r["lstm_seq_us"])
    best_b = min(ok, key=lambda r: r["lstm_seq_grad_us"])
    chosen = {"fwd": best_f["fwd"], "bwd": best_b["bwd"], "from": [best_f["variant"], best_b["variant"]]}
    summary = {"method": "scripts/profile_kernels.py per variant, one process, one adapter", "variants": rows, "chosen": chosen}
    (out / f"profile_lstm_lm_{args.tag}_variants.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("chosen:", json.dumps(chosen), flush=True)
    if args.bench:
        rc.GPU_SPLIT_FWD = tuple(chosen["fwd"]) if chosen["fwd"] else None
        rc.GPU_SPLIT_BWD = tuple(chosen["bwd"]) if chosen["bwd"] else None
        sys.argv = ["bench_models", "--only", "lstm_lm", "--steps", str(args.steps), "--k", str(args.k),
                    "--out", str(out / f"bench_models_{args.tag}_lstm2.json")]
        runpy.run_path(str(ROOT / "scripts/bench_models.py"), run_name="__main__")


if __name__ == "__main__":
    main()
