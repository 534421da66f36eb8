"""Convolution training steps/s and planned memory for two CNNs, with the aot found under
--aot-root (so one run can time this tree against an older checkout), next to PyTorch eager.

    python scripts/bench_conv.py [--aot-root DIR] [--steps 50] [--out conv.json]

Models (tensorgrad's shapes): mnist_cnn (conv 1->16->32, 3x3 pad 1, pools, B 64, AdamW) and
flow_convs (flow-matching-tiny's four 3x3 convs at 28x28, 32 channels, B 64, Adam, MSE).
Only public aot API is used, so older checkouts build the same programs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def programs(aot):
    from aot import nn, ops

    class MnistCNN(aot.Module):
        def __init__(self):
            super().__init__()
            k = aot.init.kaiming()
            self.c1, self.c2 = nn.Conv2d(1, 16, 3, padding=1, init=k), nn.Conv2d(16, 32, 3, padding=1, init=k)
            self.l1, self.l2 = nn.Linear(1568, 64, init=k), nn.Linear(64, 10)

    def mnist_loss(m, x, y):
        h = ops.max_pool2d(ops.relu(m.c1(x)), 2)
        h = ops.max_pool2d(ops.relu(m.c2(h)), 2)
        return ops.cross_entropy(m.l2(ops.relu(m.l1(ops.reshape(h, (64, 1568))))), y)

    class Flow(aot.Module):
        def __init__(self):
            super().__init__()
            k = aot.init.kaiming()
            self.c1 = nn.Conv2d(1, 32, 3, padding=1, init=k)
            self.c2, self.c3 = nn.Conv2d(32, 32, 3, padding=1, init=k), nn.Conv2d(32, 32, 3, padding=1, init=k)
            self.c4 = nn.Conv2d(32, 1, 3, padding=1)

    def flow_loss(m, x, v):
        h = ops.relu(m.c3(ops.relu(m.c2(ops.relu(m.c1(x))))))
        return ops.mean(ops.square(m.c4(h) - v))

    opt1 = aot.optim.AdamW(lr=1e-3, weight_decay=0.01, clip_grad_norm=1.0)
    opt2 = aot.optim.Adam(lr=2e-4, clip_grad_norm=1.0)
    return {
        "mnist_cnn": (aot.Program("bench_mnist_cnn", model=MnistCNN, train=aot.Train(
            mnist_loss, inputs={"x": aot.f32(64, 1, 28, 28), "y": aot.i32(64)}, optimizer=opt1)),
            lambda rng: {"x": rng.random((64, 1, 28, 28), dtype=np.float32), "y": rng.integers(0, 10, 64).astype(np.int32)}),
        "flow_convs": (aot.Program("bench_flow_convs", model=Flow, train=aot.Train(
            flow_loss, inputs={"x": aot.f32(64, 1, 28, 28), "v": aot.f32(64, 1, 28, 28)}, optimizer=opt2)),
            lambda rng: {"x": rng.standard_normal((64, 1, 28, 28), dtype=np.float32),
                         "v": rng.standard_normal((64, 1, 28, 28), dtype=np.float32)}),
    }


def bench_aot(aot, program, make_batch, steps):
    try:
        from aot.pipeline import build, compile_program
    except ImportError:  # checkouts before the pipeline module got its name
        from aot.build import build, compile_program

    kw = {"max_binding_mib": 2048} if "max_binding_mib" in compile_program.__code__.co_varnames else {}
    c = compile_program(program, **kw)
    path = build(program, tempfile.mkdtemp(), **kw)
    sys.path.insert(0, str(path))
    model = importlib.import_module(program.name).Model()
    rng = np.random.default_rng(0)
    batches = [make_batch(rng) for _ in range(4)]
    for i in range(3):
        model.step(**batches[i % 4])
    ts = []
    for i in range(steps):
        t = time.perf_counter()
        model.step(**batches[i % 4])
        ts.append(time.perf_counter() - t)
    planned = 4 * sum(c.program["arenas"].values())
    out = {"step_ms_median": round(statistics.median(ts) * 1e3, 3), "kernels_per_step": len(c.kernels["train"]),
           "planned_bytes": planned, "adapter": model._engine.adapter_info.get("device", "?")}
    model.close()
    return out


def bench_torch(name, make_batch, steps):
    import torch
    import torch.nn.functional as F

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    if name == "mnist_cnn":
        net = torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                  torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                  torch.nn.Flatten(), torch.nn.Linear(1568, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(dev)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.01)
        loss_fn = lambda b: F.cross_entropy(net(b["x"]), b["y"].long())  # noqa: E731
    else:
        net = torch.nn.Sequential(torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 3, padding=1),
                                  torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU(),
                                  torch.nn.Conv2d(32, 1, 3, padding=1)).to(dev)
        opt = torch.optim.Adam(net.parameters(), lr=2e-4)
        loss_fn = lambda b: ((net(b["x"]) - b["v"]) ** 2).mean()  # noqa: E731
    rng = np.random.default_rng(0)
    batches = [{k: torch.as_tensor(v).to(dev) for k, v in make_batch(rng).items()} for _ in range(4)]

    def step(b):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(b)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        return loss.item()

    for i in range(3):
        step(batches[i % 4])
    ts = []
    for i in range(steps):
        t = time.perf_counter()
        step(batches[i % 4])
        ts.append(time.perf_counter() - t)
    return {"step_ms_median": round(statistics.median(ts) * 1e3, 3), "device": dev}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--aot-root", default=str(Path(__file__).resolve().parent.parent))
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--torch", action="store_true", help="also time PyTorch eager")
    ap.add_argument("--out", default="conv.json")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.aot_root).resolve()))
    aot = importlib.import_module("aot")
    res = {"aot_root": args.aot_root, "models": {}}
    for name, (prog, make_batch) in programs(aot).items():
        r = {"aot": bench_aot(aot, prog, make_batch, args.steps)}
        if args.torch:
            try:
                r["torch_eager"] = bench_torch(name, make_batch, args.steps)
            except ImportError:
                pass
        print(name, json.dumps(r), flush=True)
        res["models"][name] = r
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
