"""Accuracy of the unary ops against PyTorch float32, in ulps, on the real adapter (issue 32):
scripts/ulp_sweep.py's inputs (the whole float32 range, both signs, the special values) through
one compiled Program per kernel set. Every op is within BOUND ulps of torch (NaN where torch
gives NaN, the same infinities), except where docs/API.md says otherwise:
- gelu, gelu_tanh: 4 ulps for x >= -1; below, torch's 0.5 x (1 + erf(x / sqrt 2)) and
  0.5 x (1 + tanh(u)) cancel (relative error up to 10% at x = -5), so there the bound is an
  absolute one, a few ulps of 1 times |x|. aot's gelu_tanh is x sigmoid(2u), without the
  cancellation. For x > 1.7e38 torch's gelu overflows (inf, NaN at +inf) where aot gives x.
- subnormal inputs (WGSL lets drivers flush them; lavapipe does) and results that are both
  below the smallest normal count as equal (ulp_sweep.ulp_distance).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import ulp_sweep  # noqa: E402

BOUND = 4
GELU_TAIL = {"gelu": 3e-7, "gelu_tanh": 6e-8}  # |aot - torch| / |x| for x < -1


@pytest.fixture(scope="module")
def inputs():
    return ulp_sweep.sweep_inputs(per_decade=6)


@pytest.mark.parametrize("kernels", ["gpu", "subgroup", "cpu"])
def test_unary_ops_within_a_few_ulps_of_torch(inputs, kernels):
    x = inputs
    try:
        _, got, want, _ = ulp_sweep.sweep(kernels, x)
    except Exception as e:  # only an adapter without subgroups may refuse a kernel set
        if kernels == "subgroup" and "subgroup" in str(e).lower():
            pytest.skip(f"adapter without subgroups: {e}")
        raise
    normal = ~((np.abs(x) < ulp_sweep.TINY) & (x != 0))
    bad = {}
    for n in got:
        d = ulp_sweep.ulp_distance(got[n], want[n])
        check = normal.copy()
        if n in GELU_TAIL:
            check &= (x >= -1) & ~(x > 1.7e38)
            tail = normal & (x < -1) & np.isfinite(x)
            rel = np.abs(got[n][tail] - want[n][tail]) / np.abs(x[tail])
            if not rel.max() <= GELU_TAIL[n]:
                bad[n] = f"x < -1: |aot - torch| / |x| = {rel.max():.3g} > {GELU_TAIL[n]}"
            # torch's overflow, and aot's right answer there
            big = x > 1.7e38
            np.testing.assert_array_equal(got[n][big], x[big], err_msg=f"{kernels}: {n}(x) = x for huge x")
        worst = int(np.argmax(np.where(check, d, 0.0)))
        if d[worst] > BOUND:
            bad[n] = f"{d[worst]:g} ulps at x = {x[worst]!r}: aot {got[n][worst]!r}, torch {want[n][worst]!r}"
    assert not bad, f"{kernels}: " + "; ".join(f"{n}: {m}" for n, m in bad.items())


def test_committed_lavapipe_sweep_meets_the_bounds():
    """scripts/results/ulp_sweep_lavapipe.json (the full sweep, 24 points a decade) says what
    docs/API.md claims: every op within BOUND ulps except gelu's documented tails."""
    import json

    res = json.loads((Path(__file__).resolve().parent.parent / "scripts/results/ulp_sweep_lavapipe.json").read_text())
    assert set(res["ops"]) == set(ulp_sweep.unary_ops())
    for n, per in res["ops"].items():
        for ks, r in per.items():
            if n not in GELU_TAIL:
                assert r["max_ulp"] <= BOUND, (n, ks, r)
            else:
                assert r["max_ulp_x_from_-1"] <= BOUND and r["max_abs_diff_over_abs_x_below_-1"] <= GELU_TAIL[n], (n, ks, r)
