"""`aot.assign`: a training step's writeback into a buffer (Module.buffer).

assign(t, value) records `g.updates["buffer:<name>"] = value`, beside the optimizer's
writebacks ("params", "adam.m", ...): the planner writes the new value into the buffer's
storage in place when the writing kernel is the buffer's last reader, and otherwise copies
it there after the pass (plan.py), so every read of the buffer leaf during the step sees the
value it had before the step, as every read of a parameter sees the pre-update value.

A module called twice in one step (a GAN's discriminator on real and on fake images) updates its
running statistics twice in PyTorch, the second update starting from the first. Here the same
comes from rebinding: `self.rm = aot.assign(self.rm, new)` makes later reads of `self.rm` see
`new`, and a later `aot.assign(self.rm, ...)` targets that value, so it chains: the buffer ends
with the last value, computed from the earlier ones. Assigning the leaf itself a second time
would drop the first update, so that is refused.
"""

from __future__ import annotations

from .errors import ShapeError, TraceError, capture_site
from .ir import Tensor
from .ops.trace import current

UPDATE_PREFIX = "buffer:"  # g.updates key of a buffer's writeback (optimizer state names have none)


def update_key(name: str) -> str:
    return UPDATE_PREFIX + name


def assign(t: Tensor, value: Tensor) -> Tensor:
    """After this training step, buffer `t` holds `value` (same shape and dtype); returns `value`.
    Reads of the buffer leaf in the step see its old value. `t` may also be the value of an earlier
    assign to the buffer (`self.rm = aot.assign(self.rm, ...)` rebinds it): the updates chain."""
    g = current()
    site = capture_site()
    chained = g.meta.setdefault("assigned", {})  # id(value of an assign) -> buffer name
    if isinstance(t, Tensor) and id(t) in chained:
        name = chained[id(t)]
    elif not isinstance(t, Tensor) or t.node is None or t.node.op != "buffer":
        what = f"a {t.node.op} tensor" if isinstance(t, Tensor) and t.node is not None else type(t).__name__
        raise TraceError(
            f"aot.assign: the target must be a buffer declared with Module.buffer(), got {what}", site,
            hint="only buffers can be assigned; parameters change through the optimizer",
        )
    else:
        name = t.node.attrs["name"]
    if g.meta.get("kind") != "train":
        raise TraceError(
            "aot.assign: buffers can only be assigned while tracing a training entry (this is an infer entry)",
            site,
            hint="guard the update with `if aot.is_training():`",
        )
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
    if key in g.updates and id(t) not in chained:
        raise TraceError(
            f"aot.assign: buffer {name!r} is assigned twice in one step from its old value, which would drop the first update",
            site,
            hint="rebind it so that the second update starts from the first: self.x = aot.assign(self.x, value)",
        )
    g.updates[key] = value
    chained[id(value)] = name
    return value
