"""WebAssembly binary encoding: LEB128, instructions by name, and a module of sections.

The "wasm" kernel set's stages (wasm_wgsl.py parses, wasm_lower.py lowers, wasm_build.py
assembles) write their code through `Code` and `Module` here, so this is the one place that
knows opcode bytes. Only what those stages use is listed: the MVP's integer and f32 ops, a few
f64 ops (exp/log calls go through JS's float64 Math), bulk memory, saturating truncations and
the 128-bit SIMD ops of f32x4 / i32x4 code. The module imports one memory ("env", "memory"),
so the page owns it and sees every arena as a typed-array view.
"""

from __future__ import annotations

import struct

I32, I64, F32, F64, V128 = 0x7F, 0x7E, 0x7D, 0x7C, 0x7B
VOID = 0x40  # an empty block type

# plain one-byte opcodes
OPS = {
    "unreachable": 0x00, "nop": 0x01, "else": 0x05, "end": 0x0B, "return": 0x0F, "drop": 0x1A, "select": 0x1B,
    "i32.eqz": 0x45, "i32.eq": 0x46, "i32.ne": 0x47, "i32.lt_s": 0x48, "i32.lt_u": 0x49, "i32.gt_s": 0x4A,
    "i32.gt_u": 0x4B, "i32.le_s": 0x4C, "i32.le_u": 0x4D, "i32.ge_s": 0x4E, "i32.ge_u": 0x4F,
    "f32.eq": 0x5B, "f32.ne": 0x5C, "f32.lt": 0x5D, "f32.gt": 0x5E, "f32.le": 0x5F, "f32.ge": 0x60,
    "i32.clz": 0x67, "i32.ctz": 0x68, "i32.popcnt": 0x69, "i32.add": 0x6A, "i32.sub": 0x6B, "i32.mul": 0x6C,
    "i32.div_s": 0x6D, "i32.div_u": 0x6E, "i32.rem_s": 0x6F, "i32.rem_u": 0x70, "i32.and": 0x71, "i32.or": 0x72,
    "i32.xor": 0x73, "i32.shl": 0x74, "i32.shr_s": 0x75, "i32.shr_u": 0x76,
    "f32.abs": 0x8B, "f32.neg": 0x8C, "f32.ceil": 0x8D, "f32.floor": 0x8E, "f32.trunc": 0x8F, "f32.nearest": 0x90,
    "f32.sqrt": 0x91, "f32.add": 0x92, "f32.sub": 0x93, "f32.mul": 0x94, "f32.div": 0x95, "f32.min": 0x96,
    "f32.max": 0x97, "f32.copysign": 0x98,
    "f64.add": 0xA0, "f64.sub": 0xA1, "f64.mul": 0xA2, "f64.div": 0xA3,
    "i32.trunc_f32_s": 0xA8, "i32.trunc_f32_u": 0xA9, "f32.convert_i32_s": 0xB2, "f32.convert_i32_u": 0xB3,
    "f32.demote_f64": 0xB6, "f64.promote_f32": 0xBB, "i32.reinterpret_f32": 0xBC, "f32.reinterpret_i32": 0xBE,
}
# 0xFC-prefixed: saturating truncations (WGSL's f32 -> int conversions saturate too), bulk memory
FC = {"i32.trunc_sat_f32_s": 0, "i32.trunc_sat_f32_u": 1, "memory.copy": 10, "memory.fill": 11}
# 0xFD-prefixed SIMD
SIMD = {
    "v128.load": 0x00, "v128.load32_splat": 0x09, "v128.store": 0x0B, "v128.const": 0x0C,
    "i32x4.splat": 0x11, "f32x4.splat": 0x13, "i32x4.extract_lane": 0x1B, "i32x4.replace_lane": 0x1C,
    "f32x4.extract_lane": 0x1F, "f32x4.replace_lane": 0x20,
    "v128.and": 0x4E, "v128.or": 0x50, "v128.xor": 0x51, "v128.bitselect": 0x52,
    "f32x4.eq": 0x41, "f32x4.lt": 0x43, "f32x4.gt": 0x44,
    "i32x4.add": 0xAE, "i32x4.sub": 0xB1, "i32x4.mul": 0xB5,
    "f32x4.abs": 0xE0, "f32x4.neg": 0xE1, "f32x4.sqrt": 0xE3, "f32x4.add": 0xE4, "f32x4.sub": 0xE5,
    "f32x4.mul": 0xE6, "f32x4.div": 0xE7, "f32x4.min": 0xE8, "f32x4.max": 0xE9,
    "f32x4.relaxed_madd": 0x105,
    "i32x4.eq": 0x37, "i32x4.ne": 0x38, "i32x4.lt_s": 0x39, "i32x4.lt_u": 0x3A, "i32x4.gt_s": 0x3B,
    "i32x4.gt_u": 0x3C, "i32x4.le_s": 0x3D, "i32x4.le_u": 0x3E, "i32x4.ge_s": 0x3F, "i32x4.ge_u": 0x40,
    "f32x4.ne": 0x42, "f32x4.le": 0x45, "f32x4.ge": 0x46, "v128.not": 0x4D,
    "f32x4.ceil": 0x67, "f32x4.floor": 0x68, "f32x4.trunc": 0x69, "f32x4.nearest": 0x6A,
    "i32x4.abs": 0xA0, "i32x4.neg": 0xA1, "i32x4.shl": 0xAB, "i32x4.shr_s": 0xAC, "i32x4.shr_u": 0xAD,
    "i32x4.min_s": 0xB6, "i32x4.min_u": 0xB7, "i32x4.max_s": 0xB8, "i32x4.max_u": 0xB9,
    "i32x4.trunc_sat_f32x4_s": 0xF8, "i32x4.trunc_sat_f32x4_u": 0xF9,
    "f32x4.convert_i32x4_s": 0xFA, "f32x4.convert_i32x4_u": 0xFB,
}
MEM = {"i32.load": 0x28, "f32.load": 0x2A, "i32.store": 0x36, "f32.store": 0x38}
ALIGN = {"i32.load": 2, "f32.load": 2, "i32.store": 2, "f32.store": 2, "v128.load": 4, "v128.store": 4, "v128.load32_splat": 2}


def uleb(n: int) -> bytes:
    if n < 0:
        raise ValueError(f"uleb of a negative number {n}")
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def sleb(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        done = (n == 0 and not b & 0x40) or (n == -1 and b & 0x40)
        out.append(b | (0 if done else 0x80))
        if done:
            return bytes(out)


def name_bytes(s: str) -> bytes:
    b = s.encode()
    return uleb(len(b)) + b


def vec(items: list[bytes]) -> bytes:
    return uleb(len(items)) + b"".join(items)


class Code:
    """One function body under construction: its locals (after the params) and its instructions."""

    def __init__(self, params: list[int]):
        self.params = list(params)
        self.locals: list[int] = []
        self.buf = bytearray()

    def local(self, t: int) -> int:
        self.locals.append(t)
        return len(self.params) + len(self.locals) - 1

    def op(self, name: str, *imm) -> "Code":
        b = self.buf
        if name in OPS:
            b.append(OPS[name])
        elif name in ("block", "loop", "if"):
            b += bytes([{"block": 0x02, "loop": 0x03, "if": 0x04}[name], imm[0] if imm and imm[0] is not None else VOID])
        elif name in ("br", "br_if", "call"):
            b += bytes([{"br": 0x0C, "br_if": 0x0D, "call": 0x10}[name]]) + uleb(imm[0])
        elif name in ("local.get", "local.set", "local.tee"):
            b += bytes([{"local.get": 0x20, "local.set": 0x21, "local.tee": 0x22}[name]]) + uleb(imm[0])
        elif name == "i32.const":
            b += b"\x41" + sleb(_s32(imm[0]))
        elif name == "f32.const":
            b += b"\x43" + struct.pack("<f", imm[0])
        elif name == "f64.const":
            b += b"\x44" + struct.pack("<d", imm[0])
        elif name == "select.v128":  # a typed select (the untyped one takes only number types)
            b += b"\x1c\x01" + bytes([V128])
        elif name in MEM:
            b += bytes([MEM[name]]) + uleb(ALIGN[name]) + uleb(imm[0] if imm else 0)
        elif name in FC:
            b += b"\xfc" + uleb(FC[name]) + (b"\x00\x00" if name == "memory.copy" else b"\x00" if name == "memory.fill" else b"")
        elif name in SIMD:
            b += b"\xfd" + uleb(SIMD[name])
            if name in ALIGN:
                b += uleb(ALIGN[name]) + uleb(imm[0] if imm else 0)
            elif name == "v128.const":
                b += bytes(imm[0])
            elif name.endswith("_lane"):
                b.append(imm[0])
        else:
            raise KeyError(f"wasm_encode: no opcode {name!r}")
        return self

    def body(self) -> bytes:
        groups: list[list[int]] = []  # runs of one type
        for t in self.locals:
            if groups and groups[-1][0] == t:
                groups[-1][1] += 1
            else:
                groups.append([t, 1])
        decl = vec([uleb(n) + bytes([t]) for t, n in groups])
        code = decl + bytes(self.buf) + b"\x0b"
        return uleb(len(code)) + code


def _s32(v: int) -> int:
    """An i32 immediate as the signed value LEB128 encodes (u32 constants wrap)."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


class Module:
    """Function imports (module "m"), one imported memory, functions and their exports."""

    def __init__(self):
        self.types: list[bytes] = []
        self.imports: list[tuple[str, int]] = []  # (name, type index)
        self.funcs: list[tuple[int, Code]] = []
        self.exports: list[tuple[str, int]] = []

    def type_index(self, params: list[int], results: list[int]) -> int:
        t = b"\x60" + vec([bytes([p]) for p in params]) + vec([bytes([r]) for r in results])
        if t not in self.types:
            self.types.append(t)
        return self.types.index(t)

    def import_func(self, name: str, params: list[int], results: list[int]) -> int:
        """Imports come first in the function index space: call before any add_func."""
        assert not self.funcs, "imports before functions"
        self.imports.append((name, self.type_index(params, results)))
        return len(self.imports) - 1

    def add_func(self, params: list[int], results: list[int], code: Code, export: str | None = None) -> int:
        self.funcs.append((self.type_index(params, results), code))
        index = len(self.imports) + len(self.funcs) - 1
        if export:
            self.exports.append((export, index))
        return index

    def reserve(self, params: list[int], results: list[int]) -> int:
        """A function index whose body is set later (set_body): recursion-free call graphs in any order."""
        return self.add_func(params, results, Code(params))

    def set_body(self, index: int, code: Code) -> None:
        t, _ = self.funcs[index - len(self.imports)]
        self.funcs[index - len(self.imports)] = (t, code)

    def encode(self, min_pages: int) -> bytes:
        def section(sid: int, payload: bytes) -> bytes:
            return bytes([sid]) + uleb(len(payload)) + payload

        imports = [name_bytes("m") + name_bytes(n) + b"\x00" + uleb(t) for n, t in self.imports]
        imports.append(name_bytes("env") + name_bytes("memory") + b"\x02\x00" + uleb(min_pages))
        out = b"\x00asm\x01\x00\x00\x00"
        out += section(1, vec(self.types))
        out += section(2, vec(imports))
        out += section(3, vec([uleb(t) for t, _ in self.funcs]))
        out += section(7, vec([name_bytes(n) + b"\x00" + uleb(i) for n, i in self.exports]))
        out += section(10, vec([c.body() for _, c in self.funcs]))
        return out
