"""wasm_wgsl's AST -> WebAssembly function bodies (the wasm set's second stage): statements,
control flow and the kernel driver; expressions are wasm_values'.

One kernel's `main` becomes a function of its grid (gx, gy, gz) that walks every workgroup and
every invocation in order, the body inside a block that `return` leaves; the functions it calls
are written out in place (V8 does not inline wasm calls). Storage bindings are arenas at fixed
addresses of the one linear memory (a read of `buf[i]` is a load at base + 4 i), the offset
table `at` and arrayLength are the build's constants. Counted loops whose index picks registers
(`for (var c = 0u; c < 4u; c += one)` over vec4s chosen by select) are written out, so the
picks fold away.
"""

from __future__ import annotations

from .wasm_encode import F64, I32, Code, Module
from .wasm_values import BUILTIN_VEC, HELPER_FOR, LANES, MATH, UNROLL, Values, concrete, elem, wtype
from .wasm_wgsl import Func, Shader, WasmUnsupported


class ShaderContext:
    """What the functions of one kernel resolve names against (built by wasm_build)."""

    def __init__(self, shader: Shader, bindings: dict, offsets: list, library: "Library"):
        self.shader, self.bindings, self.offsets, self.library = shader, bindings, offsets, library
        self.func_index: dict[str, int] = {}  # this kernel's functions, compiled on first call
        self.special: dict = {}  # name -> fn(lower, args): calls written by a later stage, returning nothing


class Library:
    """The module's functions: imports of JS Math, and function bodies shared by their bytes."""

    def __init__(self, module: Module, math_names: list[str], scratch, relaxed: bool = False):
        self.module = module
        self.relaxed = relaxed  # vector fma as relaxed-simd's f32x4.relaxed_madd
        self.math = {n: module.import_func(n, [F64] * MATH[n][1], [F64]) for n in math_names}
        self.by_bytes: dict[tuple, int] = {}
        self.scratch = scratch  # bytes -> address (local arrays live in memory)

    def function(self, params: list[int], results: list[int], code: Code) -> int:
        key = (tuple(params), tuple(results), code.body())
        if key not in self.by_bytes:
            self.by_bytes[key] = self.module.add_func(params, results, code)
        return self.by_bytes[key]


# Builtins computed by aot's own WGSL helpers (_helpers.wgsl.j2, about 1 ulp) rather than a call

def math_calls(shader: Shader) -> set[str]:
    """The JS Math functions a kernel's text calls (the builder imports them before any function)."""
    found = set()

    def walk(node):
        if isinstance(node, tuple):
            if node and node[0] == "call" and node[1] in MATH and node[1] not in shader.funcs and node[1] not in HELPER_FOR:
                found.add(node[1])
            for x in node:
                walk(x)
        elif isinstance(node, list):
            for x in node:
                walk(x)

    for f in shader.funcs.values():
        walk(f.body)
    return found


def function_index(ctx: ShaderContext, name: str) -> int:
    if name not in ctx.func_index:
        f = ctx.shader.funcs[name]
        low = Lower(ctx, f)
        low.function()
        ctx.func_index[name] = ctx.library.function(low.param_types, low.results, low.code)
    return ctx.func_index[name]


def kernel_function(ctx: ShaderContext) -> int:
    """The kernel's `main` as a function of the grid (gx, gy, gz)."""
    main = ctx.shader.funcs.get("main")
    if main is None:
        raise WasmUnsupported("no fn main")
    if ctx.shader.workgroup:
        raise WasmUnsupported(f"module-scope var<workgroup> {next(iter(ctx.shader.workgroup))} (workgroup memory between barriers)")
    low = Lower(ctx, main)
    low.kernel()
    return ctx.library.function([I32, I32, I32], [], low.code)


class Lower(Values):
    """One function's body: expressions typed and emitted, statements and control flow."""

    def __init__(self, ctx: ShaderContext, f: Func):
        self.ctx, self.f = ctx, f
        self.scopes: list[dict] = [{}]
        self.labels: list[str] = []  # the kind of each enclosing block: "brk", "cont", "inv", ""
        self.inlining: list[str] = []  # the functions being written out in place (inline)

    # ---- entry points ----
    def function(self) -> None:
        self.param_types = [wtype(t) for _, t in self.f.params]
        self.results = [wtype(self.f.ret)] if self.f.ret else []
        self.code = Code(self.param_types)
        for i, (name, t) in enumerate(self.f.params):
            self.scopes[0][name] = ("local", i, t)
        self.stmts(self.f.body)
        if self.f.ret:
            self.code.op("unreachable")

    def kernel(self) -> None:
        c = self.code = Code([I32, I32, I32])
        X, Y, Z = self.f.attrs.get("workgroup_size") or (1, 1, 1)
        grid = [0, 1, 2]
        w = [c.local(I32) for _ in range(3)]
        lid = [c.local(I32) if n > 1 else None for n in (X, Y, Z)]
        names = {}
        for pname, builtin in self.f.attrs["builtins"].items():
            names[pname] = builtin
        vals: dict[str, list] = {}
        # builtins, each (x, y, z) locals or one local, set per invocation
        for pname, b in names.items():
            if b in BUILTIN_VEC:
                vals[pname] = [c.local(I32) for _ in range(3)]
                self.scopes[0][pname] = ("vec3", vals[pname])
            elif b == "local_invocation_index":
                vals[pname] = [c.local(I32)]
                self.scopes[0][pname] = ("local", vals[pname][0], "u32")
            else:
                raise WasmUnsupported(f"the builtin {b}")

        def counted(local, bound_get, body):
            c.op("i32.const", 0).op("local.set", local)
            c.op("block").op("loop")
            c.op("local.get", local)
            bound_get()
            c.op("i32.ge_u").op("br_if", 1)
            self.labels += ["", ""]
            body()
            self.labels = self.labels[:-2]
            c.op("local.get", local).op("i32.const", 1).op("i32.add").op("local.set", local)
            c.op("br", 0).op("end").op("end")

        def invocation():
            for pname, b in names.items():
                v = vals[pname]
                for d in range(3 if b in BUILTIN_VEC else 1):
                    size = (X, Y, Z)[d]
                    if b == "workgroup_id":
                        c.op("local.get", w[d])
                    elif b == "num_workgroups":
                        c.op("local.get", grid[d])
                    elif b == "local_invocation_id":
                        _get_or_zero(c, lid[d])
                    elif b == "global_invocation_id":
                        c.op("local.get", w[d])
                        if size > 1:
                            c.op("i32.const", size).op("i32.mul")
                            c.op("local.get", lid[d]).op("i32.add")
                    else:  # local_invocation_index
                        _get_or_zero(c, lid[2])
                        c.op("i32.const", Y).op("i32.mul")
                        _get_or_zero(c, lid[1])
                        c.op("i32.add").op("i32.const", X).op("i32.mul")
                        _get_or_zero(c, lid[0])
                        c.op("i32.add")
                    c.op("local.set", v[d])
            c.op("block")
            self.labels.append("inv")
            self.stmts(self.f.body)
            self.labels.pop()
            c.op("end")

        def nest(dims):
            if not dims:
                return invocation()
            kind, d = dims[0]
            if kind == "w":
                counted(w[d], lambda: c.op("local.get", grid[d]), lambda: nest(dims[1:]))
            elif lid[d] is None:
                nest(dims[1:])
            else:
                n = (X, Y, Z)[d]
                counted(lid[d], lambda: c.op("i32.const", n), lambda: nest(dims[1:]))

        nest([("w", 2), ("w", 1), ("w", 0), ("l", 2), ("l", 1), ("l", 0)])

    # ---- names ----
    def unrolled(self, s):
        """(index name, its values, type) of a for loop worth writing out: a counted loop of at
        most UNROLL steps known at build time, whose body neither breaks nor sets the index (the
        kernels' `for (var c = 0u; c < 4u; c += one)` over vec4 registers, picked by select)."""
        _, init, cond, update, body = s
        if not (init and init[0] == "var" and init[3] is not None and cond and update) or _has(body, "break"):
            return None
        name = init[1]
        start = self.fold(init[3])
        if start is None or cond[0] != "bin" or cond[2] != ("name", name) or cond[1] not in ("<", "<="):
            return None
        self.scopes.append({name: ("cval", start, concrete(init[2] or self.type_of(init[3])))})
        try:
            end = self.fold(cond[3])
            step = None
            if update[0] == "assign" and update[1] == ("name", name):
                if update[2] == "+=":
                    step = self.fold(update[3])
                elif update[2] == "=" and update[3][0] == "bin" and update[3][1] == "+" and update[3][2] == ("name", name):
                    step = self.fold(update[3][3])
        finally:
            self.scopes.pop()
        if end is None or not step or step <= 0 or _assigns(body, name) or not _picks(body, name):
            return None
        values = list(range(start, end + (1 if cond[1] == "<=" else 0), step))
        if not values or len(values) > UNROLL:
            return None
        return name, values, concrete(init[2] or self.type_of(init[3]))

    # ---- types ----
    def stmts(self, body: list) -> None:
        self.scopes.append({})
        for s in body:
            self.stmt(s)
        self.scopes.pop()

    def depth(self, kind: str) -> int:
        for i, k in enumerate(reversed(self.labels)):
            if k == kind:
                return i
        raise WasmUnsupported(f"{kind} outside a loop")

    def stmt(self, s) -> None:
        c = self.code
        k = s[0]
        if k in ("let", "var"):
            _, name, ty, value = s
            if isinstance(ty, tuple) or (value is not None and self.type_of(value).__class__ is tuple):
                return self.local_array(name, ty, value)
            t = concrete(ty or self.type_of(value))
            if k == "let" and t in ("i32", "u32", "bool") and self.fold(value) is not None:
                self.scopes[-1][name] = ("cval", self.fold(value), t)
                return
            local = c.local(wtype(t))
            if value is not None:
                self.emit(value, t)
                c.op("local.set", local)
            self.scopes[-1][name] = ("local", local, t)
        elif k == "assign":
            self.assign(s)
        elif k == "if" and self.fold(s[1]) is not None:
            taken = s[2] if self.fold(s[1]) else s[3]
            if taken:
                self.stmts(taken)
        elif k == "if":
            self.emit(s[1], "bool")
            c.op("if")
            self.labels.append("")
            self.stmts(s[2])
            if s[3]:
                c.op("else")
                self.stmts(s[3])
            self.labels.pop()
            c.op("end")
        elif k == "for" and self.unrolled(s) is not None:
            name, values, t = self.unrolled(s)
            cont = _has(s[4], "continue")
            for v in values:
                self.scopes.append({name: ("cval", v, t)})
                if cont:
                    c.op("block")
                    self.labels.append("cont")
                self.stmts(s[4])
                if cont:
                    self.labels.pop()
                    c.op("end")
                self.scopes.pop()
        elif k == "for":
            _, init, cond, update, body = s
            self.scopes.append({})
            if init:
                self.stmt(init)
            c.op("block").op("loop")
            self.labels += ["brk", ""]
            if cond:
                self.emit(cond, "bool")
                c.op("i32.eqz").op("br_if", 1)
            c.op("block")
            self.labels.append("cont")
            self.stmts(body)
            self.labels.pop()
            c.op("end")
            if update:
                self.stmt(update)
            c.op("br", 0).op("end").op("end")
            self.labels = self.labels[:-2]
            self.scopes.pop()
        elif k == "return":
            target = next((x for x in reversed(self.labels) if x == "inv" or isinstance(x, tuple)), None)
            if target is None:
                if s[1] is not None:
                    self.emit(s[1], self.f.ret)
                c.op("return")
            else:
                if s[1] is not None:
                    self.emit(s[1], target[1])
                c.op("br", self.depth(target))
        elif k == "break":
            c.op("br", self.depth("brk"))
        elif k == "continue":
            c.op("br", self.depth("cont"))
        elif k == "expr":
            t = self.emit(s[1])
            if t is not None:
                c.op("drop")
        elif k == "block":
            self.stmts(s[1])
        else:
            raise WasmUnsupported(f"the statement {k}")

    def local_array(self, name, ty, value) -> None:
        ty = ty or self.type_of(value)
        _, et, n = ty
        address = self.ctx.library.scratch(4 * n)
        self.scopes[-1][name] = ("arr", address, ty)
        if value is not None:
            for i, a in enumerate(value[3]):
                self.code.op("i32.const", 0)
                self.emit(a, et)
                self.code.op("f32.store" if et == "f32" else "i32.store", address + 4 * i)

    def assign(self, s) -> None:
        _, lhs, op, rhs = s
        c = self.code
        value = rhs if op == "=" else ("bin", op[:-1], lhs, rhs)
        if lhs[0] == "name" and self.lookup(lhs[1])[0] == "pvar":
            v = self.lookup(lhs[1])
            self.pvar_address(v)
            self.emit(value, v[2])
            c.op("v128.store" if str(v[2]).startswith("vec") else "f32.store" if v[2] == "f32" else "i32.store", v[1])
        elif lhs[0] == "name":
            v = self.lookup(lhs[1])
            if v[0] != "local":
                raise WasmUnsupported(f"assigning to {lhs[1]}")
            self.emit(value, v[2])
            c.op("local.set", v[1])
        elif lhs[0] == "index":
            load, address, et = self.address(lhs)
            if op != "=":  # read-modify-write: the address once
                tmp = self.temp(I32)
                c.op("local.tee", tmp).op("local.get", tmp).op(load, address)
                holder = self.temp(wtype(et))
                c.op("local.set", holder)
                self.scopes.append({"__old": ("local", holder, et)})
                self.emit(("bin", op[:-1], ("name", "__old"), rhs), et)
                self.scopes.pop()
            else:
                self.emit(rhs, et)
            c.op({"f32.load": "f32.store", "i32.load": "i32.store", "v128.load": "v128.store"}[load], address)
        elif lhs[0] == "member" and lhs[1][0] == "name":
            v = self.lookup(lhs[1][1])
            if v[0] != "local" or not str(v[2]).startswith("vec"):
                raise WasmUnsupported("assigning to a member")
            et = elem(v[2])
            c.op("local.get", v[1])
            self.emit(value, et)
            c.op("f32x4.replace_lane" if et == "f32" else "i32x4.replace_lane", LANES[lhs[2]])
            c.op("local.set", v[1])
        else:
            raise WasmUnsupported("this assignment")


def _get_or_zero(c: Code, local) -> None:
    if local is None:
        c.op("i32.const", 0)
    else:
        c.op("local.get", local)


def _has(node, kind: str) -> bool:
    """A statement of `kind` anywhere in the statements (break, continue)."""
    if isinstance(node, tuple):
        return (len(node) == 1 and node[0] == kind) or any(_has(x, kind) for x in node)
    if isinstance(node, list):
        return any(_has(x, kind) for x in node)
    return False


def _picks(node, name: str) -> bool:
    """The loop index picks registers: compared with a constant (select(v, x, c == 1u)) or passed
    to a pick function. Only such loops are written out: others would only grow the code V8
    compiles before it runs fast (a matmul's 32 stores of an inlined epilogue)."""
    if isinstance(node, tuple) and node:
        if node[0] == "bin" and node[1] == "==" and ("name", name) in node[2:] and any(x[0] == "lit" for x in node[2:]):
            return True
        if node[0] == "call" and str(node[1]).startswith("pick") and node[3] and node[3][0] == ("name", name):
            return True
        return any(_picks(x, name) for x in node)
    if isinstance(node, list):
        return any(_picks(x, name) for x in node)
    return False


def _assigns(node, name: str) -> bool:
    if isinstance(node, tuple):
        if node and node[0] == "assign" and node[1] == ("name", name):
            return True
        return any(_assigns(x, name) for x in node)
    if isinstance(node, list):
        return any(_assigns(x, name) for x in node)
    return False


__all__ = ["Library", "Lower", "ShaderContext", "kernel_function", "function_index", "math_calls"]
