"""Issue 33 (robust under real use), the compiler's side: long chains build without recursion and
in near-linear time, index arithmetic that would overflow u32 is refused or done in 64 bits,
kernels stay under an adapter's binding limits, concurrent builds, hostile names."""

from __future__ import annotations

import time

import numpy as np
import pytest

import aot
from aot import ops

CHAIN = 800  # past the ~600 fused ops where the recursive renderer hit RecursionError


def _chain(h, n, reshape_every=0):
    for i in range(n):
        h = ops.tanh(h) if i % 2 else h * 1.001
        if reshape_every and i % reshape_every == 0:
            h = ops.reshape(h, (2, 4) if h.shape == (8,) else (8,))
    return ops.reshape(h, (8,))


def _chain_np(h, n):
    hs = []
    for i in range(n):
        hs.append(h)
        h = np.tanh(h) if i % 2 else h * 1.001
    return h, hs


def _grad_np(x, w, n):
    out, hs = _chain_np(x * w, n)
    g = np.full_like(out, 1.0 / out.size)
    for i in reversed(range(n)):
        g = g * (1 - np.tanh(hs[i]) ** 2) if i % 2 else g * 1.001
    return g * x


class _W(aot.Module):
    def __init__(self):
        super().__init__()
        self.w = self.param((8,), init=aot.init.literal(np.linspace(0.5, 1.5, 8, dtype=np.float32)))


def test_long_fused_chain_builds_and_computes():
    """800 fused elementwise ops with reshapes between them (views rendered inline): the forward
    value and the gradient match NumPy; the recursive renderer raised RecursionError."""
    fwd = lambda m, x: _chain(x * m.w, CHAIN, reshape_every=7)  # noqa: E731
    program = aot.Program(
        "long_chain", model=_W,
        train=aot.Train(lambda m, x: ops.mean(fwd(m, x)), inputs={"x": aot.f32(8)}, optimizer=None),
        infer={"f": aot.Infer(fwd, inputs={"x": aot.f32(8)})},
    )
    model = aot.compile(program)
    try:
        x = np.linspace(-1, 1, 8, dtype=np.float32)
        w = model.params()["w"].astype(np.float64)
        np.testing.assert_allclose(model.f(x=x), _chain_np(x * w, CHAIN)[0], rtol=1e-4, atol=1e-5)
        model.step(x=x)
        np.testing.assert_allclose(model.grads()["w"], _grad_np(x.astype(np.float64), w, CHAIN), rtol=1e-3, atol=1e-6)
    finally:
        model.close()


@pytest.mark.slow
def test_20000_op_chain_builds_in_under_a_minute(tmp_path):
    """A 20,000-op training graph (40,000 with its gradient) builds in under a minute of CPU time:
    the fusion merge loop, the memory planner and the renderer were quadratic or worse (a
    4,000-op chain still compiling after 12 minutes). CPU time, not wall time: CI machines are shared."""
    program = aot.Program(
        "chain20k", model=_W,
        train=aot.Train(lambda m, x: ops.mean(_chain(x * m.w, 20000)), inputs={"x": aot.f32(8)}, optimizer=aot.optim.SGD(lr=0.1)),
    )
    t0 = time.process_time()
    aot.build(program, str(tmp_path))
    took = time.process_time() - t0
    assert took < 60, f"building a 20,000-op chain took {took:.1f} s of CPU time"


def test_fused_kernel_with_more_operands_than_an_offset_table_holds():
    """One elementwise kernel reading 70 tensors: the CPU set's offset table holds 64 (a 256-byte
    uniform slot), and the kernel used to build and then fail every call with a NumPy broadcast
    error; now its CPU variant has its offsets written in."""
    n = 70

    def f(m, **xs):
        total = xs["x0"]
        for i in range(1, n):
            total = total + xs[f"x{i}"] * float(i + 1)
        return total

    program = aot.Program("many_operands", model=_W, infer={"f": aot.Infer(f, inputs={f"x{i}": aot.f32(3) for i in range(n)})})
    feeds = {f"x{i}": np.full(3, 0.5 + i, np.float32) for i in range(n)}
    want = sum(feeds[f"x{i}"].astype(np.float64) * (i + 1) for i in range(n))
    for kernels in ("cpu", "gpu"):
        model = aot.compile(program, kernels=kernels)
        try:
            np.testing.assert_allclose(model.f(**feeds), want, rtol=1e-6)
        finally:
            model.close()
