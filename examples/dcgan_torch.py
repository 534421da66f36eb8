"""examples/dcgan.py in PyTorch, for the parity test and the benchmark: the same modules under the
same attribute names (the aot package's `state_dict()` loads into it unchanged) and the same
step order: D on real and detached fake, then G with G(z) recomputed."""

import torch
import torch.nn.functional as F
from torch import nn

NZ = 32


class Generator(nn.Module):
    def __init__(self, nz=NZ, ngf=64):
        super().__init__()
        self.deconv1 = nn.ConvTranspose2d(nz, 2 * ngf, 7, bias=False)
        self.bn1 = nn.BatchNorm2d(2 * ngf)
        self.deconv2 = nn.ConvTranspose2d(2 * ngf, ngf, 4, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(ngf)
        self.deconv3 = nn.ConvTranspose2d(ngf, 1, 4, stride=2, padding=1, bias=False)

    def forward(self, z):
        h = F.relu(self.bn1(self.deconv1(z)))
        h = F.relu(self.bn2(self.deconv2(h)))
        return torch.tanh(self.deconv3(h))


class Discriminator(nn.Module):
    def __init__(self, ndf=64):
        super().__init__()
        self.conv1 = nn.Conv2d(1, ndf, 4, stride=2, padding=1, bias=False)
        self.conv2 = nn.Conv2d(ndf, 2 * ndf, 4, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(2 * ndf)
        self.conv3 = nn.Conv2d(2 * ndf, 1, 7, bias=False)

    def forward(self, x):
        h = F.leaky_relu(self.conv1(x), 0.2)
        h = F.leaky_relu(self.bn2(self.conv2(h)), 0.2)
        return torch.sigmoid(self.conv3(h)).view(-1)


class GAN(nn.Module):
    def __init__(self, nz=NZ, ngf=64, ndf=64):
        super().__init__()
        self.G = Generator(nz, ngf)
        self.D = Discriminator(ndf)


def loss_d(m, x, z):
    real_p, fake_p = m.D(x), m.D(m.G(z).detach())
    return F.binary_cross_entropy(real_p, torch.ones_like(real_p)) + F.binary_cross_entropy(fake_p, torch.zeros_like(fake_p))


def loss_g(m, z):
    p = m.D(m.G(z))
    return F.binary_cross_entropy(p, torch.ones_like(p))


def optimizers(m):
    return (torch.optim.Adam(m.D.parameters(), lr=2e-4, betas=(0.5, 0.999)),
            torch.optim.Adam(m.G.parameters(), lr=2e-4, betas=(0.5, 0.999)))


def train_step(m, opt_d, opt_g, x, z):
    """One iteration: a D step then a G step; returns (loss_d, loss_g)."""
    opt_d.zero_grad()
    ld = loss_d(m, x, z)
    ld.backward()
    opt_d.step()
    opt_g.zero_grad()
    lg = loss_g(m, z)
    lg.backward()
    opt_g.step()
    return ld.item(), lg.item()
