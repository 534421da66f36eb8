"""`aot.nn.Linear`, in a module of its own so that the other layer modules (attention's
projections) can import it without importing aot.nn, which re-exports them."""

from __future__ import annotations

from . import init as _init
from . import ops
from .module import Module


class Linear(Module):
    """y = x @ W + b with W f32[in, out] (PyTorch's weight.T) and b f32[out]."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, init=None, decay=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        # tensorgrad's default (randn 0.02), not PyTorch's uniform: keeps the ported samples comparable
        self.W = self._torch_param("Linear", "weight", (in_features, out_features), transpose=True, init=init, decay=decay)
        self.b = self._torch_param("Linear", "bias", (out_features,), init=_init.zeros()) if bias else None

    def forward(self, x):
        y = ops.matmul(x, self.W)
        return y + self.b if self.b is not None else y
