"""`python -m aot build model.py [-o DIR] [--program NAME] [--force]`, `python -m aot inspect model.py` and
`python -m aot convert IN OUT [--layout aot|torch] [--model model.py [--program NAME]]` (.npz <-> .safetensors)."""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time

from .errors import AotError
from .program import Program


def load_programs(path: str) -> dict[str, Program]:
    """Run a model file and return its module-level aot.Program objects by name."""
    if not os.path.isfile(path):
        raise SystemExit(f"aot: no such model file: {path}")
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        ns = runpy.run_path(path, run_name="__aot_model__")
    finally:
        sys.path.pop(0)
    progs = {}
    for v in ns.values():
        if isinstance(v, Program):
            if progs.setdefault(v.name, v) is not v:
                first, second = progs[v.name].site, v.site
                where = f" (at {first.short} and {second.short})" if first and second else ""
                raise SystemExit(
                    f"aot: {path} defines two different aot.Program objects named {v.name!r}{where}; "
                    "each program needs a name of its own (it is the package's name)"
                )
    if not progs:
        raise SystemExit(
            f"aot: {path} defines no aot.Program at module level\n"
            "  hint: add e.g.  program = aot.Program('my_model', model=..., train=aot.Train(...))"
        )
    return progs


def _select(progs: dict[str, Program], name: str | None, path: str) -> list[Program]:
    if name is None:
        return list(progs.values())
    if name not in progs:
        raise SystemExit(f"aot: unknown program {name!r}; {os.path.basename(path)} defines: {', '.join(progs)}")
    return [progs[name]]


def _log(msg: str) -> None:
    print(f"  {msg}", flush=True)


def cmd_build(args) -> int:
    from .pipeline import build, shadowing_files

    progs = _select(load_programs(args.model), args.program, args.model)
    for p in progs:
        t0 = time.perf_counter()
        print(f"aot: building {p.name} from {args.model}", flush=True)
        path = build(
            p, args.outdir, verify=args.verify, log=_log, source_name=os.path.basename(args.model), force=args.force,
            max_binding_mib=args.max_binding_mib, target=args.target, merge_dispatches=not args.no_merge,
            bucket_mib=args.bucket_mib,
        )
        took = f"{time.perf_counter() - t0:.2f}s"
        if args.target == "web":
            print(f"aot: {p.name} -> {path} ({took}); serve it with: python -m http.server -d {path}", flush=True)
            continue
        print(f"aot: {p.name} -> {path} ({took}); install with: pip install {path}", flush=True)
        if args.target == "all":
            print(f"aot: {p.name} (web) -> {path.parent / (p.name + '-web')}", flush=True)
        for f in shadowing_files(p.name, [os.getcwd(), args.outdir]):
            print(
                f"aot: warning: {f} has the package's name: Python started in {os.path.dirname(f)} imports that "
                f"file for `import {p.name}`, not the installed package; rename one of them",
                file=sys.stderr,
                flush=True,
            )
    return 0


def cmd_inspect(args) -> int:
    from .pipeline import _code_only, compile_program
    from .ir import format_graph

    for p in _select(load_programs(args.model), args.program, args.model):
        c = compile_program(p, verify=True, max_binding_mib=args.max_binding_mib)
        entries = list(c.traced.variants)
        if args.entry and args.entry not in entries and args.entry not in c.graphs:
            raise SystemExit(f"aot: {p.name} has no entry point {args.entry!r}; it has: {', '.join(entries)}")
        for key, g in c.graphs.items():
            if args.entry and key != args.entry and not key.startswith(args.entry + "["):
                continue
            print(format_graph(g))
            torch_ops = c.traced.graphs[key].meta.get("torch_ops")
            if torch_ops:  # aot.from_torch: which aot ops each exported ATen op became
                print(f"ATen ops ({len(torch_ops)}) -> aot ops:")
                for aten, aot_ops, site in torch_ops:
                    print(f"  {aten:<44} -> {' '.join(aot_ops) or '(no op: a view or identity)':<40} {site}")
            plan = c.plans[key]
            print(f"kernels ({len(c.kernels[key])}, in {len(c.dispatches[key])} dispatches on GPUs):")
            for k in c.kernels[key]:
                cpu = f" (CPU set: {k.grid_cpu})" if k.grid_cpu else ""
                print(f"  {k.name:<40} grid={k.grid}{cpu}  {k.site}")
            for k in c.dispatches[key]:
                if k.parts:
                    print(f"  dispatch {k.name}: {', '.join(p.name for p in k.parts)}")
            # the CPU set reads offsets from tables: kernels that differ only there compile once
            texts = {_code_only(k.wgsl_cpu or k.wgsl) for k in c.kernels[key]}
            print(f"CPU set: {len(c.kernels[key])} dispatches, {len(texts)} distinct kernels to compile")
            swapped = [k.name for k in c.dispatches[key] if k.wgsl_subgroup]
            print(f"subgroup set: {len(swapped)} of the GPU set's dispatches run a variant with subgroup operations")
            print(memory_report(c, key))
            if args.wgsl:
                for k in c.kernels[key]:
                    print(k.wgsl)
            print()
    return 0


_MAX_NAME_BYTES = 4096  # an aot checkpoint's __program__ member: a Program name (100 characters at most)


def _npy_shapes(path: str, zf) -> dict:
    """{array name: (shape, dtype)} from each member's .npy header, read without inflating the
    member's data (a few kilobytes of each stream)."""
    import numpy as np

    fmt = np.lib.format
    out = {}
    for info in zf.infolist():
        if not info.filename.endswith(".npy"):
            raise ValueError(f"member {info.filename!r} is not a .npy array")
        with zf.open(info) as m:
            version = fmt.read_magic(m)
            read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, _, dtype = read(m)
        out[info.filename[: -len(".npy")]] = (shape, dtype)
    return out


def _read_npz(path: str, check=None) -> tuple[dict, str | None]:
    """({name: array}, program name or None): an aot checkpoint's parameters and buffers (its
    `param/...` and `buffer/...` members), or every array of a plain .npz. Nothing is unpickled.
    check({name: shape}), when given, sees every array's shape from its header before any
    member's data is inflated (so a small archive cannot make this inflate gigabytes first)."""
    import zipfile

    import numpy as np

    try:
        with open(path, "rb") as f:
            if not f.read(4).startswith(b"PK"):
                raise SystemExit(f"aot: {path} is not a .npz file (not a zip archive)")
        with zipfile.ZipFile(path) as zf:
            shapes = _npy_shapes(path, zf)
        ckpt = "__program__" in shapes and any(n.startswith("param/") for n in shapes)
        keep = [n for n in shapes if n.startswith(("param/", "buffer/"))] if ckpt else list(shapes)
        if ckpt:
            shape, dtype = shapes["__program__"]
            if shape != () or dtype.kind != "U" or dtype.itemsize > _MAX_NAME_BYTES:
                raise ValueError(f"its __program__ member is {dtype}{list(shape)}, not a Program name")
        if check is not None:
            check({(n.split("/", 1)[1] if ckpt else n): shapes[n][0] for n in keep})
        with np.load(path, allow_pickle=False) as z:
            if ckpt:
                return {n.split("/", 1)[1]: z[n] for n in keep}, str(z["__program__"])
            return {n: z[n] for n in keep}, None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, RuntimeError, NotImplementedError) as e:
        # object arrays, damaged archives, unsupported compression
        raise SystemExit(f"aot: cannot read {path} as .npz: {e}") from None


def _check_paths(src: str, dst: str) -> None:
    """One line, not a traceback, for the paths convert cannot use."""
    if os.path.isdir(src):
        raise SystemExit(f"aot: {src} is a folder; convert reads one .npz or .safetensors file")
    if not os.path.exists(src):
        raise SystemExit(f"aot: no such file: {src}")
    if os.path.isdir(dst):
        raise SystemExit(f"aot: {dst} is a folder; give the file to write")
    folder = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(folder):
        raise SystemExit(f"aot: cannot write {dst}: the folder {folder} does not exist")


def cmd_convert(args) -> int:
    import numpy as np

    from .runtime import interop
    from .runtime.model import _replace_atomically

    src, dst = args.src, args.dst
    kinds = (os.path.splitext(src)[1].lower(), os.path.splitext(dst)[1].lower())
    if kinds not in ((".npz", ".safetensors"), (".safetensors", ".npz")):
        raise SystemExit(f"aot: convert goes .npz -> .safetensors or .safetensors -> .npz; got {src} -> {dst}")
    if args.layout == "torch" and not args.model:
        raise SystemExit(
            "aot: --layout torch needs the model (--model model.py [--program NAME]): PyTorch's names and layouts "
            "come from the aot.nn modules that declared each parameter"
        )
    if args.program and not args.model:
        raise SystemExit("aot: --program needs --model")
    _check_paths(src, dst)
    params = table = None
    int_buffers: set = set()
    program = None
    if args.model:
        from .frontend import trace_program

        progs = load_programs(args.model)
        if args.program is None and len(progs) > 1:
            raise SystemExit(f"aot: {args.model} defines several programs ({', '.join(progs)}); choose one with --program")
        (prog,) = _select(progs, args.program, args.model)
        traced = trace_program(prog)
        params = [(p.name, p.shape) for p in traced.params] + [(b.name, b.shape) for b in traced.buffers]
        table = {p.name: p.torch for p in traced.params}
        table.update({b.name: (b.torch[0], b.torch[1], False) for b in traced.buffers})
        int_buffers = {b.name for b in traced.buffers if b.dtype == "i32"}
        program = prog.name
    what = f"convert {src}"
    try:
        if kinds[0] == ".npz":
            # aot names in; checked against the model (from the headers), then in the layout asked for
            check = None if params is None else lambda shapes: interop.plan_load(what, shapes, params, table, "aot", None, False)
            arrays, ckpt = _read_npz(src, check)
            program = program or ckpt
            out = arrays
            if params is not None:
                plan = interop.plan_save(what, params, table, args.layout, None)
                out = {o: np.ascontiguousarray(arrays[n].T) if t else arrays[n] for o, n, t in plan}
                if args.layout == "torch":  # as state_dict(layout="torch"): PyTorch's int64 counters
                    out.update({o: arrays[n].astype(np.int64) for o, n, _ in plan if n in int_buffers})
            meta = {"format": "pt", "aot_layout": args.layout}
            if program:
                meta["aot_program"] = program
            _replace_atomically(dst, lambda f: interop.write_safetensors(f, out, meta))
        else:
            with interop.SafetensorsFile(src) as st:
                if params is None:
                    out = {n: st.array(n) if st.entries[n][0] == "BF16" else st.raw(n) for n in st.entries}
                else:
                    incoming = {n: e[1] for n, e in st.entries.items()}
                    plan = interop.plan_load(what, incoming, params, table, args.layout, None, False)
                    out = {}
                    for n, (aot_name, t) in plan.items():
                        a = st.array(n) if st.entries[n][0] == "BF16" else st.raw(n)
                        out[aot_name] = np.ascontiguousarray(a.T) if t else a
                    out = {n: out[n] for n, _ in params}  # the model's order
            _replace_atomically(dst, lambda f: np.savez(f, **out))
    except (KeyError, ValueError, TypeError) as e:
        raise SystemExit(f"aot: {e.args[0] if isinstance(e, KeyError) else e}") from None
    except OSError as e:  # unreadable source, unwritable destination, a full disk
        raise SystemExit(f"aot: convert {src} -> {dst}: {e.strerror or e}" + (f": {e.filename}" if e.filename else "")) from None
    print(f"aot: {src} -> {dst}: {len(out)} tensor(s), layout {args.layout}", flush=True)
    return 0


def memory_report(c, key: str, largest: int = 5) -> str:
    """Planned bytes per buffer of one entry point, the lower bound any packing must pay
    (params + grads + optimizer state + inputs + the intermediates alive at once at the peak),
    and its largest intermediates."""
    from .ir import tensor_names

    plan, s = c.plans[key], c.schedules[key]
    names = tensor_names(s.graph)
    fixed = sum(n for a, n in plan.sizes.items() if not a.startswith("work"))
    lines = [f"memory: {_mb(sum(plan.sizes.values()))} planned, lower bound {_mb(fixed + plan.work_peak_live)}"]
    lines += [f"  {a:<12} {_mb(n):>10}" for a, n in plan.sizes.items() if n]
    work = [t for t in s.owners if id(t) in plan.loc and plan.loc[id(t)].arena.startswith("work")]
    for t in sorted(work, key=lambda t: -t.size)[:largest]:
        site = t.node.site.short if t.node.site else "-"
        lines.append(f"  largest: {names.get(id(t), '?'):<6} {t.type_str():<24} {_mb(t.size):>10}  {t.node.op} at {site}")
    return "\n".join(lines)


def _mb(elements: int) -> str:
    return f"{4 * elements / 1e6:.2f} MB"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m aot", description="Ahead-of-time compiler from Python models to WebGPU packages.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build one package per aot.Program in a model file")
    b.add_argument("model", help="path to model.py")
    b.add_argument("-o", "--outdir", default="generated", help="output folder (default: generated/)")
    b.add_argument("--program", help="build only the Program with this name")
    b.add_argument("--verify", action="store_true", help="check IR invariants after every pass")
    b.add_argument(
        "--max-binding-mib", type=float, default=128, metavar="N",
        help="largest GPU buffer the package may bind, in MiB (default 128: WebGPU's default limit, which "
        "browsers and lavapipe keep; GPUs allow up to 2048 when asked)",
    )
    b.add_argument(
        "--target", choices=("python", "web", "all"), default="python",
        help="python (default): a pip-installable package in OUT/<name>/; web: an ES module, its WGSL and a demo "
        "page in OUT/<name>/; all: both, the web project in OUT/<name>-web/",
    )
    b.add_argument(
        "--no-merge", action="store_true",
        help="give every kernel a dispatch of its own (by default independent kernels share one on GPUs: "
        "and dependent kernels over the same rows run as one: fewer dispatches, the same operations)",
    )
    b.add_argument(
        "--bucket-mib", type=float, default=25.0, metavar="N",
        help="gradient bucket size of data-parallel training, in MiB (default 25, as PyTorch DDP; 0: one bucket "
        "per gradient): step(allreduce=...) reads each bucket back and reduces it while the backward pass runs",
    )
    b.add_argument(
        "--force", action="store_true",
        help="replace files in the project folder that no earlier aot build wrote (never deletes others)",
    )
    b.set_defaults(fn=cmd_build)
    i = sub.add_parser("inspect", help="print the IR, kernels and buffer table")
    i.add_argument("model")
    i.add_argument("--program")
    i.add_argument("--entry", help="only this entry point (train, predict, ...)")
    i.add_argument("--wgsl", action="store_true", help="also print every kernel's WGSL")
    i.add_argument("--max-binding-mib", type=float, default=128, metavar="N", help="as for build")
    i.set_defaults(fn=cmd_inspect)
    c = sub.add_parser(
        "convert",
        help="convert parameters between .npz (an aot checkpoint or plain arrays) and .safetensors",
        description="Convert parameters: .npz -> .safetensors (the params and buffers of an aot checkpoint "
        "written by Model.save, or every array of a plain .npz) or .safetensors -> .npz (plain arrays, for "
        "model.load_params(dict(np.load(...))), or load_state_dict(..., layout='aot') where there are "
        "buffers). Each tensor keeps its dtype (BF16 becomes float32; an i32 buffer int64 in --layout torch, "
        "as state_dict writes it).",
        epilog="--layout torch (PyTorch's names and layouts: l1.W becomes l1.weight, transposed) needs the model, "
        "since only the aot.nn module that declared a parameter says what PyTorch calls it: pass "
        "--model model.py, and --program NAME if the file defines several programs. With --model the names "
        "and shapes are also checked against the model.",
    )
    c.add_argument("src", help="input: ckpt.npz or weights.safetensors")
    c.add_argument("dst", help="output: weights.safetensors or params.npz")
    c.add_argument(
        "--layout", choices=("aot", "torch"), default="aot",
        help="names and layouts of the .safetensors side (default aot: the .npz names as they are)",
    )
    c.add_argument("--model", help="model.py defining the aot.Program (needed for --layout torch)")
    c.add_argument("--program", help="the Program's name, if model.py defines several")
    c.set_defaults(fn=cmd_convert)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except AotError as e:
        print(f"aot: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
