"""`python -m aot`: build, inspect, help and the errors a user meets first."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "aot", *args], capture_output=True, text=True, cwd=cwd or ROOT)


def test_help_lists_the_commands():
    r = run("--help")
    assert r.returncode == 0 and "build" in r.stdout and "inspect" in r.stdout
    r = run("build", "--help")
    assert "--program" in r.stdout and "-o" in r.stdout and "--force" in r.stdout


def test_build_writes_the_project_with_progress_lines(tmp_path):
    r = run("build", "examples/sine_mlp.py", "-o", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "traced" in r.stdout and "kernels" in r.stdout and "wrote" in r.stdout
    assert (tmp_path / "sine_mlp" / "pyproject.toml").exists()
    assert (tmp_path / "sine_mlp" / "sine_mlp" / "__init__.py").exists()


def test_unknown_program_names_the_candidates(tmp_path):
    r = run("build", "examples/sine_mlp.py", "--program", "mlp", "-o", str(tmp_path))
    assert r.returncode != 0 and "unknown program 'mlp'" in r.stderr and "sine_mlp" in r.stderr


def test_a_file_without_a_program_is_a_clear_error(tmp_path):
    f = tmp_path / "model.py"
    f.write_text("import aot\nx = 1\n")
    r = run("build", str(f), "-o", str(tmp_path))
    assert r.returncode != 0 and "defines no aot.Program" in r.stderr


def test_shape_errors_name_the_users_line(tmp_path):
    f = tmp_path / "bad.py"
    f.write_text(textwrap.dedent("""\
        import aot
        from aot import nn, ops

        class M(aot.Module):
            def __init__(self):
                super().__init__()
                self.l = nn.Linear(3, 4)

        def loss(m, x):
            return ops.mean(m.l(x))

        program = aot.Program("bad", model=M, train=aot.Train(loss, {"x": aot.f32(8, 5)}))
        """))
    r = run("build", str(f), "-o", str(tmp_path))
    assert r.returncode == 1
    assert "ShapeError" in r.stderr and "matmul" in r.stderr and "bad.py:10" in r.stderr  # where the Linear is called


def test_inspect_prints_ir_kernels_and_buffers():
    r = run("inspect", "examples/sine_mlp.py", "--entry", "predict")
    assert r.returncode == 0, r.stderr
    # the first layer's [B, 1] @ [1, 64] is a broadcast product (passes.outer_products)
    assert "graph sine_mlp.predict[B=1]:" in r.stdout and "= mul t0, l1.W" in r.stdout and "= matmul t4, l2.W" in r.stdout
    assert "kernels (3, in 3 dispatches on GPUs):" in r.stdout and "planned, lower bound" in r.stdout and "largest:" in r.stdout
    r = run("inspect", "examples/sine_mlp.py", "--entry", "train")
    assert "kernels (11, in 7 dispatches on GPUs):" in r.stdout
    assert "dispatch train_08_09_sum_and_matmul: train_08_sum, train_09_matmul" in r.stdout
    assert "CPU set: 11 dispatches, " in r.stdout
    # the addition transformer's blocks repeat kernels at other offsets: the CPU set compiles each once
    r = run("inspect", "examples/addition_transformer.py", "--entry", "train")
    total, n = map(int, re.search(r"CPU set: (\d+) dispatches, (\d+) distinct kernels to compile", r.stdout).groups())
    assert n < 100 < total, (total, n)
    # its attention (forward, dq with delta, dk with dv: a dispatch each per block) has subgroup
    # variants; sine_mlp none
    assert "subgroup set: 9 of the GPU set's dispatches run a variant with subgroup operations" in r.stdout
    r = run("inspect", "examples/sine_mlp.py", "--entry", "train")
    assert "subgroup set: 0 of the GPU set's dispatches" in r.stdout


def test_build_no_merge_gives_every_kernel_a_dispatch(tmp_path):
    for flags, n, cpu_list in (((), 7, True), (("--no-merge",), 11, False)):
        out = tmp_path / str(n)
        r = run("build", "examples/sine_mlp.py", "-o", str(out), *flags)
        assert r.returncode == 0, r.stderr
        ns: dict = {}
        exec((out / "sine_mlp" / "sine_mlp" / "plan.py").read_text(), ns)  # plain literals
        train = ns["PROGRAM"]["entries"]["train"]
        assert len(train["dispatches"]) == n
        # the CPU list: every kernel, with its CPU variant's grid (there with --no-merge too:
        # sine_mlp's matmuls run other tiles, so other grids, on a CPU adapter)
        assert "dispatches_cpu" in train and len(train["dispatches_cpu"]) == 11
        if not cpu_list:
            assert [k for k, _ in train["dispatches_cpu"]] == [k for k, _ in train["dispatches"]]
            assert [g for _, g in train["dispatches_cpu"]] != [g for _, g in train["dispatches"]]


@pytest.mark.gpu
def test_shader_compile_errors_name_kernel_line_and_call_site():
    from aot.runtime.engine import Engine, ShaderError

    wgsl = "@compute @workgroup_size(1)\nfn main() {\n    let x: f32 = undefined_thing;\n}\n"
    entry = {"dispatches": [("k000_bad", (1, 1, 1))], "outputs": [], "captures": [], "copies": []}
    engine = Engine("t", {"k000_bad": wgsl}, {"k000_bad": ((), "model.py:12")}, {"work": 4}, {"train": entry})
    with pytest.raises(ShaderError) as e:  # at the entry point's first call, which makes its pipelines
        engine.run("train", {}, False)
    msg = str(e.value)
    assert "k000_bad" in msg and "model.py:12" in msg and "undefined_thing" in msg
    # among good kernels, whose pipelines are created on several threads: the bad one is named
    good = "@compute @workgroup_size(1)\nfn main() {\n}\n"
    names = [f"k{i:03d}_{'bad' if i == 5 else 'ok'}" for i in range(12)]
    entry = dict(entry, dispatches=[(n, (1, 1, 1)) for n in names])
    sources = {n: wgsl if n.endswith("bad") else good for n in names}
    sites = {n: ((), f"model.py:{20 + i}") for i, n in enumerate(names)}
    engine = Engine("t", sources, sites, {"work": 4}, {"train": entry})
    with pytest.raises(ShaderError) as e:
        engine.run("train", {}, False)
    assert "k005_bad" in str(e.value) and "model.py:25" in str(e.value)
    assert "train" not in engine.recipes  # nothing was dispatched
