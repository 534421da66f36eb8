"""Generated GPU kernels against the reference interpreter, on whatever adapter wgpu finds
(lavapipe, Mesa's CPU Vulkan, in CI).

- every op case of tests/op_cases.py, forward and gradients: the cases run in batches of
  ~20 per compiled Program (one parameter per f32 operand, exact values; loss = sum of
  <out, ct> over the batch; one capture per output), each case checked on its own;
- code generator stress: matmuls of odd shapes (not multiples of any tile), a grid wider
  than 65535 workgroups, reductions over 1..5000 elements in both reduce variants (through
  the compiler, and the template forced into each variant), argmax ties, layout chains
  fused into one kernel, concats assembled in place, out-of-range indices reaching the
  kernels, dropout's mask bit for bit, and WebGPU's limit of 8 storage bindings.

Integer outputs (argmax, casts, i32 layout) must match exactly; f32 ones within float32
tolerances (looser where many terms are summed in a different order).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import aot
from aot import codegen, interp, ops
from aot.pipeline import compile_program
from aot.frontend import trace_program
from aot.templates import render
from aot.plan import arena_binding

from gpu_harness import (
    MAX_STORAGE_BINDINGS,
    assert_all_close,
    assert_close,
    assert_loss_close,
    case_program,
    check_bindings,
    compile_checked,
    make_program,
    raw_gpu_step,
    reference_step,
    run_both,
    run_wgsl,
)
from op_cases import CASES

wgpu = pytest.importorskip("wgpu")
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def adapter():
    a = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if a is None:
        pytest.skip("no WebGPU adapter")
    return a


@pytest.fixture(scope="module")
def device(adapter):
    return adapter.request_device_sync()


# ---- every op case ------------------------------------------------------------------------------

BATCH = 20
# case -> why its GPU kernel disagrees with the interpreter; run in a batch of their own so the
# other batches' losses stay finite. strict: the test fails once the bug is fixed.
KNOWN_BUGS: dict[str, str] = {}  # case name -> reason, for an xfail(strict=True) until fixed


def _batches() -> list[list]:
    good = [c for c in CASES if c.name not in KNOWN_BUGS]
    out = [good[i : i + BATCH] for i in range(0, len(good), BATCH)]
    bad = [c for c in CASES if c.name in KNOWN_BUGS]
    return out + ([bad] if bad else [])


BATCHES = _batches()
BATCH_OF = {c.name: (i, k) for i, b in enumerate(BATCHES) for k, c in enumerate(b)}


class BatchResults:
    """Each batch is compiled and run once, on first use; a failure is kept and re-reported."""

    def __init__(self):
        self.done: dict[int, object] = {}

    def get(self, i: int):
        if i not in self.done:
            try:
                program, inputs, slots = case_program(f"opcases{i}", BATCHES[i])
                [(gpu, ref)], _ = run_both(program, inputs)
                self.done[i] = (gpu, ref, slots)
            except Exception as e:  # noqa: BLE001 - reported by every test of the batch
                self.done[i] = e
        r = self.done[i]
        if isinstance(r, Exception):
            names = ", ".join(c.name for c in BATCHES[i])
            pytest.fail(f"batch {i} ({names}) failed to build or run: {type(r).__name__}: {r}")
        return r


@pytest.fixture(scope="module")
def batches(adapter):
    return BatchResults()


# ops whose outputs or gradients sum many terms (reductions, matmuls, normalizations)
_SUMMING = {"sum", "mean", "matmul", "conv2d", "Conv2d", "Linear", "LayerNorm", "RMSNorm", "GroupNorm", "InstanceNorm2d",
            "InstanceNorm1d", "cross_entropy",
            "softmax", "log_softmax", "softmax_causal", "fold", "embedding", "Embedding", "take_along_axis"}


def _case_param(c):
    marks = [pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[c.name])] if c.name in KNOWN_BUGS else []
    return pytest.param(c, id=c.name, marks=marks)


@pytest.mark.parametrize("case", [_case_param(c) for c in CASES])
def test_op_case_matches_interpreter(case, batches):
    i, k = BATCH_OF[case.name]
    gpu, ref, slots = batches.get(i)
    slot = slots[k]
    assert slot.case is case
    rtol, atol = (2e-4, 5e-5) if case.op in _SUMMING else (1e-4, 1e-5)
    for oname in slot.out_names:
        assert_close(gpu.captures[oname], ref.captures[oname], f"{case.name}: output {oname}", rtol, atol)
    for pname in slot.param_names:
        assert_close(gpu.grads[pname], ref.grads[pname], f"{case.name}: gradient of {pname}", rtol, atol)


def _batch_param(i, b):
    marks = [pytest.mark.xfail(strict=True, reason="holds a known bug")] if any(c.name in KNOWN_BUGS for c in b) else []
    return pytest.param(i, id=f"{b[0].name}..{b[-1].name}", marks=marks)


@pytest.mark.parametrize("i", [_batch_param(i, b) for i, b in enumerate(BATCHES)])
def test_op_case_batch_loss(i, batches):
    gpu, ref, _ = batches.get(i)
    assert_loss_close(gpu, ref, f"batch {i}")


def test_every_case_is_batched():
    assert sorted(BATCH_OF) == sorted(c.name for c in CASES)
    assert all(len(b) <= BATCH for b in BATCHES)


# ---- matmul shapes that fit no tile ----------------------------------------------------------------


def _uniform(seed, *shape, lo=-2.0, hi=2.0):
    return np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)


def test_matmul_odd_shapes(adapter):
    params = {
        "a": _uniform(1, 37, 53), "b": _uniform(2, 53, 19), "bias": _uniform(3, 19),
        "a3": _uniform(4, 3, 37, 53), "b3": _uniform(5, 3, 53, 19),
        "s": _uniform(6, 2, 37, 53),
        "row": _uniform(7, 1, 53), "col": _uniform(8, 53, 1),
        "u": _uniform(9, 65, 1), "v": _uniform(10, 1, 67),
        "p": _uniform(11, 130, 70), "q": _uniform(12, 70, 129),
        "c": _uniform(13, 37, 11),
    }

    def body(m, f):
        return {
            "linear_relu": ops.relu(m.a @ m.b + m.bias),  # bias + activation in the epilogue
            "batched": m.a3 @ m.b3,
            "shared_weight": m.s @ m.b,  # [2, 37, 53] @ [53, 19] folds into [74, 53] @ [53, 19]
            "dot": m.row @ m.col,
            "outer": m.u @ m.v,  # K = 1
            "large": m.p @ m.q,  # 130 x 129: two tiles and a remainder each way
            "transposed_lhs": ops.transpose(m.a, (1, 0)) @ m.c,  # a strided operand: [53, 37] @ [37, 11]
        }

    program, inputs, _ = make_program("mm_odd", params, {}, body)
    [(gpu, ref)], wgsl = run_both(program, inputs)
    assert any("matmul" in k for k in wgsl)
    assert_all_close(gpu, ref, "odd matmuls", rtol=1e-4, atol=2e-4)


# ---- grids wider than 65535 workgroups -------------------------------------------------------------


@pytest.mark.parametrize("n_groups", [1, 2, 65535, 65536, 65537, 131070, 131071, 4 * 65535 + 3, 65535 * 65535])
def test_grid_split(n_groups):
    x, y, z = codegen._grid(n_groups)
    assert z == 1 and 1 <= x <= codegen.MAX_GROUPS and 1 <= y <= codegen.MAX_GROUPS
    assert x * y >= n_groups, "every workgroup index is covered"
    assert x * (y - 1) < n_groups, "no row of workgroups is entirely idle"
    if n_groups <= codegen.MAX_GROUPS:
        assert (x, y) == (n_groups, 1)


def test_elementwise_and_reduce_beyond_65535_workgroups(adapter):
    n = 65535 * 256 + 1000  # 16.8M elements: the elementwise grid folds onto gid.y
    rows = 65600  # one workgroup per row: the reduce grid folds too

    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.s = self.param((1,), init=aot.init.literal([0.5]))

    program = aot.Program(
        "wide",
        model=M,
        infer={
            "ew": aot.Infer(lambda m, x: ops.sqrt(ops.abs(x) * 2.0) + m.s, inputs={"x": aot.f32(n)}),
            "red": aot.Infer(lambda m, x: ops.sum(x, -1) * m.s, inputs={"x": aot.f32(rows, 256)}),
        },
    )
    model = compile_checked(program)
    try:
        grids = {k: [g for _, g in e["dispatches"]] for k, e in model._program["entries"].items()}
        assert any(g[1] > 1 for g in grids["ew"]) and any(g[1] > 1 for g in grids["red"]), grids
        x = _uniform(0, n)
        xr = np.random.default_rng(1).integers(-4, 5, (rows, 256)).astype(np.float32)  # exact sums
        got, got_r = model.ew(x=x), model.red(x=xr)
    finally:
        model.close()
    ref = interp.Reference(trace_program(program))
    np.testing.assert_allclose(got, ref.predict("ew", x=x), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got_r, ref.predict("red", x=xr))


# ---- reductions ------------------------------------------------------------------------------------

RED_SIZES = [1, 63, 64, 255, 256, 300, 5000]
_PER_WG = re.compile(r"for \(var r: u32 = lid\.x; r < (\d+)u")
_SEQUENTIAL = re.compile(r"for \(var r: u32 = 0u; r < (\d+)u; r = r \+ (?:1u|one)\)")
_CHUNKED = re.compile(r"for \(var r: u32 = r0; r < min\(r0 \+ 256u, (\d+)u\); r = r \+ one\)")


def _variants(wgsl: dict[str, str]) -> set[tuple[str, int]]:
    out = set()
    for src in wgsl.values():
        out |= {("per_wg", int(n)) for n in _PER_WG.findall(src)}
        out |= {("sequential", int(n)) for n in _SEQUENTIAL.findall(src)}
        out |= {("chunked", int(n)) for n in _CHUNKED.findall(src)}
    return out


@pytest.mark.parametrize("kernels", ["gpu", "cpu"])
def test_reductions_of_every_size(adapter, kernels):
    """sum / mean / max / argmax over 1..70000 elements along the last and the first axis. GPU
    set: with 3 outputs per reduction one workgroup per output from 16 elements up (few rows:
    codegen.FEW_ROWS), one invocation per output below. CPU set: a
    row of up to 8192 summed in order by one invocation, 256 rows at a time (an inner loop) over
    256; a longer one by a tree (Mesa 22's lavapipe ends an invocation's loops after 65535 steps)."""
    rng = np.random.default_rng(5)
    params, inputs = {}, {}
    sizes = RED_SIZES + [70000]
    for n in sizes:
        params[f"x{n}"] = rng.uniform(-2, 2, (3, n))
        params[f"t{n}"] = rng.uniform(-2, 2, (n, 3))  # reduced along axis 0: strided reads
        params[f"z{n}"] = rng.integers(-3, 3, (3, n)).astype(np.float64)  # ties everywhere
    for n in (64, 255):
        inputs[f"big{n}"] = rng.uniform(-2, 2, (2048, n))
        inputs[f"bigz{n}"] = rng.integers(0, 4, (2048, n))  # i32, cast below: ties again
        params[f"w{n}"] = rng.uniform(0.5, 1.5, n)

    def body(m, f):
        out = {}
        for n in sizes:
            x, t, z = getattr(m, f"x{n}"), getattr(m, f"t{n}"), getattr(m, f"z{n}")
            out[f"sum{n}"] = ops.sum(x, -1)
            out[f"mean{n}"] = ops.mean(ops.square(x), -1, keepdims=True)
            out[f"max{n}"] = ops.max(x, -1)
            out[f"sum_axis0_{n}"] = ops.sum(t, 0)
            out[f"max_ties{n}"] = ops.max(z, -1)  # the gradient splits over tied maxima
            out[f"argmax_ties{n}"] = ops.argmax(z, -1)
            out[f"argmax_axis0_{n}"] = ops.argmax(t, 0)
        for n in (64, 255):
            w = getattr(m, f"w{n}")
            out[f"bigsum{n}"] = ops.sum(f[f"big{n}"] * w, -1)  # its w-gradient sums 2048 rows
            out[f"bigmax{n}"] = ops.max(f[f"big{n}"] * w, -1)
            out[f"bigargmax{n}"] = ops.argmax(ops.cast(f[f"bigz{n}"], "f32") * w, -1)
        return out

    program, inputs, _ = make_program("reductions", params, inputs, body)
    [(gpu, ref)], wgsl = run_both(program, inputs, kernels=kernels)
    # the CPU set's sources sit beside the GPU set's merged dispatches and chains
    got = _variants({k: v for k, v in wgsl.items() if kernels == "gpu" or "// CPU variant" in v})
    if kernels == "gpu":
        want = {("sequential", 1)} | {("per_wg", n) for n in (63, 64, 255, 256, 300, 5000, 70000)}
    else:
        want = {("sequential", n) for n in RED_SIZES if n <= 256} | {("chunked", n) for n in (300, 5000)}
        assert {n for kind, n in got if kind == "per_wg"} == {70000}
    assert want <= got, f"reduce variants not generated: {sorted(want - got)}"
    for name in ref.captures:
        n = int(re.findall(r"\d+", name)[-1])
        # sequential vs pairwise/tree summation orders: error grows with the number of terms
        assert_close(gpu.captures[name], ref.captures[name], f"reduction {name}", rtol=1e-4, atol=2e-7 * n + 1e-6)
    for name in ref.grads:  # w's gradient sums 2048 rows; the others are ct (or ct / n) scattered
        assert_close(gpu.grads[name], ref.grads[name], f"gradient of {name}", rtol=1e-4, atol=5e-4 if name[0] == "w" else 1e-5)
    for n in RED_SIZES:  # ties: the first maximum wins
        z = params[f"z{n}"]
        np.testing.assert_array_equal(gpu.captures[f"argmax_ties{n}"], np.argmax(z, -1))
    assert_loss_close(gpu, ref, "reductions")


def _reduce_kernel(op: str, per_wg: bool, n_out: int, n_red: int, cpu: bool = False, lanes=None, inner=None):
    """The reduce template on its own, forced into one variant: x [n_out, n_red] in `inputs`
    (cpu: the CPU set's, one invocation a row, CPU_ROW_WG rows a workgroup (3 rows: the guard
    keeps the other invocations out), loops stepping by `one`, sums in chunks)."""
    wg = codegen.CPU_ROW_WG if cpu else codegen.WG
    grid = codegen._grid((n_out // lanes["p"] if lanes else n_out) if per_wg else -(-n_out // wg))
    out_arena, out_type = ("work_i32", "i32") if op == "argmax" else ("work", "f32")
    wgsl = render(
        "wgsl/reduce.wgsl.j2",
        header=[f"// {op} over {n_red}, {'per_wg' if per_wg else 'sequential'}"],
        bindings="\n".join([
            "@group(0) @binding(0) var<storage, read> inputs: array<f32>;",
            f"@group(0) @binding(1) var<storage, read_write> {out_arena}: array<{out_type}>;",
        ]),
        helpers={"max": ["f32_bits", "is_nan_f32", "max_nan"], "argmax": ["f32_bits", "gt_nan", "is_nan_f32"], "sum": ["plus_zero_f32"]}.get(op, []),
        wg=wg, accs=[{"op": op, "val": "v0"}], per_wg=per_wg, n_out=n_out, n_red=n_red,
        row=grid[0] * (1 if per_wg else wg), outer=[], inner=[inner or "        let v0: f32 = inputs[o * %du + r];" % n_red],
        epilogue=[], stores=[f"{out_arena}[o] = res0;"], one_buf="inputs" if cpu else "",
        chunk=codegen.CPU_SUM_CHUNK if cpu else 0, lanes=lanes,
    )
    return wgsl, grid, out_arena


@pytest.mark.parametrize("per_wg,cpu", [(True, False), (False, False), (False, True)], ids=["per_wg", "sequential", "cpu"])
@pytest.mark.parametrize("op", ["sum", "max", "argmax"])
def test_reduce_template_in_both_variants(device, op, per_wg, cpu):
    """Small integers sum exactly in any order, so both variants must match NumPy bit for bit.
    Row 0 is all negative with its maximum repeated (max starts from -inf, not 0; argmax keeps
    the first), row 1 has one maximum in the middle, row 2 is one long tie."""
    # 70000 elements: a tree's invocations loop 274 times each (Mesa 22's lavapipe ends an
    # invocation's loops after 65535 steps in all: the CPU set sums no row that long in one)
    for n in RED_SIZES + ([70000] if per_wg else []):
        rng = np.random.default_rng(n)
        x = np.stack([rng.integers(-9, -1, n), rng.integers(-2, 3, n), np.full(n, 1.0)]).astype(np.float32)
        x[1, n // 2] = 7.0
        wgsl, grid, arena = _reduce_kernel(op, per_wg, 3, n, cpu)
        dtype = np.int32 if op == "argmax" else np.float32
        out = run_wgsl(device, wgsl, grid, {"inputs": x.ravel(), arena: np.full(3, -77, dtype)})[arena]
        want = {"sum": x.sum(-1), "max": x.max(-1), "argmax": np.argmax(x, -1).astype(np.int32)}[op]
        np.testing.assert_array_equal(out, want, err_msg=f"{op} over {n} elements")


@pytest.mark.parametrize("op", ["sum", "max", "argmax"])
def test_reduce_template_with_lanes(device, op):
    """codegen.reduce_lanes's variant: x [n_red, 24] reduced over its rows, 8 outputs a workgroup
    (3 groups of lanes, 32 row walkers each), against NumPy bit for bit (small integers); the
    maximum of output 1 repeated (argmax keeps the first), output 2 one long tie."""
    for n in (32, 33, 300, 5000):
        rng = np.random.default_rng(n)
        x = rng.integers(-9, 9, (n, 24)).astype(np.float32)
        x[n // 3, 1] = x[n - 1, 1] = 20.0
        x[:, 2] = 1.0
        lanes = {"p": 8, "a": 24, "b": 1, "ncb": 3, "groups": 3}
        wgsl, grid, arena = _reduce_kernel(op, True, 24, n, lanes=lanes, inner="        let v0: f32 = inputs[r * 24u + o];")
        assert grid == (3, 1, 1) and "codegen.reduce_lanes" in wgsl
        dtype = np.int32 if op == "argmax" else np.float32
        out = run_wgsl(device, wgsl, grid, {"inputs": x.ravel(), arena: np.full(24, -77, dtype)})[arena]
        want = {"sum": x.sum(0), "max": x.max(0), "argmax": np.argmax(x, 0).astype(np.int32)}[op]
        np.testing.assert_array_equal(out, want, err_msg=f"{op} over {n} rows")


# ---- layout chains ----------------------------------------------------------------------------------


def test_layout_chain_fuses_into_one_kernel(adapter):
    """transpose -> narrow -> pad -> concat (inner axis) -> exp: one kernel, nothing stored between.
    Only ops whose VJPs do not reuse their inputs, so the backward pass keeps nothing alive."""
    params = {"x": _uniform(20, 5, 7), "y": _uniform(21, 4, 3)}

    def body(m, f):
        a = ops.pad(ops.narrow(ops.transpose(m.x * 1.5, (1, 0)), 0, 1, 4), 1, 2, 1)  # [4, 8]
        b = ops.transpose(ops.narrow(m.x, 1, 2, 4), (1, 0))  # [4, 5]: a strided view of x
        c = ops.concat([a, b * 2.0, ops.pad(m.y + 1.0, 1, 0, 1)], axis=1)  # [4, 17]
        return {"chain": ops.exp(c * 0.5)}

    program, inputs, _ = make_program("chain", params, {}, body)
    c = compile_program(program)
    s, ks = c.schedules["train"], c.kernels["train"]
    target = c.graphs["train"].captures["chain"]
    writers = [kc for k, kc in zip(s.kernels, ks) if k.out is target]
    assert len(writers) == 1
    fused = writers[0].ops.split()
    for op in ("mul", "transpose", "narrow", "pad", "add", "concat", "exp"):
        assert op in fused, f"{op} not fused into {writers[0].name}: {fused}"
    stack, seen = [target], set()
    while stack:  # nothing between the parameters and the output owns storage
        t = stack.pop()
        if id(t) in seen or t.node.op == "param":
            continue
        seen.add(id(t))
        v = s.views.get(id(t))
        assert t is target or v is None or v.base.node.op == "param", f"{t.node.op} is materialized"
        stack.extend(t.node.inputs)
    assert sum("concat" in kc.ops.split() for kc in ks) == 1
    [(gpu, ref)], _ = run_both(program, inputs)
    assert_all_close(gpu, ref, "layout chain")


def test_leading_axis_concat_assembled_in_place(adapter):
    """A leading-axis concat is written slice by slice by its inputs' kernels, except when one
    tensor fills two slices (it has one home) or an input is itself a concat or a leaf."""
    params = {"a": _uniform(30, 2, 6), "b": _uniform(31, 3, 2, 3), "c": _uniform(32, 6, 1)}

    def body(m, f):
        v = ops.tanh(m.a)
        return {
            "slices": ops.concat([ops.sin(m.a), ops.reshape(m.b * 2.0, (3, 6)), ops.transpose(ops.exp(m.c), (1, 0))], 0),
            "twice": ops.concat([v, v], 0),  # one tensor, two slices
            "nested": ops.concat([ops.concat([ops.sqrt(ops.abs(m.a) + 1.0), m.a], 0), ops.reshape(m.b, (3, 6))], 0),
            "leaf": ops.concat([m.a, ops.reshape(m.c, (1, 6))], 0),
        }

    program, inputs, _ = make_program("concat_in_place", params, {}, body)
    [(gpu, ref)], _ = run_both(program, inputs)
    assert_all_close(gpu, ref, "leading-axis concats")


def test_strided_views_of_storage(adapter):
    """Reads through views with offsets and strides (narrow / transpose / broadcast of
    parameters), feeding elementwise, reduce and matmul kernels, and a reshape of a
    non-contiguous view (no longer a view: recomputed through its flat index)."""
    params = {"x": _uniform(60, 6, 9), "w": _uniform(61, 5, 4), "b": _uniform(62, 1, 9)}

    def body(m, f):
        xt = ops.transpose(m.x, (1, 0))  # [9, 6], strides (1, 9)
        tail = ops.narrow(ops.narrow(m.x, 0, 2, 3), 1, 4, 5)  # [3, 5] at offset 22
        return {
            "ew": ops.narrow(xt, 0, 3, 5) * ops.transpose(ops.narrow(ops.broadcast_to(m.b, (6, 9)), 1, 3, 5), (1, 0)),
            "sum_tail": ops.sum(tail, 0),
            "max_tail_t": ops.max(ops.transpose(tail, (1, 0)), -1),
            "mm_tail": tail @ m.w,  # a strided, offset operand
            "mm_t": ops.transpose(ops.narrow(m.x, 1, 1, 5), (1, 0)) @ ops.narrow(m.x, 1, 0, 4),  # [5, 6] @ [6, 4]
            "flat_of_t": ops.reshape(xt, (2, 27)) * 3.0,
        }

    program, inputs, _ = make_program("views", params, {}, body)
    [(gpu, ref)], _ = run_both(program, inputs)
    assert_all_close(gpu, ref, "strided views", rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("p", [3, -2, -1, 5])
def test_integer_powers_of_negative_bases(adapter, p):
    params = {"x": -np.linspace(0.5, 2.0, 6)}
    program, inputs, _ = make_program(f"powers{p + 9}", params, {}, lambda m, f: {"y": m.x**p})
    [(gpu, ref)], _ = run_both(program, inputs)
    assert_all_close(gpu, ref, f"x**{p}")


# ---- indices out of range ---------------------------------------------------------------------------

BIG, SMALL = 2**31 - 1, -(2**31)


def test_out_of_range_indices_are_clamped_like_the_interpreter(adapter):
    """The runtime rejects out-of-range indices before dispatching (API.md §5); to see what the
    kernels do with them anyway, the step runs through the package's Engine directly (the same
    packing and dispatches as model.step, minus `_pick`'s validation). gather and
    take_along_axis clamp, one_hot gives a zero row (so do their VJPs), exactly as `interp`."""
    params = {"table": _uniform(40, 7, 3), "x": _uniform(41, 3, 5), "logits": _uniform(42, 4, 5), "w": _uniform(43, 6, 5)}
    inputs = {
        "idx_emb": np.array([[-1, 0, 6, 7], [100, SMALL, BIG, 3]]),
        "idx_oh": np.array([-1, 0, 4, 5, BIG, SMALL]),
        "idx_tala": np.array([[-1, 5, 4, 0], [BIG, -7, 2, 9], [3, SMALL, 1, 5]]),
        "targets": np.array([-1, 5, 2, 1000]),
    }

    def body(m, f):
        return {
            "emb": ops.embedding(m.table, f["idx_emb"]),
            "one_hot": ops.one_hot(f["idx_oh"], 5) * m.w,
            "tala": ops.take_along_axis(m.x, f["idx_tala"], -1),
            "ce": ops.cross_entropy(m.logits, f["targets"], reduction="none"),
        }

    program, inputs, _ = make_program("bad_indices", params, inputs, body)
    model = compile_checked(program)
    try:
        with pytest.raises(ValueError, match="outside"):
            model.step(**inputs)
        assert model.step_count == 0
        gpu = raw_gpu_step(model, inputs)
    finally:
        model.close()
    ref = reference_step(trace_program(program), inputs, program.seed)
    assert_all_close(gpu, ref, "out-of-range indices")
    np.testing.assert_array_equal(gpu.captures["emb"][0, 0], params["table"][0])  # -1 clamps to row 0
    np.testing.assert_array_equal(gpu.captures["emb"][1, 2], params["table"][6])  # 2**31-1 to the last
    np.testing.assert_array_equal(gpu.captures["one_hot"][[0, 3, 4, 5]], 0.0)


# ---- dropout --------------------------------------------------------------------------------------


def test_dropout_mask_matches_the_interpreter_bit_for_bit(adapter):
    """The WGSL hash and the NumPy one must agree on every bit: same kept elements, in an
    elementwise kernel, inside a reduction and in a matmul epilogue, on two steps."""
    params = {"x": _uniform(50, 3000), "y": _uniform(51, 37, 53), "a": _uniform(52, 37, 53), "b": _uniform(53, 53, 19)}

    def body(m, f):
        return {
            "d1": ops.dropout(m.x, 0.3),
            "d2": ops.dropout(m.y * 2.0, 0.5),
            "dsum": ops.sum(ops.dropout(m.y, 0.1), 1),
            "dmm": ops.dropout(m.a @ m.b, 0.25),
        }

    program, inputs, _ = make_program("dropout", params, {}, body)
    steps, _ = run_both(program, inputs, steps=2)
    for t, (gpu, ref) in enumerate(steps, 1):
        for name in ("d1", "d2", "dmm"):
            kept = ref.captures[name] != 0
            np.testing.assert_array_equal(gpu.captures[name] != 0, kept, err_msg=f"step {t}: {name} mask")
            assert 0.2 < kept.mean() < 0.95
        assert_all_close(gpu, ref, f"dropout step {t}", rtol=1e-4, atol=1e-4)
    assert np.any((steps[0][0].captures["d1"] != 0) != (steps[1][0].captures["d1"] != 0)), "a new mask every step"


# ---- bindings ---------------------------------------------------------------------------------------


def test_kernels_stay_within_eight_storage_bindings():
    """A program touching every arena (params, grads, Adam state, f32 and i32 inputs, f32 and
    i32 work) still binds at most 8 storage buffers per kernel. No GPU needed."""

    class Net(aot.Module):
        def __init__(self):
            super().__init__()
            self.emb = aot.nn.Embedding(11, 8)
            self.l1 = aot.nn.Linear(8, 16)
            self.ln = aot.nn.LayerNorm(16)
            self.l2 = aot.nn.Linear(16, 11)

    def loss(m, tok, y, noise):
        h = ops.dropout(ops.gelu(m.l1(m.emb(tok) + noise)), 0.1)
        logits = m.l2(m.ln(h))
        aot.capture("pred", ops.argmax(logits, -1))
        return ops.cross_entropy(logits, y) + ops.mean(ops.cast(ops.argmax(logits, -1), "f32")) * 0.0

    program = aot.Program(
        "bindings",
        model=Net,
        train=aot.Train(loss, inputs={"tok": aot.i32(4, 6), "y": aot.i32(4, 6), "noise": aot.f32(4, 6, 8)},
                        optimizer=aot.optim.AdamW(lr=1e-3, clip_grad_norm=1.0)),
        infer={"predict": aot.Infer(lambda m, tok: m.l2(m.ln(ops.gelu(m.l1(m.emb(tok))))), inputs={"tok": aot.i32("B", 6)})},
        dims={"B": (1, 4)},
    )
    c = compile_program(program)
    wgsl = c.program["_wgsl"]
    check_bindings(wgsl)
    arenas = set()
    for ks in c.kernels.values():
        for k in ks:
            assert len(k.bindings) <= MAX_STORAGE_BINDINGS, k.name
            declared = re.findall(r"@binding\((\d+)\) var<storage, (\w+)> (\w+):", k.wgsl)
            assert [(a, acc) for _, acc, a in declared] == list(k.bindings), k.name
            assert all(int(i) == arena_binding(a) for i, _, a in declared), k.name  # fixed numbers
            arenas |= {a for a, _ in k.bindings}
    assert {"params", "grads", "state", "inputs", "inputs_i32", "work"} <= arenas


@pytest.mark.parametrize("max_k", [None, 100])
def test_cpu_set_matmul_longer_than_the_loop_limit(adapter, monkeypatch, max_k):
    """A matmul over a K longer than the CPU set's matmul may walk (Mesa 22's lavapipe ends an
    invocation's loops after 65535 steps) runs the GPU kernel, or a split into shorter products;
    either way the product is right. K = 70000 (split), and K = 300 over a limit of 100."""
    rng = np.random.default_rng(11)
    K = 70000 if max_k is None else 300
    if max_k is not None:
        monkeypatch.setattr(codegen, "CPU_MATMUL_MAX_K", max_k)
    params = {"w": rng.uniform(-1, 1, (K, 4))}
    inputs = {"x": rng.uniform(-1, 1, (8, K))}

    def body(m, f):
        return {"y": f["x"] @ m.w}

    program, inputs, _ = make_program("long_k", params, inputs, body)
    [(gpu, ref)], wgsl = run_both(program, inputs, kernels="cpu")
    for src in wgsl.values():
        if "// CPU variant" in src:
            assert all(int(k) <= codegen.CPU_MATMUL_MAX_K for k in re.findall(r"for \(var k = 0u; k < (\d+)u", src))
    if max_k is not None:  # the forward product: the GPU kernel in both sets
        forward = [v for n, v in wgsl.items() if "matmul" in n and "[8x300] @ [300x4]" in v]
        assert forward and all("// CPU variant" not in v for v in forward)
    assert_close(gpu.captures["y"], ref.captures["y"], "x @ w", rtol=1e-4, atol=1e-3)
    assert_close(gpu.grads["w"], ref.grads["w"], "gradient of w", rtol=1e-4, atol=1e-4)
