"""examples/makemore.py in PyTorch, for the parity test. Names match aot's parameter names:
Linear `W` is `weight.T`, LayerNorm `g`/`b` are `weight`/`bias`, `tok_emb`/`pos_emb` are plain
parameters [27, 64] / [17, 64]."""

import math

import torch
import torch.nn.functional as F

VOCAB, D, LAYERS, HEADS, SEQ_LEN = 27, 64, 3, 4, 17


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

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(D // HEADS)
        future = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        att = torch.softmax(scores.masked_fill(future, float("-inf")), -1) @ v
        return self.o(att.transpose(1, 2).reshape(b, t, D))


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(D, 4 * D)
        self.down = torch.nn.Linear(4 * D, D)

    def forward(self, x):
        return self.down(F.relu(self.up(x)))


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(D, eps=1e-5)
        self.attn = Attention()
        self.ln2 = torch.nn.LayerNorm(D, eps=1e-5)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_emb = torch.nn.Parameter(torch.zeros(VOCAB, D))
        self.pos_emb = torch.nn.Parameter(torch.zeros(SEQ_LEN, D))
        self.layers = torch.nn.ModuleList([Block() for _ in range(LAYERS)])
        self.lnf = torch.nn.LayerNorm(D, eps=1e-5)

    def forward(self, tokens):
        x = self.tok_emb[tokens] + self.pos_emb[: tokens.shape[-1]]
        for block in self.layers:
            x = block(x)
        return self.lnf(x) @ self.tok_emb.T


def loss(model, tokens, targets, mask):
    logits = model(tokens.long())
    ce = F.cross_entropy(logits.reshape(-1, VOCAB), targets.long().reshape(-1), reduction="none")
    return (ce * mask.reshape(-1)).sum()
