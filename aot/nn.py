"""`aot.nn`: layers with tensorgrad's parameter names and layouts (API.md §2)."""

from __future__ import annotations

from . import init as _init
from . import ops
from .module import Module
from .nn_attention import (  # noqa: F401  (re-exported)
    MultiheadAttention,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
)
from .nn_norm import BatchNorm1d, BatchNorm2d, GroupNorm, InstanceNorm1d, InstanceNorm2d, LayerNorm  # noqa: F401  (re-exported)
from .nn_linear import Linear  # noqa: F401  (re-exported)
from .nn_norm import _alias
from .ops.trace import fail


class RMSNorm(Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.g = self._torch_param("RMSNorm", "weight", (dim,), init=_init.ones())

    def forward(self, x):
        return x * ops.rsqrt(ops.mean(x * x, -1, keepdims=True) + self.eps) * self.g


class Embedding(Module):
    """Rows of W f32[num_embeddings, embedding_dim] (torch's weight) picked by i32 indices.

    padding_idx (torch's; negative counts from the end): that row starts at zeros (unless init
    is a literal, as torch keeps a given `_weight`) and gets no gradient, so training never
    changes it; its output is whatever the row holds (a loaded state_dict's value)."""

    def __init__(self, num_embeddings=None, embedding_dim=None, padding_idx=None, init=None, decay=None, *,
                 vocab=None, dim=None):  # fmt: skip
        super().__init__()
        # vocab= and dim= are the names API.md §2 gave first: still taken
        num_embeddings = _alias("Embedding", "num_embeddings", num_embeddings, "vocab", vocab)
        embedding_dim = _alias("Embedding", "embedding_dim", embedding_dim, "dim", dim)
        if padding_idx is not None:
            if not isinstance(padding_idx, int) or not -num_embeddings <= padding_idx < num_embeddings:
                fail("Embedding", f"padding_idx must be an int in [-{num_embeddings}, {num_embeddings}), got {padding_idx!r}")
            padding_idx %= num_embeddings
            init = init or _init.randn()
            if init.kind != "literal":
                rows = (padding_idx * embedding_dim, (padding_idx + 1) * embedding_dim)
                init = _init.zero_range(init, *rows)
        self.padding_idx = padding_idx
        self.W = self._torch_param("Embedding", "weight", (num_embeddings, embedding_dim), init=init, decay=decay)

    def forward(self, idx):
        out = ops.embedding(self.W, idx)
        if self.padding_idx is None:
            return out
        # positions that read the padding row pass no gradient back (torch's rule); the value is
        # the row itself either way
        keep = ops.less(idx, self.padding_idx) + ops.greater(idx, self.padding_idx)
        keep = ops.broadcast_to(ops.reshape(keep, (*idx.shape, 1)), out.shape)
        return ops.where(keep, out, ops.stop_gradient(out))


class Conv2d(Module):
    """NCHW convolution; W f32[out, in/groups, k, k] (PyTorch's layout), b f32[out]; dilation as torch's."""

    def __init__(self, in_ch: int, out_ch: int, k, stride=1, padding=0, groups: int = 1, bias: bool = True, init=None, decay=None,
                 dilation=1):
        super().__init__()
        self.stride, self.padding, self.groups, self.dilation = stride, padding, groups, dilation
        kh, kw = (k, k) if isinstance(k, int) else k
        self.W = self._torch_param("Conv2d", "weight", (out_ch, in_ch // groups, kh, kw), init=init, decay=decay)
        self.b = self._torch_param("Conv2d", "bias", (out_ch,), init=_init.zeros()) if bias else None

    def forward(self, x):
        y = ops.conv2d(x, self.W, self.stride, self.padding, self.groups, self.dilation)
        return y + ops.reshape(self.b, (-1, 1, 1)) if self.b is not None else y


def split_heads(x, n: int):
    """[..., T, D] -> [..., n, T, D/n]."""
    *lead, t, d = x.shape
    if d % n:
        from .ops.trace import fail

        fail("split_heads", f"last dim {d} of {x.type_str()} is not divisible by {n} heads")
    y = ops.reshape(x, (*lead, t, n, d // n))
    r = len(lead)
    return ops.transpose(y, tuple(range(r)) + (r + 1, r, r + 2))


def merge_heads(x):
    """[..., n, T, Dh] -> [..., T, n*Dh] (split_heads' inverse)."""
    *lead, n, t, dh = x.shape
    r = len(lead)
    y = ops.transpose(x, tuple(range(r)) + (r + 1, r, r + 2))
    return ops.reshape(y, (*lead, t, n * dh))


# the torch.nn counterparts of the spatial ops (Conv1d, ConvTranspose2d, pooling, Dropout2d, Upsample)
from .nn_conv import AdaptiveAvgPool2d, AvgPool2d, Conv1d, ConvTranspose2d, Dropout2d, Upsample  # noqa: E402,F401
# recurrent layers (LSTM, GRU, RNN and their cells)
from .nn_rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell  # noqa: E402,F401
