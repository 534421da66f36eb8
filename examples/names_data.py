"""First names for the makemore and pokeformer samples: plain functions, nothing downloaded.

The corpus is the US census first-name lists that ship inside the `names` package on PyPI
(`dist.male.first` and `dist.female.first`, 1219 + 4275 names): the first column of each
line, lower-cased, kept when it is a-z only, de-duplicated and sorted, 5163 names in all.

The 90/10 train/test split is makemore's stable string hash: h = h * 31 + ord(c) over the
characters in 32-bit signed arithmetic; a name is held out when h mod 10 == 0. The same name
is on the same side on every machine and in every run.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

_LISTS = ("dist.male.first", "dist.female.first")
_WORD = re.compile(r"[a-z]+")


@functools.lru_cache(maxsize=1)
def load_names() -> tuple[str, ...]:
    """Every census first name, lower-cased, a-z only, unique, sorted."""
    try:
        import names  # the PyPI package `names` (a test dependency of aot)
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "the first-name corpus comes from the PyPI package `names` (its census lists): pip install names"
        ) from None

    folder = Path(names.__file__).resolve().parent
    out = set()
    for fname in _LISTS:
        for line in (folder / fname).read_text(encoding="ascii").splitlines():
            fields = line.split()
            if fields and _WORD.fullmatch(fields[0].lower()):
                out.add(fields[0].lower())
    return tuple(sorted(out))


def name_hash(name: str) -> int:
    """makemore's stable hash: h = h * 31 + code, wrapped to a signed 32-bit integer."""
    h = 0
    for ch in name:
        h = (h * 31 + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def is_test_name(name: str) -> bool:
    """About 10% of names are held out (mod of the signed hash taken as a non-negative residue)."""
    return name_hash(name) % 10 == 0


def split_names(pool=None) -> tuple[list[str], list[str]]:
    """(train, test) lists of names, ~90/10, by `is_test_name`."""
    pool = load_names() if pool is None else pool
    train = [n for n in pool if not is_test_name(n)]
    test = [n for n in pool if is_test_name(n)]
    return train, test
