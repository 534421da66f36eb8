"""aot.from_torch: PyTorch models, losses and optimizers compiled by aot train as PyTorch does.

Each model (pytorch/examples' polynomial regression and MNIST CNN, micrograd's moons MLP, a
tiny GPT) is built with from_torch and trained 10 steps by the reference interpreter in float64
next to a float64 copy of the torch module with the torch optimizer: losses, gradients and
parameters must agree. One program is compiled and run on the GPU adapter against torch in
float32, with state_dict round trips both ways. Unsupported ops, optimizers and settings must
fail at build time naming what and where.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest

import aot
from aot.frontend import trace_program
from aot.interp import Reference

torch = pytest.importorskip("torch")
nn, F = torch.nn, torch.nn.functional

STEPS = 10


def to_torch(batch):
    return {k: torch.tensor(v).long() if v.dtype.kind in "iu" else torch.tensor(v) for k, v in batch.items()}


def parity(module, loss, inputs, batches, make_opt, make_sched=None, clip=None, infer=None, rtol=1e-6):
    """Train `module` 10 steps in aot's interpreter (float64) and in torch (float64): compare."""
    opt = make_opt(module)
    sched = make_sched(opt) if make_sched else None
    prog = aot.from_torch(module, loss, inputs, opt, scheduler=sched, clip_grad_norm=clip, name="parity",
                          infer=infer or {})
    traced = trace_program(prog)
    ref = Reference(traced, dtype=np.float64)
    tm = copy.deepcopy(module).double()
    topt = make_opt(tm)
    tsched = make_sched(topt) if make_sched else None
    for i, batch in enumerate(batches):
        got = ref.step(**batch)
        topt.zero_grad()
        tl = loss(tm, **to_torch(batch))
        tl.backward()
        # a parameter the optimizer does not hold is frozen in aot: no gradient reaches it (zeros)
        held = {id(p) for g in topt.param_groups for p in g["params"]}
        grads = {n: p.grad.numpy() if p.grad is not None and id(p) in held else np.zeros(p.shape)
                 for n, p in tm.named_parameters()}
        # float64 on both sides, but aot's constants (betas, 1/n, ...) are float32 numbers: gradients
        # that cancel to 0 in exact arithmetic (a bias before BatchNorm) come out ~1e-8 of the largest
        scale = max(np.abs(gr).max() for gr in grads.values()) + 1e-12
        for n, gr in grads.items():  # aot's grads() are the raw gradients, before clipping
            got_g = ref.last_grads.get(n, np.zeros_like(gr))  # a frozen param has no gradient at all
            atol = 1e-6 * np.abs(gr).max() + 1e-7 * scale
            np.testing.assert_allclose(got_g, gr, rtol=1e-5, atol=atol, err_msg=f"step {i} grad {n}")
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(tm.parameters(), clip)
        topt.step()
        if tsched is not None:
            tsched.step()
        assert got == pytest.approx(tl.item(), rel=rtol, abs=1e-12), f"step {i}"
    for n, v in tm.named_parameters():
        np.testing.assert_allclose(ref.params[n], v.detach().numpy(), rtol=1e-5, atol=1e-8, err_msg=n)
    for n, v in tm.named_buffers():
        np.testing.assert_allclose(ref.buffers[n], v.numpy(), rtol=1e-5, atol=1e-6, err_msg=n)
    return prog, ref, tm


# ---- pytorch/examples regression: fit a polynomial with one Linear on [x, x^2, x^3, x^4] ---------


def poly_features(x):
    return np.concatenate([x ** i for i in range(1, 5)], 1)


def test_regression_polynomial():
    torch.manual_seed(0)
    fc = nn.Linear(4, 1)
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=(4, 1)), rng.normal()

    def batch():
        x = rng.normal(size=(16, 1))
        return {"x": poly_features(x), "y": poly_features(x) @ w + b}

    def loss(m, x, y):
        return F.smooth_l1_loss(m(x), y)

    parity(fc, loss, {"x": aot.f32(16, 4), "y": aot.f32(16, 1)}, [batch() for _ in range(STEPS)],
           lambda m: torch.optim.SGD(m.parameters(), lr=0.1))


# ---- micrograd's moons demo: MLP 2-16-16-1, SVM max-margin loss + L2, SGD with linear lr decay ----


def moons(n, rng):
    t = rng.uniform(0, math.pi, n)
    upper = rng.random(n) < 0.5
    x = np.where(upper[:, None], np.stack([np.cos(t), np.sin(t)], 1), np.stack([1 - np.cos(t), 0.5 - np.sin(t)], 1))
    return x + rng.normal(scale=0.1, size=x.shape), np.where(upper, 1.0, -1.0)[:, None]


class MicroMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(2, 16), nn.Linear(16, 16), nn.Linear(16, 1)])

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = F.relu(layer(x))
        return self.layers[-1](x)


def moons_loss(m, x, y):
    data = F.relu(1 - y * m(x)).mean()
    reg = 1e-4 * sum((p * p).sum() for p in m.parameters())
    return data + reg


def test_micrograd_moons():
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    batches = []
    for _ in range(STEPS):
        x, y = moons(32, rng)
        batches.append({"x": x, "y": y})
    _, ref, _ = parity(MicroMLP(), moons_loss, {"x": aot.f32(32, 2), "y": aot.f32(32, 1)}, batches,
                       lambda m: torch.optim.SGD(m.parameters(), lr=1.0),
                       lambda o: torch.optim.lr_scheduler.LinearLR(o, 1.0, 0.1, 100))
    assert set(ref.params) == {f"layers.{i}.{k}" for i in range(3) for k in ("weight", "bias")}


# ---- pytorch/examples mnist: its CNN (smaller), dropout, log_softmax + nll_loss, Adadelta -> Adam ----


class MnistNet(nn.Module):
    """pytorch/examples' mnist Net at 1/8 the channels, on 12x12 images."""

    def __init__(self, p1=0.25, p2=0.5):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.conv2 = nn.Conv2d(4, 8, 3, 1)
        self.dropout1 = nn.Dropout(p1)
        self.dropout2 = nn.Dropout(p2)
        self.fc1 = nn.Linear(8 * 4 * 4, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def mnist_loss(m, x, y):
    return F.nll_loss(m(x), y)


def mnist_batches(rng, n=STEPS, b=8):
    return [{"x": rng.normal(size=(b, 1, 12, 12)), "y": rng.integers(0, 10, b).astype(np.int32)} for _ in range(n)]


MNIST_INPUTS = {"x": aot.f32(8, 1, 12, 12), "y": aot.i32(8)}


def test_mnist_cnn_parity_without_dropout():
    # dropout draws its own masks in aot, so the step-for-step comparison runs with p = 0
    torch.manual_seed(2)
    parity(MnistNet(0.0, 0.0), mnist_loss, MNIST_INPUTS, mnist_batches(np.random.default_rng(2)),
           lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.05),
           lambda o: torch.optim.lr_scheduler.StepLR(o, 3, 0.5), clip=1.0)


def test_mnist_cnn_dropout_train_and_eval():
    torch.manual_seed(3)
    net = MnistNet()
    prog = aot.from_torch(net, mnist_loss, MNIST_INPUTS, torch.optim.Adam(net.parameters(), lr=1e-3),
                          infer={"predict": (lambda m, x: m(x).exp(), {"x": aot.f32("B", 1, 12, 12)})},
                          dims={"B": (1, 8)}, name="mnist_drop")
    traced = trace_program(prog)
    train_ops = [aot_ops for name, aot_ops, _ in traced.graphs["train"].meta["torch_ops"] if name == "aten.native_dropout.default"]
    assert len(train_ops) == 2 and all("rand" in o for o in train_ops)  # two dropouts, each a fresh mask
    assert not any("dropout" in name for name, _, _ in traced.graphs["predict[B=8]"].meta["torch_ops"])
    ref = Reference(traced, dtype=np.float64)
    x = np.random.default_rng(3).normal(size=(8, 1, 12, 12))
    net.eval()
    want = net.double()(torch.tensor(x)).exp().detach().numpy()
    np.testing.assert_allclose(ref.predict("predict", x=x), want, rtol=1e-6, atol=1e-9)
    # training mode: a step's loss differs from the eval-mode loss (masks drawn), and repeats per seed
    batch = mnist_batches(np.random.default_rng(4), 1)[0]
    a, b = Reference(traced, dtype=np.float64), Reference(traced, dtype=np.float64)
    assert a.step(**batch) == b.step(**batch)
    assert a.step(**batch) != pytest.approx(mnist_loss(net, **to_torch(batch)).item())


# ---- errors name the op, the setting and the user's line -----------------------------------------


def test_unsupported_op_points_at_user_line():
    class Sorter(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def forward(self, x):
            return torch.sort(self.l(x), dim=-1).values  # the line the error must name

    m = Sorter()
    prog = aot.from_torch(m, lambda m, x: m(x).sum(), {"x": aot.f32(2, 4)}, name="sorter")
    with pytest.raises(aot.TraceError) as e:
        trace_program(prog)
    msg = str(e.value)
    assert "aten.sort" in msg and "test_from_torch.py" in msg and "torch.sort(self.l(x)" in msg


@pytest.mark.parametrize("make, what", [
    (lambda p: torch.optim.NAdam(p, lr=1e-3), "NAdam is not supported"),
    (lambda p: torch.optim.Adam(p, lr=1e-3, maximize=True), "maximize"),
    (lambda p: torch.optim.Adam([{"params": [p[0]], "amsgrad": True}, {"params": p[1:]}], lr=1e-3), "amsgrad"),
    (lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9, dampening=0.1), "dampening"),
])
def test_unsupported_optimizer_settings_refused(make, what):
    m = nn.Linear(2, 1)
    with pytest.raises(aot.TraceError, match=what):
        aot.from_torch(m, lambda m, x: m(x).sum(), {"x": aot.f32(2, 2)}, make(list(m.parameters())))


def test_refusals_of_shapes_and_dtypes():
    m = nn.Linear(2, 1).double()
    with pytest.raises(aot.TraceError, match="float32"):
        aot.from_torch(m, lambda m, x: m(x).sum(), {"x": aot.f32(2, 2)})
    with pytest.raises(aot.TraceError, match="aot.f32"):
        aot.from_torch(nn.Linear(2, 1), lambda m, x: m(x).sum(), {"x": (2, 2)})


# ---- the example, compiled for the GPU adapter: steps, predictions and state_dict round trips ----


@pytest.mark.gpu
def test_example_mnist_on_gpu_and_state_dict_round_trip():
    import runpy
    from pathlib import Path

    ex = runpy.run_path(str(Path(__file__).resolve().parent.parent / "examples" / "from_torch_mnist.py"))
    assert ex["program"].name == "from_torch_mnist"
    prog, net = ex["make_program"](width=0.125, image=12, batch=8, name="ft_mnist_small")
    ref = Reference(trace_program(prog))
    model = aot.compile(prog)
    try:
        assert model.param_names == [n for n, _ in net.named_parameters()]
        # the package starts from the module's values, under its state_dict names and layouts
        for n, v in net.state_dict().items():
            np.testing.assert_array_equal(model.state_dict()[n], v.numpy())
        batches = mnist_batches(np.random.default_rng(5), 3)
        for b in batches:  # dropout masks included: the package draws what the interpreter draws
            b32 = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in b.items()}
            assert model.step(**b32) == pytest.approx(ref.step(**b32), rel=1e-4)
        x = batches[0]["x"].astype(np.float32)
        sd = model.state_dict()
        net.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()})  # strict: every name matches
        net.eval()
        with torch.no_grad():
            want = net(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(model.predict(x=x), want, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(model.predict(x=x[:1]), want[:1], rtol=1e-4, atol=1e-5)
        # and back: a torch checkpoint loads into the package
        with torch.no_grad():
            for p in net.parameters():
                p.mul_(0.5)
            want = net(torch.from_numpy(x)).numpy()
        model.load_state_dict(net.state_dict())
        np.testing.assert_allclose(model.predict(x=x), want, rtol=1e-4, atol=1e-5)
    finally:
        model.close()


def test_import_aot_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, aot; assert callable(aot.from_torch); assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---- transformers: nanoGPT's and minGPT's shapes (tests/from_torch_models.py) --------------------


def gpt_batches(rng, n=STEPS, b=4, t=8, v=11):
    out = []
    for _ in range(n):
        seq = (rng.integers(0, v, (b, 1)) + np.arange(t + 1)) % v
        tgt = seq[:, 1:].copy()
        tgt[0, :2] = -1  # ignore_index positions
        out.append({"idx": seq[:, :t].astype(np.int32), "targets": tgt.astype(np.int32)})
    return out


GPT_INPUTS = {"idx": aot.i32(4, 8), "targets": aot.i32(4, 8)}


@pytest.mark.parametrize("explicit", [False, True], ids=["nanogpt_sdpa_tied", "mingpt_masked"])
def test_gpt(explicit):
    from from_torch_models import GPT, gpt_loss, gpt_optimizer

    torch.manual_seed(4)
    m = GPT(explicit=explicit, tie=not explicit)
    _, ref, _ = parity(m, gpt_loss, GPT_INPUTS, gpt_batches(np.random.default_rng(4), 6), gpt_optimizer,
                       lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 20, 1e-4), clip=1.0)
    traced = ref.traced
    ops_used = {name for name, _, _ in traced.graphs["train"].meta["torch_ops"]}
    assert ("aten.scaled_dot_product_attention.default" in ops_used) != explicit
    decayed = {p.name for p in traced.params if p.decay}
    assert decayed == {n for n, p in m.named_parameters() if p.dim() >= 2}


# ---- pytorch/examples' VAE: reparameterization, binary cross-entropy, KL --------------------------


def vae_batches(rng, n=STEPS):
    return [{"x": rng.uniform(0.05, 0.95, (8, 16)), "eps": rng.normal(size=(8, 4))} for _ in range(n)]


def test_vae_parity_with_given_noise():
    from from_torch_models import VAE, vae_loss

    torch.manual_seed(5)
    parity(VAE(), vae_loss, {"x": aot.f32(8, 16), "eps": aot.f32(8, 4)}, vae_batches(np.random.default_rng(5)),
           lambda m: torch.optim.Adam(m.parameters(), lr=1e-2),
           lambda o: torch.optim.lr_scheduler.MultiStepLR(o, [2, 5, 5], 0.5))


def test_vae_randn_like_draws_fresh_normal_noise():
    from from_torch_models import VAE, vae_loss

    torch.manual_seed(6)
    m = VAE()
    prog = aot.from_torch(m, lambda m, x: vae_loss(m, x), {"x": aot.f32(8, 16)}, torch.optim.Adam(m.parameters()),
                          infer={"noise": (lambda m, x: torch.randn_like(x), {"x": aot.f32(64, 64)}),
                                 "drop2d": (lambda m, x: F.dropout2d(x, 0.5, True), {"x": aot.f32(4, 64, 3, 3)})},
                          name="vae")
    ref = Reference(trace_program(prog))
    a, b = ref.predict("noise", x=np.zeros((64, 64))), ref.predict("noise", x=np.zeros((64, 64)))
    assert abs(a.mean()) < 0.05 and abs(a.std() - 1) < 0.05 and not np.array_equal(a, b)
    d = ref.predict("drop2d", x=np.ones((4, 64, 3, 3)))  # whole channels dropped, the rest scaled by 2
    assert set(np.unique(d)) == {0.0, 2.0} and (d.min((2, 3)) == d.max((2, 3))).all() and 0.35 < (d == 0).mean() < 0.65
    x = vae_batches(np.random.default_rng(6), 1)[0]["x"]
    assert np.isfinite(ref.step(x=x))


# ---- op zoo: each case is one parameter through one or a few ATen ops; its gradient names it ------

IDX = [[2, 0], [1, 1]]
ZOO = {  # name -> (param shape, fn(p) -> tensor)
    "slice_step_select": ((4, 7), lambda p: p[1:, 1:6:2] * p[-1][None, :3]),
    "cat_stack_flip": ((3, 4), lambda p: torch.stack([torch.cat([p, p * 2], 0), torch.cat([p.flip(0), p], 0)], 1)),
    "clamp_where_cmp": ((3, 5), lambda p: torch.where((p > 0.1) & (p <= 0.9) | (p == 0), p.clamp(-0.5, 0.5), p * p)
                        + (p >= 0).float() * p.clamp_min(0.2) + (p != p.max()).float()),
    "var_std_amin_max": ((3, 6), lambda p: p.var(1) + p.std(0, correction=0).sum() + p.amin(1) + p.max(1).values),
    "constants_gather_index": ((3, 4), lambda p: torch.gather(p, 1, torch.tensor(IDX)) + p[torch.tensor([2, 0])][:2, :2]
                               + p.index_select(1, torch.tensor([3, 1]))[:2]),
    "pad": ((2, 3, 4), lambda p: F.pad(p, (1, 2)) + F.pad(p, (1, 2), value=0.5) + F.pad(p, (2, 1, 0, 0), "constant", 0.0)),
    "pools": ((2, 2, 6, 6), lambda p: F.avg_pool2d(p, 2).sum() + F.adaptive_avg_pool2d(p, 1).sum()
              + F.avg_pool2d(p, 3, 2, 1, count_include_pad=False).sum() + F.max_pool2d(p, 3, 2, 1).sum()
              + F.max_pool2d(p, 4, 3, 1, ceil_mode=True).pow(2).sum() + F.max_pool2d(p[..., :5], 2, ceil_mode=True).sum()),
    "norms": ((2, 4, 3, 3), lambda p: F.group_norm(p, 2) + F.layer_norm(p, (3, 3)) + F.instance_norm(p)),
    "conv1d_conv2d_groups": ((2, 4, 6), lambda p: F.conv1d(p, p[0, :, :3].reshape(2, 2, 3), stride=2, padding=1, groups=2).sum()
                             + F.conv2d(p[:, None], p[:1, None, :3, :3], padding=1).sum()),
    "activations": ((3, 5), lambda p: F.leaky_relu(p, 0.1) + F.hardtanh(p) + F.elu(p) + F.softplus(p) + F.silu(p)
                    + F.mish(p) + F.hardswish(p) + F.hardsigmoid(p) + F.logsigmoid(p) + F.gelu(p) + torch.log1p(p * p)
                    + torch.expm1(p) + p.abs().sqrt() + torch.rsqrt(p * p + 1) + p.sin() * p.cos()),
    "softmaxes": ((3, 5), lambda p: F.softmax(p, 0) * F.log_softmax(p, 1) + torch.logsumexp(p, 1, keepdim=True)),
    "matmuls": ((2, 3, 4), lambda p: (p @ p[0].T).sum() + torch.einsum("bij,bkj->bik", p, p).sum() + (p[0] @ p[1].T).sum()),
    "reductions": ((2, 3, 4), lambda p: p.sum((0, 2), keepdim=True) * p.mean(-1, keepdim=True) + p.prod(1, keepdim=True)),
    "shapes": ((2, 3, 4), lambda p: p.transpose(0, 2).reshape(4, 6).unsqueeze(0).expand(2, 4, 6).permute(2, 0, 1)
               * p.repeat(1, 1, 2).view(2, 3, 2, 4).sum(2).flatten().reshape(6, 2, 2)[:, :1].squeeze(1).repeat(1, 2)[:, None]),
    "losses": ((4, 5), lambda p: F.mse_loss(p, p.flip(0).detach()) + F.l1_loss(p, 0 * p) + F.huber_loss(p, p * 0.5, delta=0.3)
               + F.binary_cross_entropy_with_logits(p, torch.sigmoid(p.detach())) + F.kl_div(F.log_softmax(p, 1),
               F.softmax(p.flip(1), 1).detach(), reduction="batchmean") + F.cross_entropy(p, torch.tensor([1, 0, 4, 2]),
               label_smoothing=0.1) + F.nll_loss(F.log_softmax(p, 1), torch.tensor([0, 1, 2, 3]), weight=(torch.arange(5.0) + 1).to(p.dtype))
               + F.cosine_similarity(p, p.flip(1)).sum()),
    "div_modes_triu": ((3, 3), lambda p: torch.div(p, 0.3, rounding_mode="floor").detach() * p
                       + torch.div(p, 0.3, rounding_mode="trunc").detach() + torch.triu(p, 1) + torch.tril(p)),
    "misc": ((4, 6), lambda p: sum(p.chunk(2, 1)).repeat(1, 2) * torch.stack(p.unbind(0)[:2] * 2).sum(0)
             + (p.argmax(1, keepdim=True) == torch.arange(6)).float() * p + (p > 0).any(1, keepdim=True) * p
             + (p > -2).all(0) * (1 - p) + 1 / (p * p + 1) + torch.pow(p * p + 1, p) + torch.erf(p) * p.sign()
             + torch.maximum(p, p.flip(0)) - torch.minimum(p, 0.5 * p) + torch.isnan(p).float()),
    "resize_pad_modes": ((1, 2, 5, 5), lambda p: F.interpolate(p, scale_factor=2).sum() + F.interpolate(p, size=(7, 8), mode="bilinear").sum()
                         * F.interpolate(p, size=(3, 4), mode="bilinear", align_corners=True).sum() + F.pad(p, (1, 2, 2, 1), mode="reflect").sum()
                         * F.pad(p, (1, 2, 0, 1), mode="replicate").mean() + F.pad(p, (1, 1, 2, 1), mode="circular").pow(2).sum()
                         + F.pixel_shuffle(p[:, :1].repeat(1, 4, 1, 1), 2).sin().sum()),
    "conv_transpose_dilated": ((1, 2, 5, 5), lambda p: F.conv_transpose2d(p, p[0, :, :3, :3].reshape(2, 1, 3, 3).repeat(1, 3, 1, 1),
                               stride=2, padding=1, output_padding=1).pow(2).sum() + F.conv2d(p, p[:1, :, :2, :2].repeat(3, 1, 1, 1),
                               dilation=2, padding=1).pow(2).sum() + F.conv_transpose1d(p[:, :, 0], p[0, :, 0, :3].reshape(2, 1, 3)).pow(2).sum()),
    "pool_modes_cumsum_index": ((2, 2, 7, 7), lambda p: F.adaptive_avg_pool2d(p, (3, 2)).sum() * F.avg_pool2d(p, 3, 2, ceil_mode=True).mean()
                                + p.cumsum(3).sin().sum() + p[:, [1, 0, 1]].pow(2).sum() + p[torch.tensor([1, 0]), torch.tensor([[0], [1]])].sin().sum()),
}


class Zoo(nn.Module):
    def __init__(self, names):
        super().__init__()
        g = torch.Generator().manual_seed(7)
        self.p = nn.ParameterDict({n: nn.Parameter(torch.randn(ZOO[n][0], generator=g)) for n in names})
        self.w = {n: torch.randn(ZOO[n][1](self.p[n].detach()).shape, generator=g) for n in names}


def zoo_loss(m, x):
    return sum((ZOO[n][1](p) * m.w[n]).sum() for n, p in m.p.items()) + x.sum()


def test_op_zoo():
    # one program for every case (one export, one trace): a wrong mapping shows as the gradient of
    # its case's parameter, p.<case>
    z = Zoo(list(ZOO))
    parity(z, zoo_loss, {"x": aot.f32(1)}, [{"x": np.zeros(1)}], lambda m: torch.optim.SGD(m.parameters(), lr=0.01))


# ---- BatchNorm: batch statistics and running-stat updates in training, running stats in eval -------


class BNNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(4)
        self.fc1 = nn.Linear(4 * 3 * 3, 8)
        self.bn2 = nn.BatchNorm1d(8, momentum=0.3)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv(x))), 2)
        return self.fc2(F.relu(self.bn2(self.fc1(x.flatten(1)))))


def test_batchnorm_running_stats_and_eval():
    torch.manual_seed(8)
    net = BNNet()
    rng = np.random.default_rng(8)
    batches = [{"x": rng.normal(size=(6, 1, 6, 6)), "y": rng.integers(0, 3, 6).astype(np.int32)} for _ in range(6)]
    _, ref, tm = parity(net, lambda m, x, y: F.cross_entropy(m(x), y), {"x": aot.f32(6, 1, 6, 6), "y": aot.i32(6)},
                        batches, lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True),
                        infer={"predict": (lambda m, x: m(x), {"x": aot.f32(6, 1, 6, 6)})})
    assert ref.buffers["bn1.num_batches_tracked"] == 6
    tm.eval()
    np.testing.assert_allclose(ref.predict("predict", x=batches[0]["x"]), tm(torch.tensor(batches[0]["x"])).detach().numpy(),
                               rtol=1e-5, atol=1e-6)


def test_frozen_and_unoptimized_params_stay_put():
    torch.manual_seed(9)
    m = MicroMLP()
    m.layers[0].weight.requires_grad_(False)
    rng = np.random.default_rng(9)
    batches = [dict(zip(("x", "y"), moons(32, rng))) for _ in range(3)]

    def make_opt(mm):  # layers.2.bias is in no group: torch never updates it
        return torch.optim.Adam([p for n, p in mm.named_parameters() if p.requires_grad and n != "layers.2.bias"], lr=0.05)

    w0, b0 = m.layers[0].weight.detach().numpy().copy(), m.layers[2].bias.detach().numpy().copy()
    _, ref, _ = parity(m, moons_loss, {"x": aot.f32(32, 2), "y": aot.f32(32, 1)}, batches, make_opt)
    np.testing.assert_array_equal(ref.params["layers.0.weight"], w0)
    np.testing.assert_array_equal(ref.params["layers.2.bias"], b0)
    assert not np.array_equal(ref.params["layers.1.weight"], m.layers[1].weight.detach().numpy())


def two_groups(cls, **kw):
    """Layer 0 in a group of its own (its own lr and weight decay), the rest in another."""
    def make(m):
        first = list(m.layers[0].parameters())
        rest = [p for p in m.parameters() if all(p is not q for q in first)]
        return cls([{"params": first, "lr": 0.02, "weight_decay": 0.1}, {"params": rest}], **kw)
    return make


@pytest.mark.parametrize("make, sched", [
    (lambda m: torch.optim.Adam(m.parameters(), lr=0.02, weight_decay=0.05, amsgrad=True), None),
    (lambda m: torch.optim.RMSprop(m.parameters(), lr=0.01, momentum=0.5, centered=True, weight_decay=0.01), None),
    (lambda m: torch.optim.Adagrad(m.parameters(), lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1), None),
    (lambda m: torch.optim.Adadelta(m.parameters(), lr=1.0, rho=0.8), None),
    (two_groups(torch.optim.SGD, lr=0.05, momentum=0.9), lambda o: torch.optim.lr_scheduler.ExponentialLR(o, 0.9)),
    (two_groups(torch.optim.AdamW, lr=0.01, betas=(0.8, 0.9)), None),
    (lambda m: torch.optim.SGD(m.parameters(), lr=0.3), lambda o: torch.optim.lr_scheduler.SequentialLR(o, [
        torch.optim.lr_scheduler.LinearLR(o, 0.1, 1.0, 3), torch.optim.lr_scheduler.ExponentialLR(o, 0.8),
        torch.optim.lr_scheduler.CosineAnnealingLR(o, 4, 0.01)], milestones=[3, 6])),
], ids=["adam_l2_amsgrad", "rmsprop_centered", "adagrad", "adadelta", "sgd_groups_explr", "adamw_groups", "sequential_lr"])
def test_optimizers_and_groups(make, sched):
    torch.manual_seed(10)
    rng = np.random.default_rng(10)
    batches = [dict(zip(("x", "y"), moons(32, rng))) for _ in range(STEPS)]
    parity(MicroMLP(), moons_loss, {"x": aot.f32(32, 2), "y": aot.f32(32, 1)}, batches, make, sched)


def test_export_failure_is_a_trace_error():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(2, 2)

        def forward(self, x):
            y = self.l(x)
            return y * 2 if y.sum() > 0 else y  # data-dependent Python control flow

    prog = aot.from_torch(Branchy(), lambda m, x: m(x).sum(), {"x": aot.f32(2, 2)}, name="branchy")
    with pytest.raises(aot.TraceError, match="torch.export could not capture the loss") as e:
        trace_program(prog)
    assert "test_from_torch.py" in str(e.value)  # the loss function's line


def test_inspect_lists_aten_to_aot_ops(tmp_path, capsys):
    from aot.cli import main

    src = tmp_path / "tiny_torch.py"
    src.write_text(
        "import torch, aot\n"
        "net = torch.nn.Linear(3, 2)\n"
        "program = aot.from_torch(net, lambda m, x: torch.relu(m(x)).mean(), {'x': aot.f32(4, 3)},\n"
        "                         torch.optim.SGD(net.parameters(), lr=0.1), name='tiny_torch')\n"
    )
    assert main(["inspect", str(src)]) == 0
    out = capsys.readouterr().out
    assert "ATen ops (" in out
    assert any(line.split()[:3] == ["aten.addmm.default", "->", "matmul"] for line in out.splitlines())
    assert any(line.split()[:3] == ["aten.relu.default", "->", "relu"] and "tiny_torch.py:3" in line for line in out.splitlines())


# ---- several training entries: a GAN, each entry with its own torch optimizer --------------------


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        self.gen = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
        self.disc = nn.Sequential(nn.Linear(2, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))


def d_loss(m, real, z):
    fake = m.gen(z).detach()
    ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)
    return F.binary_cross_entropy_with_logits(m.disc(real), ones) + F.binary_cross_entropy_with_logits(m.disc(fake), zeros)


def g_loss(m, real, z):
    return F.binary_cross_entropy_with_logits(m.disc(m.gen(z)), torch.ones(z.shape[0], 1))


@pytest.mark.gpu
def test_gan_two_training_entries():
    if "params" not in aot.Train.__dataclass_fields__:
        pytest.skip("this aot has no several training entries yet (train-entries)")
    torch.manual_seed(11)
    net = GAN()
    opts = {"d": lambda m: torch.optim.Adam(m.disc.parameters(), lr=0.01, betas=(0.5, 0.999)),
            "g": lambda m: torch.optim.SGD(m.gen.parameters(), lr=0.05, momentum=0.5)}
    ins = {"real": aot.f32(8, 2), "z": aot.f32(8, 3)}
    prog = aot.from_torch(net, {"d": (d_loss, opts["d"](net)), "g": (g_loss, opts["g"](net))}, ins, name="gan")
    model = aot.compile(prog)
    try:
        tm = copy.deepcopy(net)
        topts = {k: f(tm) for k, f in opts.items()}
        rng = np.random.default_rng(11)
        for i in range(5):
            b = {"real": (rng.normal(size=(8, 2)) + 2.0).astype(np.float32), "z": rng.normal(size=(8, 3)).astype(np.float32)}
            for entry, fn in (("d", d_loss), ("g", g_loss)):
                got = getattr(model, f"step_{entry}")(**b)
                topts[entry].zero_grad()
                tl = fn(tm, **to_torch(b))
                tl.backward()
                topts[entry].step()
                assert got == pytest.approx(tl.item(), rel=1e-4), f"step {i} entry {entry}"
        for n, v in tm.state_dict().items():
            np.testing.assert_allclose(model.state_dict()[n], v.numpy(), rtol=1e-4, atol=1e-5, err_msg=n)
    finally:
        model.close()


def test_aot_optimizer_and_infer_only_programs():
    torch.manual_seed(12)
    m = nn.Linear(2, 1)
    prog = aot.from_torch(m, lambda m, x: m(x).pow(2).mean(), {"x": aot.f32(4, 2)}, aot.optim.SGD(lr=0.5))
    assert prog.name == "linear" and prog.train.optimizer == aot.optim.SGD(lr=0.5)
    ref = Reference(trace_program(prog), dtype=np.float64)
    x = np.ones((4, 2))
    ref.step(x=x)
    w, b = m.weight.detach().double(), m.bias.detach().double()
    gw = 2 * ((torch.tensor(x) @ w.T + b) * torch.tensor(x)).mean(0, keepdim=True)
    np.testing.assert_allclose(ref.params["weight"], (w - 0.5 * gw).numpy(), rtol=1e-6)
    only = aot.from_torch(m, None, {}, infer={"f": (lambda m, x: m(x), {"x": aot.f32(3, 2)})}, name="only_infer")
    assert only.train is None
    np.testing.assert_allclose(Reference(trace_program(only), dtype=np.float64).predict("f", x=np.ones((3, 2))),
                               m.double()(torch.ones(3, 2, dtype=torch.float64)).detach().numpy(), rtol=1e-6)


def test_lr_sequential_schedule():
    s = aot.lr.sequential(aot.lr.linear(0.1, 1.0, 4), 5, aot.lr.step(1.0, 2, 0.5))
    assert [s(t) for t in range(1, 10)] == pytest.approx([0.1, 0.325, 0.55, 0.775, 1.0, 1.0, 1.0, 0.5, 0.5])
    assert s.spec == ("sequential", ("linear", 0.1, 1.0, 4), 5, ("step", 1.0, 2, 0.5))
    with pytest.raises(ValueError, match="sequential steps"):
        aot.lr.sequential(0.1, 0, 0.2)


class Layers(nn.Module):
    """torch.nn's composite layers in one model: their ATen decompositions must all map."""

    def __init__(self):
        super().__init__()
        self.enc = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)
        self.lstm = nn.LSTM(8, 6, batch_first=True)
        self.gru = nn.GRU(6, 4, num_layers=2, batch_first=True, bidirectional=True)

    def forward(self, x):
        x = self.enc(x)
        x = x + self.mha(x, x, x, need_weights=False)[0]
        return self.gru(self.lstm(x)[0])[0]


def test_torch_nn_layers_transformer_mha_lstm_gru():
    torch.manual_seed(13)
    m = Layers()
    rng = np.random.default_rng(13)
    x0 = rng.normal(size=(2, 5, 8))
    _, ref, tm = parity(m, lambda m, x: m(x).pow(2).mean(), {"x": aot.f32(2, 5, 8)}, [{"x": x0}] * 2,
                        lambda m: torch.optim.Adam(m.parameters(), lr=0.01),
                        infer={"f": (lambda m, x: m(x), {"x": aot.f32(2, 5, 8)})})
    tm.eval()  # the encoder layer's eval fast path is a different ATen graph
    np.testing.assert_allclose(ref.predict("f", x=x0), tm(torch.tensor(x0)).detach().numpy(), rtol=1e-6, atol=1e-9)
