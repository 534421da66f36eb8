"""GroupNorm, InstanceNorm1d/2d, LayerNorm(normalized_shape, elementwise_affine, bias) and
Embedding(padding_idx) against torch.nn (issue 30).

One program holds every variant: each module's input is first scaled by a full-shape parameter
(so the gradient reaching the module's input is checked through that parameter's gradient), and
the loss is sum over outputs of <out, ct> with random cotangent inputs. The package and its
torch twin (same attribute names: load_state_dict maps them) take 10 Adam steps side by side:
forward values (captures), first-step gradients, per-step losses and final parameters. Both kernel
sets run (GPU: merged dispatches and row chains; CPU: one kernel per dispatch).
"""

from __future__ import annotations

import numpy as np
import pytest

import aot
from aot import nn, ops
from aot.frontend import trace_program

from nn_parity import randomize, train_side_by_side

pytestmark = pytest.mark.gpu  # needs a WebGPU adapter (lavapipe on CI)
torch = pytest.importorskip("torch")

X4, X3, XU, XL, IDX = (3, 6, 3, 4), (2, 4, 5), (6, 3, 4), (3, 2, 3, 4), (2, 5)
OUTS = {"gn": X4, "gn1": X4, "inorm": X4, "inorm_plain": X4, "inorm_u": XU, "in1": X3, "ln": XL, "ln_nb": XL,
        "ln_na": XL, "emb": IDX + (5,), "emb_neg": IDX + (5,)}  # fmt: skip


class Norms(aot.Module):
    def __init__(self):
        super().__init__()
        self.s4 = self.param(X4, init=aot.init.ones())
        self.s3 = self.param(X3, init=aot.init.ones())
        self.sl = self.param(XL, init=aot.init.ones())
        self.gn = nn.GroupNorm(3, 6)
        self.gn1 = nn.GroupNorm(1, 6, affine=False, eps=1e-3)
        self.inorm = nn.InstanceNorm2d(6, affine=True)
        self.inorm_plain = nn.InstanceNorm2d(6)
        self.in1 = nn.InstanceNorm1d(4, affine=True, eps=1e-4)
        self.ln = nn.LayerNorm((3, 4))
        self.ln_nb = nn.LayerNorm(4, bias=False)
        self.ln_na = nn.LayerNorm(4, elementwise_affine=False)
        self.emb = nn.Embedding(7, 5, padding_idx=2)
        self.emb_neg = nn.Embedding(7, 5, padding_idx=-1)


def outputs(m, x4, x3, xu, xl, idx):
    h4, h3, hl = x4 * m.s4, x3 * m.s3, xl * m.sl
    return {
        "gn": m.gn(h4), "gn1": m.gn1(h4), "inorm": m.inorm(h4), "inorm_plain": m.inorm_plain(h4),
        "inorm_u": m.inorm(xu), "in1": m.in1(h3), "ln": m.ln(hl), "ln_nb": m.ln_nb(hl), "ln_na": m.ln_na(hl),
        "emb": m.emb(idx), "emb_neg": m.emb_neg(idx),
    }  # fmt: skip


def loss(m, x4, x3, xu, xl, idx, **cts):
    total = 0.0
    for name, out in outputs(m, x4, x3, xu, xl, idx).items():
        aot.capture(name, out)
        total = total + ops.sum(out * cts["ct_" + name])
    return total


INPUTS = {"x4": aot.f32(*X4), "x3": aot.f32(*X3), "xu": aot.f32(*XU), "xl": aot.f32(*XL), "idx": aot.i32(*IDX)}
INPUTS.update({"ct_" + k: aot.f32(*s) for k, s in OUTS.items()})


def program(kernels):
    return aot.Program(
        f"nn_norms_{kernels}", model=Norms, train=aot.Train(loss, inputs=INPUTS, optimizer=aot.optim.Adam(lr=1e-2)), seed=4
    )


class TorchNorms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        N = torch.nn
        self.s4, self.s3, self.sl = (N.Parameter(torch.ones(s)) for s in (X4, X3, XL))
        self.gn = N.GroupNorm(3, 6)
        self.gn1 = N.GroupNorm(1, 6, affine=False, eps=1e-3)
        self.inorm = N.InstanceNorm2d(6, affine=True)
        self.inorm_plain = N.InstanceNorm2d(6)
        self.in1 = N.InstanceNorm1d(4, affine=True, eps=1e-4)
        self.ln = N.LayerNorm((3, 4))
        self.ln_nb = N.LayerNorm(4, bias=False)
        self.ln_na = N.LayerNorm(4, elementwise_affine=False)
        self.emb = N.Embedding(7, 5, padding_idx=2)
        self.emb_neg = N.Embedding(7, 5, padding_idx=-1)


def torch_loss(t, b):
    h4, h3, hl = b["x4"] * t.s4, b["x3"] * t.s3, b["xl"] * t.sl
    idx = b["idx"].long()
    outs = {
        "gn": t.gn(h4), "gn1": t.gn1(h4), "inorm": t.inorm(h4), "inorm_plain": t.inorm_plain(h4),
        "inorm_u": t.inorm(b["xu"]), "in1": t.in1(h3), "ln": t.ln(hl), "ln_nb": t.ln_nb(hl), "ln_na": t.ln_na(hl),
        "emb": t.emb(idx), "emb_neg": t.emb_neg(idx),
    }  # fmt: skip
    return sum((o * b["ct_" + k]).sum() for k, o in outs.items()), outs


def batches(n, seed=0):
    r = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        b = {"x4": r.normal(1.0, 2.0, X4), "x3": r.normal(size=X3), "xu": r.normal(size=XU), "xl": r.normal(size=XL)}
        b = {k: v.astype(np.float32) for k, v in b.items()}
        b["idx"] = r.integers(0, 7, IDX).astype(np.int32)
        b["idx"][0, :2] = (2, 6)  # both padding rows are read every step
        b.update({"ct_" + k: r.normal(size=s).astype(np.float32) for k, s in OUTS.items()})
        out.append(b)
    return out


@pytest.fixture(scope="module", params=["gpu", "cpu"])
def model(request):
    m = aot.compile(program(request.param), kernels=request.param)
    yield m
    m.close()


def test_norms_and_embedding_train_like_torch(model):
    """Forward values, gradients, 10 Adam steps: losses and every parameter, against torch."""
    tmod = randomize(torch, TorchNorms(), seed=1)
    train_side_by_side(torch, model, tmod, torch_loss, batches(10))


def test_embedding_padding_row_starts_at_zero_and_never_moves(model):
    model.reset()
    w = model.params()
    for name, pad in (("emb.W", 2), ("emb_neg.W", 6)):
        assert np.all(w[name][pad] == 0), name
        assert np.all(np.delete(w[name], pad, axis=0) != 0), name  # the rest keeps its random init
    tmod = randomize(torch, TorchNorms(), seed=2)  # a nonzero padding row is kept, as torch keeps it
    model.load_state_dict(tmod.state_dict())
    before = model.params()
    for b in batches(3, seed=5):
        model.step(**b)
        for name, pad in (("emb.W", 2), ("emb_neg.W", 6)):
            assert np.all(model.grads()[name][pad] == 0), name
    after = model.params()
    for name, pad in (("emb.W", 2), ("emb_neg.W", 6)):
        np.testing.assert_array_equal(after[name][pad], before[name][pad])
        assert not np.allclose(after[name], before[name])  # the other rows did train


def test_state_dict_uses_torch_names(model):
    assert sorted(model.state_dict()) == sorted(TorchNorms().state_dict())
    table = model.PROGRAM["torch"]
    assert table["gn.weight"] == ("gn.weight", "GroupNorm", False)
    assert table["ln.g"] == ("ln.weight", "LayerNorm", False)
    assert table["inorm.bias"] == ("inorm.bias", "InstanceNorm2d", False)


# ---- shapes and errors (tracing only: nothing is compiled) ------------------------------------


def _trace(make, fn, **inputs):
    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.m = make()

    prog = aot.Program("nn_norm_err", model=M, infer={"f": aot.Infer(lambda m, **kw: fn(m.m, **kw), inputs=inputs)})
    return trace_program(prog)


@pytest.mark.parametrize(
    "make, fn, inputs, match",
    [
        (lambda: nn.GroupNorm(4, 6), None, {}, "num_channels 6 must be divisible by num_groups 4"),
        (lambda: nn.GroupNorm(2, 6), lambda m, x: m(x), {"x": aot.f32(2, 4, 3)}, r"expects 6 channels \(dim 1\)"),
        (lambda: nn.GroupNorm(2, 6), lambda m, x: m(x), {"x": aot.f32(6)}, r"expects \[N, 6, \*\]"),
        (lambda: nn.InstanceNorm2d(3, affine=True), lambda m, x: m(x), {"x": aot.f32(2, 3, 4)}, "expects 3 channels"),
        (lambda: nn.InstanceNorm2d(3), lambda m, x: m(x), {"x": aot.f32(1, 2, 3, 4, 4)}, "expects .N, C, 2 spatial"),
        (lambda: nn.LayerNorm((3, 4)), lambda m, x: m(x), {"x": aot.f32(2, 4, 3)}, r"normalized_shape \[3, 4\]"),
        (lambda: nn.LayerNorm(0), None, {}, "normalized_shape must be a positive int"),
        (lambda: nn.Embedding(5, 3, padding_idx=5), None, {}, r"padding_idx must be an int in \[-5, 5\)"),
        (lambda: nn.Embedding(5, 3, dim=3), None, {}, "pass embedding_dim or dim .its older name., not both"),
        (lambda: nn.LayerNorm(), None, {}, "missing the argument normalized_shape"),
    ],
)
def test_bad_arguments_and_shapes_raise_shape_errors(make, fn, inputs, match):
    with pytest.raises(aot.ShapeError, match=match):  # fn None: the constructor refuses
        _trace(make, fn or (lambda m, x: x), **(inputs or {"x": aot.f32(1)}))


def test_group_and_instance_norm_fuse_like_layer_norm():
    """The same graph around GroupNorm, InstanceNorm2d or a LayerNorm over (C, H, W): the norms are
    row kernels, so their forward and backward take no more kernels or GPU dispatches than
    LayerNorm's (`python -m aot inspect` prints these counts)."""
    from aot.pipeline import compile_program

    norms = {
        "ln": lambda: nn.LayerNorm((4, 3, 3)),
        "gn": lambda: nn.GroupNorm(2, 4),
        "in": lambda: nn.InstanceNorm2d(4, affine=True),
    }

    class M(aot.Module):
        def __init__(self, kind):
            super().__init__()
            self.s = self.param((8, 4, 3, 3))
            self.n = norms[kind]()

    def counts(kind):
        loss = lambda m, x: ops.mean(ops.square(m.n(x * m.s)) * x)  # noqa: E731
        train = aot.Train(loss, inputs={"x": aot.f32(8, 4, 3, 3)}, optimizer=aot.optim.SGD(lr=0.1))
        c = compile_program(aot.Program(f"fuse_{kind}", model=lambda: M(kind), train=train))
        return len(c.kernels["train"]), len(c.dispatches["train"])

    ln, gn, inorm = counts("ln"), counts("gn"), counts("in")
    for got in (gn, inorm):  # (kernels, dispatches), each no more than LayerNorm's
        assert got[0] <= ln[0] and got[1] <= ln[1], (ln, gn, inorm)


def test_api_md_keyword_names_still_work():
    """API.md §2 named them Embedding(vocab, dim) and LayerNorm(dim, eps): keywords still taken."""

    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.e = nn.Embedding(vocab=5, dim=3)
            self.ln = nn.LayerNorm(dim=3, eps=1e-3)

    prog = aot.Program("nn_alias", model=M, infer={"f": aot.Infer(lambda m, i: m.ln(m.e(i)), inputs={"i": aot.i32(2)})})
    assert {p.name: p.shape for p in trace_program(prog).params} == {"e.W": (5, 3), "ln.g": (3,), "ln.b": (3,)}
