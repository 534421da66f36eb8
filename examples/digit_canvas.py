"""tensorgrad's digit-canvas sample: an MNIST MLP 784 -> H -> 10 with ReLU and dropout.

H = 64 (tensorgrad's default; its UI also offers 32, 128, 256), dropout p = 0.1 after the hidden
layer in training only, B = 64, cross-entropy, AdamW lr 1e-3, weight decay 0.01, gradient
clipping at norm 1.0. `predict` returns softmax probabilities and is compiled for B = 1 (the
drawing canvas) and B = 256 (tensorgrad's accuracy probe, EVAL_BATCH).

Data: scikit-learn's 8x8 digits brought to 28x28 by examples/data.py (fixed train/test split),
flattened to 784 features in [0, 1].
"""

import sys
from pathlib import Path

import numpy as np

import aot
from aot import nn, ops

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/: the shared data loaders
import data  # noqa: E402  (examples/data.py)

H, B, EVAL_B, P_DROP = 64, 64, 256, 0.1


class MLP(aot.Module):
    def __init__(self, hidden=H, p=P_DROP):
        super().__init__()
        self.p = p
        # Kaiming init for the ReLU layer keeps PyTorch-like activation scales; tensorgrad's
        # default randn(0.02) also trains here, only more slowly in the first steps
        self.l1 = nn.Linear(784, hidden, init=aot.init.kaiming())
        self.l2 = nn.Linear(hidden, 10, init=aot.init.kaiming(1.0))

    def forward(self, x):
        # dropout is the identity in the Infer graph (and when p = 0)
        return self.l2(ops.dropout(ops.relu(self.l1(x)), self.p))


def predict(m, x):
    return ops.softmax(m(x), -1)


def loss(m, x, labels):
    return ops.cross_entropy(m(x), labels)


def make_program(name="digit_canvas", hidden=H, p=P_DROP):
    """The sample's program; p=0 gives the dropout-free variant the PyTorch parity test uses."""
    return aot.Program(
        name,
        model=lambda: MLP(hidden, p),
        train=aot.Train(
            loss,
            inputs={"x": aot.f32(B, 784), "labels": aot.i32(B)},
            optimizer=aot.optim.AdamW(lr=1e-3, weight_decay=0.01, clip_grad_norm=1.0),
        ),
        infer={"predict": aot.Infer(predict, inputs={"x": aot.f32("N", 784)})},
        dims={"N": (1, EVAL_B)},
        seed=0,
    )


program = make_program()


def batch(rng, size=B, split="train"):
    """x f32[size, 784] in [0, 1], labels i32[size]."""
    x, y = data.digit_batch(rng, size, split)
    return {"x": x.reshape(size, 784), "labels": y}


def accuracy(model, split="test"):
    """Fraction of `split` classified correctly, through predict at B = 256 (last chunk padded)."""
    x, y = data.digits(split)
    x = x.reshape(len(x), 784)
    hits = 0
    for i in range(0, len(x), EVAL_B):
        chunk = x[i : i + EVAL_B]
        padded = np.zeros((EVAL_B, 784), np.float32)
        padded[: len(chunk)] = chunk
        probs = model.predict(x=padded)[: len(chunk)]
        hits += int((probs.argmax(-1) == y[i : i + EVAL_B]).sum())
    return hits / len(x)


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    with aot.compile(program) as model:
        for step in range(1, 1001):
            value = model.step(**batch(rng))
            if step % 100 == 0:
                print(f"step {step}: loss {value:.4f}, test accuracy {accuracy(model):.3f}")
