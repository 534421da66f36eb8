"""Activations, reductions and losses beyond API.md §2 at their edge values, against PyTorch.

The op table (tests/op_cases.py) checks these ops on smooth random inputs (finite differences,
float64 torch parity, GPU kernels). Here the inputs are the ones PyTorch gives special answers
for: 0, tiny and huge values, inf and NaN, kinks and ties (clamp at its bounds, hardswish at +-3),
zero vectors (norm, cosine_similarity), zeros in prod, -inf rows in logsumexp, probabilities of
exactly 0 and 1 (binary_cross_entropy's log clamp), ignored and all-ignored targets. Forward
values and gradients (cotangent 1) must match torch's, NaN where torch gives NaN:
- in float64 through the interpreter;
- on the adapter (lavapipe in CI) in float32, for both kernel sets, one compiled program each;
plus the shape and argument errors and the runtime's target check with ignore_index.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import aot
from aot import interp, ops
from aot.grad import append_grads
from aot.ir import Graph
from aot.trace import emit, tracing

torch = pytest.importorskip("torch")
F = torch.nn.functional

inf, nan = math.inf, math.nan
V = [0.0, 1e-30, -1e-7, 2.5, -2.5, 50.0, -50.0, 100.0, -100.0, inf, -inf, nan]
KINKS = [-3.0, 3.0, -4.0, 4.0, 0.0, 1.0, inf, -inf, nan]


def a(*v):
    return np.array(v, dtype=np.float64)


def _ix(*v):
    return np.array(v, dtype=np.int32)


# name -> (aot fn, torch fn, input arrays, indices of the differentiated inputs)
EDGE = {
    "leaky_relu": (lambda x: ops.leaky_relu(x, 0.1), lambda x: F.leaky_relu(x, 0.1), [a(*V)], (0,)),
    "elu": (ops.elu, F.elu, [a(*V)], (0,)),
    "softplus": (ops.softplus, F.softplus, [a(*V)], (0,)),
    "softplus_beta": (lambda x: ops.softplus(x, 2.0, 5.0), lambda x: F.softplus(x, 2.0, 5.0), [a(*V, 2.5, 2.4, 2.6)], (0,)),
    "mish": (ops.mish, F.mish, [a(*V)], (0,)),
    "hardswish": (ops.hardswish, F.hardswish, [a(*KINKS)], (0,)),
    "hardsigmoid": (ops.hardsigmoid, F.hardsigmoid, [a(*KINKS)], (0,)),
    "logsigmoid": (ops.logsigmoid, F.logsigmoid, [a(*V)], (0,)),
    "clamp_scalars": (lambda x: ops.clamp(x, -0.5, 1.0), lambda x: torch.clamp(x, -0.5, 1.0),
                      [a(-1.0, -0.5, 0.3, 1.0, 2.0, inf, -inf, nan)], (0,)),
    "clamp_min": (lambda x: ops.clamp(x, min=0.0), lambda x: torch.clamp(x, min=0.0), [a(-1.0, 0.0, 2.0, inf, -inf, nan)], (0,)),
    # ties at each bound, an inverted pair (3 > 1) and equal bounds
    "clamp_tensors": (ops.clamp, torch.clamp, [a(-1.0, -0.5, 0.3, 1.0, 2.0, 0.5, 0.0), a(-0.5, -0.5, -0.5, -0.5, 3.0, 0.5, 3.0),
                                               a(1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0)], (0, 1, 2)),
    "log1p": (ops.log1p, torch.log1p, [a(0.0, 1e-30, 1e-10, -1e-7, 0.3, -0.7, -1.0, -2.0, 1e30, inf, nan, 5.0, 1.0, -0.5)], (0,)),
    "expm1": (ops.expm1, torch.expm1, [a(0.0, 1e-30, -1e-10, 1e-7, -0.3, 0.49, 0.5, 88.0, 100.0, -100.0, inf, -inf, nan)], (0,)),
    # API.md §2's tanh, relatively accurate near 0 on the GPU as well (it was 1% off at 1e-6)
    "tanh_tiny": (ops.tanh, torch.tanh, [a(1e-20, 1e-8, -1e-6, 1e-4, 0.3, -2.0, 20.0, inf, -inf, nan)], (0,)),
    "logsumexp": (lambda x: ops.logsumexp(x, axis=1), lambda x: torch.logsumexp(x, 1),
                  [np.array([[-inf, -inf, -inf], [inf, 1.0, 2.0], [100.0, 100.0, -inf], [nan, 1.0, 2.0], [1e-30, 0.0, -1.0]])], (0,)),
    "var": (lambda x: ops.var(x, axis=1), lambda x: torch.var(x, 1), [np.array([[1.0, 1.0, 1.0], [1.0, 2.0, 4.0], [inf, 1.0, 1.0]])], (0,)),
    "std": (lambda x: ops.std(x, axis=1), lambda x: torch.std(x, 1), [np.array([[1.0, 1.0, 1.0], [1.0, 2.0, 4.0]])], (0,)),
    "min": (lambda x: ops.min(x, axis=1), lambda x: torch.amin(x, 1), [np.array([[1.0, nan, 0.0], [2.0, 2.0, 3.0], [-inf, 0.0, 1.0]])], (0,)),
    "prod": (lambda x: ops.prod(x, axis=1), lambda x: torch.prod(x, 1),
             [np.array([[0.0, 2.0, 3.0], [0.0, 0.0, 3.0], [inf, 0.0, 1.0], [1.0, 2.0, 3.0], [1e-30, 1e-30, 1e30]])], (0,)),
    "cumsum": (lambda x: ops.cumsum(x, 0), lambda x: torch.cumsum(x, 0), [a(1.0, inf, -inf, 2.0, nan, 3.0, 1e30)], (0,)),
    "norm2_zero": (lambda x: ops.norm(x, axis=1), lambda x: torch.linalg.vector_norm(x, dim=1),
                   [np.array([[0.0, 0.0, 0.0], [3.0, 4.0, 0.0], [1e-30, 0.0, 0.0]])], (0,)),
    "norm1_zero": (lambda x: ops.norm(x, 1, axis=1), lambda x: torch.linalg.vector_norm(x, 1, dim=1),
                   [np.array([[0.0, 0.0, 0.0], [3.0, -4.0, 0.0]])], (0,)),
    "norminf_zero": (lambda x: ops.norm(x, inf, axis=1), lambda x: torch.linalg.vector_norm(x, inf, dim=1),
                     [np.array([[0.0, 0.0, 0.0], [3.0, -4.0, 4.0]])], (0,)),
    "normhalf_zero": (lambda x: ops.norm(x, 0.5, axis=1), lambda x: torch.linalg.vector_norm(x, 0.5, dim=1),
                      [np.array([[0.0, 0.0, 0.0], [0.0, 1.0, -2.0]])], (0,)),
    "nll_all_ignored": (ops.nll_loss, lambda x, t: F.nll_loss(x, t.long()), [np.array([[-1.0, -2.0], [-0.5, -3.0]]), _ix(-100, -100)], (0,)),
    "nll_ignored_weight": (lambda x, t, w: ops.nll_loss(x, t, w, ignore_index=1), lambda x, t, w: F.nll_loss(x, t.long(), w, ignore_index=1),
                           [np.array([[-1.0, -2.0], [-0.5, -3.0], [-inf, 0.0]]), _ix(1, 0, 1), a(0.5, 2.0)], (0,)),
    "cross_entropy_neg_inf": (ops.cross_entropy, lambda x, t: F.cross_entropy(x, t.long()),
                              [np.array([[0.0, -inf, 1.0], [2.0, 0.0, -inf]]), _ix(0, 1)], (0,)),
    "cross_entropy_smooth_inf": (lambda x, t: ops.cross_entropy(x, t, label_smoothing=0.1),
                                 lambda x, t: F.cross_entropy(x, t.long(), label_smoothing=0.1),
                                 [np.array([[0.0, -inf, 1.0], [2.0, 0.0, 1.0]]), _ix(0, -100)], (0,)),
    "bce_edges": (lambda x, t: ops.binary_cross_entropy(x, t, reduction="none"), lambda x, t: F.binary_cross_entropy(x, t, reduction="none"),
                  [a(0.0, 1.0, 0.5, 0.0, 1e-30, 1.0), a(1.0, 0.0, 0.5, 0.0, 1.0, 1.0)], (0, 1)),
    "bce_logits_large": (lambda x, t: ops.binary_cross_entropy_with_logits(x, t, reduction="sum"),
                         lambda x, t: F.binary_cross_entropy_with_logits(x, t, reduction="sum"),
                         [a(100.0, -100.0, 0.0, 30.0, -30.0, 1e-30), a(0.0, 1.0, 0.5, 1.0, 0.0, 1.0)], (0, 1)),
    "bce_logits_pos_weight": (lambda x, t, p: ops.binary_cross_entropy_with_logits(x, t, reduction="none", pos_weight=p),
                              lambda x, t, p: F.binary_cross_entropy_with_logits(x, t, reduction="none", pos_weight=p),
                              [np.array([[100.0, -100.0], [0.0, -30.0]]), np.array([[0.0, 1.0], [0.5, 1.0]]), a(3.0, 0.5)], (0, 1)),
    # torch's target gradient at a zero target is NaN (xlogy); aot's is finite: only input's is compared
    "kl_zero_target": (lambda x, t: ops.kl_div(x, t, "batchmean"), lambda x, t: F.kl_div(x, t, reduction="batchmean"),
                       [np.array([[-1.0, -2.0, -0.5], [-1.0, -inf, 0.0]]), np.array([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])], (0,)),
    "cosine_zero": (ops.cosine_similarity, F.cosine_similarity,
                    [np.array([[0.0, 0.0, 0.0], [1.0, 2.0, 3.0], [1e-30, 0.0, 0.0]]), np.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])], (0, 1)),
    "smooth_l1_at_beta": (lambda x, t: ops.smooth_l1_loss(x, t, "none"), lambda x, t: F.smooth_l1_loss(x, t, reduction="none"),
                          [a(1.0, -1.0, 0.5, 0.0, inf), a(0.0, 0.0, 0.0, 0.0, 0.0)], (0, 1)),
    "huber_at_delta": (lambda x, t: ops.huber_loss(x, t, "none", 2.0), lambda x, t: F.huber_loss(x, t, reduction="none", delta=2.0),
                       [a(2.0, -2.0, 0.5, 0.0), a(0.0, 0.0, 0.0, 0.0)], (0, 1)),
    "l1_tie": (lambda x, t: ops.l1_loss(x, t, "none"), lambda x, t: F.l1_loss(x, t, reduction="none"), [a(1.0, 2.0), a(1.0, 3.0)], (0, 1)),
}


# absolute tolerances where torch itself rounds: sigmoid(30) - 1 in float64 is 1e-16 off
ATOL = {"bce_logits_large": 1e-15}


def _torch_side(name, dtype):
    fn, tfn, arrays, diff = EDGE[name]
    tin = []
    for i, v in enumerate(arrays):
        t = torch.tensor(v, dtype=dtype if v.dtype.kind == "f" else torch.int64)
        if i in diff:
            t.requires_grad_(True)
        tin.append(t)
    out = tfn(*tin)
    if diff:
        out.sum().backward()
    return out.detach().numpy(), [tin[i].grad.numpy() if tin[i].grad is not None else np.zeros(arrays[i].shape) for i in diff]


def _close(got, want, what, rtol, atol):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, torch {want.shape}"
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{what}: NaN at {np.isnan(got)}, torch at {np.isnan(want)}\n{got}\n{want}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


@pytest.mark.parametrize("name", list(EDGE))
def test_edge_values_match_torch_float64(name):
    fn, tfn, arrays, diff = EDGE[name]
    g = Graph(name)
    with tracing(g):
        xs = [emit("input", (), name=f"x{i}", shape=v.shape, dtype="f32" if v.dtype.kind == "f" else "i32") for i, v in enumerate(arrays)]
        out = fn(*xs)
        grads = append_grads(g, ops.sum(out), [xs[i] for i in diff]) if diff else []
    with np.errstate(all="ignore"):
        env = interp.run(g, {f"x{i}": v for i, v in enumerate(arrays)}, dtype=np.float64)
    want, want_grads = _torch_side(name, torch.float64)
    # aot's constants are f32 (1/6, 0.1, ...): ~1e-7 relative, as in test_grad's torch parity
    atol = ATOL.get(name, 1e-300)
    _close(env[id(out)], want, f"{name}: forward", 2e-7, atol)
    for i, gt, w in zip(diff, grads, want_grads):
        _close(env[id(gt)], w, f"{name}: gradient of input {i}", 2e-7, atol)


# ---- on the adapter, both kernel sets -------------------------------------------------------------


def _edge_program(kernels):
    from gpu_harness import make_program

    params, inputs, slots = {}, {}, {}
    for k, (name, (fn, tfn, arrays, diff)) in enumerate(EDGE.items()):
        names = []
        for i, v in enumerate(arrays):
            n = f"e{k}_x{i}"
            if v.dtype.kind != "f":
                inputs[n] = v
            elif i in diff:
                params[n] = v
            else:
                inputs[n] = v.astype(np.float32)
            names.append(n)
        slots[name] = names

    def body(m, feeds):
        return {f"e{k}": fn(*[getattr(m, n) if n in params else feeds[n] for n in slots[name]])
                for k, (name, (fn, *_)) in enumerate(EDGE.items())}

    cts = {f"e{k}": np.ones(np.shape(_torch_side(name, torch.float64)[0]), np.float32) for k, name in enumerate(EDGE)}
    program, inputs, _ = make_program(f"edge_{kernels}", params, inputs, body, cts=cts)
    return program, inputs, slots


def _near(got, want, rtol=2e-5, atol=1e-30):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    with np.errstate(invalid="ignore"):
        return (np.isnan(got) & np.isnan(want)) | (got == want) | (np.abs(got - want) <= atol + rtol * np.abs(want))


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["cpu", "gpu"])
def test_edge_values_on_the_adapter(kernels):
    pytest.importorskip("wgpu")
    program, inputs, slots = _edge_program(kernels)
    model = aot.compile(program, kernels=kernels)
    try:
        res = model.step(**inputs, captures=True)
        grads = model.grads()
    finally:
        model.close()
    bad = []
    for k, (name, (fn, tfn, arrays, diff)) in enumerate(EDGE.items()):
        want, want_grads = _torch_side(name, torch.float64)
        want32, want_grads32 = _torch_side(name, torch.float32)
        got = [res.captures[f"e{k}"]] + [grads[slots[name][i]] for i in diff]
        for what, g, w64, w32 in zip(["forward"] + [f"gradient of input {i}" for i in diff], got, [want] + want_grads,
                                     [want32] + want_grads32):
            # the float64 answer, or torch's own in float32 (underflow of x * x, say)
            ok = _near(g, w64) | _near(g, w32)
            if not ok.all():
                bad.append(f"{name}: {what}: at {np.argwhere(~ok).tolist()}\n got {g}\n float64 torch {w64}\n float32 torch {w32}")
    assert not bad, "\n\n".join(bad)


# ---- the runtime's target check with ignore_index ---------------------------------------------------


class _Logits(aot.Module):
    def __init__(self):
        super().__init__()
        self.w = self.param((6, 4), init=aot.init.literal(np.linspace(-1, 1, 24, dtype=np.float32).reshape(6, 4)))


def _ce_loss(m, targets):
    return ops.cross_entropy(m.w, targets, label_smoothing=0.1)


def test_ignored_targets_pass_the_runtime_check_and_others_do_not():
    """-100 (the default ignore_index) reaches the kernels and is not counted, as in torch; any
    other target outside [0, C) is refused before anything runs (step and step_many)."""
    prog = aot.Program("ce_ignore", model=_Logits, train=aot.Train(_ce_loss, inputs={"targets": aot.i32(6)}, optimizer=None))
    model = aot.compile(prog)
    try:
        t = np.array([0, -100, 3, 2, -100, 1], np.int32)
        w = torch.tensor(np.linspace(-1, 1, 24).reshape(6, 4), requires_grad=True)
        want = F.cross_entropy(w, torch.from_numpy(t).long(), label_smoothing=0.1)
        want.backward()
        np.testing.assert_allclose(model.step(targets=t), want.item(), rtol=1e-5)
        np.testing.assert_allclose(model.grads()["w"], w.grad.numpy(), rtol=1e-5, atol=1e-7)
        assert np.isnan(model.step(targets=np.full(6, -100, np.int32)))  # nothing counted: 0 / 0, as torch
        for bad, value in ((np.array([0, -100, 4, 2, 1, 1], np.int32), 4), (np.array([0, -1, 3, 2, 1, 1], np.int32), -1)):
            with pytest.raises(ValueError, match=rf"input 'targets' holds index {value}, outside \[0, 4\)"):
                model.step(targets=bad)
            with pytest.raises(ValueError, match=rf"holds index {value}, outside \[0, 4\)"):
                model.step_many(targets=np.stack([t, bad]))
        assert model.step_count == 2
        np.testing.assert_allclose(model.step_many(targets=np.stack([t, t])), [want.item()] * 2, rtol=1e-5)
    finally:
        model.close()


def test_ignore_index_inside_the_classes_keeps_every_check():
    """ignore_index=2 (a class): the targets are checked against [0, C) as before, 2 is skipped."""
    train = aot.Train(lambda m, targets: ops.cross_entropy(m.w, targets, ignore_index=2), inputs={"targets": aot.i32(6)}, optimizer=None)
    prog = aot.Program("ce_ignore2", model=_Logits, train=train)
    model = aot.compile(prog)
    try:
        t = np.array([0, 2, 3, 2, 1, 1], np.int32)
        want = F.cross_entropy(torch.tensor(np.linspace(-1, 1, 24).reshape(6, 4)), torch.from_numpy(t).long(), ignore_index=2)
        np.testing.assert_allclose(model.step(targets=t), want.item(), rtol=1e-5)
        with pytest.raises(ValueError, match=r"holds index -100, outside \[0, 4\)"):
            model.step(targets=np.array([0, -100, 3, 2, 1, 1], np.int32))
    finally:
        model.close()


# ---- argument and shape errors ----------------------------------------------------------------------


def _trace(fn, *specs):
    g = Graph("t")
    with tracing(g):
        xs = [emit("input", (), name=f"x{i}", shape=s, dtype=d) for i, (s, d) in enumerate(specs)]
        return fn(*xs)


F32_23, I32_2 = ((2, 3), "f32"), ((2,), "i32")


@pytest.mark.parametrize("fn, specs, message", [
    (lambda x, t: ops.nll_loss(x, t), [F32_23, ((3,), "i32")], r"nll_loss: target must have shape input.shape\[:-1\] = \[2\]"),
    (lambda x, t: ops.nll_loss(x, t), [F32_23, ((2,), "f32")], r"nll_loss: target must be i32 class indices"),
    (lambda x, t: ops.nll_loss(x, t, reduction="avg"), [F32_23, I32_2], r"nll_loss: reduction must be 'mean', 'sum' or 'none'"),
    (lambda x, t, w: ops.nll_loss(x, t, w), [F32_23, I32_2, ((2,), "f32")], r"nll_loss: weight must have one entry per class, shape \[3\]"),
    (lambda x, t: ops.cross_entropy(x, t, label_smoothing=1.5), [F32_23, I32_2], r"cross_entropy: label_smoothing must be in \[0.0, 1.0\]"),
    (lambda x, t: ops.cross_entropy(x, t, ignore_index=1.5), [F32_23, I32_2], r"cross_entropy: ignore_index must be an i32 int"),
    (lambda x, y: ops.binary_cross_entropy(x, y), [F32_23, ((3,), "f32")], r"binary_cross_entropy: target must have the input's shape \[2, 3\]"),
    (lambda x, y: ops.mse_loss(x, y), [F32_23, ((4,), "f32")], r"mse_loss: shapes \[2, 3\] and \[4\] do not broadcast"),
    (lambda x, y: ops.kl_div(x, y, "batch"), [F32_23, F32_23], r"kl_div: reduction must be .*'batchmean'"),
    (lambda x, y: ops.cosine_similarity(x, y, dim=2), [F32_23, F32_23], r"cosine_similarity: dim 2 is out of range"),
    (lambda x, y: ops.huber_loss(x, y, delta=0.0), [F32_23, F32_23], r"huber_loss: delta must be positive"),
    (lambda x: ops.clamp(x), [F32_23], r"clamp: at least one of min and max"),
    (lambda x: ops.clamp(x, min=inf), [F32_23], r"clamp: a bound of inf leaves no finite result"),
    (lambda x, t: ops.clamp(x, t), [F32_23, I32_2], r"clamp: min must be an f32 Tensor or a number"),
    (lambda x: ops.softplus(x, beta=0), [F32_23], r"softplus: beta must be nonzero"),
    (lambda x: ops.elu(x, alpha=nan), [F32_23], r"elu: alpha must be a finite number"),
    (lambda t: ops.log1p(t), [I32_2], r"log1p: expects an f32 operand"),
    (lambda x: ops.var(x, axis=1, correction=3), [F32_23], r"var: 3 element\(s\) per reduction minus correction=3 leaves no degrees"),
    (lambda x: ops.std(x, axis=0, dim=1), [F32_23], r"std: give axis or dim, not both"),
    (lambda x: ops.logsumexp(x, axis=2), [F32_23], r"logsumexp: axis 2 is out of range"),
    (lambda x: ops.cumsum(x), [F32_23], r"cumsum: axis must be an int"),
    (lambda x: ops.norm(x, p=-1), [F32_23], r"norm: p must be 0, a positive number, inf or -inf"),
    (lambda x: ops.prod(x, axis=(0, 0)), [F32_23], r"prod: repeated axis"),
])
def test_bad_arguments_raise_shape_errors_naming_the_op(fn, specs, message):
    with pytest.raises(aot.ShapeError, match=message) as e:
        _trace(fn, *specs)
    assert "test_math_ops.py" in str(e.value)  # the user's line


def test_identity_cases_and_torch_spellings():
    x = _trace(lambda x: (ops.clamp(x, min=-inf), x), F32_23)
    assert x[0] is x[1]  # an infinite bound in the harmless direction is no bound
    y = _trace(lambda x: ops.logsumexp(x, dim=1, keepdim=True), F32_23)
    assert y.shape == (2, 1)
    assert _trace(lambda x: ops.min(x, dim=0), F32_23).shape == (3,)


# ---- a compiler bug found while writing prod (fixed: schedule._merge_reader no longer merges a reader
# of a concat into the kernel that writes its pieces) ---------------------------------------------------


class _Six(aot.Module):
    def __init__(self):
        super().__init__()
        self.x = self.param((2, 3), init=aot.init.literal(np.arange(1, 7, dtype=np.float32).reshape(2, 3)))


def _halves_loss(m):
    # prod's first form: products of halves, the odd element concatenated, reduced to 0-d
    y = ops.reshape(m.x, (6,))
    y = ops.narrow(y, 0, 0, 3) * ops.narrow(y, 0, 3, 3)
    z = ops.concat([ops.narrow(y, 0, 0, 1) * ops.narrow(y, 0, 1, 1), ops.narrow(y, 0, 2, 1)], 0)
    return ops.sum(ops.reshape(ops.narrow(z, 0, 0, 1) * ops.narrow(z, 0, 1, 1), ()))


@pytest.mark.gpu
def test_concat_of_a_product_and_a_slice_reduced_to_0d():
    prog = aot.Program("halves", model=_Six, train=aot.Train(_halves_loss, inputs={}, optimizer=None))
    model = aot.compile(prog, kernels="cpu")
    try:
        assert model.step() == pytest.approx(720.0)
        x = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
        np.testing.assert_allclose(model.grads()["x"], 720.0 / x, rtol=1e-6)
    finally:
        model.close()
