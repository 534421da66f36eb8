"""Whole programs train in the NumPy reference interpreter: forward, autodiff and the
optimizer update in one graph, for every optimizer (issue: front end)."""

import math

import numpy as np
import pytest

import aot
from aot import nn, ops
from aot.frontend import trace_program
from aot.interp import Reference

OPTIMIZERS = {
    "adam": lambda: aot.optim.Adam(lr=1e-2),
    "adamw": lambda: aot.optim.AdamW(lr=1e-2, weight_decay=0.01, clip_grad_norm=1.0),
    "sgd": lambda: aot.optim.SGD(lr=0.1),
    "sgd_momentum": lambda: aot.optim.SGD(lr=0.05, momentum=0.9, weight_decay=1e-4),
    "sgd_nesterov": lambda: aot.optim.SGD(lr=0.05, momentum=0.9, nesterov=True, clip_grad_norm=5.0),
}


class MLP(aot.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(2, 32, init=aot.init.kaiming())
        self.l2 = nn.Linear(32, 1, init=aot.init.kaiming(1.0))


def mlp_loss(m, x, y):
    return ops.mean(ops.square(m.l2(ops.tanh(m.l1(x))) - y))


def mlp_batch(rng):
    x = rng.uniform(-1, 1, (64, 2)).astype(np.float32)
    return {"x": x, "y": (x[:, :1] * x[:, 1:] + np.sin(2 * x[:, :1])).astype(np.float32)}


T, V, D = 6, 5, 16


class Block(aot.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D, bias=False)
        self.o = nn.Linear(D, D)
        self.ff = nn.Linear(D, D)

    def forward(self, x):
        q, k, v = (nn.split_heads(t, 2) for t in ops.split(self.qkv(self.ln(x)), D, axis=-1))
        att = ops.softmax_causal(q @ ops.swapaxes(k, -1, -2) * (1 / math.sqrt(D // 2))) @ v
        x = x + self.o(nn.merge_heads(att))
        return x + self.ff(ops.gelu(x))


class TinyLM(aot.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D, init=aot.init.randn(0.5))
        self.pos = self.param((T, D), init=aot.init.randn(0.1))
        self.block = Block()
        self.head = nn.Linear(D, V)


def lm_loss(m, tokens, targets):
    x = m.block(m.emb(tokens) + m.pos)
    return ops.cross_entropy(m.head(x), targets)


def lm_batch(rng):
    # the next token is the previous one plus one (mod V): learnable from context
    start = rng.integers(0, V, (16, 1))
    seq = ((start + np.arange(T + 1)) % V).astype(np.int32)
    return {"tokens": seq[:, :T], "targets": seq[:, 1:]}


def train(program, batch, steps=50):
    ref = Reference(trace_program(program))
    rng = np.random.default_rng(0)
    return [ref.step(**batch(rng)) for _ in range(steps)]


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_two_layer_mlp_trains(opt):
    prog = aot.Program("mlp", model=MLP, train=aot.Train(mlp_loss, {"x": aot.f32(64, 2), "y": aot.f32(64, 1)}, OPTIMIZERS[opt]()))
    losses = train(prog, mlp_batch)
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5]), losses


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_one_block_causal_transformer_trains(opt):
    prog = aot.Program(
        "lm", model=TinyLM,
        train=aot.Train(lm_loss, {"tokens": aot.i32(16, T), "targets": aot.i32(16, T)}, OPTIMIZERS[opt]()),
    )
    losses = train(prog, lm_batch)
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:5]), losses


class _BatchNormNet(aot.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(4)


def test_float32_sums_are_accurate_enough_for_batchnorm():
    """The float32 interpreter sums a reduction over many values (a BatchNorm mean over 12544)
    to float32's rounding, not NumPy's naive running sum's n * eps: with a channel mean 300
    times its spread, the naive sum left the gradients ~1e-3 off float64 (and, in a ResNet,
    flipped ReLUs whose input lay within that error of 0)."""
    rng = np.random.default_rng(0)
    # channels-last in memory, as a conv's output reaches BatchNorm (where NumPy sums naively)
    x = (3.0 + 0.01 * rng.standard_normal((16, 28, 28, 4))).astype(np.float32).transpose(0, 3, 1, 2)
    y = rng.standard_normal((16, 4, 28, 28)).astype(np.float32)
    total = rng.uniform(1, 2, (16, 28, 28, 4)).astype(np.float32).transpose(0, 3, 1, 2)
    s = aot.interp.lookup("sum").ref(total, (0, 2, 3), False)
    want = total.astype(np.float64).sum((0, 2, 3))
    assert s.dtype == np.float32 and np.max(np.abs(s / want - 1)) < 1e-7, s / want - 1
    prog = aot.Program(
        "bn_sums",
        model=_BatchNormNet,
        train=aot.Train(lambda m, x, y: ops.mean(m.bn(x) * y), inputs={"x": aot.f32(*x.shape), "y": aot.f32(*y.shape)},
                        optimizer=aot.optim.SGD(lr=0.1)),  # fmt: skip
    )
    grads = {}
    for dt in (np.float32, np.float64):
        ref = Reference(trace_program(prog), dtype=dt)
        ref.step(x=x, y=y)
        grads[dt] = ref.last_grads
    for k, g64 in grads[np.float64].items():
        err = np.linalg.norm(grads[np.float32][k] - g64) / np.linalg.norm(g64)
        assert err < 1e-5, (k, err)
