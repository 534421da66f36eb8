"""tensorgrad's mnist-cnn sample: two conv/ReLU/max-pool stages and an MLP head.

[B, 1, 28, 28] -> Conv2d(1, 16, 3, pad 1) -> ReLU -> max_pool 2 -> Conv2d(16, 32, 3, pad 1)
-> ReLU -> max_pool 2 -> flatten (32 * 7 * 7 = 1568) -> Linear(1568, 64) -> ReLU -> Linear(64, 10);
105,866 params. B = 64, cross-entropy, AdamW lr 1e-3, weight decay 0.01, clip 1.0.

Unlike tensorgrad's forward, which reshapes to the hard-coded [64, -1] and so cannot be traced at
its own eval batch of 256, the flatten here takes the batch from the input, so `predict`
(softmax probabilities) is compiled for B = 1 and B = 256.

Data: scikit-learn's 8x8 digits brought to 28x28 by examples/data.py (fixed train/test split).
"""

import sys
from pathlib import Path

import numpy as np

import aot
from aot import nn, ops

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/: the shared data loaders
import data  # noqa: E402  (examples/data.py)

B, EVAL_B = 64, 256


class CNN(aot.Module):
    def __init__(self):
        super().__init__()
        # Kaiming init (PyTorch-style scale for ReLU nets) everywhere: with tensorgrad's default
        # randn(0.02) the signal shrinks ~10x per layer and the first hundred steps barely move
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1, init=aot.init.kaiming())
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, init=aot.init.kaiming())
        self.fc1 = nn.Linear(32 * 7 * 7, 64, init=aot.init.kaiming())
        self.fc2 = nn.Linear(64, 10, init=aot.init.kaiming(1.0))

    def forward(self, x):
        h = ops.max_pool2d(ops.relu(self.conv1(x)), 2)  # [N, 16, 14, 14]
        h = ops.max_pool2d(ops.relu(self.conv2(h)), 2)  # [N, 32, 7, 7]
        h = ops.reshape(h, (x.shape[0], -1))  # batch-agnostic flatten: [N, 1568]
        return self.fc2(ops.relu(self.fc1(h)))


def predict(m, x):
    return ops.softmax(m(x), -1)


def loss(m, x, labels):
    return ops.cross_entropy(m(x), labels)


program = aot.Program(
    "mnist_cnn",
    model=CNN,
    train=aot.Train(
        loss,
        inputs={"x": aot.f32(B, 1, 28, 28), "labels": aot.i32(B)},
        optimizer=aot.optim.AdamW(lr=1e-3, weight_decay=0.01, clip_grad_norm=1.0),
    ),
    infer={"predict": aot.Infer(predict, inputs={"x": aot.f32("N", 1, 28, 28)})},
    dims={"N": (1, EVAL_B)},
    seed=0,
)


def batch(rng, size=B, split="train"):
    """x f32[size, 1, 28, 28] in [0, 1], labels i32[size]."""
    x, y = data.digit_batch(rng, size, split)
    return {"x": x[:, None], "labels": y}


def accuracy(model, split="test"):
    """Fraction of `split` classified correctly, through predict at B = 256 (last chunk padded)."""
    x, y = data.digits(split)
    hits = 0
    for i in range(0, len(x), EVAL_B):
        chunk = x[i : i + EVAL_B]
        padded = np.zeros((EVAL_B, 1, 28, 28), np.float32)
        padded[: len(chunk), 0] = chunk
        probs = model.predict(x=padded)[: len(chunk)]
        hits += int((probs.argmax(-1) == y[i : i + EVAL_B]).sum())
    return hits / len(x)


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    with aot.compile(program) as model:
        for step in range(1, 301):
            value = model.step(**batch(rng))
            if step % 50 == 0:
                print(f"step {step}: loss {value:.4f}, test accuracy {accuracy(model):.3f}")
