"""The ops API.md §6 adds: `rand`, `randn`, `categorical` and `rope`.

rope is an ordinary composite: its forward, VJP (finite differences, full Jacobian), PyTorch
parity and GPU kernels run through the op table (tests/op_cases.py, `rope.*`); here it is
checked at a Llama-sized head against PyTorch in float32, and for its argument errors.

The random ops draw from the per-call seed input (`_rng`) hashed with a salt per op, like
dropout. One compiled program holds them all (module-scoped): a training entry that captures
its draws and two infer entries. Checked: statistics (mean, variance, tails), new draws at
every step and every infer call, the same draws for the same seed on two Models and different
ones for another seed, independence of two calls in one graph, the GPU against the
interpreter (uniforms bit for bit), categorical frequencies against softmax (a chi-square
bound), its i32 dtype and range, and that none of them passes a gradient.
"""

from __future__ import annotations

import numpy as np
import pytest

import aot
from aot import interp, ops
from aot.errors import ShapeError
from aot.frontend import trace_program
from aot.grad import append_grads
from aot.ir import Graph
from aot.trace import emit, tracing

from gpu_harness import reference_step

N_ROWS, N_COLS = 64, 512  # 32768 draws per tensor
LOGITS = np.array(
    [[0.0, 1.0, 2.0, -1.0, 0.5, -3.0],
     [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
     [5.0, -1e30, 4.0, 3.0, -1e30, 4.5],  # -1e30: masked classes are never drawn
     [-2.0, -2.5, 1.0, 0.2, 0.1, -0.3]],
    dtype=np.float32,
)
N_CAT = 2048  # samples per logits row and step


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


class Noise(aot.Module):
    def __init__(self):
        super().__init__()
        self.logits = self.param(LOGITS.shape, init=aot.init.literal(LOGITS))
        self.s = self.param((1,), init=aot.init.ones())


def noise_loss(m, x):
    u = aot.capture("u", ops.rand((N_ROWS, N_COLS)))
    z1 = aot.capture("z1", ops.randn((N_ROWS, N_COLS)))
    z2 = aot.capture("z2", ops.randn([N_ROWS, N_COLS]))
    k = aot.capture("k", ops.categorical(ops.broadcast_to(m.logits, (N_CAT,) + LOGITS.shape)))
    k0 = aot.capture("k0", ops.categorical(m.logits, axis=0))  # classes along the first axis
    drawn = ops.cast(k, "f32")
    return ops.mean((u + z1 * z2) * m.s) + ops.mean(drawn * m.s) + ops.sum(x)


def sample_fn(m, logits, temperature):
    return ops.categorical(logits / temperature)


def normal_fn(m, x):
    return ops.randn((4, 1000)) * m.s + x


PROGRAM = aot.Program(
    "new_ops_noise",
    model=Noise,
    train=aot.Train(noise_loss, inputs={"x": aot.f32(1)}, optimizer=None),
    infer={
        "sample": aot.Infer(sample_fn, inputs={"logits": aot.f32(N_CAT, 6), "temperature": aot.f32(1)}),
        "normal": aot.Infer(normal_fn, inputs={"x": aot.f32(1)}),
    },
    seed=11,
)
X = {"x": np.zeros(1, np.float32)}


@pytest.fixture(scope="module")
def noise():
    wgpu = pytest.importorskip("wgpu")
    if wgpu.gpu.request_adapter_sync(power_preference="high-performance") is None:
        pytest.skip("no WebGPU adapter")
    model = aot.compile(PROGRAM)
    steps = [model.step(**X, captures=True).captures for _ in range(2)]
    twin = type(model)(seed=11)
    other = type(model)(seed=12)
    try:
        yield model, steps, twin.step(**X, captures=True).captures, other.step(**X, captures=True).captures, (twin, other)
    finally:
        for m in (model, twin, other):
            m.close()


# ---- statistics ---------------------------------------------------------------------------


@pytest.mark.gpu
def test_rand_is_uniform_on_0_1(noise):
    _, steps, _, _, _ = noise
    for c in steps:
        u = c["u"]
        assert u.shape == (N_ROWS, N_COLS) and u.dtype == np.float32
        assert u.min() >= 0.0 and u.max() < 1.0
        # mean 1/2 and variance 1/12; 32768 draws: standard errors 0.0016 and 0.0005
        assert abs(u.mean() - 0.5) < 0.008 and abs(u.var() - 1 / 12) < 0.003
        hist = np.bincount((u * 16).astype(int).ravel(), minlength=16) / u.size
        assert np.all(np.abs(hist - 1 / 16) < 0.006), hist


@pytest.mark.gpu
def test_randn_is_standard_normal(noise):
    _, steps, _, _, _ = noise
    for c in steps:
        for name in ("z1", "z2"):
            z = c[name].astype(np.float64)
            assert np.all(np.isfinite(z))
            # standard errors: mean 0.0055, variance 0.0078
            assert abs(z.mean()) < 0.03 and abs(z.var() - 1.0) < 0.04, (name, z.mean(), z.var())
            assert abs(np.mean(np.abs(z) < 1.0) - 0.6827) < 0.012  # the bulk
            assert abs(np.mean(np.abs(z) > 2.0) - 0.0455) < 0.006  # the tails
            assert abs(np.mean(z**4) - 3.0) < 0.25  # kurtosis


@pytest.mark.gpu
def test_draws_are_new_every_step_and_independent_within_a_graph(noise):
    _, (s1, s2), _, _, _ = noise
    for name in ("u", "z1", "z2"):
        assert np.mean(s1[name] == s2[name]) < 0.01, f"{name}: step 2 repeats step 1"
    assert np.mean(s1["k"] == s2["k"]) < 0.9
    # two randn calls in one graph: uncorrelated (standard error of the correlation ~0.0055)
    for s in (s1, s2):
        assert abs(np.corrcoef(s["z1"].ravel(), s["z2"].ravel())[0, 1]) < 0.03
        assert abs(np.corrcoef(s["u"].ravel(), s["z1"].ravel())[0, 1]) < 0.03
    # and not shifted copies of each other (counter-based streams with nearby keys would share
    # almost every value; chance coincidences of float32 values are a few in 10**4)
    assert np.isin(s1["z1"], s1["z2"]).mean() < 0.01


@pytest.mark.gpu
def test_same_seed_same_draws_other_seed_other_draws(noise):
    _, (s1, _), twin, other, _ = noise
    for name in ("u", "z1", "z2", "k", "k0"):
        np.testing.assert_array_equal(twin[name], s1[name], err_msg=name)
    for name in ("u", "z1", "z2"):
        assert np.mean(other[name] == s1[name]) < 0.01, name


@pytest.mark.gpu
def test_gpu_draws_match_the_interpreter(noise):
    _, steps, _, _, _ = noise
    traced = trace_program(PROGRAM)
    for t, gpu in enumerate(steps, 1):
        ref = reference_step(traced, X, PROGRAM.seed, t).captures
        # the uniforms are integer hashes scaled by 2**-24: exact
        np.testing.assert_array_equal(gpu["u"], ref["u"])
        for name in ("z1", "z2"):  # log / sqrt / cos of the same uniforms
            np.testing.assert_allclose(gpu[name], ref[name], rtol=2e-5, atol=2e-5, err_msg=name)
        # Gumbel-max: only a near-tie decided by the last bit of a log may differ
        assert np.mean(gpu["k"] == ref["k"]) > 0.999
        np.testing.assert_array_equal(gpu["k0"], ref["k0"])


# ---- categorical ----------------------------------------------------------------------------


def _chi2(counts, p):
    keep = p > 0
    n = counts.sum()
    return float(np.sum((counts[keep] - n * p[keep]) ** 2 / (n * p[keep])))


@pytest.mark.gpu
def test_categorical_frequencies_follow_softmax(noise):
    _, steps, _, _, _ = noise
    k = np.concatenate([s["k"] for s in steps])  # [2 * N_CAT, 4]
    assert k.dtype == np.int32 and k.shape == (2 * N_CAT, 4)
    assert k.min() >= 0 and k.max() < 6
    p = softmax(LOGITS.astype(np.float64))
    for row in range(4):
        counts = np.bincount(k[:, row], minlength=6)
        assert np.all(counts[p[row] == 0] == 0), "a masked class was drawn"
        dof = int(np.sum(p[row] > 0)) - 1
        # chi-square with <= 5 degrees of freedom: P(chi2 > 30) < 2e-5
        assert _chi2(counts, p[row]) < 30, (row, counts, np.round(p[row] * counts.sum()))
        assert dof >= 3


@pytest.mark.gpu
def test_categorical_along_the_first_axis(noise):
    _, steps, _, _, _ = noise
    k0 = np.stack([s["k0"] for s in steps])
    assert k0.shape == (2, 6) and k0.dtype == np.int32
    assert k0.min() >= 0 and k0.max() < 4


@pytest.mark.gpu
def test_categorical_in_an_infer_entry(noise):
    model, _, _, _, (twin, _) = noise
    logits = np.tile(LOGITS[0], (N_CAT, 1))
    temp = np.array([0.5], np.float32)
    a = model.sample(logits=logits, temperature=temp)
    b = model.sample(logits=logits, temperature=temp)
    assert a.dtype == np.int32 and a.shape == (N_CAT,)
    assert np.mean(a == b) < 0.9, "every call draws anew"
    counts = np.bincount(np.concatenate([a, b]), minlength=6)
    assert _chi2(counts, softmax(LOGITS[0].astype(np.float64) / 0.5)) < 30, counts
    # calls are numbered per model: a fresh model with the same seed repeats the sequence
    fresh = type(model)(seed=11)
    try:
        np.testing.assert_array_equal(fresh.sample(logits=logits, temperature=temp), a)
    finally:
        fresh.close()


@pytest.mark.gpu
def test_randn_in_an_infer_entry_matches_the_interpreter(noise):
    model, _, _, _, _ = noise
    fresh = type(model)(seed=11)
    try:
        got = [fresh.normal(x=np.zeros(1, np.float32)) for _ in range(2)]
    finally:
        fresh.close()
    ref = interp.Reference(trace_program(PROGRAM), dtype=np.float32)
    want = [ref.predict("normal", x=np.zeros(1, np.float32)) for _ in range(2)]
    for g, w in zip(got, want):
        assert g.shape == (4, 1000) and abs(g.mean()) < 0.1 and abs(g.var() - 1) < 0.15
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
    assert np.mean(got[0] == got[1]) < 0.01


# ---- no gradients ----------------------------------------------------------------------------


def test_random_ops_pass_no_gradient():
    """d/dx sum(randn * x + rand * x) is the noise itself; categorical's logits get nothing."""
    g = Graph("t", meta={"kind": "train"})
    with tracing(g):
        x = emit("input", (), name="x", shape=(3, 5), dtype="f32")
        z, u = ops.randn(x.shape), ops.rand(x.shape)
        k = ops.categorical(x * 2.0)
        loss = ops.sum(z * x + u * x) + ops.sum(ops.cast(k, "f32"))
        (gx,) = append_grads(g, loss, [x])
    env = interp.run(g, {"x": np.ones((3, 5)), "_rng": np.int32(3)}, dtype=np.float64)
    np.testing.assert_allclose(env[id(gx)], env[id(z)] + env[id(u)], rtol=1e-12)
    assert env[id(k)].dtype == np.int32 and env[id(k)].shape == (3,)


def test_salts_are_allocated_per_call():
    g = Graph("t", meta={"kind": "infer"})
    with tracing(g):
        a, b = ops.rand((4,)), ops.rand((4,))
        ops.dropout(a, 0.5)  # the identity in an infer graph: draws nothing
        c = ops.randn((4,))
    salts = [n.attrs["salt"] for n in g.nodes if n.op == "rand"]
    assert salts == sorted(set(salts)) and len(salts) == 4  # rand, rand, randn's two uniforms
    assert a.node.attrs["salt"] != b.node.attrs["salt"] and c.dtype == "f32"
    assert sum(1 for n in g.nodes if n.op == "input") == 1, "one seed input per graph"


# ---- rope --------------------------------------------------------------------------------------


def test_rope_matches_torch_at_llama_head_size():
    """[B, H, T, Dh] = [2, 4, 64, 16] in float32 (tests/op_cases.py checks short sequences in float64)."""
    torch = pytest.importorskip("torch")
    from op_cases import t_rope

    g = Graph("t")
    with tracing(g):
        x = emit("input", (), name="x", shape=(2, 4, 64, 16), dtype="f32")
        y = ops.rope(x)
        y500 = ops.rope(x, base=500.0)
    xv = np.random.default_rng(0).normal(size=(2, 4, 64, 16)).astype(np.float32)
    env = interp.run(g, {"x": xv}, dtype=np.float32)
    for out, base in ((y, 10000.0), (y500, 500.0)):
        want = t_rope(torch, torch.from_numpy(xv), base).numpy()
        # angles up to 63 rad in float32: a few ulps of the angle
        np.testing.assert_allclose(env[id(out)], want, rtol=1e-4, atol=3e-5)
    # position 0 is not rotated; rotation keeps each pair's norm
    np.testing.assert_allclose(env[id(y)][:, :, 0], xv[:, :, 0], rtol=1e-6)
    h = 8
    norm = lambda v: v[..., :h] ** 2 + v[..., h:] ** 2  # noqa: E731
    np.testing.assert_allclose(norm(env[id(y)]), norm(xv), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "shape, kwargs, fragment",
    [
        ((4, 5), {}, "even D"),
        ((6,), {}, "even D"),
        ((4, 6), {"base": -1.0}, "base must be a positive number"),
    ],
)
def test_rope_rejects_bad_arguments(graph, shape, kwargs, fragment):
    x = emit("input", (), name="x", shape=shape, dtype="f32")
    with pytest.raises(ShapeError, match=fragment) as e:
        ops.rope(x, **kwargs)
    assert "test_new_ops.py" in str(e.value)


def test_random_op_argument_errors(graph):
    i = emit("input", (), name="i", shape=(3, 4), dtype="i32")
    with pytest.raises(ShapeError, match="categorical: expects an f32 operand"):
        ops.categorical(i)
    x = emit("input", (), name="x", shape=(3, 4), dtype="f32")
    with pytest.raises(ShapeError, match="axis 2 is out of range"):
        ops.categorical(x, axis=2)
    with pytest.raises(ShapeError, match="negative dim"):
        ops.randn((3, -1))
    with pytest.raises(ShapeError, match="shape must be"):
        ops.rand("abc")
    assert ops.rand(5).shape == (5,) and ops.randn(()).shape == ()
