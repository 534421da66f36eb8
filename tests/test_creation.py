"""`ops.full`, `zeros`, `ones` and their `*_like` forms: values and dtypes through the interpreter,
no gradient into a constant, and a shape error with the user's line."""

from __future__ import annotations

import numpy as np
import pytest

from aot import interp, ops
from aot.errors import ShapeError
from aot.trace import emit


def test_values_and_dtypes(graph):
    x = emit("input", (), name="x", shape=(2, 3), dtype="f32")
    outs = {
        "full": ops.full((2, 3), 2.5),
        "zeros_i32": ops.zeros((4,), "i32"),
        "ones": ops.ones(3),
        "full_like": ops.full_like(x, -1.0),
        "zeros_like": ops.zeros_like(x),
        "ones_like_i32": ops.ones_like(x, "i32"),
        "scalar": ops.full((), 7.0),
    }
    env = interp.run(graph, {"x": np.zeros((2, 3), np.float32)})
    want = {
        "full": np.full((2, 3), 2.5), "zeros_i32": np.zeros(4), "ones": np.ones(3),
        "full_like": np.full((2, 3), -1.0), "zeros_like": np.zeros((2, 3)), "ones_like_i32": np.ones((2, 3)),
        "scalar": np.array(7.0),
    }
    for k, t in outs.items():
        assert t.dtype == ("i32" if k.endswith("i32") else "f32"), k
        np.testing.assert_array_equal(env[id(t)], want[k], err_msg=k)


def test_bad_arguments_name_the_line(graph):
    with pytest.raises(ShapeError, match="full.*negative") as e:
        ops.full((2, -1), 0.0)
    assert "test_creation.py" in str(e.value)
    with pytest.raises(ShapeError, match="dtype"):
        ops.zeros(3, "f16")
    with pytest.raises(ShapeError, match="expects a Tensor"):
        ops.ones_like(np.zeros(3))
