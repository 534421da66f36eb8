"""The memory planner's buffers as arrays: which placed tensors a new one must avoid, in C.

plan._pack places tensors one by one at the lowest offset free over their lifetime. Scanning
every placed tensor in Python for each new one made planning quadratic with a large constant
(a 20,000-op chain keeps ~10,000 activations alive at once); here the scan is a few NumPy
operations over arrays kept sorted by (offset, size), with the same answer.
"""

from __future__ import annotations

import numpy as np


class Bin:
    """The tensors placed in one buffer: offset, size, first and last kernel, sorted by (offset, size)."""

    def __init__(self):
        self.n = 0
        self.cols = np.zeros((4, 64), dtype=np.int64)  # offset, size, start, end

    def add(self, off: int, size: int, start: int, end: int) -> None:
        if self.n == self.cols.shape[1]:
            self.cols = np.concatenate([self.cols, np.zeros_like(self.cols)], axis=1)
        o, sz = self.cols[0, : self.n], self.cols[1, : self.n]
        # after every entry with a smaller (offset, size): first by offset, then by size among equal offsets
        lo, hi = np.searchsorted(o, off, "left"), np.searchsorted(o, off, "right")
        at = lo + int(np.searchsorted(sz[lo:hi], size, "right"))
        self.cols[:, at + 1 : self.n + 1] = self.cols[:, at : self.n]
        self.cols[:, at] = (off, size, start, end)
        self.n += 1

    def first_free(self, size: int, start: int, end: int, gap: int) -> int:
        """The lowest offset where `size` elements overlap no tensor alive within `gap` kernels of
        [start, end] (lifetimes as kernel indices, inclusive)."""
        c = self.cols[:, : self.n]
        live = (c[3] + gap >= start) & (c[2] <= end + gap)
        o, sz = c[0][live], c[1][live]
        if len(o) == 0:
            return 0
        top = np.maximum.accumulate(o + sz)
        before = np.concatenate([[0], np.maximum(top[:-1], 0)])  # the lowest free offset below entry i
        fits = np.nonzero(before + size <= o)[0]
        return int(before[fits[0]]) if len(fits) else int(top[-1])
