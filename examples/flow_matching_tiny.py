"""tensorgrad's flow-matching-tiny sample: rectified flow on 28x28 digits, a 4-conv network.

- Data x0: digits scaled to [-1, 1], [B, 1, 28, 28]. Noise x1 = randn([B, 1, 28, 28]) drawn in
  the graph, new every step (captured as "x1", so `step(captures=True)` reads it back).
- Time: t is an integer in 1..100 per image; t_norm = t / 100 is looked up from the table
  input `t_table` (f32[101], t_table[i] = i / 100) with take_along_axis.
- x_t = x0 + t_norm * (x1 - x0); the network predicts the velocity v* = x1 - x0; MSE loss.
- Network: Embedding(101, 32) -> Linear(32, 32) gives a [B, 32, 1, 1] time feature added after
  conv1; Conv2d(1, 32, 3, p 1) -> ReLU, + time, then Conv2d(32, 32, 3, p 1) -> ReLU twice, then
  Conv2d(32, 1, 3, p 1). No U-Net.
- B = 64, Adam lr 2e-4, gradient norm clipped to 1.0.
- Infer entry `velocity` at [1, 1, 28, 28] (with t i32[1]); `sample` integrates it with 25 Euler
  steps from t = 1 (noise) down to 0, t snapped to the nearest of the 100 buckets.

Data: scikit-learn's digits at 28x28 from examples/data.py (`digits`).
"""

import sys
from pathlib import Path

import numpy as np

import aot
from aot import nn, ops

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/: the shared data loaders
import data  # noqa: E402  (examples/data.py)

SIDE, T_STEPS, B, CH, EMB = 28, 100, 64, 32, 32
T_TABLE = (np.arange(T_STEPS + 1) / T_STEPS).astype(np.float32)


class TinyFlow(aot.Module):
    def __init__(self):
        super().__init__()
        self.t_emb = nn.Embedding(T_STEPS + 1, EMB)
        self.t_proj = nn.Linear(EMB, CH)
        self.conv1 = nn.Conv2d(1, CH, 3, padding=1)
        self.conv2 = nn.Conv2d(CH, CH, 3, padding=1)
        self.conv3 = nn.Conv2d(CH, CH, 3, padding=1)
        self.conv4 = nn.Conv2d(CH, 1, 3, padding=1)


def velocity(m, x_t, t):
    """The predicted velocity f32[B, 1, 28, 28] at x_t f32[B, 1, 28, 28], t i32[B] in 0..100."""
    b = x_t.shape[0]
    t_feat = ops.reshape(m.t_proj(m.t_emb(t)), (b, CH, 1, 1))
    h = ops.relu(m.conv1(x_t)) + t_feat
    h = ops.relu(m.conv2(h))
    h = ops.relu(m.conv3(h))
    return m.conv4(h)


def loss(m, x0, t, t_table):
    b = x0.shape[0]
    x1 = aot.capture("x1", ops.randn((b, 1, SIDE, SIDE)))
    t_norm = ops.reshape(ops.take_along_axis(t_table, t, 0), (b, 1, 1, 1))
    v = x1 - x0
    x_t = x0 + t_norm * v
    return ops.mean(ops.square(velocity(m, x_t, t) - v))


def make_program(name="flow_matching_tiny", b=B):
    return aot.Program(
        name,
        model=TinyFlow,
        train=aot.Train(
            loss,
            inputs={"x0": aot.f32(b, 1, SIDE, SIDE), "t": aot.i32(b), "t_table": aot.f32(T_STEPS + 1)},
            optimizer=aot.optim.Adam(lr=2e-4, clip_grad_norm=1.0),
        ),
        infer={"velocity": aot.Infer(velocity, inputs={"x_t": aot.f32(1, 1, SIDE, SIDE), "t": aot.i32(1)})},
        seed=0,
    )


program = make_program()


# ---- data and sampling (NumPy; used by the tests and a training script) ----


def images(split="train"):
    """f32[N, 1, 28, 28] in [-1, 1]."""
    x, _ = data.digits(split)
    return x[:, None] * 2.0 - 1.0


def batch(rng, size=B, split="train"):
    x = images(split)
    return {
        "x0": x[rng.choice(len(x), size, replace=False)],
        "t": rng.integers(1, T_STEPS + 1, size).astype(np.int32),
        "t_table": T_TABLE,
    }


def sample(model, rng, steps=25):
    """One image f32[28, 28]: Euler steps x <- x - dt * v(x, t) from noise at t = 1 to t = 0."""
    x = rng.standard_normal((1, 1, SIDE, SIDE)).astype(np.float32)
    for i in range(steps):
        t = 1.0 - i / steps
        bucket = np.array([int(round(t * T_STEPS))], dtype=np.int32)
        x = x - (1.0 / steps) * model.velocity(x_t=x, t=bucket)
    return x[0, 0]


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    with aot.compile(program) as model:
        for step in range(1, 2001):
            value = model.step(**batch(rng))
            if step % 100 == 0:
                print(f"step {step}  loss {value:.4f}")
        print("sample pixel mean", float(sample(model, rng).mean()))
