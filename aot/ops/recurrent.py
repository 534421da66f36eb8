"""A whole LSTM layer direction as one kernel: every time step of the recurrence in one dispatch.

An unrolled LSTM costs a matmul and a gate kernel per time step forward and about two kernels
per step backward, and on a GPU every dispatch costs ~10-13 us whatever its size (the matmul of
B=32 rows by 512 gate columns takes far less): the number of dispatches was the speed. Batch rows
of an LSTM never meet, so one workgroup can own a batch row and walk all T steps itself, its
invocations meeting at a workgroup barrier between steps (aot/recurrent_codegen.py).

Primitives (fusion class "recurrent": each is a kernel of aot/recurrent_codegen.py):
  lstm_seq      (xw, w_t[, h0, c0])     -> Y  [T, B, 6H]
  lstm_seq_grad (Y, dY, w_hh[, c0])     -> G  [T, B, 5H]
xw [T, B, 4H] is x W_ih^T + b_ih + b_hh (time-major, gates i, f, g, o: torch's order); w_hh is
torch's [4H, H] weight_hh and w_t its transpose [H, 4H], which the forward kernel reads row-major
(OpDef.contiguous: one copy a call), so that invocations owning neighbouring hidden units read
neighbouring weights, as the backward kernel does in w_hh (a GPU reads a warp's 32 floats in one
transaction instead of 32; the forward took 43 us a step on an H100 reading w_hh row by row). Y[t] holds, for the step that consumed position t, the lanes
[h | c | i | f | g | o]: the new hidden and cell state and the four gate activations (sigmoid,
sigmoid, tanh, sigmoid), which the backward kernel reads instead of recomputing them. `reverse`
walks t = T-1 .. 0 (the backward direction of a bidirectional layer). h0 and c0 are both given
or both absent (zeros).
G[t] holds the gradient of the loss with respect to the gate pre-activations of step t (lanes
0..4H: also the gradient of xw) and of the cell state that step t read (lanes 4H..5H). The VJP
composes the rest from G with plain ops: dW_hh = sum_t dpre_t^T h_(t-1) (one matmul over all
steps), dh0 = dpre_first W_hh, dc0 = G's last lanes at the first step.
Every lane of Y is differentiable: a cotangent of an activation lane adds to that gate's
gradient, so the VJP is exact whatever reads Y (nn.LSTM reads only h and c).
"""

from __future__ import annotations

import numpy as np

from ..matmul_codegen import LOOP_MAX
from .registry import Bad, OpDef, register
from .trace import emit
from . import api as F

# Hidden sizes the kernel holds: a GPU invocation owns up to two hidden units (4 gate sums each,
# in registers; 256 invocations a workgroup) and the workgroup keeps a step's 4H gate gradients
# in workgroup memory (8 KiB at 512; WebGPU guarantees 16 KiB). nn.LSTM composes plain ops beyond.
MAX_HIDDEN = 512
MAX_INVOCATIONS = 256  # WebGPU's default maxComputeInvocationsPerWorkgroup

# k (forward) and r (backward) steps per loop iteration, written out: the loops stay under
# LOOP_MAX iterations per invocation (Mesa 22's lavapipe ends an invocation's loops there)
UNROLL = 4


def workgroup_size(hidden: int) -> int:
    """Invocations of a workgroup: the hidden units rounded up to whole warps, at most 256."""
    return min(MAX_INVOCATIONS, -(-hidden // 32) * 32)


def loop_steps(steps: int, hidden: int) -> int:
    """Loop iterations one invocation runs (the backward kernel's, the larger): for LOOP_MAX."""
    return steps * (4 * hidden // UNROLL + 1) + 4 * hidden


def fits(steps: int, hidden: int) -> bool:
    """Whether lstm_seq's kernels hold a layer of this many steps and hidden units."""
    return hidden <= MAX_HIDDEN and loop_steps(steps, hidden) < LOOP_MAX


def _f32(name, x, rank):
    s, dt = x
    if dt != "f32" or len(s) != rank:
        raise Bad(f"{name} must be an f32 tensor of rank {rank}, got {dt}{list(s)}")
    return tuple(s)


def _check(xw, w, state, transposed=False):
    t, b, g4 = _f32("xw", xw, 3)
    w_s = _f32("w_hh", w, 2)
    want = (g4 // 4, g4) if transposed else (g4, g4 // 4)
    if g4 % 4 or w_s != want:
        what = "w_hh^T must be [H, 4H]" if transposed else "w_hh must be [4H, H]"
        raise Bad(f"{what} with xw [T, B, 4H], got {list(w_s)} and xw {list(xw[0])}")
    h = g4 // 4
    if min(t, b, h) < 1:
        raise Bad(f"T, B and H must be at least 1, got xw {list(xw[0])}")
    if not fits(t, h):
        raise Bad(
            f"{t} steps of hidden size {h} are more than the fused LSTM kernel holds (H <= {MAX_HIDDEN}, "
            f"T * (H + 1) under about {LOOP_MAX})",
            "use nn.LSTM, which composes plain ops there",
        )
    for name, x in zip(("h0", "c0"), state):
        if _f32(name, x, 2) != (b, h):
            raise Bad(f"{name} must be [B, H] = {[b, h]}, got {list(x[0])}")
    return t, b, h


def _seq_shape(xw, w, *state, reverse=False):
    if len(state) not in (0, 2):
        raise Bad(f"lstm_seq takes h0 and c0 together or neither, got {len(state)} state tensors")
    t, b, h = _check(xw, w, state, transposed=True)
    return (t, b, 6 * h), "f32"


def _grad_shape(y, dy, w, *c0, reverse=False):
    s = _f32("Y", y, 3)
    if _f32("dY", dy, 3) != s or s[2] % 6:
        raise Bad(f"Y and dY must both be [T, B, 6H], got {list(y[0])} and {list(dy[0])}")
    t, b, h = s[0], s[1], s[2] // 6
    _check(((t, b, 4 * h), "f32"), w, ())
    if len(c0) > 1 or c0 and _f32("c0", c0[0], 2) != (b, h):
        raise Bad(f"lstm_seq_grad takes at most one c0 of shape {[b, h]}")
    return (t, b, 5 * h), "f32"


# ---- NumPy semantics (the interpreter; float64 when it runs in float64) ------------------------


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def _order(t, reverse):
    return range(t - 1, -1, -1) if reverse else range(t)


def _seq_ref(xw, w_t, *state, reverse=False):
    t, b, g4 = xw.shape
    h_n = g4 // 4
    h = state[0] if state else np.zeros((b, h_n), xw.dtype)
    c = state[1] if state else np.zeros((b, h_n), xw.dtype)
    y = np.zeros((t, b, 6 * h_n), xw.dtype)
    for s in _order(t, reverse):
        a = xw[s] + h @ w_t
        i, f, o = (_sig(a[:, k * h_n : (k + 1) * h_n]) for k in (0, 1, 3))
        g = np.tanh(a[:, 2 * h_n : 3 * h_n])
        c = f * c + i * g
        h = o * np.tanh(c)
        y[s] = np.concatenate([h, c, i, f, g, o], axis=1)
    return y


def _grad_ref(y, dy, w, *c0, reverse=False):
    t, b, h6 = y.shape
    n = h6 // 6
    lane = lambda a, k: a[:, k * n : (k + 1) * n]  # noqa: E731
    out = np.zeros((t, b, 5 * n), y.dtype)
    steps = list(_order(t, reverse))
    dpre = None
    dc = np.zeros((b, n), y.dtype)
    for p in range(t - 1, -1, -1):
        s = steps[p]
        c_prev = lane(y[steps[p - 1]], 1) if p else (c0[0] if c0 else np.zeros((b, n), y.dtype))
        dh = lane(dy[s], 0) + (dpre @ w if dpre is not None else 0.0)
        c, i, f, g, o = (lane(y[s], k) for k in range(1, 6))
        tc = np.tanh(c)
        dc = dc + lane(dy[s], 1) + dh * o * (1.0 - tc * tc)
        d_i = (dc * g + lane(dy[s], 2)) * i * (1.0 - i)
        d_f = (dc * c_prev + lane(dy[s], 3)) * f * (1.0 - f)
        d_g = (dc * i + lane(dy[s], 4)) * (1.0 - g * g)
        d_o = (dh * tc + lane(dy[s], 5)) * o * (1.0 - o)
        dpre = np.concatenate([d_i, d_f, d_g, d_o], axis=1)
        dc = dc * f
        out[s] = np.concatenate([dpre, dc], axis=1)
    return out


def _seq_vjp(ct, n):
    xw, w_t = n.inputs[0], n.inputs[1]
    # the backward kernel reads W_hh row-major: the tensor w_t was transposed from, if it was
    transposed = w_t.node.op == "transpose" and tuple(w_t.node.attrs["perm"]) == (1, 0)
    w = w_t.node.inputs[0] if transposed else F.transpose(w_t, (1, 0))
    state = n.inputs[2:]
    reverse = n.attrs["reverse"]
    t, b, g4 = xw.shape
    h = g4 // 4
    grad = emit("lstm_seq_grad", (n.out, ct, w) + tuple(state[1:]), reverse=reverse)
    dpre = F.narrow(grad, 2, 0, g4)
    first = t - 1 if reverse else 0  # the position of the first step taken
    dw = None
    if t > 1:  # every step but the first read the previous step's h (Y's lanes 0..H)
        hs = F.narrow(F.narrow(n.out, 2, 0, h), 0, 1 if reverse else 0, t - 1)
        ds = F.narrow(dpre, 0, 0 if reverse else 1, t - 1)
        dw = F.matmul(F.transpose(F.reshape(ds, ((t - 1) * b, g4)), (1, 0)), F.reshape(hs, ((t - 1) * b, h)))
    if not state:
        return dpre, None if dw is None else F.transpose(dw, (1, 0))
    d_first = F.reshape(F.narrow(dpre, 0, first, 1), (b, g4))
    dw0 = F.matmul(F.transpose(d_first, (1, 0)), state[0])
    dw = dw0 if dw is None else dw + dw0
    dh0 = F.matmul(d_first, w)
    dc0 = F.reshape(F.narrow(F.narrow(grad, 0, first, 1), 2, g4, h), (b, h))
    return dpre, F.transpose(dw, (1, 0)), dh0, dc0


register(OpDef("lstm_seq", _seq_shape, _seq_ref, _seq_vjp, "recurrent", contiguous=(1,)))
register(OpDef("lstm_seq_grad", _grad_shape, _grad_ref, None, "recurrent", nondiff=True))
