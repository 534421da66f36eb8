"""Values of the WGSL subset as wasm (the wasm set's expression stage, used by wasm_lower's
statements and wasm_lanes' four-lane code): names and their types, the integers known at build
time (folded: the offset table, arrayLength, lets and unrolled loop indices), and expressions
emitted onto the wasm stack, calls written out in place.

WGSL's meanings kept: u32 and i32 pick unsigned and signed ops; f32 -> int conversions saturate;
integer division by 0 gives the dividend and remainder by 0 gives 0 (wasm would trap); select
evaluates both operands. Vectors (vecN<f32>, vecN<u32/i32>) are v128 with N lanes used. fma is a
product and a sum (wasm has no scalar fma; the CPU adapters' LLVM forms it or not as it likes, so
results already differ by that rounding between adapters). exp and log are aot's own helpers
(exp_f32, log_f32 of _helpers.wgsl.j2: no call out to JS in a row's loop); other builtin
transcendentals (sin, pow, ...) call JS's float64 Math and round once, at least as accurate as a
driver's.
"""

from __future__ import annotations

from .wasm_encode import F32, I32, V128
from .wasm_wgsl import Func, WasmUnsupported

SCALAR = ("f32", "i32", "u32", "bool")
WASM_TYPE = {"f32": F32, "i32": I32, "u32": I32, "bool": I32}
# JS Math functions a kernel may call (float64 in, float64 out), by WGSL name
MATH = {"exp": ("exp", 1), "log": ("log", 1), "sin": ("sin", 1), "cos": ("cos", 1), "tan": ("tan", 1),
        "tanh": ("tanh", 1), "pow": ("pow", 2), "exp2": ("exp2", 1), "log2": ("log2", 1), "atan": ("atan", 1),
        "atan2": ("atan2", 2), "asin": ("asin", 1), "acos": ("acos", 1), "sinh": ("sinh", 1), "cosh": ("cosh", 1)}
UNROLL = 8  # counted loops of up to this many steps are written out (Lower.unrolled)
LANES = {"x": 0, "y": 1, "z": 2, "w": 3, "r": 0, "g": 1, "b": 2, "a": 3}
BUILTIN_VEC = ("global_invocation_id", "workgroup_id", "local_invocation_id", "num_workgroups")
FLOAT_FNS = {"abs": "f32.abs", "floor": "f32.floor", "ceil": "f32.ceil", "trunc": "f32.trunc", "round": "f32.nearest",
             "sqrt": "f32.sqrt"}


def wtype(t) -> int:
    if isinstance(t, str) and t.startswith("vec"):
        return V128
    if t in WASM_TYPE:
        return WASM_TYPE[t]
    raise WasmUnsupported(f"a value of type {t}")


def elem(t: str) -> str:
    """vec4<f32> -> f32."""
    return t[5:-1]


def width(t: str) -> int:
    return int(t[3])


def concrete(t):
    return {"aint": "i32", "afloat": "f32"}.get(t, t) if isinstance(t, str) else t


def unify(a, b):
    """The type two operands of an arithmetic op share (abstract literals take the other's)."""
    if a == b:
        return a
    for x, y in ((a, b), (b, a)):
        if isinstance(x, str) and x.startswith("vec"):
            return x
        if x in ("aint", "afloat") and y not in ("aint", "afloat"):
            return y
    if {a, b} == {"aint", "afloat"}:
        return "afloat"
    raise WasmUnsupported(f"operands of types {a} and {b}")


class Binding:
    """Where a storage binding lives: its byte address and element type."""

    def __init__(self, address: int, elem_type: str, length: int, scale: int | None = None):
        self.address, self.elem, self.length = address, elem_type, length
        # bytes between elements i and i + 1: the element's size, or 4 for a vec4 view indexed
        # by floats (a matmul's unaligned row stores)
        self.scale = scale or (16 if elem_type.startswith("vec") else 4)


HELPER_FOR = {"exp": "exp_f32", "log": "log_f32"}
HELPER_DEPS = ["exp_f32", "log_f32", "is_nan_f32", "f32_bits"]


def helper_funcs() -> dict:
    from .templates import render
    from .wasm_wgsl import parse

    return parse(render("wgsl/_helpers.wgsl.j2", names=HELPER_DEPS)).funcs



class Values:
    """Expressions of one function's body: a mixin of wasm_lower.Lower (which has the scopes,
    labels, code and statements)."""

    def lookup(self, name: str):
        for s in reversed(self.scopes):
            if name in s:
                return s[name]
        if name in self.ctx.shader.consts:
            return ("const", self.ctx.shader.consts[name])
        if name in self.ctx.bindings:
            return ("binding", self.ctx.bindings[name])
        raise WasmUnsupported(f"the name {name!r}")

    def temp(self, t: int) -> int:
        return self.code.local(t)

    # ---- values known at build time ----
    def fold(self, e):
        """The value of an integer or bool expression known at build time (literals, the offset
        table, arrayLength, lets and unrolled loop indices of such), else None."""
        k = e[0]
        if k == "lit":
            return e[2] if e[1] in ("aint", "u32", "i32", "bool") else None
        if k == "name":
            v = self.lookup(e[1])
            return v[1] if v[0] == "cval" else self.fold(v[1]) if v[0] == "const" else None
        if k == "member" and e[1][0] == "name" and e[1][1] in self.ctx.shader.uniforms:
            struct = self.ctx.shader.structs[self.ctx.shader.uniforms[e[1][1]]]
            return self.ctx.offsets[struct.index(e[2])]
        if k == "call" and e[1] == "arrayLength":
            return self.lookup(e[3][0][1][1])[1].length
        if k == "call" and e[1] == "select":
            c = self.fold(e[3][2])
            return None if c is None else self.fold(e[3][1] if c else e[3][0])
        if k == "call" and e[1] in ("min", "max", "u32", "i32"):
            vals = [self.fold(a) for a in e[3]]
            if None in vals or self.type_of(e) not in ("u32", "i32", "aint"):
                return None
            return {"min": min, "max": max}[e[1]](vals) if e[1] in ("min", "max") else _wrap(vals[0], e[1])
        if k == "un":
            v = self.fold(e[2])
            if v is None:
                return None
            t = self.type_of(e)
            return (not v) if e[1] == "!" else _wrap(-v if e[1] == "-" else ~v, t)
        if k != "bin":
            return None
        op = e[1]
        if op in ("&&", "||"):
            a = self.fold(e[2])
            if a is None or (op == "&&" and a) or (op == "||" and not a):
                b = self.fold(e[3])
                return None if a is None or b is None else bool(b)
            return bool(a)
        t = self.type_of(e) if op not in ("==", "!=", "<", ">", "<=", ">=") else unify(self.type_of(e[2]), self.type_of(e[3]))
        if t not in ("u32", "i32", "aint"):
            return None
        a, b = self.fold(e[2]), self.fold(e[3])
        if a is None or b is None:
            return None
        if op in ("==", "!=", "<", ">", "<=", ">="):
            return {"==": a == b, "!=": a != b, "<": a < b, ">": a > b, "<=": a <= b, ">=": a >= b}[op]
        if op in ("/", "%"):
            if b == 0:
                return _wrap(a if op == "/" else 0, t)
            q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)  # toward zero
            return _wrap(q if op == "/" else a - q * b, t)
        if op in ("<<", ">>"):
            return _wrap(a << (b & 31) if op == "<<" else a >> (b & 31), t)
        return _wrap({"+": a + b, "-": a - b, "*": a * b, "&": a & b, "|": a | b, "^": a ^ b}[op], t)

    def linear(self, e) -> tuple:
        """(e less its constant term, that constant): x + 1u, x + (y + 2u), x + at.o3, ..."""
        value = self.fold(e)
        if value is not None and not isinstance(value, bool):
            return (None, value)
        if e[0] == "bin" and e[1] == "+" and self.type_of(e) in ("u32", "i32"):
            rest_a, k_a = self.linear(e[2])
            rest_b, k_b = self.linear(e[3])
            rest = rest_a if rest_b is None else rest_b if rest_a is None else ("bin", "+", rest_a, rest_b)
            return (rest, k_a + k_b)
        return (e, 0)

    def type_of(self, e):
        k = e[0]
        if k == "lit":
            return e[1]
        if k == "name":
            v = self.lookup(e[1])
            if v[0] in ("local", "cval", "vaff", "vvec", "pvar"):
                return v[2]
            if v[0] == "const":
                return self.type_of(v[1])
            if v[0] == "arr":
                return v[2]
            raise WasmUnsupported(f"{e[1]} as a value")
        if k == "bin":
            op = e[1]
            if op in ("==", "!=", "<", ">", "<=", ">=", "&&", "||"):
                return "bool"
            if op in ("<<", ">>"):
                return self.type_of(e[2])
            return unify(self.type_of(e[2]), self.type_of(e[3]))
        if k == "un":
            return "bool" if e[1] == "!" else self.type_of(e[2])
        if k == "index":
            base = e[1]
            if base[0] == "name":
                v = self.lookup(base[1])
                if v[0] == "binding":
                    return v[1].elem
                if v[0] == "arr":
                    return v[2][1]
            t = self.type_of(base)
            if isinstance(t, str) and t.startswith("vec"):
                return elem(t)
            raise WasmUnsupported("indexing a value")
        if k == "member":
            base = e[1]
            if base[0] == "name" and base[1] in self.ctx.shader.uniforms:
                return "u32"
            if base[0] == "name" and self.lookup(base[1])[0] == "vec3":
                return "u32"
            t = self.type_of(base)
            if len(e[2]) != 1:
                raise WasmUnsupported(f"the swizzle .{e[2]}")
            return elem(t)
        if k == "call":
            return self.call_type(e)
        if k == "addr":
            return "ptr"
        raise WasmUnsupported(f"expression {k}")

    def call_type(self, e):
        _, name, targs, args = e
        if name in ("vec2", "vec3", "vec4"):
            inner = targs[0] if targs else concrete(self.type_of(args[0])) if args else "f32"
            return f"{name}<{inner}>"
        if name == "bitcast":
            return targs[0]
        if name in ("f32", "i32", "u32", "bool"):
            return name
        if name == "array":
            return ("arr", targs[0], int(str(targs[1]).rstrip("iu")))
        if name in ("arrayLength", "countLeadingZeros", "countOneBits"):
            return "u32" if name == "arrayLength" else self.type_of(args[0])
        if name == "dot":
            return elem(self.type_of(args[0]))
        if name in self.ctx.shader.funcs:
            return self.ctx.shader.funcs[name].ret
        if name in self.ctx.special:
            return None
        if name == "select":
            return unify(self.type_of(args[0]), self.type_of(args[1]))
        t = self.type_of(args[0])
        for a in args[1:]:
            t = unify(t, self.type_of(a))
        if name in MATH or name in ("inverseSqrt", "sqrt", "fma", "floor", "ceil", "round", "trunc", "fract", "sign"):
            return "f32" if t in ("aint", "afloat") else t
        return t

    # ---- expressions ----
    def emit(self, e, want=None):
        """Emit e's value; as `want` where it is a literal or a scalar that a vector wants splatted.
        Returns the type left on the stack."""
        t = self.type_of(e)
        if isinstance(want, str) and want.startswith("vec") and isinstance(t, str) and not t.startswith("vec"):
            self.emit(e, elem(want))
            self.code.op("f32x4.splat" if elem(want) == "f32" else "i32x4.splat")
            return want
        if t in ("aint", "afloat"):
            t = want if want in SCALAR and want != "bool" else concrete(t)
        c = self.code
        k = e[0]
        value = self.fold(e) if k != "lit" and t in ("i32", "u32", "bool") else None
        if value is not None:  # known at build time: the offset table, `one`, unrolled loop indices
            self.const(t, value)
        elif k == "lit":
            self.const(t, e[2])
        elif k == "name":
            v = self.lookup(e[1])
            if v[0] == "cval":
                self.const(t, v[1])
            elif v[0] in ("local", "vaff"):  # vaff: lane 0's value (wasm_lanes)
                c.op("local.get", v[1])
            elif v[0] == "pvar":  # an invocation's value kept across barriers (wasm_phases)
                self.pvar_address(v)
                c.op("v128.load" if str(v[2]).startswith("vec") else "f32.load" if v[2] == "f32" else "i32.load", v[1])
            elif v[0] == "vvec":
                raise WasmUnsupported(f"{e[1]} differs between lanes here")
            else:  # a module-scope const
                self.emit(v[1], t)
        elif k == "bin":
            self.binary(e, t)
        elif k == "un":
            self.unary(e, t)
        elif k == "index":
            self.load(e)
        elif k == "member":
            self.member(e)
        elif k == "call":
            self.call(e, t)
        else:
            raise WasmUnsupported(f"expression {k}")
        return t

    def const(self, t, value) -> None:
        if t == "f32":
            self.code.op("f32.const", float(value))
        elif t in ("i32", "u32", "bool"):
            self.code.op("i32.const", int(value))
        else:
            raise WasmUnsupported(f"a literal of type {t}")

    def binary(self, e, t) -> None:
        _, op, a, b = e
        c = self.code
        folded = _fold(e)
        if folded is not None and t in ("f32", "i32", "u32"):  # WGSL evaluates these at build time
            return self.const(t, folded)
        if op in ("&&", "||"):
            self.emit(a, "bool")
            c.op("if", I32)
            if op == "&&":
                self.emit(b, "bool")
                c.op("else").op("i32.const", 0)
            else:
                c.op("i32.const", 1).op("else")
                self.emit(b, "bool")
            c.op("end")
            return
        if op in ("==", "!=", "<", ">", "<=", ">="):
            ot = concrete(unify(self.type_of(a), self.type_of(b)))
            self.emit(a, ot)
            self.emit(b, ot)
            if ot == "f32":
                c.op({"==": "f32.eq", "!=": "f32.ne", "<": "f32.lt", ">": "f32.gt", "<=": "f32.le", ">=": "f32.ge"}[op])
            elif ot in ("i32", "u32", "bool"):
                s = "_s" if ot == "i32" else "_u"
                c.op({"==": "i32.eq", "!=": "i32.ne"}.get(op) or "i32." + {"<": "lt", ">": "gt", "<=": "le", ">=": "ge"}[op] + s)
            else:
                raise WasmUnsupported(f"comparing {ot} values")
            return
        if op in ("<<", ">>"):
            self.emit(a, t)
            self.emit(b, "u32")
            c.op("i32.shl" if op == "<<" else "i32.shr_s" if t == "i32" else "i32.shr_u")
            return
        self.emit(a, t)
        if op in ("/", "%") and t in ("i32", "u32") and not (b[0] == "lit" and b[2] != 0):
            # WGSL: x / 0 is x, x % 0 is 0 (wasm traps): divide by 1 instead
            self.emit(b, t)
            tmp = self.temp(I32)
            c.op("local.tee", tmp).op("i32.const", 1).op("local.get", tmp).op("select")  # b if b != 0 else 1
        elif op == "%" and t == "f32":  # a - b trunc(a / b)
            ta, tb = self.temp(F32), self.temp(F32)
            c.op("local.set", ta)
            self.emit(b, t)
            c.op("local.set", tb)
            c.op("local.get", ta).op("local.get", ta).op("local.get", tb).op("f32.div").op("f32.trunc")
            c.op("local.get", tb).op("f32.mul").op("f32.sub")
            return
        else:
            self.emit(b, t)
        if t == "f32":
            c.op({"+": "f32.add", "-": "f32.sub", "*": "f32.mul", "/": "f32.div"}[op])
        elif t in ("i32", "u32", "bool"):
            s = "_s" if t == "i32" else "_u"
            c.op({"+": "i32.add", "-": "i32.sub", "*": "i32.mul", "&": "i32.and", "|": "i32.or", "^": "i32.xor",
                  "/": "i32.div" + s, "%": "i32.rem" + s}[op])
        elif t.startswith("vec"):
            pre = "f32x4." if elem(t) == "f32" else "i32x4."
            if pre == "i32x4." and op not in "+-*":
                raise WasmUnsupported(f"{op} on {t}")
            c.op(pre + {"+": "add", "-": "sub", "*": "mul", "/": "div"}[op])
        else:
            raise WasmUnsupported(f"{op} on {t}")

    def unary(self, e, t) -> None:
        _, op, a = e
        c = self.code
        if op == "!":
            self.emit(a, "bool")
            c.op("i32.eqz")
        elif op == "~":
            self.emit(a, t)
            c.op("i32.const", -1).op("i32.xor")
        elif a[0] == "lit" and t in ("f32", "i32", "u32"):
            self.const(t, -a[2])
        elif t == "f32":
            self.emit(a, t)
            c.op("f32.neg")
        elif t in ("i32", "u32"):
            c.op("i32.const", 0)
            self.emit(a, t)
            c.op("i32.sub")
        elif t.startswith("vec") and elem(t) == "f32":
            self.emit(a, t)
            c.op("f32x4.neg")
        else:
            raise WasmUnsupported(f"-{t}")

    def address(self, e) -> tuple[str, int, str]:
        """Push a binding element's byte offset; returns (load op, memarg offset, element type)."""
        base, index = e[1], e[2]
        v = self.lookup(base[1]) if base[0] == "name" else None
        if v is None or v[0] not in ("binding", "arr"):
            raise WasmUnsupported("indexing something other than a storage buffer or a local array")
        if v[0] == "binding":
            address, et, scale = v[1].address, v[1].elem, v[1].scale
        else:
            address, et, scale = v[1], v[2][1], 4
        vec4 = isinstance(et, str) and et.startswith("vec")
        load = "v128.load" if vec4 else "f32.load" if et == "f32" else "i32.load"
        rest, k = self.linear(index)
        if rest is None:
            self.code.op("i32.const", 0)
            return load, address + scale * k, et
        if k > 0:  # x + 3u: the constant goes into the load's offset
            index, address = rest, address + scale * k
        self.emit(index, "u32")
        self.code.op("i32.const", scale.bit_length() - 1).op("i32.shl")
        return load, address, et

    def neighbours(self, args) -> bool:
        """args are reads of one f32 buffer at i, i + 1, i + 2, i + 3 (as written)."""
        if not all(self.stored_f32(a) for a in args) or len({a[1] for a in args}) != 1:
            return False
        parts = [self.linear(a[2]) for a in args]
        return all(p[0] == parts[0][0] and p[1] == parts[0][1] + i for i, p in enumerate(parts))

    def stored_f32(self, e) -> bool:
        """e reads one f32 of a storage buffer or a local array."""
        if e[0] != "index" or e[1][0] != "name":
            return False
        v = self.lookup(e[1][1])
        return (v[0] == "binding" and v[1].elem == "f32") or (v[0] == "arr" and v[2][1] == "f32")

    def load(self, e) -> None:
        base = e[1]
        if base[0] == "name" and self.lookup(base[1])[0] in ("binding", "arr"):
            load, address, _ = self.address(e)
            self.code.op(load, address)
            return
        t = self.type_of(base)
        if e[2][0] != "lit":
            raise WasmUnsupported("a vector indexed by a run-time value")
        self.emit(base)
        self.code.op("f32x4.extract_lane" if elem(t) == "f32" else "i32x4.extract_lane", int(e[2][2]))

    def member(self, e) -> None:
        base, fld = e[1], e[2]
        c = self.code
        if base[0] == "name":
            v = self.lookup(base[1]) if base[1] not in self.ctx.shader.uniforms else ("uniform",)
            if v[0] == "vec3":
                c.op("local.get", v[1][LANES[fld]])
                return
            if v[0] == "uniform":
                struct = self.ctx.shader.structs[self.ctx.shader.uniforms[base[1]]]
                c.op("i32.const", self.ctx.offsets[struct.index(fld)])
                return
        t = self.type_of(base)
        self.emit(base)
        c.op("f32x4.extract_lane" if elem(t) == "f32" else "i32x4.extract_lane", LANES[fld])

    def call(self, e, t) -> None:
        _, name, targs, args = e
        c = self.code
        if name in self.ctx.special:  # a call a later stage writes itself (wasm_matmul's __store_lanes)
            return self.ctx.special[name](self, args)
        if name in HELPER_FOR and name not in self.ctx.shader.funcs:
            funcs = self.ctx.shader.funcs
            for hname, f in helper_funcs().items():
                funcs.setdefault(hname, f)
            return self.inline(funcs[HELPER_FOR[name]], args)
        if name in self.ctx.shader.funcs:
            return self.inline(self.ctx.shader.funcs[name], args)
        if name in ("vec2", "vec3", "vec4"):
            et = elem(t)
            if not args:
                c.op("v128.const", bytes(16))
            elif len(args) == 4 and et == "f32" and self.neighbours(args):
                _, address, _ = self.address(args[0])  # four neighbouring floats: one load
                c.op("v128.load", address)
            elif len(args) == 1 and et == "f32" and self.stored_f32(args[0]):
                _, address, _ = self.address(args[0])  # one broadcasting load
                c.op("v128.load32_splat", address)
            elif len(args) == 1 and not str(self.type_of(args[0])).startswith("vec"):
                self.emit(args[0], et)
                c.op("f32x4.splat" if et == "f32" else "i32x4.splat")
            elif len(args) == 1:
                self.emit(args[0])
            else:
                self.emit(args[0], et)
                c.op("f32x4.splat" if et == "f32" else "i32x4.splat")
                for lane, a in enumerate(args[1:], 1):
                    self.emit(a, et)
                    c.op("f32x4.replace_lane" if et == "f32" else "i32x4.replace_lane", lane)
            return
        if name in ("f32", "i32", "u32", "bool"):
            at = self.type_of(args[0])
            if at in ("aint", "afloat"):
                self.const(name, args[0][2] if args[0][0] == "lit" else 0) if args[0][0] == "lit" else self.emit(args[0], name)
                return
            self.emit(args[0])
            conv = {("f32", "i32"): "f32.convert_i32_s", ("f32", "u32"): "f32.convert_i32_u",
                    ("f32", "bool"): "f32.convert_i32_u", ("i32", "f32"): "i32.trunc_sat_f32_s",
                    ("u32", "f32"): "i32.trunc_sat_f32_u"}.get((name, at))
            if conv:
                c.op(conv)
            elif name == "bool" and at != "bool":
                c.op("i32.const", 0).op("i32.ne") if at != "f32" else c.op("f32.const", 0.0).op("f32.ne")
            return
        if name == "bitcast":
            at = self.emit(args[0])
            if at == "f32" and t in ("u32", "i32"):
                c.op("i32.reinterpret_f32")
            elif at in ("u32", "i32", "aint") and t == "f32":
                c.op("f32.reinterpret_i32")
            return
        if name == "select" and self.fold(args[2]) is not None:  # pick4(c, ...) with c known
            self.emit(args[1] if self.fold(args[2]) else args[0], t)
            return
        if name == "select":
            if t.startswith("vec"):
                self.emit(args[1], t)
                self.emit(args[0], t)
                self.emit(args[2], "bool")
                c.op("select.v128")
            else:
                self.emit(args[1], t)
                self.emit(args[0], t)
                self.emit(args[2], "bool")
                c.op("select")
            return
        if name == "arrayLength":
            c.op("i32.const", self.lookup(args[0][1][1])[1].length)
            return
        if name == "dot":
            vt = self.type_of(args[0])
            self.emit(args[0], vt)
            self.emit(args[1], vt)
            c.op("f32x4.mul")
            tmp = self.temp(V128)
            c.op("local.set", tmp)
            for lane in range(width(vt)):
                c.op("local.get", tmp).op("f32x4.extract_lane", lane)
                if lane:
                    c.op("f32.add")
            return
        if name == "fma" and t.startswith("vec") and self.ctx.library.relaxed:
            for a in args:  # relaxed_madd's a * b + c: fused or not, as the CPU does it fastest
                self.emit(a, t)
            c.op("f32x4.relaxed_madd")
            return
        if name == "fma":
            for a in args[:2]:
                self.emit(a, t)
            c.op("f32x4.mul" if t.startswith("vec") else "f32.mul")
            self.emit(args[2], t)
            c.op("f32x4.add" if t.startswith("vec") else "f32.add")
            return
        if name in ("min", "max", "clamp"):
            return self.minmax(name, args, t)
        if name == "countLeadingZeros":
            self.emit(args[0], t)
            c.op("i32.clz")
            return
        if name == "abs" and t in ("i32", "u32"):
            if t == "u32":
                self.emit(args[0], t)
                return
            tmp = self.temp(I32)
            self.emit(args[0], t)
            c.op("local.tee", tmp).op("i32.const", 0).op("local.get", tmp).op("i32.sub").op("local.get", tmp)
            c.op("i32.const", 0).op("i32.ge_s").op("select")
            return
        if t != "f32":
            raise WasmUnsupported(f"{name}() on {t}")
        if name in FLOAT_FNS:
            self.emit(args[0], "f32")
            c.op(FLOAT_FNS[name])
        elif name == "inverseSqrt":
            c.op("f32.const", 1.0)
            self.emit(args[0], "f32")
            c.op("f32.sqrt").op("f32.div")
        elif name == "fract":
            tmp = self.temp(F32)
            self.emit(args[0], "f32")
            c.op("local.tee", tmp).op("local.get", tmp).op("f32.floor").op("f32.sub")
        elif name == "sign":
            tmp = self.temp(F32)
            self.emit(args[0], "f32")
            c.op("local.set", tmp)
            # |x| > 0 ? copysign(1, x) : 0: sign(NaN) = 0 as the op's (torch.sign's; abs's
            # gradient at NaN), where copysign alone gives +-1 (special seed 5360015)
            c.op("f32.const", 1.0).op("local.get", tmp).op("f32.copysign").op("f32.const", 0.0)
            c.op("local.get", tmp).op("f32.abs").op("f32.const", 0.0).op("f32.gt").op("select")
        elif name in MATH:
            for a in args:
                self.emit(a, "f32")
                c.op("f64.promote_f32")
            c.op("call", self.ctx.library.math[name])
            c.op("f32.demote_f64")
        else:
            raise WasmUnsupported(f"the builtin {name}()")

    def inline(self, f: Func, args) -> None:
        """A call written out in place: V8 does not inline wasm calls, and a matmul's store_c ->
        epilogue -> max_nan -> is_nan_f32 chain per output cost more than its products."""
        c = self.code
        if len(self.inlining) > 16 or f.name in self.inlining:
            raise WasmUnsupported(f"recursion through {f.name}")
        params, given = {}, []
        for a, (pname, pt) in zip(args, f.params):
            value = self.fold(a) if pt in ("i32", "u32", "bool") else None
            if value is not None:
                params[pname] = ("cval", value, pt)
                continue
            self.emit(a, pt)
            params[pname] = ("local", c.local(wtype(pt)), pt)
            given.append(params[pname][1])
        for local in reversed(given):
            c.op("local.set", local)
        saved, self.scopes = self.scopes, [params]
        self.inlining.append(f.name)
        c.op("block", wtype(f.ret) if f.ret else None)
        self.labels.append(("ret", f.ret))
        self.stmts(f.body)
        if f.ret:
            c.op("unreachable")
        self.labels.pop()
        c.op("end")
        self.inlining.pop()
        self.scopes = saved

    def minmax(self, name, args, t) -> None:
        c = self.code
        if t.startswith("vec"):
            if name == "clamp" or elem(t) != "f32":
                raise WasmUnsupported(f"{name} on {t}")
            for a in args:
                self.emit(a, t)
            c.op("f32x4." + name)
            return
        if t == "f32":
            self.emit(args[0], t)
            self.emit(args[1], t)
            c.op("f32.max" if name == "clamp" else "f32." + name)
            if name == "clamp":
                self.emit(args[2], t)
                c.op("f32.min")
            return
        s = "_s" if t == "i32" else "_u"

        def pick(op):  # stack: a b -> min or max by `op`
            x, y = self.temp(I32), self.temp(I32)
            c.op("local.set", y).op("local.tee", x).op("local.get", y)
            c.op("local.get", x).op("local.get", y).op("i32." + op + s).op("select")

        self.emit(args[0], t)
        self.emit(args[1], t)
        pick("gt" if name in ("max", "clamp") else "lt")
        if name == "clamp":
            self.emit(args[2], t)
            pick("lt")

    # ---- statements ----


def _linear(e) -> tuple:
    """(e less its constant term, that constant) for sums written as x + 1u, x + (y + 2u), ..."""
    if e[0] == "lit" and e[1] in ("u32", "i32", "aint"):
        return (None, e[2])
    if e[0] == "bin" and e[1] == "+":
        rest_b, k_b = _linear(e[3])
        rest_a, k_a = _linear(e[2])
        if rest_b is None:
            return (rest_a, k_a + k_b)
        if rest_a is None:
            return (rest_b, k_a + k_b)
        return (("bin", "+", rest_a, rest_b), k_a + k_b)
    return (e, 0)


def _fold(e):
    """The value of an expression of abstract literals only (1.0 / 3.0), else None."""
    if e[0] == "lit":
        return e[2] if e[1] in ("afloat", "aint") else None
    if e[0] == "un" and e[1] == "-":
        v = _fold(e[2])
        return None if v is None else -v
    if e[0] != "bin" or e[1] not in ("+", "-", "*", "/"):
        return None
    a, b = _fold(e[2]), _fold(e[3])
    if a is None or b is None or (e[1] == "/" and (b == 0 or isinstance(a, int) and isinstance(b, int))):
        return None
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None}[e[1]]


def _wrap(v: int, t: str) -> int:
    """v as a u32 or i32 holds it (abstract ints as they are)."""
    if t == "u32":
        return v & 0xFFFFFFFF
    if t == "i32":
        v &= 0xFFFFFFFF
        return v - (1 << 32) if v >= 1 << 31 else v
    return v
