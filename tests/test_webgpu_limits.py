"""Issue 30's modules, optimizers and training state stay within WebGPU's default limits: every
kernel of every kernel set (the GPU set, its CPU and subgroup variants) of programs built from
them binds at most 8 storage buffers, declares at most 256 invocations (each dimension within its
limit) and 16 KiB of workgroup storage, and dispatches at most 65535 workgroups per dimension, so
a page runs them without asking the adapter for more (aot/web.py's needed_limits, the figures the
web module requests). Sizes are chosen to reach the multi-workgroup paths: long rows for the
norms, a wide LSTM, 4 heads of 16 for attention. No GPU needed: codegen only."""

from __future__ import annotations

import re

import pytest

import aot
from aot import nn, ops, web
from aot.pipeline import compile_program

B, T, E = 4, 6, 64


class Vision(aot.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.gn = nn.GroupNorm(4, 16)
        self.inorm = nn.InstanceNorm2d(16, affine=True)
        self.up = nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1)
        self.bn1 = nn.BatchNorm1d(8, momentum=None)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        h = ops.relu(self.bn(self.conv(x)))
        h = self.inorm(self.gn(h))
        h = ops.relu(self.up(h))  # [B, 8, 48, 48]
        return self.head(self.bn1(ops.mean(h, (2, 3))))


class Sequence(aot.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, E, padding_idx=0)
        self.lstm = nn.LSTM(E, E, num_layers=2, bidirectional=True)
        self.gru = nn.GRU(2 * E, E, batch_first=False)
        self.rnn = nn.RNN(E, E, nonlinearity="relu")
        self.mha = nn.MultiheadAttention(E, 4)
        self.enc = nn.TransformerEncoderLayer(E, 4, dim_feedforward=128, dropout=0.1, norm_first=True)
        self.dec = nn.TransformerDecoderLayer(E, 4, dim_feedforward=128, dropout=0.0)
        self.ln = nn.LayerNorm((T, E))
        self.frozen = nn.Linear(E, E).freeze()
        self.out = nn.Linear(E, 50)

    def forward(self, tokens, mask, pad):
        x = self.emb(tokens)  # [T, B, E]
        y, _ = self.lstm(x)
        y, _ = self.gru(y)
        y, _ = self.rnn(y)
        a, _ = self.mha(y, y, y, need_weights=False)  # fused
        m, w = self.mha(y, x, x, attn_mask=mask, key_padding_mask=pad)  # explicit, with weights
        z = self.enc(a + m + ops.mean(w), is_causal=False)
        z = self.dec(z, x, tgt_mask=mask)
        z = ops.swapaxes(self.ln(ops.swapaxes(z, 0, 1)), 0, 1)
        return self.out(self.frozen(z))


def _vision_loss(m, x, y):
    return ops.cross_entropy(m(x), y)


def _seq_loss(m, tokens, mask, pad, y):
    return ops.cross_entropy(m(tokens, mask, pad), y)


PROGRAMS = {
    "vision": aot.Program(
        "limits_vision",
        model=Vision,
        train={
            "a": aot.Train(_vision_loss, inputs={"x": aot.f32(B, 3, 24, 24), "y": aot.i32(B)},
                           optimizer=aot.optim.RMSprop(lr=1e-3, momentum=0.9, centered=True, groups=[{"params": "bn*", "lr": 1e-2}])),
            "b": aot.Train(_vision_loss, inputs={"x": aot.f32(B, 3, 24, 24), "y": aot.i32(B)},
                           optimizer=aot.optim.Adadelta(), params="head.*"),
        },
        infer={"predict": aot.Infer(lambda m, x: m(x), inputs={"x": aot.f32(B, 3, 24, 24)})},
    ),
    "sequence": aot.Program(
        "limits_sequence",
        model=Sequence,
        train=aot.Train(_seq_loss, inputs={"tokens": aot.i32(T, B), "mask": aot.f32(T, T), "pad": aot.i32(B, T), "y": aot.i32(T, B)},
                        optimizer=aot.optim.Adagrad(lr=1e-2, groups=[{"params": "lstm.*", "lr": 1e-3, "weight_decay": 0.01}])),
        infer={"predict": aot.Infer(lambda m, tokens, mask, pad: m(tokens, mask, pad),
                                    inputs={"tokens": aot.i32(T, B), "mask": aot.f32(T, T), "pad": aot.i32(B, T)})},
    ),
}

_STORAGE = re.compile(r"var<storage\s*,")


@pytest.fixture(scope="module", params=sorted(PROGRAMS))
def compiled(request):
    return compile_program(PROGRAMS[request.param])


def test_needed_limits_are_webgpus_defaults(compiled):
    prog, wgsl, wgsl_cpu, wgsl_subgroup = web.web_tables(compiled)
    over = {k: (v, web.DEFAULT_LIMITS[k]) for k, v in prog["limits"].items() if v > web.DEFAULT_LIMITS[k]}
    assert not over, f"limits over WebGPU's defaults (needed, default): {over}"
    assert len(wgsl) > 10 and (wgsl_cpu or wgsl_subgroup)  # several kernel sets were looked at


def test_every_kernel_of_every_set_within_the_defaults(compiled):
    """Each kernel's own WGSL, read directly: storage bindings, workgroup size and storage."""
    d = web.DEFAULT_LIMITS
    tables = [compiled.program[t] for t in ("_wgsl", "_wgsl_cpu", "_wgsl_subgroup")]
    seen = 0
    for table in tables:
        for name, src in table.items():
            seen += 1
            n_storage = len(_STORAGE.findall(src))
            assert n_storage <= d["maxStorageBuffersPerShaderStage"], f"{name} binds {n_storage} storage buffers"
            need = web.kernel_needs(src)
            for k, v in need.items():
                assert v <= d[k], f"{name}: {k} {v} > {d[k]}"
            assert need.get("maxComputeInvocationsPerWorkgroup", 0) >= 1, f"{name}: no @workgroup_size"
    assert seen > 20
