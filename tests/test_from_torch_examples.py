"""`aot.from_torch` on the PyTorch twins of issue 30's examples, unchanged: the ResNet-20 with
BatchNorm (examples/resnet20_torch.py, its SGD with decay groups and cosine schedule) in the
float64 interpreter against torch float64, and DCGAN (examples/dcgan_torch.py: two torch
optimizers, so two training entries) on the real adapter against torch float32."""

from __future__ import annotations

import copy
import runpy
from pathlib import Path

import numpy as np
import pytest

import aot

torch = pytest.importorskip("torch")
from test_from_torch import parity, to_torch  # noqa: E402  (the from_torch parity harness)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def twin(name):
    return runpy.run_path(str(EXAMPLES / f"{name}_torch.py"))


def test_resnet20_twin_compiles_unchanged_and_matches_torch():
    tw = twin("resnet20")
    torch.manual_seed(0)
    net = tw["ResNet20"](width=4, blocks=1)
    rng = np.random.default_rng(0)
    batches = [{"x": rng.random((4, 1, 28, 28)), "labels": rng.integers(0, 10, 4).astype(np.int32)} for _ in range(5)]
    _, ref, tm = parity(
        net, tw["loss"], {"x": aot.f32(4, 1, 28, 28), "labels": aot.i32(4)}, batches,
        lambda m: tw["optimizer"](m, lr=0.1, steps=5)[0],
        make_sched=lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, 5, eta_min=0.0),
        infer={"predict": (lambda m, x: m(x), {"x": aot.f32(2, 1, 28, 28)})},
        rtol=1e-5,
    )
    assert ref.buffers["layer2.0.shortcut.1.num_batches_tracked"] == 5
    tm.eval()
    x = batches[0]["x"][:2]
    np.testing.assert_allclose(ref.predict("predict", x=x), tm(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-7)


def test_dcgan_twin_two_optimizers_compile_to_two_entries():
    tw = twin("dcgan")
    torch.manual_seed(0)
    nz, width, b = 4, 4, 4
    net = tw["GAN"](nz, width, width)
    opt_d, opt_g = tw["optimizers"](net)
    ins = {"x": aot.f32(b, 1, 28, 28), "z": aot.f32(b, nz, 1, 1)}
    # each entry's loss receives every declared input; the generator's ignores the images
    losses = {"d": (tw["loss_d"], opt_d), "g": (lambda m, x, z: tw["loss_g"](m, z), opt_g)}
    model = aot.compile(aot.from_torch(net, losses, ins, name="dcgan_from_torch"))
    try:
        tm = copy.deepcopy(net)
        topt_d, topt_g = tw["optimizers"](tm)
        rng = np.random.default_rng(0)
        for i in range(3):
            batch = {"x": rng.random((b, 1, 28, 28)).astype(np.float32) * 2 - 1,
                     "z": rng.standard_normal((b, nz, 1, 1)).astype(np.float32)}
            got = (model.step_d(**batch), model.step_g(**batch))
            want = tw["train_step"](tm, topt_d, topt_g, *to_torch(batch).values())
            assert got == pytest.approx(want, rel=1e-4), f"iteration {i}"
        for n, v in tm.state_dict().items():
            np.testing.assert_allclose(model.state_dict()[n], v.numpy(), rtol=1e-3, atol=1e-5, err_msg=n)
    finally:
        model.close()
