"""Core ATen's nn-shaped ops -> aot ops: convolution, pooling, softmax, norms, dropout, attention.

Registered into ops_map.TABLE (same conventions: see ops_map.py). Results torch returns only for
its own backward pass (layer norm's mean and rstd, dropout's mask, pooling indices) are computed
where cheap or returned as `Unavailable`, which fails at the user's line if anything reads it.
"""

from __future__ import annotations

import math

from .. import ops
from .ops_map import F32_MAX, aten, f32, num


class Unavailable:
    """A result aot does not compute (pooling indices, a dropout mask): reading it is an error."""

    def __init__(self, what: str, hint: str):
        self.what, self.hint = what, hint


def _pair(v, name, cx):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    if len(v) == 1:
        v = v * 2
    if len(v) != 2:
        cx.fail(f"{name}={v} is not supported: aot pools and convolves over 2 spatial dims")
    return tuple(int(i) for i in v)


def _channel(t, ndim):
    """A per-channel vector [C] shaped to broadcast over [N, C, ...]."""
    return ops.reshape(t, (1, -1) + (1,) * (ndim - 2))


@aten("convolution.default")
def _conv(cx, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if x.ndim not in (3, 4):
        cx.fail(f"convolution over {x.ndim - 2} spatial dims is not supported", "use Conv1d or Conv2d")
    if transposed:
        if x.ndim == 3:  # ConvTranspose1d as a 2-D one over [N, C, 1, L]
            y = ops.conv_transpose2d(ops.reshape(x, x.shape[:2] + (1, x.shape[2])), ops.reshape(w, w.shape[:2] + (1, w.shape[2])),
                                     b, (1, stride[0]), (0, padding[0]), (0, output_padding[0]), groups, (1, dilation[0]))
            return ops.reshape(y, y.shape[:2] + (y.shape[3],))
        return ops.conv_transpose2d(x, w, b, tuple(stride), tuple(padding), tuple(output_padding), groups, tuple(dilation))
    if x.ndim == 3:
        return ops.conv1d(x, w, b, stride[0], padding[0], dilation[0], groups)
    y = ops.conv2d(x, w, _pair(stride, "stride", cx), _pair(padding, "padding", cx), groups, _pair(dilation, "dilation", cx))
    return y + _channel(b, y.ndim) if b is not None else y


@aten("max_pool2d_with_indices.default")
def _max_pool(cx, x, k, stride=(), padding=0, dilation=1, ceil_mode=False):
    if _pair(dilation, "dilation", cx) != (1, 1):
        cx.fail("max_pool2d with dilation is not supported", "use dilation=1")
    kk = _pair(k, "kernel_size", cx)
    s, p = (_pair(stride, "stride", cx) if stride else kk), _pair(padding, "padding", cx)
    gone = Unavailable("max_pool2d's indices", "use return_indices=False")
    if not ceil_mode:
        return ops.max_pool2d(x, kk, s, p), gone
    # ceil_mode: torch's output size (a last window must start inside the input or its left
    # padding); the windows that run past the end read -FLT_MAX padding, which never wins a max
    y = x
    for a in (0, 1):
        n = x.shape[2 + a] + 2 * p[a]
        out = -(-(n - kk[a]) // s[a]) + 1
        if (out - 1) * s[a] >= x.shape[2 + a] + p[a]:
            out -= 1
        extra = max(0, (out - 1) * s[a] + kk[a] - n)
        y = ops.pad(y, 2 + a, p[a], p[a] + extra)
    ones = ops.broadcast_to(ops.api._const(1.0, "f32"), x.shape)
    inside = ops.pad(ops.pad(ones, 2, p[0], y.shape[2] - x.shape[2] - p[0]), 3, p[1], y.shape[3] - x.shape[3] - p[1])
    y = ops.where(inside, y, -F32_MAX)
    return ops.max_pool2d(y, kk, s, 0), gone


@aten("avg_pool2d.default")
def _avg_pool(cx, x, k, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
    kk = _pair(k, "kernel_size", cx)
    return ops.avg_pool2d(x, kk, _pair(stride, "stride", cx) if stride else kk, _pair(padding, "padding", cx),
                          ceil_mode, count_include_pad, divisor_override)


@aten("_adaptive_avg_pool2d.default", "adaptive_avg_pool2d.default")
def _adaptive_avg(cx, x, size):
    return ops.adaptive_avg_pool2d(x, tuple(size))


@aten("upsample_nearest2d.vec", "upsample_nearest2d.default")
def _up_nearest(cx, x, size=None, scales=None, *rest):
    if scales is not None and size is None:
        return ops.interpolate(x, scale_factor=tuple(scales), mode="nearest")
    return ops.interpolate(x, size=tuple(size), mode="nearest")


@aten("upsample_bilinear2d.vec", "upsample_bilinear2d.default")
def _up_bilinear(cx, x, size, align_corners, scales=None, *rest):
    if scales is not None and size is None:
        return ops.interpolate(x, scale_factor=tuple(scales), mode="bilinear", align_corners=align_corners)
    return ops.interpolate(x, size=tuple(size), mode="bilinear", align_corners=align_corners)


@aten("_softmax.default")
def _softmax(cx, x, d, half_to_float=False):
    return ops.softmax(f32(x), d)


@aten("_log_softmax.default")
def _log_softmax(cx, x, d, half_to_float=False):
    return ops.log_softmax(f32(x), d)


@aten("native_layer_norm.default")
def _layer_norm(cx, x, shape, w, b, eps):
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    mu = ops.mean(x, axes, keepdims=True)
    d = x - mu
    rstd = ops.rsqrt(ops.mean(d * d, axes, keepdims=True) + num(eps))
    y = d * rstd
    y = y * w if w is not None else y
    return (y + b if b is not None else y), mu, rstd


@aten("native_group_norm.default")
def _group_norm(cx, x, w, b, n, c, hw, groups, eps):
    g = ops.reshape(x, (n, groups, -1))
    mu = ops.mean(g, -1, keepdims=True)
    d = g - mu
    rstd = ops.rsqrt(ops.mean(d * d, -1, keepdims=True) + num(eps))
    y = ops.reshape(d * rstd, x.shape)
    y = y * _channel(w, x.ndim) if w is not None else y
    y = y + _channel(b, x.ndim) if b is not None else y
    return y, ops.reshape(mu, (n, groups)), ops.reshape(rstd, (n, groups))


@aten("native_dropout.default")
def _dropout(cx, x, p, train):
    gone = Unavailable("dropout's mask", "use the dropout output only")
    if not train or p == 0:
        return x, gone
    if p >= 1:
        cx.fail(f"dropout with p={p} is not supported (everything dropped)", "use p < 1")
    return ops.dropout(x, float(p)), gone


def _bn_apply(x, w, b, mean, rstd):
    y = (x - _channel(mean, x.ndim)) * _channel(rstd, x.ndim)
    y = y * _channel(w, x.ndim) if w is not None else y
    return y + _channel(b, x.ndim) if b is not None else y


@aten("_native_batch_norm_legit_no_training.default")
def _bn_eval(cx, x, w, b, rm, rv, momentum, eps):
    rstd = ops.rsqrt(rv + num(eps))
    empty = Unavailable("batch norm's saved statistics", "use the normalized output only")
    return _bn_apply(x, w, b, rm, rstd), empty, empty


@aten("_native_batch_norm_legit_functional.default")
def _bn_train(cx, x, w, b, rm, rv, training, momentum, eps):
    if not training:
        y, _, _ = _bn_eval(cx, x, w, b, rm, rv, momentum, eps)
        return y, None, None, rm, rv
    axes = (0,) + tuple(range(2, x.ndim))
    n = math.prod(x.shape[a] for a in axes)
    mu = ops.mean(x, axes)
    d = x - _channel(mu, x.ndim)
    var = ops.mean(d * d, axes)
    rstd = ops.rsqrt(var + num(eps))
    y = _bn_apply(x, w, b, mu, rstd)
    m = num(momentum)
    # running statistics: torch updates them with the unbiased batch variance, outside autograd
    new_rm = ops.stop_gradient(rm * (1.0 - m) + mu * m)
    new_rv = ops.stop_gradient(rv * (1.0 - m) + var * (m * n / max(n - 1, 1)))
    return y, mu, rstd, new_rm, new_rv


@aten("_native_batch_norm_legit.no_stats")
def _bn_no_stats(cx, x, w, b, training, momentum, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    mu = ops.mean(x, axes)
    d = x - _channel(mu, x.ndim)
    rstd = ops.rsqrt(ops.mean(d * d, axes) + num(eps))
    return _bn_apply(x, w, b, mu, rstd), mu, rstd


@aten("scaled_dot_product_attention.default")
def _sdpa(cx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if dropout_p and cx.training:
        cx.fail(f"scaled_dot_product_attention(dropout_p={dropout_p}) is not supported",
                "use dropout_p=0.0 (apply dropout to the attention output instead)")
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        cx.fail("scaled_dot_product_attention(enable_gqa=True) with fewer key heads is not supported",
                "repeat the key and value heads (repeat_interleave) before the call")
    if attn_mask is not None and is_causal:
        cx.fail("scaled_dot_product_attention takes attn_mask or is_causal=True, not both")
    if attn_mask is None:
        return ops.attention(f32(q), f32(k), f32(v), causal=bool(is_causal), scale=scale)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = ops.matmul(q, ops.swapaxes(k, -1, -2)) * num(scale)
    if cx.tkind(attn_mask) == "bool":
        s = ops.where(ops.broadcast_to(attn_mask, s.shape), s, -F32_MAX)
    else:
        s = s + attn_mask
    return ops.matmul(ops.softmax(s, -1), v)

