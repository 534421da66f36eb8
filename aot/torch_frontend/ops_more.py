"""More core-ATen mappings, for the public models of tests/torch_models.py (ViT, MLP-Mixer, a
minDiffusion U-Net, word_language_model, a char GRU). Registered into ops_map.TABLE after ops_nn
and ops_shape (same conventions: see ops_map.py); an entry here that takes over an ATen op they
map hands the cases it does not add back to their function.

- integer index tensors with negative entries (x[:, torch.tensor([-1, 0])]) wrapped as torch does.
- attention dropout in training (nn.MultiheadAttention(dropout=p), SDPA's dropout_p).
- export_patches(): torch functions that read tensor values while export traces, answered
  without them where the answer cannot change the math (nn.Transformer's causal-mask check).
"""

from __future__ import annotations

import contextlib
import math

from .. import ops
from . import ops_nn, ops_shape  # noqa: F401  (their entries first: the one below wraps theirs)
from .ops_map import F32_MAX, TABLE, aten, f32, is_t, num

_sdpa_plain = TABLE["aten.scaled_dot_product_attention.default"]
_index_plain = TABLE["aten.index.Tensor"]


def _wrap_negative(i, n: int):
    """torch's negative indices count from the end: i + n where i < 0 (in f32, exact below 2**24)."""
    fi = ops.cast(i, "f32")
    return ops.cast(fi + ops.less(fi, 0.0) * float(n), "i32")


def _reads_input(t) -> bool:
    """Whether an aot tensor is computed from an entry point's input (not only constants)."""
    seen, stack = set(), [t]
    while stack:
        node = stack.pop().node
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if node.op == "input":
            return True
        stack.extend(node.inputs)
    return False


@aten("index.Tensor", "_unsafe_index.Tensor")
def _index(cx, x, indices):
    """x[..., idx, ...] with idx < 0 counting from the end, as in torch; then ops_shape's mapping.
    An index read from an input is left as it is: the runtime checks those against [0, n) before
    a step (pipeline.index_bounds), which arithmetic on the way would hide."""
    indices = [_wrap_negative(i, x.shape[a]) if is_t(i) and i.dtype == "i32" and not _reads_input(i) else i
               for a, i in enumerate(indices)]
    return _index_plain(cx, x, indices)


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
