"""Programs that check generated GPU kernels against the reference interpreter.

`make_program(name, params, inputs, body)` builds an `aot.Program` around a function
`body(m, feeds) -> {name: tensor}`: every array in `params` becomes a parameter with exactly
those values (`aot.init.literal`), every array in `inputs` an input, each output is
captured under its name and, for f32 outputs, gets a random cotangent input `<name>_ct`;
the loss is sum_o <out_o, ct_o>, so the gradient of each parameter is the VJP of the
cotangents. `optimizer=None`: a step computes loss, captures and gradients and changes
nothing, so steps can be repeated and compared one by one.

`case_program(name, cases)` does that for a batch of op cases (tests/op_cases.py): case k's
f32 operands are parameters `c{k}_x{i}`, its i32 operands inputs `c{k}_x{i}`, its module
parameters `c{k}_p{j}` and its outputs `c{k}_o{j}`. Cases that build `aot.nn` modules inside
their function (`nn.Linear(4, 5)(x)`) declare parameters while the loss is traced, too late
for the Program's parameter table: the harness declares them up front and `adopt_params`
hands them to the module in declaration order.

`run_both(program, inputs)` runs a step on the GPU (`aot.compile`) and in the float32
reference (`aot.interp.Reference`), checking every generated kernel's bindings on the way.
"""

from __future__ import annotations

import re
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

import aot
from aot import interp, ops
from aot.frontend import trace_program
from aot.ir import Graph
from aot.module import Module
from aot.runtime.rng import step_seed
from aot.trace import emit, tracing

from op_cases import OpCase, build

MAX_STORAGE_BINDINGS = 8  # WebGPU's default maxStorageBuffersPerShaderStage
RTOL, ATOL = 1e-4, 1e-5  # float32 against float32, different operation order


def _f32(v) -> np.ndarray:
    return np.asarray(v, dtype=np.float32)


def _is_int(v) -> bool:
    return np.asarray(v).dtype.kind in "iu"


@contextmanager
def adopt_params(tensors):
    """While active, `Module.param` returns the given (already declared) tensors in order."""
    pending = list(tensors)
    original = Module.param

    def param(self, shape, init=None, decay=None):
        shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        assert pending, f"{type(self).__name__} declares more parameters than the harness prepared"
        t = pending.pop(0)
        assert t.shape == shape, f"{type(self).__name__}: prepared parameter {t.shape}, the module wants {shape}"
        return t

    def torch_param(self, kind, torch_name, shape, transpose=False, **kw):
        return param(self, shape)  # the PyTorch name is not needed for the prepared tensors

    original_torch = Module._torch_param
    Module.param, Module._torch_param = param, torch_param
    try:
        yield
    finally:
        Module.param, Module._torch_param = original, original_torch
    assert not pending, f"{len(pending)} prepared parameters were not used"


def _harness_class(params: dict[str, np.ndarray]):
    class Harness(aot.Module):
        def __init__(self):
            super().__init__()
            for pname, v in params.items():
                setattr(self, pname, self.param(v.shape, init=aot.init.literal(v)))
            if not params:  # every program needs a 0-d f32 loss; keep one parameter to build it from
                self.anchor = self.param((1,), init=aot.init.zeros())

    return Harness


def _specs(inputs: dict[str, np.ndarray]) -> dict:
    return {n: (aot.i32 if _is_int(v) else aot.f32)(*np.shape(v)) for n, v in inputs.items()}


def _probe(harness, specs, body) -> dict[str, tuple[tuple, str]]:
    """Trace `body` once in a scratch graph to learn its outputs' shapes and dtypes."""
    g = Graph("probe", meta={"kind": "train"})
    with tracing(g):
        m = harness()
        feeds = {n: emit("input", (), name=n, shape=s.resolve({}), dtype=s.dtype) for n, s in specs.items()}
        outs = body(m, feeds)
    return {n: (t.shape, t.dtype) for n, t in outs.items()}


def make_program(name, params, inputs, body, cts=None, seed=0, ct_seed=1000):
    """(Program, {input name: value}, {output name: dtype}); see the module docstring."""
    params = {n: _f32(v) for n, v in params.items()}
    inputs = {n: np.asarray(v, dtype=np.int32) if _is_int(v) else _f32(v) for n, v in inputs.items()}
    harness = _harness_class(params)
    outs = _probe(harness, _specs(inputs), body)
    rng = np.random.default_rng(ct_seed)
    cts = dict(cts or {})
    for oname, (shape, dtype) in outs.items():
        if dtype == "f32":
            inputs[f"{oname}_ct"] = _f32(cts[oname]) if oname in cts else _f32(rng.normal(size=shape))
    specs = _specs(inputs)

    def loss(m, **feeds):
        total = None
        for oname, t in body(m, feeds).items():
            aot.capture(oname, t)
            if t.dtype == "f32":
                term = ops.sum(t * feeds[f"{oname}_ct"])
                total = term if total is None else total + term
        if total is None:  # only integer outputs
            total = ops.sum(next(iter(m._params.values())).tensor) * 0.0
        return total

    program = aot.Program(name, model=harness, train=aot.Train(loss, inputs=specs, optimizer=None), seed=seed)
    return program, inputs, {n: dt for n, (_, dt) in outs.items()}


# ---- op cases ---------------------------------------------------------------------------------


@dataclass
class CaseSlot:
    """Case k of a batch and the names its operands and outputs have in the Program."""

    k: int
    case: OpCase
    arg_names: list[str]  # per operand, by position
    module_params: list[str]
    out_names: list[str] = field(default_factory=list)
    out_dtypes: list[str] = field(default_factory=list)

    @property
    def param_names(self) -> list[str]:
        return [n for n, a in zip(self.arg_names, self.case.inputs) if a.dtype == "f32"] + self.module_params


def case_program(name: str, cases: list[OpCase], seed: int = 0):
    """(Program, inputs, [CaseSlot]) for a batch of op cases, values from each case's domains."""
    slots, params, inputs, cts = [], {}, {}, {}
    for k, case in enumerate(cases):
        b = build(case)
        vals = b.sample(seed=seed + zlib.crc32(case.name.encode()) % 10**6)  # the same wherever it is batched
        n_in = len(case.inputs)
        slot = CaseSlot(k, case, [f"c{k}_x{i}" for i in range(n_in)], [f"c{k}_p{j}" for j in range(len(b.leaves) - n_in)])
        for prog_name, leaf, spec in zip(slot.arg_names + slot.module_params, b.names(), b.specs):
            (params if spec.dtype == "f32" else inputs)[prog_name] = vals[leaf]
        ct_of = {id(o): ct for o, ct in zip([o for o in b.outs if o.dtype == "f32"], b.cts)}
        for j, o in enumerate(b.outs):
            slot.out_names.append(f"c{k}_o{j}")
            slot.out_dtypes.append(o.dtype)
            if o.dtype == "f32":
                cts[f"c{k}_o{j}"] = vals[ct_of[id(o)].node.attrs["name"]]
        slots.append(slot)

    def body(m, feeds):
        outs = {}
        for s in slots:
            args = [getattr(m, n) if n in params else feeds[n] for n in s.arg_names]
            with adopt_params([getattr(m, n) for n in s.module_params]):
                out = s.case.fn(*args, **s.case.kwargs)
            outs.update(zip(s.out_names, out if isinstance(out, (list, tuple)) else [out]))
        return outs

    program, inputs, _ = make_program(name, params, inputs, body, cts=cts, seed=seed)
    return program, inputs, slots


# ---- running ----------------------------------------------------------------------------------


@dataclass
class Side:
    loss: float
    captures: dict[str, np.ndarray]
    grads: dict[str, np.ndarray]


def check_bindings(wgsl: dict[str, str]) -> None:
    """Every kernel declares at most MAX_STORAGE_BINDINGS storage buffers, at distinct bindings."""
    for kname, src in wgsl.items():
        decls = re.findall(r"@binding\((\d+)\)\s*var<storage", src)
        assert len(decls) <= MAX_STORAGE_BINDINGS, f"{kname} declares {len(decls)} storage bindings"
        assert len(set(decls)) == len(decls), f"{kname} reuses a binding index: {decls}"


def compile_checked(program, kernels: str | None = None):
    """The package on this adapter. Kernel set: half the programs (by name) run the GPU set, whose
    independent kernels share dispatches (merge.py) and whose reductions use workgroup trees; the
    other half the CPU set (one dispatch per kernel, one-invocation reductions), which is what
    "auto" picks on lavapipe. Both sets meet every program family the fuzzer generates."""
    if kernels is None:
        kernels = "gpu" if zlib.crc32(program.name.encode()) % 2 == 0 else "cpu"
    model = aot.compile(program, kernels=kernels)
    check_bindings(model.WGSL)
    return model


def reference_step(traced, inputs: dict, seed: int, t: int = 1) -> Side:
    """Step t of the float32 reference: `interp.Reference` gives loss and gradients; the same
    leaves through `interp.run` give the captures (Reference keeps only loss and grads)."""
    ref = interp.Reference(traced, seed=seed, dtype=np.float32)
    ref.step_count = t - 1
    leaves = dict(inputs, **ref.params)
    loss = ref.step(**inputs)
    leaves["_rng"] = np.int32(step_seed(seed, t))
    leaves = {k: _f32(v) if np.asarray(v).dtype.kind == "f" else np.asarray(v) for k, v in leaves.items()}
    env = interp.run(traced.graphs["train"], leaves, np.float32)
    caps = {n: env[id(x)] for n, x in traced.graphs["train"].captures.items()}
    return Side(loss, caps, dict(ref.last_grads))


def gpu_step(model, inputs: dict) -> Side:
    res = model.step(**inputs, captures=True)
    return Side(res.loss, res.captures, model.grads())


def raw_gpu_step(model, inputs: dict) -> Side:
    """`model.step` minus the runtime's input validation, so out-of-range indices reach the
    kernels: the package's own packing, Engine dispatch and readback, as `_step` does them."""
    p = model._program
    key = p["variants"]["train"][()]
    dtypes = p["signatures"]["train"]
    arrays = {n: np.asarray(v, dtype=np.float32 if dtypes[n][0] == "f32" else np.int32) for n, v in inputs.items()}
    t = model.step_count + 1
    packed = model._pack(key, arrays, {"_rng": step_seed(model.seed, t)})
    out = model._engine.run(key, packed, True)
    model.step_count = t
    caps = {n: out[n] for n, *_ in p["entries"][key]["captures"]}
    return Side(float(out["loss"]), caps, model.grads())


def run_both(program, inputs: dict, steps: int = 1, raw: bool = False, kernels: str | None = None):
    """[(gpu Side, reference Side)] for steps 1..steps of `program`, and the WGSL it ran
    (`kernels`: the kernel set, as compile_checked picks it when None)."""
    model = compile_checked(program, kernels)
    try:
        gpu = [(raw_gpu_step if raw else gpu_step)(model, inputs) for _ in range(steps)]
        wgsl = dict(model._engine.wgsl)  # the set it ran
    finally:
        model.close()
    traced = trace_program(program)
    return [(g, reference_step(traced, inputs, program.seed, t + 1)) for t, g in enumerate(gpu)], wgsl


# ---- comparing --------------------------------------------------------------------------------


def assert_close(got, want, what: str, rtol=RTOL, atol=ATOL):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: GPU shape {got.shape}, reference {want.shape}"
    if want.dtype.kind in "iu":
        assert got.dtype == want.dtype, f"{what}: GPU dtype {got.dtype}, reference {want.dtype}"
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


def assert_all_close(gpu: Side, ref: Side, what: str, rtol=RTOL, atol=ATOL):
    """Every capture and every gradient; integer captures exactly."""
    assert gpu.captures.keys() == ref.captures.keys() and gpu.grads.keys() == ref.grads.keys()
    for n in ref.captures:
        assert_close(gpu.captures[n], ref.captures[n], f"{what}: output {n}", rtol, atol)
    for n in ref.grads:
        assert_close(gpu.grads[n], ref.grads[n], f"{what}: gradient of {n}", rtol, atol)
    assert_loss_close(gpu, ref, what)


def assert_loss_close(gpu: Side, ref: Side, what: str, rtol=RTOL):
    """The loss is a sum of many products: compare it against the size of its terms."""
    scale = sum(float(np.sum(np.abs(v.astype(np.float64)))) for v in ref.captures.values() if v.dtype.kind == "f")
    assert abs(gpu.loss - ref.loss) <= rtol * (scale + abs(ref.loss)) + ATOL, f"{what}: loss {gpu.loss}, reference {ref.loss}"


# ---- one raw kernel -----------------------------------------------------------------------------


def run_wgsl(device, wgsl: str, grid, buffers: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Dispatch one kernel over `grid`, binding `buffers` in order (binding i = i-th buffer);
    returns every buffer's contents afterwards, in its original dtype."""
    import wgpu

    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    bufs = {n: device.create_buffer_with_data(data=np.ascontiguousarray(a).tobytes(), usage=usage) for n, a in buffers.items()}
    pipeline = device.create_compute_pipeline(
        layout="auto", compute={"module": device.create_shader_module(code=wgsl), "entry_point": "main"}
    )
    group = device.create_bind_group(
        layout=pipeline.get_bind_group_layout(0),
        entries=[{"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate(bufs.values())],
    )
    enc = device.create_command_encoder()
    cpass = enc.begin_compute_pass()
    cpass.set_pipeline(pipeline)
    cpass.set_bind_group(0, group)
    cpass.dispatch_workgroups(*grid)
    cpass.end()
    device.queue.submit([enc.finish()])
    return {n: np.frombuffer(device.queue.read_buffer(b), dtype=buffers[n].dtype).reshape(buffers[n].shape).copy() for n, b in bufs.items()}
