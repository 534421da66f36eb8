"""GPU time of the fused attention kernels (forward, dq, dk, dv) against PyTorch's attention.

    python scripts/bench_attention.py --out bench_attention.json
    python scripts/bench_attention.py --variants "chains=0 ku=1,chains=2 ku=2 wg=128" --out sweep.json

The problem is transformer_large's attention: q, k, v [32, 8, 256, 64] (B, heads, T, head
size), causal, f32. A program whose parameters are q, k and v and whose loss is
sum(attention(q, k, v) * w) is compiled in-process once per variant; its training entry is
profiled with timestamps between dispatches (scripts/profile_kernels.py) and the attention
kernels' times are reported (the median of --reps). A variant sets the GPU loop knobs of
aot/attention_codegen.py: chains (DOT_CHAINS), ku (KEYS_PER_STEP), wg (WG), dkv_floats (DKV_ROW_FLOATS), and the subgroup
set's lanes (LANES) and rows (LANE_ROWS) a group; with lanes > 1 and an adapter with subgroup
operations the subgroup set runs, otherwise the GPU set (`--kernels` picks one for all). `dkv=0` keeps dk and dv in kernels of
their own (aot/schedule.py SEPARATE_SIBLINGS), as they were before they shared one.
Before timing, each variant's gradients are checked against the first variant's.

PyTorch (when it and CUDA are present): the same forward and backward with
`scaled_dot_product_attention` (its memory-efficient kernel for f32) and with the attention
written out (matmul, mask, softmax, matmul), TF32 off, timed with CUDA events.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

SHAPE = (32, 8, 256, 64)
KNOBS = {"chains": "DOT_CHAINS", "ku": "KEYS_PER_STEP", "wg": "WG", "lanes": "LANES", "rows": "LANE_ROWS", "dkv_floats": "DKV_ROW_FLOATS", "dkv": None}


def program(shape, causal):
    import aot
    from aot import ops

    class Att(aot.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (self.param(shape) for _ in range(3))

    def loss(m, w):
        return ops.sum(ops.attention(m.q, m.k, m.v, causal=causal) * w)

    return aot.Program(
        "bench_attention",
        model=Att,
        train=aot.Train(loss, inputs={"w": aot.f32(*shape)}, optimizer=aot.optim.SGD(lr=0.0)),
        seed=0,
    )


def parse_variant(text: str) -> dict:
    out = {}
    for item in text.split():
        key, value = item.split("=")
        if key not in KNOBS:
            raise SystemExit(f"unknown knob {key!r} (knobs: {', '.join(KNOBS)})")
        out[key] = int(value)
    return out


def run_variant(variant: dict, shape, causal, reps: int, w: np.ndarray, kernels: str | None = None):
    import aot
    import aot.attention_codegen as ac
    import aot.schedule as sch
    from profile_kernels import profile_timestamps

    saved = {k: getattr(ac, v) for k, v in KNOBS.items() if v}
    for k, v in variant.items():
        if KNOBS[k]:
            setattr(ac, KNOBS[k], v)
    sch.SEPARATE_SIBLINGS = () if variant.get("dkv", 1) else ("attention_keys",)
    try:
        # the GPU set's kernels, or with lanes > 1 the subgroup set's (where the adapter has them)
        import wgpu

        subgroups = ac.LANES > 1 and "subgroup" in wgpu.gpu.request_adapter_sync(power_preference="high-performance").features
        model = aot.compile(program(shape, causal), kernels=kernels or ("subgroup" if subgroups else "gpu"))
    finally:
        for k, v in saved.items():
            setattr(ac, KNOBS[k], v)
        sch.SEPARATE_SIBLINGS = ()
    e = model._engine
    key = next(k for k in e.entries if k.startswith("train"))
    # the gradients, read back after one step (SGD at lr 0 leaves the parameters as they were)
    model.step(w=w)
    grads = model.grads()
    feats = set(e.device.features)
    if "timestamp-query" not in feats:
        model.close()
        raise SystemExit(f"{e.adapter_info.get('device', 'this adapter')} has no timestamp-query: kernel times cannot be taken")
    ns = profile_timestamps(e, key, reps, "timestamp-query-inside-passes" in feats)
    kernels = {}
    for (kname, _grid), t in zip(e.entries[key]["dispatches"], ns):
        if "attention" in kname:
            kernels[kname] = round(t / 1e3, 2)
    kernel_set = model.kernel_set
    model.close()
    return kernels, grads, kernel_set


def torch_times(shape, causal, reps: int) -> dict:
    try:
        import torch
    except ImportError:
        return {"skipped": "no torch"}
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA"}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda"
    q, k, v = (torch.randn(shape, device=dev, requires_grad=True) for _ in range(3))
    w = torch.randn(shape, device=dev)
    scale = shape[-1] ** -0.5
    mask = torch.ones(shape[-2], shape[-2], device=dev, dtype=torch.bool).tril()

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def math():
        s = (q @ k.transpose(-1, -2)) * scale
        if causal:
            s = s.masked_fill(~mask, float("-inf"))
        return torch.softmax(s, -1) @ v

    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    for name, f in (("sdpa", sdpa), ("written_out", math)):
        def step():
            y = f()
            q.grad = k.grad = v.grad = None
            (y * w).sum().backward()

        for _ in range(5):
            step()
        fwd, total = [], []
        for _ in range(reps):
            a, b, c = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            a.record()
            y = f()
            b.record()
            q.grad = k.grad = v.grad = None
            (y * w).sum().backward()
            c.record()
            torch.cuda.synchronize()
            fwd.append(a.elapsed_time(b) * 1e3)
            total.append(a.elapsed_time(c) * 1e3)
        out[name] = {"forward_us": round(float(np.median(fwd)), 1), "forward_backward_us": round(float(np.median(total)), 1)}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="", help="comma-separated variants, each 'knob=value ...' (default: as built)")
    ap.add_argument("--shape", default=",".join(map(str, SHAPE)), help="B,H,T,d")
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--kernels", choices=("gpu", "subgroup", "cpu"), help="this kernel set for every variant (default: by lanes)")
    ap.add_argument("--out")
    args = ap.parse_args()

    from profile_kernels import _request_timestamps

    _request_timestamps()
    shape = tuple(int(x) for x in args.shape.split(","))
    causal = not args.no_causal
    w = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    variants = [parse_variant(v) for v in args.variants.split(",")] if args.variants else [{}]
    results = []
    first = None
    for var in variants:
        kernels, grads, kernel_set = run_variant(var, shape, causal, args.reps, w, args.kernels)
        err = None
        if first is None:
            first = grads
        else:
            err = max(float(np.max(np.abs(grads[n] - first[n]))) / max(float(np.max(np.abs(first[n]))), 1e-30) for n in first)
        total = round(sum(kernels.values()), 1)
        results.append({"variant": var, "kernel_set": kernel_set, "attention_us": total, "kernels": kernels, "grad_rel_err_vs_first": err})
        print(f"{json.dumps(var):40s} {kernel_set:8s} {total:9.1f} us  " + "  ".join(f"{k.split('_', 2)[-1]} {v}" for k, v in kernels.items())
              + (f"  (grad rel err {err:.2e})" if err is not None else ""), flush=True)
    ref = torch_times(shape, causal, args.reps)
    print(json.dumps(ref))
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"machine": platform.node() or "?", "shape": shape, "causal": causal, "aot": results, "torch": ref}, indent=1))


if __name__ == "__main__":
    main()
