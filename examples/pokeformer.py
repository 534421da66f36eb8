"""tensorgrad's pokeformer sample: a tiny Llama-style transformer that invents names, sampling
in the graph.

- Vocabulary 27: 'a'..'z' = 0..25 and EOS = 26, which also starts and pads every sequence:
  [EOS, c0, ..., c_{n-1}, EOS, EOS, ...]; tokens are slots 0..15 (T = 16), targets slots 1..16.
  B = 32.
- D 64, 2 blocks, 4 heads, FFN 256 with ReLU. RMSNorm pre-norm (eps 1e-6), RoPE (base 10000) on
  Q and K after splitting heads, no positional embedding, output head tied to `tok_emb`.
- Loss: masked mean cross-entropy, sum(CE * mask) with the mask over the valid positions
  (BOS -> first letter through last letter -> EOS) normalized to sum to 1.
- AdamW, lr linear 5e-3 -> 5e-4 over 1500 steps, weight decay 0.01, gradient norm clipped to 1.0.
- Infer entry `predict` (tokens i32[1, 16], temperature f32[1]) returns
  categorical(logits / temperature) as i32[1, 16]: the next token drawn at every position, new
  draws at every call; `sample_name` feeds it back one position at a time (temperature 0.8).

Data: tensorgrad trains on PokeAPI's species list, which no PyPI package ships (and nothing
is downloaded here), so this port uses the census first names of the `names` package
(examples/names_data.py), cleaned as tensorgrad cleans Pokemon names (a-z, length 2..14),
split 90/10 by makemore's stable string hash.
"""

import math
import sys
from pathlib import Path

import numpy as np

import aot
from aot import nn, ops

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/: the shared data loaders
import names_data  # noqa: E402  (examples/names_data.py)

VOCAB, EOS, T, D, LAYERS, HEADS, FFN, B = 27, 26, 16, 64, 2, 4, 256, 32


class Attention(aot.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(D, D, bias=False)
        self.k = nn.Linear(D, D, bias=False)
        self.v = nn.Linear(D, D, bias=False)
        self.o = nn.Linear(D, D, bias=False)

    def forward(self, x):
        q, k, v = (nn.split_heads(f(x), HEADS) for f in (self.q, self.k, self.v))
        # RoPE rotates Q and K per head, before the scores; V is left alone
        q, k = ops.rope(q), ops.rope(k)
        scores = (q @ ops.swapaxes(k, -1, -2)) * (1.0 / math.sqrt(D // HEADS))
        return self.o(nn.merge_heads(ops.softmax_causal(scores) @ v))


class MLP(aot.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(D, FFN)
        self.down = nn.Linear(FFN, D)

    def forward(self, x):
        return self.down(ops.relu(self.up(x)))


class Block(aot.Module):
    def __init__(self):
        super().__init__()
        self.n1 = nn.RMSNorm(D)
        self.attn = Attention()
        self.n2 = nn.RMSNorm(D)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


class NameLM(aot.Module):
    def __init__(self):
        super().__init__()
        self.tok_emb = self.param((VOCAB, D))
        self.layers = [Block() for _ in range(LAYERS)]
        self.nf = nn.RMSNorm(D)

    def forward(self, tokens):
        x = ops.embedding(self.tok_emb, tokens)
        for block in self.layers:
            x = block(x)
        return self.nf(x) @ ops.transpose(self.tok_emb, (1, 0))  # tied output head


def loss(m, tokens, targets, mask):
    return ops.sum(ops.cross_entropy(m(tokens), targets, reduction="none") * mask)


def predict(m, tokens, temperature):
    """i32[N, T]: a token drawn from softmax(logits / temperature) at every position."""
    return ops.categorical(m(tokens) / temperature)


def make_program(name="pokeformer", b=B):
    return aot.Program(
        name,
        model=NameLM,
        train=aot.Train(
            loss,
            inputs={"tokens": aot.i32(b, T), "targets": aot.i32(b, T), "mask": aot.f32(b, T)},
            optimizer=aot.optim.AdamW(lr=aot.lr.linear(5e-3, 5e-4, 1500), weight_decay=0.01, clip_grad_norm=1.0),
        ),
        infer={"predict": aot.Infer(predict, inputs={"tokens": aot.i32(1, T), "temperature": aot.f32(1)})},
        seed=0,
    )


program = make_program()


# ---- data and sampling (NumPy; used by the tests and a training script) ----


def corpus():
    """(train, test): the names of length 2..T-2 (tensorgrad's cleaning), split 90/10."""
    return names_data.split_names([n for n in names_data.load_names() if 2 <= len(n) <= T - 2])


def encode(name):
    seq = np.full(T + 1, EOS, dtype=np.int32)
    seq[1 : 1 + len(name)] = [ord(c) - ord("a") for c in name]
    return seq


def decode(codes):
    out = []
    for c in codes:
        if not 0 <= c < 26:
            break
        out.append(chr(ord("a") + int(c)))
    return "".join(out)


def batch(rng, pool, size=B):
    """tokens, targets i32[size, T]; mask f32[size, T] over the valid positions, summing to 1."""
    picks = [pool[i] for i in rng.integers(0, len(pool), size)]
    seqs = np.stack([encode(n) for n in picks])
    valid = np.array([min(len(n) + 1, T) for n in picks])  # BOS -> c0 ... c_last -> EOS
    mask = (np.arange(T)[None, :] < valid[:, None]).astype(np.float32)
    return {"tokens": seqs[:, :T], "targets": seqs[:, 1:], "mask": mask / mask.sum()}


def sample_name(model, temperature=0.8):
    """Feeds the in-graph sample at position p - 1 back into slot p until EOS or T - 1 letters."""
    tokens = np.full((1, T), EOS, dtype=np.int32)
    temp = np.array([max(0.05, temperature)], dtype=np.float32)
    for p in range(1, T):
        nxt = int(model.predict(tokens=tokens, temperature=temp)[0, p - 1])
        if not 0 <= nxt < 26:
            break
        tokens[0, p] = nxt
    return decode(tokens[0, 1:])


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    train, test = corpus()
    with aot.compile(program) as model:
        for step in range(1, 1501):
            value = model.step(**batch(rng, train))
            if step % 100 == 0:
                names = [sample_name(model) for _ in range(8)]
                novel = sum(n not in set(train) for n in names)
                print(f"step {step}  loss {value:.3f}  {', '.join(names)}  (novel {novel}/8)")
