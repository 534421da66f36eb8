"""Op-table cases (tests/op_cases.py) for the spatial ops: pad's torch form, Tensor.__getitem__,
avg/adaptive pooling, interpolate, dilated conv2d, conv1d, conv_transpose2d and their modules.

Torch is the oracle for all of them (`torch=`); pad and indexing also have NumPy formulas.
Sizes are chosen so that interpolate's source scales are exact in float32 where the float64
comparison with torch is tight (torch computes a float64 input's scales in float64)."""

from __future__ import annotations

import numpy as np


def np_pad(x, pad, mode="constant", value=0.0):
    for k in range(len(pad) // 2):
        axis = x.ndim - 1 - k
        lo, hi = pad[2 * k], pad[2 * k + 1]
        n = x.shape[axis]
        x = np.take(x, range(max(-lo, 0), n - max(-hi, 0)), axis=axis)
        widths = [(0, 0)] * x.ndim
        widths[axis] = (max(lo, 0), max(hi, 0))
        npmode = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
        x = np.pad(x, widths, npmode, **({"constant_values": value} if mode == "constant" else {}))
    return x


def t_pad(t, x, pad, mode="constant", value=None):
    return t.nn.functional.pad(x, pad, mode, value)


def _f(name):
    return lambda t, *a, **k: getattr(t.nn.functional, name)(*a, **k)


def cases():
    from aot import nn, ops
    from op_cases import OpCase as C, f32, i32

    P = ops.pad
    return [
        # pad, torch's form (the old pad(x, axis, before, after) form is pad.internal)
        C("pad.torch_last", lambda x: P(x, (1, 2)), (f32(2, 3),), ref=lambda x: np_pad(x, (1, 2)),
          torch=lambda t, x: t.nn.functional.pad(x, (1, 2))),
        C("pad.torch_value", P, (f32(2, 3, 4),), {"pad": (1, 0, 2, 1), "value": 0.5}, ref=np_pad, torch=t_pad),
        C("pad.crop", P, (f32(2, 4, 5),), {"pad": (-1, 2, 1, -2)}, ref=np_pad, torch=t_pad),
        C("pad.reflect", P, (f32(1, 2, 4, 5),), {"pad": (2, 1, 1, 3), "mode": "reflect"}, ref=np_pad, torch=t_pad),
        C("pad.reflect_1d", P, (f32(2, 3, 5),), {"pad": (4, 3), "mode": "reflect"}, ref=np_pad, torch=t_pad),
        C("pad.replicate", P, (f32(1, 2, 3, 4),), {"pad": (1, 2, 2, 0), "mode": "replicate"}, ref=np_pad, torch=t_pad),
        C("pad.circular", P, (f32(1, 2, 3, 4),), {"pad": (2, 1, 1, 3), "mode": "circular"}, ref=np_pad, torch=t_pad),
        C("pad.replicate_crop", P, (f32(1, 1, 4, 4),), {"pad": (-1, 2, 2, -1), "mode": "replicate"}, ref=np_pad),
        # Tensor.__getitem__: views (ints, slices, steps, None, ...), flips, gathers
        C("getitem.int_step", lambda x: x[1, ::2], (f32(3, 5, 2),), ref=lambda x: x[1, ::2],
          torch=lambda t, x: x[1, ::2]),
        C("getitem.negative", lambda x: x[-1, 1:-1, -2], (f32(2, 5, 3),), ref=lambda x: x[-1, 1:-1, -2]),
        C("getitem.step3", lambda x: x[:, 1::3], (f32(2, 7, 3),), ref=lambda x: x[:, 1::3], torch=lambda t, x: x[:, 1::3]),
        C("getitem.neg_step", lambda x: x[::-2, 3:0:-1], (f32(5, 4),), ref=lambda x: x[::-2, 3:0:-1]),
        C("getitem.none_ellipsis", lambda x: x[None, ..., 0, None], (f32(2, 3, 4),), ref=lambda x: x[None, ..., 0, None],
          torch=lambda t, x: x[None, ..., 0, None]),
        C("getitem.ellipsis_step", lambda x: x[..., 1:, ::2], (f32(2, 3, 5),), ref=lambda x: x[..., 1:, ::2]),
        C("getitem.tensor", lambda x, i: x[:, i], (f32(3, 5), i32(2, 4, high=5)), ref=lambda x, i: x[:, i],
          torch=lambda t, x, i: x[:, i.long()]),
        C("getitem.tensor_repeats", lambda x, i: x[i], (f32(3, 2), i32(7, high=3)), ref=lambda x, i: x[i],
          torch=lambda t, x, i: x[i.long()]),
        C("getitem.tensor_after_int", lambda x, i: x[1, ..., i, ::2], (f32(2, 3, 4, 5), i32(3, high=4)),
          ref=lambda x, i: x[1][..., i, ::2], torch=lambda t, x, i: x[1, ..., i.long(), ::2]),  # torch: ints select first
        C("getitem.list", lambda x: x[:, [2, 0, 2, -1]], (f32(2, 4, 3),), ref=lambda x: x[:, [2, 0, 2, -1]],
          torch=lambda t, x: x[:, [2, 0, 2, -1]]),
        C("getitem.i32", lambda i: i[::2, -1], (i32(5, 3, high=9),), grad=False, ref=lambda i: i[::2, -1]),
        # pooling
        C("avg_pool2d.k2", ops.avg_pool2d, (f32(1, 2, 4, 4),), {"kernel_size": 2}, torch=_f("avg_pool2d")),
        C("avg_pool2d.pad", ops.avg_pool2d, (f32(2, 1, 5, 5),), {"kernel_size": 3, "stride": 2, "padding": 1},
          torch=_f("avg_pool2d")),
        C("avg_pool2d.exclude_pad", ops.avg_pool2d, (f32(1, 2, 5, 4),),
          {"kernel_size": (3, 2), "stride": (2, 1), "padding": 1, "count_include_pad": False}, torch=_f("avg_pool2d")),
        C("avg_pool2d.ceil", ops.avg_pool2d, (f32(1, 1, 6, 5),), {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
          torch=_f("avg_pool2d")),
        C("avg_pool2d.ceil_exclude", ops.avg_pool2d, (f32(1, 2, 5, 6),),
          {"kernel_size": 2, "stride": 2, "ceil_mode": True, "count_include_pad": False}, torch=_f("avg_pool2d")),
        C("avg_pool2d.divisor", ops.avg_pool2d, (f32(1, 1, 4, 4),), {"kernel_size": 2, "stride": 1, "divisor_override": 3},
          torch=_f("avg_pool2d")),
        C("adaptive_avg_pool2d.uneven", ops.adaptive_avg_pool2d, (f32(1, 2, 5, 7),), {"output_size": (3, 4)},
          torch=_f("adaptive_avg_pool2d")),
        C("adaptive_avg_pool2d.even", ops.adaptive_avg_pool2d, (f32(2, 1, 4, 6),), {"output_size": (2, 3)},
          torch=_f("adaptive_avg_pool2d")),
        C("adaptive_avg_pool2d.none_up", ops.adaptive_avg_pool2d, (f32(1, 1, 3, 4),), {"output_size": (None, 6)},
          torch=_f("adaptive_avg_pool2d")),
        # interpolate
        C("interpolate.nearest_size", ops.interpolate, (f32(1, 2, 3, 4),), {"size": (5, 7)}, torch=_f("interpolate")),
        C("interpolate.nearest_x2", ops.interpolate, (f32(1, 1, 3, 2),), {"scale_factor": 2}, torch=_f("interpolate")),
        C("interpolate.nearest_down", ops.interpolate, (f32(1, 1, 5, 7),), {"size": (2, 3)}, torch=_f("interpolate")),
        C("interpolate.nearest_frac", ops.interpolate, (f32(1, 1, 4, 3),), {"scale_factor": (1.5, 2.5)}, torch=_f("interpolate")),
        C("interpolate.bilinear_corners", ops.interpolate, (f32(1, 2, 4, 3),), {"size": (7, 5), "mode": "bilinear", "align_corners": True},
          torch=_f("interpolate")),
        C("interpolate.bilinear", ops.interpolate, (f32(1, 2, 4, 3),), {"size": (8, 6), "mode": "bilinear"},
          torch=lambda t, x, **k: t.nn.functional.interpolate(x, **k, align_corners=False)),
        C("interpolate.bilinear_down", ops.interpolate, (f32(1, 1, 6, 4),), {"scale_factor": 0.5, "mode": "bilinear"},
          torch=_f("interpolate")),
        # convolutions
        C("conv2d.dilation", ops.conv2d, (f32(1, 2, 6, 6), f32(3, 2, 3, 3)), {"padding": 2, "dilation": 2},
          torch=_f("conv2d")),
        C("conv2d.dilation_stride_groups", ops.conv2d, (f32(1, 4, 7, 6), f32(4, 2, 2, 3)),
          {"stride": 2, "padding": (1, 0), "groups": 2, "dilation": (2, 1)}, torch=_f("conv2d")),
        C("conv1d.bias", ops.conv1d, (f32(2, 3, 7), f32(4, 3, 3), f32(4)), torch=_f("conv1d")),
        C("conv1d.all", ops.conv1d, (f32(1, 4, 9), f32(6, 2, 3)), {"stride": 2, "padding": 2, "dilation": 2, "groups": 2},
          torch=_f("conv1d")),
        C("conv_transpose2d.plain", ops.conv_transpose2d, (f32(1, 2, 3, 3), f32(2, 3, 2, 2)), torch=_f("conv_transpose2d")),
        C("conv_transpose2d.stride_bias", ops.conv_transpose2d, (f32(2, 2, 3, 2), f32(2, 2, 3, 3), f32(2)),
          {"stride": 2, "padding": 1, "output_padding": 1}, torch=_f("conv_transpose2d")),
        C("conv_transpose2d.groups_dilation", ops.conv_transpose2d, (f32(1, 4, 3, 3), f32(4, 1, 2, 3)),
          {"groups": 2, "dilation": (2, 1), "stride": (1, 2)}, torch=_f("conv_transpose2d")),
        C("conv_transpose2d.opad_dilation", ops.conv_transpose2d, (f32(1, 1, 3, 3), f32(1, 2, 2, 2)),
          {"dilation": 2, "output_padding": 1}, torch=_f("conv_transpose2d")),
        # modules (parameters follow the inputs: weight, bias)
        C("Conv1d.pad", lambda x: nn.Conv1d(3, 4, 3, padding=1)(x), (f32(2, 3, 5),),
          torch=lambda t, x, w, b: t.nn.functional.conv1d(x, w, b, padding=1)),
        C("ConvTranspose2d.stride", lambda x: nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1, output_padding=1)(x),
          (f32(1, 2, 2, 3),), torch=lambda t, x, w, b: t.nn.functional.conv_transpose2d(x, w, b, 2, 1, 1)),
        C("Conv2d.dilation", lambda x: nn.Conv2d(2, 3, 3, padding=2, dilation=2)(x), (f32(1, 2, 5, 5),),
          torch=lambda t, x, w, b: t.nn.functional.conv2d(x, w, b, padding=2, dilation=2)),
        C("AvgPool2d.ceil", lambda x: nn.AvgPool2d(2, ceil_mode=True)(x), (f32(1, 1, 3, 5),),
          torch=lambda t, x: t.nn.AvgPool2d(2, ceil_mode=True)(x)),
        C("AdaptiveAvgPool2d.int", lambda x: nn.AdaptiveAvgPool2d(2)(x), (f32(1, 1, 5, 3),),
          torch=lambda t, x: t.nn.AdaptiveAvgPool2d(2)(x)),
        C("Upsample.bilinear", lambda x: nn.Upsample(scale_factor=2, mode="bilinear")(x), (f32(1, 1, 2, 3),),
          torch=lambda t, x: t.nn.Upsample(scale_factor=2, mode="bilinear")(x)),
    ]
