"""Mean and variance in few dispatches (issue 30): ops.reductions.moments, where the sums of a
long reduction are split in two stages, gives each chunk its own two-pass mean and sum of squares
and combines the chunks with Chan's formula. BatchNorm's training statistics, ops.var / ops.std
and the long rows of LayerNorm / GroupNorm / InstanceNorm use it.

Checked here: the graph it builds (and that split_reductions leaves it alone), the dispatches it
saves, and values, gradients and running statistics against torch in float64 on the same float32
data, with offset data (1e4 + N(0, 1), 1e6 + N(0, 1)), constant channels, a NaN and an inf, and
a huge count: the GPU kernel set, the CPU kernel set and the interpreter each within a few times
torch float32's own error. Then 10 Adam steps of a BatchNorm model side by side with torch.
"""

from __future__ import annotations

import numpy as np
import pytest

import aot
from aot import interp, nn, ops, split_rules
from aot.frontend import trace_program
from aot.ir import Graph, format_graph
from aot.ops.reductions import moments
from aot.passes import split_reductions, verify
from aot.pipeline import compile_program
from aot.trace import emit, tracing

from nn_parity import randomize, train_side_by_side

torch = pytest.importorskip("torch")

BN_X, LN_X, GN_X, IN_X = (16, 4, 48, 48), (2, 40000), (1, 4, 128, 160), (1, 2, 200, 200)


def _moments_graph(shape, axes):
    g = Graph("t")
    with tracing(g):
        x = emit("input", (), name="x", shape=shape, dtype="f32")
        g.outputs["mu"], g.outputs["m2"] = moments(x, axes)
    return g


@pytest.mark.parametrize(
    "shape, axes, chunks",
    [
        ((64, 16, 32, 32), (0, 2, 3), "(64,16,8,4,32)"),  # ResNet-20's first stage: 512 cells of 4 rows (split_rules.SPLIT_CELLS)
        ((2, 40000), (1,), "(2,10,4000)"),  # two long rows: 10 chunks of 4000 (a divisor, no padding)
        ((61, 16, 24, 24), (0, 2, 3), "(61,16,8,3,24)"),  # 61 images (prime): their rows are cut instead
        ((64, 32, 14, 14), (0, 2, 3), "(64,32,7,2,14)"),  # ResNet-20's second stage: 448 cells of 2 rows (of 14: 16 or more)
        ((64, 64, 7, 7), (0, 2, 3), None),  # its third: short enough for one stage
    ],
)
def test_moments_cuts_where_split_reductions_would_and_matches_float64(shape, axes, chunks):
    g = _moments_graph(shape, axes)
    verify(g)
    text = format_graph(g)
    sums = [n for n in g.nodes if n.op == "sum"]
    if chunks:
        assert f"reshape[shape={chunks}]" in text, text
        # chunk sums of x and of x less the pivot, squares; the combination: both, squares, spread of means
        assert len(sums) == 7
        assert format_graph(split_reductions(g)) == text  # nothing left to split: the stages are the chunks
    else:
        assert len(sums) == 2
        assert all(n.inputs[0].shape == shape for n in sums), text
    rng = np.random.default_rng(5)
    x = (1e4 + rng.standard_normal(shape)).astype(np.float32)
    env = interp.run(g, {"x": x}, np.float64)
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=axes, keepdims=True)
    np.testing.assert_allclose(env[id(g.outputs["mu"])], mu, rtol=1e-14)
    np.testing.assert_allclose(env[id(g.outputs["m2"])], ((x64 - mu) ** 2).sum(axis=axes, keepdims=True), rtol=1e-9)


def test_moments_does_not_cut_into_one_chunk(monkeypatch):
    """37 images in 2 chunks (the outermost axis cut, split_rules.SPLIT_CELLS off): the divisor
    rule's only choice near 19 is 37 itself, one chunk of everything, which would add a stage and
    save nothing."""
    monkeypatch.setattr(split_rules, "SPLIT_CELLS", 0)
    g = _moments_graph((37, 256, 30, 30), (0, 2, 3))
    assert [n.inputs[0].shape for n in g.nodes if n.op == "sum"] == [(37, 256, 30, 30)] * 2


# ---- the dispatches it saves (GPU kernel set, merged and chained) -------------------------------


@pytest.mark.gpu
def test_batchnorm_forward_takes_three_dispatches():
    """BatchNorm2d over [16, 4, 48, 48] (36,864 values a channel: split in two stages) normalizing
    with batch statistics: chunk statistics, their combination, the normalization. The split
    sums of the mean and of the squares took five."""

    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm2d(4, track_running_stats=False)

    prog = aot.Program(
        "bn_dispatches", model=M, infer={"predict": aot.Infer(lambda m, x: m.bn(x), inputs={"x": aot.f32(*BN_X)})}
    )
    model = aot.compile(prog, kernels="gpu")
    try:
        (entry,) = model._engine.entries.values()
        assert len(entry["dispatches"]) == 3, entry["dispatches"]
        # the combination of 16 chunks runs a workgroup per channel (codegen.FEW_ROWS), not 4
        # invocations walking their chunks alone
        assert entry["dispatches"][1][1] == (4, 1, 1), entry["dispatches"]
        x = np.random.default_rng(0).normal(3.0, 2.0, BN_X).astype(np.float32)
        want = torch.nn.functional.batch_norm(torch.tensor(x, dtype=torch.float64), None, None, training=True)
        np.testing.assert_allclose(model.predict(x=x), want.numpy(), rtol=1e-5, atol=2e-6)
    finally:
        model.close()


def test_batchnorm_backward_reduces_one_pair_of_sums():
    """BatchNorm2d's VJP holds its affine parameters: sum(ct) and sum(ct * xhat) are the bias and
    weight gradients and the input gradient's means, so the training graph has four first-stage
    sums over the chunks' axes (the forward's mean and squares, the backward's pair), where the
    rule on the normalized values summed the weighted cotangent again (six)."""

    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.h = self.param(BN_X, init=aot.init.randn(1.0))
            self.bn = nn.BatchNorm2d(4)

    prog = aot.Program(
        "bn_backward_sums", model=M,
        train=aot.Train(lambda m, ct: ops.sum(m.bn(m.h) * ct), inputs={"ct": aot.f32(*BN_X)}, optimizer=None),
    )  # fmt: skip
    g = compile_program(prog).graphs["train"]
    # in cells of rows: [16, 4, 24, 2, 48] over (3, 4) (split_rules.SPLIT_CELLS); the forward's
    # three (x, x less its pivot, squares), the backward's pair
    chunked = [n for n in g.nodes if n.op == "sum" and n.attrs["axes"] == (3, 4)]
    assert len(chunked) == 5, format_graph(g)


# ---- accuracy against torch float64 ----------------------------------------------------------------


class Stats(aot.Module):
    """Each normalized tensor is a parameter, so its gradient is the input gradient."""

    def __init__(self):
        super().__init__()
        self.h_bn = self.param(BN_X, init=aot.init.zeros())
        self.h_ln = self.param(LN_X, init=aot.init.zeros())
        self.h_gn = self.param(GN_X, init=aot.init.zeros())
        self.h_in = self.param(IN_X, init=aot.init.zeros())
        self.bn = nn.BatchNorm2d(4)
        self.ln = nn.LayerNorm(LN_X[1])
        self.gn = nn.GroupNorm(2, 4)
        self.inorm = nn.InstanceNorm2d(2, affine=True, track_running_stats=True)


class TorchStats(torch.nn.Module):
    def __init__(self):
        super().__init__()
        for name, shape in (("h_bn", BN_X), ("h_ln", LN_X), ("h_gn", GN_X), ("h_in", IN_X)):
            setattr(self, name, torch.nn.Parameter(torch.zeros(shape)))
        self.bn = torch.nn.BatchNorm2d(4)
        self.ln = torch.nn.LayerNorm(LN_X[1])
        self.gn = torch.nn.GroupNorm(2, 4)
        self.inorm = torch.nn.InstanceNorm2d(2, affine=True, track_running_stats=True)


def stat_outputs(m, var=ops.var, std=ops.std):
    return {
        "bn": m.bn(m.h_bn), "ln": m.ln(m.h_ln), "gn": m.gn(m.h_gn), "inorm": m.inorm(m.h_in),
        "var": var(m.h_bn, (0, 2, 3)), "std": std(m.h_ln, -1),
    }  # fmt: skip


OUT_SHAPES = {"bn": BN_X, "ln": LN_X, "gn": GN_X, "inorm": IN_X, "var": (4,), "std": (2,)}


def stat_loss(m, **cts):
    total = 0.0
    for name, out in stat_outputs(m).items():
        aot.capture(name, out)
        total = total + ops.sum(out * cts[name])
    return total


def stats_program():
    cts = {k: aot.f32(*s) for k, s in OUT_SHAPES.items()}
    return aot.Program("moments_stats", model=Stats, train=aot.Train(stat_loss, inputs=cts, optimizer=None))


def stat_data(kind: str, seed: int = 0) -> dict:
    """Parameter values: normal data, offset data (large means, a constant channel, a tiny spread),
    or normal data with a NaN and an inf."""
    r = np.random.default_rng(seed)
    h = {k: r.standard_normal(s) for k, s in (("h_bn", BN_X), ("h_ln", LN_X), ("h_gn", GN_X), ("h_in", IN_X))}
    if kind == "offset":
        h["h_bn"][:, 0] += 1e4
        h["h_bn"][:, 1] += 1e6
        h["h_bn"][:, 2] = 3.7  # constant: variance 0
        h["h_bn"][:, 3] = 5.0 + 1e-3 * h["h_bn"][:, 3]
        h["h_ln"][0] += 1e4
        h["h_ln"][1] = 1e6 + h["h_ln"][1]
        h["h_gn"][:, :2] += 1e4
        h["h_gn"][:, 2:] = -2.5
        h["h_in"][:, 0] += 1e6
        h["h_in"][:, 1] = 5.0 + 1e-3 * h["h_in"][:, 1]
    elif kind == "nonfinite":
        h["h_bn"][3, 1, 5, 7] = np.nan
        h["h_bn"][9, 2, 0, 0] = np.inf
        h["h_ln"][1, 123] = -np.inf
        h["h_gn"][0, 3, 7, 9] = np.nan
        h["h_in"][0, 0, 199, 199] = np.inf
    h = {k: v.astype(np.float32) for k, v in h.items()}
    cts = {k: r.standard_normal(s).astype(np.float32) for k, s in OUT_SHAPES.items()}
    return {"params": h, "cts": cts}


def torch_side(d: dict, dtype) -> dict:
    """Outputs, gradients and buffers of one step of TorchStats in `dtype`."""
    t = TorchStats().to(dtype)
    with torch.no_grad():
        for k, v in d["params"].items():
            getattr(t, k).copy_(torch.tensor(v, dtype=dtype))
    outs = stat_outputs(t, var=lambda x, dims: x.var(dims), std=lambda x, dim: x.std(dim))
    sum((o * torch.tensor(d["cts"][k], dtype=dtype)).sum() for k, o in outs.items()).backward()
    res = {f"out.{k}": o.detach().numpy() for k, o in outs.items()}
    res.update({f"grad.{n}": p.grad.numpy() for n, p in t.named_parameters()})
    res.update({f"buf.{n}": b.numpy() for n, b in t.named_buffers() if b.dtype == dtype})
    return res


TORCH_NAMES = {"ln.g": "ln.weight", "ln.b": "ln.bias"}  # aot.nn.LayerNorm's own parameter names


def _flat(captures, grads, state) -> dict:
    res = {f"out.{k}": np.asarray(v) for k, v in captures.items()}
    res.update({f"grad.{TORCH_NAMES.get(k, k)}": np.asarray(v) for k, v in grads.items()})
    res.update({f"buf.{k}": np.asarray(v) for k, v in state.items() if np.asarray(v).dtype == np.float32})
    return res


@pytest.fixture(scope="module", params=["gpu", "cpu", "interp"])
def runner(request):
    """A function of stat_data's dict giving one step's outputs, gradients and buffers (float32)."""
    prog = stats_program()
    if request.param == "interp":
        traced = trace_program(prog)

        def run(d):
            ref = interp.Reference(traced, dtype=np.float32)
            ref.params.update(d["params"])
            leaves = dict(d["cts"], **ref.params, **ref.buffers, _rng=np.int32(0))  # before the step's updates
            ref.step(**d["cts"])
            env = interp.run(traced.graphs["train"], leaves, np.float32)
            caps = {n: env[id(x)] for n, x in traced.graphs["train"].captures.items()}
            return _flat(caps, ref.last_grads, ref.buffers)

        yield run
        return
    model = aot.compile(prog, kernels=request.param)

    def run(d):
        model.reset()
        model.load_state_dict(dict(model.state_dict(), **d["params"]))
        res = model.step(**d["cts"], captures=True)
        return _flat(res.captures, model.grads(), model.state_dict())

    yield run
    model.close()


def normwise(got, want):
    fin = np.isfinite(want)
    if not fin.any():
        return 0.0
    return float(np.max(np.abs(got[fin] - want[fin])) / max(np.max(np.abs(want[fin])), 1e-30))


def two_pass_f32(x, axes):
    """The unbiased variance as float32 two-pass computes it (NumPy's pairwise sums): torch's
    float32 var accumulates in float64 on the CPU, past what any float32 mean allows (at 1e6 the
    mean rounds to 1/16, which alone moves the variance by up to 1e-3)."""
    f = np.float32
    n = np.prod([x.shape[a] for a in axes])
    mu = x.sum(axis=axes, keepdims=True, dtype=f) / f(n)
    d = x - mu
    return (d * d).sum(axis=axes, dtype=f) / f(n - 1)


@pytest.mark.gpu
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the interpreter's inf - inf
@pytest.mark.parametrize("kind", ["normal", "offset", "nonfinite"])
def test_statistics_match_torch_float64_as_closely_as_torch_float32(runner, kind):
    """Every output, input and parameter gradient and running statistic: NaN where torch's float64
    has NaN, and elsewhere a normwise error within 4x torch float32's plus 5e-6 (40 float32 ulps
    of the largest value: the CPU kernel set sums 256 values at a time in sequence, and near-zero
    means and gradients sum many terms that cancel); ops.var and ops.std within 4x float32
    two-pass (two_pass_f32) plus the same."""
    d = stat_data(kind)
    got = runner(d)
    want, t32 = torch_side(d, torch.float64), torch_side(d, torch.float32)
    with np.errstate(invalid="ignore"):
        t32["out.var"] = two_pass_f32(d["params"]["h_bn"], (0, 2, 3))
        t32["out.std"] = np.sqrt(two_pass_f32(d["params"]["h_ln"], (1,)))
    assert sorted(k for k in got if not k.startswith("buf.") or k in want) == sorted(want)
    bad = []
    for k in want:
        g, w = got[k].reshape(want[k].shape), want[k]
        if not np.array_equal(np.isnan(g), np.isnan(w)) or not np.array_equal(np.isinf(g), np.isinf(w)):
            bad.append(f"{k}: non-finite entries differ ({np.isnan(g).sum()} NaN here, {np.isnan(w).sum()} in torch)")
            continue
        e, e32 = normwise(g, w), normwise(t32[k], w)
        if e > 4 * e32 + 5e-6:
            bad.append(f"{k}: error {e:.3g}, torch float32 {e32:.3g}")
    assert not bad, "\n".join(bad)


@pytest.mark.gpu
def test_huge_count_variance():
    """ops.var over 2M values a channel at 1e3 + N(0, 1) (both kernel sets) against float64."""

    shape = (256, 2, 64, 64)
    prog = aot.Program(
        "moments_huge",
        model=aot.Module,
        infer={"predict": aot.Infer(lambda m, x: ops.var(x, (0, 2, 3), correction=0), inputs={"x": aot.f32(*shape)})},
    )
    x = (1e3 + np.random.default_rng(2).standard_normal(shape)).astype(np.float32)
    want = x.astype(np.float64).var(axis=(0, 2, 3))
    for kernels in ("gpu", "cpu"):
        model = aot.compile(prog, kernels=kernels)
        try:
            np.testing.assert_allclose(model.predict(x=x), want, rtol=2e-5, err_msg=kernels)
        finally:
            model.close()


# ---- training ---------------------------------------------------------------------------------------

TRAIN_X = (16, 3, 48, 48)  # 36,864 values a channel


class BNNet(aot.Module):
    def __init__(self):
        super().__init__()
        self.s = self.param(TRAIN_X, init=aot.init.ones())  # full shape: its gradient is BatchNorm's input's
        self.bn = nn.BatchNorm2d(3)
        self.bn_m = nn.BatchNorm2d(3, momentum=None, affine=False)


class TorchBNNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.s = torch.nn.Parameter(torch.ones(TRAIN_X))
        self.bn = torch.nn.BatchNorm2d(3)
        self.bn_m = torch.nn.BatchNorm2d(3, momentum=None, affine=False)


def bn_loss(m, x, ct):
    h = x * m.s + 4.0
    y = m.bn(h) + m.bn_m(h * 2.0 - 5.0)
    aot.capture("y", y)
    return ops.sum(y * ct)


def torch_bn_loss(t, b):
    h = b["x"] * t.s + 4.0
    y = t.bn(h) + t.bn_m(h * 2.0 - 5.0)
    return (y * b["ct"]).sum(), {"y": y}


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["gpu", "cpu"])
def test_ten_adam_steps_of_a_split_batchnorm_model_match_torch(kernels):
    """BatchNorm over 36,864 values a channel (split statistics): losses,
    first-step outputs and gradients, then parameters and running statistics after 10 steps."""
    prog = aot.Program(
        f"moments_train_{kernels}", model=BNNet,
        train=aot.Train(bn_loss, inputs={"x": aot.f32(*TRAIN_X), "ct": aot.f32(*TRAIN_X)},
                        optimizer=aot.optim.Adam(lr=1e-2)),
    )  # fmt: skip
    r = np.random.default_rng(7)
    batches = [
        {"x": r.normal(0, 3, TRAIN_X).astype(np.float32), "ct": r.normal(size=TRAIN_X).astype(np.float32)}
        for _ in range(10)
    ]
    model = aot.compile(prog, kernels=kernels)
    try:
        train_side_by_side(torch, model, randomize(torch, TorchBNNet(), seed=3).train(), torch_bn_loss, batches)
    finally:
        model.close()


@pytest.mark.parametrize("offset", [1e4, 1e6])
def test_moments_in_cells_about_a_pivot_keep_offset_data_precise(offset, monkeypatch):
    """ops.reductions.MOMENTS_PIVOT: mean and squares in cells of 2 rows (split_rules.SPLIT_CELLS,
    384 chunks of 96), the squares about each channel's first element, in float32 (the
    interpreter): the sum of squares within 1e-6 of float64's at offsets where float32's spacing
    (0.0625 at 1e6) exceeds the spread of the chunk means (0.1); about the chunk means themselves
    it was 1e-3 off."""
    from aot.ops import reductions

    monkeypatch.setattr(reductions, "MOMENTS_PIVOT", 1)  # the default
    g = _moments_graph(BN_X, (0, 2, 3))
    assert "reshape[shape=(16,4,24,2,48)]" in format_graph(g)
    x = (offset + np.random.default_rng(5).standard_normal(BN_X)).astype(np.float32)
    env = interp.run(g, {"x": x}, np.float32)
    x64 = x.astype(np.float64)
    mu = x64.mean(axis=(0, 2, 3), keepdims=True)
    np.testing.assert_allclose(env[id(g.outputs["m2"])], ((x64 - mu) ** 2).sum(axis=(0, 2, 3), keepdims=True), rtol=1e-6)
    np.testing.assert_allclose(env[id(g.outputs["mu"])], mu, rtol=1e-7)
