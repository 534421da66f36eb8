"""The examples written in PyTorch, for the parity tests and the benchmarks.

`from_aot(params)` loads an aot parameter dict (Linear W is [in, out] here, PyTorch's
weight.T), so both sides start from identical values.
"""

import math

import torch
import torch.nn.functional as F


class MLP(torch.nn.Module):
    """sine_mlp: Linear 1 -> 64 -> 64 -> 1 with ReLU."""

    def __init__(self, hidden=64):
        super().__init__()
        self.l1 = torch.nn.Linear(1, hidden)
        self.l2 = torch.nn.Linear(hidden, hidden)
        self.l3 = torch.nn.Linear(hidden, 1)

    def forward(self, x):
        return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))


class Block(torch.nn.Module):
    def __init__(self, d, heads, mlp):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d, eps=1e-5)
        self.q = torch.nn.Linear(d, d, bias=False)
        self.k = torch.nn.Linear(d, d, bias=False)
        self.v = torch.nn.Linear(d, d, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)
        self.ln2 = torch.nn.LayerNorm(d, eps=1e-5)
        self.fc1 = torch.nn.Linear(d, mlp)
        self.fc2 = torch.nn.Linear(mlp, d)

    def forward(self, x):
        b, t, d = x.shape
        h = self.ln1(x)

        def heads(z):
            return z.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        q, k, v = heads(self.q(h)), heads(self.k(h)), heads(self.v(h))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1)
        att = torch.softmax(scores.masked_fill(mask, float("-inf")), -1) @ v
        x = x + self.o(att.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(torch.relu(self.fc1(self.ln2(x))))


class Transformer(torch.nn.Module):
    """addition_transformer: pre-LN blocks, learned positions, tied output head."""

    def __init__(self, vocab=12, d=64, layers=3, heads=4, mlp=256, t=8):
        super().__init__()
        self.tok_emb = torch.nn.Embedding(vocab, d)
        self.pos_emb = torch.nn.Parameter(torch.zeros(t + 1, d))
        self.blocks = torch.nn.ModuleList([Block(d, heads, mlp) for _ in range(layers)])
        self.ln_f = torch.nn.LayerNorm(d, eps=1e-5)

    def forward(self, tokens):
        t = tokens.shape[-1]
        x = self.tok_emb(tokens) + self.pos_emb[:t]
        for blk in self.blocks:
            x = blk(x)
        return self.ln_f(x) @ self.tok_emb.weight.T


def transformer_loss(model, tokens, targets, mask):
    logits = model(tokens)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    return (ce * mask.reshape(-1)).sum() / (tokens.shape[0] * 3)


def aot_name(torch_name: str) -> str:
    """PyTorch parameter name -> aot name (weight -> W, bias -> b, LayerNorm weight -> g)."""
    parts = torch_name.split(".")
    leaf = parts[-1]
    owner = parts[-2] if len(parts) > 1 else ""
    if leaf == "weight":
        leaf = "g" if owner.startswith("ln") else "W"
    elif leaf == "bias":
        leaf = "b"
    return ".".join(parts[:-1] + [leaf])


def from_aot(model: torch.nn.Module, params: dict) -> torch.nn.Module:
    """Copy aot params into a torch model (Linear weights transposed); returns the model."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            v = torch.as_tensor(params[aot_name(name)])
            is_linear_w = name.endswith(".weight") and p.ndim == 2 and not name.startswith("tok_emb")
            p.copy_(v.T if is_linear_w else v)
    return model


def to_aot(model: torch.nn.Module) -> dict:
    """A torch model's parameters as an aot parameter dict (inverse of from_aot)."""
    out = {}
    for name, p in model.named_parameters():
        v = p.detach().cpu().numpy()
        is_linear_w = name.endswith(".weight") and p.ndim == 2 and not name.startswith("tok_emb")
        out[aot_name(name)] = v.T.copy() if is_linear_w else v.copy()
    return out
