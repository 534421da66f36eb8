"""Issue 33 (robust under real use), `python -m aot convert`: float8 tensors, archives that would
inflate far past the model's size, and one-line errors for paths it cannot use."""

from __future__ import annotations

import io
import json
import struct
import zipfile

import numpy as np
import pytest

from aot import cli

MODEL = '''
import aot
from aot import nn, ops


class Net(aot.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(3, 2)


program = aot.Program(
    "convert_probe", model=Net,
    infer={"predict": aot.Infer(lambda m, x: m.l1(x), inputs={"x": aot.f32(1, 3)})},
)
'''


def _convert(*args) -> str:
    """Run convert; return its one-line refusal."""
    with pytest.raises(SystemExit) as e:
        cli.main(["convert", *map(str, args)])
    msg = str(e.value.code)
    assert msg.startswith("aot: ") and "\n" not in msg, msg
    return msg


def _safetensors(path, tensors: dict) -> None:
    """tensors: {name: (dtype code, shape, raw bytes)}."""
    header, data = {}, b""
    for name, (code, shape, raw) in tensors.items():
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def test_convert_refuses_float8_tensors(tmp_path):
    """F8 tensors were written to the .npz as uint8 byte codes, which load_params takes as weights."""
    src = tmp_path / "f8.safetensors"
    _safetensors(src, {"w": ("F8_E4M3", (2, 3), bytes(range(6))), "b": ("F32", (2,), np.ones(2, np.float32).tobytes())})
    msg = _convert(src, tmp_path / "out.npz")
    assert "'w'" in msg and "F8_E4M3" in msg
    assert not (tmp_path / "out.npz").exists()


def test_convert_with_model_checks_shapes_before_inflating(tmp_path, monkeypatch):
    """A small .npz whose member declares 64 MiB was inflated whole before its shape was compared
    with the model's; the headers are now checked first."""
    model = tmp_path / "m.py"
    model.write_text(MODEL)
    src = tmp_path / "bomb.npz"
    with zipfile.ZipFile(src, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("l1.W.npy", "w", force_zip64=True) as m:
            np.lib.format.write_array_header_1_0(m, {"descr": "<f4", "fortran_order": False, "shape": (4096, 4096)})
            zero = bytes(1 << 20)
            for _ in range(64):
                m.write(zero)
        bias = io.BytesIO()
        np.save(bias, np.zeros(2, np.float32))
        zf.writestr("l1.b.npy", bias.getvalue())
    assert src.stat().st_size < 1 << 20
    inflated = [0]
    real = zipfile.ZipExtFile.read

    def counting(self, n=-1):
        out = real(self, n)
        inflated[0] += len(out)
        return out

    monkeypatch.setattr(zipfile.ZipExtFile, "read", counting)
    msg = _convert(src, tmp_path / "out.safetensors", "--model", model)
    assert inflated[0] < 1 << 20, f"inflated {inflated[0]} bytes before refusing"
    assert "l1.W" in msg and "4096" in msg


def test_convert_paths_it_cannot_use_are_one_line(tmp_path):
    """A folder, a missing destination folder and a random-bytes file printed tracebacks (or
    pointed at numpy's allow_pickle)."""
    good = tmp_path / "ok.npz"
    np.savez(good, w=np.ones((2, 3), np.float32))
    folder = tmp_path / "dir.safetensors"
    folder.mkdir()
    assert "folder" in _convert(folder, tmp_path / "x.npz")
    (tmp_path / "dir.npz").mkdir()
    assert "folder" in _convert(tmp_path / "dir.npz", tmp_path / "x.safetensors")
    assert "folder" in _convert(good, folder)
    msg = _convert(good, tmp_path / "missing" / "x.safetensors")
    assert "missing" in msg and "does not exist" in msg
    noise = tmp_path / "noise.npz"
    noise.write_bytes(np.random.default_rng(0).bytes(4096))
    msg = _convert(noise, tmp_path / "x.safetensors")
    assert "not a .npz" in msg and "pickle" not in msg
    noise_st = tmp_path / "noise.safetensors"
    noise_st.write_bytes(noise.read_bytes())
    _convert(noise_st, tmp_path / "x.npz")
    assert "no such file" in _convert(tmp_path / "absent.npz", tmp_path / "x.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.npz", "dir.safetensors", "noise.npz", "noise.safetensors", "ok.npz"]
