"""examples/pokeformer.py in PyTorch, for the parity test. Names match aot's parameter names:
Linear `W` is `weight.T`, RMSNorm `g` is `weight`, `tok_emb` is a plain parameter [27, 64].
RoPE is Hugging Face Llama's rotate-half form."""

import math

import torch
import torch.nn.functional as F

VOCAB, D, LAYERS, HEADS, FFN = 27, 64, 2, 4, 256


def rope(x, base=10000.0):
    """x [..., T, Dh]: x * cos + rotate_half(x) * sin, angle t / base**(2i / Dh)."""
    t, d = x.shape[-2:]
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    freqs = torch.outer(torch.arange(t, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * emb.cos() + torch.cat([-x2, x1], -1) * emb.sin()


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(D, D, bias=False)
        self.k = torch.nn.Linear(D, D, bias=False)
        self.v = torch.nn.Linear(D, D, bias=False)
        self.o = torch.nn.Linear(D, D, bias=False)

    def forward(self, x):
        b, t, _ = x.shape

        def heads(z):
            return z.view(b, t, HEADS, D // HEADS).transpose(1, 2)

        q, k, v = rope(heads(self.q(x))), rope(heads(self.k(x))), heads(self.v(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(D // HEADS)
        future = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        att = torch.softmax(scores.masked_fill(future, float("-inf")), -1) @ v
        return self.o(att.transpose(1, 2).reshape(b, t, D))


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(D, FFN)
        self.down = torch.nn.Linear(FFN, D)

    def forward(self, x):
        return self.down(F.relu(self.up(x)))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.n1 = torch.nn.RMSNorm(D, eps=1e-6)
        self.attn = Attention()
        self.n2 = torch.nn.RMSNorm(D, eps=1e-6)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


class NameLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_emb = torch.nn.Parameter(torch.zeros(VOCAB, D))
        self.layers = torch.nn.ModuleList([Block() for _ in range(LAYERS)])
        self.nf = torch.nn.RMSNorm(D, eps=1e-6)

    def forward(self, tokens):
        x = self.tok_emb[tokens]
        for block in self.layers:
            x = block(x)
        return self.nf(x) @ self.tok_emb.T


def loss(model, tokens, targets, mask):
    logits = model(tokens.long())
    ce = F.cross_entropy(logits.reshape(-1, VOCAB), targets.long().reshape(-1), reduction="none")
    return (ce * mask.reshape(-1)).sum()
