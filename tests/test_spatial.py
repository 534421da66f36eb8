"""The spatial ops, indexing and convolutions beyond the op table (tests/op_cases_spatial.py holds
their forward/FD/torch/GPU cases):

- the op cases of the new primitives and paths in BOTH kernel sets (the op table runs each batch
  in one set only, chosen by its name);
- a CNN of the new modules (Conv2d(dilation), ConvTranspose2d, AvgPool2d, reflect pad, bilinear
  interpolate, slicing, AdaptiveAvgPool2d, Conv1d, an index-input gather) against the same torch.nn
  network: weights loaded with load_state_dict from the torch module, losses and parameters after
  SGD steps (momentum), state_dict back in torch's names and layouts;
- Dropout2d: whole channels zeroed, kept ones scaled by 1/(1-p), gradient through the same mask,
  the identity in an Infer entry;
- an out-of-range tensor index is rejected by the runtime (and never read out of bounds);
- bad arguments raise ShapeError naming the op and this file's line; pad's old call form still works.
"""

from __future__ import annotations

import numpy as np
import pytest

import aot
from aot import nn, ops
from aot.errors import ShapeError
from aot.ir import Graph
from aot.trace import emit, tracing

from gpu_harness import assert_close, case_program, run_both
from op_cases import CASES

torch = pytest.importorskip("torch")

# one case per new primitive or code path: strided slice/unslice, flip + slice, gathers, reflect and
# circular concats, dilated unfold/fold, conv_transpose2d's fold with output_padding, interpolate
BOTH = ["getitem.step3", "getitem.neg_step", "getitem.tensor_repeats", "getitem.list", "pad.reflect", "pad.circular",
        "pad.torch_value", "avg_pool2d.ceil_exclude", "adaptive_avg_pool2d.uneven", "interpolate.nearest_frac",
        "interpolate.bilinear", "conv2d.dilation_stride_groups", "conv1d.all", "conv_transpose2d.stride_bias",
        "conv_transpose2d.opad_dilation", "ConvTranspose2d.stride"]


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["gpu", "cpu"])
def test_new_primitives_in_both_kernel_sets(kernels):
    cases = [c for c in CASES if c.name in BOTH]
    assert len(cases) == len(BOTH)
    program, inputs, slots = case_program(f"spatial_{kernels}", cases)
    [(gpu, ref)], _ = run_both(program, inputs, kernels=kernels)
    for s in slots:
        for o in s.out_names:
            assert_close(gpu.captures[o], ref.captures[o], f"{s.case.name}: output {o}", 2e-4, 5e-5)
        for p in s.param_names:
            assert_close(gpu.grads[p], ref.grads[p], f"{s.case.name}: gradient of {p}", 2e-4, 5e-5)


# ---- a CNN of the new modules against torch.nn ------------------------------------------------------

N, K = 2, 4


class Net(aot.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 3, padding=2, dilation=2)
        self.up = nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)
        self.pool = nn.AvgPool2d(2)
        self.apool = nn.AdaptiveAvgPool2d((3, 2))
        self.c1d = nn.Conv1d(3, 2, 3, padding=1, dilation=1)
        self.drop = nn.Dropout2d(0.0)


def net_forward(m, x, idx):
    h = ops.tanh(m.c1(x))  # [N, 4, 6, 6]
    h = m.up(h)  # [N, 3, 12, 12]
    h = m.drop(m.pool(h))  # [N, 3, 6, 6]
    h = ops.pad(h, (1, 2, 2, 1), mode="reflect")  # [N, 3, 9, 9]
    h = ops.interpolate(h, size=(7, 5), mode="bilinear", align_corners=False)
    h = h[:, :, ::2, 1:]  # [N, 3, 4, 4]
    h = m.apool(h)  # [N, 3, 3, 2]
    s = m.c1d(ops.reshape(h, (N, 3, 6)))  # [N, 2, 6]
    return s[..., idx]  # [N, 2, K]


def net_loss(m, x, idx, y):
    return ops.mean(ops.square(net_forward(m, x, idx) - y))


def torch_net():
    T = torch.nn
    torch.manual_seed(0)

    class TNet(T.Module):
        def __init__(self):
            super().__init__()
            self.c1 = T.Conv2d(2, 4, 3, padding=2, dilation=2)
            self.up = T.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)
            self.c1d = T.Conv1d(3, 2, 3, padding=1)

        def forward(self, x, idx):
            F = torch.nn.functional
            h = torch.tanh(self.c1(x))
            h = F.avg_pool2d(self.up(h), 2)
            h = F.pad(h, (1, 2, 2, 1), mode="reflect")
            h = F.interpolate(h, size=(7, 5), mode="bilinear", align_corners=False)
            h = F.adaptive_avg_pool2d(h[:, :, ::2, 1:], (3, 2))
            return self.c1d(h.reshape(N, 3, 6))[..., idx.long()]

    return TNet().double()


@pytest.fixture(scope="module")
def net_model():
    program = aot.Program(
        "spatial_net", model=Net,
        train=aot.Train(net_loss, inputs={"x": aot.f32(N, 2, 6, 6), "idx": aot.i32(K), "y": aot.f32(N, 2, K)},
                        optimizer=aot.optim.SGD(lr=0.05, momentum=0.9)),
        infer={"predict": aot.Infer(net_forward, inputs={"x": aot.f32(N, 2, 6, 6), "idx": aot.i32(K)})},
    )
    model = aot.compile(program)
    yield model
    model.close()


def test_cnn_of_new_modules_trains_like_torch(net_model):
    tnet = torch_net()
    net_model.load_state_dict(tnet.state_dict())
    opt = torch.optim.SGD(tnet.parameters(), lr=0.05, momentum=0.9)
    rng = np.random.default_rng(0)
    for step in range(3):
        x = rng.uniform(-1, 1, (N, 2, 6, 6)).astype(np.float32)
        idx = rng.integers(0, 6, K).astype(np.int32)
        y = rng.uniform(-1, 1, (N, 2, K)).astype(np.float32)
        if step == 0:
            out = net_model.predict(x=x, idx=idx)
            want = tnet(torch.from_numpy(x).double(), torch.from_numpy(idx)).detach().numpy()
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
        loss = net_model.step(x=x, idx=idx, y=y)
        opt.zero_grad()
        tl = torch.mean((tnet(torch.from_numpy(x).double(), torch.from_numpy(idx)) - torch.from_numpy(y).double()) ** 2)
        tl.backward()
        opt.step()
        assert loss == pytest.approx(tl.item(), rel=1e-4, abs=1e-6), f"step {step}"
    sd = net_model.state_dict()
    assert sorted(sd) == sorted(tnet.state_dict())
    for k, v in tnet.state_dict().items():
        np.testing.assert_allclose(sd[k], v.numpy(), rtol=1e-4, atol=1e-5, err_msg=k)


def test_out_of_range_tensor_index_is_rejected(net_model):
    x = np.zeros((N, 2, 6, 6), np.float32)
    for bad in ([0, 1, 6, 2], [0, -1, 2, 3]):
        with pytest.raises(ValueError, match="idx"):
            net_model.predict(x=x, idx=np.array(bad, np.int32))


# ---- Dropout2d --------------------------------------------------------------------------------------


class Drop(aot.Module):
    def __init__(self):
        super().__init__()
        self.w = self.param((8, 16, 3, 3), init=aot.init.ones())
        self.drop = nn.Dropout2d(0.25)


def drop_loss(m, x):
    y = aot.capture("y", m.drop(x * m.w))
    return ops.sum(y)


def test_dropout2d_zeroes_whole_channels():
    program = aot.Program("spatial_drop", model=Drop,
                          train=aot.Train(drop_loss, inputs={"x": aot.f32(8, 16, 3, 3)}, optimizer=None),
                          infer={"predict": aot.Infer(lambda m, x: m.drop(x * m.w), inputs={"x": aot.f32(8, 16, 3, 3)})})
    model = aot.compile(program)
    try:
        x = np.random.default_rng(1).uniform(0.5, 1.5, (8, 16, 3, 3)).astype(np.float32)
        res = model.step(x=x, captures=True)
        y, g = res.captures["y"], model.grads()["w"]
        kept = np.all(y != 0, axis=(2, 3))
        assert np.array_equal(kept, np.any(y != 0, axis=(2, 3))), "a channel is partly zeroed"
        assert 0.55 < kept.mean() < 0.95  # 128 channels, p = 0.25
        np.testing.assert_allclose(y[kept], (x / 0.75)[kept], rtol=1e-6)
        np.testing.assert_allclose(g, np.where(kept[:, :, None, None], x / 0.75, 0.0), rtol=1e-6)
        y2 = model.step(x=x, captures=True).captures["y"]
        assert not np.array_equal(y2 != 0, y != 0), "a new mask every step"
        np.testing.assert_allclose(model.predict(x=x), x, rtol=1e-6)
    finally:
        model.close()


# ---- errors and the old pad form ----------------------------------------------------------------------


def _trace(fn, *shapes, dtypes=None):
    g = Graph("t")
    with tracing(g):
        xs = [emit("input", (), name=f"x{i}", shape=s, dtype=(dtypes or {}).get(i, "f32")) for i, s in enumerate(shapes)]
        return fn(*xs)


BAD = [
    (lambda x: ops.pad(x, (1, 1), mode="wrap"), [(2, 3)], "pad: mode must be"),
    (lambda x: ops.pad(x, (3, 0), mode="reflect"), [(2, 3)], "reflect pads"),
    (lambda x: ops.pad(x, (1, 1, 1)), [(2, 3)], "even length"),
    (lambda x: ops.pad(x, (-2, -2)), [(2, 3)], "crop more"),
    (lambda x: x[2], [(2, 3)], "index 2 is out of range"),
    (lambda x: x[0, 0, 0], [(2, 3)], "too many indices"),
    (lambda x: x[::0], [(2, 3)], "step cannot be zero"),
    (lambda x: x["a"], [(2, 3)], "unsupported index"),
    (lambda x, y: x[y], [(2, 3), (2,)], "must be i32"),
    (lambda x, i: x[i, i], [(2, 3), (2,)], "only one integer-array index"),
    (lambda x: ops.avg_pool2d(x, 2, padding=2), [(1, 1, 4, 4)], "at most half the kernel"),
    (lambda x: ops.avg_pool2d(x, 2), [(4, 4)], "NCHW"),
    (lambda x: ops.adaptive_avg_pool2d(x, (0, 2)), [(1, 1, 4, 4)], "positive"),
    (lambda x: ops.interpolate(x, size=3, scale_factor=2), [(1, 1, 4, 4)], "exactly one of"),
    (lambda x: ops.interpolate(x, size=3, mode="bicubic"), [(1, 1, 4, 4)], "mode must be"),
    (lambda x: ops.interpolate(x, size=3, align_corners=True), [(1, 1, 4, 4)], "align_corners"),
    (lambda x, w: ops.conv_transpose2d(x, w, stride=2, output_padding=2), [(1, 2, 3, 3), (2, 1, 2, 2)], "output_padding"),
    (lambda x, w: ops.conv_transpose2d(x, w), [(1, 2, 3, 3), (3, 1, 2, 2)], "does not fit"),
    (lambda x, w: ops.conv1d(x, w, bias=None, dilation=(1, 2)), [(1, 2, 5), (1, 2, 2)], "dilation must be"),
    (lambda x, w: ops.conv2d(x, w, dilation=3), [(1, 1, 4, 4), (1, 1, 3, 3)], "does not fit"),
    (lambda x: ops.dropout2d(x, 1.0), [(2, 3)], "p must be"),
]


@pytest.mark.parametrize("fn,shapes,msg", BAD, ids=[b[2] for b in BAD])
def test_bad_arguments_name_the_op_and_the_line(fn, shapes, msg):
    dtypes = {1: "i32"} if "integer-array" in msg else None
    with pytest.raises(ShapeError, match=msg) as e:
        _trace(fn, *shapes, dtypes=dtypes)
    assert "test_spatial.py" in str(e.value)


def test_old_pad_form_and_getitem_views():
    def fn(x):
        a = ops.pad(x, 1, 2, 0)  # pad(x, axis, before, after): the original form
        b = ops.pad(x, axis=0, before=1, after=1)
        c = x[1:, ::2]
        return a, b, c

    a, b, c = _trace(fn, (3, 4))
    assert a.shape == (3, 6) and a.node.op == "pad" and b.shape == (5, 4)
    assert c.node.op == "slice" and c.node.inputs[0].node.op == "narrow"  # views, no gather


# ---- the convolution tiles (matmul_codegen.CONV_TILES) in the GPU kernel set ------------------------


@pytest.mark.gpu
def test_conv_tiles_compute_convolutions(monkeypatch):
    """Each tile only convolutions choose, forced in turn on the forward, input-gradient and
    weight-gradient matmuls of three convolutions (16, 32 and 8 output channels, ragged against
    every tile): values and gradients against the reference interpreter. The full-size shapes
    that pick them (ResNet-20's) are too slow for lavapipe's GPU-set kernels."""
    from aot import codegen, matmul_codegen as mc

    from gpu_harness import make_program

    new = [t for t in mc.CONV_TILES if t not in mc.TILES]
    default, used = mc.choose_tile, []

    def choose(spec):
        if not (spec.a.fn or spec.b.fn):
            return default(spec)
        used.append(new[len(used) % len(new)])
        return used[-1]

    monkeypatch.setattr(mc, "choose_tile", choose)
    monkeypatch.setattr(codegen, "choose_tile", choose)
    rng = np.random.default_rng(7)
    chans = [3, 16, 32, 8]
    params = {"x": rng.standard_normal((2, 3, 9, 7))}
    for i in range(3):
        params[f"w{i}"] = rng.standard_normal((chans[i + 1], chans[i], 3, 3)) / np.sqrt(9 * chans[i])

    def body(m, feeds):
        h = m.x
        for i in range(3):
            h = ops.conv2d(h, getattr(m, f"w{i}"), padding=1)
        return {"y": h}

    program, inputs, _ = make_program("conv_tiles", params, {}, body)
    [(gpu, ref)], wgsl = run_both(program, inputs, kernels="gpu")
    assert {t.name for t in used} == {t.name for t in new}
    assert all(any(f"Tile {t.name}:" in src for src in wgsl.values()) for t in new)
    assert_close(gpu.captures["y"], ref.captures["y"], "y", 2e-4, 5e-5)
    for p in params:
        assert_close(gpu.grads[p], ref.grads[p], f"gradient of {p}", 2e-4, 5e-5)
