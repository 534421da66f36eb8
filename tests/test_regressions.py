"""Regression tests for bugs found outside (issue 8): each minimal case runs on the GPU and is
checked against the NumPy reference and against closed-form values."""

from __future__ import annotations

import numpy as np
import pytest

import aot
from aot import ops

from gpu_harness import assert_all_close, make_program, run_both

B, I, K = 4, 2, 3


def _param_model(shape):
    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.x = self.param(shape)

    return M


@pytest.mark.parametrize(
    "fn,dfn,shape",
    [
        (lambda x: x * 3.5, lambda x: 3.5 * np.ones_like(x), (B, I)),
        (ops.exp, np.exp, (B, I)),
        (ops.tanh, lambda x: 1 - np.tanh(x) ** 2, (B, I)),
        (lambda x: x * 3.5, lambda x: 3.5 * np.ones_like(x), (B, I, 1)),
    ],
    ids=["mul", "exp", "tanh", "param_BI1"],
)
def test_fused_reduction_epilogue_gradient(fn, dfn, shape):
    """sum over a broadcast axis with a pointwise VJP as its epilogue: the epilogue must use the
    sum it just computed, not whatever `work` held before (it read 0, then the last step's)."""
    rng = np.random.default_rng(0)
    c = rng.normal(size=(B, I, K)).astype(np.float32)

    def loss(m, c):
        return ops.sum(ops.reshape(fn(m.x), (B, I, 1)) * c)

    program = aot.Program(
        "fused_epilogue", model=_param_model(shape),
        train=aot.Train(loss, inputs={"c": aot.f32(B, I, K)}, optimizer=None), seed=3,
    )
    model = aot.compile(program)
    try:
        x = model.params()["x"]
        want = (dfn(x.reshape(B, I)) * c.sum(-1)).reshape(shape)
        for step in range(3):  # the stale read showed the previous step's value from step 2 on
            c_t = c * (step + 1)
            model.step(c=c_t)
            np.testing.assert_allclose(model.grads()["x"], want * (step + 1), rtol=1e-5, atol=1e-6)
    finally:
        model.close()


def test_where_greater_broadcast_gradient():
    a = np.random.default_rng(1).normal(size=(2, 3, 1)).astype(np.float32)
    b = np.random.default_rng(2).normal(size=(3, 4)).astype(np.float32)

    def body(m, feeds):
        return {"o": ops.where(ops.greater(m.a, m.b), m.a * 2.0, m.b)}

    program, inputs, _ = make_program("where_greater", {"a": a, "b": b}, {}, body)
    [(gpu, ref)], _ = run_both(program, inputs)
    assert_all_close(gpu, ref, "where(greater(a, b), 2a, b)")
    ct = inputs["o_ct"]
    mask = (a > b)
    np.testing.assert_allclose(gpu.grads["a"], (2.0 * ct * mask).sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    assert np.any(gpu.grads["a"] != 0)


def test_build_and_compile_callable_many_times(tmp_path):
    """aot.build / aot.compile are functions however often and in whatever order they are called
    (the submodule aot/build.py once replaced the name aot.build after the first call)."""
    import runpy
    from pathlib import Path

    program = runpy.run_path(str(Path(__file__).resolve().parent.parent / "examples" / "sine_mlp.py"))["program"]
    for i in range(2):
        assert callable(aot.build) and callable(aot.compile)
        path = aot.build(program, tmp_path / f"o{i}")
        assert (path / "pyproject.toml").exists()
        model = aot.compile(program)
        model.close()
    assert callable(aot.build)


def test_hazard_check_names_the_kernel():
    """The check that runs on every build: a kernel that reads from memory a tensor it writes is a
    CodegenError naming the kernel (here: a reduction made to read its own result)."""
    from aot import codegen
    from aot.errors import CodegenError
    from aot.ir import tensor_names
    from aot.pipeline import compile_program

    def loss(m, c):
        return ops.sum(ops.reshape(m.x * 3.5, (B, I, 1)) * c)

    program = aot.Program(
        "hazard", model=_param_model((B, I)),
        train=aot.Train(loss, inputs={"c": aot.f32(B, I, K)}, optimizer=None),
    )
    c = compile_program(program)
    s, p = c.schedules["train"], c.plans["train"]
    names = tensor_names(s.graph)
    k = next(k for k in s.kernels if k.kind == "reduce")
    codegen.check_hazards("k_test", k, p, list(k.reads), names)  # what codegen itself checked: fine
    with pytest.raises(CodegenError, match="kernel k_test reads .* before it stores it"):
        codegen.check_hazards("k_test", k, p, list(k.reads) + [k.out], names)


class WithHead(aot.Module):
    """`head` is used only by the infer entry: the loss never reaches it (torch: grad is None)."""

    def __init__(self):
        super().__init__()
        self.w = self.param((8,), init=aot.init.randn(0.5))
        self.head = self.param((8,), init=aot.init.randn(0.5))  # decayed by default
        self.bias = self.param((1,), init=aot.init.zeros())


def _head_loss(m, x):
    return ops.mean(ops.square(x * m.w + m.bias - 1.0))


@pytest.mark.parametrize(
    "opt",
    [
        aot.optim.AdamW(lr=0.05, weight_decay=0.1),
        aot.optim.Adam(lr=0.05),
        aot.optim.SGD(lr=0.05, momentum=0.9, weight_decay=0.1),
        aot.optim.SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1, clip_grad_norm=0.5),
    ],
    ids=["adamw", "adam", "sgd_momentum", "sgd_nesterov_clip"],
)
def test_unreached_param_is_not_moved(opt):
    """torch.optim skips a param whose grad is None: no weight decay, no momentum. grads() reports zeros."""
    torch = pytest.importorskip("torch")
    program = aot.Program(
        "frozen_head", model=WithHead,
        train=aot.Train(_head_loss, inputs={"x": aot.f32(4, 8)}, optimizer=opt),
        infer={"predict": aot.Infer(lambda m, x: x * m.head, inputs={"x": aot.f32(4, 8)})},
        seed=5,
    )
    model = aot.compile(program)
    try:
        init = model.params()
        tp = {k: torch.nn.Parameter(torch.from_numpy(v.copy())) for k, v in init.items()}
        kw = dict(lr=0.05)
        if opt.kind == "sgd":
            groups = [{"params": [tp["w"], tp["head"]], "weight_decay": 0.1}, {"params": [tp["bias"]], "weight_decay": 0.0}]
            topt = torch.optim.SGD(groups, momentum=0.9, nesterov=opt.nesterov, **kw)
        else:
            wd = 0.1 if opt.kind == "adamw" else 0.0
            groups = [{"params": [tp["w"], tp["head"]], "weight_decay": wd}, {"params": [tp["bias"]], "weight_decay": 0.0}]
            topt = (torch.optim.AdamW if opt.kind == "adamw" else torch.optim.Adam)(groups, **kw)
        rng = np.random.default_rng(0)
        for _ in range(20):
            x = rng.normal(size=(4, 8)).astype(np.float32)
            model.step(x=x)
            topt.zero_grad()
            tl = ((torch.from_numpy(x) * tp["w"] + tp["bias"] - 1.0) ** 2).mean()
            tl.backward()
            assert tp["head"].grad is None
            if opt.clip_grad_norm:
                torch.nn.utils.clip_grad_norm_([tp["w"], tp["bias"]], opt.clip_grad_norm)
            topt.step()
        got = model.params()
        np.testing.assert_array_equal(got["head"], init["head"])  # bit for bit: never touched
        np.testing.assert_array_equal(model.grads()["head"], np.zeros(8, np.float32))
        for k in ("w", "bias"):
            np.testing.assert_allclose(got[k], tp[k].detach().numpy(), rtol=2e-4, atol=2e-6, err_msg=k)
    finally:
        model.close()


# ---- NaN and inf propagate as in PyTorch (API.md §6) -------------------------------------------

NAN_CASES = {
    "relu": (lambda x: ops.relu(x), lambda t, x: t.relu(x)),
    "maximum": (lambda x: ops.maximum(x, x * 0.5), lambda t, x: t.maximum(x, x * 0.5)),
    "minimum_scalar": (lambda x: ops.minimum(x, 0.25), lambda t, x: t.minimum(x, t.tensor(0.25))),
    "tanh": (lambda x: ops.tanh(x), lambda t, x: t.tanh(x)),
    "max_rows": (lambda x: ops.max(x, axis=-1), lambda t, x: t.amax(x, dim=-1)),
    "max_all": (lambda x: ops.max(x), lambda t, x: t.amax(x)),
    "softmax": (lambda x: ops.softmax(x, -1), lambda t, x: t.softmax(x, -1)),
    "gelu_tanh": (lambda x: ops.gelu(x, approximate="tanh"), lambda t, x: t.nn.functional.gelu(x, approximate="tanh")),
}


def _nan_input(shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[1], flat[7 % flat.size], flat[-2] = np.nan, np.inf, -np.inf
    return x


@pytest.mark.parametrize("shape", [(3, 5), (2, 300)], ids=["short_rows", "long_rows"])
def test_nan_and_inf_propagate_like_torch(shape):
    """Forward values with NaN/inf inputs on the GPU equal torch's (NaN where torch has NaN)."""
    torch = pytest.importorskip("torch")
    x = _nan_input(shape, 0)

    def body(m, feeds):
        return {k: f(feeds["x"]) for k, (f, _) in NAN_CASES.items()}

    program, inputs, _ = make_program("nan_fwd", {}, {"x": x}, body)
    model = aot.compile(program)
    try:
        got = model.step(**inputs, captures=True).captures
    finally:
        model.close()
    tx = torch.from_numpy(x.astype(np.float64))
    for k, (_, tf) in NAN_CASES.items():
        want = tf(torch, tx).numpy()
        np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=k)
        assert np.array_equal(np.isnan(got[k]), np.isnan(want)), k


@pytest.mark.parametrize("n", [5, 300], ids=["sequential", "per_workgroup"])
def test_argmax_picks_the_first_nan_like_torch(n):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).normal(size=(4, n)).astype(np.float32)
    x[0, n // 2] = np.nan
    x[0, n - 1] = np.nan
    x[1, n - 1] = np.inf
    x[2, :] = np.nan
    prog = aot.Program(
        "nan_argmax", model=_param_model((1,)),
        infer={"predict": aot.Infer(lambda m, x: ops.argmax(x, axis=-1), inputs={"x": aot.f32(4, n)})},
    )
    model = aot.compile(prog)
    try:
        got = model.predict(x=x)
    finally:
        model.close()
    np.testing.assert_array_equal(got, torch.argmax(torch.from_numpy(x), dim=-1).numpy().astype(np.int32))


def test_nan_input_gives_nan_loss_not_a_silently_dead_model():
    """One NaN in an input: the loss is NaN (relu no longer maps it to 0), as in torch."""
    from aot import nn

    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(3, 8)
            self.l2 = nn.Linear(8, 1)

    def loss(m, x):
        return ops.mean(m.l2(ops.relu(m.l1(x))))

    prog = aot.Program("nan_loss", model=M, train=aot.Train(loss, inputs={"x": aot.f32(4, 3)}, optimizer=None))
    model = aot.compile(prog)
    try:
        x = np.ones((4, 3), np.float32)
        assert np.isfinite(model.step(x=x))
        x[2, 1] = np.nan
        assert np.isnan(model.step(x=x))
    finally:
        model.close()
