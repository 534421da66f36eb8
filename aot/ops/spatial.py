"""Spatial ops with torch.nn.functional's arguments (API.md §7): pad (PyTorch's form and modes),
avg_pool2d, adaptive_avg_pool2d, interpolate (nearest, bilinear) and dropout2d.

All are composites of existing primitives, so they need no kernel or VJP of their own:
- pad's modes are concats of narrows, flips and broadcasts of the input's edges;
- avg_pool2d sums unfolded windows (conv.py) and divides by the window count torch uses;
- adaptive_avg_pool2d and bilinear interpolation weigh rows and columns by small [out, in]
  matrices built from arange in the graph (constants, free to recompute);
- nearest interpolation gathers rows and columns at indices computed from arange.
"""

from __future__ import annotations

import builtins as _b
import math
import numbers

import numpy as np

from .trace import current, fail
from . import api as F


def _int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


# ---- pad ------------------------------------------------------------------------------------


def pad(x, *args, **kwargs):
    """Two call forms (dispatched on the arguments):
    - `pad(x, pad, mode="constant", value=0.0)`, torch.nn.functional.pad's: `pad` is a tuple
      (left, right, top, bottom, ...) of pads for the last axis first, then the one before, ...;
      negative pads crop. mode "constant" (fills with `value`), "reflect" (mirrors without
      repeating the edge; pads < size), "replicate" (repeats the edge) or "circular" (wraps;
      pads <= size);
    - `pad(x, axis, before, after)`: zero-pads one axis (the original aot form)."""
    if args and _int(args[0]) or "axis" in kwargs or "before" in kwargs:
        return F.pad(x, *args, **kwargs)
    return _torch_pad(x, *args, **kwargs)


def _torch_pad(x, pad, mode: str = "constant", value=None):
    F._check_tensor("pad", x)
    if not isinstance(pad, (tuple, list)) or len(pad) % 2 or not all(_int(p) for p in pad):
        fail("pad", f"pad must be a tuple of ints of even length (left, right, top, bottom, ...), got {pad!r}")
    if len(pad) // 2 > x.ndim:
        fail("pad", f"pad {tuple(pad)} pads {len(pad) // 2} axes but {x.type_str()} has {x.ndim}")
    if mode not in ("constant", "reflect", "replicate", "circular"):
        fail("pad", f"mode must be 'constant', 'reflect', 'replicate' or 'circular', got {mode!r}")
    if value is not None and mode != "constant":
        fail("pad", f"value is only used by mode='constant', got value={value!r} with mode={mode!r}")
    value = 0.0 if value is None else value
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        fail("pad", f"value must be a number, got {value!r}")
    out = x
    for k in range(len(pad) // 2):
        axis = x.ndim - 1 - k
        before, after = int(pad[2 * k]), int(pad[2 * k + 1])
        # negative pads crop first (torch: the crop applies to the input, the pad to the result)
        n = out.shape[axis]
        lo, hi = _b.max(-before, 0), _b.max(-after, 0)
        if lo + hi > n:
            fail("pad", f"pads ({before}, {after}) crop more than the {n} elements of axis {axis} of {x.type_str()}")
        out = F.narrow(out, axis, lo, n - lo - hi)
        before, after = _b.max(before, 0), _b.max(after, 0)
        if before or after:
            out = _pad_axis(out, axis, before, after, mode, float(value), x)
    return out


def _pad_axis(x, axis, before, after, mode, value, orig):
    n = x.shape[axis]
    if mode == "constant":
        y = F.pad(x, axis, before, after)
        if value == 0.0 or x.dtype != "f32":
            return y if value == 0.0 else fail("pad", "a nonzero value needs an f32 input")
        # value where the zero padding went: value * (1 - pad(ones))
        ones = F.broadcast_to(F._const(1.0, "f32"), x.shape)
        return y + (1.0 - F.pad(ones, axis, before, after)) * value
    if mode == "reflect" and (before >= n or after >= n):
        fail("pad", f"reflect pads ({before}, {after}) must be smaller than axis {axis} of size {n} in {orig.type_str()}")
    if mode == "circular" and (before > n or after > n):
        fail("pad", f"circular pads ({before}, {after}) must be at most the size {n} of axis {axis} in {orig.type_str()}")
    if mode == "replicate" and n == 0:
        fail("pad", f"replicate needs a non-empty axis {axis} in {orig.type_str()}")
    parts = []
    if before:
        if mode == "reflect":  # x[before], ..., x[1]
            parts.append(F.flip(F.narrow(x, axis, 1, before), axis))
        elif mode == "replicate":
            parts.append(_repeat_edge(x, axis, 0, before))
        else:
            parts.append(F.narrow(x, axis, n - before, before))
    parts.append(x)
    if after:
        if mode == "reflect":  # x[n-2], ..., x[n-1-after]
            parts.append(F.flip(F.narrow(x, axis, n - 1 - after, after), axis))
        elif mode == "replicate":
            parts.append(_repeat_edge(x, axis, n - 1, after))
        else:
            parts.append(F.narrow(x, axis, 0, after))
    return F.concat(parts, axis)


def _repeat_edge(x, axis, at, count):
    edge = F.narrow(x, axis, at, 1)
    shape = list(x.shape)
    shape[axis] = count
    return F.broadcast_to(edge, tuple(shape))


# ---- pooling ------------------------------------------------------------------------------------


def _pair(v, name, op):
    if _int(v):
        return (int(v), int(v))
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(_int(i) for i in v):
        return (int(v[0]), int(v[1]))
    fail(op, f"{name} must be an int or a pair of ints, got {v!r}")


def _nchw(op, x):
    F._check_f32(op, x)
    if x.ndim != 4:
        fail(op, f"expects NCHW input x[N, C, H, W], got {x.type_str()}")


def _pool_size(size, k, s, p, ceil_mode):
    """torch's pooling output size: with ceil_mode the last window may overhang the input, but
    must start inside it or its left padding."""
    span = size + 2 * p - k
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _axis_vector(n: int, fn):
    """f32[n] built in the graph from arange (a constant: computed where it is read)."""
    return fn(F.arange(n, "f32"))


def avg_pool2d(x, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override=None):
    """Mean over kernel_size windows of NCHW input (torch.nn.functional.avg_pool2d): padding is
    zeros, counted in the divisor when count_include_pad (windows are clipped to the padded
    input, which matters with ceil_mode); divisor_override replaces the divisor."""
    _nchw("avg_pool2d", x)
    k = _pair(kernel_size, "kernel_size", "avg_pool2d")
    s = k if stride is None or stride == [] else _pair(stride, "stride", "avg_pool2d")
    p = _pair(padding, "padding", "avg_pool2d")
    if _b.min(k) < 1 or _b.min(s) < 1 or _b.min(p) < 0:
        fail("avg_pool2d", f"kernel_size and stride must be >= 1 and padding >= 0, got {k}, {s}, {p}")
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        fail("avg_pool2d", f"padding {list(p)} must be at most half the kernel size {list(k)}")
    if divisor_override is not None and (not _int(divisor_override) or divisor_override < 1):
        fail("avg_pool2d", f"divisor_override must be a positive int or None, got {divisor_override!r}")
    size = x.shape[2:]
    if _b.any(size[a] + 2 * p[a] < k[a] for a in range(2)):
        fail("avg_pool2d", f"kernel {list(k)} does not fit the input {x.type_str()} padded by {list(p)}")
    out = [_pool_size(size[a], k[a], s[a], p[a], ceil_mode) for a in range(2)]
    # windows that overhang the padded input (ceil_mode) read zeros there: pad the far side
    extra = [_b.max((out[a] - 1) * s[a] + k[a] - (size[a] + 2 * p[a]), 0) for a in range(2)]
    xx = x
    for a in range(2):
        if extra[a]:
            xx = F.pad(xx, 2 + a, 0, extra[a])
    cols = F.unfold(xx, k, s, p)  # [N, C, kh, kw, OH, OW]
    total = F.sum(cols, (2, 3))
    if divisor_override is not None:
        return total * (1.0 / divisor_override)
    if not ceil_mode and count_include_pad:
        return total * (1.0 / (k[0] * k[1]))

    def count(a):  # window extent along axis a for each output position
        lo_limit, hi_limit = (-p[a], size[a] + p[a]) if count_include_pad else (0, size[a])

        def fn(o):
            start = o * float(s[a]) - float(p[a])
            return F.minimum(start + float(k[a]), float(hi_limit)) - F.maximum(start, float(lo_limit))

        return _axis_vector(out[a], fn)

    ch, cw = count(0), count(1)
    div = F.reshape(ch, (out[0], 1)) * F.reshape(cw, (1, out[1]))
    return total / F.broadcast_to(div, total.shape)


def adaptive_avg_pool2d(x, output_size):
    """Mean over adaptive windows (torch.nn.functional.adaptive_avg_pool2d): output row i averages
    input rows floor(i*H/OH) .. ceil((i+1)*H/OH) - 1 (the same for columns); an output size may be
    None to keep the input's."""
    _nchw("adaptive_avg_pool2d", x)
    if _int(output_size):
        osz = (int(output_size),) * 2
    elif isinstance(output_size, (tuple, list)) and len(output_size) == 2 and all(v is None or _int(v) for v in output_size):
        osz = tuple(x.shape[2 + a] if v is None else int(v) for a, v in enumerate(output_size))
    else:
        fail("adaptive_avg_pool2d", f"output_size must be an int or a pair of ints (or None), got {output_size!r}")
    if _b.min(osz) < 1:
        fail("adaptive_avg_pool2d", f"output_size must be positive, got {list(osz)}")
    h, w = x.shape[2:]
    if h % osz[0] == 0 and w % osz[1] == 0:  # equal windows: a plain average pool
        k = (h // osz[0], w // osz[1])
        return avg_pool2d(x, k, k)
    ah, aw = _window_matrix(osz[0], h), _window_matrix(osz[1], w)  # [OH, H], [OW, W]
    return _separable(x, ah, aw)


def _window_matrix(out: int, size: int):
    """A[o, i] = 1/count where input i lies in adaptive window o: start = floor(o*size/out),
    end = ceil((o+1)*size/out), tested exactly on integers: i >= start <=> (i+1)*out > o*size,
    i < end <=> i*out < (o+1)*size."""
    o = F.reshape(F.arange(out, "f32"), (out, 1))
    i = F.reshape(F.arange(size, "f32"), (1, size))
    o, i = F.broadcast_to(o, (out, size)), F.broadcast_to(i, (out, size))
    inside = F.greater((i + 1.0) * float(out), o * float(size)) * F.less(i * float(out), (o + 1.0) * float(size))
    return inside / F.sum(inside, 1, keepdims=True)


def _separable(x, ah, aw):
    """y[n, c, o, p] = sum_{i, j} ah[o, i] x[n, c, i, j] aw[p, j]: two matmuls."""
    y = F.matmul(x, F.transpose(aw, (1, 0)))  # [N, C, H, OW]
    y = F.matmul(F.swapaxes(y, 2, 3), F.transpose(ah, (1, 0)))  # [N, C, OW, OH]
    return F.swapaxes(y, 2, 3)


# ---- interpolate ------------------------------------------------------------------------------


def interpolate(x, size=None, scale_factor=None, mode: str = "nearest", align_corners=None,
                recompute_scale_factor=None):
    """Resize NCHW input (torch.nn.functional.interpolate) to `size` (an int or a pair) or by
    `scale_factor` (a number or a pair: output size floor(in * scale)). mode "nearest" (source
    index floor(o * scale), torch's legacy nearest) or "bilinear" (align_corners True: corners
    map to corners; False/None: half-pixel centres, clamped at 0). As torch, a given scale_factor
    sets the source scale 1/scale_factor unless recompute_scale_factor=True."""
    _nchw("interpolate", x)
    if mode not in ("nearest", "bilinear"):
        fail("interpolate", f"mode must be 'nearest' or 'bilinear', got {mode!r}")
    if mode == "nearest" and align_corners is not None:
        fail("interpolate", "align_corners can only be set with mode='bilinear'")
    if (size is None) == (scale_factor is None):
        fail("interpolate", "give exactly one of size and scale_factor")
    insz = x.shape[2:]
    if size is not None:
        osz = _pair(size, "size", "interpolate")
        scales = (None, None)
        if recompute_scale_factor:
            fail("interpolate", "recompute_scale_factor needs scale_factor, not size")
    else:
        sf = scale_factor
        if isinstance(sf, numbers.Real) and not isinstance(sf, bool):
            sf = (sf, sf)
        if not (isinstance(sf, (tuple, list)) and len(sf) == 2 and all(isinstance(v, numbers.Real) and v > 0 for v in sf)):
            fail("interpolate", f"scale_factor must be a positive number or a pair of them, got {scale_factor!r}")
        osz = tuple(int(math.floor(float(insz[a]) * float(sf[a]))) for a in range(2))
        scales = (None, None) if recompute_scale_factor else (float(sf[0]), float(sf[1]))
    if _b.min(osz) < 1:
        fail("interpolate", f"output size {list(osz)} must be positive")
    y = x
    for a in range(2):
        if mode == "nearest":
            y = _nearest_axis(y, 2 + a, osz[a], scales[a])
        else:
            y = _linear_axis(y, 2 + a, osz[a], scales[a], bool(align_corners))
    return y


def _f32(v) -> float:
    return float(np.float32(v))


def _torch_scale(size, out, scale):
    """torch's compute_scales_value<float>: 1/scale_factor when given, else in/out, in float32."""
    return _f32(1.0 / scale) if scale is not None and scale > 0 else _f32(np.float32(size) / np.float32(out))


def _nearest_index(size, out, scale) -> list[int]:
    """torch's nearest_idx, evaluated as it does (float32 product, floor, clamp)."""
    if out == size:
        return list(range(out))
    if out == 2 * size:
        return [o >> 1 for o in range(out)]
    s = np.float32(_torch_scale(size, out, scale))
    return [_b.min(int(np.floor(np.float32(o) * s)), size - 1) for o in range(out)]


def _index_vector(values: list[int], size: int):
    """i32[n] holding `values` (non-decreasing source indices), built exactly in the graph: the
    nearest rational index floor((o*size + 0.5)/n) (0.5 keeps f32 rounding away from integers),
    plus a correction at each position where the wanted index differs (rare: float32 scales)."""
    n = len(values)
    o = F.arange(n, "f32")
    base = [_b.min((2 * k * size + 1) // (2 * n), size - 1) for k in range(n)]
    v = F.minimum(F.cast(F.cast((o * float(size) + 0.5) * (1.0 / n), "i32"), "f32"), float(size - 1))
    for k, (want, got) in enumerate(zip(values, base)):
        if want != got:
            v = v + F.equal(o, float(k)) * float(want - got)
    return F.cast(v + 0.25, "i32")  # +0.25: the cast truncates an exact integer either way


def _gather_axis(x, axis, idx):
    perm = (axis,) + tuple(i for i in range(x.ndim) if i != axis)
    g = F.embedding(F.transpose(x, perm), idx)
    inv = tuple(int(i) for i in np.argsort(perm))
    return F.transpose(g, inv)


def _nearest_axis(x, axis, out, scale):
    size = x.shape[axis]
    values = _nearest_index(size, out, scale)
    if values == list(range(size)):
        return x
    return _gather_axis(x, axis, _index_vector(values, size))


def _linear_axis(x, axis, out, scale, align_corners):
    """torch's area_pixel_compute_source_index and its two neighbours, weighted in the graph."""
    size = x.shape[axis]
    if out == size and (align_corners or scale is None or scale == 1.0):
        return x
    if align_corners:
        s = _f32((size - 1) / (out - 1)) if out > 1 else 0.0
        src = lambda o: o * s  # noqa: E731
    else:
        s = _torch_scale(size, out, scale)
        src = lambda o: F.maximum(s * (o + 0.5) - 0.5, 0.0)  # noqa: E731
    o = F.arange(out, "f32")
    pos = src(o)
    i0 = F.cast(F.cast(pos, "i32"), "f32")  # floor (pos >= 0)
    lam = pos - i0
    i1 = F.minimum(i0 + 1.0, float(size - 1))
    a = _gather_axis(x, axis, F.cast(i0 + 0.25, "i32"))
    b = _gather_axis(x, axis, F.cast(i1 + 0.25, "i32"))
    shape = [1] * x.ndim
    shape[axis] = out
    lam = F.broadcast_to(F.reshape(lam, tuple(shape)), a.shape)
    return a * (1.0 - lam) + b * lam


# ---- dropout2d ------------------------------------------------------------------------------------


def dropout2d(x, p: float = 0.5, training: bool = True):
    """Channel dropout (torch.nn.functional.dropout2d): each (n, c) channel of x[N, C, ...] is
    zeroed with probability p, kept channels scaled by 1/(1-p); the identity in Infer graphs
    (and with training=False)."""
    F._check_f32("dropout2d", x)
    if not isinstance(p, numbers.Real) or not 0.0 <= p < 1.0:
        fail("dropout2d", f"p must be in [0, 1), got {p!r}")
    if x.ndim < 2:
        fail("dropout2d", f"expects x[N, C, ...] with at least 2 dims, got {x.type_str()}")
    if not training or current().meta.get("kind") != "train" or p == 0.0:
        return x
    mask_shape = x.shape[:2] + (1,) * (x.ndim - 2)
    keep = F.greater(F._uniform(mask_shape, F._next_salt()), float(p))
    return x * F.broadcast_to(keep * (1.0 / (1.0 - p)), x.shape)

