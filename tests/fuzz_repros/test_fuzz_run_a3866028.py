"""Fuzz reproducer (run): step 1.

ValueError: step(): input 'i4' holds index 4, outside [0, 3) (nothing was run)

Expected values are float64 PyTorch autograd of the same graph (tests/fuzz_graphs.py).

Found by scripts/fuzz.py at seed 64086 (fuzz_graphs.generate(64086)), then shrunk.
"""

import numpy as np
import pytest

import aot
from aot import nn, ops

P = {
}
MODULE_PARAMS = {
}


class FuzzModel(aot.Module):
    def __init__(self):
        super().__init__()
        self.anchor = self.param((1,), init=aot.init.zeros())


def forward(m, i4):
    v6, v7, v8 = ops.split(i4, 1, axis=0)
    v14 = ops.one_hot(v7, 3)
    return [v14]


def loss(m, i4, v14_ct):
    outs = forward(m, i4)
    aot.capture('v14', outs[0])
    total = ops.sum(outs[0] * v14_ct)
    return total


program = aot.Program(
    'fuzz_run_a3866028',
    model=FuzzModel,
    train=aot.Train(loss, inputs={'i4': aot.i32(3), 'v14_ct': aot.f32(1, 3)}, optimizer=None),
    seed=0,
)


INPUTS = [
    {
        'i4': np.array([4, 0, 3], dtype=np.int32),
    },
]
COTANGENTS = [
    {
        'v14_ct': np.array([0.1, -0.1, 0.6], dtype=np.float32).reshape(1, 3),
    },
]
EXPECTED = [
    {
        'loss': 0.10000000149011612,
        'outputs': {
            'v14': np.array([1.0, 0.0, 0.0], dtype=np.float64).reshape(1, 3),
        },
        'grads': {},
    },
]
ATOL = {'v14': 0.00011}
LOSS_TOL = [0.0002]
PREDICT_FIRST = False
KERNELS = 'subgroup'  # the kernel set it failed with (run_gpu)


def _check(got, want, atol, what):
    got = np.asarray(got)
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=atol, err_msg=what)


@pytest.mark.gpu
def test_fuzz_run_a3866028():
    model = aot.compile(program, kernels=KERNELS)
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
