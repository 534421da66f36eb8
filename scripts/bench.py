"""Benchmark generated packages side by side with PyTorch in the same run; writes JSON.

    python scripts/bench.py [--out bench.json] [--steps 50] [--k 50] [--large] [--only NAME] [--anchors eager,compile,...]

Models: sine_mlp, addition_transformer, lstm_lm (examples/lstm_lm.py against its twin
examples/lstm_lm_torch.py), and with --large transformer_large. For each model: build time, kernels per training step and per predict, GPU bytes (planned,
one-buffer-per-tensor, and the lower bound params + grads + optimizer state + largest live
activation set), training steps/s through step() and through step_many (K steps per call), per-step host
overhead (the time spent outside waiting for the GPU), predict latency; and the same model in
PyTorch (CUDA when available, else CPU) on identical initial parameters: eager, eager with
scaled_dot_product_attention (transformers), torch.compile and one CUDA graph per step, each
skipped with a reason where it cannot run, with aot's ratio to each and to the best. Ratios are what to read on a shared machine;
absolute times count only from a GPU. The models of issues 30 and 31 (ResNet-20, DCGAN, the LSTM LM
and the public PyTorch models compiled by `aot.from_torch`) are timed the same way by
scripts/bench_models.py, from the package's state_dict.
"""

from __future__ import annotations

import argparse
import gc
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

from aot.pipeline import build, compile_program  # noqa: E402


def load(name):
    return runpy.run_path(str(ROOT / "examples" / f"{name}.py"))


def memory(c) -> dict:
    arenas = c.program["arenas"]
    planned = 4 * sum(arenas.values())
    fixed = 4 * sum(n for a, n in arenas.items() if not a.startswith("work"))
    return {
        "planned_bytes": planned,
        "unpooled_bytes": fixed + 4 * max(p.work_unpooled for p in c.plans.values()),
        "lower_bound_bytes": fixed + 4 * max(p.work_peak_live for p in c.plans.values()),
        "work_bytes": 4 * arenas["work"],
    }


def timed(fn, n, warmup=3):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return ts


def bench_aot(program, make_batch, predict_inputs, steps, outdir, k_many, merge=True, kernels="auto"):
    t = time.perf_counter()
    c = compile_program(program, merge_dispatches=merge)
    path = build(program, outdir, merge_dispatches=merge, force=True)
    build_s = time.perf_counter() - t
    sys.path.insert(0, str(path))
    for name in [m for m in sys.modules if m == program.name or m.startswith(program.name + ".")]:
        del sys.modules[name]  # an example module of the same name may have been imported
    mod = __import__(program.name)
    model = mod.Model(kernels=kernels)
    params0 = model.params()  # every anchor starts from these
    rng = np.random.default_rng(0)
    batches = [make_batch(rng) for _ in range(8)]
    host, it = [], iter(range(10**9))

    def step():
        b = batches[next(it) % len(batches)]
        t0 = time.perf_counter()
        model.step(**b)
        host.append(time.perf_counter() - t0 - model._engine.last_timing[1])

    ts = timed(step, steps)
    host = host[-steps:]
    # step_many: K steps per call, batches stacked on a leading axis (stacking is not timed)
    stacked = {n: np.stack([batches[i % len(batches)][n] for i in range(k_many)]) for n in batches[0]}
    many_host = []

    def many():
        model.step_many(**stacked)
        many_host.append(model._engine.last_timing[0])

    tm = timed(many, max(3, steps // k_many * 2), warmup=1)
    pred = {}
    for label, inputs in predict_inputs.items():
        pt = timed(lambda: model.predict(**inputs), max(steps, 10))
        pred[label] = statistics.median(pt) * 1e3
    out = {
        "build_s": round(build_s, 3),
        "kernel_set": model.kernel_set,
        "kernels_per_step": len(c.kernels["train"]),
        "dispatches_per_step": len(c.dispatches["train"]),
        "dispatches_per_predict": {k: len(v) for k, v in c.dispatches.items() if k != "train"},
        "memory": memory(c),
        "steps_per_s": round(1 / statistics.median(ts), 2),
        "step_ms_median": round(statistics.median(ts) * 1e3, 3),
        "host_overhead_us_median": round(statistics.median(host) * 1e6, 1),
        "step_many": {
            "k": k_many,
            "steps_per_s": round(k_many / statistics.median(tm), 2),
            "host_us_per_step_median": round(statistics.median(many_host) / k_many * 1e6, 1),
        },
        "predict_ms_median": {k: round(v, 3) for k, v in pred.items()},
        "adapter": model._engine.adapter_info.get("device", "?"),
    }
    model.close()
    return out, params0


def _sdpa_block_forward(self, x):
    """torch_reference.Block.forward with F.scaled_dot_product_attention (same math, fused)."""
    import torch

    b, t, d = x.shape
    h = self.ln1(x)

    def heads(z):
        return z.view(b, t, self.heads, d // self.heads).transpose(1, 2)

    att = torch.nn.functional.scaled_dot_product_attention(heads(self.q(h)), heads(self.k(h)), heads(self.v(h)), is_causal=True)
    x = x + self.o(att.transpose(1, 2).reshape(b, t, d))
    return x + self.fc2(torch.relu(self.fc1(self.ln2(x))))


def bench_torch(kind, params, make_batch, predict_inputs, steps, cfg, anchors, k_many):
    """PyTorch anchors from the same initial parameters, each failing soft ({"skipped": why}):
    eager, eager with scaled_dot_product_attention (transformers), torch.compile, and the whole
    step (forward, backward, clipping, capturable Adam/AdamW) captured in one CUDA graph and
    replayed, reading the loss back every step ("cuda_graph") or once per K steps
    ("cuda_graph_k", like step_many)."""
    try:
        import torch

        import torch_reference as tr
    except ImportError:
        return {"skipped": "torch not installed"}
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rng = np.random.default_rng(0)

    def to_dev(b):
        return {k: torch.as_tensor(v).to(dev).long() if v.dtype == np.int32 else torch.as_tensor(v).to(dev) for k, v in b.items()}

    batches = [to_dev(make_batch(rng)) for _ in range(8)]

    def setup(capturable=False, sdpa=False):
        if kind == "mlp":
            model = tr.from_aot(tr.MLP(), params).to(dev)
            opt = torch.optim.Adam(model.parameters(), lr=5e-3, capturable=capturable)

            def loss_fn(m, b):
                return ((m(b["x"]) - b["y"]) ** 2).mean()
        elif kind == "lstm":  # examples/lstm_lm.py: Adam 1e-2, clipped at 1.0 (train_step clips)
            twin = load("lstm_lm_torch")
            model = twin["from_aot"](params).to(dev)
            opt = torch.optim.Adam(model.parameters(), lr=1e-2, capturable=capturable)

            def loss_fn(m, b):
                return twin["loss"](m, b["tokens"], b["targets"], b["mask"])
        else:
            model = tr.from_aot(tr.Transformer(**cfg), params).to(dev)
            if sdpa:
                import types

                for blk in model.modules():
                    if isinstance(blk, tr.Block):
                        blk.forward = types.MethodType(_sdpa_block_forward, blk)
            decay = [p for n, p in model.named_parameters() if tr.aot_name(n).split(".")[-1] in ("W", "pos_emb")]
            rest = [p for n, p in model.named_parameters() if tr.aot_name(n).split(".")[-1] not in ("W", "pos_emb")]
            groups = [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}]
            opt = torch.optim.AdamW(groups, lr=5e-3, capturable=capturable)

            def loss_fn(m, b):
                return tr.transformer_loss(m, b["tokens"], b["targets"], b["mask"])

        return model, opt, loss_fn

    def train_step(model, opt, loss_fn, fwd, b):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(fwd, b)
        loss.backward()
        if kind != "mlp":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    def eager(sdpa=False, compiled=False):
        model, opt, loss_fn = setup(sdpa=sdpa)
        fwd = torch.compile(model) if compiled else model
        it = iter(range(10**9))

        def step():
            return train_step(model, opt, loss_fn, fwd, batches[next(it) % len(batches)]).item()  # aot's readback

        return {"steps_per_s": round(1 / statistics.median(timed(step, steps, warmup=5)), 2)}

    def graph():
        if dev != "cuda":
            return {"skipped": "CUDA graphs need a CUDA device"}
        model, opt, loss_fn = setup(capturable=True)
        static = {k: v.clone() for k, v in batches[0].items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                train_step(model, opt, loss_fn, model, static)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            static_loss = train_step(model, opt, loss_fn, model, static)
        it = iter(range(10**9))

        def step():
            b = batches[next(it) % len(batches)]
            for k, v in b.items():
                static[k].copy_(v)
            g.replay()
            return static_loss.item()

        out = {"steps_per_s": round(1 / statistics.median(timed(step, steps, warmup=5)), 2)}
        losses = torch.zeros(k_many, device=dev)

        def many():
            for i in range(k_many):
                b = batches[next(it) % len(batches)]
                for k, v in b.items():
                    static[k].copy_(v)
                g.replay()
                losses[i].copy_(static_loss)
            return losses.cpu()

        tk = timed(many, max(3, steps // k_many * 2), warmup=1)
        return out, {"k": k_many, "steps_per_s": round(k_many / statistics.median(tk), 2)}

    res = {"device": torch.cuda.get_device_name() if dev == "cuda" else platform.processor() or "cpu", "torch": torch.__version__}
    runs = {"eager": lambda: eager(), "compile": lambda: eager(compiled=True), "cuda_graph": graph}
    if kind == "transformer":
        runs["eager_sdpa"] = lambda: eager(sdpa=True)
    for name in [a for a in anchors if a in runs]:
        if dev == "cuda":  # each anchor's own peak: what it allocated beyond the shared batches
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            r = runs[name]()
            if isinstance(r, tuple):
                res[name], res[name + "_k"] = r
            else:
                res[name] = r
            if dev == "cuda":
                res[name]["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
                res[name]["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        except Exception as e:  # fail soft: a missing compiler, no CUDA, an unsupported op
            res[name] = {"skipped": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
        print(f"  torch {name}: {res[name]}", flush=True)
    model, _, _ = setup()
    pred = {}
    with torch.no_grad():
        for label, inputs in predict_inputs.items():
            ins = to_dev(inputs)
            arg = ins["x"] if kind == "mlp" else ins["tokens"]

            def run():
                model(arg).cpu()

            pred[label] = round(statistics.median(timed(run, max(steps, 10))) * 1e3, 3)
    res["predict_ms_median"] = pred
    return res


def ratios(a, t) -> dict:
    """aot's step() and step_many steps/s over each PyTorch anchor's and over the best of them."""
    anchors = {n: v["steps_per_s"] for n, v in t.items() if isinstance(v, dict) and "steps_per_s" in v}
    if not anchors:
        return {}
    best = max(anchors, key=anchors.get)
    out = {"torch_best": best, "torch_best_steps_per_s": anchors[best]}
    for label, sps in (("step", a["steps_per_s"]), ("step_many", a["step_many"]["steps_per_s"])):
        out[f"aot_{label}_vs_torch_best"] = round(sps / anchors[best], 3)
        out[f"aot_{label}_vs"] = {n: round(sps / v, 3) for n, v in anchors.items()}
    # aot's planned buffers (all it allocates for a step) over each anchor's peak of live tensors
    peaks = {n: v["peak_allocated_bytes"] for n, v in t.items() if isinstance(v, dict) and "peak_allocated_bytes" in v}
    if peaks:
        out["aot_planned_bytes_vs_torch_peak"] = {n: round(a["memory"]["planned_bytes"] / v, 3) for n, v in peaks.items()}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench.json")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--large", action="store_true", help="also the D=512, T=256, 6-block, B=32 transformer")
    ap.add_argument("--only", choices=["sine_mlp", "addition_transformer", "lstm_lm", "large"], help="run one model")
    ap.add_argument("--outdir", default="/tmp/aot-bench")
    ap.add_argument("--k", type=int, default=50, help="steps per step_many call (aot) and per readback (cuda_graph_k)")
    ap.add_argument("--anchors", default="eager,eager_sdpa,compile,cuda_graph", help="PyTorch anchors to run (comma-separated)")
    ap.add_argument("--also-kernels", default="", help="also aot with these kernel sets (comma-separated: gpu, subgroup)")
    ap.add_argument("--compare-unmerged", action="store_true", help="also aot with one dispatch per kernel (merge.py off)")
    args = ap.parse_args()

    sine = load("sine_mlp")
    addt = load("addition_transformer")
    lstm = load("lstm_lm")

    def sine_batch(rng):
        x = rng.uniform(-np.pi, np.pi, (256, 1)).astype(np.float32)
        return {"x": x, "y": np.sin(x)}

    def tok_batch(b, t, vocab):
        def make(rng):
            seq = rng.integers(0, vocab, (b, t + 1)).astype(np.int32)
            mask = np.zeros((b, t), np.float32)
            mask[:, -3:] = 1
            return {"tokens": seq[:, :t], "targets": seq[:, 1:], "mask": mask}

        return make

    cases = {
        "sine_mlp": (sine["program"], "mlp", sine_batch,
                     {"B=1": {"x": np.zeros((1, 1), np.float32)}, "B=256": {"x": np.zeros((256, 1), np.float32)}}, {}),
        "addition_transformer": (addt["program"], "transformer", addt["batch"],
                                 {"N=1": {"tokens": np.zeros((1, 8), np.int32)}, "N=128": {"tokens": np.zeros((128, 8), np.int32)}},
                                 {}),
        "lstm_lm": (lstm["program"], "lstm", tok_batch(lstm["B"], lstm["T"], lstm["VOCAB"]),
                    {"N=1": {"tokens": np.zeros((1, lstm["T"]), np.int32)}}, {}),
    }
    if args.large or args.only == "large":
        cfg = dict(vocab=12, d=512, layers=6, heads=8, mlp=2048, t=256)
        prog = load("transformer_large")["program"]
        cases["large"] = (prog, "transformer", tok_batch(32, 256, 12),
                          {"N=1": {"tokens": np.zeros((1, 256), np.int32)}}, cfg)
    results = {"machine": platform.node(), "python": platform.python_version(), "models": {}}
    for name, (prog, kind, make_batch, pinputs, cfg) in cases.items():
        if args.only and name != args.only:
            continue
        print(f"== {name}", flush=True)
        a, params = bench_aot(prog, make_batch, pinputs, args.steps, args.outdir, args.k)
        print(json.dumps(a, indent=1), flush=True)
        if args.compare_unmerged:
            a["unmerged"], _ = bench_aot(prog, make_batch, pinputs, args.steps, args.outdir + "-unmerged", args.k, merge=False)
            print(json.dumps(a["unmerged"], indent=1), flush=True)
        for ks in args.also_kernels.split(",") if args.also_kernels else []:
            a[f"kernels_{ks}"], _ = bench_aot(prog, make_batch, pinputs, args.steps, args.outdir + "-" + ks, args.k, kernels=ks)
            print(json.dumps(a[f"kernels_{ks}"], indent=1), flush=True)
        t = bench_torch(kind, params, make_batch, pinputs, args.steps, cfg, args.anchors.split(","), args.k)
        r = {"aot": a, "torch": t, "ratios": ratios(a, t)}
        print(json.dumps(r["ratios"], indent=1), flush=True)
        results["models"][name] = r
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
