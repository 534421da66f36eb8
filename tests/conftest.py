"""Shared fixtures (generic only; test-specific helpers live in their test files)."""

from __future__ import annotations

import pytest

from aot.ir import Graph
from aot.trace import tracing


@pytest.fixture
def graph():
    """A fresh Graph with tracing active for the whole test, so ops can be called directly."""
    g = Graph("test")
    with tracing(g):
        yield g


@pytest.fixture(autouse=True)
def _sigint_handler_left_alone():
    """A test that leaves another SIGINT handler installed breaks every later test of Ctrl-C
    (the runtime defers Ctrl-C only under Python's default handler): put it back and fail the
    test that changed it, naming the handler."""
    import signal

    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        signal.signal(signal.SIGINT, before)
        pytest.fail(f"the test left SIGINT's handler changed: {before!r} -> {after!r}")
