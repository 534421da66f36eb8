"""Fuzz reproducer (compile): aot.compile.

CodegenError: kernel train_03_fused_mul_square_sum reads t12 from memory before it stores it (a
    fusion rule merged a reader that does not read element for element)

Expected values are float64 PyTorch autograd of the same graph (tests/fuzz_graphs.py).

Found by scripts/fuzz.py at seed 11033 (fuzz_graphs.generate(11033)), then shrunk.
"""

import numpy as np
import pytest

import aot
from aot import nn, ops

P = {
    'p0': np.array([-0.2, 0.9, -2.0, 0.9, -0.5, -0.5, -0.6, -0.7, -0.2, -1.3, -1.4, 1.2], dtype=np.float32).reshape(6, 2),
    'p9': np.array([
        0.5, -0.2, -0.8, -0.3, -1.7, 2.0, 0.5, -0.8, -1.9, -1.7, -1.1, 1.0, 0.8, -0.3, -1.8, -0.5, -0.4,
        -1.9, -1.0, -1.4, -1.9, 0.7, 0.4, -0.6, -2.0, -0.3, 1.6, -1.2, -1.8, 1.6, 1.3, 1.5, 0.3, 0.8,
        1.8, -1.4, 1.0, 1.0, -0.3, 0.1, 0.8, 0.8, 1.0, -0.1, 1.1, -1.3, -0.8, -0.7
    ], dtype=np.float32).reshape(4, 6, 2),
}
MODULE_PARAMS = {
}


class FuzzModel(aot.Module):
    def __init__(self):
        super().__init__()
        self.p0 = self.param((6, 2), init=aot.init.literal(P['p0']))
        self.p9 = self.param((4, 6, 2), init=aot.init.literal(P['p9']))


def forward(m):
    v1 = ops.erf(m.p0)
    v2 = nn.split_heads(v1, 2)
    v3 = ops.transpose(v2)
    v10 = ops.add(v3, m.p9)
    return [v10]


def loss(m, v10_ct):
    outs = forward(m)
    aot.capture('v10', outs[0])
    total = ops.sum(outs[0] * v10_ct)
    return total


program = aot.Program(
    'fuzz_compile_111b606e',
    model=FuzzModel,
    train=aot.Train(loss, inputs={'v10_ct': aot.f32(4, 6, 2)}, optimizer=None),
    seed=0,
)


INPUTS = [
    {},
]
COTANGENTS = [
    {
        'v10_ct': np.array([
            -0.0, -0.8, -0.1, 0.9, -0.2, -0.3, 1.6, -0.1, -1.7, -0.8, -0.3, -1.3, 2.0, -2.0, 1.5, 0.1, -1.0,
            -0.6, -1.5, -0.9, 0.0, -1.1, 0.9, -0.5, 0.8, 0.7, 0.0, 1.1, 0.1, -0.3, -1.5, -0.6, -1.1, -0.5,
            -1.1, 1.5, 1.9, 0.6, -0.1, 0.2, 0.1, 0.4, -2.2, 1.0, -0.9, 0.2, 2.2, 0.2
        ], dtype=np.float32).reshape(4, 6, 2),
    },
]
EXPECTED = [
    {
        'loss': -3.116730862575239,
        'outputs': {
            'v10': np.array([
                0.277297408, 0.596908197, -1.79532228, 0.496908189, -2.22049993, 1.47950012, -0.10385611,
                -1.4778012, -2.12270257, -2.63400798, -2.05228514, 1.91031399, 0.577297419, 0.496908189,
                -2.79532222, 0.2969082, -0.920499884, -2.42049985, -1.60385611, -2.07780116, -2.12270257,
                -0.234007947, -0.55228511, 0.310313967, -2.22270259, 0.496908189, 0.604677759, -0.403091847,
                -2.32049983, 1.07950015, 0.696143843, 0.822198814, 0.0772974195, -0.134007923, 0.847714836,
                -0.489685985, 0.777297408, 1.7969082, -1.29532228, 0.896908202, 0.279500134, 0.279500134,
                0.39614389, -0.777801187, 0.877297431, -2.23400789, -1.75228513, 0.210314003
            ], dtype=np.float64).reshape(4, 6, 2),
        },
        'grads': {
            'p0': np.array([
                5.09543348, -0.752952894, 0.0268670809, 1.15452777, -0.878782579, -0.7030261, -2.83407629,
                -0.414764924, -4.01129876, -0.458057635, 0.270200919, -0.0267344181
            ], dtype=np.float64).reshape(6, 2),
            'p9': np.array([
                -0.0, -0.800000012, -0.100000001, 0.899999976, -0.200000003, -0.300000012, 1.60000002,
                -0.100000001, -1.70000005, -0.800000012, -0.300000012, -1.29999995, 2.0, -2.0, 1.5, 0.100000001,
                -1.0, -0.600000024, -1.5, -0.899999976, 0.0, -1.10000002, 0.899999976, -0.5, 0.800000012,
                0.699999988, 0.0, 1.10000002, 0.100000001, -0.300000012, -1.5, -0.600000024, -1.10000002, -0.5,
                -1.10000002, 1.5, 1.89999998, 0.600000024, -0.100000001, 0.200000003, 0.100000001, 0.400000006,
                -2.20000005, 1.0, -0.899999976, 0.200000003, 2.20000005, 0.200000003
            ], dtype=np.float64).reshape(4, 6, 2),
        },
    },
]
ATOL = {'v10': 0.000294, 'p0': 0.000538, 'p9': 0.00023}
LOSS_TOL = [0.0414]
PREDICT_FIRST = False
KERNELS = 'cpu'  # the kernel set it failed with (run_gpu)


def _check(got, want, atol, what):
    got = np.asarray(got)
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=atol, err_msg=what)


@pytest.mark.gpu
def test_fuzz_compile_111b606e():
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
