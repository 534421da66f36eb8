"""examples/flow_matching_tiny.py in PyTorch, for the parity test. The noise x1 is an argument
(aot draws it in the graph; the test reads it back with `aot.capture`). Names match aot's:
Linear `W` is `weight.T`, Conv2d and Embedding weights have PyTorch's layout."""

import torch
import torch.nn.functional as F

T_STEPS, CH, EMB = 100, 32, 32


class TinyFlow(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.t_emb = torch.nn.Embedding(T_STEPS + 1, EMB)
        self.t_proj = torch.nn.Linear(EMB, CH)
        self.conv1 = torch.nn.Conv2d(1, CH, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(CH, CH, 3, padding=1)
        self.conv3 = torch.nn.Conv2d(CH, CH, 3, padding=1)
        self.conv4 = torch.nn.Conv2d(CH, 1, 3, padding=1)

    def forward(self, x_t, t):
        t_feat = self.t_proj(self.t_emb(t)).reshape(-1, CH, 1, 1)
        h = F.relu(self.conv1(x_t)) + t_feat
        h = F.relu(self.conv2(h))
        h = F.relu(self.conv3(h))
        return self.conv4(h)


def loss(model, x0, t, t_table, x1):
    t_norm = t_table[t.long()].reshape(-1, 1, 1, 1)
    v = x1 - x0
    x_t = x0 + t_norm * v
    return ((model(x_t, t.long()) - v) ** 2).mean()
