"""ops.attention (API.md §6): the fused kernels against the interpreter and PyTorch.

- One compiled program holds many configurations (odd T and head sizes, Tq != Tk both ways,
  causal or not, extra and broadcast leading dims, a given scale): its GPU outputs and the
  gradients of q, k and v against the float32 interpreter, and against PyTorch's
  `scaled_dot_product_attention` in float64 (forward and backward through the same cotangent).
- The interpreter's own formulas (float64) against PyTorch, for more shapes than the GPU runs.
- Composed with other ops: a fused qkv projection split by reshape/transpose views, layernorm
  and a loss, trained a few AdamW steps on the GPU against the same model in PyTorch.
- What the schedule makes of it: no T x T tensor anywhere, O and the logsumexp written by one
  kernel, WebGPU's workgroup limits, bit-identical repeated steps (no atomics).
- Argument errors name the problem and the user's line.
The op table (tests/op_cases.py, `attention.*`) adds finite differences and the batched GPU run.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import aot
from aot import attention_codegen, interp, nn, ops
from aot.attention_codegen import LANE_ROWS, LANES
from aot.errors import ShapeError
from aot.grad import append_grads
from aot.ir import Graph
from aot.pipeline import compile_program
from aot.trace import emit, tracing

from gpu_harness import assert_close, make_program, run_both

torch = pytest.importorskip("torch")

# name: (q shape, k shape, v shape, causal, scale)
CONFIGS = {
    "t1": ((2, 1, 4), (2, 1, 4), (2, 1, 4), True, None),
    "t3_d3_causal": ((2, 3, 3, 3), (2, 3, 3, 3), (2, 3, 3, 3), True, None),
    "t7_d5_dv1": ((3, 7, 5), (3, 7, 5), (3, 7, 1), False, None),
    "t17_d8_dv16_causal": ((2, 17, 8), (2, 17, 8), (2, 17, 16), True, None),
    "t33_d33_dv3": ((1, 33, 33), (1, 33, 33), (1, 33, 3), False, None),
    "t33_d16_causal": ((2, 33, 16), (2, 33, 16), (2, 33, 16), True, None),
    "d1_scale": ((2, 5, 1), (2, 6, 1), (2, 6, 2), False, 0.7),
    "tq5_tk9_causal": ((2, 5, 4), (2, 9, 4), (2, 9, 5), True, None),
    "tq9_tk4_causal": ((2, 9, 3), (2, 4, 3), (2, 4, 3), True, 0.3),
    "lead3": ((2, 2, 2, 3, 4), (2, 2, 2, 3, 4), (2, 2, 2, 3, 4), True, None),
    "bcast_kv": ((2, 3, 6, 4), (6, 4), (2, 1, 6, 3), True, None),
    "t70_rowblocks_causal": ((1, 70, 8), (1, 70, 8), (1, 70, 8), True, None),
    # whole 32-row tiles, Tq != Tk both ways with 32+ rows, broadcast batch dims, a 65-column head
    "t64_d64_causal": ((2, 64, 64), (2, 64, 64), (2, 64, 64), True, None),
    "tq40_tk70_causal_dv33": ((2, 40, 20), (2, 70, 20), (2, 70, 33), True, None),
    "tq70_tk40_causal_scale": ((1, 70, 12), (1, 40, 12), (1, 40, 7), True, 0.4),
    "bcast_kv_t48": ((2, 2, 48, 8), (48, 8), (2, 1, 48, 8), True, None),
    "t65_d65": ((1, 65, 65), (1, 65, 65), (1, 65, 4), False, None),
    # the GPU set's dk+dv kernel split over two invocations a row (head size over 32) with several
    # batch entries a workgroup
    "t9_d48_causal": ((3, 9, 48), (3, 9, 48), (3, 9, 48), True, None),
}


def _values(seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for name, (sq, sk, sv, _, _) in CONFIGS.items():
        for x, s in (("q", sq), ("k", sk), ("v", sv)):
            out[f"{name}_{x}"] = rng.normal(size=s).astype(np.float32)
    return out


def _body(m, feeds):
    return {
        name: ops.attention(getattr(m, f"{name}_q"), getattr(m, f"{name}_k"), getattr(m, f"{name}_v"), causal=c, scale=sc)
        for name, (_, _, _, c, sc) in CONFIGS.items()
    }


def torch_attention(q, k, v, causal, scale, ct):
    """PyTorch's fused attention in float64: (output, dq, dk, dv) for cotangent ct."""
    q, k, v = (torch.tensor(np.asarray(x, np.float64), requires_grad=True) for x in (q, k, v))
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    qe, ke, ve = (x.expand(lead + x.shape[-2:]) for x in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(qe, ke, ve, is_causal=causal, scale=scale)
    o.backward(torch.tensor(np.asarray(ct, np.float64)))
    return o.detach().numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()


@pytest.fixture(scope="module", params=["gpu", "subgroup", "cpu", "cpu_whole_rows"])
def gpu_run(request):
    """Every kernel set: the GPU's tiles in workgroup memory, the same with rows shared by the
    lanes of a subgroup (attention_lanes.wgsl.j2), the CPU adapters' row-at-a-time variants
    (codegen.CPU_HEADER), which read each row a vec4 a loop step, and those that read rows whole
    (a walk whose inner loops would pass lavapipe's loop limit: attention_codegen.LOOP_MAX)."""
    wgpu = pytest.importorskip("wgpu")
    if request.param == "subgroup" and "subgroup" not in wgpu.gpu.request_adapter_sync().features:
        pytest.skip("this adapter has no subgroup operations")
    params = _values()
    prog, inputs, _ = make_program("attention_configs", params, {}, _body)
    kernels = request.param.replace("_whole_rows", "")
    limit = attention_codegen.LOOP_MAX
    if request.param == "cpu_whole_rows":
        attention_codegen.LOOP_MAX = 0
    try:
        [(gpu, ref)], wgsl = run_both(prog, inputs, kernels=kernels)
    finally:
        attention_codegen.LOOP_MAX = limit
    walks = [v for k, v in wgsl.items() if "attention" in k and "CPU variant" in v and "for (var j" in v]
    assert all(("let kt0 = " in v or "let qt0 = " in v) == (request.param == "cpu_whole_rows") for v in walks)
    assert walks or not request.param.startswith("cpu")
    return params, inputs, gpu, ref, wgsl, kernels


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CONFIGS))
def test_gpu_matches_interpreter_and_torch(gpu_run, name):
    params, inputs, gpu, ref, *_ = gpu_run
    sq, sk, sv, causal, scale = CONFIGS[name]
    assert_close(gpu.captures[name], ref.captures[name], f"{name}: output")
    for x in "qkv":
        assert_close(gpu.grads[f"{name}_{x}"], ref.grads[f"{name}_{x}"], f"{name}: gradient of {x}", rtol=1e-4, atol=2e-5)
    o, dq, dk, dv = torch_attention(params[f"{name}_q"], params[f"{name}_k"], params[f"{name}_v"], causal, scale, inputs[f"{name}_ct"])
    assert_close(gpu.captures[name], o.astype(np.float32), f"{name}: output vs torch", rtol=1e-4, atol=1e-5)
    for x, want in zip("qkv", (dq, dk, dv)):
        assert_close(gpu.grads[f"{name}_{x}"], want.astype(np.float32), f"{name}: d{x} vs torch", rtol=1e-4, atol=5e-5)


@pytest.mark.gpu
def test_kernels_stay_in_webgpu_limits_and_read_in_bounds(gpu_run):
    *_, wgsl, kernel_set = gpu_run
    att = {k: v for k, v in wgsl.items() if "attention" in k}
    single = [k for k, v in att.items() if "independent kernels in one dispatch" not in v]  # merge.py's aside
    assert len(single) == 3 * len(CONFIGS)  # forward (O and lse together), dq, dk with dv per configuration
    for kname, src in att.items():
        size = int(re.search(r"@workgroup_size\((\d+)\)", src).group(1))
        assert size <= 256, kname
        words = sum(int(n) * (4 if t.startswith("vec4") else 1) for t, n in re.findall(r"var<workgroup> \w+: array<(vec4<f32>|f32), (\d+)>", src))
        assert 4 * words <= 16384, f"{kname}: {4 * words} bytes of workgroup memory"
        assert "atomic" not in src
        if "CPU variant" in src:
            assert "var<workgroup>" not in src and "Barrier" not in src, kname
    # the CPU set (one dispatch per kernel) runs a CPU variant of every attention kernel
    assert sum("CPU variant" in src for src in att.values()) in (0, len(single))
    # the subgroup set runs its variant wherever both head sizes split over a group's lanes and
    # the workgroup's rows over its groups (attention_codegen.LANES, LANE_ROWS); the other sets
    # never use subgroups
    lanes = [k for k in single if "subgroupShuffleXor" in att[k]]
    assert all("subgroup variant" in att[k] for k in lanes)
    want = 0
    for sq, sk, sv, *_ in CONFIGS.values():
        if -(-sq[-1] // 4) % LANES == 0 and -(-sv[-1] // 4) % LANES == 0:  # vec4s of q/k and of v
            # forward and dq own query rows, dk with dv key rows (a power of two >= LANE_ROWS)
            want += 2 * (2 * sq[-2] > LANE_ROWS) + (2 * sk[-2] > LANE_ROWS)
    assert len(lanes) == (want if kernel_set == "subgroup" else 0), sorted(lanes)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq,tk,d,dv", [(1, 1, 1, 1), (3, 3, 5, 2), (7, 4, 3, 6), (4, 9, 8, 8), (17, 17, 33, 5)])
def test_interpreter_matches_torch_float64(tq, tk, d, dv, causal):
    """The primitives' NumPy semantics (forward and the three gradient ops through the VJP)."""
    rng = np.random.default_rng(tq * 100 + tk)
    q, k, v = rng.normal(size=(2, tq, d)), rng.normal(size=(2, tk, d)), rng.normal(size=(2, tk, dv))
    ct = rng.normal(size=(2, tq, dv))
    g = Graph("attention_f64", meta={"kind": "train"})
    with tracing(g):
        xs = [emit("input", (), name=n, shape=x.shape, dtype="f32") for n, x in zip("qkv", (q, k, v))]
        cti = emit("input", (), name="ct", shape=ct.shape, dtype="f32")
        o = ops.attention(*xs, causal=causal)
        grads = append_grads(g, ops.sum(o * cti), xs)
    env = interp.run(g, {"q": q, "k": k, "v": v, "ct": ct}, np.float64)
    want = torch_attention(q, k, v, causal, None, ct)
    for got, w, what in zip([env[id(o)]] + [env[id(t)] for t in grads], want, ("out", "dq", "dk", "dv")):
        np.testing.assert_allclose(got, w, rtol=1e-10, atol=1e-12, err_msg=what)


# ---- composed with other ops, trained against PyTorch ---------------------------------------------

D, HEADS, T, B = 12, 3, 7, 4  # head size 4, odd T


class Attn(aot.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(D)
        self.qkv = nn.Linear(D, 3 * D)
        self.o = nn.Linear(D, D, bias=False)
        self.ln_out = nn.LayerNorm(D)


def _forward(m, x):
    # one projection, split into q, k, v by views: [B, T, 3, H, dh] -> [3, B, H, T, dh]
    h = m.qkv(m.ln(x))
    qkv = ops.transpose(ops.reshape(h, (B, T, 3, HEADS, D // HEADS)), (2, 0, 3, 1, 4))
    q, k, v = (ops.reshape(ops.narrow(qkv, 0, i, 1), (B, HEADS, T, D // HEADS)) for i in range(3))
    att = ops.attention(q, k, v, causal=True)
    return m.ln_out(x + m.o(nn.merge_heads(att)))


def _loss(m, x, y):
    return ops.mean(ops.square(_forward(m, x) - y))


TRAIN = aot.Program(
    "attention_train",
    model=Attn,
    train=aot.Train(_loss, inputs={"x": aot.f32(B, T, D), "y": aot.f32(B, T, D)}, optimizer=aot.optim.AdamW(lr=1e-2, weight_decay=0.01)),
    seed=3,
)


class TorchAttn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(D)
        self.qkv = torch.nn.Linear(D, 3 * D)
        self.o = torch.nn.Linear(D, D, bias=False)
        self.ln_out = torch.nn.LayerNorm(D)

    def forward(self, x):
        h = self.qkv(self.ln(x)).view(B, T, 3, HEADS, D // HEADS).permute(2, 0, 3, 1, 4)
        att = torch.nn.functional.scaled_dot_product_attention(h[0], h[1], h[2], is_causal=True)
        return self.ln_out(x + self.o(att.transpose(1, 2).reshape(B, T, D)))


@pytest.mark.gpu
def test_composed_model_trains_like_torch():
    pytest.importorskip("wgpu")
    model = aot.compile(TRAIN)
    try:
        p0 = model.params()
        tm = TorchAttn().double()
        with torch.no_grad():
            for name, p in tm.named_parameters():
                mod, leaf = name.split(".")
                v = p0[f"{mod}.{ {'weight': 'g' if mod.startswith('ln') else 'W', 'bias': 'b'}[leaf]}"]
                p.copy_(torch.tensor(v.T if leaf == "weight" and not mod.startswith("ln") else v, dtype=torch.float64))
        decay = [p for n, p in tm.named_parameters() if n.endswith("weight") and not n.startswith("ln")]
        rest = [p for n, p in tm.named_parameters() if not (n.endswith("weight") and not n.startswith("ln"))]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}], lr=1e-2)
        rng = np.random.default_rng(0)
        for step in range(5):
            x, y = rng.normal(size=(B, T, D)).astype(np.float32), rng.normal(size=(B, T, D)).astype(np.float32)
            got = model.step(x=x, y=y)
            opt.zero_grad()
            loss = ((tm(torch.tensor(x, dtype=torch.float64)) - torch.tensor(y, dtype=torch.float64)) ** 2).mean()
            loss.backward()
            opt.step()
            assert abs(got - loss.item()) < 1e-4 * abs(loss.item()), f"step {step}: {got} vs torch {loss.item()}"
        want = tm.state_dict()
        for name, v in model.params().items():
            mod, leaf = name.split(".")
            tname = f"{mod}.{ {'g': 'weight', 'W': 'weight', 'b': 'bias'}[leaf]}"
            w = want[tname].numpy()
            np.testing.assert_allclose(v, w.T if leaf == "W" else w, rtol=1e-3, atol=1e-4, err_msg=name)
    finally:
        model.close()


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["gpu", "subgroup", "cpu"])
def test_gradients_alone_have_kernels_of_their_own(kernels):
    """Where only v, only k or only q is trained, the kernels that nothing else reads run alone:
    dv; dk with delta (the dq kernel's sibling, here with no dq to share with); dq, computing
    delta for itself."""
    wgpu = pytest.importorskip("wgpu")
    if kernels == "subgroup" and "subgroup" not in wgpu.gpu.request_adapter_sync().features:
        pytest.skip("this adapter has no subgroup operations")
    rng = np.random.default_rng(3)
    shape = (2, 2, 40, 16)  # head size 16: four vec4s, so the subgroup set runs its variant
    params = {"v1": rng.normal(size=shape), "k2": rng.normal(size=shape), "q3": rng.normal(size=shape)}
    inputs = {name: rng.normal(size=shape) for name in ("q1", "k1", "q2", "v2", "k3", "v3")}

    def body(m, f):
        return {
            "o1": ops.attention(f["q1"], f["k1"], m.v1, causal=True),
            "o2": ops.attention(f["q2"], m.k2, f["v2"]),
            "o3": ops.attention(m.q3, f["k3"], f["v3"], causal=True),
        }

    prog, inputs, _ = make_program("attention_alone", params, inputs, body)
    [(gpu, ref)], wgsl = run_both(prog, inputs, kernels=kernels)
    single = [k for k, v in wgsl.items() if "attention" in k and "independent kernels in one dispatch" not in v]
    att = sorted(re.sub(r"^train_\d+_", "", k) for k in single)
    assert att == ["attention"] * 3 + ["attention_delta", "attention_dk", "attention_dq", "attention_dv"], att
    # output: its operands, causal, the trained one and its place in torch_attention's (o, dq, dk, dv)
    cases = {"o1": ("q1", "k1", "v1", True, "v1", 3), "o2": ("q2", "k2", "v2", False, "k2", 2), "o3": ("q3", "k3", "v3", True, "q3", 1)}
    for name, (q, k, v, causal, pn, at) in cases.items():
        assert_close(gpu.grads[pn], ref.grads[pn], f"gradient of {pn}", rtol=1e-4, atol=2e-5)
        vals = [params[n] if n in params else inputs[n] for n in (q, k, v)]
        want = torch_attention(*vals, causal, None, inputs[f"{name}_ct"])[at]
        assert_close(gpu.grads[pn], want.astype(np.float32), f"d{pn} vs torch", rtol=1e-4, atol=5e-5)


# ---- the schedule ------------------------------------------------------------------------------


def test_no_t_by_t_tensor_is_stored_and_forward_writes_o_and_lse_together_dk_dv_too():
    c = compile_program(TRAIN)
    s, p = c.schedules["train"], c.plans["train"]
    for t in s.owners:
        assert not (t.ndim >= 2 and t.shape[-2:] == (T, T)), f"a [.., T, T] tensor is stored: {t.type_str()} from {t.node.op}"
    att = [k for k in s.kernels if k.kind == "attention"]
    assert sorted(sorted(n.node.op for n in k.group + [k]) for k in att) == [
        ["attention", "attention_lse"], ["attention_delta", "attention_dq"], ["attention_dk", "attention_dv"]
    ]
    fwd = next(k for k in att if k.node.op == "attention")
    assert {t.node.op for t in fwd.outs} == {"attention", "attention_lse"}
    keys = next(k for k in att if k.node.op == "attention_dk")
    assert {t.node.op for t in keys.outs} == {"attention_dk", "attention_dv"}
    # the infer graph needs no logsumexp
    pred = aot.Program("attention_pred", model=Attn, infer={"f": aot.Infer(_forward, inputs={"x": aot.f32(B, T, D)})})
    ks = compile_program(pred).schedules["f"].kernels
    assert [sorted(n.node.op for n in k.group + [k]) for k in ks if k.kind == "attention"] == [["attention"]]


@pytest.mark.gpu
def test_repeated_steps_are_bit_identical():
    rng = np.random.default_rng(5)
    params = {"q": rng.normal(size=(2, 3, 33, 8)), "k": rng.normal(size=(2, 3, 33, 8)), "v": rng.normal(size=(2, 3, 33, 8))}
    prog, inputs, _ = make_program("attention_repeat", params, {}, lambda m, f: {"o": ops.attention(m.q, m.k, m.v, causal=True)})
    pairs, _ = run_both(prog, inputs, steps=2)
    (a, _), (b, _) = pairs
    for n in a.grads:
        np.testing.assert_array_equal(a.grads[n], b.grads[n], err_msg=n)
    np.testing.assert_array_equal(a.captures["o"], b.captures["o"])


# ---- argument errors ------------------------------------------------------------------------------


def _trace_error(fn):
    g = Graph("errors")
    with tracing(g):
        q = emit("input", (), name="q", shape=(2, 5, 4), dtype="f32")
        with pytest.raises(ShapeError) as e:
            fn(q)
    return e.value


@pytest.mark.parametrize(
    "fn,message",
    [
        (lambda q: ops.attention(q, ops.reshape(q, (2, 4, 5)), q), "same head size"),
        (lambda q: ops.attention(q, q, ops.narrow(q, 1, 0, 3)), "same number of keys"),
        (lambda q: ops.attention(ops.reshape(q, (40,)), q, q), "at least 2 dims"),
        (lambda q: ops.attention(q, ops.reshape(q, (5, 2, 4)), ops.reshape(q, (5, 2, 4))), "do not broadcast"),
        (lambda q: ops.attention(q, q, q, causal=1), "causal must be True or False"),
        (lambda q: ops.attention(q, q, q, scale=math.inf), "scale must be a finite number"),
        (lambda q: ops.attention(ops.cast(q, "i32"), q, q), "f32"),
    ],
)
def test_errors_name_the_problem_and_the_user_line(fn, message):
    e = _trace_error(fn)
    assert message in str(e) and "attention" in str(e)
    assert "test_attention.py" in str(e), str(e)


def test_head_size_over_the_kernel_limit_is_refused():
    g = Graph("errors")
    with tracing(g):
        q = emit("input", (), name="q", shape=(3, 300), dtype="f32")
        with pytest.raises(ShapeError, match="larger than the fused kernel"):
            ops.attention(q, q, q)
