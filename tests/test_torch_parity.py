"""The generated package trains exactly like PyTorch (float32, CPU) from the same initial params.

Every case copies `model.params()` into an equivalent torch model (aot's Linear `W` is torch's
`weight.T`), trains both for 20 steps on the same batches and compares the per-step losses and
the final parameters within float32 tolerance. The optimizer/schedule matrix runs on a small
MLP (B=32) that has one parameter of every init kind, so AdamW's and SGD's decay flags are
exercised; the two examples run with their own optimizers. Save/restore mid-run must give the
uninterrupted run bit for bit.
"""

from __future__ import annotations

import math
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest

import aot
from aot import nn, ops

pytestmark = pytest.mark.gpu  # needs a WebGPU adapter (lavapipe on CI)

ROOT = Path(__file__).resolve().parent.parent
STEPS = 20
H = 16  # hidden width of the small MLP
BS = 32  # its batch

# float32 on two different machines (lavapipe vs torch CPU), 20 updates
LOSS_RTOL = 2e-5
PARAM_RTOL, PARAM_ATOL = 2e-4, 2e-6


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


# ---- the small MLP: one parameter per init kind ----------------------------------------------


class Small(aot.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(1, H, init=aot.init.kaiming())  # W: kaiming -> decayed; b: zeros -> not
        self.l2 = nn.Linear(H, 1, init=aot.init.randn(0.3))  # W: randn -> decayed
        self.gate = self.param((H,), init=aot.init.randn(0.5), decay=False)  # explicit override
        self.scale = self.param((1,), init=aot.init.ones())  # ones -> not decayed
        self.shift = self.param((1,), init=aot.init.literal([0.1]))  # literal -> decayed

    def forward(self, x):
        return self.l2(ops.relu(self.l1(x)) * self.gate) * self.scale + self.shift


SMALL_DECAYED = {"l1.W", "l2.W", "shift"}  # per API.md §1, from the init kinds


def small_loss(m, x, y):
    d = m(x) - y
    return ops.mean(d * d)


def small_program(name, optimizer):
    return aot.Program(
        name,
        model=Small,
        train=aot.Train(small_loss, inputs={"x": aot.f32(BS, 1), "y": aot.f32(BS, 1)}, optimizer=optimizer),
        seed=3,
    )


def sine_batches(n, size, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.uniform(-np.pi, np.pi, (size, 1)).astype(np.float32)
        out.append({"x": x, "y": np.sin(x)})
    return out


def torch_small(torch):
    class TorchSmall(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = torch.nn.Linear(1, H)
            self.l2 = torch.nn.Linear(H, 1)
            self.gate = torch.nn.Parameter(torch.zeros(H))
            self.scale = torch.nn.Parameter(torch.zeros(1))
            self.shift = torch.nn.Parameter(torch.zeros(1))

        def loss(self, x, y):
            out = self.l2(torch.relu(self.l1(x)) * self.gate) * self.scale + self.shift
            return ((out - y) ** 2).mean()

    return TorchSmall()


# ---- aot <-> torch parameter mapping ---------------------------------------------------------


def param_map(torch, module):
    """aot name -> (torch parameter, transposed?) for Linear/LayerNorm/Embedding and bare params."""
    out = {}
    for prefix, mod in module.named_modules():
        p = prefix + "." if prefix else ""
        if isinstance(mod, torch.nn.Linear):
            out[p + "W"] = (mod.weight, True)
            if mod.bias is not None:
                out[p + "b"] = (mod.bias, False)
        elif isinstance(mod, torch.nn.LayerNorm):
            out[p + "g"] = (mod.weight, False)
            out[p + "b"] = (mod.bias, False)
        elif isinstance(mod, torch.nn.Embedding):
            out[p + "W"] = (mod.weight, False)
        for name, param in mod.named_parameters(recurse=False):
            if not any(param is q for q, _ in out.values()):
                out[p + name] = (param, False)
    return out


def load_into_torch(torch, module, params):
    pm = param_map(torch, module)
    assert set(pm) == set(params), (sorted(pm), sorted(params))
    with torch.no_grad():
        for name, (tp, transposed) in pm.items():
            v = np.asarray(params[name], dtype=np.float32)
            v = v.T if transposed else v
            assert tuple(tp.shape) == v.shape, name
            tp.copy_(torch.from_numpy(np.ascontiguousarray(v)))
    return pm


def torch_params(pm):
    return {n: (p.detach().numpy().T if t else p.detach().numpy()).copy() for n, (p, t) in pm.items()}


def run_torch(torch, module, loss_fn, init, batches, make_opt, lr_at, decayed, clip=None):
    """Train `module` from `init`; make_opt(groups) builds the torch optimizer from two param
    groups (decayed first); lr_at(t) is the lr of update t = 1, 2, ...; returns losses, params,
    grad norms (before clipping)."""
    torch.manual_seed(0)
    pm = load_into_torch(torch, module, init)
    dec = [p for n, (p, _) in pm.items() if n in decayed]
    rest = [p for n, (p, _) in pm.items() if n not in decayed]
    opt = make_opt(dec, rest)
    losses, norms = [], []
    for t, b in enumerate(batches, 1):
        for g in opt.param_groups:
            g["lr"] = lr_at(t)
        opt.zero_grad()
        loss = loss_fn(module, {k: torch.from_numpy(np.asarray(v)) for k, v in b.items()})
        loss.backward()
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in module.parameters())).item()
        norms.append(norm)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(list(module.parameters()), clip)
        opt.step()
        losses.append(loss.item())
    return np.array(losses), torch_params(pm), norms


def run_aot(model, batches):
    return np.array([model.step(**b) for b in batches]), model.params()


def assert_parity(aot_losses, aot_params, t_losses, t_params, loss_rtol=LOSS_RTOL, rtol=PARAM_RTOL, atol=PARAM_ATOL):
    np.testing.assert_allclose(aot_losses, t_losses, rtol=loss_rtol, atol=1e-7, err_msg="per-step losses")
    assert set(aot_params) == set(t_params)
    for k in sorted(t_params):
        np.testing.assert_allclose(aot_params[k], t_params[k], rtol=rtol, atol=atol, err_msg=k)


# ---- lr formulas of API.md §1 (written out here, independently of aot) ------------------------


def api_lr(kind, *a):
    """The lr of update t from API.md §1's formulas, as a function of t = 1, 2, ..."""
    if kind == "const":
        return lambda t: a[0]
    if kind == "linear":
        peak, final, steps = a
        return lambda t: peak + (final - peak) * min(t - 1, steps) / steps
    if kind == "cosine":
        peak, final, steps = a
        return lambda t: final + (peak - final) * (1 + math.cos(math.pi * min(t - 1, steps) / steps)) / 2
    if kind == "step":
        peak, every, gamma = a
        return lambda t: peak * gamma ** ((t - 1) // every)
    if kind == "multistep":
        peak, milestones, gamma = a
        return lambda t: peak * gamma ** sum(1 for m in milestones if m <= t - 1)
    if kind == "warmup":
        peak, steps, after = a
        return lambda t: peak * t / steps if t <= steps else after(t - steps)
    raise AssertionError(kind)


SCHEDULES = {
    "linear": (aot.lr.linear(1e-2, 1e-3, 12), api_lr("linear", 1e-2, 1e-3, 12)),
    "cosine": (aot.lr.cosine(1e-2, 1e-3, 12), api_lr("cosine", 1e-2, 1e-3, 12)),
    "warmup_float": (aot.lr.warmup(1e-2, 5, 2e-3), api_lr("warmup", 1e-2, 5, api_lr("const", 2e-3))),
    "warmup_cosine": (
        aot.lr.warmup(1e-2, 5, aot.lr.cosine(1e-2, 1e-3, 10)),
        api_lr("warmup", 1e-2, 5, api_lr("cosine", 1e-2, 1e-3, 10)),
    ),
    "step": (aot.lr.step(1e-2, 6, 0.5), api_lr("step", 1e-2, 6, 0.5)),
    "multistep": (aot.lr.multistep(1e-2, (4, 9, 15), 0.3), api_lr("multistep", 1e-2, (4, 9, 15), 0.3)),
}


def test_lr_schedules_match_api_formulas_and_torch_schedulers(torch):
    """aot.lr evaluates API.md's formulas, and those are torch.optim.lr_scheduler's conventions
    (t-th update uses the lr after t-1 scheduler.step() calls)."""
    for name, (sched, formula) in SCHEDULES.items():
        for t in range(1, 41):
            assert sched(t) == pytest.approx(formula(t), rel=1e-12, abs=0), (name, t)

    def torch_lrs(make, n, peak):
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([p], lr=peak)
        sch = make(opt)
        out = []
        for _ in range(n):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sch.step()
        return out

    S = torch.optim.lr_scheduler
    n = 40
    cases = [
        # linear: clamps at `steps` exactly like LinearLR's total_iters
        (aot.lr.linear(1e-2, 1e-3, 12), lambda o: S.LinearLR(o, 1.0, 0.1, total_iters=12)),
        # cosine: CosineAnnealingLR agrees up to T_max (it is periodic beyond; aot clamps)
        (aot.lr.cosine(1e-2, 1e-3, 60), lambda o: S.CosineAnnealingLR(o, T_max=60, eta_min=1e-3)),
        (aot.lr.step(1e-2, 6, 0.5), lambda o: S.StepLR(o, 6, 0.5)),
        (aot.lr.multistep(1e-2, (4, 9, 15), 0.3), lambda o: S.MultiStepLR(o, [4, 9, 15], 0.3)),
        # warmup: peak*t/steps is LinearLR(1/steps -> 1 over steps-1), then the `after` schedule
        (
            aot.lr.warmup(1e-2, 5, aot.lr.step(1e-2, 7, 0.5)),
            lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.2, 1.0, total_iters=4), S.StepLR(o, 7, 0.5)], milestones=[5]),
        ),
    ]
    for sched, make in cases:
        want = torch_lrs(make, n, 1e-2)
        got = [sched(t) for t in range(1, n + 1)]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, err_msg=str(sched))
    clamped = aot.lr.cosine(1e-2, 1e-3, 12)
    assert [clamped(t) for t in (13, 14, 50)] == [pytest.approx(1e-3, abs=1e-15)] * 3


# ---- the optimizer matrix ---------------------------------------------------------------------


def _torch_opt(torch, kind, **kw):
    wd = kw.pop("weight_decay", 0.0)

    def make(dec, rest):
        groups = [{"params": dec, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]
        if kind == "adam":
            return torch.optim.Adam(groups, lr=1.0, **kw)
        if kind == "adamw":
            return torch.optim.AdamW(groups, lr=1.0, **kw)
        return torch.optim.SGD(groups, lr=1.0, **kw)

    return make


# name -> (aot optimizer kwargs, torch kind, torch kwargs, lr); clip is added per case
OPTIMIZERS = {
    "adam": (
        aot.optim.Adam,
        {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6},
        "adam",
        {"betas": (0.8, 0.99), "eps": 1e-6},
    ),
    "adamw": (
        aot.optim.AdamW,
        {"lr": 1e-2, "weight_decay": 0.5},
        "adamw",
        {"weight_decay": 0.5, "betas": (0.9, 0.999), "eps": 1e-8},
    ),
    "sgd": (aot.optim.SGD, {"lr": 5e-2}, "sgd", {}),
    "sgd_momentum": (aot.optim.SGD, {"lr": 2e-2, "momentum": 0.9}, "sgd", {"momentum": 0.9}),
    "sgd_nesterov": (
        aot.optim.SGD,
        {"lr": 2e-2, "momentum": 0.8, "nesterov": True},
        "sgd",
        {"momentum": 0.8, "nesterov": True},
    ),
    "sgd_weight_decay": (
        aot.optim.SGD,
        {"lr": 5e-2, "momentum": 0.5, "weight_decay": 0.2},
        "sgd",
        {"momentum": 0.5, "weight_decay": 0.2},
    ),
}
CLIP = 0.3  # below the typical gradient norm of the first steps, above some later ones


@pytest.fixture(scope="module")
def small_models():
    """Compiled small-MLP packages by (optimizer, clip), shared by the module's tests."""
    cache = {}

    def get(opt_name, clip):
        key = (opt_name, clip)
        if key not in cache:
            cls, kw, *_ = OPTIMIZERS[opt_name]
            opt = cls(**kw, clip_grad_norm=clip)
            cache[key] = aot.compile(small_program(f"parity_{opt_name}{'_clip' if clip else ''}", opt))
        return cache[key]

    yield get
    for m in cache.values():
        m.close()


@pytest.mark.parametrize("clip", [None, CLIP], ids=["noclip", "clip"])
@pytest.mark.parametrize("opt_name", list(OPTIMIZERS))
def test_small_mlp_optimizer_matches_torch(torch, small_models, opt_name, clip):
    model = small_models(opt_name, clip)
    model.reset()
    _, kw, tkind, tkw = OPTIMIZERS[opt_name]
    batches = sine_batches(STEPS, BS, seed=1)
    init = model.params()
    decayed = SMALL_DECAYED if kw.get("weight_decay") else set()
    t_losses, t_params, norms = run_torch(
        torch,
        torch_small(torch),
        lambda m, b: m.loss(b["x"], b["y"]),
        init,
        batches,
        _torch_opt(torch, tkind, **tkw),
        api_lr("const", kw["lr"]),
        decayed,
        clip,
    )
    if clip is not None:  # the case is only meaningful if clipping bites at least once
        assert max(norms) > clip, norms
    a_losses, a_params = run_aot(model, batches)
    assert model.step_count == STEPS
    assert_parity(a_losses, a_params, t_losses, t_params)


def test_decay_flags_matter(torch, small_models):
    """Guard for the matrix: decaying every parameter (or none) is visibly different from torch's
    run with the API's flags, so the AdamW/SGD cases above do check the flags."""
    model = small_models("adamw", None)
    model.reset()
    _, kw, tkind, tkw = OPTIMIZERS["adamw"]
    batches = sine_batches(STEPS, BS, seed=1)
    init = model.params()
    a_losses, a_params = run_aot(model, batches)
    for wrong in (set(init), set()):
        _, t_params, _ = run_torch(
            torch,
            torch_small(torch),
            lambda m, b: m.loss(b["x"], b["y"]),
            init,
            batches,
            _torch_opt(torch, tkind, **tkw),
            api_lr("const", kw["lr"]),
            wrong,
        )
        worst = max(float(np.max(np.abs(a_params[k] - t_params[k]))) for k in t_params)
        assert worst > 100 * PARAM_ATOL


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_lr_schedule_matches_torch(torch, small_models, name):
    """Each schedule set with set_lr on a fresh (reset) model; torch gets the API formula's lr."""
    sched, formula = SCHEDULES[name]
    model = small_models("adam", None)
    model.reset()
    model.set_lr(sched)
    _, _, tkind, tkw = OPTIMIZERS["adam"]
    batches = sine_batches(STEPS, BS, seed=2)
    init = model.params()
    t_losses, t_params, _ = run_torch(
        torch,
        torch_small(torch),
        lambda m, b: m.loss(b["x"], b["y"]),
        init,
        batches,
        _torch_opt(torch, tkind, **tkw),
        formula,
        set(),
    )
    a_losses, a_params = run_aot(model, batches)
    assert_parity(a_losses, a_params, t_losses, t_params)


def test_schedule_compiled_into_the_program_matches_torch(torch):
    """The Program's own schedule (AdamW + warmup/cosine + clip), no set_lr."""
    sched, formula = SCHEDULES["warmup_cosine"]
    opt = aot.optim.AdamW(lr=sched, weight_decay=0.1, clip_grad_norm=CLIP)
    with aot.compile(small_program("parity_compiled_schedule", opt)) as model:
        batches = sine_batches(STEPS, BS, seed=3)
        init = model.params()
        t_losses, t_params, _ = run_torch(
            torch,
            torch_small(torch),
            lambda m, b: m.loss(b["x"], b["y"]),
            init,
            batches,
            _torch_opt(torch, "adamw", weight_decay=0.1),
            formula,
            SMALL_DECAYED,
            CLIP,
        )
        a_losses, a_params = run_aot(model, batches)
    assert_parity(a_losses, a_params, t_losses, t_params)


@pytest.mark.parametrize("opt_name", ["adam", "sgd_momentum"])
def test_set_lr_mid_run_matches_torch(torch, small_models, opt_name):
    """set_lr(float) and set_lr(schedule) mid-run: the schedule restarts at its own step 1 while
    step_count (and so Adam's bias correction / momentum) keeps counting."""
    model = small_models(opt_name, None)
    model.reset()
    _, kw, tkind, tkw = OPTIMIZERS[opt_name]
    model.set_lr(kw["lr"])
    sched = aot.lr.cosine(3e-3, 1e-4, 6)  # clamps after its 6th step
    after = api_lr("cosine", 3e-3, 1e-4, 6)

    def lr_at(t):
        if t <= 6:
            return kw["lr"]
        if t <= 10:
            return 3e-3
        return after(t - 10)

    batches = sine_batches(STEPS, BS, seed=4)
    init = model.params()
    t_losses, t_params, _ = run_torch(
        torch,
        torch_small(torch),
        lambda m, b: m.loss(b["x"], b["y"]),
        init,
        batches,
        _torch_opt(torch, tkind, **tkw),
        lr_at,
        set(),
    )
    losses = []
    for t, b in enumerate(batches, 1):
        if t == 7:
            model.set_lr(3e-3)
        if t == 11:
            model.set_lr(sched)
            assert model.step_count == 10
        losses.append(model.step(**b))
    assert model.step_count == STEPS
    assert_parity(np.array(losses), model.params(), t_losses, t_params)


# ---- the examples with their own optimizers -----------------------------------------------------


def load_example(name):
    return runpy.run_path(str(ROOT / "examples" / f"{name}.py"))


def test_sine_mlp_example_matches_torch(torch):
    mod = load_example("sine_mlp")
    with aot.compile(mod["program"]) as model:
        init = model.params()
        batches = sine_batches(STEPS, 256, seed=5)
        a_losses, a_params = run_aot(model, batches)

    class TorchMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1, self.l2, self.l3 = torch.nn.Linear(1, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 1)

        def loss(self, x, y):
            out = self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))
            return ((out - y) ** 2).mean()

    t_losses, t_params, _ = run_torch(
        torch,
        TorchMLP(),
        lambda m, b: m.loss(b["x"], b["y"]),
        init,
        batches,
        _torch_opt(torch, "adam"),
        api_lr("const", 5e-3),
        set(),
    )
    assert_parity(a_losses, a_params, t_losses, t_params)


def torch_transformer(torch, mod):
    """The example's PyTorch twin (examples/torch_reference.py) with a loss(batch) method."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import torch_reference as tr
    finally:
        sys.path.pop(0)
    m = tr.Transformer(mod["VOCAB"], mod["D"], mod["LAYERS"], mod["HEADS"], mod["MLP_DIM"], mod["T"])
    m.loss = lambda b: tr.transformer_loss(m, b["tokens"].long(), b["targets"].long(), b["mask"])
    return m


@pytest.mark.slow
def test_addition_transformer_example_matches_torch(torch):
    """The full example (3 blocks, B=128) with its own AdamW + linear schedule + clip, 20 steps.

    Free-running, two float32 implementations of this run drift apart chaotically after ~10
    steps (torch float32 vs torch float64 already differ by ~1e-3 in the loss at step 20: Adam
    turns rounding noise in gradients near eps into lr-sized steps), so each step is checked
    against torch at the package's own parameters instead: the loss and every gradient against
    torch autograd in float64, and the update against torch.optim.AdamW (+ clip_grad_norm_,
    + the schedule) fed the same gradients, whose state runs in lockstep over all 20 steps.
    The first free-running steps must still agree with an independent torch run."""
    mod = load_example("addition_transformer")
    rng = np.random.default_rng(0)
    batches = [mod["batch"](rng) for _ in range(STEPS)]
    lr_at = api_lr("linear", 5e-3, 5e-4, 1500)
    with aot.compile(mod["program"]) as model:
        init = model.params()
        decayed = {n for n in init if n.endswith(".W") or n == "pos_emb"}  # the randn-initialized
        assert "tok_emb.W" in decayed and not any(n.endswith((".g", ".b")) for n in decayed)

        t64 = torch_transformer(torch, mod).double()
        pm64 = param_map(torch, t64)
        t32 = torch_transformer(torch, mod)
        pm32 = load_into_torch(torch, t32, init)
        opt = _torch_opt(torch, "adamw", weight_decay=0.01)(
            [p for n, (p, _) in pm32.items() if n in decayed], [p for n, (p, _) in pm32.items() if n not in decayed]
        )
        losses, clipped, after = [], 0, init
        for t, b in enumerate(batches, 1):
            before = after
            loss = model.step(**b)
            grads, after = model.grads(), model.params()
            losses.append(loss)
            # forward + backward at the same params, float64
            with torch.no_grad():
                for n, (p, tr) in pm64.items():
                    p.copy_(torch.from_numpy(np.ascontiguousarray(before[n].T if tr else before[n]).astype(np.float64)))
            t64.zero_grad()
            tb = {k: torch.from_numpy(np.asarray(v)) for k, v in b.items()}
            tb["mask"] = tb["mask"].double()
            want = t64.loss(tb)
            want.backward()
            assert loss == pytest.approx(want.item(), rel=2e-6), t
            gnorm = math.sqrt(sum(float((p.grad**2).sum()) for p, _ in pm64.values()))
            clipped += gnorm > 1.0
            for n, (p, tr) in pm64.items():
                g = p.grad.numpy().T if tr else p.grad.numpy()
                err = float(np.max(np.abs(grads[n] - g)))
                assert err <= 2e-6 * gnorm, f"step {t}: grad of {n} off by {err:.2e} (norm {gnorm:.3f})"
            # the update: torch's AdamW from the same params and gradients
            with torch.no_grad():
                for n, (p, tr) in pm32.items():
                    p.copy_(torch.from_numpy(np.ascontiguousarray(before[n].T if tr else before[n])))
                    p.grad = torch.from_numpy(np.ascontiguousarray(grads[n].T if tr else grads[n]))
            for g in opt.param_groups:
                g["lr"] = lr_at(t)
            torch.nn.utils.clip_grad_norm_(list(t32.parameters()), 1.0)
            opt.step()
            got = torch_params(pm32)
            for n in got:
                np.testing.assert_allclose(after[n], got[n], rtol=1e-5, atol=1e-7, err_msg=f"step {t}: {n}")
        assert clipped >= 1  # clipping was active in this run

    # free-running: an independent torch float32 run from the same init
    t_losses, _, _ = run_torch(
        torch,
        torch_transformer(torch, mod),
        lambda m, b: m.loss(b),
        init,
        batches[:5],
        _torch_opt(torch, "adamw", weight_decay=0.01),
        lr_at,
        decayed,
        1.0,
    )
    np.testing.assert_allclose(losses[:5], t_losses, rtol=1e-4)
    assert losses[-1] < 0.8 * losses[0]


# ---- save / restore mid-run ---------------------------------------------------------------------


class DropMLP(aot.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(1, H, init=aot.init.kaiming())
        self.l2 = nn.Linear(H, 1, init=aot.init.randn(0.3))

    def forward(self, x):
        return self.l2(ops.dropout(ops.relu(self.l1(x)), 0.25))


@pytest.fixture(scope="module")
def drop_model():
    prog = aot.Program(
        "parity_restore",
        model=DropMLP,
        train=aot.Train(
            lambda m, x, y: ops.mean(ops.square(m(x) - y)),
            inputs={"x": aot.f32(BS, 1), "y": aot.f32(BS, 1)},
            optimizer=aot.optim.AdamW(lr=aot.lr.warmup(1e-2, 4, aot.lr.cosine(1e-2, 1e-3, 10)), clip_grad_norm=CLIP),
        ),
        seed=11,
    )
    m = aot.compile(prog)
    yield m
    m.close()


def test_save_restore_mid_run_is_bit_identical(drop_model, tmp_path):
    """Adam state, step count (bias correction, dropout stream), schedule position and a set_lr
    origin all survive a checkpoint: a restored model continues exactly like the uninterrupted one."""
    model = drop_model
    batches = sine_batches(STEPS, BS, seed=6)

    model.reset()
    model.set_lr(aot.lr.step(8e-3, 3, 0.7))  # the schedule starts at step 1 here...
    for b in batches[:4]:
        model.step(**b)
    model.set_lr(aot.lr.linear(5e-3, 1e-3, 8))  # ...and this one at step 5
    for b in batches[4:8]:
        model.step(**b)
    ckpt = tmp_path / "mid.npz"
    model.save(ckpt)
    straight = [model.step(**b) for b in batches[8:]]
    final = model.params()
    final_grads = model.grads()

    # a second Model instance of the same package, with a different seed and lr, restores it
    other = type(model)(seed=99)
    try:
        other.set_lr(0.5)
        other.step(**batches[0])
        other.restore(ckpt)
        assert other.step_count == 8 and other.seed == 11
        resumed = [other.step(**b) for b in batches[8:]]
        assert resumed == straight  # bit-identical losses
        got = other.params()
        for k in final:
            np.testing.assert_array_equal(got[k], final[k], err_msg=k)
        for k, g in other.grads().items():
            np.testing.assert_array_equal(g, final_grads[k], err_msg=k)
    finally:
        other.close()

    # and the same model restored in place after training further
    model.restore(ckpt)
    assert model.step_count == 8
    assert [model.step(**b) for b in batches[8:]] == straight
