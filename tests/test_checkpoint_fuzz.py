"""restore() against damaged and hostile checkpoints (issue 9, items 2 and 6).

A real checkpoint of a tiny program is corrupted 1,000 ways: bit flips and byte overwrites
anywhere in the file, truncation, members swapped, missing, duplicated, renamed or added,
wrong dtypes and shapes, out-of-range values, hostile lr strings, huge .npy headers and zip
sizes. Each restore() must either raise, leaving the model bit-identical to before (params,
optimizer state, gradients, step count, seed, lr and its origin), or restore exactly what the
file holds (read back with numpy as the oracle), and its memory (tracemalloc peak) stays small.
"""

from __future__ import annotations

import ast
import io
import tracemalloc
import zipfile

import numpy as np
import pytest

import aot
from aot import nn, ops
from aot.runtime.schedules import normalize

pytestmark = pytest.mark.gpu

N_CASES = 1000
PEAK_LIMIT = 3 * 2**20  # bytes a restore may allocate at its peak (the checkpoint is ~3 KB)


class Tiny(aot.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(3, 4)  # every parameter has a shape of its own, so a swap shows
        self.b = nn.Linear(4, 2)


def loss(m, x, y):
    return ops.mean(ops.square(m.b(ops.relu(m.a(x))) - y))


PROGRAM = aot.Program(
    "fuzz_tiny",
    model=Tiny,
    train=aot.Train(loss, {"x": aot.f32(5, 3), "y": aot.f32(5, 2)},
                    optimizer=aot.optim.AdamW(lr=aot.lr.cosine(1e-2, 1e-3, 50))),
    seed=7,
)
BATCH = {"x": np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3), "y": np.ones((5, 2), np.float32)}


def optimizer_state(m) -> np.ndarray:
    """All optimizer state, in checkpoint order (one `state` buffer, or `state`, `state_1`, ...)."""
    arenas = [(a, n) for a, n in m._program["arenas"].items() if n and (a == "state" or a.startswith("state_"))]
    return np.concatenate([np.zeros(0, np.float32)] + [m._engine.read(a, 0, n) for a, n in arenas])


def state_of(m) -> dict:
    return {
        "params": m.params(), "grads": m.grads(), "state": optimizer_state(m),
        "step_count": m.step_count, "seed": m.seed, "lr": m.lr, "origin": m._lr_origin,
    }


def assert_same(a: dict, b: dict, what: str):
    for k in ("step_count", "seed", "lr", "origin"):
        assert a[k] == b[k] and type(a[k]) is type(b[k]), (what, k, a[k], b[k])
    for k in a["params"]:
        assert a["params"][k].tobytes() == b["params"][k].tobytes(), (what, k)
    assert a["state"].tobytes() == b["state"].tobytes(), what
    if "grads" in b:
        for k in a["grads"]:
            assert a["grads"][k].tobytes() == b["grads"][k].tobytes(), (what, k)


def oracle(path) -> dict:
    """What a checkpoint file holds, read by numpy (only for files restore() accepted)."""
    with np.load(path, allow_pickle=False) as z:
        return {
            "params": {k[len("param/"):]: z[k].astype(np.float32) for k in z.files if k.startswith("param/")},
            "state": z["__state__"].astype(np.float32),
            "step_count": int(z["__step_count__"]), "seed": int(z["__seed__"]),
            "lr": normalize(ast.literal_eval(str(z["__lr__"]))), "origin": int(z["__lr_origin__"]),
        }


# ---- building damaged files ---------------------------------------------------------------------


def npy(value) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asanyarray(value), allow_pickle=False)
    return buf.getvalue()


def members_of(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist()}


def archive(members, compression=zipfile.ZIP_STORED) -> bytes:
    """A valid zip (CRCs right) of (name, bytes) pairs; duplicates allowed."""
    import warnings

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about duplicate names
        with zipfile.ZipFile(buf, "w", compression) as zf:
            for name, data in (members.items() if isinstance(members, dict) else members):
                zf.writestr(name, data)
    return buf.getvalue()


def npy_with_header(header: str, payload: bytes = b"", version=1) -> bytes:
    text = header.encode("latin1")
    text += b" " * (-(len(text) + 11) % 64) + b"\n"
    size = len(text).to_bytes(2 if version == 1 else 4, "little")
    return b"\x93NUMPY" + bytes([version, 0]) + size + text + payload


def structured_cases(good: bytes) -> list[tuple[str, bytes]]:
    """Named corruptions of the checkpoint's structure and values (each valid as a zip)."""
    m = members_of(good)
    names = list(m)
    with_ = lambda **kw: archive({**m, **{k.replace("__p__", "param/") + ".npy": v for k, v in kw.items()}})  # noqa: E731
    cases = []
    for n in names:
        cases.append((f"missing {n}", archive({k: v for k, v in m.items() if k != n})))
        cases.append((f"duplicated {n}", archive(list(m.items()) + [(n, m[n])])))
        cases.append((f"{n} without .npy", archive({(k[:-4] if k == n else k): v for k, v in m.items()})))
        cases.append((f"{n} both with and without .npy", archive({**m, n[:-4]: m[n]})))
        cases.append((f"{n} empty", archive({**m, n: b""})))
        cases.append((f"{n} 2-byte npy", archive({**m, n: m[n][:2]})))
        cases.append((f"{n} header only", archive({**m, n: m[n][:128]})))
        cases.append((f"{n} huge shape", archive({**m, n: npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (536870912, 2), }")})))
        cases.append((f"{n} huge header", archive({**m, n: npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), " + " " * 60000 + "}")})))
        cases.append((f"{n} v2 header", archive({**m, n: npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", b"\0" * 8, 2)})))
        cases.append((f"{n} header not a dict", archive({**m, n: npy_with_header("[1, 2, 3]")})))
        cases.append((f"{n} header code", archive({**m, n: npy_with_header("__import__('os').system('false')")})))
        cases.append((f"{n} object dtype", archive({**m, n: npy_with_header("{'descr': '|O', 'fortran_order': False, 'shape': (), }", b"\x80\x04N.")})))
        cases.append((f"{n} from the front", archive([(n, m[n])] + [(k, v) for k, v in m.items() if k != n])))  # valid
        for other in names:
            if other != n:
                cases.append((f"swapped {n} and {other}", archive({**m, n: m[other], other: m[n]})))
    for k, v in m.items():
        if k.startswith("param/"):
            a = np.load(io.BytesIO(v))
            cases += [
                (f"{k} float64", archive({**m, k: npy(a.astype(np.float64))})),
                (f"{k} float16", archive({**m, k: npy(a.astype(np.float16))})),
                (f"{k} int32", archive({**m, k: npy(a.astype(np.int32))})),
                (f"{k} transposed", archive({**m, k: npy(a.T.copy())})),
                (f"{k} one more row", archive({**m, k: npy(np.concatenate([a, a[:1]]))})),
                (f"{k} as a string", archive({**m, k: npy(np.array("0.5"))})),
                (f"{k} big-endian", archive({**m, k: npy(a.astype(">f4"))})),  # valid, same values
                (f"{k} fortran order", archive({**m, k: npy(np.asfortranarray(a))})),  # valid, same values
            ]
    bad_values = {
        "__step_count__": [np.int64(-1), np.int64(-(2**63)), np.int64(2**62), np.uint64(3), np.float64(2.0), np.array([2]), np.int32(2), np.array("2")],
        "__lr_origin__": [np.int64(-1), np.int64(10**6), np.float64(0.0), np.array("0")],
        "__seed__": [np.int64(-1), np.float64(7.0), np.array("7"), np.bool_(True), np.array([7, 7], np.uint64), np.int32(7)],
        "__program__": [np.array("other"), np.array(""), np.array("x" * 2000), np.float64(1)],
        "__fingerprint__": [np.array("0" * 40), np.array(b"ab"), np.int64(1)],
        "__state__": [np.zeros(5, np.float32), np.zeros((2, 3), np.float32), np.zeros(48, np.float64)],
        "__lr__": [np.array(t) for t in (
            "__import__('os').system('false')", "1e999", "-1.0", "nan", "None", "[1, 2]", "'0.1'",
            "('linear', 1e-3, -1.0, 10)", "('linear', 1e-3, 0.0, 2.5)", "('step', 1e-3, 0, 0.5)",
            "('warmup', 0.1, 5, " * 60 + "0.1" + ")" * 60, "(" * 300 + ")" * 300, "x" * 40000,
            "{'kind': 'linear', 'peak': 1}", "('multistep', 0.1, tuple(range(5)), 0.1)", "lambda: 0",
            "('cosine', 0.01, 0.001, 50, 1)", "0.1 if True else 0", "[" * 100000,
        )] + [np.float64(0.1), np.array(["0.1"])],
    }
    for member, values in bad_values.items():
        for i, v in enumerate(values):
            cases.append((f"{member} bad value {i}", archive({**m, member + ".npy": npy(v)})))
    valid_variants = {  # a checkpoint that differs from the good one but is fine: restored as it says
        "__step_count__": np.int64(9), "__seed__": np.uint64(2**64 - 1), "__lr__": np.array("('linear', 0.5, 0.0, 3)"),
    }
    for member, v in valid_variants.items():
        cases.append((f"{member} other valid value", archive({**m, member + ".npy": npy(v)})))
    cases.append(("legacy int64 seed", archive({**m, "__seed__.npy": npy(np.int64(7))})))
    cases += [
        ("extra member", archive({**m, "__extra__.npy": npy(np.zeros(3))})),
        ("extra parameter", archive({**m, "param/c.W.npy": npy(np.zeros(3, np.float32))})),
        ("directory entry", archive({**m, "param/": b""})),
        ("deflated", archive(m, zipfile.ZIP_DEFLATED)),  # valid
        ("deflate bomb", archive({**m, "param/a.W.npy": m["param/a.W.npy"][:128] + b"\0" * (8 * 2**20)}, zipfile.ZIP_DEFLATED)),
        ("bzip2", archive(m, zipfile.ZIP_BZIP2)),
        ("empty zip", archive({})),
        ("junk before", b"junk" * 10 + good),
        ("junk after", good + b"\0" * 100),
        ("empty file", b""),
        ("npy file", npy(np.zeros(3))),
        ("random", np.random.default_rng(0).bytes(len(good))),
        ("2 MB of zeros", b"PK\x03\x04" + b"\0" * (2 * 2**20)),
    ]
    return cases


def lying_sizes(good: bytes) -> list[tuple[str, bytes]]:
    """The central directory claims other sizes for a member (its data and CRC untouched)."""
    out = []
    pos, k = good.find(b"PK\x01\x02"), 0
    while pos >= 0 and k < 6:
        for field, offset in (("compressed", 20), ("uncompressed", 24)):
            for value in (0, 1, 2**31, 0xFFFFFFFE):
                b = bytearray(good)
                b[pos + offset : pos + offset + 4] = value.to_bytes(4, "little")
                out.append((f"central entry {k}: {field} size {value}", bytes(b)))
        pos, k = good.find(b"PK\x01\x02", pos + 4), k + 1
    return out


def random_cases(good: bytes, n: int, rng) -> list[tuple[str, bytes]]:
    m = members_of(good)
    names = list(m)
    out = []
    for i in range(n):
        how = i % 6
        if how == 0:  # bit flips anywhere in the file
            b = bytearray(good)
            for _ in range(int(rng.integers(1, 4))):
                pos = int(rng.integers(0, len(b)))
                b[pos] ^= 1 << int(rng.integers(0, 8))
            out.append((f"bit flips {i}", bytes(b)))
        elif how == 1:  # truncation
            out.append((f"truncated {i}", good[: int(rng.integers(0, len(good)))]))
        elif how == 2:  # random bytes written over a random stretch
            b = bytearray(good)
            pos, k = int(rng.integers(0, len(b))), int(rng.integers(1, 64))
            b[pos : pos + k] = rng.bytes(min(k, len(b) - pos))
            out.append((f"overwritten {i}", bytes(b)))
        elif how == 3:  # a stretch cut out or repeated
            pos, k = int(rng.integers(0, len(good))), int(rng.integers(1, 200))
            b = good[:pos] + good[pos + k :] if rng.random() < 0.5 else good[:pos] + good[pos : pos + k] + good[pos:]
            out.append((f"spliced {i}", b))
        else:  # inside one member, zip rebuilt with valid CRCs: the .npy header and values are all that guard
            name = names[int(rng.integers(0, len(names)))]
            data = bytearray(m[name])
            limit = len(data) if how == 4 else min(len(data), 128)
            for _ in range(int(rng.integers(1, 4))):
                pos = int(rng.integers(0, max(limit, 1)))
                if pos < len(data):
                    data[pos] ^= 1 << int(rng.integers(0, 8))
            out.append((f"member {name} flipped {i}", archive({**m, name: bytes(data)})))
    return out


# ---- the tests ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    model = aot.compile(PROGRAM)
    model.set_lr(aot.lr.warmup(1e-2, 2, aot.lr.step(5e-3, 2, 0.5)))
    for _ in range(3):
        model.step(**BATCH)
    model.save(tmp / "good.npz")  # the checkpoint being damaged
    model.step(**BATCH)
    model.save(tmp / "before.npz")  # the model's state while the damaged files are tried
    before = state_of(model)
    assert before["state"].size == 2 * 26 and before["state"].any()  # AdamW's m and v are all compared
    yield model, tmp, (tmp / "good.npz").read_bytes(), before
    model.close()


def try_restore(model, path, before, what):
    """restore() must raise with the model untouched, or restore exactly what the file holds."""
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    try:
        model.restore(path)
    except (ValueError, KeyError) as e:
        _, peak = tracemalloc.get_traced_memory()
        assert_same(state_of(model), before, what)
        ok = False
        message = str(e)
    else:
        _, peak = tracemalloc.get_traced_memory()
        assert_same(state_of(model), oracle(path), what)
        model.restore(path.parent / "before.npz")
        assert_same(state_of(model), before, what + " (back to before)")
        ok, message = True, ""
    assert peak - base < PEAK_LIMIT, (what, peak - base)
    return ok, message


def test_restore_survives_a_thousand_corruptions(setup):
    model, tmp, good, before = setup
    rng = np.random.default_rng(2024)
    cases = structured_cases(good) + lying_sizes(good)
    cases += random_cases(good, N_CASES - len(cases), rng)
    assert len(cases) >= N_CASES
    path = tmp / "damaged.npz"
    accepted = []
    tracemalloc.start()
    try:
        for what, data in cases:
            path.write_bytes(data)
            ok, _ = try_restore(model, path, before, what)
            if ok:
                accepted.append(what)
    finally:
        tracemalloc.stop()
    # the valid variants are accepted, and most damage is not
    for what in ("deflated", "legacy int64 seed", "__seed__ other valid value", "param/a.W.npy big-endian"):
        assert what in accepted, what
    assert len(accepted) < len(cases) // 4, accepted


@pytest.mark.parametrize("member", ["__step_count__", "__seed__", "__lr_origin__", "__lr__", "param/b.b"])
def test_one_flipped_bit_names_the_member_and_changes_nothing(setup, member):
    """The tester's case: one bit of __step_count__, __seed__ or __lr_origin__ flipped used to
    raise BadZipFile after params and optimizer state had been overwritten."""
    model, tmp, good, before = setup
    with zipfile.ZipFile(io.BytesIO(good)) as zf:
        info = zf.getinfo(member + ".npy")
    # data of a stored member: after its local header (30 bytes + name + extra field)
    name_len = int.from_bytes(good[info.header_offset + 26 : info.header_offset + 28], "little")
    extra_len = int.from_bytes(good[info.header_offset + 28 : info.header_offset + 30], "little")
    last = info.header_offset + 30 + name_len + extra_len + info.compress_size - 1
    b = bytearray(good)
    b[last] ^= 0x01
    path = tmp / f"flip{member.replace('/', '_')}.npz"
    path.write_bytes(bytes(b))
    with pytest.raises(ValueError, match=member):
        model.restore(path)
    assert_same(state_of(model), before, member)


@pytest.mark.parametrize(
    "member,value,message",
    [
        ("__step_count__", np.int64(-1), "step count >= 0"),
        ("__seed__", np.int64(-5), "seed"),
        ("__lr_origin__", np.int64(99), "__lr_origin__"),
        ("__lr__", np.array("('cosine', -1.0, 0.0, 10)"), "__lr__"),
    ],
)
def test_valid_archive_with_a_bad_value_is_refused(setup, member, value, message):
    model, tmp, good, before = setup
    path = tmp / "value.npz"
    path.write_bytes(archive({**members_of(good), member + ".npy": npy(value)}))
    with pytest.raises(ValueError, match=member) as e:
        model.restore(path)
    assert message in str(e.value)
    assert_same(state_of(model), before, member)


def test_a_crafted_2mb_checkpoint_is_refused_from_its_headers(setup):
    """2.1 MB that claim gigabytes (a .npy header of a 2**29 x 2 array, a zip entry of 4 GB):
    refused from the headers, without allocating what they claim."""
    model, tmp, good, before = setup
    m = members_of(good)
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (536870912, 2), }"
    big = archive({**m, "param/a.W.npy": npy_with_header(header, b"\0" * (2 * 2**20 + 100_000))})
    small = archive({**m, "param/a.W.npy": npy_with_header(header, b"\0" * 64)})
    assert len(big) > 2 * 2**20
    tracemalloc.start()
    try:
        for name, data in (("big.npz", big), ("small.npz", small)):
            (tmp / name).write_bytes(data)
            tracemalloc.reset_peak()
            with pytest.raises(ValueError) as e:
                model.restore(tmp / name)
            _, peak = tracemalloc.get_traced_memory()
            assert peak < 2**20, (name, peak)
            assert "bytes" in str(e.value) or "shape" in str(e.value)
    finally:
        tracemalloc.stop()
    assert_same(state_of(model), before, "crafted")


def test_good_checkpoints_still_restore_exactly(setup):
    model, tmp, good, before = setup
    model.restore(tmp / "good.npz")
    assert_same(state_of(model), oracle(tmp / "good.npz"), "good")
    assert model.step_count == 3 and model.seed == 7
    model.restore(tmp / "before.npz")
    assert_same(state_of(model), before, "before")
