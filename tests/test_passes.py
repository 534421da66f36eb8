"""Graph passes and the fusion schedule: before/after structure, and equal results in the interpreter."""

import runpy
from pathlib import Path

import numpy as np
import pytest

from aot import interp, ops, split_rules
from aot.pipeline import compile_program
from aot.ir import Graph, format_graph
from aot.passes import verify
from aot.matmul_codegen import split_count
from aot.passes import cse_consts, dce, split_long_matmuls, split_reductions
from aot.trace import emit, tracing

ROOT = Path(__file__).resolve().parent.parent


def _graph(build):
    g = Graph("t")
    with tracing(g):
        g.outputs["out"] = build()
    return g


def test_split_reductions_two_stages_with_zero_padding():
    g = _graph(lambda: ops.sum(ops.square(emit("input", (), name="x", shape=(300_001,), dtype="f32"))))
    s = split_reductions(g)
    verify(s)
    text = format_graph(s)
    assert "pad[after=3103,axis=0,before=0]" in text  # 300001 -> 74 chunks of 4096
    assert "reshape[shape=(74,4096)]" in text
    assert text.count("= sum[") == 2
    x = np.random.default_rng(0).standard_normal(300_001).astype(np.float32)
    a = interp.run(g, {"x": x}, np.float64)[id(g.outputs["out"])]
    b = interp.run(s, {"x": x}, np.float64)[id(s.outputs["out"])]
    np.testing.assert_allclose(a, b, rtol=1e-12)


def test_long_k_matmul_with_few_outputs_is_split_into_partial_products():
    """A convolution's weight-gradient shape: [32, 50176] @ [50176, 9] -> 64 partial products of
    K = 784 as one batched matmul, then a sum over them; same values (float64)."""

    def build():
        a = emit("input", (), name="a", shape=(32, 50176), dtype="f32")
        b = emit("input", (), name="b", shape=(50176, 9), dtype="f32")
        return ops.matmul(a, b)

    g = _graph(build)
    s = split_long_matmuls(g)
    verify(s)
    text = format_graph(s)
    assert "f32[64,32,9] = matmul" in text and "sum[axes=(0,)" in text, text
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((32, 50176)), "b": rng.standard_normal((50176, 9))}
    x = interp.run(g, feeds, np.float64)[id(g.outputs["out"])]
    y = interp.run(s, feeds, np.float64)[id(s.outputs["out"])]
    np.testing.assert_allclose(y, x, rtol=1e-10, atol=1e-9)
    # outputs that fill the GPU, or a short K, are left alone
    for (m, k, n) in ((4096, 9000, 4096), (256, 1000, 256), (32, 4000, 9)):
        assert format_graph(split_long_matmuls(_graph(lambda: ops.matmul(
            emit("input", (), name="a", shape=(m, k), dtype="f32"), emit("input", (), name="b", shape=(k, n), dtype="f32"))))).count("matmul") == 1


def test_weight_gradients_with_too_few_tiles_are_split_by_the_cost_model():
    """A transformer's [512, 8192] @ [8192, 512] weight gradient has 32 tiles of 64x128 for a GPU
    of 132 SMs: 8 partial products of K = 1024 (H100: 181 us whole, 142 in 4 chunks, 127 in 8).
    Its [2048, 8192] @ [8192, 512] ones fill the SMs with one workgroup of 4 warps each: 2 chunks
    (533-541 -> 474-477 us). [8192, 512] @ [512, 2048] has K too short to split."""
    g = _graph(lambda: ops.matmul(
        emit("input", (), name="a", shape=(512, 8192), dtype="f32"), emit("input", (), name="b", shape=(8192, 512), dtype="f32")))
    assert "f32[8,512,512] = matmul" in format_graph(split_long_matmuls(g))
    assert split_count(512, 512, 8192) == 8
    assert split_count(2048, 512, 8192) == 2 and split_count(512, 2048, 8192) == 2
    assert split_count(8192, 512, 2048) is None and split_count(4096, 4096, 4096) is None


def test_split_long_matmul_on_the_gpu_matches_the_interpreter():
    from gpu_harness import assert_all_close, make_program, run_both

    rng = np.random.default_rng(1)
    params = {"w": rng.normal(size=(4, 9))}
    inputs = {"x": rng.normal(size=(8192 * 2, 4))}

    def body(m, f):  # the weight gradient of x @ w is x^T @ ct: [4, 16384] @ [16384, 9]
        return {"y": ops.tanh(f["x"] @ m.w)}

    program, feeds, _ = make_program("split_k", params, inputs, body)
    c = compile_program(program)
    assert any(n.op == "matmul" and n.out.ndim == 3 for n in c.graphs["train"].nodes)
    [(gpu, ref)], _ = run_both(program, feeds)
    assert_all_close(gpu, ref, "split-K weight gradient", rtol=2e-4, atol=2e-4)


def test_split_wide_weight_gradient_on_the_gpu_matches_the_interpreter():
    """x^T @ ct with x [4096, 256] and ct [4096, 128]: 32,768 outputs, K = 4096, split by the
    cost model into partial products whose sum is the weight gradient."""
    from gpu_harness import assert_all_close, make_program, run_both

    rng = np.random.default_rng(2)
    params = {"w": rng.normal(size=(256, 128)) / 16}
    inputs = {"x": rng.normal(size=(4096, 256))}

    def body(m, f):
        return {"y": ops.tanh(f["x"] @ m.w)}

    program, feeds, _ = make_program("split_k_wide", params, inputs, body)
    c = compile_program(program)
    assert any(n.op == "matmul" and n.out.shape[1:] == (256, 128) and n.out.ndim == 3 for n in c.graphs["train"].nodes)
    [(gpu, ref)], _ = run_both(program, feeds)
    assert_all_close(gpu, ref, "split-K wide weight gradient", rtol=2e-4, atol=2e-4)


def test_split_reductions_over_outer_axes_keeps_column_layout():
    g = _graph(lambda: ops.max(emit("input", (), name="x", shape=(64, 128, 8), dtype="f32"), axis=(0, 1), keepdims=True))
    s = split_reductions(g)
    assert s.outputs["out"].shape == (1, 1, 8)
    # a tensor this small gets the shortest chunks (16 rows): its first stage still has few invocations
    assert "reshape[shape=(512,16,8)]" in format_graph(s)
    x = np.random.default_rng(1).standard_normal((64, 128, 8)).astype(np.float32)
    np.testing.assert_array_equal(interp.run(s, {"x": x})[id(s.outputs["out"])], x.max(axis=(0, 1), keepdims=True))


@pytest.mark.parametrize("rows, cols, chunk", [(8192, 512, 16), (8192, 1024, 32), (8192, 2048, 64), (65536, 4096, 64)])
def test_column_sums_split_into_chunks_for_about_2_18_invocations(rows, cols, chunk):
    g = _graph(lambda: ops.sum(emit("input", (), name="x", shape=(rows, cols), dtype="f32"), axis=0))
    assert f"reshape[shape=({rows // chunk},{chunk},{cols})]" in format_graph(split_reductions(g))


def test_short_reductions_are_left_alone():
    g = _graph(lambda: ops.sum(emit("input", (), name="x", shape=(1000, 64), dtype="f32"), axis=-1))
    assert format_graph(split_reductions(g)) == format_graph(g)


def test_dce_keeps_interface_leaves_and_drops_dead_work():
    def build():
        x = emit("input", (), name="x", shape=(4,), dtype="f32")
        emit("input", (), name="unused", shape=(2,), dtype="f32")
        ops.exp(x)  # dead
        return x * 2.0

    g = dce(_graph(build))
    text = format_graph(g)
    assert "unused: f32[2] = input" in text and "exp" not in text


def test_cse_merges_equal_constants():
    def build():
        x = emit("input", (), name="x", shape=(4,), dtype="f32")
        return x * 2.0 + x * 2.0

    g = cse_consts(_graph(build))
    assert format_graph(g).count("const[dtype=f32,value=2.0]") == 1


@pytest.mark.parametrize("name, most", [("sine_mlp", 12), ("addition_transformer", 186)])
def test_kernels_per_training_step_at_least_5x_fewer_than_tensorgrad(name, most):
    # tensorgrad 0.4.6 dispatches 63 (mlp-sin) and 933 (transformer) kernels per step
    prog = runpy.run_path(str(ROOT / "examples" / f"{name}.py"))["program"]
    c = compile_program(prog, verify=True)
    assert len(c.kernels["train"]) <= most


def test_layernorm_forward_is_two_reductions_and_one_elementwise_kernel():
    import aot
    from aot import nn

    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(64)

    prog = aot.Program(
        "ln", model=M, infer={"predict": aot.Infer(lambda m, x: m.ln(x), inputs={"x": aot.f32(32, 64)})}
    )
    kinds = [k.kind for k in compile_program(prog).schedules["predict"].kernels]
    assert kinds == ["reduce", "reduce", "elementwise"]


def test_adam_update_is_one_kernel_writing_params_and_state_in_place():
    prog = runpy.run_path(str(ROOT / "examples" / "sine_mlp.py"))["program"]
    c = compile_program(prog)
    last = c.schedules["train"].kernels[-1]
    plan = c.plans["train"]
    arenas = sorted(plan.loc[id(t)].arena for t in last.outs)
    assert arenas == ["params", "state", "state_1"]  # adam.m in state, adam.v in state_1 and not plan.copies


def _split_and_cse_graph() -> Graph:
    # two equal constants (merged by cse_consts) feeding a sum long enough for split_reductions
    g = Graph("g")
    with tracing(g):
        x = emit("input", (), name="x", shape=(3, 1 << 17), dtype="f32")
        y = ops.sum(x * 2.0 + 2.0, axis=1) * 2.0
        g.outputs["out"] = ops.max(ops.reshape(x, (-1,)) * 2.0) + y
    return g


@pytest.mark.parametrize("example", ["sine_mlp", "addition_transformer", "split"])
def test_passes_leave_their_input_graph_unchanged(example):
    """Each pass returns a new graph: the input graph's nodes, their inputs, attrs and outputs stay."""
    from aot.frontend import trace_program
    from aot.passes import PIPELINE

    if example == "split":
        graphs = [_split_and_cse_graph()]
    else:
        prog = runpy.run_path(str(ROOT / "examples" / f"{example}.py"))["program"]
        graphs = list(trace_program(prog).graphs.values())
    for g in graphs:
        for p in PIPELINE:
            before = [(n, n.op, n.inputs, dict(n.attrs), n.out, n.out.node) for n in g.nodes]
            groups = [dict(d) for d in (g.outputs, g.captures, g.updates, g.grads, g.persist)]
            out = p(g)
            after = [(n, n.op, n.inputs, dict(n.attrs), n.out, n.out.node) for n in g.nodes]
            assert len(before) == len(after) and all(
                a[0] is b[0] and a[1] == b[1] and a[2] == b[2] and a[3] == b[3] and a[4] is b[4] and a[5] is b[5]
                for a, b in zip(before, after)
            ), f"{p.__name__} changed its input graph {g.name}"
            assert groups == [dict(d) for d in (g.outputs, g.captures, g.updates, g.grads, g.persist)]
            g = out


# ---- reductions over separate runs of axes (BatchNorm's (0, 2, 3)) -----------------------------


def _bn_sum(shape, op="sum"):
    return _graph(lambda: getattr(ops, op)(emit("input", (), name="x", shape=shape, dtype="f32"), axis=(0, 2, 3)))


@pytest.mark.parametrize(
    "shape, op, chunk, pad",
    [
        ((64, 16, 28, 28), "sum", 2, 0),  # ResNet-20's first stage: 32 chunks of 2 images, 512 rows of 1568
        ((64, 32, 14, 14), "sum", 4, 0),  # its second: 16 chunks of 4 images, 512 rows of 784
        ((99, 16, 20, 20), "sum", 4, 1),  # 99 images do not divide: zero padding up to 25 chunks of 4
        ((99, 16, 20, 20), "max", 9, 0),  # max has no padding value: a divisor of 99 (11 chunks of 9)
    ],
)
def test_separate_axes_reduction_is_cut_along_its_outer_axis(shape, op, chunk, pad, monkeypatch):
    monkeypatch.setattr(split_rules, "SPLIT_CELLS", 0)  # the outermost axis (cells: the test below)
    g = _bn_sum(shape, op)
    s = split_reductions(g)
    verify(s)
    text = format_graph(s)
    n = shape[0] + pad
    assert f"reshape[shape=({n // chunk},{chunk},{shape[1]},{shape[2]},{shape[3]})]" in text, text
    assert (f"pad[after={pad},axis=0,before=0]" in text) == bool(pad)
    assert f"= {op}[axes=(1,3,4)" in text and f"= {op}[axes=(0,)" in text, text
    x = np.random.default_rng(3).standard_normal(shape)
    a = interp.run(g, {"x": x}, np.float64)[id(g.outputs["out"])]
    b = interp.run(s, {"x": x}, np.float64)[id(s.outputs["out"])]
    np.testing.assert_allclose(b, a, rtol=1e-12)


def test_separate_axes_reductions_with_many_outputs_or_short_rows_are_left_alone(monkeypatch):
    # many outputs; short rows (ResNet-20's third stage, 3,136 per channel); max over 61 (prime)
    # images, which no chunking of the outermost axis divides
    monkeypatch.setattr(split_rules, "SPLIT_CELLS", 0)
    for shape in ((64, 512, 8, 8), (64, 64, 7, 7), (61, 16, 24, 24)):
        op = "max" if shape[0] == 61 else "sum"
        g = _bn_sum(shape, op)
        assert format_graph(split_reductions(g)) == format_graph(g), shape


@pytest.mark.parametrize(
    "shape, op, cells",
    [
        ((64, 16, 28, 28), "sum", "(64,16,7,4,28)"),  # ResNet-20's first stage: 448 cells of 4 rows
        ((64, 32, 14, 14), "sum", "(64,32,7,2,14)"),  # its second: 448 cells of 2 rows
        ((61, 16, 24, 24), "max", "(61,16,8,3,24)"),  # 61 images (prime): their rows are cut
    ],
)
def test_separate_axes_reduction_is_cut_in_cells_of_rows(shape, op, cells):
    """split_rules.SPLIT_CELLS: the first axis of the second run (H) in chunks, the first stage
    keeping N: about SPLIT_CELL_CHUNKS cells (n, rows) per channel."""
    g = _bn_sum(shape, op)
    s = split_reductions(g)
    verify(s)
    text = format_graph(s)
    assert f"reshape[shape={cells}]" in text, text
    assert f"= {op}[axes=(3,4)" in text and f"= {op}[axes=(0,2)" in text, text
    x = np.random.default_rng(3).standard_normal(shape)
    a = interp.run(g, {"x": x}, np.float64)[id(g.outputs["out"])]
    b = interp.run(s, {"x": x}, np.float64)[id(s.outputs["out"])]
    np.testing.assert_allclose(b, a, rtol=1e-12)


def test_one_short_row_is_split_when_alone():
    """An LSTM's gradient norm: one row of 87,291 squares (under SPLIT_CONTIGUOUS) in 22 chunks."""
    g = _graph(lambda: ops.sum(ops.square(emit("input", (), name="x", shape=(87291,), dtype="f32"))))
    assert "reshape[shape=(22,4096)]" in format_graph(split_reductions(g))
    g = _graph(lambda: ops.sum(emit("input", (), name="x", shape=(64, 87291), dtype="f32"), axis=-1))
    assert format_graph(split_reductions(g)) == format_graph(g)  # 64 rows fill a GPU as they are


@pytest.mark.parametrize("cells", [0, 1])
@pytest.mark.parametrize("kernels", ["gpu", "cpu"])
def test_split_batchnorm_statistics_on_the_gpu_match_the_unsplit_reference(kernels, cells, monkeypatch):
    """Sums and maxima over (0, 2, 3) of [99, 16, 20, 20] (first stages of 25 chunks of 4 images,
    the last padded, and of 11 chunks of 9), with an inf in one channel and a NaN in another: the
    two-stage GPU kernels (both kernel sets) against the interpreter's one-stage reductions,
    values and gradients; with split_rules.SPLIT_CELLS, cells of rows of [99, 16, 20, 20] instead."""
    from gpu_harness import make_program, run_both

    monkeypatch.setattr(split_rules, "SPLIT_CELLS", cells)

    rng = np.random.default_rng(4)
    x = rng.normal(size=(99, 16, 20, 20))
    x[5, 1, 2, 3] = np.inf
    x[40, 2, 7, 7] = np.nan
    params = {"w": rng.normal(size=(1, 16, 1, 1))}
    inputs = {"x": x, "z": rng.normal(size=(99, 16, 20, 20))}

    def body(m, f):
        return {
            "s": ops.sum(f["x"] * m.w, axis=(0, 2, 3)),
            "q": ops.sum(f["z"] * f["z"] * m.w, axis=(0, 2, 3)),
            "m": ops.max(f["x"], axis=(0, 2, 3)),
            "mz": ops.max(f["z"] * m.w, axis=(0, 2, 3)),
        }

    program, feeds, _ = make_program(f"split_bn_{kernels}_{cells}", params, inputs, body)
    c = compile_program(program)
    sums = [n for n in c.graphs["train"].nodes if n.op in ("sum", "max") and n.attrs["axes"] == ((3, 4) if cells else (1, 3, 4))]
    assert len(sums) >= 4, "expected the statistics' first stages"
    [(gpu, ref)], _ = run_both(program, feeds, kernels=kernels)
    assert np.isinf(gpu.captures["s"][1]) and np.isnan(gpu.captures["s"][2]) and np.isnan(gpu.captures["m"][2])
    for name in ("s", "q", "m", "mz"):
        np.testing.assert_allclose(gpu.captures[name], ref.captures[name], rtol=2e-5, atol=2e-4, err_msg=name)
    np.testing.assert_allclose(gpu.grads["w"][0, 3:], ref.grads["w"][0, 3:], rtol=2e-5, atol=2e-3)
