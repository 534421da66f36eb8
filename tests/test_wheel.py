"""A generated package builds into a wheel that installs and trains in a fresh venv with only wgpu + numpy."""

import os
import subprocess
import sys
import sysconfig
import textwrap
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """
    import importlib.util, numpy as np
    assert importlib.util.find_spec("aot") is None, "aot must not be installed here"
    import sine_mlp
    m = sine_mlp.Model()
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(200):
        x = rng.uniform(-np.pi, np.pi, (256, 1)).astype(np.float32)
        losses.append(m.step(x=x, y=np.sin(x)))
    assert losses[-1] < losses[0] / 4, losses
    print("ok", losses[0], losses[-1], m.predict(x=np.zeros((1, 1), np.float32)).shape)
    """
)


@pytest.mark.slow
def test_wheel_installs_and_trains_without_aot(tmp_path):
    from aot.pipeline import build
    from aot.cli import load_programs

    (prog,) = load_programs(str(ROOT / "examples" / "sine_mlp.py")).values()
    proj = build(prog, tmp_path / "gen", source_name="sine_mlp.py")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(proj)],
        check=True, capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("sine_mlp-*.whl")
    env_dir = tmp_path / "deploy"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel)], check=True, capture_output=True)
    r = subprocess.run([str(py), "-c", SCRIPT], capture_output=True, text=True, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=""))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("ok")


@pytest.mark.slow
def test_a_wheel_of_aot_builds_the_examples_in_a_clean_venv(tmp_path):
    """`pip install .` (not editable): the templates are package data, so the installed compiler
    builds packages with no source checkout beside it."""
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(ROOT)],
        check=True, capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("aot-*.whl")
    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # aot's dependencies (numpy, jinja2, black, wgpu) from the test environment, without a download:
    # a plain path line in a .pth file adds that folder but runs none of its own .pth hooks, so the
    # editable aot of the test environment stays out and `import aot` finds the installed wheel
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    work = tmp_path / "work"
    work.mkdir()
    (work / "model.py").write_text((ROOT / "examples" / "sine_mlp.py").read_text())
    # the example names its web demo script (Program(web={"demo": ...})), relative to itself
    (work / "sine_mlp.demo.js").write_text((ROOT / "examples" / "sine_mlp.demo.js").read_text())
    r = subprocess.run(
        [str(py), "-c", "import aot, sys; print(aot.__file__); sys.exit(__import__('aot.cli').cli.main(['build', 'model.py', '-o', 'out']))"],
        capture_output=True, text=True, cwd=work, env=dict(os.environ, PYTHONPATH=""),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert str(env_dir) in r.stdout.splitlines()[0], r.stdout  # the installed aot, not the checkout
    assert (work / "out" / "sine_mlp" / "sine_mlp" / "kernels.py").exists()
