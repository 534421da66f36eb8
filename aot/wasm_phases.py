"""Kernels with workgroup barriers in the wasm set: each workgroup's invocations run phase by
phase (the recurrent kernels' hidden state shared through workgroup memory, lstm.wgsl.j2).

The body of `main` is cut at its barriers. A run of statements without one (a phase) runs for
every invocation of the workgroup in turn, then the next phase does; a loop or if that holds a
barrier runs once per workgroup (WGSL's uniformity rules make its condition the same in every
invocation: it is evaluated as invocation 0 sees it), its body cut the same way. What one phase
declares and a later one reads lives in memory, one slot per invocation; workgroup variables
live in memory too; a `return` marks its invocation finished for the phases after it.
"""

from __future__ import annotations

from .wasm_encode import I32, Code
from .wasm_lower import Lower
from .wasm_values import Binding, concrete
from .wasm_wgsl import WasmUnsupported

BARRIERS = ("workgroupBarrier", "storageBarrier")


def _barrier(s) -> bool:
    return s[0] == "expr" and s[1][0] == "call" and s[1][1] in BARRIERS


def _holds_barrier(node) -> bool:
    if isinstance(node, tuple):
        return (len(node) > 1 and node[0] == "call" and node[1] in BARRIERS) or any(_holds_barrier(x) for x in node)
    if isinstance(node, list):
        return any(_holds_barrier(x) for x in node)
    return False


def _names(node, kind: str, out: set) -> set:
    """Names declared (kind "decl") or read ("use") anywhere in node."""
    if isinstance(node, tuple) and node:
        if kind == "decl" and node[0] in ("let", "var") and isinstance(node[1], str):
            out.add(node[1])
        if kind == "use" and node[0] == "name":
            out.add(node[1])
        for x in node:
            _names(x, kind, out)
    elif isinstance(node, list):
        for x in node:
            _names(x, kind, out)
    return out


def _pieces(body: list, out: list) -> list:
    """The phases (lists of statements) and barrier-holding headers of a body, in order."""
    phase: list = []
    for s in body:
        if not _holds_barrier(s):
            phase.append(s)
            continue
        if phase:
            out.append(("phase", phase))
            phase = []
        if _barrier(s):
            continue
        if s[0] == "for":
            out.append(("header", [s[1], s[2], s[3]]))
            _pieces(s[4], out)
        elif s[0] == "if":
            out.append(("header", [s[1]]))
            _pieces(s[2], out)
            _pieces(s[3] or [], out)
        elif s[0] == "block":
            _pieces(s[1], out)
        else:
            raise WasmUnsupported(f"a barrier inside a {s[0]} statement")
    if phase:
        out.append(("phase", phase))
    return out


def private_names(body: list) -> set:
    """Names declared in one phase and read in another or in a header: kept in memory."""
    pieces = _pieces(body, [])
    decl = [_names(p, "decl", set()) if k == "phase" else set() for k, p in pieces]
    # a phase that declares a name itself (its own loop index r) reads its own
    use = [_names(p, "use", set()) - d for (_, p), d in zip(pieces, decl)]
    out = set()
    for i, names in enumerate(decl):
        for j, used in enumerate(use):
            if i != j:
                out |= names & used
    return out


def phased_kernel(ctx) -> int:
    """`main` of a kernel with workgroup memory and barriers, as a function of the grid."""
    main = ctx.shader.funcs["main"]
    X, Y, Z = main.attrs.get("workgroup_size") or (1, 1, 1)
    if (Y, Z) != (1, 1):
        raise WasmUnsupported("barriers in a workgroup of more than one dimension")
    for name, ty in ctx.shader.workgroup.items():
        if not (isinstance(ty, tuple) and ty[0] == "arr" and ty[1] in ("f32", "i32", "u32")):
            raise WasmUnsupported(f"workgroup variable {name} of type {ty}")
        ctx.bindings[name] = Binding(ctx.library.scratch(4 * ty[2]), ty[1], ty[2])
    low = Phases(ctx, main, X)
    low.emit_kernel()
    return ctx.library.function([I32, I32, I32], [], low.code)


class Phases(Lower):
    def __init__(self, ctx, f, size: int):
        super().__init__(ctx, f)
        self.size = size
        self.private = private_names(f.body)
        self.alive = ctx.library.scratch(4 * size)  # 1 while the invocation has not returned

    def pvar_address(self, v) -> None:
        self.code.op("local.get", self.lid).op("i32.const", 4 if v[3] == 4 else 16).op("i32.mul")

    def emit_kernel(self) -> None:
        c = self.code = Code([I32, I32, I32])
        self.lid = c.local(I32)
        w = [c.local(I32) for _ in range(3)]
        self.builtins = {}
        for pname, b in self.f.attrs["builtins"].items():
            if b in ("workgroup_id", "local_invocation_id", "global_invocation_id", "num_workgroups"):
                self.builtins[pname] = (b, [c.local(I32) for _ in range(3)])
                self.scopes[0][pname] = ("vec3", self.builtins[pname][1])
            elif b == "local_invocation_index":
                self.builtins[pname] = (b, [c.local(I32)])
                self.scopes[0][pname] = ("local", self.builtins[pname][1][0], "u32")
            else:
                raise WasmUnsupported(f"the builtin {b}")
        self.w = w
        self.slots = {}
        for d in (2, 1, 0):
            c.op("i32.const", 0).op("local.set", w[d]).op("block").op("loop")
            c.op("local.get", w[d]).op("local.get", d).op("i32.ge_u").op("br_if", 1)
        self.labels += ["", ""] * 3
        self.each_invocation(lambda: c.op("i32.const", 1).op("i32.store", self.alive))
        self.body(self.f.body)
        for d in (0, 1, 2):
            c.op("local.get", w[d]).op("i32.const", 1).op("i32.add").op("local.set", w[d])
            c.op("br", 0).op("end").op("end")
        self.labels = []

    def set_builtins(self) -> None:
        """The builtins of invocation `lid` of workgroup w (gid = w * size + lid along x)."""
        c = self.code
        for b, locals_ in self.builtins.values():
            for d, local in enumerate(locals_):
                if b == "workgroup_id":
                    c.op("local.get", self.w[d])
                elif b == "num_workgroups":
                    c.op("local.get", d)
                elif b in ("local_invocation_id", "local_invocation_index"):
                    c.op("local.get", self.lid) if d == 0 else c.op("i32.const", 0)
                else:
                    c.op("local.get", self.w[d])
                    if d == 0:
                        c.op("i32.const", self.size).op("i32.mul").op("local.get", self.lid).op("i32.add")
                c.op("local.set", local)

    def each_invocation(self, emit) -> None:
        c = self.code
        c.op("i32.const", 0).op("local.set", self.lid).op("block").op("loop")
        c.op("local.get", self.lid).op("i32.const", self.size).op("i32.ge_u").op("br_if", 1)
        c.op("local.get", self.lid).op("i32.const", 2).op("i32.shl")  # alive[lid]'s address
        self.labels += ["", ""]
        emit()
        self.labels = self.labels[:-2]
        c.op("local.get", self.lid).op("i32.const", 1).op("i32.add").op("local.set", self.lid)
        c.op("br", 0).op("end").op("end")

    def phase(self, stmts: list) -> None:
        """stmts for every invocation still running, one after another."""
        c = self.code

        def one():
            c.op("i32.load", self.alive).op("if")
            self.set_builtins()
            c.op("block")
            self.labels += ["", "inv"]
            self.scopes.append({})
            for s in stmts:
                self.stmt(s)
            self.scopes.pop()
            self.labels = self.labels[:-2]
            c.op("end").op("end")

        self.each_invocation(one)

    def body(self, stmts: list) -> None:
        """A body cut at its barriers (the module doc)."""
        c = self.code
        run: list = []
        for s in stmts:
            if not _holds_barrier(s):
                run.append(s)
                continue
            if run:
                self.phase(run)
                run = []
            if _barrier(s):
                continue
            self.uniform()  # headers as invocation 0 sees them
            if s[0] == "block":
                self.body(s[1])
            elif s[0] == "if":
                self.emit(s[1], "bool")
                c.op("if")
                self.labels.append("")
                self.body(s[2])
                if s[3]:
                    c.op("else")
                    self.body(s[3])
                self.labels.pop()
                c.op("end")
            elif s[0] == "for":
                _, init, cond, update, loop_body = s
                if _names([init, update], "decl", set()) & self.private:
                    raise WasmUnsupported("a barrier loop's index read by its phases as private")
                if init:
                    self.stmt(init)  # a local of the workgroup: the index is the same in all
                c.op("block").op("loop")
                self.labels += ["brk", ""]
                if cond:
                    self.uniform()
                    self.emit(cond, "bool")
                    c.op("i32.eqz").op("br_if", 1)
                self.body(loop_body)
                if update:
                    self.uniform()
                    self.stmt(update)
                c.op("br", 0).op("end").op("end")
                self.labels = self.labels[:-2]
            else:
                raise WasmUnsupported(f"a barrier inside a {s[0]} statement")
        if run:
            self.phase(run)

    def uniform(self) -> None:
        """Invocation 0's builtins and private values, for a header."""
        self.code.op("i32.const", 0).op("local.set", self.lid)
        self.set_builtins()

    def stmt(self, s) -> None:
        k = s[0]
        if k in ("let", "var") and s[1] in self.private and not isinstance(s[2], tuple):
            _, name, ty, value = s
            t = concrete(ty or self.type_of(value))
            if k == "let" and t in ("i32", "u32", "bool") and self.fold(value) is not None:
                self.scopes[0][name] = ("cval", self.fold(value), t)  # known at build time: no slot
                return
            if name not in self.slots:
                size = 16 if str(t).startswith("vec") else 4
                self.slots[name] = ("pvar", self.ctx.library.scratch(size * self.size), t, size)
            self.scopes[0][name] = self.slots[name]
            if value is not None:
                self.assign(("assign", ("name", name), "=", value))
            return
        if k == "return" and "inv" in self.labels and not any(isinstance(x, tuple) for x in self.labels):
            c = self.code
            c.op("local.get", self.lid).op("i32.const", 2).op("i32.shl").op("i32.const", 0).op("i32.store", self.alive)
            c.op("br", self.depth("inv"))
            return
        super().stmt(s)
