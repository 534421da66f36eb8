"""The generated package's runtime surface (API.md §4/§5): input validation, load_params,
checkpoints, reset/seed, captures, thread safety and close().

One small program (embedding -> linear -> relu -> dropout -> head, cross-entropy with an
f32 weight input; captures; two Infer entries with a symbolic batch dim) is compiled once
for the module; a second tiny program (no optimizer) stands in for "a different program".
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import aot
from aot import interp, nn, ops
from aot.frontend import trace_program
from aot.runtime import rng as aot_rng

pytestmark = pytest.mark.gpu  # needs a WebGPU adapter (lavapipe on CI)

VOCAB, D, N, T = 10, 8, 4, 3
LR = 1e-2


class Tiny(aot.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D, init=aot.init.randn(0.5))
        self.l1 = nn.Linear(D, D, init=aot.init.kaiming())
        self.head = nn.Linear(D, VOCAB, init=aot.init.randn(0.3))

    def forward(self, tokens):
        h = aot.capture("hidden", ops.relu(self.l1(self.emb(tokens))))
        return self.head(ops.dropout(h, 0.2))  # identity in the Infer graphs


def tiny_loss(m, tokens, targets, w):
    ce = aot.capture("ce", ops.cross_entropy(m(tokens), targets, reduction="none"))
    return ops.sum(ce * w) * (1.0 / (N * T))


def predict(m, tokens):
    return m(tokens)


def score(m, tokens, w):
    return ops.sum(ops.max(m(tokens), -1) * w, -1)


PROGRAM = aot.Program(
    "rt_tiny",
    model=Tiny,
    train=aot.Train(
        tiny_loss,
        inputs={"tokens": aot.i32(N, T), "targets": aot.i32(N, T), "w": aot.f32(N, T)},
        optimizer=aot.optim.Adam(lr=LR, clip_grad_norm=1.0),
    ),
    infer={
        "predict": aot.Infer(predict, inputs={"tokens": aot.i32("B", T)}),
        "score": aot.Infer(score, inputs={"tokens": aot.i32("B", T), "w": aot.f32("B", T)}),
    },
    dims={"B": (1, N)},
    seed=7,
)
PARAM_ORDER = ["emb.W", "l1.W", "l1.b", "head.W", "head.b"]


class Other(aot.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)


OTHER = aot.Program(
    "rt_other",
    model=Other,
    train=aot.Train(lambda m, x: ops.sum(ops.square(m.lin(x))), inputs={"x": aot.f32(3, 2)}, optimizer=None),
)


def make_batch(seed):
    r = np.random.default_rng(seed)
    return {
        "tokens": r.integers(0, VOCAB, (N, T)).astype(np.int32),
        "targets": r.integers(0, VOCAB, (N, T)).astype(np.int32),
        "w": r.uniform(0.5, 1.5, (N, T)).astype(np.float32),
    }


B0 = make_batch(0)
Q = make_batch(1)["tokens"]  # predict queries


@pytest.fixture(scope="module")
def shared():
    model = aot.compile(PROGRAM)
    model.reset()
    base = {"init": model.params(), "loss": model.step(**B0), "params": model.params(), "grads": model.grads()}
    model.reset()
    yield model, base
    model.close()


@pytest.fixture
def model(shared):
    """The shared model, back at its initial state with the program's lr."""
    m, _ = shared
    m.reset()
    m.set_lr(LR)
    yield m


@pytest.fixture
def base(shared):
    return shared[1]


@pytest.fixture(scope="module")
def other():
    m = aot.compile(OTHER)
    yield m
    m.close()


def assert_same_params(a, b):
    assert list(a) == list(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def snapshot(m):
    return m.step_count, m.params(), m.grads()


def assert_unchanged(m, snap):
    count, params, grads = snap
    assert m.step_count == count
    assert_same_params(m.params(), params)
    assert_same_params(m.grads(), grads)


def assert_still_works(m, base):
    """After rejected calls, a valid first step gives exactly a never-disturbed model's result."""
    assert m.step(**B0) == base["loss"]
    assert_same_params(m.params(), base["params"])
    assert_same_params(m.grads(), base["grads"])
    assert m.step_count == 1


def with_(batch, **changes):
    out = dict(batch)
    out.update(changes)
    return out


# ---- bad inputs (API.md §4/§5) -----------------------------------------------------------------

STEP_CASES = {
    # name: (inputs, exception, fragments the message must contain)
    "unknown_name": (with_(B0, z=np.zeros((N, T), np.float32)), TypeError, ["'z'"]),
    "missing_name": ({"tokens": B0["tokens"], "targets": B0["targets"]}, TypeError, ["'w'"]),
    "wrong_shape": (with_(B0, w=np.ones((N, 2), np.float32)), ValueError, ["'w'", "f32[4,3]", "(4, 2)"]),
    "wrong_rank": (with_(B0, tokens=B0["tokens"].ravel()), ValueError, ["'tokens'", "i32[4,3]", "(12,)"]),
    "transposed": (with_(B0, targets=np.zeros((T, N), np.int32)), ValueError, ["'targets'", "i32[4,3]", "(3, 4)"]),
    "float_for_i32": (
        with_(B0, tokens=B0["tokens"].astype(np.float64)),
        TypeError,
        ["'tokens'", "i32[4,3]", "float64"],
    ),
    "float32_for_i32": (
        with_(B0, targets=B0["targets"].astype(np.float32)),
        TypeError,
        ["'targets'", "i32[4,3]", "float32"],
    ),
    "strings": (with_(B0, w=np.full((N, T), "a")), TypeError, ["'w'", "f32[4,3]", "<U1"]),
    "object_array": (with_(B0, w=np.ones((N, T), dtype=object)), TypeError, ["'w'", "f32[4,3]", "object"]),
    "none": (with_(B0, w=None), TypeError, ["'w'", "f32[4,3]"]),
    "ragged_list": (with_(B0, tokens=[[1, 2, 3], [4, 5]]), TypeError, ["'tokens'"]),
    "complex": (with_(B0, w=np.ones((N, T), np.complex64)), TypeError, ["'w'", "f32[4,3]", "complex64"]),
    "token_too_big": (with_(B0, tokens=np.full((N, T), VOCAB, np.int32)), ValueError, ["'tokens'", "10", "[0, 10)"]),
    "token_negative": (with_(B0, tokens=np.full((N, T), -1, np.int32)), ValueError, ["'tokens'", "-1", "[0, 10)"]),
    "one_bad_token": (
        with_(B0, tokens=np.where(np.arange(N * T).reshape(N, T) == 7, 12, B0["tokens"]).astype(np.int32)),
        ValueError,
        ["'tokens'", "12", "[0, 10)"],
    ),
    "target_too_big": (with_(B0, targets=np.full((N, T), 99, np.int64)), ValueError, ["'targets'", "99", "[0, 10)"]),
    "target_negative": (with_(B0, targets=-np.ones((N, T), np.int32)), ValueError, ["'targets'", "-1", "[0, 10)"]),
    "beyond_i32": (with_(B0, tokens=np.full((N, T), 2**40, np.int64)), ValueError, ["'tokens'", "i32"]),
}


@pytest.mark.parametrize("case", list(STEP_CASES))
def test_step_rejects_bad_input_before_dispatch(model, base, case):
    inputs, exc, fragments = STEP_CASES[case]
    snap = snapshot(model)
    with pytest.raises(exc) as e:
        model.step(**inputs)
    msg = str(e.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    assert_unchanged(model, snap)
    # a rejected captures=True call is the same
    with pytest.raises(exc):
        model.step(**inputs, captures=True)
    assert_unchanged(model, snap)
    assert_still_works(model, base)


PREDICT_CASES = {
    "undeclared_size": (
        "predict",
        {"tokens": np.zeros((7, T), np.int32)},
        ValueError,
        ["'tokens'", "i32[B,3]", "B in (1, 4)", "(7, 3)"],
    ),
    "size_zero": ("predict", {"tokens": np.zeros((0, T), np.int32)}, ValueError, ["'tokens'", "B in (1, 4)", "(0, 3)"]),
    "fixed_dim": ("predict", {"tokens": np.zeros((N, 5), np.int32)}, ValueError, ["'tokens'", "i32[B,3]", "(4, 5)"]),
    "inconsistent_sizes": (
        "score",
        {"tokens": np.zeros((1, T), np.int32), "w": np.ones((N, T), np.float32)},
        ValueError,
        ["'w'", "f32[B,3]", "B = 1", "(4, 3)"],
    ),
    "float_tokens": ("predict", {"tokens": Q.astype(np.float32)}, TypeError, ["'tokens'", "float32"]),
    "out_of_range": ("predict", {"tokens": Q + VOCAB}, ValueError, ["'tokens'", "[0, 10)"]),
    "negative": ("predict", {"tokens": -Q - 1}, ValueError, ["'tokens'", "[0, 10)"]),
    "unknown_name": ("predict", {"tokens": Q, "x": Q}, TypeError, ["'x'"]),
    "missing_name": ("score", {"tokens": Q}, TypeError, ["'w'"]),
    "strings": ("score", {"tokens": Q, "w": np.full((N, T), "x")}, TypeError, ["'w'", "f32[B,3]"]),
}


@pytest.mark.parametrize("case", list(PREDICT_CASES))
def test_infer_rejects_bad_input(model, base, case):
    entry, inputs, exc, fragments = PREDICT_CASES[case]
    before = model.predict(tokens=Q)
    snap = snapshot(model)
    with pytest.raises(exc) as e:
        getattr(model, entry)(**inputs)
    msg = str(e.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    assert_unchanged(model, snap)
    np.testing.assert_array_equal(model.predict(tokens=Q), before)
    assert_still_works(model, base)


def test_integer_and_list_data_for_f32_inputs_is_converted(model, base):
    ones_f = np.ones((N, T), np.float32)
    a = model.step(**with_(B0, w=ones_f))
    model.reset()
    b = model.step(**with_(B0, w=np.ones((N, T), np.int64)))
    model.reset()
    c = model.step(tokens=B0["tokens"].tolist(), targets=B0["targets"].astype(np.int64), w=ones_f.tolist())
    assert a == b == c
    assert isinstance(a, float)
    # f64 data is converted too (same values as the f32 batch)
    model.reset()
    assert model.step(**with_(B0, w=B0["w"].astype(np.float64))) == base["loss"]
    q = model.score(tokens=Q[:1], w=np.ones((1, T), np.int32))
    np.testing.assert_array_equal(q, model.score(tokens=Q[:1], w=np.ones((1, T), np.float32)))
    assert q.shape == (1,) and q.dtype == np.float32


def test_infer_variants_and_output_dtype(model):
    full = model.predict(tokens=Q)
    assert full.shape == (N, T, VOCAB) and full.dtype == np.float32
    one = model.predict(tokens=Q[2:3])
    np.testing.assert_allclose(one, full[2:3], rtol=1e-5, atol=1e-6)


# ---- load_params --------------------------------------------------------------------------------


def test_load_params_errors_change_nothing(model):
    p0 = model.params()
    with pytest.raises(KeyError, match=re.escape("nope")):
        model.load_params(dict(p0, nope=np.zeros(3, np.float32)))
    with pytest.raises(KeyError, match=re.escape("nope")):
        model.load_params({"nope": np.zeros(3, np.float32)}, partial=True)
    missing = dict(p0)
    del missing["l1.b"]
    with pytest.raises(KeyError, match=re.escape("l1.b")):
        model.load_params(missing)
    # wrong shape: nothing is written, not even the valid entries that come first
    bad = {k: v + 1.0 for k, v in p0.items()}
    bad["head.b"] = np.zeros((VOCAB, 1), np.float32)
    with pytest.raises(ValueError) as e:
        model.load_params(bad)
    for f in ("head.b", "(10,)", "(10, 1)"):
        assert f in str(e.value)
    with pytest.raises(ValueError, match="head.W"):
        model.load_params({"head.W": np.zeros((VOCAB, D), np.float32)}, partial=True)  # transposed
    with pytest.raises(TypeError, match="emb.W"):
        model.load_params({"emb.W": np.full((VOCAB, D), "a")}, partial=True)
    assert_same_params(model.params(), p0)
    assert model.step_count == 0


def test_load_params_partial_and_round_trip(model):
    p0 = model.params()
    model.load_params({"head.b": np.arange(VOCAB)}, partial=True)  # ints are converted
    p1 = model.params()
    np.testing.assert_array_equal(p1["head.b"], np.arange(VOCAB, dtype=np.float32))
    for k in p0:
        if k != "head.b":
            np.testing.assert_array_equal(p1[k], p0[k])
    for _ in range(2):
        model.step(**B0)
    trained = model.params()
    assert not np.array_equal(trained["l1.W"], p1["l1.W"])
    model.load_params(p0)
    assert_same_params(model.params(), p0)
    model.load_params(trained)
    assert_same_params(model.params(), trained)
    # params() is a copy
    trained["l1.W"][:] = 0
    assert not np.array_equal(model.params()["l1.W"], trained["l1.W"])
    # the Infer graphs see loaded params
    model.load_params(p0)
    out0 = model.predict(tokens=Q)
    model.reset(params=True, optimizer=False)
    np.testing.assert_array_equal(model.predict(tokens=Q), out0)


# ---- checkpoints --------------------------------------------------------------------------------


def test_restore_refuses_other_programs_and_bad_files(model, other, tmp_path):
    model.step(**B0)
    snap = snapshot(model)
    foreign = tmp_path / "other.npz"
    other.save(foreign)
    with pytest.raises(ValueError) as e:
        model.restore(foreign)
    assert "rt_other" in str(e.value) and "rt_tiny" in str(e.value)
    assert_unchanged(model, snap)

    good = tmp_path / "good.npz"
    model.save(good)
    with np.load(good) as z:
        data = {k: z[k] for k in z.files}
    # same program, but a parameter of the wrong shape
    shaped = dict(data, **{"param/l1.W": np.zeros((D, D + 1), np.float32)})
    np.savez(tmp_path / "shape.npz", **shaped)
    with pytest.raises(ValueError) as e:
        model.restore(tmp_path / "shape.npz")
    assert "l1.W" in str(e.value) and "(8, 9)" in str(e.value)
    # optimizer state of the wrong size
    np.savez(tmp_path / "state.npz", **dict(data, __state__=np.zeros(5, np.float32)))
    with pytest.raises(ValueError, match="state"):
        model.restore(tmp_path / "state.npz")
    # a missing parameter
    np.savez(tmp_path / "missing.npz", **{k: v for k, v in data.items() if k != "param/head.b"})
    with pytest.raises(KeyError, match="head.b"):
        model.restore(tmp_path / "missing.npz")
    # not a checkpoint at all
    np.savez(tmp_path / "plain.npz", a=np.zeros(3))
    with pytest.raises(ValueError, match="not an aot checkpoint"):
        model.restore(tmp_path / "plain.npz")
    model.step(**B0)
    snap = snapshot(model)
    for name in ("shape.npz", "state.npz", "plain.npz"):
        with pytest.raises(ValueError):
            model.restore(tmp_path / name)
    with pytest.raises(KeyError):
        model.restore(tmp_path / "missing.npz")
    assert_unchanged(model, snap)
    model.restore(good)
    assert model.step_count == 1


def test_failed_save_keeps_previous_checkpoint(model, tmp_path, monkeypatch):
    """An interrupted save (KeyboardInterrupt halfway through writing) leaves the previous
    checkpoint intact and no temporary files behind."""
    ckpt = tmp_path / "ckpt.npz"
    model.step(**B0)
    model.save(ckpt)
    saved = model.params()
    model.step(**B0)

    real = np.savez

    def torn(file, *args, **kwds):
        real(file, *args, **kwds)  # write everything, then cut the file and die
        file.truncate(file.tell() // 2)
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", torn)
    with pytest.raises(KeyboardInterrupt):
        model.save(ckpt)
    monkeypatch.setattr(np, "savez", real)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.npz"]

    def failing(file, *args, **kwds):
        file.write(b"PK\x03\x04 partial")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", failing)
    with pytest.raises(OSError, match="disk full"):
        model.save(tmp_path / "new.npz")
    monkeypatch.setattr(np, "savez", real)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.npz"]

    assert model.step_count == 2
    model.restore(ckpt)
    assert model.step_count == 1
    assert_same_params(model.params(), saved)


def test_killed_save_keeps_previous_checkpoint(shared, tmp_path):
    """A process killed (SIGKILL) in the middle of save(): the previous checkpoint still loads."""
    model, _ = shared
    root = aot.build(PROGRAM, tmp_path / "build")  # aot.compile's temporary folder is gone by now
    ckpt = tmp_path / "ckpt.npz"
    model.reset()
    model.step(**B0)
    model.save(ckpt)
    saved = model.params()
    script = textwrap.dedent(f"""
        import os, signal, sys
        import numpy as np
        sys.path.insert(0, {str(root)!r})
        from rt_tiny import Model
        m = Model()
        real = np.savez
        def torn(file, *a, **k):
            real(file, *a, **k)
            file.truncate(file.tell() // 2)
            file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        np.savez = torn
        m.save({str(ckpt)!r})
        """)
    env = dict(os.environ, XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    # the target was never touched; only the hidden temp file of the dead writer may remain
    leftovers = sorted(f for f in os.listdir(tmp_path) if f not in ("ckpt.npz", "build"))
    assert len(leftovers) == 1 and leftovers[0].startswith(".ckpt.npz."), leftovers  # hidden, named after the target
    model.reset()
    model.restore(ckpt)
    assert model.step_count == 1
    assert_same_params(model.params(), saved)
    # a save removes what a killed writer left once nobody holds it and it is a minute old
    model.save(ckpt)
    assert leftovers[0] in os.listdir(tmp_path)  # too fresh: it could be a writer that just started
    old = tmp_path / leftovers[0]
    os.utime(old, (old.stat().st_atime - 120, old.stat().st_mtime - 120))
    model.save(ckpt)
    assert sorted(os.listdir(tmp_path)) == ["build", "ckpt.npz"]


def test_save_restore_keeps_seed_and_step(shared, tmp_path):
    model, _ = shared
    cls = type(model)
    with cls(seed=5) as five:
        assert five.seed == 5
        five.step(**B0)
        five.save(tmp_path / "five.npz")
        nxt = five.step(**B0)
        after = five.params()
    with cls() as m:
        assert m.seed == PROGRAM.seed
        m.restore(tmp_path / "five.npz")
        assert m.seed == 5 and m.step_count == 1
        assert m.step(**B0) == nxt  # dropout stream of seed 5, step 2
        assert_same_params(m.params(), after)
        m.reset()  # reset(params=True) now gives seed 5's initial params
        with cls(seed=5) as ref:
            assert_same_params(m.params(), ref.params())


# ---- reset, seeds, set_lr -----------------------------------------------------------------------


def test_reset(model, base):
    for _ in range(3):
        model.step(**B0)
    trained = model.params()
    model.reset(params=True, optimizer=False)
    assert model.step_count == 3
    assert_same_params(model.params(), base["init"])
    model.load_params(trained)
    model.reset(params=False, optimizer=True)
    assert model.step_count == 0
    assert_same_params(model.params(), trained)
    model.reset()
    assert model.step_count == 0
    assert_same_params(model.params(), base["init"])
    assert all(not g.any() for g in model.grads().values())  # no last step, as on a new model
    # optimizer state is zeroed too: the next step is exactly a fresh model's first step
    assert_still_works(model, base)


def test_reset_keeps_set_lr(shared):
    model, base = shared
    cls = type(model)
    model.reset()
    model.set_lr(0.05)
    model.step(**B0)
    model.reset()
    with cls() as twin:
        twin.set_lr(0.05)
        assert model.step(**B0) == twin.step(**B0)
        p = model.params()
        assert_same_params(p, twin.params())
        assert not np.array_equal(p["l1.W"], base["params"]["l1.W"])  # not the program's lr
        # a schedule set with set_lr restarts at its own step 1 after reset(optimizer=True)
        sched = aot.lr.step(0.2, 1, 0.1)  # 0.2, 0.02, ...
        model.set_lr(sched)
        twin.set_lr(sched)
        model.step(**B0)
        model.reset()
        twin.reset()
        model.step(**B0)
        twin.step(**B0)
        assert_same_params(model.params(), twin.params())
        twin.reset()
        twin.set_lr(0.2)
        twin.step(**B0)
        assert_same_params(model.params(), twin.params())
    model.set_lr(LR)


def test_set_lr_validation(model, other):
    with pytest.raises((ValueError, TypeError)):
        model.set_lr(-1.0)
    with pytest.raises((ValueError, TypeError)):
        model.set_lr(("bogus", 1, 2, 3))
    with pytest.raises((ValueError, TypeError)):
        model.set_lr(float("nan"))
    with pytest.raises(RuntimeError, match="optimizer"):
        other.set_lr(0.1)
    for bad in (
        lambda: aot.lr.step(1e-2, 0, 0.5),
        lambda: aot.lr.warmup(1e-2, 0, 1e-3),
        lambda: aot.lr.linear(1e-2, 0.0, 0),
    ):
        with pytest.raises(ValueError):
            bad()
    # NumPy scalars are numbers too
    results = []
    for lr in (0.25, np.float32(0.25), np.float64(0.25), aot.lr.step(np.float64(0.25), np.int64(3), np.float32(0.5))):
        model.reset()
        model.set_lr(lr)
        model.step(**B0)
        results.append(model.params())
    for r in results[1:]:
        assert_same_params(r, results[0])


def test_same_seed_same_params_matching_rng_reference(shared):
    model, _ = shared
    cls = type(model)
    with cls() as a, cls() as b:
        pa, pb = a.params(), b.params()
    assert_same_params(pa, pb)
    assert list(pa) == PARAM_ORDER == model.param_names
    # aot.runtime.rng reference: stream = the parameter's index, std from the init spec
    std = {"emb.W": 0.5, "l1.W": 2**0.5 / np.sqrt(D), "head.W": 0.3}
    for i, name in enumerate(PARAM_ORDER):
        shape = pa[name].shape
        if name in std:
            want = (aot_rng.standard_normal(PROGRAM.seed, i, int(np.prod(shape))) * std[name]).astype(np.float32)
            want = want.reshape(shape)
        else:
            want = np.zeros(shape, np.float32)
        np.testing.assert_array_equal(pa[name], want, err_msg=name)
    # the generator itself is pinned (same numbers on every machine, today and later)
    np.testing.assert_array_equal(
        aot_rng.standard_normal(0, 0, 5),
        [0.5375021802170297, -0.0986816284022982, 0.6604136374171299, -0.4635204466827368, -0.5823546711691922],
    )
    np.testing.assert_array_equal(
        aot_rng.standard_normal(1234, 7, 3), [0.9003950050098477, 2.271944652633981, 1.673817382485678]
    )
    assert (aot_rng.step_seed(0, 1), aot_rng.step_seed(5, 3)) == (151149761, 1425570387)


class Wide(aot.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(1024, 700, init=aot.init.randn(0.02))
        self.b = nn.Linear(700, 600, init=aot.init.randn(0.05))


WIDE = aot.Program(
    "rt_wide",
    model=Wide,
    infer={"predict": aot.Infer(lambda m, x: m.b(m.a(x)), inputs={"x": aot.f32(1, 1024)})},
    seed=3,
)


def test_a_model_over_a_million_parameters_draws_them_in_threads_bit_for_bit():
    """Model() draws the parameters of a large model in threads (each has its own stream and
    slice): the values must be exactly those of the reference generator, whatever the order."""
    from aot.runtime import model as runtime_model

    with aot.compile(WIDE) as m:
        assert m._total >= runtime_model._PARALLEL_INIT  # the threaded path
        got = m.params()
    std = {"a.W": 0.02, "b.W": 0.05}
    for i, (name, shape) in enumerate([("a.W", (1024, 700)), ("a.b", (700,)), ("b.W", (700, 600)), ("b.b", (600,))]):
        want = np.zeros(shape, np.float32)
        if name in std:
            want = (aot_rng.standard_normal(3, i, int(np.prod(shape))) * std[name]).astype(np.float32).reshape(shape)
        np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_different_seed_different_params(shared):
    model, base = shared
    cls = type(model)
    with cls(seed=5) as m:
        assert m.seed == 5
        p5 = m.params()
    for name in ("emb.W", "l1.W", "head.W"):
        assert not np.array_equal(p5[name], base["init"][name]), name
    np.testing.assert_array_equal(p5["l1.b"], base["init"]["l1.b"])  # zeros are zeros


# ---- captures and Infer graphs vs the interpreter ------------------------------------------------


@pytest.fixture(scope="module")
def traced():
    return trace_program(PROGRAM)


def reference_run(traced, monkeypatch, fn):
    """Run fn(ref) and collect the interpreter's environments (to read captures back)."""
    envs = []
    real = interp.run

    def spy(g, leaves, dtype=np.float32):
        env = real(g, leaves, dtype)
        envs.append((g, env))
        return env

    monkeypatch.setattr(interp, "run", spy)
    out = fn()
    monkeypatch.setattr(interp, "run", real)
    ((g, env),) = envs
    return out, {n: env[id(t)] for n, t in g.captures.items()}


def test_step_captures_match_interpreter(model, base, traced, monkeypatch):
    ref = interp.Reference(traced)
    res = model.step(**B0, captures=True)
    assert isinstance(res.loss, float) and res.loss == base["loss"]
    want_loss, want = reference_run(traced, monkeypatch, lambda: ref.step(**B0))
    assert res.loss == pytest.approx(want_loss, rel=1e-5)
    assert sorted(res.captures) == sorted(want) == ["ce", "hidden"]
    assert res.captures["hidden"].shape == (N, T, D) and res.captures["ce"].shape == (N, T)
    for k, v in want.items():
        assert res.captures[k].dtype == np.float32
        np.testing.assert_allclose(res.captures[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    got = model.params()
    for k, v in ref.params.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    # a later plain step returns a float again
    assert isinstance(model.step(**B0), float)


def test_infer_sees_updated_params_and_captures(model, traced, monkeypatch):
    ref = interp.Reference(traced)
    before = model.predict(tokens=Q)
    np.testing.assert_allclose(before, ref.predict(tokens=Q), rtol=1e-5, atol=1e-6)
    model.step(**B0)
    ref.step(**B0)
    res = model.predict(tokens=Q, captures=True)
    after = res.output
    assert not np.allclose(after, before)
    want_out, want = reference_run(traced, monkeypatch, lambda: ref.predict(tokens=Q))
    np.testing.assert_allclose(after, want_out, rtol=1e-5, atol=1e-6)
    assert sorted(res.captures) == ["hidden"]
    np.testing.assert_allclose(res.captures["hidden"], want["hidden"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(model.predict(tokens=Q), after)  # inference changes nothing


def test_optimizer_none_computes_grads_only(other):
    other.reset()
    p0 = other.params()
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    loss = other.step(x=x)
    assert isinstance(loss, float) and other.step_count == 1
    assert_same_params(other.params(), p0)
    g = other.grads()
    np.testing.assert_allclose(g["lin.b"], 2 * (x @ p0["lin.W"] + p0["lin.b"]).sum(0), rtol=1e-5)
    assert other.step(x=x) == loss


def test_infer_only_program(tmp_path):
    class Lin(aot.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 2, init=aot.init.randn(1.0))

    prog = aot.Program(
        "rt_infer_only", model=Lin, infer={"predict": aot.Infer(lambda m, x: m.lin(x), inputs={"x": aot.f32(2, 3)})}
    )
    with aot.compile(prog) as m:
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        p = m.params()
        np.testing.assert_allclose(m.predict(x=x), x @ p["lin.W"] + p["lin.b"], rtol=1e-5, atol=1e-6)
        assert not hasattr(m, "step")
        with pytest.raises(RuntimeError, match="train"):
            m.grads()
        with pytest.raises(RuntimeError, match="optimizer"):
            m.set_lr(0.1)
        m.load_params({"lin.b": np.ones(2)}, partial=True)
        m.save(tmp_path / "c.npz")
        m.reset()
        assert not m.params()["lin.b"].any()
        m.restore(tmp_path / "c.npz")
        np.testing.assert_array_equal(m.params()["lin.b"], [1, 1])


# ---- threads and close ---------------------------------------------------------------------------


def test_predict_while_training_in_threads(model):
    batches = [make_batch(10 + i) for i in range(8)]
    seq_losses, snapshots = [], [model.predict(tokens=Q)]
    for b in batches:
        seq_losses.append(model.step(**b))
        snapshots.append(model.predict(tokens=Q))
    model.reset()

    errors, seen, losses = [], [], []
    done, started = threading.Event(), threading.Event()

    def trainer():
        try:
            # the readers first: on a loaded machine the 8 steps had ended before any read began
            started.wait(timeout=60)
            for b in batches:
                losses.append(model.step(**b))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            done.set()

    def reader():
        try:
            started.set()
            while True:  # one read at least, then until training ends
                seen.append(model.predict(tokens=Q))
                if done.is_set() or len(seen) >= 60:
                    break
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=trainer)] + [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert model.step_count == len(batches)
    assert losses == seq_losses
    assert seen
    for out in seen:  # every read saw the params between two whole steps, never a torn state
        assert any(np.array_equal(out, s) for s in snapshots)


def test_steps_from_several_threads_serialize(model):
    seq = [model.step(**B0) for _ in range(20)]
    model.reset()
    errors, losses = [], []

    def work():
        try:
            for _ in range(5):
                losses.append(model.step(**B0))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert model.step_count == 20
    assert sorted(losses) == sorted(seq)  # step t's loss does not depend on which thread ran it


def test_close_twice_and_calls_after_close(shared, tmp_path):
    model, _ = shared
    m = type(model)()
    ckpt = tmp_path / "c.npz"
    m.save(ckpt)
    m.close()
    m.close()
    calls = {
        "step": lambda: m.step(**B0),
        "predict": lambda: m.predict(tokens=Q),
        "score": lambda: m.score(tokens=Q, w=np.ones((N, T), np.float32)),
        "params": m.params,
        "grads": m.grads,
        "load_params": lambda: m.load_params({}, partial=True),
        "save": lambda: m.save(tmp_path / "d.npz"),
        "restore": lambda: m.restore(ckpt),
        "reset": m.reset,
        "set_lr": lambda: m.set_lr(0.1),
    }
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match="closed"):
            call()
    assert not (tmp_path / "d.npz").exists()
    with type(model)() as m2:  # the context manager closes, and closing again is fine
        m2.step(**B0)
    m2.close()
    with pytest.raises(RuntimeError, match="closed"):
        m2.step(**B0)


def test_kernels_clamp_indices_that_bypass_validation(shared):
    """Defense in depth (API.md §5: kernels also clamp): with the host-side check switched off,
    out-of-range indices neither crash nor disturb the valid rows or the parameters."""
    import copy

    model, _ = shared
    with type(model)() as m:
        prog = copy.deepcopy(m._program)
        for e in prog["entries"].values():
            e["index_bounds"] = {}
        m._program = prog
        valid = m.predict(tokens=Q)
        bad = Q.copy()
        bad[0] = [VOCAB, -1, 2**30]
        out = m.predict(tokens=bad)
        assert np.isfinite(out).all()
        np.testing.assert_array_equal(out[1:], valid[1:])
        p0 = m.params()
        b = with_(B0, targets=np.full((N, T), VOCAB + 3, np.int32), tokens=bad)
        loss = m.step(**b)
        assert np.isfinite(loss)
        assert m.step_count == 1
        for k, v in m.params().items():
            assert np.isfinite(v).all() and v.shape == p0[k].shape, k


class Packed(aot.Module):
    """Two categorical features packed in one i32 input: column 0 indexes 5 rows, column 1 3."""

    def __init__(self):
        super().__init__()
        self.a = nn.Embedding(5, 2)
        self.b = nn.Embedding(3, 2)


def packed_loss(m, x):
    col0, col1 = ops.split(x, 1, axis=1)  # [6, 1] each
    return ops.sum(ops.square(m.a(ops.reshape(col0, (6,))) + m.b(ops.reshape(col1, (6,)))))


def test_index_bounds_apply_where_index_ops_read(tmp_path):
    """An input read in parts by index ops of different sizes is checked part by part (as PyTorch
    would index): 4 is a valid row for column 0 and not for column 1; the check names the input,
    the value and the bound, runs nothing, and the same holds for step_many."""
    program = aot.Program("packed", model=Packed, train=aot.Train(packed_loss, inputs={"x": aot.i32(6, 2)}, optimizer=None))
    model = aot.compile(program)
    try:
        key = next(iter(model._program["variants"]["train"].values()))
        # per column: [bound, offset, [[size, stride]]]
        assert model._program["entries"][key]["index_bounds"]["x"] == [[5, 0, [[6, 2]]], [3, 1, [[6, 2]]]]
        x = np.array([[4, 2], [0, 0], [3, 1], [4, 0], [1, 2], [2, 1]], np.int32)
        ref = interp.Reference(trace_program(program))
        np.testing.assert_allclose(model.step(x=x), ref.step(x=x), rtol=1e-5)
        for bad, value, bound in ((np.where(x == 2, 3, x), 3, 3), (np.where(x == 4, 5, x), 5, 5), (-x, -4, 5)):
            before = model.params()
            with pytest.raises(ValueError, match=rf"input 'x' holds index {value}, outside \[0, {bound}\) \(nothing was run\)"):
                model.step(x=bad)
            with pytest.raises(ValueError, match=rf"input 'x' holds index {value}, outside \[0, {bound}\)"):
                model.step_many(x=np.stack([x, bad]))
            after = model.params()
            assert all(np.array_equal(before[k], after[k]) for k in before)
        model.step_many(x=np.stack([x, x[::-1]]))
    finally:
        model.close()


def test_primed_cffi_type_names_are_the_types_cffi_parses():
    """The engine fills cffi's cache of wgpu type names at import instead of letting cffi parse
    each one (10 ms a name). A wrong entry would make wgpu-py build descriptors of the wrong
    layout, so a sample of the names (and every spelling of a few that wgpu-py allocates) is
    parsed here for real and must give the very same C type object."""
    import random

    from cffi import model
    from wgpu.backends.wgpu_native import _api

    from aot.runtime import engine

    ffi = _api.ffi
    names = engine._ffi_type_names(model, ffi._parser._declarations)
    assert len(names) > 1000
    missing = [n for n in names if n not in ffi._parsed_types]
    assert not missing, f"not primed: {missing[:10]}"
    used = [
        s.format(t)
        for t in ("WGPUBindGroupEntry", "WGPUComputePipelineDescriptor", "WGPUChainedStruct", "uint32_t", "char")
        for s in engine._SPELLINGS
    ]
    sample = used + random.Random(0).sample(sorted(names), 40)
    for key in sample:
        primed = ffi._parsed_types.pop(key)
        with ffi._lock:
            parsed = ffi._typeof_locked(key)
        assert parsed[0] is primed[0] and parsed[1] is primed[1], key
