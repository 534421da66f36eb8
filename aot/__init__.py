"""aot: an ahead-of-time compiler from small Python models to standalone WebGPU packages.

Public surface only (API.md); the stages live in their own modules.
"""

from . import init, lr, nn, ops, optim
from .errors import AotError, CodegenError, IRError, ShapeError, TraceError
from .buffers import assign
from .ir import Tensor
from .module import Module
from .ops.trace import is_training
from .program import Infer, Program, Train, capture, f32, i32
from .torch_frontend import from_torch

__all__ = [
    "AotError", "CodegenError", "IRError", "Infer", "Module", "Program", "ShapeError", "Tensor",
    "TraceError", "Train", "assign", "capture", "f32", "from_torch", "i32", "init", "is_training", "lr", "nn",
    "ops", "optim",
]


def build(
    program, outdir="generated", force=False, max_binding_mib=128, target="python", merge_dispatches=True, bucket_mib=25.0
):
    """Build `program` into outdir/<name> (a pip-installable project); returns that path.

    Replaces only files an earlier build wrote; other files in the way raise an error naming
    them (an aot.errors.OutputExistsError, a FileExistsError) unless force=True. No GPU buffer
    of the package exceeds max_binding_mib MiB (128: WebGPU's default, so it runs anywhere).
    target="web" writes an ES module and a demo page instead (OUT/<name>/), "all" both (the
    web project in OUT/<name>-web/). merge_dispatches=False gives every kernel a dispatch of
    its own (by default, on GPUs, independent kernels share one and dependent kernels over the
    same rows run as one: fewer dispatches, the same operations in the same order).
    bucket_mib: the gradient buckets of data-parallel training (step(allreduce=...) reads each
    back and reduces it while the backward pass goes on; 25 MiB as PyTorch DDP's, 0 = one per
    gradient); it changes only the package's tables, never what a step computes."""
    import os
    import warnings

    from .pipeline import build as _build, shadowing_files

    path = _build(
        program, outdir, force=force, max_binding_mib=max_binding_mib, target=target, merge_dispatches=merge_dispatches,
        bucket_mib=bucket_mib,
    )
    for f in shadowing_files(program.name, [os.getcwd(), outdir]):
        warnings.warn(f"{f} has the package's name: Python started in its folder imports that file "
                      f"for `import {program.name}`, not the package; rename one of them", stacklevel=2)
    return path


def compile(program, max_binding_mib=128, kernels="auto", merge_dispatches=True, bucket_mib=25.0):  # noqa: A001 - the API name
    """Build into a temporary folder and import the package in-process; returns a Model
    (`kernels`: "auto", "gpu", "subgroup" or "cpu", the kernel set, as the package's Model(kernels=...);
    merge_dispatches and bucket_mib as in build)."""
    from .pipeline import compile_model

    return compile_model(
        program, max_binding_mib=max_binding_mib, kernels=kernels, merge_dispatches=merge_dispatches, bucket_mib=bucket_mib
    )
