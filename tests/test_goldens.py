"""generated/ is rebuilt from examples/ and must match byte for byte; builds are deterministic."""

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import regen_goldens  # noqa: E402

HINT = "generated/ is out of date: run  python scripts/regen_goldens.py  and commit the diff with a reason."


def _diff(a: Path, b: Path, rel: str) -> str:
    old = a.read_text(encoding="utf-8").splitlines(keepends=True)
    new = b.read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(list(difflib.unified_diff(old, new, f"generated/{rel}", f"rebuilt/{rel}"))[:80])


@pytest.mark.parametrize("name", regen_goldens.EXAMPLES)
def test_golden_package_is_up_to_date(name, tmp_path):
    (fresh,) = regen_goldens.build_examples(tmp_path, [name])
    golden = ROOT / "generated" / fresh.name
    assert golden.exists(), f"generated/{fresh.name} is missing. {HINT}"
    new, old = regen_goldens.tree(fresh), regen_goldens.tree(golden)
    assert set(new) == set(old), f"file sets differ: extra {sorted(set(old) - set(new))}, missing {sorted(set(new) - set(old))}. {HINT}"
    diffs = [_diff(old[r], new[r], r) for r in new if old[r].read_bytes() != new[r].read_bytes()]
    assert not diffs, "\n".join(diffs) + "\n" + HINT


def test_build_is_byte_identical_across_hash_seeds(tmp_path):
    """Set iteration order, hash() or id() leaking into output shows up as a difference here."""
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / seed
        env = dict(os.environ, PYTHONHASHSEED=seed)
        subprocess.run(
            [sys.executable, "-m", "aot", "build", str(ROOT / "examples" / "addition_transformer.py"), "-o", str(out)],
            check=True, env=env, capture_output=True, cwd=ROOT,
        )
        outs.append(out / "addition_transformer")
    a, b = regen_goldens.tree(outs[0]), regen_goldens.tree(outs[1])
    assert set(a) == set(b)
    assert all(a[r].read_bytes() == b[r].read_bytes() for r in a)


def test_generated_python_is_black_formatted():
    import black

    from aot.emit import BLACK_MODE

    for name in regen_goldens.EXAMPLES:
        for p in (ROOT / "generated" / name).rglob("*.py"):
            text = p.read_text(encoding="utf-8")
            assert black.format_str(text, mode=BLACK_MODE) == text, f"{p} is not black-formatted"


def test_unformatted_builds_leave_the_format_cache_alone(tmp_path, monkeypatch):
    """The fuzzer's builds skip black; they must not leave unformatted runtime files in the disk
    cache of black's output, which later builds copy (a 5-minute fuzz run once did, and the
    goldens came out unformatted). Not in test_fuzz.py: its module fixture keeps the fuzzer's
    unformatted builds on."""
    import aot
    import aot.emit
    from aot import ops
    from fuzz_graphs import unformatted_builds

    monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path / "cache"))
    aot.emit._py_cached.cache_clear()

    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.w = self.param((3,))

    prog = aot.Program("cache_probe", model=M, train=aot.Train(lambda m, x: ops.sum(m.w * x), inputs={"x": aot.f32(3)}))
    with unformatted_builds():
        aot.build(prog, str(tmp_path / "raw"))
    assert not list((tmp_path / "cache").rglob("*.py"))
    aot.build(prog, str(tmp_path / "formatted"))
    engine = next((tmp_path / "formatted").rglob("engine.py")).read_text()
    import black

    assert black.format_str(engine, mode=aot.emit.BLACK_MODE) == engine
    aot.emit._py_cached.cache_clear()
