"""split / concat / where / reshape programs whose gradients are concats assembled in place
(graph fuzz seed 5310649, tests/fuzz_repros/test_fuzz_compile_1534398f.py): the cotangent of a
split is the concat of its pieces' cotangents, a piece nothing reads contributing zeros; when a
reduction over the same parameter's other use takes the concat into its epilogue, every piece's
writer must still run first (schedule._merge_reader). Values, captures and gradients against
float64 PyTorch on both kernel sets (lavapipe)."""

from __future__ import annotations

import numpy as np
import pytest

import aot
from aot import ops

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(32)


def _f32(*shape):
    return RNG.normal(size=shape).astype(np.float32)


def _where(cond, a, b, T):
    """aot's where (cond nonzero) for either library: T is `ops` or torch."""
    if T is ops:
        return ops.where(cond, a, b)
    return torch.where(cond != 0, a, b)


def _split(x, sizes, axis, T):
    return ops.split(x, sizes, axis=axis) if T is ops else tuple(torch.split(x, sizes, dim=axis))


def _concat(xs, axis, T):
    return ops.concat(xs, axis=axis) if T is ops else torch.cat(xs, dim=axis)


def _reshape(x, shape, T):
    return ops.reshape(x, shape) if T is ops else x.reshape(shape)


def _exp(x, T):
    return ops.exp(x) if T is ops else torch.exp(x)


def _sum(x, T):
    return ops.sum(x) if T is ops else x.sum()


# name -> (parameters, forward(p, T) -> outputs); p maps names to aot or torch tensors
CASES = {
    # the fuzz finding: two of three pieces are outputs, p4 also reshaped and scaled
    "seed_5310649": (
        {"p4": _f32(5), "p5": _f32(), "w": _f32(5, 5), "mask": np.array([0, 1, 0, 1, 1], np.float32)},
        lambda p, T: [
            *_split(_where(p["mask"], p["p4"], p["p5"], T), [1, 3, 1], 0, T)[1:],
            p["w"] * _reshape(p["p4"], (5, 1), T),
        ],
    ),
    # every piece an output
    "all_pieces": (
        {"a": _f32(6), "b": _f32(6), "w": _f32(6, 3), "mask": np.array([1, 0, 0, 1, 0, 1], np.float32)},
        lambda p, T: [
            *_split(_where(p["mask"], p["a"], p["b"], T), [2, 1, 3], 0, T),
            _reshape(p["a"], (6, 1), T) * p["w"],
        ],
    ),
    # a split of the parameter itself, its first and last pieces unread (zero cotangent pieces)
    "middle_piece": (
        {"a": _f32(7), "w": _f32(7, 4)},
        lambda p, T: [_exp(_split(p["a"], [2, 3, 2], 0, T)[1], T), p["w"] * _reshape(p["a"], (7, 1), T)],
    ),
    # rows of a matrix: the pieces' cotangents concat along the leading axis of a 2-D gradient
    "rows": (
        {"a": _f32(5, 3), "w": _f32(5, 3, 2), "mask": np.array([[1, 0, 1]] * 5, np.float32)},
        lambda p, T: [
            _split(_where(p["mask"], p["a"], 0.5 * p["a"], T), [1, 2, 2], 0, T)[2],
            p["w"] * _reshape(p["a"], (5, 3, 1), T),
        ],
    ),
    # the pieces put back in another order (a concat of the split's pieces in the forward pass)
    "reordered": (
        {"a": _f32(6), "w": _f32(6, 6)},
        lambda p, T: (
            lambda v: [_concat([v[2], v[0]], 0, T), p["w"] * _reshape(p["a"], (6, 1), T)]
        )(_split(p["a"] * 2.0, [1, 2, 3], 0, T)),
    ),
    # no piece is an output: each feeds a reduction, with the reshaped use as well
    "pieces_reduced": (
        {"a": _f32(4), "b": _f32(4), "w": _f32(4, 4), "mask": np.array([1, 1, 0, 0], np.float32)},
        lambda p, T: (
            lambda v: [
                _sum(v[0] * v[0], T) + _sum(_exp(v[1], T), T),
                p["w"] * _reshape(p["b"], (4, 1), T) + _reshape(p["a"], (1, 4), T),
            ]
        )(_split(_where(p["mask"], p["a"], p["b"], T), [1, 3], 0, T)),
    ),
}


def _program(name, params, forward, cts):
    class M(aot.Module):
        def __init__(self):
            super().__init__()
            for k, v in params.items():
                setattr(self, k, self.param(v.shape, init=aot.init.literal(v)))

    def loss(m, **feeds):
        outs = forward({k: getattr(m, k) for k in params}, ops)
        total = 0.0
        for i, o in enumerate(outs):
            aot.capture(f"o{i}", o)
            total = total + ops.sum(o * feeds[f"ct{i}"])
        return total

    inputs = {f"ct{i}": aot.f32(*c.shape) for i, c in enumerate(cts)}
    return aot.Program(name, model=M, train=aot.Train(loss, inputs=inputs, optimizer=None), seed=0)


def _torch_side(params, forward):
    """Outputs and gradients in float64 PyTorch, with cotangents fixed from the outputs' shapes."""
    p = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}
    outs = forward(p, torch)
    cts = [np.asarray(RNG.normal(size=tuple(o.shape)), np.float32) for o in outs]
    loss = sum((o * torch.tensor(c, dtype=torch.float64)).sum() for o, c in zip(outs, cts))
    loss.backward()
    grads = {k: (t.grad.numpy() if t.grad is not None else np.zeros_like(params[k], np.float64)) for k, t in p.items()}
    return cts, float(loss.detach()), [o.detach().numpy() for o in outs], grads


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["cpu", "gpu"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_split_gradient_concat_assembled_in_place(case, kernels):
    params, forward = CASES[case]
    cts, want_loss, want_outs, want_grads = _torch_side(params, forward)
    model = aot.compile(_program(f"split_{case}", params, forward, cts), kernels=kernels)
    try:
        for step in range(2):  # step 2 would show a read of what step 1 left in memory
            res = model.step(**{f"ct{i}": c for i, c in enumerate(cts)}, captures=True)
            assert abs(res.loss - want_loss) <= 1e-4 * (1 + abs(want_loss)), f"step {step + 1}: loss"
            for i, want in enumerate(want_outs):
                np.testing.assert_allclose(res.captures[f"o{i}"], want, rtol=1e-5, atol=1e-5, err_msg=f"output o{i}")
            grads = model.grads()
            for k, want in want_grads.items():
                np.testing.assert_allclose(grads[k], want, rtol=1e-5, atol=1e-5, err_msg=f"gradient of {k}")
    finally:
        model.close()
