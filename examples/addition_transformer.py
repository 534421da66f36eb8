"""tensorgrad's transformer sample: 2-digit addition with a 3-block pre-LayerNorm transformer.

Sequence (T = 8 inputs of the 9 tokens): a_tens a_ones + b_tens b_ones = s_ones s_tens s_hundreds,
so the sum is written little-endian. The model predicts token t+1 from tokens <= t; only the
3 result digits count in the loss. About 20% of the (a, b) pairs are held out for testing:
((100a + b) * 31 + 7) % 5 == 0.
"""

import numpy as np

import aot
from aot import nn, ops

VOCAB, D, LAYERS, HEADS, MLP_DIM, T, B = 12, 64, 3, 4, 256, 8, 128
PLUS, EQUALS = 10, 11


class Block(aot.Module):
    def __init__(self, d=D, heads=HEADS, mlp=MLP_DIM):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, mlp)
        self.fc2 = nn.Linear(mlp, d)

    def forward(self, x):
        h = self.ln1(x)
        q, k, v = (nn.split_heads(f(h), self.heads) for f in (self.q, self.k, self.v))
        att = ops.attention(q, k, v, causal=True)  # softmax(q k^T / sqrt(dh), causal) v, fused
        x = x + self.o(nn.merge_heads(att))
        return x + self.fc2(ops.relu(self.fc1(self.ln2(x))))


class Transformer(aot.Module):
    def __init__(self, vocab=VOCAB, d=D, layers=LAYERS, heads=HEADS, mlp=MLP_DIM, t=T):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = self.param((t + 1, d))
        self.blocks = [Block(d, heads, mlp) for _ in range(layers)]
        self.ln_f = nn.LayerNorm(d)

    def forward(self, tokens):
        t = tokens.shape[-1]
        x = self.tok_emb(tokens) + ops.narrow(self.pos_emb, 0, 0, t)
        for blk in self.blocks:
            x = blk(x)
        # tied output head: logits = ln_f(x) @ tok_emb^T
        return self.ln_f(x) @ ops.transpose(self.tok_emb.W, (1, 0))


def logits(m, tokens):
    return m(tokens)


def loss(m, tokens, targets, mask):
    ce = ops.cross_entropy(m(tokens), targets, reduction="none")
    # mean over the 3 result digits of each sequence (tensorgrad: sum(CE * mask) / (B * 3))
    return ops.sum(ce * mask) * (1.0 / (tokens.shape[0] * 3))


# the web page's data and display (addition_transformer.demo.js: sums of held-out pairs it gets right)
DEMO = {"demo": "addition_transformer.demo.js"}


def make_program(
    name="addition_transformer", vocab=VOCAB, d=D, layers=LAYERS, heads=HEADS, mlp=MLP_DIM, t=T, b=B,
    web=DEMO,
):
    """The sample's program; other sizes give the larger benchmark configuration (web=None:
    the demo page's data assume the sample's T = 8)."""
    return aot.Program(
        name,
        model=lambda: Transformer(vocab, d, layers, heads, mlp, t),
        train=aot.Train(
            loss,
            inputs={"tokens": aot.i32(b, t), "targets": aot.i32(b, t), "mask": aot.f32(b, t)},
            optimizer=aot.optim.AdamW(lr=aot.lr.linear(5e-3, 5e-4, 1500), weight_decay=0.01, clip_grad_norm=1.0),
        ),
        infer={"predict": aot.Infer(logits, inputs={"tokens": aot.i32("N", t)})},
        dims={"N": (1, b)},
        seed=0,
        web=web,
    )


program = make_program()


# ---- data (plain NumPy; used by the training script, tests and benchmarks) ----

LOSS_MASK = np.array([0, 0, 0, 0, 0, 1, 1, 1], dtype=np.float32)


def held_out(a, b):
    return ((100 * a + b) * 31 + 7) % 5 == 0


def encode(a, b):
    """The 9-token sequence for a + b."""
    s = a + b
    return [a // 10, a % 10, PLUS, b // 10, b % 10, EQUALS, s % 10, (s // 10) % 10, s // 100]


def pairs(test=False):
    return [(a, b) for a in range(100) for b in range(100) if held_out(a, b) == test]


def batch(rng, size=B, test=False):
    """tokens [size, T] i32, targets [size, T] i32 (next tokens), mask [size, T] f32."""
    ps = pairs(test)
    pick = rng.integers(0, len(ps), size)
    seqs = np.array([encode(*ps[i]) for i in pick], dtype=np.int32)
    return {"tokens": seqs[:, :T], "targets": seqs[:, 1:], "mask": np.tile(LOSS_MASK, (size, 1))}


def accuracy(predict, rng, n=100, test=True):
    """Greedy 3-step decoding of the sum; predict(tokens[1, T]) -> logits[1, T, VOCAB]."""
    ps = pairs(test)
    hits = 0
    for i in rng.integers(0, len(ps), n):
        seq = encode(*ps[i])
        tokens = np.zeros((1, T), dtype=np.int32)
        tokens[0, :6] = seq[:6]
        for pos in range(5, 8):
            nxt = int(np.argmax(predict(tokens)[0, pos]))
            if pos + 1 < T:
                tokens[0, pos + 1] = nxt
            out = nxt
            if nxt != seq[pos + 1]:
                break
        else:
            hits += 1
    return hits / n
