"""Fuzz regression test (noinput): seed 5910856 of tests/fuzz_areas.py's "noinput" area.

[noinput] seed 5910856: randn: step 4: parameter w after the update: 1/15 elements off (max
error inf); at (1, 2): got inf, expected 1.632685e+38

The program (fuzz_areas.noinput_source of generate_noinput(5910856)) and the oracle are the fuzzer's;
`python scripts/fuzz.py --areas noinput --seed 5910856 --minutes 0` runs it again.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fuzz_areas  # noqa: E402


@pytest.mark.gpu
def test_fuzz_noinput_5910856():
    res, _case = fuzz_areas.check('noinput', 5910856)
    assert not res.failures, "\n".join(map(str, res.failures))
