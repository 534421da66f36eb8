"""`aot.init`: parameter initializers. Each resolves, given the shape, to a plain spec tuple
that the generated package evaluates with aot/runtime/rng.py (same seed, same bits)."""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Init:
    kind: str
    value: float | tuple = 0.0  # zero_range: (inner Init, begin, end)
    data: bytes | None = None
    default_decay: bool = True

    def spec(self, shape: tuple[int, ...]) -> tuple:
        if self.kind == "randn":
            return ("randn", float(self.value))
        if self.kind == "kaiming":
            # fan_in: shape[0] for [in, out] weights, prod(shape[1:]) for conv [out, in/g, kh, kw]
            fan_in = shape[0] if len(shape) <= 2 else int(np.prod(shape[1:]))
            return ("randn", float(self.value) / math.sqrt(max(fan_in, 1)))
        if self.kind in ("zeros", "ones"):
            return (self.kind,)
        if self.kind == "zero_range":
            inner, begin, end = self.value
            return ("zero_range", inner.spec(shape), begin, end)
        return ("literal", base64.b64encode(self.data).decode("ascii"))


def randn(scale: float = 0.02) -> Init:
    return Init("randn", float(scale))


def zeros() -> Init:
    return Init("zeros", default_decay=False)


def ones() -> Init:
    return Init("ones", default_decay=False)


def kaiming(gain: float = 2**0.5) -> Init:
    return Init("kaiming", float(gain))


def literal(array) -> Init:
    a = np.asarray(array, dtype="<f4")
    init = Init("literal", data=a.tobytes())
    object.__setattr__(init, "_shape", a.shape)
    return init


def zero_range(inner: Init, begin: int, end: int) -> Init:
    """`inner` with flat elements [begin, end) set to zero (Embedding's padding row)."""
    return Init("zero_range", (inner, int(begin), int(end)), default_decay=inner.default_decay)
