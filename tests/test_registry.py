"""Registry completeness (STYLE.md §4.3): every primitive is a whole record, every public op
of API.md §2 exists, and the op table reaches every primitive and every public op."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from aot import nn, ops
from aot.ops.registry import FUSION, OpDef, all_ops, register

from op_cases import CASES, build

# API.md §2, in its order
API_OPS = (
    "add sub mul div minimum maximum less greater where "
    "neg abs sqrt rsqrt exp log square sin cos tanh sigmoid relu gelu silu erf "
    "sum mean max argmax "
    "reshape transpose swapaxes broadcast_to concat stack split narrow "
    "matmul cast one_hot arange embedding take_along_axis "
    "softmax log_softmax softmax_causal cross_entropy stop_gradient dropout conv2d max_pool2d"
).split()
API_NN = "Linear LayerNorm RMSNorm Embedding Conv2d split_heads merge_heads".split()

# dropout needs a training graph and its own checks (test_grad.py); the rest are leaves
NOT_IN_TABLE = {"dropout"}
LEAF_PRIMITIVES = {"input", "param", "state", "buffer"}
PRIMITIVES_TESTED_ELSEWHERE = {"rand": "dropout tests in test_grad.py", "state": "optimizer state: the optimizer tests", "buffer": "tests/test_buffers.py"}


def _api_md() -> Path | None:
    here = Path(__file__).resolve()
    for p in (here.parents[1] / "docs" / "API.md", here.parents[2] / "shared" / "API.md"):
        if p.exists():
            return p
    return None


@pytest.mark.parametrize("name", sorted(all_ops()))
def test_primitive_record_is_complete(name):
    op = all_ops()[name]
    assert isinstance(op, OpDef) and op.name == name
    assert callable(op.shape), "shape rule"
    assert callable(op.ref), "NumPy semantics"
    assert isinstance(op.kernel, str) and op.kernel.isidentifier(), "kernel family"
    # exactly one of: a VJP rule, or an explicit statement that no gradient flows
    assert (op.vjp is not None) != op.nondiff, f"vjp={op.vjp}, nondiff={op.nondiff}"
    assert op.expr is None or isinstance(op.expr, str) or callable(op.expr)


@pytest.mark.parametrize("name", sorted(all_ops()))
def test_primitive_has_every_stage_fact(name):
    """The schedule, index_bounds and the WGSL renderer ask the record, never the op's name:
    every fact they need is there and consistent with the op's fusion class."""
    op = all_ops()[name]
    assert op.fusion in FUSION, "fusion class"
    assert isinstance(op.cost, int) and op.cost >= 0, "recompute cost"
    assert (op.cost == 0) == (op.fusion in ("constant", "view", "index")), "free exactly when pure index arithmetic"
    assert isinstance(op.prologue, bool) and isinstance(op.same_order, bool)
    assert op.kernel in ("leaf", "elementwise", "reduce", "matmul", "attention", "recurrent")
    assert op.index_bound is None or callable(op.index_bound), "index bound"
    if op.fusion == "pointwise":
        assert op.same_order and op.expr is not None, "a pointwise op renders through its expr template"
    if op.kernel == "elementwise" or op.fusion == "constant":
        assert callable(op.render) or op.expr is not None, "WGSL rendering"
    else:
        assert op.render is None and op.expr is None, "kernel ops and leaves are not rendered inline"
    if op.fusion in ("view", "concat"):
        assert callable(op.view), "view rule"
        assert op.index_bound is not None, "views pass index values on"
    else:
        assert op.view is None
    if op.fusion == "reduce":
        assert callable(op.reduced_axes) and op.split in (None, "pad", "divide")
    else:
        assert op.reduced_axes is None and op.split is None
    if op.prologue:
        assert op.fusion in ("constant", "view", "index", "gather") and op.kernel != "reduce"


def test_register_rejects_duplicates_and_missing_vjp():
    add = all_ops()["add"]
    with pytest.raises(ValueError, match="twice"):
        register(add)
    with pytest.raises(ValueError, match="vjp"):
        register(OpDef("no_such_op_for_test", add.shape, add.ref, None, "elementwise"))
    assert "no_such_op_for_test" not in all_ops()


@pytest.mark.parametrize("name", API_OPS)
def test_api_op_resolves_to_a_function_in_aot_ops(name):
    assert callable(getattr(ops, name, None)), f"aot.ops.{name} is missing"


@pytest.mark.parametrize("name", API_NN)
def test_api_nn_name_resolves_in_aot_nn(name):
    assert callable(getattr(nn, name, None)), f"aot.nn.{name} is missing"


def test_api_lists_match_api_md():
    """The names above are the ones API.md §2 lists (so an addition to the contract shows up here)."""
    path = _api_md()
    if path is None:
        pytest.skip("shared/API.md is not beside the checkout")
    text = path.read_text(encoding="utf-8")
    section = text.split("## 2.", 1)[1].split("## 3.", 1)[0]
    names = set()
    for span in re.findall(r"`([^`]+)`", section):
        if re.fullmatch(r"[a-z_0-9]+( [a-z_0-9]+)*", span):
            names.update(span.split())
        else:
            m = re.match(r"([A-Za-z_][A-Za-z_0-9]*)\(", span)
            if m:
                names.add(m.group(1))
    assert names == set(API_OPS) | set(API_NN)


def test_every_api_op_has_an_op_case():
    covered = {c.op for c in CASES}
    missing = [n for n in API_OPS + API_NN if n not in covered and n not in NOT_IN_TABLE]
    assert not missing, f"no OpCase for {missing}"


def test_every_primitive_is_reached_by_the_op_table():
    """Forward or backward, every registered primitive appears in some traced case."""
    seen = set()
    for case in CASES:
        seen.update(n.op for n in build(case).graph.nodes)
    missing = sorted(set(all_ops()) - seen - set(PRIMITIVES_TESTED_ELSEWHERE))
    assert not missing, f"primitives no op case reaches: {missing}"


def test_leaf_refs_are_not_callable_directly():
    for name in LEAF_PRIMITIVES:
        with pytest.raises(RuntimeError):
            all_ops()[name].ref(name="x", shape=(1,), dtype="f32")


def test_const_and_arange_refs():
    assert all_ops()["const"].ref(value=2.5, dtype="f32").dtype == np.float32
    assert all_ops()["arange"].ref(n=3, dtype="i32").tolist() == [0, 1, 2]
