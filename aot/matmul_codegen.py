"""Matmul kernel generator: MatmulSpec -> (WGSL source, workgroup grid).

One kernel computes, for every batch entry bi,
    C[bi, m, n] = epilogue(sum_k A[bi, m, k] * B[bi, k, n])      (or C += epilogue(...))
with A and B read through arbitrary element strides (transposes are swapped strides) and C
written contiguously. Every size is a build-time constant, so the tile shape is chosen per
matmul here and all guards a shape does not need are left out of its kernel.

The kernel is register-blocked: a workgroup owns a BM x BN tile of C and walks K in slabs;
each thread keeps TM x TN accumulators in scalar `var`s written out by the template
(`var acc: array<f32, 64>` spills to memory and runs 30-70x slower; DESIGN.md). The K rows
of a slab are written out too (unroll_k) or walked by a loop (less code to compile). Summation
order is fixed (k ascending within a split, splits added in index order): no atomics, so
results are bit-for-bit reproducible run to run. Slab loads read 4 floats at once where the
caller binds the buffer a second time as vec4s (Operand.vec_buf) and the layout allows it.

This module never reads or writes buffers; it only renders text.
"""

from __future__ import annotations

from dataclasses import dataclass

from aot.errors import CodegenError
from aot.templates import render

# WebGPU's guaranteed minimums (the defaults wgpu asks for).
MAX_INVOCATIONS = 256
MAX_WORKGROUP_BYTES = 16384
MAX_GROUPS_PER_DIM = 65535
# Mesa 22's lavapipe (llvmpipe's loop limiter) ends an invocation's loops after 65535 steps in
# all, silently (Mesa 25 has no such limit): the CPU kernel set keeps each invocation's loop
# steps under it.
LOOP_MAX = 65535
U32_MAX = 2**32 - 1


@dataclass(frozen=True)
class Operand:
    """How to read one matrix operand from a storage buffer (element units, f32)."""

    buf: str  # WGSL name of the storage binding holding it (array<f32>)
    offset: int  # element offset of batch 0, element [0, 0]
    batch_stride: int  # elements between consecutive batch entries (0 = shared by all batches)
    row_stride: int  # elements between rows (A: along M, B: along K)
    col_stride: int  # elements between cols (A: along K, B: along N)
    # Layouts plain strides cannot express (a head split/merge folded into the read): an
    # index split row-major into sub-dims ((size, stride), ...) that replace the stride above.
    batch_dims: tuple = ()
    row_dims: tuple = ()
    col_dims: tuple = ()
    # A computed operand (a prologue): elements come from the WGSL function `fn(bi, row, col)`
    # instead of `buf`; the strides above then only say which index is contiguous in the
    # memory it reads, so the tile loads still walk that index across threads.
    fn: str = ""
    # The same buffer bound a second time as array<vec4<f32>> ("" = not bound so): where the
    # layout allows (contiguous index of stride 1, every other stride and the offset multiples
    # of 4), the slab loads read 4 floats at once through it.
    vec_buf: str = ""
    # A WGSL expression of `offset` written in its place (an offset table's field,
    # wgsl_expr.KernelContext.start: the CPU kernel set), or "".
    start: str = ""

    def dims(self, which: str, length: int) -> tuple:
        """((size, stride), ...) of the batch, row or col index, outermost first."""
        given = {"batch": self.batch_dims, "row": self.row_dims, "col": self.col_dims}[which]
        if given:
            return tuple((int(n), int(st)) for n, st in given)
        return ((length, {"batch": self.batch_stride, "row": self.row_stride, "col": self.col_stride}[which]),)


@dataclass(frozen=True)
class MatmulSpec:
    batch: int
    M: int
    N: int
    K: int
    a: Operand
    b: Operand
    out_buf: str
    out_offset: int  # C[bi, m, n] lives at out_offset + bi*M*N + m*N + n
    # WGSL f32 expression of `acc` (f32 dot product) and the u32 locals `bi`, `row`, `col`
    epilogue: str = "acc"
    accumulate: bool = False  # C = C + epilogue(acc)
    # more outputs of C's shape, computed after C's value `v` at the same element:
    # (name, WGSL f32 expression of v / acc / bi / row / col / earlier names, buffer, element offset,
    # the let statements the expression reads, written before it)
    extra_stores: tuple = ()
    # render_matmul_cpu: a WGSL expression of out_offset written in its place (the element
    # offsets of extra_stores may be such expressions too), or ""
    out_start: str = ""


@dataclass(frozen=True)
class Tile:
    """One register-blocking shape.

    A workgroup computes BM x BN outputs with (BM/TM) x (BN/TN) x S threads; each thread holds
    TM x TN accumulators. S > 1 splits every K slab of S*BK between S thread groups inside
    the workgroup (each sums its own BK rows), and their partial sums are added in split
    order at the end: more parallelism for small-output, long-K products (weight gradients).
    `occupancy` is how many workgroups of this shape an SM runs at once (register bound),
    `efficiency` the fraction of FMA peak one fully occupied SM reaches (measured, H200).
    """

    name: str
    BM: int
    BN: int
    BK: int
    TM: int
    TN: int
    S: int = 1
    occupancy: int = 2
    efficiency: float = 0.3

    @property
    def threads(self) -> int:
        return (self.BM // self.TM) * (self.BN // self.TN) * self.S


# The tile table. Big products want 8x8 outputs per thread (two vec4 reads of shared memory
# feed 16 FMAs) and 16 K rows per slab (half the barriers per FMA of 8): 64x128 with K 16 is
# the largest such tile whose slabs fit WebGPU's default 16 KiB of workgroup memory (12.5 KiB).
# A tile only pays if the grid fills the GPU, so smaller outputs step down to 64x64 / 32x32
# tiles (more workgroups), and small outputs with a long K (weight gradients) use the
# in-workgroup split-K tiles (S=4), which cut the number of sequential K steps 4x; where even
# those leave the GPU idle, passes.split_long_matmuls splits K over workgroups (split_count).
# `choose_tile` ranks the tiles with the cost model `_estimate`.
#
# Measured on one H100 (scripts/bench_matmul.py, wgpu 0.32 on Vulkan) against torch.matmul
# (cuBLAS f32, TF32 off), TFLOP/s, with the tile the model picks
# (scripts/results/bench_matmul_h100_k16.json):
#   4096^3                          64x128_8x8_k16  38.1 vs 51.7  (74%; 128x128_8x8: 31.4)
#   8192x512x2048 fwd / dA          64x128_8x8_k16  37.0 / 36.0 vs 48.1 / 48.6
#   8192x2048x512 fwd / dA          64x128_8x8_k16  36.7 / 36.5 vs 49.9 / 47.4
#   2048x8192x512 (a weight grad)   64x128_8x8_k16  32.0 vs 51.2  (128 workgroups: 1 per SM)
#   512x8192x512  (a weight grad)   32x32_4x4_s4    23.4 vs 46.2  (in a model: split over K)
#   1024x64x256                     32x32_4x4_s4     5.1 vs 9.1
#   64x1024x64    (a weight grad)   16x16_2x2_s4     0.69 vs 1.33 (128x128: 0.10)
#   256x64x1                        16x16_2x2_s4     4.5 us vs 1.8 us (dispatch-bound)
# Tried (scripts/results/bench_matmul_double_h100.json): two slabs in workgroup memory (one
# barrier per step) is 5% faster on 128x128_8x8 but 10-25% slower on the K-16 tiles (more
# registers live); 128x128 with K 16 (16.6 KiB, over the default limit) reaches 37.9-38.2,
# 128x64 with 8x8 per thread 37.8, 64x128 with K 32 (25 KiB) 19.1: 74% is where this kernel
# shape levels off (scripts/results/bench_matmul_sweep2_h100.json). Without the prefetch the
# K-16 tiles lose 2% (4096^3) to 37% (a 2048x512 weight gradient, one workgroup per SM).
# `efficiency` is the measured fraction of the 67 TFLOP/s FMA peak at full occupancy.
TILES: tuple[Tile, ...] = (
    Tile("64x128_8x8_k16", 64, 128, 16, 8, 8, occupancy=4, efficiency=0.56),
    Tile("64x64_8x8_k16", 64, 64, 16, 8, 8, occupancy=6, efficiency=0.51),
    Tile("128x128_8x8", 128, 128, 8, 8, 8, occupancy=2, efficiency=0.46),
    Tile("128x64_8x4", 128, 64, 8, 8, 4, occupancy=3, efficiency=0.45),
    Tile("64x64_8x8", 64, 64, 8, 8, 8, occupancy=6, efficiency=0.45),
    Tile("64x64_4x4", 64, 64, 8, 4, 4, occupancy=5, efficiency=0.40),
    Tile("32x32_4x4_s4", 32, 32, 8, 4, 4, S=4, occupancy=4, efficiency=0.35),
    Tile("32x32_2x2", 32, 32, 16, 2, 2, occupancy=6, efficiency=0.22),
    Tile("16x16_2x2_s4", 16, 16, 16, 2, 2, S=4, occupancy=6, efficiency=0.18),
    Tile("16x16_1x1", 16, 16, 16, 1, 1, occupancy=8, efficiency=0.087),
)
# Tiles offered only to products with a computed operand (Operand.fn: a convolution's unfolded
# input, read through its index arithmetic inside the matmul). There each loaded element costs
# some 25 instructions besides its load, and a convolution's N (its output channels, 16-128)
# is narrow: tiles with few accumulators per thread, a width that fits N, and more threads
# to share the index arithmetic won. Measured on an H100 against every tile of the table with
# each one forced on ResNet-20's and DCGAN's convolutions (scripts/sweep_conv_tiles.py,
# scripts/results/bench_conv_h100_sweep_*.json): [50176, 144] @ [144, 16] (16 channels at
# 28x28, B 64) 42.4 us on 32x32_4x4_s4 -> 26.5 on 64x16_4x2_k16; DCGAN's [1024, 784] @
# [784, 128] x 4 91-102 us on 64x64_8x8_k16 -> 63-73 on 32x32_4x4_s4 (52-59 on 32x64_4x4_s2,
# which the model does not rank first there). Their `efficiency` values are not measured
# fractions of peak but fitted so that `_estimate` ranks the swept tiles as measured
# (_PROLOGUE_OPS with them).
CONV_TILES: tuple[Tile, ...] = (
    Tile("64x16_4x2_k16", 64, 16, 16, 4, 2, occupancy=8, efficiency=0.3),
    Tile("32x64_4x4_s2", 32, 64, 8, 4, 4, S=2, occupancy=4, efficiency=0.25),
    Tile("32x16_4x2_s4", 32, 16, 8, 4, 2, S=4, occupancy=4, efficiency=0.3),
    Tile("16x32_2x4_s4", 16, 32, 8, 2, 4, S=4, occupancy=4, efficiency=0.25),
) + tuple(t for t in TILES if t.name in ("32x32_4x4_s4", "32x32_2x2", "16x16_2x2_s4", "16x16_1x1"))
# (The table's tiles with 32-64 accumulators per thread ran 1.1-3.5x slower than the best one on
# every convolution swept, 128x64_8x4 worst: with the index arithmetic's registers they hold
# few workgroups per SM.)
TILES_BY_NAME = {t.name: t for t in TILES + CONV_TILES}

# Cost model constants (H100/H200 class; on smaller GPUs the ranking stays sensible).
_SMS = 132
_FMA_PER_SM_US = 128 * 1980  # FMAs per microsecond per SM at boost clock
_STEP_US = 0.4  # floor of one K step: global load latency + two barriers (measured 0.3-0.47)
# An SM running fewer than 8 warps hides less of the global-load latency. Measured on an H100
# (scripts/results/bench_matmul_split_h100.json): a [2048, 8192] @ [8192, 512] product on 128
# workgroups of 64x128_8x8_k16, 4 warps per SM, 533-541 us; the same work as 2-8 K chunks on
# 256-1024 workgroups, 450-470 us.
# Instructions per element of a computed operand (Operand.fn): an unfold's coordinate divisions,
# bounds checks and select, as the H100 times of scripts/sweep_conv_tiles.py rank the tiles.
_PROLOGUE_OPS = 25
_FEW_WARPS = 8
_FEW_WARPS_EFFICIENCY = 0.88


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _resident(spec: MatmulSpec, t: Tile) -> int:
    """Workgroups of this tile one SM runs at once for this product."""
    groups = spec.batch * _cdiv(spec.M, t.BM) * _cdiv(spec.N, t.BN)
    return min(t.occupancy, _cdiv(groups, _SMS))


def _estimate(spec: MatmulSpec, t: Tile) -> float:
    """Rough time in microseconds: waves of workgroups x K steps x max(latency, FMA work)."""
    groups = spec.batch * _cdiv(spec.M, t.BM) * _cdiv(spec.N, t.BN)
    per_sm = _resident(spec, t)
    waves = _cdiv(groups, _SMS * per_sm)
    steps = _cdiv(spec.K, t.BK * t.S)
    efficiency = t.efficiency * (_FEW_WARPS_EFFICIENCY if per_sm * t.threads < 32 * _FEW_WARPS else 1.0)
    work = per_sm * t.BM * t.BN * t.BK * t.S / (_FMA_PER_SM_US * efficiency)
    reduce = (t.S - 1) * 0.2
    # a computed operand's elements cost their index arithmetic, once per workgroup that loads them
    computed = (t.BM if spec.a.fn else 0) + (t.BN if spec.b.fn else 0)
    prologue = per_sm * computed * t.BK * t.S * _PROLOGUE_OPS / _FMA_PER_SM_US
    return waves * (steps * (max(_STEP_US, work) + prologue) + reduce)


# A product of at most this many multiply-adds is short enough to share a dispatch with other
# kernels (merge.py; schedule.Kernel.large; merge.MAX_WORK is the same size).
LARGE_MATMUL = 2**24
# merge.py joins only kernels of one workgroup size that synchronize, and the reductions and row
# kernels a small product would share a dispatch with run 256 invocations: a small conv product
# (ResNet-20's 1x1 shortcut convolutions) on the 128-thread 64x16_4x2_k16 took a dispatch of its
# own (ResNet-20's step 200 -> 202 dispatches, DCGAN's train_d 44 -> 46), which costs more than
# the tile saves on a product that small.
SHARED_DISPATCH_THREADS = 256


def choose_tile(spec: MatmulSpec) -> Tile:
    """The table entry with the lowest estimated time; near-ties (tiny products, where every
    tile sits on the latency floor) go to the tile with less work per thread. Products with a
    computed operand choose among CONV_TILES; those too small to run alone (LARGE_MATMUL) among
    its 256-thread tiles (SHARED_DISPATCH_THREADS)."""
    tiles = CONV_TILES if spec.a.fn or spec.b.fn else TILES
    if tiles is CONV_TILES and spec.batch * spec.M * spec.N * spec.K <= LARGE_MATMUL:
        tiles = tuple(t for t in tiles if t.threads == SHARED_DISPATCH_THREADS)
    return min(tiles, key=lambda t: _estimate(spec, t) * (1 + 5e-5 * t.BK * t.TM * t.TN))


# CPU adapters (lavapipe, SwiftShader) run a workgroup's invocations as SIMD lanes of one core:
# workgroup memory buys nothing there (the core's caches hold the operands) and every barrier
# splits the shader into pieces (lavapipe turns it into a coroutine), which costs run time and
# much more compile time. So the CPU kernel set's matmuls are a kernel of their own
# (render_matmul_cpu): each invocation sums TM x TN outputs over all of K, nothing shared.
@dataclass(frozen=True)
class CpuBlock:
    """One shape of the CPU matmul: a workgroup of WX x WY invocations computes a BM x BN block
    of C (BM = WY*TM, BN = WX*TN); each invocation TM consecutive rows and TN columns WX apart,
    so the SIMD lanes of one row of invocations read neighbouring elements of B and the same
    element of A. `rate` is its speed and `compile_ms` the time lavapipe takes to compile one
    such kernel (scripts/bench_matmul_cpu.py)."""

    name: str
    TM: int
    TN: int
    WX: int
    WY: int
    rate: float  # GFLOP/s of one workgroup on one core
    compile_ms: float

    @property
    def BM(self) -> int:
        return self.WY * self.TM

    @property
    def BN(self) -> int:
        return self.WX * self.TN


# Measured on lavapipe (Mesa 22.3, LLVM 15, 256-bit SIMD, 2 cores) at the addition transformer's
# and the sine MLP's shapes, plain and transposed operands (python scripts/bench_matmul_cpu.py,
# scripts/results/bench_matmul_cpu_lavapipe.json): medians of compile time and of GFLOP/s over
# the products of 2^20 or more multiply-adds, halved for one core. Compile time grows with the
# accumulators (then about half of it was the TM x TN output stores, written out), speed too.
# The GPU tiles that the CPU set used before, with their K loop and store loop: 64x64_8x8
# compiled in 288 ms at 1.32 GFLOP/s, 32x32_4x4_s4 in 616 ms at 0.65. Since the stores became
# one loop over the block (bench_matmul_cpu_lavapipe_m22_loops.json, ..._m25_loops.json, a quiet
# machine): compile 44 / 34 / 28 / 23 / 25 ms on Mesa 22 and 107 / 76 / 51 / 34 / 37 on Mesa 25
# (was 384 / 179 / 92 / 40 / 43), at 7.5 / 5.0 / 4.1 / 2.2 / 1.6 GFLOP/s on two cores (Mesa 22;
# 12.4 / 9.9 / 8.1 / 3.5 / 2.5 on Mesa 25). Rescaled to those figures the choice moved toward
# 4x4 blocks: 0.16 s less compiling on Mesa 25, steps 10% slower on Mesa 22; not taken.
CPU_BLOCKS: tuple[CpuBlock, ...] = (
    CpuBlock("8x8", 8, 8, 8, 8, rate=0.95, compile_ms=265),
    CpuBlock("8x4", 8, 4, 8, 8, rate=0.65, compile_ms=147),
    CpuBlock("4x4", 4, 4, 8, 8, rate=0.50, compile_ms=83),
    CpuBlock("2x2", 2, 2, 8, 8, rate=0.26, compile_ms=48),
    CpuBlock("4x1", 4, 1, 1, 64, rate=0.20, compile_ms=60),  # matrix-vector products
)
CPU_BLOCKS_BY_NAME = {b.name: b for b in CPU_BLOCKS}
CPU_CORES = 4  # workgroups a CPU adapter runs at once (one per core; small outputs want several)
# A CPU adapter compiles a kernel at its first dispatch (and, with Mesa's shader cache warm,
# never again): a block that compiles 0.1 s faster pays for itself unless the kernel runs
# 100 times 1 ms slower. Small products so get the small blocks.
CPU_CALLS_PER_COMPILE = 100


def cpu_seconds(spec: MatmulSpec, blk: CpuBlock) -> float:
    """Estimated run time of one call on a CPU adapter: the padded work, in waves of CPU_CORES
    workgroups."""
    groups = spec.batch * _cdiv(spec.M, blk.BM) * _cdiv(spec.N, blk.BN)
    return _cdiv(groups, CPU_CORES) * 2 * blk.BM * blk.BN * spec.K / (blk.rate * 1e9)


def choose_block_cpu(spec: MatmulSpec) -> CpuBlock:
    """The CPU block with the least run time over CPU_CALLS_PER_COMPILE calls plus compile time."""
    return min(CPU_BLOCKS, key=lambda b: CPU_CALLS_PER_COMPILE * cpu_seconds(spec, b) + b.compile_ms / 1e3)


# Splitting K over workgroups (passes.split_long_matmuls): S partial products as one batched
# matmul, then a sum over them. Worth it where the output has too few tiles to fill the GPU.
SPLIT_MIN_GAIN = 0.10  # the estimate must drop by this fraction (the model is rough; measured gains: 12-30%)
_SUM_BYTES_PER_US = 2.5e6  # what the sum over partial products streams (H100 HBM)
_DISPATCH_US = 4.0  # one more kernel


def _plain_spec(batch: int, M: int, N: int, K: int) -> MatmulSpec:
    return MatmulSpec(batch, M, N, K, Operand("A", 0, M * K, K, 1), Operand("B", 0, K * N, N, 1), "C", 0)


def split_count(M: int, N: int, K: int, min_chunk: int = 512, max_split: int = 64) -> int | None:
    """The number of K chunks (a divisor of K) that makes [M, K] @ [K, N] fastest by the cost
    model, counting the sum over the partial products; None when no split is estimated at
    least SPLIT_MIN_GAIN faster. 512x512 outputs with K = 8192 (a transformer's weight
    gradients): 4 chunks, 190 -> 126 us estimated (measured unsplit: 184 us on an H100)."""

    def estimate(s: int) -> float:
        spec = _plain_spec(s, M, N, K // s)
        t = choose_tile(spec)
        return _estimate(spec, t) + (0.0 if s == 1 else 4 * (s + 1) * M * N / _SUM_BYTES_PER_US + _DISPATCH_US)

    options = [s for s in range(2, min(max_split, K // min_chunk) + 1) if K % s == 0]
    if not options:
        return None
    best = min(options, key=estimate)
    return best if estimate(best) < (1 - SPLIT_MIN_GAIN) * estimate(1) else None


def choose_prefetch(spec: MatmulSpec, t: Tile) -> bool:
    """Whether to hold the next slab in registers while multiplying the current one.

    Prefetch hides global-load latency when an SM has few warps to switch between (64x64_8x8
    on a 2048x8192x512 weight gradient: 27.3 vs 16.0 TFLOP/s), but its extra registers cost
    the 64-accumulator tiles 3-7% once 8 or more warps per SM are resident (4096^3 on
    128x128_8x8: 31.2 without, 29.4 with). Measured on an H200.
    """
    if t.BK >= 16:  # the K-16 tiles were measured with it (4096^3 on 64x128_8x8_k16: 38.1 TFLOP/s)
        return True
    warps = _resident(spec, t) * t.threads // 32
    return not (t.TM * t.TN >= 64 and warps >= 8)


def _check(spec: MatmulSpec) -> None:
    for name in ("batch", "M", "N", "K"):
        if getattr(spec, name) < 1:
            raise CodegenError(f"matmul: {name} must be >= 1, got {getattr(spec, name)}")
    for label, op, rows, cols in (("a", spec.a, spec.M, spec.K), ("b", spec.b, spec.K, spec.N)):
        dims = op.dims("batch", spec.batch) + op.dims("row", rows) + op.dims("col", cols)
        if min([op.offset] + [st for _, st in dims]) < 0:
            raise CodegenError(f"matmul: operand {label} has a negative offset or stride: {op}")
        for which, n in (("batch", spec.batch), ("row", rows), ("col", cols)):
            got = 1
            for size, _ in op.dims(which, n):
                got *= size
            if got != n:
                raise CodegenError(f"matmul: operand {label} {which} sub-dims cover {got} indices, not {n}")
        last = op.offset + sum((size - 1) * st for size, st in dims)
        if last > U32_MAX:
            raise CodegenError(f"matmul: operand {label} reaches element {last}, past u32 indexing")
    if spec.out_offset < 0 or spec.out_offset + spec.batch * spec.M * spec.N - 1 > U32_MAX:
        raise CodegenError("matmul: output region does not fit u32 indexing")


def _check_tile(t: Tile, max_shared: int = MAX_WORKGROUP_BYTES) -> None:
    ok = (
        t.BM % t.TM == 0
        and t.BN % t.TN == 0
        and t.threads <= MAX_INVOCATIONS
        and _shared_bytes(t, pad_a=True, pad_b=True) <= max_shared
    )
    if not ok:
        raise CodegenError(f"matmul tile {t} breaks a WebGPU limit")


def _vec_width(n: int) -> int:
    """Width of the shared-memory vector loads feeding n registers (4, 2 or 1)."""
    return 4 if n % 4 == 0 else 2 if n % 2 == 0 else 1


def _shared_bytes(t: Tile, pad_a: bool, pad_b: bool) -> int:
    slab = t.BK * t.S
    words = slab * (t.BM + 4 * pad_a) + slab * (t.BN + 4 * pad_b)
    if t.S > 1:
        words += t.BM * t.BN
    return 4 * words


def _vec_loads(
    op: Operand, p_dims: tuple, k_dims: tuple, batch_dims: tuple, k_inner: bool, inner_len: int, K: int, p_len: int,
    vec_k_inner: bool,
) -> bool:
    """Whether the slab loads of this operand can read vec4s through `op.vec_buf`: 4
    consecutive elements of the contiguous index are 4 consecutive floats starting at a
    multiple of 4 for every thread, slab and batch entry (a clamped or guarded read moves by
    whole vec4s, so the lengths along that index are multiples of 4 too)."""
    if not op.vec_buf or op.fn or (k_inner and not vec_k_inner):
        return False
    inner_dims, outer_dims = (k_dims, p_dims) if k_inner else (p_dims, k_dims)
    size, stride = inner_dims[-1]
    others = [st for _, st in inner_dims[:-1] + outer_dims + batch_dims]
    return (
        stride == 1
        and size % 4 == 0
        and op.offset % 4 == 0
        and all(st % 4 == 0 for st in others)
        and inner_len % 4 == 0
        and (K if k_inner else p_len) % 4 == 0
    )


def _nests(inner: int, outer: int, threads: int) -> bool:
    """Whether inner x outer reads split evenly over the threads, rows whole or threads whole."""
    return (inner * outer) % threads == 0 and (threads % inner == 0 or inner % threads == 0)


def _loader(
    op: Operand,
    p_size: int,
    p_len: int,
    p_tile: str,
    p_first: bool,
    k_len: int,
    t: Tile,
    prefix: str,
    K: int = 0,
    batch: int = 1,
    vec_k_inner: bool = False,
):
    """How the workgroup's threads copy one operand's slab into shared memory.

    The slab is k_len (K) x p_size (M for A, N for B) elements, stored [k][p] with a row
    length of p_size + pad. Consecutive threads take consecutive elements along whichever
    dimension is contiguous in memory, so global reads coalesce for plain and transposed
    operands alike; where the layout allows (_vec_loads), each read is a vec4 of 4 neighbours
    along that dimension. Thread `tid` handles the reads starting at (p = p_thr + dp,
    k = k_thr + dk) for each (dp, dk) in `loads`; `stores` says where each read's floats go.
    """
    threads = t.threads
    rows, cols = (p_len, K) if p_first else (K, p_len)
    p_dims, k_dims = (op.dims("row", rows), op.dims("col", cols)) if p_first else (op.dims("col", cols), op.dims("row", rows))
    p_stride, k_stride = p_dims[-1][1], k_dims[-1][1]
    k_inner = k_stride <= p_stride  # k is the contiguous dimension: consecutive threads walk k
    inner_len, outer_len = (k_len, p_size) if k_inner else (p_size, k_len)
    vec = 4 if _vec_loads(op, p_dims, k_dims, op.dims("batch", batch), k_inner, inner_len, K, p_len, vec_k_inner) else 1
    if vec > 1 and not _nests(inner_len // vec, outer_len, threads):
        vec = 1  # too few vec4s for every thread to take the same number: scalar loads
    inner_reads = inner_len // vec
    total = inner_reads * outer_len
    if total % threads:
        raise CodegenError(
            f"matmul tile {t.name}: {total}-read slab does not split over {threads} threads"
        )
    scale = f" * {vec}u" if vec > 1 else ""
    if threads % inner_reads == 0:
        inner_expr, outer_expr = f"tid % {inner_reads}u{scale}", f"tid / {inner_reads}u"
        if inner_reads == 1:
            inner_expr = "0u"
        offsets = [(0, q * threads // inner_reads) for q in range(total // threads)]
    elif inner_reads % threads == 0:
        inner_expr, outer_expr = f"tid{scale}", "0u"
        offsets = [divmod(q * threads, inner_reads)[::-1] for q in range(total // threads)]
    else:
        raise CodegenError(f"matmul tile {t.name}: {inner_len} and {threads} threads do not nest")
    offsets = [(inner * vec, outer) for inner, outer in offsets]
    if k_inner:
        k_expr, p_expr = inner_expr, outer_expr
        loads = [(outer, inner) for inner, outer in offsets]  # (dp, dk)
    else:
        p_expr, k_expr = inner_expr, outer_expr
        loads = list(offsets)  # (dp, dk)
    # A [k][p] layout with k contiguous in memory means threads of one warp store down a
    # column; 4 words of padding per row spread those stores over all 32 banks.
    pad = 4 if k_inner else 0
    width = _vec_width(t.TM if prefix == "a" else t.TN)
    row_len = p_size + pad
    sources = sorted({dp for dp, _ in loads})
    items = []
    for dp, dk in loads:
        st = dk * row_len + dp
        if st % width:
            raise CodegenError(f"matmul tile {t.name}: shared store offset {st} not vector aligned")
        # (shared vector index relative to the thread's, lane or None for a whole vector, value)
        stores = []
        if vec == 1:
            stores.append((st // width, None if width == 1 else "lane", ""))
        elif k_inner:  # the 4 floats are 4 K rows of one column
            for q in range(4):
                stores.append(((st + q * row_len) // width, None if width == 1 else "lane", "." + "xyzw"[q]))
        else:  # 4 neighbours in one K row: whole vectors of the shared tile
            for q in range(0, 4, width):
                stores.append(((st + q) // width, None, "" if width == 4 else "." + "xyzw"[q : q + width]))
        items.append({"src": sources.index(dp), "dk": dk, "st": st // width, "stores": stores})
    return {
        "buf": op.buf,
        "fn": op.fn,
        "vec": vec,
        "vec_buf": op.vec_buf,
        "p_first": p_first,
        "p_expr": p_expr,
        "k_expr": k_expr,
        "p_tile": p_tile,
        "p_guard": p_len % p_size != 0,
        # clamped rows keep a vec4 read inside the operand (and aligned)
        "p_last": p_len - (vec if not k_inner else 1),
        "k_last": K - (vec if k_inner else 1),
        "p_dims": p_dims,
        "k_dims": k_dims,
        "sources": sources,
        "loads": items,
        "pad": pad,
        "row_len": row_len,
        "width": width,
        "words": k_len * row_len,
    }


def _loaders(spec: MatmulSpec, t: Tile, vec_k_inner: bool) -> tuple[dict, dict]:
    """The slab loaders of A and B for tile t."""
    slab = t.BK * t.S
    return (
        _loader(spec.a, t.BM, spec.M, "m0", True, slab, t, "a", spec.K, spec.batch, vec_k_inner),
        _loader(spec.b, t.BN, spec.N, "n0", False, slab, t, "b", spec.K, spec.batch, vec_k_inner),
    )


def vec_reads(spec: MatmulSpec, tile: Tile, vec_k_inner: bool = False) -> set[str]:
    """The vec4 bindings (Operand.vec_buf) that render_matmul(spec, tile=tile) reads."""
    return {ld["vec_buf"] for ld in _loaders(spec, tile, vec_k_inner) if ld["vec"] > 1}


def _grid(spec: MatmulSpec, t: Tile | CpuBlock, max_groups: int):
    tiles_n, tiles_m = _cdiv(spec.N, t.BN), _cdiv(spec.M, t.BM)
    if max(tiles_n, tiles_m, spec.batch) <= max_groups:
        return {"folded": False, "tiles_n": tiles_n, "tiles_m": tiles_m}, (tiles_n, tiles_m, spec.batch)
    # Too many tiles for one grid dimension: number the workgroups linearly over x, y, z
    # (x fastest) and let the surplus of the last row of the grid return at once.
    total = tiles_n * tiles_m * spec.batch
    gx = min(total, max_groups)
    gy = min(_cdiv(total, gx), max_groups)
    gz = _cdiv(total, gx * gy)
    if gz > max_groups:
        raise CodegenError(f"matmul: {total} workgroups exceed the WebGPU grid")
    info = {"folded": True, "tiles_n": tiles_n, "tiles_m": tiles_m, "total": total, "gx": gx, "gxy": gx * gy}
    return info, (gx, gy, gz)


def render_matmul(
    spec: MatmulSpec,
    name: str,
    header_comment: str,
    bindings: str,
    tile: Tile | str | None = None,
    prefetch: bool | None = None,
    max_groups: int = MAX_GROUPS_PER_DIM,
    unroll_k: bool = True,
    double_buffer: bool = False,
    max_shared: int = MAX_WORKGROUP_BYTES,
    vec_k_inner: bool = False,
) -> tuple[str, tuple[int, int, int]]:
    """Returns (wgsl_source, workgroup_count_xyz).

    `bindings` is the WGSL text of the @group(0) @binding(..) declarations, used verbatim (it
    declares out_buf, a.buf, b.buf and whatever the epilogue reads). `header_comment` is `//`
    lines put at the top. The entry point is `main`. The epilogue sees `acc: f32` and the u32
    values `bi`, `row`, `col`. Module-scope names the kernel itself declares: `tile_a`,
    `tile_b`, `partial`, `epilogue`, `store_c`.

    CPU adapters get render_matmul_cpu instead.

    `tile` (a Tile or a TILES name), `prefetch` and `max_groups` override the build-time
    choices (`choose_tile`, `choose_prefetch`, WebGPU's grid limit); they exist for benchmarks
    and tests. `unroll_k=False` loops over the K rows of a slab instead of writing them out:
    8-16x less code for a CPU adapter's compiler, 10-35% slower on an H100 (whose compiler does
    not unroll that loop; scripts/results/bench_matmul_loop_vs_unroll_h100.json).
    `double_buffer` keeps two slabs in workgroup memory (one barrier per K step instead of two);
    `max_shared` is the workgroup memory the kernel may use (WebGPU's default 16 KiB unless the
    device was created with more). An operand whose `vec_buf` names a vec4 binding of its buffer reads
    vec4s where its layout allows (_vec_loads): along M or N only, unless `vec_k_inner` (a
    benchmark option: along K they measured no faster on an H100).
    """
    _check(spec)
    if tile is None:
        tile = choose_tile(spec)
    elif isinstance(tile, str):
        tile = TILES_BY_NAME[tile]
    _check_tile(tile, max_shared)
    t = tile
    if prefetch is None:
        prefetch = choose_prefetch(spec, t)
    double_buffer = double_buffer and spec.K > t.BK * t.S  # one slab: nothing to overlap
    nbuf = 2 if double_buffer else 1
    slab = t.BK * t.S
    a, b = _loaders(spec, t, vec_k_inner)
    grid_info, grid = _grid(spec, t, max_groups)
    wx, wy = t.BN // t.TN, t.BM // t.TM
    ctx = dict(
        name=name,
        header_comment=header_comment.rstrip("\n"),
        bindings=bindings.strip("\n"),
        spec=spec,
        t=t,
        wx=wx,
        wy=wy,
        slab=slab,
        a=a,
        b=b,
        a_batch=_batch_expr(spec.a, spec.batch),
        b_batch=_batch_expr(spec.b, spec.batch),
        out_index=_out_index(spec),
        local_index=_out_index(spec, with_offset=False),
        k_guard=spec.K % slab != 0,
        out_guard=spec.M % t.BM != 0 or spec.N % t.BN != 0,
        grid=grid_info,
        prefetch=prefetch and spec.K > slab,
        unroll_k=unroll_k,
        # a product shorter than one slab multiplies only its K rows (the rest are zeros)
        k_steps=min(t.BK, spec.K) if t.S == 1 else t.BK,
        comps=["x", "y", "z", "w"],
        split_index=split_index,
        a_addr=_describe(spec.a, spec.batch, spec.M, spec.K, "m", "k"),
        b_addr=_describe(spec.b, spec.batch, spec.K, spec.N, "k", "n"),
        c_addr=_describe_out(spec),
        shared_bytes=4 * (nbuf * (a["words"] + b["words"]) + (t.BM * t.BN if t.S > 1 else 0)),
        double_buffer=double_buffer,
        nbuf=nbuf,
    )
    if ctx["shared_bytes"] > max_shared:
        raise CodegenError(f"matmul tile {t.name}: {ctx['shared_bytes']} bytes of workgroup memory")
    return render("wgsl/matmul.wgsl.j2", **ctx), grid


def render_matmul_cpu(
    spec: MatmulSpec,
    name: str,
    header_comment: str,
    bindings: str,
    block: CpuBlock | str | None = None,
    max_groups: int = MAX_GROUPS_PER_DIM,
) -> tuple[str, tuple[int, int, int]]:
    """Returns (wgsl_source, workgroup_count_xyz) of the CPU kernel set's matmul: the same
    product, bindings, epilogue and stores as render_matmul, computed without workgroup memory
    or barriers (matmul_cpu.wgsl.j2). `block` (a CpuBlock or a CPU_BLOCKS name) overrides
    choose_block_cpu; `max_groups` WebGPU's grid limit (for tests). Vec4 views are not read:
    a CPU adapter loads one lane at a time either way. Operand.start and spec.out_start, where
    given, are written in place of the offsets (the CPU set's offset table: codegen)."""
    _check(spec)
    if block is None:
        block = choose_block_cpu(spec)
    elif isinstance(block, str):
        block = CPU_BLOCKS_BY_NAME[block]
    blk = block
    if blk.WX * blk.WY > MAX_INVOCATIONS:
        raise CodegenError(f"matmul CPU block {blk} breaks a WebGPU limit")
    grid_info, grid = _grid(spec, blk, max_groups)
    clamp_m, clamp_n = spec.M % blk.BM != 0, spec.N % blk.BN != 0
    rows = [_offset_expr("row0", i, spec.M - 1 if clamp_m else None) for i in range(blk.TM)]
    cols = [_offset_expr("col0", j * blk.WX, spec.N - 1 if clamp_n else None) for j in range(blk.TN)]
    a = _cpu_reads(spec.a, spec.batch, spec.M, spec.K, rows, "a", "r", p_first=True)
    b = _cpu_reads(spec.b, spec.batch, spec.N, spec.K, cols, "b", "c", p_first=False)
    row0 = "m0" + (f" + tid * {blk.TM}u" if blk.WX == 1 else f" + tid / {blk.WX}u * {blk.TM}u") if blk.WY > 1 else "m0"
    col0 = "n0" + (f" + tid % {blk.WX}u" if blk.WX > 1 else "")
    ctx = dict(
        header_comment=header_comment.rstrip("\n"),
        bindings=bindings.strip("\n"),
        spec=spec,
        blk=blk,
        grid=grid_info,
        a=a,
        b=b,
        row0=row0,
        col0=col0,
        one_buf=spec.out_buf,
        out_index=(spec.out_start + " + " + _out_index(spec, with_offset=False)) if spec.out_start else _out_index(spec),
        local_index=_out_index(spec, with_offset=False),
        out_guard=clamp_m or clamp_n,
        a_addr=_describe(spec.a, spec.batch, spec.M, spec.K, "m", "k"),
        b_addr=_describe(spec.b, spec.batch, spec.K, spec.N, "k", "n"),
        c_addr=_describe_out(spec),
    )
    return render("wgsl/matmul_cpu.wgsl.j2", **ctx), grid


def _offset_expr(base: str, n: int, last: int | None) -> str:
    """`base + n`, clamped to `last` unless None."""
    expr = f"{base} + {n}u" if n else base
    return f"min({expr}, {last}u)" if last is not None else expr


def _scaled(expr: str, stride: int) -> str:
    """expr * stride as WGSL, parenthesised unless expr is a name or a call."""
    if stride == 0:
        return "0u"
    if stride == 1:
        return expr
    simple = expr.isidentifier() or (expr.startswith("min(") and expr.endswith(")"))
    return f"{expr} * {stride}u" if simple else f"({expr}) * {stride}u"


def _address(expr: str, dims: tuple) -> str:
    """Element offset of index `expr` over an operand's sub-dims ("0u" when none)."""
    if len(dims) == 1:
        return _scaled(expr, dims[0][1]) if dims[0][0] > 1 else "0u"
    return " + ".join(split_index(f"({expr})", dims)) or "0u"


def _cpu_reads(op: Operand, batch: int, p_len: int, K: int, ps: list, pre: str, tag: str, p_first: bool) -> dict:
    """How render_matmul_cpu reads one operand: element (p, k) of A (p = row) or B (p = column)
    for each of the invocation's p positions `ps` (WGSL expressions) at K row `k`. A plain
    operand's position offsets are added up once (`starts`), the K row's offset once per row
    (`k_terms`); a computed one (`fn`) is called with the clamped positions."""
    rows, cols = (p_len, K) if p_first else (K, p_len)
    if op.fn:
        starts = [(f"{pre}_{tag}{i}", p) for i, p in enumerate(ps) if not p.isidentifier()]
        names = [f"{pre}_{tag}{i}" if not p.isidentifier() else p for i, p in enumerate(ps)]
        calls = [f"{op.fn}(bi, {n}, k)" if p_first else f"{op.fn}(bi, k, {n})" for n in names]
        return {"starts": starts, "k_terms": [], "reads": calls}
    p_dims, k_dims = (op.dims("row", rows), op.dims("col", cols)) if p_first else (op.dims("col", cols), op.dims("row", rows))
    base = _batch_expr(op, batch)
    starts = []
    for i, p in enumerate(ps):
        off = _address(p, p_dims)
        starts.append((f"{pre}_{tag}{i}", (base[:-3] if off == "0u" and base else base + off) if base or off != "0u" else "0u"))
    k_off = _address("k", k_dims)
    k_terms = [(f"{pre}_k", k_off)] if k_off not in ("0u", "k") else []
    k_name = f" + {pre}_k" if k_terms else " + k" if k_off == "k" else ""
    reads = [f"{op.buf}[{name}{k_name}]" for name, _ in starts]
    return {"starts": starts, "k_terms": k_terms, "reads": reads}


def _batch_expr(op: Operand, batch: int) -> str:
    """The start of batch entry `bi` of an operand, as a prefix of an index sum ('' for 0)."""
    terms = [op.start] if op.start else [f"{op.offset}u"] if op.offset else []
    if batch > 1:
        terms += split_index("bi", op.dims("batch", batch))
    return "".join(term + " + " for term in terms)


def _describe(op: Operand, batch: int, rows: int, cols: int, r: str, c: str) -> str:
    """The operand's element address as a formula, for the kernel's header comment."""
    if op.fn:
        return f"{op.fn}(bi, {r}, {c}), computed as the tiles are loaded"
    terms = ([f"{op.offset}"] if op.offset else []) + (split_index("bi", op.dims("batch", batch)) if batch > 1 else [])
    terms += split_index(r, op.dims("row", rows)) + split_index(c, op.dims("col", cols))
    return f"{op.buf}[{' + '.join(terms) or '0'}]".replace("u ", " ").replace("u]", "]").replace("u)", ")")


def _describe_out(spec: MatmulSpec) -> str:
    """C's element address as a formula, for the header comment."""
    row = f"(bi * {spec.M} + m)" if spec.batch > 1 else "m"
    terms = ([f"{spec.out_offset}"] if spec.out_offset else []) + ([f"{row} * {spec.N}", "n"] if spec.N > 1 else [row])
    return f"{spec.out_buf}[{' + '.join(terms)}]"


def split_index(expr: str, dims) -> list[str]:
    """Address terms of index `expr` split row-major over sub-dims ((size, stride), ...)."""
    terms, inner = [], 1
    for i, (size, stride) in reversed(list(enumerate(dims))):
        if stride and size > 1:
            part = expr if inner == 1 else f"{expr} / {inner}u"
            if i > 0:
                part = f"({part}) % {size}u" if inner != 1 else f"{part} % {size}u"
            terms.append(part if stride == 1 else f"({part}) * {stride}u" if (" " in part) else f"{part} * {stride}u")
        inner *= size
    return list(reversed(terms))


def _out_index(spec: MatmulSpec, with_offset: bool = True) -> str:
    """out_offset + (bi * M + row) * N + col, without the terms that are always zero."""
    terms = [f"{spec.out_offset}u"] if spec.out_offset and with_offset else []
    rows = f"bi * {spec.M}u + row" if spec.batch > 1 else "row"
    if spec.N == 1:
        terms.append(rows)
    else:
        terms.append(f"({rows}) * {spec.N}u + col" if spec.batch > 1 else f"row * {spec.N}u + col")
    return " + ".join(terms)


def flops(spec: MatmulSpec) -> int:
    return 2 * spec.batch * spec.M * spec.N * spec.K


__all__ = [
    "Operand",
    "MatmulSpec",
    "Tile",
    "TILES",
    "choose_tile",
    "choose_prefetch",
    "CpuBlock",
    "CPU_BLOCKS",
    "LOOP_MAX",
    "choose_block_cpu",
    "render_matmul_cpu",
    "split_count",
    "vec_reads",
    "render_matmul",
    "flops",
]
