"""Gradient buckets for data-parallel training (issue 35): where a training entry's dispatch list
may be split so that its gradients leave the GPU while the backward pass still runs.

A bucket is a range [lo, hi) of an entry's flat gradient vector (grads[offset + lo : offset + hi])
and `ready`, the number of dispatches after which every gradient in it is final: no dispatch from
`ready` on (up to the cut, update_from) writes any of it. The runtime (engine.run_buckets) runs
dispatches [0, ready) of the first bucket, copies it to a mappable buffer, runs on to the next
boundary, and so on; the host reads each bucket back and starts its all-reduce while the GPU is
still computing the next ones.

Buckets never split one parameter's gradient (as PyTorch DDP's) and hold at most `bucket_mib`
(a larger gradient is a bucket of its own; `bucket_mib=0` makes every gradient its own bucket);
within that, partition cuts the vector where the buckets delay the gradients least.
The table is computed twice, for the GPU set's dispatch list (merged dispatches) and for the CPU
set's (one kernel a dispatch): the same ranges, with each list's own boundaries.
"""

from __future__ import annotations

from .plan import Plan, buffer_of
from .schedule import KernelSchedule

DEFAULT_BUCKET_MIB = 25.0  # PyTorch DDP's bucket_cap_mb
TAIL_SHARE = 8  # the bucket final last, and a whole vector that is one bucket, at most 1/TAIL_SHARE of bucket_mib
# late_cap's window: buckets final in the last 1/TAIL_WINDOW of the dispatches shrink toward the end;
# 0: only the bucket final last is small. Off: on 2 H200s (bench_ddp --tail-window,
# scripts/results/bench_ddp_h200x2_r5.json) a window of 6 made transformer_large's 5 buckets 7 and
# cost two ranks 0.9 ms a step (each late NCCL mean takes ~1 ms however small: 1.72x one GPU ->
# 1.64x); one process without communication gained 0.5 ms with write-mapped uploads, lost 0.3 with
# uploads from the readback buffers
TAIL_WINDOW = 0


def kernel_grad_writes(s: KernelSchedule, p: Plan, bindings: list) -> list[list[tuple[int, int]] | None]:
    """Per scheduled kernel, the element spans [lo, hi) of the grads buffer it writes; None where
    it binds grads writable but writes no tensor placed there (then it counts as writing all)."""
    out = []
    for k, binds in zip(s.kernels, bindings):
        spans = []
        for t in k.stored_outs:
            loc = p.loc.get(id(t))
            if loc is not None and loc.arena == "grads":
                spans.append((loc.offset, loc.offset + max(t.size, 1)))
        writable = any(buffer_of(a) == "grads" and acc != "read" for a, acc in binds)
        out.append(spans if spans or not writable else None)
    return out


def ready_counts(
    writes: list[list[tuple[int, int]] | None], dispatch_kernels: list[list[int]], cut: int, segments: list[tuple[int, int]]
) -> list[int]:
    """For each segment [lo, hi) of the grads buffer: 1 + the last dispatch before `cut` that
    writes part of it (0 if none does)."""
    out = []
    for lo, hi in segments:
        last = 0
        for d in range(cut):
            for ki in dispatch_kernels[d]:
                w = writes[ki]
                if w is None or any(a < hi and lo < b for a, b in w):
                    last = d + 1
                    break
        out.append(last)
    return out


def gradient_segments(param_spans: list[tuple[int, int]], offset: int, size: int) -> list[tuple[int, int]]:
    """The entry's gradient vector cut at parameter boundaries, as grads-buffer spans: one per
    parameter inside it, and one per gap (parameters it does not train, never written)."""
    cuts = sorted({0, size} | {min(max(a - offset, 0), size) for span in param_spans for a in span})
    return [(offset + a, offset + b) for a, b in zip(cuts, cuts[1:]) if b > a]


def partition(segments: list[tuple[int, int]], ready: list[int], cap_elems: int) -> list[tuple[int, int]]:
    """Consecutive segments grouped into buckets of at most cap_elems (a larger segment alone),
    as many as the cap needs plus two (one in all where everything fits in cap_elems //
    TAIL_SHARE: a small model gains nothing from more), cut where they delay the gradients
    least: the partition minimizing the sum over buckets of elements x ready, by dynamic
    programming over the cut points (gradients final late in a bucket with early ones make them
    wait; PyTorch DDP's buckets follow the parameters' order, which a layout that puts biases
    and norms after the weights breaks). A bucket final late holds at most late_cap (unless
    one gradient is larger): what remains of the backward pass is all its trip overlaps."""
    n = len(segments)
    if not n:
        return []
    size = [hi - lo for lo, hi in segments]
    total = sum(size)
    if cap_elems <= 0:
        return list(segments)
    most = 1 if total <= cap_elems // TAIL_SHARE else -(-total // cap_elems) + 2
    while True:  # more buckets where the caps leave no partition into `most` (n always does)
        best, cut = _least_delay(size, ready, cap_elems, min(most, n))
        if min(row[n] for row in best[1:]) < float("inf") or most >= n:
            break
        most += 1
    most = min(most, n)
    k = min(range(1, most + 1), key=lambda k: (best[k][n], k))
    out, i = [], n
    while k:
        j = cut[k][i]
        out.append((segments[j][0], segments[i - 1][1]))
        i, k = j, k - 1
    return out[::-1]


def late_cap(cap_elems: int, ready: int, last: int) -> int:
    """The most elements a bucket final after `ready` dispatches may hold, where the last
    gradient is final after `last`: cap_elems, and cap_elems // TAIL_SHARE for a bucket final
    with the last (nothing overlaps its trip); with a TAIL_WINDOW, shrinking linearly over the
    last last // TAIL_WINDOW dispatches down to that (a late bucket's trip overlaps only what
    remains of the backward pass, but every bucket costs a collective of its own)."""
    if TAIL_WINDOW <= 0:
        return cap_elems // TAIL_SHARE if ready == last else cap_elems
    window = max(1, last // TAIL_WINDOW)
    share = min(1.0, (last - ready) / window)
    return max(cap_elems // TAIL_SHARE, int(cap_elems * share))


def _least_delay(size: list[int], ready: list[int], cap_elems: int, most: int):
    """partition's dynamic programme: best[k][i], the least sum of elements x ready of segments
    [0, i) in k buckets, and cut[k][i], where the last of them starts."""
    n, inf = len(size), float("inf")
    last = max(ready)
    best = [[inf] * (n + 1) for _ in range(most + 1)]
    cut = [[0] * (n + 1) for _ in range(most + 1)]
    best[0][0] = 0
    for k in range(1, most + 1):
        for i in range(1, n + 1):
            elems, late = 0, 0
            for j in range(i - 1, -1, -1):  # the last bucket is segments [j, i)
                elems += size[j]
                late = max(late, ready[j])
                if elems > late_cap(cap_elems, late, last) and j < i - 1:
                    break
                c = best[k - 1][j] + elems * late
                if c < best[k][i]:
                    best[k][i], cut[k][i] = c, j
    return best, cut


def bucket_table(
    spans: list[tuple[int, int]], writes, dispatch_kernels: list[list[int]], cut: int
) -> list[tuple[int, int, int]]:
    """(lo, hi, ready) per bucket (grads-buffer spans), in the order the runtime reads them back:
    by ready, then by position."""
    rows = []
    for lo, hi in spans:
        (r,) = ready_counts(writes, dispatch_kernels, cut, [(lo, hi)])
        rows.append((lo, hi, r))
    return sorted(rows, key=lambda row: (row[2], row[0]))


def entry_buckets(
    s: KernelSchedule,
    p: Plan,
    bindings: list,
    param_spans: list[tuple[int, int]],
    offset: int,
    size: int,
    lists: dict[str, tuple[list[list[int]], int]],
    bucket_mib: float,
) -> dict[str, list[tuple[int, int, int]]]:
    """The bucket tables of one training graph, one per dispatch list: lists maps a label
    ("buckets", "buckets_cpu") to (kernel indices per dispatch, the list's cut). Spans are
    relative to the entry's gradient vector (what step(allreduce=...) hands over)."""
    writes = kernel_grad_writes(s, p, bindings)
    segments = gradient_segments(param_spans, offset, size)
    first = next(iter(lists.values()))
    ready = ready_counts(writes, first[0], first[1], segments)
    cap = int(bucket_mib * 2**20) // 4
    spans = partition(segments, ready, cap)
    out = {}
    for label, (dispatch_kernels, cut) in lists.items():
        table = bucket_table(spans, writes, dispatch_kernels, cut)
        out[label] = [(lo - offset, hi - offset, r) for lo, hi, r in table]
    return out
