"""Fused attention: O = softmax(q k^T * scale) v over the last two axes, with its own kernels.

q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv] (equal leading dims: ops.attention broadcasts
them first, as views) -> O [..., Tq, dv]. `causal` masks key j for query i when j > i, aligned
top-left (torch's `is_causal`: tril(ones(Tq, Tk))), so every query sees key 0 and no row is
empty. No T x T tensor is ever stored: the forward kernel walks key tiles with an online
softmax, and the backward recomputes the probabilities from the per-row logsumexp.

Primitives (fusion class "attention": each is a kernel of aot/attention_codegen.py):
  attention      (q, k, v)                  -> O   [..., Tq, dv]
  attention_lse  (q, k, v)                  -> lse [..., Tq]  logsumexp of each scaled score row;
                 its kernel is attention's (OpDef.sibling): one pass writes O and lse
  attention_dq    (q, k, v, dO, lse, O)      -> dq    [..., Tq, d]
  attention_delta (q, k, v, dO, lse, O)      -> delta [..., Tq]  rowsum(dO * O)
  attention_dk    (q, k, v, dO, lse, delta)  -> dk    [..., Tk, d]
  attention_dv    (q, k, dO, lse)            -> dv    [..., Tk, dv]
With P = exp(S - lse) (S the masked, scaled scores) and dS = P * (dO v^T - delta):
  dq = scale * dS k,  dk = scale * dS^T q,  dv = P^T dO.
The dq kernel computes delta from the dO and O rows it owns (no reduction of its own) and
writes it for dk where both are wanted (OpDef.sibling "attention_queries"); dk and dv share a
kernel (OpDef.sibling "attention_keys": dv reads a subset of dk's inputs): one walk over the
queries computes P once for both, and the dO rows it reads for dS feed dv.
The backward primitives are nondiff: aot differentiates once, so nothing asks for their VJP.
"""

from __future__ import annotations

import numpy as np

from .registry import Bad, OpDef, register
from .trace import emit

MAX_HEAD = 256  # d and dv: a kernel thread keeps up to three rows of this length in registers


def _check_rows(name, x, lead=None):
    s, dt = x
    if dt != "f32":
        raise Bad(f"{name} must be f32, got {dt}", "use ops.cast(x, 'f32') first")
    if len(s) < 2:
        raise Bad(f"{name} needs at least 2 dims [..., T, d], got rank {len(s)}")
    if lead is not None and tuple(s[:-2]) != tuple(lead):
        raise Bad(f"leading dims differ: {list(lead)} vs {list(s[:-2])} for {name}")
    return tuple(s)


def _qkv(q, k, v):
    sq = _check_rows("q", q)
    sk = _check_rows("k", k, sq[:-2])
    sv = _check_rows("v", v, sq[:-2])
    if sq[-1] != sk[-1]:
        raise Bad(f"q and k need the same head size (last dim), got {sq[-1]} and {sk[-1]}")
    if sk[-2] != sv[-2]:
        raise Bad(f"k and v need the same number of keys (dim -2), got {sk[-2]} and {sv[-2]}")
    for what, n in (("Tq", sq[-2]), ("Tk", sk[-2]), ("d", sq[-1]), ("dv", sv[-1])):
        if n < 1:
            raise Bad(f"{what} must be at least 1, got {n}")
    if max(sq[-1], sv[-1]) > MAX_HEAD:
        raise Bad(
            f"head size {max(sq[-1], sv[-1])} is larger than the fused kernel holds ({MAX_HEAD})",
            "compose it instead: ops.softmax(q @ ops.swapaxes(k, -1, -2) * scale) @ v",
        )
    return sq, sk, sv


def _rows(name, x, shape):
    s, dt = x
    if dt != "f32" or tuple(s) != tuple(shape):
        raise Bad(f"{name} must be f32{list(shape)}, got {dt}{list(s)}")


def _attention_shape(q, k, v, causal, scale):
    sq, _, sv = _qkv(q, k, v)
    return sq[:-1] + (sv[-1],), "f32"


def _lse_shape(q, k, v, causal, scale):
    sq, _, _ = _qkv(q, k, v)
    return sq[:-1], "f32"


def _dk_shape(q, k, v, do, lse, delta, causal, scale):
    sq, sk, sv = _qkv(q, k, v)
    _rows("dO", do, sq[:-1] + (sv[-1],))
    _rows("lse", lse, sq[:-1])
    _rows("delta", delta, sq[:-1])
    return sk, "f32"


def _queries_shape(which):
    def rule(q, k, v, do, lse, o, causal, scale):
        sq, _, sv = _qkv(q, k, v)
        _rows("dO", do, sq[:-1] + (sv[-1],))
        _rows("lse", lse, sq[:-1])
        _rows("O", o, sq[:-1] + (sv[-1],))
        return (sq if which == "dq" else sq[:-1]), "f32"

    return rule


def _dv_shape(q, k, do, lse, causal, scale):
    sq = _check_rows("q", q)
    sk = _check_rows("k", k, sq[:-2])
    sd = _check_rows("dO", do, sq[:-2])
    if sq[-1] != sk[-1] or sd[-2] != sq[-2]:
        raise Bad(f"q {list(sq)}, k {list(sk)} and dO {list(sd)} do not fit together")
    _rows("lse", lse, sq[:-1])
    return sk[:-1] + (sd[-1],), "f32"


# ---- NumPy semantics (the interpreter; float64 when it runs in float64) ------------------------


def _probs(q, k, causal, scale, lse=None):
    """P = softmax of the scaled, masked scores, or exp(S - lse) given the logsumexp."""
    s = np.matmul(q, np.swapaxes(k, -1, -2)) * np.asarray(scale, q.dtype)
    if causal:
        tq, tk = s.shape[-2:]
        s = np.where(np.arange(tk)[None, :] > np.arange(tq)[:, None], -np.inf, s)
    if lse is None:
        m = s.max(-1, keepdims=True)
        lse = (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0]
    return np.exp(s - lse[..., None]), lse


def _attention_ref(q, k, v, causal, scale):
    return np.matmul(_probs(q, k, causal, scale)[0], v)


def _lse_ref(q, k, v, causal, scale):
    return _probs(q, k, causal, scale)[1]


def _ds(q, k, v, do, lse, delta, causal, scale):
    p, _ = _probs(q, k, causal, scale, lse)
    return p * (np.matmul(do, np.swapaxes(v, -1, -2)) - delta[..., None])


def _delta_ref(q, k, v, do, lse, o, causal, scale):
    return (do * o).sum(-1)


def _dq_ref(q, k, v, do, lse, o, causal, scale):
    delta = _delta_ref(q, k, v, do, lse, o, causal, scale)
    return np.matmul(_ds(q, k, v, do, lse, delta, causal, scale), k) * np.asarray(scale, q.dtype)


def _dk_ref(q, k, v, do, lse, delta, causal, scale):
    return np.matmul(np.swapaxes(_ds(q, k, v, do, lse, delta, causal, scale), -1, -2), q) * np.asarray(scale, q.dtype)


def _dv_ref(q, k, do, lse, causal, scale):
    p, _ = _probs(q, k, causal, scale, lse)
    return np.matmul(np.swapaxes(p, -1, -2), do)


def _attention_vjp(ct, n):
    q, k, v = n.inputs
    a = n.attrs
    lse = emit("attention_lse", (q, k, v), **a)
    # the first of each pair heads the kernel the second joins (schedule._merge_attention): delta
    # with dq (the same inputs), dv with dk (a subset of its inputs)
    dq = emit("attention_dq", (q, k, v, ct, lse, n.out), **a)
    delta = emit("attention_delta", (q, k, v, ct, lse, n.out), **a)
    dk = emit("attention_dk", (q, k, v, ct, lse, delta), **a)
    dv = emit("attention_dv", (q, k, ct, lse), **a)
    return dq, dk, dv


register(OpDef("attention", _attention_shape, _attention_ref, _attention_vjp, "attention", sibling="attention"))
register(OpDef("attention_lse", _lse_shape, _lse_ref, None, "attention", nondiff=True, sibling="attention"))
register(OpDef("attention_dq", _queries_shape("dq"), _dq_ref, None, "attention", nondiff=True, sibling="attention_queries"))
register(OpDef("attention_delta", _queries_shape("delta"), _delta_ref, None, "attention", nondiff=True, sibling="attention_queries"))
register(OpDef("attention_dk", _dk_shape, _dk_ref, None, "attention", nondiff=True, sibling="attention_keys"))
register(OpDef("attention_dv", _dv_shape, _dv_ref, None, "attention", nondiff=True, sibling="attention_keys"))
