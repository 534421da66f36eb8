"""aot's modules import each other without a cycle (read from the source with ast, function-local
imports included), so any import order works, `import aot.trace` first included."""

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "aot"


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _is_package(mods, name) -> bool:
    return mods.get(name, Path()).name == "__init__.py"


def import_graph() -> dict[str, set[str]]:
    """module -> modules whose code its import statements run. Importing a.b.c runs a.b's
    __init__ too (unless a.b is the importer's own package, which is already running)."""
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if _is_package(mods, mod) else mod.rpartition(".")[0]
        ancestors = {".".join(mod.split(".")[:i]) for i in range(1, mod.count(".") + 1)}
        targets = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in mods else base)
        for t in targets:
            if t not in mods or t == mod:
                continue
            graph[mod].add(t)  # named explicitly: an edge even to one's own package
            parts = t.split(".")
            for i in range(1, len(parts)):
                parent = ".".join(parts[:i])
                if parent not in ancestors and parent != mod:
                    graph[mod].add(parent)
    return graph


def find_cycle(graph) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return stack[stack.index(t) :] + [t]
            if t not in state:
                found = visit(t)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checker_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_any_first_import_works():
    for first in ("aot.trace", "aot.ir", "aot.ops.registry", "aot.schedule", "aot.passes", "aot.ops.trace"):
        r = subprocess.run([sys.executable, "-c", f"import {first}; import aot"], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, f"import {first} first: {r.stderr}"
