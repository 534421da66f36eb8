"""Six of tensorgrad's samples ported to aot (examples/): kan_tiny, nerf_tiny, digit_canvas,
mnist_cnn, cartpole, tic_tac_toe.

For each sample:
- parity: from the package's initial params copied into its PyTorch twin (examples/torch_twins.py)
  and identical batches, a few free-running steps give the same per-step losses and gradients
  (`model.grads()` vs torch's .grad before clipping and the optimizer step), and the same params
  after the steps. digit_canvas's parity runs on a second Program with dropout p = 0 (in-graph
  dropout masks cannot be reproduced in torch); the RL samples use rollouts recorded with the
  initial policy as their batches.
- trains: a short, seeded run on the GPU shows learning (the figures are in each test).
Each Program compiles once per module (module-scoped fixtures); tests reset the model first.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import aot

pytestmark = pytest.mark.gpu  # needs a WebGPU adapter (lavapipe on CI)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# float32 on two implementations (lavapipe vs torch CPU): losses and gradients of each step
LOSS_RTOL = 2e-5
GRAD_RTOL = 1e-4  # max |aot - torch| over a param, relative to that param's largest |grad|
# Adam moves every param by about lr per step whatever the size of its gradient, so a gradient
# entry near zero (rounding noise on both sides) can differ by a sizeable fraction of lr
PARAM_ATOL_LR = 0.05  # max |aot - torch| of params after the steps, in units of lr


def load(name):
    return SimpleNamespace(**runpy.run_path(str(EXAMPLES / f"{name}.py")))


@pytest.fixture(scope="module")
def twins():
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(EXAMPLES))
    try:
        import torch_twins
    finally:
        sys.path.remove(str(EXAMPLES))
    torch.manual_seed(0)
    return torch_twins


def compiled(name, program=None):
    """A module-scoped fixture: (example module, compiled Model)."""

    @pytest.fixture(scope="module")
    def fixture():
        mod = load(name)
        model = aot.compile(getattr(mod, "program") if program is None else program(mod))
        yield mod, model
        model.close()

    return fixture


kan = compiled("kan_tiny")
nerf = compiled("nerf_tiny")
digits = compiled("digit_canvas")
digits_p0 = compiled("digit_canvas", lambda mod: mod.make_program("digit_canvas_p0", p=0.0))
cnn = compiled("mnist_cnn")
cartpole = compiled("cartpole")
ttt = compiled("tic_tac_toe")


# ---- parity harness ---------------------------------------------------------------------------


def torch_optimizer(pm, lr, adamw):
    """torch.optim.Adam, or AdamW (wd 0.01) decaying the weights (randn/kaiming init, aot's decay
    flag True) but not the zero-initialized biases."""
    import torch

    if not adamw:
        return torch.optim.Adam([p for p, _ in pm.values()], lr=lr)
    groups = [
        {"params": [p for n, (p, _) in pm.items() if n.endswith("W")], "weight_decay": 0.01},
        {"params": [p for n, (p, _) in pm.items() if not n.endswith("W")], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr)


def run_parity(twins, model, twin, batches, lr, adamw=False, clip=None, loss_atol=0.0):
    """Train `model` (from its initial params) and `twin` (loaded with them) on `batches` side by
    side; assert per-step losses and gradients and the final params agree; returns the errors.
    `loss_atol` covers losses that are sums of cancelling terms (REINFORCE with normalized returns)."""
    import torch

    model.reset()
    pm = twins.load_aot_params(twin, model.params())
    opt = torch_optimizer(pm, lr, adamw)
    err = {"loss": 0.0, "loss_abs": 0.0, "grad_abs": 0.0, "grad_rel": 0.0, "clipped": 0}
    for t, b in enumerate(batches, 1):
        got_loss = model.step(**b)
        got_grads = model.grads()
        opt.zero_grad()
        want = twin.loss({k: torch.from_numpy(np.asarray(v)) for k, v in b.items()})
        want.backward()
        want_grads = twins.as_aot(pm, grads=True)
        if clip is not None:
            err["clipped"] += float(torch.nn.utils.clip_grad_norm_(list(twin.parameters()), clip)) > clip
        opt.step()

        diff = abs(got_loss - want.item())
        err["loss"] = max(err["loss"], diff / abs(want.item()))
        err["loss_abs"] = max(err["loss_abs"], diff)
        assert diff <= LOSS_RTOL * abs(want.item()) + loss_atol, f"step {t}: loss {got_loss} vs torch {want.item()}"
        assert set(got_grads) == set(want_grads)
        for n, g in want_grads.items():
            scale = float(np.abs(g).max())
            diff = float(np.abs(got_grads[n] - g).max())
            err["grad_abs"] = max(err["grad_abs"], diff)
            err["grad_rel"] = max(err["grad_rel"], diff / scale if scale else diff)
            assert diff <= GRAD_RTOL * scale + 1e-9, f"step {t}: grad of {n} off by {diff:.2e} (max |g| {scale:.2e})"
    got, want = model.params(), twins.as_aot(pm)
    err["param_abs"] = max(float(np.abs(got[n] - want[n]).max()) for n in want)
    for n in want:
        np.testing.assert_allclose(got[n], want[n], rtol=0, atol=PARAM_ATOL_LR * lr, err_msg=n)
    clipped = f" (clipping active in {err['clipped']})" if clip is not None else ""
    print(
        f"parity: loss rel {err['loss']:.1e} (abs {err['loss_abs']:.1e}), grad abs {err['grad_abs']:.1e}, "
        f"grad rel {err['grad_rel']:.1e}, params abs {err['param_abs']:.1e} after {len(batches)} steps{clipped}"
    )
    return err


def batches(mod, n, seed=0):
    rng = np.random.default_rng(seed)
    return [mod.batch(rng) for _ in range(n)]


# ---- kan_tiny -----------------------------------------------------------------------------------


def test_kan_tiny_matches_torch(twins, kan):
    mod, model = kan
    assert sum(v.size for v in model.params().values()) == 72  # tensorgrad's count
    run_parity(twins, model, twins.KAN(), batches(mod, 4), lr=5e-3)


def test_kan_tiny_trains(kan):
    mod, model = kan
    model.reset()
    rng = np.random.default_rng(0)
    losses = [model.step(**mod.batch(rng)) for _ in range(150)]
    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    xs = np.linspace(-1, 1, 200, dtype=np.float32).reshape(-1, 1)
    err = float(np.abs(model.predict(x=xs) - np.sin(np.pi * xs)).max())
    print(f"kan_tiny: loss {first:.4f} -> {last:.5f} in 150 steps; max |f - sin(pi x)| {err:.3f}")
    assert last < 0.02 * first and err < 0.25


# ---- nerf_tiny ----------------------------------------------------------------------------------


def test_nerf_tiny_matches_torch(twins, nerf):
    mod, model = nerf
    assert sum(v.size for v in model.params().values()) == 10627
    run_parity(twins, model, twins.Field(), batches(mod, 4), lr=1e-3)


def test_nerf_tiny_trains(nerf):
    mod, model = nerf
    model.reset()
    target = mod.target_image()
    flat = mod.psnr(np.broadcast_to(target.mean((0, 1)), target.shape), target)  # best constant colour
    rng = np.random.default_rng(0)
    losses = [model.step(**mod.batch(rng)) for _ in range(40)]
    psnr = mod.psnr(mod.render(model), target)
    print(
        f"nerf_tiny: loss {losses[0]:.4f} -> {np.mean(losses[-5:]):.4f} in 40 steps; "
        f"PSNR {psnr:.1f} dB (flat colour {flat:.1f} dB)"
    )
    # the first loss is already near the flat colour's: the gain over it is what the field learnt
    assert np.mean(losses[-5:]) < 0.5 * losses[0] and psnr > flat + 1.5


# ---- digit_canvas -------------------------------------------------------------------------------


def test_digit_canvas_matches_torch_without_dropout(twins, digits_p0):
    """The p = 0 variant (same architecture, init and optimizer; dropout is the only difference)."""
    mod, model = digits_p0
    assert sum(v.size for v in model.params().values()) == 50890
    run_parity(twins, model, twins.DigitMLP(p=0.0), batches(mod, 4), lr=1e-3, adamw=True, clip=1.0)


def test_digit_canvas_dropout_gradients_match_torch_given_the_mask(twins, digits):
    """The p = 0.1 graph itself: a variant of the sample's MLP that captures the hidden layer
    before and after dropout, so torch can apply the same keep mask (kept where the dropped value
    is nonzero; where ReLU gave 0 the mask does not matter). Each step's mask comes from aot's
    step, so the two runs follow each other for 3 steps."""
    import torch

    mod, _ = digits

    class Captured(mod.MLP):
        def forward(self, x):
            h = aot.capture("hidden", aot.ops.relu(self.l1(x)))
            return self.l2(aot.capture("dropped", aot.ops.dropout(h, self.p)))

    program = mod.make_program("digit_canvas_masked")
    program.model = Captured
    twin = twins.DigitMLP(p=0.0)
    with aot.compile(program) as model:
        pm = twins.load_aot_params(twin, model.params())
        opt = torch_optimizer(pm, 1e-3, adamw=True)
        dropped_frac, masks = [], []
        for t, b in enumerate(batches(mod, 3, seed=7), 1):
            res = model.step(**b, captures=True)
            hidden, dropped = res.captures["hidden"], res.captures["dropped"]
            live = hidden > 0
            keep = (dropped != 0) | ~live
            np.testing.assert_allclose(dropped[keep & live], hidden[keep & live] / (1 - mod.P_DROP), rtol=1e-6)
            dropped_frac.append(1 - keep[live].mean())
            masks.append(keep | ~live)
            opt.zero_grad()
            x = torch.from_numpy(b["x"])
            h = torch.relu(twin.l1(x)) * torch.from_numpy(keep.astype(np.float32)) / (1 - mod.P_DROP)
            want = torch.nn.functional.cross_entropy(twin.l2(h), torch.from_numpy(b["labels"]).long())
            want.backward()
            assert res.loss == pytest.approx(want.item(), rel=LOSS_RTOL), t
            got = model.grads()
            for n, g in twins.as_aot(pm, grads=True).items():
                scale = float(np.abs(g).max())
                assert np.abs(got[n] - g).max() <= GRAD_RTOL * scale + 1e-9, f"step {t}: grad of {n}"
            torch.nn.utils.clip_grad_norm_(list(twin.parameters()), 1.0)
            opt.step()
        got, want = model.params(), twins.as_aot(pm)
        for n in want:
            np.testing.assert_allclose(got[n], want[n], rtol=0, atol=PARAM_ATOL_LR * 1e-3, err_msg=n)
    # a fresh mask every step, dropping about p of the units
    assert all(0.07 < f < 0.13 for f in dropped_frac), dropped_frac
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])


def test_digit_canvas_trains(digits):
    mod, model = digits
    model.reset()
    rng = np.random.default_rng(0)
    losses = [model.step(**mod.batch(rng)) for _ in range(100)]
    acc = mod.accuracy(model)
    print(
        f"digit_canvas: loss {np.mean(losses[:5]):.3f} -> {np.mean(losses[-5:]):.3f} in 100 steps; "
        f"held-out accuracy {acc:.3f}"
    )
    assert acc > 0.75  # chance: 0.1
    # the B = 1 canvas variant shares the trained params with the B = 256 probe
    x = mod.batch(np.random.default_rng(1), 256, split="test")["x"]
    np.testing.assert_allclose(model.predict(x=x[:1]), model.predict(x=x)[:1], rtol=1e-5, atol=1e-7)


# ---- mnist_cnn ----------------------------------------------------------------------------------


def test_mnist_cnn_matches_torch(twins, cnn):
    """Max-pooling picks the larger of two values; where two of a window's values differ by less
    than float32 rounding, the pick depends on the order a kernel sums in. The first batch of
    seed 0 has such a window for the CPU kernel set's convolution (64x64 tiles summing K in one
    chain: conv2.W's gradient then differs from float64 torch by 2.7e-4 of its largest entry, the
    GPU set's by 1.9e-7; the first batches of seeds 1-3 agree within 2.3e-7 on both sets), so
    the batches come from seed 1."""
    mod, model = cnn
    assert sum(v.size for v in model.params().values()) == 105866
    run_parity(twins, model, twins.CNN(), batches(mod, 3, seed=1), lr=1e-3, adamw=True, clip=1.0)


def test_mnist_cnn_trains(cnn):
    """A few steps only: a step is ~4 s on lavapipe (2 CPU cores)."""
    mod, model = cnn
    model.reset()
    rng = np.random.default_rng(0)
    losses = [model.step(**mod.batch(rng)) for _ in range(6)]
    x, y = mod.data.digits("test")
    probs = model.predict(x=x[:256, None])  # the B = 256 variant (tensorgrad's could not trace)
    acc = float((probs.argmax(-1) == y[:256]).mean())
    print(f"mnist_cnn: loss {losses[0]:.3f} -> {losses[-1]:.3f} in 6 steps; held-out accuracy {acc:.3f} (256 images)")
    assert acc > 0.3  # chance: 0.1
    np.testing.assert_allclose(model.predict(x=x[:1, None]), probs[:1], rtol=1e-5, atol=1e-7)


# ---- cartpole -----------------------------------------------------------------------------------


def recorded_rollouts(mod, model, n, seed=0):
    """n rollouts of the initial policy (the model's predict), recorded as fixed batches."""
    model.reset()
    rng = np.random.default_rng(seed)
    return [mod.rollout(lambda s: model.predict(states=s), rng)[0] for _ in range(n)]


def test_cartpole_matches_torch(twins, cartpole):
    mod, model = cartpole
    assert sum(v.size for v in model.params().values()) == 114
    run_parity(twins, model, twins.cartpole(), recorded_rollouts(mod, model, 4), lr=5e-3, loss_atol=1e-7)


def test_cartpole_trains(cartpole):
    mod, model = cartpole
    model.reset()
    means = mod.train(model, np.random.default_rng(0), 40)
    first, last = np.mean(means[:10]), np.mean(means[-10:])
    print(f"cartpole: mean episode length {first:.1f} (rollouts 1-10) -> {last:.1f} (31-40)")
    assert last > 2 * first


# ---- tic_tac_toe --------------------------------------------------------------------------------


def test_tic_tac_toe_matches_torch(twins, ttt):
    mod, model = ttt
    assert sum(v.size for v in model.params().values()) == 6537
    run_parity(twins, model, twins.tic_tac_toe(), recorded_rollouts(mod, model, 4), lr=5e-3, loss_atol=1e-7)


def test_tic_tac_toe_trains(ttt):
    mod, model = ttt
    model.reset()

    def score():
        w, d, l = mod.evaluate(lambda s: model.predict(states=s), np.random.default_rng(1), 240)
        return w / 240, (w + d) / 240

    before = score()
    mod.train(model, np.random.default_rng(0), 25)
    after = score()
    print(
        f"tic_tac_toe vs random (240 greedy games): win {before[0]:.2f} -> {after[0]:.2f}, "
        f"win+draw {before[1]:.2f} -> {after[1]:.2f} after 25 rollouts"
    )
    assert after[1] > 0.68 and after[0] > before[0] + 0.15
