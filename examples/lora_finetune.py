"""LoRA fine-tuning (Hu et al. 2021) of a frozen transformer loaded from safetensors.

1. `base_program`: examples/makemore.py's character transformer, pretrained on all names and
   saved with `save_safetensors` (the way a published checkpoint arrives).
2. `program`: the same transformer with every weight frozen (`Module.freeze()`: no gradient, no
   optimizer state, no update) plus rank-`R` adapters on the attention's query and value
   projections: q(x) + (x @ A) @ B * (ALPHA / R), A [D, R] ~ N(0, 0.02), B [R, D] = 0, so the
   adapted model starts exactly as the base. The base weights keep makemore's names, so
   `load_safetensors(path, partial=True)` fills them and leaves the adapters at their init.
3. Fine-tuned on the names that start with `LETTER` only: 6 * 64 * 4 * 3 = 4,608 trainable
   parameters of 150k; the base weights stay bit-identical.
"""

import sys
from pathlib import Path

import numpy as np

import aot
from aot import nn, ops

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/: the model and the data
import makemore  # noqa: E402  (examples/makemore.py)
import names_data  # noqa: E402  (examples/names_data.py)

R, ALPHA, LETTER, STEPS = 4, 8.0, "m", 300
D, HEADS = makemore.D, makemore.HEADS


class LoRA(aot.Module):
    """The low-rank update x @ A @ B * (ALPHA / R); B starts at zero, so the update starts at zero."""

    def __init__(self, dim=D, rank=R):
        super().__init__()
        self.A = self.param((dim, rank))
        self.B = self.param((rank, dim), init=aot.init.zeros(), decay=True)

    def forward(self, x):
        return (x @ self.A) @ self.B * (ALPHA / R)


class LoRAAttention(makemore.Attention):
    """makemore's attention with adapters beside its query and value projections."""

    def __init__(self):
        super().__init__()
        self.q_lora = LoRA()
        self.v_lora = LoRA()

    def forward(self, x):
        q = self.q(x) + self.q_lora(x)
        v = self.v(x) + self.v_lora(x)
        q, k, v = (nn.split_heads(t, HEADS) for t in (q, self.k(x), v))
        return self.o(nn.merge_heads(ops.attention(q, k, v, causal=True)))


class LoRABlock(makemore.Block):
    def __init__(self):
        aot.Module.__init__(self)  # makemore.Block's own __init__ would build a plain Attention
        self.ln1 = nn.LayerNorm(D)
        self.attn = LoRAAttention()
        self.ln2 = nn.LayerNorm(D)
        self.mlp = makemore.MLP()


class LoRATransformer(makemore.Transformer):
    """makemore's transformer, names unchanged, every base weight frozen, the adapters trainable."""

    def __init__(self):
        aot.Module.__init__(self)
        self.tok_emb = self.param((makemore.VOCAB, D))
        self.pos_emb = self.param((makemore.SEQ_LEN, D))
        self.layers = [LoRABlock() for _ in range(makemore.LAYERS)]
        self.lnf = nn.LayerNorm(D)
        self.freeze()
        for block in self.layers:
            block.attn.q_lora.unfreeze()
            block.attn.v_lora.unfreeze()


base_program = makemore.make_program("lora_base")

program = aot.Program(
    "lora_finetune",
    model=LoRATransformer,
    train=aot.Train(
        makemore.loss,
        inputs={"tokens": aot.i32(makemore.B, makemore.T), "targets": aot.i32(makemore.B, makemore.T), "mask": aot.f32(makemore.B, makemore.T)},
        optimizer=aot.optim.AdamW(lr=2e-3, weight_decay=0.0),
    ),
    infer={"predict": aot.Infer(makemore.logits, inputs={"tokens": aot.i32(1, makemore.T)})},
    seed=1,
)


def letter_names(pool, letter=LETTER):
    return [n for n in pool if n.startswith(letter)]


if __name__ == "__main__":
    import tempfile

    rng = np.random.default_rng(0)
    train, _ = names_data.split_names()
    ckpt = Path(tempfile.mkdtemp()) / "base.safetensors"
    with aot.compile(base_program) as base:
        for step in range(1, 501):
            base.step(**makemore.batch(rng, train))
        base.save_safetensors(ckpt)
    pool = letter_names(train)
    with aot.compile(program) as model:
        model.load_safetensors(ckpt, partial=True)
        for step in range(1, STEPS + 1):
            value = model.step(**makemore.batch(rng, pool))
            if step % 50 == 0:
                names = [makemore.sample_name(model, rng) for _ in range(6)]
                print(f"step {step}  loss {value:.3f}  {', '.join(names)}")
