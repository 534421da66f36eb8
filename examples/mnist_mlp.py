"""The MNIST-sized MLP of tensorgrad's step benchmark (docs/reference/tensorgrad-bench.md, model c):
Linear 784 -> 256, ReLU, Linear 256 -> 10, cross-entropy, batch 128, Adam lr 1e-3. There is no
MNIST download here: inputs are uniform in [0, 1) and each label is the argmax of a fixed random
linear teacher, so the task is learnable and every run sees the same data."""

import numpy as np

import aot
from aot import nn, ops

BATCH, PIXELS, CLASSES = 128, 784, 10


class MLP(aot.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(PIXELS, 256)
        self.l2 = nn.Linear(256, CLASSES)

    def forward(self, x):
        return self.l2(ops.relu(self.l1(x)))


def forward(m, x):
    return m(x)


def loss(m, x, labels):
    return ops.cross_entropy(m(x), labels)


program = aot.Program(
    "mnist_mlp",
    model=MLP,
    train=aot.Train(
        loss, inputs={"x": aot.f32(BATCH, PIXELS), "labels": aot.i32(BATCH)}, optimizer=aot.optim.Adam(lr=1e-3)
    ),
    infer={"predict": aot.Infer(forward, inputs={"x": aot.f32("B", PIXELS)})},
    dims={"B": (1, BATCH)},
    seed=0,
)

_TEACHER = np.random.default_rng(1234).standard_normal((PIXELS, CLASSES)).astype(np.float32)


def batch(rng, size=BATCH):
    """Inputs and the teacher's labels for them."""
    x = rng.random((size, PIXELS), dtype=np.float32)
    return {"x": x, "labels": np.argmax(x @ _TEACHER, axis=1).astype(np.int32)}
