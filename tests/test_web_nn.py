"""Issue 30's modules and training state in the web target: one small program with a
ConvTranspose2d, BatchNorm2d (buffers), GroupNorm, an LSTM, a frozen parameter and two training
entries (RMSprop with a parameter group, SGD with momentum on the head), run in headless Chromium
(tests/test_web.py's setup) against the Python package: per-step losses of both entries, the
parameters and buffers after, predict, and checkpoints moved both ways.

The ConvTranspose2d guards a SwiftShader trap: its fold fused into the BatchNorm statistics' CPU
reduction put signed i32 / and % inside the reduction's loop, and Chromium spent minutes on that
pipeline, then dropped the WebGPU instance; fold (and unslice) now index in u32."""

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
    web.write_web(compile_program(ZOO), out, "zoo_web.py")
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
