"""The device side of a generated package: a wgpu device, one buffer per arena, one pipeline
per kernel (all created once), and `run`, which records one call of an entry point into a
single compute pass and submit. Nothing is allocated per call.
"""

from __future__ import annotations

import re
import time

import numpy as np

try:
    import wgpu
except ImportError as e:  # pragma: no cover - the package declares wgpu as a dependency
    raise ImportError("this model needs wgpu-py: pip install wgpu") from e

_NP = {"f32": np.float32, "i32": np.int32}


class ShaderError(RuntimeError):
    """A generated kernel failed to compile on this adapter (please report it)."""


class Engine:
    """Device, buffers, pipelines and bind groups for one compiled program."""

    def __init__(self, name: str, wgsl: dict, kernels: dict, arenas: dict, entries: dict):
        self.name = name
        self.kernels = kernels
        self.entries = entries
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if adapter is None:
            raise RuntimeError(
                "no WebGPU adapter found: install a GPU driver with Vulkan/Metal/D3D12 support, "
                "or Mesa's software Vulkan (Debian: apt-get install mesa-vulkan-drivers)"
            )
        self.adapter_info = dict(adapter.info)
        self.device = adapter.request_device_sync(label=name, required_limits=_required_limits(name, adapter, arenas, entries))
        self.buffers = {a: self._buffer(a, n) for a, n in arenas.items()}
        # Every kernel uses the same binding number for a buffer (its position in `arenas`), so a
        # run of neighbouring kernels that agree on each buffer's access mode shares one explicit
        # layout and one bind group: a pass re-binds only where the access modes change.
        self.order = list(arenas)
        self.wgsl = wgsl
        self.pipelines, self.recipes, self.kernel_group, self.entry_buffers = {}, {}, {}, {}
        self._groups = {}
        for key, e in entries.items():
            if not self._own_scratch(key):
                self._prepare(key)  # entries with scratch buffers of their own: at their first call
        self.readback = {}
        for key, e in entries.items():
            n = sum(_size(shape) for _, _, shape, _, _ in e["outputs"] + e["captures"])
            self.readback[key] = self.device.create_buffer(
                size=max(4, 4 * n), usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
            )

    def _buffer(self, arena: str, n: int):
        usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
        return self.device.create_buffer(label=arena, size=max(4, 4 * n), usage=usage)

    def _own_scratch(self, key: str) -> dict:
        """Scratch buffers an entry point needs beyond the shared ones (a large predict variant
        of a model whose shared scratch is sized for training)."""
        need = self.entries[key].get("arenas", {})
        return {a: n for a, n in need.items() if a.startswith("work") and 4 * n > self.buffers[a].size}

    def _prepare(self, key: str) -> None:
        """Pipelines, bind groups and the dispatch list of one entry point."""
        own = {a: self._buffer(a, n) for a, n in self._own_scratch(key).items()}
        self.entry_buffers[key] = dict(self.buffers, **own)
        runs: list[tuple[dict, list]] = []
        for kname, grid in self.entries[key]["dispatches"]:
            access = dict(self.kernels[kname][0])
            if runs and all(runs[-1][0].get(a, acc) == acc for a, acc in access.items()):
                runs[-1][0].update(access)
                runs[-1][1].append((kname, grid))
            else:
                runs.append((access, [(kname, grid)]))
        steps = []
        for access, members in runs:
            sig = tuple(sorted(access.items(), key=lambda item: self.order.index(item[0])))
            gkey = (sig, tuple(sorted((a, id(b)) for a, b in own.items() if a in access)))
            if gkey not in self._groups:
                self._groups[gkey] = self._layout_and_group(sig, self.entry_buffers[key])
            layout, group = self._groups[gkey]
            for n, (kname, grid) in enumerate(members):
                self.pipelines[kname] = self._pipeline(kname, self.wgsl[kname], self.kernels[kname][1], layout)
                self.kernel_group[kname] = group
                steps.append((self.pipelines[kname], group if n == 0 else None, tuple(grid)))
        self.recipes[key] = steps

    def _layout_and_group(self, sig, buffers):
        bgl = self.device.create_bind_group_layout(entries=[
            {"binding": self.order.index(arena), "visibility": wgpu.ShaderStage.COMPUTE,
             "buffer": {"type": "storage" if access == "read_write" else "read-only-storage"}}
            for arena, access in sig
        ])
        group = self.device.create_bind_group(layout=bgl, entries=[
            {"binding": self.order.index(arena), "resource": {"buffer": buffers[arena], "offset": 0, "size": buffers[arena].size}}
            for arena, _access in sig
        ])
        return self.device.create_pipeline_layout(bind_group_layouts=[bgl]), group

    def _pipeline(self, kname, source, site, layout):
        try:
            module = self.device.create_shader_module(label=kname, code=source)
            return self.device.create_compute_pipeline(label=kname, layout=layout, compute={"module": module, "entry_point": "main"})
        except Exception as e:
            raise ShaderError(f"kernel {kname} (from {site}) failed to compile:\n{e}\n{_wgsl_context(source, str(e))}") from None

    def write(self, arena: str, offset: int, data: np.ndarray):
        self.device.queue.write_buffer(self.buffers[arena], 4 * offset, np.ascontiguousarray(data).tobytes())

    def read(self, arena: str, offset: int, count: int, dtype="f32") -> np.ndarray:
        if count == 0:
            return np.zeros(0, dtype=_NP[dtype])
        raw = self.device.queue.read_buffer(self.buffers[arena], 4 * offset, 4 * count)
        return np.frombuffer(raw, dtype=_NP[dtype]).copy()

    def run(self, key: str, packed: dict, want_captures: bool):
        """One call of an entry point: upload, one pass, writebacks, readback of outputs (+captures)."""
        t0 = time.perf_counter()
        e = self.entries[key]
        if key not in self.recipes:
            self._prepare(key)
        buffers = self.entry_buffers[key]
        for arena, data in packed.items():
            if data.size:
                self.write(arena, 0, data)
        enc = self.device.create_command_encoder()
        cpass = enc.begin_compute_pass()
        set_pipeline, set_bind_group, dispatch = cpass.set_pipeline, cpass.set_bind_group, cpass.dispatch_workgroups
        for pipeline, group, grid in self.recipes[key]:
            set_pipeline(pipeline)
            if group is not None:
                set_bind_group(0, group)
            dispatch(*grid)
        cpass.end()
        for src, so, dst, do, n in e["copies"]:
            enc.copy_buffer_to_buffer(buffers[src], 4 * so, buffers[dst], 4 * do, 4 * n)
        reads = e["outputs"] + (e["captures"] if want_captures else [])
        rb = self.readback[key]
        pos = 0
        for _, _, shape, arena, off in reads:
            n = _size(shape)
            enc.copy_buffer_to_buffer(buffers[arena], 4 * off, rb, 4 * pos, 4 * n)
            pos += n
        self.device.queue.submit([enc.finish()])
        t1 = time.perf_counter()
        out = {}
        if pos:
            rb.map_sync(wgpu.MapMode.READ, 0, 4 * pos)
            t2 = time.perf_counter()
            raw = rb.read_mapped(0, 4 * pos, copy=True)
            rb.unmap()
            pos = 0
            for name, dtype, shape, _, _ in reads:
                n = _size(shape)
                out[name] = np.frombuffer(raw, dtype=_NP[dtype], count=n, offset=4 * pos).reshape(shape).copy()
                pos += n
        else:
            t2 = time.perf_counter()
        # host time (upload, encoding, submit, unpacking) and time spent waiting for the GPU
        self.last_timing = (t1 - t0 + time.perf_counter() - t2, t2 - t1)
        return out


WEBGPU_DEFAULT_BINDING = 134217728  # bytes: maxStorageBufferBindingSize without asking


def _required_limits(name: str, adapter, arenas: dict, entries: dict) -> dict | None:
    """Device limits the buffers need, checked against the adapter before anything is allocated:
    a buffer larger than WebGPU's default binding size needs the adapter to allow it."""
    sizes = [4 * n for n in arenas.values()] + [4 * n for e in entries.values() for n in e.get("arenas", {}).values()]
    need = max([4] + sizes)
    limits = {}
    for key in ("max-storage-buffer-binding-size", "max-buffer-size"):
        have = adapter.limits[key]
        if need > have:
            raise RuntimeError(
                f"{name} needs a {need}-byte buffer ({need / 2**20:.1f} MiB), but this adapter allows {have} bytes "
                f"({have / 2**20:.0f} MiB, its {key}). Rebuild the package with `python -m aot build "
                f"--max-binding-mib {have // 2**20}` (or less) so that its buffers are split to fit"
            )
        if need > WEBGPU_DEFAULT_BINDING:
            limits[key] = have
    return limits or None


def _size(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _wgsl_context(source: str, message: str) -> str:
    m = re.search(r":(\d+):\d+", message)
    if not m:
        return ""
    line = int(m.group(1))
    lines = source.split("\n")
    lo, hi = max(0, line - 3), min(len(lines), line + 2)
    return "\n".join(f"{'>>' if i + 1 == line else '  '} {i + 1:4d} | {lines[i]}" for i in range(lo, hi))
