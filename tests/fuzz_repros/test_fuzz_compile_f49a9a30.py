"""Fuzz reproducer (compile): aot.compile.

CodegenError: kernel k009_concat reads t8 from work[0:1], which overlaps t10 that it writes at
    work[0:2]

Expected values are float64 PyTorch autograd of the same graph (tests/fuzz_graphs.py).

Found by scripts/fuzz.py at seed 1200049 (fuzz_graphs.generate(1200049)), then shrunk (on bbe5440).

A regression of 60425d4 (it builds and is right at e34c947): v1 = log_softmax(p0) is an output
and a piece of v5 = concat([p4, v1]); the concat kernel copies v1 from work[0:1] into v5 at
work[0:2], so it would overwrite v1 while reading it, and the overlap check refuses the build.
The same with stack([cross_entropy(...), p7, p8]) (seed 1200133).
"""

import numpy as np
import pytest

import aot
from aot import nn, ops

P = {
    'p0': np.array([1.6], dtype=np.float32),
    'p4': np.array([1.6], dtype=np.float32),
}
MODULE_PARAMS = {
}


class FuzzModel(aot.Module):
    def __init__(self):
        super().__init__()
        self.p0 = self.param((1,), init=aot.init.literal(P['p0']))
        self.p4 = self.param((1,), init=aot.init.literal(P['p4']))


def forward(m):
    v1 = ops.log_softmax(m.p0, axis=0)
    v5 = ops.concat([m.p4, v1], axis=-1)
    v6 = ops.sum(v5, axis=0)
    return [v6, v1]


def loss(m, v6_ct, v1_ct):
    outs = forward(m)
    aot.capture('v6', outs[0])
    aot.capture('v1', outs[1])
    total = ops.sum(outs[0] * v6_ct)
    total = total + ops.sum(outs[1] * v1_ct)
    return total


def predict(m):
    outs = forward(m)
    return ops.concat([ops.reshape(outs[0], (-1,)), ops.reshape(outs[1], (-1,))], axis=0)


program = aot.Program(
    'fuzz_compile_f49a9a30',
    model=FuzzModel,
    train=aot.Train(loss, inputs={'v6_ct': aot.f32(), 'v1_ct': aot.f32(1)}, optimizer=None),
    infer={'predict': aot.Infer(predict, inputs={})},
    seed=0,
)


INPUTS = [
    {},
]
COTANGENTS = [
    {
        'v6_ct': np.array(0.1, dtype=np.float32),
        'v1_ct': np.array([0.4], dtype=np.float32),
    },
]
EXPECTED = [
    {
        'loss': 0.16000000476837162,
        'outputs': {
            'v6': np.array(1.60000002, dtype=np.float64),
            'v1': np.array([0.0], dtype=np.float64),
        },
        'grads': {
            'p0': np.array([0.0], dtype=np.float64),
            'p4': np.array([0.100000001], dtype=np.float64),
        },
        'predict': np.array([1.60000002, 0.0], dtype=np.float64),
    },
]
ATOL = {'v6': 0.00017, 'v1': 1e-05, 'p0': 1e-05, 'p4': 2e-05, 'predict': 0.00017}
LOSS_TOL = [0.00026]
PREDICT_FIRST = False


def _check(got, want, atol, what):
    got = np.asarray(got)
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=atol, err_msg=what)


@pytest.mark.gpu
def test_fuzz_compile_f49a9a30():
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
