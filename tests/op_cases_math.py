"""Op-table cases (tests/op_cases.py) for the activations, reductions and losses beyond API.md §2
(aot/ops/activations.py, reductions.py, losses.py), with torch.nn.functional / torch as the oracle.

Domains keep finite differences off the kinks (clamp's bounds, hardswish's +-3, the losses'
|d| = beta); edge values (0, inf, NaN, ties, zero vectors) are checked in tests/test_math_ops.py.
Class-index losses take classes on the last axis; the torch side flattens to [N, C]. Cases that
ignore targets keep the first one counted (`_kept`), so no batch's mean is 0 / 0."""

from __future__ import annotations

import math

import numpy as np

from aot import ops
from aot.ops.api import _mul_exp, neg
def _tf(t):
    return t.nn.functional


def np_softplus(x, beta=1.0, threshold=20.0):
    return np.where(x * beta > threshold, x, np.log1p(np.exp(x * beta)) / beta)


def np_logsigmoid(x):
    return np.minimum(x, 0) - np.log1p(np.exp(-np.abs(x)))


def np_clamp(x, lo=None, hi=None):
    out = x if lo is None else np.maximum(x, lo)
    return out if hi is None else np.minimum(out, hi)


def np_class_loss(logp, t, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    c = logp.shape[-1]
    w = np.ones(c) if weight is None else weight
    keep = t != ignore_index
    safe = np.where(keep, t, 0).astype(np.int64)
    picked = np.take_along_axis(logp, safe[..., None], -1)[..., 0]
    wt = np.where(keep, w[safe], 0.0)
    loss = np.where(keep, -picked * wt, 0.0)
    if label_smoothing:
        loss = loss * (1 - label_smoothing) + np.where(keep, -(logp * w).sum(-1), 0.0) * label_smoothing / c
    if reduction == "none":
        return loss
    return loss.sum() if reduction == "sum" else loss.sum() / wt.sum()


def t_class_loss(t, logp, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0, logits=False):
    """torch's nll_loss / cross_entropy over [N, C] (the class-last input flattened)."""
    c = logp.shape[-1]
    f = _tf(t).cross_entropy if logits else _tf(t).nll_loss
    kw = {"label_smoothing": label_smoothing} if logits else {}
    out = f(logp.reshape(-1, c), target.reshape(-1).long(), weight=weight, ignore_index=ignore_index, reduction=reduction, **kw)
    return out.reshape(target.shape) if reduction == "none" else out


def np_reduce(loss, reduction):
    return {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction](loss)


def np_norm(x, p=2, axis=None, keepdims=False):
    a = np.abs(x)
    if p == np.inf:
        return a.max(axis=axis, keepdims=keepdims)
    if p == -np.inf:
        return a.min(axis=axis, keepdims=keepdims)
    if p == 0:
        return (x != 0).sum(axis=axis, keepdims=keepdims).astype(np.float64)
    return (a**p).sum(axis=axis, keepdims=keepdims) ** (1.0 / p)


def t_norm(t, x, p=2, axis=None, keepdims=False):
    return t.linalg.vector_norm(x, p, dim=axis, keepdim=keepdims)


def np_cosine(a, b, dim=1, eps=1e-8):
    a, b = np.broadcast_arrays(a, b)
    na = np.maximum(np.sqrt((a * a).sum(dim, keepdims=True)), eps)
    nb = np.maximum(np.sqrt((b * b).sum(dim, keepdims=True)), eps)
    return ((a / na) * (b / nb)).sum(dim)


def np_kl(x, t, reduction="mean", log_target=False):
    loss = np.exp(t) * (t - x) if log_target else np.where(t == 0, 0.0, t * np.log(np.where(t == 0, 1.0, t))) - t * x
    return loss.sum() / x.shape[0] if reduction == "batchmean" else np_reduce(loss, reduction)


def _bce_in(x):
    return x * 0.2 + 0.5  # (0.1, 0.9): probabilities clear of 0 and 1


def _kept(m):
    """The 0/1 mask m [n] with its first entry 1: at least one target is counted (no NaN mean)."""
    return ops.maximum(m, ops.equal(ops.arange(m.shape[0], "f32"), 0.0))


def np_kept(m):
    return np.concatenate([[1.0], m[1:]])


def _ignored(t, m, value=-100):
    return ops.where(_kept(m), t, value)  # i32 targets with `value` where the mask is 0



def np_var(x, axis=None, keepdims=False, correction=1):
    n = x.size if axis is None else np.prod([x.shape[a] for a in np.atleast_1d(axis)])
    d = x - x.mean(axis=axis, keepdims=True)
    return (d * d).sum(axis=axis, keepdims=keepdims) / max(0, n - correction)


def np_logsumexp(x, axis=None, keepdims=False):
    m = x.max(axis=axis, keepdims=True)
    out = np.log(np.exp(x - m).sum(axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def t_logsumexp(t, x, axis=None, keepdims=False):
    return t.logsumexp(x, dim=tuple(range(x.ndim)) if axis is None else axis, keepdim=keepdims)


def cases():
    from op_cases import OpCase as C, _R3, f32, i32, mask, np_log_softmax

    _R2 = (f32(3, 4),)
    _LOG = (f32(4, 5), i32(4, high=5))
    return [
        # activations (kinks at 0 or +-3 are avoided by the domains or sit where no sample falls)
        C("leaky_relu.default", ops.leaky_relu, (f32(2, 3),), domain="nonzero", ref=lambda x: np.where(x > 0, x, 0.01 * x),
          torch=lambda t, x: _tf(t).leaky_relu(x)),
        C("leaky_relu.slope", ops.leaky_relu, (f32(2, 3),), {"negative_slope": 0.2}, domain="nonzero",
          ref=lambda x, negative_slope: np.where(x > 0, x, negative_slope * x),
          torch=lambda t, x, negative_slope: _tf(t).leaky_relu(x, negative_slope)),
        C("elu.default", ops.elu, (f32(2, 3),), domain="nonzero", ref=lambda x: np.where(x > 0, x, np.expm1(x)),
          torch=lambda t, x: _tf(t).elu(x)),
        C("elu.alpha", ops.elu, (f32(2, 3),), {"alpha": 0.5}, domain="nonzero",
          ref=lambda x, alpha: np.where(x > 0, x, alpha * np.expm1(x)), torch=lambda t, x, alpha: _tf(t).elu(x, alpha)),
        C("softplus.default", ops.softplus, (f32(2, 3),), ref=np_softplus, torch=lambda t, x: _tf(t).softplus(x)),
        C("softplus.beta_threshold", ops.softplus, (f32(2, 4),), {"beta": 2.0, "threshold": 1.5}, ref=np_softplus,
          torch=lambda t, x, beta, threshold: _tf(t).softplus(x, beta, threshold)),
        C("mish.mat", ops.mish, (f32(2, 3),), ref=lambda x: x * np.tanh(np.log1p(np.exp(x))), torch=lambda t, x: _tf(t).mish(x)),
        # the private one-rounding a * exp(y) (y <= 0) under silu's, mish's and gelu's far tails
        C("mul_exp.tail", lambda a, y: _mul_exp(a, neg(y * y) - 1.0), (f32(2, 3), f32(2, 3)),
          ref=lambda a, y: a * np.exp(-(y * y) - 1.0), torch=lambda t, a, y: a * t.exp(-(y * y) - 1.0)),
        C("hardswish.scaled", lambda x: ops.hardswish(x * 3.0), (f32(2, 4),),
          ref=lambda x: 3 * x * np.clip(3 * x + 3, 0, 6) / 6, torch=lambda t, x: _tf(t).hardswish(x * 3.0)),
        C("hardsigmoid.scaled", lambda x: ops.hardsigmoid(x * 3.0), (f32(2, 4),),
          ref=lambda x: np.clip(3 * x / 6 + 0.5, 0, 1), torch=lambda t, x: _tf(t).hardsigmoid(x * 3.0)),
        C("logsigmoid.mat", ops.logsigmoid, (f32(2, 3),), ref=np_logsigmoid, torch=lambda t, x: _tf(t).logsigmoid(x)),
        C("logsigmoid.large", lambda x: ops.logsigmoid(x * 40.0), (f32(2, 3),), domain="nonzero",
          ref=lambda x: np_logsigmoid(40 * x), torch=lambda t, x: _tf(t).logsigmoid(x * 40.0)),
        C("clamp.scalars", ops.clamp, (f32(2, 4),), {"min": -0.5, "max": 1.0}, ref=lambda x, min, max: np_clamp(x, min, max),
          torch=lambda t, x, min, max: t.clamp(x, min, max)),
        C("clamp.min_only", ops.clamp, (f32(2, 3),), {"min": 0.3}, ref=lambda x, min: np_clamp(x, min),
          torch=lambda t, x, min: t.clamp(x, min=min)),
        C("clamp.max_only_int", ops.clamp, (f32(2, 3),), {"max": 1}, ref=lambda x, max: np_clamp(x, None, max),
          torch=lambda t, x, max: t.clamp(x, max=max)),
        C("clamp.tensors", lambda x, lo, hi: ops.clamp(x, lo, hi), (f32(2, 3), f32(3), f32(2, 1)), domain="distinct",
          ref=lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi), torch=lambda t, x, lo, hi: t.clamp(x, lo, hi)),
        C("clamp.inverted", lambda x: ops.clamp(x, 1.0, -1.0), (f32(2, 3),), ref=lambda x: np.full(x.shape, -1.0),
          torch=lambda t, x: t.clamp(x, 1.0, -1.0)),
        C("log1p.mat", lambda x: ops.log1p(x * 0.45), (f32(2, 3),), ref=lambda x: np.log1p(x * 0.45),
          torch=lambda t, x: t.log1p(x * 0.45)),
        C("log1p.wide", ops.log1p, (f32(2, 3),), domain="positive", ref=np.log1p, torch=lambda t, x: t.log1p(x)),
        C("log1p.tiny", lambda x: ops.log1p(x * 1e-6), (f32(2, 3),), domain="nonzero", ref=lambda x: np.log1p(x * 1e-6)),
        C("expm1.mat", ops.expm1, (f32(2, 3),), ref=np.expm1, torch=lambda t, x: t.expm1(x)),
        C("expm1.tiny", lambda x: ops.expm1(x * 1e-6), (f32(2, 3),), domain="nonzero", ref=lambda x: np.expm1(x * 1e-6)),
        # losses (class-index ones: classes on the last axis)
        C("nll_loss.mean", ops.nll_loss, _LOG, ref=np_class_loss, torch=t_class_loss),
        C("nll_loss.sum_3d", ops.nll_loss, (f32(2, 3, 4), i32(2, 3, high=4)), {"reduction": "sum"}, ref=np_class_loss,
          torch=t_class_loss),
        C("nll_loss.none", ops.nll_loss, _LOG, {"reduction": "none"}, ref=np_class_loss, torch=t_class_loss),
        C("nll_loss.weight_ignore", lambda x, t, m: ops.nll_loss(x, t, m + 0.5, ignore_index=1), (f32(6, 3), i32(6, high=3), mask(3)),
          ref=lambda x, t, m: np_class_loss(x, t, m + 0.5, 1), torch=lambda t, x, tg, m: t_class_loss(t, x, tg, m + 0.5, 1)),
        C("nll_loss.ignore_default", lambda x, t, m: ops.nll_loss(x, _ignored(t, m)), (f32(6, 4), i32(6, high=4), mask(6)),
          ref=lambda x, t, m: np_class_loss(x, np.where(np_kept(m) != 0, t, -100)),
          torch=lambda t, x, tg, m: t_class_loss(t, x, t.where(t.from_numpy(np_kept(m.numpy())) != 0, tg, -100))),
        C("nll_loss.ignore_none", lambda x, t, m: ops.nll_loss(x, _ignored(t, m, 7), ignore_index=7, reduction="none"),
          (f32(6, 4), i32(6, high=4), mask(6)), ref=lambda x, t, m: np_class_loss(x, np.where(np_kept(m) != 0, t, 7), None, 7, "none"),
          torch=lambda t, x, tg, m: t_class_loss(t, x, t.where(t.from_numpy(np_kept(m.numpy())) != 0, tg, 7), None, 7, "none")),
        C("cross_entropy.ignore_smooth", ops.cross_entropy, (f32(6, 4), i32(6, high=4)), {"ignore_index": 2, "label_smoothing": 0.1},
          ref=lambda x, t, ignore_index, label_smoothing: np_class_loss(np_log_softmax(x), t, None, ignore_index, "mean", label_smoothing),
          torch=lambda t, x, tg, ignore_index, label_smoothing: t_class_loss(t, x, tg, None, ignore_index, "mean", label_smoothing, True)),
        C("cross_entropy.weight_smooth_sum", lambda x, t, m: ops.cross_entropy(x, t, "sum", weight=m + 0.5, label_smoothing=0.2),
          (f32(2, 3, 4), i32(2, 3, high=4), mask(4)),
          ref=lambda x, t, m: np_class_loss(np_log_softmax(x), t, m + 0.5, -100, "sum", 0.2),
          torch=lambda t, x, tg, m: t_class_loss(t, x, tg, m + 0.5, -100, "sum", 0.2, True)),
        C("cross_entropy.weight_ignore_mean", lambda x, t, m, w: ops.cross_entropy(x, _ignored(t, m), weight=w + 0.5),
          (f32(5, 3), i32(5, high=3), mask(5), mask(3)),
          ref=lambda x, t, m, w: np_class_loss(np_log_softmax(x), np.where(np_kept(m) != 0, t, -100), w + 0.5),
          torch=lambda t, x, tg, m, w: t_class_loss(t, x, t.where(t.from_numpy(np_kept(m.numpy())) != 0, tg, -100), w + 0.5, logits=True)),
        C("cross_entropy.smooth_none", ops.cross_entropy, (f32(3, 5), i32(3, high=5)), {"reduction": "none", "label_smoothing": 0.3},
          ref=lambda x, t, reduction, label_smoothing: np_class_loss(np_log_softmax(x), t, None, -100, reduction, label_smoothing),
          torch=lambda t, x, tg, reduction, label_smoothing: t_class_loss(t, x, tg, None, -100, reduction, label_smoothing, True)),
        C("binary_cross_entropy.mean", lambda x, y: ops.binary_cross_entropy(_bce_in(x), _bce_in(y)), (f32(2, 3), f32(2, 3)),
          ref=lambda x, y: np.mean(-(_bce_in(y) * np.log(_bce_in(x)) + (1 - _bce_in(y)) * np.log(1 - _bce_in(x)))),
          torch=lambda t, x, y: _tf(t).binary_cross_entropy(_bce_in(x), _bce_in(y))),
        C("binary_cross_entropy.weight_sum", lambda x, m: ops.binary_cross_entropy(_bce_in(x), m, m * 2.0 + 0.5, "sum"),
          (f32(3, 2), mask(3, 2)),
          ref=lambda x, m: np.sum(-(m * 2 + 0.5) * (m * np.log(_bce_in(x)) + (1 - m) * np.log(1 - _bce_in(x)))),
          torch=lambda t, x, m: _tf(t).binary_cross_entropy(_bce_in(x), m, m * 2.0 + 0.5, reduction="sum")),
        C("binary_cross_entropy_with_logits.mean", ops.binary_cross_entropy_with_logits, (f32(2, 3), f32(2, 3)),
          ref=lambda x, y: np.mean((1 - y) * x - np_logsigmoid(x)), torch=lambda t, x, y: _tf(t).binary_cross_entropy_with_logits(x, y)),
        C("binary_cross_entropy_with_logits.pos_weight", lambda x, y, m, p: ops.binary_cross_entropy_with_logits(
            x * 10.0, y, m + 0.5, "none", pos_weight=p * 2.0 + 0.25), (f32(2, 3), f32(2, 3), mask(2, 3), mask(3)),
          ref=lambda x, y, m, p: (m + 0.5) * ((1 - y) * 10 * x - (1 + (p * 2 + 0.25 - 1) * y) * np_logsigmoid(10 * x)),
          torch=lambda t, x, y, m, p: _tf(t).binary_cross_entropy_with_logits(x * 10.0, y, m + 0.5, reduction="none",
                                                                              pos_weight=p * 2.0 + 0.25)),
        C("mse_loss.mean", ops.mse_loss, (f32(2, 3), f32(2, 3)), ref=lambda x, y: np.mean((x - y) ** 2),
          torch=lambda t, x, y: _tf(t).mse_loss(x, y)),
        C("mse_loss.sum", ops.mse_loss, (f32(2, 3), f32(2, 3)), {"reduction": "sum"},
          ref=lambda x, y, reduction: np.sum((x - y) ** 2), torch=lambda t, x, y, reduction: _tf(t).mse_loss(x, y, reduction=reduction)),
        C("l1_loss.none", ops.l1_loss, (f32(2, 3), f32(2, 3)), {"reduction": "none"}, domain="distinct",
          ref=lambda x, y, reduction: np.abs(x - y), torch=lambda t, x, y, reduction: _tf(t).l1_loss(x, y, reduction=reduction)),
        C("l1_loss.mean", ops.l1_loss, (f32(2, 3), f32(2, 3)), domain="distinct", ref=lambda x, y: np.mean(np.abs(x - y)),
          torch=lambda t, x, y: _tf(t).l1_loss(x, y)),
        C("smooth_l1_loss.default", ops.smooth_l1_loss, (f32(3, 4), f32(3, 4)), domain="distinct",
          ref=lambda x, y: np.mean(np.where(np.abs(x - y) < 1, 0.5 * (x - y) ** 2, np.abs(x - y) - 0.5)),
          torch=lambda t, x, y: _tf(t).smooth_l1_loss(x, y)),
        C("smooth_l1_loss.beta", ops.smooth_l1_loss, (f32(3, 4), f32(3, 4)), {"reduction": "sum", "beta": 0.5}, domain="distinct",
          ref=lambda x, y, reduction, beta: np.sum(np.where(np.abs(x - y) < beta, 0.5 * (x - y) ** 2 / beta, np.abs(x - y) - 0.5 * beta)),
          torch=lambda t, x, y, reduction, beta: _tf(t).smooth_l1_loss(x, y, reduction=reduction, beta=beta)),
        C("smooth_l1_loss.beta0", ops.smooth_l1_loss, (f32(2, 3), f32(2, 3)), {"beta": 0.0}, domain="distinct",
          ref=lambda x, y, beta: np.mean(np.abs(x - y)), torch=lambda t, x, y, beta: _tf(t).smooth_l1_loss(x, y, beta=beta)),
        C("huber_loss.default", ops.huber_loss, (f32(3, 4), f32(3, 4)), domain="distinct",
          ref=lambda x, y: np.mean(np.where(np.abs(x - y) < 1, 0.5 * (x - y) ** 2, np.abs(x - y) - 0.5)),
          torch=lambda t, x, y: _tf(t).huber_loss(x, y)),
        C("huber_loss.delta", ops.huber_loss, (f32(3, 4), f32(3, 4)), {"reduction": "none", "delta": 1.5}, domain="distinct",
          ref=lambda x, y, reduction, delta: np.where(np.abs(x - y) < delta, 0.5 * (x - y) ** 2, delta * (np.abs(x - y) - 0.5 * delta)),
          torch=lambda t, x, y, reduction, delta: _tf(t).huber_loss(x, y, reduction=reduction, delta=delta)),
        C("kl_div.batchmean", ops.kl_div, (f32(3, 4), f32(3, 4, domain="positive")), {"reduction": "batchmean"}, ref=np_kl,
          torch=lambda t, x, y, reduction: _tf(t).kl_div(x, y, reduction=reduction)),
        C("kl_div.zero_targets", lambda x, m: ops.kl_div(x, m * 0.7, "sum"), (f32(3, 4), mask(3, 4)),
          ref=lambda x, m: np_kl(x, m * 0.7, "sum"), torch=lambda t, x, m: _tf(t).kl_div(x, m * 0.7, reduction="sum")),
        C("kl_div.log_target_mean", ops.kl_div, (f32(2, 3), f32(2, 3)), {"log_target": True}, ref=np_kl,
          torch=lambda t, x, y, log_target: _tf(t).kl_div(x, y, log_target=log_target)),
        C("cosine_similarity.default", ops.cosine_similarity, (f32(3, 4), f32(3, 4)), ref=np_cosine,
          torch=lambda t, a, b: _tf(t).cosine_similarity(a, b)),
        C("cosine_similarity.bcast_last", ops.cosine_similarity, (f32(2, 3, 4), f32(4)), {"dim": -1}, ref=np_cosine,
          torch=lambda t, a, b, dim: _tf(t).cosine_similarity(a, b, dim)),
        C("logsumexp.all", ops.logsumexp, _R3, ref=np_logsumexp, torch=t_logsumexp),
        C("logsumexp.axis1_keep", ops.logsumexp, _R3, {"axis": 1, "keepdims": True}, ref=np_logsumexp, torch=t_logsumexp),
        C("logsumexp.large", lambda x: ops.logsumexp(x * 300.0, axis=-1), _R2, domain="distinct",
          ref=lambda x: np_logsumexp(x * 300.0, -1), torch=lambda t, x: t.logsumexp(x * 300.0, -1)),
        C("logsumexp.dim", lambda x: ops.logsumexp(x, dim=(0, 2), keepdim=True), _R3, ref=lambda x: np_logsumexp(x, (0, 2), True),
          torch=lambda t, x: t.logsumexp(x, (0, 2), keepdim=True)),
        C("var.all", ops.var, _R2, ref=np_var, torch=lambda t, x: t.var(x)),
        C("var.axis_keep", ops.var, _R3, {"axis": 1, "keepdims": True}, ref=np_var,
          torch=lambda t, x, axis, keepdims: t.var(x, axis, keepdim=keepdims)),
        C("var.correction0_dim", lambda x: ops.var(x, dim=-1, correction=0), _R2, ref=lambda x: np_var(x, -1, correction=0),
          torch=lambda t, x: t.var(x, -1, correction=0)),
        C("std.axis", ops.std, _R3, {"axis": (0, 2)}, ref=lambda x, axis: np.sqrt(np_var(x, axis)),
          torch=lambda t, x, axis: t.std(x, axis)),
        C("std.all_correction0", lambda x: ops.std(x, correction=0), _R2, ref=lambda x: np.sqrt(np_var(x, correction=0)),
          torch=lambda t, x: t.std(x, correction=0)),
        C("min.all", ops.min, _R3, domain="distinct", ref=np.min, torch=lambda t, x: t.amin(x)),
        C("min.axis1", ops.min, _R3, {"axis": 1}, domain="distinct", ref=np.min, torch=lambda t, x, axis: t.amin(x, axis)),
        C("min.tuple_keep", ops.min, _R3, {"axis": (0, -1), "keepdims": True}, domain="distinct", ref=np.min,
          torch=lambda t, x, axis, keepdims: t.amin(x, axis, keepdims)),
        C("prod.all", ops.prod, (f32(2, 3),), ref=np.prod, torch=lambda t, x: t.prod(x)),
        C("prod.axis_odd", ops.prod, (f32(2, 7),), {"axis": 1}, ref=np.prod, torch=lambda t, x, axis: t.prod(x, axis)),
        C("prod.tuple_keep", ops.prod, _R3, {"axis": (0, 2), "keepdims": True}, ref=np.prod),
        C("prod.zeros", lambda x, m: ops.prod(x * m, axis=0), (f32(5, 3), mask(5, 3)), ref=lambda x, m: np.prod(x * m, 0),
          torch=lambda t, x, m: t.prod(x * m, 0)),
        C("cumsum.axis0", ops.cumsum, (f32(5, 3),), {"axis": 0}, ref=np.cumsum, torch=lambda t, x, axis: t.cumsum(x, axis)),
        C("cumsum.last", ops.cumsum, (f32(2, 9),), {"axis": -1}, ref=np.cumsum, torch=lambda t, x, axis: t.cumsum(x, axis)),
        C("cumsum.dim_mid", lambda x: ops.cumsum(x, dim=1), _R3, ref=lambda x: np.cumsum(x, 1), torch=lambda t, x: t.cumsum(x, 1)),
        C("norm.p2_all", ops.norm, _R3, ref=np_norm, torch=t_norm),
        C("norm.p2_axis", ops.norm, _R3, {"axis": -1, "keepdims": True}, ref=np_norm, torch=t_norm),
        C("norm.p1", ops.norm, _R2, {"p": 1, "axis": 1}, domain="nonzero", ref=np_norm, torch=t_norm),
        C("norm.inf", ops.norm, _R3, {"p": math.inf, "axis": (0, 1)}, domain="distinct", ref=np_norm, torch=t_norm),
        C("norm.neg_inf", ops.norm, _R2, {"p": -math.inf, "axis": 0}, domain="distinct", ref=np_norm, torch=t_norm),
        C("norm.p3", ops.norm, _R2, {"p": 3, "axis": -1}, domain="nonzero", ref=np_norm, torch=t_norm),
        C("norm.half", ops.norm, _R2, {"p": 0.5}, domain="nonzero", ref=np_norm, torch=t_norm),
        C("norm.p0", ops.norm, _R2, {"p": 0, "axis": 1}, ref=np_norm, torch=t_norm),
    ]
