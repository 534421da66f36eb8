"""Four of tensorgrad's samples as aot examples: vae, flow_matching_tiny, makemore, pokeformer.

For each, one module-scoped run trains the compiled package on a fixed sequence of batches
(deterministic seeds), recording every step's loss and captures, and the parameters and
gradients of the first PARITY_STEPS steps. Then:

- PyTorch parity with the sample's twin (examples/<name>_torch.py; aot's Linear `W` is torch's
  `weight.T`), on the same batches and, for the in-graph noise (vae's eps, flow's x1), the
  values the package drew, read back with `aot.capture`:
  (a) at each step, from the parameters the package had before it: the loss and every gradient;
  (b) torch.optim's own run from the same initial parameters (same optimizer, lr schedule, decay
      groups, clipping): the per-step losses and the parameters after PARITY_STEPS steps;
- training: the loss falls well below its start within the short run;
- the infer entries run at their declared shapes (encode/decode, the flow's Euler sampler, the
  makemore logits and validation loss, pokeformer's in-graph categorical sampling).

vae, makemore and pokeformer run the samples' programs exactly. flow_matching_tiny's B = 64
fits the current 128 MiB storage binding (its work arena is 86.1 MiB), but a step takes about
25 CPU-seconds on lavapipe, so the tests use its program at B = 2 (the same graph and
hyperparameters otherwise).
"""

from __future__ import annotations

import runpy
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import aot

pytestmark = pytest.mark.gpu  # needs a WebGPU adapter (lavapipe on CI)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PARITY_STEPS = 3
LOSS_RTOL = 1e-5
GRAD_TOL = 1e-4  # max |aot - torch| over a gradient, relative to the largest |torch| entry
TRAJ_TOL = 0.05  # |aot - torch| / |torch - init| of each parameter after PARITY_STEPS updates
FLOW_TEST_B = 2


def load(name: str) -> dict:
    return runpy.run_path(str(EXAMPLES / f"{name}.py"))


@dataclass
class Run:
    """A compiled sample trained for len(batches) steps from its seed's initial parameters."""

    mod: dict
    model: object
    decay: dict[str, bool]
    batches: list[dict]
    losses: list[float] = field(default_factory=list)
    captures: list[dict] = field(default_factory=list)
    params: list[dict] = field(default_factory=list)  # before step 1, 2, ..., PARITY_STEPS + 1
    grads: list[dict] = field(default_factory=list)  # of steps 1..PARITY_STEPS
    pools: tuple = ()  # the names samples' (train, test) lists


def train_run(mod: dict, program, batches: list[dict], pools=()):
    wgpu = pytest.importorskip("wgpu")
    if wgpu.gpu.request_adapter_sync(power_preference="high-performance") is None:
        pytest.skip("no WebGPU adapter")
    model = aot.compile(program)
    decay = {n: bool(d) for n, _, _, d, _ in model._program["params"]}
    run = Run(mod, model, decay, batches, pools=pools)
    try:
        run.params.append(model.params())
        for t, b in enumerate(batches, 1):
            res = model.step(**b, captures=True)
            run.losses.append(res.loss)
            run.captures.append(res.captures)
            if t <= PARITY_STEPS:
                run.grads.append(model.grads())
                run.params.append(model.params())
        yield run
    finally:
        model.close()


# ---- PyTorch side -----------------------------------------------------------------------------


def param_map(torch, module) -> dict:
    """aot name -> (torch parameter, transposed?) by module type, with tensorgrad's names."""
    out = {}
    for prefix, mod in module.named_modules():
        p = prefix + "." if prefix else ""
        if isinstance(mod, torch.nn.Linear):
            out[p + "W"] = (mod.weight, True)
            if mod.bias is not None:
                out[p + "b"] = (mod.bias, False)
        elif isinstance(mod, torch.nn.Conv2d):
            out[p + "W"] = (mod.weight, False)
            out[p + "b"] = (mod.bias, False)
        elif isinstance(mod, torch.nn.LayerNorm):
            out[p + "g"] = (mod.weight, False)
            out[p + "b"] = (mod.bias, False)
        elif isinstance(mod, torch.nn.RMSNorm):
            out[p + "g"] = (mod.weight, False)
        elif isinstance(mod, torch.nn.Embedding):
            out[p + "W"] = (mod.weight, False)
        else:
            for name, param in mod.named_parameters(recurse=False):
                out[p + name] = (param, False)
    return out


def load_params(torch, pm, params):
    assert set(pm) == set(params), sorted(set(pm) ^ set(params))
    with torch.no_grad():
        for name, (p, transposed) in pm.items():
            v = params[name].T if transposed else params[name]
            assert tuple(p.shape) == v.shape, name
            p.copy_(torch.from_numpy(np.ascontiguousarray(v)))


def torch_loss(torch, module, loss_fn, run: Run, noise, t: int):
    args = {k: torch.from_numpy(np.asarray(v)) for k, v in run.batches[t - 1].items()}
    args.update({k: torch.from_numpy(np.asarray(v)) for k, v in noise(t).items()})
    return loss_fn(module, **args)


def check_parity(torch, make_module, loss_fn, run: Run, noise, opt_kind: str, lr_at, weight_decay=0.0):
    """The PARITY_STEPS first steps against PyTorch; returns the measured errors.

    (a) Per step, from the parameters aot had before it: loss and every gradient. (b) torch.optim's
    own trajectory from the initial parameters (same optimizer, lr schedule, decay groups and
    clipping): per-step losses and the parameters after the last step. (b) is looser than (a):
    Adam divides each gradient by its own magnitude, so entries whose gradient is a near-zero sum
    of cancelling terms (relative float32 error ~1%) move by a visibly different step."""
    noise = noise or (lambda t: {})
    module = make_module()
    pm = param_map(torch, module)
    errs = {"loss": 0.0, "grad": 0.0, "traj_loss": 0.0, "traj_param": 0.0}
    assert len(run.params) == PARITY_STEPS + 1
    for t in range(1, PARITY_STEPS + 1):
        load_params(torch, pm, run.params[t - 1])
        module.zero_grad()
        loss = torch_loss(torch, module, loss_fn, run, noise, t)
        loss.backward()
        errs["loss"] = max(errs["loss"], abs(run.losses[t - 1] - loss.item()) / abs(loss.item()))
        for n, (p, tr) in pm.items():
            want = (p.grad.T if tr else p.grad).numpy()
            got = run.grads[t - 1][n]
            errs["grad"] = max(errs["grad"], float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30)))

    torch.manual_seed(0)
    module = make_module()
    pm = param_map(torch, module)
    load_params(torch, pm, run.params[0])
    decayed = [p for n, (p, _) in pm.items() if run.decay[n]]
    rest = [p for n, (p, _) in pm.items() if not run.decay[n]]
    groups = [{"params": decayed, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
    opt = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[opt_kind](groups, lr=lr_at(1), betas=(0.9, 0.999), eps=1e-8)
    for t in range(1, PARITY_STEPS + 1):
        for g in opt.param_groups:
            g["lr"] = lr_at(t)
        opt.zero_grad()
        loss = torch_loss(torch, module, loss_fn, run, noise, t)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(module.parameters()), 1.0)
        opt.step()
        errs["traj_loss"] = max(errs["traj_loss"], abs(run.losses[t - 1] - loss.item()) / abs(loss.item()))
    for n, (p, tr) in pm.items():
        want = (p.detach().T if tr else p.detach()).numpy().astype(np.float64)
        moved = np.linalg.norm(want - run.params[0][n])
        if moved > 0:  # the difference of the two trajectories, relative to the distance travelled
            errs["traj_param"] = max(errs["traj_param"], float(np.linalg.norm(run.params[-1][n] - want) / moved))
    assert errs["loss"] < LOSS_RTOL and errs["traj_loss"] < LOSS_RTOL, errs
    assert errs["grad"] < GRAD_TOL, errs
    assert errs["traj_param"] < TRAJ_TOL, errs
    return errs


def linear_lr(peak, final, steps):
    return lambda t: peak + (final - peak) * min(t - 1, steps) / steps


# ---- vae ----------------------------------------------------------------------------------------

VAE_STEPS = 20


@pytest.fixture(scope="module")
def vae():
    mod = load("vae")
    rng = np.random.default_rng(1)
    yield from train_run(mod, mod["program"], [mod["batch"](rng) for _ in range(VAE_STEPS)])


def test_vae_matches_torch(vae):
    torch = pytest.importorskip("torch")
    twin = runpy.run_path(str(EXAMPLES / "vae_torch.py"))
    assert vae.captures[0]["eps"].shape == (128, 8)
    errs = check_parity(torch, twin["VAE"], twin["loss"], vae, lambda t: {"eps": vae.captures[t - 1]["eps"]}, "adam", lambda t: 1e-3)
    print("vae parity", errs)


def test_vae_trains_and_decodes(vae):
    losses = vae.losses
    assert losses[0] > 100  # ~ pixel-sum error of a grey image
    print("vae losses", np.round(losses, 2))
    assert np.mean(losses[-3:]) < 0.6 * losses[0], losses
    eps = [c["eps"] for c in vae.captures[:2]]
    assert not np.array_equal(eps[0], eps[1]), "new noise every step"
    model, mod = vae.model, vae.mod
    x = mod["images"]("test")[:9]
    mu = model.encode(x=x)
    assert mu.shape == (9, 8) and np.all(np.isfinite(mu))
    one = model.decode(z=mu[:1])
    assert one.shape == (1, 784) and one.min() >= 0.0 and one.max() <= 1.0
    grid = mod["sample_grid"](model, np.random.default_rng(0))
    assert grid.shape == (9, 28, 28) and np.all(np.isfinite(grid))
    assert mod["interpolate"](model, x[0], x[1], n=3).shape == (3, 28, 28)


# ---- flow_matching_tiny -----------------------------------------------------------------------------

FLOW_STEPS = 50


@pytest.fixture(scope="module")
def flow():
    mod = load("flow_matching_tiny")
    rng = np.random.default_rng(2)
    program = mod["make_program"](b=FLOW_TEST_B)
    yield from train_run(mod, program, [mod["batch"](rng, FLOW_TEST_B) for _ in range(FLOW_STEPS)])


def test_flow_program_is_the_sample():
    program = load("flow_matching_tiny")["program"]
    assert program.train.inputs["x0"].dims == (64, 1, 28, 28)
    opt = program.train.optimizer
    assert type(opt).__name__ == "Adam" and opt.lr == 2e-4 and opt.clip_grad_norm == 1.0


def test_flow_matches_torch(flow):
    torch = pytest.importorskip("torch")
    twin = runpy.run_path(str(EXAMPLES / "flow_matching_tiny_torch.py"))
    x1 = [c["x1"] for c in flow.captures]
    assert x1[0].shape == (FLOW_TEST_B, 1, 28, 28) and abs(float(np.mean(np.concatenate(x1)))) < 0.05
    errs = check_parity(torch, twin["TinyFlow"], twin["loss"], flow, lambda t: {"x1": x1[t - 1]}, "adam", lambda t: 2e-4)
    print("flow parity", errs)


def test_flow_trains_and_samples(flow):
    losses = np.array(flow.losses)
    print("flow losses", np.round(losses, 3))
    # |v|^2 = |x1|^2 + |x0|^2 ~ 1.7 at the start; the first thing learnt is E[v | x_t]
    assert losses[:5].mean() > 1.4
    assert losses[-10:].mean() < 0.88 * losses[:10].mean(), np.round(losses, 3)
    img = flow.mod["sample"](flow.model, np.random.default_rng(0), steps=5)
    assert img.shape == (28, 28) and np.all(np.isfinite(img))


# ---- makemore --------------------------------------------------------------------------------------

LM_STEPS = 10


@pytest.fixture(scope="module")
def makemore():
    mod = load("makemore")
    train, test = load("names_data")["split_names"]()
    rng = np.random.default_rng(3)
    yield from train_run(mod, mod["program"], [mod["batch"](rng, train) for _ in range(LM_STEPS)], (train, test))


def test_names_corpus_and_split():
    names_data = load("names_data")

    names = names_data["load_names"]()
    assert len(names) > 5000 and all(n.isalpha() and n.islower() and n.isascii() for n in names)
    train, test = names_data["split_names"]()
    assert len(train) + len(test) == len(names) and not set(train) & set(test)
    assert 0.07 < len(test) / len(names) < 0.13
    assert names_data["name_hash"]("emma") == ((101 * 31 + 109) * 31 + 109) * 31 + 97
    assert names_data["name_hash"]("abigail") < 0  # wraps like JavaScript's `| 0`
    assert names_data["is_test_name"](test[0]) and not names_data["is_test_name"](train[0])


def test_makemore_batches():
    mod = load("makemore")
    b = mod["batch"](np.random.default_rng(0), ["ab", "xyz"], size=4)
    assert b["tokens"].shape == (4, 16) and b["tokens"].dtype == np.int32
    np.testing.assert_allclose(b["mask"].sum(), 1.0, rtol=1e-6)
    for tok, tgt, m in zip(b["tokens"], b["targets"], b["mask"]):
        n = int(np.sum(m > 0))  # BOS -> first letter ... last letter -> EOS
        assert tok[0] == 0 and tgt[n - 1] == 0 and np.all(tgt[: n - 1] > 0)
        np.testing.assert_array_equal(tok[1:], tgt[:-1])


def test_makemore_matches_torch(makemore):
    torch = pytest.importorskip("torch")
    twin = runpy.run_path(str(EXAMPLES / "makemore_torch.py"))
    errs = check_parity(torch, twin["Transformer"], twin["loss"], makemore, None, "adamw", linear_lr(5e-3, 5e-4, 1500), 0.01)
    print("makemore parity", errs)


def test_makemore_trains_and_samples(makemore):
    losses = makemore.losses
    print("makemore losses", np.round(losses, 3))
    assert abs(losses[0] - np.log(27)) < 0.1  # uniform over the vocabulary at the start
    assert np.mean(losses[-3:]) < 0.87 * losses[0], np.round(losses, 3)
    model, mod = makemore.model, makemore.mod
    train, test = makemore.pools
    val = model.val_loss(**mod["batch"](np.random.default_rng(4), test))
    assert val.shape == () and float(val) < 0.9 * losses[0]
    assert model.predict(tokens=np.zeros((1, 16), np.int32)).shape == (1, 16, 27)
    names = [mod["sample_name"](model, np.random.default_rng(i)) for i in range(3)]
    assert all(isinstance(n, str) and len(n) <= 15 and (n == "" or n.isalpha()) for n in names)


# ---- pokeformer ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pokeformer():
    mod = load("pokeformer")
    train, _ = mod["corpus"]()
    rng = np.random.default_rng(5)
    yield from train_run(mod, mod["program"], [mod["batch"](rng, train) for _ in range(LM_STEPS)])


def test_pokeformer_batches():
    mod = load("pokeformer")
    train, test = mod["corpus"]()
    assert all(2 <= len(n) <= 14 for n in train + test) and len(test) > 0
    b = mod["batch"](np.random.default_rng(0), ["abc"], size=2)
    np.testing.assert_array_equal(b["tokens"][0, :5], [26, 0, 1, 2, 26])
    np.testing.assert_array_equal(b["targets"][0, :4], [0, 1, 2, 26])
    np.testing.assert_allclose(b["mask"][0], [0.125] * 4 + [0.0] * 12)


def test_pokeformer_matches_torch(pokeformer):
    torch = pytest.importorskip("torch")
    twin = runpy.run_path(str(EXAMPLES / "pokeformer_torch.py"))
    errs = check_parity(torch, twin["NameLM"], twin["loss"], pokeformer, None, "adamw", linear_lr(5e-3, 5e-4, 1500), 0.01)
    print("pokeformer parity", errs)


def test_pokeformer_trains_and_samples_in_graph(pokeformer):
    losses = pokeformer.losses
    print("pokeformer losses", np.round(losses, 3))
    assert abs(losses[0] - np.log(27)) < 0.1
    assert np.mean(losses[-3:]) < 0.87 * losses[0], np.round(losses, 3)
    model, mod = pokeformer.model, pokeformer.mod
    tokens = np.full((1, 16), 26, np.int32)
    temp = np.array([0.8], np.float32)
    draws = np.stack([model.predict(tokens=tokens, temperature=temp) for _ in range(4)])
    assert draws.dtype == np.int32 and draws.shape == (4, 1, 16)
    assert draws.min() >= 0 and draws.max() < 27
    assert len({tuple(d.ravel()) for d in draws}) > 1, "every call draws anew"
    name = mod["sample_name"](model)
    assert isinstance(name, str) and len(name) < 16 and (name == "" or name.isalpha())
