"""Issue 33 (robust under real use), the compiler's side: long chains build without recursion and
in near-linear time, index arithmetic that would overflow u32 is refused or done in 64 bits,
kernels stay under an adapter's binding limits, concurrent builds, hostile names."""

from __future__ import annotations

import time

import numpy as np
import pytest

import aot
from aot import ops

CHAIN = 800  # past the ~600 fused ops where the recursive renderer hit RecursionError


def _chain(h, n, reshape_every=0):
    for i in range(n):
        h = ops.tanh(h) if i % 2 else h * 1.001
        if reshape_every and i % reshape_every == 0:
            h = ops.reshape(h, (2, 4) if h.shape == (8,) else (8,))
    return ops.reshape(h, (8,))


def _chain_np(h, n):
    hs = []
    for i in range(n):
        hs.append(h)
        h = np.tanh(h) if i % 2 else h * 1.001
    return h, hs


def _grad_np(x, w, n):
    out, hs = _chain_np(x * w, n)
    g = np.full_like(out, 1.0 / out.size)
    for i in reversed(range(n)):
        g = g * (1 - np.tanh(hs[i]) ** 2) if i % 2 else g * 1.001
    return g * x


class _W(aot.Module):
    def __init__(self):
        super().__init__()
        self.w = self.param(
            (8,), init=aot.init.literal(np.linspace(0.5, 1.5, 8, dtype=np.float32))
        )


def test_long_fused_chain_builds_and_computes():
    """800 fused elementwise ops with reshapes between them (views rendered inline): the forward
    value and the gradient match NumPy; the recursive renderer raised RecursionError."""
    fwd = lambda m, x: _chain(x * m.w, CHAIN, reshape_every=7)  # noqa: E731
    program = aot.Program(
        "long_chain",
        model=_W,
        train=aot.Train(
            lambda m, x: ops.mean(fwd(m, x)), inputs={"x": aot.f32(8)}, optimizer=None
        ),
        infer={"f": aot.Infer(fwd, inputs={"x": aot.f32(8)})},
    )
    model = aot.compile(program)
    try:
        x = np.linspace(-1, 1, 8, dtype=np.float32)
        w = model.params()["w"].astype(np.float64)
        np.testing.assert_allclose(
            model.f(x=x), _chain_np(x * w, CHAIN)[0], rtol=1e-4, atol=1e-5
        )
        model.step(x=x)
        np.testing.assert_allclose(
            model.grads()["w"],
            _grad_np(x.astype(np.float64), w, CHAIN),
            rtol=1e-3,
            atol=1e-6,
        )
    finally:
        model.close()


@pytest.mark.slow
def test_20000_op_chain_builds_in_under_a_minute(tmp_path):
    """A 20,000-op training graph (40,000 with its gradient) builds in under a minute of CPU time:
    the fusion merge loop, the memory planner and the renderer were quadratic or worse (a
    4,000-op chain still compiling after 12 minutes). CPU time, not wall time: CI machines are shared.
    """
    program = aot.Program(
        "chain20k",
        model=_W,
        train=aot.Train(
            lambda m, x: ops.mean(_chain(x * m.w, 20000)),
            inputs={"x": aot.f32(8)},
            optimizer=aot.optim.SGD(lr=0.1),
        ),
    )
    t0 = time.process_time()
    aot.build(program, str(tmp_path))
    took = time.process_time() - t0
    assert took < 60, f"building a 20,000-op chain took {took:.1f} s of CPU time"


def test_fused_kernel_with_more_operands_than_an_offset_table_holds():
    """One elementwise kernel reading 70 tensors: the CPU set's offset table holds 64 (a 256-byte
    uniform slot), and the kernel used to build and then fail every call with a NumPy broadcast
    error; now its CPU variant has its offsets written in."""
    n = 70

    def f(m, **xs):
        total = xs["x0"]
        for i in range(1, n):
            total = total + xs[f"x{i}"] * float(i + 1)
        return total

    program = aot.Program(
        "many_operands",
        model=_W,
        infer={"f": aot.Infer(f, inputs={f"x{i}": aot.f32(3) for i in range(n)})},
    )
    feeds = {f"x{i}": np.full(3, 0.5 + i, np.float32) for i in range(n)}
    want = sum(feeds[f"x{i}"].astype(np.float64) * (i + 1) for i in range(n))
    for kernels in ("cpu", "gpu"):
        model = aot.compile(program, kernels=kernels)
        try:
            np.testing.assert_allclose(model.f(**feeds), want, rtol=1e-6)
        finally:
            model.close()


def _u32_lets_in_range(wgsl: str) -> list[str]:
    """The u32 `let`s of a kernel evaluated without wrapping at its last row (`o`) and last step
    (`r`): those that exceed 2**32 - 1 (each would wrap on the GPU)."""
    import re

    env = {"min": min, "max": max}
    m = re.search(r"if \((o|i) >= (\d+)u\)", wgsl)
    if m:
        env[m.group(1)] = int(m.group(2)) - 1
    m = re.search(r"for \(var r: u32 = [^;]*; r < (\d+)u", wgsl)
    if m:
        env["r"] = int(m.group(1)) - 1
    bad = []
    for name, expr in re.findall(r"let (v\d+): u32 = ([^;]*);", wgsl):
        try:
            env[name] = value = eval(
                re.sub(r"(\d+)u\b", r"\1", expr).replace("/", "//"), env
            )  # noqa: S307 - our own kernel text
        except NameError:
            continue
        if value >= 2**32:
            bad.append(f"{name} = {expr} = {value}")
    return bad


def test_row_sum_over_a_view_past_u32_keeps_indices_in_range(tmp_path):
    """sum over rows of a broadcast view of 65 x 2**26 elements (more than 2**32): the split
    reduction reshaped it through one flat u32 index and row 64 read row 0. Every index the
    kernels compute now stays below 2**32 (the reshape maps axes group by group)."""
    program = aot.Program(
        "big_rows",
        model=_W,
        infer={
            "f": aot.Infer(
                lambda m, x: ops.sum(ops.broadcast_to(x, (65, 2**26)) * 2.0, axis=1),
                inputs={"x": aot.f32(65, 1)},
            )
        },
    )
    out = aot.build(program, str(tmp_path))
    kernels = sorted((out / "big_rows" / "kernels").rglob("*.wgsl"))
    assert kernels
    for f in kernels:
        assert _u32_lets_in_range(f.read_text()) == [], f.name


def test_reshape_by_axis_groups_matches_numpy(monkeypatch):
    """The grouped reshape index (used past 2**31 elements) forced on small tensors: splits,
    merges and a reshape with no common grouping (flat index) give NumPy's values."""
    import aot.wgsl_expr as wx

    monkeypatch.setattr(wx, "FLAT_RESHAPE_MAX", 1)
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)

    def f(m, x):
        y = ops.reshape(x * 1.5, (6, 20))  # merge, merge
        z = ops.reshape(
            ops.transpose(y, (1, 0)), (4, 5, 3, 2)
        )  # split after a transpose (strided)
        w = ops.reshape(x + 1.0, (2, 12, 5))  # merge of the middle axes
        v = ops.reshape(x - 1.0, (5, 24))  # no common grouping: the flat index
        return (
            ops.sum(z, axis=(2, 3))
            + ops.sum(ops.reshape(w, (2, 3, 4, 5)), axis=(0, 1))
            + ops.reshape(ops.sum(v, axis=1), (1, 5))
        )

    program = aot.Program(
        "grouped_reshape",
        model=_W,
        infer={"f": aot.Infer(f, inputs={"x": aot.f32(2, 3, 4, 5)})},
    )
    model = aot.compile(program)
    try:
        y = (x * 1.5).reshape(6, 20)
        want = (
            y.T.reshape(4, 5, 3, 2).sum((2, 3))
            + (x + 1.0).sum((0, 1))
            + (x - 1.0).reshape(5, 24).sum(1).reshape(1, 5)
        )
        np.testing.assert_allclose(model.f(x=x), want, rtol=1e-5)
    finally:
        model.close()


def test_argmax_past_i32_is_a_build_error():
    """argmax over 2**32 elements emitted the literal 4294967296u and failed at its first call;
    its result is an i32 index, so the build now refuses an axis longer than 2**31."""
    program = aot.Program(
        "big_argmax",
        model=_W,
        infer={
            "f": aot.Infer(
                lambda m, x: ops.argmax(
                    ops.reshape(ops.broadcast_to(x, (2**16, 2**16)), (2**32,))
                ),
                inputs={"x": aot.f32(1, 1)},
            )
        },
    )
    with pytest.raises(aot.ShapeError, match=r"2\*\*31"):
        aot.compile(program)


def _tree(root) -> dict:
    from pathlib import Path

    root = Path(root)
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _small_program(name="twin", hidden=4, entries=("p",)):
    from aot import nn

    class Net(aot.Module):
        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(3, hidden)

    fwd = lambda m, x: ops.relu(m.l1(x))  # noqa: E731
    return aot.Program(
        name,
        model=Net,
        train=aot.Train(
            lambda m, x: ops.mean(fwd(m, x)),
            inputs={"x": aot.f32(2, 3)},
            optimizer=aot.optim.SGD(lr=0.1),
        ),
        infer={e: aot.Infer(fwd, inputs={"x": aot.f32(2, 3)}) for e in entries},
    )


def test_builds_from_two_threads_at_once(tmp_path):
    """Two threads tracing at the same moment (each waits inside its forward for the other), one
    an infer entry and one a training entry that branch on aot.is_training(): the tracing stack
    was one list for the process, so a thread read the other's mode and put its ops into the
    other's graph. Each thread's package now equals a lone build of its program."""
    import threading

    gate = threading.Barrier(2, timeout=60)

    def program(kind):
        from aot import nn

        class Net(aot.Module):
            def __init__(self):
                super().__init__()
                self.l1 = nn.Linear(3, 4)

        def fwd(m, x):
            h = m.l1(x)
            gate.wait()  # both threads are inside tracing now
            training = aot.is_training()
            gate.wait()  # and both have asked for their mode
            return ops.relu(h) * 2.0 if training else h

        if kind == "train":
            return aot.Program(
                "thr_train",
                model=Net,
                train=aot.Train(
                    lambda m, x: ops.mean(fwd(m, x)),
                    inputs={"x": aot.f32(2, 3)},
                    optimizer=None,
                ),
            )
        return aot.Program(
            "thr_infer",
            model=Net,
            infer={"f": aot.Infer(fwd, inputs={"x": aot.f32(2, 3)})},
        )

    errors = []

    def build(kind):
        try:
            aot.build(program(kind), str(tmp_path / "threads"))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=build, args=(k,)) for k in ("train", "infer")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    gate = threading.Barrier(1)  # a lone build passes its gate at once
    for kind in ("train", "infer"):
        aot.build(program(kind), str(tmp_path / "lone"))
        assert _tree(tmp_path / "threads" / f"thr_{kind}") == _tree(
            tmp_path / "lone" / f"thr_{kind}"
        )


_BUILD_SCRIPT = """
import sys
sys.path[:0] = [{tests!r}, {root!r}]
import aot
from test_robustness import _small_program
which = sys.argv[1]
p = _small_program(hidden=4, entries=("p", "q")) if which == "a" else _small_program(hidden=6, entries=("r", "s", "t"))
for _ in range(3):
    aot.build(p, sys.argv[2])
"""


def test_two_processes_building_one_name_leave_one_whole_build(tmp_path):
    """Two processes building different programs of one name into one folder, three times each, at
    once: the tree left is exactly one of the two lone builds (builds of a folder take turns).
    """
    import os
    import subprocess
    import sys

    script = tmp_path / "b.py"
    tests = os.path.dirname(os.path.abspath(__file__))
    script.write_text(_BUILD_SCRIPT.format(tests=tests, root=os.path.dirname(tests)))
    aot.build(_small_program(hidden=4, entries=("p", "q")), str(tmp_path / "lone_a"))
    aot.build(
        _small_program(hidden=6, entries=("r", "s", "t")), str(tmp_path / "lone_b")
    )
    lone = [_tree(tmp_path / f"lone_{w}" / "twin") for w in ("a", "b")]
    procs = [
        subprocess.Popen([sys.executable, str(script), w, str(tmp_path / "both")])
        for w in ("a", "b")
    ]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    assert _tree(tmp_path / "both" / "twin") in lone


def test_long_program_name_fails_at_once():
    """A 300-character name built for seconds, then failed writing a file ("File name too long");
    now aot.Program refuses it, naming the limit."""
    from aot.errors import InvalidNameError

    with pytest.raises(InvalidNameError, match="300 characters; at most 100"):
        aot.Program(
            "n" * 300,
            model=_W,
            infer={"f": aot.Infer(lambda m, x: x, inputs={"x": aot.f32(2)})},
        )
    aot.Program(
        "n" * 100,
        model=_W,
        infer={"f": aot.Infer(lambda m, x: x, inputs={"x": aot.f32(2)})},
    )
