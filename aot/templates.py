"""The one jinja2 environment used for every generated file (WGSL kernels and package files).

StrictUndefined turns a missing template variable into an error instead of empty text;
keep_trailing_newline keeps files ending in a newline (jinja strips one by default).
"""

from __future__ import annotations

from pathlib import Path

import jinja2
import numpy as np

from .errors import printable

# installed from a wheel: aot/codegen_templates; in a source checkout: the repository's codegen_templates/
_INSTALLED = Path(__file__).resolve().parent / "codegen_templates"
TEMPLATE_DIR = _INSTALLED if _INSTALLED.is_dir() else Path(__file__).resolve().parent.parent / "codegen_templates"


def wgsl_f32(x: float) -> str:
    """Shortest decimal that round-trips the float32 value, always with '.' or 'e' (a WGSL f32 literal).

    WGSL reads a literal as an AbstractFloat (f64) and refuses one beyond f32's finite range, and
    the shortest decimal of +-FLT_MAX (3.4028235e+38) is just beyond it: Tint (Chrome) stops the
    shader there, naga rounds it. That one value gets the f64's shortest decimal, which is exact."""
    v = np.float32(x)
    if np.isnan(v) or np.isinf(v):
        raise ValueError(f"cannot write {x!r} as a WGSL f32 literal")
    s = np.format_float_positional(v, unique=True, trim="0")
    if len(s) > 16:
        s = np.format_float_scientific(v, unique=True, trim="0")
    if abs(float(s)) > float(np.finfo(np.float32).max):
        s = repr(float(v))
    if "." not in s and "e" not in s:
        s += ".0"
    if s.endswith("."):
        s += "0"
    return s


def wgsl_i32(x: int) -> str:
    x = int(x)
    if not -(2**31) <= x < 2**31:
        raise ValueError(f"{x} does not fit in i32")
    # -2147483648 cannot be written as a literal; WGSL parses the negation of an i32 literal
    return f"{x}i" if x != -(2**31) else "i32(-2147483647 - 1)"


def doc_text(text) -> str:
    """`text` for the inside of a docstring: one printable line, backslashes and quotes escaped."""
    return printable(str(text)).replace("\\", "\\\\").replace('"', '\\"')


def _strip_trailing_ws(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.split("\n"))


_ENV: jinja2.Environment | None = None


def env() -> jinja2.Environment:
    global _ENV
    if _ENV is None:
        _ENV = jinja2.Environment(
            loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
            autoescape=False,
        )
        _ENV.filters["wgsl_f32"] = wgsl_f32
        _ENV.filters["wgsl_i32"] = wgsl_i32
        # user strings in generated Python: `pystr` for a string literal, `doc` inside a docstring
        _ENV.filters["pystr"] = repr
        _ENV.filters["doc"] = doc_text
    return _ENV


def render(template: str, **ctx) -> str:
    """Render codegen_templates/<template>; trailing spaces are stripped once at the end."""
    return _strip_trailing_ws(env().get_template(template).render(**ctx))
