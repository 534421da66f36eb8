"""Fuzz reproducer (compile): aot.compile.

CodegenError: kernel k000_fused_exp_add reads t0 from memory before it stores it (a fusion rule
    merged a reader that does not read element for element)

Expected values are float64 PyTorch autograd of the same graph (tests/fuzz_graphs.py).

Hand-reduced from the fuzzer's hazard-check failures (one family; fuzz seeds 100004, 100028,
100033, 100042, 100050 shrank to 2-3 ops each, e.g. where(take_along_axis(a, i, -2), t, b) with
t broadcast to a leading 1 dim, reshape(relu(p: f32[1]), ()), div(p: f32[1,1,1], log_softmax(q:
f32[2])), where(less(a: f32[], b: f32[1]), c: f32[1,1], d: f32[])). A value read with size-1
dims added or removed (f32[3] broadcast to f32[1,3] here) by a kernel that also stores it. At
e5846fa^ this compiled and the captured z was [[1.5, 1.5, 1.5]] (b alone: exp(a) read before it
was stored); since e5846fa the hazard check refuses it. Without aot.capture it compiles and is
right.
"""

import numpy as np
import pytest

import aot
from aot import nn, ops

P = {
    'a': np.array([0.5, -1.0, 0.25], dtype=np.float32),
    'b': np.array([1.5], dtype=np.float32).reshape(1, 1),
}
MODULE_PARAMS = {
}


class FuzzModel(aot.Module):
    def __init__(self):
        super().__init__()
        self.a = self.param((3,), init=aot.init.literal(P['a']))
        self.b = self.param((1, 1), init=aot.init.literal(P['b']))


def forward(m):
    y = ops.exp(m.a)
    z = ops.add(y, m.b)
    return [z]


def loss(m, z_ct):
    outs = forward(m)
    aot.capture('z', outs[0])
    total = ops.sum(outs[0] * z_ct)
    return total


program = aot.Program(
    'fuzz_compile_87f7225a',
    model=FuzzModel,
    train=aot.Train(loss, inputs={'z_ct': aot.f32(1, 3)}, optimizer=None),
    seed=0,
)


INPUTS = [
    {},
]
COTANGENTS = [
    {
        'z_ct': np.array([1.0, -0.5, 2.0], dtype=np.float32).reshape(1, 3),
    },
]
EXPECTED = [
    {
        'loss': 7.78283238348989,
        'outputs': {
            'z': np.array([3.14872127, 1.86787944, 2.78402542], dtype=np.float64).reshape(1, 3),
        },
        'grads': {
            'a': np.array([1.64872127, -0.183939721, 2.56805083], dtype=np.float64),
            'b': np.array([2.5], dtype=np.float64).reshape(1, 1),
        },
    },
]
ATOL = {'z': 0.000328, 'a': 0.000269, 'b': 0.00026}
LOSS_TOL = [0.00975]


def _check(got, want, atol, what):
    got = np.asarray(got)
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=atol, err_msg=what)


@pytest.mark.gpu
def test_fuzz_compile_87f7225a():
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
