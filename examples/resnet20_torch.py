"""examples/resnet20.py in PyTorch, for the parity test and the benchmark: the same modules under
the same attribute names, so the aot package's `state_dict()` loads into it unchanged."""

import torch
import torch.nn.functional as F
from torch import nn


def conv3(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = conv3(cin, cout, stride)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = conv3(cout, cout)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + self.shortcut(x))


class ResNet20(nn.Module):
    def __init__(self, classes=10, width=16, blocks=3):
        super().__init__()
        self.conv1 = conv3(1, width)
        self.bn1 = nn.BatchNorm2d(width)
        cin, stages = width, []
        for i, w in enumerate([width, 2 * width, 4 * width]):
            stages.append(nn.Sequential(*[BasicBlock(cin if j == 0 else w, w, 2 if (i > 0 and j == 0) else 1) for j in range(blocks)]))
            cin = w
        self.layer1, self.layer2, self.layer3 = stages
        self.linear = nn.Linear(4 * width, classes)

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.layer3(self.layer2(self.layer1(h)))
        return self.linear(h.mean((2, 3)))


def loss(model, x, labels):
    return F.cross_entropy(model(x), labels.long())


def optimizer(model, lr=0.1, steps=600):
    """SGD with momentum and decay on the conv and linear weights only (the aot program's decay flags)."""
    decayed = [p for n, p in model.named_parameters() if n.endswith("weight") and ".bn" not in n and not n.startswith("bn") and "shortcut.1" not in n]
    ids = {id(p) for p in decayed}
    rest = [p for p in model.parameters() if id(p) not in ids]
    opt = torch.optim.SGD([{"params": decayed, "weight_decay": 5e-4}, {"params": rest, "weight_decay": 0.0}], lr=lr, momentum=0.9)
    return opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps, eta_min=0.0)
