"""Fuzz reproducer (gpu): step 1: gradient of a.

3/3 elements off (max error 2); at (0, 0): got 0, expected 1

Expected values are float64 PyTorch autograd of the same graph (tests/fuzz_graphs.py).

Hand-reduced from fuzz seed 700149 (run on 133195c; shrunk by the fuzzer to concat([p4, p5,
reshape(matmul(p0, p1), (20,))])). The gradient of a parameter concatenated with a matmul result
is all zeros, with or without aot.capture, with or without the reshape, whichever side the
matmul is on (concat([matmul, a]) too); concat([a, b, exp(x)]) and concat of parameters alone
are right. The forward output is right. Also wrong at e5846fa^.
"""

import numpy as np
import pytest

import aot
from aot import nn, ops

P = {
    'a': np.array([0.5, -1.0, 2.0], dtype=np.float32).reshape(1, 3),
    'x': np.array([1.0, 2.0, -1.0, 0.5], dtype=np.float32).reshape(2, 2),
    'w': np.array([0.5, 1.0, -1.5, 2.0, -0.5, 1.0], dtype=np.float32).reshape(2, 3),
}
MODULE_PARAMS = {
}


class FuzzModel(aot.Module):
    def __init__(self):
        super().__init__()
        self.a = self.param((1, 3), init=aot.init.literal(P['a']))
        self.x = self.param((2, 2), init=aot.init.literal(P['x']))
        self.w = self.param((2, 3), init=aot.init.literal(P['w']))


def forward(m):
    y = ops.matmul(m.x, m.w)
    z = ops.concat([m.a, y], axis=0)
    return [z]


def loss(m, z_ct):
    outs = forward(m)
    aot.capture('z', outs[0])
    total = ops.sum(outs[0] * z_ct)
    return total


program = aot.Program(
    'fuzz_gpu_06db3976',
    model=FuzzModel,
    train=aot.Train(loss, inputs={'z_ct': aot.f32(3, 3)}, optimizer=None),
    seed=0,
)


INPUTS = [
    {},
]
COTANGENTS = [
    {
        'z_ct': np.array([1.0, -2.0, 0.5, 0.5, 1.0, -1.0, 2.0, 0.0, 1.5], dtype=np.float32).reshape(3, 3),
    },
]
EXPECTED = [
    {
        'loss': 9.25,
        'outputs': {
            'z': np.array([0.5, -1.0, 2.0, 4.5, 0.0, 0.5, 0.5, -1.25, 2.0], dtype=np.float64).reshape(3, 3),
        },
        'grads': {
            'a': np.array([1.0, -2.0, 0.5], dtype=np.float64).reshape(1, 3),
            'x': np.array([2.75, -0.5, -1.25, 5.5], dtype=np.float64).reshape(2, 2),
            'w': np.array([-1.5, 1.0, -2.5, 2.0, 2.0, -1.25], dtype=np.float64).reshape(2, 3),
        },
    },
]
ATOL = {'z': 0.00046, 'a': 0.00021, 'x': 0.00056, 'w': 0.00026}
LOSS_TOL = [0.0103]
PREDICT_FIRST = False


def _check(got, want, atol, what):
    got = np.asarray(got)
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=atol, err_msg=what)


@pytest.mark.gpu
def test_fuzz_gpu_06db3976():
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
