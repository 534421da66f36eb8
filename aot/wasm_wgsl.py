"""The WGSL subset that aot's CPU kernels are written in, parsed to a small AST (the wasm set's
first stage; wasm_lower.py turns the AST into WebAssembly).

Why compile WGSL rather than render wasm from the IR: every op's value already has a WGSL
expression (its OpDef's `expr`, ~100 of them, plus the accurate helpers of _helpers.wgsl.j2), and
every kernel family (elementwise, reductions, attention, matmul epilogues) already has a barrier-free
CPU variant (codegen.py's module doc). Compiling that text gives the wasm set every op at once and
keeps one source of truth for values; a renderer beside wgsl_expr.py would need each op written a
second time. The subset is what the templates write: storage bindings, the offset-table struct,
functions, let/var, for/if/return/break/continue, assignments, the usual operators, calls,
indexing and .x/.y/.z/.w; anything else is a clear WasmUnsupported naming the construct.

AST: expressions are tuples ("lit", type, value) | ("name", id) | ("bin", op, a, b) |
("un", op, a) | ("call", name, targs, args) | ("index", a, i) | ("member", a, field) |
("addr", a); statements ("let"|"var", name, type, expr) | ("assign", lhs, op, rhs) |
("if", cond, then, else) | ("for", init, cond, update, body) | ("return", expr) | ("break",) |
("continue",) | ("expr", call) | ("block", stmts). Types are strings: "f32", "i32", "u32",
"bool", "vec2<f32>" ...; ("arr", elem, n) for a fixed-size array, ("rarr", elem) for a binding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


class WasmUnsupported(Exception):
    """A kernel uses WGSL the wasm set does not compile (the message says what and where)."""


_TOKEN = re.compile(
    r"\s+|//[^\n]*"
    r"|(?P<num>0[xX][0-9a-fA-F]+[iu]?|(?:\d+\.\d*|\.\d+)(?:[eE][+-]?\d+)?f?|\d+[eE][+-]?\d+f?|\d+[iuf]?)"
    r"|(?P<id>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op><<=|>>=|->|<<|>>|<=|>=|==|!=|&&|\|\||\+\+|--|\+=|-=|\*=|/=|%=|&=|\|=|\^=|[-+*/%<>=!&|^~(){}\[\];:,.@])"
)


def tokenize(src: str) -> list[str]:
    out, pos = [], 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if not m:
            raise WasmUnsupported(f"unexpected character {src[pos]!r} at line {src.count(chr(10), 0, pos) + 1}")
        pos = m.end()
        if m.lastgroup:
            out.append(m.group(m.lastgroup))
    return out


@dataclass
class Func:
    name: str
    params: list  # [(name, type)]
    ret: object  # a type or None
    body: list
    attrs: dict = field(default_factory=dict)  # main: workgroup_size, builtins {param: builtin}


@dataclass
class Shader:
    bindings: dict  # name -> (binding number, access, type)
    structs: dict  # name -> [field names]
    uniforms: dict  # name -> struct name
    funcs: dict  # name -> Func
    consts: dict  # name -> expr
    workgroup: dict = field(default_factory=dict)  # module-scope var<workgroup> name -> type


# C's precedence (the generated WGSL parenthesises wherever WGSL's grammar asks for it)
BINARY = [["||"], ["&&"], ["|"], ["^"], ["&"], ["==", "!="], ["<", ">", "<=", ">="], ["<<", ">>"], ["+", "-"], ["*", "/", "%"]]
PREC = {op: i for i, ops in enumerate(BINARY) for op in ops}
TEMPLATED = {"vec2", "vec3", "vec4", "array", "bitcast", "ptr"}


class Parser:
    def __init__(self, src: str):
        self.t = tokenize(src)
        self.i = 0

    def peek(self, k: int = 0) -> str | None:
        return self.t[self.i + k] if self.i + k < len(self.t) else None

    def next(self) -> str:
        tok = self.peek()
        if tok is None:
            raise WasmUnsupported("unexpected end of the kernel")
        self.i += 1
        return tok

    def expect(self, tok: str) -> None:
        got = self.next()
        if got != tok:
            raise WasmUnsupported(f"expected {tok!r}, got {got!r} (token {self.i})")

    def accept(self, tok: str) -> bool:
        if self.peek() == tok:
            self.i += 1
            return True
        return False

    # ---- types ----
    def close_angle(self) -> None:
        tok = self.next()
        if tok == ">>":  # array<vec4<f32>>: the tokenizer saw a shift
            self.t.insert(self.i, ">")
        elif tok != ">":
            raise WasmUnsupported(f"expected '>', got {tok!r}")

    def type_(self):
        name = self.next()
        if name in ("vec2", "vec3", "vec4"):
            self.expect("<")
            inner = self.type_()
            self.close_angle()
            return f"{name}<{inner}>"
        if name == "array":
            self.expect("<")
            inner = self.type_()
            if self.accept(","):
                n = self.next().rstrip("iu")
                self.close_angle()
                return ("arr", inner, int(n, 0))
            self.close_angle()
            return ("rarr", inner)
        if name in ("f32", "i32", "u32", "bool"):
            return name
        return name  # a struct name

    # ---- top level ----
    def attrs(self) -> dict:
        out = {}
        while self.accept("@"):
            name = self.next()
            args = []
            if self.accept("("):
                while not self.accept(")"):
                    args.append(self.next())
            out[name] = args
        return out

    def shader(self) -> Shader:
        sh = Shader({}, {}, {}, {}, {})
        while self.peek() is not None:
            at = self.attrs()
            tok = self.next()
            if tok == "var":
                space = []
                if self.accept("<"):
                    while not self.accept(">"):
                        space.append(self.next())
                name = self.next()
                self.expect(":")
                ty = self.type_()
                self.expect(";")
                if space and space[0] == "storage":
                    access = space[2] if len(space) > 2 else "read"
                    sh.bindings[name] = (int(at["binding"][0].rstrip("u")), access, ty)
                elif space and space[0] == "uniform":
                    sh.uniforms[name] = ty
                elif space == ["workgroup"]:  # only a main that runs a workgroup at a time uses it
                    sh.workgroup[name] = ty
                else:
                    raise WasmUnsupported(f"module-scope var<{', '.join(space)}> {name} (workgroup or private memory)")
            elif tok == "struct":
                name = self.next()
                self.expect("{")
                fields = []
                while not self.accept("}"):
                    fields.append(self.next())
                    self.expect(":")
                    self.type_()
                    self.accept(",")
                sh.structs[name] = fields
                self.accept(";")
            elif tok == "fn":
                f = self.func(at)
                sh.funcs[f.name] = f
            elif tok in ("const", "let", "override"):
                name = self.next()
                if self.accept(":"):
                    self.type_()
                self.expect("=")
                sh.consts[name] = self.expr()
                self.expect(";")
            elif tok == "enable":
                raise WasmUnsupported(f"enable {self.next()} (a WGSL extension)")
            else:
                raise WasmUnsupported(f"unexpected {tok!r} at module scope")
        return sh

    def func(self, at: dict) -> Func:
        name = self.next()
        self.expect("(")
        params, builtins = [], {}
        while not self.accept(")"):
            pa = self.attrs()
            pname = self.next()
            self.expect(":")
            params.append((pname, self.type_()))
            if "builtin" in pa:
                builtins[pname] = pa["builtin"][0]
            self.accept(",")
        ret = self.type_() if self.accept("->") else None
        attrs = {"builtins": builtins}
        if "workgroup_size" in at:
            dims = [int(d.rstrip("iu")) for d in at["workgroup_size"] if d != ","]
            attrs["workgroup_size"] = (dims + [1, 1])[:3]
        return Func(name, params, ret, self.block(), attrs)

    # ---- statements ----
    def block(self) -> list:
        self.expect("{")
        out = []
        while not self.accept("}"):
            out.append(self.stmt())
        return out

    def stmt(self, semi: bool = True):
        tok = self.peek()
        if tok == "{":
            return ("block", self.block())
        if tok in ("let", "var", "const"):
            self.next()
            if tok == "var" and self.accept("<"):
                while not self.accept(">"):
                    self.next()
            name = self.next()
            ty = self.type_() if self.accept(":") else None
            value = self.expr() if self.accept("=") else None
            if semi:
                self.expect(";")
            return ("var" if tok == "var" else "let", name, ty, value)
        if tok == "if":
            self.next()
            cond = self.expr()
            then = self.block()
            other = None
            if self.accept("else"):
                other = [self.stmt()] if self.peek() == "if" else self.block()
            return ("if", cond, then, other)
        if tok == "for":
            self.next()
            self.expect("(")
            init = None if self.peek() == ";" else self.stmt(semi=False)
            self.expect(";")
            cond = None if self.peek() == ";" else self.expr()
            self.expect(";")
            update = None if self.peek() == ")" else self.stmt(semi=False)
            self.expect(")")
            return ("for", init, cond, update, self.block())
        if tok == "return":
            self.next()
            value = None if self.peek() == ";" else self.expr()
            self.expect(";")
            return ("return", value)
        if tok in ("break", "continue"):
            self.next()
            self.expect(";")
            return (tok,)
        if tok in ("loop", "while", "switch", "discard"):
            raise WasmUnsupported(f"the statement {tok!r}")
        lhs = self.expr()
        op = self.peek()
        if op in ("++", "--"):
            self.next()
            out = ("assign", lhs, op[0] + "=", ("lit", "aint", 1))
        elif op in ("=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>="):
            self.next()
            out = ("assign", lhs, op, self.expr())
        else:
            out = ("expr", lhs)
        if semi:
            self.expect(";")
        return out

    # ---- expressions ----
    def expr(self, level: int = 0):
        if level == len(BINARY):
            return self.unary()
        left = self.expr(level + 1)
        while self.peek() in BINARY[level]:
            op = self.next()
            left = ("bin", op, left, self.expr(level + 1))
        return left

    def unary(self):
        tok = self.peek()
        if tok in ("-", "!", "~"):
            self.next()
            return ("un", tok, self.unary())
        if tok == "&":
            self.next()
            return ("addr", self.unary())
        if tok == "*":
            raise WasmUnsupported("pointer dereference")
        return self.postfix(self.primary())

    def postfix(self, e):
        while True:
            if self.accept("["):
                e = ("index", e, self.expr())
                self.expect("]")
            elif self.accept("."):
                e = ("member", e, self.next())
            else:
                return e

    def primary(self):
        tok = self.next()
        if tok == "(":
            e = self.expr()
            self.expect(")")
            return e
        if tok[0].isdigit() or tok[0] == ".":
            return literal(tok)
        if tok in ("true", "false"):
            return ("lit", "bool", tok == "true")
        if not re.match(r"[A-Za-z_]", tok):
            raise WasmUnsupported(f"unexpected {tok!r} in an expression")
        targs = None
        if tok in TEMPLATED and self.peek() == "<":
            self.next()
            targs = [self.type_()]
            while self.accept(","):
                targs.append(self.next())
            self.close_angle()
        if self.accept("("):
            args = []
            while not self.accept(")"):
                args.append(self.expr())
                self.accept(",")
            return ("call", tok, targs, args)
        return ("name", tok)


def literal(tok: str):
    t = tok.lower()
    if t.startswith("0x"):
        kind = {"u": "u32", "i": "i32"}.get(t[-1], "aint")
        return ("lit", kind, int(t.rstrip("iu"), 16))
    if t.endswith("f") and not t.startswith("0x"):
        return ("lit", "f32", float(t[:-1]))
    if "." in t or "e" in t:
        return ("lit", "afloat", float(t))
    kind = {"u": "u32", "i": "i32"}.get(t[-1], "aint")
    return ("lit", kind, int(t.rstrip("iu")))


def parse(src: str) -> Shader:
    return Parser(src).shader()
