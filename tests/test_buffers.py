"""Module.buffer, aot.assign and aot.is_training: non-trainable state, end to end.

One program is compiled once (module fixture): a Linear layer whose output is multiplied by a
buffer `scale` (so the backward pass reads it, late), with a running mean `rm` and an i32 step
counter `n`, all three assigned every training step; predict reads the buffers. Checked against a
PyTorch module with register_buffer (same parameters, torch.optim.SGD) over several step() and
step_many() calls; save/restore, reset, state_dict/load_state_dict and safetensors round trips;
the allreduce path; bad loads. Trace-level tests (no GPU) cover assign's and is_training's rules.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

import aot
from aot import nn, ops
from aot.frontend import trace_program
from aot.interp import Reference
from aot.pipeline import compile_program

torch = pytest.importorskip("torch")

B, DIN, D = 5, 3, 4
MOM = 0.1
SHIFT = np.float32([1.0, -2.0, 0.5, 3.0])
NAMES = ["rm", "scale", "n", "shift", "prev_b", "prev_rm"]


class Net(aot.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(DIN, D, init=aot.init.randn(0.5))
        self.rm = self.buffer(D)  # running mean of l's output
        self.scale = self.buffer(D, init=aot.init.ones())  # multiplies the output: the backward reads it
        self.n = self.buffer((), dtype="i32")  # steps taken
        self.shift = self.buffer(D, init=aot.init.literal(SHIFT))  # no other read in training: updated in place
        self.prev_b = self.buffer(D)  # the bias before this step's update (a parameter the optimizer overwrites)
        self.prev_rm = self.buffer(D)  # rm before this step's update (a buffer assigned in the same step)

    def forward(self, x):
        h = self.l(x)
        if aot.is_training():
            aot.assign(self.rm, self.rm * (1 - MOM) + ops.mean(h, 0) * MOM)
            aot.assign(self.scale, self.scale * 0.5 + ops.mean(ops.square(h), 0))
            aot.assign(self.n, ops.cast(ops.cast(self.n, "f32") + 1.0, "i32"))
            aot.assign(self.shift, self.shift * 0.5)
            aot.assign(self.prev_b, self.l.b)
            aot.assign(self.prev_rm, self.rm)
            aot.capture("old_rm", self.rm)  # read back after the step: the value the step read
            return h * self.scale
        return (h - self.rm) * self.scale + self.shift


def loss_fn(m, x, y):
    return ops.mean(ops.square(m(x) - y))


PROGRAM = aot.Program(
    "buf_net",
    model=Net,
    train=aot.Train(loss_fn, inputs={"x": aot.f32(B, DIN), "y": aot.f32(B, D)}, optimizer=aot.optim.SGD(lr=0.05)),
    infer={"predict": aot.Infer(lambda m, x: m(x), inputs={"x": aot.f32(B, DIN)})},
    seed=5,
)


class TorchNet(torch.nn.Module):
    """The reference: the same computation with register_buffer and self.training."""

    def __init__(self, params):
        super().__init__()
        self.W = torch.nn.Parameter(torch.tensor(params["l.W"]))
        self.b = torch.nn.Parameter(torch.tensor(params["l.b"]))
        self.register_buffer("rm", torch.zeros(D))
        self.register_buffer("scale", torch.ones(D))
        self.register_buffer("n", torch.zeros((), dtype=torch.int64))
        self.register_buffer("shift", torch.tensor(SHIFT))
        self.register_buffer("prev_b", torch.zeros(D))
        self.register_buffer("prev_rm", torch.zeros(D))

    def forward(self, x):
        h = x @ self.W + self.b
        if self.training:
            out = h * self.scale  # the old value: the updates below replace the buffers
            with torch.no_grad():
                self.prev_b = self.b.detach().clone()
                self.prev_rm = self.rm.clone()
                self.shift = self.shift * 0.5
                self.rm = self.rm * (1 - MOM) + h.mean(0) * MOM
                self.scale = self.scale * 0.5 + (h * h).mean(0)
                self.n = self.n + 1
            return out
        return (h - self.rm) * self.scale + self.shift


def data(k, seed=0):
    r = np.random.default_rng(seed)
    return r.normal(size=(k, B, DIN)).astype(np.float32), r.normal(size=(k, B, D)).astype(np.float32)


def torch_steps(ref, opt, xs, ys):
    losses = []
    for x, y in zip(xs, ys):
        opt.zero_grad()
        loss = ((ref(torch.tensor(x)) - torch.tensor(y)) ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return np.float32(losses)


def assert_buffers(m, ref, rtol=1e-5):
    got = m.buffers()
    assert got["n"].dtype == np.int32 and got["n"] == ref.n.item()
    np.testing.assert_allclose(got["rm"], ref.rm.numpy(), rtol=rtol, atol=1e-6)
    np.testing.assert_allclose(got["scale"], ref.scale.numpy(), rtol=rtol, atol=1e-6)
    for name in ("shift", "prev_b", "prev_rm"):
        np.testing.assert_allclose(got[name], getattr(ref, name).numpy(), rtol=rtol, atol=1e-6, err_msg=name)


@pytest.fixture(scope="module")
def models():
    a = aot.compile(PROGRAM)
    b = type(a)()  # the same package, a second device
    yield a, b
    a.close()
    b.close()


# ---- trace level (no GPU) -------------------------------------------------------------------------


def test_graph_and_reference_interpreter():
    traced = trace_program(PROGRAM)
    assert [(b.name, b.shape, b.dtype, b.offset) for b in traced.buffers] == [
        ("rm", (D,), "f32", 0), ("scale", (D,), "f32", D), ("n", (), "i32", 0), ("shift", (D,), "f32", 2 * D),
        ("prev_b", (D,), "f32", 3 * D), ("prev_rm", (D,), "f32", 4 * D),
    ]
    assert set(traced.graphs["train"].updates) == {"buffer:" + n for n in NAMES} | {"params"}
    assert not traced.graphs["predict"].updates
    assert all(p.name in ("l.W", "l.b") for p in traced.params)  # buffers are no parameters: no gradient
    # the planner: `scale`, which the backward pass reads after its new value is computed, is copied
    # into place after the pass; `shift`, read by nothing else, is written in place by its kernel
    c = compile_program(PROGRAM, verify=True)
    copied = {(dst, off) for _, _, dst, off, _ in c.program["entries"]["train"]["copies"]}
    where = {b.name: ("buffers" if b.dtype == "f32" else "buffers_i32", b.offset) for b in traced.buffers}
    assert where["scale"] in copied and where["shift"] not in copied
    ref = Reference(traced)
    t = TorchNet(ref.params)
    opt = torch.optim.SGD(t.parameters(), lr=0.05)
    xs, ys = data(3)
    want = torch_steps(t, opt, xs, ys)
    got = np.float32([ref.step(x=x, y=y) for x, y in zip(xs, ys)])
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert ref.buffers["n"] == 3
    np.testing.assert_allclose(ref.buffers["scale"], t.scale.numpy(), rtol=1e-5)


def _program(forward, infer=False, model=Net):
    class M(model):
        pass

    M.forward = forward
    kw = {"infer": {"predict": aot.Infer(lambda m, x: m(x), inputs={"x": aot.f32(B, DIN)})}} if infer else {
        "train": aot.Train(lambda m, x: ops.mean(m(x)), inputs={"x": aot.f32(B, DIN)})
    }
    return aot.Program("buf_err", model=M, **kw)


@pytest.mark.parametrize(
    "body, error, match",
    [
        ("aot.assign(self.rm, ops.mean(h, 0)); aot.assign(self.rm, ops.mean(h, 0))", aot.TraceError, "assigned twice.*would drop"),
        ("aot.assign(self.l.W, self.l.W * 2.0)", aot.TraceError, "must be a buffer.*param"),
        ("aot.assign(h, h)", aot.TraceError, "must be a buffer"),
        ("aot.assign(self.rm, h)", aot.ShapeError, r"'rm' is f32\[4\] but the value is f32\[5,4\]"),
        ("aot.assign(self.n, ops.sum(h))", aot.ShapeError, r"'n' is i32\[\] but the value is f32\[\]"),
        ("aot.assign(self.rm, 1.0)", aot.TraceError, "must be a traced Tensor"),
    ],
)
def test_assign_errors_name_the_line(body, error, match):
    ns = {"aot": aot, "ops": ops}
    exec(compile(f"def forward(self, x):\n    h = self.l(x)\n    {body}\n    return h\n", "model_file.py", "exec"), ns)
    with pytest.raises(error, match=match) as e:
        trace_program(_program(ns["forward"]))
    assert "model_file.py:3" in str(e.value)


def test_assign_in_infer_and_is_training_outside_tracing():
    def forward(self, x):
        aot.assign(self.rm, self.rm * 2.0)
        return self.l(x)

    with pytest.raises(aot.TraceError, match="only be assigned while tracing a training entry") as e:
        trace_program(_program(forward, infer=True))
    assert "test_buffers.py" in str(e.value)
    with pytest.raises(aot.TraceError, match="outside tracing"):
        aot.is_training()


def test_is_training_switches_per_entry_and_dropout_follows():
    seen = []

    def forward(self, x):
        seen.append(aot.is_training())
        return ops.dropout(self.l(x), 0.5) * (2.0 if aot.is_training() else 3.0)

    class M(Net):
        pass

    M.forward = forward
    p = aot.Program(
        "buf_mode", model=M,
        train=aot.Train(lambda m, x: ops.mean(m(x)), inputs={"x": aot.f32(B, DIN)}),
        infer={"predict": aot.Infer(lambda m, x: m(x), inputs={"x": aot.f32(B, DIN)})},
    )
    traced = trace_program(p)
    assert seen == [True, False]
    ops_of = {k: [n.op for n in g.nodes] for k, g in traced.graphs.items()}
    assert "random" in " ".join(ops_of["train"]) or "rand" in " ".join(ops_of["train"])
    assert not any("rand" in o for o in ops_of["predict"])
    consts = {k: {n.attrs.get("value") for n in g.nodes if n.op == "const"} for k, g in traced.graphs.items()}
    assert 2.0 in consts["train"] and 3.0 not in consts["train"]
    assert 3.0 in consts["predict"] and 2.0 not in consts["predict"]


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda m: m.buffer(3, dtype="f16"), "dtype must be 'f32' or 'i32'"),
        (lambda m: m.buffer(3, init=aot.init.randn(), dtype="i32"), "i32 buffer cannot be initialized by aot.init.randn"),
        (lambda m: m.buffer(3, init=aot.init.literal(np.zeros(2))), r"literal has shape \[2\]"),
    ],
)
def test_bad_buffer_declarations(make, match):
    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(DIN, D)
            self.b = make(self)

        def forward(self, x):
            return self.l(x)

    with pytest.raises(aot.TraceError, match=match):
        trace_program(_program(M.forward, infer=True, model=M))


def test_unnamed_and_doubly_reachable_buffers():
    class Hidden(aot.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(DIN, D)
            self.buffer(2)  # never stored on an attribute

        def forward(self, x):
            return self.l(x)

    with pytest.raises(aot.TraceError, match="a buffer of M is not stored on an attribute"):
        trace_program(_program(Hidden.forward, infer=True, model=Hidden))

    class Inner(aot.Module):
        def __init__(self):
            super().__init__()
            self.x = self.buffer(2)

    class Twice(Hidden):
        def __init__(self):
            aot.Module.__init__(self)
            self.l = nn.Linear(DIN, D)
            self.c = Inner()
            self.d = self.c

    with pytest.raises(aot.TraceError, match="buffer 'd.x' is also reachable as 'c.x'"):
        trace_program(_program(Twice.forward, infer=True, model=Twice))


# ---- the package (GPU) -----------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["auto", "gpu"])
def test_steps_and_step_many_match_torch_and_predict_reads_buffers(models, kernels):
    """With the adapter's own kernel set (the CPU set on lavapipe) and the GPU set (merged dispatches
    and row chains: the buffers' writers and readers must stay ordered there too)."""
    a = models[0] if kernels == "auto" else type(models[0])(kernels=kernels)
    try:
        _steps_match_torch(a)
    finally:
        if a is not models[0]:
            a.close()


def _steps_match_torch(a):
    a.reset()
    assert a.buffer_names == NAMES
    init = a.buffers()
    assert np.array_equal(init["rm"], np.zeros(D, np.float32)) and np.array_equal(init["scale"], np.ones(D, np.float32))
    assert init["n"].dtype == np.int32 and init["n"].shape == () and init["n"] == 0
    ref = TorchNet(a.params())
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    xs, ys = data(6, seed=1)
    want = torch_steps(ref, opt, xs[:3], ys[:3])
    got = np.float32([a.step(x=x, y=y) for x, y in zip(xs[:3], ys[:3])])
    np.testing.assert_allclose(got, want, rtol=1e-5)  # the backward read the old scale
    assert_buffers(a, ref)
    before = a.buffers()["rm"]
    res = a.step(x=xs[3], y=ys[3], captures=True)
    assert np.array_equal(res.captures["old_rm"], before) and not np.array_equal(a.buffers()["rm"], before)
    want = torch_steps(ref, opt, xs[3:], ys[3:])
    got = np.concatenate([[res.loss], a.step_many(x=xs[4:], y=ys[4:])])
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert_buffers(a, ref)
    for n, v in a.params().items():
        np.testing.assert_allclose(v, {"l.W": ref.W, "l.b": ref.b}[n].detach().numpy(), rtol=1e-5, atol=1e-6)
    ref.eval()
    x = data(1, seed=2)[0][0]
    with torch.no_grad():
        np.testing.assert_allclose(a.predict(x=x), ref(torch.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    assert_buffers(a, ref)  # predict changes nothing


@pytest.mark.gpu
def test_step_many_bit_identical_to_steps(models):
    a, b = models
    a.reset()
    b.reset()
    xs, ys = data(5, seed=3)
    la = np.float32([a.step(x=x, y=y) for x, y in zip(xs, ys)])
    lb = b.step_many(x=xs, y=ys)
    assert np.array_equal(la, lb)
    for n, v in a.buffers().items():
        assert np.array_equal(v, b.buffers()[n]), n
    assert a.buffers()["n"] == 5


@pytest.mark.gpu
def test_save_restore_reset(models, tmp_path):
    a, b = models
    a.reset()
    xs, ys = data(4, seed=4)
    a.step_many(x=xs[:2], y=ys[:2])
    a.save(tmp_path / "ck.npz")
    with np.load(tmp_path / "ck.npz") as z:
        assert {"buffer/" + n for n in NAMES} <= set(z.files) and z["buffer/n"].dtype == np.int32
    after = a.step_many(x=xs[2:], y=ys[2:])
    b.reset()
    b.restore(tmp_path / "ck.npz")
    assert b.buffers()["n"] == 2
    assert np.array_equal(b.step_many(x=xs[2:], y=ys[2:]), after)
    for n, v in a.buffers().items():
        assert np.array_equal(v, b.buffers()[n]), n
    b.reset(params=False)  # buffers stay with the parameters
    assert b.buffers()["n"] == 4
    b.reset()
    assert b.buffers()["n"] == 0 and np.array_equal(b.buffers()["scale"], np.ones(D, np.float32))
    # a checkpoint without the buffers is refused, and the model is left as it was
    with np.load(tmp_path / "ck.npz") as z:
        np.savez(tmp_path / "old.npz", **{k: z[k] for k in z.files if not k.startswith("buffer/")})
    with pytest.raises(KeyError, match=r"missing buffer\(s\) \['n', 'prev_b', 'prev_rm', 'rm', 'scale', 'shift'\]"):
        b.restore(tmp_path / "old.npz")
    assert b.buffers()["n"] == 0


@pytest.mark.gpu
def test_state_dict_and_safetensors_round_trip(models, tmp_path):
    a, b = models
    a.reset()
    xs, ys = data(2, seed=5)
    a.step_many(x=xs, y=ys)
    sd = a.state_dict()
    assert list(sd) == ["l.weight", "l.bias"] + NAMES
    assert sd["n"].dtype == np.int64 and sd["n"] == 2 and sd["rm"].dtype == np.float32
    assert a.state_dict(layout="aot")["n"].dtype == np.int32
    ref = TorchNet({"l.W": np.zeros((DIN, D), np.float32), "l.b": np.zeros(D, np.float32)})
    ref.load_state_dict(
        {"W": torch.tensor(sd["l.weight"].T), "b": torch.tensor(sd["l.bias"])}
        | {k: torch.from_numpy(sd[k]) for k in NAMES}
    )
    b.reset()
    b.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in sd.items()})
    for n, v in a.buffers().items():
        assert np.array_equal(b.buffers()[n], v) and b.buffers()[n].dtype == v.dtype, n
    with pytest.raises(KeyError, match=r"missing buffer\(s\) \['n'\]"):
        b.load_state_dict({k: v for k, v in sd.items() if k != "n"})
    with pytest.raises(KeyError, match=r"missing parameter\(s\) and buffer\(s\) \['l.bias', 'n'\]"):
        b.load_state_dict({k: v for k, v in sd.items() if k not in ("n", "l.bias")})
    for layout in ("aot", "torch"):
        b.reset()
        a.save_safetensors(tmp_path / f"{layout}.safetensors", layout=layout)
        b.load_safetensors(tmp_path / f"{layout}.safetensors", layout=layout)
        for n, v in a.buffers().items():
            assert np.array_equal(b.buffers()[n], v), (layout, n)


@pytest.mark.gpu
def test_load_buffers_checks_everything_first(models):
    a, _ = models
    a.reset()
    before = a.buffers()
    bad = [
        ({"rm": np.ones(D), "nope": np.ones(1)}, KeyError, "unknown buffer"),
        ({"rm": np.ones(D)}, KeyError, "missing buffer"),
        ({"l.W": np.ones((DIN, D))}, KeyError, "parameters load with load_params"),
        (dict(before, rm=np.ones(D + 1)), ValueError, r"'rm' expects shape \(4,\)"),
        (dict(before, n=np.float32(1.5)), ValueError, "not whole numbers"),
        (dict(before, n=np.int64(2**40)), ValueError, "outside the i32 range"),
    ]
    for values, error, match in bad:
        with pytest.raises(error, match=match):
            a.load_buffers(values)
    with pytest.raises(KeyError, match="buffers load with load_buffers"):
        a.load_params({"rm": np.ones(D)}, partial=True)
    for n, v in a.buffers().items():
        assert np.array_equal(v, before[n])
    a.load_buffers({"n": 7, "rm": np.arange(D)}, partial=True)
    assert a.buffers()["n"] == 7 and np.array_equal(a.buffers()["rm"], np.arange(D, dtype=np.float32))


@pytest.mark.gpu
def test_allreduce_updates_buffers_and_a_failed_one_restores_them(models):
    a, b = models
    a.reset()
    b.reset()
    xs, ys = data(2, seed=6)
    la = [a.step(x=xs[0], y=ys[0])]
    lb = [b.step(x=xs[0], y=ys[0], allreduce=lambda g: g)]
    before = b.buffers()

    def boom(g):
        raise RuntimeError("network down")

    with pytest.raises(RuntimeError, match="network down"):
        b.step(x=xs[1], y=ys[1], allreduce=boom)
    for n, v in b.buffers().items():
        assert np.array_equal(v, before[n]), n
    la.append(a.step(x=xs[1], y=ys[1]))
    lb.append(b.step(x=xs[1], y=ys[1], allreduce=lambda g: g))
    assert np.array_equal(la, lb)
    for n, v in a.buffers().items():
        assert np.array_equal(v, b.buffers()[n]), n


@pytest.mark.gpu
def test_a_program_without_buffers_keeps_its_checkpoint_format(tmp_path):
    """Checkpoints written before buffers existed restore: same fingerprint, no buffer members."""
    p = aot.Program(
        "buf_none", model=lambda: _Plain(),
        train=aot.Train(lambda m, x: ops.mean(m.l(x)), inputs={"x": aot.f32(B, DIN)}, optimizer=aot.optim.SGD(lr=0.1)),
    )
    m = aot.compile(p)
    try:
        old = hashlib.sha1(repr(("buf_none", [("l.W", (DIN, D)), ("l.b", (D,))], m._opt)).encode()).hexdigest()
        assert m._fingerprint() == old and m.buffers() == {} and m.buffer_names == []
        m.save(tmp_path / "ck.npz")
        with np.load(tmp_path / "ck.npz") as z:
            assert not any(k.startswith("buffer/") for k in z.files)
        m.restore(tmp_path / "ck.npz")
        assert "buffers" not in m._program["arenas"]
    finally:
        m.close()


class _Plain(aot.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(DIN, D)


@pytest.mark.gpu
def test_distributed_checksum_counts_buffers_and_broadcast_keeps_them(models, tmp_path):
    """distributed.state_checksum covers the buffers (check_replicas refuses ranks whose buffers
    differ); broadcast_buffers in a one-rank group leaves them as they are, dtypes included."""
    from aot.runtime import distributed as dist

    a, _ = models
    a.reset()
    before = dist.state_checksum(a)
    a.load_buffers({"n": 3}, partial=True)
    assert dist.state_checksum(a) != before
    values = a.buffers()
    dist.init(init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        dist.broadcast_buffers(a)
    finally:
        dist._leave()
    for n, v in a.buffers().items():
        assert np.array_equal(v, values[n]) and v.dtype == values[n].dtype, n


def test_convert_carries_buffers(tmp_path, capsys):
    """python -m aot convert: a checkpoint's buffers go to safetensors with the parameters (an i32
    buffer as int64 in the torch layout, as state_dict writes it) and come back."""
    from aot import cli

    model_file = tmp_path / "bufmodel.py"
    model_file.write_text(
        "import sys\nsys.path.insert(0, %r)\nfrom test_buffers import PROGRAM as program\n" % str(Path(__file__).parent)
    )
    traced = trace_program(PROGRAM)
    r = np.random.default_rng(0)
    members = {"__program__": np.array("buf_net")}
    members.update({"param/" + p.name: r.normal(size=p.shape).astype(np.float32) for p in traced.params})
    members.update({"buffer/" + b.name: (np.array(7, np.int32) if b.dtype == "i32" else r.normal(size=b.shape).astype(np.float32))
                    for b in traced.buffers})
    np.savez(tmp_path / "ck.npz", **members)
    st, back = str(tmp_path / "t.safetensors"), str(tmp_path / "back.npz")
    assert cli.main(["convert", str(tmp_path / "ck.npz"), st, "--layout", "torch", "--model", str(model_file)]) == 0
    from aot.runtime.interop import SafetensorsFile

    with SafetensorsFile(st) as f:
        assert f.entries["n"][0] == "I64" and f.raw("n") == 7 and f.entries["l.weight"][1] == (D, DIN)
        np.testing.assert_array_equal(f.raw("rm"), members["buffer/rm"])
    assert cli.main(["convert", st, back, "--layout", "torch", "--model", str(model_file)]) == 0
    with np.load(back) as z:
        assert set(z.files) == {m.split("/", 1)[1] for m in members if "/" in m}
        np.testing.assert_array_equal(z["l.W"], members["param/l.W"])
        assert z["n"] == 7
    capsys.readouterr()


def test_a_module_called_twice_chains_its_updates_like_torch():
    """A BatchNorm used twice in one step (a GAN's discriminator on real and fake images) moves its
    running statistics twice, the second update starting from the first, as torch's in-place ones."""
    torch = pytest.importorskip("torch")

    class Twice(aot.Module):
        def __init__(self):
            super().__init__()
            self.bn = aot.nn.BatchNorm1d(3)

    def loss(m, x):
        return ops.mean(ops.square(m.bn(x))) + ops.mean(m.bn(x * 2.0 + 1.0))

    model = aot.compile(aot.Program("bn_twice", model=Twice, train=aot.Train(loss, inputs={"x": aot.f32(5, 3)})))
    ref = torch.nn.BatchNorm1d(3).double()
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.standard_normal((5, 3)).astype(np.float32)
        model.step(x=x)
        t = torch.as_tensor(x).double()
        ref(t), ref(t * 2.0 + 1.0)
    got = model.buffers()
    np.testing.assert_allclose(got["bn.running_mean"], ref.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["bn.running_var"], ref.running_var.numpy(), rtol=1e-5, atol=1e-6)
    assert int(got["bn.num_batches_tracked"]) == 6 == int(ref.num_batches_tracked)
