"""PyTorch models for tests/test_from_torch.py, written from their published architectures.

- GPT (nanoGPT's shape): token + position embeddings, pre-LN blocks with causal self-attention
  through scaled_dot_product_attention, tanh-GELU MLP, final LayerNorm, lm_head tied to the token
  embedding, cross_entropy(ignore_index=-1), AdamW with decay / no-decay parameter groups.
- MinGPT (minGPT's shape): the same block with explicit attention (a registered lower-triangular
  mask buffer, masked_fill with -inf, softmax), a hand-written tanh GELU, no weight tying.
- VAE (pytorch/examples' vae): linear encoder to (mu, logvar), reparameterization, linear
  sigmoid decoder, binary cross-entropy plus the KL term.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class SelfAttention(nn.Module):
    def __init__(self, d, heads, block, explicit=False):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.heads, self.explicit = heads, explicit
        if explicit:
            self.register_buffer("bias", torch.tril(torch.ones(block, block)).view(1, 1, block, block))

    def forward(self, x):
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.explicit:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class NewGELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Block(nn.Module):
    def __init__(self, d, heads, block, explicit):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = SelfAttention(d, heads, block, explicit)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), NewGELU() if explicit else nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab=11, block=8, layers=2, heads=2, d=16, explicit=False, tie=True):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, d), wpe=nn.Embedding(block, d),
            h=nn.ModuleList([Block(d, heads, block, explicit) for _ in range(layers)]), ln_f=nn.LayerNorm(d),
        ))
        self.lm_head = nn.Linear(d, vocab, bias=False)
        if tie:
            self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for blk in self.transformer.h:
            x = blk(x)
        return self.lm_head(self.transformer.ln_f(x))


def gpt_loss(m, idx, targets):
    logits = m(idx)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def gpt_optimizer(m, lr=3e-3, weight_decay=0.1):
    """nanoGPT's configure_optimizers: matrices decay, vectors (biases, norms) do not."""
    params = [p for p in m.parameters() if p.requires_grad]
    return torch.optim.AdamW([
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ], lr=lr, betas=(0.9, 0.95))


class VAE(nn.Module):
    def __init__(self, n=16, hidden=12, latent=4):
        super().__init__()
        self.fc1, self.fc21, self.fc22 = nn.Linear(n, hidden), nn.Linear(hidden, latent), nn.Linear(hidden, latent)
        self.fc3, self.fc4 = nn.Linear(latent, hidden), nn.Linear(hidden, n)

    def encode(self, x):
        h = F.relu(self.fc1(x))
        return self.fc21(h), self.fc22(h)

    def decode(self, z):
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x, eps=None):
        mu, logvar = self.encode(x)
        std = torch.exp(0.5 * logvar)
        z = mu + (torch.randn_like(std) if eps is None else eps) * std
        return self.decode(z), mu, logvar


def vae_loss(m, x, eps=None):
    recon, mu, logvar = m(x, eps)
    bce = F.binary_cross_entropy(recon, x, reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return (bce + kld) / x.shape[0]
