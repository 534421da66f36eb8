"""conv1d and conv_transpose2d with torch.nn.functional's arguments (API.md §7).

conv1d is conv2d over a height of 1. conv_transpose2d is conv2d's input gradient run forward:
a grouped matmul gives each input pixel's contribution to its kh x kw output window
(cols[n, c_out, i, j, h, w] = sum_c_in x[n, c_in, h, w] w[c_in, c_out, i, j]) and fold (col2im,
conv.py) sums the windows into the output, so the zero-inserted input of the textbook
formulation is never built and no multiply touches an inserted zero. Its gradients are the
transposes: unfold of the output gradient and two matmuls (that is, conv2d).
"""

from __future__ import annotations

import builtins as _b
import numbers

from .trace import fail
from . import api as F


def _tuple(v, n, name, op):
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return (int(v),) * n
    if isinstance(v, (tuple, list)) and len(v) == n and all(isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in v):
        return tuple(int(i) for i in v)
    fail(op, f"{name} must be an int or a tuple of {n} ints, got {v!r}")


def _bias(op, y, bias, channels):
    if bias is None:
        return y
    if not isinstance(bias, F.Tensor) or bias.shape != (channels,):
        got = bias.type_str() if isinstance(bias, F.Tensor) else type(bias).__name__
        fail(op, f"bias must be f32[{channels}] (one per output channel), got {got}")
    return y + F.reshape(bias, (channels,) + (1,) * (y.ndim - 2))


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1):
    """NCL convolution (torch.nn.functional.conv1d): input[N, C, L], weight[O, C/groups, k],
    bias[O] or None -> [N, O, L_out], L_out = (L + 2*padding - dilation*(k-1) - 1) // stride + 1."""
    for name, t in (("input", input), ("weight", weight)):
        if not isinstance(t, F.Tensor):
            fail("conv1d", f"{name} must be a Tensor, got {type(t).__name__}")
        F._check_f32("conv1d", t)
    if input.ndim != 3 or weight.ndim != 3:
        fail("conv1d", f"expects input[N, C, L] and weight[O, C/groups, k], got {input.type_str()} and {weight.type_str()}")
    (s,), (p,), (d,) = (_tuple(v, 1, nm, "conv1d") for v, nm in ((stride, "stride"), (padding, "padding"), (dilation, "dilation")))
    x = F.reshape(input, (input.shape[0], input.shape[1], 1, input.shape[2]))
    w = F.reshape(weight, (weight.shape[0], weight.shape[1], 1, weight.shape[2]))
    y = F.conv2d(x, w, (1, s), (0, p), groups, (1, d))
    y = F.reshape(y, (y.shape[0], y.shape[1], y.shape[3]))
    return _bias("conv1d", y, bias, weight.shape[0])


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups: int = 1, dilation=1):
    """Transposed NCHW convolution (torch.nn.functional.conv_transpose2d): input[N, C_in, H, W],
    weight[C_in, C_out/groups, kh, kw] (PyTorch's layout), bias[C_out] or None ->
    [N, C_out, H_out, W_out], H_out = (H - 1)*stride - 2*padding + dilation*(kh - 1) + output_padding + 1."""
    op = "conv_transpose2d"
    for name, t in (("input", input), ("weight", weight)):
        if not isinstance(t, F.Tensor):
            fail(op, f"{name} must be a Tensor, got {type(t).__name__}")
        F._check_f32(op, t)
    if input.ndim != 4 or weight.ndim != 4:
        fail(op, f"expects input[N, C_in, H, W] and weight[C_in, C_out/groups, kh, kw], got {input.type_str()} and {weight.type_str()}")
    s, p, op_, d = (_tuple(v, 2, nm, op) for v, nm in ((stride, "stride"), (padding, "padding"),
                                                      (output_padding, "output_padding"), (dilation, "dilation")))
    n, cin, h, w = input.shape
    wc, og, kh, kw = weight.shape
    if not isinstance(groups, int) or groups < 1 or cin % groups or wc != cin:
        fail(op, f"weight {weight.type_str()} does not fit input {input.type_str()} with groups={groups}",
             "weight must be [in, out/groups, kh, kw] and groups must divide in")
    if _b.min(s) < 1 or _b.min(d) < 1 or _b.min(p) < 0 or _b.min(op_) < 0:
        fail(op, f"stride and dilation must be >= 1, padding and output_padding >= 0; got {s}, {d}, {p}, {op_}")
    if any(op_[a] >= _b.max(s[a], d[a]) for a in range(2)):
        fail(op, f"output_padding {list(op_)} must be smaller than stride {list(s)} or dilation {list(d)}")
    size = tuple((h, w)[a] - 1 for a in range(2))
    size = tuple(size[a] * s[a] - 2 * p[a] + d[a] * ((kh, kw)[a] - 1) + op_[a] + 1 for a in range(2))
    if _b.min(size) < 1:
        fail(op, f"the output size {list(size)} is not positive (padding {list(p)} is too large)")
    cg = cin // groups
    # [G, N*H*W, C_in/G] @ [G, C_in/G, og*kh*kw] -> every input pixel's output window
    xg = F.reshape(F.transpose(F.reshape(input, (n, groups, cg, h * w)), (1, 0, 3, 2)), (groups, n * h * w, cg))
    wg = F.reshape(weight, (groups, cg, og * kh * kw))
    if groups == 1:
        cols = F.matmul(F.reshape(xg, xg.shape[1:]), F.reshape(wg, wg.shape[1:]))
    else:
        cols = F.matmul(xg, wg)
    cols = F.reshape(cols, (groups, n, h, w, og, kh, kw))
    cols = F.reshape(F.transpose(cols, (1, 0, 4, 5, 6, 2, 3)), (n, groups * og, kh, kw, h, w))
    y = F.fold(cols, size, s, p, d)
    return _bias(op, y, bias, groups * og)
