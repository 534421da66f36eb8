"""Fuzz reproducer (compile): aot.compile.

CodegenError: kernel train_01_fused_mul_concat_cast reads t4 from memory before it stores it (a
    fusion rule merged a reader that does not read element for element)

Expected values are float64 PyTorch autograd of the same graph (tests/fuzz_graphs.py).

Found by scripts/fuzz.py at seed 9017 (fuzz_graphs.generate(9017)), then shrunk.
"""

import numpy as np
import pytest

import aot
from aot import nn, ops

P = {
    'p0': np.array([0.1, -1.7, -0.3, -1.3, 1.3, 0.7], dtype=np.float32).reshape(6, 1),
    'x2': np.array([-0.8, 0.8, 0.2, 1.2, -1.2, 0.5], dtype=np.float32).reshape(6, 1),
}
MODULE_PARAMS = {
}


class FuzzModel(aot.Module):
    def __init__(self):
        super().__init__()
        self.p0 = self.param((6, 1), init=aot.init.literal(P['p0']))
        self.x2 = self.param((6, 1), init=aot.init.literal(P['x2']))


def forward(m):
    v1 = ops.silu(m.p0)
    v3 = ops.stack([v1, m.x2], axis=1)
    v7 = ops.swapaxes(v3, 2, -3)
    v12 = nn.split_heads(v7, 6)
    v13 = ops.cast(v12, 'i32')
    v14 = ops.cast(v13, 'f32')
    return [v3, v14]


def loss(m, v3_ct, v14_ct):
    outs = forward(m)
    aot.capture('v3', outs[0])
    aot.capture('v14', outs[1])
    total = ops.sum(outs[0] * v3_ct)
    total = total + ops.sum(outs[1] * v14_ct)
    return total


program = aot.Program(
    'fuzz_compile_3e85a7bc',
    model=FuzzModel,
    train=aot.Train(loss, inputs={'v3_ct': aot.f32(6, 2, 1), 'v14_ct': aot.f32(1, 6, 2, 1)}, optimizer=aot.optim.SGD(lr=0.01, momentum=0.9)),
    seed=0,
)


INPUTS = [
    {},
]
COTANGENTS = [
    {
        'v3_ct': np.array([0.1, -0.1, 0.6, 0.1, -0.5, 0.4, 1.3, 0.9, -0.7, -1.3, -0.6, 0.0], dtype=np.float32).reshape(6, 2, 1),
        'v14_ct': np.array([0.5, -1.3, 0.3, 0.1, 0.0, -0.4, 0.0, -0.4, 0.9, -0.1, -1.7, 1.2], dtype=np.float32).reshape(1, 6, 2, 1),
    },
]
EXPECTED = [
    {
        'loss': 2.0338413157143433,
        'outputs': {
            'v3': np.array([
                0.0524979196, -0.800000012, -0.262590947, 0.800000012, -0.127667249, 0.200000003, -0.278414522,
                1.20000005, 1.02158543, -1.20000005, 0.467731431, 0.5
            ], dtype=np.float64).reshape(6, 2, 1),
            'v14': np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, -1.0, 0.0, 0.0], dtype=np.float64).reshape(1, 6, 2, 1),
        },
        'grads': {
            'p0': np.array([0.05499168, -0.0405387075, -0.176109992, -0.0060096972, -0.703235979, -0.494032087], dtype=np.float64).reshape(6, 1),
            'x2': np.array([-0.100000001, 0.100000001, 0.400000006, 0.899999976, -1.29999995, 0.0], dtype=np.float64).reshape(6, 1),
        },
        'params': {
            'p0': np.array([0.09945008, -1.6995946, -0.2982389, -1.2999399, 1.3070323, 0.7049403], dtype=np.float32).reshape(6, 1),
            'x2': np.array([-0.799, 0.799, 0.19600001, 1.1910001, -1.187, 0.5], dtype=np.float32).reshape(6, 1),
        },
    },
]
ATOL = {'v3': 0.000132, 'v14': 0.00011, 'p0': 8.07e-05, 'x2': 0.00014, 'p0 after the update': 0.00018, 'x2 after the update': 0.000129}
LOSS_TOL = [0.00596]
PREDICT_FIRST = True
KERNELS = 'cpu'  # the kernel set it failed with (run_gpu)


def _check(got, want, atol, what):
    got = np.asarray(got)
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=atol, err_msg=what)


@pytest.mark.gpu
def test_fuzz_compile_3e85a7bc():
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
