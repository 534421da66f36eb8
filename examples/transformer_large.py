"""The addition transformer's architecture at a size where a GPU has real work: D = 512,
T = 256, 6 blocks, 8 heads, MLP 2048, B = 32 (benchmarks; random tokens stand in for data)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from addition_transformer import make_program  # noqa: E402

program = make_program("transformer_large", vocab=12, d=512, layers=6, heads=8, mlp=2048, t=256, b=32, web=None)
