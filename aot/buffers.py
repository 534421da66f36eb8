"""`aot.assign`: a training step's writeback into a buffer (Module.buffer).

assign(t, value) records `g.updates["buffer:<name>"] = value`, beside the optimizer's
writebacks ("params", "adam.m", ...): the planner writes the new value into the buffer's
storage in place when the writing kernel is the buffer's last reader, and otherwise copies
it there after the pass (plan.py), so every read of the buffer during the step sees the
value it had before the step, as every read of a parameter sees the pre-update value.
"""

from __future__ import annotations

from .errors import ShapeError, TraceError, capture_site
from .ir import Tensor
from .ops.trace import current

UPDATE_PREFIX = "buffer:"  # g.updates key of a buffer's writeback (optimizer state names have none)


def update_key(name: str) -> str:
    return UPDATE_PREFIX + name


def assign(t: Tensor, value: Tensor) -> Tensor:
    """After this training step, buffer `t` holds `value` (same shape and dtype). Reads of `t`
    in the step, before or after this call, see its old value. Returns `value`."""
    g = current()
    site = capture_site()
    if not isinstance(t, Tensor) or t.node is None or t.node.op != "buffer":
        what = f"a {t.node.op} tensor" if isinstance(t, Tensor) and t.node is not None else type(t).__name__
        raise TraceError(
            f"aot.assign: the target must be a buffer declared with Module.buffer(), got {what}", site,
            hint="only buffers can be assigned; parameters change through the optimizer",
        )
    if g.meta.get("kind") != "train":
        raise TraceError(
            "aot.assign: buffers can only be assigned while tracing a training entry (this is an infer entry)",
            site,
            hint="guard the update with `if aot.is_training():`",
        )
    name = t.node.attrs["name"]
    if not name:
        raise TraceError("aot.assign: the buffer is not an attribute of the model, so it has no name", site)
    if not isinstance(value, Tensor):
        raise TraceError(f"aot.assign({name!r}, ...): the value must be a traced Tensor, got {type(value).__name__}", site)
    if value.shape != t.shape or value.dtype != t.dtype:
        raise ShapeError(
            f"aot.assign: buffer {name!r} is {t.type_str()} but the value is {value.type_str()}", site,
            hint="the new value must have the buffer's shape and dtype (ops.cast converts dtypes)",
        )
    key = update_key(name)
    if key in g.updates:
        raise TraceError(f"aot.assign: buffer {name!r} is assigned twice in one step", site,
                         hint="compute the final value and assign it once")
    g.updates[key] = value
    return value
