"""Fuzz regression test (dims): seed 820015 of tests/fuzz_areas.py's "dims" area.

[dims] seed 820015: step at B=1, T=5: gradient of g3: 4/4 elements off (max error inf); at (0,):
got nan, expected -1.162529; [dims] seed 820015: step at B=6, T=5: gradient of g3: 4/4 elements
off (max error inf); at (0,): got nan, expected -7.264754; [dims] seed 820015: step at B=6, T=4:
gradient of g3: 4/4 elements off (max error inf); at (0,): got nan, expected -5.816989

The program (fuzz_areas.dims_source of generate_dims(820015)) and the oracle are the fuzzer's;
`python scripts/fuzz.py --areas dims --seed 820015 --minutes 0` runs it again.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fuzz_areas  # noqa: E402


@pytest.mark.gpu
def test_fuzz_dims_820015():
    res, _case = fuzz_areas.check('dims', 820015)
    assert not res.failures, "\n".join(map(str, res.failures))
