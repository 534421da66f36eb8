"""PyTorch twins of the ported tensorgrad samples, for the parity tests (tests/test_samples.py).

Each twin has the same architecture and parameter tree as its aot sample, so `aot_param_map`
pairs every aot parameter name with a torch parameter: a Linear's aot `W` [in, out] is torch's
`weight.T`, a Conv2d's `W` has torch's layout, bare parameters (the KAN's `C` and `Wres`) match
exactly. Each twin's `loss(batch)` takes the sample's batch dict as torch tensors.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# ---- kan_tiny ---------------------------------------------------------------------------------


def cubic_bspline(t):
    a = t.abs()
    return ((2 - a).clamp(min=0) ** 3 - 4 * (1 - a).clamp(min=0) ** 3) / 6


class KANLayer(nn.Module):
    def __init__(self, n_in, n_out, knots=8):
        super().__init__()
        self.knots = knots
        self.C = nn.Parameter(torch.zeros(n_out, n_in, knots))
        self.Wres = nn.Parameter(torch.zeros(n_in, n_out))

    def forward(self, x):
        u = (x + 1) * ((self.knots - 1) / 2)
        basis = cubic_bspline(u[:, :, None] - torch.arange(self.knots, dtype=x.dtype))  # [N, I, 8]
        spline = torch.einsum("nik,oik->no", basis, self.C)
        return spline + F.silu(x) @ self.Wres


class KAN(nn.Module):
    def __init__(self, sizes=(1, 4, 1)):
        super().__init__()
        self.layers = nn.ModuleList([KANLayer(a, b) for a, b in zip(sizes[:-1], sizes[1:])])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def loss(self, b):
        return ((self(b["x"]) - b["y"]) ** 2).mean()


# ---- nerf_tiny --------------------------------------------------------------------------------


class Field(nn.Module):
    def __init__(self, levels=8, hidden=64):
        super().__init__()
        self.l1 = nn.Linear(4 * levels, hidden)
        self.l2 = nn.Linear(hidden, hidden)
        self.l3 = nn.Linear(hidden, hidden)
        self.l4 = nn.Linear(hidden, 3)

    def forward(self, coords, freqs):
        z = (coords[:, :, None] * freqs).reshape(len(coords), -1)
        h = torch.cat([torch.sin(z), torch.cos(z)], -1)
        h = torch.relu(self.l1(h))
        h = torch.relu(self.l2(h))
        h = torch.relu(self.l3(h))
        return torch.sigmoid(self.l4(h))

    def loss(self, b):
        return ((self(b["coords"], b["freqs"]) - b["rgb"]) ** 2).mean()


# ---- digit_canvas -----------------------------------------------------------------------------


class DigitMLP(nn.Module):
    """784 -> hidden -> 10; dropout(p) after the ReLU, or a fixed keep mask passed to loss()."""

    def __init__(self, hidden=64, p=0.0):
        super().__init__()
        self.p = p
        self.l1 = nn.Linear(784, hidden)
        self.l2 = nn.Linear(hidden, 10)

    def forward(self, x):
        return self.l2(F.dropout(torch.relu(self.l1(x)), self.p, self.training))

    def loss(self, b):
        return F.cross_entropy(self(b["x"]), b["labels"].long())


# ---- mnist_cnn --------------------------------------------------------------------------------


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        h = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        h = F.max_pool2d(torch.relu(self.conv2(h)), 2)
        return self.fc2(torch.relu(self.fc1(h.flatten(1))))

    def loss(self, b):
        return F.cross_entropy(self(b["x"]), b["labels"].long())


# ---- cartpole and tic_tac_toe (REINFORCE) ------------------------------------------------------


class Policy(nn.Module):
    """Linear layers with tanh between them: cartpole (4, 16, 2), tic-tac-toe (27, 64, 64, 9)."""

    def __init__(self, sizes):
        super().__init__()
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]), 1):
            setattr(self, f"l{i}", nn.Linear(a, b))
        self.depth = len(sizes) - 1

    def forward(self, states):
        h = states
        for i in range(1, self.depth + 1):
            h = getattr(self, f"l{i}")(h)
            if i < self.depth:
                h = torch.tanh(h)
        return h

    def loss(self, b):
        logp = torch.log_softmax(self(b["states"]), -1).gather(-1, b["actions"].long()[:, None])[:, 0]
        return -(logp * b["returns"] * b["mask"]).sum() / len(b["mask"])


def cartpole():
    return Policy((4, 16, 2))


def tic_tac_toe():
    return Policy((27, 64, 64, 9))


# ---- aot <-> torch parameters -------------------------------------------------------------------


def aot_param_map(module: nn.Module) -> dict:
    """aot parameter name -> (torch parameter, transposed?)."""
    out = {}
    for prefix, mod in module.named_modules():
        p = prefix + "." if prefix else ""
        if isinstance(mod, nn.Linear):
            out[p + "W"] = (mod.weight, True)
            if mod.bias is not None:
                out[p + "b"] = (mod.bias, False)
        elif isinstance(mod, nn.Conv2d):
            out[p + "W"] = (mod.weight, False)
            if mod.bias is not None:
                out[p + "b"] = (mod.bias, False)
        else:
            for name, param in mod.named_parameters(recurse=False):
                out[p + name] = (param, False)
    return out


def load_aot_params(module: nn.Module, params: dict) -> dict:
    """Copy an aot parameter dict into `module` (strict: same names, same shapes); returns the map."""
    pm = aot_param_map(module)
    if set(pm) != set(params):
        raise KeyError(f"parameter names differ: aot {sorted(params)}, torch {sorted(pm)}")
    with torch.no_grad():
        for name, (p, transposed) in pm.items():
            v = np.asarray(params[name], np.float32)
            v = v.T if transposed else v
            if tuple(p.shape) != v.shape:
                raise ValueError(f"{name}: aot {v.shape} vs torch {tuple(p.shape)}")
            p.copy_(torch.from_numpy(np.ascontiguousarray(v)))
    return pm


def as_aot(pm: dict, grads: bool = False) -> dict:
    """The torch side's parameters (or their .grad) as an aot-layout dict of arrays."""
    out = {}
    for name, (p, transposed) in pm.items():
        v = (p.grad if grads else p).detach().numpy()
        out[name] = (v.T if transposed else v).copy()
    return out
