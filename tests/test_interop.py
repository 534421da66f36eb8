"""PyTorch state_dicts and safetensors, in and out (issue 10; API.md §6).

One infer-only program holds every aot.nn module kind (Linear with and without bias,
LayerNorm, RMSNorm, Embedding, Conv2d with groups), a list of modules and a bare param,
with one entry point per module kind; a PyTorch twin declares the same modules under the
same names. The program is written to a model file so `python -m aot convert --model` can
read it too. Files are written by the `safetensors` package (a test-only dependency) and
read back by it and by PyTorch.
"""

from __future__ import annotations

import json
import os
import runpy
import struct
import textwrap
from pathlib import Path

import numpy as np
import pytest

import aot
from aot import cli
from aot.runtime import interop

pytestmark = pytest.mark.gpu  # needs a WebGPU adapter (lavapipe on CI)

ROOT = Path(__file__).resolve().parent.parent
torch = pytest.importorskip("torch")
st_numpy = pytest.importorskip("safetensors.numpy")
st_torch = pytest.importorskip("safetensors.torch")

MODEL_SRC = textwrap.dedent(
    """
    import aot
    from aot import nn, ops


    class Zoo(aot.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 5)
            self.lin_nb = nn.Linear(5, 3, bias=False)
            self.ln = nn.LayerNorm(6)
            self.rms = nn.RMSNorm(6)
            self.emb = nn.Embedding(11, 6)
            self.conv = nn.Conv2d(4, 6, 3, padding=1)
            self.gconv = nn.Conv2d(6, 4, (3, 1), groups=2, bias=False)
            self.blocks = [nn.Linear(3, 3) for _ in range(2)]
            self.scale = self.param((3,), init=aot.init.ones())


    program = aot.Program(
        "interop_zoo",
        model=Zoo,
        infer={
            "linear": aot.Infer(lambda m, x: m.lin_nb(m.lin(x)), inputs={"x": aot.f32(4, 6)}),
            "layernorm": aot.Infer(lambda m, x: m.ln(x), inputs={"x": aot.f32(4, 6)}),
            "rmsnorm": aot.Infer(lambda m, x: m.rms(x), inputs={"x": aot.f32(4, 6)}),
            "embedding": aot.Infer(lambda m, idx: m.emb(idx), inputs={"idx": aot.i32(2, 5)}),
            "conv": aot.Infer(lambda m, img: m.gconv(m.conv(img)), inputs={"img": aot.f32(2, 4, 5, 5)}),
            "bare": aot.Infer(lambda m, h: m.blocks[1](m.blocks[0](h)) * m.scale, inputs={"h": aot.f32(4, 3)}),
        },
        seed=5,
    )
    """
)


class TorchZoo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 5)
        self.lin_nb = torch.nn.Linear(5, 3, bias=False)
        self.ln = torch.nn.LayerNorm(6, eps=1e-5)
        self.rms = torch.nn.RMSNorm(6, eps=1e-6)
        self.emb = torch.nn.Embedding(11, 6)
        self.conv = torch.nn.Conv2d(4, 6, 3, padding=1)
        self.gconv = torch.nn.Conv2d(6, 4, (3, 1), groups=2, bias=False)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(3, 3) for _ in range(2)])
        self.scale = torch.nn.Parameter(torch.ones(3))


def torch_zoo(seed):
    torch.manual_seed(seed)
    t = TorchZoo()
    with torch.no_grad():
        for p in t.parameters():  # norms start at ones/zeros: make every value count
            p.copy_(torch.randn(p.shape) * 0.5)
    return t


def torch_entries(t):
    return {
        "linear": lambda x: t.lin_nb(t.lin(x)),
        "layernorm": t.ln,
        "rmsnorm": t.rms,
        "embedding": lambda idx: t.emb(idx.long()),
        "conv": lambda img: t.gconv(t.conv(img)),
        "bare": lambda h: t.blocks[1](t.blocks[0](h)) * t.scale,
    }


def entry_inputs(seed=0):
    r = np.random.default_rng(seed)
    return {
        "linear": {"x": r.normal(size=(4, 6)).astype(np.float32)},
        "layernorm": {"x": r.normal(size=(4, 6)).astype(np.float32)},
        "rmsnorm": {"x": r.normal(size=(4, 6)).astype(np.float32)},
        "embedding": {"idx": r.integers(0, 11, (2, 5)).astype(np.int32)},
        "conv": {"img": r.normal(size=(2, 4, 5, 5)).astype(np.float32)},
        "bare": {"h": r.normal(size=(4, 3)).astype(np.float32)},
    }


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("zoo") / "zoo.py"
    path.write_text(MODEL_SRC)
    return path


@pytest.fixture(scope="module")
def shared(model_file):
    m = aot.compile(cli.load_programs(str(model_file))["interop_zoo"])
    yield m
    m.close()


@pytest.fixture
def model(shared):
    shared.reset()
    return shared


def np_sd(t):
    return {k: v.detach().numpy().copy() for k, v in t.state_dict().items()}


def assert_same(a: dict, b: dict):
    assert list(a) == list(b) or sorted(a) == sorted(b), (sorted(a), sorted(b))
    for k in a:
        assert a[k].dtype == b[k].dtype == np.float32, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# ---- the module kinds against PyTorch ------------------------------------------------------------


def test_every_module_kind_matches_torch_after_load_state_dict(model):
    t = torch_zoo(1)
    model.load_state_dict(t.state_dict())  # torch tensors (requires_grad): detached via getattr
    fns = torch_entries(t)
    for entry, inputs in entry_inputs().items():
        got = getattr(model, entry)(**inputs)
        with torch.no_grad():
            want = fns[entry](*(torch.from_numpy(v) for v in inputs.values())).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=entry)


def test_the_compiler_writes_the_torch_table(model):
    table = model.PROGRAM["torch"]
    assert table["lin.W"] == ("lin.weight", "Linear", True)
    assert table["ln.g"] == ("ln.weight", "LayerNorm", False)
    assert table["rms.g"] == ("rms.weight", "RMSNorm", False)
    assert table["emb.W"] == ("emb.weight", "Embedding", False)
    assert table["gconv.W"] == ("gconv.weight", "Conv2d", False)
    assert table["blocks.1.b"] == ("blocks.1.bias", "Linear", False)
    assert table["scale"] == ("scale", "", False)  # a bare param keeps its name
    assert sorted(model.state_dict()) == sorted(TorchZoo().state_dict())


def test_state_dict_round_trips_bit_exact(model):
    t = torch_zoo(2)
    sd = np_sd(t)
    model.load_state_dict(sd)  # NumPy arrays work as well
    assert_same(model.state_dict(), sd)
    params = model.params()
    assert_same(model.state_dict(layout="aot"), params)
    np.testing.assert_array_equal(params["lin.W"], sd["lin.weight"].T)
    back = TorchZoo()
    back.load_state_dict({k: torch.from_numpy(v) for k, v in model.state_dict().items()})  # strict
    assert_same(np_sd(back), sd)
    model.load_params(params)
    model.load_state_dict(model.state_dict(layout="aot"), layout="aot")
    assert_same(model.params(), params)


# ---- safetensors files: ours in the safetensors package and PyTorch, theirs in ours -------------


def test_files_we_write_load_in_safetensors_and_torch(model, tmp_path):
    model.load_state_dict(torch_zoo(3).state_dict())
    params = model.params()
    model.save_safetensors(tmp_path / "aot.safetensors")
    assert_same(st_numpy.load_file(str(tmp_path / "aot.safetensors")), params)
    model.save_safetensors(tmp_path / "torch.safetensors", layout="torch")
    back = TorchZoo()
    back.load_state_dict(st_torch.load_file(str(tmp_path / "torch.safetensors")))  # strict
    assert_same(np_sd(back), model.state_dict())
    assert sorted(os.listdir(tmp_path)) == ["aot.safetensors", "torch.safetensors"]  # no temporary files left

    raw = (tmp_path / "torch.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    text = raw[8 : 8 + n].decode()
    assert n % 8 == 0 and text == text.rstrip() + " " * (len(text) - len(text.rstrip()))
    header = json.loads(text)
    assert list(header) == sorted(header)
    assert header["__metadata__"] == {"format": "pt", "aot_program": "interop_zoo", "aot_layout": "torch"}
    begins = [header[k]["data_offsets"][0] for k in sorted(header) if k != "__metadata__"]
    assert begins == sorted(begins) and begins[0] == 0


def test_files_the_safetensors_package_writes_load(model, tmp_path):
    t = torch_zoo(4)
    st_torch.save_file(t.state_dict(), str(tmp_path / "t.safetensors"))
    model.load_safetensors(tmp_path / "t.safetensors", layout="torch")
    assert_same(model.state_dict(), np_sd(t))
    params = {k: v * 2 for k, v in model.params().items()}
    st_numpy.save_file(params, str(tmp_path / "a.safetensors"))
    model.load_safetensors(str(tmp_path / "a.safetensors"))
    assert_same(model.params(), params)
    model.reset()
    model.load_safetensors(st_numpy.save(params))  # bytes
    assert_same(model.params(), params)
    with interop.SafetensorsFile(tmp_path / "a.safetensors") as f:
        assert not isinstance(f._buf, np.memmap)  # read whole: a mapped file rewritten underneath raised SIGBUS (issue 33)


def test_f16_bf16_and_f64_files_load(model, tmp_path):
    t = torch_zoo(5)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        sd = {k: v.to(dtype) for k, v in t.state_dict().items()}
        st_torch.save_file(sd, str(tmp_path / "w.safetensors"))
        model.reset()
        model.load_safetensors(tmp_path / "w.safetensors", layout="torch")
        want = {k: v.float().numpy() for k, v in sd.items()}  # exact: every such value is a float32
        assert_same(model.state_dict(), want)
        model.reset()
        model.load_state_dict(sd)  # bf16 tensors have no .numpy(): widened through .float()
        assert_same(model.state_dict(), want)


# ---- strictness: refused loads leave the model as it was -----------------------------------------


def header_file(header, data=b"", hlen=None, text=None):
    text = (json.dumps(header) if text is None else text).encode() if not isinstance(text, bytes) else text
    return struct.pack("<Q", len(text) if hlen is None else hlen) + text + data


def f32(shape, begin):
    return {"dtype": "F32", "shape": shape, "data_offsets": [begin, begin + 4 * int(np.prod(shape))]}


LYING = {
    "empty": b"",
    "shorter than the length": b"\x10\x00\x00",
    "header length beyond the file": header_file({"a": f32([2], 0)}, b"\0" * 8, hlen=10_000),
    "absurd header length": header_file({}, hlen=2**62),
    "not json": header_file(None, text="{this is not json}"),
    "not utf-8": header_file(None, text=b"{\xff\xfe}"),
    "not an object": header_file(None, text="[1, 2]"),
    "nan": header_file(None, text='{"a": {"dtype": "F32", "shape": [NaN], "data_offsets": [0, 4]}}'),
    "duplicate key": header_file(
        None, b"\0" * 8, text='{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, '
        '"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}'
    ),
    "offsets out of the file": header_file({"a": f32([2], 0), "b": f32([2], 8)}, b"\0" * 12),
    "oversized tensor": header_file({"a": {"dtype": "F32", "shape": [2**40], "data_offsets": [0, 2**42]}}, b"\0" * 8),
    "overlapping": header_file({"a": f32([2], 0), "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 16),
    "gap": header_file({"a": f32([2], 0), "b": f32([2], 12)}, b"\0" * 20),
    "trailing data": header_file({"a": f32([2], 0), "b": f32([2], 8)}, b"\0" * 24),
    "truncated data": header_file({"a": f32([2], 0), "b": f32([2], 8)}, b"\0" * 15),
    "dtype size mismatch": header_file({"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
    "shape size mismatch": header_file({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8),
    "reversed offsets": header_file({"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 0]}}, b"\0" * 8),
    "float offsets": header_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0.0, 8.0]}}, b"\0" * 8),
    "negative dim": header_file({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 0]}}),
    "unknown dtype": header_file({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 1]}}, b"\0"),
    "extra field": header_file({"a": dict(f32([2], 0), extra=1)}, b"\0" * 8),
    "metadata not strings": header_file({"__metadata__": {"format": 1}}),
}


@pytest.mark.parametrize("case", list(LYING))
def test_lying_headers_are_refused_and_change_nothing(model, tmp_path, case):
    model.load_state_dict(torch_zoo(6).state_dict())
    before = model.params()
    path = tmp_path / "bad.safetensors"
    path.write_bytes(LYING[case])
    for src in (path, LYING[case]):
        with pytest.raises(ValueError, match="not a (valid )?safetensors file"):
            model.load_safetensors(src)
    assert_same(model.params(), before)


def test_truncated_files_are_refused_and_change_nothing(model, tmp_path):
    model.save_safetensors(tmp_path / "w.safetensors", layout="torch")
    whole = (tmp_path / "w.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", whole[:8])
    model.load_state_dict(torch_zoo(11).state_dict())
    before = model.params()
    for cut in (0, 5, 8, 8 + n // 2, 8 + n - 1, 8 + n, 8 + n + 3, len(whole) - 1):
        (tmp_path / "cut.safetensors").write_bytes(whole[:cut])
        with pytest.raises(ValueError, match="not a (valid )?safetensors file"):
            model.load_safetensors(tmp_path / "cut.safetensors", layout="torch")
    assert_same(model.params(), before)
    model.load_safetensors(whole, layout="torch")  # the whole file loads
    assert not np.array_equal(model.params()["lin.W"], before["lin.W"])


def test_valid_files_that_do_not_fit_are_refused_and_change_nothing(model, tmp_path):
    before = model.params()
    sd = np_sd(torch_zoo(7))
    cases = [
        (dict(sd, extra=np.zeros(1000, np.float32)), KeyError, "unknown parameter.*'extra'"),  # a larger file
        ({k: v for k, v in sd.items() if k != "ln.bias"}, KeyError, "missing parameter.*'ln.bias'.*partial=True"),
        (dict(sd, **{"lin.weight": sd["lin.weight"].T.copy()}), ValueError, r"'lin.weight' expects shape \(5, 6\)"),
        (dict(sd, **{"emb.weight": sd["emb.weight"].astype(np.int32)}), TypeError, "I32.*no integer parameters"),
        (dict(sd, **{"scale": sd["scale"].astype(np.int64)}), TypeError, "I64"),
    ]
    for tensors, error, message in cases:
        with pytest.raises(error, match=message):
            model.load_safetensors(st_numpy.save(tensors), layout="torch")
        if error is not TypeError:  # integer arrays would load through a state_dict, as in load_params
            with pytest.raises(error, match=message):
                model.load_state_dict(tensors)
    with pytest.raises(KeyError, match="pass layout='torch'"):
        model.load_safetensors(st_numpy.save(sd))
    with pytest.raises(ValueError, match="layout must be"):
        model.load_state_dict(sd, layout="pytorch")
    assert_same(model.params(), before)


def test_partial_loads_a_subset_and_leaves_the_rest(model):
    before = model.params()
    sd = np_sd(torch_zoo(8))
    subset = {k: sd[k] for k in ("ln.weight", "ln.bias", "lin.weight")}
    model.load_state_dict(subset, partial=True)
    after = model.params()
    np.testing.assert_array_equal(after["ln.g"], sd["ln.weight"])
    np.testing.assert_array_equal(after["lin.W"], sd["lin.weight"].T)
    for k in before:
        if k not in ("ln.g", "ln.b", "lin.W"):
            np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    model.reset()
    model.load_safetensors(st_numpy.save({"rms.g": sd["rms.weight"]}), partial=True)
    np.testing.assert_array_equal(model.params()["rms.g"], sd["rms.weight"])
    with pytest.raises(KeyError, match="unknown"):  # partial still refuses unknown names
        model.load_state_dict(dict(subset, nope=np.zeros(1)), partial=True)


def test_rename_by_function_and_by_prefix(model, tmp_path):
    sd = np_sd(torch_zoo(9))
    theirs = {("encoder.layers." + k[len("blocks.") :] if k.startswith("blocks.") else "net." + k): v for k, v in sd.items()}
    theirs["net.num_batches_tracked"] = np.array(3)
    model.load_state_dict(theirs, rename={"encoder.layers.": "blocks.", "net.": "", "net.num_batches": None})
    assert_same(model.state_dict(), sd)
    model.reset()

    def fn(name):
        if name.endswith("num_batches_tracked"):
            return None  # leave it out
        return name.replace("encoder.layers.", "blocks.").removeprefix("net.")

    model.load_state_dict(theirs, rename=fn)
    assert_same(model.state_dict(), sd)
    # the way out: rename maps this model's names to the file's
    out = {"blocks.": "encoder.layers.", "": "net."}
    assert_same(model.state_dict(rename=out), {k: v for k, v in theirs.items() if "num_batches" not in k})
    model.save_safetensors(tmp_path / "r.safetensors", layout="torch", rename=out)
    model.reset()
    model.load_safetensors(tmp_path / "r.safetensors", layout="torch", rename=fn)
    assert_same(model.state_dict(), sd)
    with pytest.raises(ValueError, match="both rename to"):
        model.load_state_dict(theirs, rename=lambda n: "same")
    with pytest.raises(TypeError, match="rename"):
        model.load_state_dict(theirs, rename=lambda n: 3)
    (tmp_path / "r.safetensors").write_bytes(b"keep")
    with pytest.raises(ValueError, match="both rename to"):  # refused before the file is touched
        model.save_safetensors(tmp_path / "r.safetensors", rename=lambda n: "same")
    assert (tmp_path / "r.safetensors").read_bytes() == b"keep"


# ---- python -m aot convert -------------------------------------------------------------------------


def test_convert_round_trips_checkpoints_bit_exact(model, model_file, tmp_path, capsys):
    model.load_state_dict(torch_zoo(10).state_dict())
    params = model.params()
    model.save(tmp_path / "ckpt.npz")
    ckpt, a, t, b, c = (str(tmp_path / n) for n in ("ckpt.npz", "a.safetensors", "t.safetensors", "b.npz", "c.npz"))
    assert cli.main(["convert", ckpt, a]) == 0
    assert_same(st_numpy.load_file(a), params)
    assert cli.main(["convert", a, b]) == 0
    assert_same(dict(np.load(b)), params)
    assert cli.main(["convert", ckpt, t, "--layout", "torch", "--model", str(model_file)]) == 0
    back = TorchZoo()
    back.load_state_dict(st_torch.load_file(t))
    assert_same(np_sd(back), model.state_dict())
    assert cli.main(["convert", t, c, "--layout", "torch", "--model", str(model_file)]) == 0
    assert_same(dict(np.load(c)), params)
    model.reset()
    model.load_params(dict(np.load(c)))
    assert_same(model.params(), params)
    assert cli.main(["convert", b, str(tmp_path / "plain.safetensors")]) == 0  # a plain .npz
    assert_same(st_numpy.load_file(str(tmp_path / "plain.safetensors")), params)
    with pytest.raises(SystemExit, match="needs the model"):
        cli.main(["convert", ckpt, t, "--layout", "torch"])
    with pytest.raises(SystemExit, match="unknown parameter"):
        cli.main(["convert", t, c, "--model", str(model_file)])
    with pytest.raises(SystemExit, match=".npz -> .safetensors or"):
        cli.main(["convert", ckpt, c])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["convert", "--help"])
    assert "--model" in capsys.readouterr().out


# ---- the example ------------------------------------------------------------------------------------


def test_torch_interop_example():
    mod = runpy.run_path(str(ROOT / "examples" / "torch_interop.py"))
    err_in, err_out = mod["main"](torch_steps=20, aot_steps=3, log=lambda msg: None)
    assert err_in < 1e-4 and err_out < 1e-4
