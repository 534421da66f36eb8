"""A character-level LSTM language model that invents first names (makemore's data, an LSTM for
the transformer).

- Data and batches as examples/makemore.py: vocabulary 27 ('.' = 0 is BOS, EOS and padding),
  names written '.' + name + '.' + padding into SEQ_LEN = 17 slots, tokens slots 0..15 (T = 16),
  targets slots 1..16, the loss sum(CE * mask) with the mask over the valid positions normalized
  to sum to 1 (the mean over valid tokens). B = 32.
- Model: Embedding(27, 32) -> LSTM(32, 128, batch_first=True) -> Linear(128, 27); torch.nn's
  parameter names and layouts (`model.state_dict()` loads into examples/lstm_lm_torch.py's twin).
- Adam, lr 1e-2, gradient norm clipped to 1.0.
- Infer entries: `predict` (tokens [1, 16] -> logits [1, 16, 27]) for sampling, `val_loss`.
"""

import sys
from pathlib import Path

import numpy as np

import aot
from aot import nn, ops

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/: the shared data loaders
import names_data  # noqa: E402  (examples/names_data.py)
from makemore import PAD, SEQ_LEN, T, VOCAB, batch, decode  # noqa: E402,F401  (the same data)

E, H, B = 32, 128, 32


class CharLSTM(aot.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, E)
        self.lstm = nn.LSTM(E, H, batch_first=True)
        self.head = nn.Linear(H, VOCAB)

    def forward(self, tokens):
        out, _ = self.lstm(self.emb(tokens))
        return self.head(out)


def logits(m, tokens):
    return m(tokens)


def loss(m, tokens, targets, mask):
    return ops.sum(ops.cross_entropy(m(tokens), targets, reduction="none") * mask)


def make_program(name="lstm_lm", b=B):
    batch_inputs = {"tokens": aot.i32(b, T), "targets": aot.i32(b, T), "mask": aot.f32(b, T)}
    return aot.Program(
        name,
        model=CharLSTM,
        train=aot.Train(loss, inputs=batch_inputs, optimizer=aot.optim.Adam(lr=1e-2, clip_grad_norm=1.0)),
        infer={
            "predict": aot.Infer(logits, inputs={"tokens": aot.i32(1, T)}),
            "val_loss": aot.Infer(loss, inputs=batch_inputs),
        },
        seed=0,
    )


program = make_program()


def sample_name(model, rng, temperature=1.0):
    """Letters drawn one at a time from softmax(logits / temperature) until '.' or 15 letters
    (the whole prefix is fed again each time: the LSTM is causal, so position pos sees 0..pos)."""
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
        for step in range(1, 1001):
            value = model.step(**batch(rng, train))
            if step % 100 == 0:
                val = float(model.val_loss(**batch(rng, test)))
                names = [sample_name(model, rng) for _ in range(8)]
                print(f"step {step}  loss {value:.3f}  val {val:.3f}  {', '.join(names)}")
