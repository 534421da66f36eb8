"""PyTorch state_dicts and safetensors files, in and out, with NumPy alone.

Copied into every generated package next to model.py: the Model gets load_safetensors,
save_safetensors, load_state_dict and state_dict from InteropMixin. PyTorch's names and
layouts come from the program's "torch" table, which the compiler writes from what each
aot.nn module declared (aot name -> (PyTorch name, module kind, stored transposed)), so
nothing is guessed from names here.

The safetensors format: 8 bytes of little-endian u64 N, N bytes of JSON header
({name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}),
then the data, every tensor's bytes at its offsets from the end of the header. A file is
read whole (not memory-mapped: see SafetensorsFile) and its header checked whole (length, JSON, every entry's dtype, shape and
offsets, and that the tensors tile the data exactly) before any tensor is touched; a
model's load then checks names and shapes before converting anything, and writes nothing
unless everything is valid.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping

import numpy as np

MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit

# safetensors dtype <-> NumPy (little-endian); BF16 is read as uint16 and widened to f32
_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": "<u2",
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U64": "<u8",
    "U32": "<u4",
    "U16": "<u2",
    "U8": "u1",
    "BOOL": "?",
    "F8_E4M3": "u1",  # sized so a header can be checked; never loaded
    "F8_E5M2": "u1",
}
_FLOATS = ("F32", "F16", "BF16", "F64")
# (NumPy kind, itemsize) -> the dtype written
_WRITES = {
    ("f", 8): "F64", ("f", 4): "F32", ("f", 2): "F16",
    ("i", 8): "I64", ("i", 4): "I32", ("i", 2): "I16", ("i", 1): "I8",
    ("u", 8): "U64", ("u", 4): "U32", ("u", 2): "U16", ("u", 1): "U8", ("b", 1): "BOOL",
}
LAYOUTS = ("aot", "torch")


class SafetensorsFile:
    """A checked safetensors file (read into memory) or buffer.

    `.entries` maps each tensor name to (dtype, shape, begin, end) in file order of the header,
    `.metadata` is the `__metadata__` dict (or {}). Construction refuses, with ValueError, any
    header that does not describe the data exactly; use it as a context manager to drop the
    mapping when done."""

    def __init__(self, src):
        if isinstance(src, (bytes, bytearray, memoryview)):
            self.where = f"<{len(memoryview(src).cast('B'))} bytes>"
            buf = np.frombuffer(memoryview(src).cast("B"), dtype=np.uint8)
        else:
            try:
                path = os.fspath(src)
            except TypeError:
                raise TypeError(f"expected a path or bytes, got {type(src).__name__}") from None
            self.where = str(path)
            size = os.path.getsize(path)
            if size < 8:
                raise ValueError(f"{self.where}: not a safetensors file ({size} bytes; the header length alone takes 8)")
            # read, not memory-mapped: a mapped file rewritten or truncated by another process kills
            # this one with SIGBUS when a tensor is touched (and a file under one page read as zeros)
            with open(path, "rb") as f:
                buf = np.frombuffer(f.read(), dtype=np.uint8)
        self._buf = buf
        self.entries, self.metadata, self._start = _parse(self.where, buf)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self._buf = None  # the mapping goes with its last reference

    def array(self, name: str) -> np.ndarray:
        """Tensor `name` as a new float32 array (F32, F16, BF16 and F64 tensors)."""
        dtype = self.entries[name][0]
        if dtype not in _FLOATS:
            raise TypeError(f"{self.where}: tensor {name!r} is {dtype}; only float tensors ({', '.join(_FLOATS)}) convert to float32")
        if dtype == "BF16":  # bfloat16 is the high half of a float32
            wide = self._view(name).astype(np.uint32)
            return np.left_shift(wide, 16, out=wide).view(np.float32)
        return self._view(name).astype(np.float32)

    def raw(self, name: str) -> np.ndarray:
        """Tensor `name` as a new NumPy array of its own dtype (BF16 as uint16). Float8 tensors have
        no NumPy dtype: their byte codes would pass for uint8 weights, so they are refused."""
        dtype = self.entries[name][0]
        if dtype.startswith("F8"):
            raise TypeError(
                f"{self.where}: tensor {name!r} is {dtype}: float8 tensors are not read (NumPy has no float8; "
                f"convert them to F16, BF16 or F32 first)"
            )
        v = self._view(name)
        return v.astype(v.dtype.newbyteorder("="))

    def _view(self, name: str) -> np.ndarray:
        """The tensor's bytes in the mapping, viewed in its little-endian dtype (no copy)."""
        dtype, shape, begin, _ = self.entries[name]
        a = np.frombuffer(self._buf, dtype=np.dtype(_DTYPES[dtype]), count=math.prod(shape), offset=self._start + begin)
        return a.reshape(shape)


class _Duplicate(ValueError):
    pass


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _Duplicate(k)
        out[k] = v
    return out


def _refuse_constant(name):
    raise ValueError(f"{name} is not a number safetensors allows")


def _is_int(x) -> bool:
    return type(x) is int  # bool is an int subclass; JSON true is no offset


def _parse(where: str, buf: np.ndarray):
    """(entries, metadata, data start) of a whole safetensors buffer, or ValueError saying what is wrong."""

    def bad(why):
        return ValueError(f"{where}: not a valid safetensors file: {why}")

    size = buf.size
    if size < 8:
        raise bad(f"{size} bytes, shorter than the 8-byte header length")
    n = struct.unpack("<Q", bytes(buf[:8]))[0]
    if n > MAX_HEADER_BYTES:
        raise bad(f"header length {n} is absurd (at most {MAX_HEADER_BYTES} bytes)")
    if 8 + n > size:
        raise bad(f"header length {n} runs past the end of the file ({size} bytes)")
    raw = bytes(buf[8 : 8 + n])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise bad("the header is not UTF-8 text") from None
    if not text.startswith("{"):
        raise bad("the header is not a JSON object")
    try:
        header = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_refuse_constant)
    except _Duplicate as e:
        raise bad(f"the header names {e.args[0]!r} twice") from None
    except (ValueError, RecursionError) as e:
        raise bad(f"the header is not JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise bad("__metadata__ must map strings to strings")
    data_len = size - 8 - n
    entries = {}
    for name, info in header.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise bad(f"tensor {name!r}: expected {{dtype, shape, data_offsets}}, got {_short(info)}")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype, str) or dtype not in _DTYPES:
            raise bad(f"tensor {name!r} has dtype {_short(dtype)}, not one this reader knows ({', '.join(_DTYPES)})")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise bad(f"tensor {name!r} has shape {_short(shape)}, not a list of sizes >= 0")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
            raise bad(f"tensor {name!r} has data_offsets {_short(offsets)}, not [begin, end]")
        begin, end = offsets
        if begin > end:
            raise bad(f"tensor {name!r} has data_offsets [{begin}, {end}], which end before they begin")
        if not 0 <= begin <= end <= data_len:
            raise bad(f"tensor {name!r} has data_offsets [{begin}, {end}], outside the {data_len} bytes of data")
        need = math.prod(shape) * np.dtype(_DTYPES[dtype]).itemsize
        if end - begin != need:
            raise bad(f"tensor {name!r} is {dtype}{shape}, {need} bytes, but its data_offsets [{begin}, {end}] span {end - begin}")
        entries[name] = (dtype, tuple(shape), begin, end)
    # the tensors must tile the data exactly: no overlap, no gap, nothing after the last one
    pos = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if begin < pos:
            raise bad(f"tensor {name!r} at [{begin}, {end}] overlaps the tensor before it (which ends at {pos})")
        if begin > pos:
            raise bad(f"bytes [{pos}, {begin}) of the data belong to no tensor")
        pos = end
    if pos != data_len:
        raise bad(f"the tensors cover {pos} bytes, but the data after the header is {data_len} bytes")
    return entries, metadata, 8 + n


def _short(x) -> str:
    s = repr(x)
    return s if len(s) <= 80 else s[:77] + "..."


def encode_header(tensors: dict, metadata: dict | None) -> tuple[bytes, list[tuple[str, np.ndarray]]]:
    """(the 8-byte length + JSON header, [(name, little-endian contiguous array)] in data order).

    Keys are sorted, the data follows in the same order, and the header is padded with spaces
    so the data starts 8-byte aligned (as the safetensors library writes)."""
    header, arrays, off = {}, [], 0
    for name in sorted(tensors):
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be strings, got {name!r}")
        if name == "__metadata__":
            raise ValueError("'__metadata__' cannot name a tensor in a safetensors file")
        a = np.asarray(tensors[name])
        code = _WRITES.get((a.dtype.kind, a.dtype.itemsize))
        if code is None:
            raise TypeError(f"tensor {name!r}: {a.dtype} cannot be written to safetensors")
        a = np.asarray(a, dtype=np.dtype(_DTYPES[code]), order="C")  # (ascontiguousarray makes a 0-d array 1-d)
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        arrays.append((name, a))
        off += a.nbytes
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise TypeError("safetensors metadata maps strings to strings")
        header["__metadata__"] = dict(metadata)
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, arrays


def write_safetensors(f, tensors: dict, metadata: dict | None = None) -> None:
    """Write `tensors` ({name: array}, each in its own dtype) to the binary file object f."""
    head, arrays = encode_header(tensors, metadata)
    f.write(head)
    for _, a in arrays:
        f.write(a.tobytes())


# ---- names and layouts ----------------------------------------------------------------------------


def layout_names(params, table: dict, layout: str) -> dict:
    """{name in `layout`: (aot name, transposed?)} for params [(aot name, shape)], in their order.

    table: aot name -> (PyTorch name, module kind, stored transposed), the compiler's "torch" table."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'aot' or 'torch', got {layout!r}")
    out = {}
    for name, _ in params:
        if layout == "aot":
            out[name] = (name, False)
            continue
        tname, _, transpose = table.get(name, (name, "", False))
        if tname in out:
            raise ValueError(f"parameters {out[tname][0]!r} and {name!r} both have the PyTorch name {tname!r}")
        out[tname] = (name, bool(transpose))
    return out


def renamer(rename):
    """rename as a function name -> name (or None: leave that tensor out): None keeps names; a
    function is used as it is; a dict rewrites prefixes ({"encoder.layers.": "blocks."}), the longest
    matching prefix winning (a None value leaves such tensors out)."""
    if rename is None:
        return lambda n: n
    if isinstance(rename, Mapping):
        rules = sorted(rename.items(), key=lambda kv: -len(kv[0]) if isinstance(kv[0], str) else 0)
        for old, new in rules:
            if not isinstance(old, str) or not (new is None or isinstance(new, str)):
                raise TypeError(f"rename: a dict of prefix rewrites maps str to str (or None), got {old!r}: {new!r}")

        def by_prefix(n):
            for old, new in rules:
                if n.startswith(old):
                    return None if new is None else new + n[len(old) :]
            return n

        return by_prefix
    if callable(rename):

        def checked(n):
            r = rename(n)
            if r is not None and not isinstance(r, str):
                raise TypeError(f"rename({n!r}) returned {r!r}; expected a str (or None to leave it out)")
            return r

        return checked
    raise TypeError(f"rename must be None, a function or a dict of prefix rewrites, got {type(rename).__name__}")


def _listing(names, limit: int = 10) -> str:
    names = sorted(names)
    return ", ".join(repr(n) for n in names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def plan_load(
    what: str, incoming: dict, params, table: dict, layout: str, rename, partial: bool, buffers=frozenset()
) -> dict:
    """Check incoming tensors against the model; returns {incoming name: (aot name, transposed?)}.

    incoming: {name: shape} as found (file or dict); params: [(aot name, shape)], the buffers
    among them named in `buffers` (for messages). Unknown names
    (and, unless partial, missing ones) raise KeyError, a wrong shape ValueError, two names that
    rename to one ValueError. Nothing is read or converted here."""
    names = layout_names(params, table, layout)
    shapes = dict(params)
    fn = renamer(rename)
    source_of = {}
    for src in incoming:
        dst = fn(src)
        if dst is None:
            continue
        if dst in source_of:
            raise ValueError(f"{what}: {source_of[dst]!r} and {src!r} both rename to {dst!r}")
        source_of[dst] = src
    unknown = [d for d in source_of if d not in names]
    if unknown:
        shown = [f"{source_of[d]!r} (renamed {d!r})" if source_of[d] != d else repr(d) for d in sorted(unknown)[:10]]
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        hint = ""
        other = "torch" if layout == "aot" else "aot"
        try:
            others = layout_names(params, table, other)
        except ValueError:
            others = {}
        if all(d in others for d in unknown):
            hint = f"; these are this model's names in layout={other!r}: pass layout={other!r}"
        elif rename is None:
            hint = "; pass rename= (a function, or a dict of prefix rewrites) if the modules are named differently"
        raise KeyError(
            f"{what}: unknown parameter(s) {', '.join(shown)}{more}; in layout={layout!r} this model has "
            f"[{_listing(names)}]{hint}"
        )
    missing = [n for n in names if n not in source_of]
    if missing and not partial:
        kinds = {"buffer" if names[n][0] in buffers else "parameter" for n in missing}
        kind = " and ".join(f"{k}(s)" for k in sorted(kinds, reverse=True))
        raise KeyError(f"{what}: missing {kind} [{_listing(missing)}] (pass partial=True to load a subset)")
    plan = {}
    for dst, src in source_of.items():
        aot_name, transpose = names[dst]
        want = tuple(shapes[aot_name])[::-1] if transpose else tuple(shapes[aot_name])
        got = tuple(incoming[src])
        if got != want:
            how = f" ({aot_name!r} transposed)" if transpose else (f" ({aot_name!r})" if aot_name != dst else "")
            named = f"{src!r}" if src == dst else f"{src!r} (renamed {dst!r})"
            raise ValueError(f"{what}: {named} expects shape {want}{how}, got {got}")
        plan[src] = (aot_name, transpose)
    return plan


def plan_save(what: str, params, table: dict, layout: str, rename) -> list:
    """[(outgoing name, aot name, transposed?)] in parameter order; two names renamed to one raise ValueError."""
    fn = renamer(rename)
    out, seen = [], {}
    for name, (aot_name, transpose) in layout_names(params, table, layout).items():
        dst = fn(name)
        if dst is None:
            continue
        if dst in seen:
            raise ValueError(f"{what}: {seen[dst]!r} and {name!r} both rename to {dst!r}")
        seen[dst] = name
        out.append((dst, aot_name, transpose))
    return out


def to_numpy(name: str, value) -> np.ndarray:
    """A state_dict value as an ndarray: NumPy arrays as they are, anything with .numpy() (a torch
    tensor: detached and moved to the CPU first, found by getattr; torch is never imported)."""
    if not isinstance(value, np.ndarray):
        for step in ("detach", "cpu"):
            f = getattr(value, step, None)
            if callable(f):
                value = f()
        to_np = getattr(value, "numpy", None)
        if callable(to_np):
            try:
                value = to_np()
            except TypeError:  # torch has no NumPy bfloat16: widen to float32 first
                widen = getattr(value, "float", None)
                if not callable(widen):
                    raise
                value = widen().numpy()
    try:
        a = np.asarray(value)
    except Exception as e:
        raise TypeError(f"{name!r} is not an array: {type(e).__name__}: {e}") from None
    if a.dtype.kind not in "fiub" or a.dtype == object:
        raise TypeError(f"{name!r} must be numeric, got {a.dtype} array of shape {tuple(a.shape)}")
    return a


class InteropMixin:
    """PyTorch state_dicts and safetensors for a generated Model (issue 10).

    Uses the Model's params(), buffers(), _check_params/_write_params, _check_buffers/
    _write_named_buffers, _lock, _check_open(), _params, _buffer_table, _program["torch"] and
    _write_atomically(path, write) (save()'s temporary file + rename). Buffers (Module.buffer)
    travel with the parameters, as in a torch state_dict: after them, i32 ones as int64 in
    layout="torch" (PyTorch's dtype for BatchNorm's num_batches_tracked)."""

    def _layout_params(self):
        return [(n, tuple(s)) for n, s, *_ in self._params] + [(n, tuple(s)) for n, s, *_ in self._buffer_table]

    def _torch_table(self) -> dict:
        table = dict(self._program.get("torch") or {})
        for n, _, _, _, _, tname in self._buffer_table:
            table[n] = (tname or n, "", False)
        return table

    def _int_buffers(self) -> set:
        return {n for n, _, dt, *_ in self._buffer_table if dt == "i32"}

    def _load_tensors(self, values: dict, what: str) -> None:
        """Load {aot name: array} into parameters and buffers: all checked before any is written."""
        bnames = set(self.buffer_names)
        params = self._check_params({n: a for n, a in values.items() if n not in bnames}, True)
        buffers = self._check_buffers(what, {n: a for n, a in values.items() if n in bnames}, True)
        self._write_params(params)
        self._write_named_buffers(buffers)

    def state_dict(self, layout: str = "torch", *, rename=None) -> dict:
        """The parameters and buffers as {name: array} (float32; an i32 buffer int64 in layout="torch",
        int32 in "aot"): layout="torch" uses PyTorch's names and layouts (`l1.weight` = `l1.W`.T for
        nn.Linear, `ln.weight` = `ln.g`, ...), ready for a torch module's load_state_dict after
        torch.from_numpy; layout="aot" is params() and buffers(). rename (a function or a dict of
        prefix rewrites) maps the names as they go out."""
        with self._lock:
            self._check_open()
            plan = plan_save("state_dict", self._layout_params(), self._torch_table(), layout, rename)
            values = dict(self.params(), **self.buffers())
            if layout == "torch":
                values.update({n: values[n].astype(np.int64) for n in self._int_buffers()})
            return {dst: np.ascontiguousarray(values[n].T) if t else values[n] for dst, n, t in plan}

    def load_state_dict(self, sd, *, layout: str = "torch", rename=None, partial: bool = False) -> None:
        """Load a PyTorch-style state_dict ({name: tensor or array}; values with .numpy() are detached,
        moved to the CPU and converted without importing torch), mapping PyTorch's names and layouts
        to aot's (nn.Linear's weight is transposed into W, ...). rename maps incoming names to this
        model's (a function, None to leave a tensor out, or a dict of prefix rewrites such as
        {"encoder.layers.": "blocks."}). Strict like load_params: unknown (and, unless partial, missing)
        names raise KeyError, a wrong shape ValueError, and nothing changes unless all of it is valid."""
        if not isinstance(sd, Mapping):
            raise TypeError(f"load_state_dict: expected a mapping of names to tensors, got {type(sd).__name__}")
        with self._lock:
            self._check_open()
            fn = renamer(rename)
            renamed = {k: fn(k) for k in sd}  # once per name: rename may be any function
            arrays = {k: to_numpy(k, v) for k, v in sd.items() if renamed[k] is not None}
            plan = plan_load(
                "load_state_dict", {k: a.shape for k, a in arrays.items()}, self._layout_params(), self._torch_table(),
                layout, None if rename is None else renamed.__getitem__, partial, set(self.buffer_names),
            )
            ints = self._int_buffers()
            for src, (n, _) in plan.items():
                # exact dtype rules, as load_safetensors': an int8 quantized weight or a bool mask
                # into a float parameter is a mistake, not a conversion (it loaded as -7.0, 1.0)
                kind = arrays[src].dtype.kind
                if n in ints and kind not in "iu":
                    raise TypeError(f"load_state_dict: {src!r} is {arrays[src].dtype}, but buffer {n!r} is i32; integer tensors load")
                if n not in ints and kind != "f":
                    what = "buffer" if n in self.buffer_names else "parameter"
                    raise TypeError(
                        f"load_state_dict: {src!r} is {arrays[src].dtype}, but {what} {n!r} is f32; float tensors load "
                        "(convert it first if that is what you mean: dequantize, or .float())"
                    )
            self._load_tensors({n: arrays[src].T if t else arrays[src] for src, (n, t) in plan.items()}, "load_state_dict")

    def load_safetensors(self, path_or_bytes, *, layout: str = "aot", rename=None, partial: bool = False) -> None:
        """Load parameters from a safetensors file (read whole) or bytes. F32, F16, BF16 and F64
        tensors convert to float32. layout="torch" reads PyTorch's names and layouts (a file saved from
        a torch model's state_dict); rename and partial as for load_state_dict. The header is checked
        whole (sizes, offsets, dtypes) and then every name and shape, before anything is converted: a
        refused file (ValueError; KeyError for unknown or missing names; TypeError for integer tensors)
        leaves the model unchanged."""
        with self._lock:
            self._check_open()
            with SafetensorsFile(path_or_bytes) as st:
                what = f"load_safetensors({st.where})"
                plan = plan_load(
                    what, {k: e[1] for k, e in st.entries.items()}, self._layout_params(), self._torch_table(),
                    layout, rename, partial, set(self.buffer_names),
                )
                ints = self._int_buffers()
                for src in plan:
                    dtype = st.entries[src][0]
                    if plan[src][0] in ints:
                        if dtype in _FLOATS or dtype.startswith("F8"):
                            raise TypeError(f"{what}: tensor {src!r} is {dtype}, but buffer {plan[src][0]!r} is i32; integer tensors load")
                    elif dtype not in _FLOATS:
                        kind = "buffer" if plan[src][0] in self.buffer_names else "parameter"
                        raise TypeError(
                            f"{what}: tensor {src!r} is {dtype}, but {kind} {plan[src][0]!r} is f32 (this model "
                            f"has no integer parameters); float tensors ({', '.join(_FLOATS)}) load"
                        )
                values = {}
                for src, (n, t) in plan.items():
                    a = st.raw(src) if n in ints else st.array(src)
                    values[n] = a.T if t else a
                self._load_tensors(values, what)

    def save_safetensors(self, path, *, layout: str = "aot", rename=None) -> None:
        """Write the parameters and buffers to a safetensors file (float32, i32 buffers I32 in layout="aot"
        and I64 in "torch"; layout="torch": PyTorch's names and
        layouts, loadable by safetensors.torch.load_file + a torch module's load_state_dict). Keys are
        sorted, the header padded to 8 bytes and __metadata__ says format "pt", the program and the
        layout. Written to a temporary file and renamed over `path`, as save() does."""
        with self._lock:
            self._check_open()
            sd = self.state_dict(layout, rename=rename)
            meta = {"format": "pt", "aot_program": str(self._program["name"]), "aot_layout": layout}
            self._write_atomically(os.fspath(path), lambda f: write_safetensors(f, sd, meta))
