"""Fuzz reproducer (compile): aot.compile.

CodegenError: kernel k000_fused_exp_sub reads t0 from memory before it stores it (a fusion rule
    merged a reader that does not read element for element)

Expected values are float64 PyTorch autograd of the same graph (tests/fuzz_graphs.py).

Hand-reduced from fuzz seed 1200288 (on bbe5440: swapaxes(max_pool2d(x, k=2), 2, -3) - 0.5, a
pool output f32[2,3,1,1] whose size-1 axes the swapaxes moves). A transpose that moves only
size-1 axes (f32[2,3,1] -> f32[2,1,3] here) keeps the flat order, like the reshapes and
broadcasts fixed in da6e52c, but the kernel that computes exp(p) and stores it for the capture
reads the transposed view from memory: the hazard check refuses the build. At e5846fa^ it built
and the captured z was -0.5 everywhere (exp(p) read as zeros; the loss was -1.75 instead of
18.05, and a replay after reset() differed). Also exp(swapaxes(sum(p, axis=2, keepdims=True), 1,
2)) without a capture, and test_fuzz_compile_8b9e1b9d.py (through SGD's update).
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


def forward(m):
    y = ops.exp(m.p)
    s = ops.swapaxes(y, 1, 2)
    z = ops.sub(s, 0.5)
    return [z]


def loss(m, z_ct):
    outs = forward(m)
    aot.capture('z', outs[0])
    total = ops.sum(outs[0] * z_ct)
    return total


program = aot.Program(
    'fuzz_compile_b649dd46',
    model=FuzzModel,
    train=aot.Train(loss, inputs={'z_ct': aot.f32(2, 1, 3)}, optimizer=None),
    seed=0,
)


INPUTS = [
    {},
]
COTANGENTS = [
    {
        'z_ct': np.array([1.0, -0.5, 2.0, 0.5, 1.5, -1.0], dtype=np.float32).reshape(2, 1, 3),
    },
]
EXPECTED = [
    {
        'loss': 18.053245748463716,
        'outputs': {
            'z': np.array([1.14872127, -0.132120559, 6.8890561, 3.98168907, 0.784025417, 0.10653066], dtype=np.float64).reshape(2, 1, 3),
        },
        'grads': {
            'p': np.array([1.64872127, -0.183939721, 14.7781122, 2.24084454, 1.92603813, -0.60653066], dtype=np.float64).reshape(2, 3, 1),
        },
    },
]
ATOL = {'z': 0.000704, 'p': 0.0015}
LOSS_TOL = [0.0184]
PREDICT_FIRST = False


def _check(got, want, atol, what):
    got = np.asarray(got)
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=atol, err_msg=what)


@pytest.mark.gpu
def test_fuzz_compile_b649dd46():
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
