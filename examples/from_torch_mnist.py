"""pytorch/examples' MNIST CNN, written in PyTorch, compiled by aot (`aot.from_torch`).

    python -m aot build examples/from_torch_mnist.py      # needs torch at build time only

The package trains with `model.step(x=images, y=labels)` (x f32[64, 1, 28, 28], y i32[64]) and
predicts class log-probabilities with `model.predict(x=...)` (1 or 64 images) on any WebGPU
adapter, without torch; `model.state_dict()` loads into `Net` with `load_state_dict`, and
`model.load_state_dict(net.state_dict())` starts from a torch checkpoint. The optimizer is the
example's: Adadelta(lr=1.0) with StepLR(gamma=0.7) once an epoch (938 steps of 64 images).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import aot


class Net(nn.Module):
    """pytorch/examples mnist/main.py's Net; `width` scales the channels (1.0: the original)."""

    def __init__(self, width: float = 1.0, image: int = 28):
        super().__init__()
        c1, c2, hidden = int(32 * width), int(64 * width), int(128 * width)
        self.conv1 = nn.Conv2d(1, c1, 3, 1)
        self.conv2 = nn.Conv2d(c1, c2, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(c2 * ((image - 4) // 2) ** 2, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def loss(net, x, y):
    return F.nll_loss(net(x), y)


def predict(net, x):
    return net(x)


def make_program(width=1.0, image=28, batch=64, lr=1.0, name="from_torch_mnist", seed=1):
    torch.manual_seed(seed)
    net = Net(width, image)
    opt = torch.optim.Adadelta(net.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=60000 // batch + 1, gamma=0.7)  # an epoch
    return aot.from_torch(
        net, loss, {"x": aot.f32(batch, 1, image, image), "y": aot.i32(batch)}, opt, scheduler=sched,
        infer={"predict": (predict, {"x": aot.f32("B", 1, image, image)})}, dims={"B": (1, batch)}, name=name,
    ), net


program, _ = make_program()
