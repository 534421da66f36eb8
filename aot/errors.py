"""Exceptions and user call-site capture.

`ShapeError` and `TraceError` are the user's to fix and name the user's file:line.
`CodegenError` and `IRError` are compiler bugs: please report them.
"""

from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass

_AOT_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Site:
    """Where a traced op was called from in the user's code."""

    file: str
    line: int
    func: str

    @property
    def short(self) -> str:
        # file names end up in generated comments (Python, WGSL): one printable line, always
        return f"{printable(os.path.basename(self.file))}:{self.line}"

    def source(self) -> str:
        return linecache.getline(self.file, self.line).strip()

    def describe(self) -> str:
        src = self.source()
        text = f"at {self.short} in {self.func}"
        return text + (f":\n      {src}" if src else "")


def printable(text: str) -> str:
    """`text` with every non-printable character (line breaks, controls) written as its escape."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def capture_site() -> Site | None:
    """The innermost stack frame outside the aot package: the user's line that called the op."""
    f = sys._getframe(1)
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        if not path.startswith(_AOT_DIR + os.sep) and not _generated_init(f):
            return Site(path, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return None


def _generated_init(f) -> bool:
    """The __init__ that @dataclass writes for an aot class (Program, Train, ...): no user line."""
    if not f.f_code.co_filename.startswith("<") or f.f_code.co_name != "__init__":
        return False
    obj = f.f_locals.get("self")
    return obj is not None and type(obj).__module__.split(".")[0] == "aot"


class AotError(Exception):
    """Base of every error aot raises."""


class TraceError(AotError):
    """The model code did something that cannot be traced (user error)."""

    def __init__(self, message: str, site: Site | None = None, hint: str | None = None):
        self.site = site
        text = message
        if site is not None:
            text += "\n  " + site.describe()
        if hint:
            text += f"\n  hint: {hint}"
        super().__init__(text)


class InvalidNameError(TraceError, ValueError):
    """A user-given name (program, input, entry point, capture, parameter) cannot be used."""


class ShapeError(TraceError):
    """An op was called with shapes or dtypes it does not accept (user error)."""


class OutputExistsError(AotError, FileExistsError):
    """A build would overwrite files that no earlier build wrote (pass force=True / --force)."""


class IRError(AotError):
    """The compiler produced an invalid graph (a bug in aot: please report it)."""


class CodegenError(AotError):
    """The code generator failed (a bug in aot: please report it)."""
