"""Matmuls of the wasm kernel set: register-blocked f32x4 code (filled in below)."""

from __future__ import annotations

from .wasm_wgsl import WasmUnsupported


def matmul_function(ctx, spec, addresses, order) -> int:
    raise WasmUnsupported("no SIMD matmul yet")
