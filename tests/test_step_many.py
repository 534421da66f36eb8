"""Model.step_many: K training steps per call, bit-identical to K calls of step().

One tiny program (embedding -> linear -> relu -> dropout -> head, cross-entropy weighted by an
f32 input; a capture; AdamW with gradient clipping) is compiled once. Checked: losses,
parameters, optimizer state and captures equal to step()'s bit for bit across an lr schedule
boundary, a save/restore and chunk/ring boundaries; the iterable form; K = 1; buffers that do
not grow with K; bad calls rejected with nothing run.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import aot
from aot import nn, ops

pytestmark = pytest.mark.gpu  # needs a WebGPU adapter (lavapipe on CI)

VOCAB, D, N, T = 10, 8, 4, 3


class Tiny(aot.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D, init=aot.init.randn(0.5))
        self.l1 = nn.Linear(D, D, init=aot.init.kaiming())
        self.head = nn.Linear(D, VOCAB, init=aot.init.randn(0.3))


def loss_fn(m, tokens, targets, w):
    h = aot.capture("hidden", ops.relu(m.l1(m.emb(tokens))))
    logits = m.head(ops.dropout(h, 0.3))  # a new mask every step: the per-step seed must match step()'s
    return ops.sum(ops.cross_entropy(logits, targets, reduction="none") * w) * (1.0 / (N * T))


PROGRAM = aot.Program(
    "sm_tiny",
    model=Tiny,
    train=aot.Train(
        loss_fn,
        inputs={"tokens": aot.i32(N, T), "targets": aot.i32(N, T), "w": aot.f32(N, T)},
        optimizer=aot.optim.AdamW(lr=1e-2, weight_decay=0.05, clip_grad_norm=1.0),
    ),
    seed=11,
)
SCHEDULE = ("linear", 2e-2, 1e-3, 5)  # ends at step 6 of the schedule: a boundary inside the calls below


def batches(k, seed=0):
    r = np.random.default_rng(seed)
    return {
        "tokens": r.integers(0, VOCAB, (k, N, T)).astype(np.int32),
        "targets": r.integers(0, VOCAB, (k, N, T)).astype(np.int32),
        "w": r.uniform(0.5, 1.5, (k, N, T)).astype(np.float32),
    }


def one(b, i):
    return {n: v[i] for n, v in b.items()}


def state(model):
    return model.params(), [model._engine.read(a, 0, n) for a, n in model._state_buffers()], model.step_count


def assert_same(a, b):
    pa, sa, ca = state(a)
    pb, sb, cb = state(b)
    assert ca == cb
    for n in pa:
        assert np.array_equal(pa[n], pb[n]), n
    for x, y in zip(sa, sb):
        assert np.array_equal(x, y)


@pytest.fixture(scope="module")
def models():
    a = aot.compile(PROGRAM)
    b = type(a)()  # the same package, a second device
    yield a, b
    a.close()
    b.close()


@pytest.mark.parametrize("ramp", [True, False])
def test_bit_identical_across_schedule_restore_and_chunks(models, tmp_path, monkeypatch, ramp):
    a, b = models
    engine = sys.modules[type(a._engine).__module__]  # the package's engine.py

    monkeypatch.setattr(engine, "MANY_CHUNK", 3)  # several submits per call ...
    monkeypatch.setattr(engine, "MANY_RING", 4)  # ... and the loss ring read back mid-call
    # chunks of 1, 2, 3, 3, ... steps per call (the ramp), or 3, 3, ...
    monkeypatch.setattr(engine, "MANY_RAMP_MIN", 0 if ramp else 10**9)
    for m in (a, b):
        m.reset()
        m._engine._many.clear()
        m.set_lr(SCHEDULE)
    data = batches(11)
    ref = np.float32([a.step(**one(data, i)) for i in range(11)])
    got = b.step_many(**{n: v[:4] for n, v in data.items()})
    b.save(tmp_path / "ck.npz")
    c = type(b)(seed=3)  # another seed: restore must bring back 11's
    c.restore(tmp_path / "ck.npz")
    rest = c.step_many([one(data, i) for i in range(4, 11)], captures=True)
    assert isinstance(rest.loss, np.ndarray) and rest.loss.dtype == np.float32 and rest.loss.shape == (7,)
    assert np.array_equal(ref, np.concatenate([got, rest.loss]))
    assert_same(a, c)
    # captures are those of the last step: compare with a step() on the same state
    last = a.step(**one(data, 3), captures=True)
    again = c.step_many(**{n: v[3:4] for n, v in data.items()}, captures=True)  # K = 1
    assert again.loss.shape == (1,) and again.loss[0] == np.float32(last.loss)
    assert np.array_equal(again.captures["hidden"], last.captures["hidden"])
    assert_same(a, c)
    c.close()


def test_many_chunks_ramp_up_to_the_slots(models):
    engine = sys.modules[type(models[0]._engine).__module__]
    assert [engine.many_chunk(i, 5, True) for i in range(5)] == [1, 2, 4, 5, 5]
    assert [engine.many_chunk(i, 5, False) for i in range(3)] == [5, 5, 5]
    assert engine.many_chunk(100, 32, True) == 32


def test_buffers_do_not_grow_with_k(models, monkeypatch):
    _, b = models
    b.reset()
    b._engine._many.clear()
    made = []
    real = b._engine.device.create_buffer

    def counting(**kw):
        made.append(kw["size"])
        return real(**kw)

    monkeypatch.setattr(b._engine.device, "create_buffer", counting)
    b.step_many(**batches(2))
    first = list(made)
    slots = b._engine.many_slots("train")
    b.step_many(**batches(3 * slots + 5, seed=1))
    assert made == first  # the upload slots and the loss ring are made once, at a size set by the entry
    assert sum(first) < 4 * 4096 + 4 * slots * (3 * N * T + 4) + 1024


def test_bad_calls_run_nothing(models, monkeypatch):
    _, b = models
    b.reset()
    before = state(b)
    ran = []
    monkeypatch.setattr(b._engine, "run_many", lambda *a, **k: ran.append(1))
    good = batches(3)
    bad_cases = [
        (ValueError, "'w' expects K stacked f32", dict(good, w=good["w"][:, :2])),
        (ValueError, "K = 3 \\(from an earlier input\\)", dict(good, w=good["w"][:2])),
        (TypeError, "'tokens' expects integer data", dict(good, tokens=good["tokens"].astype(np.float32))),
        (ValueError, "holds index 10, outside \\[0, 10\\)", dict(good, targets=np.where(good["targets"] == 0, 10, good["targets"]))),
        (ValueError, "no batches", {n: v[:0] for n, v in good.items()}),
        (TypeError, "missing input\\(s\\) \\['w'\\]", {n: v for n, v in good.items() if n != "w"}),
    ]
    for err, msg, kw in bad_cases:
        with pytest.raises(err, match=msg):
            b.step_many(**kw)
    items = [one(good, i) for i in range(3)]
    items[2] = dict(items[2], w=np.zeros((N, T + 1), np.float32))
    with pytest.raises(ValueError, match="batch 2: input 'w' expects f32\\[4,3\\]"):
        b.step_many(items)
    with pytest.raises(ValueError, match="no batches"):
        b.step_many(iter([]))
    with pytest.raises(TypeError, match="not both"):
        b.step_many(items[:2], w=good["w"])
    with pytest.raises(TypeError, match="iterable of dicts"):
        b.step_many(good)
    assert not ran
    after = state(b)
    assert after[2] == before[2] and all(np.array_equal(after[0][n], before[0][n]) for n in before[0])


class Deep(aot.Module):
    """Enough layers that step() submits its first dispatches on their own (engine.SPLIT_SUBMIT_MIN)."""

    def __init__(self):
        super().__init__()
        self.layers = [nn.Linear(D, D, init=aot.init.kaiming()) for _ in range(40)]
        self.norms = [nn.LayerNorm(D) for _ in range(40)]

    def forward(self, x):
        for lin, norm in zip(self.layers, self.norms):
            x = x + ops.tanh(lin(norm(x)))
        return x


def test_a_long_step_submitted_in_two_parts_matches_step_many():
    """An entry point of many dispatches is submitted as its first few and then the rest (the GPU
    starts while the host records); step() must still equal step_many, which records every step
    in one pass, bit for bit, with every kernel set this adapter has."""
    import wgpu

    prog = aot.Program(
        "sm_deep",
        model=Deep,
        train=aot.Train(lambda m, x: ops.mean(ops.square(m(x))), {"x": aot.f32(N, D)}, optimizer=aot.optim.Adam(lr=1e-2)),
        seed=3,
    )
    xs = np.random.default_rng(5).standard_normal((4, N, D)).astype(np.float32)
    first = aot.compile(prog, kernels="cpu")
    cls = type(first)
    first.close()
    engine_mod = sys.modules[cls.__module__.rsplit(".", 1)[0] + ".engine"]
    sets = ["gpu", "cpu"] + ["subgroup"] * ("subgroup" in wgpu.gpu.request_adapter_sync().features)
    for ks in sets:
        a, b = cls(kernels=ks), cls(kernels=ks)
        assert len(a._engine.entries["train"]["dispatches"]) >= engine_mod.SPLIT_SUBMIT_MIN, ks
        stepped = [a.step(x=x) for x in xs]
        many = list(b.step_many(x=xs))
        assert stepped == [float(v) for v in many], ks
        for name, value in a.params().items():
            np.testing.assert_array_equal(value, b.params()[name], err_msg=f"{ks}: {name}")
        a.close()
        b.close()


@pytest.mark.parametrize("kernels", ["gpu", "cpu"])
def test_no_inputs_takes_k_steps(kernels):
    """A training entry without inputs (its data drawn with ops.randn each step) takes one step per
    batch of step_many([{}] * K), bit-identical to K step() calls; it took none (issue 32)."""

    class Fit(aot.Module):
        def __init__(self):
            super().__init__()
            self.w = self.param((3,), init=aot.init.literal(np.array([0.5, -1.0, 2.0], np.float32)))

    def loss(m):
        x = ops.randn((4, 3))
        return ops.mean(ops.square(x * m.w - x))

    prog = aot.Program("sm_noinputs", model=Fit, train=aot.Train(loss, inputs={}, optimizer=aot.optim.SGD(lr=0.1)), seed=2)
    a = aot.compile(prog, kernels=kernels)
    b = type(a)()
    try:
        want = [a.step() for _ in range(3)]
        got = b.step_many([{}] * 3)
        assert b.step_count == 3 and got.shape == (3,)
        np.testing.assert_array_equal(got, np.array(want, np.float32))
        np.testing.assert_array_equal(b.params()["w"], a.params()["w"])
        assert not np.array_equal(a.params()["w"], np.array([0.5, -1.0, 2.0], np.float32))
        with pytest.raises(TypeError, match=r"takes no inputs.*step_many\(\[\{\}\] \* K\)"):
            b.step_many()
        assert b.step_count == 3
    finally:
        a.close()
        b.close()
