"""Fuzz reproducer (compile): aot.compile.

CodegenError: kernel k000_fused_take_along_axis_where reads t0 from memory before it stores it
    (a fusion rule merged a reader that does not read element for element)

Expected values are float64 PyTorch autograd of the same graph (tests/fuzz_graphs.py).

Found by scripts/fuzz.py at seed 100004 (the generator of commit 5025f12), then shrunk.

Same family as test_fuzz_compile_87f7225a.py: take_along_axis's result t (f32[2,3,5]) is read
broadcast to f32[1,2,3,5] by the where that also stores it (captured). At e5846fa^ this compiled
and the captured output was wrong; since e5846fa the hazard check refuses it.
"""

import numpy as np
import pytest

import aot
from aot import nn, ops

P = {
    'p11': np.array([
        0.9, -1.6, 0.7, -1.9, -1.8, 1.0, 1.1, -1.0, 1.5, 0.6, 1.7, 0.6, 1.8, 0.3, 1.8, 0.5, 0.7, -0.2,
        -0.2, 1.5, -1.8, 0.9, 0.2, -1.1, 0.0, -1.2, -1.7, 1.6, -0.7, -1.5
    ], dtype=np.float32).reshape(1, 2, 3, 5),
    'v6': np.array([-1.6, -1.6, -1.6, -1.6, -1.6, -1.6, -1.6, -1.6, -1.6, -1.6], dtype=np.float32).reshape(2, 1, 5),
}
MODULE_PARAMS = {
}


class FuzzModel(aot.Module):
    def __init__(self):
        super().__init__()
        self.p11 = self.param((1, 2, 3, 5), init=aot.init.literal(P['p11']))
        self.v6 = self.param((2, 1, 5), init=aot.init.literal(P['v6']))


def forward(m, i7):
    v8 = ops.take_along_axis(m.v6, i7, -2)
    v12 = ops.where(v8, v8, m.p11)
    return [v12]


def loss(m, i7, v12_ct):
    outs = forward(m, i7)
    aot.capture('v12', outs[0])
    total = ops.sum(outs[0] * v12_ct)
    return total


program = aot.Program(
    'fuzz_compile_a1220151',
    model=FuzzModel,
    train=aot.Train(loss, inputs={'i7': aot.i32(2, 3, 5), 'v12_ct': aot.f32(1, 2, 3, 5)}, optimizer=None),
    seed=0,
)


INPUTS = [
    {
        'i7': np.array([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], dtype=np.int32).reshape(2, 3, 5),
    },
]
COTANGENTS = [
    {
        'v12_ct': np.array([
            -1.0, 0.3, -0.6, -1.1, 1.4, -0.3, -1.3, -0.5, 1.0, -1.4, -0.1, 0.4, 1.3, 0.2, -0.8, -0.2, -1.0,
            0.3, 0.1, 0.4, -0.8, -1.6, -1.2, 0.4, 0.0, 0.2, 1.2, -0.1, 1.8, -0.4
        ], dtype=np.float32).reshape(1, 2, 3, 5),
    },
]
EXPECTED = [
    {
        'loss': 5.440000269412997,
        'outputs': {
            'v12': np.array([
                -1.60000002, -1.60000002, -1.60000002, -1.60000002, -1.60000002, -1.60000002, -1.60000002,
                -1.60000002, -1.60000002, -1.60000002, -1.60000002, -1.60000002, -1.60000002, -1.60000002,
                -1.60000002, -1.60000002, -1.60000002, -1.60000002, -1.60000002, -1.60000002, -1.60000002,
                -1.60000002, -1.60000002, -1.60000002, -1.60000002, -1.60000002, -1.60000002, -1.60000002,
                -1.60000002, -1.60000002
            ], dtype=np.float64).reshape(1, 2, 3, 5),
        },
        'grads': {
            'p11': np.array([
                0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
                0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
            ], dtype=np.float64).reshape(1, 2, 3, 5),
            'v6': np.array([
                -1.40000001, -0.599999934, 0.199999928, 0.0999999791, -0.800000012, -0.800000012, -1.39999998,
                -1.00000004, 2.29999996, 0.0
            ], dtype=np.float64).reshape(2, 1, 5),
        },
    },
]
ATOL = {'v12': 0.00017, 'p11': 1e-05, 'v6': 0.000246}
LOSS_TOL = [0.0343]


def _check(got, want, atol, what):
    got = np.asarray(got)
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=atol, err_msg=what)


@pytest.mark.gpu
def test_fuzz_compile_a1220151():
    model = aot.compile(program)
    try:
        if MODULE_PARAMS:
            model.load_params(MODULE_PARAMS, partial=True)
        for step, want in enumerate(EXPECTED):
            res = model.step(**INPUTS[step], **COTANGENTS[step], captures=True)
            assert abs(res.loss - want["loss"]) <= LOSS_TOL[step], f"step {step + 1}: loss {res.loss}, expected {want['loss']}"
            for name, value in want["outputs"].items():
                _check(res.captures[name], value, ATOL[name], f"step {step + 1}: output {name}")
            grads = model.grads()
            for name, value in want["grads"].items():
                _check(grads[name], value, ATOL[name], f"step {step + 1}: gradient of {name}")
            if "predict" in want:
                _check(model.predict(**INPUTS[step]), want["predict"], ATOL["predict"], f"step {step + 1}: predict")
    finally:
        model.close()
