"""Capture: one entry point of a torch module, exported with torch.export as core ATen.

`capture()` runs `fn(module, **inputs)` under torch.export in the module's train or eval mode
(restored afterwards) on example tensors of the declared shapes, decomposes the graph to core
ATen (except the few ops mapped whole: detach, which the core table turns into a plain alias
and so would lose its stop of the gradient, and scaled_dot_product_attention, which aot runs
as one fused op), and reads the graph signature: which placeholder is which parameter, buffer,
constant or user input, and which outputs are buffer mutations.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from ..errors import Site, TraceError

_FRAME = re.compile(r'File "(.*)", line (\d+), in (.*)')
_AOT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ops kept whole by the decomposition (see the module doc)
KEEP = ("aten.detach.default", "aten.scaled_dot_product_attention.default")


@dataclass
class Captured:
    """An exported entry point: the fx graph and what its placeholders and outputs are."""

    graph: object  # torch.fx.Graph, core ATen
    params: dict[str, str] = field(default_factory=dict)  # placeholder -> state_dict name (parameters and buffers)
    inputs: dict[str, str] = field(default_factory=dict)  # placeholder -> user input name
    constants: dict[str, object] = field(default_factory=dict)  # placeholder -> numpy array (lifted constants)
    outputs: list = field(default_factory=list)  # (kind, target) per output, in order: ("user", None) | ("buffer", name)


def torch_site(node) -> Site | None:
    """The user's line that made an exported node: the innermost frame of its stack trace outside
    torch and aot (an nn.Linear's addmm points at the line that called the Linear)."""
    trace = node.meta.get("stack_trace") or ""
    frames = [(f, int(line), fn) for f, line, fn in _FRAME.findall(trace)]
    if not frames:
        return None
    torch_dir = _torch_dir()
    for f, line, fn in reversed(frames):
        path = os.path.abspath(f)
        if not path.startswith(torch_dir) and not path.startswith(_AOT_DIR + os.sep):
            return Site(path, line, fn)
    f, line, fn = frames[-1]
    return Site(os.path.abspath(f), line, fn)


def _torch_dir() -> str:
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _table():
    import torch

    table = torch.export.default_decompositions()
    for op in list(table):
        if str(op) in KEEP:
            del table[op]
    return table


def capture(module, fn, names: list[str], examples: list, train: bool, what: str, site: Site | None) -> Captured:
    """Export `fn(module, **dict(zip(names, examples)))` in train (or eval) mode as core ATen."""
    import torch
    from torch.export.graph_signature import InputKind, OutputKind

    class Entry(torch.nn.Module):
        # the module is an attribute, so its parameters and buffers keep their names under "m."
        def __init__(self):
            super().__init__()
            self.m = module

        def forward(self, *args):
            return fn(self.m, **dict(zip(names, args)))

    # torch records only `forward` frames in stack traces, plus registered anchors: the user's
    # loss or infer function is one, so a node made there points at its line
    anchor = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
    if anchor is not None:
        anchor(fn)
    from .ops_more import export_patches

    was = module.training
    module.train(train)
    try:
        with export_patches():
            ep = torch.export.export(Entry(), tuple(examples), strict=False)
        ep = ep.run_decompositions(_table())
    except TraceError:
        raise
    except Exception as e:  # torch's own message says what it could not export
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TraceError(
            f"from_torch: torch.export could not capture {what}: {type(e).__name__}: {first}", site,
            hint="torch.export runs the code on example tensors of the declared input shapes: check those shapes, "
                 "and that no Python branch or shape depends on tensor values",
        ) from e
    finally:
        module.train(was)
    sig = ep.graph_signature
    cap = Captured(ep.graph)
    users = iter(names)
    for spec in sig.input_specs:
        arg = spec.arg.name
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            cap.params[arg] = spec.target[2:] if spec.target.startswith("m.") else spec.target
        elif spec.kind == InputKind.USER_INPUT:
            cap.inputs[arg] = next(users)
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            value = ep.constants[spec.target]
            cap.constants[arg] = value.detach().cpu().numpy() if hasattr(value, "detach") else value
        else:
            raise TraceError(f"from_torch: {what} has an input of kind {spec.kind.name}, which aot cannot compile", site)
    for spec in sig.output_specs:
        if spec.kind == OutputKind.USER_OUTPUT:
            cap.outputs.append(("user", None))
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            cap.outputs.append(("buffer", spec.target[2:] if spec.target.startswith("m.") else spec.target))
        else:
            raise TraceError(
                f"from_torch: {what} writes to {spec.target or 'an input'} ({spec.kind.name}); aot entry points "
                "may only update module buffers", site,
            )
    return cap
