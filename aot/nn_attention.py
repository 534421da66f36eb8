"""torch.nn's MultiheadAttention and Transformer layers, with its parameter names and masks.

Weights are stored as aot's Linear stores them, [in, out] (torch's weight transposed; the
package's state_dict/load_state_dict transpose them back), so a projection is one plain matmul.
Attention runs in the fused kernel (ops.attention: no L x S score tensor) when nothing asks for
the scores: no attn_mask or key_padding_mask (is_causal is the kernel's own mask), no dropout on
the weights (dropout=0, or an infer entry) and need_weights=False. Otherwise the explicit path computes the scores, adds or
applies the masks and takes a softmax, as torch's own explicit path does.

Masks: an i32 mask is torch's bool mask (nonzero: this key may not be attended to); an f32 mask
is added to the scores (torch's float mask). A masked score is set to -1e30, not -inf, so a row
whose keys are all masked averages all values instead of giving NaN as torch does.
"""

from __future__ import annotations

import math

from . import init as _init
from . import ops
from .module import Module
from .nn_linear import Linear
from .nn_norm import LayerNorm
from .ops.trace import fail, is_training

NEG = -1e30


def _xavier(fan_in: int, fan_out: int):
    # normal with xavier_uniform's variance (torch's in_proj init): 2 / (fan_in + fan_out)
    return _init.randn(math.sqrt(2.0 / (fan_in + fan_out)))


def _linear(x, w, b):
    y = ops.matmul(x, w)
    return y + b if b is not None else y


def _is_tensor(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "type_str")


def _heads(x, n: int):
    """[B, T, E] -> [B, n, T, E/n]."""
    b, t, e = x.shape
    return ops.transpose(ops.reshape(x, (b, t, n, e // n)), (0, 2, 1, 3))


def _mask_scores(op, scores, mask, want, to4d):
    """scores with `mask` applied: i32 (bool) masks set masked scores to NEG, f32 masks add."""
    if not _is_tensor(mask):
        fail(op, f"a mask must be a Tensor (i32: torch's bool mask, f32: added to the scores), got {type(mask).__name__}")
    if tuple(mask.shape) not in want:
        shapes = " or ".join(str(list(s)) for s in want)
        fail(op, f"expected a mask of shape {shapes}, got {mask.type_str()}")
    m = ops.broadcast_to(to4d(mask), scores.shape)
    if mask.dtype == "i32":
        nonzero = ops.less(m, 0) + ops.greater(m, 0)
        return ops.where(nonzero, NEG, scores)
    return scores + m


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, add_bias_kv=False,
    add_zero_attn=False, kdim=None, vdim=None, batch_first=False). Parameters (torch names):
    in_proj_weight [3E, E] and in_proj_bias [3E] (or q_proj_weight, k_proj_weight [E, kdim],
    v_proj_weight [E, vdim] when kdim/vdim differ from E), out_proj.weight [E, E], out_proj.bias."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
    ):
        super().__init__()

        if embed_dim <= 0 or num_heads <= 0 or embed_dim % num_heads:
            fail("MultiheadAttention", f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        if add_bias_kv or add_zero_attn:
            fail("MultiheadAttention", "add_bias_kv and add_zero_attn are not supported")
        if not 0.0 <= dropout < 1.0:
            fail("MultiheadAttention", f"dropout must be in [0, 1), got {dropout}")
        E = self.embed_dim = int(embed_dim)
        self.num_heads, self.dropout, self.batch_first = int(num_heads), float(dropout), bool(batch_first)
        self.kdim, self.vdim = kdim or E, vdim or E
        kind = "MultiheadAttention"
        if self.kdim == E and self.vdim == E:
            self.in_proj_W = self._torch_param(kind, "in_proj_weight", (E, 3 * E), transpose=True, init=_xavier(E, 3 * E))
            self.q_proj_W = self.k_proj_W = self.v_proj_W = None
        else:
            self.in_proj_W = None
            self.q_proj_W = self._torch_param(kind, "q_proj_weight", (E, E), transpose=True, init=_xavier(E, E))
            self.k_proj_W = self._torch_param(kind, "k_proj_weight", (self.kdim, E), transpose=True, init=_xavier(self.kdim, E))
            self.v_proj_W = self._torch_param(kind, "v_proj_weight", (self.vdim, E), transpose=True, init=_xavier(self.vdim, E))
        self.in_proj_bias = self._torch_param(kind, "in_proj_bias", (3 * E,), init=_init.zeros()) if bias else None
        self.out_proj = Linear(E, E, bias=bias, init=_init.kaiming(1.0 / math.sqrt(3.0)))

    def _project(self, query, key, value):
        E = self.embed_dim
        if self.in_proj_bias is not None:
            bq, bk, bv = ops.split(self.in_proj_bias, [E, E, E])
        else:
            bq = bk = bv = None
        if self.in_proj_W is None:
            return (_linear(query, self.q_proj_W, bq), _linear(key, self.k_proj_W, bk), _linear(value, self.v_proj_W, bv))
        if query is key and key is value:  # self-attention: one [E, 3E] product
            return ops.split(_linear(query, self.in_proj_W, self.in_proj_bias), [E, E, E], axis=-1)
        wq, wk, wv = ops.split(self.in_proj_W, [E, E, E], axis=1)
        return _linear(query, wq, bq), _linear(key, wk, bk), _linear(value, wv, bv)

    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        need_weights: bool = True,
        attn_mask=None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ):
        """(output, weights) as torch's: output like query ([L, N, E], [N, L, E] with batch_first,
        or unbatched [L, E]); weights [N, L, S] averaged over heads ([N, H, L, S] with
        average_attn_weights=False; no N when unbatched), or None when need_weights=False."""
        op = "MultiheadAttention"
        for name, x, d in (("query", query, self.embed_dim), ("key", key, self.kdim), ("value", value, self.vdim)):
            if not _is_tensor(x):
                fail(op, f"{name} must be a Tensor, got {type(x).__name__}")
            if x.dtype != "f32" or x.ndim not in (2, 3) or x.shape[-1] != d:
                fail(op, f"{name} must be f32 [L, N, {d}], [N, L, {d}] (batch_first) or [L, {d}], got {x.type_str()}")
        if not query.ndim == key.ndim == value.ndim:
            fail(op, f"query, key and value must all be batched or all unbatched, got {query.type_str()}, "
                 f"{key.type_str()} and {value.type_str()}")  # fmt: skip
        batched = query.ndim == 3
        same = query is key, key is value
        # to [N, T, E]
        if not batched:
            query, key, value = (ops.reshape(x, (1, *x.shape)) for x in (query, key, value))
        elif not self.batch_first:
            query, key, value = (ops.swapaxes(x, 0, 1) for x in (query, key, value))
        if same[0] and same[1]:  # keep self-attention recognizable after the reshapes
            key = value = query
        n, L, S = query.shape[0], query.shape[1], key.shape[1]
        if key.shape[:2] != value.shape[:2] or key.shape[0] != n:
            fail(op, f"key and value need the query's batch and one length, got key {key.type_str()} and value "
                 f"{value.type_str()} for query {query.type_str()} (as [N, T, E])")  # fmt: skip
        q, k, v = (_heads(x, self.num_heads) for x in self._project(query, key, value))
        H = self.num_heads
        p_drop = self.dropout if is_training() else 0.0  # an infer entry is torch's eval mode
        fused = key_padding_mask is None and attn_mask is None and not need_weights and p_drop == 0.0
        if is_causal and attn_mask is not None and key_padding_mask is None and not need_weights:
            fused, attn_mask = p_drop == 0.0, None  # torch uses the hint as SDPA's is_causal here
        weights = None
        if fused:
            o = ops.attention(q, k, v, causal=bool(is_causal))
        else:
            scores = ops.matmul(q, ops.swapaxes(k, -1, -2)) * (1.0 / math.sqrt(self.embed_dim // H))
            if attn_mask is not None:
                want = [(L, S), (n * H, L, S)] if batched else [(L, S), (H, L, S)]
                scores = _mask_scores(op + " attn_mask", scores, attn_mask, want, lambda m: ops.reshape(m, (-1 if m.ndim == 3 else 1, H if m.ndim == 3 else 1, L, S)))
            elif is_causal:
                scores = _mask_scores(op, scores, _causal(L, S), [(L, S)], lambda m: ops.reshape(m, (1, 1, L, S)))
            if key_padding_mask is not None:
                want = [(n, S)] if batched else [(S,)]
                scores = _mask_scores(
                    op + " key_padding_mask", scores, key_padding_mask, want, lambda m: ops.reshape(m, (n, 1, 1, S))
                )
            p = ops.dropout(ops.softmax(scores, -1), p_drop) if p_drop else ops.softmax(scores, -1)
            o = ops.matmul(p, v)
            if need_weights:
                weights = ops.mean(p, 1) if average_attn_weights else p
                if not batched:
                    weights = ops.reshape(weights, weights.shape[1:])
        out = self.out_proj(ops.reshape(ops.transpose(o, (0, 2, 1, 3)), (n, L, self.embed_dim)))
        if not batched:
            out = ops.reshape(out, (L, self.embed_dim))
        elif not self.batch_first:
            out = ops.swapaxes(out, 0, 1)
        return out, weights


def _causal(L: int, S: int):
    """i32 [L, S]: 1 where key j > query i (top-left aligned, as torch's is_causal)."""
    rows = ops.broadcast_to(ops.reshape(ops.arange(L), (L, 1)), (L, S))
    cols = ops.broadcast_to(ops.reshape(ops.arange(S), (1, S)), (L, S))
    return ops.cast(ops.greater(cols, rows), "i32")


def _activation(op: str, activation):
    if callable(activation):
        return activation
    acts = {"relu": ops.relu, "gelu": ops.gelu}
    if activation not in acts:
        fail(op, f"activation must be 'relu', 'gelu' or a function, got {activation!r}")
    return acts[activation]


def _drop(x, p: float):
    return ops.dropout(x, p) if p else x


class _TransformerLayer(Module):
    """What torch's encoder and decoder layers share: self_attn, linear1, linear2 and `norms`
    LayerNorms named norm1, norm2, ... (torch's names); dropout acts in training entries only."""

    n_norms = 2

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation="relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
    ):
        super().__init__()

        # kept off the module tree, so TransformerEncoder can build more layers like this one
        args = dict(d_model=d_model, nhead=nhead, dim_feedforward=dim_feedforward, dropout=dropout,
                    activation=activation, layer_norm_eps=layer_norm_eps, batch_first=batch_first,
                    norm_first=norm_first, bias=bias)  # fmt: skip
        object.__setattr__(self, "_args", args)
        self.activation = _activation(type(self).__name__, activation)
        self.dropout, self.norm_first = float(dropout), bool(norm_first)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
        if self.n_norms == 3:
            self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
        # torch's Linear init has kaiming_uniform(a=sqrt(5))'s variance: 1 / (3 fan_in)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, init=_init.kaiming(1.0 / math.sqrt(3.0)))
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, init=_init.kaiming(1.0 / math.sqrt(3.0)))
        for i in range(1, self.n_norms + 1):
            setattr(self, f"norm{i}", LayerNorm(d_model, eps=layer_norm_eps, bias=bias))

    def _sa(self, x, mask, kpm, is_causal):
        y = self.self_attn(x, x, x, attn_mask=mask, key_padding_mask=kpm, need_weights=False, is_causal=is_causal)[0]
        return _drop(y, self.dropout)

    def _ff(self, x):
        y = self.linear2(_drop(self.activation(self.linear1(x)), self.dropout))
        return _drop(y, self.dropout)


class TransformerEncoderLayer(_TransformerLayer):
    """torch.nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=2048, dropout=0.1,
    activation="relu", layer_norm_eps=1e-5, batch_first=False, norm_first=False, bias=True)."""

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        x = src
        if self.norm_first:
            x = x + self._sa(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff(self.norm2(x))
        x = self.norm1(x + self._sa(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff(x))


class TransformerDecoderLayer(_TransformerLayer):
    """torch.nn.TransformerDecoderLayer (the encoder layer's arguments): self_attn, multihead_attn
    over the memory, linear1, linear2, norm1, norm2, norm3."""

    n_norms = 3

    def _mha(self, x, mem, mask, kpm, is_causal):
        y = self.multihead_attn(x, mem, mem, attn_mask=mask, key_padding_mask=kpm, need_weights=False,
                                is_causal=is_causal)[0]  # fmt: skip
        return _drop(y, self.dropout)

    def forward(
        self,
        tgt,
        memory,
        tgt_mask=None,
        memory_mask=None,
        tgt_key_padding_mask=None,
        memory_key_padding_mask=None,
        tgt_is_causal: bool = False,
        memory_is_causal: bool = False,
    ):
        x = tgt
        if self.norm_first:
            x = x + self._sa(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha(self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            return x + self._ff(self.norm3(x))
        x = self.norm1(x + self._sa(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
        x = self.norm2(x + self._mha(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal))
        return self.norm3(x + self._ff(x))


def _stack(op: str, arg: str, layer, cls, num_layers: int) -> list:
    """`layer` followed by num_layers - 1 new layers built with its arguments (their own initial
    parameters, where torch's stacks deep-copy the first)."""
    if not isinstance(layer, cls):
        fail(op, f"{arg} must be an nn.{cls.__name__}, got {type(layer).__name__}")
    if num_layers < 1:
        fail(op, f"num_layers must be at least 1, got {num_layers}")
    return [layer] + [cls(**layer._args) for _ in range(num_layers - 1)]


class TransformerEncoder(Module):
    """torch.nn.TransformerEncoder(encoder_layer, num_layers, norm=None): `layers.0` is the given
    layer, `layers.1...` new layers built with its arguments (their own initial parameters, where
    torch's are copies of the first: load a state_dict to start from torch's), then `norm`."""

    def __init__(self, encoder_layer, num_layers: int, norm=None, enable_nested_tensor: bool = True, mask_check: bool = True):
        super().__init__()  # enable_nested_tensor and mask_check are torch's fast-path switches: nothing here
        self.layers = _stack("TransformerEncoder", "encoder_layer", encoder_layer, TransformerEncoderLayer, num_layers)
        self.norm = norm

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal: bool = False):
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        return self.norm(x) if self.norm is not None else x


class TransformerDecoder(Module):
    """torch.nn.TransformerDecoder(decoder_layer, num_layers, norm=None): `layers.0` is the given
    layer, `layers.1...` new layers with its arguments (as TransformerEncoder), then `norm`."""

    def __init__(self, decoder_layer, num_layers: int, norm=None):
        super().__init__()
        self.layers = _stack("TransformerDecoder", "decoder_layer", decoder_layer, TransformerDecoderLayer, num_layers)
        self.norm = norm

    def forward(
        self,
        tgt,
        memory,
        tgt_mask=None,
        memory_mask=None,
        tgt_key_padding_mask=None,
        memory_key_padding_mask=None,
        tgt_is_causal: bool = False,
        memory_is_causal: bool = False,
    ):
        x = tgt
        for layer in self.layers:
            x = layer(x, memory, tgt_mask, memory_mask, tgt_key_padding_mask, memory_key_padding_mask,
                      tgt_is_causal, memory_is_causal)  # fmt: skip
        return self.norm(x) if self.norm is not None else x
