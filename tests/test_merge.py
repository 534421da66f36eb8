"""merge.py: independent kernels share a dispatch, with the same results as one dispatch each.

Structure (every example, no GPU): the plan accounts for every buffer a kernel binds (else its
footprint is unknown and it merges with nothing); every pair of kernels that conflict (one writes
what the other reads or writes) keeps its order in the dispatch list; no dispatch straddles a
training graph's cut; the transformers lose a fifth of their dispatches or more; read-only and
vec4 bindings only where nothing in the dispatch writes the buffer.
On the adapter: merged and unmerged builds train alike (losses, parameters, gradients,
predictions; bit for bit on lavapipe), with both kernel sets; row chains form only where each
workgroup reads its own rows, and compute what the kernels one by one do.
"""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import numpy as np
import pytest

import aot
from aot import chain, merge, nn, ops
from aot.pipeline import compile_program
from aot.plan import buffer_of

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ["sine_mlp", "addition_transformer", "mnist_cnn", "kan_tiny", "vae", "nerf_tiny", "makemore", "pokeformer"]


def _program(name):
    return runpy.run_path(str(ROOT / "examples" / f"{name}.py"))["program"]


def _placement(c, key) -> dict[int, tuple[int, tuple | None, int]]:
    """kernel index -> (dispatch, the row chain it is a stage of or None, its stage there)."""
    ks = c.kernels[key]
    where = {}
    for d, code in enumerate(c.dispatches[key]):
        units = code.parts if code.kind == "merged" else [code]
        for u in units:
            stages = u.parts if u.kind == "chain" else [u]
            for st, part in enumerate(stages):
                where[ks.index(part)] = (d, (d, u.name) if u.kind == "chain" else None, st)
    return where


def _order_kept(c, key) -> None:
    s, p, ks = c.schedules[key], c.plans[key], c.kernels[key]
    prints = [merge.footprint(k, p, code) for k, code in zip(s.kernels, ks)]
    pos = _placement(c, key)
    assert sorted(pos) == list(range(len(ks))), "every kernel is dispatched exactly once"
    for i in range(len(ks)):
        assert prints[i].known, f"{ks[i].name}: binds a buffer its footprint does not cover"
        for j in range(i + 1, len(ks)):
            if not merge.conflicts(prints[i], prints[j]):
                continue
            (di, ci, si), (dj, cj, sj) = pos[i], pos[j]
            if ci is not None and ci == cj:  # stages of one chain: j reads what i wrote, nothing more
                assert si < sj, f"{ks[j].name} must be a later stage than {ks[i].name}"
                assert not merge.overlap(prints[j].writes, prints[i].reads + prints[i].writes), ks[j].name
            else:
                assert di < dj, f"{ks[j].name} must run after {ks[i].name}"
    if c.cuts[key] is not None:
        cut = s.update_from
        assert all((pos[i][0] < c.cuts[key]) == (i < cut) for i in pos), "a dispatch straddles the cut"


def _bindings_fit_their_use(c, key) -> int:
    """A large matmul binds the scratch it only reads read-only (faster on a GPU), other kernels
    bind scratch read_write (neighbours share bind groups); a vec4 view (plan.VEC_SUFFIX) is bound
    read-only, by large matmuls and dispatches that never write its buffer. Returns the vec4 views
    bound."""
    s, p, ks = c.schedules[key], c.plans[key], c.kernels[key]
    views = 0
    for k, code in zip(s.kernels, ks):
        written = {w[0] for w in merge.footprint(k, p, code).writes}
        for a, acc in code.bindings:
            base = buffer_of(a)
            if a != base:
                views += 1
                assert k.large and acc == "read" and base not in written, (code.name, a, acc)
            elif acc == "read_write":
                assert base in written or (not k.large and base.startswith("work")), (code.name, a)
    for code in c.dispatches[key]:
        written = {buffer_of(a) for a, acc in code.bindings if acc == "read_write"}
        assert not any(a != buffer_of(a) and buffer_of(a) in written for a, _ in code.bindings), code.name
    return views


@pytest.mark.parametrize("name", EXAMPLES)
def test_merged_dispatches_keep_every_dependency(name):
    c = compile_program(_program(name))
    views = 0
    for key in c.kernels:
        _order_kept(c, key)
        views += _bindings_fit_their_use(c, key)
    if name == "vae":  # large matmuls (Kernel.large) reading scratch only: read as vec4s
        assert views > 0
        for code in c.dispatches[key]:
            if code.parts:
                assert len(re.findall(r"^fn main\(", code.wgsl, re.M)) == 1
                assert len(code.bindings) <= 8
            # a chain's elementwise stage never turns a wide kernel into a long loop
            for span in re.findall(r"for \(var e = lid; e < (\d+)u;", code.wgsl):
                assert int(span) <= chain.MAX_PER_INVOCATION * 256, (code.name, span)


def test_merging_cuts_the_transformers_dispatches():
    """The addition transformer's kernels are all small: a fifth fewer dispatches or better.
    transformer_large's large kernels keep their own (merge.MAX_WORK); its small ones merge."""
    for name, most in (("addition_transformer", 0.6), ("transformer_large", 0.85)):
        c = compile_program(_program(name))
        n, d = len(c.kernels["train"]), len(c.dispatches["train"])
        assert d <= most * n, f"{name}: {n} kernels in {d} dispatches"
        entry = c.program["entries"]["train"]
        assert entry["update_from"] == c.cuts["train"] < d
        # the CPU kernel set dispatches each kernel on its own, cut where the schedule is
        assert len(entry["dispatches_cpu"]) == n and entry["update_from_cpu"] == c.schedules["train"].update_from
        big = [k for k in c.schedules["train"].kernels if merge.work(k) > merge.MAX_WORK]
        for code in c.dispatches["train"]:
            if code.kind == "merged":  # only small kernels share a dispatch
                for u in code.parts:
                    ms = [c.kernels["train"].index(p) for p in (u.parts if u.kind == "chain" else [u])]
                    assert sum(merge.work(c.schedules["train"].kernels[m]) for m in ms) <= merge.MAX_WORK
        assert name == "addition_transformer" or big


def test_unmerged_build_dispatches_every_kernel():
    c = compile_program(_program("sine_mlp"), merge_dispatches=False)
    assert c.dispatches == c.kernels


# --- on the adapter ------------------------------------------------------------------------------


class Block(aot.Module):
    """LayerNorm, attention, an MLP: the row and column reductions, products and their
    gradients that merging pairs up."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 16, init=aot.init.randn(0.5))
        self.ln = nn.LayerNorm(16)
        self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16)
        self.head = nn.Linear(16, 11)

    def __call__(self, tokens):
        x = self.emb(tokens)
        h = self.ln(x)
        split = lambda t: ops.transpose(ops.reshape(t, (4, 5, 2, 8)), (0, 2, 1, 3))  # noqa: E731
        a = ops.attention(split(self.q(h)), split(self.k(h)), split(self.v(h)), causal=True)
        x = x + ops.reshape(ops.transpose(a, (0, 2, 1, 3)), (4, 5, 16))
        x = x + self.down(ops.relu(self.up(x)))
        return self.head(x)


def _loss(m, tokens, targets):
    return ops.mean(ops.cross_entropy(m(tokens), targets))


BLOCK = aot.Program(
    "merge_block",
    model=Block,
    train=aot.Train(
        _loss, inputs={"tokens": aot.i32(4, 5), "targets": aot.i32(4, 5)},
        optimizer=aot.optim.AdamW(lr=1e-2, weight_decay=0.01, clip_grad_norm=1.0),
    ),
    infer={"predict": aot.Infer(lambda m, tokens: m(tokens), inputs={"tokens": aot.i32(4, 5)})},
    seed=3,
)


def _batch(seed):
    r = np.random.default_rng(seed)
    return {"tokens": r.integers(0, 11, (4, 5)).astype(np.int32), "targets": r.integers(0, 11, (4, 5)).astype(np.int32)}


def _run(model, steps=3):
    losses = [model.step(**_batch(i)) for i in range(steps)]
    return losses, model.params(), model.grads(), model.predict(tokens=_batch(9)["tokens"])


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["gpu", "cpu"])
def test_merged_training_matches_one_kernel_per_dispatch(kernels):
    """The same operations in the same order, so the same results: bit for bit on a CPU adapter
    (lavapipe, where CI runs). A GPU driver may contract a*b + c into an FMA differently once a
    kernel's code sits in a larger shader (a row chain's stages: 1-ulp gradient differences on
    an H100, which Adam's normalization lifts to ~6e-6 in a bias whose true gradient is 0)."""
    assert len(compile_program(BLOCK).dispatches["train"]) < len(compile_program(BLOCK).kernels["train"])
    runs, exact = [], True
    for merge_dispatches in (True, False):
        model = aot.compile(BLOCK, kernels=kernels, merge_dispatches=merge_dispatches)
        entry = model.PROGRAM["entries"]["train"]
        # the CPU set's own list wherever the build wrote one (merged dispatches, or grids of its own)
        expected = entry.get("dispatches_cpu", entry["dispatches"]) if kernels == "cpu" else entry["dispatches"]
        assert model._engine.entries["train"]["dispatches"] == expected
        exact = exact and model._engine.adapter_info.get("adapter_type") == "CPU"
        try:
            runs.append(_run(model))
        finally:
            model.close()
    (la, pa, ga, ya), (lb, pb, gb, yb) = runs
    if exact:
        assert la == lb
    np.testing.assert_allclose(la, lb, rtol=1e-6)
    for n in pa:
        check = np.testing.assert_array_equal if exact else lambda a, b, err_msg: np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5, err_msg=err_msg)
        check(pa[n], pb[n], err_msg=n)
        check(ga[n], gb[n], err_msg=n)
    if exact:
        np.testing.assert_array_equal(ya, yb)
    np.testing.assert_allclose(ya, yb, rtol=1e-4, atol=1e-6)


# --- row chains: a stage reads only what its own workgroup wrote ---------------------------------


class Rows(aot.Module):
    def __init__(self):
        super().__init__()


def _permuted(s):
    """s[8] read at other rows through views only (reshape, transpose): what the locality check
    must see through."""
    return ops.reshape(ops.transpose(ops.reshape(s, (2, 4)), (1, 0)), (8, 1))


ROWS = aot.Program(
    "merge_rows",
    model=Rows,
    infer={
        # a row sum, then an elementwise kernel that reads it at the same row: one chain
        "direct": aot.Infer(lambda m, x: x * ops.sum(x, axis=1, keepdims=True), inputs={"x": aot.f32(8, 64)}),
        # ... at other rows (other workgroups' sums): stays two kernels
        "permuted": aot.Infer(lambda m, x: x * _permuted(ops.sum(x, axis=1)), inputs={"x": aot.f32(8, 64)}),
        # ... at other rows through an op that is not a view: stays two kernels
        "flipped": aot.Infer(lambda m, x: x * ops.flip(ops.sum(x, axis=1, keepdims=True), (0,)), inputs={"x": aot.f32(8, 64)}),
    },
)


def _layernorm(x):
    mu = ops.mean(x, axis=1, keepdims=True)
    d = x - mu
    return d * ops.rsqrt(ops.mean(d * d, axis=1, keepdims=True) + 1e-5)


# 4096 rows of 256-1024 elements: the row kernels and their chain run 64 invocations a row
# (codegen.ROW_WG), also where a row is not a multiple of 64 long
MANY_ROWS = aot.Program(
    "merge_many_rows",
    model=Rows,
    infer={
        "ln": aot.Infer(lambda m, x: _layernorm(x), inputs={"x": aot.f32(4096, 512)}),
        "ln_ragged": aot.Infer(lambda m, x: _layernorm(x), inputs={"x": aot.f32(4096, 300)}),
    },
)


def test_many_short_rows_chain_with_64_invocations_a_row():
    c = compile_program(MANY_ROWS)
    for key, dispatches in c.dispatches.items():
        (code,) = dispatches
        assert code.kind == "chain" and len(code.parts) == 3, key
        assert "@workgroup_size(64)" in code.wgsl and code.wgsl.count("storageBarrier();") == 2, key


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["gpu", "cpu"])
def test_many_short_rows_chains_compute_a_layernorm(kernels):
    rng = np.random.default_rng(3)
    model = aot.compile(MANY_ROWS, kernels=kernels)
    try:
        for entry, n in (("ln", 512), ("ln_ragged", 300)):
            for _ in range(2):
                x = (rng.normal(size=(4096, n)) * rng.uniform(0.1, 10, size=(4096, 1)) + 3).astype(np.float32)
                mu = x.mean(axis=1, keepdims=True, dtype=np.float64)
                want = (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=1, keepdims=True) + 1e-5)
                np.testing.assert_allclose(getattr(model, entry)(x=x), want, rtol=1e-4, atol=1e-4, err_msg=entry)
    finally:
        model.close()


def test_row_chains_only_where_each_workgroup_reads_its_own_rows():
    c = compile_program(ROWS)
    kinds = {key.split("[")[0]: [d.kind for d in c.dispatches[key]] for key in c.dispatches}
    assert kinds["direct"] == ["chain"], kinds
    assert kinds["permuted"] == ["kernel", "kernel"] and kinds["flipped"] == ["kernel", "kernel"], kinds
    (code,) = c.dispatches[next(k for k in c.dispatches if k.startswith("direct"))]
    assert code.wgsl.count("storageBarrier();") == 1 and len(code.parts) == 2


@pytest.mark.gpu
def test_row_chains_compute_what_the_kernels_do():
    """Each entry twice with other data: a stage reading another workgroup's row would see the
    last call's value there (or this call's, depending on the order workgroups run)."""
    rng = np.random.default_rng(0)
    model = aot.compile(ROWS, kernels="gpu")
    try:
        for entry in ("direct", "permuted", "flipped"):
            for _ in range(3):
                x = rng.normal(size=(8, 64)).astype(np.float32)
                s = x.sum(axis=1, dtype=np.float64)
                want = {"direct": s[:, None], "permuted": s.reshape(2, 4).T.reshape(8, 1), "flipped": s[::-1, None]}[entry]
                np.testing.assert_allclose(getattr(model, entry)(x=x), x * want, rtol=1e-5, atol=1e-4, err_msg=entry)
    finally:
        model.close()
