"""examples/vae.py in PyTorch, for the parity test. The noise eps is an argument (aot draws it
in the graph; the test reads it back with `aot.capture`). Module and parameter names match aot's:
Linear `W` is `weight.T`."""

import torch
import torch.nn.functional as F

INPUT, HIDDEN, LATENT, BETA = 28 * 28, 256, 8, 1.0


class VAE(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.enc1 = torch.nn.Linear(INPUT, HIDDEN)
        self.enc2 = torch.nn.Linear(HIDDEN, HIDDEN)
        self.enc_mu = torch.nn.Linear(HIDDEN, LATENT)
        self.enc_logvar = torch.nn.Linear(HIDDEN, LATENT)
        self.dec1 = torch.nn.Linear(LATENT, HIDDEN)
        self.dec2 = torch.nn.Linear(HIDDEN, HIDDEN)
        self.dec_out = torch.nn.Linear(HIDDEN, INPUT)

    def encode(self, x):
        h = F.relu(self.enc2(F.relu(self.enc1(x))))
        return self.enc_mu(h), self.enc_logvar(h)

    def decode(self, z):
        return torch.sigmoid(self.dec_out(F.relu(self.dec2(F.relu(self.dec1(z))))))


def loss(model, x, eps):
    b = x.shape[0]
    mu, logvar = model.encode(x)
    z = mu + torch.exp(0.5 * logvar) * eps
    recon = ((model.decode(z) - x) ** 2).sum() / b
    kl = (-0.5 * (1 + logvar - mu**2 - logvar.exp())).sum() / b
    return recon + BETA * kl
