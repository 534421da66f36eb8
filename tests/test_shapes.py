"""Trace-time shape and dtype errors: `aot.ShapeError` naming the op and the user's file:line.

Each entry of BAD is a one-line lambda, so the line the error must point at is the
lambda's own line (`co_firstlineno`). The good side of every shape rule is checked by
test_grad.py, which compares each op case's traced output shape with NumPy's.
"""

from __future__ import annotations

import inspect
import os
import re

import pytest

import aot
from aot import nn, ops
from aot.frontend import trace_program
from aot.ir import Graph
from aot.trace import emit

FILE = os.path.basename(__file__)


def here() -> int:
    """The caller's current line number."""
    return inspect.currentframe().f_back.f_lineno


def leaves(types: str):
    """'f32[2,3] i32[4]' -> input tensors of those types (tracing must be active)."""
    out = []
    for k, m in enumerate(re.finditer(r"(f32|i32)\[([\d,]*)\]", types)):
        shape = tuple(int(d) for d in m.group(2).split(",") if d)
        out.append(emit("input", (), name=f"in{k}", shape=shape, dtype=m.group(1)))
    return out


def check(err: aot.ShapeError, op: str, line: int) -> str:
    msg = str(err)
    assert msg.startswith(f"{op}:"), f"the message should start with the op {op!r}:\n{msg}"
    assert f"{FILE}:{line}" in msg, f"the message should point at {FILE}:{line}:\n{msg}"
    return msg


# (op named by the message, input types, the offending call)
BAD = [
    ("matmul", "f32[2,3] f32[4,5]", lambda a, b: ops.matmul(a, b)),
    ("matmul", "f32[2,3] f32[4,5]", lambda a, b: a @ b),
    ("matmul", "f32[2,3,4] f32[3,4,5]", lambda a, b: ops.matmul(a, b)),
    ("matmul", "f32[2,2,3,4] f32[2,4,5]", lambda a, b: ops.matmul(a, b)),
    ("matmul", "f32[3] f32[3,2]", lambda a, b: ops.matmul(a, b)),
    ("matmul", "i32[2,3] i32[3,2]", lambda a, b: ops.matmul(a, b)),
    ("add", "f32[2,3] f32[4]", lambda a, b: ops.add(a, b)),
    ("add", "f32[2,3] f32[2,4]", lambda a, b: a + b),
    ("mul", "f32[2,1,3] f32[4,2]", lambda a, b: a * b),
    ("where", "f32[2,3] f32[3,2] f32[2,3]", lambda c, a, b: ops.where(c, a, b)),
    ("add", "i32[3] i32[3]", lambda a, b: a + b),
    ("add", "i32[3]", lambda i: i + 1),
    ("sub", "i32[3] f32[3]", lambda i, x: ops.sub(i, x)),
    ("mul", "f32[3] i32[3]", lambda x, i: x * i),
    ("div", "i32[3] i32[3]", lambda a, b: a / b),
    ("exp", "i32[3]", lambda i: ops.exp(i)),
    ("relu", "i32[3]", lambda i: ops.relu(i)),
    ("neg", "i32[3]", lambda i: -i),
    ("sum", "i32[2,3]", lambda i: ops.sum(i)),
    ("mean", "i32[2,3]", lambda i: ops.mean(i, -1)),
    ("max", "i32[2,3]", lambda i: ops.max(i)),
    ("less", "i32[3] f32[3]", lambda i, x: ops.less(i, x)),
    ("reshape", "f32[2,3]", lambda x: ops.reshape(x, (4, 2))),
    ("reshape", "f32[2,3]", lambda x: ops.reshape(x, (4, -1))),
    ("reshape", "f32[2,3]", lambda x: ops.reshape(x, (-1, -1))),
    ("sum", "f32[2,3]", lambda x: ops.sum(x, axis=2)),
    ("sum", "f32[2,3]", lambda x: ops.sum(x, axis=(0, -3))),
    ("sum", "f32[2,3]", lambda x: ops.sum(x, axis=(1, -1))),
    ("mean", "f32[2,3]", lambda x: ops.mean(x, axis=5)),
    ("max", "f32[2,3]", lambda x: ops.max(x, axis=-3)),
    ("argmax", "f32[2,3]", lambda x: ops.argmax(x, axis=2)),
    ("argmax", "f32[2,3]", lambda x: ops.argmax(x, axis=(0, 1))),
    ("transpose", "f32[2,3,4]", lambda x: ops.transpose(x, (0, 1))),
    ("swapaxes", "f32[2,3]", lambda x: ops.swapaxes(x, 0, 2)),
    ("broadcast_to", "f32[2,3]", lambda x: ops.broadcast_to(x, (2, 4))),
    ("broadcast_to", "f32[2,3]", lambda x: ops.broadcast_to(x, (3,))),
    ("concat", "f32[2,3] f32[3,3]", lambda a, b: ops.concat([a, b], axis=1)),
    ("concat", "f32[2,3] f32[2]", lambda a, b: ops.concat([a, b], axis=0)),
    ("concat", "f32[2] i32[2]", lambda a, b: ops.concat([a, b])),
    ("concat", "f32[2,3] f32[2,3]", lambda a, b: ops.concat([a, b], axis=2)),
    ("stack", "f32[2,3] f32[3,2]", lambda a, b: ops.stack([a, b])),
    ("stack", "f32[2,3] f32[2,3]", lambda a, b: ops.stack([a, b], axis=3)),
    ("split", "f32[2,3]", lambda x: ops.split(x, [1, 1], axis=1)),
    ("split", "f32[2,3]", lambda x: ops.split(x, [1, 1], axis=-3)),
    ("narrow", "f32[2,3]", lambda x: ops.narrow(x, 1, 2, 2)),
    ("narrow", "f32[2,3]", lambda x: ops.narrow(x, 2, 0, 1)),
    ("cast", "f32[2,3]", lambda x: ops.cast(x, "f64")),
    ("one_hot", "f32[3]", lambda x: ops.one_hot(x, 4)),
    ("embedding", "f32[7,3] f32[2]", lambda w, i: ops.embedding(w, i)),
    ("take_along_axis", "f32[3,4] f32[3,2]", lambda x, i: ops.take_along_axis(x, i, 1)),
    ("take_along_axis", "f32[3,4] i32[2,2]", lambda x, i: ops.take_along_axis(x, i, 1)),
    ("softmax_causal", "f32[2,3,4]", lambda s: ops.softmax_causal(s)),
    ("gelu", "f32[3]", lambda x: ops.gelu(x, approximate="fast")),
    ("cross_entropy", "f32[4,5] f32[4]", lambda z, t: ops.cross_entropy(z, t)),
    ("cross_entropy", "f32[4,5] i32[5]", lambda z, t: ops.cross_entropy(z, t)),
    ("cross_entropy", "f32[2,4,5] i32[4]", lambda z, t: ops.cross_entropy(z, t)),
    ("cross_entropy", "f32[4,5] i32[4]", lambda z, t: ops.cross_entropy(z, t, reduction="avg")),
    ("conv2d", "f32[1,4,5,5] f32[6,3,3,3]", lambda x, w: ops.conv2d(x, w)),
    ("conv2d", "f32[1,4,5,5] f32[6,4,3]", lambda x, w: ops.conv2d(x, w)),
    ("conv2d", "f32[1,4,5,5] f32[6,2,3,3]", lambda x, w: ops.conv2d(x, w, groups=3)),
    ("conv2d", "f32[1,1,2,2] f32[1,1,3,3]", lambda x, w: ops.conv2d(x, w)),
    ("conv2d", "f32[4,5,5] f32[6,4,3,3]", lambda x, w: ops.conv2d(x, w)),
    ("max_pool2d", "f32[2,5,5]", lambda x: ops.max_pool2d(x, 2)),
    ("max_pool2d", "f32[1,1,2,2]", lambda x: ops.max_pool2d(x, 3)),
    ("split_heads", "f32[2,3,5]", lambda x: nn.split_heads(x, 2)),
    # composites name themselves, not the primitive that would have failed inside them
    ("softmax", "i32[2,3]", lambda i: ops.softmax(i)),
    ("softmax", "f32[2,3]", lambda x: ops.softmax(x, axis=2)),
    ("log_softmax", "f32[2,3]", lambda x: ops.log_softmax(x, axis=-3)),
    ("gelu", "i32[3]", lambda i: ops.gelu(i)),
    ("silu", "i32[3]", lambda i: ops.silu(i)),
    ("cross_entropy", "i32[4,5] i32[4]", lambda z, t: ops.cross_entropy(z, t)),
    ("conv2d", "f32[1,1,4,4] i32[1,1,3,3]", lambda x, w: ops.conv2d(x, w)),
    ("conv2d", "f32[1,1,4,4] f32[1,1,3,3]", lambda x, w: ops.conv2d(x, w, stride=0)),
    ("max_pool2d", "f32[1,1,4,4]", lambda x: ops.max_pool2d(x, 2, stride=(1, 0))),
]


@pytest.mark.parametrize(
    "op, types, call", BAD, ids=[f"{op}-{i}" for i, (op, _, _) in enumerate(BAD)]
)
def test_bad_call_raises_shape_error_at_the_call(graph, op, types, call):
    xs = leaves(types)
    with pytest.raises(aot.ShapeError) as ei:
        call(*xs)
    check(ei.value, op, call.__code__.co_firstlineno)


def test_message_shows_the_operand_types(graph):
    a, b = leaves("f32[2,3] f32[4,5]")
    with pytest.raises(aot.ShapeError) as ei:
        line = here() + 1
        ops.matmul(a, b)
    msg = check(ei.value, "matmul", line)
    assert "f32[2,3]" in msg and "f32[4,5]" in msg
    assert "ops.matmul(a, b)" in msg  # the source line is quoted


def test_shape_error_is_an_aot_error(graph):
    (x,) = leaves("f32[2,3]")
    with pytest.raises(aot.AotError):
        ops.reshape(x, (5,))


def test_nothing_is_emitted_for_a_rejected_call(graph):
    a, b = leaves("f32[2,3] f32[4,5]")
    before = len(graph.nodes)
    with pytest.raises(aot.ShapeError):
        ops.matmul(a, b)
    assert len(graph.nodes) == before


def test_ops_outside_tracing_raise_trace_error():
    g = Graph("t")
    from aot.trace import tracing

    with tracing(g):
        (x,) = leaves("f32[2]")
    with pytest.raises(aot.TraceError):
        ops.exp(x)


# ---- errors raised while a Program is traced -----------------------------------------------------


class _MLP(aot.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(3, 8)
        self.l2 = nn.Linear(4, 1)  # wrong: l1 gives 8 features


def test_linear_with_the_wrong_input_width_points_at_the_model_code():
    seen = {}

    def forward(m, x):
        h = ops.relu(m.l1(x))
        seen["line"] = here() + 1
        return m.l2(h)

    def loss(m, x):
        return ops.mean(forward(m, x))

    program = aot.Program("mlp", model=_MLP, train=aot.Train(loss, inputs={"x": aot.f32(5, 3)}))
    with pytest.raises(aot.ShapeError) as ei:
        trace_program(program)
    msg = check(ei.value, "matmul", seen["line"])
    assert "f32[5,8]" in msg and "f32[4,1]" in msg
    assert "in forward" in msg
    assert "hint:" in msg


def _vector_loss_program():
    def loss(m, x):
        return ops.sum(m.l1(x), axis=-1)  # [5], not 0-d

    return aot.Program("vec_loss", model=_MLP, train=aot.Train(loss, inputs={"x": aot.f32(5, 3)}))


def test_loss_that_is_not_0d_raises_shape_error():
    with pytest.raises(aot.ShapeError) as ei:
        trace_program(_vector_loss_program())
    msg = str(ei.value)
    assert "vec_loss" in msg and "0-d" in msg and "f32[5]" in msg


def test_loss_that_is_not_0d_points_at_the_loss_code():
    with pytest.raises(aot.ShapeError) as ei:
        trace_program(_vector_loss_program())
    line = _vector_loss_program.__code__.co_firstlineno + 2
    assert f"{FILE}:{line}" in str(ei.value)
