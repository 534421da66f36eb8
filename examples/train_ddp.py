"""Data-parallel training of the addition transformer: one process per GPU on torch.distributed
(gloo), each on its share of every batch, gradients averaged between backward and update.

Build the package once (any aot build of examples/addition_transformer.py works; every rank must
use the same one), then launch with torchrun:

    python -m aot build examples/addition_transformer.py -o build/
    torchrun --nproc-per-node 2 examples/train_ddp.py --package build/addition_transformer

    # several machines: the same command on each, HOST:PORT reachable from all of them
    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        --rdzv-id addition examples/train_ddp.py --package build/addition_transformer --ckpt /shared/add.npz

Without torchrun it runs as a single rank. Every step draws one global batch of world x 128
sequences from the same random stream on every rank, and rank r trains on rows [128 r, 128 (r+1)):
N ranks train like one process with an N times larger batch. Rank 0 logs the loss (the mean over
ranks) and writes the checkpoint (--ckpt, every --save-every steps and at the end, atomically);
with --resume every rank restores it first (it must be readable by every rank: a shared folder,
or a copy on each machine). A rank that dies makes the others raise within --timeout seconds.
"""

from __future__ import annotations

import argparse
import importlib
import os
import runpy
import socket
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# the data functions of the example (run as a file: `import addition_transformer` is the package)
DATA = runpy.run_path(str(ROOT / "examples" / "addition_transformer.py"))
B, accuracy, batch = DATA["B"], DATA["accuracy"], DATA["batch"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--package",
        default=str(ROOT / "generated" / "addition_transformer"),
        help="the built project folder (holding the addition_transformer package)",
    )
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--seed", type=int, default=0, help="the data stream's seed (the same on every rank)")
    ap.add_argument("--ckpt", default="addition_ddp.npz")
    ap.add_argument("--save-every", type=int, default=500)
    ap.add_argument("--resume", action="store_true", help="every rank restores --ckpt before training")
    ap.add_argument(
        "--adapter",
        default="auto",
        help="'auto' (this rank's GPU by LOCAL_RANK), 'default' (wgpu's choice), an index or a name",
    )
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a collective waits for a rank")
    ap.add_argument("--log-every", type=int, default=100)
    args = ap.parse_args()

    sys.path.insert(0, os.path.abspath(args.package))
    pkg = importlib.import_module("addition_transformer")
    dist = importlib.import_module("addition_transformer.distributed")  # imports torch; the package alone does not

    if "RANK" in os.environ:  # launched by torchrun
        rank, world = dist.init(timeout_s=args.timeout)
    else:
        rank, world = dist.init(
            timeout_s=args.timeout, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
        )
    adapter = {"auto": dist.local_adapter(), "default": None}.get(args.adapter, args.adapter)
    adapter = int(adapter) if isinstance(adapter, str) and adapter.isdigit() else adapter
    model = pkg.Model(adapter=adapter)
    print(f"rank {rank}/{world}: {model.adapter['name']} ({model.adapter['backend']})", flush=True)
    if args.resume and os.path.exists(args.ckpt):
        dist.restore(model, args.ckpt)  # every rank, then the replica check
    else:
        dist.check_replicas(model)  # the same build and initial parameters everywhere
    reduce = dist.allreduce_mean()

    rows = slice(rank * B, (rank + 1) * B)
    t0, losses = time.perf_counter(), []
    while model.step_count < args.steps:
        # the same global batch on every rank, a function of the step: a resumed run sees the same data
        full = batch(np.random.default_rng([args.seed, model.step_count]), size=world * B)
        losses.append(model.step(**{k: v[rows] for k, v in full.items()}, allreduce=reduce))
        t = model.step_count
        if t % args.log_every == 0 or t == args.steps:
            mean = dist.mean(float(np.mean(losses)))  # over the last steps and the ranks
            if rank == 0:
                rate = len(losses) / (time.perf_counter() - t0)
                print(
                    f"step {t}: loss {mean:.4f}  ({rate:.1f} steps/s, {rate * world * B:.0f} sequences/s)", flush=True
                )
            t0, losses = time.perf_counter(), []
        if t % args.save_every == 0 or t == args.steps:
            dist.save(model, args.ckpt)  # rank 0 writes; everyone waits for it
    if rank == 0:
        acc = accuracy(lambda tokens: model.predict(tokens=tokens), np.random.default_rng(1), n=100, test=True)
        print(f"held-out accuracy: {acc:.2f}; checkpoint {args.ckpt}", flush=True)
    model.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
