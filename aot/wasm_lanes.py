"""Four invocations at once: a kernel's `main` lowered with f32x4 / i32x4 lanes (the wasm set's
vectoriser, beside wasm_lower's one-invocation-at-a-time code).

Elementwise and row kernels (elementwise.wgsl.j2, reduce.wgsl.j2's one-invocation rows) start
`let i = gid.x + gid.y * ROW; if (i >= N) { return; }` and use only `i` after that. Here `i`
takes four neighbouring values per step (the last N % 4 run one at a time as before), and every
value is one of: uniform (the same in all lanes: one scalar), affine (lane k is base + k * stride,
the base a scalar: `i`, `i % 64u`, `at.o0 + i`), or varying (a v128). A read at an affine index
of stride 1 is one v128 load and a store one v128 store; a uniform index one scalar load;
anything else gathers lane by lane. `i / 64u` of an aligned group is uniform, so broadcast
operands (a bias row) are read once per step. A kernel with control flow that differs between
lanes (an if on a varying condition, a loop with varying bounds) is left to wasm_lower
(WasmUnsupported here), as is one that reads its builtins after the guard.
"""

from __future__ import annotations

from math import gcd

from .wasm_encode import I32, V128, Code
from .wasm_lower import Lower, _has
from .wasm_values import FLOAT_FNS, HELPER_FOR, MATH, concrete, helper_funcs, unify, wtype
from .wasm_wgsl import WasmUnsupported

U = ("u", 0, 0)  # uniform; ("aff", stride, mult): lane k = base + k * stride, base a multiple of mult; ("vec",)
VEC = ("vec",)
CMP = {"==": "eq", "!=": "ne", "<": "lt", ">": "gt", "<=": "le", ">=": "ge"}


def lanes_kernel(ctx, fallback: int) -> int | None:
    """A function of the grid running `main` four invocations a step, or None where its shape is
    not the guarded flat index (callers keep the one-at-a-time kernel `fallback`)."""
    main = ctx.shader.funcs["main"]
    head = guard(main)
    if head is None:
        return None
    name, n, rest = head
    builtins = set(main.attrs["builtins"])
    if _uses(rest, builtins) or n < 4:
        return None
    low = Lanes(ctx, main)
    c = low.code = Code([I32, I32, I32])
    x = c.local(I32)
    c.op("i32.const", 0).op("local.set", x)
    c.op("block").op("loop")
    c.op("local.get", x).op("i32.const", n - n % 4).op("i32.ge_u").op("br_if", 1)
    low.labels += ["", ""]
    low.scopes = [{name: ("vaff", x, "u32", 1, 4)}]
    low.vstmts(rest)
    low.labels = low.labels[:-2]
    c.op("local.get", x).op("i32.const", 4).op("i32.add").op("local.set", x)
    c.op("br", 0).op("end").op("end")
    if n % 4:  # the last ones, one invocation at a time, as wasm_lower writes them
        tail = Lower(ctx, main)
        tail.code = c
        for k in range(n - n % 4, n):
            tail.scopes = [{name: ("cval", k, "u32")}]
            c.op("block")
            tail.labels = ["inv"]
            tail.stmts(rest)
            c.op("end")
    return ctx.library.function([I32, I32, I32], [], c)


def guard(main) -> tuple | None:
    """(index name, N, the statements after the guard) of `let i = gid.x + gid.y * R; if (i >= N) { return; }`."""
    body = main.body
    if len(body) < 2 or body[0][0] != "let" or body[1][0] != "if":
        return None
    _, name, _, value = body[0]
    gid = [p for p, b in main.attrs["builtins"].items() if b == "global_invocation_id"]
    if not gid or main.attrs.get("workgroup_size", [1])[1:] != [1, 1]:
        return None
    g = gid[0]
    if not (value[0] == "bin" and value[1] == "+" and value[2] == ("member", ("name", g), "x")):
        return None
    y = value[3]
    if not (y[0] == "bin" and y[1] == "*" and y[2] == ("member", ("name", g), "y") and y[3][0] == "lit"):
        return None
    _, cond, then, other = body[1]
    if other or then != [("return", None)] or cond[0] != "bin" or cond[1] != ">=" or cond[2] != ("name", name):
        return None
    if cond[3][0] != "lit":
        return None
    return name, int(cond[3][2]), body[2:]


def _uses(node, names: set) -> bool:
    if isinstance(node, tuple):
        if len(node) == 2 and node[0] == "name" and node[1] in names:
            return True
        return any(_uses(x, names) for x in node)
    if isinstance(node, list):
        return any(_uses(x, names) for x in node)
    return False


class Lanes(Lower):
    """Lower with values that differ between four lanes (the module doc)."""

    # ---- what varies ----
    def kind(self, e) -> tuple:
        k = e[0]
        if k == "lit" or (k != "call" and self.fold(e) is not None):
            return U
        if k == "name":
            v = self.lookup(e[1])
            if v[0] == "vaff":
                return ("aff", v[3], v[4])
            return VEC if v[0] == "vvec" else U
        if k == "member":
            if e[1][0] == "name" and e[1][1] in self.ctx.shader.uniforms:
                return U
            return U if self.kind(e[1]) == U else VEC
        if k == "index":
            return U if self.kind(e[2]) == U else VEC
        if k == "un":
            return U if self.kind(e[2]) == U else VEC
        if k == "call" and e[1] == "arrayLength":  # a build-time constant (fold)
            return U
        if k == "call":
            kinds = [self.kind(a) for a in e[3]]
            return U if all(x == U for x in kinds) else VEC
        if k != "bin":
            raise WasmUnsupported(f"expression {k} in lanes")
        op, a, b = e[1], self.kind(e[2]), self.kind(e[3])
        if a == U and b == U:
            return U
        t = self.type_of(e)
        if t not in ("u32", "i32") or VEC in (a, b):
            return VEC
        (sa, ma), (sb, mb) = self._am(e[2], a), self._am(e[3], b)
        cb = self.fold(e[3])
        if op in ("+", "-"):
            return ("aff", sa + sb if op == "+" else sa - sb, gcd(ma, mb))
        if op == "*" and (cb is not None or self.fold(e[2]) is not None):
            c = cb if cb is not None else self.fold(e[2])
            s, m = (sa, ma) if cb is not None else (sb, mb)
            return ("aff", s * c, m * c)
        if op in ("/", "%") and t == "u32" and cb is not None and cb > 0 and sb == 0 and sa > 0:  # (i32: signs)
            block = 4 * sa  # lanes base .. base + 3 sa stay in one block of cb when both divide
            if cb % block == 0 and ma % block == 0:
                return U if op == "/" else ("aff", sa, gcd(ma, cb))
        if op == "<<" and cb is not None:
            return ("aff", sa << cb, ma << cb)
        return VEC

    def _am(self, e, k) -> tuple:
        """(stride, mult) of an affine or uniform operand (a uniform's base: its value's divisors)."""
        if k[0] == "aff":
            return k[1], k[2]
        c = self.fold(e)
        return 0, (abs(c) if c else 0) if c is not None else 1

    # ---- vectors ----
    def vemit(self, e, t) -> None:
        """Leave e's four lanes as a v128 of t's lanes (bool: masks of 0 / -1)."""
        c = self.code
        k = self.kind(e)
        t = concrete(t)
        if k[0] in ("u", "aff"):
            st = "u32" if t == "bool" and k != U else t
            self.emit(e, st)
            c.op("f32x4.splat" if t == "f32" else "i32x4.splat")
            if t == "bool":
                c.op("i32x4.neg")  # 1 -> -1: a mask
            elif k[0] == "aff" and k[1]:
                c.op("v128.const", b"".join((j * k[1] & 0xFFFFFFFF).to_bytes(4, "little") for j in range(4)))
                c.op("i32x4.add")
            return
        kind = e[0]
        if kind == "name":
            c.op("local.get", self.lookup(e[1])[1])
        elif kind == "index":
            self.vload(e)
        elif kind == "un":
            if e[1] == "!":
                self.vemit(e[2], "bool")
                c.op("v128.not")
            elif e[1] == "~":
                self.vemit(e[2], t)
                c.op("v128.not")
            else:
                self.vemit(e[2], t)
                c.op("f32x4.neg" if t == "f32" else "i32x4.neg")
        elif kind == "bin":
            self.vbinary(e, t)
        elif kind == "call":
            self.vcall(e, t)
        else:
            raise WasmUnsupported(f"{kind} in lanes")

    def vbinary(self, e, t) -> None:
        c = self.code
        _, op, a, b = e
        if op in ("&&", "||"):
            self.vemit(a, "bool")
            self.vemit(b, "bool")
            c.op("v128.and" if op == "&&" else "v128.or")
            return
        if op in CMP:
            ot = concrete(unify(self.type_of(a), self.type_of(b)))
            self.vemit(a, ot)
            self.vemit(b, ot)
            if ot == "f32":
                c.op("f32x4." + CMP[op])
            else:
                name = CMP[op] + ("" if op in ("==", "!=") else "_s" if ot == "i32" else "_u")
                c.op("i32x4." + name)
            return
        if op in ("<<", ">>") and self.kind(b) == U:
            self.vemit(a, t)
            self.emit(b, "u32")
            c.op("i32x4.shl" if op == "<<" else "i32x4.shr_s" if t == "i32" else "i32x4.shr_u")
            return
        if t == "f32" and op in "+-*/":
            self.vemit(a, t)
            self.vemit(b, t)
            c.op({"+": "f32x4.add", "-": "f32x4.sub", "*": "f32x4.mul", "/": "f32x4.div"}[op])
            return
        if t in ("u32", "i32", "bool") and op in ("+", "-", "*", "&", "|", "^"):
            self.vemit(a, t)
            self.vemit(b, t)
            c.op({"+": "i32x4.add", "-": "i32x4.sub", "*": "i32x4.mul", "&": "v128.and", "|": "v128.or",
                  "^": "v128.xor"}[op])
            return
        self.per_lane(e, t)

    def per_lane(self, e, t) -> None:
        """An op with no lane-wise form (integer division, float %): one lane at a time."""
        c = self.code
        args = [e[2], e[3]] if e[0] == "bin" else e[3]
        ts = [concrete(unify(self.type_of(e[2]), self.type_of(e[3])))] * 2 if e[0] == "bin" else \
            [concrete(self.type_of(a)) if self.type_of(a) not in ("aint", "afloat") else t for a in args]
        held = []
        for a, at in zip(args, ts):
            self.vemit(a, at)
            held.append((c.local(V128), at))
            c.op("local.set", held[-1][0])
        out = c.local(V128)
        c.op("v128.const", bytes(16)).op("local.set", out)
        names = [f"__lane{j}" for j in range(len(args))]
        one = ("bin", e[1], ("name", names[0]), ("name", names[1])) if e[0] == "bin" else ("call", e[1], e[2], [("name", n) for n in names])
        for lane in range(4):
            scope = {}
            for (local, at), n in zip(held, names):
                tmp = c.local(wtype(at))
                c.op("local.get", local).op("f32x4.extract_lane" if at == "f32" else "i32x4.extract_lane", lane)
                c.op("local.set", tmp)
                scope[n] = ("local", tmp, at)
            c.op("local.get", out)
            self.scopes.append(scope)
            Lower.emit(self, one, t)
            self.scopes.pop()
            c.op("f32x4.replace_lane" if t == "f32" else "i32x4.replace_lane", lane)
            c.op("local.set", out)
        c.op("local.get", out)

    def vload(self, e) -> None:
        c = self.code
        k = self.kind(e[2])
        base = e[1]
        v = self.lookup(base[1]) if base[0] == "name" else None
        if v is None or v[0] != "binding" or str(v[1].elem).startswith("vec"):
            raise WasmUnsupported("a lane read of something other than a storage buffer of scalars")
        if k[0] == "aff" and k[1] == 1:
            load, address, _ = self.address(e)  # lane 0's address: four neighbours
            c.op("v128.load", address)
            return
        self.vemit(e[2], "u32")  # gather
        idx = c.local(V128)
        c.op("local.set", idx)
        et = v[1].elem
        out = c.local(V128)
        c.op("v128.const", bytes(16)).op("local.set", out)
        for lane in range(4):
            c.op("local.get", out)
            c.op("local.get", idx).op("i32x4.extract_lane", lane).op("i32.const", 2).op("i32.shl")
            c.op("f32.load" if et == "f32" else "i32.load", v[1].address)
            c.op("f32x4.replace_lane" if et == "f32" else "i32x4.replace_lane", lane).op("local.set", out)
        c.op("local.get", out)

    def vcall(self, e, t) -> None:
        c = self.code
        _, name, targs, args = e
        if name in HELPER_FOR and name not in self.ctx.shader.funcs:
            for hname, f in helper_funcs().items():
                self.ctx.shader.funcs.setdefault(hname, f)
            name = HELPER_FOR[name]
        if name in self.ctx.shader.funcs:
            return self.vinline(self.ctx.shader.funcs[name], args, t)
        if name == "select":
            if self.kind(args[2]) == U:
                self.vemit(args[1], t)
                self.vemit(args[0], t)
                self.emit(args[2], "bool")
                c.op("select.v128")
            else:
                self.vemit(args[1], t)
                self.vemit(args[0], t)
                self.vemit(args[2], "bool")
                c.op("v128.bitselect")
            return
        if name in ("f32", "i32", "u32"):
            at = concrete(self.type_of(args[0]))
            self.vemit(args[0], at)
            conv = {("f32", "i32"): "f32x4.convert_i32x4_s", ("f32", "u32"): "f32x4.convert_i32x4_u",
                    ("i32", "f32"): "i32x4.trunc_sat_f32x4_s", ("u32", "f32"): "i32x4.trunc_sat_f32x4_u"}.get((name, at))
            if conv:
                c.op(conv)
            elif at == "bool":
                c.op("i32x4.neg")  # a mask -1 -> 1
                if name == "f32":
                    c.op("f32x4.convert_i32x4_u")
            return
        if name == "bitcast":
            self.vemit(args[0], concrete(self.type_of(args[0])))
            return
        if name in ("min", "max", "clamp"):
            if t == "f32":
                self.vemit(args[0], t)
                self.vemit(args[1], t)
                c.op("f32x4.max" if name == "clamp" else "f32x4." + name)
                if name == "clamp":
                    self.vemit(args[2], t)
                    c.op("f32x4.min")
                return
            s = "_s" if t == "i32" else "_u"
            self.vemit(args[0], t)
            self.vemit(args[1], t)
            c.op(("i32x4.max" if name == "clamp" else "i32x4." + name) + s)
            if name == "clamp":
                self.vemit(args[2], t)
                c.op("i32x4.min" + s)
            return
        if name == "fma":
            for a in args[:2]:
                self.vemit(a, t)
            c.op("f32x4.mul")
            self.vemit(args[2], t)
            c.op("f32x4.add")
            return
        if t == "f32" and name in FLOAT_FNS:
            self.vemit(args[0], "f32")
            c.op({"abs": "f32x4.abs", "floor": "f32x4.floor", "ceil": "f32x4.ceil", "trunc": "f32x4.trunc",
                  "round": "f32x4.nearest", "sqrt": "f32x4.sqrt"}[name])
            return
        if t == "f32" and name == "inverseSqrt":
            c.op("v128.const", b"\x00\x00\x80\x3f" * 4)
            self.vemit(args[0], "f32")
            c.op("f32x4.sqrt").op("f32x4.div")
            return
        if name == "abs" and t == "i32":
            self.vemit(args[0], t)
            c.op("i32x4.abs")
            return
        if name in MATH or name in ("countLeadingZeros", "sign", "fract", "abs"):
            return self.per_lane(e, t)
        raise WasmUnsupported(f"{name}() in lanes")

    def vinline(self, f, args, t) -> None:
        """A call written out in place with lanes: each parameter uniform, affine or varying as its argument."""
        c = self.code
        if len(self.inlining) > 16 or f.name in self.inlining:
            raise WasmUnsupported(f"recursion through {f.name}")
        if f.ret is None or str(f.ret).startswith("vec"):
            raise WasmUnsupported(f"a call of {f.name} in lanes")
        params = {}
        for a, (pname, pt) in zip(args, f.params):
            k = self.kind(a)
            if k == U:
                value = self.fold(a) if pt in ("i32", "u32", "bool") else None
                if value is not None:
                    params[pname] = ("cval", value, pt)
                    continue
                self.emit(a, pt)
                params[pname] = ("local", c.local(wtype(pt)), pt)
            elif k[0] == "aff":
                self.emit(a, pt)
                params[pname] = ("vaff", c.local(I32), pt, k[1], k[2])
            else:
                self.vemit(a, pt)
                params[pname] = ("vvec", c.local(V128), pt)
            c.op("local.set", params[pname][1])
        saved, self.scopes = self.scopes, [params]
        self.inlining.append(f.name)
        c.op("block", V128)
        self.labels.append(("vret", f.ret))
        self.vstmts(f.body)
        c.op("unreachable")
        self.labels.pop()
        c.op("end")
        self.inlining.pop()
        self.scopes = saved

    # ---- statements ----
    def vstmts(self, body: list) -> None:
        self.scopes.append({})
        for s in body:
            self.vstmt(s)
        self.scopes.pop()

    def vstmt(self, s) -> None:
        c = self.code
        k = s[0]
        if k in ("let", "var"):
            _, name, ty, value = s
            if isinstance(ty, tuple):
                raise WasmUnsupported("a local array in lanes")
            t = concrete(ty or self.type_of(value))
            kind = self.kind(value) if value is not None else U
            if k == "let" and kind == U:
                return self.stmt(s)
            if k == "let" and kind[0] == "aff":
                self.emit(value, t)
                local = c.local(I32)
                c.op("local.set", local)
                self.scopes[-1][name] = ("vaff", local, t, kind[1], kind[2])
                return
            local = c.local(V128)
            if value is not None:
                self.vemit(value, t)
                c.op("local.set", local)
            self.scopes[-1][name] = ("vvec", local, t)
        elif k == "assign":
            _, lhs, op, rhs = s
            value = rhs if op == "=" else ("bin", op[:-1], lhs, rhs)
            if lhs[0] == "name":
                v = self.lookup(lhs[1])
                if v[0] == "vvec":
                    self.vemit(value, v[2])
                    c.op("local.set", v[1])
                elif v[0] == "local" and self.kind(value) == U:
                    self.stmt(s)
                else:
                    raise WasmUnsupported(f"{lhs[1]} set to values that differ between lanes")
            elif lhs[0] == "index":
                ik = self.kind(lhs[2])
                if not (ik[0] == "aff" and ik[1] == 1):
                    raise WasmUnsupported("a lane store at other than neighbouring elements")
                load, address, et = self.address(lhs)
                if str(et).startswith("vec"):
                    raise WasmUnsupported("a lane store of vectors")
                self.vemit(value, et)
                c.op("v128.store", address)
            else:
                raise WasmUnsupported("this assignment in lanes")
        elif k == "if":
            if self.kind(s[1]) != U:
                raise WasmUnsupported("an if whose condition differs between lanes")
            if self.fold(s[1]) is not None:
                taken = s[2] if self.fold(s[1]) else s[3]
                if taken:
                    self.vstmts(taken)
                return
            self.emit(s[1], "bool")
            c.op("if")
            self.labels.append("")
            self.vstmts(s[2])
            if s[3]:
                c.op("else")
                self.vstmts(s[3])
            self.labels.pop()
            c.op("end")
        elif k == "for":
            self.vfor(s)
        elif k == "return":
            target = next((x for x in reversed(self.labels) if isinstance(x, tuple)), None)
            if target is None or target[0] != "vret":
                raise WasmUnsupported("a return in lanes")
            self.vemit(s[1], target[1])
            c.op("br", self.depth(target))
        elif k == "block":
            self.vstmts(s[1])
        elif k == "expr":
            raise WasmUnsupported("a call statement in lanes")
        else:
            raise WasmUnsupported(f"{k} in lanes")

    def vfor(self, s) -> None:
        c = self.code
        _, init, cond, update, body = s
        un = self.unrolled(s)
        if un is not None:
            name, values, t = un
            if _has(body, "continue"):
                raise WasmUnsupported("continue in lanes")
            for v in values:
                self.scopes.append({name: ("cval", v, t)})
                self.vstmts(body)
                self.scopes.pop()
            return
        if _has(body, "continue") or _has(body, "break"):
            raise WasmUnsupported("break or continue in lanes")
        self.scopes.append({})
        if init:
            if self.kind(init[3]) != U:
                raise WasmUnsupported("a loop whose start differs between lanes")
            self.stmt(init)
        if cond is not None and self.kind(cond) != U:
            raise WasmUnsupported("a loop whose bound differs between lanes")
        c.op("block").op("loop")
        self.labels += ["brk", ""]
        if cond:
            self.emit(cond, "bool")
            c.op("i32.eqz").op("br_if", 1)
        self.vstmts(body)
        if update:
            if update[0] != "assign" or update[1][0] != "name" or self.lookup(update[1][1])[0] != "local":
                raise WasmUnsupported("a loop update in lanes")
            self.stmt(update)
        c.op("br", 0).op("end").op("end")
        self.labels = self.labels[:-2]
        self.scopes.pop()


__all__ = ["lanes_kernel", "store_lanes"]


def store_lanes(low: Lower, args) -> None:
    """__store_lanes(acc: vec4<f32>, bi, row, col) (wasm_matmul): __store_full for columns col ..
    col + 3 of a whole block (col a multiple of 4), the epilogue in lanes."""
    c = low.code
    f = low.ctx.shader.funcs["__store_full"]
    held = []
    for a, t in zip(args, ("vec4<f32>", "u32", "u32", "u32")):
        low.emit(a, t)
        held.append(c.local(wtype(t)))
    for local in reversed(held):
        c.op("local.set", local)
    names = [p for p, _ in f.params]
    lanes = Lanes(low.ctx, f)
    lanes.code, lanes.inlining = c, low.inlining
    lanes.scopes = [{names[0]: ("vvec", held[0], "f32"), names[1]: ("local", held[1], "u32"),
                     names[2]: ("local", held[2], "u32"), names[3]: ("vaff", held[3], "u32", 1, 4)}]
    lanes.vstmts(f.body)
