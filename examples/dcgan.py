"""DCGAN (Radford et al. 2016, the pytorch/examples recipe) on 28x28 digits, with two training
entries: `step_d` updates the discriminator, `step_g` the generator, sharing one set of
parameters and BatchNorm statistics in GPU memory (no host copies between the two).

- Generator: z [B, 32, 1, 1] -> ConvTranspose2d(32, 128, 7) -> BN -> ReLU (7x7)
  -> ConvTranspose2d(128, 64, 4, stride 2, pad 1) -> BN -> ReLU (14x14)
  -> ConvTranspose2d(64, 1, 4, stride 2, pad 1) -> tanh (28x28).
- Discriminator: Conv2d(1, 64, 4, 2, 1) -> LeakyReLU 0.2 (14x14) -> Conv2d(64, 128, 4, 2, 1) -> BN
  -> LeakyReLU 0.2 (7x7) -> Conv2d(128, 1, 7) -> sigmoid: the probability that the image is real.
- Convolutions without bias, weights N(0, 0.02) (DCGAN's init: aot's default randn(0.02)),
  BatchNorm gains 1 and biases 0.
- `step_d(x, z)`: BCE(D(x), 1) + BCE(D(G(z)), 0) with G(z) held constant (`stop_gradient`: torch's
  `.detach()`); `step_g(z)`: BCE(D(G(z)), 1). Both Adam(lr 2e-4, betas (0.5, 0.999)), as the paper.
  Each entry recomputes G(z), so G's BatchNorm statistics move in both (examples/dcgan_torch.py
  does the same).
- `generate(z)`: images in [-1, 1] from the running statistics (eval mode).

Data: the digits of examples/data.py scaled to [-1, 1].
"""

import sys
from pathlib import Path

import numpy as np

import aot
from aot import nn, ops

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/: the shared data loaders
import data  # noqa: E402  (examples/data.py)

B, NZ, STEPS = 64, 32, 500


class Generator(aot.Module):
    def __init__(self, nz=NZ, ngf=64):
        super().__init__()
        self.deconv1 = nn.ConvTranspose2d(nz, 2 * ngf, 7, bias=False)
        self.bn1 = nn.BatchNorm2d(2 * ngf)
        self.deconv2 = nn.ConvTranspose2d(2 * ngf, ngf, 4, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(ngf)
        self.deconv3 = nn.ConvTranspose2d(ngf, 1, 4, stride=2, padding=1, bias=False)

    def forward(self, z):
        h = ops.relu(self.bn1(self.deconv1(z)))
        h = ops.relu(self.bn2(self.deconv2(h)))
        return ops.tanh(self.deconv3(h))


class Discriminator(aot.Module):
    def __init__(self, ndf=64):
        super().__init__()
        self.conv1 = nn.Conv2d(1, ndf, 4, stride=2, padding=1, bias=False)
        self.conv2 = nn.Conv2d(ndf, 2 * ndf, 4, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(2 * ndf)
        self.conv3 = nn.Conv2d(2 * ndf, 1, 7, bias=False)

    def forward(self, x):
        h = ops.leaky_relu(self.conv1(x), 0.2)
        h = ops.leaky_relu(self.bn2(self.conv2(h)), 0.2)
        return ops.reshape(ops.sigmoid(self.conv3(h)), (-1,))  # [N]: P(real)


class GAN(aot.Module):
    def __init__(self, nz=NZ, ngf=64, ndf=64):
        super().__init__()
        self.G = Generator(nz, ngf)
        self.D = Discriminator(ndf)


def loss_d(m, x, z):
    fake = ops.stop_gradient(m.G(z))
    real_p, fake_p = m.D(x), m.D(fake)
    return ops.binary_cross_entropy(real_p, ops.ones_like(real_p)) + ops.binary_cross_entropy(fake_p, ops.zeros_like(fake_p))


def loss_g(m, z):
    p = m.D(m.G(z))
    return ops.binary_cross_entropy(p, ops.ones_like(p))


def generate(m, z):
    return m.G(z)


def make_program(name="dcgan", b=B, nz=NZ, ngf=64, ndf=64):
    adam = aot.optim.Adam(lr=2e-4, betas=(0.5, 0.999))
    return aot.Program(
        name,
        model=lambda: GAN(nz, ngf, ndf),
        train={
            "d": aot.Train(loss_d, inputs={"x": aot.f32(b, 1, 28, 28), "z": aot.f32(b, nz, 1, 1)}, optimizer=adam, params="D.*"),
            "g": aot.Train(loss_g, inputs={"z": aot.f32(b, nz, 1, 1)}, optimizer=adam, params="G.*"),
        },
        infer={"generate": aot.Infer(generate, inputs={"z": aot.f32("N", nz, 1, 1)})},
        dims={"N": (1, 16)},
        seed=0,
    )


program = make_program()


def batch(rng, size=B, nz=NZ):
    """x f32[size, 1, 28, 28] in [-1, 1] and z f32[size, nz, 1, 1] ~ N(0, 1)."""
    x, _ = data.digit_batch(rng, size)
    return {"x": x[:, None] * 2.0 - 1.0, "z": rng.standard_normal((size, nz, 1, 1)).astype(np.float32)}


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    with aot.compile(program) as model:
        for step in range(1, STEPS + 1):
            b = batch(rng)
            ld = model.step_d(**b)
            lg = model.step_g(z=b["z"])
            if step % 50 == 0:
                print(f"step {step}: loss D {ld:.3f}  loss G {lg:.3f}")
        img = model.generate(z=rng.standard_normal((16, NZ, 1, 1)).astype(np.float32))
        print("generated", img.shape, f"range [{img.min():.2f}, {img.max():.2f}]")
