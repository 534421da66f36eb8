"""examples/lstm_lm.py in PyTorch, for the parity test and scripts/bench.py. The parameter
names and layouts are aot's torch layout (`model.state_dict()` of the aot package loads here
unchanged; aot's params() differ only in `head.W` = `head.weight.T`)."""

import torch
import torch.nn.functional as F

VOCAB, E, H = 27, 32, 128


class CharLSTM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(VOCAB, E)
        self.lstm = torch.nn.LSTM(E, H, batch_first=True)
        self.head = torch.nn.Linear(H, VOCAB)

    def forward(self, tokens):
        out, _ = self.lstm(self.emb(tokens))
        return self.head(out)


def loss(model, tokens, targets, mask):
    logits = model(tokens.long())
    ce = F.cross_entropy(logits.reshape(-1, VOCAB), targets.long().reshape(-1), reduction="none")
    return (ce * mask.reshape(-1)).sum()


def from_aot(params):
    """A twin holding aot params() (aot names and layouts)."""
    model = CharLSTM()
    sd = {("head.weight" if k == "head.W" else "head.bias" if k == "head.b" else k.replace("emb.W", "emb.weight")): v
          for k, v in params.items()}
    sd["head.weight"] = sd["head.weight"].T
    model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in sd.items()})
    return model
