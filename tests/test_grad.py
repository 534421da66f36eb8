"""Forward values and gradients of every op case (tests/op_cases.py), interpreted in float64.

- forward: `interp` against the case's direct NumPy formula, and the traced output shape
  and dtype against the formula's result (the good side of the shape rules);
- VJP: `append_grads` against central finite differences of the interpreted forward, by
  the dot-product identity <vjp(ct), d> = d/de <f(x + e d), ct> along a random direction
  for each differentiable input (JAX's check_vjp), plus a full Jacobian for tiny cases;
- PyTorch parity (CPU, float64) of forward values and gradients when torch is installed;
- autodiff driver rules: unused params get zero, repeated uses accumulate, nondiff ops
  (argmax, less, one_hot, stop_gradient) stop gradients, dropout's mask.
"""

from __future__ import annotations

import numpy as np
import pytest

import aot
from aot import interp, nn, ops
from aot.frontend import trace_program
from aot.grad import append_grads
from aot.ir import Graph
from aot.passes import verify
from aot.trace import emit, tracing

from op_cases import CASES, build, call_ref

EPS = 1e-5  # central differences in float64: truncation ~EPS**2, roundoff ~1e-16/EPS
JACOBIAN_MAX = 30  # full Jacobian when inputs and outputs each have at most this many elements

GRAD_CASES = [c for c in CASES if c.grad]
REF_CASES = [c for c in CASES if c.ref is not None]
TORCH_CASES = [c for c in CASES if c.torch is not None]


def ids(cases):
    return [c.name for c in cases]


def _loss(b, vals) -> float:
    env = interp.run(b.forward_graph, vals, dtype=np.float64)
    return float(env[id(b.loss)])


def _outs(b, vals) -> list[np.ndarray]:
    env = interp.run(b.forward_graph, vals, dtype=np.float64)
    return [env[id(o)] for o in b.outs]


def test_case_names_are_unique():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


@pytest.mark.parametrize("case", REF_CASES, ids=ids(REF_CASES))
def test_forward_matches_numpy(case):
    b = build(case)
    vals = b.sample(seed=1)
    got = _outs(b, vals)
    want = call_ref(case.ref, case, [vals[n] for n in b.names()])
    assert len(got) == len(want)
    for o, g, w in zip(b.outs, got, want):
        w = np.asarray(w)
        assert o.shape == w.shape, f"traced shape {o.shape}, NumPy gives {w.shape}"
        assert o.dtype == ("i32" if w.dtype.kind in "iub" else "f32")
        assert g.shape == w.shape
        if o.dtype == "i32":
            np.testing.assert_array_equal(g, w)
        else:
            # constants are stored as f32 even when the interpreter computes in float64
            np.testing.assert_allclose(g, w, rtol=2e-7, atol=1e-8)


@pytest.mark.parametrize("case", REF_CASES, ids=ids(REF_CASES))
def test_forward_float32(case):
    """The same graph run in float32 (the GPU's precision) stays close to the float64 formula."""
    b = build(case)
    vals = b.sample(seed=2)
    vals32 = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in vals.items()}
    env = interp.run(b.forward_graph, vals32, dtype=np.float32)
    want = call_ref(case.ref, case, [vals32[n].astype(np.float64) if vals32[n].dtype.kind == "f" else vals32[n] for n in b.names()])
    for o, w in zip(b.outs, want):
        g = env[id(o)]
        assert g.dtype == (np.int32 if o.dtype == "i32" else np.float32)
        np.testing.assert_allclose(g, np.asarray(w), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("case", GRAD_CASES, ids=ids(GRAD_CASES))
def test_vjp_matches_finite_differences(case):
    b = build(case)
    verify(b.graph, after="append_grads")
    vals = b.sample(seed=3)
    env = interp.run(b.graph, vals, dtype=np.float64)
    rng = np.random.default_rng(4)
    names = b.names()
    checked = 0
    for name, spec, gt in zip(names, b.specs, b.grads):
        if gt is None:
            continue
        assert gt.shape == spec.shape and gt.dtype == "f32"
        d = rng.normal(size=spec.shape)
        plus, minus = dict(vals), dict(vals)
        plus[name] = vals[name] + EPS * d
        minus[name] = vals[name] - EPS * d
        fd = (_loss(b, plus) - _loss(b, minus)) / (2 * EPS)
        vjp = float(np.sum(env[id(gt)] * d))
        assert vjp == pytest.approx(fd, rel=1e-6, abs=1e-7), f"input {name}: <vjp, d> = {vjp}, finite differences {fd}"
        checked += 1
    assert checked, "a grad=True case needs at least one differentiable input"


def _tiny(b) -> bool:
    n_in = sum(int(np.prod(s.shape)) for s, gt in zip(b.specs, b.grads) if gt is not None)
    n_out = sum(int(np.prod(c.shape)) for c in b.cts)
    return 0 < n_in <= JACOBIAN_MAX and 0 < n_out <= JACOBIAN_MAX


TINY_CASES = [c for c in GRAD_CASES if _tiny(build(c))]


@pytest.mark.parametrize("case", TINY_CASES, ids=ids(TINY_CASES))
def test_full_jacobian(case):
    """Rows from the VJP with one-hot cotangents; columns from central differences."""
    b = build(case)
    vals = b.sample(seed=5)
    ins = [(n, s) for n, s, gt in zip(b.names(), b.specs, b.grads) if gt is not None]
    grads = [gt for gt in b.grads if gt is not None]
    ct_names = [c.node.attrs["name"] for c in b.cts]
    out_sizes = [int(np.prod(c.shape)) for c in b.cts]
    in_sizes = [int(np.prod(s.shape)) for _, s in ins]
    n_out, n_in = sum(out_sizes), sum(in_sizes)

    j_vjp = np.zeros((n_out, n_in))
    for row in range(n_out):
        flat = np.zeros(n_out)
        flat[row] = 1.0
        v = dict(vals)
        for name, c, piece in zip(ct_names, b.cts, np.split(flat, np.cumsum(out_sizes)[:-1])):
            v[name] = piece.reshape(c.shape)
        env = interp.run(b.graph, v, dtype=np.float64)
        j_vjp[row] = np.concatenate([env[id(gt)].ravel() for gt in grads])

    j_fd = np.zeros((n_out, n_in))
    col = 0
    f32_outs = [o for o in b.outs if o.dtype == "f32"]
    for (name, spec), size in zip(ins, in_sizes):
        for k in range(size):
            plus, minus = dict(vals), dict(vals)
            e = np.zeros(size)
            e[k] = EPS
            plus[name] = vals[name] + e.reshape(spec.shape)
            minus[name] = vals[name] - e.reshape(spec.shape)
            ep = interp.run(b.forward_graph, plus, dtype=np.float64)
            em = interp.run(b.forward_graph, minus, dtype=np.float64)
            j_fd[:, col] = np.concatenate([(ep[id(o)] - em[id(o)]).ravel() for o in f32_outs]) / (2 * EPS)
            col += 1
    np.testing.assert_allclose(j_vjp, j_fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", TORCH_CASES, ids=ids(TORCH_CASES))
def test_matches_torch(case):
    # both sides compute in float64, but aot's constants are f32 (hence ~1e-7, not ~1e-15)
    torch = pytest.importorskip("torch")
    b = build(case)
    vals = b.sample(seed=6)
    env = interp.run(b.graph, vals, dtype=np.float64)
    tin = []
    for name, gt in zip(b.names(), b.grads):
        v = torch.from_numpy(np.array(vals[name]))
        if gt is not None:
            v.requires_grad_(True)
        tin.append(v)
    tout = case.torch(torch, *tin, **case.kwargs)
    tout = list(tout) if isinstance(tout, (list, tuple)) else [tout]
    assert len(tout) == len(b.outs)
    for o, t in zip(b.outs, tout):
        np.testing.assert_allclose(env[id(o)], t.detach().numpy(), rtol=2e-7, atol=1e-8, err_msg="forward")
    if not case.grad:
        return
    cts = iter(b.cts)
    tloss = 0.0
    for o, t in zip(b.outs, tout):
        if o.dtype == "f32":
            ct = next(cts)
            tloss = tloss + (t * torch.from_numpy(vals[ct.node.attrs["name"]])).sum()
    if isinstance(tloss, float) or not tloss.requires_grad:
        pytest.skip("torch output does not depend on the inputs")
    tloss.backward()
    for name, v, gt in zip(b.names(), tin, b.grads):
        if gt is None:
            continue
        want = v.grad.numpy() if v.grad is not None else np.zeros(v.shape)
        np.testing.assert_allclose(env[id(gt)], want, rtol=2e-7, atol=1e-8, err_msg=f"gradient of {name}")


# ---- autodiff driver rules ------------------------------------------------------------------


def _grad_of(fn, *shapes, seed=0):
    """Trace fn over f32 inputs, return (input values, gradients of fn's 0-d output) in float64."""
    g = Graph("t")
    with tracing(g):
        xs = [emit("input", (), name=f"x{i}", shape=s, dtype="f32") for i, s in enumerate(shapes)]
        loss = fn(*xs)
        grads = append_grads(g, loss, xs)
    verify(g)
    rng = np.random.default_rng(seed)
    vals = {f"x{i}": rng.uniform(-2, 2, s) for i, s in enumerate(shapes)}
    env = interp.run(g, vals, dtype=np.float64)
    return [vals[f"x{i}"] for i in range(len(shapes))], [env[id(gt)] for gt in grads]


class _TwoHeads(aot.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(3, 1)
        self.unused = nn.Linear(3, 2)
        self.scale = self.param((1,), init=aot.init.ones())


def test_param_that_does_not_reach_the_loss_gets_zero_gradient():
    def loss(m, x):
        return ops.mean(ops.square(m.used(x) * m.scale))

    program = aot.Program("heads", model=_TwoHeads, train=aot.Train(loss, inputs={"x": aot.f32(4, 3)}))
    traced = trace_program(program)
    g = traced.graphs["train"]
    verify(g)
    assert set(g.grads) == {"used.W", "used.b", "unused.W", "unused.b", "scale"}
    ref = interp.Reference(traced, dtype=np.float64)
    ref.step(x=np.random.default_rng(0).uniform(-1, 1, (4, 3)))
    for name in ("unused.W", "unused.b"):
        assert ref.last_grads[name].shape == g.grads[name].shape
        np.testing.assert_array_equal(ref.last_grads[name], 0.0)
    assert np.any(ref.last_grads["used.W"] != 0)


def test_repeated_uses_accumulate():
    (x,), (gx,) = _grad_of(lambda x: ops.sum(x * x + ops.sin(x) + x), (2, 3))
    np.testing.assert_allclose(gx, 2 * x + np.cos(x) + 1, rtol=1e-12)


def test_repeated_uses_through_broadcast_and_reduction_accumulate():
    # y = x[None] + x[:, None] uses x twice, broadcast along different axes
    def f(x):
        y = ops.broadcast_to(ops.reshape(x, (1, 3)), (3, 3)) + ops.broadcast_to(ops.reshape(x, (3, 1)), (3, 3))
        return ops.sum(y * y) + ops.mean(x)

    (x,), (gx,) = _grad_of(f, (3,))
    y = x[None, :] + x[:, None]
    np.testing.assert_allclose(gx, 2 * y.sum(0) + 2 * y.sum(1) + 1 / 3, rtol=1e-7)  # 1/3 is an f32 constant


def test_one_input_used_as_both_operands_of_matmul():
    (a,), (ga,) = _grad_of(lambda a: ops.sum(a @ a), (3, 3))
    ones = np.ones((3, 3))
    np.testing.assert_allclose(ga, ones @ a.T + a.T @ ones, rtol=1e-12)


def test_argmax_stops_gradients():
    (x,), (gx,) = _grad_of(lambda x: ops.sum(x * ops.cast(ops.argmax(x, -1, keepdims=True), "f32")), (2, 4))
    np.testing.assert_array_equal(gx, np.broadcast_to(np.argmax(x, -1)[:, None], x.shape).astype(np.float64))


def test_less_stops_gradients():
    (x, y), (gx, gy) = _grad_of(lambda x, y: ops.sum(x * ops.less(x, y)), (2, 3), (2, 3))
    np.testing.assert_array_equal(gx, (x < y).astype(np.float64))
    np.testing.assert_array_equal(gy, 0.0)


def test_one_hot_stops_gradients():
    (x,), (gx,) = _grad_of(lambda x: ops.sum(x * ops.one_hot(ops.argmax(x, -1), 4)), (3, 4))
    np.testing.assert_array_equal(gx, np.eye(4)[np.argmax(x, -1)])


def test_stop_gradient_blocks_its_path_only():
    (x,), (gx,) = _grad_of(lambda x: ops.sum(x * ops.stop_gradient(x)), (2, 3))
    np.testing.assert_allclose(gx, x, rtol=1e-12)


def test_loss_that_does_not_depend_on_the_input_gives_zero():
    (x,), (gx,) = _grad_of(lambda x: ops.sum(ops.stop_gradient(x) * 2.0), (2, 3))
    assert gx.shape == x.shape
    np.testing.assert_array_equal(gx, 0.0)


def _dropout_graph(kind, p, shape=(64, 32)):
    g = Graph("dropout", meta={"kind": kind})
    with tracing(g):
        x = emit("input", (), name="x", shape=shape, dtype="f32")
        y = ops.dropout(x, p)
        (gx,) = append_grads(g, ops.sum(y * 3.0), [x])
    return g, x, y, gx


def test_dropout_is_identity_outside_training():
    g, x, y, _ = _dropout_graph("infer", 0.5)
    assert y is x


def test_dropout_mask_scale_and_gradient():
    p = 0.25
    g, x, y, gx = _dropout_graph("train", p)
    verify(g)
    xv = np.random.default_rng(0).uniform(0.5, 2.0, x.shape)
    env = interp.run(g, {"x": xv, "_rng": np.int32(7)}, dtype=np.float64)
    kept = env[id(y)] != 0
    np.testing.assert_allclose(env[id(y)][kept], xv[kept] / (1 - p), rtol=1e-7)
    assert abs(1 - kept.mean() - p) < 0.05
    np.testing.assert_allclose(env[id(gx)], 3.0 * kept / (1 - p), rtol=1e-7)
    again = interp.run(g, {"x": xv, "_rng": np.int32(8)}, dtype=np.float64)
    assert np.any((again[id(y)] != 0) != kept), "a new step seed must give a new mask"


# ---- ties and kinks: PyTorch's subgradients (STYLE.md §4.3) -----------------------------------


def _grad_at(fn, value):
    g = Graph("t")
    with tracing(g):
        x = emit("input", (), name="x", shape=np.shape(value), dtype="f32")
        (gx,) = append_grads(g, fn(x), [x])
    return interp.run(g, {"x": np.asarray(value, dtype=np.float64)}, dtype=np.float64)[id(gx)]


def test_relu_and_abs_have_zero_gradient_at_zero():
    np.testing.assert_array_equal(_grad_at(lambda x: ops.sum(ops.relu(x)), [-1.0, 0.0, 2.0]), [0.0, 0.0, 1.0])
    np.testing.assert_array_equal(_grad_at(lambda x: ops.sum(ops.abs(x)), [-1.0, 0.0, 2.0]), [-1.0, 0.0, 1.0])


def test_max_ties_share_the_gradient():
    # torch.amax: equal maxima split the gradient evenly
    np.testing.assert_allclose(_grad_at(lambda x: ops.max(x), [1.0, 3.0, 3.0]), [0.0, 0.5, 0.5])
    np.testing.assert_allclose(
        _grad_at(lambda x: ops.sum(ops.max(x, -1) * ops.arange(2, "f32")), [[2.0, 2.0, 2.0], [0.0, 5.0, 5.0]]),
        [[0.0, 0.0, 0.0], [0.0, 0.5, 0.5]],
    )


def test_maximum_and_minimum_ties_split_evenly():
    x = [1.0, 2.0, 3.0]
    np.testing.assert_allclose(_grad_at(lambda x: ops.sum(ops.maximum(x, 2.0)), x), [0.0, 0.5, 1.0])
    np.testing.assert_allclose(_grad_at(lambda x: ops.sum(ops.minimum(x, 2.0)), x), [1.0, 0.5, 0.0])


def test_argmax_ties_pick_the_first():
    g = Graph("t")
    with tracing(g):
        x = emit("input", (), name="x", shape=(2, 3), dtype="f32")
        a, b = ops.argmax(x, -1), ops.argmax(x)
    env = interp.run(g, {"x": np.array([[1.0, 3.0, 3.0], [4.0, 4.0, 0.0]])})
    assert env[id(a)].tolist() == [1, 0] and int(env[id(b)]) == 3


def test_ties_match_torch():
    torch = pytest.importorskip("torch")
    v = [[1.0, 3.0, 3.0, 0.0], [-1.0, 0.0, 0.0, -2.0]]
    for fn, tfn in (
        (lambda x: ops.sum(ops.relu(x) * 3.0), lambda x: (torch.relu(x) * 3.0).sum()),
        (lambda x: ops.sum(ops.abs(x)), lambda x: x.abs().sum()),
        (lambda x: ops.max(x), lambda x: x.amax()),
        (lambda x: ops.sum(ops.max(x, -1)), lambda x: x.amax(-1).sum()),
        (lambda x: ops.sum(ops.maximum(x, 0.0)), lambda x: torch.maximum(x, torch.zeros(())).sum()),
    ):
        t = torch.tensor(v, dtype=torch.float64, requires_grad=True)
        tfn(t).backward()
        np.testing.assert_allclose(_grad_at(fn, v), t.grad.numpy(), rtol=1e-12)


def test_softmax_and_cross_entropy_are_stable_for_large_logits():
    g = Graph("t")
    with tracing(g):
        z = emit("input", (), name="z", shape=(2, 3), dtype="f32")
        t = emit("input", (), name="t", shape=(2,), dtype="i32")
        p, ce = ops.softmax(z), ops.cross_entropy(z, t)
        (gz,) = append_grads(g, ce, [z])
    zv = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1001.0, -999.0]], dtype=np.float32)
    env = interp.run(g, {"z": zv, "t": np.array([1, 0], dtype=np.int32)})
    want = [np.exp(r) / np.exp(r).sum() for r in ([0.0, 1.0, -1.0], [0.0, -1.0, 1.0])]
    np.testing.assert_allclose(env[id(p)], want, rtol=1e-5)
    assert np.isfinite(env[id(ce)]) and np.all(np.isfinite(env[id(gz)]))


def test_number_to_the_power_of_a_tensor(graph):
    x = emit("input", (), name="x", shape=(3,), dtype="f32")
    assert (2.0**x).shape == (3,)
