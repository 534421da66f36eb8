"""Stage composition: the only module that knows the pipeline order.

trace (frontend) -> passes -> schedule (fusion) -> plan (buffers) -> codegen (WGSL) -> emit (package)
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import buckets, chain, codegen, emit, ir, merge, passes
from .buckets import DEFAULT_BUCKET_MIB
from .errors import CodegenError
from .frontend import Traced, trace_program
from .optim_groups import group_table
from .plan import ARENAS, DEFAULT_MAX_BINDING_MIB, BufferTable, Plan, arena_binding, buffer_of, is_input_arena, plan, state_arena
from .program import Program, train_entries
from .runtime.schedules import normalize
from .ops.registry import FOLLOW, Replaces, lookup
from .schedule import ParamArena, KernelSchedule, schedule
from .views import View


@dataclass
class Compiled:
    traced: Traced
    graphs: dict[str, ir.Graph]
    schedules: dict[str, KernelSchedule]
    plans: dict[str, Plan]
    kernels: dict[str, list[codegen.KernelCode]]  # one per scheduled kernel
    # what the package dispatches: the kernels, independent ones merged into one dispatch (merge.py)
    dispatches: dict[str, list[codegen.KernelCode]] = field(default_factory=dict)
    cuts: dict[str, int | None] = field(default_factory=dict)  # a training graph's cut, in dispatches
    dispatch_kernels: dict[str, list[list[int]]] = field(default_factory=dict)  # scheduled kernels per dispatch
    bucket_mib: float = DEFAULT_BUCKET_MIB  # gradient buckets of data-parallel training (buckets.py)
    program: dict = field(default_factory=dict)  # the literal tables the package gets


def index_bounds(g: ir.Graph) -> dict[str, int | list]:
    """i32 inputs used as indices -> what the runtime checks before it runs anything: the
    exclusive bound on every value, or, where index ops read only part of the input (a slice of
    it, say) or parts with different bounds, a list of [bound, offset, [[size, stride], ...]]:
    the elements of the flattened input at offset + sum(i * stride) must lie in [0, bound).
    Elements no index op reads may hold anything, as in PyTorch. A part read through an op that
    replaces one value before indexing (Replaces: ignore_index) may also hold that value: its
    check is [bound, offset, [[size, stride], ...], value]."""
    users = g.users()
    out: dict[str, int | list] = {}
    for name, t in g.inputs.items():
        if t.dtype != "i32":
            continue
        whole = (0, ((t.size, 1),))
        checks: dict[tuple, int] = {}  # (part, allowed value or None) -> bound
        stack = [(t, View.contiguous(t), None)]
        while stack:
            x, v, allowed = stack.pop()
            for u in users.get(id(x), []):
                rule = lookup(u.op).index_bound  # OpDef.index_bound: FOLLOW, Replaces, a bound or None
                b = rule(u, x) if rule is not None else None
                if b == FOLLOW:
                    stack.append((u.out, _passed_on(u, x, v), allowed))
                elif isinstance(b, Replaces):
                    stack.append((u.out, _passed_on(u, x, v), b.value))
                elif b is not None:
                    used = (v.offset, tuple(v.flat_dims())) if v is not None else whole
                    checks[used, allowed] = min(checks.get((used, allowed), b), b)
        if list(checks) == [(whole, None)]:
            out[name] = checks[whole, None]
        elif checks:
            order = sorted(checks.items(), key=lambda kv: (kv[0][0], kv[0][1] is not None, kv[0][1] or 0))
            out[name] = [
                [b, off, [list(sd) for sd in dims]] + ([allowed] if allowed is not None else [])
                for ((off, dims), allowed), b in order
            ]
    return out


def _passed_on(n: ir.Node, x: ir.Tensor, v: View | None) -> View | None:
    """Where n's output (which carries x's index values) sits in the input, given x's View v;
    None where that is no single view (the whole input is checked then)."""
    if v is None:
        return None
    op = lookup(n.op)
    if op.view is None:  # elementwise (stop_gradient, cast): element i is x's element i
        return v
    if len(n.inputs) != 1:  # concat: checked whole
        return None
    return op.view(n, {id(x): v})


def compile_program(
    program_or_traced, verify: bool = False, log=None, max_binding_mib: float = DEFAULT_MAX_BINDING_MIB,
    merge_dispatches: bool = True, bucket_mib: float = DEFAULT_BUCKET_MIB,
) -> Compiled:
    """`max_binding_mib`: no buffer the package allocates may exceed it (plan.py).
    `merge_dispatches`: independent kernels share a dispatch (merge.py); off, one per kernel.
    `bucket_mib`: the gradient buckets of data-parallel training (buckets.py)."""
    bucket_mib = check_bucket_mib(bucket_mib)
    log = log or (lambda msg: None)
    t0 = time.perf_counter()
    traced = program_or_traced if isinstance(program_or_traced, Traced) else trace_program(program_or_traced)
    prog = traced.program
    n_nodes = sum(len(g.nodes) for g in traced.graphs.values())
    log(f"traced {len(traced.graphs)} graph(s), {n_nodes} nodes, {len(traced.params)} params ({time.perf_counter() - t0:.2f}s)")
    total = sum(p.size for p in traced.params)
    arena = ParamArena({p.name: p.offset for p in traced.params}, total)
    trains = train_entries(prog)
    opt = prog.train.optimizer if "train" in trains else None
    state_names = opt.state_names() if opt is not None else ()
    buffer_table = BufferTable.of(traced.buffers)
    graphs, scheds, plans, kernels, dispatches, cuts, members = {}, {}, {}, {}, {}, {}, {}
    for key, g in traced.graphs.items():
        if verify:
            passes.verify(g, after="trace")
        g = passes.run_pipeline(g, verify=verify)
        s = schedule(g, arena)
        p = plan(s, _state_arenas(trains, key), total, max_binding_mib, buffers=buffer_table)
        prefix = codegen.entry_prefix(key)
        ks = codegen.generate(s, p, prefix)
        graphs[key], scheds[key], plans[key], kernels[key] = g, s, p, ks
        if merge_dispatches:  # GPU set: row chains as one kernel, then independent kernels side by side
            dispatches[key], cuts[key], members[key] = merge.merge(s, p, chain.fuse(s, p, ks, prefix), prefix)
        else:
            dispatches[key], cuts[key], members[key] = ks, s.update_from, [[i] for i in range(len(ks))]
        for code in dispatches[key]:
            for a, acc in code.bindings:
                if a != buffer_of(a) and acc != "read":  # merge.writes_a_vec4_view keeps this from happening
                    raise CodegenError(f"kernel {code.name} binds the vec4 view {a} read_write")
    log(
        f"scheduled and generated {sum(map(len, kernels.values()))} kernels in "
        f"{sum(map(len, dispatches.values()))} dispatches ({time.perf_counter() - t0:.2f}s)"
    )
    c = Compiled(traced, graphs, scheds, plans, kernels, dispatches, cuts, members, bucket_mib)
    c.program = _tables(c, opt, state_names)
    return c


def _state_arenas(trains: dict, key: str) -> dict[str, str]:
    """A training graph's optimizer state name -> its buffer (each entry's state at its own offset
    of the same buffers: entries.py); {} for an infer graph."""
    tr = trains.get(key.split("[", 1)[0])
    opt = tr.optimizer if tr is not None else None
    return {n: state_arena(i) for i, n in enumerate(opt.state_names())} if opt is not None else {}


def train_tables(c: Compiled) -> dict:
    """PROGRAM["trains"]: per training entry, what the runtime keeps apart (API.md: several
    training entries): its name, optimizer, lr, state names, its range of the flat parameter
    vector, where its gradients and state start, and the parameters it trains."""
    out = {}
    for entry, tr in train_entries(c.traced.program).items():
        lay = c.traced.trains[entry]
        opt = tr.optimizer
        out[entry] = {
            "name": "train" if entry == "train" else entry[len("train_"):],
            "optimizer": opt.spec() if opt is not None else None,
            "lr": normalize(opt.lr) if opt is not None else None,
            "state": list(opt.state_names()) if opt is not None else [],
            "start": lay.start,
            "size": lay.size,
            "offset": lay.offset,
            "params": list(lay.members),
            **({"groups": g} if (g := group_table(opt)) is not None else {}),  # per-group (spec, lr)
        }
    return out


def check_bucket_mib(bucket_mib) -> float:
    """A build's bucket_mib: a number >= 0 (0: one bucket per gradient)."""
    if isinstance(bucket_mib, bool) or not isinstance(bucket_mib, (int, float)) or not bucket_mib >= 0:
        raise ValueError(
            f"bucket_mib must be a number of MiB >= 0 (the gradient bucket size of data-parallel training; 0: one "
            f"bucket per gradient; default {DEFAULT_BUCKET_MIB:g}), got {bucket_mib!r}"
        )
    return float(min(bucket_mib, 2**40))


def _bucket_tables(c: Compiled, key: str, entry: dict) -> dict:
    """entries[key]["buckets"] (and "buckets_cpu" where the CPU set has its own dispatch list):
    (lo, hi, ready) per gradient bucket of a training graph (buckets.py)."""
    g, s, p = c.graphs[key], c.schedules[key], c.plans[key]
    p_start, p_end, slot = g.meta.get("train_range", (0, p.sizes["params"], 0))
    spans = [(slot + q.offset - p_start, slot + q.offset - p_start + q.size) for q in c.traced.params]
    bindings = [k.bindings for k in c.kernels[key]]
    lists = {"buckets": (c.dispatch_kernels[key], entry["update_from"])}
    if "update_from_cpu" in entry:
        lists["buckets_cpu"] = ([[i] for i in range(len(c.kernels[key]))], entry["update_from_cpu"])
    return buckets.entry_buckets(s, p, bindings, spans, slot, p_end - p_start, lists, c.bucket_mib)


def _shared_arenas(c: Compiled) -> dict[str, int]:
    """Buffer sizes the Model allocates up front, in binding order (gaps as empty buffers).
    Parameters, gradients, optimizer state and inputs: the largest any entry needs. Scratch
    buffers: what training needs when there is training (a larger predict variant gets its own
    scratch buffers when it is first called, so it never enlarges what training allocates);
    otherwise the largest any entry needs."""
    train = [k for k, g in c.graphs.items() if g.meta.get("kind") == "train"]
    sizes: dict[str, int] = dict.fromkeys(ARENAS, 0)
    for key, p in c.plans.items():
        for a, n in p.sizes.items():
            sizes.setdefault(a, 0)  # every buffer keeps its binding number, even if allocated empty
            if not (train and a.startswith("work") and key not in train):
                sizes[a] = max(sizes[a], n)
    by_binding = {arena_binding(a): a for a in sizes}
    return {by_binding.get(i, f"_unused_{i}"): sizes.get(by_binding.get(i), 0) for i in range(max(by_binding) + 1)}


def _code_only(wgsl: str) -> str:
    """A kernel's source without its comments: kernels that differ only in them are one kernel."""
    return "\n".join(line for line in wgsl.splitlines() if not line.lstrip().startswith("//"))


def _tables(c: Compiled, opt, state_names) -> dict:
    prog = c.traced.program
    arenas = _shared_arenas(c)
    entries, kernel_table, wgsl, wgsl_cpu, wgsl_subgroup = {}, {}, {}, {}, {}
    same_as: dict[tuple, str] = {}  # a kernel's code (comments aside) -> the first kernel with that code
    for key, g in c.graphs.items():
        p, s = c.plans[key], c.schedules[key]

        def where(t):
            loc, _ = p.read_loc(s, t)
            return loc.arena, loc.offset

        lists = {"dispatches": c.dispatches[key]}
        # the CPU set dispatches every kernel on its own (merge.py), with its variants' grids
        if c.dispatches[key] != c.kernels[key] or any(k.grid_cpu for k in c.kernels[key]):
            lists["dispatches_cpu"] = c.kernels[key]
        entries[key] = {
            "inputs": [(n, dt, tuple(shape), loc.arena, loc.offset) for n, dt, shape, loc in p.inputs],
            # every input buffer of the entry (inputs, inputs_i32, and spill buffers where they exist)
            "input_sizes": {a: n for a, n in p.sizes.items() if is_input_arena(a)},
            "outputs": [(n, t.dtype, t.shape) + where(t) for n, t in g.outputs.items()],
            "captures": [(n, t.dtype, t.shape) + where(t) for n, t in g.captures.items()],
        }
        for label, ks in lists.items():
            names = [
                same_as.setdefault(
                    (_code_only(k.wgsl), _code_only(k.wgsl_cpu or ""), _code_only(k.wgsl_subgroup or ""), k.offsets_cpu),
                    k.name,
                )
                for k in ks
            ]
            cpu = label == "dispatches_cpu"
            entries[key][label] = [(n, (k.grid_cpu or k.grid) if cpu else k.grid) for n, k in zip(names, ks)]
            for n, k in zip(names, ks):
                if n == k.name:  # first of its source: the others dispatch this one
                    kernel_table[n] = (tuple(k.bindings), k.site, tuple(k.offsets_cpu))
                    # the mark that lets a later build replace the file (emit.GENERATED_MARKS)
                    mark = f"// @generated by aot from {prog.name}; do not edit\n"
                    wgsl[n] = mark + k.wgsl
                    if k.wgsl_cpu is not None:
                        wgsl_cpu[n] = mark + k.wgsl_cpu
                    if k.wgsl_subgroup is not None:
                        wgsl_subgroup[n] = mark + k.wgsl_subgroup
        entries[key].update(
            {
                "copies": [(src.arena, src.offset, dst.arena, dst.offset, n) for src, dst, n in p.copies],
                "index_bounds": index_bounds(g),
                "arenas": {a: n for a, n in p.sizes.items() if n},  # what this entry point needs
            }
        )
        if "grads" in g.persist:  # dispatches [0, update_from) fill the grads buffer, the rest update
            n = len(c.dispatches[key])
            entries[key]["update_from"] = n if c.cuts[key] is None else c.cuts[key]
            if "dispatches_cpu" in lists:
                entries[key]["update_from_cpu"] = len(s.kernels) if s.update_from is None else s.update_from
            entries[key].update(_bucket_tables(c, key, entries[key]))
    signatures, variants = {}, {}
    specs = list(train_entries(prog).items()) + list(prog.infer.items())
    for entry, spec in specs:
        signatures[entry] = {n: (s.dtype, tuple(s.dims)) for n, s in spec.inputs.items()}
        variants[entry] = {tuple(sorted(sizes.items())): key for key, sizes in c.traced.variants[entry].items()}
    tables = {
        "name": prog.name,
        "seed": int(prog.seed),
        "params": [(p.name, p.shape, p.init, p.decay, p.offset) for p in c.traced.params],
        # aot name -> (PyTorch name, aot.nn module kind or "", stored transposed): load_state_dict's map
        "torch": {p.name: p.torch for p in c.traced.params},
        # Module.buffer: (name, shape, dtype, init spec, offset in buffers / buffers_i32, PyTorch name)
        "buffers": [(b.name, b.shape, b.dtype, b.init, b.offset, b.torch[0]) for b in c.traced.buffers],
        "optimizer": opt.spec() if opt is not None else None,
        "lr": normalize(opt.lr) if opt is not None else None,
        "state": list(state_names),
        **({"groups": g} if (g := group_table(opt)) is not None else {}),  # per-group (spec, lr)
        "dims": {k: tuple(v) for k, v in prog.dims.items()},
        "signatures": signatures,
        "variants": variants,
        "arenas": arenas,
        "kernels": kernel_table,
        "entries": entries,
        "_wgsl": wgsl,
        "_wgsl_cpu": wgsl_cpu,  # the CPU variants of the kernels that have one (codegen's module doc)
        "_wgsl_subgroup": wgsl_subgroup,  # the subgroup set's variants (KernelCode.wgsl_subgroup)
    }
    trains = train_tables(c)
    total = sum(p.size for p in c.traced.params)
    # one training entry over every parameter is what the runtime assumes without this table
    if trains and (list(trains) != ["train"] or trains["train"]["size"] != total):
        tables["trains"] = trains
    return tables


TARGETS = ("python", "web", "all")


def build(
    program: Program, outdir="generated", verify: bool = False, log=None, source_name: str | None = None,
    force: bool = False, max_binding_mib: float = DEFAULT_MAX_BINDING_MIB, target: str = "python",
    merge_dispatches: bool = True, bucket_mib: float = DEFAULT_BUCKET_MIB,
) -> Path:
    """Build `program` into outdir/<name>/ (pyproject.toml + package); returns that folder.

    target="web" writes the browser project (aot/web.py) into outdir/<name>/ instead;
    target="all" writes both: the Python project in outdir/<name>/ and the web project beside
    it in outdir/<name>-web/ (a name no program can have), and returns the Python one.
    Replaces only files an earlier build wrote; other files in the way raise
    aot.errors.OutputExistsError (a FileExistsError) naming them, unless force=True.
    No buffer of the package exceeds `max_binding_mib` (WebGPU's default binding limit)."""
    if target not in TARGETS:
        raise ValueError(f"unknown build target {target!r}; expected one of {', '.join(TARGETS)}")
    c = compile_program(
        program, verify=verify, log=log, max_binding_mib=max_binding_mib, merge_dispatches=merge_dispatches,
        bucket_mib=bucket_mib,
    )
    src = source_name or _source_name(program)
    path = None
    if target in ("python", "all"):
        path = emit.write_package(c, Path(outdir), src, force=force)
        if log:
            log(f"wrote {path}")
    if target in ("web", "all"):
        from . import web

        web_path = web.write_web(c, Path(outdir), src, force=force, folder=program.name + "-web" if target == "all" else None)
        if log:
            log(f"wrote {web_path} (web)")
        path = path or web_path
    return path


def shadowing_files(name: str, folders) -> list[str]:
    """Files `<name>.py` in `folders`: a script run there that does `import <name>` gets that
    file instead of the installed package (the script's folder comes first on sys.path)."""
    out = []
    for folder in dict.fromkeys(os.path.abspath(f) for f in folders):
        f = os.path.join(folder, name + ".py")
        if os.path.isfile(f):
            out.append(f)
    return out


def _source_name(program: Program) -> str:
    mod = sys.modules.get(getattr(program.model, "__module__", "") or "")
    f = getattr(mod, "__file__", None)
    return os.path.basename(f) if f else "<python>"


_COMPILED = itertools.count(1)


def compile_model(
    program: Program, seed=None, max_binding_mib: float = DEFAULT_MAX_BINDING_MIB, kernels: str = "auto",
    merge_dispatches: bool = True, bucket_mib: float = DEFAULT_BUCKET_MIB,
):
    """aot.compile: build into a temporary folder, import the package, return a Model.

    The package is imported under a private module name (`_aot_<name>_<n>`), so a module of
    the program's name that is already imported (the user's model file, say) is left alone,
    and the temporary folder is removed once everything is imported (the WGSL and the tables
    are in memory by then). `kernels`: the kernel set, as Model(kernels=...)."""
    tmp = tempfile.mkdtemp(prefix="aot-")
    try:
        path = build(program, tmp, max_binding_mib=max_binding_mib, merge_dispatches=merge_dispatches, bucket_mib=bucket_mib)
        name = program.name
        alias = f"_aot_{name}_{next(_COMPILED)}"
        spec = importlib.util.spec_from_file_location(
            alias, path / name / "__init__.py", submodule_search_locations=[str(path / name)]
        )
        mod = importlib.util.module_from_spec(spec)
        sys.modules[alias] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            for k in [m for m in sys.modules if m == alias or m.startswith(alias + ".")]:
                del sys.modules[k]
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return mod.Model(seed=seed, kernels=kernels)
