"""Tracing entry points, kept under their old name: the module is aot/ops/trace.py (inside the
op package, so that `aot.ops` and tracing import each other in one direction only)."""

from .ops.trace import at_site, current, emit, fail, tracing  # noqa: F401
