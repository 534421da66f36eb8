"""Issue 33 (robust under real use) in the web runtime (codegen_templates/web/runtime.js), in
headless Chromium (tests/test_web.py's setup): inputs copied when a call is made, setLr() queued in
order with steps, names that Object.prototype has (toString, constructor, __proto__) as inputs,
parameters and checkpoint members, close() during stepMany, and hostile checkpoints refused before
anything is inflated."""

from __future__ import annotations

import base64
import functools
import http.server
import io
import os
import struct
import threading
import zipfile

import numpy as np
import pytest

import aot
from aot import nn, ops, web
from aot.pipeline import compile_program
from test_web import CHROMIUM, CHROMIUM_ARGS, _QuietHandler

pytestmark = pytest.mark.web


class Proto(aot.Module):
    """Parameters named after Object.prototype's members: constructor, __proto__, toString.*"""

    def __init__(self):
        super().__init__()
        self.toString = nn.Linear(2, 2)
        self.constructor = self.param((2,), init=aot.init.randn(0.5))
        self.__proto__ = self.param((2,), init=aot.init.randn(0.5))


def _loss(m, toString, constructor, valueOf):
    h = m.toString(toString) * m.constructor + m.__proto__
    return ops.mean(ops.square(h - constructor)) + ops.mean(valueOf)


PROTO = aot.Program(
    "proto_web", model=Proto, seed=3,
    train=aot.Train(_loss, inputs={"toString": aot.f32(3, 2), "constructor": aot.f32(3, 2), "valueOf": aot.f32(1)},
                    optimizer=aot.optim.SGD(lr=0.1)),
)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip("chromium is not installed (apt-get install chromium)")
    out = tmp_path_factory.mktemp("web_robust")
    web.write_web(compile_program(PROTO), out, "proto_web.py")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(out)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        pg = b.new_page()
        pg.goto(f"http://127.0.0.1:{server.server_address[1]}/proto_web/index.html?steps=0")
        pg.wait_for_function("document.body.dataset.state", timeout=300000)
        assert pg.evaluate("document.body.dataset.state") == "done", pg.evaluate("window.demo.error")
        yield pg
        b.close()
    server.shutdown()


def _js(page, body: str, arg=None):
    """Run `body` (an async function body; M: the module, m: the page's model, arg) in the page."""
    prelude = (
        "const f = (v, shape) => ({data: new Float32Array(shape.reduce((a, b) => a * b, 1)).fill(v), shape});"
        "const batch = (v) => ({toString: f(v, [3, 2]), constructor: f(2 * v, [3, 2]), valueOf: f(1, [1])});"
        "const flat = async (mm = m) => Object.entries(await mm.params()).map(([k, p]) => [k, Array.from(p.data)]);"
        "const error = async (p) => { try { await p; return null; } catch (e) { return [e.name, e.message]; } };"
    )
    return page.evaluate(
        "async ([src, arg]) => { const M = await import('./proto_web.js'); return await (new Function('M', 'arg', 'm', "
        "'return (async () => {' + src + '})()'))(M, arg, window.demo.model); }",
        [prelude + body, arg],
    )


def test_inputs_copied_when_called_and_set_lr_queued(page):
    """A Float32Array input was read when the queued step ran, so refilling it changed what an
    un-awaited step trained on; setLr() applied at once, to steps already requested."""
    js = _js(page, """
        await m.reset(); await m.setLr(0.1);
        const ref = await m.step(batch(1));
        await m.reset();
        const x = new Float32Array(6).fill(1), c = new Float32Array(6).fill(2);
        const pending = m.step({toString: {data: x, shape: [3, 2]}, constructor: {data: c, shape: [3, 2]}, valueOf: f(1, [1])});
        x.fill(7); c.fill(-3);
        const got = await pending;
        await m.reset();
        await m.step(batch(1)); await m.setLr(0.5); await m.step(batch(2));
        const refParams = await flat();
        await m.reset(); await m.setLr(0.1);
        const a = m.step(batch(1)); m.setLr(0.5); const b = m.step(batch(2));
        await a; await b;
        return {ref, got, refParams, gotParams: await flat(), lr: m.currentLr()};""")
    assert js["got"] == js["ref"]
    assert js["gotParams"] == js["refParams"]
    assert js["lr"] == pytest.approx(0.5)


def test_object_prototype_names(page):
    """Names that every object inherits were taken for present ("constructor" in {} is true), and
    "__proto__" as an object key set the prototype instead of a property."""
    js = _js(page, """
        await m.reset();
        const r = {names: Object.keys(await m.params()).sort(), torchOwn: Object.prototype.hasOwnProperty.call(M.PROGRAM.torch, "__proto__")};
        r.unknownInput = await error(m.step({...batch(1), isPrototypeOf: f(1, [1])}));
        r.missing = await error(m.loadParams({}));
        r.unknownParam = await error(m.loadParams({hasOwnProperty: f(1, [2])}, {partial: true}));
        const p0 = await m.params();
        await m.loadParams(Object.fromEntries(Object.entries(p0).map(([k, v]) => [k, {data: v.data.map((x) => x + 1), shape: v.shape}])));
        r.p0 = await flat(); await m.reset(); r.p0reset = await flat();
        await m.loadParams(Object.fromEntries(Object.entries(p0).map(([k, v]) => [k, {data: v.data.map((x) => x + 1), shape: v.shape}])));
        r.loss = await m.step(batch(1));
        const ckpt = await m.save();
        r.saved = await flat();
        await m.reset(); await m.restore(ckpt);
        r.restored = await flat();
        const zip = await M.unzip(ckpt, (w) => new Error(w));
        for (const extra of ["constructor.npy", "toString.npy", "__proto__.npy"]) {
          const members = [...zip].map(([n, z]) => [n, z.raw]);
          members.push([extra, zip.get("__step_count__.npy").raw]);
          (r.extra = r.extra || []).push(await error(m.restore(M.zipStored(members))));
        }
        return r;""")
    assert js["names"] == ["__proto__", "constructor", "toString.W", "toString.b"]
    assert js["torchOwn"]
    assert js["unknownInput"][0] == "TypeError" and "unknown input(s) ['isPrototypeOf']" in js["unknownInput"][1]
    assert js["missing"][0] == "KeyError" and "['__proto__', 'constructor', 'toString.W', 'toString.b']" in js["missing"][1]
    assert js["unknownParam"][0] == "KeyError" and "unknown parameter(s) ['hasOwnProperty']" in js["unknownParam"][1]
    # (entries, not objects: Playwright drops a "__proto__" key on the way back)
    for r in ("p0", "p0reset", "saved", "restored"):
        js[r] = dict(js[r])
    for k in js["names"]:  # loadParams wrote every parameter, __proto__ included
        np.testing.assert_allclose(js["p0"][k], np.asarray(js["p0reset"][k]) + 1, rtol=1e-6, err_msg=k)
        assert js["restored"][k] == js["saved"][k], k
    assert js["saved"]["__proto__"] != js["p0"]["__proto__"]  # it trains
    for (name, msg), member in zip(js["extra"], ["constructor", "toString", "__proto__"]):
        assert name == "ValueError" and f"unknown member(s) ['{member}']" in msg, msg


def test_close_during_step_many_rejects_cleanly(page):
    """close() while stepMany was submitting chunks: the call rejected with the lost device's
    DOMException."""
    js = _js(page, """
        const m2 = await M.Model.create({seed: 1});
        await m2.step(batch(1));  // pipelines built
        const e = m2._engine, runMany = e.runMany.bind(e);
        e.manySlots = () => 1; e._many = {};
        e.runMany = (key, k, fill, c) => runMany(key, k, (s, n) => { if (s === 3) m2.close(); return fill(s, n); }, c);
        const err = await error(m2.stepMany(Array.from({length: 8}, (_, i) => batch(i))));
        return {err, count: m2.stepCount, after: await error(m2.step(batch(1)))};""")
    assert js["err"][0] == "Error" and "closed during the call" in js["err"][1], js["err"]
    assert js["count"] == 1
    assert "closed" in js["after"][1]


def _members(ckpt: bytes) -> dict:
    with zipfile.ZipFile(io.BytesIO(ckpt)) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _zip(members: dict, deflate=()) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for n, data in members.items():
            zf.writestr(n, data, zipfile.ZIP_DEFLATED if n in deflate else zipfile.ZIP_STORED)
    return buf.getvalue()


def _npy_header(descr, shape) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue()


def test_restore_refuses_hostile_sizes_before_inflating(page):
    """restore() inflated a small checkpoint's member to its full size (1 GiB) before refusing it,
    and a string member declaring a huge length threw RangeError."""
    ckpt = base64.b64decode(_js(page, "await m.reset(); const b = await m.save(); let s = ''; for (const x of b) s += String.fromCharCode(x); return btoa(s);"))
    members = _members(ckpt)
    cases = {}
    cases["string"] = _zip({**members, "__program__.npy": _npy_header("<U1000000000", ()) + b"p\0\0\0"})
    big = _npy_header("<f4", (4096, 4096)) + bytes(4 * 4096 * 4096)
    cases["declared"] = _zip({**members, "param/constructor.npy": big}, deflate={"param/constructor.npy"})
    lying = bytearray(cases["declared"])
    name = b"param/constructor.npy"
    at = lying.index(b"PK\x01\x02" + lying[lying.index(b"PK\x01\x02") + 4 : lying.index(b"PK\x01\x02") + 4])  # first central entry
    while lying[at + 46 : at + 46 + len(name)] != name:
        at = lying.index(b"PK\x01\x02", at + 4)
    struct.pack_into("<I", lying, at + 24, 200)  # the central directory says 200 bytes
    cases["lying"] = bytes(lying)
    assert max(len(c) for c in cases.values()) < 200_000
    js = _js(page, """
        const out = {};
        for (const [k, b64] of Object.entries(arg)) {
          const bin = atob(b64), bytes = new Uint8Array(bin.length);
          for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
          const t = performance.now();
          out[k] = [...(await error(m.restore(bytes)) || ["none", ""]), performance.now() - t];
        }
        out.stillFine = await m.step(batch(1));
        return out;""", {k: base64.b64encode(v).decode() for k, v in cases.items()})
    assert js["string"][0] == "ValueError" and "declares 1000000000 characters" in js["string"][1], js["string"]
    assert js["declared"][0] == "ValueError" and "more than this model's checkpoints hold" in js["declared"][1], js["declared"]
    assert js["lying"][0] == "ValueError" and "inflates past its declared 200 bytes" in js["lying"][1], js["lying"]
    assert js["stillFine"] > 0
