"""unfold (im2col) and its adjoint fold (col2im): conv2d and max_pool2d are built on them.

unfold: x[N,C,H,W] -> cols[N,C,kh,kw,OH,OW] with
  cols[n,c,i,j,oh,ow] = x[n,c, oh*sh + i - ph, ow*sw + j - pw]   (or `value` outside x).
fold sums the windows back: it is unfold's transpose, so each is the other's VJP.
"""

from __future__ import annotations

import numpy as np

from ..templates import wgsl_f32
from .registry import COSTLY, Bad, OpDef, register
from . import api as F


def out_size(size, k, stride, pad):
    return (size + 2 * pad - k) // stride + 1


def _unfold_shape(x, k, stride, padding, value):
    (s, d) = x
    if len(s) != 4:
        raise Bad(f"expects NCHW input of rank 4, got rank {len(s)}")
    oh, ow = (out_size(s[2 + a], k[a], stride[a], padding[a]) for a in range(2))
    if oh <= 0 or ow <= 0:
        raise Bad(f"kernel {list(k)} does not fit the padded input {list(s[2:])}")
    return (s[0], s[1], k[0], k[1], oh, ow), d


def _unfold_ref(x, k, stride, padding, value):
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = k, stride, padding
    oh, ow = out_size(h, kh, sh, ph), out_size(w, kw, sw, pw)
    xp = np.full((n, c, h + 2 * ph, w + 2 * pw), value, dtype=x.dtype)
    xp[:, :, ph : ph + h, pw : pw + w] = x
    out = np.empty((n, c, kh, kw, oh, ow), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            out[:, :, i, j] = xp[:, :, i : i + sh * oh : sh, j : j + sw * ow : sw]
    return out


def _fold_shape(cols, size, stride, padding):
    (s, d) = cols
    if len(s) != 6:
        raise Bad(f"expects [N,C,kh,kw,OH,OW] columns, got rank {len(s)}")
    return (s[0], s[1], size[0], size[1]), d


def _fold_ref(cols, size, stride, padding):
    n, c, kh, kw, oh, ow = cols.shape
    (h, w), (sh, sw), (ph, pw) = size, stride, padding
    xp = np.zeros((n, c, h + 2 * ph + sh * oh + kh, w + 2 * pw + sw * ow + kw), dtype=cols.dtype)
    for i in range(kh):
        for j in range(kw):
            xp[:, :, i : i + sh * oh : sh, j : j + sw * ow : sw] += cols[:, :, i, j]
    return xp[:, :, ph : ph + h, pw : pw + w].copy()


register(
    OpDef(
        "unfold",
        _unfold_shape,
        _unfold_ref,
        lambda ct, n: (F.fold(ct, n.inputs[0].shape[2:], n.attrs["stride"], n.attrs["padding"]),),
        "index",
        render=lambda body, n, idx: _unfold_wgsl(body, n, idx),
    )
)
register(
    OpDef(
        "fold",
        _fold_shape,
        _fold_ref,
        lambda ct, n: (F.unfold(ct, n.inputs[0].shape[2:4], n.attrs["stride"], n.attrs["padding"], 0.0),),
        "gather",
        cost=COSTLY,
        render=lambda body, n, idx: _fold_wgsl(body, n, idx),
    )
)


# ---- WGSL (wgsl_expr.Body calls these for one element at `idx`) --------------------------


def _unfold_wgsl(body, n, idx):
    x = n.inputs[0]
    a = n.attrs
    nn_, c, i, j, oh, ow = idx.get_coords(body)
    (sh, sw), (ph, pw) = a["stride"], a["padding"]
    h = body.let(f"i32({oh} * {sh}u + {i}) - {ph}i", "i32")
    w = body.let(f"i32({ow} * {sw}u + {j}) - {pw}i", "i32")
    H, W = x.shape[2], x.shape[3]
    inside = f"({h} >= 0i && {h} < {H}i && {w} >= 0i && {w} < {W}i)"
    hc = body.let(f"u32(clamp({h}, 0i, {H - 1}i))", "u32")
    wc = body.let(f"u32(clamp({w}, 0i, {W - 1}i))", "u32")
    v = body.value(x, body.index(x.shape, [nn_, c, hc, wc]))
    return body.let(f"select({wgsl_f32(a['value'])}, {v}, {inside})", "f32")


def _fold_wgsl(body, n, idx):
    cols = n.inputs[0]
    a = n.attrs
    nn_, c, h, w = idx.get_coords(body)
    _, _, kh, kw, OH, OW = cols.shape
    (sh, sw), (ph, pw) = a["stride"], a["padding"]
    terms = []
    for i in range(kh):
        for j in range(kw):
            hn = body.let(f"i32({h}) + {ph - i}i", "i32")
            wn = body.let(f"i32({w}) + {pw - j}i", "i32")
            ok = f"({hn} >= 0i && {wn} >= 0i && {hn} % {sh}i == 0i && {wn} % {sw}i == 0i && {hn} / {sh}i < {OH}i && {wn} / {sw}i < {OW}i)"
            ohc = body.let(f"u32(clamp({hn} / {sh}i, 0i, {OH - 1}i))", "u32")
            owc = body.let(f"u32(clamp({wn} / {sw}i, 0i, {OW - 1}i))", "u32")
            v = body.value(cols, body.index(cols.shape, [nn_, c, f"{i}u", f"{j}u", ohc, owc]))
            terms.append(body.let(f"select(0.0, {v}, {ok})", "f32"))
    return body.let(" + ".join(terms), "f32")

