"""Index primitives: arange, one_hot, gather (embedding rows), take_along_axis, rand.

Out-of-range indices never touch memory outside a tensor: gather and take_along_axis
clamp to [0, n-1] and one_hot gives an all-zero row (the runtime also rejects such
inputs before dispatching, API.md §5). Gradients are exact.select_sum: a sum of selected
cotangents, deterministic (no scatter, no atomics), that keeps an inf or NaN cotangent in
the rows its index selects, as PyTorch's index_add does.
"""

from __future__ import annotations

import numpy as np

from ..templates import wgsl_f32
from .registry import COSTLY, Bad, OpDef, register
from . import api as F
from .exact import select_sum


def _arange_shape(n, dtype):
    if n < 0:
        raise Bad(f"length must be non-negative, got {n}")
    if dtype not in ("f32", "i32"):
        raise Bad(f"unknown dtype {dtype!r}")
    return (n,), dtype


register(
    OpDef(
        "arange",
        _arange_shape,
        lambda n, dtype: np.arange(n, dtype=np.int32 if dtype == "i32" else np.float32),
        None,
        "constant",
        nondiff=True,
        render=lambda body, n, idx: "%s(%s)" % (n.out.dtype, idx.get_coords(body)[0]),
    )
)


def _need_index(x, what):
    if x[1] != "i32":
        raise Bad(f"{what} must be i32, got {x[1]}", "cast float indices with ops.cast(idx, 'i32')")


def _one_hot_shape(idx, depth):
    _need_index(idx, "indices")
    if depth <= 0:
        raise Bad(f"depth must be positive, got {depth}")
    return tuple(idx[0]) + (depth,), "f32"


def _one_hot_ref(idx, depth):
    return (idx[..., None] == np.arange(depth, dtype=np.int32)).astype(np.float32)


def _one_hot_wgsl(body, n, idx):
    src = n.inputs[0]
    c = idx.get_coords(body)
    k = body.value(src, body.index(src.shape, c[:-1]))
    return body.let(f"select(0.0, 1.0, {k} == i32({c[-1]}))", "f32")


register(
    OpDef(
        "one_hot", _one_hot_shape, _one_hot_ref, None, "gather", nondiff=True,
        index_bound=lambda n, x: n.attrs["depth"], render=_one_hot_wgsl,
    )
)


def _gather_shape(table, idx):
    _need_index(idx, "indices")
    if len(table[0]) < 1:
        raise Bad("the table needs at least one dim")
    return tuple(idx[0]) + tuple(table[0][1:]), table[1]


def _gather_ref(table, idx):
    return table[np.clip(idx, 0, table.shape[0] - 1)]


def _gather_vjp(ct, n):
    # dtable[r, :] = sum of the cotangent rows whose index is r (exact.select_sum)
    table, idx = n.inputs
    rest = table.shape[1:]
    width = int(np.prod(rest)) if rest else 1
    dt = select_sum(F.reshape(ct, (-1, width)), F.reshape(idx, (-1, 1)), table.shape[0], 0)
    return F.reshape(dt, table.shape), None


def _gather_wgsl(body, n, idx):
    table, ix = n.inputs
    c = idx.get_coords(body)
    k = body.value(ix, body.index(ix.shape, c[: ix.ndim]))
    row = body.let(f"u32(clamp({k}, 0i, {table.shape[0] - 1}i))", "u32")
    return body.value(table, body.index(table.shape, [row] + c[ix.ndim :]))


register(
    OpDef(
        "gather", _gather_shape, _gather_ref, _gather_vjp, "gather", cost=COSTLY,
        index_bound=lambda n, x: n.inputs[0].shape[0] if n.inputs[1] is x else None, render=_gather_wgsl,
    )
)


def _tala_shape(x, idx, axis):
    _need_index(idx, "indices")
    if x[1] != "f32":
        raise Bad(f"expects f32 values, got {x[1]}")
    if len(idx[0]) != len(x[0]):
        raise Bad(f"indices need the same rank as x ({len(x[0])}), got {len(idx[0])}")
    if not 0 <= axis < len(x[0]):
        raise Bad(f"axis {axis} is out of range for rank {len(x[0])}")
    if any(a != b for i, (a, b) in enumerate(zip(x[0], idx[0])) if i != axis):
        raise Bad(f"indices must match x's shape except on axis {axis}")
    return tuple(idx[0]), "f32"


def _tala_ref(x, idx, axis):
    return np.take_along_axis(x, np.clip(idx, 0, x.shape[axis] - 1), axis=axis)


def _tala_vjp(ct, n):
    # dx[..., i, ...] = sum over j of ct[..., j, ...] where idx[..., j, ...] == i
    x, idx = n.inputs
    axis = n.attrs["axis"]
    return select_sum(ct, idx, x.shape[axis], axis), None


def _tala_wgsl(body, n, idx):
    x, ix = n.inputs
    c = idx.get_coords(body)
    k = body.value(ix, body.index(ix.shape, c))
    cc = list(c)
    axis = n.attrs["axis"]
    cc[axis] = body.let(f"u32(clamp({k}, 0i, {x.shape[axis] - 1}i))", "u32")
    return body.value(x, body.index(x.shape, cc))


register(
    OpDef(
        "take_along_axis", _tala_shape, _tala_ref, _tala_vjp, "gather", cost=COSTLY,
        index_bound=lambda n, x: n.inputs[0].shape[n.attrs["axis"]] if n.inputs[1] is x else None,
        render=_tala_wgsl,
    )
)


# Counter-based uniform random numbers: u = hash(index + hash(seed ^ hash(salt))), 24 bits.
# The same uint32 arithmetic runs in WGSL (rand_u01 in the elementwise template) and here.
def hash_u32(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.uint32)
    with np.errstate(over="ignore"):
        h = x * np.uint32(747796405) + np.uint32(2891336453)
        h = ((h >> ((h >> np.uint32(28)) + np.uint32(4))) ^ h) * np.uint32(277803737)
        return (h >> np.uint32(22)) ^ h


def _rand_shape(seed, shape, salt):
    if seed[0] != () or seed[1] != "i32":
        raise Bad("seed must be an i32 scalar")
    return tuple(shape), "f32"


def _rand_ref(seed, shape, salt):
    with np.errstate(over="ignore"):
        key = hash_u32(np.uint32(seed.astype(np.int64) & 0xFFFFFFFF) ^ hash_u32(np.uint32(salt)))
        idx = np.arange(int(np.prod(shape)), dtype=np.uint32)
        u = hash_u32(idx + key)
    return ((u >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)).reshape(shape)


def _rand_wgsl(body, n, idx):
    body.helper("hash_u32")
    seed = body.value(n.inputs[0], body.index(()))
    key = body.let(f"hash_u32(bitcast<u32>({seed}) ^ hash_u32({n.attrs['salt']}u))", "u32")
    return body.let(f"f32(hash_u32({idx.get_flat(body)} + {key}) >> 8u) * {wgsl_f32(1.0 / 16777216.0)}", "f32")


register(OpDef("rand", _rand_shape, _rand_ref, None, "gather", nondiff=True, cost=COSTLY, render=_rand_wgsl))
