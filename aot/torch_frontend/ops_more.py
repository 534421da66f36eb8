"""More core-ATen mappings, for the public models of tests/torch_models.py (ViT, MLP-Mixer, a
minDiffusion U-Net, word_language_model, a char GRU). Registered into ops_map.TABLE after ops_nn
(same conventions: see ops_map.py); an entry here that takes over an ATen op ops_nn maps hands
the cases it does not add back to ops_nn's function.

- transposed convolution (ConvTranspose1d/2d): kernel == stride without padding (the U-Net's
  upsampling) is one matmul and a reshape; every other case is the textbook identity, the input
  dilated by the stride with zeros, padded by kernel - 1 - padding and convolved at stride 1
  with the kernel flipped and its in/out channels swapped.
- nearest and (bi)linear upsampling by whole-number factors (nn.Upsample, F.interpolate): each
  output phase is a copy or a fixed 2-tap blend of the input and its neighbour (align_corners=False,
  the edge repeated as torch clamps), interleaved by stack and reshape.
- x[:, idx]: one integer index tensor on an axis other than the first (what torch's linear
  interpolation decomposes to).
- attention dropout in training (nn.MultiheadAttention(dropout=p), SDPA's dropout_p).
- export_patches(): torch functions that read tensor values while export traces, answered
  without them where the answer cannot change the math (nn.Transformer's causal-mask check).
"""

from __future__ import annotations

import contextlib
import math

from .. import ops
from . import ops_nn  # noqa: F401  (ops_nn's entries first: the conv entry below wraps its own)
from .ops_map import F32_MAX, TABLE, _pad, aten, f32, is_t, num

_conv_plain = TABLE["aten.convolution.default"]
_sdpa_plain = TABLE["aten.scaled_dot_product_attention.default"]
_index_plain = TABLE["aten.index.Tensor"]


def _dilate(x, axis: int, s: int):
    """Zeros between the entries of one axis: n entries -> (n - 1) * s + 1."""
    if s == 1:
        return x
    n = x.shape[axis]
    y = ops.reshape(x, x.shape[: axis + 1] + (1,) + x.shape[axis + 1:])
    y = ops.pad(y, axis + 1, 0, s - 1)
    y = ops.reshape(y, x.shape[:axis] + (n * s,) + x.shape[axis + 1:])
    return ops.narrow(y, axis, 0, (n - 1) * s + 1)


def _conv_transpose2d(x, w, stride, padding, output_padding, groups):
    """x [N, Cin, H, W], w [Cin, Cout/groups, kh, kw] (torch's ConvTranspose layout)."""
    n, cin, h, wd = x.shape
    _, cog, kh, kw = w.shape
    (sh, sw), (ph, pw), (oh, ow) = stride, padding, output_padding
    if (kh, kw) == (sh, sw) and (ph, pw, oh, ow) == (0, 0, 0, 0) and groups == 1:
        # each input pixel paints its own kh x kw tile: [N*H*W, Cin] @ [Cin, Cout*kh*kw]
        rows = ops.reshape(ops.transpose(x, (0, 2, 3, 1)), (n * h * wd, cin))
        y = ops.matmul(rows, ops.reshape(w, (cin, cog * kh * kw)))
        y = ops.transpose(ops.reshape(y, (n, h, wd, cog, kh, kw)), (0, 3, 1, 4, 2, 5))
        return ops.reshape(y, (n, cog, h * kh, wd * kw))
    xd = _dilate(_dilate(x, 2, sh), 3, sw)
    # kernel - 1 - padding on each side (negative crops), output_padding more at the end
    xd = _pad(None, xd, [kw - 1 - pw, kw - 1 - pw + ow, kh - 1 - ph, kh - 1 - ph + oh])
    wf = ops.flip(w, (2, 3))
    wf = ops.reshape(wf, (groups, cin // groups, cog, kh, kw))
    wf = ops.reshape(ops.transpose(wf, (0, 2, 1, 3, 4)), (groups * cog, cin // groups, kh, kw))
    return ops.conv2d(xd, wf, (1, 1), (0, 0), groups)


@aten("convolution.default")
def _conv(cx, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if not transposed:
        return _conv_plain(cx, x, w, b, stride, padding, dilation, transposed, output_padding, groups)
    if any(d != 1 for d in dilation):
        cx.fail(f"transposed convolution with dilation={list(dilation)} is not supported", "use dilation=1")
    if x.ndim == 3:  # ConvTranspose1d as a 2-D one over [N, C, 1, L]
        y = _conv_transpose2d(ops.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2])),
                              ops.reshape(w, w.shape[:2] + (1, w.shape[2])), (1, stride[0]), (0, padding[0]),
                              (0, output_padding[0]), groups)
        y = ops.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))
    elif x.ndim == 4:
        two = [tuple(v) * (2 if len(v) == 1 else 1) for v in (stride, padding, output_padding)]
        y = _conv_transpose2d(x, w, *two, groups)
    else:
        cx.fail(f"transposed convolution over {x.ndim - 2} spatial dims is not supported",
                "use ConvTranspose1d or ConvTranspose2d")
    return y + ops.reshape(b, (1, -1) + (1,) * (y.ndim - 2)) if b is not None else y


@aten("scaled_dot_product_attention.default")
def _sdpa(cx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Attention dropout (nn.MultiheadAttention(dropout=p) in training): the probabilities are
    formed explicitly and dropped as torch does; everything else is ops_nn's fused attention."""
    if not (dropout_p and cx.training):
        return _sdpa_plain(cx, q, k, v, attn_mask, 0.0, is_causal, scale, enable_gqa)
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        return _sdpa_plain(cx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)  # its refusal
    if attn_mask is not None and is_causal:
        cx.fail("scaled_dot_product_attention takes attn_mask or is_causal=True, not both")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = ops.matmul(f32(q), ops.swapaxes(f32(k), -1, -2)) * num(scale)
    if is_causal:
        tq, tk = s.shape[-2:]
        # key j is seen by query i where j <= i (top-left aligned, as torch)
        attn_mask = 1.0 - ops.greater(ops.reshape(ops.arange(tk, "f32"), (1, tk)), ops.reshape(ops.arange(tq, "f32"), (tq, 1)))
    if attn_mask is not None:
        if is_causal or cx.tkind(attn_mask) == "bool":
            s = ops.where(ops.broadcast_to(f32(attn_mask), s.shape), s, -F32_MAX)
        else:
            s = s + f32(attn_mask)
    return ops.matmul(ops.dropout(ops.softmax(s, -1), float(dropout_p)), f32(v))


def _factors(cx, x, output_size, scale_factors):
    """The integer upsampling factor of each spatial axis (refused otherwise)."""
    spatial = x.shape[2:]
    if output_size is not None:
        out = [int(v) for v in output_size]
    else:
        out = [int(n * f) for n, f in zip(spatial, scale_factors)]  # torch floors in * scale
    if len(out) != len(spatial) or any(o % n for o, n in zip(out, spatial)):
        cx.fail(f"upsampling {list(spatial)} to {out}: only whole-number factors are supported",
                "use scale_factor=2 (or another integer), or sizes that are multiples of the input's")
    return [o // n for o, n in zip(out, spatial)]


def _interleave(parts, axis):
    """parts[r][..., i, ...] -> y[..., i * len(parts) + r, ...]."""
    y = ops.stack(parts, axis + 1) if len(parts) > 1 else ops.reshape(parts[0], parts[0].shape[: axis + 1] + (1,) + parts[0].shape[axis + 1:])
    return ops.reshape(y, y.shape[:axis] + (y.shape[axis] * y.shape[axis + 1],) + y.shape[axis + 2:])


@aten("upsample_nearest2d.vec", "upsample_nearest1d.vec")
def _upsample_nearest(cx, x, output_size=None, scale_factors=None):
    y = x
    for axis, k in zip(range(2, x.ndim), _factors(cx, x, output_size, scale_factors)):
        if k > 1:
            y = _interleave([y] * k, axis)
    return y


@aten("upsample_bilinear2d.vec", "upsample_linear1d.vec")
def _upsample_linear(cx, x, output_size=None, align_corners=False, scale_factors=None):
    if align_corners:
        cx.fail("interpolate(align_corners=True) is not supported", "use align_corners=False (the default)")
    y = f32(x)
    for axis, k in zip(range(2, x.ndim), _factors(cx, x, output_size, scale_factors)):
        if k == 1:
            continue
        n = y.shape[axis]
        # neighbours with the edge repeated: torch clamps its source index to [0, n - 1]
        prev = ops.concat([ops.narrow(y, axis, 0, 1), ops.narrow(y, axis, 0, n - 1)], axis) if n > 1 else y
        nxt = ops.concat([ops.narrow(y, axis, 1, n - 1), ops.narrow(y, axis, n - 1, 1)], axis) if n > 1 else y
        parts = []
        for r in range(k):  # output i * k + r reads source i + d, d = (r + 0.5) / k - 0.5 in (-0.5, 0.5)
            d = (r + 0.5) / k - 0.5
            parts.append(y * (1.0 + d) + prev * (-d) if d < 0 else (y * (1.0 - d) + nxt * d if d > 0 else y))
        y = _interleave(parts, axis)
    return y


@aten("index.Tensor")
def _index(cx, x, indices):
    """x[:, ..., idx] (one integer index tensor on any axis, the others whole): the axis brought to
    the front, rows gathered (embedding), the index's shape put where the axis was."""
    used = [i for i, t in enumerate(indices) if t is not None]
    if len(used) != 1 or used[0] == 0 or not is_t(indices[used[0]]) or indices[used[0]].dtype != "i32":
        return _index_plain(cx, x, indices)
    d, idx = used[0], indices[used[0]]
    # torch accepts negative indices; aot's embedding reads [0, n): wrap them first
    n = x.shape[d]
    flat = ops.reshape(idx, (-1,))
    flat = ops.cast(ops.cast(flat, "f32") + ops.less(ops.cast(flat, "f32"), 0.0) * float(n), "i32")
    y = ops.embedding(ops.swapaxes(f32(x), 0, d), flat)  # [k, x1.., x0, ..]
    y = ops.swapaxes(y, 0, d)  # [x0, .., k, ..]
    return ops.reshape(y, x.shape[:d] + idx.shape + x.shape[d + 1:])


# ---- what torch.export cannot trace as written ------------------------------------------------


@contextlib.contextmanager
def export_patches():
    """Scoped stand-ins for torch functions that branch on tensor values, while export traces.

    nn.TransformerEncoder/Decoder ask `_detect_is_causal_mask` whether a mask given without an
    is_causal hint is the causal one, by comparing its values (`bool((mask == causal).all())`),
    which export cannot trace. The answer only picks a faster kernel: with False the layers apply
    the mask exactly as given, so the traced math is the same either way.
    """
    from torch.nn.modules import transformer

    original = transformer._detect_is_causal_mask

    def detect(mask, is_causal=None, size=None):
        return is_causal is True

    transformer._detect_is_causal_mask = detect
    try:
        yield
    finally:
        transformer._detect_is_causal_mask = original
