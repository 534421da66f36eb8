"""aot.nn's recurrent layers against torch.nn with the same weights.

One Program holds every case (so each kernel set compiles once): each case is a torch.nn
recurrent module and its aot twin, fed with inputs (and initial states) that are parameters
themselves, so `grads()` holds the gradients of the inputs as well as the weights. The loss is
sum over outputs of <output, fixed cotangent>. The torch twin has the same attribute names, so
its state_dict loads into the package unchanged (the interop mapping under test) and back.
Checked: outputs and final states, every gradient, and 10 Adam steps (per-step losses, final
parameters) in float64 through the interpreter and in float32 on the GPU with both kernel sets;
then a small LSTM language model (embedding -> LSTM -> linear, cross_entropy) trains step for
step like its torch twin.
"""

from __future__ import annotations

import re
import runpy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import aot
from aot import interp, nn, ops
from aot.errors import ShapeError
from aot.frontend import trace_program
from aot.passes import dce
from aot.runtime.rng import step_seed
from aot.runtime.schedules import optimizer_scalars

torch = pytest.importorskip("torch")

STEPS, LR = 10, 1e-2


@dataclass
class Case:
    name: str
    make: object  # (nn namespace) -> module: the same constructor call builds both twins
    inputs: dict  # input name -> shape (fed as parameters)
    call: object  # (module, **inputs) -> list of output tensors


def _flat(res):
    out = []
    for r in res if isinstance(res, (tuple, list)) else (res,):
        out += _flat(r) if isinstance(r, (tuple, list)) else [r]
    return out


CASES = [
    Case(
        "lstm2bi",  # two layers, both directions, batch first, given (h_0, c_0)
        lambda nn: nn.LSTM(3, 4, num_layers=2, bidirectional=True, batch_first=True),
        {"x": (2, 4, 3), "h0": (4, 2, 4), "c0": (4, 2, 4)},
        lambda m, x, h0, c0: _flat(m(x, (h0, c0))),
    ),
    Case("lstm", lambda nn: nn.LSTM(3, 5), {"x": (5, 2, 3)}, lambda m, x: _flat(m(x))),
    Case(  # unbatched input and state, no biases
        "lstm_nb",
        lambda nn: nn.LSTM(3, 4, bias=False),
        {"x": (3, 3), "h0": (1, 4), "c0": (1, 4)},
        lambda m, x, h0, c0: _flat(m(x, (h0, c0))),
    ),
    Case("gru2bi", lambda nn: nn.GRU(3, 4, num_layers=2, bidirectional=True), {"x": (4, 2, 3), "h0": (4, 2, 4)}, lambda m, x, h0: _flat(m(x, h0))),
    Case("gru", lambda nn: nn.GRU(3, 4, batch_first=True), {"x": (2, 4, 3)}, lambda m, x: _flat(m(x))),
    Case(
        "rnn_relu",
        lambda nn: nn.RNN(3, 4, num_layers=2, nonlinearity="relu", batch_first=True),
        {"x": (2, 4, 3), "h0": (2, 2, 4)},
        lambda m, x, h0: _flat(m(x, h0)),
    ),
    Case("rnn_bi", lambda nn: nn.RNN(3, 4, bidirectional=True, bias=False), {"x": (4, 2, 3)}, lambda m, x: _flat(m(x))),
    Case("lstmcell", lambda nn: nn.LSTMCell(3, 4), {"x": (2, 3), "h": (2, 4), "c": (2, 4)}, lambda m, x, h, c: _flat(m(x, (h, c)))),
    Case("lstmcell0", lambda nn: nn.LSTMCell(3, 4), {"x": (3,)}, lambda m, x: _flat(m(x))),
    Case("grucell", lambda nn: nn.GRUCell(3, 4), {"x": (2, 3), "h": (2, 4)}, lambda m, x, h: [m(x, h)]),
    Case("grucell0", lambda nn: nn.GRUCell(3, 4, bias=False), {"x": (2, 3)}, lambda m, x: [m(x)]),
    Case("rnncell", lambda nn: nn.RNNCell(3, 4, nonlinearity="relu"), {"x": (3,), "h": (4,)}, lambda m, x, h: [m(x, h)]),
    Case("rnncell0", lambda nn: nn.RNNCell(3, 4), {"x": (2, 3)}, lambda m, x: [m(x)]),
]


def _values(seed=0):
    """Initial weights (torch's own init), inputs and cotangents, float32, by aot/torch name."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    params, cts, mods = {}, {}, {}
    for c in CASES:
        mods[c.name] = c.make(torch.nn)
        for k, v in mods[c.name].state_dict().items():
            params[f"{c.name}.{k}"] = v.numpy().astype(np.float32)
        for k, shape in c.inputs.items():
            params[f"{c.name}_{k}"] = rng.normal(size=shape).astype(np.float32)
        args = {k: torch.zeros(s) for k, s in c.inputs.items()}
        for j, o in enumerate(c.call(mods[c.name], **args)):
            cts[f"{c.name}_ct{j}"] = rng.normal(size=tuple(o.shape)).astype(np.float32)
    return params, cts


PARAMS, CTS = _values()


class Harness(aot.Module):
    def __init__(self):
        super().__init__()
        for c in CASES:
            setattr(self, c.name, c.make(nn))
            for k in c.inputs:
                name = f"{c.name}_{k}"
                setattr(self, name, self.param(PARAMS[name].shape, init=aot.init.literal(PARAMS[name])))


def harness_loss(m, **cts):
    total = 0.0
    for c in CASES:
        outs = c.call(getattr(m, c.name), **{k: getattr(m, f"{c.name}_{k}") for k in c.inputs})
        for j, o in enumerate(outs):
            total = total + ops.sum(aot.capture(f"{c.name}_o{j}", o) * cts[f"{c.name}_ct{j}"])
    return total


def make_program(name="rnn_cases"):
    specs = {k: aot.f32(*v.shape) for k, v in CTS.items()}
    return aot.Program(name, model=Harness, train=aot.Train(harness_loss, inputs=specs, optimizer=aot.optim.Adam(LR)), seed=0)


class TorchHarness(torch.nn.Module):
    def __init__(self, dtype):
        super().__init__()
        for c in CASES:
            setattr(self, c.name, c.make(torch.nn))
            for k in c.inputs:
                setattr(self, f"{c.name}_{k}", torch.nn.Parameter(torch.zeros(c.inputs[k])))
        self.load_state_dict({k: torch.from_numpy(v) for k, v in PARAMS.items()})
        self.to(dtype)

    def outputs(self):
        out = {}
        for c in CASES:
            res = c.call(getattr(self, c.name), **{k: getattr(self, f"{c.name}_{k}") for k in c.inputs})
            out.update({f"{c.name}_o{j}": o for j, o in enumerate(res)})
        return out

    def loss(self, outs):
        return sum((o * torch.from_numpy(CTS[n.replace("_o", "_ct")]).to(o.dtype)).sum() for n, o in outs.items())


def torch_run(dtype):
    """(outputs and grads of step 1, per-step losses, final params) of the torch twin."""
    m = TorchHarness(dtype)
    opt = torch.optim.Adam(m.parameters(), lr=LR)
    losses = []
    for t in range(STEPS):
        opt.zero_grad()
        outs = m.outputs()
        loss = m.loss(outs)
        loss.backward()
        if t == 0:
            first = {n: o.detach().numpy().copy() for n, o in outs.items()}
            grads = {n: p.grad.numpy().copy() for n, p in m.named_parameters()}
        losses.append(loss.item())
        opt.step()
    return first, grads, np.array(losses), {n: p.detach().numpy().copy() for n, p in m.named_parameters()}


@pytest.fixture(scope="module")
def torch64():
    return torch_run(torch.float64)


@pytest.fixture(scope="module")
def torch32():
    return torch_run(torch.float32)


def test_param_names_match_torch():
    traced = trace_program(make_program())
    names = [p.name for p in traced.params]
    want = list(TorchHarness(torch.float32).state_dict())
    assert sorted(names) == sorted(want)
    for c in CASES:  # torch's declaration order within each module
        mine = [n for n in names if n.startswith(c.name + ".")]
        assert mine == [n for n in want if n.startswith(c.name + ".")]


@pytest.mark.parametrize("lstm", ["fused", "composed"])
def test_interpreter_float64(torch64, lstm, monkeypatch):
    """Both forms of an LSTM: ops.lstm_seq, and the per-step ops where that kernel does not hold
    the layer (aot.ops.recurrent.fits: patched here to hold nothing)."""
    if lstm == "composed":
        import aot.ops.recurrent as rec

        monkeypatch.setattr(rec, "MAX_HIDDEN", 0)
    traced = trace_program(make_program())
    assert any(n.op == "lstm_seq" for n in traced.graphs["train"].nodes) == (lstm == "fused")
    ref = interp.Reference(traced, dtype=np.float64)
    ref.params = {k: v.astype(np.float64) for k, v in PARAMS.items()}
    first, grads, losses, final = torch64
    g = traced.graphs["train"]
    leaves = dict(CTS, **ref.params, **ref.state, **optimizer_scalars(ref.opt.spec(), LR, 1), _rng=np.int32(step_seed(0, 1)))
    env = interp.run(g, {k: np.asarray(v, dtype=np.float64) if np.asarray(v).dtype.kind == "f" else v for k, v in leaves.items()},
                     np.float64)
    for n, want in first.items():
        np.testing.assert_allclose(env[id(g.captures[n])], want, rtol=1e-10, atol=1e-12, err_msg=n)
    got_losses, grads1 = [], None
    for _ in range(STEPS):
        got_losses.append(ref.step(**CTS))
        grads1 = grads1 or dict(ref.last_grads)
    # the update's constants (Adam's betas) are stored as f32 even in a float64 run: 1e-7 relative
    np.testing.assert_allclose(got_losses, losses, rtol=1e-6, err_msg="losses")
    for n, want in grads.items():
        np.testing.assert_allclose(grads1[n], want, rtol=1e-9, atol=1e-12, err_msg=f"grad {n}")
    for n, want in final.items():
        np.testing.assert_allclose(ref.params[n], want, rtol=1e-6, atol=1e-7, err_msg=f"param {n}")


@pytest.fixture(scope="module", params=["gpu", "cpu"])
def gpu_run(request):
    model = aot.compile(make_program(f"rnn_cases_{request.param}"), kernels=request.param)
    try:
        sd = TorchHarness(torch.float32).state_dict()
        model.load_state_dict(sd)
        back = model.state_dict()
        assert set(back) == set(sd)
        for k, v in sd.items():  # torch names and layouts both ways, bit for bit
            np.testing.assert_array_equal(back[k], v.numpy(), err_msg=k)
        res = model.step(**CTS, captures=True)
        first, grads = dict(res.captures), model.grads()
        losses = [res.loss] + [model.step(**CTS) for _ in range(STEPS - 1)]
        yield first, grads, np.array(losses), model.state_dict()
    finally:
        model.close()


@pytest.mark.gpu
def test_gpu_float32(gpu_run, torch32):
    got, want = gpu_run, torch32
    for n, w in want[0].items():
        np.testing.assert_allclose(got[0][n], w, rtol=1e-4, atol=1e-5, err_msg=f"output {n}")
    for n, w in want[1].items():
        np.testing.assert_allclose(got[1][n], w, rtol=1e-4, atol=1e-5, err_msg=f"grad {n}")
    np.testing.assert_allclose(got[2], want[2], rtol=2e-5, err_msg="losses")
    for n, w in want[3].items():
        np.testing.assert_allclose(got[3][n], w, rtol=2e-4, atol=2e-5, err_msg=f"param {n}")


def _trace_call(make, shape, call):
    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.rnn = make()

    def loss(m, x):
        return ops.sum(_flat(call(m.rnn, x))[0])

    return trace_program(aot.Program("bad", model=M, train=aot.Train(loss, inputs={"x": aot.f32(*shape)}, optimizer=None)))


def test_errors_name_the_problem():
    with pytest.raises(ShapeError, match=r"LSTM: expects input \[T, B, 3\]"):
        _trace_call(lambda: nn.LSTM(3, 4), (5, 2, 4), lambda m, x: m(x))
    with pytest.raises(ShapeError, match=r"h_0 must have shape \[2, 2, 4\]"):
        _trace_call(lambda: nn.LSTM(3, 4, num_layers=2), (5, 2, 3), lambda m, x: m(x, (ops.sum(x) * ops.reshape(x, (5, 2, 3)), x)))
    with pytest.raises(ShapeError, match="hx must be a tuple"):
        _trace_call(lambda: nn.LSTM(3, 4), (5, 2, 3), lambda m, x: m(x, x))
    with pytest.raises(ShapeError, match=r"GRUCell: hx must have shape \[2, 4\]"):
        _trace_call(lambda: nn.GRUCell(3, 4), (2, 3), lambda m, x: m(x, x))
    with pytest.raises(ShapeError, match=r"RNNCell: expects input \[B, 3\]"):
        _trace_call(lambda: nn.RNNCell(3, 4), (2, 5), lambda m, x: m(x))
    with pytest.raises(ValueError, match="dropout"):
        nn.LSTM(3, 4, dropout=1.0)
    with pytest.raises(ValueError, match="nonlinearity"):
        nn.RNN(3, 4, nonlinearity="sigmoid")


# ---- examples/lstm_lm.py, step for step against its torch twin ---------------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.gpu
def test_lstm_language_model_trains_like_torch():
    """Embedding -> LSTM -> Linear, masked cross_entropy, Adam with clipping: the example's program
    (at batch 4) and its twin from the same weights (the twin's state_dict, loaded as it is)."""
    lm = runpy.run_path(str(EXAMPLES / "lstm_lm.py"))
    twin = runpy.run_path(str(EXAMPLES / "lstm_lm_torch.py"))
    torch.manual_seed(1)
    tm = twin["CharLSTM"]()
    sd = {k: v.detach().clone() for k, v in tm.state_dict().items()}
    rng = np.random.default_rng(5)
    train, _ = lm["names_data"].split_names()
    batches = [lm["batch"](rng, train, size=4) for _ in range(STEPS)]
    opt = torch.optim.Adam(tm.parameters(), lr=1e-2)
    want = []
    for b in batches:
        opt.zero_grad()
        loss = twin["loss"](tm, *(torch.from_numpy(b[k]) for k in ("tokens", "targets", "mask")))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
        opt.step()
        want.append(loss.item())
    model = aot.compile(lm["make_program"]("lstm_lm_test", b=4))
    try:
        model.load_state_dict(sd)
        got = [model.step(**b) for b in batches]
        final = model.state_dict()
        back = twin["from_aot"](model.params()).state_dict()  # the twin's own mapping, for bench.py
    finally:
        model.close()
    np.testing.assert_allclose(got, want, rtol=2e-5, err_msg="per-step losses")
    for k, v in tm.state_dict().items():
        np.testing.assert_allclose(final[k], v.numpy(), rtol=2e-4, atol=2e-5, err_msg=k)
        np.testing.assert_array_equal(back[k].numpy(), final[k], err_msg=k)


def test_dropout_between_layers_in_training_entries_only():
    """Dropout masks come from aot's own random streams (no torch parity possible): a training
    entry draws one mask per layer boundary; an infer entry is torch's eval() output."""
    torch.manual_seed(2)
    tm = torch.nn.LSTM(3, 4, num_layers=3, dropout=0.5).double().eval()

    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(3, 4, num_layers=3, dropout=0.5)

    def loss(m, x):
        return ops.sum(m.lstm(x)[0])

    program = aot.Program("rnn_drop", model=M, train=aot.Train(loss, inputs={"x": aot.f32(5, 2, 3)}, optimizer=None),
                          infer={"predict": aot.Infer(lambda m, x: m.lstm(x)[0], inputs={"x": aot.f32(5, 2, 3)})})
    traced = trace_program(program)
    assert sum(n.op == "rand" for n in traced.graphs["train"].nodes) == 2
    assert not any(n.op == "rand" for n in traced.graphs["predict"].nodes)
    ref = interp.Reference(traced, dtype=np.float64)
    ref.params = {f"lstm.{k}": v.detach().numpy() for k, v in tm.state_dict().items()}
    x = np.random.default_rng(3).normal(size=(5, 2, 3))
    np.testing.assert_allclose(ref.predict(x=x), tm(torch.from_numpy(x))[0].detach().numpy(), rtol=1e-10, atol=1e-12)


# ---- the compiler rules the layers rely on (aot/grad.py, aot/schedule.py), on their own ---------


def test_shared_weight_and_narrow_gradients_match_torch():
    """sum_parts: a weight read by several matmuls (2-D and batched rows, with a plain use mixed
    in, and transposed uses) gets one matmul over the stacked rows; narrows of one tensor tile
    into a concat (adjacent pieces, gaps, an overlapping piece, another axis). float64."""
    rng = np.random.default_rng(7)
    vals = {"w": rng.normal(size=(4, 5)), "u": rng.normal(size=(5, 4)), "v": rng.normal(size=(10, 3)),
            "x1": rng.normal(size=(3, 4)), "x2": rng.normal(size=(2, 4)), "x3": rng.normal(size=(2, 3, 4))}

    def f(F, mm, t, narrow, w, u, v, x1, x2, x3):
        y = F.sum(mm(x1, w) ** 2) + F.sum(mm(x2, w) * 3.0) + F.sum(F.tanh(mm(x3, w))) + F.sum(w * w)
        y = y + F.sum(mm(x1, t(u)) ** 2) + F.sum(F.sin(mm(x2, t(u))))  # a weight in torch's layout
        pieces = [narrow(v, 0, 0, 2), narrow(v, 0, 2, 3), narrow(v, 0, 7, 2), narrow(v, 0, 1, 3), narrow(v, 1, 0, 2)]
        for k, p in enumerate(pieces):
            y = y + F.sum(F.sin(p * (k + 1.0)))
        return y

    class P(aot.Module):
        def __init__(self):
            super().__init__()
            for k, a in vals.items():
                setattr(self, k, self.param(a.shape, init=aot.init.literal(a)))

    def loss(m):
        return f(ops, ops.matmul, lambda a: ops.transpose(a, (1, 0)), ops.narrow, *(getattr(m, k) for k in vals))

    traced = trace_program(aot.Program("sum_parts", model=P, train=aot.Train(loss, inputs={}, optimizer=None)))
    g = dce(traced.graphs["train"])
    mms = [n for n in g.nodes if n.op == "matmul" and n.out.shape == (4, 5)]
    assert len(mms) == 3 and sum(n.inputs[1].node.op == "concat" for n in mms) == 1  # w: one for 3 uses; u: 2
    ref = interp.Reference(traced, dtype=np.float64)
    ref.params = dict(vals)
    ref.step()
    ts = {k: torch.tensor(a, requires_grad=True) for k, a in vals.items()}
    f(torch, torch.matmul, lambda a: a.T, torch.narrow, *ts.values()).backward()
    for k, t in ts.items():
        np.testing.assert_allclose(ref.last_grads[k], t.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=k)


def _lstm_count_program(t):
    from aot.pipeline import compile_program

    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(3, 8)

    def loss(m, x, y):
        return ops.mean(ops.square(m.rnn(x)[0] - y))

    return compile_program(aot.Program("lstm_count", model=M, train=aot.Train(
        loss, inputs={"x": aot.f32(t, 2, 3), "y": aot.f32(t, 2, 8)}, optimizer=aot.optim.Adam(1e-3)),
        infer={"predict": aot.Infer(lambda m, x: m.rnn(x)[0], inputs={"x": aot.f32(t, 2, 3)})}))


def test_lstm_is_one_kernel_each_way():
    """An LSTM direction runs as one kernel forward (ops.lstm_seq: every step) and one backward
    (lstm_seq_grad), whatever the sequence length: the kernel count does not grow with T."""
    counts = {}
    for t in (4, 8):
        c = _lstm_count_program(t)
        names = {e: [k.name for k in ks] for e, ks in c.kernels.items()}
        for e in names:
            assert sum("lstm_seq" in n and "grad" not in n for n in names[e]) == 1, names[e]
        assert sum("lstm_seq_grad" in n for n in names["train"]) == 1, names["train"]
        # projection, W_hh^T copied row-major (OpDef.contiguous), lstm_seq, and the output copied
        # out of Y's h lanes
        assert len(names["predict"]) == 4, names["predict"]
        counts[t] = len(names["train"])
    assert counts[4] == counts[8] <= 13, counts


def test_lstm_beyond_the_fused_kernel_is_two_kernels_a_step(monkeypatch):
    """Where the fused kernel does not hold the layer (H over MAX_HIDDEN), nn.LSTM composes plain
    ops: per time step the h @ W_hh matmul (input projection and bias in its epilogue) and one
    kernel of gate math each way, and nothing copies the stacked states or gate gradients
    (concats of placed pieces are views)."""
    import aot.ops.recurrent as rec

    monkeypatch.setattr(rec, "MAX_HIDDEN", 4)
    t = 8
    c = _lstm_count_program(t)
    assert not any("lstm_seq" in k.name for ks in c.kernels.values() for k in ks)
    assert len(c.kernels["predict"]) == 2 * t  # projection, step 0's gates (h0 = 0), then 2 a step
    train = c.kernels["train"]
    assert len(train) <= 4 * t + 10, [k.name for k in train]
    # (the optimizer's flat gradient vector copies b_ih's and b_hh's one gradient, and the weight
    # gradients come transposed into torch's [4H, in] layout: once per layer, not a step's work)
    copies = [k.name for k in train if re.fullmatch(r"train_\d+_concat", k.name) and "optimizer" not in str(k.site)]
    assert not copies
    assert len([k for k in train if re.fullmatch(r"train_\d+_transpose", k.name)]) <= 2

# (T, B, H, state, reverse): odd sizes (scalar loads, one row group), H % 4 == 0 (the backward's
# vec4 loads of W_hh), H over 256 (two hidden units an invocation, row groups that fit workgroup
# memory), and a prime H over 256 (no split leaves 32 invocations: the one-phase kernel)
SEQ_SHAPES = [(3, 2, 5, True, False), (2, 3, 12, False, True), (2, 2, 36, True, True), (2, 1, 260, True, False),
              (2, 1, 257, False, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("kernels", ["gpu", "cpu"])
@pytest.mark.parametrize("shape", SEQ_SHAPES, ids=lambda s: "T{}_B{}_H{}{}{}".format(*s[:3], "_state" * s[3], "_rev" * s[4]))
def test_lstm_seq_kernels_match_the_interpreter(kernels, shape):
    """ops.lstm_seq and its gradient kernel (each kernel set: the GPU set's two-phase kernel splits
    the step's product over invocation groups) against the float32 interpreter: every lane of Y and
    the gradients of xw, W_hh and the initial state."""
    from gpu_harness import assert_all_close, make_program, run_both

    t, b, h, state, reverse = shape
    rng = np.random.default_rng(h)
    params = {"xw": rng.normal(size=(t, b, 4 * h)), "w": rng.normal(size=(4 * h, h)) / np.sqrt(h)}
    if state:
        params.update(h0=rng.normal(size=(b, h)), c0=rng.normal(size=(b, h)))

    def body(m, feeds):
        st = (m.h0, m.c0) if state else ()
        return {"y": ops.lstm_seq(m.xw, m.w, *st, reverse=reverse)}

    program, inputs, _ = make_program(f"lstm_seq_{kernels}_{h}", params, {}, body)
    [(gpu, ref)], wgsl = run_both(program, inputs, kernels=kernels)
    assert_all_close(gpu, ref, f"lstm_seq {shape} ({kernels} set)", rtol=2e-4, atol=5e-5)
    split = {name: "phase A" in src for name, src in wgsl.items() if "lstm_seq" in name}
    assert split and set(split.values()) == {kernels == "gpu" and h != 257}, split
