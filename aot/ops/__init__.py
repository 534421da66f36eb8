"""`aot.ops`: the public op set (API.md §2) and the primitives behind it.

- api.py: the public functions (checks, explicit broadcasting, composites);
- registry.py: one OpDef per primitive, every fact a stage needs (shape rule, NumPy reference,
  VJP, fusion class, recompute cost, view rule, index bound, WGSL rendering);
- attention, conv, elementwise, index, layout, leaves, linalg, recurrent, reduce: the primitives, registered on import;
- exact.py: select_sum, the gradient of gathers (embedding, take_along_axis);
- spatial.py (pad's torch form, pooling, interpolate, dropout2d), convs.py (conv1d,
  conv_transpose2d), indexing.py (Tensor.__getitem__ and its strided `slice` primitive);
- activations.py, reductions.py, losses.py: torch.nn.functional's activations, reductions and
  losses (cross_entropy among them), re-exported here;
- trace.py: appends nodes to the graph being traced.

Importing this package also gives `Tensor` its operators: the IR (aot/ir.py) knows nothing of
ops, the op set installs itself on it from above (as JAX does), so there is no import cycle.
"""

from __future__ import annotations

from ..ir import Tensor as _Tensor
from . import attention, conv, elementwise, index, layout, leaves, linalg, recurrent, reduce  # noqa: F401  (register the primitives)
from .api import *  # noqa: F401,F403  (the public functions)
from .creation import *  # noqa: F401,F403  (full, zeros, ones and their *_like forms)
from .activations import *  # noqa: F401,F403  (activations and elementwise math beyond API.md §2)
from .reductions import *  # noqa: F401,F403  (reductions beyond API.md §2)
from .losses import *  # noqa: F401,F403  (losses; cross_entropy among them)
from .api import add, div, greater, less, matmul, mul, neg, power, sub
from .convs import conv1d, conv_transpose2d  # noqa: F401
from .indexing import getitem
from .spatial import adaptive_avg_pool2d, avg_pool2d, dropout2d, interpolate, pad  # noqa: F401  (pad: both call forms)


def _install_operators(T) -> None:
    """Tensor's arithmetic and comparison operators (API.md §2) call the public ops."""
    T.__add__ = lambda a, b: add(a, b)
    T.__radd__ = lambda a, b: add(b, a)
    T.__sub__ = lambda a, b: sub(a, b)
    T.__rsub__ = lambda a, b: sub(b, a)
    T.__mul__ = lambda a, b: mul(a, b)
    T.__rmul__ = lambda a, b: mul(b, a)
    T.__truediv__ = lambda a, b: div(a, b)
    T.__rtruediv__ = lambda a, b: div(b, a)
    T.__matmul__ = lambda a, b: matmul(a, b)
    T.__rmatmul__ = lambda a, b: matmul(b, a)
    T.__pow__ = lambda a, b: power(a, b)
    T.__rpow__ = lambda a, b: power(b, a)
    T.__neg__ = lambda a: neg(a)
    T.__lt__ = lambda a, b: less(a, b)
    T.__gt__ = lambda a, b: greater(a, b)
    T.__getitem__ = lambda x, key: getitem(x, key)


_install_operators(_Tensor)
