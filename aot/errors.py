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
        return f"{os.path.basename(self.file)}:{self.line}"

    def source(self) -> str:
        return linecache.getline(self.file, self.line).strip()

    def describe(self) -> str:
        src = self.source()
        text = f"at {self.short} in {self.func}"
        return text + (f":\n      {src}" if src else "")


def capture_site() -> Site | None:
    """The innermost stack frame outside the aot package: the user's line that called the op."""
    f = sys._getframe(1)
    while f is not None:
        path = os.path.abspath(f.f_code.co_filename)
        if not path.startswith(_AOT_DIR + os.sep):
            return Site(path, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return None


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


class ShapeError(TraceError):
    """An op was called with shapes or dtypes it does not accept (user error)."""


class IRError(AotError):
    """The compiler produced an invalid graph (a bug in aot: please report it)."""


class CodegenError(AotError):
    """The code generator failed (a bug in aot: please report it)."""
