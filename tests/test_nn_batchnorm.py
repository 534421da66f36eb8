"""BatchNorm1d and BatchNorm2d (and InstanceNorm with track_running_stats) against torch.nn (issue 30): batch statistics in training entries,
running_mean / running_var / num_batches_tracked updated every step as torch updates them
(momentum and momentum=None's cumulative average), running statistics in infer entries (torch's
eval mode), batch statistics always without track_running_stats. The package and its torch twin
take 10 Adam steps side by side (losses, gradients, parameters and buffers), then predict in eval
mode; both kernel sets.
"""

from __future__ import annotations

import numpy as np
import pytest

import aot
from aot import nn, ops
from aot.frontend import trace_program

from nn_parity import randomize, to_torch, train_side_by_side

pytestmark = pytest.mark.gpu  # needs a WebGPU adapter (lavapipe on CI)
torch = pytest.importorskip("torch")

SHAPES = {"x4": (4, 3, 2, 3), "x2": (6, 5), "x3": (3, 4, 5)}
OUTS = {"bn2": SHAPES["x4"], "bn_nt": SHAPES["x4"], "bn1": SHAPES["x2"], "bn1l": SHAPES["x3"], "in_t": SHAPES["x4"],
        "in_tn": SHAPES["x3"]}


class BN(aot.Module):
    def __init__(self):
        super().__init__()
        self.s4 = self.param(SHAPES["x4"], init=aot.init.ones())
        self.bn2 = nn.BatchNorm2d(3)
        self.bn_nt = nn.BatchNorm2d(3, track_running_stats=False)
        self.bn1 = nn.BatchNorm1d(5, momentum=None)
        self.bn1l = nn.BatchNorm1d(4, affine=False, momentum=0.3, eps=1e-3)
        self.in_t = nn.InstanceNorm2d(3, affine=True, track_running_stats=True, momentum=0.2)
        self.in_tn = nn.InstanceNorm1d(4, track_running_stats=True, momentum=None)


def outputs(m, x4, x2, x3):
    h4 = x4 * m.s4
    return {"bn2": m.bn2(h4), "bn_nt": m.bn_nt(h4), "bn1": m.bn1(x2), "bn1l": m.bn1l(x3), "in_t": m.in_t(h4),
            "in_tn": m.in_tn(x3)}  # fmt: skip


def loss(m, **b):
    total = 0.0
    for name, out in outputs(m, b["x4"], b["x2"], b["x3"]).items():
        aot.capture(name, out)
        total = total + ops.sum(out * b["ct_" + name])
    return total


def predict(m, x4, x2, x3):
    return ops.concat([ops.reshape(o, (-1,)) for o in outputs(m, x4, x2, x3).values()], 0)


INPUTS = {k: aot.f32(*s) for k, s in SHAPES.items()}


def program(kernels):
    train_inputs = dict(INPUTS, **{"ct_" + k: aot.f32(*s) for k, s in OUTS.items()})
    return aot.Program(
        f"nn_batchnorm_{kernels}",
        model=BN,
        train=aot.Train(loss, inputs=train_inputs, optimizer=aot.optim.Adam(lr=1e-2)),
        infer={"predict": aot.Infer(predict, inputs=INPUTS)},
        seed=8,
    )


class TorchBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.s4 = torch.nn.Parameter(torch.ones(SHAPES["x4"]))
        self.bn2 = torch.nn.BatchNorm2d(3)
        self.bn_nt = torch.nn.BatchNorm2d(3, track_running_stats=False)
        self.bn1 = torch.nn.BatchNorm1d(5, momentum=None)
        self.bn1l = torch.nn.BatchNorm1d(4, affine=False, momentum=0.3, eps=1e-3)
        self.in_t = torch.nn.InstanceNorm2d(3, affine=True, track_running_stats=True, momentum=0.2)
        self.in_tn = torch.nn.InstanceNorm1d(4, track_running_stats=True, momentum=None)

    def outs(self, b):
        h4 = b["x4"] * self.s4
        x3 = b["x3"]
        return {"bn2": self.bn2(h4), "bn_nt": self.bn_nt(h4), "bn1": self.bn1(b["x2"]), "bn1l": self.bn1l(x3),
                "in_t": self.in_t(h4), "in_tn": self.in_tn(x3)}  # fmt: skip


def torch_loss(t, b):
    o = t.outs(b)
    return sum((v * b["ct_" + k]).sum() for k, v in o.items()), o


def batches(n, seed=0):
    r = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        b = {k: r.normal(0.5, 2.0, s).astype(np.float32) for k, s in SHAPES.items()}
        b.update({"ct_" + k: r.normal(size=s).astype(np.float32) for k, s in OUTS.items()})
        out.append(b)
    return out


@pytest.fixture(scope="module", params=["gpu", "cpu"])
def model(request):
    m = aot.compile(program(request.param), kernels=request.param)
    yield m
    m.close()


def test_buffers_start_as_torchs(model):
    model.reset()
    sd, want = model.state_dict(), TorchBN().state_dict()
    assert sorted(sd) == sorted(want)  # bn_nt has no running stats, as in torch
    for k, v in want.items():
        np.testing.assert_array_equal(sd[k], v.numpy(), err_msg=k)
    assert sd["bn2.num_batches_tracked"].shape == ()


def test_batchnorm_trains_like_torch_and_predicts_like_eval_mode(model):
    """10 Adam steps: losses, first-step gradients and outputs, then parameters, running stats
    and num_batches_tracked; then the infer entry against torch's eval mode."""
    tmod = randomize(torch, TorchBN(), seed=1).train()
    train_side_by_side(torch, model, tmod, torch_loss, batches(10))
    sd = model.state_dict()
    assert int(sd["bn2.num_batches_tracked"]) == 10 and int(sd["in_t.num_batches_tracked"]) == 0  # as torch
    x = batches(1, seed=9)[0]
    tmod.eval()
    with torch.no_grad():
        want = torch.cat([o.reshape(-1) for o in tmod.outs(to_torch(torch, x)).values()]).numpy()
    got = model.predict(**{k: x[k] for k in SHAPES})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # predicting changes no statistics
    before = model.state_dict()
    model.predict(**{k: x[k] for k in SHAPES})
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k], err_msg=k)


# ---- shapes and errors (tracing only) -------------------------------------------------------------


def _trace(make, fn, train=False, **inputs):
    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.m = make()
            self.w = self.param((1,))

    if train:
        train = aot.Train(lambda m, **kw: ops.sum(fn(m.m, **kw) * m.w), inputs=inputs, optimizer=None)
        prog = aot.Program("nn_bn_err", model=M, train=train)
    else:
        prog = aot.Program("nn_bn_err", model=M, infer={"f": aot.Infer(lambda m, **kw: fn(m.m, **kw), inputs=inputs)})
    return trace_program(prog)


@pytest.mark.parametrize(
    "make, inputs, train, match",
    [
        (lambda: nn.BatchNorm2d(3), {"x": aot.f32(2, 3, 4)}, False, r"expects \[N, 3, H, W\] \(3 dims given\)"),
        (lambda: nn.BatchNorm1d(3), {"x": aot.f32(2, 4)}, False, r"expects 3 channels \(dim 1\)"),
        (lambda: nn.BatchNorm1d(3), {"x": aot.f32(1, 3)}, True, "more than 1 value per channel when training"),
        (lambda: nn.BatchNorm1d(3, momentum=2.0), {"x": aot.f32(2, 3)}, False, r"momentum must be in \[0, 1\]"),
    ],
)
def test_bad_arguments_and_shapes_raise_shape_errors(make, inputs, train, match):
    with pytest.raises(aot.ShapeError, match=match):
        _trace(make, lambda m, x: m(x), train=train, **inputs)


def test_one_sample_is_fine_in_an_infer_entry():
    _trace(lambda: nn.BatchNorm1d(3), lambda m, x: m(x), x=aot.f32(1, 3))
