"""Fuzz reproducer (compile): aot.compile.

CodegenError: kernel k002_fused_mul_sub_sum reads t10 from memory before it stores it (a fusion
    rule merged a reader that does not read element for element)

Expected values are float64 PyTorch autograd of the same graph (tests/fuzz_graphs.py).

Hand-reduced from fuzz seed 900111 (on 42a3b9d; still on c2dfbd2). v = transpose(p, (2, 0, 1))
moves only p's size-1 axis (f32[2,3,1] -> f32[1,2,3]), z = v * x broadcasts it over x:
f32[4,2,3]; with SGD the update kernel (p - lr * g, fused with the sum over the broadcast axis
that makes g) reads g's transposed view from memory instead of from registers, and the hazard
check refuses to build it. Without an optimizer, or with a transpose that moves a larger axis,
or a reshape, it builds. The size-1 family fixed in da6e52c, through a transpose.
"""

import numpy as np
import pytest

import aot
from aot import nn, ops

P = {
    'p': np.array([0.5, -1.0, 2.0, 1.5, 0.25, -0.5], dtype=np.float32).reshape(2, 3, 1),
}
MODULE_PARAMS = {
}


class FuzzModel(aot.Module):
    def __init__(self):
        super().__init__()
        self.p = self.param((2, 3, 1), init=aot.init.literal(P['p']))


def forward(m, x):
    v = ops.transpose(m.p, axes=(2, 0, 1))
    z = ops.mul(v, x)
    return [z]


def loss(m, x, z_ct):
    outs = forward(m, x)
    aot.capture('z', outs[0])
    total = ops.sum(outs[0] * z_ct)
    return total


program = aot.Program(
    'fuzz_compile_8b9e1b9d',
    model=FuzzModel,
    train=aot.Train(loss, inputs={'x': aot.f32(4, 2, 3), 'z_ct': aot.f32(4, 2, 3)}, optimizer=aot.optim.SGD(lr=0.1)),
    seed=0,
)


INPUTS = [
    {
        'x': np.array([
            0.0, 1.8, -1.4, 1.8, -0.8, -0.3, 1.3, -0.4, 0.2, -1.9, 1.0, 0.2, -0.7, 1.2, -0.8, -0.2, -1.5,
            -0.4, -1.2, -1.0, 1.0, -0.9, -0.1, 1.9
        ], dtype=np.float32).reshape(4, 2, 3),
    },
]
COTANGENTS = [
    {
        'z_ct': np.array([
            0.2, -0.5, -0.4, -2.4, 1.8, 1.1, -0.3, 0.8, 0.3, -0.6, 1.0, -0.3, -0.3, -0.8, 0.5, -0.1, 0.5,
            -0.6, 0.1, -0.9, 0.8, 0.2, 0.3, 0.4
        ], dtype=np.float32).reshape(4, 2, 3),
    },
]
EXPECTED = [
    {
        'loss': -2.4499999506398966,
        'outputs': {
            'z': np.array([
                0.0, -1.79999995, -2.79999995, 2.69999993, -0.200000003, 0.150000006, 0.649999976, 0.400000006,
                0.400000006, -2.84999996, 0.25, -0.100000001, -0.349999994, -1.20000005, -1.60000002,
                -0.300000004, -0.375, 0.200000003, -0.600000024, 1.0, 2.0, -1.34999996, -0.0250000004,
                -0.949999988
            ], dtype=np.float64).reshape(4, 2, 3),
        },
        'grads': {
            'p': np.array([-0.300000003, -1.28000006, 1.02000001, -3.34000002, -1.21999998, 0.609999991], dtype=np.float64).reshape(2, 3, 1),
        },
        'params': {
            'p': np.array([0.53, -0.872, 1.898, 1.834, 0.372, -0.561], dtype=np.float32).reshape(2, 3, 1),
        },
    },
]
ATOL = {'z': 0.000301, 'p': 0.000362, 'p after the update': 0.000207}
LOSS_TOL = [0.0172]
PREDICT_FIRST = True


def _check(got, want, atol, what):
    got = np.asarray(got)
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=atol, err_msg=what)


@pytest.mark.gpu
def test_fuzz_compile_8b9e1b9d():
    model = aot.compile(program)
    try:
        if MODULE_PARAMS:
            model.load_params(MODULE_PARAMS, partial=True)
        for step, want in enumerate(EXPECTED):
            if "predict" in want and PREDICT_FIRST:  # the parameters of this step, before its update
                _check(model.predict(**INPUTS[step]), want["predict"], ATOL["predict"], f"step {step + 1}: predict")
            res = model.step(**INPUTS[step], **COTANGENTS[step], captures=True)
            assert abs(res.loss - want["loss"]) <= LOSS_TOL[step], f"step {step + 1}: loss {res.loss}, expected {want['loss']}"
            for name, value in want["outputs"].items():
                _check(res.captures[name], value, ATOL[name], f"step {step + 1}: output {name}")
            grads = model.grads()
            for name, value in want["grads"].items():
                _check(grads[name], value, ATOL[name], f"step {step + 1}: gradient of {name}")
            params = model.params()
            for name, value in want.get("params", {}).items():
                _check(params[name], value, ATOL[name + " after the update"], f"step {step + 1}: {name} after the update")
            if "predict" in want and not PREDICT_FIRST:
                _check(model.predict(**INPUTS[step]), want["predict"], ATOL["predict"], f"step {step + 1}: predict")
    finally:
        model.close()
