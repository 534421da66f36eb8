"""Fuzz regression test (noinput): seed 5310492 of tests/fuzz_areas.py's "noinput" area.

[noinput] seed 5310492: randn: step 4: loss: got -inf, expected -4.1030021426214316e+64;
[noinput] seed 5310492: randn: step 4: gradient of w: 15/15 elements off (max error inf); at (0,
0): got -7.030294e+25, expected -7.030293e+25; [noinput] seed 5310492: randn: step 4: parameter
w after the update: 15/15 elements off (max error inf); at (0, 0): got 7.030294e+24, expected
7.030293e+24

The program (fuzz_areas.noinput_source of generate_noinput(5310492)) and the oracle are the fuzzer's;
`python scripts/fuzz.py --areas noinput --seed 5310492 --minutes 0` runs it again.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fuzz_areas  # noqa: E402


@pytest.mark.gpu
def test_fuzz_noinput_5310492():
    res, _case = fuzz_areas.check('noinput', 5310492)
    assert not res.failures, "\n".join(map(str, res.failures))
