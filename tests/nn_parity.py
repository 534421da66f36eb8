"""Shared by the aot.nn module tests: train a compiled package and its torch.nn twin side by side.

The twin declares the same modules under the same attribute names, so the package's
`load_state_dict` / `state_dict` (torch layout) map every parameter and buffer; the twin's
parameters are randomized first (norm weights start at ones, biases at zeros: every value
should count) and loaded into the package, then both take the same Adam steps.
"""

from __future__ import annotations

import numpy as np

LOSS_RTOL, LOSS_ATOL = 2e-5, 1e-5
PARAM_RTOL, PARAM_ATOL = 2e-4, 2e-5
GRAD_RTOL, GRAD_ATOL = 1e-4, 1e-5


def randomize(torch, tmod, seed: int, scale: float = 0.5):
    """Every float parameter of tmod drawn anew (weights around 1, the rest around 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in tmod.named_parameters():
            base = 1.0 if name.endswith("weight") and p.ndim == 1 else 0.0
            p.copy_(base + scale * torch.randn(p.shape, generator=g))
    return tmod


def to_torch(torch, batch: dict) -> dict:
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}


def torch_grads(tmod) -> dict:
    return {n: p.grad.detach().numpy().copy() for n, p in tmod.named_parameters() if p.grad is not None}


def aot_grads_torch_layout(model) -> dict:
    """model.grads() under torch's names and layouts (the compiler's torch table)."""
    table = model.PROGRAM.get("torch") or {}
    out = {}
    for name, g in model.grads().items():
        tname, _, transposed = table.get(name, (name, "", False))
        out[tname] = g.T if transposed else g
    return out


def train_side_by_side(torch, model, tmod, torch_loss, batches, lr=1e-2, momentum=None, check_grads=True):
    """Load tmod's state into `model`, take len(batches) Adam(lr) steps (SGD(lr, momentum) when
    momentum is given: the model's own optimizer must be the same) on both, and compare the
    per-step losses, the first step's gradients, the captures of the first step against the
    torch loss's second return value (a dict of outputs by capture name), and the final state_dicts."""
    model.reset()
    model.load_state_dict(tmod.state_dict())
    if momentum is None:
        opt = torch.optim.Adam(tmod.parameters(), lr=lr)
    else:
        opt = torch.optim.SGD(tmod.parameters(), lr=lr, momentum=momentum)
    a_losses, t_losses = [], []
    for t, b in enumerate(batches):
        opt.zero_grad()
        tl, touts = torch_loss(tmod, to_torch(torch, b))
        tl.backward()
        res = model.step(**b, captures=True)
        a_losses.append(res.loss)
        t_losses.append(tl.item())
        if t == 0:
            for name, want in (touts or {}).items():
                np.testing.assert_allclose(
                    res.captures[name], want.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=f"forward {name}"
                )
            if check_grads:
                got, want = aot_grads_torch_layout(model), torch_grads(tmod)
                for n in want:
                    np.testing.assert_allclose(got[n], want[n], rtol=GRAD_RTOL, atol=GRAD_ATOL, err_msg=f"grad {n}")
        opt.step()
    np.testing.assert_allclose(a_losses, t_losses, rtol=LOSS_RTOL, atol=LOSS_ATOL, err_msg="per-step losses")
    got = model.state_dict()
    want = {k: v.detach().numpy() for k, v in tmod.state_dict().items()}
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=PARAM_RTOL, atol=PARAM_ATOL, err_msg=f"after steps: {k}")
    return a_losses
