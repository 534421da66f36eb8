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
