"""Seeded parameter initialization, identical on every machine.

Generator: each parameter gets its own stream, keyed by (seed, parameter index). A
SplitMix64 counter (pure uint64 integer arithmetic, so it is the same everywhere) gives
53-bit uniforms; Box-Muller in float64 turns pairs of them into normals, which are
scaled in float64 and rounded once to float32. The only non-integer steps are IEEE
float64 log/sqrt/cos/sin/multiply, so machines agree bit for bit after the f32 rounding.
"""

from __future__ import annotations

import base64
import numbers

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
SEED_LIMIT = 2**64  # seeds are ints in [0, 2**64): every bit of them reaches init and dropout


def check_seed(seed, what: str = "seed") -> int:
    """`seed` as a Python int in [0, 2**64); TypeError for a non-int (bool, float), ValueError out of range."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"{what}: a seed must be an int in [0, 2**64), got {type(seed).__name__} {seed!r}")
    seed = int(seed)
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"{what}: a seed must be an int in [0, 2**64), got {seed}")
    return seed


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def standard_normal(seed: int, stream: int, n: int) -> np.ndarray:
    """n float64 standard normals from stream `stream` of `seed`."""
    with np.errstate(over="ignore"):
        key = _splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]
        key = _splitmix64(np.array([key ^ np.uint64(stream)], dtype=np.uint64))[0]
        pairs = (n + 1) // 2
        counters = key + np.arange(2 * pairs, dtype=np.uint64) * _GOLDEN
    u = (_splitmix64(counters) >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
    u1 = 1.0 - u[0::2]  # (0, 1]: log stays finite
    u2 = u[1::2]
    r = np.sqrt(-2.0 * np.log(u1))
    z = np.empty(2 * pairs, dtype=np.float64)
    z[0::2] = r * np.cos(2.0 * np.pi * u2)
    z[1::2] = r * np.sin(2.0 * np.pi * u2)
    return z[:n]


def init_param(spec: tuple, shape: tuple[int, ...], seed: int, stream: int) -> np.ndarray:
    """Materialize one parameter from its init spec: ("randn", std) | ("zeros",) | ("ones",) | ("literal", b64)
    | ("zero_range", inner spec, begin, end): inner's values with flat elements [begin, end) zeroed."""
    n = int(np.prod(shape)) if shape else 1
    kind = spec[0]
    if kind == "zero_range":
        out = init_param(tuple(spec[1]), shape, seed, stream)
        out.reshape(-1)[int(spec[2]) : int(spec[3])] = 0.0
        return out
    if kind == "randn":
        return (standard_normal(seed, stream, n) * float(spec[1])).astype(np.float32).reshape(shape)
    if kind == "zeros":
        return np.zeros(shape, dtype=np.float32)
    if kind == "ones":
        return np.ones(shape, dtype=np.float32)
    if kind == "literal":
        data = np.frombuffer(base64.b64decode(spec[1]), dtype="<f4")
        return data.astype(np.float32).reshape(shape).copy()
    raise ValueError(f"unknown init spec {spec!r}")


def step_seed(seed: int, t: int) -> int:
    """The i32 seed of step t's random numbers (dropout), from all 64 bits of the model seed."""
    word = (seed & 0xFFFFFFFF) << 32 | (t & 0xFFFFFFFF)
    high = (seed >> 32) & 0xFFFFFFFF
    if high:  # the high half, hashed, changes every step's stream (seeds below 2**32 keep theirs)
        word ^= int(_splitmix64(np.array([high], dtype=np.uint64))[0])
    key = _splitmix64(np.array([word], dtype=np.uint64))[0]
    return int(key & np.uint64(0x7FFFFFFF))
