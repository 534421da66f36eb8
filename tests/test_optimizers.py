"""Adadelta, RMSprop, Adagrad, Adam(amsgrad, weight_decay) and parameter groups against torch.optim.

Each case trains a small MLP for 10 steps in aot and in PyTorch from the same initial params:
the NumPy interpreter in float64 against torch in float64 (every case, fast), and the
generated package on the WebGPU adapter against torch in float32 (one program per optimizer,
its groups covering the variants: momentum, centered, weight decay on a bias, an lr schedule).
The torch side is built independently: groups resolved here with fnmatch, weight decay on a
param when its group sets weight_decay or its decay flag is on (API.md), lr set per group per
step from the schedule's formula.
"""

from __future__ import annotations

import fnmatch
import math

import numpy as np
import pytest

import aot
from aot import nn, ops
from aot.frontend import trace_program
from aot.interp import Reference

STEPS = 10
NAMES = ["l1.W", "l1.b", "l2.W", "l2.b", "scale"]
DECAY_FLAG = {"l1.W": True, "l1.b": False, "l2.W": True, "l2.b": False, "scale": False}


class MLP(aot.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(3, 8, init=aot.init.kaiming())
        self.l2 = nn.Linear(8, 2, init=aot.init.randn(0.3))
        self.scale = self.param((2,), init=aot.init.ones())

    def forward(self, x):
        return self.l2(ops.tanh(self.l1(x))) * self.scale


def mlp_loss(m, x, y):
    return ops.mean(ops.square(m(x) - y))


def program(name, opt):
    return aot.Program(name, model=MLP, train=aot.Train(mlp_loss, {"x": aot.f32(6, 3), "y": aot.f32(6, 2)}, optimizer=opt), seed=4)


def batches(n=STEPS, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(size=(6, 3)).astype(np.float32), "y": rng.normal(size=(6, 2)).astype(np.float32)} for _ in range(n)]


def linear(peak, final, steps):
    return lambda t: peak + (final - peak) * min(t - 1, steps) / steps


def cosine(peak, final, steps):
    return lambda t: final + (peak - final) * (1 + math.cos(math.pi * min(t - 1, steps) / steps)) / 2


def case(opt, tcls, tkw, lr, clip=None, groups=()):
    """(aot optimizer, torch.optim class name, its kwargs, lr of update t, clip norm, groups as
    (patterns, torch overrides, lr of update t))."""
    return (opt, tcls, tkw, lr, clip, groups)


CASES = {
    "adadelta": case(aot.optim.Adadelta(), "Adadelta", {}, lambda t: 1.0),
    "adadelta_wd_clip": case(
        aot.optim.Adadelta(lr=0.5, rho=0.8, eps=1e-5, weight_decay=0.1, clip_grad_norm=0.3), "Adadelta",
        dict(rho=0.8, eps=1e-5, weight_decay=0.1), lambda t: 0.5, clip=0.3,
    ),
    "rmsprop": case(aot.optim.RMSprop(), "RMSprop", {}, lambda t: 1e-2),
    "rmsprop_momentum_wd": case(
        aot.optim.RMSprop(lr=aot.lr.cosine(1e-2, 1e-3, 8), alpha=0.9, momentum=0.8, weight_decay=0.05), "RMSprop",
        dict(alpha=0.9, momentum=0.8, weight_decay=0.05), cosine(1e-2, 1e-3, 8),
    ),
    "rmsprop_centered": case(aot.optim.RMSprop(lr=3e-3, centered=True), "RMSprop", dict(centered=True), lambda t: 3e-3),
    "rmsprop_centered_momentum_clip": case(
        aot.optim.RMSprop(lr=3e-3, centered=True, momentum=0.5, eps=1e-6, clip_grad_norm=0.5), "RMSprop",
        dict(centered=True, momentum=0.5, eps=1e-6), lambda t: 3e-3, clip=0.5,
    ),
    "adagrad": case(aot.optim.Adagrad(), "Adagrad", {}, lambda t: 1e-2),
    "adagrad_decay_init_wd": case(
        aot.optim.Adagrad(lr=aot.lr.linear(0.1, 0.02, 6), lr_decay=0.05, initial_accumulator_value=0.3, weight_decay=0.1),
        "Adagrad", dict(lr_decay=0.05, initial_accumulator_value=0.3, weight_decay=0.1), linear(0.1, 0.02, 6),
    ),
    "adam_amsgrad_l2": case(
        aot.optim.Adam(lr=1e-2, amsgrad=True, weight_decay=0.1), "Adam", dict(amsgrad=True, weight_decay=0.1), lambda t: 1e-2,
    ),
    "adamw_amsgrad": case(aot.optim.AdamW(lr=1e-2, amsgrad=True), "AdamW", dict(amsgrad=True, weight_decay=0.01), lambda t: 1e-2),
    # groups: a bias decayed through its group, per-group lr schedules and hyper-parameters
    "adamw_groups": case(
        aot.optim.AdamW(lr=1e-2, weight_decay=0.1, groups=[
            {"params": "l1.*", "lr": aot.lr.linear(2e-2, 2e-3, 6), "weight_decay": 0.3, "betas": (0.8, 0.95)},
            {"params": ["l2.b", "scale"], "lr": 5e-3, "eps": 1e-6},
        ]),
        "AdamW", dict(weight_decay=0.1), lambda t: 1e-2,
        groups=[("l1.*", dict(weight_decay=0.3, betas=(0.8, 0.95)), linear(2e-2, 2e-3, 6)),
                (("l2.b", "scale"), dict(eps=1e-6), lambda t: 5e-3)],
    ),
    "sgd_groups": case(
        aot.optim.SGD(lr=0.05, momentum=0.9, weight_decay=0.01, groups=[
            {"params": "l2.*", "lr": aot.lr.step(0.1, 3, 0.5), "nesterov": True},
            {"params": "scale", "momentum": 0.0, "weight_decay": 0.2},
        ]),
        "SGD", dict(momentum=0.9, weight_decay=0.01), lambda t: 0.05,
        groups=[("l2.*", dict(nesterov=True), lambda t: 0.1 * 0.5 ** ((t - 1) // 3)),
                ("scale", dict(momentum=0.0, weight_decay=0.2), lambda t: 0.05)],
    ),
    "rmsprop_groups": case(
        aot.optim.RMSprop(lr=3e-3, groups=[
            {"params": "l1.*", "centered": True, "momentum": 0.7, "weight_decay": 0.1},
            {"params": "l2.W", "alpha": 0.9, "lr": aot.lr.cosine(1e-2, 1e-3, 10)},
        ]),
        "RMSprop", {}, lambda t: 3e-3,
        groups=[("l1.*", dict(centered=True, momentum=0.7, weight_decay=0.1), lambda t: 3e-3),
                ("l2.W", dict(alpha=0.9), cosine(1e-2, 1e-3, 10))],
    ),
    "adagrad_groups": case(
        aot.optim.Adagrad(lr=0.05, initial_accumulator_value=0.2, groups=[{"params": "l1.W", "lr_decay": 0.1, "eps": 1e-3}]),
        "Adagrad", dict(initial_accumulator_value=0.2), lambda t: 0.05, groups=[("l1.W", dict(lr_decay=0.1, eps=1e-3), lambda t: 0.05)],
    ),
    "adadelta_groups": case(
        aot.optim.Adadelta(groups=[{"params": "l2.*", "rho": 0.5, "lr": 0.5, "weight_decay": 0.2}]),
        "Adadelta", {}, lambda t: 1.0, groups=[("l2.*", dict(rho=0.5, weight_decay=0.2), lambda t: 0.5)],
    ),
}


def torch_run(torch, c, init, bs, dtype, steps=STEPS):
    """PyTorch's trajectory: params after `steps` updates, and the per-step losses."""
    opt, tcls, tkw, lr, clip, groups = c
    tp = {n: torch.nn.Parameter(torch.tensor(np.asarray(init[n], np.float64), dtype=dtype)) for n in NAMES}
    wd = tkw.get("weight_decay", 0.0)
    tgroups, lrs = [], []
    for n in NAMES:  # one torch group per param keeps the mapping simple
        hit = [g for g in groups if any(fnmatch.fnmatchcase(n, p) for p in ((g[0],) if isinstance(g[0], str) else g[0]))]
        over, glr = (dict(hit[0][1]), hit[0][2]) if hit else ({}, lr)
        if "weight_decay" not in over:
            over["weight_decay"] = wd if DECAY_FLAG[n] else 0.0
        tgroups.append({"params": [tp[n]], **over})
        lrs.append(glr)
    topt = getattr(torch.optim, tcls)(tgroups, lr=lr(1), **{k: v for k, v in tkw.items() if k != "weight_decay"})
    losses = []
    for t, b in enumerate(bs[:steps], 1):
        for g, f in zip(topt.param_groups, lrs):
            g["lr"] = f(t)
        topt.zero_grad()
        x, y = (torch.tensor(b[k], dtype=dtype) for k in ("x", "y"))
        out = (torch.tanh(x @ tp["l1.W"] + tp["l1.b"]) @ tp["l2.W"] + tp["l2.b"]) * tp["scale"]
        loss = ((out - y) ** 2).mean()
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(list(tp.values()), clip)
        topt.step()
        losses.append(loss.item())
    return {n: p.detach().numpy() for n, p in tp.items()}, np.array(losses)


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("name", list(CASES))
def test_interpreter_float64_matches_torch(torch, name):
    c = CASES[name]
    ref = Reference(trace_program(program("opt_" + name, c[0])), dtype=np.float64)
    init = {k: v.copy() for k, v in ref.params.items()}
    bs = batches()
    losses = [ref.step(**{k: v.astype(np.float64) for k, v in b.items()}) for b in bs]
    want, t_losses = torch_run(torch, c, init, bs, torch.float64)
    np.testing.assert_allclose(losses, t_losses, rtol=1e-6)
    for n in NAMES:  # aot's constants are f32 (eps, betas): not bit-equal to float64 torch
        np.testing.assert_allclose(ref.params[n], want[n], rtol=2e-6, atol=1e-8, err_msg=n)


# ---- the generated package on the WebGPU adapter, float32 ---------------------------------------

GPU_CASES = list(CASES)  # a compile takes well under a second for this model


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_CASES)
def test_package_matches_torch_and_resumes_exactly(torch, tmp_path, name):
    """10 steps against torch float32; a checkpoint saved after 4 steps, restored into a fresh
    model, continues bit for bit (params, every state vector, the groups' lr schedules)."""
    c = CASES[name]
    model = aot.compile(program("gpu_" + name, c[0]))
    try:
        init = model.params()
        bs = batches()
        losses = []
        for i, b in enumerate(bs):
            if i == 4:
                model.save(tmp_path / "mid.npz")
            losses.append(model.step(**b))
        want, t_losses = torch_run(torch, c, init, bs, torch.float32)
        np.testing.assert_allclose(losses, t_losses, rtol=2e-5, atol=1e-7)
        got = model.params()
        for n in NAMES:
            np.testing.assert_allclose(got[n], want[n], rtol=2e-4, atol=2e-6, err_msg=n)
        model.reset()
        model.set_lr(123.0)  # restore brings back every group's lr and schedule position
        model.restore(tmp_path / "mid.npz")
        for b in bs[4:]:
            model.step(**b)
        again = model.params()
        for n in NAMES:
            np.testing.assert_array_equal(again[n], got[n], err_msg=n)
    finally:
        model.close()


# ---- groups: errors, set_lr(group=), the layout ---------------------------------------------------


@pytest.mark.parametrize(
    "make, err, match",
    [
        (lambda: aot.optim.Adam(groups={"params": "l1.*"}), TypeError, "list of dicts"),
        (lambda: aot.optim.Adam(groups=[{"lr": 1.0}]), ValueError, "no 'params'"),
        (lambda: aot.optim.Adam(groups=[{"params": "l1.*", "momentum": 0.9}]), ValueError, "'momentum' cannot be set per group"),
        (lambda: aot.optim.SGD(groups=[{"params": "l1.*", "clip_grad_norm": 1.0}]), ValueError, "'clip_grad_norm' cannot"),
        (lambda: aot.optim.Adagrad(groups=[{"params": "l1.*", "initial_accumulator_value": 1.0}]), ValueError, "cannot be set"),
        (lambda: aot.optim.Adam(groups=[{"params": []}]), TypeError, "non-empty list"),
        (lambda: aot.optim.Adam(groups=[{"params": "l1.*", "betas": 0.9}]), TypeError, "pair of floats"),
        (lambda: aot.optim.SGD(groups=[{"params": "l1.*", "nesterov": 1}]), TypeError, "must be a bool"),
        (lambda: aot.optim.Adam(groups=[{"params": "l1.*", "lr": -1.0}]), ValueError, "non-negative"),
    ],
)
def test_bad_groups_are_refused_on_construction(make, err, match):
    with pytest.raises(err, match=match):
        make()


@pytest.mark.parametrize(
    "opt, match",
    [
        (aot.optim.Adam(groups=[{"params": "l1.*"}, {"params": ["scale", "l1.b"]}]),
         r"'l1.b' is matched by group 0 \('l1.\*'\) and group 1 \('scale', ...\)"),
        (aot.optim.Adam(groups=[{"params": "encoder.*"}]), r"group 0 \('encoder.\*'\) matches no parameter"),
        (aot.optim.Adam(groups=[{"params": "l1.*"}, {"params": "l1.*"}]), "both list the pattern"),
        (aot.optim.RMSprop(groups=[{"params": "l1.*", "momentum": -1.0}]), "invalid momentum"),
        (aot.optim.Adadelta(rho=1.5), "invalid rho"),
    ],
)
def test_bad_groups_are_refused_when_traced(opt, match):
    with pytest.raises(ValueError, match=match):
        trace_program(program("bad_groups", opt))


def test_layout_keeps_each_group_together():
    """The default group first, then the groups in order; decayed params first within each."""
    opt = aot.optim.AdamW(groups=[{"params": ["scale", "l1.*"], "lr": 1.0}, {"params": "l2.b"}])
    order = [p.name for p in sorted(trace_program(program("layout", opt)).params, key=lambda p: p.offset)]
    assert order[:2] == ["l2.W", "l1.W"] and set(order[2:4]) == {"l1.b", "scale"} and order[4] == "l2.b"
    plain = [p.name for p in sorted(trace_program(program("layout", aot.optim.AdamW())).params, key=lambda p: p.offset)]
    assert set(plain[:2]) == {"l1.W", "l2.W"}  # decayed first, as without groups before


@pytest.mark.gpu
def test_set_lr_per_group_and_its_checkpoint(tmp_path):
    """set_lr(lr, group=i) changes only group i's lr (a schedule from its own step 1 on),
    group=None every group's; current_lr(group) reports it; restore brings them back."""
    opt = aot.optim.SGD(lr=0.1, groups=[{"params": "l1.*", "lr": 0.01}, {"params": "l2.*", "lr": aot.lr.step(0.5, 2, 0.1)}])
    model = aot.compile(program("set_lr_groups", opt))
    try:
        assert [model.current_lr(g) for g in ("default", 0, 1)] == [0.1, 0.01, 0.5]
        b = batches(6)
        init, g0 = model.params(), None
        model.step(**b[0])
        grads = model.grads()
        moved = model.params()
        for n, lr in (("l1.W", 0.01), ("l2.W", 0.5), ("scale", 0.1)):  # plain SGD: p - lr * g
            np.testing.assert_allclose(moved[n], init[n] - np.float32(lr) * grads[n], rtol=1e-6, atol=1e-8, err_msg=n)
        model.set_lr(aot.lr.linear(0.2, 0.0, 4), group=0)
        assert [model.current_lr(g) for g in ("default", 0, 1)] == [0.1, 0.2, 0.5]
        model.step(**b[1])
        assert model.current_lr(0) == pytest.approx(0.15) and model.current_lr(1) == pytest.approx(0.05)
        model.save(tmp_path / "g.npz")
        model.set_lr(0.3)  # every group
        assert [model.current_lr(g) for g in ("default", 0, 1)] == [0.3, 0.3, 0.3]
        with pytest.raises(IndexError, match="out of range: the optimizer has 2 parameter group"):
            model.set_lr(0.1, group=2)
        with pytest.raises(TypeError, match="group must be an int"):
            model.set_lr(0.1, group="l1.*")
        model.restore(tmp_path / "g.npz")
        assert model.current_lr(0) == pytest.approx(0.15) and model.current_lr(1) == pytest.approx(0.05)
        assert model.current_lr() == 0.1
    finally:
        model.close()


def test_web_runtime_computes_the_same_step_scalars(tmp_path):
    """codegen_templates/web/runtime.js's stepScalars mirrors schedules.step_scalars (every
    optimizer kind, groups with their own specs and lrs), run by Node where it is installed."""
    import json
    import shutil
    import subprocess
    from pathlib import Path

    from aot.optim_groups import group_table
    from aot.runtime.schedules import lr_at, normalize, step_scalars

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    src = Path(__file__).resolve().parent.parent / "codegen_templates" / "web" / "runtime.js"
    (tmp_path / "runtime.mjs").write_text(src.read_text())
    calls = []
    for name, c in CASES.items():
        opt = c[0]
        groups = [[list(spec), lr] for spec, lr in group_table(opt) or []]
        for t in (1, 2, 7):
            lrs = [lr_at(normalize(lr), t) for _, lr in groups]
            calls.append(([list(opt.spec()), lr_at(normalize(opt.lr), t), t, groups, lrs],
                          step_scalars(opt.spec(), lr_at(normalize(opt.lr), t), t, groups, lrs)))
    script = (
        "import('./runtime.mjs').then((M) => { const calls = JSON.parse(process.argv[1]);"
        "console.log(JSON.stringify(calls.map((a) => M.stepScalars(...a)))); });"
    )
    out = subprocess.run([node, "-e", script, json.dumps([a for a, _ in calls])], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for got, (_, want) in zip(json.loads(out.stdout), calls):
        assert got == want  # float64 on both sides, the same operations
