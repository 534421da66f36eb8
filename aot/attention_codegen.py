"""Fused attention kernels (aot/ops/attention.py): one scheduled attention Kernel -> WGSL source.

Every kernel has the same shape. An invocation owns one row of one batch entry: a query row
(forward, dq) or a key row (dk, dv), whose vectors it keeps in registers as vec4s (zero-padded
past the head size). A workgroup holds G batch entries x BR rows (G > 1 only when the rows are
fewer than WG: short sequences would otherwise leave most invocations idle) and walks the other
side's rows in tiles of BT rows per batch entry, copied into workgroup memory. The last tile and
short heads are padded and masked; every global read is clamped into its tensor, so odd T and d
read nothing out of bounds.

- forward: online softmax over key tiles. Per tile, scores into workgroup scratch and their max
  m_t; m' = max(m, m_t); the running sum l and output o are rescaled by exp(m - m'), then
  o += exp(s - m') v. At the end O = o / l and lse = m + log(l). Writes O, lse or both.
- dq: delta_i = dO_i . O_i from its own rows (written out too where dk wants it: the sibling op
  attention_delta, alone a kernel of its own rows), then per key tile p = exp(s - lse_i),
  dp = dO_i . v_j, dq += p (dp - delta_i) k_j.
- dk: per query tile, the same p and dp with the roles swapped, dk += p (dp - delta_i) q_i.
- dv: per query tile, dv += p dO_i.
- dkv: dk and dv of the same key rows in one walk (schedule: OpDef.sibling), when both are
  wanted. The subgroup and CPU variants keep both accumulators in each invocation; the GPU
  kernel, where k, v, dk and dv would spill, has twice the invocations: one half computes P
  and dk, leaving P in workgroup memory, the other sums dv from it.
Causal masks skip whole tiles that no row of the workgroup sees. Sums run in a fixed order
(tiles ascending, rows ascending within a tile, no atomics), so results are reproducible.
The backward recomputes P as exp(s - lse) and dS as P (dO . v - delta): where a row is one-hot
at a huge score, an ulp between the forward's s and the backward's, or between dO . v and
delta = dO . O, is a percent of the gradient. So every kernel of an attention scores
(q * scale) . k and sums dO . v and dO . O in one order (render_attention, the templates'
dotacc and rowsums), each sum rounded where the shader compiler cannot reassociate it.

Adapters with subgroup operations (the package's "subgroup" kernel set) run a variant on the same
grid and bindings (attention_lanes.wgsl.j2): a group of LANES neighbouring invocations owns
LANE_ROWS rows, lane i keeping vec4s i, i + LANES, ... of each, so every vec4 read from workgroup
memory feeds LANE_ROWS rows and an invocation holds half the registers; the partial dot products
are summed across the group with subgroupShuffleXor (every lane ends with the same sums, bit for
bit).

This module renders text only; the schedule decides which ops share a kernel (the forward's O
and lse: OpDef.sibling).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .errors import CodegenError
from .ir import Tensor
from .matmul_codegen import LOOP_MAX, MAX_GROUPS_PER_DIM, MAX_INVOCATIONS, MAX_WORKGROUP_BYTES, split_index
from .plan import Plan
from .schedule import Kernel, KernelSchedule
from .templates import render, wgsl_f32
from .views import merge_subdims
from .wgsl_expr import KernelContext

WG = 64  # invocations per workgroup (at most; fewer for tiny problems)
TILE_ROWS = (32, 16, 8, 4, 2, 1)  # rows of the other side per tile, largest that fits first
# The GPU variants' inner loops (`python scripts/bench_attention.py --variants ...` times others).
# On an H100 (transformer_large's attention, fwd + dq + dk + dv, bench_attention_h100.json):
# dot() chains, one row a step 1486 us; 1 accumulator, 2 rows a step 1405 us; 2 or 4
# accumulators 1467-1525; scores kept in registers over a written-out tile 1533.
DOT_CHAINS = 1  # vec4 accumulators per dot product of two rows (0: a chain of dot() calls)
KEYS_PER_STEP = 2  # rows of the other side per step of the tile loops, written out (a power of two)
# The subgroup set's variants (attention_lanes.wgsl.j2): LANES lanes of a subgroup share
# LANE_ROWS rows, each lane holding 1/LANES of their columns, so a vec4 read from a tile feeds
# LANE_ROWS rows, each lane needs LANE_ROWS / LANES of a row's registers, and the partial dot
# products meet through shuffles. On an H100, same kernels as above (bench_attention_h100_lanes*.json):
# the GPU kernel 1396-1401 us; lanes x rows 2x2 1134-1146, 4x2 960-962 (kept), 2x1 983, 8x4
# 1033, 8x2 1088, 4x4 1148, 4x1 1266; 64 rows a workgroup beat 32 or 128 (1210-1226). The same
# design summing through workgroup memory and barriers instead of shuffles lost (1660-2347 us).
# The GPU set's dk+dv kernel keeps k, v, dk and dv of its row in one invocation up to this many
# floats (a head size of 32); larger heads split them over two invocations (render_attention).
# On an H100 (bench_attention.py lanes=1, bench_attention_h100_dkv_*.json), dk+dv in one
# invocation / split / dk and dv apart: head 64: 723 / 573 / 593 us; head 32: 323 / 496 / 467;
# head 16: 34 / 48 / 50.
DKV_ROW_FLOATS = 128
LANES = 4
LANE_ROWS = 2  # at most LANES; the workgroup has LANES / LANE_ROWS invocations a row
KIND = {"attention": "fwd", "attention_lse": "fwd", "attention_dq": "dq", "attention_delta": "delta",
        "attention_dk": "dk", "attention_dv": "dv"}
# the kernel of a group of ops (schedule._merge_attention): dq writes the delta it computes; dk and
# dv together walk the queries once; delta alone (dq not wanted) walks nothing
KINDS = {frozenset(["fwd"]): "fwd", frozenset(["dq"]): "dq", frozenset(["dq", "delta"]): "dq",
         frozenset(["delta"]): "delta", frozenset(["dk"]): "dk", frozenset(["dv"]): "dv",
         frozenset(["dk", "dv"]): "dkv"}


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _merge(subdims) -> tuple:
    return tuple(merge_subdims(subdims)) or ((1, 0),)


def _term(expr: str) -> str:
    return expr if expr.isidentifier() else f"({expr})"


@dataclass(frozen=True)
class Rows:
    """A tensor [..., T, C] (or [..., T]: C = 0) read from storage: its buffer, the offset of
    element 0 and the row-major sub-dims of the flat batch index, the row and the column."""

    buf: str
    offset: int
    batch: tuple
    row: tuple
    col: tuple
    cols: int
    start: str = ""  # a WGSL expression of `offset` (the CPU variant's offset table), or ""

    def row_base(self, b: str, r: str) -> str:
        """The address of element (b, r, 0)."""
        terms = (
            ([self.start] if self.start else [f"{self.offset}u"] if self.offset else [])
            + split_index(_term(b), self.batch)
            + split_index(_term(r), self.row)
        )
        return " + ".join(terms) or "0u"

    def col_term(self, c: int | str) -> str:
        """Address offset of column c (a Python int or a WGSL u32 expression), or ''."""
        if isinstance(c, int):
            off, inner = 0, 1
            for size, stride in reversed(self.col):
                off += (c // inner) % size * stride
                inner *= size
            return f"{off}u" if off else ""
        return " + ".join(split_index(_term(c), self.col))

    def at(self, base: str, c: int | str) -> str:
        t = self.col_term(c)
        return f"{self.buf}[{base} + {t}]" if t else f"{self.buf}[{base}]"


def _rows(s: KernelSchedule, plan: Plan, kc: KernelContext, t: Tensor, has_cols: bool = True) -> Rows:
    if id(t) not in s.views:
        raise CodegenError(f"attention operand {t.type_str()} is not stored (the schedule stores attention operands)")
    loc, dims = plan.read_loc(s, t)
    kc.use(loc.arena, write=False)
    kc.reads.append(s.views[id(t)].base)
    nb = 2 if has_cols else 1
    batch = _merge([sd for axis in dims[:-nb] for sd in axis])
    row = _merge(dims[-nb])
    col = _merge(dims[-1]) if has_cols else ((1, 0),)
    return Rows(loc.arena, loc.offset, batch, row, col, t.shape[-1] if has_cols else 0)


def _vec(op: Rows, base: str, c0: int | str) -> str:
    """vec4 of columns c0..c0+3 of a row (zeros past its `cols`), reading only inside the row."""
    comps = []
    for q in range(4):
        if isinstance(c0, int):
            c = c0 + q
            comps.append(op.at(base, c) if c < op.cols else "0.0")
        else:
            c = f"{c0} + {q}u" if q else c0
            if op.cols % 4 == 0:
                comps.append(op.at(base, c))
            else:
                comps.append(f"select(0.0, {op.at(base, f'min({c}, {op.cols - 1}u)')}, {c} < {op.cols}u)")
    return f"vec4<f32>({', '.join(comps)})"


def _tile_shape(nb: int, t_own: int, t_oth: int, vecs: int, scalars: int, scratch: bool) -> tuple[int, int, int, int]:
    """(BR, G, BT, workgroup bytes): rows per batch entry, batch entries per workgroup, tile rows.
    `scratch`: a float per own row and tile row besides (the forward's scores, dkv's P)."""
    br = min(WG, _pow2(t_own))
    g = max(1, min(WG // br, _pow2(nb)))
    # short rows put many batch entries in a workgroup, each with its own tiles: where even a
    # tile of one row each does not fit, fewer entries share the workgroup (single-query
    # attention pooling over many heads, say)
    while True:
        threads = g * br
        for bt in TILE_ROWS:
            if bt > _pow2(t_oth):
                continue
            words = g * bt * (4 * vecs + scalars) + (bt * threads if scratch else 0)
            if 4 * words <= MAX_WORKGROUP_BYTES:
                return br, g, bt, 4 * words
        if g == 1:
            raise CodegenError(f"attention: head rows of {vecs} vec4s do not fit workgroup memory")
        g //= 2


def render_attention(
    header: list[str], k: Kernel, s: KernelSchedule, plan: Plan, cpu: bool = False, subgroup: bool = False
) -> tuple[str, tuple[int, int, int], KernelContext]:
    """(WGSL source, grid, the kernel's binding/read record) for one attention kernel; `cpu`: the
    CPU adapters' variant on the same grid, which reads the other side one row at a time
    straight from storage (no workgroup memory and no barriers: a CPU adapter runs a workgroup
    as one loop over SIMD lanes, which each barrier splits, and its caches hold those rows),
    and where its operands and outputs start from its offset table (KernelContext.start): the
    same attention in every block of a model is then one text, compiled once. `subgroup`: the
    subgroup variant (the module doc), where the rows per workgroup and head sizes divide
    evenly among a group's lanes; otherwise the GPU kernel."""
    members = [m.node for m in k.group] + [k.node]
    kind = KINDS.get(frozenset(KIND[n.op] for n in members))
    if kind is None:
        raise CodegenError(f"attention kernel mixes {sorted({n.op for n in members})}")
    n0 = k.node  # the group's widest inputs (dk's beside dv)
    causal, scale = bool(n0.attrs["causal"]), float(n0.attrs["scale"])

    def times(scaled: bool) -> str:
        return f" * {wgsl_f32(scale)}" if scaled else ""

    kc = KernelContext(s, plan, None, table=cpu)
    ins = n0.inputs
    q, kk = ins[0], ins[1]
    lead = q.shape[:-2]
    nb = 1
    for d in lead:
        nb *= d
    tq, tk, d = q.shape[-2], kk.shape[-2], q.shape[-1]
    ops = {"q": _rows(s, plan, kc, q), "k": _rows(s, plan, kc, kk)} if kind != "delta" else {}
    if kind == "dv":
        ops["dout"] = _rows(s, plan, kc, ins[2])
        ops["lse"] = _rows(s, plan, kc, ins[3], has_cols=False)
    elif kind in ("dq", "dk", "dkv"):
        ops["v"] = _rows(s, plan, kc, ins[2])
        ops["dout"] = _rows(s, plan, kc, ins[3])
        ops["lse"] = _rows(s, plan, kc, ins[4], has_cols=False)
        if kind == "dq":  # O, whose rows give delta
            ops["o"] = _rows(s, plan, kc, ins[5])
        else:
            ops["delta"] = _rows(s, plan, kc, ins[5], has_cols=False)
    elif kind == "delta":
        ops["dout"] = _rows(s, plan, kc, ins[3])
        ops["o"] = _rows(s, plan, kc, ins[5])
    write_o = kind != "fwd" or any(n.op == "attention" for n in members)
    if kind == "fwd" and write_o:
        ops["v"] = _rows(s, plan, kc, ins[2])
    dv = ops["dout"].cols if "dout" in ops else ops["v"].cols if "v" in ops else 0
    d4, dv4 = _cdiv(d, 4), _cdiv(dv, 4)
    if cpu:  # where each operand starts: a field of the offset table
        ops = {name: replace(op, start=kc.start(op.buf, op.offset)) for name, op in ops.items()}

    # own rows (registers) and tiles (workgroup memory) per kind
    own_t, oth_t = (tq, tk) if kind in ("fwd", "dq", "delta") else (tk, tq)
    # Every kernel of an attention computes a score as (q * scale) . k with the same sums, bit for
    # bit: the backward's exp(s - lse) turns an ulp of a huge score into a percent of P. So the
    # query side is scaled wherever it sits: the own rows of fwd and dq, the tiles of dk and dv
    # (their dk accumulates dS (q * scale) and is stored unscaled).
    if kind == "delta":  # its own rows only
        tiles, scalar_tiles = [], []
    elif kind in ("fwd", "dq"):
        tiles = [("kt", "k", d4, False)] + ([("vt", "v", dv4, False)] if "v" in ops else [])
        scalar_tiles = []
    else:
        tiles = [("qt", "q", d4, True), ("ot", "dout", dv4, False)]
        scalar_tiles = [("lt", "lse")] + ([("dt", "delta")] if kind in ("dk", "dkv") else [])
    vecs = sum(n for _, _, n, _ in tiles)
    br, g, bt, wg_bytes = _tile_shape(nb, own_t, oth_t, vecs, len(scalar_tiles), kind == "fwd")
    lanes, group_rows = (LANES, LANE_ROWS) if subgroup else (1, 1)
    # a group's rows must share a batch entry (on both sides: the lanes' sums are the scores'
    # order, which the forward and backward kernels share), its lanes equal shares of a row
    short = min(WG, _pow2(min(tq, tk))) % group_rows
    if cpu or short or d4 % lanes or dv4 % lanes or g * br * lanes // group_rows > MAX_INVOCATIONS:
        lanes = group_rows = 1
    # the GPU kernel of dk and dv: where k, v, dk and dv would outgrow an invocation's registers,
    # one half of the invocations each, dv's reading P from the other's scratch (attention.wgsl.j2
    # `split`); rows per workgroup (the grid) as in every set
    split = kind == "dkv" and not cpu and lanes == 1 and 8 * (d4 + dv4) > DKV_ROW_FLOATS
    if split:
        _, _, bt, wg_bytes = _tile_shape(nb, own_t, oth_t, vecs, len(scalar_tiles), True)
    # one query a step in that kernel: its dk half holds k, v and dk (H100, bench_attention.py
    # lanes=1: 573 us a step of one, 681 of two, 593 for dk and dv apart)
    ku = 1 if split else min(KEYS_PER_STEP, bt)
    threads = g * br * (2 if split else 1)
    if threads > MAX_INVOCATIONS:
        raise CodegenError(f"attention: {threads} invocations per workgroup")
    row_blocks = _cdiv(own_t, br)
    n_wg = _cdiv(nb, g) * row_blocks
    gx = min(n_wg, MAX_GROUPS_PER_DIM)
    gy = _cdiv(n_wg, gx)
    if gy > MAX_GROUPS_PER_DIM:
        raise CodegenError(f"attention: {n_wg} workgroups exceed the WebGPU grid")

    # registers: the own row's vectors (scaled where the scores need it) and scalars
    own_src = {
        "fwd": [("q", "q", d4, True)],
        "dq": [("q", "q", d4, True), ("g", "dout", dv4, False), ("orow", "o", dv4, False)],
        "delta": [("g", "dout", dv4, False), ("orow", "o", dv4, False)],
        "dk": [("k", "k", d4, False), ("v", "v", dv4, False)],
        "dv": [("k", "k", d4, False)],
    }
    own_src["dkv"] = own_src["dk"]  # k and v, for dk's scores and dS
    own_src = own_src[kind]
    own = []
    bases = {}
    for var, src, n, scaled in own_src:
        op = ops[src]
        bases[src] = op.row_base("bc", "rc")
        vals = [_vec(op, f"{src}_row", 4 * i) for i in range(n)]
        if lanes > 1:  # per row rr of the group: this lane's vec4s (c * lanes + ln, column lc = 4 ln)
            vals = [
                [_vec(op, f"{src}_row{rr}", f"{4 * c * lanes}u + lc" if c else "lc") for c in range(n // lanes)]
                for rr in range(group_rows)
            ]
        rows_at = [op.row_base("bc", f"rci{rr}") for rr in range(group_rows)] if lanes > 1 else []
        own.append({"var": var, "src": src, "n": n, "vals": vals, "scaled": scaled, "bases": rows_at,
                    "chunk": _vec(op, f"{src}_row", "4u * c")})
    own_scalars = []
    if kind == "dq":
        if lanes > 1:
            rows_at = [f"{ops['lse'].buf}[{ops['lse'].row_base('bc', f'rci{rr}')}]" for rr in range(group_rows)]
            own_scalars.append(("lse_i", rows_at))
        else:
            bases["lse"] = ops["lse"].row_base("bc", "rc")
            own_scalars.append(("lse_i", f"{ops['lse'].buf}[{bases['lse']}]"))
    # delta = rowsum(dO * O) of the own row, which the template sums exactly as it sums dO . v
    # (dP): where a softmax row is one-hot, O is that key's v bit for bit, and dP - delta must
    # then be 0, not an ulp of |dO| |v| that dS carries into dq and dk times a huge score's q or k
    delta = kind in ("dq", "delta")

    tile_loads = []
    for arr, src, n, scaled in tiles:
        op = ops[src]
        c0 = 0 if n == 1 else "c0"
        tile_loads.append(
            {
                "arr": arr,
                "n": n,
                "total": g * bt * n,
                "base": op.row_base("bb", "rr"),
                "val": _vec(op, "src", c0) + times(scaled),
            }
        )
    scalar_loads = [
        {"arr": arr, "total": g * bt, "val": f"{ops[src].buf}[{ops[src].row_base('bb', 'rr')}]"}
        for arr, src in scalar_tiles
    ]
    # the CPU variant: row rr of this invocation's batch entry, its vec4 c (named like the tiles)
    rows = [
        {"arr": arr, "base": ops[src].row_base("bc", "rr"),
         "vals": [_vec(ops[src], f"{arr}_row", 4 * i) + times(scaled) for i in range(n)],
         "chunk": _vec(ops[src], f"{arr}_row", "4u * c") + times(scaled)}
        for arr, src, n, scaled in tiles
    ]
    # Each step of the CPU walk reads the other side's rows a vec4 an inner-loop step (a copy of
    # each access instead of one per vec4: lavapipe compiles each copy), unless the walk's loop
    # steps would pass LOOP_MAX (at most three inner loops a step, over the rows' vec4s).
    # (One choice for all kernels of the attention, the longer side's: the two walks sum a score
    # in different orders.)
    chunk_walk = max(tq, tk) * (1 + 2 * d4 + dv4) + 4 * max(d4, dv4) < LOOP_MAX
    scalar_rows = [(arr, f"{ops[src].buf}[{ops[src].row_base('bc', 'rr')}]") for arr, src in scalar_tiles]

    # accumulators (name, vec4s) and outputs: contiguous [batch, rows, cols] (lse: [batch, rows]),
    # each row-shaped one stored from its accumulator times its factor
    accs = {"fwd": [("o", dv4)], "dq": [("dq", d4)], "delta": [], "dk": [("dk", d4)], "dv": [("dv", dv4)]}
    accs["dkv"] = [("a", max(d4, dv4))] if split else accs["dk"] + accs["dv"]
    store_of = {"attention": ("o", " * inv"), "attention_dq": ("dq", " * " + wgsl_f32(scale)),
                "attention_dk": ("dk", ""), "attention_dv": ("dv", "")}
    stores = []
    for n in members:
        loc = plan.loc[id(n.out)]
        kc.use(loc.arena, write=True)
        cols = 0 if n.op in ("attention_lse", "attention_delta") else n.out.shape[-1]
        start = kc.start(loc.arena, loc.offset)
        acc_name, factor = store_of.get(n.op, ("", ""))
        stores.append({"op": n.op, "buf": loc.arena, "start": start + " + " if start else "", "cols": cols,
                       "acc": "a" if split else acc_name, "factor": factor, "half": int(n.op == "attention_dv")})
    if lanes > 1:
        vec4s = dict(accs[kind])
        for st in stores:
            if st["cols"]:
                st["cols_lane"] = 4 * vec4s[st["acc"]] // lanes  # the columns a lane stores of each row
        wgsl = render(
            "wgsl/attention_lanes.wgsl.j2",
            header=header, bindings=kc.binding_text(), one_buf=kc.bindings()[0][0], kind=kind, causal=causal, scale=wgsl_f32(scale),
            nb=nb, tq=tq, tk=tk, d=d, dv=dv, d4=d4, dv4=dv4, n_d=d4 // lanes, n_dv=dv4 // lanes,
            own_t=own_t, oth_t=oth_t, br=br, g=g, bt=bt, threads=g * br * lanes // group_rows, nrows=g * br,
            row_blocks=row_blocks,
            n_wg=n_wg, gx=gx, own=own, own_scalars=own_scalars, delta=delta, tiles=tile_loads,
            scalar_tiles=scalar_loads, stores=stores, write_o=write_o, accs=accs[kind], wg_bytes=wg_bytes,
            ku=ku, lanes=lanes, rows=group_rows, shifts=[1 << i for i in range(lanes.bit_length() - 1)], comps="xyzw",
        )
        return wgsl, (gx, gy, 1), kc
    wgsl = render(
        "wgsl/attention.wgsl.j2",
        header=header,
        bindings=kc.binding_text(),
        one_buf=kc.bindings()[0][0],
        chunk_walk=chunk_walk,
        # the CPU variant's pick functions: vec4 c of a row of so many
        pick_sizes=sorted({n for n in (d4, dv4) if n > 1}),
        kind=kind,
        causal=causal,
        scale=wgsl_f32(scale),
        nb=nb,
        tq=tq,
        tk=tk,
        d=d,
        dv=dv,
        d4=d4,
        dv4=dv4,
        own_t=own_t,
        oth_t=oth_t,
        br=br,
        g=g,
        bt=bt,
        threads=threads,
        nrows=g * br,
        split=split,
        row_blocks=row_blocks,
        n_wg=n_wg,
        gx=gx,
        own=own,
        own_scalars=own_scalars,
        delta=delta,
        bases=bases,
        tiles=tile_loads,
        scalar_tiles=scalar_loads,
        cpu=cpu,
        rows=rows,
        scalar_rows=scalar_rows,
        stores=stores,
        write_o=write_o,
        accs=accs[kind],
        wg_bytes=wg_bytes,
        chains=DOT_CHAINS,
        ku=ku,
        comps="xyzw",
    )
    return wgsl, (gx, gy, 1), kc
