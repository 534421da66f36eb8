"""Plot a loss curve saved by scripts/train_sine.py --losses (runs in aot's .venv, which has
matplotlib; the deployed package needs only wgpu + numpy).

    .venv/bin/python scripts/plot_losses.py losses.npy loss_curve.png
"""

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def main():
    src, dst = sys.argv[1], sys.argv[2]
    losses = np.load(src)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(np.arange(1, len(losses) + 1), losses, lw=0.8, label="loss per step")
    w = min(50, len(losses))
    if w > 1:
        smooth = np.convolve(losses, np.ones(w) / w, mode="valid")
        ax.plot(np.arange(w, len(losses) + 1), smooth, lw=1.5, label=f"mean of {w}")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("MSE loss")
    ax.set_title("sine_mlp trained with step_many (aot, WebGPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(dst, dpi=120)
    print(f"loss curve: {dst}")


if __name__ == "__main__":
    main()
