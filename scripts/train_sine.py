"""Train and use the generated sine_mlp package (needs only the installed wheel: wgpu + numpy).

    python scripts/train_sine.py --steps 1000 [--per-call 50] [--losses losses.npy]
    (run from anywhere but examples/, whose sine_mlp.py is the model source)

Trains through Model.step_many: --per-call batches stacked on a leading axis per call, one
upload and one readback of their losses each. --losses writes every step's loss (.npy) for
scripts/plot_losses.py.
"""

import argparse
import sys
import time

import numpy as np

import sine_mlp


def progress(i, n, loss, t0, width=30):
    done = int(width * i / n)
    rate = i / max(time.perf_counter() - t0, 1e-9)
    sys.stdout.write(f"\r[{'#' * done}{'.' * (width - done)}] {i:5d}/{n}  loss {loss:.5f}  {rate:6.0f} steps/s")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--checkpoint", default="sine_mlp.npz")
    ap.add_argument("--per-call", type=int, default=50, help="steps per step_many call")
    ap.add_argument("--losses", help="write every step's loss here (.npy)")
    args = ap.parse_args()

    model = sine_mlp.Model(seed=0)
    rng = np.random.default_rng(0)
    print(f"sine_mlp: {len(model.param_names)} params on {model._engine.adapter_info.get('device', '?')}")
    t0 = time.perf_counter()
    history = []
    done = 0
    while done < args.steps:
        k = min(args.per_call, args.steps - done)
        x = rng.uniform(-np.pi, np.pi, (k, 256, 1)).astype(np.float32)  # k batches, stacked
        losses = model.step_many(x=x, y=np.sin(x))
        history.extend(float(v) for v in losses)
        done += k
        progress(done, args.steps, history[-1], t0)
    print()
    if args.losses:
        np.save(args.losses, np.asarray(history, dtype=np.float32))
    for i in (1, 10, 100, args.steps):
        if i <= len(history):
            print(f"  step {i:5d}: loss {history[i - 1]:.5f}")

    model.save(args.checkpoint)
    print(f"saved {args.checkpoint} at step {model.step_count}")

    xs = np.linspace(-np.pi, np.pi, 9, dtype=np.float32).reshape(-1, 1)
    ys = np.concatenate([model.predict(x=xs[i : i + 1]) for i in range(len(xs))])
    print("      x    predict    sin(x)")
    for x, y in zip(xs[:, 0], ys[:, 0]):
        print(f"  {x:6.3f}  {y:8.4f}  {np.sin(x):8.4f}")
    err = float(np.max(np.abs(ys[:, 0] - np.sin(xs[:, 0]))))
    print(f"max |predict - sin| on the grid: {err:.4f}")
    model.close()


if __name__ == "__main__":
    main()
