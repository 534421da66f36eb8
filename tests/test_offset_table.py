"""The CPU kernel set's offset table holds at most one runtime slot (plan.OFFSETS_SLOT_WORDS).

A kernel reading more tensors than that (the optimizer's concat of a U-Net's 100 gradients)
made a table larger than the 256-byte slot the runtimes bind, and lavapipe refused the
dispatch ("bound with size 256 where the shader expects 400"). The starts past the slot are
written into the kernel's text (wgsl_expr.KernelContext.start): a direct regression test, with
a parameter count past the slot and the update checked on the CPU kernel set.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import aot
from aot import ops
from aot.frontend import trace_program
from aot.interp import Reference
from aot.pipeline import compile_program
from aot.plan import OFFSETS_SLOT_WORDS

N = OFFSETS_SLOT_WORDS + 10


class Many(aot.Module):
    def __init__(self):
        super().__init__()
        for i in range(N):
            setattr(self, f"p{i}", self.param((2,), init=aot.init.randn(1.0)))


def _loss(m, x):
    # each parameter's gradient is its own kernel's output: the update concatenates N of them
    return sum(ops.sum(ops.square(getattr(m, f"p{i}") * ops.reshape(ops.narrow(x, 0, i, 1), (2,)))) for i in range(N))


def _program():
    return aot.Program("many_offsets", model=Many, train=aot.Train(_loss, inputs={"x": aot.f32(N, 2)},
                                                                   optimizer=aot.optim.Adam(lr=0.1)))


def test_offset_tables_fit_the_slot():
    compiled = compile_program(_program())
    kernels = [k for ks in compiled.kernels.values() for k in ks]
    assert max(len(k.offsets_cpu) for k in kernels) == OFFSETS_SLOT_WORDS  # a full table, not a longer one
    full = [k for k in kernels if len(k.offsets_cpu) == OFFSETS_SLOT_WORDS]
    assert {max(int(i) for i in re.findall(r"\bat\.o(\d+)\b", k.wgsl_cpu)) for k in full} == {OFFSETS_SLOT_WORDS - 1}


@pytest.mark.gpu
def test_update_of_many_params_on_the_cpu_kernel_set():
    prog = _program()
    ref = Reference(trace_program(prog))
    model = aot.compile(prog, kernels="cpu")
    try:
        x = np.random.default_rng(0).normal(size=(N, 2)).astype(np.float32)
        for _ in range(2):
            assert model.step(x=x) == pytest.approx(ref.step(x=x), rel=1e-5)
        got = model.params()
        for name, want in ref.params.items():
            np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
    finally:
        model.close()
