"""Matmuls of the wasm kernel set: a MatmulSpec -> WGSL of a register-blocked f32x4 product,
compiled by wasm_lower like every other kernel.

The CPU variant's matmul (matmul_cpu.wgsl.j2) is written for SIMD lanes across invocations, which
a wasm function running invocations one after another cannot use: its scalar code ran MNIST's
step at ~30 ms in node. Here each batch entry's operands are first copied into scratch in panels
(A: 4 rows interleaved, k-major; B: 8 columns, k-major; both zero-padded to whole panels,
through the spec's own addressing, so transposes, head splits and computed operands read as in
every other set), then each 4 x 8 block of C is summed over K in eight f32x4 accumulators (per K
row: two vector loads of B, four splats of A, eight multiply-adds), B's panel outermost so it
stays in cache while A's panels stream past. Outputs go through the kernel's own `store_c`, so
epilogues, accumulation and extra outputs are the WGSL's. The sum over K runs in order, a
product and an add per step, as the CPU variant's loop does.
"""

from __future__ import annotations

from .matmul_codegen import MatmulSpec, Operand, _address, _batch_expr, _out_index
from .templates import render
from .wasm_lanes import store_lanes
from .wasm_lower import function_index
from .wasm_values import Binding
from .wasm_wgsl import WasmUnsupported, parse

MR, NR = 4, 8  # a block of C: MR rows x NR columns (NR / 4 vectors): 8 f32x4 accumulators


def scratch_floats(spec: MatmulSpec) -> int:
    """Floats of scratch one product needs: A's and B's panels and a block of C."""
    mp, np_ = -(-spec.M // MR) * MR, -(-spec.N // NR) * NR
    return mp * spec.K + 4 + spec.K * np_ + MR * NR


def _read(op: Operand, batch: int, p: str, k: str, p_len: int, K: int, a_side: bool) -> str:
    """WGSL of element (p, k) of A (p a row) or (k, p) of B (p a column) of batch entry bi."""
    if op.fn:
        return f"{op.fn}(bi, {p}, {k})" if a_side else f"{op.fn}(bi, {k}, {p})"
    p_dims, k_dims = (op.dims("row", p_len), op.dims("col", K)) if a_side else (op.dims("col", p_len), op.dims("row", K))
    terms = _batch_expr(op, batch) + " + ".join(t for t in (_address(p, p_dims), _address(k, k_dims)) if t != "0u")
    return f"{op.buf}[{terms.rstrip(' +') or '0u'}]"


def _quads(op: Operand, a_side: bool, n: int, width: int) -> bool:
    """Whether the copy can move four neighbours at once: plain strides, 1 along p, whole panels."""
    if op.fn or op.row_dims or op.col_dims or n % width:
        return False
    return (op.row_stride if a_side else op.col_stride) == 1


def _walks_p(op: Operand, a_side: bool) -> bool:
    """Whether the operand is contiguous along its row (A) / column (B) index rather than K:
    then the copy's inner loop walks that index."""
    if op.fn or op.row_dims or op.col_dims:
        return False
    p_stride, k_stride = (op.row_stride, op.col_stride) if a_side else (op.col_stride, op.row_stride)
    return abs(p_stride) < abs(k_stride)


def _pack(p: str, n: int, padded: int, width: int, at: int, K: int, read: str, p_inner: bool, vector: bool) -> list[str]:
    """WGSL lines copying an operand's `n` rows (A) or columns (B) into panels of `width`, k-major,
    zeros past `n`; the inner loop walks k, or p where the operand is contiguous along p, and
    (`vector`: stride 1 along p, whole panels) copies four neighbours at once."""
    slot = f"{at}u + ({p} / {width}u) * {width * K}u + {p} % {width}u + k * {width}u"
    if vector:
        src = read[read.index("[") + 1 : -1]  # buf[index of (p, k)]: the index's four neighbours
        buf = read[: read.index("[")]
        quad = "vec4<f32>(" + ", ".join(f"{buf}[q + {j}u]" for j in range(4)) + ")"
        return [
            f"    for (var k = 0u; k < {K}u; k++) {{",
            f"        for (var {p} = 0u; {p} < {n}u; {p} += 4u) {{",
            f"            let q = {src};",
            f"            __mem4[({slot}) / 4u] = {quad};",
            "        }",
            "    }",
        ]
    if p_inner:
        return [
            f"    for (var k = 0u; k < {K}u; k++) {{",
            f"        for (var {p} = 0u; {p} < {n}u; {p}++) {{ __mem[{slot}] = {read}; }}",
            f"        for (var {p} = {n}u; {p} < {padded}u; {p}++) {{ __mem[{slot}] = 0.0; }}",
            "    }",
        ]
    return [
        f"    for (var {p} = 0u; {p} < {n}u; {p}++) {{",
        f"        for (var k = 0u; k < {K}u; k++) {{ __mem[{slot}] = {read}; }}",
        "    }",
        f"    for (var {p} = {n}u; {p} < {padded}u; {p}++) {{",
        f"        for (var k = 0u; k < {K}u; k++) {{ __mem[{slot}] = 0.0; }}",
        "    }",
    ]


def _k_row(r: int, indent: str) -> list[str]:
    """One K row of a block: two vectors of B's panel, four of A's values, eight multiply-adds."""
    return [
        *[f"{indent}let b{r}_{j} = __mem4[b + {r * NR // 4 + j}u];" for j in range(NR // 4)],
        *[f"{indent}let a{r}_{i} = vec4<f32>(__mem[a + {r * MR + i}u]);" for i in range(MR)],
        *[f"{indent}c{i}_{j} = fma(a{r}_{i}, b{r}_{j}, c{i}_{j});" for i in range(MR) for j in range(NR // 4)],
    ]


def plain_store(spec: MatmulSpec) -> bool:
    """C = A @ B as it is, nothing else: whole rows of a block are stored as vectors."""
    return spec.epilogue == "acc" and not spec.extra_stores and not spec.accumulate


def _stores(spec: MatmulSpec, ct: int, acc: list[str], lanes: bool) -> list[str]:
    """A block's outputs: through the kernel's store_c one by one (epilogues, extra outputs,
    edges), or, for a plain product, a whole block's rows as vector stores (`__c4`: C's buffer
    as vec4s at float positions)."""
    M, N = spec.M, spec.N
    one_by_one = [
        *[f"    __mem4[{ct // 4 + i * (NR // 4) + j}u] = c{i}_{j};" for i in range(MR) for j in range(NR // 4)],
        f"    for (var i = 0u; i < {MR}u; i++) {{",
        f"        for (var j = 0u; j < {NR}u; j++) {{",
        f"            if (m0 + i < {M}u && n0 + j < {N}u) {{",
        f"                store_c(__mem[{ct}u + i * {NR}u + j], bi, m0 + i, n0 + j);",
        "            }",
        "        }",
        "    }",
    ]
    if not plain_store(spec):
        if not lanes:
            return one_by_one
        # a whole block: each row's vectors through store_c's epilogue four columns at a time
        whole = [f"        __store_lanes(c{i}_{j}, bi, m0 + {i}u, n0 + {4 * j}u);" for i in range(MR) for j in range(NR // 4)]
        if M % MR == 0 and N % NR == 0:
            return ["    {", *whole, "    }"]
        return [f"    if (m0 + {MR}u <= {M}u && n0 + {NR}u <= {N}u) {{", *whole, "    } else {",
                *["    " + line for line in one_by_one], "    }"]
    start = spec.out_start or f"{spec.out_offset}u"
    rows = f"bi * {M}u + m0" if spec.batch > 1 else "m0"
    whole = [f"        let c = {start} + ({rows}) * {N}u + n0;"]
    whole += [f"        __c4[c + {i * N + 4 * j}u] = c{i}_{j};" for i in range(MR) for j in range(NR // 4)]
    if M % MR == 0 and N % NR == 0:
        return ["    {", *whole, "    }"]
    return [f"    if (m0 + {MR}u <= {M}u && n0 + {NR}u <= {N}u) {{", *whole, "    } else {",
            *["    " + line for line in one_by_one], "    }"]


def store_full_wgsl(spec: MatmulSpec) -> str:
    """store_c and its epilogue without the edge guard, as __store_full / __epilogue_full: what
    __store_lanes runs for four columns of a whole block (wasm_lanes)."""
    out_index = (spec.out_start + " + " + _out_index(spec, with_offset=False)) if spec.out_start else _out_index(spec)
    text = render("wgsl/_matmul_store.wgsl.j2", spec=spec, out_guard=False, out_index=out_index,
                  local_index=_out_index(spec, with_offset=False))
    return text.replace("store_c(", "__store_full(").replace("epilogue(", "__epilogue_full(")


def matmul_wgsl(spec: MatmulSpec, base: int, lanes: bool = True) -> str:
    """The functions of one product; scratch floats start at float index `base` of memory."""
    M, N, K = spec.M, spec.N, spec.K
    mp, np_ = -(-M // MR) * MR, -(-N // NR) * NR
    pa = base
    pb = pa + -(-mp * K // 4) * 4  # B's panels are read as vec4s: 16-byte aligned
    ct = pb + K * np_
    a = _read(spec.a, spec.batch, "m", "k", M, K, True)
    b = _read(spec.b, spec.batch, "n", "k", N, K, False)
    acc = [f"c{i}_{j}" for i in range(MR) for j in range(NR // 4)]
    lines = [
        "fn __mm_pack(bi: u32) {",
        *_pack("m", M, mp, MR, pa, K, a, _walks_p(spec.a, True), _quads(spec.a, True, M, MR)),
        *_pack("n", N, np_, NR, pb, K, b, _walks_p(spec.b, False), _quads(spec.b, False, N, NR)),
        "}",
        "",
        "fn __mm_block(bi: u32, m0: u32, n0: u32) {",
        *[f"    var {c} = vec4<f32>();" for c in acc],
        f"    var a = {pa}u + m0 * {K}u;",
        f"    var b = {pb // 4}u + (n0 / 4u) * {K}u;",
        # two K rows a loop step (the loop's own work halved), then the odd one
        f"    for (var k = 0u; k < {K - K % 2}u; k += 2u) {{",
        *_k_row(0, "        "),
        *_k_row(1, "        "),
        f"        a += {2 * MR}u;",
        f"        b += {2 * NR // 4}u;",
        "    }",
        *(_k_row(0, "    ") if K % 2 else []),
        *_stores(spec, ct, acc, lanes),
        "}",
        "",
        "fn __matmul() {",
        f"    for (var bi = 0u; bi < {spec.batch}u; bi++) {{",
        "        __mm_pack(bi);",
        f"        for (var n0 = 0u; n0 < {np_}u; n0 += {NR}u) {{",
        f"            for (var m0 = 0u; m0 < {mp}u; m0 += {MR}u) {{",
        "                __mm_block(bi, m0, n0);",
        "            }",
        "        }",
        "    }",
        "}",
    ]
    return "\n".join(line for line in lines if line != "")


def matmul_function(ctx, spec: MatmulSpec, base: int) -> int:
    """The kernel function (grid params unused) of the product; `base`: its scratch's float index."""
    assert base % 4 == 0, "the panels are read as vec4s: 16-byte aligned"
    try:
        return _function(ctx, spec, base, lanes=True)
    except WasmUnsupported:  # an epilogue the lanes cannot run: one output at a time
        ctx.func_index.pop("__matmul", None)
        return _function(ctx, spec, base, lanes=False)


def _function(ctx, spec: MatmulSpec, base: int, lanes: bool) -> int:
    from .wasm_encode import I32, Code

    text = matmul_wgsl(spec, base, lanes) + ("\n" + store_full_wgsl(spec) if lanes and not plain_store(spec) else "")
    extra = parse(text)
    ctx.shader.funcs.update(extra.funcs)
    ctx.special["__store_lanes"] = store_lanes
    ctx.bindings["__mem"] = Binding(0, "f32", 1 << 30)
    ctx.bindings["__mem4"] = Binding(0, "vec4<f32>", 1 << 28)
    out = ctx.bindings[spec.out_buf]
    ctx.bindings["__c4"] = Binding(out.address, "vec4<f32>", out.length, scale=4)
    code = Code([I32, I32, I32])
    code.op("call", function_index(ctx, "__matmul"))
    return ctx.library.function([I32, I32, I32], [], code)
