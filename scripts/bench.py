"""Benchmark generated packages side by side with PyTorch in the same run; writes JSON.

    python scripts/bench.py [--out bench.json] [--steps 50] [--large] [--quick]

For each model: build time, kernels per training step and per predict, GPU bytes (planned,
one-buffer-per-tensor, and the lower bound params + grads + optimizer state + largest live
activation set), training steps/s, per-step host overhead (the time step() spends outside
waiting for the GPU), predict latency; and the same model in PyTorch (CUDA when available,
else CPU) on identical initial parameters. Ratios are what to read on a shared machine;
absolute times count only from a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import runpy
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from aot.pipeline import build, compile_program  # noqa: E402


def load(name):
    return runpy.run_path(str(ROOT / "examples" / f"{name}.py"))


def memory(c) -> dict:
    arenas = c.program["arenas"]
    planned = 4 * sum(arenas.values())
    fixed = 4 * sum(n for a, n in arenas.items() if not a.startswith("work"))
    return {
        "planned_bytes": planned,
        "unpooled_bytes": fixed + 4 * max(p.work_unpooled for p in c.plans.values()),
        "lower_bound_bytes": fixed + 4 * max(p.work_peak_live for p in c.plans.values()),
        "work_bytes": 4 * arenas["work"],
    }


def timed(fn, n, warmup=3):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return ts


def bench_aot(program, make_batch, predict_inputs, steps, outdir):
    t = time.perf_counter()
    c = compile_program(program)
    path = build(program, outdir)
    build_s = time.perf_counter() - t
    sys.path.insert(0, str(path))
    for name in [m for m in sys.modules if m == program.name or m.startswith(program.name + ".")]:
        del sys.modules[name]  # an example module of the same name may have been imported
    mod = __import__(program.name)
    model = mod.Model()
    rng = np.random.default_rng(0)
    batches = [make_batch(rng) for _ in range(8)]
    host, it = [], iter(range(10**9))

    def step():
        b = batches[next(it) % len(batches)]
        t0 = time.perf_counter()
        model.step(**b)
        host.append(time.perf_counter() - t0 - model._engine.last_timing[1])

    ts = timed(step, steps)
    host = host[-steps:]
    pred = {}
    for label, inputs in predict_inputs.items():
        pt = timed(lambda: model.predict(**inputs), max(steps, 10))
        pred[label] = statistics.median(pt) * 1e3
    out = {
        "build_s": round(build_s, 3),
        "kernels_per_step": len(c.kernels["train"]),
        "kernels_per_predict": {k: len(v) for k, v in c.kernels.items() if k != "train"},
        "memory": memory(c),
        "steps_per_s": round(1 / statistics.median(ts), 2),
        "step_ms_median": round(statistics.median(ts) * 1e3, 3),
        "host_overhead_us_median": round(statistics.median(host) * 1e6, 1),
        "predict_ms_median": {k: round(v, 3) for k, v in pred.items()},
        "adapter": model._engine.adapter_info.get("device", "?"),
    }
    params = model.params()
    model.close()
    return out, params


def bench_torch(kind, params, make_batch, predict_inputs, steps, cfg):
    try:
        import torch

        import torch_reference as tr
    except ImportError:
        return {"skipped": "torch not installed"}
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if kind == "mlp":
        model = tr.from_aot(tr.MLP(), params).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=5e-3)

        def loss_fn(b):
            return ((model(b["x"]) - b["y"]) ** 2).mean()
    else:
        model = tr.from_aot(tr.Transformer(**cfg), params).to(dev)
        decay = [p for n, p in model.named_parameters() if tr.aot_name(n).split(".")[-1] in ("W", "pos_emb")]
        rest = [p for n, p in model.named_parameters() if tr.aot_name(n).split(".")[-1] not in ("W", "pos_emb")]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}], lr=5e-3)

        def loss_fn(b):
            return tr.transformer_loss(model, b["tokens"], b["targets"], b["mask"])

    rng = np.random.default_rng(0)

    def to_dev(b):
        return {k: torch.as_tensor(v).to(dev).long() if v.dtype == np.int32 else torch.as_tensor(v).to(dev) for k, v in b.items()}

    batches = [to_dev(make_batch(rng)) for _ in range(8)]
    it = iter(range(10**9))

    def step():
        b = batches[next(it) % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(b)
        loss.backward()
        if kind != "mlp":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()  # the same readback aot's step() does

    ts = timed(step, steps)
    pred = {}
    with torch.no_grad():
        for label, inputs in predict_inputs.items():
            ins = to_dev(inputs)
            arg = ins["x"] if kind == "mlp" else ins["tokens"]

            def run():
                model(arg).cpu()

            pred[label] = round(statistics.median(timed(run, max(steps, 10))) * 1e3, 3)
    return {
        "device": torch.cuda.get_device_name() if dev == "cuda" else platform.processor() or "cpu",
        "steps_per_s": round(1 / statistics.median(ts), 2),
        "step_ms_median": round(statistics.median(ts) * 1e3, 3),
        "predict_ms_median": pred,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench.json")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--large", action="store_true", help="also the D=512, T=256, 6-block, B=32 transformer")
    ap.add_argument("--only", choices=["sine_mlp", "addition_transformer", "large"], help="run one model")
    ap.add_argument("--outdir", default="/tmp/aot-bench")
    args = ap.parse_args()

    sine = load("sine_mlp")
    addt = load("addition_transformer")

    def sine_batch(rng):
        x = rng.uniform(-np.pi, np.pi, (256, 1)).astype(np.float32)
        return {"x": x, "y": np.sin(x)}

    def tok_batch(b, t, vocab):
        def make(rng):
            seq = rng.integers(0, vocab, (b, t + 1)).astype(np.int32)
            mask = np.zeros((b, t), np.float32)
            mask[:, -3:] = 1
            return {"tokens": seq[:, :t], "targets": seq[:, 1:], "mask": mask}

        return make

    cases = {
        "sine_mlp": (sine["program"], "mlp", sine_batch,
                     {"B=1": {"x": np.zeros((1, 1), np.float32)}, "B=256": {"x": np.zeros((256, 1), np.float32)}}, {}),
        "addition_transformer": (addt["program"], "transformer", addt["batch"],
                                 {"N=1": {"tokens": np.zeros((1, 8), np.int32)}, "N=128": {"tokens": np.zeros((128, 8), np.int32)}},
                                 {}),
    }
    if args.large or args.only == "large":
        cfg = dict(vocab=12, d=512, layers=6, heads=8, mlp=2048, t=256)
        prog = load("transformer_large")["program"]
        cases["large"] = (prog, "transformer", tok_batch(32, 256, 12),
                          {"N=1": {"tokens": np.zeros((1, 256), np.int32)}}, cfg)
    results = {"machine": platform.node(), "python": platform.python_version(), "models": {}}
    for name, (prog, kind, make_batch, pinputs, cfg) in cases.items():
        if args.only and name != args.only:
            continue
        print(f"== {name}", flush=True)
        a, params = bench_aot(prog, make_batch, pinputs, args.steps, args.outdir)
        print(json.dumps(a, indent=1), flush=True)
        t = bench_torch(kind, params, make_batch, pinputs, args.steps, cfg)
        print(json.dumps(t, indent=1), flush=True)
        r = {"aot": a, "torch": t}
        if "steps_per_s" in t:
            r["aot_vs_torch_steps_per_s"] = round(a["steps_per_s"] / t["steps_per_s"], 3)
        results["models"][name] = r
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
