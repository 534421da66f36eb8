"""Fuzz regression test (optim): seed 820030 of tests/fuzz_areas.py's "optim" area.

[optim] seed 820030: RMSprop: step 5: parameter shift after the update: 1/1 off; at (0,): got
0.2875654995441437, expected 0.2881616950033065 (tolerance 0.000288)

The program (fuzz_areas.optim_source of generate_optim(820030)) and the oracle are the fuzzer's;
`python scripts/fuzz.py --areas optim --seed 820030 --minutes 0` runs it again.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fuzz_areas  # noqa: E402


@pytest.mark.gpu
def test_fuzz_optim_820030():
    res, _case = fuzz_areas.check('optim', 820030)
    assert not res.failures, "\n".join(map(str, res.failures))
