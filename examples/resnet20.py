"""A ResNet-20 (He et al. 2016, the CIFAR variant) with BatchNorm, on 28x28 digits.

- Stem: Conv2d(1, 16, 3, pad 1) -> BatchNorm2d -> ReLU at 28x28.
- Three stages of three BasicBlocks (two 3x3 conv/BN pairs each, ReLU after the sum): 16
  channels at 28x28, 32 at 14x14, 64 at 7x7. The first block of stages 2 and 3 halves the
  resolution with a stride-2 conv; its shortcut is a 1x1 stride-2 conv + BatchNorm (the paper's
  "option B", which torchvision's ResNets use too), the other shortcuts are the identity.
- Global average pool -> Linear(64, 10). 6 * 3 + 2 = 20 weighted layers, ~272k parameters.
- SGD lr 0.1, momentum 0.9, weight decay 5e-4 on the conv and linear weights (not on BatchNorm's
  gains and biases, nor the linear bias), cosine schedule to 0 over `STEPS`; B = 64; the paper's
  recipe with a shorter schedule.
- BatchNorm: batch statistics while training, running statistics (momentum 0.1, unbiased
  running variance, as torch) in `predict`.

Data: scikit-learn's 8x8 digits brought to 28x28 by examples/data.py (fixed train/test split).
`model.state_dict()` gives torch's names and layouts (`layer1.0.bn1.running_mean`,
`linear.weight` as [out, in]), so it loads into examples/resnet20_torch.py's twin unchanged.
"""

import sys
from pathlib import Path

import numpy as np

import aot
from aot import nn, ops

sys.path.insert(0, str(Path(__file__).resolve().parent))  # examples/: the shared data loaders
import data  # noqa: E402  (examples/data.py)

B, EVAL_B, STEPS = 64, 256, 600


def conv3(cin, cout, stride=1):
    # Kaiming-normal fan-in init (gain sqrt 2) for the ReLU net; no bias in front of a BatchNorm
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False, init=aot.init.kaiming())


class BasicBlock(aot.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = conv3(cin, cout, stride)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = conv3(cout, cout)
        self.bn2 = nn.BatchNorm2d(cout)
        # a list, so that the identity shortcut has no parameters and torch's names line up
        self.shortcut = []
        if stride != 1 or cin != cout:
            self.shortcut = [
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False, init=aot.init.kaiming()),
                nn.BatchNorm2d(cout),
            ]

    def forward(self, x):
        h = ops.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        s = x
        for layer in self.shortcut:
            s = layer(s)
        return ops.relu(h + s)


class ResNet20(aot.Module):
    def __init__(self, classes=10, width=16, blocks=3):
        super().__init__()
        self.conv1 = conv3(1, width)
        self.bn1 = nn.BatchNorm2d(width)
        widths = [width, 2 * width, 4 * width]
        cin = width
        for i, w in enumerate(widths):
            stage = [BasicBlock(cin if j == 0 else w, w, 2 if (i > 0 and j == 0) else 1) for j in range(blocks)]
            setattr(self, f"layer{i + 1}", stage)
            cin = w
        self.linear = nn.Linear(4 * width, classes, init=aot.init.kaiming(1.0))

    def forward(self, x):
        h = ops.relu(self.bn1(self.conv1(x)))
        for stage in (self.layer1, self.layer2, self.layer3):
            for block in stage:
                h = block(h)
        return self.linear(ops.mean(h, (2, 3)))  # global average pool: [N, 64]


def loss(m, x, labels):
    return ops.cross_entropy(m(x), labels)


def predict(m, x):
    return ops.softmax(m(x), -1)


def make_program(name="resnet20", b=B, steps=STEPS, width=16, blocks=3):
    return aot.Program(
        name,
        model=lambda: ResNet20(width=width, blocks=blocks),
        train=aot.Train(
            loss,
            inputs={"x": aot.f32(b, 1, 28, 28), "labels": aot.i32(b)},
            # weight decay applies to params whose decay flag is set: the kaiming-initialised conv
            # and linear weights, not BatchNorm's ones/zeros gains and biases nor the linear bias
            optimizer=aot.optim.SGD(lr=aot.lr.cosine(0.1, 0.0, steps), momentum=0.9, weight_decay=5e-4),
        ),
        infer={"predict": aot.Infer(predict, inputs={"x": aot.f32("N", 1, 28, 28)})},
        dims={"N": (1, EVAL_B)},
        seed=0,
    )


program = make_program()


def batch(rng, size=B, split="train"):
    """x f32[size, 1, 28, 28] in [0, 1], labels i32[size]."""
    x, y = data.digit_batch(rng, size, split)
    return {"x": x[:, None], "labels": y}


def accuracy(model, split="test"):
    """Fraction of `split` classified correctly through predict at N = 256 (last chunk padded)."""
    x, y = data.digits(split)
    hits = 0
    for i in range(0, len(x), EVAL_B):
        chunk = x[i : i + EVAL_B]
        padded = np.zeros((EVAL_B, 1, 28, 28), np.float32)
        padded[: len(chunk), 0] = chunk
        probs = model.predict(x=padded)[: len(chunk)]
        hits += int((probs.argmax(-1) == y[i : i + EVAL_B]).sum())
    return hits / len(x)


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    with aot.compile(program) as model:
        for step in range(1, STEPS + 1):
            value = model.step(**batch(rng))
            if step % 100 == 0:
                print(f"step {step}: loss {value:.4f}, test accuracy {accuracy(model):.3f}")
