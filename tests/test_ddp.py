"""Data-parallel training (issue 14): step(allreduce=fn), Model(adapter=...), and the package's
distributed module over torch.distributed (gloo on 127.0.0.1, real subprocesses, lavapipe).

Two ranks with half of every batch each against one process with the whole batch, 10 steps of
Adam with gradient clipping and of SGD with momentum and weight decay: the same losses (mean
over ranks) and parameters; a checkpoint saved by rank 0 and restored by every rank replays the
same steps bit for bit. A killed rank makes the other raise within the timeout; different builds
or parameters are refused at start. In one process: step(allreduce=identity) is bit-identical to
step() (dropout, captures, an lr schedule), a bad allreduce result is refused with nothing
changed, and the adapter is chosen by index or name.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import re
import runpy
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import aot
from aot import nn, ops

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.gpu  # needs a WebGPU adapter (lavapipe on CI)

FULL, IN, HID, OUT, STEPS = 8, 3, 8, 2, 10


class MLP(aot.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(IN, HID, init=aot.init.kaiming())
        self.l2 = nn.Linear(HID, OUT, init=aot.init.randn(0.5))


def mse(m, x, y):
    return ops.mean(ops.square(m.l2(ops.tanh(m.l1(x))) - y))


OPTIMIZERS = {
    "adam": aot.optim.Adam(lr=aot.lr.cosine(3e-2, 1e-3, STEPS), clip_grad_norm=0.05),  # clips every step
    "sgd": aot.optim.SGD(lr=0.05, momentum=0.9, weight_decay=0.01),
}


def program(opt: str, batch: int, seed: int = 3) -> aot.Program:
    inputs = {"x": aot.f32(batch, IN), "y": aot.f32(batch, OUT)}
    return aot.Program(f"ddp_{opt}_{batch}", model=MLP, train=aot.Train(mse, inputs, OPTIMIZERS[opt]), seed=seed)


def data(i: int) -> dict:
    r = np.random.default_rng(100 + i)
    x = r.normal(size=(FULL, IN)).astype(np.float32)
    return {"x": x, "y": np.stack([np.sin(x.sum(1)), np.cos(x[:, 0])], 1).astype(np.float32)}


WORKER = textwrap.dedent("""
    import json, os, signal, sys
    import numpy as np
    job = json.loads(sys.argv[1])
    import importlib
    sys.path.insert(0, os.path.join(job["runs"][0][2] or job["packages"], job["runs"][0][0]))
    dist = importlib.import_module(job["runs"][0][0] + ".distributed")
    rank, world = dist.init(timeout_s=job["timeout"])
    report = {}
    for name, seed, root, *opts in job["runs"]:
        opts = opts[0] if opts else {}
        for k in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[k]  # another build of the same name (another bucket size)
        sys.path.insert(0, os.path.join(root or job["packages"], name))
        pkg = importlib.import_module(name)
        model = pkg.Model(seed=seed)
        label = opts.get("label", name)
        try:
            dist.check_replicas(model)
        except dist.ReplicaMismatch as e:
            report[label] = {"mismatch": str(e)}
            continue
        fn = dist.allreduce_mean(**opts.get("allreduce", {}))
        for attr, value in opts.get("attrs", {}).items():  # the reducer's switches (graphs, nccl_avg)
            setattr(fn, attr, value)
        engine = sys.modules[name + ".engine"]
        engine.BUCKET_MERGE_SHARE = opts.get("merge_share", job.get("merge_share", engine.BUCKET_MERGE_SHARE))
        half = job["batch"] // world
        losses = []
        for i in range(job["steps"]):
            r = np.random.default_rng(100 + i)
            x = r.normal(size=(job["batch"], 3)).astype(np.float32)
            y = np.stack([np.sin(x.sum(1)), np.cos(x[:, 0])], 1).astype(np.float32)
            sl = slice(rank * half, (rank + 1) * half)
            losses.append(dist.mean(model.step(x=x[sl], y=y[sl], allreduce=fn)))
            print(f"rank {rank} step {i + 1}", flush=True)
            if rank == job.get("die_rank") and i + 1 == job.get("die_after"):
                os.kill(os.getpid(), getattr(signal, job.get("signal", "SIGKILL")))
            if i + 1 == job["steps"] // 2:
                dist.save(model, job["ckpt"] + label)
        params = {k: v.tolist() for k, v in model.params().items()}
        dist.restore(model, job["ckpt"] + label)
        replay = []
        for i in range(job["steps"] // 2, job["steps"]):
            r = np.random.default_rng(100 + i)
            x = r.normal(size=(job["batch"], 3)).astype(np.float32)
            y = np.stack([np.sin(x.sum(1)), np.cos(x[:, 0])], 1).astype(np.float32)
            sl = slice(rank * half, (rank + 1) * half)
            replay.append(dist.mean(model.step(x=x[sl], y=y[sl], allreduce=fn)))
        report[label] = {"losses": losses, "replay": replay, "params": params, "steps": model.step_count,
                        "replay_params": {k: v.tolist() for k, v in model.params().items()},
                        "collectives": fn.stats["calls"]}
    print("REPORT " + json.dumps(report), flush=True)
""")


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp_pkgs")
    for opt in OPTIMIZERS:
        for batch in (FULL, FULL // 2):
            aot.build(program(opt, batch), root)
    aot.build(program("sgd", FULL // 2, seed=4), root / "other")  # the same name, another build (seed)
    wide = aot.Program(f"ddp_sgd_{FULL // 2}", model=Wide, train=aot.Train(mse, {"x": aot.f32(FULL // 2, IN), "y": aot.f32(FULL // 2, OUT)}, OPTIMIZERS["sgd"]))
    aot.build(wide, root / "wide")  # the same name, more parameters
    for folder, mib in BUCKETS.items():  # the same build but for its gradient buckets
        aot.build(program("adam", FULL // 2), root / folder, bucket_mib=mib)
    return root


# bucket sizes (MiB) of extra builds of ddp_adam_4, whose 50 gradients (l1.W 24, l1.b 8, l2.W 16,
# l2.b 2) the default 25 MiB puts in one bucket: one per gradient, 104 values at most (3 buckets), one
BUCKETS = {"per_gradient": 0, "small": 4e-4, "huge": 1e6}

# runs of ddp_adam_4 that must give the default run's losses and parameters bit for bit
SAME_AS_DEFAULT = {
    "unbucketed": [None, {"allreduce": {"bucketed": False}}],  # one readback, allreduce_mean() as a function
    **{f"buckets {folder}": [folder, {}] for folder in BUCKETS},
    # one collective for all 4 buckets (engine.bucket_groups with share 1), and one for each
    "merged": ["per_gradient", {"merge_share": 1}],
    "unmerged": ["per_gradient", {"merge_share": 0}],
    # NCCL (on a CUDA host): each collective enqueued eagerly, a sum and a division, against the
    # default CUDA graphs replayed from the 4th step on and NCCL's own average (2 ranks: exact)
    "eager sum": [None, {"attrs": {"graphs": False, "nccl_avg": False}}],
}


class Wide(aot.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(IN, HID + 1)
        self.l2 = nn.Linear(HID + 1, OUT)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def _no_strays():
    """Workers a failed test leaves running are killed."""
    yield
    for p in STARTED:
        if p.poll() is None:
            p.kill()
            p.wait()
    STARTED.clear()


STARTED: list = []


def launch(tmp_path, packages, jobs: list[dict], timeout_s: float = 60.0):
    """Start one worker per job (rank = position) as torchrun would (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT); returns the Popen objects."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = _free_port()
    procs = []
    for rank, job in enumerate(jobs):
        job = dict(job, timeout=timeout_s, ckpt=str(tmp_path / "ckpt_"))
        job.setdefault("packages", str(packages))
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(len(jobs)),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), json.dumps(job)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    STARTED.extend(procs)
    return procs


def reports(procs, timeout=300) -> list[dict]:
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        assert p.returncode == 0, stderr[-3000:] + "\nstdout: " + stdout[-1000:]
        (line,) = [x for x in stdout.splitlines() if x.startswith("REPORT ")]
        out.append(json.loads(line[len("REPORT ") :]))
    return out


def test_two_ranks_with_half_batches_match_one_process(tmp_path, packages):
    """...bucketed or not, whatever the bucket size (bit for bit the same), and with bf16
    transport (close, not equal)."""
    names = [f"ddp_{opt}_{FULL // 2}" for opt in OPTIMIZERS]
    adam = names[0]
    extra = [
        [adam, None, folder and str(packages / folder), dict(opts, label=label)]
        for label, (folder, opts) in SAME_AS_DEFAULT.items()
    ]
    extra.append([adam, None, None, {"label": "bf16", "allreduce": {"dtype": "bf16"}}])
    job = {"runs": [[n, None, None] for n in names] + extra, "batch": FULL, "steps": STEPS}
    procs = launch(tmp_path, packages, [job, job])
    # meanwhile, the reference: one process with the whole batch
    ref = {}
    for opt in OPTIMIZERS:
        model = aot.compile(program(opt, FULL))
        losses = [model.step(**data(i)) for i in range(STEPS)]
        ref[f"ddp_{opt}_{FULL // 2}"] = (np.float64(losses), model.params())
        model.close()
    r0, r1 = reports(procs)
    for name, (losses, params) in ref.items():
        a, b = r0[name], r1[name]
        assert a == b  # every rank holds the same parameters and reports the same mean losses, bit for bit
        np.testing.assert_allclose(a["losses"], losses, rtol=1e-6, atol=0)
        for k, v in params.items():
            np.testing.assert_allclose(np.float32(a["params"][k]), v, rtol=1e-5, atol=1e-6, err_msg=f"{name} {k}")
        # restored from rank 0's checkpoint at step 5 by every rank: steps 6..10 again, bit for bit
        assert a["replay"] == a["losses"][STEPS // 2 :] and a["replay_params"] == a["params"]
        assert a["steps"] == STEPS
    for label in SAME_AS_DEFAULT:
        assert r0[label] == r1[label] and r0[label]["losses"] == r0[adam]["losses"], label
        assert r0[label]["params"] == r0[adam]["params"], label
    steps = STEPS + STEPS // 2  # with the replay
    assert r0["merged"]["collectives"] == steps and r0["unmerged"]["collectives"] == 4 * steps
    bf16 = r0["bf16"]
    np.testing.assert_allclose(bf16["losses"], r0[adam]["losses"], rtol=2e-2)
    assert bf16["losses"] != r0[adam]["losses"] and r1["bf16"] == bf16  # rounded, and alike on every rank
    counts = {f: len(_tables(packages / f, adam)["buckets"]) for f in BUCKETS}
    assert counts["per_gradient"] == 4 and 1 < counts["small"] < 4 and counts["huge"] == 1, counts


def _tables(root, name) -> dict:
    """The training entry's tables of the package built in root/name."""
    ns: dict = {}
    exec(compile((root / name / name / "plan.py").read_text(), "plan.py", "exec"), ns)
    return ns["PROGRAM"]["entries"]["train"]


@pytest.mark.parametrize("how", ["SIGKILL", pytest.param("SIGSTOP", marks=pytest.mark.slow)])
def test_a_dead_or_stuck_rank_makes_the_other_fail_within_the_timeout(tmp_path, packages, how):
    """A killed rank closes its connections (gloo raises at once); a stopped one keeps them open
    and says nothing (gloo raises after init(timeout_s=...))."""
    job = {"runs": [[f"ddp_adam_{FULL // 2}", None, None]], "batch": FULL, "steps": 10**6}
    procs = launch(tmp_path, packages, [job, dict(job, die_rank=1, die_after=3, signal=how)], timeout_s=8.0)
    deadline = time.monotonic() + 120
    while "rank 1 step 3" not in (tmp := procs[1].stdout.readline()) and time.monotonic() < deadline:
        assert tmp, "rank 1 ended before step 3"
    t0 = time.monotonic()
    out0, err0 = procs[0].communicate(timeout=60)
    assert procs[0].returncode not in (0, None), out0[-500:]
    assert "RuntimeError" in err0 and ("Connection" in err0 or "Timed out" in err0), err0[-3000:]
    assert time.monotonic() - t0 < 8.0 + 20  # the timeout, and time to notice and exit on a busy machine
    if how == "SIGKILL":
        assert procs[1].wait(timeout=10) == -9


def test_mismatched_builds_and_parameters_are_refused_at_start(tmp_path, packages):
    adam, sgd = f"ddp_adam_{FULL // 2}", f"ddp_sgd_{FULL // 2}"
    rank0 = {"runs": [[adam, None, None], [sgd, None, None]], "batch": FULL, "steps": 2}
    rank1 = dict(rank0, runs=[[adam, 7, None], [sgd, None, str(packages / "other")]])  # another seed; another build
    for r in reports(launch(tmp_path, packages, [rank0, rank1])):
        assert "different parameters or optimizer state" in r[adam]["mismatch"], r
        assert "different builds" in r[sgd]["mismatch"] and "same built package" in r[sgd]["mismatch"], r


CHECKED = textwrap.dedent("""
    import json, os, shutil, sys
    import numpy as np
    job = json.loads(sys.argv[1])
    import importlib
    name = job["name"]
    sys.path.insert(0, os.path.join(job.get("root") or job["packages"], name))
    dist = importlib.import_module(name + ".distributed")
    rank, world = dist.init(timeout_s=job["timeout"])
    model = importlib.import_module(name).Model()
    fn = dist.allreduce_mean()
    if "merge_share" in job:  # which buckets share a collective (engine.bucket_groups)
        sys.modules[name + ".engine"].BUCKET_MERGE_SHARE = job["merge_share"]
    r = np.random.default_rng(rank)
    batch = lambda: {"x": r.normal(size=(4, 3)).astype(np.float32), "y": r.normal(size=(4, 2)).astype(np.float32)}
    report = {}
    if job["what"] == "sizes":  # no check_replicas first: the ranks run builds of other sizes
        try:
            model.step(**batch(), allreduce=fn)
        except dist.ReplicaMismatch as e:
            report["error"] = str(e)
    else:
        shared = job["ckpt"] + "shared"
        model.step(**batch(), allreduce=fn)
        dist.save(model, shared + "1")
        model.step(**batch(), allreduce=fn)
        dist.save(model, shared + "2")
        model.step(**batch(), allreduce=fn)
        own = job["ckpt"] + f"rank{rank}"
        for case, damage in (("corrupt", "bytes"), ("stale", "older"), ("good", None)):
            shutil.copy(shared + "2", own)
            if rank == 1 and damage == "bytes":
                with open(own, "r+b") as f:
                    f.seek(os.path.getsize(own) - 300)
                    f.write(b"not a checkpoint" * 4)
            elif rank == 1 and damage == "older":
                shutil.copy(shared + "1", own)
            before = {k: v.tolist() for k, v in model.params().items()}, model.step_count
            try:
                dist.restore(model, own)
                error = None
            except Exception as e:
                error = type(e).__name__ + ": " + str(e)
            after = {k: v.tolist() for k, v in model.params().items()}, model.step_count
            report[case] = {"error": error, "unchanged": after == list(before) or after == before, "steps": model.step_count}
    print("REPORT " + json.dumps(report), flush=True)
""")


def _checked(tmp_path, packages, jobs):
    script = tmp_path / "checked.py"
    script.write_text(CHECKED)
    port, procs = _free_port(), []
    for rank, job in enumerate(jobs):
        job = dict(job, timeout=60.0, ckpt=str(tmp_path / "ckpt_"), packages=str(packages))
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(len(jobs)), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))
        procs.append(subprocess.Popen([sys.executable, str(script), json.dumps(job)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    STARTED.extend(procs)
    return reports(procs)


def test_ranks_with_builds_of_other_sizes_raise_instead_of_aborting(tmp_path, packages):
    """Without check_replicas first, a step(allreduce=...) over builds whose gradient vectors
    differ in length made gloo abort rank 0 (SIGABRT); now every rank raises ReplicaMismatch."""
    job = {"name": f"ddp_sgd_{FULL // 2}", "what": "sizes"}
    for r in _checked(tmp_path, packages, [job, dict(job, root=str(packages / "wide"))]):
        assert "gradient vectors differ in length" in r["error"], r
    # the same build, but rank 0 reduces its 4 buckets by one collective and rank 1 by one each:
    # NCCL would pair unlike collectives (a hang, or a wrong sum); every rank raises instead
    job = {"name": f"ddp_adam_{FULL // 2}", "what": "sizes", "root": str(packages / "per_gradient")}
    for r in _checked(tmp_path, packages, [dict(job, merge_share=1), dict(job, merge_share=0)]):
        assert "in their buckets" in r["error"] and "4 buckets" in r["error"], r


def test_distributed_restore_checks_every_copy_before_any_rank_restores(tmp_path, packages):
    """Rank 1's copy damaged, or another checkpoint: rank 0 had already restored when rank 1
    raised, and the replicas diverged. Now no rank changes; with equal copies every rank restores."""
    job = {"name": f"ddp_sgd_{FULL // 2}", "what": "restore"}
    for rank, r in enumerate(_checked(tmp_path, packages, [job, job])):
        assert r["corrupt"]["error"] and r["corrupt"]["unchanged"] and r["corrupt"]["steps"] == 3, (rank, r)
        assert "no rank restored it" in r["corrupt"]["error"] or rank == 1, r
        assert "copies" in r["stale"]["error"] and r["stale"]["unchanged"] and r["stale"]["steps"] == 3, (rank, r)
        assert r["good"] == {"error": None, "unchanged": False, "steps": 2}, (rank, r)


def test_every_training_build_is_cut_where_the_update_begins():
    """The scheduler orders the kernels writing the gradient vector before the update and never
    fuses across (kan_tiny's gradient concat, which used to fuse with the update, is its own
    kernel); check_cut refuses a schedule that breaks either."""
    from aot import passes
    from aot.errors import CodegenError
    from aot.frontend import trace_program
    from aot.schedule import ParamArena, check_cut, schedule

    traced = trace_program(runpy.run_path(str(ROOT / "examples" / "kan_tiny.py"))["program"])
    arena = ParamArena({p.name: p.offset for p in traced.params}, sum(p.size for p in traced.params))

    def fresh():
        return schedule(passes.run_pipeline(traced.graphs["train"]), arena)

    s = fresh()
    cut = s.update_from
    assert 0 < cut < len(s.kernels)
    before, first = s.kernels[cut - 1], s.kernels[cut]
    assert before.node.op == "concat" and first.kind == "elementwise"
    first.first = before.outs + first.first  # fused as _merge_reader would without the cut
    first.reads = [r for r in dict.fromkeys(before.reads + first.reads) if r not in before.outs]
    del s.kernels[cut - 1]
    with pytest.raises(CodegenError, match="writes the gradient vector"):
        check_cut(s)
    s = fresh()
    s.kernels[cut - 1], s.kernels[cut] = s.kernels[cut], s.kernels[cut - 1]  # the update before a gradient
    with pytest.raises(CodegenError, match="writes the gradient vector"):
        check_cut(s)


# ---- one process ---------------------------------------------------------------------------------


class Drop(aot.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(IN, HID, init=aot.init.kaiming())
        self.l2 = nn.Linear(HID, OUT)


def drop_loss(m, x, y):
    h = aot.capture("h", ops.dropout(ops.relu(m.l1(x)), 0.3))  # random: the per-step seed must match step()'s
    return ops.mean(ops.square(m.l2(h) - y))


DROP = aot.Program(
    "ddp_drop",
    model=Drop,
    train=aot.Train(
        drop_loss,
        {"x": aot.f32(FULL, IN), "y": aot.f32(FULL, OUT)},
        aot.optim.AdamW(lr=aot.lr.linear(2e-2, 1e-3, 4), weight_decay=0.1, clip_grad_norm=0.5),
    ),
)


@pytest.fixture(scope="module")
def pair():
    a = aot.compile(DROP)
    b = type(a)()
    yield a, b
    a.close()
    b.close()


def snapshot(m):
    return (
        m.params(),
        m.grads(),
        [m._engine.read(a, 0, n) for a, n in m._state_buffers()],
        m.step_count,
    )


def assert_identical(sa, sb):
    for x, y in zip(sa[:2], sb[:2]):
        assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
    assert all(np.array_equal(x, y) for x, y in zip(sa[2], sb[2]))
    assert sa[3] == sb[3]


def test_identity_allreduce_is_bit_identical_to_step(pair):
    a, b = pair
    seen = []

    def identity(g):
        assert g.dtype == np.float32 and g.shape == (a._total,) and g.flags.writeable
        seen.append(g.copy())
        return g

    for m in (a, b):
        m.reset()
    for i in range(6):  # past the schedule's end at step 5
        ra = a.step(**data(i), captures=True)
        rb = b.step(**data(i), captures=True, allreduce=identity)
        assert ra.loss == rb.loss and np.array_equal(ra.captures["h"], rb.captures["h"])
        offsets = {p[0]: p[4] for p in b.PROGRAM["params"]}
        flat = np.concatenate([g.ravel() for _, g in sorted(b.grads().items(), key=lambda kv: offsets[kv[0]])])
        assert np.array_equal(seen[-1], flat)  # the vector handed over is grads() in layout order
        assert_identical(snapshot(a), snapshot(b))
    assert isinstance(b.step(**data(7), allreduce=identity), float)


def test_a_bad_allreduce_result_changes_nothing(pair):
    _, b = pair
    b.reset()
    b.step(**data(0))
    before = snapshot(b)
    n = b._total

    def boom(g):
        raise RuntimeError("peer lost")

    bad = {
        "returns None": (lambda g: None, TypeError, "reduced in place"),
        "float64": (lambda g: g.astype(np.float64), TypeError, "float32"),
        "shape": (lambda g: g[:-1], ValueError, f"({n},)"),
        "2-d": (lambda g: g.reshape(1, -1), ValueError, f"({n},)"),
        "list": (lambda g: g.tolist(), TypeError, "list"),
        "zeros first": (lambda g: (g.__imul__(0), None)[1], TypeError, "None"),  # clobbers the array it was given
        "raises": (boom, RuntimeError, "peer lost"),
    }
    for what, (fn, error, text) in bad.items():
        with pytest.raises(error, match=re.escape(text)):
            b.step(**data(1), allreduce=fn)
        assert_identical(before, snapshot(b))
    with pytest.raises(TypeError, match="function of the flat gradient vector"):
        b.step(**data(1), allreduce="sum")
    with pytest.raises(TypeError, match="step_many"):
        b.step_many(**{k: v[None] for k, v in data(1).items()}, allreduce=lambda g: g)
    assert_identical(before, snapshot(b))
    # and the next good step is the step it would have been
    a = type(b)()
    a.reset()
    a.step(**data(0))
    assert a.step(**data(1)) == b.step(**data(1), allreduce=lambda g: g)
    assert_identical(snapshot(a), snapshot(b))
    a.close()


def test_gradients_only_programs_reduce_too():
    """Without an optimizer the cut is at the end: grads() reports the reduced gradients."""
    m = aot.compile(
        aot.Program("ddp_noopt", model=MLP, train=aot.Train(mse, {"x": aot.f32(FULL, IN), "y": aot.f32(FULL, OUT)}))
    )
    assert m.PROGRAM["entries"]["train"]["update_from"] == len(m.PROGRAM["entries"]["train"]["dispatches"])
    loss = m.step(**data(0))
    local = m.grads()
    assert m.step(**data(0), allreduce=lambda g: g * np.float32(2)) == loss
    assert all(np.array_equal(m.grads()[k], 2 * v) for k, v in local.items())
    m.close()


def test_adapter_by_index_and_name(pair):
    a, _ = pair
    pkg = sys.modules[type(a).__module__]
    rows = pkg.adapters()
    assert rows and rows[0]["index"] == 0 and {"name", "type", "backend", "description"} <= set(rows[0])
    m = type(a)(adapter=0)
    assert m.adapter["index"] == 0 and m.adapter["name"] == rows[0]["name"]
    m.close()
    needle = rows[0]["name"].split()[0].upper()  # a case-insensitive substring
    m = type(a)(adapter=needle)
    assert needle.lower() in m.adapter["name"].lower() + m.adapter["description"].lower()
    m.step(**data(0))
    m.close()
    assert a.adapter["index"] is None  # wgpu's own choice
    with pytest.raises(ValueError, match=r"no adapter's name or description contains it; the adapters are:\n  0: "):
        type(a)(adapter="no such gpu")
    with pytest.raises(ValueError, match="no adapter has that index"):
        type(a)(adapter=len(rows))
    with pytest.raises(TypeError, match="an index or a name"):
        type(a)(adapter=1.0)


# ---- gradient buckets in one process ---------------------------------------------------------------


class Buckets:
    """A bucketed reducer that doubles every gradient (identity=False) or leaves it (True), and
    records the buckets it was given."""

    def __init__(self, identity=True, bad=None):
        self.identity, self.bad, self.seen, self.finished_on = identity, bad, [], []

    def start(self, values, lo, hi):
        assert values.dtype == np.float32 and values.shape == (hi - lo,) and values.flags.writeable
        self.seen.append((lo, hi))
        handle = values.copy() if self.identity else values * np.float32(2)
        self.bucket_of = getattr(self, "bucket_of", {})
        self.bucket_of[id(handle)] = (lo, hi)
        return handle

    def finish(self, handle):
        self.finished_on.append((self.bucket_of.pop(id(handle)), threading.get_ident()))
        return self.bad(handle) if self.bad else handle


class MappedBuckets(Buckets):
    """Buckets taking every other bucket straight from the mapped memory (start_mapped, as the
    NCCL reducer does where CUDA pins it) and declining the rest (start then gets a copy);
    release() is counted (Model.close calls it)."""

    released = 0

    def start_mapped(self, values, lo, hi):
        assert values.dtype == np.float32 and values.shape == (hi - lo,)
        self.offered = getattr(self, "offered", 0) + 1
        if self.offered % 2:
            return None
        self.seen.append((lo, hi))
        self.mapped = getattr(self, "mapped", 0) + 1
        handle = values.copy()  # the mapping is gone once this returns
        self.bucket_of = getattr(self, "bucket_of", {})
        self.bucket_of[id(handle)] = (lo, hi)
        return handle

    def release(self):
        self.released += 1


def test_bucketed_steps_are_bit_identical_and_bad_results_change_nothing():
    """One bucket per gradient, read back while the backward pass runs (and one submit at a time,
    the fallback without wgpu-native's internals): the same step as step(), bit for bit; a bucket
    reducer that fails or returns something unusable leaves the model as it was."""
    a = aot.compile(DROP, bucket_mib=0)
    table = a.PROGRAM["entries"]["train"]
    names = {p[0]: (p[4], int(np.prod(p[1]))) for p in a.PROGRAM["params"]}
    assert sorted((lo, hi) for lo, hi, _ in table["buckets"]) == sorted((o, o + n) for o, n in names.values())
    ready = [r for *_, r in table["buckets"]]
    assert ready == sorted(ready) and 0 < ready[0] and ready[-1] <= table["update_from"]
    b, c, d = type(a)(), type(a)(), type(a)()
    c._engine.serial_buckets = True
    d._engine.upload_via = "write_buffer"  # and buckets handed over mapped (MappedBuckets)
    r, rd = Buckets(), MappedBuckets()
    for i in range(6):
        ra = a.step(**data(i), captures=True)
        rb = b.step(**data(i), captures=True, allreduce=r)
        rc = c.step(**data(i), captures=True, allreduce=Buckets())
        rdd = d.step(**data(i), captures=True, allreduce=rd)
        assert ra.loss == rb.loss == rc.loss == rdd.loss and np.array_equal(ra.captures["h"], rb.captures["h"])
        assert_identical(snapshot(a), snapshot(b))
        assert_identical(snapshot(a), snapshot(c))
        assert_identical(snapshot(a), snapshot(d))
    assert rd.offered == 6 * len(names) and rd.mapped == 3 * len(names)  # half of them taken mapped
    b._engine.trace = []  # a step's timeline (bench_ddp --timeline): each bucket mapped, handed over, uploaded
    b.step(**data(6), allreduce=Buckets())
    a.step(**data(6))
    trace, b._engine.trace = b._engine.trace, None
    events = [(e, i) for e, i, _ in trace]
    assert events[0] == ("step", -1) and events[-1] == ("update", -1)
    for i in range(len(names)):
        assert events.index(("mapped", i)) < events.index(("handed", i)) and events.index(("finished", i)) < events.index(("uploaded", i))
    assert_identical(snapshot(a), snapshot(b))
    d.close()
    assert rd.released == 1
    e, re_ = type(a)(), MappedBuckets()  # collected without close(): released all the same
    e.step(**data(0), allreduce=re_)
    del e
    gc.collect()
    assert re_.released == 1
    assert sorted(r.seen[-len(names):]) == sorted((o, o + n) for o, n in names.values())
    # every bucket's finish but the last ran on the model's upload thread, the last on this one
    threads = dict(r.finished_on[-len(names) :])
    me = threading.get_ident()
    assert [threads[b] == me for b in r.seen[-len(names) :]] == [False] * (len(names) - 1) + [True]
    before = snapshot(b)
    n = names["l1.W"][1]
    for fn, error, text in [
        (lambda h: None, TypeError, "reduced in place"),
        (lambda h: h.astype(np.float64), TypeError, "float32"),
        (lambda h: h[:-1], ValueError, "finish()'s result for gradients"),
        (lambda h: (_ for _ in ()).throw(RuntimeError("peer lost")), RuntimeError, "peer lost"),
    ]:
        with pytest.raises(error, match=re.escape(text)):
            b.step(**data(7), allreduce=Buckets(bad=fn))
        assert_identical(before, snapshot(b))
    assert n == IN * HID
    # the next good step is the step it would have been; a doubling reducer doubles the gradients
    assert a.step(**data(7)) == b.step(**data(7), allreduce=Buckets())
    assert_identical(snapshot(a), snapshot(b))
    m = aot.compile(
        aot.Program("ddp_noopt_b", model=MLP, train=aot.Train(mse, {"x": aot.f32(FULL, IN), "y": aot.f32(FULL, OUT)})),
        bucket_mib=0,
    )
    m.step(**data(0))
    local = m.grads()
    m.step(**data(0), allreduce=Buckets(identity=False))
    assert all(np.array_equal(m.grads()[k], 2 * v) for k, v in local.items())
    for x in (a, b, c, m):
        x.close()


def test_bucketed_step_with_its_first_dispatches_submitted_alone_is_bit_identical(monkeypatch):
    """run_buckets submits dispatches [0, BUCKET_FIRST_SUBMIT) on their own where the first
    bucket is final later (the GPU starts while the host records the rest): the same step."""
    from aot.runtime import engine

    a = aot.compile(DROP, bucket_mib=0)
    first = min(r for *_, r in a.PROGRAM["entries"]["train"]["buckets"])
    assert first > 1
    monkeypatch.setattr(engine, "BUCKET_FIRST_SUBMIT", first - 1)
    b = type(a)()
    b._engine.trace = []
    for i in range(3):
        ra, rb = a.step(**data(i), captures=True), b.step(**data(i), captures=True, allreduce=Buckets())
        assert ra.loss == rb.loss and np.array_equal(ra.captures["h"], rb.captures["h"])
        assert_identical(snapshot(a), snapshot(b))
    events = [e for e, _, _ in b._engine.trace]
    assert events.count("joined") == 3 and events.index("joined") < events.index("update")


def test_the_next_backward_recorded_during_the_last_collective_is_used_and_bit_identical(monkeypatch):
    """A bucketed step records the next step's backward (engine.prerecord) once its last
    collective is started; the next step of the same entry and captures submits those command
    buffers instead of recording its own (one recording a step, not two), one with other
    captures records its own: every step bit-identical to a model that never prerecords, and to
    step() without a reducer."""
    a = aot.compile(DROP, bucket_mib=0)
    b, c = type(a)(), type(a)()
    engine = sys.modules[type(b._engine).__module__]  # the package's copy of aot/runtime/engine.py
    c._prerecord = False
    calls = []
    parts = b._engine._bucket_parts
    b._engine._bucket_parts = lambda *args: calls.append(args[1]) or parts(*args)
    for i, captures in enumerate([True, True, False, False, True]):
        ra = a.step(**data(i), captures=True)
        rb = b.step(**data(i), captures=captures, allreduce=Buckets())
        rc = c.step(**data(i), captures=captures, allreduce=Buckets())
        assert ra.loss == float(rb if not captures else rb.loss) == float(rc if not captures else rc.loss)
        assert_identical(snapshot(a), snapshot(b))
        assert_identical(snapshot(a), snapshot(c))
        assert b._engine._prerecorded[0][1] is captures and c._engine.__dict__.get("_prerecorded") is None
    # step 1 records its own and the next; 2 only the next; 3 (other captures) both; 4 the next; 5 both
    assert calls == [True, True, True, False, False, False, True, True]
    # an entry longer than PRERECORD_MAX dispatches records each step's backward when it starts
    monkeypatch.setattr(engine, "PRERECORD_MAX", len(b.PROGRAM["entries"]["train"]["dispatches"]) - 1)
    rb = b.step(**data(5), allreduce=Buckets())
    assert a.step(**data(5)) == rb and b._engine._prerecorded is None
    assert_identical(snapshot(a), snapshot(b))
    for x in (a, b, c):
        x.close()


class InPlaceBuckets:
    """A bucketed reducer that doubles each bucket inside the mapped readback memory itself where
    the model allows it (values writable) and returns that memory from finish, as the NCCL
    reducer's in-place mean does; where not allowed, declines (start gets a copy)."""

    def __init__(self):
        self.in_place = self.declined = 0

    def start_mapped(self, values, lo, hi):
        if not values.flags.writeable:
            self.declined += 1
            return None
        values *= np.float32(2)
        self.in_place += 1
        return values

    def start(self, values, lo, hi):
        return values * np.float32(2)

    def finish(self, handle):
        return handle


def test_results_left_in_the_mapped_buckets_are_uploaded_from_there():
    """upload_via "readback" (wgpu-native's mappable-primary-buffers: the readback buffers are
    copy sources too): a reducer's result lying in the bucket's mapped memory goes back to the
    gradients by a GPU copy from that buffer, no host copy; the same step, bit for bit, as the
    doubled gradients uploaded from the stage (Buckets(identity=False)), for every bucket
    including the last (copied by the update's command buffer). With upload_via "map" the mapped
    buckets are read-only and the reducer declines."""
    a = aot.compile(DROP, bucket_mib=0)
    b, c = type(a)(), type(a)()
    assert b._engine.readback_uploads and b._engine.upload_via == "readback"
    c._engine.upload_via = "map"
    rb, rc = InPlaceBuckets(), InPlaceBuckets()
    n = len(a.PROGRAM["entries"]["train"]["buckets"])
    for i in range(4):
        ra = a.step(**data(i), captures=True, allreduce=Buckets(identity=False))
        rbb = b.step(**data(i), captures=True, allreduce=rb)
        rcc = c.step(**data(i), captures=True, allreduce=rc)
        assert ra.loss == rbb.loss == rcc.loss
        assert_identical(snapshot(a), snapshot(b))
        assert_identical(snapshot(a), snapshot(c))
    assert (rb.in_place, rb.declined) == (4 * n, 0) and (rc.in_place, rc.declined) == (0, 4 * n)


def test_bad_bucket_and_backend_options_are_refused(packages):
    with pytest.raises(ValueError, match="bucket_mib must be a number of MiB >= 0"):
        aot.build(DROP, "unused", bucket_mib=-1)
    with pytest.raises(ValueError, match="bucket_mib must be a number"):
        aot.compile(DROP, bucket_mib="25")
    sys.path.insert(0, str(packages / f"ddp_sgd_{FULL // 2}"))
    try:
        pkg = importlib.import_module(f"ddp_sgd_{FULL // 2}")
        dist = importlib.import_module(f"ddp_sgd_{FULL // 2}.distributed")
    finally:
        sys.path.pop(0)
    with pytest.raises(ValueError, match=r"init\(backend=...\) must be one of 'auto', 'gloo', 'nccl', got 'mpi'"):
        dist.init(backend="mpi")
    if not dist._nccl_usable():
        with pytest.raises(RuntimeError, match="needs a CUDA device"):
            dist.init(backend="nccl")
    with pytest.raises(ValueError, match=r"allreduce_mean\(dtype=...\) must be one of"):
        dist.allreduce_mean(dtype="f8")
    with pytest.raises(ValueError, match=r"allreduce_mean\(backend=...\) must be one of"):
        dist.allreduce_mean(backend="cuda")
    with pytest.raises(TypeError, match="bucketed reducer"):
        pkg.Model().step(x=np.zeros((FULL // 2, IN), np.float32), y=np.zeros((FULL // 2, OUT), np.float32), allreduce=object())


def test_bucket_partition_cuts_where_gradients_wait_least():
    """Pure table logic (aot/buckets.py): one bucket per gradient at 0, one for a vector within an
    eighth of the cap, and otherwise cuts that keep early gradients out of late buckets: here the
    small late gradients at the end (a layout that puts biases after the weights) get a bucket of
    their own instead of holding back the weights before them."""
    from aot.buckets import partition

    segs = [(0, 100), (100, 200), (200, 300), (300, 302), (302, 304)]
    ready = [9, 5, 3, 8, 9]
    assert partition(segs, ready, 0) == segs
    assert partition(segs, ready, 10**6) == [(0, 304)]
    cuts = partition(segs, ready, 250)
    assert cuts[0][0] == 0 and cuts[-1][1] == 304 and all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
    assert (300, 304) in cuts or (300, 302) in cuts  # the late small ones are not with (200, 300)
    assert all(hi - lo <= 250 or (lo, hi) in segs for lo, hi in cuts)
    late = [(lo, hi) for lo, hi in cuts if max(r for s, r in zip(segs, ready) if lo <= s[0] < hi) == 9]
    assert all(hi - lo <= 250 // 8 or (lo, hi) in segs for lo, hi in late)  # the last trip is short


def test_buckets_final_late_are_small(monkeypatch):
    """late_cap with a TAIL_WINDOW (off by default): a bucket final in the last 1/TAIL_WINDOW of
    the dispatches holds less the later it is final. A layout like transformer_large's (16
    gradients final one after the other, ready 10..160): every bucket within late_cap (or one
    gradient alone), where the default (only the last bucket small) puts 300 elements in a
    bucket final 10 dispatches before the end."""
    from aot import buckets
    from aot.buckets import TAIL_SHARE, late_cap, partition

    assert buckets.TAIL_WINDOW == 0 and late_cap(1000, 89, 90) == 1000 and late_cap(1000, 90, 90) == 1000 // TAIL_SHARE
    monkeypatch.setattr(buckets, "TAIL_WINDOW", 6)
    assert late_cap(1000, 10, 90) == 1000 and late_cap(1000, 90, 90) == 1000 // TAIL_SHARE
    assert late_cap(1000, 85, 90) < late_cap(1000, 80, 90) < 1000 == late_cap(1000, 75, 90)
    segs = [(100 * k, 100 * (k + 1)) for k in range(16)]
    ready = [10 * (k + 1) for k in range(16)]

    def rows(cuts):
        assert cuts[0][0] == 0 and cuts[-1][1] == 1600 and all(a[1] == b[0] for a, b in zip(cuts, cuts[1:]))
        return [(max(r for s, r in zip(segs, ready) if lo <= s[0] < hi), hi - lo) for lo, hi in cuts]

    new = rows(partition(segs, ready, 400))
    assert all(n <= late_cap(400, r, 160) or n == 100 for r, n in new)
    assert max(n for _, n in new) == 400  # early gradients share full buckets
    monkeypatch.setattr(buckets, "TAIL_WINDOW", 0)  # the default: only the last bucket is capped
    assert (150, 300) in rows(partition(segs, ready, 400))


def test_bucket_groups_merge_the_buckets_final_together_or_at_the_end():
    """engine.bucket_groups (pure): per bucket, the first bucket of its collective. transformer_large's
    table (25 MiB, the H200 build): with the default share (32: the last 6 dispatches) its norms
    and biases' bucket (laid out after every weight, final 5 dispatches before the end) shares
    the last bucket's collective; with 16 the 26 MB bucket final 12 before the end joins them;
    buckets final at one boundary share one anywhere; share 0: one each."""
    from aot.runtime.engine import BUCKET_MERGE_SHARE, bucket_groups

    table = [(13769216, 19012096, 96), (7215616, 13769216, 153), (662016, 7215616, 201), (19012096, 19040768, 208), (0, 662016, 213)]
    assert BUCKET_MERGE_SHARE == 32 and bucket_groups(table, 213, BUCKET_MERGE_SHARE) == [0, 1, 2, 3, 3]
    assert bucket_groups(table, 213, 16) == [0, 1, 2, 2, 2]
    assert bucket_groups(table, 213, 0) == [0, 1, 2, 3, 4]
    assert bucket_groups(table, 213, 1) == [0] * 5
    assert bucket_groups([(0, 4, 3), (4, 8, 3), (8, 9, 50), (9, 12, 100)], 100, 16) == [0, 0, 2, 3]
    assert bucket_groups([(0, 4, 3)], 3, 16) == [0] and bucket_groups([], 3, 16) == []


class NormsLast(aot.Module):
    """LayerNorms and biases: no weight decay, so the layout puts them after every weight."""

    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(IN, 16), nn.Linear(16, 16), nn.Linear(16, OUT)
        self.n1, self.n2 = nn.LayerNorm(16), nn.LayerNorm(16)


def norms_loss(m, x, y):
    h = ops.tanh(m.n2(m.l2(ops.tanh(m.n1(m.l1(x))))))
    return ops.mean(ops.square(m.l3(h) - y))


NORMS = aot.Program(
    "ddp_norms_last",
    model=NormsLast,
    train=aot.Train(norms_loss, {"x": aot.f32(FULL, IN), "y": aot.f32(FULL, OUT)}, aot.optim.AdamW(lr=1e-2, weight_decay=0.1)),
)


class MergingBuckets:
    """A bucketed reducer that merges (merge = True): a bucket started with hold waits for the
    group's last bucket, whose start doubles them all (one "collective"); with mapped, each
    bucket is doubled inside the mapped readback memory during its start (the in-place upload).
    finish asserts its group was started."""

    merge = True

    def __init__(self, mapped=False):
        self.mapped, self.calls, self.held, self.collectives, self.groups = mapped, [], [], 0, None

    def begin(self, buckets, groups=None):
        self.buckets, self.groups, self.held = buckets, groups, []

    def start_mapped(self, values, lo, hi, hold=False):
        if not self.mapped or not values.flags.writeable:
            return None
        values *= np.float32(2)
        return self._start(values, lo, hi, hold, doubled=True)

    def start(self, values, lo, hi, hold=False):
        return self._start(values.copy(), lo, hi, hold, doubled=False)

    def _start(self, values, lo, hi, hold, doubled):
        self.calls.append((lo, hi, hold))
        box = {"values": values, "doubled": doubled, "done": False}
        self.held.append(box)
        if not hold:
            for b in self.held:
                if not b["doubled"]:
                    b["values"] *= np.float32(2)
                b["done"] = True
            self.held, self.collectives = [], self.collectives + 1
        return box

    def finish(self, box):
        assert box["done"], "finish() before its group's collective was started"
        return box["values"]


def test_norms_laid_out_last_are_reduced_with_their_layer():
    """A model whose norms and biases sit after every weight in the gradient vector (AdamW's
    layout: decayed parameters first): the bucket holding the first layer's norm gain (one per
    gradient, or one for every norm and bias) is final with the first layer's weight, at the
    end of the backward pass, and is reduced by the same collective (engine.bucket_groups), in
    both kernel sets' tables. Through a merging reducer
    the step is bit for bit the one with a collective per bucket, the held buckets' results
    uploaded from the stage or from the mapped buckets themselves."""
    from aot.runtime.engine import BUCKET_MERGE_SHARE, bucket_groups

    names = None
    for mib in (0, 4e-3):  # one bucket per gradient; one holding every norm and bias
        a = aot.compile(NORMS, bucket_mib=mib)
        t = a.PROGRAM["entries"]["train"]
        names = {p[0]: (p[4], p[4] + int(np.prod(p[1]))) for p in a.PROGRAM["params"]}
        assert names["n1.g"][0] > names["l3.W"][0]  # laid out after every weight
        for label, cut in (("buckets", t["update_from"]), ("buckets_cpu", t["update_from_cpu"])):
            table = t[label]
            groups = bucket_groups(table, cut, BUCKET_MERGE_SHARE)

            def group(param):
                lo, hi = names[param]
                (i,) = [i for i, (a_, b_, _) in enumerate(table) if a_ <= lo and hi <= b_]
                return groups[i]

            assert group("n1.g") == group("l1.W") == groups[-1], (label, table, groups)
            assert len(set(groups)) < len(table)
        a.close()
    a = aot.compile(NORMS, bucket_mib=0)
    b, c, d = type(a)(), type(a)(), type(a)()
    assert c._engine.upload_via == "readback"
    d._prepare_update = False  # the update recorded after the last upload (else while the last group is reduced)
    prepared = []
    b._engine.prepare_update = lambda key, f=b._engine.prepare_update: prepared.append(key) or f(key)
    rb, rc, rd = MergingBuckets(), MergingBuckets(mapped=True), MergingBuckets()
    for i in range(4):
        la = a.step(**data(i), allreduce=Buckets(identity=False))
        assert la == b.step(**data(i), allreduce=rb) == c.step(**data(i), allreduce=rc) == d.step(**data(i), allreduce=rd)
        for m in (b, c, d):
            assert_identical(snapshot(a), snapshot(m))
    assert prepared == ["train"] * 4
    e = b._engine.entries["train"]
    groups = b._engine.bucket_groups("train")
    assert rb.groups == groups and len(groups) == len(e["buckets"]) == len(names)
    holds = [i + 1 < len(groups) and groups[i + 1] == groups[i] for i in range(len(groups))]
    assert any(holds) and [h for *_, h in rb.calls] == 4 * holds and [h for *_, h in rc.calls] == 4 * holds
    assert rb.collectives == rc.collectives == 4 * len(set(groups))
    for m in (a, b, c, d):
        m.close()
