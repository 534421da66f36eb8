"""tensorgrad's mlp-sin sample: Linear 1 -> 64 -> 64 -> 1 with ReLU, fit y = sin(x) on [-pi, pi]."""

import aot
from aot import nn, ops


class MLP(aot.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.l1 = nn.Linear(1, hidden)
        self.l2 = nn.Linear(hidden, hidden)
        self.l3 = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.l3(ops.relu(self.l2(ops.relu(self.l1(x)))))


def forward(m, x):
    return m(x)


def loss(m, x, y):
    d = forward(m, x) - y
    return ops.mean(d * d)


program = aot.Program(
    "sine_mlp",
    model=lambda: MLP(64),
    train=aot.Train(loss, inputs={"x": aot.f32(256, 1), "y": aot.f32(256, 1)}, optimizer=aot.optim.Adam(lr=5e-3)),
    infer={"predict": aot.Infer(forward, inputs={"x": aot.f32("B", 1)})},
    dims={"B": (1, 256)},
    seed=0,
    web={"demo": "sine_mlp.demo.js"},  # the web page's data and display: it fits sin(x) and plots the fit
)
