"""BatchNorm after a convolution, whose product is stored channels-last ([N*H*W, C]) and read as
[N, C, H, W]: the normalization and its backward walk tiles of channels x positions
(codegen.transposed_tile) on the GPU set, the flat order on the CPU set. Channel counts and
spatial sizes that the tiles do not divide (12 channels in tiles of 8) check the edges; the
backward's sums over cells of rows (split_rules.SPLIT_CELLS) of the second (24 channels) run 8
channels a workgroup, in 3 groups (codegen.reduce_lanes). Against torch.nn: forward, gradients, 10 SGD steps with momentum."""

from __future__ import annotations

import numpy as np
import pytest

import aot
from aot import codegen, nn, ops

from nn_parity import randomize, train_side_by_side

pytestmark = pytest.mark.gpu  # needs a WebGPU adapter (lavapipe on CI)
torch = pytest.importorskip("torch")

N, CIN, C, C2, H = 8, 3, 12, 24, 40


class Net(aot.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(CIN, C, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(C)
        self.conv2 = nn.Conv2d(C, C2, 3, padding=1, bias=True)
        self.bn2 = nn.BatchNorm2d(C2)


def outputs(m, x):
    h = ops.relu(m.bn(m.conv(x)))
    return ops.relu(m.bn2(m.conv2(h)))


def loss(m, x, ct):
    y = outputs(m, x)
    aot.capture("y", y)
    return ops.sum(y * ct)


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(CIN, C, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(C)
        self.conv2 = torch.nn.Conv2d(C, C2, 3, padding=1, bias=True)
        self.bn2 = torch.nn.BatchNorm2d(C2)


def torch_loss(t, b):
    h = torch.relu(t.bn(t.conv(b["x"])))
    y = torch.relu(t.bn2(t.conv2(h)))
    return (y * b["ct"]).sum(), {"y": y}


def program(kernels):
    return aot.Program(
        f"bn_layout_{kernels}",
        model=Net,
        train=aot.Train(
            loss, inputs={"x": aot.f32(N, CIN, H, H), "ct": aot.f32(N, C2, H, H)}, optimizer=aot.optim.SGD(lr=1e-2, momentum=0.9)
        ),
        seed=3,
    )


def batches(n):
    r = np.random.default_rng(1)
    out = []
    for _ in range(n):
        x = r.normal(0.3, 1.5, (N, CIN, H, H)).astype(np.float32)
        out.append({"x": x, "ct": (0.01 * r.normal(size=(N, C2, H, H))).astype(np.float32)})
    return out


@pytest.mark.parametrize("kernels", ["gpu", "cpu"])
def test_batchnorm_after_conv_trains_like_torch(kernels):
    tmod = TorchNet()
    randomize(torch, tmod, seed=5)
    with aot.compile(program(kernels), kernels=kernels) as model:
        train_side_by_side(torch, model, tmod, torch_loss, batches(10), lr=1e-2, momentum=0.9)


def test_gpu_set_walks_tiles_where_an_operand_is_channels_last(tmp_path):
    root = aot.build(program("gpu"), tmp_path)
    kernels = sorted((root / "bn_layout_gpu" / "kernels").glob("train_*.wgsl"))
    tiled = [k for k in kernels if "codegen.transposed_tile" in k.read_text()]
    # the forward normalization (both BatchNorms) and the backward's dx of each
    assert len(tiled) >= 4, [k.name for k in kernels]
    assert all("codegen.transposed_tile" not in k.read_text() for k in (root / "bn_layout_gpu" / "kernels" / "cpu").glob("*.wgsl"))
    # the second BatchNorm's backward sums over cells of a row (split_rules.SPLIT_CELLS, [8, 24,
    # 40, 1, 40]) run 8 of its 24 channels a workgroup (codegen.reduce_lanes); the first's rows of
    # 40 are too short for 4 lanes of 64 walkers
    lanes = [k for k in kernels if "codegen.reduce_lanes" in k.read_text()]
    assert lanes and all("8 outputs along an axis of 24" in k.read_text() for k in lanes), [k.name for k in lanes]


def test_tiles_and_lanes_off_keep_the_flat_order(tmp_path, monkeypatch):
    monkeypatch.setattr(codegen, "TILE_C", 0)
    monkeypatch.setattr(codegen, "LANES_MAX", 0)
    root = aot.build(program("gpu"), tmp_path)
    texts = [k.read_text() for k in (root / "bn_layout_gpu" / "kernels").glob("*.wgsl")]
    assert not any("transposed_tile" in t or "reduce_lanes" in t for t in texts)


@pytest.mark.parametrize("lanes_max", [0, 64])
def test_lanes_on_and_off_train_alike(lanes_max, monkeypatch):
    """The GPU set with and without codegen.reduce_lanes: the same sums in another order."""
    monkeypatch.setattr(codegen, "LANES_MAX", lanes_max)
    tmod = TorchNet()
    randomize(torch, tmod, seed=5)
    with aot.compile(program("gpu"), kernels="gpu") as model:
        train_side_by_side(torch, model, tmod, torch_loss, batches(3), lr=1e-2, momentum=0.9)
