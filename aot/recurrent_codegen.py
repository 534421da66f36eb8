"""Recurrent kernels (aot/ops/recurrent.py): one scheduled "recurrent" Kernel -> WGSL source.

One workgroup per batch row walks every time step of the recurrence (rows never meet), so a
whole LSTM direction is one dispatch forward (lstm_seq) and one backward (lstm_seq_grad),
where an unrolled LSTM costs two or more per step each way at ~10-13 us a dispatch on a GPU.
Invocation i owns hidden units i, i + WG, ... (UNITS at most: H <= MAX_HIDDEN) and all four of
their gates, so the gate maths needs nothing from other invocations:
- forward, per step: a = xw[t] + h_prev W_hh^T for its units' four gate rows (h_prev read from
  workgroup memory, W_hh from storage), the activations, c = f c + i g, h = o tanh(c); it writes
  Y[t] = [h | c | i | f | g | o] and, after a barrier, h into workgroup memory for the next step.
- backward, last step first: dh = dY_h[t] + dpre_next W_hh (the next step's gate gradients from
  workgroup memory: invocations read neighbouring columns of W_hh, one row at a time), then the
  gate gradients from the saved activations and the cell gradient carried in a register.
The CPU set runs this kernel (lstm.wgsl.j2; two barriers a step), with tensor offsets from the
offset table. The GPU set runs a two-phase kernel (lstm_split.wgsl.j2), 2x faster on an H100: a
step's product x M is split over up to 256 invocations in row groups (each sums a slice of the
rows for a few columns; vec4 loads where M is read-only), whose partial sums meet in workgroup
memory, and then invocation j does unit j's gate maths as above. Sums run in a fixed order:
results are reproducible.
"""

from __future__ import annotations

from .errors import CodegenError
from .ir import Tensor
from .matmul_codegen import MAX_GROUPS_PER_DIM, MAX_WORKGROUP_BYTES, split_index
from .ops.recurrent import MAX_INVOCATIONS, UNROLL, fits, workgroup_size
from .plan import Plan, vec_alias
from .schedule import Kernel, KernelSchedule
from .templates import render
from .views import merge_subdims
from .wgsl_expr import HELPER_DEPS, KernelContext

# batch rows a CPU workgroup walks together (rows_per_workgroup)
CPU_ROWS = 8
# The one-phase kernel (the GPU set's only where split_plan finds no split): steps of the k loop
# (forward) or of each gate's r loop (backward) written out per iteration, loads first: 4 x GPU_UNROLL weight loads in flight per invocation. Each workgroup streams all of
# W_hh from L2 every step with few invocations, so a step takes about the loads' latency times
# the iterations. lstm_lm on an H100 (profile_kernels, scripts/results/profile_lstm_lm_h100*.json),
# forward + backward kernel: unrolled 4, reading W_hh row by row in the forward, 684 + 200 us;
# reading W_hh^T, unrolled 8: 179 + 188; 16: 170 + 167; 32: 170 + 142. The CPU set unrolls less
# (its loads are per lane either way; less to compile).
GPU_UNROLL = 32
# hidden units a CPU invocation owns (at least): each value read from workgroup memory (a lane's
# scalar load there) then feeds as many sums
CPU_UNITS = 16
CPU_UNROLL = UNROLL


class _Addr:
    """Addresses of a stored tensor's elements as WGSL u32 expressions (a strided view)."""

    def __init__(self, s: KernelSchedule, plan: Plan, kc: KernelContext, t: Tensor):
        if id(t) not in s.views:
            raise CodegenError(f"recurrent operand {t.type_str()} is not stored (the schedule stores recurrent operands)")
        loc, dims = plan.read_loc(s, t)
        kc.use(loc.arena, write=False)
        kc.reads.append(s.views[id(t)].base)
        self.buf = loc.arena
        self.offset = loc.offset
        self.start = kc.start(loc.arena, loc.offset)
        self.dims = [tuple(merge_subdims(axis)) for axis in dims]

    def at(self, *coords: str | int) -> str:
        terms = [self.start] if self.start else []
        for c, axis in zip(coords, self.dims):
            c = f"{c}u" if isinstance(c, int) else c if c.isidentifier() else f"({c})"  # split_index divides it
            terms += split_index(c, axis)
        return f"{self.buf}[{' + '.join(terms) or '0u'}]"


def _helpers(kc: KernelContext, names) -> None:
    for name in names:
        kc.helpers.add(name)
        _helpers(kc, HELPER_DEPS.get(name, ()))


def _grid(groups: int) -> tuple[tuple[int, int, int], int]:
    if groups <= MAX_GROUPS_PER_DIM:
        return (groups, 1, 1), groups
    y = -(-groups // MAX_GROUPS_PER_DIM)
    x = -(-groups // y)
    return (x, y, 1), x


def rows_per_workgroup(batch: int, shared: int, cpu: bool) -> int:
    """Batch rows a workgroup walks together. A GPU runs one a workgroup (the most workgroups at
    once; each reads all of W_hh a step from its L2 either way). A CPU adapter runs a workgroup's
    invocations as SIMD lanes whose weight loads are per lane, scalar and bounds-checked: there
    each load feeds CPU_ROWS rows (as far as workgroup memory holds their shared vectors)."""
    if not cpu:
        return 1
    return max(1, min(CPU_ROWS, batch, MAX_WORKGROUP_BYTES // (4 * shared)))


# The GPU set's kernel (lstm_split.wgsl.j2), phase A's split of the step's product: (row groups,
# columns per load, unroll) forward and backward; None: the one-phase kernel (lstm.wgsl.j2, the
# CPU set's). lstm_lm (H = 128, T = 16, B = 32) on an H100, forward / backward kernel, one call
# (scripts/profile_lstm_variants.py, scripts/results/profile_lstm_lm_h100_variants.json):
# one-phase 172.8 / 146.6 us; row groups 1 (256 invocations, 2 columns each) 131.2 / 370.2
# (backward vec4: 32 invocations); 2: 203.9 / 169.5; forward 4 row groups 87.6-87.7 (unrolled 16
# or 8), backward vec4 in 4 / 8 / 16 row groups 138.6 / 81.6 / 61.3 (8 scalar: 266.8). More row
# groups: more warps a workgroup and shorter dependent load chains; the forward's 8 would not fit
# workgroup memory, nor may its W_hh^T (in the scratch buffer it writes) be read as vec4s.
GPU_SPLIT_FWD: tuple[int, int, int] | None = (4, 1, 16)
GPU_SPLIT_BWD: tuple[int, int, int] | None = (16, 4, 8)
SH_FLOATS = MAX_WORKGROUP_BYTES // 4


def split_plan(rows: int, cols: int, want: tuple[int, int, int], vec_ok: bool):
    """(ks, vw, ni, m, ku) of phase A's y[cols] = x[rows] M[rows, cols] on a GPU: ks row groups of
    rows / ks rows, ni invocations a group each owning m groups of vw neighbouring columns (vw 4: one
    vec4 load, where M is read-only and aligned); as many row groups as asked that divide the rows and
    whose partial sums fit workgroup memory beside x. None where no split leaves 32 invocations."""
    ks, vw, ku = want
    vw = vw if vec_ok and cols % vw == 0 else 1
    while ks > 1 and (rows % ks or rows + ks * cols > SH_FLOATS):
        ks //= 2
    if rows + ks * cols > SH_FLOATS:
        return None
    groups = cols // vw
    ni = next(d for d in range(min(groups, MAX_INVOCATIONS // ks), 0, -1) if groups % d == 0)
    if ni * ks < min(32, groups * ks):
        return None
    rs = rows // ks
    return ks, vw, ni, groups // ni, max(1, min(ku, rs))


def render_recurrent(header: list[str], k: Kernel, s: KernelSchedule, plan: Plan, cpu: bool = False):
    """(WGSL source, grid, the kernel's binding/read record) of an lstm_seq or lstm_seq_grad kernel;
    `cpu`: the CPU set's variant (the same kernel, tensor offsets from the offset table)."""
    n = k.node
    kc = KernelContext(s, plan, None, table=cpu)
    fwd = n.op == "lstm_seq"
    if fwd:
        xw, w = n.inputs[0], n.inputs[1]
        steps, batch, hidden = xw.shape[0], xw.shape[1], xw.shape[2] // 4
        state = [_Addr(s, plan, kc, x) for x in n.inputs[2:]]
        a_xw = _Addr(s, plan, kc, xw)
    else:
        y, dy, w = n.inputs[:3]
        steps, batch, hidden = y.shape[0], y.shape[1], y.shape[2] // 6
        state = [None] + [_Addr(s, plan, kc, x) for x in n.inputs[3:]]  # c0 only
        a_y, a_dy = _Addr(s, plan, kc, y), _Addr(s, plan, kc, dy)
    if not fits(steps, hidden):
        raise CodegenError(f"{n.op}: {steps} steps of {hidden} hidden units do not fit its kernel (ops/recurrent.py)")
    a_w = _Addr(s, plan, kc, w)
    loc = plan.loc[id(k.out)]
    kc.use(loc.arena, write=True)
    out_start = kc.start(loc.arena, loc.offset)
    lanes = k.out.shape[2]

    def at_out(b: str, j: str, lane: int) -> str:
        terms = [out_start] if out_start else []
        terms += [f"(t * {batch}u + {b}) * {lanes}u" if batch > 1 else f"t * {lanes}u", j]
        if lane:
            terms.append(f"{lane * hidden}u")
        return " + ".join(terms)

    def lane(j: str, g: int) -> str:
        return f"{j} + {g * hidden}u" if g else j

    sp = _split(kc, fwd, hidden, a_w)
    if not cpu and sp is not None:
        split = _render_split(sp, header, kc, n, fwd, steps, batch, hidden, a_w, state, at_out, lane, loc.arena,
                              a_xw if fwd else None, (a_y, a_dy) if not fwd else None)
        return split + (kc,)
    wg = workgroup_size(hidden) if not cpu else min(workgroup_size(hidden), -(-hidden // (CPU_UNITS * 8)) * 8)
    units = -(-hidden // wg)
    shared = hidden if fwd else 4 * hidden
    rows = rows_per_workgroup(batch, shared, cpu)
    grid, row = _grid(-(-batch // rows))
    _helpers(kc, ["tanh_f32"] + (["sigmoid_f32"] if fwd else []))
    ctx = dict(
        header=header, bindings=kc.binding_text(), helpers=sorted(kc.helpers), wg=wg, units=units, hidden=hidden,
        steps=steps, batch=batch, row=row, rows=rows, reverse=bool(n.attrs["reverse"]), ku=CPU_UNROLL if cpu else GPU_UNROLL, shared=shared,
        uv=[(u, v) for u in range(units) for v in range(rows)], kind="fwd" if fwd else "bwd",
        has_state=bool(state and state[-1] is not None), out=loc.arena, at_out=at_out,
        at_w=lambda j, g, kk: a_w.at(kk, lane(j, g)),  # forward: w_t[k, g H + j] = W_hh[g H + j, k]
        at_wt=lambda j, r: a_w.at(r, j),  # backward: W_hh[r, j]
        at_c0=lambda b, j: state[-1].at(b, j),
    )
    if fwd:
        ctx.update(at_h0=lambda b, j: state[0].at(b, j), at_xw=lambda b, j, g: a_xw.at("t", b, lane(j, g)))
    else:
        ctx.update(at_y=lambda t, b, j, g: a_y.at(t, b, lane(j, g)), at_dy=lambda b, j, g: a_dy.at("t", b, lane(j, g)))
    return render("wgsl/lstm.wgsl.j2", **ctx), grid, kc


def _split(kc: KernelContext, fwd: bool, hidden: int, a_w: _Addr):
    """split_plan of the GPU set's kernel, its vec4 view of M bound in `kc` where it reads one
    (the CPU set's kernel binds it too: both variants must bind the same buffers)."""
    rows, cols = (hidden, 4 * hidden) if fwd else (4 * hidden, hidden)
    want = GPU_SPLIT_FWD if fwd else GPU_SPLIT_BWD
    if want is None:
        return None
    # vec4 loads need M row-major and read-only (a vec4 view is never bound read_write) at a
    # multiple of 4 floats
    plain = [list(d) for d in a_w.dims] == [[(rows, cols)] if rows > 1 else [], [(cols, 1)] if cols > 1 else []]
    vec_ok = plain and a_w.offset % 4 == 0 and kc.access.get(a_w.buf) == "read"
    sp = split_plan(rows, cols, want, vec_ok)
    if sp is not None and sp[1] == 4:
        kc.use(vec_alias(a_w.buf), write=False)
    return sp


def _render_split(sp, header, kc, n, fwd, steps, batch, hidden, a_w, state, at_out, lane, out, a_xw, a_ydy):
    """(WGSL, grid) of the GPU set's two-phase kernel (lstm_split.wgsl.j2), None where its split
    does not fit (the one-phase kernel then)."""
    rows, cols = (hidden, 4 * hidden) if fwd else (4 * hidden, hidden)
    ks, vw, ni, m, ku = sp
    wg = ni * ks
    units = -(-hidden // wg)
    if vw == 4:
        base = a_w.offset // 4
        at_m = lambda r, i: f"{vec_alias(a_w.buf)}[{f'{base}u + ' if base else ''}({r}) * {cols // 4}u + cq{f' + {i * ni}u' if i else ''}]"  # noqa: E731
    else:
        at_m = lambda r, i: a_w.at(r, f"cq + {i * ni}u" if i else "cq")  # noqa: E731
    nx = rows

    def psum(j: str, col: int) -> str:
        terms = [f"sh[{nx + g * cols + col}u + {j}]" for g in range(ks)]
        return terms[0] if ks == 1 else "(" + " + ".join(terms) + ")"

    grid, row = _grid(batch)
    _helpers(kc, ["tanh_f32"] + (["sigmoid_f32"] if fwd else []))
    ctx = dict(
        header=header, bindings=kc.binding_text(), helpers=sorted(kc.helpers), wg=wg, units=units, hidden=hidden,
        steps=steps, batch=batch, row=row, reverse=bool(n.attrs["reverse"]), kind="fwd" if fwd else "bwd",
        ks=ks, vw=vw, ni=ni, m=m, ku=ku, rs=rows // ks, cols=cols, nx=nx, at_m=at_m, psum=psum, out=out,
        has_state=bool(state and state[-1] is not None), at_out=at_out,
        at_c0=lambda b, j: state[-1].at(b, j),
    )
    if fwd:
        ctx.update(at_h0=lambda b, j: state[0].at(b, j), at_xw=lambda j, g: a_xw.at("t", "b", lane(j, g)))
    else:
        a_y, a_dy = a_ydy
        ctx.update(at_y=lambda t, b, j, g: a_y.at(t, b, lane(j, g)), at_dy=lambda b, j, g: a_dy.at("t", b, lane(j, g)))
    return render("wgsl/lstm_split.wgsl.j2", **ctx), grid
