"""`aot.nn` modules for the spatial ops (API.md §7), re-exported by aot.nn: constructor
arguments, defaults and parameter names/layouts as torch.nn's, so the generated package's
load_state_dict/state_dict map them (`weight`, `bias` via _torch_param)."""

from __future__ import annotations

from . import init as _init
from . import ops
from .module import Module


def _k(v, n):
    return (int(v),) * n if isinstance(v, int) else tuple(int(i) for i in v)


class Conv1d(Module):
    """NCL convolution: W f32[out, in/groups, k] (PyTorch's weight), b f32[out]."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, init=None, decay=None):
        super().__init__()
        (k,) = _k(kernel_size, 1)
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self.W = self._torch_param("Conv1d", "weight", (out_channels, in_channels // groups, k), init=init, decay=decay)
        self.b = self._torch_param("Conv1d", "bias", (out_channels,), init=_init.zeros()) if bias else None

    def forward(self, x):
        return ops.conv1d(x, self.W, self.b, self.stride, self.padding, self.dilation, self.groups)


class ConvTranspose2d(Module):
    """Transposed NCHW convolution: W f32[in, out/groups, kh, kw] (PyTorch's weight), b f32[out]."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, output_padding=0,
                 groups: int = 1, bias: bool = True, dilation=1, init=None, decay=None):
        super().__init__()
        kh, kw = _k(kernel_size, 2)
        self.stride, self.padding, self.output_padding = stride, padding, output_padding
        self.groups, self.dilation = groups, dilation
        self.W = self._torch_param("ConvTranspose2d", "weight", (in_channels, out_channels // groups, kh, kw), init=init, decay=decay)
        self.b = self._torch_param("ConvTranspose2d", "bias", (out_channels,), init=_init.zeros()) if bias else None

    def forward(self, x):
        return ops.conv_transpose2d(x, self.W, self.b, self.stride, self.padding, self.output_padding, self.groups, self.dilation)


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override=None):
        super().__init__()
        self.args = (kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)

    def forward(self, x):
        return ops.avg_pool2d(x, *self.args)


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        super().__init__()
        self.output_size = output_size

    def forward(self, x):
        return ops.adaptive_avg_pool2d(x, self.output_size)


class Dropout2d(Module):
    """Zeroes whole channels with probability p in training entries; the identity in Infer ones."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        self.p = p

    def forward(self, x):
        return ops.dropout2d(x, self.p)


class Upsample(Module):
    def __init__(self, size=None, scale_factor=None, mode: str = "nearest", align_corners=None, recompute_scale_factor=None):
        super().__init__()
        self.args = (size, scale_factor, mode, align_corners, recompute_scale_factor)

    def forward(self, x):
        return ops.interpolate(x, *self.args)
