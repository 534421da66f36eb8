"""When a long reduction is cut in two stages: the sizing rule of passes.split_reductions, pure
shape arithmetic. ops.reductions.moments and nn_norm read it at trace time to cut a mean and a
variance where it cuts their sums; it imports nothing of aot (passes imports ops, which read it)."""

from __future__ import annotations

import math

# A reduction this long per output keeps too few GPU threads busy in one pass (one workgroup
# summing 19M gradients for the global norm took 28 ms on an H200); two passes take <0.5 ms.
SPLIT_CONTIGUOUS = 1 << 17  # reduced elements per output, reduced axes innermost
SPLIT_STRIDED = 4096  # reduced axes outer: chunks keep the reads coalesced as well
# Fewer rows than this (an LSTM's 87k-gradient norm, one row: 29 us on an H100 in one workgroup)
# are split from SPLIT_CONTIGUOUS_FEW elements: the second dispatch costs less than the long loop.
SPLIT_FEW_ROWS = 64
SPLIT_CONTIGUOUS_FEW = 1 << 15
STRIDED_INVOCATIONS_LOG2 = 18  # a strided split's first stage aims at this many invocations


# Reduced axes that are not one run (BatchNorm's (0, 2, 3) of [N, C, H, W]): with few outputs (C
# channels), one workgroup per channel walks N*H*W elements on C of the GPU's SMs. From
# SPLIT_SEPARATE_MIN elements per output the outermost reduced axis is cut into chunks so that
# the first stage has about SPLIT_ROWS rows of at least SPLIT_ROW_MIN elements. [H100, ResNet-20's
# gradient sums: 16 channels of 64x28x28, 100-105 us in one kernel, 24 + 19 us in two. 32
# channels of 64x14x14 (24-36 us each on 32 workgroups, 13 kernels) split too from 1 << 13: its
# step_many 394-396 -> 416-420 steps/s on an H200, 192 dispatches instead of 179; from 1 << 11,
# 64 channels of 64x7x7 as well, 414 (scripts/bench_rules.py, results/rules_resnet20_h200.json)]
SPLIT_SEPARATE_MIN = 1 << 13
SPLIT_ROWS = 512
SPLIT_ROW_MIN = 512


def split_plan(shape, axes, split: str, cells: bool = True):
    """_split_plan for a reduction of a tensor of `shape` over the sorted `axes` whose split
    is of kind `split` ("pad" or "divide", as OpDef.split). ops.reductions.moments cuts mean
    and variance where this cuts their sums (not in cells without its pivot: cells=False)."""
    x = _Shape(tuple(shape))
    red = 1
    for a in axes:
        red *= x.shape[a]
    if not axes or red <= 1:
        return None
    if list(axes) != list(range(axes[0], axes[-1] + 1)):
        return _split_outer_axis(x, axes, split, red, cells)
    lo, hi = axes[0], axes[-1] + 1
    inner = hi == x.ndim  # reduced elements are contiguous in memory
    few = x.size // red < SPLIT_FEW_ROWS and red >= SPLIT_CONTIGUOUS_FEW
    if red < (SPLIT_CONTIGUOUS if inner else SPLIT_STRIDED) and not (inner and few):
        return None
    if x.size // red >= 1 << STRIDED_INVOCATIONS_LOG2:
        # outputs enough to keep the GPU busy in one pass; a first stage would store outputs x
        # R/k partial sums (a gather's gradient, exact.select_sum, reduces a broadcast of
        # [rows, tokens, dim] that is never stored: its first stage would be)
        return None
    # strided: chunks of 16-64 rows, short enough that the first stage has ~2^18 invocations (an
    # [8192, 512] column sum in chunks of 64 ran 65536 of them at 0.45 TB/s on an H100)
    k = 4096 if inner else max(16, min(64, 1 << max(0, (x.size >> STRIDED_INVOCATIONS_LOG2).bit_length() - 1)))
    return _chunking(red, k, split, lo, hi)


class _Shape:
    """What the split rules read of the reduced tensor."""

    def __init__(self, shape: tuple):
        self.shape, self.ndim = shape, len(shape)
        self.size = 1
        for d in shape:
            self.size *= d


# Reduced axes in separate runs with kept axes between them (BatchNorm's (0, 2, 3) of [N, C, H,
# W]): with SPLIT_CELLS the first axis of the second run (H) is cut instead of the outermost one,
# and the first stage keeps the axes before the cut (N): about SPLIT_CELL_CHUNKS cells (n, h-chunk)
# of at least SPLIT_CELL_MIN elements, each summed for every channel. Where the kept axis is
# stored contiguously (a convolution's channels-last product), a first-stage workgroup takes one
# cell for all its channels (codegen.reduce_lanes), its invocations reading neighbouring
# addresses: ResNet-20's 16 channels of 64x28x28 in 448 cells of 4x28 rather than 32 chunks
# of 2 images whose workgroups each read every 16th float. 0: the outermost axis, as before.
# (Mean and variance, ops.reductions.moments, are cut there too: their squares are taken about a
# pivot, so that Chan's combination of many short chunks keeps its precision on offset data.)
# [H200, ResNet-20's step_many, scripts/bench_rules.py side by side: 390-407 steps/s before, 421-428
# with the cells (and codegen's tiles); 256, 512 or 1024 cells 443-448 alike:
# results/rules_resnet20_h200_res30d*.json. 1024 cells of a BatchNorm over [16, 4, 48, 48] at 1e6
# (one row each) left its weight gradient 4.2x float32 torch's error on the CPU set: 512]
SPLIT_CELLS = 1
SPLIT_CELL_CHUNKS = 512
SPLIT_CELL_MIN = 16


def _split_inner_run(x, axes, split, red):
    """(b, b + 1, k, 0): the first axis b of the second run of `axes` in chunks of k, a divisor,
    so that the cells (the reduced axes before b, times b's chunks) number about
    SPLIT_CELL_CHUNKS; None if no divisor gives cells of SPLIT_CELL_MIN elements or more."""
    b = next(a for i, a in enumerate(axes) if i and a != axes[i - 1] + 1)
    before = after = 1
    for a in axes:
        if a < b:
            before *= x.shape[a]
        elif a > b:
            after *= x.shape[a]
    size = x.shape[b]
    fits = [k for k in range(1, size + 1) if size % k == 0 and k * after >= SPLIT_CELL_MIN]
    if not fits or before * (size // fits[0]) < 2:
        return None
    k = min(fits, key=lambda k: (abs(math.log(before * (size // k) / SPLIT_CELL_CHUNKS)), k))
    return b, b + 1, k, 0


def _split_outer_axis(x, axes, split, red, cells=True):
    """Reduced axes in separate runs: cut the first axis of the second run (SPLIT_CELLS), or else
    the outermost one (see SPLIT_ROWS)."""
    lo = axes[0]
    n_out = x.size // red
    if red < SPLIT_SEPARATE_MIN or n_out >= SPLIT_ROWS:
        return None
    if SPLIT_CELLS and cells:
        plan = _split_inner_run(x, axes, split, red)
        if plan is not None:
            return plan
    chunks = min(x.shape[lo], -(-SPLIT_ROWS // n_out), red // SPLIT_ROW_MIN)
    if chunks < 2:
        return None
    return _chunking(x.shape[lo], -(-x.shape[lo] // chunks), split, lo, lo + 1)


def _chunking(size, k, split, lo, hi):
    """(lo, hi, k, pad) cutting an axis of `size` into chunks of k; for a split of kind "divide"
    (no padding value) k moves to a divisor of size: at most k if one of 16 or more is, else up
    to 64 (chunks of 16 or more), or for a short k the next larger one. None where there is none."""
    pad = -size % k
    if pad and split == "divide":
        near = [*range(k, 15, -1), *range(k + 1, 65)] if k >= 16 else range(k, size)
        k = next((d for d in near if size % d == 0), None)
        if k is None:
            return None
        pad = 0
    return lo, hi, k, pad
