"""unfold (im2col) and its adjoint fold (col2im): conv2d and max_pool2d are built on them.

unfold: x[N,C,H,W] -> cols[N,C,kh,kw,OH,OW] with
  cols[n,c,i,j,oh,ow] = x[n,c, oh*sh + i*dh - ph, ow*sw + j*dw - pw]   (or `value` outside x),
dilation (dh, dw) an attribute only where it is not (1, 1).
fold sums the windows back: it is unfold's transpose, so each is the other's VJP.
"""

from __future__ import annotations

import numpy as np

from ..templates import wgsl_f32
from .registry import COSTLY, Bad, OpDef, register
from . import api as F


def out_size(size, k, stride, pad, dilation=1):
    return (size + 2 * pad - dilation * (k - 1) - 1) // stride + 1


def _unfold_shape(x, k, stride, padding, value, dilation=(1, 1)):
    (s, d) = x
    if len(s) != 4:
        raise Bad(f"expects NCHW input of rank 4, got rank {len(s)}")
    oh, ow = (out_size(s[2 + a], k[a], stride[a], padding[a], dilation[a]) for a in range(2))
    if oh <= 0 or ow <= 0:
        raise Bad(f"kernel {list(k)} does not fit the padded input {list(s[2:])}")
    return (s[0], s[1], k[0], k[1], oh, ow), d


def _unfold_ref(x, k, stride, padding, value, dilation=(1, 1)):
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = k, stride, padding, dilation
    oh, ow = out_size(h, kh, sh, ph, dh), out_size(w, kw, sw, pw, dw)
    xp = np.full((n, c, h + 2 * ph, w + 2 * pw), value, dtype=x.dtype)
    xp[:, :, ph : ph + h, pw : pw + w] = x
    out = np.empty((n, c, kh, kw, oh, ow), dtype=x.dtype)
    for i in range(kh):
        for j in range(kw):
            out[:, :, i, j] = xp[:, :, i * dh : i * dh + sh * oh : sh, j * dw : j * dw + sw * ow : sw]
    return out


def _fold_shape(cols, size, stride, padding, dilation=(1, 1)):
    (s, d) = cols
    if len(s) != 6:
        raise Bad(f"expects [N,C,kh,kw,OH,OW] columns, got rank {len(s)}")
    return (s[0], s[1], size[0], size[1]), d


def _fold_ref(cols, size, stride, padding, dilation=(1, 1)):
    n, c, kh, kw, oh, ow = cols.shape
    (h, w), (sh, sw), (ph, pw), (dh, dw) = size, stride, padding, dilation
    xp = np.zeros((n, c, h + 2 * ph + sh * oh + dh * kh, w + 2 * pw + sw * ow + dw * kw), dtype=cols.dtype)
    for i in range(kh):
        for j in range(kw):
            xp[:, :, i * dh : i * dh + sh * oh : sh, j * dw : j * dw + sw * ow : sw] += cols[:, :, i, j]
    return xp[:, :, ph : ph + h, pw : pw + w].copy()


def _fold_vjp(ct, n):
    cols = n.inputs[0]
    a = n.attrs
    d = a.get("dilation", (1, 1))
    u = F.unfold(ct, cols.shape[2:4], a["stride"], a["padding"], 0.0, d)
    # a fold whose size is not unfold's inverse (conv_transpose2d's output_padding past the last
    # window) reads back more windows than it summed: its columns are the first ones
    for ax in (4, 5):
        if u.shape[ax] != cols.shape[ax]:
            u = F.narrow(u, ax, 0, cols.shape[ax])
    return (u,)


register(
    OpDef(
        "unfold",
        _unfold_shape,
        _unfold_ref,
        lambda ct, n: (F.fold(ct, n.inputs[0].shape[2:], n.attrs["stride"], n.attrs["padding"], n.attrs.get("dilation", (1, 1))),),
        "index",
        render=lambda body, n, idx: _unfold_wgsl(body, n, idx),
    )
)
register(
    OpDef(
        "fold",
        _fold_shape,
        _fold_ref,
        _fold_vjp,
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
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["padding"], a.get("dilation", (1, 1))
    di = f"{i} * {dh}u" if dh != 1 else i
    dj = f"{j} * {dw}u" if dw != 1 else j
    h = body.let(f"i32({oh} * {sh}u + {di}) - {ph}i", "i32")
    w = body.let(f"i32({ow} * {sw}u + {dj}) - {pw}i", "i32")
    H, W = x.shape[2], x.shape[3]
    inside = f"({h} >= 0i && {h} < {H}i && {w} >= 0i && {w} < {W}i)"
    hc = body.let(f"u32(clamp({h}, 0i, {H - 1}i))", "u32")
    wc = body.let(f"u32(clamp({w}, 0i, {W - 1}i))", "u32")
    v = body.value(x, body.index(x.shape, [nn_, c, hc, wc]))
    return body.let(f"select({wgsl_f32(a['value'])}, {v}, {inside})", "f32")


def _fold_tap(body, coord, shift, stride, n_out):
    """Which window position of `n_out` reads output coordinate `coord` at kernel offset `shift`
    (= k * dilation - padding): (it, whether there is one). In u32: a coordinate left of the
    first window wraps to 2^32 - s, whose quotient is past any n_out, so one bound check covers
    both sides, and no signed / or % is left for the shader compiler (SwiftShader spent minutes
    on the signed ones of a fold inside a reduction's loop, and Chromium dropped the instance)."""
    q = coord if shift == 0 else body.let(f"{coord} + {-shift}u" if shift < 0 else f"{coord} - {shift}u", "u32")
    if stride == 1:
        return body.let(f"min({q}, {n_out - 1}u)", "u32"), body.let(f"{q} < {n_out}u", "bool")
    ok = body.let(f"{q} % {stride}u == 0u && {q} / {stride}u < {n_out}u", "bool")
    return body.let(f"min({q} / {stride}u, {n_out - 1}u)", "u32"), ok


FOLD_TERMS = 64  # window taps summed in one expression (_fold_wgsl)


def _fold_wgsl(body, n, idx):
    cols = n.inputs[0]
    a = n.attrs
    nn_, c, h, w = idx.get_coords(body)
    _, _, kh, kw, OH, OW = cols.shape
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["padding"], a.get("dilation", (1, 1))
    rows = [_fold_tap(body, h, i * dh - ph, sh, OH) for i in range(kh)]
    cols_ = [_fold_tap(body, w, j * dw - pw, sw, OW) for j in range(kw)]
    terms = []
    for i, (oh, rok) in enumerate(rows):
        for j, (ow, cok) in enumerate(cols_):
            v = body.value(cols, body.index(cols.shape, [nn_, c, f"{i}u", f"{j}u", oh, ow]))
            terms.append(body.let(f"select(0.0, {v}, {rok} && {cok})", "f32"))
    # the sum left to right in lets of FOLD_TERMS terms: the same order and value as one
    # expression, whose 520 terms (adaptive_avg_pool2d over 4 x 130) nested too deep for the
    # wasm set's compiler (fuzz seed 5750138)
    total = body.let(" + ".join(terms[:FOLD_TERMS]), "f32")
    for k in range(FOLD_TERMS, len(terms), FOLD_TERMS - 1):
        total = body.let(" + ".join([total] + terms[k : k + FOLD_TERMS - 1]), "f32")
    return total
