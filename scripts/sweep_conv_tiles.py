"""GPU time of every convolution matmul of a model under each of a list of matmul tiles, so
the tile table and its choice for convolutions (a computed, unfolded operand) rest on measured
times.

    python scripts/sweep_conv_tiles.py examples/resnet20.py [--entry train] [--tiles A,B,...]
        [--reps 10] [--out sweep.json]

For each tile (a TILES name or a candidate below; `default` = the build-time choice) the
model is compiled with that tile forced on every matmul with a computed operand (unfold/flip
read inside the matmul) where the tile fits the product's loads (elsewhere the default), and
its entry is profiled with timestamps as scripts/profile_kernels.py does. The JSON lists,
per conv matmul (batch, M, N, K, which operand is computed), its microseconds per tile.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

from aot import codegen, matmul_codegen as mc  # noqa: E402
from aot.errors import CodegenError  # noqa: E402

import profile_kernels as pk  # noqa: E402

# Shapes the tile table lacks: a narrow N (16, 32 or 64 output channels) over a long M.
# (name, BM, BN, BK, TM, TN, S)
CANDIDATES = [
    ("64x16_4x4_k16", 64, 16, 16, 4, 4, 1),
    ("128x16_8x4_k16", 128, 16, 16, 8, 4, 1),
    ("64x16_4x2_k16", 64, 16, 16, 4, 2, 1),
    ("128x16_4x4_k16", 128, 16, 16, 4, 4, 1),
    ("32x16_2x2_k16", 32, 16, 16, 2, 2, 1),
    ("64x32_4x4_k16", 64, 32, 16, 4, 4, 1),
    ("128x32_8x4_k16", 128, 32, 16, 8, 4, 1),
    ("32x32_4x4_k16", 32, 32, 16, 4, 4, 1),
    ("64x32_4x4_s2", 64, 32, 8, 4, 4, 2),
    ("32x64_4x4_k16", 32, 64, 16, 4, 4, 1),
    ("64x64_4x4_k16", 64, 64, 16, 4, 4, 1),
    ("32x64_4x4_s2", 32, 64, 8, 4, 4, 2),
    ("16x64_2x4_s2", 16, 64, 8, 2, 4, 2),
    ("16x32_2x4_s4", 16, 32, 8, 2, 4, 4),
    ("32x16_4x2_s4", 32, 16, 8, 4, 2, 4),
]


def tiles_by_name() -> dict:
    out = dict(mc.TILES_BY_NAME)
    for name, bm, bn, bk, tm, tn, s in CANDIDATES:
        out.setdefault(name, mc.Tile(name, bm, bn, bk, tm, tn, S=s))
    return out


def fits(spec, t) -> bool:
    try:
        mc._check_tile(t)
        mc._loaders(spec, t, False)
    except CodegenError:
        return False
    return True


def compile_forced(path, tile, record):
    """The model compiled with `tile` forced on its conv matmuls; record[name] = spec facts."""
    import aot
    from aot.cli import load_programs

    default = mc.choose_tile.__wrapped__ if hasattr(mc.choose_tile, "__wrapped__") else mc.choose_tile

    def choose(spec):
        conv = bool(spec.a.fn or spec.b.fn)
        return tile if (tile is not None and conv and fits(spec, tile)) else default(spec)

    choose.__wrapped__ = default
    real_render = mc.render_matmul

    def render(spec, name, *a, **kw):
        if spec.a.fn or spec.b.fn:
            t = choose(spec)
            record[name] = {
                "batch": spec.batch,
                "M": spec.M,
                "N": spec.N,
                "K": spec.K,
                "computed": "a" if spec.a.fn else "b" if not spec.b.fn else "ab",
                "computed_ops": ("a" if spec.a.fn else "") + ("b" if spec.b.fn else ""),
                "tile": t.name,
            }
        return real_render(spec, name, *a, **kw)

    mc.choose_tile, codegen.choose_tile, codegen.render_matmul = choose, choose, render
    try:
        progs = load_programs(path)
        return aot.compile(next(iter(progs.values())), kernels="gpu")
    finally:
        mc.choose_tile, codegen.choose_tile, codegen.render_matmul = default, default, real_render


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--entry", default="train")
    ap.add_argument("--tiles", default="default," + ",".join(c[0] for c in CANDIDATES))
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default="sweep.json")
    args = ap.parse_args()
    pk._request_timestamps()
    names = tiles_by_name()
    res = {"model": args.model, "entry": args.entry, "reps": args.reps, "runs": {}, "kernels": {}}
    for tname in args.tiles.split(","):
        t0 = time.perf_counter()
        tile = None if tname == "default" else names[tname]
        record = {}
        model = compile_forced(args.model, tile, record)
        e = model._engine
        key = next(k for k in e.entries if k == args.entry or k.startswith(args.entry + "["))
        packed = {
            "inputs": np.zeros(e.entries[key]["input_sizes"]["inputs"], np.float32),
            "inputs_i32": np.zeros(e.entries[key]["input_sizes"]["inputs_i32"], np.int32),
        }
        e.run(key, packed, False)
        ns = pk.profile_timestamps(e, key, args.reps, "timestamp-query-inside-passes" in set(e.device.features))
        res["adapter"] = e.adapter_info.get("device", "?")
        total = 0.0
        for (kname, _), t in zip(e.entries[key]["dispatches"], ns):
            total += t / 1e3
            if kname in record:
                r = res["kernels"].setdefault(kname, {k: v for k, v in record[kname].items() if k != "tile"} | {"us": {}})
                r["us"][tname] = {"tile": record[kname]["tile"], "us": round(t / 1e3, 2)}
        res["runs"][tname] = {"total_us": round(total, 1), "seconds": round(time.perf_counter() - t0, 1)}
        print(tname, res["runs"][tname], flush=True)
        model.close()
        Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
