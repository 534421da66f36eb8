"""Benchmark the models of issue 30 (ResNet-20, DCGAN, the LSTM language model) against PyTorch
in one run, from the same initial parameters; writes JSON.

    python scripts/bench_models.py [--only resnet20,dcgan,lstm_lm] [--steps 30] [--k 20] [--out FILE]
    python scripts/bench_models.py --only ft_vit,ft_mixer,ft_char_gru,ft_unet_ddpm,ft_nanogpt,ft_mingpt,ft_lstm_lm,ft_transformer_lm

The ft_* cases are issue 31's public models (tests/torch_models.py at their full size) compiled
unchanged by `aot.from_torch`, against the same torch module (Adam, batch 32, random data).

Each case pairs an example (an aot Program) with its PyTorch twin (examples/*_torch.py). aot's
package is built, its `state_dict()` is loaded into the twin, and then both train on the same
batches: aot through `step()` (one submit and one readback per step) and `step_many` (K steps per
call); PyTorch eager, torch.compile, and the whole training iteration captured in one CUDA graph
(capturable optimizers), read back every iteration. An anchor that cannot run is skipped with its
reason. An "iteration" is one call of each training entry (DCGAN: a D step and a G step).
Ratios are what to read on a shared machine; absolute times count only from a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import runpy
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from aot.pipeline import build  # noqa: E402


def load(name):
    return runpy.run_path(str(ROOT / "examples" / f"{name}.py"))


def timed(fn, n, warmup=3):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


# ---- the cases: program, batches, how one iteration runs on each side --------------------------


def resnet20_case():
    ex, tw = load("resnet20"), load("resnet20_torch")
    return {
        "program": ex["program"],
        "batch": ex["batch"],
        "entries": {"step": lambda b: b},
        "torch_module": lambda: tw["ResNet20"](),
        "torch_opts": lambda m, capturable: [_capturable(tw["optimizer"](m)[0], capturable)],
        "torch_iter": lambda m, opts, b: [_torch_step(opts[0], lambda: tw["loss"](m, b["x"], b["labels"]))],
    }


def dcgan_case():
    ex, tw = load("dcgan"), load("dcgan_torch")
    return {
        "program": ex["program"],
        "batch": ex["batch"],
        "entries": {"step_d": lambda b: b, "step_g": lambda b: {"z": b["z"]}},
        "torch_module": lambda: tw["GAN"](),
        "torch_opts": lambda m, capturable: [_capturable(o, capturable) for o in tw["optimizers"](m)],
        "torch_iter": lambda m, opts, b: [
            _torch_step(opts[0], lambda: tw["loss_d"](m, b["x"], b["z"])),
            _torch_step(opts[1], lambda: tw["loss_g"](m, b["z"])),
        ],
    }


def lstm_lm_case():
    ex, tw = load("lstm_lm"), load("lstm_lm_torch")
    import names_data

    train, _ = names_data.split_names()
    return {
        "program": ex["program"],
        "batch": lambda rng: ex["batch"](rng, train),
        "entries": {"step": lambda b: b},
        "torch_module": lambda: tw["CharLSTM"](),
        "torch_opts": lambda m, capturable: [torch_optim().Adam(m.parameters(), lr=1e-2, capturable=capturable)],
        "torch_iter": lambda m, opts, b: [_torch_step(opts[0], lambda: tw["loss"](m, **b), clip=1.0, params=m.parameters())],
    }


def torch_optim():
    import torch

    return torch.optim


# from_torch: the public models of tests/torch_models.py at their "full" size, compiled unchanged
FROM_TORCH = {"vit": {"y": 10}, "mixer": {"y": 10}, "char_gru": {"x": 65, "y": 65}, "unet_ddpm": {"ts": 100},
              "transformer_lm": {"data": 10000, "targets": 10000}, "lstm_lm": {"data": 10000, "targets": 10000}}


# nanoGPT (SDPA, tied head; its Shakespeare-char config) and minGPT (explicit masked attention, NewGELU),
# tests/from_torch_models.py, at batch 16
GPTS = {"nanogpt": dict(vocab=65, block=256, layers=6, heads=6, d=384, explicit=False, tie=True),
        "mingpt": dict(vocab=65, block=128, layers=4, heads=4, d=256, explicit=True, tie=False)}


def gpt_case(name, batch=16):
    import copy

    import torch

    import aot

    sys.path.insert(0, str(ROOT / "tests"))
    from from_torch_models import GPT, gpt_loss, gpt_optimizer

    cfg = GPTS[name]
    torch.manual_seed(0)
    module = GPT(**cfg)
    template = copy.deepcopy(module)
    t, v = cfg["block"], cfg["vocab"]
    decl = {"idx": aot.i32(batch, t), "targets": aot.i32(batch, t)}
    program = aot.from_torch(module, gpt_loss, decl, gpt_optimizer(module), clip_grad_norm=1.0, name=f"ft_{name}")
    return {
        "program": program,
        "batch": lambda rng: {k: rng.integers(0, v, (batch, t)).astype(np.int32) for k in decl},
        "entries": {"step": lambda b: b},
        "torch_module": lambda: copy.deepcopy(template),
        "torch_opts": lambda m, capturable: [_capturable(gpt_optimizer(m), capturable)],
        "torch_iter": lambda m, opts, b: [_torch_step(opts[0], lambda: gpt_loss(m, **b), clip=1.0, params=m.parameters())],
    }


def twin_case(name):
    """The PyTorch twins of the examples (and pytorch/examples' MNIST Net) compiled by from_torch
    at the examples' sizes: the same module trains on the PyTorch side."""
    import copy

    import torch

    import aot

    ex = load({"resnet20": "resnet20", "dcgan": "dcgan", "mnist": "from_torch_mnist"}[name])
    torch.manual_seed(0)
    if name == "resnet20":
        tw = load("resnet20_torch")
        module = tw["ResNet20"]()
        opt, sched = tw["optimizer"](module)
        program = aot.from_torch(module, tw["loss"], {"x": aot.f32(64, 1, 28, 28), "labels": aot.i32(64)}, opt,
                                 scheduler=sched, name="ft_resnet20")
        entries = {"step": lambda b: b}
        opts = lambda m, capturable: [_capturable(tw["optimizer"](m)[0], capturable)]  # noqa: E731
        step = lambda m, o, b: [_torch_step(o[0], lambda: tw["loss"](m, **b))]  # noqa: E731
        batch = ex["batch"]
    elif name == "dcgan":
        tw = load("dcgan_torch")
        module = tw["GAN"]()
        d, g = tw["optimizers"](module)
        loss_g = lambda m, x, z: tw["loss_g"](m, z)  # noqa: E731  (each entry gets every input)
        program = aot.from_torch(module, {"d": (tw["loss_d"], d), "g": (loss_g, g)},
                                 {"x": aot.f32(64, 1, 28, 28), "z": aot.f32(64, 32, 1, 1)}, name="ft_dcgan")
        entries = {"step_d": lambda b: b, "step_g": lambda b: b}
        opts = lambda m, capturable: [_capturable(o, capturable) for o in tw["optimizers"](m)]  # noqa: E731
        step = lambda m, o, b: [_torch_step(o[0], lambda: tw["loss_d"](m, b["x"], b["z"])),  # noqa: E731
                                _torch_step(o[1], lambda: tw["loss_g"](m, b["z"]))]
        batch = ex["batch"]
    else:
        program, module = ex["make_program"](name="ft_mnist")
        entries = {"step": lambda b: b}
        opts = lambda m, capturable: [_capturable(torch.optim.Adadelta(m.parameters(), lr=1.0), capturable)]  # noqa: E731
        step = lambda m, o, b: [_torch_step(o[0], lambda: ex["loss"](m, **b))]  # noqa: E731

        def batch(rng):
            return {"x": rng.random((64, 1, 28, 28)).astype(np.float32), "y": rng.integers(0, 10, 64).astype(np.int32)}

    template = copy.deepcopy(module)
    return {"program": program, "batch": batch, "entries": entries, "torch_module": lambda: copy.deepcopy(template),
            "torch_opts": opts, "torch_iter": step}


def small_case(name):
    """The small public models of issue 31 through from_torch: pytorch/examples' regression (a
    Linear on polynomial features, smooth L1), micrograd's moons MLP (hinge loss + L2) and
    pytorch/examples' VAE at its size (784-400-20, batch 128, Adam; the noise an input)."""
    import copy

    import torch
    import torch.nn.functional as F

    import aot

    sys.path.insert(0, str(ROOT / "tests"))
    torch.manual_seed(0)
    if name == "regression":
        module = torch.nn.Linear(4, 1)
        loss = lambda m, x, y: F.smooth_l1_loss(m(x), y)  # noqa: E731
        spec = {"x": (32, 4), "y": (32, 1)}
        make_opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.1)  # noqa: E731
    elif name == "moons":
        from test_from_torch import MicroMLP, moons_loss

        module, loss, spec = MicroMLP(), moons_loss, {"x": (100, 2), "y": (100, 1)}
        make_opt = lambda m: torch.optim.SGD(m.parameters(), lr=0.1)  # noqa: E731
    else:
        from from_torch_models import VAE, vae_loss

        module, loss, spec = VAE(784, 400, 20), vae_loss, {"x": (128, 784), "eps": (128, 20)}
        make_opt = lambda m: torch.optim.Adam(m.parameters(), lr=1e-3)  # noqa: E731
    template = copy.deepcopy(module)
    program = aot.from_torch(module, loss, {k: aot.f32(*v) for k, v in spec.items()}, make_opt(module), name=f"ft_{name}")

    def batch(rng):
        out = {k: rng.uniform(0.05, 0.95, v).astype(np.float32) for k, v in spec.items()}
        if name == "moons":
            out["y"] = np.sign(out["y"] - 0.5).astype(np.float32)
        if name == "vae":
            out["eps"] = rng.standard_normal(spec["eps"]).astype(np.float32)
        return out

    return {"program": program, "batch": batch, "entries": {"step": lambda b: b},
            "torch_module": lambda: copy.deepcopy(template),
            "torch_opts": lambda m, capturable: [_capturable(make_opt(m), capturable)],
            "torch_iter": lambda m, o, b: [_torch_step(o[0], lambda: loss(m, **b))]}


def from_torch_case(name, batch=32):
    import copy

    import torch

    import aot

    sys.path.insert(0, str(ROOT / "tests"))
    from torch_models import make

    torch.manual_seed(0)
    module, loss, spec = make(name, "full", batch=batch)
    template = copy.deepcopy(module)
    decl = {k: (aot.f32 if dt == "f32" else aot.i32)(*shape) for k, (dt, shape) in spec.items()}
    program = aot.from_torch(module, loss, decl, torch.optim.Adam(module.parameters(), lr=1e-3), name=f"ft_{name}")

    def make_batch(rng):
        return {k: rng.integers(0, FROM_TORCH[name][k], shape).astype(np.int32) if dt == "i32"
                else rng.standard_normal(shape).astype(np.float32) for k, (dt, shape) in spec.items()}

    return {
        "program": program,
        "batch": make_batch,
        "entries": {"step": lambda b: b},
        "torch_module": lambda: copy.deepcopy(template),
        "torch_opts": lambda m, capturable: [torch.optim.Adam(m.parameters(), lr=1e-3, capturable=capturable)],
        "torch_iter": lambda m, opts, b: [_torch_step(opts[0], lambda: loss(m, **b))],
    }


CASES = {"resnet20": resnet20_case, "dcgan": dcgan_case, "lstm_lm": lstm_lm_case,
         **{f"ft_{n}": (lambda n=n: from_torch_case(n)) for n in FROM_TORCH},
         **{f"ft_{n}": (lambda n=n: gpt_case(n)) for n in GPTS},
         **{f"ft_{n}": (lambda n=n: twin_case(n)) for n in ("resnet20", "dcgan", "mnist")},
         **{f"ft_{n}": (lambda n=n: small_case(n)) for n in ("regression", "moons", "vae")}}


def _capturable(opt, capturable):
    if capturable:
        for g in opt.param_groups:
            if "capturable" in g:
                g["capturable"] = True
    return opt


def _torch_step(opt, loss_fn, clip=None, params=None):
    import torch

    opt.zero_grad(set_to_none=True)
    loss = loss_fn()
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(list(params), clip)
    opt.step()
    return loss


# ---- the two sides ------------------------------------------------------------------------------


def bench_aot(case, batches, steps, k, outdir):
    prog = case["program"]
    t = time.perf_counter()
    path = build(prog, outdir, force=True)
    build_s = time.perf_counter() - t
    sys.path.insert(0, str(path))
    for name in [m for m in sys.modules if m == prog.name or m.startswith(prog.name + ".")]:
        del sys.modules[name]
    model = __import__(prog.name).Model()
    sd = model.state_dict()
    it = iter(range(10**9))

    def iteration():
        b = batches[next(it) % len(batches)]
        for entry, pick in case["entries"].items():
            getattr(model, entry)(**pick(b))

    out = {"build_s": round(build_s, 2), "kernel_set": model.kernel_set, "adapter": model.adapter.get("device", "?")}
    out["iters_per_s"] = round(1 / timed(iteration, steps), 2)
    many = {}
    for entry, pick in case["entries"].items():
        many[entry] = {n: np.stack([pick(batches[i % len(batches)])[n] for i in range(k)]) for n in pick(batches[0])}

    def iteration_many():  # K steps of each entry per call: the entries alternate per K, not per step
        for entry, stacked in many.items():
            getattr(model, entry.replace("step", "step_many", 1))(**stacked)

    out["step_many"] = {"k": k, "iters_per_s": round(k / timed(iteration_many, max(3, steps // k * 2), warmup=1), 2)}
    model.close()
    return out, sd


def bench_torch(case, sd, batches, steps, anchors):
    try:
        import torch
    except ImportError:
        return {"skipped": "torch not installed"}
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tb = [{k: torch.as_tensor(v).to(dev).long() if v.dtype == np.int32 else torch.as_tensor(v).to(dev) for k, v in b.items()} for b in batches]

    def setup(capturable=False):
        m = case["torch_module"]()
        m.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in sd.items()}, strict=False)  # tied weights: one name
        m = m.to(dev).train()
        return m, case["torch_opts"](m, capturable)

    def eager(compiled=False):
        m, opts = setup()
        fwd = torch.compile(m) if compiled else m
        it = iter(range(10**9))

        def iteration():
            losses = case["torch_iter"](fwd, opts, tb[next(it) % len(tb)])
            return [x.item() for x in losses]  # aot reads each loss back too

        return {"iters_per_s": round(1 / timed(iteration, steps, warmup=5), 2)}

    def graph():
        if dev != "cuda":
            return {"skipped": "CUDA graphs need a CUDA device"}
        m, opts = setup(capturable=True)
        static = {k: v.clone() for k, v in tb[0].items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                case["torch_iter"](m, opts, static)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        for o in opts:
            o.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            losses = case["torch_iter"](m, opts, static)
        it = iter(range(10**9))

        def iteration():
            for k, v in tb[next(it) % len(tb)].items():
                static[k].copy_(v)
            g.replay()
            return [x.item() for x in losses]

        return {"iters_per_s": round(1 / timed(iteration, steps, warmup=5), 2)}

    res = {"device": torch.cuda.get_device_name() if dev == "cuda" else platform.processor() or "cpu", "torch": torch.__version__}
    runs = {"eager": eager, "compile": lambda: eager(compiled=True), "cuda_graph": graph}
    for name in [a for a in anchors if a in runs]:
        try:
            res[name] = runs[name]()
        except Exception as e:  # fail soft: no compiler, no CUDA, an op the anchor cannot capture
            res[name] = {"skipped": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
        print(f"  torch {name}: {res[name]}", flush=True)
    return res


def ratios(a, t):
    anchors = {n: v["iters_per_s"] for n, v in t.items() if isinstance(v, dict) and "iters_per_s" in v}
    if not anchors:
        return {}
    best = max(anchors, key=anchors.get)
    return {
        "torch_best": best,
        "torch_best_iters_per_s": anchors[best],
        "aot_step_vs_torch_best": round(a["iters_per_s"] / anchors[best], 3),
        "aot_step_many_vs_torch_best": round(a["step_many"]["iters_per_s"] / anchors[best], 3),
        "aot_step_vs": {n: round(a["iters_per_s"] / v, 3) for n, v in anchors.items()},
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="resnet20,dcgan,lstm_lm", help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--anchors", default="eager,compile,cuda_graph")
    ap.add_argument("--outdir", default="/tmp/aot-bench-models")
    ap.add_argument("--out", default="bench_models.json")
    args = ap.parse_args()
    results = {"machine": platform.node(), "python": platform.python_version(), "models": {}}
    for name in args.only.split(","):
        print(f"== {name}", flush=True)
        try:
            case = CASES[name]()
            rng = np.random.default_rng(0)
            batches = [case["batch"](rng) for _ in range(8)]
            a, sd = bench_aot(case, batches, args.steps, args.k, args.outdir)
        except Exception as e:  # a model aot cannot build at this size: recorded, the others still run
            results["models"][name] = {"failed": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
            print(results["models"][name], flush=True)
            continue
        print(json.dumps(a, indent=1), flush=True)
        t = bench_torch(case, sd, batches, args.steps, args.anchors.split(","))
        r = {"aot": a, "torch": t, "ratios": ratios(a, t)}
        print(json.dumps(r["ratios"], indent=1), flush=True)
        results["models"][name] = r
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")  # after each model
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
