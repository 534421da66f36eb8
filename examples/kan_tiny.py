"""tensorgrad's kan-tiny sample: a Kolmogorov-Arnold network 1 -> 4 -> 1 fitting y = sin(pi x).

Each KANLayer(I, O) puts a learned cubic B-spline on every edge i -> o plus a SiLU residual:
    Y[b, o] = sum_i sum_k C[o, i, k] * B3(u[b, i] - k) + sum_i silu(x[b, i]) * Wres[i, o]
with u = (x + 1) * 7/2 mapping [-1, 1] onto the KNOTS = 8 integer centres 0..7 (grid G = 5,
degree 3 -> G + 3 = 8 basis functions) and B3 the cardinal cubic B-spline, written with
abs and max: B3(t) = ((2 - |t|)+^3 - 4 (1 - |t|)+^3) / 6. C is f32[O, I, 8] (randn 0.1), Wres
f32[I, O] (the default randn 0.02): 72 parameters. B = 256, x ~ U[-1, 1], MSE, Adam lr 0.005.
"""

import numpy as np

import aot
from aot import ops

KNOTS, B = 8, 256
SIZES = (1, 4, 1)


def cubic_bspline(t):
    """The cardinal cubic B-spline centred at 0 (support [-2, 2], peak 2/3 at 0)."""
    a = ops.abs(t)
    outer = ops.maximum(2.0 - a, 0.0)
    inner = ops.maximum(1.0 - a, 0.0)
    return (outer * outer * outer - 4.0 * (inner * inner * inner)) * (1.0 / 6.0)


class KANLayer(aot.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.n_in, self.n_out = n_in, n_out
        self.C = self.param((n_out, n_in, KNOTS), init=aot.init.randn(0.1))
        self.Wres = self.param((n_in, n_out))

    def forward(self, x):
        n = x.shape[0]
        u = (x + 1.0) * ((KNOTS - 1) / 2.0)  # [N, I] in [0, 7] for x in [-1, 1]
        centres = ops.arange(KNOTS, "f32")  # [8]
        basis = cubic_bspline(ops.reshape(u, (n, self.n_in, 1)) - centres)  # [N, I, 8]
        coef = ops.transpose(ops.reshape(self.C, (self.n_out, self.n_in * KNOTS)), (1, 0))  # [I*8, O]
        spline = ops.reshape(basis, (n, self.n_in * KNOTS)) @ coef
        return spline + ops.silu(x) @ self.Wres


class KAN(aot.Module):
    def __init__(self, sizes=SIZES):
        super().__init__()
        self.layers = [KANLayer(a, b) for a, b in zip(sizes[:-1], sizes[1:])]

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def forward(m, x):
    return m(x)


def loss(m, x, y):
    d = m(x) - y
    return ops.mean(d * d)


program = aot.Program(
    "kan_tiny",
    model=KAN,
    train=aot.Train(loss, inputs={"x": aot.f32(B, 1), "y": aot.f32(B, 1)}, optimizer=aot.optim.Adam(lr=5e-3)),
    infer={"predict": aot.Infer(forward, inputs={"x": aot.f32("N", 1)})},
    dims={"N": (1, 200, B)},
    seed=0,
)


def batch(rng, size=B):
    """x f32[size, 1] ~ U[-1, 1], y = sin(pi x)."""
    x = rng.uniform(-1.0, 1.0, (size, 1)).astype(np.float32)
    return {"x": x, "y": np.sin(np.pi * x).astype(np.float32)}


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    with aot.compile(program) as model:
        for step in range(1, 2001):
            value = model.step(**batch(rng))
            if step % 200 == 0:
                print(f"step {step}: loss {value:.5f}")
        xs = np.linspace(-1, 1, 200, dtype=np.float32).reshape(-1, 1)
        err = np.abs(model.predict(x=xs) - np.sin(np.pi * xs)).max()
        print(f"max |f(x) - sin(pi x)| on 200 points: {err:.4f}")
