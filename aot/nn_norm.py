"""Normalization layers with torch.nn's constructor arguments, parameter names and semantics.

Every statistic is a mean over the last axis of a row view of the input (LayerNorm: the
normalized dims; GroupNorm: one row per (sample, group); InstanceNorm: one per (sample,
channel)), so the forward pass and its derived backward run as row kernels that chain.py
strings into few dispatches, as it does for LayerNorm. Variances are biased (divided by the
row length), as torch normalizes.
"""

from __future__ import annotations

import math

from . import init as _init
from . import ops
from .buffers import assign
from .module import Module
from .ops.reductions import moments
from .ops.trace import fail, is_training
from .split_rules import split_plan


def _row_norm(x, eps: float):
    """(x - mean) / sqrt(var + eps) over the last axis of x (biased variance), with the mean and
    variance (kept axis)."""
    if split_plan(x.shape, (x.ndim - 1,), "divide") is not None:
        # rows so long that their sums run in two stages (passes.split_reductions): BatchNorm's
        # statistics (moments: two dispatches where the split sums take four) and its VJP
        return _batch_normalize(x, (x.ndim - 1,), eps)
    mu = ops.mean(x, -1, keepdims=True)
    d = x - mu
    var = ops.mean(d * d, -1, keepdims=True)
    return d * ops.rsqrt(var + eps), mu, var


def _alias(op: str, name: str, value, old_name: str, old_value):
    """A constructor argument that also goes by the name API.md §2 first gave it."""
    if value is not None and old_value is not None:
        fail(op, f"pass {name} or {old_name} (its older name), not both")
    if value is None and old_value is None:
        fail(op, f"missing the argument {name}")
    return value if value is not None else old_value


def _check_input(op: str, x, min_ndim: int, want: str):
    if not hasattr(x, "shape") or not hasattr(x, "type_str"):
        fail(op, f"expects a Tensor, got {type(x).__name__}")
    if x.dtype != "f32":
        fail(op, f"expects an f32 input, got {x.type_str()}")
    if x.ndim < min_ndim:
        fail(op, f"expects {want}, got {x.type_str()}")


def _channel_shape(x, channel_axis: int):
    """[C, 1, ..., 1]: a per-channel vector broadcast against x's axes after channel_axis."""
    return (x.shape[channel_axis],) + (1,) * (x.ndim - channel_axis - 1)


def _affine(y, weight, bias, shape):
    if weight is not None:
        y = y * ops.reshape(weight, shape)
    if bias is not None:
        y = y + ops.reshape(bias, shape)
    return y


class LayerNorm(Module):
    """torch.nn.LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
    normalizes over the last len(normalized_shape) dims. Parameters `g` (torch's weight, ones)
    and `b` (torch's bias, zeros), each of shape normalized_shape; `LayerNorm(dim)` as before."""

    def __init__(self, normalized_shape=None, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 *, dim=None):  # fmt: skip
        super().__init__()
        normalized_shape = _alias("LayerNorm", "normalized_shape", normalized_shape, "dim", dim)  # API.md §2's name
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
            fail("LayerNorm", f"normalized_shape must be a positive int or a tuple of them, got {normalized_shape!r}")
        self.normalized_shape, self.eps = shape, float(eps)
        self.g = self._torch_param("LayerNorm", "weight", shape, init=_init.ones()) if elementwise_affine else None
        self.b = (
            self._torch_param("LayerNorm", "bias", shape, init=_init.zeros()) if elementwise_affine and bias else None
        )

    def forward(self, x):
        k = len(self.normalized_shape)
        _check_input("LayerNorm", x, k, f"[..., {', '.join(map(str, self.normalized_shape))}]")
        if tuple(x.shape[-k:]) != self.normalized_shape:
            fail(
                "LayerNorm",
                f"the last {k} dim(s) of {x.type_str()} must be normalized_shape {list(self.normalized_shape)}",
            )
        if k == 1:
            y = _row_norm(x, self.eps)[0]
        else:
            y = ops.reshape(_row_norm(ops.reshape(x, (*x.shape[:-k], -1)), self.eps)[0], x.shape)
        if self.g is not None:
            y = y * self.g
        return y + self.b if self.b is not None else y


class GroupNorm(Module):
    """torch.nn.GroupNorm(num_groups, num_channels, eps=1e-5, affine=True) on [N, C, *]: each
    sample's channels are split into num_groups groups, each normalized over its channels and
    all spatial positions; then a per-channel weight (ones) and bias (zeros)."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
        super().__init__()
        if num_groups <= 0 or num_channels % num_groups:
            fail("GroupNorm", f"num_channels {num_channels} must be divisible by num_groups {num_groups}")
        self.num_groups, self.num_channels, self.eps = int(num_groups), int(num_channels), float(eps)
        self.weight = self._torch_param("GroupNorm", "weight", (num_channels,), init=_init.ones()) if affine else None
        self.bias = self._torch_param("GroupNorm", "bias", (num_channels,), init=_init.zeros()) if affine else None

    def forward(self, x):
        _check_input("GroupNorm", x, 2, f"[N, {self.num_channels}, *]")
        if x.shape[1] != self.num_channels:
            fail("GroupNorm", f"expects {self.num_channels} channels (dim 1), got {x.type_str()}")
        n = x.shape[0]
        y = ops.reshape(_row_norm(ops.reshape(x, (n, self.num_groups, -1)), self.eps)[0], x.shape)
        return _affine(y, self.weight, self.bias, _channel_shape(x, 1))


class _InstanceNorm(Module):
    """torch.nn.InstanceNormNd: each (sample, channel) normalized over its spatial positions;
    an unbatched input [C, *] is one sample. affine gives a per-channel weight and bias.
    track_running_stats keeps running_mean / running_var (torch's buffers): a training step
    moves them by momentum towards the average over samples of the instance statistics
    (unbiased variance; momentum=None leaves them, as torch passes 0), infer entries normalize
    with them; num_batches_tracked is kept but, as in torch, never counted."""

    kind, spatial = "", 0

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
    ):
        super().__init__()
        _channel_state(self, num_features, eps, momentum, affine, track_running_stats)

    def forward(self, x):
        s = self.spatial
        _check_input(self.kind, x, s + 1, f"[N, C, {s} spatial dim(s)] or [C, {s} spatial dim(s)]")
        if x.ndim not in (s + 1, s + 2):
            fail(self.kind, f"expects [N, C, {s} spatial dim(s)] or unbatched [C, ...], got {x.type_str()}")
        c = x.ndim - s - 1
        # torch only warns about a channel count that nothing uses (no affine, no running stats)
        if x.shape[c] != self.num_features and (self.weight is not None or self.track_running_stats):
            fail(self.kind, f"expects {self.num_features} channels (dim {c}), got {x.type_str()}")
        shape = _channel_shape(x, c)
        if self.track_running_stats and not is_training():
            y = (x - ops.reshape(self.running_mean, shape)) * ops.reshape(ops.rsqrt(self.running_var + self.eps), shape)
            return _affine(y, self.weight, self.bias, shape)
        rows = ops.reshape(x, (math.prod(x.shape[: c + 1]), -1))
        y, mu, var = _row_norm(rows, self.eps)
        y = ops.reshape(y, x.shape)
        if self.track_running_stats and self.momentum:
            n = rows.shape[1]
            if n == 1:
                fail(self.kind, f"expects more than 1 spatial element when training, got {x.type_str()}")
            var = var * (n / (n - 1))
            per = (-1, self.num_features)  # [N, C]: averaged over the samples
            _update_running(self, ops.mean(ops.reshape(mu, per), 0), ops.mean(ops.reshape(var, per), 0), count=False)
        return _affine(y, self.weight, self.bias, shape)


class InstanceNorm1d(_InstanceNorm):
    kind, spatial = "InstanceNorm1d", 1


class InstanceNorm2d(_InstanceNorm):
    kind, spatial = "InstanceNorm2d", 2


def _channel_state(m, num_features, eps, momentum, affine, track_running_stats) -> None:
    """The per-channel parameters and buffers that InstanceNorm and BatchNorm share (torch's names)."""
    C = m.num_features = int(num_features)
    m.eps, m.momentum, m.track_running_stats = float(eps), momentum, bool(track_running_stats)
    m.weight = m._torch_param(m.kind, "weight", (C,), init=_init.ones()) if affine else None
    m.bias = m._torch_param(m.kind, "bias", (C,), init=_init.zeros()) if affine else None
    _running_buffers(m)


def _running_buffers(m) -> None:
    """torch's running_mean (zeros), running_var (ones) and num_batches_tracked (i32 0) buffers,
    or None for each without track_running_stats."""
    if m.track_running_stats:
        C = m.num_features
        m.running_mean = m._torch_buffer(m.kind, "running_mean", (C,), init=_init.zeros())
        m.running_var = m._torch_buffer(m.kind, "running_var", (C,), init=_init.ones())
        m.num_batches_tracked = m._torch_buffer(m.kind, "num_batches_tracked", (), init=_init.zeros(), dtype="i32")
    else:
        m.running_mean = m.running_var = m.num_batches_tracked = None


def _update_running(m, mean, var_unbiased, count: bool = True):
    """Training step's new running statistics and count, assigned to m's buffers (torch's rule:
    running = (1 - f) * running + f * batch, f = momentum, or 1 / num_batches_tracked after this
    step's increment when momentum is None: a cumulative average)."""
    # each update is rebound to the attribute, so a module called twice in one step chains its
    # updates as torch's in-place ones do (aot/buffers.py)
    if count:
        t = ops.cast(m.num_batches_tracked, "f32") + 1.0  # i32 has no arithmetic; exact below 2**24
        m.num_batches_tracked = assign(m.num_batches_tracked, ops.cast(t, "i32"))
    f = m.momentum if m.momentum is not None else 1.0 / t
    m.running_mean = assign(m.running_mean, (1.0 - f) * m.running_mean + f * mean)
    m.running_var = assign(m.running_var, (1.0 - f) * m.running_var + f * var_unbiased)


def _batch_normalize(x, axes, eps: float, weight=None, bias=None):
    """(x - mean) / sqrt(var + eps) over `axes`, times `weight` plus `bias` (per channel, dim 1;
    either may be None), with the batch mean and (biased) variance.

    Its VJP is the closed form torch's batch_norm_backward uses, dx = w * rs * (ct - mean(ct) -
    xhat * mean(ct * xhat)), not the chain rule through mean, subtract, square and rsqrt: that
    chain carries the mean's gradient terms, which cancel exactly in real arithmetic but not in
    float32, and where a channel's mean is large against its spread (a ResNet's constant
    background after a bias-free conv) the leftover reached 0.5% of the gradients of the layers
    before it, where torch's float32 stayed within 1e-5 of float64. The affine part is inside
    the rule: sum(ct) and sum(ct * xhat) are the bias and weight gradients, so the backward pass
    reduces those two sums once, in one kernel per stage, where the rule on the normalized values
    summed the weighted cotangent again in another (which, where the cotangent comes from a
    residual connection, also waited a dispatch for it to be stored)."""
    n = math.prod(x.shape[a] for a in axes)
    mu, m2 = moments(x, axes)
    var = m2 * (1.0 / n)
    rs = ops.rsqrt(var + eps)
    xhat = (x - mu) * rs
    kept = rs.shape
    y = xhat if weight is None else xhat * ops.reshape(weight, kept)
    y = y if bias is None else y + ops.reshape(bias, kept)

    def rule(ct, y, ins):
        s1 = ops.sum(ct, axes, keepdims=True)
        s2 = ops.sum(ct * xhat, axes, keepdims=True)
        scale = rs if weight is None else rs * ops.reshape(weight, kept)
        grads = [scale * (ct - s1 * (1.0 / n) - xhat * (s2 * (1.0 / n)))]
        if weight is not None:
            grads.append(ops.reshape(s2, weight.shape))
        if bias is not None:
            grads.append(ops.reshape(s1, bias.shape))
        return tuple(grads)

    ins = (x,) + tuple(t for t in (weight, bias) if t is not None)
    return ops.custom_vjp(y, ins, rule), mu, var


class _BatchNorm(Module):
    """torch.nn.BatchNormNd: per channel (dim 1), over the batch and every other dim. Training
    entries normalize with the batch statistics (biased variance) and, with track_running_stats,
    update running_mean / running_var (unbiased variance) / num_batches_tracked as torch does;
    infer entries use the running statistics (batch statistics without track_running_stats)."""

    kind, ndims, shapes = "", (), ""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
    ):
        super().__init__()
        if momentum is not None and not 0.0 <= momentum <= 1.0:
            fail(self.kind, f"momentum must be in [0, 1] or None, got {momentum!r}")
        _channel_state(self, num_features, eps, momentum, affine, track_running_stats)

    def forward(self, x):
        want = self.shapes.format(C=self.num_features)
        _check_input(self.kind, x, 2, want)
        if x.ndim not in self.ndims:
            fail(self.kind, f"expects {want} ({x.ndim} dims given), got {x.type_str()}")
        if x.shape[1] != self.num_features:
            fail(self.kind, f"expects {self.num_features} channels (dim 1), got {x.type_str()}")
        shape = _channel_shape(x, 1)
        training = is_training()
        if training or not self.track_running_stats:
            axes = (0,) + tuple(range(2, x.ndim))
            n = math.prod(x.shape[a] for a in axes)
            if n == 1 and training:
                fail(self.kind, f"expects more than 1 value per channel when training, got {x.type_str()}")
            y, mu, var = _batch_normalize(x, axes, self.eps, self.weight, self.bias)
            if training and self.track_running_stats:
                flat = (self.num_features,)
                _update_running(self, ops.reshape(mu, flat), ops.reshape(var, flat) * (n / max(n - 1, 1)))
            return y
        y = (x - ops.reshape(self.running_mean, shape)) * ops.reshape(ops.rsqrt(self.running_var + self.eps), shape)
        return _affine(y, self.weight, self.bias, shape)


class BatchNorm1d(_BatchNorm):
    kind, ndims, shapes = "BatchNorm1d", (2, 3), "[N, {C}] or [N, {C}, L]"


class BatchNorm2d(_BatchNorm):
    kind, ndims, shapes = "BatchNorm2d", (4,), "[N, {C}, H, W]"
