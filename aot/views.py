"""Views: how a tensor sits in another tensor's storage (a layout algebra of strided sub-dims).

reshape, transpose, narrow and broadcast_to of stored data are views, and so is a leading-axis
concat of adjacent slices; the schedule reads them in place instead of copying. Each op's view
rule (OpDef.view, aot/ops/layout.py) builds its View with this algebra.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ir import Tensor


def contiguous_strides(shape) -> tuple[int, ...]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return tuple(reversed(out))


@dataclass(frozen=True)
class View:
    """How a tensor sits in its base's storage. Each axis is a row-major list of sub-dims
    ((size, stride), ...): element (c0, c1, ...) lives at offset + sum over axes of c_i split
    over its sub-dims. One sub-dim per axis is an ordinary strided view; several come from a
    reshape of a permuted view (heads split or merged), which therefore needs no copy."""

    base: Tensor
    offset: int
    dims: tuple  # per axis: ((size, stride), ...)

    @staticmethod
    def contiguous(base: Tensor, offset: int = 0, shape=None) -> "View":
        shape = base.shape if shape is None else shape
        return View(base, offset, tuple(((d, st),) for d, st in zip(shape, contiguous_strides(shape))))

    def flat_dims(self) -> list[tuple[int, int]]:
        """All sub-dims outermost first, size-1 dropped and contiguous neighbours merged."""
        return merge_subdims([sd for axis in self.dims for sd in axis])

    def is_contiguous(self, shape=None) -> bool:
        fd = self.flat_dims()
        return not fd or (len(fd) == 1 and fd[0][1] == 1)

    def strides(self) -> tuple[int, ...] | None:
        """Plain per-axis strides, or None when an axis has several sub-dims."""
        out = []
        for axis in self.dims:
            real = [(n, st) for n, st in axis if n != 1]
            if len(real) > 1:
                return None
            out.append(real[0][1] if real else 0)
        return tuple(out)


def merge_subdims(subdims) -> list[tuple[int, int]]:
    """Drop size-1 sub-dims and merge neighbours where the outer one steps over the inner one."""
    out: list[tuple[int, int]] = []
    for size, st in subdims:
        if size == 1:
            continue
        if out and out[-1][1] == st * size:
            out[-1] = (out[-1][0] * size, st)
        else:
            out.append((size, st))
    return out


def regroup(subdims: list[tuple[int, int]], shape) -> tuple | None:
    """Split a row-major sub-dim sequence into the axes of `shape` (a reshape); None if impossible."""
    seq = [sd for sd in subdims if sd[0] != 1]
    out = []
    for d in shape:
        axis, need = [], d
        while need > 1:
            if not seq:
                return None
            size, st = seq[0]
            if need % size == 0:
                axis.append((size, st))
                seq.pop(0)
                need //= size
            elif size % need == 0:
                axis.append((need, st * (size // need)))
                seq[0] = (size // need, st)
                need = 1
            else:
                return None
        out.append(tuple(axis) if axis else ((1, 0),))
    return tuple(out) if not seq else None
