"""tensorgrad's makemore sample: a character-level transformer that invents first names.

- Vocabulary 27: '.' = 0 is BOS, EOS and padding, 'a'..'z' = 1..26. A name is written
  '.' + name + '.' + padding into SEQ_LEN = 17 slots; tokens are slots 0..15 (T = 16), targets
  slots 1..16. B = 32.
- The transformer of the addition sample: D 64, 3 pre-LayerNorm blocks with 4 heads (Q, K, V, O
  without bias, scores scaled by 1/sqrt(16), causal softmax) and a ReLU MLP of 4D = 256, learned
  positions `pos_emb` [17, 64] looked up for positions 0..15, final LayerNorm, output head tied to
  `tok_emb` (logits = lnf(x) @ tok_emb^T).
- Loss: sum(CE * mask) where the mask marks the valid positions (BOS -> first letter through last
  letter -> EOS) and is normalized to sum to 1 over the batch: the mean over valid tokens.
- AdamW, lr linear 5e-3 -> 5e-4 over 1500 steps, weight decay 0.01, gradient norm clipped to 1.0.
- Infer entries: `predict` (tokens [1, 16] -> logits [1, 16, 27]) for sampling on the CPU
  (softmax at temperature 1), and `val_loss` (the loss function itself at [32, 16]) for the
  held-out names.

Data: the census first names of the `names` package (examples/names_data.py), split 90/10 by
makemore's stable string hash.
"""

import math
import sys
from pathlib import Path

import numpy as np

import aot
from aot import nn, ops

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/: the shared data loaders
import names_data  # noqa: E402  (examples/names_data.py)

VOCAB, D, LAYERS, HEADS, SEQ_LEN, B = 27, 64, 3, 4, 17, 32
T = SEQ_LEN - 1
PAD = 0  # '.': BOS, EOS and padding


class Attention(aot.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(D, D, bias=False)
        self.k = nn.Linear(D, D, bias=False)
        self.v = nn.Linear(D, D, bias=False)
        self.o = nn.Linear(D, D, bias=False)

    def forward(self, x):
        q, k, v = (nn.split_heads(f(x), HEADS) for f in (self.q, self.k, self.v))
        scores = (q @ ops.swapaxes(k, -1, -2)) * (1.0 / math.sqrt(D // HEADS))
        return self.o(nn.merge_heads(ops.softmax_causal(scores) @ v))


class MLP(aot.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(D, 4 * D)
        self.down = nn.Linear(4 * D, D)

    def forward(self, x):
        return self.down(ops.relu(self.up(x)))


class Block(aot.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D)
        self.attn = Attention()
        self.ln2 = nn.LayerNorm(D)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Transformer(aot.Module):
    def __init__(self):
        super().__init__()
        self.tok_emb = self.param((VOCAB, D))
        self.pos_emb = self.param((SEQ_LEN, D))
        self.layers = [Block() for _ in range(LAYERS)]
        self.lnf = nn.LayerNorm(D)

    def forward(self, tokens):
        x = ops.embedding(self.tok_emb, tokens) + ops.embedding(self.pos_emb, ops.arange(tokens.shape[-1]))
        for block in self.layers:
            x = block(x)
        return self.lnf(x) @ ops.transpose(self.tok_emb, (1, 0))  # tied output head


def logits(m, tokens):
    return m(tokens)


def loss(m, tokens, targets, mask):
    return ops.sum(ops.cross_entropy(m(tokens), targets, reduction="none") * mask)


def make_program(name="makemore", b=B):
    batch_inputs = {"tokens": aot.i32(b, T), "targets": aot.i32(b, T), "mask": aot.f32(b, T)}
    return aot.Program(
        name,
        model=Transformer,
        train=aot.Train(
            loss,
            inputs=batch_inputs,
            optimizer=aot.optim.AdamW(lr=aot.lr.linear(5e-3, 5e-4, 1500), weight_decay=0.01, clip_grad_norm=1.0),
        ),
        infer={
            "predict": aot.Infer(logits, inputs={"tokens": aot.i32(1, T)}),
            "val_loss": aot.Infer(loss, inputs=batch_inputs),
        },
        seed=0,
    )


program = make_program()


# ---- data and sampling (NumPy; used by the tests and a training script) ----


def encode(name):
    """The SEQ_LEN slots '.' + name + '.' + padding (names longer than 15 letters are cut)."""
    seq = np.full(SEQ_LEN, PAD, dtype=np.int32)
    codes = [ord(c) - ord("a") + 1 for c in name[: SEQ_LEN - 1]]
    seq[1 : 1 + len(codes)] = codes
    return seq


def batch(rng, pool, size=B):
    """tokens, targets i32[size, T]; mask f32[size, T] over the valid positions, summing to 1."""
    picks = [pool[i] for i in rng.integers(0, len(pool), size)]
    seqs = np.stack([encode(n) for n in picks])
    last = np.array([min(len(n), T - 1) for n in picks])  # the position that predicts EOS
    mask = (np.arange(T)[None, :] <= last[:, None]).astype(np.float32)
    return {"tokens": seqs[:, :T], "targets": seqs[:, 1:], "mask": mask / mask.sum()}


def decode(codes):
    out = []
    for c in codes:
        if c == PAD:
            break
        out.append(chr(ord("a") + int(c) - 1))
    return "".join(out)


def sample_name(model, rng, temperature=1.0):
    """Letters drawn one at a time from softmax(logits / temperature) until '.' or 15 letters."""
    tokens = np.full((1, T), PAD, dtype=np.int32)
    for pos in range(T - 1):
        z = model.predict(tokens=tokens)[0, pos].astype(np.float64) / temperature
        p = np.exp(z - z.max())
        nxt = int(rng.choice(VOCAB, p=p / p.sum()))
        if nxt == PAD:
            break
        tokens[0, pos + 1] = nxt
    return decode(tokens[0, 1:])


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    train, test = names_data.split_names()
    with aot.compile(program) as model:
        for step in range(1, 1501):
            value = model.step(**batch(rng, train))
            if step % 100 == 0:
                val = float(model.val_loss(**batch(rng, test)))
                names = [sample_name(model, rng) for _ in range(8)]
                print(f"step {step}  loss {value:.3f}  val {val:.3f}  {', '.join(names)}")
