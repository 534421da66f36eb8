"""Leaf nodes: user inputs, parameters, buffers and optimizer state (values supplied by the runtime)."""

from __future__ import annotations

from .registry import Bad, OpDef, register


def _leaf_shape(name, shape, dtype="f32"):
    if dtype not in ("f32", "i32"):
        raise Bad(f"unknown dtype {dtype!r} for {name!r}")
    return tuple(shape), dtype


def _no_ref(**attrs):
    raise RuntimeError("leaf values are supplied by the caller")


for _op in ("input", "param", "state", "buffer"):
    register(OpDef(_op, _leaf_shape, _no_ref, None, "leaf", nondiff=True))
