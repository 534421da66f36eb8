"""MultiheadAttention, TransformerEncoderLayer, TransformerDecoderLayer and TransformerEncoder
against torch.nn (issue 30).

One program calls every variant: the fused path (need_weights=False, is_causal) and the explicit
one (weights returned, averaged or per head; an f32 additive attn_mask; i32 masks as torch's bool
masks: key_padding_mask, per-head [N*H, L, S]); kdim/vdim (separate q/k/v weights) with
batch_first; unbatched input; bias=False; encoder layers post- and pre-norm with relu and gelu;
a decoder layer with causal and memory masks. Inputs are scaled by full-shape parameters first,
so the gradients reaching the modules' inputs are checked too. The package and its torch twin
(same attribute names) take 10 Adam steps side by side in both kernel sets; an infer entry checks
a dropout layer against torch's eval mode.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import aot
from aot import nn, ops
from aot.frontend import trace_program

from nn_parity import randomize, to_torch, train_side_by_side

pytestmark = pytest.mark.gpu  # needs a WebGPU adapter (lavapipe on CI)
torch = pytest.importorskip("torch")

L, N, E, H, S = 4, 2, 8, 2, 5
SHAPES = {"x": (L, N, E), "xb": (N, L, E), "xu": (L, E), "mem": (S, N, E), "kk": (N, S, 6), "vv": (N, S, 5)}
OUTS = {"sa_w": (N, L, L), "sa": (L, N, E), "causal": (L, N, E), "hint": (L, N, E), "masked": (L, N, E),
        "masked_w": (N, H, L, L), "kv": (N, L, E), "kv_w": (N, L, S), "unb": (L, E), "unb_w": (L, L), "nb": (L, N, E), "plain": (L, N, E),
        "enc1": (N, L, E), "enc": (L, N, E), "dec": (L, N, E), "decs": (L, N, E)}  # fmt: skip


class Attn(aot.Module):
    def __init__(self):
        super().__init__()
        self.sx = self.param(SHAPES["x"], init=aot.init.ones())
        self.sxb = self.param(SHAPES["xb"], init=aot.init.ones())
        self.smem = self.param(SHAPES["mem"], init=aot.init.ones())
        self.mha = nn.MultiheadAttention(E, H)
        self.mha_kv = nn.MultiheadAttention(E, H, kdim=6, vdim=5, batch_first=True)
        self.mha_nb = nn.MultiheadAttention(E, H, bias=False)
        self.enc1 = nn.TransformerEncoderLayer(E, H, dim_feedforward=16, dropout=0.0, activation="gelu",
                                               batch_first=True, norm_first=True)  # fmt: skip
        layer = nn.TransformerEncoderLayer(E, H, dim_feedforward=12, dropout=0.0)
        self.enc = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(E))
        self.dec = nn.TransformerDecoderLayer(E, H, dim_feedforward=12, dropout=0.0)
        self.decs = nn.TransformerDecoder(nn.TransformerDecoderLayer(E, H, 12, 0.0, norm_first=True), 2)
        self.enc_drop = nn.TransformerEncoderLayer(E, H, dim_feedforward=12, dropout=0.3)


def outputs(m, b, part):
    x, xb, mem = b["x"] * m.sx, b["xb"] * m.sxb, b["mem"] * m.smem
    kpm, kpm_s, causal = b["kpm"], b["kpm_s"], b["causal"]
    o = {}
    if part == "layers":
        o["enc1"] = m.enc1(xb, src_key_padding_mask=kpm)
        o["enc"] = m.enc(x, mask=causal, is_causal=True)
        o["dec"] = m.dec(x, mem, tgt_mask=causal, memory_key_padding_mask=kpm_s)
        o["decs"] = m.decs(x, mem, tgt_mask=causal, tgt_is_causal=True, memory_mask=b["mmask"])
        return o
    xu = b["xu"]
    o["sa"], o["sa_w"] = m.mha(x, x, x)
    o["causal"] = m.mha(x, x, x, need_weights=False, is_causal=True)[0]
    o["hint"] = m.mha(x, x, x, need_weights=False, attn_mask=causal, is_causal=True)[0]
    o["masked"], o["masked_w"] = m.mha(x, x, x, key_padding_mask=kpm, attn_mask=b["amask"], average_attn_weights=False)
    o["kv"], o["kv_w"] = m.mha_kv(xb, b["kk"], b["vv"], attn_mask=b["bmask"])
    o["unb"], o["unb_w"] = m.mha(xu, xu, xu)
    o["nb"] = m.mha_nb(x, mem, mem, key_padding_mask=kpm_s, need_weights=False)[0]
    o["plain"] = m.mha(x, mem, mem, need_weights=False)[0]
    return o


# each part's inputs and outputs: one program per part (the kernel count of one program with
# both made its first step take a minute on lavapipe)
PARTS = {
    "mha": (tuple(SHAPES) + ("kpm", "kpm_s", "amask", "bmask", "causal"),
            ("sa", "sa_w", "causal", "hint", "masked", "masked_w", "kv", "kv_w", "unb", "unb_w", "nb", "plain")),
    "layers": (("x", "xb", "mem", "kpm", "kpm_s", "causal", "mmask"), ("enc1", "enc", "dec", "decs")),
}  # fmt: skip
DECLS = {k: aot.f32(*s) for k, s in SHAPES.items()}
DECLS.update(kpm=aot.i32(N, L), kpm_s=aot.i32(N, S), amask=aot.f32(L, L), bmask=aot.i32(N * H, L, S),
             causal=aot.i32(L, L), mmask=aot.f32(L, S))  # fmt: skip
DECLS.update({"ct_" + k: aot.f32(*s) for k, s in OUTS.items()})


def program(part, kernels):
    names, outs = PARTS[part]

    def loss(m, **b):
        total = 0.0
        for name, out in outputs(m, b, part).items():
            aot.capture(name, out)
            total = total + ops.sum(out * b["ct_" + name])
        return total

    inputs = {k: DECLS[k] for k in names + tuple("ct_" + o for o in outs)}
    infer = {"encode": aot.Infer(lambda m, x: m.enc_drop(x), inputs={"x": aot.f32(L, N, E)})} if part == "layers" else {}
    return aot.Program(
        f"nn_attention_{part}_{kernels}",
        model=Attn,
        # SGD: the key part of in_proj_bias has a zero gradient in exact arithmetic (softmax ignores a
        # per-row constant); Adam would blow its rounding noise up to +-lr steps
        train=aot.Train(loss, inputs=inputs, optimizer=aot.optim.SGD(lr=2e-3, momentum=0.5)),
        infer=infer,
        seed=6,
    )


class TorchAttn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        T = torch.nn
        self.sx, self.sxb, self.smem = (T.Parameter(torch.ones(SHAPES[k])) for k in ("x", "xb", "mem"))
        self.mha = T.MultiheadAttention(E, H)
        self.mha_kv = T.MultiheadAttention(E, H, kdim=6, vdim=5, batch_first=True)
        self.mha_nb = T.MultiheadAttention(E, H, bias=False)
        self.enc1 = T.TransformerEncoderLayer(E, H, dim_feedforward=16, dropout=0.0, activation="gelu",
                                              batch_first=True, norm_first=True)  # fmt: skip
        layer = T.TransformerEncoderLayer(E, H, dim_feedforward=12, dropout=0.0)
        self.enc = T.TransformerEncoder(layer, 2, norm=T.LayerNorm(E), enable_nested_tensor=False)
        self.dec = T.TransformerDecoderLayer(E, H, dim_feedforward=12, dropout=0.0)
        self.decs = T.TransformerDecoder(T.TransformerDecoderLayer(E, H, 12, 0.0, norm_first=True), 2)
        self.enc_drop = T.TransformerEncoderLayer(E, H, dim_feedforward=12, dropout=0.3)


def torch_outputs(t, b, part):
    x, xb, mem = b["x"] * t.sx, b["xb"] * t.sxb, b["mem"] * t.smem
    kpm, kpm_s, causal = (b[k].bool() for k in ("kpm", "kpm_s", "causal"))
    o = {}
    if part == "layers":
        o["enc1"] = t.enc1(xb, src_key_padding_mask=kpm)
        o["enc"] = t.enc(x, mask=causal, is_causal=True)
        o["dec"] = t.dec(x, mem, tgt_mask=causal, memory_key_padding_mask=kpm_s)
        o["decs"] = t.decs(x, mem, tgt_mask=causal.float().masked_fill(causal, float("-inf")), tgt_is_causal=True,
                           memory_mask=b["mmask"])  # fmt: skip
        return o
    xu = b["xu"]
    o["sa"], o["sa_w"] = t.mha(x, x, x)
    o["causal"] = t.mha(x, x, x, need_weights=False, attn_mask=causal, is_causal=True)[0]
    o["hint"] = o["causal"]
    o["masked"], o["masked_w"] = t.mha(x, x, x, key_padding_mask=kpm, attn_mask=b["amask"], average_attn_weights=False)
    o["kv"], o["kv_w"] = t.mha_kv(xb, b["kk"], b["vv"], attn_mask=b["bmask"].bool())
    o["unb"], o["unb_w"] = t.mha(xu, xu, xu)
    o["nb"] = t.mha_nb(x, mem, mem, key_padding_mask=kpm_s, need_weights=False)[0]
    o["plain"] = t.mha(x, mem, mem, need_weights=False)[0]
    return o


def torch_loss_of(part):
    def torch_loss(t, b):
        o = torch_outputs(t, b, part)
        return sum((v * b["ct_" + k]).sum() for k, v in o.items()), o

    return torch_loss


def batches(n, seed=0):
    r = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        b = {k: r.normal(size=s).astype(np.float32) for k, s in SHAPES.items()}
        kpm = np.zeros((N, L), np.int32)
        kpm[0, -1] = kpm[1, 1] = 1  # never a whole row: torch gives NaN there, aot an average
        kpm_s = np.zeros((N, S), np.int32)
        kpm_s[0, 0] = kpm_s[1, 3:] = 1
        bmask = (r.uniform(size=(N * H, L, S)) < 0.3).astype(np.int32)
        bmask[..., 2] = 0
        causal = np.triu(np.ones((L, L), np.int32), 1)
        amask = r.normal(size=(L, L)).astype(np.float32)
        mmask = r.normal(size=(L, S)).astype(np.float32)
        b.update(kpm=kpm, kpm_s=kpm_s, amask=amask, bmask=bmask, causal=causal, mmask=mmask)
        b.update({"ct_" + k: r.normal(size=s).astype(np.float32) for k, s in OUTS.items()})
        out.append(b)
    return out


# the layers (LayerNorm chains, merged dispatches) in the GPU set, the MHA variants in the CPU set;
# both reach the fused and the explicit path (tests/test_attention.py covers the kernel in both)
@pytest.fixture(scope="module", params=[("mha", "cpu"), ("layers", "gpu")], ids=lambda p: p[0])
def model(request):
    part, kernels = request.param
    m = aot.compile(program(part, kernels), kernels=kernels)
    m.part = part
    yield m
    m.close()


def test_attention_modules_train_like_torch(model):
    """Forward values (outputs and weights), gradients, 10 Adam steps: losses and parameters."""
    tmod = randomize(torch, TorchAttn(), seed=3)
    tmod.train()
    warnings.filterwarnings("ignore", "Support for mismatched key_padding_mask")  # i32 and f32 masks, as intended
    names, outs = PARTS[model.part]
    keep = set(names) | {"ct_" + o for o in outs}
    data = [{k: v for k, v in b.items() if k in keep} for b in batches(10)]
    train_side_by_side(torch, model, tmod, torch_loss_of(model.part), data, lr=2e-3, momentum=0.5)


def test_infer_entry_is_torch_eval_mode(model):
    """enc_drop has dropout=0.3: an infer entry is torch's .eval() (no dropout, same values)."""
    if model.part != "layers":
        pytest.skip("the layers' program has the infer entry")
    tmod = randomize(torch, TorchAttn(), seed=4).eval()
    model.load_state_dict(tmod.state_dict())
    x = np.random.default_rng(7).normal(size=(L, N, E)).astype(np.float32)
    with torch.no_grad():
        want = tmod.enc_drop(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(model.encode(x=x), want, rtol=1e-4, atol=1e-5)


def test_state_dict_names_and_layouts_are_torchs(model):
    assert sorted(model.state_dict()) == sorted(TorchAttn().state_dict())
    table = model.PROGRAM["torch"]
    assert table["mha.in_proj_W"] == ("mha.in_proj_weight", "MultiheadAttention", True)
    assert table["mha_kv.k_proj_W"] == ("mha_kv.k_proj_weight", "MultiheadAttention", True)
    assert table["enc.layers.1.linear1.W"] == ("enc.layers.1.linear1.weight", "Linear", True)
    assert model.params()["mha.in_proj_W"].shape == (E, 3 * E)


def test_fused_kernel_serves_maskless_calls():
    """need_weights=False without masks (is_causal included) runs ops.attention; weights, masks
    or dropout take the explicit path."""
    calls = {}
    for part in PARTS:
        g = trace_program(program(part, "trace")).graphs["train"]
        calls[part] = sorted(n.attrs["causal"] for n in g.nodes if n.op == "attention")
    # mha: the causal and hint calls, the plain cross-attention; layers: enc's and decs' two layers
    # each (the hint; enc1 and dec have key padding masks, dec's self-attention a mask without the
    # hint, decs' memory attention an f32 mask)
    assert calls == {"mha": [False, True, True], "layers": [True] * 4}


# ---- shapes and errors (tracing only) -------------------------------------------------------------


def _trace(make, fn, **inputs):
    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.m = make()

    prog = aot.Program("nn_attn_err", model=M, infer={"f": aot.Infer(lambda m, **kw: fn(m.m, **kw), inputs=inputs)})
    return trace_program(prog)


MHA = lambda: nn.MultiheadAttention(8, 2)  # noqa: E731


@pytest.mark.parametrize(
    "make, fn, inputs, match",
    [
        (lambda: nn.MultiheadAttention(8, 3), None, {}, "embed_dim 8 must be divisible by num_heads 3"),
        (lambda: nn.MultiheadAttention(8, 2, add_bias_kv=True), None, {}, "add_bias_kv"),
        (MHA, lambda m, x: m(x, x, x)[0], {"x": aot.f32(4, 2, 6)}, r"query must be f32 \[L, N, 8\]"),
        (MHA, lambda m, x, y: m(x, y, y)[0], {"x": aot.f32(4, 2, 8), "y": aot.f32(5, 3, 8)}, "key and value need the query's batch"),
        (MHA, lambda m, x, y: m(x, y, y)[0], {"x": aot.f32(4, 2, 8), "y": aot.f32(5, 8)}, "all be batched or all unbatched"),
        (MHA, lambda m, x, k: m(x, x, x, key_padding_mask=k)[0], {"x": aot.f32(4, 2, 8), "k": aot.i32(4, 2)},
         r"key_padding_mask: expected a mask of shape \[2, 4\]"),
        (MHA, lambda m, x, a: m(x, x, x, attn_mask=a)[0], {"x": aot.f32(4, 2, 8), "a": aot.f32(4, 5)},
         r"attn_mask: expected a mask of shape \[4, 4\] or \[4, 4, 4\]"),
        (lambda: nn.TransformerEncoderLayer(8, 2, activation="tanh"), None, {}, "activation must be 'relu', 'gelu'"),
        (lambda: nn.TransformerEncoder(nn.Linear(2, 2), 2), None, {}, "encoder_layer must be an nn.TransformerEncoderLayer"),
    ],
)
def test_bad_arguments_and_shapes_raise_shape_errors(make, fn, inputs, match):
    with pytest.raises(aot.ShapeError, match=match):  # fn None: the constructor refuses
        _trace(make, fn or (lambda m, x: x), **(inputs or {"x": aot.f32(1)}))


def test_dropout_takes_the_explicit_path_in_training_only():
    """With dropout, a training entry drops attention weights (explicit path, torch's order) and
    the feed-forward activations; an infer entry has no dropout and uses the fused kernel."""

    def f(m, x):
        return m.enc_drop(x)

    prog = aot.Program(
        "nn_attn_drop",
        model=Attn,
        train=aot.Train(lambda m, x: ops.sum(f(m, x)), inputs={"x": aot.f32(L, N, E)}, optimizer=None),
        infer={"f": aot.Infer(f, inputs={"x": aot.f32(L, N, E)})},
    )
    graphs = trace_program(prog).graphs
    train_ops = [n.op for n in graphs["train"].nodes]
    infer_ops = [n.op for n in graphs["f"].nodes]
    # weights [N, H, L, L], linear1's output, and after self-attention and the feed-forward
    assert sorted(n.attrs["shape"] for n in graphs["train"].nodes if n.op == "rand") == sorted(
        [(N, H, L, L), (L, N, 12), (L, N, E), (L, N, E)]
    )
    assert "attention" not in train_ops
    assert "rand" not in infer_ops and infer_ops.count("attention") == 1
