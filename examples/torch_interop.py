"""Train in PyTorch, run (and keep training) in the generated package, and go back.

    python examples/torch_interop.py            # trains in PyTorch, compiles, compares predict
    python -m aot build examples/torch_interop.py    # the package alone

The aot model declares the same modules under the same names as the PyTorch one (`fc1`,
`ln`, `fc2`), so `model.load_state_dict(net.state_dict())` maps PyTorch's names and layouts
to aot's (Linear's `weight` is transposed into `W`, LayerNorm's `weight` becomes `g`) from
the table the compiler wrote into the package; `model.state_dict()` is the way back.
Models whose module names differ take `rename=` (a function, or a dict of prefix rewrites).
"""

import numpy as np

import aot
from aot import nn, ops

B = 64  # training batch


class Classifier(aot.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 32)
        self.ln = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 2)

    def forward(self, x):
        return self.fc2(ops.gelu(self.ln(self.fc1(x))))


def loss(m, x, y):
    return ops.cross_entropy(m(x), y)


def predict(m, x):
    return m(x)


program = aot.Program(
    "torch_interop",
    model=Classifier,
    train=aot.Train(loss, inputs={"x": aot.f32(B, 2), "y": aot.i32(B)}, optimizer=aot.optim.AdamW(lr=1e-2)),
    infer={"predict": aot.Infer(predict, inputs={"x": aot.f32("N", 2)})},
    dims={"N": (1, B)},
)


def moons(rng, n):
    """Two interleaved half circles with noise: x f32[n, 2], y i32[n] (which moon)."""
    y = rng.integers(0, 2, n)
    t = rng.uniform(0, np.pi, n)
    x = np.stack([np.cos(t) + y, np.sin(t) * (1 - 2 * y) + 0.5 * y], 1) + rng.normal(0, 0.1, (n, 2))
    return x.astype(np.float32), y.astype(np.int32)


def torch_classifier():
    import torch
    import torch.nn.functional as F

    class TorchClassifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(2, 32)
            self.ln = torch.nn.LayerNorm(32)
            self.fc2 = torch.nn.Linear(32, 2)

        def forward(self, x):
            return self.fc2(F.gelu(self.ln(self.fc1(x))))

    return TorchClassifier()


def main(torch_steps=200, aot_steps=50, seed=0, log=print):
    """Returns (max |predict - torch| after loading, the same after fine-tuning and loading back)."""
    import torch
    import torch.nn.functional as F

    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    net = torch_classifier()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    for _ in range(torch_steps):
        x, y = moons(rng, B)
        l = F.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y).long())
        opt.zero_grad()
        l.backward()
        opt.step()
    log(f"PyTorch: {torch_steps} steps, loss {l.item():.4f}")

    model = aot.compile(program)
    model.load_state_dict(net.state_dict())  # weight -> W (transposed), bias -> b, LayerNorm weight -> g
    xq, yq = moons(rng, B)
    with torch.no_grad():
        want = net(torch.from_numpy(xq)).numpy()
    got = model.predict(x=xq)
    err_in = float(np.abs(got - want).max())
    log(f"aot predict vs PyTorch after load_state_dict: max |diff| {err_in:.2e}, accuracy {np.mean(got.argmax(1) == yq):.2f}")

    # keep training in the package, then hand the weights back to PyTorch
    for _ in range(aot_steps):
        model.step(**dict(zip(("x", "y"), moons(rng, B))))
    back = torch_classifier()
    back.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})
    with torch.no_grad():
        err_out = float(np.abs(back(torch.from_numpy(xq)).numpy() - model.predict(x=xq)).max())
    log(f"after {aot_steps} aot steps, PyTorch with model.state_dict(): max |diff| {err_out:.2e}")
    model.close()
    return err_in, err_out


if __name__ == "__main__":
    e_in, e_out = main()
    assert e_in < 1e-4 and e_out < 1e-4, (e_in, e_out)
