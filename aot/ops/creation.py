"""Tensors made from a value alone: `full`, `zeros`, `ones` and their `*_like` forms.

Each is a 0-d constant broadcast to the shape, so it costs no storage and no kernel: readers
fuse the value in (torch's `torch.full`, `torch.ones_like`, ... and the targets of a GAN's
binary cross-entropy). No gradient flows into a constant.
"""

from __future__ import annotations

from ..ir import Tensor
from .api import _const, _shape_arg, broadcast_to
from .trace import fail

DTYPES = ("f32", "i32")


def full(shape, value, dtype: str = "f32") -> Tensor:
    """dtype[shape] filled with `value` (torch.full)."""
    shape = _shape_arg("full", shape)
    if dtype not in DTYPES:
        fail("full", f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    c = _const(value, dtype)
    return c if shape == () else broadcast_to(c, shape)


def zeros(shape, dtype: str = "f32") -> Tensor:
    return full(shape, 0, dtype)


def ones(shape, dtype: str = "f32") -> Tensor:
    return full(shape, 1, dtype)


def _like(op: str, x, value, dtype) -> Tensor:
    if not isinstance(x, Tensor):
        fail(op, f"expects a Tensor, got {type(x).__name__}")
    return full(x.shape, value, dtype or x.dtype)


def full_like(x, value, dtype: str | None = None) -> Tensor:
    return _like("full_like", x, value, dtype)


def zeros_like(x, dtype: str | None = None) -> Tensor:
    return _like("zeros_like", x, 0, dtype)


def ones_like(x, dtype: str | None = None) -> Tensor:
    return _like("ones_like", x, 1, dtype)


__all__ = ["full", "zeros", "ones", "full_like", "zeros_like", "ones_like"]
