"""tensorgrad's nerf-tiny sample: a 2-D implicit image, (x, y) -> RGB, not a full NeRF.

Target: a 64x64 RGB image drawn procedurally by `target_image()` (a radial gradient with a ring
and a diamond on top; tensorgrad writes the word "tensorgrad" instead, which would need a font).
Coordinates are pixel centres in [-1, 1]^2. The positional encoding runs in the graph: the
frequencies pi * 2^k (k = 0..7) come in as the input `freqs` f32[8], as in tensorgrad, and
sin/cos of the 2 x 8 products give 32 features. Model: Linear(32, 64) -> ReLU -> Linear(64, 64)
-> ReLU -> Linear(64, 64) -> ReLU -> Linear(64, 3) -> sigmoid (10,627 params). B = 1024 random
pixels per step, MSE, Adam lr 1e-3; `render` evaluates the full 4096-pixel grid.
"""

import numpy as np

import aot
from aot import nn, ops

SIDE, L, HIDDEN, B = 64, 8, 64, 1024
FREQS = (np.pi * 2.0 ** np.arange(L)).astype(np.float32)


def pixel_coords(side=SIDE):
    """f32[side*side, 2]: (x, y) of each pixel centre in [-1, 1], row-major (y is the row)."""
    c = (np.arange(side) + 0.5) / side * 2.0 - 1.0
    y, x = np.meshgrid(c, c, indexing="ij")
    return np.stack([x.ravel(), y.ravel()], axis=1).astype(np.float32)


def target_image(side=SIDE):
    """f32[side, side, 3] in [0, 1]: warm-to-blue radial gradient, a red ring, a teal diamond."""
    xy = pixel_coords(side).reshape(side, side, 2)
    x, y = xy[..., 0], xy[..., 1]
    r = np.clip(np.sqrt(x * x + y * y) / np.sqrt(2.0), 0.0, 1.0)[..., None]
    img = (1.0 - r) * np.array([1.0, 0.85, 0.45]) + r * np.array([0.1, 0.15, 0.45])
    ring = np.abs(np.hypot(x + 0.3, y + 0.25) - 0.45) < 0.08
    img[ring] = (0.85, 0.15, 0.2)
    diamond = np.abs(x - 0.4) + np.abs(y - 0.35) < 0.3
    img[diamond] = (0.1, 0.7, 0.65)
    return img.astype(np.float32)


class Field(aot.Module):
    def __init__(self, hidden=HIDDEN):
        super().__init__()
        # Kaiming init (std sqrt(2 / fan_in)) for the ReLU layers: with tensorgrad's default
        # randn(0.02) each layer shrinks the signal ~10x and the field starts out flat grey
        self.l1 = nn.Linear(4 * L, hidden, init=aot.init.kaiming())
        self.l2 = nn.Linear(hidden, hidden, init=aot.init.kaiming())
        self.l3 = nn.Linear(hidden, hidden, init=aot.init.kaiming())
        self.l4 = nn.Linear(hidden, 3, init=aot.init.kaiming(1.0))

    def forward(self, coords, freqs):
        n = coords.shape[0]
        z = ops.reshape(ops.reshape(coords, (n, 2, 1)) * freqs, (n, 2 * L))  # [N, 16]: x*f_k, then y*f_k
        h = ops.concat([ops.sin(z), ops.cos(z)], -1)  # [N, 32]
        h = ops.relu(self.l1(h))
        h = ops.relu(self.l2(h))
        h = ops.relu(self.l3(h))
        return ops.sigmoid(self.l4(h))


def forward(m, coords, freqs):
    return m(coords, freqs)


def loss(m, coords, freqs, rgb):
    d = m(coords, freqs) - rgb
    return ops.mean(d * d)


program = aot.Program(
    "nerf_tiny",
    model=Field,
    train=aot.Train(
        loss,
        inputs={"coords": aot.f32(B, 2), "freqs": aot.f32(L), "rgb": aot.f32(B, 3)},
        optimizer=aot.optim.Adam(lr=1e-3),
    ),
    infer={"predict": aot.Infer(forward, inputs={"coords": aot.f32("N", 2), "freqs": aot.f32(L)})},
    dims={"N": (1, SIDE * SIDE)},
    seed=0,
)


def batch(rng, size=B):
    """B random pixels (with replacement): coords f32[size, 2], freqs f32[8], rgb f32[size, 3]."""
    coords, rgb = pixel_coords(), target_image().reshape(-1, 3)
    pick = rng.integers(0, len(coords), size)
    return {"coords": coords[pick], "freqs": FREQS, "rgb": rgb[pick]}


def render(model):
    """The model's image f32[64, 64, 3] (one predict call on the full grid)."""
    return model.predict(coords=pixel_coords(), freqs=FREQS).reshape(SIDE, SIDE, 3)


def psnr(img, target):
    return float(10.0 * np.log10(1.0 / np.mean((img - target) ** 2)))


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    target = target_image()
    with aot.compile(program) as model:
        for step in range(1, 2001):
            value = model.step(**batch(rng))
            if step % 200 == 0:
                print(f"step {step}: loss {value:.5f}, PSNR of the full render {psnr(render(model), target):.1f} dB")
