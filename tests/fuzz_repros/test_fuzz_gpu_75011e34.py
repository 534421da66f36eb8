"""Fuzz reproducer (gpu): step 1: output v1.

2/2 elements off (max error 0.12); at (0, 0, 0, 0): got -2.12, expected -2

Expected values are float64 PyTorch autograd of the same graph (tests/fuzz_graphs.py).

Found by scripts/fuzz.py at seed 600016 (fuzz_graphs.generate(600016)), then shrunk.

With an optimizer, aot.capture of a parameter or of a view of one (here a reshape; also the
parameter itself or a narrow) returns the parameter after this step's in-place SGD update
(-2.12 = -2 - 0.1 * 1.2), not the value the forward pass used. A computed value (p * 1.0) is
captured right. Found on 7f0be75.
"""

import numpy as np
import pytest

import aot
from aot import nn, ops

P = {
    'p0': np.array([-2.0, 2.0], dtype=np.float32).reshape(1, 2, 1),
}
MODULE_PARAMS = {
}


class FuzzModel(aot.Module):
    def __init__(self):
        super().__init__()
        self.p0 = self.param((1, 2, 1), init=aot.init.literal(P['p0']))


def forward(m):
    v1 = ops.reshape(m.p0, (1, 2, 1, 1))
    return [v1]


def loss(m, v1_ct):
    outs = forward(m)
    aot.capture('v1', outs[0])
    total = ops.sum(outs[0] * v1_ct)
    return total


program = aot.Program(
    'fuzz_gpu_75011e34',
    model=FuzzModel,
    train=aot.Train(loss, inputs={'v1_ct': aot.f32(1, 2, 1, 1)}, optimizer=aot.optim.SGD(lr=0.1)),
    seed=0,
)


INPUTS = [
    {},
]
COTANGENTS = [
    {
        'v1_ct': np.array([1.2, 0.2], dtype=np.float32).reshape(1, 2, 1, 1),
    },
]
EXPECTED = [
    {
        'loss': -2.000000089406967,
        'outputs': {
            'v1': np.array([-2.0, 2.0], dtype=np.float64).reshape(1, 2, 1, 1),
        },
        'grads': {
            'p0': np.array([1.20000005, 0.200000003], dtype=np.float64).reshape(1, 2, 1),
        },
        'params': {
            'p0': np.array([-2.12, 1.98], dtype=np.float32).reshape(1, 2, 1),
        },
    },
]
ATOL = {'v1': 0.00021, 'p0': 0.00013, 'p0 after the update': 0.000222}
LOSS_TOL = [0.0029]
PREDICT_FIRST = True


def _check(got, want, atol, what):
    got = np.asarray(got)
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=atol, err_msg=what)


@pytest.mark.gpu
def test_fuzz_gpu_75011e34():
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
