"""Several training entries (train={"d": aot.Train(...), "g": aot.Train(...)}) and frozen
parameters (param(trainable=False), Module.freeze()), checked against PyTorch: two torch
optimizers over parameter subsets for the entries, requires_grad=False for frozen parameters.

One GAN-like package (two entries sharing one parameter, Adam with an lr schedule and AdamW)
and one frozen-base + adapter package are compiled once per module."""

from __future__ import annotations

import numpy as np
import pytest

import aot
from aot import nn, ops
from aot.errors import InvalidNameError, TraceError
from aot.frontend import trace_program

B = 6


@pytest.fixture(scope="module")
def torch():
    t = pytest.importorskip("torch")
    t.set_default_dtype(t.float64)
    yield t
    t.set_default_dtype(t.float32)


# ---- the GAN-like program --------------------------------------------------------------------


class Gan(aot.Module):
    def __init__(self):
        super().__init__()
        self.gen = [nn.Linear(3, 6, init=aot.init.randn(0.5)), nn.Linear(6, 4, init=aot.init.randn(0.5))]
        self.disc = [nn.Linear(4, 5, init=aot.init.randn(0.5)), nn.Linear(5, 1, init=aot.init.randn(0.5))]
        # trained by both entries: the two optimizers each keep their own state for it
        self.scale = self.param((1,), init=aot.init.ones())
        self.d_steps = self.buffer((1,))  # counted by step_d only (aot.assign)

    def generate(self, z):
        return self.gen[1](ops.tanh(self.gen[0](z))) * self.scale

    def judge(self, x):
        return self.disc[1](ops.tanh(self.disc[0](x))) * self.scale


def d_loss(m, z, x):
    aot.assign(m.d_steps, m.d_steps + 1.0)
    return ops.mean(ops.square(m.judge(x) - 1.0)) + ops.mean(ops.square(m.judge(m.generate(z))))


def g_loss(m, z):
    return ops.mean(ops.square(m.judge(m.generate(z)) - 1.0))


D_SCHED = aot.lr.linear(2e-2, 2e-3, 8)
G_WD = 0.05


def gan_program(name="gan_entries"):
    return aot.Program(
        name,
        Gan,
        train={
            "d": aot.Train(d_loss, {"z": aot.f32(B, 3), "x": aot.f32(B, 4)}, aot.optim.Adam(lr=D_SCHED, groups=[{"params": "scale", "lr": 5e-3}]), params=["disc.*", "scale"]),
            "g": aot.Train(g_loss, {"z": aot.f32(B, 3)}, aot.optim.AdamW(lr=1e-2, weight_decay=G_WD), params=["gen.*", "scale"]),
        },
        infer={"sample": aot.Infer(lambda m, z: m.generate(z), {"z": aot.f32(B, 3)})},
    )


@pytest.fixture(scope="module")
def gan():
    with aot.compile(gan_program()) as m:
        yield m


class TorchGan:
    """The same model in torch (float64), two optimizers over the entries' parameters."""

    def __init__(self, torch, init: dict):
        self.torch = torch
        self.p = {n: torch.tensor(v.astype(np.float64), requires_grad=True) for n, v in init.items()}
        p = self.p
        # d's optimizer has a parameter group of its own for the shared scale
        self.opt_d = torch.optim.Adam([{"params": [p["disc.0.W"], p["disc.0.b"], p["disc.1.W"], p["disc.1.b"]]},
                                       {"params": [p["scale"]], "lr": 5e-3}], lr=1.0)
        # AdamW decays the weights only (aot: the randn-initialized params; zeros/ones are not)
        self.opt_g = torch.optim.AdamW(
            [{"params": [p["gen.0.W"], p["gen.1.W"]], "weight_decay": G_WD},
             {"params": [p["gen.0.b"], p["gen.1.b"], p["scale"]], "weight_decay": 0.0}], lr=1e-2)
        self.t_d = 0

    def lin(self, x, i, part):
        return x @ self.p[f"{part}.{i}.W"] + self.p[f"{part}.{i}.b"]

    def generate(self, z):
        return self.lin(self.torch.tanh(self.lin(z, 0, "gen")), 1, "gen") * self.p["scale"]

    def judge(self, x):
        return self.lin(self.torch.tanh(self.lin(x, 0, "disc")), 1, "disc") * self.p["scale"]

    def step_d(self, z, x):
        self.t_d += 1
        self.opt_d.param_groups[0]["lr"] = D_SCHED(self.t_d)  # the schedule follows d's own step count
        self.opt_d.zero_grad()
        z, x = self.torch.tensor(z), self.torch.tensor(x)
        loss = ((self.judge(x) - 1) ** 2).mean() + (self.judge(self.generate(z)) ** 2).mean()
        loss.backward()
        self.grads_d = {n: t.grad.clone() for n, t in self.p.items() if n.startswith("disc") or n == "scale"}
        self.opt_d.step()
        return float(loss.detach())

    def step_g(self, z):
        self.opt_g.zero_grad()
        loss = ((self.judge(self.generate(self.torch.tensor(z))) - 1) ** 2).mean()
        loss.backward()
        self.grads_g = {n: t.grad.clone() for n, t in self.p.items() if n.startswith("gen") or n == "scale"}
        self.opt_g.step()
        return float(loss.detach())

    def params(self):
        return {n: t.detach().numpy() for n, t in self.p.items()}


def batches(k, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((k, B, 3)).astype(np.float32), rng.standard_normal((k, B, 4)).astype(np.float32)


def close(a, b, what, tol=2e-4):
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=what)


def test_gan_entries_match_two_torch_optimizers(gan, torch):
    """Alternating d and g steps (step and step_many of each): losses, both entries' gradients
    and every parameter after each step match torch with two optimizers; each entry updates only
    its parameters (the generator's values do not move on a d step, and the other way round)."""
    gan.reset()
    ref = TorchGan(torch, gan.params())
    zs, xs = batches(12, 0)
    plan = ["d", "g", "d", "d", "g", "many_d", "g", "many_g", "d"]
    i = 0
    for what in plan:
        before = gan.params()
        if what == "d":
            got, want = gan.step_d(z=zs[i], x=xs[i]), ref.step_d(zs[i].astype(np.float64), xs[i].astype(np.float64))
            close(got, want, f"d loss at {i}")
            for n, g in gan.grads(entry="d").items():
                close(g, ref.grads_d[n].numpy(), f"d grad {n} at {i}")
            assert set(gan.grads(entry="d")) == set(ref.grads_d)
            moved, kept = ("disc", "scale"), ("gen",)
            i += 1
        elif what == "g":
            got, want = gan.step_g(z=zs[i]), ref.step_g(zs[i].astype(np.float64))
            close(got, want, f"g loss at {i}")
            for n, g in gan.grads(entry="g").items():
                close(g, ref.grads_g[n].numpy(), f"g grad {n} at {i}")
            moved, kept = ("gen", "scale"), ("disc",)
            i += 1
        elif what == "many_d":
            got = gan.step_many_d(z=zs[i : i + 2], x=xs[i : i + 2])
            want = [ref.step_d(zs[j].astype(np.float64), xs[j].astype(np.float64)) for j in (i, i + 1)]
            close(got, want, f"step_many_d losses at {i}")
            moved, kept = ("disc", "scale"), ("gen",)
            i += 2
        else:
            got = gan.step_many_g([{"z": zs[i]}, {"z": zs[i + 1]}])
            want = [ref.step_g(zs[j].astype(np.float64)) for j in (i, i + 1)]
            close(got, want, f"step_many_g losses at {i}")
            moved, kept = ("gen", "scale"), ("disc",)
            i += 2
        after = gan.params()
        for n, v in after.items():
            close(v, ref.params()[n], f"param {n} after {what} (step {i})")
            if n.startswith(kept):
                assert np.array_equal(v, before[n]), f"{what} changed {n}, which it does not train"
            elif n.startswith(moved):
                assert not np.array_equal(v, before[n]), f"{what} left {n} unchanged"
    assert gan.step_counts == {"d": 6, "g": 5}
    assert gan.buffers()["d_steps"].tolist() == [6]  # buffers are shared by the entries, as params
    assert gan.step_count == 11
    assert gan.current_lr(entry="d") == pytest.approx(D_SCHED(7))
    assert gan.current_lr(entry="g") == pytest.approx(1e-2)
    assert gan.lr == {"d": ("linear", 2e-2, 2e-3, 8), "g": 1e-2}
    assert gan.train_entries == ["d", "g"]
    # the generator's values are shared with infer entries: sample() sees the trained gen
    z = zs[0]
    close(gan.sample(z=z), ref.generate(torch.tensor(z.astype(np.float64))).detach().numpy(), "sample()")


def test_gan_layout_keeps_each_entry_contiguous(gan):
    """The flat layout groups {d}, {d, g}, {g}: each entry's update covers one range, its
    gradients and optimizer state only that range's size (the shared scale is in both)."""
    t = gan.PROGRAM["trains"]
    total = sum(int(np.prod(s)) for _, s, *_ in gan.PROGRAM["params"])
    d, g = t["train_d"], t["train_g"]
    assert d["start"] == 0 and d["start"] + d["size"] == g["start"] + 1  # scale is d's last, g's first
    assert g["start"] + g["size"] == total
    assert gan.PROGRAM["arenas"]["state"] == gan.PROGRAM["arenas"]["state_1"] == d["size"] + g["size"]
    assert gan.PROGRAM["optimizer"] is None and "train" not in gan.PROGRAM["signatures"]
    for key in ("train_d", "train_g"):  # the update: one kernel, in place over the entry's slice
        e = gan.PROGRAM["entries"][key]
        assert e["copies"] == [] and len(e["dispatches"]) - e["update_from"] == 1, key


def test_gan_save_restore_set_lr_and_allreduce(gan, tmp_path):
    """A checkpoint holds both entries' optimizer state, counts and lr (set_lr on one entry):
    restored, the run continues bit for bit; step_g with an identity allreduce (its own gradient
    slice crossing the host) is the same step."""
    gan.reset()
    zs, xs = batches(8, 1)
    gan.step_d(z=zs[0], x=xs[0])
    gan.step_g(z=zs[1])
    gan.set_lr(3e-3, entry="g")
    gan.set_lr(4e-3, group=0, entry="d")
    gan.step_g(z=zs[2])
    path = tmp_path / "gan.npz"
    gan.save(path)
    counts, lrs = gan.step_counts, gan.lr

    def tail(reduce=None):
        out = [gan.step_d(z=zs[3], x=xs[3])]
        out.append(gan.step_g(z=zs[4], allreduce=reduce) if reduce else gan.step_g(z=zs[4]))
        out += list(gan.step_many_d(z=zs[5:7], x=xs[5:7]))
        return out, gan.params(), gan.grads(entry="g")

    first = tail()
    gan.reset()
    gan.set_lr(1.0, entry="d")
    gan.restore(path)
    assert gan.step_counts == counts and gan.lr == lrs and gan.lr["g"] == 3e-3
    assert gan.buffers()["d_steps"].tolist() == [1]
    assert gan.current_lr(group=0, entry="d") == 4e-3 and gan.current_lr(entry="d") == D_SCHED(2)
    seen = []
    second = tail(lambda v: (seen.append(v.shape), v)[1])
    assert seen == [(gan.PROGRAM["trains"]["train_g"]["size"],)]
    assert first[0] == second[0]
    for a, b in ((first[1], second[1]), (first[2], second[2])):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

    # reset(entry="g"): g's optimizer only, like a new torch optimizer for it
    gan.restore(path)
    gan.reset(params=False, entry="g")
    assert gan.step_counts == {"d": 1, "g": 0} and gan.step_count == 3 and gan.lr["g"] == 3e-3
    assert all(not v.any() for v in gan.grads(entry="g").values())
    assert gan.step_d(z=zs[3], x=xs[3]) == first[0][0]  # d's state untouched
    before = gan.params()
    gan.step_g(z=zs[4])
    for n in ("gen.0.b", "gen.1.b"):  # a first Adam step moves every element by lr (no decay on biases)
        np.testing.assert_allclose(np.abs(gan.params()[n] - before[n]), 3e-3, rtol=1e-3)


def test_gan_entry_errors(gan):
    with pytest.raises(TypeError, match="several training entries"):
        gan.set_lr(1e-3)
    with pytest.raises(TypeError, match="entry="):
        gan.grads()
    with pytest.raises(KeyError, match="no training entry 'x'"):
        gan.current_lr(entry="x")
    with pytest.raises(ValueError, match=r"step_g\(\): input 'z' expects"):
        gan.step_g(z=np.zeros((B, 2), np.float32))
    with pytest.raises(ValueError, match=r"step_many_d\(\): batch 1"):
        gan.step_many_d([{"z": np.zeros((B, 3)), "x": np.zeros((B, 4))}, {"z": np.zeros((B, 2)), "x": np.zeros((B, 4))}])
    assert not hasattr(gan, "step")  # no single-entry methods


# ---- frozen parameters ------------------------------------------------------------------------


class Base(aot.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(4, 8, init=aot.init.randn(0.5))
        self.l2 = nn.Linear(8, 4, init=aot.init.randn(0.5))


class Adapted(aot.Module):
    """A frozen base whose layers get trainable low-rank adapters (LoRA), a frozen bare param and a
    trainable head."""

    def __init__(self, frozen=True):
        super().__init__()
        self.base = Base().freeze() if frozen else Base()
        self.a1 = self.param((4, 2), init=aot.init.randn(0.5))
        self.b1 = self.param((2, 8), init=aot.init.randn(0.5))
        self.a2 = self.param((8, 2), init=aot.init.randn(0.5))
        self.b2 = self.param((2, 4), init=aot.init.zeros())
        self.temp = self.param((1,), init=aot.init.ones(), trainable=not frozen)
        self.head = nn.Linear(4, 1, init=aot.init.randn(0.5))

    def forward(self, x):
        h = ops.tanh(self.base.l1(x) + ops.matmul(ops.matmul(x, self.a1), self.b1))
        h = ops.tanh(self.base.l2(h) + ops.matmul(ops.matmul(h, self.a2), self.b2))
        return self.head(h) * self.temp


def adapted_program(frozen=True):
    def loss(m, x, y):
        return ops.mean(ops.square(m(x) - y))

    return aot.Program(
        "adapted" if frozen else "adapted_all",
        lambda: Adapted(frozen),
        train=aot.Train(loss, {"x": aot.f32(B, 4), "y": aot.f32(B, 1)}, aot.optim.AdamW(lr=2e-2, weight_decay=0.1)),
    )


FROZEN = {"base.l1.W", "base.l1.b", "base.l2.W", "base.l2.b", "temp"}


def test_frozen_base_with_adapters_matches_torch(torch):
    """Frozen parameters keep their values bit for bit; the others train as torch's AdamW over the
    params with requires_grad=True; grads() lists only those, and its values are torch's."""
    with aot.compile(adapted_program()) as m:
        init = m.params()
        p = {n: torch.tensor(v.astype(np.float64), requires_grad=n not in FROZEN) for n, v in init.items()}
        decayed = [p[n] for n in ("a1", "b1", "a2", "head.W")]  # randn-initialized, trainable
        rest = [p[n] for n in ("b2", "head.b")]
        opt = torch.optim.AdamW([{"params": decayed, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}], lr=2e-2)
        rng = np.random.default_rng(2)
        for i in range(4):
            x, y = rng.standard_normal((B, 4)).astype(np.float32), rng.standard_normal((B, 1)).astype(np.float32)
            got = m.step(x=x, y=y)
            opt.zero_grad()
            xt, yt = torch.tensor(x.astype(np.float64)), torch.tensor(y.astype(np.float64))
            h = torch.tanh(xt @ p["base.l1.W"] + p["base.l1.b"] + xt @ p["a1"] @ p["b1"])
            h = torch.tanh(h @ p["base.l2.W"] + p["base.l2.b"] + h @ p["a2"] @ p["b2"])
            loss = (((h @ p["head.W"] + p["head.b"]) * p["temp"] - yt) ** 2).mean()
            loss.backward()
            close(got, float(loss.detach()), f"loss at step {i}")
            grads = m.grads()
            assert set(grads) == set(init) - FROZEN
            for n, g in grads.items():
                close(g, p[n].grad.numpy(), f"grad {n} at step {i}")
            opt.step()
            for n, v in m.params().items():
                if n in FROZEN:
                    assert np.array_equal(v, init[n]), f"frozen {n} changed"
                else:
                    close(v, p[n].detach().numpy(), f"param {n} after step {i}")
        n_train = sum(v.size for n, v in init.items() if n not in FROZEN)
        # no optimizer state and no gradient slot for the frozen parameters
        assert m.PROGRAM["arenas"]["state"] == m.PROGRAM["arenas"]["state_1"] == n_train
        assert m.PROGRAM["arenas"]["grads"] == n_train
        assert m.step_counts == {"train": 4} and m.train_entries == ["train"]


def test_frozen_gradients_are_not_computed():
    """The frozen base's weight gradients are never traced (not computed and discarded): the
    training graph has two matmuls fewer than with the base trainable (dW of l1 and l2), and
    its gradient table lists only the trainable parameters."""
    frozen, full = (trace_program(adapted_program(f)).graphs["train"] for f in (True, False))
    n_mm = [sum(n.op == "matmul" for n in g.nodes) for g in (frozen, full)]
    assert n_mm[0] == n_mm[1] - 2, n_mm
    assert set(frozen.grads) == {"a1", "b1", "a2", "b2", "head.W", "head.b"}
    assert set(full.grads) == set(frozen.grads) | FROZEN


def test_freeze_unfreeze_and_layout():
    """freeze()/unfreeze() set the flag on a whole subtree and return the module; frozen params
    lie after every trainable one."""
    seen = {}

    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.base = Base().freeze()
            self.base.l2.unfreeze()
            self.head = nn.Linear(4, 1)
            seen["ret"] = self.base.freeze() is self.base and self.base.unfreeze() is self.base
            self.base.freeze()
            self.base.l2.unfreeze()

    prog = aot.Program("fz", M, train=aot.Train(lambda m, x: ops.mean(m.head(m.base.l2(x))), {"x": aot.f32(2, 8)}, aot.optim.SGD()))
    t = trace_program(prog)
    assert seen["ret"]
    frozen = {p.name for p in t.params if not p.trainable}
    assert frozen == {"base.l1.W", "base.l1.b"}
    lay = t.trains["train"]
    assert all(p.offset >= lay.end for p in t.params if p.name in frozen)
    assert all(p.offset < lay.end for p in t.params if p.name not in frozen)


# ---- declaration errors (trace only) --------------------------------------------------------


def _prog(train, infer=None, model=Gan):
    return aot.Program("errs", model, train=train, infer=infer or {})


def _t(params=None, opt=aot.optim.SGD()):
    return aot.Train(g_loss, {"z": aot.f32(B, 3)}, opt, params=params)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda: _prog({"d": _t("nothing.*")}), TraceError, "matches no parameter"),
        (lambda: _prog(_t(params=["gen.*"]), model=lambda: _frozen_gan()), TraceError, "no trainable parameter"),
        (lambda: _prog({"1d": _t()}), InvalidNameError, "'1d'"),
        (lambda: _prog({"_d": _t()}), InvalidNameError, "'_d'"),
        (lambda: _prog({"class": _t()}), InvalidNameError, "keyword"),
        (lambda: _prog({"x": _t(), "many_x": _t()}), InvalidNameError, "step_many_x"),
        (lambda: _prog({"d": _t()}, {"step_d": aot.Infer(lambda m, z: m.generate(z), {"z": aot.f32(B, 3)})}), InvalidNameError, "step_d"),
        (lambda: _prog({"d": _t()}, {"train_d": aot.Infer(lambda m, z: m.generate(z), {"z": aot.f32(B, 3)})}), InvalidNameError, "train_d"),
        (lambda: _prog({}), TraceError, "empty dict"),
        (lambda: _prog({"d": "not a Train"}), TraceError, "must be an aot.Train"),
        (lambda: _t(params=5), TraceError, "params="),
        (lambda: _t(params=[]), TraceError, "params="),
    ],
    ids=["no-match", "all-frozen", "digit", "underscore", "keyword", "collision", "infer-step", "infer-table", "empty", "not-train", "params-int", "params-empty"],
)
def test_declaration_errors(make, error, match):
    with pytest.raises(error, match=match):
        prog = make()
        trace_program(prog)


def _frozen_gan():
    m = Gan()
    for lin in m.gen:
        lin.freeze()
    return m


def test_trainable_flag_must_be_bool():
    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.w = self.param((2,), trainable="no")

    with pytest.raises(TraceError, match="trainable"):
        trace_program(aot.Program("tb", M, train=aot.Train(lambda m, x: ops.mean(m.w * x), {"x": aot.f32(2)})))


class Three(aot.Module):
    def __init__(self):
        super().__init__()
        self.p1 = self.param((3,), init=aot.init.randn(0.5))
        self.p2 = self.param((3,), init=aot.init.randn(0.5))
        self.p3 = self.param((3,), init=aot.init.randn(0.5))


def test_entry_sets_that_cannot_all_be_contiguous(torch):
    """Entries training {p1, p2}, {p2, p3} and {p3, p1}: no order makes all three contiguous, so
    one entry's range spans a parameter it does not train. That parameter keeps its value bit for
    bit through that entry's steps (no update, no SGD weight decay, no momentum), and the others
    train as torch.optim.SGD over the entry's two parameters."""

    def loss(m, x):
        return ops.sum(ops.square(m.p1 * m.p2 * m.p3 - x))

    opt = aot.optim.SGD(lr=0.05, momentum=0.9, weight_decay=0.1)
    sets = {"a": ["p1", "p2"], "b": ["p2", "p3"], "c": ["p3", "p1"]}
    prog = aot.Program("three", Three, train={k: aot.Train(loss, {"x": aot.f32(3)}, opt, params=v) for k, v in sets.items()})
    with aot.compile(prog) as m:
        t = m.PROGRAM["trains"]
        holes = {k: t["train_" + k]["size"] // 3 - 2 for k in sets}
        assert sorted(holes.values()) == [0, 0, 1]  # one entry spans a parameter it does not train
        gapped = next(k for k, h in holes.items() if h)
        init = m.params()
        p = {n: torch.tensor(v.astype(np.float64), requires_grad=True) for n, v in init.items()}
        topt = torch.optim.SGD([p[n] for n in sets[gapped]], lr=0.05, momentum=0.9, weight_decay=0.1)
        other = ({"p1", "p2", "p3"} - set(sets[gapped])).pop()
        rng = np.random.default_rng(3)
        for i in range(3):
            x = rng.standard_normal(3).astype(np.float32)
            got = getattr(m, "step_" + gapped)(x=x)
            topt.zero_grad()
            tl = ((p["p1"] * p["p2"] * p["p3"] - torch.tensor(x.astype(np.float64))) ** 2).sum()
            tl.backward()
            topt.step()
            close(got, float(tl.detach()), f"loss at {i}")
            now = m.params()
            assert np.array_equal(now[other], init[other]), f"{gapped} changed {other}, which it does not train"
            for n in sets[gapped]:
                close(now[n], p[n].detach().numpy(), f"{n} after step {i}")
            assert set(m.grads(entry=gapped)) == set(sets[gapped])
