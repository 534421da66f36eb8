"""examples/lora_finetune.py in PyTorch, for the parity test: makemore's transformer twin with
the same adapters under the same names (the aot package's `state_dict()` loads into it
unchanged), the base frozen with `requires_grad_(False)`, AdamW over the adapters only."""

import math
import runpy
from pathlib import Path

import torch

twin = runpy.run_path(str(Path(__file__).resolve().parent / "makemore_torch.py"))
D, HEADS, R, ALPHA = twin["D"], twin["HEADS"], 4, 8.0


class LoRA(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.A = torch.nn.Parameter(torch.zeros(D, R))
        self.B = torch.nn.Parameter(torch.zeros(R, D))

    def forward(self, x):
        return (x @ self.A) @ self.B * (ALPHA / R)


class LoRAAttention(twin["Attention"]):
    def __init__(self):
        super().__init__()
        self.q_lora, self.v_lora = LoRA(), LoRA()

    def forward(self, x):
        b, t, _ = x.shape

        def heads(z):
            return z.view(b, t, HEADS, D // HEADS).transpose(1, 2)

        q, k, v = heads(self.q(x) + self.q_lora(x)), heads(self.k(x)), heads(self.v(x) + self.v_lora(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(D // HEADS)
        future = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
        att = torch.softmax(scores.masked_fill(future, float("-inf")), -1) @ v
        return self.o(att.transpose(1, 2).reshape(b, t, D))


class LoRATransformer(twin["Transformer"]):
    def __init__(self):
        super().__init__()
        for block in self.layers:
            block.attn = LoRAAttention()
        for name, p in self.named_parameters():
            p.requires_grad_("_lora." in name)


def optimizer(model):
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3, weight_decay=0.0)


loss = twin["loss"]
