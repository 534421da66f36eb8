"""Fuzz regression test (special): seed 920011 of tests/fuzz_areas.py's "special" area, an oracle fix.

norm(logsigmoid(50), p=3) ** ...: the cubes of 1.9e-22 are 0 in float32, so aot's norm (and its
gradient) is 0 where torch's double accumulator keeps it: KNOWN_DIFFERENCES accumulation, now
detected for |x|^p terms (fuzz_areas.POWER_SUMS).

`python scripts/fuzz.py --areas special --seed 920011 --minutes 0` runs it again.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fuzz_areas  # noqa: E402


@pytest.mark.gpu
def test_fuzz_special_920011():
    res, _case = fuzz_areas.check("special", 920011)
    assert not res.failures, "\n".join(map(str, res.failures))
