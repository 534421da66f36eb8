"""tensorgrad's vae sample: a variational autoencoder on 28x28 digits.

- Encoder 784 -> 256 -> 256 (ReLU), then two heads: mu and log sigma^2, 8 dims each.
- Decoder 8 -> 256 -> 256 (ReLU) -> 784 -> sigmoid.
- z = mu + exp(0.5 log sigma^2) * eps with eps = randn([B, 8]) drawn in the graph, new every
  step (captured as "eps", so `step(captures=True)` reads it back).
- Loss: pixel-sum squared error / B + beta * KL / B, beta = 1,
  KL = -0.5 * sum(1 + log sigma^2 - mu^2 - exp(log sigma^2)).
- B = 128, Adam lr 1e-3, gradient norm clipped to 1.0.
- Infer entries: `encode` (x [N, 784] -> mu [N, 8]) and `decode` (z [N, 8] -> x_hat [N, 784]),
  N in (1, 9): one image, or a 3x3 grid of samples.

Data: scikit-learn's 8x8 digits brought to 28x28 in [0, 1] by examples/data.py (`digits`),
flattened to 784 pixels. Parameters start from tensorgrad's default init (randn 0.02).
"""

import sys
from pathlib import Path

import numpy as np

import aot
from aot import nn, ops

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/: the shared data loaders
import data  # noqa: E402  (examples/data.py)

INPUT, HIDDEN, LATENT, B, BETA = 28 * 28, 256, 8, 128, 1.0


class VAE(aot.Module):
    def __init__(self):
        super().__init__()
        self.enc1 = nn.Linear(INPUT, HIDDEN)
        self.enc2 = nn.Linear(HIDDEN, HIDDEN)
        self.enc_mu = nn.Linear(HIDDEN, LATENT)
        self.enc_logvar = nn.Linear(HIDDEN, LATENT)
        self.dec1 = nn.Linear(LATENT, HIDDEN)
        self.dec2 = nn.Linear(HIDDEN, HIDDEN)
        self.dec_out = nn.Linear(HIDDEN, INPUT)


def encoder(m, x):
    h = ops.relu(m.enc2(ops.relu(m.enc1(x))))
    return m.enc_mu(h), m.enc_logvar(h)


def decoder(m, z):
    return ops.sigmoid(m.dec_out(ops.relu(m.dec2(ops.relu(m.dec1(z))))))


def loss(m, x):
    b = x.shape[0]
    mu, logvar = encoder(m, x)
    eps = aot.capture("eps", ops.randn((b, LATENT)))
    z = mu + ops.exp(logvar * 0.5) * eps
    recon = ops.sum(ops.square(decoder(m, z) - x)) * (1.0 / b)
    kl = ops.sum((logvar + 1.0 - ops.square(mu) - ops.exp(logvar)) * -0.5) * (1.0 / b)
    return recon + kl * BETA


def encode(m, x):
    return encoder(m, x)[0]


def decode(m, z):
    return decoder(m, z)


def make_program(name="vae", b=B):
    return aot.Program(
        name,
        model=VAE,
        train=aot.Train(loss, inputs={"x": aot.f32(b, INPUT)}, optimizer=aot.optim.Adam(lr=1e-3, clip_grad_norm=1.0)),
        infer={
            "encode": aot.Infer(encode, inputs={"x": aot.f32("N", INPUT)}),
            "decode": aot.Infer(decode, inputs={"z": aot.f32("N", LATENT)}),
        },
        dims={"N": (1, 9)},
        seed=0,
    )


program = make_program()


# ---- data and sampling (NumPy; used by the tests and a training script) ----


def images(split="train"):
    """f32[N, 784] in [0, 1]."""
    x, _ = data.digits(split)
    return np.ascontiguousarray(x.reshape(len(x), INPUT))


def batch(rng, size=B, split="train"):
    return {"x": images(split)[rng.choice(len(images(split)), size, replace=False)]}


def sample_grid(model, rng):
    """A 3x3 grid of decoded N(0, 1) latents: f32[9, 28, 28]."""
    z = rng.standard_normal((9, LATENT)).astype(np.float32)
    return model.decode(z=z).reshape(9, 28, 28)


def interpolate(model, x_a, x_b, n=9):
    """Decoded images along the line between two images' means: f32[n, 28, 28]."""
    mu_a, mu_b = model.encode(x=x_a[None]), model.encode(x=x_b[None])
    return np.concatenate([model.decode(z=(1 - w) * mu_a + w * mu_b) for w in np.linspace(0, 1, n)]).reshape(n, 28, 28)


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    with aot.compile(program) as model:
        for step in range(1, 1001):
            value = model.step(**batch(rng))
            if step % 100 == 0:
                print(f"step {step}  loss {value:.3f}")
        print("grid pixel mean", float(sample_grid(model, rng).mean()))
