"""The differential fuzzer's torch.nn modules (tests/fuzz_graphs.py, op "nnmod"): GroupNorm,
InstanceNorm1d/2d, LayerNorm over several dims, BatchNorm1d/2d (with running statistics),
Embedding(padding_idx), MultiheadAttention (fused, weights, cross, masked and causal paths), LSTM,
GRU, RNN and a tiny TransformerEncoderLayer, each drawn with random constructor and call arguments.

The oracle is torch.nn itself, in float64 and float32: the module of the same class and arguments,
run by torch.func.functional_call with the fuzz case's parameter values under PyTorch's names and
layouts. Which aot parameter is which PyTorch one (and transposed or not) is read from aot's own
trace of the module (`table`), the table the package's state_dict uses, so this file hard-codes no
parameter names. BatchNorm's buffers live in a per-module state dict that torch updates in place in
training mode, step after step (fuzz_graphs.run_case); infer entries run the graph in eval mode
with the running statistics of that moment.

An op record: Op(outs, "nnmod", (tensor inputs..., parameter leaves...), kw) with kw: cls, mod,
ctor (positional constructor args, then one dict of keyword ones), n_in (tensor inputs), kwt (the
names of the trailing tensor inputs passed by keyword), call (constant call keywords), form
("x": one output; "first": [0] of a tuple; "pair": both of (out, weights/state); "lstm": out, h, c;
"lstm_hx": the same with the initial (h0, c0) as the 2nd and 3rd inputs), tnames (per parameter
leaf: PyTorch name, transposed) and bufs (PyTorch buffer names).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

NORMS = ("GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "LayerNorm", "BatchNorm1d", "BatchNorm2d")


def _torch():
    import fuzz_graphs as fg

    return fg._torch()


def _ctor(ctor) -> tuple[tuple, dict]:
    if ctor and isinstance(ctor[-1], dict):
        return tuple(ctor[:-1]), dict(ctor[-1])
    return tuple(ctor), {}


@lru_cache(maxsize=None)
def _table_cached(cls: str, ctor_key: tuple):
    import aot
    from aot import nn
    from aot.frontend import trace_program

    pos, ckw = ctor_key[0], dict(ctor_key[1])

    class M(aot.Module):
        def __init__(self):
            super().__init__()
            self.m = getattr(nn, cls)(*pos, **ckw)

    prog = aot.Program("t", model=M, infer={"f": aot.Infer(lambda m, x: x * 1.0, inputs={"x": aot.f32(1)})}, seed=0)
    tr = trace_program(prog)
    params = tuple((p.name[2:], tuple(p.shape), p.torch[0][2:], bool(p.torch[2])) for p in tr.params)
    bufs = tuple((b.name[2:], tuple(b.shape), b.dtype) for b in tr.buffers)
    return params, bufs


def table(cls: str, ctor) -> tuple:
    """((aot name, aot shape, torch name, transposed) per parameter, (name, shape, dtype) per buffer)."""
    pos, ckw = _ctor(ctor)
    return _table_cached(cls, (pos, tuple(sorted(ckw.items()))))


@lru_cache(maxsize=None)
def _torch_module(cls: str, ctor_key: tuple, fdt):
    T = _torch()
    pos, ckw = ctor_key[0], dict(ctor_key[1])
    return getattr(T.nn, cls)(*pos, **ckw, dtype=fdt)


def init_state(kw: dict, fdt) -> dict:
    """A BatchNorm's buffers at their initial values (torch's defaults), as torch tensors."""
    T = _torch()
    _params, bufs = table(kw["cls"], kw["ctor"])
    return {n: (T.zeros(s, dtype=T.int64) if dt == "i32" else (T.ones(s, dtype=fdt) if n.endswith("running_var") else T.zeros(s, dtype=fdt)))
            for n, s, dt in bufs}


def nnmod_torch(args, kw, fdt):
    """The module's outputs in PyTorch (a tuple when form gives several)."""
    T = _torch()
    pos, ckw = _ctor(kw["ctor"])
    tmod = _torch_module(kw["cls"], (pos, tuple(sorted(ckw.items()))), fdt)
    tmod.train(not kw.get("_eval"))
    n_in, kwt = kw["n_in"], kw.get("kwt", ())
    ins, ps = list(args[:n_in]), args[n_in:]
    ins = [a.to(fdt) if isinstance(a, T.Tensor) and a.dtype.is_floating_point else a for a in ins]
    named = {}
    for (tname, transposed), p in zip(kw["tnames"], ps):
        named[tname] = p.transpose(0, 1) if transposed else p
    state = kw.get("_state")
    if state is None and kw.get("bufs"):
        state = init_state(kw, fdt)  # training outputs do not read the running statistics
    named.update(state or {})
    n_kw = len(kwt)
    positional = ins[: n_in - n_kw]
    keywords = {k: (v.bool() if not v.dtype.is_floating_point else v) for k, v in zip(kwt, ins[n_in - n_kw :])}
    keywords.update(kw.get("call", {}))
    form = kw.get("form", "x")
    if form == "lstm_hx":
        positional = [positional[0], (positional[1], positional[2])]
    out = T.func.functional_call(tmod, named, tuple(positional), keywords)
    out = tuple(map(_contiguous_grad, out)) if isinstance(out, tuple) else _contiguous_grad(out)
    if form == "x":
        return out
    if form == "first":
        return out[0]
    if form == "pair":
        return out[0], out[1]
    return out[0], out[1][0], out[1][1]  # lstm, lstm_hx


@lru_cache(maxsize=None)
def _contiguous_grad_fn():
    T = _torch()

    class ContiguousGrad(T.autograd.Function):
        """The identity, whose backward hands the module a contiguous gradient: torch 2.13's CPU
        batch_norm backward is wrong for some strided gradients (a [1, 3, 3, 1] output read
        through swapaxes(1, 2): 0.5 off finite differences; fuzz seed 910006)."""

        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return g.contiguous()

    return ContiguousGrad


def _contiguous_grad(t):
    T = _torch()
    if isinstance(t, T.Tensor) and t.requires_grad and t.dtype.is_floating_point:
        return _contiguous_grad_fn().apply(t)
    if isinstance(t, tuple):
        return tuple(map(_contiguous_grad, t))
    return t


def nnmod_src(a, kw, mod):
    n_in, kwt = kw["n_in"], kw.get("kwt", ())
    ins = list(a[:n_in])
    n_kw = len(kwt)
    positional = ins[: n_in - n_kw]
    form = kw.get("form", "x")
    if form == "lstm_hx":
        positional = [positional[0], f"({positional[1]}, {positional[2]})"]
    parts = positional + [f"{k}={v}" for k, v in zip(kwt, ins[n_in - n_kw :])] + [f"{k}={v!r}" for k, v in kw.get("call", {}).items()]
    call = f"{mod}({', '.join(parts)})"
    if form == "first":
        return call + "[0]"
    if form in ("lstm", "lstm_hx"):
        return f"(lambda o, hc: (o, hc[0], hc[1]))(*{call})"
    return call


def ctor_src(cls: str, ctor) -> str:
    pos, ckw = _ctor(ctor)
    return f"nn.{cls}({', '.join([repr(a) for a in pos] + [f'{k}={v!r}' for k, v in ckw.items()])})"


def guard(ins64, ins32, outs64, outs32, kw) -> bool:
    """Refuse an ill-conditioned draw (a norm over near-constant rows, a saturated softmax) as
    run_case would at the end, but before anything is built on it."""
    for o64, o32 in zip(outs64, outs32):
        if o64.dtype.is_floating_point and o64.numel():
            big = float(o64.abs().max())
            if float((o32.to(o64.dtype) - o64).abs().max()) > 1e-5 * big + 1e-6:
                return False
    return True


# ---- the generator's action ------------------------------------------------------------------------

KINDS = (("GroupNorm", 2), ("InstanceNorm", 1), ("LayerNorm", 1.5), ("BatchNorm", 3), ("Embedding", 1),
         ("MultiheadAttention", 3), ("RNN", 2.5), ("TransformerEncoderLayer", 1))


def _param_value(g, aname: str, shape: tuple, tname: str, cls: str) -> np.ndarray:
    """Weights of 1/sqrt(fan_in)'s scale, norm gains near 1, biases small: values that keep
    softmaxes, tanh and sigmoid gates in their well-conditioned ranges."""
    r = g.rng
    leaf = tname.rsplit(".", 1)[-1]
    if len(shape) == 1 and leaf == "weight":
        return np.asarray(r.uniform(0.5, 1.5, shape), dtype=np.float32)
    if len(shape) == 1:
        return np.asarray(r.uniform(-0.5, 0.5, shape), dtype=np.float32)
    if cls == "Embedding":
        return np.asarray(r.uniform(-2.0, 2.0, shape), dtype=np.float32)
    fan_in = shape[0] if aname.endswith("W") else shape[-1]  # aot's W is [in, out]; torch's [out, in]
    return np.asarray(r.uniform(-1.5, 1.5, shape) / math.sqrt(fan_in), dtype=np.float32)


def _input(g, shape, p_new=0.5, domain="real"):
    """An f32 variable of exactly this shape, or a new leaf."""
    return g.pick(lambda v: g.f32(v) and g.shape(v) == tuple(shape), lambda: g.leaf(shape, domain=domain), p_new=p_new)


def _mask_leaf(g, shape, keep_first: bool, causal: bool = False):
    """An i32 0/1 mask input (1: masked, torch's True); column 0 (or the diagonal) never masked,
    so no row of scores is masked whole (torch gives NaN there, aot a mean)."""
    import fuzz_graphs as fg

    vals = []
    for _ in range(g.steps):
        if causal:
            L, S = shape
            m = (np.arange(S)[None, :] > np.arange(L)[:, None]).astype(np.int32)
        else:
            m = (g.rng.random(shape) < 0.4).astype(np.int32)
            if keep_first:
                m[..., 0] = 0
        vals.append(m)
    name = g._name("i")
    g.add_leaf(fg.Leaf(name, "input", "i32", tuple(shape), vals))
    return name


def _float_mask_leaf(g, shape):
    import fuzz_graphs as fg

    name = g._name("x")
    vals = [np.asarray(np.round(g.rng.uniform(-3.0, 0.0, shape), 1), dtype=np.float32) for _ in range(g.steps)]
    g.add_leaf(fg.Leaf(name, "input", "f32", tuple(shape), vals))
    return name


def action(g):
    """Draw one module and its call; emits it through g.emit (Skip when it does not fit)."""
    import fuzz_graphs as fg

    names = [k for k, _ in KINDS]
    w = np.array([x for _, x in KINDS], dtype=np.float64)
    kind = names[int(g.rng.choice(len(names), p=w / w.sum()))]
    kwt, call, form, extra = (), {}, "x", []
    d = lambda lo, hi: int(g.rng.integers(lo, hi + 1))  # noqa: E731
    if kind == "GroupNorm":
        C = g.choice((2, 4, 6))
        G = g.choice([k for k in (1, 2, 3, C) if C % k == 0])
        x = _input(g, (d(1, 3), C) + tuple(d(1, 4) for _ in range(d(0, 2))))
        if math.prod(g.shape(x)[2:]) * C // G < 2:
            raise fg.Skip("GroupNorm: one value per group")
        cls, ctor = "GroupNorm", (G, C, {"affine": g.chance(0.7)})
    elif kind == "InstanceNorm":
        C = d(1, 4)
        cls = g.choice(("InstanceNorm1d", "InstanceNorm2d"))
        x = _input(g, (d(1, 3), C, d(2, 6)) if cls == "InstanceNorm1d" else (d(1, 3), C, d(1, 4), d(2, 4)))
        ctor = (C, {"affine": g.chance(0.6)})
    elif kind == "LayerNorm":
        x = g.pick(lambda v: g.f32(v) and len(g.shape(v)) >= 2 and math.prod(g.shape(v)[-2:]) >= 2,
                   g.new_f32(shape=(d(1, 3), d(1, 4), d(2, 5))))
        k = g.choice((1, 2, 2)) if math.prod(g.shape(x)[-1:]) >= 2 else 2
        ctor = (tuple(g.shape(x)[-k:]), {"elementwise_affine": g.chance(0.8), "bias": g.chance(0.8)})
        cls = "LayerNorm"
    elif kind == "BatchNorm":
        C = d(1, 4)
        if g.chance(0.5):
            cls, shape = "BatchNorm2d", (d(1, 3), C, d(1, 3), d(1, 3))
        else:
            cls, shape = "BatchNorm1d", (d(2, 5), C) if g.chance(0.5) else (d(1, 3), C, d(1, 4))
        x = _input(g, shape, p_new=0.6)
        if math.prod(shape) // C < 2:
            raise fg.Skip("BatchNorm: one value per channel")
        ctor = (C, {"momentum": g.choice((0.1, 0.5, None)), "affine": g.chance(0.7), "track_running_stats": g.chance(0.85)})
    elif kind == "Embedding":
        V, D = d(2, 6), d(1, 4)
        x = g.index(V)
        cls, ctor = "Embedding", (V, D, {"padding_idx": g.choice((0, 1, -1))})
    elif kind == "MultiheadAttention":
        H = g.choice((1, 2))
        E = H * d(1, 3)
        bf = g.chance(0.5)
        N, L = d(1, 2), d(1, 4)
        path = g.choice(("fused", "fused", "weights", "cross", "mask", "kpm", "causal"))
        S = L if path in ("fused", "weights", "causal") or g.chance(0.3) else d(1, 4)
        q = _input(g, (N, L, E) if bf else (L, N, E))
        ckw = {"bias": g.chance(0.8), "batch_first": bf}
        if path == "cross" and g.chance(0.5):
            ckw["kdim"], ckw["vdim"] = d(1, 4), d(1, 4)
        if path in ("fused", "weights", "causal"):
            ins = [q, q, q]
        else:
            kv = (N, S) if bf else (S, N)
            k = _input(g, kv + (ckw.get("kdim", E),))
            v = _input(g, kv + (ckw.get("vdim", E),)) if g.chance(0.5) or "vdim" in ckw else k
            ins = [q, k, v]
        call["need_weights"] = path == "weights"
        if path == "weights":
            call["average_attn_weights"] = g.chance(0.5)
            form = "pair"
        else:
            form = "first"
        if path == "mask":
            kwt = ("attn_mask",)
            extra = [_float_mask_leaf(g, (L, S)) if g.chance(0.4) else _mask_leaf(g, (L, S), True)]
        elif path == "kpm":
            kwt = ("key_padding_mask",)
            extra = [_mask_leaf(g, (N, S), True)]
        elif path == "causal":
            kwt = ("attn_mask",)
            extra = [_mask_leaf(g, (L, L), False, causal=True)]
            call["is_causal"] = True
        x = None
        cls, ctor = "MultiheadAttention", (E, H, ckw)
    elif kind == "RNN":
        cls = g.choice(("LSTM", "GRU", "RNN"))
        I, Hd, T_, N = d(1, 3), d(1, 3), d(1, 4), d(1, 2)
        ckw = {"num_layers": g.choice((1, 1, 2)), "bidirectional": g.chance(0.4), "batch_first": g.chance(0.4),
               "bias": g.chance(0.8)}
        if cls == "RNN" and g.chance(0.4):
            ckw["nonlinearity"] = "relu"
        x = _input(g, (N, T_, I) if ckw["batch_first"] else (T_, N, I), domain="small")
        ctor = (I, Hd, ckw)
        nh = ckw["num_layers"] * (2 if ckw["bidirectional"] else 1)
        if g.chance(0.4):
            extra = [g.leaf((nh, N, Hd), domain="small")]
            if cls == "LSTM":
                extra.append(g.leaf((nh, N, Hd), domain="small"))
        if cls == "LSTM":
            form = "lstm_hx" if extra else "lstm"
        else:
            form = "pair"
    else:  # TransformerEncoderLayer
        H = g.choice((1, 2))
        E = 2 * H
        bf = g.chance(0.5)
        N, L = d(1, 2), d(1, 4)
        x = _input(g, (N, L, E) if bf else (L, N, E))
        ctor = (E, H, {"dim_feedforward": g.choice((4, 6)), "dropout": 0.0, "activation": g.choice(("relu", "gelu")),
                       "batch_first": bf, "norm_first": g.chance(0.5)})
        cls = "TransformerEncoderLayer"
        r = g.rng.random()
        if r < 0.3:
            kwt = ("src_mask",)
            extra = [_float_mask_leaf(g, (L, L))]
        elif r < 0.5:
            kwt = ("src_mask",)
            extra = [_mask_leaf(g, (L, L), False, causal=True)]
            call["is_causal"] = True
    ins = ([x] if x is not None else ins) + extra
    params, bufs = table(cls, ctor)
    mod = g._name("m")
    leaves = []
    for aname, shape, tname, _tr in params:
        leaf = fg.Leaf(f"{mod}.{aname}", "modparam", "f32", shape, [_param_value(g, aname, shape, tname, cls)])
        g.add_leaf(leaf)
        leaves.append(leaf.name)
    kw = {"cls": cls, "mod": mod, "ctor": ctor, "n_in": len(ins), "kwt": kwt, "call": call, "form": form,
          "tnames": tuple((t, tr) for _a, _s, t, tr in params), "bufs": tuple(n for n, _s, _d in bufs)}
    n_out = {"x": 1, "first": 1, "pair": 2, "lstm": 3, "lstm_hx": 3}[form]
    try:
        outs = g.emit("nnmod", (*ins, *leaves), kw, n_out=n_out)
    except fg.Skip:
        for n in leaves:
            del g.leaves[n]
        raise
    g.modules[mod] = (cls, ctor)
    return outs
