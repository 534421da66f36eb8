"""Recurrent layers: `LSTM`, `GRU`, `RNN` and their cells, with torch.nn's arguments, results and
parameters (names, layouts, gate order), so a torch module's state_dict loads unchanged.

The sequence length is static (shapes are), so a layer unrolls into plain ops: the input
projection of all time steps is one matmul [T*B, I] x [I, G*H]; each step adds one matmul
[B, H] x [H, G*H] (the bias and the input projection in its epilogue) and the gate math, which
the schedule fuses into one elementwise kernel per step. A step's hidden state is written
straight into its slice of the layer's output (a leading-axis stack, assembled in place), and
the next step's matmul reads it there. Weights keep torch's [G*H, in] layout: the matmuls read
them through a transposed view, never a copy.
"""

from __future__ import annotations

import math

from . import init as _init
from . import ops
from .module import Module
from .ops.trace import fail
from .ops.recurrent import fits

GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def _weights_t(w):
    """torch's [G*H, in] weight as the [in, G*H] matmul operand (a transposed view)."""
    return ops.transpose(w, (1, 0))


def _gate(x, k: int, h: int):
    return ops.narrow(x, -1, k * h, h)


def _lstm_step(xw, h, c, w_hh_t, b_hh):
    """One LSTM step from xw = x W_ih^T (+ biases) and w_hh_t = W_hh^T: gates i, f, g, o (torch's order)."""
    n = w_hh_t.shape[0]
    gates = xw if h is None else xw + ops.matmul(h, w_hh_t)
    if b_hh is not None:
        gates = gates + b_hh
    i, f, g, o = (_gate(gates, k, n) for k in range(4))
    c_new = ops.sigmoid(i) * ops.tanh(g)
    if c is not None:
        c_new = ops.sigmoid(f) * c + c_new
    return ops.sigmoid(o) * ops.tanh(c_new), c_new


def _gru_step(xw, h, w_hh_t, b_hh):
    """One GRU step: r, z, n with n = tanh(x W_in + b_in + r * (h W_hn + b_hn)) (torch's form)."""
    n = w_hh_t.shape[0]
    hw = None if h is None else ops.matmul(h, w_hh_t)
    if b_hh is not None:
        hw = ops.broadcast_to(b_hh, xw.shape) if hw is None else hw + b_hh
    if hw is None:  # h0 = 0 and no bias: the hidden side contributes nothing
        r_in, z_in, n_in = (_gate(xw, k, n) for k in range(3))
        z = ops.sigmoid(z_in)
        return (1.0 - z) * ops.tanh(n_in)
    r = ops.sigmoid(_gate(xw, 0, n) + _gate(hw, 0, n))
    z = ops.sigmoid(_gate(xw, 1, n) + _gate(hw, 1, n))
    cand = ops.tanh(_gate(xw, 2, n) + r * _gate(hw, 2, n))
    out = (1.0 - z) * cand
    return out if h is None else out + z * h


def _rnn_step(xw, h, w_hh_t, b_hh, relu: bool):
    pre = xw if h is None else xw + ops.matmul(h, w_hh_t)
    if b_hh is not None:
        pre = pre + b_hh
    return ops.relu(pre) if relu else ops.tanh(pre)


def _check_mode(kind, nonlinearity):
    if kind == "RNN":
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: unknown nonlinearity {nonlinearity!r}; expected 'tanh' or 'relu'")
        return "RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU"
    return kind


def _declare(mod, kind: str, suffix: str, gates: int, in_size: int, hidden: int, bias: bool):
    """weight_ih / weight_hh / bias_ih / bias_hh + suffix, in torch's order and layouts. torch draws
    them all from U(-1/sqrt(H), 1/sqrt(H)); aot's inits are normal, so the same variance: std 1/sqrt(3H)."""
    init = _init.randn(1.0 / math.sqrt(3.0 * hidden))
    names = [("weight_ih", (gates * hidden, in_size)), ("weight_hh", (gates * hidden, hidden))]
    if bias:
        names += [("bias_ih", (gates * hidden,)), ("bias_hh", (gates * hidden,))]
    out = []
    for base, shape in names:
        name = base + suffix
        t = mod._torch_param(kind, name, shape, init=init, decay=True)
        setattr(mod, name, t)
        out.append(t)
    return out if bias else out + [None, None]


def _lstm_fused(xw, h, c, w_hh, reverse: bool):
    """One LSTM direction as one kernel each way (ops.lstm_seq): (output [T, B, H], last h, last c),
    all views of its [T, B, 6H] result."""
    t, b, n = xw.shape[0], xw.shape[1], w_hh.shape[1]
    y = ops.lstm_seq(xw, w_hh, h, c, reverse=reverse) if h is not None else ops.lstm_seq(xw, w_hh, reverse=reverse)
    last = ops.reshape(ops.narrow(y, 0, 0 if reverse else t - 1, 1), (b, 6 * n))
    return ops.narrow(y, 2, 0, n), ops.narrow(last, 1, 0, n), ops.narrow(last, 1, n, n)


def _run_direction(mode, xw, h, c, w_hh, b_hh, reverse: bool):
    """Steps over xw [T, B, G*H]: (per-position outputs [B, H] in time order, last h, last c)."""
    steps = range(xw.shape[0] - 1, -1, -1) if reverse else range(xw.shape[0])
    outs = [None] * xw.shape[0]
    w_t = _weights_t(w_hh)  # one view for every step: its gradient is then one sum (aot/grad.py)
    for t in steps:
        x_t = ops.reshape(ops.narrow(xw, 0, t, 1), xw.shape[1:])
        if mode == "LSTM":
            h, c = _lstm_step(x_t, h, c, w_t, b_hh)
        elif mode == "GRU":
            h = _gru_step(x_t, h, w_t, b_hh)
        else:
            h = _rnn_step(x_t, h, w_t, b_hh, mode == "RNN_RELU")
        outs[t] = h
    return outs, h, c


class _RNNBase(Module):
    _kind = ""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, nonlinearity: str = "tanh"):
        super().__init__()
        if num_layers < 1 or input_size < 1 or hidden_size < 1:
            raise ValueError(f"{self._kind}: input_size, hidden_size and num_layers must be positive, got "
                             f"{input_size}, {hidden_size}, {num_layers}")
        if not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"{self._kind}: dropout must be in [0, 1), got {dropout}")
        self.mode = _check_mode(self._kind, nonlinearity)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout, self.bidirectional = bias, batch_first, float(dropout), bidirectional
        self.nonlinearity = nonlinearity
        dirs = 2 if bidirectional else 1
        cells = []  # per layer, per direction: (w_ih, w_hh, b_ih, b_hh)
        for layer in range(num_layers):
            in_size = input_size if layer == 0 else hidden_size * dirs
            row = []
            for d in range(dirs):
                suffix = f"_l{layer}" + ("_reverse" if d else "")
                row.append(_declare(self, self._kind, suffix, GATES[self.mode], in_size, hidden_size, bias))
            cells.append(row)
        object.__setattr__(self, "_cells", cells)  # the tensors are named by their own attributes

    def _state_in(self, hx, batch, batched: bool, what: str):
        """hx [L*D, B, H] (or [L*D, H] unbatched) -> per (layer, direction) [B, H], or None (zeros)."""
        n = self.num_layers * (2 if self.bidirectional else 1)
        if hx is None:
            return [None] * n
        if not hasattr(hx, "node"):
            fail(self._kind, f"{what} must be a Tensor, got {type(hx).__name__}")
        want = (n, batch, self.hidden_size) if batched else (n, self.hidden_size)
        if tuple(hx.shape) != want:
            fail(self._kind, f"{what} must have shape {list(want)}, got {hx.type_str()}")
        return [ops.reshape(ops.narrow(hx, 0, k, 1), (batch, self.hidden_size)) for k in range(n)]

    def forward(self, input, hx=None):
        if input.ndim not in (2, 3) or input.shape[-1] != self.input_size:
            fail(self._kind, f"expects input [T, B, {self.input_size}] ([B, T, {self.input_size}] with batch_first, "
                 f"or unbatched [T, {self.input_size}]), got {input.type_str()}")
        batched = input.ndim == 3
        x = input if batched else ops.reshape(input, (input.shape[0], 1, input.shape[1]))
        if batched and self.batch_first:
            x = ops.transpose(x, (1, 0, 2))
        batch = x.shape[1]
        if self.mode == "LSTM":
            if hx is not None and not (isinstance(hx, (tuple, list)) and len(hx) == 2):
                fail("LSTM", "hx must be a tuple (h_0, c_0)")
            h0 = self._state_in(None if hx is None else hx[0], batch, batched, "h_0")
            c0 = self._state_in(None if hx is None else hx[1], batch, batched, "c_0")
        else:
            h0 = self._state_in(hx, batch, batched, "hx")
            c0 = [None] * len(h0)
        h_n, c_n = [], []
        for layer, row in enumerate(self._cells):
            if layer and self.dropout:
                x = ops.dropout(x, self.dropout)  # training graphs only; identity in an Infer entry
            outs = []
            for d, (w_ih, w_hh, b_ih, b_hh) in enumerate(row):
                k = layer * len(row) + d
                xw = ops.matmul(x, _weights_t(w_ih))
                # the LSTM's and RNN's two biases add; the GRU keeps b_hh inside r * (...)
                if b_ih is not None:
                    xw = xw + (b_ih + b_hh if self.mode in ("LSTM", "RNN_TANH", "RNN_RELU") else b_ih)
                b_step = b_hh if self.mode == "GRU" else None
                if self.mode == "LSTM" and fits(xw.shape[0], self.hidden_size):
                    seq, h, c = _lstm_fused(xw, h0[k], c0[k], w_hh, d == 1)
                    outs.append(seq)
                else:
                    seq, h, c = _run_direction(self.mode, xw, h0[k], c0[k], w_hh, b_step, d == 1)
                    outs.append(ops.stack(seq, 0))
                h_n.append(h)
                c_n.append(c)
            x = ops.concat(outs, -1)
        out = x
        if batched and self.batch_first:
            out = ops.transpose(out, (1, 0, 2))
        if not batched:
            out = ops.reshape(out, (out.shape[0], out.shape[2]))
        state = _state_out(h_n, batched)
        if self.mode == "LSTM":
            return out, (state, _state_out(c_n, batched))
        return out, state


def _state_out(hs, batched: bool):
    s = ops.stack(hs, 0)
    return s if batched else ops.reshape(s, (s.shape[0], s.shape[2]))


class LSTM(_RNNBase):
    """torch.nn.LSTM: `forward(input, (h_0, c_0)=None)` -> `(output, (h_n, c_n))`."""

    _kind = "LSTM"


class GRU(_RNNBase):
    """torch.nn.GRU: `forward(input, h_0=None)` -> `(output, h_n)`."""

    _kind = "GRU"


class RNN(_RNNBase):
    """torch.nn.RNN (Elman; nonlinearity "tanh" or "relu"): `forward(input, h_0=None)` -> `(output, h_n)`."""

    _kind = "RNN"

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh", bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False):
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, nonlinearity)


class _CellBase(Module):
    _kind = ""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh"):
        super().__init__()
        self.mode = _check_mode(self._kind, nonlinearity)
        self.input_size, self.hidden_size, self.bias, self.nonlinearity = input_size, hidden_size, bias, nonlinearity
        w = _declare(self, self._kind + "Cell", "", GATES[self.mode], input_size, hidden_size, bias)
        object.__setattr__(self, "_w", w)

    def _state(self, hx, batch, batched: bool, what: str):
        if hx is None:
            return None
        want = (batch, self.hidden_size) if batched else (self.hidden_size,)
        if not hasattr(hx, "node"):
            fail(self._kind + "Cell", f"{what} must be a Tensor, got {type(hx).__name__}")
        if tuple(hx.shape) != want:
            fail(self._kind + "Cell", f"{what} must have shape {list(want)}, got {hx.type_str()}")
        return hx if batched else ops.reshape(hx, (1, self.hidden_size))

    def forward(self, input, hx=None):
        if input.ndim not in (1, 2) or input.shape[-1] != self.input_size:
            fail(self._kind + "Cell", f"expects input [B, {self.input_size}] or [{self.input_size}], got {input.type_str()}")
        batched = input.ndim == 2
        x = input if batched else ops.reshape(input, (1, self.input_size))
        w_ih, w_hh, b_ih, b_hh = self._w
        xw = ops.matmul(x, _weights_t(w_ih))
        if b_ih is not None:
            xw = xw + (b_ih if self.mode == "GRU" else b_ih + b_hh)
        b_step = b_hh if self.mode == "GRU" else None
        unbatch = (lambda t: t) if batched else (lambda t: ops.reshape(t, (self.hidden_size,)))
        if self.mode == "LSTM":
            if hx is not None and not (isinstance(hx, (tuple, list)) and len(hx) == 2):
                fail("LSTMCell", "hx must be a tuple (h_0, c_0)")
            h0 = self._state(None if hx is None else hx[0], x.shape[0], batched, "h_0")
            c0 = self._state(None if hx is None else hx[1], x.shape[0], batched, "c_0")
            if fits(1, self.hidden_size):
                xw1 = ops.reshape(xw, (1,) + tuple(xw.shape))
                _, h, c = _lstm_fused(xw1, h0, c0, w_hh, False)
            else:
                h, c = _lstm_step(xw, h0, c0, _weights_t(w_hh), b_step)
            return unbatch(h), unbatch(c)
        h0 = self._state(hx, x.shape[0], batched, "hx")
        if self.mode == "GRU":
            return unbatch(_gru_step(xw, h0, _weights_t(w_hh), b_step))
        return unbatch(_rnn_step(xw, h0, _weights_t(w_hh), b_step, self.mode == "RNN_RELU"))


class LSTMCell(_CellBase):
    """torch.nn.LSTMCell: `forward(input, (h, c)=None)` -> `(h', c')`."""

    _kind = "LSTM"


class GRUCell(_CellBase):
    """torch.nn.GRUCell: `forward(input, h=None)` -> `h'`."""

    _kind = "GRU"


class RNNCell(_CellBase):
    """torch.nn.RNNCell: `forward(input, h=None)` -> `h'` (nonlinearity "tanh" or "relu")."""

    _kind = "RNN"
