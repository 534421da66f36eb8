"""Accuracy sweep of aot's unary ops against PyTorch float32, in ulps, on the real adapter.

    python scripts/ulp_sweep.py [--kernels gpu,subgroup,cpu] [--per-decade 24] [--out FILE.json]

The inputs: log-spaced magnitudes over the whole float32 range (subnormals to FLT_MAX) with
both signs, a dense grid on [-10, 10], values next to multiples of pi/2 (sin/cos reduction) and
the special values (+-0, +-inf, NaN, FLT_MAX, the smallest normal and subnormal). Every op's
graph sits in one Infer entry of one Program, compiled once per kernel set. The error of a value
is the distance of aot's and torch's float32 results counted in representable floats (so 1 is
one ulp); NaN against NaN is 0, NaN against a number is infinite. Both are also compared with
the exact values (torch in float64, rounded): "exact_max_ulp" for aot, "torch_exact_max_ulp" for
torch float32, and "worse_than_torch_ulp", the most aot's error exceeds torch's at one input. Where both results are below
the smallest normal (2^-126) the distance is 0: WGSL lets drivers flush subnormals (NVIDIA's do).
"bound_ulp" is the most aot is off at one input from the nearer of torch float32 and the exact
value (torch float32 itself is far off where its own intermediates overflow or go subnormal: silu
below -88.7, mish near -91); "subnormal_results" says what aot returned where the exact result
is subnormal (0, a subnormal or a normal number: a flushing GPU gives 0 there).
Prints and writes {"ops": {op: {kernel set: {"max_ulp": .., "at": x, "aot": .., "torch": ..}}}}.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

TINY = np.float32(2.0**-126)


def unary_ops():
    """{name: (aot function, torch function)}: the unary ops and activations of aot.ops, and powers."""
    import torch
    import torch.nn.functional as F

    from aot import ops

    return {
        "exp": (ops.exp, torch.exp),
        "log": (ops.log, torch.log),
        "sqrt": (ops.sqrt, torch.sqrt),
        "rsqrt": (ops.rsqrt, torch.rsqrt),
        "sin": (ops.sin, torch.sin),
        "cos": (ops.cos, torch.cos),
        "tanh": (ops.tanh, torch.tanh),
        "sigmoid": (ops.sigmoid, torch.sigmoid),
        "erf": (ops.erf, torch.erf),
        "gelu": (ops.gelu, F.gelu),
        "gelu_tanh": (lambda x: ops.gelu(x, approximate="tanh"), lambda x: F.gelu(x, approximate="tanh")),
        "silu": (ops.silu, F.silu),
        "log1p": (ops.log1p, torch.log1p),
        "expm1": (ops.expm1, torch.expm1),
        "softplus": (ops.softplus, F.softplus),
        "logsigmoid": (ops.logsigmoid, F.logsigmoid),
        "elu": (ops.elu, F.elu),
        "mish": (ops.mish, F.mish),
        "square": (ops.square, torch.square),
        "abs": (ops.abs, torch.abs),
        "relu": (ops.relu, torch.relu),
        # powers (issue 32): a constant exponent (pow_int_f32 / pow_frac_f32; x ** 3 is x * x * x),
        # a number base with the tensor as exponent (rpower)
        "pow_2.5": (lambda x: x**2.5, lambda x: x**2.5),
        "pow_-1.5": (lambda x: x**-1.5, lambda x: x**-1.5),
        "pow_0.3": (lambda x: x**0.3, lambda x: x**0.3),
        "pow_3": (lambda x: x**3, lambda x: x**3),
        "pow_7": (lambda x: x**7, lambda x: x**7),
        "pow_-7": (lambda x: x**-7, lambda x: x**-7),
        "2_pow": (lambda x: 2.0**x, lambda x: torch.pow(torch.tensor(2.0, dtype=x.dtype), x)),
        "10_pow": (lambda x: 10.0**x, lambda x: torch.pow(torch.tensor(10.0, dtype=x.dtype), x)),
        "0.5_pow": (lambda x: 0.5**x, lambda x: torch.pow(torch.tensor(0.5, dtype=x.dtype), x)),
    }


def sweep_inputs(per_decade: int = 24) -> np.ndarray:
    """The sweep's float32 inputs (module doc), sorted, without duplicates."""
    mags = 10.0 ** np.linspace(-45, math.log10(3.4e38), int(84 * per_decade))
    dense = np.linspace(-10, 10, 2001)
    k = np.arange(1, 200, dtype=np.float64)
    near_pio2 = np.concatenate([k * math.pi / 2, [1e4 * math.pi / 2, 12345.0, 16383.0, 16384.0, 1e5, 823549.6, 1e7, 2**24 + 2.0]])
    # where an intermediate of silu, mish, softplus goes subnormal (exp(x) for x < -87.3) while
    # the result stays normal: GPUs that flush subnormals (NVIDIA) must not make those 0
    tails = np.linspace(-105.0, -80.0, 251)
    fmax = np.finfo(np.float32).max
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, fmax, -fmax, float(TINY), 1e-45, -1e-45, 1.0, -1.0, 0.5, 3.92, 4.0]
    x = np.concatenate([mags, -mags, dense, tails, near_pio2, -near_pio2, special]).astype(np.float32)
    fin = x[np.isfinite(x) & (np.abs(x) < np.finfo(np.float32).max)]
    x = np.concatenate([x, np.nextafter(fin, np.float32(np.inf))])
    return np.unique(x)  # NaN kept once at the end


def ulp_distance(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Per element: the number of float32 values between got and want (module doc's rules)."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)

    def ordered(v):
        i = v.view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)

    d = np.abs(ordered(got) - ordered(want)).astype(np.float64)
    gn, wn = np.isnan(got), np.isnan(want)
    d = np.where(gn | wn, np.where(gn & wn, 0.0, np.inf), d)
    both_tiny = (np.abs(got) < TINY) & (np.abs(want) < TINY)
    return np.where(both_tiny, 0.0, d)


def build(kernels: str, x: np.ndarray, names=None):
    """One Program whose Infer entry returns every op of `names` applied to x; compiled."""
    import aot
    from aot import ops

    ops_ = unary_ops()
    names = list(names or ops_)

    class Empty(aot.Module):
        pass

    prog = aot.Program(
        f"ulp_sweep_{kernels}",
        model=Empty,
        infer={"f": aot.Infer(lambda m, x: ops.stack([ops_[n][0](x) for n in names], 0), inputs={"x": aot.f32(x.size)})},
    )
    return aot.compile(prog, kernels=kernels), names


def torch_values(x: np.ndarray, names, dtype="float32") -> dict[str, np.ndarray]:
    """torch's values at x: float32, or computed in float64 and rounded to float32 (the exact
    values, near enough, to tell which side of a disagreement is right)."""
    import torch

    ops_ = unary_ops()
    t = torch.from_numpy(x).to(getattr(torch, dtype))
    with torch.no_grad():
        return {n: ops_[n][1](t).to(torch.float32).numpy() for n in names}


def _tail_error(got, want, x) -> float:
    """max |got - want| / |x|; infinite where one side is not finite and the two differ."""
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    fin = np.isfinite(got) & np.isfinite(want)
    err = np.where(same, 0.0, np.where(fin, np.abs(np.where(fin, got, 0) - np.where(fin, want, 0)), np.inf))
    return float(np.max(err / np.abs(x), initial=0.0))


def sweep(kernels: str, x: np.ndarray, names=None):
    """{op: {"max_ulp", "at", "aot", "torch", "subnormal_inputs_max_ulp"}} for one kernel set,
    max_ulp over the inputs that are not subnormal (drivers may treat those as 0: log(1e-45) is
    -inf on lavapipe); with aot's and torch's values by op name."""
    model, names = build(kernels, x, names)
    try:
        got = dict(zip(names, model.f(x=x)))
        sweep.adapter = f"{model.adapter['name']} ({model.adapter['backend']}, {model.adapter['description']})"
    finally:
        model.close()
    want, exact = torch_values(x, names), torch_values(x, names, "float64")
    sub = (np.abs(x) < TINY) & (x != 0)
    tail = np.isfinite(x) & (x < -1)
    out = {}
    for n in names:
        d = ulp_distance(got[n], want[n])
        # where aot is further from torch float32 than `bound`, is it closer to the exact value?
        d_aot, d_torch = ulp_distance(got[n], exact[n]), ulp_distance(want[n], exact[n])
        i = int(np.argmax(np.where(sub, 0.0, d)))
        nearer = np.where(sub, 0.0, np.minimum(d, d_aot))
        b = int(np.argmax(nearer))
        tiny = ~sub & (np.abs(exact[n]) < TINY) & (exact[n] != 0)
        g = got[n][tiny]
        j = int(np.argmax(np.where(sub, 0.0, d_aot - d_torch)))
        out[n] = {
            "max_ulp": float(d[i]),
            "at": float(x[i]),
            "aot": float(got[n][i]),
            "torch": float(want[n][i]),
            "subnormal_inputs_max_ulp": float(d[sub].max(initial=0.0)),
            "bound_ulp": float(nearer[b]),
            "bound_at": float(x[b]),
            "subnormal_results": {
                "count": int(tiny.sum()),
                "zero": int((g == 0).sum()),
                "subnormal": int(((g != 0) & (np.abs(g) < TINY)).sum()),
                "normal": int((np.abs(g) >= TINY).sum()),
                "max_abs_error": float(np.max(np.abs(g.astype(np.float64) - exact[n][tiny]), initial=0.0)),
            },
            "exact_max_ulp": float(d_aot[~sub].max()),
            "torch_exact_max_ulp": float(d_torch[~sub].max()),
            "worse_than_torch_ulp": (
                float(d_aot[j] - d_torch[j]) if np.isfinite(d_aot[j] - d_torch[j]) else str(d_aot[j] - d_torch[j])
            ),
            "worse_than_torch_at": float(x[j]),
            # gelu's bounds (docs/API.md): ulps for -1 <= x <= 1.7e38, |aot - torch| / |x| below -1
            "max_ulp_x_from_-1": float(d[~sub & (x >= -1) & (x <= 1.7e38)].max()),
            "max_abs_diff_over_abs_x_below_-1": _tail_error(got[n][tail], want[n][tail], x[tail]),
        }
    return out, got, want, exact


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default="gpu,subgroup,cpu")
    ap.add_argument("--per-decade", type=int, default=24)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    x = sweep_inputs(args.per_decade)
    result = {"inputs": int(x.size), "ops": {}, "unavailable": {}}
    for ks in args.kernels.split(","):
        try:
            per_op = sweep(ks, x)[0]
        except Exception as e:  # noqa: BLE001 - e.g. an adapter without subgroups
            result["unavailable"][ks] = f"{type(e).__name__}: {e}"[:300]
            print(f"{ks}: unavailable ({result['unavailable'][ks]})")
            continue
        for n, r in per_op.items():
            result["ops"].setdefault(n, {})[ks] = r
        result["adapter"] = sweep.adapter
    for n, per in result["ops"].items():
        cells = "  ".join(f"{ks} {r['max_ulp']:g} (x={r['at']:.7g}) bound {r['bound_ulp']:g}" for ks, r in per.items())
        print(f"{n:12s} {cells}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return result


if __name__ == "__main__":
    main()
