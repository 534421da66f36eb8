"""Issue 30's modules, ops and training state in the web target, run in headless Chromium
(tests/test_web.py's setup) against the Python package (lavapipe; itself tested against PyTorch).
Five small programs, one page load each, a few training steps and an infer entry apiece:

- zoo: ConvTranspose2d, BatchNorm2d (buffers), GroupNorm, an LSTM, a frozen parameter and two
  training entries (RMSprop with a parameter group, SGD with momentum on the head); checkpoints
  moved both ways.
- seq: Embedding(padding_idx), TransformerEncoderLayer (pre-norm, gelu, dropout, key padding
  mask), MultiheadAttention (kdim/vdim, attn_mask, weights), bidirectional GRU, two-layer ReLU RNN
  with dropout, freeze() and unfreeze(); cross_entropy with ignore_index and label_smoothing.
- img: Conv2d(dilation), InstanceNorm2d (running statistics), Dropout2d, avg_pool2d, max_pool2d,
  adaptive_avg_pool2d, interpolate (nearest, bilinear with and without align_corners), pad,
  ConvTranspose2d (groups, dilation), Conv1d, InstanceNorm1d; Adagrad (a weight-decay group)
  and Adadelta entries.
- ops: the element-wise ops, reductions, indexing and losses of the issue, BatchNorm1d, a
  TransformerDecoderLayer and a bidirectional two-layer LSTM.
- stats: BatchNorm2d statistics long enough to be computed in chunks (ops.reductions.moments).

Each call's loss or output and captured activations, and the parameters and buffers after, are
compared (RTOL, ATOL below).

The ConvTranspose2d guards a SwiftShader trap: its fold fused into the BatchNorm statistics' CPU
reduction put signed i32 / and % inside the reduction's loop, and Chromium spent minutes on that
pipeline, then dropped the WebGPU instance; fold (and unslice) now index in u32. The ops program
guards a Tint one: logsumexp's infinity test wrote FLT_MAX as 3.4028235e+38, beyond f32's range
for WGSL's f64 literals, and Chrome refused the kernel (aot/templates.py's wgsl_f32)."""

from __future__ import annotations

import base64
import functools
import http.server
import os
import threading

import numpy as np
import pytest

import aot
from aot import nn, ops, web
from aot.pipeline import compile_model, compile_program
from test_web import CHROMIUM, CHROMIUM_ARGS, _QuietHandler

pytestmark = pytest.mark.web

N, T = 2, 3


class ZooWeb(aot.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(2, 4, 3, stride=2, padding=1, output_padding=1, bias=False)  # [N,2,3,3] -> [N,4,6,6]; a bias before BatchNorm has a zero gradient: RMSprop would amplify noise
        self.bn = nn.BatchNorm2d(4, momentum=0.3)
        self.gn = nn.GroupNorm(2, 4)
        self.lstm = nn.LSTM(4, 3)
        self.head = nn.Linear(7, 1)
        self.shift = self.param((1,), init=aot.init.randn(0.5), trainable=False)

    def forward(self, img, seq):
        pooled = ops.mean(self.gn(ops.relu(self.bn(self.up(img)))), (2, 3))  # [N, 4]
        out, (_h, _c) = self.lstm(seq)  # [T, N, 3]
        last = ops.reshape(ops.narrow(out, 0, T - 1, 1), (N, 3))
        return self.head(ops.concat([pooled, last], axis=1)) + self.shift


INPUTS = {"img": aot.f32(N, 2, 3, 3), "seq": aot.f32(T, N, 4)}
ZOO = aot.Program(
    "zoo_web",
    model=ZooWeb,
    train={
        "fit": aot.Train(lambda m, img, seq, y: ops.mean(ops.square(m(img, seq) - y)), inputs={**INPUTS, "y": aot.f32(N, 1)},
                         optimizer=aot.optim.RMSprop(lr=1e-2, groups=[{"params": "lstm.*", "lr": 3e-3, "alpha": 0.9}])),
        "tune": aot.Train(lambda m, img, seq: ops.mean(ops.abs(m(img, seq))), inputs=INPUTS,
                          optimizer=aot.optim.SGD(lr=0.05, momentum=0.9), params="head.*"),
    },
    infer={"predict": aot.Infer(lambda m, img, seq: m(img, seq), inputs=INPUTS)},
    seed=4,
)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("web_nn")
    for prog in (ZOO, SEQ, IMG, OPS, STATS):
        web.write_web(compile_program(prog), out, f"{prog.name}.py")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(out)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip("chromium is not installed (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield b
        b.close()


PAGE = """async (arg) => {
    const m = window.demo.model;
    const f = (a, shape) => ({data: Float32Array.from(a), shape});
    const ins = (i) => ({img: f(arg.img[i], [2, 2, 3, 3]), seq: f(arg.seq[i], [3, 2, 4])});
    const flat = (d) => Object.fromEntries(Object.entries(d).map(([k, v]) => [k, Array.from(v.data)]));
    const b64 = (bytes) => { let s = ""; for (const b of bytes) s += String.fromCharCode(b); return btoa(s); };
    await m.loadParams(Object.fromEntries(Object.entries(arg.start).map(([k, [v, shape]]) => [k, f(v, shape)])));
    const losses = [];
    for (let i = 0; i < 3; i++) {
        losses.push(await m.stepFit({...ins(i), y: f(arg.y[i], [2, 1])}));
        if (i < 2) losses.push(await m.stepTune(ins(i + 3)));
    }
    const r = {losses, params: flat(await m.params()), buffers: flat(await m.buffers()),
               out: Array.from((await m.predict(ins(0))).data), lrs: [m.currentLr(0, "fit"), m.currentLr("default", "fit")],
               counts: m.stepCounts};
    r.npz = b64(await m.save());
    r.next = await m.stepFit({...ins(4), y: f(arg.y[4], [2, 1])});
    const bin = atob(arg.py); const py = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) py[i] = bin.charCodeAt(i);
    await m.restore(py);
    r.restored = {params: flat(await m.params()), buffers: flat(await m.buffers()), counts: m.stepCounts};
    r.afterRestore = await m.stepTune(ins(0));
    return r;
}"""


def test_zoo_trains_like_python_in_the_page(browser, site, tmp_path):
    rng = np.random.default_rng(11)
    img = rng.standard_normal((5, N, 2, 3, 3)).astype(np.float32)
    seq = rng.standard_normal((5, T, N, 4)).astype(np.float32)
    y = rng.standard_normal((5, N, 1)).astype(np.float32)
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    try:
        py = compile_model(ZOO)
    except RuntimeError as e:
        pytest.skip(f"no WebGPU adapter for the Python package: {e}")
    try:
        # the BatchNorm and GroupNorm gains and biases off their ones and zeros, so each one counts
        start = {k: v + rng.uniform(-0.3, 0.3, v.shape).astype(np.float32) for k, v in py.params().items()}
        py.load_params(start)
        shift = py.params()["shift"].copy()
        losses = []
        for i in range(3):
            losses.append(py.step_fit(img=img[i], seq=seq[i], y=y[i]))
            if i < 2:
                losses.append(py.step_tune(img=img[i + 3], seq=seq[i + 3]))
        params, buffers, out = py.params(), py.buffers(), py.predict(img=img[0], seq=seq[0])
        py_ckpt = tmp_path / "py.npz"
        py.save(py_ckpt)
        py_next = py.step_tune(img=img[0], seq=seq[0])  # what the page's restored model must give
        pg = browser.new_page()
        try:
            pg.goto(f"{site}/zoo_web/index.html?steps=0")
            pg.wait_for_function("document.body.dataset.state", timeout=300000)
            assert pg.evaluate("document.body.dataset.state") == "done", pg.evaluate("window.demo.error")
            js = pg.evaluate(PAGE, {
                "img": img.reshape(5, -1).tolist(), "seq": seq.reshape(5, -1).tolist(), "y": y.reshape(5, -1).tolist(),
                "start": {k: [v.ravel().tolist(), list(v.shape)] for k, v in start.items()},
                "py": base64.b64encode(py_ckpt.read_bytes()).decode(),
            })
        finally:
            pg.close()
        np.testing.assert_allclose(js["losses"], losses, rtol=1e-4, atol=1e-6)
        assert sorted(js["params"]) == sorted(params) and sorted(js["buffers"]) == sorted(buffers)
        for k, v in params.items():
            np.testing.assert_allclose(js["params"][k], v.ravel(), rtol=1e-4, atol=1e-5, err_msg=k)
        for k, v in buffers.items():
            np.testing.assert_allclose(js["buffers"][k], np.ravel(v), rtol=1e-4, atol=1e-5, err_msg=k)
        assert js["buffers"]["bn.num_batches_tracked"] == [5]  # both entries' forwards update the statistics
        np.testing.assert_array_equal(js["params"]["shift"], shift)  # frozen
        np.testing.assert_allclose(js["out"], out.ravel(), rtol=1e-4, atol=1e-5)
        assert js["lrs"] == pytest.approx([3e-3, 1e-2]) and js["counts"] == {"fit": 3, "tune": 2}
        # the Python checkpoint in the page: bit for bit, and it continues as Python does
        for k, v in params.items():
            assert np.array_equal(np.asarray(js["restored"]["params"][k], np.float32), v.ravel()), k
        for k, v in buffers.items():
            assert np.array_equal(np.asarray(js["restored"]["buffers"][k], v.dtype), np.ravel(v)), k
        assert js["restored"]["counts"] == {"fit": 3, "tune": 2}
        assert js["afterRestore"] == pytest.approx(py_next, rel=1e-4, abs=1e-6)
        # the page's checkpoint in Python: the same next step as the page took
        (tmp_path / "web.npz").write_bytes(base64.b64decode(js["npz"]))
        py.restore(tmp_path / "web.npz")
        assert py.step_counts == {"fit": 3, "tune": 2}
        assert py.step_fit(img=img[4], seq=seq[4], y=y[4]) == pytest.approx(js["next"], rel=1e-4, abs=1e-6)
    finally:
        py.close()


# ---- sequence and image module families (issue 30's rest), one Program each -------------------

B, L, S, V = 2, 4, 3, 7  # batch, sequence length, memory length, vocabulary


class MemNet(aot.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(5, 5), nn.Linear(5, 5)

    def forward(self, x):
        return self.b(ops.tanh(self.a(x)))


class SeqWeb(aot.Module):
    """Embedding(padding_idx) -> pre-norm TransformerEncoderLayer (gelu, dropout, key padding
    mask) -> cross MultiheadAttention (kdim/vdim, an f32 attn_mask, weights returned) over a
    memory through a frozen Linear and an unfrozen one -> bidirectional GRU -> two-layer ReLU
    RNN (dropout between layers) -> logits."""

    def __init__(self):
        super().__init__()
        self.memnet = MemNet().freeze()
        self.memnet.b.unfreeze()
        self.emb = nn.Embedding(V, 8, padding_idx=0)
        self.enc = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.2, activation="gelu",
                                              batch_first=True, norm_first=True)  # fmt: skip
        self.mha = nn.MultiheadAttention(8, 2, kdim=5, vdim=5, batch_first=True)
        self.gru = nn.GRU(8, 4, batch_first=True, bidirectional=True)
        self.rnn = nn.RNN(8, 4, num_layers=2, nonlinearity="relu", batch_first=True, dropout=0.25)
        self.head = nn.Linear(4, V)

    def forward(self, tokens, kpm, mem, amask):
        x = self.enc(self.emb(tokens), src_key_padding_mask=kpm)
        mem = self.memnet(mem)
        a, w = self.mha(x, mem, mem, attn_mask=amask)
        g, h_g = self.gru(x + a)
        r, h_r = self.rnn(g)
        for name, t in (("enc", x), ("attn", a), ("attn_w", w), ("gru", g), ("gru_h", h_g), ("rnn_h", h_r)):
            aot.capture(name, t)
        return self.head(r)


SEQ_IN = {"tokens": aot.i32(B, L), "kpm": aot.i32(B, L), "mem": aot.f32(B, S, 5), "amask": aot.f32(L, S)}
SEQ = aot.Program(
    "seq_web",
    model=SeqWeb,
    train={
        # SGD: the key part of in_proj_bias has a zero gradient in exact arithmetic (softmax drops a
        # per-row constant); an adaptive optimizer would blow its rounding noise up to +-lr steps
        "fit": aot.Train(lambda m, y, **b: ops.cross_entropy(m(**b), y, ignore_index=0, label_smoothing=0.1),
                         inputs={**SEQ_IN, "y": aot.i32(B, L)}, optimizer=aot.optim.SGD(lr=0.1, momentum=0.9)),
    },
    infer={"predict": aot.Infer(lambda m, **b: m(**b), inputs=SEQ_IN)},
    seed=5,
)


class ImgWeb(aot.Module):
    """Conv2d(dilation) -> InstanceNorm2d (affine, running statistics) -> leaky_relu -> Dropout2d,
    then avg_pool2d (ceil_mode, padding not counted), max_pool2d, interpolate (bilinear with and
    without align_corners, nearest), adaptive_avg_pool2d, reflect padding and a ConvTranspose2d
    (groups, dilation); a Conv1d (stride, dilation) and InstanceNorm1d on a second input."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=2, dilation=2, bias=False)  # a bias before InstanceNorm has no gradient
        self.inorm = nn.InstanceNorm2d(4, affine=True, track_running_stats=True, momentum=0.3)
        self.drop = nn.Dropout2d(0.25)
        self.conv1 = nn.Conv1d(3, 4, 3, stride=2, padding=1, dilation=2)
        self.inorm1 = nn.InstanceNorm1d(4)
        self.upc = nn.ConvTranspose2d(4, 4, 2, stride=2, padding=1, groups=2, dilation=2)
        self.head = nn.Linear(4 * 3 * 2 + 4 * 3 + 4 * 4, 1)  # pooled, the InstanceNorm1d output, four channel means

    def forward(self, img, sig):
        h = self.drop(ops.leaky_relu(self.inorm(self.conv(img)), 0.1))  # [B, 4, 6, 6]
        avg = ops.avg_pool2d(h, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)  # [B, 4, 4, 4]
        mx = ops.max_pool2d(h, 2)  # [B, 4, 3, 3]
        up = ops.interpolate(mx, size=(5, 4), mode="bilinear", align_corners=True)
        up2 = ops.interpolate(avg, size=(3, 5), mode="bilinear", align_corners=False)
        near = ops.interpolate(mx, scale_factor=1.5, mode="nearest")  # [B, 4, 4, 4]
        pooled = ops.adaptive_avg_pool2d(ops.pad(up, (1, 1, 0, 1), mode="reflect"), (3, 2))  # [B, 4, 3, 2]
        c = self.inorm1(self.conv1(sig))  # [B, 4, 3]
        upc = self.upc(mx)  # [B, 4, 5, 5]
        for name, t in (("inorm", h), ("avg", avg), ("max", mx), ("up", up), ("up2", up2), ("near", near),
                        ("pooled", pooled), ("conv1", c), ("upc", upc)):  # fmt: skip
            aot.capture(name, t)
        feats = [ops.reshape(pooled, (B, -1)), ops.mean(up2, (2, 3)), ops.mean(near * avg, (2, 3)), ops.reshape(c, (B, -1)),
                 ops.mean(ops.elu(avg), (2, 3)), ops.mean(ops.square(upc), (2, 3))]  # fmt: skip
        return self.head(ops.concat(feats, axis=1))


IMG_IN = {"img": aot.f32(B, 2, 6, 6), "sig": aot.f32(B, 3, 8)}
IMG = aot.Program(
    "img_web",
    model=ImgWeb,
    train={
        "fit": aot.Train(lambda m, y, **b: ops.mse_loss(m(**b), y), inputs={**IMG_IN, "y": aot.f32(B, 1)},
                         optimizer=aot.optim.Adagrad(lr=0.05, lr_decay=0.1, initial_accumulator_value=0.1,
                                                   groups=[{"params": "head.*", "lr": 0.02, "weight_decay": 0.1}])),  # biases decay too
        "tune": aot.Train(lambda m, **b: ops.mean(ops.abs(m(**b))), inputs=IMG_IN,
                          optimizer=aot.optim.Adadelta(lr=0.5, rho=0.8, weight_decay=0.05), params="conv1.*"),
    },
    infer={"predict": aot.Infer(lambda m, **b: m(**b), inputs=IMG_IN)},
    seed=6,
)


class OpsWeb(aot.Module):
    """Issue 30's element-wise ops, reductions, indexing, padding and losses over one BatchNorm1d'd
    Linear, and a post-norm TransformerDecoderLayer (causal self-attention on the fused path, a
    memory key padding mask) with a bidirectional two-layer LSTM."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8, momentum=0.2)
        self.dec = nn.TransformerDecoderLayer(8, 2, dim_feedforward=12, dropout=0.1, batch_first=True)
        self.lstm = nn.LSTM(8, 3, num_layers=2, bidirectional=True, batch_first=True)

    def forward(self, x, idx, tgt, mkpm, cmask):
        h = self.bn(self.lin(x))  # [R, 8]
        acts = [ops.leaky_relu(h, 0.2), ops.elu(h, 0.7), ops.softplus(h, beta=2.0, threshold=1.0), ops.mish(h),
                ops.hardswish(h * 3.0), ops.hardsigmoid(h * 3.0), ops.logsigmoid(h), ops.clamp(h, -0.5, 0.6),
                ops.log1p(ops.abs(h)), ops.expm1(h * 0.5)]  # fmt: skip
        a = acts[0]
        for t in acts[1:]:
            a = a + t
        a = a * 0.2
        red = [ops.logsumexp(a, 1), ops.var(a, 1, correction=0), ops.std(a, 1), ops.min(a, 1),
               ops.prod(ops.sigmoid(a) + 0.5, 1), ops.norm(a, 2, 1), ops.sum(ops.cumsum(a, 1) * 0.1, 1)]  # fmt: skip
        picked = [a[:, 1::3], a[None, ..., 2], a[idx, ::-2], a[[3, 0, 3], 5:6]]  # [R,3], [1,R], [3,4], [3,1]
        padded = [ops.pad(a, (1, 2), mode="replicate"), ops.pad(a, (0, 1, 1, 0), value=0.5)]  # [R, 11], [R+1, 9]
        d = self.dec(tgt, ops.reshape(a, (2, R // 2, 8)), memory_key_padding_mask=mkpm, tgt_is_causal=True,
                     tgt_mask=cmask)  # fmt: skip
        seq, (hn, cn) = self.lstm(d)
        for name, t in (("a", a), ("dec", d), ("lstm", seq), ("hn", hn), ("cn", cn)):
            aot.capture(name, t)
        return ops.stack(red, 1), picked, padded, seq


R = 4


def _ops_loss(m, yc, yb, **b):
    red, picked, padded, seq = m(**b)
    p = ops.sigmoid(picked[2])  # [3, 4]
    logp = ops.log_softmax(red, -1)  # [R, 7]
    losses = {
        "ce": ops.cross_entropy(red, yc, label_smoothing=0.2), "nll": ops.nll_loss(logp, yc, ignore_index=1),
        "bce": ops.binary_cross_entropy(p, yb),
        "bce_logits": ops.binary_cross_entropy_with_logits(picked[2], yb, pos_weight=ops.full((4,), 2.0)),
        "mse": ops.mse_loss(picked[0], picked[0] * 0.5 + 0.1, reduction="sum"), "l1": ops.l1_loss(padded[0], padded[0] * 0.9),
        "smooth_l1": ops.smooth_l1_loss(padded[1], padded[1] * 1.2, beta=0.5),
        "huber": ops.huber_loss(picked[1], picked[1] * 1.3, delta=0.3),
        "kl": ops.kl_div(logp, ops.softmax(red * 0.5, -1), reduction="batchmean"),
        "cos": ops.mean(ops.cosine_similarity(picked[3], picked[2], dim=1)), "lstm_sq": ops.mean(ops.square(seq)),
    }  # fmt: skip
    total = 0.0
    for name, v in losses.items():  # each captured: a mismatch names its loss
        aot.capture("loss_" + name, v)
        total = total + v
    return total


OPS_IN = {"x": aot.f32(R, 6), "idx": aot.i32(3), "tgt": aot.f32(2, 3, 8), "mkpm": aot.i32(2, R // 2), "cmask": aot.i32(3, 3)}
OPS = aot.Program(
    "ops_web",
    model=OpsWeb,
    train={"fit": aot.Train(_ops_loss, inputs={**OPS_IN, "yc": aot.i32(R), "yb": aot.f32(3, 4)},
                            optimizer=aot.optim.SGD(lr=0.02, momentum=0.5))},
    infer={"predict": aot.Infer(lambda m, **b: m(**b)[3], inputs=OPS_IN)},
    seed=7,
)

# stats: BatchNorm2d over 32,768 values a channel (statistics in chunks combined by Chan's
# formula: ops.reductions.moments), with and without running statistics, and ops.std
SX = (8, 2, 64, 64)


class StatsWeb(aot.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(2, momentum=0.3)
        self.bn_b = nn.BatchNorm2d(2, track_running_stats=False)

    def forward(self, img):
        y = self.bn(img) + self.bn_b(img * 0.5 + 3.0)
        aot.capture("std", ops.std(img, (0, 2, 3)))
        return y


STATS = aot.Program(
    "stats_web",
    model=StatsWeb,
    train={"fit": aot.Train(lambda m, img, t: ops.mean(ops.square(m(img) - t)), inputs={"img": aot.f32(*SX), "t": aot.f32(*SX)},
                            optimizer=aot.optim.SGD(lr=0.5))},
    infer={"predict": aot.Infer(lambda m, img: m.bn_b(img), inputs={"img": aot.f32(*SX)})},
    seed=8,
)


RUN = """async (arg) => {
    const m = window.demo.model;
    const T = ([data, shape, dtype]) => ({data: dtype === "i32" ? Int32Array.from(data) : Float32Array.from(data), shape});
    const ins = (d) => Object.fromEntries(Object.entries(d).map(([k, v]) => [k, T(v)]));
    const flat = (d) => Object.fromEntries(Object.entries(d).map(([k, v]) => [k, Array.from(v.data)]));
    await m.loadParams(ins(arg.start));
    const calls = [];
    for (const [method, inputs] of arg.calls) {
        const r = await m[method](ins(inputs), {captures: true});
        calls.push([("loss" in r) ? r.loss : Array.from(r.output.data), flat(r.captures)]);
    }
    return {calls, params: flat(await m.params()), buffers: flat(await m.buffers()), counts: m.stepCounts};
}"""


def _arg(v):
    v = np.asarray(v)
    return [v.ravel().tolist(), list(v.shape), "i32" if v.dtype == np.int32 else "f32"]


def _run_both(browser, site, prog, calls, perturb=0.3, seed=0):
    """Run `calls` ((entry, inputs) in order) on the Python package of `prog` (lavapipe) and in
    its page (SwiftShader), both from the same perturbed initial parameters; returns
    (python, page), each {"calls": [(loss or infer output, captures)], "params", "buffers", "counts"}."""
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    try:
        py = compile_model(prog)
    except RuntimeError as e:
        pytest.skip(f"no WebGPU adapter for the Python package: {e}")
    try:
        rng = np.random.default_rng(seed)
        # norm gains and biases off their ones and zeros, so each one counts
        start = {k: v + rng.uniform(-perturb, perturb, v.shape).astype(np.float32) for k, v in py.params().items()}
        py.load_params(start)
        trains = set(prog.train) if isinstance(prog.train, dict) else {"train"}
        out = []
        for entry, inputs in calls:
            if entry in trains:
                r = getattr(py, f"step_{entry}")(**inputs, captures=True)
                out.append((r.loss, r.captures))
            else:
                r = getattr(py, entry)(**inputs, captures=True)
                out.append((r.output, r.captures))
        ref = {"calls": out, "params": py.params(), "buffers": py.buffers(), "counts": py.step_counts, "start": start}
    finally:
        py.close()
    methods = [(web.js_train_methods(e)[0] if e in trains else e, {k: _arg(v) for k, v in ins.items()}) for e, ins in calls]
    pg = browser.new_page()
    try:
        pg.goto(f"{site}/{prog.name}/index.html?steps=0")
        pg.wait_for_function("document.body.dataset.state", timeout=300000)
        assert pg.evaluate("document.body.dataset.state") == "done", pg.evaluate("window.demo.error")
        js = pg.evaluate(RUN, {"start": {k: _arg(v) for k, v in start.items()}, "calls": methods})
    finally:
        pg.close()
    return ref, js


# The page (SwiftShader, the CPU kernel set) against the Python package (lavapipe): two drivers
# and their own reduction orders and exp/log, so not bit for bit. On these O(1) values the largest
# difference measured over every loss, output, capture, parameter and buffer after 3 to 5 steps
# was 6.9e-7 (on a value near 1.5: about 5 f32 ulps; 3e-5 relative where a value is near 1e-2,
# 2.4e-7 absolute); the bound below, 1e-6 + 1e-5 |x|, is above every one of them with room to
# spare, and an indexing, masking or gate-order bug moves values by orders more.
RTOL, ATOL = 1e-5, 1e-6


def _compare(ref, js, rtol, atol):
    """Every call's loss or output and captures, then the parameters and buffers after."""
    assert len(js["calls"]) == len(ref["calls"])
    for i, ((val, caps), (jval, jcaps)) in enumerate(zip(ref["calls"], js["calls"])):
        np.testing.assert_allclose(jval, np.ravel(val), rtol=rtol, atol=atol, err_msg=f"call {i}")
        assert sorted(jcaps) == sorted(caps)
        for k, v in caps.items():
            np.testing.assert_allclose(jcaps[k], np.ravel(v), rtol=rtol, atol=atol, err_msg=f"call {i} capture {k}")
    assert sorted(js["params"]) == sorted(ref["params"]) and sorted(js["buffers"]) == sorted(ref["buffers"])
    for k, v in ref["params"].items():
        np.testing.assert_allclose(js["params"][k], v.ravel(), rtol=rtol, atol=atol, err_msg=k)
    for k, v in ref["buffers"].items():
        np.testing.assert_allclose(js["buffers"][k], np.ravel(v), rtol=rtol, atol=atol, err_msg=k)
    assert js["counts"] == ref["counts"]


def test_sequence_modules_train_like_python_in_the_page(browser, site):
    rng = np.random.default_rng(3)
    batches = []
    for _ in range(4):
        tokens = rng.integers(1, V, (B, L)).astype(np.int32)
        tokens[1, 3] = 0  # the padding row, masked as a key and ignored as a target
        kpm = np.zeros((B, L), np.int32)
        kpm[1, 3] = 1
        y = rng.integers(0, V, (B, L)).astype(np.int32)  # some 0s: ignore_index
        batches.append({"tokens": tokens, "kpm": kpm, "mem": rng.standard_normal((B, S, 5)).astype(np.float32),
                        "amask": rng.uniform(-1, 0, (L, S)).astype(np.float32), "y": y})  # fmt: skip
    calls = [("fit", b) for b in batches[:3]] + [("predict", {k: v for k, v in batches[3].items() if k != "y"})]
    ref, js = _run_both(browser, site, SEQ, calls)
    _compare(ref, js, RTOL, ATOL)
    # the padding row gets no gradient: the start, bit for bit, in the page too
    np.testing.assert_array_equal(np.reshape(js["params"]["emb.W"], (V, 8))[0], ref["start"]["emb.W"][0])
    # freeze() then unfreeze() of a child: memnet.a stays, memnet.b trains
    for k in ("memnet.a.W", "memnet.a.b"):
        np.testing.assert_array_equal(js["params"][k], ref["start"][k].ravel(), err_msg=k)
    assert not np.array_equal(js["params"]["memnet.b.W"], ref["start"]["memnet.b.W"].ravel())


def test_image_modules_train_like_python_in_the_page(browser, site):
    rng = np.random.default_rng(4)
    batches = [{"img": rng.standard_normal((B, 2, 6, 6)).astype(np.float32), "sig": rng.standard_normal((B, 3, 8)).astype(np.float32)}
               for _ in range(4)]  # fmt: skip
    ys = rng.standard_normal((3, B, 1)).astype(np.float32)
    calls = [("fit", {**batches[0], "y": ys[0]}), ("tune", batches[1]), ("fit", {**batches[2], "y": ys[1]}),
             ("tune", batches[0]), ("fit", {**batches[1], "y": ys[2]}), ("predict", batches[3])]  # fmt: skip
    ref, js = _run_both(browser, site, IMG, calls)
    _compare(ref, js, RTOL, ATOL)
    # Dropout2d zeroed whole channels, a new draw each training step (the same ones in the page:
    # compared above), and none in the infer entry
    dropped = [int((np.abs(caps["inorm"]).reshape(B * 4, -1).max(1) == 0).sum()) for _, caps in ref["calls"]]
    assert sum(dropped[:5]) > 0 and len(set(dropped[:5])) > 1 and dropped[5] == 0, dropped


def test_ops_and_losses_train_like_python_in_the_page(browser, site):
    rng = np.random.default_rng(5)
    causal = np.triu(np.ones((3, 3), np.int32), 1)
    batches = [{"x": rng.standard_normal((R, 6)).astype(np.float32), "idx": np.array([2, 0, 2], np.int32),
                "tgt": rng.standard_normal((2, 3, 8)).astype(np.float32), "mkpm": np.array([[0, 1], [0, 0]], np.int32),
                "cmask": causal} for _ in range(4)]  # fmt: skip
    calls = [("fit", {**b, "yc": rng.integers(0, 7, R).astype(np.int32), "yb": rng.uniform(0, 1, (3, 4)).astype(np.float32)})
             for b in batches[:3]] + [("predict", batches[3])]  # fmt: skip
    ref, js = _run_both(browser, site, OPS, calls)
    _compare(ref, js, RTOL, ATOL)


def test_split_batchnorm_statistics_train_like_python_in_the_page(browser, site):
    rng = np.random.default_rng(6)
    img = [(rng.standard_normal(SX) * [[[2.0]], [[0.5]]] + [[[10.0]], [[-3.0]]]).astype(np.float32) for _ in range(3)]
    calls = [("fit", {"img": img[i], "t": rng.standard_normal(SX).astype(np.float32)}) for i in range(2)]
    ref, js = _run_both(browser, site, STATS, calls + [("predict", {"img": img[2]})])
    _compare(ref, js, RTOL, ATOL)


def test_f32_literal_edges_compile_in_chrome(browser, site):
    """Tint (Chrome) parses a WGSL float literal as an f64 and refuses one beyond f32's finite
    range; naga (the Python package's wgpu) rounds it, so only a browser catches one. The edge
    values as aot writes them (aot/templates.py's wgsl_f32) compile, and read back as themselves."""
    from aot.templates import wgsl_f32

    big = np.finfo(np.float32).max
    edges = np.array([big, -big, np.nextafter(big, np.float32(0)), np.finfo(np.float32).tiny, 1e-45, -1e-45, 0.1, -3.0e38], np.float32)
    code = ("@group(0) @binding(0) var<storage, read_write> out: array<f32>;\n@compute @workgroup_size(1) fn main() {\n"
            + "".join(f"    out[{i}] = {wgsl_f32(v)};\n" for i, v in enumerate(edges)) + "}\n")  # fmt: skip
    pg = browser.new_page()
    try:
        pg.goto(f"{site}/zoo_web/index.html?steps=0")
        r = pg.evaluate("""async ([code, n]) => {
          const d = await (await navigator.gpu.requestAdapter()).requestDevice();
          d.pushErrorScope('validation');
          const m = d.createShaderModule({code});
          const msgs = (await m.getCompilationInfo()).messages.filter((x) => x.type === 'error').map((x) => x.message);
          const p = d.createComputePipeline({layout: 'auto', compute: {module: m, entryPoint: 'main'}});
          const err = await d.popErrorScope();
          if (msgs.length || err) return {error: msgs.join('; ') + (err ? ' | ' + err.message : '')};
          const buf = d.createBuffer({size: 4 * n, usage: GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC});
          const read = d.createBuffer({size: 4 * n, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST});
          const enc = d.createCommandEncoder(); const pass = enc.beginComputePass();
          pass.setPipeline(p); pass.setBindGroup(0, d.createBindGroup({layout: p.getBindGroupLayout(0), entries: [{binding: 0, resource: {buffer: buf}}]}));
          pass.dispatchWorkgroups(1); pass.end(); enc.copyBufferToBuffer(buf, 0, read, 0, 4 * n);
          d.queue.submit([enc.finish()]); await read.mapAsync(GPUMapMode.READ);
          return {values: Array.from(new Float32Array(read.getMappedRange()))};
        }""", [code, len(edges)])
    finally:
        pg.close()
    assert "error" not in r, r["error"]
    got = np.asarray(r["values"], np.float32)
    normal = np.abs(edges) >= np.finfo(np.float32).tiny  # subnormals may flush to zero on a GPU
    np.testing.assert_array_equal(got[normal], edges[normal])
    assert np.all((got[~normal] == edges[~normal]) | (got[~normal] == 0))
