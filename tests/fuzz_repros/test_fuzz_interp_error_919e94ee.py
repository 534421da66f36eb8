"""Fuzz reproducer (interp-error): interpreter.

AttributeError: 'float' object has no attribute 'astype'

Expected values are float64 PyTorch autograd of the same graph (tests/fuzz_graphs.py).

Found by scripts/fuzz.py at seed 100039 (the generator of commit 5025f12), then shrunk.

The interpreter's erf (aot/ops/elementwise.py: np.frompyfunc(math.erf)) returns a Python float
for a 0-d array, which has no .astype: erf or gelu of any 0-d tensor crashes aot.interp.
The compiled package is right (the first test passes).
"""

import numpy as np
import pytest

import aot
from aot import nn, ops

P = {
    'v5': np.array(1.8, dtype=np.float32),
}
MODULE_PARAMS = {
}


class FuzzModel(aot.Module):
    def __init__(self):
        super().__init__()
        self.v5 = self.param((), init=aot.init.literal(P['v5']))


def forward(m):
    v8 = ops.erf(m.v5)
    return [v8]


def loss(m, v8_ct):
    outs = forward(m)
    aot.capture('v8', outs[0])
    total = ops.sum(outs[0] * v8_ct)
    return total


program = aot.Program(
    'fuzz_interp_error_919e94ee',
    model=FuzzModel,
    train=aot.Train(loss, inputs={'v8_ct': aot.f32()}, optimizer=None),
    seed=0,
)


INPUTS = [
    {},
]
COTANGENTS = [
    {
        'v8_ct': np.array(2.0, dtype=np.float32),
    },
]
EXPECTED = [
    {
        'loss': 1.9781809990570098,
        'outputs': {
            'v8': np.array(0.9890905, dtype=np.float64),
        },
        'grads': {
            'v5': np.array(0.0883834618, dtype=np.float64),
        },
    },
]
ATOL = {'v8': 0.000109, 'v5': 1.9e-05}
LOSS_TOL = [0.00208]


def _check(got, want, atol, what):
    got = np.asarray(got)
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=atol, err_msg=what)


@pytest.mark.gpu
def test_fuzz_interp_error_919e94ee():
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


def test_fuzz_interp_error_919e94ee_interpreter():
    from aot import interp
    from aot.frontend import trace_program

    ref = interp.Reference(trace_program(program))
    ref.params.update({k: np.asarray(v) for k, v in MODULE_PARAMS.items()})
    for step, want in enumerate(EXPECTED):
        loss = ref.step(**INPUTS[step], **COTANGENTS[step])
        assert abs(loss - want["loss"]) <= LOSS_TOL[step], f"step {step + 1}: loss {loss}, expected {want['loss']}"
        for name, value in want["grads"].items():
            _check(ref.last_grads[name], value, ATOL[name], f"step {step + 1}: gradient of {name}")
